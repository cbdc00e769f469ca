/* ring_attention.c -- one causal attention split over K threads by the
   sequence (context parallelism, ring attention), checked against the same
   attention unsplit.

   make build/ring_attention && build/ring_attention

   A softmax over keys splits into blocks of keys: with each block's partial
   output o_i (the softmax over its keys alone) and log-sum-exp l_i,
       l = log sum_i e^(l_i),   o = sum_i e^(l_i - l) o_i
   (the FlashAttention-2 merge). So a rank holding a share of the queries can
   meet the keys/values block by block as they pass round a ring of ranks:
   K steps, each computing against the block it holds while the next one
   arrives from its left neighbour (the transfer started first). The causal
   mask compares global positions. Were rank r to hold tokens
   [rT/K, (r+1)T/K), rank 0 would have almost nothing to do and rank K-1 the
   most, so the sequence is cut into 2K chunks and rank r holds chunks r and
   2K-1-r: every rank the same share of the triangle.

   Backward recomputes each block's probabilities from the final l, so the
   blocks' contributions to dq, dk and dv add up to the whole gradient. The
   keys/values go round again, and behind each block its dk/dv accumulator,
   which every rank adds its contribution to and which arrives home after K
   hops. This rank computes its contribution into a block of its own while
   the accumulator is on its way, and adds it when it arrived.

   GPT-2's attention has as many key/value heads as query heads; LLaMA's
   grouped-query attention fewer. This one has NH = 4 and NKV = 2. */
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum { B = 2, T = 96, NH = 4, NKV = 2, HD = 8, K = 4, C = NH * HD, CKV = 2 * NKV * HD,
       C3 = C + CKV, CH = T / (2 * K), TL = 2 * CH, NL = B * TL }; /* TL tokens a rank */

static float qkv[B * T * C3], dout[B * T * C];                  /* inputs, [q|k|v] a token */
static float out[B * T * C], lse[B * NH * T], dqkv[B * T * C3]; /* the unsplit results */

/* Global positions of rank r's tokens: chunks r and 2K-1-r. */
static void positions(int *pos, int r) {
    for (int j = 0; j < TL; j++) pos[j] = j < CH ? r * CH + j : (2 * K - 1 - r) * CH + j - CH;
}

/* A rank's buffers (static: K ranks' worth, too big for a thread's stack). */
typedef struct rank_bufs {
    float q[NL * C3], d[NL * C], o[NL * C], l[B * NH * TL], po[NL * C], pl[B * NH * TL];
    float dq[NL * C3], kv[2][NL * CKV], acc[2][NL * CKV], part[NL * CKV];
} rank_bufs;
static rank_bufs bufs[K];

static int off(float a, float ref) { return !(fabsf(a - ref) <= 1e-5f + 1e-4f * fabsf(ref)); }

/* Rank r: its rows, the ring forward and backward, its results against the
   unsplit ones' rows. */
