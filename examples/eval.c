/* eval.c -- multiple-choice evaluation (llm.c's HellaSwag jsonl) on the
   paged KV cache: each question's context is computed once, and its endings,
   batched in one forward, read the context's keys and values.

     build/eval gpt2-dir/ --task hellaswag_val.jsonl
     build/eval build/train_ckpt.safetensors --task tasks.jsonl --limit 100

   A line: {"ctx": "...", "endings": ["...", ...], "label": N}. Each ending is
   scored as " " + ending after the context (as llm.c does): its summed and
   mean cross-entropy over its tokens; acc counts the lowest sum, acc_norm
   the lowest mean (the ending with the lowest mean loss wins). */
#define _POSIX_C_SOURCE 200809L
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"
#include "../common/cli.h"
#include "../common/serve_model.h"

#define EBT 16      /* tokens a KV block */
#define MAX_END 8   /* the most endings a question has */

typedef struct question {
    const char *ctx, *end[MAX_END];
    int n_end, label;
} question;

/* One jsonl line into q (strings in j's pool). 1, or 0 with a message. */
static int parse_line(pt__json *j, question *q, long line) {
    const char *key;
    int first = 1, rc;
    memset(q, 0, sizeof *q);
    q->label = -1;
    if (!pt__json_expect(j, '{')) goto bad;
    while ((rc = pt__json_member(j, &first, &key)) == 1) {
        if (!strcmp(key, "ctx")) {
            if (!(q->ctx = pt__json_string(j))) goto bad;
        } else if (!strcmp(key, "label")) {
            uint64_t v;
            if (!pt__json_u64(j, &v) || v >= MAX_END) goto bad;
            q->label = (int)v;
        } else if (!strcmp(key, "endings")) {
            int f = 1;
            if (!pt__json_expect(j, '[')) goto bad;
            for (;;) {
                pt__ws(j);
                if (j->p < j->end && *j->p == ']') {
                    j->p++;
                    break;
                }
                if ((!f && !pt__json_expect(j, ',')) || q->n_end == MAX_END ||
                    !(q->end[q->n_end++] = pt__json_string(j)))
                    goto bad;
                f = 0;
            }
        } else if (!pt__json_skip(j)) goto bad;
    }
    if (rc == 0 && q->ctx && q->n_end > 0 && q->label >= 0 && q->label < q->n_end) return 1;
bad:
    fprintf(stderr, "error: line %ld: expected {\"ctx\": string, \"endings\": [at most %d "
                    "strings], \"label\": an index of endings}\n", line, MAX_END);
    return 0;
}

typedef struct evaluator {
    serve_model m;
    pt_kv_pages kp;
    float *logits;
    int *ids, *tab; /* token scratch; block tables, one row per ending */
    int tab_w;      /* blocks a table row */
} evaluator;

/* text into at most cap ids at out: the count, or -1 (longer, or no way to read text) */
static int encode(const evaluator *e, const char *text, size_t n, int *out, int cap) {
    int *t = malloc(sizeof(int) * (n + 1)), k;
    if (!t) return -1;
    k = serve_model_encode(&e->m, text, n, t);
    if (k > cap) k = -1;
    if (k > 0) memcpy(out, t, sizeof(int) * (size_t)k);
    free(t);
    return k;
}

/* -log softmax(row)[t] */
static double nll(const float *row, int V, int t) {
    double mx = row[0], s = 0.0;
    int v;
    for (v = 1; v < V; v++) mx = row[v] > mx ? row[v] : mx;
    for (v = 0; v < V; v++) s += exp((double)row[v] - mx);
    return mx + log(s) - (double)row[t];
}

/* Scores q's endings into sum[] and mean[]: the context once (blocks 0..),
   then every ending in one forward, each on the context's full blocks and a
   copy of its partial last one. 1, or 0 (too long) */
