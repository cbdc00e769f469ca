/* bench_overlap: does a started all-reduce progress while a rank computes?

     mpirun -n 2 build/bench_overlap_mpi [--mb 16] [--reps 5] [--slices 200]
     bench/overlap.sh          the same across 2 network-namespace hosts at several
                               link rates (tests/hosts.sh), with and without Open MPI's
                               TCP progress thread

   Per repetition, every rank (times are rank 0's, medians over --reps):
     comm     a blocking all-reduce (AVG) of --mb MiB of floats
     compute  sgemm work sized to last about as long as comm (calibrated once)
     none     start the all-reduce, compute, wait: no MPI call while computing
     test     the same with pt_comm_test after each of --slices slices of compute
   "exposed" is a variant's time minus compute: the communication it did not
   hide; the ratio exposed/comm is 1 when nothing overlapped and 0 when all
   did; max(comm, compute) is the best a variant can do. The check first: the
   started all-reduce gives the blocking one's bits.

     mpirun -n N build/bench_overlap_mpi --step [--preset small] [--layers L] [--vocab V]
                                         [--bucket-mb X] [--batch 8] [--seq 128] [--steps 6]
                                         [--zero 0..3]
   Training steps with data parallelism over the N ranks, pt_step_desc.overlap
   on and off, and each rank's batch alone on a model without a dp group (the
   compute), in turn (--layers, --vocab change the preset's): median step
   times; exposed communication = step - compute;
   the time inside the dp group's communicator; the limit max(compute, off's
   communication); the check that on and off give the same parameters, bit
   for bit. A line starting "row" repeats the figures for bench/overlap.sh's
   table.
   --hw-file F: this machine's profile (build/plan --calibrate; threads, so it has
   the rates of a rank of one thread beside another): the simulator predicts
   the on and off steps from it and the link as an all-reduce over the world
   measures it (pt_hw_calibrate_links), and the lines say by how
   much they miss the measured steps.
   --trace F: the last timed overlapped step's timeline (every rank's actions
   and dp transfers) as Chrome trace JSON at F and an SVG picture at F.svg.
   Options are checked (common/cli.h): a malformed or out-of-range value
   exits 2 naming the option and the value. */
#define _POSIX_C_SOURCE 200809L
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"
#include "../common/cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef PTRAIN_MPI

#define GEMM 96 /* one compute unit: a 96^3 sgemm (1.8 MFLOP) */

static float g_a[GEMM * GEMM], g_b[GEMM * GEMM], g_c[GEMM * GEMM];
static pt_ctx g_ctx; /* the GEMMs' context (fp32, its workspace) */

static void compute(long units) {
    long i;
    for (i = 0; i < units; i++) pt_sgemm(&g_ctx, 0, 0, GEMM, GEMM, GEMM, 1.0f, g_a, GEMM, g_b, GEMM, 0.5f, g_c, GEMM);
}


static void fill(float *x, size_t n, int rank, int rep) {
    size_t i;
    for (i = 0; i < n; i++) x[i] = (float)((i * 2654435761u + (size_t)rank * 97u + (size_t)rep) % 1000u) * 1e-3f - 0.5f;
}

/* Starts the all-reduce of x, computes units in `slices` slices (testing the
   request after each when test != 0), waits; returns the seconds. */
static double overlapped(pt_comm *w, float *x, size_t n, long units, int slices, int test,
                         pt_status *st) {
    pt_comm_req q;
    double t0;
    int s, done = 0;
    pt_comm_barrier(w);
    t0 = pt_time_now();
    *st = pt_comm_all_reduce_start(w, x, n, PT_REDUCE_AVG, &q);
    for (s = 0; s < slices && *st == PT_OK; s++) {
        compute(units / slices + (s < units % slices));
        if (test && !done) *st = pt_comm_test(&q, &done);
    }
    if (*st == PT_OK) *st = pt_comm_wait(&q);
    return pt_time_now() - t0;
}

/* --step: see the top. */
/* The simulator's step for the run's model and layout (d, one micro-batch
   a rank) on ranks data-parallel ranks of hw, overlap on or off. */
