/* train_cli.c -- fuzzes build/train's command line (common/train_opts.h):
   the input is the argument vector, arguments separated by NUL bytes. Runs
   the option parsing and checks (train_options), the model's shape from
   the preset and overrides (train_config), and the model's own checks on a
   model without memory (pt_gpt_init, meta = 1). --resume is dropped: it
   names a file, which the checkpoint harness covers. See fuzz.h. */
#define _POSIX_C_SOURCE 200809L
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"
#include "../common/cli.h"
#include "../common/train_opts.h"
#include "fuzz.h"

#define FUZZ_MAX_ARGS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *buf, *argv[FUZZ_MAX_ARGS + 1];
    int argc = fuzz_argv(data, size, "train", argv, FUZZ_MAX_ARGS, &buf);
    run o;
    train_args a;
    if (!buf) return 0;
    if (train_options(argc, argv, &o, &a, 0) < 0) {
        o.resume = NULL;
        if (train_config(&o, &a, 256) == PT_OK && pt_gpt_config_validate(&o.cfg) == PT_OK) {
            pt_gpt m;
            pt_gpt_desc d;
            memset(&d, 0, sizeof d);
            d.config = o.cfg, d.batch = o.batch / o.dp / o.accum, d.seq = o.seq, d.meta = 1;
            d.zero = o.zero, d.grad_accum = o.accum, d.schedule = o.schedule;
            d.chunks = o.chunks, d.recompute = o.recompute;
            if (pt_gpt_init(&m, &d) == PT_OK) pt_gpt_free(&m);
        }
    }
    free(buf);
    return 0;
}
