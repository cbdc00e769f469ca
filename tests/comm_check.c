/* comm_check.c -- the communicators (self, threads, MPI) and the tp x dp x pp grid.

     build/comm_check               self; threads with 1, 2, 3, 4 and 8 ranks; grids on
                                    8 and 12 ranks; failures and their propagation
     mpirun -n N build/comm_check_mpi --expect-size N
                                    the same collective and grid checks on the MPI world
                                    (a binary started by another MPI's mpirun runs as N
                                    jobs of one rank: --expect-size catches that)
     mpirun -n N build/comm_check_mpi --fail-rank R
                                    rank R fails while the others wait in an all-reduce:
                                    the job must abort with "rank R: planted failure"
                                    (--started: the others wait for a started all-reduce)
   --filter SUBSTR runs only the checks whose name contains SUBSTR; --small caps
   the large sizes at 4099 floats (for ThreadSanitizer, which is slow). Prints one
   line per check, then "N passed, N failed"; exits 1 if any check failed.

   A collective check runs on every rank; each rank counts its own failed
   CHECKs and the ranks agree on the verdict with pt_comm_all_ok. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ptrain's allocations are counted, to check that steady state allocates nothing */
static unsigned long g_mallocs;
static void *count_malloc(size_t n) {
    __atomic_fetch_add(&g_mallocs, 1ul, __ATOMIC_RELAXED);
    return malloc(n);
}
#define PTRAIN_MALLOC(sz, ctx) ((void)(ctx), count_malloc(sz))
#define PTRAIN_FREE(p, ctx) ((void)(ctx), free(p))
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"

/* ======================================================================== */
/* checks                                                                    */
/* ======================================================================== */

static _Thread_local int t_fail;   /* failed CHECKs of this rank in the running check */
static _Thread_local int t_prints; /* lines printed for them (at most a few) */
static _Thread_local int t_rank;   /* world rank, for the messages */
static int g_pass, g_failed;       /* checks; counted by world rank 0 (every process under MPI) */
static const char *g_filter;
static size_t g_cap = (size_t)-1;  /* --small: the large sizes shrink to this */
#define CAP(n) ((n) < g_cap ? (n) : g_cap)

#if defined(__GNUC__) || defined(__clang__)
__attribute__((format(printf, 2, 3)))
#endif
static void failf(int line, const char *fmt, ...) {
    va_list ap;
    t_fail++;
    if (++t_prints > 6) return;
    printf("    rank %d: comm_check.c:%d: ", t_rank, line);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
}

#define CHECK(c) do { if (!(c)) failf(__LINE__, "CHECK(%s) failed", #c); } while (0)
#define CHECK_EQ(a, b) do {                                                                 \
        long long a_ = (long long)(a), b_ = (long long)(b);                                  \
        if (a_ != b_) failf(__LINE__, "%s = %lld, expected %s = %lld", #a, a_, #b, b_);      \
    } while (0)
#define CHECK_ST(expr, want) do {                                                           \
        pt_status s_ = (expr);                                                               \
        if (s_ != (want))                                                                    \
            failf(__LINE__, "%s returned %s, expected %s (last error: %s)", #expr,           \
                  pt_status_name(s_), pt_status_name(want), pt_last_error());                \
    } while (0)
#define CHECK_MSG(sub) do {                                                                 \
        if (!strstr(pt_last_error(), (sub)))                                                 \
            failf(__LINE__, "last error \"%s\" does not mention \"%s\"", pt_last_error(), (sub)); \
    } while (0)
#define CHECK_ERR(expr, want, sub) do { CHECK_ST(expr, want); CHECK_MSG(sub); } while (0)
#define CHECK_FLOATS(got, want, n) check_floats(__LINE__, #got, got, want, n)

static void check_floats(int line, const char *what, const float *got, const float *want,
                         size_t n) {
    size_t i;
    for (i = 0; i < n; i++)
        if (!(got[i] == want[i])) { /* NaN fails too */
            failf(line, "%s[%zu] = %.9g, expected %.9g (n=%zu)", what, i, (double)got[i],
                  (double)want[i], n);
            return;
        }
}

static float *fbuf(size_t n) {
    float *p = (float *)malloc((n ? n : 1) * sizeof(float));
    if (!p) {
        printf("comm_check: out of memory\n");
        exit(2);
    }
    return p;
}

static void sleep_ms(int ms) {
    struct timespec ts;
    ts.tv_sec = ms / 1000;
    ts.tv_nsec = (long)(ms % 1000) * 1000000L;
    nanosleep(&ts, NULL);
}

/* Small integers, so sums are exact in any order: rank r's element i. It
   depends on i only through i % 23. */
static float val(int r, size_t i) { return (float)((int)((i * 7u + (size_t)r * 13u) % 23u) - 11); }

/* op over ranks 0..size-1 of val(r, i), for i % 23 = 0..22 */
static void expected_table(float *tab, int size, pt_reduce_op op) {
    size_t i;
    int r;
    for (i = 0; i < 23; i++) {
        float acc = val(0, i);
        for (r = 1; r < size; r++) acc = op == PT_REDUCE_MAX ? fmaxf(acc, val(r, i)) : acc + val(r, i);
        tab[i] = op == PT_REDUCE_AVG ? acc / (float)size : acc;
    }
}

static const char *const op_names[] = {"SUM", "AVG", "MAX"};

/* Every rank runs fn(c); then they agree on the verdict; rank 0 prints it. */
static void report(pt_comm *c, const char *label, const char *name) {
    int ok = 0;
    if (pt_comm_all_ok(c, t_fail == 0, &ok) != PT_OK) {
        printf("    rank %d: all_ok failed: %s\n", t_rank, pt_last_error());
        ok = 0;
    }
    if (c->rank == 0) printf("%-4s  %s: %s\n", ok ? "ok" : "FAIL", label, name);
    if (c->rank == 0 || c->kind == PT_COMM_MPI) {
        if (ok) g_pass++;
        else g_failed++;
    }
    fflush(stdout);
}

static int selected(const char *name) { return !g_filter || strstr(name, g_filter); }

static void run(pt_comm *c, const char *label, const char *name, void (*fn)(pt_comm *)) {
    if (!selected(name)) return;
    t_fail = t_prints = 0;
    fn(c);
    report(c, label, name);
}

#ifndef PTRAIN_MPI
/* A check of the main thread (threads backend as a whole). */
static void top(const char *name, int ok) {
    if (!selected(name)) return;
    printf("%-4s  %s\n", ok ? "ok" : "FAIL", name);
    if (ok) g_pass++;
    else g_failed++;
    fflush(stdout);
}
#endif

/* ======================================================================== */
/* collective checks: any communicator                                       */
/* ======================================================================== */

static void ck_all_reduce(pt_comm *c) {
    static const size_t sizes[] = {0, 1, 7, 1003, (1u << 20) + 5};
    size_t k, i;
    int op;
    for (k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = CAP(sizes[k]);
        float *buf = fbuf(n), *want = fbuf(n), tab[23];
        for (op = 0; op < 3; op++) {
            for (i = 0; i < n; i++) buf[i] = val(c->rank, i);
            CHECK_ST(pt_comm_all_reduce(c, buf, n, (pt_reduce_op)op), PT_OK);
            expected_table(tab, c->size, (pt_reduce_op)op);
            for (i = 0; i < n; i++) want[i] = tab[i % 23];
            CHECK_FLOATS(buf, want, n);
        }
        free(buf);
        free(want);
    }
}

static uint64_t xs_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}
static void random_floats(float *x, size_t n, int rank) {
    uint64_t s = 0x9E3779B97F4A7C15ull * (uint64_t)(rank + 1);
    size_t i;
    for (i = 0; i < n; i++) x[i] = (float)((double)(xs_next(&s) >> 11) / 9007199254740992.0) - 0.5f;
}

/* Inexact sums: every rank must still hold the same bits (and under threads,
   exactly the sum in rank order 0..size-1). */
static void ck_bitwise(pt_comm *c) {
    const size_t n = CAP(100003);
    float *buf = fbuf(n), *copy = fbuf(n), *x = fbuf(n), *ref = fbuf(n);
    size_t i;
    int op, r;
    for (op = 0; op < 2; op++) {
        random_floats(buf, n, c->rank);
        CHECK_ST(pt_comm_all_reduce(c, buf, n, (pt_reduce_op)op), PT_OK);
        memcpy(copy, buf, n * sizeof(float));
        CHECK_ST(pt_comm_broadcast(c, copy, n, 0), PT_OK);
        CHECK(memcmp(copy, buf, n * sizeof(float)) == 0);
        random_floats(ref, n, 0);
        for (r = 1; r < c->size; r++) {
            random_floats(x, n, r);
            for (i = 0; i < n; i++) ref[i] += x[i];
        }
        if (op == PT_REDUCE_AVG)
            for (i = 0; i < n; i++) ref[i] /= (float)c->size;
        if (c->kind != PT_COMM_MPI) CHECK(memcmp(ref, buf, n * sizeof(float)) == 0);
        else
            for (i = 0; i < n; i++)
                if (fabsf(ref[i] - buf[i]) > 1e-5f) {
                    failf(__LINE__, "all_reduce %s [%zu] = %g, expected %g", op_names[op], i,
                          (double)buf[i], (double)ref[i]);
                    break;
                }
    }
    free(buf);
    free(copy);
    free(x);
    free(ref);
}

static void ck_reduce_scatter(pt_comm *c) {
    static const size_t sizes[] = {0, 1, 7, 1003, (1u << 17) + 3};
    size_t k, i;
    int op;
    for (k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = CAP(sizes[k]), total = n * (size_t)c->size, base = n * (size_t)c->rank;
        float *in = fbuf(total), *out = fbuf(n), *want = fbuf(n), tab[23];
        for (op = 0; op < 3; op++) {
            for (i = 0; i < total; i++) in[i] = val(c->rank, i);
            for (i = 0; i < n; i++) out[i] = -99.0f;
            CHECK_ST(pt_comm_reduce_scatter(c, in, out, n, (pt_reduce_op)op), PT_OK);
            expected_table(tab, c->size, (pt_reduce_op)op);
            for (i = 0; i < n; i++) want[i] = tab[(base + i) % 23];
            CHECK_FLOATS(out, want, n);
            for (i = 0; i < total; i++)
                if (in[i] != val(c->rank, i)) {
                    failf(__LINE__, "reduce_scatter changed in[%zu]", i);
                    break;
                }
        }
        free(in);
        free(out);
        free(want);
    }
}