static pt_status rank_main(pt_comm *ring, void *arg) {
    int r = ring->rank, next = (r + 1) % K, prev = (r + K - 1) % K, pos[TL], kpos[TL], bad = 0;
    int slots = pt_get_threads();
    rank_bufs *w = &bufs[r];
    pt_comm_req accs[2] = {{0}}, snd = {0}, rcv = {0}, arcv = {0};
    pt_ctx ctx;
    pt_status st;
    float *scr = malloc(pt_attention_scratch_floats(TL, slots) * sizeof(float));
    (void)arg;
    if (!scr || (st = pt_ctx_init(&ctx, NULL)) != PT_OK) return pt_comm_fail(ring, PT_ERR_OOM);
    positions(pos, r);
    for (int b = 0; b < B; b++)
        for (int j = 0; j < TL; j++) {
            size_t row = (size_t)b * TL + j, g = (size_t)b * T + pos[j];
            memcpy(w->q + row * C3, qkv + g * C3, sizeof(float) * C3);
            memcpy(w->kv[0] + row * CKV, qkv + g * C3 + C, sizeof(float) * CKV); /* k|v */
            memcpy(w->d + row * C, dout + g * C, sizeof(float) * C);
        }
    /* forward: at step s this rank holds the keys/values of rank r-s */
    for (int s = 0; s < K && st == PT_OK; s++) {
        pt_attn_ring blk = {pos, kpos, TL, TL, NULL, CKV};
        blk.kv = w->kv[s & 1];
        positions(kpos, (r - s + K) % K);
        if (s < K - 1) { /* the next block on its way before this one is computed */
            st = pt_comm_send_start(ring, w->kv[s & 1], NL * CKV, next, 0, &snd);
            if (st == PT_OK)
                st = pt_comm_recv_start(ring, w->kv[!(s & 1)], NL * CKV, prev, 0, &rcv);
        }
        pt_attention_ring_forward(&ctx, s ? w->po : w->o, s ? w->pl : w->l, w->q, &blk, scr,
                                  slots, B, C, NH, NKV);
        if (s) pt_attention_merge(w->o, w->l, w->po, w->pl, B, TL, C, NH);
        if (st == PT_OK) st = pt_comm_wait(&snd);
        if (st == PT_OK) st = pt_comm_wait(&rcv);
    }
    /* backward: the blocks go round again from this rank's own (kv[0] again
       from its rows), each followed by its dk/dv */
    for (int i = 0; i < NL; i++)
        memcpy(w->kv[0] + (size_t)i * CKV, w->q + (size_t)i * C3 + C, sizeof(float) * CKV);
    for (int s = 0; s < K && st == PT_OK; s++) {
        int cur = s & 1;
        pt_attn_ring blk = {pos, kpos, TL, TL, NULL, CKV};
        blk.kv = w->kv[cur];
        positions(kpos, (r - s + K) % K);
        if (s < K - 1) {
            st = pt_comm_send_start(ring, w->kv[cur], NL * CKV, next, 0, &snd);
            if (st == PT_OK) st = pt_comm_recv_start(ring, w->kv[!cur], NL * CKV, prev, 0, &rcv);
        }
        if (s > 0 && st == PT_OK) st = pt_comm_wait(&accs[cur]); /* acc[cur] free again */
        if (s > 0 && st == PT_OK) /* rank r-s's block's dk/dv so far, from the left */
            st = pt_comm_recv_start(ring, w->acc[cur], NL * CKV, prev, 1, &arcv);
        memset(w->part, 0, sizeof w->part);
        pt_attention_ring_backward(&ctx, w->dq, w->part, w->d, w->o, w->q, w->l, &blk, scr,
                                   slots, B, C, NH, NKV);
        if (st == PT_OK) st = pt_comm_wait(&arcv);
        for (int i = 0; i < NL * CKV; i++)
            w->acc[cur][i] = (s ? w->acc[cur][i] : 0.0f) + w->part[i];
        if (st == PT_OK) st = pt_comm_send_start(ring, w->acc[cur], NL * CKV, next, 1, &accs[cur]);
        if (st == PT_OK) st = pt_comm_wait(&snd);
        if (st == PT_OK) st = pt_comm_wait(&rcv);
    }
    /* this rank's own block's dk/dv, home after K hops */
    if (st == PT_OK) st = pt_comm_wait(&accs[K & 1]);
    if (st == PT_OK) st = pt_comm_recv(ring, w->acc[K & 1], NL * CKV, prev, 1);
    if (st == PT_OK) st = pt_comm_wait(&accs[!(K & 1)]);
    for (int i = 0; i < NL && st == PT_OK; i++)
        for (int j = 0; j < CKV; j++)
            w->dq[(size_t)i * C3 + C + j] += w->acc[K & 1][(size_t)i * CKV + j];
    for (int b = 0; b < B && st == PT_OK; b++)
        for (int j = 0; j < TL; j++) {
            size_t row = (size_t)b * TL + j, g = (size_t)b * T + pos[j];
            for (int i = 0; i < C; i++) bad += off(w->o[row * C + i], out[g * C + i]);
            for (int i = 0; i < C3; i++) bad += off(w->dq[row * C3 + i], dqkv[g * C3 + i]);
            for (int h = 0; h < NH; h++)
                bad += off(w->l[(b * NH + h) * TL + j], lse[(b * NH + h) * T + pos[j]]);
        }
    pt_ctx_free(&ctx);
    free(scr);
    if (st != PT_OK) return pt_comm_fail(ring, st);
    printf("rank %d of %d: tokens %d..%d and %d..%d: out, lse and dqkv %s (%d elements off)\n",
           r, K, pos[0], pos[CH - 1], pos[CH], pos[TL - 1], bad ? "MISMATCH" : "match", bad);
    return bad ? pt_comm_fail(ring, pt_error(PT_ERR_RANGE, "rank %d differs", r)) : PT_OK;
}

int main(void) {
    pt_rng rng;
    pt_ctx ctx;
    int slots = pt_get_threads();
    float *scr = malloc(pt_attention_scratch_floats(T, slots) * sizeof(float));
    if (!scr || pt_ctx_init(&ctx, NULL) != PT_OK) return 1;
    pt_rng_seed(&rng, 7);
    for (int i = 0; i < B * T * C3; i++) qkv[i] = pt_rng_normal(&rng, 0, 1);
    for (int i = 0; i < B * T * C; i++) dout[i] = pt_rng_normal(&rng, 0, 1);
    pt_attention_forward(&ctx, out, lse, qkv, scr, slots, B, T, C, NH, NKV);
    pt_attention_backward(&ctx, dqkv, dout, out, qkv, lse, scr, slots, B, T, C, NH, NKV);
    pt_ctx_free(&ctx);
    free(scr);
    printf("causal attention (B=%d, T=%d, %d query heads, %d key/value heads), whole and as a "
           "ring of %d thread ranks\n", B, T, NH, NKV, K);
    if (pt_comm_threads_run(K, rank_main, NULL) != PT_OK) {
        printf("error: %s\n", pt_last_error());
        return 1;
    }
    printf("the ring matches: outputs, log-sum-exps and the gradient of q, k and v\n");
    return 0;
}
