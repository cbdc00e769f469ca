/* test.h -- the runner and shared checks of tests/test_main.c. Include it after
   ptrain.h (with _POSIX_C_SOURCE 200809L defined before any system header).

   A test is a void function; checks count failures in g_fail and print
   file:line with the values. test_run() takes a table of {name, fn}, runs
   those matching --filter SUBSTR and none of --skip A,B,... (substrings;
   valgrind skips the slow ones); --list prints names, --verbose the worst
   element of every comparison. It frees each test's TALLOC memory, and ends with
   the line "N passed, N failed, N checks skipped"; it returns non-zero if any
   test failed, and 2 (with a message, no count) if --filter and --skip leave no
   test to run. A check that cannot run on this machine (a kernel the CPU lacks)
   says so with SKIPPED(...): a "    SKIP ..." line, counted apart (tests/run.sh
   counts each such line as a skipped check), never as passed. */
#ifndef PTRAIN_TEST_H
#define PTRAIN_TEST_H

#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ======================================================================== */
/* runner and checks                                                         */
/* ======================================================================== */

static int g_fail;    /* failed checks in the running test */
static int g_skipped; /* checks SKIPPED so far, in every test */
static int g_verbose; /* --verbose: print the worst element of every comparison */

#if defined(__GNUC__) || defined(__clang__)
__attribute__((format(printf, 3, 4)))
#endif
static void failf(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    printf("    %s:%d: ", file, line);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    g_fail++;
}

#define FAIL(...) failf(__FILE__, __LINE__, __VA_ARGS__)
#if defined(__GNUC__) || defined(__clang__)
__attribute__((format(printf, 1, 2)))
#endif
static void skippedf(const char *fmt, ...) {
    va_list ap;
    printf("    SKIP ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    g_skipped++;
}
#define SKIPPED(...) skippedf(__VA_ARGS__)
#define CHECK(c) do { if (!(c)) FAIL("CHECK(%s) failed", #c); } while (0)
#define CHECK_EQ(a, b) do {                                                                 \
        long long a_ = (long long)(a), b_ = (long long)(b);                                  \
        if (a_ != b_) FAIL("%s = %lld, expected %s = %lld", #a, a_, #b, b_);                 \
    } while (0)
#define CHECK_NEAR(a, b, tol) do {                                                          \
        double a_ = (double)(a), b_ = (double)(b), t_ = (double)(tol);                       \
        if (!(fabs(a_ - b_) <= t_))                                                          \
            FAIL("%s = %.9g, expected %s = %.9g (|diff| %.3g > %.3g)", #a, a_, #b, b_,       \
                 fabs(a_ - b_), t_);                                                         \
    } while (0)
#define CHECK_ST(expr, want) do {                                                           \
        pt_status s_ = (expr);                                                               \
        if (s_ != (want))                                                                    \
            FAIL("%s returned %s, expected %s (last error: %s)", #expr, pt_status_name(s_),  \
                 pt_status_name(want), pt_last_error());                                     \
    } while (0)
#define CHECK_MSG(sub) do {                                                                 \
        if (!strstr(pt_last_error(), (sub)))                                                 \
            FAIL("last error \"%s\" does not mention \"%s\"", pt_last_error(), (sub));       \
    } while (0)
/* exact status, and the message names the problem */
#define CHECK_ERR(expr, want, sub) do { CHECK_ST(expr, want); CHECK_MSG(sub); } while (0)
#define ZERO(x) memset(&(x), 0, sizeof(x))

/* Per-test allocations, freed by the runner after each test. */
static void *g_allocs[1024];
static int g_nallocs;
static void *talloc(size_t n) {
    void *p = calloc(n ? n : 1, 1);
    if (!p || g_nallocs == (int)(sizeof g_allocs / sizeof g_allocs[0])) {
        printf("test harness: out of memory\n");
        exit(2);
    }
    return g_allocs[g_nallocs++] = p;
}
#define TALLOC(type, n) ((type *)talloc(sizeof(type) * (size_t)(n)))

