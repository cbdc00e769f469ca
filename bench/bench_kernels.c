/* bench_kernels: every kernel's forward and backward at a model's shapes,
   against this machine's measured peaks.

     build/bench_kernels [--config gpt2-124m] [--batch 8] [--seq 256] [--threads 0]
                         [--torch /usr/bin/python3]

   Measures first: the cblas_sgemm peak on 1 thread and on all threads
   (2048^3), the fp32 and bf16 instruction peaks, and the memory bandwidth (a
   parallel update y += s*x on 2 x 128 MiB, fastest of 9: two reads and one
   write per element, all real traffic, where a triad's store would also read
   its line first, uncounted). Then for each kernel: a spot check of its result
   against a plain double computation, then the median time of a few calls,
   reported as GFLOP/s against the sgemm peak (matmuls, attention; attention
   FLOPs counted dense, 4*B*T^2*C forward, as in MFU) or GB/s against the
   bandwidth (everything else: the bytes each call must read and write at least).
   The GEMMs come first: one table of the model's GEMM shapes, a column a
   library and precision, all measured in one run: OpenBLAS and ptrain in fp32,
   ptrain in bf16, oneDNN's sgemm and bf16 matmul in build/bench_kernels_dnnl
   (-DPT_BENCH_DNNL, links -ldnnl), torch.mm in fp32 and bf16 with --torch
   PYTHON (one process running bench/torch_mm.py, from the repository's root).
   Profile one kernel with: perf record -g build/bench_kernels --only attention */
#define _POSIX_C_SOURCE 200809L /* setenv, execv (cli_passive_wait); fork, pipe, dprintf (--torch) */
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"
#include "../common/cli.h"

#include <math.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef PT_BENCH_DNNL /* build/bench_kernels_dnnl: oneDNN's columns (Debian's libdnnl-dev) */
#include <oneapi/dnnl/dnnl.h>
#endif

static int failures;
static double peak_gflops, bandwidth_gbs;
static pt_ctx g_pt; /* the kernels' execution context: fp32 GEMMs, their workspace */

static float *buffer(size_t n, pt_rng *r, float lo, float hi) {
    /* 64-byte aligned, as the arena aligns the step's tensors (malloc's 16:
       rows that split cache lines, a third slower attention) */
    float *x = (float *)aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
    size_t i;
    if (!x) {
        fprintf(stderr, "error: out of memory (%zu floats)\n", n);
        exit(2);
    }
    for (i = 0; i < n; i++) x[i] = lo + (hi - lo) * pt_rng_uniform(r);
    return x;
}

static void check(const char *what, double got, double want, double tol) {
    if (!(fabs(got - want) <= tol * (1.0 + fabs(want)))) {
        printf("CHECK FAILED %s: got %.9g, expected %.9g\n", what, got, want);
        failures++;
    }
}

typedef void (*kernel_fn)(void *ctx);

static double cpu_seconds(void);
static double last_cpu; /* the median CPU seconds of time_best's last kernel */

/* median seconds of reps calls (after one warm-up call); *best gets the
   fastest, last_cpu the median of the process's CPU seconds a call (all
   threads: time slicing on a loaded machine does not stretch it, waiting
   threads sleep, so it is the steadier measure of a kernel's own cost) */
static double time_best(kernel_fn fn, void *ctx, int reps, double *best) {
    double t[16], cpu[16];
    int i;
    if (reps > 16) reps = 16;
    fn(ctx);
    for (i = 0; i < reps; i++) {
        double t0 = pt_time_now(), c0 = cpu_seconds();
        fn(ctx);
        t[i] = pt_time_now() - t0, cpu[i] = cpu_seconds() - c0;
    }
    qsort(t, (size_t)reps, sizeof(double), cli_cmp_double);
    qsort(cpu, (size_t)reps, sizeof(double), cli_cmp_double);
    if (best) *best = t[0];
    last_cpu = cpu[reps / 2];
    return t[reps / 2];
}

static double time_it(kernel_fn fn, void *ctx, int reps) { return time_best(fn, ctx, reps, NULL); }

static void report(const char *name, double sec, double flops, double bytes) {
    if (flops > 0)
        printf("  %-28s %10.3f ms %9.1f GFLOP/s  %5.1f%% of sgemm peak\n", name, sec * 1e3,
               flops / sec / 1e9, 100.0 * flops / sec / 1e9 / peak_gflops);
    else /* (with the CPU time of time_best's call) */
        printf("  %-28s %10.3f ms %9.1f GB/s     %5.1f%% of bandwidth  (CPU %.3f ms)\n", name,
               sec * 1e3, bytes / sec / 1e9, 100.0 * bytes / sec / 1e9 / bandwidth_gbs,
               last_cpu * 1e3);
}

/* ---- the kernels' calls, each with its own context ------------------------- */

typedef struct ctx {
    int B, T, C, NH, V, N, IN, OUT, slots;
    float *x, *y, *w, *b, *dx, *dw, *db, *dy, *mean, *rstd, *qkv, *dqkv, *att, *lse, *scratch;
    float *m, *v, *pe, *dpe; /* AdamW moments; position embedding and its gradient */
    double *dlse;
    int *ids;
    size_t n;
    pt_adamw_config opt;
} ctx;

static void k_encoder_f(void *p) { ctx *c = (ctx *)p; pt_encoder_forward(c->y, c->ids, c->w, c->pe, c->B, c->T, c->C); }
static void k_encoder_b(void *p) { ctx *c = (ctx *)p; pt_encoder_backward(c->dw, c->dpe, c->dy, c->ids, c->B, c->T, c->C); }
static void k_ln_f(void *p) { ctx *c = (ctx *)p; pt_layernorm_forward(c->y, c->mean, c->rstd, c->x, c->w, c->b, c->N, c->C, 1e-5f); }
static void k_ln_b(void *p) { ctx *c = (ctx *)p; pt_layernorm_backward(c->dx, c->dw, c->db, c->dy, c->x, c->w, c->mean, c->rstd, c->N, c->C); }
static void k_mm_f(void *p) { ctx *c = (ctx *)p; pt_matmul_forward(&g_pt, c->y, c->x, c->w, c->b, c->N, c->IN, c->OUT); }
static void k_mm_b(void *p) { ctx *c = (ctx *)p; pt_matmul_backward(&g_pt, c->dx, c->dw, c->db, c->dy, c->x, c->w, c->N, c->IN, c->OUT); }
static void k_att_f(void *p) { ctx *c = (ctx *)p; pt_attention_forward(&g_pt, c->y, c->lse, c->qkv, c->scratch, c->slots, c->B, c->T, c->C, c->NH, c->NH); }
static void k_att_b(void *p) { ctx *c = (ctx *)p; pt_attention_backward(&g_pt, c->dqkv, c->dy, c->y, c->qkv, c->lse, c->scratch, c->slots, c->B, c->T, c->C, c->NH, c->NH); }
static void k_gelu_f(void *p) { ctx *c = (ctx *)p; pt_gelu_forward(c->y, c->x, c->n); }
static void k_gelu_b(void *p) { ctx *c = (ctx *)p; pt_gelu_backward(c->dx, c->x, c->dy, c->n); }
static void k_res_f(void *p) { ctx *c = (ctx *)p; pt_residual_forward(c->y, c->x, c->w, c->n); }
static void k_res_b(void *p) { ctx *c = (ctx *)p; pt_residual_backward(c->dx, c->dw, c->dy, c->n); }
static void k_head_f(void *p) { ctx *c = (ctx *)p; pt_tied_head_forward(&g_pt, c->y, c->x, c->w, c->N, c->C, c->V); }
static void k_head_b(void *p) { ctx *c = (ctx *)p; pt_tied_head_backward(&g_pt, c->dx, c->dw, c->dy, c->x, c->w, c->N, c->C, c->V); }
static void k_xent_f(void *p) { ctx *c = (ctx *)p; pt_crossentropy_forward(c->b, c->dlse, c->x, c->ids, c->N, c->V); }
static void k_xent_b(void *p) { ctx *c = (ctx *)p; pt_crossentropy_backward(c->dx, c->x, c->dlse, c->ids, c->N, c->V, 1.0f / c->N); }
static void k_adamw(void *p) { ctx *c = (ctx *)p; pt_adamw_update(c->w, c->dw, c->m, c->v, c->n, &c->opt, 1e-4f, 10, 1); }

