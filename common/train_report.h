/* train_report.h -- what build/train prints: the run's header, a progress
   line every log_every steps (mean loss since the line before, validation
   loss, tokens/s, MFU, elapsed, ETA) with the loss history beside the
   checkpoint, and how a run ended. World rank 0 calls these. Include after
   cli.h, progress.h and train_opts.h. */
#ifndef PTRAIN_TRAIN_REPORT_H
#define PTRAIN_TRAIN_REPORT_H

#include <signal.h>

static const char *train_recompute_name(int r) {
    return r == PT_RECOMPUTE_FULL ? "full" : r == PT_RECOMPUTE_SELECTIVE ? "selective" : "none";
}

/* The header's line of threads, GEMM and the peak MFU is measured against
   (and where the peak comes from); a note when it was measured under load. */
static void train_report_peak(const run *o, const pt_comm *world, double flops_step) {
    const char *prec = pt_precision_name(o->precision);
    int bf16 = o->precision == PT_PRECISION_BF16;
    const char *gemm = bf16 ? pt_gemm_bf16_name() : pt_gemm_name();
    char src[160];
    if (bf16 && strcmp(gemm, "portable") == 0)
        printf("precision bf16 on plain C loops (PTRAIN_GEMM=portable or "
               "PTRAIN_GEMM_BF16=portable): the same numbers, slowly\n");
    else if (bf16 && strcmp(gemm, "sgemm") == 0)
        printf("precision bf16 on the fp32 GEMM (no AVX512-BF16 or AMX here): operands rounded "
               "to bf16, their exact products summed in fp32, at the fp32 rate\n");
    if (o->peak_given) {
        printf("threads %d%s; GEMM %s; %s peak %.1f GFLOP/s (--peak-gflops); %.2f GFLOP per "
               "step\n", pt_get_threads(), world->size > 1 ? " per rank" : "", gemm, prec,
               o->peak, flops_step / 1e9);
        return;
    }
    if (!o->peak_instr) snprintf(src, sizeof src, "now");
    else if (o->peak_cached) snprintf(src, sizeof src, "%s, kept", o->peak_when);
    else snprintf(src, sizeof src, "now, kept for later runs");
    printf("threads %d%s; GEMM %s; %s peak %.1f GFLOP/s (%s, measured %s: %s), the GEMM at "
           "1024^3 %.1f (%.0f%% of it); %.2f GFLOP per step\n",
           pt_get_threads(), world->size > 1 ? " per rank" : "", gemm, prec, o->peak,
           !o->peak_instr ? "sgemm: no instruction probe here"
           : bf16 && strncmp(gemm, "ptrain", 6) == 0 ? "bf16 dot-product instructions"
                                                      : "FMA instructions",
           o->nodes > 1 ? "once per node, summed over the nodes" : "on this machine's cores", src,
           o->gemm_peak, 100.0 * o->gemm_peak / o->peak, flops_step / 1e9);
    if (o->peak_loaded)
        printf("note: the peak was measured under load (the measuring process had %.0f%% of its "
               "threads' time; load average %.1f): it reads low and MFU high; it is measured "
               "again on each run until one runs idle (--measure-peak measures it anew)\n",
               100.0 * o->peak_share, o->peak_load1);
}

/* The lines before the first step: the model, the layout, memory per rank,
   threads and the peak MFU is measured against, validation and training. */
