/* bench_step: time end-to-end training steps (pt_gpt_step: forward, backward, AdamW).

     build/bench_step --config gpt2-124m|small|tiny|mini|... --batch B --seq T
                      --steps N --threads K [--recompute none|selective|full]
                      [--json] [--phases]

   Checks the result first (the loss at initialisation is near ln V and falls
   when the same batch is trained on), then times N steps after one warm-up
   step and reports the median ms/step, tokens/s, model FLOP utilisation
   (6*params*tokens + 12*layers*C*B*T^2 per step) and the peak resident
   memory. MFU is reported twice: against the instruction peak of the
   variant's precision (pt_instr_peak_gflops: what the CPU's FMA or bf16
   dot-product units can do, never above 100%) and against the variant's own
   GEMM at 1024^3, measured now with the same threads (pt_gemm_peak_gflops at
   its precision; the best of a measurement before and one after the steps,
   since one 0.5 s measurement on a shared machine can come out 15% low; a
   step above it says the probe ran slow rather than print over 100%).
   --gemm ptrain,openblas times the same steps with each GEMM in turn (steps
   interleaved, so a shared machine's load falls on all alike) and prints the
   ratio of each to the first; --precision fp32,bf16 does the same for the
   GEMMs' arithmetic (every GEMM with every precision), each MFU against the
   instruction peak of its precision. --recompute picks the activation
   recomputation (pt_gpt_desc.recompute, as build/train's option): the peak
   RSS then shows what it saves, the step time what it costs.
   --phases then splits each variant's step by phase (GEMMs of the layers and
   of the head, attention, the loss, norms, activations, residual adds and
   copies, bf16 rounding, the embedding, AdamW, communication): each phase's
   kernels run again on their own, as one step calls them, next to whole
   steps, and each is set against its roofline (FLOPs at the instruction
   peak, or the bytes it must move at the measured memory bandwidth), so the
   next bottleneck is a row of a table.
   Profile it with: perf record -g build/bench_step --config small --steps 20 */
#define _DEFAULT_SOURCE
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"
#include "../common/cli.h"

#include <math.h>
#include <sys/resource.h>

/* GFLOP/s of GEMM `name` (empty: the one running) at precision p, 1024^3, in
   the model's context (its workspace) */
static double gemm_peak(pt_gpt *gpt, const char *name, pt_precision p) {
    pt_precision was = gpt->ctx.precision;
    double r;
    if (name[0]) pt_gemm_select(name);
    gpt->ctx.precision = p;
    r = pt_gemm_peak_gflops(&gpt->ctx, 1024, 0.5);
    gpt->ctx.precision = was;
    return r;
}

/* the run: its options, and the variants it times (a GEMM at a precision) */
typedef struct bench {
    const char *config, *recompute; /* recompute: none, selective or full */
    int batch, seq, steps, json;
    int ng;              /* variants, at most 8 */
    char names[8][16];   /* each one's GEMM (empty: the one running) */
    pt_precision prec[8];
    double peak[8];      /* each one's GEMM at 1024^3 at its precision, GFLOP/s */
    double ipeak[3];     /* [1 + bf16]: the fp32 and bf16 instruction peaks (0: none used) */
    double loss0[8], loss1[8]; /* each one's loss at init and after a step */
} bench;

/* the GEMMs to compare (--gemm, none named: the one running) times the
   precisions (--precision): variant g = GEMM g / np, precision g % np, into
   b->names, b->prec, b->ng; 2 if one is unknown */
static int parse_variants(bench *b, const char *gemms, const char *precs) {
    const char *p = gemms;
    pt_precision list[2];
    char one[16];
    int ng = 0, np = 0, g, k;
    while (*p && ng < 8) {
        size_t n = strcspn(p, ",");
        snprintf(b->names[ng], sizeof b->names[ng], "%.*s", (int)n, p);
        if (pt_gemm_select(b->names[ng]) != PT_OK) {
            fprintf(stderr, "error: --gemm: %s\n", pt_last_error());
            return 2;
        }
        ng++;
        p += n + (p[n] == ',');
    }
    if (ng == 0) snprintf(b->names[ng++], sizeof b->names[0], "%s", "");
    p = precs;
    while (*p && np < 2) {
        size_t n = strcspn(p, ",");
        snprintf(one, sizeof one, "%.*s", (int)n, p);
        if (pt_precision_parse(one, &list[np]) != PT_OK) {
            fprintf(stderr, "error: --precision: %s\n", pt_last_error());
            return 2;
        }
        np++;
        p += n + (p[n] == ',');
    }
    if (np == 0) list[np++] = PT_PRECISION_FP32;
    for (g = ng - 1; g >= 0; g--)
        for (k = np - 1; k >= 0; k--) {
            if (g * np + k >= 8) continue;
            if (g * np + k != g) /* (snprintf onto its own source emptied it: the default GEMM ran) */
                memcpy(b->names[g * np + k], b->names[g], sizeof b->names[0]);
            b->prec[g * np + k] = list[k];
        }
    b->ng = ng * np > 8 ? 8 : ng * np;
    return 0;
}

