/* train_opts.h -- build/train's command line: the option table (it drives
   parsing and --help), the checks that need neither data nor ranks, and the
   model's shape the options ask for. examples/train.c runs what it
   describes; fuzz/train_cli.c fuzzes it. Include after ptrain.h and cli.h. */
#ifndef PTRAIN_TRAIN_OPTS_H
#define PTRAIN_TRAIN_OPTS_H

/* Everything a rank needs to train: the options and the data (read-only). */
typedef struct run {
    const char *data_path, *ckpt_out, *resume, *trace_path, *init_from, *val_path, *tok_path;
    const char *token_cache; /* --token-cache: the directory of the text's token files */
    int steps, batch, seq, warmup, eval_every, eval_batches, ckpt_every, sample_tokens, top_k,
        log_every, stop_after, tp, dp, pp, zero, accum, chunks, recompute, trace_step, keep,
        max_bad, force, eval_only, eval_batches_given;
    int sp; /* --sp: sequence parallelism over the tp ranks */
    int cp; /* --cp: context-parallel ranks (ring attention) */
    pt_schedule_kind schedule;
    pt_overlap overlap; /* the dp gradient reduction behind backward (on) or after it */
    float bucket_mb;    /* --bucket-mb: dp gradient buckets of at least this many MiB
                           (0: a layer each) */
    pt_precision precision; /* the GEMMs' arithmetic */
    float comm_timeout;     /* --comm-timeout: seconds any wait may last (0: the default) */
#ifdef PTRAIN_TEST_HOOKS
    /* fault injection for the tests (builds with -DPTRAIN_TEST_HOOKS only) */
    const char *nan_tensor;
    int nan_step, nan_count, fail_rank, fail_step;
    float step_seconds;
#endif
    float lr, min_lr, wd, clip, val_fraction, temperature;
    uint64_t seed;
    pt_gpt_config cfg;
    const pt_tokens *tok, *val_tok; /* val_tok: --val-data's (NULL: a share of tok) */
    const pt_tokenizer *tk;         /* --tokenizer's: the sample as text (NULL: none) */
    double peak;      /* MFU's denominator, GFLOP/s of the machines the run uses: their
                         instruction peak at the run's precision (or sgemm's where there
                         is no probe) */
    double gemm_peak; /* their measured GFLOP/s of the run's GEMM, 1024^3 (0 with --peak-gflops) */
    int peak_given;   /* --peak-gflops */
    int peak_instr;   /* peak is the instruction peak */
    int peak_cached;  /* ... kept from an earlier run (common/peak.h) */
    int peak_loaded;  /* ... measured under load (on some node) */
    double peak_share, peak_load1; /* world rank 0's measurement: its threads' share of
                                      the time, the load average */
    char peak_when[32];            /* when world rank 0's peak was measured */
    int nodes;      /* MPI: the nodes the ranks run on */
    int rc;      /* set by world rank 0 */
} run;

/* What the command line sets besides the run itself (main resolves it). */
typedef struct train_args {
    const char *preset;
    int threads, n_layer, n_head, n_embd, block_size;
    int preset_given; /* --preset on the command line (else the default) */
    float peak; /* --peak-gflops (0: measure) */
    int measure_peak; /* --measure-peak: measure the peak again and keep it */
    pt_tokens_format fmt;
} train_args;

/* The options given as words, before they become values, and the help's
   list of presets. */
typedef struct train_words {
    const char *data_format, *recompute, *schedule, *overlap, *precision;
    char presets[640];
} train_words;

/* Options that would be silently ignored in some combination are refused,
   naming it: every option given takes effect. 2 after a message, else 0.
   (The library refuses the layouts it cannot run: chunks without a pipeline
   or with a schedule other than interleaved, stages without layers.) */
