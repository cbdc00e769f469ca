/* sim_vs_real: a small run on this machine, measured and simulated, side by side.

     build/sim_vs_real [--tp 1] [--dp 1] [--pp 2] [--schedule 1f1b] [--micro 1]
                       [--chunks 1] [--recompute none] [--zero 0] [--sp] [--cp 1] [--layers 4]
                       [--embd 256]
                       [--heads 4] [--seq 128] [--vocab 1024] [--batch 8]
                       [--steps 4] [--hw-file build/hw-local.txt] [--precision fp32]
     build/sim_vs_real --all        every layout of the table below (make bench)

   It trains a GPT for --steps steps on tp x cp x dp x pp thread ranks and takes
   the median step time (forward and backward of every micro-batch,
   gradient clipping, AdamW, all ranks done); then builds the same layout in
   the simulator (pt_plan_simulate: meta models, the same schedule, this
   machine's calibrated profile, measured first when the file is missing)
   and prints both and their ratio. With more ranks than cores the ranks
   share the cores; the simulator charges that as each rank getting
   cores/ranks of the machine. --precision bf16 trains with bf16 GEMMs and
   simulates with a profile measured at bf16 (build/hw-local-bf16.txt). */
#define _POSIX_C_SOURCE 200809L /* setenv, execv (cli.h), access */
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"
#include "../common/cli.h"

typedef struct layout {
    int tp, dp, pp, micro, chunks, recompute;
    const char *schedule;
    int zero, sp; /* ZeRO stage; sequence parallelism (tp >= 2) */
    int cp;       /* context parallelism (0: none): ranks sharing each sequence */
} layout;

typedef struct run {
    const layout *l;
    int layers, embd, heads, seq, vocab, batch, steps;
    int sp; /* --sp: sequence parallelism where a layout has tp >= 2 */
    pt_precision precision;
    double seconds; /* median step, rank 0 */
} run;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The model and its layout as both sides take it: the executor (with its
   grid and micro-batches a step) and the simulator (pt_plan_desc.model). */
static pt_status model_desc(const run *r, pt_gpt_desc *d) {
    const layout *l = r->l;
    memset(d, 0, sizeof *d);
    d->config.n_layer = r->layers, d->config.n_embd = r->embd, d->config.n_head = r->heads;
    d->config.vocab_size = r->vocab, d->config.block_size = r->seq;
    d->batch = l->micro, d->seq = r->seq;
    d->chunks = l->chunks, d->recompute = l->recompute, d->precision = r->precision;
    d->sequence_parallel = (r->sp || l->sp) && l->tp > 1;
    d->zero = l->zero;
    d->context_parallel = l->cp > 1 ? l->cp : 0;
    return pt_schedule_kind_parse(l->schedule, &d->schedule);
}

/* The layout checked before anything is calibrated or trained: rank 0's meta
   build on a grid of sizes alone (the library's refusals, by name: a --seq
   that 2cp does not divide, a tp that does not divide the heads, ...). */
static pt_status layout_check(const run *r) {
    const layout *l = r->l;
    pt_grid g;
    pt_gpt m;
    pt_gpt_desc d;
    pt_status st;
    memset(&g, 0, sizeof g);
    g.tp = l->tp, g.cp = l->cp > 1 ? l->cp : 1, g.dp = l->dp, g.pp = l->pp;
    if ((st = model_desc(r, &d)) != PT_OK) return st;
    d.grid = &g, d.meta = 1, d.grad_accum = r->batch / (l->dp * l->micro);
    if ((st = pt_gpt_init(&m, &d)) == PT_OK) pt_gpt_free(&m);
    return st;
}

