/* train.c -- ptrain's main job: train a GPT on a file or on the embedded
   default task, with progress lines, checkpoints and a sample at the end.

     make run                      (builds build/train and runs the default)
     build/train --help

   Every layout takes the same road: each rank builds its part of the model
   (pt_gpt_init with its place in the tp x dp x pp grid), and every step is
   one pt_gpt_step over the rank's rows of the batch: forward and backward of
   its micro-batches as the schedule orders them, the gradients synced, the
   gradient norm clipped, the numerical guard, AdamW. The options, the
   checkpoint files, the progress display and the embedded task live in
   common/ (the programs' shared module); this file is the training loop. */
#define _POSIX_C_SOURCE 200809L /* setenv, execv (cli_passive_wait) */
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"
#include "../common/cli.h"
#include "../common/ckpt.h"
#include "../common/peak.h"
#include "../common/progress.h"
#include "../common/task.h"
#include "../common/train_opts.h"
#include "../common/train_report.h"

#include <math.h>
#include <signal.h>
#include <time.h>   /* nanosleep */
#include <unistd.h> /* write, _exit: what a signal handler may call */

/* The first SIGINT or SIGTERM asks for a stop after the current step (with a
   checkpoint); a second one ends the process at once. Every rank reads the
   flag through an all-reduce at the end of each step, so all stop together. */
static volatile sig_atomic_t stop_signal;

static void on_stop_signal(int sig) {
    static const char msg[] = "\nstopping after this step (a checkpoint if --checkpoint is "
                              "given); again to quit at once\n";
    if (stop_signal) _exit(128 + sig);
    stop_signal = sig;
    if (write(STDERR_FILENO, msg, sizeof msg - 1) < 0) { /* nothing to do */
    }
}

/* Validation loss over `batches` batches from the start of the split; each
   rank evaluates its rows (first, rows of them). */
static double eval_loss(pt_gpt *gpt, pt_loader *val, int batches, int *inputs, int *targets,
                        int first, int rows) {
    double sum = 0.0;
    int i, T = val->T;
    pt_step_desc d;
    memset(&d, 0, sizeof d);
    d.inputs = inputs + (size_t)first * T, d.targets = targets + (size_t)first * T;
    d.B = rows, d.T = T;
    pt_loader_seek(val, 0, 0);
    for (i = 0; i < batches; i++) {
        float loss;
        pt_loader_next(val, inputs, targets);
        if (pt_gpt_eval(gpt, &d, &loss) != PT_OK) return NAN;
        sum += loss;
    }
    return sum / batches;
}

#ifdef PTRAIN_TEST_HOOKS
/* --debug-nan-*: a NaN in one gradient, on every rank holding part of it */
static void plant_nan(pt_gpt *gpt, void *ctx) {
    size_t n;
    float *g = pt_gpt_grad_of(gpt, ((const run *)ctx)->nan_tensor, &n);
    if (g && n > 0) g[n / 2] = NAN;
}
#endif

/* Samples from the trained model on world rank 0 (a split model is first
   gathered whole into one without a grid: collective), and on the embedded
   task scores what it learned. */
static pt_status sample_and_score(run *o, pt_comm *world, pt_gpt *gpt, pt_rng *rng) {
    pt_gpt solo;
    pt_gpt_desc d;
    pt_kv_cache cache;
    const pt_gpt *sampler = gpt;
    float *full = NULL;
    int *out = NULL;
    pt_status st = PT_OK;
    memset(&solo, 0, sizeof solo);
    memset(&cache, 0, sizeof cache);
    if (o->sample_tokens == 0 && o->data_path) return PT_OK;
    if (world->size > 1 || gpt->place.zero == 3) { /* split or sharded: whole, on rank 0 */
        if (!(full = (float *)malloc(gpt->num_params_full * sizeof(float))))
            return pt_comm_fail(world, pt_error(PT_ERR_OOM, "out of memory gathering the model"));
        if ((st = pt_gpt_gather(gpt, PT_BUF_PARAMS, full)) != PT_OK || world->rank != 0)
            goto done;
        memset(&d, 0, sizeof d);
        d.config = o->cfg, d.batch = 1, d.seq = o->seq, d.inference = 1;
        if ((st = pt_gpt_init(&solo, &d)) != PT_OK) goto done;
        memcpy(solo.params, full, gpt->num_params_full * sizeof(float));
        sampler = &solo;
    }
    if ((st = pt_kv_cache_init(&cache, sampler)) != PT_OK) goto done;
    if (o->sample_tokens > 0) {
        int prompt = '\n', i, nl;
        size_t np = 0;
        pt_sample_desc sd;
        /* the tokenizer's newline starts the sample, as the byte models' */
        if (o->tk && pt_tokenizer_encode(o->tk, "\n", 1, 0, &nl, &np) == PT_OK && np == 1)
            prompt = nl;
        sd.temperature = o->temperature, sd.top_k = o->top_k, sd.seed = pt_rng_u64(rng);
        if (!(out = (int *)malloc(sizeof(int) * (size_t)o->sample_tokens))) {
            st = pt_error(PT_ERR_OOM, "out of memory for the sample");
            goto done;
        }
        if ((st = pt_gpt_generate(sampler, &cache, &prompt, 1, out, o->sample_tokens, &sd)) !=
            PT_OK)
            goto done;
        if (o->tk) {
            printf("\n--- sample (temperature %g, top-k %d) ---\n", (double)o->temperature,
                   o->top_k);
            cli_print_text(o->tk, out, o->sample_tokens);
            printf("\n---\n");
        } else if (o->cfg.vocab_size == 256) {
            printf("\n--- sample (temperature %g, top-k %d) ---\n", (double)o->temperature,
                   o->top_k);
            cli_print_bytes(out, o->sample_tokens);
            printf("\n---\n");
            if (!o->data_path) task_score_sample(out, o->sample_tokens);
        } else {
            printf("\n--- sample token ids (no tokenizer for vocabulary %d) ---\n",
                   o->cfg.vocab_size);
            for (i = 0; i < o->sample_tokens; i++)
                printf("%d%c", out[i], i % 16 == 15 ? '\n' : ' ');
            printf("\n---\n");
        }
    }
    if (!o->data_path)
        printf("additions answered correctly (greedy, 200 random problems a+b with a,b < %d): "
               "%.1f%%\n",
               TASK_ADD_MAX, 100.0 * task_addition_accuracy(sampler, &cache, 200, o->seed + 7));
done:
    free(out);
    free(full);
    pt_kv_cache_free(&cache);
    pt_gpt_free(&solo);
    return st;
}

