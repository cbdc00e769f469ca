/* serve_req.h -- the body of a POST /v1/completions request (OpenAI's
   completions API) into a serve_req, and JSON text out: what build/serve
   reads from clients, apart from HTTP so that fuzz/serve_req.c can drive it.
   Needs ptrain.h's implementation (its JSON reader) before it. */
#ifndef PTRAIN_SERVE_REQ_H
#define PTRAIN_SERVE_REQ_H

#include <stdarg.h>

#define SERVE_MAX_STOP 4  /* OpenAI's limit on stop sequences */
#define SERVE_STOP_LEN 64 /* the longest stop sequence taken, in bytes */

/* A parsed request. The prompt is text (text, text_len) or token ids. */
typedef struct serve_req {
    const char *text;
    size_t text_len;
    int *ids, n_ids, prompt_is_ids;
    long long max_tokens; /* 16 when not given */
    float temperature;    /* 1 when not given */
    int top_k, stream, has_seed, n_stop;
    uint64_t seed;
    const char *stop[SERVE_MAX_STOP];
    char *pool;               /* the decoded strings */
    char err[256], param[32]; /* the error and the field it names */
} serve_req;

static inline void serve_req_free(serve_req *r) {
    free(r->pool);
    free(r->ids);
    r->pool = NULL, r->ids = NULL;
}

static inline int serve__bad(serve_req *r, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err, sizeof r->err, fmt, ap);
    va_end(ap);
    snprintf(r->param, sizeof r->param, "%s", param);
    return -1;
}

/* A JSON number into *v (finite); 0 if the value is no number. */
static inline int serve__num(pt__json *j, double *v) {
    const char *s;
    char buf[64], *end;
    pt__ws(j);
    s = j->p;
    if (!pt__json_number(j) || j->p - s >= (long)sizeof buf) return 0;
    memcpy(buf, s, (size_t)(j->p - s));
    buf[j->p - s] = 0;
    *v = strtod(buf, &end);
    return *end == 0 && isfinite(*v);
}

/* An integer-valued number in [lo, hi] into *v, or -1 naming param. */
static inline int serve__int(serve_req *r, pt__json *j, const char *param, double lo, double hi,
                             long long *v) {
    double d;
    if (!serve__num(j, &d) || d != floor(d))
        return serve__bad(r, param, "'%s' must be an integer", param);
    if (d < lo || d > hi)
        return serve__bad(r, param, "'%s' is %.17g; it must be in [%.17g, %.17g]", param, d, lo,
                          hi);
    *v = (long long)d;
    return 0;
}

/* prompt: a string, an array of one string, or an array of token ids in [0, V). */
static inline int serve__prompt(serve_req *r, pt__json *j, int V) {
    pt__ws(j);
    if (j->p < j->end && *j->p == '"') {
        const char *s = pt__json_string(j);
        if (!s) return serve__bad(r, "prompt", "'prompt' is not a valid JSON string");
        r->text = s, r->text_len = strlen(s), r->prompt_is_ids = 0;
        return 0;
    }
    if (!pt__json_expect(j, '['))
        return serve__bad(r, "prompt", "'prompt' must be a string or an array of token ids");
    pt__ws(j);
    if (j->p < j->end && *j->p == '"') { /* ["text"]: one prompt */
        const char *s = pt__json_string(j);
        if (!s || !pt__json_expect(j, ']'))
            return serve__bad(r, "prompt", "'prompt' as an array of strings takes exactly one "
                                           "(batched prompts are not supported)");
        r->text = s, r->text_len = strlen(s), r->prompt_is_ids = 0;
        return 0;
    }
    free(r->ids);
    if (!(r->ids = (int *)malloc(sizeof(int) * ((size_t)(j->end - j->p) / 2 + 1))))
        return serve__bad(r, "prompt", "out of memory");
    r->n_ids = 0, r->prompt_is_ids = 1;
    pt__ws(j);
    if (j->p < j->end && *j->p == ']') return j->p++, 0;
    for (;;) {
        long long v = 0;
        if (serve__int(r, j, "prompt", 0, V - 1, &v)) return -1;
        r->ids[r->n_ids++] = (int)v;
        pt__ws(j);
        if (j->p < j->end && *j->p == ']') return j->p++, 0;
        if (!pt__json_expect(j, ','))
            return serve__bad(r, "prompt", "'prompt': expected ',' or ']' in the token ids");
    }
}

