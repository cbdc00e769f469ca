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
#include "../common/cli.h"

#include <dirent.h>
#include <inttypes.h>
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

/* Validation loss over `batches` batches from the start of the split; each
   rank feeds its rows (first), in micro-batches of gpt->B rows. */
static double eval_loss(pt_gpt *gpt, pt_loader *val, int batches, int *inputs, int *targets,
                        int first, int rows) {
    double sum = 0.0;
    int i, r, T = val->T;
    pt_loader_seek(val, 0, 0);
    for (i = 0; i < batches && gpt->pp > 1; i++) { /* pipeline stages: forward through them */
        float loss;
        size_t at = (size_t)first * T;
        pt_loader_next(val, inputs, targets);
        if (pt_gpt_pipeline_eval(gpt, inputs + at, targets + at, rows, T, &loss) != PT_OK)
            return NAN;
        sum += loss;
    }
    if (gpt->pp > 1) return sum / batches;
    for (i = 0; i < batches; i++) {
        pt_loader_next(val, inputs, targets);
        for (r = 0; r < rows; r += gpt->B) {
            size_t at = (size_t)(first + r) * T;
            if (pt_gpt_forward(gpt, inputs + at, targets + at, gpt->B, T) != PT_OK) return NAN;
            sum += gpt->loss;
        }
    }
    return sum / (batches * (rows / gpt->B));
}

static void fmt_time(char *buf, size_t n, double s) {
    if (s < 0 || s != s) s = 0;
    if (s >= 3600) snprintf(buf, n, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
    else snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
}

/* The timed step's actions of every rank, to rank 0, written as Chrome trace
   JSON at path and as an SVG picture at path.svg. */
static pt_status write_step_trace(pt_trace *t, pt_comm *world, const char *path, int step) {
    pt_status st = pt_trace_gather(t, world);
    char svg[4096];
    if (st != PT_OK || world->rank != 0) return st;
    t->title = "ptrain pipeline step (measured)";
    t->track_name = "rank";
    snprintf(svg, sizeof svg, "%s.svg", path);
    if ((st = pt_trace_write_chrome(t, path)) == PT_OK && (st = pt_trace_write_svg(t, svg)) == PT_OK)
        printf("trace of step %d: %s (chrome://tracing) and %s\n", step, path, svg);
    return st;
}

/* ---- checkpoint files ------------------------------------------------------
   Without --keep a run has one checkpoint, --checkpoint PATH, replaced at
   every save. With --keep N each save is a file of its own beside it,
   STEM-step00001600.safetensors (STEM: PATH without ".safetensors"), and the
   newest N are kept. --resume latest takes the newest of them that loads
   whole, else PATH, else starts fresh: the same command restarts a crashed
   run. */

static void ckpt_step_path(char *buf, size_t n, const char *base, long long step) {
    size_t len = strlen(base);
    if (len > 12 && strcmp(base + len - 12, ".safetensors") == 0) len -= 12;
    snprintf(buf, n, "%.*s-step%08lld.safetensors", (int)len, base, step);
}

/* Steps of base's step files (tmp = 1: of their leftover .tmp files), newest
   first; returns how many (at most max). */
static int ckpt_list(const char *base, int tmp, long long *steps, int max) {
    char dir[4096], pre[1024];
    const char *slash = strrchr(base, '/'), *name;
    size_t len = strlen(base), plen;
    DIR *d;
    struct dirent *e;
    int n = 0, i, j;
    if (len > 12 && strcmp(base + len - 12, ".safetensors") == 0) len -= 12;
    name = slash ? slash + 1 : base;
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - base) + 1 : 1, slash ? base : ".");
    snprintf(pre, sizeof pre, "%.*s-step", (int)(base + len - name), name);
    plen = strlen(pre);
    if (!(d = opendir(dir))) return 0;
    while ((e = readdir(d)) != NULL && n < max) {
        const char *p = e->d_name + plen;
        char *end;
        long long st;
        if (strncmp(e->d_name, pre, plen) != 0 || *p < '0' || *p > '9') continue;
        st = strtoll(p, &end, 10);
        if (strcmp(end, tmp ? ".safetensors.tmp" : ".safetensors") != 0) continue;
        for (i = 0; i < n && steps[i] > st; i++) {
        }
        for (j = n++; j > i; j--) steps[j] = steps[j - 1];
        steps[i] = st;
    }
    closedir(d);
    return n;
}