/* One rank's run: its part of the model, its loaders and batch, the step
   loop's state. World rank 0 (lead) prints. */
typedef struct rank_run {
    run *o;
    pt_comm *world;
    int lead, rows, first, grid_ok; /* its rows of each batch: first, rows of them */
    pt_grid grid;
    pt_loader train_ld, val_ld;
    pt_gpt gpt;
    pt_gpt_desc desc;
    pt_train_state state;
    pt_rng rng;
    pt_trace trace;
    int *inputs, *targets;
    double h_unigram, val;
    train_meter meter; /* the progress line and the loss history (rank 0's) */
    /* the loop */
    pt_adamw_config opt;
    pt_lr_schedule sched;
    pt_step_desc sd;
    pt_step_result res;
    int step, n_bad, stopped, good_step; /* steps skipped in a row; the last good one */
    int signaled; /* SIGINT or SIGTERM on some rank: the step after which all stop */
    char ckpt_path[4096];
    float *gath;       /* [3 * world size]: each rank's signal, compute and wait of the step */
    train_strag strag; /* world rank 0's sums of them */
} rank_run;

/* Seconds this rank spent inside communication so far (its groups' and
   the world's operations). */
static double rank_comm_seconds(const rank_run *r) {
    double t = r->world->seconds;
    if (r->grid_ok)
        t += r->grid.tp_comm.seconds + r->grid.dp_comm.seconds + r->grid.pp_comm.seconds +
             r->grid.cp_comm.seconds + r->grid.dpcp_comm.seconds;
    return t;
}

/* The rank's part of the model, its weights: the seed's, or --init-from's. */
static pt_status rank_model(rank_run *r) {
    run *o = r->o;
    pt_status st;
    if ((st = pt_grid_init_cp(&r->grid, r->world, o->tp, o->cp, o->dp, o->pp)) != PT_OK)
        return st;
    r->grid_ok = 1;
    r->first = r->grid.dp_rank * r->rows;
    memset(&r->desc, 0, sizeof r->desc);
    r->desc.config = o->cfg;
    r->desc.batch = r->rows / o->accum; /* a micro-batch's rows */
    r->desc.seq = o->seq;
    r->desc.grid = r->world->size > 1 ? &r->grid : NULL;
    r->desc.zero = o->zero;
    r->desc.grad_accum = o->accum;
    r->desc.schedule = o->schedule;
    r->desc.chunks = o->chunks;
    r->desc.recompute = o->recompute;
    r->desc.sequence_parallel = o->sp;
    r->desc.context_parallel = o->cp;
    r->desc.precision = o->precision;
    r->desc.bucket_bytes = (size_t)((double)o->bucket_mb * 1048576.0);
    if ((st = pt_gpt_init(&r->gpt, &r->desc)) != PT_OK) return st;
    pt_gpt_init_weights(&r->gpt, o->seed);
    if (o->init_from) {
        if ((st = pt_gpt_load_weights(&r->gpt, o->init_from)) != PT_OK) return st;
        if (r->lead) printf("weights from %s (a fresh AdamW)\n", o->init_from);
    }
    return PT_OK;
}

/* The loaders (every rank draws the same batches and takes its rows), the
   resumed state, the batch buffers, and the validation split's unigram
   entropy. */