static void ck_all_gather(pt_comm *c) {
    static const size_t sizes[] = {0, 1, 7, 1003, (1u << 17) + 1};
    size_t k, i;
    int q, in_place;
    for (k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = CAP(sizes[k]), total = n * (size_t)c->size;
        float *in = fbuf(n), *out = fbuf(total), *want = fbuf(total);
        for (q = 0; q < c->size; q++)
            for (i = 0; i < n; i++) want[(size_t)q * n + i] = val(q, i) + 100.0f * (float)q;
        for (in_place = 0; in_place < 2; in_place++) {
            const float *src = in;
            for (i = 0; i < total; i++) out[i] = -1.0f;
            for (i = 0; i < n; i++) in[i] = val(c->rank, i) + 100.0f * (float)c->rank;
            if (in_place) {
                memcpy(out + (size_t)c->rank * n, in, n * sizeof(float));
                src = out + (size_t)c->rank * n;
            }
            CHECK_ST(pt_comm_all_gather(c, src, out, n), PT_OK);
            CHECK_FLOATS(out, want, total);
        }
        free(in);
        free(out);
        free(want);
    }
}

static void ck_broadcast(pt_comm *c) {
    static const size_t sizes[] = {0, 1, 7, 1003, (1u << 20) + 3};
    size_t k, i;
    int root;
    for (root = 0; root < c->size; root++)
        for (k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            size_t n = CAP(sizes[k]);
            float *buf, *want;
            if (k == 4 && root != c->size - 1) continue; /* the large size from one root */
            buf = fbuf(n), want = fbuf(n);
            for (i = 0; i < n; i++) {
                buf[i] = val(c->rank, i) + 100.0f * (float)c->rank;
                want[i] = val(root, i) + 100.0f * (float)root;
            }
            CHECK_ST(pt_comm_broadcast(c, buf, n, root), PT_OK);
            CHECK_FLOATS(buf, want, n);
            free(buf);
            free(want);
        }
}

static void ck_barrier(pt_comm *c) {
    uint64_t calls = c->calls, bytes = c->bytes;
    int i;
    for (i = 0; i < 200; i++) CHECK_ST(pt_comm_barrier(c), PT_OK);
    CHECK_EQ(c->calls, calls + 200);
    CHECK_EQ(c->bytes, bytes);
}

static void ck_send_recv(pt_comm *c) {
    int r = c->rank, S = c->size, next = (r + 1) % S, prev = (r + S - 1) % S, k, q;
    int partner = (r ^ 1) < S ? (r ^ 1) : r;
    const size_t big = CAP((1u << 20) + 1);
    float a[20], b[20], *x, *y;
    size_t i;
    memset(a, 0, sizeof a);
    memset(b, 0, sizeof b);
    if (c->kind == PT_COMM_SELF) {
        CHECK_ERR(pt_comm_send(c, a, 1, 0, 0), PT_ERR_INVALID_ARG, "self");
        CHECK_ERR(pt_comm_recv(c, a, 1, 0, 0), PT_ERR_INVALID_ARG, "self");
        return;
    }
    /* a ring where everyone sends first: buffered sends cannot deadlock */
    for (i = 0; i < 5; i++) a[i] = (float)(1000 * r) + (float)i;
    CHECK_ST(pt_comm_send(c, a, 5, next, 3), PT_OK);
    CHECK_ST(pt_comm_recv(c, b, 5, prev, 3), PT_OK);
    for (i = 0; i < 5; i++) CHECK(b[i] == (float)(1000 * prev) + (float)i);
    /* twenty messages with one tag arrive in order */
    for (k = 0; k < 20; k++) {
        a[0] = (float)k, a[1] = (float)r, a[2] = -1.0f;
        CHECK_ST(pt_comm_send(c, a, 3, next, 7), PT_OK);
    }
    for (k = 0; k < 20; k++) {
        CHECK_ST(pt_comm_recv(c, b, 3, prev, 7), PT_OK);
        CHECK(b[0] == (float)k && b[1] == (float)prev && b[2] == -1.0f);
    }
    /* tags are matched, not arrival order */
    a[0] = 1.0f;
    CHECK_ST(pt_comm_send(c, a, 1, next, 1), PT_OK);
    a[0] = 2.0f;
    CHECK_ST(pt_comm_send(c, a, 1, next, 2), PT_OK);
    CHECK_ST(pt_comm_recv(c, b, 1, prev, 2), PT_OK);
    CHECK(b[0] == 2.0f);
    CHECK_ST(pt_comm_recv(c, b, 1, prev, 1), PT_OK);
    CHECK(b[0] == 1.0f);
    /* two ranks send each other 4 MB first, then receive */
    x = fbuf(big), y = fbuf(big);
    for (i = 0; i < big; i++) x[i] = val(r, i);
    CHECK_ST(pt_comm_send(c, x, big, partner, 4), PT_OK);
    for (i = 0; i < big; i++) x[i] = -5.0f; /* send copied it */
    CHECK_ST(pt_comm_recv(c, y, big, partner, 4), PT_OK);
    for (i = 0; i < big; i++) x[i] = val(partner, i);
    CHECK_FLOATS(y, x, big);
    free(x);
    free(y);
    /* a receive of the wrong size fails and leaves the message queued */
    for (i = 0; i < 4; i++) a[i] = (float)i + 0.5f;
    CHECK_ST(pt_comm_send(c, a, 4, next, 9), PT_OK);
    CHECK_ERR(pt_comm_recv(c, b, 5, prev, 9), PT_ERR_SHAPE, "has 4 floats");
    CHECK_ST(pt_comm_recv(c, b, 4, prev, 9), PT_OK);
    CHECK(b[0] == 0.5f && b[3] == 3.5f);
    /* empty messages, and messages to oneself */
    CHECK_ST(pt_comm_send(c, NULL, 0, next, 10), PT_OK);
    CHECK_ST(pt_comm_recv(c, NULL, 0, prev, 10), PT_OK);
    a[0] = 42.0f, a[1] = (float)r;
    CHECK_ST(pt_comm_send(c, a, 2, r, 11), PT_OK);
    CHECK_ST(pt_comm_recv(c, b, 2, r, 11), PT_OK);
    CHECK(b[0] == 42.0f && b[1] == (float)r);
    /* every rank sends to rank 0, which receives in reverse order of source */
    a[0] = (float)r;
    CHECK_ST(pt_comm_send(c, a, 1, 0, 12), PT_OK);
    if (r == 0)
        for (q = S - 1; q >= 0; q--) {
            CHECK_ST(pt_comm_recv(c, b, 1, q, 12), PT_OK);
            CHECK(b[0] == (float)q);
        }
    CHECK_ST(pt_comm_barrier(c), PT_OK);
}

static void ck_split(pt_comm *c) {
    int r = c->rank, S = c->size, q, size = 0, rank = 0, j;
    pt_comm sub, sub2, same, alone, bad;
    float v, w[64];
    /* colors by parity, keys reversed: the new rank counts larger old ranks */
    for (q = r % 2; q < S; q += 2) {
        size++;
        rank += q > r;
    }
    CHECK_ST(pt_comm_split(c, r % 2, -r, &sub), PT_OK);
    CHECK_EQ(sub.size, size);
    CHECK_EQ(sub.rank, rank);
    CHECK_EQ(sub.kind, c->kind);
    v = (float)r;
    CHECK_ST(pt_comm_all_reduce(&sub, &v, 1, PT_REDUCE_SUM), PT_OK);
    {
        float want = 0;
        for (q = r % 2; q < S; q += 2) want += (float)q;
        CHECK(v == want);
    }
    /* gathered in the new order: descending old rank */
    v = (float)r;
    if (sub.size <= 64) {
        CHECK_ST(pt_comm_all_gather(&sub, &v, w, 1), PT_OK);
        for (j = 0; j < sub.size; j++) CHECK(w[j] == (float)(r % 2 + 2 * (sub.size - 1 - j)));
    }
    /* nested: split the split by the parity of the new rank */
    CHECK_ST(pt_comm_split(&sub, sub.rank % 2, sub.rank, &sub2), PT_OK);
    CHECK_EQ(sub2.size, (sub.size - sub.rank % 2 + 1) / 2);
    CHECK_EQ(sub2.rank, sub.rank / 2);
    v = (float)r;
    CHECK_ST(pt_comm_all_reduce(&sub2, &v, 1, PT_REDUCE_MAX), PT_OK);
    /* the member with the lowest sub rank of that parity has the largest old rank */
    CHECK(v == (float)(r % 2 + 2 * (sub.size - 1 - sub.rank % 2)));
    /* point to point inside a group uses the group's ranks */
    v = (float)r;
    if (c->kind != PT_COMM_SELF) {
        CHECK_ST(pt_comm_send(&sub, &v, 1, (sub.rank + 1) % sub.size, 5), PT_OK);
        CHECK_ST(pt_comm_recv(&sub, &v, 1, (sub.rank + sub.size - 1) % sub.size, 5), PT_OK);
        CHECK(v == (float)(sub.rank == 0 ? r % 2 : r + 2)); /* the next larger old rank */
    }
    pt_comm_free(&sub2);
    pt_comm_free(&sub);
    CHECK(sub.ops == NULL && sub.impl == NULL);
    pt_comm_free(&sub); /* twice is harmless */
    /* one color, equal keys: the parent's order */
    CHECK_ST(pt_comm_split(c, 5, 0, &same), PT_OK);
    CHECK_EQ(same.size, S);
    CHECK_EQ(same.rank, r);
    CHECK_ST(pt_comm_barrier(&same), PT_OK);
    /* every rank its own color */
    CHECK_ST(pt_comm_split(c, r, 0, &alone), PT_OK);
    CHECK_EQ(alone.size, 1);
    CHECK_EQ(alone.rank, 0);
    v = 3.0f;
    CHECK_ST(pt_comm_all_reduce(&alone, &v, 1, PT_REDUCE_AVG), PT_OK);
    CHECK(v == 3.0f);
    pt_comm_free(&alone);
    pt_comm_free(&same);
    /* refused before any communication */
    CHECK_ERR(pt_comm_split(c, -1, 0, &bad), PT_ERR_INVALID_ARG, "color=-1");
    CHECK_ERR(pt_comm_split(c, 0, 0, c), PT_ERR_INVALID_ARG, "out");
    CHECK_ERR(pt_comm_split(c, 0, 0, NULL), PT_ERR_INVALID_ARG, "out");
}

