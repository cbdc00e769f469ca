/* progress.h -- what a training run shows: elapsed times and ETAs, and the
   measured timeline of a step as pictures. Include after ptrain.h. */
#ifndef PTRAIN_PROGRESS_H
#define PTRAIN_PROGRESS_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__unix__)
#include <unistd.h> /* isatty */
#endif

/* seconds as "1h02m" or "3m07s" */
static inline void progress_time(char *buf, size_t n, double s) {
    if (s < 0 || s != s) s = 0;
    if (s >= 3600) snprintf(buf, n, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
    else snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
}

/* The progress of a long pass over bytes (tokenizing a text) on stderr:
   "WHAT: 45.1% of 100.0 MB, 23.1 MB/s, ETA 0m04s", on a terminal one line
   rewritten in place (at most 5 times a second, and at the end), else a line
   every PROGRESS_BYTES_EVERY seconds (nothing for a short pass). */
#define PROGRESS_BYTES_EVERY 5.0
typedef struct progress_bytes {
    char what[4400];
    double t0, shown; /* the start, the last line */
    int tty, lines;
} progress_bytes;

static inline void progress_bytes_start(progress_bytes *p, const char *what) {
    snprintf(p->what, sizeof p->what, "%s", what);
    p->t0 = p->shown = pt_time_now();
    p->lines = 0;
#if defined(__unix__)
    p->tty = isatty(2);
#else
    p->tty = 0;
#endif
}

/* The callback of pt_tokenizer_encode_parallel and pt_text_desc (ctx: the
   progress_bytes). */
static inline void progress_bytes_cb(size_t done, size_t total, void *ctx) {
    progress_bytes *p = (progress_bytes *)ctx;
    double now = pt_time_now(), dt = now - p->t0, rate = dt > 0 ? (double)done / dt : 0.0;
    int end = done >= total;
    char eta[32];
    if (p->tty ? p->lines > 0 && !end && now - p->shown < 0.2
               : end || now - p->shown < PROGRESS_BYTES_EVERY)
        return;
    progress_time(eta, sizeof eta, rate > 0 ? (double)(total - done) / rate : 0.0);
    fprintf(stderr, "%s%s: %5.1f%% of %.1f MB, %.1f MB/s, ETA %s%s", p->tty ? "\r" : "", p->what,
            total ? 100.0 * (double)done / (double)total : 100.0, (double)total / 1e6,
            rate / 1e6, eta, !p->tty || end ? "\n" : "");
    fflush(stderr);
    p->shown = now;
    p->lines++;
}

/* The timed step's actions of every rank, to rank 0, written as Chrome trace
   JSON at path and as an SVG picture at path.svg. Collective over world. */
static inline pt_status progress_write_trace(pt_trace *t, pt_comm *world, const char *path, int step) {
    pt_status st = pt_trace_gather(t, world);
    char svg[4096];
    if (st != PT_OK || world->rank != 0) return st;
    t->title = "ptrain training step (measured)";
    t->track_name = "rank";
    snprintf(svg, sizeof svg, "%s.svg", path);
    if ((st = pt_trace_write_chrome(t, path)) == PT_OK && (st = pt_trace_write_svg(t, svg)) == PT_OK)
        printf("trace of step %d: %s (chrome://tracing) and %s\n", step, path, svg);
    return st;
}

/* A run's loss history: one row per progress line or validation, written
   beside the checkpoint as STEM.loss.csv (step, tokens seen, the mean train
   loss since the row before, the validation loss; empty when not measured)
   and drawn as STEM.loss.svg. A resumed run keeps the rows up to its start. */
typedef struct progress_row {
    long long step, tokens;
    double train, val; /* NAN: not measured at this row */
} progress_row;

typedef struct progress_history {
    progress_row *rows;
    int n, cap;
    char csv[4096], svg[4096];
} progress_history;

/* The file names from the checkpoint's (NULL: no history is kept). */
static inline void progress_history_init(progress_history *h, const char *ckpt) {
    size_t len = ckpt ? strlen(ckpt) : 0;
    memset(h, 0, sizeof *h);
    if (!ckpt) return;
    if (len > 12 && strcmp(ckpt + len - 12, ".safetensors") == 0) len -= 12;
    snprintf(h->csv, sizeof h->csv, "%.*s.loss.csv", (int)len, ckpt);
    snprintf(h->svg, sizeof h->svg, "%.*s.loss.svg", (int)len, ckpt);
}

static inline int progress_history_add(progress_history *h, long long step, long long tokens,
                                double train, double val) {
    if (!h->csv[0]) return 1;
    if (h->n == h->cap) {
        int cap = h->cap ? 2 * h->cap : 256;
        progress_row *r = (progress_row *)realloc(h->rows, (size_t)cap * sizeof *r);
        if (!r) return 0;
        h->rows = r, h->cap = cap;
    }
    h->rows[h->n].step = step, h->rows[h->n].tokens = tokens;
    h->rows[h->n].train = train, h->rows[h->n].val = val;
    h->n++;
    return 1;
}

/* The rows of an earlier CSV up to step `upto` (a resume's start). */
static inline void progress_history_load(progress_history *h, long long upto) {
    FILE *f = h->csv[0] ? fopen(h->csv, "r") : NULL;
    char line[256];
    if (!f) return;
    while (fgets(line, sizeof line, f)) {
        long long step, tokens;
        char tr[64] = "", va[64] = "";
        if (sscanf(line, "%lld,%lld,%63[^,\n],%63[^,\n]", &step, &tokens, tr, va) < 2 ||
            step > upto)
            continue;
        if (sscanf(line, "%lld,%lld,,%63[^,\n]", &step, &tokens, va) == 3) tr[0] = 0;
        progress_history_add(h, step, tokens, tr[0] ? atof(tr) : NAN, va[0] ? atof(va) : NAN);
    }
    fclose(f);
}

/* The CSV and the SVG of train and validation loss against tokens seen. */
static inline pt_status progress_history_write(const progress_history *h) {
    FILE *f;
    double *xt, *tr, *xv, *va;
    int i, nt = 0, nv = 0;
    pt_plot_series s[2];
    pt_status st;
    if (!h->csv[0]) return PT_OK;
    if (!(f = fopen(h->csv, "w")))
        return pt_error(PT_ERR_IO, "cannot write %s: %s", h->csv, strerror(errno));
    fprintf(f, "step,tokens,train_loss,val_loss\n");
    for (i = 0; i < h->n; i++) {
        const progress_row *r = &h->rows[i];
        fprintf(f, "%lld,%lld,", r->step, r->tokens);
        if (r->train == r->train) fprintf(f, "%.6f", r->train);
        fprintf(f, ",");
        if (r->val == r->val) fprintf(f, "%.6f", r->val);
        fprintf(f, "\n");
    }
    if (fclose(f) != 0) return pt_error(PT_ERR_IO, "cannot write %s", h->csv);
    /* each curve its measured points: xt, tr (train) and xv, va (validation) */
    if (!(xt = (double *)malloc(4 * sizeof(double) * (size_t)(h->n + 1))))
        return pt_error(PT_ERR_OOM, "out of memory drawing %s", h->svg);
    tr = xt + h->n + 1, xv = tr + h->n + 1, va = xv + h->n + 1;
    for (i = 0; i < h->n; i++) {
        const progress_row *r = &h->rows[i];
        if (r->train == r->train) xt[nt] = (double)r->tokens, tr[nt++] = r->train;
        if (r->val == r->val) xv[nv] = (double)r->tokens, va[nv++] = r->val;
    }
    s[0].name = "train loss", s[0].x = xt, s[0].y = tr, s[0].n = nt;
    s[1].name = "validation loss", s[1].x = xv, s[1].y = va, s[1].n = nv;
    st = pt_plot_write_svg(h->svg, "ptrain: loss", "tokens seen", "loss (nats/token)", s, 2);
    free(xt);
    return st;
}

static inline void progress_history_free(progress_history *h) {
    free(h->rows);
    h->rows = NULL;
    h->n = h->cap = 0;
}

#endif
