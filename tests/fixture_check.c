/* fixture_check: runs a ptrain-fixture-v1 file's protocol (the fixtures'
   README, section 3.4) and compares every quantity with its tolerance, in any
   tensor x data parallel layout.

     build/fixture_check FILE [--tp N] [--dp N] [--zero S] [--threads N] [--verbose]
     mpirun -np N build/fixture_check_mpi FILE --tp A --dp B     (N = A*B)

   With --tp/--dp the ranks are threads of this process (fixture_check) or
   MPI processes (fixture_check_mpi); dp ranks split the fixture's batch.
   Logits, gradients and final weights are gathered to their whole Hugging
   Face layout and checked with the same tolerances as a serial run.
   Prints one line per quantity (worst error, tolerance, PASS/FAIL) and exits
   0 only if all pass; 1 on a mismatch, 2 if the file or layout cannot be used. */
#define _POSIX_C_SOURCE 200809L /* setenv, execv (cli_passive_wait) */
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"
#include "../common/cli.h"

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

/* per tensor: max|a-r| <= 2e-5 * max|r| (if max|r| == 0: |a| <= 1e-12) */
static void compare_grad(check *c, const char *what, const float *a, const float *r, size_t n) {
    double maxr = 0.0, worst = 0.0, tol;
    size_t i;
    for (i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)r[i]);
        if (fabs((double)r[i]) > maxr) maxr = fabs((double)r[i]);
        if (!(e <= worst)) worst = e != e ? INFINITY : e;
    }
    tol = maxr > 0.0 ? 2e-5 * maxr : 1e-12;
    report(c, what, worst, tol, worst / tol, 0);
}

static int meta_double(const pt_safetensors *st, const char *key, double *out) {
    const char *v = pt_st_meta_get(st, key);
    char *end;
    if (!v) {
        fprintf(stderr, "error: fixture metadata lacks '%s'\n", key);
        return 0;
    }
    *out = strtod(v, &end);
    if (*v == 0 || *end || *out != *out) {
        fprintf(stderr, "error: fixture metadata %s='%s' is not a number\n", key, v);
        return 0;
    }
    return 1;
}

static int meta_is(const pt_safetensors *st, const char *key, const char *want) {
    const char *v = pt_st_meta_get(st, key);
    if (v && strcmp(v, want) == 0) return 1;
    fprintf(stderr, "error: fixture metadata %s='%s' is not supported (expected '%s')\n", key,
            v ? v : "(missing)", want);
    return 0;
}