static void ck_counters(pt_comm *c) {
    float a[400], b[400];
    size_t S = (size_t)c->size;
    uint64_t calls = c->calls, bytes = c->bytes;
    double secs = c->seconds;
    memset(a, 0, sizeof a);
    CHECK_ST(pt_comm_all_reduce(c, a, 100, PT_REDUCE_SUM), PT_OK);
    CHECK_EQ(c->calls, calls + 1);
    CHECK_EQ(c->bytes, bytes + 400);
    CHECK(c->seconds >= secs);
    if (S <= 8) {
        CHECK_ST(pt_comm_reduce_scatter(c, a, b, 10, PT_REDUCE_SUM), PT_OK);
        CHECK_EQ(c->bytes, bytes + 400 + S * 40);
        CHECK_ST(pt_comm_all_gather(c, a, b, 10), PT_OK);
        CHECK_EQ(c->bytes, bytes + 400 + 2 * S * 40);
        bytes += 2 * S * 40;
        calls += 2;
    }
    CHECK_ST(pt_comm_broadcast(c, a, 3, 0), PT_OK);
    CHECK_EQ(c->bytes, bytes + 412);
    CHECK_ST(pt_comm_barrier(c), PT_OK);
    CHECK_EQ(c->calls, calls + 3);
    CHECK_EQ(c->bytes, bytes + 412);
    if (c->kind != PT_COMM_SELF) {
        CHECK_ST(pt_comm_send(c, a, 6, c->rank, 0), PT_OK);
        CHECK_ST(pt_comm_recv(c, b, 6, c->rank, 0), PT_OK);
        CHECK_EQ(c->calls, calls + 5);
        CHECK_EQ(c->bytes, bytes + 412 + 48);
    }
    /* refused calls are not counted */
    calls = c->calls;
    CHECK_ST(pt_comm_all_reduce(c, NULL, 3, PT_REDUCE_SUM), PT_ERR_INVALID_ARG);
    CHECK_EQ(c->calls, calls);
    CHECK(c->seconds >= secs && c->seconds < secs + 60.0);
}

static void ck_all_ok(pt_comm *c) {
    int ok = -1;
    CHECK_ST(pt_comm_all_ok(c, 1, &ok), PT_OK);
    CHECK_EQ(ok, 1);
    CHECK_ST(pt_comm_all_ok(c, c->rank != c->size - 1, &ok), PT_OK);
    CHECK_EQ(ok, 0);
    CHECK_ST(pt_comm_all_ok(c, 7, &ok), PT_OK);
    CHECK_EQ(ok, 1);
    CHECK_ERR(pt_comm_all_ok(c, 1, NULL), PT_ERR_INVALID_ARG, "all_ok");
}

/* Argument checks answer before any communication, with a message. */
static void ck_args(pt_comm *c) {
    float a[64], *out = a;
    int S = c->size;
    pt_comm zero;
    memset(&zero, 0, sizeof zero);
    CHECK_ERR(pt_comm_all_reduce(c, NULL, 3, PT_REDUCE_SUM), PT_ERR_INVALID_ARG, "buf is NULL");
    CHECK_ST(pt_comm_all_reduce(c, NULL, 0, PT_REDUCE_SUM), PT_OK); /* empty: collective */
    CHECK_ERR(pt_comm_all_reduce(c, a, 1, (pt_reduce_op)7), PT_ERR_INVALID_ARG, "op=7");
    CHECK_ERR(pt_comm_all_reduce(NULL, a, 1, PT_REDUCE_SUM), PT_ERR_INVALID_ARG, "NULL");
    CHECK_ERR(pt_comm_barrier(&zero), PT_ERR_INVALID_ARG, "freed");
    CHECK_ERR(pt_comm_broadcast(c, a, 1, S), PT_ERR_INVALID_ARG, "root=");
    CHECK_ERR(pt_comm_broadcast(c, a, 1, -1), PT_ERR_INVALID_ARG, "root=-1");
    CHECK_ERR(pt_comm_send(c, a, 1, S, 0), PT_ERR_INVALID_ARG, "dst=");
    CHECK_ERR(pt_comm_recv(c, a, 1, -1, 0), PT_ERR_INVALID_ARG, "src=-1");
    CHECK_ERR(pt_comm_send(c, a, 1, 0, -1), PT_ERR_INVALID_ARG, "tag=-1");
    CHECK_ERR(pt_comm_recv(c, a, 1, 0, 40000), PT_ERR_INVALID_ARG, "tag=40000");
    CHECK_ERR(pt_comm_send(c, NULL, 2, 0, 0), PT_ERR_INVALID_ARG, "NULL");
    CHECK_ERR(pt_comm_reduce_scatter(c, NULL, a, 2, PT_REDUCE_SUM), PT_ERR_INVALID_ARG, "in is NULL");
    CHECK_ERR(pt_comm_reduce_scatter(c, a, NULL, 2, PT_REDUCE_SUM), PT_ERR_INVALID_ARG, "out is NULL");
    if (S <= 8) {
        CHECK_ERR(pt_comm_reduce_scatter(c, a, a + 1, 2, PT_REDUCE_SUM), PT_ERR_INVALID_ARG,
                  "overlaps");
        CHECK_ERR(pt_comm_reduce_scatter(c, a, a + (size_t)c->rank * 2, 2, PT_REDUCE_SUM),
                  PT_ERR_INVALID_ARG, "overlaps");
        CHECK_ERR(pt_comm_all_gather(c, out + (size_t)c->rank * 2 + 1, out, 2), PT_ERR_INVALID_ARG,
                  "overlaps");
    }
    CHECK_ERR(pt_comm_all_gather(c, a, NULL, 2), PT_ERR_INVALID_ARG, "out is NULL");
    CHECK_ERR(pt_comm_all_gather(c, a, a, (size_t)-1 / 2), PT_ERR_INVALID_ARG, "overflows");
}

/* ======================================================================== */
/* started (non-blocking) operations: any communicator                       */
/* ======================================================================== */

/* 100003 floats: several work units of the threads backend even with --small */
#define NB_N ((size_t)100003)

/* Started collectives give the blocking ones' bits; five outstanding at once,
   waited out of order (one polled with test), as backward would start them. */
static void ck_started(pt_comm *c) {
    const size_t n = NB_N, S = (size_t)c->size, m = n / S + 1;
    float *a = fbuf(n), *a_ref = fbuf(n), *b = fbuf(n), *b_ref = fbuf(n);
    float *rs_in = fbuf(m * S), *rs = fbuf(m), *rs_ref = fbuf(m);
    float *ag_in = fbuf(m), *ag = fbuf(m * S), *ag_ref = fbuf(m * S), *mx = fbuf(n), *mx_ref = fbuf(n);
    pt_comm_req q[5];
    int op, done = 0, polls = 0;
    for (op = 0; op < 3; op++) { /* one at a time, against the blocking call */
        random_floats(a, n, c->rank);
        memcpy(a_ref, a, n * sizeof(float));
        CHECK_ST(pt_comm_all_reduce(c, a_ref, n, (pt_reduce_op)op), PT_OK);
        CHECK_ST(pt_comm_all_reduce_start(c, a, n, (pt_reduce_op)op, &q[0]), PT_OK);
        CHECK(q[0].comm == c);
        CHECK_ST(pt_comm_wait(&q[0]), PT_OK);
        CHECK(q[0].comm == NULL);
        CHECK(memcmp(a, a_ref, n * sizeof(float)) == 0);
        random_floats(rs_in, m * S, c->rank + 7);
        CHECK_ST(pt_comm_reduce_scatter(c, rs_in, rs_ref, m, (pt_reduce_op)op), PT_OK);
        CHECK_ST(pt_comm_reduce_scatter_start(c, rs_in, rs, m, (pt_reduce_op)op, &q[0]), PT_OK);
        CHECK_ST(pt_comm_wait(&q[0]), PT_OK);
        CHECK(memcmp(rs, rs_ref, m * sizeof(float)) == 0);
    }
    /* five outstanding */
    random_floats(a, n, c->rank);
    random_floats(b, n, c->rank + 100);
    random_floats(mx, n, c->rank + 200);
    random_floats(rs_in, m * S, c->rank + 300);
    random_floats(ag_in, m, c->rank + 400);
    memcpy(a_ref, a, n * sizeof(float));
    memcpy(b_ref, b, n * sizeof(float));
    memcpy(mx_ref, mx, n * sizeof(float));
    CHECK_ST(pt_comm_all_reduce(c, a_ref, n, PT_REDUCE_SUM), PT_OK);
    CHECK_ST(pt_comm_reduce_scatter(c, rs_in, rs_ref, m, PT_REDUCE_AVG), PT_OK);
    CHECK_ST(pt_comm_all_gather(c, ag_in, ag_ref, m), PT_OK);
    CHECK_ST(pt_comm_all_reduce(c, b_ref, n, PT_REDUCE_AVG), PT_OK);
    CHECK_ST(pt_comm_all_reduce(c, mx_ref, n, PT_REDUCE_MAX), PT_OK);
    CHECK_ST(pt_comm_all_reduce_start(c, a, n, PT_REDUCE_SUM, &q[0]), PT_OK);
    CHECK_ST(pt_comm_reduce_scatter_start(c, rs_in, rs, m, PT_REDUCE_AVG, &q[1]), PT_OK);
    CHECK_ST(pt_comm_all_gather_start(c, ag_in, ag, m, &q[2]), PT_OK);
    CHECK_ST(pt_comm_all_reduce_start(c, b, n, PT_REDUCE_AVG, &q[3]), PT_OK);
    CHECK_ST(pt_comm_all_reduce_start(c, mx, n, PT_REDUCE_MAX, &q[4]), PT_OK);
    CHECK_ST(pt_comm_wait(&q[3]), PT_OK);
    while (!done && polls < 100000000) {
        CHECK_ST(pt_comm_test(&q[2], &done), PT_OK);
        polls++;
    }
    CHECK(done && q[2].comm == NULL);
    CHECK_ST(pt_comm_wait(&q[2]), PT_OK); /* finished: returns at once */
    CHECK_ST(pt_comm_wait(&q[0]), PT_OK);
    CHECK_ST(pt_comm_wait(&q[4]), PT_OK);
    CHECK_ST(pt_comm_wait(&q[1]), PT_OK);
    CHECK(memcmp(a, a_ref, n * sizeof(float)) == 0);
    CHECK(memcmp(b, b_ref, n * sizeof(float)) == 0);
    CHECK(memcmp(mx, mx_ref, n * sizeof(float)) == 0);
    CHECK(memcmp(rs, rs_ref, m * sizeof(float)) == 0);
    CHECK(memcmp(ag, ag_ref, m * S * sizeof(float)) == 0);
    /* in place all_gather, and empty operations */
    memcpy(ag + (size_t)c->rank * m, ag_in, m * sizeof(float));
    CHECK_ST(pt_comm_all_gather_start(c, ag + (size_t)c->rank * m, ag, m, &q[0]), PT_OK);
    CHECK_ST(pt_comm_all_reduce_start(c, NULL, 0, PT_REDUCE_SUM, &q[1]), PT_OK);
    CHECK_ST(pt_comm_wait(&q[1]), PT_OK);
    CHECK_ST(pt_comm_wait(&q[0]), PT_OK);
    CHECK(memcmp(ag, ag_ref, m * S * sizeof(float)) == 0);
    free(a), free(a_ref), free(b), free(b_ref), free(rs_in), free(rs), free(rs_ref);
    free(ag_in), free(ag), free(ag_ref), free(mx), free(mx_ref);
}