/* each variant's GEMM peak into b->peak and the instruction peaks of the
   precisions used into b->ipeak, before the steps */
static void measure_peaks(bench *b, pt_gpt *gpt) {
    int g, nth;
    double one;
    for (g = 0; g < b->ng; g++) /* each variant's GEMM at its precision */
        b->peak[g] = gemm_peak(gpt, b->names[g], b->prec[g]);
    /* the larger of all threads' probe and threads x one thread's: a probe
       that shared its cores with other processes can only come out low */
    nth = pt_get_threads();
    for (g = 0; g < b->ng; g++) {
        int bf = b->prec[g] == PT_PRECISION_BF16;
        if (b->ipeak[1 + bf] > 0) continue;
        b->ipeak[1 + bf] = pt_instr_peak_gflops(bf, 0.5);
        pt_set_threads(1);
        one = pt_instr_peak_gflops(bf, 0.5);
        pt_set_threads(nth);
        b->ipeak[1 + bf] = nth * one > b->ipeak[1 + bf] ? nth * one : b->ipeak[1 + bf];
    }
}

/* the peaks again after the steps, each kept at the larger of its two */
static void remeasure_peaks(bench *b, pt_gpt *gpt) {
    int g, bf;
    for (g = 0; g < b->ng; g++) {
        double after = gemm_peak(gpt, b->names[g], b->prec[g]);
        b->peak[g] = after > b->peak[g] ? after : b->peak[g];
    }
    for (bf = 0; bf < 2; bf++)
        if (b->ipeak[1 + bf] > 0) {
            double iafter = pt_instr_peak_gflops(bf, 0.5);
            b->ipeak[1 + bf] = iafter > b->ipeak[1 + bf] ? iafter : b->ipeak[1 + bf];
        }
}

/* check, for each variant from the same initial weights: loss at init near
   ln V; one step on the batch lowers it (also the variant's warm-up). The
   losses into b->loss0, b->loss1; 1 if a step fails or the check does */
static int check_variants(bench *b, pt_gpt *gpt, pt_step_desc *sd, pt_adamw_config *opt,
                          const pt_gpt_config *cfg) {
    int g;
    for (g = 0; g < b->ng; g++) {
        if (b->names[g][0]) pt_gemm_select(b->names[g]);
        gpt->ctx.precision = b->prec[g]; /* the GEMMs' (the layout kept prec[0]'s activations) */
        pt_gpt_init_weights(gpt, 1);
        sd->adamw = opt, sd->lr = 1e-3f;
        if (pt_gpt_step(gpt, sd, NULL) != PT_OK) {
            fprintf(stderr, "error: %s\n", pt_last_error());
            return 1;
        }
        b->loss0[g] = gpt->loss;
        sd->adamw = NULL; /* the loss after the update: forward and backward only */
        if (pt_gpt_step(gpt, sd, NULL) != PT_OK) {
            fprintf(stderr, "error: %s\n", pt_last_error());
            return 1;
        }
        b->loss1[g] = gpt->loss;
        if (!(fabs(b->loss0[g] - log((double)cfg->vocab_size)) < 0.5) ||
            !(b->loss1[g] < b->loss0[g])) {
            fprintf(stderr, "error: result check failed (%s): loss %.4f (ln V = %.4f), then %.4f\n",
                    pt_precision_name(b->prec[g]), b->loss0[g], log((double)cfg->vocab_size),
                    b->loss1[g]);
            return 1;
        }
    }
    return 0;
}

/* b->steps training steps of every variant, interleaved (step i of each, then
   step i + 1): variant g's step i takes times[g * steps + i] seconds; 1 if a
   step fails */
static int time_steps(const bench *b, pt_gpt *gpt, const pt_step_desc *sd, double *times) {
    int i, g;
    for (i = 0; i < b->steps; i++)
        for (g = 0; g < b->ng; g++) {
            double t0;
            if (b->names[g][0]) pt_gemm_select(b->names[g]);
            gpt->ctx.precision = b->prec[g];
            t0 = pt_time_now();
            if (pt_gpt_step(gpt, sd, NULL) != PT_OK) {
                fprintf(stderr, "error: %s\n", pt_last_error());
                return 1;
            }
            times[(size_t)g * b->steps + i] = pt_time_now() - t0;
        }
    return 0;
}

/* variant g's line (or JSON object): its median step of t (sorted here),
   tokens/s, MFU against both peaks, the peak RSS, and with several variants
   the first one's median step (med0; for g = 0, its own) over its. Returns
   the median. */
