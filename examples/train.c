/* train.c -- ptrain's main job: train a GPT on a file or on the embedded
   default task, with progress lines, checkpoints and a sample at the end.

     make run                      (builds build/train and runs the default)
     build/train --help

   The embedded default needs no download: a generated corpus of lines that
   are either additions ("7+5=12") or sentences from a small grammar ("the
   old man finds a green letter near the river."). A model that learns it
   writes grammatical sentences and correct sums, which the end of the run
   shows: a sample, and the accuracy of greedy answers to fresh additions. */
#define _POSIX_C_SOURCE 200809L /* setenv, execv (cli_passive_wait) */
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"
#include "cli.h"

#include <math.h>

/* ---- the embedded task ---------------------------------------------------- */

static const char *subjects[] = {"the cat", "the dog", "a bird", "my friend", "the old man",
                                 "a small child", "the teacher", "our neighbour"};
static const char *verbs[] = {"sees", "likes", "finds", "paints", "follows", "carries", "reads",
                              "hears"};
static const char *adjectives[] = {"red", "big", "quiet", "happy", "old", "little", "green",
                                   "bright"};
static const char *objects[] = {"ball", "book", "tree", "house", "river", "song", "letter",
                                "garden"};
#define ADD_MAX 10 /* operands of the additions are below this */
#define PICK(arr, r) arr[pt_rng_u64(r) % (sizeof arr / sizeof arr[0])]

/* n bytes of lines; returns the buffer (caller frees) */
static char *make_default_corpus(size_t n, uint64_t seed) {
    char *buf = (char *)malloc(n + 256), line[256];
    size_t used = 0;
    pt_rng r;
    if (!buf) return NULL;
    pt_rng_seed(&r, seed);
    while (used < n) {
        int len;
        if (pt_rng_u64(&r) % 3 != 0) { /* two lines in three are additions */
            int a = (int)(pt_rng_u64(&r) % ADD_MAX), b = (int)(pt_rng_u64(&r) % ADD_MAX);
            len = snprintf(line, sizeof line, "%d+%d=%d\n", a, b, a + b);
        } else if (pt_rng_u64(&r) % 2) {
            len = snprintf(line, sizeof line, "%s %s the %s %s.\n", PICK(subjects, &r),
                           PICK(verbs, &r), PICK(adjectives, &r), PICK(objects, &r));
        } else {
            len = snprintf(line, sizeof line, "%s %s a %s %s near the %s.\n", PICK(subjects, &r),
                           PICK(verbs, &r), PICK(adjectives, &r), PICK(objects, &r),
                           PICK(objects, &r));
        }
        memcpy(buf + used, line, (size_t)len);
        used += (size_t)len;
    }
    return buf;
}

/* Advances *p past the first entry of list (n entries) that prefixes it. */
static int eat(const char **p, const char *const *list, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) {
        size_t len = strlen(list[i]);
        if (strncmp(*p, list[i], len) == 0) {
            *p += len;
            return 1;
        }
    }
    return 0;
}
#define EAT(p, arr) eat(p, arr, sizeof arr / sizeof arr[0])
#define EAT1(p, word) eat(p, &(const char *){word}, 1)

/* 1 if line is a sentence of the grammar above */
static int is_sentence(const char *line) {
    const char *p = line;
    int near;
    if (!EAT(&p, subjects) || !EAT1(&p, " ") || !EAT(&p, verbs)) return 0;
    near = EAT1(&p, " a ");
    if (!near && !EAT1(&p, " the ")) return 0;
    if (!EAT(&p, adjectives) || !EAT1(&p, " ") || !EAT(&p, objects)) return 0;
    if (near && (!EAT1(&p, " near the ") || !EAT(&p, objects))) return 0;
    return strcmp(p, ".") == 0;
}

/* Scores the complete lines of a byte sample: sentences that follow the
   grammar, and additions that are correct. */
static void score_sample(const int *tok, int n) {
    char line[256];
    int len = 0, i, sentences = 0, grammatical = 0, sums = 0, correct = 0;
    for (i = 0; i < n; i++) {
        int a, b, c, used = 0;
        if (tok[i] != '\n') {
            if (len < (int)sizeof line - 1) line[len++] = (char)tok[i];
            continue;
        }
        line[len] = 0;
        len = 0;
        if (line[0] >= '0' && line[0] <= '9') {
            sums++;
            correct += sscanf(line, "%d+%d=%d%n", &a, &b, &c, &used) == 3 &&
                       line[used] == 0 && a + b == c;
        } else if (line[0]) {
            sentences++;
            grammatical += is_sentence(line);
        }
    }
    printf("in the sample: %d of %d sentences follow the grammar, %d of %d sums are correct\n",
           grammatical, sentences, correct, sums);
}