static int train_combinations(int argc, char **argv, const run *o, const char *schedule) {
    /* what only training uses: meaningless with --eval-only */
    static const char *train_only[] = {
        "steps", "lr", "min-lr", "warmup", "weight-decay", "grad-clip", "eval-every", "log-every",
        "checkpoint", "checkpoint-every", "keep", "stop-after", "max-bad-steps", "force", "seed",
        "zero", "recompute", "trace", "trace-step", "sample-tokens", "temperature", "top-k",
        "peak-gflops", "measure-peak"};
    size_t i;
#define TRAIN_GIVEN(name) cli_given(argc, argv, name)
#define TRAIN_REFUSE(...) return fprintf(stderr, "error: " __VA_ARGS__), fprintf(stderr, "\n"), 2
    if (o->tok_path && !o->data_path && !o->val_path)
        TRAIN_REFUSE("--tokenizer reads --data and --val-data as text: give one of them");
    if (o->token_cache && !o->tok_path && !o->init_from)
        TRAIN_REFUSE("--token-cache keeps the tokens of text read through --tokenizer: give "
                     "--tokenizer");
    if (TRAIN_GIVEN("measure-peak") && TRAIN_GIVEN("peak-gflops"))
        TRAIN_REFUSE("--measure-peak with --peak-gflops: the peak is given, nothing is measured");
    if (o->tok_path && TRAIN_GIVEN("data-format"))
        TRAIN_REFUSE("--data-format with --tokenizer: the tokenizer reads the files as text");
    if (TRAIN_GIVEN("data-format") && !o->data_path && !o->val_path)
        TRAIN_REFUSE("--data-format says how --data and --val-data are read: give one of them");
    if (o->val_path && TRAIN_GIVEN("val-fraction"))
        TRAIN_REFUSE("--val-fraction with --val-data: it holds out part of --data, and with "
                     "--val-data all of --data trains");
    if (o->resume && o->init_from)
        TRAIN_REFUSE("--resume with --init-from: --resume continues a run (its AdamW state, "
                     "data position and schedule), --init-from starts one from weights");
    if (o->eval_only) {
        if (!o->resume && !o->init_from)
            TRAIN_REFUSE("--eval-only needs a model: --init-from FILE or --resume CHECKPOINT");
        for (i = 0; i < sizeof train_only / sizeof train_only[0]; i++)
            if (TRAIN_GIVEN(train_only[i]))
                TRAIN_REFUSE("--%s with --eval-only: nothing is trained", train_only[i]);
        if (o->val_path && o->data_path)
            TRAIN_REFUSE("--data with --eval-only --val-data: the evaluation reads --val-data");
    }
    if (!o->ckpt_out && TRAIN_GIVEN("checkpoint-every"))
        TRAIN_REFUSE("--checkpoint-every needs --checkpoint");
    if (!o->ckpt_out && o->force) TRAIN_REFUSE("--force needs --checkpoint");
    if (o->force && o->resume)
        TRAIN_REFUSE("--force with --resume: --force lets a new run replace a checkpoint, and a "
                     "resumed run replaces its own anyway");
    if (o->force && o->keep)
        TRAIN_REFUSE("--force with --keep: step files of another run are never replaced; "
                     "continue it with --resume latest, or remove them");
    if (TRAIN_GIVEN("stop-after") && o->stop_after >= o->steps)
        TRAIN_REFUSE("--stop-after %d is not before --steps %d: the run ends there anyway",
                     o->stop_after, o->steps);
    if (TRAIN_GIVEN("overlap") && o->dp == 1)
        TRAIN_REFUSE("--overlap with one data-parallel rank: there is no gradient reduction "
                     "to overlap");
    if (TRAIN_GIVEN("bucket-mb") && o->dp == 1)
        TRAIN_REFUSE("--bucket-mb with one data-parallel rank: there are no gradient buckets "
                     "to reduce");
    if (TRAIN_GIVEN("bucket-mb") && !(o->bucket_mb > 0.0f))
        TRAIN_REFUSE("--bucket-mb %g must be more than 0 (a bucket holds at least a layer; "
                     "leave it out for a layer a bucket)", (double)o->bucket_mb);
    if (TRAIN_GIVEN("bucket-mb") && o->zero >= 2)
        TRAIN_REFUSE("--bucket-mb with --zero %d: ZeRO %d holds one layer's gradients at a "
                     "time, so its buckets are a layer each", o->zero, o->zero);
    if (TRAIN_GIVEN("trace-step") && !o->trace_path)
        TRAIN_REFUSE("--trace-step needs --trace (the file it writes)");
    if (o->trace_path && o->trace_step > o->steps)
        TRAIN_REFUSE("--trace-step %d is after the last step (--steps %d)", o->trace_step,
                     o->steps);
    if (o->sample_tokens == 0 && (TRAIN_GIVEN("temperature") || TRAIN_GIVEN("top-k")))
        TRAIN_REFUSE("--%s with --sample-tokens 0: it shapes the sample, and there is none",
                     TRAIN_GIVEN("temperature") ? "temperature" : "top-k");
    if (schedule && o->pp == 1 && TRAIN_GIVEN("grad-accum") == 0 && o->accum == 1 &&
        strcmp(schedule, "interleaved") != 0)
        TRAIN_REFUSE("--schedule %s with one stage and one micro-batch: every schedule is the "
                     "same step; give --pp or --grad-accum", schedule);
#undef TRAIN_GIVEN
#undef TRAIN_REFUSE
    return 0;
}