static double print_variant(const bench *b, const pt_gpt *gpt, int g, double *t, double flops,
                          double med0, const struct rusage *ru) {
    const char *gname, *pname = pt_precision_name(b->prec[g]);
    double ip = b->ipeak[1 + (b->prec[g] == PT_PRECISION_BF16)], med;
    int batch = b->batch, seq = b->seq;
    if (b->names[g][0]) pt_gemm_select(b->names[g]);
    gname = b->prec[g] == PT_PRECISION_BF16 ? pt_gemm_bf16_name() : pt_gemm_name();
    med = cli_median(t, b->steps);
    if (g == 0) med0 = med;
    if (b->json) {
        printf("{\"config\": \"%s\", \"batch\": %d, \"seq\": %d, \"threads\": %d, "
               "\"params\": %zu, \"steps\": %d, \"ms_per_step\": %.3f, \"tokens_per_s\": %.1f, "
               "\"gflops_per_step\": %.4f, \"peak_gflops\": %.1f, \"mfu\": %.4f, "
               "\"peak_rss_bytes\": %lld, \"loss_check\": [%.4f, %.4f], \"gemm\": \"%s\", "
               "\"precision\": \"%s\", \"instr_peak_gflops\": %.1f, \"mfu_instr\": %.4f, "
               "\"recompute\": \"%s\", \"peak_rss_mib\": %.1f}\n",
               b->config, batch, seq, pt_get_threads(), gpt->num_params, b->steps, med * 1e3,
               batch * seq / med, flops / 1e9, b->peak[g], flops / med / (b->peak[g] * 1e9),
               (long long)ru->ru_maxrss * 1024, b->loss0[g], b->loss1[g], gname, pname, ip,
               ip > 0 ? flops / med / (ip * 1e9) : 0.0, b->recompute, ru->ru_maxrss / 1024.0);
    } else {
        double mg = 100.0 * flops / med / (b->peak[g] * 1e9);
        char of_gemm[64];
        if (mg <= 100.0) snprintf(of_gemm, sizeof of_gemm, "%5.1f%%", mg);
        else snprintf(of_gemm, sizeof of_gemm, "n/a (probe slow)");
        printf("%-10s B=%-3d T=%-4d threads %d %s gemm %-17s recompute %s: %9.1f ms/step %9.0f "
               "tok/s  MFU %5.1f%% of the %s instruction peak %.0f GFLOP/s, %s of its GEMM's %.0f "
               "at 1024^3  peak RSS %.0f MiB",
               b->config, batch, seq, pt_get_threads(), pname, gname, b->recompute, med * 1e3,
               batch * seq / med,
               ip > 0 ? 100.0 * flops / med / (ip * 1e9) : 0.0, pname, ip, of_gemm, b->peak[g],
               ru->ru_maxrss / 1024.0);
        if (b->ng > 1) printf("  %.2fx the first", med0 / med);
        printf("\n");
    }
    return med;
}

/* ---- --phases: the step's time by phase, each against its roofline ------

   Each phase's kernels are run again on their own, as pt_block_forward,
   pt_block_backward (input, then weight gradients), the head and the
   optimizer call them in one step of this model, with the model's weights,
   gradients and context (so its precision and GEMM) and L layers of
   activations of its own (fp32, filled with values in [-1, 1]), and timed
   whole (fastest of `reps` runs). The roofline of a GEMM-bound phase is its
   FLOPs at the instruction peak of the step's precision; of the others,
   the bytes they must move at the measured memory bandwidth. What the
   phases leave of a whole step's median time is "unattributed" (the step's
   own copies in the executor, caches colder than in the replay, the
   machine's other load). */
enum { PH_GEMM, PH_HEAD, PH_ATTN, PH_LOSS, PH_NORM, PH_ACT, PH_COPY, PH_BF16, PH_EMB, PH_OPT,
       PH_COMM, PH_FUSED, PH_N };
static const char *ph_names[PH_N] = {
    "GEMMs (layers)", "GEMMs (head)", "attention", "loss (softmax xent)", "norms",
    "activations, rope", "residuals, copies", "bf16 rounding", "embedding", "optimizer (AdamW)",
    "communication", "head+loss fused"};

typedef struct phases {
    pt_gpt *gpt;
    const char *config;
    pt__dims d;
    int L, B, T, V;
    pt_block_acts *acts;   /* (L) */
    pt_block_scratch s;
    pt_arena arena;
    uint16_t *h16;          /* bf16 keep of a layer's ln1|qkv|ln2|fch */
    float *lnf, *logits, *losses, *dx, *work; /* work: the fused head's block of logits */
    size_t work_n;                            /* and wte packed: pt_head_xent_work_floats */
    double *lse;
    int *tok;
    double flops[PH_N], bytes[PH_N], sec[PH_N];
} phases;

