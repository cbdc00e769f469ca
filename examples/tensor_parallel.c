/* tensor_parallel.c -- one transformer block split over K threads the way
   Megatron-LM splits it, checked against the same block unsplit.

   make build/tensor_parallel && build/tensor_parallel

   Two matmuls in a row need only one all-reduce if the first is split by
   columns and the second by rows:
       y = gelu(x A) B,   A = [A_0 | A_1 | ...],   B = [B_0; B_1; ...]
       y = sum_k gelu(x A_k) B_k        (gelu works column by column)
   so rank k holds A_k and B_k, computes its term, and one all-reduce sums
   them. Attention splits the same way by heads: rank k holds the q, k and v
   columns of its n_head/K heads in c_attn (layout [q|k|v][head][hd]) and the
   matching rows of attn.c_proj. LayerNorms and the biases after the
   all-reduce are replicated; rank 0 adds those biases so the sum counts them
   once. Backward mirrors it: the input gradient of each column-split matmul
   is a partial sum, and is all-reduced.

   Sequence parallelism (Korthikanti et al. 2022) splits what is left
   whole, the norms and residuals, over the rows (tokens): rank k holds rows
   [k N/K, (k+1) N/K) of x and out. Before each column-split matmul an
   all-gather collects the norm's output over all rows; after each
   row-split one a reduce-scatter sums the partial products and leaves each
   rank its rows: the all-reduce's sums, as two halves of it (an all-reduce
   is a reduce-scatter then an all-gather). Backward mirrors it, and the
   norms' weight gradients, now from a rank's rows only, are all-reduced.

   This program builds one random block, runs it whole, then on K thread
   ranks (pt_comm_threads_run) with each rank's slices, without and with
   sequence parallelism, and compares the outputs and every gradient. */
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { B = 2, T = 18, C = 48, NH = 6, N = B * T, K = 3, NS = N / K }; /* K ranks, NH/K heads,
                                                                       NS rows each */

/* A block's parameters, activations and scratch for attention width Ca
   (C/K heads' worth) and MLP width F, in one arena. */
typedef struct block {
    pt_block_params p, g;
    pt_block_acts a;
    pt_block_scratch s;
    float *dx;
    pt_arena ar;
} block;

#define F_(n) ((float *)pt_arena_alloc(ar, (size_t)(n) * sizeof(float)))
static void layout(pt_arena *ar, block *b, int Ca, int Fw) {
    pt_block_params *ps[2] = {&b->p, &b->g};
    for (int i = 0; i < 2; i++) {
        pt_block_params *p = ps[i];
        p->ln1_w = F_(C), p->ln1_b = F_(C), p->qkv_w = F_(C * 3 * Ca), p->qkv_b = F_(3 * Ca);
        p->attn_proj_w = F_(Ca * C), p->attn_proj_b = F_(C), p->ln2_w = F_(C), p->ln2_b = F_(C);
        p->fc_w = F_(C * Fw), p->fc_b = F_(Fw), p->fc_proj_w = F_(Fw * C), p->fc_proj_b = F_(C);
    }
    b->a.ln1 = F_(N * C), b->a.ln1_mean = F_(N), b->a.ln1_rstd = F_(N), b->a.qkv = F_(N * 3 * Ca);
    b->a.lse = F_(B * NH * T), b->a.atty = F_(N * Ca), b->a.res2 = F_(N * C);
    b->a.ln2 = F_(N * C), b->a.ln2_mean = F_(N), b->a.ln2_rstd = F_(N);
    b->a.fch = F_(N * Fw), b->a.out = F_(N * C);
    b->s.dln = F_(N * C), b->s.dqkv = F_(N * 3 * Ca), b->s.datty = F_(N * Ca);
    b->s.dfch = F_(N * Fw), b->s.gelu = F_(N * Fw);
    b->s.w.dout = F_(N * C), b->s.w.dln2 = F_(N * C), b->s.w.dres2 = F_(N * C);
    b->s.w.dln1 = b->s.dln, b->s.w.dfch = b->s.dfch, b->s.w.dqkv = b->s.dqkv;
    b->s.attn_slots = pt_get_threads();
    b->s.attn = F_(pt_attention_scratch_floats(T, b->s.attn_slots));
    b->dx = F_(N * C);
}

static int block_init(block *b, int Ca, int Fw) {
    pt_arena meta;
    memset(b, 0, sizeof *b); /* every field layout does not set is off (NULL, 0) */
    pt_arena_init_meta(&meta);
    layout(&meta, b, Ca, Fw);
    if (pt_arena_init(&b->ar, meta.used, NULL) != PT_OK) return 0;
    memset(b->ar.base, 0, meta.used);
    layout(&b->ar, b, Ca, Fw);
    return 1;
}