static int score(evaluator *e, const question *q, double *sum, double *mean) {
    const pt_gpt_config *c = &e->m.cfg;
    int V = c->vocab_size, bs = c->block_size, nc, i, k, nb, part, next, rows = 0, *ends[MAX_END];
    int ne[MAX_END];
    char *tmp;
    pt_kv_seq seq[MAX_END];
    nc = encode(e, q->ctx, strlen(q->ctx), e->ids, bs);
    if (nc < 1 || nc >= bs) return 0;
    nb = (nc + EBT - 1) / EBT, part = nc % EBT != 0, next = nb;
    for (i = 0; i < nb; i++) e->tab[i] = i;
    memset(seq, 0, sizeof seq);
    seq[0].tokens = e->ids, seq[0].blocks = e->tab, seq[0].n = nc, seq[0].logits_from = nc - 1;
    if (pt_gpt_forward_pages(&e->m.gpt, &e->kp, seq, 1, e->logits + (size_t)bs * V) != PT_OK)
        return 0;
    for (k = 0; k < q->n_end; k++) {
        size_t len = strlen(q->end[k]);
        int *t = e->ids + (size_t)(k + 1) * (bs + 1), *row = e->tab + (size_t)(k + 1) * e->tab_w;
        if (!(tmp = malloc(len + 2))) return 0;
        tmp[0] = ' ';
        memcpy(tmp + 1, q->end[k], len + 1);
        ne[k] = encode(e, tmp, len + 1, t, bs);
        free(tmp);
        if (ne[k] < 1 || nc + ne[k] > bs || rows + ne[k] > bs) return 0;
        ends[k] = t;
        memcpy(row, e->tab, sizeof(int) * (size_t)(nb - part));
        for (i = nb - part; i < (nc + ne[k] + EBT - 1) / EBT; i++) row[i] = next++;
        if (part) { /* the context's partial block, copied */
            size_t from = (size_t)e->tab[nb - 1] * e->kp.block_floats;
            size_t to = (size_t)row[nb - 1] * e->kp.block_floats;
            memcpy(e->kp.k + to, e->kp.k + from, sizeof(float) * e->kp.block_floats);
            memcpy(e->kp.v + to, e->kp.v + from, sizeof(float) * e->kp.block_floats);
        }
        seq[k].tokens = t, seq[k].blocks = row, seq[k].n = ne[k], seq[k].pos = nc;
        seq[k].logits_from = 0;
        rows += ne[k];
    }
    if (pt_gpt_forward_pages(&e->m.gpt, &e->kp, seq, q->n_end, e->logits) != PT_OK) return 0;
    for (k = 0, rows = 0; k < q->n_end; k++) {
        double s = nll(e->logits + (size_t)bs * V, V, ends[k][0]); /* the context's last row */
        for (i = 1; i < ne[k]; i++) s += nll(e->logits + (size_t)(rows + i - 1) * V, V, ends[k][i]);
        rows += ne[k];
        sum[k] = s, mean[k] = s / ne[k];
    }
    return 1;
}

static int argmin(const double *x, int n) {
    int i, b = 0;
    for (i = 1; i < n; i++) b = x[i] < x[b] ? i : b;
    return b;
}