/* The defaults of everything the command line sets. */
static void train_defaults(run *o, train_args *a, train_words *w) {
    memset(o, 0, sizeof *o);
    o->steps = 1600, o->batch = 16, o->seq = 64, o->warmup = 50, o->eval_every = 100;
    o->eval_batches = 8, o->sample_tokens = 400, o->top_k = 8, o->log_every = 100;
    o->lr = 6e-3f, o->min_lr = 6e-4f, o->wd = 0.1f, o->clip = 1.0f, o->val_fraction = 0.1f;
    o->temperature = 0.8f, o->seed = 1337, o->tp = 1, o->dp = 1, o->pp = 1, o->cp = 1;
    o->trace_step = 2, o->max_bad = 5;
#ifdef PTRAIN_TEST_HOOKS
    o->nan_count = 1, o->nan_tensor = "h.0.mlp.c_fc.weight", o->fail_rank = -1, o->fail_step = 1;
#endif
    memset(a, 0, sizeof *a);
    a->preset = "mini";
    memset(w, 0, sizeof *w);
    w->data_format = "auto", w->recompute = "none", w->overlap = "on", w->precision = "fp32";
    cli_presets(w->presets + 7, sizeof w->presets - 7);
    memcpy(w->presets, "model: ", 7); /* "model: GPT-2: tiny, ...; LLaMA: ..." */
}

/* The option table (it drives parsing and --help) into opts; returns its
   rows. */