/* What every rank needs: the fixture (read-only), its settings, the layout. */
typedef struct job {
    const char *path;
    const pt_safetensors *st;
    pt_gpt_config cfg;
    int B, T, steps, tp, dp, pp, zero, micro, chunks, recompute, verbose;
    const char *schedule;
    double lr;
    pt_adamw_config opt;
    const int *inputs, *targets; /* (B, T) */
    int failed;                  /* checks failed over all ranks (set by world rank 0) */
} job;

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
    int Bl = j->B / j->dp, s, i, lead = world->rank == 0, grid_ok = 0;
    size_t N = (size_t)Bl * j->T, V = (size_t)j->cfg.vocab_size, rows0;
    float *ref = NULL, *mine = NULL, *keep = NULL, *losses = NULL, total;
    char label[128];
    pt_status status = PT_OK;
    memset(&gpt, 0, sizeof gpt);
    memset(&whole, 0, sizeof whole);
    c.verbose = lead && j->verbose;
    if ((status = pt_grid_init(&grid, world, j->tp, j->dp, j->pp)) != PT_OK) return status;
    grid_ok = 1;
    memset(&desc, 0, sizeof desc);
    desc.config = j->cfg;
    desc.batch = Bl / j->micro; /* micro-batch rows */
    desc.seq = j->T;
    desc.grid = &grid;
    desc.zero = j->zero;
    desc.grad_accum = j->micro;
    desc.schedule = j->schedule;
    desc.chunks = j->chunks;
    desc.recompute = j->recompute;
    if ((status = pt_gpt_init(&gpt, &desc)) != PT_OK ||
        (status = pt_gpt_load_weights_st(&gpt, j->st)) != PT_OK)
        goto out;
    { /* the whole model's table (a meta model: no memory) names every tensor */
        pt_gpt_desc wd;
        memset(&wd, 0, sizeof wd);
        wd.config = j->cfg, wd.batch = 1, wd.seq = 1, wd.meta = 1;
        if ((status = pt_gpt_init(&whole, &wd)) != PT_OK) goto out;
    }
    rows0 = (size_t)grid.dp_rank * N; /* this rank's rows of the batch */
    {
        /* ref holds the whole batch's logits, mine this rank's rows */
        size_t all = (size_t)j->B * j->T * V;
        size_t most = all > gpt.num_params_full ? all : gpt.num_params_full;
        ref = (float *)malloc(most * sizeof(float));
        mine = (float *)malloc(most * sizeof(float));
        keep = (float *)malloc(N * (size_t)gpt.vocab_local * sizeof(float));
        losses = (float *)malloc((size_t)j->steps * sizeof(float));
        if (!ref || !mine || !keep || !losses) RANK_FAIL(pt_comm_fail(world, PT_ERR_OOM));
    }
    for (s = 0; s < j->steps; s++) {
        int64_t lshape[3] = {j->B, j->T, j->cfg.vocab_size}, one[1] = {1};
        float loss_ref;
        if (s == 0 && ((status = pt_st_read_f32(j->st, "fixture.logits", ref, 3, lshape)) != PT_OK ||
                       (status = pt_st_read_f32(j->st, "fixture.loss", &loss_ref, 1, one)) != PT_OK))
            goto out;
        if (j->pp > 1) { /* the whole step through the stages; the last keeps the logits */
            gpt.keep_logits = s == 0 && gpt.has_head ? keep : NULL;
            if ((status = pt_gpt_pipeline_step(&gpt, j->inputs + rows0, j->targets + rows0, Bl,
                                               j->T)) != PT_OK)
                goto out;
            losses[s] = gpt.loss;
            if (s == 0 && gpt.has_head) {
                if ((status = pt_gpt_gather_logits(&gpt, mine)) != PT_OK) goto out;
                compare_elem(&c, "logits", mine, ref + rows0 * V, N * V, 5e-6, 1e-5, lead);
            }
        } else { /* micro-batch after micro-batch, gradients accumulating */
            int k, b = Bl / j->micro;
            size_t rows = (size_t)b * j->T;
            losses[s] = 0.0f;
            for (k = 0; k < j->micro; k++) {
                size_t at = rows0 + (size_t)k * rows;
                if ((status = pt_gpt_forward(&gpt, j->inputs + at, j->targets + at, b, j->T)) !=
                    PT_OK)
                    goto out;
                losses[s] += gpt.loss / (float)j->micro;
                if (s == 0) {
                    if ((status = pt_gpt_gather_logits(&gpt, mine)) != PT_OK) goto out;
                    compare_elem(&c, "logits", mine, ref + at * V, rows * V, 5e-6, 1e-5,
                                 lead && k == 0);
                }
                if ((status = pt_gpt_backward(&gpt)) != PT_OK) goto out;
            }
        }
        if (s == 0) {
            int fails_before;
            compare_elem(&c, "loss", &losses[0], &loss_ref, 1, 1e-5, 5e-6, lead);
            if ((status = pt_gpt_gather(&gpt, PT_BUF_GRADS, mine)) != PT_OK) goto out;
            fails_before = c.failed;
            for (i = 0; i < whole.num_tensors; i++) { /* every tensor, whichever stage has it */
                const pt_param *p = &whole.table[i];
                snprintf(label, sizeof label, "fixture.grad.%s", p->name);
                if ((status = pt_st_read_f32(j->st, label, ref, p->ndim, p->full_shape)) != PT_OK)
                    goto out;
                snprintf(label, sizeof label, "grad %s", p->name);
                compare_grad(&c, label, mine + p->full_offset, ref, p->full_numel);
            }
            if (lead)
                printf("  %-40s %d tensors  %s\n", "grads (per tensor, 2e-5 * max|ref|)",
                       whole.num_tensors, c.failed == fails_before ? "PASS" : "FAIL");
        }
        if ((status = pt_gpt_adamw_step(&gpt, &j->opt, (float)j->lr)) != PT_OK) goto out;
    }
    {
        int64_t ns[1] = {j->steps};
        double worst = 0.0;
        const char *worst_name = whole.table[0].name;
        int fails_before;
        if ((status = pt_st_read_f32(j->st, "fixture.losses", ref, 1, ns)) != PT_OK) goto out;
        compare_elem(&c, "losses (every step)", losses, ref, (size_t)j->steps, 1e-5, 5e-6, lead);
        fails_before = c.failed;
        if ((status = pt_gpt_gather(&gpt, PT_BUF_PARAMS, mine)) != PT_OK) goto out;
        for (i = 0; i < whole.num_tensors; i++) {
            const pt_param *p = &whole.table[i];
            size_t k;
            snprintf(label, sizeof label, "fixture.final.%s", p->name);
            if ((status = pt_st_read_f32(j->st, label, ref, p->ndim, p->full_shape)) != PT_OK)
                goto out;
            for (k = 0; k < p->full_numel; k++) {
                double e = fabs((double)mine[p->full_offset + k] - (double)ref[k]);
                if (!(e <= worst)) {
                    worst = e != e ? INFINITY : e;
                    worst_name = p->name;
                }
            }
            snprintf(label, sizeof label, "final %s", p->name);
            compare_elem(&c, label, mine + p->full_offset, ref, p->full_numel, 2.5e-4, 0.0, 0);
        }
        if (lead)
            printf("  %-40s max_err %.3e  tol %.3e  %s (worst: %s)\n", "final params", worst,
                   2.5e-4, c.failed == fails_before ? "PASS" : "FAIL", worst_name);
    }
    if (lead)
        printf("  per-rank memory (zero=%d): params %.2f MiB, grads %.2f MiB, AdamW %.2f MiB, "
               "activations %.2f MiB\n",
               j->zero, gpt.mem.params / 1048576.0, gpt.mem.grads / 1048576.0,
               gpt.mem.optimizer / 1048576.0, gpt.mem.activations / 1048576.0);
    if (j->pp > 1) { /* the slots the stage used at once = the checker's peak in flight */
        char what[96];
        float used = (float)gpt.slots_peak, want = (float)gpt.nslots;
        snprintf(what, sizeof what, "stage %d activation slots used (checker: %d)", grid.pp_rank,
                 gpt.nslots);
        compare_elem(&c, what, &used, &want, 1, 0.5, 0.0, lead || grid.tp_rank + grid.dp_rank == 0);
    }
    /* every rank's failures count */
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
    free(keep);
    free(losses);
    pt_gpt_free(&gpt);
    pt_gpt_free(&whole);
    if (grid_ok) pt_grid_free(&grid);
    return status;
}