static void train_report_header(const run *o, const pt_comm *world, const pt_gpt *gpt,
                                int micro_rows, double flops_step, size_t val_tokens,
                                double h_unigram) {
    char arch[256], cpname[64] = "";
    cli_model_arch(&o->cfg, arch, sizeof arch);
    printf("model: %s, %d layers, %d heads, %d wide, vocabulary %d, context %d: %.2fM "
           "parameters\n", arch, o->cfg.n_layer, o->cfg.n_head, o->cfg.n_embd, o->cfg.vocab_size,
           o->cfg.block_size, (double)gpt->num_params_full / 1e6);
    if (o->cp > 1)
        snprintf(cpname, sizeof cpname, " x cp %d (%d tokens a rank, ring attention)", o->cp,
                 o->seq / o->cp);
    printf("layout: tp %d%s%s x dp %d x pp %d = %d rank%s (%s), ZeRO %d, schedule %s, %d "
           "chunk%s per stage, %d micro-batch%s of %d rows per rank and step, recompute %s%s\n",
           o->tp, gpt->place.sp ? " (sequence parallel)" : "", cpname, o->dp, o->pp, world->size, world->size > 1 ? "s" : "",
           world->kind == PT_COMM_MPI ? "MPI" : "threads", o->zero,
           pt_schedule_kind_name(gpt->place.schedule), gpt->place.chunks,
           gpt->place.chunks > 1 ? "s" : "",
           o->accum, o->accum > 1 ? "es" : "", micro_rows, train_recompute_name(o->recompute),
           o->dp == 1 ? ""
           : o->zero == 3 && o->pp > 1 /* (stages: the gradients whole, as ZeRO 1's) */
               ? (o->overlap == PT_OVERLAP_OFF
                      ? "; parameters gathered a layer at a time before its forward and "
                        "backward, dp gradients reduce-scattered after the last micro-batch"
                      : "; parameters gathered a layer at a time, the next behind the current "
                        "one's compute, dp gradients reduce-scattered while the last "
                        "micro-batch's backward runs")
           : o->zero == 3 ? (o->overlap == PT_OVERLAP_OFF
                                 ? "; parameters gathered a layer at a time before its forward "
                                   "and backward, dp gradients reduce-scattered inside backward"
                                 : "; parameters gathered a layer at a time, the next behind the "
                                   "current one's compute, dp gradients reduce-scattered inside "
                                   "backward")
           : o->overlap == PT_OVERLAP_OFF
               ? (o->zero == 2 ? "; dp gradients reduce-scattered inside backward"
                               : "; dp gradients reduced after backward")
           : o->zero == 2 ? "; dp gradients reduce-scattered inside backward, parameters "
                            "gathered behind the next forward"
           : o->zero == 1 ? "; dp gradients reduced while backward runs, parameters gathered "
                            "behind the next forward"
                          : "; dp gradients reduced while backward runs");
    if (o->dp > 1 && o->bucket_mb > 0.0f)
        printf("dp gradient buckets: at least %g MiB (--bucket-mb)\n", (double)o->bucket_mb);
    printf("memory%s: params %.1f MiB, grads %.1f MiB, AdamW %.1f MiB, activations %.1f MiB "
           "(%d slot%s), scratch %.1f MiB\n",
           world->size > 1 ? " per rank" : "", gpt->mem.params / 1048576.0,
           gpt->mem.grads / 1048576.0, gpt->mem.optimizer / 1048576.0,
           gpt->mem.activations / 1048576.0, gpt->mem.slots, gpt->mem.slots > 1 ? "s" : "",
           gpt->mem.scratch / 1048576.0);
    train_report_peak(o, world, flops_step);
    printf("validation: %zu tokens (%s), every %d steps on %d batches; unigram entropy "
           "%.3f nats/token (the loss of a model that only counts tokens)\n",
           val_tokens, o->val_path ? o->val_path : "held out", o->eval_every, o->eval_batches,
           h_unigram);
    printf("training %d steps of %d x %d tokens, lr %g -> %g (warm-up %d), weight decay %g, "
           "clip %g, seed %llu; %d non-finite steps in a row stop it\n\n",
           o->steps, o->batch, o->seq, (double)o->lr, (double)o->min_lr, o->warmup, (double)o->wd,
           (double)o->clip, (unsigned long long)o->seed, o->max_bad);
}

/* Stragglers: every step each rank's compute seconds (the step's time less
   its time inside communication) and wait seconds reach world rank 0, which
   sums them per rank. A progress line names the rank whose compute since the
   line before is more than 1.5x the ranks' median (and its host); the run
   ends with a table per host. */
typedef struct train_strag {
    const pt_comm *world;
    int n, steps, steps_all;     /* ranks; steps since the last line, in all */
    double *comp, *wait;         /* [n] since the last line */
    double *comp_all, *wait_all; /* [n] over the run */
    double *tmp;                 /* [n] for the median */
    int *named;                  /* [n] progress lines that named the rank */
} train_strag;

#define TRAIN_STRAG_RATIO 1.5

static pt_status train_strag_init(train_strag *s, const pt_comm *world, int lead) {
    int n = world->size;
    memset(s, 0, sizeof *s);
    s->world = world, s->n = n;
    if (!lead || n < 2) return PT_OK;
    s->comp = (double *)calloc((size_t)n * 5, sizeof(double));
    s->named = (int *)calloc((size_t)n, sizeof(int));
    if (!s->comp || !s->named) return pt_error(PT_ERR_OOM, "out of memory for the straggler table");
    s->wait = s->comp + n, s->comp_all = s->comp + 2 * n, s->wait_all = s->comp + 3 * n;
    s->tmp = s->comp + 4 * n;
    return PT_OK;
}

static void train_strag_free(train_strag *s) {
    free(s->comp);
    free(s->named);
    memset(s, 0, sizeof *s);
}

/* g: the gathered [signal, compute, wait] of every rank for one step. */
static void train_strag_add(train_strag *s, const float *g) {
    int j;
    if (!s->comp) return;
    for (j = 0; j < s->n; j++) s->comp[j] += g[3 * j + 1], s->wait[j] += g[3 * j + 2];
    s->steps++;
}

