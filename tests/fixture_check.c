/* fixture_check: runs a ptrain-fixture-v1 file's protocol (the fixtures'
   README, section 3.4) and compares every quantity with its tolerance, in any
   tensor x data parallel layout.

     build/fixture_check FILE [--tp N [--sp]] [--cp N] [--dp N] [--zero S] [--threads N]
                         [--verbose]
     mpirun -np N build/fixture_check_mpi FILE --tp A --dp B     (N = A*B)

   With --tp/--dp the ranks are threads of this process (fixture_check) or
   MPI processes (fixture_check_mpi); dp ranks split the fixture's batch, cp
   ranks its sequences (context parallelism: every quantity but the logits,
   which a cp step does not return, is checked).
   Logits, gradients and final weights are gathered to their whole Hugging
   Face layout and checked with the same tolerances as a serial run.
   Prints one line per quantity (worst error, tolerance, PASS/FAIL) and exits
   0 only if all pass; 1 on a mismatch, 2 if the file or layout cannot be used.

   --schedule 2bw (PipeDream-2BW, asynchronous by design) is checked against
   a serial run of its own update rule instead of the fixture's synchronous
   steps (reference_2bw below): the same losses and final weights. */
#define _POSIX_C_SOURCE 200809L /* setenv, execv (cli_passive_wait) */
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"
#include "../common/cli.h"
#include "fixture.h"

#include <math.h>

typedef struct check {
    int failed, total, verbose;
} check;

/* One reported quantity: worst |a-r| and the tolerance at that element;
   ratio = max over elements of |a-r| / tol (NaN counts as failure). */
static void report(check *c, const char *what, double worst_err, double tol_at, double ratio,
                   int force_print) {
    int ok = ratio <= 1.0; /* false for NaN */
    c->total++;
    if (!ok) c->failed++;
    if (!ok || force_print || c->verbose)
        printf("  %-40s max_err %.3e  tol %.3e  %s\n", what, worst_err, tol_at, ok ? "PASS" : "FAIL");
}

/* |a-r| <= atol + rtol*|r| elementwise */
static void compare_elem(check *c, const char *what, const float *a, const float *r, size_t n,
                         double atol, double rtol, int print) {
    double worst = 0.0, tol_at = atol, ratio = 0.0;
    size_t i;
    for (i = 0; i < n; i++) {
        double err = fabs((double)a[i] - (double)r[i]), tol = atol + rtol * fabs((double)r[i]);
        double q = err / tol;
        if (!(q <= ratio)) { /* also catches NaN */
            ratio = q != q ? INFINITY : q;
            worst = err != err ? INFINITY : err;
            tol_at = tol;
        }
    }
    report(c, what, worst, tol_at, ratio, print);
}

/* per tensor: max|a-r| <= rel * max|r| (if max|r| == 0: |a| <= 1e-12) */
static void compare_grad(check *c, const char *what, const float *a, const float *r, size_t n,
                         double rel) {
    double maxr = 0.0, worst = 0.0, tol;
    size_t i;
    for (i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)r[i]);
        if (fabs((double)r[i]) > maxr) maxr = fabs((double)r[i]);
        if (!(e <= worst)) worst = e != e ? INFINITY : e;
    }
    tol = maxr > 0.0 ? rel * maxr : 1e-12;
    report(c, what, worst, tol, worst / tol, 0);
}

