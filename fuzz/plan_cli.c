/* plan_cli.c -- fuzzes build/plan's command line (common/plan_opts.h): the
   input is the argument vector, arguments separated by NUL bytes. Runs the
   option parsing and checks (plan_options), then the simulation itself
   (pt_plan_simulate: meta builds of every stage, the schedule, the cost
   model) on the profile asked for. --search, --calibrate and --hw local are
   not run: they take seconds or measure the machine. See fuzz.h. */
#define _POSIX_C_SOURCE 200809L
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"
#include "../common/cli.h"
#include "../common/plan_opts.h"
#include "fuzz.h"

#define FUZZ_MAX_ARGS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *buf, *argv[FUZZ_MAX_ARGS + 1];
    int argc = fuzz_argv(data, size, "plan", argv, FUZZ_MAX_ARGS, &buf);
    plan_args p;
    pt_hw hw;
    pt_plan_result r;
    if (buf && plan_options(argc, argv, &p, 0) < 0 && !p.search && !p.calibrate &&
        pt_hw_preset(p.hw_name ? p.hw_name : "a100-80g", &hw) == PT_OK)
        (void)pt_plan_simulate(&p.d, &hw, &r, NULL);
    free(buf);
    return 0;
}