static pt_status rank_data(rank_run *r) {
    run *o = r->o;
    pt_loader_desc ld;
    pt_status st;
    memset(&ld, 0, sizeof ld);
    ld.batch = o->batch, ld.seq = o->seq, ld.seed = o->seed, ld.val_fraction = o->val_fraction;
    if (o->val_tok) { /* all of --data trains; --val-data validates, in its order */
        pt_loader_desc vd = ld;
        vd.no_shuffle = 1;
        if ((st = pt_loader_init(&r->train_ld, o->tok, PT_SPLIT_ALL, &ld)) != PT_OK ||
            (st = pt_loader_init(&r->val_ld, o->val_tok, PT_SPLIT_ALL, &vd)) != PT_OK)
            return st;
    } else if ((st = pt_loader_init(&r->train_ld, o->tok, PT_SPLIT_TRAIN, &ld)) != PT_OK ||
               (st = pt_loader_init(&r->val_ld, o->tok, PT_SPLIT_VAL, &ld)) != PT_OK) {
        return st;
    }
    pt_rng_seed(&r->rng, o->seed ^ 0x5EED5EEDull);
    if (o->resume) {
        if ((st = pt_checkpoint_load(o->resume, &r->gpt, &r->state)) != PT_OK) return st;
        pt_loader_seek(&r->train_ld, r->state.data_epoch, (size_t)r->state.data_pos);
        r->rng.state = r->state.rng_state;
        if (r->lead)
            printf("resumed from %s at step %lld%s\n", o->resume, (long long)r->state.step,
                   r->state.checksummed ? "" : " (it has no checksums: not verified)");
        progress_history_load(&r->meter.hist, r->state.step);
    }
    r->inputs = (int *)malloc(sizeof(int) * (size_t)o->batch * o->seq);
    r->targets = (int *)malloc(sizeof(int) * (size_t)o->batch * o->seq);
    if (!r->inputs || !r->targets) return pt_error(PT_ERR_OOM, "out of memory for the batch");
#ifdef PTRAIN_TEST_HOOKS
    if (o->nan_step > 0) { /* the planted NaN needs a tensor some rank holds */
        int none = 0;
        if ((st = pt_comm_all_ok(r->world, !pt_gpt_find_param(&r->gpt, o->nan_tensor), &none)) !=
            PT_OK)
            return st;
        if (none)
            return pt_error(PT_ERR_CONFIG, "--debug-nan-tensor '%s' is no tensor of this model",
                            o->nan_tensor);
    }
#endif
    r->h_unigram = pt_tokens_unigram_entropy(o->val_tok ? o->val_tok : o->tok, r->val_ld.begin,
                                             r->val_ld.begin + r->val_ld.len);
    return PT_OK;
}

/* --eval-only: every whole batch of the validation tokens, or --eval-batches. */
static pt_status rank_eval_only(rank_run *r) {
    run *o = r->o;
    int batches = (int)(r->val_ld.n_windows / (size_t)o->batch);
    if (o->eval_batches_given || batches < 1) batches = o->eval_batches;
    r->val = eval_loss(&r->gpt, &r->val_ld, batches, r->inputs, r->targets, r->first, r->rows);
    if (r->val != r->val)
        return pt_error(PT_ERR_INVALID_ARG, "evaluation failed: %s", pt_last_error());
    if (r->lead)
        printf("eval: %s on %s: %d batches of %d x %d tokens: loss %.4f nats/token, "
               "perplexity %.3f (unigram entropy %.3f)\n",
               o->init_from ? o->init_from : o->resume,
               o->val_path ? o->val_path : o->data_path ? "--data's held-out part"
                                                        : "the embedded task's held-out part",
               batches, o->batch, o->seq, r->val, exp(r->val), r->h_unigram);
    return PT_OK;
}

/* The optimizer, the schedule and the step's description of the rank's rows. */
static void rank_loop_start(rank_run *r) {
    run *o = r->o;
    r->opt = pt_adamw_default();
    r->opt.weight_decay = o->wd;
    r->sched.lr = o->lr;
    r->sched.min_lr = o->min_lr;
    r->sched.warmup_steps = o->warmup;
    r->sched.total_steps = o->steps;
    memset(&r->sd, 0, sizeof r->sd);
    r->sd.inputs = r->inputs + (size_t)r->first * o->seq;
    r->sd.targets = r->targets + (size_t)r->first * o->seq;
    r->sd.B = r->rows, r->sd.T = o->seq;
    r->sd.adamw = &r->opt;
    r->sd.clip = o->clip;
    r->sd.overlap = o->overlap;
    r->good_step = (int)r->state.step;
    r->val = NAN;
    train_meter_start(&r->meter, r->good_step);
}

/* After a step: a checkpoint when one is due (every --checkpoint-every, the
   last step, a stop). A stop saves the weights and AdamW state of the last
   good step and the data position after the skipped batches. */
static pt_status rank_save(rank_run *r, int last) {
    run *o = r->o;
    int step = r->step;
    pt_status st;
    if (!o->ckpt_out ||
        !((o->ckpt_every > 0 && (step + 1) % o->ckpt_every == 0) || last || r->stopped))
        return PT_OK;
    r->state.step = step + 1;
    r->state.data_epoch = r->train_ld.epoch;
    r->state.data_pos = r->train_ld.pos;
    r->state.rng_state = r->rng.state;
    if (o->keep) ckpt_step_path(r->ckpt_path, sizeof r->ckpt_path, o->ckpt_out, step + 1);
    else snprintf(r->ckpt_path, sizeof r->ckpt_path, "%s", o->ckpt_out);
    if ((st = pt_checkpoint_save(r->ckpt_path, &r->gpt, &r->state)) != PT_OK) return st;
    if (r->lead && o->keep) ckpt_rotate(o->ckpt_out, o->keep, step + 1);
    if (r->lead && progress_history_write(&r->meter.hist) != PT_OK) /* the run goes on */
        fprintf(stderr, "warning: the loss history: %s\n", pt_last_error());
    if (last && r->lead)
        printf("checkpoint: %s (step %d); loss history: %s, %s\n", r->ckpt_path, step + 1,
               r->meter.hist.csv, r->meter.hist.svg);
    return PT_OK;
}

/* One step of the loop (r->step, 0-based): the batch, pt_gpt_step, the stop
   signal agreed by every rank, the trace, the guard's count, the progress
   line, validation and the checkpoint. */
