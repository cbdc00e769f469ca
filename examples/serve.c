/* serve.c -- an OpenAI-compatible completions server over HTTP/1.1
   (libmicrohttpd), with the KV cache kept across requests and concurrent
   requests decoded together.

     build/serve build/train_ckpt.safetensors --port 8080
     build/serve gpt2-dir/ --kv-cache-mb 512 --max-batch 8
     curl -s localhost:8080/v1/completions -d '{"prompt": "the cat ", "max_tokens": 20}'

   Endpoints: POST /v1/completions (prompt as text or token ids, max_tokens,
   temperature, top_k, seed, stop, stream as server-sent events), GET
   /v1/models, GET /health. Errors are OpenAI error objects.

   The engine (one thread) runs the model: each step is one forward
   (pt_gpt_forward_pages) over the new tokens of every running request, a
   prompt chunk for those starting, one token for those decoding; requests
   join and leave between steps. Keys and values live in blocks of 16 tokens
   (--kv-cache-mb of them); a prompt's full blocks are indexed by their
   tokens and the block before them, so a later prompt with the same prefix
   reads them instead of computing them; unused indexed blocks are evicted
   least recently used first. HTTP runs a thread per connection. */
#define _POSIX_C_SOURCE 200809L
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"
#include "../common/cli.h"
#include "../common/serve_model.h"
#include "../common/serve_req.h"
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>

#define BT 16                 /* tokens a KV block */
#define MAX_BODY (1 << 20)    /* the largest request body */

/* One request in the engine. Fields below `mu` change under the server's
   mutex; the engine alone touches blocks and computed. */
typedef struct job {
    int *prompt, n_prompt, max_new, top_k, *out, n_out, cached, stream, id;
    float temperature;
    pt_rng rng;
    int *blocks, n_blocks, computed; /* KV rows written (or read from the cache) */
    char *stops[SERVE_MAX_STOP];
    int n_stop, stop_len;
    /* mu */
    serve_buf text;                   /* the output text so far */
    size_t safe;                      /* text bytes final (no stop string can start in them) */
    int done, cancelled, refs;
    const char *finish;
    pthread_cond_t cond;
    struct job *next;
} job;

/* The blocks: refcounts, the prefix index (a hash table over (parent block,
   its generation, the block's tokens)), and the LRU list of indexed blocks no
   request holds. A block not indexed and unheld is on the free list. */
typedef struct blocks {
    int n, *ref, *indexed, *parent, *prev, *next, *hnext, *head, nbuck, free_top, *free, lru_h, lru_t;
    unsigned *gen, *pgen;
    uint64_t *hash;
    int *tok; /* n x BT */
    int n_lru;
} blocks;

typedef struct server {
    serve_model m;
    pt_kv_pages kp;
    blocks b;
    const char *model_path, *host, *tok_path, *reuse;
    char model_id[256];
    int port, kv_mb, max_batch, max_rows, timeout, reuse_on, next_id, stop;
    float *logits;
    pthread_mutex_t mu;
    pthread_cond_t work;
    job *queue, *queue_tail, **active;
    int n_active;
    long long n_requests, cached_total;
} server;

/* ---- the blocks ------------------------------------------------------------ */