/* Greedy answers to fresh "a+b=" prompts; returns the fraction correct. */
static double addition_accuracy(const pt_gpt *gpt, pt_kv_cache *cache, int trials, uint64_t seed) {
    pt_rng r;
    pt_sample_desc greedy = {0.0f, 0, 0};
    int correct = 0, i;
    pt_rng_seed(&r, seed);
    for (i = 0; i < trials; i++) {
        int a = (int)(pt_rng_u64(&r) % ADD_MAX), b = (int)(pt_rng_u64(&r) % ADD_MAX), k, n;
        int prompt[16], out[8];
        char text[16], want[8], got[9];
        n = snprintf(text, sizeof text, "\n%d+%d=", a, b);
        for (k = 0; k < n; k++) prompt[k] = (unsigned char)text[k];
        snprintf(want, sizeof want, "%d\n", a + b);
        if (pt_gpt_generate(gpt, cache, prompt, n, out, (int)strlen(want), &greedy) != PT_OK)
            return 0.0;
        for (k = 0; k < (int)strlen(want); k++) got[k] = (char)out[k];
        got[strlen(want)] = 0;
        correct += strcmp(got, want) == 0;
    }
    return (double)correct / trials;
}

static double eval_loss(pt_gpt *gpt, pt_loader *val, int batches, int *inputs, int *targets) {
    double sum = 0.0;
    int i;
    pt_loader_seek(val, 0, 0);
    for (i = 0; i < batches; i++) {
        pt_loader_next(val, inputs, targets);
        if (pt_gpt_forward(gpt, inputs, targets, val->B, val->T) != PT_OK) return NAN;
        sum += gpt->loss;
    }
    return sum / batches;
}

