/* plan_1t.c -- a trillion-parameter GPT, planned with the simulator's API.

   make build/plan_1t && build/plan_1t [--trace build/1t.json]

   1. Megatron-LM's 1T model (Narayanan et al. 2021: 128 layers, hidden
      25600, 160 heads) on 3072 A100s of Selene: tp 8 inside a DGX node,
      64 pipeline stages, dp 6, batch 3072 of micro-batch 1, full
      recomputation. The paper measured 163 TFLOP/s per GPU (52% of peak).
   2. The same layout on 3072 MI250X GCDs of Frontier.
   3. What the strategy search picks on Frontier for that model, as the
      Frontier study (Dash et al. 2023, 31.96% of peak for 1T) searched by
      hand.
   Every rank's model is built in a meta arena (sizes, no memory) and the
   1F1B schedule the real executor runs is simulated action by action. */
#define _POSIX_C_SOURCE 200809L /* setenv, execv (cli.h) */
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"
#include "../common/cli.h"

static void report(const char *what, const pt_plan_desc *d, const pt_hw *hw,
                   const pt_plan_result *r) {
    const double G = 1073741824.0;
    printf("%s\n  tp %d x pp %d x dp %d on %d x %s, %s, micro-batch %d, %d micro-batches, "
           "ZeRO %d\n", what, d->tp, d->pp, r->dp, d->gpus, hw->name,
           pt_schedule_kind_name(r->schedule), d->model.batch, r->micro_batches, d->model.zero);
    printf("  step %.1f s, %.1f TFLOP/s per GPU = %.1f%% of peak (model FLOPs: %.1f), bubble "
           "%.1f%%, communication %.1f s of it\n",
           r->step_time, r->tflops_per_gpu, r->percent_of_peak, r->model_tflops_per_gpu,
           100 * r->bubble_fraction, r->comm_exposed);
    printf("  memory on rank %d: %.1f GiB = weights %.1f + gradients %.1f + optimizer %.1f + "
           "activations %.1f (of %.0f GiB)\n",
           r->mem_rank, r->mem.total / G, r->mem.params / G, r->mem.grads / G,
           r->mem.optimizer / G, r->mem.activations / G, hw->mem_bytes / G);
    printf("  450B tokens would take %.0f days; %d ranks built in %.3f s\n\n",
           r->train_seconds / 86400, d->gpus, r->build_seconds);
}

int main(int argc, char **argv) {
    const char *trace_path = NULL;
    cli_opt opts[] = {
        {"trace", CLI_STR, &trace_path, "write the A100 step as Chrome trace JSON (+ .svg)", 0, 0},
    };
    const char *pos[1];
    int npos, s, n, i, why[3];
    pt_plan_desc d, best_d[3];
    pt_plan_result r, best[3];
    pt_hw a100, mi250x;
    pt_trace trace;
    double t0;

    cli_passive_wait(argv);
    if ((s = cli_parse(argc, argv, opts, 1, pos, 0, &npos)) != 0) {
        cli_usage(s == 1 ? stdout : stderr, "usage: plan_1t [options]", opts, 1);
        return s == 1 ? 0 : 2;
    }
    if (pt_hw_preset("a100-80g", &a100) != PT_OK || pt_hw_preset("mi250x", &mi250x) != PT_OK)
        return 1;
    memset(&d, 0, sizeof d);
    d.model.config.n_layer = 128, d.model.config.n_embd = 25600, d.model.config.n_head = 160;
    d.model.config.vocab_size = 51200, d.model.seq = 2048, d.model.batch = 1; /* micro-batch */
    d.model.chunks = 1, d.model.schedule = PT_SCHED_1F1B, d.model.recompute = PT_RECOMPUTE_FULL;
    d.tp = 8, d.pp = 64, d.gpus = 3072, d.batch = 3072, d.train_tokens = 450e9;
    memset(&trace, 0, sizeof trace);
    trace.title = "1T GPT, 3072 A100s: one simulated step", trace.track_name = "stage";

    if (pt_plan_simulate(&d, &a100, &r, trace_path ? &trace : NULL) != PT_OK) goto fail;
    report("Megatron-LM's 1T on Selene (published: 163 TFLOP/s per GPU, 52% of peak)", &d, &a100,
           &r);
    if (trace_path) {
        char svg[1024];
        snprintf(svg, sizeof svg, "%s.svg", trace_path);
        if (pt_trace_write_chrome(&trace, trace_path) != PT_OK ||
            pt_trace_write_svg(&trace, svg) != PT_OK)
            goto fail;
        printf("  timeline: %s, %s\n\n", trace_path, svg);
    }
    if (pt_plan_simulate(&d, &mi250x, &r, NULL) != PT_OK) goto fail;
    report("The same layout on Frontier", &d, &mi250x, &r);

    t0 = pt_time_now();
    n = pt_plan_search(&d, &mi250x, best_d, best, 3, why);
    printf("Strategy search on Frontier (3072 GCDs, batch 3072): %d layouts fit, %d do not divide, "
           "%d run out of memory (%.1f s)\n\n", n, why[0], why[1], pt_time_now() - t0);
    for (i = 0; i < n && i < 3; i++) {
        char what[64];
        snprintf(what, sizeof what, "Search result %d (the study measured 31.96%% of peak)", i + 1);
        report(what, &best_d[i], &mi250x, &best[i]);
    }
    pt_trace_free(&trace);
    return 0;
fail:
    fprintf(stderr, "error: %s\n", pt_last_error());
    pt_trace_free(&trace);
    return 1;
}