static pt_status rank_step(rank_run *r) {
    run *o = r->o;
    int step = r->step, val_now;
    double t0 = pt_time_now();
    int last = step + 1 == o->steps || step + 1 == o->stop_after;
    int traced = o->trace_path && step + 1 == o->trace_step, j;
    double c0 = rank_comm_seconds(r);
    float mine[3];
    pt_status st;
    pt_loader_next(&r->train_ld, r->inputs, r->targets);
    r->sd.lr = pt_lr_at(&r->sched, step);
    r->sd.trace = traced ? &r->trace : NULL;
#ifdef PTRAIN_TEST_HOOKS
    if (r->world->rank == o->fail_rank && step + 1 == o->fail_step) /* planted bad data */
        r->inputs[(size_t)r->first * o->seq] = o->cfg.vocab_size;
    r->sd.on_grads = o->nan_step > 0 && step + 1 >= o->nan_step &&
                             step + 1 < o->nan_step + o->nan_count
                         ? plant_nan
                         : NULL;
    r->sd.on_grads_ctx = o;
#endif
    if ((st = pt_gpt_step(&r->gpt, &r->sd, &r->res)) != PT_OK) return st;
    /* every rank's signal, compute and wait seconds: all stop at the step
       after the largest signal number any rank saw; rank 0 watches for stragglers */
    mine[2] = (float)(rank_comm_seconds(r) - c0);
    mine[1] = (float)(pt_time_now() - t0) - mine[2];
    mine[0] = (float)stop_signal;
    if ((st = pt_comm_all_gather(r->world, mine, r->gath, 3)) != PT_OK) return st;
    for (j = 0, r->signaled = 0; j < r->world->size; j++)
        if ((int)r->gath[3 * j] > r->signaled) r->signaled = (int)r->gath[3 * j];
    train_strag_add(&r->strag, r->gath);
    if (r->signaled) last = 1;
    if (traced &&
        (st = progress_write_trace(&r->trace, r->world, o->trace_path, step + 1)) != PT_OK)
        return st;
    if (r->res.skipped) { /* a non-finite loss or gradient: no update on any rank */
        r->n_bad++;
        if (r->lead) train_report_skipped(o, step, &r->res, r->n_bad);
        if (r->n_bad >= o->max_bad) r->stopped = 1;
    } else {
        r->n_bad = 0;
        r->good_step = step + 1;
    }
    train_meter_step(&r->meter, step, t0, r->res.skipped ? NAN : r->res.loss);
    val_now = (step + 1) % o->eval_every == 0 || last;
    if (val_now)
        r->val = eval_loss(&r->gpt, &r->val_ld, o->eval_batches, r->inputs, r->targets, r->first,
                           r->rows);
    if (r->lead && (st = train_meter_report(&r->meter, step, last, r->val, val_now, r->sd.lr,
                                            r->res.grad_norm, &r->strag)) != PT_OK)
        return st;
    return rank_save(r, last);
}

/* After the loop: how it ended (a stop, --stop-after, or the whole run with
   its validation loss and the sample). */
static pt_status rank_end(rank_run *r) {
    run *o = r->o;
    if (r->signaled || r->stopped) {
        if (r->lead)
            train_report_stop(o, r->signaled, r->step, r->n_bad, r->good_step, r->res.bad_tensor,
                              r->ckpt_path);
        return PT_OK;
    }
    if (o->stop_after > 0 && o->stop_after < o->steps) {
        if (r->lead)
            printf("stopped after step %d of %d%s\n", o->stop_after, o->steps,
                   o->ckpt_out ? "; continue with --resume" : "");
        return PT_OK;
    }
    if (r->lead) { /* before the sample, which may gather the model whole */
        long kb = cli_peak_rss_kb();
        int here = r->world->kind == PT_COMM_MPI ? 1 : r->world->size;
        if (kb > 0)
            printf("\npeak resident memory: %.1f MiB in this process (%d rank%s; the memory "
                   "report: %.1f MiB a rank)\n", kb / 1024.0, here, here > 1 ? "s" : "",
                   (double)r->gpt.mem.total / 1048576.0);
    }
    if (r->lead && r->val == r->val)
        printf("\nvalidation loss %.3f nats/token vs unigram entropy %.3f nats/token (%.0f%% of "
               "it)\n",
               r->val, r->h_unigram, 100.0 * r->val / r->h_unigram);
    return sample_and_score(o, r->world, &r->gpt, &r->rng);
}