/* Columns [c0, c0+n) of each row of src (rows x ld) into dst (rows x n). */
static void cols(float *dst, const float *src, int rows, int ld, int c0, int n) {
    for (int r = 0; r < rows; r++) memcpy(dst + (size_t)r * n, src + (size_t)r * ld + c0, n * 4);
}

/* Rank k's columns of c_attn (rows x 3C, [q|k|v][head][hd]): its Ca columns
   of each of q, k and v, as rows of 3*Ca. */
static void qkv_slice(float *dst, const float *src, int rows, int k) {
    int Ca = C / K;
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < 3; j++)
            memcpy(dst + (size_t)r * 3 * Ca + j * Ca, src + (size_t)r * 3 * C + j * C + k * Ca,
                   Ca * sizeof(float));
}

static block whole;               /* the unsplit block, with its results */
static float x[N * C], dout[N * C]; /* input and the output's gradient */

/* Rank k's slices of the whole block's parameters into P. */
static void slice(pt_block_params *P, int k) {
    const pt_block_params *W = &whole.p;
    int Ca = C / K, Fw = 4 * C / K;
    memcpy(P->ln1_w, W->ln1_w, C * 4), memcpy(P->ln1_b, W->ln1_b, C * 4);
    memcpy(P->ln2_w, W->ln2_w, C * 4), memcpy(P->ln2_b, W->ln2_b, C * 4);
    memcpy(P->attn_proj_b, W->attn_proj_b, C * 4), memcpy(P->fc_proj_b, W->fc_proj_b, C * 4);
    qkv_slice(P->qkv_w, W->qkv_w, C, k); /* q, k, v: this rank's heads of each */
    qkv_slice(P->qkv_b, W->qkv_b, 1, k);
    memcpy(P->attn_proj_w, W->attn_proj_w + (size_t)k * Ca * C, (size_t)Ca * C * 4); /* rows */
    cols(P->fc_w, W->fc_w, C, 4 * C, k * Fw, Fw);                                     /* columns */
    memcpy(P->fc_b, W->fc_b + k * Fw, Fw * 4);
    memcpy(P->fc_proj_w, W->fc_proj_w + (size_t)k * Fw * C, (size_t)Fw * C * 4);     /* rows */
}

/* Elements of rank k's results off the whole block's: out and dx (rows
   [r0, r0 + rows) of them), and each gradient against its slice. */
static int compare(int k, const float *out, const float *dx, int r0, int rows,
                   const pt_block_params *G) {
    static float scratch[K][4 * C * C];
    const pt_block_params *WG = &whole.g;
    int Ca = C / K, Fw = 4 * C / K, bad = 0;
    /* float sums in another order: equal to about 1e-6 relative */
#define CMP(a, ref, n)                                                                       \
    for (int i = 0; i < (n); i++)                                                            \
        if (!(fabsf((a)[i] - (ref)[i]) <= 1e-5f + 1e-4f * fabsf((ref)[i]))) bad++;
    CMP(out, whole.a.out + (size_t)r0 * C, rows * C);
    CMP(dx, whole.dx + (size_t)r0 * C, rows * C);
    CMP(G->ln1_w, WG->ln1_w, C);
    CMP(G->ln2_b, WG->ln2_b, C);
    CMP(G->attn_proj_b, WG->attn_proj_b, C);
    CMP(G->attn_proj_w, WG->attn_proj_w + (size_t)k * Ca * C, Ca * C);
    CMP(G->fc_proj_w, WG->fc_proj_w + (size_t)k * Fw * C, Fw * C);
    cols(scratch[k], WG->fc_w, C, 4 * C, k * Fw, Fw);
    CMP(G->fc_w, scratch[k], C * Fw);
    qkv_slice(scratch[k], WG->qkv_w, C, k);
    CMP(G->qkv_w, scratch[k], C * 3 * Ca);
#undef CMP
    return bad;
}

/* Rank k: its slices, the split forward and backward (tensor parallel, then
   sequence parallel: x, dout, out and dx its NS rows), the comparisons and
   the collectives each made. */
