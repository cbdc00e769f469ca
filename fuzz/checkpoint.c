/* checkpoint.c -- fuzzes the checkpoint loader: a file's config
   (pt_gpt_config_from_file), then pt_checkpoint_load into a model of that
   config, as build/train --resume does. See fuzz.h. */
#define _POSIX_C_SOURCE 200809L /* fuzz.h: getpid, opendir, stat */
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"
#include "fuzz.h"

#define FUZZ_MAX_PARAMS (1 << 20) /* bigger models only have their config checked */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(data, size, ".safetensors");
    pt_gpt_config cfg;
    pt_gpt m;
    pt_gpt_desc d;
    pt_train_state state;
    if (!path || pt_gpt_config_from_file(path, 0, &cfg) != PT_OK ||
        pt_gpt_num_params(&cfg) > FUZZ_MAX_PARAMS)
        return 0;
    memset(&d, 0, sizeof d);
    d.config = cfg, d.batch = 1, d.seq = 1;
    if (pt_gpt_init(&m, &d) != PT_OK) return 0;
    pt_checkpoint_load(path, &m, &state);
    pt_gpt_free(&m);
    return 0;
}