/* Many collectives in flight, started and waited in a sliding window, then
   every rank checks the sums. */
static void ck_started_window(pt_comm *c) {
    enum { K = 40, W = 8 };
    float x[K][33];
    pt_comm_req q[K];
    int k, i;
    float tab[23];
    expected_table(tab, c->size, PT_REDUCE_SUM);
    for (k = 0; k < K; k++) {
        for (i = 0; i < 33; i++) x[k][i] = val(c->rank, (size_t)(i + k));
        CHECK_ST(pt_comm_all_reduce_start(c, x[k], 33, PT_REDUCE_SUM, &q[k]), PT_OK);
        if (k >= W) CHECK_ST(pt_comm_wait(&q[k - W]), PT_OK);
    }
    for (k = K - 1; k >= K - W; k--) CHECK_ST(pt_comm_wait(&q[k]), PT_OK);
    for (k = 0; k < K; k++)
        for (i = 0; i < 33; i++)
            if (x[k][i] != tab[(size_t)(i + k) % 23]) {
                failf(__LINE__, "collective %d [%d] = %g, expected %g", k, i, (double)x[k][i],
                      (double)tab[(size_t)(i + k) % 23]);
                return;
            }
}

/* Started sends and receives: a ring, several receives of one source and tag
   matched in the order they were started though waited in reverse, a
   receive posted before its message is sent, and a wrong size. */
static void ck_started_p2p(pt_comm *c) {
    int r = c->rank, S = c->size, next = (r + 1) % S, prev = (r + S - 1) % S, k;
    float a[4][8], b[4][8], big_in[3000], big_out[3000];
    pt_comm_req sq[4], rq[4], q;
    size_t i;
    memset(a, 0, sizeof a);
    if (c->kind == PT_COMM_SELF) {
        CHECK_ERR(pt_comm_send_start(c, a[0], 1, 0, 0, &q), PT_ERR_INVALID_ARG, "self");
        CHECK(q.comm == NULL);
        return;
    }
    for (k = 0; k < 4; k++) CHECK_ST(pt_comm_recv_start(c, b[k], 8, prev, 5, &rq[k]), PT_OK);
    for (k = 0; k < 4; k++) {
        for (i = 0; i < 8; i++) a[k][i] = (float)(100 * r + 10 * k) + (float)i;
        CHECK_ST(pt_comm_send_start(c, a[k], 8, next, 5, &sq[k]), PT_OK);
    }
    for (k = 3; k >= 0; k--) CHECK_ST(pt_comm_wait(&rq[k]), PT_OK);
    for (k = 0; k < 4; k++) CHECK_ST(pt_comm_wait(&sq[k]), PT_OK);
    for (k = 0; k < 4; k++)
        for (i = 0; i < 8; i++) CHECK(b[k][i] == (float)(100 * prev + 10 * k) + (float)i);
    /* a started receive and a blocking one from the same source and tag: the
       started one, older, gets the first message */
    CHECK_ST(pt_comm_recv_start(c, b[0], 8, prev, 6, &rq[0]), PT_OK);
    a[0][0] = 1.0f;
    CHECK_ST(pt_comm_send(c, a[0], 8, next, 6), PT_OK);
    a[0][0] = 2.0f;
    CHECK_ST(pt_comm_send(c, a[0], 8, next, 6), PT_OK);
    CHECK_ST(pt_comm_recv(c, b[1], 8, prev, 6), PT_OK);
    CHECK_ST(pt_comm_wait(&rq[0]), PT_OK);
    CHECK(b[0][0] == 1.0f && b[1][0] == 2.0f);
    /* 12 KB each way, both started before either is waited */
    for (i = 0; i < 3000; i++) big_in[i] = val(r, i);
    CHECK_ST(pt_comm_recv_start(c, big_out, 3000, prev, 7, &rq[0]), PT_OK);
    CHECK_ST(pt_comm_send_start(c, big_in, 3000, next, 7, &sq[0]), PT_OK);
    CHECK_ST(pt_comm_wait(&sq[0]), PT_OK);
    CHECK_ST(pt_comm_wait(&rq[0]), PT_OK);
    for (i = 0; i < 3000; i++) big_in[i] = val(prev, i);
    CHECK_FLOATS(big_out, big_in, 3000);
    /* the wrong size fails the wait */
    CHECK_ST(pt_comm_send_start(c, a[0], 4, next, 9, &sq[0]), PT_OK);
    CHECK_ST(pt_comm_recv_start(c, b[0], 5, prev, 9, &rq[0]), PT_OK);
    CHECK_ERR(pt_comm_wait(&rq[0]), PT_ERR_SHAPE, "has 4 floats");
    CHECK_ST(pt_comm_wait(&sq[0]), PT_OK);
    if (c->kind == PT_COMM_THREADS) CHECK_ST(pt_comm_recv(c, b[0], 4, prev, 9), PT_OK); /* queued */
    CHECK_ST(pt_comm_barrier(c), PT_OK);
}

static pt_status never_start(pt_comm *c, pt_comm_req *r) {
    (void)c, (void)r;
    return PT_ERR_COMM;
}

/* Bad arguments answer at start, before any communication; the request stays
   idle. */
static void ck_started_args(pt_comm *c) {
    float a[64];
    pt_comm_req q;
    int done = 7;
    memset(&q, 0, sizeof q);
    CHECK_ERR(pt_comm_all_reduce_start(c, a, 4, PT_REDUCE_SUM, NULL), PT_ERR_INVALID_ARG,
              "req is NULL");
    CHECK_ERR(pt_comm_all_reduce_start(c, NULL, 4, PT_REDUCE_SUM, &q), PT_ERR_INVALID_ARG,
              "all_reduce_start: buf is NULL");
    CHECK(q.comm == NULL);
    CHECK_ERR(pt_comm_all_reduce_start(c, a, 4, (pt_reduce_op)9, &q), PT_ERR_INVALID_ARG, "op=9");
    CHECK_ERR(pt_comm_all_reduce_start(NULL, a, 4, PT_REDUCE_SUM, &q), PT_ERR_INVALID_ARG, "NULL");
    CHECK_ERR(pt_comm_reduce_scatter_start(c, a, a, 2, PT_REDUCE_SUM, &q), PT_ERR_INVALID_ARG,
              "overlaps");
    CHECK_ERR(pt_comm_all_gather_start(c, a, NULL, 2, &q), PT_ERR_INVALID_ARG, "out is NULL");
    CHECK_ERR(pt_comm_send_start(c, a, 1, c->size, 0, &q), PT_ERR_INVALID_ARG, "dst=");
    CHECK_ERR(pt_comm_recv_start(c, a, 1, 0, -3, &q), PT_ERR_INVALID_ARG, "tag=-3");
    CHECK(q.comm == NULL);
    CHECK_ERR(pt_comm_wait(NULL), PT_ERR_INVALID_ARG, "req is NULL");
    CHECK_ERR(pt_comm_test(NULL, &done), PT_ERR_INVALID_ARG, "req is NULL");
    CHECK_ERR(pt_comm_test(&q, NULL), PT_ERR_INVALID_ARG, "done is NULL");
    if (c->kind == PT_COMM_SELF) { /* a user's backend with start but no test */
        pt_comm_ops ops = *c->ops;
        pt_comm fake = *c;
        ops.start = never_start, ops.test = NULL;
        fake.ops = &ops;
        CHECK_ERR(pt_comm_all_reduce_start(&fake, a, 4, PT_REDUCE_SUM, &q), PT_ERR_UNSUPPORTED,
                  "has start but no test");
    }
    CHECK_ST(pt_comm_wait(&q), PT_OK); /* idle: nothing to wait for */
    CHECK_ST(pt_comm_test(&q, &done), PT_OK);
    CHECK_EQ(done, 1);
}

/* Calls and bytes are counted at start, time in start, test and wait. */
static void ck_started_counters(pt_comm *c) {
    float a[100];
    pt_comm_req q;
    uint64_t calls = c->calls, bytes = c->bytes;
    memset(a, 0, sizeof a);
    CHECK_ST(pt_comm_all_reduce_start(c, a, 100, PT_REDUCE_SUM, &q), PT_OK);
    CHECK_EQ(c->calls, calls + 1);
    CHECK_EQ(c->bytes, bytes + 400);
    CHECK_ST(pt_comm_wait(&q), PT_OK);
    CHECK_EQ(c->calls, calls + 1);
}

/* ======================================================================== */
/* the overlapped gradient reduction (pt_step_desc.overlap)                   */
/* ======================================================================== */

typedef struct ov_layout {
    int tp, dp, pp, zero, micro, chunks;
    pt_schedule_kind schedule;
    size_t bucket; /* pt_gpt_desc.bucket_bytes */
} ov_layout;

/* Three AdamW steps of a 4-layer tiny GPT in layout L; the whole model's
   parameters after them into full (num_params_full floats, malloc'd), and
   the last step's loss (its forward ran on the parameters the previous
   update's overlapped gathers brought). Each dp rank trains on rows of its
   own. */