/* Tolerances. fp32: the fixtures' README, section 5. bf16 (every GEMM's
   operands rounded to bfloat16, unit roundoff u = 2^-8, sums in fp32), derived
   from the rounding, not from runs:
   - One GEMM output y = sum_k a_k b_k becomes sum_k a_k b_k (1 + t_k) with
     t_k = da_k + db_k the operands' relative rounding errors, each uniform on
     [-u, u] (variance u^2/3), independent: var(y error) = (2u^2/3) sum_k (a_k b_k)^2,
     i.e. a relative error of sd u sqrt(2/3) against the output's scale for
     terms of either sign, whatever the reduction length K.
   - Errors of G GEMMs in series add in quadrature: sd s(G) = u sqrt(2G/3).
     Forward to the logits: G_f = 8L + 1 (per block: the q/k/v projection,
     Q K^T, P V, the output projection, the MLP's two; then the head; and
     the two activations a block keeps in bf16 that a non-GEMM reads, q/k/v
     (attention's scale) and fch (the MLP's activation), each one rounding,
     counted as a GEMM's two: an upper bound; ln1 and ln2 are GEMM operands
     only, rounded as the GEMMs round them).
     A gradient: forward, back down through at most as many, and its own:
     G_b = 2 G_f + 1.
   - Checked at z = 6 standard deviations of the tensor's scale max|r| (the
     largest of 10^6 normal deviates passes 6 sd with probability 0.2%): logits
     elementwise within z s(G_f) max|logits|; gradients per tensor within
     z s(G_b) max|r|, the form of the fp32 check.
   - The loss is a mean of -log softmax: per token |d loss| <= ||p - onehot||_1
     max|d logit| <= 2 max|d logit|, and the tokens share the rounded weights
     (no averaging out): within 2 z s(G_f) max|logits|. Later steps: the same,
     assuming the runs' weights drift less than that moves the loss (on the
     fixtures here lr * steps <= 0.02).
   - Final weights: both runs take AdamW steps, each at most
     lr |m^/sqrt(v^)| <= lr A_t per element, with (Cauchy-Schwarz over the past
     gradients) A_t = (1-b1) sqrt(sum_j<t b1^2j) / (1 - b1^t) *
     sqrt(1 - b2^t) / sqrt((1 - b2) b2^(t-1)); so |a - r| <= 2 lr sum_t A_t,
     the bound the optimizer allows, not a sharp one (the logits, loss and
     gradients are). */
typedef struct tolerances {
    double logits_rel, loss_rel, grad_rel; /* bf16: times max|logits|, and per tensor */
    double final_abs;
} tolerances;

static tolerances bf16_tolerances(const fixture *f) {
    const double u = 0x1p-8, z = 6.0;
    double gf = 8.0 * f->cfg.n_layer + 1.0, gb = 2.0 * gf + 1.0, sum = 0.0;
    double b1 = f->opt.beta1, b2 = f->opt.beta2;
    tolerances t;
    int s, j;
    t.logits_rel = z * u * sqrt(2.0 * gf / 3.0);
    t.loss_rel = 2.0 * t.logits_rel;
    t.grad_rel = z * u * sqrt(2.0 * gb / 3.0);
    for (s = 1; s <= f->steps; s++) {
        double geo = 0.0;
        for (j = 0; j < s; j++) geo += pow(b1, 2.0 * j);
        sum += (1.0 - b1) * sqrt(geo) / (1.0 - pow(b1, s)) * sqrt(1.0 - pow(b2, s)) /
               sqrt((1.0 - b2) * pow(b2, s - 1));
    }
    t.final_abs = 2.0 * f->lr * sum;
    return t;
}

static double max_abs(const float *x, size_t n) {
    double m = 0.0;
    size_t i;
    for (i = 0; i < n; i++)
        if (fabs((double)x[i]) > m) m = fabs((double)x[i]);
    return m;
}

/* What every rank needs: the fixture (read-only), its settings, the layout. */
typedef struct job {
    const char *path;
    fixture f;
    int tp, dp, pp, zero, micro, chunks, recompute, verbose, sp, cp;
    pt_schedule_kind schedule;
    pt_precision precision;
    int failed; /* checks failed over all ranks (set by world rank 0) */
    float *ref_losses, *ref_final; /* 2bw: the serial run of its rule (steps; whole model) */
    float *sync_final;             /* 2bw: the same run without staleness (a control) */
} job;

/* PipeDream-2BW's rule, serially, on the fixture's data as the layout splits
   it: each dp rank's B/dp rows are m micro-batches; batch k of a step is
   micro-batches kp..kp+p-1 of every dp rank, its gradient their mean; the
   step starts from one version V0 (the pipeline flushes between steps) and
   batch k runs at version max(k-1, 0) with V(k+1) = AdamW(V(k), grad f_k).
   stale = 0 runs every batch at the newest version (synchronous, a control).
   Losses: each step's mean over its micro-batches. */