static double sim_step(const pt_gpt_desc *d, const pt_hw *hw, int ranks, pt_overlap ov) {
    pt_plan_desc pd;
    pt_plan_result r;
    memset(&pd, 0, sizeof pd);
    pd.model = *d;
    pd.tp = pd.pp = 1, pd.gpus = ranks, pd.batch = d->batch * ranks, pd.exec = PT_EXEC_PTRAIN;
    pd.overlap = ov;
    if (pt_plan_simulate(&pd, hw, &r, NULL) != PT_OK) {
        fprintf(stderr, "bench_overlap: simulating: %s\n", pt_last_error());
        return 0.0;
    }
    return r.step_time;
}

static int step_bench(pt_comm *w, const char *preset, int layers, int vocab, int B, int T,
                      int steps, int zero, double bucket_mb, const char *hw_file,
                      const char *trace_path) {
    pt_grid g, g1;
    pt_comm self;
    pt_gpt m[3];
    pt_gpt_desc d;
    pt_step_desc sd;
    pt_adamw_config opt = pt_adamw_default();
    double t[3][64], e[3][64], t0, c0, s_on = 0.0, s_off = 0.0;
    pt_hw hw;
    pt_trace trace;
    int *in = (int *)malloc((size_t)B * T * sizeof(int)), *tg = (int *)malloc((size_t)B * T * sizeof(int));
    int k, i, v, bad = 0;
    float *p0, *p1;
    pt_status st;
    memset(&d, 0, sizeof d);
    memset(&trace, 0, sizeof trace);
    pt_comm_self(&self);
    if (!in || !tg || pt_gpt_config_preset(preset, &d.config) != PT_OK ||
        pt_grid_init(&g, w, 1, w->size, 1) != PT_OK || pt_grid_init(&g1, &self, 1, 1, 1) != PT_OK) {
        fprintf(stderr, "bench_overlap: %s\n", in && tg ? pt_last_error() : "out of memory");
        return 1;
    }
    if (layers) d.config.n_layer = layers;
    if (vocab) d.config.vocab_size = vocab;
    d.batch = B, d.seq = T, d.zero = zero;
    d.bucket_bytes = (size_t)(bucket_mb * 1048576.0);
    if (hw_file) { /* the machine's profile, and the link as the world's all-reduce finds it */
        if (pt_hw_load(hw_file, &hw) != PT_OK || pt_hw_calibrate_links(&hw, w) != PT_OK) {
            fprintf(stderr, "bench_overlap: %s\n", pt_last_error());
            return 1;
        }
        s_on = sim_step(&d, &hw, w->size, PT_OVERLAP_ON);
        s_off = sim_step(&d, &hw, w->size, PT_OVERLAP_OFF);
        if (!(s_on > 0 && s_off > 0)) return 1;
    }
    for (v = 0; v < 3; v++) { /* 0: overlap on, 1: off, 2: this rank's batch alone (dp 1) */
        d.grid = v < 2 ? &g : &g1;
        if ((st = pt_gpt_init(&m[v], &d)) != PT_OK) {
            fprintf(stderr, "bench_overlap: %s\n", pt_last_error());
            return 1;
        }
        pt_gpt_init_weights(&m[v], 1);
    }
    /* rounds of two steps of each variant in turn, the second timed (it
       starts, as in a run, with the first's update's gathers under way; its
       own are waited for after it), so that a machine's drift reaches all
       three alike */
    for (k = 0; k < 2 * (steps + 1); k++)
        for (v = 0; v < 3; v++) {
            pt_comm *dp = v < 2 ? &g.dp_comm : &g1.dp_comm;
            int timed = k % 2 && k > 1;
            for (i = 0; i < B * T; i++) {
                in[i] = (int)((unsigned)(i * 31 + g.dp_rank * 101 + k * 7) % (unsigned)d.config.vocab_size);
                tg[i] = (int)((unsigned)(i * 17 + g.dp_rank * 13 + k * 5 + 1) % (unsigned)d.config.vocab_size);
            }
            memset(&sd, 0, sizeof sd);
            sd.inputs = in, sd.targets = tg, sd.B = B, sd.T = T, sd.adamw = &opt, sd.lr = 1e-3f;
            sd.overlap = v == 1 ? PT_OVERLAP_OFF : PT_OVERLAP_ON;
            if (trace_path && v == 0 && k == 2 * steps + 1) sd.trace = &trace; /* the last timed */
            pt_comm_barrier(w);
            c0 = dp->seconds;
            t0 = pt_time_now();
            if ((st = pt_gpt_step(&m[v], &sd, NULL)) != PT_OK) {
                fprintf(stderr, "rank %d: %s\n", w->rank, pt_last_error());
                return 1;
            }
            pt_comm_barrier(w); /* the slower rank's time, as a dp step takes it */
            if (timed) t[v][k / 2 - 1] = pt_time_now() - t0, e[v][k / 2 - 1] = dp->seconds - c0;
            if (k % 2 && (st = pt_gpt_sync_params(&m[v])) != PT_OK) {
                fprintf(stderr, "rank %d: %s\n", w->rank, pt_last_error());
                return 1;
            }
        }
    if (trace_path) {
        trace.title = "bench_overlap: an overlapped step (measured)", trace.track_name = "rank";
        if ((st = pt_trace_gather(&trace, w)) == PT_OK && w->rank == 0) {
            char svg[4096];
            snprintf(svg, sizeof svg, "%s.svg", trace_path);
            if ((st = pt_trace_write_chrome(&trace, trace_path)) == PT_OK)
                st = pt_trace_write_svg(&trace, svg);
        }
        pt_trace_free(&trace);
        if (st != PT_OK) {
            fprintf(stderr, "bench_overlap: %s\n", pt_last_error());
            return 1;
        }
    }
    p0 = (float *)malloc(m[0].num_params_full * sizeof(float));
    p1 = (float *)malloc(m[0].num_params_full * sizeof(float));
    if (!p0 || !p1 || pt_gpt_gather(&m[0], PT_BUF_PARAMS, p0) != PT_OK ||
        pt_gpt_gather(&m[1], PT_BUF_PARAMS, p1) != PT_OK)
        bad = 1;
    else
        bad = memcmp(p0, p1, m[0].num_params_full * sizeof(float)) != 0;
    if (w->rank == 0) {
        double on = cli_median(t[0], steps), off = cli_median(t[1], steps);
        double alone = cli_median(t[2], steps);
        double eon = cli_median(e[0], steps), eoff = cli_median(e[1], steps);
        double lim = alone > eoff ? alone : eoff;
        char bk[64];
        if (bucket_mb > 0) snprintf(bk, sizeof bk, "buckets >= %g MiB", bucket_mb);
        else snprintf(bk, sizeof bk, "a layer a bucket");
        printf("%s (%d layers, vocabulary %d: %.1fM parameters), dp %d, ZeRO %d, %s, B=%d T=%d "
               "per rank, median of %d steps%s\n",
               preset, d.config.n_layer, d.config.vocab_size, (double)m[0].num_params_full / 1e6,
               w->size, zero, bk, B, T, steps,
               bad ? ": PARAMETERS DIFFER" : " (the same parameters, bit for bit)");
        printf("  compute: step %7.1f ms (each rank its batch alone, no dp group)\n", alone * 1e3);
        printf("  overlap off: step %7.1f ms, exposed %7.1f ms (step - compute); in dp calls "
               "%7.1f ms\n", off * 1e3, (off - alone) * 1e3, eoff * 1e3);
        printf("  overlap on:  step %7.1f ms, exposed %7.1f ms (%.2f of off's); in dp calls "
               "%7.1f ms\n", on * 1e3, (on - alone) * 1e3,
               off > alone ? (on - alone) / (off - alone) : 0.0, eon * 1e3);
        printf("  limit max(compute, off's dp calls) %.1f ms: on/limit %.2f, off/limit %.2f\n",
               lim * 1e3, on / lim, off / lim);
        if (hw_file)
            printf("  simulated (link %.0f Mbit/s, %.0f us and %.2f core ns a byte as an all-reduce "
                   "measures it): off %.1f ms (%.2f of measured), on %.1f ms (%.2f)\n",
                   hw.intra_bw * 8e-6, hw.intra_lat * 1e6, hw.comm_cpu * 1e9, s_off * 1e3,
                   s_off / off, s_on * 1e3, s_on / on);
        printf("row %s z%d | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f", preset, zero, alone * 1e3,
               eoff * 1e3, off * 1e3, on * 1e3, lim * 1e3,
               off > alone ? (on - alone) / (off - alone) : 0.0);
        if (hw_file) printf(" | %.1f | %.2f | %.1f | %.2f", s_off * 1e3, s_off / off, s_on * 1e3, s_on / on);
        printf("\n");
    }
    free(p0), free(p1), free(in), free(tg);
    for (v = 0; v < 3; v++) pt_gpt_free(&m[v]);
    pt_grid_free(&g1);
    pt_grid_free(&g);
    return bad;
}