static int train_table(cli_opt *opts, run *o, train_args *a, train_words *w) {
    cli_opt t[] = {
        {"data", CLI_STR, &o->data_path, "training data file (default: the embedded task)", 0, 0},
        {"val-data", CLI_STR, &o->val_path, "validation data file (e.g. llm.c's *_val.bin beside "
         "*_train.bin; read like --data): all of --data trains", 0, 0},
        {"tokenizer", CLI_STR, &o->tok_path,
         "tokenizer.json, or a directory holding one or GPT-2's encoder.json + vocab.bpe: --data "
         "and --val-data are text, tokenized once into FILE.tokens.bin; the sample prints as "
         "text (default with --init-from DIR: DIR/tokenizer.json when the data is text)", 0, 0},
        {"token-cache", CLI_STR, &o->token_cache, "directory for the tokens of --tokenizer's "
         "text, DIR/NAME.tokens.bin (default: FILE.tokens.bin beside the text; where that "
         "cannot be written, no cache)", 0, 0},
        {"data-format", CLI_STR, &w->data_format,
         "auto (.bin = llm.c tokens, else raw bytes) | bytes | llmc", 0, 0},
        {"preset", CLI_STR, &a->preset, w->presets, 0, 0},
        {"layers", CLI_INT, &a->n_layer, "override the preset's n_layer (0: keep)", 0, 4096},
        {"heads", CLI_INT, &a->n_head, "override the preset's n_head (0: keep)", 0, 65536},
        {"embd", CLI_INT, &a->n_embd, "override the preset's n_embd (0: keep)", 0, 131072},
        {"block-size", CLI_INT, &a->block_size,
         "context length (0: --seq, the positions trained)", 0, 1 << 20},
        {"steps", CLI_INT, &o->steps, "total optimizer steps", 1, 1e9},
        {"batch", CLI_INT, &o->batch, "sequences per step (B), over all ranks", 1, 1 << 20},
        {"seq", CLI_INT, &o->seq, "tokens per sequence (T <= block_size)", 1, 1 << 20},
        {"lr", CLI_FLOAT, &o->lr, "peak learning rate", 0, 10},
        {"min-lr", CLI_FLOAT, &o->min_lr, "final learning rate of the cosine decay", 0, 10},
        {"warmup", CLI_INT, &o->warmup, "linear warm-up steps", 0, 1e9},
        {"weight-decay", CLI_FLOAT, &o->wd, "AdamW decoupled weight decay (2-D tensors)", 0, 10},
        {"grad-clip", CLI_FLOAT, &o->clip, "clip the gradient norm to this (0: off)", 0, 1e9},
        {"val-fraction", CLI_FLOAT, &o->val_fraction, "share of the data held out", 1e-6, 0.9},
        {"eval-every", CLI_INT, &o->eval_every, "steps between validation losses", 1, 1e9},
        {"eval-batches", CLI_INT, &o->eval_batches, "batches per validation loss", 1, 1e6},
        {"log-every", CLI_INT, &o->log_every, "steps between progress lines", 1, 1e9},
        {"checkpoint", CLI_STR, &o->ckpt_out, "write a checkpoint here (at the end, and on "
         "Ctrl-C); the loss history beside it (STEM.loss.csv, STEM.loss.svg)", 0, 0},
        {"force", CLI_FLAG, &o->force, "a new run may replace the file at --checkpoint (another "
         "run's checkpoint)", 0, 0},
        {"checkpoint-every", CLI_INT, &o->ckpt_every, "also every N steps (0: only at the end)", 0,
         1e9},
        {"keep", CLI_INT, &o->keep, "keep the newest N checkpoints, each in a file of its own: "
         "--checkpoint's name with -stepNNNNNNNN before .safetensors (0: one file, replaced)", 0,
         1e6},
        {"stop-after", CLI_INT, &o->stop_after,
         "stop after this step, keeping the schedule of --steps (continue with --resume)", 0,
         1e9},
        {"resume", CLI_STR, &o->resume, "resume from this checkpoint (model, AdamW, data, RNG); "
         "'latest': the newest of --checkpoint's that loads whole, or a fresh start if there "
         "are none", 0, 0},
        {"init-from", CLI_STR, &o->init_from, "start from these weights: a ptrain checkpoint, a "
         "Hugging Face GPT-2 or LLaMA model directory (model.safetensors + config.json, and "
         "tokenizer.json), or such a model.safetensors with its config.json beside it (a GPT-2 "
         "one alone too: --heads, else n_embd/64); weights only: a fresh AdamW and schedule; "
         "the model's shape is the file's", 0, 0},
        {"eval-only", CLI_FLAG, &o->eval_only, "no training: the loss and perplexity of "
         "--init-from's or --resume's model on all of --val-data (else on --data's held-out "
         "part), in any layout", 0, 0},
        {"max-bad-steps", CLI_INT, &o->max_bad, "a step with a non-finite loss or gradient is "
         "skipped; this many in a row stop the run (with a checkpoint)", 1, 1e9},
        {"seed", CLI_U64, &o->seed, "seed for weights, data order and sampling", 0, 0},
        {"threads", CLI_INT, &a->threads, "OpenMP/BLAS threads of this process (0: "
         "OMP_NUM_THREADS, else its share of the cores; refused with thread ranks, which split "
         "the cores)", 0, 1024},
        {"tp", CLI_INT, &o->tp, "tensor-parallel ranks (divides --heads)", 1, 1024},
        {"sp", CLI_FLAG, &o->sp, "sequence parallelism over the tp ranks (--tp >= 2, --seq a "
         "multiple of it)", 0, 0},
        {"cp", CLI_INT, &o->cp, "context-parallel ranks: each holds 2 chunks of --seq/(2cp) "
         "tokens of every sequence, attention as a ring (--seq a multiple of 2cp)", 1, 1024},
        {"dp", CLI_INT, &o->dp, "data-parallel ranks (with --grad-accum, divides --batch)", 1,
         1024},
        {"zero", CLI_INT, &o->zero, "ZeRO stage: 0, 1 (shard AdamW state), 2 (and gradients), "
         "3 (and parameters)", 0, 3},
        {"grad-accum", CLI_INT, &o->accum, "micro-batches per step and rank (with --pp: the "
         "pipeline's m; 0: 1 without a pipeline, else pp when it divides the batch per dp rank, "
         "so every stage has work)", 0, 1 << 20},
        {"pp", CLI_INT, &o->pp, "pipeline stages (at most the layers)", 1, 1024},
        {"schedule", CLI_STR, &w->schedule, "the step's schedule: gpipe, 1f1b, interleaved, "
         "zb-h1, zb-h2, zb-v, chimera, 2bw (asynchronous: an update every pp micro-batches) "
         "(default: 1f1b, interleaved with --chunks)", 0, 0},
        {"overlap", CLI_STR, &w->overlap, "on | off: reduce each data-parallel gradient bucket "
         "while backward goes on (ZeRO 0, 1) and gather the updated parameters (ZeRO 1, 2) "
         "while the next forward runs (ZeRO 3: the next layer's while this one computes), or "
         "all in their turn; the same bits either way", 0, 0},
        {"bucket-mb", CLI_FLOAT, &o->bucket_mb, "data-parallel gradient buckets: layers are "
         "grouped until a bucket holds this many MiB (like Megatron's --reduce-bucket-size; "
         "default: a layer a bucket)", 0, 0},
        {"comm-timeout", CLI_FLOAT, &o->comm_timeout, "seconds any one wait for other ranks "
         "(a collective, a pipeline send or receive) may last; then the rank names the "
         "operation, group, ranks and hosts it waited for and the whole job ends with status 1 "
         "(0: 300)", 0, 1e6},
        {"chunks", CLI_INT, &o->chunks, "layer chunks per pipeline stage (0: the schedule's own, "
         "2 for zb-v and chimera, else 1; interleaved takes 2 or more)", 0, 64},
        {"recompute", CLI_STR, &w->recompute, "activation recomputation: none, selective, full",
         0, 0},
        {"precision", CLI_STR, &w->precision, "fp32 | bf16: the GEMMs' arithmetic (bf16: "
         "operands rounded to bfloat16, sums in fp32; weights, gradients, AdamW and "
         "communication stay fp32)", 0, 0},
        {"trace", CLI_STR, &o->trace_path, "write step --trace-step's timeline (every rank's "
         "actions) here as Chrome trace JSON, and at FILE.svg", 0, 0},
        {"trace-step", CLI_INT, &o->trace_step, "the step --trace records", 1, 1e9},
        {"sample-tokens", CLI_INT, &o->sample_tokens, "tokens to sample at the end (0: none)", 0,
         1e6},
        {"temperature", CLI_FLOAT, &o->temperature, "sampling temperature (0: greedy)", 0, 100},
        {"top-k", CLI_INT, &o->top_k, "sample among the k most likely tokens (0: all)", 0, 1 << 24},
        {"peak-gflops", CLI_FLOAT, &a->peak, "the peak GFLOP/s at --precision of all the run's "
         "machines for MFU (0: one node's instruction peak at that precision, measured once "
         "per machine and kept, see --measure-peak; the sgemm rate beside it)", 0, 1e9},
        {"measure-peak", CLI_FLAG, &a->measure_peak, "measure the instruction peak again (0.25 "
         "s) and keep it for later runs, in $PTRAIN_CACHE_DIR, else $XDG_CACHE_HOME/ptrain or "
         "~/.cache/ptrain (a kept peak measured under load is measured again anyway)", 0, 0},
#ifdef PTRAIN_TEST_HOOKS
        {"debug-nan-step", CLI_INT, &o->nan_step, "testing: plant a NaN in a gradient at this step "
         "(0: never)", 0, 1e9},
        {"debug-nan-count", CLI_INT, &o->nan_count, "testing: ... and the steps after it, this many "
         "in all", 1, 1e9},
        {"debug-nan-tensor", CLI_STR, &o->nan_tensor, "testing: the tensor whose gradient gets it",
         0, 0},
        {"debug-fail-rank", CLI_INT, &o->fail_rank, "testing: this world rank gets a token outside "
         "the vocabulary at --debug-fail-step (-1: none)", -1, 1e6},
        {"debug-fail-step", CLI_INT, &o->fail_step, "testing: the step of --debug-fail-rank", 1,
         1e9},
        {"debug-step-seconds", CLI_FLOAT, &o->step_seconds, "testing: the progress line's clock "
         "says each step took this long (0: the real clock)", 0, 1e6},
#endif
    };
    memcpy(opts, t, sizeof t);
    return (int)(sizeof t / sizeof t[0]);
}
#define TRAIN_MAX_OPTS 96 /* room for train_table's rows */