/* stop: null, a string or an array of at most 4 strings (each 1..64 bytes). */
static inline int serve__stop(serve_req *r, pt__json *j) {
    int first = 1;
    pt__ws(j);
    if (pt__json_null(j)) return 0;
    if (j->p < j->end && *j->p == '"') {
        const char *s = pt__json_string(j);
        if (!s || !*s || strlen(s) > SERVE_STOP_LEN)
            return serve__bad(r, "stop", "'stop' strings must have 1 to %d bytes", SERVE_STOP_LEN);
        r->stop[0] = s, r->n_stop = 1;
        return 0;
    }
    if (!pt__json_expect(j, '['))
        return serve__bad(r, "stop", "'stop' must be a string or an array of strings");
    for (r->n_stop = 0;;) {
        const char *s;
        pt__ws(j);
        if (j->p < j->end && *j->p == ']') return j->p++, 0;
        if (!first && !pt__json_expect(j, ','))
            return serve__bad(r, "stop", "'stop': expected ',' or ']'");
        first = 0;
        if (!(s = pt__json_string(j)) || !*s || strlen(s) > SERVE_STOP_LEN)
            return serve__bad(r, "stop", "'stop' strings must have 1 to %d bytes", SERVE_STOP_LEN);
        if (r->n_stop == SERVE_MAX_STOP)
            return serve__bad(r, "stop", "'stop' takes at most %d strings", SERVE_MAX_STOP);
        r->stop[r->n_stop++] = s;
    }
}

/* One member's value by its key; unknown keys are skipped (OpenAI's other
   fields: model, n = 1, echo = false, ...). */
static inline int serve__member(serve_req *r, pt__json *j, const char *key, int V, int *seen) {
    long long v = 0;
    double d;
    int b;
    if (!strcmp(key, "prompt")) return *seen = 1, serve__prompt(r, j, V);
    if (!strcmp(key, "max_tokens")) {
        pt__ws(j);
        if (pt__json_null(j)) return 0;
        return serve__int(r, j, "max_tokens", 0, 9.007199254740992e15, &r->max_tokens);
    }
    if (!strcmp(key, "temperature")) {
        pt__ws(j);
        if (pt__json_null(j)) return 0;
        if (!serve__num(j, &d) || d < 0 || d > 2)
            return serve__bad(r, "temperature", "'temperature' must be a number in [0, 2]");
        r->temperature = (float)d;
        return 0;
    }
    if (!strcmp(key, "top_k")) {
        if (serve__int(r, j, "top_k", 0, 1 << 30, &v)) return -1;
        r->top_k = (int)v;
        return 0;
    }
    if (!strcmp(key, "seed")) {
        pt__ws(j);
        if (pt__json_null(j)) return 0;
        if (serve__int(r, j, "seed", -9.2e18, 9.2e18, &v)) return -1;
        r->seed = (uint64_t)v, r->has_seed = 1;
        return 0;
    }
    if (!strcmp(key, "stop")) return serve__stop(r, j);
    if (!strcmp(key, "stream")) {
        pt__ws(j);
        if (pt__json_null(j)) return 0;
        if (!pt__json_bool(j, &b)) return serve__bad(r, "stream", "'stream' must be a boolean");
        r->stream = b;
        return 0;
    }
    if (!strcmp(key, "n") || !strcmp(key, "best_of")) {
        pt__ws(j);
        if (pt__json_null(j)) return 0;
        if (serve__int(r, j, key, 1, 1, &v)) return -1;
        return 0;
    }
    if (!pt__json_skip(j)) return serve__bad(r, "", "the request body is not valid JSON");
    return 0;
}

