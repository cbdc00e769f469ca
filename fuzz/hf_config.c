/* hf_config.c -- fuzzes the Hugging Face LLaMA config.json parser
   (pt_gpt_config_from_hf_json): the input is the file's text. A config it
   accepts is then counted (pt_gpt_num_params) and laid out as a meta model
   of one row, which must succeed or fail with a message. See fuzz.h. */
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    pt_gpt_config c;
    if (pt_gpt_config_from_hf_json((const char *)data, size, &c) == PT_OK) {
        pt_gpt_desc d;
        pt_gpt g;
        (void)pt_gpt_num_params(&c);
        memset(&d, 0, sizeof d);
        d.config = c, d.batch = 1, d.seq = 1, d.meta = 1;
        if (pt_gpt_init(&g, &d) == PT_OK) pt_gpt_free(&g);
        else if (!pt_last_error()[0]) abort(); /* a failure always says why */
    }
    return 0;
}