static pt_status ov_train(pt_comm *world, const ov_layout *L, pt_overlap ov, float **full,
                          float *loss) {
    enum { B = 2, T = 16 };
    pt_grid g;
    pt_gpt gpt;
    pt_gpt_desc d;
    pt_step_desc sd;
    pt_step_result res;
    pt_adamw_config opt = pt_adamw_default();
    int in[8 * B * T], tg[8 * B * T], step, i;
    pt_status st;
    memset(&d, 0, sizeof d);
    memset(&gpt, 0, sizeof gpt);
    *full = NULL;
    if ((st = pt_grid_init(&g, world, L->tp, L->dp, L->pp)) != PT_OK) return st;
    pt_gpt_config_preset("tiny", &d.config);
    d.config.n_layer = 4;
    d.batch = B, d.seq = T, d.grid = &g, d.zero = L->zero, d.grad_accum = L->micro;
    d.schedule = L->schedule, d.chunks = L->chunks, d.bucket_bytes = L->bucket;
    if ((st = pt_gpt_init(&gpt, &d)) != PT_OK) {
        pt_grid_free(&g);
        return st;
    }
    pt_gpt_init_weights(&gpt, 7);
    for (step = 0; step < 3 && st == PT_OK; step++) {
        for (i = 0; i < L->micro * B * T; i++) {
            in[i] = (int)((unsigned)(i * 31 + g.dp_rank * 101 + step * 7) % 256u);
            tg[i] = (int)((unsigned)(i * 17 + g.dp_rank * 13 + step * 5 + 1) % 256u);
        }
        memset(&sd, 0, sizeof sd);
        sd.inputs = in, sd.targets = tg, sd.B = L->micro * B, sd.T = T;
        sd.adamw = &opt, sd.lr = 1e-2f, sd.clip = 1.0f, sd.overlap = ov;
        st = pt_gpt_step(&gpt, &sd, &res);
        *loss = res.loss;
    }
    if (st == PT_OK) {
        *full = fbuf(gpt.num_params_full);
        st = pt_gpt_gather(&gpt, PT_BUF_PARAMS, *full);
    }
    pt_gpt_free(&gpt);
    pt_grid_free(&g);
    return st;
}

/* Overlap on and off give the same bits in every layout of this world's size:
   dp with ZeRO 0, 1, 2 and 3 (with 2 micro-batches; T below wpe's length:
   the embedding's rows gathered and reduced compact when on; dp 4 under MPI
   without), tp x dp (ZeRO 3 too), dp x pp with 1F1B (ZeRO 3 too), zero-bubble (W apart),
   interleaved chunks, ZB-V, Chimera (ZeRO 1) and 2BW, pp 4 with GPipe and
   ZB-H2 (on: the pipeline's receives posted ahead, its sends started), and
   with buckets of two layers (a layer is ~200 KB
   here; with dp 2 and ZeRO 0 the buckets change no sum, so those also give
   the bits of a layer a bucket; ZeRO's shards follow the buckets, and so do
   the gradient norm's partial sums) (--small, for ThreadSanitizer: dp 2 ZeRO 1, and
   zero-bubble dp 2 x pp 2 with ZeRO 1). */
static void ck_overlap(pt_comm *c) {
    enum { TWO = 300000 };
    static const ov_layout two[] = {{1, 2, 1, 0, 1, 1, PT_SCHED_DEFAULT, 0},
                                    {1, 2, 1, 1, 2, 1, PT_SCHED_DEFAULT, 0},
                                    {1, 2, 1, 2, 1, 1, PT_SCHED_DEFAULT, 0},
                                    {1, 2, 1, 0, 1, 1, PT_SCHED_DEFAULT, TWO},
                                    {1, 2, 1, 1, 2, 1, PT_SCHED_DEFAULT, TWO},
                                    {1, 2, 1, 3, 2, 1, PT_SCHED_DEFAULT, 0}};
    static const ov_layout four[] = {{2, 2, 1, 1, 1, 1, PT_SCHED_DEFAULT, 0},
                                     {1, 2, 2, 0, 2, 1, PT_SCHED_1F1B, 0},
                                     {1, 2, 2, 1, 2, 1, PT_SCHED_ZB_H1, 0},
                                     {1, 2, 2, 0, 2, 2, PT_SCHED_INTERLEAVED, 0},
                                     {1, 4, 1, 1, 2, 1, PT_SCHED_DEFAULT, 0},
                                     {2, 2, 1, 2, 1, 1, PT_SCHED_DEFAULT, 0},
                                     {1, 2, 2, 0, 2, 1, PT_SCHED_ZB_H1, TWO},
                                     {1, 2, 2, 0, 2, 2, PT_SCHED_INTERLEAVED, TWO},
                                     {1, 2, 2, 1, 2, 1, PT_SCHED_1F1B, TWO},
                                     {1, 2, 2, 0, 2, 2, PT_SCHED_ZB_V, 0},
                                     {1, 1, 4, 0, 4, 1, PT_SCHED_GPIPE, 0},
                                     {1, 1, 4, 0, 8, 1, PT_SCHED_ZB_H2, 0},
                                     {1, 2, 2, 1, 2, 2, PT_SCHED_CHIMERA, 0},
                                     {1, 2, 2, 0, 2, 1, PT_SCHED_2BW, 0},
                                     {2, 2, 1, 3, 1, 1, PT_SCHED_DEFAULT, 0},
                                     {1, 4, 1, 3, 2, 1, PT_SCHED_DEFAULT, 0},
                                     {1, 2, 2, 3, 2, 1, PT_SCHED_1F1B, 0}};
    const ov_layout *L = c->size == 2 ? two : four;
    int n = c->size == 2 ? 6 : 17, k;
    float *on, *off, l_on = 0.0f, l_off = 0.0f;
    if (c->size != 2 && c->size != 4) return;
    for (k = 0; k < n; k++) {
        if (g_cap != (size_t)-1 && k != (c->size == 2 ? 1 : 2)) continue; /* --small: one */
        on = off = NULL;
        CHECK_ST(ov_train(c, &L[k], PT_OVERLAP_DEFAULT, &on, &l_on), PT_OK);
        CHECK_ST(ov_train(c, &L[k], PT_OVERLAP_OFF, &off, &l_off), PT_OK);
        if (on && off) {
            pt_gpt_config cfg;
            pt_gpt_config_preset("tiny", &cfg);
            if (memcmp(&l_on, &l_off, sizeof l_on))
                failf(__LINE__, "layout %d: loss %.9g with overlap, %.9g without", k,
                      (double)l_on, (double)l_off);
            cfg.n_layer = 4;
            {
                pt_gpt m;
                pt_gpt_desc d;
                size_t i, np;
                memset(&d, 0, sizeof d);
                d.config = cfg, d.batch = 2, d.seq = 16, d.meta = 1, d.inference = 1;
                np = pt_gpt_init(&m, &d) == PT_OK ? m.num_params_full : 0;
                pt_gpt_free(&m);
                for (i = 0; i < np && on[i] == off[i]; i++) {
                }
                if (!np || i < np)
                    failf(__LINE__, "layout %d (tp %d dp %d pp %d zero %d): parameter %zu = %.9g "
                          "with overlap, %.9g without", k, L[k].tp, L[k].dp, L[k].pp, L[k].zero,
                          i, i < np ? (double)on[i] : 0.0, i < np ? (double)off[i] : 0.0);
                if (L[k].bucket && L[k].dp == 2 && !L[k].zero) { /* against a layer a bucket */
                    ov_layout one = L[k];
                    float *ref = NULL, l_ref = 0.0f;
                    one.bucket = 0;
                    CHECK_ST(ov_train(c, &one, PT_OVERLAP_DEFAULT, &ref, &l_ref), PT_OK);
                    for (i = 0; ref && i < np && on[i] == ref[i]; i++) {
                    }
                    if (!ref || i < np)
                        failf(__LINE__, "layout %d: parameter %zu = %.9g with buckets of %zu "
                              "bytes, %.9g with a layer a bucket", k, i,
                              i < np ? (double)on[i] : 0.0, L[k].bucket,
                              ref && i < np ? (double)ref[i] : 0.0);
                    free(ref);
                }
            }
        }
        free(on);
        free(off);
    }
    CHECK_ERR(ov_train(c, &L[0], (pt_overlap)3, &on, &l_on), PT_ERR_INVALID_ARG, "overlap=3");
    free(on);
    {
        ov_layout big = L[0], z2 = L[0];
        big.bucket = (size_t)1 << 30, z2.zero = 2, z2.bucket = TWO;
        CHECK_ERR(ov_train(c, &big, PT_OVERLAP_DEFAULT, &on, &l_on), PT_ERR_CONFIG,
                  "bucket_bytes=1073741824 is more than the model's");
        free(on);
        CHECK_ERR(ov_train(c, &z2, PT_OVERLAP_DEFAULT, &on, &l_on), PT_ERR_CONFIG,
                  "bucket_bytes=300000 with zero=2");
        free(on);
    }
}

/* ======================================================================== */
/* checks of the threads backend only                                        */
/* ======================================================================== */

/* Ranks calling different collectives, or with different sizes, all get the
   same error instead of reading past a buffer; the group stays usable. */