typedef struct gemm_args {
    int ta, tb, M, N, K, bf16, dnnl; /* bf16: pt_gemm_bf16 (or oneDNN's bf16 matmul); dnnl: oneDNN's */
    int kernel; /* fp32: the GEMM selected on every shape (pt_ctx.all_shapes: ptrain's kernel
                   on a single row too, which pt_sgemm would leave to OpenBLAS) */
    const float *A, *B;
    float *C;
#ifdef PT_BENCH_DNNL
    dnnl_stream_t stream;
    dnnl_primitive_t matmul; /* the bf16 matmul of this shape, and its operands */
    dnnl_memory_t mem[3];
    dnnl_exec_arg_t args[3];
#endif
} gemm_args;

/* the bf16 instruction peak of one kernel's instruction (0: not on this CPU) */
static double bf16_peak(const char *kernel) {
    return pt_gemm_bf16_select(kernel) == PT_OK ? pt_instr_peak_gflops(1, 0.5) : 0.0;
}

static void k_gemm(void *p) {
    gemm_args *g = (gemm_args *)p;
    int lda = g->ta ? g->M : g->K, ldb = g->tb ? g->K : g->N;
#ifdef PT_BENCH_DNNL
    if (g->dnnl && g->bf16) {
        dnnl_primitive_execute(g->matmul, g->stream, 3, g->args);
        dnnl_stream_wait(g->stream);
        return;
    }
    if (g->dnnl) {
        dnnl_sgemm(g->ta ? 'T' : 'N', g->tb ? 'T' : 'N', g->M, g->N, g->K, 1.0f, g->A, lda, g->B,
                   ldb, 0.0f, g->C, g->N);
        return;
    }
#endif
    g_pt.all_shapes = g->kernel; /* ptrain's kernel even on a single row */
    if (g->bf16)
        pt_gemm_bf16(&g_pt, g->ta, g->tb, g->M, g->N, g->K, 1.0f, g->A, lda, g->B, ldb, 0.0f, g->C,
                     g->N);
    else
        pt_sgemm(&g_pt, g->ta, g->tb, g->M, g->N, g->K, 1.0f, g->A, lda, g->B, ldb, 0.0f, g->C,
                 g->N);
    g_pt.all_shapes = 0;
}

#ifdef PT_BENCH_DNNL
/* oneDNN's bf16 matmul of g's product into dst (fp32, row-major), created once
   for k_gemm's timed calls: src op(A) and weights op(B) in bf16, A and B
   rounded once into a16 and b16 (to nearest even, as pt_gemm_bf16 rounds
   them); the transposes are strides on the memory descriptors, so it runs the
   same product as the other columns. 0 if oneDNN refuses it. */
static int dnnl_bf16_matmul(gemm_args *g, dnnl_engine_t engine, uint16_t *a16, uint16_t *b16,
                            float *dst) {
    dnnl_dims_t ad = {g->M, g->K}, bd = {g->K, g->N}, cd = {g->M, g->N};
    dnnl_dims_t as = {g->ta ? 1 : g->K, g->ta ? g->M : 1}, bs = {g->tb ? 1 : g->N, g->tb ? g->K : 1};
    dnnl_dims_t cs = {g->N, 1};
    dnnl_memory_desc_t amd, bmd, cmd;
    dnnl_matmul_desc_t desc;
    dnnl_primitive_desc_t pd;
    size_t i;
    int ok;
    for (i = 0; i < (size_t)g->M * g->K; i++) a16[i] = pt_bf16_from_float(g->A[i]);
    for (i = 0; i < (size_t)g->K * g->N; i++) b16[i] = pt_bf16_from_float(g->B[i]);
    if (dnnl_memory_desc_init_by_strides(&amd, 2, ad, dnnl_bf16, as) != dnnl_success ||
        dnnl_memory_desc_init_by_strides(&bmd, 2, bd, dnnl_bf16, bs) != dnnl_success ||
        dnnl_memory_desc_init_by_strides(&cmd, 2, cd, dnnl_f32, cs) != dnnl_success ||
        dnnl_matmul_desc_init(&desc, &amd, &bmd, NULL, &cmd) != dnnl_success ||
        dnnl_primitive_desc_create(&pd, &desc, NULL, engine, NULL) != dnnl_success)
        return 0;
    ok = dnnl_primitive_create(&g->matmul, pd) == dnnl_success;
    dnnl_primitive_desc_destroy(pd);
    if (!ok || dnnl_memory_create(&g->mem[0], &amd, engine, a16) != dnnl_success ||
        dnnl_memory_create(&g->mem[1], &bmd, engine, b16) != dnnl_success ||
        dnnl_memory_create(&g->mem[2], &cmd, engine, dst) != dnnl_success)
        return 0;
    g->args[0].arg = DNNL_ARG_SRC, g->args[1].arg = DNNL_ARG_WEIGHTS, g->args[2].arg = DNNL_ARG_DST;
    for (i = 0; i < 3; i++) g->args[i].memory = g->mem[i];
    return 1;
}
#endif

/* --torch PYTHON: starts PYTHON bench/torch_mm.py with its stdin and stdout as
   pipes: bench_kernels writes it one shape a line (ta tb M N K reps threads),
   it answers one line (torch.mm's fp32 and bf16 GFLOP/s); its first line
   names torch's version, into version. Says so and exits if it does not. */
static pid_t torch_start(const char *python, FILE **to, FILE **from, char *version, int len) {
    int in[2], out[2];
    pid_t pid;
    if (pipe(in) != 0 || pipe(out) != 0 || (pid = fork()) < 0) {
        fprintf(stderr, "error: --torch: %s\n", strerror(errno));
        exit(2);
    }
    if (pid == 0) {
        dup2(in[0], 0), dup2(out[1], 1);
        close(in[0]), close(in[1]), close(out[0]), close(out[1]);
        execlp(python, python, "bench/torch_mm.py", (char *)NULL);
        dprintf(1, "cannot run %s: %s\n", python, strerror(errno));
        _exit(127);
    }
    close(in[0]), close(out[1]);
    *to = fdopen(in[1], "w"), *from = fdopen(out[0], "r");
    version[0] = 0;
    if (!*to || !*from || !fgets(version, len, *from) || strncmp(version, "torch ", 6) != 0) {
        version[strcspn(version, "\n")] = 0;
        fprintf(stderr, "error: --torch: %s bench/torch_mm.py did not start (%s)\n", python,
                *version ? version : "no answer");
        exit(2);
    }
    version[strcspn(version, "\n")] = 0;
    return pid;
}

/* k_gemm n times: small products timed in runs of about a millisecond */
typedef struct gemm_run { gemm_args *g; int n; } gemm_run;
static void k_gemm_run(void *p) {
    gemm_run *r = (gemm_run *)p;
    int i;
    for (i = 0; i < r->n; i++) k_gemm(r->g);
}

static double dot_col(const float *x, const float *w, int n, int IN, int OUT, int o) {
    double s = 0.0;
    int i;
    for (i = 0; i < IN; i++) s += (double)x[(size_t)n * IN + i] * w[(size_t)i * OUT + o];
    return s;
}

/* ---- LLaMA's kernels: RMSNorm, RoPE, SwiGLU, grouped-query attention ------- */
/* whether a kernel runs: only (the --only option) NULL, or one of its
   comma-separated items a part of name */
static int run_only(const char *name, const char *only) {
    while (only) {
        const char *end = strchr(only, ',');
        size_t len = end ? (size_t)(end - only) : strlen(only), i;
        for (i = 0; len > 0 && name[i]; i++)
            if (strncmp(name + i, only, len) == 0) return 1;
        if (!end) return 0;
        only = end + 1;
    }
    return 1;
}
#define RUN(name) run_only(name, only)

typedef struct lctx {
    int N, T, B, C, NH, NKV, hd, F, Q3, slots;
    float *x, *y, *dx, *dy, *w, *dw, *rstd, *cs, *h, *dh, *qkv, *dqkv, *out, *lse, *scratch;
} lctx;

static void k_rms_f(void *p) { lctx *c = (lctx *)p; pt_rmsnorm_forward(c->y, c->rstd, c->x, c->w, c->N, c->C, 1e-5f); }
static void k_rms_b(void *p) { lctx *c = (lctx *)p; pt_rmsnorm_backward(c->dx, c->dw, c->dy, c->x, c->w, c->rstd, c->N, c->C); }
static void k_rope_f(void *p) { lctx *c = (lctx *)p; pt_rope_forward(c->qkv, c->cs, c->N, c->T, c->NH + c->NKV, c->hd, c->Q3); }
static void k_rope_b(void *p) { lctx *c = (lctx *)p; pt_rope_backward(c->dqkv, c->cs, c->N, c->T, c->NH + c->NKV, c->hd, c->Q3); }
static void k_swiglu_f(void *p) { lctx *c = (lctx *)p; pt_swiglu_forward(c->y, c->h, c->N, c->F); }
static void k_swiglu_b(void *p) { lctx *c = (lctx *)p; pt_swiglu_backward(c->dh, c->h, c->dy, c->N, c->F); }
static void k_gqa_f(void *p) { lctx *c = (lctx *)p; pt_attention_forward(&g_pt, c->out, c->lse, c->qkv, c->scratch, c->slots, c->B, c->T, c->C, c->NH, c->NKV); }
static void k_gqa_b(void *p) { lctx *c = (lctx *)p; pt_attention_backward(&g_pt, c->dqkv, c->dy, c->out, c->qkv, c->lse, c->scratch, c->slots, c->B, c->T, c->C, c->NH, c->NKV); }