static uint64_t blk_key(int parent, unsigned pgen, const int *tok) {
    uint64_t h = 1469598103934665603ull ^ ((uint64_t)(unsigned)parent << 32 | pgen);
    int i;
    for (i = 0; i < BT; i++) h = (h ^ (uint64_t)(unsigned)tok[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static int blocks_init(blocks *b, int n) {
    int i;
    memset(b, 0, sizeof *b);
    b->n = n;
    for (b->nbuck = 1; b->nbuck < 2 * n; b->nbuck *= 2) {}
    b->ref = calloc((size_t)n, sizeof(int)), b->indexed = calloc((size_t)n, sizeof(int));
    b->parent = calloc((size_t)n, sizeof(int)), b->prev = calloc((size_t)n, sizeof(int));
    b->next = calloc((size_t)n, sizeof(int)), b->hnext = calloc((size_t)n, sizeof(int));
    b->free = calloc((size_t)n, sizeof(int)), b->head = malloc(sizeof(int) * (size_t)b->nbuck);
    b->gen = calloc((size_t)n, sizeof(unsigned)), b->pgen = calloc((size_t)n, sizeof(unsigned));
    b->hash = calloc((size_t)n, sizeof(uint64_t)), b->tok = calloc((size_t)n * BT, sizeof(int));
    if (!b->ref || !b->indexed || !b->parent || !b->prev || !b->next || !b->hnext || !b->free ||
        !b->head || !b->gen || !b->pgen || !b->hash || !b->tok)
        return 0;
    for (i = 0; i < b->nbuck; i++) b->head[i] = -1;
    for (i = n - 1; i >= 0; i--) b->free[b->free_top++] = i;
    b->lru_h = b->lru_t = -1;
    return 1;
}

static void blocks_free(blocks *b) {
    free(b->ref), free(b->indexed), free(b->parent), free(b->prev), free(b->next);
    free(b->hnext), free(b->free), free(b->head), free(b->gen), free(b->pgen), free(b->hash);
    free(b->tok);
}

static void lru_unlink(blocks *b, int i) {
    if (b->prev[i] >= 0) b->next[b->prev[i]] = b->next[i];
    else b->lru_h = b->next[i];
    if (b->next[i] >= 0) b->prev[b->next[i]] = b->prev[i];
    else b->lru_t = b->prev[i];
    b->n_lru--;
}

/* The indexed block holding tok after block parent (-1: the first), or -1. */
static int blocks_find(const blocks *b, int parent, unsigned pgen, const int *tok) {
    uint64_t h = blk_key(parent, pgen, tok);
    int i;
    for (i = b->head[h & (uint64_t)(b->nbuck - 1)]; i >= 0; i = b->hnext[i])
        if (b->hash[i] == h && b->parent[i] == parent && b->pgen[i] == pgen &&
            !memcmp(b->tok + (size_t)i * BT, tok, sizeof(int) * BT))
            return i;
    return -1;
}

/* A held block: a free one, else the least recently used indexed one (its
   index entry dropped, its generation bumped so its children no longer
   match); -1 when every block is held. */
static int blocks_take(blocks *b) {
    int i;
    if (b->free_top) i = b->free[--b->free_top];
    else if ((i = b->lru_h) >= 0) {
        int *p = &b->head[b->hash[i] & (uint64_t)(b->nbuck - 1)];
        lru_unlink(b, i);
        while (*p != i) p = &b->hnext[*p];
        *p = b->hnext[i];
        b->indexed[i] = 0;
        b->gen[i]++;
    } else return -1;
    b->ref[i] = 1;
    return i;
}

static void blocks_hold(blocks *b, int i) {
    if (b->ref[i]++ == 0) lru_unlink(b, i);
}

static void blocks_release(blocks *b, int i) {
    if (--b->ref[i]) return;
    if (!b->indexed[i]) {
        b->free[b->free_top++] = i;
        return;
    }
    b->prev[i] = b->lru_t, b->next[i] = -1; /* most recently used at the tail */
    if (b->lru_t >= 0) b->next[b->lru_t] = i;
    else b->lru_h = i;
    b->lru_t = i;
    b->n_lru++;
}

/* Indexes held block i as tok after parent (unless such a block is indexed). */
static void blocks_index(blocks *b, int i, int parent, const int *tok) {
    unsigned pgen = parent >= 0 ? b->gen[parent] : 0;
    uint64_t h;
    if (b->indexed[i] || blocks_find(b, parent, pgen, tok) >= 0) return;
    h = blk_key(parent, pgen, tok);
    memcpy(b->tok + (size_t)i * BT, tok, sizeof(int) * BT);
    b->parent[i] = parent, b->pgen[i] = pgen, b->hash[i] = h, b->indexed[i] = 1;
    b->hnext[i] = b->head[h & (uint64_t)(b->nbuck - 1)];
    b->head[h & (uint64_t)(b->nbuck - 1)] = i;
}

/* ---- the engine ------------------------------------------------------------ */

static void job_unref(job *j) { /* under mu */
    int i;
    if (--j->refs) return;
    for (i = 0; i < j->n_stop; i++) free(j->stops[i]);
    free(j->prompt), free(j->out), free(j->blocks), free(j->text.p);
    pthread_cond_destroy(&j->cond);
    free(j);
}

/* The request's blocks: its prompt's longest indexed prefix of full blocks
   (leaving at least one prompt token to compute), then new ones for every
   position it will write. 0 when the blocks are short (nothing held then). */
static int job_admit(server *s, job *j) {
    blocks *b = &s->b;
    int need = (j->n_prompt + j->max_new - 1 + BT - 1) / BT, k = 0, i;
    if (s->reuse_on)
        for (; k < (j->n_prompt - 1) / BT; k++) {
            int par = k ? j->blocks[k - 1] : -1;
            int f = blocks_find(b, par, par >= 0 ? b->gen[par] : 0, j->prompt + k * BT);
            if (f < 0) break;
            blocks_hold(b, f);
            j->blocks[k] = f;
        }
    if (need - k > b->free_top + b->n_lru) {
        for (i = 0; i < k; i++) blocks_release(b, j->blocks[i]);
        return 0;
    }
    for (i = k; i < need; i++) j->blocks[i] = blocks_take(b);
    j->n_blocks = need;
    j->cached = j->computed = k * BT;
    return 1;
}

static void job_retire(server *s, job *j) { /* engine, under mu */
    int i;
    for (i = 0; i < j->n_blocks; i++) blocks_release(&s->b, j->blocks[i]);
    j->n_blocks = 0;
    j->done = 1;
    j->safe = j->text.n;
    pthread_cond_broadcast(&j->cond);
    job_unref(j);
}

/* Appends token t to j's output and text; stops at a stop string or at
   max_tokens. Under mu. */
static void job_append(server *s, job *j, int t) {
    unsigned char byte;
    size_t len, from, hold = 0, k;
    const unsigned char *p = serve_model_bytes(&s->m, t, &len, &byte);
    int i;
    j->out[j->n_out++] = t;
    if (p) serve_put(&j->text, p, len);
    from = j->text.n > len + SERVE_STOP_LEN ? j->text.n - len - SERVE_STOP_LEN : 0;
    for (i = 0; i < j->n_stop; i++) {
        char *hit = j->text.p ? strstr(j->text.p + from, j->stops[i]) : NULL;
        if (hit) {
            j->text.n = (size_t)(hit - j->text.p);
            j->text.p[j->text.n] = 0;
            j->finish = "stop";
        }
    }
    if (!j->finish && j->n_out == j->max_new) j->finish = "length";
    if (j->finish) return;
    if (j->stop_len) hold = (size_t)j->stop_len - 1;
    for (k = 0; k < 3 && k < j->text.n; k++) { /* an unfinished UTF-8 character waits too */
        unsigned char c = (unsigned char)j->text.p[j->text.n - 1 - k];
        if ((c & 0xC0) != 0x80) {
            size_t want = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
            if (want > k + 1 && hold < k + 1) hold = k + 1;
            break;
        }
    }
    if (j->text.n > hold && j->text.n - hold > j->safe) j->safe = j->text.n - hold;
    pthread_cond_broadcast(&j->cond);
}

/* Under mu: cancelled requests leave, queued ones join while there is room. */
static void engine_admit(server *s) {
    int i, k = 0;
    for (i = 0; i < s->n_active; i++) {
        if (s->active[i]->cancelled) job_retire(s, s->active[i]);
        else s->active[k++] = s->active[i];
    }
    s->n_active = k;
    while (s->queue && s->n_active < s->max_batch) {
        job *j = s->queue;
        if (j->cancelled) {
            s->queue = j->next;
            job_retire(s, j);
            continue;
        }
        if (!job_admit(s, j)) break; /* waits for blocks */
        s->queue = j->next;
        s->cached_total += j->cached;
        if (j->max_new == 0) {
            j->finish = "length";
            job_retire(s, j);
            continue;
        }
        s->active[s->n_active++] = j;
    }
    if (!s->queue) s->queue_tail = NULL;
}

/* One step: decoding rows first, then prompt chunks in what rows are left. */
static int engine_batch(server *s, pt_kv_seq *seq, job **who) {
    int i, n = 0, rows = 0, pass;
    for (pass = 0; pass < 2; pass++)
        for (i = 0; i < s->n_active; i++) {
            job *j = s->active[i];
            pt_kv_seq *q = &seq[n];
            int prefill = j->computed < j->n_prompt;
            if (prefill != pass || rows == s->max_rows) continue;
            q->blocks = j->blocks;
            q->pos = j->computed;
            if (prefill) {
                q->tokens = j->prompt + j->computed;
                q->n = j->n_prompt - j->computed;
                if (q->n > s->max_rows - rows) q->n = s->max_rows - rows;
                q->logits_from = j->computed + q->n == j->n_prompt ? q->n - 1 : q->n;
            } else {
                q->tokens = j->out + j->n_out - 1;
                q->n = 1;
                q->logits_from = 0;
            }
            rows += q->n;
            who[n++] = j;
        }
    return n;
}

static void *engine_main(void *arg) {
    server *s = (server *)arg;
    pt_kv_seq *seq = calloc((size_t)s->max_batch, sizeof *seq);
    job **who = calloc((size_t)s->max_batch, sizeof *who);
    float *work = malloc(sizeof(float) * (size_t)s->m.cfg.vocab_size);
    int V = s->m.cfg.vocab_size;
    if (!seq || !who || !work) abort();
    pthread_mutex_lock(&s->mu);
    for (;;) {
        int n, i, r = 0, k;
        engine_admit(s);
        if (s->stop) break;
        if (!s->n_active) {
            pthread_cond_wait(&s->work, &s->mu);
            continue;
        }
        n = engine_batch(s, seq, who);
        pthread_mutex_unlock(&s->mu);
        if (pt_gpt_forward_pages(&s->m.gpt, &s->kp, seq, n, s->logits) != PT_OK) {
            fprintf(stderr, "serve: forward failed: %s\n", pt_last_error());
            abort(); /* the batch was checked when it was built: a bug */
        }
        pthread_mutex_lock(&s->mu);
        for (i = 0; i < n; i++) {
            job *j = who[i];
            j->computed += seq[i].n;
            if (seq[i].logits_from == seq[i].n) continue;
            if (seq[i].pos < j->n_prompt) /* the prompt's last chunk: index its full blocks */
                for (k = 0; s->reuse_on && k < j->n_prompt / BT; k++)
                    blocks_index(&s->b, j->blocks[k], k ? j->blocks[k - 1] : -1,
                                 j->prompt + k * BT);
            job_append(s, j, pt_sample_logits(s->logits + (size_t)r * V, V, j->temperature,
                                              j->top_k, &j->rng, work));
            r++;
        }
        for (i = 0, k = 0; i < s->n_active; i++) {
            if (s->active[i]->finish) job_retire(s, s->active[i]);
            else s->active[k++] = s->active[i];
        }
        s->n_active = k;
    }
    pthread_mutex_unlock(&s->mu);
    free(seq), free(who), free(work);
    return NULL;
}

/* ---- HTTP ------------------------------------------------------------------ */

/* A connection's state between the access handler's calls. */
typedef struct conn {
    serve_buf body;
    int too_big;
} conn;

/* What a stream's reader needs. */
typedef struct stream {
    server *s;
    job *j;
    size_t sent; /* text bytes sent */
    int state;   /* 0 text, 1 the final chunk sent, 2 [DONE] sent */
    serve_buf chunk;
    size_t chunk_off;
} stream;

static enum MHD_Result reply(struct MHD_Connection *c, unsigned code, serve_buf *b) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(b->n, b->p ? b->p : (void *)"", MHD_RESPMEM_MUST_COPY);
    enum MHD_Result rc;
    free(b->p);
    memset(b, 0, sizeof *b);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "application/json");
    rc = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result reply_error(struct MHD_Connection *c, unsigned code, const char *msg,
                                   const char *param, const char *type) {
    serve_buf b;
    memset(&b, 0, sizeof b);
    serve_error_json(&b, msg, type ? type : "invalid_request_error", param, NULL);
    return reply(c, code, &b);
}

/* The head of a completion object, through "choices":[{"text": */
static void completion_head(serve_buf *b, const server *s, const job *j, const char *object) {
    serve_printf(b, "{\"id\":\"cmpl-%d\",\"object\":\"%s\",\"created\":%lld,\"model\":", j->id,
                 object, (long long)time(NULL));
    serve_json_str(b, s->model_id, strlen(s->model_id));
    serve_put(b, ",\"choices\":[{\"text\":", 20);
}

/* The rest after the text: finish_reason (NULL: null), token ids, usage. */
static void completion_tail(serve_buf *b, const job *j, const char *finish, int usage) {
    int i;
    serve_put(b, ",\"index\":0,\"logprobs\":null,\"finish_reason\":", 43);
    if (finish) serve_printf(b, "\"%s\"", finish);
    else serve_put(b, "null", 4);
    if (usage) {
        serve_put(b, ",\"token_ids\":[", 14);
        for (i = 0; i < j->n_out; i++) serve_printf(b, i ? ",%d" : "%d", j->out[i]);
        serve_printf(b, "]}],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,"
                        "\"total_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":%d}}}",
                     j->n_prompt, j->n_out, j->n_prompt + j->n_out, j->cached);
    } else {
        serve_put(b, "}]}", 3);
    }
}