#define CKPT_MAX 4096 /* step files looked at */

/* The step a checkpoint file was saved at, or -1 after an error. */
static long long ckpt_file_step(const char *path) {
    pt_safetensors st;
    uint64_t v = 0;
    const char *x;
    memset(&st, 0, sizeof st);
    if (pt_st_load(&st, path) != PT_OK) return -1;
    x = pt_st_meta_get(&st, "step");
    if (!x || sscanf(x, "%" SCNu64, &v) != 1 || v > INT64_MAX) {
        pt__fail(PT_ERR_FORMAT, "%s: no step in its metadata: not a ptrain checkpoint", path);
        pt_st_free(&st);
        return -1;
    }
    pt_st_free(&st);
    return (long long)v;
}

/* After a save of step `step` with --keep: of the step files up to it, all
   but the newest keep go, and so do .tmp files older saves left behind (a
   kill mid-write). Later ones can only be damaged files --resume latest
   skipped: they stay until this run overwrites them. */
static void ckpt_rotate(const char *base, int keep, long long step) {
    long long steps[CKPT_MAX];
    char path[4096], tmp[4100];
    int n = ckpt_list(base, 0, steps, CKPT_MAX), i, kept = 0;
    for (i = 0; i < n; i++) {
        if (steps[i] > step || kept++ < keep) continue;
        ckpt_step_path(path, sizeof path, base, steps[i]);
        remove(path);
    }
    n = ckpt_list(base, 1, steps, CKPT_MAX);
    for (i = 0; i < n; i++)
        if (steps[i] < step) {
            ckpt_step_path(path, sizeof path, base, steps[i]);
            snprintf(tmp, sizeof tmp, "%s.tmp", path);
            remove(tmp);
        }
}

/* --resume latest: into out, the newest checkpoint of base that loads whole
   (checksums verified), skipping damaged ones with a warning. 1 if found, 0
   if there is none, -1 if there are some but none loads (a fresh start would
   overwrite them). */
static int ckpt_latest(const char *base, char *out, size_t n, int verbose) {
    long long steps[CKPT_MAX];
    pt_gpt_config cfg;
    int count = ckpt_list(base, 0, steps, CKPT_MAX), i;
    for (i = 0; i <= count; i++) {
        FILE *f;
        if (i < count) ckpt_step_path(out, n, base, steps[i]);
        else snprintf(out, n, "%s", base);
        if (i == count && !(f = fopen(out, "rb"))) return count > 0 ? -1 : 0;
        if (i == count) fclose(f);
        if (pt_gpt_config_from_file(out, 0, &cfg) == PT_OK) return 1;
        if (verbose) fprintf(stderr, "warning: --resume latest skips %s\n", pt_last_error());
    }
    return -1;
}

/* Everything a rank needs to train: the options and the data (read-only). */
typedef struct run {
    const char *data_path, *ckpt_out, *resume, *trace_path, *nan_tensor;
    int steps, batch, seq, warmup, eval_every, eval_batches, ckpt_every, sample_tokens, top_k,
        log_every, stop_after, tp, dp, pp, zero, accum, chunks, recompute, trace_step, keep,
        max_bad, nan_step, nan_count, fail_rank, fail_step;
    const char *schedule;
    float lr, min_lr, wd, clip, val_fraction, temperature;
    uint64_t seed;
    pt_gpt_config cfg;
    const pt_tokens *tok;
    double peak; /* sgemm GFLOP/s of the whole machine */
    int rc;      /* set by world rank 0 */
} run;

/* One rank's training: its tensor parts of the model, its dp share of each
   batch in grad_accum micro-batches. World rank 0 prints. */