/* The LLaMA kernels at cfg's width and heads: its n_kv_head and ffn_hidden
   for a LLaMA preset, else LLaMA's choice for that width (a third of the
   heads for keys/values when they divide, SwiGLU 8C/3 rounded up to 64):
   gpt2-124m gives the 768 wide, 12 heads, 4 key/value heads, 2048. */
static void bench_llama(const pt_gpt_config *cfg, int B, int T, int reps, const char *only,
                        pt_rng *r) {
    lctx c;
    size_t N, C, F, Q3;
    int i;
    memset(&c, 0, sizeof c);
    c.B = B, c.T = T, c.N = B * T, c.C = cfg->n_embd, c.NH = cfg->n_head, c.hd = c.C / c.NH;
    c.NKV = cfg->n_kv_head > 0 ? cfg->n_kv_head : c.NH % 3 == 0 ? c.NH / 3 : c.NH;
    c.F = cfg->mlp == PT_MLP_SWIGLU ? cfg->ffn_hidden : (8 * c.C / 3 + 63) / 64 * 64;
    c.Q3 = c.C + 2 * c.NKV * c.hd, c.slots = pt_get_threads();
    N = (size_t)c.N, C = (size_t)c.C, F = (size_t)c.F, Q3 = (size_t)c.Q3;
    printf("LLaMA kernels: %d key/value heads of %d, SwiGLU hidden %d\n", c.NKV, c.NH, c.F);
    if (RUN("rmsnorm")) {
        double ms = 0.0;
        c.x = buffer(N * C, r, -1, 1), c.y = buffer(N * C, r, 0, 0), c.dy = buffer(N * C, r, -1, 1);
        c.dx = buffer(N * C, r, 0, 0), c.w = buffer(C, r, 1, 1), c.dw = buffer(C, r, 0, 0);
        c.rstd = buffer(N, r, 0, 0);
        k_rms_f(&c);
        for (i = 0; i < c.C; i++) ms += (double)c.x[7 * C + i] * c.x[7 * C + i];
        check("rmsnorm y[7,3]", c.y[7 * C + 3], c.x[7 * C + 3] / sqrt(ms / C + 1e-5), 1e-5);
        report("rmsnorm forward", time_it(k_rms_f, &c, reps), 0, 8.0 * N * C);
        report("rmsnorm backward", time_it(k_rms_b, &c, reps), 0, 16.0 * N * C);
        free(c.x), free(c.y), free(c.dy), free(c.dx), free(c.w), free(c.dw), free(c.rstd);
    }
    if (RUN("rope")) { /* in place on the q and k heads of each [q|k|v] row */
        double f = pow(10000.0, -2.0 * 5 / c.hd), a, b;
        c.qkv = buffer(N * Q3, r, -1, 1), c.dqkv = buffer(N * Q3, r, -1, 1);
        c.cs = buffer((size_t)T * c.hd, r, 0, 0);
        pt_rope_table(c.cs, T, c.hd, 10000.0f, NULL);
        a = c.qkv[9 * Q3 + 5], b = c.qkv[9 * Q3 + 5 + c.hd / 2];
        k_rope_f(&c);
        check("rope q[9,5]", c.qkv[9 * Q3 + 5], a * cos(9 % T * f) - b * sin(9 % T * f), 1e-5);
        report("rope forward (q, k in place)", time_it(k_rope_f, &c, reps), 0,
               8.0 * N * (size_t)(c.NH + c.NKV) * c.hd);
        report("rope backward (in place)", time_it(k_rope_b, &c, reps), 0,
               8.0 * N * (size_t)(c.NH + c.NKV) * c.hd);
        free(c.qkv), free(c.dqkv), free(c.cs);
    }
    if (RUN("swiglu")) {
        double g;
        c.h = buffer(N * 2 * F, r, -3, 3), c.dh = buffer(N * 2 * F, r, 0, 0);
        c.y = buffer(N * F, r, 0, 0), c.dy = buffer(N * F, r, -1, 1);
        k_swiglu_f(&c);
        g = c.h[3 * 2 * F + 7];
        check("swiglu y[3,7]", c.y[3 * F + 7], g / (1.0 + exp(-g)) * c.h[3 * 2 * F + F + 7], 1e-5);
        report("swiglu forward", time_it(k_swiglu_f, &c, reps), 0, 12.0 * N * F);
        report("swiglu backward", time_it(k_swiglu_b, &c, reps), 0, 20.0 * N * F);
        free(c.h), free(c.dh), free(c.y), free(c.dy);
    }
    if (RUN("gqa attention")) { /* dense FLOPs as the attention lines above */
        c.qkv = buffer(N * Q3, r, -1, 1), c.dqkv = buffer(N * Q3, r, 0, 0);
        c.out = buffer(N * C, r, 0, 0), c.dy = buffer(N * C, r, -1, 1);
        c.lse = buffer((size_t)B * c.NH * T, r, 0, 0);
        c.scratch = buffer(pt_attention_scratch_floats(T, c.slots), r, 0, 0);
        report("gqa attention forward", time_it(k_gqa_f, &c, reps), 4.0 * N * T * C, 0);
        report("gqa attention backward", time_it(k_gqa_b, &c, reps), 8.0 * N * T * C, 0);
        free(c.qkv), free(c.dqkv), free(c.out), free(c.dy), free(c.lse), free(c.scratch);
    }
}

/* ---- attention against the GEMM, in one run ------------------------------- */

typedef struct arate {
    pt_ctx *ctx;
    int B, T, C, NH, NKV, Q3, slots;
    float *qkv, *dqkv, *out, *dy, *lse, *scratch, *x, *w, *y;
} arate;

static void k_ar_att(void *p) {
    arate *a = (arate *)p;
    pt_attention_forward(a->ctx, a->out, a->lse, a->qkv, a->scratch, a->slots, a->B, a->T, a->C,
                         a->NH, a->NKV);
    pt_attention_backward(a->ctx, a->dqkv, a->dy, a->out, a->qkv, a->lse, a->scratch, a->slots,
                          a->B, a->T, a->C, a->NH, a->NKV);
}
static void k_ar_gemm(void *p) { /* the layers' qkv projection: N x Q3 x C */
    arate *a = (arate *)p;
    pt_matmul_forward(a->ctx, a->y, a->x, a->w, NULL, a->B * a->T, a->C, a->Q3);
}

/* the process's CPU seconds so far (all its threads) */
static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* fn's fastest of one call in wall seconds (*wall) and CPU seconds (*cpu) */
static void time_min2(kernel_fn fn, void *ctx, double *wall, double *cpu) {
    double w = pt_time_now(), c = cpu_seconds();
    fn(ctx);
    w = pt_time_now() - w, c = cpu_seconds() - c;
    if (w < *wall) *wall = w;
    if (c < *cpu) *cpu = c;
}

/* "attention rate": attention forward + backward (causal FLOPs, as bench_step
   --phases counts them: 6 B T^2 C) against the model's qkv GEMM (N x Q3 x C)
   at the same precision, for GPT-2's heads and LLaMA's grouped ones (a third
   of the heads for keys/values), rounds alternating so a shared machine's
   load falls on both alike; each the fastest of its rounds, in wall time and
   in the process's CPU time (which a loaded machine's time slicing does not
   stretch: with --threads 1 the steadiest ratio there). */