/* One rank's training: its part of the model, its dp share of each batch. */
static pt_status train_rank(pt_comm *world, void *arg) {
    rank_run *r = (rank_run *)calloc(1, sizeof(rank_run));
    run *o = (run *)arg;
    pt_status st = PT_OK;
    if (!r) return pt_comm_fail(world, pt_error(PT_ERR_OOM, "out of memory"));
    r->o = o, r->world = world, r->lead = world->rank == 0, r->rows = o->batch / o->dp;
    world->timeout = o->comm_timeout; /* the grid's groups inherit it */
    train_meter_init(&r->meter, o, r->lead);
    r->gath = (float *)malloc(sizeof(float) * 3 * (size_t)world->size);
    if (!r->gath) {
        st = pt_error(PT_ERR_OOM, "out of memory");
        goto fail;
    }
    if ((st = train_strag_init(&r->strag, world, r->lead)) != PT_OK ||
        (st = rank_model(r)) != PT_OK || (st = rank_data(r)) != PT_OK)
        goto fail;
    if (o->eval_only) {
        if ((st = rank_eval_only(r)) != PT_OK) goto fail;
        goto done;
    }
    if (r->lead)
        train_report_header(o, world, &r->gpt, r->desc.batch,
                            pt_gpt_flops_per_step(&o->cfg, o->batch, o->seq), r->val_ld.len,
                            r->h_unigram);
    rank_loop_start(r);
    for (r->step = r->good_step;
         r->step < o->steps && !(o->stop_after > 0 && r->step >= o->stop_after); r->step++) {
        if ((st = rank_step(r)) != PT_OK) goto fail;
        if (r->stopped || r->signaled) break;
    }
    if (r->lead) train_strag_table(&r->strag);
    if ((st = rank_end(r)) != PT_OK) goto fail;
    goto done;
fail:
    if (st != PT_ERR_COMM) st = pt_comm_fail(world, st);
done:
    if (r->lead) o->rc = st != PT_OK || r->stopped ? 1 : r->signaled ? 128 + r->signaled : 0;
    free(r->inputs);
    free(r->targets);
    free(r->gath);
    train_strag_free(&r->strag);
    pt_trace_free(&r->trace);
    train_meter_free(&r->meter);
    pt_loader_free(&r->train_ld);
    pt_loader_free(&r->val_ld);
    pt_gpt_free(&r->gpt);
    if (r->grid_ok) pt_grid_free(&r->grid);
    free(r);
    return st;
}

/* An integer from the environment, or fallback when unset or malformed. */
static int env_int(const char *name, int fallback) {
    const char *v = getenv(name);
    char *end;
    long x;
    if (!v || !*v) return fallback;
    x = strtol(v, &end, 10);
    return *end || x < 1 || x > 1 << 20 ? fallback : (int)x;
}

/* This process's threads and the peak MFU is measured against. Threads:
   --threads, else OMP_NUM_THREADS, else the node's cores shared by the
   node's MPI ranks (a single process: all of them; thread ranks split them
   in pt_comm_threads_run). The peak: --peak-gflops, else the instruction
   peak of one node's cores at the run's precision (fp32: FMA; bf16: the
   bf16 dot-product instructions; the ceiling of any GEMM), measured once per
   machine and kept (common/peak.h), with the sgemm GFLOP/s beside it,
   measured once per node (by its first rank, while the node's other ranks
   sleep rather than compete) and summed over the nodes. Where the CPU has no
   probe (not x86), the sgemm rate is the peak. Collective over world. */
static pt_status train_threads_and_peak(pt_comm *world, run *o, const train_args *a) {
    int mpi = world->kind == PT_COMM_MPI, cores = pt_get_threads();
    int local_size = 1, local_rank = 0, threads;
    float peak[4] = {0.0f, 0.0f, 0.0f, 0.0f}; /* instruction peak, sgemm, loaded, kept */
    peak_info pi;
    pt_status st = PT_OK;
#ifdef _OPENMP
    cores = omp_get_num_procs();
#endif
    if (mpi) { /* Open MPI's names, then MPICH's; else one node */
        local_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", env_int("MPI_LOCALNRANKS", world->size));
        local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", -1);
        if (local_rank < 0) local_rank = env_int("MPI_LOCALRANKID", -1);
        if (local_rank < 0) local_rank = world->rank % local_size;
    }
    threads = a->threads ? a->threads
                         : env_int("OMP_NUM_THREADS", cores / local_size > 0 ? cores / local_size : 1);
    o->nodes = world->size / local_size > 0 ? world->size / local_size : 1;
    memset(&pi, 0, sizeof pi);
    if (o->eval_only) { /* no MFU: nothing to measure */
    } else if ((o->peak_given = a->peak > 0.0f)) {
        o->peak = (double)a->peak;
    } else {
        if (!mpi || local_rank == 0) { /* thread ranks share the whole machine; one rank has
                                          its threads */
            pt_set_threads(mpi || o->tp * o->cp * o->dp * o->pp > 1 ? 0 : threads);
            peak_instr(o->precision == PT_PRECISION_BF16, a->measure_peak, cores, &pi);
            peak[0] = (float)pi.gflops, peak[2] = (float)pi.loaded, peak[3] = (float)pi.cached;
            { /* the run's GEMM, at its precision */
                pt_ctx ctx;
                pt_ctx_desc cd = {0};
                cd.precision = o->precision;
                if ((st = pt_ctx_init(&ctx, &cd)) == PT_OK)
                    peak[1] = (float)pt_gemm_peak_gflops(&ctx, 1024, 0.25);
                pt_ctx_free(&ctx);
            }
        } else { /* 0.5 s of measuring and a warm-up: waiting in MPI would spin */
            struct timespec ts = {0, 700000000L};
            nanosleep(&ts, NULL);
        }
        if (mpi) st = pt_comm_all_reduce(world, peak, 4, PT_REDUCE_SUM);
        o->gemm_peak = (double)peak[1];
        o->peak = peak[0] > 0.0f ? (double)peak[0] : (double)peak[1];
        o->peak_instr = peak[0] > 0.0f;
        o->peak_loaded = peak[2] > 0.0f;
        o->peak_cached = (int)peak[3] == o->nodes;
        o->peak_share = pi.share, o->peak_load1 = pi.load1;
        snprintf(o->peak_when, sizeof o->peak_when, "%s", pi.when);
    }
    pt_set_threads(threads);
    return st;
}