static pt_status rank_main(pt_comm *tp, void *arg) {
    int k = tp->rank, bad, sbad = 0;
    block b;
    pt_arena sa = {0};
    pt_block_params sp, sg;
    pt_block_acts sacts;
    pt_block_scratch ss;
    float sdx[NS * C];
    pt_gpt_config cfg = {0};
    pt_ctx ctx; /* this rank's: fp32 GEMMs, a workspace for its OpenMP threads */
    uint64_t calls0;
    pt_status st;
    (void)arg;
    cfg.n_embd = C, cfg.n_head = NH, cfg.ln_eps = 1e-5f, cfg.n_layer = 1, cfg.block_size = T;
    if ((st = pt_ctx_init(&ctx, NULL)) != PT_OK) return pt_comm_fail(tp, st);
    if (!block_init(&b, C / K, 4 * C / K)) {
        pt_ctx_free(&ctx);
        return pt_comm_fail(tp, PT_ERR_OOM);
    }
    slice(&b.p, k);
    calls0 = tp->calls;
    st = pt_block_forward(&ctx, &cfg, B, T, &b.p, x, &b.a, &b.s, tp);
    if (st == PT_OK) st = pt_block_backward(&ctx, &cfg, B, T, &b.p, &b.g, x, &b.a, dout, b.dx, &b.s, tp);
    bad = st == PT_OK ? compare(k, b.a.out, b.dx, 0, N, &b.g) : 0;
    if (st == PT_OK && k == 0)
        printf("tensor parallel: %llu collectives (all-reduces: after attn.c_proj and "
               "mlp.c_proj, of the c_fc and c_attn input gradients)\n",
               (unsigned long long)(tp->calls - calls0));
    /* the same slices in the library's sequence-parallel layout: measured, then allocated */
    pt_arena_init_meta(&sa);
    pt_block_layout(&cfg, B, T, K, 1, &sa, &sp, &sg, &sacts, &ss);
    if (st == PT_OK && (st = pt_arena_init(&sa, sa.used, NULL)) != PT_OK) st = pt_comm_fail(tp, st);
    if (st == PT_OK) {
        memset(sa.base, 0, sa.capacity);
        pt_block_layout(&cfg, B, T, K, 1, &sa, &sp, &sg, &sacts, &ss);
        slice(&sp, k);
        calls0 = tp->calls;
        st = pt_block_forward(&ctx, &cfg, B, T, &sp, x + (size_t)k * NS * C, &sacts, &ss, tp);
    }
    if (st == PT_OK)
        st = pt_block_backward(&ctx, &cfg, B, T, &sp, &sg, x + (size_t)k * NS * C, &sacts,
                               dout + (size_t)k * NS * C, sdx, &ss, tp);
    if (st == PT_OK) sbad = compare(k, sacts.out, sdx, k * NS, NS, &sg);
    if (st == PT_OK && k == 0)
        printf("sequence parallel: %llu collectives (all-gathers of ln_1 and ln_2 before c_attn "
               "and c_fc, reduce-scatters after the c_projs; backward: all-gathers of dout and "
               "d res2, reduce-scatters of the input gradients, ln_1 and ln_2 gathered again "
               "for the weight gradients, one all-reduce of the norms' weight gradients)\n",
               (unsigned long long)(tp->calls - calls0));
    pt_ctx_free(&ctx);
    pt_arena_free(&b.ar);
    pt_arena_free(&sa);
    if (st != PT_OK) return st;
    printf("rank %d of %d: heads %d..%d, %d MLP columns, rows %d..%d: tensor parallel %s, "
           "sequence parallel %s (%d, %d elements off)\n", k, K, k * NH / K,
           (k + 1) * NH / K - 1, 4 * C / K, k * NS, (k + 1) * NS - 1,
           bad ? "MISMATCH" : "matches", sbad ? "MISMATCH" : "matches", bad, sbad);
    return bad || sbad ? pt_comm_fail(tp, pt_error(PT_ERR_RANGE, "rank %d differs", k)) : PT_OK;
}

int main(void) {
    pt_rng r;
    pt_gpt_config cfg = {0};
    pt_ctx ctx;
    cfg.n_embd = C, cfg.n_head = NH, cfg.ln_eps = 1e-5f;
    if (!block_init(&whole, C, 4 * C) || pt_ctx_init(&ctx, NULL) != PT_OK) return 1;
    pt_rng_seed(&r, 7);
    /* random weights and data: every parameter of the whole block */
    for (float *p = whole.p.ln1_w; p < whole.g.ln1_w; p++) *p = pt_rng_normal(&r, 0.0f, 0.2f);
    for (int i = 0; i < N * C; i++) x[i] = pt_rng_normal(&r, 0, 1), dout[i] = pt_rng_normal(&r, 0, 1);
    pt_block_forward(&ctx, &cfg, B, T, &whole.p, x, &whole.a, &whole.s, NULL);
    pt_block_backward(&ctx, &cfg, B, T, &whole.p, &whole.g, x, &whole.a, dout, whole.dx, &whole.s,
                      NULL);
    pt_ctx_free(&ctx);
    printf("one block (C=%d, %d heads, B=%d, T=%d), whole and split over %d thread ranks\n", C,
           NH, B, T, K);
    if (pt_comm_threads_run(K, rank_main, NULL) != PT_OK) {
        printf("error: %s\n", pt_last_error());
        return 1;
    }
    printf("the split blocks match: outputs, input gradient and every parameter gradient\n");
    pt_arena_free(&whole.ar);
    return 0;
}