/* The tests' own RNG (xorshift64*), reseeded before every test. */
static uint64_t g_rs;
static double urand(void) { /* [0, 1) */
    g_rs ^= g_rs >> 12;
    g_rs ^= g_rs << 25;
    g_rs ^= g_rs >> 27;
    return (double)((g_rs * 2685821657736338717ull) >> 11) * 0x1p-53;
}
static int irand(int n) { return (int)(urand() * n); }
static float *frand(size_t n, double lo, double hi) {
    float *x = TALLOC(float, n);
    size_t i;
    for (i = 0; i < n; i++) x[i] = (float)(lo + (hi - lo) * urand());
    return x;
}
static float *fcopy(const float *x, size_t n) {
    float *y = TALLOC(float, n);
    memcpy(y, x, n * sizeof(float));
    return y;
}
/* after - before: what an accumulating backward added */
static float *fdelta(const float *after, const float *before, size_t n) {
    float *d = TALLOC(float, n);
    size_t i;
    for (i = 0; i < n; i++) d[i] = after[i] - before[i];
    return d;
}
static double *to_double(const float *x, size_t n) {
    double *d = TALLOC(double, n);
    size_t i;
    for (i = 0; i < n; i++) d[i] = x[i];
    return d;
}

/* Every |a_i - r_i| <= atol + rtol |r_i| (NaN fails); reports the worst element. */
static int close_(const char *file, int line, const char *what, const float *a, const double *r,
                  size_t n, double atol, double rtol) {
    double worst = 0.0;
    size_t i, wi = 0;
    for (i = 0; i < n; i++) {
        double q = fabs((double)a[i] - r[i]) / (atol + rtol * fabs(r[i]));
        if (!(q <= worst)) {
            worst = q == q ? q : INFINITY;
            wi = i;
        }
    }
    if (g_verbose)
        printf("    %s: worst element [%zu] at %.3g of its tolerance\n", what, wi, worst);
    if (worst <= 1.0) return 1;
    failf(file, line, "%s: worst element [%zu] = %.9g, expected %.9g (|err| %.3g > tol %.3g)",
          what, wi, (double)a[wi], r[wi], fabs((double)a[wi] - r[wi]),
          atol + rtol * fabs(r[wi]));
    return 0;
}
#define CHECK_CLOSE(what, a, r, n, atol, rtol) close_(__FILE__, __LINE__, what, a, r, n, atol, rtol)

/* ---- finite differences ---------------------------------------------------
   fwd(ctx) recomputes out[0..nout) from the current inputs. The scalar loss is
   L = sum_i out[i] R[i] in double; dL/dx[j] by central differences (with the
   step actually representable in float) is compared with the analytic g[j]:
   |g - fd| <= atol + rtol |fd|. idx selects elements (NULL: all nx). */
typedef void (*fwd_fn)(void *ctx);

static double loss_dot(const float *out, const float *R, size_t n) {
    double s = 0.0;
    size_t i;
    for (i = 0; i < n; i++) s += (double)out[i] * (double)R[i];
    return s;
}

static int fd_check_(const char *file, int line, const char *what, fwd_fn fwd, void *ctx,
                     const float *out, const float *R, size_t nout, float *x, const float *g,
                     const size_t *idx, size_t nx, float h, double atol, double rtol) {
    double worst = 0.0, wfd = 0.0;
    size_t k, wj = 0;
    for (k = 0; k < nx; k++) {
        size_t j = idx ? idx[k] : k;
        float x0 = x[j], xp = x0 + h, xm = x0 - h;
        double lp, lm, fd, q;
        x[j] = xp;
        fwd(ctx);
        lp = loss_dot(out, R, nout);
        x[j] = xm;
        fwd(ctx);
        lm = loss_dot(out, R, nout);
        x[j] = x0;
        fd = (lp - lm) / ((double)xp - (double)xm);
        q = fabs((double)g[j] - fd) / (atol + rtol * fabs(fd));
        if (!(q <= worst)) {
            worst = q == q ? q : INFINITY;
            wj = j;
            wfd = fd;
        }
    }
    fwd(ctx); /* leave the outputs of the unperturbed inputs */
    if (g_verbose)
        printf("    %s: worst element [%zu] at %.3g of its tolerance\n", what, wj, worst);
    if (worst <= 1.0) return 1;
    failf(file, line, "%s: worst element [%zu]: analytic %.7g, finite difference %.7g "
          "(|err| %.3g > tol %.3g)", what, wj, (double)g[wj], wfd, fabs((double)g[wj] - wfd),
          atol + rtol * fabs(wfd));
    return 0;
}
#define FD_H 1e-3f
#define FD_ATOL 1e-3
#define FD_RTOL 1e-3
#define FD_CHECK(what, fwd, ctx, out, R, nout, x, g, nx)                                     \
    fd_check_(__FILE__, __LINE__, what, fwd, ctx, out, R, nout, x, g, NULL, nx, FD_H,         \
              FD_ATOL, FD_RTOL)