static int train_strag_cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* At a progress line: note = " | slow: ..." when the slowest rank's compute
   since the last line is above TRAIN_STRAG_RATIO x the median, else "".
   The sums move into the run's. */
static void train_strag_note(train_strag *s, char *note, size_t cap) {
    int j, worst = 0;
    double med;
    note[0] = 0;
    if (!s->comp || s->steps == 0) return;
    for (j = 0; j < s->n; j++) {
        s->tmp[j] = s->comp[j];
        if (s->comp[j] > s->comp[worst]) worst = j;
    }
    qsort(s->tmp, (size_t)s->n, sizeof(double), train_strag_cmp);
    med = s->n % 2 ? s->tmp[s->n / 2] : 0.5 * (s->tmp[s->n / 2 - 1] + s->tmp[s->n / 2]);
    /* and 5 ms a step more: the noise of short steps is not a straggler */
    if (med > 0 && s->comp[worst] > TRAIN_STRAG_RATIO * med &&
        s->comp[worst] - med > 0.005 * s->steps) {
        snprintf(note, cap, " | slow: rank %d on %s, compute %.1fx the median", worst,
                 pt_comm_host(s->world, worst), s->comp[worst] / med);
        s->named[worst]++;
    }
    for (j = 0; j < s->n; j++) {
        s->comp_all[j] += s->comp[j], s->wait_all[j] += s->wait[j];
        s->comp[j] = s->wait[j] = 0.0;
    }
    s->steps_all += s->steps;
    s->steps = 0;
}

/* The run's end: per host (in the order of their first rank), its ranks,
   their mean compute and wait seconds a step, and the progress lines that
   named one of them. */
static void train_strag_table(train_strag *s) {
    int j, k;
    if (!s->comp || s->steps_all == 0) return;
    printf("\nper host, seconds a step (mean of its ranks over %d steps; slow: progress lines "
           "naming one of its ranks, of every --log-every):\n  %-32s %-12s %8s %8s %5s\n",
           s->steps_all, "host", "ranks", "compute", "waits", "slow");
    for (j = 0; j < s->n; j++) {
        const char *h = pt_comm_host(s->world, j);
        char ranks[64] = "", *p = ranks;
        double c = 0, w = 0;
        int m = 0, named = 0;
        for (k = 0; k < j && strcmp(pt_comm_host(s->world, k), h) != 0; k++) {
        }
        if (k < j) continue; /* the host was printed with its first rank */
        for (k = j; k < s->n; k++)
            if (strcmp(pt_comm_host(s->world, k), h) == 0) {
                if (p < ranks + sizeof ranks - 12)
                    p += snprintf(p, (size_t)(ranks + sizeof ranks - p), "%s%d", m ? "," : "", k);
                c += s->comp_all[k], w += s->wait_all[k], named += s->named[k], m++;
            }
        printf("  %-32s %-12s %8.3f %8.3f %5d\n", h, ranks, c / m / s->steps_all,
               w / m / s->steps_all, named);
    }
    fflush(stdout);
}

/* The progress meter: rates count from this process's first step (a resume
   or a periodic save does not move them), and a line shows the mean loss of
   the good steps since the last multiple of log_every. */
typedef struct train_meter {
    const run *o;
    double flops_step, t_start, t_train, loss_sum;
    int first_step, n_avg, warned_mfu;
    progress_history hist; /* beside the checkpoint (rank 0's) */
} train_meter;

static void train_meter_init(train_meter *m, const run *o, int lead) {
    memset(m, 0, sizeof *m);
    m->o = o;
    progress_history_init(&m->hist, lead ? o->ckpt_out : NULL);
}

static void train_meter_start(train_meter *m, int first_step) {
    m->flops_step = pt_gpt_flops_per_step(&m->o->cfg, m->o->batch, m->o->seq);
    m->first_step = first_step;
    m->t_start = pt_time_now();
}

/* After a step that began at t0; loss is NAN for a skipped step. */
static void train_meter_step(train_meter *m, int step, double t0, double loss) {
    if (loss == loss) m->loss_sum += loss, m->n_avg++;
    m->t_train += pt_time_now() - t0;
#ifdef PTRAIN_TEST_HOOKS
    if (m->o->step_seconds > 0) /* a clock the tests can predict: each step takes this */
        m->t_train = (step + 1 - m->first_step) * (double)m->o->step_seconds;
#else
    (void)step;
#endif
}

/* Rank 0 after step `step` (0-based): the progress line when it is due
   (every log_every steps, the last, the process's first) and a history row
   when a line or a validation loss (val, NAN when not measured) is new. */
