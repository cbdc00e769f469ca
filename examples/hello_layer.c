/* hello_layer.c -- one transformer block, forward and backward, checked by
   finite differences. The smallest complete use of ptrain's kernels.

   gcc -std=c11 -O2 -Wall -Wextra -Wpedantic -fopenmp examples/hello_layer.c -o build/hello_layer -I/usr/include/x86_64-linux-gnu/openblas-openmp -L/usr/lib/x86_64-linux-gnu/openblas-openmp -Wl,-rpath,/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas -lm

   The block maps x (B,T,C) to out (B,T,C):
       res2 = x + attn_proj(attention(qkv(ln1(x))))
       out  = res2 + fc_proj(gelu(fc(ln2(res2))))
   We pick a scalar loss L = sum(out * R) for a fixed random R, so that
   dL/dout = R: backward, fed dout = R, must return dL/dx and dL/dparams.
   It applies the chain rule op by op in reverse: an addition hands its
   gradient to both inputs, y = x W + b hands dy W^T to x, x^T dy to W and
   the column sums of dy to b, softmax, gelu and layernorm have their own
   small formulas (in ptrain.h, above each kernel).
   Finite differences check the result: by Taylor,
       (L(p + h) - L(p - h)) / 2h = dL/dp + O(h^2),
   so a wrong formula shows up as a large disagreement. */
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum { B = 2, T = 8, C = 32, NH = 4, N = B * T };

/* Every buffer comes from one arena, one allocation in all. The same function
   runs twice: on a meta arena (which only counts bytes), then on a real one. */
typedef struct layer {
    pt_block_params p, g;  /* parameters and their gradients: same layout */
    pt_block_acts a;       /* what forward saves for backward */
    pt_block_scratch s;    /* temporaries (attention work, backward's gradients) */
    float *x, *dx, *R;     /* (N,C) input, its gradient, the loss weights */
} layer;

#define F(n) ((float *)pt_arena_alloc(ar, (size_t)(n) * sizeof(float)))
static void layout(pt_arena *ar, layer *l) {
    pt_block_params *ps[2] = {&l->p, &l->g};
    for (int i = 0; i < 2; i++) {  /* shapes are (IN,OUT) for the matmuls */
        pt_block_params *p = ps[i];
        p->ln1_w = F(C), p->ln1_b = F(C), p->qkv_w = F(C * 3 * C), p->qkv_b = F(3 * C);
        p->attn_proj_w = F(C * C), p->attn_proj_b = F(C), p->ln2_w = F(C), p->ln2_b = F(C);
        p->fc_w = F(C * 4 * C), p->fc_b = F(4 * C);
        p->fc_proj_w = F(4 * C * C), p->fc_proj_b = F(C);
    }
    l->a.ln1 = F(N * C), l->a.ln1_mean = F(N), l->a.ln1_rstd = F(N), l->a.qkv = F(N * 3 * C);
    l->a.lse = F(B * NH * T), l->a.atty = F(N * C), l->a.res2 = F(N * C);
    l->a.ln2 = F(N * C), l->a.ln2_mean = F(N), l->a.ln2_rstd = F(N);
    l->a.fch = F(N * 4 * C), l->a.out = F(N * C);
    l->s.dln = F(N * C), l->s.dqkv = F(N * 3 * C), l->s.datty = F(N * C);
    l->s.dfch = F(N * 4 * C), l->s.gelu = F(N * 4 * C);
    /* the output gradients backward keeps for the weight gradients */
    l->s.w.dout = F(N * C), l->s.w.dln2 = F(N * C), l->s.w.dres2 = F(N * C);
    l->s.w.dln1 = l->s.dln, l->s.w.dfch = l->s.dfch, l->s.w.dqkv = l->s.dqkv;
    l->s.attn_slots = pt_get_threads(); /* each thread gets its own attention work */
    l->s.attn = F(pt_attention_scratch_floats(T, l->s.attn_slots));
    l->x = F(N * C), l->dx = F(N * C), l->R = F(N * C);
}

static const pt_gpt_config cfg = {.n_embd = C, .n_head = NH, .ln_eps = 1e-5f};

/* L = sum(out * R), summed in double so that rounding does not drown the
   tiny differences L(p + h) - L(p - h). ctx: the kernels' execution context
   (their GEMMs' precision and workspace). */
static double loss(pt_ctx *ctx, layer *l) {
    double L = 0.0;
    pt_block_forward(ctx, &cfg, B, T, &l->p, l->x, &l->a, &l->s, NULL);
    for (int i = 0; i < N * C; i++) L += (double)l->a.out[i] * l->R[i];
    return L;
}