/* Ctrl-C or SIGTERM while world rank 0 tokenizes: say what was interrupted,
   remove a half-written cache (the cache is written to PATH.tmp and renamed:
   a kill leaves at most that) and end. The message is made before. */
static char tokenize_msg[8400];
static size_t tokenize_msg_len;
static char tokenize_tmp[4200];

static void on_tokenize_signal(int sig) {
    if (write(STDERR_FILENO, tokenize_msg, tokenize_msg_len) < 0) { /* nothing to do */
    }
    if (tokenize_tmp[0]) unlink(tokenize_tmp);
    _exit(128 + sig);
}

/* Installs (path: the text) or removes (NULL) the handler above. */
static void tokenize_signals(const char *path, const char *cache) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = SIG_DFL;
    if (path) {
        snprintf(tokenize_msg, sizeof tokenize_msg, "\ninterrupted while tokenizing %s: no "
                 "training started and no token cache written (the next run tokenizes it "
                 "again)\n", path);
        tokenize_msg_len = strlen(tokenize_msg);
        snprintf(tokenize_tmp, sizeof tokenize_tmp, "%s.tmp", cache ? cache : "");
        if (!cache) tokenize_tmp[0] = 0;
        sa.sa_handler = on_tokenize_signal;
    }
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

/* Where the tokens of the text at path are kept: DIR/NAME.tokens.bin with
   --token-cache DIR, else PATH.tokens.bin beside it. 0 if too long. */
static int text_cache_path(const run *o, const char *path, char *buf, size_t n) {
    const char *slash = strrchr(path, '/'), *name = slash ? slash + 1 : path;
    int k = o->token_cache ? snprintf(buf, n, "%s/%s.tokens.bin", o->token_cache, name)
                           : snprintf(buf, n, "%s.tokens.bin", path);
    return k > 0 && (size_t)k < n;
}

/* What world rank 0 did with the cache of path. */
static void text_cache_report(const char *path, const char *cache, pt_text_cache how, int err) {
    FILE *f;
    if (how == PT_CACHE_READ) printf("tokens of %s read from %s\n", path, cache);
    else if (how == PT_CACHE_REMADE)
        printf("%s was of another text or tokenizer: tokenized %s anew\n", cache, path);
    else if (how == PT_CACHE_MADE) printf("tokenized %s into %s\n", path, cache);
    else {
        int stale = (f = fopen(cache, "rb")) != NULL;
        if (f) fclose(f);
        printf("tokenized %s without a cache: %s %s (%s), so each run tokenizes it again; "
               "--token-cache DIR keeps the tokens elsewhere\n", path, cache,
               stale ? "is of another text or tokenizer and cannot be rewritten"
                     : "cannot be written",
               strerror(err));
    }
}

/* --data or --val-data through --tokenizer: the text tokenized once into its
   cache (text_cache_path), which later runs read (a cache of another text or
   tokenizer is rewritten; where it cannot be written, the text is tokenized
   without one). World rank 0 makes it, with a progress line; under MPI the
   others read it. */
static pt_status load_text(pt_comm *world, const run *o, const char *path, pt_tokens *t) {
    char cache[4096];
    pt_text_desc d;
    progress_bytes pr;
    pt_status st = PT_OK;
    int ok = 1, err = 0;
    if (!text_cache_path(o, path, cache, sizeof cache))
        return pt_error(PT_ERR_INVALID_ARG, "the path %s is too long", path);
    memset(&d, 0, sizeof d);
    d.cache_path = cache;
    if (world->rank != 0) d.cache_read_only = 1; /* the others read what rank 0 made */
    else if (!o->token_cache && (err = cli_writable(cache)) != 0) d.cache_read_only = 1;
    if (world->rank == 0) {
        char what[4200];
        snprintf(what, sizeof what, "tokenizing %s", path);
        progress_bytes_start(&pr, what);
        d.progress = progress_bytes_cb, d.progress_ctx = &pr;
        tokenize_signals(path, d.cache_read_only ? NULL : cache);
        ok = (st = pt_tokens_from_text(t, o->tk, path, &d)) == PT_OK;
        tokenize_signals(NULL, NULL);
        if (ok) text_cache_report(path, cache, t->cache, err);
        d.progress = NULL;
    }
    if (world->size > 1) {
        pt_status sh = cli_world_share(world, &ok);
        if (sh != PT_OK) return sh;
        if (!ok) return world->rank == 0 ? st : pt_error(PT_ERR_IO, "rank 0 could not read %s", path);
        if (world->rank != 0) st = pt_tokens_from_text(t, o->tk, path, &d);
    }
    return st;
}

/* What main holds: the options, the data, the tokenizer, the world. */
typedef struct train_main {
    run o;
    train_args a;
    pt_tokens tok, val_tok;
    pt_tokenizer tk;
    char *corpus; /* the embedded task's text */
    pt_comm world;
    int configured; /* o.cfg is set (from --resume's or --init-from's file) */
    char latest[4096];  /* --resume latest's file */
    char dir_tok[4200]; /* --init-from DIR's tokenizer.json */
} train_main;

/* pt_last_error() as the error of this process (every rank's own); under
   MPI the job ends. 1, the exit status. */
static int main_fail(train_main *m, pt_status st) {
    fprintf(stderr, "error: %s\n", pt_last_error());
    if (m->world.kind == PT_COMM_MPI && st != PT_ERR_COMM) pt_comm_fail(&m->world, st);
    return 1;
}