static pt_status train_rank(pt_comm *world, void *arg) {
    run *o = (run *)arg;
    int lead = world->rank == 0, layout = o->tp * o->dp * o->pp > 1, step, grid_ok = 0;
    pt_grid grid;
    pt_loader train_ld, val_ld;
    pt_loader_desc ld;
    pt_gpt gpt, solo;
    pt_gpt_desc desc;
    pt_kv_cache cache;
    pt_adamw_config opt;
    pt_lr_schedule sched;
    pt_train_state state;
    pt_rng rng;
    int *inputs = NULL, *targets = NULL, rows, first, micro = o->batch / o->dp / o->accum;
    int n_bad = 0, stopped = 0, good_step; /* steps skipped in a row; the last good one */
    char where[64], ckpt_path[4096];
    double flops_step, t_train = 0.0, t_start, val = NAN, train_loss_avg = 0.0, h_unigram;
    int n_avg = 0; /* steps in train_loss_avg since the last progress line */
    float *full = NULL;
    pt_status st = PT_OK;
    const pt_gpt *sampler = &gpt;
    pt_trace trace;

    memset(&train_ld, 0, sizeof train_ld);
    memset(&val_ld, 0, sizeof val_ld);
    memset(&trace, 0, sizeof trace);
    memset(&gpt, 0, sizeof gpt);
    memset(&solo, 0, sizeof solo);
    memset(&cache, 0, sizeof cache);
    memset(&state, 0, sizeof state);
    if (layout) {
        if ((st = pt_grid_init(&grid, world, o->tp, o->dp, o->pp)) != PT_OK) goto fail;
        grid_ok = 1;
    }
    rows = o->batch / o->dp;
    first = layout ? grid.dp_rank * rows : 0;
    memset(&desc, 0, sizeof desc);
    desc.config = o->cfg;
    desc.batch = micro;
    desc.seq = o->seq;
    desc.grid = layout ? &grid : NULL;
    desc.zero = o->zero;
    desc.grad_accum = o->accum;
    desc.schedule = o->schedule;
    desc.chunks = o->chunks;
    desc.recompute = o->recompute;
    if ((st = pt_gpt_init(&gpt, &desc)) != PT_OK) goto fail;
    pt_gpt_init_weights(&gpt, o->seed);

    /* every rank draws the same batches and takes its rows */
    memset(&ld, 0, sizeof ld);
    ld.batch = o->batch;
    ld.seq = o->seq;
    ld.seed = o->seed;
    ld.val_fraction = o->val_fraction;
    if ((st = pt_loader_init(&train_ld, o->tok, PT_SPLIT_TRAIN, &ld)) != PT_OK ||
        (st = pt_loader_init(&val_ld, o->tok, PT_SPLIT_VAL, &ld)) != PT_OK)
        goto fail;
    pt_rng_seed(&rng, o->seed ^ 0x5EED5EEDull);
    if (o->resume) {
        if ((st = pt_checkpoint_load(o->resume, &gpt, &state)) != PT_OK) goto fail;
        pt_loader_seek(&train_ld, state.data_epoch, (size_t)state.data_pos);
        rng.state = state.rng_state;
        if (lead)
            printf("resumed from %s at step %lld%s\n", o->resume, (long long)state.step,
                   state.checksummed ? "" : " (it has no checksums: not verified)");
    }
    inputs = (int *)malloc(sizeof(int) * (size_t)o->batch * o->seq);
    targets = (int *)malloc(sizeof(int) * (size_t)o->batch * o->seq);
    if (!inputs || !targets) {
        st = pt__fail(PT_ERR_OOM, "out of memory for the batch");
        goto fail;
    }

    if (o->nan_step > 0) { /* the planted NaN needs a tensor some rank holds */
        int none = 0;
        if ((st = pt_comm_all_ok(world, !pt_gpt_find_param(&gpt, o->nan_tensor), &none)) !=
            PT_OK)
            goto fail;
        if (none) {
            st = pt__fail(PT_ERR_CONFIG, "--debug-nan-tensor '%s' is no tensor of this model",
                          o->nan_tensor);
            goto fail;
        }
    }

    h_unigram = pt_tokens_unigram_entropy(o->tok, val_ld.begin, val_ld.begin + val_ld.len);
    flops_step = pt_gpt_flops_per_step(&o->cfg, o->batch, o->seq);
    if (lead) {
        printf("model: %d layers, %d heads, %d wide, vocabulary %d, context %d: %.2fM "
               "parameters\n",
               o->cfg.n_layer, o->cfg.n_head, o->cfg.n_embd, o->cfg.vocab_size, o->cfg.block_size,
               (double)gpt.num_params_full / 1e6);
        if (layout)
            printf("layout: tp %d x dp %d x pp %d = %d ranks (%s), ZeRO %d, %d micro-batch%s of "
                   "%d rows per rank and step%s%s\n",
                   o->tp, o->dp, o->pp, world->size,
                   world->kind == PT_COMM_MPI ? "MPI" : "threads", o->zero, o->accum,
                   o->accum > 1 ? "es" : "", micro, o->pp > 1 ? ", schedule " : "",
                   o->pp > 1 ? (o->schedule ? o->schedule : "1f1b") : "");
        printf("memory%s: params %.1f MiB, grads %.1f MiB, AdamW %.1f MiB, activations %.1f MiB, "
               "scratch %.1f MiB\n",
               layout ? " per rank" : "", gpt.mem.params / 1048576.0, gpt.mem.grads / 1048576.0,
               gpt.mem.optimizer / 1048576.0, gpt.mem.activations / 1048576.0,
               gpt.mem.scratch / 1048576.0);
        printf("threads %d%s; measured sgemm peak %.1f GFLOP/s (1024^3); %.2f GFLOP per step\n",
               pt_get_threads(), layout ? " per rank" : "", o->peak, flops_step / 1e9);
        printf("validation unigram entropy: %.3f nats/token (the loss of a model that only "
               "counts tokens)\n",
               h_unigram);
        printf("training %d steps of %d x %d tokens, lr %g -> %g (warm-up %d), weight decay %g, "
               "clip %g\n\n",
               o->steps, o->batch, o->seq, (double)o->lr, (double)o->min_lr, o->warmup,
               (double)o->wd, (double)o->clip);
    }

    opt = pt_adamw_default();
    opt.weight_decay = o->wd;
    sched.lr = o->lr;
    sched.min_lr = o->min_lr;
    sched.warmup_steps = o->warmup;
    sched.total_steps = o->steps;
    t_start = pt_time_now();
    good_step = (int)state.step;
    for (step = (int)state.step;
         step < o->steps && !(o->stop_after > 0 && step >= o->stop_after); step++) {
        double t0 = pt_time_now(), step_loss = 0.0;
        float lr_now = pt_lr_at(&sched, step), norm;
        int last = step + 1 == o->steps || step + 1 == o->stop_after, k;
        int bad;
        pt_loader_next(&train_ld, inputs, targets);
        if (world->rank == o->fail_rank && step + 1 == o->fail_step) /* planted bad data */
            inputs[(size_t)first * o->seq] = o->cfg.vocab_size;
        if (o->pp > 1) { /* the micro-batches through the stages, as the schedule says */
            size_t at = (size_t)first * o->seq;
            int traced = o->trace_path && step + 1 == o->trace_step;
            if (traced) gpt.trace = &trace;
            st = pt_gpt_pipeline_step(&gpt, inputs + at, targets + at, rows, o->seq);
            gpt.trace = NULL;
            if (st != PT_OK) goto fail;
            if (traced && (st = write_step_trace(&trace, world, o->trace_path, step + 1)) != PT_OK)
                goto fail;
            step_loss = gpt.loss;
        }
        for (k = 0; o->pp == 1 && k < o->accum; k++) {
            size_t at = (size_t)(first + k * micro) * o->seq;
            if ((st = pt_gpt_forward(&gpt, inputs + at, targets + at, micro, o->seq)) != PT_OK ||
                (st = pt_gpt_backward(&gpt)) != PT_OK)
                goto fail;
            step_loss += gpt.loss / o->accum;
        }
        if (o->nan_step > 0 && step + 1 >= o->nan_step && step + 1 < o->nan_step + o->nan_count) {
            size_t n;
            float *g = pt_gpt_grad_of(&gpt, o->nan_tensor, &n);
            if (g && n > 0) g[n / 2] = NAN; /* on every rank holding a part of it */
        }
        norm = pt_gpt_clip_grad_norm(&gpt, o->clip);
        /* a non-finite loss or gradient skips the optimizer step on every rank */
        if ((st = pt_gpt_check_step(&gpt, (float)step_loss, norm, &bad, where, sizeof where)) !=
            PT_OK)
            goto fail;
        if (bad) {
            n_bad++;
            if (lead) {
                printf("step %5d/%d | skipped: loss %g, gradient norm %g; the first non-finite "
                       "gradient is %s (%d bad step%s in a row, at most %d)\n",
                       step + 1, o->steps, step_loss, (double)norm, where, n_bad,
                       n_bad > 1 ? "s" : "", o->max_bad);
                fflush(stdout);
            }
            if (n_bad >= o->max_bad) stopped = 1;
        } else {
            if ((st = pt_gpt_adamw_step(&gpt, &opt, lr_now)) != PT_OK) goto fail;
            n_bad = 0;
            good_step = step + 1;
        }
        t_train += pt_time_now() - t0;
        if (!bad) {
            train_loss_avg += step_loss;
            n_avg++;
        }
        if ((step + 1) % o->eval_every == 0 || last)
            val = eval_loss(&gpt, &val_ld, o->eval_batches, inputs, targets, first, rows);
        if (lead && ((step + 1) % o->log_every == 0 || last || step == (int)state.step)) {
            int done_steps = step + 1 - (int)state.step;
            double tps = (double)done_steps * o->batch * o->seq / t_train;
            double mfu = flops_step * done_steps / t_train / (o->peak * 1e9);
            double elapsed = pt_time_now() - t_start;
            char el[32], eta[32], vs[16] = "     -";
            fmt_time(el, sizeof el, elapsed);
            fmt_time(eta, sizeof eta, elapsed / done_steps * (o->steps - step - 1));
            if (val == val) snprintf(vs, sizeof vs, "%.4f", val);
            if (n_avg > 0) /* a line needs a step that was not skipped */
                printf("step %5d/%d | loss %.4f | val %s | lr %.2e | norm %.2f | %7.0f tok/s | "
                       "MFU %4.1f%% | %s elapsed | ETA %s\n",
                       step + 1, o->steps, train_loss_avg / n_avg, vs, (double)lr_now,
                       (double)norm, tps, 100.0 * mfu, el, eta);
            fflush(stdout);
        }
        /* a line shows the mean loss since the last multiple of log_every
           (the first line of a run shows it so far, and does not restart it) */
        if ((step + 1) % o->log_every == 0 || last) {
            train_loss_avg = 0.0;
            n_avg = 0;
        }
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
            if (last && lead) printf("checkpoint: %s (step %d)\n", ckpt_path, step + 1);
        }
        if (stopped) break;
    }
    if (stopped) {
        if (lead && o->ckpt_out)
            fprintf(stderr, "error: %d steps in a row had a non-finite loss or gradient (the "
                    "last, step %d, first in %s): stopped. %s holds the weights and AdamW state "
                    "of step %d, the last good one; --resume continues after the skipped "
                    "batches\n", n_bad, step + 1, where, ckpt_path, good_step);
        else if (lead)
            fprintf(stderr, "error: %d steps in a row had a non-finite loss or gradient (the "
                    "last, step %d, first in %s): stopped after step %d, the last good one; "
                    "nothing saved (no --checkpoint)\n", n_bad, step + 1, where, good_step);
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

    /* sampling runs on one rank: a split model is first gathered whole */
    if (layout && (o->sample_tokens > 0 || !o->data_path)) {
        full = (float *)malloc(gpt.num_params_full * sizeof(float));
        if (!full) {
            st = pt_comm_fail(world, pt__fail(PT_ERR_OOM, "out of memory gathering the model"));
            goto fail;
        }
        if ((st = pt_gpt_gather(&gpt, PT_BUF_PARAMS, full)) != PT_OK) goto fail;
        if (!lead) goto done;
        desc.grid = NULL;
        desc.zero = 0;
        desc.grad_accum = 1;
        desc.inference = 1;
        desc.batch = 1;
        if ((st = pt_gpt_init(&solo, &desc)) != PT_OK) goto fail;
        memcpy(solo.params, full, gpt.num_params_full * sizeof(float));
        sampler = &solo;
    }
    if (!lead) goto done;
    if ((o->sample_tokens > 0 || !o->data_path) &&
        (st = pt_kv_cache_init(&cache, sampler)) != PT_OK)
        goto fail;
    if (o->sample_tokens > 0) {
        int prompt = '\n', *out = (int *)malloc(sizeof(int) * (size_t)o->sample_tokens);
        pt_sample_desc sd;
        sd.temperature = o->temperature;
        sd.top_k = o->top_k;
        sd.seed = pt_rng_u64(&rng);
        if (!out) {
            st = pt__fail(PT_ERR_OOM, "out of memory for the sample");
            goto fail;
        }
        if ((st = pt_gpt_generate(sampler, &cache, &prompt, 1, out, o->sample_tokens, &sd)) !=
            PT_OK) {
            free(out);
            goto fail;
        }
        if (o->cfg.vocab_size == 256) {
            printf("\n--- sample (temperature %g, top-k %d) ---\n", (double)o->temperature,
                   o->top_k);
            cli_print_bytes(out, o->sample_tokens);
            printf("\n---\n");
            if (!o->data_path) score_sample(out, o->sample_tokens);
        } else {
            int i;
            printf("\n--- sample token ids (no tokenizer for vocabulary %d) ---\n",
                   o->cfg.vocab_size);
            for (i = 0; i < o->sample_tokens; i++)
                printf("%d%c", out[i], i % 16 == 15 ? '\n' : ' ');
            printf("\n---\n");
        }
        free(out);
    }
    if (!o->data_path) {
        double acc = addition_accuracy(sampler, &cache, 200, o->seed + 7);
        printf("additions answered correctly (greedy, 200 random problems a+b with a,b < %d): "
               "%.1f%%\n",
               ADD_MAX, 100.0 * acc);
    }
    goto done;
fail:
    if (st != PT_ERR_COMM) st = pt_comm_fail(world, st);
done:
    if (lead) o->rc = st == PT_OK && !stopped ? 0 : 1;
    free(full);
    free(inputs);
    free(targets);
    pt_trace_free(&trace);
    pt_kv_cache_free(&cache);
    pt_loader_free(&train_ld);
    pt_loader_free(&val_ld);
    pt_gpt_free(&solo);
    pt_gpt_free(&gpt);
    if (grid_ok) pt_grid_free(&grid);
    return st;
}