static pt_status rank_main(pt_comm *world, void *arg) {
    run *r = (run *)arg;
    const layout *l = r->l;
    pt_grid grid;
    pt_gpt gpt;
    pt_gpt_desc d;
    pt_step_desc sd;
    pt_adamw_config opt = pt_adamw_default();
    int m = r->batch / (l->dp * l->micro), rows = r->batch / l->dp, n = rows * r->seq, s;
    int cp = l->cp > 1 ? l->cp : 1;
    int *x = NULL, *y = NULL;
    double t[32];
    pt_status st;
    memset(&gpt, 0, sizeof gpt);
    if ((st = pt_grid_init_cp(&grid, world, l->tp, cp, l->dp, l->pp)) != PT_OK) return st;
    if ((st = model_desc(r, &d)) != PT_OK) goto out;
    d.grid = &grid, d.grad_accum = m;
    if ((st = pt_gpt_init(&gpt, &d)) != PT_OK) goto out;
    pt_gpt_init_weights(&gpt, 1);
    if (!cli_random_batch(n, r->vocab, 5, &x, &y)) {
        st = pt_comm_fail(world, pt_error(PT_ERR_OOM, "out of memory"));
        goto out;
    }
    memset(&sd, 0, sizeof sd);
    sd.inputs = x, sd.targets = y, sd.B = rows, sd.T = r->seq;
    sd.adamw = &opt, sd.lr = 1e-4f, sd.clip = 1.0f;
    for (s = 0; s <= r->steps && st == PT_OK; s++) { /* step 0 warms up */
        double t0;
        if ((st = pt_comm_barrier(world)) != PT_OK) break;
        t0 = pt_time_now();
        if ((st = pt_gpt_step(&gpt, &sd, NULL)) != PT_OK) break;
        if ((st = pt_comm_barrier(world)) != PT_OK) break;
        if (s > 0) t[s - 1] = pt_time_now() - t0;
    }
    if (st == PT_OK && world->rank == 0) {
        qsort(t, (size_t)r->steps, sizeof(double), cmp_double);
        r->seconds = t[r->steps / 2];
    }
out:
    if (st != PT_OK && st != PT_ERR_COMM) st = pt_comm_fail(world, st);
    free(x), free(y);
    pt_gpt_free(&gpt);
    pt_grid_free(&grid);
    return st;
}

/* Trains and simulates one layout; prints its line; the ratio simulated/real. */
static double compare(run *r, const pt_hw *hw) {
    static const char *rcn[] = {"none", "selective", "full"};
    const layout *l = r->l;
    pt_plan_desc d;
    pt_plan_result res;
    int cp = l->cp > 1 ? l->cp : 1, world = l->tp * cp * l->dp * l->pp;
    r->seconds = 0;
    if (pt_comm_threads_run(world, rank_main, r) != PT_OK) return -1;
    memset(&d, 0, sizeof d);
    if (model_desc(r, &d.model) != PT_OK) return -1; /* (its precision: the profile's) */
    d.tp = l->tp, d.pp = l->pp, d.cp = cp, d.gpus = world, d.batch = r->batch;
    d.exec = PT_EXEC_PTRAIN;
    if (pt_plan_simulate(&d, hw, &res, NULL) != PT_OK) return -1;
    printf("  %2d %2d %2d  %2d  %d  %-11s  %-9s  %d  %-3s %2d  %8.1f  %13.1f   %6.2f%s\n", l->tp,
           l->dp, l->pp, l->micro, l->chunks, l->schedule, rcn[l->recompute], l->zero,
           d.model.sequence_parallel ? "sp" : "-", cp, r->seconds * 1e3,
           res.step_time * 1e3, res.step_time / r->seconds,
           world > hw->cores ? "  (ranks > cores)" : "");
    return res.step_time / r->seconds;
}