static void bench_attention_rate(const pt_gpt_config *cfg, int B, int T, int reps, pt_rng *r) {
    int prec, gqa, i;
    for (prec = 0; prec < 2; prec++) {
        pt_ctx_desc d;
        pt_ctx ctx;
        memset(&d, 0, sizeof d);
        d.precision = prec ? PT_PRECISION_BF16 : PT_PRECISION_FP32;
        if (pt_ctx_init(&ctx, &d) != PT_OK) return;
        for (gqa = 0; gqa < 2; gqa++) {
            arate a;
            size_t N = (size_t)B * T;
            double ta = 1e30, tg = 1e30, ca = 1e30, cg = 1e30, fa, fg, fl = 6.0 * B * (double)T * T;
            memset(&a, 0, sizeof a);
            a.ctx = &ctx, a.B = B, a.T = T, a.C = cfg->n_embd, a.NH = cfg->n_head;
            a.NKV = gqa && a.NH % 3 == 0 ? a.NH / 3 : a.NH, a.slots = pt_get_threads();
            a.Q3 = a.C + 2 * a.NKV * (a.C / a.NH);
            a.qkv = buffer(N * a.Q3, r, -1, 1), a.dqkv = buffer(N * a.Q3, r, 0, 0);
            a.out = buffer(N * a.C, r, 0, 0), a.dy = buffer(N * a.C, r, -1, 1);
            a.lse = buffer((size_t)B * a.NH * T, r, 0, 0);
            a.scratch = buffer(pt_attention_scratch_floats(T, a.slots), r, 0, 0);
            a.x = buffer(N * a.C, r, -1, 1), a.w = buffer((size_t)a.C * a.Q3, r, -0.05f, 0.05f);
            a.y = buffer(N * a.Q3, r, 0, 0);
            k_ar_att(&a), k_ar_gemm(&a); /* warm-up */
            for (i = 0; i < reps; i++) {
                time_min2(k_ar_att, &a, &ta, &ca);
                time_min2(k_ar_gemm, &a, &tg, &cg);
            }
            fl *= a.C, fa = fl / ta / 1e9, fg = 2.0 * N * a.Q3 * a.C / tg / 1e9;
            printf("  attention rate %s %-3s (%2d/%2d kv heads) fwd+bwd %7.2f ms %6.1f GFLOP/s, "
                   "qkv GEMM %6.1f: attention/GEMM %.2f wall, %.2f CPU time\n",
                   prec ? "bf16" : "fp32", gqa ? "gqa" : "mha", a.NKV, a.NH, ta * 1e3, fa, fg,
                   fa / fg, (fl / ca) / (2.0 * N * a.Q3 * a.C / cg));
            free(a.qkv), free(a.dqkv), free(a.out), free(a.dy), free(a.lse), free(a.scratch);
            free(a.x), free(a.w), free(a.y);
        }
        pt_ctx_free(&ctx);
    }
}

/* "head rate": the head and the loss fused (pt_head_xent_fused by the
   executor's PT__HEAD_ROWS-row blocks, forward and backward: 6 N V C FLOPs)
   against the model's c_fc GEMM (N x 4C x C) at the same precision, and
   against the unfused head (its three GEMMs on the whole logits, the loss
   between), rounds alternating, each the fastest of its rounds, in wall
   time and in the process's CPU time (as "attention rate"). --vocab sets V
   (LLaMA 3's 128256: the head the step's largest part). */
typedef struct hrate {
    pt_ctx *ctx;
    int N, C, V;
    float *x, *w, *dx, *dw, *work, *logits, *loss, *y, *wf;
    size_t work_n; /* floats of work: pt_head_xent_work_floats (fp32: the most) */
    double *lse;
    int *tg;
} hrate;

static void k_hr_fused(void *p) {
    hrate *h = (hrate *)p;
    pt_head_xent_fused(h->ctx, h->loss, h->lse, h->dx, h->dw, h->x, h->w, h->tg, h->N, h->C,
                       h->V, 1.0f / (float)h->N, h->work, h->work_n, PT__HEAD_ROWS);
}
static void k_hr_unfused(void *p) {
    hrate *h = (hrate *)p;
    pt_tied_head_forward(h->ctx, h->logits, h->x, h->w, h->N, h->C, h->V);
    pt_crossentropy_forward(h->loss, h->lse, h->logits, h->tg, h->N, h->V);
    pt_crossentropy_backward(h->logits, h->logits, h->lse, h->tg, h->N, h->V, 1.0f / (float)h->N);
    pt_tied_head_backward(h->ctx, h->dx, h->dw, h->logits, h->x, h->w, h->N, h->C, h->V);
}
static void k_hr_gemm(void *p) { /* the layers' c_fc: N x 4C x C */
    hrate *h = (hrate *)p;
    pt_matmul_forward(h->ctx, h->y, h->x, h->wf, NULL, h->N, h->C, 4 * h->C);
}

/* "head parts": pt_head_xent_fused's work by parts, through its own loop
   (pt__head_xent_parts, whose lap marks each part's end): the pack of wte,
   then by PT__HEAD_ROWS blocks the logits GEMM, the loss and gradient rows,
   the dx GEMM, the dwte GEMM; each part's wall and CPU seconds summed over
   the blocks into w[5], c[5] */
typedef struct hr_laps {
    double *w, *c, w0, c0;
} hr_laps;

/* adds the wall and CPU seconds since the last lap to part k's */
static void hr_lap(void *p, int k) {
    hr_laps *l = (hr_laps *)p;
    double wn = pt_time_now(), cn = cpu_seconds();
    l->w[k] += wn - l->w0, l->c[k] += cn - l->c0, l->w0 = wn, l->c0 = cn;
}

static void hr_parts(hrate *h, double w[5], double c[5]) {
    hr_laps l;
    int k;
    for (k = 0; k < 5; k++) w[k] = c[k] = 0.0;
    l.w = w, l.c = c, l.w0 = pt_time_now(), l.c0 = cpu_seconds();
    pt__head_xent_parts(h->ctx, h->loss, h->lse, h->dx, h->dw, h->x, h->w, h->tg, h->N, h->C,
                        h->V, 1.0f / (float)h->N, h->work, h->work_n, PT__HEAD_ROWS, hr_lap, &l);
}

/* "head parts" printed: each part's fastest total of reps runs, its share of
   the head, GFLOP/s (CPU time: per core) and its share of pk, the one-thread
   instruction peak */
static void hr_parts_print(hrate *h, int reps, double pk) {
    const char *nm[5] = {"pack wte", "logits GEMM", "loss rows", "dx GEMM", "dwte GEMM"};
    double w[5], c[5], bw[5], bc[5], tot = 0.0, fl = 2.0 * h->N * (double)h->V * h->C;
    int k, i;
    for (k = 0; k < 5; k++) bw[k] = bc[k] = 1e30;
    for (i = 0; i < reps; i++) {
        hr_parts(h, w, c);
        for (k = 0; k < 5; k++) bw[k] = w[k] < bw[k] ? w[k] : bw[k], bc[k] = c[k] < bc[k] ? c[k] : bc[k];
    }
    for (k = 0; k < 5; k++) tot += bc[k];
    for (k = 0; k < 5; k++) {
        printf("    head parts %-11s %8.2f ms wall %8.2f ms CPU (%4.1f%%)", nm[k], bw[k] * 1e3,
               bc[k] * 1e3, 100.0 * bc[k] / tot);
        if (k == 1 || k >= 3)
            printf(" %6.1f GFLOP/s a core: %4.1f%% of the instruction peak", fl / bc[k] / 1e9,
                   100.0 * fl / bc[k] / 1e9 / pk);
        printf("\n");
    }
}