/* An I32 tensor of shape (B, T) into a new array (the caller frees it);
   NULL after an error message. */
static int *read_batch(const pt_safetensors *st, const char *name, int B, int T) {
    const pt_st_tensor *t = pt_st_find(st, name);
    int64_t bt[2];
    int *x = NULL;
    bt[0] = B, bt[1] = T;
    /* allocate only a batch the file holds: the metadata's B and T alone could ask for
       terabytes; otherwise x stays NULL and pt_st_read_i32 refuses before writing */
    if (t && t->ndim == 2 && t->shape[0] == B && t->shape[1] == T &&
        !(x = (int *)malloc((size_t)B * (size_t)T * sizeof(int)))) {
        fprintf(stderr, "error: out of memory\n");
        return NULL;
    }
    if (pt_st_read_i32(st, name, x, 2, bt) != PT_OK) {
        fprintf(stderr, "error: %s\n", pt_last_error());
        free(x);
        return NULL;
    }
    return x;
}

/* The fixture's settings, model shape and batch from st into j (its inputs
   and targets are the caller's to free); 0 after an error message. */
static int fixture_read(const pt_safetensors *st, job *j) {
    double B, T, steps, b1, b2, eps, wd;
    if (!meta_is(st, "format", "ptrain-fixture-v1") || !meta_is(st, "decay", "dim>=2") ||
        !meta_is(st, "gelu", "tanh") || !meta_is(st, "tied_lm_head", "true") ||
        !meta_double(st, "B", &B) || !meta_double(st, "T", &T) ||
        !meta_double(st, "steps", &steps) || !meta_double(st, "lr", &j->lr) ||
        !meta_double(st, "beta1", &b1) || !meta_double(st, "beta2", &b2) ||
        !meta_double(st, "eps", &eps) || !meta_double(st, "weight_decay", &wd))
        return 0;
    if (!(B >= 1 && B <= 1 << 16 && T >= 1 && T <= 1 << 20 && steps >= 1 && steps <= 1 << 20)) {
        fprintf(stderr, "error: fixture B=%g T=%g steps=%g out of range\n", B, T, steps);
        return 0;
    }
    if (pt_gpt_config_from_st(st, 0, &j->cfg) != PT_OK) {
        fprintf(stderr, "error: %s\n", pt_last_error());
        return 0;
    }
    j->B = (int)B;
    j->T = (int)T;
    j->steps = (int)steps;
    j->opt.beta1 = (float)b1;
    j->opt.beta2 = (float)b2;
    j->opt.eps = (float)eps;
    j->opt.weight_decay = (float)wd;
    return (j->inputs = read_batch(st, "fixture.inputs", j->B, j->T)) != NULL &&
           (j->targets = read_batch(st, "fixture.targets", j->B, j->T)) != NULL;
}

