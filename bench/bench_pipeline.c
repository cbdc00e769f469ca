/* bench_pipeline: measured pipeline bubbles beside the theory, and each
   stage's activation slots beside the checker's prediction.

     build/bench_pipeline [--stages 2] [--schedule 1f1b] [--microbatches 8]
                          [--layers 8] [--embd 128] [--seq 64] [--steps 3]
                          [--trace out.json] [--svg out.svg]

   Runs a GPT (--embd wide, --layers blocks, a --vocab small enough that
   the head does not unbalance the last stage) on --stages thread
   ranks, one pipeline stage each, for --steps pipeline steps of
   --microbatches micro-batches of one sequence, timing every action of the
   last step (pt_gpt.trace). The bubble is the share of the stages' time not
   spent in F, B or W: 1 - sum(busy) / (stages x step time); waiting in a
   receive counts as idle. Theory with B = 2F: (p-1)/(m+p-1) for gpipe and
   1f1b, (p-1)/(vm+p-1) interleaved, (p-1)/(3m+p-1) for zb-h1 (m >= p) with
   B split into B = W = F. The check before timing: the loss of
   the first step is near ln V. With more stages than cores the stages share
   cores and the measured bubble says more about the scheduler than about the
   schedule. */
#define _POSIX_C_SOURCE 200809L /* setenv, execv (cli.h) */
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"
#include "../common/cli.h"

#include <math.h>

typedef struct opts {
    const char *schedule, *trace_path, *svg_path;
    int stages, micro, layers, embd, seq, steps, chunks, vocab;
    double bubble, busy_share[64];
    int slots_used[64], slots_predicted[64];
} opts;

static pt_status stage_main(pt_comm *world, void *arg) {
    opts *o = (opts *)arg;
    pt_grid grid;
    pt_gpt gpt;
    pt_gpt_desc d;
    pt_trace trace;
    pt_step_desc sd;
    pt_adamw_config opt = pt_adamw_default();
    int *x = NULL, *y = NULL, n = o->micro * o->seq, i, s;
    pt_status st;
    memset(&gpt, 0, sizeof gpt);
    memset(&trace, 0, sizeof trace);
    if ((st = pt_grid_init(&grid, world, 1, 1, o->stages)) != PT_OK) return st;
    memset(&d, 0, sizeof d);
    pt_gpt_config_preset("small", &d.config);
    d.config.n_layer = o->layers;
    d.config.vocab_size = o->vocab;
    d.config.n_embd = o->embd;
    d.config.block_size = o->seq;
    d.batch = 1;
    d.seq = o->seq;
    d.grid = &grid;
    d.grad_accum = o->micro;
    d.chunks = o->chunks;
    if ((st = pt_schedule_kind_parse(o->schedule, &d.schedule)) != PT_OK ||
        (st = pt_gpt_init(&gpt, &d)) != PT_OK)
        goto out;
    pt_gpt_init_weights(&gpt, 1);
    if (!cli_random_batch(n, o->vocab, 3, &x, &y)) {
        st = pt_comm_fail(world, pt_error(PT_ERR_OOM, "out of memory"));
        goto out;
    }
    memset(&sd, 0, sizeof sd);
    sd.inputs = x, sd.targets = y, sd.B = n / o->seq, sd.T = o->seq;
    sd.adamw = &opt, sd.lr = 1e-4f;
    for (s = 0; s < o->steps; s++) {
        if (s == o->steps - 1) {
            pt_trace_free(&trace);
            trace.track_name = "stage";
            sd.trace = &trace;
        }
        if ((st = pt_gpt_step(&gpt, &sd, NULL)) != PT_OK) goto out;
        if (s == 0 && !(fabs(gpt.loss - log((double)o->vocab)) < 0.5)) {
            st = pt_comm_fail(world, pt_error(PT_ERR_RANGE, "check failed: loss %.3f, ln V %.3f",
                                              gpt.loss, log((double)o->vocab)));
            goto out;
        }
    }
    { /* every stage's busy time and span, to rank 0 */
        float mine[4] = {0.0f, 1e30f, 0.0f, 0.0f}, all[4 * 64];
        for (i = 0; i < trace.count; i++) { /* the pipeline's part: OPT comes after it */
            const pt_trace_event *e = &trace.events[i];
            if (e->kind == PT_ACT_OPT) continue;
            if (e->kind == PT_ACT_F || e->kind == PT_ACT_B || e->kind == PT_ACT_W) mine[0] += (float)e->dur;
            if (e->start < mine[1]) mine[1] = (float)e->start;
            if (e->start + e->dur > mine[2]) mine[2] = (float)(e->start + e->dur);
        }
        mine[3] = (float)gpt.mem.slots_peak;
        if ((st = pt_comm_all_gather(world, mine, all, 4)) != PT_OK) goto out;
        if (world->rank == 0) {
            double t0 = 1e30, t1 = 0.0, busy = 0.0;
            for (i = 0; i < o->stages; i++) {
                t0 = all[4 * i + 1] < t0 ? all[4 * i + 1] : t0;
                t1 = all[4 * i + 2] > t1 ? all[4 * i + 2] : t1;
                busy += all[4 * i];
            }
            o->bubble = 1.0 - busy / (o->stages * (t1 - t0));
            for (i = 0; i < o->stages; i++) {
                o->busy_share[i] = all[4 * i] / (t1 - t0);
                o->slots_used[i] = (int)all[4 * i + 3];
            }
        }
        o->slots_predicted[grid.pp_rank] = gpt.mem.slots;
    }
out:
    if (st != PT_OK && st != PT_ERR_COMM) st = pt_comm_fail(world, st);
    if (st == PT_OK && (o->trace_path || o->svg_path)) /* every stage's events, to rank 0 */
        st = pt_trace_gather(&trace, world);
    if (st == PT_OK && world->rank == 0 && (o->trace_path || o->svg_path)) {
        trace.title = "ptrain pipeline step (measured)";
        trace.track_name = "stage";
        if (o->trace_path) st = pt_trace_write_chrome(&trace, o->trace_path);
        if (st == PT_OK && o->svg_path) st = pt_trace_write_svg(&trace, o->svg_path);
    }
    free(x), free(y);
    pt_trace_free(&trace);
    pt_gpt_free(&gpt);
    pt_grid_free(&grid);
    return st;
}