int main(int argc, char **argv) {
    static const layout layouts[] = {
        {1, 1, 1, 8, 1, 0, "1f1b", 0, 0, 0},         {1, 1, 1, 2, 1, 0, "1f1b", 0, 0, 0},
        {1, 1, 1, 8, 1, 2, "1f1b", 0, 0, 0},         {2, 1, 1, 8, 1, 0, "1f1b", 0, 0, 0},
        {1, 2, 1, 4, 1, 0, "1f1b", 0, 0, 0},         {2, 2, 1, 2, 1, 0, "1f1b", 0, 0, 0},
        {4, 1, 1, 8, 1, 0, "1f1b", 0, 0, 0},         {1, 4, 1, 2, 1, 0, "1f1b", 0, 0, 0},
        {1, 1, 2, 1, 1, 0, "gpipe", 0, 0, 0},        {1, 1, 2, 1, 1, 0, "1f1b", 0, 0, 0},
        {1, 1, 2, 1, 2, 0, "interleaved", 0, 0, 0},  {1, 1, 2, 1, 1, 0, "zb-h1", 0, 0, 0},
        {1, 1, 2, 1, 1, 1, "1f1b", 0, 0, 0},         {1, 1, 4, 1, 1, 0, "1f1b", 0, 0, 0},
        {2, 1, 2, 2, 1, 0, "1f1b", 0, 0, 0},         {1, 2, 2, 1, 1, 0, "1f1b", 0, 0, 0},
        {1, 1, 2, 1, 1, 0, "zb-h2", 0, 0, 0},        {1, 1, 2, 1, 2, 0, "zb-v", 0, 0, 0},
        {1, 1, 2, 1, 2, 0, "chimera", 0, 0, 0},      {1, 1, 4, 1, 2, 0, "chimera", 0, 0, 0},
        {1, 1, 2, 1, 1, 0, "2bw", 0, 0, 0},          {2, 1, 1, 8, 1, 0, "1f1b", 0, 1, 0},
        {1, 2, 1, 4, 1, 0, "1f1b", 3, 0, 0},         {1, 1, 1, 8, 1, 0, "1f1b", 0, 0, 2},
        {2, 1, 1, 8, 1, 0, "1f1b", 0, 1, 2},
    };
    const char *hw_file = NULL, *pos[1], *rc = "none", *prec = "fp32";
    layout one = {1, 1, 2, 1, 1, 0, "1f1b", 0, 0, 1};
    run r;
    int npos, s, i, nl = (int)(sizeof layouts / sizeof *layouts), within = 0, all = 0;
    double worst = 0.0, ratio;
    pt_hw hw;
    cli_opt opts[] = {
        {"tp", CLI_INT, &one.tp, "tensor-parallel ranks", 1, 8},
        {"dp", CLI_INT, &one.dp, "data-parallel ranks", 1, 8},
        {"pp", CLI_INT, &one.pp, "pipeline stages", 1, 8},
        {"schedule", CLI_STR, &one.schedule, "gpipe, 1f1b, interleaved, zb-h1, zb-h2, zb-v, chimera, 2bw",
         0, 0},
        {"micro", CLI_INT, &one.micro, "micro-batch (sequences)", 1, 4096},
        {"chunks", CLI_INT, &one.chunks, "chunks a stage (interleaved; zb-v, chimera: 2)", 1, 8},
        {"recompute", CLI_STR, &rc, "none, selective or full", 0, 0},
        {"zero", CLI_INT, &one.zero, "ZeRO stage over the dp ranks (3: the parameters sharded, "
         "gathered a bucket at a time; one pipeline stage)", 0, 3},
        {"cp", CLI_INT, &one.cp, "context-parallel ranks: each holds 2 chunks of --seq/(2cp) "
         "tokens, attention a ring (--seq a multiple of 2cp)", 1, 8},
        {"sp", CLI_FLAG, &r.sp, "sequence parallelism over the tp ranks (with --all: the "
         "layouts with tp >= 2)", 0, 0},
        {"all", CLI_FLAG, &all, "every layout of the built-in table", 0, 0},
        {"layers", CLI_INT, &r.layers, "blocks", 1, 64},
        {"embd", CLI_INT, &r.embd, "width C", 16, 4096},
        {"heads", CLI_INT, &r.heads, "attention heads", 1, 64},
        {"seq", CLI_INT, &r.seq, "sequence length T", 1, 4096},
        {"vocab", CLI_INT, &r.vocab, "vocabulary", 2, 1 << 20},
        {"batch", CLI_INT, &r.batch, "sequences a step, over all dp ranks", 1, 4096},
        {"steps", CLI_INT, &r.steps, "timed steps (median)", 1, 32},
        {"hw-file", CLI_STR, &hw_file, "this machine's profile (calibrated when missing; "
         "default build/hw-local.txt, build/hw-local-bf16.txt for bf16)", 0, 0},
        {"precision", CLI_STR, &prec, "fp32 | bf16: the GEMMs' precision, real and simulated", 0,
         0},
    };
    int nopts = (int)(sizeof opts / sizeof opts[0]);
    r.layers = 4, r.embd = 256, r.heads = 4, r.seq = 128, r.vocab = 1024, r.batch = 8, r.steps = 4;
    r.sp = 0;
    cli_passive_wait(argv);
    if ((s = cli_parse(argc, argv, opts, nopts, pos, 0, &npos)) != 0) {
        cli_usage(s == 1 ? stdout : stderr, "usage: sim_vs_real [options]", opts, nopts);
        return s == 1 ? 0 : 2;
    }
    if ((one.recompute = cli_recompute(rc)) < 0) return 2;
    if (r.sp && !all && one.tp < 2) {
        fprintf(stderr, "error: --sp splits the sequence over the tensor-parallel ranks: it "
                "needs --tp >= 2 (--tp %d given)\n", one.tp);
        return 2;
    }
    if (pt_precision_parse(prec, &r.precision) != PT_OK) {
        fprintf(stderr, "error: --precision: %s\n", pt_last_error());
        return 2;
    }
    if (!hw_file)
        hw_file = r.precision == PT_PRECISION_BF16 ? "build/hw-local-bf16.txt" : "build/hw-local.txt";
    if ((strcmp(one.schedule, "zb-v") == 0 || strcmp(one.schedule, "chimera") == 0) &&
        one.chunks == 1)
        one.chunks = 2; /* its V, its two replicas */
    for (i = 0; i < (all ? nl : 1); i++) { /* every layout must divide the batch and build */
        const layout *l = r.l = all ? &layouts[i] : &one;
        if (r.batch % (l->dp * l->micro)) {
            fprintf(stderr, "error: --batch %d is not divisible by dp x micro = %d x %d\n", r.batch,
                    l->dp, l->micro);
            return 2;
        }
        if (layout_check(&r) != PT_OK) {
            fprintf(stderr, "error: %s\n", pt_last_error());
            return 2;
        }
    }
    if (pt_hw_load(hw_file, &hw) != PT_OK) {
        /* calibrated into a new file, or over one that is a profile already
           (pt_hw_save's first line): never over anything else */
        FILE *f = fopen(hw_file, "r");
        char first[64] = "";
        if (f) {
            if (!fgets(first, sizeof first, f)) first[0] = 0;
            fclose(f);
            if (strncmp(first, "# ptrain hardware profile", 25) != 0) {
                fprintf(stderr, "error: --hw-file %s exists and is not a hardware profile: left "
                        "as it is; name a new file (or a profile) to calibrate into\n", hw_file);
                return 1;
            }
        }
        printf("calibrating this machine into %s\n", hw_file);
        if (pt_hw_calibrate(&hw, NULL, r.precision) != PT_OK || pt_hw_save(&hw, hw_file) != PT_OK) {
            fprintf(stderr, "error: %s\n", pt_last_error());
            return 1;
        }
    }
    if ((hw.precision == PT_PRECISION_BF16) != (r.precision == PT_PRECISION_BF16)) {
        fprintf(stderr, "error: %s was measured at %s, not --precision %s: name another "
                "--hw-file (calibrated when missing)\n", hw_file, pt_precision_name(hw.precision),
                pt_precision_name(r.precision));
        return 2;
    }
    printf("model: %d layers, C=%d, %d heads, T=%d, V=%d, batch %d, %s GEMMs; profile: GEMM "
           "%.1f GFLOP/s, %.1f GB/s, %d cores\n",
           r.layers, r.embd, r.heads, r.seq, r.vocab, r.batch, pt_precision_name(r.precision),
           hw.peak_flops / 1e9, hw.mem_bw / 1e9, hw.cores);
    printf("  tp dp pp  mb  v  schedule     recompute  z  sp  cp    real ms   simulated ms   "
           "sim/real\n");
    for (i = 0; i < (all ? nl : 1); i++) {
        r.l = all ? &layouts[i] : &one;
        if ((ratio = compare(&r, &hw)) < 0) {
            fprintf(stderr, "error: %s\n", pt_last_error());
            return 1;
        }
        within += ratio > 0.8 && ratio < 1.2;
        if (fabs(ratio - 1) > worst) worst = fabs(ratio - 1);
    }
    printf("%d of %d within 20%%; worst %.0f%% off\n", within, all ? nl : 1, 100 * worst);
    return 0;
}