/* Temporary files live in one mkdtemp directory, removed at exit. */
static char g_tmpdir[64];
static const char *tmp_path(const char *name) {
    char *p = TALLOC(char, 128);
    if (!g_tmpdir[0]) {
        strcpy(g_tmpdir, "/tmp/ptrain_test_XXXXXX");
        if (!mkdtemp(g_tmpdir)) {
            printf("test harness: mkdtemp failed\n");
            exit(2);
        }
    }
    snprintf(p, 128, "%s/%s", g_tmpdir, name);
    return p;
}
static void tmp_cleanup(void) {
    DIR *d;
    struct dirent *e;
    char p[512];
    if (!g_tmpdir[0] || !(d = opendir(g_tmpdir))) return;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(p, sizeof p, "%s/%s", g_tmpdir, e->d_name);
            remove(p);
        }
    closedir(d);
    rmdir(g_tmpdir);
}
static int file_exists(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f) fclose(f);
    return f != NULL;
}
static unsigned char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    unsigned char *b;
    long len;
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    fseek(f, 0, SEEK_SET);
    b = TALLOC(unsigned char, len);
    *n = fread(b, 1, (size_t)len, f);
    fclose(f);
    return b;
}
static void write_all(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n) FAIL("cannot write %s", path);
    if (f) fclose(f);
}

/* ---- runner ------------------------------------------------------------------ */

typedef struct test_case {
    const char *name;
    void (*fn)(void);
} test_case;

/* 1 if name contains one of the comma-separated substrings in list */
static int test_matches_any(const char *name, const char *list) {
    while (*list) {
        size_t len = strcspn(list, ","), i;
        for (i = 0; len > 0 && name[i]; i++)
            if (strncmp(name + i, list, len) == 0) return 1;
        list += len + (list[len] == ',');
    }
    return 0;
}

static int test_run(const test_case *tests, int n, int argc, char **argv) {
    const char *filter = NULL, *skip = NULL;
    int i, list = 0, passed = 0, failed = 0, matched = 0;
    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--filter") == 0 && i + 1 < argc) filter = argv[++i];
        else if (strcmp(argv[i], "--skip") == 0 && i + 1 < argc) skip = argv[++i];
        else if (strcmp(argv[i], "--list") == 0) list = 1;
        else if (strcmp(argv[i], "--verbose") == 0) g_verbose = 1;
        else {
            printf("usage: %s [--filter SUBSTR] [--skip A,B,...] [--list] [--verbose]\n",
                   argv[0]);
            return 2;
        }
    }
    for (i = 0; i < n; i++) {
        double t0;
        if (filter && !strstr(tests[i].name, filter)) continue;
        if (skip && test_matches_any(tests[i].name, skip)) continue;
        matched++;
        if (list) {
            printf("%s\n", tests[i].name);
            continue;
        }
        g_fail = 0;
        { /* seeded by the test's name (FNV-1a): its inputs do not change when tests are added */
            const char *c;
            g_rs = 0xcbf29ce484222325ull;
            for (c = tests[i].name; *c; c++) g_rs = (g_rs ^ (unsigned char)*c) * 0x100000001b3ull;
            g_rs |= 1; /* xorshift needs a non-zero state */
        }
        pt_clear_error();
        t0 = pt_time_now();
        tests[i].fn();
        while (g_nallocs > 0) free(g_allocs[--g_nallocs]);
        printf("%-4s %-32s %.2fs\n", g_fail ? "FAIL" : "ok", tests[i].name, pt_time_now() - t0);
        if (g_fail) failed++;
        else passed++;
        fflush(stdout);
    }
    tmp_cleanup();
    if (matched == 0) { /* a typo must not pass as "0 passed" */
        printf("no test matches --filter %s --skip %s (--list names them)\n",
               filter ? filter : "(none)", skip ? skip : "(none)");
        return 2;
    }
    if (!list) printf("%d passed, %d failed, %d check%s skipped\n", passed, failed, g_skipped,
                      g_skipped == 1 ? "" : "s");
    return failed != 0;
}

#endif /* PTRAIN_TEST_H */