int main(int argc, char **argv) {
    opts o;
    int npos, s, i;
    const char *pos[1];
    cli_opt table[] = {
        {"stages", CLI_INT, &o.stages, "pipeline stages (thread ranks)", 2, 64},
        {"schedule", CLI_STR, &o.schedule, "gpipe, 1f1b, interleaved, zb-h1, zb-h2, zb-v, chimera or 2bw",
         0, 0},
        {"microbatches", CLI_INT, &o.micro, "micro-batches per step (of one sequence each)", 1, 1024},
        {"chunks", CLI_INT, &o.chunks, "chunks per stage (interleaved; zb-v, chimera: 2)", 1, 16},
        {"layers", CLI_INT, &o.layers, "blocks in the model", 1, 256},
        {"embd", CLI_INT, &o.embd, "width C", 16, 4096},
        {"vocab", CLI_INT, &o.vocab, "vocabulary (small keeps the stages balanced)", 2, 1 << 20},
        {"seq", CLI_INT, &o.seq, "sequence length T", 1, 4096},
        {"steps", CLI_INT, &o.steps, "steps (the last one is timed)", 2, 100},
        {"trace", CLI_STR, &o.trace_path, "write the timed step as Chrome trace JSON", 0, 0},
        {"svg", CLI_STR, &o.svg_path, "write the timed step as an SVG picture", 0, 0},
    };
    int nopts = (int)(sizeof table / sizeof table[0]);
    pt_schedule_kind kind;
    pt_status st;
    cli_passive_wait(argv);
    memset(&o, 0, sizeof o);
    o.schedule = "1f1b", o.stages = 2, o.micro = 8, o.chunks = 1, o.layers = 8, o.embd = 128;
    o.seq = 64, o.steps = 3, o.vocab = 256;
    if ((s = cli_parse(argc, argv, table, nopts, pos, 0, &npos)) != 0) {
        cli_usage(s == 1 ? stdout : stderr, "usage: bench_pipeline [options]", table, nopts);
        return s == 1 ? 0 : 2;
    }
    if (pt_schedule_kind_parse(o.schedule, &kind) != PT_OK) {
        fprintf(stderr, "error: %s\n", pt_last_error());
        return 2;
    }
    if ((kind == PT_SCHED_INTERLEAVED || kind == PT_SCHED_ZB_V || kind == PT_SCHED_CHIMERA) &&
        o.chunks < 2)
        o.chunks = 2;
    st = pt_comm_threads_run(o.stages, stage_main, &o);
    if (st != PT_OK) {
        fprintf(stderr, "error: %s\n", pt_last_error());
        return 1;
    }
    {
        int p = o.stages, m = o.micro, v = o.chunks;
        /* with F = B-input = W (B = 2F unsplit): zb-h1 idles p-1 units of 3m+p-1 */
        double theory = kind == PT_SCHED_INTERLEAVED ? (double)(p - 1) / (v * m + p - 1)
                        : kind == PT_SCHED_ZB_H1 && m >= p ? (double)(p - 1) / (3 * m + p - 1)
                        : (double)(p - 1) / (m + p - 1);
        pt_schedule sch = {0};
        pt_schedule_report rep;
        /* zb-h2, zb-v: the checker's unit-time run, (p-1)/(3vm+p-1) once m >= 2p-1;
           chimera: its unit-time run too (2(p-2) idle slots a stage at m = p); 2bw:
           its unit-time run, whose updates do not wait for each other (the executor's
           do: they agree on the clipping norm and the guard) */
        if ((kind == PT_SCHED_ZB_H2 || kind == PT_SCHED_ZB_V || kind == PT_SCHED_CHIMERA ||
             kind == PT_SCHED_2BW) &&
            pt_schedule_build(&sch, kind, p, v, m) == PT_OK && pt_schedule_check(&sch, &rep) == PT_OK)
            theory = rep.bubble;
        pt_schedule_free(&sch);
        printf("%-11s p=%d m=%-2d v=%d: bubble measured %5.1f%%, theory %5.1f%% | slots "
               "used/predicted:", o.schedule, p, m, v, 100.0 * o.bubble, 100.0 * theory);
        for (i = 0; i < p; i++) printf(" %d/%d", o.slots_used[i], o.slots_predicted[i]);
        printf("\n");
    }
    return 0;
}