/* the layers' activations and the scratch in ph->arena; 1 if out of memory */
static int phases_alloc(phases *ph) {
    const pt_gpt_config *c = &ph->gpt->config;
    size_t bytes = 0, i, N = ph->d.N;
    int pass, l;
    for (pass = 0; pass < 2; pass++) {
        pt_arena *a = &ph->arena;
        if (pass == 0) pt_arena_init_meta(a);
        else if (pt_arena_init(a, bytes, NULL) != PT_OK) return 1;
        for (l = 0; l < ph->L; l++)
            pt__layout_block_acts(&ph->acts[l], a, &ph->d, PT_RECOMPUTE_NONE, 1,
                                  c->norm == PT_NORM_LAYER, 0, 0);
        pt__layout_scratch(&ph->s, a, &ph->d, 1, c->pos == PT_POS_ROPE, 0, 0, 0);
        ph->lnf = PT__F(a, N * ph->d.C);
        ph->dx = PT__F(a, N * ph->d.C);
        ph->logits = PT__F(a, N * (size_t)ph->V);
        ph->work_n = pt_head_xent_work_floats(&ph->gpt->ctx, (int)N, ph->d.C, ph->V,
                                              PT__HEAD_ROWS);
        ph->work = PT__F(a, ph->work_n);
        ph->losses = PT__F(a, N);
        ph->lse = (double *)pt_arena_alloc(a, N * sizeof(double));
        ph->tok = (int *)pt_arena_alloc(a, N * sizeof(int));
        ph->h16 = (uint16_t *)pt_arena_alloc(a, N * (2 * ph->d.C + ph->d.Q3 + ph->d.Fi) * 2);
        bytes = a->used;
    }
    {
        pt_rng r;
        float *f = (float *)ph->arena.base;
        pt_rng_seed(&r, 3);
        for (i = 0; i < bytes / sizeof(float); i++) f[i] = 2.0f * pt_rng_uniform(&r) - 1.0f;
        for (i = 0; i < N; i++) ph->tok[i] = (int)(pt_rng_u64(&r) % (uint64_t)c->vocab_size);
        for (l = 0; l < ph->L; l++) { /* rstd > 0 */
            for (i = 0; i < N; i++) ph->acts[l].ln1_rstd[i] = ph->acts[l].ln2_rstd[i] = 1.0f;
        }
    }
    return 0;
}

