/* pipeline.c -- pipeline schedules as data: build one, check it, draw it.

   make build/pipeline && build/pipeline [--schedule 1f1b] [--stages 4]
                                          [--microbatches 8] [--chunks 2]
                                          [--trace out.json] [--svg out.svg]

   A model cut into p stages processes a batch as m micro-batches. Each stage
   runs a list of actions: the forward F of a micro-batch (after receiving
   its input from the stage before), the backward B (after receiving the
   output's gradient from the stage after), for zero-bubble schedules the
   weight gradient W split from B, and finally the optimizer step. The order
   of the lists is the schedule:

     gpipe        all forwards, then all backwards: every micro-batch's
                  activations are held at once (m per stage)
     1f1b         PipeDream-Flush: after p - s warm-up forwards, stage s
                  alternates one forward, one backward: at most p - s held
     interleaved  Megatron-LM: each stage holds v chunks of layers, so the
                  pipeline fills v times faster: bubble (p-1)/(vm + p-1)
     zb-h1        1F1B with W split off and run late, filling the tail
     zb-h2        zero bubble H2: 2p - 1 micro-batches in flight fill the
                  warm-up, W's the tail: no stage idles inside its run
     zb-v         zero bubble V: two chunks a stage in a V (stage s holds
                  virtual stages s and 2p-1-s), no idle inside a stage's run
                  at 1F1B's activation memory (2p half-stage chunks)
     chimera      two pipelines in opposite directions (even p, m a multiple
                  of p): stage s holds stage s of replica a and stage p-1-s
                  of replica b; micro-batches go half down, half up, and
                  each stage all-reduces its gradients with stage p-1-s
     2bw          PipeDream-2BW: 1F1B never flushed, a new weight version
                  after every p micro-batches (m a multiple of p); batch t
                  runs at version t-1, so a stage keeps two versions

   With F = 1, B = 2 (or B = W = 1) time units, the idle share ("bubble") of
   GPipe and 1F1B is (p-1)/(m+p-1). The checker runs all lists together, so
   a broken order is an error, not a hang. This program prints the grid,
   the checker's numbers, and writes the timeline as a Chrome trace (open it
   in chrome://tracing or ui.perfetto.dev) and as an SVG picture. */
#define _POSIX_C_SOURCE 200809L /* setenv, execv (cli.h) */
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"
#include "../common/cli.h"

int main(int argc, char **argv) {
    const char *kind_name = "1f1b", *trace_path = NULL, *svg_path = NULL;
    int p = 4, m = 8, v = 2, npos, s, st;
    const char *pos[1];
    cli_opt opts[] = {
        {"schedule", CLI_STR, &kind_name, "gpipe, 1f1b, interleaved, zb-h1, zb-h2, zb-v, chimera or 2bw",
         0, 0},
        {"stages", CLI_INT, &p, "pipeline stages p", 1, 64},
        {"microbatches", CLI_INT, &m, "micro-batches m", 1, 4096},
        {"chunks", CLI_INT, &v, "chunks per stage v (interleaved only; zb-v has 2)", 1, 64},
        {"trace", CLI_STR, &trace_path, "write the timeline as Chrome trace JSON here", 0, 0},
        {"svg", CLI_STR, &svg_path, "write the timeline as an SVG picture here", 0, 0},
    };
    int nopts = (int)(sizeof opts / sizeof opts[0]);
    pt_schedule_kind kind;
    pt_schedule sched = {0};
    pt_schedule_report rep;
    pt_trace trace = {0};
    char *grid, title[160];
    size_t need;

    if ((s = cli_parse(argc, argv, opts, nopts, pos, 0, &npos)) != 0) {
        cli_usage(s == 1 ? stdout : stderr, "usage: pipeline [options]", opts, nopts);
        return s == 1 ? 0 : 2;
    }
    if (pt_schedule_kind_parse(kind_name, &kind) != PT_OK ||
        pt_schedule_build(&sched, kind, p, kind == PT_SCHED_INTERLEAVED ? v
                                           : kind == PT_SCHED_ZB_V || kind == PT_SCHED_CHIMERA ? 2
                                                                                              : 1,
                          m) != PT_OK ||
        pt_schedule_check(&sched, &rep) != PT_OK) {
        fprintf(stderr, "error: %s\n", pt_last_error());
        pt_schedule_free(&sched);
        return 1;
    }

    /* the grid, one column per time unit */
    need = pt_schedule_format(&sched, NULL, 0);
    grid = (char *)malloc(need + 1);
    if (!grid) return 1;
    pt_schedule_format(&sched, grid, need + 1);
    printf("%s: %d stages, %d micro-batches%s\n\n%s\n", pt_schedule_kind_name(kind), p, m,
           kind == PT_SCHED_CHIMERA ? ", replicas a (down) and b (up)"
           : sched.chunks > 1        ? ", 2 chunks per stage (letters a, b)"
                                     : "", grid);
    free(grid);

    printf("time units %d; idle (bubble) %.1f%%", rep.steps, 100.0 * rep.bubble);
    if (kind == PT_SCHED_GPIPE || kind == PT_SCHED_1F1B)
        printf(" = (p-1)/(m+p-1) = %.1f%%", 100.0 * (p - 1) / (m + p - 1));
    if (kind == PT_SCHED_INTERLEAVED)
        printf(" = (p-1)/(vm+p-1) = %.1f%%", 100.0 * (p - 1) / (v * m + p - 1));
    if (kind == PT_SCHED_ZB_H2 || kind == PT_SCHED_ZB_V) /* the fill and drain alone */
        printf(" = (p-1)/(3vm+p-1) = %.1f%% when no stage idles inside its run (%d idle slots "
               "there; 0 once m >= 2p-1)", 100.0 * (p - 1) / (3 * sched.chunks * m + p - 1),
               rep.idle);
    if (kind == PT_SCHED_CHIMERA && m == p) /* the paper's D - 2 bubbles, B two slots */
        printf(" (m = p: %d idle slots a stage = 2(p-2), 1F1B's 3(p-1) = %d)", rep.steps - 3 * m,
               3 * (p - 1));
    if (kind == PT_SCHED_2BW)
        printf("; %d updates without a flush, %d weight versions alive at most", m / p,
               rep.versions);
    printf("\nmicro-batches whose activations a stage holds at its peak:");
    for (st = 0; st < p; st++) printf(" %d", rep.peak_inflight[st]);
    printf("\n");

    /* the same run as a timeline in time units (1 ms each in the Chrome trace) */
    for (st = 0, s = 0; st < p; st++) /* W apart from B: B and W take a unit each */
        for (npos = 0; npos < sched.count[st]; npos++) s |= sched.list[st][npos].kind == PT_ACT_W;
    snprintf(title, sizeof title, "ptrain %s schedule, %d stages, %d micro-batches: F %s",
             pt_schedule_kind_name(kind), p, m, s ? "= B = W = 1 time unit" : "= 1 time unit, B = 2");
    trace.title = title;
    if (pt_schedule_trace(&sched, 1e-3, &trace) != PT_OK ||
        (trace_path && pt_trace_write_chrome(&trace, trace_path) != PT_OK) ||
        (svg_path && pt_trace_write_svg(&trace, svg_path) != PT_OK)) {
        fprintf(stderr, "error: %s\n", pt_last_error());
        pt_trace_free(&trace);
        pt_schedule_free(&sched);
        return 1;
    }
    if (trace_path) printf("wrote %s (chrome://tracing)\n", trace_path);
    if (svg_path) printf("wrote %s\n", svg_path);
    pt_trace_free(&trace);
    pt_schedule_free(&sched);
    return 0;
}
