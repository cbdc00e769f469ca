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
    if (world->size > 1) {
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

/* One rank's training: its part of the model, its dp share of each batch.
   World rank 0 prints. */
static pt_status train_rank(pt_comm *world, void *arg) {
    run *o = (run *)arg;
    int lead = world->rank == 0, step, grid_ok = 0, rows = o->batch / o->dp, first = 0;
    pt_grid grid;
    pt_loader train_ld, val_ld;
    pt_loader_desc ld;
    pt_gpt gpt;
    pt_gpt_desc desc;
    pt_adamw_config opt;
    pt_lr_schedule sched;
    pt_train_state state;
    pt_step_desc sd;
    pt_step_result res;
    pt_rng rng;
    pt_trace trace;
    int *inputs = NULL, *targets = NULL;
    int n_bad = 0, stopped = 0, good_step; /* steps skipped in a row; the last good one */
    int signaled = 0; /* SIGINT or SIGTERM on some rank: the step after which all stop */
    int val_now;
    char ckpt_path[4096] = "";
    double val = NAN, h_unigram;
    train_meter meter; /* the progress line and the loss history (rank 0's) */
    pt_status st = PT_OK;

    memset(&train_ld, 0, sizeof train_ld);
    memset(&val_ld, 0, sizeof val_ld);
    memset(&trace, 0, sizeof trace);
    memset(&gpt, 0, sizeof gpt);
    memset(&state, 0, sizeof state);
    train_meter_init(&meter, o, lead);
    if ((st = pt_grid_init(&grid, world, o->tp, o->dp, o->pp)) != PT_OK) goto fail;
    grid_ok = 1;
    first = grid.dp_rank * rows;
    memset(&desc, 0, sizeof desc);
    desc.config = o->cfg;
    desc.batch = rows / o->accum; /* a micro-batch's rows */
    desc.seq = o->seq;
    desc.grid = world->size > 1 ? &grid : NULL;
    desc.zero = o->zero;
    desc.grad_accum = o->accum;
    desc.schedule = o->schedule;
    desc.chunks = o->chunks;
    desc.recompute = o->recompute;
    desc.precision = o->precision;
    desc.bucket_bytes = (size_t)((double)o->bucket_mb * 1048576.0);
    if ((st = pt_gpt_init(&gpt, &desc)) != PT_OK) goto fail;
    pt_gpt_init_weights(&gpt, o->seed);
    if (o->init_from) {
        if ((st = pt_gpt_load_weights(&gpt, o->init_from)) != PT_OK) goto fail;
        if (lead) printf("weights from %s (a fresh AdamW)\n", o->init_from);
    }

    /* every rank draws the same batches and takes its rows */
    memset(&ld, 0, sizeof ld);
    ld.batch = o->batch;
    ld.seq = o->seq;
    ld.seed = o->seed;
    ld.val_fraction = o->val_fraction;
    if (o->val_tok) { /* all of --data trains; --val-data validates, in its order */
        pt_loader_desc vd = ld;
        vd.no_shuffle = 1;
        if ((st = pt_loader_init(&train_ld, o->tok, PT_SPLIT_ALL, &ld)) != PT_OK ||
            (st = pt_loader_init(&val_ld, o->val_tok, PT_SPLIT_ALL, &vd)) != PT_OK)
            goto fail;
    } else if ((st = pt_loader_init(&train_ld, o->tok, PT_SPLIT_TRAIN, &ld)) != PT_OK ||
               (st = pt_loader_init(&val_ld, o->tok, PT_SPLIT_VAL, &ld)) != PT_OK) {
        goto fail;
    }
    pt_rng_seed(&rng, o->seed ^ 0x5EED5EEDull);
    if (o->resume) {
        if ((st = pt_checkpoint_load(o->resume, &gpt, &state)) != PT_OK) goto fail;
        pt_loader_seek(&train_ld, state.data_epoch, (size_t)state.data_pos);
        rng.state = state.rng_state;
        if (lead)
            printf("resumed from %s at step %lld%s\n", o->resume, (long long)state.step,
                   state.checksummed ? "" : " (it has no checksums: not verified)");
        progress_history_load(&meter.hist, state.step);
    }
    inputs = (int *)malloc(sizeof(int) * (size_t)o->batch * o->seq);
    targets = (int *)malloc(sizeof(int) * (size_t)o->batch * o->seq);
    if (!inputs || !targets) {
        st = pt_error(PT_ERR_OOM, "out of memory for the batch");
        goto fail;
    }
#ifdef PTRAIN_TEST_HOOKS
    if (o->nan_step > 0) { /* the planted NaN needs a tensor some rank holds */
        int none = 0;
        if ((st = pt_comm_all_ok(world, !pt_gpt_find_param(&gpt, o->nan_tensor), &none)) !=
            PT_OK)
            goto fail;
        if (none) {
            st = pt_error(PT_ERR_CONFIG, "--debug-nan-tensor '%s' is no tensor of this model",
                          o->nan_tensor);
            goto fail;
        }
    }
#endif

    h_unigram = pt_tokens_unigram_entropy(o->val_tok ? o->val_tok : o->tok, val_ld.begin,
                                          val_ld.begin + val_ld.len);
    if (o->eval_only) { /* every whole batch of the validation tokens, or --eval-batches */
        int batches = (int)(val_ld.n_windows / (size_t)o->batch);
        if (o->eval_batches_given || batches < 1) batches = o->eval_batches;
        val = eval_loss(&gpt, &val_ld, batches, inputs, targets, first, rows);
        if (val != val) {
            st = pt_error(PT_ERR_INVALID_ARG, "evaluation failed: %s", pt_last_error());
            goto fail;
        }
        if (lead)
            printf("eval: %s on %s: %d batches of %d x %d tokens: loss %.4f nats/token, "
                   "perplexity %.3f (unigram entropy %.3f)\n",
                   o->init_from ? o->init_from : o->resume,
                   o->val_path ? o->val_path : o->data_path ? "--data's held-out part"
                                                            : "the embedded task's held-out part",
                   batches, o->batch, o->seq, val, exp(val), h_unigram);
        goto done;
    }
    if (lead)
        train_report_header(o, world, &gpt, desc.batch,
                            pt_gpt_flops_per_step(&o->cfg, o->batch, o->seq), val_ld.len,
                            h_unigram);

    opt = pt_adamw_default();
    opt.weight_decay = o->wd;
    sched.lr = o->lr;
    sched.min_lr = o->min_lr;
    sched.warmup_steps = o->warmup;
    sched.total_steps = o->steps;
    memset(&sd, 0, sizeof sd);
    sd.inputs = inputs + (size_t)first * o->seq;
    sd.targets = targets + (size_t)first * o->seq;
    sd.B = rows, sd.T = o->seq;
    sd.adamw = &opt;
    sd.clip = o->clip;
    sd.overlap = o->overlap;
    good_step = (int)state.step;
    train_meter_start(&meter, good_step);
    for (step = good_step;
         step < o->steps && !(o->stop_after > 0 && step >= o->stop_after); step++) {
        double t0 = pt_time_now();
        int last = step + 1 == o->steps || step + 1 == o->stop_after;
        int traced = o->trace_path && step + 1 == o->trace_step;
        pt_loader_next(&train_ld, inputs, targets);
        sd.lr = pt_lr_at(&sched, step);
        sd.trace = traced ? &trace : NULL;
#ifdef PTRAIN_TEST_HOOKS
        if (world->rank == o->fail_rank && step + 1 == o->fail_step) /* planted bad data */
            inputs[(size_t)first * o->seq] = o->cfg.vocab_size;
        sd.on_grads = o->nan_step > 0 && step + 1 >= o->nan_step &&
                              step + 1 < o->nan_step + o->nan_count
                          ? plant_nan
                          : NULL;
        sd.on_grads_ctx = o;
#endif
        if ((st = pt_gpt_step(&gpt, &sd, &res)) != PT_OK) goto fail;
        { /* the largest signal number any rank saw: every rank stops at this step */
            float sig = (float)stop_signal;
            if ((st = pt_comm_all_reduce(world, &sig, 1, PT_REDUCE_MAX)) != PT_OK) goto fail;
            signaled = (int)sig;
            if (signaled) last = 1;
        }
        if (traced && (st = progress_write_trace(&trace, world, o->trace_path, step + 1)) != PT_OK)
            goto fail;
        if (res.skipped) { /* a non-finite loss or gradient: no update on any rank */
            n_bad++;
            if (lead) train_report_skipped(o, step, &res, n_bad);
            if (n_bad >= o->max_bad) stopped = 1;
        } else {
            n_bad = 0;
            good_step = step + 1;
        }
        train_meter_step(&meter, step, t0, res.skipped ? NAN : res.loss);
        val_now = (step + 1) % o->eval_every == 0 || last;
        if (val_now) val = eval_loss(&gpt, &val_ld, o->eval_batches, inputs, targets, first, rows);
        if (lead && (st = train_meter_report(&meter, step, last, val, val_now, sd.lr,
                                             res.grad_norm)) != PT_OK)
            goto fail;
        /* a stop saves too: the weights and AdamW state of the last good step,
           the data position after the skipped batches */
        if (o->ckpt_out &&
            ((o->ckpt_every > 0 && (step + 1) % o->ckpt_every == 0) || last || stopped)) {
            state.step = step + 1;
            state.data_epoch = train_ld.epoch;
            state.data_pos = train_ld.pos;
            state.rng_state = rng.state;
            if (o->keep) ckpt_step_path(ckpt_path, sizeof ckpt_path, o->ckpt_out, step + 1);
            else snprintf(ckpt_path, sizeof ckpt_path, "%s", o->ckpt_out);
            if ((st = pt_checkpoint_save(ckpt_path, &gpt, &state)) != PT_OK) goto fail;
            if (lead && o->keep) ckpt_rotate(o->ckpt_out, o->keep, step + 1);
            if (lead && progress_history_write(&meter.hist) != PT_OK) /* the run goes on */
                fprintf(stderr, "warning: the loss history: %s\n", pt_last_error());
            if (last && lead)
                printf("checkpoint: %s (step %d); loss history: %s, %s\n", ckpt_path, step + 1,
                       meter.hist.csv, meter.hist.svg);
        }
        if (stopped || signaled) break;
    }
    if (signaled || stopped) {
        if (lead) train_report_stop(o, signaled, step, n_bad, good_step, res.bad_tensor, ckpt_path);
        goto done;
    }
    if (o->stop_after > 0 && o->stop_after < o->steps) {
        if (lead)
            printf("stopped after step %d of %d%s\n", o->stop_after, o->steps,
                   o->ckpt_out ? "; continue with --resume" : "");
        goto done;
    }
    if (lead && val == val)
        printf("\nvalidation loss %.3f nats/token vs unigram entropy %.3f nats/token (%.0f%% of "
               "it)\n",
               val, h_unigram, 100.0 * val / h_unigram);
    if ((st = sample_and_score(o, world, &gpt, &rng)) != PT_OK) goto fail;
    goto done;
fail:
    if (st != PT_ERR_COMM) st = pt_comm_fail(world, st);
done:
    if (lead) o->rc = st != PT_OK || stopped ? 1 : signaled ? 128 + signaled : 0;
    free(inputs);
    free(targets);
    pt_trace_free(&trace);
    train_meter_free(&meter);
    pt_loader_free(&train_ld);
    pt_loader_free(&val_ld);
    pt_gpt_free(&gpt);
    if (grid_ok) pt_grid_free(&grid);
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
   bf16 dot-product instructions; the ceiling of any GEMM), with the
   sgemm GFLOP/s beside it, measured once per node (by its first rank, while
   the node's other ranks sleep rather than compete) and summed over the
   nodes. Where the CPU has no probe (not x86), the sgemm rate is the peak.
   Collective over world. */
static pt_status train_threads_and_peak(pt_comm *world, run *o, const train_args *a) {
    int mpi = world->kind == PT_COMM_MPI, cores = pt_get_threads();
    int local_size = 1, local_rank = 0, threads;
    float peak[2] = {0.0f, 0.0f}; /* instruction peak, sgemm */
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
    if ((o->peak_given = a->peak > 0.0f)) {
        o->peak = (double)a->peak;
    } else {
        if (!mpi || local_rank == 0) { /* thread ranks share the whole machine; one rank has
                                          its threads */
            pt_set_threads(mpi || o->tp * o->dp * o->pp > 1 ? 0 : threads);
            peak[0] = (float)pt_instr_peak_gflops(o->precision == PT_PRECISION_BF16, 0.25);
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
        if (mpi) st = pt_comm_all_reduce(world, peak, 2, PT_REDUCE_SUM);
        o->gemm_peak = (double)peak[1];
        o->peak = peak[0] > 0.0f ? (double)peak[0] : (double)peak[1];
        o->peak_instr = peak[0] > 0.0f;
    }
    pt_set_threads(threads);
    return st;
}

/* --data or --val-data through --tokenizer: the text tokenized once into
   PATH.tokens.bin, which later runs read (a cache of another text or
   tokenizer is rewritten). World rank 0 makes it; under MPI the others read it. */
static pt_status load_text(pt_comm *world, const pt_tokenizer *tk, const char *path,
                           pt_tokens *t) {
    char cache[4096];
    pt_status st = PT_OK;
    int ok = 1;
    if (snprintf(cache, sizeof cache, "%s.tokens.bin", path) >= (int)sizeof cache)
        return pt_error(PT_ERR_INVALID_ARG, "the path %s is too long", path);
    if (world->rank == 0) {
        ok = (st = pt_tokens_from_text(t, tk, path, cache, 0)) == PT_OK;
        if (ok && t->cache == PT_CACHE_READ)
            printf("tokens of %s read from %s\n", path, cache);
        else if (ok && t->cache == PT_CACHE_REMADE)
            printf("%s was of another text or tokenizer: tokenized %s anew\n", cache, path);
        else if (ok)
            printf("tokenized %s into %s\n", path, cache);
    }
    if (world->size > 1) {
        pt_status sh = cli_world_share(world, &ok);
        if (sh != PT_OK) return sh;
        if (!ok) return world->rank == 0 ? st : pt_error(PT_ERR_IO, "rank 0 could not read %s", path);
        if (world->rank != 0) st = pt_tokens_from_text(t, tk, path, cache, 0);
    }
    return st;
}

int main(int argc, char **argv) {
    run o;
    train_args a;
    pt_tokens tok, val_tok;
    pt_tokenizer tk;
    char *corpus = NULL;
    pt_comm world;
    pt_status st = PT_OK;
    int rc = 1, mpi = 0;
    char latest[4096];

    memset(&tok, 0, sizeof tok);
    memset(&val_tok, 0, sizeof val_tok);
    memset(&tk, 0, sizeof tk);
    if (!cli_world_begin(&world, &argc, &argv)) return 2;
    mpi = world.kind == PT_COMM_MPI;
    if ((rc = train_options(argc, argv, &o, &a, world.rank == 0)) >= 0) goto out;
    rc = 1;
    if (o.resume && strcmp(o.resume, "latest") == 0) {
        int found = ckpt_latest(o.ckpt_out, latest, sizeof latest, world.rank == 0);
        if (found < 0) {
            if (world.rank == 0)
                fprintf(stderr, "error: --resume latest: no checkpoint of %s loads; remove the "
                        "damaged ones to start fresh\n", o.ckpt_out);
            goto out;
        }
        if (world.rank == 0 && !found)
            printf("no checkpoint at %s yet: starting fresh\n", o.ckpt_out);
        o.resume = found ? latest : NULL;
    }

    if (o.ckpt_out) { /* found out now, not after the run; world rank 0 writes. 2: a
                         usage error (replacing another run's file), 1: the path */
        int verdict = 0;
        if (world.rank == 0)
            verdict = !o.resume && !o.keep && !ckpt_fresh_ok(o.ckpt_out, o.force) ? 2
                      : !ckpt_probe(o.ckpt_out)                                  ? 1
                                                                                 : 0;
        if ((st = cli_world_share(&world, &verdict)) != PT_OK) goto fail;
        if (verdict) {
            rc = verdict;
            goto out;
        }
    }

    if (o.resume && !o.eval_only) { /* a finished run: nothing to train, and no header */
        long long at = ckpt_file_step(o.resume);
        if (at < 0) goto fail;
        if (at >= o.steps) {
            if (world.rank == 0)
                printf("%s is at step %lld, already at or past --steps %d: nothing to train "
                       "(a larger --steps continues it)\n", o.resume, at, o.steps);
            rc = 0;
            goto out;
        }
    }

    if (o.tok_path) {
        if ((st = pt_tokenizer_load(&tk, o.tok_path)) != PT_OK) goto fail;
        if (world.rank == 0)
            printf("tokenizer: %s, %d ids\n", o.tok_path, tk.n_vocab);
        o.tk = &tk;
    }
    /* data: every rank needs all of it (each process loads it under MPI) */
    if (o.data_path) {
        if ((st = o.tk ? load_text(&world, &tk, o.data_path, &tok)
                       : pt_tokens_load(&tok, o.data_path, a.fmt)) != PT_OK)
            goto fail;
        if (world.rank == 0)
            printf("data: %s, %zu tokens, vocabulary %d\n", o.data_path, tok.n, tok.vocab_size);
    } else {
        size_t n = 1 << 21;
        const char *from, *to;
        int k;
        corpus = task_corpus(n, 20240520);
        if (!corpus || (st = pt_tokens_from_bytes(&tok, corpus, n)) != PT_OK) goto fail;
        from = strchr(corpus, '\n') + 1, to = from;
        for (k = 0; k < 5; k++) to = strchr(to, '\n') + 1;
        if (world.rank == 0)
            printf("data: embedded task (additions and sentences), %zu bytes, e.g.\n%.*s", n,
                   (int)(to - from), from);
    }

    if (o.val_path) {
        if ((st = o.tk ? load_text(&world, &tk, o.val_path, &val_tok)
                       : pt_tokens_load(&val_tok, o.val_path, a.fmt)) != PT_OK)
            goto fail;
        if (world.rank == 0)
            printf("validation data: %s, %zu tokens\n", o.val_path, val_tok.n);
        o.val_tok = &val_tok;
    }

    /* model: from the checkpoint when resuming, --init-from's file, else preset + overrides */
    if ((st = train_config(&o, &a, tok.vocab_size)) != PT_OK) goto fail;
    if ((double)o.bucket_mb * 1048576.0 > 4.0 * (double)pt_gpt_num_params(&o.cfg)) {
        if (world.rank == 0)
            fprintf(stderr, "error: --bucket-mb %g is more than the model's %.2f MiB of "
                            "parameters\n", (double)o.bucket_mb,
                    4.0 * (double)pt_gpt_num_params(&o.cfg) / 1048576.0);
        rc = 2;
        goto out;
    }
    if (o.tk && tk.n_vocab > o.cfg.vocab_size) {
        if (world.rank == 0)
            fprintf(stderr, "error: the tokenizer %s has %d ids but the model's vocab_size is %d: "
                            "not this model's tokenizer\n", o.tok_path, tk.n_vocab,
                    o.cfg.vocab_size);
        rc = 2;
        goto out;
    }
    if ((st = pt_tokens_check(&tok, o.cfg.vocab_size)) != PT_OK) goto fail;
    if (o.val_tok && (st = pt_tokens_check(&val_tok, o.cfg.vocab_size)) != PT_OK) {
        fprintf(stderr, "error: --val-data %s: %s\n", o.val_path, pt_last_error());
        rc = 1;
        goto out;
    }
    if (o.keep && o.resume != latest) { /* step files beyond the start belong to another
                                            run: never mix them */
        long long steps[CKPT_MAX], start = o.resume ? ckpt_file_step(o.resume) : 0;
        if (start < 0) goto fail;
        if (ckpt_list(o.ckpt_out, 0, steps, CKPT_MAX) > 0 && steps[0] > start) {
            ckpt_step_path(latest, sizeof latest, o.ckpt_out, steps[0]);
            if (world.rank == 0)
                fprintf(stderr, "error: %s is newer than this run's start (step %lld): continue "
                        "it with --resume latest, or remove it\n", latest, start);
            rc = 2;
            goto out;
        }
    }
    if ((st = train_threads_and_peak(&world, &o, &a)) != PT_OK) goto fail;
    o.tok = &tok;
    o.rc = 1;
    {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_stop_signal;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
    }
    st = cli_world_run(&world, o.tp * o.dp * o.pp, train_rank, &o);
    if (st == PT_OK) st = cli_world_share(&world, &o.rc);
    if (st != PT_OK) goto fail;
    rc = o.rc;
    goto out;
fail:
    /* under MPI a failing rank has aborted the job; here only local errors */
    fprintf(stderr, "error: %s\n", pt_last_error());
    if (mpi && st != PT_ERR_COMM) pt_comm_fail(&world, st);
out:
    free(corpus);
    pt_tokens_free(&tok);
    pt_tokens_free(&val_tok);
    pt_tokenizer_free(&tk);
    cli_world_end(&world);
    return rc;
}