int main(int argc, char **argv) {
    int threads = 0, verbose = 0, npos = 0, s, tp = 1, dp = 1, pp = 1, zero = 0, micro = 1, chunks = 1;
    const char *schedule = "1f1b", *recompute = "none";
    const char *pos[1] = {NULL};
    cli_opt opts[] = {
        {"tp", CLI_INT, &tp, "tensor-parallel ranks (divides n_head)", 1, 1024},
        {"dp", CLI_INT, &dp, "data-parallel ranks (divides the fixture's batch B)", 1, 1024},
        {"zero", CLI_INT, &zero, "ZeRO stage: 0, 1 (shard AdamW state) or 2 (and gradients)", 0, 2},
        {"pp", CLI_INT, &pp, "pipeline stages (at most n_layer)", 1, 1024},
        {"schedule", CLI_STR, &schedule, "pipeline schedule: gpipe, 1f1b, interleaved, zb-h1", 0, 0},
        {"microbatches", CLI_INT, &micro, "micro-batches per step (divides B/dp)", 1, 4096},
        {"chunks", CLI_INT, &chunks, "layer chunks per stage (interleaved)", 1, 64},
        {"recompute", CLI_STR, &recompute, "activation recomputation: none, selective, full", 0,
         0},
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
    if (!fixture_read(&st, &j)) goto out;
    if (j.B % dp != 0 || j.cfg.n_head % tp != 0 || (j.B % dp == 0 && (j.B / dp) % micro)) {
        if (j.B % dp != 0)
            fprintf(stderr, "error: data_parallel=%d does not divide the fixture's batch B=%d\n",
                    dp, j.B);
        else if ((j.B / dp) % micro)
            fprintf(stderr, "error: microbatches=%d does not divide the %d rows of each "
                    "data-parallel rank (B=%d / dp=%d)\n", micro, j.B / dp, j.B, dp);
        if (j.cfg.n_head % tp != 0)
            fprintf(stderr, "error: tensor_parallel=%d does not divide n_head=%d\n", tp,
                    j.cfg.n_head);
        goto out;
    }
    j.path = pos[0];
    j.st = &st;
    j.tp = tp;
    j.dp = dp;
    j.zero = zero;
    j.pp = pp;
    j.micro = micro;
    j.chunks = chunks;
    j.schedule = schedule;
    j.verbose = verbose;
    j.recompute = cli_recompute(recompute);
    if (j.recompute < 0) goto out;
    if (world.rank == 0)
        printf("%s: V=%d C=%d n_head=%d n_layer=%d block=%d B=%d T=%d steps=%d lr=%g wd=%g; "
               "tp=%d dp=%d zero=%d pp=%d%s%s m=%d v=%d\n",
               pos[0], j.cfg.vocab_size, j.cfg.n_embd, j.cfg.n_head, j.cfg.n_layer,
               j.cfg.block_size, j.B, j.T, j.steps, j.lr, (double)j.opt.weight_decay, tp, dp,
               zero, pp, pp > 1 ? " " : "", pp > 1 ? schedule : "", micro, chunks);
    status = cli_world_run(&world, tp * dp * pp, run_rank, &j);
    if (status == PT_OK) status = cli_world_share(&world, &j.failed);
    if (status != PT_OK) {
        fprintf(stderr, "error: %s\n", pt_last_error());
        goto out;
    }
    rc = j.failed ? 1 : 0;
out:
    free((void *)j.inputs);
    free((void *)j.targets);
    pt_st_free(&st);
    cli_world_end(&world);
    return rc;
}