/* An error world rank 0 prints; returns code. */
#define MAIN_REFUSE(m, code, ...)                                                              \
    ((m)->world.rank == 0 ? (fprintf(stderr, "error: " __VA_ARGS__), fprintf(stderr, "\n")) : 0, \
     (code))

/* --resume latest: the newest of --checkpoint's that loads, or a fresh start.
   -1 to go on, else the exit status. */
static int main_resume_latest(train_main *m) {
    int found;
    if (!m->o.resume || strcmp(m->o.resume, "latest") != 0) return -1;
    found = ckpt_latest(m->o.ckpt_out, m->latest, sizeof m->latest, m->world.rank == 0);
    if (found < 0)
        return MAIN_REFUSE(m, 1, "--resume latest: no checkpoint of %s loads; remove the "
                           "damaged ones to start fresh", m->o.ckpt_out);
    if (m->world.rank == 0 && !found)
        printf("no checkpoint at %s yet: starting fresh\n", m->o.ckpt_out);
    m->o.resume = found ? m->latest : NULL;
    return -1;
}

/* --init-from DIR with a tokenizer.json and text data: that tokenizer reads
   the data (the data is text unless --data-format or an llm.c .bin file says
   otherwise). */
static void main_default_tokenizer(train_main *m, int argc, char **argv) {
    run *o = &m->o;
    const char *d = o->data_path, *v = o->val_path;
    size_t dl = d ? strlen(d) : 0, vl = v ? strlen(v) : 0;
    int tokens = (dl >= 4 && strcmp(d + dl - 4, ".bin") == 0) ||
                 (vl >= 4 && strcmp(v + vl - 4, ".bin") == 0); /* llm.c token files */
    if (o->tok_path || !o->init_from || (!d && !v) || cli_given(argc, argv, "data-format") ||
        tokens || !cli_model_tokenizer(o->init_from, m->dir_tok, sizeof m->dir_tok))
        return;
    o->tok_path = m->dir_tok;
}

/* What the run will write, checked before any work: --checkpoint (and that
   a new run does not replace another run's file) and --token-cache. -1 to
   go on, else the exit status (2: a usage error, 1: a path). */
static int main_outputs(train_main *m) {
    run *o = &m->o;
    int verdict = 0;
    pt_status st;
    if (o->token_cache && !o->tok_path)
        return MAIN_REFUSE(m, 2, "--token-cache keeps the tokens of text read through "
                           "--tokenizer: give --tokenizer");
    if (m->world.rank == 0) {
        char cache[4096];
        if (o->ckpt_out)
            verdict = !o->resume && !o->keep && !ckpt_fresh_ok(o->ckpt_out, o->force) ? 2
                      : !ckpt_probe(o->ckpt_out)                                  ? 1
                                                                                  : 0;
        if (!verdict && o->token_cache && !cli_is_dir(o->token_cache)) {
            FILE *f = fopen(o->token_cache, "rb");
            fprintf(stderr, "error: --token-cache %s %s\n", o->token_cache,
                    f ? "is a file, not a directory" : "is no directory: make it first");
            if (f) fclose(f);
            verdict = 1;
        }
        if (!verdict && o->token_cache && o->data_path &&
            (!text_cache_path(o, o->data_path, cache, sizeof cache) ||
             !cli_probe_write("--token-cache", cache, "tokenizing")))
            verdict = 1;
        if (!verdict && o->token_cache && o->val_path &&
            (!text_cache_path(o, o->val_path, cache, sizeof cache) ||
             !cli_probe_write("--token-cache", cache, "tokenizing")))
            verdict = 1;
    }
    if ((st = cli_world_share(&m->world, &verdict)) != PT_OK) return main_fail(m, st);
    return verdict ? verdict : -1;
}

/* --resume's or --init-from's model, checked against the options before
   anything else (whatever the steps); a resume already at --steps has
   nothing to train. -1 to go on, else the exit status. */
static int main_file_model(train_main *m) {
    run *o = &m->o;
    long long at;
    pt_status st;
    if (!o->resume && !o->init_from) return -1;
    if ((st = train_config(o, &m->a, 0)) != PT_OK) return main_fail(m, st);
    m->configured = 1;
    if (!o->resume || o->eval_only) return -1;
    if ((at = ckpt_file_step(o->resume)) < 0) return main_fail(m, PT_ERR_FORMAT);
    if (at < o->steps) return -1;
    if (m->world.rank == 0) /* a finished run: nothing to train, and no header */
        printf("%s is at step %lld, already at or past --steps %d: nothing to train (a larger "
               "--steps continues it)\n", o->resume, at, o->steps);
    return 0;
}

/* One data file: text through the tokenizer, else token data. */
static pt_status main_load(train_main *m, const char *path, pt_tokens *t) {
    return m->o.tk ? load_text(&m->world, &m->o, path, t) : pt_tokens_load(t, path, m->a.fmt);
}

/* The tokenizer, --data (else the embedded task) and --val-data. -1 to go
   on, else the exit status. */