/* one step's worth of phase k's kernels */
static void phase_run(phases *ph, int k) {
    pt_gpt *m = ph->gpt;
    const pt_gpt_config *c = &m->config;
    pt_ctx *ctx = &m->ctx;
    pt_gpt_exec *x = m->exec;
    pt_block_scratch *s = &ph->s;
    pt__dims d = ph->d;
    int N = (int)d.N, C = (int)d.C, Ca = (int)d.Ca, Q3 = (int)d.Q3, F = (int)d.F;
    int Fi = (int)d.Fi, V = ph->V, l;
    size_t NC = d.N * d.C;
    for (l = 0; l < ph->L; l++) {
        pt_block_acts *a = &ph->acts[l];
        const float *in = l ? ph->acts[l - 1].out : ph->lnf;
        const pt_block_params *p = &m->layers[l];
        pt_block_params *g = &x->coll.layer_grads[l];
        if (k == PH_GEMM) { /* forward, input gradients, weight gradients */
            pt__proj_forward(ctx, c, a->qkv, a->ln1, p->qkv_w, p->qkv_b, N, C, Q3);
            pt__proj_forward(ctx, c, a->res2, a->atty, p->attn_proj_w, p->attn_proj_b, N, Ca, C);
            pt__proj_forward(ctx, c, a->fch, a->ln2, p->fc_w, p->fc_b, N, C, Fi);
            pt__proj_forward(ctx, c, a->out, s->gelu, p->fc_proj_w, p->fc_proj_b, N, F, C);
            pt__proj_backward(ctx, c, s->gelu, NULL, NULL, a->out, NULL, p->fc_proj_w, N, F, C);
            pt__proj_backward(ctx, c, s->dln, NULL, NULL, a->fch, NULL, p->fc_w, N, C, Fi);
            pt__proj_backward(ctx, c, s->datty, NULL, NULL, a->res2, NULL, p->attn_proj_w, N, Ca, C);
            pt__proj_backward(ctx, c, s->dln, NULL, NULL, a->qkv, NULL, p->qkv_w, N, C, Q3);
            pt__proj_backward(ctx, c, NULL, g->fc_proj_w, g->fc_proj_b, a->out, s->gelu,
                              p->fc_proj_w, N, F, C);
            pt__proj_backward(ctx, c, NULL, g->fc_w, g->fc_b, a->fch, a->ln2, p->fc_w, N, C, Fi);
            pt__proj_backward(ctx, c, NULL, g->attn_proj_w, g->attn_proj_b, a->res2, a->atty,
                              p->attn_proj_w, N, Ca, C);
            pt__proj_backward(ctx, c, NULL, g->qkv_w, g->qkv_b, a->qkv, a->ln1, p->qkv_w, N, C, Q3);
        } else if (k == PH_ATTN) {
            pt_attention_forward(ctx, a->atty, a->lse, a->qkv, s->attn, s->attn_slots, ph->B,
                                 ph->T, Ca, (int)d.NH, (int)d.NKV);
            pt_attention_backward(ctx, s->dqkv, s->datty, a->atty, a->qkv, a->lse, s->attn,
                                  s->attn_slots, ph->B, ph->T, Ca, (int)d.NH, (int)d.NKV);
        } else if (k == PH_NORM) { /* forward (bf16: rounded and kept in its pass); backward's
                                      input pass, then its weight pass */
            int k16 = ctx->precision == PT_PRECISION_BF16;
            const uint16_t *held;
            pt__norm_act(ctx, c, a->ln1, a->ln1_mean, a->ln1_rstd, in, p->ln1_w, p->ln1_b, N, C,
                         k16 ? ph->h16 : NULL, &held, 0);
            pt__norm_act(ctx, c, a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, p->ln2_w, p->ln2_b, N,
                         C, k16 ? ph->h16 + NC + d.N * d.Q3 : NULL, &held, 0);
            pt__norm_dinput(c, s->dln, s->w.dout, s->w.dres2, a->ln2, a->res2, p->ln2_w,
                            a->ln2_mean, a->ln2_rstd, N, C); /* with the residual's and W's copy */
            pt__norm_backward(c, s->dln, NULL, NULL, a->ln1, in, p->ln1_w, a->ln1_mean,
                              a->ln1_rstd, N, C);
            pt__norm_backward(c, NULL, g->ln2_w, g->ln2_b, a->ln2, a->res2, p->ln2_w,
                              a->ln2_mean, a->ln2_rstd, N, C);
            pt__norm_backward(c, NULL, g->ln1_w, g->ln1_b, a->ln1, in, p->ln1_w, a->ln1_mean,
                              a->ln1_rstd, N, C);
        } else if (k == PH_ACT) { /* forward (bf16: fch rounded and kept in its pass);
                                     backward, writing the forward's again for W */
            const uint16_t *held;
            pt__act_keep(ctx, c, s->gelu, a->fch, d.N, d.F, ctx->precision == PT_PRECISION_BF16
                         ? ph->h16 + 2 * NC + d.N * d.Q3 : NULL, &held, NULL);
            if (c->mlp == PT_MLP_SWIGLU)
                pt__swiglu_bwd(s->dfch, s->gelu, a->fch, s->gelu, N, F, NULL);
            else
                pt__gelu(s->dfch, s->gelu, a->fch, s->dfch, d.N * d.F, 1, NULL);
            if (c->pos == PT_POS_ROPE) {
                const float *cs = pt__rope_cs(c, s, ph->T);
                pt_rope_forward(a->qkv, cs, N, ph->T, (int)(d.NH + d.NKV), (int)d.hd, Q3);
                pt_rope_backward(s->dqkv, cs, N, ph->T, (int)(d.NH + d.NKV), (int)d.hd, Q3);
            }
        } else if (k == PH_COPY) { /* the residual adds, and backward's copies and zeroing */
            pt_residual_forward(a->res2, a->res2, in, NC);
            pt_residual_forward(a->out, a->out, a->res2, NC);
            memcpy(s->w.dout, a->out, NC * sizeof(float));
            memset(s->gelu, 0, d.N * d.F * sizeof(float));
            memset(s->dln, 0, NC * sizeof(float));
            memset(s->datty, 0, d.N * d.Ca * sizeof(float));
            memset(s->dqkv, 0, d.N * d.Q3 * sizeof(float));
            memset(s->dln, 0, NC * sizeof(float));
        } else if (k == PH_BF16) { /* kept as bf16 in forward (ln1, ln2, fch: in the norms'
                                      and the activation's pass), widened for backward */
            uint16_t *h = ph->h16;
            size_t o[4], n[4];
            int j;
            n[0] = NC, n[1] = d.N * d.Q3, n[2] = NC, n[3] = d.N * d.Fi;
            o[0] = 0, o[1] = n[0], o[2] = o[1] + n[1], o[3] = o[2] + n[2];
            pt__bf16_keep(h + o[1], a->qkv, n[1]);
            for (j = 3; j >= 0; j--) pt__bf16_widen(j == 0 ? a->ln1 : j == 1 ? a->qkv : j == 2
                                                    ? a->ln2 : a->fch, h + o[j], n[j]);
        }
    }
    if (k == PH_HEAD) {
        pt_tied_head_forward(ctx, ph->logits, ph->lnf, m->lm_head, N, C, V);
        pt_tied_head_backward(ctx, ph->dx, x->coll.dhead, ph->logits, ph->lnf, m->lm_head, N, C, V);
    } else if (k == PH_LOSS) {
        pt_crossentropy_forward(ph->losses, ph->lse, ph->logits, ph->tok, N, V);
        pt_crossentropy_backward(ph->logits, ph->logits, ph->lse, ph->tok, N, V, 1.0f / N);
    } else if (k == PH_NORM) { /* the final norm */
        pt__norm_forward(c, ph->lnf, ph->acts[0].ln1_mean, ph->acts[0].ln1_rstd,
                         ph->acts[ph->L - 1].out, m->lnf_w, m->lnf_b, N, C);
        pt__norm_backward(c, ph->dx, x->coll.dlnf_w, x->coll.dlnf_b, ph->lnf,
                          ph->acts[ph->L - 1].out, m->lnf_w, ph->acts[0].ln1_mean,
                          ph->acts[0].ln1_rstd, N, C);
    } else if (k == PH_EMB) {
        pt_encoder_forward(ph->dx, ph->tok, m->wte, m->wpe ? m->wpe : NULL, ph->B, ph->T, C);
        pt_encoder_backward(x->coll.dwte, x->coll.dwpe, ph->dx, ph->tok, ph->B, ph->T, C);
    } else if (k == PH_FUSED) { /* what the head and loss would take fused by row blocks */
        pt_head_xent_fused(ctx, ph->losses, ph->lse, ph->dx, x->coll.dhead, ph->lnf, m->lm_head,
                           ph->tok, N, C, V, 1.0f / N, ph->work, ph->work_n, PT__HEAD_ROWS);
    } else if (k == PH_OPT) {
        pt_adamw_config cfg = pt_adamw_default();
        pt__adamw_tensors(m->table, m->num_tensors, m->params, m->grads, m->m, m->v, &cfg, 1e-9f, 1);
    }
}