static int reference_2bw(const job *j, int stale, float *losses, float *final) {
    pt_gpt g;
    pt_gpt_desc d;
    int p = j->pp, m = j->micro, Bl = j->f.B / j->dp, b = Bl / m, s, k, r, i, ok = 0;
    size_t P;
    float *cur = NULL, *prev = NULL;
    memset(&d, 0, sizeof d);
    d.config = j->f.cfg, d.batch = b, d.seq = j->f.T, d.grad_accum = p * j->dp;
    d.precision = j->precision; /* bf16 rounds the same operands in every layout */
    if (pt_gpt_init(&g, &d) != PT_OK || pt_gpt_load_weights_st(&g, j->f.st) != PT_OK) goto out;
    P = g.num_params;
    if (!(cur = (float *)malloc(P * sizeof(float))) || !(prev = (float *)malloc(P * sizeof(float))))
        goto out;
    for (s = 0; s < j->f.steps; s++) {
        double sum = 0.0;
        memcpy(cur, g.params, P * sizeof(float));
        memcpy(prev, cur, P * sizeof(float));
        for (k = 0; k < m / p; k++) {
            memcpy(g.params, k == 0 || !stale ? cur : prev, P * sizeof(float));
            for (r = 0; r < j->dp; r++)
                for (i = k * p; i < (k + 1) * p; i++) {
                    size_t at = ((size_t)r * Bl + (size_t)i * b) * (size_t)j->f.T;
                    if (pt_gpt_forward(&g, j->f.inputs + at, j->f.targets + at, b, j->f.T) != PT_OK ||
                        pt_gpt_backward(&g) != PT_OK)
                        goto out;
                    sum += g.loss;
                }
            memcpy(g.params, cur, P * sizeof(float));
            if (pt_gpt_adamw_step(&g, &j->f.opt, (float)j->f.lr) != PT_OK) goto out;
            memcpy(prev, cur, P * sizeof(float));
            memcpy(cur, g.params, P * sizeof(float));
        }
        losses[s] = (float)(sum / ((double)m * j->dp));
    }
    ok = pt_gpt_gather(&g, PT_BUF_PARAMS, final) == PT_OK;
out:
    if (!ok) fprintf(stderr, "error: the 2bw reference: %s\n", pt_last_error());
    free(cur);
    free(prev);
    pt_gpt_free(&g);
    return ok;
}

#define RANK_FAIL(st)                                                                      \
    do {                                                                                   \
        status = (st);                                                                     \
        goto out;                                                                          \
    } while (0)

/* One rank's run of the protocol: its dp share of the batch, its tensor
   parts; whole tensors are gathered for the comparisons. World rank 0
   prints; the others print only failures. */