/* The reader of a stream: SSE events of new text (what the engine added since
   the last one), then one with empty text, the finish reason and usage, then
   [DONE]. Waits for the engine (1 s at a time). */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    stream *st = (stream *)cls;
    server *s = st->s;
    job *j = st->j;
    size_t n;
    (void)pos;
    while (st->chunk_off == st->chunk.n) {
        free(st->chunk.p);
        memset(&st->chunk, 0, sizeof st->chunk);
        st->chunk_off = 0;
        if (st->state == 2) return MHD_CONTENT_READER_END_OF_STREAM;
        pthread_mutex_lock(&s->mu);
        while (!j->done && j->safe == st->sent && !s->stop) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 1;
            pthread_cond_timedwait(&j->cond, &s->mu, &ts);
        }
        if (s->stop && !j->done) {
            pthread_mutex_unlock(&s->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (st->state == 1) {
            serve_put(&st->chunk, "data: [DONE]\n\n", 14);
            st->state = 2;
        } else { /* new text; once all is sent, the finish reason and usage on their own */
            int last = j->safe == st->sent;
            serve_put(&st->chunk, "data: ", 6);
            completion_head(&st->chunk, s, j, "text_completion");
            serve_json_str(&st->chunk, j->text.p ? j->text.p + st->sent : "", j->safe - st->sent);
            st->sent = j->safe;
            completion_tail(&st->chunk, j, last ? j->finish : NULL, last);
            serve_put(&st->chunk, "\n\n", 2);
            if (last) st->state = 1;
        }
        pthread_mutex_unlock(&s->mu);
        if (st->chunk.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    n = st->chunk.n - st->chunk_off < max ? st->chunk.n - st->chunk_off : max;
    memcpy(buf, st->chunk.p + st->chunk_off, n);
    st->chunk_off += n;
    return (ssize_t)n;
}

/* The stream is over (sent, or the client left): the job is cancelled if
   still running, and let go. */
static void stream_free(void *cls) {
    stream *st = (stream *)cls;
    pthread_mutex_lock(&st->s->mu);
    st->j->cancelled = 1;
    pthread_cond_signal(&st->s->work);
    job_unref(st->j);
    pthread_mutex_unlock(&st->s->mu);
    free(st->chunk.p);
    free(st);
}

/* The request's checks against the model: a job, or NULL after an error
   reply into *rc. */
static job *job_new(server *s, struct MHD_Connection *c, serve_req *q, enum MHD_Result *rc) {
    job *j = calloc(1, sizeof *j);
    int n = 0, i, bs = s->m.cfg.block_size;
    char msg[256];
    if (!j) return *rc = reply_error(c, 500, "out of memory", "", "server_error"), NULL;
    j->refs = 1;
    pthread_cond_init(&j->cond, NULL);
    j->prompt = malloc(sizeof(int) * ((q->prompt_is_ids ? (size_t)q->n_ids : q->text_len) + 1));
    if (!j->prompt) goto oom;
    if (q->prompt_is_ids) memcpy(j->prompt, q->ids, sizeof(int) * (size_t)(n = q->n_ids));
    else if ((n = serve_model_encode(&s->m, q->text, q->text_len, j->prompt)) < 0) {
        snprintf(msg, sizeof msg, "this model (vocab_size %d) has no tokenizer: give the prompt "
                 "as an array of token ids", s->m.cfg.vocab_size);
        goto bad;
    }
    j->n_prompt = n;
    if (n == 0) {
        snprintf(msg, sizeof msg, "'prompt' is empty; a completion needs at least one token");
        goto bad;
    }
    if ((long long)n + q->max_tokens > bs) {
        snprintf(msg, sizeof msg, "This model's maximum context length is %d tokens. However, you "
                 "requested %lld tokens (%d in your prompt; %lld for the completion). Please "
                 "reduce your prompt; or completion length.", bs, (long long)n + q->max_tokens,
                 n, q->max_tokens);
        goto bad;
    }
    j->max_new = (int)q->max_tokens, j->temperature = q->temperature, j->top_k = q->top_k;
    j->stream = q->stream, j->n_stop = q->n_stop;
    for (i = 0; i < q->n_stop; i++) {
        j->stops[i] = strdup(q->stop[i]);
        if ((int)strlen(q->stop[i]) > j->stop_len) j->stop_len = (int)strlen(q->stop[i]);
    }
    pt_rng_seed(&j->rng, q->has_seed ? q->seed : (uint64_t)time(NULL) * 2654435761u + (uint64_t)n);
    j->out = malloc(sizeof(int) * (size_t)(j->max_new + 1));
    j->blocks = malloc(sizeof(int) * (size_t)(bs / BT + 2));
    if (!j->out || !j->blocks) goto oom;
    return j;
oom:
    snprintf(msg, sizeof msg, "out of memory");
bad:
    *rc = reply_error(c, 400, msg, "prompt", NULL);
    for (i = 0; i < j->n_stop; i++) free(j->stops[i]);
    j->n_stop = 0;
    job_unref(j);
    return NULL;
}

/* POST /v1/completions: the job queued; the reply when it is done, or a
   stream that follows it. */
static enum MHD_Result completions(server *s, struct MHD_Connection *c, conn *k) {
    serve_req q;
    enum MHD_Result rc = MHD_NO;
    job *j;
    if (serve_req_parse(&q, k->body.p ? k->body.p : "", k->body.n, s->m.cfg.vocab_size)) {
        rc = reply_error(c, 400, q.err, q.param, NULL);
        serve_req_free(&q);
        return rc;
    }
    j = job_new(s, c, &q, &rc);
    serve_req_free(&q);
    if (!j) return rc;
    pthread_mutex_lock(&s->mu);
    j->id = ++s->next_id;
    j->refs = 2; /* the engine's and this connection's */
    if (s->queue_tail) s->queue_tail->next = j;
    else s->queue = j;
    s->queue_tail = j;
    s->n_requests++;
    pthread_cond_signal(&s->work);
    if (j->stream) {
        stream *st = calloc(1, sizeof *st);
        struct MHD_Response *r;
        pthread_mutex_unlock(&s->mu);
        if (!st) {
            pthread_mutex_lock(&s->mu);
            j->cancelled = 1;
            job_unref(j);
            pthread_mutex_unlock(&s->mu);
            return MHD_NO;
        }
        st->s = s, st->j = j;
        r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, st,
                                              stream_free);
        if (!r) return stream_free(st), MHD_NO;
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        /* one stream a connection: node-fetch 2 (the openai client's on Node 18,
           Debian 12's) reports "Premature close" for a chunked response whose
           socket is kept alive */
        MHD_add_response_header(r, "Connection", "close");
        rc = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        return rc;
    }
    while (!j->done && !s->stop) pthread_cond_wait(&j->cond, &s->mu);
    {
        serve_buf b;
        memset(&b, 0, sizeof b);
        completion_head(&b, s, j, "text_completion");
        serve_json_str(&b, j->text.p ? j->text.p : "", j->text.n);
        completion_tail(&b, j, j->finish ? j->finish : "length", 1);
        j->cancelled = 1;
        job_unref(j);
        pthread_mutex_unlock(&s->mu);
        if (b.oom) return reply_error(c, 500, "out of memory", "", "server_error");
        return reply(c, 200, &b);
    }
}

static enum MHD_Result models(server *s, struct MHD_Connection *c) {
    serve_buf b;
    memset(&b, 0, sizeof b);
    serve_put(&b, "{\"object\":\"list\",\"data\":[{\"id\":", 31);
    serve_json_str(&b, s->model_id, strlen(s->model_id));
    serve_printf(&b, ",\"object\":\"model\",\"created\":0,\"owned_by\":\"ptrain\","
                     "\"context_length\":%d,\"vocab_size\":%d}]}",
                 s->m.cfg.block_size, s->m.cfg.vocab_size);
    return reply(c, 200, &b);
}

static enum MHD_Result health(server *s, struct MHD_Connection *c) {
    serve_buf b;
    memset(&b, 0, sizeof b);
    pthread_mutex_lock(&s->mu);
    serve_printf(&b, "{\"status\":\"ok\",\"requests\":%lld,\"running\":%d,\"kv_blocks\":%d,"
                     "\"kv_blocks_free\":%d,\"kv_blocks_cached\":%d,\"cached_tokens\":%lld}",
                 s->n_requests, s->n_active, s->b.n, s->b.free_top, s->b.n_lru, s->cached_total);
    pthread_mutex_unlock(&s->mu);
    return reply(c, 200, &b);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *data,
                                  size_t *size, void **state) {
    server *s = (server *)cls;
    conn *k = (conn *)*state;
    int post = !strcmp(method, "POST"), get = !strcmp(method, "GET");
    (void)version;
    if (!k) { /* the headers: a connection state for the body */
        if (!(k = calloc(1, sizeof *k))) return MHD_NO;
        *state = k;
        return MHD_YES;
    }
    if (*size) { /* a piece of the body */
        if (k->body.n + *size > MAX_BODY) k->too_big = 1;
        else serve_put(&k->body, data, *size);
        *size = 0;
        return MHD_YES;
    }
    if (!strcmp(url, "/v1/completions")) {
        char msg[96];
        if (!post) return reply_error(c, 405, "use POST for /v1/completions", "", NULL);
        snprintf(msg, sizeof msg, "the request body is over the limit of %d bytes", MAX_BODY);
        if (k->too_big) return reply_error(c, 413, msg, "", NULL);
        if (k->body.oom) return reply_error(c, 500, "out of memory", "", "server_error");
        return completions(s, c, k);
    }
    if (!strcmp(url, "/v1/models") && get) return models(s, c);
    if (!strcmp(url, "/health") && get) return health(s, c);
    if (!strcmp(url, "/v1/models") || !strcmp(url, "/health"))
        return reply_error(c, 405, "use GET", "", NULL);
    return reply_error(c, 404, "no such endpoint: POST /v1/completions, GET /v1/models, "
                               "GET /health", "", NULL);
}

static void on_done(void *cls, struct MHD_Connection *c, void **state,
                    enum MHD_RequestTerminationCode why) {
    conn *k = (conn *)*state;
    (void)cls, (void)c, (void)why;
    if (k) free(k->body.p);
    free(k);
    *state = NULL;
}

/* ---- main -------------------------------------------------------------------- */

/* The options into s; -1 to go on, else the exit status. */
static int serve_options(int argc, char **argv, server *s) {
    const char *pos[1] = {NULL};
    int npos, rc;
    cli_opt opts[] = {
        {"tokenizer", CLI_STR, &s->tok_path, "tokenizer.json, or a directory holding one or "
         "GPT-2's encoder.json + vocab.bpe (default for a model directory: its tokenizer.json)",
         0, 0},
        {"host", CLI_STR, &s->host, "address to listen on (IPv4)", 0, 0},
        {"port", CLI_INT, &s->port, "port (0: any free one, printed)", 0, 65535},
        {"kv-cache-mb", CLI_INT, &s->kv_mb, "MiB of keys and values, shared by the running "
         "requests and the prefix cache", 1, 1 << 20},
        {"max-batch", CLI_INT, &s->max_batch, "requests decoded together in one forward", 1, 256},
        {"kv-reuse", CLI_STR, &s->reuse, "on: prompts reuse the cached blocks of earlier prompts "
         "with the same prefix; off: every prompt computed in full", 0, 0},
        {"timeout", CLI_INT, &s->timeout, "seconds an idle connection is kept", 1, 3600},
    };
    int nopts = (int)(sizeof opts / sizeof opts[0]);
    const char *usage =
        "usage: serve MODEL [options]\n"
        "Serves MODEL (a ptrain checkpoint, a Hugging Face GPT-2 or LLaMA directory, or such a\n"
        "model.safetensors with its config.json) over HTTP: POST /v1/completions (OpenAI's\n"
        "completions API), GET /v1/models, GET /health. Ctrl-C stops it.";
    if ((rc = cli_parse(argc, argv, opts, nopts, pos, 1, &npos)) != 0) {
        if (rc == 1) cli_usage(stdout, usage, opts, nopts);
        return rc == 1 ? 0 : 1;
    }
    if (npos != 1) {
        fprintf(stderr, "error: give a MODEL: a .safetensors file or a model directory\n");
        cli_usage(stderr, usage, opts, nopts);
        return 1;
    }
    s->model_path = pos[0];
    if (strcmp(s->reuse, "on") && strcmp(s->reuse, "off")) {
        fprintf(stderr, "error: --kv-reuse %s: expected on or off\n", s->reuse);
        return 1;
    }
    s->reuse_on = !strcmp(s->reuse, "on");
    return -1;
}

/* The model, the KV blocks (as many as --kv-cache-mb holds, at least one
   context's worth) and the engine's buffers. 1, or 0 after a message. */
static int serve_setup(server *s) {
    const char *base = strrchr(s->model_path, '/');
    size_t blk;
    int n, ctx;
    if (!serve_model_load(&s->m, s->model_path, s->tok_path)) return 0;
    snprintf(s->model_id, sizeof s->model_id, "%s", base && base[1] ? base + 1 : s->model_path);
    blk = pt_kv_pages_block_bytes(&s->m.gpt, BT);
    n = (int)((double)s->kv_mb * 1048576.0 / (double)blk);
    ctx = (s->m.cfg.block_size + BT - 1) / BT;
    if (n < ctx) {
        fprintf(stderr, "error: --kv-cache-mb %d holds %d blocks of %d tokens (%.2f MiB each); "
                        "one context of %d tokens needs %d: give at least %d\n", s->kv_mb, n, BT,
                blk / 1048576.0, s->m.cfg.block_size, ctx,
                (int)ceil(ctx * (double)blk / 1048576.0));
        return 0;
    }
    s->max_rows = s->m.cfg.block_size < 256 ? s->m.cfg.block_size : 256;
    if (s->max_rows < s->max_batch) s->max_rows = s->max_batch;
    if (pt_kv_pages_init(&s->kp, &s->m.gpt, BT, n, s->max_rows) != PT_OK) {
        fprintf(stderr, "error: %s\n", pt_last_error());
        return 0;
    }
    s->logits = malloc(sizeof(float) * (size_t)s->max_batch * (size_t)s->m.cfg.vocab_size);
    s->active = calloc((size_t)s->max_batch, sizeof(job *));
    if (!s->logits || !s->active || !blocks_init(&s->b, n)) {
        fprintf(stderr, "error: out of memory\n");
        return 0;
    }
    fprintf(stderr, "serve: %s (%s%s), context %d, %d KV blocks of %d tokens (%.1f MiB), "
                    "max batch %d, KV reuse %s\n",
            s->model_path, s->m.has_tk ? "tokenizer " : s->m.cfg.vocab_size == 256 ? "bytes" :
            "token ids only", s->m.has_tk ? s->m.tok_path : "", s->m.cfg.block_size, n, BT,
            n * (double)blk / 1048576.0, s->max_batch, s->reuse);
    return 1;
}

/* Listens until SIGINT or SIGTERM. 1, or 0 after a message. */
static int serve_run(server *s) {
    struct sockaddr_in addr;
    struct MHD_Daemon *d;
    const union MHD_DaemonInfo *info;
    pthread_t engine;
    sigset_t set;
    int sig;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)s->port);
    if (inet_pton(AF_INET, s->host, &addr.sin_addr) != 1) {
        fprintf(stderr, "error: --host %s is not an IPv4 address\n", s->host);
        return 0;
    }
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL); /* every thread started from here on */
    signal(SIGPIPE, SIG_IGN);
    if (pthread_create(&engine, NULL, engine_main, s)) return fprintf(stderr, "error: thread\n"), 0;
    d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                             MHD_USE_POLL,
                         0, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, &addr,
                         MHD_OPTION_NOTIFY_COMPLETED, on_done, s, MHD_OPTION_CONNECTION_TIMEOUT,
                         (unsigned)s->timeout, MHD_OPTION_CONNECTION_LIMIT, 900u,
                         MHD_OPTION_THREAD_STACK_SIZE, (size_t)256 * 1024, MHD_OPTION_END);
    if (!d) fprintf(stderr, "error: cannot listen on %s:%d\n", s->host, s->port);
    else {
        info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
        fprintf(stderr, "serve: listening on http://%s:%u\n", s->host,
                info ? (unsigned)info->port : (unsigned)s->port);
        sigwait(&set, &sig);
        fprintf(stderr, "serve: signal %d, stopping\n", sig);
    }
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->work);
    pthread_mutex_unlock(&s->mu);
    pthread_join(engine, NULL);
    if (d) MHD_stop_daemon(d);
    return d != NULL;
}

int main(int argc, char **argv) {
    server *s = calloc(1, sizeof(server));
    int rc;
    if (!s) return 1;
    s->host = "127.0.0.1", s->port = 8080, s->kv_mb = 256, s->max_batch = 8, s->reuse = "on";
    s->timeout = 30;
    cli_passive_wait(argv);
    if ((rc = serve_options(argc, argv, s)) >= 0) return free(s), rc;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work, NULL);
    rc = serve_setup(s) && serve_run(s) ? 0 : 1;
    /* connections' threads are gone with the daemon; jobs left are not freed (exit) */
    pt_kv_pages_free(&s->kp);
    serve_model_free(&s->m);
    blocks_free(&s->b);
    free(s->logits), free(s->active), free(s);
    return rc;
}