static void bench_head_rate(const pt_gpt_config *cfg, int B, int T, int reps, int parts,
                            pt_rng *r) {
    hrate h;
    size_t N = (size_t)B * T, C = (size_t)cfg->n_embd, V = (size_t)cfg->vocab_size, i;
    double fl = 6.0 * (double)N * V * C, fg = 8.0 * (double)N * C * C;
    int prec, k;
    memset(&h, 0, sizeof h);
    h.N = (int)N, h.C = (int)C, h.V = (int)V;
    h.x = buffer(N * C, r, -1, 1), h.w = buffer(V * C, r, -0.05f, 0.05f);
    h.dx = buffer(N * C, r, 0, 0), h.dw = buffer(V * C, r, 0, 0);
    h.work_n = pt_head_xent_work_floats(&g_pt, h.N, h.C, h.V, PT__HEAD_ROWS);
    h.work = buffer(h.work_n, r, 0, 0);
    h.logits = buffer(N * V, r, 0, 0), h.loss = buffer(N, r, 0, 0), h.y = buffer(N * 4 * C, r, 0, 0);
    h.wf = buffer(4 * C * C, r, -0.05f, 0.05f);
    h.lse = (double *)malloc(N * sizeof(double)), h.tg = (int *)malloc(N * sizeof(int));
    if (!h.lse || !h.tg) {
        printf("  head rate: out of memory for %zu rows\n", N);
        failures++;
        free(h.lse), free(h.tg);
        return;
    }
    for (i = 0; i < N; i++) h.tg[i] = (int)(pt_rng_u64(r) % V);
    for (prec = 0; prec < 2; prec++) {
        pt_ctx_desc d;
        pt_ctx ctx;
        double t[3] = {1e30, 1e30, 1e30}, c[3] = {1e30, 1e30, 1e30};
        memset(&d, 0, sizeof d);
        d.precision = prec ? PT_PRECISION_BF16 : PT_PRECISION_FP32;
        if (pt_ctx_init(&ctx, &d) != PT_OK) break;
        h.ctx = &ctx;
        k_hr_fused(&h), k_hr_unfused(&h), k_hr_gemm(&h); /* warm-up */
        for (k = 0; k < reps; k++) {
            time_min2(k_hr_fused, &h, &t[0], &c[0]);
            time_min2(k_hr_unfused, &h, &t[1], &c[1]);
            time_min2(k_hr_gemm, &h, &t[2], &c[2]);
        }
        printf("  head rate %s V=%zu fused %8.2f ms %6.1f GFLOP/s (unfused %8.2f ms), c_fc GEMM "
               "%6.1f: fused/GEMM %.2f wall, %.2f CPU time; fused/unfused time %.2f wall, %.2f "
               "CPU\n", prec ? "bf16" : "fp32", V, t[0] * 1e3, fl / t[0] / 1e9, t[1] * 1e3,
               fg / t[2] / 1e9, (fl / t[0]) / (fg / t[2]), (fl / c[0]) / (fg / c[2]), t[0] / t[1],
               c[0] / c[1]);
        if (parts) { /* the one-thread peak: each part's CPU-time rate is per core */
            int th = pt_get_threads();
            double pk;
            pt_set_threads(1);
            pk = pt_instr_peak_gflops(prec, 0.5);
            pt_set_threads(th);
            hr_parts_print(&h, reps, pk);
        }
        pt_ctx_free(&ctx);
    }
    free(h.x), free(h.w), free(h.dx), free(h.dw), free(h.work), free(h.logits), free(h.loss);
    free(h.y), free(h.wf), free(h.lse), free(h.tg);
}

/* ---- the run's phases, in main's order ------------------------------------- */

/* the options and the --torch process, as main parsed and started them */
typedef struct run_opts {
    const char *config, *only;
    int batch, seq, reps;
    FILE *torch_to, *torch_from; /* bench/torch_mm.py's stdin and stdout */
    pid_t torch_pid;             /* 0: no --torch */
    char torch_version[128];
} run_opts;

/* this machine's peaks, printed: sgemm at 2048^3 (into peak_gflops) and the
   instruction peaks (into ipeak: fp32 FMA, bf16 AMX, bf16 vdpbf16ps; 0: not
   on this CPU) on 1 thread and on the run's, and the memory bandwidth (into
   bandwidth_gbs) */
static void measure_machine(int threads, double ipeak[3]) {
    double peak1, ipeak1[3];
    pt_set_threads(1);
    peak1 = pt_gemm_peak_gflops(&g_pt, 2048, 1.0);
    pt_set_threads(threads);
    peak_gflops = pt_gemm_peak_gflops(&g_pt, 2048, 1.0);
    pt_set_threads(1);
    ipeak1[0] = pt_instr_peak_gflops(0, 0.5);
    ipeak1[1] = bf16_peak("amx"), ipeak1[2] = bf16_peak("avx512bf16");
    pt_set_threads(threads);
    ipeak[0] = pt_instr_peak_gflops(0, 0.5);
    ipeak[1] = bf16_peak("amx"), ipeak[2] = bf16_peak("avx512bf16");
    pt_gemm_bf16_select(NULL);
    printf("machine: instruction peak fp32 FMA %.1f GFLOP/s on 1 thread, %.1f on %d threads; "
           "bf16 AMX TDPBF16PS %.1f on 1 thread, %.1f on %d threads; bf16 vdpbf16ps %.1f on 1 "
           "thread, %.1f on %d threads (0: not on this CPU)\n",
           ipeak1[0], ipeak[0], pt_get_threads(), ipeak1[1], ipeak[1], pt_get_threads(), ipeak1[2],
           ipeak[2], pt_get_threads());
    bandwidth_gbs = pt_mem_bandwidth_gbs((size_t)32 << 20, 9); /* 2 x 128 MiB: beyond caches */
    printf("machine: sgemm peak %.1f GFLOP/s on 1 thread, %.1f GFLOP/s on %d threads; memory "
           "bandwidth %.1f GB/s (y += s*x)\n",
           peak1, peak_gflops, pt_get_threads(), bandwidth_gbs);
}

/* the model's shapes into c, and buffers big enough for every kernel below;
   2 if out of memory */
static int alloc_buffers(ctx *c, const pt_gpt_config *cfg, const run_opts *o, pt_rng *r) {
    size_t N, C, V, n4, big, wmax;
    int i;
    memset(c, 0, sizeof *c);
    c->B = o->batch, c->T = o->seq, c->C = cfg->n_embd, c->NH = cfg->n_head, c->V = cfg->vocab_size;
    c->N = o->batch * o->seq, c->slots = pt_get_threads();
    N = (size_t)c->N, C = (size_t)c->C, V = (size_t)c->V, n4 = N * 4 * C;
    printf("kernels at %s shapes: B=%d T=%d C=%d heads=%d V=%d (N = B*T = %zu rows)\n", o->config,
           o->batch, o->seq, c->C, c->NH, c->V, N);
    big = N * V > n4 ? N * V : n4, wmax = V * C > 4 * C * C ? V * C : 4 * C * C;
    if (wmax < N * C) wmax = N * C; /* the residual's second operand and gradient */
    if (big < wmax) big = wmax; /* the GEMM table's dW products, a weight's size, land in y */
    c->x = buffer(big, r, -1, 1), c->y = buffer(big, r, 0, 0), c->dy = buffer(big, r, -1, 1);
    c->dx = buffer(big, r, 0, 0);
    c->w = buffer(wmax, r, -0.05f, 0.05f), c->dw = buffer(wmax, r, 0, 0);
    c->b = buffer(N > 4 * C ? N : 4 * C, r, -0.1f, 0.1f), c->db = buffer(N > 4 * C ? N : 4 * C, r, 0, 0);
    c->mean = buffer(N, r, 0, 0), c->rstd = buffer(N, r, 0, 0);
    c->qkv = buffer(N * 3 * C, r, -1, 1), c->dqkv = buffer(N * 3 * C, r, 0, 0);
    c->lse = buffer((size_t)o->batch * c->NH * o->seq, r, 0, 0);
    c->scratch = buffer(pt_attention_scratch_floats(o->seq, c->slots), r, 0, 0);
    c->pe = buffer((size_t)o->seq * C, r, -0.05f, 0.05f), c->dpe = buffer((size_t)o->seq * C, r, 0, 0);
    c->dlse = (double *)malloc(N * sizeof(double));
    c->ids = (int *)malloc(N * sizeof(int));
    if (!c->dlse || !c->ids) return 2;
    for (i = 0; i < c->N; i++) c->ids[i] = (int)(pt_rng_u64(r) % V);
    return 0;
}

/* ---- the GEMM table: a row a shape of the model, a column a library -------- */

/* a GEMM as the model's kernels call it: layout of op(A) op(B), M x N x K */
typedef struct gemm_shape { char name[40]; int ta, tb, M, N, K; } gemm_shape;

/* the columns, fp32 then bf16; those run by pt_sgemm and pt_gemm_bf16 select
   their kernel (NULL: the default, auto unless PTRAIN_GEMM_BF16) */
enum { BLAS, PT, DNNL, TORCH, PT16, AMX, DNNL16, TORCH16, NCOL };
static const struct { const char *head, *kernel; int bf16, ptrain; } gemm_cols[NCOL] = {
    {"OpenBLAS fp32", "openblas", 0, 0}, {"ptrain fp32", "ptrain", 0, 1},
    {"oneDNN fp32", NULL, 0, 0}, {"torch fp32", NULL, 0, 0},
    {"ptrain bf16", NULL, 1, 1}, {"ptrain AMX", "amx", 1, 1},
    {"oneDNN bf16", NULL, 1, 0}, {"torch bf16", NULL, 1, 0}};

typedef struct gemm_table {
    gemm_shape g[15];
    int ng, on[NCOL]; /* on[j]: column j runs here */
    double peak[2];   /* the fp32 and bf16 instruction peaks on the run's threads */
    double gf[15][NCOL], pc[15][NCOL]; /* GFLOP/s and % of its precision's peak */
#ifdef PT_BENCH_DNNL
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    pt_rng pick; /* the elements checked */
#endif
} gemm_table;