static void ck_mismatch(pt_comm *c) {
    float a[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    if (c->size < 2) return;
    CHECK_ERR(pt_comm_all_reduce(c, a, c->rank == 0 ? 4 : 5, PT_REDUCE_SUM), PT_ERR_SHAPE,
              "rank 0 passed n=4 but rank 1 passed n=5");
    CHECK_ERR(pt_comm_broadcast(c, a, 2, c->rank == 0 ? 0 : 1), PT_ERR_INVALID_ARG, "root");
    CHECK_ERR(pt_comm_all_reduce(c, a, 2, c->rank == 0 ? PT_REDUCE_SUM : PT_REDUCE_MAX),
              PT_ERR_INVALID_ARG, "op");
    if (c->rank == 0) CHECK_ERR(pt_comm_barrier(c), PT_ERR_INVALID_ARG, "called");
    else CHECK_ERR(pt_comm_all_reduce(c, a, 1, PT_REDUCE_SUM), PT_ERR_INVALID_ARG, "called");
    a[0] = 1.0f;
    CHECK_ST(pt_comm_all_reduce(c, a, 1, PT_REDUCE_SUM), PT_OK);
    CHECK(a[0] == (float)c->size);
}

/* Each rank gets max(1, cores/size) OpenMP and BLAS threads. */
static void ck_threads_env(pt_comm *c) {
    int want = pt_num_cores() / c->size;
    if (want < 1) want = 1;
#ifdef _OPENMP
    CHECK_EQ(pt_get_threads(), want);
#endif
#if !defined(PTRAIN_NO_BLAS) && defined(OPENBLAS_VERSION) /* the header links OpenBLAS */
    CHECK_EQ(openblas_get_num_threads(), want);
#endif
}

/* After two warm-up steps, steps of the same collectives and messages
   allocate nothing. */
static void steady_step(pt_comm *c, float *x, float *y, float *z, size_t n) {
    int next = (c->rank + 1) % c->size, prev = (c->rank + c->size - 1) % c->size;
    CHECK_ST(pt_comm_all_reduce(c, x, n, PT_REDUCE_AVG), PT_OK);
    CHECK_ST(pt_comm_reduce_scatter(c, x, y, n / (size_t)c->size, PT_REDUCE_SUM), PT_OK);
    CHECK_ST(pt_comm_all_gather(c, y, x, n / (size_t)c->size), PT_OK);
    CHECK_ST(pt_comm_broadcast(c, x, n, 0), PT_OK);
    CHECK_ST(pt_comm_send(c, x, 5, next, 1), PT_OK);
    CHECK_ST(pt_comm_send(c, x, n, next, 2), PT_OK);
    CHECK_ST(pt_comm_send(c, x, n / 2, c->rank, 3), PT_OK);
    CHECK_ST(pt_comm_recv(c, z, n, prev, 2), PT_OK);
    CHECK_ST(pt_comm_recv(c, z, 5, prev, 1), PT_OK);
    CHECK_ST(pt_comm_recv(c, z, n / 2, c->rank, 3), PT_OK);
}

/* Ranks starting different collectives all get the same error at their wait;
   a 65th outstanding collective of one rank is refused at start. */
static void ck_started_mismatch(pt_comm *c) {
    float a[8], b[8];
    pt_comm_req q[65];
    int k;
    memset(a, 0, sizeof a);
    CHECK_ST(pt_comm_all_reduce_start(c, a, c->rank == 0 ? 5 : 6, PT_REDUCE_SUM, &q[0]), PT_OK);
    if (c->size > 1) CHECK_ERR(pt_comm_wait(&q[0]), PT_ERR_SHAPE, "rank 0 passed n=5");
    else CHECK_ST(pt_comm_wait(&q[0]), PT_OK);
    if (c->rank == 0) CHECK_ST(pt_comm_all_reduce_start(c, a, 2, PT_REDUCE_SUM, &q[0]), PT_OK);
    else CHECK_ST(pt_comm_all_gather_start(c, a, b, 1, &q[0]), PT_OK);
    if (c->size > 1) CHECK_ERR(pt_comm_wait(&q[0]), PT_ERR_INVALID_ARG, "rank 0 started all_reduce");
    else CHECK_ST(pt_comm_wait(&q[0]), PT_OK);
    for (k = 0; k < 64; k++) CHECK_ST(pt_comm_all_reduce_start(c, a, 1, PT_REDUCE_SUM, &q[k]), PT_OK);
    CHECK_ERR(pt_comm_all_reduce_start(c, a, 1, PT_REDUCE_SUM, &q[64]), PT_ERR_UNSUPPORTED,
              "64 started collectives");
    for (k = 0; k < 64; k++) CHECK_ST(pt_comm_wait(&q[k]), PT_OK);
    CHECK_ST(pt_comm_all_reduce(c, a, 8, PT_REDUCE_SUM), PT_OK); /* the group still works */
}

static void started_step(pt_comm *c, float *x, float *y, size_t n) {
    pt_comm_req q[3];
    int next = (c->rank + 1) % c->size, prev = (c->rank + c->size - 1) % c->size;
    /* barriers: no rank runs ahead into another step's sends (the spare pools'
       best fit would then see other mixes of sizes in flight) */
    CHECK_ST(pt_comm_barrier(c), PT_OK);
    CHECK_ST(pt_comm_recv_start(c, y + n / 2, 5, prev, 4, &q[2]), PT_OK);
    CHECK_ST(pt_comm_all_reduce_start(c, x, n / 2, PT_REDUCE_AVG, &q[0]), PT_OK);
    CHECK_ST(pt_comm_reduce_scatter_start(c, x + n / 2, y, n / 2 / (size_t)c->size, PT_REDUCE_SUM,
                                          &q[1]),
             PT_OK);
    CHECK_ST(pt_comm_send(c, y + n - 5, 5, next, 4), PT_OK);
    CHECK_ST(pt_comm_wait(&q[1]), PT_OK);
    CHECK_ST(pt_comm_wait(&q[0]), PT_OK);
    CHECK_ST(pt_comm_wait(&q[2]), PT_OK);
    CHECK_ST(pt_comm_barrier(c), PT_OK);
}

static void ck_steady(pt_comm *c) {
    const size_t n = 24000;
    float *x = fbuf(n), *y = fbuf(n), *z = fbuf(n);
    unsigned long before, after;
    int i;
    for (i = 0; i < (int)n; i++) x[i] = (float)i;
    steady_step(c, x, y, z, n), started_step(c, x, y, n);
    steady_step(c, x, y, z, n), started_step(c, x, y, n);
    CHECK_ST(pt_comm_barrier(c), PT_OK);
    before = __atomic_load_n(&g_mallocs, __ATOMIC_RELAXED);
    CHECK_ST(pt_comm_barrier(c), PT_OK);
    for (i = 0; i < 3; i++) steady_step(c, x, y, z, n), started_step(c, x, y, n);
    CHECK_ST(pt_comm_barrier(c), PT_OK);
    after = __atomic_load_n(&g_mallocs, __ATOMIC_RELAXED);
    CHECK_ST(pt_comm_barrier(c), PT_OK);
    if (after != before) failf(__LINE__, "%lu allocations in 3 steady steps", after - before);
    free(x);
    free(y);
    free(z);
}

/* ======================================================================== */
/* the grid                                                                  */
/* ======================================================================== */

static _Thread_local int g_tp, g_dp, g_pp; /* the shape ck_grid checks, set by each rank */

static void ck_grid(pt_comm *world) {
    int tp = g_tp, dp = g_dp, pp = g_pp, r = world->rank, j;
    int t = r % tp, d = r / tp % dp, p = r / (tp * dp);
    float v, want, got[64];
    pt_grid g;
    CHECK_ST(pt_grid_init(&g, world, tp, dp, pp), PT_OK);
    if (!g.world) return;
    CHECK(g.world == world);
    CHECK(g.tp == tp && g.dp == dp && g.pp == pp);
    CHECK_EQ(g.tp_rank, t);
    CHECK_EQ(g.dp_rank, d);
    CHECK_EQ(g.pp_rank, p);
    CHECK(g.tp_comm.size == tp && g.tp_comm.rank == t);
    CHECK(g.dp_comm.size == dp && g.dp_comm.rank == d);
    CHECK(g.pp_comm.size == pp && g.pp_comm.rank == p);
    /* each group reduces over its members only: r = t + tp*(d + dp*p) */
    v = (float)r, want = 0;
    CHECK_ST(pt_comm_all_reduce(&g.tp_comm, &v, 1, PT_REDUCE_SUM), PT_OK);
    for (j = 0; j < tp; j++) want += (float)(j + tp * (d + dp * p));
    CHECK(v == want);
    v = (float)r, want = 0;
    CHECK_ST(pt_comm_all_reduce(&g.dp_comm, &v, 1, PT_REDUCE_SUM), PT_OK);
    for (j = 0; j < dp; j++) want += (float)(t + tp * (j + dp * p));
    CHECK(v == want);
    v = (float)r, want = 0;
    CHECK_ST(pt_comm_all_reduce(&g.pp_comm, &v, 1, PT_REDUCE_SUM), PT_OK);
    for (j = 0; j < pp; j++) want += (float)(t + tp * (d + dp * j));
    CHECK(v == want);
    v = (float)r;
    CHECK_ST(pt_comm_all_reduce(&g.dp_comm, &v, 1, PT_REDUCE_MAX), PT_OK);
    CHECK(v == (float)(t + tp * (dp - 1 + dp * p)));
    /* ordered by coordinate */
    v = (float)r;
    if (tp <= 64) {
        CHECK_ST(pt_comm_all_gather(&g.tp_comm, &v, got, 1), PT_OK);
        for (j = 0; j < tp; j++) CHECK(got[j] == (float)(j + tp * (d + dp * p)));
    }
    v = (float)r;
    CHECK_ST(pt_comm_broadcast(&g.dp_comm, &v, 1, dp - 1), PT_OK);
    CHECK(v == (float)(t + tp * (dp - 1 + dp * p)));
    /* a pipeline: stage p sends to stage p + 1 */
    v = (float)r;
    if (p + 1 < pp) CHECK_ST(pt_comm_send(&g.pp_comm, &v, 1, p + 1, 0), PT_OK);
    if (p > 0) {
        CHECK_ST(pt_comm_recv(&g.pp_comm, &v, 1, p - 1, 0), PT_OK);
        CHECK(v == (float)(r - tp * dp));
    }
    pt_grid_free(&g);
    CHECK(g.world == NULL && g.tp_comm.ops == NULL);
}

/* Bad shapes are refused before any communication, naming every constraint. */
static void ck_grid_bad(pt_comm *world) {
    int S = world->size;
    char want[128];
    pt_grid g;
    snprintf(want, sizeof want, "world size %d != tp %d x dp 1 x pp 1", S, S + 1);
    CHECK_ERR(pt_grid_init(&g, world, S + 1, 1, 1), PT_ERR_CONFIG, want);
    CHECK(g.world == NULL);
    snprintf(want, sizeof want, "world size %d != tp %d x dp 2 x pp 1", S, S);
    CHECK_ERR(pt_grid_init(&g, world, S, 2, 1), PT_ERR_CONFIG, want);
    CHECK_ERR(pt_grid_init(&g, world, 65536, 65536, 65536), PT_ERR_CONFIG, "world size");
    CHECK_ERR(pt_grid_init(&g, world, 0, S, 1), PT_ERR_CONFIG, "tp=0 must be >= 1");
    CHECK_ERR(pt_grid_init(&g, world, 0, 0, 1), PT_ERR_CONFIG, "tp=0 must be >= 1");
    CHECK_MSG("dp=0 must be >= 1");
    CHECK_ERR(pt_grid_init(&g, world, 1, 1, -2), PT_ERR_CONFIG, "pp=-2 must be >= 1");
    CHECK_ERR(pt_grid_init(&g, NULL, 1, 1, 1), PT_ERR_INVALID_ARG, "NULL");
    CHECK_ERR(pt_grid_init(NULL, world, 1, 1, 1), PT_ERR_INVALID_ARG, "NULL");
    pt_grid_free(NULL);
}

static void grid_checks(pt_comm *world, const char *label) {
    int S = world->size, tp, dp;
    char name[96];
    for (tp = 1; tp <= S; tp++)
        for (dp = 1; dp <= S / tp; dp++) {
            if (S % (tp * dp)) continue;
            g_tp = tp, g_dp = dp, g_pp = S / (tp * dp);
            snprintf(name, sizeof name, "grid tp %d x dp %d x pp %d", g_tp, g_dp, g_pp);
            run(world, label, name, ck_grid);
        }
    run(world, label, "grid: bad shapes give PT_ERR_CONFIG naming the constraint", ck_grid_bad);
}

static void suite(pt_comm *c, const char *label) {
    char name[96];
    run(c, label, "all_reduce SUM/AVG/MAX, n = 0, 1, 7, 1003, 2^20+5", ck_all_reduce);
    run(c, label, "all_reduce: bitwise identical on every rank", ck_bitwise);
    run(c, label, "reduce_scatter SUM/AVG/MAX, n = 0, 1, 7, 1003, 2^17+3", ck_reduce_scatter);
    run(c, label, "all_gather (and in place), n = 0, 1, 7, 1003, 2^17+1", ck_all_gather);
    run(c, label, "broadcast from every root, n = 0, 1, 7, 1003, 2^20+3", ck_broadcast);
    run(c, label, "barrier x200", ck_barrier);
    run(c, label, "send/recv: buffered, in order, by tag, wrong size", ck_send_recv);
    run(c, label, "split: colors, keys, nested", ck_split);
    run(c, label, "counters: calls, bytes, seconds", ck_counters);
    run(c, label, "all_ok", ck_all_ok);
    run(c, label, "argument checks", ck_args);
    run(c, label, "started collectives: the blocking bits, 5 outstanding, out-of-order waits",
        ck_started);
    run(c, label, "started collectives: 40 in a sliding window of 8", ck_started_window);
    run(c, label, "started send/recv: matched in start order, before blocking ones, wrong size",
        ck_started_p2p);
    run(c, label, "started operations: argument checks", ck_started_args);
    run(c, label, "started operations: counters", ck_started_counters);
    if (c->size == 2 || c->size == 4)
        run(c, label, "the step's overlapped dp reduction: the same bits as without, every layout",
            ck_overlap);
    if (c->kind == PT_COMM_THREADS) {
        run(c, label, "mismatched calls fail alike on every rank", ck_mismatch);
        run(c, label, "started: mismatched collectives fail alike, at most 64 outstanding",
            ck_started_mismatch);
        snprintf(name, sizeof name, "each rank has max(1, cores/%d) OpenMP and BLAS threads",
                 c->size);
        run(c, label, name, ck_threads_env);
        run(c, label, "steady state allocates nothing", ck_steady);
    }
}

#ifndef PTRAIN_MPI
/* ======================================================================== */
/* the threads backend as a whole: runs and failures                         */
/* ======================================================================== */

static pt_status suite_main(pt_comm *world, void *arg) {
    t_rank = world->rank;
    suite(world, (const char *)arg);
    return PT_OK;
}

static pt_status grid_main(pt_comm *world, void *arg) {
    t_rank = world->rank;
    grid_checks(world, (const char *)arg);
    return PT_OK;
}

/* Failure scenarios: what each rank did and saw. */
enum { F_ALL_REDUCE, F_BARRIER, F_RECV, F_GRID, F_TWO, F_RETURN_OK, F_RETURN_OK_RECV, F_FAIL_OK,
       F_STARTED, F_STARTED_RECV };
typedef struct fail_run {
    int mode;
    pt_status st[16];
    char msg[16][1024];
    double secs[16];
    pt_status later[16]; /* an operation after the failure */
} fail_run;

static pt_status planted(pt_comm *world, pt_status s, const char *msg, int report) {
    sleep_ms(100); /* the others are asleep in their operation by now */
    pt_error(s, "%s", msg);
    return report ? pt_comm_fail(world, s) : s;
}

static pt_status fail_main(pt_comm *world, void *arg) {
    fail_run *f = (fail_run *)arg;
    int r = world->rank, i;
    float buf[1000];
    pt_status st = PT_OK;
    pt_grid g;
    double t0 = pt_time_now();
    memset(buf, 0, sizeof buf);
    switch (f->mode) {
    case F_ALL_REDUCE: /* rank 2 reports a failure; the others are in an all-reduce */
        if (r == 2) return planted(world, PT_ERR_IO, "cannot open planted.bin", 1);
        st = pt_comm_all_reduce(world, buf, 1000, PT_REDUCE_SUM);
        break;
    case F_BARRIER: /* rank 1 just returns an error; the others are in a barrier */
        if (r == 1) return planted(world, PT_ERR_CONFIG, "bad planted config", 0);
        st = pt_comm_barrier(world);
        break;
    case F_RECV: /* rank 3 fails; the others wait for its message */
        if (r == 3) return planted(world, PT_ERR_IO, "planted failure", 1);
        st = pt_comm_recv(world, buf, 4, 3, 0);
        break;
    case F_GRID: /* rank 5 of a 2x2x2 grid fails; the others reduce in their groups */
        if (pt_grid_init(&g, world, 2, 2, 2) != PT_OK) return pt_comm_fail(world, PT_ERR_COMM);
        if (r == 5) {
            pt_grid_free(&g);
            return planted(world, PT_ERR_RANGE, "planted failure in a grid", 1);
        }
        for (i = 0; i < 100000 && st == PT_OK; i++) {
            pt_comm *gc = i % 3 == 0 ? &g.tp_comm : i % 3 == 1 ? &g.dp_comm : &g.pp_comm;
            st = pt_comm_all_reduce(gc, buf, 1000, PT_REDUCE_SUM);
        }
        f->later[r] = pt_comm_barrier(&g.tp_comm);
        pt_grid_free(&g);
        break;
    case F_TWO: /* rank 3 fails at once, rank 1 later without having seen it */
        if (r == 3) return planted(world, PT_ERR_IO, "first failure", 1);
        if (r == 1) {
            sleep_ms(300);
            pt_error(PT_ERR_RANGE, "second failure");
            return pt_comm_fail(world, PT_ERR_RANGE);
        }
        st = pt_comm_all_reduce(world, buf, 1000, PT_REDUCE_SUM);
        if (r == 0) { /* reports what it saw: not an origin */
            f->st[r] = st, f->secs[r] = pt_time_now() - t0;
            snprintf(f->msg[r], sizeof f->msg[r], "%s", pt_last_error());
            return pt_comm_fail(world, st);
        }
        break;
    case F_RETURN_OK: /* rank 0 returns while rank 1 waits in a barrier */
        if (r == 0) return PT_OK;
        st = pt_comm_barrier(world);
        break;
    case F_RETURN_OK_RECV: /* rank 0 returns while rank 1 waits for its message */
        if (r == 0) return PT_OK;
        st = pt_comm_recv(world, buf, 1, 0, 0);
        break;
    case F_STARTED: /* rank 2 starts A, not B, then fails; the others wait B, then A */
    {
        static float big[4][40000]; /* several work units each */
        pt_comm_req qa, qb;
        pt_status sa;
        if ((st = pt_comm_all_reduce_start(world, big[r], 40000, PT_REDUCE_SUM, &qa))) break;
        if (r == 2) return planted(world, PT_ERR_IO, "planted failure", 1);
        if ((st = pt_comm_all_reduce_start(world, buf, 1000, PT_REDUCE_SUM, &qb))) break;
        st = pt_comm_wait(&qb);
        snprintf(f->msg[r], sizeof f->msg[r], "%s", pt_last_error());
        sa = pt_comm_wait(&qa); /* every wait after the failure fails too */
        f->later[r] = sa != PT_OK && strstr(pt_last_error(), "rank 2 failed") ? sa : PT_OK;
        f->secs[r] = pt_time_now() - t0;
        f->st[r] = st;
        return st == PT_OK ? st : pt_error(st, "%s", f->msg[r]);
    }
    case F_STARTED_RECV: /* rank 1 fails; the others wait for its message in started receives */
    {
        pt_comm_req q;
        if (r == 1) return planted(world, PT_ERR_IO, "planted failure", 1);
        if ((st = pt_comm_recv_start(world, buf, 4, 1, 0, &q))) break;
        st = pt_comm_wait(&q);
        break;
    }
    case F_FAIL_OK: /* rank 1 reports a failure and returns PT_OK */
        if (r == 1) {
            planted(world, PT_ERR_IO, "reported then ignored", 1);
            return PT_OK;
        }
        st = pt_comm_barrier(world);
        break;
    }
    f->secs[r] = pt_time_now() - t0;
    f->st[r] = st;
    snprintf(f->msg[r], sizeof f->msg[r], "%s", st == PT_OK ? "" : pt_last_error());
    if (f->mode != F_GRID) f->later[r] = pt_comm_barrier(world);
    return st == PT_OK ? st : pt_error(st, "%s", f->msg[r]); /* the later call's message aside */
}

/* Runs a scenario on n ranks; checks the run's status and message, and that
   every waiting rank got PT_ERR_COMM naming the failed rank within 2 s. */
static void fail_check(const char *name, int mode, int n, pt_status want, const char *want_msg,
                       int failed_rank, const char *wait_msg) {
    fail_run f;
    int r, ok = 1;
    double t0 = pt_time_now(), total;
    pt_status st;
    if (!selected(name)) return;
    memset(&f, 0, sizeof f);
    f.mode = mode;
    for (r = 0; r < n; r++) f.st[r] = f.later[r] = PT_STATUS_COUNT;
    st = pt_comm_threads_run(n, fail_main, &f);
    total = pt_time_now() - t0;
    if (st != want || strcmp(pt_last_error(), want_msg) != 0) {
        printf("    run returned %s \"%s\", expected %s \"%s\"\n", pt_status_name(st),
               pt_last_error(), pt_status_name(want), want_msg);
        ok = 0;
    }
    for (r = 0; r < n; r++) {
        if (r == failed_rank || f.st[r] == PT_STATUS_COUNT) continue; /* returned early */
        if (f.st[r] != PT_ERR_COMM || !strstr(f.msg[r], wait_msg) || f.secs[r] > 2.0) {
            printf("    rank %d: %s \"%s\" after %.3f s, expected PT_ERR_COMM \"%s\"\n", r,
                   pt_status_name(f.st[r]), f.msg[r], f.secs[r], wait_msg);
            ok = 0;
        }
        if (f.later[r] != PT_STATUS_COUNT && f.later[r] != PT_ERR_COMM) {
            printf("    rank %d: an operation after the failure returned %s\n", r,
                   pt_status_name(f.later[r]));
            ok = 0;
        }
    }
    if (total > 3.0) {
        printf("    the run took %.2f s\n", total);
        ok = 0;
    }
    top(name, ok);
}

static pt_status nop_main(pt_comm *world, void *arg) {
    (void)arg;
    return pt_comm_barrier(world);
}

/* A wait past the deadline: rank 0 (timeout 0.2 s) waits for rank 1, which
   sleeps 1 s first: rank 0's wait fails naming the operation and rank 1, and
   rank 1's next operation sees the world failed. mode: 0 all_reduce, 1 recv,
   2 a started all_reduce's wait. */
static pt_status timeout_main(pt_comm *world, void *arg) {
    int mode = *(const int *)arg;
    float v = 1.0f;
    pt_comm_req q;
    memset(&q, 0, sizeof q);
    world->timeout = 0.2;
    if (world->rank == 1) {
        struct timespec ts = {1, 0};
        nanosleep(&ts, NULL);
        if (mode == 1) return pt_comm_send(world, &v, 1, 0, 0);
        if (mode == 0) return pt_comm_all_reduce(world, &v, 1, PT_REDUCE_SUM);
    }
    if (mode == 0) return pt_comm_all_reduce(world, &v, 1, PT_REDUCE_SUM);
    if (mode == 1) return pt_comm_recv(world, &v, 1, 1, 0);
    if (pt_comm_all_reduce_start(world, &v, 1, PT_REDUCE_SUM, &q) != PT_OK) return PT_ERR_INVALID_ARG;
    return pt_comm_wait(&q);
}

static void timeout_checks(void) {
    static const char *const want[] = {
        "rank 0: all_reduce on a group of 2 ranks waited 0.",
        "rank 0: recv on a group of 2 ranks waited 0.",
        "rank 0: all_reduce (started) on a group of 2 ranks waited 0."};
    int mode;
    for (mode = 0; mode < 3; mode++) {
        pt_status st = pt_comm_threads_run(2, timeout_main, &mode);
        char name[96];
        int ok = st == PT_ERR_COMM && strstr(pt_last_error(), want[mode]) &&
                 strstr(pt_last_error(), "more than the comm timeout (0.2 s), for world rank 1");
        if (!ok) printf("    %s\n", pt_last_error());
        snprintf(name, sizeof name, "threads: a wait past --comm-timeout fails, naming it (%s)",
                 mode == 0 ? "all_reduce" : mode == 1 ? "recv" : "started all_reduce");
        top(name, ok);
    }
}

static void failure_checks(void) {
    int threads = pt_get_threads(), ok;
    pt_status st;
#if !defined(PTRAIN_NO_BLAS) && defined(OPENBLAS_VERSION) /* the header links OpenBLAS */
    int blas = openblas_get_num_threads();
#endif
    {
        fail_check("threads: failures: pt_comm_fail wakes ranks in an all_reduce", F_ALL_REDUCE, 4,
                   PT_ERR_IO, "rank 2: cannot open planted.bin", 2,
                   "rank 2 failed: cannot open planted.bin");
        fail_check("threads: failures: an error returned by fn wakes ranks in a barrier", F_BARRIER,
                   3, PT_ERR_CONFIG, "rank 1: bad planted config", 1,
                   "rank 1 failed: bad planted config");
        fail_check("threads: failures: ranks waiting in recv", F_RECV, 4, PT_ERR_IO,
                   "rank 3: planted failure", 3, "rank 3 failed: planted failure");
        fail_check("threads: failures: ranks in nested groups of a 2x2x2 grid", F_GRID, 8,
                   PT_ERR_RANGE, "rank 5: planted failure in a grid", 5,
                   "rank 5 failed: planted failure in a grid");
        fail_check("threads: failures: the lowest rank that failed first is reported", F_TWO, 4,
                   PT_ERR_RANGE, "rank 1: second failure", 3, "rank 3 failed: first failure");
        fail_check("threads: failures: a rank returning while another waits in a barrier",
                   F_RETURN_OK, 2, PT_ERR_COMM,
                   "rank 1: rank 0 returned while rank 1 waits for it in a collective (the ranks' "
                   "calls do not match)",
                   0, "rank 0 returned");
        fail_check("threads: failures: a rank returning while another waits for its message",
                   F_RETURN_OK_RECV, 2, PT_ERR_COMM,
                   "rank 1: recv: rank 0 returned without sending the message (tag 0) rank 1 "
                   "waits for",
                   0, "rank 0 returned");
        fail_check("threads: failures: a started collective outstanding (waits out of order)",
                   F_STARTED, 4, PT_ERR_IO, "rank 2: planted failure", 2,
                   "rank 2 failed: planted failure");
        fail_check("threads: failures: ranks waiting in started receives", F_STARTED_RECV, 3,
                   PT_ERR_IO, "rank 1: planted failure", 1, "rank 1 failed: planted failure");
        fail_check("threads: failures: pt_comm_fail, then returning PT_OK", F_FAIL_OK, 3,
                   PT_ERR_COMM, "rank 1: reported then ignored", 1,
                   "rank 1 failed: reported then ignored");
    }
    st = pt_comm_threads_run(0, nop_main, NULL);
    ok = st == PT_ERR_INVALID_ARG && strstr(pt_last_error(), "nranks=0");
    st = pt_comm_threads_run(2, NULL, NULL);
    ok = ok && st == PT_ERR_INVALID_ARG && strstr(pt_last_error(), "fn is NULL");
    top("threads: bad nranks and fn are refused", ok);
    st = pt_comm_threads_run(8, nop_main, NULL);
    ok = st == PT_OK && pt_get_threads() == threads;
#if !defined(PTRAIN_NO_BLAS) && defined(OPENBLAS_VERSION) /* the header links OpenBLAS */
    ok = ok && openblas_get_num_threads() == blas;
#endif
    top("threads: a run restores the caller's OpenMP and BLAS threads", ok);
}

int main(int argc, char **argv) {
    static const int nranks[] = {1, 2, 3, 4, 8};
    static char labels[5][32];
    pt_comm self;
    unsigned k;
    int i;
    double t0 = pt_time_now();
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--filter") && i + 1 < argc) g_filter = argv[++i];
        else if (!strcmp(argv[i], "--small")) g_cap = 4099;
        else {
            printf("usage: %s [--filter SUBSTR] [--small]\n", argv[0]);
            return 2;
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    pt_comm_self(&self);
    suite(&self, "self");
    grid_checks(&self, "self");
    pt_comm_free(&self);
    for (k = 0; k < sizeof nranks / sizeof nranks[0]; k++) {
        pt_status st;
        char name[64];
        snprintf(labels[k], sizeof labels[k], "threads x%d", nranks[k]);
        st = pt_comm_threads_run(nranks[k], suite_main, labels[k]);
        snprintf(name, sizeof name, "threads x%d: every rank returned PT_OK", nranks[k]);
        if (st != PT_OK) printf("    %s\n", pt_last_error());
        top(name, st == PT_OK);
    }
    if (pt_comm_threads_run(8, grid_main, (void *)"threads x8") != PT_OK ||
        pt_comm_threads_run(12, grid_main, (void *)"threads x12") != PT_OK)
        top("threads: the grid runs", 0);
    failure_checks();
    timeout_checks();
    printf("(%.1f s)\n%d passed, %d failed\n", pt_time_now() - t0, g_pass, g_failed);
    return g_failed ? 1 : 0;
}

#else /* PTRAIN_MPI */
/* ======================================================================== */
/* the MPI world                                                             */
/* ======================================================================== */

int main(int argc, char **argv) {
    pt_comm world;
    char label[32];
    int i, expect = -1, fail_rank = -1, started = 0;
    double t0;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--filter") && i + 1 < argc) g_filter = argv[++i];
        else if (!strcmp(argv[i], "--expect-size") && i + 1 < argc) expect = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--fail-rank") && i + 1 < argc) fail_rank = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--started")) started = 1;
        else if (!strcmp(argv[i], "--small")) g_cap = 4099;
        else {
            printf("usage: mpirun -n N %s [--expect-size N] [--fail-rank R [--started]] [--filter SUBSTR] "
                   "[--small]\n",
                   argv[0]);
            return 2;
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (pt_comm_mpi_init(&world, &argc, &argv) != PT_OK) {
        printf("FAIL  pt_comm_mpi_init: %s\n", pt_last_error());
        return 1;
    }
    t0 = pt_time_now();
    t_rank = world.rank;
    if (expect >= 0 && world.size != expect) {
        printf("FAIL  the MPI world has %d ranks, expected %d (mpirun of another MPI?)\n",
               world.size, expect);
        pt_comm_free(&world);
        pt_comm_mpi_finalize();
        return 1;
    }
    if (fail_rank >= 0) { /* rank fail_rank aborts the job while the others wait */
        float x[4] = {0, 0, 0, 0};
        if (world.rank == fail_rank) {
            sleep_ms(100);
            pt_error(PT_ERR_IO, "planted failure");
            pt_comm_fail(&world, PT_ERR_IO); /* does not return */
        }
        if (started) { /* the others wait for a started all-reduce */
            pt_comm_req q;
            if (pt_comm_all_reduce_start(&world, x, 4, PT_REDUCE_SUM, &q) == PT_OK) pt_comm_wait(&q);
        } else {
            pt_comm_all_reduce(&world, x, 4, PT_REDUCE_SUM);
        }
        printf("rank %d: the all-reduce returned: the job was not aborted\n", world.rank);
        pt_comm_free(&world);
        pt_comm_mpi_finalize();
        return 1;
    }
    snprintf(label, sizeof label, "mpi x%d", world.size);
    suite(&world, label);
    grid_checks(&world, label);
    if (world.rank == 0)
        printf("(%.1f s)\n%d passed, %d failed\n", pt_time_now() - t0, g_pass, g_failed);
    pt_comm_free(&world);
    pt_comm_mpi_finalize();
    return g_failed ? 1 : 0;
}
#endif
