/* hw.c -- fuzzes the hardware-profile reader (pt_hw_load, the "key = value"
   file of build/plan --hw-file and sim_vs_real --hw-file), then uses what it
   accepts as those programs do: a profile it loads saves and loads again to
   the same file (save is a fixed point after one round), and a small plan
   simulates on it (any verdict, no crash). See fuzz.h. */
#define _POSIX_C_SOURCE 200809L /* fuzz.h: getpid, opendir, stat */
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"
#include "fuzz.h"

/* 1 if the two files hold the same bytes */
static int same_file(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int ca = 0, cb = 0;
    while (fa && fb && (ca = fgetc(fa)) == (cb = fgetc(fb)) && ca != EOF) {}
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return fa && fb && ca == cb;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(data, size, ".txt");
    char p1[300], p2[300];
    pt_hw hw, again;
    pt_plan_desc d;
    pt_plan_result r;
    if (!path || pt_hw_load(path, &hw) != PT_OK) return 0;
    snprintf(p1, sizeof p1, "%s.1", path);
    snprintf(p2, sizeof p2, "%s.2", path);
    if (pt_hw_save(&hw, p1) != PT_OK) abort(); /* what it loaded it can write */
    if (pt_hw_load(p1, &again) != PT_OK) abort(); /* ... and read back */
    if (pt_hw_save(&again, p2) != PT_OK || !same_file(p1, p2)) abort();
    memset(&d, 0, sizeof d);
    d.model.config.n_layer = 2, d.model.config.n_embd = 64, d.model.config.n_head = 4;
    d.model.config.vocab_size = 256, d.model.seq = 32, d.model.batch = 1;
    d.model.schedule = PT_SCHED_ZB_H1, d.tp = 1, d.pp = 2, d.gpus = 2, d.batch = 4;
    pt_plan_simulate(&d, &hw, &r, NULL);
    remove(p1);
    remove(p2);
    return 0;
}