static pt_status train_meter_report(train_meter *m, int step, int last, double val, int val_now,
                                    float lr, float norm, train_strag *sg) {
    const run *o = m->o;
    int line = (step + 1) % o->log_every == 0 || last;
    if (line || step == m->first_step) {
        int done_steps = step + 1 - m->first_step;
        double tps = (double)done_steps * o->batch * o->seq / m->t_train;
        double mfu = m->flops_step * done_steps / m->t_train / (o->peak * 1e9);
        double elapsed = pt_time_now() - m->t_start;
        char el[32], eta[32], vs[16] = "     -", ms[16], slow[160] = "";
#ifdef PTRAIN_TEST_HOOKS
        if (o->step_seconds > 0) elapsed = m->t_train;
#endif
        progress_time(el, sizeof el, elapsed);
        progress_time(eta, sizeof eta, elapsed / done_steps * (o->steps - step - 1));
        if (val == val) snprintf(vs, sizeof vs, "%.4f", val);
        if (mfu > 1.0 && !m->warned_mfu) { /* a peak measured too low, or given so */
            printf("warning: MFU above 100%%: this run reaches %.1f GFLOP/s, above the peak of "
                   "%g GFLOP/s: MFU shows as '-'; give the machine's peak with --peak-gflops%s\n",
                   mfu * o->peak, o->peak,
                   o->peak_given ? "" : ", or measure it on an idle machine with --measure-peak");
            m->warned_mfu = 1;
        }
        if (mfu > 1.0) snprintf(ms, sizeof ms, "    -"); /* never above 100% */
        else snprintf(ms, sizeof ms, "%4.1f%%", 100.0 * mfu);
        if (line) train_strag_note(sg, slow, sizeof slow);
        if (m->n_avg > 0) /* a line needs a step that was not skipped */
            printf("step %5d/%d | loss %.4f | val %s | lr %.2e | norm %.2f | %7.0f tok/s | "
                   "MFU %s | %s elapsed | ETA %s%s\n",
                   step + 1, o->steps, m->loss_sum / m->n_avg, vs, (double)lr, (double)norm, tps,
                   ms, el, eta, slow);
        fflush(stdout);
    }
    if ((line || val_now) &&
        !progress_history_add(&m->hist, step + 1, (long long)(step + 1) * o->batch * o->seq,
                              line && m->n_avg > 0 ? m->loss_sum / m->n_avg : NAN,
                              val_now ? val : NAN))
        return pt_error(PT_ERR_OOM, "out of memory for the loss history");
    if (line) m->loss_sum = 0.0, m->n_avg = 0;
    return PT_OK;
}

static void train_meter_free(train_meter *m) { progress_history_free(&m->hist); }

/* A step skipped by the numerical guard. */
static void train_report_skipped(const run *o, int step, const pt_step_result *res, int n_bad) {
    printf("step %5d/%d | skipped: loss %g, gradient norm %g; the first non-finite gradient is "
           "%s (%d bad step%s in a row, at most %d)\n",
           step + 1, o->steps, (double)res->loss, (double)res->grad_norm, res->bad_tensor, n_bad,
           n_bad > 1 ? "s" : "", o->max_bad);
    fflush(stdout);
}

/* Why a run ended early, and how to go on: a signal after step `step`
   (0-based), or n_bad non-finite steps in a row (the last good one
   good_step); ckpt is the file written (with --checkpoint). */
static void train_report_stop(const run *o, int signaled, int step, int n_bad, int good_step,
                              const char *bad_tensor, const char *ckpt) {
    fflush(stdout);
    if (signaled) {
        const char *why = signaled == SIGINT ? "interrupted (SIGINT)" : "terminated (SIGTERM)";
        if (o->ckpt_out)
            fprintf(stderr, "%s after step %d of %d: %s holds it; continue with the same "
                    "options and --resume %s\n", why, step + 1, o->steps, ckpt,
                    o->keep ? "latest" : ckpt);
        else
            fprintf(stderr, "%s after step %d of %d: nothing saved (no --checkpoint)\n", why,
                    step + 1, o->steps);
    } else if (o->ckpt_out) {
        fprintf(stderr, "error: %d steps in a row had a non-finite loss or gradient (the last, "
                "step %d, first in %s): stopped. %s holds the weights and AdamW state of step "
                "%d, the last good one; --resume continues after the skipped batches\n", n_bad,
                step + 1, bad_tensor, ckpt, good_step);
    } else {
        fprintf(stderr, "error: %d steps in a row had a non-finite loss or gradient (the last, "
                "step %d, first in %s): stopped after step %d, the last good one; nothing "
                "saved (no --checkpoint)\n", n_bad, step + 1, bad_tensor, good_step);
    }
}

#endif