int main(void) {
    pt_arena meta, ar;
    pt_ctx ctx;  /* fp32 GEMMs and their workspace (for pt_get_threads() threads) */
    layer l;
    pt_rng rng;
    memset(&l, 0, sizeof l); /* every field we do not set is off (NULL, 0) */
    pt_arena_init_meta(&meta);
    layout(&meta, &l);  /* measure ... */
    if (pt_arena_init(&ar, meta.used, NULL) != PT_OK || pt_ctx_init(&ctx, NULL) != PT_OK) {
        puts(pt_last_error());
        return 1;
    }
    layout(&ar, &l);    /* ... then point every tensor into one allocation */
    printf("one arena of %zu bytes holds params, grads, activations and scratch\n", ar.used);

    /* layout() put all parameters first, then all gradients in the same
       order: each class is one contiguous range, easy to fill or zero. */
    float *params = l.p.ln1_w, *grads = l.g.ln1_w;
    size_t n_params = (size_t)(grads - params);

    /* Random everything, including LayerNorm weights and biases: GPT-2's init
       (w = 1, b = 0) would hide a swapped weight and bias. */
    pt_rng_seed(&rng, 42);
    for (size_t i = 0; i < n_params; i++) params[i] = pt_rng_normal(&rng, 0.0f, 0.2f);
    for (int c = 0; c < C; c++) l.p.ln1_w[c] += 1.0f, l.p.ln2_w[c] += 1.0f;
    for (int i = 0; i < N * C; i++) l.x[i] = pt_rng_normal(&rng, 0.0f, 1.0f);
    for (int i = 0; i < N * C; i++) l.R[i] = pt_rng_normal(&rng, 0.0f, 1.0f);

    /* Analytic gradients: forward saves activations, backward runs the chain
       rule in reverse. Parameter gradients accumulate (+=): zero them first. */
    memset(grads, 0, n_params * sizeof(float));
    double L0 = loss(&ctx, &l);
    pt_block_backward(&ctx, &cfg, B, T, &l.p, &l.g, l.x, &l.a, l.R, l.dx, &l.s, NULL);
    printf("L = %.6f\n\n%-12s %6s %13s %13s %10s\n", L0, "tensor", "index", "analytic",
           "numeric", "rel.error");

    struct { const char *name; float *val, *grad; int n; } checks[] = {
        {"x", l.x, l.dx, N * C},
        {"ln1_w", l.p.ln1_w, l.g.ln1_w, C},
        {"qkv_w", l.p.qkv_w, l.g.qkv_w, C * 3 * C},
        {"attn_proj_b", l.p.attn_proj_b, l.g.attn_proj_b, C},
        {"fc_w", l.p.fc_w, l.g.fc_w, C * 4 * C},
        {"fc_proj_b", l.p.fc_proj_b, l.g.fc_proj_b, C},
    };
    const float h = 1e-2f;
    double worst = 0.0;
    int fails = 0;
    for (int k = 0; k < (int)(sizeof checks / sizeof checks[0]); k++)
        for (int rep = 0; rep < 4; rep++) { /* one element in each quarter */
            int n = checks[k].n / 4, i = rep * n + (int)(pt_rng_u64(&rng) % (uint64_t)n);
            float *v = &checks[k].val[i], old = *v, up = old + h, down = old - h;
            *v = up;
            double Lp = loss(&ctx, &l);
            *v = down;
            double Lm = loss(&ctx, &l);
            *v = old;
            /* divide by the step float really took, not by 2h */
            double num = (Lp - Lm) / ((double)up - (double)down), ana = checks[k].grad[i];
            double err = fabs(ana - num), scale = fmax(fabs(ana), fabs(num));
            double rel = scale > 0.0 ? err / scale : 0.0;
            /* Each L carries float rounding noise of ~1e-5, which the division by
               2h = 0.02 turns into ~1e-3: allow 1e-3 absolute plus 1e-2 relative. */
            int ok = err <= 1e-3 + 1e-2 * scale;
            fails += !ok;
            if (rel > worst) worst = rel;
            printf("%-12s %6d %13.6f %13.6f %10.2e%s\n", checks[k].name, i, ana, num, rel,
                   ok ? "" : "  <-- FAIL");
        }
    printf("\n%s: %d of %d gradients disagree; worst relative error %.2e\n",
           fails ? "FAIL" : "OK", fails, 4 * (int)(sizeof checks / sizeof checks[0]), worst);
    pt_arena_free(&ar);
    pt_ctx_free(&ctx);
    return fails ? 1 : 0;
}
