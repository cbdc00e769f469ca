/* test_main.c -- unit tests of ptrain.h.

     build/tests [--filter SUBSTR] [--skip A,B,...] [--list] [--verbose]

   Build (tests/run.sh runs it optimised, under ASan + UBSan and with PTRAIN_NO_BLAS):
     gcc -std=c11 -O2 -Wall -Wextra -Wpedantic -fopenmp tests/test_main.c -o build/tests \
         -I/usr/include/x86_64-linux-gnu/openblas-openmp \
         -L/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas -lm

   Every expected value comes from math written here, never from ptrain itself:
   naive loops in double, central finite differences, hand-computed constants.
   The runner and the shared checks are in test.h. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, opendir, pthreads under -std=c11 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

/* A counting allocator, so a test can see how much pt_gpt_init(meta=1) allocates
   and that steps allocate nothing (atomic: thread ranks allocate at once).
   g_alloc_marked counts the calls whose context is &g_alloc_mark: a model
   built with desc.alloc_ctx = &g_alloc_mark, apart from the communicators'
   messages (context NULL), which may allocate when more are in flight than
   before (the header's ALLOCATION note). */
static _Atomic size_t g_alloc_bytes, g_alloc_calls, g_alloc_marked;
static char g_alloc_mark;
static void *count_malloc(size_t n, const void *ctx) {
    g_alloc_bytes += n;
    g_alloc_calls++;
    if (ctx == &g_alloc_mark) g_alloc_marked++;
    return malloc(n);
}
#define PTRAIN_MALLOC(sz, ctx) count_malloc(sz, ctx)
#define PTRAIN_FREE(p, ctx) ((void)(ctx), free(p))
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"

#include "test.h"

/* The execution context of the tests that call kernels directly: fp32, a GEMM
   workspace for as many threads as cores (tests change the thread count),
   made at the first call and kept to the end. */
static pt_ctx *tctx(void) {
    static pt_ctx c;
    static int made;
    if (!made) {
        pt_ctx_desc d;
        ZERO(d);
#ifdef _OPENMP
        d.threads = omp_get_num_procs();
#endif
        made = 1;
        if (pt_ctx_init(&c, &d) != PT_OK) FAIL("pt_ctx_init: %s", pt_last_error());
    }
    return &c;
}

/* ---- models ---------------------------------------------------------------- */

static pt_gpt_config cfg_make(int V, int block, int L, int NH, int C) {
    pt_gpt_config c;
    ZERO(c);
    c.vocab_size = V;
    c.block_size = block;
    c.n_layer = L;
    c.n_head = NH;
    c.n_embd = C;
    return c;
}
static pt_status gpt_new(pt_gpt *g, pt_gpt_config c, int B, int T, int meta) {
    pt_gpt_desc d;
    ZERO(d);
    d.config = c;
    d.batch = B;
    d.seq = T;
    d.meta = meta;
    return pt_gpt_init(g, &d);
}
/* GPT-2 init plus uniform(-s, s) noise on every parameter (non-trivial LN and biases) */
static void gpt_randomize(pt_gpt *g, uint64_t seed, float s) {
    size_t i;
    pt_gpt_init_weights(g, seed);
    for (i = 0; i < g->num_params; i++) g->params[i] += (float)(s * (2.0 * urand() - 1.0));
}
static int *rand_ids(int n, int V) {
    int *x = TALLOC(int, n), i;
    for (i = 0; i < n; i++) x[i] = irand(V);
    return x;
}

/* ======================================================================== */
/* kernels                                                                   */
/* ======================================================================== */

/* Inputs and outputs of one kernel call, so one fwd_fn per kernel can
   recompute its output under perturbation. */
typedef struct kargs {
    float *out, *x, *w, *b, *mean, *rstd, *att, *lse, *scratch;
    double *dlse; /* cross-entropy's log-sum-exp */
    int *ids;
    int B, T, C, NH, N, IN, OUT, V, slots;
    size_t n;
    float eps;
} kargs;

static void fwd_encoder(void *p) {
    kargs *k = (kargs *)p;
    pt_encoder_forward(k->out, k->ids, k->w, k->b, k->B, k->T, k->C);
}
static void fwd_layernorm(void *p) {
    kargs *k = (kargs *)p;
    pt_layernorm_forward(k->out, k->mean, k->rstd, k->x, k->w, k->b, k->N, k->C, k->eps);
}
static void fwd_matmul(void *p) {
    kargs *k = (kargs *)p;
    pt_matmul_forward(tctx(), k->out, k->x, k->w, k->b, k->N, k->IN, k->OUT);
}
static void fwd_attention(void *p) { /* the fast, blocked kernel */
    kargs *k = (kargs *)p;
    pt_attention_forward(tctx(), k->out, k->lse, k->x, k->scratch, k->slots, k->B, k->T, k->C,
                         k->NH, k->NH);
}
static void fwd_attention_ref(void *p) {
    kargs *k = (kargs *)p;
    pt_attention_ref_forward(k->out, k->att, k->x, k->B, k->T, k->C, k->NH);
}
static void fwd_gelu(void *p) {
    kargs *k = (kargs *)p;
    pt_gelu_forward(k->out, k->x, k->n);
}
static void fwd_residual(void *p) {
    kargs *k = (kargs *)p;
    pt_residual_forward(k->out, k->x, k->w, k->n);
}
static void fwd_head(void *p) {
    kargs *k = (kargs *)p;
    pt_tied_head_forward(tctx(), k->out, k->x, k->w, k->N, k->C, k->V);
}
static void fwd_xent(void *p) {
    kargs *k = (kargs *)p;
    pt_crossentropy_forward(k->out, k->dlse, k->x, k->ids, k->N, k->V);
}

/* C = alpha op(A) op(B) + beta C against a triple loop, all four transpose
   combinations, non-square, leading dimensions with padding (which must stay
   untouched). With beta = 0, C is not read (NaN there must not propagate).
   The third size runs in runs of rows, as with a dp group (pt_ctx.poll.slice:
   here 100 FLOP, below one row's 360, so runs of at least 64 rows: 64, 64,
   22), polling between them; the first with no context (NULL: OpenBLAS or the
   portable loops). */
static int g_polls;
static void count_poll(void *arg) {
    (void)arg;
    g_polls++;
}
static void test_sgemm(void) {
    const int sizes[3][3] = {{5, 7, 3}, {33, 17, 40}, {150, 9, 20}}; /* M, N, K */
    const float alpha = 0.7f, beta = -0.3f;
    int sz, ta, tb, i, j, kk;
    for (sz = 0; sz < 3; sz++)
        for (ta = 0; ta < 2; ta++)
            for (tb = 0; tb < 2; tb++) {
                int M = sizes[sz][0], N = sizes[sz][1], K = sizes[sz][2], pass;
                int lda = (ta ? M : K) + 2, ldb = (tb ? K : N) + 3, ldc = N + 4;
                float *A = frand((size_t)(ta ? K : M) * lda, -1, 1);
                float *Bm = frand((size_t)(tb ? N : K) * ldb, -1, 1);
                for (pass = 0; pass < 2; pass++) { /* pass 1: beta = 0 over a NaN-filled C */
                    float *C = frand((size_t)M * ldc, -1, 1), be = pass ? 0.0f : beta;
                    double *ref = to_double(C, (size_t)M * ldc);
                    char what[128];
                    for (i = 0; i < M; i++)
                        for (j = 0; j < N; j++) {
                            double s = 0.0;
                            for (kk = 0; kk < K; kk++)
                                s += (double)(ta ? A[kk * lda + i] : A[i * lda + kk]) *
                                     (double)(tb ? Bm[j * ldb + kk] : Bm[kk * ldb + j]);
                            ref[i * ldc + j] = alpha * s + (pass ? 0.0 : beta * (double)C[i * ldc + j]);
                            if (pass) C[i * ldc + j] = NAN;
                        }
                    pt_ctx ctx = *tctx(); /* its workspace, a poller of its own */
                    if (sz == 2) {
                        ctx.poll.fn = count_poll, ctx.poll.slice = 100.0;
                        g_polls = 0;
                    }
                    pt_sgemm(sz == 0 ? NULL : &ctx, ta, tb, M, N, K, alpha, A, lda, Bm, ldb, be, C,
                             ldc);
                    snprintf(what, sizeof what, "sgemm %dx%dx%d ta=%d tb=%d beta=%g%s", M, N, K,
                             ta, tb, (double)be, sz == 2 ? " in runs of rows" : "");
                    CHECK_CLOSE(what, C, ref, (size_t)M * ldc, 1e-6, 1e-5);
                    if (sz == 2 && g_polls < 1) CHECK(!"pt_sgemm in runs of rows polled");
                }
            }
}

/* ---- ptrain's GEMMs (fp32 and bf16) against a double product ------------
   C = alpha op(A) op(B) + beta C for every layout (NN, NT, TN, TT), beta in
   {0 over a NaN-filled C, 1, -0.5}, on odd shapes that cut the kernels'
   blocks (MR = 12 rows, NR = 32 columns, packing blocks of 16 k (fp32) and
   32 (bf16), K slabs of at most 384 k (fp32) or 768 (bf16), MC = 4092 rows,
   NC = 512 columns, the threads' grid split by columns or by rows; AMX:
   32x32 tiles, k blocks of 32, KC = 512, MC = 128, NC <= 1024 with A shared
   beyond) anywhere,
   with padded leading dimensions whose padding must stay as it was; bf16 on
   every kernel this CPU has (amx, avx512bf16, sgemm, portable), the rest SKIP.
   The reference is the double-precision product of the operands as the GEMM
   sees them: a = fl32(alpha*A) and, for bf16, a' = bf16(a), b' = bf16(B)
   (round to nearest even), c = sum_k a'_k b'_k + beta C.
   Error bound: bf16 products are exact in fp32 (8-bit x 8-bit significands),
   fp32 products and every sum round once (vdpbf16ps and AMX's TDPBF16PS: at
   most twice a k-pair; both flush denormals, which these operands and sums
   almost surely never are: uniform in [-1, 1]),
   so for any summation order the computed value is within
     gamma_(K+2) * (sum_k |a_k b_k| + |beta C|),  gamma_n = n u / (1 - n u),
   u = 2^-24 (the extra 2: alpha's rounding when it is applied to the sum
   instead, and beta's term). No other tolerance. */
static int gemm_check(pt_ctx *ctx, const char *impl, int bf16, int ta, int tb, int M, int N, int K,
                      float alpha, float beta) {
    int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 2, ldc = N + 5, i, j, k, bad = 0;
    const double u = 0x1p-24, gam = (K + 2) * u / (1.0 - (K + 2) * u);
    size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb, nc = (size_t)M * ldc;
    float *A = (float *)malloc((na + nb + 2 * nc) * sizeof(float)), *Bm = A + na, *C = Bm + nb,
          *C0 = C + nc;
    double worst = 0.0;
    if (!A) {
        FAIL("out of memory");
        return 1;
    }
    for (j = 0; j < (int)(na + nb + nc); j++) A[j] = (float)(2.0 * urand() - 1.0);
    memcpy(C0, C, nc * sizeof(float));
    if (beta == 0.0f)
        for (i = 0; i < M; i++)
            for (j = 0; j < N; j++) C[(size_t)i * ldc + j] = NAN;
    if (bf16)
        pt_gemm_bf16(ctx, ta, tb, M, N, K, alpha, A, lda, Bm, ldb, beta, C, ldc);
    else
        pt_sgemm(ctx, ta, tb, M, N, K, alpha, A, lda, Bm, ldb, beta, C, ldc);
    for (i = 0; i < M; i++)
        for (j = 0; j < ldc; j++) {
            double s = 0.0, mag = 0.0, got = C[(size_t)i * ldc + j], q;
            if (j >= N) { /* padding untouched */
                if (memcmp(&C[(size_t)i * ldc + j], &C0[(size_t)i * ldc + j], 4)) bad++;
                continue;
            }
            for (k = 0; k < K; k++) {
                float a = alpha * (ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]);
                float b = tb ? Bm[(size_t)j * ldb + k] : Bm[(size_t)k * ldb + j];
                double p = bf16 ? (double)pt_bf16_round(a) * pt_bf16_round(b) : (double)a * b;
                s += p;
                mag += fabs(p);
            }
            if (beta != 0.0f) {
                s += (double)beta * C0[(size_t)i * ldc + j];
                mag += fabs((double)beta * C0[(size_t)i * ldc + j]);
            }
            q = fabs(got - s) / (gam * mag + 1e-300);
            if (!(q <= 1.0)) bad++;
            if (!(q <= worst)) worst = q == q ? q : INFINITY;
        }
    if (bad || g_verbose)
        printf("    %s %s ta=%d tb=%d %dx%dx%d alpha=%g beta=%g: %d bad, worst at %.3g of the "
               "bound\n", impl, bf16 ? "bf16" : "fp32", ta, tb, M, N, K, (double)alpha,
               (double)beta, bad, worst);
    free(A);
    return bad;
}

static void test_gemm_kernels(void) {
    static const int shapes[][3] = {{1, 7, 17},    {7, 1, 63},     {17, 63, 1},   {63, 100, 7},
                                    {100, 17, 257}, {130, 63, 100}, {13, 800, 5}, {24, 40, 300}};
    /* ptrain's kernels also on shapes that cut the larger blocks: K slabs
       (513: two fp32 slabs; 1000: three fp32, two bf16), NC and a column
       split between threads (1601), MC and a row split (4100 rows, 40
       columns), the AMX blocking (32x32 tiles, k blocks of 32, KC = 512, MC
       = 128, NC <= 1024); one beta a layout on the last three */
    static const int cuts[][3] = {{33, 47, 65},    {150, 1601, 33}, {45, 70, 1000},
                                  {300, 257, 513}, {4100, 40, 40}};
    enum { NCUT = sizeof cuts / sizeof cuts[0] };
    static const float betas[3] = {0.0f, 1.0f, -0.5f};
    static const char *impls[3] = {"ptrain", "openblas", "portable"};
    static const char *bf16_impls[4] = {"amx", "avx512bf16", "sgemm", "portable"};
    int im, s, lay, bi;
    for (im = 0; im < 3; im++) {
        pt_status st;
#ifdef PTRAIN_NO_BLAS
        if (im == 1) continue; /* a build without OpenBLAS: not a check this build has */
#endif
        st = pt_gemm_select(impls[im]);
        if (st != PT_OK) {
            SKIPPED("gemm '%s': %s", impls[im], pt_last_error());
            continue;
        }
        for (s = 0; s < (int)(sizeof shapes / sizeof shapes[0]) + (im == 0 ? NCUT : 0); s++) {
            const int *sh = s < (int)(sizeof shapes / sizeof shapes[0])
                                ? shapes[s]
                                : cuts[s - (int)(sizeof shapes / sizeof shapes[0])];
            for (lay = 0; lay < 4; lay++)
                for (bi = 0; bi < 3; bi++) {
                    if (s >= (int)(sizeof shapes / sizeof shapes[0]) + NCUT - 3 && bi != lay % 3)
                        continue;
                    if (gemm_check(tctx(), impls[im], 0, lay & 1, lay >> 1, sh[0], sh[1], sh[2],
                                   bi == 2 ? 0.75f : 1.0f, betas[bi]))
                        FAIL("fp32 GEMM '%s' wrong (see above)", impls[im]);
                }
        }
    }
    CHECK_ST(pt_gemm_select(NULL), PT_OK);
    for (im = 0; im < 4; im++) {
        pt_status st = pt_gemm_bf16_select(bf16_impls[im]);
        int ns = (int)(sizeof shapes / sizeof shapes[0]), nc = NCUT;
        if (st != PT_OK) {
            SKIPPED("bf16 gemm '%s': %s", bf16_impls[im], pt_last_error());
            continue;
        }
        CHECK(strcmp(pt_gemm_bf16_name(), im == 0   ? "ptrain-amx"
                                          : im == 1 ? "ptrain-avx512bf16"
                                                    : bf16_impls[im]) == 0);
        /* sgemm cuts ptrain's fp32 blocks or its own OpenBLAS blocks (512 k, 2048
           columns); the loops have none to cut (and valgrind runs them) */
        if (im == 3 || (im == 2 && !strcmp(pt_gemm_name(), "portable"))) nc = 0;
        for (s = 0; s < ns + nc; s++) {
            const int *sh = s < ns ? shapes[s] : cuts[s - ns];
            for (lay = 0; lay < 4; lay++)
                for (bi = 0; bi < 3; bi++) {
                    if (s >= ns + nc - 3 && bi != lay % 3) continue;
                    if (gemm_check(tctx(), bf16_impls[im], 1, lay & 1, lay >> 1, sh[0], sh[1],
                                   sh[2], bi == 2 ? 0.75f : 1.0f, betas[bi]))
                        FAIL("bf16 GEMM '%s' wrong (see above)", bf16_impls[im]);
                }
        }
    }
    { /* sgemm on OpenBLAS in a one-thread context (one slot of workspace): 4100
         rows x 600 k take two blocks of rows and two k slabs (512, 88); 2100
         columns two column blocks */
        pt_ctx one;
        pt_ctx_desc cd;
        ZERO(cd);
        cd.threads = 1;
        if (pt_gemm_select("openblas") == PT_OK && pt_gemm_bf16_select("sgemm") == PT_OK &&
            pt_ctx_init(&one, &cd) == PT_OK) {
            for (lay = 0; lay < 4; lay++)
                if (gemm_check(&one, "sgemm on openblas", 1, lay & 1, lay >> 1, 4100, 33, 600,
                               0.75f, betas[lay % 3]) ||
                    gemm_check(&one, "sgemm on openblas", 1, lay & 1, lay >> 1, 7, 2100, 30, 1.0f,
                               betas[(lay + 1) % 3]))
                    FAIL("bf16 GEMM 'sgemm' on OpenBLAS wrong (see above)");
            pt_ctx_free(&one);
        } else {
#ifndef PTRAIN_NO_BLAS
            FAIL("bf16 gemm 'sgemm' on OpenBLAS could not be set up: %s", pt_last_error());
#endif
        }
        CHECK_ST(pt_gemm_select(NULL), PT_OK);
        CHECK_ST(pt_gemm_bf16_select(NULL), PT_OK);
    }
    /* ptrain's results do not depend on the thread count: each element is
       one thread's sum in K order (bit for bit, 1 thread against all; the
       second shape splits the rows between threads, the first the columns) */
    for (im = -1; im < 2; im++)
        for (s = 0; s < 2; s++) {
            int M = s ? 4100 : 300, N = s ? 40 : 257, K = s ? 100 : 1000;
            float *A = frand((size_t)M * K, -1, 1), *Bm = frand((size_t)K * N, -1, 1);
            float *C1 = frand((size_t)M * N, -1, 1), *C2 = frand((size_t)M * N, -1, 1);
            int nth = pt_get_threads(), t;
            if (im < 0 ? pt_gemm_select("ptrain") != PT_OK
                       : pt_gemm_bf16_select(bf16_impls[im]) != PT_OK)
                continue;
            for (t = 0; t < 2; t++) {
                pt_set_threads(t ? nth : 1);
                if (im < 0) pt_sgemm(tctx(), 0, 1, M, N, K, 1.0f, A, K, Bm, K, 0.0f, t ? C2 : C1, N);
                else pt_gemm_bf16(tctx(), 0, 1, M, N, K, 1.0f, A, K, Bm, K, 0.0f, t ? C2 : C1, N);
            }
            if (memcmp(C1, C2, sizeof(float) * M * N))
                FAIL("%s GEMM '%s' differs between 1 and %d threads", im < 0 ? "fp32" : "bf16",
                     im < 0 ? "ptrain" : bf16_impls[im], nth);
            pt_gemm_select(NULL);
        }
    /* the names: auto is the best the CPU has; unknown is an error naming it */
    CHECK_ST(pt_gemm_bf16_select("auto"), PT_OK);
    {
        int amx = pt_gemm_bf16_select("amx") == PT_OK, avx = pt_gemm_bf16_select("avx512bf16") == PT_OK;
        pt_gemm_bf16_select("auto");
        CHECK(strcmp(pt_gemm_bf16_name(), !strcmp(pt_gemm_name(), "portable") ? "portable"
                                          : amx                                 ? "ptrain-amx"
                                          : avx ? "ptrain-avx512bf16"
                                                : "sgemm") == 0);
        pt_gemm_select("portable"); /* a portable fp32 GEMM makes auto bf16 portable too */
        CHECK(strcmp(pt_gemm_bf16_name(), "portable") == 0);
        pt_gemm_select(NULL);
    }
    CHECK_ERR(pt_gemm_bf16_select("fastest"), PT_ERR_INVALID_ARG, "fastest");
    CHECK_ST(pt_gemm_bf16_select(NULL), PT_OK);
    /* an empty product scales C; an unknown name is an error naming it */
    {
        float c[2] = {2.0f, 3.0f};
        pt_gemm_select("portable"); /* ldb = 1 < N: ptrain's check, not cblas's */
        pt_sgemm(tctx(), 0, 0, 1, 2, 0, 1.0f, c, 1, c, 1, 0.5f, c, 2);
        CHECK(c[0] == 1.0f && c[1] == 1.5f);
        pt_gemm_bf16(tctx(), 0, 0, 1, 2, 0, 1.0f, c, 1, c, 1, 0.0f, c, 2);
        CHECK(c[0] == 0.0f && c[1] == 0.0f);
    }
    CHECK_ERR(pt_gemm_select("fastest"), PT_ERR_INVALID_ARG, "fastest");
    /* round to nearest even, ties to even, NaN stays NaN; the bits are the float's top half */
    CHECK(pt_bf16_round(1.0f + 0x1p-8f) == 1.0f && pt_bf16_round(1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f);
    CHECK(pt_bf16_round(1.0f + 0x1p-8f + 0x1p-20f) == 1.0f + 0x1p-7f);
    CHECK(isnan(pt_bf16_round(NAN)) && isnan(pt_bf16_to_float(pt_bf16_from_float(-NAN))));
    CHECK(pt_bf16_from_float(1.0f) == 0x3F80 && pt_bf16_from_float(-2.0f) == 0xC000);
    CHECK(pt_bf16_to_float(0x3FC0) == 1.5f && pt_bf16_from_float(INFINITY) == 0x7F80);
    CHECK_ST(pt_gemm_select(NULL), PT_OK); /* back to the default (PTRAIN_GEMM or auto) */
}

/* The bf16 GEMM on operands of bf16 bits (pt__gemm_bf16_bias's ops: what a
   bf16 step hands over for activations it keeps as bf16) gives the same bits
   as on the same values as floats, A's, B's or both, in every layout, with
   alpha 1 (words copied) and not (widened, scaled, rounded), a bias or
   beta, on shapes that cut the packing (odd K, edge rows and columns, two K
   slabs, the transposed A's 48-row groups): on each kernel that takes them
   (pt__gemm_bf16_takes16); the others (sgemm, AMX) run the portable loops
   on them, the bits of the portable kernel on the floats. */
static void test_gemm_bf16_operands(void) {
    static const int shapes[][3] = {{37, 70, 801}, {100, 33, 64}, {5, 300, 31}, {130, 65, 1}};
    static const char *impls[4] = {"avx512bf16", "portable", "sgemm", "amx"};
    int im, s, lay, ops, v;
    for (im = 0; im < 4; im++) {
        if (pt_gemm_bf16_select(impls[im]) != PT_OK) {
            SKIPPED("bf16 gemm '%s': %s", impls[im], pt_last_error());
            continue;
        }
        CHECK(pt__gemm_bf16_takes16(tctx()) == (im < 2));
        for (s = 0; s < (int)(sizeof shapes / sizeof shapes[0]); s++)
            for (lay = 0; lay < 4; lay++)
                for (ops = 1; ops <= 3; ops++)
                    for (v = 0; v < 2; v++) { /* v: alpha 1, bias; else alpha 0.75, beta 1 */
                        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2], ta = lay & 1,
                            tb = lay >> 1, lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 2,
                            ldc = N + 5;
                        size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb,
                               nc = (size_t)M * ldc, i;
                        float *A = (float *)malloc((na + nb + 3 * nc + N) * sizeof(float));
                        float *Bm = A + na, *C1 = Bm + nb, *C2 = C1 + nc, *bias = C2 + nc;
                        uint16_t *h = (uint16_t *)malloc((na + nb) * sizeof(uint16_t));
                        float alpha = v ? 0.75f : 1.0f, beta = v ? 1.0f : 0.0f;
                        if (!A || !h) {
                            FAIL("out of memory");
                            free(A), free(h);
                            return;
                        }
                        for (i = 0; i < na + nb + nc + N; i++) A[i] = (float)(2.0 * urand() - 1.0);
                        A[0] = 3e-39f, Bm[0] = -2e-39f; /* denormals: read as zero, bits or not */
                        for (i = 0; i < na + nb; i++) { /* the values bf16 already, both ways */
                            h[i] = pt_bf16_from_float(A[i]);
                            A[i] = pt_bf16_to_float(h[i]);
                        }
                        memcpy(bias, C1 + nc - N, N * sizeof(float));
                        memcpy(C2, C1, nc * sizeof(float));
                        if (im >= 2) pt_gemm_bf16_select("portable");
                        pt__gemm_bf16_bias(tctx(), 0, ta, tb, M, N, K, alpha, A, lda, Bm, ldb,
                                           beta, C1, ldc, v ? NULL : bias);
                        if (im >= 2) pt_gemm_bf16_select(impls[im]);
                        pt__gemm_bf16_bias(tctx(), ops, ta, tb, M, N, K, alpha,
                                           ops & 1 ? (const void *)h : A, lda,
                                           ops & 2 ? (const void *)(h + na) : Bm, ldb, beta, C2,
                                           ldc, v ? NULL : bias);
                        if (memcmp(C1, C2, nc * sizeof(float))) {
                            FAIL("bf16 gemm '%s' on bf16 operands (ops %d) ta=%d tb=%d %dx%dx%d "
                                 "alpha=%g: other bits than on floats", impls[im], ops, ta, tb, M,
                                 N, K, (double)alpha);
                            s = 99, lay = 4, ops = 4, v = 2; /* once is enough */
                        }
                        free(A), free(h);
                    }
    }
    CHECK_ST(pt_gemm_bf16_select(NULL), PT_OK);
}

/* The blocked GEMM on a smaller OpenMP team than it asks for: OMP_DYNAMIC
   on a CPU with fewer free cores than the context's 8 threads (libgomp then
   gives at most those). The bits of the one-thread product, with the grid
   that splits rows (the team sharing each packed B slab) and the one that
   splits columns, fp32 and bf16 (ptrain's AVX-512 kernels); C starts NaN
   (beta 0), so a rectangle or a B panel nobody ran shows. SKIPs where the
   team came whole. */
static void test_gemm_small_team(void) {
#ifdef _OPENMP
    static const int shapes[2][3] = {{480, 256, 400}, {24, 2048, 800}}; /* M, N, K */
    int dyn = omp_get_dynamic(), nt = omp_get_max_threads(), got = 0, s, k;
    pt_ctx c8, c1;
    pt_ctx_desc d;
    if (strcmp(pt_gemm_name(), "ptrain-avx512")) {
        SKIPPED("the blocked GEMM: the fp32 GEMM is %s", pt_gemm_name());
        return;
    }
    ZERO(d);
    d.threads = 8;
    if (pt_ctx_init(&c8, &d) != PT_OK) FAIL("pt_ctx_init: %s", pt_last_error());
    d.threads = 1;
    if (pt_ctx_init(&c1, &d) != PT_OK) FAIL("pt_ctx_init: %s", pt_last_error());
    omp_set_dynamic(1);
    omp_set_num_threads(8);
#pragma omp parallel num_threads(8)
    {
#pragma omp master
        got = omp_get_num_threads();
    }
    for (s = 0; s < 2 && got < 8; s++)
        for (k = 0; k < 2; k++) {
            int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2], i;
            float *A = frand((size_t)M * K, -1, 1), *Bm = frand((size_t)K * N, -1, 1);
            float *C8 = TALLOC(float, (size_t)M * N), *C1 = TALLOC(float, (size_t)M * N);
            if (k && strcmp(pt_gemm_bf16_name(), "ptrain-avx512bf16")) continue;
            for (i = 0; i < M * N; i++) C8[i] = C1[i] = NAN;
            if (k) {
                pt_gemm_bf16(&c8, 0, s, M, N, K, 1.0f, A, K, Bm, s ? K : N, 0.0f, C8, N);
                pt_gemm_bf16(&c1, 0, s, M, N, K, 1.0f, A, K, Bm, s ? K : N, 0.0f, C1, N);
            } else {
                pt_sgemm(&c8, 0, s, M, N, K, 1.0f, A, K, Bm, s ? K : N, 0.0f, C8, N);
                pt_sgemm(&c1, 0, s, M, N, K, 1.0f, A, K, Bm, s ? K : N, 0.0f, C1, N);
            }
            if (memcmp(C8, C1, sizeof(float) * M * N))
                FAIL("%s GEMM %dx%dx%d on %d of 8 threads: not the one-thread bits",
                     k ? "bf16" : "fp32", M, N, K, got);
        }
    if (got >= 8) SKIPPED("OMP_DYNAMIC gave the whole team of 8 threads");
    omp_set_dynamic(dyn);
    omp_set_num_threads(nt);
    pt_ctx_free(&c8);
    pt_ctx_free(&c1);
#else
    SKIPPED("no OpenMP: one thread");
#endif
}
/* The model kernels' GEMM precision: names, a context's (checked; attention
   hands it to its OpenMP tasks), a bf16 dense layer equal to the double
   product of the rounded operands within gemm_check's bound, and a pt_gpt
   at bf16 whose context carries it (its poller set only during a call). */
static void test_precision(void) {
    enum { N = 5, IN = 37, OUT = 9, B = 2, T = 8, NH = 2, HD = 8 };
    pt_precision p = PT_PRECISION_DEFAULT;
    float *x = frand(N * IN, -1, 1), *w = frand(OUT * IN, -1, 1), y[N * OUT], yf[N * OUT];
    int n, o, i, bad = 0;
    pt_ctx c16;
    CHECK_ST(pt_precision_parse("bf16", &p), PT_OK);
    CHECK(p == PT_PRECISION_BF16);
    CHECK_ST(pt_precision_parse("fp32", &p), PT_OK);
    CHECK(p == PT_PRECISION_FP32);
    CHECK_ERR(pt_precision_parse("fp16", &p), PT_ERR_CONFIG, "unknown precision 'fp16'");
    CHECK(!strcmp(pt_precision_name(PT_PRECISION_DEFAULT), "fp32"));
    CHECK(!strcmp(pt_precision_name(PT_PRECISION_BF16), "bf16"));
    { /* a context: its desc checked, zero is fp32 */
        pt_ctx_desc cd;
        ZERO(cd);
        cd.precision = (pt_precision)5;
        CHECK_ERR(pt_ctx_init(&c16, &cd), PT_ERR_INVALID_ARG, "precision=5");
        cd.precision = PT_PRECISION_DEFAULT, cd.threads = -1;
        CHECK_ERR(pt_ctx_init(&c16, &cd), PT_ERR_INVALID_ARG, "threads=-1");
        cd.threads = 0;
        CHECK_ST(pt_ctx_init(&c16, &cd), PT_OK);
        CHECK(c16.precision == PT_PRECISION_FP32 && c16.threads == pt_get_threads() && c16.ws);
        CHECK((uintptr_t)c16.ws % 64 == 0 && c16.ws_slot * c16.threads < pt_ctx_workspace_bytes(c16.threads));
        pt_ctx_free(&c16);
        CHECK(c16.ws == NULL);
        cd.precision = PT_PRECISION_BF16;
        CHECK_ST(pt_ctx_init(&c16, &cd), PT_OK);
    }
    pt_linear_forward(&c16, y, x, w, NULL, N, IN, OUT);
    pt_linear_forward(tctx(), yf, x, w, NULL, N, IN, OUT);
    for (n = 0; n < N; n++)
        for (o = 0; o < OUT; o++) {
            double s = 0.0, mag = 0.0, u = 0x1p-24;
            for (i = 0; i < IN; i++) {
                double t = (double)pt_bf16_round(x[n * IN + i]) * pt_bf16_round(w[o * IN + i]);
                s += t, mag += fabs(t);
            }
            if (!(fabs(y[n * OUT + o] - s) <= (IN + 2) * u * mag)) bad++;
        }
    CHECK(bad == 0);
    CHECK(memcmp(y, yf, sizeof y) != 0); /* the fp32 product is another one */
    { /* attention: its tasks on other OpenMP threads run the context's bf16 */
        int C = NH * HD, C3 = 3 * C, slots = 2;
        float *qkv = frand((size_t)B * T * C3, -2, 2), *out = TALLOC(float, B * T * C);
        float *out16 = TALLOC(float, B * T * C), *lse = TALLOC(float, B * NH * T);
        float *scr = TALLOC(float, pt_attention_scratch_floats(T, slots));
        double worst = 0.0;
        pt_attention_forward(tctx(), out, lse, qkv, scr, slots, B, T, C, NH, NH);
        pt_attention_forward(&c16, out16, lse, qkv, scr, slots, B, T, C, NH, NH);
        for (i = 0; i < B * T * C; i++)
            if (fabs((double)out16[i] - out[i]) > worst) worst = fabs((double)out16[i] - out[i]);
        CHECK(worst > 0.0 && worst < 0.1); /* rounded scores and values: bf16's few digits */
    }
    pt_ctx_free(&c16);
    { /* a bf16 model: desc checked, its context at bf16 */
        pt_gpt g, g16;
        pt_gpt_desc d;
        int in[B * T], tg[B * T];
        float l32;
        for (i = 0; i < B * T; i++) in[i] = i % 11, tg[i] = (i * 7) % 11;
        ZERO(d);
        d.config = cfg_make(11, T, 2, NH, NH * HD), d.batch = B, d.seq = T;
        d.precision = (pt_precision)7;
        CHECK_ERR(pt_gpt_init(&g, &d), PT_ERR_CONFIG, "precision=7");
        d.precision = PT_PRECISION_DEFAULT;
        CHECK_ST(pt_gpt_init(&g, &d), PT_OK);
        CHECK(g.ctx.precision == PT_PRECISION_FP32 && g.ctx.ws && !g.ctx.poll.fn);
        d.precision = PT_PRECISION_BF16;
        CHECK_ST(pt_gpt_init(&g16, &d), PT_OK);
        pt_gpt_init_weights(&g, 3);
        pt_gpt_init_weights(&g16, 3);
        CHECK_ST(pt_gpt_forward(&g, in, tg, B, T), PT_OK);
        l32 = g.loss;
        CHECK_ST(pt_gpt_forward(&g16, in, tg, B, T), PT_OK);
        CHECK(g16.loss != l32 && fabsf(g16.loss - l32) < 1e-2f);
        CHECK_ST(pt_gpt_backward(&g16), PT_OK);
        CHECK(g16.ctx.precision == PT_PRECISION_BF16 && !g16.ctx.poll.fn); /* poller: calls only */
        { /* bf16 rounds q, k, v and fch whether a layer keeps them in bf16 (no
             recomputation: ln1, qkv, ln2, fch as bf16), recomputes the
             attention from them (selective) or keeps nothing (full): the
             same loss and gradients bit for bit, so backward read each
             layer's own; and the kept bf16 halves qkv and fch: at least
             L x N (3C + 4C) x 2 bytes fewer than fp32's (64-byte blocks).
             ln1 and ln2 are kept by neither (computed again in backward
             from the kept statistics): fp32 keeps less than L x N x 12 C
             floats (out, qkv, atty, res2, fch: 10 C a row a layer) */
            int k;
            size_t n4 = (size_t)2 * B * T * (7 * NH * HD) * 2;
            CHECK(g.mem.activations < (size_t)2 * B * T * 12 * (NH * HD) * sizeof(float));
            for (k = 1; k < 3; k++) {
                pt_gpt r;
                d.recompute = k == 1 ? PT_RECOMPUTE_SELECTIVE : PT_RECOMPUTE_FULL;
                CHECK_ST(pt_gpt_init(&r, &d), PT_OK);
                pt_gpt_init_weights(&r, 3);
                CHECK_ST(pt_gpt_forward(&r, in, tg, B, T), PT_OK);
                CHECK_ST(pt_gpt_backward(&r), PT_OK);
                if (r.loss != g16.loss || memcmp(r.grads, g16.grads, r.num_params * sizeof(float)))
                    FAIL("bf16 with %s recomputation: another loss or gradients than without",
                         k == 1 ? "selective" : "full");
                pt_gpt_free(&r);
            }
            d.recompute = 0;
            CHECK(g16.mem.activations + n4 <= g.mem.activations);
        }
        { /* two micro-batches a step: GPipe's forwards both run before either
             backward, zb-h1 runs the weights' pass apart from the input's, so
             the layer scratch a kept activation is widened into holds another
             layer's or micro-batch's when it is read: the same gradients as
             1F1B's, bit for bit */
            static const pt_schedule_kind sk[3] = {PT_SCHED_1F1B, PT_SCHED_GPIPE, PT_SCHED_ZB_H1};
            float *g1 = NULL, l1 = 0.0f;
            int k;
            for (k = 0; k < 3; k++) {
                pt_gpt r;
                pt_step_desc sd;
                ZERO(sd);
                d.batch = B / 2, d.grad_accum = 2, d.schedule = sk[k];
                CHECK_ST(pt_gpt_init(&r, &d), PT_OK);
                pt_gpt_init_weights(&r, 3);
                sd.inputs = in, sd.targets = tg, sd.B = B, sd.T = T;
                CHECK_ST(pt_gpt_step(&r, &sd, NULL), PT_OK);
                if (!g1) g1 = fcopy(r.grads, r.num_params), l1 = r.loss;
                else if (r.loss != l1 || memcmp(r.grads, g1, r.num_params * sizeof(float)))
                    FAIL("bf16, 2 micro-batches: %s gives other gradients than 1F1B",
                         k == 1 ? "gpipe" : "zb-h1");
                pt_gpt_free(&r);
            }
            d.batch = B, d.grad_accum = 0, d.schedule = PT_SCHED_DEFAULT;
        }
        pt_gpt_free(&g);
        pt_gpt_free(&g16);
    }
}

/* out[n,c] = wte[ids[n],c] + wpe[n%T,c]; repeated ids must accumulate into dwte. */
static void test_encoder(void) {
    enum { B = 2, T = 3, C = 4, V = 5 };
    int ids[B * T] = {1, 3, 1, 1, 0, 3}, n, c; /* 1 and 3 repeat, 2 and 4 unused */
    kargs k;
    float *R = frand(B * T * C, -1, 1), *dwte, *dwpe, *dwte0, *dwpe0;
    double *ref = TALLOC(double, B * T * C);
    ZERO(k);
    k.out = TALLOC(float, B * T * C);
    k.w = frand(V * C, -1, 1);
    k.b = frand(T * C, -1, 1);
    k.ids = ids;
    k.B = B, k.T = T, k.C = C;
    fwd_encoder(&k);
    for (n = 0; n < B * T; n++)
        for (c = 0; c < C; c++) ref[n * C + c] = (double)k.w[ids[n] * C + c] + k.b[(n % T) * C + c];
    CHECK_CLOSE("encoder forward", k.out, ref, B * T * C, 0, 1e-7);
    dwte = frand(V * C, -1, 1), dwpe = frand(T * C, -1, 1);
    dwte0 = fcopy(dwte, V * C), dwpe0 = fcopy(dwpe, T * C);
    pt_encoder_backward(dwte, dwpe, R, ids, B, T, C);
    for (c = 0; c < C; c++) { /* unused rows get exactly nothing */
        CHECK(dwte[2 * C + c] == dwte0[2 * C + c]);
        CHECK(dwte[4 * C + c] == dwte0[4 * C + c]);
    }
    FD_CHECK("encoder dwte", fwd_encoder, &k, k.out, R, B * T * C, k.w, fdelta(dwte, dwte0, V * C), V * C);
    FD_CHECK("encoder dwpe", fwd_encoder, &k, k.out, R, B * T * C, k.b, fdelta(dwpe, dwpe0, T * C), T * C);
}

/* y = (x - mean) rstd w + b, mean and biased variance in double, eps inside the sqrt. */
static void test_layernorm(void) {
    enum { N = 4, C = 6 };
    kargs k;
    float *R = frand(N * C, -1, 1), *dx, *dw, *db, *dx0, *dw0, *db0;
    double *ref = TALLOC(double, N * C), *rmean = TALLOC(double, N), *rrstd = TALLOC(double, N);
    int n, c;
    ZERO(k);
    k.N = N, k.C = C, k.eps = 1e-2f; /* a large eps makes its placement visible */
    k.x = frand(N * C, 1.0, 4.0);
    k.w = frand(C, 0.5, 1.5);
    k.b = frand(C, -0.5, 0.5);
    k.out = TALLOC(float, N * C), k.mean = TALLOC(float, N), k.rstd = TALLOC(float, N);
    fwd_layernorm(&k);
    for (n = 0; n < N; n++) {
        double m = 0.0, v = 0.0;
        for (c = 0; c < C; c++) m += k.x[n * C + c];
        m /= C;
        for (c = 0; c < C; c++) v += (k.x[n * C + c] - m) * (k.x[n * C + c] - m);
        v /= C;
        rmean[n] = m;
        rrstd[n] = 1.0 / sqrt(v + (double)k.eps);
        for (c = 0; c < C; c++) ref[n * C + c] = (k.x[n * C + c] - m) * rrstd[n] * k.w[c] + k.b[c];
    }
    CHECK_CLOSE("layernorm out", k.out, ref, N * C, 1e-6, 1e-5);
    CHECK_CLOSE("layernorm mean", k.mean, rmean, N, 1e-6, 1e-6);
    CHECK_CLOSE("layernorm rstd", k.rstd, rrstd, N, 1e-6, 1e-5);
    dx = frand(N * C, -1, 1), dw = frand(C, -1, 1), db = frand(C, -1, 1);
    dx0 = fcopy(dx, N * C), dw0 = fcopy(dw, C), db0 = fcopy(db, C);
    pt_layernorm_backward(dx, dw, db, R, k.x, k.w, k.mean, k.rstd, N, C);
    FD_CHECK("layernorm dinp", fwd_layernorm, &k, k.out, R, N * C, k.x, fdelta(dx, dx0, N * C), N * C);
    FD_CHECK("layernorm dweight", fwd_layernorm, &k, k.out, R, N * C, k.w, fdelta(dw, dw0, C), C);
    FD_CHECK("layernorm dbias", fwd_layernorm, &k, k.out, R, N * C, k.b, fdelta(db, db0, C), C);
    { /* a row of 2 x 64 + 16 + 7: the row sums' blocks of 4 vectors, a vector, a masked tail */
        enum { W = 151 };
        float *x = frand(2 * W, -3, 5), *y = TALLOC(float, 2 * W), *w = frand(W, 0.5, 1.5);
        float mean[2], rstd[2];
        double want[2], wantr[2];
        x[W - 1] = 40.0f, x[W + 100] = -30.0f; /* in the tail, in the last block */
        pt_layernorm_forward(y, mean, rstd, x, w, NULL, 2, W, 1e-5f);
        for (n = 0; n < 2; n++) {
            double m = 0.0, v = 0.0;
            for (c = 0; c < W; c++) m += x[n * W + c];
            for (c = 0, m /= W; c < W; c++) v += (x[n * W + c] - m) * (x[n * W + c] - m);
            want[n] = m, wantr[n] = 1.0 / sqrt(v / W + 1e-5);
        }
        CHECK_CLOSE("layernorm mean (151 wide)", mean, want, 2, 1e-6, 1e-6);
        CHECK_CLOSE("layernorm rstd (151 wide)", rstd, wantr, 2, 1e-6, 1e-5);
    }
}

/* The norms' weight gradients over rows wider than a column block (several
   blocks and a ragged tail): each column's sum runs over the rows in order,
   so it equals the same float sum written out serially, bit for bit. */
static void test_norm_wide_rows(void) {
    enum { N = 7, C = 300 };
    float *x = frand(N * C, -2, 2), *d = frand(N * C, -1, 1), *w = frand(C, 0.5, 1.5);
    float *mean = frand(N, -0.1, 0.1), *rstd = frand(N, 0.5, 2.0);
    float *dw = frand(C, -1, 1), *db = frand(C, -1, 1), *qw = fcopy(dw, C);
    float *rw = fcopy(dw, C), *rb = fcopy(db, C), *rq = fcopy(dw, C);
    int n, c;
    pt_layernorm_backward(NULL, dw, db, d, x, w, mean, rstd, N, C);
    pt_rmsnorm_backward(NULL, qw, d, x, w, rstd, N, C);
    for (n = 0; n < N; n++)
        for (c = 0; c < C; c++) {
            float dd = d[n * C + c], xx = x[n * C + c];
            rw[c] += dd * (xx - mean[n]) * rstd[n];
            rb[c] += dd;
            rq[c] += dd * xx * rstd[n];
        }
    CHECK(memcmp(dw, rw, sizeof(float) * C) == 0);
    CHECK(memcmp(db, rb, sizeof(float) * C) == 0);
    CHECK(memcmp(qw, rq, sizeof(float) * C) == 0);
}

/* Conv1D layout out[N,OUT] = x[N,IN] @ w[IN,OUT] + b, with and without bias. */
static void test_matmul(void) {
    enum { N = 4, IN = 5, OUT = 7 };
    int with_bias;
    for (with_bias = 1; with_bias >= 0; with_bias--) {
        kargs k;
        float *R = frand(N * OUT, -1, 1), *dx, *dw, *db, *dx0, *dw0, *db0;
        double *ref = TALLOC(double, N * OUT);
        int n, o, i;
        ZERO(k);
        k.N = N, k.IN = IN, k.OUT = OUT;
        k.x = frand(N * IN, -1, 1), k.w = frand(IN * OUT, -1, 1);
        k.b = with_bias ? frand(OUT, -1, 1) : NULL;
        k.out = frand(N * OUT, -1, 1); /* garbage: forward must overwrite it */
        fwd_matmul(&k);
        for (n = 0; n < N; n++)
            for (o = 0; o < OUT; o++) {
                double s = with_bias ? k.b[o] : 0.0;
                for (i = 0; i < IN; i++) s += (double)k.x[n * IN + i] * k.w[i * OUT + o];
                ref[n * OUT + o] = s;
            }
        CHECK_CLOSE(with_bias ? "matmul forward" : "matmul forward, no bias", k.out, ref, N * OUT, 1e-6, 1e-5);
        dx = frand(N * IN, -1, 1), dw = frand(IN * OUT, -1, 1), db = with_bias ? frand(OUT, -1, 1) : NULL;
        dx0 = fcopy(dx, N * IN), dw0 = fcopy(dw, IN * OUT), db0 = with_bias ? fcopy(db, OUT) : NULL;
        pt_matmul_backward(tctx(), dx, dw, db, R, k.x, k.w, N, IN, OUT);
        FD_CHECK("matmul dinp", fwd_matmul, &k, k.out, R, N * OUT, k.x, fdelta(dx, dx0, N * IN), N * IN);
        FD_CHECK("matmul dweight", fwd_matmul, &k, k.out, R, N * OUT, k.w, fdelta(dw, dw0, IN * OUT), IN * OUT);
        if (with_bias)
            FD_CHECK("matmul dbias", fwd_matmul, &k, k.out, R, N * OUT, k.b, fdelta(db, db0, OUT), OUT);
    }
}

/* Causal attention on [q|k|v][head][hd] against a naive double reference,
   the causal mask, and finite differences of dqkv (which accumulates): the
   reference kernel (stores probabilities), and the blocked one at a T that
   spans several query blocks (stores only the log-sum-exp). */
static void check_attention(int fast, int B, int T, int C, int NH) {
    int hd = C / NH, N = B * T, b, h, t, u, i, t0 = T / 2 + 1;
    kargs k;
    float *R = frand(N * C, -1, 1), *dqkv, *dqkv0, *out0, *x0;
    double *ref = TALLOC(double, N * C), *ratt = TALLOC(double, (size_t)B * NH * T * T);
    double *rlse = TALLOC(double, B * NH * T), *s = TALLOC(double, T);
    void (*fwd)(void *) = fast ? fwd_attention : fwd_attention_ref;
    const char *name = fast ? "attention (blocked)" : "attention (reference)";
    char what[96];
    ZERO(k);
    k.B = B, k.T = T, k.C = C, k.NH = NH, k.slots = 2;
    k.x = frand(N * 3 * C, -1.5, 1.5);
    k.out = TALLOC(float, N * C), k.att = frand((size_t)B * NH * T * T, -1, 1);
    k.lse = frand(B * NH * T, -1, 1);
    k.scratch = frand(pt_attention_scratch_floats(T, k.slots), -1, 1);
    fwd(&k);
    for (b = 0; b < B; b++)
        for (h = 0; h < NH; h++)
            for (t = 0; t < T; t++) {
                const float *q = k.x + (b * T + t) * 3 * C + h * hd;
                double mx = -1e300, sum = 0.0;
                size_t row = ((size_t)(b * NH + h) * T + t) * T;
                for (u = 0; u < T; u++) {
                    const float *kk = k.x + (b * T + u) * 3 * C + C + h * hd;
                    s[u] = 0.0;
                    for (i = 0; i < hd; i++) s[u] += (double)q[i] * kk[i];
                    s[u] /= sqrt((double)hd);
                    if (u <= t && s[u] > mx) mx = s[u];
                }
                for (u = 0; u < T; u++) sum += u <= t ? exp(s[u] - mx) : 0.0;
                rlse[(b * NH + h) * T + t] = mx + log(sum);
                for (u = 0; u < T; u++) ratt[row + u] = u <= t ? exp(s[u] - mx) / sum : 0.0;
                for (i = 0; i < hd; i++) {
                    double o = 0.0;
                    for (u = 0; u <= t; u++)
                        o += ratt[row + u] * k.x[(b * T + u) * 3 * C + 2 * C + h * hd + i];
                    ref[(b * T + t) * C + h * hd + i] = o;
                }
            }
    snprintf(what, sizeof what, "%s out", name);
    CHECK_CLOSE(what, k.out, ref, N * C, 1e-6, 1e-5);
    if (fast) CHECK_CLOSE("attention log-sum-exp", k.lse, rlse, B * NH * T, 1e-6, 1e-6);
    else CHECK_CLOSE("attention probabilities (0 above the diagonal)", k.att, ratt,
                     (size_t)B * NH * T * T, 1e-7, 1e-5);
    /* causal mask: changing key and value of position t0 in the last batch row
       leaves every earlier output bit-identical, and changes t0 itself */
    out0 = fcopy(k.out, N * C), x0 = fcopy(k.x, N * 3 * C);
    for (i = 0; i < C; i++) {
        k.x[((B - 1) * T + t0) * 3 * C + C + i] += 2.0f;
        k.x[((B - 1) * T + t0) * 3 * C + 2 * C + i] -= 3.0f;
    }
    fwd(&k);
    CHECK(memcmp(k.out, out0, sizeof(float) * ((B - 1) * T + t0) * C) == 0);
    CHECK(memcmp(k.out + ((B - 1) * T + t0) * C, out0 + ((B - 1) * T + t0) * C,
                 sizeof(float) * C) != 0);
    memcpy(k.x, x0, sizeof(float) * N * 3 * C);
    fwd(&k);
    dqkv = frand(N * 3 * C, -1, 1), dqkv0 = fcopy(dqkv, N * 3 * C);
    if (fast)
        pt_attention_backward(tctx(), dqkv, R, k.out, k.x, k.lse, k.scratch, k.slots, B, T, C, NH,
                              NH);
    else
        pt_attention_ref_backward(dqkv, TALLOC(float, B * NH * T), R, k.x, k.att, B, T, C, NH);
    snprintf(what, sizeof what, "%s dqkv", name);
    /* h = 5e-3: the float loss sums N*C outputs, whose rounding (~2e-6 at T=131)
       over 2h must stay well below the tolerance */
    fd_check_(__FILE__, __LINE__, what, fwd, &k, k.out, R, (size_t)N * C, k.x,
              fdelta(dqkv, dqkv0, N * 3 * C), NULL, (size_t)N * 3 * C, 5e-3f, FD_ATOL, FD_RTOL);
}

static void test_attention(void) {
    check_attention(0, 2, 5, 8, 2);
    check_attention(1, 2, 5, 8, 2);
    check_attention(1, 1, 2 * PT_ATTN_QBLOCK + 3, 8, 2); /* three query blocks, ragged */
}

/* gelu (tanh form) in double; backward WRITES dinp, also when dinp == dout. */
static void test_gelu(void) {
    enum { n = 64 };
    kargs k;
    float *R = frand(n, -1, 1), *dx = frand(n, 1e3, 2e3), *alias;
    double *ref = TALLOC(double, n), *ref_dx;
    int i;
    ZERO(k);
    k.n = n, k.x = frand(n, -4, 4), k.out = TALLOC(float, n);
    fwd_gelu(&k);
    for (i = 0; i < n; i++) {
        double u = k.x[i];
        ref[i] = 0.5 * u * (1.0 + tanh(sqrt(2.0 / 3.141592653589793) * (u + 0.044715 * u * u * u)));
    }
    CHECK_CLOSE("gelu forward", k.out, ref, n, 1e-7, 1e-6);
    pt_gelu_backward(dx, k.x, R, n); /* dx held 1e3..2e3: it must be overwritten */
    FD_CHECK("gelu dinp (written)", fwd_gelu, &k, k.out, R, n, k.x, dx, n);
    alias = fcopy(R, n);
    pt_gelu_backward(alias, k.x, alias, n);
    ref_dx = to_double(dx, n);
    CHECK_CLOSE("gelu backward with dinp == dout", alias, ref_dx, n, 1e-7, 1e-6);
}

/* |y - r| <= 1e-30 + 1e-6 (1 + |e| E/(1+E)) max(|r|, mag) element by element,
   e the argument of the formula's exp, E = exp(e): a one-ulp change in e (FMA
   contraction rounds it differently) moves 1/(1+E) by |e| E/(1+E) ulp, so
   that is the condition number (1 where E underflows, |e| where it is huge);
   mag (or NULL) the size of the terms a gradient sums (they may cancel). */
static void lanes_close(const char *what, const float *y, const float *r, const float *e,
                        const float *mag, int n) {
    int i, bad = 0, worst = 0;
    double wd = -1;
    for (i = 0; i < n; i++) {
        double diff = fabs((double)y[i] - (double)r[i]);
        double c = 1.0 + fabs((double)e[i]) / (1.0 + exp(-(double)e[i]));
        double tol = 1e-30 + 1e-6 * c * fmax(fabs((double)r[i]), mag ? (double)mag[i] : 0.0);
        if (!(diff <= tol) && !(y[i] != y[i] && r[i] != r[i])) bad++;
        if (diff > wd) wd = diff, worst = i;
    }
    if (bad)
        FAIL("%s: %d of %d elements off, worst [%d] = %.9g, expected %.9g (argument %.3g)", what,
             bad, n, worst, y[worst], r[worst], e[worst]);
}

/* the same bits, NaN for NaN (any payload) */
static int same_bits(const float *a, const float *b, int n) {
    int i;
    for (i = 0; i < n; i++)
        if (memcmp(a + i, b + i, sizeof(float)) != 0 && !(a[i] != a[i] && b[i] != b[i])) return 0;
    return 1;
}

/* GELU's and SwiGLU's kernels against their scalar formula over n = 16k + 7,
   with inputs from -100 to 100, 0, -0, the infinities and NaN: bit for bit
   where the kernels run the scalar loop compiled without FMA contraction
   (gcc's ISO C modes; clang contracts), else within the exp argument's
   condition (lanes_close), the special values' bits kept. On AVX-512
   (PT__ACT16) an element's bits do not depend on its position: the arrays
   again from their second element (every lane moved, a new masked tail). */
static void test_act_lanes(void) {
    enum { n = 16 * 40 + 7, F = 16 * 20 + 7 };
    float *x = frand(2 * n, -9, 9), *d = frand(2 * n, -1, 1), *y = TALLOC(float, 2 * n);
    float *r = TALLOC(float, 2 * n), *dy = TALLOC(float, 2 * n), *e = TALLOC(float, 3 * n);
    float *h = TALLOC(float, 2 * n), *z = TALLOC(float, 2 * n), *dz = TALLOC(float, 2 * n);
    float *mag = TALLOC(float, n);
    int i, exact = 1;
#if defined(__clang__) || defined(PT__ACT16)
    exact = 0;
#endif
    for (i = 0; i < 200; i++) x[3 * i] = -100.0f + (float)i;
    x[1] = 0.0f, x[4] = -0.0f, x[7] = INFINITY, x[10] = -INFINITY, x[13] = NAN;
    pt_gelu_forward(y, x, n);
    pt_gelu_backward(dy, x, d, n);
    for (i = 0; i < n; i++) {
        float u = x[i], t = PT__GELU_K * (u + 0.044715f * u * u * u);
        float sg = 1.0f / (1.0f + pt__expf(-2.0f * t));
        float g = sg + 2.0f * u * sg * (1.0f - sg) * PT__GELU_K * (1.0f + 3.0f * 0.044715f * u * u);
        r[i] = u / (1.0f + pt__expf(-2.0f * t)), r[n + i] = g * d[i];
        mag[i] = fabsf(d[i]) * (sg + fabsf(g - sg));
        e[i] = -2.0f * t;
    }
    for (i = 0; i < 14; i++) /* the specials' bits (-0 for -100's GELU, NaN for -inf's) */
        if (i % 3 != 2) CHECK(same_bits(y + i, r + i, 1) && same_bits(dy + i, r + n + i, 1));
    if (exact) {
        CHECK(memcmp(y, r, sizeof(float) * 14) == 0); /* NaN too: its bits */
        CHECK(memcmp(y + 14, r + 14, sizeof(float) * (n - 14)) == 0);
        CHECK(memcmp(dy, r + n, sizeof(float) * n) == 0);
    }
    lanes_close("gelu lanes", y + 14, r + 14, e + 14, NULL, n - 14);
    lanes_close("gelu backward lanes", dy + 14, r + n + 14, e + 14, mag + 14, n - 14);
    pt_gelu_forward(z, x + 1, n - 1);
    pt_gelu_backward(dz, x + 1, d + 1, n - 1);
    CHECK(same_bits(z, y + 1, n - 1) && same_bits(dz, dy + 1, n - 1));
    /* SwiGLU: one row of F gates then F ups */
    pt_swiglu_forward(y, x, 1, F);
    pt_swiglu_backward(dy, x, d, 1, F);
    for (i = 0; i < F; i++) {
        float g = x[i], u = x[F + i], s = 1.0f / (1.0f + pt__expf(-g));
        r[i] = g / (1.0f + pt__expf(-g)) * u;
        r[F + i] = d[i] * u * s * (1.0f + g * (1.0f - s)); /* d gate */
        r[2 * F + i] = d[i] * g * s;                        /* d up */
        e[i] = -g, mag[i] = fabsf(d[i] * u) * (s + fabsf(g) * s * (1.0f - s));
    }
    if (exact) {
        CHECK(memcmp(y + 14, r + 14, sizeof(float) * (F - 14)) == 0);
        CHECK(memcmp(dy + 14, r + F + 14, sizeof(float) * (F - 14)) == 0);
        CHECK(memcmp(dy + F + 14, r + 2 * F + 14, sizeof(float) * (F - 14)) == 0);
    }
    lanes_close("swiglu lanes", y + 14, r + 14, e + 14, NULL, F - 14);
    lanes_close("swiglu d gate lanes", dy + 14, r + F + 14, e + 14, mag + 14, F - 14);
    lanes_close("swiglu d up lanes", dy + F + 14, r + 2 * F + 14, e + 14, NULL, F - 14);
    memcpy(h, x + 1, sizeof(float) * (F - 1)); /* the row from its second column */
    memcpy(h + F - 1, x + F + 1, sizeof(float) * (F - 1));
    pt_swiglu_forward(z, h, 1, F - 1);
    pt_swiglu_backward(dz, h, d + 1, 1, F - 1);
    CHECK(same_bits(z, y + 1, F - 1) && same_bits(dz, dy + 1, F - 1));
    CHECK(same_bits(dz + F - 1, dy + F + 1, F - 1));
}

/* The activations' backward that also writes the forward's output (for
   the weight gradient, not recomputed): the output is the forward's bits,
   the gradient the plain backward's, over 16-lane spans and a scalar tail,
   SwiGLU's output in its dout's place as the block's backward calls it. */
static void test_act_fused(void) {
    enum { n = 16 * 300 + 7, N = 3, F = 16 * 5 + 7 };
    float *x = frand(2 * n, -9, 9), *d = frand(n, -1, 1), *y = TALLOC(float, n);
    float *a = frand(n, 5, 6), *dy = TALLOC(float, 2 * n), *dz = frand(2 * n, 5, 6);
    pt_gelu_forward(y, x, n);
    pt_gelu_backward(dy, x, d, n);
    pt__gelu(dz, a, x, d, n, 1, NULL);
    CHECK(memcmp(a, y, sizeof(float) * n) == 0);
    CHECK(memcmp(dz, dy, sizeof(float) * n) == 0);
    pt_swiglu_forward(y, x, N, F);
    pt_swiglu_backward(dy, x, d, N, F);
    memcpy(a, d, sizeof(float) * N * F);
    pt__swiglu_bwd(dz, a, x, a, N, F, NULL); /* act == dout */
    CHECK(memcmp(a, y, sizeof(float) * N * F) == 0);
    CHECK(memcmp(dz, dy, sizeof(float) * 2 * N * F) == 0);
}

/* out = a + b (out may alias a); backward accumulates into both. */
static void test_residual(void) {
    enum { n = 40 };
    kargs k;
    float *R = frand(n, -1, 1), *da = frand(n, -1, 1), *db = frand(n, -1, 1), *da0, *db0, *a;
    double *ref = TALLOC(double, n);
    int i;
    ZERO(k);
    k.n = n, k.x = frand(n, -1, 1), k.w = frand(n, -1, 1), k.out = TALLOC(float, n);
    fwd_residual(&k);
    for (i = 0; i < n; i++) ref[i] = (double)k.x[i] + k.w[i];
    CHECK_CLOSE("residual forward", k.out, ref, n, 0, 1e-7);
    a = fcopy(k.x, n);
    pt_residual_forward(a, a, k.w, n);
    CHECK_CLOSE("residual forward, out == a", a, ref, n, 0, 1e-7);
    da0 = fcopy(da, n), db0 = fcopy(db, n);
    pt_residual_backward(da, db, R, n);
    FD_CHECK("residual da", fwd_residual, &k, k.out, R, n, k.x, fdelta(da, da0, n), n);
    FD_CHECK("residual db", fwd_residual, &k, k.out, R, n, k.w, fdelta(db, db0, n), n);
}

/* logits = x @ wte^T; dx and dwte accumulate. */
static void test_tied_head(void) {
    enum { N = 3, C = 4, V = 6 };
    kargs k;
    float *R = frand(N * V, -1, 1), *dx = frand(N * C, -1, 1), *dw = frand(V * C, -1, 1), *dx0, *dw0;
    double *ref = TALLOC(double, N * V);
    int n, v, c;
    ZERO(k);
    k.N = N, k.C = C, k.V = V;
    k.x = frand(N * C, -1, 1), k.w = frand(V * C, -1, 1), k.out = frand(N * V, -1, 1);
    fwd_head(&k);
    for (n = 0; n < N; n++)
        for (v = 0; v < V; v++) {
            double s = 0.0;
            for (c = 0; c < C; c++) s += (double)k.x[n * C + c] * k.w[v * C + c];
            ref[n * V + v] = s;
        }
    CHECK_CLOSE("tied head forward", k.out, ref, N * V, 1e-6, 1e-5);
    dx0 = fcopy(dx, N * C), dw0 = fcopy(dw, V * C);
    pt_tied_head_backward(tctx(), dx, dw, R, k.x, k.w, N, C, V);
    FD_CHECK("tied head dx", fwd_head, &k, k.out, R, N * V, k.x, fdelta(dx, dx0, N * C), N * C);
    FD_CHECK("tied head dwte", fwd_head, &k, k.out, R, N * V, k.w, fdelta(dw, dw0, V * C), V * C);
}

/* losses = logsumexp - logit[target] in double (also for huge logits); backward
   WRITES dloss (softmax - onehot), also in place over the logits. */
static void test_crossentropy(void) {
    enum { N = 4, V = 7 };
    const float dloss = 0.7f;
    int targets[N] = {0, 6, 3, 3}, n, v;
    kargs k;
    float *R = TALLOC(float, N), *dl = frand(N * V, 50, 60), *inplace;
    double *ref = TALLOC(double, N), *ref_dl;
    ZERO(k);
    k.N = N, k.V = V, k.ids = targets;
    k.x = frand(N * V, -3, 3), k.out = TALLOC(float, N), k.dlse = TALLOC(double, N);
    for (v = 0; v < V; v++) k.x[3 * V + v] += 1000.0f; /* exp overflows without a shift */
    k.x[2 * V + 1] = 95.0f;
    fwd_xent(&k);
    for (n = 0; n < N; n++) {
        double mx = -1e300, s = 0.0;
        for (v = 0; v < V; v++) mx = fmax(mx, k.x[n * V + v]);
        for (v = 0; v < V; v++) s += exp((double)k.x[n * V + v] - mx);
        ref[n] = mx + log(s) - k.x[n * V + targets[n]];
        R[n] = dloss;
    }
    CHECK_CLOSE("crossentropy losses", k.out, ref, N, 1e-5, 1e-6);
    for (v = 0; v < V; v++) k.x[3 * V + v] -= 1000.0f; /* moderate logits for the differences */
    k.x[2 * V + 1] = 2.0f;
    fwd_xent(&k);
    pt_crossentropy_backward(dl, k.x, k.dlse, targets, N, V, dloss); /* dl held 50..60 */
    FD_CHECK("crossentropy dlogits (written)", fwd_xent, &k, k.out, R, N, k.x, dl, N * V);
    inplace = fcopy(k.x, N * V);
    pt_crossentropy_backward(inplace, inplace, k.dlse, targets, N, V, dloss);
    ref_dl = to_double(dl, N * V);
    CHECK_CLOSE("crossentropy backward in place", inplace, ref_dl, N * V, 1e-7, 1e-6);
}

/* The head and the loss fused by row blocks (pt_head_xent_fused) against the
   unfused kernels on the whole logits, in fp32 and bf16: the same losses,
   lse and dx, dwte within its block-wise summation; a last block shorter
   than the others; the default block size; the loss alone with no gradient.
   lse is bit for bit where a logit does not depend on how many rows the GEMM
   has (ptrain's and the portable GEMMs), and so are one block's dx and dwte;
   OpenBLAS (PTRAIN_GEMM=openblas) blocks by M, so there within 1e-6
   relative. */
static void test_head_xent_fused(void) {
    enum { N = 37, C = 24, V = 50, R = 8 };
    const float dloss = 0.3f;
    int targets[N], n, rows, k;
    float *x = frand(N * C, -1, 1), *w = frand(V * C, -1, 1), *logits = TALLOC(float, N * V);
    float *loss_ref = TALLOC(float, N), *dx0 = frand(N * C, -1, 1), *dw0 = frand(V * C, -1, 1);
    float *loss = TALLOC(float, N), *work;
    double *lse_ref = TALLOC(double, N), *lse = TALLOC(double, N);
    pt_ctx c16, *ctx;
    pt_ctx_desc cd;
    size_t wn, w16;
    ZERO(cd);
    cd.precision = PT_PRECISION_BF16;
    if (pt_ctx_init(&c16, &cd) != PT_OK) FAIL("pt_ctx_init: %s", pt_last_error());
    /* room for R-row blocks with wte packed at either precision, and for one N-row block */
    wn = pt_head_xent_work_floats(tctx(), N, C, V, R);
    w16 = pt_head_xent_work_floats(&c16, N, C, V, R);
    wn = (wn > w16 ? wn : w16) + N * V;
    work = TALLOC(float, wn);
    for (n = 0; n < N; n++) targets[n] = (n * 7 + 3) % V;
    for (k = 0; k < 2; k++) { /* fp32, bf16 */
        float *dx_ref = fcopy(dx0, N * C), *dw_ref = fcopy(dw0, V * C);
        int blas = !strcmp(pt_gemm_name(), "openblas") &&
                   (!k || !strcmp(pt_gemm_bf16_name(), "sgemm"));
        ctx = k ? &c16 : tctx();
        pt_tied_head_forward(ctx, logits, x, w, N, C, V);
        pt_crossentropy_forward(loss_ref, lse_ref, logits, targets, N, V);
        pt_crossentropy_backward(logits, logits, lse_ref, targets, N, V, dloss);
        pt_tied_head_backward(ctx, dx_ref, dw_ref, logits, x, w, N, C, V);
        for (rows = R; rows >= 0; rows -= R) { /* 8, then 0 (the default: one block) */
            float *dx = fcopy(dx0, N * C), *dw = fcopy(dw0, V * C);
            pt_head_xent_fused(ctx, loss, lse, dx, dw, x, w, targets, N, C, V, dloss, work, wn,
                               rows);
            CHECK_CLOSE("fused head loss: losses", loss, to_double(loss_ref, N), N, 1e-6, 1e-6);
            CHECK_CLOSE("fused head loss: dx", dx, to_double(dx_ref, N * C), N * C, 1e-6, 1e-5);
            CHECK_CLOSE("fused head loss: dwte", dw, to_double(dw_ref, V * C), V * C, 1e-5, 1e-5);
            /* one block: the unfused products' bits (bf16: the gradient handed over as the
               bf16 bits the GEMM would round it to) */
            if (!rows && !blas &&
                (memcmp(dx, dx_ref, sizeof(float) * N * C) ||
                 memcmp(dw, dw_ref, sizeof(float) * V * C)))
                FAIL("fused head loss (%s): one block's dx or dwte not the unfused bits",
                     k ? "bf16" : "fp32");
            for (n = 0; n < N; n++)
                if (blas ? !(fabs(lse[n] - lse_ref[n]) <= 1e-6 * fabs(lse_ref[n]))
                         : lse[n] != lse_ref[n])
                    FAIL("fused head loss (%s): lse[%d] %.17g != %.17g", k ? "bf16" : "fp32", n,
                         lse[n], lse_ref[n]);
        }
        memset(loss, 0, sizeof(float) * N);
        pt_head_xent_fused(ctx, loss, lse, NULL, NULL, x, w, targets, N, C, V, dloss, work, wn,
                           R);
        CHECK_CLOSE("fused head loss: the loss alone", loss, to_double(loss_ref, N), N, 1e-6, 1e-6);
    }
    pt_ctx_free(&c16);
}

/* The executor's fused head and loss (one rank, training): the slots hold
   no whole logits (a block's buffer instead, the memory report alike); over
   several row blocks (N = 1200 > PT__HEAD_ROWS) a step whose losses come
   with its backward gives the bits of one that asks for the logits, whose
   cross-entropy is the step's losses bit for bit; a ZeRO 2 build (its head
   fused too, its backward bucket by bucket from the forward's lse: V = 251
   rows in buckets of 12 C = 96, the last short) keeps no
   logits either and gives the same losses, and gradients within the head's
   bucket-wise sum of dln and block-wise sum of dwte. */
/* Tests that compare the bits of GEMMs of different shapes (a row's result
   must not depend on how many rows its GEMM has) hold for ptrain's and the
   portable GEMMs, not OpenBLAS's, which blocks by M: under PTRAIN_GEMM=openblas
   they SKIP, saying so. */
static int bits_by_row(const char *what) {
    if (strcmp(pt_gemm_name(), "openblas")) return 1;
    SKIPPED("%s: compares bits that only a GEMM whose rows do not depend on M gives "
            "(PTRAIN_GEMM=openblas blocks by M)", what);
    return 0;
}

static void test_gpt_head_fused(void) {
    enum { V = 251, L = 1, NH = 2, C = 8, B = 4, T = 300, N = B * T };
    pt_gpt g, u;
    pt_gpt_desc d;
    pt_step_desc sd;
    float *la = TALLOC(float, N), *lb = TALLOC(float, N), *lu = TALLOC(float, N);
    float *logits = TALLOC(float, (size_t)N * V), *ga, *gu;
    double *lse = TALLOC(double, N);
    int *in = rand_ids(N, V), *tg = rand_ids(N, V);
    size_t P, whole = (size_t)N * V * sizeof(float), block = (size_t)PT__HEAD_ROWS * V * sizeof(float);
    if (!bits_by_row("the fused head against the unfused one")) return;
    CHECK_ST(gpt_new(&g, cfg_make(V, T, L, NH, C), B, T, 0), PT_OK);
    if (!g.params) return;
    P = g.num_params;
    CHECK(N > PT__HEAD_ROWS);
    CHECK(g.exec->head_work != NULL && g.exec->pipe.slots[0].logits == NULL);
    gpt_randomize(&g, 5, 0.3f);
    ZERO(sd);
    sd.inputs = in, sd.targets = tg, sd.B = B, sd.T = T, sd.losses = la;
    CHECK_ST(pt_gpt_step(&g, &sd, NULL), PT_OK); /* the losses from backward */
    ga = fcopy(g.grads, P);
    sd.losses = lb, sd.logits = logits;
    CHECK_ST(pt_gpt_step(&g, &sd, NULL), PT_OK); /* from forward, with the logits */
    CHECK(memcmp(la, lb, N * sizeof(float)) == 0);
    CHECK(memcmp(ga, g.grads, P * sizeof(float)) == 0);
    pt_crossentropy_forward(lu, lse, logits, tg, N, V);
    CHECK(memcmp(lu, la, N * sizeof(float)) == 0);
    ZERO(d);
    d.config = g.config, d.batch = B, d.seq = T, d.zero = 2;
    CHECK_ST(pt_gpt_init(&u, &d), PT_OK);
    if (!u.params) goto out;
    CHECK(u.exec->head_work != NULL && u.exec->pipe.slots[0].logits == NULL);
    /* (the slots' logits would be activations, the block's buffer is scratch) */
    if (u.mem.activations != g.mem.activations || u.mem.scratch < block)
        FAIL("fused head: activations %zu, scratch %zu; ZeRO 2 %zu, %zu (logits %zu, a block "
             "%zu bytes)", g.mem.activations, g.mem.scratch, u.mem.activations, u.mem.scratch,
             whole, block);
    memcpy(u.params, g.params, P * sizeof(float));
    sd.losses = lu, sd.logits = NULL;
    CHECK_ST(pt_gpt_step(&u, &sd, NULL), PT_OK);
    CHECK(memcmp(lu, la, N * sizeof(float)) == 0);
    gu = TALLOC(float, P);
    CHECK_ST(pt_gpt_gather(&u, PT_BUF_GRADS, gu), PT_OK);
    CHECK_CLOSE("fused head step: gradients against ZeRO 2's fused head's", ga, to_double(gu, P), P,
                1e-7, 1e-5);
    pt_gpt_free(&u);
out:
    pt_gpt_free(&g);
}

/* The whole model (encoder, blocks, ln_f, tied head, mean loss): gradients of
   pt_gpt_backward against finite differences of the mean loss, perturbing each
   float parameter by 1e-2; tolerance relative to the tensor's largest gradient. */
typedef struct gpt_run {
    pt_gpt *g;
    const int *inputs, *targets;
    int B, T;
    float *losses; /* (B*T) each token's loss */
} gpt_run;
static void fwd_gpt(void *p) {
    gpt_run *r = (gpt_run *)p;
    pt_step_desc d;
    float loss;
    pt_status s;
    memset(&d, 0, sizeof d);
    d.inputs = r->inputs, d.targets = r->targets, d.B = r->B, d.T = r->T, d.losses = r->losses;
    s = pt_gpt_eval(r->g, &d, &loss);
    if (s != PT_OK) FAIL("forward: %s", pt_last_error());
}

static void test_model_grad(void) {
    enum { V = 11, BS = 8, L = 2, NH = 2, C = 8, B = 2, T = 5, N = B * T };
    pt_gpt g;
    gpt_run r;
    float *grads, *R = TALLOC(float, N);
    int i, j;
    CHECK_ST(gpt_new(&g, cfg_make(V, BS, L, NH, C), B, T, 0), PT_OK);
    if (!g.params) return;
    gpt_randomize(&g, 7, 0.3f);
    r.g = &g, r.B = B, r.T = T, r.losses = TALLOC(float, N);
    r.inputs = rand_ids(N, V), r.targets = rand_ids(N, V);
    for (i = 0; i < N; i++) R[i] = 1.0f / N; /* L = mean loss */
    CHECK_ST(pt_gpt_forward(&g, r.inputs, r.targets, B, T), PT_OK);
    CHECK_ST(pt_gpt_backward(&g), PT_OK);
    grads = fcopy(g.grads, g.num_params);
    /* written, not accumulated: a second forward + backward gives the same */
    CHECK_ST(pt_gpt_forward(&g, r.inputs, r.targets, B, T), PT_OK);
    CHECK_ST(pt_gpt_backward(&g), PT_OK);
    CHECK(memcmp(grads, g.grads, g.num_params * sizeof(float)) == 0);
    /* wpe rows >= T are unused: exactly zero */
    for (j = T * C; j < BS * C; j++)
        if (grads[g.table[1].offset + (size_t)j] != 0.0f) {
            FAIL("dwpe[%d] = %g, expected exactly 0", j, (double)grads[g.table[1].offset + (size_t)j]);
            break;
        }
    for (i = 0; i < g.num_tensors; i++) { /* the model is tiny: every element */
        const pt_param *p = &g.table[i];
        const float *gt = grads + p->offset;
        double gmax = 0.0;
        size_t k;
        for (k = 0; k < p->numel; k++) gmax = fmax(gmax, fabs(gt[k]));
        fd_check_(__FILE__, __LINE__, p->name, fwd_gpt, &r, r.losses, R, N, g.params + p->offset,
                  gt, NULL, p->numel, 5e-3f, 2e-4 * gmax + 1e-6, 1e-2);
    }
    pt_gpt_free(&g);
}

/* GPT-2 init: N(0, 0.02), c_proj weights N(0, 0.02/sqrt(2L)), biases 0, LN
   weights 1, optimizer state cleared; the same seed gives the same weights. */
static void test_init_weights(void) {
    enum { L = 3 };
    pt_gpt g, h;
    int i;
    CHECK_ST(gpt_new(&g, cfg_make(64, 32, L, 2, 32), 1, 4, 0), PT_OK);
    CHECK_ST(gpt_new(&h, cfg_make(64, 32, L, 2, 32), 1, 4, 0), PT_OK);
    if (!g.params || !h.params) return;
    g.m[3] = 1.0f, g.v[5] = 2.0f, g.adam_t = 9;
    pt_gpt_init_weights(&g, 5);
    pt_gpt_init_weights(&h, 5);
    CHECK(memcmp(g.params, h.params, g.num_params * sizeof(float)) == 0);
    CHECK(g.m[3] == 0.0f && g.v[5] == 0.0f && g.adam_t == 0);
    pt_gpt_init_weights(&h, 6);
    CHECK(memcmp(g.params, h.params, g.num_params * sizeof(float)) != 0);
    for (i = 0; i < g.num_tensors; i++) {
        const pt_param *p = &g.table[i];
        const float *w = g.params + p->offset;
        size_t k, n = p->numel;
        if (p->ndim == 2) { /* every matrix has >= 1024 elements: std error ~2% */
            double want = strstr(p->name, "c_proj") ? 0.02 / sqrt(2.0 * L) : 0.02, m = 0, sq = 0;
            for (k = 0; k < n; k++) m += w[k], sq += (double)w[k] * w[k];
            m /= (double)n;
            if (fabs(m) > 5 * want / sqrt((double)n) || fabs(sqrt(sq / n - m * m) - want) > 0.12 * want)
                FAIL("%s: mean %.3g, std %.4g, expected N(0, %.4g)", p->name, m, sqrt(sq / n - m * m), want);
        } else {
            float want = strstr(p->name, "ln_") && strstr(p->name, ".weight") ? 1.0f : 0.0f;
            for (k = 0; k < n; k++)
                if (w[k] != want) {
                    FAIL("%s[%zu] = %g, expected %g", p->name, k, (double)w[k], (double)want);
                    break;
                }
        }
    }
    pt_gpt_free(&g);
    pt_gpt_free(&h);
}

/* With 1 and with 2 threads: a second run is bit-identical, and the two thread
   counts agree to rounding (catches races in the parallel reductions). */
static void test_threads_reproducible(void) {
    enum { V = 64, C = 64, B = 4, T = 16 };
    int saved = pt_get_threads(), *in = rand_ids(B * T, V), *tg = rand_ids(B * T, V), run;
    float *g1 = NULL;
    pt_gpt g;
    CHECK_ST(gpt_new(&g, cfg_make(V, T, 1, 4, C), B, T, 0), PT_OK);
    if (!g.params) return;
    gpt_randomize(&g, 21, 0.2f);
    for (run = 0; run < 4; run++) {
        pt_set_threads(run < 2 ? 1 : 2);
#ifdef _OPENMP
        CHECK_EQ(pt_get_threads(), run < 2 ? 1 : 2);
#endif
        CHECK_ST(pt_gpt_forward(&g, in, tg, B, T), PT_OK);
        CHECK_ST(pt_gpt_backward(&g), PT_OK);
        if (run == 0 || run == 2) {
            if (run == 2)
                CHECK_CLOSE("grads, 2 threads vs 1", g.grads, to_double(g1, g.num_params),
                            g.num_params, 1e-7, 1e-4);
            g1 = fcopy(g.grads, g.num_params);
        } else if (memcmp(g1, g.grads, g.num_params * sizeof(float)) != 0) {
            FAIL("two runs with %d thread(s) differ", run < 2 ? 1 : 2);
        }
    }
    pt_set_threads(saved);
    pt_gpt_free(&g);
}

/* ---- parallel layouts against the serial step ------------------------------ */

/* One layout: tp x dp x pp thread ranks, ZeRO stage, schedule, chunks, and
   micro-batches a step (grad_accum). */
typedef struct par_case {
    const char *name;
    int tp, dp, pp, zero, micro, chunks;
    pt_schedule_kind schedule;
    int sp; /* sequence parallelism */
} par_case;

typedef struct par_run {
    const par_case *c;
    pt_gpt_config cfg;
    const char *weights;         /* the serial model's weights (whole HF layout) */
    const int *in, *tg;          /* (B, T) */
    int B, T;
    size_t n;                    /* parameters of the whole model */
    float *grads;                /* (n) rank 0's gathered gradients */
    float loss;
} par_run;

/* A rank: its place in the grid, the serial weights, one pt_gpt_step on its
   dp slice of the batch (gradients only), the whole gradient gathered. */
static pt_status par_rank(pt_comm *world, void *arg) {
    par_run *r = (par_run *)arg;
    const par_case *c = r->c;
    int rows = r->B / c->dp;
    pt_grid g;
    pt_gpt m;
    pt_gpt_desc d;
    pt_step_desc sd;
    pt_step_result res;
    float *full = (float *)malloc(r->n * sizeof(float));
    pt_status st;
    memset(&m, 0, sizeof m);
    if (!full) return pt_comm_fail(world, pt_error(PT_ERR_OOM, "gradient buffer"));
    if ((st = pt_grid_init(&g, world, c->tp, c->dp, c->pp)) != PT_OK) {
        free(full);
        return pt_comm_fail(world, st);
    }
    memset(&d, 0, sizeof d);
    d.config = r->cfg, d.batch = rows / c->micro, d.seq = r->T, d.grid = &g, d.zero = c->zero;
    d.grad_accum = c->micro, d.schedule = c->schedule, d.chunks = c->chunks;
    d.sequence_parallel = c->sp;
    st = pt_gpt_init(&m, &d);
    if (st == PT_OK) st = pt_gpt_load_weights(&m, r->weights);
    memset(&sd, 0, sizeof sd);
    sd.inputs = r->in + (size_t)g.dp_rank * rows * r->T;
    sd.targets = r->tg + (size_t)g.dp_rank * rows * r->T;
    sd.B = rows, sd.T = r->T;
    if (st == PT_OK) st = pt_gpt_step(&m, &sd, &res);
    if (st == PT_OK) st = pt_gpt_gather(&m, PT_BUF_GRADS, full);
    if (st == PT_OK && world->rank == 0) memcpy(r->grads, full, r->n * sizeof(float)), r->loss = res.loss;
    if (m.params) pt_gpt_free(&m);
    pt_grid_free(&g);
    free(full);
    return st == PT_OK ? PT_OK : pt_comm_fail(world, st);
}

/* The serial step's gradients of rows [row, row + B) into out (whole layout). */
static float par_serial(pt_gpt_config cfg, const char *weights, const int *in, const int *tg, int B,
                        int T, float *out) {
    pt_gpt m;
    pt_step_desc sd;
    pt_step_result res;
    res.loss = -1;
    CHECK_ST(gpt_new(&m, cfg, B, T, 0), PT_OK);
    if (!m.params) return -1;
    CHECK_ST(pt_gpt_load_weights(&m, weights), PT_OK);
    memset(&sd, 0, sizeof sd);
    sd.inputs = in, sd.targets = tg, sd.B = B, sd.T = T;
    CHECK_ST(pt_gpt_step(&m, &sd, &res), PT_OK);
    CHECK_ST(pt_gpt_gather(&m, PT_BUF_GRADS, out), PT_OK);
    pt_gpt_free(&m);
    return res.loss;
}

/* Gradients of one pt_gpt_step in every parallel layout (tensor, data, ZeRO 1
   and 2, each pipeline schedule, and two composed) on thread ranks, against
   the serial step's, on a small random model (odd vocabulary: tp pads it).

   Tolerance. A layout computes the same sums as the serial step in other
   orders and groupings: dp and the micro-batches of a pipeline group the
   rows' gradients differently, tp adds the heads' and MLP columns' partial
   products across ranks (forward and backward all-reduces). Summing K terms
   in any order in float is within gamma_K sum|t| of the exact sum (gamma_K =
   K u / (1 - K u), u = 2^-24; Higham, Accuracy and Stability, 4.2), so two
   orders differ by at most about 2 K u sum|t|. Element i of the gradient is
   the mean of the rows' gradients, so its sum|t| is S_i = sum_b |g_b,i| / B,
   measured here from B one-row serial steps. A rounding inside a row's
   backward (a reduction over C, 4C, T or V terms, in each of L layers) is
   carried to the gradient at the size of that row's terms, so K is the
   length of the longest chain of reductions feeding an element:
   K = B + L (C + 4C + T) + V. The check is |g_i - g_serial_i| <= 2 K u S_i,
   with an absolute floor at 2 K u 1e-3 max S for elements whose rows cancel
   inside (LayerNorm's backward subtracts its mean). A real bug (a missing
   all-reduce, a micro-batch counted twice, a wrong 1/dp) is an error of
   the gradient's own size, K u ~ 3e-5 of it here. */
static void test_parallel_grads(void) {
    enum { V = 29, BLOCK = 8, L = 4, NH = 4, C = 16, B = 4, T = 8 };
    static const par_case cases[] = {
        {"tp 2", 2, 1, 1, 0, 1, 1, PT_SCHED_DEFAULT, 0},
        {"dp 2", 1, 2, 1, 0, 1, 1, PT_SCHED_DEFAULT, 0},
        {"dp 2, ZeRO 1", 1, 2, 1, 1, 1, 1, PT_SCHED_DEFAULT, 0},
        {"dp 2, ZeRO 2", 1, 2, 1, 2, 1, 1, PT_SCHED_DEFAULT, 0},
        {"dp 2, 2 micro-batches (gradient accumulation)", 1, 2, 1, 0, 2, 1, PT_SCHED_DEFAULT, 0},
        {"pp 2, gpipe, 4 micro-batches", 1, 1, 2, 0, 4, 1, PT_SCHED_GPIPE, 0},
        {"pp 2, 1f1b, 4 micro-batches", 1, 1, 2, 0, 4, 1, PT_SCHED_1F1B, 0},
        {"pp 2, interleaved (2 chunks), 2 micro-batches", 1, 1, 2, 0, 2, 2, PT_SCHED_INTERLEAVED, 0},
        {"pp 2, zb-h1, 4 micro-batches", 1, 1, 2, 0, 4, 1, PT_SCHED_ZB_H1, 0},
        {"tp 2 x dp 2, ZeRO 1", 2, 2, 1, 1, 1, 1, PT_SCHED_DEFAULT, 0},
        {"tp 2 x pp 2, 1f1b, 2 micro-batches", 2, 1, 2, 0, 2, 1, PT_SCHED_1F1B, 0},
        {"tp 2, sequence parallel", 2, 1, 1, 0, 1, 1, PT_SCHED_DEFAULT, 1},
        {"tp 4, sequence parallel", 4, 1, 1, 0, 1, 1, PT_SCHED_DEFAULT, 1},
        {"tp 2 sp x dp 2, ZeRO 2", 2, 2, 1, 2, 1, 1, PT_SCHED_DEFAULT, 1},
        {"tp 2 sp x pp 2, zb-h1, 2 micro-batches", 2, 1, 2, 0, 2, 1, PT_SCHED_ZB_H1, 1},
    };
    pt_gpt_config cfg = cfg_make(V, BLOCK, L, NH, C);
    int *in = rand_ids(B * T, V), *tg = rand_ids(B * T, V), b, k;
    const char *weights = tmp_path("par.safetensors");
    float *ref, *row, loss;
    double *S, smax = 0.0, K = B + (double)L * (C + 4 * C + T) + V, u = 0x1p-24;
    size_t n, i;
    pt_gpt m;
    pt_train_state ts;
    CHECK_ST(gpt_new(&m, cfg, B, T, 0), PT_OK);
    if (!m.params) return;
    gpt_randomize(&m, 7, 0.1f); /* non-trivial LayerNorms and biases */
    memset(&ts, 0, sizeof ts);
    CHECK_ST(pt_checkpoint_save(weights, &m, &ts), PT_OK);
    n = m.num_params_full;
    pt_gpt_free(&m);
    ref = TALLOC(float, n), row = TALLOC(float, n), S = TALLOC(double, n);
    loss = par_serial(cfg, weights, in, tg, B, T, ref);
    for (b = 0; b < B; b++) { /* S_i = sum_b |g_b,i| / B */
        par_serial(cfg, weights, in + b * T, tg + b * T, 1, T, row);
        for (i = 0; i < n; i++) S[i] += fabs((double)row[i]) / B;
    }
    if (g_fail) return;
    for (i = 0; i < n; i++) smax = S[i] > smax ? S[i] : smax;
    for (k = 0; k < (int)(sizeof cases / sizeof cases[0]); k++) {
        par_run r;
        double worst = 0.0;
        size_t wi = 0;
        memset(&r, 0, sizeof r);
        r.c = &cases[k], r.cfg = cfg, r.weights = weights, r.in = in, r.tg = tg, r.B = B, r.T = T;
        r.n = n, r.grads = TALLOC(float, n);
        if (pt_comm_threads_run(cases[k].tp * cases[k].dp * cases[k].pp, par_rank, &r) != PT_OK) {
            FAIL("%s: %s", cases[k].name, pt_last_error());
            continue;
        }
        for (i = 0; i < n; i++) { /* the worst element as a fraction of its tolerance */
            double q = fabs((double)r.grads[i] - ref[i]) / (2 * K * u * (S[i] + 1e-3 * smax));
            if (!(q <= worst)) worst = q == q ? q : INFINITY, wi = i;
        }
        if (g_verbose) printf("    %s: worst gradient element [%zu] at %.3g of its tolerance\n",
                              cases[k].name, wi, worst);
        if (worst > 1.0)
            FAIL("%s: gradient [%zu] = %.9g, serial %.9g (|err| %.3g > tol %.3g)", cases[k].name,
                 wi, (double)r.grads[wi], (double)ref[wi], fabs((double)r.grads[wi] - ref[wi]),
                 2 * K * u * (S[wi] + 1e-3 * smax));
        if (!(fabs(r.loss - loss) <= 2 * K * u * fabs(loss)))
            FAIL("%s: loss %.9g, serial %.9g", cases[k].name, r.loss, loss);
    }
}

/* Sequence parallelism computes tp's sums in tp's order: the reduce-scatters
   add the same partial products in rank order as the all-reduces they
   replace, and every row's norm, residual and gradient is the same
   arithmetic on fewer rows. So the loss and every gradient but the norms'
   weights and biases are bit for bit those of tp without it; the norms'
   (ln_1, ln_2, ln_f) sum their rows on each rank and then over the ranks,
   another order, within test_parallel_grads' tolerance (checked there). */
static void sp_exact_at(int B, int T) {
    enum { V = 29, L = 2, NH = 4, C = 16 };
    static const par_case cases[] = {
        {"tp 2", 2, 1, 1, 0, 1, 1, PT_SCHED_DEFAULT, 0},
        {"tp 2, sequence parallel", 2, 1, 1, 0, 1, 1, PT_SCHED_DEFAULT, 1},
    };
    pt_gpt_config cfg = cfg_make(V, T, L, NH, C);
    int *in = rand_ids(B * T, V), *tg = rand_ids(B * T, V), k, differ = 0, normdiff = 0;
    const char *weights = tmp_path("sp.safetensors");
    par_run r[2];
    size_t n, i;
    pt_gpt m;
    pt_train_state ts;
    CHECK_ST(gpt_new(&m, cfg, B, T, 0), PT_OK);
    if (!m.params) return;
    gpt_randomize(&m, 11, 0.1f);
    memset(&ts, 0, sizeof ts);
    CHECK_ST(pt_checkpoint_save(weights, &m, &ts), PT_OK);
    n = m.num_params_full;
    for (k = 0; k < 2; k++) {
        memset(&r[k], 0, sizeof r[k]);
        r[k].c = &cases[k], r[k].cfg = cfg, r[k].weights = weights, r[k].in = in, r[k].tg = tg;
        r[k].B = B, r[k].T = T, r[k].n = n, r[k].grads = TALLOC(float, n);
        if (pt_comm_threads_run(2, par_rank, &r[k]) != PT_OK) {
            FAIL("%s: %s", cases[k].name, pt_last_error());
            pt_gpt_free(&m);
            return;
        }
    }
    CHECK(memcmp(&r[0].loss, &r[1].loss, sizeof(float)) == 0);
    for (i = 0; i < (size_t)m.num_tensors; i++) { /* (one rank: the table is the whole's) */
        const pt_param *p = &m.table[i];
        int norm = strstr(p->name, "ln_") != NULL;
        if (memcmp(r[0].grads + p->full_offset, r[1].grads + p->full_offset,
                   p->full_numel * sizeof(float)) == 0)
            continue;
        if (norm) normdiff++;
        else differ++, FAIL("%s: sequence parallel gradient differs from tp 2's", p->name);
    }
    if (g_verbose) printf("    B=%d T=%d: %d norm tensors differ in their last bits, %d others\n",
                          B, T, normdiff, differ);
    pt_gpt_free(&m);
}

/* T = 8: every column-parallel matmul waits for its gather; T = 64 (a
   rank's 64 rows, a multiple of PT__SP_ROWS): this rank's rows first,
   behind the gather, then the others'. */
static void test_sp_exact(void) {
    if (!bits_by_row("sequence parallel against tp")) return;
    sp_exact_at(2, 8);
    sp_exact_at(2, 64);
}

/* tp 2's fused head (ZeRO 0: the vocabulary-parallel loss by blocks of
   PT__HEAD_ROWS rows) against ZeRO 2's (its backward bucket by bucket from
   the forward's lse: 126 rows a rank, the last padding, in buckets of 12 C /
   tp = 48) and ZeRO 3's (each block's logits through the gathered buckets,
   3 of them, gathered again for the second block): the losses and the
   gathered logits bit for bit, the gradients within the rounding of dln's
   bucket-wise and dwte's block-wise sums; none keeps logits (the same
   activations). */
typedef struct head_tp_run {
    pt_gpt_config cfg;
    const char *weights;
    const int *in, *tg;
    int B, T, zero, sp;
    size_t n;
    float *losses, *logits, *grads; /* rank 0's */
    size_t act;                     /* rank 0's activation bytes */
} head_tp_run;

static pt_status head_tp_rank(pt_comm *world, void *arg) {
    head_tp_run *r = (head_tp_run *)arg;
    int N = r->B * r->T;
    float *losses = (float *)malloc((size_t)N * sizeof(float));
    float *logits = (float *)malloc((size_t)N * r->cfg.vocab_size * sizeof(float));
    float *grads = (float *)malloc(r->n * sizeof(float));
    pt_grid g;
    pt_gpt m;
    pt_gpt_desc d;
    pt_step_desc sd;
    pt_status st;
    memset(&m, 0, sizeof m);
    if (!losses || !logits || !grads) st = pt_error(PT_ERR_OOM, "buffers");
    else st = pt_grid_init(&g, world, 2, 1, 1);
    if (st != PT_OK) {
        free(losses), free(logits), free(grads);
        return pt_comm_fail(world, st);
    }
    memset(&d, 0, sizeof d);
    d.config = r->cfg, d.batch = r->B, d.seq = r->T, d.grid = &g, d.zero = r->zero;
    d.sequence_parallel = r->sp;
    st = pt_gpt_init(&m, &d);
    if (st == PT_OK) st = pt_gpt_load_weights(&m, r->weights);
    if (st == PT_OK && (!m.exec->head_work || m.exec->pipe.slots[0].logits))
        st = pt_error(PT_ERR_CONFIG, "ZeRO %d: head_work %p", r->zero, (void *)m.exec->head_work);
    memset(&sd, 0, sizeof sd);
    sd.inputs = r->in, sd.targets = r->tg, sd.B = r->B, sd.T = r->T, sd.losses = losses;
    sd.logits = logits;
    if (st == PT_OK) st = pt_gpt_step(&m, &sd, NULL);
    if (st == PT_OK) st = pt_gpt_gather(&m, PT_BUF_GRADS, grads);
    if (st == PT_OK && world->rank == 0) {
        memcpy(r->losses, losses, (size_t)N * sizeof(float));
        memcpy(r->logits, logits, (size_t)N * r->cfg.vocab_size * sizeof(float));
        memcpy(r->grads, grads, r->n * sizeof(float));
        r->act = m.mem.activations;
    }
    if (m.params) pt_gpt_free(&m);
    pt_grid_free(&g);
    free(losses), free(logits), free(grads);
    return st == PT_OK ? PT_OK : pt_comm_fail(world, st);
}

static void test_head_fused_tp(void) {
    enum { V = 251, L = 1, NH = 2, C = 8, B = 4, T = 300, N = B * T };
    pt_gpt_config cfg = cfg_make(V, T, L, NH, C);
    const char *weights = tmp_path("head_tp.safetensors");
    head_tp_run r[4];
    pt_train_state ts;
    pt_gpt m;
    int *in = rand_ids(N, V), *tg = rand_ids(N, V), k;
    if (!bits_by_row("the fused head on tp 2 against ZeRO 2")) return;
    CHECK(N > PT__HEAD_ROWS);
    CHECK_ST(gpt_new(&m, cfg, B, T, 0), PT_OK);
    if (!m.params) return;
    gpt_randomize(&m, 7, 0.3f);
    memset(&ts, 0, sizeof ts);
    CHECK_ST(pt_checkpoint_save(weights, &m, &ts), PT_OK);
    for (k = 0; k < 4; k++) { /* ZeRO 0, ZeRO 2, ZeRO 0 sequence parallel, ZeRO 3 */
        memset(&r[k], 0, sizeof r[k]);
        r[k].cfg = cfg, r[k].weights = weights, r[k].in = in, r[k].tg = tg, r[k].B = B, r[k].T = T;
        r[k].zero = k == 1 ? 2 : k == 3 ? 3 : 0, r[k].sp = k == 2, r[k].n = m.num_params_full;
        r[k].losses = TALLOC(float, N), r[k].logits = TALLOC(float, (size_t)N * V);
        r[k].grads = TALLOC(float, r[k].n);
    }
    for (k = 0; k < 4; k++)
        if (pt_comm_threads_run(2, head_tp_rank, &r[k]) != PT_OK) {
            FAIL("run %d: %s", k, pt_last_error());
            pt_gpt_free(&m);
            return;
        }
    CHECK(memcmp(r[0].losses, r[1].losses, N * sizeof(float)) == 0);
    CHECK(memcmp(r[0].losses, r[2].losses, N * sizeof(float)) == 0);
    CHECK(memcmp(r[0].losses, r[3].losses, N * sizeof(float)) == 0);
    CHECK(memcmp(r[0].logits, r[1].logits, (size_t)N * V * sizeof(float)) == 0);
    CHECK(memcmp(r[0].logits, r[3].logits, (size_t)N * V * sizeof(float)) == 0);
    CHECK_CLOSE("tp 2 fused head: gradients against ZeRO 2's", r[0].grads,
                to_double(r[1].grads, r[0].n), r[0].n, 1e-7, 1e-5);
    CHECK_CLOSE("tp 2 fused head: gradients against ZeRO 3's", r[0].grads,
                to_double(r[3].grads, r[0].n), r[0].n, 1e-7, 1e-5);
    CHECK(r[1].act == r[0].act && r[3].act == r[0].act);
    pt_gpt_free(&m);
}

/* The fused head on a pipeline's last stage (pp 2 on thread ranks, 2
   micro-batches of 1200 rows: 2 blocks each), for each schedule that builds
   here: the stage holding the head keeps no logits (a block's buffer
   instead); a step whose losses come with each micro-batch's B gives the
   bits of one that asks for the logits (the losses from each F), whose
   cross-entropy is those losses bit for bit, and the same gradients bit
   for bit. */
typedef struct head_pp_run {
    pt_gpt_config cfg;
    pt_schedule_kind schedule;
    const int *in, *tg;
    int B, T;
    float *la, *lb, *logits; /* (rank holding the head) the two steps' losses, the logits */
    int nolog;               /* its slots' logits NULL, head_work set */
    int same_grads;          /* its two steps' gradients bit for bit */
} head_pp_run;

static pt_status head_pp_rank(pt_comm *world, void *arg) {
    head_pp_run *r = (head_pp_run *)arg;
    pt_grid g;
    pt_gpt m;
    pt_gpt_desc d;
    pt_step_desc sd;
    float *ga = NULL;
    pt_status st;
    memset(&m, 0, sizeof m);
    if ((st = pt_grid_init(&g, world, 1, 1, 2)) != PT_OK) return pt_comm_fail(world, st);
    memset(&d, 0, sizeof d);
    d.config = r->cfg, d.batch = r->B / 2, d.seq = r->T, d.grid = &g, d.grad_accum = 2;
    d.schedule = r->schedule, d.chunks = r->schedule == PT_SCHED_INTERLEAVED ? 2 : 1;
    st = pt_gpt_init(&m, &d);
    if (st == PT_OK) pt_gpt_init_weights(&m, 3);
    memset(&sd, 0, sizeof sd);
    sd.inputs = r->in, sd.targets = r->tg, sd.B = r->B, sd.T = r->T;
    sd.losses = m.place.has_head ? r->la : NULL;
    if (st == PT_OK) st = pt_gpt_step(&m, &sd, NULL); /* the losses from B */
    if (st == PT_OK && !(ga = (float *)malloc(m.num_params * sizeof(float)))) st = PT_ERR_OOM;
    if (st == PT_OK) memcpy(ga, m.grads, m.num_params * sizeof(float));
    sd.losses = m.place.has_head ? r->lb : NULL, sd.logits = m.place.has_head ? r->logits : NULL;
    if (st == PT_OK) st = pt_gpt_step(&m, &sd, NULL); /* from F, with the logits */
    if (st == PT_OK && m.place.has_head) {
        r->nolog = m.exec->head_work != NULL && m.exec->pipe.slots[0].logits == NULL;
        r->same_grads = memcmp(ga, m.grads, m.num_params * sizeof(float)) == 0;
    }
    free(ga);
    if (m.params) pt_gpt_free(&m);
    pt_grid_free(&g);
    return st == PT_OK ? PT_OK : pt_comm_fail(world, st);
}

static void test_head_fused_pp(void) {
    enum { V = 37, L = 4, NH = 2, C = 8, B = 4, T = 600, N = B * T };
    /* (Chimera's two heads write the losses of one buffer here, 2BW updates the weights
       inside its steps: the fixture families check them) */
    static const pt_schedule_kind kinds[] = {PT_SCHED_GPIPE, PT_SCHED_1F1B, PT_SCHED_ZB_H1,
                                             PT_SCHED_INTERLEAVED};
    int *in = rand_ids(N, V), *tg = rand_ids(N, V), k;
    float *lu = TALLOC(float, N);
    double *lse = TALLOC(double, N);
    if (!bits_by_row("the fused head on a pipeline")) return;
    CHECK(N / 2 > PT__HEAD_ROWS);
    for (k = 0; k < (int)(sizeof kinds / sizeof kinds[0]); k++) {
        head_pp_run r;
        memset(&r, 0, sizeof r);
        r.cfg = cfg_make(V, T, L, NH, C), r.schedule = kinds[k], r.in = in, r.tg = tg;
        r.B = B, r.T = T;
        r.la = TALLOC(float, N), r.lb = TALLOC(float, N), r.logits = TALLOC(float, (size_t)N * V);
        if (pt_comm_threads_run(2, head_pp_rank, &r) != PT_OK) {
            FAIL("%s: %s", pt_schedule_kind_name(kinds[k]), pt_last_error());
            continue;
        }
        if (!r.nolog) FAIL("%s: the head's stage keeps whole logits", pt_schedule_kind_name(kinds[k]));
        if (!r.same_grads)
            FAIL("%s: the gradients differ with the losses from B", pt_schedule_kind_name(kinds[k]));
        if (memcmp(r.la, r.lb, N * sizeof(float)) != 0)
            FAIL("%s: the losses from B differ from those of F", pt_schedule_kind_name(kinds[k]));
        pt_crossentropy_forward(lu, lse, r.logits, tg, N, V);
        if (memcmp(lu, r.lb, N * sizeof(float)) != 0)
            FAIL("%s: the logits' cross-entropy differs from the losses", pt_schedule_kind_name(kinds[k]));
    }
}

/* A tp 2 sequence-parallel rank: a step whose T (7) does not split is
   refused before any communication, naming T and tp; T = 6 runs. */
static pt_status sp_step_rank(pt_comm *world, void *arg) {
    const pt_gpt_config *cfg = (const pt_gpt_config *)arg;
    int in[2 * 8] = {0}, tg[2 * 8] = {0};
    pt_grid g;
    pt_gpt m;
    pt_gpt_desc d;
    pt_step_desc sd;
    pt_status st, bad;
    if ((st = pt_grid_init(&g, world, 2, 1, 1)) != PT_OK) return pt_comm_fail(world, st);
    ZERO(d), ZERO(m);
    d.config = *cfg, d.batch = 2, d.seq = 8, d.grid = &g, d.sequence_parallel = 1;
    if ((st = pt_gpt_init(&m, &d)) != PT_OK) {
        pt_grid_free(&g);
        return pt_comm_fail(world, st);
    }
    ZERO(sd);
    sd.inputs = in, sd.targets = tg, sd.B = 2, sd.T = 7;
    bad = pt_gpt_step(&m, &sd, NULL);
    if (bad == PT_ERR_CONFIG && !strstr(pt_last_error(), "sequence_parallel: T=7 is not a multiple of tp=2"))
        bad = PT_OK; /* (the wrong message: reported below as a failure) */
    sd.T = 6;
    st = pt_gpt_step(&m, &sd, NULL);
    pt_gpt_free(&m);
    pt_grid_free(&g);
    if (st != PT_OK) return pt_comm_fail(world, st);
    return bad == PT_ERR_CONFIG ? PT_OK : pt_comm_fail(world, pt_error(PT_ERR_RANGE, "T=7 ran"));
}

/* Sequence parallelism is refused without tp >= 2 and with a seq (or a
   step's T) that tp does not divide, naming the field and the values. */
static void test_sp_refusals(void) {
    pt_gpt_config cfg = cfg_make(29, 8, 2, 4, 16);
    pt_grid grid;
    pt_gpt_desc d;
    pt_gpt g;
    ZERO(grid), ZERO(d);
    grid.tp = 1, grid.dp = 2, grid.pp = 1; /* meta builds of the grid's sizes */
    d.config = cfg, d.grid = &grid, d.batch = 1, d.seq = 8, d.meta = 1, d.sequence_parallel = 1;
    CHECK_ERR(pt_gpt_init(&g, &d), PT_ERR_CONFIG,
              "sequence_parallel=1 needs tensor parallelism (tp=1;");
    grid.tp = 2, grid.dp = 1, d.seq = 7;
    CHECK_ERR(pt_gpt_init(&g, &d), PT_ERR_CONFIG,
              "sequence_parallel=1: seq=7 is not a multiple of tp=2");
    d.seq = 8, d.sequence_parallel = 2;
    CHECK_ERR(pt_gpt_init(&g, &d), PT_ERR_CONFIG, "sequence_parallel=2 must be 0 (off) or 1");
    d.sequence_parallel = 1;
    CHECK_ST(pt_gpt_init(&g, &d), PT_OK);
    pt_gpt_free(&g);
    if (pt_comm_threads_run(2, sp_step_rank, &cfg) != PT_OK) FAIL("%s", pt_last_error());
}

/* A cp 2 rank (context parallelism): a step whose T (6) 2cp does not divide
   is refused before any communication, naming T and cp, and so are per-token
   logits; T = 8 runs (three steps, an evaluation, forward/backward/AdamW)
   and, after a first step, the model allocates nothing (its context's count;
   the ring's messages in the threads backend's inbox may grow their pool when
   more are in flight than before: a matter of timing). */
static pt_status cp_step_rank(pt_comm *world, void *arg) {
    const pt_gpt_config *cfg = (const pt_gpt_config *)arg;
    static int in[2][2 * 8], tg[2][2 * 8];
    float logits[2 * 8 * 29], loss;
    pt_adamw_config opt = pt_adamw_default();
    pt_grid g;
    pt_gpt m;
    pt_gpt_desc d;
    pt_step_desc sd;
    pt_status st, bad, bad2;
    size_t before;
    int i, *mine = in[world->rank], *tgm = tg[world->rank];
    if ((st = pt_grid_init_cp(&g, world, 1, 2, 1, 1)) != PT_OK) return pt_comm_fail(world, st);
    ZERO(d), ZERO(m);
    d.config = *cfg, d.batch = 2, d.seq = 8, d.grid = &g, d.context_parallel = 2;
    d.alloc_ctx = &g_alloc_mark;
    before = g_alloc_marked;
    if ((st = pt_gpt_init(&m, &d)) != PT_OK) {
        pt_grid_free(&g);
        return pt_comm_fail(world, st);
    }
    if (g_alloc_marked == before) /* the count below would see nothing */
        st = pt_error(PT_ERR_RANGE, "pt_gpt_init allocated nothing in its alloc_ctx");
    for (i = 0; i < 2 * 8; i++) mine[i] = i % 13, tgm[i] = (5 * i + 2) % 13;
    ZERO(sd);
    sd.inputs = mine, sd.targets = tgm, sd.B = 2, sd.T = 6;
    bad = pt_gpt_step(&m, &sd, NULL);
    if (bad == PT_ERR_CONFIG &&
        !strstr(pt_last_error(), "context_parallel=2: T=6 is not a multiple of 2*cp=4"))
        bad = PT_OK; /* (the wrong message: reported below as a failure) */
    sd.T = 8, sd.logits = logits;
    bad2 = pt_gpt_step(&m, &sd, NULL);
    if (bad2 == PT_ERR_CONFIG && !strstr(pt_last_error(), "logits and losses per token"))
        bad2 = PT_OK;
    sd.logits = NULL, sd.adamw = &opt, sd.lr = 1e-3f;
    /* (first steps: the threads backend's buffered sends fill their pool of
       messages, which later sends reuse; how many are in flight at once
       depends on timing, and the pool doubles when it runs out) */
    for (i = 0; i < 3 && st == PT_OK; i++) st = pt_gpt_step(&m, &sd, NULL);
    if (st == PT_OK) st = pt_comm_barrier(world);
    before = g_alloc_marked;
    for (i = 0; i < 3 && st == PT_OK; i++) st = pt_gpt_step(&m, &sd, NULL);
    if (st == PT_OK) st = pt_gpt_eval(&m, &sd, &loss);
    if (st == PT_OK) st = pt_gpt_forward(&m, sd.inputs, sd.targets, 2, 8);
    if (st == PT_OK) st = pt_gpt_backward(&m);
    if (st == PT_OK) st = pt_gpt_adamw_step(&m, &opt, 1e-3f);
    if (st == PT_OK) st = pt_comm_barrier(world);
    if (st == PT_OK && g_alloc_marked != before)
        st = pt_error(PT_ERR_RANGE, "%zu allocations during the cp steps", g_alloc_marked - before);
    pt_gpt_free(&m);
    pt_grid_free(&g);
    if (st != PT_OK) return pt_comm_fail(world, st);
    if (bad != PT_ERR_CONFIG) return pt_comm_fail(world, pt_error(PT_ERR_RANGE, "T=6 ran"));
    return bad2 == PT_ERR_CONFIG ? PT_OK
                                 : pt_comm_fail(world, pt_error(PT_ERR_RANGE, "logits ran"));
}

/* Context parallelism is refused with a cp the grid does not have, and with
   a seq that 2cp does not divide, naming the values. */
static void test_cp_refusals(void) {
    pt_gpt_config cfg = cfg_make(29, 8, 2, 4, 16);
    pt_grid grid;
    pt_gpt_desc d;
    pt_gpt g;
    ZERO(grid), ZERO(d);
    grid.tp = 1, grid.dp = 2, grid.pp = 1; /* meta builds of the grid's sizes */
    d.config = cfg, d.grid = &grid, d.batch = 1, d.seq = 8, d.meta = 1, d.context_parallel = 2;
    CHECK_ERR(pt_gpt_init(&g, &d), PT_ERR_CONFIG, "context_parallel=2 but the grid has cp=1");
    grid.cp = 2, d.seq = 6;
    CHECK_ERR(pt_gpt_init(&g, &d), PT_ERR_CONFIG,
              "context_parallel=2: seq=6 is not a multiple of 2*cp=4");
    d.seq = 8, d.context_parallel = -1;
    CHECK_ERR(pt_gpt_init(&g, &d), PT_ERR_CONFIG, "context_parallel=-1 must be >= 0");
    d.context_parallel = 2;
    CHECK_ST(pt_gpt_init(&g, &d), PT_OK);
    CHECK(g.T == 4 && g.place.cp == 2 && g.place.dp == 4);
    pt_gpt_free(&g);
    if (pt_comm_threads_run(2, cp_step_rank, &cfg) != PT_OK) FAIL("%s", pt_last_error());
}

/* ---- steps allocate nothing ------------------------------------------------
   The header's promise: nothing allocates inside forward, backward or the
   optimizer step. Every allocation ptrain makes goes through PTRAIN_MALLOC,
   counted above (g_alloc_calls); from a built model's first call on there
   must be none: three pt_gpt_step with AdamW and clipping, an evaluation,
   and the forward, backward, AdamW trio, in fp32 and bf16, on one rank (also
   with two micro-batches and selective recomputation) and on thread ranks
   (tp 2 x dp 2, ZeRO 1, the reductions overlapped; the threads
   communicator's collectives allocate nothing either). A rank that
   allocates sees its own count move between the barriers around its steps. */
typedef struct noalloc_run {
    pt_gpt_config cfg;
    pt_precision prec;
    int tp, dp, zero, micro, recompute, sp;
    size_t allocs[4]; /* per rank: allocations during its calls */
} noalloc_run;

enum { NOALLOC_B = 4, NOALLOC_T = 8 };

/* The calls whose allocations count, on a built model (grid NULL: one rank). */
static pt_status noalloc_calls(pt_gpt *m, const noalloc_run *r, int dp_rank) {
    static int in[NOALLOC_B * NOALLOC_T], tg[NOALLOC_B * NOALLOC_T];
    int rows = NOALLOC_B / r->dp, i;
    pt_adamw_config opt = pt_adamw_default();
    pt_step_desc sd;
    pt_status st = PT_OK;
    float loss;
    for (i = 0; i < NOALLOC_B * NOALLOC_T; i++) in[i] = i % 11, tg[i] = (3 * i + 1) % 11;
    ZERO(sd);
    sd.inputs = in + (size_t)dp_rank * rows * NOALLOC_T;
    sd.targets = tg + (size_t)dp_rank * rows * NOALLOC_T;
    sd.B = rows, sd.T = NOALLOC_T, sd.adamw = &opt, sd.lr = 1e-3f, sd.clip = 0.5f;
    for (i = 0; i < 3 && st == PT_OK; i++) st = pt_gpt_step(m, &sd, NULL);
    if (st == PT_OK) st = pt_gpt_eval(m, &sd, &loss);
    if (st == PT_OK && r->micro == 1) { /* the three calls a step is made of */
        st = pt_gpt_forward(m, sd.inputs, sd.targets, rows, NOALLOC_T);
        if (st == PT_OK) st = pt_gpt_backward(m);
        if (st == PT_OK) st = pt_gpt_adamw_step(m, &opt, 1e-3f);
    }
    return st;
}

static pt_status noalloc_rank(pt_comm *world, void *arg) {
    noalloc_run *r = (noalloc_run *)arg;
    pt_grid g;
    pt_gpt m;
    pt_gpt_desc d;
    size_t before;
    pt_status st;
    memset(&m, 0, sizeof m);
    if ((st = pt_grid_init(&g, world, r->tp, r->dp, 1)) != PT_OK) return pt_comm_fail(world, st);
    ZERO(d);
    d.config = r->cfg, d.batch = NOALLOC_B / r->dp / r->micro, d.seq = NOALLOC_T;
    d.grid = world->size > 1 ? &g : NULL, d.zero = r->zero, d.precision = r->prec;
    d.grad_accum = r->micro, d.recompute = r->recompute, d.sequence_parallel = r->sp;
    st = pt_gpt_init(&m, &d);
    if (st == PT_OK) pt_gpt_init_weights(&m, 5);
    if (st == PT_OK) st = pt_comm_barrier(world);
    before = g_alloc_calls;
    if (st == PT_OK) st = noalloc_calls(&m, r, g.dp_rank);
    if (st == PT_OK) st = pt_comm_barrier(world);
    r->allocs[world->rank] = g_alloc_calls - before;
    if (m.params) pt_gpt_free(&m);
    pt_grid_free(&g);
    return st == PT_OK ? PT_OK : pt_comm_fail(world, st);
}

static void test_steps_allocate_nothing(void) {
    static const int lay[7][6] = {{1, 1, 0, 1, 0, 0}, {1, 1, 0, 2, PT_RECOMPUTE_SELECTIVE, 0},
                                  {2, 2, 1, 1, 0, 0}, {2, 2, 2, 2, PT_RECOMPUTE_SELECTIVE, 1},
                                  {1, 2, 3, 2, PT_RECOMPUTE_FULL, 0}, {2, 2, 3, 1, 0, 0},
                                  {2, 2, 3, 1, PT_RECOMPUTE_SELECTIVE, 1}};
    /* tp, dp, zero, micro, recompute, sequence parallel */
    int k, p, i;
    for (k = 0; k < 7; k++)
        for (p = 0; p < 2; p++) {
            noalloc_run r;
            int n = lay[k][0] * lay[k][1];
            ZERO(r);
            r.cfg = cfg_make(11, NOALLOC_T, 2, 4, 16);
            r.prec = p ? PT_PRECISION_BF16 : PT_PRECISION_FP32;
            r.tp = lay[k][0], r.dp = lay[k][1], r.zero = lay[k][2], r.micro = lay[k][3];
            r.recompute = lay[k][4], r.sp = lay[k][5];
            CHECK_ST(pt_comm_threads_run(n, noalloc_rank, &r), PT_OK);
            for (i = 0; i < n; i++)
                if (r.allocs[i])
                    FAIL("%s, tp %d x dp %d, ZeRO %d, %d micro-batches: %zu allocations "
                         "during rank %d's calls", pt_precision_name(r.prec), r.tp, r.dp, r.zero,
                         r.micro, r.allocs[i], i);
        }
}

/* ZeRO 3 against ZeRO 1 on dp 2 thread ranks: a rank holds 1/dp of the
   parameters and gathers each bucket before use. The first step's loss is
   ZeRO 1's bit for bit; later ones differ only where the head's input
   gradient sums the vocabulary bucket by bucket (not the whole GEMM's
   order); with the gathers prefetched (overlap on) or not, bit for bit;
   and so in 2 micro-batches with positions wpe has beyond T (overlap on:
   the embedding's wte rows and wpe gathered and reduced compact, the rows
   the tokens read and the positions T covers). */
typedef struct z3_run {
    int zero, overlap, recompute, micro, block; /* (0: 1 micro-batch, block T) */
    float loss[3], norm[3];
    float *final; /* (num_params_full) the gathered parameters, rank 0 */
} z3_run;

static pt_status z3_rank(pt_comm *world, void *arg) {
    z3_run *r = (z3_run *)arg;
    static int in[NOALLOC_B * NOALLOC_T], tg[NOALLOC_B * NOALLOC_T];
    pt_grid g;
    pt_gpt m;
    pt_gpt_desc d;
    pt_step_desc sd;
    pt_step_result res;
    pt_adamw_config opt = pt_adamw_default();
    float *full = NULL;
    int i, rows = NOALLOC_B / 2;
    pt_status st;
    memset(&m, 0, sizeof m);
    if ((st = pt_grid_init(&g, world, 1, 2, 1)) != PT_OK) return pt_comm_fail(world, st);
    for (i = 0; i < NOALLOC_B * NOALLOC_T; i++) in[i] = (53 * i) % 401, tg[i] = (97 * i + 1) % 401;
    ZERO(d);
    d.config = cfg_make(401, r->block ? r->block : NOALLOC_T, 3, 4, 16); /* wte: 401 rows, 3
                                                                          buckets of 192 or fewer */
    d.batch = rows / (r->micro ? r->micro : 1), d.grad_accum = r->micro;
    d.seq = NOALLOC_T, d.grid = &g, d.zero = r->zero, d.recompute = r->recompute;
    st = pt_gpt_init(&m, &d);
    if (st == PT_OK) pt_gpt_init_weights(&m, 7);
    ZERO(sd);
    sd.inputs = in + (size_t)g.dp_rank * rows * NOALLOC_T;
    sd.targets = tg + (size_t)g.dp_rank * rows * NOALLOC_T;
    sd.B = rows, sd.T = NOALLOC_T, sd.adamw = &opt, sd.lr = 1e-2f, sd.clip = 1.0f;
    sd.overlap = r->overlap ? PT_OVERLAP_ON : PT_OVERLAP_OFF;
    for (i = 0; i < 3 && st == PT_OK; i++) {
        ZERO(res);
        st = pt_gpt_step(&m, &sd, &res);
        r->loss[i] = m.loss, r->norm[i] = res.grad_norm;
    }
    if (st == PT_OK && !(full = (float *)malloc(m.num_params_full * sizeof(float))))
        st = PT_ERR_OOM;
    if (st == PT_OK) st = pt_gpt_gather(&m, PT_BUF_PARAMS, full);
    if (world->rank == 0) r->final = full;
    else free(full);
    if (m.params) pt_gpt_free(&m);
    pt_grid_free(&g);
    return st == PT_OK ? PT_OK : pt_comm_fail(world, st);
}

static void test_zero3_matches_zero1(void) {
    z3_run a, b, c, e[2];
    size_t n = 0, i;
    double worst = 0.0;
    pt_gpt_config cfg = cfg_make(401, NOALLOC_T, 3, 4, 16), ce = cfg_make(401, 3 * NOALLOC_T, 3, 4, 16);
    int k;
    ZERO(a), ZERO(b), ZERO(c), ZERO(e);
    a.zero = 1, a.overlap = 1;
    b.zero = 3, b.overlap = 1;
    c.zero = 3, c.overlap = 0, c.recompute = PT_RECOMPUTE_FULL;
    CHECK_ST(pt_comm_threads_run(2, z3_rank, &a), PT_OK);
    CHECK_ST(pt_comm_threads_run(2, z3_rank, &b), PT_OK);
    CHECK_ST(pt_comm_threads_run(2, z3_rank, &c), PT_OK);
    for (k = 0; k < 2; k++) { /* 2 micro-batches, wpe longer than T: on (0) and off (1) */
        e[k].zero = 3, e[k].overlap = !k, e[k].micro = 2, e[k].block = 3 * NOALLOC_T;
        CHECK_ST(pt_comm_threads_run(2, z3_rank, &e[k]), PT_OK);
    }
    if (e[0].final && e[1].final) {
        CHECK(memcmp(e[0].loss, e[1].loss, sizeof e[0].loss) == 0);
        CHECK(memcmp(e[0].final, e[1].final, (size_t)pt_gpt_num_params(&ce) * sizeof(float)) == 0);
    }
    free(e[0].final), free(e[1].final);
    if (!a.final || !b.final || !c.final) goto out;
    n = (size_t)pt_gpt_num_params(&cfg);
    CHECK(memcmp(&a.loss[0], &b.loss[0], sizeof(float)) == 0); /* the same forward */
    for (i = 0; i < 3; i++) {
        CHECK(fabs(a.loss[i] - b.loss[i]) <= 1e-5 * fabs(a.loss[i]));
        CHECK(fabs(a.norm[i] - b.norm[i]) <= 1e-4 * fabs(a.norm[i]));
    }
    for (i = 0; i < n; i++)
        if (fabs(a.final[i] - b.final[i]) > worst) worst = fabs(a.final[i] - b.final[i]);
    if (worst > 1e-5) FAIL("ZeRO 3's parameters after 3 steps differ from ZeRO 1's by %g", worst);
    /* prefetched or not, with the layers recomputed from their inputs: the same numbers */
    CHECK(memcmp(b.loss, c.loss, sizeof b.loss) == 0);
    CHECK(memcmp(b.final, c.final, n * sizeof(float)) == 0);
out:
    free(a.final), free(b.final), free(c.final);
}

/* ======================================================================== */
/* optimizer, norms, schedule, RNG                                           */
/* ======================================================================== */

/* The fixtures README 3.3 in double: decay first, eps after the bias correction. */
static void adamw_ref(double *p, const double *g, double *m, double *v, int n, double lr,
                      double b1, double b2, double eps, double wd, int t, int decay) {
    double bc1 = 1.0 - pow(b1, t), bc2 = 1.0 - pow(b2, t);
    int i;
    for (i = 0; i < n; i++) {
        if (decay) p[i] *= 1.0 - lr * wd;
        m[i] = b1 * m[i] + (1.0 - b1) * g[i];
        v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
        p[i] -= (lr / bc1) * m[i] / (sqrt(v[i]) / sqrt(bc2) + eps);
    }
}

static void test_adamw(void) {
    enum { n = 32, steps = 5 };
    /* a large lr*wd exposes the decay order; a large eps exposes its placement */
    struct { float b1, b2, eps, wd, lr; int decay; } cases[3] = {
        {0.9f, 0.95f, 1e-8f, 0.5f, 0.05f, 1},
        {0.8f, 0.999f, 1e-2f, 0.1f, 0.02f, 1},
        {0.9f, 0.95f, 1e-3f, 0.5f, 0.05f, 0},
    };
    int c, s, i;
    for (c = 0; c < 3; c++) {
        pt_adamw_config cfg;
        float *p = frand(n, -1, 1), *m = TALLOC(float, n), *v = TALLOC(float, n);
        float *g = TALLOC(float, n);
        double *rp = to_double(p, n), *rm = TALLOC(double, n), *rv = TALLOC(double, n);
        double *rg = TALLOC(double, n);
        char what[64];
        ZERO(cfg);
        cfg.beta1 = cases[c].b1, cfg.beta2 = cases[c].b2, cfg.eps = cases[c].eps;
        cfg.weight_decay = cases[c].wd;
        for (s = 1; s <= steps; s++) {
            for (i = 0; i < n; i++) { /* magnitudes from 1e-4 to 1, some exactly 0 */
                g[i] = i % 7 == 0 ? 0.0f : (float)((2.0 * urand() - 1.0) * pow(10.0, -4.0 * urand()));
                rg[i] = g[i];
            }
            pt_adamw_update(p, g, m, v, n, &cfg, cases[c].lr, s, cases[c].decay);
            adamw_ref(rp, rg, rm, rv, n, cases[c].lr, cases[c].b1, cases[c].b2, cases[c].eps,
                      cases[c].wd, s, cases[c].decay);
        }
        snprintf(what, sizeof what, "adamw case %d params", c);
        CHECK_CLOSE(what, p, rp, n, 2e-6, 1e-5);
        snprintf(what, sizeof what, "adamw case %d m", c);
        CHECK_CLOSE(what, m, rm, n, 1e-9, 1e-5);
        snprintf(what, sizeof what, "adamw case %d v", c);
        CHECK_CLOSE(what, v, rv, n, 1e-12, 1e-5);
    }
    { /* g == 0 everywhere: no NaN; decay alone shrinks p, without decay p stays */
        pt_adamw_config cfg = pt_adamw_default();
        float p[4] = {1.0f, -2.0f, 0.5f, 0.0f}, q[4], g[4] = {0}, m[4] = {0}, v[4] = {0};
        float m2[4] = {0}, v2[4] = {0};
        memcpy(q, p, sizeof p);
        for (s = 1; s <= 3; s++) {
            pt_adamw_update(p, g, m, v, 4, &cfg, 0.1f, s, 1);
            pt_adamw_update(q, g, m2, v2, 4, &cfg, 0.1f, s, 0);
        }
        for (i = 0; i < 4; i++) {
            double want = (i == 0 ? 1.0 : i == 1 ? -2.0 : i == 2 ? 0.5 : 0.0) * pow(1.0 - 0.1 * 0.1, 3);
            CHECK(p[i] == p[i] && q[i] == q[i]);
            CHECK_NEAR(p[i], want, 1e-6);
            CHECK_NEAR(q[i], i == 0 ? 1.0 : i == 1 ? -2.0 : i == 2 ? 0.5 : 0.0, 0);
            CHECK(m[i] == 0.0f && v[i] == 0.0f);
        }
    }
}

/* The model's step decays exactly the tensors with ndim >= 2 (zero gradients
   isolate the decay). */
static void test_adamw_step_decay_rule(void) {
    pt_gpt g;
    pt_adamw_config cfg = pt_adamw_default();
    float *before;
    int i;
    CHECK_ST(gpt_new(&g, cfg_make(7, 4, 1, 2, 4), 1, 4, 0), PT_OK);
    if (!g.params) return;
    gpt_randomize(&g, 3, 0.5f);
    before = fcopy(g.params, g.num_params);
    memset(g.grads, 0, g.num_params * sizeof(float));
    pt_gpt_adamw_step(&g, &cfg, 0.5f);
    CHECK_EQ(g.adam_t, 1);
    for (i = 0; i < g.num_tensors; i++) {
        const pt_param *p = &g.table[i];
        const char *nm = p->name;
        int want_decay = strstr(nm, "wte") || strstr(nm, "wpe") ||
                         (strstr(nm, ".weight") && !strstr(nm, "ln_")); /* README 3.3 list */
        double keep = want_decay ? 1.0 - 0.5 * 0.1 : 1.0;
        size_t k;
        CHECK_EQ(p->decay, want_decay);
        for (k = 0; k < p->numel; k++)
            if (fabs(g.params[p->offset + k] - keep * before[p->offset + k]) > 1e-6) {
                FAIL("%s[%zu]: %g, expected %g", nm, k, (double)g.params[p->offset + k],
                     keep * before[p->offset + k]);
                break;
            }
    }
    pt_gpt_free(&g);
}

/* The model's AdamW runs all tensors' chunks in one dynamic loop; each
   element must get its own tensor's update, whatever order the runtime
   hands chunks out in (libomp's dynamic is nonmonotonic: a thread may get
   an earlier chunk after a later one). Tensors of 1 element to several
   chunks, decay mixed, 8 threads on 2 cores: the same bits as one
   pt_adamw_update a tensor. */
static void test_adamw_tensors_one_loop(void) {
    enum { nt = 41, steps = 3 };
    pt_param table[nt];
    pt_adamw_config cfg = pt_adamw_default();
    size_t total = 0, k;
    float *p, *g, *m, *v, *rp, *rm, *rv;
    int i, s;
#ifdef _OPENMP
    int saved = omp_get_max_threads();
#endif
    memset(table, 0, sizeof table);
    for (i = 0; i < nt; i++) { /* sizes across chunk edges: 1, 16383, 16384, 16385, ... */
        static const size_t sz[6] = {1, 16383, 16384, 16385, 40000, 777};
        table[i].offset = total, table[i].numel = sz[i % 6] + (size_t)(i / 6) * 3;
        table[i].decay = i % 3 != 0;
        total += table[i].numel;
    }
    p = frand(total, -1, 1), g = TALLOC(float, total), m = TALLOC(float, total);
    v = TALLOC(float, total), rp = fcopy(p, total), rm = TALLOC(float, total);
    rv = TALLOC(float, total);
    cfg.weight_decay = 0.3f;
#ifdef _OPENMP
    omp_set_num_threads(8);
#endif
    for (s = 1; s <= steps; s++) {
        for (k = 0; k < total; k++) g[k] = (float)(2.0 * urand() - 1.0);
        pt__adamw_tensors(table, nt, p, g, m, v, &cfg, 0.01f, s);
        for (i = 0; i < nt; i++) {
            size_t o = table[i].offset;
            pt_adamw_update(rp + o, g + o, rm + o, rv + o, table[i].numel, &cfg, 0.01f, s,
                            table[i].decay);
        }
    }
#ifdef _OPENMP
    omp_set_num_threads(saved);
#endif
    CHECK(memcmp(p, rp, total * sizeof(float)) == 0);
    CHECK(memcmp(m, rm, total * sizeof(float)) == 0);
    CHECK(memcmp(v, rv, total * sizeof(float)) == 0);
}

static void test_norm_and_clip(void) {
    size_t sizes[3] = {0, 5, 1300001}, i, s;
    pt_gpt g;
    float *before, norm;
    double naive;
    for (s = 0; s < 3; s++) {
        float *x = frand(sizes[s], -1, 1);
        naive = 0.0;
        for (i = 0; i < sizes[s]; i++) naive += (double)x[i] * x[i];
        CHECK_NEAR(pt_norm2(x, sizes[s]), sqrt(naive), 1e-12 * sqrt(naive));
    }
    CHECK_ST(gpt_new(&g, cfg_make(9, 4, 1, 2, 4), 1, 4, 0), PT_OK);
    if (!g.params) return;
    for (i = 0; i < g.num_params; i++) g.grads[i] = (float)(2.0 * urand() - 1.0);
    before = fcopy(g.grads, g.num_params);
    naive = 0.0;
    for (i = 0; i < g.num_params; i++) naive += (double)before[i] * before[i];
    naive = sqrt(naive);
    CHECK_ST(pt_gpt_clip_grad_norm(&g, 2.0f * (float)naive, &norm), PT_OK); /* below the limit */
    CHECK_NEAR(norm, naive, 1e-6 * naive);
    CHECK(memcmp(before, g.grads, g.num_params * sizeof(float)) == 0); /* untouched */
    CHECK_ST(pt_gpt_clip_grad_norm(&g, 0.0f, &norm), PT_OK); /* 0: no clipping */
    CHECK(memcmp(before, g.grads, g.num_params * sizeof(float)) == 0);
    CHECK_ST(pt_gpt_clip_grad_norm(&g, 1.5f, &norm), PT_OK);
    CHECK_NEAR(norm, naive, 1e-6 * naive);
    {
        double after = 0.0, worst = 0.0;
        for (i = 0; i < g.num_params; i++) {
            after += (double)g.grads[i] * g.grads[i];
            worst = fmax(worst, fabs(g.grads[i] - before[i] * 1.5 / naive));
        }
        CHECK_NEAR(sqrt(after), 1.5, 1e-5);
        CHECK(worst < 1e-6); /* same direction: every element scaled by 1.5/norm */
    }
    pt_gpt_free(&g);
}

static void test_lr_schedule(void) {
    pt_lr_schedule s;
    int k;
    s.lr = 1e-3f, s.min_lr = 1e-4f, s.warmup_steps = 10, s.total_steps = 110;
    CHECK(pt_lr_at(&s, 0) > 0.0f);
    for (k = 1; k < 10; k++) /* linear: equal increments of lr/warmup */
        CHECK_NEAR(pt_lr_at(&s, k) - pt_lr_at(&s, k - 1), 1e-4, 1e-9);
    CHECK_NEAR(pt_lr_at(&s, 9), 1e-3, 1e-9);
    CHECK_NEAR(pt_lr_at(&s, 10), 1e-3, 1e-9);
    CHECK_NEAR(pt_lr_at(&s, 60), (1e-3 + 1e-4) / 2, 1e-9); /* cosine midpoint */
    CHECK_NEAR(pt_lr_at(&s, 35), 1e-4 + 0.5 * (1 + cos(3.141592653589793 / 4)) * 9e-4, 1e-9);
    CHECK_NEAR(pt_lr_at(&s, 110), 1e-4, 1e-10);
    CHECK_NEAR(pt_lr_at(&s, 500), 1e-4, 1e-10);
    for (k = 11; k <= 110; k++) CHECK(pt_lr_at(&s, k) <= pt_lr_at(&s, k - 1));
}

static void test_rng(void) {
    pt_rng a, b;
    double sum = 0.0, sq = 0.0, usum = 0.0;
    int i, n = 100000, differ = 0;
    uint64_t saved;
    pt_rng_seed(&a, 1234);
    pt_rng_seed(&b, 1234);
    for (i = 0; i < 1000; i++) CHECK_EQ(pt_rng_u64(&a), pt_rng_u64(&b));
    pt_rng_seed(&b, 1235);
    for (i = 0; i < 100; i++) differ += pt_rng_u64(&a) != pt_rng_u64(&b);
    CHECK(differ > 90);
    saved = a.state; /* the state is the whole position */
    pt_rng_u64(&a);
    b.state = saved;
    pt_rng_u64(&b);
    CHECK_EQ(pt_rng_u64(&a), pt_rng_u64(&b));
    for (i = 0; i < n; i++) {
        float u = pt_rng_uniform(&a), x = pt_rng_normal(&a, 3.0f, 2.0f);
        if (!(u >= 0.0f && u < 1.0f)) {
            FAIL("uniform draw %g outside [0, 1)", (double)u);
            break;
        }
        usum += u;
        sum += x;
        sq += (double)x * x;
    }
    /* standard errors: mean 2/sqrt(n) = 0.0063, std 2/sqrt(2n) = 0.0045 */
    CHECK_NEAR(sum / n, 3.0, 0.03);
    CHECK_NEAR(sqrt(sq / n - (sum / n) * (sum / n)), 2.0, 0.03);
    CHECK_NEAR(usum / n, 0.5, 0.005);
}

/* ======================================================================== */
/* arena, model memory, configuration, input checks                          */
/* ======================================================================== */

static void test_arena(void) {
    pt_arena a;
    pt_tensor t;
    int64_t shape[2] = {3, 5}, bad[2] = {3, -1};
    unsigned char *p1, *p2, *p3;
    pt_arena_init_meta(&a);
    CHECK(pt_arena_alloc(&a, 10) == NULL);
    CHECK(pt_arena_alloc(&a, 100) == NULL);
    CHECK(pt_arena_alloc(&a, 64) == NULL);
    CHECK_EQ(a.used, 64 + 128 + 64); /* each block rounded up to 64 bytes */
    CHECK_ST(pt_arena_tensor(&a, &t, PT_F32, 2, shape), PT_OK);
    CHECK(t.data == NULL);
    CHECK_EQ(a.used, 256 + 64);
    pt_arena_free(&a);

    CHECK_ST(pt_arena_init(&a, 1000, NULL), PT_OK);
    p1 = (unsigned char *)pt_arena_alloc(&a, 1);
    p2 = (unsigned char *)pt_arena_alloc(&a, 65);
    CHECK_ST(pt_arena_tensor(&a, &t, PT_F32, 2, shape), PT_OK);
    p3 = (unsigned char *)t.data;
    CHECK(p1 && p2 && p3);
    if (p1 && p2 && p3) {
        CHECK_EQ((uintptr_t)p1 % 64, 0);
        CHECK_EQ((uintptr_t)p2 % 64, 0);
        CHECK_EQ((uintptr_t)p3 % 64, 0);
        CHECK_EQ(p2 - p1, 64);
        CHECK_EQ(p3 - p2, 128);
        memset(p1, 1, 1), memset(p2, 2, 65), memset(p3, 3, 60); /* ASan: inside the block */
    }
    CHECK_EQ(pt_tensor_numel(&t), 15);
    CHECK(t.dtype == PT_F32 && t.ndim == 2 && t.shape[0] == 3 && t.shape[1] == 5);
    pt_clear_error();
    CHECK(pt_arena_alloc(&a, 2000) == NULL); /* 256 used of 1000 */
    CHECK_MSG("2000");
    CHECK(pt_arena_alloc(&a, SIZE_MAX) == NULL); /* rounding up must not wrap */
    CHECK(pt_arena_alloc(&a, SIZE_MAX - 10) == NULL);
    shape[0] = 1000;
    CHECK_ST(pt_arena_tensor(&a, &t, PT_F32, 2, shape), PT_ERR_OOM);
    CHECK(pt_last_error()[0] != 0);
    CHECK_ST(pt_arena_tensor(&a, &t, PT_F32, 2, bad), PT_ERR_INVALID_ARG);
    CHECK(pt_arena_alloc(&a, 700) != NULL); /* the failures used nothing */
    pt_arena_free(&a);
}

/* The arenas' and the GEMM workspace's blocks (pt__malloc_big): 64-byte
   aligned, from 4 MiB up 2 MiB aligned (the advice itself is not checked:
   /proc/self/smaps said THPeligible 1 or 0 from run to run of this binary,
   cause not found); wholly usable (ASan), freed through the allocator. */
static void test_big_blocks(void) {
    size_t sizes[3] = {1000, (size_t)5 << 20, ((size_t)6 << 20) + 100}, calls, n;
    void *raw;
    unsigned char *p;
    pt_ctx c;
    pt_ctx_desc d;
    int i;
    for (i = 0; i < 3; i++) {
        n = sizes[i], calls = g_alloc_calls;
        p = (unsigned char *)pt__malloc_big(n, NULL, &raw);
        CHECK(p != NULL && raw != NULL && g_alloc_calls == calls + 1);
        if (!p) continue;
        CHECK_EQ((uintptr_t)p % (n < ((size_t)4 << 20) ? 64 : (size_t)2 << 20), 0);
        memset(p, 7, n);
        CHECK(p[0] == 7 && p[n - 1] == 7);
        pt__free(raw, NULL);
    }
    ZERO(d);
    d.threads = 1;
    CHECK_ST(pt_ctx_init(&c, &d), PT_OK);
    CHECK_EQ((uintptr_t)c.ws % ((size_t)2 << 20), 0); /* one slot: more than 4 MiB */
    memset(c.ws, 1, c.ws_slot);
    pt_ctx_free(&c);
}

/* Parameter count from the README's shapes, independent of the header. */
static int64_t params_by_hand(const pt_gpt_config *c) {
    int64_t C = c->n_embd, layer = 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + 2 * C +
                                   (C * 4 * C + 4 * C) + (4 * C * C + C);
    return (int64_t)c->vocab_size * C + (int64_t)c->block_size * C + c->n_layer * layer + 2 * C;
}

static void test_gpt_memory(void) {
    enum { V = 50, BS = 16, L = 3, NH = 2, C = 24, B = 3, T = 10 };
    pt_gpt_config c = cfg_make(V, BS, L, NH, C);
    pt_gpt meta, real;
    size_t before, meta_bytes, sum = 0;
    int i, in[B * T] = {0};
    before = g_alloc_bytes;
    CHECK_ST(gpt_new(&meta, c, B, T, 1), PT_OK);
    meta_bytes = g_alloc_bytes - before;
    CHECK_ST(gpt_new(&real, c, B, T, 0), PT_OK);
    CHECK(meta.params == NULL && meta.grads == NULL && meta.m == NULL && meta.v == NULL);
    /* only bookkeeping (the tensor table) may be allocated, no model memory */
    CHECK(meta_bytes < meta.mem.params);
    CHECK(memcmp(&meta.mem, &real.mem, sizeof meta.mem) == 0);
    CHECK_EQ(meta.num_params, params_by_hand(&c));
    CHECK_EQ(real.mem.params, params_by_hand(&c) * 4);
    CHECK_EQ(real.mem.grads, params_by_hand(&c) * 4);
    CHECK_EQ(real.mem.optimizer, params_by_hand(&c) * 8);
    CHECK_EQ(real.mem.total, real.mem.params + real.mem.grads + real.mem.optimizer +
                                 real.mem.activations + real.mem.scratch);
    /* logits and attention probabilities alone need this much */
    CHECK(real.mem.activations >= sizeof(float) * ((size_t)B * T * V + (size_t)L * B * NH * T * T));
    CHECK_EQ(real.num_tensors, 4 + 12 * L);
    for (i = 0; i < real.num_tensors; i++) { /* contiguous, canonical order */
        CHECK_EQ(real.table[i].offset, sum);
        sum += real.table[i].numel;
    }
    CHECK_EQ(sum, real.num_params);
    CHECK(strcmp(real.table[0].name, "wte.weight") == 0);
    CHECK(strcmp(real.table[4].name, "h.0.attn.c_attn.weight") == 0);
    CHECK(strcmp(real.table[real.num_tensors - 1].name, "ln_f.bias") == 0);
    CHECK(pt_gpt_find_param(&real, "h.2.mlp.c_proj.weight") == &real.table[2 + 12 * 2 + 10]);
    CHECK(pt_gpt_find_param(&real, "h.3.mlp.c_proj.weight") == NULL);
    CHECK_ERR(pt_gpt_forward(&meta, in, NULL, B, T), PT_ERR_INVALID_ARG, "meta");
    pt_gpt_free(&meta);
    pt_gpt_free(&real);
}

static void test_config_validation(void) {
    pt_gpt_config c;
    pt_gpt g;
    c = cfg_make(100, 64, 2, 3, 10);
    CHECK_ERR(pt_gpt_config_validate(&c), PT_ERR_CONFIG, "n_embd=10");
    CHECK_MSG("n_head=3");
    CHECK_ERR(gpt_new(&g, c, 1, 8, 0), PT_ERR_CONFIG, "not divisible");
    pt_gpt_free(&g);
    c = cfg_make(0, 64, 2, 2, 16);
    CHECK_ERR(pt_gpt_config_validate(&c), PT_ERR_CONFIG, "vocab_size=0");
    c = cfg_make(100, 64, 0, 2, 16);
    CHECK_ERR(pt_gpt_config_validate(&c), PT_ERR_CONFIG, "n_layer=0");
    c = cfg_make(100, 0, 2, 0, 0);
    CHECK_ERR(pt_gpt_config_validate(&c), PT_ERR_CONFIG, "block_size=0");
    CHECK_MSG("n_head=0");
    CHECK_MSG("n_embd=0");
    c = cfg_make(-5, 64, 2, 2, 16); /* two bad fields, one message */
    c.ln_eps = -1.0f;
    CHECK_ERR(pt_gpt_config_validate(&c), PT_ERR_CONFIG, "vocab_size=-5");
    CHECK_MSG("ln_eps");
    c = cfg_make(100, 64, 2, 2, 16);
    CHECK_ST(pt_gpt_config_validate(&c), PT_OK);
    CHECK_ERR(gpt_new(&g, c, 2, 65, 0), PT_ERR_CONFIG, "seq=65"); /* T > block_size */
    CHECK_MSG("64");
    pt_gpt_free(&g);
    CHECK_ERR(gpt_new(&g, c, 0, 0, 0), PT_ERR_CONFIG, "batch=0");
    CHECK_MSG("seq=0");
    pt_gpt_free(&g);
    CHECK_ST(gpt_new(&g, c, 2, 64, 1), PT_OK); /* seq == block_size is fine */
    pt_gpt_free(&g);
    c = cfg_make(0, 8, 2, 2, 16); /* a bad config and a bad batch/seq: all reported */
    CHECK_ERR(gpt_new(&g, c, 0, 9, 0), PT_ERR_CONFIG, "vocab_size=0");
    CHECK_MSG("batch=0");
    CHECK_MSG("seq=9");
    pt_gpt_free(&g);
    c = cfg_make(100, 64, 2, 2, 16);
    CHECK_ERR(pt_gpt_config_preset("gpt5-large", &c), PT_ERR_CONFIG, "gpt5-large");
    CHECK_ST(pt_gpt_config_preset("gpt2-124m", &c), PT_OK);
    CHECK_EQ(pt_gpt_num_params(&c), 124439808); /* published GPT-2 small count */
    CHECK_EQ(c.n_layer, 12);
    CHECK_EQ(c.n_embd, 768);
    /* model FLOPs: 6 x the multiplying parameters (not wpe, 1024 x 768: a lookup; the tied
       wte is the head) per token, plus 12 L C T per token of attention */
    CHECK(fabs(pt_gpt_flops_per_step(&c, 8, 256) -
               (6.0 * (124439808.0 - 1024 * 768) * 2048 + 12.0 * 12 * 768 * 2048 * 256)) < 1.0);
    CHECK_ST(pt_gpt_config_preset("llama-124m", &c), PT_OK); /* untied: embed_tokens a lookup */
    CHECK_EQ(pt_gpt_num_params(&c), 2LL * 32000 * 768 +
                                        12LL * (2 * 768 * 768 + 2 * 768 * 256 + 3 * 768 * 2048 +
                                                2 * 768) + 768);
    CHECK(fabs(pt_gpt_flops_per_step(&c, 8, 256) -
               (6.0 * (double)(pt_gpt_num_params(&c) - 32000 * 768) * 2048 +
                12.0 * 12 * 768 * 2048 * 256)) < 1.0);
    {
        const char *names[] = {"tiny", "mini", "small", "gpt2-124m", "gpt2-350m", "gpt2-774m", "gpt2-1558m"};
        int i;
        for (i = 0; i < 7; i++) {
            CHECK_ST(pt_gpt_config_preset(names[i], &c), PT_OK);
            CHECK_ST(pt_gpt_config_validate(&c), PT_OK);
            CHECK_EQ(pt_gpt_num_params(&c), params_by_hand(&c));
            CHECK(strstr(pt_gpt_preset_names(), names[i]) != NULL);
        }
    }
}

static void test_forward_input_checks(void) {
    enum { V = 10, B = 2, T = 4 };
    pt_gpt g;
    int in[B * T] = {1, 2, 3, 4, 5, 6, 7, 8}, tg[B * T] = {0, 1, 2, 3, 4, 5, 6, 7};
    CHECK_ST(gpt_new(&g, cfg_make(V, 8, 1, 2, 8), B, T, 0), PT_OK);
    if (!g.params) return;
    pt_gpt_init_weights(&g, 1);
    CHECK_ERR(pt_gpt_backward(&g), PT_ERR_INVALID_ARG, "forward"); /* no forward yet */
    in[5] = V;
    CHECK_ERR(pt_gpt_forward(&g, in, tg, B, T), PT_ERR_RANGE, "inputs[5]");
    in[5] = 6, tg[3] = -1;
    CHECK_ERR(pt_gpt_forward(&g, in, tg, B, T), PT_ERR_RANGE, "targets[3]");
    tg[3] = 3;
    CHECK_ERR(pt_gpt_forward(&g, in, tg, B + 1, T), PT_ERR_CONFIG, "B=2");
    CHECK_ERR(pt_gpt_forward(&g, in, tg, B, T + 1), PT_ERR_CONFIG, "T=4");
    CHECK_ST(pt_gpt_forward(&g, in, NULL, B, T), PT_OK);
    CHECK(g.loss < 0.0f);
    CHECK_ST(pt_gpt_backward(&g), PT_ERR_INVALID_ARG); /* no targets */
    CHECK_ST(pt_gpt_forward(&g, in, tg, 1, 3), PT_OK); /* smaller than capacity is fine */
    CHECK(g.loss > 0.0f);
    CHECK_ST(pt_gpt_backward(&g), PT_OK);
    CHECK_ST(pt_gpt_backward(&g), PT_ERR_INVALID_ARG); /* once per forward */
    pt_gpt_free(&g);
}

/* ======================================================================== */
/* safetensors                                                               */
/* ======================================================================== */

/* A file image: u64 little-endian header length, the header, the data (exact size). */
static unsigned char *st_image(const char *json, const void *data, size_t dlen, size_t *size) {
    size_t hl = strlen(json), i;
    unsigned char *b = TALLOC(unsigned char, 8 + hl + dlen);
    for (i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, json, hl);
    if (dlen) memcpy(b + 8 + hl, data, dlen);
    *size = 8 + hl + dlen;
    return b;
}

/* pt_st_parse must return exactly `want` and, on error, a message containing sub. */
static void parse_expect_(const char *file, int line, const unsigned char *b, size_t n,
                          pt_status want, const char *sub) {
    pt_safetensors st;
    pt_status s;
    ZERO(st);
    pt_clear_error();
    s = pt_st_parse(&st, b, n);
    if (s != want)
        failf(file, line, "pt_st_parse returned %s, expected %s (last error: %s)",
              pt_status_name(s), pt_status_name(want), pt_last_error());
    else if (s != PT_OK && (!pt_last_error()[0] || (sub && !strstr(pt_last_error(), sub))))
        failf(file, line, "last error \"%s\" does not mention \"%s\"", pt_last_error(), sub ? sub : "");
    if (s == PT_OK) pt_st_free(&st);
}
#define PARSE_EXPECT(json, dlen, want, sub) do {                                            \
        size_t n_;                                                                           \
        unsigned char *b_ = st_image(json, zeros, dlen, &n_);                                \
        parse_expect_(__FILE__, __LINE__, b_, n_, want, sub);                                \
    } while (0)

static void test_st_roundtrip(void) {
    static const char *meta_vals[2] = {"quote \" backslash \\ newline \n tab \t ctrl \x01 end",
                                       "unicode h\xc3\xa9llo \xe2\x98\x83 \xf0\x9f\x98\x80"};
    const char *path = tmp_path("roundtrip.safetensors");
    const char *name_f = "a \"weird\"\\name\nwith/\xc3\xa9";
    float f[6] = {1.5f, -2.0f, 3.25f, 0.0f, -0.0f, 1e-30f}, scalar = 42.5f, got[6];
    int32_t ints[4] = {7, -8, 2147483647, -2147483647 - 1}, goti[4];
    int64_t s23[2] = {2, 3}, s4[1] = {4}, s03[2] = {0, 3}, s32[2] = {3, 2};
    pt_st_writer w;
    pt_safetensors st;
    const pt_st_tensor *t;
    unsigned char *file;
    size_t size = 0;
    ZERO(w);
    pt_st_writer_init(&w);
    CHECK_ST(pt_st_writer_meta(&w, "k1", meta_vals[0]), PT_OK);
    CHECK_ST(pt_st_writer_meta(&w, "k\"2\"", meta_vals[1]), PT_OK);
    CHECK_ST(pt_st_writer_add(&w, name_f, PT_F32, 2, s23, f), PT_OK);
    CHECK_ST(pt_st_writer_add(&w, "ints", PT_I32, 1, s4, ints), PT_OK);
    CHECK_ST(pt_st_writer_add(&w, "scalar", PT_F32, 0, NULL, &scalar), PT_OK);
    CHECK_ST(pt_st_writer_add(&w, "empty", PT_F32, 2, s03, NULL), PT_OK);
    CHECK_ST(pt_st_writer_add(&w, "__metadata__", PT_F32, 1, s4, f), PT_ERR_INVALID_ARG);
    CHECK_ST(pt_st_writer_save(&w, path), PT_OK);
    pt_st_writer_free(&w);
    CHECK(!file_exists(tmp_path("roundtrip.safetensors.tmp")));
    file = read_all(path, &size);
    if (!file || size < 8) {
        FAIL("cannot read back %s", path);
        return;
    }
    { /* the data buffer starts 8-byte aligned: 8 + N is a multiple of 8 */
        uint64_t hl = 0;
        int i;
        for (i = 7; i >= 0; i--) hl = (hl << 8) | file[i];
        CHECK_EQ((8 + hl) % 8, 0);
        CHECK_EQ(size, 8 + hl + sizeof f + sizeof ints + sizeof scalar);
    }
    ZERO(st);
    CHECK_ST(pt_st_load(&st, path), PT_OK);
    CHECK_EQ(st.n_tensors, 4);
    CHECK_EQ(st.n_meta, 2);
    CHECK(pt_st_meta_get(&st, "k1") && strcmp(pt_st_meta_get(&st, "k1"), meta_vals[0]) == 0);
    CHECK(pt_st_meta_get(&st, "k\"2\"") && strcmp(pt_st_meta_get(&st, "k\"2\""), meta_vals[1]) == 0);
    CHECK(pt_st_meta_get(&st, "k3") == NULL);
    t = pt_st_find(&st, name_f);
    CHECK(t && t->dtype == PT_F32 && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3);
    CHECK_ST(pt_st_read_f32(&st, name_f, got, 2, s23), PT_OK);
    CHECK(memcmp(got, f, sizeof f) == 0);
    CHECK_ST(pt_st_read_i32(&st, "ints", goti, 1, s4), PT_OK);
    CHECK(memcmp(goti, ints, sizeof ints) == 0);
    t = pt_st_find(&st, "scalar");
    CHECK(t && t->ndim == 0 && t->end - t->begin == 4);
    got[0] = 0.0f;
    CHECK_ST(pt_st_read_f32(&st, "scalar", got, 0, NULL), PT_OK);
    CHECK(got[0] == 42.5f);
    t = pt_st_find(&st, "empty");
    CHECK(t && t->ndim == 2 && t->shape[0] == 0 && t->shape[1] == 3 && t->end == t->begin);
    CHECK_ST(pt_st_read_f32(&st, "empty", got, 2, s03), PT_OK);
    /* read errors */
    CHECK_ERR(pt_st_read_f32(&st, name_f, got, 2, s32), PT_ERR_SHAPE, "[2, 3]");
    CHECK_ERR(pt_st_read_f32(&st, name_f, got, 1, s4), PT_ERR_SHAPE, "weird");
    CHECK_ERR(pt_st_read_f32(&st, "nope", got, 1, s4), PT_ERR_MISSING, "nope");
    CHECK_ERR(pt_st_read_f32(&st, "ints", got, 1, s4), PT_ERR_DTYPE, "I32");
    CHECK_ERR(pt_st_read_i32(&st, "scalar", goti, 0, NULL), PT_ERR_DTYPE, "F32");
    pt_st_free(&st);
    ZERO(st);
    CHECK_ERR(pt_st_load(&st, tmp_path("does-not-exist.safetensors")), PT_ERR_IO, "does-not-exist");
}

/* F16, BF16 and F64 tensors from hand-encoded little-endian bytes. */
static void test_st_half_formats(void) {
    static const uint16_t f16[9] = {0x3C00, 0xC100, 0x3800, 0x7BFF, 0x0001, 0x03FF, 0x0400, 0x8000, 0x7C00};
    const double f16_want[9] = {1.0, -2.5, 0.5, 65504.0, ldexp(1, -24), 1023 * ldexp(1, -24),
                                ldexp(1, -14), -0.0, INFINITY};
    static const uint16_t bf16[5] = {0x3F80, 0xC020, 0x3F00, 0x4049, 0x0001};
    const double bf16_want[5] = {1.0, -2.5, 0.5, 3.140625, ldexp(1, -133)};
    unsigned char data[18 + 10 + 8], *img;
    char json[256];
    double d = 0.1;
    float got[9];
    int64_t s9[1] = {9}, s5[1] = {5}, s1[1] = {1};
    pt_safetensors st;
    size_t n;
    int i;
    for (i = 0; i < 9; i++) data[2 * i] = (unsigned char)f16[i], data[2 * i + 1] = (unsigned char)(f16[i] >> 8);
    for (i = 0; i < 5; i++) data[18 + 2 * i] = (unsigned char)bf16[i], data[19 + 2 * i] = (unsigned char)(bf16[i] >> 8);
    memcpy(data + 28, &d, 8); /* little-endian host */
    snprintf(json, sizeof json, "{\"h\":{\"dtype\":\"F16\",\"shape\":[9],\"data_offsets\":[0,18]},"
             "\"b\":{\"dtype\":\"BF16\",\"shape\":[5],\"data_offsets\":[18,28]},"
             "\"d\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[28,36]}}");
    img = st_image(json, data, sizeof data, &n);
    ZERO(st);
    CHECK_ST(pt_st_parse(&st, img, n), PT_OK);
    CHECK_ST(pt_st_read_f32(&st, "h", got, 1, s9), PT_OK);
    for (i = 0; i < 9; i++)
        if (!((double)got[i] == f16_want[i] && (signbit(got[i]) != 0) == (signbit(f16_want[i]) != 0)))
            FAIL("F16 0x%04x read as %.9g, expected %.9g", f16[i], (double)got[i], f16_want[i]);
    CHECK_ST(pt_st_read_f32(&st, "b", got, 1, s5), PT_OK);
    for (i = 0; i < 5; i++)
        if ((double)got[i] != bf16_want[i])
            FAIL("BF16 0x%04x read as %.9g, expected %.9g", bf16[i], (double)got[i], bf16_want[i]);
    CHECK_ST(pt_st_read_f32(&st, "d", got, 1, s1), PT_OK);
    CHECK(got[0] == (float)0.1);
    pt_st_free(&st);
}

/* {"a": {"dtype": dtype, "shape": [shape], "data_offsets": [off]}} */
static const char *one(const char *dtype, const char *shape, const char *off) {
    char *j = TALLOC(char, 256);
    snprintf(j, 256, "{\"a\":{\"dtype\":\"%s\",\"shape\":[%s],\"data_offsets\":[%s]}}", dtype, shape, off);
    return j;
}

static void test_st_malformed(void) {
    static const unsigned char zeros[64] = {0};
    const char *ok1 = "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]";
    char json[512], *deep;
    size_t n, i;
    unsigned char *img;
    /* container */
    parse_expect_(__FILE__, __LINE__, zeros, 5, PT_ERR_FORMAT, "5 bytes");
    img = st_image("{}", NULL, 0, &n);
    img[0] = 100; /* header length 100 in a 10-byte file */
    parse_expect_(__FILE__, __LINE__, img, n, PT_ERR_FORMAT, "100");
    img[0] = 0, img[7] = 0x80; /* 2^63 */
    parse_expect_(__FILE__, __LINE__, img, n, PT_ERR_FORMAT, "9223372036854775");
    PARSE_EXPECT("{}", 0, PT_OK, NULL);
    PARSE_EXPECT("{}      ", 0, PT_OK, NULL); /* space padding */
    PARSE_EXPECT("hello world", 0, PT_ERR_FORMAT, "JSON");
    PARSE_EXPECT("[1, 2]", 0, PT_ERR_FORMAT, "object");
    PARSE_EXPECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]", 4, PT_ERR_FORMAT, "JSON");
    PARSE_EXPECT("{\"a\":{\"dtype\":\"F32\",\"sha", 4, PT_ERR_FORMAT, "JSON");
    PARSE_EXPECT("{} xyz", 0, PT_ERR_FORMAT, "trailing");
    PARSE_EXPECT("{}}", 0, PT_ERR_FORMAT, "trailing");
    PARSE_EXPECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},}", 4, PT_ERR_FORMAT, "JSON");
    /* offsets and sizes */
    PARSE_EXPECT(one("F32", "2", "0,8"), 4, PT_ERR_FORMAT, "'a'"); /* beyond the data */
    PARSE_EXPECT(one("F32", "1", "8,4"), 8, PT_ERR_FORMAT, "'a'");
    PARSE_EXPECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, PT_ERR_FORMAT, "overlap");
    /* the overlap of a and b, with an empty tensor sorted between them */
    PARSE_EXPECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[2,2]},"
                 "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, PT_ERR_FORMAT, "overlap");
    PARSE_EXPECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]},"
                 "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 16, PT_OK, NULL);
    PARSE_EXPECT(one("F32", "3", "0,8"), 8, PT_ERR_SHAPE, "'a'");
    PARSE_EXPECT(one("F32", "4611686018427387904,4", "0,8"), 8, PT_ERR_SHAPE, "'a'"); /* overflow */
    PARSE_EXPECT(one("F32", "1,1,1,1,1,1,1,1,1", "0,4"), 4, PT_ERR_FORMAT, "dimensions");
    /* entries */
    PARSE_EXPECT(one("F8", "1", "0,1"), 1, PT_ERR_DTYPE, "F8");
    PARSE_EXPECT("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, PT_ERR_FORMAT, "dtype");
    PARSE_EXPECT("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, PT_ERR_FORMAT, "shape");
    PARSE_EXPECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, PT_ERR_FORMAT, "data_offsets");
    PARSE_EXPECT(one("F32", "-1", "0,4"), 4, PT_ERR_FORMAT, "integer");
    PARSE_EXPECT(one("F32", "1.5", "0,4"), 4, PT_ERR_FORMAT, "integer");
    PARSE_EXPECT(one("F32", "1e0", "0,4"), 4, PT_ERR_FORMAT, "integer");
    PARSE_EXPECT(one("F32", "1", "0,-4"), 4, PT_ERR_FORMAT, "integer");
    PARSE_EXPECT(one("F32", "1", "0,4,8"), 8, PT_ERR_FORMAT, "data_offsets");
    PARSE_EXPECT("{\"a\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, PT_ERR_FORMAT, "dtype");
    PARSE_EXPECT("{\"a\":[1]}", 4, PT_ERR_FORMAT, "object");
    snprintf(json, sizeof json, "{\"a\":{%s},\"a\":{%s}}", ok1, "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]");
    PARSE_EXPECT(json, 8, PT_ERR_FORMAT, "'a'"); /* duplicate name */
    PARSE_EXPECT("{\"__metadata__\":{\"k\":1}}", 0, PT_ERR_FORMAT, "'k'");
    PARSE_EXPECT("{\"__metadata__\":{\"k\":\"v\",\"n\":null}}", 0, PT_ERR_FORMAT, "'n'");
    PARSE_EXPECT("{\"__metadata__\":[\"k\"]}", 0, PT_ERR_FORMAT, "__metadata__");
    snprintf(json, sizeof json, "{\"a\nb\":{%s}}", ok1); /* raw control character */
    PARSE_EXPECT(json, 4, PT_ERR_FORMAT, "JSON");
    snprintf(json, sizeof json, "{\"a\\u0000b\":{%s}}", ok1);
    PARSE_EXPECT(json, 4, PT_ERR_FORMAT, "JSON");
    snprintf(json, sizeof json, "{\"a\\ud800\":{%s}}", ok1); /* lone surrogate */
    PARSE_EXPECT(json, 4, PT_ERR_FORMAT, "JSON");
    snprintf(json, sizeof json, "{\"a\\u00e9\\ud83d\\ude00\":{%s}}", ok1);
    PARSE_EXPECT(json, 4, PT_OK, NULL);
    /* an ignored key may hold any JSON value, nested a little */
    snprintf(json, sizeof json, "{\"a\":{%s,\"x\":[[1,{\"y\":[true,false,null,-1.5e3,\"s\"]}],[]]}}", ok1);
    PARSE_EXPECT(json, 4, PT_OK, NULL);
    /* but 10000 nested arrays must neither overflow the stack nor pass */
    deep = TALLOC(char, 20200);
    n = (size_t)snprintf(deep, 200, "{\"a\":{%s,\"x\":", ok1);
    for (i = 0; i < 10000; i++) deep[n++] = '[';
    for (i = 0; i < 10000; i++) deep[n++] = ']';
    memcpy(deep + n, "}}", 3);
    PARSE_EXPECT(deep, 4, PT_ERR_FORMAT, NULL);
    deep[n - 10000] = 0; /* unclosed */
    PARSE_EXPECT(deep, 4, PT_ERR_FORMAT, NULL);
}

/* Every header byte replaced by a few values and bit flips, and every
   truncation: parse returns a status and never reads out of bounds (ASan);
   whatever it accepts is self-consistent. */
static void test_st_mutations(void) {
    static const unsigned char vals[] = {0,   ' ', '"', '\\', '{', '}', '[', ']', ',',
                                         ':', '-', '0', '9',  'e', '.', 0x7F, 0xFF};
    float f[6] = {1, 2, 3, 4, 5, 6};
    int32_t ints[2] = {1, 2};
    int64_t s23[2] = {2, 3}, s2[1] = {2}, s0[1] = {0};
    pt_st_writer w;
    const char *path = tmp_path("mutate.safetensors");
    unsigned char *file, *buf;
    size_t size = 0, hl, pos, len;
    int v, accepted = 0, total = 0;
    ZERO(w);
    pt_st_writer_init(&w);
    pt_st_writer_meta(&w, "format", "pt\"x\\");
    pt_st_writer_add(&w, "x", PT_F32, 2, s23, f);
    pt_st_writer_add(&w, "i", PT_I32, 1, s2, ints);
    pt_st_writer_add(&w, "s", PT_F32, 0, NULL, f);
    pt_st_writer_add(&w, "e", PT_F32, 1, s0, NULL);
    CHECK_ST(pt_st_writer_save(&w, path), PT_OK);
    pt_st_writer_free(&w);
    file = read_all(path, &size);
    if (!file || size < 8) return;
    hl = (size_t)file[0] | (size_t)file[1] << 8;
    for (pos = 0; pos < 8 + hl; pos++) {
        buf = (unsigned char *)malloc(size); /* exact size, so ASan sees over-reads */
        memcpy(buf, file, size);
        for (v = 0; v < (int)sizeof vals + 8; v++) {
            pt_safetensors st;
            pt_status s;
            buf[pos] = v < (int)sizeof vals ? vals[v]
                                            : (unsigned char)(file[pos] ^ (1u << (v - (int)sizeof vals)));
            ZERO(st);
            s = pt_st_parse(&st, buf, size);
            total++;
            if (s == PT_OK) {
                int k, d;
                accepted++;
                for (k = 0; k < st.n_tensors; k++) {
                    const pt_st_tensor *t = &st.tensors[k];
                    uint64_t bytes = pt_dtype_size(t->dtype);
                    for (d = 0; d < t->ndim; d++) bytes *= (uint64_t)t->shape[d];
                    if (t->end - t->begin != bytes || t->data < buf ||
                        t->data + bytes > buf + size) {
                        FAIL("mutation at %zu accepted an inconsistent tensor '%s'", pos, t->name);
                        break;
                    }
                }
                pt_st_free(&st);
            } else if ((int)s <= 0 || s >= PT_STATUS_COUNT || !pt_last_error()[0]) {
                FAIL("mutation at %zu: status %d without a message", pos, (int)s);
            }
        }
        free(buf);
    }
    for (len = 0; len < size; len++) {
        pt_safetensors st;
        buf = (unsigned char *)malloc(len ? len : 1);
        memcpy(buf, file, len);
        ZERO(st);
        if (pt_st_parse(&st, buf, len) == PT_OK) { /* the last tensor ends at the end */
            FAIL("file truncated to %zu of %zu bytes was accepted", len, size);
            pt_st_free(&st);
        }
        free(buf);
    }
    CHECK(accepted > 0 && accepted < total); /* some mutations are harmless, most are not */
}

/* where needle first occurs in the n bytes at hay, or NULL */
static char *find_bytes(char *hay, size_t n, const char *needle) {
    size_t k = strlen(needle), i;
    for (i = 0; i + k <= n; i++)
        if (memcmp(hay + i, needle, k) == 0) return hay + i;
    return NULL;
}

/* The file as a writer without checksums (ptrain before them) made it: the
   "pt64:" entries cut out of the header, padded back to its length with
   spaces so the data stays where it was. */
static void strip_checksums(const char *src, const char *dst) {
    size_t n = 0, hl = 0;
    unsigned char *f = read_all(src, &n);
    char *h, *a, *b;
    int i;
    if (!f || n < 8) {
        FAIL("cannot read %s", src);
        return;
    }
    for (i = 7; i >= 0; i--) hl = (hl << 8) | f[i];
    h = (char *)f + 8;
    a = find_bytes(h, hl, "\"pt64:__metadata__\"");
    if (!a) {
        FAIL("%s has no checksums", src);
        return;
    }
    if (a[-1] == ',') a--;
    b = a + strcspn(a, "}"); /* the checksums are the metadata's last entries */
    memmove(a, b, (size_t)(h + hl - b));
    memset(h + hl - (b - a), ' ', (size_t)(b - a));
    write_all(dst, f, n);
}

/* Every data byte flipped is caught and names its tensor; so are changed
   metadata, a changed shape, a missing checksum and a truncation. Files
   without checksums load unverified. */
static void test_st_checksums(void) {
    float f[6] = {1, 2, 3, 4, 5, 6};
    int32_t ints[2] = {7, 8};
    int64_t s23[2] = {2, 3}, s2[1] = {2}, s0[1] = {0};
    const char *path = tmp_path("sums.safetensors"), *old = tmp_path("sums_old.safetensors");
    pt_st_writer w;
    pt_safetensors st;
    unsigned char *file, *buf;
    size_t size = 0, hl, pos;
    char *h, *at;
    int caught = 0;
    ZERO(w);
    pt_st_writer_init(&w);
    CHECK_ST(pt_st_writer_meta(&w, "k", "v"), PT_OK);
    CHECK_ERR(pt_st_writer_meta(&w, "pt64:x", "0"), PT_ERR_INVALID_ARG, "reserved");
    pt_st_writer_add(&w, "x", PT_F32, 2, s23, f);
    pt_st_writer_add(&w, "i", PT_I32, 1, s2, ints);
    pt_st_writer_add(&w, "e", PT_F32, 1, s0, NULL);
    CHECK_ST(pt_st_writer_save(&w, path), PT_OK);
    pt_st_writer_free(&w);
    ZERO(st);
    CHECK_ST(pt_st_load(&st, path), PT_OK);
    CHECK_EQ(st.checksummed, 1);
    CHECK_EQ(st.n_meta, 1); /* the checksums are the container's, not metadata */
    pt_st_free(&st);
    file = read_all(path, &size);
    if (!file || size < 8) return;
    hl = (size_t)file[0] | (size_t)file[1] << 8;
    buf = TALLOC(unsigned char, size);
    for (pos = 8 + hl; pos < size; pos++) { /* x's 24 bytes, then i's 8 */
        memcpy(buf, file, size);
        buf[pos] ^= 0x10;
        parse_expect_(__FILE__, __LINE__, buf, size, PT_ERR_FORMAT,
                      pos < 8 + hl + sizeof f ? "tensor 'x' fails its checksum"
                                              : "tensor 'i' fails its checksum");
        caught++;
    }
    CHECK_EQ(caught, sizeof f + sizeof ints);
    memcpy(buf, file, size);
    h = (char *)buf + 8;
    at = find_bytes(h, hl, "\"k\":\"v\"");
    if (at) at[5] = 'w';
    parse_expect_(__FILE__, __LINE__, buf, size, PT_ERR_FORMAT, "metadata fails its checksum");
    memcpy(buf, file, size);
    at = find_bytes(h, hl, "[2,3]"); /* the same bytes as 3 x 2 */
    if (at) at[1] = '3', at[3] = '2';
    parse_expect_(__FILE__, __LINE__, buf, size, PT_ERR_FORMAT, "tensor 'x' fails its checksum");
    memcpy(buf, file, size);
    at = find_bytes(h, hl, "\"pt64:i\"");
    if (at) at[6] = 'j'; /* i loses its checksum, a j that is no tensor gets one */
    parse_expect_(__FILE__, __LINE__, buf, size, PT_ERR_FORMAT, "tensor 'i' has no checksum");
    parse_expect_(__FILE__, __LINE__, file, size - 1, PT_ERR_FORMAT, "truncated");
    /* written without checksums: loads, unverified */
    strip_checksums(path, old);
    ZERO(st);
    CHECK_ST(pt_st_load(&st, old), PT_OK);
    CHECK_EQ(st.checksummed, 0);
    CHECK_EQ(st.n_meta, 1);
    CHECK_EQ(st.n_tensors, 3);
    pt_st_free(&st);
}

/* ======================================================================== */
/* model weights from files, checkpoints                                     */
/* ======================================================================== */

/* m's parameters in a Hugging Face-style file: "transformer." names, the attn.bias
   and attn.masked_bias buffers and lm_head.weight. `skip` is left out; `misshape`
   is written with one extra row. */
static pt_status write_hf(const char *path, const pt_gpt *m, const char *skip, const char *misshape) {
    int64_t bias_shape[4] = {1, 1, m->config.block_size, m->config.block_size};
    float *mask = frand((size_t)m->config.block_size * m->config.block_size, 0, 1), *big;
    char name[96];
    pt_st_writer w;
    pt_status s;
    int i, l;
    ZERO(w);
    pt_st_writer_init(&w);
    pt_st_writer_meta(&w, "format", "pt");
    for (i = 0; i < m->num_tensors; i++) {
        const pt_param *p = &m->table[i];
        int64_t shape[2] = {p->shape[0], p->shape[1]};
        const float *data = m->params + p->offset;
        if (skip && strcmp(p->name, skip) == 0) continue;
        if (misshape && strcmp(p->name, misshape) == 0) {
            shape[0]++;
            big = TALLOC(float, (size_t)shape[0] * (p->ndim > 1 ? (size_t)shape[1] : 1));
            data = big;
        }
        snprintf(name, sizeof name, "transformer.%s", p->name);
        pt_st_writer_add(&w, name, PT_F32, p->ndim, shape, data);
    }
    for (l = 0; l < m->config.n_layer; l++) {
        snprintf(name, sizeof name, "transformer.h.%d.attn.bias", l);
        pt_st_writer_add(&w, name, PT_F32, 4, bias_shape, mask);
        snprintf(name, sizeof name, "transformer.h.%d.attn.masked_bias", l);
        pt_st_writer_add(&w, name, PT_F32, 0, NULL, mask);
    }
    pt_st_writer_add(&w, "lm_head.weight", PT_F32, 2, m->table[0].shape, m->wte);
    s = pt_st_writer_save(&w, path);
    pt_st_writer_free(&w);
    return s;
}

static void test_load_hf_weights(void) {
    pt_gpt src, dst;
    pt_gpt_config c;
    pt_safetensors st;
    const char *path = tmp_path("hf.safetensors");
    float *keep;
    CHECK_ST(gpt_new(&src, cfg_make(13, 8, 2, 4, 64), 1, 1, 0), PT_OK);
    if (!src.params) return;
    gpt_randomize(&src, 11, 0.5f);
    CHECK_ST(write_hf(path, &src, NULL, NULL), PT_OK);
    ZERO(st);
    CHECK_ST(pt_st_load(&st, path), PT_OK);
    CHECK_ST(pt_gpt_config_from_st(&st, 0, &c), PT_OK); /* n_head = C/64 */
    CHECK(c.vocab_size == 13 && c.block_size == 8 && c.n_layer == 2 && c.n_embd == 64 && c.n_head == 1);
    CHECK_ST(pt_gpt_config_from_st(&st, 4, &c), PT_OK);
    CHECK_EQ(c.n_head, 4);
    CHECK_ST(gpt_new(&dst, c, 1, 4, 0), PT_OK);
    if (dst.params) {
        pt_gpt_init_weights(&dst, 99);
        CHECK_ST(pt_gpt_load_weights_st(&dst, &st), PT_OK);
        CHECK(memcmp(dst.params, src.params, src.num_params * sizeof(float)) == 0);
        pt_st_free(&st);
        /* a missing tensor, then a mis-shaped one (the last in canonical order):
           the error names it and nothing is copied */
        pt_gpt_init_weights(&dst, 99);
        keep = fcopy(dst.params, dst.num_params);
        CHECK_ST(write_hf(path, &src, "h.1.mlp.c_proj.bias", NULL), PT_OK);
        CHECK_ERR(pt_gpt_load_weights(&dst, path), PT_ERR_MISSING, "h.1.mlp.c_proj.bias");
        CHECK(memcmp(dst.params, keep, dst.num_params * sizeof(float)) == 0);
        CHECK_ST(write_hf(path, &src, NULL, "ln_f.bias"), PT_OK);
        CHECK_ERR(pt_gpt_load_weights(&dst, path), PT_ERR_SHAPE, "ln_f.bias");
        CHECK(memcmp(dst.params, keep, dst.num_params * sizeof(float)) == 0);
    }
    pt_st_free(&st);
    pt_gpt_free(&dst);
    pt_gpt_free(&src);
}

/* ---- checkpoints ------------------------------------------------------------ */

enum { CK_B = 2, CK_T = 8 };

static void train_steps(pt_gpt *g, pt_loader *l, int steps, float *losses) {
    int in[CK_B * CK_T], tg[CK_B * CK_T], s;
    pt_adamw_config opt = pt_adamw_default();
    for (s = 0; s < steps; s++) {
        pt_loader_next(l, in, tg);
        CHECK_ST(pt_gpt_forward(g, in, tg, CK_B, CK_T), PT_OK);
        CHECK_ST(pt_gpt_backward(g), PT_OK);
        pt_gpt_adamw_step(g, &opt, 1e-2f);
        losses[s] = g->loss;
    }
}

static void make_tokens(pt_tokens *t, size_t n, int V) {
    size_t i;
    ZERO(*t);
    t->data = TALLOC(uint16_t, n);
    for (i = 0; i < n; i++) t->data[i] = (uint16_t)((i * 7 + i / 3 + (size_t)irand(3)) % (size_t)V);
    t->n = n;
    t->vocab_size = V;
}

static void test_checkpoint_resume(void) {
    pt_gpt_config cfg = cfg_make(32, 16, 2, 2, 16), c2;
    pt_gpt a, b;
    pt_loader la, lb;
    pt_loader_desc ld;
    pt_tokens tok;
    pt_train_state ts, got;
    pt_rng rng;
    float losses_a[6], losses_b[6];
    const char *path = tmp_path("resume.safetensors");
    make_tokens(&tok, 81, 32); /* 10 windows of 8: the 6 steps cross an epoch */
    ZERO(ld);
    ld.batch = CK_B, ld.seq = CK_T, ld.seed = 5;
    /* uninterrupted: 6 steps */
    CHECK_ST(gpt_new(&a, cfg, CK_B, CK_T, 0), PT_OK);
    ZERO(la);
    CHECK_ST(pt_loader_init(&la, &tok, PT_SPLIT_ALL, &ld), PT_OK);
    if (!a.params) return;
    pt_gpt_init_weights(&a, 1);
    train_steps(&a, &la, 6, losses_a);
    pt_loader_free(&la);
    /* 3 steps, checkpoint, free everything */
    CHECK_ST(gpt_new(&b, cfg, CK_B, CK_T, 0), PT_OK);
    ZERO(lb);
    CHECK_ST(pt_loader_init(&lb, &tok, PT_SPLIT_ALL, &ld), PT_OK);
    pt_gpt_init_weights(&b, 1);
    train_steps(&b, &lb, 3, losses_b);
    pt_rng_seed(&rng, 77);
    pt_rng_u64(&rng);
    ts.step = 3, ts.data_epoch = lb.epoch, ts.data_pos = lb.pos, ts.rng_state = rng.state;
    CHECK_ST(pt_checkpoint_save(path, &b, &ts), PT_OK);
    pt_loader_free(&lb);
    pt_gpt_free(&b);
    /* rebuild from the file, resume, 3 more steps */
    CHECK_ST(pt_gpt_config_from_file(path, 0, &c2), PT_OK);
    CHECK(c2.vocab_size == 32 && c2.block_size == 16 && c2.n_layer == 2 && c2.n_head == 2 && c2.n_embd == 16);
    CHECK_ST(gpt_new(&b, c2, CK_B, CK_T, 0), PT_OK);
    pt_gpt_init_weights(&b, 12345); /* must be overwritten */
    ZERO(got);
    CHECK_ST(pt_checkpoint_load(path, &b, &got), PT_OK);
    CHECK(got.step == 3 && got.data_epoch == ts.data_epoch && got.data_pos == ts.data_pos);
    CHECK_EQ(got.rng_state, rng.state);
    CHECK_EQ(b.adam_t, 3);
    ZERO(lb);
    CHECK_ST(pt_loader_init(&lb, &tok, PT_SPLIT_ALL, &ld), PT_OK);
    pt_loader_seek(&lb, got.data_epoch, (size_t)got.data_pos);
    train_steps(&b, &lb, 3, losses_b + 3);
    CHECK(memcmp(losses_a, losses_b, sizeof losses_a) == 0);
    if (memcmp(losses_a, losses_b, sizeof losses_a) != 0) {
        int s;
        for (s = 0; s < 6; s++)
            printf("      step %d: %.9g vs %.9g\n", s, (double)losses_a[s], (double)losses_b[s]);
    }
    CHECK(losses_a[5] < losses_a[0]); /* it did learn something */
    CHECK(memcmp(a.params, b.params, a.num_params * sizeof(float)) == 0);
    CHECK(memcmp(a.m, b.m, a.num_params * sizeof(float)) == 0);
    CHECK(memcmp(a.v, b.v, a.num_params * sizeof(float)) == 0);
    pt_loader_free(&lb);
    pt_gpt_free(&a);
    pt_gpt_free(&b);
}

static void test_checkpoint_errors(void) {
    pt_gpt_config cfg = cfg_make(32, 16, 2, 2, 16);
    pt_adamw_config opt = pt_adamw_default();
    pt_gpt g, other;
    pt_train_state ts, got;
    pt_safetensors st;
    pt_st_writer w;
    const char *path = tmp_path("ck.safetensors"), *bad = tmp_path("ck_missing.safetensors");
    const char *nodir = tmp_path("no/such/dir/ck.safetensors");
    float *p0, *m0, *v0;
    int i, dummy[CK_B * CK_T] = {0};
    CHECK_ST(gpt_new(&g, cfg, CK_B, CK_T, 0), PT_OK);
    if (!g.params) return;
    gpt_randomize(&g, 2, 0.1f);
    CHECK_ST(pt_gpt_forward(&g, dummy, dummy, CK_B, CK_T), PT_OK);
    CHECK_ST(pt_gpt_backward(&g), PT_OK);
    pt_gpt_adamw_step(&g, &opt, 1e-3f);
    ZERO(ts);
    ts.step = 1;
    CHECK_ST(pt_checkpoint_save(path, &g, &ts), PT_OK);
    ts.step = 2; /* saving over it replaces it, leaving no temporary */
    CHECK_ST(pt_checkpoint_save(path, &g, &ts), PT_OK);
    CHECK(!file_exists(tmp_path("ck.safetensors.tmp")));
    CHECK_ST(pt_checkpoint_load(path, &g, &got), PT_OK);
    CHECK_EQ(got.step, 2);
    CHECK_EQ(got.checksummed, 1);
    CHECK_ERR(pt_checkpoint_save(nodir, &g, &ts), PT_ERR_IO, "no/such/dir");
    CHECK(!file_exists(nodir));
    CHECK(!file_exists(tmp_path("no/such/dir/ck.safetensors.tmp")));
    /* another config */
    CHECK_ST(gpt_new(&other, cfg_make(32, 16, 1, 2, 16), CK_B, CK_T, 0), PT_OK);
    CHECK_ERR(pt_checkpoint_load(path, &other, &got), PT_ERR_CONFIG, "ck.safetensors");
    pt_gpt_free(&other);
    /* one optimizer tensor missing: error, and g untouched */
    ZERO(st);
    CHECK_ST(pt_st_load(&st, path), PT_OK);
    ZERO(w);
    pt_st_writer_init(&w);
    for (i = 0; i < st.n_meta; i++) pt_st_writer_meta(&w, st.meta[i].key, st.meta[i].value);
    for (i = 0; i < st.n_tensors; i++) {
        const pt_st_tensor *t = &st.tensors[i];
        if (strcmp(t->name, "optim.v.h.1.ln_2.bias") != 0)
            pt_st_writer_add(&w, t->name, t->dtype, t->ndim, t->shape, t->data);
    }
    CHECK_EQ(w.n_tensors, 3 * g.num_tensors - 1);
    CHECK_ST(pt_st_writer_save(&w, bad), PT_OK);
    pt_st_writer_free(&w);
    pt_st_free(&st);
    gpt_randomize(&g, 3, 0.1f);
    g.adam_t = 17;
    p0 = fcopy(g.params, g.num_params), m0 = fcopy(g.m, g.num_params), v0 = fcopy(g.v, g.num_params);
    CHECK_ERR(pt_checkpoint_load(bad, &g, &got), PT_ERR_MISSING, "optim.v.h.1.ln_2.bias");
    CHECK(memcmp(p0, g.params, g.num_params * sizeof(float)) == 0);
    CHECK(memcmp(m0, g.m, g.num_params * sizeof(float)) == 0);
    CHECK(memcmp(v0, g.v, g.num_params * sizeof(float)) == 0);
    CHECK_EQ(g.adam_t, 17);
    /* a flipped byte in a moment: error naming it, and g untouched */
    {
        size_t n = 0;
        unsigned char *img = read_all(path, &n);
        const pt_param *p = pt_gpt_find_param(&g, "h.1.mlp.c_fc.weight");
        if (img && p) {
            img[n - 2 * g.num_params * sizeof(float) + (p->offset + 5) * sizeof(float)] ^= 1;
            write_all(bad, img, n);
            CHECK_ERR(pt_checkpoint_load(bad, &g, &got), PT_ERR_FORMAT,
                      "tensor 'optim.m.h.1.mlp.c_fc.weight' fails its checksum");
            CHECK(strstr(pt_last_error(), "ck_missing.safetensors") != NULL);
            CHECK(memcmp(p0, g.params, g.num_params * sizeof(float)) == 0);
        }
    }
    /* a safetensors file that is not a checkpoint */
    CHECK_ST(write_hf(bad, &g, NULL, NULL), PT_OK);
    CHECK_ERR(pt_checkpoint_load(bad, &g, &got), PT_ERR_FORMAT, "checkpoint");
    CHECK(memcmp(p0, g.params, g.num_params * sizeof(float)) == 0);
    /* a checkpoint written before checksums still loads, and the same */
    strip_checksums(path, bad);
    ZERO(got);
    CHECK_ST(pt_checkpoint_load(bad, &g, &got), PT_OK);
    CHECK_EQ(got.step, 2);
    CHECK_EQ(got.checksummed, 0);
    CHECK_EQ(g.adam_t, 1);
    pt_gpt_free(&g);
}

/* The guard: finite steps pass; a NaN or infinity in gradients is named by
   the tensor backward reaches first (the higher layer); a non-finite loss
   alone or an overflowing norm says "no gradient". Skipping the step keeps
   weights and AdamW state. */
static void test_check_step(void) {
    pt_gpt g;
    pt_adamw_config opt = pt_adamw_default();
    int dummy[CK_B * CK_T] = {0}, bad = -1;
    char where[64];
    size_t n = 0;
    float *gr, norm, *p0, *m0;
    CHECK_ST(gpt_new(&g, cfg_make(32, 16, 2, 2, 16), CK_B, CK_T, 0), PT_OK);
    if (!g.params) return;
    gpt_randomize(&g, 4, 0.1f);
    CHECK_ST(pt_gpt_forward(&g, dummy, dummy, CK_B, CK_T), PT_OK);
    CHECK_ST(pt_gpt_backward(&g), PT_OK);
    CHECK_ST(pt_gpt_clip_grad_norm(&g, 1.0f, &norm), PT_OK);
    CHECK_ST(pt_gpt_check_step(&g, g.loss, norm, &bad, where, sizeof where), PT_OK);
    CHECK(bad == 0 && where[0] == 0);
    CHECK(pt_gpt_grad_of(&g, "h.9.ln_1.bias", &n) == NULL && n == 0);
    gr = pt_gpt_grad_of(&g, "h.0.attn.c_attn.bias", &n);
    CHECK(gr == g.grads + pt_gpt_find_param(&g, "h.0.attn.c_attn.bias")->offset && n == 3 * 16);
    if (gr) gr[n - 1] = INFINITY;
    gr = pt_gpt_grad_of(&g, "h.1.mlp.c_fc.weight", &n);
    if (gr) gr[3] = NAN;
    p0 = fcopy(g.params, g.num_params), m0 = fcopy(g.m, g.num_params);
    CHECK_ST(pt_gpt_clip_grad_norm(&g, 1.0f, &norm), PT_OK);
    CHECK(!isfinite(norm));
    CHECK_ST(pt_gpt_check_step(&g, g.loss, norm, &bad, where, sizeof where), PT_OK);
    CHECK(bad == 1 && strcmp(where, "h.1.mlp.c_fc.weight") == 0);
    if (gr) gr[3] = 0.0f; /* only the lower layer's infinity is left */
    CHECK_ST(pt_gpt_check_step(&g, g.loss, NAN, &bad, where, sizeof where), PT_OK);
    CHECK(bad == 1 && strcmp(where, "h.0.attn.c_attn.bias") == 0);
    CHECK_ST(pt_gpt_forward(&g, dummy, dummy, CK_B, CK_T), PT_OK);
    CHECK_ST(pt_gpt_backward(&g), PT_OK); /* gradients finite again */
    CHECK_ST(pt_gpt_check_step(&g, NAN, 1.0f, &bad, where, sizeof where), PT_OK);
    CHECK(bad == 1 && strcmp(where, "no gradient") == 0);
    CHECK_ST(pt_gpt_check_step(&g, 1.0f, INFINITY, &bad, NULL, 0), PT_OK);
    CHECK_EQ(bad, 1);
    CHECK(memcmp(p0, g.params, g.num_params * sizeof(float)) == 0); /* nothing was stepped */
    CHECK(memcmp(m0, g.m, g.num_params * sizeof(float)) == 0);
    pt_gpt_adamw_step(&g, &opt, 1e-3f);
    CHECK(memcmp(p0, g.params, g.num_params * sizeof(float)) != 0);
    pt_gpt_free(&g);
}

/* ======================================================================== */
/* token data and loaders                                                    */
/* ======================================================================== */

static unsigned char *llmc_image(int32_t magic, int32_t version, int32_t count,
                                 const uint16_t *tok, size_t ntok, size_t *size) {
    unsigned char *b = TALLOC(unsigned char, 1024 + 2 * ntok);
    int32_t h[3];
    h[0] = magic, h[1] = version, h[2] = count;
    memcpy(b, h, sizeof h); /* little-endian host */
    if (ntok) memcpy(b + 1024, tok, 2 * ntok);
    *size = 1024 + 2 * ntok;
    return b;
}

/* version 2 (uint32 ids, as pt_tokens_write_llmc writes ids over 65,535):
   read into data32 whole, its vocabulary the largest id + 1, cut into
   batches, checked, counted; a top id over 2^31-2 refused */
static void test_tokens_wide(const char *bin) {
    int ids[9] = {128000, 5, 70000, 65535, 65536, 1, 128255, 0, 99999}, in[4], out[4];
    uint32_t bad[2] = {3, 0x80000000u};
    unsigned char img[1024 + sizeof bad];
    int32_t h[3] = {20240520, 2, 2};
    pt_tokens t;
    pt_loader l;
    pt_loader_desc d;
    size_t i;
    CHECK_ST(pt_tokens_write_llmc(bin, ids, 9, NULL), PT_OK);
    ZERO(t);
    CHECK_ST(pt_tokens_load(&t, bin, PT_TOKENS_AUTO), PT_OK);
    CHECK(t.n == 9 && t.data == NULL && t.data32 != NULL && t.vocab_size == 128256);
    for (i = 0; i < 9 && t.data32; i++) CHECK_EQ(pt_tokens_at(&t, i), ids[i]);
    CHECK_ST(pt_tokens_check(&t, 128256), PT_OK);
    CHECK_ERR(pt_tokens_check(&t, 128255), PT_ERR_RANGE, "128255 at position 6");
    CHECK_NEAR(pt_tokens_unigram_entropy(&t, 0, 2), log(2.0), 1e-12); /* 128000 and 5 */
    CHECK_NEAR(pt_tokens_unigram_entropy(&t, 6, 7), 0.0, 1e-15);
    ZERO(d);
    d.batch = 1, d.seq = 4, d.no_shuffle = 1;
    ZERO(l);
    CHECK_ST(pt_loader_init(&l, &t, PT_SPLIT_ALL, &d), PT_OK);
    CHECK_ST(pt_loader_next(&l, in, out), PT_OK); /* the first window: ids 0..4 */
    CHECK(in[0] == 128000 && in[2] == 70000 && out[2] == 65535 && out[3] == 65536);
    CHECK_ST(pt_loader_next(&l, in, out), PT_OK);
    CHECK(in[0] == 65536 && in[2] == 128255 && out[3] == 99999);
    pt_loader_free(&l);
    pt_tokens_free(&t);
    CHECK(t.data32 == NULL && t.n == 0);
    memset(img, 0, sizeof img);
    memcpy(img, h, sizeof h);
    memcpy(img + 1024, bad, sizeof bad);
    ZERO(t);
    CHECK_ERR(pt_tokens_parse_llmc(&t, img, sizeof img), PT_ERR_RANGE, "2147483648");
    CHECK(t.data32 == NULL);
}

static void test_tokens(void) {
    uint16_t tok[5] = {3, 50256, 0, 7, 1000};
    pt_tokens t;
    size_t n;
    unsigned char *img;
    const char *bin = tmp_path("tokens.bin"), *txt = tmp_path("tokens.txt");
    img = llmc_image(20240520, 1, 5, tok, 5, &n);
    ZERO(t);
    CHECK_ST(pt_tokens_parse_llmc(&t, img, n), PT_OK);
    CHECK(t.n == 5 && t.vocab_size == 50257 && t.data && memcmp(t.data, tok, sizeof tok) == 0);
    CHECK_ST(pt_tokens_check(&t, 50257), PT_OK);
    CHECK_ERR(pt_tokens_check(&t, 1000), PT_ERR_RANGE, "50256");
    pt_tokens_free(&t);
    img = llmc_image(20240521, 1, 5, tok, 5, &n);
    CHECK_ERR(pt_tokens_parse_llmc(&t, img, n), PT_ERR_FORMAT, "magic");
    CHECK_MSG("20240521");
    write_all(bin, img, n); /* a ".bin" with a wrong magic is not taken as bytes */
    ZERO(t);
    CHECK_ERR(pt_tokens_load(&t, bin, PT_TOKENS_AUTO), PT_ERR_FORMAT, "magic");
    CHECK_MSG("tokens.bin");
    img = llmc_image(20240520, 3, 5, tok, 5, &n);
    CHECK_ERR(pt_tokens_parse_llmc(&t, img, n), PT_ERR_UNSUPPORTED, "version 3");
    img = llmc_image(20240520, 2, 5, tok, 5, &n); /* 10 bytes: 2 uint32 and a half */
    CHECK_ERR(pt_tokens_parse_llmc(&t, img, n), PT_ERR_FORMAT, "only 2");
    img = llmc_image(20240520, 1, 6, tok, 5, &n);
    CHECK_ERR(pt_tokens_parse_llmc(&t, img, n), PT_ERR_FORMAT, "6");
    img = llmc_image(20240520, 1, -1, tok, 5, &n);
    CHECK_ST(pt_tokens_parse_llmc(&t, img, n), PT_ERR_FORMAT);
    CHECK_ERR(pt_tokens_parse_llmc(&t, img, 1000), PT_ERR_FORMAT, "1000");
    ZERO(t);
    CHECK_ERR(pt_tokens_load(&t, tmp_path("missing.bin"), PT_TOKENS_AUTO), PT_ERR_IO, "missing.bin");
    write_all(txt, "hello", 5); /* anything but .bin is bytes */
    ZERO(t);
    CHECK_ST(pt_tokens_load(&t, txt, PT_TOKENS_AUTO), PT_OK);
    CHECK(t.n == 5 && t.vocab_size == 256 && t.data && t.data[0] == 'h' && t.data[4] == 'o');
    pt_tokens_free(&t);
    img = llmc_image(20240520, 1, 5, tok, 5, &n);
    write_all(bin, img, n);
    ZERO(t);
    CHECK_ST(pt_tokens_load(&t, bin, PT_TOKENS_AUTO), PT_OK);
    CHECK(t.n == 5 && t.data && t.data[1] == 50256);
    pt_tokens_free(&t);
    { /* entropy: first 40 alternate 0,1; next 40 cycle 0..3 */
        uint16_t d[80];
        int i;
        for (i = 0; i < 40; i++) d[i] = (uint16_t)(i % 2), d[40 + i] = (uint16_t)(i % 4);
        ZERO(t);
        t.data = d, t.n = 80, t.vocab_size = 4;
        CHECK_NEAR(pt_tokens_unigram_entropy(&t, 0, 40), log(2.0), 1e-12);
        CHECK_NEAR(pt_tokens_unigram_entropy(&t, 40, 80), log(4.0), 1e-12);
        CHECK_NEAR(pt_tokens_unigram_entropy(&t, 0, 80),
                   -2 * 0.375 * log(0.375) - 2 * 0.125 * log(0.125), 1e-12);
        CHECK_NEAR(pt_tokens_unigram_entropy(&t, 0, 1), 0.0, 1e-15);
    }
    test_tokens_wide(bin);
}

/* Token i has value i, so every window shows where it came from. */
static pt_tokens iota_tokens(size_t n) {
    pt_tokens t;
    size_t i;
    ZERO(t);
    t.data = TALLOC(uint16_t, n);
    for (i = 0; i < n; i++) t.data[i] = (uint16_t)i;
    t.n = n;
    t.vocab_size = 65536;
    return t;
}
static pt_loader_desc loader_desc(int B, int T, uint64_t seed) {
    pt_loader_desc d;
    ZERO(d);
    d.batch = B, d.seq = T, d.seed = seed;
    return d;
}
/* The windows (start token) of `rows` consecutive rows; checks the shift by one. */
static void draw_windows(pt_loader *l, int rows, int *starts) {
    int *in = TALLOC(int, l->B * l->T), *tg = TALLOC(int, l->B * l->T), r, b, i;
    for (r = 0; r < rows; r += l->B) {
        pt_loader_next(l, in, tg);
        for (b = 0; b < l->B && r + b < rows; b++) {
            starts[r + b] = in[b * l->T];
            for (i = 0; i < l->T; i++)
                if (in[b * l->T + i] != starts[r + b] + i || tg[b * l->T + i] != starts[r + b] + i + 1) {
                    FAIL("row %d: inputs/targets are not a window shifted by one", r + b);
                    return;
                }
        }
    }
}

static void test_loader_epochs(void) {
    enum { NW = 25, T = 4, B = 3 };
    pt_tokens t = iota_tokens(NW * T + 1);
    pt_loader_desc d = loader_desc(B, T, 9);
    pt_loader l, l2;
    int s1[3 * NW], s2[3 * NW], e, k, seen[NW], differ = 0, inorder = 1;
    ZERO(l), ZERO(l2);
    CHECK_ST(pt_loader_init(&l, &t, PT_SPLIT_ALL, &d), PT_OK);
    CHECK_EQ(l.n_windows, NW);
    draw_windows(&l, 3 * NW, s1);
    for (e = 0; e < 3; e++) { /* every epoch visits every window exactly once */
        memset(seen, 0, sizeof seen);
        for (k = 0; k < NW; k++) {
            int s = s1[e * NW + k];
            if (s % T != 0 || s < 0 || s / T >= NW || seen[s / T]++) {
                FAIL("epoch %d: window start %d is misplaced or repeated", e, s);
                break;
            }
        }
    }
    for (k = 0; k < NW; k++) {
        differ += s1[k] != s1[NW + k];
        inorder &= s1[k] == k * T;
    }
    CHECK(differ > 0); /* a fresh permutation per epoch */
    CHECK(!inorder);
    CHECK_ST(pt_loader_init(&l2, &t, PT_SPLIT_ALL, &d), PT_OK); /* same seed, same batches */
    draw_windows(&l2, 3 * NW, s2);
    CHECK(memcmp(s1, s2, sizeof s1) == 0);
    pt_loader_free(&l2);
    d.seed = 10;
    CHECK_ST(pt_loader_init(&l2, &t, PT_SPLIT_ALL, &d), PT_OK);
    draw_windows(&l2, 3 * NW, s2);
    CHECK(memcmp(s1, s2, sizeof s1) != 0);
    pt_loader_free(&l2);
    d.no_shuffle = 1;
    CHECK_ST(pt_loader_init(&l2, &t, PT_SPLIT_ALL, &d), PT_OK);
    draw_windows(&l2, NW, s2);
    for (k = 0; k < NW; k++) CHECK_EQ(s2[k], k * T);
    pt_loader_free(&l2);
    /* seek to where a loader got naturally (epoch 1, mid-way), then both cross into epoch 2 */
    d.no_shuffle = 0, d.seed = 9;
    pt_loader_free(&l);
    CHECK_ST(pt_loader_init(&l, &t, PT_SPLIT_ALL, &d), PT_OK);
    draw_windows(&l, 11 * B, s1);
    CHECK_EQ(l.epoch, 1);
    CHECK_ST(pt_loader_init(&l2, &t, PT_SPLIT_ALL, &d), PT_OK);
    pt_loader_seek(&l2, l.epoch, l.pos);
    draw_windows(&l, 10 * B, s1);
    draw_windows(&l2, 10 * B, s2);
    CHECK(memcmp(s1, s2, sizeof(int) * 10 * B) == 0);
    CHECK(l.epoch == 2 && l2.epoch == 2 && l.pos == l2.pos);
    pt_loader_free(&l);
    pt_loader_free(&l2);
}

static void test_loader_splits(void) {
    enum { T = 16 };
    pt_tokens t = iota_tokens(1000), small = iota_tokens(12);
    pt_loader_desc d = loader_desc(4, T, 3);
    pt_loader tr, va;
    int s[64], seen[64], k;
    d.val_fraction = 0.2f; /* train [0, 800), val [800, 1000) */
    ZERO(tr), ZERO(va);
    CHECK_ST(pt_loader_init(&tr, &t, PT_SPLIT_TRAIN, &d), PT_OK);
    CHECK_ST(pt_loader_init(&va, &t, PT_SPLIT_VAL, &d), PT_OK);
    CHECK_EQ(tr.n_windows, 799 / T);
    CHECK_EQ(va.n_windows, 199 / T);
    draw_windows(&tr, 799 / T, s);
    memset(seen, 0, sizeof seen);
    for (k = 0; k < 799 / T; k++) /* every train window once, all tokens (targets too) < 800 */
        if (s[k] % T != 0 || s[k] + T >= 800 || seen[s[k] / T]++) FAIL("train window at %d", s[k]);
    draw_windows(&va, 199 / T, s);
    for (k = 0; k < 199 / T; k++) CHECK_EQ(s[k], 800 + k * T); /* in order, from 800 */
    CHECK(s[199 / T - 1] + T < 1000);
    pt_loader_free(&tr);
    pt_loader_free(&va);
    ZERO(va);
    CHECK_ERR(pt_loader_init(&va, &small, PT_SPLIT_ALL, &d), PT_ERR_CONFIG, "17");
    d.val_fraction = 0.1f; /* 1 validation token */
    CHECK_ERR(pt_loader_init(&va, &small, PT_SPLIT_VAL, &d), PT_ERR_CONFIG, "validation");
    d.seq = 0;
    CHECK_ST(pt_loader_init(&va, &t, PT_SPLIT_ALL, &d), PT_ERR_CONFIG);
}

/* ======================================================================== */
/* generation                                                                */
/* ======================================================================== */

static int argmax(const float *x, int n) {
    int i, best = 0;
    for (i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static void test_decode_matches_forward(void) {
    enum { V = 17, BS = 8, T = 8 };
    pt_gpt g;
    pt_kv_cache kv;
    const float *lg = NULL;
    int *tok = rand_ids(T, V), t, i;
    float *logits = TALLOC(float, T * V);
    double mx = 0.0;
    CHECK_ST(gpt_new(&g, cfg_make(V, BS, 2, 2, 16), 1, T, 0), PT_OK);
    if (!g.params) return;
    gpt_randomize(&g, 4, 0.2f);
    CHECK_ST(pt_gpt_forward(&g, tok, NULL, 1, T), PT_OK);
    CHECK_ST(pt_gpt_gather_logits(&g, logits), PT_OK);
    for (i = 0; i < T * V; i++) mx = fmax(mx, fabs(logits[i]));
    CHECK_ST(pt_kv_cache_init(&kv, &g), PT_OK);
    for (t = 0; t < T; t++) {
        char what[48];
        CHECK_ST(pt_gpt_decode(&g, &kv, tok[t], &lg), PT_OK);
        snprintf(what, sizeof what, "decode logits at position %d", t);
        if (lg) CHECK_CLOSE(what, lg, to_double(logits + t * V, V), V, 1e-4 * mx, 0);
    }
    CHECK_EQ(kv.len, T);
    CHECK_ERR(pt_gpt_decode(&g, &kv, tok[0], &lg), PT_ERR_RANGE, "full");
    pt_kv_cache_reset(&kv);
    CHECK_ERR(pt_gpt_decode(&g, &kv, V, &lg), PT_ERR_RANGE, "17");
    pt_kv_cache_free(&kv);
    pt_gpt_free(&g);
}

/* How many of x[0..n) exceed x[i]: token i survives top-k iff this is < k (ties included). */
static int n_greater(const float *x, int n, int i) {
    int j, c = 0;
    for (j = 0; j < n; j++) c += x[j] > x[i];
    return c;
}

static void test_sample_logits(void) {
    enum { V = 50, DRAWS = 3000 };
    float *lg = frand(V, -3, 3), work[V];
    int i, j, a, best = argmax(lg, V), count[V] = {0};
    pt_rng r, r2;
    pt_rng_seed(&r, 1);
    CHECK_EQ(pt_sample_logits(lg, V, 0.0f, 0, &r, work), best);
    CHECK_EQ(pt_sample_logits(lg, V, 0.0f, 5, &r, work), best);
    for (i = 0; i < 200; i++)
        if ((a = pt_sample_logits(lg, V, i % 2 ? 10.0f : 0.7f, 1, &r, work)) != best) {
            FAIL("top_k=1 sampled %d, argmax is %d", a, best);
            break;
        }
    for (i = 0; i < DRAWS; i++) { /* top_k=5 at a high temperature: exactly the 5 largest */
        if ((a = pt_sample_logits(lg, V, 5.0f, 5, &r, work)) < 0 || a >= V) {
            FAIL("sampled %d outside [0, %d)", a, V);
            break;
        }
        count[a]++;
    }
    for (i = 0; i < V; i++) {
        int rank = n_greater(lg, V, i);
        if (rank < 5 && count[i] == 0) FAIL("top-%d token %d never sampled", rank + 1, i);
        if (rank >= 5 && count[i] != 0)
            FAIL("token %d (rank %d) sampled %d times with top_k=5", i, rank + 1, count[i]);
    }
    for (i = 0; i < 300; i++) { /* many ties: never below the k-th largest value */
        float t[20];
        int k = 1 + irand(20), d;
        for (j = 0; j < 20; j++) t[j] = (float)irand(4);
        for (d = 0; d < 10; d++)
            if ((a = pt_sample_logits(t, 20, 2.0f, k, &r, work)) < 0 || a >= 20 || n_greater(t, 20, a) >= k) {
                FAIL("top_k=%d sampled token %d, not among the k largest", k, a);
                i = 300;
                break;
            }
    }
    { /* no top-k: frequencies follow softmax(logits / temperature) */
        float l4[4] = {0.0f, 1.0f, 2.0f, -1.0f};
        double temps[2] = {1.0, 2.0};
        int tt, c4[4];
        for (tt = 0; tt < 2; tt++) {
            double z = 0.0;
            memset(c4, 0, sizeof c4);
            for (i = 0; i < 40000; i++) c4[pt_sample_logits(l4, 4, (float)temps[tt], 0, &r, work)]++;
            for (i = 0; i < 4; i++) z += exp(l4[i] / temps[tt]);
            for (i = 0; i < 4; i++) CHECK_NEAR(c4[i] / 40000.0, exp(l4[i] / temps[tt]) / z, 0.012);
        }
    }
    pt_rng_seed(&r, 42), pt_rng_seed(&r2, 42);
    for (i = 0; i < 100; i++)
        CHECK_EQ(pt_sample_logits(lg, V, 1.0f, 10, &r, work), pt_sample_logits(lg, V, 1.0f, 10, &r2, work));
}

static void test_generate(void) {
    enum { V = 17, BS = 8 };
    pt_gpt g;
    pt_kv_cache kv;
    pt_sample_desc sd;
    int prompt[5] = {1, 5, 16, 0, 3}, out[20], out2[20], ctx[BS], i, n;
    float *logits = TALLOC(float, BS * V);
    CHECK_ST(gpt_new(&g, cfg_make(V, BS, 2, 2, 16), 1, BS, 0), PT_OK);
    if (!g.params) return;
    gpt_randomize(&g, 8, 0.3f);
    CHECK_ST(pt_kv_cache_init(&kv, &g), PT_OK);
    ZERO(sd);
    sd.temperature = 1.0f, sd.top_k = 0, sd.seed = 3;
    CHECK_ST(pt_gpt_generate(&g, &kv, prompt, 5, out, 20, &sd), PT_OK); /* 25 > block_size */
    for (i = 0; i < 20; i++) CHECK(out[i] >= 0 && out[i] < V);
    CHECK_ST(pt_gpt_generate(&g, &kv, prompt, 5, out2, 20, &sd), PT_OK);
    CHECK(memcmp(out, out2, sizeof out) == 0);
    sd.seed = 4;
    CHECK_ST(pt_gpt_generate(&g, &kv, prompt, 5, out2, 20, &sd), PT_OK);
    CHECK(memcmp(out, out2, sizeof out) != 0);
    /* greedy: each token is the argmax of a forward over the documented context,
       which, when full, restarts from the last block_size/2 tokens */
    sd.temperature = 0.0f;
    CHECK_ST(pt_gpt_generate(&g, &kv, prompt, 5, out, 20, &sd), PT_OK);
    memcpy(ctx, prompt, sizeof prompt);
    for (i = 0, n = 5; i < 20; i++) {
        if (i > 0) {
            if (n == BS) memmove(ctx, ctx + BS / 2, sizeof(int) * (BS / 2)), n = BS / 2;
            ctx[n++] = out[i - 1];
        }
        CHECK_ST(pt_gpt_forward(&g, ctx, NULL, 1, n), PT_OK);
        CHECK_ST(pt_gpt_gather_logits(&g, logits), PT_OK);
        if (argmax(logits + (n - 1) * V, V) != out[i]) {
            FAIL("greedy token %d is %d, argmax over its context is %d", i, out[i],
                 argmax(logits + (n - 1) * V, V));
            break;
        }
    }
    CHECK_ST(pt_gpt_generate(&g, &kv, prompt, 0, out, 5, &sd), PT_ERR_INVALID_ARG);
    prompt[2] = V;
    CHECK_ERR(pt_gpt_generate(&g, &kv, prompt, 5, out, 5, &sd), PT_ERR_RANGE, "prompt[2]");
    pt_kv_cache_free(&kv);
    pt_gpt_free(&g);
}

/* ======================================================================== */
/* status codes and per-thread errors                                        */
/* ======================================================================== */

/* A model built for inference has weights and forward activations only, and
   refuses training calls with a message instead of touching NULL buffers. */
static void test_inference_model(void) {
    pt_gpt_config c = cfg_make(32, 16, 2, 2, 16);
    pt_gpt train, inf;
    pt_gpt_desc d;
    pt_adamw_config opt = pt_adamw_default();
    int x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8] = {2, 3, 4, 5, 6, 7, 8, 9};
    memset(&d, 0, sizeof d);
    d.config = c;
    d.batch = 1;
    d.seq = 8;
    CHECK_ST(pt_gpt_init(&train, &d), PT_OK);
    d.inference = 1;
    CHECK_ST(pt_gpt_init(&inf, &d), PT_OK);
    CHECK(inf.grads == NULL && inf.m == NULL && inf.v == NULL);
    CHECK_EQ(inf.mem.grads + inf.mem.optimizer, 0);
    CHECK_EQ(inf.mem.params, train.mem.params);
    CHECK(inf.mem.total < train.mem.total);
    pt_gpt_init_weights(&train, 3);
    memcpy(inf.params, train.params, train.num_params * sizeof(float));
    CHECK_ST(pt_gpt_forward(&train, x, y, 1, 8), PT_OK);
    CHECK_ST(pt_gpt_forward(&inf, x, y, 1, 8), PT_OK);
    CHECK(memcmp(&inf.loss, &train.loss, sizeof(float)) == 0);
    CHECK_ERR(pt_gpt_backward(&inf), PT_ERR_INVALID_ARG, "inference");
    CHECK_ERR(pt_gpt_adamw_step(&inf, &opt, 1e-3f), PT_ERR_INVALID_ARG, "inference");
    CHECK_ERR(pt_checkpoint_save(tmp_path("inf.safetensors"), &inf, NULL), PT_ERR_INVALID_ARG,
              "inference");
    {
        float norm = -1.0f;
        CHECK_ERR(pt_gpt_clip_grad_norm(&inf, 1.0f, &norm), PT_ERR_INVALID_ARG, "inference");
        CHECK(norm == 0.0f);
    }
    pt_gpt_free(&inf);
    pt_gpt_free(&train);
}

static void test_writer_and_file_errors(void) {
    pt_st_writer w;
    pt_safetensors st;
    pt_tokens t;
    float a[2] = {1, 2};
    int64_t shape[1] = {2};
    memset(&w, 0, sizeof w);
    pt_st_writer_init(&w);
    CHECK_ST(pt_st_writer_add(&w, "a", PT_F32, 1, shape, a), PT_OK);
    CHECK_ERR(pt_st_writer_add(&w, "a", PT_F32, 1, shape, a), PT_ERR_INVALID_ARG, "'a'");
    CHECK_EQ(w.n_tensors, 1);
    CHECK_ST(pt_st_writer_save(&w, tmp_path("dup.safetensors")), PT_OK);
    pt_st_writer_free(&w);
    memset(&st, 0, sizeof st);
    CHECK_ST(pt_st_load(&st, tmp_path("dup.safetensors")), PT_OK); /* the writer's file reads */
    pt_st_free(&st);
    /* a directory is an I/O error naming the path, not an allocation failure */
    memset(&st, 0, sizeof st);
    CHECK_ERR(pt_st_load(&st, "/tmp"), PT_ERR_IO, "/tmp");
    memset(&t, 0, sizeof t);
    CHECK_ERR(pt_tokens_load(&t, "/tmp", PT_TOKENS_BYTES), PT_ERR_IO, "/tmp");
    CHECK(t.data == NULL);
    pt_tokens_free(&t); /* safe after a failed load */
}

/* The vectorisable exp behind softmax and GELU: within 2 ulp of exp over the
   whole float range it serves, exactly 0 below it (no subnormals), NaN kept.
   Read through the public cross-entropy pair: backward with lse = 0 and
   dloss = 1 writes dlogits[v] = exp(logits[v]) for each v but the target
   (the last column here), and forward's lse sums exps of a row. */
static float xent_exp(float x) {
    float l[2] = {x, 0.0f}, d[2];
    double lse = 0.0;
    int t = 1;
    pt_crossentropy_backward(d, l, &lse, &t, 1, 2, 1.0f);
    return d[0];
}
static void test_fast_exp(void) {
    double worst = 0.0, lse;
    float x, loss;
    int t = 0;
    for (x = -87.0f; x < 88.0f; x += 0.00037f) {
        double e = exp((double)x), r = fabs((double)xent_exp(x) - e) / e;
        if (r > worst) worst = r;
    }
    CHECK(worst < 2.0 * 5.96e-8);
    CHECK(xent_exp(0.0f) == 1.0f);
    CHECK(xent_exp(-100.0f) == 0.0f);
    CHECK(xent_exp(-INFINITY) == 0.0f);
    CHECK(isnan(xent_exp(NAN)));
    CHECK(isnan(xent_exp(-NAN)));
    CHECK(xent_exp(-0.0f) == 1.0f);
    CHECK(xent_exp(88.3f) > 2.1e38f && isfinite(xent_exp(88.3f)));
    CHECK(isinf(xent_exp(88.4f)) && isinf(xent_exp(1e30f)) && isinf(xent_exp(INFINITY)));
    CHECK(xent_exp(-87.29f) > 0.0f && xent_exp(-87.31f) == 0.0f);
    pt_crossentropy_forward(&loss, &lse, (const float[]){0.0f, -1.0f, -2.0f}, &t, 1, 3);
    CHECK(exp(lse) > 1.5032 && exp(lse) < 1.5033); /* 1 + e^-1 + e^-2 */
}

static void test_status_strings(void) {
    int a, b;
    for (a = 0; a < PT_STATUS_COUNT; a++) {
        const char *s = pt_status_str((pt_status)a);
        CHECK(s && s[0]);
        CHECK(pt_status_name((pt_status)a)[0]);
        for (b = 0; b < a; b++) {
            CHECK(strcmp(s, pt_status_str((pt_status)b)) != 0);
            CHECK(strcmp(pt_status_name((pt_status)a), pt_status_name((pt_status)b)) != 0);
        }
    }
    CHECK(strcmp(pt_status_name(PT_OK), "PT_OK") == 0);
    CHECK(strstr(pt_status_str(PT_ERR_FORMAT), "PT_ERR_FORMAT") != NULL);
    CHECK(pt_status_str(PT_STATUS_COUNT) != NULL);
}

static void *thread_error(void *arg) {
    pt_gpt_config c;
    char *out = (char *)arg;
    out[0] = pt_last_error()[0] == 0 ? 'E' : 'X'; /* a new thread starts clean */
    pt_gpt_config_preset("preset-of-thread-two", &c);
    snprintf(out + 1, 1024, "%s", pt_last_error());
    return NULL;
}

static void test_thread_local_error(void) {
    pthread_t th;
    pt_gpt_config c;
    char other[1025] = {0};
    CHECK_ST(pt_gpt_config_preset("preset-of-thread-one", &c), PT_ERR_CONFIG);
    if (pthread_create(&th, NULL, thread_error, other) != 0) {
        FAIL("pthread_create failed");
        return;
    }
    pthread_join(th, NULL);
    CHECK(other[0] == 'E');
    CHECK(strstr(other + 1, "preset-of-thread-two") != NULL);
    CHECK_MSG("preset-of-thread-one");
    CHECK(strstr(pt_last_error(), "thread-two") == NULL);
}


/* ======================================================================== */
/* pipeline schedules                                                        */
/* ======================================================================== */

/* Every kind at many (p, v, m): the checker accepts it, the peak activations
   in flight and the unit-time bubble are the textbook ones: GPipe holds all m
   micro-batches, 1F1B min(m, p - s) on stage s, ZB-H1 min(m, p) everywhere,
   interleaved (counting (micro-batch, chunk) pairs) its warm-up forwards
   2(p - s - 1) + (v - 1)p plus the one forward before the first backward,
   at most all vm; GPipe and 1F1B idle (p-1)/(m+p-1) of the time, interleaved
   (p-1)/(vm+p-1). ZB-H1 (F, B, W one slot each): the last stage alternates
   F and B, so micro-batch m-1's backward leaves it at p - 1 + 2m and reaches
   stage 0 p - 1 slots later, whose W ends the step at 2m + 2p - 1; the last
   stage's m deferred W's end it at 3m + p - 1. So the step is
   p - 1 + max(3m, 2m + p) slots of which 3m are busy: p-1 of 3m + p - 1 idle
   once m >= p (a third of 1F1B's), more for m < p. */
static void test_schedule_kinds(void) {
    int p, v, m, k, st;
    pt_schedule d;
    ZERO(d); /* 0, the default: 1F1B, or interleaved with chunks */
    CHECK_ST(pt_schedule_build(&d, PT_SCHED_DEFAULT, 4, 1, 8), PT_OK);
    CHECK(d.kind == PT_SCHED_1F1B);
    pt_schedule_free(&d);
    CHECK_ST(pt_schedule_build(&d, PT_SCHED_DEFAULT, 4, 2, 8), PT_OK);
    CHECK(d.kind == PT_SCHED_INTERLEAVED);
    pt_schedule_free(&d);
    for (k = PT_SCHED_DEFAULT + 1; k < PT_SCHED_COUNT; k++)
        for (p = 1; p <= 8; p++)
            for (v = 1; v <= 3; v++)
                for (m = 1; m <= 16; m++) {
                    pt_schedule s;
                    pt_schedule_report r;
                    double want;
                    int interleaved = k == PT_SCHED_INTERLEAVED;
                    if (k > PT_SCHED_ZB_H1) continue; /* zb-h2 on: test_schedule_zb_more */
                    if ((interleaved && (v < 2 || m % p)) || (!interleaved && v > 1)) continue;
                    ZERO(s);
                    CHECK_ST(pt_schedule_build(&s, (pt_schedule_kind)k, p, v, m), PT_OK);
                    if (g_fail) return;
                    if (pt_schedule_check(&s, &r) != PT_OK) {
                        FAIL("%s p=%d v=%d m=%d: %s", pt_schedule_kind_name((pt_schedule_kind)k), p,
                             v, m, pt_last_error());
                        pt_schedule_free(&s);
                        return;
                    }
                    for (st = 0; st < p; st++) {
                        int peak = k == PT_SCHED_GPIPE ? m
                                   : k == PT_SCHED_1F1B ? (m < p - st ? m : p - st)
                                   : k == PT_SCHED_ZB_H1 ? (m < p ? m : p)
                                   : (2 * (p - st - 1) + (v - 1) * p + 1 < v * m
                                          ? 2 * (p - st - 1) + (v - 1) * p + 1 : v * m);
                        if (r.peak_inflight[st] != peak)
                            FAIL("%s p=%d m=%d stage %d: peak in flight %d, expected %d",
                                 pt_schedule_kind_name((pt_schedule_kind)k), p, m, st,
                                 r.peak_inflight[st], peak);
                    }
                    if (k == PT_SCHED_GPIPE || k == PT_SCHED_1F1B)
                        want = (double)(p - 1) / (m + p - 1);
                    else if (interleaved)
                        want = (double)(p - 1) / (v * m + p - 1);
                    else
                        want = 1.0 - 3.0 * m / (p - 1 + (3 * m > 2 * m + p ? 3 * m : 2 * m + p));
                    if (fabs(r.bubble - want) > 1e-12)
                        FAIL("%s p=%d v=%d m=%d: bubble %.6f, expected %.6f",
                             pt_schedule_kind_name((pt_schedule_kind)k), p, v, m, r.bubble, want);
                    pt_schedule_free(&s);
                }
}

/* An action kind's name in failure messages. */
static const char *act_name(int kind) {
    static const char *const names[PT_ACT_COUNT] = {
        "forward", "backward", "weight gradient", "send activation", "receive activation",
        "send gradient", "receive gradient", "optimizer step", "replica all-reduce"};
    return kind >= 0 && kind < PT_ACT_COUNT ? names[kind] : "?";
}

/* The index of an action in stage st's list. When it is not there the check
   fails (naming it) and FIND leaves the test at its label out: a changed
   schedule fails the test instead of indexing list[-1]. */
static int find_action_(const char *file, int line, const pt_schedule *s, int st, int kind,
                        int micro, int chunk) {
    int i;
    for (i = 0; st >= 0 && st < s->stages && i < s->count[st]; i++)
        if (s->list[st][i].kind == kind && s->list[st][i].micro == micro &&
            s->list[st][i].chunk == chunk)
            return i;
    failf(file, line, "no %s of micro-batch %d chunk %d on stage %d", act_name(kind), micro,
          chunk, st);
    return -1;
}
/* The index of an action in stage st's list, or -1: for checking that one is
   there or not (CHECK(action_at(...) < 0)), never for indexing. */
static int action_at(const pt_schedule *s, int st, int kind, int micro, int chunk) {
    int i;
    for (i = 0; st >= 0 && st < s->stages && i < s->count[st]; i++)
        if (s->list[st][i].kind == kind && s->list[st][i].micro == micro &&
            s->list[st][i].chunk == chunk)
            return i;
    return -1;
}
#define FIND(i, s, st, kind, micro, chunk) do {                                            \
        if (((i) = find_action_(__FILE__, __LINE__, s, st, kind, micro, chunk)) < 0) goto out; \
    } while (0)

static void drop_action(pt_schedule *s, int st, int i) {
    memmove(&s->list[st][i], &s->list[st][i + 1], sizeof(pt_action) * (size_t)(s->count[st] - i - 1));
    s->count[st]--;
}

/* Broken schedules are refused, each with a message saying what is wrong. */
static void test_schedule_checker_rejects(void) {
    pt_schedule s;
    pt_action tmp;
    int i, j;
    ZERO(s);
    /* a missing W */
    CHECK_ST(pt_schedule_build(&s, PT_SCHED_ZB_H1, 3, 1, 4), PT_OK);
    FIND(i, &s, 1, PT_ACT_W, 2, 0);
    drop_action(&s, 1, i);
    CHECK_ERR(pt_schedule_check(&s, NULL), PT_ERR_CONFIG, "optimizer step comes before the weight gradient of micro-batch 2");
    pt_schedule_free(&s);
    /* swapped send and receive on stage 1: it waits for a gradient before sending the
       activation stage 2 needs to produce it */
    CHECK_ST(pt_schedule_build(&s, PT_SCHED_1F1B, 3, 1, 4), PT_OK);
    FIND(i, &s, 1, PT_ACT_SEND_ACT, 0, 0);
    FIND(j, &s, 1, PT_ACT_RECV_GRAD, 0, 0);
    CHECK(j > i);
    if (j <= i) goto out;
    tmp = s.list[1][i], s.list[1][i] = s.list[1][j], s.list[1][j] = tmp;
    CHECK_ERR(pt_schedule_check(&s, NULL), PT_ERR_CONFIG, "deadlock");
    CHECK_MSG("stage 1 waits");
    pt_schedule_free(&s);
    /* a cycle: under GPipe stage 1 forwards micro-batch 1 before backpropagating 0; make
       stage 0 wait for micro-batch 0's gradient before it forwards micro-batch 1 */
    CHECK_ST(pt_schedule_build(&s, PT_SCHED_GPIPE, 2, 1, 2), PT_OK);
    FIND(i, &s, 0, PT_ACT_F, 1, 0);
    FIND(j, &s, 0, PT_ACT_RECV_GRAD, 0, 0);
    CHECK(j > i);
    if (j <= i) goto out;
    tmp = s.list[0][j];
    memmove(&s.list[0][i + 1], &s.list[0][i], sizeof(pt_action) * (size_t)(j - i));
    s.list[0][i] = tmp;
    CHECK_ERR(pt_schedule_check(&s, NULL), PT_ERR_CONFIG, "deadlock: stage 0 waits at action 2 "
              "(receive gradient of micro-batch 0 chunk 0 from stage 1); stage 1 waits at action 2 "
              "(receive activation of micro-batch 1 chunk 0 from stage 0)");
    pt_schedule_free(&s);
    /* a backward before its forward */
    CHECK_ST(pt_schedule_build(&s, PT_SCHED_GPIPE, 1, 1, 3), PT_OK);
    FIND(i, &s, 0, PT_ACT_F, 2, 0);
    FIND(j, &s, 0, PT_ACT_B, 2, 0);
    tmp = s.list[0][i], s.list[0][i] = s.list[0][j], s.list[0][j] = tmp;
    CHECK_ERR(pt_schedule_check(&s, NULL), PT_ERR_CONFIG, "backward of micro-batch 2 chunk 0 before its forward");
    pt_schedule_free(&s);
    /* a send to the wrong stage, and a send nobody receives */
    CHECK_ST(pt_schedule_build(&s, PT_SCHED_1F1B, 3, 1, 2), PT_OK);
    FIND(i, &s, 0, PT_ACT_SEND_ACT, 1, 0);
    s.list[0][i].peer = 2;
    CHECK_ERR(pt_schedule_check(&s, NULL), PT_ERR_CONFIG, "goes to stage 2, but virtual stage 1 is on stage 1");
    s.list[0][i].peer = 1;
    FIND(j, &s, 1, PT_ACT_RECV_ACT, 1, 0);
    drop_action(&s, 1, j);
    CHECK_ERR(pt_schedule_check(&s, NULL), PT_ERR_CONFIG, "forward of micro-batch 1 chunk 0 before its input arrived");
    pt_schedule_free(&s);
    /* a duplicated forward; the optimizer step not last */
    CHECK_ST(pt_schedule_build(&s, PT_SCHED_GPIPE, 1, 1, 2), PT_OK);
    FIND(i, &s, 0, PT_ACT_F, 1, 0);
    s.list[0][i].micro = 0;
    CHECK_ERR(pt_schedule_check(&s, NULL), PT_ERR_CONFIG, "forward of micro-batch 0 chunk 0 twice");
    pt_schedule_free(&s);
    CHECK_ST(pt_schedule_build(&s, PT_SCHED_GPIPE, 1, 1, 2), PT_OK);
    tmp = s.list[0][s.count[0] - 1], s.list[0][s.count[0] - 1] = s.list[0][0], s.list[0][0] = tmp;
    CHECK_ERR(pt_schedule_check(&s, NULL), PT_ERR_CONFIG, "optimizer step is action 0");
out:
    pt_schedule_free(&s);
}

static void test_schedule_config_errors(void) {
    pt_schedule s;
    pt_schedule_kind k = PT_SCHED_GPIPE;
    ZERO(s);
    CHECK_ERR(pt_schedule_build(&s, PT_SCHED_INTERLEAVED, 4, 2, 6), PT_ERR_CONFIG,
              "interleaved needs micro-batches divisible by stages (Megatron-LM): m=6, p=4");
    CHECK_ERR(pt_schedule_build(&s, PT_SCHED_INTERLEAVED, 4, 1, 8), PT_ERR_CONFIG, "chunks >= 2");
    CHECK_ERR(pt_schedule_build(&s, PT_SCHED_1F1B, 4, 2, 8), PT_ERR_CONFIG, "use interleaved");
    CHECK_ERR(pt_schedule_build(&s, PT_SCHED_GPIPE, 65, 1, 8), PT_ERR_CONFIG, "stages=65");
    CHECK_ERR(pt_schedule_build(&s, PT_SCHED_GPIPE, 2, 1, 0), PT_ERR_CONFIG, "micro-batches=0");
    CHECK_ERR(pt_schedule_kind_parse("2f2b", &k), PT_ERR_CONFIG, "unknown schedule '2f2b'");
    CHECK_ST(pt_schedule_kind_parse("zb-h1", &k), PT_OK);
    CHECK_EQ(k, PT_SCHED_ZB_H1);
    CHECK_ERR(pt_schedule_check(&s, NULL), PT_ERR_INVALID_ARG, "empty");
}

/* The text grid: GPipe on 2 stages, 2 micro-batches, drawn slot by slot. */
static void test_schedule_format(void) {
    pt_schedule s;
    char buf[512], tiny[8];
    size_t n;
    ZERO(s);
    CHECK_ST(pt_schedule_build(&s, PT_SCHED_GPIPE, 2, 1, 2), PT_OK);
    n = pt_schedule_format(&s, buf, sizeof buf);
    CHECK_EQ(n, strlen(buf));
    /* stage 1 runs B0 in slots 3-4; its gradient reaches stage 0 for slot 5 */
    CHECK(strcmp(buf, "stage  0 |F0  F1              B0  B0  B1  B1  \n"
                      "stage  1 |    F0  F1  B0  B0  B1  B1          \n") == 0);
    if (g_fail) printf("%s", buf);
    CHECK_EQ(pt_schedule_format(&s, tiny, sizeof tiny), n); /* too small: the size needed */
    CHECK_EQ(strlen(tiny), 0);
    pt_schedule_free(&s);
}


/* ---- ZB-H2 and ZB-V ---------------------------------------------------- */

/* Every p <= 8, m <= 16: the checker accepts them and, in unit time (F = B =
   W = one slot; a ZB-V chunk holds half a stage's layers), they are the zero
   bubble of Qi et al. once m >= 2p - 1: no idle slot inside any stage's run
   and the makespan is the lower bound 3mv + p - 1 (stage p-1 cannot start
   before slot p-1). ZB-H2 holds min(m, 2p-1) micro-batches on every stage;
   ZB-V at most 2p half-stage chunks, i.e. 1F1B's p whole-stage micro-batches
   (its first stage's peak), and exactly that once m >= p. */
static void test_schedule_zb_more(void) {
    int p, m, k, st;
    for (k = PT_SCHED_ZB_H2; k <= PT_SCHED_ZB_V; k++)
        for (p = 1; p <= 8; p++)
            for (m = 1; m <= 16; m++) {
                pt_schedule s, one;
                pt_schedule_report r, r1;
                int v = k == PT_SCHED_ZB_V ? 2 : 1;
                const char *name = pt_schedule_kind_name((pt_schedule_kind)k);
                ZERO(s), ZERO(one);
                CHECK_ST(pt_schedule_build(&s, (pt_schedule_kind)k, p, v, m), PT_OK);
                CHECK_ST(pt_schedule_build(&one, PT_SCHED_1F1B, p, 1, m), PT_OK);
                if (g_fail) return;
                if (pt_schedule_check(&s, &r) != PT_OK || pt_schedule_check(&one, &r1) != PT_OK) {
                    FAIL("%s p=%d m=%d: %s", name, p, m, pt_last_error());
                    pt_schedule_free(&s), pt_schedule_free(&one);
                    return;
                }
                if (m >= 2 * p - 1 && (r.idle != 0 || r.steps != 3 * m * v + p - 1))
                    FAIL("%s p=%d m=%d: %d idle slots inside the stages' runs, makespan %d "
                         "(zero bubble: 0 and %d)", name, p, m, r.idle, r.steps, 3 * m * v + p - 1);
                if (m < 2 * p - 1 && r.idle == 0) /* and fewer micro-batches cannot fill it */
                    FAIL("%s p=%d m=%d: no idle slot with m < 2p - 1", name, p, m);
                for (st = 0; st < p; st++) {
                    int want = k == PT_SCHED_ZB_H2 ? (m < 2 * p - 1 ? m : 2 * p - 1) : -1;
                    if (want >= 0 && r.peak_inflight[st] != want)
                        FAIL("%s p=%d m=%d stage %d: peak in flight %d, expected %d", name, p, m,
                             st, r.peak_inflight[st], want);
                    if (k == PT_SCHED_ZB_V && (r.peak_inflight[st] > 2 * r1.peak_inflight[0] ||
                                               (m >= p && r.peak_inflight[st] != 2 * p)))
                        FAIL("zb-v p=%d m=%d stage %d: peak %d half-stage chunks, 1F1B's is %d "
                             "whole-stage micro-batches", p, m, st, r.peak_inflight[st],
                             r1.peak_inflight[0]);
                }
                pt_schedule_free(&s), pt_schedule_free(&one);
            }
}

/* ZB-V's V: stage s holds virtual stages s and 2p-1-s, so the last stage
   turns each micro-batch round without a message and the first stage ends
   it; broken variants are refused in words. */
static void test_schedule_zb_more_rejects(void) {
    pt_schedule s;
    pt_schedule_kind k = PT_SCHED_GPIPE;
    int i, j;
    pt_action tmp;
    ZERO(s);
    CHECK_ST(pt_schedule_kind_parse("zb-v", &k), PT_OK);
    CHECK_EQ(k, PT_SCHED_ZB_V);
    CHECK_ST(pt_schedule_kind_parse("zb-h2", &k), PT_OK);
    CHECK_EQ(k, PT_SCHED_ZB_H2);
    CHECK_ERR(pt_schedule_build(&s, PT_SCHED_ZB_V, 4, 1, 8), PT_ERR_CONFIG,
              "zb-v runs two chunks per stage, in a V (chunks=1)");
    CHECK_ERR(pt_schedule_build(&s, PT_SCHED_ZB_H2, 4, 2, 8), PT_ERR_CONFIG,
              "zb-h2 runs one chunk per stage (chunks=2");
    CHECK_ST(pt_schedule_build(&s, PT_SCHED_ZB_V, 3, 2, 5), PT_OK);
    CHECK_ST(pt_schedule_check(&s, NULL), PT_OK);
    /* no message at the turn; stage 0 receives chunk b's input from stage 1 */
    CHECK(action_at(&s, 2, PT_ACT_SEND_ACT, 0, 0) < 0 && action_at(&s, 2, PT_ACT_RECV_ACT, 0, 1) < 0);
    CHECK(action_at(&s, 0, PT_ACT_RECV_ACT, 0, 1) >= 0 && action_at(&s, 0, PT_ACT_SEND_GRAD, 0, 1) >= 0);
    FIND(i, &s, 0, PT_ACT_RECV_ACT, 0, 1);
    CHECK_EQ(s.list[0][i].peer, 1);
    /* the turn's backwards swapped: chunk a before chunk b gave it its gradient */
    FIND(i, &s, 2, PT_ACT_B, 1, 1);
    FIND(j, &s, 2, PT_ACT_B, 1, 0);
    CHECK(i >= 0 && j > i);
    tmp = s.list[2][i], s.list[2][i] = s.list[2][j], s.list[2][j] = tmp;
    CHECK_ERR(pt_schedule_check(&s, NULL), PT_ERR_CONFIG,
              "backward of micro-batch 1 chunk 0 before its output gradient arrived");
    CHECK(strstr(pt_last_error(), "no receive") == NULL); /* it is local: no message missing */
    tmp = s.list[2][i], s.list[2][i] = s.list[2][j], s.list[2][j] = tmp;
    /* chunk b of stage 1 is virtual stage 4: its output goes to 5, on stage 0 (the
       interleaved mapping would put it on stage 2) */
    FIND(i, &s, 1, PT_ACT_SEND_ACT, 2, 1);
    CHECK(i >= 0);
    s.list[1][i].peer = 2;
    CHECK_ERR(pt_schedule_check(&s, NULL), PT_ERR_CONFIG,
              "send activation of micro-batch 2 chunk 1 goes to stage 2, but virtual stage 5 is on stage 0");
    s.list[1][i].peer = 0;
    CHECK_ST(pt_schedule_check(&s, NULL), PT_OK);
    /* a message from the turn stage to itself */
    FIND(i, &s, 2, PT_ACT_F, 0, 0);
    i++;
    memmove(&s.list[2][i + 1], &s.list[2][i], sizeof(pt_action) * (size_t)(s.count[2]++ - i));
    s.list[2][i].kind = PT_ACT_SEND_ACT, s.list[2][i].micro = 0, s.list[2][i].chunk = 0;
    s.list[2][i].peer = 2;
    CHECK_ERR(pt_schedule_check(&s, NULL), PT_ERR_CONFIG, "goes to stage 2, but virtual stage 3 "
              "is on stage 2 (itself: no message)");
    drop_action(&s, 2, i);
    /* the turn's gradient passes from chunk 1's B to chunk 0's in one buffer: on
       2 stages, a receive of micro-batch 1's gradient moved between them is refused */
    pt_schedule_free(&s);
    CHECK_ST(pt_schedule_build(&s, PT_SCHED_ZB_V, 2, 2, 3), PT_OK);
    FIND(i, &s, 1, PT_ACT_B, 0, 1);
    FIND(j, &s, 1, PT_ACT_RECV_GRAD, 1, 1);
    CHECK(i >= 0 && j > i + 1);
    tmp = s.list[1][j];
    memmove(&s.list[1][i + 2], &s.list[1][i + 1], sizeof(pt_action) * (size_t)(j - i - 1));
    s.list[1][i + 1] = tmp;
    CHECK_ERR(pt_schedule_check(&s, NULL), PT_ERR_CONFIG, "backward of micro-batch 0 chunk 0 does "
              "not follow the backward of virtual stage 2 it takes its gradient from");
    pt_schedule_free(&s);
    CHECK_ST(pt_schedule_build(&s, PT_SCHED_ZB_V, 3, 2, 5), PT_OK);
    /* a missing W on the first stage */
    FIND(i, &s, 0, PT_ACT_W, 4, 0);
    drop_action(&s, 0, i);
    CHECK_ERR(pt_schedule_check(&s, NULL), PT_ERR_CONFIG,
              "optimizer step comes before the weight gradient of micro-batch 4 chunk 0");
    pt_schedule_free(&s);
    /* ZB-H2: a W moved before its B */
    CHECK_ST(pt_schedule_build(&s, PT_SCHED_ZB_H2, 3, 1, 6), PT_OK);
    FIND(i, &s, 1, PT_ACT_B, 3, 0);
    FIND(j, &s, 1, PT_ACT_W, 3, 0);
    CHECK(i >= 0 && j > i);
    tmp = s.list[1][j];
    memmove(&s.list[1][i + 1], &s.list[1][i], sizeof(pt_action) * (size_t)(j - i));
    s.list[1][i] = tmp;
    CHECK_ERR(pt_schedule_check(&s, NULL), PT_ERR_CONFIG,
              "weight gradient of micro-batch 3 chunk 0 before its backward");
out:
    pt_schedule_free(&s);
}

/* Chimera: every even p <= 8 and m = p, 2p (<= 16) checked. In the paper's
   basic unit (m = p) a worker idles D - 2 slots of F = B; with B two slots
   that is 2(p-2) idle slots a stage: makespan 3m + 2(p-2), against 1F1B's
   3m + 3(p-1). Each stage holds between p/2 + 1 and p micro-batches'
   activations (the paper's bounds, D/2 + 1 and D). */
static void test_schedule_chimera(void) {
    int p, m, st;
    for (p = 2; p <= 8; p += 2)
        for (m = p; m <= 16 && m <= 2 * p; m += p) {
            pt_schedule s, one;
            pt_schedule_report r, r1;
            ZERO(s), ZERO(one);
            CHECK_ST(pt_schedule_build(&s, PT_SCHED_CHIMERA, p, 2, m), PT_OK);
            CHECK_ST(pt_schedule_build(&one, PT_SCHED_1F1B, p, 1, m), PT_OK);
            if (g_fail) return;
            if (pt_schedule_check(&s, &r) != PT_OK || pt_schedule_check(&one, &r1) != PT_OK) {
                FAIL("chimera p=%d m=%d: %s", p, m, pt_last_error());
                pt_schedule_free(&s), pt_schedule_free(&one);
                return;
            }
            if (m == p && r.steps != 3 * m + 2 * (p - 2))
                FAIL("chimera p=%d m=%d: makespan %d, the paper's D-2 bubbles give %d", p, m,
                     r.steps, 3 * m + 2 * (p - 2));
            if (p > 2 && r.steps >= r1.steps)
                FAIL("chimera p=%d m=%d: makespan %d, not below 1F1B's %d", p, m, r.steps, r1.steps);
            for (st = 0; m == p && st < p; st++)
                if (r.peak_inflight[st] < p / 2 + 1 || r.peak_inflight[st] > p)
                    FAIL("chimera p=%d stage %d: peak %d outside [p/2 + 1, p]", p, st,
                         r.peak_inflight[st]);
            pt_schedule_free(&s), pt_schedule_free(&one);
        }
}

/* Chimera's two replicas in memory: stage s of p holds blocks s and p-1-s
   of the layers (the embeddings with block 0, the final norm with block
   p-1), so a middle stage keeps twice 1F1B's weights, gradients and AdamW
   state, counted by hand here; the simulator's stage memory (ptrain's
   executor) is that meta build's, exactly. Then 2BW's two weight versions. */
static void test_chimera_memory(void) {
    enum { V = 50, BS = 16, L = 8, NH = 2, C = 24, P = 4 };
    pt_gpt_config c = cfg_make(V, BS, L, NH, C);
    int64_t layer = (params_by_hand(&c) - (int64_t)V * C - (int64_t)BS * C - 2 * C) / L;
    pt_hw hw;
    pt_plan_desc d;
    pt_plan_result r;
    int st;
    CHECK(pt_hw_preset("a100-80g", &hw) == PT_OK);
    memset(&d, 0, sizeof d);
    d.model.config = c, d.model.seq = BS, d.model.batch = 1;
    d.tp = 1, d.pp = P, d.gpus = P, d.batch = 8, d.exec = PT_EXEC_PTRAIN;
    d.model.schedule = PT_SCHED_CHIMERA;
    CHECK_ST(pt_plan_simulate(&d, &hw, &r, NULL), PT_OK);
    for (st = 0; st < P && !g_fail; st++) {
        pt_grid g;
        pt_gpt m;
        pt_gpt_desc gd;
        int64_t want = 4 * layer; /* two blocks of L/p = 2 layers */
        memset(&g, 0, sizeof g), memset(&gd, 0, sizeof gd);
        g.tp = g.dp = 1, g.pp = P, g.pp_rank = st;
        gd.config = c, gd.batch = 1, gd.seq = BS, gd.meta = 1, gd.grid = &g, gd.grad_accum = 8;
        gd.schedule = PT_SCHED_CHIMERA;
        CHECK_ST(pt_gpt_init(&m, &gd), PT_OK);
        if (g_fail) return;
        if (st == 0 || st == P - 1) want += (int64_t)V * C + (int64_t)BS * C + 2 * C;
        CHECK_EQ(m.place.n_layers, 4);
        CHECK_EQ((int64_t)m.num_params, want);
        CHECK_EQ(m.mem.params, (size_t)want * 4);
        CHECK_EQ(m.mem.grads, (size_t)want * 4);
        CHECK_EQ(m.mem.optimizer, (size_t)want * 8);
        CHECK_EQ(m.place.has_embed, st == 0 || st == P - 1);
        CHECK_EQ(m.place.has_head, st == 0 || st == P - 1);
        CHECK(r.stage[st].mem.params == (double)m.mem.params);
        CHECK(r.stage[st].mem.activations == (double)(m.mem.activations + m.mem.scratch));
        CHECK_EQ(r.stage[st].layers, 4);
        pt_gpt_free(&m);
    }
    /* PipeDream-2BW: two versions of a stage's weights (and nothing else twice) */
    d.model.schedule = PT_SCHED_2BW;
    CHECK_ST(pt_plan_simulate(&d, &hw, &r, NULL), PT_OK);
    for (st = 0; st < P && !g_fail; st++) {
        pt_grid g;
        pt_gpt m;
        pt_gpt_desc gd;
        int64_t want = 2 * layer; /* one block of L/p = 2 layers */
        memset(&g, 0, sizeof g), memset(&gd, 0, sizeof gd);
        g.tp = g.dp = 1, g.pp = P, g.pp_rank = st;
        gd.config = c, gd.batch = 1, gd.seq = BS, gd.meta = 1, gd.grid = &g, gd.grad_accum = 8;
        gd.schedule = PT_SCHED_2BW;
        CHECK_ST(pt_gpt_init(&m, &gd), PT_OK);
        if (g_fail) return;
        if (st == 0) want += (int64_t)V * C + (int64_t)BS * C;
        if (st == P - 1) want += (int64_t)V * C + 2 * C; /* wte's copy for the tied head */
        CHECK_EQ((int64_t)m.num_params, want);
        CHECK_EQ(m.mem.params, (size_t)want * 8);
        CHECK_EQ(m.mem.grads, (size_t)want * 4);
        CHECK_EQ(m.mem.optimizer, (size_t)want * 8);
        CHECK(r.stage[st].mem.params == (double)m.mem.params);
        pt_gpt_free(&m);
    }
}

/* Chimera's constraints, its replicas and its gradient all-reduce, refused
   broken in words. */
static void test_schedule_chimera_rejects(void) {
    pt_schedule s;
    pt_schedule_kind k = PT_SCHED_GPIPE;
    int i, j;
    pt_action tmp;
    ZERO(s);
    CHECK_ST(pt_schedule_kind_parse("chimera", &k), PT_OK);
    CHECK_EQ(k, PT_SCHED_CHIMERA);
    CHECK_ERR(pt_schedule_build(&s, PT_SCHED_CHIMERA, 3, 2, 6), PT_ERR_CONFIG,
              "chimera needs an even number of stages and micro-batches a multiple of them");
    CHECK_ERR(pt_schedule_build(&s, PT_SCHED_CHIMERA, 4, 2, 6), PT_ERR_CONFIG, "p=4, m=6");
    CHECK_ERR(pt_schedule_build(&s, PT_SCHED_CHIMERA, 4, 1, 4), PT_ERR_CONFIG,
              "two replicas' stages per stage (chunks=1");
    CHECK_ST(pt_schedule_build(&s, PT_SCHED_CHIMERA, 4, 2, 4), PT_OK);
    /* micro-batch 2 goes up replica 1: stage 3 forwards it first, from no one */
    CHECK(action_at(&s, 3, PT_ACT_F, 2, 1) >= 0 && action_at(&s, 3, PT_ACT_RECV_ACT, 2, 1) < 0);
    FIND(i, &s, 3, PT_ACT_SEND_ACT, 2, 1);
    CHECK_EQ(s.list[3][i].peer, 2);
    /* the all-reduce pairs stage s with p-1-s */
    FIND(i, &s, 1, PT_ACT_REDUCE, -1, -1);
    CHECK(i >= 0 && s.list[1][i].peer == 2);
    s.list[1][i].peer = 0;
    CHECK_ERR(pt_schedule_check(&s, NULL), PT_ERR_CONFIG,
              "a replica all-reduce with stage 0, but the same layers are on stage p-1-s");
    s.list[1][i].peer = 2;
    /* ahead of a backward it would reduce half-made gradients */
    FIND(j, &s, 1, PT_ACT_B, 3, 1);
    tmp = s.list[1][i];
    memmove(&s.list[1][j + 1], &s.list[1][j], sizeof(pt_action) * (size_t)(i - j));
    s.list[1][j] = tmp;
    CHECK_ERR(pt_schedule_check(&s, NULL), PT_ERR_CONFIG,
              "stage 1: the replica all-reduce comes before the backward of micro-batch 1 chunk 0");
    pt_schedule_free(&s);
    CHECK_ST(pt_schedule_build(&s, PT_SCHED_CHIMERA, 4, 2, 4), PT_OK);
    /* left out on one stage: the optimizer step would update unsynced weights */
    FIND(i, &s, 2, PT_ACT_REDUCE, -1, -1);
    drop_action(&s, 2, i);
    CHECK_ERR(pt_schedule_check(&s, NULL), PT_ERR_CONFIG, "stage 2: the optimizer step comes "
              "before the replica gradient all-reduce with stage 1");
    pt_schedule_free(&s);
    /* the all-reduce is a collective: stage 0 waiting in it before sending the gradient
       stage 1 needs to reach it is a deadlock */
    CHECK_ST(pt_schedule_build(&s, PT_SCHED_CHIMERA, 2, 2, 2), PT_OK);
    FIND(i, &s, 0, PT_ACT_SEND_GRAD, 1, 1);
    FIND(j, &s, 0, PT_ACT_REDUCE, -1, -1);
    CHECK(i >= 0 && j > i);
    tmp = s.list[0][i];
    memmove(&s.list[0][i], &s.list[0][i + 1], sizeof(pt_action) * (size_t)(j - i));
    s.list[0][j] = tmp;
    CHECK_ERR(pt_schedule_check(&s, NULL), PT_ERR_CONFIG, "deadlock: stage 0 waits at action");
    CHECK_MSG("(replica all-reduce");
    pt_schedule_free(&s);
    /* a micro-batch on the other replica's chunk */
    CHECK_ST(pt_schedule_build(&s, PT_SCHED_CHIMERA, 2, 2, 2), PT_OK);
    FIND(i, &s, 0, PT_ACT_F, 0, 0);
    s.list[0][i].chunk = 1;
    CHECK_ERR(pt_schedule_check(&s, NULL), PT_ERR_CONFIG,
              "micro-batch 0 travels replica 0, not chunk 1's");
    pt_schedule_free(&s);
    /* schedules without replicas have no all-reduce */
    CHECK_ST(pt_schedule_build(&s, PT_SCHED_1F1B, 2, 1, 2), PT_OK);
    s.list[0][s.count[0] - 1].kind = PT_ACT_REDUCE, s.list[0][s.count[0] - 1].peer = 1;
    s.list[0][s.count[0]++].kind = PT_ACT_OPT;
    CHECK_ERR(pt_schedule_check(&s, NULL), PT_ERR_CONFIG, "in a schedule without replicas");
out:
    pt_schedule_free(&s);
}

/* PipeDream-2BW over m = kp micro-batches (k batches, p <= 8, m <= 16):
   1F1B's order never flushed: one fill and drain, makespan 3m + 3(p-1)
   against k flushed 1F1B steps' k(3p + 3(p-1)); batch t runs at weight
   version max(t-1, 0) (W(t+1) = W(t) - lr grad f(W(t-1))), F and B of a
   micro-batch at the same one; two versions alive once there are two
   batches. */
static void test_schedule_2bw(void) {
    int p, m, st, i;
    for (p = 1; p <= 8; p++)
        for (m = p; m <= 16; m += p) {
            pt_schedule s, one;
            pt_schedule_report r, r1;
            ZERO(s), ZERO(one);
            CHECK_ST(pt_schedule_build(&s, PT_SCHED_2BW, p, 1, m), PT_OK);
            CHECK_ST(pt_schedule_build(&one, PT_SCHED_1F1B, p, 1, p), PT_OK);
            if (g_fail) return;
            if (pt_schedule_check(&s, &r) != PT_OK || pt_schedule_check(&one, &r1) != PT_OK) {
                FAIL("2bw p=%d m=%d: %s", p, m, pt_last_error());
                pt_schedule_free(&s), pt_schedule_free(&one);
                return;
            }
            if (r.steps != 3 * m + 3 * (p - 1) || (p > 1 && m > p && r.steps >= m / p * r1.steps))
                FAIL("2bw p=%d m=%d: makespan %d, want %d (flushed: %d)", p, m, r.steps,
                     3 * m + 3 * (p - 1), m / p * r1.steps);
            if (r.versions != (m >= 2 * p ? 2 : 1) || r1.versions != 1)
                FAIL("2bw p=%d m=%d: %d weight versions alive (1f1b %d)", p, m, r.versions,
                     r1.versions);
            for (st = 0; st < p; st++) {
                int made = 0;
                for (i = 0; i < s.count[st]; i++) {
                    const pt_action *a = &s.list[st][i];
                    int t = a->micro / p;
                    if ((a->kind == PT_ACT_F || a->kind == PT_ACT_B) && a->version != (t > 1 ? t - 1 : 0))
                        FAIL("2bw p=%d m=%d stage %d: micro-batch %d at version %d", p, m, st,
                             a->micro, a->version);
                    if (a->kind == PT_ACT_OPT && a->version != ++made)
                        FAIL("2bw p=%d m=%d stage %d: update %d makes version %d", p, m, st, made,
                             a->version);
                }
                if (made != m / p) FAIL("2bw p=%d m=%d stage %d: %d updates", p, m, st, made);
            }
            pt_schedule_free(&s), pt_schedule_free(&one);
        }
}

static void test_schedule_2bw_rejects(void) {
    pt_schedule s;
    pt_schedule_kind k = PT_SCHED_GPIPE;
    int i, j;
    pt_action tmp;
    ZERO(s);
    CHECK_ST(pt_schedule_kind_parse("2bw", &k), PT_OK);
    CHECK_EQ(k, PT_SCHED_2BW);
    CHECK_ERR(pt_schedule_build(&s, PT_SCHED_2BW, 4, 1, 6), PT_ERR_CONFIG,
              "2bw makes a weight version every p micro-batches: m=6 must be a multiple of p=4");
    CHECK_ST(pt_schedule_build(&s, PT_SCHED_2BW, 3, 1, 9), PT_OK);
    CHECK_ST(pt_schedule_check(&s, NULL), PT_OK);
    /* batch 2 at the newest version (2) instead of the one before it */
    FIND(i, &s, 2, PT_ACT_F, 6, 0);
    s.list[2][i].version = 2;
    CHECK_ERR(pt_schedule_check(&s, NULL), PT_ERR_CONFIG, "stage 2, action");
    CHECK_MSG("forward of micro-batch 6 (batch 2) at weight version 2; 2BW's W(t+1)");
    s.list[2][i].version = 1;
    /* a backward at another version than its forward */
    FIND(j, &s, 1, PT_ACT_B, 7, 0);
    s.list[1][j].version = 0;
    CHECK_ERR(pt_schedule_check(&s, NULL), PT_ERR_CONFIG,
              "backward of micro-batch 7 at weight version 0, its forward used 1");
    s.list[1][j].version = 1;
    /* the update making version 1 moved before batch 0's last backward */
    FIND(i, &s, 0, PT_ACT_B, 2, 0);
    for (j = i; s.list[0][j].kind != PT_ACT_OPT; j++) continue;
    tmp = s.list[0][j];
    memmove(&s.list[0][i + 1], &s.list[0][i], sizeof(pt_action) * (size_t)(j - i));
    s.list[0][i] = tmp;
    CHECK_ERR(pt_schedule_check(&s, NULL), PT_ERR_CONFIG,
              "the update to weight version 1 comes before the backward of micro-batch 2 of batch 0");
    pt_schedule_free(&s);
    /* an update left out: the next makes version 2 after version 0 */
    CHECK_ST(pt_schedule_build(&s, PT_SCHED_2BW, 2, 1, 6), PT_OK);
    for (i = 0; s.list[1][i].kind != PT_ACT_OPT; i++) continue;
    drop_action(&s, 1, i);
    CHECK_ERR(pt_schedule_check(&s, NULL), PT_ERR_CONFIG,
              "the update makes weight version 2 after version 0");
    pt_schedule_free(&s);
    /* version 1 made late: batch 2's first forward would run on weights not there */
    CHECK_ST(pt_schedule_build(&s, PT_SCHED_2BW, 2, 1, 6), PT_OK);
    for (i = 0; s.list[0][i].kind != PT_ACT_OPT; i++) continue;
    FIND(j, &s, 0, PT_ACT_F, 4, 0);
    CHECK(j > i);
    tmp = s.list[0][i];
    memmove(&s.list[0][i], &s.list[0][i + 1], sizeof(pt_action) * (size_t)(j - i));
    s.list[0][j] = tmp;
    CHECK_ERR(pt_schedule_check(&s, NULL), PT_ERR_CONFIG, "stage 0, action");
    CHECK_MSG("forward of micro-batch 4 at weight version 1, which the stage has not made yet");
out:
    pt_schedule_free(&s);
}

static int count_sub(const char *hay, size_t n, const char *needle) {
    size_t k = strlen(needle), i;
    int c = 0;
    for (i = 0; i + k <= n; i++) c += memcmp(hay + i, needle, k) == 0;
    return c;
}

/* A measured step's trace as SVG: times in ms (the default unit), ticks at
   round values, a box too narrow for "F12" labelled "12", one too narrow
   for that unlabelled, the legend the kinds of boxes drawn at least half a
   pixel wide (a dp reduction, not the sub-pixel send) and idle. */
static void test_trace_svg(void) {
    pt_trace t;
    const char *svg = tmp_path("m.svg");
    unsigned char *b;
    size_t n;
    ZERO(t);
    t.title = "measured";
    CHECK_ST(pt_trace_add(&t, 0, PT_ACT_F, 0, 0, 0, 0.0, 1e-3), PT_OK);
    CHECK_ST(pt_trace_add(&t, 0, PT_ACT_F, 12, 0, 1, 1e-3, 6e-5), PT_OK);  /* 15 px */
    CHECK_ST(pt_trace_add(&t, 0, PT_ACT_F, 7, 0, 2, 1.1e-3, 2e-5), PT_OK); /* 5 px */
    CHECK_ST(pt_trace_add(&t, 0, PT_ACT_SEND_ACT, 7, 0, 3, 1.2e-3, 1e-7), PT_OK);
    CHECK_ST(pt_trace_add(&t, 1, PT_ACT_B, 0, 0, 0, 1.5e-3, 2.5e-3), PT_OK);
    CHECK_ST(pt_trace_add(&t, 1, PT_TRACE_DP_REDUCE, 3, -1, 0, 2e-3, 1e-3), PT_OK);
    CHECK_ST(pt_trace_write_svg(&t, svg), PT_OK);
    b = read_all(svg, &n);
    CHECK(b != NULL);
    if (b) {
        const char *h = (const char *)b;
        CHECK_EQ(count_sub(h, n, ">ms</text>"), 1);
        CHECK_EQ(count_sub(h, n, "time unit"), 0);
        CHECK_EQ(count_sub(h, n, ">0.5</text>") + count_sub(h, n, ">3.5</text>"), 2);
        CHECK_EQ(count_sub(h, n, "(forward, 0.06 ms)"), 1);
        CHECK_EQ(count_sub(h, n, ">F0</text>") + count_sub(h, n, ">12</text>"), 2);
        CHECK_EQ(count_sub(h, n, ">F12</text>") + count_sub(h, n, ">7</text>"), 0);
        CHECK_EQ(count_sub(h, n, ">forward</text>") + count_sub(h, n, ">backward</text>") +
                     count_sub(h, n, ">idle</text>") + count_sub(h, n, ">dp reduction</text>"), 4);
        CHECK_EQ(count_sub(h, n, ">communication</text>") +
                     count_sub(h, n, ">parameter gather</text>") +
                     count_sub(h, n, ">weight gradient</text>"), 0);
    }
    pt_trace_free(&t);
}

/* A schedule's timeline as Chrome trace JSON (valid JSON: a config.json
   holding it under a key of its own parses, the value skipped whole; one
   slice per F, B, W, named with micro-batch and chunk) and as SVG (one
   rectangle per slice); unwritable paths are errors. */
static void test_schedule_trace_files(void) {
    pt_schedule s;
    pt_trace t;
    const char *json = tmp_path("t.json"), *svg = tmp_path("t.svg");
    static const char cfg[] = "\"hidden_size\": 32, \"intermediate_size\": 8, "
        "\"num_attention_heads\": 4, \"num_hidden_layers\": 1, \"vocab_size\": 8, "
        "\"max_position_embeddings\": 8}";
    pt_gpt_config config;
    unsigned char *b;
    char *doc;
    size_t n;
    int slices;
    ZERO(s), ZERO(t);
    CHECK_ST(pt_schedule_build(&s, PT_SCHED_INTERLEAVED, 2, 2, 4), PT_OK);
    t.title = "test \"quoted\" <title> & more";
    CHECK_ST(pt_schedule_trace(&s, 1e-3, &t), PT_OK);
    slices = 2 * 2 * 4 * 2; /* p stages x v chunks x m micro-batches x (F, B) */
    CHECK_EQ(t.count, slices);
    CHECK_EQ(t.ntracks, 2);
    CHECK_ST(pt_trace_write_chrome(&t, json), PT_OK);
    CHECK_ST(pt_trace_write_svg(&t, svg), PT_OK);
    b = read_all(json, &n);
    CHECK(b != NULL);
    if (b) { /* {"trace": <the file>, <a config>}: any defect breaks the config's parse */
        doc = TALLOC(char, n + sizeof cfg + 16);
        memcpy(doc, "{\"trace\": ", 10);
        memcpy(doc + 10, b, n);
        memcpy(doc + 10 + n, ", ", 2);
        memcpy(doc + 12 + n, cfg, sizeof cfg);
        CHECK_ST(pt_gpt_config_from_hf_json(doc, strlen(doc), &config), PT_OK);
        CHECK_EQ(config.n_embd, 32);
        CHECK_EQ(count_sub((const char *)b, n, "\"ph\": \"X\""), slices);
        CHECK_EQ(count_sub((const char *)b, n, "\"name\": \"F3b\""), 2);
        CHECK_EQ(count_sub((const char *)b, n, "\"args\": {\"micro\": 3, \"chunk\": 1, \"index\": "), 4);
        CHECK_EQ(count_sub((const char *)b, n, "thread_name"), 2);
    }
    b = read_all(svg, &n);
    CHECK(b != NULL);
    if (b) {
        CHECK(n > 12 && memcmp(b, "<svg ", 5) == 0 && memcmp(b + n - 7, "</svg>\n", 7) == 0);
        CHECK_EQ(count_sub((const char *)b, n, "<title>"), slices);
        CHECK_EQ(count_sub((const char *)b, n, "&quot;quoted&quot; &lt;title&gt; &amp;"), 1);
        /* one unit, the schedule's (no ms); the kinds drawn in the legend, no
           other; the micro-batch and chunk on each box (~37 px a unit) */
        CHECK_EQ(count_sub((const char *)b, n, ">time units</text>"), 1);
        CHECK_EQ(count_sub((const char *)b, n, "ms"), 0);
        CHECK_EQ(count_sub((const char *)b, n, "(forward, 1 time unit)"), slices / 2);
        CHECK_EQ(count_sub((const char *)b, n, "(backward, 2 time units)"), slices / 2);
        CHECK_EQ(count_sub((const char *)b, n, ">forward</text>") +
                     count_sub((const char *)b, n, ">backward</text>") +
                     count_sub((const char *)b, n, ">idle</text>"), 3);
        CHECK_EQ(count_sub((const char *)b, n, ">weight gradient</text>") +
                     count_sub((const char *)b, n, ">communication</text>") +
                     count_sub((const char *)b, n, ">optimizer</text>") +
                     count_sub((const char *)b, n, ">dp reduction</text>"), 0);
        CHECK_EQ(count_sub((const char *)b, n, ">F3b</text>"), 2);
        CHECK_EQ(count_sub((const char *)b, n, ">B0a</text>"), 2);
        CHECK_EQ(count_sub((const char *)b, n, ">0</text>") + count_sub((const char *)b, n, ">10</text>"), 2);
    }
    CHECK_ERR(pt_trace_write_chrome(&t, "/nonexistent-dir/t.json"), PT_ERR_IO, "cannot create");
    CHECK_ERR(pt_trace_write_svg(&t, "/nonexistent-dir/t.svg"), PT_ERR_IO, "cannot create");
    pt_trace_free(&t);
    pt_schedule_free(&s);
}

/* ======================================================================== */
/* runner                                                                    */
/* ======================================================================== */

/* The simulator's FLOP count is the sum of its actions; with full
   recomputation it must equal Megatron-LM's closed form 96 B s l h^2 (1 +
   s/6h + V/16lh), and without recomputation the model FLOPs 72 B s l h^2
   (1 + s/6h + V/12lh), for an interleaved pipeline. */
static void test_sim_flops_closed_form(void) {
    pt_hw hw;
    pt_plan_desc d;
    pt_plan_result r;
    double B, s, l, h, V, hwf, mf;
    CHECK(pt_hw_preset("a100-80g", &hw) == PT_OK);
    memset(&d, 0, sizeof d);
    d.model.config = cfg_make(51200, 0, 80, 96, 12288), d.model.seq = 2048;
    d.model.batch = 2, d.model.chunks = 2, d.model.schedule = PT_SCHED_DEFAULT; /* interleaved */
    d.model.recompute = PT_RECOMPUTE_FULL;
    d.tp = 8, d.pp = 8, d.gpus = 1536, d.batch = 2304;
    CHECK(pt_plan_simulate(&d, &hw, &r, NULL) == PT_OK);
    B = d.batch, s = d.model.seq, l = d.model.config.n_layer, h = d.model.config.n_embd;
    V = d.model.config.vocab_size;
    hwf = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
    mf = 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
    CHECK(fabs(r.hw_flops / hwf - 1) < 1e-9);
    CHECK(fabs(r.model_flops / mf - 1) < 1e-9);
    CHECK(r.schedule == PT_SCHED_INTERLEAVED && r.dp == 24 && r.micro_batches == 48);
    CHECK(fabs(r.tflops_per_gpu * 1e12 * r.step_time * d.gpus / hwf - 1) < 1e-9);
    d.model.recompute = PT_RECOMPUTE_NONE; /* a smaller model, to fit without recomputation */
    d.model.config.n_layer = 48, d.model.config.n_embd = 8192, d.model.config.n_head = 64;
    d.pp = 2, d.gpus = 512, d.batch = 1536, d.model.batch = 1;
    d.model.schedule = PT_SCHED_INTERLEAVED;
    B = d.batch, l = d.model.config.n_layer, h = d.model.config.n_embd;
    mf = 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
    CHECK(pt_plan_simulate(&d, &hw, &r, NULL) == PT_OK);
    CHECK(fabs(r.hw_flops / mf - 1) < 1e-9 && fabs(r.model_flops / mf - 1) < 1e-9);
}

/* Today's recipe in the simulator: model FLOPs stay the closed form under
   cp (each rank's 1/cp of the tokens and of attention); sp and overlapped
   tp shrink what they should; bad fields are refused by name; a profile's
   new fields survive save and load. */
static void test_sim_recipe(void) {
    pt_hw hw, back;
    pt_plan_desc d;
    pt_plan_result a, b;
    double B, s, l, h, V, mf;
    const char *path = "build/test_hw_recipe.txt";
    CHECK(pt_hw_preset("h100-80g", &hw) == PT_OK);
    memset(&d, 0, sizeof d);
    d.model.config = cfg_make(51200, 0, 16, 32, 4096), d.model.seq = 8192;
    d.model.batch = 1, d.model.recompute = PT_RECOMPUTE_NONE, d.model.zero = 1;
    d.tp = 8, d.pp = 1, d.gpus = 64, d.batch = 16, d.attention = PT_ATTN_FLASH;
    CHECK(pt_plan_simulate(&d, &hw, &a, NULL) == PT_OK);
    d.cp = 2;
    CHECK(pt_plan_simulate(&d, &hw, &b, NULL) == PT_OK);
    B = d.batch, s = d.model.seq, l = 16, h = 4096, V = 51200;
    mf = 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
    CHECK(fabs(a.model_flops / mf - 1) < 1e-9 && fabs(b.model_flops / mf - 1) < 1e-9);
    CHECK(b.dp == 4 && fabs(b.mem.activations / a.mem.activations - 0.5) < 1e-6);
    d.cp = 0, d.model.sequence_parallel = 1;
    CHECK(pt_plan_simulate(&d, &hw, &b, NULL) == PT_OK);
    CHECK(b.mem.activations < 0.5 * a.mem.activations && b.tp_comm_s > 0);
    d.overlap = PT_OVERLAP_ON; /* and with it tp's collectives behind the GEMMs */
    CHECK(pt_plan_simulate(&d, &hw, &a, NULL) == PT_OK);
    CHECK(a.tp_comm_s > 0 && a.tp_comm_s < (hw.tp_exposed + 0.1) * b.tp_comm_s); /* (+ the head's) */
    d.attention = (pt_plan_attention)7, d.cp = -1;
    CHECK(pt_plan_simulate(&d, &hw, &a, NULL) == PT_ERR_CONFIG);
    CHECK(strstr(pt_last_error(), "attention=7") && strstr(pt_last_error(), "cp=-1"));
    CHECK(pt_hw_save(&hw, path) == PT_OK && pt_hw_load(path, &back) == PT_OK);
    CHECK(back.flash_eff == hw.flash_eff && back.tp_exposed == hw.tp_exposed &&
          back.grad_bytes == hw.grad_bytes && back.comm_sm == hw.comm_sm &&
          back.rails == hw.rails);
    remove(path);
}

/* NCCL's rails (pt_hw.rails): a group with k ranks in a node crosses nodes on
   min(k, rails) adapters, NVLink the cap. A reduce-scatter of fp32 gradients
   over 48 ranks on DGX H100s: 8 a node (tp 1) at 8 x inter_bw = NVLink's 360
   GB/s, 2 a node (tp 4) at 2 x inter_bw, 1 a node (tp 8) at one adapter's; the
   A100 profile (2021's stacks, rails 0) one adapter's whatever k. */
static void test_sim_rails(void) {
    pt_hw h, a;
    double B = 16e9, vol = 47.0 / 48.0 * B;
    int k;
    CHECK(pt_hw_preset("h100-80g", &h) == PT_OK && pt_hw_preset("a100-80g", &a) == PT_OK);
    CHECK(h.rails == 8 && a.rails == 0 && 2 * h.inter_bw < h.intra_bw);
    for (k = 1; k <= 8; k *= 2) {
        double bw = k * h.inter_bw < h.intra_bw ? k * h.inter_bw : h.intra_bw;
        double got = pt_hw_comm_seconds(&h, PT_COLL_REDUCE_SCATTER, B, 48, k);
        double want = 47 * h.inter_lat + vol / bw;
        if (fabs(got / want - 1) > 1e-12)
            FAIL("rails: %d a node, reduce-scatter %.6g s, want %.6g", k, got, want);
        got = pt_hw_comm_seconds(&a, PT_COLL_REDUCE_SCATTER, B, 48, k);
        CHECK(fabs(got / (47 * a.inter_lat + vol / a.inter_bw) - 1) < 1e-12);
    }
    /* one node: NVLink, rails or not */
    CHECK(pt_hw_comm_seconds(&h, PT_COLL_REDUCE_SCATTER, B, 8, 8) ==
          7 * h.intra_lat + 7.0 / 8 * B / h.intra_bw);
}

/* Asynchronous pipeline sends (pp_overlap): the stage only launches a send,
   but its receiver still waits for the transfer. One micro-batch through 4
   stages of tp 8 (a node each) is a chain: 3 activations forward, 3
   gradients back, each arriving its p2p transfer (b s h / t bf16 across
   nodes) after the action that made it; with the sends free the step is
   exactly 6 transfers shorter. */
static void test_sim_pp_async(void) {
    enum { P = 4, T = 8 };
    pt_hw hw;
    pt_plan_desc d;
    pt_plan_result a, b;
    double scale[PT_ACT_COUNT], x, want;
    int i;
    CHECK(pt_hw_preset("h100-80g", &hw) == PT_OK);
    ZERO(d);
    d.model.config = cfg_make(51200, 0, 8, 32, 4096), d.model.seq = 4096;
    d.model.batch = 1, d.model.recompute = PT_RECOMPUTE_NONE, d.model.sequence_parallel = 1;
    d.tp = T, d.pp = P, d.gpus = T * P, d.batch = 1, d.attention = PT_ATTN_FLASH;
    d.model.schedule = PT_SCHED_1F1B, d.pp_overlap = PT_OVERLAP_ON;
    for (i = 0; i < PT_ACT_COUNT; i++) scale[i] = 1.0;
    CHECK_ST(pt_plan_simulate_scaled(&d, &hw, scale, &a, NULL), PT_OK);
    scale[PT_ACT_SEND_ACT] = scale[PT_ACT_SEND_GRAD] = 0.0;
    CHECK_ST(pt_plan_simulate_scaled(&d, &hw, scale, &b, NULL), PT_OK);
    x = pt_hw_comm_seconds(&hw, PT_COLL_P2P, 4096.0 * 4096 / T * 2, 2, 1);
    want = 2 * (P - 1) * x;
    if (fabs((a.step_time - b.step_time) / want - 1) > 1e-6)
        FAIL("pp_overlap: the sends add %.6g s to a 1-micro-batch chain, want %d transfers' %.6g",
             a.step_time - b.step_time, 2 * (P - 1), want);
    CHECK(a.pp_comm_s < 2 * (P - 1) * 2 * hw.kernel_s); /* the stage: launches only */
}

/* Llama 3's context parallelism (PT_CP_ALLGATHER) against the ring, cp 2 on
   one H100 node, the ring compute-bound (each K|V block's send shorter than
   the block's attention): each layer's pass adds the all-gather of K and V
   forward, and backward the all-gather again and dK|dV's reduce-scatter,
   2 b s (r h / t) bytes each over the 2 ranks; nothing else moves. ptrain's
   executor (the ring) refuses it, and values past the enum. */
static void test_sim_cp_allgather(void) {
    enum { L = 4, CP = 2, T = 4 };
    pt_hw hw;
    pt_plan_desc d;
    pt_plan_result a, b;
    double kv, ag, rs, want;
    CHECK(pt_hw_preset("h100-80g", &hw) == PT_OK);
    ZERO(d);
    d.model.config = cfg_make(51200, 0, L, 32, 4096), d.model.seq = 32768;
    d.model.batch = 1, d.model.recompute = PT_RECOMPUTE_NONE;
    d.tp = T, d.pp = 1, d.cp = CP, d.gpus = T * CP, d.batch = 2, d.attention = PT_ATTN_FLASH;
    CHECK_ST(pt_plan_simulate(&d, &hw, &a, NULL), PT_OK);
    d.cp_comm = PT_CP_ALLGATHER;
    CHECK_ST(pt_plan_simulate(&d, &hw, &b, NULL), PT_OK);
    kv = 2.0 * 32768 * 4096 / T * 2; /* K and V of all the tokens, bf16 */
    ag = pt_hw_comm_seconds(&hw, PT_COLL_ALL_GATHER, kv, CP, CP);
    rs = pt_hw_comm_seconds(&hw, PT_COLL_REDUCE_SCATTER, kv, CP, CP);
    want = 2 * L * (2 * ag + rs); /* 2 micro-batches */
    if (fabs((b.step_time - a.step_time) / want - 1) > 1e-6)
        FAIL("cp %d all-gathered: %.6g s more than the ring, want %.6g", CP,
             b.step_time - a.step_time, want);
    d.exec = PT_EXEC_PTRAIN;
    CHECK_ST(pt_plan_simulate(&d, &hw, &b, NULL), PT_ERR_CONFIG);
    CHECK(strstr(pt_last_error(), "cp_comm=allgather with ptrain's executor") != NULL);
    d.exec = PT_EXEC_DEFAULT, d.cp_comm = (pt_plan_cp_comm)3;
    CHECK_ST(pt_plan_simulate(&d, &hw, &b, NULL), PT_ERR_CONFIG);
    CHECK(strstr(pt_last_error(), "cp_comm=3") != NULL);
}

/* DeepSpeed's BF16_Optimizer under its pipeline engine (grad_accum_pass):
   each of the m micro-batches' backward ends with a pass over the rank's
   gradients, 12 bytes a parameter at the memory bandwidth and two kernels (the
   update without it: 52 bytes a parameter, Megatron-LM's fp16 step), and
   the update then starts from fp32 gradients (on the A100's fp16 profile no copy
   into fp32 and no unscaling: gb + 12 = 14 bytes a parameter fewer); on one
   rank the step moves by exactly that (its weights, 2 bytes each in
   mem.params, say how many). ptrain's executor and values past 1 refused. */
static void test_sim_grad_accum_pass(void) {
    pt_hw hw;
    pt_plan_desc d;
    pt_plan_result a, b;
    double want, sc[PT_ACT_COUNT];
    int i;
    CHECK(pt_hw_preset("a100-80g", &hw) == PT_OK);
    ZERO(d);
    d.model.config = cfg_make(51200, 0, 8, 16, 2048), d.model.seq = 2048;
    d.model.batch = 2, d.model.recompute = PT_RECOMPUTE_FULL;
    d.tp = 1, d.pp = 1, d.gpus = 1, d.batch = 8; /* 4 micro-batches */
    CHECK_ST(pt_plan_simulate(&d, &hw, &a, NULL), PT_OK);
    for (i = 0; i < PT_ACT_COUNT; i++) sc[i] = i == PT_ACT_OPT ? 0.0 : 1.0;
    CHECK_ST(pt_plan_simulate_scaled(&d, &hw, sc, &b, NULL), PT_OK);
    /* Megatron's fp16 update: gradients copied into fp32 (2 + 4), unscaled (8), the
       clipping norm's read (4), Adam (28), the weight read and copied out (4 + 2) */
    want = a.mem.params / 2 * 52 / hw.mem_bw + 4 * hw.kernel_s;
    if (fabs((a.step_time - b.step_time) / want - 1) > 1e-6)
        FAIL("the fp16 update: %.6g s, want 52 bytes a parameter's %.6g",
             a.step_time - b.step_time, want);
    d.grad_accum_pass = 1;
    CHECK_ST(pt_plan_simulate(&d, &hw, &b, NULL), PT_OK);
    /* (and the pass adds the embedding's dense gradient, which the DDP hook's add of
       2 + 2 + 2 bytes an element did: pt__sim_embed) */
    want = 4 * (a.mem.params / 2 * 12 / hw.mem_bw + 2 * hw.kernel_s) -
           a.mem.params / 2 * 14 / hw.mem_bw -
           4 * 51200.0 * d.model.config.n_embd * 6 / hw.mem_bw;
    if (fabs((b.step_time - a.step_time) / want - 1) > 1e-6)
        FAIL("grad_accum_pass: %.6g s more a step, want 4 passes' %.6g", b.step_time - a.step_time,
             want);
    d.exec = PT_EXEC_PTRAIN;
    CHECK_ST(pt_plan_simulate(&d, &hw, &b, NULL), PT_ERR_CONFIG);
    CHECK(strstr(pt_last_error(), "grad_accum_pass with ptrain's executor") != NULL);
    d.exec = PT_EXEC_DEFAULT, d.grad_accum_pass = 2;
    CHECK_ST(pt_plan_simulate(&d, &hw, &b, NULL), PT_ERR_CONFIG);
    CHECK(strstr(pt_last_error(), "grad_accum_pass=2 must be 0 or 1") != NULL);
}

/* DeepSpeed's BF16_Optimizer reduces its fp32 gradients (grad_accum_pass: 4 bytes
   an element on a profile of 2) by an all-reduce, not ZeRO 1's reduce-scatter
   (grad_allreduce): over dp 2 in a node the step grows by exactly the
   difference of the two collectives of P x 4 bytes, P the rank's parameters,
   and the bf16 gradients are kept beside the fp32 ones (2 bytes more each).
   Not with ZeRO 0, 2 or 3. */
static void test_sim_grad_allreduce(void) {
    pt_hw hw;
    pt_plan_desc d;
    pt_plan_result a, b;
    double P, want;
    CHECK(pt_hw_preset("a100-80g", &hw) == PT_OK);
    ZERO(d);
    d.model.config = cfg_make(51200, 0, 8, 16, 2048), d.model.seq = 2048;
    d.model.batch = 2, d.model.recompute = PT_RECOMPUTE_FULL, d.model.zero = 1;
    d.tp = 1, d.pp = 1, d.gpus = 2, d.batch = 8, d.grad_accum_pass = 1;
    CHECK_ST(pt_plan_simulate(&d, &hw, &a, NULL), PT_OK);
    d.grad_allreduce = 1;
    CHECK_ST(pt_plan_simulate(&d, &hw, &b, NULL), PT_OK);
    P = a.mem.params / 2;
    CHECK(fabs(a.mem.grads / (4 * P) - 1) < 1e-12);
    CHECK(fabs((b.mem.grads - a.mem.grads) / (2 * P) - 1) < 1e-12);
    want = pt_hw_comm_seconds(&hw, PT_COLL_ALL_REDUCE, 4 * P, 2, 8) -
           pt_hw_comm_seconds(&hw, PT_COLL_REDUCE_SCATTER, 4 * P, 2, 8);
    if (fabs((b.step_time - a.step_time) / want - 1) > 1e-6)
        FAIL("grad_allreduce: %.6g s more a step, want %.6g", b.step_time - a.step_time, want);
    d.model.zero = 2;
    CHECK_ST(pt_plan_simulate(&d, &hw, &b, NULL), PT_ERR_CONFIG);
    CHECK(strstr(pt_last_error(), "grad_allreduce with zero=2") != NULL);
}

/* Context parallelism on ptrain's executor with a local profile: the ring's
   kernel blocks cover the key chunks as pt__attn_rows does (cp 2 at 128
   tokens: every 64-query block spans both of a rank's chunks and sees a
   whole 64-key block, 4/3 of the unsplit kernel's elements; long chunks
   come back to about the unsplit kernel's), and the ring's transfers cost
   the cores comm_cpu a byte: a pass's cp - 1 K|V blocks forward, and in
   backward those and the cp dk|dv accumulators, K|V 2 b (s/cp) h floats. */
static void test_sim_cp_ring(void) {
    enum { L = 4, C = 256, S = 128, CP = 2 };
    pt_hw hw;
    pt_plan_desc d;
    pt_plan_result a, b;
    double kv = 2.0 * 8 * (S / CP) * C * 4, want;
    CHECK(fabs(pt__cp_attn_share(128, 2) - 4.0 / 3) < 1e-12);
    CHECK(fabs(pt__cp_attn_share(8192, 2) - 1) < 0.02);
    CHECK(fabs(pt__cp_attn_share(4096, 4) - 1) < 0.05);
    ZERO(hw);
    snprintf(hw.name, sizeof hw.name, "local");
    hw.peak_flops = 300e9, hw.gemm_eff = 1, hw.gemm_dim = 20, hw.attn_flops = 100e9;
    hw.mem_bw = 30e9, hw.mem_bytes = 16e9, hw.kernel_s = 1e-5, hw.per_node = 64;
    hw.intra_bw = hw.inter_bw = 5e9, hw.intra_lat = hw.inter_lat = 1e-6;
    hw.exec = PT_EXEC_PTRAIN;
    ZERO(d);
    d.model.config = cfg_make(1024, S, L, 4, C), d.model.seq = S, d.model.batch = 8;
    d.model.recompute = PT_RECOMPUTE_NONE, d.model.context_parallel = CP; /* a run's desc */
    d.tp = 1, d.pp = 1, d.cp = CP, d.gpus = CP, d.batch = 8, d.overlap = PT_OVERLAP_OFF;
    CHECK_ST(pt_plan_simulate(&d, &hw, &a, NULL), PT_OK);
    hw.comm_cpu = 1.0 / hw.intra_bw;
    CHECK_ST(pt_plan_simulate(&d, &hw, &b, NULL), PT_OK);
    want = L * (1 + 2 + 1) * hw.comm_cpu * kv; /* forward 1 block; backward 1 block, 2 accs */
    if (fabs((b.step_time - a.step_time) / want - 1) > 1e-6)
        FAIL("cp %d: the ring's bytes on the cores add %.4g s to the step, want %.4g", CP,
             b.step_time - a.step_time, want);
    d.model.context_parallel = 3; /* not the plan's cp */
    CHECK_ST(pt_plan_simulate(&d, &hw, &b, NULL), PT_ERR_CONFIG);
    CHECK(strstr(pt_last_error(), "model.context_parallel=3 but cp=2") != NULL);
}

/* The mechanisms move the numbers the right way: more micro-batches shrink
   the bubble towards (p-1)/(m+p-1); interleaving shrinks it further; a
   slower link costs time; 1F1B holds p micro-batches on stage 0 where
   GPipe holds all m. */
static void test_sim_mechanisms(void) {
    pt_hw hw, slow;
    pt_plan_desc d;
    pt_plan_result a, b, c;
    CHECK(pt_hw_preset("a100-80g", &hw) == PT_OK);
    memset(&d, 0, sizeof d);
    d.model.config = cfg_make(51200, 0, 48, 64, 8192), d.model.seq = 2048, d.model.batch = 1;
    d.tp = 8, d.pp = 4, d.gpus = 128, d.batch = 64;
    d.model.schedule = PT_SCHED_1F1B, d.model.recompute = PT_RECOMPUTE_FULL;
    CHECK(pt_plan_simulate(&d, &hw, &a, NULL) == PT_OK); /* m = 16 */
    d.batch = 256;
    CHECK(pt_plan_simulate(&d, &hw, &b, NULL) == PT_OK); /* m = 64 */
    CHECK(b.bubble_fraction < a.bubble_fraction);
    CHECK(fabs(a.bubble_fraction - 3.0 / 19.0) < 0.06); /* stages are not quite equal */
    d.model.chunks = 2, d.model.schedule = PT_SCHED_INTERLEAVED;
    CHECK(pt_plan_simulate(&d, &hw, &c, NULL) == PT_OK);
    CHECK(c.bubble_fraction < b.bubble_fraction);
    d.model.chunks = 1, d.model.schedule = PT_SCHED_1F1B;
    slow = hw;
    slow.intra_bw /= 10;
    CHECK(pt_plan_simulate(&d, &slow, &c, NULL) == PT_OK);
    CHECK(c.step_time > b.step_time && c.tp_comm_s > 5 * b.tp_comm_s);
    d.model.recompute = PT_RECOMPUTE_NONE;
    d.model.schedule = PT_SCHED_GPIPE;
    d.batch = 16; /* m = 4: GPipe holds 4 */
    CHECK(pt_plan_simulate(&d, &hw, &a, NULL) == PT_OK);
    d.model.schedule = PT_SCHED_1F1B;
    d.batch = 32; /* m = 8: 1F1B holds p = 4 on stage 0 */
    CHECK(pt_plan_simulate(&d, &hw, &b, NULL) == PT_OK);
    CHECK(fabs(b.mem.activations - a.mem.activations) < 1e-6 * a.mem.activations);
}

/* One simulated step of d on hw with action kind k's time times x (the
   other kinds as modeled). */
static double sim_step(const pt_plan_desc *d, const pt_hw *hw, int k, double x, pt_plan_result *r) {
    double scale[PT_ACT_COUNT];
    int i;
    for (i = 0; i < PT_ACT_COUNT; i++) scale[i] = i == k ? x : 1.0;
    if (pt_plan_simulate_scaled(d, hw, scale, r, NULL) != PT_OK) {
        FAIL("simulating: %s", pt_last_error());
        return -1.0;
    }
    return r->step_time;
}

/* Every cost the simulator models moves the predicted step. Each action kind
   of each schedule (F, B, W, the sends -- a message's time is charged to its
   send, a receive waits for it -- and the optimizer step): at 0x, 1x and 2x
   of its modeled time the step is strictly shorter, then longer. The links:
   with one stage (no overlap: the step is the sum of its actions) a slower
   link adds exactly the modeled time of each collective the layout runs:
   tp's all-reduces (2 in a layer's forward, 2 in its backward, 2 more when
   it is recomputed, one for the embedding and one for the head: their
   count is the stage's tp_bytes / (M h e)),
   dp's all-reduce (ZeRO 0) or reduce-scatter + all-gather (ZeRO 1, 2) of
   the gradients; ZeRO 3's per-layer all-gathers slow it too. With two
   stages and free sends the slower link adds exactly the all-reduce of
   wte's two copies (first and last stage); the sends' modeled time is
   pp_comm_s (m messages a stage). */
static void test_sim_cost_paths(void) {
    static const pt_schedule_kind kinds[] = {PT_SCHED_GPIPE, PT_SCHED_1F1B, PT_SCHED_INTERLEAVED,
                                             PT_SCHED_ZB_H1};
    static const int acts[] = {PT_ACT_F, PT_ACT_B, PT_ACT_W, PT_ACT_SEND_ACT, PT_ACT_SEND_GRAD,
                               PT_ACT_OPT};
    pt_hw hw, slow;
    pt_plan_desc d;
    pt_plan_result r0, r1, r2;
    double M, h, e = 2.0, n, want, msg;
    int i, k, zero;
    CHECK(pt_hw_preset("a100-80g", &hw) == PT_OK);
    slow = hw;
    slow.intra_bw /= 3, slow.intra_lat *= 5, slow.inter_bw /= 3, slow.inter_lat *= 5;
    memset(&d, 0, sizeof d);
    d.model.config = cfg_make(8192, 0, 8, 16, 1024), d.model.seq = 512, d.model.batch = 1;
    d.tp = 1, d.pp = 2, d.gpus = 2, d.batch = 8; /* m = 8 */
    M = (double)d.model.batch * d.model.seq, h = d.model.config.n_embd;
    for (i = 0; i < (int)(sizeof kinds / sizeof kinds[0]); i++)
        for (k = 0; k < (int)(sizeof acts / sizeof acts[0]); k++) {
            double t0, t1, t2;
            if (acts[k] == PT_ACT_W && kinds[i] != PT_SCHED_ZB_H1) continue;
            d.model.schedule = kinds[i], d.model.chunks = kinds[i] == PT_SCHED_INTERLEAVED ? 2 : 1;
            t0 = sim_step(&d, &hw, acts[k], 0.0, &r0);
            t1 = sim_step(&d, &hw, acts[k], 1.0, &r1);
            t2 = sim_step(&d, &hw, acts[k], 2.0, &r2);
            if (g_fail) return;
            if (!(t0 < t1 * (1 - 1e-9) && t1 < t2 * (1 - 1e-9)))
                FAIL("%s: the %s's time at 0x, 1x, 2x gives steps %.9g, %.9g, %.9g s: not rising",
                     pt_schedule_kind_name(kinds[i]), act_name(acts[k]), t0, t1, t2);
        }
    /* the sends' modeled time: m messages of micro x seq x hidden elements a stage */
    d.model.schedule = PT_SCHED_1F1B, d.model.chunks = 1;
    msg = pt_hw_comm_seconds(&hw, PT_COLL_P2P, M * h * e, 2, 2);
    sim_step(&d, &hw, -1, 1.0, &r1);
    CHECK(msg > 0 && fabs(r1.pp_comm_s / (8 * msg) - 1) < 1e-9);
    /* free sends: a slower link adds the wte all-reduce between the first and last stage */
    {
        double sc[PT_ACT_COUNT];
        for (k = 0; k < PT_ACT_COUNT; k++) sc[k] = 1.0;
        sc[PT_ACT_SEND_ACT] = sc[PT_ACT_SEND_GRAD] = 0.0;
        CHECK(pt_plan_simulate_scaled(&d, &hw, sc, &r1, NULL) == PT_OK);
        CHECK(pt_plan_simulate_scaled(&d, &slow, sc, &r2, NULL) == PT_OK);
        double wte = d.model.config.vocab_size * h * e;
        want = pt_hw_comm_seconds(&slow, PT_COLL_ALL_REDUCE, wte, 2, 2) -
               pt_hw_comm_seconds(&hw, PT_COLL_ALL_REDUCE, wte, 2, 2);
        if (!(want > 0 && fabs((r2.step_time - r1.step_time) / want - 1) < 1e-6))
            FAIL("pp 2: a slower link adds %.9g s, expected the wte all-reduce's %.9g s",
                 r2.step_time - r1.step_time, want);
    }
    /* one stage: tp all-reduces, with and without full recomputation */
    d.pp = 1, d.model.schedule = PT_SCHED_DEFAULT;
    for (i = 0; i < 2; i++) {
        d.tp = 2, d.gpus = 2, d.model.recompute = i ? PT_RECOMPUTE_FULL : PT_RECOMPUTE_NONE;
        CHECK(pt_plan_simulate(&d, &hw, &r1, NULL) == PT_OK);
        CHECK(pt_plan_simulate(&d, &slow, &r2, NULL) == PT_OK);
        n = r1.stage[0].tp_bytes / (M * h * e); /* all-reduces in the step */
        want = n * (pt_hw_comm_seconds(&slow, PT_COLL_ALL_REDUCE, M * h * e, 2, 2) -
                    pt_hw_comm_seconds(&hw, PT_COLL_ALL_REDUCE, M * h * e, 2, 2));
        /* a micro-batch: 2 a layer forward (+ the embedding's), 2 backward (+ the head's),
           2 more a layer in the recomputed forward; m = 8 */
        CHECK(fabs(n - 8 * ((i ? 6.0 : 4.0) * d.model.config.n_layer + 2)) < 1e-9);
        if (!(want > 0 && fabs((r2.step_time - r1.step_time) / want - 1) < 1e-6))
            FAIL("tp 2, recompute %d: a slower link adds %.9g s, expected %g all-reduces' %.9g s",
                 d.model.recompute, r2.step_time - r1.step_time, n, want);
    }
    /* one stage: data parallelism's gradient collectives, ZeRO 0, 1, 2 */
    d.tp = 1, d.model.recompute = PT_RECOMPUTE_NONE;
    for (zero = 0; zero <= 2; zero++) {
        double g;
        d.model.zero = zero;
        CHECK(pt_plan_simulate(&d, &hw, &r1, NULL) == PT_OK);
        CHECK(pt_plan_simulate(&d, &slow, &r2, NULL) == PT_OK);
        g = r1.stage[0].dp_bytes / (zero ? 2 : 1); /* the gradients' bytes */
        if (zero == 0)
            want = pt_hw_comm_seconds(&slow, PT_COLL_ALL_REDUCE, g, 2, 8) -
                   pt_hw_comm_seconds(&hw, PT_COLL_ALL_REDUCE, g, 2, 8);
        else
            want = pt_hw_comm_seconds(&slow, PT_COLL_REDUCE_SCATTER, g, 2, 8) -
                   pt_hw_comm_seconds(&hw, PT_COLL_REDUCE_SCATTER, g, 2, 8) +
                   pt_hw_comm_seconds(&slow, PT_COLL_ALL_GATHER, g, 2, 8) -
                   pt_hw_comm_seconds(&hw, PT_COLL_ALL_GATHER, g, 2, 8);
        if (!(g > 0 && want > 0 && fabs((r2.step_time - r1.step_time) / want - 1) < 1e-6))
            FAIL("dp 2, ZeRO %d: a slower link adds %.9g s, expected the gradients' %s: %.9g s",
                 zero, r2.step_time - r1.step_time,
                 zero ? "reduce-scatter and all-gather" : "all-reduce", want);
    }
    /* ZeRO 3: the layers' all-gathers (overlapping compute: a link slow enough to show) */
    d.model.zero = 3;
    slow.intra_bw = hw.intra_bw / 1e3;
    CHECK(pt_plan_simulate(&d, &slow, &r1, NULL) == PT_OK);
    slow.intra_bw = hw.intra_bw / 2e3;
    CHECK(pt_plan_simulate(&d, &slow, &r2, NULL) == PT_OK);
    CHECK(r2.step_time > 1.5 * r1.step_time);
}

/* ZeRO 3 on ptrain's executor (exec PT_EXEC_PTRAIN), dp 2, one stage, m = 8:
   its memory is the meta build's (the parameters' shards and two gathered
   buckets, the gradients' shard and one bucket); with overlap off every
   collective waits, so what the step waits for on dp, and what a slower
   link adds, are exactly the executor's collectives a bucket at a time each
   micro-batch: forward gathers every bucket in order and the tied head's
   wte buckets again; backward gathers each once more but the two its
   forward ended holding, and reduce-scatters each (wte's twice: the head's
   part, then the embedding's). Overlap on (a link that costs the cores
   nothing) hides some of it; pp > 1 is refused, named. */
static void test_sim_zero3_ptrain(void) {
    pt_hw hw, slow;
    pt_plan_desc d;
    pt_plan_result r1, r2, on;
    pt_gpt m;
    pt_gpt_desc gd;
    pt_grid g;
    pt__exec_layout o;
    double want = 0.0, waits = 0.0, e = 4.0;
    int b, ne = 0;
    CHECK(pt_hw_preset("a100-80g", &hw) == PT_OK);
    hw.comm_cpu = 0.0;
    slow = hw;
    slow.intra_bw /= 3, slow.intra_lat *= 5;
    memset(&d, 0, sizeof d);
    d.model.config = cfg_make(32768, 0, 8, 16, 1024), d.model.seq = 512, d.model.batch = 1;
    d.model.zero = 3;
    d.tp = 1, d.pp = 1, d.gpus = 2, d.batch = 16, d.exec = PT_EXEC_PTRAIN; /* m = 8 */
    d.overlap = PT_OVERLAP_OFF;
    CHECK(pt_plan_simulate(&d, &hw, &r1, NULL) == PT_OK);
    CHECK(pt_plan_simulate(&d, &slow, &r2, NULL) == PT_OK);
    memset(&g, 0, sizeof g);
    g.tp = 1, g.dp = 2, g.pp = 1;
    gd = d.model;
    gd.config.block_size = d.model.seq, gd.meta = 1, gd.grid = &g, gd.grad_accum = 8;
    CHECK(pt_gpt_init(&m, &gd) == PT_OK);
    if (g_fail) return;
    o = pt__exec_layout_of(&m);
    CHECK(r1.mem.params == (double)m.mem.params && r1.mem.grads == (double)m.mem.grads);
    CHECK(m.mem.params == (o.shard_total + 2 * o.largest_bucket) * sizeof(float));
    /* the shards, the stage of one bucket, where a bucket's reduce-scatter lands */
    CHECK(m.mem.grads == (o.shard_total + o.largest_bucket + o.largest_shard) * sizeof(float));
    while (ne < o.num_buckets && !o.buckets[ne].nl) ne++;
    CHECK(ne == 3 && o.num_buckets == ne + 8 + 1); /* wte in runs of rows, layers, final norm */
    for (b = 0; b < o.num_buckets; b++) {
        double n = (double)o.buckets[b].numel * e;
        int emb = b < ne, held = b == ne - 1 || b == ne - 2;
        double gf = pt_hw_comm_seconds(&hw, PT_COLL_ALL_GATHER, n, 2, 8);
        double gs = pt_hw_comm_seconds(&slow, PT_COLL_ALL_GATHER, n, 2, 8);
        double rf = pt_hw_comm_seconds(&hw, PT_COLL_REDUCE_SCATTER, n, 2, 8);
        double rs = pt_hw_comm_seconds(&slow, PT_COLL_REDUCE_SCATTER, n, 2, 8);
        want += 8 * ((2 + emb - held) * (gs - gf) + (1 + emb) * (rs - rf));
        waits += 8 * ((2 + emb - held) * gs + (1 + emb) * rs);
    }
    pt_gpt_free(&m);
    if (!(want > 0 && fabs((r2.step_time - r1.step_time) / want - 1) < 1e-6))
        FAIL("ZeRO 3 on ptrain's executor: a slower link adds %.9g s, expected its gathers' and "
             "reduce-scatters' %.9g s", r2.step_time - r1.step_time, want);
    if (!(fabs(r2.dp_comm_s / waits - 1) < 1e-6))
        FAIL("ZeRO 3, overlap off: the step waits %.9g s on dp, expected every collective's "
             "%.9g s", r2.dp_comm_s, waits);
    d.overlap = PT_OVERLAP_ON;
    CHECK(pt_plan_simulate(&d, &slow, &on, NULL) == PT_OK);
    CHECK(on.step_time < r2.step_time && on.dp_comm_s < r2.dp_comm_s && on.dp_hidden_s > 0);
    CHECK(on.step_time > r2.step_time - r2.dp_comm_s); /* (not faster than its compute) */
    d.pp = 2, d.gpus = 4;
    CHECK(pt_plan_simulate(&d, &slow, &on, NULL) == PT_ERR_CONFIG &&
          strstr(pt_last_error(), "zero=3 with pipeline stages (pp=2) is not simulated for "
                                  "ptrain's executor"));
}

/* The simulator's ZeRO 3 (ptrain's executor) moves the bytes the executor
   does: a real step of dp 2 thread ranks, 2 micro-batches, overlap on and
   off, traced; each dp gather or reduce-scatter it runs passes half its
   bucket through a rank, and their sum is the simulated stage's dp_bytes
   (wte in 3 runs of rows, 4 layers, the final norm: 34 gathers and 22
   reduce-scatters a step). With overlap on, each micro-batch's embedding
   gathers the wte rows its tokens read and wpe in one sum
   (pt__z3_embed_compact) and averages their gradients in one
   (pt__z3_embed_sparse) instead of wte's 3 gathers and 3 reduce-scatters:
   30 gathers, 18 reductions; each of the 4 is two all-reduces, the mask of
   the V rows (MAX) and the R rows both ranks' tokens read with wpe's T rows
   (SUM), each passing its floats through a rank. The ranks' tokens differ
   (128 rows a micro-batch), where the simulator expects 125 of V = 2048 for
   uniform tokens: within 1%. */
typedef struct z3_count {
    int overlap, gathers, reduces;
    double bytes, emb; /* the trace's bytes (whole buckets); the embedding's buckets' halves */
} z3_count;

static pt_gpt_desc z3_count_desc(void) {
    pt_gpt_desc d;
    ZERO(d);
    d.config = cfg_make(2048, 32, 4, 4, 64);
    d.batch = 2, d.seq = 32, d.zero = 3, d.grad_accum = 2;
    return d;
}

static pt_status z3_count_rank(pt_comm *w, void *arg) {
    z3_count *c = (z3_count *)arg;
    pt_grid g;
    pt_gpt m;
    pt_gpt_desc d = z3_count_desc();
    pt_step_desc sd;
    pt_trace tr;
    pt_adamw_config opt = pt_adamw_default();
    int x[128], y[128], i, s;
    pt_status st;
    ZERO(tr);
    if ((st = pt_grid_init(&g, w, 1, 2, 1)) != PT_OK) return st;
    d.grid = &g;
    if ((st = pt_gpt_init(&m, &d)) != PT_OK) {
        pt_grid_free(&g);
        return st;
    }
    pt_gpt_init_weights(&m, 1);
    for (i = 0; i < 128; i++) x[i] = (i * 7 + 1000 * w->rank) % 2048, y[i] = i * 13 % 2048;
    ZERO(sd);
    sd.inputs = x, sd.targets = y, sd.B = 4, sd.T = 32, sd.adamw = &opt, sd.lr = 1e-3f;
    sd.overlap = c->overlap ? PT_OVERLAP_ON : PT_OVERLAP_OFF;
    for (s = 0; s < 2 && st == PT_OK; s++) { /* the second step traced */
        sd.trace = s ? &tr : NULL;
        st = pt_gpt_step(&m, &sd, NULL);
    }
    if (st == PT_OK && w->rank == 0) {
        pt__exec_layout o = pt__exec_layout_of(&m);
        for (i = 0; i < o.num_buckets && !o.buckets[i].nl; i++)
            c->emb += (double)o.buckets[i].numel * sizeof(float) / 2;
        for (i = 0; i < tr.count; i++) {
            const pt_trace_event *e = &tr.events[i];
            if (e->kind != PT_TRACE_DP_GATHER && e->kind != PT_TRACE_DP_REDUCE) continue;
            c->gathers += e->kind == PT_TRACE_DP_GATHER, c->reduces += e->kind == PT_TRACE_DP_REDUCE;
            c->bytes += (double)o.buckets[e->micro].numel * sizeof(float) / 2;
        }
    }
    pt_trace_free(&tr);
    pt_gpt_free(&m);
    pt_grid_free(&g);
    return st;
}

static void test_sim_zero3_executor_bytes(void) {
    pt_hw hw;
    pt_plan_desc d;
    pt_plan_result r;
    int ov;
    double off = 0.0, want;
    CHECK(pt_hw_preset("a100-80g", &hw) == PT_OK);
    for (ov = 0; ov < 2; ov++) {
        z3_count c;
        ZERO(c);
        c.overlap = ov;
        if (pt_comm_threads_run(2, z3_count_rank, &c) != PT_OK) {
            FAIL("%s", pt_last_error());
            return;
        }
        ZERO(d);
        d.model = z3_count_desc();
        d.model.grad_accum = 0;
        d.tp = 1, d.pp = 1, d.gpus = 2, d.batch = 8, d.exec = PT_EXEC_PTRAIN;
        d.overlap = ov ? PT_OVERLAP_ON : PT_OVERLAP_OFF;
        CHECK(pt_plan_simulate(&d, &hw, &r, NULL) == PT_OK);
        CHECK(c.gathers == (ov ? 30 : 34) && c.reduces == (ov ? 18 : 22));
        if (ov) { /* 2 micro-batches: F's 3 gathers and B's 3 reductions of wte's buckets
                     gone, 2 compact sums each (V = 2048, R = 128 rows, C = 64, wpe T = 32) */
            want = off - 4 * c.emb + 4 * 4.0 * (2048 + (128 * 64 + 32 * 64));
            if (!(fabs(r.stage[0].dp_bytes / want - 1) < 0.01 && r.stage[0].dp_bytes < off))
                FAIL("ZeRO 3, overlap on: the executor moves %.0f bytes a rank over dp in a "
                     "step (its embedding's rows compact), the simulator %.0f (overlap off: "
                     "%.0f)", want, r.stage[0].dp_bytes, off);
            continue;
        }
        off = c.bytes;
        if (!(c.bytes > 0 && fabs(r.stage[0].dp_bytes / c.bytes - 1) < 1e-9))
            FAIL("ZeRO 3, overlap %d: the executor moves %.0f bytes a rank over dp in a step "
                 "(%d gathers, %d reduce-scatters), the simulator %.0f", ov, c.bytes, c.gathers,
                 c.reduces, r.stage[0].dp_bytes);
    }
}

/* Overlap in the simulator (pt_plan_desc.overlap), one stage, dp 2: with
   free links on and off take the same time; on a link whose transfers take
   about the compute's time, on is faster than off but not faster than the
   compute nor the link (its transfers run one at a time); the trace's dp
   transfers never overlap on a rank, add up to the modeled communication,
   some reductions start inside backward, and the forward ends after the
   gathers it waits for (ZeRO 1); ptrain's executor overlaps by default, a GPU
   profile's does not; larger buckets make fewer; bad values are refused. */
static void test_sim_overlap(void) {
    pt_hw hw, fast, slow;
    pt_plan_desc d;
    pt_plan_result on, off, r;
    pt_trace tr;
    int zero, i;
    CHECK(pt_hw_preset("a100-80g", &hw) == PT_OK);
    memset(&d, 0, sizeof d);
    d.model.config = cfg_make(8192, 0, 8, 16, 1024), d.model.seq = 512, d.model.batch = 4;
    d.tp = 1, d.pp = 1, d.gpus = 2, d.batch = 8; /* m = 1 */
    d.exec = PT_EXEC_PTRAIN; /* (bucket by bucket either way; Megatron-LM's off: whole) */
    fast = hw;
    fast.intra_bw = fast.inter_bw = 1e30, fast.intra_lat = fast.inter_lat = 0.0;
    for (zero = 0; zero <= 1; zero++) {
        double comm, compute, b_end = 0.0, f_end = 0.0, g0_end = -1.0, last = -1.0, sum = 0.0;
        int inside = 0, inside_at = 0, b_at = -1, order = 1;
        d.model.zero = zero;
        d.overlap = PT_OVERLAP_ON;
        CHECK(pt_plan_simulate(&d, &fast, &on, NULL) == PT_OK);
        d.overlap = PT_OVERLAP_OFF;
        CHECK(pt_plan_simulate(&d, &fast, &off, NULL) == PT_OK);
        CHECK(fabs(on.step_time - off.step_time) < 1e-9 * off.step_time);
        /* a link at which the dp transfers take as long as the compute */
        CHECK(pt_plan_simulate(&d, &hw, &off, NULL) == PT_OK);
        slow = hw;
        slow.intra_bw = slow.inter_bw = hw.intra_bw * off.dp_comm_s / off.compute_s;
        CHECK(pt_plan_simulate(&d, &slow, &off, NULL) == PT_OK);
        comm = off.dp_comm_s, compute = off.compute_s;
        d.overlap = PT_OVERLAP_ON;
        memset(&tr, 0, sizeof tr);
        CHECK(pt_plan_simulate(&d, &slow, &on, &tr) == PT_OK);
        if (!(on.step_time < 0.85 * off.step_time && on.step_time >= comm * (1 - 1e-9) &&
              on.step_time >= compute * (1 - 1e-9)))
            FAIL("ZeRO %d: overlap on %.6g s, off %.6g s, compute %.6g s, link %.6g s", zero,
                 on.step_time, off.step_time, compute, comm);
        CHECK(on.dp_buckets > 8 && fabs(on.dp_comm_s + on.dp_hidden_s - comm) < 1e-9 * comm);
        for (i = 0; i < tr.count; i++) {
            const pt_trace_event *e = &tr.events[i];
            if (e->kind == PT_ACT_B && e->start + e->dur > b_end) b_end = e->start + e->dur, b_at = e->at;
            if (e->kind == PT_ACT_F && f_end == 0.0) f_end = e->start + e->dur;
        }
        for (i = 0; i < tr.count; i++) { /* (added in the link's order) */
            const pt_trace_event *e = &tr.events[i];
            if (e->kind < PT_ACT_COUNT) continue;
            if (e->start < last - 1e-12) order = 0;
            last = e->start + e->dur, sum += e->dur;
            if (e->kind == PT_TRACE_DP_REDUCE && e->start < b_end) inside++;
            if (e->kind == PT_TRACE_DP_REDUCE) inside_at += e->at == b_at; /* its ordinal, too */
            if (e->kind == PT_TRACE_DP_GATHER && e->start + e->dur > g0_end) g0_end = e->start + e->dur;
        }
        if (!(order && fabs(sum - comm) < 1e-9 * comm && inside > 0 && inside_at == inside))
            FAIL("ZeRO %d trace: transfers in turn %d, their sum %.9g s of %.9g, %d reductions "
                 "inside backward (%d started in its action)", zero, order, sum, comm, inside,
                 inside_at);
        if (zero == 1 && !(g0_end > 0 && f_end >= g0_end)) /* (its head waits for the last) */
            FAIL("the forward ends at %.6g s, before the last gather's end %.6g s", f_end, g0_end);
        pt_trace_free(&tr);
        /* the default: the executor's */
        d.overlap = PT_OVERLAP_DEFAULT;
        CHECK(pt_plan_simulate(&d, &slow, &r, NULL) == PT_OK && r.dp_hidden_s > 0.0);
        d.exec = PT_EXEC_DEFAULT; /* the profile's: Megatron-LM */
        CHECK(pt_plan_simulate(&d, &slow, &r, NULL) == PT_OK && r.dp_hidden_s == 0.0 &&
              r.dp_buckets == 1);
        d.exec = PT_EXEC_PTRAIN;
    }
    /* a transfer behind the compute costs the cores (comm_cpu): the overlapped step
       grows by about that cost, the one without overlap (its transfers wait) does not */
    {
        pt_hw busy_cores = slow;
        pt_plan_result r0, r1, f0, f1;
        double vol = 0.0;
        d.overlap = PT_OVERLAP_ON;
        CHECK(pt_plan_simulate(&d, &slow, &r0, NULL) == PT_OK);
        busy_cores.comm_cpu = 0.2 * r0.compute_s / (2.0 * r0.stage[0].dp_bytes);
        CHECK(pt_plan_simulate(&d, &busy_cores, &r1, NULL) == PT_OK);
        d.overlap = PT_OVERLAP_OFF;
        CHECK(pt_plan_simulate(&d, &slow, &f0, NULL) == PT_OK);
        CHECK(pt_plan_simulate(&d, &busy_cores, &f1, NULL) == PT_OK);
        vol = busy_cores.comm_cpu * r0.stage[0].dp_bytes; /* ZeRO 1: (k-1)/k of 2 passes */
        if (!(r1.step_time > r0.step_time + 0.05 * vol && r1.step_time < r0.step_time + 2.0 * vol &&
              f1.step_time == f0.step_time))
            FAIL("comm_cpu: overlapped step %.6g -> %.6g s (the cost %.6g s), without %.6g -> "
                 "%.6g s", r0.step_time, r1.step_time, vol, f0.step_time, f1.step_time);
    }
    /* buckets of at least 3 layers' bytes */
    d.overlap = PT_OVERLAP_ON;
    d.model.bucket_bytes = (size_t)3 * 12 * 1024 * 1024 * 4;
    CHECK(pt_plan_simulate(&d, &slow, &r, NULL) == PT_OK && r.dp_buckets < on.dp_buckets - 4);
    d.model.zero = 2;
    CHECK(pt_plan_simulate(&d, &slow, &r, NULL) == PT_ERR_CONFIG &&
          strstr(pt_last_error(), "bucket_bytes=") && strstr(pt_last_error(), "zero=2"));
    d.model.zero = 1, d.model.bucket_bytes = (size_t)1 << 40;
    CHECK(pt_plan_simulate(&d, &slow, &r, NULL) != PT_OK &&
          strstr(pt_last_error(), "more than the model"));
    d.model.bucket_bytes = 1 << 20, d.gpus = 1, d.batch = 4;
    CHECK(pt_plan_simulate(&d, &slow, &r, NULL) == PT_ERR_CONFIG &&
          strstr(pt_last_error(), "without data parallelism"));
    d.model.bucket_bytes = 0, d.overlap = (pt_overlap)7;
    CHECK(pt_plan_simulate(&d, &slow, &r, NULL) == PT_ERR_CONFIG &&
          strstr(pt_last_error(), "overlap=7"));
}

/* Impossible plans say why; one that does not fit names the rank and bytes. */
static void test_sim_errors(void) {
    pt_hw hw;
    pt_plan_desc d;
    pt_plan_result r;
    CHECK(pt_hw_preset("tpu", &hw) == PT_ERR_CONFIG && strstr(pt_last_error(), "mi250x"));
    CHECK(pt_hw_preset("mi250x", &hw) == PT_OK);
    memset(&d, 0, sizeof d);
    d.model.config = cfg_make(51200, 0, 128, 160, 25600), d.model.seq = 2048, d.model.batch = 1;
    d.tp = 8, d.pp = 8, d.gpus = 512, d.batch = 512;
    CHECK(pt_plan_simulate(&d, &hw, &r, NULL) == PT_ERR_OOM);
    CHECK(strstr(pt_last_error(), "out of memory on rank 0: needs") &&
          strstr(pt_last_error(), "has 64.0 GiB"));
    CHECK(r.mem.total > hw.mem_bytes && !r.fits);
    d.gpus = 500;
    CHECK(pt_plan_simulate(&d, &hw, &r, NULL) == PT_ERR_CONFIG &&
          strstr(pt_last_error(), "not a multiple of tp x pp = 64"));
    d.gpus = 512, d.tp = 3;
    CHECK(pt_plan_simulate(&d, &hw, &r, NULL) == PT_ERR_CONFIG &&
          strstr(pt_last_error(), "tp=3 does not divide heads=160"));
    d.tp = 8, d.batch = 100;
    CHECK(pt_plan_simulate(&d, &hw, &r, NULL) == PT_ERR_CONFIG &&
          strstr(pt_last_error(), "batch=100 is not divisible by dp x micro-batch"));
    d.batch = 512, d.model.zero = 3;
    CHECK(pt_plan_simulate(&d, &hw, &r, NULL) == PT_ERR_CONFIG &&
          strstr(pt_last_error(), "zero=3"));
}

/* The plan takes a real run's pt_gpt_desc as it is: what the simulator sets
   for each stage's meta build (grid, meta, inference, grad_accum,
   schedule_report; the profile's precision) changes nothing, on ptrain's
   executor, whose memory is the meta build's exactly. */
static void test_plan_model_desc(void) {
    pt_hw hw;
    pt_plan_desc d;
    pt_plan_result a, b;
    pt_grid g;
    int st;
    CHECK(pt_hw_preset("a100-80g", &hw) == PT_OK);
    memset(&d, 0, sizeof d);
    d.model.config = cfg_make(512, 64, 4, 4, 64), d.model.seq = 32, d.model.batch = 1;
    d.model.zero = 1, d.model.schedule = PT_SCHED_ZB_H1;
    d.tp = 1, d.pp = 2, d.gpus = 4, d.batch = 8, d.exec = PT_EXEC_PTRAIN;
    CHECK_ST(pt_plan_simulate(&d, &hw, &a, NULL), PT_OK);
    memset(&g, 0, sizeof g);
    g.tp = g.dp = g.pp = 1; /* a run's one-rank grid */
    d.model.grid = &g, d.model.meta = 0, d.model.inference = 1, d.model.grad_accum = 3;
    d.model.precision = PT_PRECISION_BF16;
    CHECK_ST(pt_plan_simulate(&d, &hw, &b, NULL), PT_OK);
    if (g_fail) return;
    CHECK(a.step_time == b.step_time && a.mem.total == b.mem.total && a.micro_batches == 4);
    for (st = 0; st < 2; st++)
        if (!(a.stage[st].mem.params == b.stage[st].mem.params &&
              a.stage[st].mem.grads == b.stage[st].mem.grads &&
              a.stage[st].mem.optimizer == b.stage[st].mem.optimizer &&
              a.stage[st].mem.activations == b.stage[st].mem.activations &&
              a.stage[st].mem.grads > 0))
            FAIL("stage %d: the run's desc plans other bytes (grads %.0f, %.0f; activations %.0f, "
                 "%.0f)", st, a.stage[st].mem.grads, b.stage[st].mem.grads,
                 a.stage[st].mem.activations, b.stage[st].mem.activations);
}

/* Collectives: ring volume 2(n-1)/n, the slower link across nodes. */
static void test_hw_comm(void) {
    pt_hw hw;
    double in, across;
    CHECK(pt_hw_preset("a100-80g", &hw) == PT_OK);
    in = pt_hw_comm_seconds(&hw, PT_COLL_ALL_REDUCE, 1e9, 8, 8);
    across = pt_hw_comm_seconds(&hw, PT_COLL_ALL_REDUCE, 1e9, 16, 8);
    CHECK(pt_hw_comm_seconds(&hw, PT_COLL_ALL_REDUCE, 1e9, 1, 8) == 0.0 && in > 0 && across > 5 * in);
    CHECK(fabs(in - (14 * hw.intra_lat + 2.0 * 7 / 8 * 1e9 / hw.intra_bw)) < 1e-9);
    CHECK(pt_hw_comm_seconds(&hw, PT_COLL_REDUCE_SCATTER, 1e9, 8, 8) < in); /* half an all-reduce */
    CHECK(pt_hw_gemm_seconds(&hw, 64, 64, 64, 1, 2) * 512 >
          pt_hw_gemm_seconds(&hw, 512, 512, 512, 1, 2)); /* small GEMMs run worse */
}

/* Tiles and waves (gemm_sms): 12 x 11 tiles of 128 x 256 are one wave of 132 SMs;
   one more row of outputs pads to a 13th row of tiles and a second wave, twice the
   loop's time; the K loop at K / (K + gemm_dim), the M x N store added after it. */
static void test_hw_gemm_tiles(void) {
    pt_hw hw;
    double K = 4096, e = 2, rate, loop, one, two;
    CHECK(pt_hw_preset("h100-80g", &hw) == PT_OK);
    hw.gemm_sms = 132, hw.gemm_tile_m = 128, hw.gemm_tile_n = 256, hw.gemm_dim = 64;
    rate = hw.peak_flops * hw.gemm_eff * K / (K + hw.gemm_dim);
    loop = 2.0 * 132 * 128 * 256 * K / rate; /* one wave of whole tiles */
    one = pt_hw_gemm_seconds(&hw, 1536, 2816, K, 1, e);
    two = pt_hw_gemm_seconds(&hw, 1537, 2816, K, 1, e);
    CHECK(fabs(one - (loop + e * 1536 * 2816 / hw.mem_bw + hw.kernel_s)) < 1e-12);
    CHECK(fabs(two - (2 * loop + e * 1537 * 2816 / hw.mem_bw + hw.kernel_s)) < 1e-12);
}

/* A profile survives save and load; a broken file is an error, not zeros. */
static void test_hw_file(void) {
    pt_hw a, b;
    char dir[] = "/tmp/ptrain_hw_XXXXXX", path[64];
    FILE *f;
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/hw.txt", dir);
    CHECK(pt_hw_preset("h100-80g", &a) == PT_OK);
    CHECK(pt_hw_save(&a, path) == PT_OK);
    CHECK(pt_hw_load(path, &b) == PT_OK);
    CHECK(strcmp(a.name, b.name) == 0 && fabs(a.peak_flops / b.peak_flops - 1) < 1e-5 &&
          a.per_node == b.per_node && a.exec == b.exec);
    f = fopen(path, "w");
    CHECK(f != NULL);
    fputs("name = x\npeak_flops = fast\n", f);
    fclose(f);
    CHECK(pt_hw_load(path, &b) == PT_ERR_FORMAT && strstr(pt_last_error(), "not a number"));
    f = fopen(path, "w");
    fputs("name = x\npeak_flops = 1e12\n", f);
    fclose(f);
    CHECK(pt_hw_load(path, &b) == PT_ERR_FORMAT && strstr(pt_last_error(), "incomplete"));
    f = fopen(path, "w"); /* an int field beyond int: refused before converting */
    fputs("per_node = 1e30\n", f);
    fclose(f);
    CHECK(pt_hw_load(path, &b) == PT_ERR_FORMAT &&
          strstr(pt_last_error(), "per_node = '1e30' is not an integer in [0, 1048576]"));
    a.gemm_sms = 132, a.gemm_tile_m = 128, a.gemm_tile_n = 0; /* tiles without a size */
    CHECK(pt_hw_save(&a, path) == PT_OK);
    CHECK(pt_hw_load(path, &b) == PT_ERR_FORMAT && strstr(pt_last_error(), "gemm_tile_n"));
    a.gemm_tile_n = 256; /* and with one, the tiles' fields survive */
    CHECK(pt_hw_save(&a, path) == PT_OK && pt_hw_load(path, &b) == PT_OK);
    CHECK(b.gemm_sms == 132 && b.gemm_tile_m == 128 && b.gemm_tile_n == 256);
    a.name[0] = 0; /* a profile without a name saves to a file that loads */
    CHECK(pt_hw_save(&a, path) == PT_OK);
    CHECK(pt_hw_load(path, &b) == PT_OK && b.name[0] == 0 && b.per_node == a.per_node);
    remove(path);
    CHECK(pt_hw_load(path, &b) == PT_ERR_IO);
    rmdir(dir);
}

/* ======================================================================== */
/* LLaMA-style blocks: RMSNorm, RoPE, SwiGLU, nn.Linear, grouped-query        */
/* attention, and the model built from them                                  */
/* ======================================================================== */

typedef struct largs {
    float *out, *x, *w, *b, *rstd, *cs, *lse, *scratch;
    int N, C, T, B, NH, NKV, nh, hd, stride, IN, OUT, F, slots;
    float eps;
} largs;

static void fwd_rmsnorm(void *p) {
    largs *k = (largs *)p;
    pt_rmsnorm_forward(k->out, k->rstd, k->x, k->w, k->N, k->C, k->eps);
}
static void fwd_rope(void *p) { /* out = rope(x), in place on a copy */
    largs *k = (largs *)p;
    memcpy(k->out, k->x, sizeof(float) * (size_t)k->N * k->stride);
    pt_rope_forward(k->out, k->cs, k->N, k->T, k->nh, k->hd, k->stride);
}
static void fwd_swiglu(void *p) {
    largs *k = (largs *)p;
    pt_swiglu_forward(k->out, k->x, k->N, k->F);
}
static void fwd_linear(void *p) {
    largs *k = (largs *)p;
    pt_linear_forward(tctx(), k->out, k->x, k->w, k->b, k->N, k->IN, k->OUT);
}
static void fwd_attention_gqa(void *p) {
    largs *k = (largs *)p;
    pt_attention_forward(tctx(), k->out, k->lse, k->x, k->scratch, k->slots, k->B, k->T, k->C,
                         k->NH, k->NKV);
}

/* y = x / sqrt(mean(x^2) + eps) * w in double; eps large enough to matter. */
static void test_rmsnorm(void) {
    enum { N = 4, C = 6 };
    largs k;
    float *R = frand(N * C, -1, 1), *dx, *dw, *dx0, *dw0;
    double *ref = TALLOC(double, N * C);
    int n, c;
    ZERO(k);
    k.N = N, k.C = C, k.eps = 1e-2f;
    k.x = frand(N * C, -2, 2), k.w = frand(C, 0.5, 1.5);
    k.out = TALLOC(float, N * C), k.rstd = TALLOC(float, N);
    fwd_rmsnorm(&k);
    for (n = 0; n < N; n++) {
        double ms = 0.0;
        for (c = 0; c < C; c++) ms += (double)k.x[n * C + c] * k.x[n * C + c];
        for (c = 0; c < C; c++)
            ref[n * C + c] = k.x[n * C + c] / sqrt(ms / C + (double)k.eps) * k.w[c];
    }
    CHECK_CLOSE("rmsnorm out", k.out, ref, N * C, 1e-6, 1e-5);
    dx = frand(N * C, -1, 1), dw = frand(C, -1, 1);
    dx0 = fcopy(dx, N * C), dw0 = fcopy(dw, C);
    pt_rmsnorm_backward(dx, dw, R, k.x, k.w, k.rstd, N, C);
    FD_CHECK("rmsnorm dinp", fwd_rmsnorm, &k, k.out, R, N * C, k.x, fdelta(dx, dx0, N * C), N * C);
    FD_CHECK("rmsnorm dweight", fwd_rmsnorm, &k, k.out, R, N * C, k.w, fdelta(dw, dw0, C), C);
}

/* Hugging Face's rotate_half in double: f_j = theta^(-2j/hd) (LLaMA 3: scaled
   as its _compute_llama3_parameters), out = u cos + rotate_half(u) sin, on
   the first nh heads of each row only; backward against finite differences. */
static double llama3_freq(double f, const pt_rope_scaling *sc) {
    double pi = 3.141592653589793, w = 2 * pi / f, ctx = sc->original_max_pos;
    double lo_w = ctx / sc->low_freq_factor, hi_w = ctx / sc->high_freq_factor, sm;
    double scaled = w > lo_w ? f / sc->factor : f;
    if (w < hi_w || w > lo_w) return scaled;
    sm = (ctx / w - sc->low_freq_factor) / (sc->high_freq_factor - sc->low_freq_factor);
    return (1 - sm) * scaled / sc->factor + sm * scaled;
}
static void check_rope(const pt_rope_scaling *sc, float theta, int T, int hd) {
    enum { B = 2, NHALL = 3, NH = 2 };
    int stride = NHALL * hd + 3, N = B * T, n, h, j, h2 = hd / 2;
    largs k;
    float *R = frand((size_t)N * stride, -1, 1), *dx;
    double *ref = TALLOC(double, (size_t)N * stride);
    char what[96];
    ZERO(k);
    k.N = N, k.T = T, k.nh = NH, k.hd = hd, k.stride = stride;
    k.x = frand((size_t)N * stride, -1, 1), k.out = TALLOC(float, (size_t)N * stride);
    k.cs = TALLOC(float, (size_t)T * hd);
    pt_rope_table(k.cs, T, hd, theta, sc);
    fwd_rope(&k);
    for (n = 0; n < N; n++)
        for (j = 0; j < stride; j++) ref[n * stride + j] = k.x[n * stride + j];
    for (n = 0; n < N; n++)
        for (h = 0; h < NH; h++)
            for (j = 0; j < hd; j++) {
                const float *u = k.x + n * stride + h * hd;
                double f = pow(theta, -2.0 * (j % h2) / hd), t = n % T;
                double rot = j < h2 ? -u[j + h2] : u[j - h2];
                if (sc) f = llama3_freq(f, sc);
                ref[n * stride + h * hd + j] = u[j] * cos(t * f) + rot * sin(t * f);
            }
    snprintf(what, sizeof what, "rope forward (theta %g%s)", (double)theta, sc ? ", llama3" : "");
    CHECK_CLOSE(what, k.out, ref, (size_t)N * stride, 1e-6, 1e-5);
    dx = fcopy(R, (size_t)N * stride);
    pt_rope_backward(dx, k.cs, N, T, NH, hd, stride);
    snprintf(what, sizeof what, "rope backward (theta %g%s)", (double)theta, sc ? ", llama3" : "");
    FD_CHECK(what, fwd_rope, &k, k.out, R, (size_t)N * stride, k.x, dx, (size_t)N * stride);
}
static void test_rope(void) {
    pt_rope_scaling sc;
    check_rope(NULL, 10000.0f, 5, 8);
    check_rope(NULL, 7.0f, 9, 6); /* small theta: fast rotations at every lane */
    /* LLaMA 3.1's settings on a short context: wavelengths on all three sides */
    sc.factor = 8.0f, sc.low_freq_factor = 1.0f, sc.high_freq_factor = 4.0f;
    sc.original_max_pos = 64;
    check_rope(&sc, 500000.0f, 7, 16);
}

/* silu(gate) * up in double; backward WRITES dh. */
static void test_swiglu(void) {
    enum { N = 3, F = 5 };
    largs k;
    float *R = frand(N * F, -1, 1), *dh = frand(N * 2 * F, 1e3, 2e3);
    double *ref = TALLOC(double, N * F);
    int n, j;
    ZERO(k);
    k.N = N, k.F = F, k.x = frand(N * 2 * F, -4, 4), k.out = TALLOC(float, N * F);
    fwd_swiglu(&k);
    for (n = 0; n < N; n++)
        for (j = 0; j < F; j++) {
            double g = k.x[n * 2 * F + j], u = k.x[n * 2 * F + F + j];
            ref[n * F + j] = g / (1.0 + exp(-g)) * u;
        }
    CHECK_CLOSE("swiglu forward", k.out, ref, N * F, 1e-6, 1e-5);
    pt_swiglu_backward(dh, k.x, R, N, F); /* dh held 1e3..2e3: it must be overwritten */
    FD_CHECK("swiglu d[gate|up] (written)", fwd_swiglu, &k, k.out, R, N * F, k.x, dh, N * 2 * F);
}

/* nn.Linear layout out[N,OUT] = x[N,IN] @ w[OUT,IN]^T + b, with and without bias. */
static void test_linear(void) {
    enum { N = 4, IN = 5, OUT = 7 };
    int with_bias;
    for (with_bias = 1; with_bias >= 0; with_bias--) {
        largs k;
        float *R = frand(N * OUT, -1, 1), *dx, *dw, *db = NULL, *dx0, *dw0, *db0 = NULL;
        double *ref = TALLOC(double, N * OUT);
        int n, o, i;
        ZERO(k);
        k.N = N, k.IN = IN, k.OUT = OUT;
        k.x = frand(N * IN, -1, 1), k.w = frand(OUT * IN, -1, 1);
        k.b = with_bias ? frand(OUT, -1, 1) : NULL;
        k.out = frand(N * OUT, -1, 1); /* garbage: forward must overwrite it */
        fwd_linear(&k);
        for (n = 0; n < N; n++)
            for (o = 0; o < OUT; o++) {
                double acc = with_bias ? k.b[o] : 0.0;
                for (i = 0; i < IN; i++) acc += (double)k.x[n * IN + i] * k.w[o * IN + i];
                ref[n * OUT + o] = acc;
            }
        CHECK_CLOSE(with_bias ? "linear forward" : "linear forward, no bias", k.out, ref,
                    N * OUT, 1e-6, 1e-5);
        dx = frand(N * IN, -1, 1), dw = frand(OUT * IN, -1, 1);
        if (with_bias) db = frand(OUT, -1, 1), db0 = fcopy(db, OUT);
        dx0 = fcopy(dx, N * IN), dw0 = fcopy(dw, OUT * IN);
        pt_linear_backward(tctx(), dx, dw, db, R, k.x, k.w, N, IN, OUT);
        FD_CHECK("linear dinp", fwd_linear, &k, k.out, R, N * OUT, k.x, fdelta(dx, dx0, N * IN),
                 N * IN);
        FD_CHECK("linear dweight", fwd_linear, &k, k.out, R, N * OUT, k.w,
                 fdelta(dw, dw0, OUT * IN), OUT * IN);
        if (with_bias)
            FD_CHECK("linear dbias", fwd_linear, &k, k.out, R, N * OUT, k.b, fdelta(db, db0, OUT),
                     OUT);
    }
}

/* Grouped-query attention on [q (NH)|k (NKV)|v (NKV)] against a naive double
   reference in which query head h reads key/value head h / (NH/NKV), and
   finite differences of dqkv (which accumulates, shared k/v heads included). */
static void check_attention_gqa(int B, int T, int NH, int NKV, int hd) {
    int C = NH * hd, C3 = C + 2 * NKV * hd, N = B * T, G = NH / NKV, b, h, t, u, i;
    largs k;
    float *R = frand((size_t)N * C, -1, 1), *dqkv, *dqkv0;
    double *ref = TALLOC(double, (size_t)N * C), *sc = TALLOC(double, T);
    char what[96];
    ZERO(k);
    k.B = B, k.T = T, k.C = C, k.NH = NH, k.NKV = NKV, k.slots = 2;
    k.x = frand((size_t)N * C3, -1.5, 1.5), k.out = TALLOC(float, (size_t)N * C);
    k.lse = TALLOC(float, B * NH * T);
    k.scratch = frand(pt_attention_scratch_floats(T, k.slots), -1, 1);
    fwd_attention_gqa(&k);
    for (b = 0; b < B; b++)
        for (h = 0; h < NH; h++)
            for (t = 0; t < T; t++) {
                const float *q = k.x + (size_t)(b * T + t) * C3 + h * hd;
                double mx = -1e300, sum = 0.0;
                for (u = 0; u <= t; u++) {
                    const float *kk = k.x + (size_t)(b * T + u) * C3 + C + (h / G) * hd;
                    sc[u] = 0.0;
                    for (i = 0; i < hd; i++) sc[u] += (double)q[i] * kk[i];
                    sc[u] /= sqrt((double)hd);
                    if (sc[u] > mx) mx = sc[u];
                }
                for (u = 0; u <= t; u++) sum += exp(sc[u] - mx);
                for (i = 0; i < hd; i++) {
                    double o = 0.0;
                    for (u = 0; u <= t; u++)
                        o += exp(sc[u] - mx) / sum *
                             k.x[(size_t)(b * T + u) * C3 + C + NKV * hd + (h / G) * hd + i];
                    ref[(size_t)(b * T + t) * C + h * hd + i] = o;
                }
            }
    snprintf(what, sizeof what, "attention NH=%d NKV=%d T=%d out", NH, NKV, T);
    CHECK_CLOSE(what, k.out, ref, (size_t)N * C, 1e-6, 1e-5);
    dqkv = frand((size_t)N * C3, -1, 1), dqkv0 = fcopy(dqkv, (size_t)N * C3);
    pt_attention_backward(tctx(), dqkv, R, k.out, k.x, k.lse, k.scratch, k.slots, B, T, C, NH,
                          NKV);
    snprintf(what, sizeof what, "attention NH=%d NKV=%d T=%d dqkv", NH, NKV, T);
    fd_check_(__FILE__, __LINE__, what, fwd_attention_gqa, &k, k.out, R, (size_t)N * C, k.x,
              fdelta(dqkv, dqkv0, (size_t)N * C3), NULL, (size_t)N * C3, 5e-3f, FD_ATOL, FD_RTOL);
}
static void test_attention_gqa(void) {
    check_attention_gqa(2, 5, 4, 2, 4);                   /* groups of 2 */
    check_attention_gqa(1, 6, 3, 1, 4);                   /* multi-query */
    check_attention_gqa(1, PT_ATTN_QBLOCK + 3, 4, 2, 2); /* two query blocks */
}

/* Ring attention: a causal attention of T tokens split over cp ranks'
   load-balanced chunks (rank i holds chunks i and 2cp-1-i of size T/(2cp)),
   each rank's queries run against every rank's keys/values in ring order and
   the partials merged; out, lse and dqkv (dk/dv accumulated into the rank
   that holds the block) against the unsplit pt_attention_forward/backward,
   and, for MHA, the reference pair. */
static void check_attention_ring(int B, int T, int NH, int NKV, int hd, int cp) {
    int C = NH * hd, C3 = C + 2 * NKV * hd, c = T / (2 * cp), Tl = 2 * c, r, s, b, t, j, h;
    size_t N = (size_t)B * T, nl = (size_t)B * Tl;
    float *qkv = frand(N * C3, -1.5, 1.5), *dout = frand(N * C, -1, 1);
    float *out = TALLOC(float, N * C), *lse = TALLOC(float, (size_t)B * NH * T);
    float *dqkv = TALLOC(float, N * C3), *scr = TALLOC(float, pt_attention_scratch_floats(T, 2));
    float *rout = TALLOC(float, N * C), *rlse = TALLOC(float, (size_t)B * NH * T);
    float *rdqkv = TALLOC(float, N * C3), *po = TALLOC(float, nl * C);
    float *pl = TALLOC(float, (size_t)B * NH * Tl);
    float **lq = TALLOC(float *, cp), **lo = TALLOC(float *, cp), **ll = TALLOC(float *, cp);
    float **ld = TALLOC(float *, cp), **ldo = TALLOC(float *, cp);
    int **pos = TALLOC(int *, cp);
    char what[96];
    pt_attention_forward(tctx(), out, lse, qkv, scr, 2, B, T, C, NH, NKV);
    pt_attention_backward(tctx(), dqkv, dout, out, qkv, lse, scr, 2, B, T, C, NH, NKV);
    for (r = 0; r < cp; r++) { /* rank r's rows of qkv and dout */
        lq[r] = TALLOC(float, nl * C3), ldo[r] = TALLOC(float, nl * C);
        lo[r] = TALLOC(float, nl * C), ll[r] = TALLOC(float, (size_t)B * NH * Tl);
        ld[r] = TALLOC(float, nl * C3), pos[r] = TALLOC(int, Tl);
        for (j = 0; j < Tl; j++) pos[r][j] = j < c ? r * c + j : (2 * cp - 1 - r) * c + j - c;
        for (b = 0; b < B; b++)
            for (j = 0; j < Tl; j++) {
                memcpy(lq[r] + ((size_t)b * Tl + j) * C3, qkv + ((size_t)b * T + pos[r][j]) * C3,
                       sizeof(float) * C3);
                memcpy(ldo[r] + ((size_t)b * Tl + j) * C, dout + ((size_t)b * T + pos[r][j]) * C,
                       sizeof(float) * C);
            }
    }
    for (r = 0; r < cp; r++) /* forward: step s brings rank r-s's keys/values */
        for (s = 0; s < cp; s++) {
            int src = (r - s + cp) % cp;
            pt_attn_ring ring = {NULL, NULL, 0, 0, NULL, 0};
            ring.qpos = pos[r], ring.kpos = pos[src], ring.Tq = ring.Tk = Tl;
            ring.kv = lq[src] + C, ring.ld = C3;
            pt_attention_ring_forward(tctx(), s ? po : lo[r], s ? pl : ll[r], lq[r], &ring, scr,
                                      2, B, C, NH, NKV);
            if (s) pt_attention_merge(lo[r], ll[r], po, pl, B, Tl, C, NH);
        }
    for (r = 0; r < cp; r++) /* backward: dk, dv of the block into the rank that holds it */
        for (s = 0; s < cp; s++) {
            int src = (r - s + cp) % cp;
            pt_attn_ring ring = {NULL, NULL, 0, 0, NULL, 0};
            ring.qpos = pos[r], ring.kpos = pos[src], ring.Tq = ring.Tk = Tl;
            ring.kv = lq[src] + C, ring.ld = C3;
            pt_attention_ring_backward(tctx(), ld[r], ld[src] + C, ldo[r], lo[r], lq[r], ll[r],
                                       &ring, scr, 2, B, C, NH, NKV);
        }
    for (r = 0; r < cp; r++) /* back to sequence order */
        for (b = 0; b < B; b++)
            for (j = 0; j < Tl; j++) {
                t = pos[r][j];
                memcpy(rout + ((size_t)b * T + t) * C, lo[r] + ((size_t)b * Tl + j) * C,
                       sizeof(float) * C);
                memcpy(rdqkv + ((size_t)b * T + t) * C3, ld[r] + ((size_t)b * Tl + j) * C3,
                       sizeof(float) * C3);
                for (h = 0; h < NH; h++)
                    rlse[((size_t)b * NH + h) * T + t] = ll[r][((size_t)b * NH + h) * Tl + j];
            }
    snprintf(what, sizeof what, "ring attention cp=%d NH=%d NKV=%d T=%d out", cp, NH, NKV, T);
    CHECK_CLOSE(what, rout, to_double(out, N * C), N * C, 1e-6, 1e-5);
    snprintf(what, sizeof what, "ring attention cp=%d NH=%d NKV=%d T=%d lse", cp, NH, NKV, T);
    CHECK_CLOSE(what, rlse, to_double(lse, (size_t)B * NH * T), (size_t)B * NH * T, 1e-6, 1e-6);
    snprintf(what, sizeof what, "ring attention cp=%d NH=%d NKV=%d T=%d dqkv", cp, NH, NKV, T);
    CHECK_CLOSE(what, rdqkv, to_double(dqkv, N * C3), N * C3, 1e-5, 1e-4);
    if (NKV == NH) { /* the reference pair, which stores the T x T probabilities */
        float *att = TALLOC(float, (size_t)B * NH * T * T), *ref = TALLOC(float, N * C);
        float *refd = TALLOC(float, N * C3);
        pt_attention_ref_forward(ref, att, qkv, B, T, C, NH);
        pt_attention_ref_backward(refd, TALLOC(float, (size_t)B * NH * T), dout, qkv, att, B, T,
                                  C, NH);
        CHECK_CLOSE("ring attention out against the reference", rout, to_double(ref, N * C),
                    N * C, 1e-6, 1e-5);
        CHECK_CLOSE("ring attention dqkv against the reference", rdqkv, to_double(refd, N * C3),
                    N * C3, 1e-5, 1e-4);
    }
}
/* The fused attention kernels (ptrain's GEMM kernels selected, an AVX-512
   CPU) against the GEMM form (the portable GEMMs: the products the checks
   above test against the reference and finite differences), at sizes off
   every block (T past multiples of the 48-query and 96-key blocks, hd 32 to
   128, groups of 1, 3 and 4 query heads), fp32 and bf16 (bf16: both round
   the products' operands, at different points of the softmax), and the same
   bits on 1 and 2 threads (B NKV < 2 threads: the forward's query blocks
   split into parts, interleaved); inplace: a workspace slot too small for the
   task's dK and dV, which the backward then sums in place. */
static void attn_fwd_bwd(pt_ctx *c, int B, int T, int NH, int NKV, int hd, const float *qkv,
                         const float *dout, float *out, float *lse, float *dqkv) {
    int C = NH * hd;
    float *scr = TALLOC(float, pt_attention_scratch_floats(T, 2));
    memset(dqkv, 0, sizeof(float) * B * T * (C + 2 * NKV * hd));
    pt_attention_forward(c, out, lse, qkv, scr, 2, B, T, C, NH, NKV);
    pt_attention_backward(c, dqkv, dout, out, qkv, lse, scr, 2, B, T, C, NH, NKV);
}
static void check_attention_fused(int bf16, int B, int T, int NH, int NKV, int hd, int inplace) {
    int C = NH * hd, C3 = C + 2 * NKV * hd, N = B * T, i, th;
    float *qkv = frand((size_t)N * C3, -1.5, 1.5), *dout = frand((size_t)N * C, -1, 1);
    float *out[3], *lse[3], *dq[3];
    double atol = bf16 ? 8e-3 : 2e-6, rtol = bf16 ? 8e-3 : 2e-5, dfac = bf16 ? 2 : 5;
    pt_ctx ctx[2];
    char what[128];
    if (bf16 ? pt_gemm_bf16_select("avx512bf16") != PT_OK : pt_gemm_select("ptrain") != PT_OK) {
        SKIPPED("fused attention (%s): %s", bf16 ? "bf16" : "fp32", pt_last_error());
        pt_gemm_select(NULL), pt_gemm_bf16_select(NULL);
        return;
    }
    for (i = 0; i < 3; i++) {
        out[i] = TALLOC(float, (size_t)N * C), lse[i] = TALLOC(float, (size_t)B * NH * T);
        dq[i] = TALLOC(float, (size_t)N * C3);
    }
    for (th = 0; th < 2; th++) { /* fused on 2 threads, then on 1 */
        pt_ctx_desc d;
        ZERO(d);
        d.threads = 2 - th, d.precision = bf16 ? PT_PRECISION_BF16 : PT_PRECISION_FP32;
        CHECK_ST(pt_ctx_init(&ctx[th], &d), PT_OK);
#ifdef PT__GEMM_X86
        if (inplace) { /* the slot the in-place backward needs, not the local dK and dV */
            pt__fa f;
            size_t need = pt__fa_layout(&f, NULL, T, hd, 1) * sizeof(float);
            CHECK(need < pt__fa_layout(&f, NULL, T, hd, 2) * sizeof(float));
            CHECK(need <= ctx[th].ws_slot);
            ctx[th].ws_slot = need;
        }
#endif
        attn_fwd_bwd(&ctx[th], B, T, NH, NKV, hd, qkv, dout, out[th], lse[th], dq[th]);
    }
    CHECK(memcmp(out[0], out[1], sizeof(float) * N * C) == 0);
    CHECK(memcmp(lse[0], lse[1], sizeof(float) * B * NH * T) == 0);
    CHECK(memcmp(dq[0], dq[1], sizeof(float) * N * C3) == 0);
    CHECK_ST(pt_gemm_select("portable"), PT_OK); /* the GEMM form */
    CHECK_ST(pt_gemm_bf16_select("portable"), PT_OK);
    attn_fwd_bwd(&ctx[0], B, T, NH, NKV, hd, qkv, dout, out[2], lse[2], dq[2]);
    CHECK_ST(pt_gemm_select(NULL), PT_OK);
    CHECK_ST(pt_gemm_bf16_select(NULL), PT_OK);
    snprintf(what, sizeof what, "fused attention %s B=%d T=%d NH=%d NKV=%d hd=%d%s",
             bf16 ? "bf16" : "fp32", B, T, NH, NKV, hd, inplace ? " (dK, dV in place)" : "");
    CHECK_CLOSE(what, out[0], to_double(out[2], (size_t)N * C), (size_t)N * C, atol, rtol);
    CHECK_CLOSE(what, lse[0], to_double(lse[2], (size_t)B * NH * T), (size_t)B * NH * T, atol, rtol);
    CHECK_CLOSE(what, dq[0], to_double(dq[2], (size_t)N * C3), (size_t)N * C3, dfac * atol,
                dfac * rtol);
    pt_ctx_free(&ctx[0]), pt_ctx_free(&ctx[1]);
}
/* pt__fa_exp (16 lanes, fused multiply-adds) against pt__expf: within 2 ulp
   over the softmax's range, 0 below -87.3 and for -inf, +inf past 88.38,
   NaN stays NaN. */
#ifdef PT__GEMM_X86
PT__TARGET_AVX512 static void check_attention_exp(void) {
    float x[16 * 64], y[16 * 64];
    int i, bad = 0;
    if (pt_gemm_select("ptrain") != PT_OK) return; /* not an AVX-512 CPU */
    pt_gemm_select(NULL);
    for (i = 0; i < 16 * 64; i++) x[i] = -90.0f + 180.0f * (float)i / (16 * 64 - 1);
    x[0] = -INFINITY, x[1] = NAN, x[2] = 0.0f, x[3] = -87.29f, x[4] = -87.31f, x[5] = 88.5f;
    x[6] = -1e-8f, x[7] = -0.5f;
    for (i = 0; i < 16 * 64; i += 16) _mm512_storeu_ps(y + i, pt__fa_exp(_mm512_loadu_ps(x + i)));
    for (i = 0; i < 16 * 64; i++) {
        float want = pt__expf(x[i]);
        double ulp = want > 0.0f && isfinite(want) ? nextafterf(want, INFINITY) - want : 0.0;
        if (isnan(want) ? !isnan(y[i]) : isinf(want) || want == 0.0f ? y[i] != want
                                                                   : fabs(y[i] - want) > 2 * ulp)
            bad++, printf("    exp(%.9g) = %.9g, pt__expf %.9g\n", x[i], y[i], want);
    }
    CHECK(bad == 0);
}
#else
static void check_attention_exp(void) {}
#endif
static void test_attention_fused(void) {
    int bf16;
    check_attention_exp();
    for (bf16 = 0; bf16 < 2; bf16++) {
        check_attention_fused(bf16, 2, 101, 3, 1, 32, 0); /* a group of 3, T = 2*48 + 5 */
        check_attention_fused(bf16, 1, 197, 4, 1, 64, 0); /* a group of 4, T = 2*96 + 5 */
        check_attention_fused(bf16, 1, 150, 2, 2, 80, 0); /* no groups, hd past a 32-wide panel */
        check_attention_fused(bf16, 1, 61, 2, 1, 128, 0);
        check_attention_fused(bf16, 2, 197, 2, 1, 64, 1);
    }
    check_attention_ring(1, 200, 4, 1, 64, 2); /* the ring's positions, chunks of 50 */
}

static void test_attention_ring(void) {
    float o[4] = {1, 2, 3, 4}, l[2] = {-INFINITY, 0.5f}, oi[4] = {5, 6, 7, 8};
    float li[2] = {0.25f, -INFINITY};
    check_attention_ring(2, 160, 2, 2, 4, 2); /* chunks of 40: a query block spans two */
    check_attention_ring(1, 70, 2, 2, 4, 5);  /* chunks of 7 */
    check_attention_ring(2, 136, 4, 2, 4, 2); /* grouped-query */
    check_attention_ring(1, 90, 3, 1, 4, 5);  /* multi-query */
    /* the merge with a side that saw nothing (-inf) keeps the other */
    pt_attention_merge(o, l, oi, li, 1, 2, 2, 1);
    CHECK(o[0] == 5 && o[1] == 6 && o[2] == 3 && o[3] == 4 && l[0] == 0.25f && l[1] == 0.5f);
}

/* LLaMA-style configurations of the one block: the whole model's gradients
   against finite differences of the mean loss, as test_model_grad. */
static pt_gpt_config cfg_llama(int V, int block, int L, int NH, int C, int kv, int ffn) {
    pt_gpt_config c = cfg_make(V, block, L, NH, C);
    c.arch = PT_ARCH_LLAMA, c.norm = PT_NORM_RMS, c.pos = PT_POS_ROPE, c.mlp = PT_MLP_SWIGLU;
    c.n_kv_head = kv, c.ffn_hidden = ffn, c.no_bias = 1, c.untied_head = 1;
    c.rope_theta = 100.0f; /* fast rotations, visible in a short sequence */
    return c;
}
static void check_model_grad_cfg(const char *label, pt_gpt_config c) {
    enum { B = 2, T = 5, N = B * T };
    pt_gpt g;
    gpt_run r;
    float *grads, *R = TALLOC(float, N);
    char what[160];
    int i;
    CHECK_ST(gpt_new(&g, c, B, T, 0), PT_OK);
    if (!g.params) return;
    gpt_randomize(&g, 11, 0.6f);
    r.g = &g, r.B = B, r.T = T, r.losses = TALLOC(float, N);
    r.inputs = rand_ids(N, c.vocab_size), r.targets = rand_ids(N, c.vocab_size);
    for (i = 0; i < N; i++) R[i] = 1.0f / N;
    CHECK_ST(pt_gpt_forward(&g, r.inputs, r.targets, B, T), PT_OK);
    CHECK_ST(pt_gpt_backward(&g), PT_OK);
    grads = fcopy(g.grads, g.num_params);
    for (i = 0; i < g.num_tensors; i++) {
        const pt_param *p = &g.table[i];
        const float *gt = grads + p->offset;
        double gmax = 0.0;
        size_t k;
        for (k = 0; k < p->numel; k++) gmax = fmax(gmax, fabs(gt[k]));
        snprintf(what, sizeof what, "%s: %s", label, p->name);
        /* atol 1e-5: the float per-token losses (~1.5e-7 each) over 2h = 1e-2
           bound what a finite difference resolves (q and k gradients of 1e-6
           are below it) */
        fd_check_(__FILE__, __LINE__, what, fwd_gpt, &r, r.losses, R, N, g.params + p->offset,
                  gt, NULL, p->numel, 5e-3f, 2e-4 * gmax + 1e-5, 1e-2);
    }
    pt_gpt_free(&g);
}
static void test_llama_model_grad(void) {
    pt_gpt_config c = cfg_llama(11, 8, 2, 4, 8, 2, 12);
    check_model_grad_cfg("llama (GQA, SwiGLU, RoPE, RMSNorm, untied)", c);
    c.n_kv_head = 1, c.no_bias = 0, c.untied_head = 0, c.norm = PT_NORM_LAYER, c.mlp = PT_MLP_GELU;
    check_model_grad_cfg("llama names (MQA, biases, LayerNorm, GELU, tied)", c);
    c = cfg_make(11, 8, 1, 2, 8); /* GPT-2 names with LLaMA's choices */
    c.norm = PT_NORM_RMS, c.pos = PT_POS_ROPE, c.no_bias = 1, c.untied_head = 1;
    check_model_grad_cfg("gpt2 names (RMSNorm, RoPE, no bias, untied)", c);
}

/* Presets, Hugging Face's names and [out, in] shapes, parameter counts as
   Meta published them, and validation messages naming field and value. */
static void test_llama_config(void) {
    static const struct { const char *name; int64_t params; } published[] = {
        {"llama2-7b", 6738415616LL}, {"llama2-13b", 13015864320LL},
        {"llama3-8b", 8030261248LL}, {"llama2-70b", 68976648192LL}};
    pt_gpt_config c;
    pt_gpt g;
    const pt_param *p;
    int i;
    for (i = 0; i < 4; i++) {
        CHECK_ST(pt_gpt_config_preset(published[i].name, &c), PT_OK);
        CHECK_ST(pt_gpt_config_validate(&c), PT_OK);
        if (pt_gpt_num_params(&c) != published[i].params)
            FAIL("%s: %lld parameters, published %lld", published[i].name,
                 (long long)pt_gpt_num_params(&c), (long long)published[i].params);
    }
    CHECK_ST(pt_gpt_config_preset("llama-tiny", &c), PT_OK);
    CHECK_ST(gpt_new(&g, c, 1, 4, 1), PT_OK); /* meta: the table alone */
    CHECK_EQ(g.num_tensors, 1 + 9 * c.n_layer + 2);
    CHECK(strcmp(g.table[0].name, "model.embed_tokens.weight") == 0);
    p = pt_gpt_find_param(&g, "model.layers.1.self_attn.k_proj.weight");
    CHECK(p && p->full_shape[0] == 2 * 16 && p->full_shape[1] == 64);
    p = pt_gpt_find_param(&g, "model.layers.0.mlp.down_proj.weight");
    CHECK(p && p->full_shape[0] == 64 && p->full_shape[1] == 176 && p->decay);
    p = pt_gpt_find_param(&g, "model.norm.weight");
    CHECK(p && !p->decay);
    CHECK(pt_gpt_find_param(&g, "lm_head.weight") != NULL);
    CHECK(pt_gpt_find_param(&g, "wpe.weight") == NULL);
    pt_gpt_free(&g);
    c.n_kv_head = 3;
    CHECK_ERR(pt_gpt_config_validate(&c), PT_ERR_CONFIG, "n_kv_head=3 must divide n_head=4");
    c.n_kv_head = 2, c.arch = PT_ARCH_GPT2;
    CHECK_ERR(pt_gpt_config_validate(&c), PT_ERR_CONFIG, "mlp=swiglu needs arch=llama");
    CHECK_MSG("n_kv_head=2 != n_head=4");
    c.arch = PT_ARCH_LLAMA, c.pos = PT_POS_LEARNED;
    CHECK_ERR(pt_gpt_config_validate(&c), PT_ERR_CONFIG, "arch=llama needs pos=rope");
    c.pos = PT_POS_ROPE, c.rope_scaling.factor = 8.0f;
    CHECK_ERR(pt_gpt_config_validate(&c), PT_ERR_CONFIG, "rope_scaling: factor=8");
    c.rope_scaling.factor = 0.0f, c.n_embd = 60, c.n_head = 4, c.n_kv_head = 4;
    CHECK_ERR(pt_gpt_config_validate(&c), PT_ERR_CONFIG, "even head size (n_embd/n_head=15)");
    { /* a layout that splits key/value heads: meta builds of the grid's sizes */
        pt_grid grid;
        pt_gpt_desc d;
        ZERO(grid), ZERO(d);
        CHECK_ST(pt_gpt_config_preset("llama3-8b", &d.config), PT_OK);
        grid.tp = 16, grid.dp = 1, grid.pp = 1;
        d.grid = &grid, d.batch = 1, d.seq = 16, d.meta = 1;
        CHECK_ERR(pt_gpt_init(&g, &d), PT_ERR_CONFIG, "tensor_parallel=16 does not divide n_kv_head=8");
        pt_gpt_free(&g);
        grid.tp = 8, grid.pp = 4;
        CHECK_ST(pt_gpt_init(&g, &d), PT_OK); /* 8 kv heads over 8 ranks: one each */
        p = pt_gpt_find_param(&g, "model.layers.0.self_attn.k_proj.weight");
        CHECK(p && p->shape[0] == 128 && p->shape[1] == 4096 && p->shard == PT_SHARD_ROWS);
        p = pt_gpt_find_param(&g, "model.layers.0.mlp.down_proj.weight");
        CHECK(p && p->shape[0] == 4096 && p->shape[1] == 14336 / 8 && p->shard == PT_SHARD_COLS);
        pt_gpt_free(&g);
    }
}

/* KV-cache decoding with RoPE (LLaMA 3 scaling) and grouped-query attention
   (the cache holds only the key/value heads) gives the full forward's logits. */
static void test_llama_decode(void) {
    enum { V = 17, BS = 8, T = 8 };
    pt_gpt_config c = cfg_llama(V, BS, 2, 4, 16, 2, 24);
    pt_gpt g;
    pt_kv_cache kv;
    const float *lg = NULL;
    int *tok = rand_ids(T, V), t, i;
    float *logits = TALLOC(float, T * V);
    double mx = 0.0;
    c.rope_scaling.factor = 4.0f, c.rope_scaling.low_freq_factor = 1.0f;
    c.rope_scaling.high_freq_factor = 2.0f, c.rope_scaling.original_max_pos = 6;
    CHECK_ST(gpt_new(&g, c, 1, T, 0), PT_OK);
    if (!g.params) return;
    gpt_randomize(&g, 4, 0.2f);
    CHECK_ST(pt_gpt_forward(&g, tok, NULL, 1, T), PT_OK);
    CHECK_ST(pt_gpt_gather_logits(&g, logits), PT_OK);
    for (i = 0; i < T * V; i++) mx = fmax(mx, fabs(logits[i]));
    CHECK_ST(pt_kv_cache_init(&kv, &g), PT_OK);
    for (t = 0; t < T; t++) {
        char what[64];
        CHECK_ST(pt_gpt_decode(&g, &kv, tok[t], &lg), PT_OK);
        snprintf(what, sizeof what, "llama decode logits at position %d", t);
        if (lg) CHECK_CLOSE(what, lg, to_double(logits + t * V, V), V, 1e-4 * mx, 0);
    }
    pt_kv_cache_free(&kv);
    pt_gpt_free(&g);
}

/* The paged, batched forward (serving): one call over a whole sequence gives
   the full forward's logits; the same rows split over two calls, or batched
   with another sequence, or reading a prefix block another sequence wrote,
   give bit-identical logits (a row depends only on its own sequence). */
static void check_forward_pages(pt_gpt_config c, const char *name) {
    enum { V = 17, T = 8, BT = 4 };
    pt_gpt g;
    pt_kv_pages kp;
    pt_kv_seq s[2];
    int *tok = rand_ids(T, V), *tb = rand_ids(T, V), i;
    int ba[2] = {0, 1}, bb[2] = {0, 2}, bc[2] = {3, 4}, bad[2] = {0, 9};
    float *ref = TALLOC(float, T * V), *one = TALLOC(float, T * V), *two = TALLOC(float, 4 * V);
    double mx = 0.0;
    char what[96];
    memcpy(tb, tok, sizeof(int) * BT); /* b shares a's first block */
    CHECK_ST(gpt_new(&g, c, 1, T, 0), PT_OK);
    if (!g.params) return;
    gpt_randomize(&g, 4, 0.2f);
    CHECK_ST(pt_gpt_forward(&g, tok, NULL, 1, T), PT_OK);
    CHECK_ST(pt_gpt_gather_logits(&g, ref), PT_OK);
    for (i = 0; i < T * V; i++) mx = fmax(mx, fabs(ref[i]));
    CHECK_ST(pt_kv_pages_init(&kp, &g, BT, 5, 2 * T), PT_OK);
    memset(s, 0, sizeof s);
    s[0].tokens = tok, s[0].blocks = ba, s[0].n = T;
    CHECK_ST(pt_gpt_forward_pages(&g, &kp, s, 1, one), PT_OK);
    snprintf(what, sizeof what, "%s: paged forward vs the full forward", name);
    CHECK_CLOSE(what, one, to_double(ref, T * V), T * V, 1e-4 * mx, 0);
    /* b: its own second block after a's first, batched with a's last token again in c's blocks */
    s[0].tokens = tb + BT, s[0].blocks = bb, s[0].n = T - BT, s[0].pos = BT, s[0].logits_from = 3;
    s[1].tokens = tok, s[1].blocks = bc, s[1].n = T, s[1].logits_from = T - 2;
    CHECK_ST(pt_gpt_forward_pages(&g, &kp, s, 2, two), PT_OK);
    snprintf(what, sizeof what, "%s: rows batched, split and on a shared block", name);
    CHECK(memcmp(two + V, one + (T - 2) * V, sizeof(float) * 2 * V) == 0);
    s[0].tokens = tok + BT, s[0].blocks = ba, s[0].logits_from = 0, s[0].n = T - BT;
    CHECK_ST(pt_gpt_forward_pages(&g, &kp, s, 1, two), PT_OK); /* a's rows 4..7 again */
    CHECK(memcmp(two, one + BT * V, sizeof(float) * 3 * V) == 0);
    s[0].tokens = tb + BT, s[0].blocks = bb, s[0].logits_from = 3; /* b alone */
    CHECK_ST(pt_gpt_forward_pages(&g, &kp, s, 1, two), PT_OK);
    s[1] = s[0], s[1].blocks = ba, s[1].tokens = tok + BT; /* b batched with a */
    CHECK_ST(pt_gpt_forward_pages(&g, &kp, s, 2, two + V), PT_OK);
    CHECK(memcmp(two, two + V, sizeof(float) * V) == 0);
    s[0].pos = T - 1, s[0].n = 2;
    CHECK_ERR(pt_gpt_forward_pages(&g, &kp, s, 1, two), PT_ERR_RANGE, "block_size");
    s[0].pos = 0, s[0].n = T, s[0].blocks = bad, s[0].tokens = tok;
    CHECK_ERR(pt_gpt_forward_pages(&g, &kp, s, 1, two), PT_ERR_RANGE, "blocks[1]=9");
    s[0].blocks = ba, s[1].blocks = bc, s[1].n = T, s[1].pos = 0, s[1].tokens = tok;
    s[1].logits_from = T, s[0].logits_from = T;
    CHECK_ST(pt_gpt_forward_pages(&g, &kp, s, 2, two), PT_OK); /* 16 rows: max_rows */
    kp.max_rows = T + 1;
    CHECK_ERR(pt_gpt_forward_pages(&g, &kp, s, 2, two), PT_ERR_RANGE, "max_rows");
    pt_kv_pages_free(&kp);
    CHECK_ERR(pt_kv_pages_init(&kp, &g, T + 1, 5, 4), PT_ERR_INVALID_ARG, "block_tokens=9");
    pt_gpt_free(&g);
}

static void test_forward_pages(void) {
    pt_gpt_config l = cfg_llama(17, 8, 2, 4, 16, 2, 24);
    check_forward_pages(cfg_make(17, 8, 2, 2, 16), "gpt2");
    check_forward_pages(l, "llama");
}

/* The simulator's LLaMA layer: model FLOPs in closed form (q, k, v of
   n_kv_head heads, three MLP matrices of ffn_hidden), per-rank weights from
   the meta build, and a layout that splits key/value heads refused. */
static void test_llama_plan(void) {
    pt_hw hw;
    pt_plan_desc d;
    pt_plan_result r;
    pt_gpt_config c;
    int k;
    CHECK(pt_hw_preset("a100-80g", &hw) == PT_OK);
    for (k = 0; k < 2; k++) {
        double B, s, l, h, V, ff, rk, mf;
        CHECK_ST(pt_gpt_config_preset(k ? "llama2-70b" : "llama2-13b", &c), PT_OK);
        memset(&d, 0, sizeof d);
        d.model.config = c, d.model.seq = c.block_size, d.model.batch = 1, d.model.zero = 1;
        d.model.recompute = PT_RECOMPUTE_FULL;
        d.tp = k ? 8 : 2, d.pp = k ? 4 : 1, d.gpus = 256, d.batch = 1024;
        CHECK_ST(pt_plan_simulate(&d, &hw, &r, NULL), PT_OK);
        B = d.batch, s = d.model.seq, l = c.n_layer, h = c.n_embd, V = c.vocab_size;
        ff = c.ffn_hidden;
        rk = (double)c.n_kv_head / c.n_head;
        mf = B * s * (l * (6 * h * (h * (2 + 2 * rk) + 3 * ff) + 12 * s * h) + 6 * h * V);
        if (!(fabs(r.model_flops / mf - 1) < 1e-9))
            FAIL("%s: model FLOPs %.6g, closed form %.6g", k ? "llama2-70b" : "llama2-13b",
                 r.model_flops, mf);
        CHECK(r.mem.params > 0 && r.tokens_per_s > 0);
    }
    d.tp = 16, d.pp = 1; /* 70B has 8 key/value heads */
    CHECK_ERR(pt_plan_simulate(&d, &hw, &r, NULL), PT_ERR_CONFIG,
              "tensor_parallel=16 does not divide n_kv_head=8");
}

/* Hugging Face's LLaMA config.json: Meta's published parameter counts from
   their configs, a model.safetensors of the table's names loading back to the
   same logits, and every bad field named with its value. */
static void test_llama_hf_config(void) {
    static const char *llama31_8b =
        "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, "
        "\"bos_token_id\": 128000, \"hidden_act\": \"silu\", \"hidden_size\": 4096, "
        "\"intermediate_size\": 14336, \"max_position_embeddings\": 131072, \"mlp_bias\": false, "
        "\"model_type\": \"llama\", \"num_attention_heads\": 32, \"num_hidden_layers\": 32, "
        "\"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-05, \"rope_scaling\": {\"factor\": 8.0, "
        "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
        "\"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"}, "
        "\"rope_theta\": 500000.0, \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", "
        "\"vocab_size\": 128256}";
    static const char *tiny =
        "{\"model_type\": \"llama\", \"hidden_size\": 16, \"intermediate_size\": 24, "
        "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"num_hidden_layers\": 2, "
        "\"vocab_size\": 13, \"max_position_embeddings\": 8, \"rms_norm_eps\": 1e-6, "
        "\"rope_theta\": 100.0, \"rope_scaling\": null, \"tie_word_embeddings\": true}";
    pt_gpt_config c;
    pt_gpt g, h;
    pt_st_writer w;
    float *logits_g, *logits_h;
    int *in = rand_ids(6, 13), i;
    const char *path = tmp_path("model.safetensors");
    { /* GPT-2's config.json: the gpt2-124m preset */
        static const char *gpt2 =
            "{\"activation_function\": \"gelu_new\", \"architectures\": [\"GPT2LMHeadModel\"], "
            "\"attn_pdrop\": 0.1, \"bos_token_id\": 50256, \"layer_norm_epsilon\": 1e-05, "
            "\"model_type\": \"gpt2\", \"n_ctx\": 1024, \"n_embd\": 768, \"n_head\": 12, "
            "\"n_inner\": null, \"n_layer\": 12, \"n_positions\": 1024, \"vocab_size\": 50257}";
        pt_gpt_config p;
        CHECK_ST(pt_gpt_config_from_hf_json(gpt2, strlen(gpt2), &c), PT_OK);
        CHECK_ST(pt_gpt_config_preset("gpt2-124m", &p), PT_OK);
        CHECK(memcmp(&c, &p, sizeof c) == 0);
    }
    CHECK_ST(pt_gpt_config_from_hf_json(llama31_8b, strlen(llama31_8b), &c), PT_OK);
    CHECK(c.arch == PT_ARCH_LLAMA && c.n_kv_head == 8 && c.ffn_hidden == 14336 && c.untied_head &&
          c.no_bias && c.rope_theta == 500000.0f && c.rope_scaling.factor == 8.0f &&
          c.rope_scaling.original_max_pos == 8192 && c.block_size == 131072);
    CHECK(pt_gpt_num_params(&c) == 8030261248LL);
    { /* no num_key_value_heads: multi-head attention (LLaMA 1 and 2 7B) */
        static const char *mha = "{\"hidden_size\": 32, \"intermediate_size\": 8, "
            "\"num_attention_heads\": 4, \"num_hidden_layers\": 1, \"vocab_size\": 8, "
            "\"max_position_embeddings\": 8}";
        CHECK_ST(pt_gpt_config_from_hf_json(mha, strlen(mha), &c), PT_OK);
        CHECK(c.n_kv_head == 4 && c.ln_eps == 1e-6f && c.rope_theta == 10000.0f);
    }
    /* weights by name: a model.safetensors of the table, into a model of config.json */
    CHECK_ST(pt_gpt_config_from_hf_json(tiny, strlen(tiny), &c), PT_OK);
    CHECK(!c.untied_head && c.ln_eps == 1e-6f && c.rope_scaling.factor == 0.0f);
    CHECK_ST(gpt_new(&g, c, 1, 6, 0), PT_OK);
    CHECK_ST(gpt_new(&h, c, 1, 6, 0), PT_OK);
    if (!g.params || !h.params) return;
    gpt_randomize(&g, 8, 0.2f);
    ZERO(w);
    pt_st_writer_init(&w);
    for (i = 0; i < g.num_tensors; i++)
        CHECK_ST(pt_st_writer_add(&w, g.table[i].name, PT_F32, g.table[i].ndim,
                                  g.table[i].full_shape, g.params + g.table[i].offset), PT_OK);
    CHECK_ST(pt_st_writer_save(&w, path), PT_OK);
    pt_st_writer_free(&w);
    CHECK_ST(pt_gpt_load_weights(&h, path), PT_OK);
    logits_g = TALLOC(float, 6 * 13), logits_h = TALLOC(float, 6 * 13);
    CHECK_ST(pt_gpt_forward(&g, in, NULL, 1, 6), PT_OK);
    CHECK_ST(pt_gpt_gather_logits(&g, logits_g), PT_OK);
    CHECK_ST(pt_gpt_forward(&h, in, NULL, 1, 6), PT_OK);
    CHECK_ST(pt_gpt_gather_logits(&h, logits_h), PT_OK);
    CHECK(memcmp(logits_g, logits_h, sizeof(float) * 6 * 13) == 0);
    pt_gpt_free(&h);
    c.ffn_hidden = 32; /* a config whose hidden size does not match the tensors */
    CHECK_ST(gpt_new(&h, c, 1, 6, 0), PT_OK);
    CHECK_ERR(pt_gpt_load_weights(&h, path), PT_ERR_SHAPE, "model.layers.0.mlp.gate_proj.weight");
    pt_gpt_free(&h);
    pt_gpt_free(&g);
    remove(path);
    /* bad fields, each named with its value */
    {
        static const struct { const char *json, *want; pt_status st; } bad[] = {
            {"{\"hidden_size\": 16, \"num_attention_heads\": 4, \"num_hidden_layers\": 1, "
             "\"vocab_size\": 8, \"max_position_embeddings\": 8}", "intermediate_size is missing",
             PT_ERR_CONFIG},
            {"{\"hidden_size\": 16, \"intermediate_size\": 8, \"num_attention_heads\": 4, "
             "\"num_key_value_heads\": 3, \"num_hidden_layers\": 1, \"vocab_size\": 8, "
             "\"max_position_embeddings\": 8}", "num_key_value_heads=3 does not divide "
             "num_attention_heads=4", PT_ERR_CONFIG},
            {"{\"hidden_size\": 18, \"intermediate_size\": 8, \"num_attention_heads\": 4, "
             "\"num_hidden_layers\": 1, \"vocab_size\": 8, \"max_position_embeddings\": 8}",
             "hidden_size=18 is not divisible by num_attention_heads=4", PT_ERR_CONFIG},
            {"{\"model_type\": \"bert\", \"hidden_size\": 16}", "model_type='bert'", PT_ERR_CONFIG},
            {"{\"hidden_size\": 16, \"intermediate_size\": 8, \"num_attention_heads\": 4, "
             "\"num_hidden_layers\": 1, \"vocab_size\": 8, \"max_position_embeddings\": 8, "
             "\"head_dim\": 8}", "head_dim=8 is not hidden_size=16 / num_attention_heads=4",
             PT_ERR_CONFIG},
            {"{\"model_type\": \"gpt2\", \"n_embd\": 16, \"n_layer\": 1, \"vocab_size\": 8, "
             "\"n_positions\": 8}", "config.json: n_head is missing", PT_ERR_CONFIG},
            {"{\"model_type\": \"gpt2\", \"n_embd\": 16, \"n_head\": 4, \"n_layer\": 1, "
             "\"vocab_size\": 8, \"n_positions\": 8, \"activation_function\": \"relu\"}",
             "activation_function='relu' is not supported", PT_ERR_CONFIG},
            {"{\"hidden_size\": 16.5}", "hidden_size is not a non-negative integer", PT_ERR_CONFIG},
            {"{\"hidden_size\": 16, \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}}",
             "rope_type='yarn'", PT_ERR_CONFIG},
            {"{\"hidden_size\": 16, ", "config.json: malformed JSON", PT_ERR_FORMAT},
            {"[1, 2]", "not a JSON object", PT_ERR_FORMAT},
        };
        int k;
        for (k = 0; k < (int)(sizeof bad / sizeof bad[0]); k++) {
            CHECK_ERR(pt_gpt_config_from_hf_json(bad[k].json, strlen(bad[k].json), &c), bad[k].st,
                      bad[k].want);
        }
    }
}

/* pt_gpt_save_hf writes config.json and model.safetensors that read back to
   the same configuration and the same logits, as do the shards of a
   model.safetensors.index.json; GPT-2 blocks are refused. */
static void test_llama_save_hf(void) {
    pt_gpt_config c = cfg_llama(13, 8, 2, 4, 16, 2, 24), back;
    pt_gpt g, h;
    int *in = rand_ids(6, 13);
    float *lg = TALLOC(float, 6 * 13), *lh = TALLOC(float, 6 * 13);
    char dir[] = "/tmp/ptrain_llama_hf_XXXXXX", cfg_path[256], st_path[256];
    c.rope_scaling.factor = 4.0f, c.rope_scaling.low_freq_factor = 1.0f;
    c.rope_scaling.high_freq_factor = 2.0f, c.rope_scaling.original_max_pos = 6;
    CHECK(mkdtemp(dir) != NULL);
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    snprintf(st_path, sizeof st_path, "%s/model.safetensors", dir);
    CHECK_ST(gpt_new(&g, c, 1, 6, 0), PT_OK);
    if (!g.params) return;
    gpt_randomize(&g, 9, 0.2f);
    CHECK_ST(pt_gpt_save_hf(&g, dir), PT_OK);
    CHECK_ST(pt_gpt_config_from_hf_file(cfg_path, &back), PT_OK);
    CHECK(back.n_kv_head == 2 && back.ffn_hidden == 24 && back.untied_head && back.no_bias &&
          back.rope_theta == c.rope_theta && back.rope_scaling.factor == 4.0f &&
          back.rope_scaling.high_freq_factor == 2.0f && back.rope_scaling.original_max_pos == 6 &&
          back.block_size == 8 && back.ln_eps == 1e-5f);
    back.ln_eps = c.ln_eps; /* 0 (default) in c, written as 1e-5 */
    CHECK_ST(gpt_new(&h, back, 1, 6, 0), PT_OK);
    CHECK_ST(pt_gpt_load_weights(&h, st_path), PT_OK);
    { /* any model path: the file (config.json beside it) or the directory; alone, refused */
        char away[300];
        pt_gpt_config via_file, via_dir, want;
        snprintf(away, sizeof away, "%s.away", cfg_path);
        CHECK_ST(pt_gpt_config_from_hf_file(cfg_path, &want), PT_OK);
        CHECK_ST(pt_gpt_config_from_file(st_path, 0, &via_file), PT_OK);
        CHECK_ST(pt_gpt_config_from_file(dir, 0, &via_dir), PT_OK);
        CHECK(memcmp(&via_file, &want, sizeof want) == 0 && memcmp(&via_dir, &want, sizeof want) == 0);
        CHECK(rename(cfg_path, away) == 0);
        CHECK_ERR(pt_gpt_config_from_file(st_path, 0, &via_file), PT_ERR_MISSING, "config.json");
        CHECK(rename(away, cfg_path) == 0);
        pt_gpt_init_weights(&h, 2);
        CHECK_ST(pt_gpt_load_weights(&h, dir), PT_OK); /* a directory loads as one */
    }
    CHECK_ST(pt_gpt_forward(&g, in, NULL, 1, 6), PT_OK);
    CHECK_ST(pt_gpt_gather_logits(&g, lg), PT_OK);
    CHECK_ST(pt_gpt_forward(&h, in, NULL, 1, 6), PT_OK);
    CHECK_ST(pt_gpt_gather_logits(&h, lh), PT_OK);
    CHECK(memcmp(lg, lh, sizeof(float) * 6 * 13) == 0);
    { /* the sharded form: tensors alternately in two files, named by the index */
        char shard[2][256], index[256], *json = TALLOC(char, 8192);
        size_t len = (size_t)snprintf(json, 8192, "{\"metadata\": {\"total_size\": 1}, \"weight_map\": {");
        int i, k, drop;
        for (k = 0; k < 2; k++)
            snprintf(shard[k], sizeof shard[k], "%s/model-0000%d-of-00002.safetensors", dir, k + 1);
        snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
        for (drop = 0; drop < 3; drop++) { /* 0: whole; 1: one tensor in no shard; 2: in two */
            FILE *f;
            for (k = 0; k < 2; k++) {
                pt_st_writer w;
                ZERO(w);
                pt_st_writer_init(&w);
                for (i = 0; i < g.num_tensors; i++)
                    if ((i % 2 == k || (drop == 2 && i == 3)) && !(drop == 1 && i == 4))
                        CHECK_ST(pt_st_writer_add(&w, g.table[i].name, PT_F32, g.table[i].ndim,
                                                  g.table[i].full_shape, g.params + g.table[i].offset),
                                 PT_OK);
                CHECK_ST(pt_st_writer_save(&w, shard[k]), PT_OK);
                pt_st_writer_free(&w);
            }
            if (drop == 0) {
                for (i = 0; i < g.num_tensors; i++)
                    len += (size_t)snprintf(json + len, 8192 - len, "%s\"%s\": \"model-0000%d-of-00002.safetensors\"",
                                            i ? ", " : "", g.table[i].name, i % 2 + 1);
                len += (size_t)snprintf(json + len, 8192 - len, "}}");
                CHECK((f = fopen(index, "wb")) != NULL);
                if (f) fwrite(json, 1, len, f), fclose(f);
            }
            pt_gpt_init_weights(&h, 1);
            if (drop == 0) {
                CHECK_ST(pt_gpt_load_weights_hf(&h, dir), PT_OK);
                CHECK_ST(pt_gpt_forward(&h, in, NULL, 1, 6), PT_OK);
                CHECK_ST(pt_gpt_gather_logits(&h, lh), PT_OK);
                CHECK(memcmp(lg, lh, sizeof(float) * 6 * 13) == 0);
            } else {
                CHECK_ERR(pt_gpt_load_weights_hf(&h, dir), drop == 1 ? PT_ERR_MISSING : PT_ERR_FORMAT,
                          g.table[drop == 1 ? 4 : 3].name);
                CHECK_MSG(drop == 1 ? "is in no shard" : "is in two shards");
            }
        }
        remove(shard[0]), remove(shard[1]), remove(index);
    }
    pt_gpt_free(&h);
    pt_gpt_free(&g);
    CHECK_ST(gpt_new(&g, cfg_make(13, 8, 1, 2, 8), 1, 6, 0), PT_OK);
    CHECK_ERR(pt_gpt_save_hf(&g, dir), PT_ERR_UNSUPPORTED, "arch=llama");
    pt_gpt_free(&g);
    remove(cfg_path);
    remove(st_path);
    rmdir(dir);
}

/* pt_gpt_save_hf from a tp 2 x pp 2 layout (threads): the gathered weights
   equal the serial model's (every layout draws the serial init). */
typedef struct hf_job {
    pt_gpt_config c;
    const char *dir;
} hf_job;
static pt_status save_hf_rank(pt_comm *world, void *arg) {
    hf_job *j = (hf_job *)arg;
    pt_grid grid;
    pt_gpt g;
    pt_gpt_desc d;
    pt_status st;
    if ((st = pt_grid_init(&grid, world, 2, 1, 2)) != PT_OK) return st;
    ZERO(d);
    d.config = j->c, d.batch = 1, d.seq = 4, d.grid = &grid;
    if ((st = pt_gpt_init(&g, &d)) == PT_OK) {
        pt_gpt_init_weights(&g, 21);
        st = pt_gpt_save_hf(&g, j->dir);
        pt_gpt_free(&g);
    }
    pt_grid_free(&grid);
    return st == PT_OK ? st : pt_comm_fail(world, st);
}
static void test_llama_save_hf_parallel(void) {
    char dir[] = "/tmp/ptrain_llama_tp_XXXXXX", path[256];
    hf_job j;
    pt_gpt g;
    pt_safetensors st;
    int i;
    j.c = cfg_llama(13, 8, 2, 4, 16, 2, 24), j.dir = dir;
    CHECK(mkdtemp(dir) != NULL);
    CHECK_ST(pt_comm_threads_run(4, save_hf_rank, &j), PT_OK);
    CHECK_ST(gpt_new(&g, j.c, 1, 4, 0), PT_OK);
    if (!g.params) return;
    pt_gpt_init_weights(&g, 21);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ZERO(st);
    CHECK_ST(pt_st_load(&st, path), PT_OK);
    for (i = 0; i < g.num_tensors; i++) {
        const pt_param *p = &g.table[i];
        float *buf = TALLOC(float, p->numel);
        CHECK_ST(pt_st_read_f32(&st, p->name, buf, p->ndim, p->full_shape), PT_OK);
        if (memcmp(buf, g.params + p->offset, p->numel * sizeof(float)) != 0)
            FAIL("%s differs from the serial model's", p->name);
    }
    pt_st_free(&st);
    pt_gpt_free(&g);
    remove(path);
    snprintf(path, sizeof path, "%s/config.json", dir);
    remove(path);
    rmdir(dir);
}

/* A LLaMA checkpoint keeps its architecture: config_from_file gives it back,
   and a resumed model continues bit for bit (the one block, RoPE included). */
static void test_llama_checkpoint(void) {
    pt_gpt_config c = cfg_llama(13, 8, 2, 4, 16, 2, 24), back;
    pt_gpt g, h;
    pt_adamw_config opt = pt_adamw_default();
    int *in = rand_ids(2 * 6, 13), *tg = rand_ids(2 * 6, 13);
    const char *path = tmp_path("llama.ckpt");
    c.rope_scaling.factor = 4.0f, c.rope_scaling.low_freq_factor = 1.0f;
    c.rope_scaling.high_freq_factor = 2.0f, c.rope_scaling.original_max_pos = 6;
    CHECK_ST(gpt_new(&g, c, 2, 6, 0), PT_OK);
    CHECK_ST(gpt_new(&h, c, 2, 6, 0), PT_OK);
    if (!g.params || !h.params) return;
    pt_gpt_init_weights(&g, 3);
    CHECK_ST(pt_gpt_forward(&g, in, tg, 2, 6), PT_OK);
    CHECK_ST(pt_gpt_backward(&g), PT_OK);
    CHECK_ST(pt_gpt_adamw_step(&g, &opt, 1e-2f), PT_OK);
    CHECK_ST(pt_checkpoint_save(path, &g, NULL), PT_OK);
    CHECK_ST(pt_gpt_config_from_file(path, 0, &back), PT_OK);
    CHECK(back.arch == c.arch && back.norm == c.norm && back.pos == c.pos && back.mlp == c.mlp &&
          back.n_kv_head == c.n_kv_head && back.ffn_hidden == c.ffn_hidden &&
          back.no_bias == c.no_bias && back.untied_head == c.untied_head &&
          back.rope_theta == c.rope_theta && back.rope_scaling.factor == c.rope_scaling.factor &&
          back.rope_scaling.original_max_pos == c.rope_scaling.original_max_pos);
    CHECK_ST(pt_checkpoint_load(path, &h, NULL), PT_OK);
    CHECK_ST(pt_gpt_forward(&g, in, tg, 2, 6), PT_OK);
    CHECK_ST(pt_gpt_forward(&h, in, tg, 2, 6), PT_OK);
    CHECK(g.loss == h.loss);
    pt_gpt_free(&g);
    pt_gpt_free(&h);
    remove(path);
}

/* ---- text: byte-level BPE tokenizers (>>text) ------------------------------ */

/* Appends byte b as its byte-level character (GPT-2's bytes_to_unicode),
   JSON-escaped. */
static size_t tk_put_byte(char *o, int b) {
    int keep = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    int k = 0, x, cp;
    for (x = 0; x < b; x++)
        k += !((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF));
    cp = keep ? b : 256 + k;
    if (cp == '"' || cp == '\\') return (size_t)sprintf(o, "\\%c", cp);
    if (cp < 0x80) return (size_t)sprintf(o, "%c", cp);
    o[0] = (char)(0xC0 | (cp >> 6));
    o[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* A tokenizer.json: the 256 bytes (id = byte), then merges of the ASCII
   strings in merges[] ("a|b" each; the merged token gets the next id),
   special "<|endoftext|>" last; pattern 0 GPT-2 (ByteLevel), 1 cl100k (Split). */
static char *tk_json(const char *const *merges, int n_merges, int pattern, int array_merges) {
    char *j = TALLOC(char, 65536), *o = j;
    int b, i, id = 256;
    o += sprintf(o, "{\"version\":\"1.0\",\"added_tokens\":[{\"id\":%d,\"content\":\"<|endoftext|>\","
                 "\"special\":true}],\"normalizer\":null,", 256 + n_merges);
    if (pattern == 0)
        o += sprintf(o, "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
                     "\"use_regex\":true},");
    else
        o += sprintf(o, "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\","
                     "\"pattern\":{\"Regex\":\"%s\"},\"behavior\":\"Isolated\",\"invert\":false},"
                     "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]},",
                     "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| "
                     "?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+");
    o += sprintf(o, "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"vocab\":{");
    for (b = 0; b < 256; b++) {
        *o++ = '"';
        o += tk_put_byte(o, b);
        o += sprintf(o, "\":%d,", b);
    }
    for (i = 0; i < n_merges; i++) {
        const char *m = merges[i];
        *o++ = '"';
        for (; *m; m++)
            if (*m != '|') o += tk_put_byte(o, (unsigned char)*m);
        o += sprintf(o, "\":%d,", id++);
    }
    o[-1] = '}';
    o += sprintf(o, ",\"merges\":[");
    for (i = 0; i < n_merges; i++) {
        const char *m = merges[i];
        o += sprintf(o, i ? "," : "");
        *o++ = array_merges ? '[' : '"';
        *o++ = array_merges ? '"' : 0;
        if (!array_merges) o--;
        for (; *m; m++) {
            if (*m == '|') o += sprintf(o, array_merges ? "\",\"" : " ");
            else o += tk_put_byte(o, (unsigned char)*m);
        }
        o += sprintf(o, array_merges ? "\"]" : "\"");
    }
    sprintf(o, "]}}");
    return j;
}

static const char *const tk_merges[] = {"t|h", "th|e", "i|n", "e|r", "a|n", "in|g", " |t", " t|h",
                                        " th|e", "o|n", "r|e", "a|a", "aa|aa", "\xc3|\xa9"};
#define TK_NM ((int)(sizeof tk_merges / sizeof tk_merges[0]))

static int tk_load(pt_tokenizer *tk, int pattern, int array_merges) {
    const char *j = tk_json(tk_merges, TK_NM, pattern, array_merges);
    ZERO(*tk);
    return pt_tokenizer_parse_hf(tk, j, strlen(j)) == PT_OK;
}

/* pieces of s under pattern pat, joined by '|' */
static void tk_pieces(pt_pretok pat, const char *s, char *out) {
    size_t n = strlen(s), i = 0, k;
    while (i < n) {
        k = pt_pretok_piece_end(pat, s, n, i);
        if (i) *out++ = '|';
        memcpy(out, s + i, k - i);
        out += k - i;
        i = k;
    }
    *out = 0;
}

static void test_text_pieces(void) {
    char out[256];
    static const struct { pt_pretok pat; const char *in, *want; } cases[] = {
        {PT_PRETOK_GPT2, "Hello world's  end\n", "Hello| world|'s| | end|\n"},
        {PT_PRETOK_GPT2, "a  b\n\nc", "a| | b|\n|\n|c"},
        {PT_PRETOK_GPT2, "x   ", "x|   "},
        {PT_PRETOK_GPT2, "12345 ab12 ?!x 'S", "12345| ab|12| ?!|x| '|S"},
        {PT_PRETOK_GPT2, "caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87", "caf\xc3\xa9| \xe4\xb8\xad\xe6\x96\x87"},
        {PT_PRETOK_CL100K, "Hello world'S  end\n", "Hello| world|'S| | end|\n"},
        {PT_PRETOK_CL100K, "12345 (foo);\n\n  bar", "123|45| (|foo|);\n\n| | bar"},
        {PT_PRETOK_CL100K, "a \n\n  b", "a| \n\n| | b"},
        {PT_PRETOK_CL100K, "x\t\ty", "x|\t|\ty"},
        {PT_PRETOK_CL100K, " \xe2\x82\xac" "5", " \xe2\x82\xac|5"},
        {PT_PRETOK_GPT2, "a\xff\xfe b", "a|\xff\xfe| b"}, /* invalid bytes: "other" */
        {PT_PRETOK_GPT2, "\xe3\x80\x80x", "\xe3\x80\x80|x"},   /* U+3000 is whitespace */
        {PT_PRETOK_CL100K, "WE'LLx it'REally", "WE|'LL|x| it|'RE|ally"}, /* (?i:...) */
        {PT_PRETOK_GPT2, "WE'LLx it'REally", "WE|'|LLx| it|'|REally"},
    };
    size_t i;
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tk_pieces(cases[i].pat, cases[i].in, out);
        if (strcmp(out, cases[i].want) != 0)
            FAIL("case %zu: pieces \"%s\", expected \"%s\"", i, out, cases[i].want);
    }
}

/* A character's class as GPT-2's pieces show it: "a" then a letter is one
   piece, "1" then a number, "!" then an "other" character, and no other
   class joins them; " " then whitespace is one piece (as " " then any
   character but whitespace is). 'L', 'N', 'O', 'S', or '?' when the pieces
   fit none or several. */
static int piece_class(const char *c, size_t len) {
    static const char lead[3] = {'a', '1', '!'}, cls[3] = {'L', 'N', 'O'};
    char t[8];
    int k, got = '?', hits = 0;
    for (k = 0; k < 3; k++) {
        t[0] = lead[k];
        memcpy(t + 1, c, len);
        if (pt_pretok_piece_end(PT_PRETOK_GPT2, t, len + 1, 0) == len + 1) got = cls[k], hits++;
    }
    t[0] = ' ';
    if (!hits && pt_pretok_piece_end(PT_PRETOK_GPT2, t, len + 1, 0) == len + 1) got = 'S', hits++;
    return hits == 1 ? got : '?';
}

/* The pre-tokenizer's Unicode classes (\p{L}, \p{N}, White_Space, the rest):
   ASCII (its fast path) and other planes (the generated table), read from
   the pieces; strict UTF-8: a sequence that is not a character (overlong,
   a surrogate, above U+10FFFF) is bytes of class other, one character
   each, which CL100K's [^\r\n\p{L}\p{N}]?\p{L}+ tells apart from one
   character: one piece with the letters after it, or two. */
static void test_text_unicode_classes(void) {
    static const struct { const char *utf8; int cls; } cps[] = {
        {"\xc3\xa9", 'L'},             /* é U+00E9 */
        {"\xe4\xb8\xad", 'L'},         /* 中 U+4E2D */
        {"\xf0\xa0\x80\x80", 'L'},     /* U+20000, CJK extension B */
        {"\xd9\xa3", 'N'},             /* Arabic-Indic three U+0663 */
        {"\xc2\xbd", 'N'},             /* ½ U+00BD */
        {"\xf0\x9d\x9f\x8e", 'N'},     /* mathematical bold zero U+1D7CE */
        {"\xe3\x80\x80", 'S'},         /* U+3000 */
        {"\xc2\x85", 'S'},             /* U+0085 */
        {"\xcc\x81", 'O'},             /* U+0301: a combining mark is not a letter */
        {"\xf0\x9f\x98\x80", 'O'},     /* emoji U+1F600 */
        {"\xf4\x8f\xbf\xbf", 'O'},     /* U+10FFFF */
    };
    static const struct { const char *bytes; int one; } seqs[] = {
        {"\xc1\xa1", 0},             /* overlong 'a' */
        {"\xc0\xaf", 0},             /* overlong '/' */
        {"\xed\xa0\x80", 0},         /* surrogate U+D800 */
        {"\xf4\x90\x80\x80", 0},     /* above U+10FFFF */
        {"\xf0\x9f\x98\x80", 1},     /* U+1F600 */
        {"\xef\xbf\xbd", 1},         /* U+FFFD */
    };
    char t[16];
    size_t i;
    unsigned c;
    for (c = 0; c < 128; c++) { /* the ASCII fast path against the classes */
        char ch = (char)c;
        int want = ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') ? 'L' : (c >= '0' && c <= '9') ? 'N'
                   : (c == ' ' || (c >= 9 && c <= 13)) ? 'S' : 'O';
        if (piece_class(&ch, 1) != want)
            FAIL("ASCII %u: class %c, expected %c", c, piece_class(&ch, 1), want);
    }
    for (i = 0; i < sizeof cps / sizeof cps[0]; i++)
        if (piece_class(cps[i].utf8, strlen(cps[i].utf8)) != cps[i].cls)
            FAIL("character %zu: class %c, expected %c", i,
                 piece_class(cps[i].utf8, strlen(cps[i].utf8)), cps[i].cls);
    for (i = 0; i < sizeof seqs / sizeof seqs[0]; i++) {
        size_t len = strlen(seqs[i].bytes), end;
        memcpy(t, seqs[i].bytes, len);
        memcpy(t + len, "ab", 2);
        end = pt_pretok_piece_end(PT_PRETOK_CL100K, t, len + 2, 0);
        if ((end == len + 2) != seqs[i].one)
            FAIL("sequence %zu: its first piece ends at %zu of %zu: %s", i, end, len + 2,
                 seqs[i].one ? "not one character" : "taken as one character");
    }
}

static void test_text_encode(void) {
    pt_tokenizer tk;
    int ids[64], k;
    size_t n;
    const int th = 256, the_ = 256 + 1, ing = 256 + 5;
    for (k = 0; k < 2; k++) {
        if (!tk_load(&tk, k, k)) {
            FAIL("loading the test tokenizer (pattern %d): %s", k, pt_last_error());
            continue;
        }
        CHECK_EQ(tk.n_vocab, 256 + TK_NM + 1);
        CHECK_EQ(tk.eot, 256 + TK_NM);
        CHECK_ST(pt_tokenizer_encode(&tk, "the thing", 9, 0, ids, &n), PT_OK);
        /* "the" -> th, the; " thing": (t h) first takes the t from " t", then in, ing */
        CHECK_EQ(n, 4);
        CHECK_EQ(ids[0], the_);
        CHECK_EQ(ids[1], ' ');
        CHECK_EQ(ids[2], th);
        CHECK_EQ(ids[3], ing);
        CHECK_ST(pt_tokenizer_encode(&tk, " then", 5, 0, ids, &n), PT_OK);
        CHECK_EQ(n, 3); /* " th" never forms: th takes the t first */
        /* "aaaaa": (a a) leftmost first, then (aa aa): aaaa + a */
        CHECK_ST(pt_tokenizer_encode(&tk, "aaaaa", 5, 0, ids, &n), PT_OK);
        CHECK_EQ(n, 2);
        CHECK_EQ(ids[0], 256 + 12);
        CHECK_EQ(ids[1], 'a');
        /* special tokens only when allowed */
        CHECK_ST(pt_tokenizer_encode(&tk, "a<|endoftext|>b", 15, 1, ids, &n), PT_OK);
        CHECK_EQ(n, 3);
        CHECK_EQ(ids[1], tk.eot);
        CHECK_ST(pt_tokenizer_encode(&tk, "a<|endoftext|>b", 15, 0, ids, &n), PT_OK);
        CHECK(n > 3);
        for (size_t i = 0; i < n; i++) CHECK(ids[i] != tk.eot);
        CHECK(pt_tokenizer_memory(&tk) > 0);
        pt_tokenizer_free(&tk);
    }
}

/* BPE on ids[0..n) (one piece's bytes) as the definition says, merge by
   merge: the lowest rank, the leftmost on a tie; returns the new count. */
static size_t naive_bpe(const pt_tokenizer *tk, int *ids, size_t n) {
    for (;;) {
        size_t best = 0, k;
        int bm = -1, bz = 0, z, rank;
        for (k = 0; k + 1 < n; k++)
            if ((rank = pt_tokenizer_merge(tk, ids[k], ids[k + 1], &z)) >= 0 && (bm < 0 || rank < bm))
                bm = rank, bz = z, best = k;
        if (bm < 0) return n;
        ids[best] = bz;
        memmove(ids + best + 1, ids + best + 2, (n - best - 2) * sizeof(int));
        n--;
    }
}

/* decode(encode(x)) == x for random bytes, ASCII-heavy text and long runs;
   one piece of letters encodes as the naive BPE does, through the scan (up
   to 64 bytes) and through the heap (longer: its work space is the
   encoder's, allocated exactly, so ASan sees any overrun) */
static void test_text_roundtrip(void) {
    pt_tokenizer tk;
    size_t cap = 20000, n, m, i, len;
    unsigned char *x = TALLOC(unsigned char, cap), *y = TALLOC(unsigned char, cap);
    int *ids = TALLOC(int, cap), *r = TALLOC(int, 512), *e = TALLOC(int, 512);
    int k, trial;
    static const char alpha[] = "aaaathe ing\n\n  \t'sre\xc3\xa9\xe4\xb8\xad" "0123";
    for (k = 0; k < 2; k++) {
        if (!tk_load(&tk, k, 0)) {
            FAIL("loading: %s", pt_last_error());
            continue;
        }
        for (trial = 0; trial < 200; trial++) {
            len = (size_t)irand(trial < 190 ? 300 : (int)cap);
            for (i = 0; i < len; i++)
                x[i] = trial % 3 == 0 ? (unsigned char)irand(256)
                       : trial % 3 == 1 ? (unsigned char)alpha[irand((int)sizeof alpha - 1)]
                                        : (unsigned char)"a "[irand(8) == 0];
            CHECK_ST(pt_tokenizer_encode(&tk, x, len, trial & 1, ids, &n), PT_OK);
            CHECK_ST(pt_tokenizer_decode(&tk, ids, n, y, cap, &m), PT_OK);
            if (m != len || memcmp(x, y, len) != 0) FAIL("trial %d: decode(encode(x)) != x (%zu bytes)", trial, len);
        }
        /* a long piece (one run of letters) goes through the heap */
        memset(x, 'a', 5000);
        CHECK_ST(pt_tokenizer_encode(&tk, x, 5000, 0, ids, &n), PT_OK);
        CHECK_EQ(n, 1250);
        for (trial = 0; trial < 340; trial++) { /* 300 scanned, 40 on the heap */
            size_t L = trial < 300 ? 2 + (size_t)irand(63) : 65 + (size_t)irand(400), q, nr, ne;
            const char *abc = trial < 300 ? "aathe" : "aaaathe";
            int id;
            for (q = 0; q < L; q++) {
                x[q] = (unsigned char)abc[irand((int)strlen(abc))];
                r[q] = pt_tokenizer_find(&tk, x + q, 1);
            }
            nr = naive_bpe(&tk, r, L);
            if (tk.ignore_merges && (id = pt_tokenizer_find(&tk, x, L)) >= 0) r[0] = id, nr = 1;
            CHECK_ST(pt_tokenizer_encode(&tk, x, L, 0, e, &ne), PT_OK);
            if (ne != nr || memcmp(e, r, nr * sizeof(int)) != 0)
                FAIL("trial %d: BPE of a piece of %zu bytes != the naive BPE", trial, L);
        }
        pt_tokenizer_free(&tk);
    }
}

/* Where pt_pretok_safe_cut allows a cut, the pieces of the two parts are
   the whole text's; and the parallel encoder equals the serial one. */
static void test_text_parallel(void) {
    pt_tokenizer tk;
    size_t n = 3u << 20, i, n1, n2, k, m;
    char *x = TALLOC(char, n);
    int *a = TALLOC(int, n), *b = TALLOC(int, n);
    unsigned char *bound = TALLOC(unsigned char, 4096);
    static const char *const words[] = {"the", "Thing", " ", "\n", "aaaa", "in", "12", ";", "  ", "\xc3\xa9",
                                        "'s", "\r\n", "x", "\t", "'LL", "(", "\xe3\x80\x80", "7"};
    const int nw = (int)(sizeof words / sizeof words[0]);
    int pat, trial, cuts = 0;
    for (pat = PT_PRETOK_GPT2; pat <= PT_PRETOK_CL100K; pat++)
        for (trial = 0; trial < 20; trial++) {
            const unsigned char *u = (const unsigned char *)x;
            for (i = 0, m = 0; m < 200; m++) { /* ~200 words */
                const char *w = words[irand(nw)];
                memcpy(x + i, w, strlen(w));
                i += strlen(w);
            }
            n1 = i;
            memset(bound, 0, n1 + 1);
            for (i = 0; i < n1; i = k) bound[i] = 1, k = pt_pretok_piece_end((pt_pretok)pat, u, n1, i);
            for (i = 1; i < n1; i++) {
                if (!pt_pretok_safe_cut(u, n1, i)) continue;
                cuts++;
                if (!bound[i]) FAIL("pattern %d: a cut at %zu is inside a piece", pat, i);
                for (k = 0; k < i; k = m) { /* the prefix alone: the same pieces */
                    m = pt_pretok_piece_end((pt_pretok)pat, u, i, k);
                    if (!bound[k] || (m < i && !bound[m])) {
                        FAIL("pattern %d: the text cut at %zu has another piece at %zu", pat, i, k);
                        break;
                    }
                }
            }
        }
    CHECK(cuts > 100);
    /* "x \nA": alone, " \n" would be one piece; in the whole text " " and "\n" */
    CHECK(!pt_pretok_safe_cut("x \nAb", 5, 3));
    CHECK(pt_pretok_safe_cut("x;\nAb", 5, 3));
    if (!tk_load(&tk, 1, 0)) {
        FAIL("loading: %s", pt_last_error());
        return;
    }
    for (i = 0; i < n;) {
        const char *w = words[irand(nw)];
        size_t l = strlen(w);
        if (i + l > n) break;
        memcpy(x + i, w, l);
        i += l;
    }
    n = i;
    CHECK_ST(pt_tokenizer_encode(&tk, x, n, 0, a, &n1), PT_OK);
    CHECK_ST(pt_tokenizer_encode_parallel(&tk, x, n, 0, 2, b, &n2, NULL, NULL), PT_OK);
    CHECK_EQ(n1, n2);
    if (n1 == n2 && memcmp(a, b, n1 * sizeof(int)) != 0) FAIL("parallel encoding differs from serial");
    pt_tokenizer_free(&tk);
}

static void test_text_utf8_stream(void) {
    pt_utf8_stream s;
    char out[16];
    size_t k;
    ZERO(s);
    k = pt_utf8_stream_put(&s, "a\xf0\x9f", 3, out); /* half an emoji */
    CHECK_EQ(k, 1);
    k = pt_utf8_stream_put(&s, "\x98", 1, out);
    CHECK_EQ(k, 0);
    k = pt_utf8_stream_put(&s, "\x80!", 2, out);
    CHECK_EQ(k, 5);
    CHECK(memcmp(out, "\xf0\x9f\x98\x80!", 5) == 0);
    k = pt_utf8_stream_put(&s, "\xff\xc3", 2, out); /* 0xff never completes; 0xc3 may */
    CHECK_EQ(k, 1);
    CHECK_EQ(pt_utf8_stream_flush(&s, out), 1);
    k = pt_utf8_stream_put(&s, "\xe0\x80", 2, out); /* E0 80 is overlong: pass it on */
    CHECK_EQ(k, 2);
}

/* The small public helpers beside the tokenizers: GPT-2's byte-level
   spelling (against the one tk_json writes), a merge's rank and token, the
   pre-tokenizer's edges and default pattern, a whole file read, the cores. */
static void test_text_helpers(void) {
    static const unsigned char data[5] = {'a', 0, '\n', 0xff, ' '};
    char got[8], want[8];
    pt_tokenizer tk;
    unsigned char *buf;
    size_t n;
    int b, z = -1, threads;
    FILE *f;
    for (b = 0; b < 256; b++) { /* one byte: tk_put_byte's character, unescaped */
        unsigned char c = (unsigned char)b;
        size_t lw = tk_put_byte(want, b), lg = pt_bytelevel_encode(&c, 1, got);
        if (lw == 2 && want[0] == '\\') want[0] = want[1], lw = 1;
        if (lg != lw || memcmp(got, want, lw) != 0) FAIL("byte 0x%02x: spelled differently", b);
    }
    CHECK_EQ(pt_bytelevel_encode("a b\n", 4, got), 6);
    CHECK(memcmp(got, "a\xc4\xa0" "b\xc4\x8a", 6) == 0); /* space U+0120, newline U+010A */
    CHECK(tk_load(&tk, 0, 0));
    CHECK_EQ(pt_tokenizer_merge(&tk, 't', 'h', &z), 0);
    CHECK_EQ(z, 256);
    CHECK_EQ(pt_tokenizer_merge(&tk, 256, 'e', NULL), 1);
    CHECK_EQ(pt_tokenizer_merge(&tk, 'h', 't', &z), -1);
    pt_tokenizer_free(&tk);
    CHECK_EQ(pt_tokenizer_merge(&tk, 't', 'h', &z), -1);
    CHECK_EQ(pt_pretok_piece_end(PT_PRETOK_GPT2, "ab", 2, 2), 2);
    CHECK_EQ(pt_pretok_piece_end(PT_PRETOK_GPT2, "ab", 2, 7), 2);
    CHECK_EQ(pt_pretok_piece_end(PT_PRETOK_DEFAULT, "WE'LLx", 6, 2), 3); /* GPT-2's "'" */
    CHECK_EQ(pt_pretok_piece_end(PT_PRETOK_CL100K, "WE'LLx", 6, 2), 5);  /* cl100k's "'LL" */
    CHECK(!pt_pretok_safe_cut("a b", 3, 0) && !pt_pretok_safe_cut("ab cd", 5, 5));
    /* a file read whole (a NUL inside), an empty one, a missing one, a directory */
    if ((f = fopen(tmp_path("read.bin"), "wb"))) fwrite(data, 1, 5, f), fclose(f);
    CHECK_ST(pt_file_read(tmp_path("read.bin"), &buf, &n, NULL), PT_OK);
    CHECK(n == 5 && buf && memcmp(buf, data, 5) == 0);
    free(buf);
    if ((f = fopen(tmp_path("empty.bin"), "wb"))) fclose(f);
    CHECK_ST(pt_file_read(tmp_path("empty.bin"), &buf, &n, NULL), PT_OK);
    CHECK(n == 0 && buf);
    free(buf);
    CHECK_ERR(pt_file_read(tmp_path("missing.bin"), &buf, &n, NULL), PT_ERR_IO, "missing.bin");
    CHECK(!buf && n == 0);
    CHECK_ERR(pt_file_read("/tmp", &buf, &n, NULL), PT_ERR_IO, "cannot read '/tmp'");
    CHECK(!buf && n == 0);
    /* the cores: what pt_set_threads(0) sets */
    CHECK(pt_num_cores() >= 1);
    threads = pt_get_threads();
    pt_set_threads(0);
#ifdef _OPENMP
    CHECK_EQ(pt_get_threads(), pt_num_cores());
#endif
    pt_set_threads(threads);
}

static void test_text_errors(void) {
    pt_tokenizer tk;
    const char *j = tk_json(tk_merges, TK_NM, 0, 0);
    char *bad = TALLOC(char, 70000);
    size_t n = strlen(j);
    int ids[4] = {0, 1, 999999, 2};
    size_t m;
    ZERO(tk);
    /* truncated */
    CHECK_ST(pt_tokenizer_parse_hf(&tk, j, n / 2), PT_ERR_FORMAT);
    CHECK_ERR(pt_tokenizer_parse_hf(&tk, j, n - 2), PT_ERR_FORMAT, "at byte");
    /* a merge whose token is missing */
    {
        static const char *const mm[] = {"t|h", "x|yz"};
        const char *b2 = tk_json(mm, 1, 0, 0);
        strcpy(bad, b2);
        char *p = strstr(bad, "\"merges\":[");
        sprintf(p, "\"merges\":[\"t h\",\"q z\"]}}");
        CHECK_ERR(pt_tokenizer_parse_hf(&tk, bad, strlen(bad)), PT_ERR_FORMAT, "merges[1] \"q z\"");
        /* duplicated */
        sprintf(p, "\"merges\":[\"t h\",\"t h\"]}}");
        CHECK_ERR(pt_tokenizer_parse_hf(&tk, bad, strlen(bad)), PT_ERR_FORMAT, "repeats merges[0]");
        /* one string with no space */
        sprintf(p, "\"merges\":[\"th\"]}}");
        CHECK_ERR(pt_tokenizer_parse_hf(&tk, bad, strlen(bad)), PT_ERR_FORMAT, "one space");
        /* wrong type */
        sprintf(p, "\"merges\":[7]}}");
        CHECK_ERR(pt_tokenizer_parse_hf(&tk, bad, strlen(bad)), PT_ERR_FORMAT, "merges[0]");
    }
    /* a vocabulary string that is not byte-level (U+4E2D stands for no byte) */
    {
        const char *p = strstr(j, "\"vocab\":{") + 9;
        snprintf(bad, 70000, "%.*s\"\\u4e2d\":300,%s", (int)(p - j), j, p);
        CHECK_ERR(pt_tokenizer_parse_hf(&tk, bad, strlen(bad)), PT_ERR_FORMAT, "not a byte-level string");
    }
    /* an id that is not an integer */
    {
        const char *p = strstr(j, "\":0,") + 2;
        snprintf(bad, 70000, "%.*s\"0\"%s", (int)(p - j), j, p + 1);
        CHECK_ERR(pt_tokenizer_parse_hf(&tk, bad, strlen(bad)), PT_ERR_FORMAT, "is not an integer");
    }
    /* unsupported pre-tokenizer and normalizer */
    strcpy(bad, j);
    memcpy(strstr(bad, "\"add_prefix_space\":false"), "\"add_prefix_space\":true ", 24);
    CHECK_ERR(pt_tokenizer_parse_hf(&tk, bad, strlen(bad)), PT_ERR_UNSUPPORTED, "add_prefix_space");
    strcpy(bad, j);
    memcpy(strstr(bad, "\"normalizer\":null"), "\"normalizer\":{ }", 16);
    CHECK_ERR(pt_tokenizer_parse_hf(&tk, bad, strlen(bad)), PT_ERR_UNSUPPORTED, "normalizer");
    /* GPT-2 two-file format: a bad vocab.bpe line */
    {
        const char *enc = "{\"a\": 0, \"b\": 1}";
        CHECK_ERR(pt_tokenizer_parse_gpt2(&tk, enc, strlen(enc), "#version: 0.2\na b c\n", 20),
                  PT_ERR_FORMAT, "vocab.bpe line 2");
        CHECK_ERR(pt_tokenizer_parse_gpt2(&tk, enc, strlen(enc), "a b\n", 4), PT_ERR_FORMAT,
                  "no token for byte 0x00");
        CHECK_ERR(pt_tokenizer_parse_gpt2(&tk, "[1]", 3, "", 0), PT_ERR_FORMAT, "encoder.json");
    }
    /* decode: an id out of range */
    CHECK(tk_load(&tk, 0, 0));
    CHECK_ERR(pt_tokenizer_decode(&tk, ids, 4, NULL, 0, &m), PT_ERR_RANGE, "ids[2] = 999999");
    pt_tokenizer_free(&tk);
    /* a file that does not exist names its path */
    CHECK_ERR(pt_tokenizer_load(&tk, "/nonexistent/tokenizer.json"), PT_ERR_IO, "/nonexistent/tokenizer.json");
    CHECK_ERR(pt_tokenizer_load(&tk, "/nonexistent-dir"), PT_ERR_IO, "encoder.json");
}

/* BPE training against a naive trainer written here (words of letters with
   single spaces, so GPT-2's pieces are " word"); the same tokenizer on 1 and
   2 threads; saved, loaded back, the same; decode(encode(x)) == x. */
static void test_text_bpe_train(void) {
    enum { NW = 120, NM = 100, MAXL = 24 };
    static const char *const syl[] = {"th", "e", "an", "in", "er", "re", "on", "st", "a", "qu", "x", "ing"};
    char words[NW][MAXL], path[64];
    int *wsym = TALLOC(int, NW * 2 * MAXL), wl[2 * NW], wc[2 * NW], nwords = 0;
    size_t cap = 400000, n = 0, i, m, k;
    char *text = TALLOC(char, cap + MAXL);
    pt_tokenizer a, b, c;
    pt_bpe_train_desc d;
    int w, r, j, x;
    for (w = 0; w < NW; w++) {
        words[w][0] = 0;
        for (j = 1 + irand(3); j > 0; j--) strcat(words[w], syl[irand(12)]);
    }
    while (n < cap) {
        const char *s = words[irand(NW)];
        if (n) text[n++] = ' ';
        memcpy(text + n, s, strlen(s));
        n += strlen(s);
    }
    /* the naive trainer: distinct pieces, then NM times the most frequent pair
       (ties: the smaller ids) merged everywhere */
    memset(wc, 0, sizeof wc);
    for (i = 0; i < n; i = k) {
        char piece[MAXL + 2];
        for (k = i + 1; k < n && text[k] != ' '; k++) continue;
        memcpy(piece, text + i, k - i);
        piece[k - i] = 0;
        for (x = 0; x < nwords; x++) {
            int q = 0;
            if (wl[x] != (int)(k - i)) continue;
            while (q < wl[x] && wsym[x * 2 * MAXL + q] == (unsigned char)piece[q]) q++;
            if (q == wl[x]) break;
        }
        if (x == nwords) {
            int q;
            for (q = 0; q < (int)(k - i); q++) wsym[x * 2 * MAXL + q] = (unsigned char)piece[q];
            wl[x] = (int)(k - i);
            nwords++;
        }
        wc[x]++;
    }
    ZERO(d);
    d.vocab_size = 256 + NM + 1;
    d.threads = 1;
    ZERO(a);
    ZERO(b);
    ZERO(c);
    CHECK_ST(pt_bpe_train(&a, text, n, &d), PT_OK);
    d.threads = 2;
    CHECK_ST(pt_bpe_train(&b, text, n, &d), PT_OK);
    if (!a.tok_off || !b.tok_off) return;
    CHECK_EQ(a.n_merges, NM);
    CHECK(a.fingerprint == b.fingerprint);
    for (r = 0; r < NM; r++) {
        int64_t best = 0;
        int ba = -1, bb = -1;
        for (x = 0; x < nwords; x++) /* pair counts, naively */
            for (j = 0; j + 1 < wl[x]; j++) {
                int p = wsym[x * 2 * MAXL + j], q = wsym[x * 2 * MAXL + j + 1], y, z;
                int64_t cnt = 0;
                for (y = 0; y < nwords; y++)
                    for (z = 0; z + 1 < wl[y]; z++)
                        if (wsym[y * 2 * MAXL + z] == p && wsym[y * 2 * MAXL + z + 1] == q) cnt += wc[y];
                if (cnt > best || (cnt == best && (p < ba || (p == ba && q < bb)))) best = cnt, ba = p, bb = q;
            }
        if (best < 2) break;
        if (pt_tokenizer_merge(&a, ba, bb, &j) != r || j != 256 + r) {
            FAIL("merge %d: the naive trainer merges (%d, %d) (count %lld) into %d, pt_bpe_train "
                 "ranks it %d", r, ba, bb, (long long)best, 256 + r, pt_tokenizer_merge(&a, ba, bb, NULL));
            break;
        }
        for (x = 0; x < nwords; x++) { /* apply it */
            int *s = wsym + x * 2 * MAXL, y = 0;
            for (j = 0; j < wl[x];) {
                if (j + 1 < wl[x] && s[j] == ba && s[j + 1] == bb) s[y++] = 256 + r, j += 2;
                else s[y++] = s[j++];
            }
            wl[x] = y;
        }
    }
    /* saved and loaded back: the same tokenizer */
    snprintf(path, sizeof path, "/tmp/ptrain_bpe_%ld.json", (long)getpid());
    CHECK_ST(pt_tokenizer_save(&a, path), PT_OK);
    CHECK_ST(pt_tokenizer_load(&c, path), PT_OK);
    CHECK(c.fingerprint == a.fingerprint);
    remove(path);
    {
        unsigned char *y = TALLOC(unsigned char, 5000), *z = TALLOC(unsigned char, 5000);
        int *ids = TALLOC(int, 5000);
        for (i = 0; i < 5000; i++) y[i] = (unsigned char)(i % 3 ? text[i] : irand(256));
        CHECK_ST(pt_tokenizer_encode(&c, y, 5000, 0, ids, &k), PT_OK);
        CHECK_ST(pt_tokenizer_decode(&c, ids, k, z, 5000, &m), PT_OK);
        CHECK(m == 5000 && memcmp(y, z, 5000) == 0);
        CHECK(k < 5000);
    }
    pt_tokenizer_free(&a);
    pt_tokenizer_free(&b);
    pt_tokenizer_free(&c);
}

static void count_progress(size_t done, size_t total, void *ctx) {
    if (done <= total) ++*(int *)ctx;
}

/* a text file as pt_tokens through the cache: written, read back, and
   refused (rewritten) when the text changes; a read-only cache is read when
   it matches and left alone when not; progress is reported while encoding */
static void test_text_tokens_cache(void) {
    pt_tokenizer tk;
    pt_tokens t;
    pt_text_desc d, ro;
    char txt[64], bin[64];
    int ids[64], calls = 0;
    size_t n, i;
    FILE *f;
    const char *a = "the thing in the ring", *b = "another thing";
    if (!tk_load(&tk, 0, 0)) {
        FAIL("loading: %s", pt_last_error());
        return;
    }
    snprintf(txt, sizeof txt, "/tmp/ptrain_txt_%ld.txt", (long)getpid());
    snprintf(bin, sizeof bin, "/tmp/ptrain_txt_%ld.bin", (long)getpid());
    remove(bin);
    ZERO(d);
    d.cache_path = bin, d.threads = 1, d.progress = count_progress, d.progress_ctx = &calls;
    ro = d;
    ro.cache_read_only = 1;
    if ((f = fopen(txt, "wb"))) { /* read-only and no cache: tokenized, nothing written */
        fputs(a, f);
        fclose(f);
    }
    ZERO(t);
    CHECK_ST(pt_tokens_from_text(&t, &tk, txt, &ro), PT_OK);
    CHECK_EQ((int)t.cache, PT_CACHE_NONE);
    f = fopen(bin, "rb");
    CHECK(t.n > 0 && f == NULL);
    if (f) fclose(f);
    CHECK(calls > 0); /* the progress of the encoding */
    pt_tokens_free(&t);
    for (i = 0; i < 3; i++) {
        const char *s = i == 0 ? a : b; /* fresh, stale (another text), cached */
        ZERO(t);
        if ((f = fopen(txt, "wb"))) {
            fputs(s, f);
            fclose(f);
        }
        CHECK_ST(pt_tokens_from_text(&t, &tk, txt, &d), PT_OK);
        CHECK_EQ((int)t.cache, i == 0 ? PT_CACHE_MADE : i == 1 ? PT_CACHE_REMADE : PT_CACHE_READ);
        CHECK_ST(pt_tokenizer_encode(&tk, s, strlen(s), 0, ids, &n), PT_OK);
        CHECK_EQ(t.n, n);
        CHECK_EQ(t.vocab_size, tk.n_vocab);
        for (size_t k = 0; k < n && k < t.n; k++) CHECK_EQ(t.data[k], ids[k]);
        pt_tokens_free(&t);
        if (i == 0 && (f = fopen(bin, "r+b"))) { /* mark the cache: a read must see the mark */
            fseek(f, 1024, SEEK_SET);
            fputc(7, f);
            fputc(0, f);
            fclose(f);
            ZERO(t);
            CHECK_ST(pt_tokens_from_text(&t, &tk, txt, &d), PT_OK);
            CHECK(t.n > 0 && t.data[0] == 7); /* read from the cache */
            CHECK_EQ((int)t.cache, PT_CACHE_READ);
            pt_tokens_free(&t);
            ZERO(t); /* read-only: a matching cache is read too */
            CHECK_ST(pt_tokens_from_text(&t, &tk, txt, &ro), PT_OK);
            CHECK(t.n > 0 && t.data[0] == 7);
            CHECK_EQ((int)t.cache, PT_CACHE_READ);
            pt_tokens_free(&t);
        }
    }
    if ((f = fopen(txt, "wb"))) { /* read-only and stale (b's): tokenized, left alone */
        fputs(a, f);
        fclose(f);
    }
    ZERO(t);
    CHECK_ST(pt_tokens_from_text(&t, &tk, txt, &ro), PT_OK);
    CHECK_EQ((int)t.cache, PT_CACHE_NONE);
    CHECK_ST(pt_tokenizer_encode(&tk, a, strlen(a), 0, ids, &n), PT_OK);
    CHECK_EQ(t.n, n);
    pt_tokens_free(&t);
    ZERO(t);
    CHECK_ST(pt_tokens_load(&t, bin, PT_TOKENS_LLMC), PT_OK);
    CHECK_ST(pt_tokenizer_encode(&tk, b, strlen(b), 0, ids, &n), PT_OK);
    CHECK_EQ(t.n, n); /* still b's tokens */
    pt_tokens_free(&t);
    remove(txt);
    remove(bin);
    pt_tokenizer_free(&tk);
}

static const test_case tests[] = {
    {"inference_model", test_inference_model},
    {"fast_exp", test_fast_exp},
    {"writer_and_file_errors", test_writer_and_file_errors},
    {"kernel_sgemm", test_sgemm},
    {"kernel_gemm_fp32_bf16", test_gemm_kernels},
    {"kernel_gemm_bf16_operands", test_gemm_bf16_operands},
    {"kernel_gemm_precision", test_precision},
    {"kernel_gemm_small_team", test_gemm_small_team},
    {"kernel_encoder", test_encoder},
    {"kernel_layernorm", test_layernorm},
    {"kernel_norm_wide_rows", test_norm_wide_rows},
    {"kernel_matmul", test_matmul},
    {"kernel_attention", test_attention},
    {"kernel_gelu", test_gelu},
    {"kernel_act_lanes", test_act_lanes},
    {"kernel_act_fused", test_act_fused},
    {"kernel_residual", test_residual},
    {"kernel_tied_head", test_tied_head},
    {"kernel_crossentropy", test_crossentropy},
    {"kernel_head_xent_fused", test_head_xent_fused},
    {"model_grad_finite_differences", test_model_grad},
    {"gpt_head_fused", test_gpt_head_fused},
    {"init_weights", test_init_weights},
    {"threads_reproducible", test_threads_reproducible},
    {"parallel_grads_vs_serial", test_parallel_grads},
    {"sp_exact_vs_tp", test_sp_exact},
    {"head_fused_tp", test_head_fused_tp},
    {"head_fused_pp", test_head_fused_pp},
    {"sp_refusals", test_sp_refusals},
    {"cp_refusals", test_cp_refusals},
    {"steps_allocate_nothing", test_steps_allocate_nothing},
    {"zero3_matches_zero1", test_zero3_matches_zero1},
    {"adamw_vs_double_reference", test_adamw},
    {"adamw_tensors_one_loop", test_adamw_tensors_one_loop},
    {"adamw_step_decay_rule", test_adamw_step_decay_rule},
    {"norm_and_clip", test_norm_and_clip},
    {"lr_schedule", test_lr_schedule},
    {"rng", test_rng},
    {"arena", test_arena},
    {"big_blocks", test_big_blocks},
    {"gpt_memory_and_meta", test_gpt_memory},
    {"config_validation", test_config_validation},
    {"forward_input_checks", test_forward_input_checks},
    {"st_roundtrip", test_st_roundtrip},
    {"st_half_formats", test_st_half_formats},
    {"st_malformed", test_st_malformed},
    {"st_mutations", test_st_mutations},
    {"st_checksums", test_st_checksums},
    {"load_hf_weights", test_load_hf_weights},
    {"checkpoint_resume_bitwise", test_checkpoint_resume},
    {"checkpoint_errors", test_checkpoint_errors},
    {"check_step", test_check_step},
    {"tokens", test_tokens},
    {"loader_epochs_seek", test_loader_epochs},
    {"loader_splits", test_loader_splits},
    {"decode_matches_forward", test_decode_matches_forward},
    {"sample_logits", test_sample_logits},
    {"generate", test_generate},
    {"forward_pages", test_forward_pages},
    {"status_strings", test_status_strings},
    {"thread_local_error", test_thread_local_error},
    {"schedule_kinds", test_schedule_kinds},
    {"schedule_checker_rejects", test_schedule_checker_rejects},
    {"schedule_config_errors", test_schedule_config_errors},
    {"schedule_format", test_schedule_format},
    {"schedule_trace_files", test_schedule_trace_files},
    {"trace_svg", test_trace_svg},
    {"schedule_zb_more", test_schedule_zb_more},
    {"schedule_zb_more_rejects", test_schedule_zb_more_rejects},
    {"schedule_chimera", test_schedule_chimera},
    {"schedule_chimera_rejects", test_schedule_chimera_rejects},
    {"chimera_memory", test_chimera_memory},
    {"schedule_2bw", test_schedule_2bw},
    {"schedule_2bw_rejects", test_schedule_2bw_rejects},
    {"sim_flops_closed_form", test_sim_flops_closed_form},
    {"sim_mechanisms", test_sim_mechanisms},
    {"sim_recipe", test_sim_recipe},
    {"sim_pp_async", test_sim_pp_async},
    {"sim_rails", test_sim_rails},
    {"sim_cp_ring", test_sim_cp_ring},
    {"sim_cp_allgather", test_sim_cp_allgather},
    {"sim_grad_accum_pass", test_sim_grad_accum_pass},
    {"sim_grad_allreduce", test_sim_grad_allreduce},
    {"sim_cost_paths", test_sim_cost_paths},
    {"sim_zero3_ptrain", test_sim_zero3_ptrain},
    {"sim_zero3_executor_bytes", test_sim_zero3_executor_bytes},
    {"sim_overlap", test_sim_overlap},
    {"sim_errors", test_sim_errors},
    {"plan_model_desc", test_plan_model_desc},
    {"hw_comm", test_hw_comm},
    {"hw_gemm_tiles", test_hw_gemm_tiles},
    {"hw_file", test_hw_file},
    {"kernel_rmsnorm", test_rmsnorm},
    {"kernel_rope", test_rope},
    {"kernel_swiglu", test_swiglu},
    {"kernel_linear", test_linear},
    {"kernel_attention_gqa", test_attention_gqa},
    {"kernel_attention_ring", test_attention_ring},
    {"kernel_attention_fused", test_attention_fused},
    {"llama_model_grad", test_llama_model_grad},
    {"llama_config", test_llama_config},
    {"llama_checkpoint", test_llama_checkpoint},
    {"llama_decode_matches_forward", test_llama_decode},
    {"llama_plan", test_llama_plan},
    {"llama_hf_config", test_llama_hf_config},
    {"llama_save_hf", test_llama_save_hf},
    {"llama_save_hf_parallel", test_llama_save_hf_parallel},
    {"text_pieces", test_text_pieces},
    {"text_unicode_classes", test_text_unicode_classes},
    {"text_encode", test_text_encode},
    {"text_roundtrip", test_text_roundtrip},
    {"text_parallel", test_text_parallel},
    {"text_utf8_stream", test_text_utf8_stream},
    {"text_errors", test_text_errors},
    {"text_helpers", test_text_helpers},
    {"text_bpe_train", test_text_bpe_train},
    {"text_tokens_cache", test_text_tokens_cache},
};

int main(int argc, char **argv) {
    return test_run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
}