/* The options given as words into o and a; 0, or 2 after a message. */
static int train_words_parse(const train_words *w, run *o, train_args *a) {
    int s;
    if (strcmp(w->data_format, "auto") == 0) a->fmt = PT_TOKENS_AUTO;
    else if (strcmp(w->data_format, "bytes") == 0) a->fmt = PT_TOKENS_BYTES;
    else if (strcmp(w->data_format, "llmc") == 0) a->fmt = PT_TOKENS_LLMC;
    else {
        fprintf(stderr, "error: --data-format '%s' is not auto, bytes or llmc\n", w->data_format);
        return 2;
    }
    if ((o->recompute = cli_recompute(w->recompute)) < 0) return 2;
    if (pt_precision_parse(w->precision, &o->precision) != PT_OK) {
        fprintf(stderr, "error: --precision: %s\n", pt_last_error());
        return 2;
    }
    if (strcmp(w->overlap, "on") == 0) o->overlap = PT_OVERLAP_ON;
    else if (strcmp(w->overlap, "off") == 0) o->overlap = PT_OVERLAP_OFF;
    else {
        fprintf(stderr, "error: --overlap '%s' is not on or off\n", w->overlap);
        return 2;
    }
    if ((s = cli_schedule(w->schedule)) < 0) return 2;
    o->schedule = (pt_schedule_kind)s;
    return 0;
}