/* each phase's FLOPs (GEMM-bound phases: 2mnk a product; attention the
   causal half of its four products, forward 2 and backward 4 of them,
   B T^2 Ca each) or the bytes it must move at least (the others: each
   kernel reads its inputs and writes its outputs once) */
static void phases_count(phases *ph) {
    const pt_gpt *m = ph->gpt;
    const pt_gpt_config *c = &m->config;
    pt__dims d = ph->d;
    double N = (double)d.N, C = (double)d.C, L = ph->L, F = (double)d.F, V = ph->V;
    double NC = N * C, T = ph->T;
    ph->flops[PH_GEMM] = 3 * 2 * N * L * (C * d.Q3 + d.Ca * C + C * d.Fi + F * C);
    ph->flops[PH_HEAD] = ph->flops[PH_FUSED] = 3 * 2 * N * C * V;
    ph->flops[PH_ATTN] = 6 * L * (double)d.B * T * T * d.Ca;
    ph->bytes[PH_LOSS] = 12 * N * V;
    /* (ln2's input gradient writes W's copy of dx too; bf16: the forward the kept bits) */
    ph->bytes[PH_NORM] = (2 * L + 1) * 24 * NC + L * 4 * NC;
    if (m->ctx.precision == PT_PRECISION_BF16) ph->bytes[PH_NORM] += L * 2 * 2 * NC;
    ph->bytes[PH_ACT] = L * N * F * (c->mlp == PT_MLP_SWIGLU ? 36 : 24);
    if (c->pos == PT_POS_ROPE) ph->bytes[PH_ACT] += L * 16 * N * (double)(d.NH + d.NKV) * d.hd;
    if (m->ctx.precision == PT_PRECISION_BF16) ph->bytes[PH_ACT] += L * 2 * N * (double)d.Fi;
    ph->bytes[PH_COPY] = L * (24 * NC + 8 * NC + 4 * N * (F + 2 * C + d.Ca + d.Q3));
    ph->bytes[PH_BF16] = m->ctx.precision == PT_PRECISION_BF16 /* (ln1, ln2, fch: widening) */
                             ? L * 12 * N * d.Q3 + L * 6 * N * (2 * C + d.Fi) : 0.0;
    ph->bytes[PH_EMB] = (c->pos == PT_POS_LEARNED ? 24 : 16) * NC;
    ph->bytes[PH_OPT] = 28.0 * (double)m->num_params;
}

/* The table for the model's precision: phase, measured ms, roofline ms, the
   share of the roofline reached, the share of the step. ipeak: instruction
   peak at the step's precision (GFLOP/s), bw: GB/s. */