/* the 15 GEMMs of c's model: forward, d(input), d(weight) of its four
   matmuls and of the tied head; returns how many */
static int gemm_shapes(gemm_shape g[15], const ctx *c) {
    static const int io[4][2] = {{1, 3}, {1, 1}, {1, 4}, {4, 1}};
    int ng = 0, k, l;
    for (k = 0; k < 5; k++)
        for (l = 0; l < 3; l++) { /* forward, d(input), d(weight) */
            int IN = k < 4 ? io[k][0] * c->C : c->C, OUT = k < 4 ? io[k][1] * c->C : c->V;
            const char *what = k == 4 ? "lm head" : k == 0 ? "c_attn" : k == 1 ? "attn.c_proj"
                                       : k == 2 ? "c_fc" : "mlp.c_proj";
            if (k < 4) { /* Conv1D: out = inp @ W, W [IN,OUT] */
                g[ng].ta = l == 2, g[ng].tb = l == 1;
                g[ng].M = l == 2 ? IN : c->N, g[ng].N = l == 1 ? IN : OUT;
                g[ng].K = l == 0 ? IN : l == 1 ? OUT : c->N;
            } else { /* tied head: logits = x @ wte^T, wte [V,C] */
                g[ng].ta = l == 2, g[ng].tb = l == 0;
                g[ng].M = l == 2 ? OUT : c->N, g[ng].N = l == 0 ? OUT : IN;
                g[ng].K = l == 0 ? IN : l == 1 ? OUT : c->N;
            }
            snprintf(g[ng].name, sizeof g[ng].name, "%s %s", what,
                     l == 0 ? "fwd" : l == 1 ? "dinp" : "dW");
            ng++;
        }
    return ng;
}

/* row k of the table: each column's GFLOP/s into t->gf[k] and t->pc[k]
   (torch.mm's from bench/torch_mm.py), printed; 2 if a column cannot run it */
static int gemm_row(gemm_table *t, int k, const ctx *c, const run_opts *o) {
    static const char *lay[4] = {"NN", "TN", "NT", "TT"};
    const gemm_shape *g = &t->g[k];
    gemm_args ga;
    double fl = 2.0 * g->M * g->N * (double)g->K;
    int j;
#ifdef PT_BENCH_DNNL
    uint16_t *a16 = (uint16_t *)malloc((size_t)g->M * g->K * sizeof(uint16_t));
    uint16_t *b16 = (uint16_t *)malloc((size_t)g->K * g->N * sizeof(uint16_t));
    int l, m;
#endif
    memset(&ga, 0, sizeof ga);
    ga.ta = g->ta, ga.tb = g->tb, ga.M = g->M, ga.N = g->N, ga.K = g->K;
    ga.A = c->x, ga.B = c->dy, ga.C = c->y;
#ifdef PT_BENCH_DNNL
    ga.stream = t->stream;
    if (!a16 || !b16 || !dnnl_bf16_matmul(&ga, t->engine, a16, b16, c->dx)) {
        fprintf(stderr, "error: oneDNN: no bf16 matmul for %s\n", g->name);
        return 2;
    }
#endif
    for (j = 0; j < NCOL; j++) { /* each column but torch's, one after another */
        if (!t->on[j] || j == TORCH || j == TORCH16) continue;
        ga.bf16 = gemm_cols[j].bf16, ga.dnnl = j == DNNL || j == DNNL16;
        if (!ga.dnnl && ga.bf16) pt_gemm_bf16_select(gemm_cols[j].kernel);
        else if (!ga.dnnl) pt_gemm_select(gemm_cols[j].kernel);
        t->gf[k][j] = fl / time_it(k_gemm, &ga, o->reps) / 1e9;
    }
    if (o->torch_pid) { /* then torch.mm's fp32 and bf16, in bench/torch_mm.py */
        char line[128];
        fprintf(o->torch_to, "%d %d %d %d %d %d %d\n", ga.ta, ga.tb, ga.M, ga.N, ga.K, o->reps,
                pt_get_threads());
        fflush(o->torch_to);
        if (!fgets(line, sizeof line, o->torch_from) ||
            sscanf(line, "%lf %lf", &t->gf[k][TORCH], &t->gf[k][TORCH16]) != 2) {
            fprintf(stderr, "error: --torch: bench/torch_mm.py gave no answer for %s\n", g->name);
            return 2;
        }
    }
#ifdef PT_BENCH_DNNL
    /* oneDNN's bf16 result (c->dx) against pt_gemm_bf16's (c->y, from the
       ptrain bf16 columns before it), at 5 sampled elements. Both sum the same
       K products of the same bf16 operands, each exact in fp32, with fp32
       additions in different orders: each sum is within g*sum|a_k b_k| of the
       exact one, g = K*u/(1 - K*u) (u = 2^-24, fp32's unit roundoff; no
       denormals at these values), so the two differ by at most 2*g*sum|a_k b_k| */
    for (m = 0; m < 5; m++) {
        int i0 = (int)(pt_rng_u64(&t->pick) % (uint64_t)ga.M);
        int j0 = (int)(pt_rng_u64(&t->pick) % (uint64_t)ga.N);
        double sab = 0.0, ku = ga.K * 0x1p-24;
        char what[96];
        for (l = 0; l < ga.K; l++)
            sab += fabs((double)pt_bf16_round(ga.A[ga.ta ? (size_t)l * ga.M + i0 : (size_t)i0 * ga.K + l]) *
                        pt_bf16_round(ga.B[ga.tb ? (size_t)j0 * ga.K + l : (size_t)l * ga.N + j0]));
        snprintf(what, sizeof what, "oneDNN bf16 %.39s [%d,%d] (diff / sum|ab|)", g->name, i0, j0);
        check(what, ((double)c->dx[(size_t)i0 * ga.N + j0] - c->y[(size_t)i0 * ga.N + j0]) / sab,
              0.0, 2.0 * ku / (1.0 - ku));
    }
    dnnl_primitive_destroy(ga.matmul);
    for (m = 0; m < 3; m++) dnnl_memory_destroy(ga.mem[m]);
    free(a16), free(b16);
#endif
    printf("  %-16s %-2s %5d %5d %5d |", g->name, lay[g->ta + 2 * g->tb], g->M, g->N, g->K);
    for (j = 0; j < NCOL; j++) {
        if (!t->on[j]) continue;
        t->pc[k][j] = t->peak[gemm_cols[j].bf16] > 0
                          ? 100 * t->gf[k][j] / t->peak[gemm_cols[j].bf16] : 0.0;
        printf("%s %6.0f (%3.0f%%)", j == PT16 ? " |" : "", t->gf[k][j], t->pc[k][j]);
    }
    printf("\n");
    return 0;
}

/* each column over the shapes; ptrain's speed over each other library's in
   its precision, shape by shape */
static void gemm_summary(const gemm_table *t) {
    double v[15], med;
    int j, k, m;
    printf("Over the %d GEMMs, %% of peak min / median; ptrain's GFLOP/s over another's, "
           "min / median:\n", t->ng);
    for (j = 0; j < NCOL; j++) {
        if (!t->on[j]) continue;
        for (k = 0; k < t->ng; k++) v[k] = t->pc[k][j];
        med = cli_median(v, t->ng); /* sorts v */
        printf("  %-13s %3.0f%% / %3.0f%%", gemm_cols[j].head, v[0], med);
        for (m = 0; m < NCOL; m++) {
            if (!gemm_cols[j].ptrain || !t->on[m] || gemm_cols[m].ptrain ||
                gemm_cols[m].bf16 != gemm_cols[j].bf16)
                continue;
            for (k = 0; k < t->ng; k++) v[k] = t->gf[k][j] / t->gf[k][m];
            med = cli_median(v, t->ng);
            printf("   vs %s %4.2fx / %4.2fx", gemm_cols[m].head, v[0], med);
        }
        printf("\n");
    }
}

/* the model's GEMMs at these shapes, as its kernels call them, in each library
   and precision: GFLOP/s by the wall clock on all the run's threads, and the
   share of the instruction peak of its precision (ipeak, as measure_machine
   gives it) on as many threads; 2 if a column cannot run */