/* The body (n bytes, any content) into r for a model of V tokens: 0, or -1
   with r->err and r->param set. serve_req_free(r) either way. */
static inline int serve_req_parse(serve_req *r, const char *body, size_t n, int V) {
    pt__json j;
    const char *key;
    int first = 1, rc, seen = 0;
    memset(r, 0, sizeof *r);
    r->max_tokens = 16, r->temperature = 1.0f;
    if (!(r->pool = (char *)malloc(n + 1))) return serve__bad(r, "", "out of memory");
    memset(&j, 0, sizeof j);
    j.p = body, j.end = body + n, j.pool = r->pool, j.pool_cap = n + 1;
    if (!pt__json_expect(&j, '{')) return serve__bad(r, "", "the request body must be a JSON object");
    while ((rc = pt__json_member(&j, &first, &key)) == 1)
        if (serve__member(r, &j, key, V, &seen)) return -1;
    if (rc < 0) return serve__bad(r, "", "the request body is not valid JSON");
    pt__ws(&j);
    if (j.p != j.end) return serve__bad(r, "", "the request body has data after its JSON object");
    if (!seen) return serve__bad(r, "prompt", "'prompt' is required");
    return 0;
}

/* A growing byte buffer. */
typedef struct serve_buf {
    char *p;
    size_t n, cap;
    int oom;
} serve_buf;

static inline void serve_put(serve_buf *b, const void *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->n + n + 1) * 2;
        char *p = (char *)realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static inline void serve_printf(serve_buf *b, const char *fmt, ...) {
    char tmp[512];
    int k;
    va_list ap;
    va_start(ap, fmt);
    k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k > 0) serve_put(b, tmp, (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1);
}

/* s as a JSON string (quotes included); bytes that are not valid UTF-8 become
   U+FFFD, so the output is always valid JSON. */
static inline void serve_json_str(serve_buf *b, const char *s, size_t n) {
    size_t i = 0;
    serve_put(b, "\"", 1);
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        int k, ok = len > 0 && i + (size_t)len <= n;
        for (k = 1; ok && k < len; k++) ok = ((unsigned char)s[i + k] >> 6) == 2;
        if (ok && len == 2) ok = c >= 0xC2;
        if (ok && len == 3) {
            unsigned cp = ((c & 15u) << 12) | (((unsigned char)s[i + 1] & 63u) << 6);
            ok = cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF);
        }
        if (ok && len == 4) {
            unsigned cp = ((c & 7u) << 18) | (((unsigned char)s[i + 1] & 63u) << 12);
            ok = cp >= 0x10000 && cp <= 0x10FFFF;
        }
        if (!ok) {
            serve_put(b, "\\ufffd", 6);
            i++;
        } else if (c == '"' || c == '\\') {
            serve_put(b, "\\", 1);
            serve_put(b, s + i, 1);
            i++;
        } else if (c < 0x20) {
            serve_printf(b, "\\u%04x", c);
            i++;
        } else {
            serve_put(b, s + i, (size_t)len);
            i += (size_t)len;
        }
    }
    serve_put(b, "\"", 1);
}

/* An OpenAI error object: {"error": {"message", "type", "param", "code"}}. */
static inline void serve_error_json(serve_buf *b, const char *msg, const char *type,
                                    const char *param, const char *code) {
    serve_put(b, "{\"error\":{\"message\":", 20);
    serve_json_str(b, msg, strlen(msg));
    serve_printf(b, ",\"type\":\"%s\",\"param\":", type);
    if (param && *param) serve_json_str(b, param, strlen(param));
    else serve_put(b, "null", 4);
    if (code) serve_printf(b, ",\"code\":\"%s\"}}", code);
    else serve_put(b, ",\"code\":null}}", 14);
}

#endif