/* Reads the task, scores each question, prints acc and acc_norm. */
static int run(evaluator *e, const char *task, int limit, int verbose) {
    FILE *f = fopen(task, "rb");
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long lineno = 0, total = 0, acc = 0, acc_norm = 0, skipped = 0;
    double t0 = pt_time_now();
    if (!f) return fprintf(stderr, "error: --task %s: %s\n", task, strerror(errno)), 0;
    while ((n = getline(&line, &cap, f)) > 0 && (!limit || total + skipped < limit)) {
        pt__json j;
        question q;
        double sum[MAX_END], mean[MAX_END];
        char *pool = malloc((size_t)n + 1);
        lineno++;
        if (!pool) break;
        memset(&j, 0, sizeof j);
        j.p = line, j.end = line + n, j.pool = pool, j.pool_cap = (size_t)n + 1;
        if (!parse_line(&j, &q, lineno)) return free(pool), free(line), fclose(f), 0;
        if (!score(e, &q, sum, mean)) skipped++;
        else {
            int k;
            if (verbose) {
                printf("%ld: label %d", lineno, q.label);
                for (k = 0; k < q.n_end; k++) printf(" | %.4f %.4f", sum[k], mean[k]);
                printf("\n");
            }
            total++;
            acc += argmin(sum, q.n_end) == q.label;
            acc_norm += argmin(mean, q.n_end) == q.label;
        }
        free(pool);
    }
    free(line);
    fclose(f);
    printf("%ld questions: acc %.4f (%ld), acc_norm %.4f (%ld)", total,
           total ? (double)acc / total : 0.0, acc, total ? (double)acc_norm / total : 0.0,
           acc_norm);
    if (skipped) printf("; %ld skipped (longer than the context, or empty)", skipped);
    printf("\n");
    fprintf(stderr, "eval: %.2f s\n", pt_time_now() - t0);
    return 1;
}

int main(int argc, char **argv) {
    const char *pos[1] = {NULL}, *task = NULL, *tok = NULL;
    int npos, rc, limit = 0, threads = 0, verbose = 0, bs, V, blocks;
    evaluator e;
    cli_opt opts[] = {
        {"task", CLI_STR, &task, "jsonl: {\"ctx\", \"endings\", \"label\"} a line", 0, 0},
        {"tokenizer", CLI_STR, &tok, "tokenizer.json or GPT-2 files (default: the model "
         "directory's tokenizer.json; byte-level models need none)", 0, 0},
        {"limit", CLI_INT, &limit, "the first N questions only (0: all)", 0, 1 << 30},
        {"threads", CLI_INT, &threads, "OpenMP/BLAS threads (0: all cores)", 0, 1024},
        {"verbose", CLI_FLAG, &verbose, "each question's summed and mean losses", 0, 0},
    };
    const char *usage = "usage: eval MODEL --task FILE.jsonl [options]\n"
                        "Scores multiple-choice questions (llm.c's HellaSwag layout): acc, acc_norm.";
    cli_passive_wait(argv);
    if ((rc = cli_parse(argc, argv, opts, 5, pos, 1, &npos)) != 0) {
        if (rc == 1) cli_usage(stdout, usage, opts, 5);
        return rc == 1 ? 0 : 1;
    }
    if (npos != 1 || !task) {
        fprintf(stderr, "error: give a MODEL and --task FILE.jsonl\n");
        return cli_usage(stderr, usage, opts, 5), 1;
    }
    pt_set_threads(threads);
    memset(&e, 0, sizeof e);
    if (!serve_model_load(&e.m, pos[0], tok)) return 1;
    if (!e.m.has_tk && e.m.cfg.vocab_size != 256) {
        fprintf(stderr, "error: vocab_size %d: give --tokenizer\n", e.m.cfg.vocab_size);
        return 1;
    }
    bs = e.m.cfg.block_size, V = e.m.cfg.vocab_size;
    e.tab_w = bs / EBT + 2, blocks = (MAX_END + 1) * e.tab_w;
    e.logits = malloc(sizeof(float) * (size_t)(bs + 1) * V);
    e.ids = malloc(sizeof(int) * (size_t)(MAX_END + 1) * (bs + 1));
    e.tab = malloc(sizeof(int) * (size_t)(MAX_END + 1) * e.tab_w);
    if (!e.logits || !e.ids || !e.tab ||
        pt_kv_pages_init(&e.kp, &e.m.gpt, EBT, blocks, bs) != PT_OK) {
        fprintf(stderr, "error: %s\n", e.logits && e.ids && e.tab ? pt_last_error() : "out of memory");
        return 1;
    }
    rc = run(&e, task, limit, verbose) ? 0 : 1;
    pt_kv_pages_free(&e.kp);
    serve_model_free(&e.m);
    free(e.logits), free(e.ids), free(e.tab);
    return rc;
}