int main(int argc, char **argv) {
    pt_comm w;
    const char *preset = "small", *hw_file = NULL, *trace_path = NULL;
    int step = 0, B = 8, T = 128, steps = 6, zero = 0, layers = 0, vocab = 0, npos, s;
    float bucket_mb = 0, mb = 16;
    double tc[64], tp[64], tn[64], tt[64], t0, c, p, none, test;
    int reps = 5, slices = 200, r, i;
    long units;
    size_t n;
    float *x, *y;
    pt_status st = PT_OK;
    float cal;
    cli_opt opts[] = {
        {"mb", CLI_FLOAT, &mb, "MiB all-reduced (the started all-reduce bench)", 0.0001, 4096},
        {"reps", CLI_INT, &reps, "repetitions (the median is reported)", 1, 64},
        {"slices", CLI_INT, &slices, "slices of compute, a pt_comm_test after each", 1, 1000000},
        {"step", CLI_FLAG, &step, "training steps, overlap on and off, instead", 0, 0},
        {"preset", CLI_STR, &preset, "--step: the model preset", 0, 0},
        {"layers", CLI_INT, &layers, "--step: layers (0: the preset's)", 0, 4096},
        {"vocab", CLI_INT, &vocab, "--step: vocabulary (0: the preset's)", 0, 1 << 24},
        {"bucket-mb", CLI_FLOAT, &bucket_mb, "--step: gradient buckets of at least X MiB (0: a "
                                             "layer a bucket)", 0, 1 << 20},
        {"batch", CLI_INT, &B, "--step: rows a rank", 1, 65536},
        {"seq", CLI_INT, &T, "--step: sequence length", 1, 65536},
        {"steps", CLI_INT, &steps, "--step: timed steps (the median is reported)", 1, 64},
        {"zero", CLI_INT, &zero, "--step: ZeRO stage (3: the parameters sharded too, gathered a "
         "bucket at a time; the next gather behind the compute with overlap on)", 0, 3},
        {"hw-file", CLI_STR, &hw_file, "--step: this machine's profile, for the simulated steps",
         0, 0},
        {"trace", CLI_STR, &trace_path, "--step: the last timed overlapped step's timeline as "
         "Chrome trace JSON here (and an SVG at FILE.svg)", 0, 0},
    };
    int nopts = (int)(sizeof opts / sizeof opts[0]);
    const char *pos[1];
    if ((s = cli_parse(argc, argv, opts, nopts, pos, 0, &npos)) != 0) {
        cli_usage(s == 1 ? stdout : stderr,
                  "usage: mpirun -n N bench_overlap_mpi [--mb X] [--reps N] [--slices N]\n"
                  "       mpirun -n N bench_overlap_mpi --step [--preset S] [--layers N] ...",
                  opts, nopts);
        return s == 1 ? 0 : 2;
    }
    if (pt_comm_mpi_init(&w, &argc, &argv) != PT_OK) {
        fprintf(stderr, "%s\n", pt_last_error());
        return 1;
    }
    if (step) {
        r = step_bench(&w, preset, layers, vocab, B, T, steps, zero, bucket_mb, hw_file, trace_path);
        pt_comm_free(&w);
        pt_comm_mpi_finalize();
        return r;
    }
    n = (size_t)(mb * 1048576.0 / sizeof(float));
    x = (float *)malloc(n * sizeof(float));
    y = (float *)malloc(n * sizeof(float));
    if (!x || !y || pt_ctx_init(&g_ctx, NULL) != PT_OK) {
        fprintf(stderr, "bench_overlap: out of memory\n");
        return 1;
    }
    for (i = 0; i < GEMM * GEMM; i++) g_a[i] = g_b[i] = (float)(i % 7) * 0.01f;
    /* the check: a started all-reduce gives the blocking one's bits */
    fill(x, n, w.rank, 0);
    memcpy(y, x, n * sizeof(float));
    if (pt_comm_all_reduce(&w, y, n, PT_REDUCE_AVG) != PT_OK ||
        overlapped(&w, x, n, 1, 1, 1, &st) < 0 || st != PT_OK || memcmp(x, y, n * sizeof(float))) {
        fprintf(stderr, "rank %d: the started all-reduce differs from the blocking one (%s)\n",
                w.rank, st != PT_OK ? pt_last_error() : "bits");
        return 1;
    }
    /* calibrate: compute units lasting about one blocking all-reduce */
    for (r = 0; r < 3; r++) {
        pt_comm_barrier(&w);
        t0 = pt_time_now();
        pt_comm_all_reduce(&w, y, n, PT_REDUCE_AVG);
        tc[r] = pt_time_now() - t0;
        t0 = pt_time_now();
        compute(200);
        tp[r] = (pt_time_now() - t0) / 200;
    }
    c = cli_median(tc, 3), p = cli_median(tp, 3);
    cal = (float)(c / p);
    pt_comm_broadcast(&w, &cal, 1, 0);
    units = (long)cal > 1 ? (long)cal : 1;
    for (r = 0; r < reps; r++) {
        fill(x, n, w.rank, r);
        pt_comm_barrier(&w);
        t0 = pt_time_now();
        pt_comm_all_reduce(&w, x, n, PT_REDUCE_AVG);
        tc[r] = pt_time_now() - t0;
        pt_comm_barrier(&w);
        t0 = pt_time_now();
        compute(units);
        tp[r] = pt_time_now() - t0;
        tn[r] = overlapped(&w, x, n, units, 1, 0, &st);
        tt[r] = st == PT_OK ? overlapped(&w, x, n, units, slices, 1, &st) : 0;
        if (st != PT_OK) {
            fprintf(stderr, "rank %d: %s\n", w.rank, pt_last_error());
            return 1;
        }
    }
    c = cli_median(tc, reps), p = cli_median(tp, reps), none = cli_median(tn, reps), test = cli_median(tt, reps);
    if (w.rank == 0) {
        printf("all-reduce of %.1f MiB over %d ranks, compute %ld x sgemm %d^3 in %d slices, "
               "median of %d\n",
               mb, w.size, units, GEMM, slices, reps);
        printf("  comm %.1f ms  compute %.1f ms  limit max(comm, compute) %.1f ms\n", c * 1e3,
               p * 1e3, (c > p ? c : p) * 1e3);
        printf("  none: %7.1f ms  exposed %6.1f ms = %.2f of comm\n", none * 1e3, (none - p) * 1e3,
               (none - p) / c);
        printf("  test: %7.1f ms  exposed %6.1f ms = %.2f of comm\n", test * 1e3, (test - p) * 1e3,
               (test - p) / c);
    }
    free(x);
    free(y);
    pt_ctx_free(&g_ctx);
    pt_comm_free(&w);
    pt_comm_mpi_finalize();
    return 0;
}

#else

int main(void) {
    fprintf(stderr, "bench_overlap measures MPI progress: build it with -DPTRAIN_MPI (make "
                    "build/bench_overlap_mpi)\n");
    return 2;
}

#endif