static void fmt_time(char *buf, size_t n, double s) {
    if (s < 0 || s != s) s = 0;
    if (s >= 3600) snprintf(buf, n, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
    else snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
}

int main(int argc, char **argv) {
    const char *data_path = NULL, *data_format = "auto", *preset = "mini", *ckpt_out = NULL,
               *resume = NULL;
    int steps = 1600, batch = 16, seq = 64, warmup = 50, eval_every = 100, eval_batches = 8,
        ckpt_every = 0, threads = 0, sample_tokens = 400, top_k = 8, n_layer = 0, n_head = 0,
        n_embd = 0, block_size = 0, log_every = 100, stop_after = 0, npos, s;
    float lr = 6e-3f, min_lr = 6e-4f, wd = 0.1f, clip = 1.0f, val_fraction = 0.1f,
          temperature = 0.8f;
    uint64_t seed = 1337;
    const char *pos[1];
    cli_opt opts[] = {
        {"data", CLI_STR, &data_path, "training data file (default: the embedded task)", 0, 0},
        {"data-format", CLI_STR, &data_format,
         "auto (.bin = llm.c tokens, else raw bytes) | bytes | llmc", 0, 0},
        {"preset", CLI_STR, &preset,
         "model size: tiny, mini, small, gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1558m", 0, 0},
        {"layers", CLI_INT, &n_layer, "override the preset's n_layer (0: keep)", 0, 4096},
        {"heads", CLI_INT, &n_head, "override the preset's n_head (0: keep)", 0, 65536},
        {"embd", CLI_INT, &n_embd, "override the preset's n_embd (0: keep)", 0, 131072},
        {"block-size", CLI_INT, &block_size, "context length (0: --seq, the positions trained)", 0,
         1 << 20},
        {"steps", CLI_INT, &steps, "total optimizer steps", 1, 1e9},
        {"batch", CLI_INT, &batch, "sequences per step (B)", 1, 1 << 20},
        {"seq", CLI_INT, &seq, "tokens per sequence (T <= block_size)", 1, 1 << 20},
        {"lr", CLI_FLOAT, &lr, "peak learning rate", 0, 10},
        {"min-lr", CLI_FLOAT, &min_lr, "final learning rate of the cosine decay", 0, 10},
        {"warmup", CLI_INT, &warmup, "linear warm-up steps", 0, 1e9},
        {"weight-decay", CLI_FLOAT, &wd, "AdamW decoupled weight decay (2-D tensors)", 0, 10},
        {"grad-clip", CLI_FLOAT, &clip, "clip the gradient norm to this (0: off)", 0, 1e9},
        {"val-fraction", CLI_FLOAT, &val_fraction, "share of the data held out", 1e-6, 0.9},
        {"eval-every", CLI_INT, &eval_every, "steps between validation losses", 1, 1e9},
        {"eval-batches", CLI_INT, &eval_batches, "batches per validation loss", 1, 1e6},
        {"log-every", CLI_INT, &log_every, "steps between progress lines", 1, 1e9},
        {"checkpoint", CLI_STR, &ckpt_out, "write a checkpoint here (at the end)", 0, 0},
        {"checkpoint-every", CLI_INT, &ckpt_every, "also every N steps (0: only at the end)", 0,
         1e9},
        {"stop-after", CLI_INT, &stop_after,
         "stop after this step, keeping the schedule of --steps (continue with --resume)", 0,
         1e9},
        {"resume", CLI_STR, &resume, "resume from this checkpoint (model, AdamW, data, RNG)", 0,
         0},
        {"seed", CLI_U64, &seed, "seed for weights, data order and sampling", 0, 0},
        {"threads", CLI_INT, &threads, "OpenMP/BLAS threads (0: all cores)", 0, 1024},
        {"sample-tokens", CLI_INT, &sample_tokens, "tokens to sample at the end (0: none)", 0,
         1e6},
        {"temperature", CLI_FLOAT, &temperature, "sampling temperature (0: greedy)", 0, 100},
        {"top-k", CLI_INT, &top_k, "sample among the k most likely tokens (0: all)", 0, 1 << 24},
    };
    int nopts = (int)(sizeof opts / sizeof opts[0]);
    const char *usage =
        "usage: train [options]\n"
        "Trains a GPT-2 style model with AdamW (warm-up + cosine learning rate) and prints\n"
        "step, train loss, validation loss, tokens/s, model FLOP utilisation against this\n"
        "machine's measured GEMM peak, elapsed time and ETA. Without --data it trains on an\n"
        "embedded generated task (additions and simple sentences) and reports what it learned.";
    pt_tokens tok;
    pt_loader train_ld, val_ld;
    pt_loader_desc ld;
    pt_gpt_config cfg;
    pt_gpt gpt;
    pt_gpt_desc desc;
    pt_kv_cache cache;
    pt_adamw_config opt;
    pt_lr_schedule sched;
    pt_train_state state;
    pt_rng rng;
    pt_tokens_format fmt;
    char *corpus = NULL;
    int *inputs = NULL, *targets = NULL, step, rc = 1;
    double peak, flops_step, t_train = 0.0, t_start, val = NAN, train_loss_avg = 0.0, h_unigram;
    size_t n_val;

    memset(&tok, 0, sizeof tok);
    memset(&train_ld, 0, sizeof train_ld);
    memset(&val_ld, 0, sizeof val_ld);
    memset(&gpt, 0, sizeof gpt);
    memset(&cache, 0, sizeof cache);
    memset(&state, 0, sizeof state);
    cli_passive_wait(argv);
    if ((s = cli_parse(argc, argv, opts, nopts, pos, 0, &npos)) != 0) {
        cli_usage(s == 1 ? stdout : stderr, usage, opts, nopts);
        return s == 1 ? 0 : 2;
    }
    if (strcmp(data_format, "auto") == 0) fmt = PT_TOKENS_AUTO;
    else if (strcmp(data_format, "bytes") == 0) fmt = PT_TOKENS_BYTES;
    else if (strcmp(data_format, "llmc") == 0) fmt = PT_TOKENS_LLMC;
    else {
        fprintf(stderr, "error: --data-format '%s' is not auto, bytes or llmc\n", data_format);
        return 2;
    }
    pt_set_threads(threads);

    /* data */
    if (data_path) {
        if (pt_tokens_load(&tok, data_path, fmt) != PT_OK) goto fail;
        printf("data: %s, %zu tokens, vocabulary %d\n", data_path, tok.n, tok.vocab_size);
    } else {
        size_t n = 1 << 21;
        corpus = make_default_corpus(n, 20240520);
        if (!corpus || pt_tokens_from_bytes(&tok, corpus, n) != PT_OK) goto fail;
        const char *from = strchr(corpus, '\n') + 1, *to = from;
        int k;
        for (k = 0; k < 5; k++) to = strchr(to, '\n') + 1;
        printf("data: embedded task (additions and sentences), %zu bytes, e.g.\n%.*s", n,
               (int)(to - from), from);
    }

    /* model: from the checkpoint when resuming, else preset + overrides */
    if (resume) {
        if (pt_gpt_config_from_file(resume, 0, &cfg) != PT_OK) goto fail;
    } else {
        if (pt_gpt_config_preset(preset, &cfg) != PT_OK) goto fail;
        if (n_layer) cfg.n_layer = n_layer;
        if (n_head) cfg.n_head = n_head;
        if (n_embd) cfg.n_embd = n_embd;
        /* positions beyond the training length would stay untrained */
        cfg.block_size = block_size ? block_size : seq;
        cfg.vocab_size = tok.vocab_size;
    }
    if (pt_tokens_check(&tok, cfg.vocab_size) != PT_OK) goto fail;
    memset(&desc, 0, sizeof desc);
    desc.config = cfg;
    desc.batch = batch;
    desc.seq = seq;
    if (pt_gpt_init(&gpt, &desc) != PT_OK) goto fail;
    pt_gpt_init_weights(&gpt, seed);
    if (pt_kv_cache_init(&cache, &gpt) != PT_OK) goto fail;

    memset(&ld, 0, sizeof ld);
    ld.batch = batch;
    ld.seq = seq;
    ld.seed = seed;
    ld.val_fraction = val_fraction;
    if (pt_loader_init(&train_ld, &tok, PT_SPLIT_TRAIN, &ld) != PT_OK ||
        pt_loader_init(&val_ld, &tok, PT_SPLIT_VAL, &ld) != PT_OK)
        goto fail;
    pt_rng_seed(&rng, seed ^ 0x5EED5EEDull);
    if (resume) {
        if (pt_checkpoint_load(resume, &gpt, &state) != PT_OK) goto fail;
        pt_loader_seek(&train_ld, state.data_epoch, (size_t)state.data_pos);
        rng.state = state.rng_state;
        printf("resumed from %s at step %lld\n", resume, (long long)state.step);
    }
    inputs = (int *)malloc(sizeof(int) * (size_t)batch * seq);
    targets = (int *)malloc(sizeof(int) * (size_t)batch * seq);
    if (!inputs || !targets) {
        fprintf(stderr, "error: out of memory\n");
        goto done;
    }

    n_val = val_ld.len;
    h_unigram = pt_tokens_unigram_entropy(&tok, val_ld.begin, val_ld.begin + n_val);
    printf("model: %d layers, %d heads, %d wide, vocabulary %d, context %d: %.2fM parameters\n",
           cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.vocab_size, cfg.block_size,
           (double)gpt.num_params / 1e6);
    printf("memory: params %.1f MiB, grads %.1f MiB, AdamW %.1f MiB, activations %.1f MiB, "
           "scratch %.1f MiB\n",
           gpt.mem.params / 1048576.0, gpt.mem.grads / 1048576.0, gpt.mem.optimizer / 1048576.0,
           gpt.mem.activations / 1048576.0, gpt.mem.scratch / 1048576.0);
    peak = pt_gemm_peak_gflops(1024, 0.5);
    flops_step = pt_gpt_flops_per_step(&cfg, batch, seq);
    printf("threads %d; measured sgemm peak %.1f GFLOP/s (1024^3); %.2f GFLOP per step\n",
           pt_get_threads(), peak, flops_step / 1e9);
    printf("validation unigram entropy: %.3f nats/token (the loss of a model that only counts "
           "tokens)\n",
           h_unigram);
    printf("training %d steps of %d x %d tokens, lr %g -> %g (warm-up %d), weight decay %g, "
           "clip %g\n\n",
           steps, batch, seq, (double)lr, (double)min_lr, warmup, (double)wd, (double)clip);

    opt = pt_adamw_default();
    opt.weight_decay = wd;
    sched.lr = lr;
    sched.min_lr = min_lr;
    sched.warmup_steps = warmup;
    sched.total_steps = steps;
    t_start = pt_time_now();
    for (step = (int)state.step; step < steps && !(stop_after > 0 && step >= stop_after); step++) {
        double t0 = pt_time_now();
        float lr_now = pt_lr_at(&sched, step), norm;
        int last = step + 1 == steps || step + 1 == stop_after;
        pt_loader_next(&train_ld, inputs, targets);
        if (pt_gpt_forward(&gpt, inputs, targets, batch, seq) != PT_OK) goto fail;
        pt_gpt_backward(&gpt);
        norm = pt_gpt_clip_grad_norm(&gpt, clip);
        pt_gpt_adamw_step(&gpt, &opt, lr_now);
        t_train += pt_time_now() - t0;
        train_loss_avg += gpt.loss;
        if ((step + 1) % eval_every == 0 || last)
            val = eval_loss(&gpt, &val_ld, eval_batches, inputs, targets);
        if ((step + 1) % log_every == 0 || last || step == (int)state.step) {
            int done_steps = step + 1 - (int)state.step;
            double tps = (double)done_steps * batch * seq / t_train;
            double mfu = flops_step * done_steps / t_train / (peak * 1e9);
            double elapsed = pt_time_now() - t_start;
            char el[32], eta[32];
            int n_avg = (step + 1) % log_every == 0 ? log_every : ((step + 1) % log_every);
            if (step == (int)state.step) n_avg = 1;
            fmt_time(el, sizeof el, elapsed);
            fmt_time(eta, sizeof eta, elapsed / done_steps * (steps - step - 1));
            char vs[16] = "     -";
            if (val == val) snprintf(vs, sizeof vs, "%.4f", val);
            printf("step %5d/%d | loss %.4f | val %s | lr %.2e | norm %.2f | %7.0f tok/s | "
                   "MFU %4.1f%% | %s elapsed | ETA %s\n",
                   step + 1, steps, train_loss_avg / n_avg, vs, (double)lr_now, (double)norm, tps,
                   100.0 * mfu, el, eta);
            fflush(stdout);
            train_loss_avg = 0.0;
        }
        if (ckpt_out && ((ckpt_every > 0 && (step + 1) % ckpt_every == 0) || last)) {
            state.step = step + 1;
            state.data_epoch = train_ld.epoch;
            state.data_pos = train_ld.pos;
            state.rng_state = rng.state;
            if (pt_checkpoint_save(ckpt_out, &gpt, &state) != PT_OK) goto fail;
            if (last) printf("checkpoint: %s (step %d)\n", ckpt_out, step + 1);
        }
    }
    if (stop_after > 0 && stop_after < steps) {
        printf("stopped after step %d of %d%s\n", stop_after, steps,
               ckpt_out ? "; continue with --resume" : "");
        rc = 0;
        goto done;
    }
    if (val == val)
        printf("\nvalidation loss %.3f nats/token vs unigram entropy %.3f nats/token (%.0f%% of "
               "it)\n",
               val, h_unigram, 100.0 * val / h_unigram);

    if (sample_tokens > 0) {
        int prompt = '\n', *out = (int *)malloc(sizeof(int) * (size_t)sample_tokens);
        pt_sample_desc sd;
        sd.temperature = temperature;
        sd.top_k = top_k;
        sd.seed = pt_rng_u64(&rng);
        if (!out) goto fail;
        if (pt_gpt_generate(&gpt, &cache, &prompt, 1, out, sample_tokens, &sd) != PT_OK) {
            free(out);
            goto fail;
        }
        if (cfg.vocab_size == 256) {
            printf("\n--- sample (temperature %g, top-k %d) ---\n", (double)temperature, top_k);
            cli_print_bytes(out, sample_tokens);
            printf("\n---\n");
            if (!data_path) score_sample(out, sample_tokens);
        } else {
            int i;
            printf("\n--- sample token ids (no tokenizer for vocabulary %d) ---\n", cfg.vocab_size);
            for (i = 0; i < sample_tokens; i++) printf("%d%c", out[i], i % 16 == 15 ? '\n' : ' ');
            printf("\n---\n");
        }
        free(out);
    }
    if (!data_path) {
        double acc = addition_accuracy(&gpt, &cache, 200, seed + 7);
        printf("additions answered correctly (greedy, 200 random problems a+b with a,b < %d): "
               "%.1f%%\n",
               ADD_MAX, 100.0 * acc);
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "error: %s\n", pt_last_error());
done:
    free(inputs);
    free(targets);
    free(corpus);
    pt_kv_cache_free(&cache);
    pt_loader_free(&train_ld);
    pt_loader_free(&val_ld);
    pt_gpt_free(&gpt);
    pt_tokens_free(&tok);
    return rc;
}