/* What the command line sets besides the run itself (main resolves it). */
typedef struct train_args {
    const char *preset;
    int threads, n_layer, n_head, n_embd, block_size;
    float peak; /* --peak-gflops (0: measure) */
    pt_tokens_format fmt;
} train_args;

/* The command line into o and a, checked as far as it goes without data or
   ranks. Returns -1 to go on, else the exit status: 0 after --help, 2 after
   an error message. usage: print the usage (world rank 0 does). */
static int train_options(int argc, char **argv, run *o, train_args *a, int usage) {
    const char *data_format = "auto", *recompute = "none";
    int npos, s;
    const char *pos[1];
    cli_opt opts[] = {
        {"data", CLI_STR, &o->data_path, "training data file (default: the embedded task)", 0, 0},
        {"data-format", CLI_STR, &data_format,
         "auto (.bin = llm.c tokens, else raw bytes) | bytes | llmc", 0, 0},
        {"preset", CLI_STR, &a->preset,
         "model size: tiny, mini, small, gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1558m", 0, 0},
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
        {"checkpoint", CLI_STR, &o->ckpt_out, "write a checkpoint here (at the end)", 0, 0},
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
        {"max-bad-steps", CLI_INT, &o->max_bad, "a step with a non-finite loss or gradient is "
         "skipped; this many in a row stop the run (with a checkpoint)", 1, 1e9},
        {"seed", CLI_U64, &o->seed, "seed for weights, data order and sampling", 0, 0},
        {"threads", CLI_INT, &a->threads, "OpenMP/BLAS threads (0: all cores; one rank only)", 0,
         1024},
        {"tp", CLI_INT, &o->tp, "tensor-parallel ranks (divides --heads)", 1, 1024},
        {"dp", CLI_INT, &o->dp, "data-parallel ranks (with --grad-accum, divides --batch)", 1,
         1024},
        {"zero", CLI_INT, &o->zero, "ZeRO stage: 0, 1 (shard AdamW state), 2 (and gradients)", 0,
         2},
        {"grad-accum", CLI_INT, &o->accum, "micro-batches per step and rank (with --pp: the "
         "pipeline's m)", 1, 1 << 20},
        {"pp", CLI_INT, &o->pp, "pipeline stages (at most the layers)", 1, 1024},
        {"schedule", CLI_STR, &o->schedule, "pipeline schedule: gpipe, 1f1b, interleaved, zb-h1",
         0, 0},
        {"chunks", CLI_INT, &o->chunks, "layer chunks per pipeline stage (interleaved)", 1, 64},
        {"recompute", CLI_STR, &recompute, "activation recomputation: none, selective, full", 0,
         0},
        {"trace", CLI_STR, &o->trace_path, "with --pp: write step --trace-step's timeline here "
         "(Chrome trace JSON) and at FILE.svg", 0, 0},
        {"trace-step", CLI_INT, &o->trace_step, "the step --trace records", 1, 1e9},
        {"sample-tokens", CLI_INT, &o->sample_tokens, "tokens to sample at the end (0: none)", 0,
         1e6},
        {"temperature", CLI_FLOAT, &o->temperature, "sampling temperature (0: greedy)", 0, 100},
        {"top-k", CLI_INT, &o->top_k, "sample among the k most likely tokens (0: all)", 0, 1 << 24},
        {"peak-gflops", CLI_FLOAT, &a->peak, "the machine's sgemm GFLOP/s for MFU (0: measure it, "
         "0.5 s)", 0, 1e9},
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
    };
    int nopts = (int)(sizeof opts / sizeof opts[0]);
    const char *text =
        "usage: train [options]\n"
        "Trains a GPT-2 style model with AdamW (warm-up + cosine learning rate) and prints\n"
        "step, train loss, validation loss, tokens/s, model FLOP utilisation against this\n"
        "machine's measured GEMM peak, elapsed time and ETA. Without --data it trains on an\n"
        "embedded generated task (additions and simple sentences) and reports what it learned.\n"
        "--tp/--dp run the ranks as threads (build/train) or MPI processes (build/train_mpi\n"
        "under mpirun, with -np equal to tp x dp).";

    memset(o, 0, sizeof *o);
    o->steps = 1600, o->batch = 16, o->seq = 64, o->warmup = 50, o->eval_every = 100;
    o->eval_batches = 8, o->sample_tokens = 400, o->top_k = 8, o->log_every = 100;
    o->lr = 6e-3f, o->min_lr = 6e-4f, o->wd = 0.1f, o->clip = 1.0f, o->val_fraction = 0.1f;
    o->temperature = 0.8f, o->seed = 1337, o->tp = 1, o->dp = 1, o->pp = 1, o->accum = 1;
    o->chunks = 1, o->trace_step = 2, o->max_bad = 5, o->nan_count = 1;
    o->nan_tensor = "h.0.mlp.c_fc.weight", o->fail_rank = -1, o->fail_step = 1;
    memset(a, 0, sizeof *a);
    a->preset = "mini";
    if ((s = cli_parse(argc, argv, opts, nopts, pos, 0, &npos)) != 0) {
        if (usage) cli_usage(s == 1 ? stdout : stderr, text, opts, nopts);
        return s == 1 ? 0 : 2;
    }
    if (strcmp(data_format, "auto") == 0) a->fmt = PT_TOKENS_AUTO;
    else if (strcmp(data_format, "bytes") == 0) a->fmt = PT_TOKENS_BYTES;
    else if (strcmp(data_format, "llmc") == 0) a->fmt = PT_TOKENS_LLMC;
    else {
        fprintf(stderr, "error: --data-format '%s' is not auto, bytes or llmc\n", data_format);
        return 2;
    }
    if ((o->recompute = cli_recompute(recompute)) < 0) return 2;
    if (o->trace_path && o->pp == 1) {
        fprintf(stderr, "error: --trace records pipeline steps: give --pp 2 or more\n");
        return 2;
    }
    if (o->batch % (o->dp * o->accum) != 0) {
        fprintf(stderr, "error: --batch %d is not divisible by dp=%d x grad_accum=%d\n", o->batch,
                o->dp, o->accum);
        return 2;
    }
    if ((o->keep || (o->resume && strcmp(o->resume, "latest") == 0)) && !o->ckpt_out) {
        fprintf(stderr, "error: --%s needs --checkpoint\n", o->keep ? "keep" : "resume latest");
        return 2;
    }
    return -1;
}