static int bench_gemm(const ctx *c, const run_opts *o, const double ipeak[3]) {
    gemm_table t;
    int j, k;
    memset(&t, 0, sizeof t);
    /* the bf16 peak: AMX's where the CPU has it, else vdpbf16ps's; without
       either, bf16 GEMMs run as fp32 products at the fp32 peak */
    t.peak[0] = ipeak[0], t.peak[1] = ipeak[1] > 0 ? ipeak[1] : ipeak[2] > 0 ? ipeak[2] : ipeak[0];
#ifdef PT_BENCH_DNNL
    pt_rng_seed(&t.pick, 2);
    if (dnnl_engine_create(&t.engine, dnnl_cpu, 0) != dnnl_success ||
        dnnl_stream_create(&t.stream, t.engine, dnnl_stream_default_flags) != dnnl_success) {
        fprintf(stderr, "error: oneDNN: no CPU engine\n");
        return 2;
    }
    t.on[DNNL] = t.on[DNNL16] = 1;
#endif
    t.on[BLAS] = pt_gemm_select("openblas") == PT_OK, t.on[PT] = pt_gemm_select("ptrain") == PT_OK;
    t.on[PT16] = pt_gemm_bf16_select(NULL) == PT_OK, t.on[AMX] = pt_gemm_bf16_select("amx") == PT_OK;
    t.on[TORCH] = t.on[TORCH16] = o->torch_pid > 0;
    pt_gemm_bf16_select(NULL);
    t.ng = gemm_shapes(t.g, c);
    printf("GEMMs at %s shapes on %d threads, median of %d calls, every column in one run: "
           "GFLOP/s by the wall clock (%% of the\n%d-thread instruction peak of its precision: "
           "fp32 %.1f, bf16 %.1f GFLOP/s); ptrain bf16 is %s%s%s\n", o->config, pt_get_threads(),
           o->reps, pt_get_threads(), t.peak[0], t.peak[1], pt_gemm_bf16_name(),
           o->torch_pid ? "; torch.mm: " : "", o->torch_pid ? o->torch_version : "");
    printf("  %-16s %-2s %5s %5s %5s |", "GEMM", "", "M", "N", "K");
    for (j = 0; j < NCOL; j++)
        if (t.on[j]) printf("%s %13s", j == PT16 ? " |" : "", gemm_cols[j].head);
    printf("\n");
    for (k = 0; k < t.ng; k++)
        if (gemm_row(&t, k, c, o) != 0) return 2;
    gemm_summary(&t);
#ifdef PT_BENCH_DNNL
    dnnl_stream_destroy(t.stream);
    dnnl_engine_destroy(t.engine);
#endif
    pt_gemm_select(NULL);
    pt_gemm_bf16_select(NULL);
    return 0;
}

/* the model's small and skinny products: attention's 64-query blocks (hd = C
   / heads deep), a row of decoding, 32 rows (B*T < 64); in OpenBLAS and
   ptrain's kernels (fp32: the blocked kernel itself, where pt_sgemm sends a
   single row to OpenBLAS: pt_ctx.all_shapes), fp32 and bf16, on 1 thread and
   on the run's: what pt_sgemm's choice for small shapes rests on */
static void bench_small_gemm(const ctx *c, const run_opts *o) {
    int C = c->C, hd = c->C / c->NH, T = o->seq, nth = pt_get_threads(), k, t;
    struct { const char *name; int ta, tb, M, N, K; } sg[] = {
        {"attn scores QK^T", 0, 1, 64, T, hd}, {"attn P V", 0, 0, 64, hd, T},
        {"attn dK dS^T Q", 1, 0, T, hd, 64},   {"decode c_attn", 0, 0, 1, 3 * C, C},
        {"decode c_fc", 0, 0, 1, 4 * C, C},     {"decode mlp.c_proj", 0, 0, 1, C, 4 * C},
        {"decode lm head", 0, 1, 1, c->V, C},   {"32 rows c_fc", 0, 0, 32, 4 * C, C},
        {"32 rows lm head", 0, 1, 32, c->V, C}};
    printf("Small and skinny GEMMs at %s shapes, GFLOP/s (median of %d runs of ~1 ms): "
           "OpenBLAS fp32, ptrain's fp32 kernel, ptrain bf16\n", o->config, o->reps);
    printf("  %-18s %-2s %5s %5s %5s | %-34s | %s\n", "GEMM", "", "M", "N", "K", "1 thread",
           "all threads");
    for (k = 0; k < (int)(sizeof sg / sizeof sg[0]); k++) {
        gemm_args ga;
        gemm_run run;
        double fl = 2.0 * sg[k].M * sg[k].N * (double)sg[k].K;
        memset(&ga, 0, sizeof ga);
        ga.ta = sg[k].ta, ga.tb = sg[k].tb, ga.M = sg[k].M, ga.N = sg[k].N, ga.K = sg[k].K;
        ga.A = c->x, ga.B = c->dy, ga.C = c->y;
        run.g = &ga, run.n = (int)(2e8 / fl) + 1; /* ~1 ms at 200 GFLOP/s */
        printf("  %-18s %c%c %5d %5d %5d |", sg[k].name, ga.ta ? 'T' : 'N', ga.tb ? 'T' : 'N',
               ga.M, ga.N, ga.K);
        for (t = 0; t < 2; t++) {
            double r[3];
            int j;
            pt_set_threads(t ? nth : 1);
            for (j = 0; j < 3; j++) { /* OpenBLAS, ptrain's fp32 kernel, ptrain bf16 */
                r[j] = 0.0;
                ga.bf16 = j == 2, ga.kernel = j == 1;
                if (j < 2 && pt_gemm_select(j ? "ptrain" : "openblas") != PT_OK) continue;
                if (j == 2) pt_gemm_select(NULL), pt_gemm_bf16_select(NULL);
                r[j] = fl * run.n / time_it(k_gemm_run, &run, o->reps) / 1e9;
            }
            printf(" %6.1f %6.1f %6.1f %5.2fx%s", r[0], r[1], r[2], r[0] > 0 ? r[1] / r[0] : 0.0,
                   t ? "\n" : " |");
        }
    }
    printf("  (each group: OpenBLAS fp32, ptrain's fp32 kernel, ptrain bf16, ptrain fp32 / "
           "OpenBLAS)\n");
    pt_set_threads(nth);
    pt_gemm_select(NULL);
}

/* ---- GPT-2's kernels: each one's result check, then its time --------------- */

/* the kernels from the embedding to the cross-entropy on c's buffers, those
   whose name contains o->only; 2 if out of memory */