/* The command line into o and a, checked as far as it goes without data or
   ranks. Returns -1 to go on, else the exit status: 0 after --help, 2 after
   an error message. usage: print the usage (world rank 0 does). */
static int train_options(int argc, char **argv, run *o, train_args *a, int usage) {
    cli_opt opts[TRAIN_MAX_OPTS];
    train_words w;
    int npos, s, nopts;
    const char *pos[1];
    const char *text =
        "usage: train [options]\n"
        "Trains a GPT-2 or LLaMA style model with AdamW (warm-up + cosine learning rate) and\n"
        "prints step, train loss, validation loss, tokens/s, model FLOP utilisation against\n"
        "this machine's instruction peak at --precision (measured once and kept), elapsed\n"
        "time and ETA. Without --data it trains on an embedded generated task (additions and\n"
        "simple sentences) and reports what it learned. --init-from fine-tunes a Hugging Face\n"
        "GPT-2 or LLaMA model directory on text (its tokenizer.json reads --data).\n"
        "--tp/--dp/--pp run the ranks as threads (build/train) or MPI processes\n"
        "(build/train_mpi under mpirun, with -np equal to tp x dp x pp).";

    train_defaults(o, a, &w);
    nopts = train_table(opts, o, a, &w);
    if ((s = cli_parse(argc, argv, opts, nopts, pos, 0, &npos)) != 0) {
        if (usage) cli_usage(s == 1 ? stdout : stderr, text, opts, nopts);
        return s == 1 ? 0 : 2;
    }
    if ((s = train_words_parse(&w, o, a)) != 0) return s;
    o->eval_batches_given = cli_given(argc, argv, "eval-batches");
    a->preset_given = cli_given(argc, argv, "preset");
    if (o->accum == 0) /* a pipeline of one micro-batch runs one stage at a time */
        o->accum = o->pp > 1 && o->batch % (o->dp * o->pp) == 0 ? o->pp : 1;
    if (o->batch % (o->dp * o->accum) != 0) {
        fprintf(stderr, "error: --batch %d is not divisible by dp=%d x grad_accum=%d\n", o->batch,
                o->dp, o->accum);
        return 2;
    }
#ifndef PTRAIN_MPI
    if (a->threads && o->tp * o->cp * o->dp * o->pp > 1) {
        fprintf(stderr, "error: --threads %d with %d thread ranks (tp x cp x dp x pp): each rank "
                "gets the cores / ranks; --threads sets one process's threads (one rank, or "
                "under MPI)\n", a->threads, o->tp * o->cp * o->dp * o->pp);
        return 2;
    }
#endif
    if ((s = train_combinations(argc, argv, o, w.schedule)) != 0) return s;
    if ((o->keep || (o->resume && strcmp(o->resume, "latest") == 0)) && !o->ckpt_out) {
        fprintf(stderr, "error: --%s needs --checkpoint\n", o->keep ? "keep" : "resume latest");
        return 2;
    }
    return -1;
}