static int main_data(train_main *m) {
    run *o = &m->o;
    pt_status st;
    if (o->tok_path) {
        if ((st = pt_tokenizer_load(&m->tk, o->tok_path)) != PT_OK) return main_fail(m, st);
        if (m->world.rank == 0)
            printf("tokenizer: %s, %d ids%s\n", o->tok_path, m->tk.n_vocab,
                   o->tok_path == m->dir_tok ? " (--init-from's; --tokenizer names another)" : "");
        o->tk = &m->tk;
    }
    /* data: every rank needs all of it (each process loads it under MPI) */
    if (o->data_path) {
        if ((st = main_load(m, o->data_path, &m->tok)) != PT_OK) return main_fail(m, st);
        if (m->tok.n == 0)
            return MAIN_REFUSE(m, 1, "--data %s holds no tokens: an empty file", o->data_path);
        if (m->world.rank == 0)
            printf("data: %s, %zu tokens, vocabulary %d\n", o->data_path, m->tok.n,
                   m->tok.vocab_size);
    } else {
        size_t n = 1 << 21;
        const char *from, *to;
        int k;
        m->corpus = task_corpus(n, 20240520);
        if (!m->corpus || (st = pt_tokens_from_bytes(&m->tok, m->corpus, n)) != PT_OK)
            return main_fail(m, m->corpus ? st : pt_error(PT_ERR_OOM, "out of memory"));
        from = strchr(m->corpus, '\n') + 1, to = from;
        for (k = 0; k < 5; k++) to = strchr(to, '\n') + 1;
        if (m->world.rank == 0)
            printf("data: embedded task (additions and sentences), %zu bytes, e.g.\n%.*s", n,
                   (int)(to - from), from);
    }
    if (o->val_path) {
        if ((st = main_load(m, o->val_path, &m->val_tok)) != PT_OK) return main_fail(m, st);
        if (m->val_tok.n == 0)
            return MAIN_REFUSE(m, 1, "--val-data %s holds no tokens: an empty file", o->val_path);
        if (m->world.rank == 0)
            printf("validation data: %s, %zu tokens\n", o->val_path, m->val_tok.n);
        o->val_tok = &m->val_tok;
    }
    return -1;
}

/* The model (from the checkpoint when resuming, --init-from's file, else the
   preset with the overrides) against the data, the tokenizer and the step
   files already there. -1 to go on, else the exit status. */
static int main_model(train_main *m) {
    run *o = &m->o;
    pt_status st;
    double mib;
    if (!m->configured && (st = train_config(o, &m->a, m->tok.vocab_size)) != PT_OK)
        return main_fail(m, st);
    mib = 4.0 * (double)pt_gpt_num_params(&o->cfg) / 1048576.0;
    if ((double)o->bucket_mb > mib)
        return MAIN_REFUSE(m, 2, "--bucket-mb %g is more than the model's %.2f MiB of parameters",
                           (double)o->bucket_mb, mib);
    if (o->tk && m->tk.n_vocab > o->cfg.vocab_size)
        return MAIN_REFUSE(m, 2, "the tokenizer %s has %d ids but the model's vocab_size is %d: "
                           "not this model's tokenizer", o->tok_path, m->tk.n_vocab,
                           o->cfg.vocab_size);
    if (!(o->eval_only && o->val_tok) && /* else only --val-data is read */
        (st = pt_tokens_check(&m->tok, o->cfg.vocab_size)) != PT_OK)
        return main_fail(m, st);
    if (o->val_tok && pt_tokens_check(&m->val_tok, o->cfg.vocab_size) != PT_OK) {
        fprintf(stderr, "error: --val-data %s: %s\n", o->val_path, pt_last_error());
        return 1;
    }
    if (o->keep && o->resume != m->latest) { /* step files beyond the start belong to another
                                                run: never mix them */
        long long steps[CKPT_MAX], start = o->resume ? ckpt_file_step(o->resume) : 0;
        if (start < 0) return main_fail(m, PT_ERR_FORMAT);
        if (ckpt_list(o->ckpt_out, 0, steps, CKPT_MAX) > 0 && steps[0] > start) {
            ckpt_step_path(m->latest, sizeof m->latest, o->ckpt_out, steps[0]);
            return MAIN_REFUSE(m, 2, "%s is newer than this run's start (step %lld): continue it "
                               "with --resume latest, or remove it", m->latest, start);
        }
    }
    return -1;
}

/* The threads, the peak, the stop signals, and every rank's training. */
static int main_train(train_main *m) {
    struct sigaction sa;
    pt_status st;
    if ((st = train_threads_and_peak(&m->world, &m->o, &m->a)) != PT_OK) return main_fail(m, st);
    m->o.tok = &m->tok;
    m->o.rc = 1;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    st = cli_world_run(&m->world, m->o.tp * m->o.cp * m->o.dp * m->o.pp, train_rank, &m->o);
    if (st == PT_OK) st = cli_world_share(&m->world, &m->o.rc);
    return st != PT_OK ? main_fail(m, st) : m->o.rc;
}

int main(int argc, char **argv) {
    train_main *m = (train_main *)calloc(1, sizeof(train_main));
    int rc;
    if (!m) return 1;
    if (!cli_world_begin(&m->world, &argc, &argv)) {
        free(m);
        return 2;
    }
    if ((rc = train_options(argc, argv, &m->o, &m->a, m->world.rank == 0)) < 0) {
        m->world.timeout = m->o.comm_timeout;
        main_default_tokenizer(m, argc, argv);
        if ((rc = main_resume_latest(m)) < 0 && (rc = main_outputs(m)) < 0 &&
            (rc = main_file_model(m)) < 0 && (rc = main_data(m)) < 0 && (rc = main_model(m)) < 0)
            rc = main_train(m);
    }
    free(m->corpus);
    pt_tokens_free(&m->tok);
    pt_tokens_free(&m->val_tok);
    pt_tokenizer_free(&m->tk);
    cli_world_end(&m->world);
    free(m);
    return rc;
}