static pt_status run_rank(pt_comm *world, void *arg) {
    job *j = (job *)arg;
    pt_grid grid;
    pt_gpt gpt, whole;
    pt_gpt_desc desc;
    check c = {0, 0, 0};
    int Bl = j->f.B / j->dp, s, i, lead = world->rank == 0, grid_ok = 0;
    size_t N = (size_t)Bl * j->f.T, V = (size_t)j->f.cfg.vocab_size, rows0;
    float *ref = NULL, *mine = NULL, *losses = NULL, total;
    char label[128];
    pt_status status = PT_OK;
    int bf16 = j->precision == PT_PRECISION_BF16;
    tolerances tb = bf16_tolerances(&j->f);
    /* fp32 (README section 5) or bf16 (above, scaled once the logits are read) */
    double lg_atol = 5e-6, lg_rtol = 1e-5, ls_atol = 1e-5, ls_rtol = 5e-6, gr_rel = 2e-5;
    double fin_abs = bf16 ? tb.final_abs : 2.5e-4;
    memset(&gpt, 0, sizeof gpt);
    memset(&whole, 0, sizeof whole);
    c.verbose = lead && j->verbose;
    if ((status = pt_grid_init_cp(&grid, world, j->tp, j->cp, j->dp, j->pp)) != PT_OK)
        return status;
    grid_ok = 1;
    memset(&desc, 0, sizeof desc);
    desc.config = j->f.cfg;
    desc.batch = Bl / j->micro; /* micro-batch rows */
    desc.seq = j->f.T;
    desc.grid = &grid;
    desc.zero = j->zero;
    desc.grad_accum = j->micro;
    desc.schedule = j->schedule;
    desc.chunks = j->chunks;
    desc.recompute = j->recompute;
    desc.precision = j->precision;
    desc.sequence_parallel = j->sp;
    desc.context_parallel = j->cp;
    if ((status = pt_gpt_init(&gpt, &desc)) != PT_OK ||
        (status = pt_gpt_load_weights_st(&gpt, j->f.st)) != PT_OK)
        goto out;
    if (j->schedule == PT_SCHED_2BW) { /* against its rule's serial run */
        size_t n = gpt.num_params_full;
        float *fin = (float *)malloc(n * sizeof(float));
        losses = (float *)malloc((size_t)j->f.steps * sizeof(float));
        if (!fin || !losses) {
            free(fin);
            RANK_FAIL(pt_comm_fail(world, PT_ERR_OOM));
        }
        for (s = 0; s < j->f.steps && status == PT_OK; s++) {
            pt_step_desc sd;
            memset(&sd, 0, sizeof sd);
            sd.inputs = j->f.inputs + (size_t)grid.dp_rank * N;
            sd.targets = j->f.targets + (size_t)grid.dp_rank * N, sd.B = Bl, sd.T = j->f.T;
            sd.adamw = &j->f.opt, sd.lr = (float)j->f.lr;
            if ((status = pt_gpt_step(&gpt, &sd, NULL)) == PT_OK) losses[s] = gpt.loss;
        }
        if (status == PT_OK) status = pt_gpt_gather(&gpt, PT_BUF_PARAMS, fin);
        if (status != PT_OK) {
            free(fin);
            goto out;
        }
        compare_elem(&c, "2bw losses (every step) vs its rule, serial", losses, j->ref_losses,
                     (size_t)j->f.steps, ls_atol, ls_rtol, lead);
        compare_elem(&c, "2bw final params vs its rule, serial", fin, j->ref_final, n, fin_abs,
                     0.0, lead);
        if (lead) { /* how far staleness moves the weights: the check can see it */
            double far = 0.0;
            size_t q;
            for (q = 0; q < n; q++)
                if (fabs((double)j->sync_final[q] - j->ref_final[q]) > far)
                    far = fabs((double)j->sync_final[q] - j->ref_final[q]);
            printf("  (the synchronous rule's final params differ from 2bw's by up to %.3e)\n",
                   far);
        }
        { /* two weight versions a stage: twice the parameters' bytes */
            float have = (float)gpt.mem.params, want = (float)(2 * gpt.num_params * sizeof(float));
            compare_elem(&c, "2bw weight versions' bytes (2 x params)", &have, &want, 1, 0.5, 0.0,
                         lead);
        }
        free(fin);
        goto tally;
    }
    { /* the whole model's table (a meta model: no memory) names every tensor */
        pt_gpt_desc wd;
        memset(&wd, 0, sizeof wd);
        wd.config = j->f.cfg, wd.batch = 1, wd.seq = 1, wd.meta = 1;
        if ((status = pt_gpt_init(&whole, &wd)) != PT_OK) goto out;
    }
    rows0 = (size_t)grid.dp_rank * N; /* this rank's rows of the batch */
    {
        /* ref holds the whole batch's logits, mine this rank's rows */
        size_t all = (size_t)j->f.B * j->f.T * V;
        size_t most = all > gpt.num_params_full ? all : gpt.num_params_full;
        ref = (float *)malloc(most * sizeof(float));
        mine = (float *)malloc(most * sizeof(float));
        losses = (float *)malloc((size_t)j->f.steps * sizeof(float));
        if (!ref || !mine || !losses) RANK_FAIL(pt_comm_fail(world, PT_ERR_OOM));
    }
    for (s = 0; s < j->f.steps; s++) {
        int64_t lshape[3] = {j->f.B, j->f.T, j->f.cfg.vocab_size}, one[1] = {1};
        float loss_ref;
        pt_step_desc sd;
        if (s == 0 && ((status = pt_st_read_f32(j->f.st, "fixture.logits", ref, 3, lshape)) != PT_OK ||
                       (status = pt_st_read_f32(j->f.st, "fixture.loss", &loss_ref, 1, one)) != PT_OK))
            goto out;
        if (s == 0 && bf16) {
            double scale = max_abs(ref, (size_t)j->f.B * j->f.T * V);
            lg_atol = tb.logits_rel * scale, lg_rtol = 0.0;
            ls_atol = tb.loss_rel * scale, ls_rtol = 0.0, gr_rel = tb.grad_rel;
        }
        /* the whole step through this rank's schedule; the head's ranks get the logits */
        memset(&sd, 0, sizeof sd);
        sd.inputs = j->f.inputs + rows0, sd.targets = j->f.targets + rows0, sd.B = Bl, sd.T = j->f.T;
        sd.logits = s == 0 && gpt.place.has_head && j->cp == 1 ? mine : NULL;
        if ((status = pt_gpt_step(&gpt, &sd, NULL)) != PT_OK) goto out;
        losses[s] = gpt.loss;
        if (sd.logits)
            compare_elem(&c, "logits", mine, ref + rows0 * V, N * V, lg_atol, lg_rtol, lead);
        if (s == 0) {
            int fails_before;
            compare_elem(&c, "loss", &losses[0], &loss_ref, 1, ls_atol, ls_rtol, lead);
            if ((status = pt_gpt_gather(&gpt, PT_BUF_GRADS, mine)) != PT_OK) goto out;
            fails_before = c.failed;
            for (i = 0; i < whole.num_tensors; i++) { /* every tensor, whichever stage has it */
                const pt_param *p = &whole.table[i];
                snprintf(label, sizeof label, "fixture.grad.%s", p->name);
                if ((status = pt_st_read_f32(j->f.st, label, ref, p->ndim, p->full_shape)) != PT_OK)
                    goto out;
                snprintf(label, sizeof label, "grad %s", p->name);
                compare_grad(&c, label, mine + p->full_offset, ref, p->full_numel, gr_rel);
            }
            if (lead)
                printf("  grads (per tensor, %.3g * max|ref|)%*s %d tensors  %s\n", gr_rel,
                       bf16 ? 8 : 7, "", whole.num_tensors, c.failed == fails_before ? "PASS" : "FAIL");
        }
        if ((status = pt_gpt_adamw_step(&gpt, &j->f.opt, (float)j->f.lr)) != PT_OK) goto out;
    }
    {
        int64_t ns[1] = {j->f.steps};
        double worst = 0.0;
        const char *worst_name = whole.table[0].name;
        int fails_before;
        if ((status = pt_st_read_f32(j->f.st, "fixture.losses", ref, 1, ns)) != PT_OK) goto out;
        compare_elem(&c, "losses (every step)", losses, ref, (size_t)j->f.steps, ls_atol, ls_rtol,
                     lead);
        fails_before = c.failed;
        if ((status = pt_gpt_gather(&gpt, PT_BUF_PARAMS, mine)) != PT_OK) goto out;
        for (i = 0; i < whole.num_tensors; i++) {
            const pt_param *p = &whole.table[i];
            size_t k;
            snprintf(label, sizeof label, "fixture.final.%s", p->name);
            if ((status = pt_st_read_f32(j->f.st, label, ref, p->ndim, p->full_shape)) != PT_OK)
                goto out;
            for (k = 0; k < p->full_numel; k++) {
                double e = fabs((double)mine[p->full_offset + k] - (double)ref[k]);
                if (!(e <= worst)) {
                    worst = e != e ? INFINITY : e;
                    worst_name = p->name;
                }
            }
            snprintf(label, sizeof label, "final %s", p->name);
            compare_elem(&c, label, mine + p->full_offset, ref, p->full_numel, fin_abs, 0.0, 0);
        }
        if (lead)
            printf("  %-40s max_err %.3e  tol %.3e  %s (worst: %s)\n", "final params", worst,
                   fin_abs, c.failed == fails_before ? "PASS" : "FAIL", worst_name);
    }
    if (lead)
        printf("  per-rank memory (zero=%d): params %.2f MiB, grads %.2f MiB, AdamW %.2f MiB, "
               "activations %.2f MiB\n",
               j->zero, gpt.mem.params / 1048576.0, gpt.mem.grads / 1048576.0,
               gpt.mem.optimizer / 1048576.0, gpt.mem.activations / 1048576.0);
    { /* the slots the stage used at once = the checker's peak in flight */
        char what[96];
        float used = (float)gpt.mem.slots_peak, want = (float)gpt.mem.slots;
        snprintf(what, sizeof what, "stage %d activation slots used (checker: %d)", grid.pp_rank,
                 gpt.mem.slots);
        compare_elem(&c, what, &used, &want, 1, 0.5, 0.0, lead || grid.tp_rank + grid.dp_rank == 0);
    }
tally: /* every rank's failures count */
    total = (float)c.failed;
    if ((status = pt_comm_all_reduce(world, &total, 1, PT_REDUCE_SUM)) != PT_OK) goto out;
    if (lead) {
        j->failed = (int)total;
        printf("%s: %d of %d checks on rank 0 passed, %d failed on all %d ranks: %s\n", j->path,
               c.total - c.failed, c.total, (int)total, world->size, total ? "FAIL" : "PASS");
    }
out:
    if (status != PT_OK && status != PT_ERR_COMM) status = pt_comm_fail(world, status);
    free(ref);
    free(mine);
    free(losses);
    pt_gpt_free(&gpt);
    pt_gpt_free(&whole);
    if (grid_ok) pt_grid_free(&grid);
    return status;
}