static void phases_print(const phases *ph, double step, double ipeak, double bw, int json) {
    double sum = 0.0;
    int k, fused = ph->gpt->exec->head_work != NULL; /* the step runs the head fused */
    const char *prec = pt_precision_name(ph->gpt->ctx.precision);
    if (json)
        printf("{\"config\": \"%s\", \"precision\": \"%s\", \"instr_peak_gflops\": %.1f, "
               "\"bandwidth_gbs\": %.1f, \"phases\": [", ph->config, prec, ipeak, bw);
    else
        printf("phases of one step (%s, %s; the step and each phase's kernels on their own, fastest of 3 rounds): "
               "roofline = FLOPs at the %.0f GFLOP/s instruction peak or bytes at %.1f GB/s\n"
               "  %-22s %10s %10s %9s %8s\n", ph->config, prec, ipeak, bw,
               "phase", "ms", "roof ms", "of roof", "of step");
    for (k = 0; k < PH_N; k++) {
        double roof = ph->flops[k] > 0 ? ph->flops[k] / (ipeak * 1e9)
                                       : ph->bytes[k] / (bw * 1e9);
        /* (the head and loss apart, or fused: printed after the table, not the step's) */
        int apart = fused ? k == PH_HEAD || k == PH_LOSS : k == PH_FUSED;
        if (k == PH_FUSED && !json && !fused) break;
        if (!json && apart) continue;
        sum += apart ? 0.0 : ph->sec[k];
        if (json)
            printf("%s{\"phase\": \"%s\", \"ms\": %.3f, \"roofline_ms\": %.3f, "
                   "\"flops\": %.6g, \"bytes\": %.6g, \"in_step\": %s}", k ? ", " : "",
                   ph_names[k], ph->sec[k] * 1e3, roof * 1e3, ph->flops[k], ph->bytes[k],
                   apart ? "false" : "true");
        else if (k == PH_COMM && ph->sec[k] == 0.0)
            printf("  %-22s %10s %10s %9s %8s   (one rank: no collective)\n", ph_names[k], "0",
                   "-", "-", "-");
        else if (ph->sec[k] > 0.0)
            printf("  %-22s %10.2f %10.2f %8.0f%% %7.1f%%\n", ph_names[k], ph->sec[k] * 1e3,
                   roof * 1e3, 100.0 * roof / ph->sec[k], 100.0 * ph->sec[k] / step);
    }
    if (json) {
        printf("], \"sum_ms\": %.3f, \"step_ms\": %.3f}\n", sum * 1e3, step * 1e3);
        return;
    }
    printf("  %-22s %10.2f %10s %9s %7.1f%%\n", "sum of the phases", sum * 1e3, "", "",
           100.0 * sum / step);
    printf("  %-22s %10.2f %10s %9s %7.1f%%\n", "the whole step", step * 1e3, "", "", 100.0);
    printf("  %-22s %10.2f\n", "unattributed", (step - sum) * 1e3);
    if (fused) /* the step's head phase: what the unfused kernels would take */
        printf("  (unfused, not in the step: %s %.2f ms + %s %.2f ms = %.2f ms)\n",
               ph_names[PH_HEAD], ph->sec[PH_HEAD] * 1e3, ph_names[PH_LOSS],
               ph->sec[PH_LOSS] * 1e3, (ph->sec[PH_HEAD] + ph->sec[PH_LOSS]) * 1e3);
    else
        printf("  %-22s %10.2f %10.2f %8.0f%%           instead of the head GEMMs and the loss "
               "(%.2f ms): pt_head_xent_fused, %d-row blocks\n", ph_names[PH_FUSED],
               ph->sec[PH_FUSED] * 1e3, ph->flops[PH_FUSED] / (ipeak * 1e9) * 1e3,
               100.0 * ph->flops[PH_FUSED] / (ipeak * 1e9) / ph->sec[PH_FUSED],
               (ph->sec[PH_HEAD] + ph->sec[PH_LOSS]) * 1e3, PT__HEAD_ROWS);
}

/* --phases for variant g of b: 4 rounds of a whole step (sd) then each
   phase, the first a warm-up, each timed at its fastest of the other 3 (so
   a shared machine's load falls on the step and its phases alike), and the
   table; 1 if out of memory or a step fails */
static int phases_measure(const bench *b, pt_gpt *gpt, int g, const pt_step_desc *sd,
                          double bw) {
    phases ph;
    double step = 0.0;
    int k, r;
    memset(&ph, 0, sizeof ph);
    ph.gpt = gpt, ph.config = b->config, ph.L = gpt->place.n_layers;
    ph.B = b->batch, ph.T = b->seq, ph.V = gpt->place.vocab_local;
    ph.d = pt__block_dims(&gpt->config, b->batch, b->seq, 1);
    ph.acts = (pt_block_acts *)calloc((size_t)ph.L, sizeof *ph.acts);
    if (!ph.acts || phases_alloc(&ph) != 0) {
        free(ph.acts);
        fprintf(stderr, "error: --phases: out of memory\n");
        return 1;
    }
    if (b->names[g][0]) pt_gemm_select(b->names[g]);
    gpt->ctx.precision = b->prec[g];
    phases_count(&ph);
    for (r = 0; r < 4; r++) {
        double t0 = pt_time_now(), t;
        if (pt_gpt_step(gpt, sd, NULL) != PT_OK) {
            fprintf(stderr, "error: %s\n", pt_last_error());
            pt_arena_free(&ph.arena);
            free(ph.acts);
            return 1;
        }
        t = pt_time_now() - t0;
        if (r == 1 || (r > 1 && t < step)) step = t; /* round 0 warms up */
        for (k = 0; k < PH_N; k++) {
            if (k == PH_COMM || (k == PH_BF16 && ph.bytes[k] == 0.0)) continue;
            t0 = pt_time_now();
            phase_run(&ph, k);
            t = pt_time_now() - t0;
            if (r == 1 || (r > 1 && t < ph.sec[k])) ph.sec[k] = t;
        }
    }
    phases_print(&ph, step, b->ipeak[1 + (b->prec[g] == PT_PRECISION_BF16)], bw, b->json);
    pt_arena_free(&ph.arena);
    free(ph.acts);
    return 0;
}