static int bench_gpt2(ctx *c, const run_opts *o, pt_rng *r) {
    const char *only = o->only;
    int reps = o->reps, batch = o->batch, seq = o->seq, i;
    size_t N = (size_t)c->N, C = (size_t)c->C, V = (size_t)c->V, n4 = N * 4 * C;
    if (RUN("embedding")) { /* reads a wte row and a wpe row, writes a row */
        k_encoder_f(c);
        check("embedding out[5,3]", c->y[5 * C + 3], (double)c->w[(size_t)c->ids[5] * C + 3] + c->pe[(5 % seq) * C + 3], 1e-6);
        report("embedding forward", time_it(k_encoder_f, c, reps), 0, 12.0 * N * C);
        report("embedding backward", time_it(k_encoder_b, c, reps), 0, 20.0 * N * C);
    }
    if (RUN("layernorm")) {
        double mu = 0, var = 0;
        for (i = 0; i < c->C; i++) c->w[i] = 1.0f, c->b[i] = 0.0f;
        k_ln_f(c);
        for (i = 0; i < c->C; i++) mu += c->y[7 * C + i];
        for (i = 0; i < c->C; i++) var += (c->y[7 * C + i] - mu / C) * (c->y[7 * C + i] - mu / C);
        check("layernorm row mean", mu / C, 0.0, 1e-5);
        check("layernorm row variance", var / C, 1.0, 1e-3);
        report("layernorm forward", time_it(k_ln_f, c, reps), 0, 8.0 * N * C);
        report("layernorm backward", time_it(k_ln_b, c, reps), 0, 16.0 * N * C);
    }
    {
        static const struct { const char *name; int in, out; } mms[] = {
            {"matmul c_attn (C->3C)", 1, 3}, {"matmul attn.c_proj (C->C)", 1, 1},
            {"matmul c_fc (C->4C)", 1, 4}, {"matmul mlp.c_proj (4C->C)", 4, 1}};
        int k;
        for (k = 0; k < 4; k++) {
            char name[64];
            if (!RUN(mms[k].name)) continue;
            c->IN = mms[k].in * c->C, c->OUT = mms[k].out * c->C;
            k_mm_f(c);
            check(mms[k].name, c->y[(size_t)3 * c->OUT + 5], dot_col(c->x, c->w, 3, c->IN, c->OUT, 5) + c->b[5], 1e-4);
            snprintf(name, sizeof name, "%s fwd", mms[k].name);
            report(name, time_it(k_mm_f, c, reps), 2.0 * N * c->IN * c->OUT, 0);
            snprintf(name, sizeof name, "%s bwd", mms[k].name);
            report(name, time_it(k_mm_b, c, reps), 4.0 * N * c->IN * c->OUT, 0);
        }
    }
    if (RUN("attention")) {
        float *ref = buffer(N * C, r, 0, 0), *att = (float *)malloc(sizeof(float) * batch * c->NH * (size_t)seq * seq);
        size_t j;
        double worst = 0;
        if (!att) return 2;
        k_att_f(c);
        pt_attention_ref_forward(ref, att, c->qkv, c->B, c->T, c->C, c->NH);
        for (j = 0; j < N * C; j++) worst = fmax(worst, fabs((double)ref[j] - c->y[j]));
        check("attention vs reference kernel (max abs)", worst, 0.0, 1e-5);
        free(ref), free(att);
        report("attention forward", time_it(k_att_f, c, reps), 4.0 * N * seq * C, 0);
        report("attention backward", time_it(k_att_b, c, reps), 8.0 * N * seq * C, 0);
    }
    if (RUN("gelu")) {
        c->n = n4;
        k_gelu_f(c);
        for (i = 0; i < 4; i++) {
            double x = c->x[i * 997], th = tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
            check("gelu", c->y[i * 997], 0.5 * x * (1.0 + th), 1e-5);
        }
        report("gelu forward", time_it(k_gelu_f, c, reps), 0, 8.0 * c->n);
        report("gelu backward", time_it(k_gelu_b, c, reps), 0, 12.0 * c->n);
    }
    if (RUN("residual")) {
        c->n = N * C;
        k_res_f(c);
        check("residual", c->y[11], (double)c->x[11] + c->w[11], 1e-6);
        report("residual forward", time_it(k_res_f, c, reps), 0, 12.0 * c->n);
        report("residual backward", time_it(k_res_b, c, reps), 0, 20.0 * c->n);
    }
    if (RUN("head")) {
        double want = 0;
        for (i = 0; i < c->C; i++) want += (double)c->x[2 * C + i] * c->w[7 * C + i];
        k_head_f(c);
        check("tied head logits[2,7]", c->y[2 * V + 7], want, 1e-4);
        report("tied head forward (matmul)", time_it(k_head_f, c, 3), 2.0 * N * C * V, 0);
        report("tied head backward (matmul)", time_it(k_head_b, c, 3), 4.0 * N * C * V, 0);
    }
    if (RUN("crossentropy")) {
        double mx = -1e30, sum = 0;
        size_t v;
        k_xent_f(c);
        for (v = 0; v < V; v++) mx = fmax(mx, c->x[4 * V + v]);
        for (v = 0; v < V; v++) sum += exp(c->x[4 * V + v] - mx);
        check("crossentropy loss[4]", c->b[4], mx + log(sum) - c->x[4 * V + c->ids[4]], 1e-5);
        report("softmax cross-entropy fwd", time_it(k_xent_f, c, reps), 0, 4.0 * N * V);
        report("softmax cross-entropy bwd", time_it(k_xent_b, c, reps), 0, 8.0 * N * V);
    }
    return 0;
}

/* AdamW over all cfg's parameters, in c's buffers (grown to params, grads,
   m, v); 2 if out of memory */
static int bench_adamw(ctx *c, const pt_gpt_config *cfg, int reps, pt_rng *r) {
    int64_t P = pt_gpt_num_params(cfg);
    double p0, g, m1, v1;
    int i;
    c->n = (size_t)P;
    free(c->x), free(c->dx); /* reuse memory: params, grads, m, v */
    c->x = NULL, c->dx = NULL;
    c->w = (float *)realloc(c->w, c->n * sizeof(float)), c->dw = (float *)realloc(c->dw, c->n * sizeof(float));
    c->m = buffer(c->n, r, -1e-3f, 1e-3f), c->v = buffer(c->n, r, 0, 1e-6f);
    if (!c->w || !c->dw) return 2;
    for (i = 0; i < 1000; i++) c->w[i] = 0.01f * (float)i, c->dw[i] = 1e-3f * (float)(i % 7);
    c->opt = pt_adamw_default();
    p0 = c->w[42], g = c->dw[42], m1 = 0.9 * c->m[42] + 0.1 * g, v1 = 0.95 * c->v[42] + 0.05 * g * g;
    k_adamw(c);
    check("adamw param[42]",
          c->w[42], p0 * (1 - 1e-4 * 0.1) - (1e-4 / (1 - pow(0.9, 10))) * m1 / (sqrt(v1) / sqrt(1 - pow(0.95, 10)) + 1e-8), 1e-5);
    report("AdamW update (all params)", time_it(k_adamw, c, reps), 0, 28.0 * c->n);
    return 0;
}

/* torch_mm.py ends at the end of its input: a failed check if not cleanly */
static void torch_end(const run_opts *o) {
    int status;
    fclose(o->torch_to), fclose(o->torch_from);
    if (waitpid(o->torch_pid, &status, 0) != o->torch_pid || !WIFEXITED(status) ||
        WEXITSTATUS(status)) {
        printf("CHECK FAILED bench/torch_mm.py did not end cleanly\n");
        failures++;
    }
}

int main(int argc, char **argv) {
    const char *config = "gpt2-124m", *only = NULL, *torch = NULL;
    int batch = 8, seq = 256, threads = 0, npos, s, reps = 5, vocab = 0;
    const char *pos[1];
    cli_opt opts[] = {
        {"config", CLI_STR, &config, "model preset whose shapes to use", 0, 0},
        {"batch", CLI_INT, &batch, "B", 1, 4096},
        {"seq", CLI_INT, &seq, "T", 1, 1 << 16},
        {"threads", CLI_INT, &threads, "OpenMP/BLAS threads (0: all cores)", 0, 1024},
        {"reps", CLI_INT, &reps, "timed calls per kernel (median)", 1, 16},
        {"only", CLI_STR, &only, "run only kernels whose name contains this (a,b: either)", 0, 0},
        {"vocab", CLI_INT, &vocab, "vocabulary size (0: the config's)", 0, 1 << 20},
        {"torch", CLI_STR, &torch, "python with torch: torch.mm columns (bench/torch_mm.py)", 0, 0},
    };
    int nopts = (int)(sizeof opts / sizeof opts[0]);
    pt_gpt_config cfg;
    pt_rng r;
    ctx c;
    run_opts o;
    double ipeak[3]; /* fp32 FMA, bf16 AMX, bf16 vdpbf16ps */

    cli_passive_wait(argv);
    if ((s = cli_parse(argc, argv, opts, nopts, pos, 0, &npos)) != 0) {
        cli_usage(s == 1 ? stdout : stderr, "usage: bench_kernels [options]", opts, nopts);
        return s == 1 ? 0 : 2;
    }
    if (pt_gpt_config_preset(config, &cfg) != PT_OK) {
        fprintf(stderr, "error: %s\n", pt_last_error());
        return 2;
    }
    if (vocab > 0) cfg.vocab_size = vocab;
    memset(&o, 0, sizeof o);
    o.config = config, o.only = only, o.batch = batch, o.seq = seq, o.reps = reps;
    if (torch && *torch) /* before anything is measured: it waits for shapes meanwhile */
        o.torch_pid = torch_start(torch, &o.torch_to, &o.torch_from, o.torch_version,
                                  (int)sizeof o.torch_version);
    pt_rng_seed(&r, 1);
    pt_set_threads(threads);
    if (pt_ctx_init(&g_pt, NULL) != PT_OK) { /* a workspace for the run's threads */
        fprintf(stderr, "error: %s\n", pt_last_error());
        return 2;
    }
    measure_machine(threads, ipeak);
    if (alloc_buffers(&c, &cfg, &o, &r) != 0) return 2;
    if (RUN("gemm") && bench_gemm(&c, &o, ipeak) != 0) return 2;
    if (RUN("small gemm")) bench_small_gemm(&c, &o);
    if (bench_gpt2(&c, &o, &r) != 0) return 2;
    bench_llama(&cfg, batch, seq, reps, only, &r);
    if (RUN("attention rate")) bench_attention_rate(&cfg, batch, seq, reps, &r);
    if (RUN("head rate") || RUN("head parts"))
        bench_head_rate(&cfg, batch, seq, reps, RUN("head parts"), &r);
    if (RUN("adamw") && bench_adamw(&c, &cfg, reps, &r) != 0) return 2;
    if (o.torch_pid) torch_end(&o);
    printf("%s\n", failures ? "SOME CHECKS FAILED: the timings above are not trustworthy" : "all result checks passed");
    pt_ctx_free(&g_pt);
    return failures ? 1 : 0;
}