/* The model's shape: the checkpoint's when resuming, else the preset with
   the overrides and the data's vocabulary. */
static pt_status train_config(run *o, const train_args *a, int vocab_size) {
    pt_status st;
    if (o->resume) return pt_gpt_config_from_file(o->resume, 0, &o->cfg);
    if ((st = pt_gpt_config_preset(a->preset, &o->cfg)) != PT_OK) return st;
    if (a->n_layer) o->cfg.n_layer = a->n_layer;
    if (a->n_head) o->cfg.n_head = a->n_head;
    if (a->n_embd) o->cfg.n_embd = a->n_embd;
    /* positions beyond the training length would stay untrained */
    o->cfg.block_size = a->block_size ? a->block_size : o->seq;
    o->cfg.vocab_size = vocab_size;
    return PT_OK;
}

int main(int argc, char **argv) {
    run o;
    train_args a;
    pt_tokens tok;
    char *corpus = NULL;
    pt_comm world;
    pt_status st = PT_OK;
    int rc = 1, mpi = 0;
    char latest[4096];

    memset(&tok, 0, sizeof tok);
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

    /* data: every rank needs all of it (each process loads it under MPI) */
    if (o.data_path) {
        if ((st = pt_tokens_load(&tok, o.data_path, a.fmt)) != PT_OK) goto fail;
        if (world.rank == 0)
            printf("data: %s, %zu tokens, vocabulary %d\n", o.data_path, tok.n, tok.vocab_size);
    } else {
        size_t n = 1 << 21;
        corpus = make_default_corpus(n, 20240520);
        if (!corpus || (st = pt_tokens_from_bytes(&tok, corpus, n)) != PT_OK) goto fail;
        const char *from = strchr(corpus, '\n') + 1, *to = from;
        int k;
        for (k = 0; k < 5; k++) to = strchr(to, '\n') + 1;
        if (world.rank == 0)
            printf("data: embedded task (additions and sentences), %zu bytes, e.g.\n%.*s", n,
                   (int)(to - from), from);
    }

    /* model: from the checkpoint when resuming, else preset + overrides */
    if ((st = train_config(&o, &a, tok.vocab_size)) != PT_OK) goto fail;
    if ((st = pt_tokens_check(&tok, o.cfg.vocab_size)) != PT_OK) goto fail;
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
    pt_set_threads(mpi ? 0 : a.threads); /* the whole machine, before any rank runs */
    o.peak = a.peak > 0.0f ? (double)a.peak : pt_gemm_peak_gflops(1024, 0.5);
    if (mpi) pt_set_threads(a.threads);
    o.tok = &tok;
    o.rc = 1;
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
    cli_world_end(&world);
    return rc;
}
