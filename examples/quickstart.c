/* quickstart.c -- the QUICK START of ptrain.h's top comment as a whole program:
   train the "tiny" byte-level GPT for 100 steps on a short embedded text and
   print the loss, which falls from about 5.5 (= ln 256, a uniform guess).

   gcc -std=c11 -O2 -Wall -Wextra -Wpedantic -fopenmp examples/quickstart.c -o build/quickstart -I/usr/include/x86_64-linux-gnu/openblas-openmp -L/usr/lib/x86_64-linux-gnu/openblas-openmp -Wl,-rpath,/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas -lm

   Everything between the two "----" comments is the snippet, line for line. */
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"

#include <stdio.h>
#include <string.h>

static const char verse[] =
    "Twinkle, twinkle, little star,\n"
    "How I wonder what you are!\n"
    "Up above the world so high,\n"
    "Like a diamond in the sky.\n\n";

int main(void) {
    static char text[8 * sizeof verse]; /* the verse 8 times: ~900 bytes */
    for (int i = 0; i < 8; i++) strcat(text, verse);

    /* ---- the snippet from ptrain.h ---- */
    pt_gpt_config cfg;
    pt_gpt_config_preset("tiny", &cfg);          // 2 layers, 64 wide, bytes
    pt_gpt gpt;
    pt_gpt_desc d = {0};
    d.config = cfg; d.batch = 4; d.seq = 64;
    if (pt_gpt_init(&gpt, &d) != PT_OK) { puts(pt_last_error()); return 1; }
    pt_gpt_init_weights(&gpt, 1337);
    pt_tokens tok = {0};
    pt_tokens_from_bytes(&tok, text, strlen(text)); // byte-level vocab (256)
    pt_loader loader = {0};
    pt_loader_desc ld = {0};
    ld.batch = 4; ld.seq = 64; ld.seed = 1;
    pt_loader_init(&loader, &tok, PT_SPLIT_ALL, &ld);
    pt_adamw_config opt = pt_adamw_default();
    static int inputs[4 * 64], targets[4 * 64];
    for (int step = 0; step < 100; step++) {
        pt_loader_next(&loader, inputs, targets);
        pt_gpt_forward(&gpt, inputs, targets, 4, 64);
        pt_gpt_backward(&gpt);
        pt_gpt_adamw_step(&gpt, &opt, 1e-3f);
        printf("step %d loss %.4f\n", step, gpt.loss);
    }
    /* ---- end of the snippet ---- */

    pt_loader_free(&loader);
    pt_tokens_free(&tok);
    pt_gpt_free(&gpt);
    return 0;
}
