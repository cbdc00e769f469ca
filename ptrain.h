/* ptrain.h v0.1.0 -- train GPT transformers in plain C. MIT license (see end of file).

   ONE HEADER. In exactly one C or C++ file:

       #define PTRAIN_IMPLEMENTATION
       #include "ptrain.h"

   everywhere else just #include "ptrain.h". Link with OpenBLAS (-lopenblas, the
   OpenMP build fits best) and build with -fopenmp; -DPTRAIN_NO_BLAS uses a
   portable C matmul instead of cblas_sgemm. On CPUs with AVX-512 ptrain runs its
   own GEMM kernels (chosen at run time; PTRAIN_GEMM=openblas|ptrain|portable in
   the environment or pt_gemm_select picks one), and for bf16 Intel AMX tiles
   where the CPU has them (PTRAIN_GEMM_BF16=amx|avx512bf16|sgemm|portable or
   pt_gemm_bf16_select).

   QUICK START (examples/quickstart.c compiles this very text)

       pt_gpt_config cfg;
       pt_gpt_config_preset("tiny", &cfg);          // 2 layers, 64 wide, bytes
       pt_gpt gpt;
       pt_gpt_desc d = {0};
       d.config = cfg; d.batch = 4; d.seq = 64;
       if (pt_gpt_init(&gpt, &d) != PT_OK) { puts(pt_last_error()); return 1; }
       pt_gpt_init_weights(&gpt, 1337);
       pt_tokens tok = {0};
       pt_tokens_from_bytes(&tok, text, strlen(text)); // byte-level vocab (256)
       pt_loader loader = {0};
       pt_loader_desc ld = {0};
       ld.batch = 4; ld.seq = 64; ld.seed = 1;
       pt_loader_init(&loader, &tok, PT_SPLIT_ALL, &ld);
       pt_adamw_config opt = pt_adamw_default();
       static int inputs[4 * 64], targets[4 * 64];
       for (int step = 0; step < 100; step++) {
           pt_loader_next(&loader, inputs, targets);
           pt_gpt_forward(&gpt, inputs, targets, 4, 64);
           pt_gpt_backward(&gpt);
           pt_gpt_adamw_step(&gpt, &opt, 1e-3f);
           printf("step %d loss %.4f\n", step, gpt.loss);
       }

   CONFIGURATION MACROS (define before the implementation include)
       PTRAIN_STATIC         all functions static (private copy per file)
       PTRAIN_NO_BLAS        plain C sgemm instead of cblas_sgemm
       PTRAIN_MALLOC(sz,ctx) / PTRAIN_FREE(p,ctx)   allocator, ctx from *_desc
       PTRAIN_MPI            the MPI communicator backend (build with mpicc)
       PTRAIN_TEST_HOOKS     fault injection for ptrain's own tests (never in a release
                             build): PTRAIN_TEST_WRITE_DELAY_MS slows checkpoint writes

   SECTIONS (search for the marker)
       >>basics     status codes, last error, RNG, threads and cores, timing
       >>tensors    tensor views, arena, meta arena
       >>kernels    the execution context (pt_ctx), GEMMs (fp32, bf16), forward/backward
                    pairs (LayerNorm, RMSNorm, RoPE, GELU, SwiGLU, grouped-query attention
                    and its ring form for context parallelism, the head fused with the
                    loss, ...), AdamW, clipping, LR schedule
       >>comm       communicators (self, threads, MPI), started (non-blocking) operations,
                    a deadline on every wait, the tp x dp x pp grid (and its cp groups)
       >>model      GPT-2 / LLaMA config, tensor table, the block (its tp all-reduces, or
                    sequence parallelism's all-gathers and reduce-scatters, context
                    parallelism's ring of key/value blocks, on >>comm),
                    generation (a KV cache, and paged KV blocks shared by sequences).
                    pt_gpt_init/pt_gpt_free are declared here and defined in >>exec:
                    building a model lays out the executor's state.
                    One call reaches forward, to >>exec: pt__ag_settle before reading
                    weights that ZeRO's overlapped parameter gathers may still write
       >>schedule   pipeline schedules as data, their checker, text grid, timelines
       >>exec       the executor's state (pt_gpt_exec: buckets and started collectives,
                    schedule slots and buffers, weight versions), building it
                    (pt_gpt_init) and the one query of its layout (pt__exec_layout_of)
                    that the memory report, >>sim and >>io read; one training step
                    (pt_gpt_step) for every layout, evaluation, the serial
                    forward/backward, gradients, AdamW
       >>sim        hardware profiles, cost model, simulated steps, strategy search
       >>text       byte-level BPE tokenizers (GPT-2 files, tokenizer.json), text <-> ids,
                    the pre-tokenizer's pieces, token files from text, BPE training
       >>io         a file read whole, safetensors, token data, loaders, checkpoints,
                    line charts (SVG)
       Each section uses only earlier ones, but for two seams: >>model's call to
       >>exec above, and >>text's files: it reads text and writes tokenizers and
       token files through >>io (pt_file_read, pt__write_atomic, pt_tokens_*),
       which come last with the other file formats.

   ALLOCATION. ptrain allocates through PTRAIN_MALLOC/PTRAIN_FREE only.
   Objects filled by an init function (pt_tokens, pt_loader, pt_safetensors,
   pt_st_writer) take their allocator context from their own alloc_ctx
   field: zero-initialise them (= {0}) or set alloc_ctx first. pt_gpt and
   pt_ctx take it from their desc. Nothing allocates inside forward, backward
   or the optimizer step: pt_gpt_init allocates all of a model's memory, the
   GEMM workspace of its execution context (pt_gpt.ctx) included, and from
   the first call on pt_gpt_step, pt_gpt_forward, pt_gpt_backward,
   pt_gpt_eval and pt_gpt_adamw_step allocate nothing, nor do the
   communicators' collectives (tests/test_main.c counts every allocation:
   fp32 and bf16, one rank and tp x dp thread ranks with ZeRO 1). No kernel
   allocates: programs that call them give them a pt_ctx from pt_ctx_init
   (the probes pt_gemm_peak_gflops and pt_mem_bandwidth_gbs allocate their
   operands). The exceptions: a step's optional outputs (pt_step_desc.trace grows;
   logits gathered over tp go through a buffer of their own), and a
   pipeline stage's point-to-point messages (the threads backend's spare
   buffers of each inbox, the MPI backend's send slots), which take a free
   buffer that fits and allocate one when none does: in a pipeline's first
   steps, and later only when more messages are in flight at once than
   before.

   ERRORS. Functions that can fail return pt_status; pt_last_error() gives a
   message for the calling thread naming the field, value and constraint.
   Library code never exits or aborts on user input. Kernels trust their
   arguments (shapes are checked where user data enters: configs, files,
   token ids).

   THREADS. Kernels use OpenMP inside; call them from one thread per model
   (per pt_ctx: a context serves one call at a time). pt_set_threads(n) sets
   both OpenMP's and OpenBLAS's thread count; a GEMM runs on at most the
   threads its context's workspace was made for (a model's: pt_get_threads()
   at pt_gpt_init). Results are bit-for-bit reproducible for a fixed thread
   count. Nothing is kept per thread but the last error message: the GEMMs'
   precision, workspace and communication poller travel in the pt_ctx each
   call passes down (desc.precision -> pt_gpt.ctx -> pt_block_forward ->
   pt_matmul_forward -> pt_gemm_bf16 or pt_sgemm). The threads
   communicator (pt_comm_threads_run) runs one model per rank thread, each
   with cores/ranks OpenMP threads; it needs pthreads (-fopenmp brings them).

   PARALLEL MODELS. Give pt_gpt_desc a pt_grid (pt_grid_init over a world
   communicator) and every model call becomes collective over the ranks:
   tensor parallelism splits heads, MLP columns and the vocabulary (padded to
   a multiple of tp; sequence_parallel runs the rest of the block on 1/tp of
   the tokens), data parallelism averages gradients or shards the AdamW
   state (zero=1), gradients (zero=2) and parameters (zero=3: each bucket
   gathered before its forward and again before its backward, the next one
   behind this one's compute), pipeline stages hold runs of layers, and
   context parallelism (pt_grid_init_cp, context_parallel) gives each cp
   rank two chunks of every sequence, its attention a ring of key/value
   blocks (gradients averaged over dp x cp).
   One call trains a step in any layout: pt_gpt_step runs this rank's part of
   the step's schedule (one stage without a pipeline, where micro-batches are
   gradient accumulation), syncs the gradients (each bucket started as
   backward finishes it: pt_step_desc.overlap) and steps AdamW (ZeRO: each
   bucket's parameter gather runs on behind the next forward; pipelines post
   their receives ahead). The simulator (>>sim) models the same overlap, and
   traces draw the dp transfers in a lane under each rank. Checkpoints,
   pt_gpt_gather and weight loading always use the whole Hugging Face layout.
*/
#ifndef PTRAIN_H
#define PTRAIN_H

#include <stddef.h>
#include <stdint.h>

#define PTRAIN_VERSION "0.1.0"

#ifndef PTRAINDEF
#ifdef PTRAIN_STATIC
#if defined(__GNUC__) || defined(__clang__)
#define PTRAINDEF static __attribute__((unused))
#else
#define PTRAINDEF static
#endif
#else
#define PTRAINDEF extern
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================== */
/* >>basics                                                                  */
/* ======================================================================== */

/* One list gives every status code and its description. */
#define PT_STATUS_LIST(X)                                                     \
    X(PT_OK, "ok")                                                            \
    X(PT_ERR_INVALID_ARG, "invalid argument")                                 \
    X(PT_ERR_CONFIG, "invalid configuration")                                 \
    X(PT_ERR_OOM, "out of memory")                                            \
    X(PT_ERR_IO, "file input/output error")                                   \
    X(PT_ERR_FORMAT, "malformed file")                                        \
    X(PT_ERR_DTYPE, "unsupported or unknown dtype")                           \
    X(PT_ERR_SHAPE, "shape mismatch")                                         \
    X(PT_ERR_MISSING, "missing tensor or key")                                \
    X(PT_ERR_RANGE, "value out of range")                                     \
    X(PT_ERR_UNSUPPORTED, "unsupported feature")                              \
    X(PT_ERR_COMM, "communication failed or another rank failed")

typedef enum pt_status {
#define PT__STATUS_ENUM(name, desc) name,
    PT_STATUS_LIST(PT__STATUS_ENUM)
#undef PT__STATUS_ENUM
    PT_STATUS_COUNT
} pt_status;

PTRAINDEF const char *pt_status_str(pt_status s);  /* "PT_ERR_FORMAT: malformed file" */
PTRAINDEF const char *pt_status_name(pt_status s); /* "PT_ERR_FORMAT" */
PTRAINDEF const char *pt_last_error(void);         /* message of this thread's last failure */
PTRAINDEF void pt_clear_error(void);
/* Sets this thread's last error (printf-style) and returns code, so a
   program reports its own failures as the library does:
   return pt_error(PT_ERR_IO, "%s: no step in its metadata", path); */
PTRAINDEF pt_status pt_error(pt_status code, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Deterministic RNG (splitmix64): the whole state is one uint64, so it can be
   saved in a checkpoint and restored exactly. */
typedef struct pt_rng { uint64_t state; } pt_rng;
PTRAINDEF void pt_rng_seed(pt_rng *r, uint64_t seed);
PTRAINDEF uint64_t pt_rng_u64(pt_rng *r);
PTRAINDEF float pt_rng_uniform(pt_rng *r);                 /* [0, 1) */
PTRAINDEF float pt_rng_normal(pt_rng *r, float mean, float std);

PTRAINDEF void pt_set_threads(int n); /* OpenMP and OpenBLAS threads; n <= 0: all cores */
PTRAINDEF int pt_get_threads(void);
/* The cores this process may run on: pt_set_threads(0)'s count; thread
   ranks (pt_comm_threads_run) share them, max(1, cores / ranks) each. */
PTRAINDEF int pt_num_cores(void);
PTRAINDEF double pt_time_now(void);   /* seconds, for intervals */

/* ======================================================================== */
/* >>tensors                                                                 */
/* ======================================================================== */

#define PT_MAX_DIMS 8

typedef enum pt_dtype {
    PT_DTYPE_NONE = 0,
    PT_F32, PT_F16, PT_BF16, PT_F64, PT_I32, PT_I64, PT_I16, PT_I8, PT_U8,
    PT_U16, PT_U32, PT_U64, PT_BOOL,
    PT_DTYPE_COUNT
} pt_dtype;

PTRAINDEF size_t pt_dtype_size(pt_dtype t);
PTRAINDEF const char *pt_dtype_name(pt_dtype t); /* safetensors spelling: "F32" */

/* A tensor is a non-owning view: row-major, contiguous. */
typedef struct pt_tensor {
    void *data;
    pt_dtype dtype;
    int ndim;
    int64_t shape[PT_MAX_DIMS];
} pt_tensor;

PTRAINDEF int64_t pt_tensor_numel(const pt_tensor *t);

/* An arena hands out 64-byte aligned blocks from one allocation. A meta arena
   allocates nothing and only counts bytes (its blocks are NULL), so the same
   code that builds a model can first measure it. */
typedef struct pt_arena {
    unsigned char *raw, *base;
    size_t capacity, used;
    int meta;
    void *alloc_ctx;
} pt_arena;

PTRAINDEF pt_status pt_arena_init(pt_arena *a, size_t capacity, void *alloc_ctx);
PTRAINDEF void pt_arena_init_meta(pt_arena *a);
PTRAINDEF void *pt_arena_alloc(pt_arena *a, size_t bytes); /* NULL on meta or overflow */
PTRAINDEF pt_status pt_arena_tensor(pt_arena *a, pt_tensor *out, pt_dtype dtype,
                                    int ndim, const int64_t *shape);
PTRAINDEF void pt_arena_free(pt_arena *a);

/* ======================================================================== */
/* >>kernels                                                                 */
/* ======================================================================== */
/* Shapes in comments: N = B*T rows, C channels, NH heads, hd = C/NH.
   Backward kernels ACCUMULATE (+=) into every gradient they write, except
   where noted; callers zero gradients first. */

/* The arithmetic of the model's GEMMs (dense layers, attention, the LM head):
   fp32 (pt_sgemm), or bf16 mixed precision (pt_gemm_bf16: operands rounded to
   bfloat16, products summed in fp32). Everything else stays fp32 either way:
   master weights, gradients and their reductions, AdamW, the norms' and
   softmax's statistics, the loss. Zero is the default, fp32. */
typedef enum pt_precision { PT_PRECISION_DEFAULT = 0, PT_PRECISION_FP32, PT_PRECISION_BF16 } pt_precision;
PTRAINDEF const char *pt_precision_name(pt_precision p); /* "fp32", "bf16" */
PTRAINDEF pt_status pt_precision_parse(const char *name, pt_precision *out);
/* The execution context the GEMM-running kernels take as their first argument
   (pt_sgemm, pt_gemm_bf16, pt_matmul_*, pt_linear_*, the fast
   pt_attention_* pair, pt_tied_head_*, pt_block_*, pt_gemm_peak_gflops):
   the precision of the kernels' GEMMs, the GEMMs' packing workspace and a
   poller for communication under way. pt_ctx_init allocates the workspace
   (through PTRAIN_MALLOC, desc->alloc_ctx) once, for at most `threads`
   threads: a GEMM runs on no more threads than that, and no call
   allocates. A pt_gpt owns one (pt_gpt.ctx, from pt_gpt_desc) and passes
   it down to its kernels; programs that call kernels directly make their
   own. NULL, or a zeroed pt_ctx, is fp32 with no workspace: ptrain's own
   GEMM kernels need one, so pt_sgemm runs OpenBLAS (the portable loops in
   -DPTRAIN_NO_BLAS builds) and pt_gemm_bf16 the portable loops. One thread
   runs calls on a context at a time (its kernels' OpenMP threads aside). */
typedef struct pt_poller {
    void (*fn)(void *arg); /* NULL: none */
    void *arg;
    double next;  /* pt_time_now() before which fn is not called again */
    double slice; /* FLOP of a run of rows pt_sgemm computes between polls (0: whole GEMMs) */
} pt_poller;

typedef struct pt_ctx_desc {
    pt_precision precision; /* the kernels' GEMMs (0: fp32) */
    int threads;            /* the most OpenMP threads its GEMMs run on (0: pt_get_threads()) */
    void *alloc_ctx;        /* passed to PTRAIN_MALLOC/PTRAIN_FREE */
} pt_ctx_desc;

typedef struct pt_ctx {
    pt_precision precision; /* the kernels' GEMMs: fp32 (pt_sgemm) or bf16 (pt_gemm_bf16) */
    int threads;            /* a GEMM's most threads (the workspace's slots) */
    int all_shapes;         /* 1: pt_sgemm runs the selected GEMM on every shape (ptrain's
                               kernel takes single rows too, which it otherwise leaves to
                               OpenBLAS): for benchmarks of the kernel itself */
    unsigned char *ws;      /* the workspace: `threads` slots of ws_slot bytes, 64-byte
                               aligned (NULL: none) */
    size_t ws_slot;
    pt_poller poll;         /* called at most every 2 ms from the GEMMs of the thread that
                               runs the call (a pt_gpt sets it for a step's duration) */
    void *raw, *alloc_ctx;
} pt_ctx;

PTRAINDEF pt_status pt_ctx_init(pt_ctx *c, const pt_ctx_desc *desc);
PTRAINDEF void pt_ctx_free(pt_ctx *c);
/* Bytes of the workspace pt_ctx_init allocates for `threads` threads (a
   bound on what the blocked kernels pack: MC x KC of A and KC x NC of B a
   thread, about 6.7 MiB). */
PTRAINDEF size_t pt_ctx_workspace_bytes(int threads);

/* C[M,N] = alpha * op(A) @ op(B) + beta * C, row-major, cblas semantics
   (beta = 0: C is not read). Runs the GEMM pt_gemm_select chose (ptrain's
   kernels only with ctx's workspace). With ctx->poll.slice set, C is
   computed in runs of rows of about that many FLOP (at least 64 rows) with
   a poll between them; the runs depend on the shape alone. */
PTRAINDEF void pt_sgemm(pt_ctx *ctx, int trans_a, int trans_b, int M, int N, int K,
                        float alpha, const float *A, int lda, const float *B, int ldb,
                        float beta, float *C, int ldc);
/* The same product with op(A) and op(B) rounded to bfloat16 (round to nearest
   even; alpha multiplies A before rounding) and the products summed in fp32
   (denormal inputs and sums flush to zero in the AMX and AVX512-BF16 kernels):
   the kernel pt_gemm_bf16_select chose. Every element of C is summed by one
   thread in K order: results do not depend on the thread count. */
PTRAINDEF void pt_gemm_bf16(pt_ctx *ctx, int trans_a, int trans_b, int M, int N, int K,
                            float alpha, const float *A, int lda, const float *B, int ldb,
                            float beta, float *C, int ldc);
/* Which fp32 GEMM pt_sgemm runs, by name: "ptrain" (ptrain's AVX-512 kernels:
   packing and cache blocking in the BLIS manner, OpenMP over blocks; needs a
   CPU with AVX-512F; a single row goes to openblas where there is one),
   "openblas" (cblas_sgemm; not in -DPTRAIN_NO_BLAS
   builds), "portable" (plain C loops), "auto" (ptrain where the CPU runs
   AVX-512 at full width and OpenBLAS runs its AVX2 kernel, else openblas:
   AMD Zen 3/4 split a 512-bit FMA in two, and OpenBLAS's own AVX-512 kernels
   (Intel, OPENBLAS_CORETYPE unset) are as fast as ptrain's; without BLAS,
   ptrain on any AVX-512F CPU, else portable). NULL or "" takes the name from the
   environment variable PTRAIN_GEMM (unset: auto). Until the first call, the
   first GEMM does the same, ignoring an unknown name. Not thread-safe against
   GEMMs running at the time. "portable" also makes pt_gemm_bf16 portable
   while pt_gemm_bf16_select is at auto. */
PTRAINDEF pt_status pt_gemm_select(const char *name);
PTRAINDEF const char *pt_gemm_name(void); /* "ptrain-avx512", "openblas", "portable" */
/* Which kernel pt_gemm_bf16 runs, by name: "amx" (Intel AMX TDPBF16PS tiles;
   needs AMX-BF16 and AMX-TILE, enabled by the OS, and AVX512-BF16), "avx512bf16"
   (vdpbf16ps kernels; needs AVX512-BF16), "sgemm" (the fp32 GEMM on operands
   rounded to bf16: a product of two bf16 values is exact in fp32, so the
   same arithmetic at the fp32 GEMM's rate, for CPUs without a bf16
   instruction; ptrain's fp32 kernel rounds as it packs, OpenBLAS gets blocks
   rounded into ctx's workspace), "portable" (plain C loops), "auto" (the first
   of those the CPU has, checked at each call; portable while pt_gemm_select's
   GEMM is portable). NULL or "" takes the name from the
   environment variable PTRAIN_GEMM_BF16 (unset: auto). An unknown name is
   PT_ERR_INVALID_ARG, a kernel the CPU lacks PT_ERR_UNSUPPORTED naming the
   feature. Until the first call, the first bf16 GEMM does the same, ignoring
   a name it cannot use. Not thread-safe against GEMMs running at the time. */
PTRAINDEF pt_status pt_gemm_bf16_select(const char *name);
/* "ptrain-amx", "ptrain-avx512bf16", "sgemm" or "portable" */
PTRAINDEF const char *pt_gemm_bf16_name(void);
/* bfloat16 as the bf16 GEMMs round: the upper 16 bits of the float rounded
   to nearest even (a NaN stays a quiet NaN); pt_bf16_round gives that value
   back as a float, pt_bf16_to_float widens bits. */
PTRAINDEF uint16_t pt_bf16_from_float(float x);
PTRAINDEF float pt_bf16_to_float(uint16_t bits);
PTRAINDEF float pt_bf16_round(float x);

/* out[n,c] = wte[inp[n],c] + wpe[n % T, c] */
PTRAINDEF void pt_encoder_forward(float *out, const int *inp, const float *wte,
                                  const float *wpe, int B, int T, int C);
PTRAINDEF void pt_encoder_backward(float *dwte, float *dwpe, const float *dout,
                                   const int *inp, int B, int T, int C);

/* y = (x - mean) * rstd * w + b, mean and biased var over C, rstd = 1/sqrt(var+eps)
   (bias, and backward's dbias, may be NULL: none) */
PTRAINDEF void pt_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                    const float *weight, const float *bias, int N, int C,
                                    float eps);
PTRAINDEF void pt_layernorm_backward(float *dinp, float *dweight, float *dbias,
                                     const float *dout, const float *inp, const float *weight,
                                     const float *mean, const float *rstd, int N, int C);

/* The GEMM kernels below (dense layers, attention, the LM head) run their
   products at ctx's precision (NULL: fp32). */
/* Conv1D layout: out[N,OUT] = inp[N,IN] @ w[IN,OUT] + bias[OUT] (bias may be NULL) */
PTRAINDEF void pt_matmul_forward(pt_ctx *ctx, float *out, const float *inp, const float *weight,
                                 const float *bias, int N, int IN, int OUT);
PTRAINDEF void pt_matmul_backward(pt_ctx *ctx, float *dinp, float *dweight, float *dbias,
                                  const float *dout, const float *inp, const float *weight,
                                  int N, int IN, int OUT);

/* nn.Linear layout: out[N,OUT] = inp[N,IN] @ w[OUT,IN]^T + bias[OUT] (bias may be NULL) */
PTRAINDEF void pt_linear_forward(pt_ctx *ctx, float *out, const float *inp, const float *weight,
                                 const float *bias, int N, int IN, int OUT);
/* dinp += dout @ W ; dW += dout^T @ inp ; dbias += sum_n dout (each may be NULL) */
PTRAINDEF void pt_linear_backward(pt_ctx *ctx, float *dinp, float *dweight, float *dbias,
                                  const float *dout, const float *inp, const float *weight,
                                  int N, int IN, int OUT);

/* RMSNorm: y = x * rstd * w, rstd = 1/sqrt(mean_c(x^2) + eps) */
PTRAINDEF void pt_rmsnorm_forward(float *out, float *rstd, const float *inp,
                                  const float *weight, int N, int C, float eps);
/* With g = dout*w: dx += rstd * (g - x * rstd^2 * mean_c(g*x)); dw += dout*x*rstd
   (dinp or dweight may be NULL). */
PTRAINDEF void pt_rmsnorm_backward(float *dinp, float *dweight, const float *dout,
                                   const float *inp, const float *weight, const float *rstd,
                                   int N, int C);

/* Rotary position embedding as Hugging Face's LlamaForCausalLM (rotate_half).
   Frequencies f_j = theta^(-2j/hd), j < hd/2; with LLaMA 3's scaling
   (factor > 0; lo, hi its low/high_freq_factor, ctx its original context)
   and wavelength w = 2pi/f: w > ctx/lo gives f/factor, w < ctx/hi keeps f,
   between them (1-s) f/factor + s f with s = (ctx/w - lo)/(hi - lo).
   Table cs (T*hd floats): cs[t*hd+j] = cos(t f_j), cs[t*hd+hd/2+j] = sin(t f_j),
   computed in double. */
typedef struct pt_rope_scaling {
    float factor;        /* 0: no scaling */
    float low_freq_factor, high_freq_factor;
    int original_max_pos;
} pt_rope_scaling;
PTRAINDEF void pt_rope_table(float *cs, int T, int hd, float theta, const pt_rope_scaling *sc);
/* In place on the first nh heads (hd lanes each) of every row n of x (row at
   x + n*stride, position n % T), for j < hd/2 with c, s of that position:
   (x_j, x_{j+hd/2}) <- (x_j c - x_{j+hd/2} s, x_{j+hd/2} c + x_j s). */
PTRAINDEF void pt_rope_forward(float *x, const float *cs, int N, int T, int nh, int hd,
                               int stride);
/* The rotation's transpose, in place on the gradient:
   (d_j, d_{j+hd/2}) <- (d_j c + d_{j+hd/2} s, d_{j+hd/2} c - d_j s). */
PTRAINDEF void pt_rope_backward(float *dx, const float *cs, int N, int T, int nh, int hd,
                                int stride);

/* SwiGLU on h (N, 2F), each row [gate | up]: out[n,j] = silu(g) * u with
   g = h[n,j], u = h[n,F+j], silu(g) = g sigmoid(g).
   backward: dh[n,j] = dout u s (1 + g (1-s)), dh[n,F+j] = dout silu(g),
   s = sigmoid(g); written (not accumulated). */
PTRAINDEF void pt_swiglu_forward(float *out, const float *h, int N, int F);
PTRAINDEF void pt_swiglu_backward(float *dh, const float *h, const float *dout, int N, int F);

/* Causal multi-head attention on qkv[N,3C] laid out [q|k|v][head][hd]:
   p[b,h,t,u] = softmax_{u<=t}(q_t . k_u / sqrt(hd)) (0 for u > t),
   out[b,t,h*hd+i] = sum_u p[b,h,t,u] v_u[i].
   The fast pair works on blocks of PT_ATTN_QBLOCK queries with GEMMs and never
   stores p: forward keeps lse[b,h,t] = log sum_u exp(score), and backward
   recomputes p from it, so saved memory is linear in T. Each of `slots`
   threads needs scratch of 2*PT_ATTN_QBLOCK*T floats
   (pt_attention_scratch_floats); backward also reads the forward's out.
   It runs on at most min(slots, ctx->threads) threads, each block's GEMMs
   in that thread's slot of ctx's workspace. Where ptrain's AVX-512 GEMM
   kernels are selected (fp32, or bf16's avx512bf16/amx) it runs fused
   instead (FlashAttention-2 on the GEMM micro-kernels, a task a (b, key/value
   head), packed K/V in the thread's workspace slot, the scratch unread):
   other sums, as deterministic.
   Grouped-query attention: with NKV < NH key/value heads (NKV divides NH),
   qkv is [N, C + 2*NKV*hd] laid out [q (NH heads)|k (NKV)|v (NKV)], C = NH*hd,
   and query head h uses key/value head h / (NH/NKV); NKV = NH is the above. */
#define PT_ATTN_QBLOCK 64
PTRAINDEF size_t pt_attention_scratch_floats(int T, int slots);
PTRAINDEF void pt_attention_forward(pt_ctx *ctx, float *out, float *lse, const float *qkv,
                                    float *scratch, int slots, int B, int T, int C, int NH,
                                    int NKV);
PTRAINDEF void pt_attention_backward(pt_ctx *ctx, float *dqkv, const float *dout,
                                     const float *out, const float *qkv, const float *lse,
                                     float *scratch, int slots, int B, int T, int C, int NH,
                                     int NKV);
/* Ring attention (context parallelism): one rank's Tq queries of each of B
   sequences, at increasing global positions qpos, against a block of Tk
   keys/values, at increasing global positions kpos, held by this rank or
   sent round the ring by another. A query at position p sees the keys at
   positions <= p (a key block wholly before the queries is unmasked, one
   wholly after them contributes nothing). qkv is the rank's [B, Tq, C3] as
   above (queries read from it); kv is [B, Tk, ld], key row u at kv + u*ld
   and its value at kv + u*ld + NKV*hd (the rank's own block: kv = qkv + C,
   ld = C3). qpos = kpos = NULL means positions 0..T-1 with Tq = Tk = T:
   pt_attention_forward/backward are this case. */
typedef struct pt_attn_ring {
    const int *qpos, *kpos; /* [Tq], [Tk], increasing */
    int Tq, Tk;
    const float *kv;
    int ld;
} pt_attn_ring;
/* The block's partial result: out [B, Tq, C] and lse [B, NH, Tq] of the
   softmax over this block's visible keys alone (a query seeing none: 0 and
   -inf). Scratch: pt_attention_scratch_floats(Tk, slots). */
PTRAINDEF void pt_attention_ring_forward(pt_ctx *ctx, float *out, float *lse, const float *qkv,
                                         const pt_attn_ring *r, float *scratch, int slots, int B,
                                         int C, int NH, int NKV);
/* Merges a block's partial (out_i, lse_i) into the running (out, lse), both
   laid out as pt_attention_ring_forward's (the FlashAttention-2 merge):
   lse' = log(e^lse + e^lse_i), out' = e^(lse - lse') out + e^(lse_i - lse') out_i.
   Start from a first block's partial (or out = 0, lse = -inf). */
PTRAINDEF void pt_attention_merge(float *out, float *lse, const float *out_i, const float *lse_i,
                                  int B, int T, int C, int NH);
/* Backward of one block given the final out and lse (of every block merged):
   p = exp(s - lse) is the block's share of the whole softmax, so the blocks'
   contributions sum to the whole gradient. Accumulates dq into dqkv's q
   columns ([B, Tq, C3]) and dk, dv into dkv ([B, Tk, r->ld], laid out as
   r->kv: the remote block's gradient, to be sent back round the ring). */
PTRAINDEF void pt_attention_ring_backward(pt_ctx *ctx, float *dqkv, float *dkv,
                                          const float *dout, const float *out, const float *qkv,
                                          const float *lse, const pt_attn_ring *r,
                                          float *scratch, int slots, int B, int C, int NH,
                                          int NKV);
/* Plain reference pair (what the fast one is tested against): stores the
   probabilities att (B,NH,T,T); backward needs scratch of B*NH*T floats. */
PTRAINDEF void pt_attention_ref_forward(float *out, float *att, const float *qkv, int B, int T,
                                        int C, int NH);
PTRAINDEF void pt_attention_ref_backward(float *dqkv, float *scratch, const float *dout,
                                         const float *qkv, const float *att, int B, int T,
                                         int C, int NH);

/* gelu(u) = 0.5 u (1 + tanh(sqrt(2/pi) (u + 0.044715 u^3)))
   (computed as u * sigmoid(2y), the same function without cancellation) */
PTRAINDEF void pt_gelu_forward(float *out, const float *inp, size_t n);
/* dinp = gelu'(inp) * dout, written (not accumulated); dinp may alias dout. */
PTRAINDEF void pt_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);

/* out = a + b (out may alias a or b) */
PTRAINDEF void pt_residual_forward(float *out, const float *a, const float *b, size_t n);
PTRAINDEF void pt_residual_backward(float *da, float *db, const float *dout, size_t n);

/* Tied LM head: logits[N,V] = x[N,C] @ wte[V,C]^T (no bias). */
PTRAINDEF void pt_tied_head_forward(pt_ctx *ctx, float *logits, const float *x, const float *wte,
                                    int N, int C, int V);
PTRAINDEF void pt_tied_head_backward(pt_ctx *ctx, float *dx, float *dwte, const float *dlogits,
                                     const float *x, const float *wte, int N, int C, int V);

/* lse[n] = logsumexp(logits[n,:]) (double: exact enough at any logit scale);
   losses[n] = lse[n] - logits[n, targets[n]]
   backward: dlogits[n,v] = dloss * (exp(logits[n,v] - lse[n]) - [v == targets[n]]),
   written (not accumulated); dlogits may alias logits. */
PTRAINDEF void pt_crossentropy_forward(float *losses, double *lse, const float *logits,
                                       const int *targets, int N, int V);
PTRAINDEF void pt_crossentropy_backward(float *dlogits, const float *logits, const double *lse,
                                        const int *targets, int N, int V, float dloss);

/* The head and the loss fused, forward and backward, by blocks of `rows`
   rows (0: 256): the logits never exist whole. For each block: its logits
   (N's rows r0..r1 of x @ wte^T, at ctx's precision) into work (rows*V
   floats), losses and lse as pt_crossentropy_forward, the logits made
   dlogits in place as pt_crossentropy_backward with dloss, then
   dx += dlogits @ wte and dwte += dlogits^T @ x (each may be NULL: the
   loss alone). losses, lse and dx come out as the unfused kernels give
   them; dwte sums its rows' products a block at a time, so its bits may
   differ from one N-row product. Vocabulary-parallel heads (each rank a
   part of V) need the lse's all-reduce between the two halves: the
   executor runs those blocks itself. */
PTRAINDEF void pt_head_xent_fused(pt_ctx *ctx, float *losses, double *lse, float *dx, float *dwte,
                                  const float *x, const float *wte, const int *targets, int N,
                                  int C, int V, float dloss, float *work, int rows);

/* AdamW with torch.optim.AdamW semantics, for step t >= 1:
     if decay: p *= 1 - lr*wd               (decoupled, before the update)
     m = b1 m + (1-b1) g ;  v = b2 v + (1-b2) g^2
     p -= (lr/bc1) m / (sqrt(v)/sqrt(bc2) + eps),  bc_i = 1 - b_i^t (double) */
typedef struct pt_adamw_config {
    float beta1, beta2, eps, weight_decay;
} pt_adamw_config;
PTRAINDEF pt_adamw_config pt_adamw_default(void); /* 0.9, 0.95, 1e-8, 0.1 */
PTRAINDEF void pt_adamw_update(float *param, const float *grad, float *m, float *v, size_t n,
                               const pt_adamw_config *cfg, float lr, int t, int decay);

/* sqrt(sum g^2) accumulated in double, in a fixed order (deterministic). */
PTRAINDEF double pt_norm2(const float *x, size_t n);
PTRAINDEF void pt_scale(float *x, size_t n, float s);

/* Linear warm-up for warmup_steps, then cosine decay from lr to min_lr at total_steps. */
typedef struct pt_lr_schedule {
    float lr, min_lr;
    int warmup_steps, total_steps;
} pt_lr_schedule;
PTRAINDEF float pt_lr_at(const pt_lr_schedule *s, int step);

/* Measured GFLOP/s of the GEMM ctx's precision runs (pt_sgemm, the GEMM
   selected, or pt_gemm_bf16) on n x n x n with the current thread count
   (at most ctx's), best of repeated runs for at least `seconds`. */
PTRAINDEF double pt_gemm_peak_gflops(pt_ctx *ctx, int n, double seconds);
/* Measured instruction peak in GFLOP/s on the current thread count (the
   ceiling of any GEMM): each thread runs 24 independent chains of fp32 fused
   multiply-adds (vfmadd231ps on zmm; 12 on ymm on CPUs without AVX-512F) or, for
   bf16, the best bf16 instruction usable here: Intel AMX TDPBF16PS (4
   independent accumulator tiles, 16x16x32 multiply-adds each) where AMX is,
   unless pt_gemm_bf16_select chose "avx512bf16", else 24 chains of vdpbf16ps
   (2 products an fp32 lane); best of runs for `seconds`. On a CPU without a
   bf16 instruction, bf16 GEMMs run as fp32 products (pt_gemm_bf16's
   "sgemm"), so their peak is the fp32 one. 0 where the CPU lacks the
   instruction (no FMA). */
PTRAINDEF double pt_instr_peak_gflops(int bf16, double seconds);
/* Measured memory bandwidth in GB/s: y += s*x over two buffers of n floats
   (12 bytes an element: read x and y, write y), fastest of `reps` runs. */
PTRAINDEF double pt_mem_bandwidth_gbs(size_t n, int reps);

/* ======================================================================== */
/* >>comm                                                                    */
/* ======================================================================== */

/* A communicator: rank, size and a small table of collectives on float
   buffers. Backends: self (size 1), threads (ranks are threads of one process
   sharing memory, started by pt_comm_threads_run), MPI (PTRAIN_MPI; ranks are
   processes started by mpirun). Every operation is collective over the
   communicator unless it says otherwise, and every rank must call them in the
   same order with the same sizes. Results are bitwise identical on every rank.
   Users may plug in a backend of their own by filling a pt_comm_ops table. */
typedef enum pt_reduce_op { PT_REDUCE_SUM = 0, PT_REDUCE_AVG, PT_REDUCE_MAX } pt_reduce_op;
typedef enum pt_comm_kind { PT_COMM_SELF = 0, PT_COMM_THREADS, PT_COMM_MPI } pt_comm_kind;
typedef struct pt_comm pt_comm;
typedef struct pt_grid pt_grid;

/* A started (non-blocking) operation: pt_comm_*_start fills it, pt_comm_wait
   or a pt_comm_test that reports it done finishes it. The caller owns it; it
   must stay at its address, and the buffers it names must not be touched
   (read or written), until it finished. A finished or zeroed request has
   comm == NULL, and waiting on it returns PT_OK at once. */
typedef enum pt_comm_op {
    PT_COMM_OP_NONE = 0, PT_COMM_OP_ALL_REDUCE, PT_COMM_OP_REDUCE_SCATTER, PT_COMM_OP_ALL_GATHER,
    PT_COMM_OP_SEND, PT_COMM_OP_RECV
} pt_comm_op;

typedef struct pt_comm_req {
    pt_comm *comm;      /* NULL: nothing outstanding */
    pt_comm_op op;
    int arg;            /* the reduce op (collectives), the peer rank (send, recv) */
    int tag;            /* send, recv */
    size_t n;           /* as in the blocking call */
    const float *in;    /* all_reduce: buf; reduce_scatter, all_gather: in; send: buf */
    float *out;         /* all_reduce: buf; reduce_scatter, all_gather: out; recv: buf */
    int done;           /* the backend finished it early; status is its result */
    pt_status status;
    uint64_t seq;       /* the backend's: the collective's number on its communicator */
    void *link;         /* the backend's: a list of the rank's receives */
    uint64_t state[2];  /* the backend's: an MPI_Request */
} pt_comm_req;

typedef struct pt_comm_ops {
    /* buf (n) on every rank becomes op over the ranks' buf */
    pt_status (*all_reduce)(pt_comm *c, float *buf, size_t n, pt_reduce_op op);
    /* in (size*n) on every rank; out (n) on rank r = op over ranks of in[r*n .. r*n+n) */
    pt_status (*reduce_scatter)(pt_comm *c, const float *in, float *out, size_t n,
                                pt_reduce_op op);
    /* in (n) on every rank; out (size*n): out[r*n ..] = rank r's in */
    pt_status (*all_gather)(pt_comm *c, const float *in, float *out, size_t n);
    pt_status (*broadcast)(pt_comm *c, float *buf, size_t n, int root);
    /* Point to point, not collective. send is buffered: it returns once buf may
       be reused, whether or not the receive was posted; messages between two
       ranks with the same tag arrive in order. */
    pt_status (*send)(pt_comm *c, const float *buf, size_t n, int dst, int tag);
    pt_status (*recv)(pt_comm *c, float *buf, size_t n, int src, int tag);
    pt_status (*barrier)(pt_comm *c);
    /* Ranks with equal color form a new communicator, ordered by key (ties by
       rank). */
    pt_status (*split)(pt_comm *c, int color, int key, pt_comm *out);
    /* Tells every rank that this one failed with message msg; under threads
       the others' pending and later operations return PT_ERR_COMM with
       "rank R failed: msg", under MPI the job is aborted. */
    void (*abort)(pt_comm *c, const char *msg);
    void (*free)(pt_comm *c);
    /* Non-blocking operations (optional: a backend without them runs the
       blocking operation inside start, and the request is finished at once).
       start begins the operation r describes (r->op, in, out, n, arg, tag);
       test sets *done to 1 once it finished and 0 otherwise, without waiting;
       wait returns when it finished. Both return the operation's status. */
    pt_status (*start)(pt_comm *c, pt_comm_req *r);
    pt_status (*test)(pt_comm *c, pt_comm_req *r, int *done);
    pt_status (*wait)(pt_comm *c, pt_comm_req *r);
} pt_comm_ops;

struct pt_comm {
    int rank, size;
    pt_comm_kind kind;
    const pt_comm_ops *ops;
    void *impl;              /* the backend's state */
    double seconds;          /* time spent inside this communicator's operations */
    uint64_t bytes, calls;   /* payload bytes and number of operations */
    /* Seconds any one wait of this communicator (a blocking operation, a
       wait on a started one) may last; 0: PT_COMM_TIMEOUT_DEFAULT. split
       copies it. On expiry the rank says which operation, group, peer ranks
       and hosts it waited for and how long; under threads every rank's
       operations then fail (PT_ERR_COMM), under MPI the process ends itself
       (exit status 1) after asking MPI to abort the job. */
    double timeout;
};
#define PT_COMM_TIMEOUT_DEFAULT 300.0

/* The self communicator: rank 0 of 1. */
PTRAINDEF void pt_comm_self(pt_comm *c);
/* Runs fn(world, arg) on nranks threads, each with a world communicator of
   its own (rank 0..nranks-1). Each rank gets max(1, cores/nranks) OpenMP and
   BLAS threads. Returns PT_OK if every rank returned PT_OK; otherwise the
   lowest failing rank's status, with its message in pt_last_error() of the
   caller ("rank 2: cannot open data.bin: No such file or directory"). A rank
   that returns an error aborts the world, so no other rank waits forever. */
PTRAINDEF pt_status pt_comm_threads_run(int nranks, pt_status (*fn)(pt_comm *world, void *arg),
                                        void *arg);
#ifdef PTRAIN_MPI
/* MPI_Init (if needed) and a duplicate of MPI_COMM_WORLD; the ranks swap
   their host names (PT_HOST from the environment, else the host name and its
   first non-loopback IPv4 address) for the timeout messages. */
PTRAINDEF pt_status pt_comm_mpi_init(pt_comm *world, int *argc, char ***argv);
PTRAINDEF void pt_comm_mpi_finalize(void);
#endif

/* The operations, timed into c->seconds/bytes/calls. */
PTRAINDEF pt_status pt_comm_all_reduce(pt_comm *c, float *buf, size_t n, pt_reduce_op op);
PTRAINDEF pt_status pt_comm_reduce_scatter(pt_comm *c, const float *in, float *out, size_t n,
                                           pt_reduce_op op);
PTRAINDEF pt_status pt_comm_all_gather(pt_comm *c, const float *in, float *out, size_t n);
PTRAINDEF pt_status pt_comm_broadcast(pt_comm *c, float *buf, size_t n, int root);
PTRAINDEF pt_status pt_comm_send(pt_comm *c, const float *buf, size_t n, int dst, int tag);
PTRAINDEF pt_status pt_comm_recv(pt_comm *c, float *buf, size_t n, int src, int tag);
PTRAINDEF pt_status pt_comm_barrier(pt_comm *c);
/* Non-blocking forms of the operations above, with the same arguments,
   checks and results bit for bit (the same reduction order), plus the
   request. Collectives must be started in the same order on every rank
   (blocking ones between them count too); they may be waited in any order.
   Receives match messages in the order they were started. A receive of the
   wrong size fails its wait with PT_ERR_SHAPE (under MPI the message is
   consumed). Time inside start, test and wait counts into c->seconds: the
   communication the caller was exposed to.
   Progress: under threads nothing runs in the background: a rank's test or
   wait performs unclaimed blocks of the reduction (any rank of the group may
   do any block, each block once, in rank order), so a collective finishes
   as soon as every rank started it and one of them waits. Under MPI,
   Open MPI progresses the request only inside MPI calls: call pt_comm_test
   now and then while computing, as the executor does from its GEMMs
   (bench/overlap.sh measures the difference).
   Threads: at most 64 collectives outstanding per communicator and rank. */
PTRAINDEF pt_status pt_comm_all_reduce_start(pt_comm *c, float *buf, size_t n, pt_reduce_op op,
                                             pt_comm_req *req);
PTRAINDEF pt_status pt_comm_reduce_scatter_start(pt_comm *c, const float *in, float *out,
                                                 size_t n, pt_reduce_op op, pt_comm_req *req);
PTRAINDEF pt_status pt_comm_all_gather_start(pt_comm *c, const float *in, float *out, size_t n,
                                             pt_comm_req *req);
PTRAINDEF pt_status pt_comm_send_start(pt_comm *c, const float *buf, size_t n, int dst, int tag,
                                       pt_comm_req *req);
PTRAINDEF pt_status pt_comm_recv_start(pt_comm *c, float *buf, size_t n, int src, int tag,
                                       pt_comm_req *req);
/* Waits for req to finish and returns its status; req->comm becomes NULL.
   If another rank fails meanwhile, PT_ERR_COMM naming it (as the blocking
   operations do). */
PTRAINDEF pt_status pt_comm_wait(pt_comm_req *req);
/* *done = 1 and the operation's status once req finished (then as wait);
   *done = 0 and PT_OK while it runs. */
PTRAINDEF pt_status pt_comm_test(pt_comm_req *req, int *done);
PTRAINDEF pt_status pt_comm_split(pt_comm *c, int color, int key, pt_comm *out);
/* The host of c's rank `rank` as the timeout messages name it (MPI: see
   pt_comm_mpi_init), "local" for the self and threads backends and
   backends of the user's, "?" for a rank out of range. Not collective. */
PTRAINDEF const char *pt_comm_host(const pt_comm *c, int rank);
/* Reports this rank's failure to the others (message: pt_last_error()) and
   returns s, so a rank can `return pt_comm_fail(world, st);`. A rank with
   started operations outstanding calls it before it frees their buffers
   (under threads the others may be reducing into them until it returns). */
PTRAINDEF pt_status pt_comm_fail(pt_comm *c, pt_status s);
PTRAINDEF void pt_comm_free(pt_comm *c);
/* 1 if every rank passed ok != 0 (an all-reduce of a flag): lets ranks agree
   that all of them got past a step that can fail locally (opening a file). */
PTRAINDEF pt_status pt_comm_all_ok(pt_comm *c, int ok, int *all_ok);

/* The tensor x data x pipeline grid of Megatron-LM: world rank
   r = t + tp * (d + dp * p) for tensor rank t, data rank d, pipeline rank p.
   tp groups are consecutive ranks (on one node under MPI's usual mapping).
   With context parallelism (pt_grid_init_cp) a cp dimension sits between tp
   and dp, as Megatron-Core's: r = t + tp * (c + cp * (d + dp * p)); the ranks
   of a cp group hold shares of the same sequences, and the gradients are
   reduced over cp and dp together (dpcp_comm, ordered by d * cp + c). */
struct pt_grid {
    int tp, dp, pp;                 /* group sizes, tp * cp * dp * pp = world size */
    int tp_rank, dp_rank, pp_rank;  /* this rank's coordinates */
    pt_comm *world;                 /* not owned */
    pt_comm tp_comm, dp_comm, pp_comm;
    int cp, cp_rank;                /* context parallelism (0 in a grid built without: 1) */
    pt_comm cp_comm, dpcp_comm;     /* cp > 1: the cp ring, and the dp x cp group */
};

/* Splits world into the three groups. Checks tp, dp, pp >= 1 and
   tp * dp * pp == world->size ("world size 6 != tp 4 x dp 1 x pp 1"). */
PTRAINDEF pt_status pt_grid_init(pt_grid *g, pt_comm *world, int tp, int dp, int pp);
/* The same with cp >= 1 context-parallel ranks: tp * cp * dp * pp == world->size;
   cp = 1 is pt_grid_init. */
PTRAINDEF pt_status pt_grid_init_cp(pt_grid *g, pt_comm *world, int tp, int cp, int dp, int pp);
PTRAINDEF void pt_grid_free(pt_grid *g);

/* ======================================================================== */
/* >>model                                                                   */
/* ======================================================================== */

/* The architecture's choices; zero is GPT-2's everywhere. arch picks the
   tensor names and layouts: Hugging Face GPT-2's (Conv1D [in, out], fused
   c_attn) or LlamaForCausalLM's (nn.Linear [out, in], q/k/v_proj,
   gate/up/down_proj). */
typedef enum pt_arch { PT_ARCH_GPT2 = 0, PT_ARCH_LLAMA } pt_arch;
typedef enum pt_norm_kind { PT_NORM_LAYER = 0, PT_NORM_RMS } pt_norm_kind;
typedef enum pt_pos_kind { PT_POS_LEARNED = 0, PT_POS_ROPE } pt_pos_kind;
typedef enum pt_mlp_kind { PT_MLP_GELU = 0, PT_MLP_SWIGLU } pt_mlp_kind;

typedef struct pt_gpt_config {
    int vocab_size, block_size, n_layer, n_head, n_embd;
    float ln_eps;       /* 0 means 1e-5 (LayerNorm's or RMSNorm's epsilon) */
    pt_arch arch;       /* names and layouts (GPT-2's needs GELU and n_kv_head = n_head) */
    pt_norm_kind norm;  /* LayerNorm | RMSNorm (no bias) */
    pt_pos_kind pos;    /* learned wpe | rotary (LLaMA needs rotary) */
    pt_mlp_kind mlp;    /* GELU | SwiGLU (gate and up projections; LLaMA only) */
    int n_kv_head;      /* key/value heads, dividing n_head; 0 means n_head */
    int ffn_hidden;     /* the MLP's hidden size; 0 means 4 n_embd */
    int no_bias;        /* 1: no bias in any linear layer or norm */
    int untied_head;    /* 1: a separate LM head (lm_head.weight) instead of wte */
    float rope_theta;   /* 0 means 10000 */
    pt_rope_scaling rope_scaling; /* LLaMA 3's frequency scaling (factor 0: none) */
} pt_gpt_config;

/* "tiny", "mini", "small", "gpt2-124m", "gpt2-350m", "gpt2-774m", "gpt2-1558m",
   "llama-tiny", "llama-124m", "llama2-7b", "llama2-13b", "llama3-8b", "llama2-70b" */
PTRAINDEF pt_status pt_gpt_config_preset(const char *name, pt_gpt_config *out);
PTRAINDEF const char *pt_gpt_preset_names(void);
/* Checks every field; the message lists every failed check. */
PTRAINDEF pt_status pt_gpt_config_validate(const pt_gpt_config *cfg);
PTRAINDEF int64_t pt_gpt_num_params(const pt_gpt_config *cfg);
/* Training FLOPs of one step: 6 * P * B*T + 12 * n_layer * C * B * T^2, P the
   parameters that multiply (every one but the lookup tables: the learned
   positions, and the token embedding where the head is a tensor of its own;
   a tied wte is the head's product and counts). */
PTRAINDEF double pt_gpt_flops_per_step(const pt_gpt_config *cfg, int B, int T);

/* How a tensor-parallel rank holds its part of a tensor (Megatron-LM):
   whole (replicated), a block of rows (wte over the vocabulary, the
   row-parallel c_proj weights), a block of columns (c_fc), or a block of each
   of the q, k and v column groups (c_attn: its own heads). 1-D tensors are
   one row. */
typedef enum pt_shard { PT_SHARD_NONE = 0, PT_SHARD_ROWS, PT_SHARD_COLS, PT_SHARD_QKV } pt_shard;

/* One entry per parameter tensor, Hugging Face GPT-2 name and layout. The
   same offset indexes params, grads, m and v. shape/offset/numel are this
   rank's part; full_* the whole tensor (equal without tensor parallelism). */
typedef struct pt_param {
    char name[64];
    int ndim;
    int64_t shape[2], full_shape[2];
    size_t offset, numel, full_offset, full_numel;
    pt_shard shard;
    int decay;  /* weight decay applies (ndim >= 2) */
    int bucket; /* the gradient bucket of its first element */
    int canon;  /* its place in the whole model's canonical order */
} pt_param;

/* Pointers of one block's parameters (or gradients) into the flat buffer.
   GPT-2 names in the comments (F = ffn_hidden); a NULL bias is absent. For
   LLaMA (nn.Linear [out, in]): qkv_w = q_proj, whose rows k_w (k_proj) and
   v_w (v_proj) continue, so qkv_w is the fused [q|k|v] weight (likewise the
   biases); fc_w = gate_proj continued by up_w (up_proj): the fused
   [gate|up] weight; attn_proj_w = o_proj (C, C), fc_proj_w = down_proj (C, F).
   With GELU, LLaMA's one MLP input projection is gate_proj. */
typedef struct pt_block_params {
    float *ln1_w, *ln1_b;          /* (C) */
    float *qkv_w, *qkv_b;          /* (C,3C), (3C): attn.c_attn */
    float *k_w, *v_w, *k_b, *v_b;  /* LLaMA: k_proj, v_proj (KV, C) and biases */
    float *attn_proj_w, *attn_proj_b; /* (C,C), (C): attn.c_proj */
    float *ln2_w, *ln2_b;          /* (C) */
    float *fc_w, *fc_b;            /* (C,F), (F): mlp.c_fc */
    float *up_w, *up_b;            /* LLaMA SwiGLU: up_proj (F, C) and its bias */
    float *fc_proj_w, *fc_proj_b;  /* (F,C), (C): mlp.c_proj */
} pt_block_params;

/* One block's saved activations for backward. With bf16 storage (the
   *_16 set: a model at bf16 precision), ln1, qkv, ln2 and fch are kept as
   bfloat16 bits and their float pointers are one layer's scratch: forward
   rounds each in place as it stores it (every reader sees the kept values),
   backward widens what it reads. With sequence parallelism (the scratch's
   sp) the residual stream's tensors hold this rank's Ns = N/tp rows of the
   N = B*T (rows [rank*Ns, rank*Ns + Ns), b-major): ln1, res2, ln2, out and
   the norms' statistics; qkv, lse, atty and fch stay N rows of this rank's
   heads and columns. */
typedef struct pt_block_acts {
    float *ln1, *ln1_mean, *ln1_rstd; /* (N,C), (N), (N) */
    float *qkv;                       /* (N,3C) */
    float *lse;                       /* (B,NH,T) attention log-sum-exp */
    float *atty;                      /* (N,C) attention output, before c_proj */
    float *res2;                      /* (N,C) x + attention branch */
    float *ln2, *ln2_mean, *ln2_rstd; /* (N,C), (N), (N) */
    float *fch;                       /* (N,4C) c_fc output; gelu(fch) is recomputed */
    float *out;                       /* (N,C) block output */
    uint16_t *ln1_16, *qkv_16, *ln2_16, *fch_16; /* bf16 storage (NULL: the floats keep) */
} pt_block_acts;

/* The gradients of a block's matmul and LayerNorm outputs that its weight
   gradients need: what a zero-bubble schedule keeps from B to W. */
typedef struct pt_block_wgrad {
    float *dout, *dln2, *dres2, *dln1; /* (N,C); sequence parallel: dln2, dln1 (Ns,C) */
    float *dfch;                       /* (N,4C/tp) */
    float *dqkv;                       /* (N,3C/tp) */
    float *ln1g, *ln2g;                /* sequence parallel: ln1, ln2 gathered (N,C); else NULL */
} pt_block_wgrad;

/* Per-block scratch, reusable across blocks (the d* buffers only for backward).
   Zero it before setting the buffers you use: a field left NULL or 0 is off
   (bf16 storage, sp, cp). */
typedef struct pt_block_scratch {
    pt_block_wgrad w; /* the fused backward's output gradients */
    float *dln;     /* (N,C) */
    float *dqkv;    /* (N,3C) */
    float *datty;   /* (N,C) */
    float *dfch;    /* (N,4C) */
    float *gelu;    /* (N,F) gelu(fch) or swiglu(fch), recomputed for the layer at hand */
    float *attn;    /* pt_attention_scratch_floats(T, attn_slots) */
    int attn_slots; /* threads that may use attn at once */
    float *rope;    /* rotary positions: pt_rope_table of rope_T positions (T*hd) */
    int rope_T;     /* positions in rope (0: not computed yet) */
    float *ln1, *qkv, *ln2, *fch; /* bf16 storage: the layer at hand's, widened (else NULL) */
    const uint16_t *held[4]; /* whose kept bf16 ln1, qkv, ln2, fch those hold now (NULL: none) */
    int sp;         /* sequence parallelism (pt_block_layout's sp; needs a tp group) */
    float *xg;      /* sp: (N,C) a norm's output gathered, or a row-parallel partial sum */
    float *spg;     /* sp: (4C) the norms' weight gradients of this rank's rows */
    pt_comm_req req[2]; /* sp: backward's gathers of ln2 and ln1 for W, under way */
    struct pt_block_cp *cp; /* context parallelism (NULL: none): attention as a ring */
} pt_block_scratch;

/* Context parallelism of a block (the scratch's cp): comm's rank c of K
   holds tokens pos[0..T) of each sequence (chunks c and 2K-1-c of T/2
   tokens each, T local). Attention meets the other ranks' keys/values as
   blocks passed round the ring (to rank c+1, from c-1), the next block's
   transfer started before the current one is computed; the partial
   results merge (pt_attention_merge); backward passes the blocks round
   again, each followed by its dk/dv accumulator, which arrives home after
   K hops. Rotary embeddings at the global positions. Buffers for B x T
   local tokens of this rank's key/value heads (nkv = B*T*2*Ckv floats). */
typedef struct pt_block_cp {
    pt_comm *comm;        /* the cp ring */
    int *pos, *kpos;      /* (T) this rank's global positions; a block's */
    int pos_T;            /* the local T pos is filled for (0: none yet) */
    float *kv[2];         /* (nkv) blocks of k|v rows on their way */
    float *acc[2], *part; /* (nkv) backward: dk|dv accumulators, this rank's share */
    float *po, *pl;       /* forward: a block's partial out (N,Ca), lse (B,NH,T) */
    pt_comm_req req[5];   /* send, receive; the accumulators' receive and two sends */
} pt_block_cp;

/* x (N,C) -> a->out (N,C). With a tensor-parallel group tp (NULL: none) of
   size k, p holds this rank's n_head/k heads of c_attn, rows of attn.c_proj,
   4C/k columns of c_fc and rows of mlp.c_proj; x and out are whole and equal
   on every rank: one all-reduce after each row-parallel matmul. Fails only
   when the communicator does. The GEMMs run at ctx's precision (bf16: q, k,
   v, fch and the norms' outputs are rounded to bf16 as the model keeps them).
   Sequence parallelism (s->sp, Korthikanti et al. 2022): x and out are this
   rank's N/k rows; the norms and residuals run on them; each norm's output
   is all-gathered (over the rows) for its column-parallel matmul (started
   first, this rank's own rows multiplied while it runs), and each
   row-parallel matmul's partial sums are reduce-scattered (over the rows)
   instead of all-reduced: the same sums, in the same order. */
PTRAINDEF pt_status pt_block_forward(pt_ctx *ctx, const pt_gpt_config *cfg, int B, int T,
                                     const pt_block_params *p, const float *x, pt_block_acts *a,
                                     pt_block_scratch *s, pt_comm *tp);
/* dout (N,C) -> dx (N,C), written; dx may alias dout. Parameter gradients g
   accumulate. Under tp: one all-reduce of each input gradient of a
   column-parallel matmul; replicated parameters get equal gradients.
   It is pt_block_backward_input then pt_block_backward_weight through the
   scratch's w; zero-bubble schedules run the two apart (B and W), with a w
   of their own per micro-batch in flight. Sequence parallel (s->sp): dout
   and dx are this rank's rows; dout and the attention branch's output
   gradient are all-gathered, the column-parallel input gradients
   reduce-scattered, ln1 and ln2 gathered again into w for W (started
   when B starts, waited when it ends); the norms' weight gradients (from
   this rank's rows) are summed over the group (pt_block_sp_norm_sum)
   before they are added to g. */
PTRAINDEF pt_status pt_block_backward(pt_ctx *ctx, const pt_gpt_config *cfg, int B, int T,
                                      const pt_block_params *p, pt_block_params *g,
                                      const float *x, const pt_block_acts *a, const float *dout,
                                      float *dx, pt_block_scratch *s, pt_comm *tp);
PTRAINDEF pt_status pt_block_backward_input(pt_ctx *ctx, const pt_gpt_config *cfg, int B, int T,
                                            const pt_block_params *p, const float *x,
                                            const pt_block_acts *a, const float *dout, float *dx,
                                            pt_block_wgrad *w, pt_block_scratch *s, pt_comm *tp);
PTRAINDEF void pt_block_backward_weight(pt_ctx *ctx, const pt_gpt_config *cfg, int B, int T,
                                        const pt_block_params *p, pt_block_params *g,
                                        const float *x, const pt_block_acts *a,
                                        const pt_block_wgrad *w, pt_block_scratch *s, int tp);
/* Sequence parallel: pt_block_backward_weight leaves the norms' weight
   gradients of this rank's rows in s->spg; this sums them over tp and adds
   them to g (nothing to do without s->sp). pt_block_backward calls it. */
PTRAINDEF pt_status pt_block_sp_norm_sum(const pt_gpt_config *cfg, pt_block_params *g,
                                         pt_block_scratch *s, pt_comm *tp);
/* One block's buffers from an arena (measure with a meta arena first, as
   pt_arena_init_meta describes): its parameters and gradients (g may be
   NULL: no backward scratch either) laid out as pt_block_params, forward's
   saved activations and the scratch, for B x T rows on one of tp tensor
   ranks (sp = 1: sequence parallel, the residual stream's tensors N/tp rows,
   T % tp == 0). What pt_gpt_init lays out for each layer, for programs that
   run a block alone. */
PTRAINDEF void pt_block_layout(const pt_gpt_config *cfg, int B, int T, int tp, int seqp, pt_arena *a,
                               pt_block_params *p, pt_block_params *g, pt_block_acts *acts,
                               pt_block_scratch *s);

/* Pipeline schedules (>>schedule builds them as data, >>exec runs them).
   0 picks 1F1B, or the interleaved 1F1B when a stage holds several chunks. */
typedef enum pt_schedule_kind {
    PT_SCHED_DEFAULT = 0,
    PT_SCHED_GPIPE,       /* all forwards, then all backwards */
    PT_SCHED_1F1B,        /* PipeDream-Flush: at most p - s micro-batches in flight */
    PT_SCHED_INTERLEAVED, /* Megatron-LM's interleaved 1F1B, v >= 2, m % p == 0 */
    PT_SCHED_ZB_H1,       /* zero bubble H1: B and W split, 1F1B's memory */
    PT_SCHED_ZB_H2,       /* zero bubble H2: B and W split, 2p - 1 micro-batches in flight,
                             no idle slot inside a stage's run once m >= 2p - 1 */
    PT_SCHED_ZB_V,        /* zero bubble V: 2 chunks per stage in a V (stage s holds virtual
                             stages s and 2p-1-s), B and W split, 1F1B's activation memory,
                             no idle slot inside a stage's run once m >= 2p - 1 */
    PT_SCHED_CHIMERA,     /* Chimera (Li & Hoefler 2021): two pipelines in opposite directions;
                             stage s holds stage s of replica 0 (chunk 0) and stage p-1-s of
                             replica 1 (chunk 1), a block of L/p layers each; even p, m a
                             multiple of p; the two copies' gradients summed (REDUCE) */
    PT_SCHED_2BW,         /* PipeDream-2BW (Narayanan et al. 2021): 1F1B without a flush, a new
                             weight version every p micro-batches (m a multiple of p), batch t
                             computed at version t-1, two versions alive per stage; a step
                             starts from one version and runs its updates (needs
                             pt_step_desc.adamw) */
    PT_SCHED_COUNT
} pt_schedule_kind;

enum { PT_RECOMPUTE_NONE = 0, PT_RECOMPUTE_SELECTIVE = 1, PT_RECOMPUTE_FULL = 2 };

typedef struct pt_gpt_desc {
    pt_gpt_config config;
    int batch, seq;  /* a micro-batch's most rows and tokens (the step's batch
                        is grad_accum micro-batches of at most these) */
    int meta;        /* 1: no tensor memory, only count its bytes (see mem);
                        the small name table is still allocated */
    int inference;   /* 1: weights and forward only: no gradients, AdamW state
                        or backward scratch (for sampling) */
    pt_grid *grid;   /* NULL: one rank. Otherwise this rank's place in the
                        tp x dp x pp grid (must outlive the model); every
                        model call is then collective over its groups. A meta
                        build may give sizes and coordinates alone (world NULL) */
    int zero;        /* data parallelism: 0 averages whole gradients; ZeRO
                        stage 1 shards the AdamW state over the dp group, 2
                        the gradients too (without a pipeline), 3 the
                        parameters too (with a schedule that keeps B and W
                        together, not Chimera's; under pipeline stages the
                        gradients accumulate whole and are reduce-scattered
                        after the last micro-batch, as ZeRO 1's; m->params is
                        then this rank's shards, read whole through
                        pt_gpt_gather) */
    int grad_accum;  /* micro-batches per optimizer step, the m of the step's
                        schedule (0 means 1) */
    pt_schedule_kind schedule; /* the step's schedule over the pipeline stages
                        (one stage without a pipeline); 0: 1F1B, or interleaved
                        when chunks > 1 */
    int chunks;      /* pipeline: chunks of layers per stage (0 means 1) */
    const struct pt_schedule_report *schedule_report; /* meta builds: the schedule's
                        checked report (the simulator checks one schedule for all
                        ranks); NULL: built and checked here */
    int recompute;   /* activation recomputation: 0 none; PT_RECOMPUTE_SELECTIVE
                        keeps no attention output (recomputed from q, k, v in
                        backward); PT_RECOMPUTE_FULL keeps only each layer's
                        output and reruns the layer's forward in backward */
    pt_precision precision; /* the GEMMs' arithmetic (pt_precision; 0: fp32), the
                        model's ctx.precision. bf16: every model call passes it down
                        and runs its GEMMs as pt_gemm_bf16 (weights
                        rounded as the GEMMs pack them); a layer keeps ln1, qkv, ln2
                        and fch in bf16 (without full recomputation); master
                        weights, gradients, AdamW, norm/softmax/loss statistics
                        and all communication stay fp32 */
    size_t bucket_bytes; /* data parallelism: the gradient buckets (each reduced, and
                        under ZeRO gathered, as one collective): consecutive layers of
                        a chunk are grouped until a bucket holds at least this many
                        bytes of this rank's parameters, and wte goes in runs of rows
                        of about this size. 0: a layer a bucket (wte in runs of a
                        layer's size). At most the model's bytes; ZeRO 2 keeps a layer
                        a bucket */
    int sequence_parallel; /* 1: with tp >= 2, the norms, residuals, embeddings' output
                        and everything outside the tensor-parallel regions run on T/tp
                        of the tokens per tensor rank (rows [r N/tp, (r+1) N/tp) of a
                        micro-batch's N = B*T, b-major); the blocks' all-reduces become
                        all-gathers before the column-parallel GEMMs and
                        reduce-scatters after the row-parallel ones. Needs tp >= 2 and
                        seq (and every step's T) a multiple of tp. 0: off */
    int context_parallel; /* cp ranks of the grid (pt_grid_init_cp) share every
                        sequence: rank c holds chunks c and 2cp-1-c of its 2cp chunks
                        of T/(2cp) tokens (the load-balanced split); all but attention
                        runs on those T/cp tokens, attention passes key/value blocks
                        round the cp ring (ring attention). A step's inputs and
                        targets are whole rows of T tokens (each rank takes its
                        tokens); seq and T multiples of 2cp. Gradients and the loss
                        are averaged over the dp x cp group. Must equal the grid's
                        cp; 0 means 1 */
    void *alloc_ctx; /* passed to PTRAIN_MALLOC/PTRAIN_FREE */
} pt_gpt_desc;

/* Where this rank sits in the grid and what it holds (one rank: sizes 1,
   ranks 0, the whole model). */
typedef struct pt_gpt_place {
    int tp, tp_rank, dp, dp_rank, pp, pp_rank;
    int zero;                 /* ZeRO stage */
    int micro;                /* micro-batches per step (grad_accum) */
    int chunks;               /* chunks of layers per pipeline stage */
    pt_schedule_kind schedule; /* the step's schedule, resolved */
    int recompute;            /* PT_RECOMPUTE_* */
    int sp;                   /* sequence parallelism (pt_gpt_desc.sequence_parallel) */
    int cp, cp_rank;          /* context parallelism: ranks sharing a sequence, this one's
                                 place among them. Under cp > 1, dp and dp_rank are the
                                 gradient-reduction group's: dp x cp ranks, rank
                                 d * cp + cp_rank (ZeRO shards over all of them) */
    int n_layers;             /* transformer layers held here, chunk after chunk */
    const int *layer_id;      /* (n_layers) their index in the whole model */
    int has_embed, has_head;  /* the embeddings (the stage holding the first block); the
                                 final norm and the head (the last block's; tied wte is on
                                 both; Chimera: stages 0 and p-1 hold both) */
    int vocab_local, vocab_offset; /* wte rows here: [offset, offset + local) of the
                                      vocabulary padded to a multiple of tp */
    size_t bucket_bytes;      /* pt_gpt_desc's (0: a layer a bucket) */
} pt_gpt_place;

/* Bytes on this rank, and the activation slots of its schedule. */
typedef struct pt_gpt_mem {
    size_t params, grads, optimizer, activations, scratch, total;
    int slots;      /* micro-batch activation sets: the schedule's peak in flight
                       on this stage (1 without a pipeline) */
    int slots_peak; /* most in use at once during the last step */
} pt_gpt_mem;

/* Whole-model buffers that pt_gpt_gather can assemble. */
typedef enum pt_state_buf { PT_BUF_PARAMS = 0, PT_BUF_GRADS, PT_BUF_ADAM_M, PT_BUF_ADAM_V } pt_state_buf;

typedef struct pt_gpt_exec pt_gpt_exec; /* private: the executor's state (>>exec) */

/* The model as a user reads it. Parameters, gradients and the AdamW moments
   each live in one buffer laid out as table (Hugging Face names); the named
   pointers below point into params (ZeRO 3: params holds this rank's shards
   and the named pointers point into the gathered buckets, valid inside the
   model's calls only). Everything about running a step
   (communicators, buckets, the schedule, activation slots) is private. */
typedef struct pt_gpt {
    pt_gpt_config config;
    int B, T;                 /* micro-batch capacity: rows and tokens */
    pt_gpt_place place;
    size_t num_params_full;   /* parameters of the whole model */
    size_t num_params;        /* this rank's (its tensor parts, bucket padding) */
    int num_tensors, num_canon; /* tensors held here, and in the whole model */
    pt_param *table;          /* (num_tensors) */
    float *params;            /* (num_params; ZeRO 3: this rank's shards) */
    float *grads;             /* (num_params) the step's gradients; under ZeRO the
                                 averaged ones are in shards: read them with
                                 pt_gpt_grad_of or pt_gpt_gather */
    float *m, *v;             /* AdamW moments (num_params; ZeRO: this rank's shard) */
    float *wte, *wpe, *lnf_w, *lnf_b; /* NULL where not held */
    float *lm_head;           /* the LM head: wte when tied (NULL where not held) */
    pt_block_params *layers;  /* (place.n_layers) */
    float loss;               /* mean loss of the last step or forward, or -1 */
    int adam_t;               /* optimizer steps taken */
    pt_ctx ctx;               /* the execution context its calls pass to the kernels:
                                 ctx.precision (desc.precision; never DEFAULT), the GEMM
                                 workspace (allocated by pt_gpt_init for pt_get_threads()
                                 threads; none in a meta build), the step's poller */
    pt_gpt_mem mem;
    pt_gpt_exec *exec;
    void *alloc_ctx;
} pt_gpt;

PTRAINDEF pt_status pt_gpt_init(pt_gpt *m, const pt_gpt_desc *desc);
PTRAINDEF void pt_gpt_free(pt_gpt *m);
/* GPT-2 init: N(0, 0.02) for wte, wpe, c_attn.W, c_fc.W; N(0, 0.02/sqrt(2L)) for
   the c_proj weights; biases 0, LayerNorm weights 1. Every layout draws the
   same numbers: a tensor-parallel rank keeps its part of the serial init. */
PTRAINDEF void pt_gpt_init_weights(pt_gpt *m, uint64_t seed);
/* A whole-model buffer (parameters, averaged gradients of the step, AdamW
   moments) from this rank's parts, whatever the layout: full holds
   num_params_full floats as the whole model's table says (table[i].full_offset
   for the tensors held here), padding dropped. Collective over the tensor-,
   data-parallel and pipeline groups. */
PTRAINDEF pt_status pt_gpt_gather(const pt_gpt *m, pt_state_buf which, float *full);
PTRAINDEF const pt_param *pt_gpt_find_param(const pt_gpt *m, const char *name);

/* Generation with a KV cache: a token at position p costs O(p), not O(p^2).
   The cache holds the key/value heads only (n_kv_head of them), after the
   rotary embedding. */
typedef struct pt_kv_cache {
    int capacity, len;
    float *k, *v;                         /* (L, capacity, n_kv_head * head size) each */
    float *x, *ln, *qkv, *atty, *res, *fch, *fcg, *att, *logits, *work;
    float *rope;                          /* (capacity, head size) rotary table, or NULL */
    pt_arena arena;
} pt_kv_cache;

typedef struct pt_sample_desc {
    float temperature; /* 0: greedy (argmax) */
    int top_k;         /* 0: no top-k filtering */
    uint64_t seed;
} pt_sample_desc;

PTRAINDEF pt_status pt_kv_cache_init(pt_kv_cache *c, const pt_gpt *m);
PTRAINDEF void pt_kv_cache_free(pt_kv_cache *c);
PTRAINDEF void pt_kv_cache_reset(pt_kv_cache *c);
/* Appends one token at position c->len, returns the next-token logits (V).
   Its GEMMs run in fp32 whatever the model's precision (a single row, where
   bf16 has nothing to win), in the model's workspace. */
PTRAINDEF pt_status pt_gpt_decode(const pt_gpt *m, pt_kv_cache *c, int token,
                                  const float **logits);
/* Samples from logits/temperature restricted to the top_k largest.
   work holds V floats. */
PTRAINDEF int pt_sample_logits(const float *logits, int V, float temperature, int top_k,
                               pt_rng *rng, float *work);
/* Feeds the prompt, then samples n_new tokens into out. When the context is
   full, the cache is refilled with the last block_size/2 tokens. */
PTRAINDEF pt_status pt_gpt_generate(const pt_gpt *m, pt_kv_cache *c, const int *prompt,
                                    int n_prompt, int *out, int n_new,
                                    const pt_sample_desc *desc);

/* Serving many sequences at once: a paged KV cache. The pool holds n_blocks
   blocks of block_tokens positions, each block every layer's keys and values
   of its positions (after the rotary embedding). A sequence is a block table:
   its position u lives in block blocks[u / block_tokens], row u % block_tokens,
   so sequences with a common prefix can share that prefix's full blocks
   read-only (the caller keeps the table; a forward writes only the rows of
   the new tokens). The scratch of one forward of at most max_rows new tokens
   (summed over its sequences) is allocated here, once. */
typedef struct pt_kv_pages {
    int block_tokens, n_blocks, max_rows;
    size_t block_floats;                  /* n_layer * block_tokens * n_kv_head * head size */
    float *k, *v;                         /* (n_blocks, n_layer, block_tokens, kv width) */
    float *x, *ln, *mean, *rstd, *qkv, *atty, *res, *fch, *fcg;
    int *row_pos, *row_seq;               /* each new row's position and sequence */
    float *rope;                          /* (block_size, head size) rotary table, or NULL */
    pt_arena arena;
} pt_kv_pages;

/* One sequence of a batched forward: n new tokens at positions pos..pos+n-1
   (pos + n <= block_size), their keys and values written to the blocks the
   table names for those positions (blocks holding rows of positions below pos
   are only read). Logits are returned for rows logits_from..n-1 (n: none). */
typedef struct pt_kv_seq {
    const int *tokens, *blocks;
    int n, pos, logits_from;
} pt_kv_seq;

/* Bytes of one block of block_tokens positions for model m (keys and values). */
PTRAINDEF size_t pt_kv_pages_block_bytes(const pt_gpt *m, int block_tokens);
PTRAINDEF pt_status pt_kv_pages_init(pt_kv_pages *c, const pt_gpt *m, int block_tokens,
                                     int n_blocks, int max_rows);
PTRAINDEF void pt_kv_pages_free(pt_kv_pages *c);
/* One forward over the new tokens of n_seqs sequences: every projection a GEMM
   over all their rows, attention per row over its own sequence's cached and
   new positions. logits gets (sum of n - logits_from) rows of vocab_size, in
   sequence order. A row's result depends only on its sequence's tokens: the
   GEMMs run ptrain's fp32 kernels on every shape (or the portable loops),
   whose sums over k do not depend on the row count; where the GEMM is
   OpenBLAS's (no AVX-512, or PTRAIN_GEMM=openblas), whose rows do, each row
   is its own product. */
PTRAINDEF pt_status pt_gpt_forward_pages(const pt_gpt *m, pt_kv_pages *c, const pt_kv_seq *seqs,
                                         int n_seqs, float *logits);

/* ======================================================================== */
/* >>schedule                                                                */
/* ======================================================================== */

/* A pipeline schedule is data: for each of p stages, the ordered list of what
   it does. The model's layers form p*v virtual stages; stage s holds chunks
   c = 0..v-1, chunk c being virtual stage c*p + s (Megatron-LM's
   interleaving; v = 1: stage s holds one contiguous run of layers), except
   under ZB-V, whose two chunks form a V: stage s holds virtual stages s and
   2p-1-s. A micro-batch flows forward through virtual stages 0..p*v-1 and
   back. */
typedef enum pt_action_kind {
    PT_ACT_F = 0,    /* forward of (micro, chunk) */
    PT_ACT_B,        /* backward: input gradient, and the weight gradient unless split */
    PT_ACT_W,        /* weight gradient alone (zero-bubble schedules) */
    PT_ACT_SEND_ACT, /* send the activation of (micro, chunk) to peer */
    PT_ACT_RECV_ACT, /* receive the activation (micro, chunk) needs, from peer */
    PT_ACT_SEND_GRAD,
    PT_ACT_RECV_GRAD,
    PT_ACT_OPT,      /* the optimizer step, after every backward */
    PT_ACT_REDUCE,   /* Chimera: the gradients all-reduced with peer, the stage holding
                        the same layers in the other replica (before OPT) */
    PT_ACT_COUNT
} pt_action_kind;

typedef struct pt_action {
    int kind;  /* pt_action_kind */
    int micro; /* micro-batch (-1 for OPT) */
    int chunk; /* the chunk of this stage it serves: whose forward or backward
                  it is, whose output a send carries, whose input a receive
                  brings (0..v-1; -1 for OPT) */
    int peer;  /* the other stage of a send or receive (-1 otherwise) */
    int version; /* PipeDream-2BW: the weight version F and B use, or the one OPT
                    makes (every OPT but the last is mid-list there); 0 elsewhere */
} pt_action;

/* pt_schedule_kind is declared with the model (>>model). */

typedef struct pt_schedule {
    pt_schedule_kind kind;
    int stages, chunks, micro; /* p, v, m */
    int *count;                /* (p) actions of each stage */
    pt_action **list;          /* (p) each stage's actions, in order */
    pt_action *storage;
    void *alloc_ctx;
} pt_schedule;

/* What pt_schedule_check learns by running every stage's list. */
typedef struct pt_schedule_report {
    int peak_inflight[64]; /* per stage: most micro-batch chunks forwarded and not
                              yet backpropagated (their activations are held) */
    int steps;             /* unit-time makespan: F, B, W take one slot each
                              (B two when W is not split off), messages none */
    double bubble;         /* idle fraction of the stages' slots in it */
    int versions;          /* most weight versions alive on a stage at once: the newest
                              and those in-flight micro-batches use (PipeDream-2BW: 2;
                              1 for the flushed schedules) */
    int idle;              /* idle slots inside the stages' runs (from a stage's first
                              F, B or W to its last), summed: 0 is the zero-bubble
                              papers' zero, where only the fill of the pipeline (stage
                              s starts at slot s) and its drain are idle */
} pt_schedule_report;

/* "gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v", "chimera", "2bw" (kind_name(0)
   is "default") */
PTRAINDEF pt_status pt_schedule_kind_parse(const char *name, pt_schedule_kind *out);
PTRAINDEF const char *pt_schedule_kind_name(pt_schedule_kind kind);
/* Builds the lists for p stages (1..64), v chunks per stage, m micro-batches.
   Checks each kind's constraints and says which failed: interleaved needs
   v >= 2 and m divisible by p (Megatron-LM), zb-v exactly v = 2, the others
   v = 1. zb-h2 and zb-v run for any m and are bubble-free (no idle slot
   inside a stage's run in unit time) from m = 2p - 1 on. */
PTRAINDEF pt_status pt_schedule_build(pt_schedule *s, pt_schedule_kind kind, int p, int v,
                                      int m);
PTRAINDEF void pt_schedule_free(pt_schedule *s);
/* Verifies any schedule before it runs: every (micro, chunk) gets F, B (and W
   when split) exactly once, in dependency order, every send has its receive,
   the stages' lists run to the end together without deadlock (sends are
   buffered), and the optimizer step comes last. The message says what is
   wrong, where. report (may be NULL) gets the peak activations in flight. */
PTRAINDEF pt_status pt_schedule_check(const pt_schedule *s, pt_schedule_report *report);
/* The schedule as a text grid, one row per stage, one column per unit-time
   slot, the way the papers draw it ("F3" forward of micro-batch 3, "B2"
   backward, twice as long unless "W2", its weight gradient, is split off;
   chunk letters a, b, ... when v > 1).
   Writes at most cap bytes (NUL-terminated) and returns the length needed. */
PTRAINDEF size_t pt_schedule_format(const pt_schedule *s, char *buf, size_t cap);

/* A timeline: what each track (a rank, or a stage) did when, from a real
   run or from a schedule's unit-time run. The Chrome trace and SVG writers
   (>>io) draw it; pt_plan_simulate fills the same structure. */
typedef struct pt_trace_event {
    int track, kind;    /* pt_action_kind */
    int micro, chunk;   /* -1 when not about a micro-batch */
    int at;             /* order, not time: an action's ordinal in its track's list;
                           a transfer's, the last action its track had begun when it
                           began (-1: before the step, as a gather the last update
                           started) */
    double start, dur;  /* seconds */
} pt_trace_event;

typedef struct pt_trace {
    int ntracks, count, cap;
    pt_trace_event *events;
    const char *title;  /* shown in the SVG and the trace's metadata (not owned) */
    const char *track_name; /* "stage" or "rank": tracks are "stage 0", ... */
    const char *unit_name;  /* the SVG's time unit (NULL: "ms", for measured and
                               simulated steps; pt_schedule_trace: "time units") */
    double unit;            /* seconds in one of it (0: 1e-3) */
    void *alloc_ctx;
} pt_trace;

/* Events beside the schedule's actions (kind >= PT_ACT_COUNT): communication
   that runs while the rank computes, drawn in a lane of its own under each
   track; micro is the gradient bucket. Real runs record a started operation
   from its start to the test or wait that found it done (pt_step_desc.trace:
   a gather the previous step's update started has a start before 0). */
enum {
    PT_TRACE_DP_REDUCE = PT_ACT_COUNT, /* a bucket's gradients over the dp group */
    PT_TRACE_DP_GATHER,                /* a bucket's updated parameters (ZeRO) */
    PT_TRACE_KIND_COUNT
};
PTRAINDEF pt_status pt_trace_add(pt_trace *t, int track, int kind, int micro, int chunk, int at,
                                 double start, double dur);
PTRAINDEF void pt_trace_free(pt_trace *t);
/* Every rank's events into rank 0's t (the others' t is unchanged).
   Collective over world; times travel as floats (microseconds stay exact
   for runs of seconds). */
PTRAINDEF pt_status pt_trace_gather(pt_trace *t, pt_comm *world);
/* The schedule's unit-time run (pt_schedule_check's) as a trace, one slot
   lasting `unit` seconds (the SVG counts slots, "time units", unless t
   names a unit_name already). */
PTRAINDEF pt_status pt_schedule_trace(const pt_schedule *s, double unit, pt_trace *t);
/* Chrome trace JSON (chrome://tracing, Perfetto's legacy JSON): one thread
   per track, one complete ("X") slice per action named "F3" (micro-batch 3;
   chunk letters when there are chunks) with micro-batch, chunk and "index"
   (its ordinal, pt_trace_event.at) in its args, a transfer's with bucket and
   "started_in" (at). Written atomically. */
PTRAINDEF pt_status pt_trace_write_chrome(const pt_trace *t, const char *path);
/* The same timeline as an SVG picture: a row per track, forward, backward,
   weight-gradient and communication in their own colours, idle time grey;
   a box wide enough is labelled with its micro-batch (and chunk, when there
   are several: "F3b", or "3b" alone in a narrower one); times in the
   trace's unit; a legend of the kinds drawn. */
PTRAINDEF pt_status pt_trace_write_svg(const pt_trace *t, const char *path);


/* ======================================================================== */
/* >>exec                                                                    */
/* ======================================================================== */

/* The executor: the one interpreter of a schedule's action lists on real
   tensors, for every layout. Without a pipeline the step is a one-stage
   schedule whose micro-batches are gradient accumulation, so serial, tp,
   dp, pp and any mix take the same road: each F, B, W, send and receive of
   this stage's list in order, then OPT: the two copies of a tied wte summed,
   the gradients averaged over the dp group (ZeRO 1, 2: into this rank's
   shard), the loss shared, and the optimizer step if asked for. */

/* One step's batch and options. */
/* When a step reduces its gradient buckets over the data-parallel group. */
typedef enum pt_overlap {
    PT_OVERLAP_DEFAULT = 0, /* PT_OVERLAP_ON */
    PT_OVERLAP_ON,  /* ZeRO 0 and 1: each layer's bucket is started (all-reduce, or
                       reduce-scatter into the shard) as soon as the step's last
                       backward of the layer (or its W) finished it, in backward's
                       order, and waited at the optimizer step; the first layer's in
                       two (its MLP half started between W's halves), and after its B
                       the embeddings' (one stage, wte tied: the wte rows no rank's
                       token reads right after the head's backward, the rows read and
                       wpe after the embedding's). ZeRO 1 and 2: each
                       bucket's parameter all-gather after the update runs on behind
                       the next forward, which waits for a layer's just before using
                       it. Pipelines: each stage's next activation and gradient
                       receives posted ahead, its sends started. Tested every 2 ms
                       from the GEMMs (what moves MPI on); the results are the same
                       bits as OFF's */
    PT_OVERLAP_OFF  /* every bucket after backward, every gather in the update, every
                       pipeline message when its action comes */
} pt_overlap;       /* (ZeRO 2, and 3 on one stage, reduce-scatter each bucket inside
                       backward either way; with ON a layer's runs behind the next
                       layer's B) */

typedef struct pt_step_desc {
    const int *inputs, *targets; /* (B, T) row-major: this rank's rows */
    int B, T;                 /* B = place.micro micro-batches of B/micro rows, each at
                                 most the model's B; T at most the model's T */
    const pt_adamw_config *adamw; /* the optimizer step at the end of the step's
                                     schedule; NULL: gradients only, for
                                     pt_gpt_clip_grad_norm, pt_gpt_check_step and
                                     pt_gpt_adamw_step by the caller */
    float lr;                 /* with adamw */
    float clip;               /* with adamw: clip the gradient norm to this (0: no clip) */
    float *logits;            /* optional (ranks holding the head): (B*T, vocab_size),
                                 the whole vocabulary, gathered over tp */
    float *losses;            /* optional (ranks holding the head): (B*T) each token's loss
                                 (Chimera: its stages 0 and p-1 both hold a head; each
                                 computes half the micro-batches and they swap them: pass
                                 these on both or on neither) */
    struct pt_trace *trace;   /* optional: every action's measured start and time,
                                 track = world rank (pt_trace_gather collects them) */
    /* optional: called on every rank when the step's gradients are ready,
       before clipping and the numerical guard (tests plant faults here) */
    void (*on_grads)(pt_gpt *m, void *ctx);
    void *on_grads_ctx;
    pt_overlap overlap;       /* the dp gradient reduction behind backward (default on) */
} pt_step_desc;

typedef struct pt_step_result {
    float loss;          /* mean over the batch (and the dp group); equal on every rank */
    float grad_norm;     /* with adamw: before clipping */
    int skipped;         /* with adamw: 1 if the loss or a gradient was not finite and
                            the update was skipped (weights and moments unchanged) */
    char bad_tensor[64]; /* when skipped: the first non-finite gradient's tensor in
                            backward's order, or "no gradient" */
} pt_step_result;

/* One training step: forward and backward of desc->B rows in place.micro
   micro-batches through this stage's schedule, the gradient sync, and with
   desc->adamw clipping, the numerical guard (pt_gpt_check_step) and AdamW.
   Collective over the grid. res may be NULL; loss is also in m->loss. */
PTRAINDEF pt_status pt_gpt_step(pt_gpt *m, const pt_step_desc *desc, pt_step_result *res);
/* Waits for the parameter all-gathers an overlapped ZeRO update left under
   way (PT_OVERLAP_ON), so that m->params is whole: the next forward, and
   every ptrain call that reads or writes the parameters, does it itself;
   call it before reading m->params yourself (ZeRO 3: m->params is this
   rank's shards, bucket by bucket; pt_gpt_gather gives them whole). */
PTRAINDEF pt_status pt_gpt_sync_params(pt_gpt *m);
/* The mean loss of a batch, forward only (desc: inputs, targets, B, T,
   logits, losses): each micro-batch through the virtual stages in order, one
   activation slot at a time. Every rank gets the loss in *loss. */
PTRAINDEF pt_status pt_gpt_eval(pt_gpt *m, const pt_step_desc *desc, float *loss);

/* The building blocks of a serial loop (the quick start), on the same
   chunk functions as the step; they refuse pipeline stages.
   Forward over inputs (B,T); with targets (may be NULL) also the mean loss
   (under data parallelism the mean over the dp group's batches). */
PTRAINDEF pt_status pt_gpt_forward(pt_gpt *m, const int *inputs, const int *targets, int B,
                                   int T);
/* Gradients of the mean loss of the step's micro-batches. The first
   backward of a step (grad_accum of them) overwrites, the others add; after
   the last one the data-parallel group averages them (ZeRO 1, 2: each rank
   keeps its shard), ready for the optimizer. */
PTRAINDEF pt_status pt_gpt_backward(pt_gpt *m);
/* Logits of the last forward over the whole vocabulary, (N, vocab_size).
   Collective over the tensor-parallel group. */
PTRAINDEF pt_status pt_gpt_gather_logits(const pt_gpt *m, float *out);

/* sqrt(sum of squared gradients) into *norm; if max_norm > 0 and the norm
   exceeds it, scales gradients by max_norm/norm. Collective over the grid. */
PTRAINDEF pt_status pt_gpt_clip_grad_norm(pt_gpt *m, float max_norm, float *norm);
PTRAINDEF pt_status pt_gpt_adamw_step(pt_gpt *m, const pt_adamw_config *cfg, float lr);
/* The numerical guard, between pt_gpt_clip_grad_norm and pt_gpt_adamw_step.
   Collective over the grid's world, so every rank gets the same answer:
   *bad = 0 if the step's loss and gradient norm are finite on every rank.
   Else *bad = 1 and where (n chars; may be NULL) names the first tensor whose
   gradient holds a NaN or infinity, in the order backward computes them (the
   last layer first; any rank's part counts): "h.3.mlp.c_fc.weight", or
   "no gradient" when they are all finite (an overflowing norm). The caller
   then skips pt_gpt_adamw_step, which leaves weights and AdamW state as they
   were; the next step's backward overwrites the gradients. */
PTRAINDEF pt_status pt_gpt_check_step(pt_gpt *m, float loss, float norm, int *bad, char *where,
                                      size_t n);
/* This rank's gradient of the named tensor as the optimizer will read it
   (under ZeRO the first span of it in this rank's shard), and its length in
   *n; NULL if this rank holds none of it. */
PTRAINDEF float *pt_gpt_grad_of(pt_gpt *m, const char *name, size_t *n);


/* ======================================================================== */
/* >>sim                                                                     */
/* ======================================================================== */

/* The simulator: the same model build (meta: sizes only) and the same
   schedules as a real run, with each action's time taken from a cost model
   of a device instead of measured. Per action: GEMMs from their FLOPs at an
   efficiency that rises with each matrix dimension, memory-bound kernels
   from their bytes, collectives from a link model (ring or tree, latency +
   bytes/bandwidth, the slower link when a group spans nodes). */

/* How the modeled ranks run a layer. */
typedef enum pt_exec_kind {
    PT_EXEC_DEFAULT = 0, /* the profile's */
    PT_EXEC_MEGATRON,    /* Megatron-LM: fp16/bf16 weights, gradients and activations, fp32
                            master weights and Adam state (2+2+12 bytes a parameter), fused
                            kernels, dropout, the softmax stored unless a fused attention
                            rate is given; activations as Korthikanti et al. 2022 count them */
    PT_EXEC_PTRAIN       /* this header's executor: fp32 weights and messages (GEMMs at the
                            profile's precision), ptrain's kernels and activation
                            slots (as pt_gpt_init lays them out at that precision) */
} pt_exec_kind;

/* A device, its node and its links. */
typedef struct pt_hw {
    char name[32];
    double peak_flops;   /* dense FLOP/s of one device at the training precision */
    double gemm_eff;     /* fraction of peak that large, well-shaped GEMMs reach */
    double gemm_dim;     /* each GEMM dimension d runs at d / (d + gemm_dim) of that */
    double attn_flops;   /* FLOP/s of a fused attention core (no s x s matrix in memory);
                            0: batched GEMMs and a stored softmax */
    double mem_bw;       /* bytes/s that memory-bound kernels reach */
    double mem_bytes;    /* memory of one device */
    double kernel_s;     /* fixed cost of one kernel launch */
    int per_node;        /* devices in a node */
    double intra_bw, intra_lat; /* one device's bytes/s and latency to a peer in its node */
    double inter_bw, inter_lat; /* across nodes: the node's network bandwidth / per_node */
    int cores;           /* > 0: ranks of one node share these CPU cores (this machine) */
    pt_exec_kind exec;   /* how ranks run (PT_EXEC_MEGATRON or PT_EXEC_PTRAIN) */
    /* this machine: the rates of a rank with one thread, which ranks run at
       when there are as many ranks as cores or more (0: scale the above) */
    double core_flops, core_gemm_eff, core_gemm_dim, core_attn_flops, core_mem_bw, core_kernel_s;
    double instr_flops;  /* this machine: its cores' instruction peak at the precision below
                            (fp32: FMA; bf16: AMX or vdpbf16ps), the ceiling of any GEMM, for
                            MFU (0: not measured) */
    pt_precision precision; /* this machine: the GEMMs' precision its rates were measured at
                            (pt_gpt_desc.precision; 0: fp32) */
    double comm_cpu;     /* this machine: core seconds a collective costs the rank's compute
                            per byte it passes ((k-1)/k of the buffer for a reduce-scatter or
                            all-gather, twice for an all-reduce) when it runs behind the
                            compute: TCP in the kernel, MPI's progress calls (0: none, as with
                            RDMA; pt_hw_calibrate_links measures it; thread ranks: all of
                            the link's time, 1 / intra_bw) */
    double flash_eff;    /* a fused causal attention kernel (FlashAttention), forward and
                            backward, as a fraction of peak_flops counting the FLOPs it does
                            (half the s x s square); 0: attn_flops, else plain attention */
    double tp_exposed;   /* with tp_overlap: the share of sequence parallelism's all-gathers
                            and reduce-scatters left exposed when split and pipelined against
                            the GEMMs they feed (0: all of it, no overlap) */
    double grad_bytes;   /* bytes of a gradient element kept and reduced over dp (Megatron's
                            bf16 runs accumulate and reduce fp32 main gradients: 4); 0: the
                            activations' element */
    double comm_sm;      /* the share of the device's compute a collective running behind it
                            takes (NCCL's channels are thread blocks on the SMs); applied
                            where a plan overlaps ZeRO 3's gathers with compute (0: none) */
} pt_hw;

/* "a100-80g", "h100-80g", "h200", "mi250x", "mi300x" (sources beside each in the code). */
PTRAINDEF pt_status pt_hw_preset(const char *name, pt_hw *out);
PTRAINDEF const char *pt_hw_preset_names(void);
/* A profile as "key = value" lines (the keys are the field names); save
   writes every field, load checks every value and the file's units. */
PTRAINDEF pt_status pt_hw_save(const pt_hw *hw, const char *path);
PTRAINDEF pt_status pt_hw_load(const char *path, pt_hw *out);
/* This machine as a profile ("local", exec ptrain) for models at the given
   precision (0: fp32): GEMM GFLOP/s (pt_sgemm, or pt_gemm_bf16 for bf16)
   over sizes 64..2048 (peak_flops the 2048^3 rate, gemm_dim fitted to the
   smaller ones), the instruction peak of that precision (instr_flops, what
   MFU is measured against), memory bandwidth (y += s*x), the rate of
   ptrain's attention kernels at that precision, and all-reduce latency and
   bandwidth between two ranks: of the threads backend when world is NULL,
   else of world (an MPI world of two or more processes; collective, rank 0
   times the kernels alone, with every core). Takes a few seconds. */
PTRAINDEF pt_status pt_hw_calibrate(pt_hw *out, pt_comm *world, pt_precision precision);
/* The links alone: world's all-reduce latency and bandwidth (two or more
   ranks; collective) into hw's intra_ and inter_ fields, and what a started
   all-reduce costs a rank that computes meanwhile (comm_cpu), its other
   fields kept: a profile's kernels on another network. Rank 0's figures, on
   every rank. Takes a few seconds. */
PTRAINDEF pt_status pt_hw_calibrate_links(pt_hw *hw, pt_comm *world);
/* Seconds of batch GEMMs (M x K) x (K x N) on the device, elem bytes an element. */
PTRAINDEF double pt_hw_gemm_seconds(const pt_hw *hw, double M, double N, double K, double batch,
                                    double elem);
typedef enum pt_coll_kind {
    PT_COLL_NONE = 0,
    PT_COLL_ALL_REDUCE,
    PT_COLL_REDUCE_SCATTER,
    PT_COLL_ALL_GATHER,
    PT_COLL_P2P           /* one message to one peer */
} pt_coll_kind;
/* Seconds of a collective over n ranks of which at most per_node share a
   node (n == per_node: one node), bytes the whole buffer: the faster of a
   ring and a tree, as NCCL picks (PT_COLL_NONE: 0). */
PTRAINDEF double pt_hw_comm_seconds(const pt_hw *hw, pt_coll_kind kind, double bytes, int n,
                                    int per_node);

/* The attention core a plan models. */
typedef enum pt_plan_attention {
    PT_ATTN_DEFAULT = 0,
    PT_ATTN_PLAIN,        /* batched GEMMs, the s x s scores, softmax and dropout stored */
    PT_ATTN_FLASH         /* one fused kernel (FlashAttention): no s x s in memory, its time
                             from the FLOPs it does at the profile's flash_eff */
} pt_plan_attention;

/* How a plan's context parallelism moves K and V. */
typedef enum pt_plan_cp_comm {
    PT_CP_DEFAULT = 0,    /* RING */
    PT_CP_RING,           /* each next K/V block passed round a ring behind the block computed
                             (Liu et al. 2023; Megatron-Core; ptrain's executor) */
    PT_CP_ALLGATHER       /* K and V all-gathered before attention, exposed, and again in
                             backward with dK and dV reduce-scattered after it (Llama 3,
                             Dubey et al. 2024, sec. 3.3.2: "the all-gather communication
                             latency is exposed in the critical path"); GPU profiles only */
} pt_plan_cp_comm;

/* How a plan spreads the layers over the pipeline's blocks (pp x chunks). */
typedef enum pt_plan_split {
    PT_SPLIT_DEFAULT = 0, /* EMBED_LOSS on a GPU profile when it, and not EVEN, divides the
                             layers evenly (Llama 3's 126 over 16 stages, BLOOM's 70 over 12);
                             else EVEN */
    PT_SPLIT_EVEN,        /* the executor's: floor(L/V) a block, one more for the first L mod V */
    PT_SPLIT_EMBED_LOSS   /* the embedding and the loss counted as a layer each: (L + 2)/V a
                             block, the first block and the last one layer fewer (Llama 3,
                             Dubey et al. 2024, sec. 3.3.2; Megatron-Core's
                             --account-for-embedding/loss-in-pipeline-split; DeepSpeed's
                             --pp-partition-method type:transformer|embedding, BLOOM's) */
} pt_plan_split;

/* One planned training run: the model and its layout as the executor takes
   them (model), on gpus devices in a tp x pp x cp x dp grid. */
typedef struct pt_plan_desc {
    pt_gpt_desc model;    /* the model and its layout, as pt_gpt_init takes them:
                               config    the sizes (n_layer, n_embd, n_head, vocab_size)
                                         and the block's choices (zero: GPT-2's); its
                                         block_size is taken as seq
                               batch     the micro-batch: sequences a pipeline pass
                               seq       the sequence length
                               zero      0..3 (3: the weights sharded too, gathered
                                         a bucket at a time; with pp = 1, as the
                                         executor runs it)
                               schedule  0: 1F1B as Megatron-LM, or interleaved when
                                         chunks > 1
                               chunks    interleaved pipeline: chunks of layers per
                                         stage (0: the schedule's own, 2 for ZB-V and
                                         Chimera, else 1)
                               recompute PT_RECOMPUTE_*
                               bucket_bytes the gradient buckets (0: a layer each);
                                         the messages are these sizes at the
                                         executor's element size
                             precision is the profile's (pt_hw.precision, what its rates
                             were measured at), whatever is set here; grid, meta,
                             inference, grad_accum and schedule_report are the
                             simulator's, set for each stage's meta build */
    int tp, pp, gpus;     /* data parallelism is gpus / (tp * pp) */
    int batch;            /* global batch in sequences, dp x model.batch x micro-batches
                             a pipeline */
    pt_exec_kind exec;    /* PT_EXEC_DEFAULT: the profile's */
    double train_tokens;  /* > 0: the result says how long these take */
    pt_overlap overlap;   /* the dp communication behind computation, as the executor
                             runs it (pt_step_desc.overlap): each gradient bucket reduced
                             once the step's last backward finished it, ZeRO's parameter
                             gathers behind the next forward. Default: on for
                             PT_EXEC_PTRAIN (the executor's default), off for
                             PT_EXEC_MEGATRON (Megatron-LM 2021 reduced after backward) */
    /* Today's recipe; every default is the 2021 one (Megatron-LM, Narayanan et al.) */
    int cp;               /* context parallelism: ranks sharing each sequence (0, 1: none);
                             gpus = tp x pp x cp x dp. Each holds two chunks i, 2cp-1-i (the
                             load-balanced causal split); attention passes K/V blocks round
                             a ring behind the block computed; gradients reduced over cp x dp */
    pt_plan_attention attention; /* PT_ATTN_DEFAULT: plain (a local profile: its measured
                             attention kernels) */
    pt_overlap tp_overlap; /* ON: tp's collectives pipelined against their GEMMs, the
                             profile's tp_exposed share left (Megatron's --tp-comm-overlap);
                             default: as overlap is set (ON: today's recipe, every
                             overlap), else off */
    pt_overlap pp_overlap; /* ON: pipeline sends behind compute (only their launch on the
                             stage's time); default: as tp_overlap */
    pt_plan_split pp_split; /* the layers over the pipeline's blocks (PT_SPLIT_*) */
    pt_plan_cp_comm cp_comm; /* how cp moves K and V (PT_CP_*; default the ring) */
    int grad_accum_pass;  /* 1: DeepSpeed's BF16_Optimizer under its pipeline engine (BLOOM):
                             after each micro-batch's backward the stage's bf16 gradients
                             added into fp32 ones (update_hp_grads) and cleared before the
                             next, 12 bytes a parameter through memory; 0: Megatron's, the
                             weight-gradient GEMMs accumulating into fp32 (no pass) */
} pt_plan_desc;

typedef struct pt_plan_mem {
    double params, grads, optimizer, activations, total; /* bytes on one rank */
    double transient; /* beside total, while one layer's backward runs: its
                         recomputed activations (full recomputation) */
} pt_plan_mem;

/* One pipeline stage of a plan (every tp x dp rank of it alike). */
typedef struct pt_plan_stage {
    int layers;                /* transformer layers held (all chunks) */
    pt_plan_mem mem;
    double busy_s, hw_flops;   /* its F, B, W and sends in a step; their FLOPs */
    double tp_bytes, pp_bytes, dp_bytes; /* collective buffers and messages a step */
} pt_plan_stage;

/* What a simulated step costs. FLOPs are counted per action as they run:
   hardware FLOPs include recomputation (Megatron-LM's Table 1 counts them:
   96 B s l h^2 (1 + s/6h + V/16lh) with full recomputation), model FLOPs do
   not (72 B s l h^2 (1 + s/6h + V/12lh)). */
typedef struct pt_plan_result {
    double step_time;          /* seconds per optimizer step */
    double hw_flops, model_flops; /* per step, all devices */
    double tflops_per_gpu, model_tflops_per_gpu, percent_of_peak;
    double bubble_fraction;    /* of the pipeline's time, stages idle */
    double comm_exposed;       /* seconds a step the busiest rank spends communicating */
    double compute_s, tp_comm_s, pp_comm_s, dp_comm_s, optimizer_s; /* that rank's step
                                  (dp_comm_s: what the step waits for) */
    double dp_hidden_s;        /* that rank's dp communication behind computation */
    int dp_buckets;            /* the gradient buckets it reduces (1: the whole buffer) */
    double tokens_per_s, train_seconds;
    pt_plan_mem mem;           /* the rank needing most memory */
    int mem_rank, dp, micro_batches; /* its world rank; dp; micro-batches per pipeline */
    pt_schedule_kind schedule; /* the one run (0 resolved) */
    int chunks;                /* chunks a stage (0 resolved: the schedule's own) */
    pt_plan_split pp_split;    /* the split run (PT_SPLIT_DEFAULT resolved: _EVEN or
                                  _EMBED_LOSS) */
    int fits;                  /* mem.total <= the device's memory */
    double build_seconds;      /* time to build every rank's meta model */
    pt_plan_stage stage[64];   /* per pipeline stage, [0, pp) */
} pt_plan_result;

/* Checks the plan (divisibility, memory) and simulates one step. A plan
   that does not fit fails with "out of memory on rank r: needs X GiB, has
   Y GiB" and still fills *r. trace (may be NULL) gets each stage's actions
   in seconds, one track per pipeline stage (the ranks of a stage run
   alike). */
PTRAINDEF pt_status pt_plan_simulate(const pt_plan_desc *d, const pt_hw *hw, pt_plan_result *r,
                                     pt_trace *trace);
/* The same with each action kind's modeled time multiplied by
   scale[kind] (PT_ACT_COUNT entries; NULL: as modeled): what the step would
   take were the backward twice as fast (scale[PT_ACT_B] = 0.5) or the
   activations' sends free (scale[PT_ACT_SEND_ACT] = 0), and which costs
   the step is sensitive to at all. */
PTRAINDEF pt_status pt_plan_simulate_scaled(const pt_plan_desc *d, const pt_hw *hw,
                                            const double *scale, pt_plan_result *r,
                                            pt_trace *trace);

/* Strategy search: every (tp, pp, chunks, micro-batch, ZeRO, recompute,
   schedule: 1F1B or interleaved, ZB-H1, ZB-H2, ZB-V) for
   d's model, gpus and batch (d's own tp, pp and model.batch, zero, chunks,
   recompute, schedule ignored; model.bucket_bytes kept) that divides and
   fits, simulated; the best n (by throughput) into best[] and their descs
   into best_desc[]. why[] (may be NULL) counts the losers: [0] does not
   divide, [1] out of memory, [2] simulated slower. Returns how many fit. */
PTRAINDEF int pt_plan_search(const pt_plan_desc *d, const pt_hw *hw, pt_plan_desc *best_desc,
                             pt_plan_result *best, int n, int why[3]);


/* ======================================================================== */
/* >>text                                                                    */
/* ======================================================================== */

/* Byte-level BPE, as GPT-2, GPT-NeoX, LLaMA 3 and tiktoken's cl100k use it.
   A pre-tokenizer splits the text into pieces; each piece starts as one token
   per byte and the adjacent pair with the lowest merge rank is merged (the
   leftmost on a tie) until no pair has a merge. With ignore_merges a piece
   that is itself a token becomes that token first (tiktoken, LLaMA 3).
   FILES. GPT-2's encoder.json (byte-level string -> id) + vocab.bpe (one
   merge "a b" a line), or a Hugging Face tokenizer.json with a BPE model over
   byte-level strings (GPT-2's bytes_to_unicode alphabet), merges as "a b"
   strings or ["a", "b"] arrays, added tokens, and a ByteLevel pre-tokenizer
   or a Split of one of the two patterns below; no normalizer.
   PIECES. The two split patterns, matched by hand (no regex engine) with
   Unicode classes from a table generated from the Unicode data
   (scripts/gen_unicode.py): \p{L} letters, \p{N} numbers, \s White_Space.
     GPT2   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
     CL100K (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
            ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+   (cl100k, LLaMA 3)
   A byte that does not start a valid UTF-8 character (strict: no overlong
   forms, surrogates or code points above U+10FFFF) is one character of the
   class "other", as U+FFFD would be; encoding and decoding are exact on any
   bytes: decode(encode(x)) == x.
   SPECIAL TOKENS (added tokens, "<|endoftext|>") are matched in the text only
   when the caller allows them, as tiktoken's encode(allowed_special=...);
   otherwise their text is encoded as ordinary text (encode_ordinary).
   A loaded tokenizer is read-only: encode and decode may run on many threads. */
typedef enum pt_pretok {
    PT_PRETOK_DEFAULT = 0, /* in a desc: the file's own */
    PT_PRETOK_GPT2,
    PT_PRETOK_CL100K
} pt_pretok;

typedef struct pt_tokenizer {
    int n_vocab;        /* ids are 0 .. n_vocab-1 (some may be unused: cl100k has holes) */
    int n_merges;
    int n_special;
    pt_pretok pretok;
    int ignore_merges;  /* a piece that is a token is that token */
    int eot;            /* id of "<|endoftext|>", -1 when there is none */
    uint64_t fingerprint; /* hash of vocabulary, merges, specials and pattern */
    /* tables (private) */
    uint32_t *tok_off;  /* token i is tok_bytes[tok_off[i] .. tok_off[i+1]) */
    unsigned char *tok_bytes;
    unsigned char *tok_kind; /* 0 unused id, 1 vocabulary, 2 special */
    int byte_id[256];
    uint32_t *vocab_hash;    /* bytes -> id+1, open addressing */
    uint32_t vocab_mask;
    uint64_t *merge_hash;    /* pairs: key (a << 32 | b), value (rank << 32 | merged id) */
    uint32_t merge_mask;
    int *special;            /* special ids, longest first */
    void *alloc_ctx;
} pt_tokenizer;

/* path: a tokenizer.json, or a directory holding one (a Hugging Face model's),
   or GPT-2's encoder.json and vocab.bpe. */
PTRAINDEF pt_status pt_tokenizer_load(pt_tokenizer *tk, const char *path);
PTRAINDEF pt_status pt_tokenizer_parse_hf(pt_tokenizer *tk, const void *json, size_t n);
PTRAINDEF pt_status pt_tokenizer_parse_gpt2(pt_tokenizer *tk, const void *encoder_json, size_t n_enc,
                                            const void *vocab_bpe, size_t n_bpe);
PTRAINDEF void pt_tokenizer_free(pt_tokenizer *tk);
PTRAINDEF size_t pt_tokenizer_memory(const pt_tokenizer *tk); /* bytes held */
/* Token id's bytes, NULL (and *len 0) for an id that is not a token. */
PTRAINDEF const unsigned char *pt_tokenizer_bytes(const pt_tokenizer *tk, int id, size_t *len);
PTRAINDEF int pt_tokenizer_find(const pt_tokenizer *tk, const void *bytes, size_t len); /* id or -1 */
/* The merge of tokens a and b: its rank (0 first: its place in the merges
   list; the lowest merges first) and, in *merged (may be NULL), the token
   it makes; -1 when a and b do not merge. */
PTRAINDEF int pt_tokenizer_merge(const pt_tokenizer *tk, int a, int b, int *merged);
/* The pre-tokenizer (PIECES above), without a tokenizer: the end of the
   piece of text[0..n) that starts at byte at, under pat (0: GPT2); n when
   at >= n. The pieces start at 0 and at each end:
     for (i = 0; i < n; i = pt_pretok_piece_end(pat, text, n, i)) ...
   BPE never merges across them. */
PTRAINDEF size_t pt_pretok_piece_end(pt_pretok pat, const void *text, size_t n, size_t at);
/* 1 if text[0..n) may be cut at byte at with the pieces of text[0..at) and
   of text[at..n) the whole text's under both patterns, so that the two
   parts encode apart to the whole text's ids (where
   pt_tokenizer_encode_parallel cuts its chunks; a streaming encoder may cut
   there too); 0 for most piece boundaries, which it does not recognize. */
PTRAINDEF int pt_pretok_safe_cut(const void *text, size_t n, size_t at);
/* text -> ids; ids needs room for n (every token holds at least one byte). */
PTRAINDEF pt_status pt_tokenizer_encode(const pt_tokenizer *tk, const void *text, size_t n,
                                        int allow_special, int *ids, size_t *n_ids);
/* The same on threads (0: all cores; 1: the whole text at once), over
   chunks of about 1 MB cut where the pieces are the same as the whole
   text's; progress(done, total, ctx), if given, is called as chunks finish
   (one call at a time). */
PTRAINDEF pt_status pt_tokenizer_encode_parallel(const pt_tokenizer *tk, const void *text, size_t n,
                                                 int allow_special, int threads, int *ids,
                                                 size_t *n_ids,
                                                 void (*progress)(size_t done, size_t total, void *ctx),
                                                 void *progress_ctx);
/* ids -> bytes. With out NULL only *n_out (the bytes needed) is computed;
   an id that is not a token is PT_ERR_RANGE. */
PTRAINDEF pt_status pt_tokenizer_decode(const pt_tokenizer *tk, const int *ids, size_t n, void *out,
                                        size_t cap, size_t *n_out);

/* Streaming output: tokens may split a UTF-8 character; put() passes on the
   bytes up to the last complete character and holds an incomplete tail (at
   most 3 bytes) for the next call; bytes that can never complete a character
   pass through as they are. out needs room for n + 3 bytes. */
typedef struct pt_utf8_stream { unsigned char held[4]; int n_held; } pt_utf8_stream;
PTRAINDEF size_t pt_utf8_stream_put(pt_utf8_stream *s, const void *bytes, size_t n, char *out);
PTRAINDEF size_t pt_utf8_stream_flush(pt_utf8_stream *s, char *out);

/* A text file as tokens (pt_tokens of >>io, vocab_size = tk->n_vocab <= 65536),
   through a cache: an llm.c token file at desc->cache_path (NULL: none) whose
   header also records the tokenizer's fingerprint and the text's size and
   hash (header ints 3..9, which llm.c leaves zero). A cache that matches is
   read; one that does not (another text, another tokenizer) is refused and
   rewritten, unless cache_read_only; t->cache says which happened. desc NULL:
   no cache, all cores. */
typedef enum pt_text_cache {
    PT_CACHE_NONE = 0, /* no cache_path (or not from a text), or a read-only one that did
                          not match: tokenized, nothing written */
    PT_CACHE_MADE,     /* tokenized; there was no cache, now there is */
    PT_CACHE_READ,     /* the cache matched: read, nothing tokenized */
    PT_CACHE_REMADE    /* the cache was of another text or tokenizer: tokenized, rewritten */
} pt_text_cache;
typedef struct pt_text_desc {
    const char *cache_path; /* the token file caching the tokens (NULL: none) */
    int cache_read_only;    /* 1: a matching cache is read; none is written */
    int threads;            /* as in pt_tokenizer_encode_parallel (0: all cores) */
    void (*progress)(size_t done, size_t total, void *ctx); /* as chunks are encoded, if set */
    void *progress_ctx;
} pt_text_desc;
struct pt_tokens;
PTRAINDEF pt_status pt_tokens_from_text(struct pt_tokens *t, const pt_tokenizer *tk,
                                        const char *text_path, const pt_text_desc *desc);
/* llm.c token file of ids: version 1 (uint16 tokens) when every id < 65536;
   else version 2 (ptrain's variant for bigger vocabularies: uint32 tokens,
   the same 256-int header). stamp: NULL, or 7 ints for header[3..9]. Atomic. */
PTRAINDEF pt_status pt_tokens_write_llmc(const char *path, const int *ids, size_t n,
                                         const int32_t *stamp);

/* BPE training: learns merges from text as GPT-2 did. The text is cut into
   pieces by the pre-tokenizer (on all cores, over chunks as in
   pt_tokenizer_encode_parallel) and each distinct piece counted; then,
   repeatedly, the most frequent adjacent pair of tokens over all pieces
   becomes a new token (ties: the smaller pair of ids), until the vocabulary
   has vocab_size tokens or no pair occurs min_frequency times. Ids: 0..255
   the bytes in byte order, then the merges in order, then the specials.
   Deterministic: the same text and desc give the same tokenizer whatever the
   thread count. */
typedef struct pt_bpe_train_desc {
    int vocab_size;                /* 0: 4096 (bytes + merges + specials) */
    pt_pretok pretok;              /* 0: GPT2 */
    int min_frequency;             /* 0: 2 */
    int threads;                   /* 0: all cores */
    const char *const *special;    /* NULL: {"<|endoftext|>"} */
    int n_special;
    void (*progress)(int merges, int total, void *ctx); /* every 1000 merges, if set */
    void *progress_ctx;
} pt_bpe_train_desc;
PTRAINDEF pt_status pt_bpe_train(pt_tokenizer *tk, const void *text, size_t n,
                                 const pt_bpe_train_desc *desc);
/* Writes tk as a Hugging Face tokenizer.json (merges as "a b" strings),
   which pt_tokenizer_load and Hugging Face tokenizers read back. */
PTRAINDEF pt_status pt_tokenizer_save(const pt_tokenizer *tk, const char *path);
/* GPT-2's byte-level spelling of bytes[0..n) (bytes_to_unicode: each byte
   one printable character, a space "\xc4\xa0", U+0120), as the strings of
   encoder.json, vocab.bpe and tokenizer.json spell tokens: UTF-8 into out
   (room for 2n; no NUL added); returns the bytes written. */
PTRAINDEF size_t pt_bytelevel_encode(const void *bytes, size_t n, char *out);

/* ======================================================================== */
/* >>io                                                                      */
/* ======================================================================== */

/* The whole file at path: *data (its *size bytes) is allocated with
   PTRAIN_MALLOC(size, alloc_ctx) -- free it with PTRAIN_FREE(data,
   alloc_ctx), free() by default. On failure (cannot open, read or
   allocate: the message names the file) *data is NULL and *size 0. */
PTRAINDEF pt_status pt_file_read(const char *path, unsigned char **data, size_t *size,
                                 void *alloc_ctx);

/* safetensors: u64 header length N, N bytes of JSON, data. Every size and
   offset is checked before use.
   CHECKSUMS. ptrain's writer adds to __metadata__ a 64-bit checksum (pt64,
   16 hex digits) of each tensor -- of its name, dtype, shape and bytes --
   under "pt64:<name>", and one of the other metadata under
   "pt64:__metadata__". The parser verifies every one when a file has them
   (a flipped byte anywhere in the data or the metadata is a PT_ERR_FORMAT
   naming the tensor), then drops them from meta; files without them (other
   writers, older ptrain) load unverified, with checksummed = 0. */
typedef struct pt_st_tensor {
    const char *name;
    pt_dtype dtype;
    int ndim;
    int64_t shape[PT_MAX_DIMS];
    uint64_t begin, end;       /* relative to the data buffer */
    const unsigned char *data; /* file bytes, possibly unaligned */
} pt_st_tensor;

typedef struct pt_st_meta { const char *key, *value; } pt_st_meta;

typedef struct pt_safetensors {
    unsigned char *file; /* owned when loaded from a path */
    size_t file_size;
    int n_tensors, n_meta;
    int checksummed;     /* 1: the metadata and every tensor passed their pt64
                            checksums; 0: the file has none (another writer, or
                            ptrain before checksums) and was not verified */
    pt_st_tensor *tensors;
    pt_st_meta *meta;
    char *strings;
    void *alloc_ctx;
} pt_safetensors;

PTRAINDEF pt_status pt_st_load(pt_safetensors *st, const char *path);
/* Parses bytes in memory; st borrows data, which must outlive it. */
PTRAINDEF pt_status pt_st_parse(pt_safetensors *st, const void *data, size_t size);
PTRAINDEF void pt_st_free(pt_safetensors *st);
PTRAINDEF const pt_st_tensor *pt_st_find(const pt_safetensors *st, const char *name);
PTRAINDEF const char *pt_st_meta_get(const pt_safetensors *st, const char *key);
/* Copies a tensor into dst as float32 (from F32, F16 or BF16), after checking
   that its shape equals the expected one. */
PTRAINDEF pt_status pt_st_read_f32(const pt_safetensors *st, const char *name, float *dst,
                                   int ndim, const int64_t *shape);
PTRAINDEF pt_status pt_st_read_i32(const pt_safetensors *st, const char *name, int *dst,
                                   int ndim, const int64_t *shape);

/* Writer: add tensors (data pointers kept, names copied) and metadata, then
   save to path atomically: "<path>.tmp", fsync, rename, fsync of the directory.
   On any error (a full disk, a read-only directory) the temporary file is
   removed and path is untouched. Metadata keys starting with "pt64:" are the
   checksums' (PT_ERR_INVALID_ARG). */
typedef struct pt_st_writer {
    int n_tensors, cap_tensors, n_meta, cap_meta;
    pt_st_tensor *tensors;
    pt_st_meta *meta;
    void *alloc_ctx;
} pt_st_writer;

PTRAINDEF void pt_st_writer_init(pt_st_writer *w);
PTRAINDEF pt_status pt_st_writer_add(pt_st_writer *w, const char *name, pt_dtype dtype,
                                     int ndim, const int64_t *shape, const void *data);
PTRAINDEF pt_status pt_st_writer_meta(pt_st_writer *w, const char *key, const char *value);
PTRAINDEF pt_status pt_st_writer_save(const pt_st_writer *w, const char *path);
PTRAINDEF void pt_st_writer_free(pt_st_writer *w);

/* Model weights by Hugging Face name: a ptrain checkpoint or a Hugging Face
   GPT-2 safetensors file (a "transformer." prefix is tolerated, attn.bias,
   attn.masked_bias and lm_head.weight are ignored). Hugging Face files carry no
   n_head: n_head_hint gives it (0: n_embd/64, as in every GPT-2); ptrain files
   store theirs and ignore the hint. */
PTRAINDEF pt_status pt_gpt_config_from_st(const pt_safetensors *st, int n_head_hint,
                                          pt_gpt_config *out);
/* The config of any model path: a ptrain checkpoint (its metadata); a
   Hugging Face model directory (its config.json, GPT-2 or LLaMA); a Hugging
   Face model.safetensors with the config.json beside it (that config.json);
   or a Hugging Face GPT-2 file alone (its shapes, n_head from the hint as in
   pt_gpt_config_from_st; a LLaMA file alone is PT_ERR_MISSING: its shapes do
   not give the heads). */
PTRAINDEF pt_status pt_gpt_config_from_file(const char *path, int n_head_hint,
                                            pt_gpt_config *out);
/* A Hugging Face config.json (text of len bytes). LLaMA's (model_type
   "llama", or none): hidden_size, intermediate_size, num_attention_heads,
   num_key_value_heads (absent: num_attention_heads), num_hidden_layers,
   vocab_size, max_position_embeddings, rms_norm_eps, rope_theta,
   tie_word_embeddings, attention_bias and mlp_bias (equal), hidden_act
   "silu", rope_scaling (null, or rope_type "llama3" with factor,
   low_freq_factor, high_freq_factor, original_max_position_embeddings).
   GPT-2's (model_type "gpt2"): n_embd, n_inner (null: 4 n_embd), n_head,
   n_layer, vocab_size, n_positions, layer_norm_epsilon, tie_word_embeddings
   (absent: tied), activation_function "gelu_new". The weights beside it
   (model.safetensors) load by their own names with pt_gpt_load_weights.
   Every missing or inconsistent field is named with its value. */
PTRAINDEF pt_status pt_gpt_config_from_hf_json(const char *text, size_t len, pt_gpt_config *out);
PTRAINDEF pt_status pt_gpt_config_from_hf_file(const char *path, pt_gpt_config *out);
/* Writes a LLaMA model (RMSNorm, rotary, SwiGLU: what LlamaForCausalLM
   expresses) as Hugging Face lays it out: dir/config.json (the fields read
   above) and dir/model.safetensors (float32 weights by their names). dir must
   exist. Collective over the model's grid (the tensors are gathered whole;
   world rank 0 writes). */
PTRAINDEF pt_status pt_gpt_save_hf(const pt_gpt *m, const char *dir);
/* Weights of a Hugging Face model directory: dir/model.safetensors, or the
   shards that dir/model.safetensors.index.json's weight_map names (every
   tensor of the model in exactly one of them). Checks every shard before
   reading any. */
PTRAINDEF pt_status pt_gpt_load_weights_hf(pt_gpt *m, const char *dir);
/* All tensors are checked before any is copied: on error m is unchanged. */
PTRAINDEF pt_status pt_gpt_load_weights_st(pt_gpt *m, const pt_safetensors *st);
/* path: a safetensors file, or a Hugging Face model directory
   (pt_gpt_load_weights_hf). */
PTRAINDEF pt_status pt_gpt_load_weights(pt_gpt *m, const char *path);

/* Token data: raw bytes (vocabulary 256), or the llm.c token file (256
   int32 header: magic 20240520, version 1, count; then uint16 tokens), or
   ptrain's version 2 of it (uint32 tokens, for vocabularies over 65,536).
   The ids are in data (uint16) or, for a wide vocabulary, data32 (uint32):
   one of them is set; pt_tokens_at reads either. */
#define PT_TOKENS_MAGIC 20240520
typedef struct pt_tokens {
    uint16_t *data;
    uint32_t *data32; /* set instead of data when an id can exceed 65,535 */
    size_t n;
    int vocab_size;  /* 256 for bytes, 50257 for llm.c GPT-2 files, the largest id + 1 for
                        version 2, the tokenizer's for text */
    void *alloc_ctx;
    pt_text_cache cache; /* pt_tokens_from_text: what it did with its cache file */
} pt_tokens;

typedef enum pt_tokens_format {
    PT_TOKENS_AUTO = 0, /* ".bin" files are llm.c token files, anything else raw bytes */
    PT_TOKENS_BYTES,
    PT_TOKENS_LLMC
} pt_tokens_format;
PTRAINDEF pt_status pt_tokens_load(pt_tokens *t, const char *path, pt_tokens_format fmt);
PTRAINDEF pt_status pt_tokens_from_bytes(pt_tokens *t, const void *bytes, size_t n);
PTRAINDEF pt_status pt_tokens_parse_llmc(pt_tokens *t, const void *bytes, size_t n);
PTRAINDEF pt_status pt_tokens_check(const pt_tokens *t, int vocab_size);
static inline int pt_tokens_at(const pt_tokens *t, size_t i) {
    return t->data32 ? (int)t->data32[i] : (int)t->data[i];
}
PTRAINDEF double pt_tokens_unigram_entropy(const pt_tokens *t, size_t begin, size_t end);
PTRAINDEF void pt_tokens_free(pt_tokens *t);

typedef enum pt_split { PT_SPLIT_ALL = 0, PT_SPLIT_TRAIN, PT_SPLIT_VAL } pt_split;

typedef struct pt_loader_desc {
    int batch, seq;
    float val_fraction; /* 0 means 0.1 */
    uint64_t seed;
    int no_shuffle;     /* the validation split is never shuffled */
} pt_loader_desc;

/* Batches of B windows of T+1 tokens: inputs are the first T, targets the
   last T. Train windows are visited in a fresh seeded permutation every epoch;
   (epoch, pos) is the whole position, saved in checkpoints. */
typedef struct pt_loader {
    pt_tokens tokens; /* a view of the borrowed ids (data or data32), which outlive the loader */
    size_t begin, len;   /* split range in the token array */
    int B, T, shuffle;
    uint64_t seed;
    size_t n_windows;
    uint32_t *perm;
    uint64_t epoch;
    size_t pos;
    void *alloc_ctx;
} pt_loader;

PTRAINDEF pt_status pt_loader_init(pt_loader *l, const pt_tokens *t, pt_split split,
                                   const pt_loader_desc *desc);
PTRAINDEF pt_status pt_loader_next(pt_loader *l, int *inputs, int *targets);
PTRAINDEF void pt_loader_seek(pt_loader *l, uint64_t epoch, size_t pos);
PTRAINDEF void pt_loader_free(pt_loader *l);

/* Checkpoint: weights (Hugging Face names), AdamW m and v ("optim.m.<name>",
   "optim.v.<name>"), config and training state in one safetensors file. */
typedef struct pt_train_state {
    int64_t step;
    uint64_t data_epoch, data_pos, rng_state;
    int checksummed; /* set by load: 1 if the file's checksums were verified, 0 if it
                        has none (written before checksums existed) */
} pt_train_state;

PTRAINDEF pt_status pt_checkpoint_save(const char *path, const pt_gpt *m,
                                       const pt_train_state *state);
/* m must have been built with the checkpoint's config (pt_gpt_config_from_file). */
PTRAINDEF pt_status pt_checkpoint_load(const char *path, pt_gpt *m, pt_train_state *state);

/* A line chart as an SVG picture (a loss curve): each series its points
   (x[i], y[i]) joined in order, in its own colour and named in the legend;
   non-finite y values are left out. The axes span every series' points.
   Written atomically. */
typedef struct pt_plot_series {
    const char *name;
    const double *x, *y;
    int n;
} pt_plot_series;
PTRAINDEF pt_status pt_plot_write_svg(const char *path, const char *title, const char *x_label,
                                      const char *y_label, const pt_plot_series *series,
                                      int count);

#ifdef __cplusplus
}
#endif
#endif /* PTRAIN_H */

/* ######################################################################## */
/*                              IMPLEMENTATION                               */
/* ######################################################################## */
#ifdef PTRAIN_IMPLEMENTATION
#ifndef PTRAIN_IMPLEMENTATION_DONE
#define PTRAIN_IMPLEMENTATION_DONE

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__AVX512F__) || ((defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__))
#include <cpuid.h>
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif
#ifndef PTRAIN_NO_BLAS
#include <cblas.h>
#endif
#include <sys/stat.h>
#if defined(_WIN32)
#include <io.h>
#else
#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>
#define PT__HAVE_PTHREADS 1
#endif

#ifdef __cplusplus
extern "C" {
#endif

#if defined(PTRAIN_MALLOC) != defined(PTRAIN_FREE)
#error "ptrain.h: define both PTRAIN_MALLOC and PTRAIN_FREE, or neither"
#endif
#ifndef PTRAIN_MALLOC
#define PTRAIN_MALLOC(sz, ctx) ((void)(ctx), malloc(sz))
#define PTRAIN_FREE(p, ctx) ((void)(ctx), free(p))
#endif

#ifdef _OPENMP
#define PT__OMP(x) _Pragma(#x)
#else
#define PT__OMP(x)
#endif

#if defined(__cplusplus)
#define PT__THREAD_LOCAL thread_local
#elif defined(_MSC_VER)
#define PT__THREAD_LOCAL __declspec(thread)
#else
#define PT__THREAD_LOCAL _Thread_local
#endif

#if !defined(_WIN32)
/* POSIX; declared here because strict C11 hides them */
int fsync(int fd);
int nanosleep(const struct timespec *req, struct timespec *rem);
#endif

/* ======================================================================== */
/* >>basics (implementation)                                                 */
/* ======================================================================== */

static PT__THREAD_LOCAL char pt__err[1024];

PTRAINDEF const char *pt_status_name(pt_status s) {
    switch (s) {
#define PT__STATUS_NAME(name, desc) case name: return #name;
        PT_STATUS_LIST(PT__STATUS_NAME)
#undef PT__STATUS_NAME
    default: return "PT_ERR_UNKNOWN";
    }
}

PTRAINDEF const char *pt_status_str(pt_status s) {
    switch (s) {
#define PT__STATUS_STR(name, desc) case name: return #name ": " desc;
        PT_STATUS_LIST(PT__STATUS_STR)
#undef PT__STATUS_STR
    default: return "PT_ERR_UNKNOWN: unknown status";
    }
}

PTRAINDEF const char *pt_last_error(void) { return pt__err; }
PTRAINDEF void pt_clear_error(void) { pt__err[0] = 0; }

PTRAINDEF pt_status pt_error(pt_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pt__err, sizeof pt__err, fmt, ap);
    va_end(ap);
    return code;
}
#define pt__fail pt_error /* the library's own failures go the same way */

/* Prefixes this thread's error message with the file it concerns. */
static pt_status pt__fail_path(pt_status s, const char *path) {
    char msg[sizeof pt__err];
    snprintf(msg, sizeof msg, "%s", pt__err);
    return pt__fail(s, "%s: %s", path, msg);
}

/* Appends "; msg" to the current error (for validators reporting all checks). */
#if defined(__GNUC__) || defined(__clang__)
__attribute__((format(printf, 2, 3)))
#endif
static void pt__append_error(int *count, const char *fmt, ...) {
    size_t len = *count ? strlen(pt__err) : 0;
    va_list ap;
    if (*count && len + 2 < sizeof pt__err) {
        memcpy(pt__err + len, "; ", 3);
        len += 2;
    }
    if (len < sizeof pt__err) {
        va_start(ap, fmt);
        vsnprintf(pt__err + len, sizeof pt__err - len, fmt, ap);
        va_end(ap);
    }
    (*count)++;
}

PTRAINDEF void pt_rng_seed(pt_rng *r, uint64_t seed) { r->state = seed; }

/* splitmix64's finalizer: a bijection of 64-bit words that mixes every bit */
static uint64_t pt__mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

PTRAINDEF uint64_t pt_rng_u64(pt_rng *r) { return pt__mix64(r->state += 0x9E3779B97F4A7C15ull); }

PTRAINDEF float pt_rng_uniform(pt_rng *r) {
    return (float)(pt_rng_u64(r) >> 40) * (1.0f / 16777216.0f);
}

/* Box-Muller; uses two draws per sample so the state stays one integer. */
PTRAINDEF float pt_rng_normal(pt_rng *r, float mean, float std) {
    double u1 = ((double)(pt_rng_u64(r) >> 11) + 1.0) * (1.0 / 9007199254740993.0);
    double u2 = (double)(pt_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0);
    return mean + std * (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

#if !defined(PTRAIN_NO_BLAS) && defined(OPENBLAS_VERSION)
#define PT__HAVE_OPENBLAS 1
#endif

PTRAINDEF int pt_num_cores(void) {
#ifdef _OPENMP
    return omp_get_num_procs();
#else
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
#endif
}

PTRAINDEF void pt_set_threads(int n) {
#ifdef _OPENMP
    if (n <= 0) n = pt_num_cores();
    omp_set_num_threads(n);
#endif
#ifdef PT__HAVE_OPENBLAS
    if (n <= 0) n = 1;
    openblas_set_num_threads(n);
#endif
    (void)n;
}

PTRAINDEF int pt_get_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

PTRAINDEF double pt_time_now(void) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* a*b without overflow; returns 0 and leaves *out untouched on overflow */
static int pt__mul_ok(uint64_t a, uint64_t b, uint64_t *out) {
    if (a != 0 && b > UINT64_MAX / a) return 0;
    *out = a * b;
    return 1;
}

static void *pt__malloc(size_t n, void *ctx) {
    (void)ctx;
    return PTRAIN_MALLOC(n ? n : 1, ctx);
}
static void pt__free(void *p, void *ctx) {
    (void)ctx;
    if (p) PTRAIN_FREE(p, ctx);
}

/* Grows a malloc'ed array to hold at least need elements. */
static int pt__grow(void **arr, int *cap, int need, size_t elem, void *ctx) {
    int ncap = *cap ? *cap : 16;
    void *p;
    if (need <= *cap) return 1;
    while (ncap < need) {
        if (ncap > (1 << 28)) return 0;
        ncap *= 2;
    }
    p = pt__malloc((size_t)ncap * elem, ctx);
    if (!p) return 0;
    if (*arr) {
        memcpy(p, *arr, (size_t)*cap * elem);
        pt__free(*arr, ctx);
    }
    *arr = p;
    *cap = ncap;
    return 1;
}

/* ---- a small JSON reader (safetensors headers, and every JSON file read) -- */

typedef struct pt__json {
    const char *p, *end;
    char *pool; /* decoded strings */
    size_t pool_used, pool_cap;
    int depth;
} pt__json;

static void pt__ws(pt__json *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

static int pt__hex4(const char *p, unsigned *out) {
    unsigned v = 0;
    int i;
    for (i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return 0;
    }
    *out = v;
    return 1;
}

/* Parses a JSON string into the pool; returns its start, or NULL. */
static const char *pt__json_string(pt__json *j) {
    char *start = j->pool + j->pool_used, *o = start;
    pt__ws(j);
    if (j->p >= j->end || *j->p != '"') return NULL;
    j->p++;
    while (j->p < j->end && *j->p != '"') {
        unsigned char c = (unsigned char)*j->p++;
        if (c < 0x20) return NULL;
        if (c == '\\') {
            unsigned u;
            if (j->p >= j->end) return NULL;
            c = (unsigned char)*j->p++;
            switch (c) {
            case '"': case '\\': case '/': *o++ = (char)c; break;
            case 'b': *o++ = '\b'; break;
            case 'f': *o++ = '\f'; break;
            case 'n': *o++ = '\n'; break;
            case 'r': *o++ = '\r'; break;
            case 't': *o++ = '\t'; break;
            case 'u':
                if (j->end - j->p < 4 || !pt__hex4(j->p, &u) || u == 0) return NULL;
                j->p += 4;
                if (u >= 0xD800 && u <= 0xDBFF) { /* surrogate pair */
                    unsigned lo;
                    if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u' ||
                        !pt__hex4(j->p + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                        return NULL;
                    j->p += 6;
                    u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
                } else if (u >= 0xDC00 && u <= 0xDFFF) {
                    return NULL;
                }
                /* UTF-8: at most 4 bytes, never longer than the 6+ escape chars */
                if (u < 0x80) *o++ = (char)u;
                else if (u < 0x800) {
                    *o++ = (char)(0xC0 | (u >> 6));
                    *o++ = (char)(0x80 | (u & 0x3F));
                } else if (u < 0x10000) {
                    *o++ = (char)(0xE0 | (u >> 12));
                    *o++ = (char)(0x80 | ((u >> 6) & 0x3F));
                    *o++ = (char)(0x80 | (u & 0x3F));
                } else {
                    *o++ = (char)(0xF0 | (u >> 18));
                    *o++ = (char)(0x80 | ((u >> 12) & 0x3F));
                    *o++ = (char)(0x80 | ((u >> 6) & 0x3F));
                    *o++ = (char)(0x80 | (u & 0x3F));
                }
                break;
            default: return NULL;
            }
        } else {
            *o++ = (char)c;
        }
    }
    if (j->p >= j->end) return NULL;
    j->p++; /* closing quote */
    *o++ = 0;
    j->pool_used = (size_t)(o - j->pool);
    return start;
}

static int pt__json_lit(pt__json *j, const char *lit) {
    size_t n = strlen(lit);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, lit, n) != 0) return 0;
    j->p += n;
    return 1;
}

/* Non-negative integer (shape, offsets); rejects signs, fractions, exponents. */
/* A JSON true or false into *out. */
static int pt__json_bool(pt__json *j, int *out) {
    pt__ws(j);
    if (pt__json_lit(j, "true")) return *out = 1, 1;
    if (pt__json_lit(j, "false")) return *out = 0, 1;
    return 0;
}

static int pt__json_u64(pt__json *j, uint64_t *out) {
    uint64_t v = 0;
    const char *s;
    pt__ws(j);
    s = j->p;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
        unsigned d = (unsigned)(*j->p - '0');
        if (v > (UINT64_MAX - d) / 10) return 0;
        v = v * 10 + d;
        j->p++;
    }
    if (j->p == s || (j->p - s > 1 && *s == '0')) return 0;
    if (j->p < j->end && (*j->p == '.' || *j->p == 'e' || *j->p == 'E')) return 0;
    *out = v;
    return 1;
}

static int pt__json_skip(pt__json *j);

static int pt__json_number(pt__json *j) {
    const char *s = j->p;
    if (j->p < j->end && *j->p == '-') j->p++;
    if (j->p >= j->end || *j->p < '0' || *j->p > '9') return 0;
    while (j->p < j->end && ((*j->p >= '0' && *j->p <= '9') || *j->p == '.' || *j->p == 'e' ||
                             *j->p == 'E' || *j->p == '+' || *j->p == '-'))
        j->p++;
    return j->p > s;
}

/* Skips any JSON value (for keys we do not use), depth-limited. */
static int pt__json_skip(pt__json *j) {
    pt__ws(j);
    if (j->p >= j->end) return 0;
    if (*j->p == '"') return pt__json_string(j) != NULL;
    if (*j->p == '{' || *j->p == '[') {
        char close = *j->p == '{' ? '}' : ']';
        int first = 1;
        if (++j->depth > 64) return 0;
        j->p++;
        for (;;) {
            pt__ws(j);
            if (j->p < j->end && *j->p == close) {
                j->p++;
                break;
            }
            if (!first) {
                if (j->p >= j->end || *j->p != ',') return 0;
                j->p++;
            }
            first = 0;
            if (close == '}') {
                if (!pt__json_string(j)) return 0;
                pt__ws(j);
                if (j->p >= j->end || *j->p != ':') return 0;
                j->p++;
            }
            if (!pt__json_skip(j)) return 0;
        }
        j->depth--;
        return 1;
    }
    if (*j->p == 't') return pt__json_lit(j, "true");
    if (*j->p == 'f') return pt__json_lit(j, "false");
    if (*j->p == 'n') return pt__json_lit(j, "null");
    return pt__json_number(j);
}

/* Expects c (after whitespace) and consumes it. */
static int pt__json_null(pt__json *j) {
    pt__ws(j);
    return pt__json_lit(j, "null");
}

static int pt__json_expect(pt__json *j, char c) {
    pt__ws(j);
    if (j->p >= j->end || *j->p != c) return 0;
    j->p++;
    return 1;
}

/* Iterates the members of an object: *first starts at 1; returns 1 with the
   key in *key, 0 at the closing brace, -1 on a syntax error. */
static int pt__json_member(pt__json *j, int *first, const char **key) {
    pt__ws(j);
    if (j->p < j->end && *j->p == '}') {
        j->p++;
        return 0;
    }
    if (!*first && !pt__json_expect(j, ',')) return -1;
    *first = 0;
    if (!(*key = pt__json_string(j)) || !pt__json_expect(j, ':')) return -1;
    return 1;
}

/* ======================================================================== */
/* >>tensors (implementation)                                                */
/* ======================================================================== */

static const struct { const char *name; size_t size; } pt__dtypes[PT_DTYPE_COUNT] = {
    {"NONE", 0}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"F64", 8}, {"I32", 4}, {"I64", 8},
    {"I16", 2}, {"I8", 1}, {"U8", 1}, {"U16", 2}, {"U32", 4}, {"U64", 8}, {"BOOL", 1},
};

PTRAINDEF size_t pt_dtype_size(pt_dtype t) {
    return ((int)t > 0 && t < PT_DTYPE_COUNT) ? pt__dtypes[t].size : 0;
}
PTRAINDEF const char *pt_dtype_name(pt_dtype t) {
    return ((int)t > 0 && t < PT_DTYPE_COUNT) ? pt__dtypes[t].name : "NONE";
}

PTRAINDEF int64_t pt_tensor_numel(const pt_tensor *t) {
    int64_t n = 1;
    int i;
    for (i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

#define PT__ALIGN 64
static size_t pt__align_up(size_t n) { return (n + (PT__ALIGN - 1)) & ~(size_t)(PT__ALIGN - 1); }

PTRAINDEF pt_status pt_arena_init(pt_arena *a, size_t capacity, void *alloc_ctx) {
    memset(a, 0, sizeof *a);
    a->alloc_ctx = alloc_ctx;
    if (capacity > SIZE_MAX - PT__ALIGN)
        return pt__fail(PT_ERR_OOM, "arena of %zu bytes is too large", capacity);
    a->raw = (unsigned char *)pt__malloc(capacity + PT__ALIGN, alloc_ctx);
    if (!a->raw) return pt__fail(PT_ERR_OOM, "cannot allocate an arena of %zu bytes", capacity);
    a->base = a->raw + ((PT__ALIGN - ((uintptr_t)a->raw & (PT__ALIGN - 1))) & (PT__ALIGN - 1));
    a->capacity = capacity;
    return PT_OK;
}

PTRAINDEF void pt_arena_init_meta(pt_arena *a) {
    memset(a, 0, sizeof *a);
    a->meta = 1;
    a->capacity = SIZE_MAX;
}

PTRAINDEF void *pt_arena_alloc(pt_arena *a, size_t bytes) {
    size_t n = pt__align_up(bytes);
    void *p;
    if (n < bytes || n > a->capacity - a->used) {
        pt__fail(PT_ERR_OOM, "arena exhausted: %zu bytes requested, %zu of %zu used", bytes,
                 a->used, a->capacity);
        return NULL;
    }
    p = a->meta ? NULL : a->base + a->used;
    a->used += n;
    return p;
}

PTRAINDEF pt_status pt_arena_tensor(pt_arena *a, pt_tensor *out, pt_dtype dtype, int ndim,
                                    const int64_t *shape) {
    uint64_t bytes = pt_dtype_size(dtype);
    size_t before = a->used;
    int i;
    if (ndim < 0 || ndim > PT_MAX_DIMS || bytes == 0)
        return pt__fail(PT_ERR_INVALID_ARG, "tensor with ndim=%d dtype=%d", ndim, (int)dtype);
    memset(out, 0, sizeof *out);
    for (i = 0; i < ndim; i++) {
        if (shape[i] < 0 || !pt__mul_ok(bytes, (uint64_t)shape[i], &bytes))
            return pt__fail(PT_ERR_INVALID_ARG, "tensor dimension %d has bad size %lld", i,
                            (long long)shape[i]);
        out->shape[i] = shape[i];
    }
    out->dtype = dtype;
    out->ndim = ndim;
    if (bytes > SIZE_MAX) return pt__fail(PT_ERR_OOM, "tensor too large");
    out->data = pt_arena_alloc(a, (size_t)bytes);
    return a->used > before || bytes == 0 ? PT_OK : PT_ERR_OOM;
}

PTRAINDEF void pt_arena_free(pt_arena *a) {
    if (a->raw) pt__free(a->raw, a->alloc_ctx);
    memset(a, 0, sizeof *a);
}

/* ======================================================================== */
/* >>kernels (implementation)                                                */
/* ======================================================================== */

/* ---- GEMM ---------------------------------------------------------------
   ptrain's own GEMM, in the BLIS manner: C is cut into one rectangle a
   thread (pt__gemm_blocked); in its rectangle a thread packs, for each chunk
   of up to MC rows and K slab of up to KC k (2 KC in bf16: the same bytes),
   alpha*op(A) into MR-row micro-panels (L3), then each NC-column slab of
   op(B) into NR-column micro-panels (L2; k-major, zero-padded), and an MR x
   NR tile of C lives in registers over the slab while the A micro-panel
   (L1) walks the B slab; threads splitting the rows share each B slab, each
   packing its part (measured: packing 14.7% of a bf16 step's layer GEMMs
   with every thread packing all of it, 10.7% shared). Every element of C is summed by one thread, slab
   after slab in K order, so results do not depend on the thread count. The
   kernels are compiled with target attributes and chosen at run time from
   CPUID, so the header needs no special flags; bf16 packs pairs of
   consecutive k (vdpbf16ps's operand). */
#define PT__GEMM_MR 12
#define PT__GEMM_NR 32
#define PT__GEMM_KC 384  /* fp32 k a slab at most (bf16: twice) */
#define PT__GEMM_MC 4092 /* rows of A packed at once (L3), a multiple of MR */
#define PT__GEMM_NC 512  /* columns of a B slab, KC*NC*4 = 768 KiB (L2), a multiple of NR */

#define PT__GEMM_AUTO 0
#define PT__GEMM_PTRAIN 1
#define PT__GEMM_BLAS 2
#define PT__GEMM_PORTABLE 3
static int pt__gemm_impl; /* 0 until chosen; read and written atomically */

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#define PT__GEMM_X86 1
#define PT__TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))
#define PT__TARGET_BF16 \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")))

/* CPUID leaf 7 (sub-leaf 0: EBX bit 16 AVX-512F; sub-leaf 1: EAX bit 5
   AVX512-BF16) and XCR0 (the OS saves the opmask and zmm state: bits 1,2,5,6,7).
   Under valgrind, which cannot run AVX-512, CPUID reports none. Asked once:
   CPUID traps to the hypervisor in a VM (measured: 6% of a bf16 step when
   every GEMM asked). */
static int pt__avx512_state; /* 0 not asked yet, else 1 + (AVX-512F) + 2 (AVX512-BF16); atomic */
static int pt__avx512_probe(void) {
    unsigned a, b, c, d, lo, hi;
    __cpuid(0, a, b, c, d);
    if (a < 7) return 0;
    __cpuid(1, a, b, c, d);
    if (!(c & (1u << 27))) return 0; /* OSXSAVE: xgetbv may run */
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    if ((lo & 0xE6u) != 0xE6u) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    if (!(b & (1u << 16))) return 0;
    __cpuid_count(7, 1, a, b, c, d);
    return 1 + (int)((a >> 5) & 1u) * 2;
}
static int pt__cpu_avx512(int want_bf16) {
    int s = __atomic_load_n(&pt__avx512_state, __ATOMIC_ACQUIRE);
    if (s == 0) {
        s = 1 + pt__avx512_probe();
        __atomic_store_n(&pt__avx512_state, s, __ATOMIC_RELEASE);
    }
    return want_bf16 ? (s - 1) >> 1 & 1 : (s - 1) & 1;
}

/* AMX, for the bf16 GEMM: CPUID leaf 7 sub-leaf 0 EDX bits 22 (AMX-BF16) and 24
   (AMX-TILE), XCR0 bits 17-18 (the OS saves tile config and data), AVX512-BF16
   (the packing), and on Linux the process's permission to use tile data
   (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), syscall 158), asked once
   before any thread touches tiles; refused means no AMX. Valgrind's CPUID hides it. */
static int pt__amx_state; /* 0 not asked yet, 1 usable, -1 not; atomic */
static int pt__amx_probe(void) {
    unsigned a, b, c, d, lo, hi;
    if (!pt__cpu_avx512(1)) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    if ((d & (1u << 22 | 1u << 24)) != (1u << 22 | 1u << 24)) return 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    if ((lo & (3u << 17)) != 3u << 17) return 0;
#ifdef __linux__
    {
        long r;
        __asm__ volatile("syscall"
                         : "=a"(r)
                         : "0"(158L), "D"(0x1023L), "S"(18L)
                         : "rcx", "r11", "memory");
        if (r != 0) return 0;
    }
#endif
    return 1;
}
static int pt__cpu_amx(void) {
    int s = __atomic_load_n(&pt__amx_state, __ATOMIC_ACQUIRE);
    if (s == 0) {
        s = pt__amx_probe() ? 1 : -1;
        __atomic_store_n(&pt__amx_state, s, __ATOMIC_RELEASE);
    }
    return s > 0;
}
#else
static int pt__cpu_avx512(int want_bf16) {
    (void)want_bf16;
    return 0;
}
static int pt__cpu_amx(void) { return 0; }
#endif

/* ptrain's fp32 kernels pay only where they have something to win: AMD family
   19h (Zen 3, Zen 4) runs a zmm FMA as two 256-bit halves, the rate of
   OpenBLAS's AVX2 kernel (ptrain 0.93-0.96x per core there), and where
   OpenBLAS runs an AVX-512 kernel of its own (SkylakeX, Cooperlake,
   SapphireRapids: Intel with OPENBLAS_CORETYPE unset) it measured faster
   (ptrain 0.83-1.00x on a Xeon with AMX). Left: full-width AVX-512 cores
   (Zen 5, Intel) with OpenBLAS held to its AVX2 kernel, e.g. by
   OPENBLAS_CORETYPE=Haswell, where ptrain's kernels run up to twice as fast. */
#ifndef PTRAIN_NO_BLAS
static int pt__blas_fp32_wins(void) {
#ifdef PT__GEMM_X86
    unsigned a, b, c, d;
    const char *core = openblas_get_corename();
    char low[32] = {0};
    for (int i = 0; core && core[i] && i < 31; i++)
        low[i] = core[i] >= 'A' && core[i] <= 'Z' ? (char)(core[i] + 32) : core[i];
    if (strstr(low, "skylakex") || strstr(low, "cooperlake") || strstr(low, "sapphire"))
        return 1;
    __cpuid(0, a, b, c, d);
    if (!(b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u)) return 0; /* AuthenticAMD */
    __cpuid(1, a, b, c, d);
    return ((a >> 8) & 0xFu) + ((a >> 20) & 0xFFu) == 0x19u;
#else
    return 1;
#endif
}
#endif

static int pt__gemm_parse(const char *name) {
    if (!name || !*name || !strcmp(name, "auto")) {
#ifndef PTRAIN_NO_BLAS
        return pt__cpu_avx512(0) && !pt__blas_fp32_wins() ? PT__GEMM_PTRAIN : PT__GEMM_BLAS;
#else
        return pt__cpu_avx512(0) ? PT__GEMM_PTRAIN : PT__GEMM_PORTABLE;
#endif
    }
    if (!strcmp(name, "ptrain")) return pt__cpu_avx512(0) ? PT__GEMM_PTRAIN : -1;
#ifndef PTRAIN_NO_BLAS
    if (!strcmp(name, "openblas") || !strcmp(name, "blas")) return PT__GEMM_BLAS;
#endif
    if (!strcmp(name, "portable")) return PT__GEMM_PORTABLE;
    return -2;
}

PTRAINDEF pt_status pt_gemm_select(const char *name) {
    int v;
    if (!name || !*name) name = getenv("PTRAIN_GEMM");
    v = pt__gemm_parse(name);
    if (v == -1)
        return pt__fail(PT_ERR_UNSUPPORTED, "GEMM '%s' needs a CPU with AVX-512F", name);
    if (v < 0)
        return pt__fail(PT_ERR_INVALID_ARG, "unknown GEMM '%s' (known: auto, ptrain, %sportable)",
                        name,
#ifndef PTRAIN_NO_BLAS
                        "openblas, "
#else
                        ""
#endif
        );
    __atomic_store_n(&pt__gemm_impl, v, __ATOMIC_RELAXED);
    return PT_OK;
}

static int pt__gemm_current(void) {
    int v = __atomic_load_n(&pt__gemm_impl, __ATOMIC_RELAXED);
    if (v == PT__GEMM_AUTO) {
        v = pt__gemm_parse(getenv("PTRAIN_GEMM"));
        if (v < 0) v = pt__gemm_parse(NULL);
        __atomic_store_n(&pt__gemm_impl, v, __ATOMIC_RELAXED);
    }
    return v;
}

PTRAINDEF const char *pt_gemm_name(void) {
    int v = pt__gemm_current();
    if (v == PT__GEMM_PTRAIN) return "ptrain-avx512";
    return v == PT__GEMM_BLAS ? "openblas" : "portable";
}

/* The bf16 kernel: chosen by name like the fp32 GEMM; auto is resolved at each
   call (the best the CPU has, portable while the fp32 GEMM is portable). */
#define PT__BF16_AUTO 1
#define PT__BF16_AMX 2
#define PT__BF16_AVX512 3
#define PT__BF16_PORTABLE 4
#define PT__BF16_SGEMM 5
static int pt__gemm_bf16_impl; /* 0 until chosen; read and written atomically */

static int pt__gemm_bf16_parse(const char *name) {
    if (!name || !*name || !strcmp(name, "auto")) return PT__BF16_AUTO;
    if (!strcmp(name, "amx")) return pt__cpu_amx() ? PT__BF16_AMX : -1;
    if (!strcmp(name, "avx512bf16")) return pt__cpu_avx512(1) ? PT__BF16_AVX512 : -1;
    if (!strcmp(name, "portable")) return PT__BF16_PORTABLE;
    if (!strcmp(name, "sgemm")) return PT__BF16_SGEMM;
    return -2;
}

PTRAINDEF pt_status pt_gemm_bf16_select(const char *name) {
    int v;
    if (!name || !*name) name = getenv("PTRAIN_GEMM_BF16");
    v = pt__gemm_bf16_parse(name);
    if (v == -1)
        return pt__fail(PT_ERR_UNSUPPORTED, "bf16 GEMM '%s' needs a CPU with %s", name,
                        !strcmp(name, "amx") ? "AMX-BF16 and AMX-TILE (enabled by the OS)"
                                             : "AVX512-BF16");
    if (v < 0)
        return pt__fail(PT_ERR_INVALID_ARG,
                        "unknown bf16 GEMM '%s' (known: auto, amx, avx512bf16, sgemm, portable)",
                        name);
    __atomic_store_n(&pt__gemm_bf16_impl, v, __ATOMIC_RELAXED);
    return PT_OK;
}

static int pt__gemm_bf16_current(void) {
    int v = __atomic_load_n(&pt__gemm_bf16_impl, __ATOMIC_RELAXED);
    if (v == 0) {
        v = pt__gemm_bf16_parse(getenv("PTRAIN_GEMM_BF16"));
        if (v < 0) v = PT__BF16_AUTO;
        __atomic_store_n(&pt__gemm_bf16_impl, v, __ATOMIC_RELAXED);
    }
    if (v == PT__BF16_AUTO)
        v = pt__gemm_current() == PT__GEMM_PORTABLE ? PT__BF16_PORTABLE
            : pt__cpu_amx()                         ? PT__BF16_AMX
            : pt__cpu_avx512(1)                     ? PT__BF16_AVX512
                                                    : PT__BF16_SGEMM;
    return v;
}

PTRAINDEF const char *pt_gemm_bf16_name(void) {
    int v = pt__gemm_bf16_current();
    return v == PT__BF16_AMX      ? "ptrain-amx"
           : v == PT__BF16_AVX512 ? "ptrain-avx512bf16"
           : v == PT__BF16_SGEMM  ? "sgemm"
                                  : "portable";
}

/* A float's bits. Loops over pt__bf16_* pun through it, not memcpy: clang
   vectorises no simd loop with a memcpy in it on baseline x86-64. */
typedef union pt__f32u { float f; uint32_t u; } pt__f32u;

/* fp32 -> bf16 bits, round to nearest even (NaN stays a quiet NaN). */
static inline uint16_t pt__bf16_bits(float x) {
    pt__f32u v;
    uint32_t even, nan;
    v.f = x;
    even = (v.u + 0x7FFFu + ((v.u >> 16) & 1u)) >> 16, nan = (v.u >> 16) | 0x40u;
    return (uint16_t)((v.u & 0x7FFFFFFFu) > 0x7F800000u ? nan : even);
}

static inline float pt__bf16_round(float x) {
    pt__f32u v;
    v.u = (uint32_t)pt__bf16_bits(x) << 16;
    return v.f;
}

PTRAINDEF uint16_t pt_bf16_from_float(float x) { return pt__bf16_bits(x); }
PTRAINDEF float pt_bf16_round(float x) { return pt__bf16_round(x); }
PTRAINDEF float pt_bf16_to_float(uint16_t bits) {
    pt__f32u v;
    v.u = (uint32_t)bits << 16;
    return v.f;
}

/* bf16 storage of an activation: dst = the bf16 bits of x (round to nearest
   even, as the GEMMs round their operands), and x rounded in place, so the
   readers of x now see what dst keeps (dst NULL: x rounded alone). */
static void pt__bf16_keep(uint16_t *dst, float *x, size_t n) {
    ptrdiff_t i;
    PT__OMP(omp parallel for simd schedule(static))
    for (i = 0; i < (ptrdiff_t)n; i++) {
        pt__f32u v;
        uint16_t h = pt__bf16_bits(x[i]);
        if (dst) dst[i] = h;
        v.u = (uint32_t)h << 16;
        x[i] = v.f;
    }
}

static void pt__bf16_widen(float *dst, const uint16_t *src, size_t n) {
    ptrdiff_t i;
    PT__OMP(omp parallel for simd schedule(static))
    for (i = 0; i < (ptrdiff_t)n; i++) {
        pt__f32u v;
        v.u = (uint32_t)src[i] << 16;
        dst[i] = v.f;
    }
}

/* Plain loops: row i of C at a time, B streamed in its storage order; bf16
   rounds both operands first (the same numbers as the bf16 kernels). */
static void pt__gemm_portable(int bf16, int ta, int tb, int M, int N, int K, float alpha,
                              const float *A, int lda, const float *B, int ldb, float beta,
                              float *C, int ldc) {
    int i;
    PT__OMP(omp parallel for schedule(static))
    for (i = 0; i < M; i++) {
        float *c = C + (size_t)i * ldc;
        int j, k;
        for (j = 0; j < N; j++) c[j] = beta == 0.0f ? 0.0f : beta * c[j];
        for (k = 0; k < K; k++) {
            float a = alpha * (ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]);
            if (bf16) a = pt__bf16_round(a);
            if (!tb) {
                const float *b = B + (size_t)k * ldb;
                if (bf16)
                    for (j = 0; j < N; j++) c[j] += a * pt__bf16_round(b[j]);
                else
                    for (j = 0; j < N; j++) c[j] += a * b[j];
            } else {
                for (j = 0; j < N; j++) {
                    float b = B[(size_t)j * ldb + k];
                    c[j] += a * (bf16 ? pt__bf16_round(b) : b);
                }
            }
        }
    }
}

/* ---- the execution context ------------------------------------------------
   The workspace: a slot a thread, each the most one thread of the blocked
   driver packs (an MC-row chunk of A and an NC-column slab of B, KC words
   deep: bf16 packs pairs of k into a word, so 2 KC k of it) and more than
   the AMX driver's per-thread need (its B slab, 1 MiB, and a 128 KiB A block). */
#define PT__WS_SLOT ((size_t)PT__GEMM_MC * PT__GEMM_KC * 4 + (size_t)PT__GEMM_NC * PT__GEMM_KC * 4)

PTRAINDEF size_t pt_ctx_workspace_bytes(int threads) {
    if (threads <= 0) threads = pt_get_threads();
    return (size_t)threads * PT__WS_SLOT + 64;
}

PTRAINDEF pt_status pt_ctx_init(pt_ctx *c, const pt_ctx_desc *d) {
    pt_ctx_desc z;
    int n;
    memset(c, 0, sizeof *c);
    if (!d) {
        memset(&z, 0, sizeof z);
        d = &z;
    }
    if ((int)d->precision < 0 || d->precision > PT_PRECISION_BF16)
        return pt__fail(PT_ERR_INVALID_ARG, "pt_ctx_desc.precision=%d must be 0 (fp32), "
                        "PT_PRECISION_FP32 or PT_PRECISION_BF16", (int)d->precision);
    if (d->threads < 0 || d->threads > 4096)
        return pt__fail(PT_ERR_INVALID_ARG, "pt_ctx_desc.threads=%d must be in 0..4096 "
                        "(0: pt_get_threads())", d->threads);
    n = d->threads ? d->threads : pt_get_threads();
    c->raw = pt__malloc(pt_ctx_workspace_bytes(n), d->alloc_ctx);
    if (!c->raw)
        return pt__fail(PT_ERR_OOM, "cannot allocate %.1f MiB of GEMM workspace for %d threads",
                        (double)pt_ctx_workspace_bytes(n) / 1048576.0, n);
    c->precision = d->precision == PT_PRECISION_BF16 ? PT_PRECISION_BF16 : PT_PRECISION_FP32;
    c->threads = n, c->alloc_ctx = d->alloc_ctx, c->ws_slot = PT__WS_SLOT;
    c->ws = (unsigned char *)c->raw + (64 - (uintptr_t)c->raw % 64) % 64;
    return PT_OK;
}

PTRAINDEF void pt_ctx_free(pt_ctx *c) {
    pt__free(c->raw, c->alloc_ctx);
    memset(c, 0, sizeof *c);
}

static int pt__ctx_bf16(const pt_ctx *c) { return c && c->precision == PT_PRECISION_BF16; }

/* The workspace a GEMM on the calling thread may use. Outside a parallel
   region: all of ctx's, for up to min(its threads, OpenMP's) threads, slot t
   thread t's. Inside one (attention's blocks run their GEMMs on their own
   threads): the slot of this thread, for itself alone. p NULL: none (no
   context or workspace, a thread beyond its slots, parallel regions nested
   deeper). */
typedef struct pt__gemm_ws {
    unsigned char *p;
    size_t slot, bytes; /* a thread's bytes, all of them */
    int threads;        /* the most threads the GEMM may run on */
} pt__gemm_ws;
static pt__gemm_ws pt__ws_of(const pt_ctx *c) {
    pt__gemm_ws w = {NULL, 0, 0, 1};
    if (!c || !c->ws || c->threads < 1) return w;
#ifdef _OPENMP
    if (omp_in_parallel()) {
        int t = omp_get_thread_num();
        if (omp_get_active_level() > 1 || t >= c->threads) return w;
        w.p = c->ws + (size_t)t * c->ws_slot, w.slot = w.bytes = c->ws_slot;
        return w;
    }
    w.threads = omp_get_max_threads() < c->threads ? omp_get_max_threads() : c->threads;
#endif
    w.p = c->ws, w.slot = c->ws_slot, w.bytes = (size_t)c->threads * c->ws_slot;
    return w;
}

/* 1 on the thread that runs the call (OpenMP thread 0 at every level of
   parallel regions): the one that polls, and whose GEMMs run in slices. */
static int pt__team_lead(void) {
#ifdef _OPENMP
    int l;
    for (l = omp_get_level(); l > 0; l--)
        if (omp_get_ancestor_thread_num(l) != 0) return 0;
#endif
    return 1;
}

#ifdef PT__GEMM_X86
/* 16 x 16 32-bit words transposed in registers: word i of v[j] becomes word j
   of v[i]. Pairs, 4-row groups, then 128-bit lanes, written out step by step
   (inlined, the array stays in registers; the zero-masking forms because
   g++ warns on the plain ones' undefined operand). */
#define PT__TR_UNPACK(d, s, a, b, w, m)                                            \
    d[a] = _mm512_maskz_unpacklo_epi##w(m, s[a], s[b]);                           \
    d[b] = _mm512_maskz_unpackhi_epi##w(m, s[a], s[b]);
#define PT__TR_LANES(j)                                                            \
    {                                                                              \
        __m512i e0 = _mm512_maskz_shuffle_i32x4(all16, t[j], t[4 + j], 0x88);      \
        __m512i o0 = _mm512_maskz_shuffle_i32x4(all16, t[j], t[4 + j], 0xdd);      \
        __m512i e1 = _mm512_maskz_shuffle_i32x4(all16, t[8 + j], t[12 + j], 0x88); \
        __m512i o1 = _mm512_maskz_shuffle_i32x4(all16, t[8 + j], t[12 + j], 0xdd); \
        v[j] = _mm512_maskz_shuffle_i32x4(all16, e0, e1, 0x88);                    \
        v[j + 8] = _mm512_maskz_shuffle_i32x4(all16, e0, e1, 0xdd);                \
        v[j + 4] = _mm512_maskz_shuffle_i32x4(all16, o0, o1, 0x88);                \
        v[j + 12] = _mm512_maskz_shuffle_i32x4(all16, o0, o1, 0xdd);               \
    }
PT__TARGET_AVX512 static inline __attribute__((always_inline)) void pt__tr16(__m512i *v) {
    const __mmask16 all16 = 0xFFFF;
    const __mmask8 all8 = 0xFF;
    __m512i t[16], u[16];
    /* u[j], u[j+1]: interleaved words of rows j, j+1 */
    PT__TR_UNPACK(u, v, 0, 1, 32, all16) PT__TR_UNPACK(u, v, 2, 3, 32, all16)
    PT__TR_UNPACK(u, v, 4, 5, 32, all16) PT__TR_UNPACK(u, v, 6, 7, 32, all16)
    PT__TR_UNPACK(u, v, 8, 9, 32, all16) PT__TR_UNPACK(u, v, 10, 11, 32, all16)
    PT__TR_UNPACK(u, v, 12, 13, 32, all16) PT__TR_UNPACK(u, v, 14, 15, 32, all16)
    /* t[j+c]: lane L holds rows j..j+3 of column 4L+c (pairs of words from u[j], u[j+2]) */
    t[0] = _mm512_maskz_unpacklo_epi64(all8, u[0], u[2]);
    t[1] = _mm512_maskz_unpackhi_epi64(all8, u[0], u[2]);
    t[2] = _mm512_maskz_unpacklo_epi64(all8, u[1], u[3]);
    t[3] = _mm512_maskz_unpackhi_epi64(all8, u[1], u[3]);
    t[4] = _mm512_maskz_unpacklo_epi64(all8, u[4], u[6]);
    t[5] = _mm512_maskz_unpackhi_epi64(all8, u[4], u[6]);
    t[6] = _mm512_maskz_unpacklo_epi64(all8, u[5], u[7]);
    t[7] = _mm512_maskz_unpackhi_epi64(all8, u[5], u[7]);
    t[8] = _mm512_maskz_unpacklo_epi64(all8, u[8], u[10]);
    t[9] = _mm512_maskz_unpackhi_epi64(all8, u[8], u[10]);
    t[10] = _mm512_maskz_unpacklo_epi64(all8, u[9], u[11]);
    t[11] = _mm512_maskz_unpackhi_epi64(all8, u[9], u[11]);
    t[12] = _mm512_maskz_unpacklo_epi64(all8, u[12], u[14]);
    t[13] = _mm512_maskz_unpackhi_epi64(all8, u[12], u[14]);
    t[14] = _mm512_maskz_unpacklo_epi64(all8, u[13], u[15]);
    t[15] = _mm512_maskz_unpackhi_epi64(all8, u[13], u[15]);
    /* column 4L + j: lane L of t[j], t[4+j], t[8+j], t[12+j] */
    PT__TR_LANES(0) PT__TR_LANES(1) PT__TR_LANES(2) PT__TR_LANES(3)
}
#undef PT__TR_UNPACK
#undef PT__TR_LANES

static inline __mmask16 pt__mask16(int n) { /* the first n of 16 lanes, n clipped to 0..16 */
    return (__mmask16)(n >= 16 ? 0xFFFFu : n <= 0 ? 0u : (1u << n) - 1u);
}

/* 48 consecutive rows' words (w0: rows 0-15, w1: 16-31, w2: 32-47) into the
   4 MR = 12-row micro-panels they make, panel q at dst + q*pstride words;
   only the panels that hold some of the first `rows` rows are written. */
PT__TARGET_AVX512 static inline void pt__put_panels48(uint32_t *dst, size_t pstride, int rows,
                                                      __m512i w0, __m512i w1, __m512i w2) {
    const __mmask16 m12 = 0x0FFF, all = 0xFFFF;
    _mm512_mask_storeu_epi32(dst, m12, w0);
    if (rows > 12)
        _mm512_mask_storeu_epi32(dst + pstride, m12, _mm512_maskz_alignr_epi32(all, w1, w0, 12));
    if (rows > 24)
        _mm512_mask_storeu_epi32(dst + 2 * pstride, m12, _mm512_maskz_alignr_epi32(all, w2, w1, 8));
    if (rows > 36)
        _mm512_mask_storeu_epi32(dst + 3 * pstride, m12, _mm512_maskz_alignr_epi32(all, w2, w2, 4));
}

/* bf16 pairs from 32 floats: word w = (bf16(s*x[2w]), bf16(s*x[2w+1])), w < 16,
   x[n..32) read as zero (vcvtne2ps2bf16: round to nearest even like
   pt__bf16_bits, denormals to zero as vdpbf16ps reads them). */
PT__TARGET_BF16 static inline __m512i pt__bf16_pairs32(const float *x, int n, __m512 vs) {
    __m512 lo = _mm512_mul_ps(vs, _mm512_maskz_loadu_ps(pt__mask16(n), x));
    __m512 hi = _mm512_mul_ps(vs, _mm512_maskz_loadu_ps(pt__mask16(n - 16), x + 16));
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

/* Word i = (bf16(x0[i]), bf16(x1[i])), i < 16: two rows' values as pairs. */
PT__TARGET_BF16 static inline __m512i pt__bf16_zip(__m512 x0, __m512 x1) {
    static const uint16_t inter[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                       8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    return _mm512_permutexvar_epi16(_mm512_loadu_si512((const void *)inter),
                                    (__m512i)_mm512_cvtne2ps_pbh(x1, x0));
}

/* Pairs from two rows: dst[c] = (bf16(s*r0[c]), bf16(s*r1[c])) for c < n <= 32,
   zero for n <= c < w; r1 NULL: zero partners. */
PT__TARGET_BF16 static void pt__bf16_pack_pairs(uint32_t *dst, const float *r0, const float *r1,
                                                int n, int w, float s) {
    __m512 vs = _mm512_set1_ps(s);
    int c;
    for (c = 0; c < w; c += 16) {
        __mmask16 km = pt__mask16(n - c);
        __m512 x0 = _mm512_mul_ps(vs, _mm512_maskz_loadu_ps(km, r0 + c));
        __m512 x1 = r1 ? _mm512_mul_ps(vs, _mm512_maskz_loadu_ps(km, r1 + c)) : _mm512_setzero_ps();
        _mm512_mask_storeu_epi32(dst + c, pt__mask16(w - c), pt__bf16_zip(x0, x1));
    }
}

/* 16 rows of a source that runs along k, transposed for a micro-panel: row
   r at src + r*ld (rows past `rows` read as zero), `left` k still to come
   in the slab. fp32: 16 k of each, times s, v[j] = k j of the 16 rows;
   bf16: 32 k as 16 pairs, v[j] = pair j. Each row's next blocks are
   prefetched `ahead` floats on. One loop for both, LOAD the row's words
   (two functions: bf16's needs its target, fp32's must run without it). */
#define PT__ROWS16(ahead, LOAD)                                                       \
    int r;                                                                            \
    for (r = 0; r < 16; r++) {                                                        \
        const float *a = src + (size_t)r * ld;                                        \
        if (r >= rows) {                                                              \
            v[r] = _mm512_setzero_si512();                                            \
            continue;                                                                 \
        }                                                                             \
        if (left > 3 * (ahead) / 2) {                                                 \
            _mm_prefetch((const char *)(a + (ahead)), _MM_HINT_T0);                   \
            _mm_prefetch((const char *)(a + (ahead) + 16), _MM_HINT_T0);              \
        }                                                                             \
        v[r] = LOAD;                                                                  \
    }                                                                                 \
    pt__tr16(v);
PT__TARGET_AVX512 static inline void pt__rows16_f32(__m512i *v, const float *src, size_t ld,
                                                    int rows, int left, __m512 s) {
    __mmask16 kk = pt__mask16(left);
    PT__ROWS16(32, _mm512_castps_si512(_mm512_mul_ps(s, _mm512_maskz_loadu_ps(kk, a))))
}
PT__TARGET_BF16 static inline void pt__rows16_bf16(__m512i *v, const float *src, size_t ld,
                                                   int rows, int left, __m512 s) {
    PT__ROWS16(64, pt__bf16_pairs32(a, left, s))
}
#undef PT__ROWS16

/* Packing. alpha*op(A), rows i0..i0+mc and k = p0..p0+kc, goes into MR-row
   micro-panels, panel p at ap + p*MR*kc floats: fp32 ap[k][r]; bf16 (kp =
   (kc+1)/2) ap[k/2][r] = (bf16(a[r][k]), bf16(a[r][k+1])) as one 32-bit word.
   op(B), columns j0..j0+nc, into NR-column micro-panels at bp + p*NR*kc:
   fp32 bp[k][c]; bf16 bp[k/2][c] pairs likewise. Rows and columns past the
   edge and the odd k's partner are zero. Where the source runs along k (A
   not transposed, B transposed), 16 rows at a time go through pt__tr16;
   else along each row (k) of the source, every panel at once. */
PT__TARGET_AVX512 static void pt__pack_a_f32(float *ap, int ta, const float *A, int lda, int i0,
                                             int mc, int p0, int kc, float alpha) {
    const int MR = PT__GEMM_MR;
    __m512 va = _mm512_set1_ps(alpha);
    int ir, k, j;
    if (ta) /* row k of op(A)^T holds the rows side by side: 48 at a time, 4 panels */
        for (k = 0; k < kc; k++)
            for (ir = 0; ir < mc; ir += 48) {
                const float *a = A + (size_t)(p0 + k) * lda + i0 + ir;
                __m512i w[3];
                for (j = 0; j < 3; j++) {
                    __mmask16 km = pt__mask16(mc - ir - 16 * j);
                    if (k + 2 < kc)
                        _mm_prefetch((const char *)(a + 2 * (size_t)lda + 16 * j), _MM_HINT_T0);
                    w[j] = _mm512_castps_si512(
                        _mm512_mul_ps(va, _mm512_maskz_loadu_ps(km, a + 16 * j)));
                }
                pt__put_panels48((uint32_t *)ap + (size_t)ir * kc + (size_t)k * MR,
                                 (size_t)MR * kc, mc - ir, w[0], w[1], w[2]);
            }
    else
        for (ir = 0; ir < mc; ir += MR, ap += (size_t)MR * kc)
            for (k = 0; k < kc; k += 16) {
                __m512i v[16];
                pt__rows16_f32(v, A + (size_t)(i0 + ir) * lda + p0 + k, (size_t)lda,
                               mc - ir < MR ? mc - ir : MR, kc - k, va);
                for (j = 0; j < 16 && k + j < kc; j++)
                    _mm512_mask_storeu_epi32((void *)(ap + (size_t)(k + j) * MR), 0x0FFF, v[j]);
            }
}

PT__TARGET_BF16 static void pt__pack_a_bf16(uint32_t *ap, int ta, const float *A, int lda, int i0,
                                            int mc, int p0, int kc, float alpha) {
    const int MR = PT__GEMM_MR;
    int ir, k, j, kp = (kc + 1) / 2;
    __m512 va = _mm512_set1_ps(alpha);
    if (ta) /* rows k and k+1 of op(A)^T, interleaved: 48 rows at a time, 4 panels */
        for (k = 0; k < kc; k += 2)
            for (ir = 0; ir < mc; ir += 48) {
                const float *a0 = A + (size_t)(p0 + k) * lda + i0 + ir, *a1 = a0 + lda;
                __m512i w[3];
                for (j = 0; j < 3; j++) {
                    __mmask16 km = pt__mask16(mc - ir - 16 * j);
                    __m512 x0, x1 = _mm512_setzero_ps();
                    if (k + 3 < kc) { /* the next pair's rows, ahead of need */
                        _mm_prefetch((const char *)(a0 + 2 * (size_t)lda + 16 * j), _MM_HINT_T0);
                        _mm_prefetch((const char *)(a1 + 2 * (size_t)lda + 16 * j), _MM_HINT_T0);
                    }
                    x0 = _mm512_mul_ps(va, _mm512_maskz_loadu_ps(km, a0 + 16 * j));
                    if (k + 1 < kc) x1 = _mm512_mul_ps(va, _mm512_maskz_loadu_ps(km, a1 + 16 * j));
                    w[j] = pt__bf16_zip(x0, x1);
                }
                pt__put_panels48(ap + (size_t)ir * kp + (size_t)(k / 2) * MR, (size_t)MR * kp,
                                 mc - ir, w[0], w[1], w[2]);
            }
    else /* 32 k of 16 rows: 16 pairs each, transposed */
        for (ir = 0; ir < mc; ir += MR, ap += (size_t)MR * kp)
            for (k = 0; k < kc; k += 32) {
                __m512i v[16];
                pt__rows16_bf16(v, A + (size_t)(i0 + ir) * lda + p0 + k, (size_t)lda,
                                mc - ir < MR ? mc - ir : MR, kc - k, va);
                for (j = 0; j < 16 && k / 2 + j < kp; j++)
                    _mm512_mask_storeu_epi32((void *)(ap + (size_t)(k / 2 + j) * MR), 0x0FFF, v[j]);
            }
}

PT__TARGET_AVX512 static void pt__pack_b_f32(float *bp, int tb, const float *B, int ldb, int j0,
                                             int nc, int p0, int kc) {
    const int NR = PT__GEMM_NR;
    __m512 one = _mm512_set1_ps(1.0f);
    int jr, c0, k, j;
    if (!tb) /* along row k of B, every panel at once */
        for (k = 0; k < kc; k++) {
            const float *b = B + (size_t)(p0 + k) * ldb + j0;
            for (jr = 0; jr < nc; jr += NR) {
                float *d = bp + (size_t)jr * kc + (size_t)k * NR;
                __mmask16 m0 = pt__mask16(nc - jr), m1 = pt__mask16(nc - jr - 16);
                _mm512_store_ps(d, _mm512_maskz_loadu_ps(m0, b + jr));
                _mm512_store_ps(d + 16, _mm512_maskz_loadu_ps(m1, b + jr + 16));
            }
        }
    else /* rows of B^T run along k: 16 columns x 16 k transposed */
        for (jr = 0; jr < nc; jr += NR, bp += (size_t)NR * kc)
            for (c0 = 0; c0 < NR; c0 += 16)
                for (k = 0; k < kc; k += 16) {
                    __m512i v[16];
                    pt__rows16_f32(v, B + (size_t)(j0 + jr + c0) * ldb + p0 + k, (size_t)ldb,
                                   nc - jr - c0, kc - k, one);
                    for (j = 0; j < 16 && k + j < kc; j++)
                        _mm512_store_si512((void *)(bp + (size_t)(k + j) * NR + c0), v[j]);
                }
}

PT__TARGET_BF16 static void pt__pack_b_bf16(uint32_t *bp, int tb, const float *B, int ldb, int j0,
                                            int nc, int p0, int kc) {
    const int NR = PT__GEMM_NR;
    int jr, c0, k, j, kp = (kc + 1) / 2;
    __m512 one = _mm512_set1_ps(1.0f);
    if (!tb) /* rows k and k+1 of B, interleaved, every panel at once */
        for (k = 0; k < kc; k += 2) {
            const float *b = B + (size_t)(p0 + k) * ldb + j0;
            for (jr = 0; jr < nc; jr += NR)
                pt__bf16_pack_pairs(bp + (size_t)jr * kp + (size_t)(k / 2) * NR, b + jr,
                                    k + 1 < kc ? b + ldb + jr : NULL, nc - jr < NR ? nc - jr : NR,
                                    NR, 1.0f);
        }
    else /* rows of B^T: 16 columns' 16 pairs transposed */
        for (jr = 0; jr < nc; jr += NR, bp += (size_t)NR * kp)
            for (c0 = 0; c0 < NR; c0 += 16)
                for (k = 0; k < kc; k += 32) {
                    __m512i v[16];
                    pt__rows16_bf16(v, B + (size_t)(j0 + jr + c0) * ldb + p0 + k, (size_t)ldb,
                                    nc - jr - c0, kc - k, one);
                    for (j = 0; j < 16 && k / 2 + j < kp; j++)
                        _mm512_store_si512((void *)(bp + (size_t)(k / 2 + j) * NR + c0), v[j]);
                }
}

/* Write an MR x NR register tile to C (m rows, n columns valid): the first K
   slab sets C = acc + beta*C (beta = 0: C is not read), later slabs add. */
#define PT__GEMM_STORE(r)                                                                 \
    if ((r) < m) {                                                                        \
        float *cr = c + (size_t)(r) * ldc;                                                \
        __m512 v0 = c##r##_0, v1 = c##r##_1;                                              \
        if (!first) {                                                                     \
            v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(k0, cr));                        \
            v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(k1, cr + 16));                   \
        } else if (beta != 0.0f) {                                                        \
            v0 = _mm512_fmadd_ps(vbeta, _mm512_maskz_loadu_ps(k0, cr), v0);               \
            v1 = _mm512_fmadd_ps(vbeta, _mm512_maskz_loadu_ps(k1, cr + 16), v1);          \
        }                                                                                 \
        _mm512_mask_storeu_ps(cr, k0, v0);                                                \
        _mm512_mask_storeu_ps(cr + 16, k1, v1);                                           \
    }
/* C's lines of the tile fetched (for writing) a few dozen k before the end:
   missed, the tile's loads and stores stall the kernel at its end */
#define PT__GEMM_PF(r)                                                                    \
    if ((r) < m) {                                                                        \
        __builtin_prefetch(c + (size_t)(r) * ldc, 1, 3);                                  \
        __builtin_prefetch(c + (size_t)(r) * ldc + 16, 1, 3);                             \
    }
#define PT__GEMM_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define PT__GEMM_DECL(r) __m512 c##r##_0 = _mm512_setzero_ps(), c##r##_1 = c##r##_0;

#define PT__GEMM_TAIL                                                                     \
    {                                                                                     \
        __mmask16 k0 = (__mmask16)(n >= 16 ? 0xFFFFu : (1u << n) - 1u);                  \
        __mmask16 k1 = (__mmask16)(n >= 32 ? 0xFFFFu : n <= 16 ? 0u : (1u << (n - 16)) - 1u); \
        __m512 vbeta = _mm512_set1_ps(beta);                                              \
        PT__GEMM_ROWS(PT__GEMM_STORE)                                                     \
    }

/* The first slab's bias (not NULL: C = acc + bias[col], beta 0; the same
   sum as C filled with bias and beta 1, fmadd(1, C, acc) rounding once). */
#define PT__GEMM_ADD_BIAS(r)                       \
    c##r##_0 = _mm512_add_ps(c##r##_0, vbias0);    \
    c##r##_1 = _mm512_add_ps(c##r##_1, vbias1);
#define PT__GEMM_BIAS                                                                     \
    if (bias && first) {                                                                  \
        __m512 vbias0 = _mm512_maskz_loadu_ps(pt__mask16(n), bias);                      \
        __m512 vbias1 = _mm512_maskz_loadu_ps(pt__mask16(n - 16), bias + 16);            \
        PT__GEMM_ROWS(PT__GEMM_ADD_BIAS)                                                  \
    }

/* fp32 micro-kernel: C[0:m, 0:n] (+)= ap (MR x kc) @ bp (kc x NR) (+ bias[0:n]). */
PT__TARGET_AVX512 static void pt__gemm_kernel_f32b(int kc, const float *ap, const float *bp,
                                                   float *c, int ldc, int m, int n, int first,
                                                   float beta, const float *bias) {
    int k, pass, steps;
    PT__GEMM_ROWS(PT__GEMM_DECL)
    for (pass = 0; pass < 2; pass++) { /* then C's lines prefetched, 48 steps from the end */
        steps = pass ? (kc < 48 ? kc : 48) : (kc > 48 ? kc - 48 : 0);
        if (pass) { PT__GEMM_ROWS(PT__GEMM_PF) }
        for (k = 0; k < steps; k++) {
            __m512 b0 = _mm512_load_ps(bp), b1 = _mm512_load_ps(bp + 16), a;
#define PT__GEMM_FMA(r)                           \
    a = _mm512_set1_ps(ap[r]);                    \
    c##r##_0 = _mm512_fmadd_ps(a, b0, c##r##_0); \
    c##r##_1 = _mm512_fmadd_ps(a, b1, c##r##_1);
            PT__GEMM_ROWS(PT__GEMM_FMA)
#undef PT__GEMM_FMA
            ap += PT__GEMM_MR;
            bp += PT__GEMM_NR;
        }
    }
    PT__GEMM_BIAS
    PT__GEMM_TAIL
}

/* bf16 micro-kernel: kp = kc/2 k-pairs, ap/bp packed as pairs of bf16. */
PT__TARGET_BF16 static void pt__gemm_kernel_bf16b(int kp, const uint32_t *ap, const uint32_t *bp,
                                                  float *c, int ldc, int m, int n, int first,
                                                  float beta, const float *bias) {
    int k, pass, steps;
    PT__GEMM_ROWS(PT__GEMM_DECL)
    for (pass = 0; pass < 2; pass++) { /* then C's lines prefetched, 24 steps from the end */
        steps = pass ? (kp < 24 ? kp : 24) : (kp > 24 ? kp - 24 : 0);
        if (pass) { PT__GEMM_ROWS(PT__GEMM_PF) }
        for (k = 0; k < steps; k++) {
            __m512bh b0 = (__m512bh)_mm512_load_si512((const void *)bp);
            __m512bh b1 = (__m512bh)_mm512_load_si512((const void *)(bp + 16));
            __m512bh a;
#define PT__GEMM_DOT(r)                                 \
    a = (__m512bh)_mm512_set1_epi32((int)ap[r]);        \
    c##r##_0 = _mm512_dpbf16_ps(c##r##_0, a, b0);       \
    c##r##_1 = _mm512_dpbf16_ps(c##r##_1, a, b1);
            PT__GEMM_ROWS(PT__GEMM_DOT)
#undef PT__GEMM_DOT
            ap += PT__GEMM_MR;
            bp += PT__GEMM_NR;
        }
    }
    PT__GEMM_BIAS
    PT__GEMM_TAIL
}

#undef PT__GEMM_BIAS
#undef PT__GEMM_ADD_BIAS
/* The micro-kernels without a bias (fused attention's). */
PT__TARGET_AVX512 static void pt__gemm_kernel_f32(int kc, const float *ap, const float *bp,
                                                  float *c, int ldc, int m, int n, int first,
                                                  float beta) {
    pt__gemm_kernel_f32b(kc, ap, bp, c, ldc, m, n, first, beta, NULL);
}
PT__TARGET_BF16 static void pt__gemm_kernel_bf16(int kp, const uint32_t *ap, const uint32_t *bp,
                                                 float *c, int ldc, int m, int n, int first,
                                                 float beta) {
    pt__gemm_kernel_bf16b(kp, ap, bp, c, ldc, m, n, first, beta, NULL);
}

/* K slabs: the fewest of at most KC (fp32) or 2 KC (bf16: the same bytes) k
   each, equal but for the last, a multiple of 32 deep (whole packing blocks).
   They depend on K alone, so every element of C sums the same products in
   the same order whatever the partition. */
static int pt__gemm_kstep(int bf16, int K) {
    int kmax = bf16 ? 2 * PT__GEMM_KC : PT__GEMM_KC, ns = (K + kmax - 1) / kmax;
    return ((K + ns - 1) / ns + 31) & ~31;
}

/* What the blocked driver computes: fp32 products, bf16 pairs (vdpbf16ps),
   or fp32 products of operands rounded to bf16 as they are packed
   (pt_gemm_bf16's "sgemm" on ptrain's fp32 kernel). */
#define PT__KIND_F32 0
#define PT__KIND_BF16 1
#define PT__KIND_F32_OF_BF16 2

/* x[i] = bf16(x[i]), the packed panels' n floats (their zero padding stays). */
PT__TARGET_AVX512 static void pt__bf16_round_panel(float *x, size_t n) {
    size_t i;
    PT__OMP(omp simd)
    for (i = 0; i < n; i++) {
        pt__f32u v;
        v.u = (uint32_t)pt__bf16_bits(x[i]) << 16;
        x[i] = v.f;
    }
}

/* A product the blocked driver runs: C = alpha op(A) op(B) + beta C (+ bias
   in each row where bias is not NULL, beta 0), `kind` of arithmetic. */
typedef struct pt__gemm_job {
    int kind, ta, tb, M, N, K, lda, ldb, ldc;
    float alpha, beta;
    const float *A, *B, *bias;
    float *C;
} pt__gemm_job;

/* Micro-panels q0..q1 of the B slab (columns jc.., k = pc..pc+kc) into bp at
   their places (panel q at bp + q*NR*kw words). */
static void pt__gemm_pack_b_part(const pt__gemm_job *g, float *bp, int jc, int nc, int pc, int kc,
                                 int q0, int q1) {
    const int NR = PT__GEMM_NR, bf16 = g->kind == PT__KIND_BF16;
    int j0 = q0 * NR, n = nc - j0 < (q1 - q0) * NR ? nc - j0 : (q1 - q0) * NR;
    size_t off = (size_t)j0 * (bf16 ? (kc + 1) / 2 : kc);
    if (n <= 0) return;
    if (bf16) pt__pack_b_bf16((uint32_t *)bp + off, g->tb, g->B, g->ldb, jc + j0, n, pc, kc);
    else pt__pack_b_f32(bp + off, g->tb, g->B, g->ldb, jc + j0, n, pc, kc);
    if (g->kind == PT__KIND_F32_OF_BF16)
        pt__bf16_round_panel(bp + off, (size_t)(q1 - q0) * NR * kc);
}

/* One thread's rectangle of C, rows m0..m1 and columns n0..n1, in the BLIS
   loop order: for each MC-row chunk and K slab, the chunk's A micro-panels
   packed once (ap, L3); for each NC-column panel, its B slab packed once (L2:
   KC x NC); then every MR x NR tile of the panel, the A micro-panel (L1)
   walking the slab's micro-panels. team > 1: the team's threads (this one
   its t-th) share the columns and each B slab, each packing its share of the
   slab's micro-panels into bs[s % 2] for the s-th slab, then a barrier (two
   buffers: a thread packing slab s + 2 has passed slab s + 1's barrier, so
   every thread is done with slab s); all run nchunk MC chunks (some empty)
   so they meet at the same barriers. team 1: bs[0] is the thread's own. */
static void pt__gemm_rect(const pt__gemm_job *g, int m0, int m1, int n0, int n1, int nchunk,
                          int team, int t, float *ap, float *const bs[2]) {
    const int MR = PT__GEMM_MR, NR = PT__GEMM_NR, bf16 = g->kind == PT__KIND_BF16;
    int ks = pt__gemm_kstep(bf16, g->K), ch, pc, jc, ir, q, slab = 0;
    for (ch = 0; ch < nchunk; ch++) {
        int ic = m0 + ch * PT__GEMM_MC, mc = m1 - ic < PT__GEMM_MC ? m1 - ic : PT__GEMM_MC;
        for (pc = 0; pc < g->K; pc += ks) {
            int kc = g->K - pc < ks ? g->K - pc : ks, kw = bf16 ? (kc + 1) / 2 : kc;
            int first = pc == 0;
            if (mc > 0 && bf16)
                pt__pack_a_bf16((uint32_t *)ap, g->ta, g->A, g->lda, ic, mc, pc, kc, g->alpha);
            else if (mc > 0)
                pt__pack_a_f32(ap, g->ta, g->A, g->lda, ic, mc, pc, kc, g->alpha);
            if (mc > 0 && g->kind == PT__KIND_F32_OF_BF16)
                pt__bf16_round_panel(ap, (size_t)(mc + MR - 1) / MR * MR * kc);
            for (jc = n0; jc < n1; jc += PT__GEMM_NC, slab++) {
                int nc = n1 - jc < PT__GEMM_NC ? n1 - jc : PT__GEMM_NC, npan = (nc + NR - 1) / NR;
                float *bp = bs[team > 1 ? slab & 1 : 0];
                pt__gemm_pack_b_part(g, bp, jc, nc, pc, kc, npan * t / team,
                                     npan * (t + 1) / team);
                if (team > 1) {
                    PT__OMP(omp barrier)
                }
                for (ir = 0; ir < mc; ir += MR) {
                    int m = mc - ir < MR ? mc - ir : MR;
                    const float *a = ap + (size_t)ir * kw;
                    for (q = 0; q < npan; q++) {
                        int n = nc - q * NR < NR ? nc - q * NR : NR;
                        float *c = g->C + (size_t)(ic + ir) * g->ldc + jc + q * NR;
                        const float *bq = g->bias ? g->bias + jc + q * NR : NULL;
                        if (bf16)
                            pt__gemm_kernel_bf16b(kw, (const uint32_t *)a,
                                                  (const uint32_t *)bp + (size_t)q * NR * kw, c,
                                                  g->ldc, m, n, first, g->beta, bq);
                        else
                            pt__gemm_kernel_f32b(kw, a, bp + (size_t)q * NR * kw, c, g->ldc, m,
                                                 n, first, g->beta, bq);
                    }
                }
            }
        }
    }
}

/* The thread grid of tm x tn rectangles over MR-row and NR-column units on
   nth threads (returns tn): rows alone (tn 1) where every thread gets rows,
   the team then sharing each B slab, so a thread packs K x (M + N)/nth, the
   least; else the grid that packs least a thread, K x (its rows, once; its
   columns, once a chunk). */
static int pt__gemm_grid(int nth, int mu, int nu) {
    double best = 1e300;
    int g, tn = 1;
    if (mu >= nth) return 1;
    for (g = 1; g <= nth; g++) {
        double rows = (double)((mu + nth / g - 1) / (nth / g)) * PT__GEMM_MR, cost;
        if (nth % g || g > nu || nth / g > mu) continue;
        cost = rows + (double)((nu + g - 1) / g) * PT__GEMM_NR * ceil(rows / PT__GEMM_MC);
        if (cost <= best) best = cost, tn = g;
    }
    return tn;
}

/* The blocked driver for every kind: C cut into one rectangle a thread (the
   grid of pt__gemm_grid), on at most w->threads threads, each packing A in
   its own slot of the workspace w (w->p not NULL); B slabs in each thread's
   slot after its A (tn > 1), or, the threads sharing all columns (tn 1),
   shared by the team in slots 0 and 1's (pt__gemm_rect). A thread packs at
   most MC x KC words of A and KC x NC of B: PT__WS_SLOT bytes. bias (not
   NULL, beta 0): the kernels add bias[col] to C's first K slab. */
static void pt__gemm_blocked(const pt__gemm_ws *w, int kind, int ta, int tb, int M, int N, int K,
                             float alpha, const float *A, int lda, const float *B, int ldb,
                             float beta, float *C, int ldc, const float *bias) {
    const int MR = PT__GEMM_MR, NR = PT__GEMM_NR, bf16 = kind == PT__KIND_BF16;
    int nth = w->threads, tn, tm, ks = pt__gemm_kstep(bf16, K), mmax, nchunk;
    int mu = (M + MR - 1) / MR, nu = (N + NR - 1) / NR;
    size_t abytes;
    pt__gemm_job g;
    g.kind = kind, g.ta = ta, g.tb = tb, g.M = M, g.N = N, g.K = K, g.lda = lda, g.ldb = ldb;
    g.ldc = ldc, g.alpha = alpha, g.beta = beta, g.A = A, g.B = B, g.bias = bias, g.C = C;
    if ((double)M * N * K < 4e6 * nth) /* at least 4e6 multiply-adds a thread */
        nth = (int)((double)M * N * K / 4e6) + 1;
    if (nth > mu * nu) nth = mu * nu;
    tn = pt__gemm_grid(nth, mu, nu);
    tm = nth / tn;
    mmax = (mu + tm - 1) / tm * MR; /* the most rows a thread has */
    mmax = mmax < M ? mmax : M;
    nchunk = (mmax + PT__GEMM_MC - 1) / PT__GEMM_MC;
    /* A: panels of MR rows x kstep (4-byte words either way); B after it, in every slot */
    abytes = (size_t)((mmax < PT__GEMM_MC ? mmax : PT__GEMM_MC) + MR - 1) / MR * MR *
             (bf16 ? ks / 2 : ks) * 4;
    abytes = (abytes + 63) & ~(size_t)63;
    PT__OMP(omp parallel num_threads(nth) if (nth > 1))
    {
        int t = 0, ti, tj, m0, m1, n0, n1, team = tn == 1 ? nth : 1;
        unsigned char *ws;
        float *bs[2];
#ifdef _OPENMP
        t = omp_get_thread_num();
#endif
        ti = t / tn, tj = t % tn;
        m0 = (int)((long long)mu * ti / tm) * MR, m1 = (int)((long long)mu * (ti + 1) / tm) * MR;
        n0 = (int)((long long)nu * tj / tn) * NR, n1 = (int)((long long)nu * (tj + 1) / tn) * NR;
        if (m1 > M) m1 = M;
        if (n1 > N) n1 = N;
        ws = w->p + (size_t)t * w->slot;
        bs[0] = (float *)((team > 1 ? w->p : ws) + abytes);
        bs[1] = (float *)((team > 1 ? w->p + w->slot : ws) + abytes);
        if (team > 1 || (m0 < m1 && n0 < n1))
            pt__gemm_rect(&g, m0, m1, n0, n1, nchunk, team, team > 1 ? t : 0, (float *)ws, bs);
    }
}

/* ---- AMX (bf16) ---------------------------------------------------------
   The same BLIS blocking with its own sizes, for TDPBF16PS: a tile register
   holds 16 rows of 64 bytes; C[16x16] fp32 += A[16x32] bf16 @ B[32x16] bf16,
   B in pairs of k (row k/2 of the tile: 16 columns of (b[k][c], b[k+1][c])),
   which is the bf16 B micro-panel layout above, 128-byte rows (NR = 32), so B
   tiles load from it with stride 128, columns 16..31 at +64 bytes. A is packed
   row-major in k instead. The micro-kernel is 2x2 tiles: C 32x32 in tiles 0-3,
   A rows 0-15 and 16-31 in tiles 4-5, B columns 0-15 and 16-31 in tiles 6-7.
   k is zero-padded to a multiple of 32, rows and columns to 32. One OpenMP
   region runs the whole product, so each thread loads the tile config once
   and releases the tiles at the end. A 32-row micro-panel of A (32 x KC
   bf16, 32 KiB) stays in L1 while the tiles walk the B slab (KC x NC bf16,
   at most 1 MiB) in L2. */
#define PT__AMX_KC 512  /* multiple of 32 */
#define PT__AMX_MC 128  /* multiple of 32 */
#define PT__AMX_NC 1024 /* the most columns a B slab has */
#define PT__AMX_ASHARE (8u << 20) /* the most bytes of a shared packed A slab */
#define PT__TARGET_AMX                                                                        \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,prfchw,"      \
                          "amx-tile,amx-bf16")))

/* gcc's tile intrinsics are asm without a memory operand: this orders the
   plain stores before them (packing, the config) and the loads after them. */
#define PT__AMX_FENCE() __asm__ volatile("" ::: "memory")

/* Palette 1, all 8 tiles 16 rows x 64 bytes. */
PT__TARGET_AMX static void pt__amx_config(void) {
    __attribute__((aligned(64))) unsigned char cfg[64];
    int t;
    memset(cfg, 0, sizeof cfg);
    cfg[0] = 1;
    for (t = 0; t < 8; t++) {
        cfg[16 + 2 * t] = 64; /* colsb[t], little-endian 16-bit */
        cfg[48 + t] = 16;     /* rows[t] */
    }
    PT__AMX_FENCE();
    _tile_loadconfig(cfg);
}

PT__TARGET_AMX static void pt__amx_release(void) { _tile_release(); }

/* Transpose 16 rows of 16 32-bit words: word i of v[j] goes to word j of row
   i, rows `stride` words apart from dst (64-byte aligned). */
PT__TARGET_AMX static void pt__amx_transpose16(__m512i *v, uint32_t *dst, size_t stride) {
    int j;
    pt__tr16(v);
    for (j = 0; j < 16; j++) _mm512_store_si512((void *)(dst + j * stride), v[j]);
}

/* Pack rows i0..i0+mc of alpha*op(A), k = p0..p0+kc, as A tiles: 16-row block
   rb, 32-deep k block kb at ap + (rb*nkb + kb)*512 bf16, row r%16 of it the 32
   values bf16(alpha*a[r][k]) in k order (nkb = kc/32 rounded up). Rows past mc
   (up to a multiple of 32) and k past kc are zero. */
PT__TARGET_AMX static void pt__amx_pack_a(uint16_t *ap, int ta, const float *A, int lda, int i0,
                                          int mc, int p0, int kc, float alpha) {
    int nkb = (kc + 31) / 32, mpad = (mc + 31) & ~31, r, kb;
    __m512 vs = _mm512_set1_ps(alpha);
    if (!ta) { /* rows of A run along k: 32 k a 64-byte tile row */
        for (r = 0; r < mpad; r++) {
            uint16_t *dst = ap + (size_t)(r / 16) * nkb * 512 + (r % 16) * 32;
            const float *a = r < mc ? A + (size_t)(i0 + r) * lda + p0 : NULL;
            for (kb = 0; kb < nkb; kb++, dst += 512)
                _mm512_store_si512((void *)dst, a ? pt__bf16_pairs32(a + kb * 32, kc - kb * 32, vs)
                                                  : _mm512_setzero_si512());
        }
    } else { /* rows of op(A)^T run along i: pairs of k rows, then a 16x16 transpose of pairs */
        for (r = 0; r < mpad; r += 16) {
            int m = mc - r < 0 ? 0 : mc - r > 16 ? 16 : mc - r;
            __mmask16 km = (__mmask16)((1u << m) - 1u);
            for (kb = 0; kb < nkb; kb++) {
                __m512i v[16];
                uint16_t *dst = ap + ((size_t)(r / 16) * nkb + kb) * 512;
                int j;
                for (j = 0; j < 16; j++) { /* v[j][i] = (a[i][k], a[i][k+1]), k = kb*32 + 2j */
                    int k = kb * 32 + 2 * j;
                    __m512 x0 = _mm512_setzero_ps(), x1 = x0;
                    if (k < kc && m > 0)
                        x0 = _mm512_mul_ps(vs, _mm512_maskz_loadu_ps(km, A + (size_t)(p0 + k) * lda + i0 + r));
                    if (k + 1 < kc && m > 0)
                        x1 = _mm512_mul_ps(vs, _mm512_maskz_loadu_ps(km, A + (size_t)(p0 + k + 1) * lda + i0 + r));
                    v[j] = pt__bf16_zip(x0, x1);
                }
                pt__amx_transpose16(v, (uint32_t *)dst, 16);
            }
        }
    }
}

/* B micro-panel q of the slab (columns jc+q*NR.., k = pc..pc+kc) at
   bp + q*NR*kpad/2 words, pairs bp[k/2][c] zero past nc and kc up to kpad:
   op(B) in rows of k (tb = 0) by the bf16 panel packing; columns of B^T
   (tb = 1) run along k, so 16 columns' 16 pairs are transposed as words. */
PT__TARGET_AMX static void pt__amx_pack_b(uint32_t *bp, int tb, const float *B, int ldb, int jc,
                                          int nc, int pc, int kc, int kpad, int q) {
    const int NR = PT__GEMM_NR;
    int kp = (kc + 1) & ~1, nr = nc - q * NR < NR ? nc - q * NR : NR, c0, c, kb;
    uint32_t *dst = bp + (size_t)q * NR * (kpad / 2);
    __m512 one = _mm512_set1_ps(1.0f);
    if (!tb) {
        pt__pack_b_bf16(dst, 0, B, ldb, jc + q * NR, nr, pc, kc);
        memset(dst + (size_t)NR * (kp / 2), 0, (size_t)NR * (kpad - kp) / 2 * sizeof(uint32_t));
        return;
    }
    for (c0 = 0; c0 < NR; c0 += 16)
        for (kb = 0; kb < kpad / 32; kb++) {
            __m512i v[16]; /* v[c] word j = (b[k][c], b[k+1][c]), k = kb*32 + 2j */
            for (c = 0; c < 16; c++)
                v[c] = c0 + c >= nr ? _mm512_setzero_si512()
                                    : pt__bf16_pairs32(B + (size_t)(jc + q * NR + c0 + c) * ldb +
                                                           pc + kb * 32,
                                                       kc - kb * 32, one);
            pt__amx_transpose16(v, dst + (size_t)kb * 16 * NR + c0, (size_t)NR);
        }
}

/* C[0:m, 0:n] (+)= A (32 x 32*nkb, tiles at ap and ap + nkb*512) @ B panel bp.
   A whole 32x32 block accumulates in the tiles straight from C when C is
   added as it is (later slabs, or beta = 1); else the tiles start at zero and
   the sum goes through buf: C = sum + (first ? beta*C : C), beta = 0 not read. */
PT__TARGET_AMX static void pt__gemm_kernel_amx(int nkb, const uint16_t *ap, const uint32_t *bp,
                                               float *c, int ldc, int m, int n, int first,
                                               float beta) {
    __attribute__((aligned(64))) float buf[32 * 32];
    const uint16_t *ap1 = ap + (size_t)nkb * 512;
    const size_t ldcb = (size_t)ldc * sizeof(float);
    int full = m == 32 && n == 32, direct = full && (!first || beta == 1.0f), kb, r;
    PT__AMX_FENCE();
    if (direct) {
        _tile_loadd(0, c, ldcb);
        _tile_loadd(1, c + 16, ldcb);
        _tile_loadd(2, c + (size_t)16 * ldc, ldcb);
        _tile_loadd(3, c + (size_t)16 * ldc + 16, ldcb);
    } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
    for (kb = 0; kb < nkb; kb++) { /* k block kb: B rows 16*kb.. of 128 bytes */
        if (full) /* C rows kb*32/nkb.. to be written: their lines fetched early, for writing */
            for (r = kb * 32 / nkb; r < (kb + 1) * 32 / nkb; r++) {
                __builtin_prefetch(c + (size_t)r * ldc, 1, 3);
                __builtin_prefetch(c + (size_t)r * ldc + 31, 1, 3);
            }
        _tile_loadd(4, ap + (size_t)kb * 512, 64);
        _tile_loadd(6, bp + (size_t)kb * 16 * PT__GEMM_NR, 128);
        _tile_loadd(7, bp + (size_t)kb * 16 * PT__GEMM_NR + 16, 128);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(5, ap1 + (size_t)kb * 512, 64);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    if (direct || (full && beta == 0.0f)) {
        _tile_stored(0, c, ldcb);
        _tile_stored(1, c + 16, ldcb);
        _tile_stored(2, c + (size_t)16 * ldc, ldcb);
        _tile_stored(3, c + (size_t)16 * ldc + 16, ldcb);
        return;
    }
    _tile_stored(0, buf, 128);
    _tile_stored(1, buf + 16, 128);
    _tile_stored(2, buf + 16 * 32, 128);
    _tile_stored(3, buf + 16 * 32 + 16, 128);
    PT__AMX_FENCE();
    {
        __mmask16 k0 = (__mmask16)(n >= 16 ? 0xFFFFu : (1u << n) - 1u);
        __mmask16 k1 = (__mmask16)(n >= 32 ? 0xFFFFu : n <= 16 ? 0u : (1u << (n - 16)) - 1u);
        __m512 vb = _mm512_set1_ps(first ? beta : 1.0f);
        for (r = 0; r < m; r++) {
            float *cr = c + (size_t)r * ldc;
            __m512 v0 = _mm512_load_ps(buf + r * 32), v1 = _mm512_load_ps(buf + r * 32 + 16);
            if (!first || beta != 0.0f) {
                v0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(k0, cr), v0);
                v1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(k1, cr + 16), v1);
            }
            _mm512_mask_storeu_ps(cr, k0, v0);
            _mm512_mask_storeu_ps(cr + 16, k1, v1);
        }
    }
}

/* The AMX driver: pt__gemm_blocked's loops in one OpenMP region, K slabs
   outermost, N cut into equal panels of at most NC columns (the B slab, 1
   MiB at most, stays in L2: measured 1.6x faster than 1.5 MiB). Where N has
   more than one panel and the M x KC bf16 slab of A fits AMX_ASHARE bytes,
   A is packed once a slab, by all threads, and shared (where it fits the
   workspace: sharing or not, the same numbers): else each thread packs its
   block again for each panel. Buffers: the workspace w (all its threads'
   slots; w->p not NULL), at most 1 MiB of B and MC x KC bf16 a thread. */

static void pt__gemm_amx(const pt__gemm_ws *w, int ta, int tb, int M, int N, int K, float alpha,
                         const float *A, int lda, const float *B, int ldb, float beta, float *C,
                         int ldc) {
    const int NR = PT__GEMM_NR, KC = PT__AMX_KC, MC = PT__AMX_MC;
    int nth = w->threads, kcmax = K < KC ? (K + 31) & ~31 : KC;
    int njc = (N + PT__AMX_NC - 1) / PT__AMX_NC, share;
    int ncb = ((N + njc - 1) / njc + NR - 1) / NR * NR, mpad = (M + MC - 1) / MC * MC;
    size_t bwords = (size_t)ncb * kcmax / 2;
    uint32_t *bbuf;
    share = njc > 1 && (size_t)mpad * kcmax * 2 <= PT__AMX_ASHARE &&
            bwords * 4 + (size_t)mpad * kcmax * 2 <= w->bytes;
    bbuf = (uint32_t *)w->p; /* 64-byte aligned, as are the A blocks */
    PT__OMP(omp parallel num_threads(nth) if (nth > 1))
    {
        uint16_t *abuf = (uint16_t *)(bbuf + bwords); /* the shared slab, or this thread's block */
        int jc, pc, nic = (M + MC - 1) / MC;
#ifdef _OPENMP
        if (!share) abuf += (size_t)omp_get_thread_num() * MC * kcmax;
#endif
        pt__amx_config();
        for (pc = 0; pc < K; pc += KC) {
            int kc = K - pc < KC ? K - pc : KC, kpad = (kc + 31) & ~31, first = pc == 0, i;
            if (share) {
                PT__OMP(omp for schedule(static))
                for (i = 0; i < nic; i++)
                    pt__amx_pack_a(abuf + (size_t)i * MC * kpad, ta, A, lda, i * MC,
                                   M - i * MC < MC ? M - i * MC : MC, pc, kc, alpha);
            }
            for (jc = 0; jc < N; jc += ncb) {
                int nc = N - jc < ncb ? N - jc : ncb, npan = (nc + NR - 1) / NR, nsplit = 1;
                int q, u, units, packed = -1;
                if (nic < 4 * nth) nsplit = (4 * nth + nic - 1) / nic;
                if (nsplit > npan) nsplit = npan;
                units = nic * nsplit;
                PT__OMP(omp for schedule(static))
                for (q = 0; q < npan; q++) pt__amx_pack_b(bbuf, tb, B, ldb, jc, nc, pc, kc, kpad, q);
                PT__OMP(omp for schedule(static))
                for (u = 0; u < units; u++) {
                    int ic = u / nsplit * MC, s = u % nsplit, ir, mc = M - ic < MC ? M - ic : MC;
                    int q0 = s * npan / nsplit, q1 = (s + 1) * npan / nsplit;
                    const uint16_t *ab = share ? abuf + (size_t)ic * kpad : abuf;
                    if (!share && packed != ic) pt__amx_pack_a(abuf, ta, A, lda, ic, mc, pc, kc, alpha);
                    packed = ic;
                    for (ir = 0; ir < mc; ir += 32)
                        for (q = q0; q < q1; q++) {
                            int m = mc - ir < 32 ? mc - ir : 32, n = nc - q * NR < NR ? nc - q * NR : NR;
                            pt__gemm_kernel_amx(kpad / 32, ab + (size_t)ir * kpad,
                                                bbuf + (size_t)q * NR * (kpad / 2),
                                                C + (size_t)(ic + ir) * ldc + jc + q * NR, ldc, m, n,
                                                first, beta);
                        }
                }
            }
        }
        pt__amx_release();
    }
}
#endif /* PT__GEMM_X86 */

/* Progress while computing: started MPI operations move only inside MPI
   calls, and a layer is too coarse a slice (bench/overlap.sh: a test every
   ~4 ms hides 2/3 of an all-reduce, every ~1 ms 3/4). So the executor sets
   its context's poller (pt_ctx.poll), and every GEMM entry on the thread
   that runs the call (pt__team_lead; attention's blocks on other OpenMP
   threads never poll) calls it at most once per PT__POLL_S. With slice set
   (PT__SLICE_FLOP for a model with a dp group), pt_sgemm computes C in runs
   of rows of about that many FLOP (at least 64 rows), polling between them:
   a run of rows gives other bits than the whole GEMM (BLAS's edge tiles),
   so the slicing depends on the layout alone, never on whether anything is
   under way. A poll costs: over TCP every 0.2 ms (runs of 64 MFLOP) left
   0.34 of the communication exposed at 2 Gbit/s across two namespace hosts,
   every 2 ms (500 MFLOP, ~1-2 ms of this Zen 5's cores) 0.20-0.25
   (bench/overlap.sh's row, 2026-11-26); the kernel's socket buffers keep
   the link busy between polls. */
#define PT__POLL_S 2e-3
#define PT__SLICE_FLOP 5e8

static void pt__poll_now(pt_ctx *c) {
    double t;
    if (!c || !c->poll.fn) return;
    t = pt_time_now();
    if (t < c->poll.next) return;
    c->poll.next = t + PT__POLL_S;
    c->poll.fn(c->poll.arg);
}

/* C = beta*C where the product is empty (K = 0 or alpha = 0). */
static void pt__gemm_scale(int M, int N, float beta, float *C, int ldc) {
    int i, j;
    for (i = 0; i < M; i++)
        for (j = 0; j < N; j++)
            C[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(size_t)i * ldc + j];
}

/* Every row of C (M x N) set to bias: where a GEMM cannot add the bias as it
   stores C, it runs after this with beta 1 (the same sums). */
static void pt__gemm_bias_fill(int M, int N, const float *bias, float *C, int ldc) {
    int i;
    PT__OMP(omp parallel for schedule(static))
    for (i = 0; i < M; i++) memcpy(C + (size_t)i * ldc, bias, sizeof(float) * N);
}

/* The fp32 GEMM for an M-row product: the one selected, but ptrain's kernels
   only with a workspace, and (unless ctx->all_shapes) a single row (decoding)
   to OpenBLAS where there is one: packing B for one row costs what the
   product does (0.4-1.1x, mostly below; bench_kernels --only "small gemm"
   on a Zen 5). Small shapes otherwise stay (attention's 64-query blocks
   1.5-1.8x OpenBLAS's AVX2 kernel on one thread, 2-6x on two; 32 rows 1.4x). */
static int pt__sgemm_impl(const pt_ctx *ctx, const pt__gemm_ws *w, int M) {
    int impl = pt__gemm_current();
    if (impl == PT__GEMM_PTRAIN && !w->p) {
#ifndef PTRAIN_NO_BLAS
        impl = PT__GEMM_BLAS;
#else
        impl = PT__GEMM_PORTABLE;
#endif
    }
#ifndef PTRAIN_NO_BLAS
    if (impl == PT__GEMM_PTRAIN && M == 1 && !(ctx && ctx->all_shapes)) impl = PT__GEMM_BLAS;
#endif
    (void)ctx, (void)M;
    return impl;
}

/* bias (not NULL, beta 0): C = alpha op(A) op(B) + bias in each row. */
static void pt__sgemm(const pt_ctx *ctx, const pt__gemm_ws *w, int trans_a, int trans_b, int M,
                      int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                      float beta, float *C, int ldc, const float *bias) {
    int impl = pt__sgemm_impl(ctx, w, M);
#ifdef PT__GEMM_X86
    if (impl == PT__GEMM_PTRAIN && K > 0 && alpha != 0.0f) {
        pt__gemm_blocked(w, PT__KIND_F32, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta,
                         C, ldc, bias);
        return;
    }
#endif
    if (bias) pt__gemm_bias_fill(M, N, bias, C, ldc), beta = 1.0f;
#ifdef PT__GEMM_X86
    if (impl == PT__GEMM_PTRAIN) {
        pt__gemm_scale(M, N, beta, C, ldc);
        return;
    }
#endif
#ifndef PTRAIN_NO_BLAS
    if (impl == PT__GEMM_BLAS) {
        cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                    trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C,
                    ldc);
        return;
    }
#endif
    (void)impl;
    pt__gemm_portable(0, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* pt_sgemm, with C = alpha op(A) op(B) + bias (each row) where bias is not
   NULL (beta 0). */
static void pt__sgemm_bias(pt_ctx *ctx, int trans_a, int trans_b, int M, int N, int K,
                           float alpha, const float *A, int lda, const float *B, int ldb,
                           float beta, float *C, int ldc, const float *bias) {
    double flop = 2.0 * (double)M * (double)N * (double)K, slice = 0.0;
    pt__gemm_ws w = pt__ws_of(ctx);
    int r, rows;
    if (M <= 0 || N <= 0) return;
    if (ctx && pt__team_lead()) {
        slice = ctx->poll.slice;
        pt__poll_now(ctx);
    }
    if (!(slice > 0.0) || flop < 2.0 * slice) {
        pt__sgemm(ctx, &w, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias);
        return;
    }
    rows = ((int)((double)M * slice / flop) + 63) / 64 * 64;
    if (rows < 64) rows = 64;
    for (r = 0; r < M; r += rows) {
        if (r) pt__poll_now(ctx);
        pt__sgemm(ctx, &w, trans_a, trans_b, M - r < rows ? M - r : rows, N, K, alpha,
                  trans_a ? A + r : A + (size_t)r * lda, lda, B, ldb, beta, C + (size_t)r * ldc,
                  ldc, bias);
    }
}

PTRAINDEF void pt_sgemm(pt_ctx *ctx, int trans_a, int trans_b, int M, int N, int K, float alpha,
                        const float *A, int lda, const float *B, int ldb, float beta, float *C,
                        int ldc) {
    pt__sgemm_bias(ctx, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, NULL);
}

#ifndef PTRAIN_NO_BLAS
/* dst[r][c] = bf16(s * src[r*ld + c]), r < rows, c < cols, packed */
static void pt__bf16_round_copy(float *dst, const float *src, int ld, int rows, int cols, float s) {
    int r;
    PT__OMP(omp parallel for schedule(static))
    for (r = 0; r < rows; r++) {
        int c;
        for (c = 0; c < cols; c++)
            dst[(size_t)r * cols + c] = pt__bf16_round(s * src[(size_t)r * ld + c]);
    }
}

/* OpenBLAS on operands rounded to bf16 block by block into the workspace
   (alpha folded into A before rounding, as the kernels pack it): for each
   slab of at most 512 k and 2048 columns of op(B), rounded once, the rows of
   op(A) in blocks that fill the rest; later k slabs add to C. */
static void pt__gemm_bf16_blas(const pt__gemm_ws *w, int ta, int tb, int M, int N, int K,
                               float alpha, const float *A, int lda, const float *B, int ldb,
                               float beta, float *C, int ldc) {
    int kb = K < 512 ? K : 512, nb = N < 2048 ? N : 2048, mb, pc, jc, ic;
    size_t room = w->bytes / sizeof(float) - (size_t)kb * nb;
    float *bb = (float *)w->p, *ab = bb + (size_t)kb * nb;
    mb = room / kb < (size_t)M ? (int)(room / kb) : M;
    for (pc = 0; pc < K; pc += kb) {
        int kc = K - pc < kb ? K - pc : kb;
        for (jc = 0; jc < N; jc += nb) {
            int nc = N - jc < nb ? N - jc : nb;
            if (tb) pt__bf16_round_copy(bb, B + (size_t)jc * ldb + pc, ldb, nc, kc, 1.0f);
            else pt__bf16_round_copy(bb, B + (size_t)pc * ldb + jc, ldb, kc, nc, 1.0f);
            for (ic = 0; ic < M; ic += mb) {
                int m = M - ic < mb ? M - ic : mb;
                if (ta) pt__bf16_round_copy(ab, A + (size_t)pc * lda + ic, lda, kc, m, alpha);
                else pt__bf16_round_copy(ab, A + (size_t)ic * lda + pc, lda, m, kc, alpha);
                cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                            tb ? CblasTrans : CblasNoTrans, m, nc, kc, 1.0f, ab, ta ? m : kc, bb,
                            tb ? kc : nc, pc == 0 ? beta : 1.0f, C + (size_t)ic * ldc + jc, ldc);
            }
        }
    }
}
#endif

/* pt_gemm_bf16's "sgemm": the fp32 GEMM pt_sgemm would run, on the operands
   rounded to bf16: ptrain's kernel rounds its packed panels, OpenBLAS gets
   rounded blocks (pt__gemm_bf16_blas); 0 where neither can run (no
   workspace, or the portable GEMM: the caller runs the bf16 loops, the same
   numbers as the portable fp32 loops on rounded operands). */
static int pt__gemm_bf16_sgemm(const pt_ctx *ctx, const pt__gemm_ws *w, int ta, int tb, int M,
                               int N, int K, float alpha, const float *A, int lda, const float *B,
                               int ldb, float beta, float *C, int ldc, const float *bias) {
    int impl = pt__sgemm_impl(ctx, w, M);
    if (!w->p) return 0;
#ifdef PT__GEMM_X86
    if (impl == PT__GEMM_PTRAIN) {
        pt__gemm_blocked(w, PT__KIND_F32_OF_BF16, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C,
                         ldc, bias);
        return 1;
    }
#endif
#ifndef PTRAIN_NO_BLAS
    if (impl == PT__GEMM_BLAS) {
        if (bias) pt__gemm_bias_fill(M, N, bias, C, ldc), beta = 1.0f;
        pt__gemm_bf16_blas(w, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return 1;
    }
#endif
    (void)impl, (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda;
    (void)B, (void)ldb, (void)beta, (void)C, (void)ldc, (void)bias;
    return 0;
}

/* pt_gemm_bf16, with C = alpha op(A) op(B) + bias (each row) where bias is
   not NULL (beta 0): ptrain's kernels add it as they store C's first K
   slab, the other paths run on C filled with it (beta 1). */
static void pt__gemm_bf16_bias(pt_ctx *ctx, int trans_a, int trans_b, int M, int N, int K,
                               float alpha, const float *A, int lda, const float *B, int ldb,
                               float beta, float *C, int ldc, const float *bias) {
    int impl;
    pt__gemm_ws w = pt__ws_of(ctx);
    if (M <= 0 || N <= 0) return;
    if (pt__team_lead()) pt__poll_now(ctx);
    impl = pt__gemm_bf16_current();
    if (bias && (!w.p || impl == PT__BF16_AMX || impl == PT__BF16_PORTABLE || K <= 0 ||
                 alpha == 0.0f))
        pt__gemm_bias_fill(M, N, bias, C, ldc), beta = 1.0f, bias = NULL;
    if (impl != PT__BF16_PORTABLE && (K <= 0 || alpha == 0.0f)) {
        pt__gemm_scale(M, N, beta, C, ldc);
        return;
    }
#ifdef PT__GEMM_X86
    if (w.p && impl == PT__BF16_AMX) {
        pt__gemm_amx(&w, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    if (w.p && impl == PT__BF16_AVX512) {
        pt__gemm_blocked(&w, PT__KIND_BF16, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta,
                         C, ldc, bias);
        return;
    }
#endif
    if (impl == PT__BF16_SGEMM &&
        pt__gemm_bf16_sgemm(ctx, &w, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C,
                            ldc, bias))
        return;
    if (bias) pt__gemm_bias_fill(M, N, bias, C, ldc), beta = 1.0f;
    pt__gemm_portable(1, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

PTRAINDEF void pt_gemm_bf16(pt_ctx *ctx, int trans_a, int trans_b, int M, int N, int K,
                            float alpha, const float *A, int lda, const float *B, int ldb,
                            float beta, float *C, int ldc) {
    pt__gemm_bf16_bias(ctx, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, NULL);
}

/* columns per task in column-reduction loops (each column's sum runs over
   the rows in order whatever the block: the size changes no bit). 128 reads
   512 bytes of a row at a time: 2.5x the speed of 32 on LayerNorm's weight
   gradient (gpt2-124m's rows, one thread) */
#define PT__COLBLOCK 128

/* A float's order as a signed integer: x < y iff ford(x) < ford(y), NaN aside
   (the same map takes the integer back to the float's bits). */
static inline int32_t pt__ford(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return (int32_t)(u ^ ((uint32_t)((int32_t)u >> 31) & 0x7FFFFFFFu));
}

/* e^x in float, within 2 ulp, written so loops over it vectorise:
   x = n ln2 + r with |r| <= ln2/2 (ln2 split in two for exactness),
   e^r by its degree-7 Taylor-like minimax polynomial, 2^n by exponent bits.
   Inputs below -87.3 give 0 (never a subnormal), -inf too; from 127.5 ln2
   (about 88.38; e^x itself overflows at 88.72) +inf; NaN stays NaN. */
static inline float pt__expf(float x0) {
    float t, n, r, p, scale, x;
    uint32_t bits, u0, keep, nan;
    /* clamp to [-87.3, 88.7], and the selects below, on integers as masks: gcc
       if-converts no float select (nor one it can turn into a branch around the
       arithmetic) without AVX-512's masks, and the loop would not vectorise */
    int32_t lo = pt__ford(-87.3f), hi = pt__ford(88.7f), k0 = pt__ford(x0), k;
    k = k0 > hi ? hi : k0;
    k = k < lo ? lo : k;
    bits = (uint32_t)k ^ ((uint32_t)(k >> 31) & 0x7FFFFFFFu); /* ford's inverse */
    memcpy(&x, &bits, 4);
    t = x * 1.44269504f + 12582912.0f; /* 1.5*2^23: round x/ln2 to an integer */
    n = t - 12582912.0f;
    r = x - n * 0.693359375f + n * 2.12194440e-4f;
    p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    memcpy(&bits, &t, 4);
    bits = (bits - 0x4B400000u + 127u) << 23; /* (n + 127) as the exponent */
    memcpy(&scale, &bits, 4);
    p *= scale;
    /* 0 below -87.3 (never a subnormal); NaN stays a (quiet) NaN */
    memcpy(&u0, &x0, 4);
    memcpy(&bits, &p, 4);
    keep = 0u - (uint32_t)(k0 >= lo);
    nan = 0u - (uint32_t)((u0 & 0x7FFFFFFFu) > 0x7F800000u);
    bits = (bits & keep & ~nan) | ((u0 | 0x00400000u) & nan);
    memcpy(&p, &bits, 4);
    return p;
}

#ifdef __AVX512F__
/* pt__expf on 16 lanes, the same operations in the same order (no FMA: the
   scalar one is compiled without contraction), so the same bits on every
   input: the clamp as min/max (ford is the float order), then 0 below -87.3
   and NaN kept by masks. gcc's own vectorisation of pt__expf does the clamp
   and selects on integers: this is about half its instructions. */
static inline __m512 pt__expf16(__m512 x0) {
    const __m512 big = _mm512_set1_ps(12582912.0f), lo = _mm512_set1_ps(-87.3f);
    __m512 x = _mm512_max_ps(_mm512_min_ps(x0, _mm512_set1_ps(88.7f)), lo);
    __m512 t = _mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), big);
    __m512 n = _mm512_sub_ps(t, big), r, p;
    __m512i e;
    __mmask16 keep = _mm512_cmp_ps_mask(x0, lo, _CMP_GE_OQ);
    __mmask16 nan = _mm512_cmp_ps_mask(x0, x0, _CMP_UNORD_Q);
    r = _mm512_add_ps(_mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(0.693359375f))),
                      _mm512_mul_ps(n, _mm512_set1_ps(2.12194440e-4f)));
    p = _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(1.9875691500e-4f), r),
                      _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(p, r), r), r),
                      _mm512_set1_ps(1.0f));
    e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_castps_si512(t),
                                           _mm512_set1_epi32((int)(127u - 0x4B400000u))), 23);
    p = _mm512_maskz_mov_ps(keep, _mm512_mul_ps(p, _mm512_castsi512_ps(e)));
    return _mm512_mask_mov_ps(p, nan, _mm512_castsi512_ps(_mm512_or_si512(
                                          _mm512_castps_si512(x0), _mm512_set1_epi32(0x00400000))));
}

/* -x on 16 lanes (the sign bit flipped, as C's unary minus) */
static inline __m512 pt__neg16(__m512 x) {
    return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x),
                                                _mm512_set1_epi32(INT32_MIN)));
}
#endif

/* max_i x_i (n >= 1) over 16 lanes of elementwise selects, which gcc and
   clang both vectorise (neither vectorises a float max reduction as such). */
static float pt__maxf(const float *x, int n) {
    float lane[16], mx;
    int i, j;
    for (j = 0; j < 16; j++) lane[j] = x[0];
    for (i = 0; i + 16 <= n; i += 16)
        for (j = 0; j < 16; j++) lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
    mx = lane[0];
    for (j = 1; j < 16; j++) mx = lane[j] > mx ? lane[j] : mx;
    for (; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    return mx;
}

/* sum_i exp(x_i - mx) for x_i <= mx: float sums of 1024 terms (each <= 1,
   so exact to ~1e-5 relative at worst), added in double; vectorises. */
static double pt__sum_exp(const float *x, int n, float mx) {
    double sum = 0.0;
    int i0, i;
    for (i0 = 0; i0 < n; i0 += 1024) {
        int i1 = i0 + 1024 < n ? i0 + 1024 : n;
        float part = 0.0f;
        PT__OMP(omp simd reduction(+:part))
        for (i = i0; i < i1; i++) part += pt__expf(x[i] - mx);
        sum += part;
    }
    return sum;
}


/* The embedding when this rank holds rows [v0, v0+Vl) of wte (vocabulary
   parallelism): a token outside them contributes 0, and wpe may be NULL (the
   ranks' sum then adds it once). v0 = 0, Vl = V is the plain kernel. */
static void pt__encoder_forward_part(float *out, const int *inp, const float *wte,
                                     const float *wpe, const int *pos, int v0, int Vl, int B,
                                     int T, int C) {
    int n;
    PT__OMP(omp parallel for schedule(static))
    for (n = 0; n < B * T; n++) {
        int row = inp[n] - v0, c, t = pos ? pos[n % T] : n % T;
        const float *e = row >= 0 && row < Vl ? wte + (size_t)row * C : NULL;
        const float *p = wpe ? wpe + (size_t)t * C : NULL;
        float *o = out + (size_t)n * C;
        if (e && p) {
            PT__OMP(omp simd)
            for (c = 0; c < C; c++) o[c] = e[c] + p[c];
        } else if (e || p) {
            memcpy(o, e ? e : p, sizeof(float) * (size_t)C);
        } else {
            memset(o, 0, sizeof(float) * (size_t)C);
        }
    }
}

/* dwte[inp[n] - v0] += dout[n] for this rank's rows; dwpe[t] += sum_b dout[b,t]
   (dwpe may be NULL). Column blocks keep it race-free and deterministic. pos
   (context parallelism; NULL: t): token t's position. */
static void pt__encoder_backward_part(float *dwte, float *dwpe, const float *dout,
                                      const int *inp, const int *pos, int v0, int Vl, int B,
                                      int T, int C) {
    int cb, nblocks = (C + PT__COLBLOCK - 1) / PT__COLBLOCK;
    PT__OMP(omp parallel for schedule(static))
    for (cb = 0; cb < nblocks; cb++) {
        int c0 = cb * PT__COLBLOCK, c1 = c0 + PT__COLBLOCK < C ? c0 + PT__COLBLOCK : C, n, c;
        for (n = 0; n < B * T; n++) {
            const float *d = dout + (size_t)n * C;
            int row = inp[n] - v0;
            if (row >= 0 && row < Vl) {
                float *w = dwte + (size_t)row * C;
                PT__OMP(omp simd)
                for (c = c0; c < c1; c++) w[c] += d[c];
            }
            if (dwpe) {
                float *p = dwpe + (size_t)(pos ? pos[n % T] : n % T) * C;
                PT__OMP(omp simd)
                for (c = c0; c < c1; c++) p[c] += d[c];
            }
        }
    }
}

PTRAINDEF void pt_encoder_forward(float *out, const int *inp, const float *wte,
                                  const float *wpe, int B, int T, int C) {
    pt__encoder_forward_part(out, inp, wte, wpe, NULL, 0, INT32_MAX, B, T, C);
}

PTRAINDEF void pt_encoder_backward(float *dwte, float *dwpe, const float *dout,
                                   const int *inp, int B, int T, int C) {
    pt__encoder_backward_part(dwte, dwpe, dout, inp, NULL, 0, INT32_MAX, B, T, C);
}

PTRAINDEF void pt_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                    const float *weight, const float *bias, int N, int C,
                                    float eps) {
    int n;
    PT__OMP(omp parallel for schedule(static))
    for (n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *o = out + (size_t)n * C;
        float m = 0.0f, v = 0.0f, s;
        int c;
        PT__OMP(omp simd reduction(+:m))
        for (c = 0; c < C; c++) m += x[c];
        m /= (float)C;
        PT__OMP(omp simd reduction(+:v))
        for (c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
        v /= (float)C;
        s = 1.0f / sqrtf(v + eps);
        if (bias) {
            PT__OMP(omp simd)
            for (c = 0; c < C; c++) o[c] = (x[c] - m) * s * weight[c] + bias[c];
        } else {
            PT__OMP(omp simd)
            for (c = 0; c < C; c++) o[c] = (x[c] - m) * s * weight[c];
        }
        mean[n] = m;
        rstd[n] = s;
    }
}

/* With xh = (x-mean)*rstd and g = dout*w:
   dx = rstd * (g - mean_c(g) - xh * mean_c(g*xh)); dw += dout*xh; db += dout */
PTRAINDEF void pt_layernorm_backward(float *dinp, float *dweight, float *dbias,
                                     const float *dout, const float *inp, const float *weight,
                                     const float *mean, const float *rstd, int N, int C) {
    int n, cb, nblocks = (C + PT__COLBLOCK - 1) / PT__COLBLOCK;
    if (dinp) {
        PT__OMP(omp parallel for schedule(static))
        for (n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
            float *dx = dinp + (size_t)n * C;
            float m = mean[n], s = rstd[n], gm = 0.0f, gxm = 0.0f;
            int c;
            PT__OMP(omp simd reduction(+:gm, gxm))
            for (c = 0; c < C; c++) {
                float g = d[c] * weight[c];
                gm += g;
                gxm += g * (x[c] - m) * s;
            }
            gm /= (float)C;
            gxm /= (float)C;
            PT__OMP(omp simd)
            for (c = 0; c < C; c++)
                dx[c] += s * (d[c] * weight[c] - gm - (x[c] - m) * s * gxm);
        }
    }
    if (!dweight) return; /* the input's gradient only */
    PT__OMP(omp parallel for schedule(static))
    for (cb = 0; cb < nblocks; cb++) {
        int c0 = cb * PT__COLBLOCK, c1 = c0 + PT__COLBLOCK < C ? c0 + PT__COLBLOCK : C, c, r;
        for (r = 0; r < N; r++) {
            const float *x = inp + (size_t)r * C, *d = dout + (size_t)r * C;
            float m = mean[r], s = rstd[r];
            if (!dbias) {
                PT__OMP(omp simd)
                for (c = c0; c < c1; c++) dweight[c] += d[c] * (x[c] - m) * s;
                continue;
            }
            PT__OMP(omp simd) /* one pass over the row's block for both */
            for (c = c0; c < c1; c++) {
                dweight[c] += d[c] * (x[c] - m) * s;
                dbias[c] += d[c];
            }
        }
    }
}

/* dbias[o] += sum_n dout[n,o] */
static void pt__colsum_add(float *dbias, const float *dout, int N, int OUT) {
    int cb, nblocks = (OUT + PT__COLBLOCK - 1) / PT__COLBLOCK;
    PT__OMP(omp parallel for schedule(static))
    for (cb = 0; cb < nblocks; cb++) {
        int c0 = cb * PT__COLBLOCK, c1 = c0 + PT__COLBLOCK < OUT ? c0 + PT__COLBLOCK : OUT, c, n;
        for (n = 0; n < N; n++) {
            const float *d = dout + (size_t)n * OUT;
            PT__OMP(omp simd)
            for (c = c0; c < c1; c++) dbias[c] += d[c];
        }
    }
}

static const char *pt__precision_names[3] = {"fp32", "fp32", "bf16"}; /* 0 is fp32 */

PTRAINDEF const char *pt_precision_name(pt_precision p) {
    return (int)p >= 0 && (int)p < 3 ? pt__precision_names[p] : "(unknown)";
}

PTRAINDEF pt_status pt_precision_parse(const char *name, pt_precision *out) {
    int k;
    for (k = 1; k < 3; k++)
        if (name && strcmp(name, pt__precision_names[k]) == 0) {
            *out = (pt_precision)k;
            return PT_OK;
        }
    return pt__fail(PT_ERR_CONFIG, "unknown precision '%s' (known: fp32, bf16)",
                    name ? name : "(null)");
}

/* An activation that bf16 precision rounds (q, k, v and fch, read by
   non-GEMM kernels; ln1 and ln2, GEMM operands only, alike): kept as bf16
   bits in keep where the layout stores it so (x, the scratch, now holds
   keep's values: *held = keep), else rounded in place at bf16 precision;
   fp32 leaves it. Every layout (recomputed or not) computes the same numbers. */
static void pt__bf16_act(const pt_ctx *ctx, uint16_t *keep, float *x, size_t n,
                         const uint16_t **held) {
    if (keep || pt__ctx_bf16(ctx)) pt__bf16_keep(keep, x, n);
    if (keep) *held = keep;
}

/* Backward's read of a kept activation: the scratch x gets the n values of
   src unless it holds them already (the layer forward ran last, or the
   input gradient's pass before the weights'); no src: x is the layer's own. */
static void pt__bf16_load(float *x, const uint16_t *src, size_t n, const uint16_t **held) {
    if (!src || *held == src) return;
    pt__bf16_widen(x, src, n);
    *held = src;
}

/* A model GEMM at ctx's precision (cblas arguments). */
static void pt__mm(pt_ctx *ctx, int ta, int tb, int M, int N, int K, float alpha, const float *A,
                   int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    if (pt__ctx_bf16(ctx)) pt_gemm_bf16(ctx, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    else pt_sgemm(ctx, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* The dense layer both weight layouts share: out = inp @ W + bias with W
   (IN, OUT) as GPT-2's Conv1D stores it, or W^T with W (OUT, IN) as
   nn.Linear stores it (wt = 1). Backward: dinp += dout @ W^T (of the
   (IN, OUT) view), dW += inp^T @ dout (transposed for nn.Linear),
   dbias += sum_n dout. */
static void pt__dense_forward(pt_ctx *ctx, float *out, const float *inp, const float *weight,
                              const float *bias, int N, int IN, int OUT, int wt) {
    if (pt__ctx_bf16(ctx))
        pt__gemm_bf16_bias(ctx, 0, wt, N, OUT, IN, 1.0f, inp, IN, weight, wt ? IN : OUT, 0.0f,
                           out, OUT, bias);
    else
        pt__sgemm_bias(ctx, 0, wt, N, OUT, IN, 1.0f, inp, IN, weight, wt ? IN : OUT, 0.0f, out,
                       OUT, bias);
}

static void pt__dense_backward(pt_ctx *ctx, float *dinp, float *dweight, float *dbias,
                               const float *dout, const float *inp, const float *weight, int N,
                               int IN, int OUT, int wt) {
    if (dinp)
        pt__mm(ctx, 0, !wt, N, IN, OUT, 1.0f, dout, OUT, weight, wt ? IN : OUT, 1.0f, dinp, IN);
    if (dweight && wt) pt__mm(ctx, 1, 0, OUT, IN, N, 1.0f, dout, OUT, inp, IN, 1.0f, dweight, IN);
    if (dweight && !wt)
        pt__mm(ctx, 1, 0, IN, OUT, N, 1.0f, inp, IN, dout, OUT, 1.0f, dweight, OUT);
    if (dbias) pt__colsum_add(dbias, dout, N, OUT);
}

PTRAINDEF void pt_matmul_forward(pt_ctx *ctx, float *out, const float *inp, const float *weight,
                                 const float *bias, int N, int IN, int OUT) {
    pt__dense_forward(ctx, out, inp, weight, bias, N, IN, OUT, 0);
}

PTRAINDEF void pt_matmul_backward(pt_ctx *ctx, float *dinp, float *dweight, float *dbias,
                                  const float *dout, const float *inp, const float *weight,
                                  int N, int IN, int OUT) {
    pt__dense_backward(ctx, dinp, dweight, dbias, dout, inp, weight, N, IN, OUT, 0);
}

PTRAINDEF void pt_linear_forward(pt_ctx *ctx, float *out, const float *inp, const float *weight,
                                 const float *bias, int N, int IN, int OUT) {
    pt__dense_forward(ctx, out, inp, weight, bias, N, IN, OUT, 1);
}

PTRAINDEF void pt_linear_backward(pt_ctx *ctx, float *dinp, float *dweight, float *dbias,
                                  const float *dout, const float *inp, const float *weight,
                                  int N, int IN, int OUT) {
    pt__dense_backward(ctx, dinp, dweight, dbias, dout, inp, weight, N, IN, OUT, 1);
}

PTRAINDEF void pt_rmsnorm_forward(float *out, float *rstd, const float *inp,
                                  const float *weight, int N, int C, float eps) {
    int n;
    PT__OMP(omp parallel for schedule(static))
    for (n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *o = out + (size_t)n * C, ms = 0.0f, r;
        int c;
        PT__OMP(omp simd reduction(+:ms))
        for (c = 0; c < C; c++) ms += x[c] * x[c];
        r = 1.0f / sqrtf(ms / (float)C + eps);
        PT__OMP(omp simd)
        for (c = 0; c < C; c++) o[c] = x[c] * r * weight[c];
        rstd[n] = r;
    }
}

PTRAINDEF void pt_rmsnorm_backward(float *dinp, float *dweight, const float *dout,
                                   const float *inp, const float *weight, const float *rstd,
                                   int N, int C) {
    int n, cb, nblocks = (C + PT__COLBLOCK - 1) / PT__COLBLOCK;
    if (dinp) {
        PT__OMP(omp parallel for schedule(static))
        for (n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
            float *dx = dinp + (size_t)n * C, r = rstd[n], gx = 0.0f, k;
            int c;
            PT__OMP(omp simd reduction(+:gx))
            for (c = 0; c < C; c++) gx += d[c] * weight[c] * x[c];
            k = r * r * gx / (float)C;
            PT__OMP(omp simd)
            for (c = 0; c < C; c++) dx[c] += r * (d[c] * weight[c] - x[c] * k);
        }
    }
    if (!dweight) return;
    PT__OMP(omp parallel for schedule(static))
    for (cb = 0; cb < nblocks; cb++) {
        int c0 = cb * PT__COLBLOCK, c1 = c0 + PT__COLBLOCK < C ? c0 + PT__COLBLOCK : C, c, r;
        for (r = 0; r < N; r++) {
            const float *x = inp + (size_t)r * C, *d = dout + (size_t)r * C;
            float s = rstd[r];
            PT__OMP(omp simd)
            for (c = c0; c < c1; c++) dweight[c] += d[c] * x[c] * s;
        }
    }
}

static void pt__rope_rows(float *cs, const int *pos, int T, int hd, float theta,
                          const pt_rope_scaling *sc);

PTRAINDEF void pt_rope_table(float *cs, int T, int hd, float theta, const pt_rope_scaling *sc) {
    pt__rope_rows(cs, NULL, T, hd, theta, sc);
}

/* Row t of cs holds the angles of position pos[t] (pos NULL: t). */
static void pt__rope_rows(float *cs, const int *pos, int T, int hd, float theta,
                          const pt_rope_scaling *sc) {
    const double pi = 3.14159265358979323846;
    int h2 = hd / 2, t, j;
    for (j = 0; j < h2; j++) {
        double f = pow((double)theta, -2.0 * j / (double)hd);
        if (sc && sc->factor > 0.0f) {
            double w = 2.0 * pi / f, ctx = (double)sc->original_max_pos;
            double lo = sc->low_freq_factor, hi = sc->high_freq_factor;
            if (w > ctx / lo) {
                f /= sc->factor;
            } else if (!(w < ctx / hi)) { /* between: smooth */
                double s = (ctx / w - lo) / (hi - lo);
                f = (1.0 - s) * f / sc->factor + s * f;
            }
        }
        for (t = 0; t < T; t++) {
            int at = pos ? pos[t] : t;
            cs[(size_t)t * hd + j] = (float)cos(at * f);
            cs[(size_t)t * hd + h2 + j] = (float)sin(at * f);
        }
    }
}

/* dir = 1: the rotation by +angle (forward); -1: by -angle (its transpose). */
static void pt__rope(float *x, const float *cs, int N, int T, int nh, int hd, int stride,
                     float dir) {
    int n, h2 = hd / 2;
    PT__OMP(omp parallel for schedule(static))
    for (n = 0; n < N; n++) {
        const float *c = cs + (size_t)(n % T) * hd, *s = c + h2;
        int h, j;
        for (h = 0; h < nh; h++) {
            float *a = x + (size_t)n * stride + (size_t)h * hd, *b = a + h2;
            PT__OMP(omp simd)
            for (j = 0; j < h2; j++) {
                float u = a[j], v = b[j], sn = dir * s[j];
                a[j] = u * c[j] - v * sn;
                b[j] = v * c[j] + u * sn;
            }
        }
    }
}

PTRAINDEF void pt_rope_forward(float *x, const float *cs, int N, int T, int nh, int hd,
                               int stride) {
    pt__rope(x, cs, N, T, nh, hd, stride, 1.0f);
}

PTRAINDEF void pt_rope_backward(float *dx, const float *cs, int N, int T, int nh, int hd,
                                int stride) {
    pt__rope(dx, cs, N, T, nh, hd, stride, -1.0f);
}

/* One row: o = g sigmoid(g) u (dir 0); or with s = sigmoid(g) and dout d,
   du = d g s and dg = d u s (1 + g (1 - s)) (dir 1). The 16-lane path is the
   scalar one's operations in its order: the same bits. */
static void pt__swiglu_row(float *o, float *dg, const float *g, const float *d, int F, int dir) {
    const float *u = g + F;
    float *du = dir ? dg + F : NULL;
    int j = 0, t;
#ifdef __AVX512F__
    const __m512 one = _mm512_set1_ps(1.0f);
    for (; j + 16 <= F; j += 16) {
        __m512 x = _mm512_loadu_ps(g + j), y = _mm512_loadu_ps(u + j), s, dd;
        __m512 e = _mm512_add_ps(one, pt__expf16(pt__neg16(x)));
        if (!dir) {
            _mm512_storeu_ps(o + j, _mm512_mul_ps(_mm512_div_ps(x, e), y));
            continue;
        }
        s = _mm512_div_ps(one, e), dd = _mm512_loadu_ps(d + j);
        _mm512_storeu_ps(du + j, _mm512_mul_ps(_mm512_mul_ps(dd, x), s));
        _mm512_storeu_ps(dg + j, _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(dd, y), s),
                                               _mm512_add_ps(one, _mm512_mul_ps(x, _mm512_sub_ps(one, s)))));
    }
#endif
    if (!dir) {
        PT__OMP(omp simd)
        for (t = j; t < F; t++) o[t] = g[t] / (1.0f + pt__expf(-g[t])) * u[t];
        return;
    }
    PT__OMP(omp simd)
    for (t = j; t < F; t++) {
        float s = 1.0f / (1.0f + pt__expf(-g[t]));
        du[t] = d[t] * g[t] * s;
        dg[t] = d[t] * u[t] * s * (1.0f + g[t] * (1.0f - s));
    }
}

PTRAINDEF void pt_swiglu_forward(float *out, const float *h, int N, int F) {
    int n;
    PT__OMP(omp parallel for schedule(static))
    for (n = 0; n < N; n++)
        pt__swiglu_row(out + (size_t)n * F, NULL, h + (size_t)n * 2 * F, NULL, F, 0);
}

PTRAINDEF void pt_swiglu_backward(float *dh, const float *h, const float *dout, int N, int F) {
    int n;
    PT__OMP(omp parallel for schedule(static))
    for (n = 0; n < N; n++)
        pt__swiglu_row(NULL, dh + (size_t)n * 2 * F, h + (size_t)n * 2 * F, dout + (size_t)n * F,
                       F, 1);
}

PTRAINDEF void pt_attention_ref_forward(float *out, float *att, const float *qkv, int B, int T,
                                        int C, int NH) {
    int hd = C / NH, C3 = 3 * C, b, h, t;
    float scale = 1.0f / sqrtf((float)hd);
    PT__OMP(omp parallel for collapse(3) schedule(static))
    for (b = 0; b < B; b++)
        for (h = 0; h < NH; h++)
            for (t = 0; t < T; t++) {
                const float *q = qkv + (size_t)(b * T + t) * C3 + h * hd;
                float *a = att + (((size_t)b * NH + h) * T + t) * T;
                float *o = out + (size_t)(b * T + t) * C + h * hd;
                float mx = -INFINITY, sum = 0.0f;
                int u, i;
                for (u = 0; u <= t; u++) {
                    const float *k = qkv + (size_t)(b * T + u) * C3 + C + h * hd;
                    float s = 0.0f;
                    for (i = 0; i < hd; i++) s += q[i] * k[i];
                    s *= scale;
                    a[u] = s;
                    if (s > mx) mx = s;
                }
                for (u = 0; u <= t; u++) {
                    a[u] = expf(a[u] - mx);
                    sum += a[u];
                }
                for (u = 0; u <= t; u++) a[u] /= sum;
                for (u = t + 1; u < T; u++) a[u] = 0.0f;
                for (i = 0; i < hd; i++) o[i] = 0.0f;
                for (u = 0; u <= t; u++) {
                    const float *v = qkv + (size_t)(b * T + u) * C3 + 2 * C + h * hd;
                    for (i = 0; i < hd; i++) o[i] += a[u] * v[i];
                }
            }
}

/* With p = att row t, dp_u = dout_t . v_u and ds_u = p_u (dp_u - sum_w p_w dp_w):
   dv_u += p_u dout_t ; dq_t += scale ds_u k_u ; dk_u += scale ds_u q_t */
PTRAINDEF void pt_attention_ref_backward(float *dqkv, float *scratch, const float *dout,
                                         const float *qkv, const float *att, int B, int T,
                                         int C, int NH) {
    int hd = C / NH, C3 = 3 * C, bh;
    float scale = 1.0f / sqrtf((float)hd);
    PT__OMP(omp parallel for schedule(static))
    for (bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH, t, u, i;
        float *dp = scratch + (size_t)bh * T;
        for (t = 0; t < T; t++) {
            const float *p = att + ((size_t)bh * T + t) * T;
            const float *d = dout + (size_t)(b * T + t) * C + h * hd;
            const float *q = qkv + (size_t)(b * T + t) * C3 + h * hd;
            float *dq = dqkv + (size_t)(b * T + t) * C3 + h * hd;
            float dot = 0.0f;
            for (u = 0; u <= t; u++) {
                const float *v = qkv + (size_t)(b * T + u) * C3 + 2 * C + h * hd;
                float *dv = dqkv + (size_t)(b * T + u) * C3 + 2 * C + h * hd;
                float s = 0.0f;
                for (i = 0; i < hd; i++) {
                    s += d[i] * v[i];
                    dv[i] += p[u] * d[i];
                }
                dp[u] = s;
                dot += p[u] * s;
            }
            for (u = 0; u <= t; u++) {
                const float *k = qkv + (size_t)(b * T + u) * C3 + C + h * hd;
                float *dk = dqkv + (size_t)(b * T + u) * C3 + C + h * hd;
                float ds = p[u] * (dp[u] - dot) * scale;
                for (i = 0; i < hd; i++) {
                    dq[i] += ds * k[i];
                    dk[i] += ds * q[i];
                }
            }
        }
    }
}

PTRAINDEF size_t pt_attention_scratch_floats(int T, int slots) {
    return (size_t)slots * 2 * PT_ATTN_QBLOCK * (size_t)T;
}

/* Threads for a parallel loop over attention blocks: never more than the
   scratch slots (each thread owns one), nor than ctx's workspace slots
   (each thread's GEMMs run in its own; a block's numbers do not depend on
   the thread that computes it). */
static int pt__attn_threads(const pt_ctx *ctx, int slots) {
#ifdef _OPENMP
    int n = omp_get_max_threads();
    if (ctx && ctx->ws && ctx->threads < n) n = ctx->threads;
    return n < slots ? n : slots;
#else
    (void)ctx, (void)slots;
    return 1;
#endif
}

static int pt__thread_id(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* Keys visible to queries t0..t0+nq-1 of r: len[i] = #{u : kpos[u] <= qpos[t0+i]},
   a prefix of the keys (kpos increases); returns len[nq-1], the widest row
   (qpos increases). No positions: len[i] = t0+i+1. */
static int pt__attn_rows(int *len, const pt_attn_ring *r, int t0, int nq) {
    int i;
    for (i = 0; i < nq; i++) {
        int lo = 0, hi = r->Tk, p;
        if (!r->qpos) {
            len[i] = t0 + i + 1;
            continue;
        }
        p = r->qpos[t0 + i];
        while (lo < hi) { /* the first key after p */
            int mid = (lo + hi) / 2;
            if (r->kpos[mid] <= p) lo = mid + 1;
            else hi = mid;
        }
        len[i] = lo;
    }
    return len[nq - 1];
}

/* Rows i of S (nq x nk, query i sees keys u < len[i]): p = exp(S - lse),
   with lse computed into lse_out when given (-inf for a row seeing no key),
   else read from lse_in; zero past len[i]. */
static void pt__attn_softmax(float *S, const float *lse_in, float *lse_out, const int *len,
                             int nq, int nk) {
    int i, u;
    for (i = 0; i < nq; i++) {
        float *row = S + (size_t)i * nk, l;
        if (lse_out) {
            float mx = len[i] ? pt__maxf(row, len[i]) : 0.0f;
            l = len[i] ? mx + (float)log(pt__sum_exp(row, len[i], mx)) : -INFINITY;
            lse_out[i] = l;
        } else {
            l = lse_in[i];
        }
        PT__OMP(omp simd)
        for (u = 0; u < len[i]; u++) row[u] = pt__expf(row[u] - l);
        for (u = len[i]; u < nk; u++) row[u] = 0.0f;
    }
}

#ifdef PT__GEMM_X86
/* ---- fused attention: FlashAttention-2 on the GEMM micro-kernels --------
   One task a (b, key/value head): its K and V packed once as the GEMM's B
   micro-panels (in the thread's workspace slot), then for each of its query
   heads' blocks of QB queries, key blocks of KB keys: S = scale Q K^T tile
   by tile (MR x NR, tiles wholly past every row's last visible key skipped),
   the softmax statistics kept per query (forward: online max m and sum l,
   out rescaled by e^(m_old - m_new); backward: P = e^(S - lse)), P packed as
   an A panel for P V (backward: dP = dO V^T, dS = P (dP - D) scale, dV +=
   P^T dO, dK += dS^T Q, dQ += dS K). bf16 runs the same loops on bf16 pairs
   (vdpbf16ps). Every sum runs in one fixed order, whatever the threads. */
#define PT__FA_QB 48 /* queries a block: 4 MR-row panels */
#define PT__FA_KB 96 /* keys a block: 3 NR-column panels, 8 MR-row panels */

/* 0 fp32, 1 bf16 (ptrain's kernels selected for ctx's precision), else -1 */
static int pt__fa_kind(const pt_ctx *ctx) {
    if (!ctx || !ctx->ws) return -1;
    if (pt__ctx_bf16(ctx)) {
        int v = pt__gemm_bf16_current();
        return v == PT__BF16_AMX || v == PT__BF16_AVX512 ? 1 : -1;
    }
    return pt__gemm_current() == PT__GEMM_PTRAIN ? 0 : -1;
}

/* words k packed values take along k (bf16: pairs), and k0's offset (even) */
static size_t pt__fa_kw(int bf16, int k) { return bf16 ? (size_t)(k + 1) / 2 : (size_t)k; }

static void pt__fa_pack_a(int bf16, float *ap, int ta, const float *A, int lda, int mc, int kc,
                          float alpha) {
    if (bf16) pt__pack_a_bf16((uint32_t *)ap, ta, A, lda, 0, mc, 0, kc, alpha);
    else pt__pack_a_f32(ap, ta, A, lda, 0, mc, 0, kc, alpha);
}

static void pt__fa_pack_b(int bf16, float *bp, int tb, const float *B, int ldb, int nc, int kc) {
    if (bf16) pt__pack_b_bf16((uint32_t *)bp, tb, B, ldb, 0, nc, 0, kc);
    else pt__pack_b_f32(bp, tb, B, ldb, 0, nc, 0, kc);
}

/* The micro-kernels (pt__gemm_kernel_*) on an A read in place with strides:
   A[r][k] at a[r rs + k ks] (bf16: pair k of row r; packed panels: rs 1, ks
   MR), B a packed NR-column panel; C (first: =, else +=), m x n of the MR x
   NR tile stored; half: n <= 16, the panel's first 16 columns alone (half
   the FMAs: a causal edge's last tile). Inlined with constant strides, so
   each broadcast is one load at a fixed offset. */
#define PT__FA_RS(r) ((size_t)(r) * rs)
PT__TARGET_AVX512 static inline __attribute__((always_inline)) void
pt__fa_kernel_f32(int kc, const float *ap, size_t rs, size_t ks, int half, const float *bp,
                  float *c, int ldc, int m, int n, int first) {
    int k;
    const float beta = 0.0f;
    PT__GEMM_ROWS(PT__GEMM_DECL)
    for (k = 0; k < kc; k++) {
        __m512 b0 = _mm512_load_ps(bp), b1 = _mm512_load_ps(bp + 16), a;
#define PT__FA_FMA(r)                             \
    a = _mm512_set1_ps(ap[PT__FA_RS(r)]);         \
    c##r##_0 = _mm512_fmadd_ps(a, b0, c##r##_0); \
    if (!half) c##r##_1 = _mm512_fmadd_ps(a, b1, c##r##_1);
        PT__GEMM_ROWS(PT__FA_FMA)
#undef PT__FA_FMA
        ap += ks;
        bp += PT__GEMM_NR;
    }
    PT__GEMM_TAIL
}

PT__TARGET_BF16 static inline __attribute__((always_inline)) void
pt__fa_kernel_bf16(int kp, const uint32_t *ap, size_t rs, size_t ks, int half, const uint32_t *bp,
                   float *c, int ldc, int m, int n, int first) {
    int k;
    const float beta = 0.0f;
    PT__GEMM_ROWS(PT__GEMM_DECL)
    for (k = 0; k < kp; k++) {
        __m512bh b0 = (__m512bh)_mm512_load_si512((const void *)bp);
        __m512bh b1 = (__m512bh)_mm512_load_si512((const void *)(bp + 16));
        __m512bh a;
#define PT__FA_DOT(r)                                        \
    a = (__m512bh)_mm512_set1_epi32((int)ap[PT__FA_RS(r)]); \
    c##r##_0 = _mm512_dpbf16_ps(c##r##_0, a, b0);           \
    if (!half) c##r##_1 = _mm512_dpbf16_ps(c##r##_1, a, b1);
        PT__GEMM_ROWS(PT__FA_DOT)
#undef PT__FA_DOT
        ap += ks;
        bp += PT__GEMM_NR;
    }
    PT__GEMM_TAIL
}
#undef PT__FA_RS

/* A's layouts in pt__fa_gemm: packed MR-row panels (pt__fa_pack_a), or a
   block buffer of PT__FA_KB words a row read in place: its rows (A = the
   buffer, fp32 rows of KB floats, bf16 rows of KB/2 pairs) or its columns
   (A = its transpose: fp32, or bf16 pairs of rows zipped, KB words a row) */
#define PT__FA_PACKED 0
#define PT__FA_ROWS 1
#define PT__FA_COLS 2

PT__TARGET_AVX512 static void pt__fa_kf_rows(int kc, const float *a, const float *b, float *c,
                                             int ldc, int m, int n, int first) {
    pt__fa_kernel_f32(kc, a, PT__FA_KB, 1, 0, b, c, ldc, m, n, first);
}
PT__TARGET_AVX512 static void pt__fa_kf_cols(int kc, const float *a, const float *b, float *c,
                                             int ldc, int m, int n, int first) {
    pt__fa_kernel_f32(kc, a, 1, PT__FA_KB, 0, b, c, ldc, m, n, first);
}
PT__TARGET_AVX512 static void pt__fa_kf_half(int kc, const float *a, const float *b, float *c,
                                             int ldc, int m, int n, int first) {
    pt__fa_kernel_f32(kc, a, 1, PT__GEMM_MR, 1, b, c, ldc, m, n, first);
}
PT__TARGET_BF16 static void pt__fa_kb_rows(int kp, const uint32_t *a, const uint32_t *b, float *c,
                                           int ldc, int m, int n, int first) {
    pt__fa_kernel_bf16(kp, a, PT__FA_KB / 2, 1, 0, b, c, ldc, m, n, first);
}
PT__TARGET_BF16 static void pt__fa_kb_cols(int kp, const uint32_t *a, const uint32_t *b, float *c,
                                           int ldc, int m, int n, int first) {
    pt__fa_kernel_bf16(kp, a, 1, PT__FA_KB, 0, b, c, ldc, m, n, first);
}
PT__TARGET_BF16 static void pt__fa_kb_half(int kp, const uint32_t *a, const uint32_t *b, float *c,
                                           int ldc, int m, int n, int first) {
    pt__fa_kernel_bf16(kp, a, 1, PT__GEMM_MR, 1, b, c, ldc, m, n, first);
}

/* One MR x NR tile: C (first: =, else +=) A B over kc k (bf16: pairs), A in
   layout am at a (packed, n <= 16: the half-width kernels). */
static void pt__fa_tile(int bf16, int am, int kc, const float *a, const float *b, float *c,
                        int ldc, int m, int n, int first) {
    const uint32_t *au = (const uint32_t *)a, *bu = (const uint32_t *)b;
    if (am == PT__FA_PACKED && n <= 16)
        bf16 ? pt__fa_kb_half(kc, au, bu, c, ldc, m, n, first)
             : pt__fa_kf_half(kc, a, b, c, ldc, m, n, first);
    else if (!bf16 && am == PT__FA_PACKED) pt__gemm_kernel_f32(kc, a, b, c, ldc, m, n, first, 0.0f);
    else if (!bf16)
        (am == PT__FA_ROWS ? pt__fa_kf_rows : pt__fa_kf_cols)(kc, a, b, c, ldc, m, n, first);
    else if (am == PT__FA_PACKED) pt__gemm_kernel_bf16(kc, au, bu, c, ldc, m, n, first, 0.0f);
    else (am == PT__FA_ROWS ? pt__fa_kb_rows : pt__fa_kb_cols)(kc, au, bu, c, ldc, m, n, first);
}

/* C[0:M, 0:N] (first: =, else +=) A B: A's row panel p (MR rows; layout am:
   packed at ap + p MR kw(K), or a block buffer's rows or columns), times B's
   packed column panels (NR columns, at bp + q bs), over k in [k0[p], k1[p])
   (k0 even), columns below nc[p] (NULL: 0, K, N; packed A: columns past
   nc[p] may be left unset). A panel with no k leaves C (first: zero). */
static void pt__fa_gemm(int bf16, int M, int N, int K, const float *ap, int am, const float *bp,
                        size_t bs, float *c, int ldc, int first, const int *k0, const int *k1,
                        const int *nc) {
    const int MR = PT__GEMM_MR, NR = PT__GEMM_NR;
    size_t aw = (size_t)MR * pt__fa_kw(bf16, K);
    int p, q, i;
    for (p = 0; p * MR < M; p++) {
        int m = M - p * MR < MR ? M - p * MR : MR, lo = k0 ? k0[p] : 0, hi = k1 ? k1[p] : K;
        int n1 = nc ? nc[p] : N;
        size_t ko = bf16 ? (size_t)lo / 2 : (size_t)lo;
        float *cr = c + (size_t)p * MR * ldc;
        const float *a = am == PT__FA_PACKED ? ap + p * aw + MR * ko
                         : am == PT__FA_ROWS ? ap + (size_t)p * MR * pt__fa_kw(bf16, PT__FA_KB) + ko
                                             : ap + (size_t)p * MR + ko * PT__FA_KB;
        if (hi <= lo) {
            if (first)
                for (i = 0; i < m; i++) memset(cr + (size_t)i * ldc, 0, sizeof(float) * N);
            continue;
        }
        for (q = 0; q * NR < n1; q++) {
            int n = N - q * NR < NR ? N - q * NR : NR;
            if (am == PT__FA_PACKED && n1 - q * NR <= 16 && n > 16) n = 16; /* past nc[p]: unset */
            pt__fa_tile(bf16, am, bf16 ? (hi - lo + 1) / 2 : hi - lo, a, bp + q * bs + NR * ko,
                        cr + q * NR, ldc, m, n, first);
        }
    }
}

/* One task's buffers (offsets in a workspace slot, 64-byte aligned) and the
   block at hand. */
typedef struct pt__fa {
    int bf16, hd, C, C3, T, Tk, t0, nq, ldkv; /* ldkv: dka's and dva's rows */
    float scale;
    const pt_attn_ring *r;
    float *kt, *vt, *kb, *vb, *qa, *da, *qb, *db, *S, *dP, *pa, *pb, *pc, *acc, *dka, *dva;
    int len[PT__FA_QB], lim[PT__FA_KB / PT__GEMM_MR];
} pt__fa;

/* The floats a task needs (bwd: backward's buffers) and, given ws, its layout:
   K^T and V^T as B panels over keys (kt, vt), K and V as B panels along
   keys (kb, vb), Q and dO as A panels (qa, da) and B panels along queries
   (qb, db), the S and dP blocks and three bf16 A operands of a block (pa, pb,
   pc: P and dS as PT__FA_ROWS or PT__FA_COLS read them), and contiguous
   accumulators (rows of hd; the strided rows of out and the gradients,
   touched once: few L1 sets, all in use): the block's out or dQ (acc) and,
   bwd 2, the task's dK and dV (dka, dva; bwd 1: summed in place). */
static size_t pt__fa_layout(pt__fa *f, float *ws, int Tk, int hd, int bwd) {
    size_t t32 = (size_t)(Tk + 31) / 32 * 32, h32 = (size_t)(hd + 31) / 32 * 32, at = 0;
    size_t qa = (size_t)PT__FA_QB * hd, qb = h32 * (PT__FA_QB + 1), blk = (size_t)PT__FA_QB * PT__FA_KB;
    size_t n[16], i;
    float **dst[16];
    n[0] = t32 * hd, n[1] = bwd ? t32 * hd : 0, n[2] = bwd ? h32 * (Tk + 1) : 0;
    n[3] = bwd ? 0 : h32 * (Tk + 1), n[4] = qa, n[5] = bwd ? qa : 0, n[6] = bwd ? qb : 0;
    n[7] = bwd ? qb : 0, n[8] = n[9] = n[10] = n[11] = blk + 16 * PT__FA_KB;
    n[12] = bwd ? n[11] : 0, n[13] = qa, n[14] = n[15] = bwd == 2 ? (size_t)Tk * hd : 0;
    dst[0] = &f->kt, dst[1] = &f->vt, dst[2] = &f->kb, dst[3] = &f->vb, dst[4] = &f->qa;
    dst[5] = &f->da, dst[6] = &f->qb, dst[7] = &f->db, dst[8] = &f->S, dst[9] = &f->dP;
    dst[10] = &f->pa, dst[11] = &f->pb, dst[12] = &f->pc, dst[13] = &f->acc;
    dst[14] = &f->dka, dst[15] = &f->dva;
    for (i = 0; i < 16; i++) {
        if (ws) *dst[i] = ws + at;
        at += (n[i] + 15) / 16 * 16;
    }
    return at;
}

/* The block's visible keys (pt__attn_rows) and, for key block u0 of kn keys,
   lim[p] = the keys row panel p sees in it (its last row's, within 0..kn). */
static void pt__fa_limits(pt__fa *f, int u0, int kn) {
    int p, MR = PT__GEMM_MR;
    for (p = 0; p * MR < f->nq; p++) {
        int last = (p + 1) * MR < f->nq ? (p + 1) * MR - 1 : f->nq - 1, v = f->len[last] - u0;
        f->lim[p] = v < 0 ? 0 : v > kn ? kn : v;
    }
}

/* x[0:n] *= s, y[0:n] = s x[0:n], and x . y over n, in 16-lane vectors */
PT__TARGET_AVX512 static void pt__fa_scale_row(float *x, int n, float s) {
    int j;
    PT__OMP(omp simd)
    for (j = 0; j < n; j++) x[j] *= s;
}
PT__TARGET_AVX512 static void pt__fa_scale_to(float *y, const float *x, int n, float s) {
    int j;
    PT__OMP(omp simd)
    for (j = 0; j < n; j++) y[j] = x[j] * s;
}
PT__TARGET_AVX512 static float pt__fa_dot(const float *x, const float *y, int n) {
    float s = 0.0f;
    int j;
    PT__OMP(omp simd reduction(+:s))
    for (j = 0; j < n; j++) s += x[j] * y[j];
    return s;
}

/* g++ 12 at -O2 takes the intrinsics' _mm512_undefined_* operands for
   uninitialised reads once they are inlined here (C++ only; a false report) */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
/* e^x of 16 lanes: pt__expf's reduction and polynomial in fused
   multiply-adds (within 2 ulp as it; pt__expf16 is the bit-exact one that
   GELU needs for its scalar tail, and is compiled only under -mavx512f). Below -87.3 0 (-inf too), from 127.5
   ln2 +inf, NaN stays NaN (min and max return their second operand, x, for
   a NaN; the compare that zeroes the small ones is unordered-true). */
PT__TARGET_AVX512 static inline __m512 pt__fa_exp(__m512 x0) {
    const __m512 lo = _mm512_set1_ps(-87.3f), magic = _mm512_set1_ps(12582912.0f);
    __m512 x = _mm512_max_ps(lo, _mm512_min_ps(_mm512_set1_ps(88.7f), x0)), t, n, r, p;
    __m512i e;
    t = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504f), magic); /* round x/ln2: 1.5*2^23 */
    n = _mm512_sub_ps(t, magic);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
    p = _mm512_fmadd_ps(_mm512_set1_ps(1.9875691500e-4f), r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_castps_si512(t), /* (n + 127) << 23 */
                                           _mm512_set1_epi32(127 - 0x4B400000)), 23);
    p = _mm512_mul_ps(p, _mm512_castsi512_ps(e));
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x0, lo, _CMP_NLT_UQ), p);
}

/* Online softmax of key block u0 (kn keys) in S (rows of PT__FA_KB): row i sees
   c = min(len[i] - u0, kn) of them; m, l the running max and sum, a[i] the
   factor out's row takes (e^(m_old - m_new)); P over S, 0 past c. */
PT__TARGET_AVX512 static void pt__fa_online(float *S, const int *len, int nq, int u0, int kn,
                                            float *m, float *l, float *a) {
    int i, u;
    for (i = 0; i < nq; i++) {
        float *row = S + (size_t)i * PT__FA_KB, mx, mn;
        int c = len[i] - u0 < kn ? len[i] - u0 : kn;
        __m512 vm, sum = _mm512_setzero_ps();
        a[i] = 1.0f;
        if (c <= 0) {
            memset(row, 0, sizeof(float) * kn);
            continue;
        }
        mx = pt__maxf(row, c);
        mn = mx > m[i] ? mx : m[i];
        a[i] = m[i] == -INFINITY ? 0.0f : expf(m[i] - mn);
        vm = _mm512_set1_ps(mn);
        for (u = 0; u < kn; u += 16) { /* (the row's KB floats: no read past it) */
            __m512 p = pt__fa_exp(_mm512_sub_ps(_mm512_loadu_ps(row + u), vm));
            p = _mm512_maskz_mov_ps(pt__mask16(c - u), p);
            _mm512_mask_storeu_ps(row + u, pt__mask16(kn - u), p);
            sum = _mm512_add_ps(sum, p);
        }
        l[i] = a[i] * l[i] + _mm512_reduce_add_ps(sum), m[i] = mn;
    }
}

/* Backward's rows of key block u0: P = e^(S - lse) over S and dS = P (dP - D)
   scale over dP, 0 past each row's visible keys. */
PT__TARGET_AVX512 static void pt__fa_grad_rows(float *S, float *dP, const int *len, int nq, int u0,
                                               int kn, const float *L, const float *D,
                                               float scale) {
    __m512 vs = _mm512_set1_ps(scale);
    int i, u;
    for (i = 0; i < nq; i++) {
        float *s = S + (size_t)i * PT__FA_KB, *d = dP + (size_t)i * PT__FA_KB;
        __m512 li = _mm512_set1_ps(L[i]), di = _mm512_set1_ps(D[i]);
        int c = len[i] - u0 < kn ? len[i] - u0 : kn;
        for (u = 0; u < kn; u += 16) {
            __mmask16 kc = pt__mask16(c - u), kk = pt__mask16(kn - u);
            __m512 p = pt__fa_exp(_mm512_sub_ps(_mm512_loadu_ps(s + u), li));
            __m512 g = _mm512_sub_ps(_mm512_loadu_ps(d + u), di);
            g = _mm512_mul_ps(_mm512_mul_ps(p, g), vs);
            _mm512_mask_storeu_ps(s + u, kk, _mm512_maskz_mov_ps(kc, p));
            _mm512_mask_storeu_ps(d + u, kk, _mm512_maskz_mov_ps(kc, g));
        }
    }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

/* bf16 A operands from nq rows of kn in S (rows of PT__FA_KB): into r (when
   not NULL) each row's pairs along keys (PT__FA_ROWS; an odd kn's partner
   0), into z (when not NULL) rows 2j and 2j+1 zipped, pairs along queries
   (PT__FA_COLS; an odd nq's partner row 0). */
PT__TARGET_BF16 static void pt__fa_to_bf16(uint32_t *r, uint32_t *z, const float *S, int nq,
                                           int kn) {
    const int KB = PT__FA_KB;
    int i, u;
    for (i = 0; i < nq; i += 2) {
        const float *s0 = S + (size_t)i * KB, *s1 = s0 + KB;
        uint16_t *r0 = r ? (uint16_t *)(r + (size_t)i * (KB / 2)) : NULL, *r1 = r ? r0 + KB : NULL;
        for (u = 0; u < kn; u += 16) {
            __mmask16 km = pt__mask16(kn - u);
            __m512 x0 = _mm512_maskz_loadu_ps(km, s0 + u);
            __m512 x1 = i + 1 < nq ? _mm512_maskz_loadu_ps(km, s1 + u) : _mm512_setzero_ps();
            if (z) _mm512_mask_storeu_epi32(z + (size_t)(i / 2) * KB + u, km, pt__bf16_zip(x0, x1));
            if (!r) continue;
            _mm256_mask_storeu_epi16(r0 + u, km, (__m256i)_mm512_cvtneps_pbh(x0));
            if (i + 1 < nq) _mm256_mask_storeu_epi16(r1 + u, km, (__m256i)_mm512_cvtneps_pbh(x1));
        }
        if (r && (kn & 1)) r0[kn] = r1[kn] = 0;
    }
}

/* n rows of w floats at x (ld ld) fetched ahead of need (wr: to be
   written, into L1; else towards L2): rows a page or more apart, which the
   hardware's prefetchers do not follow */
static void pt__fa_prefetch(const float *x, size_t ld, int n, int w, int wr) {
    int i, j;
    for (i = 0; i < n; i++)
        for (j = 0; j < w; j += 16) {
            if (wr) __builtin_prefetch(x + (size_t)i * ld + j, 1, 3);
            else _mm_prefetch((const char *)(x + (size_t)i * ld + j), _MM_HINT_T1);
        }
}

/* n rows of w floats from src (ld lds) to dst (ld ldd) */
static void pt__fa_copy_rows(float *dst, size_t ldd, const float *src, size_t lds, int n, int w) {
    int i;
    for (i = 0; i < n; i++) memcpy(dst + (size_t)i * ldd, src + (size_t)i * lds, sizeof(float) * w);
}

/* Forward of the block of queries f->t0.. (q: its first row, o and lse its
   out and lse), K^T and V packed in f; out summed in f->acc. */
static void pt__fa_fwd_block(pt__fa *f, float *o, float *lse, const float *q) {
    const int NR = PT__GEMM_NR, bf = f->bf16, nq = f->nq;
    float m[PT__FA_QB], l[PT__FA_QB], a[PT__FA_QB];
    int nk = pt__attn_rows(f->len, f->r, f->t0, nq), u0, i;
    for (i = 0; i < nq; i++) m[i] = -INFINITY, l[i] = 0.0f;
    if (nk > 0) pt__fa_pack_a(bf, f->qa, 0, q, f->C3, nq, f->hd, f->scale);
    for (u0 = 0; u0 < nk; u0 += PT__FA_KB) {
        int kn = nk - u0 < PT__FA_KB ? nk - u0 : PT__FA_KB;
        pt__fa_limits(f, u0, kn);
        pt__fa_gemm(bf, nq, kn, f->hd, f->qa, PT__FA_PACKED,
                    f->kt + (size_t)u0 * pt__fa_kw(bf, f->hd), NR * pt__fa_kw(bf, f->hd), f->S,
                    PT__FA_KB, 1, NULL, NULL, f->lim);
        pt__fa_online(f->S, f->len, nq, u0, kn, m, l, a);
        for (i = 0; u0 && i < nq; i++) /* out's rows to the new max */
            if (a[i] != 1.0f) pt__fa_scale_row(f->acc + (size_t)i * f->hd, f->hd, a[i]);
        if (bf) pt__fa_to_bf16((uint32_t *)f->pa, NULL, f->S, nq, kn);
        pt__fa_gemm(bf, nq, f->hd, kn, bf ? f->pa : f->S, PT__FA_ROWS,
                    f->vb + NR * (bf ? (size_t)u0 / 2 : (size_t)u0), NR * pt__fa_kw(bf, f->Tk),
                    f->acc, f->hd, u0 == 0, NULL, f->lim, NULL);
    }
    for (i = 0; i < nq; i++) { /* out = sum_u p_u v_u / l, lse = m + log l */
        float *oi = o + (size_t)i * f->C, s = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
        lse[i] = l[i] > 0.0f ? m[i] + logf(l[i]) : -INFINITY;
        if (!nk) memset(oi, 0, sizeof(float) * f->hd);
        else pt__fa_scale_to(oi, f->acc + (size_t)i * f->hd, f->hd, s);
    }
}

/* Forward of key/value head g of sequence b, part s of S: its K^T and V
   packed into the workspace ws, then its query heads' blocks j with j = s
   mod S (a block's numbers do not depend on the part that computes it); the
   keys and values of b NKV + g = next (likely this thread's next; -1 none)
   prefetched. */
static void pt__fa_forward_bg(float *ws, int bf16, float *out, float *lse, const float *qkv,
                              const pt_attn_ring *r, int b, int g, int s, int S, int next, int C,
                              int NH, int NKV) {
    pt__fa f;
    int hd = C / NH, Ckv = NKV * hd, G = NH / NKV, nb = (r->Tq + PT__FA_QB - 1) / PT__FA_QB;
    int per = s < nb ? (nb - s + S - 1) / S : 0, i; /* blocks a head in this part */
    const float *k = r->kv + (size_t)b * r->Tk * r->ld + g * hd;
    f.bf16 = bf16, f.hd = hd, f.C = C, f.C3 = C + 2 * Ckv, f.T = r->Tq, f.Tk = r->Tk, f.r = r;
    f.scale = 1.0f / sqrtf((float)hd);
    pt__fa_layout(&f, ws, f.Tk, hd, 0);
    pt__fa_prefetch(k, r->ld, f.Tk, hd, 0);
    pt__fa_prefetch(k + Ckv, r->ld, f.Tk, hd, 0);
    pt__fa_pack_b(bf16, f.kt, 1, k, r->ld, f.Tk, hd);
    pt__fa_pack_b(bf16, f.vb, 0, k + Ckv, r->ld, hd, f.Tk);
    if (next >= 0 && next != b * NKV + g) {
        const float *k1 = r->kv + (size_t)(next / NKV) * r->Tk * r->ld + (next % NKV) * hd;
        pt__fa_prefetch(k1, r->ld, f.Tk, hd, 0);
        pt__fa_prefetch(k1 + Ckv, r->ld, f.Tk, hd, 0);
    }
    for (i = 0; i < G * per; i++) {
        int h = g * G + i / per, h1 = g * G + (i + 1) / per;
        int t1 = (s + (i + 1) % per * S) * PT__FA_QB;
        f.t0 = (s + i % per * S) * PT__FA_QB;
        f.nq = f.T - f.t0 < PT__FA_QB ? f.T - f.t0 : PT__FA_QB;
        if (i + 1 < G * per) { /* the next block's queries and out */
            size_t r1 = (size_t)b * f.T + t1;
            int n1 = f.T - t1 < PT__FA_QB ? f.T - t1 : PT__FA_QB;
            pt__fa_prefetch(qkv + r1 * f.C3 + h1 * hd, f.C3, n1, hd, 0);
            pt__fa_prefetch(out + r1 * C + h1 * hd, C, n1, hd, 1);
        }
        pt__fa_fwd_block(&f, out + ((size_t)b * f.T + f.t0) * C + h * hd,
                         lse + ((size_t)b * NH + h) * f.T + f.t0,
                         qkv + ((size_t)b * f.T + f.t0) * f.C3 + h * hd);
    }
}

/* Backward of the block of queries f->t0.. of one head: q, dO, O its first
   rows (of qkv, dout, out), L its lse, dq its first row of dqkv (summed in
   f->acc from its value); the key/value head's dK and dV summed in f->dka,
   f->dva (rows f->ldkv apart). */
static void pt__fa_bwd_block(pt__fa *f, float *dq, const float *q, const float *dO,
                            const float *O, const float *L) {
    const int NR = PT__GEMM_NR, MR = PT__GEMM_MR, bf = f->bf16, nq = f->nq, hd = f->hd;
    size_t bh = NR * pt__fa_kw(bf, hd), bq = NR * pt__fa_kw(bf, nq), bk = NR * pt__fa_kw(bf, f->Tk);
    float D[PT__FA_QB];
    int nk = pt__attn_rows(f->len, f->r, f->t0, nq), lo[PT__FA_KB / PT__GEMM_MR], u0, i, p;
    if (nk == 0) return;
    pt__fa_pack_a(bf, f->qa, 0, q, f->C3, nq, hd, f->scale);
    pt__fa_pack_a(bf, f->da, 0, dO, f->C, nq, hd, 1.0f);
    pt__fa_pack_b(bf, f->qb, 0, q, f->C3, hd, nq);
    pt__fa_pack_b(bf, f->db, 0, dO, f->C, hd, nq);
    for (i = 0; i < nq; i++) D[i] = pt__fa_dot(dO + (size_t)i * f->C, O + (size_t)i * f->C, hd);
    pt__fa_copy_rows(f->acc, hd, dq, f->C3, nq, hd);
    for (u0 = 0; u0 < nk; u0 += PT__FA_KB) {
        int kn = nk - u0 < PT__FA_KB ? nk - u0 : PT__FA_KB;
        size_t ko = NR * (bf ? (size_t)u0 / 2 : (size_t)u0);
        pt__fa_limits(f, u0, kn);
        pt__fa_gemm(bf, nq, kn, hd, f->qa, PT__FA_PACKED, f->kt + (size_t)u0 * pt__fa_kw(bf, hd),
                    bh, f->S, PT__FA_KB, 1, NULL, NULL, f->lim);
        pt__fa_gemm(bf, nq, kn, hd, f->da, PT__FA_PACKED, f->vt + (size_t)u0 * pt__fa_kw(bf, hd),
                    bh, f->dP, PT__FA_KB, 1, NULL, NULL, f->lim);
        pt__fa_grad_rows(f->S, f->dP, f->len, nq, u0, kn, L, D, f->scale);
        if (bf) { /* P^T, dS^T and dS as bf16 operands */
            pt__fa_to_bf16(NULL, (uint32_t *)f->pa, f->S, nq, kn);
            pt__fa_to_bf16((uint32_t *)f->pc, (uint32_t *)f->pb, f->dP, nq, kn);
        }
        for (p = 0; p * MR < kn; p++) { /* key panel p: the queries from lo[p] see it */
            for (i = 0; i < nq && f->len[i] <= u0 + p * MR; i++) {}
            lo[p] = i & ~1;
        }
        pt__fa_gemm(bf, kn, hd, nq, bf ? f->pa : f->S, PT__FA_COLS, f->db, bq, /* P^T dO */
                    f->dva + (size_t)u0 * f->ldkv, f->ldkv, 0, lo, NULL, NULL);
        pt__fa_gemm(bf, kn, hd, nq, bf ? f->pb : f->dP, PT__FA_COLS, f->qb, bq, /* dS^T Q */
                    f->dka + (size_t)u0 * f->ldkv, f->ldkv, 0, lo, NULL, NULL);
        pt__fa_gemm(bf, nq, hd, kn, bf ? f->pc : f->dP, PT__FA_ROWS, f->kb + ko, bk, f->acc, hd, 0,
                    NULL, f->lim, NULL); /* dS K */
    }
    pt__fa_copy_rows(dq, f->C3, f->acc, hd, nq, hd);
}

/* Backward of key/value head g of sequence b: K^T, V^T and K packed once,
   then its query heads' blocks in order (dK, dV accumulate in that order,
   in the workspace when its slot bytes hold them, else in place); task
   next's keys, values and their gradients prefetched (pt__fa_forward_bg). */
static void pt__fa_backward_bg(float *ws, size_t slot, int bf16, float *dqkv, float *dkv,
                               const float *dout, const float *out, const float *qkv,
                               const float *lse, const pt_attn_ring *r, int b, int g, int next,
                               int C, int NH, int NKV) {
    pt__fa f;
    int hd = C / NH, Ckv = NKV * hd, G = NH / NKV, h, ld = r->ld, local;
    const float *k = r->kv + (size_t)b * r->Tk * ld + g * hd;
    float *dk = dkv + (size_t)b * r->Tk * ld + g * hd;
    f.bf16 = bf16, f.hd = hd, f.C = C, f.C3 = C + 2 * Ckv, f.T = r->Tq, f.Tk = r->Tk, f.r = r;
    f.scale = 1.0f / sqrtf((float)hd);
    local = pt__fa_layout(&f, NULL, f.Tk, hd, 2) * sizeof(float) <= slot;
    pt__fa_layout(&f, ws, f.Tk, hd, local ? 2 : 1);
    f.ldkv = local ? hd : ld;
    if (!local) f.dka = dk, f.dva = dk + Ckv;
    pt__fa_prefetch(k, ld, f.Tk, hd, 0);
    pt__fa_prefetch(k + Ckv, ld, f.Tk, hd, 0);
    pt__fa_pack_b(bf16, f.kt, 1, k, ld, f.Tk, hd);
    pt__fa_pack_b(bf16, f.vt, 1, k + Ckv, ld, f.Tk, hd);
    pt__fa_pack_b(bf16, f.kb, 0, k, ld, hd, f.Tk);
    if (local) pt__fa_copy_rows(f.dka, hd, dk, ld, f.Tk, hd);
    if (local) pt__fa_copy_rows(f.dva, hd, dk + Ckv, ld, f.Tk, hd);
    if (next >= 0) {
        size_t o1 = (size_t)(next / NKV) * r->Tk * ld + (next % NKV) * hd;
        pt__fa_prefetch(r->kv + o1, ld, f.Tk, hd, 0);
        pt__fa_prefetch(r->kv + o1 + Ckv, ld, f.Tk, hd, 0);
        pt__fa_prefetch(dkv + o1, ld, f.Tk, hd, 0);
        pt__fa_prefetch(dkv + o1 + Ckv, ld, f.Tk, hd, 0);
    }
    for (h = g * G; h < (g + 1) * G; h++)
        for (f.t0 = 0; f.t0 < f.T; f.t0 += PT__FA_QB) {
            size_t row = (size_t)b * f.T + f.t0;
            int h1 = f.t0 + PT__FA_QB < f.T ? h : h + 1, t1 = h1 == h ? f.t0 + PT__FA_QB : 0;
            f.nq = f.T - f.t0 < PT__FA_QB ? f.T - f.t0 : PT__FA_QB;
            if (h1 < (g + 1) * G) { /* the next block's rows */
                size_t r1 = (size_t)b * f.T + t1;
                int n1 = f.T - t1 < PT__FA_QB ? f.T - t1 : PT__FA_QB;
                pt__fa_prefetch(qkv + r1 * f.C3 + h1 * hd, f.C3, n1, hd, 0);
                pt__fa_prefetch(dqkv + r1 * f.C3 + h1 * hd, f.C3, n1, hd, 0);
                pt__fa_prefetch(dout + r1 * C + h1 * hd, C, n1, hd, 0);
                pt__fa_prefetch(out + r1 * C + h1 * hd, C, n1, hd, 0);
            }
            pt__fa_bwd_block(&f, dqkv + row * f.C3 + h * hd, qkv + row * f.C3 + h * hd,
                             dout + row * C + h * hd, out + row * C + h * hd,
                             lse + ((size_t)b * NH + h) * f.T + f.t0);
        }
    if (local) pt__fa_copy_rows(dk, ld, f.dka, hd, f.Tk, hd);
    if (local) pt__fa_copy_rows(dk + Ckv, ld, f.dva, hd, f.Tk, hd);
}
#endif /* PT__GEMM_X86 */

/* The GEMM form (no fused kernels here): block qb of queries of (b, h), its
   S = scale Q K^T over the keys the block sees in S (a thread's scratch),
   P = softmax, out = P V, each product a GEMM (pt__mm). */
static void pt__attn_fwd_gemm(pt_ctx *ctx, float *S, float *out, float *lse, const float *qkv,
                              const pt_attn_ring *r, int b, int h, int qb, int C, int NH,
                              int NKV) {
    int hd = C / NH, Ckv = NKV * hd, C3 = C + 2 * Ckv, G = NH / NKV, T = r->Tq, Tk = r->Tk;
    int t0 = qb * PT_ATTN_QBLOCK, len[PT_ATTN_QBLOCK], i, j;
    int nq = T - t0 < PT_ATTN_QBLOCK ? T - t0 : PT_ATTN_QBLOCK;
    int nk = pt__attn_rows(len, r, t0, nq);
    float *o = out + ((size_t)b * T + t0) * C + h * hd, *l = lse + ((size_t)b * NH + h) * T + t0;
    const float *q = qkv + (size_t)b * T * C3 + h * hd;
    const float *k = r->kv + (size_t)b * Tk * r->ld + (h / G) * hd;
    if (nk == 0) { /* the block sees no key */
        for (i = 0; i < nq; i++) {
            l[i] = -INFINITY;
            for (j = 0; j < hd; j++) o[(size_t)i * C + j] = 0.0f;
        }
        return;
    }
    pt__mm(ctx, 0, 1, nq, nk, hd, 1.0f / sqrtf((float)hd), q + (size_t)t0 * C3, C3, k, r->ld, 0.0f,
           S, nk);
    pt__attn_softmax(S, NULL, l, len, nq, nk);
    pt__mm(ctx, 0, 0, nq, hd, nk, 1.0f, S, nk, k + Ckv, r->ld, 0.0f, o, C);
}

/* The fused kernels' workspace a task needs fits ctx's slot: 0 fp32, 1 bf16,
   else -1 (the GEMM form). */
static int pt__attn_fused(const pt_ctx *ctx, int Tk, int hd, int bwd) {
#ifdef PT__GEMM_X86
    pt__fa f;
    int kind = pt__fa_kind(ctx);
    if (kind < 0 || pt__fa_layout(&f, NULL, Tk, hd, bwd) * sizeof(float) > ctx->ws_slot) return -1;
    return kind;
#else
    (void)ctx, (void)Tk, (void)hd, (void)bwd;
    return -1;
#endif
}

/* Fused (AVX-512 CPUs, ptrain's GEMM kernels selected): one task a (b,
   key/value head), pt__fa_forward_bg in the thread's workspace slot, or a
   part of its query blocks when there are fewer than 2 (b, key/value head)
   a thread (B = 1: split into at least 2 tasks a thread). Else
   one task a block of queries of one (b, h), pt__attn_fwd_gemm. Each block's
   numbers are the same whatever thread computes it. */
PTRAINDEF void pt_attention_ring_forward(pt_ctx *ctx, float *out, float *lse, const float *qkv,
                                         const pt_attn_ring *r, float *scratch, int slots, int B,
                                         int C, int NH, int NKV) {
    int T = r->Tq, Tk = r->Tk, nqb = (T + PT_ATTN_QBLOCK - 1) / PT_ATTN_QBLOCK, task;
    int ntasks = B * NH * nqb, nthr = pt__attn_threads(ctx, slots);
    int kind = pt__attn_fused(ctx, Tk, C / NH, 0), nbg = B * NKV, S = 1;
#ifdef PT__GEMM_X86
    S = (2 * nthr + nbg - 1) / nbg;
    if (S > (T + PT__FA_QB - 1) / PT__FA_QB) S = (T + PT__FA_QB - 1) / PT__FA_QB;
    if (S < 1) S = 1;
#endif
    (void)nthr;
    if (kind >= 0) {
        PT__OMP(omp parallel for schedule(dynamic) num_threads(nthr))
        for (task = 0; task < nbg * S; task++) {
            int b = task / S / NKV, g = task / S % NKV, h, qb;
            float *Sc = scratch + (size_t)pt__thread_id() * 2 * PT_ATTN_QBLOCK * Tk;
#ifdef PT__GEMM_X86
            pt__gemm_ws w = pt__ws_of(ctx);
            if (w.p) {
                pt__fa_forward_bg((float *)w.p, kind, out, lse, qkv, r, b, g, task % S, S,
                                  task + nthr < nbg * S ? (task + nthr) / S : -1, C, NH, NKV);
                continue;
            }
#endif
            if (task % S) continue; /* the GEMM form: the whole (b, g) in part 0 */
            for (h = g * (NH / NKV); h < (g + 1) * (NH / NKV); h++)
                for (qb = 0; qb < nqb; qb++)
                    pt__attn_fwd_gemm(ctx, Sc, out, lse, qkv, r, b, h, qb, C, NH, NKV);
        }
        return;
    }
    PT__OMP(omp parallel for schedule(dynamic) num_threads(nthr))
    for (task = 0; task < ntasks; task++) {
        int bh = task / nqb, qb = nqb - 1 - task % nqb; /* longest blocks first */
        float *S = scratch + (size_t)pt__thread_id() * 2 * PT_ATTN_QBLOCK * Tk;
        pt__attn_fwd_gemm(ctx, S, out, lse, qkv, r, bh / NH, bh % NH, qb, C, NH, NKV);
    }
}

PTRAINDEF void pt_attention_forward(pt_ctx *ctx, float *out, float *lse, const float *qkv,
                                    float *scratch, int slots, int B, int T, int C, int NH,
                                    int NKV) {
    pt_attn_ring r = {NULL, NULL, 0, 0, NULL, 0};
    r.Tq = r.Tk = T, r.kv = qkv + C, r.ld = C + 2 * NKV * (C / NH);
    pt_attention_ring_forward(ctx, out, lse, qkv, &r, scratch, slots, B, C, NH, NKV);
}

PTRAINDEF void pt_attention_merge(float *out, float *lse, const float *out_i, const float *lse_i,
                                  int B, int T, int C, int NH) {
    int hd = C / NH, bh;
    PT__OMP(omp parallel for schedule(static))
    for (bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH, t, j;
        for (t = 0; t < T; t++) {
            float a = lse[(size_t)bh * T + t], ai = lse_i[(size_t)bh * T + t], m, L, wa, wi;
            float *o = out + ((size_t)b * T + t) * C + h * hd;
            const float *oi = out_i + ((size_t)b * T + t) * C + h * hd;
            if (ai == -INFINITY) continue; /* the block added nothing */
            m = a > ai ? a : ai;
            L = m + logf(expf(a - m) + expf(ai - m));
            wa = expf(a - L), wi = expf(ai - L);
            for (j = 0; j < hd; j++) o[j] = wa * o[j] + wi * oi[j];
            lse[(size_t)bh * T + t] = L;
        }
    }
}

/* The GEMM form of backward for key/value head g of sequence b: with P
   recomputed from lse, dP = dO V^T, D_t = dO_t . O_t and dS = P (dP - D)
   scale: dQ += dS K, dK += dS^T Q, dV += P^T dO; its query heads, each one's
   query blocks in order (dK, dV accumulate, in a fixed order). P: a thread's
   scratch. */
static void pt__attn_bwd_gemm(pt_ctx *ctx, float *P, float *dqkv, float *dkv, const float *dout,
                              const float *out, const float *qkv, const float *lse,
                              const pt_attn_ring *r, int b, int g, int C, int NH, int NKV) {
    int hd = C / NH, Ckv = NKV * hd, C3 = C + 2 * Ckv, G = NH / NKV, T = r->Tq, Tk = r->Tk;
    int nqb = (T + PT_ATTN_QBLOCK - 1) / PT_ATTN_QBLOCK, ld = r->ld, h, qb, len[PT_ATTN_QBLOCK];
    float scale = 1.0f / sqrtf((float)hd), *dS = P + (size_t)PT_ATTN_QBLOCK * Tk;
    const float *kb = r->kv + (size_t)b * Tk * ld + g * hd, *vb = kb + Ckv;
    float *dkb = dkv + (size_t)b * Tk * ld + g * hd, *dvb = dkb + Ckv;
    for (h = g * G; h < (g + 1) * G; h++) {
        const float *qbase = qkv + (size_t)b * T * C3 + h * hd;
        float *dqbase = dqkv + (size_t)b * T * C3 + h * hd;
        const float *dO = dout + (size_t)b * T * C + h * hd;
        const float *O = out + (size_t)b * T * C + h * hd;
        const float *L = lse + ((size_t)b * NH + h) * T;
        for (qb = 0; qb < nqb; qb++) {
            int t0 = qb * PT_ATTN_QBLOCK, i, u, j;
            int nq = T - t0 < PT_ATTN_QBLOCK ? T - t0 : PT_ATTN_QBLOCK;
            int nk = pt__attn_rows(len, r, t0, nq);
            if (nk == 0) continue; /* the block sees no key */
            pt__mm(ctx, 0, 1, nq, nk, hd, scale, qbase + (size_t)t0 * C3, C3, kb, ld, 0.0f, P, nk);
            pt__attn_softmax(P, L + t0, NULL, len, nq, nk);
            pt__mm(ctx, 0, 1, nq, nk, hd, 1.0f, dO + (size_t)t0 * C, C, vb, ld, 0.0f, dS, nk);
            for (i = 0; i < nq; i++) {
                const float *o = O + (size_t)(t0 + i) * C, *d = dO + (size_t)(t0 + i) * C;
                const float *p = P + (size_t)i * nk;
                float *ds = dS + (size_t)i * nk, D = 0.0f;
                for (j = 0; j < hd; j++) D += d[j] * o[j];
                PT__OMP(omp simd)
                for (u = 0; u < nk; u++) ds[u] = p[u] * (ds[u] - D) * scale;
            }
            pt__mm(ctx, 0, 0, nq, hd, nk, 1.0f, dS, nk, kb, ld, 1.0f, dqbase + (size_t)t0 * C3, C3);
            pt__mm(ctx, 1, 0, nk, hd, nq, 1.0f, dS, nk, qbase + (size_t)t0 * C3, C3, 1.0f, dkb, ld);
            pt__mm(ctx, 1, 0, nk, hd, nq, 1.0f, P, nk, dO + (size_t)t0 * C, C, 1.0f, dvb, ld);
        }
    }
}

/* One task a (b, key/value head): fused (pt__fa_backward_bg) where the
   forward is, else pt__attn_bwd_gemm. */
PTRAINDEF void pt_attention_ring_backward(pt_ctx *ctx, float *dqkv, float *dkv,
                                          const float *dout, const float *out, const float *qkv,
                                          const float *lse, const pt_attn_ring *r,
                                          float *scratch, int slots, int B, int C, int NH,
                                          int NKV) {
    int bg, nthr = pt__attn_threads(ctx, slots), kind = pt__attn_fused(ctx, r->Tk, C / NH, 1);
    (void)nthr, (void)kind;
    PT__OMP(omp parallel for schedule(dynamic) num_threads(nthr))
    for (bg = 0; bg < B * NKV; bg++) {
        float *P = scratch + (size_t)pt__thread_id() * 2 * PT_ATTN_QBLOCK * r->Tk;
#ifdef PT__GEMM_X86
        pt__gemm_ws w = pt__ws_of(kind >= 0 ? ctx : NULL); /* no context: no workspace */
        if (w.p) {
            pt__fa_backward_bg((float *)w.p, w.slot, kind, dqkv, dkv, dout, out, qkv, lse, r,
                               bg / NKV, bg % NKV, bg + nthr < B * NKV ? bg + nthr : -1, C, NH,
                               NKV);
            continue;
        }
#endif
        pt__attn_bwd_gemm(ctx, P, dqkv, dkv, dout, out, qkv, lse, r, bg / NKV, bg % NKV, C, NH,
                          NKV);
    }
}

PTRAINDEF void pt_attention_backward(pt_ctx *ctx, float *dqkv, const float *dout,
                                     const float *out, const float *qkv, const float *lse,
                                     float *scratch, int slots, int B, int T, int C, int NH,
                                     int NKV) {
    pt_attn_ring r = {NULL, NULL, 0, 0, NULL, 0};
    r.Tq = r.Tk = T, r.kv = qkv + C, r.ld = C + 2 * NKV * (C / NH);
    pt_attention_ring_backward(ctx, dqkv, dqkv + C, dout, out, qkv, lse, &r, scratch, slots, B, C,
                               NH, NKV);
}

#define PT__GELU_K 0.7978845608028654f /* sqrt(2/pi) */

#define PT__SPAN 4096 /* elements per task in elementwise loops (whole cache lines) */

/* y = k (u + 0.044715 u^3); gelu(u) = u / (1 + e^(-2y)), as 0.5 (1 + tanh y)
   = sigmoid(2y); dir 0 writes it to out[i, i1). With s = sigmoid(2y) and
   y' = k (1 + 3 * 0.044715 u^2): d gelu/du = s + 2 u s (1 - s) y', times
   dout into out (dir 1; out may be dout). The 16-lane path is the scalar
   one's operations in its order: the same bits. */
static void pt__gelu_span(float *out, const float *inp, const float *dout, size_t i,
                          size_t i1, int dir) {
    const float c3 = 3.0f * 0.044715f;
    size_t j;
#ifdef __AVX512F__
    const __m512 a = _mm512_set1_ps(0.044715f), k = _mm512_set1_ps(PT__GELU_K),
                 one = _mm512_set1_ps(1.0f), two = _mm512_set1_ps(2.0f);
    for (; i + 16 <= i1; i += 16) {
        __m512 x = _mm512_loadu_ps(inp + i), y, e, sg, g;
        y = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(a, x), x), x);
        y = _mm512_mul_ps(k, _mm512_add_ps(x, y));
        e = _mm512_add_ps(one, pt__expf16(_mm512_mul_ps(_mm512_set1_ps(-2.0f), y)));
        if (!dir) {
            _mm512_storeu_ps(out + i, _mm512_div_ps(x, e));
            continue;
        }
        sg = _mm512_div_ps(one, e);
        g = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(two, x), sg), _mm512_sub_ps(one, sg));
        g = _mm512_mul_ps(_mm512_mul_ps(g, k),
                          _mm512_add_ps(one, _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(c3), x), x)));
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_add_ps(sg, g), _mm512_loadu_ps(dout + i)));
    }
#endif
    if (!dir) {
        PT__OMP(omp simd)
        for (j = i; j < i1; j++) {
            float x = inp[j], y = PT__GELU_K * (x + 0.044715f * x * x * x);
            out[j] = x / (1.0f + pt__expf(-2.0f * y));
        }
        return;
    }
    PT__OMP(omp simd)
    for (j = i; j < i1; j++) {
        float x = inp[j], y = PT__GELU_K * (x + 0.044715f * x * x * x);
        float sg = 1.0f / (1.0f + pt__expf(-2.0f * y));
        float g = sg + 2.0f * x * sg * (1.0f - sg) * PT__GELU_K * (1.0f + c3 * x * x);
        out[j] = g * dout[j];
    }
}

static void pt__gelu(float *out, const float *inp, const float *dout, size_t n, int dir) {
    ptrdiff_t c, nchunks = (ptrdiff_t)((n + PT__SPAN - 1) / PT__SPAN);
    PT__OMP(omp parallel for schedule(static))
    for (c = 0; c < nchunks; c++) {
        size_t i0 = (size_t)c * PT__SPAN, i1 = i0 + PT__SPAN < n ? i0 + PT__SPAN : n;
        pt__gelu_span(out, inp, dout, i0, i1, dir);
    }
}

PTRAINDEF void pt_gelu_forward(float *out, const float *inp, size_t n) {
    pt__gelu(out, inp, NULL, n, 0);
}

PTRAINDEF void pt_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
    pt__gelu(dinp, inp, dout, n, 1);
}

PTRAINDEF void pt_residual_forward(float *out, const float *a, const float *b, size_t n) {
    ptrdiff_t i;
    PT__OMP(omp parallel for simd schedule(static))
    for (i = 0; i < (ptrdiff_t)n; i++) out[i] = a[i] + b[i];
}

PTRAINDEF void pt_residual_backward(float *da, float *db, const float *dout, size_t n) {
    ptrdiff_t i;
    PT__OMP(omp parallel for simd schedule(static))
    for (i = 0; i < (ptrdiff_t)n; i++) {
        da[i] += dout[i];
        db[i] += dout[i];
    }
}

PTRAINDEF void pt_tied_head_forward(pt_ctx *ctx, float *logits, const float *x, const float *wte,
                                    int N, int C, int V) {
    pt__mm(ctx, 0, 1, N, V, C, 1.0f, x, C, wte, C, 0.0f, logits, V);
}

/* dx += dlogits @ wte ; dwte += dlogits^T @ x */
PTRAINDEF void pt_tied_head_backward(pt_ctx *ctx, float *dx, float *dwte, const float *dlogits,
                                     const float *x, const float *wte, int N, int C, int V) {
    if (dx) pt__mm(ctx, 0, 0, N, C, V, 1.0f, dlogits, V, wte, C, 1.0f, dx, C);
    if (dwte) pt__mm(ctx, 1, 0, V, C, N, 1.0f, dlogits, V, x, C, 1.0f, dwte, C);
}

/* lse = mx + log sum_v exp(l_v - mx), summed in double */
PTRAINDEF void pt_crossentropy_forward(float *losses, double *lse, const float *logits,
                                       const int *targets, int N, int V) {
    int n;
    PT__OMP(omp parallel for schedule(static))
    for (n = 0; n < N; n++) {
        const float *l = logits + (size_t)n * V;
        float mx = pt__maxf(l, V);
        lse[n] = (double)mx + log(pt__sum_exp(l, V, mx));
        losses[n] = (float)(lse[n] - (double)l[targets[n]]);
    }
}

/* The backward on this rank's Vl columns [v0, v0+Vl) of the vocabulary, of
   which the first `valid` are real (the rest padding: gradient 0). */
static void pt__xent_backward_part(float *dlogits, const float *logits, const double *lse,
                                   const int *targets, int N, int Vl, int valid, int v0,
                                   float dloss) {
    int n;
    PT__OMP(omp parallel for schedule(static))
    for (n = 0; n < N; n++) {
        const float *l = logits + (size_t)n * Vl;
        float *d = dlogits + (size_t)n * Vl;
        double m = lse[n];
        int v, t = targets[n] - v0;
        PT__OMP(omp simd)
        for (v = 0; v < valid; v++) d[v] = dloss * pt__expf((float)((double)l[v] - m));
        for (v = valid; v < Vl; v++) d[v] = 0.0f;
        if (t >= 0 && t < valid) d[t] -= dloss;
    }
}

PTRAINDEF void pt_crossentropy_backward(float *dlogits, const float *logits, const double *lse,
                                        const int *targets, int N, int V, float dloss) {
    pt__xent_backward_part(dlogits, logits, lse, targets, N, V, V, 0, dloss);
}

PTRAINDEF void pt_head_xent_fused(pt_ctx *ctx, float *losses, double *lse, float *dx, float *dwte,
                                  const float *x, const float *wte, const int *targets, int N,
                                  int C, int V, float dloss, float *work, int rows) {
    int r0, R = rows > 0 ? rows : 256;
    for (r0 = 0; r0 < N; r0 += R) { /* block [r0, r0 + n) of the rows */
        int n = N - r0 < R ? N - r0 : R;
        const float *xb = x + (size_t)r0 * C;
        pt_tied_head_forward(ctx, work, xb, wte, n, C, V);
        pt_crossentropy_forward(losses + r0, lse + r0, work, targets + r0, n, V);
        if (!dx && !dwte) continue;
        pt_crossentropy_backward(work, work, lse + r0, targets + r0, n, V, dloss);
        pt_tied_head_backward(ctx, dx ? dx + (size_t)r0 * C : NULL, dwte, work, xb, wte, n, C, V);
    }
}

PTRAINDEF pt_adamw_config pt_adamw_default(void) {
    pt_adamw_config c;
    c.beta1 = 0.9f;
    c.beta2 = 0.95f;
    c.eps = 1e-8f;
    c.weight_decay = 0.1f;
    return c;
}

/* m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
   p = p*keep - step * m / (sqrt(v)/sbc2 + eps). sqrtf keeps compilers from
   vectorising (errno), so AVX-512 machines get the same math in intrinsics. */
static void pt__adamw_span(float *param, const float *grad, float *m, float *v, size_t i,
                           size_t end, float b1, float b2, float keep, float step,
                           float sbc2, float eps) {
#ifdef __AVX512F__
    __m512 vb1 = _mm512_set1_ps(b1), vb2 = _mm512_set1_ps(b2), va1 = _mm512_set1_ps(1.0f - b1),
           va2 = _mm512_set1_ps(1.0f - b2), vkeep = _mm512_set1_ps(keep),
           vstep = _mm512_set1_ps(step), vs = _mm512_set1_ps(sbc2), veps = _mm512_set1_ps(eps);
    for (; i + 16 <= end; i += 16) {
        __m512 g = _mm512_loadu_ps(grad + i);
        __m512 mi = _mm512_fmadd_ps(vb1, _mm512_loadu_ps(m + i), _mm512_mul_ps(va1, g));
        __m512 vi = _mm512_fmadd_ps(vb2, _mm512_loadu_ps(v + i), _mm512_mul_ps(_mm512_mul_ps(va2, g), g));
        __m512 den = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), vs), veps);
        __m512 upd = _mm512_div_ps(_mm512_mul_ps(vstep, mi), den);
        _mm512_storeu_ps(m + i, mi);
        _mm512_storeu_ps(v + i, vi);
        _mm512_storeu_ps(param + i, _mm512_fmsub_ps(_mm512_loadu_ps(param + i), vkeep, upd));
    }
#endif
    for (; i < end; i++) {
        float g = grad[i];
        float mi = b1 * m[i] + (1.0f - b1) * g;
        float vi = b2 * v[i] + (1.0f - b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        param[i] = param[i] * keep - step * mi / (sqrtf(vi) / sbc2 + eps);
    }
}

PTRAINDEF void pt_adamw_update(float *param, const float *grad, float *m, float *v, size_t n,
                               const pt_adamw_config *cfg, float lr, int t, int decay) {
    double bc1 = 1.0 - pow((double)cfg->beta1, t), bc2 = 1.0 - pow((double)cfg->beta2, t);
    float step = (float)((double)lr / bc1), sbc2 = (float)sqrt(bc2);
    float keep = decay ? (float)(1.0 - (double)lr * (double)cfg->weight_decay) : 1.0f;
    /* chunks of whole cache lines, split over the threads */
    ptrdiff_t c, chunk = 16384, nchunks = (ptrdiff_t)((n + (size_t)chunk - 1) / (size_t)chunk);
    PT__OMP(omp parallel for schedule(static))
    for (c = 0; c < nchunks; c++) {
        size_t i0 = (size_t)(c * chunk), i1 = i0 + (size_t)chunk < n ? i0 + (size_t)chunk : n;
        pt__adamw_span(param, grad, m, v, i0, i1, cfg->beta1, cfg->beta2, keep, step, sbc2,
                       cfg->eps);
    }
}

#define PT__NORM_PARTS 256
PTRAINDEF double pt_norm2(const float *x, size_t n) {
    double part[PT__NORM_PARTS], total = 0.0;
    size_t chunk = (n + PT__NORM_PARTS - 1) / PT__NORM_PARTS;
    int p;
    if (chunk < 4096) chunk = 4096;
    PT__OMP(omp parallel for schedule(static))
    for (p = 0; p < PT__NORM_PARTS; p++) {
        size_t i0 = (size_t)p * chunk, i1 = i0 + chunk < n ? i0 + chunk : n, i;
        double s = 0.0;
        PT__OMP(omp simd reduction(+:s))
        for (i = i0; i < i1; i++) s += (double)x[i] * (double)x[i];
        part[p] = s;
    }
    for (p = 0; p < PT__NORM_PARTS; p++) total += part[p];
    return sqrt(total);
}

PTRAINDEF void pt_scale(float *x, size_t n, float s) {
    ptrdiff_t i;
    PT__OMP(omp parallel for simd schedule(static))
    for (i = 0; i < (ptrdiff_t)n; i++) x[i] *= s;
}

PTRAINDEF float pt_lr_at(const pt_lr_schedule *s, int step) {
    double ratio;
    if (s->warmup_steps > 0 && step < s->warmup_steps)
        return s->lr * (float)(step + 1) / (float)s->warmup_steps;
    if (s->total_steps <= s->warmup_steps) return s->lr;
    if (step >= s->total_steps) return s->min_lr;
    ratio = (double)(step - s->warmup_steps) / (double)(s->total_steps - s->warmup_steps);
    return s->min_lr +
           (float)(0.5 * (1.0 + cos(3.141592653589793 * ratio))) * (s->lr - s->min_lr);
}

PTRAINDEF double pt_gemm_peak_gflops(pt_ctx *ctx, int n, double seconds) {
    size_t nn = (size_t)n * n, i;
    float *a = (float *)pt__malloc(3 * nn * sizeof(float), NULL), *b, *c;
    double best = 0.0, start;
    if (!a) return 0.0;
    b = a + nn;
    c = b + nn;
    for (i = 0; i < nn; i++) {
        a[i] = (float)(i % 7) * 0.01f;
        b[i] = (float)(i % 5) * 0.01f;
    }
    pt__mm(ctx, 0, 0, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n); /* warm-up */
    start = pt_time_now();
    do {
        double t0 = pt_time_now(), dt;
        pt__mm(ctx, 0, 0, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        dt = pt_time_now() - t0;
        if (dt > 0 && 2.0 * n * n * (double)n / dt / 1e9 > best)
            best = 2.0 * n * n * (double)n / dt / 1e9;
    } while (pt_time_now() - start < seconds);
    pt__free(a, NULL);
    return best;
}

#ifdef PT__GEMM_X86
/* independent accumulator chains: 12 (ymm, 16 registers), 24 (zmm): enough to
   cover latency x throughput on every core seen (vdpbf16ps on Zen 5: 12 chains
   ran 3% below the GEMM kernel's 24) */
#define PT__PROBE_CHAINS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define PT__PROBE_CHAINS24(X) PT__PROBE_CHAINS(X) X(12) X(13) X(14) X(15) X(16) X(17) X(18) \
    X(19) X(20) X(21) X(22) X(23)
#define PT__PROBE_DECL(i) __m512 c##i = _mm512_set1_ps((float)(i));
#define PT__PROBE_SUM(i) s = _mm512_add_ps(s, c##i);
/* the lanes' sum, through memory: gcc 12's _mm512_reduce_add_ps reads an
   undefined register that g++ -Werror=uninitialized refuses */
PT__TARGET_AVX512 static float pt__lanes_sum512(__m512 s) {
    float v[16], t = 0.0f;
    int i;
    _mm512_storeu_ps(v, s);
    for (i = 0; i < 16; i++) t += v[i];
    return t;
}
/* n rounds of 24 independent multiply-adds; returns a sum so nothing is dropped */
PT__TARGET_AVX512 static float pt__probe_fma512(long n) {
    __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-3f), s = _mm512_setzero_ps();
    long i;
    PT__PROBE_CHAINS24(PT__PROBE_DECL)
    for (i = 0; i < n; i++) {
#define PT__PROBE_OP(i) c##i = _mm512_fmadd_ps(a, c##i, b);
        PT__PROBE_CHAINS24(PT__PROBE_OP)
#undef PT__PROBE_OP
    }
    PT__PROBE_CHAINS24(PT__PROBE_SUM)
    return pt__lanes_sum512(s);
}
PT__TARGET_BF16 static float pt__probe_bf16(long n) {
    __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3a83);
    __m512 s = _mm512_setzero_ps();
    long i;
    PT__PROBE_CHAINS24(PT__PROBE_DECL)
    for (i = 0; i < n; i++) {
#define PT__PROBE_OP(i) c##i = _mm512_dpbf16_ps(c##i, a, b);
        PT__PROBE_CHAINS24(PT__PROBE_OP)
#undef PT__PROBE_OP
    }
    PT__PROBE_CHAINS24(PT__PROBE_SUM)
    return pt__lanes_sum512(s);
}
/* n rounds of 4 independent TDPBF16PS (C tiles 0-3 += A tiles 4-5 @ B tiles
   6-7, 16x16x32 each: 16384 FLOPs); the thread loads the tile config and
   releases the tiles itself */
PT__TARGET_AMX static float pt__probe_amx(long n) {
    __attribute__((aligned(64))) uint16_t v[512];
    __attribute__((aligned(64))) float out[256];
    long i;
    for (i = 0; i < 512; i++) v[i] = (uint16_t)(i & 1 ? 0x3a83 : 0x3f80); /* 1e-3, 1 */
    pt__amx_config();
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, v, 64);
    _tile_loadd(5, v, 64);
    _tile_loadd(6, v, 64);
    _tile_loadd(7, v, 64);
    for (i = 0; i < n; i++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, out, 64);
    pt__amx_release();
    PT__AMX_FENCE();
    return out[0] + out[255];
}
#undef PT__PROBE_DECL
#undef PT__PROBE_SUM
#define PT__PROBE_DECL(i) __m256 c##i = _mm256_set1_ps((float)(i));
__attribute__((target("avx2,fma"))) static float pt__probe_fma256(long n) {
    __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-3f), s = _mm256_setzero_ps();
    float out[8];
    long i;
    PT__PROBE_CHAINS(PT__PROBE_DECL)
    for (i = 0; i < n; i++) {
#define PT__PROBE_OP(i) c##i = _mm256_fmadd_ps(a, c##i, b);
        PT__PROBE_CHAINS(PT__PROBE_OP)
#undef PT__PROBE_OP
    }
#define PT__PROBE_SUM(i) s = _mm256_add_ps(s, c##i);
    PT__PROBE_CHAINS(PT__PROBE_SUM)
    _mm256_storeu_ps(out, s);
    return out[0] + out[7];
}
#undef PT__PROBE_DECL
#undef PT__PROBE_SUM
#undef PT__PROBE_CHAINS
#undef PT__PROBE_CHAINS24
#endif

PTRAINDEF double pt_instr_peak_gflops(int bf16, double seconds) {
    double best = 0.0;
#ifdef PT__GEMM_X86
    const long n = 1 << 18;
    long rounds = n;
    double per, start = pt_time_now(), sink = 0.0;
    /* 3 AMX, 2 vdpbf16ps, 1 zmm FMA, 0 ymm FMA (bf16 without a bf16 instruction too) */
    int kind = bf16 && (pt__cpu_amx() || pt__cpu_avx512(1))
                   ? (pt__gemm_bf16_current() == PT__BF16_AVX512 || !pt__cpu_amx() ? 2 : 3)
               : pt__cpu_avx512(0)             ? 1
               : __builtin_cpu_supports("fma") ? 0
                                               : -1;
    if (kind < 0) return 0.0;
    /* FLOPs a round: 24 instructions x 16 lanes x 2 (vdpbf16ps: x 2 again; ymm:
       12 x 8 lanes x 2); AMX: 4 tile products of 16x16x32 multiply-adds */
    per = kind == 3 ? 4 * 16384.0 : kind == 2 ? 1536.0 : kind == 1 ? 768.0 : 192.0;
    if (kind == 3) rounds = n / 16;
    do {
        double t0 = pt_time_now(), dt;
        int nth = 1;
        PT__OMP(omp parallel reduction(+ : sink))
        {
#ifdef _OPENMP
            PT__OMP(omp single)
            nth = omp_get_num_threads();
#endif
            sink += kind == 3   ? pt__probe_amx(rounds)
                    : kind == 2 ? pt__probe_bf16(rounds)
                    : kind == 1 ? pt__probe_fma512(rounds)
                                : pt__probe_fma256(rounds);
        }
        dt = pt_time_now() - t0;
        if (dt > 0 && per * rounds * nth / dt / 1e9 > best) best = per * rounds * nth / dt / 1e9;
    } while (pt_time_now() - start < seconds);
    if (sink == 12345.0) best += 0.0; /* keeps the results alive */
#else
    (void)bf16, (void)seconds;
#endif
    return best;
}

PTRAINDEF double pt_mem_bandwidth_gbs(size_t n, int reps) {
    float *x = (float *)pt__malloc(2 * n * sizeof(float), NULL), *y;
    double best = 0.0;
    ptrdiff_t i;
    int r;
    if (!x) return 0.0;
    y = x + n;
    PT__OMP(omp parallel for simd schedule(static))
    for (i = 0; i < (ptrdiff_t)n; i++) x[i] = (float)(i % 7), y[i] = 0.0f; /* first touch */
    for (r = 0; r <= reps; r++) { /* run 0 warms up */
        double t0 = pt_time_now(), dt;
        PT__OMP(omp parallel for simd schedule(static))
        for (i = 0; i < (ptrdiff_t)n; i++) y[i] += 0.5f * x[i];
        dt = pt_time_now() - t0;
        if (r > 0 && dt > 0 && 12.0 * (double)n / dt / 1e9 > best) best = 12.0 * (double)n / dt / 1e9;
    }
    pt__free(x, NULL);
    return best;
}

/* ======================================================================== */
/* >>comm (implementation)                                                   */
/* ======================================================================== */

/* The communicator: the timed, checked wrappers every backend shares, then the
   self, threads and MPI backends, then the tp x dp x pp grid.

   The wrappers (pt_comm_all_reduce ...) check arguments, call the backend
   through c->ops and add time, payload bytes and one call to c's counters.
   Rules every backend keeps, so a program that works on one works on all:
   tags are in [0, 32767] (what MPI guarantees), reduce_scatter's out must not
   overlap its in, all_gather may run in place (in == out + rank*n), and a
   recv whose size differs from the message's fails with PT_ERR_SHAPE and
   leaves the message queued. */

#if !defined(_WIN32)
#include <sched.h>
#endif
#ifdef PTRAIN_MPI
#ifdef __cplusplus /* the C API only: no C++ bindings inside extern "C" */
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#endif
#include <mpi.h>
#include <arpa/inet.h> /* the host names of the timeout messages */
#include <ifaddrs.h>
#include <netinet/in.h>
#include <signal.h>
static const char *pt__mpi_host_of(const pt_comm *c, int rank);
#endif
#include <limits.h>

#define PT__TAG_MAX 32767 /* the largest tag every MPI must accept */

/* ---- the checked, timed wrappers ----------------------------------------- */

/* The seconds a wait of c may last (its timeout, else the default). */
static double pt__comm_limit(const pt_comm *c) {
    return c->timeout > 0.0 ? c->timeout : PT_COMM_TIMEOUT_DEFAULT;
}

static pt_status pt__comm_ok(const pt_comm *c, const char *op) {
    if (!c || !c->ops) return pt__fail(PT_ERR_INVALID_ARG, "%s: communicator is NULL or freed", op);
    if (c->size < 1 || c->rank < 0 || c->rank >= c->size)
        return pt__fail(PT_ERR_INVALID_ARG, "%s: communicator has rank %d of size %d", op, c->rank,
                        c->size);
    return PT_OK;
}

/* A buffer of n floats: not NULL unless empty, and n*4 bytes addressable. */
static pt_status pt__comm_buf(const char *op, const char *name, const void *p, size_t n) {
    if (n > SIZE_MAX / sizeof(float))
        return pt__fail(PT_ERR_INVALID_ARG, "%s: %s has n=%zu floats, more than memory holds", op,
                        name, n);
    if (!p && n > 0) return pt__fail(PT_ERR_INVALID_ARG, "%s: %s is NULL with n=%zu", op, name, n);
    return PT_OK;
}

static pt_status pt__comm_rank(const pt_comm *c, const char *op, const char *name, int r) {
    if (r < 0 || r >= c->size)
        return pt__fail(PT_ERR_INVALID_ARG, "%s: %s=%d must be in [0, %d)", op, name, r, c->size);
    return PT_OK;
}

static pt_status pt__comm_tag(const char *op, int tag) {
    if (tag < 0 || tag > PT__TAG_MAX)
        return pt__fail(PT_ERR_INVALID_ARG, "%s: tag=%d must be in [0, %d]", op, tag, PT__TAG_MAX);
    return PT_OK;
}

static pt_status pt__comm_op(const char *op, pt_reduce_op r) {
    if (r != PT_REDUCE_SUM && r != PT_REDUCE_AVG && r != PT_REDUCE_MAX)
        return pt__fail(PT_ERR_INVALID_ARG, "%s: op=%d is not SUM, AVG or MAX", op, (int)r);
    return PT_OK;
}

/* Is a spare of cand floats a better home for n floats than one of best?
   The smallest that fits, else the largest (it will be grown). */
static int pt__better_fit(size_t cand, size_t best, size_t n) {
    if (cand >= n) return best < n || cand < best;
    return best < n && cand > best;
}

/* Do [a, a+na) and [b, b+nb) share a byte? (compared as integers: the
   pointers may belong to different objects) */
static int pt__overlap(const float *a, size_t na, const float *b, size_t nb) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return na > 0 && nb > 0 && x < y + nb * sizeof(float) && y < x + na * sizeof(float);
}

static pt_status pt__comm_count(pt_comm *c, double t0, size_t floats, pt_status st) {
    c->seconds += pt_time_now() - t0;
    c->bytes += (uint64_t)floats * sizeof(float);
    c->calls++;
    return st;
}

#define PT__COMM_HAS(c, fn, op)                                                                   \
    if (!(c)->ops->fn)                                                                            \
        return pt__fail(PT_ERR_UNSUPPORTED, "%s: this communicator's backend has no " #fn, op);

/* The checks of each operation, shared by the blocking and the started form. */
static pt_status pt__ck_all_reduce(pt_comm *c, const char *w, const float *buf, size_t n,
                                   pt_reduce_op op) {
    pt_status st;
    if ((st = pt__comm_ok(c, w)) || (st = pt__comm_buf(w, "buf", buf, n)) ||
        (st = pt__comm_op(w, op)))
        return st;
    return PT_OK;
}

static pt_status pt__ck_reduce_scatter(pt_comm *c, const char *w, const float *in,
                                       const float *out, size_t n, pt_reduce_op op) {
    pt_status st;
    if ((st = pt__comm_ok(c, w))) return st;
    if (n > SIZE_MAX / sizeof(float) / (size_t)c->size)
        return pt__fail(PT_ERR_INVALID_ARG, "%s: size %d x n=%zu floats overflows", w, c->size, n);
    if ((st = pt__comm_buf(w, "in", in, (size_t)c->size * n)) ||
        (st = pt__comm_buf(w, "out", out, n)) || (st = pt__comm_op(w, op)))
        return st;
    if (pt__overlap(in, (size_t)c->size * n, out, n))
        return pt__fail(PT_ERR_INVALID_ARG, "%s: out overlaps in", w);
    return PT_OK;
}

static pt_status pt__ck_all_gather(pt_comm *c, const char *w, const float *in, const float *out,
                                   size_t n) {
    pt_status st;
    if ((st = pt__comm_ok(c, w))) return st;
    if (n > SIZE_MAX / sizeof(float) / (size_t)c->size)
        return pt__fail(PT_ERR_INVALID_ARG, "%s: size %d x n=%zu floats overflows", w, c->size, n);
    if ((st = pt__comm_buf(w, "in", in, n)) || (st = pt__comm_buf(w, "out", out, (size_t)c->size * n)))
        return st;
    if (in != out + (size_t)c->rank * n && pt__overlap(in, n, out, (size_t)c->size * n))
        return pt__fail(PT_ERR_INVALID_ARG,
                        "%s: in overlaps out (in place is in == out + rank*n only)", w);
    return PT_OK;
}

static pt_status pt__ck_p2p(pt_comm *c, const char *w, const char *peer_name, const float *buf,
                            size_t n, int peer, int tag) {
    pt_status st;
    if ((st = pt__comm_ok(c, w)) || (st = pt__comm_buf(w, "buf", buf, n)) ||
        (st = pt__comm_rank(c, w, peer_name, peer)) || (st = pt__comm_tag(w, tag)))
        return st;
    return PT_OK;
}

PTRAINDEF pt_status pt_comm_all_reduce(pt_comm *c, float *buf, size_t n, pt_reduce_op op) {
    pt_status st;
    double t0;
    if ((st = pt__ck_all_reduce(c, "all_reduce", buf, n, op))) return st;
    PT__COMM_HAS(c, all_reduce, "all_reduce")
    t0 = pt_time_now();
    return pt__comm_count(c, t0, n, c->ops->all_reduce(c, buf, n, op));
}

PTRAINDEF pt_status pt_comm_reduce_scatter(pt_comm *c, const float *in, float *out, size_t n,
                                           pt_reduce_op op) {
    pt_status st;
    double t0;
    if ((st = pt__ck_reduce_scatter(c, "reduce_scatter", in, out, n, op))) return st;
    PT__COMM_HAS(c, reduce_scatter, "reduce_scatter")
    t0 = pt_time_now();
    return pt__comm_count(c, t0, (size_t)c->size * n, c->ops->reduce_scatter(c, in, out, n, op));
}

PTRAINDEF pt_status pt_comm_all_gather(pt_comm *c, const float *in, float *out, size_t n) {
    pt_status st;
    double t0;
    if ((st = pt__ck_all_gather(c, "all_gather", in, out, n))) return st;
    PT__COMM_HAS(c, all_gather, "all_gather")
    t0 = pt_time_now();
    return pt__comm_count(c, t0, (size_t)c->size * n, c->ops->all_gather(c, in, out, n));
}

PTRAINDEF pt_status pt_comm_broadcast(pt_comm *c, float *buf, size_t n, int root) {
    const char *w = "broadcast";
    pt_status st;
    double t0;
    if ((st = pt__comm_ok(c, w)) || (st = pt__comm_buf(w, "buf", buf, n)) ||
        (st = pt__comm_rank(c, w, "root", root)))
        return st;
    PT__COMM_HAS(c, broadcast, w)
    t0 = pt_time_now();
    return pt__comm_count(c, t0, n, c->ops->broadcast(c, buf, n, root));
}

PTRAINDEF pt_status pt_comm_send(pt_comm *c, const float *buf, size_t n, int dst, int tag) {
    pt_status st;
    double t0;
    if ((st = pt__ck_p2p(c, "send", "dst", buf, n, dst, tag))) return st;
    PT__COMM_HAS(c, send, "send")
    t0 = pt_time_now();
    return pt__comm_count(c, t0, n, c->ops->send(c, buf, n, dst, tag));
}

PTRAINDEF pt_status pt_comm_recv(pt_comm *c, float *buf, size_t n, int src, int tag) {
    pt_status st;
    double t0;
    if ((st = pt__ck_p2p(c, "recv", "src", buf, n, src, tag))) return st;
    PT__COMM_HAS(c, recv, "recv")
    t0 = pt_time_now();
    return pt__comm_count(c, t0, n, c->ops->recv(c, buf, n, src, tag));
}

/* ---- started operations: the request's life ------------------------------
   start fills req, then hands it to the backend's start, or, for a backend
   without one, runs the blocking operation and marks req done. req->comm is
   set only when the start succeeded. */
static pt_status pt__start(pt_comm *c, pt_comm_req *req, const char *w, pt_comm_op op, int arg,
                           int tag, size_t n, const float *in, float *out, size_t counted) {
    double t0;
    pt_status st;
    memset(req, 0, sizeof *req);
    req->op = op, req->arg = arg, req->tag = tag, req->n = n, req->in = in, req->out = out;
    if (c->ops->start && (!c->ops->test || !c->ops->wait))
        return pt__fail(PT_ERR_UNSUPPORTED, "%s: this communicator's backend has start but no %s",
                        w, c->ops->test ? "wait" : "test");
    t0 = pt_time_now();
    if (c->ops->start) {
        st = c->ops->start(c, req);
    } else {
        switch (op) {
        case PT_COMM_OP_ALL_REDUCE:
            PT__COMM_HAS(c, all_reduce, w)
            st = c->ops->all_reduce(c, out, n, (pt_reduce_op)arg);
            break;
        case PT_COMM_OP_REDUCE_SCATTER:
            PT__COMM_HAS(c, reduce_scatter, w)
            st = c->ops->reduce_scatter(c, in, out, n, (pt_reduce_op)arg);
            break;
        case PT_COMM_OP_ALL_GATHER:
            PT__COMM_HAS(c, all_gather, w)
            st = c->ops->all_gather(c, in, out, n);
            break;
        case PT_COMM_OP_SEND:
            PT__COMM_HAS(c, send, w)
            st = c->ops->send(c, in, n, arg, tag);
            break;
        default:
            PT__COMM_HAS(c, recv, w)
            st = c->ops->recv(c, out, n, arg, tag);
            break;
        }
        if (st == PT_OK) req->done = 1, req->status = PT_OK;
    }
    pt__comm_count(c, t0, counted, st);
    if (st == PT_OK) req->comm = c;
    return st;
}

#define PT__REQ_OK(req, w)                                                                       \
    if (!(req)) return pt__fail(PT_ERR_INVALID_ARG, "%s: req is NULL", w);

PTRAINDEF pt_status pt_comm_all_reduce_start(pt_comm *c, float *buf, size_t n, pt_reduce_op op,
                                             pt_comm_req *req) {
    const char *w = "all_reduce_start";
    pt_status st;
    PT__REQ_OK(req, w)
    req->comm = NULL;
    if ((st = pt__ck_all_reduce(c, w, buf, n, op))) return st;
    return pt__start(c, req, w, PT_COMM_OP_ALL_REDUCE, (int)op, 0, n, buf, buf, n);
}

PTRAINDEF pt_status pt_comm_reduce_scatter_start(pt_comm *c, const float *in, float *out,
                                                 size_t n, pt_reduce_op op, pt_comm_req *req) {
    const char *w = "reduce_scatter_start";
    pt_status st;
    PT__REQ_OK(req, w)
    req->comm = NULL;
    if ((st = pt__ck_reduce_scatter(c, w, in, out, n, op))) return st;
    return pt__start(c, req, w, PT_COMM_OP_REDUCE_SCATTER, (int)op, 0, n, in, out,
                     (size_t)c->size * n);
}

PTRAINDEF pt_status pt_comm_all_gather_start(pt_comm *c, const float *in, float *out, size_t n,
                                             pt_comm_req *req) {
    const char *w = "all_gather_start";
    pt_status st;
    PT__REQ_OK(req, w)
    req->comm = NULL;
    if ((st = pt__ck_all_gather(c, w, in, out, n))) return st;
    return pt__start(c, req, w, PT_COMM_OP_ALL_GATHER, 0, 0, n, in, out, (size_t)c->size * n);
}

PTRAINDEF pt_status pt_comm_send_start(pt_comm *c, const float *buf, size_t n, int dst, int tag,
                                       pt_comm_req *req) {
    const char *w = "send_start";
    pt_status st;
    PT__REQ_OK(req, w)
    req->comm = NULL;
    if ((st = pt__ck_p2p(c, w, "dst", buf, n, dst, tag))) return st;
    return pt__start(c, req, w, PT_COMM_OP_SEND, dst, tag, n, buf, NULL, n);
}

PTRAINDEF pt_status pt_comm_recv_start(pt_comm *c, float *buf, size_t n, int src, int tag,
                                       pt_comm_req *req) {
    const char *w = "recv_start";
    pt_status st;
    PT__REQ_OK(req, w)
    req->comm = NULL;
    if ((st = pt__ck_p2p(c, w, "src", buf, n, src, tag))) return st;
    return pt__start(c, req, w, PT_COMM_OP_RECV, src, tag, n, NULL, buf, n);
}

PTRAINDEF pt_status pt_comm_test(pt_comm_req *req, int *done) {
    pt_comm *c;
    pt_status st;
    double t0;
    if (!done) return pt__fail(PT_ERR_INVALID_ARG, "test: done is NULL");
    *done = 1;
    PT__REQ_OK(req, "test")
    if (!(c = req->comm)) return PT_OK;
    if (req->done) {
        req->comm = NULL;
        return req->status;
    }
    t0 = pt_time_now();
    *done = 0;
    st = c->ops->test(c, req, done);
    c->seconds += pt_time_now() - t0;
    if (st != PT_OK) *done = 1;
    if (*done) req->comm = NULL;
    return st;
}

PTRAINDEF pt_status pt_comm_wait(pt_comm_req *req) {
    pt_comm *c;
    pt_status st;
    double t0;
    PT__REQ_OK(req, "wait")
    if (!(c = req->comm)) return PT_OK;
    req->comm = NULL;
    if (req->done) return req->status;
    t0 = pt_time_now();
    st = c->ops->wait(c, req);
    c->seconds += pt_time_now() - t0;
    return st;
}

PTRAINDEF pt_status pt_comm_barrier(pt_comm *c) {
    pt_status st;
    double t0;
    if ((st = pt__comm_ok(c, "barrier"))) return st;
    PT__COMM_HAS(c, barrier, "barrier")
    t0 = pt_time_now();
    return pt__comm_count(c, t0, 0, c->ops->barrier(c));
}

PTRAINDEF pt_status pt_comm_split(pt_comm *c, int color, int key, pt_comm *out) {
    pt_status st;
    double t0;
    if ((st = pt__comm_ok(c, "split"))) return st;
    if (!out || out == c)
        return pt__fail(PT_ERR_INVALID_ARG, "split: out must be a pt_comm other than c");
    memset(out, 0, sizeof *out);
    if (color < 0) return pt__fail(PT_ERR_INVALID_ARG, "split: color=%d must be >= 0", color);
    PT__COMM_HAS(c, split, "split")
    t0 = pt_time_now();
    st = pt__comm_count(c, t0, 0, c->ops->split(c, color, key, out));
    if (st == PT_OK) out->timeout = c->timeout;
    return st;
}

PTRAINDEF pt_status pt_comm_fail(pt_comm *c, pt_status s) {
    char msg[sizeof pt__err];
    snprintf(msg, sizeof msg, "%s", pt__err[0] ? pt__err : pt_status_str(s));
    if (c && c->ops && c->ops->abort) c->ops->abort(c, msg);
    return s;
}

PTRAINDEF const char *pt_comm_host(const pt_comm *c, int rank) {
    if (!c || rank < 0 || rank >= c->size) return "?";
#ifdef PTRAIN_MPI
    if (c->kind == PT_COMM_MPI && c->impl) return pt__mpi_host_of(c, rank);
#endif
    return "local";
}

/* Frees the backend state (collective for threads and MPI communicators made
   by split) and zeroes *c, so freeing twice is harmless. */
PTRAINDEF void pt_comm_free(pt_comm *c) {
    if (!c) return;
    if (c->ops && c->ops->free) c->ops->free(c);
    memset(c, 0, sizeof *c);
}

/* all_ok = min over ranks of (ok != 0), as max over ranks of (ok == 0). */
PTRAINDEF pt_status pt_comm_all_ok(pt_comm *c, int ok, int *all_ok) {
    float bad = ok ? 0.0f : 1.0f;
    pt_status st;
    if (!all_ok) return pt__fail(PT_ERR_INVALID_ARG, "all_ok: all_ok is NULL");
    *all_ok = 0;
    if ((st = pt_comm_all_reduce(c, &bad, 1, PT_REDUCE_MAX)) != PT_OK) return st;
    *all_ok = bad == 0.0f;
    return PT_OK;
}

/* ---- the self backend: rank 0 of 1, every collective a copy or nothing --- */

static pt_status pt__self_all_reduce(pt_comm *c, float *buf, size_t n, pt_reduce_op op) {
    (void)c, (void)buf, (void)n, (void)op; /* AVG over one rank is x/1 = x */
    return PT_OK;
}
static pt_status pt__self_reduce_scatter(pt_comm *c, const float *in, float *out, size_t n,
                                         pt_reduce_op op) {
    (void)c, (void)op;
    if (n) memcpy(out, in, n * sizeof(float));
    return PT_OK;
}
static pt_status pt__self_all_gather(pt_comm *c, const float *in, float *out, size_t n) {
    (void)c;
    if (n && in != out) memcpy(out, in, n * sizeof(float));
    return PT_OK;
}
static pt_status pt__self_broadcast(pt_comm *c, float *buf, size_t n, int root) {
    (void)c, (void)buf, (void)n, (void)root;
    return PT_OK;
}
static pt_status pt__self_send(pt_comm *c, const float *buf, size_t n, int dst, int tag) {
    (void)c, (void)buf, (void)n, (void)dst, (void)tag;
    return pt__fail(PT_ERR_INVALID_ARG, "send: the self communicator has no mailbox (send to self)");
}
static pt_status pt__self_recv(pt_comm *c, float *buf, size_t n, int src, int tag) {
    (void)c, (void)buf, (void)n, (void)src, (void)tag;
    return pt__fail(PT_ERR_INVALID_ARG, "recv: the self communicator has no mailbox (recv from self)");
}
static pt_status pt__self_barrier(pt_comm *c) {
    (void)c;
    return PT_OK;
}
static pt_status pt__self_split(pt_comm *c, int color, int key, pt_comm *out) {
    (void)c, (void)color, (void)key;
    pt_comm_self(out);
    return PT_OK;
}
static void pt__self_abort(pt_comm *c, const char *msg) { (void)c, (void)msg; }
static void pt__self_free(pt_comm *c) { (void)c; }

static const pt_comm_ops pt__self_ops = {
    pt__self_all_reduce, pt__self_reduce_scatter, pt__self_all_gather, pt__self_broadcast,
    pt__self_send,       pt__self_recv,           pt__self_barrier,    pt__self_split,
    pt__self_abort,      pt__self_free,           NULL,                NULL,
    NULL}; /* started operations run at start */

PTRAINDEF void pt_comm_self(pt_comm *c) {
    if (!c) return;
    memset(c, 0, sizeof *c);
    c->rank = 0;
    c->size = 1;
    c->kind = PT_COMM_SELF;
    c->ops = &pt__self_ops;
}

/* ---- the threads backend -------------------------------------------------
   Ranks are threads sharing memory, so a collective moves no message: each
   rank publishes a pointer to its buffer, and after a barrier every rank reads
   the others' buffers directly. Every collective is

       publish (op, n, arg, buffer)   -> entry barrier
       check that all ranks made the same call (else all fail alike)
       compute: read the published buffers, write own or own slice
       exit barrier                   -> nobody reads a buffer after its owner returned

   Barriers count arrivals in one 64-bit word, generation << 32 | arrived; the
   last to arrive starts the next generation. A rank waits by spinning a
   little (pause, then yield: with more ranks than cores, the rank it waits for
   may need its core), then sleeping on the world's condition variable, which
   is broadcast on every event a waiter may need: a barrier released, a
   message sent, a rank failed, a rank's fn returned.

   Failure: a world-wide flag and message. A rank in an entry barrier that
   sees it (or sees a rank of its group return from fn, which can never arrive
   now) withdraws its arrival by compare-and-swap and returns PT_ERR_COMM; the
   swap fails if the barrier already completed, and then the rank goes on as
   if nothing happened: so either every rank passes an entry barrier or none
   does. Exit barriers ignore failures: every rank that passed the entry
   barrier reaches the exit barrier without waiting on anything else. */
#ifdef PT__HAVE_PTHREADS

#define PT__SPIN 64        /* a waiter pauses this many rounds, */
#define PT__YIELD 2000     /* then yields the core up to this many, then sleeps */
#define PT__BLOCK 256      /* floats per reduction block (1 KiB on the stack) */
#define PT__MAX_THREADS 4096
#define PT__RING 64        /* started collectives a rank may have unfinished per group */
#define PT__UNIT 16384     /* floats per work unit of a started reduction (64 KiB) */

enum { PT__OP_ALL_REDUCE = 1, PT__OP_REDUCE_SCATTER, PT__OP_ALL_GATHER, PT__OP_BROADCAST,
       PT__OP_BARRIER, PT__OP_SPLIT };
static const char *const pt__op_names[] = {"?",         "all_reduce", "reduce_scatter",
                                           "all_gather", "broadcast",  "barrier", "split"};

typedef struct pt__tpost { /* one rank's call of a collective */
    int op, arg, key;      /* arg: reduce op, root or color; key: split key */
    size_t n;
    float *buf;            /* the rank's buffer (its input for reduce_scatter, all_gather) */
    float *out;            /* started reduce_scatter, all_gather: the rank's output */
} pt__tpost;

typedef struct pt__tslot { /* one started collective of a group (see pt__tstart) */
    uint64_t uses;         /* times recycled: it holds collective number uses*RING + index */
    int arrived, released; /* ranks that started it, that finished with it */
    size_t next, done;     /* work units claimed, finished */
    char pad_[32];
} pt__tslot;

typedef struct pt__tmsg {  /* a buffered message, or a spare one to reuse */
    struct pt__tmsg *next;
    int src, tag;
    size_t n, cap;
    float *data;
} pt__tmsg;

typedef struct pt__tbox {  /* a rank's inbox: queued messages in send order, spares */
    pthread_mutex_t mu;
    pt__tmsg *head, *tail, *spare;
    int count; /* messages made for this inbox (queued, being taken, spare) */
} pt__tbox;

struct pt__tworld;
typedef struct pt__tgroup { /* shared by the ranks of one communicator */
    uint64_t bar;           /* generation << 32 | ranks arrived */
    char pad_[56];          /* no other shared field on the barrier word's cache line */
    struct pt__tworld *world;
    struct pt__tgroup *next; /* the world's list of live groups */
    int size, refs;          /* refs: members that have not freed it */
    int *wrank;              /* group rank -> world rank */
    pt__tpost *post;         /* [size] */
    struct pt__tgroup **made; /* [size] split: the group made by a color's lowest rank */
    pt__tbox *box;           /* [size] inboxes */
    pt__tslot *ring;         /* [RING] started collectives, by number % RING */
    pt__tpost *rpost;        /* [RING * size] each rank's post in each slot */
    uint64_t *started;       /* [size] collectives each rank started (atomic: others read it) */
    int *pending;            /* [size] each rank's unfinished started collectives (its own) */
    pt_comm_req **recvq;     /* [size] each rank's started receives, oldest first (its own) */
} pt__tgroup;

typedef struct pt__tworld {
    pthread_mutex_t mu;     /* guards sleeping, the failure message, the group list */
    pthread_cond_t cv;
    unsigned events;        /* counts events; a sleeper waits for it to move */
    int sleepers;
    int failed, fail_rank;
    int working;            /* ranks inside a unit of a started collective (see pt__twork) */
    char fail_msg[sizeof pt__err];
    int n;
    int *done;                  /* [n] the rank's fn returned */
    unsigned char *saw_fail;    /* [n] the rank got PT_ERR_COMM for someone's failure */
    unsigned char *origin;      /* [n] the rank failed before seeing a failure */
    pt__tgroup *groups;         /* freed by pt_comm_threads_run if the ranks did not */
} pt__tworld;

static void pt__cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Something a waiter may wait for happened. The seq_cst pair (events++, read
   sleepers) against (sleepers++, read events) in pt__twait means that either
   the waker sees the sleeper or the sleeper sees the new event count. */
static void pt__tsignal(pt__tworld *w) {
    __atomic_fetch_add(&w->events, 1u, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&w->sleepers, __ATOMIC_SEQ_CST) > 0) {
        pthread_mutex_lock(&w->mu);
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
    }
}

/* A wait's rounds and its deadline: t0 is read at the first round, the
   clock again at every round past the pauses (a yield or a sleep costs more
   than the read). */
typedef struct pt__tclock {
    int spins;
    double t0, limit;
} pt__tclock;

static pt__tclock pt__tclock_of(const pt_comm *c) {
    pt__tclock k;
    k.spins = 0, k.t0 = 0.0, k.limit = pt__comm_limit(c);
    return k;
}

/* One round of waiting for an event after ev (read before the waiter last
   checked its condition): pause, then yield (with more ranks than cores the
   rank we wait for may need this core), then sleep (at most 100 ms, so the
   deadline is seen). 1 once the wait lasted more than k->limit seconds. */
static int pt__twait(pt__tworld *w, unsigned ev, pt__tclock *k) {
    struct timespec ts;
    if (k->spins == 0 || k->spins >= PT__SPIN) {
        double now = pt_time_now();
        if (k->spins == 0) k->t0 = now;
        else if (now - k->t0 > k->limit) return 1;
    }
    if (++k->spins < PT__YIELD) {
        if (k->spins < PT__SPIN) pt__cpu_relax();
        else sched_yield();
        return 0;
    }
    k->spins = PT__YIELD;
    timespec_get(&ts, TIME_UTC); /* the clock pthread_cond_timedwait reads by default */
    ts.tv_nsec += 100000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&w->mu);
    __atomic_fetch_add(&w->sleepers, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&w->events, __ATOMIC_SEQ_CST) == ev)
        if (pthread_cond_timedwait(&w->cv, &w->mu, &ts) == ETIMEDOUT) break;
    __atomic_fetch_sub(&w->sleepers, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&w->mu);
    return 0;
}

static int pt__tfailed_now(pt__tworld *w) { return __atomic_load_n(&w->failed, __ATOMIC_ACQUIRE); }

/* The error of an operation that saw the world failed. Units of started
   collectives begun before the failure end first (none begins after it), so
   the caller may free its buffers once this returns. */
static pt_status pt__tfailed(pt__tworld *w, int wrank) {
    w->saw_fail[wrank] = 1;
    while (__atomic_load_n(&w->working, __ATOMIC_SEQ_CST) > 0) sched_yield();
    return pt__fail(PT_ERR_COMM, "rank %d failed: %s", w->fail_rank, w->fail_msg);
}

/* World rank wrank failed: the first failure's message is kept. */
static void pt__tworld_fail(pt__tworld *w, int wrank, const char *msg) {
    if (!w->saw_fail[wrank]) w->origin[wrank] = 1;
    pthread_mutex_lock(&w->mu);
    if (!__atomic_load_n(&w->failed, __ATOMIC_RELAXED)) {
        w->fail_rank = wrank;
        snprintf(w->fail_msg, sizeof w->fail_msg, "%s", msg ? msg : "");
        __atomic_store_n(&w->failed, 1, __ATOMIC_SEQ_CST);
    }
    pthread_mutex_unlock(&w->mu);
    pt__tsignal(w);
    /* no rank starts a unit of a started collective from now on (pt__twork):
       once the units under way end, nobody touches this rank's buffers */
    while (__atomic_load_n(&w->working, __ATOMIC_SEQ_CST) > 0) sched_yield();
}

/* A wait of world rank g->wrank[me] that outlasted its deadline: the world
   fails with the message (every rank's operations end), which this rank
   returns. peer: the group rank waited for, or -1 for the whole group. */
static pt_status pt__texpired(pt__tgroup *g, int me, const char *what, int peer,
                              const pt__tclock *k) {
    char msg[sizeof pt__err], *p = msg, *end = msg + sizeof msg;
    int j, n;
    p += snprintf(p, (size_t)(end - p),
                  "%s on a group of %d ranks waited %.1f s, more than the comm timeout (%g s), "
                  "for world rank%s", what, g->size, pt_time_now() - k->t0, k->limit,
                  peer < 0 && g->size > 2 ? "s" : "");
    if (peer >= 0) snprintf(p, (size_t)(end - p), " %d", g->wrank[peer]);
    else
        for (j = 0, n = 0; j < g->size && p < end - 16; j++)
            if (j != me) p += snprintf(p, (size_t)(end - p), "%s %d", n++ ? "," : "", g->wrank[j]);
    pt__tworld_fail(g->world, g->wrank[me], msg);
    return pt__fail(PT_ERR_COMM, "%s", msg);
}

static void pt__trelease(pt__tgroup *g, uint32_t gen) {
    __atomic_store_n(&g->bar, (uint64_t)(uint32_t)(gen + 1u) << 32, __ATOMIC_RELEASE);
    pt__tsignal(g->world);
}

/* Takes back this rank's arrival at generation gen; 0 if too late (the
   barrier is complete or completing). */
static int pt__twithdraw(pt__tgroup *g, uint32_t gen) {
    uint64_t cur = __atomic_load_n(&g->bar, __ATOMIC_ACQUIRE);
    for (;;) {
        if ((uint32_t)(cur >> 32) != gen || (int)(uint32_t)cur >= g->size) return 0;
        if (__atomic_compare_exchange_n(&g->bar, &cur, cur - 1, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE))
            return 1;
    }
}

/* The entry barrier (see above): PT_OK when all arrived, PT_ERR_COMM after
   withdrawing because the world failed or a rank of g can never arrive. */
static pt_status pt__tbarrier_in(pt_comm *c, int op) {
    pt__tgroup *g = (pt__tgroup *)c->impl;
    pt__tworld *w = g->world;
    uint64_t old = __atomic_fetch_add(&g->bar, 1, __ATOMIC_ACQ_REL);
    uint32_t gen = (uint32_t)(old >> 32);
    pt__tclock k = pt__tclock_of(c);
    int rank = c->rank, j;
    if ((int)(uint32_t)old + 1 == g->size) {
        pt__trelease(g, gen);
        return PT_OK;
    }
    for (;;) {
        unsigned ev = __atomic_load_n(&w->events, __ATOMIC_SEQ_CST);
        int gone = -1;
        if ((uint32_t)(__atomic_load_n(&g->bar, __ATOMIC_ACQUIRE) >> 32) != gen) return PT_OK;
        if (pt__tfailed_now(w)) gone = g->size;
        else
            for (j = 0; j < g->size && gone < 0; j++)
                if (__atomic_load_n(&w->done[g->wrank[j]], __ATOMIC_ACQUIRE)) gone = j;
        if (gone >= 0 && pt__twithdraw(g, gen)) {
            if (gone == g->size) return pt__tfailed(w, g->wrank[rank]);
            return pt__fail(PT_ERR_COMM,
                            "rank %d returned while rank %d waits for it in a collective "
                            "(the ranks' calls do not match)",
                            g->wrank[gone], g->wrank[rank]);
        }
        if (pt__twait(w, ev, &k) && pt__twithdraw(g, gen))
            return pt__texpired(g, rank, pt__op_names[op], -1, &k);
    }
}

/* The exit barrier: waits for all, whatever happened meanwhile. */
static void pt__tbarrier_out(pt__tgroup *g) {
    uint64_t old = __atomic_fetch_add(&g->bar, 1, __ATOMIC_ACQ_REL);
    uint32_t gen = (uint32_t)(old >> 32);
    pt__tclock k = {0, 0.0, 1e300}; /* every rank here passed the entry: it comes */
    if ((int)(uint32_t)old + 1 == g->size) {
        pt__trelease(g, gen);
        return;
    }
    for (;;) {
        unsigned ev = __atomic_load_n(&g->world->events, __ATOMIC_SEQ_CST);
        if ((uint32_t)(__atomic_load_n(&g->bar, __ATOMIC_ACQUIRE) >> 32) != gen) return;
        pt__twait(g->world, ev, &k);
    }
}

/* Publishes this rank's call, passes the entry barrier and checks that every
   rank made the same call. PT_ERR_COMM: return at once. Any other error: the
   calls differ, every rank saw the same posts and fails alike, and the caller
   still passes the exit barrier. */
static pt_status pt__tenter(pt_comm *c, int op, int arg, int key, size_t n, const float *buf) {
    pt__tgroup *g = (pt__tgroup *)c->impl;
    pt__tpost *p = &g->post[c->rank];
    const pt__tpost *a = &g->post[0];
    pt_status st;
    int j;
    if (pt__tfailed_now(g->world)) return pt__tfailed(g->world, g->wrank[c->rank]);
    p->op = op, p->arg = arg, p->key = key, p->n = n, p->buf = (float *)buf;
    if ((st = pt__tbarrier_in(c, op)) != PT_OK) return st;
    for (j = 1; j < g->size; j++) {
        const pt__tpost *b = &g->post[j];
        if (b->op != a->op)
            return pt__fail(PT_ERR_INVALID_ARG, "%s: rank 0 called %s but rank %d called %s",
                            pt__op_names[op], pt__op_names[a->op], j, pt__op_names[b->op]);
        if (op == PT__OP_SPLIT) continue; /* colors and keys differ by design */
        if (b->n != a->n)
            return pt__fail(PT_ERR_SHAPE, "%s: rank 0 passed n=%zu but rank %d passed n=%zu",
                            pt__op_names[op], a->n, j, b->n);
        if (b->arg != a->arg)
            return pt__fail(PT_ERR_INVALID_ARG, "%s: rank 0 passed %s %d but rank %d passed %d",
                            pt__op_names[op], op == PT__OP_BROADCAST ? "root" : "op", a->arg, j,
                            b->arg);
    }
    return PT_OK;
}

/* acc = acc op x (AVG sums; the caller divides once at the end) */
static void pt__tcombine(float *acc, const float *x, size_t m, int op) {
    size_t i;
    if (op == PT_REDUCE_MAX)
        for (i = 0; i < m; i++) acc[i] = x[i] > acc[i] ? x[i] : acc[i];
    else
        for (i = 0; i < m; i++) acc[i] += x[i];
}

static void pt__tdivide(float *acc, size_t m, int size) {
    size_t i;
    for (i = 0; i < m; i++) acc[i] /= (float)size;
}

/* Rank r's slice [lo, hi) of n: about n/size floats, in multiples of 16 (whole
   64-byte lines for aligned buffers, so ranks never write the same line). */
static void pt__tslice(size_t n, int size, int r, size_t *lo, size_t *hi) {
    size_t per = ((n + (size_t)size - 1) / (size_t)size + 15) & ~(size_t)15;
    *lo = per * (size_t)r < n ? per * (size_t)r : n;
    *hi = n - *lo > per ? *lo + per : n;
}

/* Rank r reduces slice r over all ranks in rank order 0..size-1 and writes
   the result into every rank's slice r: each float is computed once, by one
   rank, the same way every run, so all ranks hold identical bits. */
static pt_status pt__tall_reduce(pt_comm *c, float *buf, size_t n, pt_reduce_op op) {
    pt__tgroup *g = (pt__tgroup *)c->impl;
    size_t lo, hi, b, m;
    float tmp[PT__BLOCK];
    int j;
    pt_status st = pt__tenter(c, PT__OP_ALL_REDUCE, (int)op, 0, n, buf);
    if (st == PT_ERR_COMM) return st;
    if (st == PT_OK) {
        pt__tslice(n, g->size, c->rank, &lo, &hi);
        for (b = lo; b < hi; b += m) {
            m = hi - b < PT__BLOCK ? hi - b : PT__BLOCK;
            memcpy(tmp, g->post[0].buf + b, m * sizeof(float));
            for (j = 1; j < g->size; j++) pt__tcombine(tmp, g->post[j].buf + b, m, op);
            if (op == PT_REDUCE_AVG) pt__tdivide(tmp, m, g->size);
            for (j = 0; j < g->size; j++) memcpy(g->post[j].buf + b, tmp, m * sizeof(float));
        }
    }
    pt__tbarrier_out(g);
    return st;
}

/* Rank r reduces block r of every rank's in, in rank order, into its out. */
static pt_status pt__treduce_scatter(pt_comm *c, const float *in, float *out, size_t n,
                                     pt_reduce_op op) {
    pt__tgroup *g = (pt__tgroup *)c->impl;
    size_t base = (size_t)c->rank * n;
    int j;
    pt_status st = pt__tenter(c, PT__OP_REDUCE_SCATTER, (int)op, 0, n, in);
    if (st == PT_ERR_COMM) return st;
    if (st == PT_OK && n > 0) {
        memcpy(out, g->post[0].buf + base, n * sizeof(float));
        for (j = 1; j < g->size; j++) pt__tcombine(out, g->post[j].buf + base, n, op);
        if (op == PT_REDUCE_AVG) pt__tdivide(out, n, g->size);
    }
    pt__tbarrier_out(g);
    return st;
}

/* Every rank copies every rank's in into its own out (its own block is
   already there when it runs in place). */
static pt_status pt__tall_gather(pt_comm *c, const float *in, float *out, size_t n) {
    pt__tgroup *g = (pt__tgroup *)c->impl;
    int j;
    pt_status st = pt__tenter(c, PT__OP_ALL_GATHER, 0, 0, n, in);
    if (st == PT_ERR_COMM) return st;
    if (st == PT_OK && n > 0)
        for (j = 0; j < g->size; j++)
            if (g->post[j].buf != out + (size_t)j * n)
                memcpy(out + (size_t)j * n, g->post[j].buf, n * sizeof(float));
    pt__tbarrier_out(g);
    return st;
}

static pt_status pt__tbroadcast(pt_comm *c, float *buf, size_t n, int root) {
    pt__tgroup *g = (pt__tgroup *)c->impl;
    pt_status st = pt__tenter(c, PT__OP_BROADCAST, root, 0, n, buf);
    if (st == PT_ERR_COMM) return st;
    if (st == PT_OK && n > 0 && c->rank != root)
        memcpy(buf, g->post[root].buf, n * sizeof(float));
    pt__tbarrier_out(g);
    return st;
}

static pt_status pt__tbarrier(pt_comm *c) {
    pt_status st = pt__tenter(c, PT__OP_BARRIER, 0, 0, 0, NULL);
    if (st == PT_ERR_COMM) return st;
    pt__tbarrier_out((pt__tgroup *)c->impl);
    return st;
}

/* A message with room for n floats (NULL: out of memory). */
static pt__tmsg *pt__tmsg_new(size_t n) {
    pt__tmsg *m = (pt__tmsg *)pt__malloc(sizeof *m, NULL);
    if (!m) return NULL;
    m->cap = n, m->next = NULL;
    m->data = n ? (float *)pt__malloc(n * sizeof(float), NULL) : NULL;
    if (n && !m->data) {
        pt__free(m, NULL);
        return NULL;
    }
    return m;
}

/* Copies the message into a spare of dst's inbox (the smallest that fits, so
   a step that sends the same sizes every time reuses the same spares and
   allocates nothing) and queues it. With no spare left the inbox's messages
   double (at least 2 made): how many are in flight at once depends on
   timing, and doubling gets past a step's most in its first steps. */
static pt_status pt__tsend(pt_comm *c, const float *buf, size_t n, int dst, int tag) {
    pt__tgroup *g = (pt__tgroup *)c->impl;
    pt__tbox *box = &g->box[dst];
    pt__tmsg *m, **best = NULL, **pp;
    int more = 0;
    if (pt__tfailed_now(g->world)) return pt__tfailed(g->world, g->wrank[c->rank]);
    pthread_mutex_lock(&box->mu);
    for (pp = &box->spare; *pp; pp = &(*pp)->next)
        if (!best || pt__better_fit((*pp)->cap, (*best)->cap, n)) best = pp;
    m = best ? *best : NULL;
    if (m) *best = m->next;
    else more = box->count > 2 ? box->count : 2, box->count += more;
    pthread_mutex_unlock(&box->mu);
    if (!m) {
        if (!(m = pt__tmsg_new(n)))
            return pt__fail(PT_ERR_OOM, "send: out of memory for a message of %zu floats", n);
        for (; more > 1; more--) {
            pt__tmsg *sp = pt__tmsg_new(n);
            if (!sp) break; /* (spares are an optimisation) */
            pthread_mutex_lock(&box->mu);
            sp->next = box->spare, box->spare = sp;
            pthread_mutex_unlock(&box->mu);
        }
    }
    if (m->cap < n) {
        pt__free(m->data, NULL);
        m->data = (float *)pt__malloc(n * sizeof(float), NULL);
        m->cap = m->data ? n : 0;
        if (!m->data) {
            pt__free(m, NULL);
            return pt__fail(PT_ERR_OOM, "send: out of memory for a message of %zu floats", n);
        }
    }
    m->src = c->rank, m->tag = tag, m->n = n, m->next = NULL;
    if (n) memcpy(m->data, buf, n * sizeof(float));
    pthread_mutex_lock(&box->mu);
    if (box->tail) box->tail->next = m;
    else box->head = m;
    box->tail = m;
    pthread_mutex_unlock(&box->mu);
    pt__tsignal(g->world);
    return PT_OK;
}

/* Takes the oldest message from src with tag out of rank me's inbox into buf:
   1 when taken, 0 when there is none, -1 when it has another size than n (it
   stays queued; *have is its size). peek: only looks (1: one of size n is there). */
static int pt__ttake(pt__tgroup *g, int me, float *buf, size_t n, int src, int tag, size_t *have,
                     int peek) {
    pt__tbox *box = &g->box[me];
    pt__tmsg *m, *prev = NULL;
    pthread_mutex_lock(&box->mu);
    for (m = box->head; m && (m->src != src || m->tag != tag); m = m->next) prev = m;
    if (m && m->n != n) {
        *have = m->n;
        pthread_mutex_unlock(&box->mu);
        return -1;
    }
    if (m && peek) {
        pthread_mutex_unlock(&box->mu);
        return 1;
    }
    if (m) {
        if (prev) prev->next = m->next;
        else box->head = m->next;
        if (box->tail == m) box->tail = prev;
    }
    pthread_mutex_unlock(&box->mu);
    if (!m) return 0;
    if (n) memcpy(buf, m->data, n * sizeof(float));
    pthread_mutex_lock(&box->mu);
    m->next = box->spare;
    box->spare = m;
    pthread_mutex_unlock(&box->mu);
    return 1;
}

static pt_status pt__trecv_size(int src, int tag, size_t have, size_t n) {
    return pt__fail(PT_ERR_SHAPE,
                    "recv: the message from rank %d with tag %d has %zu floats, the buffer %zu "
                    "(the message stays queued)",
                    src, tag, have, n);
}

static pt_status pt__trecv_gone(pt__tgroup *g, int me, int src, int tag) {
    return pt__fail(PT_ERR_COMM,
                    "recv: rank %d returned without sending the message (tag %d) rank %d waits for",
                    g->wrank[src], tag, g->wrank[me]);
}

/* Started receives of rank me take their messages in the order they were
   started: a receive matches only when no older one from the same source
   with the same tag is still waiting. Matched ones are done and leave the
   list. */
static void pt__trecv_match(pt__tgroup *g, int me) {
    pt_comm_req **pp = &g->recvq[me], *r, *q;
    size_t have;
    while ((r = *pp) != NULL) {
        for (q = g->recvq[me]; q != r && (q->arg != r->arg || q->tag != r->tag);
             q = (pt_comm_req *)q->link) {
        }
        if (q == r && pt__ttake(g, me, r->out, r->n, r->arg, r->tag, &have, 0) == 1) {
            r->done = 1, r->status = PT_OK;
            *pp = (pt_comm_req *)r->link;
            continue;
        }
        pp = (pt_comm_req **)&r->link;
    }
}

static void pt__trecv_unlink(pt__tgroup *g, int me, pt_comm_req *r) {
    pt_comm_req **pp = &g->recvq[me];
    while (*pp && *pp != r) pp = (pt_comm_req **)&(*pp)->link;
    if (*pp) *pp = (pt_comm_req *)r->link;
}

/* Takes the oldest message from src with tag (after the started receives
   took theirs). Fails if the world failed or src returned from fn (its
   messages are all queued by then) without sending it. */
static pt_status pt__trecv(pt_comm *c, float *buf, size_t n, int src, int tag) {
    pt__tgroup *g = (pt__tgroup *)c->impl;
    pt__tworld *w = g->world;
    pt__tclock k = pt__tclock_of(c);
    int got;
    size_t have = 0;
    if (pt__tfailed_now(w)) return pt__tfailed(w, g->wrank[c->rank]);
    for (;;) {
        unsigned ev = __atomic_load_n(&w->events, __ATOMIC_SEQ_CST);
        int src_done = __atomic_load_n(&w->done[g->wrank[src]], __ATOMIC_ACQUIRE);
        pt_comm_req *q;
        pt__trecv_match(g, c->rank);
        for (q = g->recvq[c->rank]; q && (q->arg != src || q->tag != tag); q = (pt_comm_req *)q->link) {
        }
        got = q ? 0 : pt__ttake(g, c->rank, buf, n, src, tag, &have, 0); /* older ones first */
        if (got == 1) return PT_OK;
        if (got < 0) return pt__trecv_size(src, tag, have, n);
        if (pt__tfailed_now(w)) return pt__tfailed(w, g->wrank[c->rank]);
        if (src_done) return pt__trecv_gone(g, c->rank, src, tag);
        if (pt__twait(w, ev, &k)) return pt__texpired(g, c->rank, "recv", src, &k);
    }
}

/* A started receive: matched (by pt__trecv_match) in any rank's test or wait. */
static pt_status pt__trecv_progress(pt_comm *c, pt_comm_req *r, int block, int *done) {
    pt__tgroup *g = (pt__tgroup *)c->impl;
    pt__tworld *w = g->world;
    pt_comm_req *q;
    pt__tclock k = pt__tclock_of(c);
    int me = c->rank;
    size_t have = 0;
    *done = 0;
    for (;;) {
        unsigned ev = __atomic_load_n(&w->events, __ATOMIC_SEQ_CST);
        int src_done = __atomic_load_n(&w->done[g->wrank[r->arg]], __ATOMIC_ACQUIRE);
        pt__trecv_match(g, me);
        if (r->done) {
            *done = 1;
            return r->status;
        }
        for (q = g->recvq[me]; q != r && (q->arg != r->arg || q->tag != r->tag);
             q = (pt_comm_req *)q->link) {
        }
        if (q == r && pt__ttake(g, me, NULL, r->n, r->arg, r->tag, &have, 1) < 0) {
            pt__trecv_unlink(g, me, r); /* it is r's message, and of another size */
            return pt__trecv_size(r->arg, r->tag, have, r->n);
        }
        if (pt__tfailed_now(w)) {
            pt__trecv_unlink(g, me, r);
            return pt__tfailed(w, g->wrank[me]);
        }
        if (src_done) {
            pt__trecv_unlink(g, me, r);
            return pt__trecv_gone(g, me, r->arg, r->tag);
        }
        if (!block) return PT_OK;
        if (pt__twait(w, ev, &k)) {
            pt__trecv_unlink(g, me, r);
            return pt__texpired(g, me, "recv (started)", r->arg, &k);
        }
    }
}

/* ---- started collectives under threads ----------------------------------
   Collective number k of a group (ranks start them in the same order) takes
   slot k % RING of the group's ring: each rank writes its post there and
   counts itself in `arrived`. Once all arrived, the work is cut into units
   (PT__UNIT floats of one output block; for all_gather one source copied to
   one destination), and any rank of the group inside test or wait claims the
   next unit with an atomic counter and computes it exactly as the blocking
   operation does (the same order over ranks, so the same bits), then counts
   it in `done` (release: whoever reads done == units with acquire sees every
   unit's writes). So what makes progress is the ranks' own test and wait
   calls: the first rank to wait does all units not yet claimed, and the
   others find the work done. Every rank that saw the collective finish
   counts itself in `released`; the last resets the slot and advances `uses`
   (release), which a rank starting the slot's next collective waits for.
   Failure: a rank enters a unit only after counting itself in the world's
   `working` and seeing no failure (both seq_cst), and pt__tworld_fail, like
   every operation that returns the failure (pt__tfailed), waits for
   `working` to drop to zero after the flag is up: once pt_comm_fail or an
   operation failing with PT_ERR_COMM returned, no unit touches the rank's
   buffers. So a rank that fails on its own must call pt_comm_fail before it
   frees buffers of started collectives. A collective that did not finish
   before the failure fails for every rank waiting for it. */

static int pt__top_of(pt_comm_op op) {
    return op == PT_COMM_OP_ALL_REDUCE       ? PT__OP_ALL_REDUCE
           : op == PT_COMM_OP_REDUCE_SCATTER ? PT__OP_REDUCE_SCATTER
                                             : PT__OP_ALL_GATHER;
}

static size_t pt__tunits(int op, size_t n, int size) {
    size_t per = (n + PT__UNIT - 1) / PT__UNIT;
    if (op == PT__OP_ALL_REDUCE) return per;
    if (op == PT__OP_REDUCE_SCATTER) return per * (size_t)size;
    return n ? (size_t)size * (size_t)size : 0;
}

/* Unit u of the collective the posts p describe (see pt__tall_reduce and
   friends for the per-element order, which this repeats). */
static void pt__tunit(const pt__tpost *p, int size, size_t u) {
    int op = p[0].op, rop = p[0].arg, j;
    size_t n = p[0].n, per = (n + PT__UNIT - 1) / PT__UNIT, lo, hi, b, m;
    float tmp[PT__BLOCK];
    if (op == PT__OP_ALL_REDUCE) {
        lo = u * PT__UNIT, hi = n - lo > PT__UNIT ? lo + PT__UNIT : n;
        for (b = lo; b < hi; b += m) {
            m = hi - b < PT__BLOCK ? hi - b : PT__BLOCK;
            memcpy(tmp, p[0].buf + b, m * sizeof(float));
            for (j = 1; j < size; j++) pt__tcombine(tmp, p[j].buf + b, m, rop);
            if (rop == PT_REDUCE_AVG) pt__tdivide(tmp, m, size);
            for (j = 0; j < size; j++) memcpy(p[j].buf + b, tmp, m * sizeof(float));
        }
    } else if (op == PT__OP_REDUCE_SCATTER) {
        int d = (int)(u / per);
        size_t base = (size_t)d * n;
        float *out = p[d].out;
        lo = u % per * PT__UNIT, hi = n - lo > PT__UNIT ? lo + PT__UNIT : n;
        memcpy(out + lo, p[0].buf + base + lo, (hi - lo) * sizeof(float));
        for (j = 1; j < size; j++) pt__tcombine(out + lo, p[j].buf + base + lo, hi - lo, rop);
        if (rop == PT_REDUCE_AVG) pt__tdivide(out + lo, hi - lo, size);
    } else {
        int d = (int)(u / (size_t)size), k = (int)(u % (size_t)size);
        float *dst = p[d].out + (size_t)k * n;
        if (p[k].buf != dst) memcpy(dst, p[k].buf, n * sizeof(float));
    }
}

static void pt__tslot_release(pt__tgroup *g, pt__tslot *s) {
    if (__atomic_add_fetch(&s->released, 1, __ATOMIC_ACQ_REL) == g->size) {
        __atomic_store_n(&s->arrived, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&s->next, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&s->done, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&s->released, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&s->uses, __atomic_load_n(&s->uses, __ATOMIC_RELAXED) + 1,
                         __ATOMIC_RELEASE);
        pt__tsignal(g->world);
    }
}

static pt_status pt__tstart(pt_comm *c, pt_comm_req *r) {
    pt__tgroup *g = (pt__tgroup *)c->impl;
    pt__tworld *w = g->world;
    pt__tclock k = pt__tclock_of(c);
    int me = c->rank;
    uint64_t seq;
    pt__tslot *s;
    pt__tpost *p;
    pt_status st;
    if (r->op == PT_COMM_OP_SEND) { /* buffered: done once copied */
        if ((st = pt__tsend(c, r->in, r->n, r->arg, r->tag)) == PT_OK) r->done = 1;
        return st;
    }
    if (pt__tfailed_now(w)) return pt__tfailed(w, g->wrank[me]);
    if (r->op == PT_COMM_OP_RECV) {
        pt_comm_req **pp = &g->recvq[me];
        while (*pp) pp = (pt_comm_req **)&(*pp)->link;
        r->link = NULL;
        *pp = r;
        return PT_OK;
    }
    if (g->pending[me] >= PT__RING)
        return pt__fail(PT_ERR_UNSUPPORTED,
                        "%s_start: rank %d has %d started collectives unfinished on this "
                        "communicator, the most there may be (wait for one first)",
                        pt__op_names[pt__top_of(r->op)], g->wrank[me], PT__RING);
    seq = __atomic_load_n(&g->started[me], __ATOMIC_RELAXED);
    s = &g->ring[seq % PT__RING];
    for (;;) { /* the slot's previous collective must be finished by every rank */
        unsigned ev = __atomic_load_n(&w->events, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&s->uses, __ATOMIC_ACQUIRE) == seq / PT__RING) break;
        if (pt__tfailed_now(w)) return pt__tfailed(w, g->wrank[me]);
        if (pt__twait(w, ev, &k))
            return pt__texpired(g, me, "a started collective (its slot still busy)", -1, &k);
    }
    p = &g->rpost[seq % PT__RING * (size_t)g->size + (size_t)me];
    p->op = pt__top_of(r->op), p->arg = r->arg, p->key = 0, p->n = r->n;
    p->buf = r->op == PT_COMM_OP_ALL_REDUCE ? r->out : (float *)r->in;
    p->out = r->out;
    r->seq = seq;
    g->pending[me]++;
    __atomic_store_n(&g->started[me], seq + 1, __ATOMIC_RELEASE);
    __atomic_fetch_add(&s->arrived, 1, __ATOMIC_ACQ_REL);
    pt__tsignal(w);
    return PT_OK;
}

/* A started collective waited for past the deadline: names the ranks that
   have not started it (all of them when every one did: units unfinished). */
static pt_status pt__tstalled(pt__tgroup *g, int me, const pt_comm_req *r, const pt__tclock *k) {
    char what[64];
    int j, late = -1, n = 0;
    for (j = 0; j < g->size; j++)
        if (__atomic_load_n(&g->started[j], __ATOMIC_ACQUIRE) <= r->seq) late = j, n++;
    snprintf(what, sizeof what, "%s (started)", pt__op_names[pt__top_of(r->op)]);
    return pt__texpired(g, me, what, n == 1 ? late : -1, k);
}

/* Test (block = 0) or wait (block = 1) for a started collective, doing its
   unclaimed units meanwhile. */
static pt_status pt__tprogress(pt_comm *c, pt_comm_req *r, int block, int *done) {
    pt__tgroup *g = (pt__tgroup *)c->impl;
    pt__tworld *w = g->world;
    pt__tslot *s = &g->ring[r->seq % PT__RING];
    const pt__tpost *p = &g->rpost[r->seq % PT__RING * (size_t)g->size];
    pt__tclock k = pt__tclock_of(c);
    int me = c->rank, j;
    *done = 0;
    for (;;) {
        unsigned ev = __atomic_load_n(&w->events, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&s->arrived, __ATOMIC_ACQUIRE) == g->size) {
            size_t units, u;
            for (j = 1; j < g->size; j++)
                if (p[j].op != p[0].op || p[j].n != p[0].n || p[j].arg != p[0].arg) break;
            if (j < g->size) { /* every rank sees the same posts and fails alike */
                const char *name = pt__op_names[p[me].op];
                pt_status st =
                    p[j].op != p[0].op
                        ? pt__fail(PT_ERR_INVALID_ARG,
                                   "%s_start: rank 0 started %s but rank %d started %s", name,
                                   pt__op_names[p[0].op], j, pt__op_names[p[j].op])
                    : p[j].n != p[0].n
                        ? pt__fail(PT_ERR_SHAPE,
                                   "%s_start: rank 0 passed n=%zu but rank %d passed n=%zu", name,
                                   p[0].n, j, p[j].n)
                        : pt__fail(PT_ERR_INVALID_ARG,
                                   "%s_start: rank 0 passed op %d but rank %d passed %d", name,
                                   p[0].arg, j, p[j].arg);
                g->pending[me]--;
                pt__tslot_release(g, s);
                *done = 1;
                return st;
            }
            units = pt__tunits(p[0].op, p[0].n, g->size);
            while (__atomic_load_n(&s->next, __ATOMIC_RELAXED) < units) {
                __atomic_fetch_add(&w->working, 1, __ATOMIC_SEQ_CST);
                if (__atomic_load_n(&w->failed, __ATOMIC_SEQ_CST)) {
                    __atomic_fetch_sub(&w->working, 1, __ATOMIC_SEQ_CST);
                    break;
                }
                u = __atomic_fetch_add(&s->next, 1, __ATOMIC_RELAXED);
                if (u < units) {
                    pt__tunit(p, g->size, u);
                    if (__atomic_add_fetch(&s->done, 1, __ATOMIC_ACQ_REL) == units)
                        pt__tsignal(w);
                }
                __atomic_fetch_sub(&w->working, 1, __ATOMIC_SEQ_CST);
            }
            if (__atomic_load_n(&s->done, __ATOMIC_ACQUIRE) == units) {
                g->pending[me]--;
                pt__tslot_release(g, s);
                *done = 1;
                return PT_OK;
            }
        }
        if (pt__tfailed_now(w)) {
            *done = 1;
            return pt__tfailed(w, g->wrank[me]);
        }
        for (j = 0; j < g->size; j++)
            if (__atomic_load_n(&w->done[g->wrank[j]], __ATOMIC_ACQUIRE) &&
                __atomic_load_n(&g->started[j], __ATOMIC_ACQUIRE) <= r->seq) {
                *done = 1;
                return pt__fail(PT_ERR_COMM,
                                "rank %d returned without starting the collective rank %d waits "
                                "for (the ranks' calls do not match)",
                                g->wrank[j], g->wrank[me]);
            }
        if (!block) return PT_OK;
        if (pt__twait(w, ev, &k)) {
            *done = 1;
            return pt__tstalled(g, me, r, &k);
        }
    }
}

static pt_status pt__tdrive(pt_comm *c, pt_comm_req *r, int block, int *done) {
    if (r->op == PT_COMM_OP_RECV) return pt__trecv_progress(c, r, block, done);
    return pt__tprogress(c, r, block, done);
}

static pt_status pt__ttest(pt_comm *c, pt_comm_req *r, int *done) {
    return pt__tdrive(c, r, 0, done);
}

static pt_status pt__twait_req(pt_comm *c, pt_comm_req *r) {
    int done = 0;
    return pt__tdrive(c, r, 1, &done);
}

static void pt__tmsgs_free(pt__tmsg *m) {
    while (m) {
        pt__tmsg *next = m->next;
        pt__free(m->data, NULL);
        pt__free(m, NULL);
        m = next;
    }
}

static void pt__tgroup_destroy(pt__tgroup *g) {
    int i;
    if (!g) return;
    if (g->box)
        for (i = 0; i < g->size; i++) {
            pt__tmsgs_free(g->box[i].head);
            pt__tmsgs_free(g->box[i].spare);
            pthread_mutex_destroy(&g->box[i].mu);
        }
    pt__free(g->box, NULL);
    pt__free(g->ring, NULL);
    pt__free(g->rpost, NULL);
    pt__free(g->started, NULL);
    pt__free(g->pending, NULL);
    pt__free(g->recvq, NULL);
    pt__free(g->made, NULL);
    pt__free(g->post, NULL);
    pt__free(g->wrank, NULL);
    pt__free(g, NULL);
}

/* A group of size ranks, with refs = size, on the world's list. */
static pt__tgroup *pt__tgroup_new(pt__tworld *w, int size) {
    pt__tgroup *g = (pt__tgroup *)pt__malloc(sizeof *g, NULL);
    int i;
    if (!g) return NULL;
    memset(g, 0, sizeof *g);
    g->world = w;
    g->size = g->refs = size;
    g->wrank = (int *)pt__malloc((size_t)size * sizeof(int), NULL);
    g->post = (pt__tpost *)pt__malloc((size_t)size * sizeof(pt__tpost), NULL);
    g->made = (pt__tgroup **)pt__malloc((size_t)size * sizeof(pt__tgroup *), NULL);
    g->box = (pt__tbox *)pt__malloc((size_t)size * sizeof(pt__tbox), NULL);
    g->ring = (pt__tslot *)pt__malloc(PT__RING * sizeof(pt__tslot), NULL);
    g->rpost = (pt__tpost *)pt__malloc((size_t)PT__RING * (size_t)size * sizeof(pt__tpost), NULL);
    g->started = (uint64_t *)pt__malloc((size_t)size * sizeof(uint64_t), NULL);
    g->pending = (int *)pt__malloc((size_t)size * sizeof(int), NULL);
    g->recvq = (pt_comm_req **)pt__malloc((size_t)size * sizeof(pt_comm_req *), NULL);
    if (!g->wrank || !g->post || !g->made || !g->box || !g->ring || !g->rpost || !g->started ||
        !g->pending || !g->recvq) {
        pt__free(g->box, NULL);
        g->box = NULL;
        pt__tgroup_destroy(g);
        return NULL;
    }
    memset(g->post, 0, (size_t)size * sizeof(pt__tpost));
    memset(g->made, 0, (size_t)size * sizeof(pt__tgroup *));
    memset(g->ring, 0, PT__RING * sizeof(pt__tslot));
    memset(g->rpost, 0, (size_t)PT__RING * (size_t)size * sizeof(pt__tpost));
    memset(g->started, 0, (size_t)size * sizeof(uint64_t));
    memset(g->pending, 0, (size_t)size * sizeof(int));
    memset(g->recvq, 0, (size_t)size * sizeof(pt_comm_req *));
    for (i = 0; i < size; i++) {
        g->box[i].head = g->box[i].tail = g->box[i].spare = NULL, g->box[i].count = 0;
        pthread_mutex_init(&g->box[i].mu, NULL);
    }
    pthread_mutex_lock(&w->mu);
    g->next = w->groups;
    w->groups = g;
    pthread_mutex_unlock(&w->mu);
    return g;
}

static void pt__tfree(pt_comm *c) {
    pt__tgroup *g = (pt__tgroup *)c->impl, **pp;
    pt__tworld *w;
    if (!g || __atomic_sub_fetch(&g->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
    w = g->world;
    pthread_mutex_lock(&w->mu);
    for (pp = &w->groups; *pp && *pp != g; pp = &(*pp)->next) {
    }
    if (*pp) *pp = g->next;
    pthread_mutex_unlock(&w->mu);
    pt__tgroup_destroy(g);
}

/* (key, rank) order: does rank i of the parent come before rank j? */
static int pt__tbefore(const pt__tpost *p, int i, int j) {
    return p[i].key < p[j].key || (p[i].key == p[j].key && i < j);
}

/* Split: after the entry barrier every rank sees all colors and keys. The
   lowest rank of each color makes the group, ranks ordered by (key, rank),
   and posts it in made[]; after the exit barrier its members pick it up.
   (made[] is written again only after the next split's entry barrier, which
   no rank reaches before it has read it.) */
static pt_status pt__tsplit(pt_comm *c, int color, int key, pt_comm *out) {
    pt__tgroup *g = (pt__tgroup *)c->impl, *ng;
    const pt__tpost *p = g->post;
    int j, leader = -1, size = 0, rank = 0;
    pt_status st = pt__tenter(c, PT__OP_SPLIT, color, key, 0, NULL);
    if (st == PT_ERR_COMM) return st;
    if (st == PT_OK) {
        for (j = 0; j < g->size; j++)
            if (p[j].arg == color) {
                if (leader < 0) leader = j;
                rank += pt__tbefore(p, j, c->rank);
                size++;
            }
        if (leader == c->rank) {
            ng = pt__tgroup_new(g->world, size);
            if (ng)
                for (j = 0; j < g->size; j++)
                    if (p[j].arg == color) {
                        int k, pos = 0;
                        for (k = 0; k < g->size; k++) pos += p[k].arg == color && pt__tbefore(p, k, j);
                        ng->wrank[pos] = g->wrank[j];
                    }
            g->made[c->rank] = ng;
        }
    }
    pt__tbarrier_out(g);
    if (st != PT_OK) return st;
    ng = g->made[leader];
    if (!ng) return pt__fail(PT_ERR_OOM, "split: out of memory for a group of %d ranks", size);
    out->rank = rank;
    out->size = size;
    out->kind = PT_COMM_THREADS;
    out->ops = c->ops; /* the threads table (defined below) */
    out->impl = ng;
    return PT_OK;
}

static void pt__tabort(pt_comm *c, const char *msg) {
    pt__tgroup *g = (pt__tgroup *)c->impl;
    pt__tworld_fail(g->world, g->wrank[c->rank], msg);
}

static const pt_comm_ops pt__thread_ops = {
    pt__tall_reduce, pt__treduce_scatter, pt__tall_gather, pt__tbroadcast, pt__tsend,
    pt__trecv,       pt__tbarrier,        pt__tsplit,      pt__tabort,     pt__tfree,
    pt__tstart,      pt__ttest,           pt__twait_req};

typedef struct pt__trank { /* what pt_comm_threads_run keeps per rank */
    pt__tworld *w;
    int rank, nthreads;
    pt_status (*fn)(pt_comm *world, void *arg);
    void *arg;
    pt_comm comm;
    pt_status status;
    char msg[sizeof pt__err];
    pthread_t thread;
} pt__trank;

static void *pt__trank_main(void *p) {
    pt__trank *r = (pt__trank *)p;
#ifdef _OPENMP
    omp_set_num_threads(r->nthreads); /* per thread; OpenBLAS's count was set globally */
#endif
    pt_clear_error();
    r->status = r->fn(&r->comm, r->arg);
    snprintf(r->msg, sizeof r->msg, "%s", r->status == PT_OK ? "" : pt_last_error());
    if (r->status != PT_OK) pt__tworld_fail(r->w, r->rank, r->msg[0] ? r->msg : pt_status_str(r->status));
    pt_comm_free(&r->comm); /* a no-op if fn freed it */
    __atomic_store_n(&r->w->done[r->rank], 1, __ATOMIC_RELEASE);
    pt__tsignal(r->w);
    return NULL;
}

static void pt__tworld_destroy(pt__tworld *w) {
    if (!w) return;
    while (w->groups) {
        pt__tgroup *g = w->groups;
        w->groups = g->next;
        pt__tgroup_destroy(g);
    }
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    pt__free(w->done, NULL);
    pt__free(w->saw_fail, NULL);
    pt__free(w->origin, NULL);
    pt__free(w, NULL);
}

/* Starts every rank on a new thread, joins them all, then reports the lowest
   rank that originated a failure (failed before it saw another's failure);
   ranks that only saw PT_ERR_COMM are reported only if no rank originated. */
PTRAINDEF pt_status pt_comm_threads_run(int nranks, pt_status (*fn)(pt_comm *world, void *arg),
                                        void *arg) {
    pt__tworld *w;
    pt__tgroup *g;
    pt__trank *ranks;
    int i, started = 0, rc = 0, best = -1, threads, prev_omp = pt_get_threads();
    pt_status st = PT_OK;
#ifdef PT__HAVE_OPENBLAS
    int prev_blas = openblas_get_num_threads();
#endif
    if (nranks < 1 || nranks > PT__MAX_THREADS)
        return pt__fail(PT_ERR_INVALID_ARG, "threads_run: nranks=%d must be in [1, %d]", nranks,
                        PT__MAX_THREADS);
    if (!fn) return pt__fail(PT_ERR_INVALID_ARG, "threads_run: fn is NULL");
    w = (pt__tworld *)pt__malloc(sizeof *w, NULL);
    ranks = (pt__trank *)pt__malloc((size_t)nranks * sizeof *ranks, NULL);
    if (!w || !ranks) {
        pt__free(w, NULL);
        pt__free(ranks, NULL);
        return pt__fail(PT_ERR_OOM, "threads_run: out of memory for %d ranks", nranks);
    }
    memset(w, 0, sizeof *w);
    memset(ranks, 0, (size_t)nranks * sizeof *ranks);
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->n = nranks;
    w->done = (int *)pt__malloc((size_t)nranks * sizeof(int), NULL);
    w->saw_fail = (unsigned char *)pt__malloc((size_t)nranks, NULL);
    w->origin = (unsigned char *)pt__malloc((size_t)nranks, NULL);
    g = w->done && w->saw_fail && w->origin ? pt__tgroup_new(w, nranks) : NULL;
    if (!g) {
        pt__tworld_destroy(w);
        pt__free(ranks, NULL);
        return pt__fail(PT_ERR_OOM, "threads_run: out of memory for %d ranks", nranks);
    }
    memset(w->done, 0, (size_t)nranks * sizeof(int));
    memset(w->saw_fail, 0, (size_t)nranks);
    memset(w->origin, 0, (size_t)nranks);
    threads = pt_num_cores() / nranks;
    if (threads < 1) threads = 1;
    pt_set_threads(threads); /* OpenBLAS's count is global: set it once, here */
    for (i = 0; i < nranks; i++) {
        pt__trank *r = &ranks[i];
        g->wrank[i] = i;
        r->w = w, r->rank = i, r->nthreads = threads, r->fn = fn, r->arg = arg;
        r->comm.rank = i;
        r->comm.size = nranks;
        r->comm.kind = PT_COMM_THREADS;
        r->comm.ops = &pt__thread_ops;
        r->comm.impl = g;
    }
    for (started = 0; started < nranks; started++)
        if ((rc = pthread_create(&ranks[started].thread, NULL, pt__trank_main, &ranks[started])))
            break;
    if (started < nranks) { /* the started ranks must not wait for the others */
        for (i = started; i < nranks; i++) __atomic_store_n(&w->done[i], 1, __ATOMIC_RELEASE);
        pt__tworld_fail(w, started, "could not start its thread");
    }
    for (i = 0; i < started; i++) pthread_join(ranks[i].thread, NULL);
#ifdef PT__HAVE_OPENBLAS
    openblas_set_num_threads(prev_blas);
#endif
#ifdef _OPENMP
    omp_set_num_threads(prev_omp);
#endif
    (void)prev_omp;
    if (started < nranks) {
        st = pt__fail(PT_ERR_OOM, "threads_run: cannot start the thread of rank %d: %s", started,
                      strerror(rc));
    } else {
        for (i = 0; i < nranks && best < 0; i++)
            if (w->origin[i]) best = i;
        for (i = 0; i < nranks && best < 0; i++)
            if (ranks[i].status != PT_OK) best = i;
        if (best >= 0) {
            const char *msg = ranks[best].msg;
            st = ranks[best].status;
            if (st == PT_OK) { /* it called pt_comm_fail but returned PT_OK */
                st = PT_ERR_COMM;
                msg = w->fail_rank == best ? w->fail_msg : "reported a failure";
            }
            pt__fail(st, "rank %d: %s", best, msg);
        }
    }
    pt__tworld_destroy(w);
    pt__free(ranks, NULL);
    return st;
}

#else /* no pthreads */

PTRAINDEF pt_status pt_comm_threads_run(int nranks, pt_status (*fn)(pt_comm *world, void *arg),
                                        void *arg) {
    (void)nranks, (void)fn, (void)arg;
    return pt__fail(PT_ERR_UNSUPPORTED, "threads_run: this build has no POSIX threads");
}

#endif /* PT__HAVE_PTHREADS */

/* ---- the MPI backend ------------------------------------------------------
   Each collective is one MPI call per chunk of at most 2^30 floats (MPI
   counts are int); reduce_scatter, all_gather, send and recv reject counts
   above INT_MAX instead, as chunking them would need strided types. AVG is
   SUM divided by size, as in the threads backend.
   send copies buf into a slot of a pool owned by the communicator and starts
   MPI_Isend from it; each send first reaps the slots whose requests finished
   (MPI_Test) and reuses the smallest free slot that fits, so steady state
   allocates nothing. (MPI_Bsend would need a process-wide buffer, and
   detaching it to grow it blocks until the messages in it are received.)
   pt_comm_free waits for the pending sends. */
#ifdef PTRAIN_MPI

#define PT__MPI_CHUNK ((size_t)1 << 30)

typedef struct pt__mslot {
    float *data;
    size_t cap;
    MPI_Request req; /* MPI_REQUEST_NULL when the slot is free */
} pt__mslot;

#define PT__HOST 64 /* bytes of a host's name in the timeout messages */

typedef struct pt__mpi {
    MPI_Comm comm;
    pt__mslot *slot;
    int nslot;
    int *wrank;            /* [size] group rank -> world rank */
    char (*host)[PT__HOST]; /* [size] each group rank's host */
    MPI_Comm probe;        /* a duplicate of the world's, for pt__mpi_probe (the world's owns it) */
    int owns_probe;
} pt__mpi;

static pt_status pt__mpi_err(int rc, const char *what) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "MPI error %d", rc);
    return pt__fail(PT_ERR_COMM, "%s: %s", what, s);
}

static pt_status pt__mpi_too_big(const char *what, size_t n) {
    return pt__fail(PT_ERR_UNSUPPORTED, "%s: n=%zu floats is more than MPI's INT_MAX count", what, n);
}

static MPI_Comm pt__mpi_comm(const pt_comm *c) { return ((const pt__mpi *)c->impl)->comm; }
static MPI_Op pt__mpi_op(pt_reduce_op op) { return op == PT_REDUCE_MAX ? MPI_MAX : MPI_SUM; }

static void pt__mpi_divide(float *x, size_t n, int size) {
    size_t i;
    for (i = 0; i < n; i++) x[i] /= (float)size;
}

/* This process's host for the messages: PT_HOST, else "name (address)"
   with the first non-loopback IPv4 address (hosts in network namespaces
   share one name). */
static void pt__mpi_host_name(char *out, size_t cap) {
    const char *env = getenv("PT_HOST");
    char name[MPI_MAX_PROCESSOR_NAME + 1] = "?", addr[INET_ADDRSTRLEN] = "";
    struct ifaddrs *ifs = NULL, *i;
    int len = 0;
    if (env && *env) {
        snprintf(out, cap, "%s", env);
        return;
    }
    /* MPI's name for the host (gethostname's in Open MPI), no feature macro needed */
    if (MPI_Get_processor_name(name, &len) != MPI_SUCCESS || len <= 0) snprintf(name, sizeof name, "?");
    name[len > 0 && len < (int)sizeof name ? len : (int)sizeof name - 1] = 0;
    if (getifaddrs(&ifs) == 0) {
        for (i = ifs; i && !addr[0]; i = i->ifa_next)
            if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET) {
                const struct in_addr *a = &((struct sockaddr_in *)(void *)i->ifa_addr)->sin_addr;
                if (ntohl(a->s_addr) >> 24 != 127) inet_ntop(AF_INET, a, addr, sizeof addr);
            }
        freeifaddrs(ifs);
    }
    if (addr[0]) snprintf(out, cap, "%s (%.20s)", addr, name);
    else snprintf(out, cap, "%s", name);
}

/* m's rank -> world rank and host tables: from the parent's (split), else
   swapped by every rank (the world). */
static pt_status pt__mpi_tables(pt__mpi *m, int size, const pt__mpi *parent) {
    int j, rc;
    m->wrank = (int *)pt__malloc((size_t)size * sizeof(int), NULL);
    m->host = (char (*)[PT__HOST])pt__malloc((size_t)size * PT__HOST, NULL);
    if (!m->wrank || !m->host) return pt__fail(PT_ERR_OOM, "MPI: out of memory for a communicator");
    if (!parent) {
        char me[PT__HOST];
        memset(me, 0, sizeof me);
        pt__mpi_host_name(me, sizeof me);
        for (j = 0; j < size; j++) m->wrank[j] = j;
        rc = MPI_Allgather(me, PT__HOST, MPI_CHAR, m->host, PT__HOST, MPI_CHAR, m->comm);
        if (rc == MPI_SUCCESS && (rc = MPI_Comm_dup(m->comm, &m->probe)) == MPI_SUCCESS) {
            MPI_Comm_set_errhandler(m->probe, MPI_ERRORS_RETURN);
            m->owns_probe = 1;
        }
        return rc == MPI_SUCCESS ? PT_OK : pt__mpi_err(rc, "MPI_Allgather (host names)");
    } else {
        MPI_Group a, b;
        int *mine = (int *)pt__malloc((size_t)size * 2 * sizeof(int), NULL);
        if (!mine) return pt__fail(PT_ERR_OOM, "MPI: out of memory for a communicator");
        for (j = 0; j < size; j++) mine[j] = j;
        m->probe = parent->probe;
        MPI_Comm_group(m->comm, &a);
        MPI_Comm_group(parent->comm, &b);
        MPI_Group_translate_ranks(a, size, mine, b, mine + size);
        MPI_Group_free(&a);
        MPI_Group_free(&b);
        for (j = 0; j < size; j++) {
            m->wrank[j] = parent->wrank[mine[size + j]];
            memcpy(m->host[j], parent->host[mine[size + j]], PT__HOST);
        }
        pt__free(mine, NULL);
    }
    return PT_OK;
}

static const char *pt__mpi_host_of(const pt_comm *c, int rank) {
    return ((const pt__mpi *)c->impl)->host[rank];
}

static void pt__mpi_free_impl(pt__mpi *m) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (m->owns_probe && !fin) MPI_Comm_free(&m->probe);
    pt__free(m->wrank, NULL);
    pt__free(m->host, NULL);
    pt__free(m, NULL);
}

/* Fills out with comm (owned from now on), errors returned, not fatal.
   parent: the communicator split (NULL for the world). */
static pt_status pt__mpi_make(pt_comm *out, MPI_Comm comm, const pt_comm_ops *ops,
                              const pt_comm *parent) {
    pt__mpi *m = (pt__mpi *)pt__malloc(sizeof *m, NULL);
    pt_status st;
    if (!m) {
        MPI_Comm_free(&comm);
        return pt__fail(PT_ERR_OOM, "MPI: out of memory for a communicator");
    }
    memset(m, 0, sizeof *m);
    m->comm = comm;
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    memset(out, 0, sizeof *out);
    MPI_Comm_rank(comm, &out->rank);
    MPI_Comm_size(comm, &out->size);
    if ((st = pt__mpi_tables(m, out->size, parent ? (const pt__mpi *)parent->impl : NULL)) !=
        PT_OK) {
        MPI_Comm_free(&comm);
        pt__mpi_free_impl(m);
        memset(out, 0, sizeof *out);
        return st;
    }
    out->kind = PT_COMM_MPI;
    out->ops = ops;
    out->impl = m;
    return PT_OK;
}

/* The process's way out once the job cannot go on: MPI_Abort, and should
   that hang (mpirun cannot reach a host) or return, a timer that ends the
   process 5 s later; every rank's own deadline brings it here. */
static void pt__mpi_alarm(int sig) {
    (void)sig;
    _exit(1);
}

static void pt__mpi_end(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = pt__mpi_alarm;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, NULL);
    alarm(5);
    fflush(stdout);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    _exit(1);
}

/* Which ranks of c are cut off: a rank whose wait expired sends a word to
   each other rank of its group (on the world's probe communicator) and
   listens PT__PROBE seconds; the ranks whose waits expire too answer so,
   the ones on a lost host or stuck elsewhere do not. Prints the silent ones;
   the job ends next, so nothing is freed or cancelled. */
#define PT__PROBE 5.0
static void pt__mpi_probe(pt_comm *c) {
    pt__mpi *m = (pt__mpi *)c->impl;
    MPI_Request *q = (MPI_Request *)pt__malloc((size_t)c->size * 2 * sizeof *q, NULL);
    int *got = (int *)pt__malloc((size_t)c->size * sizeof(int), NULL), j, left, done, n = 0;
    int word = 1;
    double t0 = pt_time_now();
    char msg[2048], *p = msg, *end = msg + sizeof msg;
    msg[0] = 0;
    if (!q || !got || m->probe == MPI_COMM_NULL) return;
    for (j = 0, left = 0; j < c->size; j++) {
        q[j] = q[c->size + j] = MPI_REQUEST_NULL;
        got[j] = 0;
        if (j == c->rank) continue;
        MPI_Irecv(&got[j], 1, MPI_INT, m->wrank[j], 7, m->probe, &q[j]);
        MPI_Isend(&word, 1, MPI_INT, m->wrank[j], 7, m->probe, &q[c->size + j]);
        left++;
    }
    while (left > 0 && pt_time_now() - t0 < PT__PROBE)
        for (j = 0; j < c->size; j++)
            if (q[j] != MPI_REQUEST_NULL && MPI_Test(&q[j], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS &&
                done)
                left--;
    for (j = 0; j < c->size && p < end - 96; j++)
        if (j != c->rank && !got[j])
            p += snprintf(p, (size_t)(end - p), "%s rank %d on host %s", n++ ? "," : "",
                          m->wrank[j], m->host[j]);
    fprintf(stderr, "rank %d (host %s): probed the group for %.0f s: %s%s\n", m->wrank[c->rank],
            m->host[c->rank], PT__PROBE, n ? "no answer from" : "every rank answered",
            n ? msg : "");
}

/* A wait that outlasted the deadline: says what it waited for, probes the
   group, then ends the process (pt__mpi_end). peer: the group rank (send,
   recv), or -1 for the group's other ranks. */
static void pt__mpi_expired(pt_comm *c, const char *what, int peer, double waited) {
    pt__mpi *m = (pt__mpi *)c->impl;
    int j;
    fflush(stdout);
    fprintf(stderr,
            "rank %d (host %s): %s on a group of %d ranks waited %.1f s, more than the comm "
            "timeout (%g s, --comm-timeout), for ",
            m->wrank[c->rank], m->host[c->rank], what, c->size, waited, pt__comm_limit(c));
    for (j = 0; j < c->size; j++)
        if (j == peer || (peer < 0 && j != c->rank))
            fprintf(stderr, "%srank %d on host %s", j == peer || j == (c->rank == 0) ? "" : ", ",
                    m->wrank[j], m->host[j]);
    fprintf(stderr, "; ending the job\n");
    pt__mpi_probe(c);
    pt__mpi_end();
}

/* MPI_Wait with the deadline: MPI_Test until q finishes (Open MPI's wait
   polls the same way) or the wait outlasts pt__comm_limit(c). The clock is
   read once per test. */
static int pt__mpi_poll(pt_comm *c, MPI_Request *q, MPI_Status *stat, const char *what, int peer) {
    double t0 = pt_time_now(), limit = pt__comm_limit(c), now;
    int done = 0, rc;
    for (;;) {
        rc = MPI_Test(q, &done, stat);
        if (rc != MPI_SUCCESS || done) return rc;
        if ((now = pt_time_now()) - t0 > limit) pt__mpi_expired(c, what, peer, now - t0);
    }
}

/* The reductions run through the non-blocking calls (libnbc in Open MPI)
   whether started or not: MPI_Allreduce and MPI_Iallreduce may pick
   different algorithms, and so add in different orders. */
static pt_status pt__mpi_wait1(pt_comm *c, MPI_Request *q, const char *what) {
    int rc = pt__mpi_poll(c, q, MPI_STATUS_IGNORE, what, -1);
    return rc == MPI_SUCCESS ? PT_OK : pt__mpi_err(rc, what);
}

static pt_status pt__mpi_all_reduce(pt_comm *c, float *buf, size_t n, pt_reduce_op op) {
    size_t off, k;
    int rc;
    MPI_Request q;
    pt_status st;
    for (off = 0; off < n; off += k) {
        k = n - off < PT__MPI_CHUNK ? n - off : PT__MPI_CHUNK;
        rc = MPI_Iallreduce(MPI_IN_PLACE, buf + off, (int)k, MPI_FLOAT, pt__mpi_op(op),
                            pt__mpi_comm(c), &q);
        if (rc != MPI_SUCCESS) return pt__mpi_err(rc, "MPI_Iallreduce");
        if ((st = pt__mpi_wait1(c, &q, "MPI_Iallreduce")) != PT_OK) return st;
    }
    if (op == PT_REDUCE_AVG) pt__mpi_divide(buf, n, c->size);
    return PT_OK;
}

static pt_status pt__mpi_reduce_scatter(pt_comm *c, const float *in, float *out, size_t n,
                                        pt_reduce_op op) {
    int rc;
    MPI_Request q;
    pt_status st;
    if (n > INT_MAX) return pt__mpi_too_big("reduce_scatter", n);
    rc = MPI_Ireduce_scatter_block(in, out, (int)n, MPI_FLOAT, pt__mpi_op(op), pt__mpi_comm(c), &q);
    if (rc != MPI_SUCCESS) return pt__mpi_err(rc, "MPI_Ireduce_scatter_block");
    if ((st = pt__mpi_wait1(c, &q, "MPI_Ireduce_scatter_block")) != PT_OK) return st;
    if (op == PT_REDUCE_AVG) pt__mpi_divide(out, n, c->size);
    return PT_OK;
}

/* Blocking collectives without arithmetic run through the non-blocking
   calls too, so their waits have the deadline. */
static pt_status pt__mpi_all_gather(pt_comm *c, const float *in, float *out, size_t n) {
    MPI_Request q;
    int rc;
    if (n > INT_MAX) return pt__mpi_too_big("all_gather", n);
    if (in == out + (size_t)c->rank * n)
        rc = MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out, (int)n, MPI_FLOAT,
                            pt__mpi_comm(c), &q);
    else
        rc = MPI_Iallgather(in, (int)n, MPI_FLOAT, out, (int)n, MPI_FLOAT, pt__mpi_comm(c), &q);
    if (rc != MPI_SUCCESS) return pt__mpi_err(rc, "MPI_Iallgather");
    return pt__mpi_wait1(c, &q, "MPI_Iallgather");
}

static pt_status pt__mpi_broadcast(pt_comm *c, float *buf, size_t n, int root) {
    size_t off, k;
    MPI_Request q;
    pt_status st;
    int rc;
    for (off = 0; off < n; off += k) {
        k = n - off < PT__MPI_CHUNK ? n - off : PT__MPI_CHUNK;
        rc = MPI_Ibcast(buf + off, (int)k, MPI_FLOAT, root, pt__mpi_comm(c), &q);
        if (rc != MPI_SUCCESS) return pt__mpi_err(rc, "MPI_Ibcast");
        if ((st = pt__mpi_wait1(c, &q, "MPI_Ibcast")) != PT_OK) return st;
    }
    return PT_OK;
}

static pt_status pt__mpi_send(pt_comm *c, const float *buf, size_t n, int dst, int tag) {
    pt__mpi *m = (pt__mpi *)c->impl;
    pt__mslot *s = NULL;
    int i, rc, done;
    if (n > INT_MAX) return pt__mpi_too_big("send", n);
    for (i = 0; i < m->nslot; i++) { /* reap finished sends, pick the best free slot */
        pt__mslot *t = &m->slot[i];
        if (t->req != MPI_REQUEST_NULL) {
            if ((rc = MPI_Test(&t->req, &done, MPI_STATUS_IGNORE)) != MPI_SUCCESS)
                return pt__mpi_err(rc, "MPI_Test");
            if (!done) continue;
        }
        if (!s || pt__better_fit(t->cap, s->cap, n)) s = t;
    }
    if (!s) { /* all busy: double the pool */
        int ncap = m->nslot ? 2 * m->nslot : 4;
        pt__mslot *ns = (pt__mslot *)pt__malloc((size_t)ncap * sizeof *ns, NULL);
        if (!ns) return pt__fail(PT_ERR_OOM, "send: out of memory for the send pool");
        if (m->nslot) memcpy(ns, m->slot, (size_t)m->nslot * sizeof *ns);
        for (i = m->nslot; i < ncap; i++) ns[i].data = NULL, ns[i].cap = 0, ns[i].req = MPI_REQUEST_NULL;
        pt__free(m->slot, NULL);
        m->slot = ns;
        s = &m->slot[m->nslot];
        m->nslot = ncap;
    }
    if (s->cap < n) {
        pt__free(s->data, NULL);
        s->data = (float *)pt__malloc(n * sizeof(float), NULL);
        s->cap = s->data ? n : 0;
        if (!s->data) return pt__fail(PT_ERR_OOM, "send: out of memory for %zu floats", n);
    }
    if (n) memcpy(s->data, buf, n * sizeof(float));
    rc = MPI_Isend(s->data, (int)n, MPI_FLOAT, dst, tag, m->comm, &s->req);
    return rc == MPI_SUCCESS ? PT_OK : pt__mpi_err(rc, "MPI_Isend");
}

/* Probes first, so a message of the wrong size stays queued (as under threads). */
static pt_status pt__mpi_recv(pt_comm *c, float *buf, size_t n, int src, int tag) {
    MPI_Status status;
    int rc, count = 0, there = 0;
    double t0 = pt_time_now(), now;
    if (n > INT_MAX) return pt__mpi_too_big("recv", n);
    for (;;) { /* MPI_Probe with the deadline */
        if ((rc = MPI_Iprobe(src, tag, pt__mpi_comm(c), &there, &status)) != MPI_SUCCESS)
            return pt__mpi_err(rc, "MPI_Iprobe");
        if (there) break;
        if ((now = pt_time_now()) - t0 > pt__comm_limit(c)) pt__mpi_expired(c, "recv", src, now - t0);
    }
    MPI_Get_count(&status, MPI_FLOAT, &count);
    if (count == MPI_UNDEFINED || (size_t)count != n)
        return pt__fail(PT_ERR_SHAPE,
                        "recv: the message from rank %d with tag %d has %d floats, the buffer %zu "
                        "(the message stays queued)",
                        src, tag, count, n);
    rc = MPI_Recv(buf, (int)n, MPI_FLOAT, src, tag, pt__mpi_comm(c), MPI_STATUS_IGNORE);
    return rc == MPI_SUCCESS ? PT_OK : pt__mpi_err(rc, "MPI_Recv");
}

static pt_status pt__mpi_barrier(pt_comm *c) {
    MPI_Request q;
    int rc = MPI_Ibarrier(pt__mpi_comm(c), &q);
    if (rc != MPI_SUCCESS) return pt__mpi_err(rc, "MPI_Ibarrier");
    return pt__mpi_wait1(c, &q, "MPI_Ibarrier");
}

static pt_status pt__mpi_split(pt_comm *c, int color, int key, pt_comm *out) {
    MPI_Comm nc;
    int rc = MPI_Comm_split(pt__mpi_comm(c), color, key, &nc);
    if (rc != MPI_SUCCESS) return pt__mpi_err(rc, "MPI_Comm_split");
    return pt__mpi_make(out, nc, c->ops, c); /* the MPI table (defined below) */
}

static void pt__mpi_abort(pt_comm *c, const char *msg) {
    int wr = -1;
    (void)c;
    MPI_Comm_rank(MPI_COMM_WORLD, &wr);
    fprintf(stderr, "rank %d: %s\n", wr, msg ? msg : "failed");
    pt__mpi_end();
}

static void pt__mpi_free(pt_comm *c) {
    pt__mpi *m = (pt__mpi *)c->impl;
    int i, fin = 0;
    if (!m) return;
    MPI_Finalized(&fin);
    for (i = 0; i < m->nslot; i++) {
        if (!fin && m->slot[i].req != MPI_REQUEST_NULL)
            pt__mpi_poll(c, &m->slot[i].req, MPI_STATUS_IGNORE, "send (buffered, at free)", -1);
        pt__free(m->slot[i].data, NULL);
    }
    pt__free(m->slot, NULL);
    if (!fin) MPI_Comm_free(&m->comm);
    pt__mpi_free_impl(m);
}

/* Started operations: one MPI_I* call each (counts above INT_MAX are
   refused), its MPI_Request kept in the request's state; AVG divides when
   the request finishes; a receive checks the count it got. Sends go from
   the caller's buffer (no copy): it must stay untouched until the wait. */
typedef char pt__mpi_req_fits[sizeof(MPI_Request) <= sizeof(((pt_comm_req *)0)->state) ? 1 : -1];

static pt_status pt__mpi_start(pt_comm *c, pt_comm_req *r) {
    MPI_Comm comm = pt__mpi_comm(c);
    MPI_Request q = MPI_REQUEST_NULL;
    const char *what;
    int rc, n = (int)r->n;
    (void)sizeof(pt__mpi_req_fits);
    if (r->n > INT_MAX) return pt__mpi_too_big("start", r->n);
    switch (r->op) {
    case PT_COMM_OP_ALL_REDUCE:
        what = "MPI_Iallreduce";
        rc = MPI_Iallreduce(MPI_IN_PLACE, r->out, n, MPI_FLOAT, pt__mpi_op((pt_reduce_op)r->arg),
                            comm, &q);
        break;
    case PT_COMM_OP_REDUCE_SCATTER:
        what = "MPI_Ireduce_scatter_block";
        rc = MPI_Ireduce_scatter_block(r->in, r->out, n, MPI_FLOAT,
                                       pt__mpi_op((pt_reduce_op)r->arg), comm, &q);
        break;
    case PT_COMM_OP_ALL_GATHER:
        what = "MPI_Iallgather";
        if (r->in == r->out + (size_t)c->rank * r->n)
            rc = MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, r->out, n, MPI_FLOAT, comm, &q);
        else
            rc = MPI_Iallgather(r->in, n, MPI_FLOAT, r->out, n, MPI_FLOAT, comm, &q);
        break;
    case PT_COMM_OP_SEND:
        what = "MPI_Isend";
        rc = MPI_Isend(r->in, n, MPI_FLOAT, r->arg, r->tag, comm, &q);
        break;
    default:
        what = "MPI_Irecv";
        rc = MPI_Irecv(r->out, n, MPI_FLOAT, r->arg, r->tag, comm, &q);
        break;
    }
    if (rc != MPI_SUCCESS) return pt__mpi_err(rc, what);
    memcpy(r->state, &q, sizeof q);
    return PT_OK;
}

/* After MPI finished r with status stat (rc from MPI_Test or MPI_Wait). */
static pt_status pt__mpi_finish(pt_comm *c, pt_comm_req *r, int rc, MPI_Status *stat) {
    int count = 0;
    if (r->op == PT_COMM_OP_RECV) {
        if (rc == MPI_ERR_IN_STATUS) rc = stat->MPI_ERROR;
        if (rc == MPI_ERR_TRUNCATE ||
            (rc == MPI_SUCCESS && (MPI_Get_count(stat, MPI_FLOAT, &count), (size_t)count != r->n)))
            return pt__fail(PT_ERR_SHAPE,
                            "recv: the message from rank %d with tag %d has %s%d floats, the "
                            "buffer %zu (the message is consumed)",
                            r->arg, r->tag, rc == MPI_SUCCESS ? "" : "more than ",
                            rc == MPI_SUCCESS ? count : (int)r->n, r->n);
    }
    if (rc != MPI_SUCCESS) return pt__mpi_err(rc, "wait");
    if (r->arg == PT_REDUCE_AVG && r->op == PT_COMM_OP_ALL_REDUCE)
        pt__mpi_divide(r->out, r->n, c->size);
    if (r->arg == PT_REDUCE_AVG && r->op == PT_COMM_OP_REDUCE_SCATTER)
        pt__mpi_divide(r->out, r->n, c->size);
    return PT_OK;
}

static pt_status pt__mpi_test(pt_comm *c, pt_comm_req *r, int *done) {
    MPI_Request q;
    MPI_Status stat;
    int rc;
    memcpy(&q, r->state, sizeof q);
    rc = MPI_Test(&q, done, &stat);
    memcpy(r->state, &q, sizeof q);
    if (rc != MPI_SUCCESS) *done = 1;
    return *done ? pt__mpi_finish(c, r, rc, &stat) : PT_OK;
}

static const char *pt__mpi_op_name(pt_comm_op op) {
    static const char *const names[] = {"?",    "all_reduce (started)", "reduce_scatter (started)",
                                        "all_gather (started)", "send (started)",
                                        "recv (started)"};
    return (unsigned)op < sizeof names / sizeof *names ? names[op] : "?";
}

static pt_status pt__mpi_wait(pt_comm *c, pt_comm_req *r) {
    MPI_Request q;
    MPI_Status stat;
    int rc;
    memcpy(&q, r->state, sizeof q);
    rc = pt__mpi_poll(c, &q, &stat, pt__mpi_op_name(r->op),
                      r->op == PT_COMM_OP_SEND || r->op == PT_COMM_OP_RECV ? r->arg : -1);
    memcpy(r->state, &q, sizeof q);
    return pt__mpi_finish(c, r, rc, &stat);
}

static const pt_comm_ops pt__mpi_ops = {
    pt__mpi_all_reduce, pt__mpi_reduce_scatter, pt__mpi_all_gather, pt__mpi_broadcast,
    pt__mpi_send,       pt__mpi_recv,           pt__mpi_barrier,    pt__mpi_split,
    pt__mpi_abort,      pt__mpi_free,           pt__mpi_start,      pt__mpi_test,
    pt__mpi_wait};

/* MPI_THREAD_FUNNELED: OpenMP threads compute, only this thread calls MPI. */
PTRAINDEF pt_status pt_comm_mpi_init(pt_comm *world, int *argc, char ***argv) {
    int inited = 0, provided = 0, rc;
    MPI_Comm dup;
    if (!world) return pt__fail(PT_ERR_INVALID_ARG, "mpi_init: world is NULL");
    memset(world, 0, sizeof *world);
    MPI_Initialized(&inited);
    if (!inited && (rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided)) != MPI_SUCCESS)
        return pt__fail(PT_ERR_COMM, "MPI_Init_thread failed (error %d)", rc);
    (void)provided;
    if ((rc = MPI_Comm_dup(MPI_COMM_WORLD, &dup)) != MPI_SUCCESS)
        return pt__mpi_err(rc, "MPI_Comm_dup");
    return pt__mpi_make(world, dup, &pt__mpi_ops, NULL);
}

PTRAINDEF void pt_comm_mpi_finalize(void) {
    int inited = 0, fin = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    if (inited && !fin) MPI_Finalize();
}

#endif /* PTRAIN_MPI */

/* ---- the tp x dp x pp grid ------------------------------------------------
   r = t + tp*(d + dp*p). A tp group fixes (d, p): color d + dp*p, ordered by
   t; a dp group fixes (t, p): color t + tp*p, ordered by d; a pp group fixes
   (t, d): color t + tp*d, ordered by p. */
PTRAINDEF pt_status pt_grid_init(pt_grid *g, pt_comm *world, int tp, int dp, int pp) {
    return pt_grid_init_cp(g, world, tp, 1, dp, pp);
}

/* With cp: a tp group fixes (c, d, p), a cp group (t, d, p), a dp group
   (t, c, p), a pp group (t, c, d), the dp x cp group (t, p). A color is the
   rank with the group's own coordinate dropped. */
PTRAINDEF pt_status pt_grid_init_cp(pt_grid *g, pt_comm *world, int tp, int cp, int dp, int pp) {
    int bad = 0, r, t, c, d, p, tc;
    pt_status st;
    if (!g) return pt__fail(PT_ERR_INVALID_ARG, "grid_init: g is NULL");
    memset(g, 0, sizeof *g);
    if ((st = pt__comm_ok(world, "grid_init"))) return st;
    pt_clear_error();
    if (tp < 1) pt__append_error(&bad, "tp=%d must be >= 1", tp);
    if (cp < 1) pt__append_error(&bad, "cp=%d must be >= 1", cp);
    if (dp < 1) pt__append_error(&bad, "dp=%d must be >= 1", dp);
    if (pp < 1) pt__append_error(&bad, "pp=%d must be >= 1", pp);
    if (!bad && ((int64_t)tp * cp * dp > world->size ||
                 (int64_t)tp * cp * dp * pp != world->size)) {
        if (cp > 1)
            pt__append_error(&bad, "world size %d != tp %d x cp %d x dp %d x pp %d", world->size,
                             tp, cp, dp, pp);
        else
            pt__append_error(&bad, "world size %d != tp %d x dp %d x pp %d", world->size, tp, dp,
                             pp);
    }
    if (bad) return PT_ERR_CONFIG;
    r = world->rank, tc = tp * cp;
    t = r % tp, c = r / tp % cp, d = r / tc % dp, p = r / (tc * dp);
    g->tp = tp, g->dp = dp, g->pp = pp, g->cp = cp;
    g->tp_rank = t, g->dp_rank = d, g->pp_rank = p, g->cp_rank = c;
    g->world = world;
    if ((st = pt_comm_split(world, c + cp * (d + dp * p), t, &g->tp_comm)) != PT_OK ||
        (st = pt_comm_split(world, t + tp * (c + cp * p), d, &g->dp_comm)) != PT_OK ||
        (st = pt_comm_split(world, t + tp * (c + cp * d), p, &g->pp_comm)) != PT_OK ||
        (cp > 1 && (st = pt_comm_split(world, t + tp * (d + dp * p), c, &g->cp_comm)) != PT_OK) ||
        (cp > 1 && (st = pt_comm_split(world, t + tp * p, d * cp + c, &g->dpcp_comm)) != PT_OK)) {
        pt_grid_free(g);
        return st;
    }
    return PT_OK;
}

PTRAINDEF void pt_grid_free(pt_grid *g) {
    if (!g) return;
    pt_comm_free(&g->tp_comm);
    pt_comm_free(&g->dp_comm);
    pt_comm_free(&g->pp_comm);
    if (g->cp > 1) {
        pt_comm_free(&g->cp_comm);
        pt_comm_free(&g->dpcp_comm);
    }
    memset(g, 0, sizeof *g);
}

/* ======================================================================== */
/* >>model (implementation)                                                  */
/* ======================================================================== */

/* LLaMA presets: RMSNorm, rotary, SwiGLU, no biases, untied head (kv: key/value
   heads, ffn: SwiGLU hidden size, theta: rotary base; eps the RMSNorm's). */
static const struct {
    const char *name;
    int V, block, L, NH, C, kv, ffn;
    float theta, eps;
} pt__presets[] = {
    {"tiny", 256, 128, 2, 4, 64, 0, 0, 0.0f, 1e-5f},
    {"mini", 256, 256, 4, 4, 128, 0, 0, 0.0f, 1e-5f},
    {"small", 8192, 512, 4, 4, 256, 0, 0, 0.0f, 1e-5f},
    {"gpt2-124m", 50257, 1024, 12, 12, 768, 0, 0, 0.0f, 1e-5f},
    {"gpt2-350m", 50257, 1024, 24, 16, 1024, 0, 0, 0.0f, 1e-5f},
    {"gpt2-774m", 50257, 1024, 36, 20, 1280, 0, 0, 0.0f, 1e-5f},
    {"gpt2-1558m", 50257, 1024, 48, 25, 1600, 0, 0, 0.0f, 1e-5f},
    {"llama-tiny", 256, 128, 2, 4, 64, 2, 176, 10000.0f, 1e-5f},
    {"llama-124m", 32000, 1024, 12, 12, 768, 4, 2048, 10000.0f, 1e-5f}, /* GPT-2 124M's scale */
    {"llama2-7b", 32000, 4096, 32, 32, 4096, 32, 11008, 10000.0f, 1e-5f},
    {"llama2-13b", 32000, 4096, 40, 40, 5120, 40, 13824, 10000.0f, 1e-5f},
    {"llama3-8b", 128256, 8192, 32, 32, 4096, 8, 14336, 500000.0f, 1e-5f},
    {"llama2-70b", 32000, 4096, 80, 64, 8192, 8, 28672, 10000.0f, 1e-5f},
};
#define PT__NPRESETS ((int)(sizeof pt__presets / sizeof pt__presets[0]))

PTRAINDEF const char *pt_gpt_preset_names(void) {
    return "tiny, mini, small, gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1558m, llama-tiny, "
           "llama-124m, llama2-7b, llama2-13b, llama3-8b, llama2-70b";
}

PTRAINDEF pt_status pt_gpt_config_preset(const char *name, pt_gpt_config *out) {
    int i;
    for (i = 0; i < PT__NPRESETS; i++)
        if (name && strcmp(name, pt__presets[i].name) == 0) {
            memset(out, 0, sizeof *out);
            out->vocab_size = pt__presets[i].V;
            out->block_size = pt__presets[i].block;
            out->n_layer = pt__presets[i].L;
            out->n_head = pt__presets[i].NH;
            out->n_embd = pt__presets[i].C;
            out->ln_eps = pt__presets[i].eps;
            if (pt__presets[i].kv) {
                out->arch = PT_ARCH_LLAMA;
                out->norm = PT_NORM_RMS;
                out->pos = PT_POS_ROPE;
                out->mlp = PT_MLP_SWIGLU;
                out->n_kv_head = pt__presets[i].kv;
                out->ffn_hidden = pt__presets[i].ffn;
                out->no_bias = 1;
                out->untied_head = 1;
                out->rope_theta = pt__presets[i].theta;
            }
            return PT_OK;
        }
    return pt__fail(PT_ERR_CONFIG, "unknown model preset '%s' (known: %s)", name ? name : "(null)",
                    pt_gpt_preset_names());
}

/* The choices' defaults (zero means GPT-2's). */
static int pt__kv_heads(const pt_gpt_config *c) { return c->n_kv_head > 0 ? c->n_kv_head : c->n_head; }
static int pt__ffn(const pt_gpt_config *c) { return c->ffn_hidden > 0 ? c->ffn_hidden : 4 * c->n_embd; }
static float pt__rope_theta(const pt_gpt_config *c) {
    return c->rope_theta > 0.0f ? c->rope_theta : 10000.0f;
}

PTRAINDEF pt_status pt_gpt_config_validate(const pt_gpt_config *c) {
    int bad = 0;
    pt_clear_error();
#define PT__RANGE(field, lo, hi)                                                          \
    if (c->field < (lo) || c->field > (hi))                                               \
        pt__append_error(&bad, #field "=%d must be in [%d, %d]", c->field, (int)(lo), (int)(hi));
    PT__RANGE(vocab_size, 1, 1 << 24)
    PT__RANGE(block_size, 1, 1 << 20)
    PT__RANGE(n_layer, 1, 4096)
    PT__RANGE(n_head, 1, 1 << 16)
    PT__RANGE(n_embd, 1, 1 << 17)
#undef PT__RANGE
    if (c->n_head > 0 && c->n_embd > 0 && c->n_embd % c->n_head != 0)
        pt__append_error(&bad, "n_embd=%d is not divisible by n_head=%d", c->n_embd, c->n_head);
    if (!(c->ln_eps >= 0.0f && c->ln_eps < 1.0f))
        pt__append_error(&bad, "ln_eps=%g must be in [0, 1) (0 means 1e-5)", (double)c->ln_eps);
    if ((int)c->arch < 0 || c->arch > PT_ARCH_LLAMA)
        pt__append_error(&bad, "arch=%d must be 0 (gpt2) or 1 (llama)", (int)c->arch);
    if ((int)c->norm < 0 || c->norm > PT_NORM_RMS)
        pt__append_error(&bad, "norm=%d must be 0 (layernorm) or 1 (rmsnorm)", (int)c->norm);
    if ((int)c->pos < 0 || c->pos > PT_POS_ROPE)
        pt__append_error(&bad, "pos=%d must be 0 (learned) or 1 (rope)", (int)c->pos);
    if ((int)c->mlp < 0 || c->mlp > PT_MLP_SWIGLU)
        pt__append_error(&bad, "mlp=%d must be 0 (gelu) or 1 (swiglu)", (int)c->mlp);
    if (c->n_kv_head < 0 || (c->n_kv_head > 0 && c->n_head > 0 && c->n_head % c->n_kv_head))
        pt__append_error(&bad, "n_kv_head=%d must divide n_head=%d (0 means n_head)",
                         c->n_kv_head, c->n_head);
    if (c->ffn_hidden < 0 || c->ffn_hidden > (1 << 20))
        pt__append_error(&bad, "ffn_hidden=%d must be in [0, %d] (0 means 4 n_embd)",
                         c->ffn_hidden, 1 << 20);
    if (c->no_bias < 0 || c->no_bias > 1)
        pt__append_error(&bad, "no_bias=%d must be 0 or 1", c->no_bias);
    if (c->untied_head < 0 || c->untied_head > 1)
        pt__append_error(&bad, "untied_head=%d must be 0 or 1", c->untied_head);
    if (!(c->rope_theta >= 0.0f && c->rope_theta < 1e30f))
        pt__append_error(&bad, "rope_theta=%g must be >= 0 (0 means 10000)", (double)c->rope_theta);
    if (c->pos == PT_POS_ROPE && c->n_head > 0 && c->n_embd % c->n_head == 0 &&
        (c->n_embd / c->n_head) % 2)
        pt__append_error(&bad, "pos=rope needs an even head size (n_embd/n_head=%d)",
                         c->n_embd / c->n_head);
    if (c->rope_scaling.factor != 0.0f &&
        !(c->rope_scaling.factor >= 1.0f && c->rope_scaling.original_max_pos > 0 &&
          c->rope_scaling.low_freq_factor > 0.0f &&
          c->rope_scaling.high_freq_factor > c->rope_scaling.low_freq_factor))
        pt__append_error(&bad, "rope_scaling: factor=%g needs factor >= 1, original_max_pos=%d > 0 "
                         "and high_freq_factor=%g > low_freq_factor=%g > 0",
                         (double)c->rope_scaling.factor, c->rope_scaling.original_max_pos,
                         (double)c->rope_scaling.high_freq_factor,
                         (double)c->rope_scaling.low_freq_factor);
    if (c->arch == PT_ARCH_GPT2 && c->mlp == PT_MLP_SWIGLU)
        pt__append_error(&bad, "mlp=swiglu needs arch=llama (GPT-2's tensors have no up projection)");
    if (c->arch == PT_ARCH_GPT2 && c->n_kv_head > 0 && c->n_kv_head != c->n_head)
        pt__append_error(&bad, "n_kv_head=%d != n_head=%d needs arch=llama (GPT-2's fused c_attn "
                         "has as many key/value heads as query heads)", c->n_kv_head, c->n_head);
    if (c->arch == PT_ARCH_LLAMA && c->pos != PT_POS_ROPE)
        pt__append_error(&bad, "arch=llama needs pos=rope (LLaMA has no position embedding)");
    return bad ? PT_ERR_CONFIG : PT_OK;
}

/* ---- the tensors of the model, as a table -------------------------------- */

/* How a tensor starts (pt_gpt_init_weights). */
enum { PT__INIT_NORMAL = 0, /* N(0, 0.02) */
       PT__INIT_PROJ,       /* N(0, 0.02/sqrt(2 n_layer)): projections into the residual */
       PT__INIT_ONE,        /* norm weights */
       PT__INIT_ZERO };     /* biases */

/* One tensor of the whole model: its full shape (cols 0: 1-D), how tensor
   parallelism splits it, how it starts, and where it lives: layer >= 0 (its
   place in pt_block_params: field), or PT__AT_EMBED (first stage),
   PT__AT_HEAD (last stage), PT__AT_TIED (both: wte is the tied head). */
enum { PT__AT_EMBED = -1, PT__AT_HEAD = -2, PT__AT_TIED = -3 };
typedef struct pt__spec {
    int64_t rows, cols;
    pt_shard shard;
    int init, layer;
    int vocab;    /* its rows are the vocabulary's (an embedding or a head) */
    int role;     /* PT__R_* */
    size_t field;
} pt__spec;
enum { PT__R_WTE = 0, PT__R_WPE, PT__R_LAYER, PT__R_LNF_W, PT__R_LNF_B, PT__R_HEAD };

/* A layer's tensors, in canonical order, for the architecture's names and
   layouts (Hugging Face's). GPT-2: Conv1D [in, out], q, k and v fused in
   c_attn (tp: a block of each of their column groups). LLaMA: nn.Linear
   [out, in]; q_proj, k_proj and v_proj follow one another (and their biases
   likewise), so their rows are one fused [q|k|v] weight in the flat buffer
   (qkv_w points at it; tp splits each by rows: a rank's heads stay fused),
   and gate_proj, up_proj are one fused [gate|up] weight (fc_w). The
   row-parallel o_proj and down_proj split by columns. Units: C = n_embd,
   KV = n_kv_head * head size, F = ffn_hidden. */
enum { PT__U_C = 1, PT__U_3C, PT__U_KV, PT__U_F };
typedef struct pt__lspec {
    const char *gpt2, *llama;  /* names (NULL: absent in that architecture) */
    int rows, cols;            /* PT__U_* (cols 0: 1-D) of GPT-2; LLaMA's are swapped */
    pt_shard shard2, shardl;   /* tensor parallelism in each layout */
    int init, needs;           /* needs: PT__N_* that must hold */
    size_t field;
} pt__lspec;
enum { PT__N_ALL = 0, PT__N_BIAS, PT__N_NORM_BIAS, PT__N_GATE, PT__N_GATE_BIAS };
#define PT__LF(f) offsetof(pt_block_params, f)
static const pt__lspec pt__layer[] = {
    {"ln_1.weight", "input_layernorm.weight", PT__U_C, 0, PT_SHARD_NONE, PT_SHARD_NONE,
     PT__INIT_ONE, PT__N_ALL, PT__LF(ln1_w)},
    {"ln_1.bias", "input_layernorm.bias", PT__U_C, 0, PT_SHARD_NONE, PT_SHARD_NONE, PT__INIT_ZERO,
     PT__N_NORM_BIAS, PT__LF(ln1_b)},
    {"attn.c_attn.weight", "self_attn.q_proj.weight", PT__U_C, PT__U_3C, PT_SHARD_QKV,
     PT_SHARD_ROWS, PT__INIT_NORMAL, PT__N_ALL, PT__LF(qkv_w)},
    {NULL, "self_attn.k_proj.weight", PT__U_C, PT__U_KV, PT_SHARD_NONE, PT_SHARD_ROWS,
     PT__INIT_NORMAL, PT__N_ALL, PT__LF(k_w)},
    {NULL, "self_attn.v_proj.weight", PT__U_C, PT__U_KV, PT_SHARD_NONE, PT_SHARD_ROWS,
     PT__INIT_NORMAL, PT__N_ALL, PT__LF(v_w)},
    {"attn.c_attn.bias", "self_attn.q_proj.bias", PT__U_3C, 0, PT_SHARD_QKV, PT_SHARD_COLS,
     PT__INIT_ZERO, PT__N_BIAS, PT__LF(qkv_b)},
    {NULL, "self_attn.k_proj.bias", PT__U_KV, 0, PT_SHARD_NONE, PT_SHARD_COLS, PT__INIT_ZERO,
     PT__N_BIAS, PT__LF(k_b)},
    {NULL, "self_attn.v_proj.bias", PT__U_KV, 0, PT_SHARD_NONE, PT_SHARD_COLS, PT__INIT_ZERO,
     PT__N_BIAS, PT__LF(v_b)},
    {"attn.c_proj.weight", "self_attn.o_proj.weight", PT__U_C, PT__U_C, PT_SHARD_ROWS,
     PT_SHARD_COLS, PT__INIT_PROJ, PT__N_ALL, PT__LF(attn_proj_w)},
    {"attn.c_proj.bias", "self_attn.o_proj.bias", PT__U_C, 0, PT_SHARD_NONE, PT_SHARD_NONE,
     PT__INIT_ZERO, PT__N_BIAS, PT__LF(attn_proj_b)},
    {"ln_2.weight", "post_attention_layernorm.weight", PT__U_C, 0, PT_SHARD_NONE, PT_SHARD_NONE,
     PT__INIT_ONE, PT__N_ALL, PT__LF(ln2_w)},
    {"ln_2.bias", "post_attention_layernorm.bias", PT__U_C, 0, PT_SHARD_NONE, PT_SHARD_NONE,
     PT__INIT_ZERO, PT__N_NORM_BIAS, PT__LF(ln2_b)},
    {"mlp.c_fc.weight", "mlp.gate_proj.weight", PT__U_C, PT__U_F, PT_SHARD_COLS, PT_SHARD_ROWS,
     PT__INIT_NORMAL, PT__N_ALL, PT__LF(fc_w)},
    {NULL, "mlp.up_proj.weight", PT__U_C, PT__U_F, PT_SHARD_NONE, PT_SHARD_ROWS, PT__INIT_NORMAL,
     PT__N_GATE, PT__LF(up_w)},
    {"mlp.c_fc.bias", "mlp.gate_proj.bias", PT__U_F, 0, PT_SHARD_COLS, PT_SHARD_COLS,
     PT__INIT_ZERO, PT__N_BIAS, PT__LF(fc_b)},
    {NULL, "mlp.up_proj.bias", PT__U_F, 0, PT_SHARD_NONE, PT_SHARD_COLS, PT__INIT_ZERO,
     PT__N_GATE_BIAS, PT__LF(up_b)},
    {"mlp.c_proj.weight", "mlp.down_proj.weight", PT__U_F, PT__U_C, PT_SHARD_ROWS, PT_SHARD_COLS,
     PT__INIT_PROJ, PT__N_ALL, PT__LF(fc_proj_w)},
    {"mlp.c_proj.bias", "mlp.down_proj.bias", PT__U_C, 0, PT_SHARD_NONE, PT_SHARD_NONE,
     PT__INIT_ZERO, PT__N_BIAS, PT__LF(fc_proj_b)},
};
#undef PT__LF
#define PT__NLAYER_SPECS ((int)(sizeof pt__layer / sizeof pt__layer[0]))

static int64_t pt__unit(const pt_gpt_config *c, int u) {
    int64_t C = c->n_embd, hd = c->n_head > 0 ? C / c->n_head : 0;
    return u == PT__U_C ? C : u == PT__U_3C ? 3 * C : u == PT__U_KV ? pt__kv_heads(c) * hd
         : u == PT__U_F ? pt__ffn(c) : 0;
}

/* Whether entry e of pt__layer exists in this configuration. */
static int pt__layer_has(const pt_gpt_config *c, const pt__lspec *e) {
    int llama = c->arch == PT_ARCH_LLAMA, bias = !c->no_bias, gate = c->mlp == PT_MLP_SWIGLU;
    if (!(llama ? e->llama : e->gpt2)) return 0;
    switch (e->needs) {
    case PT__N_BIAS: return bias;
    case PT__N_NORM_BIAS: return bias && c->norm == PT_NORM_LAYER;
    case PT__N_GATE: return gate;
    case PT__N_GATE_BIAS: return gate && bias;
    default: return 1;
    }
}

/* Tensors a layer has. */
static int pt__layer_count(const pt_gpt_config *c) {
    int j, n = 0;
    for (j = 0; j < PT__NLAYER_SPECS; j++) n += pt__layer_has(c, &pt__layer[j]);
    return n;
}

/* The whole model's tensor k in canonical order -- the embedding, the
   position embedding (learned positions), each layer's, the final norm's
   weight (and bias), the LM head (untied) -- into *s and its name into name
   (n bytes; name may be NULL). Returns 0 past the last tensor. */
static int pt__canon_spec(const pt_gpt_config *c, int k, pt__spec *s, char *name, size_t n) {
    int64_t C = c->n_embd;
    int llama = c->arch == PT_ARCH_LLAMA, per = pt__layer_count(c);
    int wpe = c->pos == PT_POS_LEARNED, nl = per * c->n_layer, pre = 1 + wpe;
    int lnf_b = c->norm == PT_NORM_LAYER && !c->no_bias, post = 1 + lnf_b + c->untied_head;
    const char *nm;
    memset(s, 0, sizeof *s);
    if (k < 0 || k >= pre + nl + post) return 0;
    if (k < pre) { /* wte [V, C] (split by rows of the vocabulary), wpe [block, C] */
        s->rows = k ? c->block_size : c->vocab_size, s->cols = C;
        s->shard = k ? PT_SHARD_NONE : PT_SHARD_ROWS;
        s->layer = k || c->untied_head ? PT__AT_EMBED : PT__AT_TIED;
        s->vocab = !k;
        s->role = k ? PT__R_WPE : PT__R_WTE;
        nm = k ? "wpe.weight" : llama ? "model.embed_tokens.weight" : "wte.weight";
    } else if (k < pre + nl) {
        int j, i = (k - pre) % per;
        const pt__lspec *e = NULL;
        for (j = 0; j < PT__NLAYER_SPECS; j++)
            if (pt__layer_has(c, &pt__layer[j]) && i-- == 0) {
                e = &pt__layer[j];
                break;
            }
        if (llama) { /* [out, in]: GPT-2's shape transposed, q alone where c_attn is 3C */
            int out = e->cols ? e->cols : e->rows;
            s->rows = pt__unit(c, out == PT__U_3C ? PT__U_C : out);
            s->cols = e->cols ? pt__unit(c, e->rows) : 0;
        } else {
            s->rows = pt__unit(c, e->rows), s->cols = pt__unit(c, e->cols);
        }
        s->shard = llama ? e->shardl : e->shard2;
        s->init = e->init;
        s->layer = (k - pre) / per;
        s->field = e->field;
        s->role = PT__R_LAYER;
        if (name) snprintf(name, n, llama ? "model.layers.%d.%s" : "h.%d.%s", s->layer,
                           llama ? e->llama : e->gpt2);
        return 1;
    } else if (k - pre - nl < 1 + lnf_b) { /* ln_f.weight, ln_f.bias */
        int bias = k - pre - nl == 1;
        s->rows = C;
        s->init = bias ? PT__INIT_ZERO : PT__INIT_ONE;
        s->layer = PT__AT_HEAD;
        s->role = bias ? PT__R_LNF_B : PT__R_LNF_W;
        nm = llama ? (bias ? "model.norm.bias" : "model.norm.weight")
                   : (bias ? "ln_f.bias" : "ln_f.weight");
    } else { /* the untied head [V, C] */
        s->rows = c->vocab_size, s->cols = C;
        s->shard = PT_SHARD_ROWS;
        s->layer = PT__AT_HEAD;
        s->vocab = 1;
        s->role = PT__R_HEAD;
        nm = "lm_head.weight";
    }
    if (name) snprintf(name, n, "%s", nm);
    return 1;
}

static void pt__canon_name(const pt_gpt_config *c, int k, char *buf, size_t n) {
    pt__spec s;
    if (!pt__canon_spec(c, k, &s, buf, n) && n) buf[0] = 0;
}

PTRAINDEF int64_t pt_gpt_num_params(const pt_gpt_config *c) {
    pt__spec s;
    int64_t n = 0;
    int k;
    for (k = 0; pt__canon_spec(c, k, &s, NULL, 0); k++) n += s.rows * (s.cols ? s.cols : 1);
    return n;
}

PTRAINDEF double pt_gpt_flops_per_step(const pt_gpt_config *c, int B, int T) {
    double tokens = (double)B * T, P = (double)pt_gpt_num_params(c);
    if (c->pos == PT_POS_LEARNED) P -= (double)c->block_size * c->n_embd;
    if (c->untied_head) P -= (double)c->vocab_size * c->n_embd;
    return 6.0 * P * tokens +
           12.0 * c->n_layer * (double)c->n_embd * B * (double)T * T;
}

/* Where element (r, c) of a tensor's full 2-D view lives in tensor rank k's
   part: its index there, or -1 when k does not hold it. */
static ptrdiff_t pt__local_index(const pt_param *p, int k, int64_t r, int64_t c) {
    int64_t lrows = p->ndim > 1 ? p->shape[0] : 1, lcols = p->ndim > 1 ? p->shape[1] : p->shape[0];
    int64_t fcols = p->ndim > 1 ? p->full_shape[1] : p->full_shape[0], third;
    switch (p->shard) {
    case PT_SHARD_ROWS:
        r -= (int64_t)k * lrows;
        return r >= 0 && r < lrows ? (ptrdiff_t)(r * lcols + c) : -1;
    case PT_SHARD_COLS:
        c -= (int64_t)k * lcols;
        return c >= 0 && c < lcols ? (ptrdiff_t)(r * lcols + c) : -1;
    case PT_SHARD_QKV: /* [q|k|v] blocks of fcols/3, each split by heads */
        third = fcols / 3;
        {
            int64_t j = c / third, i = c % third - (int64_t)k * (lcols / 3);
            return i >= 0 && i < lcols / 3 ? (ptrdiff_t)(r * lcols + j * (lcols / 3) + i) : -1;
        }
    default:
        return (ptrdiff_t)(r * lcols + c);
    }
}

/* Waits for ZeRO's parameter all-gathers still under way (>>exec: the
   executor starts them; whatever reads the weights first settles them). */
static pt_status pt__ag_settle(const pt_gpt *m);

#define PT__F(a, n) ((float *)pt_arena_alloc((a), (size_t)(n) * sizeof(float)))

/* A block's sizes on one tensor-parallel rank: N rows, C wide, Ca its
   attention width (its NH query heads of hd lanes), Ckv its key/value width
   (NKV heads), Q3 = Ca + 2 Ckv its q, k, v width, F its MLP columns, Fi the
   MLP input projection's width (F, or 2F for SwiGLU's gate and up); Ns
   the residual stream's rows held here (N, or N/tp sequence parallel). */
typedef struct pt__dims { size_t B, T, N, Ns, C, Ca, Ckv, Q3, F, Fi, NH, NKV, hd; } pt__dims;

static pt__dims pt__block_dims_sp(const pt_gpt_config *c, int B, int T, int tp, int sp) {
    pt__dims d;
    d.B = (size_t)B, d.T = (size_t)T, d.N = d.B * d.T, d.C = (size_t)c->n_embd;
    d.Ns = sp && tp > 1 ? d.N / (size_t)tp : d.N;
    d.hd = d.C / (size_t)c->n_head;
    d.NH = (size_t)c->n_head / (size_t)tp, d.NKV = (size_t)pt__kv_heads(c) / (size_t)tp;
    d.Ca = d.NH * d.hd, d.Ckv = d.NKV * d.hd, d.Q3 = d.Ca + 2 * d.Ckv;
    d.F = (size_t)pt__ffn(c) / (size_t)tp, d.Fi = c->mlp == PT_MLP_SWIGLU ? 2 * d.F : d.F;
    return d;
}

static pt__dims pt__block_dims(const pt_gpt_config *c, int B, int T, int tp) {
    return pt__block_dims_sp(c, B, T, tp, 0);
}

/* What a block's forward saves for backward (what = PT_RECOMPUTE_*: full
   keeps the output alone; selective all but the attention output; the
   layer being recomputed keeps everything but the output). RMSNorm keeps
   no mean. bf16: ln1, qkv, ln2 and fch kept as bf16 (the caller points
   their floats at the scratch's). */
static void pt__layout_block_acts(pt_block_acts *x, pt_arena *a, const pt__dims *d, int what,
                                  int with_out, int means, int bf16) {
    size_t N = d->N, Ns = d->Ns; /* (the residual stream's rows: Ns) */
#define PT__H(n) ((uint16_t *)pt_arena_alloc(a, (size_t)(n) * sizeof(uint16_t)))
    memset(x, 0, sizeof *x);
    if (with_out) x->out = PT__F(a, Ns * d->C);
    if (what == PT_RECOMPUTE_FULL) return;
    if (bf16) x->ln1_16 = PT__H(Ns * d->C);
    else x->ln1 = PT__F(a, Ns * d->C);
    if (means) x->ln1_mean = PT__F(a, Ns);
    x->ln1_rstd = PT__F(a, Ns);
    if (bf16) x->qkv_16 = PT__H(N * d->Q3);
    else x->qkv = PT__F(a, N * d->Q3);
    x->lse = PT__F(a, d->B * d->NH * d->T);
    if (what != PT_RECOMPUTE_SELECTIVE) x->atty = PT__F(a, N * d->Ca);
    x->res2 = PT__F(a, Ns * d->C);
    if (bf16) x->ln2_16 = PT__H(Ns * d->C);
    else x->ln2 = PT__F(a, Ns * d->C);
    if (means) x->ln2_mean = PT__F(a, Ns);
    x->ln2_rstd = PT__F(a, Ns);
    if (bf16) x->fch_16 = PT__H(N * d->Fi);
    else x->fch = PT__F(a, N * d->Fi);
#undef PT__H
}

/* A block's kept output gradients: dfch, dqkv and dln1 may be given (the
   fused backward's scratch), the others come from the arena. Sequence
   parallel (d->Ns < N): the norms' output gradients are Ns rows, and W's
   gathered norm outputs are kept too. */
static void pt__layout_wgrad(pt_block_wgrad *w, pt_arena *a, const pt__dims *d,
                             const pt_block_scratch *s) {
    size_t N = d->N, Ns = d->Ns;
    /* (the scratch's: dout and dln2 right after its dfch, in one piece: pt__layout_scratch) */
    w->dout = s ? (s->dfch ? s->dfch + N * d->Fi : NULL) : PT__F(a, N * d->C);
    w->dln2 = s ? (s->dfch ? w->dout + N * d->C : NULL) : PT__F(a, Ns * d->C);
    w->dres2 = PT__F(a, N * d->C);
    /* the scratch's w shares its dln, dfch, dqkv (NULL in a meta arena too:
       s says whether to, not the pointers, so the report counts them once) */
    w->dln1 = s ? s->dln : PT__F(a, Ns * d->C);
    w->dfch = s ? s->dfch : PT__F(a, N * d->Fi);
    w->dqkv = s ? s->dqkv : PT__F(a, N * d->Q3);
    w->ln1g = Ns < N ? PT__F(a, N * d->C) : NULL;
    w->ln2g = Ns < N ? PT__F(a, N * d->C) : NULL;
}

/* A block's scratch: forward's (activation, attention work, rotary table),
   and with training backward's input gradients and the fused backward's
   kept ones. */
static void pt__layout_scratch(pt_block_scratch *s, pt_arena *a, const pt__dims *d,
                               int training, int rope, int bf16) {
    size_t N = d->N, Ns = d->Ns;
    memset(s, 0, sizeof *s);
    if (bf16) { /* the layer at hand's activations that the slots keep as bf16 */
        s->ln1 = PT__F(a, Ns * d->C);
        s->qkv = PT__F(a, N * d->Q3);
        s->ln2 = PT__F(a, Ns * d->C);
        s->fch = PT__F(a, N * d->Fi);
    }
    if (Ns < N) { /* sequence parallel: the gathers' and the partial sums' buffer */
        s->sp = 1;
        s->xg = PT__F(a, N * d->C);
        if (training) s->spg = PT__F(a, 4 * d->C);
    }
    s->gelu = PT__F(a, N * d->F);
    s->attn_slots = pt_get_threads();
    s->attn = PT__F(a, pt_attention_scratch_floats((int)d->T, s->attn_slots));
    if (rope) s->rope = PT__F(a, d->T * d->hd);
    if (!training) return;
    s->dln = PT__F(a, N * d->C);
    s->dqkv = PT__F(a, N * d->Q3);
    s->datty = PT__F(a, N * d->Ca);
    /* dfch, then W's kept dout and dln2: one piece, which context parallelism's
       ring buffers take while attention runs (pt__layout_cp) */
    s->dfch = PT__F(a, N * d->Fi + N * d->C + Ns * d->C);
    pt__layout_wgrad(&s->w, a, d, s);
}

PTRAINDEF void pt_block_layout(const pt_gpt_config *cfg, int B, int T, int tp, int seqp, pt_arena *a,
                               pt_block_params *p, pt_block_params *g, pt_block_acts *acts,
                               pt_block_scratch *s) {
    pt__dims d = pt__block_dims_sp(cfg, B, T, tp > 0 ? tp : 1, seqp);
    pt__spec sp;
    pt_block_params *ps[2];
    int k, i;
    ps[0] = p, ps[1] = g;
    for (i = 0; i < 2; i++) {
        size_t total = 0;
        float *base;
        if (!ps[i]) continue;
        memset(ps[i], 0, sizeof *ps[i]);
        /* one allocation, the tensors one after another (as in the model's
           buffer: LLaMA's q, k, v and gate, up weights are read fused) */
        for (k = 0; k < 2; k++) {
            int j;
            size_t at = 0;
            base = k ? PT__F(a, total) : NULL;
            for (j = 0; pt__canon_spec(cfg, j, &sp, NULL, 0) && sp.layer <= 0; j++) {
                int64_t n = sp.rows * (sp.cols ? sp.cols : 1);
                if (sp.layer < 0) continue; /* the layers come after the embeddings */
                if (sp.shard != PT_SHARD_NONE) n /= tp > 0 ? tp : 1;
                if (k) *(float **)((char *)ps[i] + sp.field) = base ? base + at : NULL;
                at += (size_t)n;
            }
            total = at;
        }
    }
    if (acts)
        pt__layout_block_acts(acts, a, &d, PT_RECOMPUTE_NONE, 1, cfg->norm == PT_NORM_LAYER, 0);
    if (s) pt__layout_scratch(s, a, &d, g != NULL, cfg->pos == PT_POS_ROPE, 0);
}

static float *pt__z3_open(pt_gpt *m, pt_status *st);
static pt_status pt__z3_close(pt_gpt *m, float *keep, int commit);

PTRAINDEF void pt_gpt_init_weights(pt_gpt *m, uint64_t seed) {
    pt_rng rng;
    float proj_std = 0.02f / sqrtf(2.0f * (float)m->config.n_layer);
    pt__spec s;
    int i = 0, k;
    float *keep;
    pt_status st;
    if (!m->params) return;
    pt__ag_settle(m); /* (an error stays with the requests' communicator) */
    if (!(keep = pt__z3_open(m, &st))) return; /* (ZeRO 3: the error is pt_last_error's) */
    pt_rng_seed(&rng, seed);
    /* the whole model's tensors in canonical order, drawn in sequence: the
       ones held here keep their values (their part under tp), the others'
       draws are skipped, so every layout holds the serial init */
    for (k = 0; pt__canon_spec(&m->config, k, &s, NULL, 0); k++) {
        const pt_param *p = i < m->num_tensors && m->table[i].canon == k ? &m->table[i++] : NULL;
        int64_t rows = s.cols ? s.rows : 1, cols = s.cols ? s.cols : s.rows, j;
        float *w = p ? m->params + p->offset : NULL;
        if (s.init == PT__INIT_NORMAL || s.init == PT__INIT_PROJ) {
            float std = s.init == PT__INIT_PROJ ? proj_std : 0.02f;
            for (j = 0; j < rows * cols; j++) {
                float v = pt_rng_normal(&rng, 0.0f, std);
                ptrdiff_t at = p ? pt__local_index(p, m->place.tp_rank, j / cols, j % cols) : -1;
                if (at >= 0) w[at] = v;
            }
        } else if (p) {
            for (j = 0; j < (int64_t)p->numel; j++) w[j] = s.init == PT__INIT_ONE ? 1.0f : 0.0f;
        }
    }
    pt__z3_close(m, keep, 1);
    if (m->m) memset(m->m, 0, m->mem.optimizer / 2); /* the moments: m, v alike */
    if (m->v) memset(m->v, 0, m->mem.optimizer / 2);
    m->adam_t = 0;
}

PTRAINDEF const pt_param *pt_gpt_find_param(const pt_gpt *m, const char *name) {
    int i;
    for (i = 0; i < m->num_tensors; i++)
        if (strcmp(m->table[i].name, name) == 0) return &m->table[i];
    return NULL;
}

/* Sum over the tensor-parallel group (nothing to do without one). */
static pt_status pt__tp_sum(pt_comm *tp, float *buf, size_t n) {
    return tp && tp->size > 1 ? pt_comm_all_reduce(tp, buf, n, PT_REDUCE_SUM) : PT_OK;
}

/* The configuration's norm: LayerNorm (mean kept) or RMSNorm (b, mean unused). */
static void pt__norm_forward(const pt_gpt_config *c, float *out, float *mean, float *rstd,
                             const float *x, const float *w, const float *b, int N, int C) {
    float eps = c->ln_eps > 0.0f ? c->ln_eps : 1e-5f;
    if (c->norm == PT_NORM_RMS) pt_rmsnorm_forward(out, rstd, x, w, N, C, eps);
    else pt_layernorm_forward(out, mean, rstd, x, w, b, N, C, eps);
}

static void pt__norm_backward(const pt_gpt_config *c, float *dx, float *dw, float *db,
                              const float *dout, const float *x, const float *w,
                              const float *mean, const float *rstd, int N, int C) {
    if (c->norm == PT_NORM_RMS) pt_rmsnorm_backward(dx, dw, dout, x, w, rstd, N, C);
    else pt_layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, N, C);
}

/* The architecture's linear layer: Conv1D [IN, OUT] (GPT-2) or nn.Linear [OUT, IN]. */
static void pt__proj_forward(pt_ctx *ctx, const pt_gpt_config *c, float *out, const float *inp,
                             const float *w, const float *b, int N, int IN, int OUT) {
    if (c->arch == PT_ARCH_LLAMA) pt_linear_forward(ctx, out, inp, w, b, N, IN, OUT);
    else pt_matmul_forward(ctx, out, inp, w, b, N, IN, OUT);
}

static void pt__proj_backward(pt_ctx *ctx, const pt_gpt_config *c, float *dinp, float *dw,
                              float *db, const float *dout, const float *inp, const float *w,
                              int N, int IN, int OUT) {
    if (c->arch == PT_ARCH_LLAMA) pt_linear_backward(ctx, dinp, dw, db, dout, inp, w, N, IN, OUT);
    else pt_matmul_backward(ctx, dinp, dw, db, dout, inp, w, N, IN, OUT);
}

/* The MLP's activation of fch (N, Fi) into out (N, F): gelu or swiglu. */
static void pt__act_forward(const pt_gpt_config *c, float *out, const float *fch, size_t N,
                            size_t F) {
    if (c->mlp == PT_MLP_SWIGLU) pt_swiglu_forward(out, fch, (int)N, (int)F);
    else pt_gelu_forward(out, fch, N * F);
}

/* Global positions of rank c of K's T tokens (T even): chunks c and 2K-1-c
   of T/2 tokens each (the load-balanced split of a sequence of K*T). */
static void pt__cp_positions(int *pos, int T, int c, int K) {
    int h = T / 2, j;
    for (j = 0; j < T; j++) pos[j] = j < h ? c * h + j : (2 * K - 1 - c) * h + j - h;
}

/* This rank's positions for T local tokens (filled when T changes), or
   NULL without context parallelism (positions 0..T-1). */
static const int *pt__cp_pos(pt_block_cp *cp, int T) {
    if (!cp || !cp->comm || cp->comm->size < 2) return NULL;
    if (cp->pos_T != T) {
        pt__cp_positions(cp->pos, T, cp->comm->rank, cp->comm->size);
        cp->pos_T = T;
    }
    return cp->pos;
}

/* The rotary table for T positions in s->rope (computed when T changes;
   context parallel: this rank's tokens' global positions). */
static const float *pt__rope_cs(const pt_gpt_config *c, pt_block_scratch *s, int T) {
    if (s->rope_T != T) {
        pt__rope_rows(s->rope, pt__cp_pos(s->cp, T), T, c->n_embd / c->n_head, pt__rope_theta(c),
                      &c->rope_scaling);
        s->rope_T = T;
    }
    return s->rope;
}

/* A block's k|v columns of qkv (N rows of Q3) into kv (N rows of 2 Ckv). */
static void pt__cp_kv_own(float *kv, const float *qkv, const pt__dims *d) {
    size_t n, ck = 2 * d->Ckv;
    for (n = 0; n < d->N; n++) memcpy(kv + n * ck, qkv + n * d->Q3 + d->Ca, ck * sizeof(float));
}

/* The key/value block of ring step i (held by rank c - i) at this rank. */
static pt_attn_ring pt__cp_block(pt_block_cp *cp, const pt__dims *d, int i, const float *kv) {
    pt_attn_ring blk;
    int K = cp->comm->size;
    pt__cp_positions(cp->kpos, (int)d->T, (cp->comm->rank - i + K) % K, K);
    blk.qpos = cp->pos, blk.kpos = cp->kpos, blk.Tq = blk.Tk = (int)d->T;
    blk.kv = kv, blk.ld = (int)(2 * d->Ckv);
    return blk;
}

/* Attention of this rank's queries (out, lse): the unsplit kernel, or
   context parallel the ring: K steps, at step i the block of rank c - i
   (its transfer to c + 1 and the next block's from c - 1 started before
   it is computed), each step's partial result merged into out, lse. */
static pt_status pt__attention_fwd(pt_ctx *ctx, const pt__dims *d, const float *qkv, float *out,
                                   float *lse, pt_block_scratch *s) {
    pt_block_cp *cp = s->cp;
    int B = (int)d->B, T = (int)d->T, Ca = (int)d->Ca, NH = (int)d->NH, K, next, prev, i;
    size_t nkv = d->N * 2 * d->Ckv;
    pt_status st = PT_OK;
    if (!pt__cp_pos(cp, T)) {
        pt_attention_forward(ctx, out, lse, qkv, s->attn, s->attn_slots, B, T, Ca, NH,
                             (int)d->NKV);
        return PT_OK;
    }
    K = cp->comm->size, next = (cp->comm->rank + 1) % K, prev = (cp->comm->rank + K - 1) % K;
    pt__cp_kv_own(cp->kv[0], qkv, d);
    for (i = 0; i < K && st == PT_OK; i++) {
        pt_attn_ring blk = pt__cp_block(cp, d, i, cp->kv[i & 1]);
        if (i < K - 1 &&
            ((st = pt_comm_send_start(cp->comm, cp->kv[i & 1], nkv, next, 0, &cp->req[0])) != PT_OK ||
             (st = pt_comm_recv_start(cp->comm, cp->kv[!(i & 1)], nkv, prev, 0, &cp->req[1])) != PT_OK))
            return st;
        pt_attention_ring_forward(ctx, i ? cp->po : out, i ? cp->pl : lse, qkv, &blk, s->attn,
                                  s->attn_slots, B, Ca, NH, (int)d->NKV);
        if (i) pt_attention_merge(out, lse, cp->po, cp->pl, B, T, Ca, NH);
        if ((st = pt_comm_wait(&cp->req[0])) == PT_OK) st = pt_comm_wait(&cp->req[1]);
    }
    return st;
}

/* Backward of pt__attention_fwd into dqkv (zeroed by the caller): context
   parallel, the blocks go round again from this rank's own, each followed
   by its dk|dv accumulator (req[2] its receive, req[3 + i%2] its sends):
   at step i this rank adds its share (part) to rank c - i's block's
   accumulator; its own block's comes home after K hops. */
static pt_status pt__attention_bwd(pt_ctx *ctx, const pt__dims *d, float *dqkv, const float *dout,
                                   const float *out, const float *qkv, const float *lse,
                                   pt_block_scratch *s) {
    pt_block_cp *cp = s->cp;
    int B = (int)d->B, T = (int)d->T, Ca = (int)d->Ca, NH = (int)d->NH, NKV = (int)d->NKV;
    int K, next, prev, i;
    size_t nkv = d->N * 2 * d->Ckv, ck = 2 * d->Ckv, j, n;
    pt_status st = PT_OK;
    if (!pt__cp_pos(cp, T)) {
        pt_attention_backward(ctx, dqkv, dout, out, qkv, lse, s->attn, s->attn_slots, B, T, Ca,
                              NH, NKV);
        return PT_OK;
    }
    K = cp->comm->size, next = (cp->comm->rank + 1) % K, prev = (cp->comm->rank + K - 1) % K;
    pt__cp_kv_own(cp->kv[0], qkv, d);
    for (i = 0; i < K && st == PT_OK; i++) {
        int cur = i & 1;
        pt_attn_ring blk = pt__cp_block(cp, d, i, cp->kv[cur]);
        if (i < K - 1 &&
            ((st = pt_comm_send_start(cp->comm, cp->kv[cur], nkv, next, 0, &cp->req[0])) != PT_OK ||
             (st = pt_comm_recv_start(cp->comm, cp->kv[!cur], nkv, prev, 0, &cp->req[1])) != PT_OK))
            return st;
        if (i > 0 && /* acc[cur] free again (its send two steps back), then refilled */
            ((st = pt_comm_wait(&cp->req[3 + cur])) != PT_OK ||
             (st = pt_comm_recv_start(cp->comm, cp->acc[cur], nkv, prev, 1, &cp->req[2])) != PT_OK))
            return st;
        memset(cp->part, 0, nkv * sizeof(float));
        pt_attention_ring_backward(ctx, dqkv, cp->part, dout, out, qkv, lse, &blk, s->attn,
                                   s->attn_slots, B, Ca, NH, NKV);
        if ((st = pt_comm_wait(&cp->req[2])) != PT_OK) return st;
        for (j = 0; j < nkv; j++) cp->acc[cur][j] = (i ? cp->acc[cur][j] : 0.0f) + cp->part[j];
        if ((st = pt_comm_send_start(cp->comm, cp->acc[cur], nkv, next, 1, &cp->req[3 + cur])) ==
            PT_OK && (st = pt_comm_wait(&cp->req[0])) == PT_OK)
            st = pt_comm_wait(&cp->req[1]);
    }
    if (st != PT_OK || (st = pt_comm_wait(&cp->req[3 + (K & 1)])) != PT_OK ||
        (st = pt_comm_recv(cp->comm, cp->acc[K & 1], nkv, prev, 1)) != PT_OK ||
        (st = pt_comm_wait(&cp->req[3 + !(K & 1)])) != PT_OK)
        return st;
    for (n = 0; n < d->N; n++) /* this rank's own keys/values' gradient, home */
        for (j = 0; j < ck; j++) dqkv[n * d->Q3 + d->Ca + j] += cp->acc[K & 1][n * ck + j];
    return PT_OK;
}

/* A row-parallel matmul's partial sums part (N,C) over the group: whole
   into out (an all-reduce in place: out == part) or, sequence parallel,
   this rank's n = Ns*C of them into out (a reduce-scatter: the same sums). */
static pt_status pt__tp_rows(pt_comm *tp, int sp, const float *part, float *out, size_t n) {
    if (sp) return pt_comm_reduce_scatter(tp, part, out, n, PT_REDUCE_SUM);
    return pt__tp_sum(tp, out, n);
}

/* Rows a sequence-parallel rank's share must be a multiple of for its
   column-parallel matmuls to run in parts (pt__sp_col_forward): the GEMMs'
   tiles never straddle a part's edge, so each row gets the whole GEMM's bits
   (pt_sgemm's runs of rows are multiples of 64 too). */
#define PT__SP_ROWS 64

/* A column-parallel matmul of a norm's output over every row: y (N,OUT) =
   in @ w + b, where in is mine (N rows) or, sequence parallel (sp), the
   group's rows gathered into buf (this rank's Ns rows are mine). The
   all-gather is started first and waited where its rows are read: this
   rank's own rows of y are computed from mine while it runs (when Ns is a
   multiple of PT__SP_ROWS), the others' from buf after. */
static pt_status pt__sp_col_forward(pt_ctx *ctx, const pt_gpt_config *cfg, pt_comm *tp, int sp,
                                    float *y, const float *mine, float *buf, const float *w,
                                    const float *b, const pt__dims *d, int OUT, pt_comm_req *req) {
    int N = (int)d->N, C = (int)d->C, Ns = (int)d->Ns, r0, r1;
    pt_status st;
    if (!sp) {
        pt__proj_forward(ctx, cfg, y, mine, w, b, N, C, OUT);
        return PT_OK;
    }
    r0 = tp->rank * Ns, r1 = r0 + Ns; /* this rank's rows [r0, r1) */
    if ((st = pt_comm_all_gather_start(tp, mine, buf, (size_t)Ns * C, req)) != PT_OK) return st;
    if (Ns % PT__SP_ROWS == 0)
        pt__proj_forward(ctx, cfg, y + (size_t)r0 * OUT, mine, w, b, Ns, C, OUT);
    else
        r0 = r1 = N; /* one GEMM over every row, after the gather */
    if ((st = pt_comm_wait(req)) != PT_OK) return st;
    if (r0 > 0) pt__proj_forward(ctx, cfg, y, buf, w, b, r0, C, OUT);
    if (r1 < N)
        pt__proj_forward(ctx, cfg, y + (size_t)r1 * OUT, buf + (size_t)r1 * C, w, b, N - r1, C,
                         OUT);
    return PT_OK;
}

PTRAINDEF pt_status pt_block_forward(pt_ctx *ctx, const pt_gpt_config *cfg, int B, int T,
                                     const pt_block_params *p, const float *x, pt_block_acts *a,
                                     pt_block_scratch *s, pt_comm *tp) {
    /* this rank's heads and MLP columns (d); row-parallel biases are added
       by tensor rank 0 only, so the sum counts them once */
    int k = tp ? tp->size : 1, lead = !tp || tp->rank == 0, sp = s->sp && k > 1;
    pt__dims d = pt__block_dims_sp(cfg, B, T, k, sp);
    int C = cfg->n_embd, N = B * T, Ns = (int)d.Ns, Ca = (int)d.Ca, Q3 = (int)d.Q3, F = (int)d.F,
        Fi = (int)d.Fi;
    size_t nc = (size_t)Ns * C; /* the residual stream's floats here */
    float *part;
    pt_status st;
    if (a->ln1_16) /* the scratch is written before it is kept: it holds no one's until then */
        memset((void *)s->held, 0, sizeof s->held);
    pt__norm_forward(cfg, a->ln1, a->ln1_mean, a->ln1_rstd, x, p->ln1_w, p->ln1_b, Ns, C);
    pt__bf16_act(ctx, a->ln1_16, a->ln1, nc, &s->held[0]);
    st = pt__sp_col_forward(ctx, cfg, tp, sp, a->qkv, a->ln1, s->xg, p->qkv_w, p->qkv_b, &d, Q3,
                            &s->req[0]); /* g: the all-gather behind this rank's rows */
    if (st != PT_OK) return st;
    if (cfg->pos == PT_POS_ROPE) /* q and k heads are adjacent: one pass over both */
        pt_rope_forward(a->qkv, pt__rope_cs(cfg, s, T), N, T, (int)(d.NH + d.NKV), (int)d.hd, Q3);
    pt__bf16_act(ctx, a->qkv_16, a->qkv, (size_t)N * Q3, &s->held[1]);
    if ((st = pt__attention_fwd(ctx, &d, a->qkv, a->atty, a->lse, s)) != PT_OK) return st;
    part = sp ? s->xg : a->res2;
    pt__proj_forward(ctx, cfg, part, a->atty, p->attn_proj_w, lead ? p->attn_proj_b : NULL, N,
                     Ca, C);
    if ((st = pt__tp_rows(tp, sp, part, a->res2, nc)) != PT_OK) return st; /* g-bar */
    pt_residual_forward(a->res2, a->res2, x, nc);
    pt__norm_forward(cfg, a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, p->ln2_w, p->ln2_b, Ns, C);
    pt__bf16_act(ctx, a->ln2_16, a->ln2, nc, &s->held[2]);
    st = pt__sp_col_forward(ctx, cfg, tp, sp, a->fch, a->ln2, s->xg, p->fc_w, p->fc_b, &d, Fi,
                            &s->req[0]);
    if (st != PT_OK) return st;
    pt__bf16_act(ctx, a->fch_16, a->fch, (size_t)N * Fi, &s->held[3]);
    pt__act_forward(cfg, s->gelu, a->fch, (size_t)N, (size_t)F);
    part = sp ? s->xg : a->out;
    pt__proj_forward(ctx, cfg, part, s->gelu, p->fc_proj_w, lead ? p->fc_proj_b : NULL, N, F, C);
    if ((st = pt__tp_rows(tp, sp, part, a->out, nc)) != PT_OK) return st;
    pt_residual_forward(a->out, a->out, a->res2, nc);
    return PT_OK;
}

/* The input gradient of a column-parallel matmul's input (its norm's
   output): dln (N,C) of this rank's columns is a partial sum, summed whole
   into out (== dln) or, sequence parallel, this rank's rows into out. */
static pt_status pt__col_dinput(pt_ctx *ctx, const pt_gpt_config *cfg, int sp, pt_comm *tp,
                                float *dln, float *out, const float *dy, const float *w,
                                const pt__dims *d, int OUT) {
    memset(dln, 0, d->N * d->C * sizeof(float));
    pt__proj_backward(ctx, cfg, dln, NULL, NULL, dy, NULL, w, (int)d->N, (int)d->C, OUT);
    return pt__tp_rows(tp, sp, dln, out, d->Ns * d->C);
}

/* W's MLP half (part 0: fc_proj, fc, ln2) or attention half (part 1:
   attn_proj, qkv, ln1): part 0 then part 1 is W. The overlap reduces the
   first layer's MLP gradients while its attention half runs. */
static void pt__block_weight_part(pt_ctx *ctx, const pt_gpt_config *cfg, int B, int T,
                                  const pt_block_params *p, pt_block_params *g, const float *x,
                                  const pt_block_acts *a, const pt_block_wgrad *w,
                                  pt_block_scratch *s, int tp, int part) {
    int sp = s->sp && tp > 1;
    pt__dims d = pt__block_dims_sp(cfg, B, T, tp, sp);
    int n = (int)d.N, c = (int)d.C, ca = (int)d.Ca, f = (int)d.F, ns = (int)d.Ns;
    const float *ln1 = w->ln1g, *ln2 = w->ln2g;
    float *n2w = g->ln2_w, *n2b = g->ln2_b, *n1w = g->ln1_w, *n1b = g->ln1_b;
    if (!sp) {
        ln1 = a->ln1, ln2 = a->ln2;
    } else { /* [ln2_w | ln2_b | ln1_w | ln1_b] of this rank's rows */
        n2w = s->spg, n2b = n2b ? s->spg + c : NULL;
        n1w = s->spg + 2 * c, n1b = n1b ? s->spg + 3 * c : NULL;
    }
    if (part) {
        if (!sp) pt__bf16_load(a->ln1, a->ln1_16, d.N * d.C, &s->held[0]);
        pt__proj_backward(ctx, cfg, NULL, g->attn_proj_w, g->attn_proj_b, w->dres2, a->atty,
                          p->attn_proj_w, n, ca, c);
        pt__proj_backward(ctx, cfg, NULL, g->qkv_w, g->qkv_b, w->dqkv, ln1, p->qkv_w, n, c,
                          (int)d.Q3);
        pt__norm_backward(cfg, NULL, n1w, n1b, w->dln1, x, p->ln1_w, a->ln1_mean, a->ln1_rstd,
                          ns, c);
        return;
    }
    pt__bf16_load(a->fch, a->fch_16, d.N * d.Fi, &s->held[3]);
    if (!sp) pt__bf16_load(a->ln2, a->ln2_16, d.N * d.C, &s->held[2]);
    if (sp) memset(s->spg, 0, 4 * d.C * sizeof(float));
    pt__act_forward(cfg, s->gelu, a->fch, d.N, d.F); /* not saved by forward: NF floats a layer */
    pt__proj_backward(ctx, cfg, NULL, g->fc_proj_w, g->fc_proj_b, w->dout, s->gelu, p->fc_proj_w,
                      n, f, c);
    pt__proj_backward(ctx, cfg, NULL, g->fc_w, g->fc_b, w->dfch, ln2, p->fc_w, n, c, (int)d.Fi);
    pt__norm_backward(cfg, NULL, n2w, n2b, w->dln2, a->res2, p->ln2_w, a->ln2_mean, a->ln2_rstd,
                      ns, c);
}

/* B: the input's gradient, keeping in w what the weight gradients need.
   MLP branch: out = res2 + fc_proj(act(fc(norm2(res2)))); then the attention
   branch: res2 = x + attn_proj(attention(rope(qkv(norm1(x))))). Sequence
   parallel: dout, dx, x and the norms' tensors are this rank's Ns rows.
   Given g (W follows) and context parallel, W's MLP half runs between the
   branches (*w0 = 1): the ring's buffers take its kept gradients' place
   (pt__layout_cp). Its sums are the same, in the same order. */
static pt_status pt__block_bwd(pt_ctx *ctx, const pt_gpt_config *cfg, int B, int T,
                               const pt_block_params *p, pt_block_params *g, const float *x,
                               const pt_block_acts *a, const float *dout, float *dx,
                               pt_block_wgrad *w, pt_block_scratch *s, pt_comm *tp, int *w0) {
    int k = tp ? tp->size : 1, sp = s->sp && k > 1;
    pt__dims d = pt__block_dims_sp(cfg, B, T, k, sp);
    size_t C = d.C, N = d.N, Ca = d.Ca, F = d.F, Fi = d.Fi, Q3 = d.Q3, nc = d.Ns * d.C;
    int n = (int)N, c = (int)C, ca = (int)Ca, f = (int)F, ns = (int)d.Ns;
    const float *full;
    pt_status st;
    if (sp) { /* the output's gradient over every row (the g of forward's reduce-scatter);
                 W's column-parallel weight gradients read ln2, ln1 over every row: their
                 gathers start now and run behind B's GEMMs */
        if ((st = pt_comm_all_gather(tp, dout, w->dout, nc)) != PT_OK) return st;
        pt__bf16_load(a->ln2, a->ln2_16, nc, &s->held[2]);
        pt__bf16_load(a->ln1, a->ln1_16, nc, &s->held[0]);
        if ((st = pt_comm_all_gather_start(tp, a->ln2, w->ln2g, nc, &s->req[0])) != PT_OK ||
            (st = pt_comm_all_gather_start(tp, a->ln1, w->ln1g, nc, &s->req[1])) != PT_OK)
            return st;
    } else if (w->dout != dout) {
        memcpy(w->dout, dout, N * C * sizeof(float)); /* dx may alias dout */
    }
    pt__bf16_load(a->fch, a->fch_16, N * Fi, &s->held[3]);
    if (cfg->mlp == PT_MLP_SWIGLU) { /* d act in the activation's scratch, then d [gate|up] */
        memset(s->gelu, 0, N * F * sizeof(float));
        pt__proj_backward(ctx, cfg, s->gelu, NULL, NULL, w->dout, NULL, p->fc_proj_w, n, f, c);
        pt_swiglu_backward(w->dfch, a->fch, s->gelu, n, f);
    } else {
        memset(w->dfch, 0, N * F * sizeof(float));
        pt__proj_backward(ctx, cfg, w->dfch, NULL, NULL, w->dout, NULL, p->fc_proj_w, n, f, c);
        pt_gelu_backward(w->dfch, a->fch, w->dfch, N * F);
    }
    st = pt__col_dinput(ctx, cfg, sp, tp, sp ? s->xg : w->dln2, w->dln2, w->dfch, p->fc_w, &d,
                        (int)Fi);
    if (st != PT_OK) return st;
    full = w->dout + (sp ? (size_t)tp->rank * nc : 0); /* this rank's rows of it */
    if (dx != full) memcpy(dx, full, nc * sizeof(float)); /* dx now holds d res2 */
    pt__norm_backward(cfg, dx, NULL, NULL, w->dln2, a->res2, p->ln2_w, a->ln2_mean, a->ln2_rstd,
                      ns, c);
    if (sp) st = pt_comm_all_gather(tp, dx, w->dres2, nc);
    else memcpy(w->dres2, dx, N * C * sizeof(float));
    if (st != PT_OK) return st;
    if (g && pt__cp_pos(s->cp, T)) { /* (sequence parallel: W reads ln2 gathered) */
        if (sp && (st = pt_comm_wait(&s->req[0])) != PT_OK) return st;
        pt__block_weight_part(ctx, cfg, B, T, p, g, x, a, w, s, k, 0);
        *w0 = 1;
    }
    memset(s->datty, 0, N * Ca * sizeof(float));
    pt__proj_backward(ctx, cfg, s->datty, NULL, NULL, w->dres2, NULL, p->attn_proj_w, n, ca, c);
    memset(w->dqkv, 0, N * Q3 * sizeof(float));
    pt__bf16_load(a->qkv, a->qkv_16, N * Q3, &s->held[1]);
    st = pt__attention_bwd(ctx, &d, w->dqkv, s->datty, a->atty, a->qkv, a->lse, s);
    if (st != PT_OK) return st;
    if (cfg->pos == PT_POS_ROPE)
        pt_rope_backward(w->dqkv, pt__rope_cs(cfg, s, T), n, T, (int)(d.NH + d.NKV), (int)d.hd,
                         (int)Q3);
    st = pt__col_dinput(ctx, cfg, sp, tp, sp ? s->xg : w->dln1, w->dln1, w->dqkv, p->qkv_w, &d,
                        (int)Q3);
    if (st != PT_OK) return st;
    pt__norm_backward(cfg, dx, NULL, NULL, w->dln1, x, p->ln1_w, a->ln1_mean, a->ln1_rstd, ns, c);
    if (!sp) return PT_OK;
    if ((st = pt_comm_wait(&s->req[0])) != PT_OK) return st;
    return pt_comm_wait(&s->req[1]);
}

PTRAINDEF pt_status pt_block_backward_input(pt_ctx *ctx, const pt_gpt_config *cfg, int B, int T,
                                            const pt_block_params *p, const float *x,
                                            const pt_block_acts *a, const float *dout, float *dx,
                                            pt_block_wgrad *w, pt_block_scratch *s, pt_comm *tp) {
    return pt__block_bwd(ctx, cfg, B, T, p, NULL, x, a, dout, dx, w, s, tp, NULL);
}

/* W: every parameter gradient from the kept output gradients and the
   activations (the MLP activation recomputed). dout is whole on every
   tensor rank, so the replicated bias and norm gradients agree without
   communication. tp is the tensor-parallel group's size. Sequence parallel:
   the row-parallel biases' gradients come from the gathered dout and dres2
   (whole, equal on every rank); the norms' from this rank's rows go to
   s->spg, for pt_block_sp_norm_sum. */
PTRAINDEF void pt_block_backward_weight(pt_ctx *ctx, const pt_gpt_config *cfg, int B, int T,
                                        const pt_block_params *p, pt_block_params *g,
                                        const float *x, const pt_block_acts *a,
                                        const pt_block_wgrad *w, pt_block_scratch *s, int tp) {
    pt__block_weight_part(ctx, cfg, B, T, p, g, x, a, w, s, tp, 0);
    pt__block_weight_part(ctx, cfg, B, T, p, g, x, a, w, s, tp, 1);
}

PTRAINDEF pt_status pt_block_sp_norm_sum(const pt_gpt_config *cfg, pt_block_params *g,
                                         pt_block_scratch *s, pt_comm *tp) {
    size_t C = (size_t)cfg->n_embd, i;
    float *dst[4];
    int j;
    pt_status st;
    if (!s->sp || !tp || tp->size < 2) return PT_OK;
    if ((st = pt_comm_all_reduce(tp, s->spg, 4 * C, PT_REDUCE_SUM)) != PT_OK) return st;
    dst[0] = g->ln2_w, dst[1] = g->ln2_b, dst[2] = g->ln1_w, dst[3] = g->ln1_b;
    for (j = 0; j < 4; j++)
        for (i = 0; dst[j] && i < C; i++) dst[j][i] += s->spg[(size_t)j * C + i];
    return PT_OK;
}

PTRAINDEF pt_status pt_block_backward(pt_ctx *ctx, const pt_gpt_config *cfg, int B, int T,
                                      const pt_block_params *p, pt_block_params *g,
                                      const float *x, const pt_block_acts *a, const float *dout,
                                      float *dx, pt_block_scratch *s, pt_comm *tp) {
    int w0 = 0, k = tp ? tp->size : 1;
    pt_status st = pt__block_bwd(ctx, cfg, B, T, p, g, x, a, dout, dx, &s->w, s, tp, &w0);
    if (st != PT_OK) return st;
    if (!w0) pt__block_weight_part(ctx, cfg, B, T, p, g, x, a, &s->w, s, k, 0);
    pt__block_weight_part(ctx, cfg, B, T, p, g, x, a, &s->w, s, k, 1);
    return pt_block_sp_norm_sum(cfg, g, s, tp);
}

static pt_status pt__check_tokens(const int *tok, size_t n, int V, const char *what) {
    size_t i;
    for (i = 0; i < n; i++)
        if (tok[i] < 0 || tok[i] >= V)
            return pt__fail(PT_ERR_RANGE, "%s[%zu]=%d is outside the vocabulary [0, %d)", what, i,
                            tok[i], V);
    return PT_OK;
}

/* ---- generation ---------------------------------------------------------- */

PTRAINDEF pt_status pt_kv_cache_init(pt_kv_cache *c, const pt_gpt *m) {
    const pt_gpt_config *g = &m->config;
    pt__dims d = pt__block_dims(g, 1, 1, 1);
    size_t L = (size_t)g->n_layer, C = d.C, cap = (size_t)g->block_size;
    size_t V = (size_t)g->vocab_size, bytes = 0;
    int pass;
    pt_status st;
    memset(c, 0, sizeof *c);
    if (m->place.zero == 3)
        return pt__fail(PT_ERR_UNSUPPORTED, "generation reads whole weights; zero=3 holds 1/dp of "
                        "them: load the gathered weights (pt_gpt_gather, or a checkpoint) into a "
                        "model without ZeRO 3");
    if (m->place.tp > 1 || m->place.pp > 1)
        return pt__fail(PT_ERR_UNSUPPORTED, "generation runs on one rank: load the gathered "
                        "weights (pt_gpt_gather, or a checkpoint) into a model without a grid");
    for (pass = 0; pass < 2; pass++) {
        pt_arena *a = &c->arena;
        if (pass == 0) pt_arena_init_meta(a);
        else if ((st = pt_arena_init(a, bytes, m->alloc_ctx)) != PT_OK) return st;
        c->k = PT__F(a, L * cap * d.Ckv);
        c->v = PT__F(a, L * cap * d.Ckv);
        c->x = PT__F(a, C);
        c->ln = PT__F(a, C);
        c->qkv = PT__F(a, d.Q3);
        c->atty = PT__F(a, C);
        c->res = PT__F(a, C);
        c->fch = PT__F(a, d.Fi);
        c->fcg = PT__F(a, d.F);
        c->att = PT__F(a, cap);
        c->logits = PT__F(a, V);
        c->work = PT__F(a, V);
        c->rope = g->pos == PT_POS_ROPE ? PT__F(a, cap * d.hd) : NULL;
        bytes = a->used;
    }
    if (c->rope)
        pt_rope_table(c->rope, (int)cap, (int)d.hd, pt__rope_theta(g), &g->rope_scaling);
    c->capacity = (int)cap;
    return PT_OK;
}

PTRAINDEF void pt_kv_cache_free(pt_kv_cache *c) {
    pt_arena_free(&c->arena);
    memset(c, 0, sizeof *c);
}

PTRAINDEF void pt_kv_cache_reset(pt_kv_cache *c) { c->len = 0; }

/* The block of pt_block_forward for one new row at position p = c->len, with
   keys and values of rows 0..p taken from the cache (query head h reads
   key/value head h / (n_head/n_kv_head)). */
PTRAINDEF pt_status pt_gpt_decode(const pt_gpt *m, pt_kv_cache *c, int token,
                                  const float **logits) {
    const pt_gpt_config *g = &m->config;
    pt__dims d = pt__block_dims(g, 1, 1, 1);
    int C = g->n_embd, NH = (int)d.NH, hd = (int)d.hd, G = (int)(d.NH / d.NKV);
    int Ckv = (int)d.Ckv, Q3 = (int)d.Q3, F = (int)d.F, p = c->len, l, h, u, i;
    float scale = 1.0f / sqrtf((float)hd), mean, rstd;
    pt_ctx fp = m->ctx, *ctx = &fp; /* the model's workspace, fp32, no poller */
    pt_status st;
    fp.precision = PT_PRECISION_FP32;
    memset(&fp.poll, 0, sizeof fp.poll);
    if (!m->params) return pt__fail(PT_ERR_INVALID_ARG, "model has no memory (built with meta=1)");
    if ((st = pt__ag_settle(m)) != PT_OK) return st;
    if (token < 0 || token >= g->vocab_size)
        return pt__fail(PT_ERR_RANGE, "token %d is outside the vocabulary [0, %d)", token,
                        g->vocab_size);
    if (p >= c->capacity)
        return pt__fail(PT_ERR_RANGE, "KV cache is full (%d positions = block_size)", c->capacity);
    for (i = 0; i < C; i++)
        c->x[i] = m->wte[(size_t)token * C + i] + (m->wpe ? m->wpe[(size_t)p * C + i] : 0.0f);
    for (l = 0; l < g->n_layer; l++) {
        const pt_block_params *w = &m->layers[l];
        float *K = c->k + (size_t)l * c->capacity * Ckv, *Vc = c->v + (size_t)l * c->capacity * Ckv;
        pt__norm_forward(g, c->ln, &mean, &rstd, c->x, w->ln1_w, w->ln1_b, 1, C);
        pt__proj_forward(ctx, g, c->qkv, c->ln, w->qkv_w, w->qkv_b, 1, C, Q3);
        if (c->rope) /* the table's row p: one row of one position */
            pt_rope_forward(c->qkv, c->rope + (size_t)p * hd, 1, 1, (int)(d.NH + d.NKV), hd, Q3);
        memcpy(K + (size_t)p * Ckv, c->qkv + C, sizeof(float) * Ckv);
        memcpy(Vc + (size_t)p * Ckv, c->qkv + C + Ckv, sizeof(float) * Ckv);
        for (h = 0; h < NH; h++) {
            const float *q = c->qkv + h * hd;
            float mx = -INFINITY, sum = 0.0f, *o = c->atty + h * hd;
            for (u = 0; u <= p; u++) {
                const float *k = K + (size_t)u * Ckv + (h / G) * hd;
                float s = 0.0f;
                for (i = 0; i < hd; i++) s += q[i] * k[i];
                c->att[u] = s * scale;
                if (c->att[u] > mx) mx = c->att[u];
            }
            for (u = 0; u <= p; u++) {
                c->att[u] = expf(c->att[u] - mx);
                sum += c->att[u];
            }
            for (i = 0; i < hd; i++) o[i] = 0.0f;
            for (u = 0; u <= p; u++) {
                const float *v = Vc + (size_t)u * Ckv + (h / G) * hd;
                float a = c->att[u] / sum;
                for (i = 0; i < hd; i++) o[i] += a * v[i];
            }
        }
        pt__proj_forward(ctx, g, c->res, c->atty, w->attn_proj_w, w->attn_proj_b, 1, C, C);
        pt_residual_forward(c->res, c->res, c->x, (size_t)C);
        pt__norm_forward(g, c->ln, &mean, &rstd, c->res, w->ln2_w, w->ln2_b, 1, C);
        pt__proj_forward(ctx, g, c->fch, c->ln, w->fc_w, w->fc_b, 1, C, (int)d.Fi);
        pt__act_forward(g, c->fcg, c->fch, 1, (size_t)F);
        pt__proj_forward(ctx, g, c->x, c->fcg, w->fc_proj_w, w->fc_proj_b, 1, F, C);
        pt_residual_forward(c->x, c->x, c->res, (size_t)C);
    }
    pt__norm_forward(g, c->ln, &mean, &rstd, c->x, m->lnf_w, m->lnf_b, 1, C);
    pt_tied_head_forward(ctx, c->logits, c->ln, m->lm_head, 1, C, g->vocab_size);
    c->len++;
    if (logits) *logits = c->logits;
    return PT_OK;
}

/* Returns the k-th largest value of x[0..n) (k in 1..n); reorders x. */
static float pt__kth_largest(float *x, int n, int k) {
    int lo = 0, hi = n - 1, target = k - 1;
    while (lo < hi) {
        float pivot = x[lo + (hi - lo) / 2], t;
        int i = lo, j = hi;
        while (i <= j) {
            while (x[i] > pivot) i++;
            while (x[j] < pivot) j--;
            if (i <= j) {
                t = x[i];
                x[i] = x[j];
                x[j] = t;
                i++;
                j--;
            }
        }
        if (target <= j) hi = j;
        else if (target >= i) lo = i;
        else break;
    }
    return x[target];
}

PTRAINDEF int pt_sample_logits(const float *logits, int V, float temperature, int top_k,
                               pt_rng *rng, float *work) {
    float mx = logits[0], thr = -INFINITY;
    double sum = 0.0, r, acc = 0.0;
    int v, best = 0;
    for (v = 1; v < V; v++)
        if (logits[v] > mx) {
            mx = logits[v];
            best = v;
        }
    if (!(temperature > 0.0f)) return best;
    if (top_k > 0 && top_k < V) {
        memcpy(work, logits, sizeof(float) * V);
        thr = pt__kth_largest(work, V, top_k);
    }
    for (v = 0; v < V; v++) {
        work[v] = logits[v] >= thr ? (float)exp((double)(logits[v] - mx) / temperature) : 0.0f;
        sum += work[v];
    }
    r = (double)pt_rng_uniform(rng) * sum;
    for (v = 0; v < V; v++) {
        acc += work[v];
        if (r < acc) return v;
    }
    return best;
}

PTRAINDEF pt_status pt_gpt_generate(const pt_gpt *m, pt_kv_cache *c, const int *prompt,
                                    int n_prompt, int *out, int n_new,
                                    const pt_sample_desc *desc) {
    pt_rng rng;
    const float *logits = NULL;
    int i, j, cap = c->capacity;
    pt_status st;
    if (n_prompt < 1)
        return pt__fail(PT_ERR_INVALID_ARG, "generation needs a prompt of at least one token");
    if ((st = pt__check_tokens(prompt, (size_t)n_prompt, m->config.vocab_size, "prompt")) != PT_OK)
        return st;
    pt_rng_seed(&rng, desc ? desc->seed : 0);
    pt_kv_cache_reset(c);
    for (j = n_prompt > cap ? n_prompt - cap : 0; j < n_prompt; j++)
        if ((st = pt_gpt_decode(m, c, prompt[j], &logits)) != PT_OK) return st;
    for (i = 0; i < n_new; i++) {
        out[i] = pt_sample_logits(logits, m->config.vocab_size, desc ? desc->temperature : 1.0f,
                                  desc ? desc->top_k : 0, &rng, c->work);
        if (i + 1 == n_new) break;
        if (c->len == cap) { /* slide: refill with the last cap/2 tokens before out[i] */
            int keep = cap / 2, hist = n_prompt + i; /* history tokens before out[i] */
            pt_kv_cache_reset(c);
            for (j = hist - keep; j < hist; j++)
                if ((st = pt_gpt_decode(m, c, j < n_prompt ? prompt[j] : out[j - n_prompt], NULL)) !=
                    PT_OK)
                    return st;
        }
        if ((st = pt_gpt_decode(m, c, out[i], &logits)) != PT_OK) return st;
    }
    return PT_OK;
}

/* ---- paged KV cache and batched forward (serving) ------------------------ */

PTRAINDEF size_t pt_kv_pages_block_bytes(const pt_gpt *m, int block_tokens) {
    pt__dims d = pt__block_dims(&m->config, 1, 1, 1);
    return 2 * sizeof(float) * (size_t)m->config.n_layer * (size_t)block_tokens * d.Ckv;
}

PTRAINDEF pt_status pt_kv_pages_init(pt_kv_pages *c, const pt_gpt *m, int block_tokens,
                                     int n_blocks, int max_rows) {
    const pt_gpt_config *g = &m->config;
    pt__dims d = pt__block_dims(g, 1, 1, 1);
    size_t R = (size_t)max_rows, cap = (size_t)g->block_size, bytes = 0, nb = (size_t)n_blocks;
    int pass;
    pt_status st;
    memset(c, 0, sizeof *c);
    if (m->place.tp > 1 || m->place.pp > 1)
        return pt__fail(PT_ERR_UNSUPPORTED, "the paged KV cache runs on one rank: load the "
                        "gathered weights into a model without a grid");
    if (block_tokens < 1 || block_tokens > g->block_size)
        return pt__fail(PT_ERR_INVALID_ARG, "block_tokens=%d must be in [1, block_size=%d]",
                        block_tokens, g->block_size);
    if (n_blocks < 1 || max_rows < 1)
        return pt__fail(PT_ERR_INVALID_ARG, "n_blocks=%d and max_rows=%d must be at least 1",
                        n_blocks, max_rows);
    c->block_floats = (size_t)g->n_layer * (size_t)block_tokens * d.Ckv;
    for (pass = 0; pass < 2; pass++) {
        pt_arena *a = &c->arena;
        if (pass == 0) pt_arena_init_meta(a);
        else if ((st = pt_arena_init(a, bytes, m->alloc_ctx)) != PT_OK) return st;
        c->k = PT__F(a, nb * c->block_floats);
        c->v = PT__F(a, nb * c->block_floats);
        c->x = PT__F(a, R * d.C);
        c->ln = PT__F(a, R * d.C);
        c->mean = PT__F(a, R);
        c->rstd = PT__F(a, R);
        c->qkv = PT__F(a, R * d.Q3);
        c->atty = PT__F(a, R * d.C);
        c->res = PT__F(a, R * d.C);
        c->fch = PT__F(a, R * d.Fi);
        c->fcg = PT__F(a, R * d.F);
        c->row_pos = (int *)pt_arena_alloc(a, R * sizeof(int));
        c->row_seq = (int *)pt_arena_alloc(a, R * sizeof(int));
        c->rope = g->pos == PT_POS_ROPE ? PT__F(a, cap * d.hd) : NULL;
        if (a->used < bytes || (pass == 0 && a->used == SIZE_MAX))
            return pt__fail(PT_ERR_OOM, "paged KV cache of %d blocks is too large", n_blocks);
        bytes = a->used;
    }
    if (c->rope)
        pt_rope_table(c->rope, (int)cap, (int)d.hd, pt__rope_theta(g), &g->rope_scaling);
    c->block_tokens = block_tokens, c->n_blocks = n_blocks, c->max_rows = max_rows;
    return PT_OK;
}

PTRAINDEF void pt_kv_pages_free(pt_kv_pages *c) {
    pt_arena_free(&c->arena);
    memset(c, 0, sizeof *c);
}

/* Checks the batch and lays its rows out: row_pos/row_seq, and x = the token
   embeddings (+ learned positions); the row count into *rows. */
static pt_status pt__pages_rows(const pt_gpt *m, pt_kv_pages *c, const pt_kv_seq *seqs,
                                int n_seqs, int *rows, int *n_logits) {
    const pt_gpt_config *g = &m->config;
    int s, i, R = 0, C = g->n_embd, bt = c->block_tokens;
    pt_status st;
    *n_logits = 0;
    for (s = 0; s < n_seqs; s++) {
        const pt_kv_seq *q = &seqs[s];
        if (q->n < 0 || q->pos < 0 || q->pos + q->n > g->block_size || q->logits_from < 0 ||
            q->logits_from > q->n || (q->n && (!q->tokens || !q->blocks)))
            return pt__fail(PT_ERR_RANGE, "sequence %d: n=%d pos=%d logits_from=%d: need "
                            "0 <= logits_from <= n, pos + n <= block_size=%d, tokens and blocks",
                            s, q->n, q->pos, q->logits_from, g->block_size);
        if (q->n > c->max_rows - R)
            return pt__fail(PT_ERR_RANGE, "the batch has more than max_rows=%d new tokens",
                            c->max_rows);
        if ((st = pt__check_tokens(q->tokens, (size_t)q->n, g->vocab_size, "tokens")) != PT_OK)
            return st;
        for (i = 0; q->n && i <= (q->pos + q->n - 1) / bt; i++)
            if (q->blocks[i] < 0 || q->blocks[i] >= c->n_blocks)
                return pt__fail(PT_ERR_RANGE, "sequence %d: blocks[%d]=%d is outside [0, %d)", s,
                                i, q->blocks[i], c->n_blocks);
        for (i = 0; i < q->n; i++, R++) c->row_pos[R] = q->pos + i, c->row_seq[R] = s;
        *n_logits += q->n - q->logits_from;
    }
    PT__OMP(omp parallel for schedule(static))
    for (i = 0; i < R; i++) {
        const pt_kv_seq *q = &seqs[c->row_seq[i]];
        int tok = q->tokens[c->row_pos[i] - q->pos], j;
        for (j = 0; j < C; j++)
            c->x[(size_t)i * C + j] = m->wte[(size_t)tok * C + j] +
                                      (m->wpe ? m->wpe[(size_t)c->row_pos[i] * C + j] : 0.0f);
    }
    *rows = R;
    return PT_OK;
}

/* Layer l's attention for R rows: their keys and values (qkv after the
   rotation) into their blocks, then per row and query head the softmax over
   positions 0..p of its sequence, one pass with a running max m and sum s
   (on a new max m': s <- s e^(m - m'), o <- o e^(m - m')), into atty. */
static void pt__pages_attend(const pt_gpt_config *g, pt_kv_pages *c, const pt_kv_seq *seqs, int l,
                             int R) {
    pt__dims d = pt__block_dims(g, 1, 1, 1);
    int Ckv = (int)d.Ckv, Q3 = (int)d.Q3, C = (int)d.C, hd = (int)d.hd, NH = (int)d.NH;
    int G = (int)(d.NH / d.NKV), bt = c->block_tokens, r, rh;
    size_t lo = (size_t)l * bt * Ckv;
    float scale = 1.0f / sqrtf((float)hd);
    for (r = 0; r < R; r++) {
        const pt_kv_seq *q = &seqs[c->row_seq[r]];
        int p = c->row_pos[r];
        size_t at = (size_t)q->blocks[p / bt] * c->block_floats + lo + (size_t)(p % bt) * Ckv;
        memcpy(c->k + at, c->qkv + (size_t)r * Q3 + C, sizeof(float) * Ckv);
        memcpy(c->v + at, c->qkv + (size_t)r * Q3 + C + Ckv, sizeof(float) * Ckv);
    }
    PT__OMP(omp parallel for schedule(dynamic, 4))
    for (rh = 0; rh < R * NH; rh++) {
        int row = rh / NH, h = rh % NH, p = c->row_pos[row], u, i;
        const pt_kv_seq *q = &seqs[c->row_seq[row]];
        const float *qv = c->qkv + (size_t)row * Q3 + (size_t)h * hd;
        float *o = c->atty + (size_t)row * C + (size_t)h * hd, mx = -INFINITY, sum = 0.0f;
        for (i = 0; i < hd; i++) o[i] = 0.0f;
        for (u = 0; u <= p; u++) {
            size_t at = (size_t)q->blocks[u / bt] * c->block_floats + lo +
                        (size_t)(u % bt) * Ckv + (size_t)(h / G) * hd;
            const float *k = c->k + at, *v = c->v + at;
            float s = 0.0f, w;
            for (i = 0; i < hd; i++) s += qv[i] * k[i];
            s *= scale;
            if (s > mx) {
                float f = expf(mx - s);
                sum *= f;
                for (i = 0; i < hd; i++) o[i] *= f;
                mx = s;
            }
            w = expf(s - mx);
            sum += w;
            for (i = 0; i < hd; i++) o[i] += w * v[i];
        }
        for (i = 0; i < hd; i++) o[i] /= sum;
    }
}

/* pt__proj_forward over R rows, as one GEMM where the fp32 GEMM's rows do not
   depend on the row count (ptrain's kernels, the portable loops), else one
   row at a time (OpenBLAS: its results for a row change with M). */
static void pt__pages_proj(pt_ctx *ctx, const pt_gpt_config *g, float *out, const float *in,
                           const float *w, const float *b, int R, int IN, int OUT) {
    int r;
    if (pt__gemm_current() != PT__GEMM_BLAS) {
        pt__proj_forward(ctx, g, out, in, w, b, R, IN, OUT);
        return;
    }
    for (r = 0; r < R; r++)
        pt__proj_forward(ctx, g, out + (size_t)r * OUT, in + (size_t)r * IN, w, b, 1, IN, OUT);
}

PTRAINDEF pt_status pt_gpt_forward_pages(const pt_gpt *m, pt_kv_pages *c, const pt_kv_seq *seqs,
                                         int n_seqs, float *logits) {
    const pt_gpt_config *g = &m->config;
    pt__dims d = pt__block_dims(g, 1, 1, 1);
    int C = g->n_embd, Q3 = (int)d.Q3, F = (int)d.F, hd = (int)d.hd, R = 0, NL = 0, l, r, s;
    pt_ctx fp = m->ctx, *ctx = &fp; /* the model's workspace, fp32, every shape, no poller */
    pt_status st;
    fp.precision = PT_PRECISION_FP32;
    fp.all_shapes = 1;
    memset(&fp.poll, 0, sizeof fp.poll);
    if (!m->params) return pt__fail(PT_ERR_INVALID_ARG, "model has no memory (built with meta=1)");
    if (!c->k) return pt__fail(PT_ERR_INVALID_ARG, "paged KV cache not initialized");
    if ((st = pt__ag_settle(m)) != PT_OK) return st;
    if ((st = pt__pages_rows(m, c, seqs, n_seqs, &R, &NL)) != PT_OK) return st;
    if (R == 0) return PT_OK;
    for (l = 0; l < g->n_layer; l++) {
        const pt_block_params *w = &m->layers[l];
        pt__norm_forward(g, c->ln, c->mean, c->rstd, c->x, w->ln1_w, w->ln1_b, R, C);
        pt__pages_proj(ctx, g, c->qkv, c->ln, w->qkv_w, w->qkv_b, R, C, Q3);
        for (r = 0; c->rope && r < R; r++) /* each row at its own position */
            pt_rope_forward(c->qkv + (size_t)r * Q3, c->rope + (size_t)c->row_pos[r] * hd, 1, 1,
                            (int)(d.NH + d.NKV), hd, Q3);
        pt__pages_attend(g, c, seqs, l, R);
        pt__pages_proj(ctx, g, c->res, c->atty, w->attn_proj_w, w->attn_proj_b, R, C, C);
        pt_residual_forward(c->res, c->res, c->x, (size_t)R * C);
        pt__norm_forward(g, c->ln, c->mean, c->rstd, c->res, w->ln2_w, w->ln2_b, R, C);
        pt__pages_proj(ctx, g, c->fch, c->ln, w->fc_w, w->fc_b, R, C, (int)d.Fi);
        pt__act_forward(g, c->fcg, c->fch, (size_t)R, (size_t)F);
        pt__pages_proj(ctx, g, c->x, c->fcg, w->fc_proj_w, w->fc_proj_b, R, F, C);
        pt_residual_forward(c->x, c->x, c->res, (size_t)R * C);
    }
    if (!NL) return PT_OK;
    for (s = 0, r = 0, l = 0; s < n_seqs; r += seqs[s].n, s++) { /* the rows wanting logits */
        int n = seqs[s].n - seqs[s].logits_from;
        memmove(c->res + (size_t)l * C, c->x + (size_t)(r + seqs[s].logits_from) * C,
                sizeof(float) * (size_t)n * C);
        l += n;
    }
    pt__norm_forward(g, c->ln, c->mean, c->rstd, c->res, m->lnf_w, m->lnf_b, NL, C);
    if (pt__gemm_current() != PT__GEMM_BLAS)
        pt_tied_head_forward(ctx, logits, c->ln, m->lm_head, NL, C, g->vocab_size);
    else
        for (r = 0; r < NL; r++)
            pt_tied_head_forward(ctx, logits + (size_t)r * g->vocab_size, c->ln + (size_t)r * C,
                                 m->lm_head, 1, C, g->vocab_size);
    return PT_OK;
}

/* ======================================================================== */

/* ======================================================================== */
/* >>schedule (implementation)                                               */
/* ======================================================================== */

/* Zero means 1F1B, or Megatron-LM's interleaved 1F1B when a stage holds
   several chunks of layers (the model's and the simulator's default). */
static pt_schedule_kind pt__sched_resolve(pt_schedule_kind kind, int chunks) {
    return kind ? kind : chunks > 1 ? PT_SCHED_INTERLEAVED : PT_SCHED_1F1B;
}

/* Chunks per stage when the desc says 0: ZB-V's and Chimera's two, else one. */
static int pt__sched_chunks(pt_schedule_kind kind, int chunks) {
    return chunks > 0 ? chunks : kind == PT_SCHED_ZB_V || kind == PT_SCHED_CHIMERA ? 2 : 1;
}

/* The virtual stage of chunk c on stage s of p, which is also the block of
   layers it holds: c*p + s (Megatron-LM's interleaving), the V of ZB-V
   (chunk 0 is s, chunk 1 is 2p-1-s, so the last stage turns the micro-batch
   round and stage 0 holds both ends), or Chimera's replica stage (chunk 0 is
   s of replica 0, chunk 1 is p-1-s of replica 1: p blocks, each on two
   stages). */
static int pt__sched_vstage(pt_schedule_kind kind, int p, int s, int c) {
    if (kind == PT_SCHED_CHIMERA) return c == 0 ? s : p - 1 - s;
    return kind == PT_SCHED_ZB_V ? (c == 0 ? s : 2 * p - 1 - s) : c * p + s;
}

/* Blocks of layers the model is cut into: p x v virtual stages (Chimera: p,
   its two replicas each run through all of them). */
static int pt__sched_blocks(pt_schedule_kind kind, int p, int v) {
    return kind == PT_SCHED_CHIMERA ? p : p * v;
}

/* The stage holding virtual stage vs (the inverse of pt__sched_vstage; not
   for Chimera, whose block vs is on two stages: see pt__sched_at). */
static int pt__sched_owner(pt_schedule_kind kind, int p, int vs) {
    return kind == PT_SCHED_ZB_V ? (vs < p ? vs : 2 * p - 1 - vs) : vs % p;
}

/* The chunk of its stage that virtual stage vs is. */
static int pt__sched_chunk_of(pt_schedule_kind kind, int p, int vs) {
    return kind == PT_SCHED_ZB_V ? vs >= p : vs / p;
}

/* 1 for the schedules whose lists run W apart from B (zero-bubble). */
static int pt__sched_splits(pt_schedule_kind kind) {
    return kind == PT_SCHED_ZB_H1 || kind == PT_SCHED_ZB_H2 || kind == PT_SCHED_ZB_V;
}

/* Chimera's replica of micro-batch k (p even): units of p micro-batches,
   the first p/2 of each down replica 0, the next p/2 up replica 1. */
static int pt__chimera_replica(int p, int k) {
    return (k / (p / 2)) % 2;
}


static const char *pt__sched_names[PT_SCHED_COUNT] = {"default", "gpipe", "1f1b", "interleaved",
                                                       "zb-h1", "zb-h2", "zb-v", "chimera", "2bw"};

PTRAINDEF const char *pt_schedule_kind_name(pt_schedule_kind kind) {
    return (int)kind >= 0 && kind < PT_SCHED_COUNT ? pt__sched_names[kind] : "(unknown)";
}

PTRAINDEF pt_status pt_schedule_kind_parse(const char *name, pt_schedule_kind *out) {
    int k;
    for (k = 1; k < PT_SCHED_COUNT; k++)
        if (name && strcmp(name, pt__sched_names[k]) == 0) {
            *out = (pt_schedule_kind)k;
            return PT_OK;
        }
    return pt__fail(PT_ERR_CONFIG, "unknown schedule '%s' (known: gpipe, 1f1b, interleaved, "
                    "zb-h1, zb-h2, zb-v, chimera, 2bw)", name ? name : "(null)");
}

/* A micro-batch's path: it passes nv virtual stages (p*v; Chimera: its
   replica's p); virtual stage vs of micro-batch k is on stage
   pt__sched_at and is that stage's chunk pt__sched_chunk_at. For Chimera
   the "virtual stage" of chunk c on stage s is its replica's stage (s, or
   p-1-s for chunk 1), which is also the block of layers it holds. */
static int pt__sched_nv(const pt_schedule *s) {
    return pt__sched_blocks(s->kind, s->stages, s->chunks);
}
static int pt__sched_vs(const pt_schedule *s, int stage, int chunk) {
    return pt__sched_vstage(s->kind, s->stages, stage, chunk);
}
static int pt__sched_at(const pt_schedule *s, int micro, int vs) {
    if (s->kind == PT_SCHED_CHIMERA)
        return pt__chimera_replica(s->stages, micro) == 0 ? vs : s->stages - 1 - vs;
    return pt__sched_owner(s->kind, s->stages, vs);
}
static int pt__sched_chunk_at(const pt_schedule *s, int micro, int vs) {
    if (s->kind == PT_SCHED_CHIMERA) return pt__chimera_replica(s->stages, micro);
    return pt__sched_chunk_of(s->kind, s->stages, vs);
}

/* Appends an action to stage s's list (capacity checked by the builder). */
static void pt__sched_add(pt_schedule *s, int stage, int kind, int micro, int chunk, int peer) {
    pt_action *a = &s->list[stage][s->count[stage]++];
    a->kind = kind, a->micro = micro, a->chunk = chunk, a->peer = peer, a->version = 0;
}

/* One compute action with the messages around it: a forward receives its
   input from the previous virtual stage's owner and sends its output on; a
   backward receives its output gradient and sends its input gradient back;
   nothing travels between two virtual stages of one stage (ZB-V's turn).
   Virtual stage of (stage s, chunk c): pt__sched_vstage. */
static void pt__sched_compute(pt_schedule *s, int stage, int kind, int micro, int chunk) {
    int vs = pt__sched_vs(s, stage, chunk), last = pt__sched_nv(s) - 1;
    int prev = vs > 0 ? pt__sched_at(s, micro, vs - 1) : -1;
    int next = vs < last ? pt__sched_at(s, micro, vs + 1) : -1;
    if (kind == PT_ACT_F && vs > 0 && prev != stage)
        pt__sched_add(s, stage, PT_ACT_RECV_ACT, micro, chunk, prev);
    if (kind == PT_ACT_B && vs < last && next != stage)
        pt__sched_add(s, stage, PT_ACT_RECV_GRAD, micro, chunk, next);
    pt__sched_add(s, stage, kind, micro, chunk, -1);
    if (kind == PT_ACT_F && vs < last && next != stage)
        pt__sched_add(s, stage, PT_ACT_SEND_ACT, micro, chunk, next);
    if (kind == PT_ACT_B && vs > 0 && prev != stage)
        pt__sched_add(s, stage, PT_ACT_SEND_GRAD, micro, chunk, prev);
}

/* Megatron-LM's order of the k-th forward (or backward) of a stage in the
   interleaved schedule: groups of p micro-batches go through chunk 0, then
   chunk 1, ...; backwards walk the chunks from the last. */
static void pt__interleaved_slot(const pt_schedule *s, int k, int backward, int *micro,
                                 int *chunk) {
    int p = s->stages, v = s->chunks;
    *chunk = (k % (p * v)) / p;
    if (backward) *chunk = v - 1 - *chunk;
    *micro = (k / (p * v)) * p + k % p;
}

/* Ends every stage's list with the optimizer step (2BW: its last). */
static pt_status pt__sched_close(pt_schedule *s) {
    int st;
    for (st = 0; st < s->stages; st++) pt__sched_add(s, st, PT_ACT_OPT, -1, -1, -1);
    return PT_OK;
}

/* GPipe: every forward, then every backward. */
static pt_status pt__build_gpipe(pt_schedule *s) {
    int st, k;
    for (st = 0; st < s->stages; st++) {
        for (k = 0; k < s->micro; k++) pt__sched_compute(s, st, PT_ACT_F, k, 0);
        for (k = 0; k < s->micro; k++) pt__sched_compute(s, st, PT_ACT_B, k, 0);
    }
    return pt__sched_close(s);
}

/* 1F1B's order: stage s forwards min(p-s-1, m) micro-batches (the warm-up),
   then one forward one backward, then the backwards left. With w_lag (ZB-H1)
   W is split from B and stage s runs W(k) after B(k+s); with batches (2BW)
   an update follows the B that ends each batch of p micro-batches but the
   last. */
static pt_status pt__sched_1f1b(pt_schedule *s, int w_lag, int batches) {
    int p = s->stages, m = s->micro, st, k;
    for (st = 0; st < p; st++) {
        int warm = p - st - 1 < m ? p - st - 1 : m;
        for (k = 0; k < warm; k++) pt__sched_compute(s, st, PT_ACT_F, k, 0);
        for (k = 0; k < m; k++) {
            if (k < m - warm) pt__sched_compute(s, st, PT_ACT_F, warm + k, 0);
            pt__sched_compute(s, st, PT_ACT_B, k, 0);
            if (w_lag && k >= st) pt__sched_add(s, st, PT_ACT_W, k - st, 0, -1);
            if (batches && (k + 1) % p == 0 && k + 1 < m)
                pt__sched_add(s, st, PT_ACT_OPT, -1, -1, -1);
        }
        for (k = m - st > 0 ? m - st : 0; w_lag && k < m; k++)
            pt__sched_add(s, st, PT_ACT_W, k, 0, -1);
    }
    return pt__sched_close(s);
}

static pt_status pt__build_1f1b(pt_schedule *s) {
    return pt__sched_1f1b(s, 0, 0);
}

/* ZB-H1 (Qi et al. 2023): 1F1B's order with B split from W, and stage s
   running W(k) after B(k+s): the chain of B's runs ahead, the late W's fill
   the cool-down, and every stage holds at most p micro-batches (stage 0's
   count under 1F1B). */
static pt_status pt__build_zb_h1(pt_schedule *s) {
    return pt__sched_1f1b(s, 1, 0);
}

/* PipeDream-2BW: 1F1B's order, never flushed: after the B that ends batch t
   (micro-batches tp..tp+p-1) the stage makes version t+1 = W(t) - lr grad
   f(W(t-1)); batch t runs at version max(t-1, 0). */
static pt_status pt__build_2bw(pt_schedule *s) {
    int p = s->stages, st, k, made;
    pt__sched_1f1b(s, 0, 1);
    for (st = 0; st < p; st++)
        for (k = 0, made = 0; k < s->count[st]; k++) {
            pt_action *a = &s->list[st][k];
            if (a->kind == PT_ACT_OPT) a->version = ++made;
            else if (a->kind == PT_ACT_F || a->kind == PT_ACT_B)
                a->version = a->micro / p > 1 ? a->micro / p - 1 : 0;
        }
    return PT_OK;
}

/* Megatron-LM's interleaved 1F1B: a longer warm-up of 2(p-s-1) + (v-1)p
   forwards, then one forward one backward, in pt__interleaved_slot's
   order. */
static pt_status pt__build_interleaved(pt_schedule *s) {
    int p = s->stages, v = s->chunks, total = s->micro * v, st, k, micro, chunk;
    for (st = 0; st < p; st++) {
        int warm = (p - st - 1) * 2 + (v - 1) * p;
        if (warm > total) warm = total;
        for (k = 0; k < warm; k++) {
            pt__interleaved_slot(s, k, 0, &micro, &chunk);
            pt__sched_compute(s, st, PT_ACT_F, micro, chunk);
        }
        for (k = 0; k < total - warm; k++) {
            pt__interleaved_slot(s, warm + k, 0, &micro, &chunk);
            pt__sched_compute(s, st, PT_ACT_F, micro, chunk);
            pt__interleaved_slot(s, k, 1, &micro, &chunk);
            pt__sched_compute(s, st, PT_ACT_B, micro, chunk);
        }
        for (k = total - warm; k < total; k++) {
            pt__interleaved_slot(s, k, 1, &micro, &chunk);
            pt__sched_compute(s, st, PT_ACT_B, micro, chunk);
        }
    }
    return pt__sched_close(s);
}

/* ZB-H2 and ZB-V as the zero-bubble paper builds its schedules: time runs
   in unit slots (F, B, W one each) and at every slot each stage takes the
   first action it may, in a fixed preference; a stage holds at most cap
   micro-batch chunks (forwarded, W not yet run).
     ZB-H2 (cap 2p-1): B, then F, then W. The first stage forwards 2p-1
       micro-batches before its first B: the warm-up fills what 1F1B leaves
       idle, W's fill the tail, and each stage s runs [s, s + 3m) unbroken.
     ZB-V (cap 2p, the activations of p whole-stage micro-batches, 1F1B's
       first stage): W first when at the cap, else F (the later chunk first,
       so micro-batches turn round), then B (the earlier chunk first), then
       W; each stage s runs [s, s + 6m) unbroken.
   Both are unbroken for m >= 2p - 1 (the unit tests hold every p <= 8,
   m <= 16 to it) and valid for every m. */
static pt_status pt__sched_greedy(pt_schedule *s) {
    int p = s->stages, v = s->chunks, m = s->micro, V = p * v, zbv = s->kind == PT_SCHED_ZB_V;
    int cap = zbv ? 2 * p : 2 * p - 1, t, st, c, left = 3 * m * V;
    size_t nkeys = (size_t)m * V;
    /* per (micro, virtual stage): slot F and B end (-1 not yet); per stage
       and chunk the next micro-batch to forward and to backpropagate; per
       stage its W queue (micro*v + chunk, in B's order), head, tail, live */
    int *fd = (int *)pt__malloc(sizeof(int) * (2 * nkeys + 2 * (size_t)p * v + nkeys +
                                               4 * (size_t)p), s->alloc_ctx);
    int *bd = fd + nkeys, *nf = bd + nkeys, *nb = nf + p * v, *wq = nb + p * v;
    int *wh = wq + nkeys, *wt = wh + p, *live = wt + p, *pick = live + p;
    if (!fd) return pt__fail(PT_ERR_OOM, "cannot allocate the schedule builder's state");
    memset(nf, 0, sizeof(int) * (2 * (size_t)p * v));
    memset(wh, 0, sizeof(int) * 4 * (size_t)p);
    for (t = 0; t < (int)(2 * nkeys); t++) fd[t] = -1;
    for (t = 0; left > 0 && t <= 3 * m * V * p; t++) {
        for (st = 0; st < p; st++) { /* decide every stage from slot t's state */
            int f = -1, b = -1, w = wt[st] > wh[st], pref;
            for (c = v - 1; c >= 0; c--) { /* F: the later chunk first */
                int vs = pt__sched_vstage(s->kind, p, st, c), mi = nf[st * v + c];
                size_t key = (size_t)mi * V + (size_t)vs;
                if (f < 0 && mi < m && live[st] < cap && (vs == 0 || (fd[key - 1] >= 0 &&
                                                                      fd[key - 1] <= t)))
                    f = c;
            }
            for (c = 0; c < v; c++) { /* B: the earlier chunk first */
                int vs = pt__sched_vstage(s->kind, p, st, c), mi = nb[st * v + c];
                size_t key = (size_t)mi * V + (size_t)vs;
                if (b < 0 && mi < m && fd[key] >= 0 && fd[key] <= t &&
                    (vs == V - 1 || (bd[key + 1] >= 0 && bd[key + 1] <= t)))
                    b = c;
            }
            pref = zbv ? (w && live[st] >= cap ? 2 : f >= 0 ? 0 : b >= 0 ? 1 : w ? 2 : -1)
                       : (b >= 0 ? 1 : f >= 0 ? 0 : w ? 2 : -1);
            pick[st] = pref < 0 ? -1 : pref * v + (pref == 0 ? f : pref == 1 ? b : 0);
        }
        for (st = 0; st < p; st++) { /* then run them: their ends are seen from t + 1 */
            int what = pick[st] < 0 ? -1 : pick[st] / v, mi, vs, q;
            if (what < 0) continue;
            c = pick[st] % v;
            if (what == 2) {
                q = wq[st * m * v + wh[st]++];
                pt__sched_add(s, st, PT_ACT_W, q / v, q % v, -1);
                live[st]--;
            } else {
                mi = what == 0 ? nf[st * v + c]++ : nb[st * v + c]++;
                vs = pt__sched_vstage(s->kind, p, st, c);
                (what == 0 ? fd : bd)[(size_t)mi * V + (size_t)vs] = t + 1;
                pt__sched_compute(s, st, what == 0 ? PT_ACT_F : PT_ACT_B, mi, c);
                if (what == 0) live[st]++;
                else wq[st * m * v + wt[st]++] = mi * v + c;
            }
            left--;
        }
    }
    pt__free(fd, s->alloc_ctx);
    return left ? pt__fail(PT_ERR_CONFIG, "%s: the builder did not finish p=%d m=%d",
                           pt_schedule_kind_name(s->kind), p, m)
                : pt__sched_close(s);
}

/* Chimera in unit time (F one slot, B two): each stage takes, whenever it
   is free, the ready action of the earliest position within its replica's
   half-unit (micro-batch k mod p/2), a B before an F, then the lowest k, so
   the two replicas' micro-batches interleave as in the paper's basic unit.
   For m = p this is the paper's count of D - 2 bubbles a worker (in slots
   of F = B; here B is two slots: 2(p-2) idle slots, unit-tested). Past one
   unit (m > p) nothing holds a replica back, so the units overlap: fewer
   idle slots than 1F1B's, at up to 2p micro-batches' activations on a stage
   (admitting only p/2 of a replica at once keeps p but idles more than 1F1B:
   measured p = 4, 8 at m = 32). Then each stage all-reduces its gradients
   with the stage holding the same layers in the other replica (stage
   p-1-s). */
static pt_status pt__sched_chimera(pt_schedule *s) {
    int p = s->stages, m = s->micro, h = p / 2, t, w, r, left = 2 * m;
    size_t nkeys = (size_t)m * p;
    int *fd = (int *)pt__malloc(sizeof(int) * (2 * nkeys + 5 * (size_t)p), s->alloc_ctx);
    int *bd = fd + nkeys, *nf = bd + nkeys, *nb = nf + 2 * p, *free_at = nb + 2 * p;
    if (!fd) return pt__fail(PT_ERR_OOM, "cannot allocate the schedule builder's state");
    for (t = 0; t < (int)(2 * nkeys); t++) fd[t] = -1;
    memset(nf, 0, sizeof(int) * 5 * (size_t)p);
    left = 2 * m * p; /* an F and a B of every micro-batch on each of its p stages */
    for (t = 0; left > 0 && t <= 3 * m * p * 2; t++)
        for (w = 0; w < p; w++) {
            int best = -1, bkind = 0, bkey = 0, br = 0;
            if (free_at[w] > t) continue;
            for (r = 0; r < 2; r++) {
                int j = r == 0 ? w : p - 1 - w, kind;
                for (kind = 0; kind < 2; kind++) { /* 0: B, 1: F */
                    int n = kind ? nf[w * 2 + r] : nb[w * 2 + r], k = (n / h) * p + r * h + n % h;
                    size_t key = (size_t)k * p + (size_t)j;
                    int ready = n < m / 2 &&
                                (kind ? j == 0 || (fd[key - 1] >= 0 && fd[key - 1] <= t)
                                      : fd[key] >= 0 && fd[key] <= t &&
                                            (j == p - 1 || (bd[key + 1] >= 0 && bd[key + 1] <= t)));
                    int order = ((k % h) * 2 + kind) * m + k;
                    if (ready && (best < 0 || order < bkey)) best = k, bkind = kind, bkey = order, br = r;
                }
            }
            if (best < 0) continue;
            r = br == 0 ? w : p - 1 - w; /* the replica's stage */
            if (bkind) fd[(size_t)best * p + (size_t)r] = t + 1, nf[w * 2 + br]++;
            else bd[(size_t)best * p + (size_t)r] = t + 2, nb[w * 2 + br]++;
            free_at[w] = t + (bkind ? 1 : 2);
            pt__sched_compute(s, w, bkind ? PT_ACT_F : PT_ACT_B, best, br);
            left--;
        }
    for (w = 0; w < p; w++) pt__sched_add(s, w, PT_ACT_REDUCE, -1, -1, p - 1 - w);
    pt__free(fd, s->alloc_ctx);
    return left ? pt__fail(PT_ERR_CONFIG, "chimera: the builder did not finish p=%d m=%d", p, m)
                : pt__sched_close(s);
}

PTRAINDEF void pt_schedule_free(pt_schedule *s) {
    void *ctx = s->alloc_ctx;
    pt__free(s->count, ctx);
    pt__free(s->list, ctx);
    pt__free(s->storage, ctx);
    memset(s, 0, sizeof *s);
    s->alloc_ctx = ctx;
}

/* 1 if the schedule runs W apart from B (zero-bubble). */
static int pt__sched_split(const pt_schedule *s) {
    int st, k;
    for (st = 0; st < s->stages; st++)
        for (k = 0; k < s->count[st]; k++)
            if (s->list[st][k].kind == PT_ACT_W) return 1;
    return 0;
}

/* Unit-time slots of an action: F 1; B 2, or 1 when W is split off; W 1;
   messages and the optimizer step none. */
static int pt__sched_cost(int kind, int split) {
    return kind == PT_ACT_F || kind == PT_ACT_W ? 1 : kind == PT_ACT_B ? (split ? 1 : 2) : 0;
}

static const char *pt__act_names[PT_ACT_COUNT] = {
    "forward", "backward", "weight gradient", "send activation", "receive activation",
    "send gradient", "receive gradient", "optimizer step", "replica all-reduce"};

/* Seconds (or unit-time slots) an action takes on its stage; a send's time
   ends when its receiver may have the message. */
typedef struct pt__sched_costs {
    double (*cost)(void *ctx, int stage, const pt_action *a);
    void *ctx;
} pt__sched_costs;

typedef struct pt__sched_family pt__sched_family; /* below: a family's builder and rules */

/* The engine's state while it runs a schedule (pt__sched_run). Per (micro,
   virtual stage), key micro*V + vs: when its F, B and W ended (-1 not yet),
   when its activation and its input gradient were sent (-1 none, -2 taken)
   and received. Per stage: its clock, its compute span, where it is in its
   list. */
typedef struct pt__sched_state {
    const pt_schedule *s;
    const pt__sched_family *fam;  /* the schedule's rules */
    const pt__sched_costs *costs; /* NULL: unit time */
    pt_schedule_report *rep;      /* may be NULL */
    int p, v, m, V, split;
    double *fd, *bd, *wd, *act_msg, *grad_msg, *have_act, *have_grad;
    double *clock, *run0, *run1, *busy;
    int *pc, *live, *first; /* first: where the stage's start slots begin */
    int *lastb; /* the key whose input gradient the stage's residual-gradient
                   buffer holds (-1: none) */
    int *red;   /* Chimera: 1 once the stage reached its replica all-reduce, 2 past it */
    double *red_at; /* Chimera: when it reached it */
    /* PipeDream-2BW's weight versions: per stage the newest made, per key the
       one its F used, per stage and version the micro-batches in flight on
       it; with costs (the simulator), when each stage reached the OPT making
       each version: the executor's update agrees across the stages (the
       clipping norm, the guard, wte's two copies), so every stage waits for
       the last */
    int NV, *latest, *fver, *vflight;
    double *obar;
} pt__sched_state;

/* The action being run: where, what, and when it starts and for how long. */
typedef struct pt__sched_act {
    const pt_action *a;
    const char *what;
    int st, mi, c, vs;
    int local_in, local_out; /* the neighbouring virtual stage lives here: no message */
    size_t key;
    double at, cost;
} pt__sched_act;

/* What a rule says of an action: it ran, the stage waits at it (nothing
   changed that running it again would redo), it is wrong (pt_last_error says
   why), or (an update) the flushed rules go on. */
enum { PT__SCHED_DONE, PT__SCHED_WAIT, PT__SCHED_BAD, PT__SCHED_FLUSH };
#define PT__REFUSE(...)                                                                      \
    do {                                                                                     \
        pt__fail(PT_ERR_CONFIG, __VA_ARGS__);                                                \
        return PT__SCHED_BAD;                                                                  \
    } while (0)

/* A schedule family: its builder (every stage's list, ending with the
   optimizer step) and its rules over the engine's (pt__sched_run), hooks the
   engine calls at fixed points of an action (NULL: none, the flushed
   schedules'), each returning a PT__SCHED_ code. */
struct pt__sched_family {
    pt_status (*build)(pt_schedule *s);
    pt_status (*init)(pt__sched_state *r);                    /* its state */
    int (*admit)(pt__sched_state *r, const pt__sched_act *x);  /* before an F, B, W, message */
    int (*computed)(pt__sched_state *r, pt__sched_act *x);     /* after an F, B or W */
    int (*reduce)(pt__sched_state *r, pt__sched_act *x);       /* its own action, REDUCE */
    int (*update)(pt__sched_state *r, pt__sched_act *x);       /* OPT: DONE mid-list, or FLUSH */
    int (*synced)(pt__sched_state *r, const pt__sched_act *x); /* an OPT ending the list */
};

static double pt__sched_dur(const pt__sched_state *r, const pt__sched_act *x) {
    return r->costs ? r->costs->cost(r->costs->ctx, x->st, x->a)
                    : pt__sched_cost(x->a->kind, r->split);
}

/* The first (micro-batch, chunk) of stage st whose F, B or W (when split)
   has not run, *part being that kind; 0 when none. Only the micro-batches
   whose path passes the chunk count (Chimera: the chunk of their replica). */
static int pt__sched_pending(const pt__sched_state *r, int st, int *micro, int *chunk, int *part) {
    int k, mi;
    for (k = 0; k < r->v; k++)
        for (mi = 0; mi < r->m; mi++) {
            int vs = pt__sched_vs(r->s, st, k);
            size_t q = (size_t)mi * r->V + (size_t)vs;
            if (pt__sched_chunk_at(r->s, mi, vs) != k) continue;
            if (r->fd[q] < 0 || r->bd[q] < 0 || (r->split && r->wd[q] < 0)) {
                *micro = mi, *chunk = k;
                *part = r->fd[q] < 0 ? PT_ACT_F : r->bd[q] < 0 ? PT_ACT_B : PT_ACT_W;
                return 1;
            }
        }
    return 0;
}

/* F: once, after its input arrived (received, or made on this stage by the
   previous virtual stage); its activations are held until its B (W when
   split). */
static int pt__sched_forward(pt__sched_state *r, pt__sched_act *x) {
    int st = x->st, rc;
    size_t key = x->key;
    if (r->fd[key] >= 0)
        PT__REFUSE("stage %d: forward of micro-batch %d chunk %d twice", st, x->mi, x->c);
    if (x->vs > 0 && (!x->local_in ? r->have_act[key] < 0 : r->fd[key - 1] < 0))
        PT__REFUSE("stage %d, action %d: forward of micro-batch %d chunk %d before its "
                   "input arrived%s", st, r->pc[st], x->mi, x->c,
                   !x->local_in ? " (no receive of the activation before it)" : "");
    if (x->vs > 0 && !x->local_in && r->have_act[key] > x->at) x->at = r->have_act[key];
    if (x->local_in && r->fd[key - 1] > x->at) x->at = r->fd[key - 1];
    x->cost = pt__sched_dur(r, x);
    r->fd[key] = x->at + x->cost;
    r->live[st]++;
    if (r->fam->computed && (rc = r->fam->computed(r, x)) != PT__SCHED_DONE) return rc;
    if (r->rep && r->live[st] > r->rep->peak_inflight[st]) r->rep->peak_inflight[st] = r->live[st];
    return PT__SCHED_DONE;
}

/* B: once, after its F and its output gradient (received, or made on this
   stage by the next virtual stage's B just before: a turn's gradient stays
   in the executor's one residual-gradient buffer). */
static int pt__sched_backward(pt__sched_state *r, pt__sched_act *x) {
    int st = x->st, mi = x->mi, c = x->c;
    size_t key = x->key;
    if (r->fd[key] < 0) PT__REFUSE("stage %d, action %d: backward of micro-batch %d chunk %d "
                                   "before its forward", st, r->pc[st], mi, c);
    if (r->bd[key] >= 0)
        PT__REFUSE("stage %d: backward of micro-batch %d chunk %d twice", st, mi, c);
    if (x->vs < r->V - 1 && (!x->local_out ? r->have_grad[key] < 0 : r->bd[key + 1] < 0))
        PT__REFUSE("stage %d, action %d: backward of micro-batch %d chunk %d before its "
                   "output gradient arrived%s", st, r->pc[st], mi, c,
                   !x->local_out ? " (no receive of the gradient before it)" : "");
    if (x->vs < r->V - 1 && !x->local_out && r->have_grad[key] > x->at) x->at = r->have_grad[key];
    if (x->local_out && r->bd[key + 1] > x->at) x->at = r->bd[key + 1];
    if (x->local_out && r->p > 1 && r->lastb[st] != (int)key + 1)
        PT__REFUSE("stage %d, action %d: backward of micro-batch %d chunk %d does not "
                   "follow the backward of virtual stage %d it takes its gradient "
                   "from (another backward or a receive ran between)", st, r->pc[st],
                   mi, c, x->vs + 1);
    r->lastb[st] = (int)key;
    x->cost = pt__sched_dur(r, x);
    r->bd[key] = x->at + x->cost;
    if (!r->split) r->live[st]--;
    return r->fam->computed ? r->fam->computed(r, x) : PT__SCHED_DONE;
}

/* W: once, after its B. */
static int pt__sched_weight(pt__sched_state *r, pt__sched_act *x) {
    int st = x->st;
    size_t key = x->key;
    if (r->bd[key] < 0) PT__REFUSE("stage %d, action %d: weight gradient of micro-batch %d "
                                   "chunk %d before its backward", st, r->pc[st], x->mi, x->c);
    if (r->wd[key] >= 0) PT__REFUSE("stage %d: weight gradient of micro-batch %d chunk %d twice",
                                    st, x->mi, x->c);
    x->cost = pt__sched_dur(r, x);
    r->wd[key] = x->at + x->cost;
    r->live[st]--;
    return r->fam->computed ? r->fam->computed(r, x) : PT__SCHED_DONE;
}

/* A send: once, to the stage holding the next virtual stage (the previous
   for a gradient), after computing what it carries; sends are buffered. */
static int pt__sched_send(pt__sched_state *r, pt__sched_act *x) {
    const pt_action *a = x->a;
    int st = x->st, fwd = a->kind == PT_ACT_SEND_ACT, to = fwd ? x->vs + 1 : x->vs - 1;
    double *msg = fwd ? r->act_msg : r->grad_msg;
    if (to < 0 || to >= r->V || a->peer != pt__sched_at(r->s, x->mi, to) || a->peer == st)
        PT__REFUSE("stage %d, action %d: %s of micro-batch %d chunk %d goes to stage %d, "
                   "but virtual stage %d is on stage %d%s", st, r->pc[st], x->what, x->mi, x->c,
                   a->peer, to, to < 0 || to >= r->V ? -1 : pt__sched_at(r->s, x->mi, to),
                   a->peer == st ? " (itself: no message)" : "");
    if ((fwd ? r->fd[x->key] : r->bd[x->key]) < 0)
        PT__REFUSE("stage %d, action %d: %s of micro-batch %d chunk %d before computing it",
                   st, r->pc[st], x->what, x->mi, x->c);
    if (msg[x->key] != -1)
        PT__REFUSE("stage %d: %s of micro-batch %d chunk %d twice", st, x->what, x->mi, x->c);
    x->cost = pt__sched_dur(r, x);
    msg[x->key] = x->at + x->cost; /* when the receiver may have it */
    return PT__SCHED_DONE;
}

/* A receive: once, from the stage holding the previous virtual stage (the
   next for a gradient); waits until the message was sent. */
static int pt__sched_recv(pt__sched_state *r, pt__sched_act *x) {
    const pt_action *a = x->a;
    int st = x->st, fwd = a->kind == PT_ACT_RECV_ACT, from = fwd ? x->vs - 1 : x->vs + 1;
    double *msg = fwd ? r->act_msg : r->grad_msg, *have = fwd ? r->have_act : r->have_grad;
    size_t src;
    if (from < 0 || from >= r->V || a->peer != pt__sched_at(r->s, x->mi, from) || a->peer == st)
        PT__REFUSE("stage %d, action %d: %s of micro-batch %d chunk %d comes from stage %d, "
                   "but virtual stage %d is on stage %d%s", st, r->pc[st], x->what, x->mi, x->c,
                   a->peer, from, from < 0 || from >= r->V ? -1 : pt__sched_at(r->s, x->mi, from),
                   a->peer == st ? " (itself: no message)" : "");
    src = (size_t)x->mi * r->V + (size_t)from;
    if (msg[src] == -2)
        PT__REFUSE("stage %d: %s of micro-batch %d chunk %d twice", st, x->what, x->mi, x->c);
    if (msg[src] == -1) return PT__SCHED_WAIT; /* not sent yet */
    if (msg[src] > x->at) x->at = msg[src];
    msg[src] = -2;
    have[x->key] = x->at;
    if (!fwd) r->lastb[st] = -1; /* the received gradient takes the buffer */
    return PT__SCHED_DONE;
}

/* The optimizer step: the family's update rule (2BW's mid-list versions),
   then the flush: it ends the list, after every F, B and W of the stage. */
static int pt__sched_opt(pt__sched_state *r, pt__sched_act *x) {
    int st = x->st, rc = r->fam->update ? r->fam->update(r, x) : PT__SCHED_FLUSH, mi, k, part;
    if (rc != PT__SCHED_FLUSH && rc != PT__SCHED_DONE) return rc;
    x->cost = pt__sched_dur(r, x);
    if (rc == PT__SCHED_DONE) return rc; /* mid-list: no flush */
    if (r->pc[st] != r->s->count[st] - 1)
        PT__REFUSE("stage %d: the optimizer step is action %d of %d, not the last", st, r->pc[st],
                   r->s->count[st]);
    if (r->fam->synced && (rc = r->fam->synced(r, x)) != PT__SCHED_DONE) return rc;
    if (pt__sched_pending(r, st, &mi, &k, &part))
        PT__REFUSE("stage %d: the optimizer step comes before the %s of micro-batch %d chunk %d",
                   st, pt__act_names[part], mi, k);
    return PT__SCHED_DONE;
}

/* Runs stage st's next action if its rules allow it now. */
static int pt__sched_step(pt__sched_state *r, int st, double *start) {
    const pt_schedule *s = r->s;
    pt__sched_act x;
    int kind, rc;
    x.a = &s->list[st][r->pc[st]], x.st = st, kind = x.a->kind;
    x.c = x.a->chunk, x.mi = x.a->micro;
    x.vs = x.c >= 0 && x.c < r->v ? pt__sched_vs(s, st, x.c) : 0;
    x.local_in = x.vs > 0 && pt__sched_at(s, x.mi, x.vs - 1) == st;
    x.local_out = x.vs < r->V - 1 && pt__sched_at(s, x.mi, x.vs + 1) == st;
    x.key = (size_t)x.mi * r->V + (size_t)x.vs;
    x.at = r->clock[st], x.cost = 0.0;
    x.what = kind >= 0 && kind < PT_ACT_COUNT ? pt__act_names[kind] : "?";
    if (kind < 0 || kind >= PT_ACT_COUNT)
        PT__REFUSE("stage %d, action %d: unknown kind %d", st, r->pc[st], kind);
    if (kind != PT_ACT_OPT && kind != PT_ACT_REDUCE) {
        if (x.mi < 0 || x.mi >= r->m || x.c < 0 || x.c >= r->v)
            PT__REFUSE("stage %d, action %d (%s): micro-batch %d or chunk %d out of range "
                       "(m=%d, v=%d)", st, r->pc[st], x.what, x.mi, x.c, r->m, r->v);
        if (r->fam->admit && (rc = r->fam->admit(r, &x)) != PT__SCHED_DONE) return rc;
    }
    switch (kind) {
    case PT_ACT_F: rc = pt__sched_forward(r, &x); break;
    case PT_ACT_B: rc = pt__sched_backward(r, &x); break;
    case PT_ACT_W: rc = pt__sched_weight(r, &x); break;
    case PT_ACT_SEND_ACT:
    case PT_ACT_SEND_GRAD: rc = pt__sched_send(r, &x); break;
    case PT_ACT_RECV_ACT:
    case PT_ACT_RECV_GRAD: rc = pt__sched_recv(r, &x); break;
    case PT_ACT_REDUCE:
        if (!r->fam->reduce)
            PT__REFUSE("stage %d, action %d: a replica all-reduce with stage %d in a schedule "
                       "without replicas", st, r->pc[st], x.a->peer);
        rc = r->fam->reduce(r, &x);
        break;
    default: rc = pt__sched_opt(r, &x); break;
    }
    if (rc != PT__SCHED_DONE) return rc;
    if (start) start[r->first[st] + r->pc[st]] = x.at;
    if (kind == PT_ACT_F || kind == PT_ACT_B || kind == PT_ACT_W) {
        if (r->run0[st] < 0) r->run0[st] = x.at;
        r->run1[st] = x.at + x.cost, r->busy[st] += x.cost;
    }
    r->clock[st] = x.at + x.cost;
    r->pc[st]++;
    return PT__SCHED_DONE;
}

/* Chimera: every action of micro-batch k runs on the chunk of its replica. */
static int pt__chimera_admit(pt__sched_state *r, const pt__sched_act *x) {
    if (x->c != pt__chimera_replica(r->p, x->mi))
        PT__REFUSE("stage %d, action %d (%s): micro-batch %d travels replica %d, not "
                   "chunk %d's", x->st, r->pc[x->st], x->what, x->mi,
                   pt__chimera_replica(r->p, x->mi), x->c);
    return PT__SCHED_DONE;
}

/* Chimera's replica all-reduce: stage s with stage p-1-s, which holds the
   same layers in the other replica, after all its backwards (and weight
   gradients); a collective, it ends when both reached it. */
static int pt__chimera_reduce(pt__sched_state *r, pt__sched_act *x) {
    int st = x->st, peer = x->a->peer, mi, k, part;
    if (peer != r->p - 1 - st)
        PT__REFUSE("stage %d, action %d: a replica all-reduce with stage %d, but the same layers "
                   "are on stage p-1-s", st, r->pc[st], peer);
    if (r->red[st] == 2) PT__REFUSE("stage %d: the replica all-reduce twice", st);
    if (!r->red[st] && pt__sched_pending(r, st, &mi, &k, &part)) /* F missing: its B is too */
        PT__REFUSE("stage %d: the replica all-reduce comes before the %s of micro-batch %d "
                   "chunk %d", st, part == PT_ACT_W ? "weight gradient" : "backward", mi, k);
    if (!r->red[st]) r->red_at[st] = x->at, r->red[st] = 1;
    if (!r->red[peer]) return PT__SCHED_WAIT; /* the collective waits for its peer */
    x->at = r->red_at[st] > r->red_at[peer] ? r->red_at[st] : r->red_at[peer];
    x->cost = pt__sched_dur(r, x);
    r->red[st] = 2;
    return PT__SCHED_DONE;
}

/* Chimera: the optimizer step updates weights both replicas reduced. */
static int pt__chimera_synced(pt__sched_state *r, const pt__sched_act *x) {
    if (r->red[x->st] != 2)
        PT__REFUSE("stage %d: the optimizer step comes before the replica gradient "
                   "all-reduce with stage %d (same layers, other replica)", x->st,
                   r->p - 1 - x->st);
    return PT__SCHED_DONE;
}

static pt_status pt__2bw_init(pt__sched_state *r) {
    size_t n = (size_t)r->p + (size_t)r->m * r->V + (size_t)r->p * (r->m / r->p + 2), i;
    r->NV = r->m / r->p + 2;
    if (!(r->latest = (int *)pt__malloc(sizeof(int) * n, r->s->alloc_ctx))) return PT_ERR_OOM;
    memset(r->latest, 0, sizeof(int) * n);
    r->fver = r->latest + r->p, r->vflight = r->fver + (size_t)r->m * r->V;
    if (!r->costs) return PT_OK;
    r->obar = (double *)pt__malloc(sizeof(double) * (size_t)r->p * r->NV, r->s->alloc_ctx);
    if (!r->obar) return PT_ERR_OOM;
    for (i = 0; i < (size_t)r->p * r->NV; i++) r->obar[i] = -1.0;
    return PT_OK;
}

/* 2BW's report: the newest version and those in-flight micro-batches use
   (the version rule and the updates' order keep it at two: batch t-1's
   micro-batches, at t-2, are all done before version t is made). */
static void pt__2bw_alive(pt__sched_state *r, int st) {
    int ver, alive = 1;
    if (!r->rep) return;
    for (ver = 0; ver < r->NV; ver++)
        alive += ver != r->latest[st] && r->vflight[st * r->NV + ver] > 0;
    if (alive > r->rep->versions) r->rep->versions = alive;
}

/* 2BW: batch t = micro/p forwards at version max(t-1, 0), one the stage has
   made, and backpropagates at its forward's; a micro-batch holds its
   version until its B (W when split). */
static int pt__2bw_computed(pt__sched_state *r, pt__sched_act *x) {
    const pt_action *a = x->a;
    int st = x->st, mi = x->mi, p = r->p, *flight = r->vflight + st * r->NV;
    if (a->kind == PT_ACT_F) {
        if (a->version != (mi / p > 1 ? mi / p - 1 : 0))
            PT__REFUSE("stage %d, action %d: forward of micro-batch %d (batch %d) at weight "
                       "version %d; 2BW's W(t+1) = W(t) - lr grad f(W(t-1)) computes batch t "
                       "at version max(t-1, 0)", st, r->pc[st], mi, mi / p, a->version);
        if (a->version > r->latest[st])
            PT__REFUSE("stage %d, action %d: forward of micro-batch %d at weight version %d, "
                       "which the stage has not made yet (newest %d)", st, r->pc[st], mi,
                       a->version, r->latest[st]);
        r->fver[x->key] = a->version;
        flight[a->version]++;
    } else if (a->kind == PT_ACT_B) {
        if (a->version != r->fver[x->key])
            PT__REFUSE("stage %d, action %d: backward of micro-batch %d at weight version %d, "
                       "its forward used %d", st, r->pc[st], mi, a->version, r->fver[x->key]);
        if (!r->split) flight[r->fver[x->key]]--;
    } else {
        flight[r->fver[x->key]]--;
    }
    pt__2bw_alive(r, st);
    return PT__SCHED_DONE;
}

/* 2BW's update: version t+1 from batch t's gradients, made after all its
   backwards; mid-list but for the last, which flushes. With costs every
   stage waits for the last to reach it (the executor's update agrees
   across the stages). */
static int pt__2bw_update(pt__sched_state *r, pt__sched_act *x) {
    const pt_action *a = x->a;
    int st = x->st, p = r->p, NV = r->NV, t = a->version - 1, mi, q;
    if (r->obar && a->version >= 0 && a->version < NV) {
        if (r->obar[st * NV + a->version] < 0) r->obar[st * NV + a->version] = x->at;
        for (q = 0; q < p; q++)
            if (r->obar[q * NV + a->version] < 0) return PT__SCHED_WAIT;
        for (q = 0; q < p; q++)
            if (r->obar[q * NV + a->version] > x->at) x->at = r->obar[q * NV + a->version];
    }
    if (a->version != r->latest[st] + 1 || a->version >= NV)
        PT__REFUSE("stage %d, action %d: the update makes weight version %d after "
                   "version %d", st, r->pc[st], a->version, r->latest[st]);
    for (mi = t * p; mi < (t + 1) * p; mi++)
        if (r->bd[(size_t)mi * r->V + (size_t)st] < 0)
            PT__REFUSE("stage %d, action %d: the update to weight version %d comes "
                       "before the backward of micro-batch %d of batch %d", st,
                       r->pc[st], a->version, mi, t);
    r->latest[st] = a->version;
    pt__2bw_alive(r, st);
    return r->pc[st] != r->s->count[st] - 1 ? PT__SCHED_DONE : PT__SCHED_FLUSH;
}

/* The families, in pt_schedule_kind's order (the default resolves to 1F1B
   or interleaved before building; a hand-made list of it runs the flushed
   rules). The flushed ones share the engine's rules: F, B, W, messages and
   the flush; W and the turns (ZB-V) are rules of their actions. */
static const pt__sched_family pt__sched_families[PT_SCHED_COUNT] = {
    {NULL, NULL, NULL, NULL, NULL, NULL, NULL},                  /* default */
    {pt__build_gpipe, NULL, NULL, NULL, NULL, NULL, NULL},       /* gpipe */
    {pt__build_1f1b, NULL, NULL, NULL, NULL, NULL, NULL},        /* 1f1b */
    {pt__build_interleaved, NULL, NULL, NULL, NULL, NULL, NULL}, /* interleaved */
    {pt__build_zb_h1, NULL, NULL, NULL, NULL, NULL, NULL},       /* zb-h1 */
    {pt__sched_greedy, NULL, NULL, NULL, NULL, NULL, NULL},      /* zb-h2 */
    {pt__sched_greedy, NULL, NULL, NULL, NULL, NULL, NULL},      /* zb-v */
    {pt__sched_chimera, NULL, pt__chimera_admit, NULL, pt__chimera_reduce, NULL,
     pt__chimera_synced},                                         /* chimera */
    {pt__build_2bw, pt__2bw_init, NULL, pt__2bw_computed, NULL, pt__2bw_update, NULL}, /* 2bw */
};

static void pt__sched_state_free(pt__sched_state *r) {
    pt__free(r->fd, r->s->alloc_ctx);
    pt__free(r->pc, r->s->alloc_ctx);
    pt__free(r->latest, r->s->alloc_ctx);
    pt__free(r->obar, r->s->alloc_ctx);
}

static pt_status pt__sched_state_init(pt__sched_state *r, const pt_schedule *s, pt_schedule_report *rep,
                              const pt__sched_costs *costs) {
    int p = s->stages, st;
    size_t nkeys, i;
    memset(r, 0, sizeof *r);
    r->s = s, r->rep = rep, r->costs = costs;
    r->fam = &pt__sched_families[(int)s->kind >= 0 && s->kind < PT_SCHED_COUNT ? s->kind : 0];
    r->p = p, r->v = s->chunks, r->m = s->micro, r->V = pt__sched_nv(s);
    nkeys = (size_t)r->m * r->V;
    r->fd = (double *)pt__malloc(sizeof(double) * (nkeys * 7 + 5 * (size_t)p), s->alloc_ctx);
    r->pc = (int *)pt__malloc(sizeof(int) * (size_t)p * 5, s->alloc_ctx);
    if (!r->fd || !r->pc || (r->fam->init && r->fam->init(r) != PT_OK)) {
        pt__sched_state_free(r);
        return pt__fail(PT_ERR_OOM, "cannot allocate the schedule checker's state");
    }
    r->bd = r->fd + nkeys, r->wd = r->bd + nkeys, r->act_msg = r->wd + nkeys;
    r->grad_msg = r->act_msg + nkeys, r->have_act = r->grad_msg + nkeys;
    r->have_grad = r->have_act + nkeys, r->clock = r->have_grad + nkeys;
    r->run0 = r->clock + p, r->run1 = r->run0 + p, r->busy = r->run1 + p, r->red_at = r->busy + p;
    r->live = r->pc + p, r->first = r->live + p, r->lastb = r->first + p, r->red = r->lastb + p;
    memset(r->pc, 0, sizeof(int) * (size_t)p * 5);
    for (i = 0; i < nkeys * 7; i++) r->fd[i] = -1;
    for (st = 0; st < p; st++) {
        r->lastb[st] = -1, r->clock[st] = r->busy[st] = 0.0, r->run0[st] = r->run1[st] = -1.0;
        if (st > 0) r->first[st] = r->first[st - 1] + s->count[st - 1];
    }
    r->split = pt__sched_split(s);
    if (rep) memset(rep, 0, sizeof *rep), rep->versions = 1;
    return PT_OK;
}

/* After the last step: a deadlock, a stage without its closing update, a
   (micro-batch, chunk) never run or a message never received, in words;
   else the report. */
static pt_status pt__sched_verdict(pt__sched_state *r, double *clock_out) {
    const pt_schedule *s = r->s;
    int p = r->p, st, q, part;
    size_t i, len = 0, nkeys = (size_t)r->m * r->V;
    char msg[512];
    for (st = 0; st < p; st++)
        if (r->pc[st] < s->count[st]) { /* a deadlock: say where every stage waits */
            for (q = 0; q < p && len < sizeof msg - 100; q++)
                if (r->pc[q] < s->count[q]) {
                    const pt_action *w = &s->list[q][r->pc[q]];
                    len += (size_t)snprintf(msg + len, sizeof msg - len,
                                            "%sstage %d waits at action %d (%s of micro-batch %d "
                                            "chunk %d from stage %d)", len ? "; " : "", q, r->pc[q],
                                            pt__act_names[w->kind], w->micro, w->chunk, w->peer);
                }
            return pt__fail(PT_ERR_CONFIG, "deadlock: %s", msg);
        }
    for (st = 0; st < p; st++)
        if (s->count[st] == 0 || s->list[st][s->count[st] - 1].kind != PT_ACT_OPT)
            return pt__fail(PT_ERR_CONFIG, "stage %d has no optimizer step at the end", st);
    for (i = 0; i < nkeys; i++) {
        int mi = (int)(i / (size_t)r->V), vs = (int)(i % (size_t)r->V);
        if (r->fd[i] < 0 || r->bd[i] < 0 || (r->split && r->wd[i] < 0)) {
            part = r->fd[i] < 0 ? PT_ACT_F : r->bd[i] < 0 ? PT_ACT_B : PT_ACT_W;
            return pt__fail(PT_ERR_CONFIG, "micro-batch %d chunk %d of stage %d never gets its %s",
                            mi, pt__sched_chunk_at(s, mi, vs), pt__sched_at(s, mi, vs),
                            pt__act_names[part]);
        }
        if (r->act_msg[i] >= 0 || r->grad_msg[i] >= 0)
            return pt__fail(PT_ERR_CONFIG, "stage %d sends the %s of micro-batch %d chunk %d, "
                            "and nobody receives it", pt__sched_at(s, mi, vs),
                            r->act_msg[i] >= 0 ? "activation" : "gradient", mi,
                            pt__sched_chunk_at(s, mi, vs));
    }
    if (r->rep && !r->costs) {
        double work = (double)r->m * r->V * 3.0;
        for (st = 0; st < p; st++)
            r->rep->steps = r->clock[st] > r->rep->steps ? (int)r->clock[st] : r->rep->steps;
        r->rep->bubble = r->rep->steps ? 1.0 - work / ((double)p * r->rep->steps) : 0.0;
        for (st = 0; st < p; st++) r->rep->idle += (int)(r->run1[st] - r->run0[st] - r->busy[st]);
    }
    if (clock_out) memcpy(clock_out, r->clock, sizeof(double) * (size_t)p);
    return PT_OK;
}
#undef PT__REFUSE

/* Runs every stage's list, checking each action's preconditions: in unit
   time when costs is NULL (F 1 slot; B 2, or 1 when W is split off; W 1;
   messages arrive when sent), else with costs' durations (the simulator).
   Each stage runs until an action must wait (a receive, a collective), in
   rounds until none moves. The rules are the engine's for every action
   kind plus the schedule family's (pt__sched_families). start (may be NULL)
   gets each action's start, stage after stage; clock (may be NULL, p
   entries) each stage's end. Reports the first violation, or a deadlock,
   in words. */
static pt_status pt__sched_run(const pt_schedule *s, pt_schedule_report *rep, double *start,
                               const pt__sched_costs *costs, double *clock_out) {
    pt__sched_state r;
    int st, progress, rc = PT__SCHED_DONE;
    pt_status err = pt__sched_state_init(&r, s, rep, costs);
    if (err != PT_OK) return err;
    do {
        progress = 0;
        for (st = 0; st < r.p && rc != PT__SCHED_BAD; st++)
            while (r.pc[st] < s->count[st] && (rc = pt__sched_step(&r, st, start)) == PT__SCHED_DONE)
                progress = 1;
    } while (progress && rc != PT__SCHED_BAD);
    err = rc == PT__SCHED_BAD ? PT_ERR_CONFIG : pt__sched_verdict(&r, clock_out);
    pt__sched_state_free(&r);
    return err;
}

PTRAINDEF pt_status pt_schedule_build(pt_schedule *s, pt_schedule_kind kind, int p, int v,
                                      int m) {
    void *ctx = s->alloc_ctx;
    int bad = 0, st, per;
    pt_status err;
    memset(s, 0, sizeof *s);
    s->alloc_ctx = ctx;
    pt_clear_error();
    if ((int)kind < 0 || kind >= PT_SCHED_COUNT)
        pt__append_error(&bad, "unknown schedule kind %d", (int)kind);
    kind = pt__sched_resolve(kind, v);
    if (p < 1 || p > 64) pt__append_error(&bad, "stages=%d must be in [1, 64]", p);
    if (v < 1 || v > 64) pt__append_error(&bad, "chunks=%d must be in [1, 64]", v);
    if (m < 1 || m > 1 << 16) pt__append_error(&bad, "micro-batches=%d must be in [1, 65536]", m);
    if (!bad && kind == PT_SCHED_INTERLEAVED && v < 2)
        pt__append_error(&bad, "interleaved needs chunks >= 2 (chunks=%d; use 1f1b)", v);
    if (!bad && kind == PT_SCHED_INTERLEAVED && m % p != 0)
        pt__append_error(&bad, "interleaved needs micro-batches divisible by stages "
                         "(Megatron-LM): m=%d, p=%d", m, p);
    if (!bad && kind == PT_SCHED_ZB_V && v != 2)
        pt__append_error(&bad, "zb-v runs two chunks per stage, in a V (chunks=%d)", v);
    if (!bad && kind == PT_SCHED_CHIMERA && v != 2)
        pt__append_error(&bad, "chimera holds two replicas' stages per stage (chunks=%d, "
                         "must be 2)", v);
    if (!bad && kind == PT_SCHED_2BW && m % p)
        pt__append_error(&bad, "2bw makes a weight version every p micro-batches: m=%d must be "
                         "a multiple of p=%d", m, p);
    if (!bad && kind == PT_SCHED_CHIMERA && (p % 2 || m % p))
        pt__append_error(&bad, "chimera needs an even number of stages and micro-batches a "
                         "multiple of them (its basic unit sends p/2 down and p/2 up): "
                         "p=%d, m=%d", p, m);
    if (!bad && kind != PT_SCHED_INTERLEAVED && kind != PT_SCHED_ZB_V &&
        kind != PT_SCHED_CHIMERA && v != 1)
        pt__append_error(&bad, "%s runs one chunk per stage (chunks=%d; use interleaved)",
                         pt_schedule_kind_name(kind), v);
    if (bad) return PT_ERR_CONFIG;
    s->kind = kind, s->stages = p, s->chunks = v, s->micro = m;
    /* per stage at most: per (micro, chunk) F, B, W and four messages; OPT */
    per = 7 * m * v + 1;
    s->count = (int *)pt__malloc(sizeof(int) * (size_t)p, ctx);
    s->list = (pt_action **)pt__malloc(sizeof(pt_action *) * (size_t)p, ctx);
    s->storage = (pt_action *)pt__malloc(sizeof(pt_action) * (size_t)per * (size_t)p, ctx);
    if (!s->count || !s->list || !s->storage) {
        pt_schedule_free(s);
        return pt__fail(PT_ERR_OOM, "cannot allocate a schedule of %d x %d actions", p, per);
    }
    for (st = 0; st < p; st++) s->count[st] = 0, s->list[st] = s->storage + (size_t)st * per;
    if ((err = pt__sched_families[kind].build(s)) != PT_OK) pt_schedule_free(s);
    return err;
}

PTRAINDEF pt_status pt_schedule_check(const pt_schedule *s, pt_schedule_report *report) {
    if (!s || !s->count || !s->list || s->stages < 1 || s->chunks < 1 || s->micro < 1)
        return pt__fail(PT_ERR_INVALID_ARG, "schedule is empty or freed");
    if (s->stages > 64) return pt__fail(PT_ERR_CONFIG, "stages=%d > 64", s->stages);
    return pt__sched_run(s, report, NULL, NULL, NULL);
}

/* *start (the schedule's allocator; pt__free it): every action's start
   slot in the unit-time run, stage after stage. */
static pt_status pt__sched_times(const pt_schedule *s, pt_schedule_report *rep, double **start) {
    size_t total = 0;
    int st;
    pt_status err;
    for (st = 0; st < s->stages; st++) total += (size_t)s->count[st];
    *start = (double *)pt__malloc(sizeof(double) * (total + 1), s->alloc_ctx);
    if (!*start) return pt__fail(PT_ERR_OOM, "cannot allocate the schedule's timeline");
    if ((err = pt__sched_run(s, rep, *start, NULL, NULL)) != PT_OK) {
        pt__free(*start, s->alloc_ctx);
        *start = NULL;
    }
    return err;
}

PTRAINDEF size_t pt_schedule_format(const pt_schedule *s, char *buf, size_t cap) {
    pt_schedule_report rep;
    size_t used = 0;
    double *start;
    int st, k, t, width = s->chunks > 1 ? 5 : 4, split = pt__sched_split(s), at0 = 0;
    char *row;
    if (cap) buf[0] = 0;
    if (pt__sched_times(s, &rep, &start) != PT_OK) return 0;
    row = (char *)pt__malloc((size_t)rep.steps * (size_t)width + 16, s->alloc_ctx);
    if (!row) {
        pt__free(start, s->alloc_ctx);
        return 0;
    }
    for (st = 0; st < s->stages; st++) {
        size_t len = (size_t)snprintf(row, 16, "stage %2d |", st);
        memset(row + len, ' ', (size_t)rep.steps * (size_t)width);
        for (k = 0; k < s->count[st]; k++) {
            const pt_action *a = &s->list[st][k];
            int at = (int)start[at0 + k], slots = pt__sched_cost(a->kind, split), n;
            char cell[24];
            if (slots == 0) continue; /* messages take no slot */
            n = snprintf(cell, sizeof cell, "%c%d", "FBW"[a->kind], a->micro);
            if (s->chunks > 1 && n < 20) cell[n++] = (char)('a' + a->chunk % 26), cell[n] = 0;
            for (t = 0; t < slots; t++)
                memcpy(row + len + (size_t)(at + t) * width, cell,
                       (size_t)(n < width - 1 ? n : width - 1));
        }
        at0 += s->count[st];
        len += (size_t)rep.steps * (size_t)width;
        row[len++] = '\n';
        if (used + len < cap) memcpy(buf + used, row, len), buf[used + len] = 0;
        used += len;
    }
    pt__free(row, s->alloc_ctx);
    pt__free(start, s->alloc_ctx);
    return used;
}


PTRAINDEF pt_status pt_trace_add(pt_trace *t, int track, int kind, int micro, int chunk, int at,
                                 double start, double dur) {
    pt_trace_event *e;
    if (track < 0) return pt__fail(PT_ERR_INVALID_ARG, "trace track %d < 0", track);
    if (!pt__grow((void **)&t->events, &t->cap, t->count + 1, sizeof *e, t->alloc_ctx))
        return pt__fail(PT_ERR_OOM, "cannot grow the trace to %d events", t->count + 1);
    e = &t->events[t->count++];
    e->track = track, e->kind = kind, e->micro = micro, e->chunk = chunk, e->at = at;
    e->start = start, e->dur = dur;
    if (track >= t->ntracks) t->ntracks = track + 1;
    return PT_OK;
}

PTRAINDEF void pt_trace_free(pt_trace *t) {
    void *ctx = t->alloc_ctx;
    pt__free(t->events, ctx);
    memset(t, 0, sizeof *t);
    t->alloc_ctx = ctx;
}

PTRAINDEF pt_status pt_trace_gather(pt_trace *t, pt_comm *world) {
    float n = (float)t->count, most = n, *mine, *all;
    int i, r, count = t->count;
    enum { E = 7 }; /* track, kind, micro, chunk, at, start, dur */
    pt_status st;
    if ((st = pt_comm_all_reduce(world, &most, 1, PT_REDUCE_MAX)) != PT_OK) return st;
    mine = (float *)pt__malloc(sizeof(float) * (E * (size_t)most + 1), t->alloc_ctx);
    all = (float *)pt__malloc(sizeof(float) * (E * (size_t)most + 1) * (size_t)world->size,
                              t->alloc_ctx);
    if (!mine || !all) {
        pt__free(mine, t->alloc_ctx);
        pt__free(all, t->alloc_ctx);
        return pt_comm_fail(world, pt__fail(PT_ERR_OOM, "cannot allocate the gathered trace"));
    }
    mine[0] = n; /* each rank: its count, then E floats an event */
    for (i = 0; i < count; i++) {
        const pt_trace_event *e = &t->events[i];
        float *f = mine + 1 + E * i;
        f[0] = (float)e->track, f[1] = (float)e->kind, f[2] = (float)e->micro;
        f[3] = (float)e->chunk, f[4] = (float)e->at, f[5] = (float)e->start, f[6] = (float)e->dur;
    }
    for (i = 1 + E * count; i < 1 + E * (int)most; i++) mine[i] = 0.0f;
    st = pt_comm_all_gather(world, mine, all, E * (size_t)most + 1);
    for (r = 0; st == PT_OK && world->rank == 0 && r < world->size; r++) {
        const float *g = all + (size_t)r * (E * (size_t)most + 1);
        if (r == 0) continue; /* rank 0's own events are already in t */
        for (i = 0; i < (int)g[0] && st == PT_OK; i++) {
            const float *f = g + 1 + E * i;
            st = pt_trace_add(t, (int)f[0], (int)f[1], (int)f[2], (int)f[3], (int)f[4], f[5], f[6]);
        }
    }
    pt__free(mine, t->alloc_ctx);
    pt__free(all, t->alloc_ctx);
    return st;
}

PTRAINDEF pt_status pt_schedule_trace(const pt_schedule *s, double unit, pt_trace *t) {
    double *start;
    int st, k, at0 = 0, split = pt__sched_split(s);
    pt_status err = pt__sched_times(s, NULL, &start);
    if (err != PT_OK) return err;
    t->ntracks = t->ntracks > s->stages ? t->ntracks : s->stages;
    if (!t->track_name) t->track_name = "stage";
    if (!t->unit_name) t->unit_name = "time units", t->unit = unit;
    for (st = 0; st < s->stages && err == PT_OK; st++) {
        for (k = 0; k < s->count[st] && err == PT_OK; k++) {
            const pt_action *a = &s->list[st][k];
            int slots = pt__sched_cost(a->kind, split);
            if (slots > 0)
                err = pt_trace_add(t, st, a->kind, a->micro, a->chunk, k, start[at0 + k] * unit,
                                   slots * unit);
        }
        at0 += s->count[st];
    }
    pt__free(start, s->alloc_ctx);
    return err;
}

static pt_status pt__write_file(const char *path, const void *const *parts, const size_t *lens,
                                int n, void *ctx);

/* ======================================================================== */
/* >>exec (implementation)                                                   */
/* ======================================================================== */

/* ---- the private state -----------------------------------------------------
   Everything a step needs besides the parameters: the grid's groups, the
   gradient buckets and shards, the schedule and its activation slots, the
   scratch of one layer's backward. Laid out by pt_gpt_init in one
   allocation with the table. */

/* A bucket: a contiguous run of parameters whose gradients are reduced
   together (wte in runs of rows about a layer's size, the last with wpe;
   one layer; the final LayerNorm), padded to a multiple of dp; dp rank d
   owns elements [d*shard, (d+1)*shard) of it. */
typedef struct pt__bucket {
    size_t offset, numel;       /* in the flat buffers (numel includes the padding) */
    size_t shard, shard_offset; /* per dp rank, and where this rank's is in
                                   the sharded buffers (ZeRO) */
    int first, count;           /* the tensors it overlaps in the table */
    int lf, nl;                 /* the whole local layers it holds: [lf, lf + nl)
                                   (nl 0: not whole layers, reduced after backward) */
} pt__bucket;

/* One micro-batch's activations for one chunk of layers: a pipeline stage
   holds as many as its schedule keeps in flight (one for 1F1B on one stage). */
typedef struct pt__slot {
    float *x;                         /* (N,C) the chunk's input */
    pt_block_acts *acts;              /* per layer of the largest chunk */
    float *lnf, *lnf_mean, *lnf_rstd; /* the last stage: final LayerNorm */
    float *logits, *losses;           /* (N,vocab_local), (N) */
    double *lse;                      /* (N) */
    int *inputs, *targets;            /* (N) the micro-batch's tokens */
    pt_block_wgrad *wg;               /* per layer, kept from B to W (zero-bubble) */
    int *zslot, zrows;                /* ZeRO 3, one stage, dp > 1 (pt__z3_rows_read): each
                                         vocab_local row's slot among those some dp rank's
                                         token reads (-1: none), how many: the forward's,
                                         kept for the backward */
    int micro, chunk;                 /* what it holds; micro -1: free */
} pt__slot;

/* Gradient buckets and the collectives started on them: the dp reductions
   (overlap: each bucket's once the step's last backward of it is done), ZeRO's
   parameter all-gathers, the shards and the gradients' named views. */
typedef struct pt__exec_coll {
    int num_buckets;
    pt__bucket *buckets;
    pt_comm_req *ov_req;      /* (buckets) overlap: each bucket's started reduction
                                 (op != NONE: started in this step) */
    int *ov_done;             /* (chunks) overlap: the step's backwards (W when split) of
                                 each chunk so far */
    int ov_on, ov_last;       /* overlap runs in this step; the running backward is its
                                 chunk's last */
    pt_comm_req *ag_req;      /* (buckets) ZeRO with overlap: each bucket's parameter
                                 all-gather after the last update, waited for by the
                                 next forward before the layer is used, or by whatever
                                 reads the parameters first (pt__ag_settle) */
    pt_comm *ag_comm;         /* ZeRO, dp > 1: a group of its own for those gathers, whose
                                 starts depend on timing (collectives on one group must
                                 start in the same order on every rank) */
    int ag_on;                /* updates leave their all-gathers under way */
    int ag_next, ag_end;      /* buckets [ag_next, ag_end) are updated, their gathers
                                 not yet started (one runs at a time: see pt__ag_pump) */
    pt_status poll_st;        /* the first error a poll (pt__ov_poll) met */
    double *ov_t, *ag_t;      /* (buckets) when each bucket's reduction, gather began */
    int *ov_at, *ag_at;       /* (buckets) and the step's action then (-1: before it) */
    size_t shard_total;       /* this rank's elements over all buckets (ZeRO) */
    float *gshard;            /* (shard_total) averaged gradients of its shard (ZeRO 1, 2) */
    float *rs_tmp;            /* (largest shard) where ZeRO 2 (and 3 with a stage: rs_b)
                                 reduce-scatters a bucket, to
                                 add it to the shard (ZeRO 3: the half of work the bucket
                                 was gathered into, done with) */
    float *pshard;            /* (shard_total) ZeRO 3: this rank's parameters, the shards
                                 (m->params points here) */
    float *work;              /* (2, work_n) ZeRO 3: gathered buckets, bucket b in half b % 2
                                 (the named parameters point there) */
    size_t work_n;            /* the largest bucket */
    int held[2];              /* ZeRO 3: the bucket each half holds or is gathering (-1: none) */
    pt_comm_req zreq[2];      /* ZeRO 3: a gather started into each half (prefetch) */
    double z_t[2];            /* when it began */
    float *dwte, *dwpe, *dlnf_w, *dlnf_b; /* named views into grads (ZeRO 2: the bucket
                                             staging buffer) */
    float *dhead;             /* the head's gradient: dwte when tied */
    pt_block_params *layer_grads;
    /* overlap on one stage, tied wte (pt__wte_ok): the wte rows no dp rank's token reads
       are final after the step's last head backward and reduce then; the rows read (and
       wpe) go compact through the embedding's backward and reduce after it */
    float *tmask;             /* (vocab_local) 1: a row the step's tokens read on some dp rank */
    int *tslot, *tinp;        /* (vocab_local) a row's compact slot (-1: none); (B*T) tokens
                                 as slots */
    float *tkeep;             /* (tcap * C + wpe's) the compact rows' gradients, then wpe's
                                 (context parallel: the rows of this rank's positions) */
    int tcap, trows;          /* slots; those in use in this step (-1: none, wte whole) */
    pt_comm_req treq, kreq;   /* the mask's all-reduce (MAX), the compact rows' */
    pt_comm_req preq;         /* context parallel: wpe's rows' sum over dp alone */
    int zrows;                /* ZeRO 3 (pt__z3_embed_sparse): the embedding's compact rows
                                 whose average is under way in work's half 0 (-1: none) */
    float *zmask;             /* (vocab_local) ZeRO 3, one stage, dp > 1: pt__z3_rows_read's
                                 mask */
    const int *zslot;         /* (vocab_local) and each row's slot among them (its slot's) */
    size_t zwpe;              /* wpe's floats after them (the positions read) */
    int rs_b, rs_at;          /* ZeRO 2 and 3 with overlap: the layer bucket whose reduce-scatter
                                 from the stage into rs_tmp is under way (-1: none), the action */
    pt_comm_req rs_req;       /* it (pt__zero2_settle), begun at rs_t */
    double rs_t;
} pt__exec_coll;

/* The step's schedule, its chunks of layers, the activation slots and the
   pipeline's message buffers. */
typedef struct pt__exec_pipe {
    pt_schedule sched;        /* the step's schedule (count NULL: none, inference) */
    int split;                /* it runs W apart from B (zero-bubble) */
    int *chunk_lo, *chunk_hi; /* (chunks) chunk c is local layers [chunk_lo[c], chunk_hi[c])
                                 (local layers ascend by global index; Chimera's chunk 1
                                 may come first) */
    int embed_chunk, head_chunk; /* the chunk holding the first block (embeddings) and
                                    the last (final norm, head); -1: none here */
    int nslots, slots_used;
    pt__slot *slots;
    pt_block_acts *acts;      /* the slots' layers */
    pt_block_acts racts;      /* the one layer being recomputed (full), or its
                                 attention output (selective: racts.atty) */
    /* pipeline messages with overlap (pp > 1): the next activation [0] and the
       next gradient [1] this stage receives are posted ahead of their actions,
       into buffers of their own (copied out when the action comes), and sends
       start and are waited for before their buffer changes */
    float *pp_rbuf;           /* (2, N, C) */
    pt_comm_req pp_rreq[2], pp_sreq[2];
    int pp_rnext[2];          /* the list index each posted receive is for (-1: none) */
    int pp_on;
} pt__exec_pipe;

/* PipeDream-2BW's weight versions: the weights before the last update in
   the step (version ver - 1), bound like m's; F and B of an action one
   version behind swap them in (pt__swap_weights). */
typedef struct pt__exec_versions {
    float *wprev;
    float *pv_wte, *pv_wpe, *pv_lnf_w, *pv_lnf_b, *pv_head;
    pt_block_params *pv_layers;
    int ver;                  /* weight versions the running step has made (its OPTs) */
    int pv_on;                /* the previous version is swapped into m's pointers */
    int in_opt;               /* the step's OPT runs pt_gpt_adamw_step */
} pt__exec_versions;

struct pt_gpt_exec {
    pt_grid *grid;            /* NULL: one rank */
    pt_comm *tp_comm, *dp_comm, *pp_comm; /* the groups (NULL when of size 1) */
    pt_comm *tie_comm;        /* first and last stage of this tp, dp place: the two
                                 copies of wte (NULL unless pp > 1 and one of them);
                                 Chimera: stages s and p-1-s (the same blocks) */
    pt__exec_coll coll;       /* buckets and started collectives */
    pt__exec_pipe pipe;       /* schedule, slots and buffers */
    pt__exec_versions wv;     /* weight versions (2BW) */
    struct pt_trace *trace;   /* pt_step_desc.trace while a step runs, else NULL: each dp
                                 transfer goes in when it is found done */
    double trace_t0;          /* its time origin (pt_time_now's) */
    int trace_track;
    int act;                  /* the ordinal of the step's action begun last (-1: none) */
    int *layer_id;            /* (n_layers) place.layer_id points here */
    int tab_wte, tab_wpe, tab_layers, tab_lnf; /* table indices (-1: not here) */
    int tab_lnf_b, tab_head;  /* the final norm's bias, the untied head (-1: none) */
    int layer_tensors;        /* tensors a layer has in the table */
    pt_block_scratch scratch;
    pt_block_cp cp;           /* context parallelism (scratch.cp points here; comm NULL: none) */
    int *cp_in, *cp_tg;       /* (micro*B*T) a step's tokens of this rank's share */
    float *ce_red;            /* (3N) row max, sum of exp, target logit (under tp) */
    float *head_work;         /* (PT__HEAD_ROWS, V): the fused head's block of logits
                                 (pt__head_fused; NULL: the slots hold whole logits) */
    float *dres;              /* (N,C) residual-stream gradient */
    int cur_B, cur_T;         /* shape of the last forward */
    int micro_done;           /* backwards of the step so far (pt_gpt_backward) */
    int has_targets;          /* the last forward had targets (pt_gpt_backward may run) */
    pt_arena param_arena, act_arena;
};

/* Bucket b's dp transfer (PT_TRACE_DP_*), begun at t (pt_time_now's) in
   action `at` and found done now, into the running step's trace. */
static void pt__trace_dp(pt_gpt_exec *x, int kind, int b, double t, int at) {
    pt_status st;
    if (!x->trace) return;
    st = pt_trace_add(x->trace, x->trace_track, kind, b, -1, at, t - x->trace_t0,
                      pt_time_now() - t);
    if (st != PT_OK && !x->coll.poll_st) x->coll.poll_st = st;
}

/* The gathers' group counts into the dp group's time, bytes and calls (it
   is a copy of it): what a step was exposed to stays in one place. */
static void pt__ag_fold(pt_gpt_exec *x) {
    if (!x->coll.ag_comm || !x->dp_comm) return;
    x->dp_comm->seconds += x->coll.ag_comm->seconds, x->dp_comm->bytes += x->coll.ag_comm->bytes;
    x->dp_comm->calls += x->coll.ag_comm->calls;
    x->coll.ag_comm->seconds = 0.0, x->coll.ag_comm->bytes = x->coll.ag_comm->calls = 0;
}

static pt_status pt__ag_start(const pt_gpt *m) {
    pt_gpt_exec *x = m->exec;
    const pt__bucket *k = &x->coll.buckets[x->coll.ag_next];
    float *own = m->params + k->offset + (size_t)m->place.dp_rank * k->shard;
    x->coll.ag_t[x->coll.ag_next] = pt_time_now(), x->coll.ag_at[x->coll.ag_next] = x->act;
    return pt_comm_all_gather_start(x->coll.ag_comm, own, m->params + k->offset, k->shard,
                                    &x->coll.ag_req[x->coll.ag_next++]);
}

/* The updated buckets' gathers start one at a time, in the forward's order
   (the tensor table's): started together they would share the links and the
   first the forward needs would land about last. */
static pt_status pt__ag_pump(const pt_gpt *m) {
    pt_gpt_exec *x = m->exec;
    int done = 1;
    pt_status st = PT_OK;
    if (x->coll.ag_next > 0 && x->coll.ag_req[x->coll.ag_next - 1].comm &&
        (st = pt_comm_test(&x->coll.ag_req[x->coll.ag_next - 1], &done)) == PT_OK && done)
        pt__trace_dp(x, PT_TRACE_DP_GATHER, x->coll.ag_next - 1, x->coll.ag_t[x->coll.ag_next - 1],
                     x->coll.ag_at[x->coll.ag_next - 1]);
    if (st == PT_OK && done && x->coll.ag_next < x->coll.ag_end) st = pt__ag_start(m);
    return st;
}

/* Under MPI a started operation moves on only inside MPI calls: while the
   executor computes, the GEMMs call this (pt__poll_now) to test each dp
   reduction and parameter gather under way. The first error is kept for
   the executor to return. */
static void pt__ov_poll(void *arg) {
    pt_gpt_exec *x = ((pt_gpt *)arg)->exec;
    pt_status st;
    int j, done;
    for (j = 0; j < x->coll.num_buckets; j++) {
        if (!x->coll.ov_req[j].comm) continue;
        if ((st = pt_comm_test(&x->coll.ov_req[j], &done)) != PT_OK && !x->coll.poll_st) x->coll.poll_st = st;
        if (st == PT_OK && done) pt__trace_dp(x, PT_TRACE_DP_REDUCE, j, x->coll.ov_t[j], x->coll.ov_at[j]);
    }
    for (j = 0; j < 4; j++) { /* the pipeline's messages */
        pt_comm_req *q = j < 2 ? &x->pipe.pp_rreq[j] : &x->pipe.pp_sreq[j - 2];
        if (q->comm && (st = pt_comm_test(q, &done)) != PT_OK && !x->coll.poll_st) x->coll.poll_st = st;
    }
    if (x->coll.rs_req.comm && (st = pt_comm_test(&x->coll.rs_req, &done)) != PT_OK && !x->coll.poll_st)
        x->coll.poll_st = st; /* (a staged reduce-scatter: settled later) */
    if (x->coll.kreq.comm && (st = pt_comm_test(&x->coll.kreq, &done)) != PT_OK && !x->coll.poll_st)
        x->coll.poll_st = st; /* (wte's compact rows: added later) */
    if (x->coll.preq.comm && (st = pt_comm_test(&x->coll.preq, &done)) != PT_OK && !x->coll.poll_st)
        x->coll.poll_st = st; /* (context parallel: wpe's rows) */
    for (j = 0; j < 5; j++) { /* context parallelism's ring transfers */
        pt_comm_req *q = &x->cp.req[j];
        if (q->comm && (st = pt_comm_test(q, &done)) != PT_OK && !x->coll.poll_st) x->coll.poll_st = st;
    }
    for (j = 0; j < 2; j++) { /* ZeRO 3's prefetched gathers */
        if (!x->coll.zreq[j].comm) continue;
        if ((st = pt_comm_test(&x->coll.zreq[j], &done)) != PT_OK && !x->coll.poll_st) x->coll.poll_st = st;
        if (st == PT_OK && done)
            pt__trace_dp(x, PT_TRACE_DP_GATHER, x->coll.held[j], x->coll.z_t[j], x->act);
    }
    if ((st = pt__ag_pump((pt_gpt *)arg)) != PT_OK && !x->coll.poll_st) x->coll.poll_st = st;
    pt__ag_fold(x);
}

/* Waits for the parameter all-gathers of the buckets that hold any of the
   table tensors [i, i + n) (i < 0: none), starting those not yet started;
   pt__ag_settle: of all of them. */
static pt_status pt__ag_need(const pt_gpt *m, int i, int n) {
    pt_gpt_exec *x = m->exec;
    pt_status st = x ? x->coll.poll_st : PT_OK;
    int b;
    for (b = 0; x && i >= 0 && b < x->coll.num_buckets && st == PT_OK; b++) {
        const pt__bucket *k = &x->coll.buckets[b];
        if (k->first >= i + n || i >= k->first + k->count) continue;
        while (st == PT_OK && x->coll.ag_next <= b && x->coll.ag_next < x->coll.ag_end) st = pt__ag_start(m);
        if (st == PT_OK && x->coll.ag_req[b].comm && (st = pt_comm_wait(&x->coll.ag_req[b])) == PT_OK)
            pt__trace_dp(x, PT_TRACE_DP_GATHER, b, x->coll.ag_t[b], x->coll.ag_at[b]);
    }
    if (x) pt__ag_fold(x);
    return st;
}

static pt_status pt__z3_sparse_finish(const pt_gpt *m);

/* ZeRO 3: waits for the gather started into half h, if any. */
static pt_status pt__z3_wait(const pt_gpt *m, int h) {
    pt_gpt_exec *x = m->exec;
    pt_status st;
    if (!x->coll.zreq[h].comm) return PT_OK; /* none, or a poll found it done */
    if ((st = pt_comm_wait(&x->coll.zreq[h])) != PT_OK) return st;
    pt__trace_dp(x, PT_TRACE_DP_GATHER, x->coll.held[h], x->coll.z_t[h], x->act);
    return PT_OK;
}

/* ZeRO 3: bucket b's parameters gathered from the dp ranks' shards into
   half b % 2 of work: started (start) or done now. */
static pt_status pt__z3_gather(const pt_gpt *m, int b, int start) {
    pt_gpt_exec *x = m->exec;
    const pt__bucket *k = &x->coll.buckets[b];
    int h = b & 1;
    float *out = x->coll.work + (size_t)h * x->coll.work_n;
    const float *own = x->coll.pshard + k->shard_offset;
    pt_status st = pt__z3_sparse_finish(m); /* (the embedding's sums in work) */
    if (st != PT_OK) return st;
    x->coll.held[h] = b, x->coll.z_t[h] = pt_time_now();
    if (m->place.dp == 1) {
        memcpy(out, own, k->shard * sizeof(float));
        return PT_OK;
    }
    if (start) return pt_comm_all_gather_start(x->coll.ag_comm, own, out, k->shard, &x->coll.zreq[h]);
    st = pt_comm_all_gather(x->coll.ag_comm, own, out, k->shard);
    if (st == PT_OK) pt__trace_dp(x, PT_TRACE_DP_GATHER, b, x->coll.z_t[h], x->act);
    return st;
}

/* ZeRO 3: bucket b (< 0: none) gathered and whole in its half before its
   tensors are read; then, with overlap (ag_on), bucket nxt's gather started
   into the other half (whose bucket is done with) to run behind b's compute.
   A bucket still held from before is not gathered again (the update and any
   write of the parameters let go of both halves: pt__z3_drop). */
static pt_status pt__z3_need(const pt_gpt *m, int b, int nxt) {
    pt_gpt_exec *x = m->exec;
    pt_status st = x->coll.poll_st;
    int h = b & 1;
    if (m->place.zero != 3 || b < 0) return PT_OK;
    if (st == PT_OK) st = pt__z3_wait(m, h);
    if (st == PT_OK && x->coll.held[h] != b) st = pt__z3_gather(m, b, 0);
    if (st == PT_OK && x->coll.ag_on && nxt >= 0 && (nxt & 1) != h && x->coll.held[nxt & 1] != nxt &&
        (st = pt__z3_wait(m, nxt & 1)) == PT_OK)
        st = pt__z3_gather(m, nxt, 1);
    pt__ag_fold(x);
    return st;
}

/* ZeRO 3: both halves let go of (waited for first): the parameters changed,
   or a half is reused (h >= 0: that half only). */
static pt_status pt__z3_drop(const pt_gpt *m, int h) {
    pt_gpt_exec *x = m->exec;
    pt_status st;
    int j;
    if (!x || m->place.zero != 3) return PT_OK;
    st = pt__z3_sparse_finish(m);
    for (j = 0; j < 2; j++) {
        if (h >= 0 && j != h) continue;
        if (st == PT_OK) st = pt__z3_wait(m, j);
        x->coll.held[j] = -1;
    }
    return st;
}

/* ZeRO 3: a writer of the parameters laid out as the table (initialising,
   loading) writes into a whole local buffer m->params points to between
   pt__z3_open and pt__z3_close, outside any step (as loading the moments
   does); close keeps this rank's shard of it (commit) and frees it. open
   returns what close restores: m->params itself, without ZeRO 3 (NULL: out
   of memory, *st says). */
static float *pt__z3_open(pt_gpt *m, pt_status *st) {
    float *keep = m->params;
    *st = PT_OK;
    if (m->place.zero != 3 || !m->params) return keep;
    if ((*st = pt__z3_drop(m, -1)) != PT_OK) return NULL;
    m->params = (float *)pt__malloc(m->num_params * sizeof(float), m->alloc_ctx);
    if (!m->params) {
        m->params = keep;
        *st = pt__fail(PT_ERR_OOM, "cannot allocate %zu floats to write the parameters (zero=3)",
                       m->num_params);
        return NULL;
    }
    memset(m->params, 0, m->num_params * sizeof(float));
    return keep;
}

static pt_status pt__z3_close(pt_gpt *m, float *keep, int commit) {
    pt_gpt_exec *x = m->exec;
    int b;
    if (m->params == keep) return PT_OK;
    for (b = 0; commit && b < x->coll.num_buckets; b++) {
        const pt__bucket *k = &x->coll.buckets[b];
        memcpy(keep + k->shard_offset, m->params + k->offset + (size_t)m->place.dp_rank * k->shard,
               k->shard * sizeof(float));
    }
    pt__free(m->params, m->alloc_ctx);
    m->params = keep;
    return PT_OK;
}

static pt_status pt__ag_settle(const pt_gpt *m) {
    pt_status st = pt__ag_need(m, 0, 1 << 30);
    pt_gpt_exec *x = m->exec;
    int j;
    for (j = 0; x && m->place.zero == 3 && j < 2 && st == PT_OK; j++) st = pt__z3_wait(m, j);
    return st;
}

/* Adds the whole model's next tensor (spec s, name) to the table if this
   rank holds it (here), as its part: ROWS keeps rows/tp of them (a
   vocabulary's rows: place.vocab_local), COLS and QKV a 1/tp of the columns.
   A tensor of another stage only advances the whole model's offsets. */
static void pt__add_param(pt_gpt *m, const pt__spec *s, const char *name, int here) {
    pt_param *p = &m->table[m->num_tensors];
    int ndim = s->cols ? 2 : 1, tp = m->place.tp;
    int64_t rows = s->cols ? s->rows : 1, cols = s->cols ? s->cols : s->rows;
    int canon = m->num_canon++;
    if (!here) {
        m->num_params_full += (size_t)rows * (size_t)cols;
        return;
    }
    m->num_tensors++;
    p->canon = canon;
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = ndim;
    p->shard = tp > 1 ? s->shard : PT_SHARD_NONE;
    p->full_shape[0] = s->rows;
    p->full_shape[1] = s->cols ? s->cols : 1;
    p->full_numel = (size_t)rows * (size_t)cols;
    p->full_offset = m->num_params_full;
    if (p->shard == PT_SHARD_ROWS) rows = s->vocab ? m->place.vocab_local : rows / tp;
    if (p->shard == PT_SHARD_COLS || p->shard == PT_SHARD_QKV) cols /= tp;
    p->shape[0] = ndim > 1 ? rows : cols;
    p->shape[1] = ndim > 1 ? cols : 1;
    p->numel = (size_t)rows * (size_t)cols;
    p->offset = m->num_params;
    p->decay = ndim >= 2;
    p->bucket = -1;
    m->num_params += p->numel;
    m->num_params_full += p->full_numel;
}

/* Rows of a vocabulary tensor per bucket: about place.bucket_bytes (0: one
   layer's parameters), a multiple of dp (so a bucket that ends inside it
   needs no padding). */
static int pt__vocab_rows(const pt_gpt *m) {
    size_t bytes = m->place.bucket_bytes, C = (size_t)m->config.n_embd;
    int64_t rows = bytes ? (int64_t)((bytes + 4 * C - 1) / (4 * C)) : 12 * (int64_t)C / m->place.tp;
    int dp = m->place.dp;
    if (rows > m->place.vocab_local) rows = m->place.vocab_local;
    return rows < dp ? dp : (int)(rows - rows % dp);
}

/* The chunk holding local layer li (-1: none). */
static int pt__chunk_of(const pt_gpt *m, int li) {
    int c;
    for (c = 0; c < m->place.chunks; c++)
        if (li >= m->exec->pipe.chunk_lo[c] && li < m->exec->pipe.chunk_hi[c]) return c;
    return -1;
}

/* Closes a bucket from the end of the last one to flat offset end: inside a
   tensor (end - start a multiple of dp), or at the end of those added so
   far, padded to a multiple of dp. */
static void pt__end_bucket(pt_gpt *m, size_t end) {
    pt_gpt_exec *x = m->exec;
    pt__bucket *b = &x->coll.buckets[x->coll.num_buckets];
    const pt__bucket *prev = x->coll.num_buckets ? b - 1 : NULL;
    size_t dp = (size_t)m->place.dp;
    int i;
    b->offset = prev ? prev->offset + prev->numel : 0;
    if (end <= b->offset) return; /* nothing since the last bucket */
    b->shard = (end - b->offset + dp - 1) / dp;
    b->numel = b->shard * dp;
    b->shard_offset = x->coll.shard_total;
    b->first = -1;
    b->count = 0;
    for (i = 0; i < m->num_tensors; i++) {
        pt_param *p = &m->table[i];
        if (p->offset + p->numel <= b->offset || p->offset >= end) continue;
        if (b->first < 0) b->first = i;
        b->count++;
        if (p->offset >= b->offset) p->bucket = x->coll.num_buckets;
    }
    x->coll.shard_total += b->shard;
    if (end == m->num_params) m->num_params = b->offset + b->numel;
    x->coll.num_buckets++;
}

/* Whether table tensor i counts here when the stages' tensors are put
   together (the gradient norm, a gathered model): one of its pipeline copies
   does. wte's copy on the first stage; with Chimera, replica 0's (chunk 0's
   block, the embeddings on stage 0, the final norm and head on stage p-1). */
static int pt__counts_here(const pt_gpt *m, int i) {
    const pt_gpt_exec *x = m->exec;
    int l = x->tab_layers >= 0 && i >= x->tab_layers ? (i - x->tab_layers) / x->layer_tensors : -1;
    if (m->place.schedule != PT_SCHED_CHIMERA) return i != x->tab_wte || m->place.has_embed;
    if (l >= 0 && l < m->place.n_layers) return l >= x->pipe.chunk_lo[0] && l < x->pipe.chunk_hi[0];
    return i == x->tab_wte || i == x->tab_wpe ? x->pipe.embed_chunk == 0 : x->pipe.head_chunk == 0;
}

static int pt__holds_layer(const pt_gpt_place *pl, int l) {
    int i;
    for (i = 0; i < pl->n_layers; i++)
        if (pl->layer_id[i] == l) return 1;
    return 0;
}

/* Each bucket's layers (lf, nl): the tensors it overlaps are whole layers
   of the table, or part of one layer (nl 1: a half of the first layer,
   pt__build_table), or it has none (nl 0). */
static void pt__bucket_layers(pt_gpt *m) {
    pt_gpt_exec *x = m->exec;
    int b, per = x->layer_tensors;
    for (b = 0; b < x->coll.num_buckets; b++) {
        pt__bucket *k = &x->coll.buckets[b];
        int f = k->first - x->tab_layers;
        k->lf = k->nl = 0;
        if (x->tab_layers < 0 || f < 0 || k->count < 1 || f / per >= m->place.n_layers) continue;
        if (f % per == 0 && k->count % per == 0 && f / per + k->count / per <= m->place.n_layers)
            k->lf = f / per, k->nl = k->count / per;
        else if (f / per == (f + k->count - 1) / per)
            k->lf = f / per, k->nl = 1;
    }
}

/* The table of this rank's tensors from the whole model's (pt__canon_spec),
   and the gradient buckets: a vocabulary tensor in runs of rows (each run a
   bucket), the tensors before the first layer, each layer, those after. */
static void pt__build_table(pt_gpt *m) {
    pt_gpt_exec *x = m->exec;
    const pt_gpt_place *pl = &m->place;
    pt__spec s;
    char name[64];
    int k, last = PT__AT_TIED, local = -1; /* local: the last layer added, here */
    m->num_tensors = m->num_canon = 0;
    m->num_params = m->num_params_full = 0;
    x->coll.num_buckets = 0;
    x->coll.shard_total = 0;
    x->tab_wte = x->tab_wpe = x->tab_layers = x->tab_lnf = x->tab_lnf_b = x->tab_head = -1;
    x->layer_tensors = pt__layer_count(&m->config);
    for (k = 0; pt__canon_spec(&m->config, k, &s, name, sizeof name); k++) {
        int here = s.layer >= 0             ? pt__holds_layer(pl, s.layer)
                   : s.layer == PT__AT_TIED ? pl->has_embed || pl->has_head
                   : s.layer == PT__AT_EMBED ? pl->has_embed
                                             : pl->has_head;
        int vocab = here && s.vocab, t = m->num_tensors;
        int64_t r;
        if (s.layer != last && (last >= 0 || s.layer >= 0)) { /* a layer begins or ends */
            /* (bucket_bytes: layers of one chunk share a bucket until it holds that) */
            size_t open = x->coll.num_buckets ? x->coll.buckets[x->coll.num_buckets - 1].offset +
                                               x->coll.buckets[x->coll.num_buckets - 1].numel : 0;
            int join = pl->bucket_bytes && last >= 0 && s.layer >= 0 && here && local >= 0 &&
                       pt__chunk_of(m, local) == pt__chunk_of(m, local + 1) &&
                       (m->num_params - open) * sizeof(float) < pl->bucket_bytes;
            if (!join) pt__end_bucket(m, m->num_params);
        }
        if (here && s.layer >= 0 && s.layer != last) local++;
        last = s.layer;
        if (vocab) pt__end_bucket(m, m->num_params); /* it starts a bucket */
        if (here && s.layer == 0 && s.field == offsetof(pt_block_params, ln2_w) &&
            !pl->bucket_bytes && pl->zero < 2 && !pl->sp) /* the first layer's attention half
                                                             alone: pt__ov_part */
            pt__end_bucket(m, m->num_params);
        pt__add_param(m, &s, name, here);
        if (!here) continue;
        if (s.role == PT__R_WTE) x->tab_wte = t;
        if (s.role == PT__R_WPE) x->tab_wpe = t;
        if (s.layer >= 0 && x->tab_layers < 0) x->tab_layers = t;
        if (s.role == PT__R_LNF_W) x->tab_lnf = t;
        if (s.role == PT__R_LNF_B) x->tab_lnf_b = t;
        if (s.role == PT__R_HEAD) x->tab_head = t;
        for (r = pt__vocab_rows(m); vocab && r < m->table[t].shape[0]; r += pt__vocab_rows(m))
            pt__end_bucket(m, m->table[t].offset + (size_t)r * (size_t)s.cols);
    }
    pt__end_bucket(m, m->num_params);
    pt__bucket_layers(m);
}

/* Copies rows of a tensor between its full layout and this rank's part.
   to_local: full -> local (local padding rows become 0); else local -> full. */
static void pt__shard_copy(const pt_gpt *m, const pt_param *p, float *local, float *full,
                           int to_local) {
    int64_t frows = p->ndim > 1 ? p->full_shape[0] : 1;
    int64_t fcols = p->ndim > 1 ? p->full_shape[1] : p->full_shape[0], r, c;
    if (p->shard == PT_SHARD_NONE) {
        if (to_local) memcpy(local, full, p->numel * sizeof(float));
        else memcpy(full, local, p->numel * sizeof(float));
        return;
    }
    if (to_local) memset(local, 0, p->numel * sizeof(float));
    for (r = 0; r < frows; r++)
        for (c = 0; c < fcols; c++) {
            ptrdiff_t i = pt__local_index(p, m->place.tp_rank, r, c);
            if (i < 0) continue;
            if (to_local) local[i] = full[r * fcols + c];
            else full[r * fcols + c] = local[i];
        }
}

/* A buffer laid out as the table (this rank's tensor parts), assembled from
   its dp shards when ZeRO keeps only those: into tmp, which it returns. */
static const float *pt__local_buf(const pt_gpt *m, pt_state_buf which, float *tmp,
                                  pt_status *st) {
    const pt_gpt_exec *x = m->exec;
    const float *shards = which == PT_BUF_GRADS    ? x->coll.gshard
                          : which == PT_BUF_ADAM_M ? m->m
                          : which == PT_BUF_ADAM_V ? m->v
                                                   : x->coll.pshard;
    int b;
    *st = PT_OK;
    if (which == PT_BUF_PARAMS && m->place.zero < 3) return m->params;
    if (!m->place.zero) return which == PT_BUF_GRADS ? m->grads : shards;
    for (b = 0; b < x->coll.num_buckets && *st == PT_OK; b++) {
        const pt__bucket *k = &x->coll.buckets[b];
        if (m->place.dp == 1)
            memcpy(tmp + k->offset, shards + k->shard_offset, k->shard * sizeof(float));
        else
            *st = pt_comm_all_gather(x->dp_comm, shards + k->shard_offset, tmp + k->offset,
                                     k->shard);
    }
    return tmp;
}

PTRAINDEF pt_status pt_gpt_gather(const pt_gpt *m, pt_state_buf which, float *full) {
    const pt_gpt_exec *x = m->exec;
    const pt_gpt_place *pl = &m->place;
    size_t most = 0;
    float *parts, *tmp = NULL;
    const float *local;
    int i, k;
    pt_status st;
    if (!m->params || (which != PT_BUF_PARAMS && !m->m))
        return pt__fail(PT_ERR_INVALID_ARG, "model has no %s", m->params ? "training state"
                                                                          : "memory (meta=1)");
    if ((st = pt__ag_settle(m)) != PT_OK) return st;
    for (i = 0; i < m->num_tensors; i++)
        if (m->table[i].shard != PT_SHARD_NONE && m->table[i].numel > most)
            most = m->table[i].numel;
    parts = (float *)pt__malloc(most * (size_t)pl->tp * sizeof(float), m->alloc_ctx);
    if (pl->zero == 3 || (pl->zero && which != PT_BUF_PARAMS))
        tmp = (float *)pt__malloc(m->num_params * sizeof(float), m->alloc_ctx);
    if (!parts || ((pl->zero == 3 || (pl->zero && which != PT_BUF_PARAMS)) && !tmp)) {
        pt__free(parts, m->alloc_ctx);
        pt__free(tmp, m->alloc_ctx);
        return pt__fail(PT_ERR_OOM, "cannot allocate the buffers to gather the model");
    }
    local = pt__local_buf(m, which, tmp, &st);
    if (pl->pp > 1) memset(full, 0, m->num_params_full * sizeof(float)); /* summed over stages */
    for (i = 0; i < m->num_tensors && st == PT_OK; i++) {
        const pt_param *p = &m->table[i];
        int64_t frows = p->ndim > 1 ? p->full_shape[0] : 1;
        int64_t fcols = p->ndim > 1 ? p->full_shape[1] : p->full_shape[0], r, c;
        float *dst = full + p->full_offset;
        if (!pt__counts_here(m, i)) continue; /* the first stage gives wte */
        if (p->shard == PT_SHARD_NONE) {
            memcpy(dst, local + p->offset, p->numel * sizeof(float));
            continue;
        }
        /* parts[k * numel ..] = rank k's part, then each element to its place */
        st = pt_comm_all_gather(x->tp_comm, local + p->offset, parts, p->numel);
        for (k = 0; k < pl->tp && st == PT_OK; k++)
            for (r = 0; r < frows; r++)
                for (c = 0; c < fcols; c++) {
                    ptrdiff_t j = pt__local_index(p, k, r, c);
                    if (j >= 0) dst[r * fcols + c] = parts[(size_t)k * p->numel + (size_t)j];
                }
    }
    if (st == PT_OK && pl->pp > 1) /* each stage wrote its tensors, zeros elsewhere */
        st = pt_comm_all_reduce(x->pp_comm, full, m->num_params_full, PT_REDUCE_SUM);
    pt__free(parts, m->alloc_ctx);
    pt__free(tmp, m->alloc_ctx);
    return st;
}

/* Named pointers into a flat buffer laid out as the table, or (stage) each
   tensor at its place within its bucket, all buckets sharing one buffer
   (ZeRO 2 gradients: one bucket at a time), or with stage = 2 bucket b in
   half b % 2 of two (ZeRO 3's gathered parameters; a vocabulary tensor
   spans buckets: its pointer is its first bucket's, read bucket by bucket). */
static void pt__bind(const pt_gpt *m, float *base, int stage, float **wte, float **wpe,
                     float **lnf_w, float **lnf_b, float **head, pt_block_params *layers) {
    const pt_gpt_exec *x = m->exec;
    const pt_param *t = m->table;
    pt__spec s;
    int l, k;
#define PT__AT(i)                                                                            \
    (!base || (i) < 0 ? NULL                                                                 \
                      : base + t[i].offset - (stage ? x->coll.buckets[t[i].bucket].offset : 0) + \
                            (stage == 2 ? (size_t)(t[i].bucket & 1) * x->coll.work_n : 0))
    *wte = PT__AT(x->tab_wte);
    *wpe = PT__AT(x->tab_wpe);
    for (l = 0; l < m->place.n_layers; l++) /* a layer's tensors, in canonical order */
        for (k = 0; k < x->layer_tensors; k++) {
            int i = x->tab_layers + x->layer_tensors * l + k;
            pt__canon_spec(&m->config, t[i].canon, &s, NULL, 0);
            *(float **)((char *)&layers[l] + s.field) = PT__AT(i);
        }
    *lnf_w = PT__AT(x->tab_lnf);
    *lnf_b = PT__AT(x->tab_lnf_b);
    *head = m->config.untied_head ? PT__AT(x->tab_head) : *wte;
#undef PT__AT
}

/* ---- building a model: checks, tables, buffers, communicators ------------ */

/* The chunk of this stage holding block k of the model's layers (see
   pt__sched_vstage), or -1. */
static int pt__chunk_with(const pt_gpt_place *pl, int k) {
    int c;
    for (c = 0; c < pl->chunks; c++)
        if (pt__sched_vstage(pl->schedule, pl->pp, pl->pp_rank, c) == k) return c;
    return -1;
}

/* Layers of the whole model to this stage's chunks: block k (of V =
   pt__sched_blocks; chunk c of stage s holds k = pt__sched_vstage) gets
   floor(L/V) layers, one more for the first L mod V blocks. Local layers
   ascend by global index, so two stages holding the same blocks (Chimera)
   lay out their tensors alike. */
static void pt__assign_layers(pt_gpt *m) {
    pt_gpt_exec *x = m->exec;
    pt_gpt_place *pl = &m->place;
    int L = m->config.n_layer, V = pt__sched_blocks(pl->schedule, pl->pp, pl->chunks), c, j, n = 0;
#define PT__BLOCK_FIRST(k) ((k) * (L / V) + ((k) < L % V ? (k) : L % V))
    for (c = 0; c < pl->chunks; c++) {
        int k = pt__sched_vstage(pl->schedule, pl->pp, pl->pp_rank, c), l, at = 0;
        int count = L / V + (k < L % V);
        for (j = 0; j < pl->chunks; j++) { /* the layers of the chunks below it */
            int kj = pt__sched_vstage(pl->schedule, pl->pp, pl->pp_rank, j);
            if (kj < k) at += L / V + (kj < L % V);
        }
        x->pipe.chunk_lo[c] = at, x->pipe.chunk_hi[c] = at + count;
        for (l = 0; l < count; l++) x->layer_id[at + l] = PT__BLOCK_FIRST(k) + l;
        n += count;
    }
#undef PT__BLOCK_FIRST
    x->pipe.embed_chunk = pt__chunk_with(pl, 0);
    x->pipe.head_chunk = pt__chunk_with(pl, V - 1);
    pl->n_layers = n;
    pl->layer_id = x->layer_id;
}

/* The desc's checks, every failed one reported; on success the config with
   its defaults, the capacity and this rank's place. */
/* Context parallelism's checks, appended to the error (*bad counts them);
   the place's cp and, folded into dp, the reduction group. */
static void pt__gpt_check_cp(pt_gpt_place *pl, const pt_gpt_desc *d, int *bad) {
    const pt_grid *g = d->grid;
    int was = *bad, gcp = g && g->cp > 1 ? g->cp : 1;
    pl->cp = d->context_parallel > 0 ? d->context_parallel : 1;
    pl->cp_rank = gcp > 1 ? g->cp_rank : 0;
    if (d->context_parallel < 0)
        pt__append_error(bad, "context_parallel=%d must be >= 0", d->context_parallel);
    else if (pl->cp != gcp)
        pt__append_error(bad, "context_parallel=%d but the grid has cp=%d (pt_grid_init_cp "
                         "builds the cp groups)", pl->cp, gcp);
    else if (pl->cp > 1 && d->seq >= 1 && d->seq % (2 * pl->cp) != 0)
        pt__append_error(bad, "context_parallel=%d: seq=%d is not a multiple of 2*cp=%d (each "
                         "rank holds two chunks of seq/(2cp) tokens)", pl->cp, d->seq, 2 * pl->cp);
    else if (pl->cp > 1 && pl->sp && (d->seq / pl->cp) % pl->tp != 0)
        pt__append_error(bad, "context_parallel=%d with sequence_parallel: seq/cp=%d is not a "
                         "multiple of tp=%d", pl->cp, d->seq / pl->cp, pl->tp);
    if (pl->cp > 1 && d->inference)
        pt__append_error(bad, "context_parallel=%d with inference=1 is not supported yet (a "
                         "model for sampling holds whole sequences)", pl->cp);
    if (*bad > was || pl->cp == 1) return;
    pl->dp_rank = pl->dp_rank * pl->cp + pl->cp_rank;
    pl->dp *= pl->cp;
}

static pt_status pt__gpt_check(pt_gpt *m, const pt_gpt_desc *d) {
    pt_gpt_config cfg = d->config;
    pt_gpt_place *pl = &m->place;
    const pt_grid *g = d->grid;
    int bad = 0;
    if (cfg.ln_eps == 0.0f) cfg.ln_eps = 1e-5f;
    if (pt_gpt_config_validate(&cfg) != PT_OK) bad = 1; /* its message stays first */
    if (d->batch < 1) pt__append_error(&bad, "batch=%d must be >= 1", d->batch);
    if (d->seq < 1 || d->seq > cfg.block_size)
        pt__append_error(&bad, "seq=%d must be in [1, block_size=%d]", d->seq, cfg.block_size);
    if (!bad && (int64_t)d->batch * d->seq > (1 << 30))
        pt__append_error(&bad, "batch*seq=%lld is too large", (long long)d->batch * d->seq);
    pl->tp = g ? g->tp : 1, pl->tp_rank = g ? g->tp_rank : 0;
    pl->dp = g ? g->dp : 1, pl->dp_rank = g ? g->dp_rank : 0;
    pl->pp = g ? g->pp : 1, pl->pp_rank = g ? g->pp_rank : 0;
    pl->zero = d->zero;
    pl->micro = d->grad_accum > 0 ? d->grad_accum : 1;
    pl->chunks = pt__sched_chunks(d->schedule, d->chunks);
    pl->recompute = d->recompute;
    pl->schedule = pt__sched_resolve(d->schedule, pl->chunks);
    if (pl->tp < 1 || (cfg.n_head >= 1 && cfg.n_head % pl->tp != 0))
        pt__append_error(&bad, "tensor_parallel=%d does not divide n_head=%d", pl->tp,
                         cfg.n_head);
    else if (cfg.n_kv_head >= 1 && cfg.n_kv_head % pl->tp != 0)
        pt__append_error(&bad, "tensor_parallel=%d does not divide n_kv_head=%d (each rank holds "
                         "whole key/value heads and the query heads that share them)", pl->tp,
                         cfg.n_kv_head);
    if (pl->tp >= 1 && cfg.ffn_hidden >= 1 && cfg.ffn_hidden % pl->tp != 0)
        pt__append_error(&bad, "tensor_parallel=%d does not divide ffn_hidden=%d", pl->tp,
                         cfg.ffn_hidden);
    if (d->zero < 0 || d->zero > 3) pt__append_error(&bad, "zero=%d must be 0, 1, 2 or 3", d->zero);
    pl->sp = d->sequence_parallel != 0;
    if (d->sequence_parallel < 0 || d->sequence_parallel > 1)
        pt__append_error(&bad, "sequence_parallel=%d must be 0 (off) or 1", d->sequence_parallel);
    else if (pl->sp && pl->tp < 2)
        pt__append_error(&bad, "sequence_parallel=1 needs tensor parallelism (tp=%d; tp >= 2 "
                         "splits the sequence over the tensor ranks)", pl->tp);
    else if (pl->sp && d->seq >= 1 && d->seq % pl->tp != 0)
        pt__append_error(&bad, "sequence_parallel=1: seq=%d is not a multiple of tp=%d (each "
                         "tensor rank holds seq/tp of the tokens)", d->seq, pl->tp);
    pt__gpt_check_cp(pl, d, &bad);
    pl->bucket_bytes = d->bucket_bytes;
    if (!bad && d->bucket_bytes > (uint64_t)pt_gpt_num_params(&cfg) * sizeof(float))
        pt__append_error(&bad, "bucket_bytes=%zu is more than the model's %.0f bytes of "
                         "parameters", d->bucket_bytes,
                         (double)pt_gpt_num_params(&cfg) * (double)sizeof(float));
    if (d->bucket_bytes && d->zero == 2)
        pt__append_error(&bad, "bucket_bytes=%zu with zero=2: ZeRO 2 holds one layer's "
                         "gradients at a time, so its buckets are a layer each", d->bucket_bytes);
    if ((int)d->precision < 0 || d->precision > PT_PRECISION_BF16)
        pt__append_error(&bad, "precision=%d must be 0 (fp32), PT_PRECISION_FP32 or "
                         "PT_PRECISION_BF16", (int)d->precision);
    m->ctx.precision = d->precision == PT_PRECISION_BF16 ? PT_PRECISION_BF16 : PT_PRECISION_FP32;
    if (d->grad_accum < 0) pt__append_error(&bad, "grad_accum=%d must be >= 0", d->grad_accum);
    if (d->chunks < 0) pt__append_error(&bad, "chunks=%d must be >= 0", d->chunks);
    if (d->recompute < 0 || d->recompute > PT_RECOMPUTE_FULL)
        pt__append_error(&bad, "recompute=%d must be 0 (none), 1 (selective) or 2 (full)",
                         d->recompute);
    if ((int)d->schedule < 0 || d->schedule >= PT_SCHED_COUNT)
        pt__append_error(&bad, "schedule=%d is no schedule kind (0..%d)", (int)d->schedule,
                         PT_SCHED_COUNT - 1);
    if (d->inference && d->zero)
        pt__append_error(&bad, "zero=%d needs training state (inference=1 given)", d->zero);
    if (g && !g->world && !d->meta)
        pt__append_error(&bad, "the grid has no communicators (only meta builds may)");
    if (pl->pp > 1 && d->zero == 2)
        pt__append_error(&bad, "zero=%d with pipeline stages (pp=%d) is not supported: its "
                         "gradients would be reduced once per micro-batch; use zero <= 1 or 3",
                         d->zero, pl->pp);
    if (pl->pp > 1 && d->zero == 3 && pl->schedule == PT_SCHED_CHIMERA)
        pt__append_error(&bad, "zero=3 with schedule chimera is not supported: its replicas sum "
                         "whole gradients before the dp reduction");
    if (d->zero == 3 && (pl->schedule == PT_SCHED_2BW || pt__sched_splits(pl->schedule)))
        pt__append_error(&bad, "zero=3 with schedule %s is not supported: %s", pt_schedule_kind_name(pl->schedule),
                         pl->schedule == PT_SCHED_2BW ? "its weight versions are whole copies of "
                         "the parameters, which ZeRO 3 never holds" : "its W runs apart from B, "
                         "after the layer's gathered parameters and reduced gradients are let go");
    if (d->bucket_bytes && d->zero == 3)
        pt__append_error(&bad, "bucket_bytes=%zu with zero=3: ZeRO 3 gathers and reduces one "
                         "layer at a time, so its buckets are a layer each", d->bucket_bytes);
    if (pt__sched_blocks(pl->schedule, pl->pp, pl->chunks) > cfg.n_layer)
        pt__append_error(&bad, pl->schedule == PT_SCHED_CHIMERA
                                   ? "pipeline: chimera's pp=%d blocks (chunks=%d: each stage "
                                     "holds two of them) > n_layer=%d (each needs a layer)"
                                   : "pipeline: pp=%d x chunks=%d virtual stages > n_layer=%d "
                                     "(each needs a layer)", pl->pp, pl->chunks, cfg.n_layer);
    if (pl->pp > 1 && !d->meta && (int64_t)pl->micro * pl->pp * pl->chunks * 2 > 32767)
        pt__append_error(&bad, "pipeline: %d micro-batches x %d virtual stages exceed the "
                         "message tags (16383)", pl->micro, pl->pp * pl->chunks);
    if (pl->pp > 1 && d->inference)
        pt__append_error(&bad, "a pipeline model is for training; gather it whole to sample");
    if (pl->pp == 1 && pl->chunks > 1)
        pt__append_error(&bad, "chunks=%d needs a pipeline (grid pp > 1)", pl->chunks);
    if (pt__sched_splits(pl->schedule) && pl->recompute == PT_RECOMPUTE_FULL && !d->inference)
        pt__append_error(&bad, "%s keeps activations from B to W; full recomputation "
                         "would drop them (use selective or none)",
                         pt_schedule_kind_name(pl->schedule));
    if (bad) return PT_ERR_CONFIG;
    m->config = cfg;
    m->B = d->batch;
    m->T = d->seq / pl->cp; /* this rank's share of a sequence */
    /* the stages holding the first and the last block (ZB-V: the first stage
       both; Chimera: the first and the last stage both, one of each replica) */
    pl->has_embed = pt__chunk_with(pl, 0) >= 0;
    pl->has_head = pt__chunk_with(pl, pt__sched_blocks(pl->schedule, pl->pp, pl->chunks) - 1) >= 0;
    /* the vocabulary padded to a multiple of tp, as Megatron-LM pads GPT-2's */
    pl->vocab_local = (cfg.vocab_size + pl->tp - 1) / pl->tp;
    pl->vocab_offset = pl->tp_rank * pl->vocab_local;
    return PT_OK;
}

/* The step's schedule over the stages (one stage without a pipeline), built
   and checked; *slots its peak in flight on this stage. A meta build may be
   handed the checked report instead; an inference model runs no steps. */
static pt_status pt__gpt_schedule(const pt_gpt *m, const pt_gpt_desc *d, pt_schedule *s,
                                  int *slots) {
    const pt_gpt_place *pl = &m->place;
    pt_schedule_report rep;
    pt_status st;
    memset(s, 0, sizeof *s);
    s->alloc_ctx = d->alloc_ctx;
    *slots = 1;
    if (d->inference) return PT_OK;
    if (d->meta && d->schedule_report) {
        *slots = d->schedule_report->peak_inflight[pl->pp_rank];
        return PT_OK;
    }
    if ((st = pt_schedule_build(s, pl->schedule, pl->pp, pl->chunks, pl->micro)) != PT_OK)
        return st;
    if ((st = pt_schedule_check(s, &rep)) != PT_OK) {
        pt_schedule_free(s);
        return st;
    }
    *slots = rep.peak_inflight[pl->pp_rank];
    return PT_OK;
}

/* The private state and every table in one allocation: L bounds the local
   layers, nslots x L the slots' layers. */
static pt_status pt__gpt_tables(pt_gpt *m, int nslots) {
    size_t L = (size_t)m->config.n_layer, S = (size_t)nslots, nbook, ntensors;
    /* buckets close at most: before and inside each of two vocabulary tensors,
       at each of the L + 1 ends of a layer run, and at the end */
    size_t nbuckets = L + 5 + 2 * (size_t)(m->place.vocab_local / pt__vocab_rows(m));
    pt__spec s;
    unsigned char *book;
    pt_gpt_exec *x;
    int k;
    for (k = 0; pt__canon_spec(&m->config, k, &s, NULL, 0); k++) {
    }
    ntensors = (size_t)k;
    nbook = sizeof(pt_gpt_exec) + sizeof(pt_param) * ntensors + sizeof(pt_block_params) * 3 * L +
            sizeof(pt_block_acts) * L * S + sizeof(pt__bucket) * nbuckets +
            (sizeof(pt_comm_req) + sizeof(double)) * 2 * nbuckets + sizeof(pt__slot) * S +
            sizeof(pt_block_wgrad) * L * S +
            sizeof(int) * (L + 3 * (size_t)m->place.chunks + 2 * nbuckets);
    book = (unsigned char *)pt__malloc(nbook, m->alloc_ctx);
    if (!book) return pt__fail(PT_ERR_OOM, "cannot allocate the model's tables");
    memset(book, 0, nbook);
    m->exec = x = (pt_gpt_exec *)book;
    m->table = (pt_param *)(x + 1);
    m->layers = (pt_block_params *)(m->table + ntensors);
    x->coll.layer_grads = m->layers + L;
    x->wv.pv_layers = x->coll.layer_grads + L;
    x->pipe.acts = (pt_block_acts *)(x->wv.pv_layers + L);
    x->coll.buckets = (pt__bucket *)(x->pipe.acts + L * S);
    x->coll.ov_req = (pt_comm_req *)(x->coll.buckets + nbuckets);
    x->coll.ag_req = x->coll.ov_req + nbuckets;
    x->coll.ov_t = (double *)(x->coll.ag_req + nbuckets);
    x->coll.ag_t = x->coll.ov_t + nbuckets;
    x->pipe.slots = (pt__slot *)(x->coll.ag_t + nbuckets);
    x->pipe.slots[0].wg = (pt_block_wgrad *)(x->pipe.slots + S); /* see pt__layout_acts */
    x->layer_id = (int *)(x->pipe.slots[0].wg + L * S);
    x->pipe.chunk_lo = x->layer_id + L;
    x->pipe.chunk_hi = x->pipe.chunk_lo + m->place.chunks;
    x->coll.ov_done = x->pipe.chunk_hi + m->place.chunks;
    x->coll.ov_at = x->coll.ov_done + m->place.chunks;
    x->coll.ag_at = x->coll.ov_at + nbuckets;
    x->pipe.nslots = nslots;
    return PT_OK;
}

/* The grid's groups, and (pipeline) the pair of ranks holding copies of the
   same tensors (tie_comm): every world rank joins the split; the first and
   last stage of one tp, dp place get a group of 2 for wte's two copies, or
   with Chimera stages s and p-1-s, which hold the same two blocks. */
static pt_status pt__gpt_comms(pt_gpt *m, const pt_gpt_desc *d) {
    pt_gpt_exec *x = m->exec;
    const pt_gpt_place *pl = &m->place;
    const pt_grid *g = d->grid;
    pt_comm *tie;
    pt_status st;
    int tied = pl->has_embed || pl->has_head;
    x->grid = d->grid;
    if (!g || !g->world) return PT_OK; /* one rank, or a meta build of sizes alone */
    x->tp_comm = pl->tp > 1 ? &d->grid->tp_comm : NULL;
    x->dp_comm = pl->dp > 1 ? pl->cp > 1 ? &d->grid->dpcp_comm : &d->grid->dp_comm : NULL;
    x->pp_comm = pl->pp > 1 ? &d->grid->pp_comm : NULL;
    x->cp.comm = pl->cp > 1 ? &d->grid->cp_comm : NULL;
    if (pl->zero && pl->dp > 1) { /* the overlapped gathers' own copy of the dp group */
        if (!(x->coll.ag_comm = (pt_comm *)pt__malloc(sizeof(pt_comm), m->alloc_ctx)))
            return pt__fail(PT_ERR_OOM, "cannot allocate a communicator");
        if ((st = pt_comm_split(x->dp_comm, 0, pl->dp_rank, x->coll.ag_comm)) != PT_OK) {
            pt__free(x->coll.ag_comm, m->alloc_ctx);
            x->coll.ag_comm = NULL;
            return st;
        }
    }
    if (pl->pp == 1) return PT_OK;
    if (!(tie = (pt_comm *)pt__malloc(sizeof(pt_comm), m->alloc_ctx)))
        return pt__fail(PT_ERR_OOM, "cannot allocate a communicator");
    if (pl->schedule == PT_SCHED_CHIMERA) {
        int pair = pl->pp_rank < pl->pp - 1 - pl->pp_rank ? pl->pp_rank : pl->pp - 1 - pl->pp_rank;
        st = pt_comm_split(g->world, g->tp_rank + g->tp * (pl->dp_rank + pl->dp * pair),
                           pl->pp_rank, tie);
    } else { /* (pl->dp_rank: the dp x cp place; a stage's ranks number tp x dp x cp) */
        st = pt_comm_split(g->world, tied ? g->tp_rank + g->tp * pl->dp_rank
                                          : g->tp * pl->dp + g->world->rank, pl->pp_rank, tie);
    }
    if (st != PT_OK) {
        pt__free(tie, m->alloc_ctx);
        return st;
    }
    x->tie_comm = tie;
    return PT_OK;
}

static size_t pt__largest_bucket(const pt_gpt *m) {
    const pt_gpt_exec *x = m->exec;
    size_t most = 0;
    int b;
    for (b = 0; b < x->coll.num_buckets; b++)
        if (x->coll.buckets[b].numel > most) most = x->coll.buckets[b].numel;
    return most;
}

/* What the memory report (pt__layout_state), the simulator and the
   checkpoints (>>io) read of a rank's executor: its chunks' layer ranges
   (place.chunks of them), its buckets and shards, the world it belongs to
   (the activation slots are public: m->mem.slots). Valid while m lives;
   all zero for a model not built. */
typedef struct pt__exec_layout {
    pt_comm *world;                 /* the grid's (NULL: one rank) */
    int split;                      /* the schedule runs W apart from B */
    const int *chunk_lo, *chunk_hi; /* (place.chunks) local layers [lo, hi) of each */
    int num_buckets;
    const pt__bucket *buckets;      /* (num_buckets) offsets, sizes, whole layers */
    size_t largest_bucket, largest_shard, shard_total;
} pt__exec_layout;

static pt__exec_layout pt__exec_layout_of(const pt_gpt *m) {
    const pt_gpt_exec *x = m->exec;
    pt__exec_layout o;
    int b;
    memset(&o, 0, sizeof o);
    if (!x) return o;
    o.world = x->grid ? x->grid->world : NULL;
    o.split = x->pipe.split;
    o.chunk_lo = x->pipe.chunk_lo, o.chunk_hi = x->pipe.chunk_hi;
    o.num_buckets = x->coll.num_buckets, o.buckets = x->coll.buckets;
    o.largest_bucket = pt__largest_bucket(m), o.largest_shard = 0;
    o.shard_total = x->coll.shard_total;
    for (b = 0; b < x->coll.num_buckets; b++)
        if (x->coll.buckets[b].shard > o.largest_shard) o.largest_shard = x->coll.buckets[b].shard;
    return o;
}

/* Whether gradients are staged a bucket at a time and reduce-scattered as
   backward finishes each (ZeRO 2; ZeRO 3 on one stage), or accumulated whole
   over the micro-batches and reduced after the last (ZeRO 0, 1; ZeRO 3 under
   pipeline stages, whose micro-batches interleave). */
static int pt__grads_staged(const pt_gpt_place *pl) {
    return pl->zero == 2 || (pl->zero == 3 && pl->pp == 1);
}

/* Whether wte's rows no token reads may reduce early (pt__exec_coll.tmask):
   one stage, one chunk, the head tied to wte, ZeRO 0 or 1, a dp group. */
static int pt__wte_ok(const pt_gpt *m) {
    const pt_gpt_place *pl = &m->place;
    return pl->pp == 1 && pl->chunks == 1 && pl->dp > 1 && pl->zero < 2 && !m->config.untied_head &&
           m->exec->tab_wte >= 0 && !m->exec->pipe.split;
}

/* The floats of wpe's gradient pt__wte_ok's compact buffer keeps for T
   local tokens: all of wpe, or context parallel the rows of this rank's T
   positions (the other ranks' are gathered: pt__wpe_gather). */
static size_t pt__wpe_kept(const pt_gpt *m, int T) {
    const pt_gpt_exec *x = m->exec;
    if (x->tab_wpe < 0) return 0;
    return x->cp.comm ? (size_t)T * (size_t)m->config.n_embd : m->table[x->tab_wpe].numel;
}

/* pt__wte_ok's buffers: the compact rows at most a quarter of wte (or the
   rows a step's tokens can read), counted with the gradients. */
static void pt__layout_wte(pt_gpt *m, pt_arena *a) {
    pt_gpt_exec *x = m->exec;
    size_t V = (size_t)m->place.vocab_local, C = (size_t)m->config.n_embd, N = (size_t)m->B * m->T;
    size_t reads = N * (size_t)m->place.dp * (size_t)m->place.micro;
    size_t wpe = pt__wpe_kept(m, m->T), used = a->used;
    x->coll.tcap = (int)(reads < V / 4 ? reads : V / 4);
    x->coll.tmask = PT__F(a, V);
    x->coll.tkeep = PT__F(a, (size_t)x->coll.tcap * C + wpe);
    x->coll.tslot = (int *)pt_arena_alloc(a, V * sizeof(int));
    x->coll.tinp = (int *)pt_arena_alloc(a, N * sizeof(int));
    m->mem.grads += a->used - used;
}

/* Parameters; then, for training, gradients and the AdamW moments:
   whole (zero 0), moments of this rank's shard only plus its averaged
   gradients (zero 1), and (zero 2) gradients of one bucket at a time;
   zero 3 holds the parameters' shards and two buckets gathered (the one in
   use and the next: prefetch), and reduce-scatters into the half done with. */
static void pt__layout_state(pt_gpt *m, pt_arena *a, int inference) {
    pt_gpt_exec *x = m->exec;
    pt__exec_layout o = pt__exec_layout_of(m);
    int zero = m->place.zero;
    size_t P = m->num_params, moments, grads, params;
    moments = zero ? o.shard_total : P;
    grads = (pt__grads_staged(&m->place) ? o.largest_bucket : P) + (zero ? o.shard_total : 0) +
            (pt__grads_staged(&m->place) ? o.largest_shard : 0);
    params = zero == 3 ? o.shard_total + 2 * o.largest_bucket : P;
    /* 2BW keeps a second version of the weights */
    m->mem.params = (!inference && m->place.schedule == PT_SCHED_2BW ? 2 : 1) * params * sizeof(float);
    m->mem.grads = inference ? 0 : grads * sizeof(float);
    m->mem.optimizer = inference ? 0 : 2 * moments * sizeof(float);
    if (zero == 3) {
        m->params = x->coll.pshard = PT__F(a, o.shard_total);
        x->coll.work = PT__F(a, 2 * o.largest_bucket);
        x->coll.work_n = o.largest_bucket;
        x->coll.held[0] = x->coll.held[1] = x->coll.zrows = -1;
    } else {
        m->params = PT__F(a, P);
    }
    if (inference) return;
    if (m->place.schedule == PT_SCHED_2BW) x->wv.wprev = PT__F(a, P);
    m->m = PT__F(a, moments);
    m->v = PT__F(a, moments);
    m->grads = PT__F(a, pt__grads_staged(&m->place) ? o.largest_bucket : P); /* the stage of one
                                                                                bucket */
    if (zero) x->coll.gshard = PT__F(a, o.shard_total);
    if (pt__grads_staged(&m->place)) x->coll.rs_tmp = PT__F(a, o.largest_shard);
    x->coll.trows = x->coll.rs_b = x->coll.zrows = -1;
    if (pt__wte_ok(m)) pt__layout_wte(m, a);
}

/* Rows of a block of the fused head and loss (pt_head_xent_fused): each
   block packs wte again and adds into dwte, so fewer, larger blocks run
   faster (gpt2-124m, N = 2048, one loaded run against the unfused pair:
   256 rows 1.54x its time in fp32, 1.20x in bf16; 1024 rows 0.76x, 0.57x). */
#define PT__HEAD_ROWS 1024

/* The head and the loss run fused, by row blocks (pt_head_xent_fused: the
   logits never exist whole, the backward makes them again): training on the
   stage holding the head, under every schedule (its B computes the head's
   weight gradient with its input's, as the unfused head's did; on tp ranks
   the vocabulary-parallel loss's all-reduces run between each block's
   halves: pt__head_fused_run); under ZeRO 2 and 3 its backward goes bucket
   by bucket (pt__head_rows_backward), ZeRO 3's forward a block's logits a
   gathered bucket at a time (pt__z3_head_forward). */
static int pt__head_fused(const pt_gpt_place *pl, int training) {
    return training && pl->has_head;
}

/* The activation slots (each: a chunk's input, its layers' saved
   activations, what W needs from B, the head's buffers on the last stage,
   the micro-batch's tokens); then the scratch: recomputation's one layer,
   the vocabulary-parallel loss, a block's scratch, the residual gradient. */
/* n floats for a ring buffer from a piece of scratch (at, room floats; at
   NULL in a meta build: the pointer stays NULL) whose *used floats are
   taken, else from the arena. */
static float *pt__cp_room(pt_arena *a, float *at, size_t room, size_t *used, size_t n) {
    float *p;
    if (*used + n > room) return PT__F(a, n);
    p = at ? at + *used : NULL;
    *used += n;
    return p;
}

/* Context parallelism's ring buffers (pt_block_cp) and a step's tokens. The
   buffers are live inside one attention call only, where backward's
   scratch is free in forward and, in backward, the MLP activation's (gelu:
   forward writes it after attention, backward reads it before, W
   recomputes it), dln (written after attention) and the piece of dfch, W's
   dout and dln2 (W's MLP half runs before attention's backward:
   pt__block_bwd). What fits goes there: the blocks (both passes) and the
   dk|dv share (part) in that piece, forward's partials (po, pl) and
   backward's accumulators in gelu, then dln. */
static void pt__layout_cp(pt_gpt *m, pt_arena *a, const pt__dims *d, int training) {
    pt_gpt_exec *x = m->exec;
    pt_block_scratch *s = &x->scratch;
    size_t nkv = d->N * 2 * d->Ckv, nt = d->N * (size_t)m->place.micro, used[3] = {0, 0, 0};
    size_t room[3], j;
    float *at[3];
    pt_block_cp *cp = &x->cp;
    s->cp = cp;
    cp->pos = (int *)pt_arena_alloc(a, d->T * sizeof(int));
    cp->pos_T = 0;
    cp->kpos = (int *)pt_arena_alloc(a, d->T * sizeof(int));
    at[0] = training ? s->dfch : NULL, room[0] = training ? d->N * d->Fi + (d->N + d->Ns) * d->C : 0;
    at[1] = s->gelu, room[1] = d->N * d->F;
    at[2] = training ? s->dln : NULL, room[2] = training ? d->N * d->C : 0;
    for (j = 0; j < 2; j++) cp->kv[j] = pt__cp_room(a, at[0], room[0], &used[0], nkv);
    cp->po = pt__cp_room(a, at[1], room[1], &used[1], d->N * d->Ca);
    cp->pl = pt__cp_room(a, at[1], room[1], &used[1], d->B * d->NH * d->T);
    if (training) { /* (backward: gelu's forward partials are done with) */
        used[1] = 0;
        cp->part = pt__cp_room(a, at[0], room[0], &used[0], nkv);
        for (j = 0; j < 2; j++)
            cp->acc[j] = used[1] + nkv <= room[1] ? pt__cp_room(a, at[1], room[1], &used[1], nkv)
                                                 : pt__cp_room(a, at[2], room[2], &used[2], nkv);
    }
    x->cp_in = (int *)pt_arena_alloc(a, nt * sizeof(int));
    x->cp_tg = (int *)pt_arena_alloc(a, nt * sizeof(int));
}

static void pt__layout_acts(pt_gpt *m, pt_arena *a, size_t *act_bytes, int training) {
    pt_gpt_exec *x = m->exec;
    const pt_gpt_place *pl = &m->place;
    pt__dims d = pt__block_dims_sp(&m->config, m->B, m->T, pl->tp, pl->sp);
    size_t N = d.N, Ns = d.Ns, C = d.C, V = (size_t)pl->vocab_local;
    int l, k, most = 0, c, ln = m->config.norm == PT_NORM_LAYER;
    int bf16 = m->ctx.precision == PT_PRECISION_BF16 && pl->recompute != PT_RECOMPUTE_FULL;
    int fused = pt__head_fused(pl, training);
    /* (pt__z3_sparse_ok's layouts: the rows read kept from forward to backward) */
    int z3rows = training && pl->zero == 3 && pl->pp == 1 && pl->chunks == 1 && pl->dp > 1 &&
                 pl->has_embed;
    for (c = 0; c < pl->chunks; c++)
        if (x->pipe.chunk_hi[c] - x->pipe.chunk_lo[c] > most) most = x->pipe.chunk_hi[c] - x->pipe.chunk_lo[c];
    for (k = 0; k < x->pipe.nslots; k++) {
        pt__slot *sl = &x->pipe.slots[k];
        sl->micro = sl->chunk = -1;
        sl->x = PT__F(a, Ns * C);
        sl->acts = x->pipe.acts + (size_t)k * (size_t)most;
        for (l = 0; l < most; l++)
            pt__layout_block_acts(&sl->acts[l], a, &d, pl->recompute, 1, ln, bf16);
        sl->wg = x->pipe.slots[0].wg + (size_t)k * (size_t)most;
        for (l = 0; x->pipe.split && l < most; l++) pt__layout_wgrad(&sl->wg[l], a, &d, NULL);
        if (pl->has_head) {
            sl->lnf = PT__F(a, N * C); /* (sequence parallel: gathered for the head) */
            sl->lnf_mean = PT__F(a, Ns);
            sl->lnf_rstd = PT__F(a, Ns);
            sl->logits = fused ? NULL : PT__F(a, N * V);
            sl->losses = PT__F(a, N);
            sl->lse = (double *)pt_arena_alloc(a, N * sizeof(double));
        }
        sl->inputs = (int *)pt_arena_alloc(a, N * sizeof(int));
        sl->targets = (int *)pt_arena_alloc(a, N * sizeof(int));
        sl->zslot = z3rows ? (int *)pt_arena_alloc(a, V * sizeof(int)) : NULL;
    }
    *act_bytes = a->used;
    x->coll.zmask = z3rows ? PT__F(a, V) : NULL;
    memset(&x->pipe.racts, 0, sizeof x->pipe.racts); /* recomputation's one layer (not saved) */
    if (pl->recompute == PT_RECOMPUTE_FULL)
        pt__layout_block_acts(&x->pipe.racts, a, &d, PT_RECOMPUTE_NONE, 0, ln, 0);
    else if (pl->recompute == PT_RECOMPUTE_SELECTIVE)
        x->pipe.racts.atty = PT__F(a, N * d.Ca);
    x->ce_red = pl->tp > 1 ? PT__F(a, 3 * N) : NULL;
    x->head_work = fused ? PT__F(a, (N < PT__HEAD_ROWS ? N : PT__HEAD_ROWS) * V) : NULL;
    pt__layout_scratch(&x->scratch, a, &d, training, m->config.pos == PT_POS_ROPE, bf16);
    if (pl->cp > 1) pt__layout_cp(m, a, &d, training);
    x->dres = training ? PT__F(a, Ns * C) : NULL;
    x->pipe.pp_rbuf = training && pl->pp > 1 ? PT__F(a, 2 * Ns * C) : NULL;
    for (k = 0; bf16 && k < x->pipe.nslots; k++) /* bf16 storage: the floats are the scratch's */
        for (l = 0; l < most; l++) {
            pt_block_acts *b = &x->pipe.slots[k].acts[l];
            b->ln1 = x->scratch.ln1, b->qkv = x->scratch.qkv;
            b->ln2 = x->scratch.ln2, b->fch = x->scratch.fch;
        }
}

PTRAINDEF pt_status pt_gpt_init(pt_gpt *m, const pt_gpt_desc *d) {
    pt_gpt_exec *x;
    pt_schedule sched;
    pt_arena meta;
    size_t act_bytes, state_bytes;
    int nslots;
    pt_status st;
    memset(m, 0, sizeof *m);
    m->alloc_ctx = d->alloc_ctx;
    m->loss = -1.0f;
    pt_clear_error();
    if ((st = pt__gpt_check(m, d)) != PT_OK) return st;
    if ((st = pt__gpt_schedule(m, d, &sched, &nslots)) != PT_OK) return st;
    if ((st = pt__gpt_tables(m, nslots)) != PT_OK) {
        pt_schedule_free(&sched);
        return st;
    }
    x = m->exec;
    x->pipe.sched = sched; /* freed with the model from here on */
    x->pipe.split = pt__sched_splits(m->place.schedule); /* its lists hold W actions */
    pt__assign_layers(m);
    pt__build_table(m);
    if ((st = pt__gpt_comms(m, d)) != PT_OK) {
        pt_gpt_free(m);
        return st;
    }
    /* measure with meta arenas, then allocate each class once */
    pt_arena_init_meta(&meta);
    pt__layout_state(m, &meta, d->inference);
    state_bytes = meta.used;
    pt_arena_init_meta(&meta);
    pt__layout_acts(m, &meta, &act_bytes, !d->inference);
    m->mem.activations = act_bytes;
    m->mem.scratch = meta.used - act_bytes;
    m->mem.total = m->mem.params + m->mem.grads + m->mem.optimizer + meta.used;
    m->mem.slots = x->pipe.nslots;
    if (d->meta) {
        pt_arena_init_meta(&x->param_arena);
        pt_arena_init_meta(&x->act_arena);
        return PT_OK;
    }
    if ((st = pt_arena_init(&x->param_arena, state_bytes, d->alloc_ctx)) != PT_OK ||
        (st = pt_arena_init(&x->act_arena, meta.used, d->alloc_ctx)) != PT_OK) {
        double mib = (double)m->mem.total / 1048576.0;
        pt_gpt_free(m);
        return pt__fail(PT_ERR_OOM, "cannot allocate %.1f MiB for the model (weights%s, "
                        "activations)", mib, d->inference ? "" : ", gradients, AdamW state");
    }
    { /* the context its calls pass down: the desc's precision, a workspace for this thread's
         OpenMP threads */
        pt_ctx_desc cd;
        memset(&cd, 0, sizeof cd);
        cd.precision = m->ctx.precision, cd.alloc_ctx = d->alloc_ctx;
        if ((st = pt_ctx_init(&m->ctx, &cd)) != PT_OK) {
            pt_gpt_free(m);
            return st;
        }
    }
    pt__layout_state(m, &x->param_arena, d->inference);
    memset(x->param_arena.base, 0, x->param_arena.used);
    pt__layout_acts(m, &x->act_arena, &act_bytes, !d->inference);
    if (m->place.zero == 3)
        pt__bind(m, x->coll.work, 2, &m->wte, &m->wpe, &m->lnf_w, &m->lnf_b, &m->lm_head, m->layers);
    else
        pt__bind(m, m->params, 0, &m->wte, &m->wpe, &m->lnf_w, &m->lnf_b, &m->lm_head, m->layers);
    pt__bind(m, x->wv.wprev, 0, &x->wv.pv_wte, &x->wv.pv_wpe, &x->wv.pv_lnf_w, &x->wv.pv_lnf_b, &x->wv.pv_head,
             x->wv.pv_layers);
    pt__bind(m, m->grads, pt__grads_staged(&m->place), &x->coll.dwte, &x->coll.dwpe, &x->coll.dlnf_w, &x->coll.dlnf_b,
             &x->coll.dhead,
             x->coll.layer_grads);
    return PT_OK;
}

PTRAINDEF void pt_gpt_free(pt_gpt *m) {
    pt_gpt_exec *x = m->exec;
    if (x) {
        pt__ag_settle(m); /* nothing may still write into the parameters */
        pt_schedule_free(&x->pipe.sched);
        if (x->coll.ag_comm) {
            pt_comm_free(x->coll.ag_comm);
            pt__free(x->coll.ag_comm, m->alloc_ctx);
        }
        if (x->tie_comm) {
            pt_comm_free(x->tie_comm);
            pt__free(x->tie_comm, m->alloc_ctx);
        }
        pt_arena_free(&x->param_arena);
        pt_arena_free(&x->act_arena);
        pt__free(x, m->alloc_ctx);
    }
    pt_ctx_free(&m->ctx);
    memset(m, 0, sizeof *m);
}


/* Real (not padding) vocabulary rows among this rank's vocab_local. */
static int pt__vocab_valid(const pt_gpt *m) {
    int left = m->config.vocab_size - m->place.vocab_offset;
    return left < 0 ? 0 : (left < m->place.vocab_local ? left : m->place.vocab_local);
}

/* Vocabulary-parallel cross-entropy (Megatron-LM): the logits stay split;
   one all-reduce of the row maxima, one of the sums of exp and the target
   logits (each rank adds those in its columns). */
static pt_status pt__xent_tp(pt_gpt *m, const float *logits, const int *targets, double *lse,
                             float *losses, int N) {
    pt_gpt_exec *x = m->exec;
    int Vl = m->place.vocab_local, v0 = m->place.vocab_offset, n, valid = pt__vocab_valid(m);
    float *mx = x->ce_red, *sum = mx + N, *tl = sum + N;
    pt_status st;
    PT__OMP(omp parallel for schedule(static))
    for (n = 0; n < N; n++) mx[n] = valid ? pt__maxf(logits + (size_t)n * Vl, valid) : -INFINITY;
    if ((st = pt_comm_all_reduce(x->tp_comm, mx, (size_t)N, PT_REDUCE_MAX)) != PT_OK) return st;
    PT__OMP(omp parallel for schedule(static))
    for (n = 0; n < N; n++) {
        const float *l = logits + (size_t)n * Vl;
        int t = targets[n] - v0;
        sum[n] = valid ? (float)pt__sum_exp(l, valid, mx[n]) : 0.0f;
        tl[n] = t >= 0 && t < valid ? l[t] : 0.0f;
    }
    if ((st = pt_comm_all_reduce(x->tp_comm, sum, 2 * (size_t)N, PT_REDUCE_SUM)) != PT_OK)
        return st;
    for (n = 0; n < N; n++) {
        lse[n] = (double)mx[n] + log((double)sum[n]);
        losses[n] = (float)(lse[n] - (double)tl[n]);
    }
    return PT_OK;
}

static pt_status pt__xent_forward_tp(pt_gpt *m, pt__slot *sl, int N) {
    return pt__xent_tp(m, sl->logits, sl->targets, sl->lse, sl->losses, N);
}

/* The fused head (x->head_work) on slot sl's N rows: the losses, and with
   dx or dwte set the gradients too (dx += dlogits @ wte, dwte +=
   dlogits^T @ lnf). One tensor rank: pt_head_xent_fused. Vocabulary
   parallel: the same by blocks of PT__HEAD_ROWS rows, each block's row
   max, sum of exp and target logit all-reduced between its logits and its
   dlogits (pt__xent_tp: per row the unfused path's arithmetic, so losses,
   lse and dx are its bits; dwte sums a block at a time). */
static pt_status pt__head_fused_run(pt_gpt *m, pt__slot *sl, int N, float dloss, float *dx,
                                    float *dwte) {
    pt_gpt_exec *x = m->exec;
    const pt_gpt_place *pl = &m->place;
    int C = m->config.n_embd, Vl = pl->vocab_local, r0, n;
    pt_status st;
    if (pl->tp == 1) {
        pt_head_xent_fused(&m->ctx, sl->losses, sl->lse, dx, dwte, sl->lnf, m->lm_head,
                           sl->targets, N, C, Vl, dloss, x->head_work, PT__HEAD_ROWS);
        return PT_OK;
    }
    for (r0 = 0; r0 < N; r0 += n) { /* block [r0, r0 + n) of the rows */
        const float *xb = sl->lnf + (size_t)r0 * C;
        n = N - r0 < PT__HEAD_ROWS ? N - r0 : PT__HEAD_ROWS;
        pt_tied_head_forward(&m->ctx, x->head_work, xb, m->lm_head, n, C, Vl);
        st = pt__xent_tp(m, x->head_work, sl->targets + r0, sl->lse + r0, sl->losses + r0, n);
        if (st != PT_OK) return st;
        if (!dx && !dwte) continue;
        pt__xent_backward_part(x->head_work, x->head_work, sl->lse + r0, sl->targets + r0, n, Vl,
                               pt__vocab_valid(m), pl->vocab_offset, dloss);
        pt_tied_head_backward(&m->ctx, dx ? dx + (size_t)r0 * C : NULL, dwte, x->head_work, xb,
                              m->lm_head, n, C, Vl);
    }
    return PT_OK;
}

/* Logits (N rows of this rank's vocab_local columns) over the whole
   vocabulary into out (N, vocab_size): gathered over the tensor-parallel
   group, padding dropped. */
static pt_status pt__gather_logits(const pt_gpt *m, const float *logits, size_t N, float *out) {
    size_t V = (size_t)m->config.vocab_size, Vl = (size_t)m->place.vocab_local, n, k;
    size_t tp = (size_t)m->place.tp;
    float *parts;
    pt_status st;
    if (tp == 1) {
        memcpy(out, logits, N * V * sizeof(float));
        return PT_OK;
    }
    parts = (float *)pt__malloc(N * Vl * tp * sizeof(float), m->alloc_ctx);
    if (!parts) return pt__fail(PT_ERR_OOM, "cannot allocate the gathered logits");
    st = pt_comm_all_gather(m->exec->tp_comm, logits, parts, N * Vl);
    for (k = 0; k < tp && st == PT_OK; k++) {
        size_t v0 = k * Vl, len = v0 >= V ? 0 : (V - v0 < Vl ? V - v0 : Vl);
        for (n = 0; n < N && len; n++)
            memcpy(out + n * V + v0, parts + (k * N + n) * Vl, len * sizeof(float));
    }
    pt__free(parts, m->alloc_ctx);
    return st;
}

/* ---- the actions: a chunk's forward, backward (B) and weight gradient (W) */

/* The bucket holding local layer l's tensors (-1: l is not a layer here). */
static int pt__layer_bucket(const pt_gpt *m, int l) {
    const pt_gpt_exec *x = m->exec;
    return l < 0 || l >= m->place.n_layers ? -1 : m->table[x->tab_layers + x->layer_tensors * l].bucket;
}

/* ZeRO 3: the rows [*r0, *r1) of vocabulary tensor p in bucket b, gathered
   in b's half (NULL: b holds none of p). */
static const float *pt__z3_rows(const pt_gpt *m, const pt_param *p, int b, int *r0, int *r1) {
    const pt_gpt_exec *x = m->exec;
    const pt__bucket *k = &x->coll.buckets[b];
    size_t C = (size_t)m->config.n_embd;
    if (b < 0 || b >= x->coll.num_buckets || k->offset < p->offset || k->offset >= p->offset + p->numel)
        return NULL;
    *r0 = (int)((k->offset - p->offset) / C);
    *r1 = (int)((k->offset + k->numel - p->offset) / C);
    if (*r1 > m->place.vocab_local) *r1 = m->place.vocab_local;
    return x->coll.work + (size_t)(b & 1) * x->coll.work_n;
}

/* Whether the embedding's wte rows may go compact under ZeRO 3
   (pt__z3_embed_compact, pt__z3_embed_sparse): one stage and chunk, a dp group whose averages add
   in rank order whatever the buffer (threads, or 2 ranks), overlap on. The
   head's part reduces by buckets either way: tied or not. */
static int pt__z3_sparse_ok(const pt_gpt *m) {
    const pt_gpt_place *pl = &m->place;
    const pt_gpt_exec *x = m->exec;
    return pl->zero == 3 && pl->pp == 1 && pl->chunks == 1 && pl->dp > 1 && x->tab_wte >= 0 &&
           !x->pipe.split && x->coll.ag_on && (x->dp_comm->kind == PT_COMM_THREADS || pl->dp == 2);
}

/* wpe when it shares a bucket with wte's rows (then the embedding's backward
   reduces it with them), else NULL; *used: its floats the positions of a
   sequence of T read (its first T rows; context parallelism: all). */
static const pt_param *pt__wpe_with_wte(const pt_gpt *m, int T, size_t *used) {
    const pt_gpt_exec *x = m->exec;
    const pt_param *p = &m->table[x->tab_wte], *wpe = x->tab_wpe >= 0 ? &m->table[x->tab_wpe] : NULL;
    size_t rows = x->cp.comm && x->cp.comm->size > 1 ? (size_t)m->config.block_size : (size_t)T;
    if (!wpe || x->coll.buckets[wpe->bucket].offset >= p->offset + p->numel) wpe = NULL;
    *used = wpe ? (rows * (size_t)m->config.n_embd < wpe->numel ? rows * (size_t)m->config.n_embd
                                                                  : wpe->numel) : 0;
    return wpe;
}

/* ZeRO 3: the vocabulary-parallel embedding a bucket of wte rows at a time
   (x = 0, then each token's row added from the bucket holding it, then wpe
   from the bucket holding it, on tensor rank 0: x = wte[t] + wpe[pos] as
   the whole kernel computes it) into out (N, C); nxt: the bucket to
   prefetch after them. */
static pt_status pt__z3_embed(pt_gpt *m, const pt__slot *sl, float *out, int B, int T, int nxt) {
    pt_gpt_exec *x = m->exec;
    const pt_param *p = &m->table[x->tab_wte];
    const pt_param *wpe = x->tab_wpe >= 0 ? &m->table[x->tab_wpe] : NULL;
    int C = m->config.n_embd, N = B * T, b, r0, r1, n;
    const int *at = pt__cp_pos(x->scratch.cp, T); /* (NULL: positions 0..T-1) */
    const float *rows;
    pt_status st = PT_OK;
    memset(out, 0, sizeof(float) * (size_t)N * C);
    for (b = p->bucket; st == PT_OK && (rows = pt__z3_rows(m, p, b, &r0, &r1)) != NULL; b++) {
        const float *pos = wpe && wpe->bucket == b && m->place.tp_rank == 0
                               ? rows + (wpe->offset - x->coll.buckets[b].offset) : NULL;
        if ((st = pt__z3_need(m, b, pt__z3_rows(m, p, b + 1, &n, &n) ? b + 1 : nxt)) != PT_OK)
            return st;
        PT__OMP(omp parallel for schedule(static))
        for (n = 0; n < N; n++) {
            int row = sl->inputs[n] - m->place.vocab_offset - r0, c;
            float *o = out + (size_t)n * C;
            if (row >= 0 && row < r1 - r0)
                for (c = 0; c < C; c++) o[c] += rows[(size_t)row * C + c];
            if (pos)
                for (c = 0; c < C; c++) o[c] += pos[(size_t)(at ? at[n % T] : n % T) * C + c];
        }
    }
    return st;
}

/* ZeRO 3, one stage, overlap on (pt__z3_sparse_ok), the micro-batch's
   forward: a rank's mask of the rows of this rank's vocabulary its tokens
   read (x->coll.zmask), its MAX over the dp group, and each row's slot
   among those some rank reads into sl->zslot (-1: none), how many in
   sl->zrows; kept for the backward's pt__z3_embed_sparse (once a
   micro-batch: one all-reduce). */
static pt_status pt__z3_rows_read(pt_gpt *m, pt__slot *sl, int N) {
    pt_gpt_exec *x = m->exec;
    int V = m->place.vocab_local, n, r;
    float *mask = x->coll.zmask;
    pt_status st;
    memset(mask, 0, (size_t)V * sizeof(float));
    for (n = 0; n < N; n++)
        if ((r = sl->inputs[n] - m->place.vocab_offset) >= 0 && r < V) mask[r] = 1.0f;
    if ((st = pt_comm_all_reduce(x->dp_comm, mask, (size_t)V, PT_REDUCE_MAX)) != PT_OK) return st;
    for (r = 0, sl->zrows = 0; r < V; r++) sl->zslot[r] = mask[r] != 0.0f ? sl->zrows++ : -1;
    return PT_OK;
}

/* The part of flat range [off, off + n) inside this rank's shard of bucket
   b, as flat offsets [*lo, *hi); 0 if none. */
static int pt__shard_range(const pt_gpt *m, int b, size_t off, size_t n, size_t *lo, size_t *hi) {
    const pt__bucket *k = &m->exec->coll.buckets[b];
    size_t s0 = k->offset + (size_t)m->place.dp_rank * k->shard, s1 = s0 + k->shard;
    *lo = off > s0 ? off : s0;
    *hi = off + n < s1 ? off + n : s1;
    return *lo < *hi;
}

/* The part of flat range [off, off + n) that this rank's shards hold, bucket
   by bucket: shards (pshard or gshard, by shard_offset) to buf (dir 0), buf
   to shards (1), or buf added to shards (2, as a reduce-scatter's sums are);
   the rest of buf and of the shards left as they are. */
static void pt__dp_shard_io(const pt_gpt *m, float *shards, size_t off, float *buf, size_t n,
                            int dir) {
    const pt_gpt_exec *x = m->exec;
    size_t a, e, i;
    int b;
    for (b = 0; b < x->coll.num_buckets; b++) {
        const pt__bucket *k = &x->coll.buckets[b];
        float *sh, *bf;
        if (!pt__shard_range(m, b, off, n, &a, &e)) continue;
        sh = shards + k->shard_offset + (a - k->offset - (size_t)m->place.dp_rank * k->shard);
        bf = buf + (a - off);
        if (dir == 0) memcpy(bf, sh, (e - a) * sizeof(float));
        else if (dir == 1) memcpy(sh, bf, (e - a) * sizeof(float));
        else
            for (i = 0; i < e - a; i++) sh[i] += bf[i];
    }
}

/* ZeRO 3 (pt__z3_sparse_ok): pt__z3_embed from the rows some dp rank's token
   reads and wpe alone, gathered compact into the half nxt (the first
   layer's bucket, prefetched meanwhile) does not use: each rank puts what
   its shards hold, zeros elsewhere, and the sum over the group is each
   value from its one holder (x + 0 = x; a -0 comes back +0, which the
   lookup's 0 + x makes alike); then x = (0 + wte[t]) + wpe[pos], the bucket
   lookup's sums. *done 0: the half cannot hold them (pt__z3_embed runs). */
static pt_status pt__z3_embed_compact(pt_gpt *m, pt__slot *sl, float *out, int B, int T,
                                      int nxt, int *done) {
    pt_gpt_exec *x = m->exec;
    size_t wn;
    const pt_param *p = &m->table[x->tab_wte], *wpe = pt__wpe_with_wte(m, T, &wn);
    int C = m->config.n_embd, N = B * T, V = m->place.vocab_local, h = nxt >= 0 ? !(nxt & 1) : 0;
    int R, n, r;
    const int *at = pt__cp_pos(x->scratch.cp, T), *slot = sl->zslot;
    float *buf = x->coll.work + (size_t)h * x->coll.work_n;
    pt_comm_req q;
    pt_status st;
    *done = 0;
    if (!pt__z3_sparse_ok(m)) return PT_OK;
    /* (the drop settles the last micro-batch's compact average, which reads its slots) */
    if ((st = pt__z3_drop(m, h)) != PT_OK || (st = pt__z3_rows_read(m, sl, N)) != PT_OK) return st;
    R = sl->zrows;
    if ((x->tab_wpe >= 0 && !wpe) || (size_t)R * C + wn > x->coll.work_n) return PT_OK; /* (wpe
                                                                                      apart) */
    memset(buf, 0, ((size_t)R * C + wn) * sizeof(float));
    for (r = 0; r < V; r++)
        if (slot[r] >= 0)
            pt__dp_shard_io(m, x->coll.pshard, p->offset + (size_t)r * C,
                            buf + (size_t)slot[r] * C, C, 0);
    if (wpe) pt__dp_shard_io(m, x->coll.pshard, wpe->offset, buf + (size_t)R * C, wn, 0);
    x->coll.z_t[h] = pt_time_now();
    if ((st = pt_comm_all_reduce_start(x->dp_comm, buf, (size_t)R * C + wn, PT_REDUCE_SUM, &q)) != PT_OK ||
        (nxt >= 0 && x->coll.held[nxt & 1] != nxt && (st = pt__z3_wait(m, nxt & 1)) == PT_OK &&
         (st = pt__z3_gather(m, nxt, 1)) != PT_OK) ||
        (st = pt_comm_wait(&q)) != PT_OK)
        return st;
    pt__trace_dp(x, PT_TRACE_DP_GATHER, p->bucket, x->coll.z_t[h], x->act);
    memset(out, 0, sizeof(float) * (size_t)N * C);
    PT__OMP(omp parallel for schedule(static))
    for (n = 0; n < N; n++) {
        int row = sl->inputs[n] - m->place.vocab_offset, c;
        const float *w = row >= 0 && row < V && slot[row] >= 0 ? buf + (size_t)slot[row] * C : NULL;
        const float *pos = wpe && m->place.tp_rank == 0
                               ? buf + (size_t)R * C + (size_t)(at ? at[n % T] : n % T) * C : NULL;
        float *o = out + (size_t)n * C;
        for (c = 0; w && c < C; c++) o[c] += w[c];
        for (c = 0; pos && c < C; c++) o[c] += pos[c];
    }
    *done = 1;
    return PT_OK;
}

/* ZeRO 3, fused head: rows [r0, r0 + n) of slot sl's logits (n,
   vocab_local) into x->head_work from lnf, a gathered bucket of the head's
   rows at a time (the columns they make: the whole product's bits); the
   next block's first bucket prefetched after the last (more: whether one
   comes). Held buckets are not gathered again (a head in 1 or 2 buckets
   is gathered once a forward). */
static pt_status pt__z3_head_block(const pt_gpt *m, pt_ctx *ctx, const pt__slot *sl, int r0, int n,
                                   int more) {
    pt_gpt_exec *x = m->exec;
    const pt_param *p = &m->table[x->tab_head >= 0 ? x->tab_head : x->tab_wte];
    int C = m->config.n_embd, Vl = m->place.vocab_local, b, c0, c1, z;
    const float *rows;
    pt_status st = PT_OK;
    for (b = p->bucket; st == PT_OK && (rows = pt__z3_rows(m, p, b, &c0, &c1)) != NULL; b++) {
        int nxt = pt__z3_rows(m, p, b + 1, &z, &z) ? b + 1 : more ? p->bucket : -1;
        if ((st = pt__z3_need(m, b, nxt)) != PT_OK) return st;
        pt__mm(ctx, 0, 1, n, c1 - c0, C, 1.0f, sl->lnf + (size_t)r0 * C, C, rows, C, 0.0f,
               x->head_work + c0, Vl);
    }
    return st;
}

/* ZeRO 3, fused head: slot sl's N losses and lse by blocks of PT__HEAD_ROWS
   rows, each block's logits made (pt__z3_head_block) and its cross-entropy
   taken as the unfused head's (one tp rank: pt_crossentropy_forward; else
   pt__xent_tp): ZeRO 1's losses bit for bit. */
static pt_status pt__z3_head_forward(pt_gpt *m, pt__slot *sl, int N) {
    pt_gpt_exec *x = m->exec;
    int r0, n, Vl = m->place.vocab_local;
    pt_status st = PT_OK;
    for (r0 = 0; r0 < N && st == PT_OK; r0 += n) {
        n = N - r0 < PT__HEAD_ROWS ? N - r0 : PT__HEAD_ROWS;
        if ((st = pt__z3_head_block(m, &m->ctx, sl, r0, n, r0 + n < N)) != PT_OK) return st;
        if (m->place.tp == 1)
            pt_crossentropy_forward(sl->losses + r0, sl->lse + r0, x->head_work, sl->targets + r0,
                                    n, Vl);
        else
            st = pt__xent_tp(m, x->head_work, sl->targets + r0, sl->lse + r0, sl->losses + r0, n);
    }
    return st;
}

/* The logits of slot sl's N rows over the whole vocabulary into out: its
   logits gathered, or with a fused head (no whole logits kept) the head's
   product of its lnf again (ZeRO 3: through its gathered buckets), the same
   bits as the unfused forward's. */
static pt_status pt__head_logits(const pt_gpt *m, const pt__slot *sl, size_t N, float *out) {
    pt_ctx ctx = m->ctx; /* (a copy: the caller's m is const; no poll here) */
    size_t r0, n, C = (size_t)m->config.n_embd, V = (size_t)m->config.vocab_size;
    pt_status st = PT_OK;
    if (!m->exec->head_work) return pt__gather_logits(m, sl->logits, N, out);
    memset(&ctx.poll, 0, sizeof ctx.poll);
    if (m->place.tp == 1 && m->place.zero != 3) {
        pt_tied_head_forward(&ctx, out, sl->lnf, m->lm_head, (int)N, (int)C, (int)V);
        return PT_OK;
    }
    for (r0 = 0; r0 < N && st == PT_OK; r0 += n) { /* a block at a time */
        n = N - r0 < PT__HEAD_ROWS ? N - r0 : PT__HEAD_ROWS;
        if (m->place.zero == 3)
            st = pt__z3_head_block(m, &ctx, sl, (int)r0, (int)n, r0 + n < N);
        else
            pt_tied_head_forward(&ctx, m->exec->head_work, sl->lnf + r0 * C, m->lm_head, (int)n,
                                 (int)C, m->place.vocab_local);
        if (st == PT_OK) st = pt__gather_logits(m, m->exec->head_work, n, out + r0 * V);
    }
    return st;
}

/* The mean of N tokens' losses (summed in double). */
static float pt__mean_loss(const float *losses, int N) {
    double sum = 0.0;
    int n;
    for (n = 0; n < N; n++) sum += losses[n];
    return (float)(sum / N);
}

/* Forward of this stage's chunk c on the micro-batch in slot sl (inputs and
   targets already there, sl->x the chunk's input unless c holds virtual
   stage 0): the embedding if it does, the chunk's layers, and the head and
   mean loss (*loss) if c holds the last virtual stage and targets is set.
   A fused head (x->head_work) makes no logits here (pt__head_logits makes
   them when asked), and with with_targets = 2 leaves the losses to the
   backward, which computes them with the gradient. */
static pt_status pt__chunk_forward(pt_gpt *m, pt__slot *sl, int c, int B, int T,
                                   int with_targets, float *loss) {
    pt_gpt_exec *x = m->exec;
    const pt_gpt_place *pl = &m->place;
    const pt_gpt_config *cfg = &m->config;
    int C = cfg->n_embd, V = cfg->vocab_size, N = B * T, l, sp_k = pl->sp ? pl->tp : 1;
    const float *in = sl->x;
    pt_status st;
    if (c == x->pipe.embed_chunk) {
        /* vocabulary-parallel embedding: each rank looks up its rows, the sum
           over the group is the whole lookup (tensor rank 0 adds wpe) */
        if ((st = pt__ag_need(m, x->tab_wte, 1)) != PT_OK ||
            (st = pt__ag_need(m, x->tab_wpe, 1)) != PT_OK)
            return st;
        float *e = pl->sp ? x->scratch.xg : sl->x; /* sequence parallel: reduce-scattered */
        if (pl->zero == 3) {
            int nxt = x->pipe.chunk_hi[c] > x->pipe.chunk_lo[c] ? pt__layer_bucket(m, x->pipe.chunk_lo[c])
                                                                : -1;
            int done;
            if ((st = pt__z3_embed_compact(m, sl, e, B, T, nxt, &done)) != PT_OK ||
                (!done && (st = pt__z3_embed(m, sl, e, B, T, nxt)) != PT_OK))
                return st;
        } else {
            pt__encoder_forward_part(e, sl->inputs, m->wte, pl->tp_rank == 0 ? m->wpe : NULL,
                                     pt__cp_pos(x->scratch.cp, T), pl->vocab_offset,
                                     pl->vocab_local, B, T, C);
        }
        if ((st = pt__tp_rows(x->tp_comm, pl->sp, e, sl->x, (size_t)N * C / (size_t)sp_k)) !=
            PT_OK)
            return st;
    }
    for (l = x->pipe.chunk_lo[c]; l < x->pipe.chunk_hi[c]; l++) {
        pt_block_acts *a = &sl->acts[l - x->pipe.chunk_lo[c]], *use = a;
        if (pl->recompute == PT_RECOMPUTE_FULL) { /* everything but the output is dropped */
            x->pipe.racts.out = a->out;
            use = &x->pipe.racts;
        } else if (pl->recompute == PT_RECOMPUTE_SELECTIVE) {
            a->atty = x->pipe.racts.atty; /* the attention output is dropped */
        }
        if ((st = pt__ag_need(m, x->tab_layers + x->layer_tensors * l, x->layer_tensors)) != PT_OK ||
            (st = pt__z3_need(m, pt__layer_bucket(m, l),
                              l + 1 < x->pipe.chunk_hi[c] ? pt__layer_bucket(m, l + 1)
                              : c == x->pipe.head_chunk ? m->table[x->tab_lnf].bucket
                                                        : -1)) != PT_OK)
            return st;
        st = pt_block_forward(&m->ctx, cfg, B, T, &m->layers[l], in, use, &x->scratch,
                              x->tp_comm);
        if (st != PT_OK) return st;
        in = a->out;
    }
    if (c != x->pipe.head_chunk) return PT_OK;
    if ((st = pt__ag_need(m, x->tab_lnf, 1)) != PT_OK ||
        (st = pt__ag_need(m, x->tab_lnf_b, 1)) != PT_OK ||
        (st = pt__ag_need(m, x->tab_head >= 0 ? x->tab_head : x->tab_wte, 1)) != PT_OK ||
        (st = pt__z3_need(m, m->table[x->tab_lnf].bucket,
                          m->table[x->tab_head >= 0 ? x->tab_head : x->tab_wte].bucket)) != PT_OK)
        return st;
    if (pl->sp) { /* the final norm on this rank's rows, gathered for the head */
        pt__norm_forward(cfg, x->scratch.xg, sl->lnf_mean, sl->lnf_rstd, in, m->lnf_w, m->lnf_b,
                         N / sp_k, C);
        st = pt_comm_all_gather(x->tp_comm, x->scratch.xg, sl->lnf, (size_t)N * C / (size_t)sp_k);
        if (st != PT_OK) return st;
    } else {
        pt__norm_forward(cfg, sl->lnf, sl->lnf_mean, sl->lnf_rstd, in, m->lnf_w, m->lnf_b, N, C);
    }
    if (x->head_work) { /* fused: the losses by row blocks, or (with_targets 2) in backward */
        if (with_targets == 1 && (st = pl->zero == 3 ? pt__z3_head_forward(m, sl, N)
                                                     : pt__head_fused_run(m, sl, N, 0.0f, NULL,
                                                                          NULL)) != PT_OK)
            return st;
        if (with_targets == 1) *loss = pt__mean_loss(sl->losses, N);
        return PT_OK;
    }
    /* inference (one stage, no ZeRO): the whole logits */
    pt_tied_head_forward(&m->ctx, sl->logits, sl->lnf, m->lm_head, N, C, pl->vocab_local);
    if (with_targets) {
        if (pl->tp == 1) pt_crossentropy_forward(sl->losses, sl->lse, sl->logits, sl->targets, N, V);
        else if ((st = pt__xent_forward_tp(m, sl, N)) != PT_OK) return st;
        *loss = pt__mean_loss(sl->losses, N);
    }
    return PT_OK;
}

/* Averages n floats over the dp group into this rank's shard of them
   (out = its n/dp), or copies them without a group. */
static pt_status pt__dp_reduce_scatter(pt_gpt *m, const float *in, float *out, size_t n) {
    if (m->place.dp == 1) {
        memcpy(out, in, n * sizeof(float));
        return PT_OK;
    }
    return pt_comm_reduce_scatter(m->exec->dp_comm, in, out, n / (size_t)m->place.dp,
                                  PT_REDUCE_AVG);
}

/* ZeRO 2: averages the gradients of bucket b, in the stage (m->grads), over
   the dp group and adds them to this rank's shard, then clears the stage. */
/* ZeRO 2 and 3, overlap: the reduce-scatter pt__zero2_start began waited
   for, added to the shard, the stage cleared: before the stage is written
   again (the same sums as pt__zero2_bucket's). */
static pt_status pt__zero2_settle(pt_gpt *m) {
    pt_gpt_exec *x = m->exec;
    int b = x->coll.rs_b;
    const pt__bucket *k = b >= 0 ? &x->coll.buckets[b] : NULL;
    size_t i;
    pt_status st;
    if (!k) return PT_OK;
    x->coll.rs_b = -1;
    if ((st = pt_comm_wait(&x->coll.rs_req)) != PT_OK) return st;
    pt__trace_dp(x, PT_TRACE_DP_REDUCE, b, x->coll.rs_t, x->coll.rs_at);
    for (i = 0; i < k->shard; i++) x->coll.gshard[k->shard_offset + i] += x->coll.rs_tmp[i];
    memset(m->grads, 0, k->numel * sizeof(float));
    return PT_OK;
}

/* ZeRO 2 and 3 with overlap (ag_on, a dp group): layer bucket b's
   reduce-scatter started from the stage, to run behind the next layer's B
   (pt__staged_layer_backward settles it before its W writes the stage). */
static pt_status pt__zero2_start(pt_gpt *m, int b) {
    pt_gpt_exec *x = m->exec;
    pt_status st = pt__zero2_settle(m);
    if (st != PT_OK) return st;
    x->coll.rs_b = b, x->coll.rs_t = pt_time_now(), x->coll.rs_at = x->act;
    return pt_comm_reduce_scatter_start(x->dp_comm, m->grads, x->coll.rs_tmp,
                                        x->coll.buckets[b].numel / (size_t)m->place.dp,
                                        PT_REDUCE_AVG, &x->coll.rs_req);
}

static pt_status pt__zero2_bucket(pt_gpt *m, int b) {
    pt_gpt_exec *x = m->exec;
    const pt__bucket *k = &x->coll.buckets[b];
    float *dst = x->coll.gshard + k->shard_offset, *tmp = x->coll.rs_tmp;
    size_t i;
    double t = pt_time_now();
    pt_status st = pt__zero2_settle(m);
    if (st == PT_OK && m->place.zero == 3) { /* into b's half of work: b's parameters are done with */
        st = pt__z3_drop(m, b & 1);
        tmp = x->coll.work + (size_t)(b & 1) * x->coll.work_n;
    }
    if (st == PT_OK) st = pt__dp_reduce_scatter(m, m->grads, tmp, k->numel);
    if (st != PT_OK) return st;
    if (m->place.dp > 1) pt__trace_dp(x, PT_TRACE_DP_REDUCE, b, t, x->act);
    for (i = 0; i < k->shard; i++) dst[i] += tmp[i];
    memset(m->grads, 0, k->numel * sizeof(float));
    return PT_OK;
}

/* ZeRO 2 and 3, fused head: rows [r0, r1) of this rank's head (their
   weights at rows), their gradient into dst: the logits' columns [r0, r1)
   made again by blocks of PT__HEAD_ROWS rows of slot sl, made dlogits with
   the forward's lse (dloss scales them), then x->scratch.dln += dlogits @
   rows and dst += dlogits^T lnf (so dln sums the vocabulary bucket by
   bucket, dst the rows block by block: not the one-bucket fused head's
   rounding). zs: the stage's reduce-scatter under way settled before dst
   is first written (behind the first block's logits and dln). */
static pt_status pt__head_rows_backward(pt_gpt *m, const pt__slot *sl, int N, int r0, int r1,
                                        const float *rows, float *dst, float dloss, int zs) {
    pt_gpt_exec *x = m->exec;
    int C = m->config.n_embd, w = r1 - r0, valid = pt__vocab_valid(m) - r0, b0, n;
    pt_status st;
    valid = valid < 0 ? 0 : valid > w ? w : valid; /* (the rest: tp's padding) */
    for (b0 = 0; b0 < N; b0 += n) { /* block [b0, b0 + n) of the rows */
        const float *xb = sl->lnf + (size_t)b0 * C;
        n = N - b0 < PT__HEAD_ROWS ? N - b0 : PT__HEAD_ROWS;
        pt_tied_head_forward(&m->ctx, x->head_work, xb, rows, n, C, w);
        pt__xent_backward_part(x->head_work, x->head_work, sl->lse + b0, sl->targets + b0, n, w,
                               valid, m->place.vocab_offset + r0, dloss);
        pt_tied_head_backward(&m->ctx, x->scratch.dln + (size_t)b0 * C, NULL, x->head_work, xb,
                              rows, n, C, w);
        if (zs && b0 == 0 && (st = pt__zero2_settle(m)) != PT_OK) return st;
        pt_tied_head_backward(&m->ctx, NULL, dst, x->head_work, xb, rows, n, C, w);
    }
    return PT_OK;
}

/* ZeRO 2: a vocabulary tensor's gradient bucket by bucket: the head's part
   (pt__head_rows_backward of slot sl with dloss, into the head: wte when
   tied; with dln) or, with head = 0, the embedding's (and wpe's, in the
   bucket of wte's last rows). */
static pt_status pt__zero2_vocab(pt_gpt *m, const pt__slot *sl, int B, int T, int head,
                                 float dloss) {
    pt_gpt_exec *x = m->exec;
    int C = m->config.n_embd, N = B * T, b, Vl = m->place.vocab_local;
    const pt_param *p = &m->table[head && x->tab_head >= 0 ? x->tab_head : x->tab_wte];
    const pt_param *wpe = x->tab_wpe >= 0 ? &m->table[x->tab_wpe] : NULL;
    pt_status st = pt__zero2_settle(m); /* (the stage is written next) */
    for (b = p->bucket; b < x->coll.num_buckets && x->coll.buckets[b].offset < p->offset + p->numel &&
                        st == PT_OK; b++) {
        const pt__bucket *k = &x->coll.buckets[b];
        int r0 = (int)((k->offset - p->offset) / (size_t)C);
        int r1 = (int)((k->offset + k->numel - p->offset) / (size_t)C);
        if (r1 > Vl) r1 = Vl;
        if (head)
            st = pt__head_rows_backward(m, sl, N, r0, r1, m->lm_head + (size_t)r0 * C, m->grads,
                                        dloss, 0);
        else
            pt__encoder_backward_part(m->grads, wpe && wpe->bucket == b ? m->grads + (wpe->offset -
                                      k->offset) : NULL, m->place.sp ? x->scratch.xg : x->dres,
                                      sl->inputs, pt__cp_pos(x->scratch.cp, T),
                                      m->place.vocab_offset + r0, r1 - r0, B, T, C);
        st = pt__zero2_bucket(m, b);
    }
    return st;
}


/* ZeRO 3: the head's backward a bucket of its rows at a time, from the last
   (still gathered from the forward) to the first, each through
   pt__head_rows_backward with dloss (dln sums the vocabulary in bucket
   order: not the whole GEMM's rounding), the rows' gradient staged and
   reduce-scattered into the shard; nxt: the bucket to prefetch after. With
   overlap (zs: pt__zero2_start) a bucket's reduce-scatter runs behind the
   next one's gather and first block's products, settled before the stage
   is written. */
static pt_status pt__z3_head_backward(pt_gpt *m, const pt__slot *sl, int N, int nxt, int zs,
                                      float dloss) {
    pt_gpt_exec *x = m->exec;
    const pt_param *p = &m->table[x->tab_head >= 0 ? x->tab_head : x->tab_wte];
    int b, r0, r1, z;
    int staged = pt__grads_staged(&m->place); /* (else: into the whole gradients) */
    const float *rows;
    pt_status st = PT_OK;
    b = p->bucket; /* the last bucket holding rows of p: backward runs them in reverse */
    while (pt__z3_rows(m, p, b + 1, &z, &z)) b++;
    for (; st == PT_OK && b >= p->bucket; b--) {
        rows = pt__z3_rows(m, p, b, &r0, &r1);
        if ((st = pt__z3_need(m, b, b > p->bucket ? b - 1 : nxt)) != PT_OK ||
            (st = pt__head_rows_backward(m, sl, N, r0, r1, rows,
                                         m->grads + (staged ? 0 : x->coll.buckets[b].offset),
                                         dloss, zs)) != PT_OK)
            return st;
        if (staged) st = zs ? pt__zero2_start(m, b) : pt__zero2_bucket(m, b);
    }
    return st;
}

/* The floats of bucket k that its average must reach, from flat offset
   *lo: all of them, but under ZeRO 0 with wpe kept aside (pt__wte_early:
   its average comes from there, written over the bucket's) not wpe's rows
   at either end of the bucket. */
static size_t pt__ov_span(const pt_gpt *m, const pt__bucket *k, size_t *lo) {
    const pt_gpt_exec *x = m->exec;
    const pt_param *wpe = x->tab_wpe >= 0 ? &m->table[x->tab_wpe] : NULL;
    *lo = k->offset;
    if (m->place.zero || x->coll.trows < 0 || !wpe || wpe->numel >= k->numel ||
        wpe->offset < k->offset || wpe->offset + wpe->numel > k->offset + k->numel)
        return k->numel;
    if (wpe->offset == k->offset) *lo += wpe->numel;
    else if (wpe->offset + wpe->numel != k->offset + k->numel) return k->numel;
    return k->numel - wpe->numel;
}

/* Overlap: bucket b's dp reduction started (averaged whole, or into this
   rank's shard under ZeRO 1 and 3), and the buckets under way get a test. */
static pt_status pt__ov_start(pt_gpt *m, int b) {
    pt_gpt_exec *x = m->exec;
    const pt__bucket *k = &x->coll.buckets[b];
    size_t lo, n = pt__ov_span(m, k, &lo);
    pt_status st;
    x->coll.ov_t[b] = pt_time_now(), x->coll.ov_at[b] = x->act;
    if (m->place.zero == 1 || m->place.zero == 3)
        st = pt_comm_reduce_scatter_start(x->dp_comm, m->grads + k->offset,
                                          x->coll.gshard + k->shard_offset,
                                          k->numel / (size_t)m->place.dp, PT_REDUCE_AVG,
                                          &x->coll.ov_req[b]);
    else
        st = pt_comm_all_reduce_start(x->dp_comm, m->grads + lo, n, PT_REDUCE_AVG,
                                      &x->coll.ov_req[b]);
    if (st == PT_OK) pt__ov_poll(m);
    return st != PT_OK ? st : x->coll.poll_st;
}

/* Overlap (pt_overlap): layer l's gradients are final in this step; if its
   bucket holds whole layers of which l is the last to finish (the lowest in
   backward, the highest when W runs apart: ascending), the bucket starts
   its dp reduction, and the buckets under way get a test. */
static pt_status pt__ov_layer(pt_gpt *m, int l, int ascending) {
    pt_gpt_exec *x = m->exec;
    int b = m->table[x->tab_layers + x->layer_tensors * l].bucket;
    int end = m->table[x->tab_layers + x->layer_tensors * (l + 1) - 1].bucket; /* (a layer in
                                                                                   halves) */
    pt_status st = PT_OK;
    if (!x->coll.ov_on || !x->coll.ov_last) return PT_OK;
    for (; b <= end && st == PT_OK; b++) {
        const pt__bucket *k = &x->coll.buckets[b];
        if (!k->nl || x->coll.ov_req[b].op != PT_COMM_OP_NONE) continue; /* (started: a half) */
        if (l != (ascending ? k->lf + k->nl - 1 : k->lf)) continue; /* the others come later */
        st = pt__ov_start(m, b);
    }
    return st;
}

/* Overlap: the first layer's MLP half is final (W's part 0): its bucket
   starts while the attention half computes, when the layer is in two
   (pt__build_table: not under sequence parallelism, whose norm sums come
   after both halves). */
static pt_status pt__ov_part(pt_gpt *m, int l) {
    pt_gpt_exec *x = m->exec;
    int b = m->table[x->tab_layers + x->layer_tensors * (l + 1) - 1].bucket;
    if (b == m->table[x->tab_layers + x->layer_tensors * l].bucket ||
        x->coll.ov_req[b].op != PT_COMM_OP_NONE)
        return PT_OK;
    return pt__ov_start(m, b);
}

/* Whether the tied wte's two pipeline copies (first and last stage) are
   summed before the dp reduction (pt__step_sync). */
static int pt__tie_sum(const pt_gpt *m) {
    const pt_gpt_exec *x = m->exec;
    return x->tie_comm && x->tie_comm->size == 2 && x->coll.dwte && !m->config.untied_head &&
           m->place.schedule != PT_SCHED_CHIMERA;
}

/* Overlap: whether chunk c's backward (its W with it) is the stage's last
   of the step and ends in the embedding, with every gradient outside the
   layers final once the embedding's is (every chunk's backwards done, no
   wte copies to sum first): then the buckets holding no layer (wte's the
   largest) start between the first layer's B and its W (pt__ov_rest). */
static int pt__ov_early(const pt_gpt *m, int c) {
    const pt_gpt_exec *x = m->exec;
    int k;
    if (!x->coll.ov_on || !x->coll.ov_last || c != x->pipe.embed_chunk || pt__tie_sum(m)) return 0;
    for (k = 0; k < m->place.chunks; k++)
        if (x->coll.ov_done[k] != m->place.micro) return 0;
    return 1;
}

/* Overlap: every bucket holding no layer's tensor and not started yet
   starts its reduction (their gradients are final: pt__ov_early). */
static pt_status pt__ov_rest(pt_gpt *m) {
    pt_gpt_exec *x = m->exec;
    int b, lo = x->tab_layers, hi = x->tab_layers + x->layer_tensors * m->place.n_layers;
    pt_status st = PT_OK;
    for (b = 0; b < x->coll.num_buckets && st == PT_OK; b++) {
        const pt__bucket *k = &x->coll.buckets[b];
        if (x->coll.ov_req[b].op != PT_COMM_OP_NONE || !k->count) continue;
        if (lo >= 0 && k->first < hi && lo < k->first + k->count) continue; /* a layer's */
        st = pt__ov_start(m, b);
    }
    return st;
}

/* Overlap (pt__wte_ok): the rows of this rank's vocabulary the step's tokens
   read on any dp rank, their all-reduce (MAX) started; the rows no rank
   reads get only the head's gradient. Where the reductions' order over the
   ranks might follow the buffer (MPI beyond 2 ranks), wte reduces whole. */
static pt_status pt__wte_mask_start(pt_gpt *m, const pt_step_desc *d) {
    pt_gpt_exec *x = m->exec;
    size_t i, n = (size_t)d->B * (size_t)d->T;
    int V = m->place.vocab_local, r;
    x->coll.trows = -1;
    memset(&x->coll.treq, 0, sizeof x->coll.treq);
    memset(&x->coll.kreq, 0, sizeof x->coll.kreq);
    memset(&x->coll.preq, 0, sizeof x->coll.preq);
    if (!x->coll.tmask || !x->coll.ov_on || (x->dp_comm->kind != PT_COMM_THREADS && m->place.dp != 2))
        return PT_OK;
    memset(x->coll.tmask, 0, (size_t)V * sizeof(float));
    for (i = 0; i < n; i++)
        if ((r = d->inputs[i] - m->place.vocab_offset) >= 0 && r < V) x->coll.tmask[r] = 1.0f;
    return pt_comm_all_reduce_start(x->dp_comm, x->coll.tmask, (size_t)V, PT_REDUCE_MAX,
                                    &x->coll.treq);
}

/* After the step's last head backward (pt__wte_mask_start's step): the rows
   some token reads, and wpe, kept aside compact (the embedding's backward
   adds to them there: pt__wte_embed), and the buckets of wte and wpe start
   their reduction (their rows kept aside are overwritten after:
   pt__wte_finish). More rows than the compact buffer holds: wte reduces
   whole after the embedding's backward, as without. */
static pt_status pt__wte_early(pt_gpt *m) {
    pt_gpt_exec *x = m->exec;
    int V = m->place.vocab_local, C = m->config.n_embd, r, R = 0, b, i;
    const pt_param *wpe = x->tab_wpe >= 0 ? &m->table[x->tab_wpe] : NULL;
    pt_status st = PT_OK;
    if (!x->coll.treq.comm || !x->coll.ov_last) return PT_OK;
    if ((st = pt_comm_wait(&x->coll.treq)) != PT_OK) return st;
    for (r = 0; r < V; r++) R += x->coll.tmask[r] != 0.0f;
    if (R > x->coll.tcap) return PT_OK;
    for (r = 0, R = 0; r < V; r++) {
        x->coll.tslot[r] = x->coll.tmask[r] != 0.0f ? R : -1;
        if (x->coll.tslot[r] >= 0)
            memcpy(x->coll.tkeep + (size_t)R++ * C, x->coll.dwte + (size_t)r * C, C * sizeof(float));
    }
    if (wpe && x->cp.comm) { /* (this rank's positions: the rows its tokens touch) */
        const int *pos = pt__cp_pos(&x->cp, x->cur_T);
        for (i = 0; i < x->cur_T; i++)
            memcpy(x->coll.tkeep + (size_t)(R + i) * C, x->coll.dwpe + (size_t)pos[i] * C,
                   C * sizeof(float));
    } else if (wpe) {
        memcpy(x->coll.tkeep + (size_t)R * C, x->coll.dwpe, wpe->numel * sizeof(float));
    }
    x->coll.trows = R;
    for (b = 0; b < x->coll.num_buckets && st == PT_OK; b++) { /* those of wte and wpe alone */
        const pt__bucket *k = &x->coll.buckets[b];
        int only = k->count > 0;
        for (i = k->first; i < k->first + k->count; i++) only &= i == x->tab_wte || i == x->tab_wpe;
        if (only) st = pt__ov_start(m, b);
    }
    return st;
}

/* pt__wte_early's embedding backward from dres: into the compact rows and
   wpe (each row's tokens in sequence: the sums of the whole kernel), then
   their reduction started. Context parallel, wpe's rows are this rank's
   positions, which its dp peers share and no other rank touches: summed
   over dp alone (the dp x cp average's sum, its zeros left out), the
   rows averaged and gathered over cp after (pt__wpe_gather). */
static pt_status pt__wte_embed(pt_gpt *m, const pt__slot *sl, const float *dres, int B, int T) {
    pt_gpt_exec *x = m->exec;
    int n, r, V = m->place.vocab_local, C = m->config.n_embd, R = x->coll.trows;
    size_t wpe = pt__wpe_kept(m, T), all = (size_t)R * C + wpe;
    pt_comm *dp = x->grid && x->grid->dp > 1 ? &x->grid->dp_comm : NULL;
    pt_status st;
    for (n = 0; n < B * T; n++) {
        r = sl->inputs[n] - m->place.vocab_offset;
        x->coll.tinp[n] = r >= 0 && r < V ? x->coll.tslot[r] : -1;
    }
    pt__encoder_backward_part(x->coll.tkeep, wpe ? x->coll.tkeep + (size_t)R * C : NULL, dres,
                              x->coll.tinp, x->cp.comm ? NULL : pt__cp_pos(x->scratch.cp, T), 0,
                              R, B, T, C);
    if (!x->cp.comm) /* (wpe whole: with the rows) */
        return all ? pt_comm_all_reduce_start(x->dp_comm, x->coll.tkeep, all, PT_REDUCE_AVG,
                                              &x->coll.kreq)
                   : PT_OK;
    if (R > 0 && (st = pt_comm_all_reduce_start(x->dp_comm, x->coll.tkeep, (size_t)R * C,
                                                PT_REDUCE_AVG, &x->coll.kreq)) != PT_OK)
        return st;
    if (!wpe || !dp) return PT_OK;
    return pt_comm_all_reduce_start(dp, x->coll.tkeep + (size_t)R * C, wpe, PT_REDUCE_SUM,
                                    &x->coll.preq);
}

/* n averaged gradients from src put at flat offset off: into the whole
   gradients (zero 0) or the parts of this rank's shards (zero 1; add: added
   to them, as a reduce-scatter's are, zero 3). */
static void pt__grad_put(const pt_gpt *m, size_t off, const float *src, size_t n, int add) {
    if (!m->place.zero) memcpy(m->grads + off, src, n * sizeof(float));
    else pt__dp_shard_io(m, m->exec->coll.gshard, off, (float *)src, n, add ? 2 : 1); /* (src read) */
}

/* ZeRO 3 (pt__z3_sparse_ok), the embeddings' backward from dres, after the
   layers' (both halves of work are free): the rows some dp rank's token
   reads (pt__z3_rows_read, in half 1) and wpe summed compact in half 0
   (each row's tokens in sequence: the whole kernel's sums), their average
   over the group started
   (pt__z3_sparse_finish adds it to the shards as a reduce-scatter would; the
   rows no token reads would add 0). Returns 1 in *done, or 0 when the halves
   cannot hold it (wte's buckets then reduce-scatter whole). */
static pt_status pt__z3_embed_sparse(pt_gpt *m, const pt__slot *sl, const float *dres, int B,
                                     int T, int *done) {
    pt_gpt_exec *x = m->exec;
    int V = m->place.vocab_local, C = m->config.n_embd, N = B * T, n, r, R = sl->zrows, b;
    size_t all, wn;
    const pt_param *wpe = pt__wpe_with_wte(m, T, &wn);
    float *buf = x->coll.work;
    const int *slot = sl->zslot;
    int *inp = (int *)(x->coll.work + x->coll.work_n); /* (half 1: the tokens' slots) */
    pt_status st;
    *done = 0;
    if (!pt__z3_sparse_ok(m)) return PT_OK;
    if ((st = pt__z3_drop(m, -1)) != PT_OK) return st; /* (a micro-batch's before: added) */
    all = (size_t)R * C + wn;
    if (all > x->coll.work_n || (size_t)N > x->coll.work_n) return PT_OK;
    memset(buf, 0, all * sizeof(float));
    for (n = 0; n < N; n++) {
        r = sl->inputs[n] - m->place.vocab_offset;
        inp[n] = r >= 0 && r < V ? slot[r] : -1;
    }
    pt__encoder_backward_part(buf, wpe ? buf + (size_t)R * C : NULL, dres, inp,
                              pt__cp_pos(x->scratch.cp, T), 0, R, B, T, C);
    *done = 1;
    b = m->table[x->tab_wte].bucket;
    x->coll.zrows = R, x->coll.zslot = slot, x->coll.zwpe = wn, x->coll.ov_t[b] = pt_time_now(), x->coll.ov_at[b] = x->act;
    return pt_comm_all_reduce_start(x->dp_comm, buf, all, PT_REDUCE_AVG, &x->coll.kreq);
}

/* pt__z3_embed_sparse's average waited for and added to this rank's shards
   of its rows and wpe (gshard += avg, as after a reduce-scatter); before
   anything writes into work again. */
static pt_status pt__z3_sparse_finish(const pt_gpt *m) {
    pt_gpt_exec *x = m->exec;
    int V = m->place.vocab_local, r, R = x->coll.zrows, b = m->table[x->tab_wte].bucket;
    size_t C = (size_t)m->config.n_embd, wn;
    const pt_param *wpe = pt__wpe_with_wte(m, 1, &wn);
    const int *slot = x->coll.zslot;
    pt_status st;
    if (R < 0) return PT_OK;
    x->coll.zrows = -1;
    if (x->coll.kreq.comm && (st = pt_comm_wait(&x->coll.kreq)) != PT_OK) return st;
    pt__trace_dp(x, PT_TRACE_DP_REDUCE, b, x->coll.ov_t[b], x->coll.ov_at[b]);
    for (r = 0; r < V; r++)
        if (slot[r] >= 0)
            pt__grad_put(m, m->table[x->tab_wte].offset + (size_t)r * C,
                         x->coll.work + (size_t)slot[r] * C, C, 1);
    if (wpe) pt__grad_put(m, wpe->offset, x->coll.work + (size_t)R * C, x->coll.zwpe, 1);
    return PT_OK;
}

/* Context parallel (pt__wte_embed): wpe's rows of this rank's positions,
   summed over dp, averaged over dp x cp (divided by its size, as the
   group's average is) and gathered over cp into wpe's gradient: chunk c of
   each rank c's first halves, chunk 2K-1-c of its second halves (gathered
   in rank order, so their K blocks are reversed after), 0 past the
   sequence. m->grads' wpe is free (pt__wte_early kept it aside). */
static pt_status pt__wpe_gather(pt_gpt *m, float *keep) {
    pt_gpt_exec *x = m->exec;
    const pt_param *wpe = &m->table[x->tab_wpe];
    size_t C = (size_t)m->config.n_embd, h = (size_t)x->cur_T / 2 * C, n = 2 * h, i, j;
    int K = x->cp.comm->size, size = x->dp_comm->size, b;
    float *g = m->grads + wpe->offset, t;
    pt_status st;
    if (x->coll.preq.comm && (st = pt_comm_wait(&x->coll.preq)) != PT_OK) return st;
    for (i = 0; i < n; i++) keep[i] /= (float)size;
    if ((st = pt_comm_all_gather(x->cp.comm, keep, g, h)) != PT_OK ||
        (st = pt_comm_all_gather(x->cp.comm, keep + h, g + (size_t)K * h, h)) != PT_OK)
        return st;
    for (b = 0; b < K / 2; b++) /* blocks K + b and 2K - 1 - b swap */
        for (j = 0; j < h; j++) {
            float *u = g + (size_t)(K + b) * h + j, *v = g + (size_t)(2 * K - 1 - b) * h + j;
            t = *u, *u = *v, *v = t;
        }
    memset(g + (size_t)K * n, 0, (wpe->numel - (size_t)K * n) * sizeof(float));
    if (m->place.zero) pt__grad_put(m, wpe->offset, g, wpe->numel, 0);
    return PT_OK;
}

/* After wte's buckets: the compact rows' reduction waited for and put in
   place of what the buckets averaged for those rows and wpe. */
static pt_status pt__wte_finish(pt_gpt *m) {
    pt_gpt_exec *x = m->exec;
    int V = m->place.vocab_local, r, R = x->coll.trows;
    size_t C = (size_t)m->config.n_embd;
    const pt_param *wpe = x->tab_wpe >= 0 ? &m->table[x->tab_wpe] : NULL;
    pt_status st;
    x->coll.trows = -1;
    if (x->coll.kreq.comm && (st = pt_comm_wait(&x->coll.kreq)) != PT_OK) return st;
    for (r = 0; r < V; r++)
        if (x->coll.tslot[r] >= 0)
            pt__grad_put(m, m->table[x->tab_wte].offset + (size_t)r * C,
                         x->coll.tkeep + (size_t)x->coll.tslot[r] * C, C, 0);
    if (wpe && x->cp.comm) return pt__wpe_gather(m, x->coll.tkeep + (size_t)R * C);
    if (wpe) pt__grad_put(m, wpe->offset, x->coll.tkeep + (size_t)R * C, wpe->numel, 0);
    return PT_OK;
}

/* After a step's last micro-batch: every bucket averaged over the dp group,
   whole (zero 0) or into this rank's shard (zero 1; zero 2 did it in backward);
   the buckets the overlap started are waited for. */
static pt_status pt__dp_sync_grads(pt_gpt *m) {
    pt_gpt_exec *x = m->exec;
    int b;
    pt_status st = x->coll.poll_st;
    for (b = 0; b < x->coll.num_buckets && st == PT_OK; b++) {
        const pt__bucket *k = &x->coll.buckets[b];
        double t = pt_time_now();
        int at = x->act;
        if (x->coll.ov_on && x->coll.ov_req[b].op != PT_COMM_OP_NONE) {
            if (!x->coll.ov_req[b].comm) continue; /* a poll found it done */
            st = pt_comm_wait(&x->coll.ov_req[b]);
            t = x->coll.ov_t[b], at = x->coll.ov_at[b];
        } else if (m->place.zero == 1 || m->place.zero == 3) {
            st = pt__dp_reduce_scatter(m, m->grads + k->offset, x->coll.gshard + k->shard_offset,
                                       k->numel);
        } else if (m->place.zero == 0 && m->place.dp > 1) {
            st = pt_comm_all_reduce(x->dp_comm, m->grads + k->offset, k->numel, PT_REDUCE_AVG);
        } else {
            continue;
        }
        if (st == PT_OK && m->place.dp > 1) pt__trace_dp(x, PT_TRACE_DP_REDUCE, b, t, at);
    }
    return st == PT_OK && x->coll.trows >= 0 ? pt__wte_finish(m) : st;
}

/* Selective recomputation: a layer's attention output again, from the
   q, k, v its forward kept (after the rotary embedding). */
static pt_status pt__attention_again(pt_gpt *m, pt_block_acts *a, int B, int T) {
    pt_gpt_exec *x = m->exec;
    pt__dims d = pt__block_dims(&m->config, B, T, m->place.tp);
    pt__bf16_load(a->qkv, a->qkv_16, d.N * d.Q3, &x->scratch.held[1]);
    return pt__attention_fwd(&m->ctx, &d, a->qkv, a->atty, a->lse, &x->scratch);
}

/* The final norm's backward from the head's input gradient (x->scratch.dln,
   (N,C), this rank's vocabulary's part): summed over the tp group, into
   x->dres (written) and the norm's gradients. Sequence parallel: this
   rank's rows of the sum (a reduce-scatter), the norm on them, its weight
   gradients summed over the group. */
static pt_status pt__head_norm_backward(pt_gpt *m, pt__slot *sl, const float *in, int N) {
    pt_gpt_exec *x = m->exec;
    const pt_gpt_config *cfg = &m->config;
    int C = cfg->n_embd, sp = m->place.sp, Ns = sp ? N / m->place.tp : N, i;
    float *dln = sp ? x->scratch.xg : x->scratch.dln, *dw = x->coll.dlnf_w, *db = x->coll.dlnf_b;
    pt_status st = pt__tp_rows(x->tp_comm, sp, x->scratch.dln, dln, (size_t)Ns * C);
    if (st != PT_OK) return st;
    memset(x->dres, 0, sizeof(float) * (size_t)Ns * C);
    if (sp) { /* [w | b] of this rank's rows in the scratch's spg, then their sum */
        memset(x->scratch.spg, 0, 2 * (size_t)C * sizeof(float));
        dw = x->scratch.spg, db = db ? x->scratch.spg + C : NULL;
    }
    pt__norm_backward(cfg, x->dres, dw, db, dln, in, m->lnf_w, sl->lnf_mean, sl->lnf_rstd, Ns, C);
    if (!sp) return PT_OK;
    if ((st = pt_comm_all_reduce(x->tp_comm, x->scratch.spg, 2 * (size_t)C, PT_REDUCE_SUM)) != PT_OK)
        return st;
    for (i = 0; i < C; i++) x->coll.dlnf_w[i] += x->scratch.spg[i];
    for (i = 0; db && i < C; i++) x->coll.dlnf_b[i] += x->scratch.spg[C + i];
    return PT_OK;
}

/* The embeddings' backward from x->dres, the first layer's input gradient:
   every rank holds the whole dres (sequence parallel: gathered, the g of
   the embedding's reduce-scatter): its wte rows, and all of wpe. */
static pt_status pt__embed_backward(pt_gpt *m, const pt__slot *sl, int B, int T) {
    pt_gpt_exec *x = m->exec;
    const pt_gpt_place *pl = &m->place;
    size_t NC = (size_t)B * T * (size_t)m->config.n_embd;
    int done;
    pt_status st;
    if (pl->sp && (st = pt_comm_all_gather(x->tp_comm, x->dres, x->scratch.xg,
                                           NC / (size_t)pl->tp)) != PT_OK)
        return st;
    if (pl->zero == 3 && ((st = pt__z3_embed_sparse(m, sl, pl->sp ? x->scratch.xg : x->dres, B, T,
                                                    &done)) != PT_OK || done))
        return st;
    if (pt__grads_staged(pl)) return pt__zero2_vocab(m, sl, B, T, 0, 0.0f);
    if (x->coll.trows >= 0) return pt__wte_embed(m, sl, pl->sp ? x->scratch.xg : x->dres, B, T);
    pt__encoder_backward_part(x->coll.dwte, x->coll.dwpe, pl->sp ? x->scratch.xg : x->dres,
                              sl->inputs, pt__cp_pos(x->scratch.cp, T), pl->vocab_offset,
                              pl->vocab_local, B, T, m->config.n_embd);
    return PT_OK;
}

/* Overlap, the step's last backward of the first layer (pt__ov_early): its
   B, the embeddings' backward, the buckets holding no layer started, then
   its W behind their reduction, the MLP half's bucket started between W's
   halves (B then W is pt_block_backward: the same bits). */
static pt_status pt__first_layer_backward(pt_gpt *m, pt__slot *sl, int l, int B, int T,
                                          const float *in, const pt_block_acts *a) {
    pt_gpt_exec *x = m->exec;
    int tp = x->tp_comm ? x->tp_comm->size : 1, w0 = 0;
    pt_status st = pt__block_bwd(&m->ctx, &m->config, B, T, &m->layers[l], &x->coll.layer_grads[l],
                                 in, a, x->dres, x->dres, &x->scratch.w, &x->scratch, x->tp_comm,
                                 &w0);
    if (st == PT_OK) st = pt__embed_backward(m, sl, B, T);
    if (st == PT_OK) st = pt__ov_rest(m);
    if (st != PT_OK) return st;
    if (!w0)
        pt__block_weight_part(&m->ctx, &m->config, B, T, &m->layers[l], &x->coll.layer_grads[l],
                              in, a, &x->scratch.w, &x->scratch, tp, 0);
    if ((st = pt__ov_part(m, l)) != PT_OK) return st;
    pt__block_weight_part(&m->ctx, &m->config, B, T, &m->layers[l], &x->coll.layer_grads[l], in,
                          a, &x->scratch.w, &x->scratch, tp, 1);
    return pt_block_sp_norm_sum(&m->config, &x->coll.layer_grads[l], &x->scratch, x->tp_comm);
}

/* ZeRO 2 and 3 with overlap: layer l's backward as B, then the previous
   layer's reduce-scatter settled (it ran behind B), then W into the stage
   (B then W is pt_block_backward: the same bits). Context parallel, W's
   MLP half runs inside B: the reduce-scatter is settled before. */
static pt_status pt__staged_layer_backward(pt_gpt *m, int l, int B, int T, const float *in,
                                           const pt_block_acts *a) {
    pt_gpt_exec *x = m->exec;
    int tp = x->tp_comm ? x->tp_comm->size : 1, w0 = 0, early = !!pt__cp_pos(x->scratch.cp, T);
    pt_status st = early ? pt__zero2_settle(m) : PT_OK; /* (W's MLP half inside B: pt__block_bwd) */
    if (st == PT_OK)
        st = pt__block_bwd(&m->ctx, &m->config, B, T, &m->layers[l], &x->coll.layer_grads[l], in,
                           a, x->dres, x->dres, &x->scratch.w, &x->scratch, x->tp_comm, &w0);
    if (st == PT_OK && !early) st = pt__zero2_settle(m);
    if (st != PT_OK) return st;
    if (!w0)
        pt__block_weight_part(&m->ctx, &m->config, B, T, &m->layers[l], &x->coll.layer_grads[l],
                              in, a, &x->scratch.w, &x->scratch, tp, 0);
    pt__block_weight_part(&m->ctx, &m->config, B, T, &m->layers[l], &x->coll.layer_grads[l], in, a,
                          &x->scratch.w, &x->scratch, tp, 1);
    return pt_block_sp_norm_sum(&m->config, &x->coll.layer_grads[l], &x->scratch, x->tp_comm);
}

/* The head's backward for the micro-batch in slot sl: the input's gradient
   into x->scratch.dln (written), the head's into its gradient, the logits
   made again by row blocks with the dlogits and both products (ZeRO 0, 1:
   with the losses too; ZeRO 2 and 3: bucket by bucket from the forward's
   lse, ZeRO 3 through the head's gathered rows). */
static pt_status pt__head_backward(pt_gpt *m, pt__slot *sl, int B, int T, float dloss, int lnf_b) {
    pt_gpt_exec *x = m->exec;
    const pt_gpt_place *pl = &m->place;
    int N = B * T, C = m->config.n_embd;
    pt_status st;
    memset(x->scratch.dln, 0, sizeof(float) * (size_t)N * C);
    if (pl->zero == 2) return pt__zero2_vocab(m, sl, B, T, 1, dloss);
    if (pl->zero == 3)
        return pt__z3_head_backward(m, sl, N, lnf_b,
                                    pt__grads_staged(pl) && x->coll.ag_on && pl->dp > 1, dloss);
    st = pt__head_fused_run(m, sl, N, dloss, x->scratch.dln, x->coll.dhead);
    return st != PT_OK ? st : pt__wte_early(m);
}

/* Backward of this stage's chunk c for the micro-batch in slot sl,
   accumulating parameter gradients (dloss scales the mean loss's): from the
   loss if c holds the last virtual stage, else from x->dres (the output's
   gradient); leaves the input's gradient in x->dres, or ends in the
   embedding if c holds virtual stage 0. input_only: B without W (kept in
   sl->wg). ZeRO 2 hands each bucket to its shard as soon as it is complete. */
static pt_status pt__chunk_backward(pt_gpt *m, pt__slot *sl, int c, int B, int T, float dloss,
                                    int input_only) {
    pt_gpt_exec *x = m->exec;
    const pt_gpt_place *pl = &m->place;
    const pt_gpt_config *cfg = &m->config;
    int N = B * T, l, first = x->pipe.chunk_lo[c], last = x->pipe.chunk_hi[c];
    int zero2 = pt__grads_staged(pl), lnf_b = x->tab_lnf >= 0 ? m->table[x->tab_lnf].bucket : -1;
    int early = !input_only && last > first && pt__ov_early(m, c); /* (the embedding inside) */
    int zs = zero2 && x->coll.ag_on && pl->dp > 1, b; /* the layers' reduce-scatters started */
    pt_status st;
    if (c == x->pipe.head_chunk) {
        if ((st = pt__head_backward(m, sl, B, T, dloss, lnf_b)) != PT_OK) return st;
        if ((st = pt__z3_need(m, lnf_b, pt__layer_bucket(m, last - 1))) != PT_OK ||
            (zs && (st = pt__zero2_settle(m)) != PT_OK) || /* (the norm's gradient is staged) */
            (st = pt__head_norm_backward(m, sl, last > first ? sl->acts[last - 1 - first].out
                                                             : sl->x, N)) != PT_OK)
            return st;
        if (zero2 && (st = zs ? pt__zero2_start(m, lnf_b) : pt__zero2_bucket(m, lnf_b)) != PT_OK)
            return st;
    }
    for (l = last - 1; l >= first; l--) {
        pt_block_acts *a = &sl->acts[l - first];
        const float *in = l > first ? sl->acts[l - 1 - first].out : sl->x;
        /* ZeRO 3: the layer gathered again (for the recomputed forward too) */
        if ((st = pt__z3_need(m, pt__layer_bucket(m, l),
                              l > first ? pt__layer_bucket(m, l - 1) : -1)) != PT_OK)
            return st;
        if (pl->recompute == PT_RECOMPUTE_FULL) { /* the layer's forward again, from its input */
            x->pipe.racts.out = a->out;
            a = &x->pipe.racts;
            st = pt_block_forward(&m->ctx, cfg, B, T, &m->layers[l], in, a, &x->scratch,
                                  x->tp_comm);
            if (st != PT_OK) return st;
        } else if (pl->recompute == PT_RECOMPUTE_SELECTIVE) { /* the attention core again */
            a->atty = x->pipe.racts.atty;
            if ((st = pt__attention_again(m, a, B, T)) != PT_OK) return st;
        }
        if (input_only) /* B alone: W comes later, from what sl->wg keeps */
            st = pt_block_backward_input(&m->ctx, cfg, B, T, &m->layers[l], in, a, x->dres,
                                         x->dres, &sl->wg[l - first], &x->scratch, x->tp_comm);
        else if (early && l == first)
            st = pt__first_layer_backward(m, sl, l, B, T, in, a);
        else if (zs)
            st = pt__staged_layer_backward(m, l, B, T, in, a);
        else
            st = pt_block_backward(&m->ctx, cfg, B, T, &m->layers[l], &x->coll.layer_grads[l], in, a,
                                   x->dres, x->dres, &x->scratch, x->tp_comm);
        if (st == PT_OK && !input_only) st = pt__ov_layer(m, l, 0);
        if (st != PT_OK) return st;
        b = m->table[x->tab_layers + x->layer_tensors * l].bucket;
        if (zero2 && (st = zs ? pt__zero2_start(m, b) : pt__zero2_bucket(m, b)) != PT_OK) return st;
    }
    return c == x->pipe.embed_chunk && !early ? pt__embed_backward(m, sl, B, T) : PT_OK;
}

/* W of this stage's chunk c: the layers' weight gradients from what B kept
   in sl->wg (the attention output recomputed first when selective). */
static pt_status pt__chunk_weight(pt_gpt *m, pt__slot *sl, int c, int B, int T) {
    pt_gpt_exec *x = m->exec;
    const pt_gpt_config *cfg = &m->config;
    int l, first = x->pipe.chunk_lo[c], last = x->pipe.chunk_hi[c], k = m->place.tp;
    pt_status st = PT_OK;
    for (l = first; l < last && st == PT_OK; l++) {
        pt_block_acts *a = &sl->acts[l - first];
        const float *in = l > first ? sl->acts[l - 1 - first].out : sl->x;
        if (m->place.recompute == PT_RECOMPUTE_SELECTIVE) {
            a->atty = x->pipe.racts.atty;
            if ((st = pt__attention_again(m, a, B, T)) != PT_OK) return st;
        }
        pt_block_backward_weight(&m->ctx, cfg, B, T, &m->layers[l], &x->coll.layer_grads[l], in, a,
                                 &sl->wg[l - first], &x->scratch, k);
        st = pt_block_sp_norm_sum(cfg, &x->coll.layer_grads[l], &x->scratch, x->tp_comm);
        if (st == PT_OK) st = pt__ov_layer(m, l, 1);
    }
    return st;
}

/* ---- the step ---------------------------------------------------------------- */

/* PipeDream-2BW: m's named weights and layers <-> the previous version's
   (twice restores them). */
static void pt__swap_weights(pt_gpt *m) {
    pt_gpt_exec *x = m->exec;
    pt_block_params *l = m->layers;
    float *t;
#define PT__SWAP(a, b) (t = (a), (a) = (b), (b) = t)
    PT__SWAP(m->wte, x->wv.pv_wte);
    PT__SWAP(m->wpe, x->wv.pv_wpe);
    PT__SWAP(m->lnf_w, x->wv.pv_lnf_w);
    PT__SWAP(m->lnf_b, x->wv.pv_lnf_b);
    PT__SWAP(m->lm_head, x->wv.pv_head);
#undef PT__SWAP
    m->layers = x->wv.pv_layers;
    x->wv.pv_layers = l;
    x->wv.pv_on = !x->wv.pv_on;
}

static void pt__zero_grad(pt_gpt *m) {
    pt_gpt_exec *x = m->exec;
    memset(m->grads, 0,
           (pt__grads_staged(&m->place) ? pt__largest_bucket(m) : m->num_params) * sizeof(float));
    if (x->coll.gshard) memset(x->coll.gshard, 0, x->coll.shard_total * sizeof(float));
    x->micro_done = 0;
}

/* A pipeline message's tag: its micro-batch, the virtual stage that made it
   and its direction. */
static int pt__pp_tag(const pt_schedule *s, int micro, int from, int grad) {
    return (micro * pt__sched_nv(s) + from) * 2 + grad;
}

/* pp_on: posts the receive of kind j (0: activation, 1: gradient) of the
   first such action after list index k into its buffer, n floats. */
static pt_status pt__pp_post(pt_gpt *m, int j, int k, size_t n) {
    pt_gpt_exec *x = m->exec;
    const pt_schedule *s = &x->pipe.sched;
    int stage = m->place.pp_rank, want = j ? PT_ACT_RECV_GRAD : PT_ACT_RECV_ACT, vs;
    const pt_action *a;
    for (k++; k < s->count[stage] && s->list[stage][k].kind != want; k++) {
    }
    x->pipe.pp_rnext[j] = k < s->count[stage] ? k : -1;
    if (x->pipe.pp_rnext[j] < 0) return PT_OK;
    a = &s->list[stage][k];
    vs = pt__sched_vs(s, stage, a->chunk);
    return pt_comm_recv_start(x->pp_comm, x->pipe.pp_rbuf + (size_t)j * n, n, a->peer,
                              pt__pp_tag(s, a->micro, j ? vs + 1 : vs - 1, j), &x->pipe.pp_rreq[j]);
}

/* The receive of list index k, kind j, into dst (n floats): the posted one,
   copied out, and the next posted; without pp_on, received now. */
static pt_status pt__pp_recv(pt_gpt *m, int j, int k, float *dst, size_t n, int peer, int tag) {
    pt_gpt_exec *x = m->exec;
    pt_status st;
    if (!x->pipe.pp_on || x->pipe.pp_rnext[j] != k) return pt_comm_recv(x->pp_comm, dst, n, peer, tag);
    if ((st = pt_comm_wait(&x->pipe.pp_rreq[j])) != PT_OK) return st;
    if (x->coll.poll_st) return x->coll.poll_st; /* (a poll may have found it done, and failed) */
    memcpy(dst, x->pipe.pp_rbuf + (size_t)j * n, n * sizeof(float));
    return pt__pp_post(m, j, k, n);
}

/* A send of kind j from buf: started (waited for before buf changes:
   pt__pp_settle), or now without pp_on. */
static pt_status pt__pp_send(pt_gpt *m, int j, const float *buf, size_t n, int peer, int tag) {
    pt_gpt_exec *x = m->exec;
    pt_status st;
    if (!x->pipe.pp_on) return pt_comm_send(x->pp_comm, buf, n, peer, tag);
    if ((st = pt_comm_wait(&x->pipe.pp_sreq[j])) != PT_OK) return st;
    return pt_comm_send_start(x->pp_comm, buf, n, peer, tag, &x->pipe.pp_sreq[j]);
}

/* Waits for the started send of kind j (0: activations, 1: gradients; -1:
   both) before its buffer is written or freed. */
static pt_status pt__pp_settle(pt_gpt *m, int j) {
    pt_gpt_exec *x = m->exec;
    pt_status st = PT_OK;
    if (j != 1) st = pt_comm_wait(&x->pipe.pp_sreq[0]);
    if (j != 0 && st == PT_OK) st = pt_comm_wait(&x->pipe.pp_sreq[1]);
    return st;
}

/* The slot holding (micro, chunk), taking a free one if it has none. */
static pt__slot *pt__slot_of(pt_gpt *m, int micro, int chunk, int take) {
    pt_gpt_exec *x = m->exec;
    int k;
    for (k = 0; k < x->pipe.nslots; k++)
        if (x->pipe.slots[k].micro == micro && x->pipe.slots[k].chunk == chunk) return &x->pipe.slots[k];
    for (k = 0; take && k < x->pipe.nslots; k++)
        if (x->pipe.slots[k].micro < 0) {
            x->pipe.slots[k].micro = micro, x->pipe.slots[k].chunk = chunk;
            if (++x->pipe.slots_used > m->mem.slots_peak) m->mem.slots_peak = x->pipe.slots_used;
            return &x->pipe.slots[k];
        }
    return NULL;
}

static void pt__slot_release(pt_gpt *m, pt__slot *sl) {
    sl->micro = sl->chunk = -1;
    m->exec->pipe.slots_used--;
}

/* A step's batch: B rows that split into place.micro micro-batches the
   model can hold, T tokens, and token ids inside the vocabulary. */
static pt_status pt__step_batch(const pt_gpt *m, const pt_step_desc *d) {
    int mb = m->place.micro;
    pt_status st;
    if (!m->params) return pt__fail(PT_ERR_INVALID_ARG, "model has no memory (built with meta=1)");
    if (!d->inputs || !d->targets)
        return pt__fail(PT_ERR_INVALID_ARG, "a step needs inputs and targets");
    if (d->B < 1 || d->B % mb != 0 || d->B / mb > m->B || d->T < 1 || d->T > m->T)
        return pt__fail(PT_ERR_CONFIG, "batch %dx%d does not split into %d micro-batch%s of at "
                        "most %dx%d", d->B, d->T, mb, mb > 1 ? "es" : "", m->B, m->T);
    if (m->place.sp && d->T % m->place.tp != 0)
        return pt__fail(PT_ERR_CONFIG, "sequence_parallel: T=%d is not a multiple of tp=%d",
                        d->T, m->place.tp);
    if ((st = pt__check_tokens(d->inputs, (size_t)d->B * d->T, m->config.vocab_size,
                               "inputs")) != PT_OK ||
        (st = pt__check_tokens(d->targets, (size_t)d->B * d->T, m->config.vocab_size,
                               "targets")) != PT_OK)
        return st;
    return PT_OK;
}

/* OPT's first half: the two copies of wte (first and last stage) get the
   sum of their gradients (Chimera's REDUCE summed every tensor with the other
   replica already), the dp group averages them, and every rank gets the loss
   (the head stages' sums over their micro-batches over the step's count,
   summed over the stages, then averaged over dp). */
static pt_status pt__step_sync(pt_gpt *m, float loss_sum, int last) {
    pt_gpt_exec *x = m->exec;
    const pt_gpt_place *pl = &m->place;
    float loss = pl->has_head ? loss_sum / (float)pl->micro : 0.0f;
    pt_status st = PT_OK;
    if (pt__tie_sum(m))
        st = pt_comm_all_reduce(x->tie_comm, x->coll.dwte, m->table[x->tab_wte].numel, PT_REDUCE_SUM);
    if (st == PT_OK && !pt__grads_staged(pl)) st = pt__dp_sync_grads(m);
    if (st == PT_OK && pt__grads_staged(pl) && (st = pt__zero2_settle(m)) == PT_OK && pl->zero == 3)
        st = pt__z3_sparse_finish(m); /* (the last layer's and the embedding's under way) */
    if (st == PT_OK && pl->zero && pl->schedule == PT_SCHED_CHIMERA) /* 1/dp of REDUCE's bytes */
        st = pt_comm_all_reduce(x->tie_comm, x->coll.gshard, x->coll.shard_total, PT_REDUCE_SUM);
    if (!last) return st; /* 2BW's updates inside the step: the loss comes at its end */
    if (st == PT_OK && pl->pp > 1) st = pt_comm_all_reduce(x->pp_comm, &loss, 1, PT_REDUCE_SUM);
    if (st == PT_OK && pl->dp > 1) st = pt_comm_all_reduce(x->dp_comm, &loss, 1, PT_REDUCE_AVG);
    m->loss = loss;
    return st;
}

/* OPT's second half, with an optimizer: clipping, the guard every rank
   agrees on, and AdamW unless the update is skipped (2BW: several a step;
   the last norm, any skip). */
static pt_status pt__step_update(pt_gpt *m, const pt_step_desc *d, pt_step_result *r) {
    int bad = 0;
    pt_status st;
    if ((st = pt_gpt_clip_grad_norm(m, d->clip, &r->grad_norm)) != PT_OK) return st;
    if ((st = pt_gpt_check_step(m, m->loss, r->grad_norm, &bad, r->skipped ? NULL : r->bad_tensor,
                                sizeof r->bad_tensor)) != PT_OK)
        return st;
    r->skipped |= bad;
    if (bad) return PT_OK;
    m->exec->wv.in_opt = 1;
    st = pt_gpt_adamw_step(m, d->adamw, d->lr);
    m->exec->wv.in_opt = 0;
    return st;
}

/* A step's trace (NULL: none): after a barrier, a common time origin for
   every rank's events; its track, the world rank; no action begun yet, and
   the gathers under way begun before the step. */
static pt_status pt__trace_begin(pt_gpt_exec *x, pt_trace *trace) {
    pt_comm *world = x->grid ? x->grid->world : NULL;
    pt_status st;
    int b;
    x->trace = trace, x->trace_t0 = 0.0, x->trace_track = 0, x->act = -1;
    for (b = 0; b < x->coll.num_buckets; b++) x->coll.ag_at[b] = -1;
    if (!trace) return PT_OK;
    if (world && (st = pt_comm_barrier(world)) != PT_OK) return st;
    x->trace_track = world ? world->rank : 0;
    x->trace_t0 = pt_time_now();
    return PT_OK;
}

/* One step's running figures, shared by its actions. */
typedef struct pt__step_run {
    const pt_step_desc *d;
    pt_step_result *res;
    int b;                    /* rows of a micro-batch */
    size_t N, NV;             /* its tokens, and logits */
    float dloss;              /* d(mean loss)/d(one token's loss) */
    float loss_sum;           /* the head's micro-batch losses so far */
} pt__step_run;

static pt_status pt__no_slot(int stage, int micro, int chunk) {
    return pt__fail(PT_ERR_INVALID_ARG, "pipeline stage %d: no activation slot for micro-batch "
                    "%d chunk %d (the schedule and the slots disagree)", stage, micro, chunk);
}

/* Action k of this stage's list, on its slot (2BW's weight version and the
   trace are the caller's). */
static pt_status pt__step_action(pt_gpt *m, pt__step_run *r, int k) {
    pt_gpt_exec *x = m->exec;
    const pt_gpt_place *pl = &m->place;
    const pt_schedule *s = &x->pipe.sched;
    const pt_step_desc *d = r->d;
    const pt_action *a = &s->list[pl->pp_rank][k];
    int stage = pl->pp_rank, C = m->config.n_embd, last = k == s->count[stage] - 1;
    size_t N = r->N, NV = r->NV, NC = N * (size_t)C / (size_t)(pl->sp ? pl->tp : 1);
    /* a message's tag names its micro-batch and the virtual stage that made it */
    int i = a->micro, c = a->chunk, vs = c >= 0 ? pt__sched_vs(s, stage, c) : 0;
    /* ZB-V's turn: the virtual stage before this one is here too (backward
       needs nothing: the checker holds the turn's two B's together, so the
       gradient passes in x->dres) */
    int local_in = a->kind == PT_ACT_F && vs > 0 && pt__sched_at(s, i, vs - 1) == stage;
    int from = a->kind == PT_ACT_RECV_ACT ? vs - 1 : a->kind == PT_ACT_RECV_GRAD ? vs + 1 : vs;
    int tag = pt__pp_tag(s, i, from, a->kind == PT_ACT_SEND_GRAD || a->kind == PT_ACT_RECV_GRAD);
    int fresh = a->kind == PT_ACT_RECV_ACT || a->kind == PT_ACT_F; /* takes a new slot */
    /* the fused head's losses come in backward (ZeRO 2's backward needs the forward's lse) */
    int defer = x->head_work && !d->logits && pl->zero < 2;
    pt__slot *sl = NULL;
    float loss = 0.0f;
    pt_status st = PT_OK;
    if ((a->kind == PT_ACT_RECV_ACT || a->kind == PT_ACT_F || a->kind == PT_ACT_SEND_ACT ||
         a->kind == PT_ACT_B || a->kind == PT_ACT_W) && !(sl = pt__slot_of(m, i, c, fresh)))
        return pt__no_slot(stage, i, c);
    switch (a->kind) {
    case PT_ACT_RECV_ACT:
        return pt__pp_recv(m, 0, k, sl->x, NC, a->peer, tag);
    case PT_ACT_F:
        memcpy(sl->inputs, d->inputs + (size_t)i * N, N * sizeof(int));
        memcpy(sl->targets, d->targets + (size_t)i * N, N * sizeof(int));
        if (local_in) { /* the input is this stage's previous chunk's output */
            int pc = pt__sched_chunk_at(s, i, vs - 1);
            pt__slot *prev = pt__slot_of(m, i, pc, 0);
            if (!prev) return pt__no_slot(stage, i, pc);
            memcpy(sl->x, prev->acts[x->pipe.chunk_hi[pc] - x->pipe.chunk_lo[pc] - 1].out,
                   NC * sizeof(float));
        }
        st = pt__chunk_forward(m, sl, c, r->b, d->T, defer ? 2 : 1, &loss);
        if (st == PT_OK && c >= 0 && c == x->pipe.head_chunk && !defer) {
            r->loss_sum += loss;
            if (d->losses) memcpy(d->losses + (size_t)i * N, sl->losses, N * sizeof(float));
            if (d->logits) st = pt__head_logits(m, sl, N, d->logits + (size_t)i * NV);
        }
        return st;
    case PT_ACT_SEND_ACT:
        return pt__pp_send(m, 0, sl->acts[x->pipe.chunk_hi[c] - x->pipe.chunk_lo[c] - 1].out, NC,
                           a->peer, tag);
    case PT_ACT_RECV_GRAD: /* (into dres: the gradient sent from it has gone) */
        if ((st = pt__pp_settle(m, 1)) != PT_OK) return st;
        return pt__pp_recv(m, 1, k, x->dres, NC, a->peer, tag);
    case PT_ACT_B: /* (it writes dres; its slot, freed, may be the sent activation's) */
        if ((st = pt__pp_settle(m, x->pipe.split ? 1 : -1)) != PT_OK) return st;
        if (!x->pipe.split) x->coll.ov_last = ++x->coll.ov_done[c] == pl->micro;
        st = pt__chunk_backward(m, sl, c, r->b, d->T, r->dloss, x->pipe.split);
        if (st == PT_OK && c == x->pipe.head_chunk && defer) { /* the losses came with it */
            r->loss_sum += pt__mean_loss(sl->losses, (int)N);
            if (d->losses) memcpy(d->losses + (size_t)i * N, sl->losses, N * sizeof(float));
        }
        if (!x->pipe.split) pt__slot_release(m, sl);
        return st;
    case PT_ACT_SEND_GRAD:
        return pt__pp_send(m, 1, x->dres, NC, a->peer, tag);
    case PT_ACT_W: /* the weight gradients, then the activations are free */
        if ((st = pt__pp_settle(m, 0)) != PT_OK) return st;
        x->coll.ov_last = ++x->coll.ov_done[c] == pl->micro;
        st = pt__chunk_weight(m, sl, c, r->b, d->T);
        pt__slot_release(m, sl);
        return st;
    case PT_ACT_REDUCE: /* Chimera: the stage holding these layers in the other
                           replica adds its gradients (both get the same sums); under
                           ZeRO 1 only its dp shard, after the dp reduce-scatter (OPT) */
        return pl->zero ? PT_OK
                        : pt_comm_all_reduce(x->tie_comm, m->grads, m->num_params, PT_REDUCE_SUM);
    case PT_ACT_OPT: /* the gradients synced; the optimizer, if asked for (2BW: the
                        update of each p micro-batches, mid-list but the last) */
        if ((st = pt__pp_settle(m, -1)) != PT_OK) return st; /* the messages out */
        if (pl->schedule == PT_SCHED_2BW) { /* version ver + 1 = W(ver) - lr grad f(W(ver - 1)):
                                               W(ver) stays */
            memcpy(x->wv.wprev, m->params, m->num_params * sizeof(float));
            x->wv.ver++;
        }
        if ((st = pt__step_sync(m, r->loss_sum, last)) != PT_OK) return st;
        if (d->on_grads) d->on_grads(m, d->on_grads_ctx);
        if (d->adamw) st = pt__step_update(m, d, r->res);
        if (st == PT_OK && !last) pt__zero_grad(m);
        return st;
    default:
        return PT_OK;
    }
}

/* Before the step's first action: its options checked, the gradients and
   slots cleared, overlap decided, the pipeline's first receives posted. */
static pt_status pt__step_begin(pt_gpt *m, const pt_step_desc *d, size_t N, size_t NV) {
    pt_gpt_exec *x = m->exec;
    const pt_gpt_place *pl = &m->place;
    int tbw = pl->schedule == PT_SCHED_2BW, k;
    pt_status st;
    if ((unsigned)d->overlap > PT_OVERLAP_OFF)
        return pt__fail(PT_ERR_INVALID_ARG, "step: overlap=%d is not PT_OVERLAP_DEFAULT, _ON or _OFF",
                        (int)d->overlap);
    if (tbw && !d->adamw)
        return pt__fail(PT_ERR_INVALID_ARG, "schedule 2bw updates the weights inside the step "
                        "(every %d micro-batches): pt_step_desc.adamw must be set", pl->pp);
    /* (Chimera's replicas sum their gradients before the dp reduction, 2BW reduces
       at each of its updates: no overlap) */
    x->coll.ag_on = d->overlap != PT_OVERLAP_OFF && pl->dp > 1 && pl->schedule != PT_SCHED_CHIMERA &&
               !tbw;
    x->coll.ov_on = x->coll.ag_on && !pt__grads_staged(pl); /* (ZeRO 2 reduces inside backward
                                                                either way) */
    /* the last update's gathers under way: kept for this forward, or all now */
    x->coll.poll_st = PT_OK;
    if (!x->coll.ag_on && (st = pt__ag_settle(m)) != PT_OK) return st;
    x->wv.ver = 0; /* a step starts from one version (the pipeline is flushed between steps) */
    x->coll.ov_last = 0;
    memset(x->coll.ov_req, 0, (size_t)x->coll.num_buckets * sizeof *x->coll.ov_req);
    memset(x->coll.ov_done, 0, (size_t)pl->chunks * sizeof *x->coll.ov_done);
    pt__zero_grad(m);
    if ((st = pt__wte_mask_start(m, d)) != PT_OK) return st;
    for (k = 0; k < x->pipe.nslots; k++) x->pipe.slots[k].micro = x->pipe.slots[k].chunk = -1;
    x->pipe.slots_used = m->mem.slots_peak = 0;
    if (pl->schedule == PT_SCHED_CHIMERA && pl->has_head) { /* each head computes its
                                                               replica's rows, the other's stay 0 */
        if (d->logits) memset(d->logits, 0, NV * (size_t)pl->micro * sizeof(float));
        if (d->losses) memset(d->losses, 0, N * (size_t)pl->micro * sizeof(float));
    }
    if ((st = pt__trace_begin(x, d->trace)) != PT_OK) return st;
    /* pipeline messages: each stage's first activation and gradient receives posted now */
    x->pipe.pp_on = pl->pp > 1 && d->overlap != PT_OVERLAP_OFF;
    N = N * (size_t)m->config.n_embd / (size_t)(pl->sp ? pl->tp : 1); /* a message's floats */
    if (x->pipe.pp_on && ((st = pt__pp_post(m, 0, -1, N)) != PT_OK ||
                          (st = pt__pp_post(m, 1, -1, N)) != PT_OK))
        return st;
    return PT_OK;
}

static pt_status pt__gpt_step(pt_gpt *m, const pt_step_desc *d, pt_step_result *res) {
    pt_gpt_exec *x = m->exec;
    const pt_gpt_place *pl = &m->place;
    const pt_schedule *s = &x->pipe.sched;
    int stage = pl->pp_rank, k;
    int swap = pl->schedule == PT_SCHED_CHIMERA && pl->has_head; /* stages 0 and p-1 */
    int tbw = pl->schedule == PT_SCHED_2BW;
    pt__step_run r;
    pt_step_result local;
    pt_status st;
    if (!res) res = &local;
    memset(res, 0, sizeof *res);
    if (!m->grads || !s->count)
        return pt__fail(PT_ERR_INVALID_ARG, "model was built for inference: no gradients");
    if ((st = pt__step_batch(m, d)) != PT_OK) return st;
    memset(&r, 0, sizeof r);
    r.d = d, r.res = res;
    r.b = d->B / pl->micro;
    r.N = (size_t)r.b * (size_t)d->T;
    r.NV = r.N * (size_t)m->config.vocab_size;
    /* the mean loss of the micro-batches one update sees: the step's (2BW: its p) */
    r.dloss = 1.0f / ((float)r.N * (tbw ? pl->pp : pl->micro));
    x->cur_B = r.b, x->cur_T = d->T;
    x->has_targets = 0;
    if ((st = pt__step_begin(m, d, r.N, r.NV)) != PT_OK) return st;
    for (k = 0; k < s->count[stage] && st == PT_OK; k++) {
        const pt_action *a = &s->list[stage][k];
        double ta = d->trace ? pt_time_now() : 0.0;
        /* 2BW: F and B run at their batch's version, the newest or the one before */
        int old = tbw && (a->kind == PT_ACT_F || a->kind == PT_ACT_B) && a->version != x->wv.ver;
        x->act = k;
        if (old && a->version != x->wv.ver - 1)
            return pt__fail(PT_ERR_INVALID_ARG, "pipeline stage %d: micro-batch %d needs weight "
                            "version %d, but the stage holds %d and %d", stage, a->micro,
                            a->version, x->wv.ver - 1, x->wv.ver);
        if (old) pt__swap_weights(m);
        st = pt__step_action(m, &r, k);
        if (old) pt__swap_weights(m);
        if (d->trace && st == PT_OK)
            st = pt_trace_add(d->trace, x->trace_track, a->kind, a->micro, a->chunk, k,
                              ta - x->trace_t0, pt_time_now() - ta);
    }
    if (swap && d->logits && st == PT_OK) /* x + 0 = x: the sum is a copy */
        st = pt_comm_all_reduce(x->tie_comm, d->logits, r.NV * (size_t)pl->micro, PT_REDUCE_SUM);
    if (swap && d->losses && st == PT_OK)
        st = pt_comm_all_reduce(x->tie_comm, d->losses, r.N * (size_t)pl->micro, PT_REDUCE_SUM);
    x->micro_done = pl->micro; /* the gradients are whole: adamw_step may run */
    x->coll.ov_on = 0, x->act = -1;
    res->loss = m->loss;
    return st;
}

static pt_status pt__gpt_eval(pt_gpt *m, const pt_step_desc *d, float *loss) {
    pt_gpt_exec *x = m->exec;
    const pt_gpt_place *pl = &m->place;
    int p = pl->pp, V = pt__sched_blocks(pl->schedule, p, pl->chunks), i, c, b;
    size_t N, NC, C = (size_t)m->config.n_embd;
    float sum = 0.0f, one = 0.0f;
    pt__slot *sl = &x->pipe.slots[0];
    pt_schedule path; /* a micro-batch's path needs the kind and the sizes alone */
    pt_status st;
    memset(&path, 0, sizeof path);
    path.kind = pl->schedule, path.stages = p, path.chunks = pl->chunks;
    if ((st = pt__step_batch(m, d)) != PT_OK) return st;
    b = d->B / pl->micro;
    N = (size_t)b * (size_t)d->T;
    NC = N * C / (size_t)(pl->sp ? pl->tp : 1); /* the residual stream's floats here */
    x->has_targets = 0;
    /* virtual stage k waits only for k-1: in this order nothing cycles */
    for (i = 0; i < pl->micro && st == PT_OK; i++)
        for (c = 0; c < pl->chunks && st == PT_OK; c++) {
            int vs = pt__sched_vs(&path, pl->pp_rank, c), pc;
            int prev = vs > 0 ? pt__sched_at(&path, i, vs - 1) : -1;
            int next = vs < V - 1 ? pt__sched_at(&path, i, vs + 1) : -1;
            if (pt__sched_chunk_at(&path, i, vs) != c) continue; /* Chimera: the other replica's */
            memcpy(sl->inputs, d->inputs + (size_t)i * N, N * sizeof(int));
            memcpy(sl->targets, d->targets + (size_t)i * N, N * sizeof(int));
            if (prev == pl->pp_rank) { /* ZB-V's turn: the previous chunk's output, still here */
                pc = pt__sched_chunk_at(&path, i, vs - 1);
                memcpy(sl->x, sl->acts[x->pipe.chunk_hi[pc] - x->pipe.chunk_lo[pc] - 1].out,
                       NC * sizeof(float));
            } else if (vs > 0) {
                st = pt_comm_recv(x->pp_comm, sl->x, NC, prev, (i * V + vs - 1) * 2);
            }
            if (st == PT_OK) st = pt__chunk_forward(m, sl, c, b, d->T, 1, &one);
            if (st == PT_OK && vs == V - 1) {
                sum += one;
                if (d->losses) memcpy(d->losses + (size_t)i * N, sl->losses, N * sizeof(float));
                if (d->logits)
                    st = pt__head_logits(m, sl, N,
                                         d->logits + (size_t)i * N * (size_t)m->config.vocab_size);
            }
            if (st == PT_OK && vs < V - 1 && next != pl->pp_rank)
                st = pt_comm_send(x->pp_comm, sl->acts[x->pipe.chunk_hi[c] - x->pipe.chunk_lo[c] - 1].out,
                                  NC, next, (i * V + vs) * 2);
        }
    *loss = pl->has_head ? sum / (float)pl->micro : 0.0f;
    if (st == PT_OK && p > 1) st = pt_comm_all_reduce(x->pp_comm, loss, 1, PT_REDUCE_SUM);
    if (st == PT_OK && pl->dp > 1) st = pt_comm_all_reduce(x->dp_comm, loss, 1, PT_REDUCE_AVG);
    return st;
}

/* ---- the serial building blocks --------------------------------------------- */

static pt_status pt__gpt_forward(pt_gpt *m, const int *inputs, const int *targets, int B,
                                int T) {
    pt_gpt_exec *x = m->exec;
    const pt_gpt_config *c = &m->config;
    pt__slot *sl;
    int V = c->vocab_size, N = B * T;
    pt_status st;
    if (!m->params) return pt__fail(PT_ERR_INVALID_ARG, "model has no memory (built with meta=1)");
    if (m->place.pp > 1)
        return pt__fail(PT_ERR_INVALID_ARG, "a pipeline stage runs whole steps: "
                        "pt_gpt_step, not pt_gpt_forward");
    if (B < 1 || B > m->B || T < 1 || T > m->T)
        return pt__fail(PT_ERR_CONFIG,
                        "batch %dx%d does not fit the model's capacity B=%d, T=%d "
                        "(block_size=%d)",
                        B, T, m->B, m->T, c->block_size);
    if (m->place.sp && T % m->place.tp != 0)
        return pt__fail(PT_ERR_CONFIG, "sequence_parallel: T=%d is not a multiple of tp=%d", T,
                        m->place.tp);
    if ((st = pt__check_tokens(inputs, (size_t)N, V, "inputs")) != PT_OK) return st;
    if (targets && (st = pt__check_tokens(targets, (size_t)N, V, "targets")) != PT_OK) return st;
    sl = &x->pipe.slots[0];
    memcpy(sl->inputs, inputs, sizeof(int) * N);
    if (targets) memcpy(sl->targets, targets, sizeof(int) * N);
    x->cur_B = B;
    x->cur_T = T;
    x->has_targets = 0;
    m->loss = -1.0f;
    if ((st = pt__chunk_forward(m, sl, 0, B, T, targets != NULL, &m->loss)) != PT_OK) return st;
    if (targets) {
        if (m->place.dp > 1 &&
            (st = pt_comm_all_reduce(x->dp_comm, &m->loss, 1, PT_REDUCE_AVG)) != PT_OK)
            return st;
        x->has_targets = 1;
    }
    return PT_OK;
}

static pt_status pt__gpt_backward(pt_gpt *m) {
    pt_gpt_exec *x = m->exec;
    int accum = m->place.micro;
    pt_status st;
    if (!m->grads)
        return pt__fail(PT_ERR_INVALID_ARG, "model was built for inference: no gradients");
    if (m->place.pp > 1)
        return pt__fail(PT_ERR_INVALID_ARG, "a pipeline stage runs whole steps: "
                        "pt_gpt_step, not pt_gpt_backward");
    if (!x->has_targets)
        return pt__fail(PT_ERR_INVALID_ARG,
                        "backward needs a forward with targets first (and runs once per forward)");
    x->has_targets = 0;
    if (x->micro_done >= accum) x->micro_done = 0; /* a new step */
    if (x->micro_done == 0) pt__zero_grad(m);
    st = pt__chunk_backward(m, &x->pipe.slots[0], 0, x->cur_B, x->cur_T,
                            1.0f / ((float)x->cur_B * x->cur_T * accum), 0);
    if (st != PT_OK) return st;
    if (++x->micro_done == accum && !pt__grads_staged(&m->place)) return pt__dp_sync_grads(m);
    return PT_OK;
}

/* The public calls pass the model's context down to its kernels, its poller
   set for the call's duration: the GEMMs of the calling thread test the
   communication under way (pt__ov_poll), and with a dp group compute in
   slices of rows. */
static void pt__gpt_poll_on(pt_gpt *m) {
    m->ctx.poll.fn = pt__ov_poll, m->ctx.poll.arg = m, m->ctx.poll.next = 0.0;
    m->ctx.poll.slice = m->place.dp > 1 ? PT__SLICE_FLOP : 0.0;
}

static pt_status pt__gpt_poll_off(pt_gpt *m, pt_status st) {
    memset(&m->ctx.poll, 0, sizeof m->ctx.poll);
    return st;
}

/* Context parallelism: B rows of T tokens (whole sequences) -> this rank's
   share, B rows of T/cp (chunks c and 2cp-1-c of T/(2cp)) into inputs and
   targets; with cp 1 the rows themselves. Refuses a T that does not split,
   or a batch larger than the buffers. */
static pt_status pt__cp_take(pt_gpt *m, const int **inputs, const int **targets, int B, int *T) {
    const pt_gpt_place *pl = &m->place;
    pt_gpt_exec *x = m->exec;
    int K = pl->cp, Tl, b, j, pos[2];
    if (K == 1) return PT_OK;
    if (!m->params || !x || !x->cp_in)
        return pt__fail(PT_ERR_INVALID_ARG, "model has no memory (built with meta=1)");
    if (!*inputs) return pt__fail(PT_ERR_INVALID_ARG, "a step needs inputs and targets");
    if (*T < 1 || *T % (2 * K) != 0)
        return pt__fail(PT_ERR_CONFIG, "context_parallel=%d: T=%d is not a multiple of 2*cp=%d "
                        "(each rank holds two chunks of T/(2cp) tokens)", K, *T, 2 * K);
    Tl = *T / K;
    if (B < 1 || Tl > m->T || B > m->B * pl->micro)
        return pt__fail(PT_ERR_CONFIG, "batch %dx%d does not fit the model's capacity of %d "
                        "micro-batch%s of %dx%d (context_parallel=%d: %d tokens a rank)", B, *T,
                        pl->micro, pl->micro > 1 ? "es" : "", m->B, m->T * K, K, m->T);
    pos[0] = pl->cp_rank * (Tl / 2), pos[1] = (2 * K - 1 - pl->cp_rank) * (Tl / 2);
    for (b = 0; b < B; b++)
        for (j = 0; j < 2; j++) {
            size_t from = (size_t)b * *T + pos[j], to = (size_t)b * Tl + (size_t)j * (Tl / 2);
            memcpy(x->cp_in + to, *inputs + from, (size_t)(Tl / 2) * sizeof(int));
            if (*targets) memcpy(x->cp_tg + to, *targets + from, (size_t)(Tl / 2) * sizeof(int));
        }
    *inputs = x->cp_in, *targets = *targets ? x->cp_tg : NULL, *T = Tl;
    return PT_OK;
}

/* A step desc with this rank's share of the tokens (pt__cp_take). */
static pt_status pt__cp_desc(pt_gpt *m, const pt_step_desc *d, pt_step_desc *ld) {
    *ld = *d;
    if (m->place.cp == 1) return PT_OK;
    if (d->logits || d->losses)
        return pt__fail(PT_ERR_CONFIG, "context_parallel=%d: a step's logits and losses per "
                        "token are not supported yet (each rank holds T/cp of the tokens)",
                        m->place.cp);
    if (!d->targets) return pt__fail(PT_ERR_INVALID_ARG, "a step needs inputs and targets");
    return pt__cp_take(m, &ld->inputs, &ld->targets, d->B, &ld->T);
}

/* (the step's trace is the caller's: a transfer found done later goes in none) */
static pt_status pt__gpt_step_traced(pt_gpt *m, const pt_step_desc *d, pt_step_result *res) {
    pt_step_desc ld;
    pt_status st = pt__cp_desc(m, d, &ld);
    if (st == PT_OK) st = pt__gpt_step(m, &ld, res);
    if (m->exec) m->exec->trace = NULL;
    return st;
}

static pt_status pt__gpt_eval_cp(pt_gpt *m, const pt_step_desc *d, float *loss) {
    pt_step_desc ld;
    pt_status st = pt__cp_desc(m, d, &ld);
    return st != PT_OK ? st : pt__gpt_eval(m, &ld, loss);
}

static pt_status pt__gpt_forward_cp(pt_gpt *m, const int *inputs, const int *targets, int B,
                                    int T) {
    pt_status st = PT_OK;
    if (m->place.cp > 1 && B > m->B)
        return pt__fail(PT_ERR_CONFIG, "batch %dx%d does not fit the model's capacity B=%d, "
                        "T=%d (context_parallel=%d)", B, T, m->B, m->T * m->place.cp, m->place.cp);
    if (m->place.cp > 1 && inputs) st = pt__cp_take(m, &inputs, &targets, B, &T);
    return st != PT_OK ? st : pt__gpt_forward(m, inputs, targets, B, T);
}

PTRAINDEF pt_status pt_gpt_step(pt_gpt *m, const pt_step_desc *d, pt_step_result *res) {
    pt__gpt_poll_on(m);
    return pt__gpt_poll_off(m, pt__gpt_step_traced(m, d, res));
}

PTRAINDEF pt_status pt_gpt_eval(pt_gpt *m, const pt_step_desc *d, float *loss) {
    pt__gpt_poll_on(m);
    return pt__gpt_poll_off(m, pt__gpt_eval_cp(m, d, loss));
}

PTRAINDEF pt_status pt_gpt_forward(pt_gpt *m, const int *inputs, const int *targets, int B,
                                   int T) {
    pt__gpt_poll_on(m);
    return pt__gpt_poll_off(m, pt__gpt_forward_cp(m, inputs, targets, B, T));
}

PTRAINDEF pt_status pt_gpt_backward(pt_gpt *m) {
    pt__gpt_poll_on(m);
    return pt__gpt_poll_off(m, pt__gpt_backward(m));
}

PTRAINDEF pt_status pt_gpt_sync_params(pt_gpt *m) { return pt__ag_settle(m); }

PTRAINDEF pt_status pt_gpt_gather_logits(const pt_gpt *m, float *out) {
    const pt_gpt_exec *x = m->exec;
    if (m->place.pp > 1 || (!x->pipe.slots[0].logits && !x->head_work))
        return pt__fail(PT_ERR_INVALID_ARG, "pt_gpt_gather_logits reads pt_gpt_forward's logits "
                        "(a pipeline step gives them through pt_step_desc.logits)");
    if (m->place.cp > 1)
        return pt__fail(PT_ERR_CONFIG, "pt_gpt_gather_logits with context_parallel=%d is not "
                        "supported yet (each rank holds T/cp of the tokens)", m->place.cp);
    return pt__head_logits(m, &x->pipe.slots[0], (size_t)x->cur_B * x->cur_T, out);
}

/* ---- gradients and the optimizer ------------------------------------------- */

/* The part of tensor i (in bucket b) inside this rank's shard of b, as flat
   offsets [*lo, *hi); 0 if none. */
static int pt__shard_span(const pt_gpt *m, int b, int i, size_t *lo, size_t *hi) {
    return pt__shard_range(m, b, m->table[i].offset, m->table[i].numel, lo, hi);
}

/* This rank's optimizer-ready gradient of table tensor i within bucket b:
   the whole tensor (once: in the bucket it starts in), or under ZeRO its
   part of this rank's shard of b. 0 if there is none. */
static int pt__grad_span(const pt_gpt *m, int b, int i, float **src, size_t *len) {
    const pt_gpt_exec *x = m->exec;
    const pt_param *p = &m->table[i];
    const pt__bucket *k = &x->coll.buckets[b];
    size_t lo = p->offset, hi = p->offset + p->numel;
    if (!m->place.zero) {
        *src = m->grads + lo;
        *len = hi - lo;
        return p->bucket == b;
    }
    if (!pt__shard_span(m, b, i, &lo, &hi)) return 0;
    *src = x->coll.gshard + k->shard_offset + (lo - k->offset - (size_t)m->place.dp_rank * k->shard);
    *len = hi - lo;
    return 1;
}

PTRAINDEF float *pt_gpt_grad_of(pt_gpt *m, const char *name, size_t *n) {
    const pt_param *p = pt_gpt_find_param(m, name);
    float *src;
    int b;
    *n = 0;
    if (!p || !m->grads) return NULL;
    for (b = 0; b < m->exec->coll.num_buckets; b++)
        if (pt__grad_span(m, b, (int)(p - m->table), &src, n)) return src;
    return NULL;
}

PTRAINDEF pt_status pt_gpt_check_step(pt_gpt *m, float loss, float norm, int *bad, char *where,
                                      size_t n) {
    pt_gpt_exec *x = m->exec;
    pt_comm *world = x->grid ? x->grid->world : NULL;
    float flag = isfinite(loss) && isfinite(norm) ? 0.0f : 1.0f, first = 0.0f;
    pt_status st;
    int b, i;
    *bad = 0;
    if (where && n) where[0] = 0;
    if (world && (st = pt_comm_all_reduce(world, &flag, 1, PT_REDUCE_MAX)) != PT_OK) return st;
    if (flag == 0.0f) return PT_OK;
    *bad = 1;
    /* first = 1 + the highest canonical index with a non-finite value here
       (backward computes the tensors from the last to the first), then the
       highest over the ranks; canonical indices are far below 2^24 */
    for (b = 0; m->grads && b < x->coll.num_buckets; b++)
        for (i = x->coll.buckets[b].first; i < x->coll.buckets[b].first + x->coll.buckets[b].count; i++) {
            float *src;
            size_t len, j;
            if ((float)(m->table[i].canon + 1) <= first || !pt__grad_span(m, b, i, &src, &len))
                continue;
            for (j = 0; j < len && isfinite(src[j]); j++) {
            }
            if (j < len) first = (float)(m->table[i].canon + 1);
        }
    if (world && (st = pt_comm_all_reduce(world, &first, 1, PT_REDUCE_MAX)) != PT_OK) return st;
    if (where && n) {
        if (first > 0.0f) pt__canon_name(&m->config, (int)first - 1, where, n);
        else snprintf(where, n, "no gradient");
    }
    return PT_OK;
}

PTRAINDEF pt_status pt_gpt_clip_grad_norm(pt_gpt *m, float max_norm, float *norm_out) {
    pt_gpt_exec *x = m->exec;
    const pt_gpt_place *pl = &m->place;
    double norm;
    float *g = pl->zero ? x->coll.gshard : m->grads;
    size_t n = pl->zero ? x->coll.shard_total : m->num_params;
    pt_status st = PT_OK;
    *norm_out = 0.0f;
    if (!m->grads)
        return pt__fail(PT_ERR_INVALID_ARG, "model was built for inference: no gradients");
    if (pl->tp == 1 && !pl->zero && pl->pp == 1) {
        norm = pt_norm2(m->grads, m->num_params);
    } else { /* sum of squares of what this rank owns: split tensors' parts and
                its dp shard; tensors replicated over tp count on tp rank 0, those
                on two pipeline stages on one (pt__counts_here) */
        double part = 0.0;
        float sq;
        int b, i;
        for (b = 0; b < x->coll.num_buckets; b++)
            for (i = x->coll.buckets[b].first; i < x->coll.buckets[b].first + x->coll.buckets[b].count; i++) {
                const pt_param *p = &m->table[i];
                float *src;
                size_t len;
                double v;
                if (p->shard == PT_SHARD_NONE && pl->tp_rank != 0) continue;
                if (!pt__counts_here(m, i)) continue;
                if (!pt__grad_span(m, b, i, &src, &len)) continue;
                v = pt_norm2(src, len);
                part += v * v;
            }
        sq = (float)part;
        if (pl->tp > 1) st = pt_comm_all_reduce(x->tp_comm, &sq, 1, PT_REDUCE_SUM);
        if (st == PT_OK && pl->zero && pl->dp > 1)
            st = pt_comm_all_reduce(x->dp_comm, &sq, 1, PT_REDUCE_SUM);
        if (st == PT_OK && pl->pp > 1) st = pt_comm_all_reduce(x->pp_comm, &sq, 1, PT_REDUCE_SUM);
        if (st != PT_OK) return st;
        norm = sqrt((double)sq);
    }
    if (max_norm > 0.0f && norm > max_norm) pt_scale(g, n, (float)(max_norm / norm));
    *norm_out = (float)norm;
    return PT_OK;
}

PTRAINDEF pt_status pt_gpt_adamw_step(pt_gpt *m, const pt_adamw_config *cfg, float lr) {
    pt_gpt_exec *x = m->exec;
    const pt_gpt_place *pl = &m->place;
    pt_status st;
    int i, b;
    if (!m->m)
        return pt__fail(PT_ERR_INVALID_ARG, "model was built for inference: no optimizer state");
    if (pl->schedule == PT_SCHED_2BW && !x->wv.in_opt)
        return pt__fail(PT_ERR_INVALID_ARG, "schedule 2bw updates the weights inside pt_gpt_step "
                        "(pt_step_desc.adamw), not through pt_gpt_adamw_step");
    if (x->micro_done > 0 && x->micro_done < pl->micro)
        return pt__fail(PT_ERR_INVALID_ARG, "adamw_step needs the gradients of all %d "
                        "micro-batches of the step (backward ran %d times)", pl->micro,
                        x->micro_done);
    if ((st = pt__ag_settle(m)) != PT_OK || (st = pt__z3_drop(m, -1)) != PT_OK) return st;
    x->coll.ag_next = x->coll.ag_end = 0;
    m->adam_t++;
    if (!pl->zero) {
        for (i = 0; i < m->num_tensors; i++) {
            const pt_param *p = &m->table[i];
            pt_adamw_update(m->params + p->offset, m->grads + p->offset, m->m + p->offset,
                            m->v + p->offset, p->numel, cfg, lr, m->adam_t, p->decay);
        }
        return PT_OK;
    }
    /* ZeRO: update this rank's shard of each bucket, then gather the bucket
       (in place: this rank's shard is already there); with overlap, the
       gathers run on behind the next forward, in its order (pt__ag_need) */
    for (b = 0; b < x->coll.num_buckets; b++) {
        const pt__bucket *k = &x->coll.buckets[b];
        size_t own = k->offset + (size_t)pl->dp_rank * k->shard, lo, hi;
        for (i = k->first; i < k->first + k->count; i++) {
            size_t at;
            if (!pt__shard_span(m, b, i, &lo, &hi)) continue;
            at = k->shard_offset + (lo - own);
            pt_adamw_update(pl->zero == 3 ? x->coll.pshard + at : m->params + lo, x->coll.gshard + at,
                            m->m + at, m->v + at, hi - lo, cfg, lr, m->adam_t, m->table[i].decay);
        }
        if (pl->dp == 1 || pl->zero == 3) continue; /* (ZeRO 3 gathers before each use) */
        if (x->coll.ag_on) {
            x->coll.ag_end = b + 1;
            st = pt__ag_pump(m);
            pt__ag_fold(x);
        } else {
            double t = pt_time_now();
            st = pt_comm_all_gather(x->dp_comm, m->params + own, m->params + k->offset, k->shard);
            if (st == PT_OK) pt__trace_dp(x, PT_TRACE_DP_GATHER, b, t, x->act);
        }
        if (st != PT_OK) return st;
    }
    return PT_OK;
}

/* ======================================================================== */
/* >>sim (implementation)                                                    */
/* ======================================================================== */

/* Profiles. Peaks and memory are the vendors' data sheets; links are what
   collective benchmarks reach on those nodes (bus bandwidth: a ring moves
   2(n-1)/n of the buffer through each device at this rate). GEMM
   efficiency is a function of the shape: eff x the product over M, N, K of
   d/(d + gemm_dim) (pt_hw_gemm_seconds), eff what large GEMMs sustain inside
   a training step (below the vendors' best single-GEMM figures: clocks
   under load) and gemm_dim the dimension at which tiling loses half.
   The last four fields are flash_eff (a fused causal attention's forward +
   backward at head size 128, counting the FLOPs it does), tp_exposed,
   grad_bytes and comm_sm (pt_hw): NCCL runs a large collective on up to 32
   channels (its NCCL_MAX_NCHANNELS), a thread block on an SM each: 32 of the
   A100's 108 SMs (0.30), of the H100's 132 (0.24); RCCL alike on an MI250X
   GCD's 110 CUs (0.29) and the MI300X's 304 (0.105). */
static const pt_hw pt__hw_presets[] = {
    /* NVIDIA A100 SXM4 80GB in a DGX A100 (Selene, Megatron-LM 2021): 312 TFLOP/s
       fp16/bf16 dense (A100 datasheet), HBM2e 2039 GB/s, 80 GB; NVLink 3 through
       NVSwitch (300 GB/s a direction, NCCL all-reduce ~230 GB/s bus bandwidth in
       nccl-tests on DGX A100); 8 HDR InfiniBand 200 Gb/s adapters a node, one a
       GPU (25 GB/s). GEMMs: 0.75 of peak asymptotically (cuBLAS's best single
       GEMMs reach ~0.85, 271.2 TFLOP/s = 0.869 in Bekman's ml-engineering MAMF table;
       clocks drop under sustained tensor load): 0.863 of the best, the ratio the H100
       and MI300X profiles take from their own MAMF figures. Flash:
       FlashAttention-2 (Dao 2023, its A100 figures) reaches 180-225 TFLOP/s
       forward + backward at head size 128, causal 2k-16k tokens: 0.60. No tp
       overlap (Transformer Engine's userbuffers are Hopper's); gradients in the
       activations' 2 bytes (the 2021 runs' fp16). */
    {"a100-80g", 312e12, 0.75, 48.0, 0.0, 1.75e12, 85899345920.0, 4e-6, 8, 230e9, 8e-6, 22e9, 12e-6, 0,
     PT_EXEC_MEGATRON, 0, 0, 0, 0, 0, 0, 0, PT_PRECISION_DEFAULT, 0, 0.60, 0.0, 0.0, 0.30},
    /* NVIDIA H100 SXM5 80GB in a DGX H100: 989 TFLOP/s dense bf16, HBM3 3.35 TB/s
       (H100 datasheet; a device-to-device copy measures 3.0-3.1 TB/s); NVLink 4
       900 GB/s both directions (450 a direction, nccl-tests all-reduce ~360 GB/s
       bus bandwidth on 8 GPUs); 8 ConnectX-7 400 Gb/s adapters a node (50 GB/s a
       GPU; ~45 GB/s in NCCL's inter-node all-reduce). GEMMs: cuBLAS bf16 on
       large training shapes sustains 700-750 TFLOP/s at the clocks a loaded SXM
       holds (SemiAnalysis' H100/H200/MI300X training benchmark, 2024: ~720 on
       Llama shapes; single GEMMs' best 794.5, 0.803 of peak: the MAMF table); inside a
       step, with the A100's ratio of in-step to best (0.863): 0.69, 0.70 asymptotically,
       Hopper's 128x256 tiles losing half at 64. Flash: FlashAttention-2, the kernel
       2024's runs had (PyTorch's SDPA, Llama 3), reaches at most 35% of the H100's peak
       (Shah et al. 2024, FlashAttention-3's abstract; its backward runs slower still):
       0.35 forward + backward. FlashAttention-3 and cuDNN's fused attention reach
       600-740 TFLOP/s forward (0.55 forward + backward): a profile file with flash_eff
       = 0.55 plans with them. tp overlap:
       Transformer Engine's userbuffers (Megatron's --tp-comm-overlap) split each
       all-gather/reduce-scatter in tp chunks pipelined against its GEMM; the
       first or last chunk and the SMs the copies take stay exposed: 1/tp of it
       at tp 8 plus contention, 0.2 (judgement, not a published figure). Gradients:
       Megatron-LM forces fp32 accumulation and reduction with bf16
       (--accumulate-allreduce-grads-in-fp32): 4 bytes. */
    {"h100-80g", 989e12, 0.70, 64.0, 0.0, 3.0e12, 85899345920.0, 3e-6, 8, 360e9, 8e-6, 45e9, 12e-6, 0,
     PT_EXEC_MEGATRON, 0, 0, 0, 0, 0, 0, 0, PT_PRECISION_DEFAULT, 0, 0.35, 0.2, 4.0, 0.24},
    /* NVIDIA H200 SXM 141GB (H200 datasheet: the H100's 989 TFLOP/s bf16 and NVLink
       4, HBM3e 141 GB at 4.8 TB/s; ~4.3 sustained, the H100's 0.9 of it); the
       rest as h100-80g (same SXM5 board, DGX H200: 8 x 400 Gb/s a node). */
    {"h200", 989e12, 0.70, 64.0, 0.0, 4.3e12, 141e9, 3e-6, 8, 360e9, 8e-6, 45e9, 12e-6, 0,
     PT_EXEC_MEGATRON, 0, 0, 0, 0, 0, 0, 0, PT_PRECISION_DEFAULT, 0, 0.35, 0.2, 4.0, 0.24},
    /* AMD MI250X on Frontier, one graphics compute die (GCD) a device: 191.5
       TFLOP/s fp16 (the issue's and AMD's figure), HBM2e 1.6 TB/s and 64 GB a
       GCD; 8 GCDs a node joined by Infinity Fabric (50-200 GB/s between pairs:
       a ring over the node runs at its slowest, single 50 GB/s links); 4
       Slingshot-11 NICs of 25 GB/s a node (12.5 GB/s a GCD). rocBLAS reaches
       about half of the fp16 peak on large GEMMs, a smaller share than cuBLAS.
       Flash: ROCm's FlashAttention-2 port, ~0.35 of peak (judgement). */
    {"mi250x", 191.5e12, 0.55, 64.0, 0.0, 1.3e12, 68719476736.0, 6e-6, 8, 50e9, 10e-6, 11.5e9, 15e-6, 0,
     PT_EXEC_MEGATRON, 0, 0, 0, 0, 0, 0, 0, PT_PRECISION_DEFAULT, 0, 0.35, 0.0, 0.0, 0.29},
    /* AMD MI300X (CDNA 3 datasheet): 1307 TFLOP/s dense bf16, HBM3 192 GB at 5.3
       TB/s (~4.3 sustained in published stream tests); 8 a node, each joined to
       the other 7 by 64 GB/s Infinity Fabric links a direction (448 GB/s; RCCL's
       all-reduce reaches ~300 GB/s bus bandwidth); 8 x 400 Gb/s NICs a node.
       GEMMs: hipBLASLt bf16 sustains ~600-650 TFLOP/s on training shapes
       (SemiAnalysis 2024); the MAMF table's best, 668.4 of 1300 (0.514, ROCm 6.3,
       TunableOp), times the A100's in-step ratio 0.863: 0.44 (0.50 before, a single
       GEMM's rate where the other profiles take the in-step one). Flash: CK's
       FlashAttention-2 forward + backward ~0.30 of peak. No tp overlap; fp32
       gradients as Megatron's bf16. */
    {"mi300x", 1307e12, 0.44, 64.0, 0.0, 4.3e12, 192e9, 4e-6, 8, 300e9, 10e-6, 45e9, 12e-6, 0,
     PT_EXEC_MEGATRON, 0, 0, 0, 0, 0, 0, 0, PT_PRECISION_DEFAULT, 0, 0.30, 0.0, 4.0, 0.105},
};

PTRAINDEF const char *pt_hw_preset_names(void) {
    return "a100-80g, h100-80g, h200, mi250x, mi300x";
}

PTRAINDEF pt_status pt_hw_preset(const char *name, pt_hw *out) {
    size_t i;
    for (i = 0; i < sizeof pt__hw_presets / sizeof *pt__hw_presets; i++)
        if (name && strcmp(name, pt__hw_presets[i].name) == 0) {
            *out = pt__hw_presets[i];
            return PT_OK;
        }
    return pt__fail(PT_ERR_CONFIG, "unknown hardware '%s' (known: %s, local)",
                    name ? name : "(null)", pt_hw_preset_names());
}

/* The profile's numeric fields, for the key = value file. */
#define PT__HW_FIELDS(X)                                                                      \
    X(peak_flops) X(gemm_eff) X(gemm_dim) X(attn_flops) X(mem_bw) X(mem_bytes) X(kernel_s)    \
    X(intra_bw) X(intra_lat) X(inter_bw) X(inter_lat)
#define PT__HW_CORE_FIELDS(X) /* optional */                                                  \
    X(core_flops) X(core_gemm_eff) X(core_gemm_dim) X(core_attn_flops) X(core_mem_bw)          \
    X(core_kernel_s) X(instr_flops) X(comm_cpu)
#define PT__HW_NEW_FIELDS(X) /* optional: today's recipe (0: as before) */                    \
    X(flash_eff) X(tp_exposed) X(grad_bytes) X(comm_sm)

PTRAINDEF pt_status pt_hw_save(const pt_hw *hw, const char *path) {
    char buf[2048];
    size_t len = 0;
    const void *parts[1];
    size_t lens[1];
    len += (size_t)snprintf(buf + len, sizeof buf - len, "# ptrain hardware profile\n");
    if (hw->name[0]) /* "name = " alone would not load (a file without a name does) */
        len += (size_t)snprintf(buf + len, sizeof buf - len, "name = %s\n", hw->name);
#define PT__PUT(f) len += (size_t)snprintf(buf + len, sizeof buf - len, #f " = %.6g\n", hw->f);
    PT__HW_FIELDS(PT__PUT)
    if (hw->core_flops > 0) PT__HW_CORE_FIELDS(PT__PUT)
    PT__HW_NEW_FIELDS(PT__PUT)
#undef PT__PUT
    len += (size_t)snprintf(buf + len, sizeof buf - len, "per_node = %d\ncores = %d\nexec = %s\n",
                            hw->per_node, hw->cores,
                            hw->exec == PT_EXEC_PTRAIN ? "ptrain" : "megatron");
    if (hw->precision != PT_PRECISION_DEFAULT)
        len += (size_t)snprintf(buf + len, sizeof buf - len, "precision = %s\n",
                                pt_precision_name(hw->precision));
    parts[0] = buf;
    lens[0] = len;
    return pt__write_file(path, parts, lens, 1, NULL);
}

PTRAINDEF pt_status pt_hw_load(const char *path, pt_hw *out) {
    FILE *f = fopen(path, "r");
    char line[256];
    int lineno = 0, seen = 0, want = 0;
    pt_hw hw;
    memset(&hw, 0, sizeof hw);
    if (!f) return pt__fail_path(PT_ERR_IO, path);
#define PT__COUNT(f) want++;
    PT__HW_FIELDS(PT__COUNT)
#undef PT__COUNT
    while (fgets(line, sizeof line, f)) {
        char key[64], val[128], *end;
        double x;
        lineno++;
        if (line[0] == '#' || line[strspn(line, " \t\r\n")] == 0) continue;
        if (sscanf(line, " %63[a-z_] = %127s", key, val) != 2) {
            fclose(f);
            return pt__fail(PT_ERR_FORMAT, "%s:%d: expected 'key = value'", path, lineno);
        }
        if (strcmp(key, "name") == 0) {
            snprintf(hw.name, sizeof hw.name, "%.31s", val);
            continue;
        }
        if (strcmp(key, "precision") == 0) {
            if (pt_precision_parse(val, &hw.precision) != PT_OK) {
                fclose(f);
                return pt__fail(PT_ERR_FORMAT, "%s:%d: precision '%s' is not fp32 or bf16", path,
                                lineno, val);
            }
            continue;
        }
        if (strcmp(key, "exec") == 0) {
            hw.exec = strcmp(val, "ptrain") == 0     ? PT_EXEC_PTRAIN
                      : strcmp(val, "megatron") == 0 ? PT_EXEC_MEGATRON
                                                     : PT_EXEC_DEFAULT;
            if (hw.exec == PT_EXEC_DEFAULT) {
                fclose(f);
                return pt__fail(PT_ERR_FORMAT, "%s:%d: exec '%s' is not ptrain or megatron", path,
                                lineno, val);
            }
            continue;
        }
        x = strtod(val, &end);
        if (*end || !(x >= 0.0) || x > 1e30) {
            fclose(f);
            return pt__fail(PT_ERR_FORMAT, "%s:%d: %s = '%s' is not a number >= 0", path, lineno,
                            key, val);
        }
        if ((strcmp(key, "per_node") == 0 || strcmp(key, "cores") == 0) &&
            (x > 1048576 || x != floor(x))) { /* before converting: (int)1e30 is undefined */
            fclose(f);
            return pt__fail(PT_ERR_FORMAT, "%s:%d: %s = '%s' is not an integer in [0, 1048576]",
                            path, lineno, key, val);
        }
        if (strcmp(key, "per_node") == 0) hw.per_node = (int)x;
        else if (strcmp(key, "cores") == 0) hw.cores = (int)x;
#define PT__GET(fl) else if (strcmp(key, #fl) == 0) hw.fl = x, seen++;
#define PT__OPT(fl) else if (strcmp(key, #fl) == 0) hw.fl = x;
        PT__HW_FIELDS(PT__GET)
        PT__HW_CORE_FIELDS(PT__OPT)
        PT__HW_NEW_FIELDS(PT__OPT)
#undef PT__GET
#undef PT__OPT
        else {
            fclose(f);
            return pt__fail(PT_ERR_FORMAT, "%s:%d: unknown key '%s'", path, lineno, key);
        }
    }
    fclose(f);
    if (seen != want || hw.peak_flops <= 0 || hw.gemm_eff <= 0 || hw.gemm_eff > 2 ||
        hw.mem_bw <= 0 || hw.intra_bw <= 0 || hw.per_node < 1)
        return pt__fail(PT_ERR_FORMAT, "%s: incomplete profile (every field of pt_hw, positive "
                        "peak, bandwidths and per_node, gemm_eff in (0, 2])", path);
    if (hw.inter_bw <= 0) hw.inter_bw = hw.intra_bw;
    if (!hw.exec) hw.exec = PT_EXEC_MEGATRON;
    *out = hw;
    return PT_OK;
}
#undef PT__HW_FIELDS
#undef PT__HW_CORE_FIELDS
#undef PT__HW_NEW_FIELDS

static int pt__cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* FLOP/s of C = A B (at ctx's precision) as a step runs it: once, after other kernels
   have moved other data through the caches; the median of reps calls (at most 63) */
static double pt__gemm_rate(pt_ctx *ctx, int M, int N, int K, int reps) {
    size_t i, n = (size_t)M * K + (size_t)K * N + (size_t)M * N, flush = (size_t)1 << 21;
    float *a = (float *)pt__malloc(sizeof(float) * (n + 2 * flush), NULL);
    double dt[63];
    int r;
    if (!a) return 0.0;
    if (reps > 63) reps = 63;
    for (i = 0; i < n + 2 * flush; i++) a[i] = (float)(i % 13) * 0.01f;
    for (r = -1; r < reps; r++) { /* r = -1 warms up */
        double t0;
        pt_residual_forward(a + n, a + n, a + n + flush, flush);
        t0 = pt_time_now();
        pt__mm(ctx, 0, 0, M, N, K, 1.0f, a, K, a + (size_t)M * K, N, 0.0f,
               a + (size_t)M * K + (size_t)K * N, N);
        if (r >= 0) dt[r] = pt_time_now() - t0;
    }
    pt__free(a, NULL);
    qsort(dt, (size_t)reps, sizeof(double), pt__cmp_dbl);
    return dt[reps / 2] > 0 ? 2.0 * M * N * (double)K / dt[reps / 2] : 0.0;
}

typedef struct pt__calib_comm { double lat, bw; } pt__calib_comm;

static pt_status pt__calib_comm_rank(pt_comm *w, void *arg) { /* ranks 0 and 1 of w */
    pt__calib_comm *c = (pt__calib_comm *)arg;
    size_t n = (size_t)1 << 22;
    float *buf = (float *)pt__malloc(n * sizeof(float), NULL);
    double t0, t1, t2;
    int i;
    pt_status st = PT_OK;
    if (!buf) return pt_comm_fail(w, pt__fail(PT_ERR_OOM, "calibration buffer"));
    memset(buf, 0, n * sizeof(float));
    st = pt_comm_all_reduce(w, buf, n, PT_REDUCE_SUM); /* warm-up */
    t0 = pt_time_now();
    for (i = 0; i < 200 && st == PT_OK; i++) st = pt_comm_all_reduce(w, buf, 1, PT_REDUCE_SUM);
    t1 = pt_time_now();
    for (i = 0; i < 8 && st == PT_OK; i++) st = pt_comm_all_reduce(w, buf, n, PT_REDUCE_SUM);
    t2 = pt_time_now();
    if (w->rank == 0) { /* a ring all-reduce (pt_hw_comm_seconds): 2(k-1) latencies, then
                           2(k-1)/k of the buffer at the bandwidth */
        double k = w->size;
        c->lat = (t1 - t0) / 200 / (2 * (k - 1));
        c->bw = 2 * (k - 1) / k * (double)n * sizeof(float) / ((t2 - t1) / 8 - 2 * (k - 1) * c->lat);
    }
    pt__free(buf, NULL);
    return st;
}

static pt_status pt__calib_kernels(pt_hw *out, pt_precision precision);

/* Ranks of one thread share the machine's caches and memory with each other:
   every core's rank times the kernels at once; rank 0's rates are the profile's */
static pt_status pt__calib_core_rank(pt_comm *w, void *arg) {
    pt_hw mine;
    pt_status st = pt__calib_kernels(&mine, ((pt_hw *)arg)->precision);
    if (st != PT_OK) return pt_comm_fail(w, st);
    if (w->rank == 0) *(pt_hw *)arg = mine;
    return pt_comm_barrier(w);
}

PTRAINDEF pt_status pt_hw_calibrate(pt_hw *out, pt_comm *world, pt_precision precision) {
    pt__calib_comm cc = {0, 0};
    pt_status st = PT_OK;
    int threads = pt_get_threads(), bf16 = precision == PT_PRECISION_BF16;
    memset(out, 0, sizeof *out);
    if ((int)precision < 0 || precision > PT_PRECISION_BF16)
        return pt__fail(PT_ERR_CONFIG, "precision=%d must be 0 (fp32), PT_PRECISION_FP32 or "
                        "PT_PRECISION_BF16", (int)precision);
    if (!world || world->size < 2) {
        if ((st = pt__calib_kernels(out, precision)) != PT_OK) return st;
        out->instr_flops = pt_instr_peak_gflops(bf16, 0.25) * 1e9;
        if (out->cores > 1) { /* and as a rank of one thread, beside one on every core */
            pt_hw one;
            memset(&one, 0, sizeof one);
            one.precision = precision;
            st = pt_comm_threads_run(out->cores, pt__calib_core_rank, &one);
            pt_set_threads(threads);
            if (st != PT_OK) return st;
            out->core_flops = one.peak_flops, out->core_gemm_eff = one.gemm_eff;
            out->core_gemm_dim = one.gemm_dim, out->core_attn_flops = one.attn_flops;
            out->core_mem_bw = one.mem_bw, out->core_kernel_s = one.kernel_s;
        }
        if ((st = pt_comm_threads_run(2, pt__calib_comm_rank, &cc)) != PT_OK) return st;
    } else { /* the others wait while rank 0 times the kernels with every core */
        if (world->rank == 0) {
#if defined(_SC_NPROCESSORS_ONLN)
            pt_set_threads((int)sysconf(_SC_NPROCESSORS_ONLN));
#endif
            st = pt__calib_kernels(out, precision);
            out->instr_flops = pt_instr_peak_gflops(bf16, 0.25) * 1e9;
            pt_set_threads(threads);
            if (st != PT_OK) return pt_comm_fail(world, st);
        }
        if ((st = pt_comm_barrier(world)) != PT_OK) return st;
        snprintf(out->name, sizeof out->name, "local-mpi");
        return pt_hw_calibrate_links(out, world);
    }
    out->intra_lat = out->inter_lat = cc.lat;
    out->intra_bw = out->inter_bw = cc.bw;
    /* thread ranks move nothing in the background: a test or wait performs the
       reduction on the rank's own core, so what overlaps costs the compute it all */
    out->comm_cpu = cc.bw > 0 ? 1.0 / cc.bw : 0.0;
    return PT_OK;
}

/* Seconds of reps GEMMs of 256^3 (a, b, c: 256 x 256), with req tested
   about every PT__POLL_S as the executor's polls do (NULL: none). */
static double pt__calib_busy(pt_ctx *ctx, const float *a, const float *b, float *c, int reps,
                             int every, pt_comm_req *req, pt_status *st) {
    double t0 = pt_time_now();
    int i, done = 0;
    for (i = 0; i < reps; i++) {
        pt_sgemm(ctx, 0, 0, 256, 256, 256, 1.0f, a, 256, b, 256, 0.0f, c, 256);
        if (req && !done && *st == PT_OK && i % every == every - 1) *st = pt_comm_test(req, &done);
    }
    return pt_time_now() - t0;
}

PTRAINDEF pt_status pt_hw_calibrate_links(pt_hw *hw, pt_comm *world) {
    pt__calib_comm cc = {0, 0};
    size_t n = (size_t)1 << 22;
    float v[3], *buf, *a;
    double one, ar, alone[3], with[3], vol;
    int reps, every, r, k = world ? world->size : 0;
    pt_comm_req q;
    pt_ctx ctx;
    pt_status st;
    if (k < 2)
        return pt__fail(PT_ERR_INVALID_ARG, "calibrating links: a world of 2 or more ranks, not %d",
                        k);
    if ((st = pt__calib_comm_rank(world, &cc)) != PT_OK) return st;
    /* the cores' share: fp32 GEMMs lasting about twice an all-reduce of n floats,
       alone and beside one started (rank 0's count on every rank) */
    if ((st = pt_ctx_init(&ctx, NULL)) != PT_OK) return pt_comm_fail(world, st);
    buf = (float *)pt__malloc((n + 3 * 65536) * sizeof(float), NULL);
    if (!buf) {
        pt_ctx_free(&ctx);
        return pt_comm_fail(world, pt__fail(PT_ERR_OOM, "calibration buffer"));
    }
    a = buf + n;
    for (r = 0; r < 3 * 65536; r++) a[r] = (float)(r % 13) * 0.01f;
    memset(buf, 0, n * sizeof(float));
    one = pt__calib_busy(&ctx, a, a + 65536, a + 2 * 65536, 16, 1, NULL, &st) / 16;
    vol = 2.0 * (k - 1) / k * (double)n * sizeof(float);
    ar = 2.0 * (k - 1) * cc.lat + vol / cc.bw;
    v[0] = (float)(2.0 * (ar > 0.05 ? ar : 0.05) / one), v[1] = (float)(PT__POLL_S / one);
    if ((st = pt_comm_broadcast(world, v, 2, 0)) != PT_OK) {
        pt__free(buf, NULL);
        pt_ctx_free(&ctx);
        return st;
    }
    reps = (int)v[0] > 1 ? (int)v[0] : 1, every = (int)v[1] > 1 ? (int)v[1] : 1;
    for (r = 0; r < 3 && st == PT_OK; r++) {
        if ((st = pt_comm_barrier(world)) != PT_OK) break;
        alone[r] = pt__calib_busy(&ctx, a, a + 65536, a + 2 * 65536, reps, every, NULL, &st);
        if ((st = pt_comm_barrier(world)) != PT_OK ||
            (st = pt_comm_all_reduce_start(world, buf, n, PT_REDUCE_SUM, &q)) != PT_OK)
            break;
        with[r] = pt__calib_busy(&ctx, a, a + 65536, a + 2 * 65536, reps, every, &q, &st);
        if (st == PT_OK) st = pt_comm_wait(&q);
    }
    pt__free(buf, NULL);
    pt_ctx_free(&ctx);
    if (st != PT_OK) return st;
    qsort(alone, 3, sizeof(double), pt__cmp_dbl), qsort(with, 3, sizeof(double), pt__cmp_dbl);
    v[0] = (float)cc.lat, v[1] = (float)cc.bw;
    v[2] = (float)(with[1] > alone[1] ? (with[1] - alone[1]) / vol : 0.0);
    if ((st = pt_comm_broadcast(world, v, 3, 0)) != PT_OK) return st;
    hw->intra_lat = hw->inter_lat = v[0];
    hw->intra_bw = hw->inter_bw = v[1];
    hw->comm_cpu = v[2];
    return PT_OK;
}

static pt_status pt__calib_kernels_here(pt_ctx *ctx, pt_hw *out) {
    /* squares, and the skinny shapes of a layer's GEMMs (one dimension small) */
    static const int shapes[10][3] = {{64, 64, 64},       {128, 128, 128},   {256, 256, 256},
                                      {512, 512, 512},    {1024, 1024, 1024}, {1024, 1024, 128},
                                      {1024, 1024, 256},  {256, 1024, 1024}, {1024, 256, 1024},
                                      {1024, 3072, 256}};
    double big = pt__gemm_rate(ctx, 2048, 2048, 2048, 8), best_g = 32, best_err = 1e30, g;
    int B = 4, T = 256, C = 256, NH = 4, slots = pt_get_threads(), i, r;
    size_t N = (size_t)B * T;
    float *qkv, *out_a, *lse, *scr, *dqkv;
    double rates[10], t0, ta;
    if (big <= 0) return pt__fail(PT_ERR_OOM, "calibration: cannot time sgemm");
    for (i = 0; i < 10; i++) {
        const int *q = shapes[i];
        rates[i] = pt__gemm_rate(ctx, q[0], q[1], q[2],
                                 (int)(2e9 / (2.0 * q[0] * q[1] * q[2])) + 2);
    }
    for (g = 2; g <= 512; g *= 1.05) { /* rate = big * f(M) f(N) f(K) / f(2048)^3, f = d/(d+g) */
        double err = 0.0, f2 = 2048.0 / (2048.0 + g);
        for (i = 0; i < 10; i++) {
            const int *q = shapes[i];
            double f = q[0] / (q[0] + g) * q[1] / (q[1] + g) * q[2] / (q[2] + g);
            double d = log(big * f / (f2 * f2 * f2) / rates[i]);
            err += d * d;
        }
        if (err < best_err) best_err = err, best_g = g;
    }
    snprintf(out->name, sizeof out->name, "local");
    out->peak_flops = big;
    out->gemm_dim = best_g;
    out->gemm_eff = pow((2048.0 + best_g) / 2048.0, 3); /* the asymptote over the 2048^3 rate */
    out->mem_bw = pt_mem_bandwidth_gbs((size_t)16 << 20, 5) * 1e9;
    /* ptrain's attention: forward and backward of one layer's core */
    qkv = (float *)pt__malloc(sizeof(float) * (N * 3 * C * 2 + N * C + B * NH * T +
                                               pt_attention_scratch_floats(T, slots)), NULL);
    if (!qkv) return pt__fail(PT_ERR_OOM, "calibration: attention buffers");
    dqkv = qkv + N * 3 * C, out_a = dqkv + N * 3 * C, lse = out_a + N * C, scr = lse + B * NH * T;
    for (i = 0; i < (int)(N * 3 * C); i++) qkv[i] = (float)(i % 17) * 0.01f;
    pt_attention_forward(ctx, out_a, lse, qkv, scr, slots, B, T, C, NH, NH);
    ta = 1e30;
    for (r = 0; r < 5; r++) {
        t0 = pt_time_now();
        pt_attention_forward(ctx, out_a, lse, qkv, scr, slots, B, T, C, NH, NH);
        pt_attention_backward(ctx, dqkv, out_a, out_a, qkv, lse, scr, slots, B, T, C, NH, NH);
        t0 = pt_time_now() - t0;
        ta = t0 < ta ? t0 : ta;
    }
    pt__free(qkv, NULL);
    /* the simulator charges 4 B T^2 C / attn_flops forward and 2.5 times that backward */
    out->attn_flops = 3.5 * 4.0 * B * (double)T * T * C / ta;
    { /* a kernel's fixed cost: a small elementwise pass (its threads' fork and join) */
        float *x = (float *)pt__malloc(sizeof(float) * 2 * 4096, NULL);
        if (!x) return pt__fail(PT_ERR_OOM, "calibration: kernel buffers");
        memset(x, 0, sizeof(float) * 2 * 4096);
        for (r = 0, ta = 1e30; r < 5; r++) {
            t0 = pt_time_now();
            for (i = 0; i < 1000; i++) pt_gelu_forward(x + 4096, x, 4096);
            t0 = (pt_time_now() - t0) / 1000;
            ta = t0 < ta ? t0 : ta;
        }
        pt__free(x, NULL);
        out->kernel_s = ta;
    }
    out->per_node = 64; /* ranks of one machine: one node */
#if defined(_SC_NPROCESSORS_ONLN)
    out->cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
#endif
    if (out->cores < 1) out->cores = pt_get_threads();
#if defined(_SC_PHYS_PAGES) && defined(_SC_PAGESIZE)
    out->mem_bytes = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
#else
    out->mem_bytes = 16e9;
#endif
    out->exec = PT_EXEC_PTRAIN;
    return PT_OK;
}

/* The kernels' rates with their GEMMs (and attention's) at precision, on this
   thread's OpenMP threads. */
static pt_status pt__calib_kernels(pt_hw *out, pt_precision precision) {
    pt_ctx ctx;
    pt_ctx_desc cd;
    pt_status st;
    memset(&cd, 0, sizeof cd);
    cd.precision = precision;
    if ((st = pt_ctx_init(&ctx, &cd)) != PT_OK) return st;
    st = pt__calib_kernels_here(&ctx, out);
    pt_ctx_free(&ctx);
    out->precision = precision == PT_PRECISION_BF16 ? PT_PRECISION_BF16 : PT_PRECISION_FP32;
    return st;
}

/* Tiling: a dimension d is used at d / (d + gemm_dim); the result is bounded
   by the memory traffic of the three matrices (roofline). */
PTRAINDEF double pt_hw_gemm_seconds(const pt_hw *hw, double M, double N, double K, double batch,
                                    double elem) {
    double g = hw->gemm_dim, eff = hw->gemm_eff * M / (M + g) * N / (N + g) * K / (K + g);
    double flops = 2.0 * M * N * K * batch, bytes = elem * batch * (M * K + K * N + M * N);
    double t = flops / (hw->peak_flops * eff), tm = bytes / hw->mem_bw;
    return (t > tm ? t : tm) + hw->kernel_s;
}

PTRAINDEF double pt_hw_comm_seconds(const pt_hw *hw, pt_coll_kind kind, double bytes, int n,
                                    int per_node) {
    int nodes = (n + per_node - 1) / per_node;
    double bw = hw->intra_bw, lat = hw->intra_lat, ring, tree, steps, vol;
    if (n <= 1 || bytes <= 0 || kind == PT_COLL_NONE) return 0.0;
    if (nodes > 1) { /* the slower link: each device's share of its node's adapters */
        bw = hw->inter_bw < bw ? hw->inter_bw : bw;
        lat = hw->inter_lat;
    }
    if (kind == PT_COLL_P2P) return lat + bytes / bw;
    /* ring: reduce-scatter and all-gather each move (n-1)/n of the buffer in
       n-1 steps; an all-reduce is both. A tree all-reduce: 2 log2(n) steps,
       each the whole buffer pipelined (about 2 buffers through a link). */
    steps = kind == PT_COLL_ALL_REDUCE ? 2.0 * (n - 1) : (double)(n - 1);
    vol = (kind == PT_COLL_ALL_REDUCE ? 2.0 : 1.0) * (n - 1) / n * bytes;
    ring = steps * lat + vol / bw;
    if (kind != PT_COLL_ALL_REDUCE) return ring;
    tree = 2.0 * ceil(log2((double)n)) * lat + 2.0 * bytes / bw;
    return ring < tree ? ring : tree;
}

/* What one micro-batch costs on one layer (per tensor-parallel rank): the
   GEMMs (fwd: forward; the backward has two per forward GEMM), the
   memory-bound kernels, and the tensor-parallel all-reduces. */
typedef struct pt__layer_cost {
    double fwd_s, bin_s, bw_s;      /* forward; backward input half; weight half */
    double fwd_flops, bwd_flops;    /* backward: both halves */
    double attn_fwd_s, attn_fwd_flops; /* the attention core alone (selective recompute) */
    double tp_fwd_s, tp_bwd_s;      /* the all-reduces inside fwd_s and bin_s */
    double act_bytes;               /* kept for backward, recompute none (Korthikanti) */
    double act_sel_bytes;           /* kept with selective recomputation */
    double tp_bytes;                /* one all-reduce's buffer (0 without tp) */
} pt__layer_cost;

/* A gradient bucket of a simulated rank: its dp reduction's and parameter
   gather's seconds, and the local layers it holds whole (lf < 0: none; the
   vocabulary's runs, the final norm: reduced after backward). */
typedef struct pt__sim_bucket {
    double red_s, gat_s;
    double red_v, gat_v; /* the bytes each passes through a rank (pt_hw.comm_cpu's) */
    int lf, n;
} pt__sim_bucket;

typedef struct pt__sim {
    const pt_plan_desc *d;
    const pt_hw *hw;
    double elem;            /* bytes of an activation element */
    double share;           /* compute slow-down from ranks sharing cores */
    double gb;              /* bytes of a gradient element (pt_hw.grad_bytes, else elem) */
    int ptrain, dp, m, split, V;
    int cp, dpw;            /* context parallelism; the ranks holding the same weights
                               (dp x cp), over which gradients are reduced */
    int sp, flash;          /* sequence parallelism (tp > 1), fused attention */
    int cp_ag;              /* cp's K and V all-gathered, exposed (PT_CP_ALLGATHER) */
    const pt_schedule *sch; /* the lists run */
    int xl;                 /* PT_SPLIT_EMBED_LOSS: each stage built with the model's layers
                               + 2, the first block's first layer and the last block's last
                               one not there (the embedding's and the loss's places) */
    int tp_ov, pp_ov;       /* tp's collectives, pipeline sends behind compute */
    pt__layer_cost layer;
    /* per stage: layers of each chunk, and the stage's FLOPs and busy parts */
    int *chunk_layers;      /* (p * v) */
    double head_fwd_s, head_bin_s, head_bw_s, head_fwd_flops, head_bwd_flops, head_tp_s;
    double emb_fwd_s, emb_bwd_s, emb_tp_s;
    double p2p_s, p2p_bytes;
    double *opt_s, *dp_s;   /* (p) the OPT action: gradient sync + optimizer */
    double *pair_s;         /* (p) Chimera's REDUCE: the gradients summed with stage p-1-s */
    double *zero3_s;        /* (p) ZeRO 3 on a GPU profile: gathering one layer */
    double *acc_s;          /* (p) grad_accum_pass: a micro-batch's pass over the stage's
                               gradients (its chunks' B share it) */
    int z3, z3_ov;          /* ZeRO 3 on ptrain's executor with a dp group: its F and B run
                               bucket by bucket (pt__sim_z3_pass); the next gather started
                               behind each bucket's compute (the executor's overlap) */
    int *z3_held;           /* (p * 4) the buckets in the two gathered halves as B begins
                               [0, 2), and as an F after a B begins [2, 4) */
    double z3e_mask_s, z3e_rows_s, z3e_mask_v, z3e_rows_v; /* ZeRO 3's embedding compact
                               (pt__sim_z3_compact): its two all-reduces' seconds and bytes
                               through a rank, F and B each (0: wte's buckets whole) */
    double *z3_x, *z3_h;    /* (p) ZeRO 3's dp time waited for, and run behind compute */
    double *busy, *flops, *hwflops, *tp_s, *pp_s; /* (p) */
    pt_plan_stage *stage;   /* (p) the result's */
    const double *scale;    /* (PT_ACT_COUNT) or NULL: each action kind's time times this
                               (the tests' seam: a cost that does not move the step is a bug) */
    /* overlap (pt_plan_desc.overlap): each stage's buckets as its meta build
       lays them out, and what the timeline makes of them */
    int overlap, ov_reduce; /* gathers behind the forward; reductions behind backward too */
    pt__sim_bucket **bk;    /* (p) buckets in the table's (forward) order */
    int *nbk;               /* (p) */
    int **lbk;              /* (p) local layer -> the whole-layer bucket holding it */
    int *clo, *chi;         /* (p * chunks) each chunk's local layers [lo, hi) */
    int *first_f;           /* (p * chunks) the micro-batch of the chunk's first forward */
    double *fwait;          /* (p * chunks) that forward's waits for the gathers */
    double *opt_c, *opt_x;  /* (p) OPT's optimizer alone; its communication no overlap hides
                               (wte's two copies, Chimera's pair) */
    double *dp_x, *dp_h;    /* (p) dp communication waited for, and run behind compute */
    double *slow;           /* (p) its compute stretched by what those transfers cost the
                               cores (pt_hw.comm_cpu): F, B, W times this */
} pt__sim;

/* The tp collectives of a layer's pass: Megatron's f and g (two all-reduces
   of M x h), with sequence parallelism an all-gather and a reduce-scatter
   each (a ring's same bytes); with tp_overlap the profile's exposed share. */
static double pt__tp_pass_seconds(const pt__sim *S, double M) {
    const pt_hw *hw = S->hw;
    const pt_plan_desc *d = S->d;
    int tp = d->tp, pn = tp < hw->per_node ? tp : hw->per_node;
    double bytes = M * d->model.config.n_embd * S->elem, x;
    if (tp < 2) return 0.0;
    x = S->sp ? pt_hw_comm_seconds(hw, PT_COLL_ALL_GATHER, bytes, tp, pn) +
                    pt_hw_comm_seconds(hw, PT_COLL_REDUCE_SCATTER, bytes, tp, pn)
              : pt_hw_comm_seconds(hw, PT_COLL_ALL_REDUCE, bytes, tp, pn);
    if (S->tp_ov) x *= hw->tp_exposed > 0 ? hw->tp_exposed : 1.0;
    return 2.0 * x;
}

/* Keys at or before position p in rank j's load-balanced block of cp
   (chunks j and 2cp-1-j of hc tokens). */
static double pt__cp_keys(double p, int j, int cp, double hc) {
    double a = p - j * hc + 1, z = p - (2 * cp - 1 - j) * hc + 1;
    return (a < 0 ? 0 : a > hc ? hc : a) + (z < 0 ? 0 : z > hc ? hc : z);
}

/* Score elements ptrain's kernel computes for a sequence of s tokens: each
   PT_ATTN_QBLOCK-query block against the keys up to its last query (a
   prefix: pt__attn_rows); split over a cp ring, each step's slowest rank
   (the ring waits for it), times cp, over the unsplit kernel's. When the
   s/(2cp)-token chunks are shorter than a block a rank's blocks span both
   its chunks and see every key of a block (cp 2, s 128: 4/3). */
static double pt__cp_attn_share(double s, int cp) {
    double sl = s / cp, hc = sl / 2, one = 0, ring = 0, t0, nq;
    int c, i;
    for (t0 = 0; t0 < s; t0 += PT_ATTN_QBLOCK)
        nq = s - t0 < PT_ATTN_QBLOCK ? s - t0 : PT_ATTN_QBLOCK, one += nq * (t0 + nq);
    for (i = 0; i < cp; i++) {
        double most = 0;
        for (c = 0; c < cp; c++) {
            double e = 0;
            for (t0 = 0; t0 < sl; t0 += PT_ATTN_QBLOCK) { /* the block's last query's position */
                double last = t0 + PT_ATTN_QBLOCK < sl ? t0 + PT_ATTN_QBLOCK - 1 : sl - 1;
                double p = last < hc ? c * hc + last : (2 * cp - 1 - c) * hc + last - hc;
                e += (last - t0 + 1) * pt__cp_keys(p, (c - i + cp) % cp, cp, hc);
            }
            if (e > most) most = e;
        }
        ring += most;
    }
    return one > 0 ? cp * ring / one : 1.0;
}

/* The attention core of a layer on one rank (forward *f, backward *bk, in
   seconds), f_attn its FLOPs as the model counts them (the whole s x s):
   fused (FlashAttention: the causal half it computes at flash_eff of peak,
   backward 2.5 times the FLOPs), the local profile's fused rate, or batched
   GEMMs with the softmax and dropout stored. With cp the rank's queries
   meet every key block in turn round the ring, each block's K/V (and in
   backward their gradients) passed on behind the block computed: cp - 1
   steps of the longer of the two, then the last block. On ptrain's
   executor a step also costs the cores: the kernel's blocks over the
   chunks (pt__cp_attn_share), the bytes of its transfers (pt_hw.comm_cpu:
   thread ranks copy them), the partial output's merge, and in backward the
   dk|dv share cleared and added into the accumulator passed on; once a
   pass, the rank's K|V copied out of qkv (and its gradient added home). */
static void pt__attn_core(const pt__sim *S, double f_attn, double *f, double *bk) {
    const pt_plan_desc *d = S->d;
    const pt_gpt_config *cf = &d->model.config;
    const pt_hw *hw = S->hw;
    double b = d->model.batch, s = d->model.seq, sl = s / S->cp, h = cf->n_embd;
    double t = d->tp, e = S->elem, a = cf->n_head, hd = h / a, ah = a / t;
    double r = cf->n_kv_head > 0 ? cf->n_kv_head / a : 1.0;
    if (S->flash && hw->flash_eff > 0) {
        *f = 0.5 * f_attn / (hw->peak_flops * hw->flash_eff / S->share);
        *bk = 2.5 * *f;
    } else if (hw->attn_flops > 0) {
        *f = f_attn / (hw->attn_flops / S->share);
        *bk = 2.0 * *f * 1.25; /* backward: twice the FLOPs, plus recomputing P */
    } else {
        double P = b * ah * sl * s; /* score elements */
        double g_sc = pt_hw_gemm_seconds(hw, sl, s, hd, b * ah, e);
        double g_ctx = pt_hw_gemm_seconds(hw, sl, hd, s, b * ah, e);
        /* softmax: read and write P; dropout: read, write, a 1-byte mask */
        *f = (g_sc + g_ctx) * S->share + (P * (4 * e + 1)) / hw->mem_bw * S->share;
        *bk = 2.0 * (g_sc + g_ctx) * S->share + (P * (6 * e + 1)) / hw->mem_bw * S->share;
    }
    if (S->cp > 1 && S->cp_ag) { /* all of K and V gathered (twice: backward too), dK and
                                    dV reduce-scattered, each over cp x its tp rank's r h/t */
        int cp = S->cp, pn = d->tp * cp <= hw->per_node ? cp
                             : d->tp < hw->per_node ? hw->per_node / d->tp : 1;
        double kv = 2.0 * b * sl * r * h / t * e * cp;
        double ag = pt_hw_comm_seconds(hw, PT_COLL_ALL_GATHER, kv, cp, pn);
        *f += ag; /* (then the rank's queries against all the keys, as without cp) */
        *bk += ag + pt_hw_comm_seconds(hw, PT_COLL_REDUCE_SCATTER, kv, cp, pn);
    } else if (S->cp > 1) { /* K and V of the rank's tokens (r h / t each) a step */
        int cp = S->cp, span = d->tp * cp > hw->per_node;
        double kv = 2.0 * b * sl * r * h / t * e, o = b * sl * h / t * e;
        double x = pt_hw_comm_seconds(hw, PT_COLL_P2P, kv, 2, span ? 1 : 2);
        double cf_, cb, c = 0, bw = hw->mem_bw / S->share, own = 0, home = 0, mf = 0, mb = 0;
        if (!(S->flash && hw->flash_eff > 0) && hw->attn_flops > 0) { /* ptrain's kernel */
            double g = pt__cp_attn_share(s, cp);
            *f *= g, *bk *= g;
        }
        if (S->ptrain) { /* the executor's ring on the cores */
            c = hw->comm_cpu * kv, own = 2 * kv / bw, home = 3 * kv / bw;
            mf = 3 * o / bw, mb = 4 * kv / bw; /* out, out_i -> out; part = 0, acc += part */
        }
        cf_ = *f / cp, cb = *bk / cp;
        *f = own + (cp - 1) * (cf_ + c + mf > x ? cf_ + c + mf : x) + cf_;
        *bk = own + home + (cp - 1) * (cb + 2 * c + mb > 2 * x ? cb + 2 * c + mb : 2 * x) + cb +
              c + mb;
    }
}

static void pt__layer_costs(pt__sim *S) {
    const pt_plan_desc *d = S->d;
    const pt_gpt_config *cf = &d->model.config;
    const pt_hw *hw = S->hw;
    /* a rank's tokens: seq / cp; with sp the norms, dropout and residuals run on
       1/tp of them (the q of its columns: ts) */
    double b = d->model.batch, s = d->model.seq, sl = s / S->cp, h = cf->n_embd, a = cf->n_head;
    double t = d->tp, e = S->elem, M = b * sl, ht = h / t, ts = S->sp ? t : 1.0;
    /* LLaMA's layer: q, and k, v of the key/value heads only (r = their share
       of the heads); an MLP of ff columns, SwiGLU's gate and up (fi = 2 ff) */
    double r = cf->n_kv_head > 0 ? cf->n_kv_head / a : 1.0;
    double fft = (cf->ffn_hidden > 0 ? cf->ffn_hidden : 4.0 * h) / t;
    double fit = cf->mlp == PT_MLP_SWIGLU ? 2.0 * fft : fft;
    pt__layer_cost *L = &S->layer;
    double g_qkv, g_proj, g_fc1, g_fc2, f_lin, f_attn, ew_f, ew_b, attn_f, attn_b, kern;
    int drop = cf->arch != PT_ARCH_LLAMA; /* GPT's dropout (LLaMA has none) */
    /* the four linear layers, M x K -> N, each rank with its 1/t */
    g_qkv = pt_hw_gemm_seconds(hw, M, (1 + 2 * r) * ht, h, 1, e);
    g_proj = pt_hw_gemm_seconds(hw, M, h, ht, 1, e);
    g_fc1 = pt_hw_gemm_seconds(hw, M, fit, h, 1, e);
    g_fc2 = pt_hw_gemm_seconds(hw, M, h, fft, 1, e);
    f_lin = 2.0 * M * h * ((1 + 2 * r) * ht + ht + fit + fft); /* GPT-2: 24 b s h^2 / t */
    f_attn = 4.0 * b * sl * s * h / t; /* scores and context: the rank's queries, every key */
    pt__attn_core(S, f_attn, &attn_f, &attn_b);
    /* memory-bound kernels: LayerNorms (read, write M h), two bias + dropout +
       residual adds (read 2, write 1, a mask), bias + GELU over 4h/t (the fp32
       executor keeps no masks); backward moves about twice as much */
    ew_f = e * (2 * M * h * 2 / ts + 2 * 3 * M * h / ts + M * (fit + fft) + M * (1 + 2 * r) * ht) +
           (S->ptrain || !drop ? 0.0 : 2.0 * M * h / ts);
    ew_b = 2.0 * ew_f;
    kern = (S->ptrain ? 10.0 : 12.0) * hw->kernel_s; /* launches besides the GEMMs' */
    ew_f = ew_f / hw->mem_bw * S->share + kern;
    ew_b = ew_b / hw->mem_bw * S->share + 2.0 * kern;
    L->tp_fwd_s = L->tp_bwd_s = pt__tp_pass_seconds(S, M);
    L->tp_bytes = t > 1 ? M * h * e : 0.0;
    L->attn_fwd_s = attn_f;
    L->attn_fwd_flops = f_attn;
    L->fwd_flops = f_lin + f_attn;
    L->bwd_flops = 2.0 * (f_lin + f_attn);
    L->fwd_s = (g_qkv + g_proj + g_fc1 + g_fc2) * S->share + attn_f + ew_f + L->tp_fwd_s;
    /* backward: the input gradients (and the attention core's) first, the weight
       gradients (same GEMM shapes) apart for zero-bubble schedules */
    L->bw_s = (g_qkv + g_proj + g_fc1 + g_fc2) * S->share;
    L->bin_s = L->bw_s + attn_b + ew_b + L->tp_bwd_s;
    /* Korthikanti et al. 2022, eq. (2) (sp: eq. (4), the 10 outside the tp
       regions over t), in bytes; its 24/t (q, k, v, the attention output, the
       MLP's two 4h inputs) as (4 + 4r)/t + 2 (fi + ff)/(t h) for LLaMA's
       smaller k, v and its MLP; the 5as/ht of scores, softmax and its dropout
       mask gone with a fused kernel; LLaMA without the two dropout masks (10
       is 8); a rank's sl tokens under cp */
    {
        double split = (4.0 + 4.0 * r) / t + 2.0 * (fit + fft) / h;
        L->act_sel_bytes = sl * b * h * ((drop ? 10.0 : 8.0) / ts + split);
        L->act_bytes = L->act_sel_bytes + (S->flash ? 0.0 : sl * b * h * 5.0 * a * s / (h * t));
    }
}

/* F, B and W of virtual stage vs as its layers run them, in seconds: what
   comes before the layers (F: the embedding; B: the head), each layer (B:
   both halves unless split, and what recomputation redoes), what comes after. */
static void pt__sim_parts(const pt__sim *S, int kind, int vs, double *pre, double *per,
                          double *post) {
    const pt__layer_cost *L = &S->layer;
    int first = vs == 0, last = vs == S->V - 1, rc = S->d->model.recompute;
    *pre = *per = *post = 0.0;
    if (kind == PT_ACT_F) {
        *pre = first ? S->emb_fwd_s : 0.0, *per = L->fwd_s, *post = last ? S->head_fwd_s : 0.0;
    } else if (kind == PT_ACT_B) {
        *pre = last ? S->head_bin_s + S->head_bw_s : 0.0;
        *per = (S->split ? L->bin_s : L->bin_s + L->bw_s) +
               (rc == PT_RECOMPUTE_FULL ? L->fwd_s : rc == PT_RECOMPUTE_SELECTIVE ? L->attn_fwd_s
                                                                                 : 0.0);
        *post = first ? S->emb_bwd_s : 0.0;
    } else if (kind == PT_ACT_W) {
        *per = L->bw_s;
    }
}

/* Compute of c seconds beside a collective of z: while the collective runs
   the compute has 1 - comm_sm of the device; the longer of the two, or the
   compute's rest after the collective ends. */
static double pt__sim_beside(const pt__sim *S, double c, double z) {
    double f = S->hw->comm_sm, left = z * (1.0 - f);
    if (z <= 0.0) return c;
    return c <= left ? z : z + (c - left);
}

/* ZeRO 3 on ptrain's executor: one rank's clock through F or B, its dp
   link, the bucket gathered in each half of the work buffer (pt__z3_need,
   pt__zero2_bucket), what the compute waited for and the bytes moved. */
typedef struct pt__z3_clock {
    double t, link, pend[2]; /* the compute; the link free from; a started gather's end */
    double wait, busy, bytes; /* the compute held up; the link's seconds; bytes through it */
    int held[2];
} pt__z3_clock;

/* Waits for the gather started into half h, if any. */
static void pt__z3_sim_wait(pt__z3_clock *z, int h) {
    if (z->pend[h] > z->t) z->wait += z->pend[h] - z->t, z->t = z->pend[h];
    z->pend[h] = -1.0;
}

/* A collective of s seconds (v bytes a rank) on the link after what it
   holds: started behind the compute (into half h's pend), or waited for. */
static double pt__z3_sim_coll(pt__z3_clock *z, double s, double v, int behind) {
    double at = z->t > z->link ? z->t : z->link;
    z->link = at + s, z->busy += s, z->bytes += v;
    if (!behind) z->wait += z->link - z->t, z->t = z->link;
    return z->link;
}

/* pt__z3_need(b, nxt) as the executor runs it: b gathered now unless its
   half holds it; with overlap, nxt's gather started into the other half,
   the cores paying its bytes (pt_hw.comm_cpu: thread ranks, all of it). */
static void pt__z3_sim_need(const pt__sim *S, const pt__sim_bucket *bk, pt__z3_clock *z, int b,
                            int nxt) {
    int h = b & 1, g = nxt & 1;
    if (b < 0) return;
    pt__z3_sim_wait(z, h);
    if (z->held[h] != b) pt__z3_sim_coll(z, bk[b].gat_s, bk[b].gat_v, 0), z->held[h] = b;
    if (!S->z3_ov || nxt < 0 || g == h || z->held[g] == nxt) return;
    pt__z3_sim_wait(z, g);
    z->pend[g] = pt__z3_sim_coll(z, bk[nxt].gat_s, bk[nxt].gat_v, 1), z->held[g] = nxt;
    z->t += S->hw->comm_cpu * bk[nxt].gat_v, z->wait += S->hw->comm_cpu * bk[nxt].gat_v;
}

/* pt__zero2_bucket(b): b's half let go of (its gather done), b's gradients
   reduce-scattered into the shard, waited for. */
static void pt__z3_sim_reduce(const pt__sim_bucket *bk, pt__z3_clock *z, int b) {
    pt__z3_sim_wait(z, b & 1);
    z->held[b & 1] = -1;
    pt__z3_sim_coll(z, bk[b].red_s, bk[b].red_v, 0);
}

/* pt__z3_embed_compact's collectives (S->z3e_rows_s > 0) before the embedding's forward:
   the half nx (the first layer's bucket) does not use let go of, the mask of the rows read
   all-reduced and waited for, the rows' all-reduce started, nx's gather behind it unless
   its half holds it, the rows' waited for. */
static void pt__z3_sim_compact(const pt__sim *S, const pt__sim_bucket *bk, pt__z3_clock *z,
                               int nx) {
    int h = !(nx & 1), g = nx & 1;
    double end;
    pt__z3_sim_wait(z, h);
    z->held[h] = -1;
    pt__z3_sim_coll(z, S->z3e_mask_s, S->z3e_mask_v, 0);
    end = pt__z3_sim_coll(z, S->z3e_rows_s, S->z3e_rows_v, 1);
    if (z->held[g] != nx) {
        pt__z3_sim_wait(z, g);
        z->pend[g] = pt__z3_sim_coll(z, bk[nx].gat_s, bk[nx].gat_v, 1), z->held[g] = nx;
        z->t += S->hw->comm_cpu * bk[nx].gat_v, z->wait += S->hw->comm_cpu * bk[nx].gat_v;
    }
    if (end > z->t) z->wait += end - z->t, z->t = end;
}

/* F (kind) or B of ptrain's ZeRO 3 on stage st (pp = 1: the whole model)
   in the executor's order of buckets: forward the embedding's (ne, before
   the first layer), each layer's, the final norm's, the head's (nh after
   the norm; tied: the embedding's again), each needed with the next
   prefetched; backward the head's from the last, the norm's, the layers'
   descending, each reduce-scattered after its compute, then the
   embedding's reduced (its backward reads no weights); with its rows compact
   (S->z3e_rows_s > 0) the embedding's buckets are neither gathered nor reduced: F
   all-reduces the rows its tokens read (pt__z3_sim_compact), B lets both halves go and
   all-reduces the mask and the rows' gradients. pre, per, post: the
   compute (pt__sim_parts), the embedding's and head's split evenly over
   their buckets. held: the halves' buckets as it begins, then as it ends. */
static pt__z3_clock pt__sim_z3_pass(const pt__sim *S, int st, int kind, double pre, double per,
                                    double post, int held[2]) {
    const pt__sim_bucket *bk = S->bk[st];
    const int *lb = S->lbk[st];
    int v = S->d->model.chunks, nb = S->nbk[st], nl = S->chi[st * v] - S->clo[st * v], ne = 0;
    int lnf, h0, nh, i, l;
    double emb = kind == PT_ACT_F ? pre : post, head = kind == PT_ACT_F ? post : pre;
    pt__z3_clock z;
    memset(&z, 0, sizeof z);
    z.pend[0] = z.pend[1] = -1.0, z.held[0] = held[0], z.held[1] = held[1];
    while (ne < nb && bk[ne].lf < 0) ne++;
    lnf = nl > 0 ? lb[nl - 1] + 1 : ne;
    h0 = lnf + 1 < nb ? lnf + 1 : 0, nh = lnf + 1 < nb ? nb - lnf - 1 : ne;
    if (lnf >= nb || ne == 0) return z; /* (not a layout the executor builds) */
    if (kind == PT_ACT_F) {
        if (S->z3e_rows_s > 0) pt__z3_sim_compact(S, bk, &z, nl > 0 ? lb[0] : lnf), z.t += emb;
        for (i = 0; S->z3e_rows_s <= 0 && i < ne; i++) {
            pt__z3_sim_need(S, bk, &z, i, i + 1 < ne ? i + 1 : nl > 0 ? lb[0] : lnf);
            z.t += emb / ne;
        }
        for (l = 0; l < nl; l++) {
            pt__z3_sim_need(S, bk, &z, lb[l], l + 1 < nl ? lb[l + 1] : lnf);
            z.t += per;
        }
        pt__z3_sim_need(S, bk, &z, lnf, h0);
        for (i = 0; i < nh; i++) {
            pt__z3_sim_need(S, bk, &z, h0 + i, i + 1 < nh ? h0 + i + 1 : -1);
            z.t += head / nh;
        }
    } else {
        for (i = nh - 1; i >= 0; i--) {
            pt__z3_sim_need(S, bk, &z, h0 + i, i > 0 ? h0 + i - 1 : lnf);
            z.t += head / nh;
            pt__z3_sim_reduce(bk, &z, h0 + i);
        }
        pt__z3_sim_need(S, bk, &z, lnf, nl > 0 ? lb[nl - 1] : -1);
        pt__z3_sim_reduce(bk, &z, lnf);
        for (l = nl - 1; l >= 0; l--) {
            pt__z3_sim_need(S, bk, &z, lb[l], l > 0 ? lb[l - 1] : -1);
            z.t += per;
            pt__z3_sim_reduce(bk, &z, lb[l]);
        }
        if (S->z3e_rows_s > 0) { /* (pt__z3_embed_sparse) */
            pt__z3_sim_wait(&z, 0), pt__z3_sim_wait(&z, 1);
            z.held[0] = z.held[1] = -1;
            pt__z3_sim_coll(&z, S->z3e_mask_s, S->z3e_mask_v, 0);
            z.t += emb;
            pt__z3_sim_coll(&z, S->z3e_rows_s, S->z3e_rows_v, 0);
        }
        for (i = 0; S->z3e_rows_s <= 0 && i < ne; i++) {
            z.t += emb / ne;
            pt__z3_sim_reduce(bk, &z, i);
        }
    }
    held[0] = z.held[0], held[1] = z.held[1];
    return z;
}

/* Seconds of one action on stage st; with stats, also its FLOPs and time. */
static double pt__sim_action(pt__sim *S, int st, const pt_action *a, int stats) {
    const pt__layer_cost *L = &S->layer;
    int p = S->d->pp, v = S->d->model.chunks, rc = S->d->model.recompute;
    int vs = a->chunk >= 0 ? pt__sched_vstage(S->d->model.schedule, p, st, a->chunk) : -1;
    int nl = vs >= 0 ? S->chunk_layers[vs] : 0;
    int first = vs == 0, last = vs == S->V - 1;
    double t = 0.0, fl = 0.0, hf = 0.0, tp = 0.0, pp = 0.0, z3, pre, per, post;
    pt__sim_parts(S, a->kind, vs, &pre, &per, &post);
    switch (a->kind) {
    case PT_ACT_F:
        t = pre + nl * per + post;
        if (S->overlap && a->micro == S->first_f[st * v + a->chunk])
            t += S->fwait[st * v + a->chunk]; /* the gathers it waits for */
        fl = hf = nl * L->fwd_flops + (last ? S->head_fwd_flops : 0.0);
        tp = nl * L->tp_fwd_s + (first ? S->emb_tp_s : 0.0);
        z3 = S->zero3_s[st] * nl; /* ZeRO 3 gathers the layers while computing */
        t = pt__sim_beside(S, t, z3);
        break;
    case PT_ACT_B:
        t = pre + nl * per + post; /* (recomputation's forward included) */
        fl = nl * (S->split ? L->bwd_flops / 2 : L->bwd_flops) + (last ? S->head_bwd_flops : 0.0);
        hf = fl;
        tp = nl * L->tp_bwd_s + (last ? S->head_tp_s : 0.0);
        if (rc == PT_RECOMPUTE_FULL) { /* the layer's forward again */
            hf += nl * L->fwd_flops, tp += nl * L->tp_fwd_s;
        } else if (rc == PT_RECOMPUTE_SELECTIVE) {
            hf += nl * L->attn_fwd_flops;
        }
        /* gather again and reduce-scatter the gradients; recomputation's forward
           gathers once more (DeepSpeed releases a layer's weights after each
           forward, the recomputed one included) */
        z3 = (rc == PT_RECOMPUTE_FULL ? 3.0 : 2.0) * S->zero3_s[st] * nl;
        t = pt__sim_beside(S, t, z3) + S->acc_s[st] / v;
        break;
    case PT_ACT_W:
        t = nl * per;
        fl = hf = nl * L->bwd_flops / 2;
        break;
    case PT_ACT_SEND_ACT:
    case PT_ACT_SEND_GRAD:
        t = pp = S->p2p_s;
        break;
    case PT_ACT_OPT:
        t = S->opt_s[st];
        break;
    case PT_ACT_REDUCE:
        t = S->pair_s[st];
        break;
    default:
        break;
    }
    if (S->z3 && (a->kind == PT_ACT_F || a->kind == PT_ACT_B)) { /* its buckets as run */
        int *h = S->z3_held + st * 4, held[2] = {-1, -1};
        pt__z3_clock z;
        if (a->kind == PT_ACT_B) held[0] = h[0], held[1] = h[1];
        else if (a->micro != S->first_f[st * v + a->chunk]) held[0] = h[2], held[1] = h[3];
        z = pt__sim_z3_pass(S, st, a->kind, pre, per, post, held);
        t = z.t;
        if (stats) {
            S->z3_x[st] += z.wait, S->z3_h[st] += z.busy > z.wait ? z.busy - z.wait : 0.0;
            S->stage[st].dp_bytes += z.bytes;
        }
    }
    if (S->overlap && (a->kind == PT_ACT_F || a->kind == PT_ACT_B || a->kind == PT_ACT_W)) {
        double w = a->kind == PT_ACT_F && a->micro == S->first_f[st * v + a->chunk]
                       ? S->fwait[st * v + a->chunk] : 0.0;
        t = (t - w) * S->slow[st] + w; /* (the transfers' cost to the cores; not to waiting) */
    }
    if (S->scale) t *= S->scale[a->kind], pp *= S->scale[a->kind];
    if (stats) {
        double ar = S->layer.tp_bytes; /* Megatron's f and g: 2 all-reduces a pass */
        S->flops[st] += fl, S->hwflops[st] += hf, S->tp_s[st] += tp, S->pp_s[st] += pp;
        if (a->kind == PT_ACT_F) S->stage[st].tp_bytes += 2 * nl * ar + (first ? ar : 0.0);
        if (a->kind == PT_ACT_B)
            S->stage[st].tp_bytes += 2 * nl * ar * (rc == PT_RECOMPUTE_FULL ? 2 : 1) +
                                     (last ? ar : 0.0);
        if (a->kind == PT_ACT_SEND_ACT || a->kind == PT_ACT_SEND_GRAD)
            S->stage[st].pp_bytes += S->p2p_bytes;
        if (a->kind != PT_ACT_OPT && a->kind != PT_ACT_REDUCE) S->busy[st] += t;
    }
    return t;
}

static double pt__sim_cost_cb(void *ctx, int st, const pt_action *a) {
    return pt__sim_action((pt__sim *)ctx, st, a, 1);
}

/* Bytes on one rank of stage st (Korthikanti et al. 2022 for the
   Megatron-LM executor's activations; pt_gpt_init's own layout for ptrain's);
   held: the layers' micro-batches whose activations it holds at most, gone:
   parameters the build holds that the stage does not (pt__sim.xl). */
static void pt__sim_memory(const pt__sim *S, const pt_gpt *m, double held, double gone,
                           pt_plan_mem *mem) {
    const pt_plan_desc *d = S->d;
    pt__exec_layout o = pt__exec_layout_of(m);
    double P = (double)m->num_params - gone;
    double sh = m->place.zero ? (double)o.shard_total - gone / S->dpw : P;
    double big = (double)o.largest_bucket, wb = S->ptrain ? 4 : 2, gb = S->ptrain ? wb : S->gb;
    double ob = S->ptrain ? 8 : 12; /* Adam m, v (and fp32 master weights) */
    const pt_gpt_desc *md = &d->model;
    /* a rank's tokens: seq / cp; outside the tp regions / tp with sp */
    double s = (double)md->seq / S->cp, b = md->batch, h = md->config.n_embd, t = d->tp, per;
    double sbh_out = s * b * h / (S->sp ? t : 1.0);
    memset(mem, 0, sizeof *mem);
    mem->params = md->zero == 3 ? (sh + 2.0 * big) * wb : P * wb;
    if (md->schedule == PT_SCHED_2BW) mem->params += P * wb; /* its second version */
    mem->grads = md->zero >= 2 ? (sh + big) * gb : P * gb;
    mem->optimizer = (md->zero >= 1 ? sh : P) * ob;
    if (S->ptrain) { /* this header's executor: exactly what pt_gpt_init lays out */
        mem->params = (double)m->mem.params, mem->grads = (double)m->mem.grads;
        mem->optimizer = (double)m->mem.optimizer;
        mem->activations = (double)(m->mem.activations + m->mem.scratch);
    } else {
        per = md->recompute == PT_RECOMPUTE_FULL        ? 2.0 * sbh_out
              : md->recompute == PT_RECOMPUTE_SELECTIVE ? S->layer.act_sel_bytes
                                                        : S->layer.act_bytes;
        mem->activations = held * per;
        if (md->recompute == PT_RECOMPUTE_FULL) mem->transient = S->layer.act_bytes;
        if (m->place.has_embed && md->config.arch != PT_ARCH_LLAMA)
            mem->activations += m->mem.slots * sbh_out; /* dropout mask */
        if (m->place.has_head) /* output layer: 4sbh/t (1 + v/h) */
            mem->activations += 4.0 * s * b * h / t * (1.0 + (double)m->place.vocab_local * t / h);
    }
    mem->total = mem->params + mem->grads + mem->optimizer + mem->activations;
}

/* The layers over the V blocks (pt_plan_split): S->xl. The embedding and the
   loss as a layer each needs a pipeline, a layer a block once they are
   counted (the first and last blocks may hold none but them) and the
   Megatron-LM executor's model (ptrain's lays its layers out evenly). */
static pt_status pt__plan_split(pt__sim *S, const pt_plan_desc *D, const pt_hw *hw) {
    int L = D->model.config.n_layer, V = S->V, p = D->pp;
    int ours = (D->exec ? D->exec : hw->exec) == PT_EXEC_PTRAIN;
    S->xl = 0;
    if (D->pp_split == PT_SPLIT_EMBED_LOSS) {
        if (ours || p < 2 || L + 2 < V)
            return pt__fail(PT_ERR_CONFIG, "pp_split=embedding-loss needs pp > 1 (pp=%d), "
                            "layers + 2 >= the blocks (layers=%d, %d blocks) and the Megatron-LM "
                            "executor's model (a GPU profile: ptrain's splits evenly)", p, L, V);
        S->xl = 1;
    } else if (D->pp_split == PT_SPLIT_DEFAULT) {
        S->xl = !ours && p > 1 && L % V && (L + 2) % V == 0;
    }
    return PT_OK;
}

/* The plan's checks, every failed one reported (the model's fields under
   the names build/plan's options give them, and the field); fills S's
   sizes and D's resolved schedule and chunks. */
static pt_status pt__plan_check(pt__sim *S, pt_plan_desc *D, const pt_hw *hw) {
    pt_gpt_desc *md = &D->model;
    const pt_gpt_config *cf = &md->config;
    int bad = 0;
    if (md->chunks < 1) md->chunks = pt__sched_chunks(md->schedule, 0);
    md->schedule = pt__sched_resolve(md->schedule, md->chunks);
#define PT__POS(name, field, v)                                                               \
    if ((v) < 1) pt__append_error(&bad, name "=%d" field " must be >= 1", v);
    PT__POS("layers", " (model.config.n_layer)", cf->n_layer)
    PT__POS("hidden", " (model.config.n_embd)", cf->n_embd)
    PT__POS("heads", " (model.config.n_head)", cf->n_head)
    PT__POS("seq", " (model.seq)", md->seq)
    PT__POS("vocab", " (model.config.vocab_size)", cf->vocab_size)
    PT__POS("tp", "", D->tp) PT__POS("pp", "", D->pp) PT__POS("gpus", "", D->gpus)
    PT__POS("batch", "", D->batch) PT__POS("micro-batch", " (model.batch)", md->batch)
#undef PT__POS
    if (bad) return PT_ERR_CONFIG;
    if (cf->n_embd % cf->n_head)
        pt__append_error(&bad, "hidden=%d is not divisible by heads=%d (model.config.n_embd, "
                         "n_head)", cf->n_embd, cf->n_head);
    if (cf->n_head % D->tp)
        pt__append_error(&bad, "tp=%d does not divide heads=%d (model.config.n_head)", D->tp,
                         cf->n_head);
    S->cp = D->cp > 1 ? D->cp : 1;
    if (D->cp < 0) pt__append_error(&bad, "cp=%d must be >= 0", D->cp);
    else if (md->context_parallel > 1 && md->context_parallel != S->cp)
        pt__append_error(&bad, "model.context_parallel=%d but cp=%d (the plan's cp; a real "
                         "run's desc may carry the same or 0)", md->context_parallel, S->cp);
    if (md->sequence_parallel < 0 || md->sequence_parallel > 1)
        pt__append_error(&bad, "model.sequence_parallel=%d must be 0 or 1", md->sequence_parallel);
    if ((unsigned)D->attention > PT_ATTN_FLASH)
        pt__append_error(&bad, "attention=%d is not PT_ATTN_DEFAULT, _PLAIN or _FLASH",
                         (int)D->attention);
    if (D->grad_accum_pass < 0 || D->grad_accum_pass > 1)
        pt__append_error(&bad, "grad_accum_pass=%d must be 0 or 1", D->grad_accum_pass);
    else if (D->grad_accum_pass && (D->exec ? D->exec : hw->exec) == PT_EXEC_PTRAIN)
        pt__append_error(&bad, "grad_accum_pass with ptrain's executor (its gradients "
                         "accumulate in place)");
    if ((unsigned)D->cp_comm > PT_CP_ALLGATHER)
        pt__append_error(&bad, "cp_comm=%d is not PT_CP_DEFAULT, _RING or _ALLGATHER",
                         (int)D->cp_comm);
    else if (D->cp_comm == PT_CP_ALLGATHER && (D->exec ? D->exec : hw->exec) == PT_EXEC_PTRAIN)
        pt__append_error(&bad, "cp_comm=allgather with ptrain's executor (it runs the ring)");
    if ((unsigned)D->tp_overlap > PT_OVERLAP_OFF || (unsigned)D->pp_overlap > PT_OVERLAP_OFF)
        pt__append_error(&bad, "tp_overlap=%d, pp_overlap=%d: each PT_OVERLAP_DEFAULT, _ON or "
                         "_OFF", (int)D->tp_overlap, (int)D->pp_overlap);
    if (md->seq % (2 * S->cp) && S->cp > 1)
        pt__append_error(&bad, "seq=%d does not split over cp=%d (model.seq %% (2 cp) must be "
                         "0: two chunks a rank)", md->seq, S->cp);
    if (md->sequence_parallel && D->tp > 1 && (md->seq / S->cp) % D->tp)
        pt__append_error(&bad, "seq=%d over cp=%d does not split over tp=%d for sequence "
                         "parallelism (model.seq / cp %% tp must be 0)", md->seq, S->cp, D->tp);
    if (D->gpus % (D->tp * D->pp * S->cp))
        pt__append_error(&bad, "gpus=%d is not a multiple of tp x pp%s = %d", D->gpus,
                         S->cp > 1 ? " x cp" : "", D->tp * D->pp * S->cp);
    S->dp = D->gpus / (D->tp * D->pp * S->cp);
    S->dpw = S->dp * S->cp;
    if (!bad && D->batch % (S->dp * md->batch))
        pt__append_error(&bad, "batch=%d is not divisible by dp x micro-batch = %d x %d",
                         D->batch, S->dp, md->batch);
    if (md->zero < 0 || md->zero > 3) pt__append_error(&bad, "zero=%d must be 0..3", md->zero);
    if ((unsigned)D->overlap > PT_OVERLAP_OFF)
        pt__append_error(&bad, "overlap=%d is not PT_OVERLAP_DEFAULT, _ON or _OFF", (int)D->overlap);
    if (md->bucket_bytes && md->zero >= 2)
        pt__append_error(&bad, "bucket_bytes=%zu with zero=%d: ZeRO 2 and 3 keep one layer's "
                         "gradients at a time, so their buckets are a layer each",
                         md->bucket_bytes, md->zero);
    if (md->bucket_bytes && !bad && S->dpw == 1)
        pt__append_error(&bad, "bucket_bytes=%zu without data parallelism (gpus=%d = tp x pp): "
                         "there are no gradient buckets to reduce", md->bucket_bytes, D->gpus);
    if (md->zero == 3 && D->pp > 1 && (D->exec ? D->exec : hw->exec) == PT_EXEC_PTRAIN)
        pt__append_error(&bad, "zero=3 with pipeline stages (pp=%d) is not simulated for "
                         "ptrain's executor (it runs ZeRO 3 on one stage, as simulated, and under "
                         "stages with whole gradients reduced after the last micro-batch); use "
                         "pp=1", D->pp);
    else if (md->zero == 3 && D->pp > 1)
        pt__append_error(&bad, "zero=3 with pipeline stages (pp=%d): ZeRO 3 shards the layers "
                         "over data parallelism instead; use pp=1", D->pp);
    if (D->pp > 64) pt__append_error(&bad, "pp=%d > 64 stages", D->pp);
    if (!bad && (double)D->batch / ((double)md->batch * S->dp) * D->pp * md->chunks > 1048576.0)
        pt__append_error(&bad, "%d micro-batches x %d virtual stages is more than 2^20 to "
                         "simulate (use a larger micro-batch)", D->batch / (md->batch * S->dp),
                         D->pp * md->chunks);
    if (hw->cores > 0 && D->gpus > hw->per_node)
        pt__append_error(&bad, "gpus=%d > %d ranks of the profile's one machine", D->gpus,
                         hw->per_node);
    if ((unsigned)D->pp_split > PT_SPLIT_EMBED_LOSS)
        pt__append_error(&bad, "pp_split=%d is not PT_SPLIT_DEFAULT, _EVEN or _EMBED_LOSS",
                         (int)D->pp_split);
    if (bad) return PT_ERR_CONFIG;
    S->m = D->batch / (S->dp * md->batch);
    S->V = pt__sched_blocks(md->schedule, D->pp, md->chunks);
    return pt__plan_split(S, D, hw);
}

/* A layer's parameters on one tensor rank: matrices split, vectors whole
   (GPT-2: 12 h^2 / t + 13 h). */
static double pt__sim_layer_params(const pt_gpt_config *cf, double t) {
    pt__spec sp;
    double n = 0.0;
    int k;
    for (k = 0; pt__canon_spec(cf, k, &sp, NULL, 0); k++)
        if (sp.layer == 0) n += sp.cols ? (double)sp.rows * sp.cols / t : (double)sp.rows;
    return n;
}

/* Stage st's chunks from its build's layout o: each block's layers, its
   local layers [clo, chi) (pt__sim.xl: the first block's first and the last
   block's last left out, into ph[], -1 where none). Returns the layers of
   its largest chunk. */
static int pt__plan_chunks(pt__sim *S, int st, const pt__exec_layout *o, int ph[2]) {
    int v = S->d->model.chunks, c, most = 0;
    ph[0] = ph[1] = -1;
    for (c = 0; c < v; c++) {
        int vs = pt__sched_vstage(S->d->model.schedule, S->d->pp, st, c);
        int g0 = S->xl && vs == 0, g1 = S->xl && vs == S->V - 1;
        int lo = o->chunk_lo[c] + g0, hi = o->chunk_hi[c] - g1;
        if (g0) ph[0] = o->chunk_lo[c];
        if (g1) ph[1] = o->chunk_hi[c] - 1;
        S->chunk_layers[vs] = hi - lo;
        S->clo[st * v + c] = lo, S->chi[st * v + c] = hi;
        most = hi - lo > most ? hi - lo : most;
    }
    return most;
}

/* Interleaved: the most layer micro-batches stage st holds at once, its
   list walked (an F holds its chunk's layers until its B), the chunks'
   layers as pt__plan_chunks left them; -1 for the other schedules (slots x
   the largest chunk). */
static double pt__plan_held(const pt__sim *S, int st) {
    const pt_schedule *sch = S->sch;
    int k, n, peak = 0, cur = 0;
    if (!sch || sch->kind != PT_SCHED_INTERLEAVED) return -1.0;
    for (k = 0; k < sch->count[st]; k++) {
        const pt_action *a = &sch->list[st][k];
        if (a->chunk < 0 || (a->kind != PT_ACT_F && a->kind != PT_ACT_B)) continue;
        n = S->chunk_layers[pt__sched_vstage(sch->kind, S->d->pp, st, a->chunk)];
        cur += a->kind == PT_ACT_F ? n : -n;
        peak = cur > peak ? cur : peak;
    }
    return peak;
}

/* Whether ptrain's ZeRO 3 would take the embedding's rows compact
   (pt__z3_sparse_ok: one stage and chunk, a dp group, overlap on, W not apart, wpe if any
   in a bucket with wte's rows; the plan takes the local ranks as threads, on which any dp
   size does) and the work half holds them; if so its collectives on S (else zeros). Each
   F and B all-reduces the mask of the vocab_local rows (MAX) and then the rows some rank
   of the dp group reads with wpe's first T (SUM), floats, in place of wte's buckets.
   Rows read: for tokens drawn uniformly (sim_vs_real's), Vl (1 - (1 - 1/V)^(w N)) of
   w ranks' N tokens each; text repeats its tokens more, so fewer. */
static void pt__sim_z3_compact(pt__sim *S, pt_gpt *m, const pt__exec_layout *o, double N,
                               int dpn) {
    const pt_gpt_exec *x = m->exec;
    double V = m->config.vocab_size, Vl = m->place.vocab_local, C = m->config.n_embd;
    double w = S->dpw, R, f;
    size_t wn = 0;
    S->z3e_mask_s = S->z3e_rows_s = S->z3e_mask_v = S->z3e_rows_v = 0.0;
    if (!S->z3_ov || S->d->pp != 1 || S->d->model.chunks != 1 || w < 2 || o->split || !x ||
        x->tab_wte < 0 || (x->tab_wpe >= 0 && !pt__wpe_with_wte(m, S->d->model.seq, &wn)))
        return;
    R = ceil(Vl * (1.0 - pow(1.0 - 1.0 / V, w * N)));
    if (R * C + (double)wn + 2.0 * Vl + N > (double)o->largest_bucket) return;
    f = 2.0 * (w - 1.0) / w * 4.0; /* (an all-reduce: twice (w-1)/w of its floats) */
    S->z3e_mask_s = pt_hw_comm_seconds(S->hw, PT_COLL_ALL_REDUCE, 4.0 * Vl, S->dpw, dpn);
    S->z3e_rows_s = pt_hw_comm_seconds(S->hw, PT_COLL_ALL_REDUCE, 4.0 * (R * C + (double)wn),
                                       S->dpw, dpn);
    S->z3e_mask_v = f * Vl, S->z3e_rows_v = f * (R * C + (double)wn);
}

/* Pipeline stage st: its meta build (every tp x dp rank of a stage alike),
   its memory, and the costs only it has: the embedding (first), the head
   (last), the gradient sync and optimizer, ZeRO 3's gathers. The stage's
   meta build is the plan's model on this stage's grid (D: the model and its
   layout, pl: the plan). */
static pt_status pt__plan_stage(pt__sim *S, int st, const pt_schedule_report *rep,
                                pt_plan_result *r) {
    const pt_plan_desc *pl = S->d;
    const pt_gpt_desc *D = &pl->model;
    const pt_hw *hw = S->hw;
    pt_grid g;
    pt_gpt m;
    pt_gpt_desc gd = *D;
    pt_plan_mem mem;
    pt__exec_layout o;
    double M = (double)D->batch * D->seq / S->cp, h = D->config.n_embd, t = pl->tp, e = S->elem;
    double Vl, layer_p = pt__sim_layer_params(&D->config, t), pn, gone, held;
    int p = pl->pp, dpn = pl->tp >= hw->per_node ? 1 : hw->per_node / pl->tp, ph[2], most;
    pt_status err;
    memset(&g, 0, sizeof g);
    g.tp = pl->tp, g.dp = S->dpw, g.pp = p, g.pp_rank = st;
    gd.config.block_size = D->seq;
    gd.config.n_layer += 2 * S->xl; /* (the embedding's and the loss's places) */
    gd.meta = 1, gd.inference = 0, gd.grid = &g;
    gd.context_parallel = 0; /* cp is folded into the meta grid's dp (S->dpw) */
    gd.sequence_parallel = S->sp;
    gd.zero = D->zero; /* (ZeRO 3: the executor's buckets, its shards and two gathered halves) */
    if (D->zero == 2 && p > 1) gd.zero = 1; /* FSDP under a pipeline (Llama 3): ZeRO 1's
                                               shards, the gradients sharded too (memory) */
    gd.grad_accum = S->m;
    gd.precision = S->ptrain ? hw->precision : PT_PRECISION_DEFAULT; /* its activations' layout */
    gd.schedule_report = rep;
    if ((err = pt_gpt_init(&m, &gd)) != PT_OK) return err;
    o = pt__exec_layout_of(&m);
    if (st == 0) S->split = o.split;
    most = pt__plan_chunks(S, st, &o, ph);
    gone = ((ph[0] >= 0) + (ph[1] >= 0)) * layer_p;
    held = pt__plan_held(S, st);
    pt__sim_memory(S, &m, held >= 0 ? held : (double)m.mem.slots * most, gone, &mem);
    r->stage[st].mem = mem;
    r->stage[st].layers = m.place.n_layers - (ph[0] >= 0) - (ph[1] >= 0);
    if (mem.total > r->mem.total) r->mem = mem, r->mem_rank = st * pl->tp * S->dpw;
    Vl = m.place.vocab_local;
    pn = (double)m.num_params - gone;
    S->acc_s[st] = pl->grad_accum_pass ? pn * 12.0 / hw->mem_bw * S->share + 2.0 * hw->kernel_s
                                       : 0.0; /* (read bf16 and fp32, write fp32; clear bf16) */
    if (m.place.has_head) {
        double g1 = pt_hw_gemm_seconds(hw, M, Vl, h, 1, e) * S->share;
        double ce = M * Vl * 4.0 / hw->mem_bw * S->share;
        S->head_fwd_flops = 2.0 * M * h * Vl;
        S->head_bwd_flops = 4.0 * M * h * Vl;
        S->head_tp_s = t > 1 ? pt_hw_comm_seconds(hw, PT_COLL_ALL_REDUCE, M * h * e, pl->tp,
                                                  pl->tp) : 0.0;
        S->head_fwd_s = g1 + 3.0 * ce + 2.0 * M * h * e / hw->mem_bw * S->share;
        S->head_bin_s = g1 + 2.0 * ce + S->head_tp_s + 3.0 * M * h * e / hw->mem_bw * S->share;
        S->head_bw_s = pt_hw_gemm_seconds(hw, Vl, h, M, 1, e) * S->share;
    }
    if (m.place.has_embed) {
        S->emb_tp_s = t > 1 ? pt_hw_comm_seconds(hw, PT_COLL_ALL_REDUCE, M * h * e, pl->tp, pl->tp)
                            : 0.0;
        S->emb_fwd_s = 3.0 * M * h * e / hw->mem_bw * S->share + S->emb_tp_s;
        S->emb_bwd_s = M * h * (e + 4.0) / hw->mem_bw * S->share;
    }
    /* after the last backward: the gradients over the dp group, wte's two
       copies summed (first and last stage), the optimizer on this rank's part.
       ptrain's executor, and any overlap, go bucket by bucket (the meta
       build's); Megatron-LM reduced its one gradient buffer whole (one bucket). */
    if (S->dpw > 1 && (D->zero < 3 || S->z3)) {
        int whole = !S->ptrain && !S->overlap, b, lf, n;
        S->nbk[st] = whole ? 1 : o.num_buckets;
        S->bk[st] = (pt__sim_bucket *)pt__malloc(sizeof(pt__sim_bucket) * (size_t)S->nbk[st], NULL);
        S->lbk[st] = (int *)pt__malloc(sizeof(int) * (size_t)(m.place.n_layers + 1), NULL);
        if (!S->bk[st] || !S->lbk[st]) {
            pt_gpt_free(&m);
            return pt__fail(PT_ERR_OOM, "cannot allocate the simulated buckets");
        }
        for (b = 0; b <= m.place.n_layers; b++) S->lbk[st][b] = 0;
        for (b = 0; b < S->nbk[st]; b++) {
            pt__sim_bucket *k = &S->bk[st][b];
            /* gradients at gb bytes an element, the weights gathered at e */
            double n_el = whole ? pn : (double)o.buckets[b].numel, w = S->dpw;
            if (!whole && o.buckets[b].nl) /* the places' share gone */
                n_el -= ((ph[0] >= o.buckets[b].lf && ph[0] < o.buckets[b].lf + o.buckets[b].nl) +
                         (ph[1] >= o.buckets[b].lf && ph[1] < o.buckets[b].lf + o.buckets[b].nl)) *
                        layer_p;
            double bytes = n_el * S->gb, gbytes = n_el * e;
            k->red_s = pt_hw_comm_seconds(hw, D->zero ? PT_COLL_REDUCE_SCATTER : PT_COLL_ALL_REDUCE,
                                          bytes, S->dpw, dpn);
            k->gat_s = D->zero ? pt_hw_comm_seconds(hw, PT_COLL_ALL_GATHER, gbytes, S->dpw, dpn)
                               : 0.0;
            k->gat_v = D->zero ? (w - 1.0) / w * gbytes : 0.0;
            k->red_v = (D->zero ? 1.0 : 2.0) * (w - 1.0) / w * bytes;
            k->lf = -1, k->n = 0;
            if (!whole && o.buckets[b].nl) {
                lf = o.buckets[b].lf, n = o.buckets[b].nl;
                if (lf == ph[0]) lf++, n--; /* (a place, not a layer: no gradients) */
                if (lf + n - 1 == ph[1]) n--;
                if (n > 0)
                    for (k->lf = lf, k->n = n; n > 0; n--) S->lbk[st][lf + n - 1] = b;
            }
            if (!S->z3) S->dp_s[st] += k->red_s + k->gat_s; /* (ZeRO 3: inside F and B) */
        }
        if (S->z3) { /* the halves held after an F (as B begins) and after a B */
            int *h = S->z3_held + st * 4;
            pt__sim_z3_compact(S, &m, &o, M, dpn);
            h[0] = h[1] = -1;
            pt__sim_z3_pass(S, st, PT_ACT_F, 0.0, 0.0, 0.0, h);
            h[2] = h[0], h[3] = h[1];
            pt__sim_z3_pass(S, st, PT_ACT_B, 0.0, 0.0, 0.0, h + 2);
        }
    }
    if (p > 1 && m.place.has_embed != m.place.has_head) /* ZB-V: both on stage 0, one copy */
        S->opt_x[st] += pt_hw_comm_seconds(hw, PT_COLL_ALL_REDUCE, Vl * h * e, 2,
                                           pl->tp * S->dpw * (p - 1) < hw->per_node ? 2 : 1);
    r->stage[st].dp_bytes = S->dpw > 1 && D->zero < 3 ? (D->zero ? 2.0 : 1.0) * pn * e : 0.0;
    if (D->schedule == PT_SCHED_CHIMERA) { /* the replicas' all-reduce with stage p-1-s,
                                              (p-1-2s) x tp x dp world ranks away: every
                                              gradient (REDUCE), or with ZeRO this rank's
                                              dp shard after the reduce-scatter (in OPT) */
        int gap = (p - 1 - 2 * st < 0 ? 2 * st + 1 - p : p - 1 - 2 * st) * pl->tp * S->dpw;
        double bytes = (D->zero ? (double)o.shard_total : pn) * e;
        double t = pt_hw_comm_seconds(hw, PT_COLL_ALL_REDUCE, bytes, 2, gap < hw->per_node ? 2 : 1);
        if (D->zero) S->opt_x[st] += t;
        else S->pair_s[st] = t;
        r->stage[st].dp_bytes += bytes;
    }
    S->dp_s[st] += S->opt_x[st];
    S->opt_c[st] = (D->zero ? (double)o.shard_total : pn) * (28.0 + e) / hw->mem_bw *
                       S->share + hw->kernel_s * 4;
    S->opt_s[st] = S->dp_s[st] + S->opt_c[st];
    S->dp_x[st] = S->dp_s[st];
    /* ZeRO 3 on a GPU profile (DeepSpeed in Megatron-LM 2021's Table 2): a layer's weights
       gathered over dp before each use, beside its compute (NCCL's kernels on the SMs:
       comm_sm), B's reduce-scatter as one more gather. ptrain's executor runs its buckets
       one after another on the rank's cores and waits for each reduce-scatter, which
       pt__sim_z3_pass follows event by event; DeepSpeed's streams run gathers, reductions
       and compute at once, which that order does not describe (its rows fit this form) */
    S->zero3_s[st] = D->zero == 3 && S->dpw > 1 && !S->ptrain
                         ? pt_hw_comm_seconds(hw, PT_COLL_ALL_GATHER, layer_p * e, S->dpw, dpn)
                         : 0.0;
    pt_gpt_free(&m);
    return PT_OK;
}

/* Overlap on stage st, from its actions' starts (at) in the last run: the
   gathers the last update left run one at a time in the forward's order
   from the step's start, and the first forward of each chunk waits for a
   layer's before computing it; the step's last backward (W when split) of a
   layer finishes it, a bucket of whole layers starts its reduction when its
   last layer is done, and the link takes the buckets in turn; after
   backward the other buckets (the vocabulary's runs, the final norm) and
   ZeRO 2's are reduced, then OPT updates. Sets the chunks' waits and OPT's
   time; returns how much they moved. With trace, adds the bucket
   transfers to it. */
static double pt__sim_overlap(pt__sim *S, const pt_schedule *sch, int st, const double *at,
                              pt_trace *trace) {
    const pt_plan_desc *D = S->d;
    const pt__sim_bucket *bk = S->bk[st];
    int nb = S->nbk[st], v = D->model.chunks, k, b, c, l, emb_b = 0;
    int cnt = sch->count[st];
    double tl = 0.0, moved = 0.0, t, opt_at = at[cnt - 1], wait_sum = 0.0, after = 0.0;
    double *g_end, *ready, *done;
    for (c = 0, l = 0; c < v; c++) l = l > S->chi[st * v + c] ? l : S->chi[st * v + c];
    g_end = (double *)pt__malloc(sizeof(double) * (size_t)(2 * nb + l + 1), NULL);
    if (!g_end) return 0.0;
    ready = g_end + nb, done = ready + nb;
    /* the gathers: one at a time in the table's order */
    for (b = 0; b < nb; b++) {
        if (trace && bk[b].gat_s > 0) /* (the last update's: begun before the step) */
            pt_trace_add(trace, st, PT_TRACE_DP_GATHER, b, -1, -1, tl, bk[b].gat_s);
        g_end[b] = tl += bk[b].gat_s;
        ready[b] = -1.0;
    }
    while (emb_b < nb && bk[emb_b].lf < 0) emb_b++; /* those before the first layer */
    for (k = 0; k < cnt; k++) {
        const pt_action *a = &sch->list[st][k];
        int vs = a->chunk >= 0 ? pt__sched_vstage(D->model.schedule, D->pp, st, a->chunk) : -1;
        int lo, hi, fin = 0, first_f;
        double pre, per, post, dur, r;
        if (a->chunk < 0 || (a->kind != PT_ACT_F && a->kind != PT_ACT_B && a->kind != PT_ACT_W))
            continue;
        c = a->chunk, lo = S->clo[st * v + c], hi = S->chi[st * v + c];
        first_f = a->kind == PT_ACT_F && a->micro == S->first_f[st * v + c];
        /* the action's parts at its modeled time (the cores' share, the tests' scale) */
        pt__sim_parts(S, a->kind, vs, &pre, &per, &post);
        dur = pt__sim_action(S, st, a, 0) - (first_f ? S->fwait[st * v + c] : 0.0);
        r = pre + (hi - lo) * per + post > 0.0 ? dur / (pre + (hi - lo) * per + post) : 0.0;
        pre *= r, per *= r, post *= r;
        if (first_f) { /* each layer waits for its bucket's gather */
            double w;
            t = at[k];
            for (b = 0; vs == 0 && b < emb_b; b++) t = t > g_end[b] ? t : g_end[b];
            t += pre;
            for (l = lo; l < hi; l++) {
                double g = g_end[S->lbk[st][l]];
                t = (t > g ? t : g) + per;
            }
            if (vs == S->V - 1) t = t > g_end[nb - 1] ? t : g_end[nb - 1];
            w = t + post - at[k] - dur;
            w = w > 0.0 ? w : 0.0;
            moved += fabs(w - S->fwait[st * v + c]);
            S->fwait[st * v + c] = w;
            wait_sum += w;
        }
        /* the step's last backward of each layer: B (the descending layers after
           the head), or W (ascending) when split */
        if (a->kind == PT_ACT_B && !S->split) {
            t = at[k] + pre;
            for (l = hi - 1; l >= lo; l--) done[l] = t += per;
            fin = 1;
        } else if (a->kind == PT_ACT_W) {
            t = at[k];
            for (l = lo; l < hi; l++) done[l] = t += per;
            fin = 1;
        }
        for (b = 0; fin && b < nb; b++) /* later actions of a chunk overwrite earlier ones */
            if (bk[b].lf >= lo && bk[b].lf < hi) {
                double rd = 0.0;
                for (l = bk[b].lf; l < bk[b].lf + bk[b].n; l++) rd = rd > done[l] ? rd : done[l];
                ready[b] = rd;
            }
    }
    /* the reductions: whole-layer buckets as they become ready, on the link
       after the gathers; then the rest after backward */
    for (;;) {
        int next = -1;
        for (b = 0; S->ov_reduce && b < nb; b++)
            if (bk[b].lf >= 0 && ready[b] >= 0.0 && (next < 0 || ready[b] < ready[next])) next = b;
        if (next < 0) break;
        t = tl > ready[next] ? tl : ready[next];
        k = 0; /* the last action begun by t */
        while (k + 1 < cnt && at[k + 1] <= t) k++;
        if (trace) pt_trace_add(trace, st, PT_TRACE_DP_REDUCE, next, -1, k, t, bk[next].red_s);
        tl = t + bk[next].red_s;
        ready[next] = -2.0; /* on its way */
    }
    t = tl > opt_at ? tl : opt_at;
    for (b = 0; b < nb; b++)
        if (ready[b] != -2.0) {
            if (trace) pt_trace_add(trace, st, PT_TRACE_DP_REDUCE, b, -1, cnt - 1, t, bk[b].red_s);
            t += bk[b].red_s;
        }
    after = t - opt_at + S->opt_x[st];
    moved += fabs(after + S->opt_c[st] - S->opt_s[st]);
    S->opt_s[st] = after + S->opt_c[st];
    S->dp_x[st] = after + wait_sum;
    S->dp_h[st] = S->dp_s[st] - S->dp_x[st] > 0.0 ? S->dp_s[st] - S->dp_x[st] : 0.0;
    if (S->hw->comm_cpu > 0 && S->dp_s[st] > 0) { /* the hidden share of the bytes, on the cores */
        double vol = 0.0, busy = S->busy[st] - wait_sum, f;
        for (b = 0; b < nb; b++) vol += (S->ov_reduce ? bk[b].red_v : 0.0) + bk[b].gat_v;
        f = busy > 0 ? 1.0 + S->hw->comm_cpu * vol * S->dp_h[st] / S->dp_s[st] / (busy / S->slow[st])
                     : 1.0;
        moved += fabs(f - S->slow[st]) * busy;
        S->slow[st] = f;
    }
    pt__free(g_end, NULL);
    return moved;
}

/* Without overlap, the trace's bucket transfers inside OPT (action opt of
   the list, begun at opt_at): the reductions, then the updates' gathers. */
static void pt__sim_dp_trace(const pt__sim *S, int st, int opt, double opt_at, pt_trace *trace) {
    double t = opt_at;
    int b;
    for (b = 0; b < S->nbk[st]; b++) {
        pt_trace_add(trace, st, PT_TRACE_DP_REDUCE, b, -1, opt, t, S->bk[st][b].red_s);
        t += S->bk[st][b].red_s;
    }
    for (b = 0; b < S->nbk[st]; b++)
        if (S->bk[st][b].gat_s > 0) {
            pt_trace_add(trace, st, PT_TRACE_DP_GATHER, b, -1, opt, t, S->bk[st][b].gat_s);
            t += S->bk[st][b].gat_s;
        }
}

/* The step: every stage's list with the modeled costs (with overlap, run
   again until the waits it adds settle); each stage's end and the last
   optimizer start (*span) into r; the actions into trace, OPT as its
   update alone, the dp transfers in their lane. */
static pt_status pt__plan_timeline(pt__sim *S, const pt_schedule *sch, pt_plan_result *r,
                                   pt_trace *trace, double *span) {
    int p = S->d->pp, st, k, i, it;
    size_t total = 0;
    double *start, *clock, moved;
    pt__sched_costs costs;
    pt_status err;
    costs.cost = pt__sim_cost_cb, costs.ctx = S;
    for (st = 0; st < p; st++) total += (size_t)sch->count[st];
    start = (double *)pt__malloc(sizeof(double) * (total + (size_t)p), NULL);
    if (!start) return pt__fail(PT_ERR_OOM, "cannot allocate the simulated timeline");
    clock = start + total;
    for (it = 0;; it++) {
        for (st = 0; st < p; st++) { /* each run counts its actions afresh */
            S->busy[st] = S->flops[st] = S->hwflops[st] = S->tp_s[st] = S->pp_s[st] = 0.0;
            S->stage[st].tp_bytes = S->stage[st].pp_bytes = 0.0;
        }
        err = pt__sched_run(sch, NULL, start, &costs, clock);
        if (err != PT_OK || !S->overlap || it == 8) break;
        for (st = 0, i = 0, moved = 0.0; st < p; i += sch->count[st], st++)
            if (S->nbk[st]) moved += pt__sim_overlap(S, sch, st, start + i, NULL);
        if (moved <= 1e-9 * (clock[0] + 1e-9) && it > 0) break;
    }
    for (st = 0, i = 0; err == PT_OK && st < p; st++) {
        double opt_at = start[i + sch->count[st] - 1];
        *span = opt_at > *span ? opt_at : *span;
        r->step_time = clock[st] > r->step_time ? clock[st] : r->step_time;
        for (k = 0; trace && err == PT_OK && k < sch->count[st]; k++) {
            const pt_action *a = &sch->list[st][k];
            double dur = pt__sim_action(S, st, a, 0), at = start[i + k];
            if (a->kind == PT_ACT_OPT && dur > S->opt_c[st]) /* the update alone */
                at += dur - S->opt_c[st], dur = S->opt_c[st];
            if (dur > 0) err = pt_trace_add(trace, st, a->kind, a->micro, a->chunk, k, at, dur);
        }
        if (trace && err == PT_OK && S->dpw > 1 && !S->z3) { /* (ZeRO 3's: inside F and B) */
            if (S->overlap && S->nbk[st]) pt__sim_overlap(S, sch, st, start + i, trace);
            else pt__sim_dp_trace(S, st, sch->count[st] - 1, start[i + sch->count[st] - 1], trace);
        }
        i += sch->count[st];
    }
    pt__free(start, NULL);
    return err;
}

/* The result's totals from the stages, the busiest one's parts. */
static void pt__plan_summary(const pt__sim *S, double span, pt_plan_result *r) {
    const pt_plan_desc *D = S->d;
    double busy = 0.0, worst = -1.0;
    int w = 0, st, p = D->pp;
    for (st = 0; st < p; st++) {
        r->stage[st].busy_s = S->busy[st];
        r->stage[st].hw_flops = S->hwflops[st];
        busy += S->busy[st];
        r->hw_flops += S->hwflops[st], r->model_flops += S->flops[st];
        if (S->busy[st] + S->opt_s[st] + S->pair_s[st] > worst)
            worst = S->busy[st] + S->opt_s[st] + S->pair_s[st], w = st;
    }
    /* a stage's FLOPs are one of its tp ranks' times tp, over dp replicas */
    r->hw_flops *= (double)D->tp * S->dpw;
    r->model_flops *= (double)D->tp * S->dpw;
    r->bubble_fraction = span > 0 ? 1.0 - busy / (p * span) : 0.0;
    /* dp communication: the dp reduction, and Chimera's replica all-reduce */
    r->tp_comm_s = S->tp_s[w], r->pp_comm_s = S->pp_s[w], r->dp_comm_s = S->dp_x[w] + S->pair_s[w];
    r->dp_comm_s += S->z3_x[w]; /* (ZeRO 3 on ptrain's executor: what F and B waited for) */
    r->dp_hidden_s = S->dp_h[w] + S->z3_h[w], r->dp_buckets = S->nbk[w];
    r->optimizer_s = S->opt_c[w];
    r->comm_exposed = r->tp_comm_s + r->pp_comm_s + r->dp_comm_s;
    r->compute_s = S->busy[w] - r->tp_comm_s - r->pp_comm_s - S->z3_x[w]; /* (busy holds the
                                                                     gathers' waits) */
    if (S->overlap) {
        double wsum = 0.0;
        int c;
        for (c = 0; c < D->model.chunks; c++) wsum += S->fwait[w * D->model.chunks + c];
        r->compute_s -= wsum;
    }
    r->tflops_per_gpu = r->hw_flops / (r->step_time * D->gpus) / 1e12;
    r->model_tflops_per_gpu = r->model_flops / (r->step_time * D->gpus) / 1e12;
    r->percent_of_peak = 100.0 * r->tflops_per_gpu * 1e12 / S->hw->peak_flops;
    r->tokens_per_s = (double)D->batch * D->model.seq / r->step_time;
    r->train_seconds = D->train_tokens > 0 ? D->train_tokens / r->tokens_per_s : 0.0;
    r->fits = 1;
}

/* One simulated step, each rank's compute slowed by share (ranks sharing
   cores) and each action kind's time by scale (NULL: as modeled): checks,
   the schedule, every stage's build and costs, the memory verdict, the
   timeline, the totals. */
static pt_status pt__plan_run(const pt_plan_desc *d, const pt_hw *hw, double share,
                              const double *scale, pt_plan_result *r, pt_trace *trace) {
    pt__sim S;
    pt_schedule sch;
    pt_schedule_report rep;
    pt_plan_desc D = *d;
    const pt_gpt_desc *md = &D.model; /* the model and its layout */
    int p, v, st;
    double t0 = pt_time_now(), span = 0.0;
    pt_status err;
    memset(r, 0, sizeof *r);
    memset(&S, 0, sizeof S);
    memset(&sch, 0, sizeof sch);
    if ((err = pt__plan_check(&S, &D, hw)) != PT_OK) return err;
    p = D.pp, v = md->chunks;
    S.d = &D;
    S.hw = hw;
    S.ptrain = (D.exec ? D.exec : hw->exec) == PT_EXEC_PTRAIN;
    S.elem = S.ptrain ? 4.0 : 2.0;
    S.gb = !S.ptrain && hw->grad_bytes > 0 ? hw->grad_bytes : S.elem;
    S.sp = D.model.sequence_parallel && D.tp > 1; /* with tp 1: nothing to split */
    S.flash = D.attention == PT_ATTN_FLASH;
    S.cp_ag = D.cp_comm == PT_CP_ALLGATHER;
    /* (ptrain's executor: its own overlap of sends is in its schedule's costs) */
    S.tp_ov = D.tp_overlap ? D.tp_overlap == PT_OVERLAP_ON
                           : D.overlap == PT_OVERLAP_ON && !S.ptrain;
    S.pp_ov = D.pp_overlap ? D.pp_overlap == PT_OVERLAP_ON
                           : D.overlap == PT_OVERLAP_ON && !S.ptrain;
    S.share = share;
    S.scale = scale;
    r->dp = S.dp;
    r->micro_batches = S.m;
    r->schedule = md->schedule;
    r->chunks = v;
    r->pp_split = S.xl ? PT_SPLIT_EMBED_LOSS : PT_SPLIT_EVEN;
    /* overlap as the executor runs it: with a dp group, not Chimera's or 2BW's
       (they reduce at their own points), not ZeRO 3 (it gathers every use) */
    S.overlap = (D.overlap == PT_OVERLAP_ON || (D.overlap == PT_OVERLAP_DEFAULT && S.ptrain)) &&
                S.dpw > 1 && md->zero < 3 && md->schedule != PT_SCHED_CHIMERA &&
                md->schedule != PT_SCHED_2BW;
    S.z3 = S.ptrain && md->zero == 3 && S.dpw > 1;
    S.z3_ov = S.z3 && D.overlap != PT_OVERLAP_OFF; /* (the executor's default: on) */
    S.ov_reduce = S.overlap && (md->zero < 2 || p > 1); /* (ZeRO 2 reduces inside backward
                                                           either way; under a pipeline once,
                                                           after the last micro-batch) */
    S.chunk_layers = (int *)pt__malloc(sizeof(int) * (size_t)S.V, NULL);
    S.opt_s = (double *)pt__malloc(sizeof(double) * (size_t)p * (18 + v), NULL);
    S.bk = (pt__sim_bucket **)pt__malloc(sizeof(void *) * (size_t)p * 2, NULL);
    S.nbk = (int *)pt__malloc(sizeof(int) * (size_t)p * (5 + 3 * v), NULL);
    if (!S.chunk_layers || !S.opt_s || !S.bk || !S.nbk) {
        pt__free(S.chunk_layers, NULL), pt__free(S.opt_s, NULL);
        pt__free(S.bk, NULL), pt__free(S.nbk, NULL);
        return pt__fail(PT_ERR_OOM, "cannot allocate the simulator's state");
    }
    memset(S.chunk_layers, 0, sizeof(int) * (size_t)S.V);
    memset(S.opt_s, 0, sizeof(double) * (size_t)p * (18 + v));
    memset(S.bk, 0, sizeof(void *) * (size_t)p * 2);
    memset(S.nbk, 0, sizeof(int) * (size_t)p * (5 + 3 * v));
    S.dp_s = S.opt_s + p, S.zero3_s = S.dp_s + p, S.busy = S.zero3_s + p, S.flops = S.busy + p;
    S.hwflops = S.flops + p, S.tp_s = S.hwflops + p, S.pp_s = S.tp_s + p, S.pair_s = S.pp_s + p;
    S.opt_c = S.pair_s + p, S.opt_x = S.opt_c + p, S.dp_x = S.opt_x + p, S.dp_h = S.dp_x + p;
    S.fwait = S.dp_h + p, S.slow = S.fwait + p * v, S.z3_x = S.slow + p, S.z3_h = S.z3_x + p;
    S.acc_s = S.z3_h + p;
    for (st = 0; st < p; st++) S.slow[st] = 1.0;
    S.lbk = (int **)(S.bk + p);
    S.clo = S.nbk + p, S.chi = S.clo + p * v, S.first_f = S.chi + p * v;
    S.z3_held = S.first_f + p * v;
    S.stage = r->stage;
    pt__layer_costs(&S);
    if ((err = pt_schedule_build(&sch, md->schedule, p, v, S.m)) == PT_OK)
        err = pt_schedule_check(&sch, &rep);
    S.sch = err == PT_OK ? &sch : NULL;
    for (st = 0; st < p && err == PT_OK; st++) err = pt__plan_stage(&S, st, &rep, r);
    for (st = 0; st < p && err == PT_OK; st++) { /* each chunk's first forward */
        int k, c;
        for (c = 0; c < v; c++) S.first_f[st * v + c] = -1;
        for (k = sch.count[st] - 1; k >= 0; k--)
            if (sch.list[st][k].kind == PT_ACT_F)
                S.first_f[st * v + sch.list[st][k].chunk] = sch.list[st][k].micro;
    }
    if (err == PT_OK && r->mem.total + r->mem.transient > hw->mem_bytes) /* no step for a plan
                                                                          that cannot run */
        err = pt__fail(PT_ERR_OOM, "out of memory on rank %d: needs %.1f GiB (weights %.1f, "
                       "gradients %.1f, optimizer %.1f, activations %.1f + %.1f recomputed), has "
                       "%.1f GiB", r->mem_rank, (r->mem.total + r->mem.transient) / 1073741824.0,
                       r->mem.params / 1073741824.0, r->mem.grads / 1073741824.0,
                       r->mem.optimizer / 1073741824.0, r->mem.activations / 1073741824.0,
                       r->mem.transient / 1073741824.0, hw->mem_bytes / 1073741824.0);
    if (err == PT_OK) { /* activations to the next stage (Megatron: 1/t over the network,
                           then gathered in the node; with sp each rank's 1/t is all it
                           needs); with pp_overlap the link runs behind compute */
        double bytes = (double)md->batch * md->seq / S.cp * md->config.n_embd * S.elem;
        int across = D.tp * S.dpw >= hw->per_node;
        if (S.sp)
            S.p2p_s = p > 1 ? pt_hw_comm_seconds(hw, PT_COLL_P2P, bytes / D.tp, 2, across ? 1 : 2)
                            : 0.0;
        else if (!S.ptrain && D.tp > 1)
            S.p2p_s = pt_hw_comm_seconds(hw, PT_COLL_P2P, bytes / D.tp, 2, across ? 1 : 2) +
                      pt_hw_comm_seconds(hw, PT_COLL_ALL_GATHER, bytes, D.tp, D.tp);
        else
            S.p2p_s = p > 1 ? pt_hw_comm_seconds(hw, PT_COLL_P2P, bytes, 2, across ? 1 : 2) : 0.0;
        if (S.pp_ov && S.p2p_s > hw->kernel_s) S.p2p_s = hw->kernel_s;
        S.p2p_bytes = bytes;
    }
    r->build_seconds = pt_time_now() - t0;
    if (err == PT_OK) err = pt__plan_timeline(&S, &sch, r, trace, &span);
    if (err == PT_OK) pt__plan_summary(&S, span, r);
    pt_schedule_free(&sch);
    for (st = 0; st < p; st++) pt__free(S.bk[st], NULL), pt__free(S.lbk[st], NULL);
    pt__free(S.chunk_layers, NULL);
    pt__free(S.opt_s, NULL);
    pt__free(S.bk, NULL);
    pt__free(S.nbk, NULL);
    return err;
}

PTRAINDEF pt_status pt_plan_simulate(const pt_plan_desc *d, const pt_hw *hw, pt_plan_result *r,
                                     pt_trace *trace) {
    return pt_plan_simulate_scaled(d, hw, NULL, r, trace);
}

/* On this machine (cores > 0) the R ranks share its cores: fewer ranks than
   cores split the all-core rates R ways; as many or more run at one
   thread's rates, R/cores of them to a core, and share the memory
   bandwidth. */
PTRAINDEF pt_status pt_plan_simulate_scaled(const pt_plan_desc *d, const pt_hw *hw,
                                            const double *scale, pt_plan_result *r,
                                            pt_trace *trace) {
    pt_hw H = *hw;
    int R = d->gpus < hw->per_node ? d->gpus : hw->per_node;
    double share = 1.0;
    pt_status st;
    if (hw->cores > 0 && R >= hw->cores && hw->core_flops > 0) {
        H.peak_flops = hw->core_flops, H.gemm_eff = hw->core_gemm_eff;
        H.gemm_dim = hw->core_gemm_dim, H.attn_flops = hw->core_attn_flops;
        H.kernel_s = hw->core_kernel_s;
        /* memory bandwidth: the machine's, shared by the ranks running at once */
        H.mem_bw = hw->core_mem_bw < hw->mem_bw / hw->cores ? hw->core_mem_bw
                                                            : hw->mem_bw / hw->cores;
        share = (double)R / hw->cores;
    } else if (hw->cores > 0) {
        share = R;
    }
    st = pt__plan_run(d, &H, share, scale, r, trace);
    r->percent_of_peak = 100.0 * r->tflops_per_gpu * 1e12 / hw->peak_flops;
    return st;
}

/* The search's running state: the n best so far, fastest first; the losers counted. */
typedef struct pt__search {
    const pt_hw *hw;
    pt_plan_desc *best_desc;
    pt_plan_result *best;
    int n, found, w[2];
    char first_oom[256];
} pt__search;

/* One layout of the search: not one at all (skipped), not dividing (w[0]), out of
   memory (w[1]), or simulated and kept among the n fastest. */
static void pt__search_try(pt__search *Z, const pt_plan_desc *c, int dp) {
    const pt_gpt_desc *cm = &c->model;
    pt_schedule_kind k = cm->schedule;
    int zb = k != PT_SCHED_1F1B && k != PT_SCHED_INTERLEAVED, pp = c->pp, i;
    pt_plan_result r;
    pt_status st;
    /* combinations that are not layouts at all (ZB-V: its V of two chunks, Chimera: two
       replicas' blocks over an even pp; the zero-bubble ones keep activations for W, so no
       full recomputation; ZeRO 3 gathers every use, so no pipeline) */
    if ((cm->chunks > 1 && pp == 1) ||
        (cm->chunks > 1 && zb && k != PT_SCHED_ZB_V && k != PT_SCHED_CHIMERA) ||
        ((k == PT_SCHED_ZB_V || k == PT_SCHED_CHIMERA) && cm->chunks != 2) ||
        (k == PT_SCHED_CHIMERA && pp % 2) || (zb && pp == 1) ||
        (pt__sched_splits(k) && cm->recompute == PT_RECOMPUTE_FULL) ||
        (cm->zero > 2 && pp > 1) || (cm->zero > 0 && dp * (c->cp > 1 ? c->cp : 1) == 1) ||
        pt__sched_blocks(k, pp, cm->chunks) >
            cm->config.n_layer + (c->pp_split == PT_SPLIT_EMBED_LOSS ? 2 : 0))
        return;
    /* the embedding and loss as layers where that evens the blocks out (Llama 3's 128 of
       16 x 8, BLOOM's 72 of 12): elsewhere its blocks are as uneven as the even split's */
    if (c->pp_split == PT_SPLIT_EMBED_LOSS &&
        (cm->config.n_layer + 2) % pt__sched_blocks(k, pp, cm->chunks))
        return;
    if (c->batch % (dp * cm->batch) ||
        ((k == PT_SCHED_INTERLEAVED || k == PT_SCHED_CHIMERA || k == PT_SCHED_2BW) &&
         (c->batch / (dp * cm->batch)) % pp)) {
        Z->w[0]++;
        return;
    }
    st = pt_plan_simulate(c, Z->hw, &r, NULL);
    if (st == PT_ERR_OOM) {
        if (!Z->first_oom[0]) snprintf(Z->first_oom, sizeof Z->first_oom, "%.250s", pt_last_error());
        Z->w[1]++;
        return;
    }
    if (st != PT_OK) {
        Z->w[0]++;
        return;
    }
    for (i = Z->found < Z->n ? Z->found : Z->n; i > 0 && Z->best[i - 1].step_time > r.step_time;
         i--)
        if (i < Z->n) Z->best[i] = Z->best[i - 1], Z->best_desc[i] = Z->best_desc[i - 1];
    if (i < Z->n) Z->best[i] = r, Z->best_desc[i] = *c;
    Z->found++;
}

PTRAINDEF int pt_plan_search(const pt_plan_desc *d, const pt_hw *hw, pt_plan_desc *best_desc,
                             pt_plan_result *best, int n, int why[3]) {
    static const int micros[] = {1, 2, 4, 8, 16, 32}, chunk_opts[] = {1, 2, 4, 8};
    /* schedules beside 1F1B (interleaved when chunks > 1): the zero-bubble ones,
       Chimera, and PipeDream-2BW (asynchronous: it trains by another rule, so
       whoever prints a search marks it) */
    static const pt_schedule_kind zbs[6] = {PT_SCHED_DEFAULT, PT_SCHED_ZB_H1, PT_SCHED_ZB_H2,
                                            PT_SCHED_ZB_V, PT_SCHED_CHIMERA, PT_SCHED_2BW};
    static const pt_plan_split splits[2] = {PT_SPLIT_EVEN, PT_SPLIT_EMBED_LOSS};
    int tp, pp, cp, mi, ci, z, rc, zb, sp;
    int layers = d->model.config.n_layer, heads = d->model.config.n_head, seq = d->model.seq;
    int megatron = (d->exec ? d->exec : hw->exec) != PT_EXEC_PTRAIN;
    pt__search Z;
    memset(&Z, 0, sizeof Z);
    Z.hw = hw, Z.best_desc = best_desc, Z.best = best, Z.n = n;
    /* tensor parallelism in a node; context parallelism (a ring over each sequence) where a
       rank keeps 8192 tokens or more, as Llama 3 ran it (cp 16 at 131072 tokens, 8192 without)
       and its ring's transfers hide behind the blocks computed; the pipeline's split of the
       layers: even, and on Megatron-LM's executor the embedding and loss counted as layers */
    for (tp = 1; tp <= hw->per_node && tp <= heads; tp *= 2)
        for (cp = 1; cp == 1 || (seq / cp >= 8192 && seq % (2 * cp) == 0); cp *= 2)
            for (pp = 1; pp <= 64 && pp <= layers; pp++)
                for (sp = 0; sp < (pp > 1 && megatron ? 2 : 1); sp++)
                    for (mi = 0; mi < 6; mi++)
                        for (ci = 0; ci < 4; ci++)
                            for (z = 0; z <= 3; z++)
                                for (rc = 0; rc <= PT_RECOMPUTE_FULL; rc++)
                                    for (zb = 0; zb < 6; zb++) {
                                        pt_plan_desc c = *d;
                                        pt_gpt_desc *cm = &c.model; /* the layout tried */
                                        if (d->gpus % (tp * pp * cp) || heads % tp) continue;
                                        c.tp = tp, c.pp = pp, c.cp = cp, cm->batch = micros[mi];
                                        c.pp_split = pp > 1 ? splits[sp] : PT_SPLIT_DEFAULT;
                                        cm->chunks = chunk_opts[ci], cm->zero = z;
                                        cm->recompute = rc;
                                        cm->schedule = zb              ? zbs[zb]
                                                       : cm->chunks > 1 ? PT_SCHED_INTERLEAVED
                                                                        : PT_SCHED_1F1B;
                                        pt__search_try(&Z, &c, d->gpus / (tp * pp * cp));
                                    }
    if (why) why[0] = Z.w[0], why[1] = Z.w[1], why[2] = Z.found > 0 ? Z.found - 1 : 0;
    if (!Z.found) pt__fail(PT_ERR_OOM, "%s", Z.first_oom[0] ? Z.first_oom : "no layout divides");
    return Z.found;
}

/* ======================================================================== */
/* >>text (implementation)                                                   */
/* ======================================================================== */

static int pt__readable(const char *path);
static pt_status pt__write_atomic(const char *path, const char *tmp, const void *const *parts,
                                  const size_t *lens, int n);

/* BEGIN pt__uclass: generated by scripts/gen_unicode.py from Unicode 15.0.0
   (UnicodeData.txt, PropList.txt); do not edit. 1562 runs, each start << 2 | class */
static const uint32_t pt__uclass[1562] = {
    0x0000000, 0x0000027, 0x0000038, 0x0000083, 0x0000084, 0x00000c2, 0x00000e8, 0x0000105,
    0x000016c, 0x0000185, 0x00001ec, 0x0000217, 0x0000218, 0x0000283, 0x0000284, 0x00002a9,
    0x00002ac, 0x00002ca, 0x00002d0, 0x00002d5, 0x00002d8, 0x00002e6, 0x00002e9, 0x00002ec,
    0x00002f2, 0x00002fc, 0x0000301, 0x000035c, 0x0000361, 0x00003dc, 0x00003e1, 0x0000b08,
    0x0000b19, 0x0000b48, 0x0000b81, 0x0000b94, 0x0000bb1, 0x0000bb4, 0x0000bb9, 0x0000bbc,
    0x0000dc1, 0x0000dd4, 0x0000dd9, 0x0000de0, 0x0000de9, 0x0000df8, 0x0000dfd, 0x0000e00,
    0x0000e19, 0x0000e1c, 0x0000e21, 0x0000e2c, 0x0000e31, 0x0000e34, 0x0000e39, 0x0000e88,
    0x0000e8d, 0x0000fd8, 0x0000fdd, 0x0001208, 0x0001229, 0x00014c0, 0x00014c5, 0x000155c,
    0x0001565, 0x0001568, 0x0001581, 0x0001624, 0x0001741, 0x00017ac, 0x00017bd, 0x00017cc,
    0x0001881, 0x000192c, 0x0001982, 0x00019a8, 0x00019b9, 0x00019c0, 0x00019c5, 0x0001b50,
    0x0001b55, 0x0001b58, 0x0001b95, 0x0001b9c, 0x0001bb9, 0x0001bc2, 0x0001be9, 0x0001bf4,
    0x0001bfd, 0x0001c00, 0x0001c41, 0x0001c44, 0x0001c49, 0x0001cc0, 0x0001d35, 0x0001e98,
    0x0001ec5, 0x0001ec8, 0x0001f02, 0x0001f29, 0x0001fac, 0x0001fd1, 0x0001fd8, 0x0001fe9,
    0x0001fec, 0x0002001, 0x0002058, 0x0002069, 0x000206c, 0x0002091, 0x0002094, 0x00020a1,
    0x00020a4, 0x0002101, 0x0002164, 0x0002181, 0x00021ac, 0x00021c1, 0x0002220, 0x0002225,
    0x000223c, 0x0002281, 0x0002328, 0x0002411, 0x00024e8, 0x00024f5, 0x00024f8, 0x0002541,
    0x0002544, 0x0002561, 0x0002588, 0x000259a, 0x00025c0, 0x00025c5, 0x0002604, 0x0002615,
    0x0002634, 0x000263d, 0x0002644, 0x000264d, 0x00026a4, 0x00026a9, 0x00026c4, 0x00026c9,
    0x00026cc, 0x00026d9, 0x00026e8, 0x00026f5, 0x00026f8, 0x0002739, 0x000273c, 0x0002771,
    0x0002778, 0x000277d, 0x0002788, 0x000279a, 0x00027c1, 0x00027c8, 0x00027d2, 0x00027e8,
    0x00027f1, 0x00027f4, 0x0002815, 0x000282c, 0x000283d, 0x0002844, 0x000284d, 0x00028a4,
    0x00028a9, 0x00028c4, 0x00028c9, 0x00028d0, 0x00028d5, 0x00028dc, 0x00028e1, 0x00028e8,
    0x0002965, 0x0002974, 0x0002979, 0x000297c, 0x000299a, 0x00029c0, 0x00029c9, 0x00029d4,
    0x0002a15, 0x0002a38, 0x0002a3d, 0x0002a48, 0x0002a4d, 0x0002aa4, 0x0002aa9, 0x0002ac4,
    0x0002ac9, 0x0002ad0, 0x0002ad5, 0x0002ae8, 0x0002af5, 0x0002af8, 0x0002b41, 0x0002b44,
    0x0002b81, 0x0002b88, 0x0002b9a, 0x0002bc0, 0x0002be5, 0x0002be8, 0x0002c15, 0x0002c34,
    0x0002c3d, 0x0002c44, 0x0002c4d, 0x0002ca4, 0x0002ca9, 0x0002cc4, 0x0002cc9, 0x0002cd0,
    0x0002cd5, 0x0002ce8, 0x0002cf5, 0x0002cf8, 0x0002d71, 0x0002d78, 0x0002d7d, 0x0002d88,
    0x0002d9a, 0x0002dc0, 0x0002dc5, 0x0002dca, 0x0002de0, 0x0002e0d, 0x0002e10, 0x0002e15,
    0x0002e2c, 0x0002e39, 0x0002e44, 0x0002e49, 0x0002e58, 0x0002e65, 0x0002e6c, 0x0002e71,
    0x0002e74, 0x0002e79, 0x0002e80, 0x0002e8d, 0x0002e94, 0x0002ea1, 0x0002eac, 0x0002eb9,
    0x0002ee8, 0x0002f41, 0x0002f44, 0x0002f9a, 0x0002fcc, 0x0003015, 0x0003034, 0x0003039,
    0x0003044, 0x0003049, 0x00030a4, 0x00030a9, 0x00030e8, 0x00030f5, 0x00030f8, 0x0003161,
    0x000316c, 0x0003175, 0x0003178, 0x0003181, 0x0003188, 0x000319a, 0x00031c0, 0x00031e2,
    0x00031fc, 0x0003201, 0x0003204, 0x0003215, 0x0003234, 0x0003239, 0x0003244, 0x0003249,
    0x00032a4, 0x00032a9, 0x00032d0, 0x00032d5, 0x00032e8, 0x00032f5, 0x00032f8, 0x0003375,
    0x000337c, 0x0003381, 0x0003388, 0x000339a, 0x00033c0, 0x00033c5, 0x00033cc, 0x0003411,
    0x0003434, 0x0003439, 0x0003444, 0x0003449, 0x00034ec, 0x00034f5, 0x00034f8, 0x0003539,
    0x000353c, 0x0003551, 0x000355c, 0x0003562, 0x000357d, 0x0003588, 0x000359a, 0x00035e4,
    0x00035e9, 0x0003600, 0x0003615, 0x000365c, 0x0003669, 0x00036c8, 0x00036cd, 0x00036f0,
    0x00036f5, 0x00036f8, 0x0003701, 0x000371c, 0x000379a, 0x00037c0, 0x0003805, 0x00038c4,
    0x00038c9, 0x00038d0, 0x0003901, 0x000391c, 0x0003942, 0x0003968, 0x0003a05, 0x0003a0c,
    0x0003a11, 0x0003a14, 0x0003a19, 0x0003a2c, 0x0003a31, 0x0003a90, 0x0003a95, 0x0003a98,
    0x0003a9d, 0x0003ac4, 0x0003ac9, 0x0003ad0, 0x0003af5, 0x0003af8, 0x0003b01, 0x0003b14,
    0x0003b19, 0x0003b1c, 0x0003b42, 0x0003b68, 0x0003b71, 0x0003b80, 0x0003c01, 0x0003c04,
    0x0003c82, 0x0003cd0, 0x0003d01, 0x0003d20, 0x0003d25, 0x0003db4, 0x0003e21, 0x0003e34,
    0x0004001, 0x00040ac, 0x00040fd, 0x0004102, 0x0004128, 0x0004141, 0x0004158, 0x0004169,
    0x0004178, 0x0004185, 0x0004188, 0x0004195, 0x000419c, 0x00041b9, 0x00041c4, 0x00041d5,
    0x0004208, 0x0004239, 0x000423c, 0x0004242, 0x0004268, 0x0004281, 0x0004318, 0x000431d,
    0x0004320, 0x0004335, 0x0004338, 0x0004341, 0x00043ec, 0x00043f1, 0x0004924, 0x0004929,
    0x0004938, 0x0004941, 0x000495c, 0x0004961, 0x0004964, 0x0004969, 0x0004978, 0x0004981,
    0x0004a24, 0x0004a29, 0x0004a38, 0x0004a41, 0x0004ac4, 0x0004ac9, 0x0004ad8, 0x0004ae1,
    0x0004afc, 0x0004b01, 0x0004b04, 0x0004b09, 0x0004b18, 0x0004b21, 0x0004b5c, 0x0004b61,
    0x0004c44, 0x0004c49, 0x0004c58, 0x0004c61, 0x0004d6c, 0x0004da6, 0x0004df4, 0x0004e01,
    0x0004e40, 0x0004e81, 0x0004fd8, 0x0004fe1, 0x0004ff8, 0x0005005, 0x00059b4, 0x00059bd,
    0x0005a03, 0x0005a05, 0x0005a6c, 0x0005a81, 0x0005bac, 0x0005bba, 0x0005bc5, 0x0005be4,
    0x0005c01, 0x0005c48, 0x0005c7d, 0x0005cc8, 0x0005d01, 0x0005d48, 0x0005d81, 0x0005db4,
    0x0005db9, 0x0005dc4, 0x0005e01, 0x0005ed0, 0x0005f5d, 0x0005f60, 0x0005f71, 0x0005f74,
    0x0005f82, 0x0005fa8, 0x0005fc2, 0x0005fe8, 0x0006042, 0x0006068, 0x0006081, 0x00061e4,
    0x0006201, 0x0006214, 0x000621d, 0x00062a4, 0x00062a9, 0x00062ac, 0x00062c1, 0x00063d8,
    0x0006401, 0x000647c, 0x000651a, 0x0006541, 0x00065b8, 0x00065c1, 0x00065d4, 0x0006601,
    0x00066b0, 0x00066c1, 0x0006728, 0x0006742, 0x000676c, 0x0006801, 0x000685c, 0x0006881,
    0x0006954, 0x0006a02, 0x0006a28, 0x0006a42, 0x0006a68, 0x0006a9d, 0x0006aa0, 0x0006c15,
    0x0006cd0, 0x0006d15, 0x0006d34, 0x0006d42, 0x0006d68, 0x0006e0d, 0x0006e84, 0x0006eb9,
    0x0006ec2, 0x0006ee9, 0x0006f98, 0x0007001, 0x0007090, 0x0007102, 0x0007128, 0x0007135,
    0x0007142, 0x0007169, 0x00071f8, 0x0007201, 0x0007224, 0x0007241, 0x00072ec, 0x00072f5,
    0x0007300, 0x00073a5, 0x00073b4, 0x00073b9, 0x00073d0, 0x00073d5, 0x00073dc, 0x00073e9,
    0x00073ec, 0x0007401, 0x0007700, 0x0007801, 0x0007c58, 0x0007c61, 0x0007c78, 0x0007c81,
    0x0007d18, 0x0007d21, 0x0007d38, 0x0007d41, 0x0007d60, 0x0007d65, 0x0007d68, 0x0007d6d,
    0x0007d70, 0x0007d75, 0x0007d78, 0x0007d7d, 0x0007df8, 0x0007e01, 0x0007ed4, 0x0007ed9,
    0x0007ef4, 0x0007ef9, 0x0007efc, 0x0007f09, 0x0007f14, 0x0007f19, 0x0007f34, 0x0007f41,
    0x0007f50, 0x0007f59, 0x0007f70, 0x0007f81, 0x0007fb4, 0x0007fc9, 0x0007fd4, 0x0007fd9,
    0x0007ff4, 0x0008003, 0x000802c, 0x00080a3, 0x00080a8, 0x00080bf, 0x00080c0, 0x000817f,
    0x0008180, 0x00081c2, 0x00081c5, 0x00081c8, 0x00081d2, 0x00081e8, 0x00081fd, 0x0008202,
    0x0008228, 0x0008241, 0x0008274, 0x0008409, 0x000840c, 0x000841d, 0x0008420, 0x0008429,
    0x0008450, 0x0008455, 0x0008458, 0x0008465, 0x0008478, 0x0008491, 0x0008494, 0x0008499,
    0x000849c, 0x00084a1, 0x00084a4, 0x00084a9, 0x00084b8, 0x00084bd, 0x00084e8, 0x00084f1,
    0x0008500, 0x0008515, 0x0008528, 0x0008539, 0x000853c, 0x0008542, 0x000860d, 0x0008616,
    0x0008628, 0x0009182, 0x0009270, 0x00093aa, 0x0009400, 0x0009dda, 0x0009e50, 0x000b001,
    0x000b394, 0x000b3ad, 0x000b3bc, 0x000b3c9, 0x000b3d0, 0x000b3f6, 0x000b3f8, 0x000b401,
    0x000b498, 0x000b49d, 0x000b4a0, 0x000b4b5, 0x000b4b8, 0x000b4c1, 0x000b5a0, 0x000b5bd,
    0x000b5c0, 0x000b601, 0x000b65c, 0x000b681, 0x000b69c, 0x000b6a1, 0x000b6bc, 0x000b6c1,
    0x000b6dc, 0x000b6e1, 0x000b6fc, 0x000b701, 0x000b71c, 0x000b721, 0x000b73c, 0x000b741,
    0x000b75c, 0x000b761, 0x000b77c, 0x000b8bd, 0x000b8c0, 0x000c003, 0x000c004, 0x000c015,
    0x000c01e, 0x000c020, 0x000c086, 0x000c0a8, 0x000c0c5, 0x000c0d8, 0x000c0e2, 0x000c0ed,
    0x000c0f4, 0x000c105, 0x000c25c, 0x000c275, 0x000c280, 0x000c285, 0x000c3ec, 0x000c3f1,
    0x000c400, 0x000c415, 0x000c4c0, 0x000c4c5, 0x000c63c, 0x000c64a, 0x000c658, 0x000c681,
    0x000c700, 0x000c7c1, 0x000c800, 0x000c882, 0x000c8a8, 0x000c922, 0x000c940, 0x000c946,
    0x000c980, 0x000ca02, 0x000ca28, 0x000cac6, 0x000cb00, 0x000d001, 0x0013700, 0x0013801,
    0x0029234, 0x0029341, 0x00293f8, 0x0029401, 0x0029834, 0x0029841, 0x0029882, 0x00298a9,
    0x00298b0, 0x0029901, 0x00299bc, 0x00299fd, 0x0029a78, 0x0029a81, 0x0029b9a, 0x0029bc0,
    0x0029c5d, 0x0029c80, 0x0029c89, 0x0029e24, 0x0029e2d, 0x0029f2c, 0x0029f41, 0x0029f48,
    0x0029f4d, 0x0029f50, 0x0029f55, 0x0029f68, 0x0029fc9, 0x002a008, 0x002a00d, 0x002a018,
    0x002a01d, 0x002a02c, 0x002a031, 0x002a08c, 0x002a0c2, 0x002a0d8, 0x002a101, 0x002a1d0,
    0x002a209, 0x002a2d0, 0x002a342, 0x002a368, 0x002a3c9, 0x002a3e0, 0x002a3ed, 0x002a3f0,
    0x002a3f5, 0x002a3fc, 0x002a402, 0x002a429, 0x002a498, 0x002a4c1, 0x002a51c, 0x002a581,
    0x002a5f4, 0x002a611, 0x002a6cc, 0x002a73d, 0x002a742, 0x002a768, 0x002a781, 0x002a794,
    0x002a799, 0x002a7c2, 0x002a7e9, 0x002a7fc, 0x002a801, 0x002a8a4, 0x002a901, 0x002a90c,
    0x002a911, 0x002a930, 0x002a942, 0x002a968, 0x002a981, 0x002a9dc, 0x002a9e9, 0x002a9ec,
    0x002a9f9, 0x002aac0, 0x002aac5, 0x002aac8, 0x002aad5, 0x002aadc, 0x002aae5, 0x002aaf8,
    0x002ab01, 0x002ab04, 0x002ab09, 0x002ab0c, 0x002ab6d, 0x002ab78, 0x002ab81, 0x002abac,
    0x002abc9, 0x002abd4, 0x002ac05, 0x002ac1c, 0x002ac25, 0x002ac3c, 0x002ac45, 0x002ac5c,
    0x002ac81, 0x002ac9c, 0x002aca1, 0x002acbc, 0x002acc1, 0x002ad6c, 0x002ad71, 0x002ada8,
    0x002adc1, 0x002af8c, 0x002afc2, 0x002afe8, 0x002b001, 0x0035e90, 0x0035ec1, 0x0035f1c,
    0x0035f2d, 0x0035ff0, 0x003e401, 0x003e9b8, 0x003e9c1, 0x003eb68, 0x003ec01, 0x003ec1c,
    0x003ec4d, 0x003ec60, 0x003ec75, 0x003ec78, 0x003ec7d, 0x003eca4, 0x003eca9, 0x003ecdc,
    0x003ece1, 0x003ecf4, 0x003ecf9, 0x003ecfc, 0x003ed01, 0x003ed08, 0x003ed0d, 0x003ed14,
    0x003ed19, 0x003eec8, 0x003ef4d, 0x003f4f8, 0x003f541, 0x003f640, 0x003f649, 0x003f720,
    0x003f7c1, 0x003f7f0, 0x003f9c1, 0x003f9d4, 0x003f9d9, 0x003fbf4, 0x003fc42, 0x003fc68,
    0x003fc85, 0x003fcec, 0x003fd05, 0x003fd6c, 0x003fd99, 0x003fefc, 0x003ff09, 0x003ff20,
    0x003ff29, 0x003ff40, 0x003ff49, 0x003ff60, 0x003ff69, 0x003ff74, 0x0040001, 0x0040030,
    0x0040035, 0x004009c, 0x00400a1, 0x00400ec, 0x00400f1, 0x00400f8, 0x00400fd, 0x0040138,
    0x0040141, 0x0040178, 0x0040201, 0x00403ec, 0x004041e, 0x00404d0, 0x0040502, 0x00405e4,
    0x004062a, 0x0040630, 0x0040a01, 0x0040a74, 0x0040a81, 0x0040b44, 0x0040b86, 0x0040bf0,
    0x0040c01, 0x0040c82, 0x0040c90, 0x0040cb5, 0x0040d06, 0x0040d09, 0x0040d2a, 0x0040d2c,
    0x0040d41, 0x0040dd8, 0x0040e01, 0x0040e78, 0x0040e81, 0x0040f10, 0x0040f21, 0x0040f40,
    0x0040f46, 0x0040f58, 0x0041001, 0x0041278, 0x0041282, 0x00412a8, 0x00412c1, 0x0041350,
    0x0041361, 0x00413f0, 0x0041401, 0x00414a0, 0x00414c1, 0x0041590, 0x00415c1, 0x00415ec,
    0x00415f1, 0x004162c, 0x0041631, 0x004164c, 0x0041651, 0x0041658, 0x004165d, 0x0041688,
    0x004168d, 0x00416c8, 0x00416cd, 0x00416e8, 0x00416ed, 0x00416f4, 0x0041801, 0x0041cdc,
    0x0041d01, 0x0041d58, 0x0041d81, 0x0041da0, 0x0041e01, 0x0041e18, 0x0041e1d, 0x0041ec4,
    0x0041ec9, 0x0041eec, 0x0042001, 0x0042018, 0x0042021, 0x0042024, 0x0042029, 0x00420d8,
    0x00420dd, 0x00420e4, 0x00420f1, 0x00420f4, 0x00420fd, 0x0042158, 0x0042162, 0x0042181,
    0x00421dc, 0x00421e6, 0x0042201, 0x004227c, 0x004229e, 0x00422c0, 0x0042381, 0x00423cc,
    0x00423d1, 0x00423d8, 0x00423ee, 0x0042401, 0x004245a, 0x0042470, 0x0042481, 0x00424e8,
    0x0042601, 0x00426e0, 0x00426f2, 0x00426f9, 0x0042702, 0x0042740, 0x004274a, 0x0042801,
    0x0042804, 0x0042841, 0x0042850, 0x0042855, 0x0042860, 0x0042865, 0x00428d8, 0x0042902,
    0x0042924, 0x0042981, 0x00429f6, 0x00429fc, 0x0042a01, 0x0042a76, 0x0042a80, 0x0042b01,
    0x0042b20, 0x0042b25, 0x0042b94, 0x0042bae, 0x0042bc0, 0x0042c01, 0x0042cd8, 0x0042d01,
    0x0042d58, 0x0042d62, 0x0042d81, 0x0042dcc, 0x0042de2, 0x0042e01, 0x0042e48, 0x0042ea6,
    0x0042ec0, 0x0043001, 0x0043124, 0x0043201, 0x00432cc, 0x0043301, 0x00433cc, 0x00433ea,
    0x0043401, 0x0043490, 0x00434c2, 0x00434e8, 0x0043982, 0x00439fc, 0x0043a01, 0x0043aa8,
    0x0043ac1, 0x0043ac8, 0x0043c01, 0x0043c76, 0x0043c9d, 0x0043ca0, 0x0043cc1, 0x0043d18,
    0x0043d46, 0x0043d54, 0x0043dc1, 0x0043e08, 0x0043ec1, 0x0043f16, 0x0043f30, 0x0043f81,
    0x0043fdc, 0x004400d, 0x00440e0, 0x004414a, 0x00441c0, 0x00441c5, 0x00441cc, 0x00441d5,
    0x00441d8, 0x004420d, 0x00442c0, 0x0044341, 0x00443a4, 0x00443c2, 0x00443e8, 0x004440d,
    0x004449c, 0x00444da, 0x0044500, 0x0044511, 0x0044514, 0x004451d, 0x0044520, 0x0044541,
    0x00445cc, 0x00445d9, 0x00445dc, 0x004460d, 0x00446cc, 0x0044705, 0x0044714, 0x0044742,
    0x0044769, 0x004476c, 0x0044771, 0x0044774, 0x0044786, 0x00447d4, 0x0044801, 0x0044848,
    0x004484d, 0x00448b0, 0x00448fd, 0x0044904, 0x0044a01, 0x0044a1c, 0x0044a21, 0x0044a24,
    0x0044a29, 0x0044a38, 0x0044a3d, 0x0044a78, 0x0044a7d, 0x0044aa4, 0x0044ac1, 0x0044b7c,
    0x0044bc2, 0x0044be8, 0x0044c15, 0x0044c34, 0x0044c3d, 0x0044c44, 0x0044c4d, 0x0044ca4,
    0x0044ca9, 0x0044cc4, 0x0044cc9, 0x0044cd0, 0x0044cd5, 0x0044ce8, 0x0044cf5, 0x0044cf8,
    0x0044d41, 0x0044d44, 0x0044d75, 0x0044d88, 0x0045001, 0x00450d4, 0x004511d, 0x004512c,
    0x0045142, 0x0045168, 0x004517d, 0x0045188, 0x0045201, 0x00452c0, 0x0045311, 0x0045318,
    0x004531d, 0x0045320, 0x0045342, 0x0045368, 0x0045601, 0x00456bc, 0x0045761, 0x0045770,
    0x0045801, 0x00458c0, 0x0045911, 0x0045914, 0x0045942, 0x0045968, 0x0045a01, 0x0045aac,
    0x0045ae1, 0x0045ae4, 0x0045b02, 0x0045b28, 0x0045c01, 0x0045c6c, 0x0045cc2, 0x0045cf0,
    0x0045d01, 0x0045d1c, 0x0046001, 0x00460b0, 0x0046281, 0x0046382, 0x00463cc, 0x00463fd,
    0x004641c, 0x0046425, 0x0046428, 0x0046431, 0x0046450, 0x0046455, 0x004645c, 0x0046461,
    0x00464c0, 0x00464fd, 0x0046500, 0x0046505, 0x0046508, 0x0046542, 0x0046568, 0x0046681,
    0x00466a0, 0x00466a9, 0x0046744, 0x0046785, 0x0046788, 0x004678d, 0x0046790, 0x0046801,
    0x0046804, 0x004682d, 0x00468cc, 0x00468e9, 0x00468ec, 0x0046941, 0x0046944, 0x0046971,
    0x0046a28, 0x0046a75, 0x0046a78, 0x0046ac1, 0x0046be4, 0x0047001, 0x0047024, 0x0047029,
    0x00470bc, 0x0047101, 0x0047104, 0x0047142, 0x00471b4, 0x00471c9, 0x0047240, 0x0047401,
    0x004741c, 0x0047421, 0x0047428, 0x004742d, 0x00474c4, 0x0047519, 0x004751c, 0x0047542,
    0x0047568, 0x0047581, 0x0047598, 0x004759d, 0x00475a4, 0x00475a9, 0x0047628, 0x0047661,
    0x0047664, 0x0047682, 0x00476a8, 0x0047b81, 0x0047bcc, 0x0047c09, 0x0047c0c, 0x0047c11,
    0x0047c44, 0x0047c49, 0x0047cd0, 0x0047d42, 0x0047d68, 0x0047ec1, 0x0047ec4, 0x0047f02,
    0x0047f54, 0x0048001, 0x0048e68, 0x0049002, 0x00491bc, 0x0049201, 0x0049510, 0x004be41,
    0x004bfc4, 0x004c001, 0x004d0c0, 0x004d105, 0x004d11c, 0x0051001, 0x005191c, 0x005a001,
    0x005a8e4, 0x005a901, 0x005a97c, 0x005a982, 0x005a9a8, 0x005a9c1, 0x005aafc, 0x005ab02,
    0x005ab28, 0x005ab41, 0x005abb8, 0x005ac01, 0x005acc0, 0x005ad01, 0x005ad10, 0x005ad42,
    0x005ad68, 0x005ad6e, 0x005ad88, 0x005ad8d, 0x005ade0, 0x005adf5, 0x005ae40, 0x005b901,
    0x005ba02, 0x005ba5c, 0x005bc01, 0x005bd2c, 0x005bd41, 0x005bd44, 0x005be4d, 0x005be80,
    0x005bf81, 0x005bf88, 0x005bf8d, 0x005bf90, 0x005c001, 0x0061fe0, 0x0062001, 0x0063358,
    0x0063401, 0x0063424, 0x006bfc1, 0x006bfd0, 0x006bfd5, 0x006bff0, 0x006bff5, 0x006bffc,
    0x006c001, 0x006c48c, 0x006c4c9, 0x006c4cc, 0x006c541, 0x006c54c, 0x006c555, 0x006c558,
    0x006c591, 0x006c5a0, 0x006c5c1, 0x006cbf0, 0x006f001, 0x006f1ac, 0x006f1c1, 0x006f1f4,
    0x006f201, 0x006f224, 0x006f241, 0x006f268, 0x0074b02, 0x0074b50, 0x0074b82, 0x0074bd0,
    0x0074d82, 0x0074de4, 0x0075001, 0x0075154, 0x0075159, 0x0075274, 0x0075279, 0x0075280,
    0x0075289, 0x007528c, 0x0075295, 0x007529c, 0x00752a5, 0x00752b4, 0x00752b9, 0x00752e8,
    0x00752ed, 0x00752f0, 0x00752f5, 0x0075310, 0x0075315, 0x0075418, 0x007541d, 0x007542c,
    0x0075435, 0x0075454, 0x0075459, 0x0075474, 0x0075479, 0x00754e8, 0x00754ed, 0x00754fc,
    0x0075501, 0x0075514, 0x0075519, 0x007551c, 0x0075529, 0x0075544, 0x0075549, 0x0075a98,
    0x0075aa1, 0x0075b04, 0x0075b09, 0x0075b6c, 0x0075b71, 0x0075bec, 0x0075bf1, 0x0075c54,
    0x0075c59, 0x0075cd4, 0x0075cd9, 0x0075d3c, 0x0075d41, 0x0075dbc, 0x0075dc1, 0x0075e24,
    0x0075e29, 0x0075ea4, 0x0075ea9, 0x0075f0c, 0x0075f11, 0x0075f30, 0x0075f3a, 0x0076000,
    0x0077c01, 0x0077c7c, 0x0077c95, 0x0077cac, 0x00780c1, 0x00781b8, 0x0078401, 0x00784b4,
    0x00784dd, 0x00784f8, 0x0078502, 0x0078528, 0x0078539, 0x007853c, 0x0078a41, 0x0078ab8,
    0x0078b01, 0x0078bb0, 0x0078bc2, 0x0078be8, 0x0079341, 0x00793b0, 0x00793c2, 0x00793e8,
    0x0079f81, 0x0079f9c, 0x0079fa1, 0x0079fb0, 0x0079fb5, 0x0079fbc, 0x0079fc1, 0x0079ffc,
    0x007a001, 0x007a314, 0x007a31e, 0x007a340, 0x007a401, 0x007a510, 0x007a52d, 0x007a530,
    0x007a542, 0x007a568, 0x007b1c6, 0x007b2b0, 0x007b2b6, 0x007b2c0, 0x007b2c6, 0x007b2d4,
    0x007b406, 0x007b4b8, 0x007b4be, 0x007b4f8, 0x007b801, 0x007b810, 0x007b815, 0x007b880,
    0x007b885, 0x007b88c, 0x007b891, 0x007b894, 0x007b89d, 0x007b8a0, 0x007b8a5, 0x007b8cc,
    0x007b8d1, 0x007b8e0, 0x007b8e5, 0x007b8e8, 0x007b8ed, 0x007b8f0, 0x007b909, 0x007b90c,
    0x007b91d, 0x007b920, 0x007b925, 0x007b928, 0x007b92d, 0x007b930, 0x007b935, 0x007b940,
    0x007b945, 0x007b94c, 0x007b951, 0x007b954, 0x007b95d, 0x007b960, 0x007b965, 0x007b968,
    0x007b96d, 0x007b970, 0x007b975, 0x007b978, 0x007b97d, 0x007b980, 0x007b985, 0x007b98c,
    0x007b991, 0x007b994, 0x007b99d, 0x007b9ac, 0x007b9b1, 0x007b9cc, 0x007b9d1, 0x007b9e0,
    0x007b9e5, 0x007b9f4, 0x007b9f9, 0x007b9fc, 0x007ba01, 0x007ba28, 0x007ba2d, 0x007ba70,
    0x007ba85, 0x007ba90, 0x007ba95, 0x007baa8, 0x007baad, 0x007baf0, 0x007c402, 0x007c434,
    0x007efc2, 0x007efe8, 0x0080001, 0x00a9b80, 0x00a9c01, 0x00adce8, 0x00add01, 0x00ae078,
    0x00ae081, 0x00b3a88, 0x00b3ac1, 0x00baf84, 0x00be001, 0x00be878, 0x00c0001, 0x00c4d2c,
    0x00c4d41, 0x00c8ec0,
};
/* END pt__uclass */

enum { PT__C_OTHER = 0, PT__C_LETTER = 1, PT__C_NUMBER = 2, PT__C_SPACE = 3 };

static int pt__uclass_of(uint32_t cp) {
    size_t lo = 0, hi = sizeof pt__uclass / sizeof pt__uclass[0];
    while (hi - lo > 1) { /* last run starting at or before cp */
        size_t mid = (lo + hi) / 2;
        if ((pt__uclass[mid] >> 2) <= cp) lo = mid;
        else hi = mid;
    }
    return (int)(pt__uclass[lo] & 3);
}

/* Length of the strict UTF-8 character at s[0..n) (n >= 1), 0 when s[0]
   does not start one; *cp gets the code point. */
static int pt__utf8_len(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned c = s[0];
    if (c < 0x80) { *cp = c; return 1; }
    if (c >= 0xC2 && c <= 0xDF) {
        if (n < 2 || (s[1] & 0xC0) != 0x80) return 0;
        *cp = ((c & 0x1Fu) << 6) | (s[1] & 0x3Fu);
        return 2;
    }
    if (c >= 0xE0 && c <= 0xEF) {
        unsigned lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
        if (n < 3 || s[1] < lo || s[1] > hi || (s[2] & 0xC0) != 0x80) return 0;
        *cp = ((c & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3Fu);
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        unsigned lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        if (n < 4 || s[1] < lo || s[1] > hi || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80)
            return 0;
        *cp = ((c & 0x07u) << 18) | ((s[1] & 0x3Fu) << 12) | ((s[2] & 0x3Fu) << 6) | (s[3] & 0x3Fu);
        return 4;
    }
    return 0;
}

/* Class and byte length of the character at s[i] (an invalid byte: other, 1). */
static int pt__char_class(const unsigned char *s, size_t n, size_t i, int *len) {
    unsigned c = s[i];
    uint32_t cp;
    if (c < 0x80) {
        *len = 1;
        if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return PT__C_LETTER;
        if (c >= '0' && c <= '9') return PT__C_NUMBER;
        if (c == ' ' || (c >= 9 && c <= 13)) return PT__C_SPACE;
        return PT__C_OTHER;
    }
    if (!(*len = pt__utf8_len(s + i, n - i, &cp))) {
        *len = 1;
        return PT__C_OTHER;
    }
    return pt__uclass_of(cp);
}

/* End of the run of characters of class cls starting at i. */
static size_t pt__run(const unsigned char *s, size_t n, size_t i, int cls) {
    int len;
    while (i < n && pt__char_class(s, n, i, &len) == cls) i += (size_t)len;
    return i;
}

static int pt__is_nl(unsigned char c) { return c == '\r' || c == '\n'; }

/* 's 't 're 've 'm 'll 'd at s[i] (s[i] == '\''): its length, or 0;
   fold: ASCII case-insensitive (cl100k). */
static size_t pt__contraction(const unsigned char *s, size_t n, size_t i, int fold) {
    unsigned a = i + 1 < n ? s[i + 1] : 0, b = i + 2 < n ? s[i + 2] : 0;
    if (fold) {
        if (a >= 'A' && a <= 'Z') a |= 0x20;
        if (b >= 'A' && b <= 'Z') b |= 0x20;
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

/* The whitespace alternatives shared by both patterns, at a whitespace
   character: \s+(?!\S) then \s+. */
static size_t pt__space_piece(const unsigned char *s, size_t n, size_t i) {
    size_t j = pt__run(s, n, i, PT__C_SPACE), last = j;
    int len;
    if (j == n) return j;
    /* followed by a non-space: give back the last whitespace character */
    for (last = i; last < j;) {
        size_t nx;
        pt__char_class(s, n, last, &len);
        nx = last + (size_t)len;
        if (nx == j) break;
        last = nx;
    }
    return last > i ? last : j;
}

/* End of the piece of text s[0..n) that starts at i (i < n). */
static size_t pt__piece_end(pt_pretok pat, const unsigned char *s, size_t n, size_t i) {
    int len, len2, c = pt__char_class(s, n, i, &len), c2;
    size_t nx = i + (size_t)len;
    if (s[i] == '\'') {
        size_t k = pt__contraction(s, n, i, pat == PT_PRETOK_CL100K);
        if (k) return i + k;
    }
    c2 = nx < n ? pt__char_class(s, n, nx, &len2) : -1;
    if (pat == PT_PRETOK_GPT2) {
        if (c == PT__C_LETTER || c == PT__C_NUMBER) return pt__run(s, n, i, c);
        if (s[i] == ' ' && (c2 == PT__C_LETTER || c2 == PT__C_NUMBER || c2 == PT__C_OTHER))
            return pt__run(s, n, nx, c2);
        if (c == PT__C_OTHER) return pt__run(s, n, i, PT__C_OTHER);
        return pt__space_piece(s, n, i);
    }
    /* CL100K */
    if (c == PT__C_LETTER) return pt__run(s, n, i, PT__C_LETTER);
    if (c2 == PT__C_LETTER && c != PT__C_NUMBER && !pt__is_nl(s[i]))
        return pt__run(s, n, nx, PT__C_LETTER);
    if (c == PT__C_NUMBER) {
        size_t j = i;
        int k;
        for (k = 0; k < 3 && j < n && pt__char_class(s, n, j, &len) == PT__C_NUMBER; k++)
            j += (size_t)len;
        return j;
    }
    if (c == PT__C_OTHER || (s[i] == ' ' && c2 == PT__C_OTHER)) {
        size_t j = pt__run(s, n, c == PT__C_OTHER ? i : nx, PT__C_OTHER);
        while (j < n && pt__is_nl(s[j])) j++;
        return j;
    }
    { /* whitespace: \s*[\r\n]+ ends after the run's last newline */
        size_t j = pt__run(s, n, i, PT__C_SPACE), k, nl = 0;
        for (k = i; k < j; k++)
            if (pt__is_nl(s[k])) nl = k + 1;
        if (nl) return nl;
    }
    return pt__space_piece(s, n, i);
}

PTRAINDEF size_t pt_pretok_piece_end(pt_pretok pat, const void *text, size_t n, size_t at) {
    if (at >= n) return n;
    return pt__piece_end(pat == PT_PRETOK_CL100K ? pat : PT_PRETOK_GPT2,
                         (const unsigned char *)text, n, at);
}

/* ---- hashing ------------------------------------------------------------- */

static uint64_t pt__hash_bytes(const void *p, size_t n) { /* FNV-1a, then mixed */
    const unsigned char *b = (const unsigned char *)p;
    uint64_t h = 0xcbf29ce484222325ull;
    size_t i;
    for (i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 32);
}

static uint64_t pt__hash_pair(uint64_t key) {
    key *= 0x9E3779B97F4A7C15ull;
    return key ^ (key >> 31);
}

PTRAINDEF const unsigned char *pt_tokenizer_bytes(const pt_tokenizer *tk, int id, size_t *len) {
    if (id < 0 || id >= tk->n_vocab || !tk->tok_kind[id]) {
        *len = 0;
        return NULL;
    }
    *len = tk->tok_off[id + 1] - tk->tok_off[id];
    return tk->tok_bytes + tk->tok_off[id];
}

PTRAINDEF int pt_tokenizer_find(const pt_tokenizer *tk, const void *bytes, size_t len) {
    uint32_t h = (uint32_t)pt__hash_bytes(bytes, len) & tk->vocab_mask, v;
    while ((v = tk->vocab_hash[h]) != 0) {
        int id = (int)v - 1;
        if (tk->tok_off[id + 1] - tk->tok_off[id] == len &&
            memcmp(tk->tok_bytes + tk->tok_off[id], bytes, len) == 0)
            return id;
        h = (h + 1) & tk->vocab_mask;
    }
    return -1;
}

/* The merge of pair (a, b): rank << 32 | merged id, or UINT64_MAX. */
static uint64_t pt__merge_of(const pt_tokenizer *tk, int a, int b) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint32_t h = (uint32_t)pt__hash_pair(key) & tk->merge_mask;
    for (;;) {
        uint64_t k = tk->merge_hash[2 * (size_t)h];
        if (k == key) return tk->merge_hash[2 * (size_t)h + 1];
        if (k == UINT64_MAX) return UINT64_MAX;
        h = (h + 1) & tk->merge_mask;
    }
}

PTRAINDEF int pt_tokenizer_merge(const pt_tokenizer *tk, int a, int b, int *merged) {
    uint64_t g = tk->merge_hash ? pt__merge_of(tk, a, b) : UINT64_MAX;
    if (g == UINT64_MAX) return -1;
    if (merged) *merged = (int)(uint32_t)g;
    return (int)(g >> 32);
}

/* ---- BPE on one piece ---------------------------------------------------- */

#define PT__BPE_SHORT 64

/* Merges ids[0..m) in place (m <= PT__BPE_SHORT): the lowest rank first, the
   leftmost on a tie; returns the new count. */
static size_t pt__bpe_short(const pt_tokenizer *tk, int *ids, size_t m) {
    uint64_t mg[PT__BPE_SHORT];
    size_t i;
    for (i = 0; i + 1 < m; i++) mg[i] = pt__merge_of(tk, ids[i], ids[i + 1]);
    while (m > 1) {
        size_t best = 0;
        for (i = 1; i + 1 < m; i++)
            if ((mg[i] >> 32) < (mg[best] >> 32)) best = i;
        if (mg[best] == UINT64_MAX) break;
        ids[best] = (int)(uint32_t)mg[best];
        memmove(ids + best + 1, ids + best + 2, (m - best - 2) * sizeof(int));
        if (best + 3 <= m) memmove(mg + best + 1, mg + best + 2, (m - best - 3) * sizeof(uint64_t));
        m--;
        if (best > 0) mg[best - 1] = pt__merge_of(tk, ids[best - 1], ids[best]);
        if (best + 1 < m) mg[best] = pt__merge_of(tk, ids[best], ids[best + 1]);
    }
    return m;
}

static void pt__heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i > 0 && h[(i - 1) / 2] > v) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = v;
}

static uint64_t pt__heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], v = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (h[c] >= v) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = v;
    return top;
}

/* The same for any length, O(m log m): a heap of (rank << 32 | left position)
   over a linked list; an entry whose pair has changed since is skipped.
   The heap holds at most 3m entries: m-1 pairs, then two per merge.
   work: 3m uint64 + 2m int. */
static size_t pt__bpe_long(const pt_tokenizer *tk, int *ids, size_t m, void *work) {
    uint64_t *heap = (uint64_t *)work;
    int *next = (int *)(heap + 3 * m), *prev = next + m;
    size_t nh = 0, i, out;
    for (i = 0; i < m; i++) {
        next[i] = i + 1 < m ? (int)i + 1 : -1;
        prev[i] = (int)i - 1;
    }
    for (i = 0; i + 1 < m; i++) {
        uint64_t g = pt__merge_of(tk, ids[i], ids[i + 1]);
        if (g != UINT64_MAX) pt__heap_push(heap, &nh, (g >> 32) << 32 | i);
    }
    while (nh) {
        uint64_t e = pt__heap_pop(heap, &nh), g;
        int p = (int)(uint32_t)e, q = next[p];
        if (ids[p] < 0 || q < 0) continue;
        g = pt__merge_of(tk, ids[p], ids[q]);
        if (g == UINT64_MAX || (g >> 32) != (e >> 32)) continue; /* stale */
        ids[p] = (int)(uint32_t)g;
        ids[q] = -1;
        next[p] = next[q];
        if (next[q] >= 0) prev[next[q]] = p;
        if (prev[p] >= 0) {
            g = pt__merge_of(tk, ids[prev[p]], ids[p]);
            if (g != UINT64_MAX) pt__heap_push(heap, &nh, (g >> 32) << 32 | (uint32_t)prev[p]);
        }
        if (next[p] >= 0) {
            g = pt__merge_of(tk, ids[p], ids[next[p]]);
            if (g != UINT64_MAX) pt__heap_push(heap, &nh, (g >> 32) << 32 | (uint32_t)p);
        }
    }
    for (i = 0, out = 0; i < m; i++)
        if (ids[i] >= 0) ids[out++] = ids[i];
    return out;
}

/* Encodes one piece into ids (room for len); returns the count, or 0 when
   the long path's work space cannot be allocated. */
static size_t pt__encode_piece(const pt_tokenizer *tk, const unsigned char *p, size_t len, int *ids,
                               void **work, size_t *work_cap) {
    size_t i;
    if (len == 1) {
        ids[0] = tk->byte_id[p[0]];
        return 1;
    }
    if (tk->ignore_merges) {
        int id = pt_tokenizer_find(tk, p, len);
        if (id >= 0 && tk->tok_kind[id] == 1) {
            ids[0] = id;
            return 1;
        }
    }
    for (i = 0; i < len; i++) ids[i] = tk->byte_id[p[i]];
    if (len <= PT__BPE_SHORT) return pt__bpe_short(tk, ids, len);
    if (*work_cap < len) {
        void *w = pt__malloc(len * (3 * sizeof(uint64_t) + 2 * sizeof(int)), tk->alloc_ctx);
        if (!w) return 0;
        pt__free(*work, tk->alloc_ctx);
        *work = w;
        *work_cap = len;
    }
    return pt__bpe_long(tk, ids, len, *work);
}

/* A per-call memo of short pieces: text repeats its words, and a hit skips
   the BPE. Direct-mapped; a slot holds the piece's bytes, so a hit is exact. */
#define PT__MEMO_SLOTS 8192
#define PT__MEMO_BYTES 24
#define PT__MEMO_IDS 6
typedef struct pt__memo {
    uint32_t len, n;
    int ids[PT__MEMO_IDS];
    unsigned char bytes[PT__MEMO_BYTES];
} pt__memo;

static size_t pt__encode_memo(const pt_tokenizer *tk, const unsigned char *p, size_t len, int *ids,
                              void **work, size_t *work_cap, pt__memo *memo) {
    pt__memo *m;
    size_t got;
    if (!memo || len > PT__MEMO_BYTES || len < 2)
        return pt__encode_piece(tk, p, len, ids, work, work_cap);
    m = &memo[pt__hash_bytes(p, len) & (PT__MEMO_SLOTS - 1)];
    if (m->len == len && memcmp(m->bytes, p, len) == 0) {
        memcpy(ids, m->ids, m->n * sizeof(int));
        return m->n;
    }
    got = pt__encode_piece(tk, p, len, ids, work, work_cap);
    if (got && got <= PT__MEMO_IDS) {
        m->len = (uint32_t)len;
        m->n = (uint32_t)got;
        memcpy(m->ids, ids, got * sizeof(int));
        memcpy(m->bytes, p, len);
    }
    return got;
}

/* The special token starting at s[i], longest first: its id or -1. */
static int pt__special_at(const pt_tokenizer *tk, const unsigned char *s, size_t n, size_t i) {
    int k;
    for (k = 0; k < tk->n_special; k++) {
        int id = tk->special[k];
        size_t len = tk->tok_off[id + 1] - tk->tok_off[id];
        if (len <= n - i && memcmp(s + i, tk->tok_bytes + tk->tok_off[id], len) == 0) return id;
    }
    return -1;
}

PTRAINDEF pt_status pt_tokenizer_encode(const pt_tokenizer *tk, const void *text, size_t n,
                                        int allow_special, int *ids, size_t *n_ids) {
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0, out = 0, work_cap = 0;
    void *work = NULL;
    pt__memo *memo = NULL;
    *n_ids = 0;
    if (n >= 4096 && (memo = (pt__memo *)pt__malloc(PT__MEMO_SLOTS * sizeof(pt__memo), tk->alloc_ctx)))
        memset(memo, 0, PT__MEMO_SLOTS * sizeof(pt__memo)); /* len 0: empty */
    while (i < n) {
        size_t end = n, j, k;
        /* ordinary text runs up to the next allowed special token */
        if (allow_special && tk->n_special) {
            for (j = i; j < n; j++) {
                int sp;
                if (s[j] != tk->tok_bytes[tk->tok_off[tk->special[0]]]) {
                    int any = 0, q;
                    for (q = 1; q < tk->n_special && !any; q++)
                        any = s[j] == tk->tok_bytes[tk->tok_off[tk->special[q]]];
                    if (!any) continue;
                }
                if ((sp = pt__special_at(tk, s, n, j)) >= 0) {
                    end = j;
                    break;
                }
            }
        }
        for (j = i; j < end; j = k) {
            size_t got;
            k = pt__piece_end(tk->pretok, s, end, j);
            got = pt__encode_memo(tk, s + j, k - j, ids + out, &work, &work_cap, memo);
            if (!got) {
                pt__free(work, tk->alloc_ctx);
                pt__free(memo, tk->alloc_ctx);
                return pt__fail(PT_ERR_OOM, "cannot allocate BPE work space for a piece of %zu bytes",
                                k - j);
            }
            out += got;
        }
        i = end;
        if (i < n) { /* at an allowed special token */
            int sp = pt__special_at(tk, s, n, i);
            ids[out++] = sp;
            i += tk->tok_off[sp + 1] - tk->tok_off[sp];
        }
    }
    pt__free(work, tk->alloc_ctx);
    pt__free(memo, tk->alloc_ctx);
    *n_ids = out;
    return PT_OK;
}

/* A cut at i (0 < i < n) where encoding s[0..i) and s[i..n) apart gives the
   whole text's tokens: a piece boundary that no piece's match looks across.
   "x\nA" (x printable ASCII, A an ASCII letter): the newline is a piece of
   its own or ends x's, the letter starts one, in both patterns; and
   "a B" (ASCII letters): the word ends, " B" starts. */
static int pt__safe_cut(const unsigned char *s, size_t n, size_t i) {
    unsigned a, b, c;
    if (i < 2 || i + 1 >= n) return 0;
    a = s[i - 2], b = s[i - 1], c = s[i];
    if (b == '\n' && a > 0x20 && a < 0x7F && ((c | 0x20) >= 'a' && (c | 0x20) <= 'z')) return 1;
    if (c == ' ' && ((b | 0x20) >= 'a' && (b | 0x20) <= 'z') &&
        ((s[i + 1] | 0x20) >= 'a' && (s[i + 1] | 0x20) <= 'z'))
        return 1;
    return 0;
}

PTRAINDEF int pt_pretok_safe_cut(const void *text, size_t n, size_t at) {
    return pt__safe_cut((const unsigned char *)text, n, at);
}

PTRAINDEF pt_status pt_tokenizer_encode_parallel(const pt_tokenizer *tk, const void *text, size_t n,
                                                 int allow_special, int threads, int *ids,
                                                 size_t *n_ids,
                                                 void (*progress)(size_t done, size_t total, void *ctx),
                                                 void *progress_ctx) {
    const unsigned char *s = (const unsigned char *)text;
    const size_t chunk = (size_t)1 << 20;
    size_t n_chunks = 0, cap = 0, c, out = 0, done = 0;
    size_t *cut = NULL, *got = NULL;
    int k, bad = 0;
    pt_status st = PT_OK;
    *n_ids = 0;
    /* a special token with a newline or a space could straddle a cut */
    for (k = 0; k < tk->n_special; k++) {
        size_t len;
        const unsigned char *b = pt_tokenizer_bytes(tk, tk->special[k], &len);
        if (memchr(b, '\n', len) || memchr(b, ' ', len)) bad = 1;
    }
    if (bad || threads == 1 || n < 2 * chunk) {
        st = pt_tokenizer_encode(tk, text, n, allow_special, ids, n_ids);
        if (st == PT_OK && progress) progress(n, n, progress_ctx);
        return st;
    }
    cap = n / chunk + 2;
    cut = (size_t *)pt__malloc(cap * sizeof(size_t), tk->alloc_ctx);
    got = (size_t *)pt__malloc(cap * sizeof(size_t), tk->alloc_ctx);
    if (!cut || !got) {
        pt__free(cut, tk->alloc_ctx);
        pt__free(got, tk->alloc_ctx);
        return pt__fail(PT_ERR_OOM, "cannot allocate %zu chunk offsets", cap);
    }
    cut[n_chunks++] = 0;
    for (c = chunk; c < n;) {
        size_t i = c;
        while (i < n && !pt__safe_cut(s, n, i)) i++;
        if (i >= n) break;
        cut[n_chunks++] = i;
        c = i + chunk;
    }
    cut[n_chunks] = n;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads > 0 ? threads : omp_get_num_procs())
#endif
    for (c = 0; c < n_chunks; c++) {
        pt_status cs = pt_tokenizer_encode(tk, s + cut[c], cut[c + 1] - cut[c], allow_special,
                                           ids + cut[c], &got[c]);
#ifdef _OPENMP
#pragma omp critical
#endif
        {
            if (cs != PT_OK && st == PT_OK) st = cs;
            done += cut[c + 1] - cut[c];
            if (progress) progress(done, n, progress_ctx);
        }
    }
    (void)threads;
    if (st == PT_OK)
        for (c = 0; c < n_chunks; c++) {
            memmove(ids + out, ids + cut[c], got[c] * sizeof(int));
            out += got[c];
        }
    pt__free(cut, tk->alloc_ctx);
    pt__free(got, tk->alloc_ctx);
    *n_ids = out;
    return st;
}

PTRAINDEF pt_status pt_tokenizer_decode(const pt_tokenizer *tk, const int *ids, size_t n, void *out,
                                        size_t cap, size_t *n_out) {
    size_t i, len, total = 0;
    *n_out = 0;
    for (i = 0; i < n; i++) {
        const unsigned char *b = pt_tokenizer_bytes(tk, ids[i], &len);
        if (!b)
            return pt__fail(PT_ERR_RANGE, "ids[%zu] = %d is not a token of this tokenizer "
                            "(vocabulary of %d)", i, ids[i], tk->n_vocab);
        if (out) {
            if (total + len > cap)
                return pt__fail(PT_ERR_RANGE, "decoding needs more than the %zu bytes given", cap);
            memcpy((unsigned char *)out + total, b, len);
        }
        total += len;
    }
    *n_out = total;
    return PT_OK;
}

/* Bytes a character starting with lead byte c needs (0: c cannot start one),
   and the range of its second byte. */
static int pt__utf8_need(unsigned c, unsigned *lo, unsigned *hi) {
    *lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
    *hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
    return c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3
         : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
}

PTRAINDEF size_t pt_utf8_stream_put(pt_utf8_stream *s, const void *bytes, size_t n, char *out) {
    size_t total = (size_t)s->n_held + n, keep = 0, k;
    int back;
    memcpy(out, s->held, (size_t)s->n_held);
    memcpy(out + s->n_held, bytes, n);
    /* hold back a lead byte and continuation bytes that can still complete */
    for (back = 1; back <= 3 && (size_t)back <= total; back++) {
        const unsigned char *t = (const unsigned char *)out + total - back;
        unsigned lo, hi;
        int need = pt__utf8_need(t[0], &lo, &hi), q, ok;
        if ((t[0] & 0xC0) == 0x80) continue; /* a continuation byte: look further back */
        ok = need > back;
        for (q = 1; ok && q < back; q++)
            ok = q == 1 ? t[q] >= lo && t[q] <= hi : (t[q] & 0xC0) == 0x80;
        if (ok) keep = (size_t)back;
        break;
    }
    k = total - keep;
    memcpy(s->held, out + k, keep);
    s->n_held = (int)keep;
    return k;
}

PTRAINDEF size_t pt_utf8_stream_flush(pt_utf8_stream *s, char *out) {
    size_t k = (size_t)s->n_held;
    memcpy(out, s->held, k);
    s->n_held = 0;
    return k;
}

/* ---- loading ------------------------------------------------------------- */

/* GPT-2's bytes_to_unicode, inverted: the byte a code point of a byte-level
   string stands for, or -1. Printable bytes (! .. ~, ¡ .. ¬, ® .. ÿ) are
   themselves; the other 68 are U+0100 .. U+0143 in byte order. */
static int pt__bytelevel_byte(uint32_t cp) {
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF))
        return (int)cp;
    if (cp >= 0x100 && cp < 0x100 + 68) {
        int k = (int)cp - 0x100;
        return k <= 0x20 ? k : k - 33 < 34 ? 0x7F + (k - 33) : 0xAD;
    }
    return -1;
}

/* Decodes the byte-level string s[0..n) into out (room for n); the byte
   count, or -1 when it holds a character that is not byte-level. */
static long pt__bytelevel_decode(const char *s, size_t n, unsigned char *out) {
    size_t i = 0, o = 0;
    while (i < n) {
        uint32_t cp;
        int len = pt__utf8_len((const unsigned char *)s + i, n - i, &cp), b;
        if (!len || (b = pt__bytelevel_byte(cp)) < 0) return -1;
        out[o++] = (unsigned char)b;
        i += (size_t)len;
    }
    return (long)o;
}

typedef struct pt__tkstr { const char *s; uint32_t n; int id; } pt__tkstr;

typedef struct pt__tkbuild {
    pt__tkstr *vocab, *added, *merges; /* merges: pairs (2i, 2i+1) */
    int n_vocab, cap_vocab, n_added, cap_added, n_merges, cap_merges;
    pt_pretok pretok;
    int ignore_merges;
    void *ctx;
} pt__tkbuild;

static int pt__tk_push(pt__tkstr **arr, int *n, int *cap, const char *s, size_t len, int id, void *ctx) {
    if (len > 0xFFFFFFFFu || !pt__grow((void **)arr, cap, *n + 1, sizeof(pt__tkstr), ctx)) return 0;
    (*arr)[*n].s = s;
    (*arr)[*n].n = (uint32_t)len;
    (*arr)[*n].id = id;
    (*n)++;
    return 1;
}

static void pt__tkbuild_free(pt__tkbuild *b) {
    pt__free(b->vocab, b->ctx);
    pt__free(b->added, b->ctx);
    pt__free(b->merges, b->ctx);
}

PTRAINDEF void pt_tokenizer_free(pt_tokenizer *tk) {
    void *ctx = tk->alloc_ctx;
    pt__free(tk->tok_off, ctx);
    pt__free(tk->tok_bytes, ctx);
    pt__free(tk->tok_kind, ctx);
    pt__free(tk->vocab_hash, ctx);
    pt__free(tk->merge_hash, ctx);
    pt__free(tk->special, ctx);
    memset(tk, 0, sizeof *tk);
    tk->alloc_ctx = ctx;
}

PTRAINDEF size_t pt_tokenizer_memory(const pt_tokenizer *tk) {
    size_t n = (size_t)tk->n_vocab;
    if (!tk->tok_off) return 0;
    return (n + 1) * 4 + tk->tok_off[n] + n + ((size_t)tk->vocab_mask + 1) * 4 +
           ((size_t)tk->merge_mask + 1) * 16 + (size_t)tk->n_special * sizeof(int);
}

#define PT__MAX_VOCAB (1 << 24)

static uint32_t pt__pow2_above(size_t n) {
    uint32_t p = 16;
    while (p < 2 * n) p <<= 1;
    return p;
}

/* The tokens' bytes in id order into tk->tok_bytes (token i at tok_off[i] ..
   tok_off[i+1]) and tok_kind 1 (vocabulary) or 2 (added); vocabulary
   strings are byte-level (GPT-2's bytes_to_unicode). tmp (total bytes)
   holds them in the given order first, len[id] their lengths. */
static pt_status pt__tk_tokens(pt_tokenizer *tk, const pt__tkbuild *b, unsigned char *tmp,
                               long *len) {
    size_t o;
    int i, n = tk->n_vocab;
    for (o = 0, i = 0; i < b->n_vocab + b->n_added; i++) {
        int added = i >= b->n_vocab;
        const pt__tkstr *e = added ? &b->added[i - b->n_vocab] : &b->vocab[i];
        long l;
        if (added) {
            l = (long)e->n;
            memcpy(tmp + o, e->s, e->n);
        } else if ((l = pt__bytelevel_decode(e->s, e->n, tmp + o)) < 0) {
            return pt__fail(PT_ERR_FORMAT, "vocabulary token %d \"%.*s\" is not a byte-level "
                            "string (GPT-2's bytes_to_unicode alphabet)", e->id,
                            (int)(e->n < 40 ? e->n : 40), e->s);
        }
        if (l == 0) return pt__fail(PT_ERR_FORMAT, "token %d is empty", e->id);
        if (tk->tok_kind[e->id]) {
            /* an added token may repeat its vocabulary entry (Hugging Face GPT-2) */
            if (!added || tk->tok_kind[e->id] != 1 || len[e->id] != l ||
                memcmp(tmp + tk->tok_off[e->id], tmp + o, (size_t)l) != 0)
                return pt__fail(PT_ERR_FORMAT, "id %d is given to two different tokens", e->id);
            tk->tok_kind[e->id] = 2;
            continue;
        }
        tk->tok_kind[e->id] = (unsigned char)(added ? 2 : 1);
        tk->tok_off[e->id] = (uint32_t)o; /* provisional: in tmp */
        len[e->id] = l;
        o += (size_t)l;
    }
    for (o = 0, i = 0; i < n; i++) { /* in id order */
        size_t at = o;
        if (tk->tok_kind[i]) {
            memcpy(tk->tok_bytes + o, tmp + tk->tok_off[i], (size_t)len[i]);
            o += (size_t)len[i];
        }
        tk->tok_off[i] = (uint32_t)at;
    }
    tk->tok_off[n] = (uint32_t)o;
    return PT_OK;
}

/* The tokens' hash (vocabulary tokens first, so a special never hides one;
   two vocabulary tokens of the same bytes are refused) and each byte's
   token, which every byte must have. */
static pt_status pt__tk_hash(pt_tokenizer *tk) {
    int i, pass, n = tk->n_vocab;
    for (pass = 1; pass <= 2; pass++)
        for (i = 0; i < n; i++) {
            size_t l = tk->tok_off[i + 1] - tk->tok_off[i];
            uint32_t h;
            int other;
            if (tk->tok_kind[i] != pass) continue;
            if ((other = pt_tokenizer_find(tk, tk->tok_bytes + tk->tok_off[i], l)) >= 0) {
                if (pass == 1)
                    return pt__fail(PT_ERR_FORMAT, "vocabulary tokens %d and %d are the same "
                                    "bytes", other, i);
                continue;
            }
            h = (uint32_t)pt__hash_bytes(tk->tok_bytes + tk->tok_off[i], l) & tk->vocab_mask;
            while (tk->vocab_hash[h]) h = (h + 1) & tk->vocab_mask;
            tk->vocab_hash[h] = (uint32_t)i + 1;
        }
    for (i = 0; i < 256; i++) {
        unsigned char c = (unsigned char)i;
        int id = pt_tokenizer_find(tk, &c, 1);
        if (id < 0 || tk->tok_kind[id] != 1)
            return pt__fail(PT_ERR_FORMAT, "the vocabulary has no token for byte 0x%02X", i);
        tk->byte_id[i] = id;
    }
    return PT_OK;
}

/* The merges' hash: pair (a, c) of merges[i] -> rank i (its position in
   the list) and the merged token, which must be a vocabulary token; each
   pair mixed into *fp. */
static pt_status pt__tk_merges(pt_tokenizer *tk, const pt__tkbuild *b, uint64_t *fp) {
    void *ctx = tk->alloc_ctx;
    size_t maxm = 0;
    unsigned char *scratch;
    pt_status st = PT_OK;
    int i;
    tk->n_merges = b->n_merges;
    tk->merge_mask = pt__pow2_above((size_t)b->n_merges) - 1;
    tk->merge_hash = (uint64_t *)pt__malloc(((size_t)tk->merge_mask + 1) * 16, ctx);
    for (i = 0; i < 2 * b->n_merges; i++)
        if (b->merges[i].n > maxm) maxm = b->merges[i].n;
    scratch = (unsigned char *)pt__malloc(2 * maxm + 1, ctx);
    if (!tk->merge_hash || !scratch) {
        pt__free(scratch, ctx);
        return pt__fail(PT_ERR_OOM, "cannot allocate %d merges", b->n_merges);
    }
    memset(tk->merge_hash, 0xFF, ((size_t)tk->merge_mask + 1) * 16);
    for (i = 0; i < b->n_merges && st == PT_OK; i++) {
        const pt__tkstr *x = &b->merges[2 * i], *y = &b->merges[2 * i + 1];
        long la = pt__bytelevel_decode(x->s, x->n, scratch), lb;
        int a, c, r, nx = (int)(x->n < 40 ? x->n : 40), ny = (int)(y->n < 40 ? y->n : 40);
        uint64_t key;
        uint32_t h;
        lb = la < 0 ? -1 : pt__bytelevel_decode(y->s, y->n, scratch + la);
        if (la <= 0 || lb <= 0) {
            st = pt__fail(PT_ERR_FORMAT, "merges[%d] \"%.*s %.*s\": not two byte-level strings",
                          i, nx, x->s, ny, y->s);
            break;
        }
        a = pt_tokenizer_find(tk, scratch, (size_t)la);
        c = pt_tokenizer_find(tk, scratch + la, (size_t)lb);
        r = pt_tokenizer_find(tk, scratch, (size_t)(la + lb));
        if (a < 0 || c < 0 || r < 0 || tk->tok_kind[r] != 1) {
            st = pt__fail(PT_ERR_FORMAT, "merges[%d] \"%.*s %.*s\": %s is not in the vocabulary",
                          i, nx, x->s, ny, y->s, a < 0 ? "the first token" : c < 0 ?
                          "the second token" : "the merged token");
            break;
        }
        key = (uint64_t)(uint32_t)a << 32 | (uint32_t)c;
        h = (uint32_t)pt__hash_pair(key) & tk->merge_mask;
        while (st == PT_OK && tk->merge_hash[2 * (size_t)h] != UINT64_MAX) {
            if (tk->merge_hash[2 * (size_t)h] == key)
                st = pt__fail(PT_ERR_FORMAT, "merges[%d] \"%.*s %.*s\" repeats merges[%d]", i,
                              nx, x->s, ny, y->s, (int)(tk->merge_hash[2 * (size_t)h + 1] >> 32));
            h = (h + 1) & tk->merge_mask;
        }
        if (st != PT_OK) break;
        tk->merge_hash[2 * (size_t)h] = key;
        tk->merge_hash[2 * (size_t)h + 1] = (uint64_t)i << 32 | (uint32_t)r;
        *fp = (*fp ^ key) * 0x100000001b3ull;
    }
    pt__free(scratch, ctx);
    return st;
}

/* The added tokens, longest first (encoding tries them in that order);
   "<|endoftext|>" among them is eot. */
static pt_status pt__tk_specials(pt_tokenizer *tk) {
    int i, n = tk->n_vocab, o = 0;
    for (i = 0; i < n; i++) tk->n_special += tk->tok_kind[i] == 2;
    tk->special = (int *)pt__malloc((size_t)tk->n_special * sizeof(int) + 1, tk->alloc_ctx);
    if (!tk->special)
        return pt__fail(PT_ERR_OOM, "cannot allocate %d special tokens", tk->n_special);
    for (i = 0; i < n; i++)
        if (tk->tok_kind[i] == 2) {
            int k = o++;
            size_t li = tk->tok_off[i + 1] - tk->tok_off[i];
            while (k > 0 && tk->tok_off[tk->special[k - 1] + 1] - tk->tok_off[tk->special[k - 1]] < li) {
                tk->special[k] = tk->special[k - 1];
                k--;
            }
            tk->special[k] = i;
            if (li == 13 && memcmp(tk->tok_bytes + tk->tok_off[i], "<|endoftext|>", 13) == 0)
                tk->eot = i;
        }
    return PT_OK;
}

/* Builds the tables from the collected strings (either file format, or the
   BPE trainer's); tk is cleared first: the tokens, their hash, the merges,
   the specials, and the fingerprint of them all. */
static pt_status pt__tk_build(pt_tokenizer *tk, pt__tkbuild *b) {
    void *ctx = tk->alloc_ctx;
    size_t total = 0;
    long *len = NULL;
    unsigned char *tmp = NULL;
    int i, n = 0;
    uint64_t fp = 0x9E3779B97F4A7C15ull;
    pt_status st = PT_OK;
    pt_tokenizer_free(tk);
    tk->alloc_ctx = ctx;
    tk->eot = -1;
    for (i = 0; i < b->n_vocab; i++) {
        if (b->vocab[i].id + 1 > n) n = b->vocab[i].id + 1;
        total += b->vocab[i].n;
    }
    for (i = 0; i < b->n_added; i++) {
        if (b->added[i].id + 1 > n) n = b->added[i].id + 1;
        total += b->added[i].n;
    }
    if (b->n_vocab == 0) return pt__fail(PT_ERR_FORMAT, "the vocabulary is empty");
    /* holes are allowed (cl100k has some), a vocabulary mostly of holes is not */
    if ((size_t)n > 2 * ((size_t)b->n_vocab + (size_t)b->n_added) + 1024)
        return pt__fail(PT_ERR_FORMAT, "ids run up to %d but only %d tokens are given", n - 1,
                        b->n_vocab + b->n_added);
    tk->n_vocab = n;
    tk->tok_off = (uint32_t *)pt__malloc(((size_t)n + 1) * 4, ctx);
    tk->tok_kind = (unsigned char *)pt__malloc((size_t)n, ctx);
    len = (long *)pt__malloc((size_t)n * sizeof(long), ctx);
    tmp = (unsigned char *)pt__malloc(total + 1, ctx);
    tk->tok_bytes = (unsigned char *)pt__malloc(total + 1, ctx);
    tk->vocab_mask = pt__pow2_above((size_t)n) - 1;
    tk->vocab_hash = (uint32_t *)pt__malloc(((size_t)tk->vocab_mask + 1) * 4, ctx);
    if (!tk->tok_off || !tk->tok_kind || !len || !tmp || !tk->tok_bytes || !tk->vocab_hash)
        st = pt__fail(PT_ERR_OOM, "cannot allocate a vocabulary of %d tokens", n);
    else if (total + 1 > 0xFFFFFFFFu)
        st = pt__fail(PT_ERR_FORMAT, "the vocabulary's tokens hold %zu bytes, more than 4 GB",
                      total);
    if (st == PT_OK) {
        memset(tk->tok_kind, 0, (size_t)n);
        memset(tk->vocab_hash, 0, ((size_t)tk->vocab_mask + 1) * 4);
        st = pt__tk_tokens(tk, b, tmp, len);
    }
    pt__free(len, ctx);
    pt__free(tmp, ctx);
    if (st == PT_OK) st = pt__tk_hash(tk);
    if (st == PT_OK) st = pt__tk_merges(tk, b, &fp);
    if (st == PT_OK) st = pt__tk_specials(tk);
    if (st != PT_OK) {
        pt_tokenizer_free(tk);
        return st;
    }
    tk->pretok = b->pretok;
    tk->ignore_merges = b->ignore_merges;
    fp ^= pt__hash_bytes(tk->tok_bytes, tk->tok_off[n]);
    fp ^= pt__hash_bytes(tk->tok_off, ((size_t)n + 1) * 4) * 3;
    fp ^= pt__hash_bytes(tk->tok_kind, (size_t)n) * 5;
    tk->fingerprint = fp ^ ((uint64_t)tk->pretok << 8 | (uint64_t)tk->ignore_merges) * 7;
    return PT_OK;
}

static pt_status pt__tk_syntax(const char *what, const pt__json *j, const char *base) {
    return pt__fail(PT_ERR_FORMAT, "%s at byte %zu", what, (size_t)(j->p - base));
}

static int pt__json_id(pt__json *j, int *id) {
    uint64_t v;
    if (!pt__json_u64(j, &v) || v >= PT__MAX_VOCAB) return 0;
    *id = (int)v;
    return 1;
}

PTRAINDEF pt_status pt_tokenizer_parse_gpt2(pt_tokenizer *tk, const void *encoder_json, size_t n_enc,
                                            const void *vocab_bpe, size_t n_bpe) {
    pt__tkbuild b;
    pt__json j;
    const char *key, *base = (const char *)encoder_json, *s = (const char *)vocab_bpe;
    const char *end = s + n_bpe;
    int first = 1, r, line = 0;
    pt_status st;
    memset(&b, 0, sizeof b);
    b.ctx = tk->alloc_ctx;
    memset(&j, 0, sizeof j);
    j.p = base;
    j.end = base + n_enc;
    j.pool_cap = n_enc + 1;
    if (!(j.pool = (char *)pt__malloc(j.pool_cap, b.ctx)))
        return pt__fail(PT_ERR_OOM, "cannot allocate %zu bytes for encoder.json", n_enc);
    if (!pt__json_expect(&j, '{')) {
        st = pt__tk_syntax("encoder.json: not a JSON object", &j, base);
        goto done;
    }
    while ((r = pt__json_member(&j, &first, &key)) == 1) {
        int id;
        if (!pt__json_id(&j, &id)) {
            st = pt__fail(PT_ERR_FORMAT, "encoder.json: the id of \"%.40s\" is not an integer "
                          "in [0, %d)", key, PT__MAX_VOCAB);
            goto done;
        }
        if (!pt__tk_push(&b.vocab, &b.n_vocab, &b.cap_vocab, key, strlen(key), id, b.ctx) ||
            (strcmp(key, "<|endoftext|>") == 0 &&
             !pt__tk_push(&b.added, &b.n_added, &b.cap_added, key, strlen(key), id, b.ctx))) {
            st = pt__fail(PT_ERR_OOM, "out of memory reading encoder.json");
            goto done;
        }
    }
    if (r < 0) {
        st = pt__tk_syntax("encoder.json: malformed JSON object", &j, base);
        goto done;
    }
    /* vocab.bpe: "#version: ..." then one merge "a b" a line */
    while (s < end) {
        const char *nl = (const char *)memchr(s, '\n', (size_t)(end - s)), *sp;
        const char *e = nl ? nl : end, *le = e;
        line++;
        if (le > s && le[-1] == '\r') le--;
        if (le > s && !(line == 1 && le - s >= 8 && memcmp(s, "#version", 8) == 0)) {
            sp = (const char *)memchr(s, ' ', (size_t)(le - s));
            if (!sp || sp == s || sp + 1 == le || memchr(sp + 1, ' ', (size_t)(le - sp - 1))) {
                st = pt__fail(PT_ERR_FORMAT, "vocab.bpe line %d \"%.*s\" is not two tokens separated "
                              "by one space", line, (int)(le - s < 40 ? le - s : 40), s);
                goto done;
            }
            if (!pt__tk_push(&b.merges, &b.n_merges, &b.cap_merges, s, (size_t)(sp - s), 0, b.ctx) ||
                !pt__tk_push(&b.merges, &b.n_merges, &b.cap_merges, sp + 1, (size_t)(le - sp - 1), 0,
                             b.ctx)) {
                st = pt__fail(PT_ERR_OOM, "out of memory reading vocab.bpe");
                goto done;
            }
        }
        s = e + 1;
    }
    b.n_merges /= 2;
    b.pretok = PT_PRETOK_GPT2;
    st = pt__tk_build(tk, &b);
done:
    pt__free(j.pool, b.ctx);
    pt__tkbuild_free(&b);
    return st;
}

/* The split patterns we match by hand, as files spell them. */
static const char *const pt__pat_gpt2[] = {
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+", NULL};
static const char *const pt__pat_cl100k[] = {
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    "('s|'S|'t|'T|'re|'rE|'Re|'RE|'ve|'vE|'Ve|'VE|'m|'M|'ll|'lL|'Ll|'LL|'d|'D)|[^\\r\\n\\p{L}\\p{N}]?"
    "\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL};

typedef struct pt__pretok_info {
    int bytelevel, use_regex, prefix_space, n_split;
    const char *regex, *unknown;
} pt__pretok_info;

/* One pre_tokenizer object (a Sequence recurses); 0 on a syntax error. */
static int pt__tk_pretok(pt__json *j, pt__pretok_info *pi) {
    const char *key, *type = "", *behavior = "Isolated";
    int first = 1, r, use_regex = 1, prefix = 0, invert = 0;
    const char *regex = NULL;
    if (!pt__json_expect(j, '{') || ++j->depth > 16) return 0;
    while ((r = pt__json_member(j, &first, &key)) == 1) {
        if (strcmp(key, "type") == 0) {
            if (!(type = pt__json_string(j))) return 0;
        } else if (strcmp(key, "pretokenizers") == 0) {
            int f2 = 1;
            if (!pt__json_expect(j, '[')) return 0;
            for (;;) {
                pt__ws(j);
                if (j->p < j->end && *j->p == ']') {
                    j->p++;
                    break;
                }
                if (!f2 && !pt__json_expect(j, ',')) return 0;
                f2 = 0;
                if (!pt__tk_pretok(j, pi)) return 0;
            }
        } else if (strcmp(key, "pattern") == 0) {
            int f3 = 1;
            const char *k3;
            if (!pt__json_expect(j, '{')) return 0;
            while ((r = pt__json_member(j, &f3, &k3)) == 1) {
                const char *v = pt__json_string(j);
                if (!v) return 0;
                if (strcmp(k3, "Regex") == 0) regex = v;
                else pi->unknown = "a Split by a String (only a Regex is supported)";
            }
            if (r < 0) return 0;
        } else if (strcmp(key, "use_regex") == 0) {
            if (!pt__json_bool(j, &use_regex)) return 0;
        } else if (strcmp(key, "add_prefix_space") == 0) {
            if (!pt__json_bool(j, &prefix)) return 0;
        } else if (strcmp(key, "invert") == 0) {
            if (!pt__json_bool(j, &invert)) return 0;
        } else if (strcmp(key, "behavior") == 0) {
            if (!(behavior = pt__json_string(j))) return 0;
        } else if (!pt__json_skip(j)) {
            return 0;
        }
    }
    if (r < 0) return 0;
    j->depth--;
    if (strcmp(type, "ByteLevel") == 0) {
        pi->bytelevel++;
        pi->use_regex = use_regex;
        pi->prefix_space |= prefix;
    } else if (strcmp(type, "Split") == 0) {
        pi->n_split++;
        pi->regex = regex;
        if (invert || strcmp(behavior, "Isolated") != 0)
            pi->unknown = "a Split that is inverted or not Isolated";
    } else if (strcmp(type, "Sequence") != 0) {
        pi->unknown = "a pre-tokenizer other than ByteLevel, Split and Sequence";
    }
    return 1;
}

static int pt__pat_in(const char *pat, const char *const *list) {
    for (; *list; list++)
        if (strcmp(pat, *list) == 0) return 1;
    return 0;
}

/* The "model" object: BPE with vocab and merges. */
static pt_status pt__tk_model(pt__json *j, pt__tkbuild *b, const char *base) {
    const char *key;
    int first = 1, r;
    if (!pt__json_expect(j, '{')) return pt__tk_syntax("\"model\" is not an object", j, base);
    while ((r = pt__json_member(j, &first, &key)) == 1) {
        if (strcmp(key, "type") == 0) {
            const char *t = pt__json_string(j);
            if (!t) return pt__tk_syntax("model.type is not a string", j, base);
            if (strcmp(t, "BPE") != 0)
                return pt__fail(PT_ERR_UNSUPPORTED, "model.type is \"%.40s\"; only BPE is supported", t);
        } else if (strcmp(key, "vocab") == 0) {
            int f2 = 1;
            const char *k2;
            if (!pt__json_expect(j, '{')) return pt__tk_syntax("model.vocab is not an object", j, base);
            while ((r = pt__json_member(j, &f2, &k2)) == 1) {
                int id;
                if (!pt__json_id(j, &id))
                    return pt__fail(PT_ERR_FORMAT, "model.vocab: the id of \"%.40s\" is not an integer "
                                    "in [0, %d)", k2, PT__MAX_VOCAB);
                if (!pt__tk_push(&b->vocab, &b->n_vocab, &b->cap_vocab, k2, strlen(k2), id, b->ctx))
                    return pt__fail(PT_ERR_OOM, "out of memory reading model.vocab");
            }
            if (r < 0) return pt__tk_syntax("model.vocab: malformed object", j, base);
        } else if (strcmp(key, "merges") == 0) {
            int f2 = 1, k = 0;
            if (!pt__json_expect(j, '[')) return pt__tk_syntax("model.merges is not an array", j, base);
            for (;; k++) {
                const char *a, *c;
                size_t la, lc;
                pt__ws(j);
                if (j->p < j->end && *j->p == ']') {
                    j->p++;
                    break;
                }
                if (!f2 && !pt__json_expect(j, ','))
                    return pt__tk_syntax("model.merges: expected ','", j, base);
                f2 = 0;
                pt__ws(j);
                if (j->p < j->end && *j->p == '[') { /* ["a", "b"] */
                    j->p++;
                    if (!(a = pt__json_string(j)) || !pt__json_expect(j, ',') ||
                        !(c = pt__json_string(j)) || !pt__json_expect(j, ']'))
                        return pt__fail(PT_ERR_FORMAT, "model.merges[%d] is not an array of two strings", k);
                    la = strlen(a);
                    lc = strlen(c);
                } else { /* "a b" */
                    const char *sp;
                    if (!(a = pt__json_string(j)))
                        return pt__fail(PT_ERR_FORMAT, "model.merges[%d] is neither a string nor an array", k);
                    sp = strchr(a, ' ');
                    if (!sp || sp == a || !sp[1] || strchr(sp + 1, ' '))
                        return pt__fail(PT_ERR_FORMAT, "model.merges[%d] \"%.40s\" is not two tokens "
                                        "separated by one space", k, a);
                    la = (size_t)(sp - a);
                    c = sp + 1;
                    lc = strlen(c);
                }
                if (!pt__tk_push(&b->merges, &b->n_merges, &b->cap_merges, a, la, 0, b->ctx) ||
                    !pt__tk_push(&b->merges, &b->n_merges, &b->cap_merges, c, lc, 0, b->ctx))
                    return pt__fail(PT_ERR_OOM, "out of memory reading model.merges");
            }
        } else if (strcmp(key, "ignore_merges") == 0) {
            if (!pt__json_bool(j, &b->ignore_merges))
                return pt__tk_syntax("model.ignore_merges is not a boolean", j, base);
        } else if (strcmp(key, "byte_fallback") == 0) {
            int v;
            if (!pt__json_bool(j, &v)) return pt__tk_syntax("model.byte_fallback is not a boolean", j, base);
            if (v) return pt__fail(PT_ERR_UNSUPPORTED, "model.byte_fallback is true (a SentencePiece-style "
                                   "BPE); only byte-level BPE is supported");
        } else if (strcmp(key, "continuing_subword_prefix") == 0 || strcmp(key, "end_of_word_suffix") == 0 ||
                   strcmp(key, "dropout") == 0) {
            const char *v;
            pt__ws(j);
            if (!pt__json_null(j) && (!(v = pt__json_string(j)) || *v))
                return pt__fail(PT_ERR_UNSUPPORTED, "model.%s is set; only null or \"\" is supported", key);
        } else if (!pt__json_skip(j)) {
            return pt__tk_syntax("malformed JSON value in \"model\"", j, base);
        }
    }
    if (r < 0) return pt__tk_syntax("\"model\": malformed object", j, base);
    b->n_merges /= 2;
    return PT_OK;
}

PTRAINDEF pt_status pt_tokenizer_parse_hf(pt_tokenizer *tk, const void *json, size_t n) {
    pt__tkbuild b;
    pt__json j;
    pt__pretok_info pi;
    const char *key, *base = (const char *)json;
    int first = 1, r, have_model = 0, have_pre = 0;
    pt_status st = PT_OK;
    memset(&b, 0, sizeof b);
    memset(&pi, 0, sizeof pi);
    b.ctx = tk->alloc_ctx;
    memset(&j, 0, sizeof j);
    j.p = base;
    j.end = base + n;
    j.pool_cap = n + 1;
    if (!(j.pool = (char *)pt__malloc(j.pool_cap, b.ctx)))
        return pt__fail(PT_ERR_OOM, "cannot allocate %zu bytes for a tokenizer.json", n);
    if (!pt__json_expect(&j, '{')) {
        st = pt__tk_syntax("not a JSON object", &j, base);
        goto done;
    }
    while (st == PT_OK && (r = pt__json_member(&j, &first, &key)) == 1) {
        if (strcmp(key, "model") == 0) {
            have_model = 1;
            st = pt__tk_model(&j, &b, base);
        } else if (strcmp(key, "added_tokens") == 0) {
            int f2 = 1, k = 0;
            if (!pt__json_expect(&j, '[')) {
                st = pt__tk_syntax("added_tokens is not an array", &j, base);
                break;
            }
            for (;; k++) {
                int f3 = 1, id = -1;
                const char *k3, *content = NULL;
                pt__ws(&j);
                if (j.p < j.end && *j.p == ']') {
                    j.p++;
                    break;
                }
                if ((!f2 && !pt__json_expect(&j, ',')) || !pt__json_expect(&j, '{')) {
                    st = pt__fail(PT_ERR_FORMAT, "added_tokens[%d] is not an object", k);
                    break;
                }
                f2 = 0;
                while ((r = pt__json_member(&j, &f3, &k3)) == 1) {
                    int ok = strcmp(k3, "id") == 0        ? pt__json_id(&j, &id)
                             : strcmp(k3, "content") == 0 ? (content = pt__json_string(&j)) != NULL
                                                          : pt__json_skip(&j);
                    if (!ok) {
                        r = -1;
                        break;
                    }
                }
                if (r < 0 || id < 0 || !content || !*content) {
                    st = pt__fail(PT_ERR_FORMAT, "added_tokens[%d] needs an integer \"id\" in [0, %d) and "
                                  "a non-empty string \"content\"", k, PT__MAX_VOCAB);
                    break;
                }
                if (!pt__tk_push(&b.added, &b.n_added, &b.cap_added, content, strlen(content), id, b.ctx))
                    st = pt__fail(PT_ERR_OOM, "out of memory reading added_tokens");
                if (st != PT_OK) break;
            }
        } else if (strcmp(key, "normalizer") == 0) {
            if (!pt__json_null(&j))
                st = pt__fail(PT_ERR_UNSUPPORTED, "the normalizer is not null; byte-level BPE without a "
                              "normalizer is supported");
        } else if (strcmp(key, "pre_tokenizer") == 0) {
            have_pre = 1;
            if (pt__json_null(&j)) have_pre = 0;
            else if (!pt__tk_pretok(&j, &pi)) st = pt__tk_syntax("malformed pre_tokenizer", &j, base);
        } else if (!pt__json_skip(&j)) {
            st = pt__tk_syntax("malformed JSON value", &j, base);
        }
    }
    if (st != PT_OK) goto done;
    if (r < 0) {
        st = pt__tk_syntax("malformed JSON object", &j, base);
        goto done;
    }
    if (!have_model) {
        st = pt__fail(PT_ERR_MISSING, "no \"model\"");
        goto done;
    }
    if (!have_pre || pi.unknown || pi.bytelevel != 1 || pi.n_split > 1 || pi.prefix_space) {
        st = pt__fail(PT_ERR_UNSUPPORTED, "pre_tokenizer: %s; supported: ByteLevel (GPT-2's pattern), "
                      "or a Split by GPT-2's or cl100k's pattern and ByteLevel without a regex, "
                      "no prefix space",
                      !have_pre ? "none" : pi.unknown ? pi.unknown : pi.prefix_space ? "add_prefix_space"
                      : pi.bytelevel != 1 ? "no single ByteLevel" : "more than one Split");
        goto done;
    }
    if (pi.n_split == 0) {
        if (!pi.use_regex) {
            st = pt__fail(PT_ERR_UNSUPPORTED, "pre_tokenizer: ByteLevel without a regex and no Split");
            goto done;
        }
        b.pretok = PT_PRETOK_GPT2;
    } else if (pi.use_regex) {
        st = pt__fail(PT_ERR_UNSUPPORTED, "pre_tokenizer: a Split followed by ByteLevel with use_regex");
        goto done;
    } else if (pi.regex && pt__pat_in(pi.regex, pt__pat_gpt2)) {
        b.pretok = PT_PRETOK_GPT2;
    } else if (pi.regex && pt__pat_in(pi.regex, pt__pat_cl100k)) {
        b.pretok = PT_PRETOK_CL100K;
    } else {
        st = pt__fail(PT_ERR_UNSUPPORTED, "pre_tokenizer: the split pattern \"%.120s\" is neither "
                      "GPT-2's nor cl100k's", pi.regex ? pi.regex : "(none)");
        goto done;
    }
    st = pt__tk_build(tk, &b);
done:
    pt__free(j.pool, b.ctx);
    pt__tkbuild_free(&b);
    return st;
}

PTRAINDEF pt_status pt_tokenizer_load(pt_tokenizer *tk, const char *path) {
    unsigned char *a = NULL, *c = NULL;
    size_t na = 0, nc = 0, plen = strlen(path);
    char *p2 = NULL;
    pt_status st;
    void *ctx = tk->alloc_ctx;
    memset(tk, 0, sizeof *tk);
    tk->alloc_ctx = ctx;
    if (plen >= 5 && strcmp(path + plen - 5, ".json") == 0) {
        if ((st = pt_file_read(path, &a, &na, ctx)) != PT_OK) return st;
        st = pt_tokenizer_parse_hf(tk, a, na);
        pt__free(a, ctx);
        return st == PT_OK ? st : pt__fail_path(st, path);
    }
    /* a directory: its tokenizer.json (a Hugging Face model's), else encoder.json + vocab.bpe */
    if (!(p2 = (char *)pt__malloc(plen + 16, ctx))) return pt__fail(PT_ERR_OOM, "out of memory");
    snprintf(p2, plen + 16, "%s/tokenizer.json", path);
    if (pt__readable(p2)) {
        st = pt_tokenizer_load(tk, p2);
        pt__free(p2, ctx);
        return st;
    }
    snprintf(p2, plen + 16, "%s/encoder.json", path);
    if ((st = pt_file_read(p2, &a, &na, ctx)) == PT_OK) {
        snprintf(p2, plen + 16, "%s/vocab.bpe", path);
        if ((st = pt_file_read(p2, &c, &nc, ctx)) == PT_OK) {
            st = pt_tokenizer_parse_gpt2(tk, a, na, c, nc);
            if (st != PT_OK) pt__fail_path(st, path);
        }
    }
    if (st == PT_ERR_IO) {
        char msg[sizeof pt__err];
        snprintf(msg, sizeof msg, "%s", pt__err);
        pt__fail(st, "%s: neither a tokenizer.json nor a directory with tokenizer.json, or "
                 "encoder.json and vocab.bpe (%s)", path, msg);
    }
    pt__free(a, ctx);
    pt__free(c, ctx);
    pt__free(p2, ctx);
    return st;
}

/* ---- BPE training ---------------------------------------------------------- */

/* distinct pieces and their counts: open addressing over a byte arena */
typedef struct pt__wslot { uint64_t h, off, count; uint32_t len, used; } pt__wslot;
typedef struct pt__wmap {
    pt__wslot *slot;
    size_t mask, n;
    unsigned char *bytes;
    size_t nb, cap_b;
    void *ctx;
} pt__wmap;

static int pt__wmap_init(pt__wmap *m, size_t cap, void *ctx) {
    memset(m, 0, sizeof *m);
    m->ctx = ctx;
    m->mask = cap - 1;
    m->slot = (pt__wslot *)pt__malloc(cap * sizeof(pt__wslot), ctx);
    if (!m->slot) return 0;
    memset(m->slot, 0, cap * sizeof(pt__wslot));
    return 1;
}

static void pt__wmap_free(pt__wmap *m) {
    pt__free(m->slot, m->ctx);
    pt__free(m->bytes, m->ctx);
    m->slot = NULL;
    m->bytes = NULL;
}

/* Adds count to piece p (hash h); 0 when out of memory. */
static int pt__wmap_add(pt__wmap *m, const unsigned char *p, size_t len, uint64_t h, uint64_t count) {
    size_t i;
    if (2 * (m->n + 1) > m->mask + 1) { /* grow to keep the load under 1/2 */
        pt__wmap g;
        size_t k;
        if (!pt__wmap_init(&g, 2 * (m->mask + 1), m->ctx)) return 0;
        for (k = 0; k <= m->mask; k++)
            if (m->slot[k].used) {
                size_t j = m->slot[k].h & g.mask;
                while (g.slot[j].used) j = (j + 1) & g.mask;
                g.slot[j] = m->slot[k];
            }
        pt__free(m->slot, m->ctx);
        m->slot = g.slot;
        m->mask = g.mask;
    }
    for (i = h & m->mask; m->slot[i].used; i = (i + 1) & m->mask)
        if (m->slot[i].h == h && m->slot[i].len == len && memcmp(m->bytes + m->slot[i].off, p, len) == 0) {
            m->slot[i].count += count;
            return 1;
        }
    if (m->nb + len > m->cap_b) {
        size_t cap = 2 * m->cap_b + len + 4096;
        unsigned char *b = (unsigned char *)pt__malloc(cap, m->ctx);
        if (!b) return 0;
        if (m->nb) memcpy(b, m->bytes, m->nb);
        pt__free(m->bytes, m->ctx);
        m->bytes = b;
        m->cap_b = cap;
    }
    memcpy(m->bytes + m->nb, p, len);
    m->slot[i].h = h;
    m->slot[i].off = m->nb;
    m->slot[i].len = (uint32_t)len;
    m->slot[i].count = count;
    m->slot[i].used = 1;
    m->nb += len;
    m->n++;
    return 1;
}

/* pairs of adjacent tokens: count, and the words that (may) hold them */
typedef struct pt__pairs {
    uint64_t *key;   /* per pair */
    int64_t *count;
    int **words;
    int *n_words, *cap_words, *stamp;
    uint32_t *slot;  /* key hash -> pair index + 1 */
    size_t n, cap, mask;
    void *ctx;
} pt__pairs;

/* The index of pair key, created when missing; -1 when out of memory. */
static long pt__pair_get(pt__pairs *p, uint64_t key) {
    size_t i;
    uint32_t v;
    if (2 * (p->n + 1) > p->mask + 1) {
        size_t cap = 2 * (p->mask + 1), k;
        uint32_t *s = (uint32_t *)pt__malloc(cap * 4, p->ctx);
        if (!s) return -1;
        memset(s, 0, cap * 4);
        for (k = 0; k < p->n; k++) {
            size_t j = pt__hash_pair(p->key[k]) & (cap - 1);
            while (s[j]) j = (j + 1) & (cap - 1);
            s[j] = (uint32_t)k + 1;
        }
        pt__free(p->slot, p->ctx);
        p->slot = s;
        p->mask = cap - 1;
    }
    for (i = pt__hash_pair(key) & p->mask; (v = p->slot[i]) != 0; i = (i + 1) & p->mask)
        if (p->key[v - 1] == key) return (long)v - 1;
    if (p->n == p->cap) {
        int c = (int)p->cap;
        int c1 = c, c2 = c, c3 = c, c4 = c, c5 = c, need = (int)p->n + 1;
        if (p->cap > 0x3FFFFFFF ||
            !pt__grow((void **)&p->key, &c, need, sizeof(uint64_t), p->ctx) ||
            !pt__grow((void **)&p->count, &c1, need, sizeof(int64_t), p->ctx) ||
            !pt__grow((void **)&p->words, &c2, need, sizeof(int *), p->ctx) ||
            !pt__grow((void **)&p->n_words, &c3, need, sizeof(int), p->ctx) ||
            !pt__grow((void **)&p->cap_words, &c4, need, sizeof(int), p->ctx) ||
            !pt__grow((void **)&p->stamp, &c5, need, sizeof(int), p->ctx))
            return -1;
        p->cap = (size_t)c;
    }
    p->key[p->n] = key;
    p->count[p->n] = 0;
    p->words[p->n] = NULL;
    p->n_words[p->n] = p->cap_words[p->n] = 0;
    p->stamp[p->n] = -1;
    p->slot[i] = (uint32_t)p->n + 1;
    return (long)p->n++;
}

/* count += delta for pair key; with w >= 0 also lists word w under it. */
static long pt__pair_add(pt__pairs *p, uint64_t key, int64_t delta, int w) {
    long k = pt__pair_get(p, key);
    if (k < 0) return -1;
    p->count[k] += delta;
    if (w >= 0 && (p->n_words[k] == 0 || p->words[k][p->n_words[k] - 1] != w)) {
        if (!pt__grow((void **)&p->words[k], &p->cap_words[k], p->n_words[k] + 1, sizeof(int), p->ctx))
            return -1;
        p->words[k][p->n_words[k]++] = w;
    }
    return k;
}

/* max-heap of (count, pair): the larger count first, then the smaller key */
typedef struct pt__pq { int64_t count; uint64_t key; } pt__pq;
static int pt__pq_before(const pt__pq *a, const pt__pq *b) {
    return a->count > b->count || (a->count == b->count && a->key < b->key);
}
static int pt__pq_push(pt__pq **h, int *n, int *cap, int64_t count, uint64_t key, void *ctx) {
    pt__pq e;
    int i;
    e.count = count;
    e.key = key;
    if (!pt__grow((void **)h, cap, *n + 1, sizeof(pt__pq), ctx)) return 0;
    for (i = (*n)++; i > 0 && pt__pq_before(&e, &(*h)[(i - 1) / 2]); i = (i - 1) / 2) (*h)[i] = (*h)[(i - 1) / 2];
    (*h)[i] = e;
    return 1;
}
static pt__pq pt__pq_pop(pt__pq *h, int *n) {
    pt__pq top = h[0], e = h[--*n];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && pt__pq_before(&h[c + 1], &h[c])) c++;
        if (!pt__pq_before(&h[c], &e)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = e;
    return top;
}

/* Appends the byte-level spelling of b[0..n) to out (room for 2n). */
PTRAINDEF size_t pt_bytelevel_encode(const void *bytes, size_t n, char *out) {
    const unsigned char *b = (const unsigned char *)bytes;
    size_t i, o = 0;
    for (i = 0; i < n; i++) {
        int c = b[i], k = 0, x, cp;
        if ((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF)) cp = c;
        else {
            for (x = 0; x < c; x++)
                k += !((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF));
            cp = 0x100 + k;
        }
        if (cp < 0x80) out[o++] = (char)cp;
        else {
            out[o++] = (char)(0xC0 | (cp >> 6));
            out[o++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    return o;
}

/* The BPE trainer's state: the distinct pieces of two bytes or more
   ("words", word w being sym[woff[w] .. woff[w] + wlen[w]), counted wcount[w]
   times), their adjacent pairs, the heap of pairs by count, the merges made
   and each token's length in bytes. */
typedef struct pt__bpe {
    int *sym, *wlen;
    size_t *woff, n_words;
    int64_t *wcount;
    uint64_t *merges;  /* (a << 32 | b) in order */
    uint32_t *tok_len; /* bytes of each token */
    int n_merges, n_merges_max, minf;
    pt__pairs P;
    pt__pq *heap;
    int n_heap, cap_heap;
    long *touched; /* the pairs a merge made, each once (P.stamp) */
    int n_touched, cap_touched;
    void *ctx;
} pt__bpe;

static void pt__bpe_free(pt__bpe *B) {
    void *ctx = B->ctx;
    size_t i;
    pt__free(B->sym, ctx);
    pt__free(B->woff, ctx);
    pt__free(B->wlen, ctx);
    pt__free(B->wcount, ctx);
    pt__free(B->merges, ctx);
    pt__free(B->tok_len, ctx);
    pt__free(B->heap, ctx);
    pt__free(B->touched, ctx);
    for (i = 0; i < B->P.n; i++) pt__free(B->P.words[i], ctx);
    pt__free(B->P.key, ctx);
    pt__free(B->P.count, ctx);
    pt__free(B->P.words, ctx);
    pt__free(B->P.n_words, ctx);
    pt__free(B->P.cap_words, ctx);
    pt__free(B->P.stamp, ctx);
    pt__free(B->P.slot, ctx);
}

/* 1. The distinct pieces of s[0..n) with their counts, into *all: on
   n_threads threads over chunks of about 1 MiB cut where the pre-tokenizer
   would (pt__safe_cut, as pt_tokenizer_encode_parallel), a map per thread,
   merged into the first. */
static pt_status pt__bpe_count(const unsigned char *s, size_t n, pt_pretok pat, int n_threads,
                               pt__wmap *all, void *ctx) {
    size_t n_chunks = 0, c, i;
    size_t *cut = (size_t *)pt__malloc((n >> 20) * sizeof(size_t) + 3 * sizeof(size_t), ctx);
    pt__wmap *maps = (pt__wmap *)pt__malloc((size_t)n_threads * sizeof(pt__wmap), ctx);
    pt_status st = PT_OK;
    int t;
    if (!cut || !maps) {
        st = pt__fail(PT_ERR_OOM, "pt_bpe_train: out of memory");
        goto done;
    }
    memset(maps, 0, (size_t)n_threads * sizeof(pt__wmap));
    cut[n_chunks++] = 0;
    for (c = (size_t)1 << 20; c < n;) {
        size_t k = c;
        while (k < n && !pt__safe_cut(s, n, k)) k++;
        if (k >= n) break;
        cut[n_chunks++] = k;
        c = k + ((size_t)1 << 20);
    }
    cut[n_chunks] = n;
    for (t = 0; t < n_threads; t++)
        if (!pt__wmap_init(&maps[t], 1 << 12, ctx)) st = pt__fail(PT_ERR_OOM, "pt_bpe_train: out of memory");
    if (st != PT_OK) goto done;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(n_threads)
#endif
    for (c = 0; c < n_chunks; c++) {
        int me = 0;
        size_t j, k;
#ifdef _OPENMP
        me = omp_get_thread_num();
#endif
        for (j = cut[c]; j < cut[c + 1]; j = k) {
            k = pt__piece_end(pat, s, cut[c + 1], j);
            if (!pt__wmap_add(&maps[me], s + j, k - j, pt__hash_bytes(s + j, k - j), 1)) {
#ifdef _OPENMP
#pragma omp critical
#endif
                st = PT_ERR_OOM;
                break;
            }
        }
    }
    if (st != PT_OK) {
        st = pt__fail(PT_ERR_OOM, "pt_bpe_train: out of memory counting pieces");
        goto done;
    }
    for (t = 1; t < n_threads && st == PT_OK; t++) {
        for (i = 0; i <= maps[t].mask && st == PT_OK; i++) {
            const pt__wslot *w = &maps[t].slot[i];
            if (w->used && !pt__wmap_add(&maps[0], maps[t].bytes + w->off, w->len, w->h, w->count))
                st = pt__fail(PT_ERR_OOM, "pt_bpe_train: out of memory merging counts");
        }
        pt__wmap_free(&maps[t]);
    }
    if (st == PT_OK) *all = maps[0], memset(&maps[0], 0, sizeof maps[0]);
done:
    if (maps)
        for (t = 0; t < n_threads; t++) pt__wmap_free(&maps[t]);
    pt__free(maps, ctx);
    pt__free(cut, ctx);
    return st;
}

/* 2. The words as symbols (bytes at first) and every adjacent pair counted,
   with the words that hold it. Their order depends on the threads, the
   merges do not (counts and ties on pair ids decide). */
static pt_status pt__bpe_words(pt__bpe *B, const pt__wmap *all, int vocab) {
    void *ctx = B->ctx;
    size_t i, w = 0, o = 0, n_sym = 0;
    int t;
    for (i = 0; i <= all->mask; i++)
        if (all->slot[i].used && all->slot[i].len > 1) B->n_words++, n_sym += all->slot[i].len;
    B->sym = (int *)pt__malloc(n_sym * sizeof(int) + 4, ctx);
    B->woff = (size_t *)pt__malloc(B->n_words * sizeof(size_t) + 8, ctx);
    B->wlen = (int *)pt__malloc(B->n_words * sizeof(int) + 4, ctx);
    B->wcount = (int64_t *)pt__malloc(B->n_words * sizeof(int64_t) + 8, ctx);
    B->merges = (uint64_t *)pt__malloc(((size_t)B->n_merges_max + 1) * sizeof(uint64_t), ctx);
    B->tok_len = (uint32_t *)pt__malloc(((size_t)vocab + 1) * sizeof(uint32_t), ctx);
    B->P.mask = 1023;
    B->P.slot = (uint32_t *)pt__malloc((B->P.mask + 1) * 4, ctx);
    if (!B->sym || !B->woff || !B->wlen || !B->wcount || !B->merges || !B->tok_len || !B->P.slot)
        return pt__fail(PT_ERR_OOM, "pt_bpe_train: out of memory for %zu distinct pieces",
                        B->n_words);
    memset(B->P.slot, 0, (B->P.mask + 1) * 4);
    for (t = 0; t < 256; t++) B->tok_len[t] = 1;
    for (i = 0; i <= all->mask; i++) {
        const pt__wslot *x = &all->slot[i];
        int *ws = B->sym + o;
        uint32_t k;
        if (!x->used || x->len < 2) continue;
        B->woff[w] = o;
        B->wlen[w] = (int)x->len;
        B->wcount[w] = (int64_t)x->count;
        for (k = 0; k < x->len; k++) ws[k] = all->bytes[x->off + k];
        for (k = 0; k + 1 < x->len; k++)
            if (pt__pair_add(&B->P, (uint64_t)ws[k] << 32 | (uint32_t)ws[k + 1], B->wcount[w],
                             (int)w) < 0)
                return pt__fail(PT_ERR_OOM, "pt_bpe_train: out of memory counting pairs");
        o += x->len;
        w++;
    }
    return PT_OK;
}

/* a b -> z in every word holding pair k = (a, b): each such word's pairs
   out, the merge left to right, its pairs back in; the pairs with z are
   listed under the word and, once each, in B->touched. */
static pt_status pt__bpe_apply(pt__bpe *B, long k, int a, int b, int z) {
    pt__pairs *P = &B->P;
    int *wl = P->words[k], nwl = P->n_words[k], q;
    pt_status st = PT_OK;
    P->words[k] = NULL;
    P->n_words[k] = P->cap_words[k] = 0;
    for (q = 0; q < nwl && st == PT_OK; q++) {
        int w = wl[q], L = B->wlen[w], x, y, found = 0;
        int *ws = B->sym + B->woff[w];
        for (x = 0; x + 1 < L; x++)
            if (ws[x] == a && ws[x + 1] == b) found = 1;
        if (!found) continue;
        for (x = 0; x + 1 < L; x++) /* the word's pairs out ... */
            pt__pair_add(P, (uint64_t)ws[x] << 32 | (uint32_t)ws[x + 1], -B->wcount[w], -1);
        for (x = 0, y = 0; x < L; y++) { /* ... a b -> z, left to right ... */
            if (x + 1 < L && ws[x] == a && ws[x + 1] == b) ws[y] = z, x += 2;
            else ws[y] = ws[x++];
        }
        B->wlen[w] = L = y;
        for (x = 0; x + 1 < L && st == PT_OK; x++) { /* ... and back in */
            int fresh = ws[x] == z || ws[x + 1] == z;
            long pk = pt__pair_add(P, (uint64_t)ws[x] << 32 | (uint32_t)ws[x + 1], B->wcount[w],
                                   fresh ? w : -1);
            if (pk < 0) st = pt__fail(PT_ERR_OOM, "pt_bpe_train: out of memory counting pairs");
            else if (fresh && P->stamp[pk] != z) {
                P->stamp[pk] = z;
                if (!pt__grow((void **)&B->touched, &B->cap_touched, B->n_touched + 1,
                              sizeof(long), B->ctx))
                    st = pt__fail(PT_ERR_OOM, "pt_bpe_train: out of memory");
                else B->touched[B->n_touched++] = pk;
            }
        }
    }
    pt__free(wl, B->ctx);
    return st;
}

/* pair k on the heap with its count (none when it no longer occurs) */
static pt_status pt__bpe_push(pt__bpe *B, long k) {
    if (B->P.count[k] > 0 &&
        !pt__pq_push(&B->heap, &B->n_heap, &B->cap_heap, B->P.count[k], B->P.key[k], B->ctx))
        return pt__fail(PT_ERR_OOM, "pt_bpe_train: out of memory");
    return PT_OK;
}

/* 3. Merges the most frequent pair (ties: the smaller pair of ids) into
   token 256 + n_merges until the vocabulary is full or no pair occurs
   min_frequency times. Counts only fall, so a popped pair whose count
   changed goes back on the heap with its own. */
static pt_status pt__bpe_merge(pt__bpe *B, const pt_bpe_train_desc *desc) {
    pt_status st = PT_OK;
    size_t i;
    int q;
    for (i = 0; i < B->P.n; i++)
        if (!pt__pq_push(&B->heap, &B->n_heap, &B->cap_heap, B->P.count[i], B->P.key[i], B->ctx))
            return pt__fail(PT_ERR_OOM, "pt_bpe_train: out of memory");
    while (B->n_merges < B->n_merges_max && B->n_heap > 0) {
        pt__pq e = pt__pq_pop(B->heap, &B->n_heap);
        long k = pt__pair_get(&B->P, e.key);
        int a = (int)(e.key >> 32), b = (int)(uint32_t)e.key, z = 256 + B->n_merges;
        if (k < 0) continue;
        if (B->P.count[k] != e.count) {
            if ((st = pt__bpe_push(B, k)) != PT_OK) return st;
            continue;
        }
        if (e.count < B->minf) break;
        B->merges[B->n_merges++] = e.key;
        B->tok_len[z] = B->tok_len[a] + B->tok_len[b];
        if ((st = pt__bpe_apply(B, k, a, b, z)) != PT_OK) return st;
        for (q = 0; q < B->n_touched; q++) /* the new pairs, once each with their count */
            if ((st = pt__bpe_push(B, B->touched[q])) != PT_OK) return st;
        B->n_touched = 0;
        if (desc && desc->progress && B->n_merges % 1000 == 0)
            desc->progress(B->n_merges, B->n_merges_max, desc->progress_ctx);
    }
    if (desc && desc->progress) desc->progress(B->n_merges, B->n_merges_max, desc->progress_ctx);
    return PT_OK;
}

/* 4. The tokenizer: the tokens' bytes (a merge's are its pair's), as
   byte-level strings with the merges and the specials through the
   loader's own checks (pt__tk_build). */
static pt_status pt__bpe_tokenizer(pt_tokenizer *tk, const pt__bpe *B, pt_pretok pat,
                                   const char *const *special, int n_special) {
    void *ctx = B->ctx;
    int n_tok = 256 + B->n_merges, id, t;
    pt__tkbuild tb;
    size_t total = 0, o = 0;
    unsigned char *bytes = NULL;
    char *str = NULL;
    uint32_t *toff = NULL;
    pt_status st = PT_OK;
    memset(&tb, 0, sizeof tb);
    tb.ctx = ctx;
    tb.pretok = pat;
    for (id = 0; id < n_tok; id++) total += B->tok_len[id];
    toff = (uint32_t *)pt__malloc(((size_t)n_tok + 1) * 4, ctx);
    bytes = (unsigned char *)pt__malloc(total + 1, ctx);
    str = (char *)pt__malloc(2 * total + 1, ctx);
    if (!toff || !bytes || !str) st = pt__fail(PT_ERR_OOM, "pt_bpe_train: out of memory");
    for (id = 0; st == PT_OK && id < n_tok; id++) {
        toff[id] = (uint32_t)o;
        if (id < 256) bytes[o] = (unsigned char)id;
        else {
            int a = (int)(B->merges[id - 256] >> 32), b = (int)(uint32_t)B->merges[id - 256];
            memcpy(bytes + o, bytes + toff[a], B->tok_len[a]);
            memcpy(bytes + o + B->tok_len[a], bytes + toff[b], B->tok_len[b]);
        }
        o += B->tok_len[id];
    }
    if (st == PT_OK) toff[n_tok] = (uint32_t)o;
    for (id = 0, o = 0; st == PT_OK && id < n_tok; id++) {
        size_t l = pt_bytelevel_encode(bytes + toff[id], B->tok_len[id], str + o);
        if (!pt__tk_push(&tb.vocab, &tb.n_vocab, &tb.cap_vocab, str + o, l, id, ctx))
            st = pt__fail(PT_ERR_OOM, "pt_bpe_train: out of memory");
        o += l;
    }
    for (id = 0; st == PT_OK && id < B->n_merges; id++) {
        int a = (int)(B->merges[id] >> 32), b = (int)(uint32_t)B->merges[id];
        const pt__tkstr *x = &tb.vocab[a], *y = &tb.vocab[b];
        if (!pt__tk_push(&tb.merges, &tb.n_merges, &tb.cap_merges, x->s, x->n, 0, ctx) ||
            !pt__tk_push(&tb.merges, &tb.n_merges, &tb.cap_merges, y->s, y->n, 0, ctx))
            st = pt__fail(PT_ERR_OOM, "pt_bpe_train: out of memory");
    }
    tb.n_merges /= 2;
    for (t = 0; st == PT_OK && t < n_special; t++)
        if (!special[t] || !*special[t] ||
            !pt__tk_push(&tb.added, &tb.n_added, &tb.cap_added, special[t], strlen(special[t]),
                         n_tok + t, ctx))
            st = pt__fail(PT_ERR_CONFIG, "pt_bpe_train: special[%d] is empty or NULL", t);
    if (st == PT_OK) st = pt__tk_build(tk, &tb);
    pt__tkbuild_free(&tb);
    pt__free(toff, ctx);
    pt__free(bytes, ctx);
    pt__free(str, ctx);
    return st;
}

PTRAINDEF pt_status pt_bpe_train(pt_tokenizer *tk, const void *text, size_t n,
                                 const pt_bpe_train_desc *desc) {
    static const char *const eot[] = {"<|endoftext|>"};
    int vocab = desc && desc->vocab_size ? desc->vocab_size : 4096;
    int threads = desc ? desc->threads : 0, n_threads = 1;
    pt_pretok pat = desc && desc->pretok ? desc->pretok : PT_PRETOK_GPT2;
    const char *const *special = desc && desc->special ? desc->special : eot;
    int n_special = desc && desc->special ? desc->n_special : 1;
    pt__wmap all;
    pt__bpe B;
    pt_status st;
    memset(&B, 0, sizeof B);
    memset(&all, 0, sizeof all);
    B.ctx = B.P.ctx = tk->alloc_ctx;
    B.minf = desc && desc->min_frequency ? desc->min_frequency : 2;
    if (n_special < 0 || vocab < 256 + n_special || vocab > PT__MAX_VOCAB || B.minf < 1 ||
        (pat != PT_PRETOK_GPT2 && pat != PT_PRETOK_CL100K))
        return pt__fail(PT_ERR_CONFIG, "pt_bpe_train: vocab_size=%d must hold the 256 bytes "
                        "and %d specials (and at most %d), min_frequency=%d >= 1, a known "
                        "pretok (%d)",
                        vocab, n_special, PT__MAX_VOCAB, B.minf, (int)pat);
    B.n_merges_max = vocab - 256 - n_special;
#ifdef _OPENMP
    n_threads = threads > 0 ? threads : omp_get_num_procs();
#else
    (void)threads;
#endif
    st = pt__bpe_count((const unsigned char *)text, n, pat, n_threads, &all, B.ctx);
    if (st == PT_OK) st = pt__bpe_words(&B, &all, vocab);
    pt__wmap_free(&all);
    if (st == PT_OK) st = pt__bpe_merge(&B, desc);
    if (st == PT_OK) st = pt__bpe_tokenizer(tk, &B, pat, special, n_special);
    pt__bpe_free(&B);
    return st;
}

/* JSON string of raw bytes (special tokens): escapes quote, backslash and controls */
static size_t pt__json_raw(char *o, const unsigned char *b, size_t n) {
    size_t i, k = 0;
    o[k++] = '"';
    for (i = 0; i < n; i++) {
        if (b[i] == '"' || b[i] == '\\') o[k++] = '\\', o[k++] = (char)b[i];
        else if (b[i] < 0x20) k += (size_t)sprintf(o + k, "\\u%04x", b[i]);
        else o[k++] = (char)b[i];
    }
    o[k++] = '"';
    return k;
}

/* A token's byte-level spelling in JSON; open, close: with the quotes */
static size_t pt__json_bytelevel(char *o, const unsigned char *b, size_t n, int open, int close) {
    char tmp[8];
    size_t i, k = 0;
    if (open) o[k++] = '"';
    for (i = 0; i < n; i++) {
        size_t l = pt_bytelevel_encode(b + i, 1, tmp);
        if (l == 1 && (tmp[0] == '"' || tmp[0] == '\\')) o[k++] = '\\';
        memcpy(o + k, tmp, l);
        k += l;
    }
    if (close) o[k++] = '"';
    return k;
}

PTRAINDEF pt_status pt_tokenizer_save(const pt_tokenizer *tk, const char *path) {
    size_t cap = 4096, k = 0, i, plen = strlen(path);
    uint64_t *order;
    char *o, *tmp;
    const void *parts[1];
    size_t lens[1];
    pt_status st;
    int id, first;
    if (!tk->tok_off) return pt__fail(PT_ERR_INVALID_ARG, "pt_tokenizer_save: the tokenizer is empty");
    for (id = 0; id < tk->n_vocab; id++) cap += 6 * (size_t)(tk->tok_off[id + 1] - tk->tok_off[id]) + 200;
    cap += (size_t)tk->n_merges * 16;
    order = (uint64_t *)pt__malloc(((size_t)tk->n_merges + 1) * sizeof(uint64_t), tk->alloc_ctx);
    o = (char *)pt__malloc(cap, tk->alloc_ctx);
    tmp = (char *)pt__malloc(plen + 5, tk->alloc_ctx);
    if (!order || !o || !tmp) {
        pt__free(order, tk->alloc_ctx);
        pt__free(o, tk->alloc_ctx);
        pt__free(tmp, tk->alloc_ctx);
        return pt__fail(PT_ERR_OOM, "pt_tokenizer_save: cannot allocate %zu bytes", cap);
    }
    for (i = 0; i <= tk->merge_mask; i++)
        if (tk->merge_hash[2 * i] != UINT64_MAX) {
            uint32_t rank = (uint32_t)(tk->merge_hash[2 * i + 1] >> 32);
            if (rank < (uint32_t)tk->n_merges) order[rank] = tk->merge_hash[2 * i];
        }
    k += (size_t)sprintf(o + k, "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":[");
    for (id = 0, first = 1; id < tk->n_vocab; id++)
        if (tk->tok_kind[id] == 2) {
            k += (size_t)sprintf(o + k, "%s{\"id\":%d,\"content\":", first ? "" : ",", id);
            k += pt__json_raw(o + k, tk->tok_bytes + tk->tok_off[id], tk->tok_off[id + 1] - tk->tok_off[id]);
            k += (size_t)sprintf(o + k, ",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
                                 "\"normalized\":false,\"special\":true}");
            first = 0;
        }
    k += (size_t)sprintf(o + k, "],\"normalizer\":null,\"pre_tokenizer\":");
    if (tk->pretok == PT_PRETOK_GPT2)
        k += (size_t)sprintf(o + k, "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
                             "\"trim_offsets\":true,\"use_regex\":true}");
    else {
        const char *p = pt__pat_cl100k[0];
        k += (size_t)sprintf(o + k, "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\","
                             "\"pattern\":{\"Regex\":\"");
        for (; *p; p++) {
            if (*p == '\\' || *p == '"') o[k++] = '\\';
            o[k++] = *p;
        }
        k += (size_t)sprintf(o + k, "\"},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\","
                             "\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":false}]}");
    }
    k += (size_t)sprintf(o + k, ",\"post_processor\":null,\"decoder\":{\"type\":\"ByteLevel\","
                         "\"add_prefix_space\":true,\"trim_offsets\":true,\"use_regex\":true},"
                         "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,"
                         "\"continuing_subword_prefix\":null,\"end_of_word_suffix\":null,\"fuse_unk\":false,"
                         "\"byte_fallback\":false,\"ignore_merges\":%s,\"vocab\":{",
                         tk->ignore_merges ? "true" : "false");
    for (id = 0, first = 1; id < tk->n_vocab; id++)
        if (tk->tok_kind[id] == 1) {
            if (!first) o[k++] = ',';
            k += pt__json_bytelevel(o + k, tk->tok_bytes + tk->tok_off[id],
                                    tk->tok_off[id + 1] - tk->tok_off[id], 1, 1);
            k += (size_t)sprintf(o + k, ":%d", id);
            first = 0;
        }
    k += (size_t)sprintf(o + k, "},\"merges\":[");
    for (i = 0; i < (size_t)tk->n_merges; i++) {
        int a = (int)(order[i] >> 32), b = (int)(uint32_t)order[i];
        if (i) o[k++] = ',';
        k += pt__json_bytelevel(o + k, tk->tok_bytes + tk->tok_off[a], tk->tok_off[a + 1] - tk->tok_off[a], 1, 0);
        o[k++] = ' ';
        k += pt__json_bytelevel(o + k, tk->tok_bytes + tk->tok_off[b], tk->tok_off[b + 1] - tk->tok_off[b], 0, 1);
    }
    k += (size_t)sprintf(o + k, "]}}\n");
    snprintf(tmp, plen + 5, "%s.tmp", path);
    parts[0] = o;
    lens[0] = k;
    st = pt__write_atomic(path, tmp, parts, lens, 1);
    pt__free(order, tk->alloc_ctx);
    pt__free(o, tk->alloc_ctx);
    pt__free(tmp, tk->alloc_ctx);
    return st;
}

/* ---- token files --------------------------------------------------------- */

PTRAINDEF pt_status pt_tokens_write_llmc(const char *path, const int *ids, size_t n,
                                         const int32_t *stamp) {
    int32_t h[256];
    size_t i, plen = strlen(path), width = 2;
    void *body;
    char *tmp;
    const void *parts[2];
    size_t lens[2];
    pt_status st;
    if (n > 0x7FFFFFFF)
        return pt__fail(PT_ERR_RANGE, "%s: %zu tokens; a token file holds at most 2^31-1", path, n);
    for (i = 0; i < n; i++) {
        if (ids[i] < 0) return pt__fail(PT_ERR_RANGE, "ids[%zu] = %d is negative", i, ids[i]);
        if (ids[i] > 0xFFFF) width = 4;
    }
    memset(h, 0, sizeof h);
    h[0] = PT_TOKENS_MAGIC;
    h[1] = width == 2 ? 1 : 2;
    h[2] = (int32_t)n;
    if (stamp) memcpy(h + 3, stamp, 7 * sizeof(int32_t));
    body = pt__malloc(n * width + 1, NULL);
    tmp = (char *)pt__malloc(plen + 5, NULL);
    if (!body || !tmp) {
        pt__free(body, NULL);
        pt__free(tmp, NULL);
        return pt__fail(PT_ERR_OOM, "cannot allocate %zu tokens", n);
    }
    for (i = 0; i < n; i++) { /* little-endian on disk */
        unsigned char *o = (unsigned char *)body + i * width;
        uint32_t v = (uint32_t)ids[i];
        o[0] = (unsigned char)v;
        o[1] = (unsigned char)(v >> 8);
        if (width == 4) {
            o[2] = (unsigned char)(v >> 16);
            o[3] = (unsigned char)(v >> 24);
        }
    }
    snprintf(tmp, plen + 5, "%s.tmp", path);
    parts[0] = h;
    lens[0] = sizeof h;
    parts[1] = body;
    lens[1] = n * width;
    st = pt__write_atomic(path, tmp, parts, lens, 2);
    pt__free(body, NULL);
    pt__free(tmp, NULL);
    return st;
}

/* The cache stamp: 't','x' marker, fingerprint, text size and hash. */
/* t's array for n ids: data32 when wide, else data (t otherwise zeroed). */
static pt_status pt__tokens_alloc(pt_tokens *t, size_t n, int wide) {
    void *p = pt__malloc(n * (wide ? 4 : 2) + 4, t->alloc_ctx);
    if (!p) return pt__fail(PT_ERR_OOM, "cannot allocate %zu tokens", n);
    if (wide) t->data32 = (uint32_t *)p;
    else t->data = (uint16_t *)p;
    return PT_OK;
}

static void pt__text_stamp(int32_t st[7], const pt_tokenizer *tk, const void *text, size_t n) {
    uint64_t h = pt__hash_bytes(text, n);
    st[0] = 0x7478; /* "tx" */
    st[1] = (int32_t)(uint32_t)tk->fingerprint;
    st[2] = (int32_t)(uint32_t)(tk->fingerprint >> 32);
    st[3] = (int32_t)(uint32_t)n;
    st[4] = (int32_t)(uint32_t)((uint64_t)n >> 32);
    st[5] = (int32_t)(uint32_t)h;
    st[6] = (int32_t)(uint32_t)(h >> 32);
}

PTRAINDEF pt_status pt_tokens_from_text(struct pt_tokens *t, const pt_tokenizer *tk,
                                        const char *text_path, const pt_text_desc *desc) {
    unsigned char *text = NULL, *cache = NULL;
    size_t n = 0, nc = 0, n_ids = 0, i;
    pt_text_desc d;
    const char *cache_path;
    pt_text_cache done;
    int32_t stamp[7];
    int *ids = NULL;
    pt_status st;
    void *ctx = t->alloc_ctx;
    if (desc) d = *desc;
    else memset(&d, 0, sizeof d);
    cache_path = d.cache_path;
    done = cache_path && !d.cache_read_only ? PT_CACHE_MADE : PT_CACHE_NONE;
    memset(t, 0, sizeof *t);
    t->alloc_ctx = ctx;
    if ((st = pt_file_read(text_path, &text, &n, ctx)) != PT_OK) return st;
    pt__text_stamp(stamp, tk, text, n);
    if (cache_path && pt_file_read(cache_path, &cache, &nc, ctx) == PT_OK) {
        int32_t h[10];
        if (nc >= sizeof h) memcpy(h, cache, sizeof h);
        if (nc >= 1024 && (h[1] == 1 || h[1] == 2) && memcmp(h + 3, stamp, sizeof stamp) == 0 &&
            pt_tokens_parse_llmc(t, cache, nc) == PT_OK) {
            t->vocab_size = tk->n_vocab;
            t->cache = PT_CACHE_READ;
            pt__free(cache, ctx);
            pt__free(text, ctx);
            return pt_tokens_check(t, tk->n_vocab);
        }
        pt__free(cache, ctx); /* stale: another text or tokenizer */
        if (!d.cache_read_only) done = PT_CACHE_REMADE;
    }
    if (d.cache_read_only) cache_path = NULL;
    ids = (int *)pt__malloc((n + 1) * sizeof(int), ctx);
    if (!ids) {
        pt__free(text, ctx);
        return pt__fail(PT_ERR_OOM, "cannot allocate the ids of %zu bytes of text", n);
    }
    st = pt_tokenizer_encode_parallel(tk, text, n, 0, d.threads, ids, &n_ids, d.progress,
                                      d.progress_ctx);
    pt__free(text, ctx);
    if (st == PT_OK && cache_path) st = pt_tokens_write_llmc(cache_path, ids, n_ids, stamp);
    if (st == PT_OK && (st = pt__tokens_alloc(t, n_ids, tk->n_vocab > 65536)) == PT_OK) {
        for (i = 0; i < n_ids; i++)
            if (t->data32) t->data32[i] = (uint32_t)ids[i];
            else t->data[i] = (uint16_t)ids[i];
        t->n = n_ids;
        t->vocab_size = tk->n_vocab;
        t->cache = done;
    }
    pt__free(ids, ctx);
    return st == PT_OK ? st : pt__fail_path(st, text_path);
}

/* ======================================================================== */
/* >>io (implementation)                                                     */
/* ======================================================================== */


static char *pt__strdup(const char *s, void *ctx) {
    size_t n = strlen(s) + 1;
    char *d = (char *)pt__malloc(n, ctx);
    if (d) memcpy(d, s, n);
    return d;
}

PTRAINDEF pt_status pt_file_read(const char *path, unsigned char **data, size_t *size,
                                 void *alloc_ctx) {
    FILE *f = fopen(path, "rb");
    long len;
    unsigned char *buf;
    *data = NULL;
    *size = 0;
    if (!f) return pt__fail(PT_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    if (fgetc(f) == EOF && ferror(f)) { /* e.g. a directory */
        int err = errno;
        fclose(f);
        return pt__fail(PT_ERR_IO, "cannot read '%s': %s", path, strerror(err));
    }
    if (fseek(f, 0, SEEK_END) != 0 || (len = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return pt__fail(PT_ERR_IO, "cannot determine the size of '%s'", path);
    }
    buf = (unsigned char *)pt__malloc((size_t)len, alloc_ctx);
    if (!buf) {
        fclose(f);
        return pt__fail(PT_ERR_OOM, "cannot allocate %ld bytes to read '%s'", len, path);
    }
    if (len > 0 && fread(buf, 1, (size_t)len, f) != (size_t)len) {
        fclose(f);
        pt__free(buf, alloc_ctx);
        return pt__fail(PT_ERR_IO, "cannot read '%s'", path);
    }
    fclose(f);
    *data = buf;
    *size = (size_t)len;
    return PT_OK;
}

/* Strict integer parsing of a whole string (metadata values). */
static int pt__parse_u64(const char *s, uint64_t *out) {
    uint64_t v = 0;
    if (!s || !*s) return 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > (UINT64_MAX - (uint64_t)(*s - '0')) / 10) return 0;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    *out = v;
    return 1;
}

static int pt__parse_int(const char *s, int *out) {
    uint64_t v;
    if (!pt__parse_u64(s, &v) || v > 0x7fffffff) return 0;
    *out = (int)v;
    return 1;
}

static int pt__parse_float(const char *s, double *out) {
    char *end;
    if (!s || !*s) return 0;
    *out = strtod(s, &end);
    return *end == 0 && isfinite(*out);
}

static pt_dtype pt__dtype_from_name(const char *s) {
    int i;
    for (i = 1; i < PT_DTYPE_COUNT; i++)
        if (strcmp(s, pt__dtypes[i].name) == 0) return (pt_dtype)i;
    return PT_DTYPE_NONE;
}

static pt_status pt__st_fmt(const char *what, size_t at) {
    return pt__fail(PT_ERR_FORMAT, "safetensors header is not valid JSON: %s (at byte %zu)",
                    what, at + 8);
}

/* One tensor entry: {"dtype": s, "shape": [..], "data_offsets": [b, e]} */
static pt_status pt__st_entry(pt__json *j, const char *hdr, pt_st_tensor *t) {
    const char *key, *dtype = NULL;
    int first = 1, r, have_shape = 0, have_off = 0;
    if (!pt__json_expect(j, '{')) return pt__st_fmt("tensor entry is not an object", (size_t)(j->p - hdr));
    while ((r = pt__json_member(j, &first, &key)) == 1) {
        if (strcmp(key, "dtype") == 0) {
            if (!(dtype = pt__json_string(j))) return pt__st_fmt("dtype is not a string", (size_t)(j->p - hdr));
        } else if (strcmp(key, "shape") == 0 || strcmp(key, "data_offsets") == 0) {
            int is_shape = key[0] == 's', n = 0, f2 = 1;
            uint64_t v[PT_MAX_DIMS + 1];
            if (!pt__json_expect(j, '[')) return pt__st_fmt("expected an array", (size_t)(j->p - hdr));
            for (;;) {
                pt__ws(j);
                if (j->p < j->end && *j->p == ']') {
                    j->p++;
                    break;
                }
                if (!f2 && !pt__json_expect(j, ',')) return pt__st_fmt("expected ','", (size_t)(j->p - hdr));
                f2 = 0;
                if (n > PT_MAX_DIMS || !pt__json_u64(j, &v[n]))
                    return is_shape && n > PT_MAX_DIMS
                               ? pt__fail(PT_ERR_FORMAT, "tensor has more than %d dimensions", PT_MAX_DIMS)
                               : pt__st_fmt("expected a non-negative integer", (size_t)(j->p - hdr));
                n++;
            }
            if (is_shape) {
                int i;
                if (n > PT_MAX_DIMS) return pt__fail(PT_ERR_FORMAT, "tensor has more than %d dimensions", PT_MAX_DIMS);
                for (i = 0; i < n; i++) {
                    if (v[i] > (uint64_t)INT64_MAX) return pt__st_fmt("dimension too large", (size_t)(j->p - hdr));
                    t->shape[i] = (int64_t)v[i];
                }
                t->ndim = n;
                have_shape = 1;
            } else {
                if (n != 2) return pt__st_fmt("data_offsets must hold 2 integers", (size_t)(j->p - hdr));
                t->begin = v[0];
                t->end = v[1];
                have_off = 1;
            }
        } else if (!pt__json_skip(j)) {
            return pt__st_fmt("bad value", (size_t)(j->p - hdr));
        }
    }
    if (r < 0) return pt__st_fmt("bad object member", (size_t)(j->p - hdr));
    if (!dtype || !have_shape || !have_off)
        return pt__fail(PT_ERR_FORMAT, "tensor '%s' lacks %s", t->name,
                        !dtype ? "\"dtype\"" : !have_shape ? "\"shape\"" : "\"data_offsets\"");
    t->dtype = pt__dtype_from_name(dtype);
    if (t->dtype == PT_DTYPE_NONE)
        return pt__fail(PT_ERR_DTYPE, "tensor '%s' has unknown dtype '%s'", t->name, dtype);
    return PT_OK;
}

static int pt__cmp_begin(const void *a, const void *b) {
    const pt_st_tensor *x = *(const pt_st_tensor *const *)a, *y = *(const pt_st_tensor *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

static int pt__cmp_name(const void *a, const void *b) {
    return strcmp((*(const pt_st_tensor *const *)a)->name, (*(const pt_st_tensor *const *)b)->name);
}

/* Sizes, offsets, overlaps and duplicate names, after parsing. */
static pt_status pt__st_validate(pt_safetensors *st, uint64_t data_size) {
    pt_st_tensor **order;
    pt_status s = PT_OK;
    int i;
    for (i = 0; i < st->n_tensors; i++) {
        pt_st_tensor *t = &st->tensors[i];
        uint64_t bytes = pt_dtype_size(t->dtype);
        int d;
        for (d = 0; d < t->ndim; d++)
            if (!pt__mul_ok(bytes, (uint64_t)t->shape[d], &bytes))
                return pt__fail(PT_ERR_SHAPE, "tensor '%s': shape overflows", t->name);
        if (t->begin > t->end || t->end > data_size)
            return pt__fail(PT_ERR_FORMAT,
                            "tensor '%s': data_offsets [%llu, %llu) out of range (data is %llu "
                            "bytes%s)", t->name, (unsigned long long)t->begin,
                            (unsigned long long)t->end, (unsigned long long)data_size,
                            t->begin <= t->end ? ": a truncated file?" : "");
        if (t->end - t->begin != bytes)
            return pt__fail(PT_ERR_SHAPE,
                            "tensor '%s': shape and dtype %s need %llu bytes but data_offsets "
                            "span %llu",
                            t->name, pt_dtype_name(t->dtype), (unsigned long long)bytes,
                            (unsigned long long)(t->end - t->begin));
    }
    if (st->n_tensors < 2) return PT_OK;
    order = (pt_st_tensor **)pt__malloc(sizeof(*order) * (size_t)st->n_tensors, st->alloc_ctx);
    if (!order) return pt__fail(PT_ERR_OOM, "out of memory validating safetensors");
    for (i = 0; i < st->n_tensors; i++) order[i] = &st->tensors[i];
    qsort(order, (size_t)st->n_tensors, sizeof(*order), pt__cmp_begin);
    {
        const pt_st_tensor *far = order[0]; /* the tensor reaching furthest so far */
        for (i = 1; i < st->n_tensors && s == PT_OK; i++) {
            if (order[i]->end > order[i]->begin && order[i]->begin < far->end)
                s = pt__fail(PT_ERR_FORMAT, "tensors '%s' and '%s' overlap in the data buffer",
                             far->name, order[i]->name);
            if (order[i]->end > far->end) far = order[i];
        }
    }
    qsort(order, (size_t)st->n_tensors, sizeof(*order), pt__cmp_name);
    for (i = 1; i < st->n_tensors && s == PT_OK; i++)
        if (strcmp(order[i]->name, order[i - 1]->name) == 0)
            s = pt__fail(PT_ERR_FORMAT, "tensor '%s' appears twice", order[i]->name);
    pt__free(order, st->alloc_ctx);
    return s;
}

/* ---- checksums ------------------------------------------------------------
   pt64 is our own 64-bit checksum, defined here in full: the bytes as
   little-endian 64-bit words go round-robin into four lanes (lane i starts at
   seed + (i + 1) * G), each taking a word w as x = rotl(x + w * K1, 31) * K2;
   then h = n, and for each lane h = mix(h ^ lane); the last n % 32 bytes go in
   one at a time as h = (h ^ byte) * K1; the result is mix(h), mix being
   splitmix64's finalizer. Each step is a bijection of the state given the
   other inputs, so a change confined to one 8-byte word is always detected,
   any other with probability 1 - 2^-64. Several GB/s on one core. */
#define PT__K1 0x9FB21C651E98DF25ull
#define PT__K2 0xC2B2AE3D27D4EB4Full
#define PT__G 0x9E3779B97F4A7C15ull

static uint64_t pt__le64(const unsigned char *p) {
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24 |
           (uint64_t)p[4] << 32 | (uint64_t)p[5] << 40 | (uint64_t)p[6] << 48 |
           (uint64_t)p[7] << 56;
}

static uint64_t pt__pt64(const void *data, size_t n, uint64_t seed) {
    const unsigned char *p = (const unsigned char *)data;
    uint64_t lane[4], h = (uint64_t)n;
    size_t i = 0;
    int k;
    for (k = 0; k < 4; k++) lane[k] = seed + (uint64_t)(k + 1) * PT__G;
    for (; i + 32 <= n; i += 32)
        for (k = 0; k < 4; k++) {
            uint64_t x = lane[k] + pt__le64(p + i + 8 * k) * PT__K1;
            lane[k] = ((x << 31) | (x >> 33)) * PT__K2;
        }
    for (k = 0; k < 4; k++) h = pt__mix64(h ^ lane[k]);
    for (; i < n; i++) h = (h ^ p[i]) * PT__K1;
    return pt__mix64(h);
}

/* a string with its terminating zero, so "ab","c" and "a","bc" differ */
static uint64_t pt__pt64_str(const char *s, uint64_t seed) {
    return pt__pt64(s, strlen(s) + 1, seed);
}

/* A tensor's checksum: its name, dtype and shape, then its bytes. */
static uint64_t pt__pt64_tensor(const pt_st_tensor *t) {
    unsigned char dims[8 * PT_MAX_DIMS];
    uint64_t h = pt__pt64_str(pt_dtype_name(t->dtype), pt__pt64_str(t->name, 0));
    int d, b;
    for (d = 0; d < t->ndim; d++)
        for (b = 0; b < 8; b++) dims[8 * d + b] = (unsigned char)((uint64_t)t->shape[d] >> (8 * b));
    h = pt__pt64(dims, 8 * (size_t)t->ndim, h);
    return pt__pt64(t->data, (size_t)(t->end - t->begin), h);
}

#define PT__SUM_PREFIX "pt64:"
#define PT__SUM_META "pt64:__metadata__"
static int pt__is_sum_key(const char *k) { return strncmp(k, PT__SUM_PREFIX, 5) == 0; }

/* The metadata's checksum: each key and value in order, checksums left out. */
static uint64_t pt__pt64_meta(const pt_st_meta *meta, int n) {
    uint64_t h = 0;
    int i;
    for (i = 0; i < n; i++)
        if (!pt__is_sum_key(meta[i].key))
            h = pt__pt64_str(meta[i].value, pt__pt64_str(meta[i].key, h));
    return h;
}

static int pt__parse_hex64(const char *s, uint64_t *out) {
    uint64_t v = 0;
    int i;
    for (i = 0; i < 16; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return 0;
        v = v << 4 | (uint64_t)d;
    }
    *out = v;
    return s[16] == 0;
}

/* Verifies the checksums of a parsed file that has them, then drops them
   from meta. A file with checksums must have one for the metadata and each
   tensor, and none for anything else. */
static pt_status pt__st_verify(pt_safetensors *st) {
    uint64_t want, got;
    const char *v;
    int i, k, sums = 0, used = 0;
    for (i = 0; i < st->n_meta; i++) sums += pt__is_sum_key(st->meta[i].key);
    if (sums == 0) return PT_OK; /* written without checksums: nothing to verify */
    v = pt_st_meta_get(st, PT__SUM_META);
    if (!v || !pt__parse_hex64(v, &want))
        return pt__fail(PT_ERR_FORMAT, "the metadata's checksum '%s' is %s: the header is corrupt",
                        PT__SUM_META, v ? "not 16 hex digits" : "missing");
    if ((got = pt__pt64_meta(st->meta, st->n_meta)) != want)
        return pt__fail(PT_ERR_FORMAT, "the metadata fails its checksum (stored %016llx, computed "
                        "%016llx): the header is corrupt", (unsigned long long)want,
                        (unsigned long long)got);
    for (i = 0; i < st->n_tensors; i++) {
        const pt_st_tensor *t = &st->tensors[i];
        for (k = 0, v = NULL; k < st->n_meta && !v; k++)
            if (pt__is_sum_key(st->meta[k].key) && strcmp(st->meta[k].key + 5, t->name) == 0)
                v = st->meta[k].value;
        if (!v || !pt__parse_hex64(v, &want))
            return pt__fail(PT_ERR_FORMAT, "tensor '%s' has %s checksum: the header is corrupt",
                            t->name, v ? "a malformed" : "no");
        if ((got = pt__pt64_tensor(t)) != want)
            return pt__fail(PT_ERR_FORMAT, "tensor '%s' fails its checksum (stored %016llx, "
                            "computed %016llx): the file is corrupt", t->name,
                            (unsigned long long)want, (unsigned long long)got);
    }
    if (sums != st->n_tensors + 1)
        return pt__fail(PT_ERR_FORMAT, "%d checksums for %d tensors and the metadata: the header "
                        "is corrupt", sums, st->n_tensors);
    for (i = 0; i < st->n_meta; i++)
        if (!pt__is_sum_key(st->meta[i].key)) st->meta[used++] = st->meta[i];
    st->n_meta = used;
    st->checksummed = 1;
    return PT_OK;
}

PTRAINDEF pt_status pt_st_parse(pt_safetensors *st, const void *data, size_t size) {
    const unsigned char *b = (const unsigned char *)data;
    uint64_t hlen = 0;
    pt__json j;
    const char *key;
    int first = 1, r, i, cap_t = 0, cap_m = 0;
    pt_status s;
    void *ctx = st->alloc_ctx;
    memset(st, 0, sizeof *st);
    st->alloc_ctx = ctx;
    if (size < 8)
        return pt__fail(PT_ERR_FORMAT, "file of %zu bytes is too short for a safetensors header", size);
    for (i = 7; i >= 0; i--) hlen = (hlen << 8) | b[i];
    if (hlen < 2 || hlen > size - 8)
        return pt__fail(PT_ERR_FORMAT,
                        "safetensors header length %llu is beyond the file size of %zu bytes "
                        "(a truncated file?)",
                        (unsigned long long)hlen, size);
    if (hlen > (100u << 20))
        return pt__fail(PT_ERR_FORMAT, "safetensors header length %llu exceeds 100 MB",
                        (unsigned long long)hlen);
    st->file_size = size;
    st->strings = (char *)pt__malloc((size_t)hlen + 1, ctx);
    if (!st->strings) return pt__fail(PT_ERR_OOM, "out of memory reading a safetensors header");
    j.p = (const char *)b + 8;
    j.end = j.p + hlen;
    j.pool = st->strings;
    j.pool_used = 0;
    j.pool_cap = (size_t)hlen + 1;
    j.depth = 0;
    if (!pt__json_expect(&j, '{')) {
        s = pt__st_fmt("the header is not a JSON object", 0);
        goto fail;
    }
    while ((r = pt__json_member(&j, &first, &key)) == 1) {
        if (strcmp(key, "__metadata__") == 0) {
            int f2 = 1, r2;
            const char *k2, *v2;
            if (!pt__json_expect(&j, '{')) {
                s = pt__st_fmt("__metadata__ is not an object", (size_t)(j.p - (const char *)b - 8));
                goto fail;
            }
            while ((r2 = pt__json_member(&j, &f2, &k2)) == 1) {
                if (!(v2 = pt__json_string(&j))) {
                    s = pt__fail(PT_ERR_FORMAT, "metadata value of '%s' is not a string", k2);
                    goto fail;
                }
                if (!pt__grow((void **)&st->meta, &cap_m, st->n_meta + 1, sizeof *st->meta, ctx)) {
                    s = pt__fail(PT_ERR_OOM, "out of memory reading safetensors metadata");
                    goto fail;
                }
                st->meta[st->n_meta].key = k2;
                st->meta[st->n_meta++].value = v2;
            }
            if (r2 < 0) {
                s = pt__st_fmt("bad __metadata__ member", (size_t)(j.p - (const char *)b - 8));
                goto fail;
            }
        } else {
            pt_st_tensor *t;
            if (!pt__grow((void **)&st->tensors, &cap_t, st->n_tensors + 1, sizeof *st->tensors, ctx)) {
                s = pt__fail(PT_ERR_OOM, "out of memory reading safetensors entries");
                goto fail;
            }
            t = &st->tensors[st->n_tensors++];
            memset(t, 0, sizeof *t);
            t->name = key;
            if ((s = pt__st_entry(&j, (const char *)b + 8, t)) != PT_OK) goto fail;
        }
    }
    if (r < 0) {
        s = pt__st_fmt("bad object member", (size_t)(j.p - (const char *)b - 8));
        goto fail;
    }
    pt__ws(&j);
    if (j.p != j.end) {
        s = pt__st_fmt("trailing bytes after the header object", (size_t)(j.p - (const char *)b - 8));
        goto fail;
    }
    if ((s = pt__st_validate(st, (uint64_t)(size - 8 - hlen))) != PT_OK) goto fail;
    for (i = 0; i < st->n_tensors; i++) st->tensors[i].data = b + 8 + hlen + st->tensors[i].begin;
    if ((s = pt__st_verify(st)) != PT_OK) goto fail;
    return PT_OK;
fail:
    pt__free(st->strings, ctx);
    pt__free(st->tensors, ctx);
    pt__free(st->meta, ctx);
    memset(st, 0, sizeof *st);
    st->alloc_ctx = ctx;
    return s;
}

PTRAINDEF pt_status pt_st_load(pt_safetensors *st, const char *path) {
    unsigned char *buf;
    size_t size;
    void *ctx = st->alloc_ctx;
    pt_status s;
    memset(st, 0, sizeof *st);
    st->alloc_ctx = ctx;
    if ((s = pt_file_read(path, &buf, &size, ctx)) != PT_OK) return s;
    if ((s = pt_st_parse(st, buf, size)) != PT_OK) {
        pt__free(buf, ctx);
        return pt__fail_path(s, path);
    }
    st->file = buf;
    return PT_OK;
}

PTRAINDEF void pt_st_free(pt_safetensors *st) {
    void *ctx = st->alloc_ctx;
    pt__free(st->file, ctx);
    pt__free(st->strings, ctx);
    pt__free(st->tensors, ctx);
    pt__free(st->meta, ctx);
    memset(st, 0, sizeof *st);
    st->alloc_ctx = ctx;
}

PTRAINDEF const pt_st_tensor *pt_st_find(const pt_safetensors *st, const char *name) {
    int i;
    for (i = 0; i < st->n_tensors; i++)
        if (strcmp(st->tensors[i].name, name) == 0) return &st->tensors[i];
    return NULL;
}

PTRAINDEF const char *pt_st_meta_get(const pt_safetensors *st, const char *key) {
    int i;
    for (i = 0; i < st->n_meta; i++)
        if (strcmp(st->meta[i].key, key) == 0) return st->meta[i].value;
    return NULL;
}

static void pt__shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t used = 0;
    int i;
    buf[0] = 0;
    used += (size_t)snprintf(buf, n, "[");
    for (i = 0; i < ndim && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (used < n) snprintf(buf + used, n - used, "]");
}

/* Finds name and checks its shape. */
static pt_status pt__st_lookup(const pt_safetensors *st, const char *name, int ndim,
                               const int64_t *shape, const pt_st_tensor **out) {
    const pt_st_tensor *t = pt_st_find(st, name);
    int i, ok;
    if (!t) return pt__fail(PT_ERR_MISSING, "tensor '%s' not found", name);
    ok = t->ndim == ndim;
    for (i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
    if (!ok) {
        char a[128], b[128];
        pt__shape_str(a, sizeof a, t->ndim, t->shape);
        pt__shape_str(b, sizeof b, ndim, shape);
        return pt__fail(PT_ERR_SHAPE, "tensor '%s' has shape %s, expected %s", name, a, b);
    }
    *out = t;
    return PT_OK;
}

static float pt__half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
    float f;
    if (exp == 0) { /* zero or subnormal: man * 2^-24 */
        f = (float)man * (1.0f / 16777216.0f);
        return sign ? -f : f;
    }
    bits = exp == 31 ? (sign | 0x7F800000u | (man << 13)) : (sign | ((exp + 112) << 23) | (man << 13));
    memcpy(&f, &bits, 4);
    return f;
}

PTRAINDEF pt_status pt_st_read_f32(const pt_safetensors *st, const char *name, float *dst,
                                   int ndim, const int64_t *shape) {
    const pt_st_tensor *t;
    size_t n, i;
    pt_status s = pt__st_lookup(st, name, ndim, shape, &t);
    if (s != PT_OK) return s;
    n = (size_t)((t->end - t->begin) / pt_dtype_size(t->dtype));
    switch (t->dtype) {
    case PT_F32: memcpy(dst, t->data, n * 4); break;
    case PT_F16:
    case PT_BF16:
        for (i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, t->data + 2 * i, 2);
            if (t->dtype == PT_BF16) {
                uint32_t bits = (uint32_t)h << 16;
                memcpy(&dst[i], &bits, 4);
            } else {
                dst[i] = pt__half_to_float(h);
            }
        }
        break;
    case PT_F64:
        for (i = 0; i < n; i++) {
            double d;
            memcpy(&d, t->data + 8 * i, 8);
            dst[i] = (float)d;
        }
        break;
    default:
        return pt__fail(PT_ERR_DTYPE, "tensor '%s' has dtype %s; expected a float dtype", name,
                        pt_dtype_name(t->dtype));
    }
    return PT_OK;
}

PTRAINDEF pt_status pt_st_read_i32(const pt_safetensors *st, const char *name, int *dst,
                                   int ndim, const int64_t *shape) {
    const pt_st_tensor *t;
    pt_status s = pt__st_lookup(st, name, ndim, shape, &t);
    if (s != PT_OK) return s;
    if (t->dtype != PT_I32)
        return pt__fail(PT_ERR_DTYPE, "tensor '%s' has dtype %s; expected I32", name,
                        pt_dtype_name(t->dtype));
    memcpy(dst, t->data, (size_t)(t->end - t->begin));
    return PT_OK;
}

/* ---- writer ------------------------------------------------------------- */

PTRAINDEF void pt_st_writer_init(pt_st_writer *w) {
    void *ctx = w->alloc_ctx;
    memset(w, 0, sizeof *w);
    w->alloc_ctx = ctx;
}

PTRAINDEF pt_status pt_st_writer_add(pt_st_writer *w, const char *name, pt_dtype dtype,
                                     int ndim, const int64_t *shape, const void *data) {
    pt_st_tensor *t;
    uint64_t bytes = pt_dtype_size(dtype);
    int i;
    if (!name || !*name || strcmp(name, "__metadata__") == 0 || bytes == 0 || ndim < 0 ||
        ndim > PT_MAX_DIMS)
        return pt__fail(PT_ERR_INVALID_ARG, "cannot add tensor '%s' (dtype %d, ndim %d)",
                        name ? name : "(null)", (int)dtype, ndim);
    for (i = 0; i < ndim; i++)
        if (shape[i] < 0 || !pt__mul_ok(bytes, (uint64_t)shape[i], &bytes))
            return pt__fail(PT_ERR_INVALID_ARG, "tensor '%s' has a bad shape", name);
    for (i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0)
            return pt__fail(PT_ERR_INVALID_ARG, "tensor '%s' was already added", name);
    if (!pt__grow((void **)&w->tensors, &w->cap_tensors, w->n_tensors + 1, sizeof *t, w->alloc_ctx))
        return pt__fail(PT_ERR_OOM, "out of memory adding tensor '%s'", name);
    t = &w->tensors[w->n_tensors];
    memset(t, 0, sizeof *t);
    if (!(t->name = pt__strdup(name, w->alloc_ctx))) return pt__fail(PT_ERR_OOM, "out of memory");
    t->dtype = dtype;
    t->ndim = ndim;
    for (i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->end = bytes; /* size for now; offsets are assigned at save */
    t->data = (const unsigned char *)data;
    w->n_tensors++;
    return PT_OK;
}

PTRAINDEF pt_status pt_st_writer_meta(pt_st_writer *w, const char *key, const char *value) {
    pt_st_meta *m;
    if (!key || !value || pt__is_sum_key(key))
        return pt__fail(PT_ERR_INVALID_ARG, "metadata key '%s' %s", key ? key : "(null)",
                        key && value ? "is reserved for checksums" : "or its value is NULL");
    if (!pt__grow((void **)&w->meta, &w->cap_meta, w->n_meta + 1, sizeof *m, w->alloc_ctx))
        return pt__fail(PT_ERR_OOM, "out of memory adding metadata");
    m = &w->meta[w->n_meta];
    m->key = pt__strdup(key, w->alloc_ctx);
    m->value = pt__strdup(value, w->alloc_ctx);
    if (!m->key || !m->value) return pt__fail(PT_ERR_OOM, "out of memory adding metadata");
    w->n_meta++;
    return PT_OK;
}

PTRAINDEF void pt_st_writer_free(pt_st_writer *w) {
    int i;
    for (i = 0; i < w->n_tensors; i++) pt__free((void *)w->tensors[i].name, w->alloc_ctx);
    for (i = 0; i < w->n_meta; i++) {
        pt__free((void *)w->meta[i].key, w->alloc_ctx);
        pt__free((void *)w->meta[i].value, w->alloc_ctx);
    }
    pt__free(w->tensors, w->alloc_ctx);
    pt__free(w->meta, w->alloc_ctx);
    pt_st_writer_init(w);
}

/* Appends s: raw (quote 0), as a JSON string literal (1), or escaped without
   the quotes (2); returns the new length (may exceed cap: then nothing past
   cap was written and the caller retries with a bigger buffer). */
static size_t pt__json_put(char *buf, size_t cap, size_t len, const char *s, int quote) {
    const unsigned char *p = (const unsigned char *)s;
#define PT__PUT(ch) do { if (len < cap) buf[len] = (char)(ch); len++; } while (0)
    if (quote == 1) PT__PUT('"');
    for (; *p; p++) {
        if (!quote) PT__PUT(*p);
        else if (*p == '"' || *p == '\\') { PT__PUT('\\'); PT__PUT(*p); }
        else if (*p < 0x20) {
            char e[8];
            int k;
            snprintf(e, sizeof e, "\\u%04x", *p);
            for (k = 0; e[k]; k++) PT__PUT(e[k]);
        } else PT__PUT(*p);
    }
    if (quote == 1) PT__PUT('"');
#undef PT__PUT
    return len;
}

/* The header; sums holds the metadata's checksum, then each tensor's. */
static size_t pt__st_header(const pt_st_writer *w, const uint64_t *sums, char *buf, size_t cap) {
    size_t len = 0;
    uint64_t off = 0;
    char num[96];
    int i, d;
    len = pt__json_put(buf, cap, len, "{\"__metadata__\":{", 0);
    for (i = 0; i < w->n_meta; i++) {
        len = pt__json_put(buf, cap, len, w->meta[i].key, 1);
        len = pt__json_put(buf, cap, len, ":", 0);
        len = pt__json_put(buf, cap, len, w->meta[i].value, 1);
        len = pt__json_put(buf, cap, len, ",", 0);
    }
    for (i = 0; i <= w->n_tensors; i++) {
        len = pt__json_put(buf, cap, len, i ? ",\"" PT__SUM_PREFIX : "\"" PT__SUM_META, 0);
        if (i) len = pt__json_put(buf, cap, len, w->tensors[i - 1].name, 2);
        snprintf(num, sizeof num, "\":\"%016llx\"", (unsigned long long)sums[i]);
        len = pt__json_put(buf, cap, len, num, 0);
    }
    len = pt__json_put(buf, cap, len, "}", 0);
    for (i = 0; i < w->n_tensors; i++) {
        const pt_st_tensor *t = &w->tensors[i];
        len = pt__json_put(buf, cap, len, ",", 0);
        len = pt__json_put(buf, cap, len, t->name, 1);
        len = pt__json_put(buf, cap, len, ":{\"dtype\":\"", 0);
        len = pt__json_put(buf, cap, len, pt_dtype_name(t->dtype), 0);
        len = pt__json_put(buf, cap, len, "\",\"shape\":[", 0);
        for (d = 0; d < t->ndim; d++) {
            snprintf(num, sizeof num, d ? ",%lld" : "%lld", (long long)t->shape[d]);
            len = pt__json_put(buf, cap, len, num, 0);
        }
        snprintf(num, sizeof num, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                 (unsigned long long)(off + t->end));
        len = pt__json_put(buf, cap, len, num, 0);
        off += t->end;
    }
    len = pt__json_put(buf, cap, len, "}", 0);
    while (len % 8) len = pt__json_put(buf, cap, len, " ", 0);
    return len;
}

/* The platform part of an atomic write of n parts to path, through tmp. */
#if defined(_WIN32)
static pt_status pt__write_atomic(const char *path, const char *tmp, const void *const *parts,
                                  const size_t *lens, int n) {
    FILE *f = fopen(tmp, "wb");
    int i, ok = 1;
    if (!f) return pt__fail(PT_ERR_IO, "cannot create '%s': %s", tmp, strerror(errno));
    for (i = 0; ok && i < n; i++) ok = fwrite(parts[i], 1, lens[i], f) == lens[i];
    ok = (fflush(f) == 0) && ok && _commit(_fileno(f)) == 0;
    ok = (fclose(f) == 0) && ok;
    if (ok) {
        remove(path);
        ok = rename(tmp, path) == 0;
    }
    if (!ok) {
        remove(tmp);
        return pt__fail(PT_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
    }
    return PT_OK;
}
#else
static int pt__write_all(int fd, const unsigned char *p, size_t n) {
    while (n > 0) {
        ssize_t k = write(fd, p, n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return 0;
        p += k;
        n -= (size_t)k;
    }
    return 1;
}

#ifdef PTRAIN_TEST_HOOKS
/* Test hook (builds with -DPTRAIN_TEST_HOOKS only): PTRAIN_TEST_WRITE_DELAY_MS=n
   pauses n ms after each part (a checkpoint's tensor), so that a test's kill
   lands in the middle of a write. */
static void pt__write_delay(void) {
    const char *e = getenv("PTRAIN_TEST_WRITE_DELAY_MS");
    int ms = e ? atoi(e) : 0;
    struct timespec ts;
    if (ms <= 0) return;
    ts.tv_sec = ms / 1000;
    ts.tv_nsec = (long)(ms % 1000) * 1000000L;
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}
#else
static void pt__write_delay(void) {}
#endif

/* Durable and atomic: the bytes reach the disk (fsync) before the rename
   makes them the file, and the rename reaches it (fsync of the directory)
   before we return. A crash at any point leaves path old or new, never
   partial; at worst a stale tmp, which the next write truncates. */
static pt_status pt__write_atomic(const char *path, const char *tmp, const void *const *parts,
                                  const size_t *lens, int n) {
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644), i, ok = 1, err = 0;
    char dir[4096];
    const char *slash;
    if (fd < 0)
        return pt__fail(PT_ERR_IO, "cannot write '%s': cannot create '%s': %s (the previous file, "
                        "if any, is intact)", path, tmp, strerror(errno));
    for (i = 0; ok && i < n; i++) {
        ok = pt__write_all(fd, (const unsigned char *)parts[i], lens[i]);
        pt__write_delay();
    }
    if (ok) ok = fsync(fd) == 0;
    if (!ok) err = errno;
    if (close(fd) != 0 && ok) {
        ok = 0;
        err = errno;
    }
    if (ok && rename(tmp, path) != 0) {
        ok = 0;
        err = errno;
    }
    if (!ok) {
        remove(tmp);
        return pt__fail(PT_ERR_IO, "cannot write '%s': %s (the previous file, if any, is intact)",
                        path, strerror(err ? err : EIO));
    }
    /* make the rename itself durable */
    slash = strrchr(path, '/');
    if (slash && (size_t)(slash - path) < sizeof dir) {
        memcpy(dir, path, (size_t)(slash - path));
        dir[slash - path] = 0;
        if (slash == path) strcpy(dir, "/");
    } else {
        strcpy(dir, ".");
    }
    if ((fd = open(dir, O_RDONLY)) >= 0) {
        fsync(fd);
        close(fd);
    }
    return PT_OK;
}
#endif

/* Writes n parts to path atomically: PATH.tmp, fsync, rename; on failure the
   old file, if any, is intact. */
static pt_status pt__write_file(const char *path, const void *const *parts, const size_t *lens,
                                int n, void *ctx) {
    size_t plen = strlen(path);
    char *tmp = (char *)pt__malloc(plen + 5, ctx);
    pt_status s;
    if (!tmp) return pt__fail(PT_ERR_OOM, "out of memory writing '%s'", path);
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    s = pt__write_atomic(path, tmp, parts, lens, n);
    pt__free(tmp, ctx);
    return s;
}

PTRAINDEF pt_status pt_st_writer_save(const pt_st_writer *w, const char *path) {
    size_t hl, *lens;
    unsigned char *head = NULL;
    const void **parts = (const void **)pt__malloc(sizeof(void *) * (size_t)(w->n_tensors + 1),
                                                   w->alloc_ctx);
    uint64_t *sums = (uint64_t *)pt__malloc(sizeof(uint64_t) * (size_t)(w->n_tensors + 1),
                                            w->alloc_ctx);
    pt_status s;
    int i;
    lens = (size_t *)pt__malloc(sizeof(size_t) * (size_t)(w->n_tensors + 1), w->alloc_ctx);
    if (sums) { /* the checksums first: the header's size depends on nothing else */
        sums[0] = pt__pt64_meta(w->meta, w->n_meta);
        for (i = 0; i < w->n_tensors; i++) {
            pt_st_tensor t = w->tensors[i]; /* end is the size until offsets are assigned */
            t.begin = 0;
            sums[i + 1] = pt__pt64_tensor(&t);
        }
    }
    hl = sums ? pt__st_header(w, sums, NULL, 0) : 0;
    if (sums) head = (unsigned char *)pt__malloc(8 + hl, w->alloc_ctx);
    if (!head || !parts || !lens) {
        s = pt__fail(PT_ERR_OOM, "out of memory writing '%s'", path);
        goto out;
    }
    for (i = 0; i < 8; i++) head[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    pt__st_header(w, sums, (char *)head + 8, hl);
    parts[0] = head, lens[0] = 8 + hl;
    for (i = 0; i < w->n_tensors; i++)
        parts[i + 1] = w->tensors[i].data, lens[i + 1] = (size_t)w->tensors[i].end;
    s = pt__write_file(path, parts, lens, w->n_tensors + 1, w->alloc_ctx);
out:
    pt__free(head, w->alloc_ctx);
    pt__free((void *)parts, w->alloc_ctx);
    pt__free(lens, w->alloc_ctx);
    pt__free(sums, w->alloc_ctx);
    return s;
}


/* ---- timelines: Chrome trace JSON and SVG ---------------------------------- */

/* A growing text buffer; on allocation failure it stops growing and says so. */
typedef struct pt__text {
    char *p;
    size_t len, cap;
    int oom;
    void *ctx;
} pt__text;

#if defined(__GNUC__) || defined(__clang__)
__attribute__((format(printf, 2, 3)))
#endif
static void pt__textf(pt__text *b, const char *fmt, ...) {
    va_list ap;
    int n;
    if (b->oom) return;
    for (;;) {
        size_t room = b->cap - b->len;
        va_start(ap, fmt);
        n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? room : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if (b->p && (size_t)n < room) {
            b->len += (size_t)n;
            return;
        }
        {
            size_t ncap = b->cap ? b->cap * 2 : 4096;
            char *q;
            while (ncap < b->len + (size_t)n + 1) ncap *= 2;
            q = (char *)pt__malloc(ncap, b->ctx);
            if (!q) {
                b->oom = 1;
                return;
            }
            if (b->p) memcpy(q, b->p, b->len);
            pt__free(b->p, b->ctx);
            b->p = q;
            b->cap = ncap;
        }
    }
}

/* s with JSON/XML's special characters escaped (into b) */
static void pt__text_escaped(pt__text *b, const char *s, int xml) {
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (xml && (c == '<' || c == '>' || c == '&' || c == '"'))
            pt__textf(b, "%s", c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '&' ? "&amp;" : "&quot;");
        else if (!xml && (c == '"' || c == '\\')) pt__textf(b, "\\%c", c);
        else if (c < 0x20) pt__textf(b, xml ? " " : "\\u%04x", c);
        else pt__textf(b, "%c", c);
    }
}

static pt_status pt__text_save(pt__text *b, const char *path) {
    const void *parts[1];
    size_t lens[1];
    pt_status s;
    if (b->oom) s = pt__fail(PT_ERR_OOM, "out of memory writing '%s'", path);
    else {
        parts[0] = b->p, lens[0] = b->len;
        s = pt__write_file(path, parts, lens, 1, b->ctx);
    }
    pt__free(b->p, b->ctx);
    b->p = NULL;
    return s;
}

static const char *pt__trace_cat[PT_TRACE_KIND_COUNT] = {
    "forward", "backward", "weight gradient", "communication", "communication",
    "communication", "communication", "optimizer", "communication", "dp reduction",
    "parameter gather"};

static const char *pt__trace_cat_of(const pt_trace_event *e) {
    return e->kind >= 0 && e->kind < PT_TRACE_KIND_COUNT ? pt__trace_cat[e->kind] : "other";
}

/* "F3", "B0b": the action's letter, micro-batch and (with chunks) chunk;
   "D3", "G3": bucket 3's dp reduction and parameter gather */
static void pt__trace_label(char *buf, size_t n, const pt_trace_event *e, int chunks) {
    static const char letter[PT_TRACE_KIND_COUNT] = {'F', 'B', 'W', 's', 'r', 's', 'r', 'O', 'R',
                                                     'D', 'G'};
    char c = e->kind >= 0 && e->kind < PT_TRACE_KIND_COUNT ? letter[e->kind] : '?';
    if (e->micro < 0) snprintf(buf, n, "%c", c);
    else if (chunks && e->kind < PT_ACT_COUNT)
        snprintf(buf, n, "%c%d%c", c, e->micro, 'a' + (e->chunk > 0 ? e->chunk % 26 : 0));
    else snprintf(buf, n, "%c%d", c, e->micro);
}

static int pt__trace_chunked(const pt_trace *t) {
    int i;
    for (i = 0; i < t->count; i++)
        if (t->events[i].chunk > 0 && t->events[i].kind < PT_ACT_COUNT) return 1;
    return 0;
}

/* Whether any event is communication behind computation (a lane of its
   own), and the earliest start (a gather the last step started: before 0)
   or 0: the writers' time origin. */
static int pt__trace_lanes(const pt_trace *t, double *origin) {
    int i, lanes = 0;
    *origin = 0.0;
    for (i = 0; i < t->count; i++) {
        if (t->events[i].kind >= PT_ACT_COUNT) lanes = 1;
        if (t->events[i].start < *origin) *origin = t->events[i].start;
    }
    return lanes;
}

PTRAINDEF pt_status pt_trace_write_chrome(const pt_trace *t, const char *path) {
    pt__text b;
    int i, chunks = pt__trace_chunked(t), lanes;
    double origin;
    char label[32];
    const char *tn = t->track_name ? t->track_name : "rank";
    memset(&b, 0, sizeof b);
    b.ctx = t->alloc_ctx;
    lanes = pt__trace_lanes(t, &origin);
    pt__textf(&b, "{\"displayTimeUnit\": \"ms\", \"otherData\": {\"title\": \"");
    pt__text_escaped(&b, t->title ? t->title : "ptrain", 0);
    pt__textf(&b, "\"}, \"traceEvents\": [\n  {\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 0, "
                  "\"tid\": 0, \"args\": {\"name\": \"");
    pt__text_escaped(&b, t->title ? t->title : "ptrain", 0);
    pt__textf(&b, "\"}}");
    /* a thread per track, and its communication lane the thread ntracks + track */
    for (i = 0; i < t->ntracks * (lanes + 1); i++)
        pt__textf(&b, ",\n  {\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, "
                      "\"args\": {\"name\": \"%s %d%s\"}},\n  {\"name\": \"thread_sort_index\", "
                      "\"ph\": \"M\", \"pid\": 0, \"tid\": %d, \"args\": {\"sort_index\": %d}}",
                  i, tn, i % t->ntracks, i >= t->ntracks ? " comm" : "", i,
                  lanes ? 2 * (i % t->ntracks) + (i >= t->ntracks) : i);
    for (i = 0; i < t->count; i++) {
        const pt_trace_event *e = &t->events[i];
        pt__trace_label(label, sizeof label, e, chunks);
        pt__textf(&b, ",\n  {\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": 0, "
                      "\"tid\": %d, \"ts\": %.3f, \"dur\": %.3f, \"args\": {\"%s\": %d, "
                      "\"chunk\": %d, \"%s\": %d}}",
                  label, pt__trace_cat_of(e), e->track + (e->kind >= PT_ACT_COUNT ? t->ntracks : 0),
                  (e->start - origin) * 1e6, e->dur * 1e6,
                  e->kind >= PT_ACT_COUNT ? "bucket" : "micro", e->micro, e->chunk,
                  e->kind >= PT_ACT_COUNT ? "started_in" : "index", e->at);
    }
    pt__textf(&b, "\n]}\n");
    return pt__text_save(&b, path);
}

/* The legend's entries (forward, backward, weight gradient, communication,
   optimizer, idle, dp reduction, parameter gather) and each kind's entry. */
static const char *pt__trace_legend[8] = {"forward", "backward", "weight gradient",
                                          "communication", "optimizer", "idle", "dp reduction",
                                          "parameter gather"};
static const char *pt__trace_legend_fill[8] = {"#4e79a7", "#59a14f", "#f28e2b", "#b07aa1",
                                               "#e15759", "#e6e6e6", "#9c755f", "#76b7b2"};
static const int pt__trace_entry[PT_TRACE_KIND_COUNT] = {0, 1, 2, 3, 3, 3, 3, 4, 3, 6, 7};

/* A tick step of 1, 2 or 5 times a power of ten giving at most about n
   ticks over span. */
static double pt__nice_step(double span, int n) {
    double raw = span > 0.0 ? span / n : 1.0, p = pow(10.0, floor(log10(raw)));
    return raw <= p ? p : raw <= 2.0 * p ? 2.0 * p : raw <= 5.0 * p ? 5.0 * p : 10.0 * p;
}

/* Which legend entries the picture shows (used[8]): each kind with a box
   half a pixel wide or more at scale (a thinner one is drawn, but not seen
   under its white edge), and idle where a track's actions leave half a
   pixel or more of its row uncovered. */
static void pt__trace_used(const pt_trace *t, double scale, double plot, int used[8]) {
    int i, k;
    memset(used, 0, 8 * sizeof *used);
    for (k = 0; k < t->ntracks; k++) {
        double busy = 0.0; /* (a track's actions do not overlap) */
        for (i = 0; i < t->count; i++) {
            const pt_trace_event *e = &t->events[i];
            if (e->track != k || e->dur <= 0.0) continue;
            if (e->kind >= 0 && e->kind < PT_TRACE_KIND_COUNT && e->dur * scale >= 0.5)
                used[pt__trace_entry[e->kind]] = 1;
            if (e->kind < PT_ACT_COUNT) busy += e->dur * scale;
        }
        if (busy < plot - 0.5) used[5] = 1;
    }
}

/* Under the rows, from y down: the time axis (ticks in the trace's unit,
   its name at the end) and the legend of the entries used, 6 a row. */
static void pt__trace_svg_foot(pt__text *b, const pt_trace *t, double y, double left, double plot,
                               double origin, double end, const int used[8]) {
    double unit = t->unit > 0.0 ? t->unit : 1e-3, lo = origin / unit, span = end / unit;
    double step = pt__nice_step(span, 8), v, x;
    int i, j;
    for (v = ceil(lo / step - 1e-9) * step; span > 0.0 && v <= lo + span * (1 + 1e-9); v += step) {
        x = left + (v - lo) / span * plot;
        pt__textf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#999\"/>"
                     "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%g</text>\n",
                  x, y, x, y + 3.0, x, y + 14.0, fabs(v) < 1e-9 * step ? 0.0 : v);
    }
    pt__textf(b, "<text x=\"%.1f\" y=\"%.1f\">", left + plot + 12.0, y + 14.0);
    pt__text_escaped(b, t->unit_name ? t->unit_name : "ms", 1);
    pt__textf(b, "</text>\n");
    for (i = j = 0; i < 8; i++)
        if (used[i]) {
            pt__textf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"12\" height=\"12\" fill=\"%s\"/>"
                         "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", left + (j % 6) * 150.0,
                      y + 30.0 + (j / 6) * 20.0, pt__trace_legend_fill[i],
                      left + (j % 6) * 150.0 + 16.0, y + 40.0 + (j / 6) * 20.0, pt__trace_legend[i]);
            j++;
        }
}

PTRAINDEF pt_status pt_trace_write_svg(const pt_trace *t, const char *path) {
    static const char *fill[PT_TRACE_KIND_COUNT] = {"#4e79a7", "#59a14f", "#f28e2b", "#b07aa1",
                                                    "#b07aa1", "#b07aa1", "#b07aa1", "#e15759",
                                                    "#b07aa1", "#9c755f", "#76b7b2"};
    const double left = 90.0, plot = 1000.0, row = 26.0, gap = 6.0, top = 44.0;
    const char *uname = t->unit_name ? t->unit_name : "ms";
    double end = 0.0, scale, width = left + plot + 90.0, height, origin, lane, pitch;
    double unit = t->unit > 0.0 ? t->unit : 1e-3;
    int i, k, used[8], chunks = pt__trace_chunked(t), lanes = pt__trace_lanes(t, &origin);
    int nu = (int)strlen(uname);
    pt__text b;
    char label[32];
    memset(&b, 0, sizeof b);
    b.ctx = t->alloc_ctx;
    lane = lanes ? row * 0.6 : 0.0; /* each track's communication, under it */
    pitch = row + lane + gap;
    for (i = 0; i < t->count; i++)
        if (t->events[i].start + t->events[i].dur > end) end = t->events[i].start + t->events[i].dur;
    end -= origin;
    scale = end > 0.0 ? plot / end : 1.0;
    pt__trace_used(t, scale, plot, used);
    for (i = 0, k = 0; i < 8; i++) k += used[i];
    height = top + t->ntracks * pitch + 50.0 + 20.0 * ((k + 5) / 6); /* the legend's rows */
    pt__textf(&b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                  "font-family=\"sans-serif\" font-size=\"11\">\n"
                  "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n<text x=\"%.0f\" y=\"22\" "
                  "font-size=\"14\">", width, height, left);
    pt__text_escaped(&b, t->title ? t->title : "ptrain", 1);
    pt__textf(&b, "</text>\n");
    for (i = 0; i < t->ntracks; i++) { /* each row idle (grey) until work covers it */
        double y = top + i * pitch;
        pt__textf(&b, "<text x=\"8\" y=\"%.1f\">%s %d</text>\n<rect x=\"%.1f\" y=\"%.1f\" "
                      "width=\"%.1f\" height=\"%.1f\" fill=\"#e6e6e6\"/>\n",
                  y + row * 0.65, t->track_name ? t->track_name : "rank", i, left, y, plot, row);
        if (lanes)
            pt__textf(&b, "<text x=\"20\" y=\"%.1f\" font-size=\"9\">comm</text>\n<rect "
                          "x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#f4f4f4\"/>\n",
                      y + row + lane * 0.75, left, y + row, plot, lane);
    }
    for (i = 0; i < t->count; i++) {
        const pt_trace_event *e = &t->events[i];
        int comm = e->kind >= PT_ACT_COUNT;
        double x = left + (e->start - origin) * scale, w = e->dur * scale, d = e->dur / unit;
        double y = top + e->track * pitch + (comm ? row : 0.0), h = comm ? lane : row;
        const char *shown = label;
        if (w <= 0.0) continue;
        pt__trace_label(label, sizeof label, e, chunks);
        /* odd chunks lighter, as Megatron-LM draws interleaving; "1 time unit" */
        pt__textf(&b, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\" "
                      "fill-opacity=\"%s\" stroke=\"white\" stroke-width=\"0.5\"><title>%s "
                      "(%s, %.4g %.*s)</title></rect>\n",
                  x, y, w, h, e->kind >= 0 && e->kind < PT_TRACE_KIND_COUNT ? fill[e->kind] : "#999",
                  !comm && e->chunk > 0 && e->chunk % 2 ? "0.6" : "1", label, pt__trace_cat_of(e),
                  d, d == 1.0 && nu > 1 && uname[nu - 1] == 's' ? nu - 1 : nu, uname);
        /* the whole label where it fits, else the micro-batch (and chunk) alone */
        if (w < 7.0 * (double)strlen(label) && e->micro >= 0) shown = label + 1;
        if (w >= 7.0 * (double)strlen(shown))
            pt__textf(&b, "<text x=\"%.2f\" y=\"%.1f\" fill=\"white\" text-anchor=\"middle\"%s>%s"
                          "</text>\n", x + w / 2, y + h * 0.65, comm ? " font-size=\"9\"" : "", shown);
    }
    pt__trace_svg_foot(&b, t, top + t->ntracks * pitch + 4.0, left, plot, origin, end, used);
    pt__textf(&b, "</svg>\n");
    return pt__text_save(&b, path);
}

PTRAINDEF pt_status pt_plot_write_svg(const char *path, const char *title, const char *x_label,
                                      const char *y_label, const pt_plot_series *series,
                                      int count) {
    static const char *colour[4] = {"#4e79a7", "#e15759", "#59a14f", "#f28e2b"};
    const double left = 70.0, top = 40.0, w = 640.0, h = 320.0;
    double x0 = HUGE_VAL, x1 = -HUGE_VAL, y0 = HUGE_VAL, y1 = -HUGE_VAL;
    int i, k;
    pt__text b;
    memset(&b, 0, sizeof b);
    if (count < 0 || (count > 0 && !series))
        return pt__fail(PT_ERR_INVALID_ARG, "plot: count=%d series", count);
    for (k = 0; k < count; k++)
        for (i = 0; i < series[k].n; i++)
            if (isfinite(series[k].y[i]) && isfinite(series[k].x[i])) {
                x0 = fmin(x0, series[k].x[i]), x1 = fmax(x1, series[k].x[i]);
                y0 = fmin(y0, series[k].y[i]), y1 = fmax(y1, series[k].y[i]);
            }
    if (x0 > x1) x0 = 0.0, x1 = 1.0, y0 = 0.0, y1 = 1.0; /* no points: empty axes */
    if (x1 == x0) x1 = x0 + 1.0;
    if (y1 == y0) y1 = y0 + 1.0;
    /* (x, y) -> (left + w (x - x0) / (x1 - x0), top + h (y1 - y) / (y1 - y0)) */
    pt__textf(&b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                  "font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%%\" "
                  "height=\"100%%\" fill=\"white\"/>\n<text x=\"%.0f\" y=\"22\" "
                  "font-size=\"14\">", left + w + 160.0, top + h + 60.0, left);
    pt__text_escaped(&b, title ? title : "", 1);
    pt__textf(&b, "</text>\n<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" "
                  "fill=\"none\" stroke=\"#999\"/>\n", left, top, w, h);
    for (i = 0; i <= 4; i++) /* ticks */
        pt__textf(&b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.4g</text>\n"
                      "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.4g</text>\n",
                  left + w * i / 4.0, top + h + 16.0, x0 + (x1 - x0) * i / 4.0, left - 6.0,
                  top + h - h * i / 4.0 + 4.0, y0 + (y1 - y0) * i / 4.0);
    pt__textf(&b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", left + w / 2,
              top + h + 40.0);
    pt__text_escaped(&b, x_label ? x_label : "", 1);
    pt__textf(&b, "</text>\n<text x=\"14\" y=\"%.1f\" transform=\"rotate(-90 14 %.1f)\" "
                  "text-anchor=\"middle\">", top + h / 2, top + h / 2);
    pt__text_escaped(&b, y_label ? y_label : "", 1);
    pt__textf(&b, "</text>\n");
    for (k = 0; k < count; k++) {
        const char *c = colour[k % 4];
        pt__textf(&b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"",
                  c);
        for (i = 0; i < series[k].n; i++)
            if (isfinite(series[k].y[i]) && isfinite(series[k].x[i]))
                pt__textf(&b, "%.1f,%.1f ", left + w * (series[k].x[i] - x0) / (x1 - x0),
                          top + h * (y1 - series[k].y[i]) / (y1 - y0));
        pt__textf(&b, "\"><title>");
        pt__text_escaped(&b, series[k].name ? series[k].name : "", 1);
        pt__textf(&b, "</title></polyline>\n<rect x=\"%.1f\" y=\"%.1f\" width=\"12\" "
                      "height=\"3\" fill=\"%s\"/><text x=\"%.1f\" y=\"%.1f\">",
                  left + w + 16.0, top + 10.0 + 18.0 * k, c, left + w + 32.0, top + 14.0 + 18.0 * k);
        pt__text_escaped(&b, series[k].name ? series[k].name : "", 1);
        pt__textf(&b, "</text>\n");
    }
    pt__textf(&b, "</svg>\n");
    return pt__text_save(&b, path);
}

/* ---- model weights by name ------------------------------------------------ */

static const char *pt__meta_names[] = {"n_layer", "n_head", "n_embd", "vocab_size", "block_size"};

/* The architecture in a fixture's or checkpoint's metadata (none: GPT-2):
   arch (gpt2 | llama), norm (layernorm | rmsnorm), mlp (gelu | swiglu),
   rope (rotate_half: rotary positions), n_kv_head, ffn_hidden, rope_theta,
   norm_eps, tie_embeddings (0/1), bias (0/1), and LLaMA 3's rope_scaling_factor,
   rope_low_freq_factor, rope_high_freq_factor, rope_original_max_pos. LLaMA's
   defaults are RMSNorm, rotary, SwiGLU, no bias and an untied head. */
static pt_status pt__config_arch_meta(const pt_safetensors *st, pt_gpt_config *c) {
    static const char *ints[] = {"n_kv_head", "ffn_hidden", "tie_embeddings", "bias",
                                 "rope_original_max_pos"};
    static const char *floats[] = {"rope_theta", "norm_eps", "rope_scaling_factor",
                                   "rope_low_freq_factor", "rope_high_freq_factor"};
    const char *arch = pt_st_meta_get(st, "arch"), *v;
    int iv[5] = {0, 0, -1, -1, 0}, i;
    double fv[5] = {0, 0, 0, 0, 0};
    if (!arch || strcmp(arch, "gpt2") == 0) c->arch = PT_ARCH_GPT2;
    else if (strcmp(arch, "llama") == 0) c->arch = PT_ARCH_LLAMA;
    else return pt__fail(PT_ERR_FORMAT, "metadata arch='%s' is not gpt2 or llama", arch);
    for (i = 0; i < 5; i++) {
        if ((v = pt_st_meta_get(st, ints[i])) && !pt__parse_int(v, &iv[i]))
            return pt__fail(PT_ERR_FORMAT, "metadata %s='%s' is not an integer", ints[i], v);
        if ((v = pt_st_meta_get(st, floats[i])) && !pt__parse_float(v, &fv[i]))
            return pt__fail(PT_ERR_FORMAT, "metadata %s='%s' is not a number", floats[i], v);
    }
    if (iv[2] > 1 || iv[3] > 1 || (iv[2] < 0 && pt_st_meta_get(st, ints[2])) ||
        (iv[3] < 0 && pt_st_meta_get(st, ints[3])))
        return pt__fail(PT_ERR_FORMAT, "metadata tie_embeddings='%s' and bias='%s' must be 0 or 1",
                        pt_st_meta_get(st, ints[2]) ? pt_st_meta_get(st, ints[2]) : "(none)",
                        pt_st_meta_get(st, ints[3]) ? pt_st_meta_get(st, ints[3]) : "(none)");
    c->n_kv_head = iv[0];
    c->ffn_hidden = iv[1];
    c->untied_head = iv[2] < 0 ? c->arch == PT_ARCH_LLAMA : !iv[2];
    c->no_bias = iv[3] < 0 ? c->arch == PT_ARCH_LLAMA : !iv[3];
    c->rope_scaling.original_max_pos = iv[4];
    c->rope_theta = (float)fv[0];
    if (fv[1] > 0.0) c->ln_eps = (float)fv[1];
    c->rope_scaling.factor = (float)fv[2];
    c->rope_scaling.low_freq_factor = (float)fv[3];
    c->rope_scaling.high_freq_factor = (float)fv[4];
    c->norm = c->arch == PT_ARCH_LLAMA ? PT_NORM_RMS : PT_NORM_LAYER;
    if ((v = pt_st_meta_get(st, "norm")) && strcmp(v, "rmsnorm") && strcmp(v, "layernorm"))
        return pt__fail(PT_ERR_FORMAT, "metadata norm='%s' is not rmsnorm or layernorm", v);
    if (v) c->norm = strcmp(v, "rmsnorm") == 0 ? PT_NORM_RMS : PT_NORM_LAYER;
    c->mlp = c->arch == PT_ARCH_LLAMA ? PT_MLP_SWIGLU : PT_MLP_GELU;
    if ((v = pt_st_meta_get(st, "mlp")) && strcmp(v, "swiglu") && strcmp(v, "gelu"))
        return pt__fail(PT_ERR_FORMAT, "metadata mlp='%s' is not swiglu or gelu", v);
    if (v) c->mlp = strcmp(v, "swiglu") == 0 ? PT_MLP_SWIGLU : PT_MLP_GELU;
    c->pos = c->arch == PT_ARCH_LLAMA ? PT_POS_ROPE : PT_POS_LEARNED;
    if ((v = pt_st_meta_get(st, "rope")) && strcmp(v, "rotate_half") && strcmp(v, "none"))
        return pt__fail(PT_ERR_FORMAT, "metadata rope='%s' is not rotate_half (Hugging Face's "
                        "pairing) or none", v);
    if (v) c->pos = strcmp(v, "rotate_half") == 0 ? PT_POS_ROPE : PT_POS_LEARNED;
    return PT_OK;
}

/* The keys pt__config_arch_meta reads, written when the architecture is
   not GPT-2's (a GPT-2 checkpoint keeps its metadata as before). */
static pt_status pt__config_arch_write(pt_st_writer *w, const pt_gpt_config *c) {
    char val[64];
    pt_status s = PT_OK;
    if (!c->arch && !c->norm && !c->pos && !c->mlp && !c->n_kv_head && !c->ffn_hidden &&
        !c->no_bias && !c->untied_head)
        return PT_OK;
#define PT__META_STR(key, x) if (s == PT_OK) s = pt_st_writer_meta(w, key, x);
#define PT__META_FMT(key, fmt, x)                                              \
    if (s == PT_OK) {                                                          \
        snprintf(val, sizeof val, fmt, x);                                     \
        s = pt_st_writer_meta(w, key, val);                                    \
    }
    PT__META_STR("arch", c->arch == PT_ARCH_LLAMA ? "llama" : "gpt2")
    PT__META_STR("norm", c->norm == PT_NORM_RMS ? "rmsnorm" : "layernorm")
    PT__META_STR("mlp", c->mlp == PT_MLP_SWIGLU ? "swiglu" : "gelu")
    PT__META_STR("rope", c->pos == PT_POS_ROPE ? "rotate_half" : "none")
    PT__META_FMT("n_kv_head", "%d", pt__kv_heads(c))
    PT__META_FMT("ffn_hidden", "%d", pt__ffn(c))
    PT__META_FMT("rope_theta", "%.9g", (double)pt__rope_theta(c))
    PT__META_FMT("norm_eps", "%.9g", (double)(c->ln_eps > 0.0f ? c->ln_eps : 1e-5f))
    PT__META_FMT("tie_embeddings", "%d", !c->untied_head)
    PT__META_FMT("bias", "%d", !c->no_bias)
    if (c->rope_scaling.factor > 0.0f) {
        PT__META_FMT("rope_scaling_factor", "%.9g", (double)c->rope_scaling.factor)
        PT__META_FMT("rope_low_freq_factor", "%.9g", (double)c->rope_scaling.low_freq_factor)
        PT__META_FMT("rope_high_freq_factor", "%.9g", (double)c->rope_scaling.high_freq_factor)
        PT__META_FMT("rope_original_max_pos", "%d", c->rope_scaling.original_max_pos)
    }
#undef PT__META_STR
#undef PT__META_FMT
    return s;
}

/* 1 for ptrain's own files (checkpoints, fixtures), which store their config */
static int pt__st_is_ptrain(const pt_safetensors *st) {
    const char *fmt = pt_st_meta_get(st, "format");
    return fmt && (strcmp(fmt, "ptrain-checkpoint-v1") == 0 || strcmp(fmt, "ptrain-fixture-v1") == 0);
}

PTRAINDEF pt_status pt_gpt_config_from_st(const pt_safetensors *st, int n_head_hint,
                                          pt_gpt_config *out) {
    pt_gpt_config c;
    pt_status st_;
    memset(&c, 0, sizeof c);
    if (pt__st_is_ptrain(st)) {
        int *fields[5];
        const char *eps = pt_st_meta_get(st, "ln_eps");
        double e = 1e-5;
        int i;
        fields[0] = &c.n_layer; fields[1] = &c.n_head; fields[2] = &c.n_embd;
        fields[3] = &c.vocab_size; fields[4] = &c.block_size;
        for (i = 0; i < 5; i++) {
            const char *v = pt_st_meta_get(st, pt__meta_names[i]);
            if (!v) return pt__fail(PT_ERR_MISSING, "metadata lacks '%s'", pt__meta_names[i]);
            if (!pt__parse_int(v, fields[i]))
                return pt__fail(PT_ERR_FORMAT, "metadata %s='%s' is not an integer",
                                pt__meta_names[i], v);
        }
        if (eps && !pt__parse_float(eps, &e))
            return pt__fail(PT_ERR_FORMAT, "metadata ln_eps='%s' is not a number", eps);
        c.ln_eps = (float)e;
        if ((st_ = pt__config_arch_meta(st, &c)) != PT_OK) return st_;
    } else { /* Hugging Face GPT-2: sizes from the shapes */
        const pt_st_tensor *wte = pt_st_find(st, "wte.weight"), *wpe = pt_st_find(st, "wpe.weight");
        char name[64];
        const char *pre = "";
        if (!wte) {
            pre = "transformer.";
            wte = pt_st_find(st, "transformer.wte.weight");
            wpe = pt_st_find(st, "transformer.wpe.weight");
        }
        if (!wte && pt_st_find(st, "model.embed_tokens.weight"))
            return pt__fail(PT_ERR_MISSING, "a Hugging Face LLaMA file: its shapes do not give "
                            "the heads, its config.json does: put it beside the file, or give "
                            "the model's directory");
        if (!wte || !wpe || wte->ndim != 2 || wpe->ndim != 2 || wte->shape[1] != wpe->shape[1] ||
            wte->shape[0] > (1 << 24) || wpe->shape[0] > (1 << 20) || wte->shape[1] > (1 << 17))
            return pt__fail(PT_ERR_MISSING,
                            "not a GPT-2 file: needs 2-D wte.weight and wpe.weight of equal width");
        c.vocab_size = (int)wte->shape[0];
        c.n_embd = (int)wte->shape[1];
        c.block_size = (int)wpe->shape[0];
        for (c.n_layer = 0; c.n_layer < 4096; c.n_layer++) {
            snprintf(name, sizeof name, "%sh.%d.ln_1.weight", pre, c.n_layer);
            if (!pt_st_find(st, name)) break;
        }
        c.n_head = n_head_hint > 0 ? n_head_hint : (c.n_embd % 64 == 0 ? c.n_embd / 64 : 0);
        if (c.n_head == 0)
            return pt__fail(PT_ERR_CONFIG,
                            "n_embd=%d: cannot infer n_head (GPT-2 uses head size 64); give it",
                            c.n_embd);
        c.ln_eps = 1e-5f;
    }
    *out = c;
    return pt_gpt_config_validate(&c);
}

/* 1 if path names a directory */
static int pt__is_dir(const char *path) {
#if defined(_WIN32)
    struct _stat s;
    return _stat(path, &s) == 0 && (s.st_mode & _S_IFDIR);
#else
    struct stat s;
    return stat(path, &s) == 0 && S_ISDIR(s.st_mode);
#endif
}

/* 1 if path can be opened for reading */
static int pt__readable(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f) fclose(f);
    return f != NULL;
}

PTRAINDEF pt_status pt_gpt_config_from_file(const char *path, int n_head_hint,
                                            pt_gpt_config *out) {
    char dir[4096], cj[4200], file[4200];
    const char *slash = strrchr(path, '/');
    int is_dir = pt__is_dir(path);
    pt_safetensors st;
    pt_status s;
    st.alloc_ctx = NULL;
    /* a directory's config.json, or the one beside a Hugging Face file */
    if (is_dir) snprintf(dir, sizeof dir, "%s", path);
    else snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) + (slash == path) : 1,
                  slash ? path : ".");
    snprintf(cj, sizeof cj, "%s/config.json", dir);
    snprintf(file, sizeof file, is_dir ? "%s/model.safetensors" : "%s", path);
    if (!is_dir || !pt__readable(cj)) {
        if (is_dir && !pt__readable(file))
            return pt__fail(PT_ERR_MISSING, "%s: no config.json and no model.safetensors: not a "
                            "Hugging Face model directory", path);
        if ((s = pt_st_load(&st, file)) != PT_OK) return s;
        if (pt__st_is_ptrain(&st) || !pt__readable(cj)) { /* ptrain's, or alone */
            s = pt_gpt_config_from_st(&st, n_head_hint, out);
            pt_st_free(&st);
            return s == PT_OK ? s : pt__fail_path(s, file);
        }
        pt_st_free(&st);
    }
    s = pt_gpt_config_from_hf_file(cj, out);
    return s == PT_OK ? s : pt__fail_path(s, dir);
}

/* A JSON number into *out (within the double range). */
static int pt__json_double(pt__json *j, double *out) {
    char buf[64], *end;
    const char *s;
    size_t n;
    pt__ws(j);
    s = j->p;
    if (!pt__json_number(j) || (n = (size_t)(j->p - s)) >= sizeof buf) return 0;
    memcpy(buf, s, n);
    buf[n] = 0;
    *out = strtod(buf, &end);
    return *end == 0 && *out == *out && *out > -1e300 && *out < 1e300;
}

/* What config.json says, as it is read: the integers (num, -1 when absent;
   GPT-2's names are aliases of LLaMA's), the norm's epsilon and rotary
   theta (set: given), the flags (-1 when absent), the family (model_type:
   -1 not given, 0 gpt2, 1 llama) and LLaMA 3's rope_scaling. */
typedef struct pt__hf_cfg {
    double num[7], eps, theta, sc[4], head_dim; /* head_dim: -1 when absent */
    int eps_set, tie, abias, mbias, have_sc, family;
} pt__hf_cfg;
static const char *pt__hf_ints[] = {"hidden_size", "intermediate_size", "num_attention_heads",
                                    "num_key_value_heads", "num_hidden_layers", "vocab_size",
                                    "max_position_embeddings"};
static const char *pt__hf_gpt2_ints[] = {"n_embd", "n_inner", "n_head", NULL, "n_layer",
                                         "vocab_size", "n_positions"};

/* config.json's rope_scaling (its key read): null, or an object of rope_type
   "llama3" and the four numbers. NULL, or what is malformed. */
static const char *pt__hf_rope_scaling(pt__json *j, pt__hf_cfg *h, int *bad) {
    static const char *keys[] = {"factor", "low_freq_factor", "high_freq_factor",
                                 "original_max_position_embeddings"};
    int first = 1, r, k;
    const char *key, *v;
    pt__ws(j);
    if (pt__json_lit(j, "null")) return NULL;
    if (!pt__json_expect(j, '{')) return "rope_scaling is not an object or null";
    h->have_sc = 1;
    while ((r = pt__json_member(j, &first, &key)) != 0) {
        if (r < 0) return "malformed JSON in rope_scaling";
        for (k = 0; k < 4 && strcmp(key, keys[k]) != 0; k++) {
        }
        if (k < 4) {
            if (!pt__json_double(j, &h->sc[k])) return "a rope_scaling value is not a number";
        } else if (strcmp(key, "rope_type") == 0 || strcmp(key, "type") == 0) {
            if (!(v = pt__json_string(j))) return "rope_scaling's rope_type is not a string";
            if (strcmp(v, "llama3") != 0)
                pt__append_error(bad, "config.json: rope_scaling rope_type='%s' is not "
                                 "supported (only 'llama3')", v);
        } else if (!pt__json_skip(j)) {
            return "malformed JSON in rope_scaling";
        }
    }
    return NULL;
}

/* One member of config.json (its key read) into h; fields it cannot take
   are appended to the error (bad counts them). NULL, or what is malformed. */
static const char *pt__hf_member(pt__json *j, const char *key, pt__hf_cfg *h, int *bad) {
    const char *v;
    int i;
    for (i = 0; i < 7; i++)
        if (strcmp(key, pt__hf_ints[i]) == 0 ||
            (pt__hf_gpt2_ints[i] && strcmp(key, pt__hf_gpt2_ints[i]) == 0))
            break;
    if (i < 7) {
        if (i == 1 && pt__json_null(j)) return NULL; /* GPT-2's n_inner null: 4 n_embd */
        /* the range first: casting a double outside int64_t's is undefined */
        if (!pt__json_double(j, &h->num[i]) ||
            !(h->num[i] >= 0 && h->num[i] <= 1e15 && h->num[i] == (double)(int64_t)h->num[i])) {
            pt__append_error(bad, "config.json: %s is not a non-negative integer below 1e15", key);
            h->num[i] = 0; /* reported; keeps the checks after it defined */
        }
    } else if (strcmp(key, "rms_norm_eps") == 0 || strcmp(key, "layer_norm_epsilon") == 0) {
        if (!pt__json_double(j, &h->eps)) return "the norm's epsilon is not a number";
        h->eps_set = 1;
    } else if (strcmp(key, "rope_theta") == 0) {
        if (!pt__json_double(j, &h->theta)) return "rope_theta is not a number";
    } else if (strcmp(key, "head_dim") == 0) { /* newer transformers write it */
        if (!pt__json_null(j) && !pt__json_double(j, &h->head_dim))
            return "head_dim is not a number";
    } else if (strcmp(key, "tie_word_embeddings") == 0) {
        if (!pt__json_bool(j, &h->tie)) return "tie_word_embeddings is not true or false";
    } else if (strcmp(key, "attention_bias") == 0) {
        if (!pt__json_bool(j, &h->abias)) return "attention_bias is not true or false";
    } else if (strcmp(key, "mlp_bias") == 0) {
        if (!pt__json_bool(j, &h->mbias)) return "mlp_bias is not true or false";
    } else if (strcmp(key, "model_type") == 0) {
        if (!(v = pt__json_string(j))) return "model_type is not a string";
        h->family = strcmp(v, "llama") == 0 ? 1 : strcmp(v, "gpt2") == 0 ? 0 : h->family;
        if (strcmp(v, "llama") != 0 && strcmp(v, "gpt2") != 0)
            pt__append_error(bad, "config.json: model_type='%s' is not supported (expected "
                             "'llama' or 'gpt2')", v);
    } else if (strcmp(key, "hidden_act") == 0 || strcmp(key, "activation_function") == 0) {
        int act = key[0] == 'h'; /* LLaMA's SiLU, or GPT-2's tanh GELU */
        if (!(v = pt__json_string(j))) return "hidden_act or activation_function is not a string";
        if (act ? strcmp(v, "silu") != 0
                : strcmp(v, "gelu_new") != 0 && strcmp(v, "gelu_pytorch_tanh") != 0)
            pt__append_error(bad, "config.json: %s='%s' is not supported (expected '%s')", key, v,
                             act ? "silu" : "gelu_new");
    } else if (strcmp(key, "rope_scaling") == 0) {
        return pt__hf_rope_scaling(j, h, bad);
    } else if (!pt__json_skip(j)) {
        return "malformed JSON";
    }
    return NULL;
}

/* The checks of what was read, each failure appended; 0 if none failed. */
static int pt__hf_check(pt__hf_cfg *h, int bad) {
    const char *const *names = h->family == 0 ? pt__hf_gpt2_ints : pt__hf_ints;
    int i;
    if (h->num[3] < 0) h->num[3] = h->num[2]; /* no num_key_value_heads: multi-head attention */
    for (i = 0; i < 7; i++)
        if (h->num[i] < 0 && !(i == 1 && h->family == 0)) /* GPT-2's n_inner is optional */
            pt__append_error(&bad, "config.json: %s is missing", names[i]);
        else if (h->num[i] > (double)(1 << 30))
            pt__append_error(&bad, "config.json: %s=%.0f is too large", names[i], h->num[i]);
    if (!bad && h->num[2] > 0 && (int64_t)h->num[0] % (int64_t)h->num[2])
        pt__append_error(&bad, "config.json: %s=%.0f is not divisible by %s=%.0f", names[0],
                         h->num[0], names[2], h->num[2]);
    if (!bad && h->num[3] > 0 && (int64_t)h->num[2] % (int64_t)h->num[3])
        pt__append_error(&bad, "config.json: num_key_value_heads=%.0f does not divide "
                         "num_attention_heads=%.0f", h->num[3], h->num[2]);
    if (!bad && h->head_dim >= 0 && h->num[2] > 0 && h->head_dim * h->num[2] != h->num[0])
        pt__append_error(&bad, "config.json: head_dim=%g is not hidden_size=%.0f / "
                         "num_attention_heads=%.0f (ptrain's heads split the width)", h->head_dim,
                         h->num[0], h->num[2]);
    if (h->mbias >= 0 && h->mbias != (h->abias > 0))
        pt__append_error(&bad, "config.json: attention_bias=%d and mlp_bias=%d differ (ptrain "
                         "has one bias switch)", h->abias > 0, h->mbias);
    if (h->have_sc && !(h->sc[0] > 0 && h->sc[3] > 0))
        pt__append_error(&bad, "config.json: rope_scaling needs factor and "
                         "original_max_position_embeddings");
    if (h->family == 0 && (h->have_sc || h->abias >= 0 || h->mbias >= 0 || h->num[3] != h->num[2]))
        pt__append_error(&bad, "config.json: model_type 'gpt2' with LLaMA's fields (rope_scaling, "
                         "attention_bias, mlp_bias or num_key_value_heads)");
    return bad;
}

PTRAINDEF pt_status pt_gpt_config_from_hf_json(const char *text, size_t len, pt_gpt_config *out) {
    const char *key, *err = NULL;
    int first = 1, r, i, bad = 0;
    char *pool;
    pt__json j;
    pt__hf_cfg h;
    pt_gpt_config c;
    pt_clear_error();
    if (!(pool = (char *)pt__malloc(len + 1, NULL)))
        return pt__fail(PT_ERR_OOM, "cannot allocate %zu bytes to parse config.json", len + 1);
    memset(&h, 0, sizeof h);
    for (i = 0; i < 7; i++) h.num[i] = -1;
    h.theta = 10000.0, h.head_dim = -1, h.tie = h.abias = h.mbias = h.family = -1;
    memset(&j, 0, sizeof j);
    j.p = text, j.end = text + len, j.pool = pool, j.pool_cap = len + 1;
    if (!pt__json_expect(&j, '{')) err = "not a JSON object";
    while (!err && (r = pt__json_member(&j, &first, &key)) != 0)
        err = r < 0 ? "malformed JSON" : pt__hf_member(&j, key, &h, &bad);
    pt__free(pool, NULL);
    if (err) return pt__fail(PT_ERR_FORMAT, "config.json: %s (at byte %zu)", err,
                             (size_t)(j.p - text));
    if (pt__hf_check(&h, bad)) return PT_ERR_CONFIG;
    memset(&c, 0, sizeof c); /* GPT-2: zero everywhere but the sizes */
    c.n_embd = (int)h.num[0], c.n_head = (int)h.num[2], c.n_layer = (int)h.num[4];
    c.vocab_size = (int)h.num[5], c.block_size = (int)h.num[6];
    c.ffn_hidden = h.num[1] > 0 ? (int)h.num[1] : 0;
    if (h.family == 0) { /* GPT-2's defaults: LayerNorm's 1e-5, a tied head */
        c.ln_eps = h.eps_set ? (float)h.eps : 1e-5f;
        c.untied_head = h.tie == 0;
        *out = c;
        return pt_gpt_config_validate(&c);
    }
    c.arch = PT_ARCH_LLAMA, c.norm = PT_NORM_RMS, c.pos = PT_POS_ROPE, c.mlp = PT_MLP_SWIGLU;
    c.n_kv_head = (int)h.num[3];
    c.ln_eps = h.eps_set ? (float)h.eps : 1e-6f, c.rope_theta = (float)h.theta;
    c.no_bias = h.abias <= 0, c.untied_head = h.tie <= 0;
    if (h.have_sc) {
        c.rope_scaling.factor = (float)h.sc[0];
        c.rope_scaling.low_freq_factor = (float)(h.sc[1] > 0 ? h.sc[1] : 1.0);
        c.rope_scaling.high_freq_factor = (float)(h.sc[2] > 0 ? h.sc[2] : 4.0);
        c.rope_scaling.original_max_pos = h.sc[3] < (double)(1 << 30) ? (int)h.sc[3] : 0;
    }
    *out = c;
    return pt_gpt_config_validate(&c);
}

PTRAINDEF pt_status pt_gpt_config_from_hf_file(const char *path, pt_gpt_config *out) {
    unsigned char *text;
    size_t n;
    pt_status s = pt_file_read(path, &text, &n, NULL);
    if (s != PT_OK) return s;
    s = pt_gpt_config_from_hf_json((const char *)text, n, out);
    pt__free(text, NULL);
    return s;
}

PTRAINDEF pt_status pt_gpt_save_hf(const pt_gpt *m, const char *dir) {
    const pt_gpt_config *c = &m->config;
    char path[1024], text[1536];
    float *whole = NULL;
    const float *params = m->params;
    pt_status s = PT_OK;
    pt_comm *world = pt__exec_layout_of(m).world;
    int writer = !world || world->rank == 0, n;
    if (!m->params) return pt__fail(PT_ERR_INVALID_ARG, "model has no memory (meta=1)");
    if ((s = pt__ag_settle(m)) != PT_OK) return s;
    if (c->arch != PT_ARCH_LLAMA || c->norm != PT_NORM_RMS || c->pos != PT_POS_ROPE ||
        c->mlp != PT_MLP_SWIGLU)
        return pt__fail(PT_ERR_UNSUPPORTED, "Hugging Face's LlamaForCausalLM needs arch=llama, "
                        "norm=rmsnorm, pos=rope, mlp=swiglu (arch=%d norm=%d pos=%d mlp=%d); save "
                        "a ptrain checkpoint instead", (int)c->arch, (int)c->norm, (int)c->pos,
                        (int)c->mlp);
    if (m->num_params != m->num_params_full || m->place.pp > 1 || m->place.zero == 3) {
        /* split or sharded: gather whole */
        whole = (float *)pt__malloc(m->num_params_full * sizeof(float), m->alloc_ctx);
        if (!whole) s = pt__fail(PT_ERR_OOM, "cannot allocate %.1f MiB to gather the model",
                                 (double)m->num_params_full * 4.0 / 1048576.0);
        if (s == PT_OK) s = pt_gpt_gather(m, PT_BUF_PARAMS, whole);
        params = whole;
    }
    if (s == PT_OK && writer) {
        FILE *f;
        n = snprintf(text, sizeof text,
                     "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n"
                     "  \"hidden_act\": \"silu\",\n  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n"
                     "  \"num_attention_heads\": %d,\n  \"num_key_value_heads\": %d,\n"
                     "  \"num_hidden_layers\": %d,\n  \"vocab_size\": %d,\n"
                     "  \"max_position_embeddings\": %d,\n  \"rms_norm_eps\": %.9g,\n"
                     "  \"rope_theta\": %.9g,\n  \"tie_word_embeddings\": %s,\n"
                     "  \"attention_bias\": %s,\n  \"mlp_bias\": %s,\n  \"torch_dtype\": \"float32\",\n",
                     c->n_embd, pt__ffn(c), c->n_head, pt__kv_heads(c), c->n_layer, c->vocab_size,
                     c->block_size, (double)(c->ln_eps > 0.0f ? c->ln_eps : 1e-5f),
                     (double)pt__rope_theta(c), c->untied_head ? "false" : "true",
                     c->no_bias ? "false" : "true", c->no_bias ? "false" : "true");
        if (c->rope_scaling.factor > 0.0f)
            n += snprintf(text + n, sizeof text - (size_t)n,
                          "  \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": %.9g, "
                          "\"low_freq_factor\": %.9g, \"high_freq_factor\": %.9g, "
                          "\"original_max_position_embeddings\": %d}\n}\n",
                          (double)c->rope_scaling.factor, (double)c->rope_scaling.low_freq_factor,
                          (double)c->rope_scaling.high_freq_factor, c->rope_scaling.original_max_pos);
        else
            n += snprintf(text + n, sizeof text - (size_t)n, "  \"rope_scaling\": null\n}\n");
        snprintf(path, sizeof path, "%s/config.json", dir);
        if (!(f = fopen(path, "wb")) || fwrite(text, 1, (size_t)n, f) != (size_t)n) {
            s = pt__fail(PT_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
            if (f) fclose(f);
        } else if (fclose(f) != 0) {
            s = pt__fail(PT_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
        }
        if (s == PT_OK) { /* the whole model's tensors in canonical order */
            pt_st_writer w;
            pt__spec sp;
            char tname[64];
            size_t at = 0;
            int i;
            memset(&w, 0, sizeof w);
            w.alloc_ctx = m->alloc_ctx;
            pt_st_writer_init(&w);
            s = pt_st_writer_meta(&w, "format", "pt");
            for (i = 0; s == PT_OK && pt__canon_spec(c, i, &sp, tname, sizeof tname); i++) {
                int64_t shape[2];
                shape[0] = sp.rows, shape[1] = sp.cols;
                s = pt_st_writer_add(&w, tname, PT_F32, sp.cols ? 2 : 1, shape, params + at);
                at += (size_t)sp.rows * (size_t)(sp.cols ? sp.cols : 1);
            }
            snprintf(path, sizeof path, "%s/model.safetensors", dir);
            if (s == PT_OK) s = pt_st_writer_save(&w, path);
            pt_st_writer_free(&w);
        }
    }
    pt__free(whole, m->alloc_ctx);
    if (world) { /* every rank returns the writer's verdict */
        int all = 0;
        pt_status cs = pt_comm_all_ok(world, s == PT_OK, &all);
        if (cs != PT_OK) return cs;
        if (s == PT_OK && !all)
            return pt__fail(PT_ERR_IO, "%s: writing the model failed on another rank", dir);
    }
    return s;
}

/* name as stored: exact, or with the "transformer." prefix */
static const char *pt__hf_name(const pt_safetensors *st, const char *name, char *buf, size_t n) {
    if (pt_st_find(st, name)) return name;
    snprintf(buf, n, "transformer.%s", name);
    return pt_st_find(st, buf) ? buf : name;
}

/* Checks (dst NULL) or reads (into dst, laid out as m->table) every
   parameter under prefix. The file holds whole tensors: a tensor-parallel
   rank reads each split one whole and keeps its part. With found (one flag
   a table entry), st is one shard: the tensors it lacks are skipped, those
   it has are flagged. */
static pt_status pt__st_params_in(const pt_gpt *m, const pt_safetensors *st, const char *prefix,
                                  float *dst, unsigned char *found) {
    char full[96], alt[112];
    float *whole = NULL;
    int i;
    pt_status s = PT_OK;
    for (i = 0; i < m->num_tensors && s == PT_OK; i++) {
        const pt_param *p = &m->table[i];
        const pt_st_tensor *t;
        const char *name;
        snprintf(full, sizeof full, "%s%s", prefix, p->name);
        name = *prefix ? full : pt__hf_name(st, full, alt, sizeof alt);
        if (found) { /* a shard: the tensors it holds, each in one shard only */
            if (!pt_st_find(st, name)) continue;
            if (!dst && found[i])
                s = pt__fail(PT_ERR_FORMAT, "tensor '%s' is in two shards", name);
            found[i] = 1;
            if (s != PT_OK) break;
        }
        if (!dst) {
            s = pt__st_lookup(st, name, p->ndim, p->full_shape, &t);
            if (s == PT_OK && t->dtype != PT_F32 && t->dtype != PT_F16 && t->dtype != PT_BF16 &&
                t->dtype != PT_F64)
                s = pt__fail(PT_ERR_DTYPE, "tensor '%s' has dtype %s; expected a float dtype",
                             name, pt_dtype_name(t->dtype));
        } else if (p->shard == PT_SHARD_NONE) {
            s = pt_st_read_f32(st, name, dst + p->offset, p->ndim, p->shape);
        } else {
            if (!whole) { /* the largest split tensor is wte or a 4C x C matrix */
                size_t most = 0;
                int j;
                for (j = 0; j < m->num_tensors; j++)
                    if (m->table[j].full_numel > most) most = m->table[j].full_numel;
                whole = (float *)pt__malloc(most * sizeof(float), m->alloc_ctx);
                if (!whole) {
                    s = pt__fail(PT_ERR_OOM, "cannot allocate %zu floats to read '%s'", most, name);
                    break;
                }
            }
            s = pt_st_read_f32(st, name, whole, p->ndim, p->full_shape);
            if (s == PT_OK) pt__shard_copy(m, p, dst + p->offset, whole, 1);
        }
    }
    pt__free(whole, m->alloc_ctx);
    return s;
}

static pt_status pt__st_params(const pt_gpt *m, const pt_safetensors *st, const char *prefix,
                               float *dst) {
    return pt__st_params_in(m, st, prefix, dst, NULL);
}

PTRAINDEF pt_status pt_gpt_load_weights_st(pt_gpt *m, const pt_safetensors *st) {
    pt_status s;
    float *keep;
    if (!m->params) return pt__fail(PT_ERR_INVALID_ARG, "model has no memory (built with meta=1)");
    if ((s = pt__ag_settle(m)) != PT_OK || (s = pt__st_params(m, st, "", NULL)) != PT_OK) return s;
    if (!(keep = pt__z3_open(m, &s))) return s;
    s = pt__st_params(m, st, "", m->params);
    pt__z3_close(m, keep, s == PT_OK);
    return s;
}

PTRAINDEF pt_status pt_gpt_load_weights(pt_gpt *m, const char *path) {
    pt_safetensors st;
    pt_status s;
    if (pt__is_dir(path)) return pt_gpt_load_weights_hf(m, path);
    st.alloc_ctx = m->alloc_ctx;
    if ((s = pt_st_load(&st, path)) != PT_OK) return s;
    s = pt_gpt_load_weights_st(m, &st);
    pt_st_free(&st);
    return s == PT_OK ? s : pt__fail_path(s, path);
}

PTRAINDEF pt_status pt_gpt_load_weights_hf(pt_gpt *m, const char *dir) {
    char path[1024];
    unsigned char *text = NULL, *found = NULL;
    char *pool = NULL, **files = NULL;
    float *keep = NULL;
    size_t n = 0, nfiles = 0;
    int pass, i, k;
    pt_status s;
    pt__json j;
    if (!m->params) return pt__fail(PT_ERR_INVALID_ARG, "model has no memory (built with meta=1)");
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (pt_file_read(path, &text, &n, m->alloc_ctx) != PT_OK) { /* one file */
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        return pt_gpt_load_weights(m, path);
    }
    /* the distinct shard names of weight_map, in their first order */
    pool = (char *)pt__malloc(n + 1, m->alloc_ctx);
    files = (char **)pt__malloc((n / 4 + 1) * sizeof(char *), m->alloc_ctx);
    found = (unsigned char *)pt__malloc((size_t)m->num_tensors + 1, m->alloc_ctx);
    s = pool && files && found ? PT_OK : pt__fail(PT_ERR_OOM, "cannot allocate to read '%s'", path);
    if (s == PT_OK) {
        int first = 1, r;
        const char *key;
        memset(&j, 0, sizeof j);
        j.p = (const char *)text, j.end = (const char *)text + n, j.pool = pool, j.pool_cap = n + 1;
        if (!pt__json_expect(&j, '{')) s = pt__fail(PT_ERR_FORMAT, "%s: not a JSON object", path);
        while (s == PT_OK && (r = pt__json_member(&j, &first, &key)) != 0) {
            int f2 = 1;
            const char *k2, *v;
            if (r < 0) s = pt__fail(PT_ERR_FORMAT, "%s: malformed JSON", path);
            else if (strcmp(key, "weight_map") != 0) {
                if (!pt__json_skip(&j)) s = pt__fail(PT_ERR_FORMAT, "%s: malformed JSON", path);
            } else if (!pt__json_expect(&j, '{')) {
                s = pt__fail(PT_ERR_FORMAT, "%s: weight_map is not an object", path);
            } else {
                while (s == PT_OK && (r = pt__json_member(&j, &f2, &k2)) != 0) {
                    size_t q;
                    if (r < 0 || !(v = pt__json_string(&j))) {
                        s = pt__fail(PT_ERR_FORMAT, "%s: weight_map's values must be file names", path);
                        break;
                    }
                    if (!*v || strchr(v, '/') || strcmp(v, "..") == 0)
                        s = pt__fail(PT_ERR_FORMAT, "%s: shard '%s' is not a file name here", path, v);
                    for (q = 0; q < nfiles && strcmp(files[q], v) != 0; q++) {
                    }
                    if (q == nfiles) files[nfiles++] = (char *)v;
                }
            }
        }
        if (s == PT_OK && nfiles == 0) s = pt__fail(PT_ERR_MISSING, "%s: no weight_map", path);
    }
    /* pass 0 checks every shard (and that every tensor is in one), pass 1 reads */
    if (found) memset(found, 0, (size_t)m->num_tensors);
    for (pass = 0; pass < 2 && s == PT_OK; pass++) {
        if (pass == 1 && !(keep = pt__z3_open(m, &s))) break; /* (ZeRO 3: whole, then sharded) */
        for (k = 0; k < (int)nfiles && s == PT_OK; k++) {
            pt_safetensors st;
            memset(&st, 0, sizeof st);
            st.alloc_ctx = m->alloc_ctx;
            snprintf(path, sizeof path, "%s/%s", dir, files[k]);
            if ((s = pt_st_load(&st, path)) != PT_OK) break;
            s = pt__st_params_in(m, &st, "", pass ? m->params : NULL, found);
            pt_st_free(&st);
            if (s != PT_OK) s = pt__fail_path(s, path);
        }
        for (i = 0; pass == 0 && s == PT_OK && i < m->num_tensors; i++)
            if (!found[i])
                s = pt__fail(PT_ERR_MISSING, "%s: tensor '%s' is in no shard", dir,
                             m->table[i].name);
    }
    if (keep) pt__z3_close(m, keep, s == PT_OK);
    pt__free(text, m->alloc_ctx);
    pt__free(pool, m->alloc_ctx);
    pt__free(files, m->alloc_ctx);
    pt__free(found, m->alloc_ctx);
    return s;
}

/* ---- token data ----------------------------------------------------------- */

PTRAINDEF pt_status pt_tokens_from_bytes(pt_tokens *t, const void *bytes, size_t n) {
    const unsigned char *b = (const unsigned char *)bytes;
    void *ctx = t->alloc_ctx;
    size_t i;
    pt_status st;
    memset(t, 0, sizeof *t);
    t->alloc_ctx = ctx;
    if ((st = pt__tokens_alloc(t, n, 0)) != PT_OK) return st;
    for (i = 0; i < n; i++) t->data[i] = b[i];
    t->n = n;
    t->vocab_size = 256;
    return PT_OK;
}

PTRAINDEF pt_status pt_tokens_parse_llmc(pt_tokens *t, const void *bytes, size_t n) {
    const unsigned char *b = (const unsigned char *)bytes;
    int32_t h[3];
    size_t w, i;
    uint32_t top = 0;
    void *ctx = t->alloc_ctx;
    pt_status st;
    memset(t, 0, sizeof *t);
    t->alloc_ctx = ctx;
    if (n < 1024)
        return pt__fail(PT_ERR_FORMAT, "token file of %zu bytes is shorter than its 1024-byte header", n);
    memcpy(h, b, sizeof h);
    if (h[0] != PT_TOKENS_MAGIC)
        return pt__fail(PT_ERR_FORMAT, "token file has magic %d, expected %d (llm.c format)", (int)h[0],
                        PT_TOKENS_MAGIC);
    if (h[1] != 1 && h[1] != 2)
        return pt__fail(PT_ERR_UNSUPPORTED,
                        "token file version %d is not supported (expected 1: uint16 tokens, or 2: "
                        "uint32)", (int)h[1]);
    w = h[1] == 1 ? 2 : 4;
    if (h[2] < 0 || (uint64_t)h[2] > (uint64_t)(n - 1024) / w)
        return pt__fail(PT_ERR_FORMAT,
                        "token file header says %d tokens but the file holds only %zu",
                        (int)h[2], (n - 1024) / w);
    if ((uint64_t)(n - 1024) != (uint64_t)h[2] * w)
        return pt__fail(PT_ERR_FORMAT, "token file has %zu bytes after its %d tokens",
                        (size_t)(n - 1024 - (size_t)h[2] * w), (int)h[2]);
    if ((st = pt__tokens_alloc(t, (size_t)h[2], w == 4)) != PT_OK) return st;
    memcpy(w == 4 ? (void *)t->data32 : (void *)t->data, b + 1024, (size_t)h[2] * w); /* LE host */
    for (i = 0; w == 4 && i < (size_t)h[2]; i++) top = t->data32[i] > top ? t->data32[i] : top;
    if (top > 0x7FFFFFFEu) {
        pt_tokens_free(t);
        return pt__fail(PT_ERR_RANGE, "token file holds the id %u, over 2^31-2", (unsigned)top);
    }
    t->n = (size_t)h[2];
    t->vocab_size = w == 2 ? 50257 : (int)top + 1;
    return PT_OK;
}

PTRAINDEF pt_status pt_tokens_load(pt_tokens *t, const char *path, pt_tokens_format fmt) {
    unsigned char *buf;
    size_t n, plen = strlen(path);
    pt_status s;
    void *ctx = t->alloc_ctx;
    memset(t, 0, sizeof *t);
    t->alloc_ctx = ctx;
    if (fmt == PT_TOKENS_AUTO)
        fmt = (plen > 4 && strcmp(path + plen - 4, ".bin") == 0) ? PT_TOKENS_LLMC : PT_TOKENS_BYTES;
    if ((s = pt_file_read(path, &buf, &n, ctx)) != PT_OK) return s;
    t->alloc_ctx = ctx;
    s = fmt == PT_TOKENS_LLMC ? pt_tokens_parse_llmc(t, buf, n) : pt_tokens_from_bytes(t, buf, n);
    pt__free(buf, ctx);
    return s == PT_OK ? s : pt__fail_path(s, path);
}

PTRAINDEF pt_status pt_tokens_check(const pt_tokens *t, int vocab_size) {
    size_t i;
    for (i = 0; i < t->n; i++)
        if (pt_tokens_at(t, i) >= vocab_size)
            return pt__fail(PT_ERR_RANGE, "token %d at position %zu is >= vocab_size %d",
                            pt_tokens_at(t, i), i, vocab_size);
    return PT_OK;
}

/* H = -sum_v p_v ln p_v over the tokens [begin, end), in nats
   (ids at or above max(65536, vocab_size) are not counted: pt_tokens_check first) */
PTRAINDEF double pt_tokens_unigram_entropy(const pt_tokens *t, size_t begin, size_t end) {
    size_t nv = t->vocab_size > 65536 ? (size_t)t->vocab_size : 65536, i;
    size_t *count = (size_t *)pt__malloc(nv * sizeof(size_t), t->alloc_ctx);
    double h = 0.0, n = (double)(end - begin);
    if (!count || end <= begin) {
        pt__free(count, t->alloc_ctx);
        return 0.0;
    }
    memset(count, 0, nv * sizeof(size_t));
    for (i = begin; i < end; i++)
        if ((size_t)pt_tokens_at(t, i) < nv) count[pt_tokens_at(t, i)]++;
    for (i = 0; i < nv; i++)
        if (count[i]) h -= (double)count[i] / n * log((double)count[i] / n);
    pt__free(count, t->alloc_ctx);
    return h;
}

PTRAINDEF void pt_tokens_free(pt_tokens *t) {
    pt__free(t->data, t->alloc_ctx);
    pt__free(t->data32, t->alloc_ctx);
    t->data = NULL;
    t->data32 = NULL;
    t->n = 0;
}

/* ---- batches ------------------------------------------------------------- */

/* Fisher-Yates over the windows with an RNG derived from (seed, epoch). */
static void pt__loader_shuffle(pt_loader *l) {
    pt_rng r;
    size_t i;
    pt_rng_seed(&r, l->seed ^ (0xA24BAED4963EE407ull * (l->epoch + 1)));
    for (i = 0; i < l->n_windows; i++) l->perm[i] = (uint32_t)i;
    if (!l->shuffle) return;
    for (i = l->n_windows; i > 1; i--) {
        size_t j = (size_t)(pt_rng_u64(&r) % i);
        uint32_t tmp = l->perm[i - 1];
        l->perm[i - 1] = l->perm[j];
        l->perm[j] = tmp;
    }
}

PTRAINDEF pt_status pt_loader_init(pt_loader *l, const pt_tokens *t, pt_split split,
                                   const pt_loader_desc *d) {
    double frac = d->val_fraction == 0.0f ? 0.1 : (double)d->val_fraction;
    size_t nval = (size_t)((double)t->n * frac);
    void *ctx = l->alloc_ctx;
    static const char *names[] = {"data", "train split", "validation split"};
    memset(l, 0, sizeof *l);
    l->alloc_ctx = ctx;
    if (d->batch < 1 || d->seq < 1)
        return pt__fail(PT_ERR_CONFIG, "loader batch=%d and seq=%d must be >= 1", d->batch, d->seq);
    if (split != PT_SPLIT_ALL && !(frac > 0.0 && frac < 1.0))
        return pt__fail(PT_ERR_CONFIG, "val_fraction=%g must be in (0, 1)", frac);
    l->tokens = *t;
    l->begin = split == PT_SPLIT_VAL ? t->n - nval : 0;
    l->len = split == PT_SPLIT_ALL ? t->n : split == PT_SPLIT_TRAIN ? t->n - nval : nval;
    if (l->len < (size_t)d->seq + 1)
        return pt__fail(PT_ERR_CONFIG, "the %s has %zu tokens, fewer than seq+1=%d",
                        names[split], l->len, d->seq + 1);
    l->B = d->batch;
    l->T = d->seq;
    l->seed = d->seed;
    l->shuffle = !d->no_shuffle && split != PT_SPLIT_VAL;
    l->n_windows = (l->len - 1) / (size_t)d->seq;
    if (l->n_windows > UINT32_MAX)
        return pt__fail(PT_ERR_CONFIG, "too many windows (%zu) for seq=%d", l->n_windows, d->seq);
    l->perm = (uint32_t *)pt__malloc(l->n_windows * sizeof(uint32_t), ctx);
    if (!l->perm) return pt__fail(PT_ERR_OOM, "cannot allocate the loader's permutation");
    pt__loader_shuffle(l);
    return PT_OK;
}

PTRAINDEF pt_status pt_loader_next(pt_loader *l, int *inputs, int *targets) {
    int b, i;
    if (!l->perm || l->n_windows == 0)
        return pt__fail(PT_ERR_INVALID_ARG, "the loader is not initialised");
    for (b = 0; b < l->B; b++) {
        size_t w;
        if (l->pos >= l->n_windows) {
            l->epoch++;
            l->pos = 0;
            pt__loader_shuffle(l);
        }
        w = l->begin + (size_t)l->perm[l->pos++] * (size_t)l->T;
        for (i = 0; i < l->T; i++) {
            inputs[b * l->T + i] = pt_tokens_at(&l->tokens, w + (size_t)i);
            if (targets) targets[b * l->T + i] = pt_tokens_at(&l->tokens, w + (size_t)i + 1);
        }
    }
    return PT_OK;
}

PTRAINDEF void pt_loader_seek(pt_loader *l, uint64_t epoch, size_t pos) {
    l->epoch = epoch;
    l->pos = pos < l->n_windows ? pos : l->n_windows;
    pt__loader_shuffle(l);
}

PTRAINDEF void pt_loader_free(pt_loader *l) {
    pt__free(l->perm, l->alloc_ctx);
    l->perm = NULL;
}

/* ---- checkpoints ---------------------------------------------------------- */

#define PT__CKPT_FORMAT "ptrain-checkpoint-v1"

PTRAINDEF pt_status pt_checkpoint_save(const char *path, const pt_gpt *m,
                                       const pt_train_state *state) {
    pt_st_writer w;
    char name[96], val[64];
    const float *bufs[3];
    const char *pre[3] = {"", "optim.m.", "optim.v."};
    int values[5], i, k;
    pt_status s = PT_OK;
    float *whole = NULL;
    pt_comm *world;
    int writer;
    if (!m->params || !m->m)
        return pt__fail(PT_ERR_INVALID_ARG, "model has no %s",
                        m->params ? "optimizer state (built for inference)" : "memory (meta=1)");
    bufs[0] = m->params; bufs[1] = m->m; bufs[2] = m->v;
    if (m->num_params != m->num_params_full || m->place.zero) { /* split, padded or sharded:
                                                   every rank helps gather whole tensors */
        static const pt_state_buf which[3] = {PT_BUF_PARAMS, PT_BUF_ADAM_M, PT_BUF_ADAM_V};
        whole = (float *)pt__malloc(3 * m->num_params_full * sizeof(float), m->alloc_ctx);
        if (!whole) s = pt__fail(PT_ERR_OOM, "cannot allocate %.1f MiB to gather the checkpoint",
                                 3.0 * (double)m->num_params_full * 4.0 / 1048576.0);
        for (k = 0; k < 3 && s == PT_OK; k++) {
            s = pt_gpt_gather(m, which[k], whole + (size_t)k * m->num_params_full);
            bufs[k] = whole + (size_t)k * m->num_params_full;
        }
    }
    world = pt__exec_layout_of(m).world;
    writer = !world || world->rank == 0;
    if (s != PT_OK || !writer) goto agree;
    values[0] = m->config.n_layer; values[1] = m->config.n_head; values[2] = m->config.n_embd;
    values[3] = m->config.vocab_size; values[4] = m->config.block_size;
    w.alloc_ctx = m->alloc_ctx;
    pt_st_writer_init(&w);
    s = pt_st_writer_meta(&w, "format", PT__CKPT_FORMAT);
    for (i = 0; i < 5 && s == PT_OK; i++) {
        snprintf(val, sizeof val, "%d", values[i]);
        s = pt_st_writer_meta(&w, pt__meta_names[i], val);
    }
#define PT__META_U64(key, x)                                                  \
    if (s == PT_OK) {                                                         \
        snprintf(val, sizeof val, "%llu", (unsigned long long)(x));           \
        s = pt_st_writer_meta(&w, key, val);                                  \
    }
    PT__META_U64("adam_t", m->adam_t)
    PT__META_U64("step", state ? state->step : 0)
    PT__META_U64("data_epoch", state ? state->data_epoch : 0)
    PT__META_U64("data_pos", state ? state->data_pos : 0)
    PT__META_U64("rng_state", state ? state->rng_state : 0)
#undef PT__META_U64
    if (s == PT_OK) {
        snprintf(val, sizeof val, "%.9g", (double)m->config.ln_eps);
        s = pt_st_writer_meta(&w, "ln_eps", val);
    }
    if (s == PT_OK) s = pt__config_arch_write(&w, &m->config);
    for (k = 0; k < 3; k++) { /* the whole model's tensors, whichever stage holds them */
        pt__spec sp;
        char tname[64];
        size_t at = 0;
        for (i = 0; s == PT_OK && pt__canon_spec(&m->config, i, &sp, tname, sizeof tname); i++) {
            int64_t shape[2];
            shape[0] = sp.rows, shape[1] = sp.cols;
            snprintf(name, sizeof name, "%s%s", pre[k], tname);
            s = pt_st_writer_add(&w, name, PT_F32, sp.cols ? 2 : 1, shape, bufs[k] + at);
            at += (size_t)sp.rows * (size_t)(sp.cols ? sp.cols : 1);
        }
    }
    if (s == PT_OK) s = pt_st_writer_save(&w, path);
    pt_st_writer_free(&w);
agree:
    pt__free(whole, m->alloc_ctx);
    if (world) { /* every rank returns the writer's verdict */
        int all = 0;
        pt_status cs = pt_comm_all_ok(world, s == PT_OK, &all);
        if (cs != PT_OK) return cs;
        if (s == PT_OK && !all)
            return pt__fail(PT_ERR_IO, "%s: writing the checkpoint failed on another rank", path);
    }
    return s;
}

/* AdamW moments (ZeRO 3: the parameters too) into dst: laid out as the table, or only this rank's dp
   shard of each bucket under ZeRO. */
static pt_status pt__st_moments(const pt_gpt *m, const pt_safetensors *st, const char *prefix,
                                float *dst) {
    pt__exec_layout o = pt__exec_layout_of(m);
    float *all;
    pt_status s;
    int b;
    if (!m->place.zero) return pt__st_params(m, st, prefix, dst);
    all = (float *)pt__malloc(m->num_params * sizeof(float), m->alloc_ctx);
    if (!all) return pt__fail(PT_ERR_OOM, "cannot allocate %zu floats to read the moments",
                              m->num_params);
    memset(all, 0, m->num_params * sizeof(float));
    s = pt__st_params(m, st, prefix, all);
    for (b = 0; b < o.num_buckets && s == PT_OK; b++) {
        const pt__bucket *k = &o.buckets[b];
        memcpy(dst + k->shard_offset, all + k->offset + (size_t)m->place.dp_rank * k->shard,
               k->shard * sizeof(float));
    }
    pt__free(all, m->alloc_ctx);
    return s;
}

PTRAINDEF pt_status pt_checkpoint_load(const char *path, pt_gpt *m, pt_train_state *state) {
    pt_safetensors st;
    pt_gpt_config c;
    uint64_t v[5];
    static const char *keys[5] = {"adam_t", "step", "data_epoch", "data_pos", "rng_state"};
    const char *fmt;
    pt_status s;
    int i;
    if (!m->params || !m->m)
        return pt__fail(PT_ERR_INVALID_ARG, "model has no %s",
                        m->params ? "optimizer state (built for inference)" : "memory (meta=1)");
    if ((s = pt__ag_settle(m)) != PT_OK) return s;
    st.alloc_ctx = m->alloc_ctx;
    if ((s = pt_st_load(&st, path)) != PT_OK) return s;
    fmt = pt_st_meta_get(&st, "format");
    if (!fmt || strcmp(fmt, PT__CKPT_FORMAT) != 0) {
        s = pt__fail(PT_ERR_FORMAT, "%s: not a ptrain checkpoint (format '%s', expected '%s')", path,
                     fmt ? fmt : "(none)", PT__CKPT_FORMAT);
        goto done;
    }
    if ((s = pt_gpt_config_from_st(&st, 0, &c)) != PT_OK) goto done;
    if (c.n_layer != m->config.n_layer || c.n_head != m->config.n_head ||
        c.n_embd != m->config.n_embd || c.vocab_size != m->config.vocab_size ||
        c.block_size != m->config.block_size) {
        s = pt__fail(PT_ERR_CONFIG,
                     "%s: checkpoint model (L=%d H=%d C=%d V=%d block=%d) differs from this model "
                     "(L=%d H=%d C=%d V=%d block=%d)",
                     path, c.n_layer, c.n_head, c.n_embd, c.vocab_size, c.block_size,
                     m->config.n_layer, m->config.n_head, m->config.n_embd, m->config.vocab_size,
                     m->config.block_size);
        goto done;
    }
    for (i = 0; i < 5; i++) {
        const char *x = pt_st_meta_get(&st, keys[i]);
        if (!x || !pt__parse_u64(x, &v[i])) {
            s = pt__fail(x ? PT_ERR_FORMAT : PT_ERR_MISSING, "%s: metadata '%s' is %s", path, keys[i],
                         x ? "not an unsigned integer" : "missing");
            goto done;
        }
    }
    if (v[0] > 0x7fffffff) {
        s = pt__fail(PT_ERR_FORMAT, "%s: adam_t is out of range", path);
        goto done;
    }
    /* everything is checked before anything is copied */
    if ((s = pt__st_params(m, &st, "", NULL)) != PT_OK ||
        (s = pt__st_params(m, &st, "optim.m.", NULL)) != PT_OK ||
        (s = pt__st_params(m, &st, "optim.v.", NULL)) != PT_OK)
        goto done_msg;
    if ((s = m->place.zero == 3 ? pt__z3_drop(m, -1) : PT_OK) != PT_OK ||
        (s = m->place.zero == 3 ? pt__st_moments(m, &st, "", m->params) /* the shards */
                                : pt__st_params(m, &st, "", m->params)) != PT_OK ||
        (s = pt__st_moments(m, &st, "optim.m.", m->m)) != PT_OK ||
        (s = pt__st_moments(m, &st, "optim.v.", m->v)) != PT_OK)
        goto done_msg;
    m->adam_t = (int)v[0];
    if (state) {
        state->step = (int64_t)v[1];
        state->data_epoch = v[2];
        state->data_pos = v[3];
        state->rng_state = v[4];
        state->checksummed = st.checksummed;
    }
    goto done;
done_msg:
    pt__fail_path(s, path);
done:
    pt_st_free(&st);
    return s;
}

#ifdef __cplusplus
}
#endif
#endif /* PTRAIN_IMPLEMENTATION_DONE */
#endif /* PTRAIN_IMPLEMENTATION */

/*
MIT License

Copyright (c) 2026 the ptrain authors

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.
*/