int main(int argc, char **argv) {
    int threads = 0, verbose = 0, npos = 0, s, sp = 0, tp = 1, dp = 1, pp = 1, zero = 0, micro = 1, chunks = 0;
    int cp = 1;
    char cpname[24];
    const char *schedule = NULL, *recompute = "none", *precision = "fp32";
    const char *pos[1] = {NULL};
    cli_opt opts[] = {
        {"tp", CLI_INT, &tp, "tensor-parallel ranks (divides n_head and n_kv_head)", 1, 1024},
        {"sp", CLI_FLAG, &sp, "sequence parallelism over the tp ranks (tp >= 2, T % tp == 0)", 0,
         0},
        {"cp", CLI_INT, &cp, "context-parallel ranks (ring attention; 2cp divides T)", 1, 1024},
        {"dp", CLI_INT, &dp, "data-parallel ranks (divides the fixture's batch B)", 1, 1024},
        {"zero", CLI_INT, &zero, "ZeRO stage: 0, 1 (shard AdamW state), 2 (and gradients) or 3 "
         "(and parameters)", 0, 3},
        {"pp", CLI_INT, &pp, "pipeline stages (at most n_layer)", 1, 1024},
        {"schedule", CLI_STR, &schedule, "the step's schedule: gpipe, 1f1b, interleaved, zb-h1, "
         "zb-h2, zb-v, chimera, 2bw (default: 1f1b, interleaved with --chunks)", 0, 0},
        {"microbatches", CLI_INT, &micro, "micro-batches per step (divides B/dp)", 1, 4096},
        {"chunks", CLI_INT, &chunks, "layer chunks per stage (0: the schedule's, 2 for zb-v, "
         "else 1)", 0, 64},
        {"recompute", CLI_STR, &recompute, "activation recomputation: none, selective, full", 0,
         0},
        {"precision", CLI_STR, &precision, "the GEMMs' arithmetic: fp32 or bf16", 0, 0},
        {"threads", CLI_INT, &threads, "OpenMP/BLAS threads (0: all cores; one rank only)", 0,
         1024},
        {"verbose", CLI_FLAG, &verbose, "print every tensor's line", 0, 0},
    };
    int nopts = (int)(sizeof opts / sizeof opts[0]);
    const char *usage = "usage: fixture_check FILE [options]\n"
                        "Runs a ptrain-fixture-v1 file's protocol and checks every quantity.";
    pt_safetensors st;
    int rc = 2;
    job j;
    pt_status status;
    pt_comm world;
    if (!cli_world_begin(&world, &argc, &argv)) return 2;
    memset(&j, 0, sizeof j);
    memset(&st, 0, sizeof st);
    if ((s = cli_parse(argc, argv, opts, nopts, pos, 1, &npos)) != 0 || npos != 1) {
        cli_usage(s == 1 ? stdout : stderr, usage, opts, nopts);
        rc = s == 1 ? 0 : 2;
        goto out;
    }
    pt_set_threads(threads);
    if (pt_st_load(&st, pos[0]) != PT_OK) {
        fprintf(stderr, "error: %s\n", pt_last_error());
        goto out;
    }
    if (!fixture_read(&st, &j.f)) goto out;
    if (j.f.B % dp != 0 || j.f.cfg.n_head % tp != 0 || (j.f.B % dp == 0 && (j.f.B / dp) % micro)) {
        if (j.f.B % dp != 0)
            fprintf(stderr, "error: data_parallel=%d does not divide the fixture's batch B=%d\n",
                    dp, j.f.B);
        else if ((j.f.B / dp) % micro)
            fprintf(stderr, "error: microbatches=%d does not divide the %d rows of each "
                    "data-parallel rank (B=%d / dp=%d)\n", micro, j.f.B / dp, j.f.B, dp);
        if (j.f.cfg.n_head % tp != 0)
            fprintf(stderr, "error: tensor_parallel=%d does not divide n_head=%d\n", tp,
                    j.f.cfg.n_head);
        goto out;
    }
    j.path = pos[0];
    j.f.st = &st;
    j.tp = tp;
    j.sp = sp;
    j.cp = cp;
    j.dp = dp;
    j.zero = zero;
    j.pp = pp;
    j.micro = micro;
    j.chunks = chunks;
    if ((s = cli_schedule(schedule)) < 0) goto out;
    j.schedule = (pt_schedule_kind)s;
    j.verbose = verbose;
    j.recompute = cli_recompute(recompute);
    if (pt_precision_parse(precision, &j.precision) != PT_OK) {
        fprintf(stderr, "error: %s\n", pt_last_error());
        goto out;
    }
    if (j.recompute < 0) goto out;
    snprintf(cpname, sizeof cpname, " cp=%d", cp);
    if (world.rank == 0)
        printf("%s: V=%d C=%d n_head=%d n_kv_head=%d n_layer=%d block=%d B=%d T=%d steps=%d "
               "lr=%g wd=%g; tp=%d%s%s dp=%d zero=%d pp=%d %s m=%d v=%d %s\n",
               pos[0], j.f.cfg.vocab_size, j.f.cfg.n_embd, j.f.cfg.n_head,
               j.f.cfg.n_kv_head ? j.f.cfg.n_kv_head : j.f.cfg.n_head, j.f.cfg.n_layer,
               j.f.cfg.block_size, j.f.B, j.f.T, j.f.steps, j.f.lr, (double)j.f.opt.weight_decay, tp, sp ? " sp" : "", cp > 1 ? cpname : "", dp,
               zero, pp, schedule ? schedule : "(default)", micro,
               chunks ? chunks : j.schedule == PT_SCHED_ZB_V || j.schedule == PT_SCHED_CHIMERA ? 2 : 1,
               pt_precision_name(j.precision));
    if (j.schedule == PT_SCHED_2BW) {
        size_t n = 0;
        pt_gpt whole;
        pt_gpt_desc wd;
        memset(&wd, 0, sizeof wd);
        wd.config = j.f.cfg, wd.batch = 1, wd.seq = 1, wd.meta = 1;
        if (pt_gpt_init(&whole, &wd) == PT_OK) n = whole.num_params_full;
        pt_gpt_free(&whole);
        j.ref_losses = (float *)malloc((size_t)j.f.steps * 2 * sizeof(float));
        j.ref_final = (float *)malloc((n ? n : 1) * sizeof(float));
        j.sync_final = (float *)malloc((n ? n : 1) * sizeof(float));
        if (micro % pp) {
            fprintf(stderr, "error: 2bw makes a weight version every pp=%d micro-batches: "
                    "microbatches=%d must be a multiple of it\n", pp, micro);
            goto out;
        }
        if (!n || !j.ref_losses || !j.ref_final || !j.sync_final ||
            !reference_2bw(&j, 1, j.ref_losses, j.ref_final) ||
            !reference_2bw(&j, 0, j.ref_losses + j.f.steps, j.sync_final))
            goto out;
    }
    status = cli_world_run(&world, tp * cp * dp * pp, run_rank, &j);
    if (status == PT_OK) status = cli_world_share(&world, &j.failed);
    if (status != PT_OK) {
        fprintf(stderr, "error: %s\n", pt_last_error());
        goto out;
    }
    rc = j.failed ? 1 : 0;
out:
    free(j.ref_losses);
    free(j.ref_final);
    free(j.sync_final);
    fixture_free(&j.f);
    pt_st_free(&st);
    cli_world_end(&world);
    return rc;
}