int main(int argc, char **argv) {
    const char *config = "small", *gemms = "", *precs = "fp32", *recompute = "none";
    int batch = 8, seq = 128, steps = 5, threads = 0, json = 0, phase = 0, npos, s, i, g;
    int rc;
    const char *pos[1];
    cli_opt opts[] = {
        {"config", CLI_STR, &config, "model preset (tiny, mini, small, gpt2-124m, ...)", 0, 0},
        {"batch", CLI_INT, &batch, "B", 1, 1 << 16},
        {"seq", CLI_INT, &seq, "T", 1, 1 << 20},
        {"steps", CLI_INT, &steps, "timed steps (after one warm-up step)", 1, 100000},
        {"threads", CLI_INT, &threads, "OpenMP/BLAS threads (0: all cores)", 0, 1024},
        {"json", CLI_FLAG, &json, "print one JSON object (a line for each GEMM)", 0, 0},
        {"gemm", CLI_STR, &gemms, "comma-separated GEMMs to compare (ptrain, openblas, portable)",
         0, 0},
        {"precision", CLI_STR, &precs, "comma-separated precisions to compare (fp32, bf16)", 0, 0},
        {"recompute", CLI_STR, &recompute, "activation recomputation: none, selective, full", 0,
         0},
        {"phases", CLI_FLAG, &phase, "then each variant's step by phase against its roofline", 0,
         0},
    };
    int nopts = (int)(sizeof opts / sizeof opts[0]);
    pt_gpt_config cfg;
    pt_gpt gpt;
    pt_gpt_desc d;
    pt_adamw_config opt = pt_adamw_default();
    pt_step_desc sd;
    pt_rng rng;
    int *inputs, *targets;
    double *times, flops, med0 = 0.0;
    bench b;
    struct rusage ru;

    cli_passive_wait(argv);
    if ((s = cli_parse(argc, argv, opts, nopts, pos, 0, &npos)) != 0) {
        cli_usage(s == 1 ? stdout : stderr, "usage: bench_step [options]", opts, nopts);
        return s == 1 ? 0 : 2;
    }
    pt_set_threads(threads);
    memset(&b, 0, sizeof b);
    b.config = config, b.batch = batch, b.seq = seq, b.steps = steps, b.json = json;
    b.recompute = recompute; /* (checked: one of the three names, printed as given) */
    if (parse_variants(&b, gemms, precs) != 0) return 2;
    if ((rc = cli_recompute(recompute)) < 0) return 2;
    if (phase && rc != PT_RECOMPUTE_NONE) { /* its replay keeps every activation */
        fprintf(stderr, "error: --phases replays a step without recomputation: use it with "
                        "--recompute none\n");
        return 2;
    }
    if (pt_gpt_config_preset(config, &cfg) != PT_OK) {
        fprintf(stderr, "error: %s\n", pt_last_error());
        return 2;
    }
    if (cfg.block_size < seq) cfg.block_size = seq;
    memset(&d, 0, sizeof d);
    d.config = cfg;
    d.batch = batch;
    d.seq = seq;
    d.precision = b.prec[0];
    d.recompute = rc;
    if (pt_gpt_init(&gpt, &d) != PT_OK) {
        fprintf(stderr, "error: %s\n", pt_last_error());
        return 2;
    }
    inputs = (int *)malloc(sizeof(int) * (size_t)batch * seq);
    targets = (int *)malloc(sizeof(int) * (size_t)batch * seq);
    times = (double *)malloc(sizeof(double) * (size_t)steps * (size_t)b.ng);
    if (!inputs || !targets || !times) return 2;
    measure_peaks(&b, &gpt);
    pt_rng_seed(&rng, 7);
    for (i = 0; i < batch * seq; i++) {
        inputs[i] = (int)(pt_rng_u64(&rng) % (uint64_t)cfg.vocab_size);
        targets[i] = (int)(pt_rng_u64(&rng) % (uint64_t)cfg.vocab_size);
    }
    memset(&sd, 0, sizeof sd);
    sd.inputs = inputs, sd.targets = targets, sd.B = batch, sd.T = seq;
    if (check_variants(&b, &gpt, &sd, &opt, &cfg) != 0) return 1;
    sd.adamw = &opt;
    if (time_steps(&b, &gpt, &sd, times) != 0) return 1;
    remeasure_peaks(&b, &gpt);
    flops = pt_gpt_flops_per_step(&cfg, batch, seq);
    getrusage(RUSAGE_SELF, &ru);
    for (g = 0; g < b.ng; g++) {
        double med = print_variant(&b, &gpt, g, times + (size_t)g * steps, flops, med0, &ru);
        if (g == 0) med0 = med;
    }
    if (phase) { /* after the table: the replays would not change the steps' times */
        double bw = pt_mem_bandwidth_gbs((size_t)1 << 25, 5);
        for (g = 0; g < b.ng; g++)
            if (phases_measure(&b, &gpt, g, &sd, bw) != 0) return 1;
    }
    free(inputs);
    free(targets);
    free(times);
    pt_gpt_free(&gpt);
    return 0;
}