/* 1 if a and b are the same model but for the vocabulary and the context
   (the data's and --seq's in a fresh run): every architecture field, the
   defaults (zero) as what they mean. */
static int train_same_model(const pt_gpt_config *a, const pt_gpt_config *b) {
#define TRAIN_OR(x, d) ((x) > 0 ? (x) : (d))
    return a->n_layer == b->n_layer && a->n_head == b->n_head && a->n_embd == b->n_embd &&
           a->arch == b->arch && a->norm == b->norm && a->pos == b->pos && a->mlp == b->mlp &&
           TRAIN_OR(a->n_kv_head, a->n_head) == TRAIN_OR(b->n_kv_head, b->n_head) &&
           TRAIN_OR(a->ffn_hidden, 4 * a->n_embd) == TRAIN_OR(b->ffn_hidden, 4 * b->n_embd) &&
           a->no_bias == b->no_bias && a->untied_head == b->untied_head &&
           TRAIN_OR(a->ln_eps, 1e-5f) == TRAIN_OR(b->ln_eps, 1e-5f) &&
           (a->pos != PT_POS_ROPE ||
            (TRAIN_OR(a->rope_theta, 10000.0f) == TRAIN_OR(b->rope_theta, 10000.0f) &&
             memcmp(&a->rope_scaling, &b->rope_scaling, sizeof a->rope_scaling) == 0));
#undef TRAIN_OR
}

/* The model's shape: the checkpoint's when resuming (or --init-from's
   file), which the options that ask for one must match in every field, else
   the preset with the overrides and the data's vocabulary. */
static pt_status train_config(run *o, const train_args *a, int vocab_size) {
    pt_status st;
    if (o->resume || o->init_from) { /* the file's shape; options that ask for one must agree */
        const char *path = o->resume ? o->resume : o->init_from;
        const pt_gpt_config *c = &o->cfg;
        pt_gpt_config p;
        char pa[256], ca[256];
        /* a Hugging Face GPT-2 file alone stores no n_head: --heads, else n_embd / 64 */
        if ((st = pt_gpt_config_from_file(path, o->resume ? 0 : a->n_head, &o->cfg)) != PT_OK)
            return st;
        if (a->preset_given && (st = pt_gpt_config_preset(a->preset, &p)) != PT_OK) return st;
        if (a->preset_given && !train_same_model(&p, c)) {
            cli_model_arch(&p, pa, sizeof pa);
            cli_model_arch(c, ca, sizeof ca);
            return pt_error(PT_ERR_CONFIG, "--preset %s (%s, %d layers, %d heads, %d wide, norm "
                            "eps %g) is not the model of %s (%s, %d, %d, %d, %g): leave it out",
                            a->preset, pa, p.n_layer, p.n_head, p.n_embd, (double)p.ln_eps, path,
                            ca, c->n_layer, c->n_head, c->n_embd,
                            (double)(c->ln_eps > 0.0f ? c->ln_eps : 1e-5f));
        }
#define TRAIN_SAME(opt, field, what)                                                          \
    if (a->field && a->field != c->field)                                                     \
        return pt_error(PT_ERR_CONFIG, "--" opt " %d: %s has %d " what ": leave it out",      \
                        a->field, path, c->field);
        TRAIN_SAME("layers", n_layer, "layers")
        TRAIN_SAME("heads", n_head, "heads")
        TRAIN_SAME("embd", n_embd, "wide")
        TRAIN_SAME("block-size", block_size, "positions")
#undef TRAIN_SAME
        return PT_OK;
    }
    if ((st = pt_gpt_config_preset(a->preset, &o->cfg)) != PT_OK) return st;
    if (a->n_layer) o->cfg.n_layer = a->n_layer;
    if (a->n_head) o->cfg.n_head = a->n_head;
    if (a->n_embd) o->cfg.n_embd = a->n_embd;
    /* positions beyond the training length would stay untrained */
    o->cfg.block_size = a->block_size ? a->block_size : o->seq;
    o->cfg.vocab_size = vocab_size;
    return PT_OK;
}

#endif
