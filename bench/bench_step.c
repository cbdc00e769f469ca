/* bench_step: time end-to-end training steps (pt_gpt_step: forward, backward, AdamW).

     build/bench_step --config gpt2-124m|small|tiny|mini|... --batch B --seq T
                      --steps N --threads K [--json]

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
   instruction peak of its precision.
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
    const char *config;
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
               "\"precision\": \"%s\", \"instr_peak_gflops\": %.1f, \"mfu_instr\": %.4f}\n",
               b->config, batch, seq, pt_get_threads(), gpt->num_params, b->steps, med * 1e3,
               batch * seq / med, flops / 1e9, b->peak[g], flops / med / (b->peak[g] * 1e9),
               (long long)ru->ru_maxrss * 1024, b->loss0[g], b->loss1[g], gname, pname, ip,
               ip > 0 ? flops / med / (ip * 1e9) : 0.0);
    } else {
        double mg = 100.0 * flops / med / (b->peak[g] * 1e9);
        char of_gemm[64];
        if (mg <= 100.0) snprintf(of_gemm, sizeof of_gemm, "%5.1f%%", mg);
        else snprintf(of_gemm, sizeof of_gemm, "n/a (probe slow)");
        printf("%-10s B=%-3d T=%-4d threads %d %s gemm %-17s: %9.1f ms/step %9.0f tok/s  MFU "
               "%5.1f%% of the %s instruction peak %.0f GFLOP/s, %s of its GEMM's %.0f at "
               "1024^3  peak RSS %.0f MiB",
               b->config, batch, seq, pt_get_threads(), pname, gname, med * 1e3, batch * seq / med,
               ip > 0 ? 100.0 * flops / med / (ip * 1e9) : 0.0, pname, ip, of_gemm, b->peak[g],
               ru->ru_maxrss / 1024.0);
        if (b->ng > 1) printf("  %.2fx the first", med0 / med);
        printf("\n");
    }
    return med;
}

int main(int argc, char **argv) {
    const char *config = "small", *gemms = "", *precs = "fp32";
    int batch = 8, seq = 128, steps = 5, threads = 0, json = 0, npos, s, i, g;
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
    if (parse_variants(&b, gemms, precs) != 0) return 2;
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
    free(inputs);
    free(targets);
    free(times);
    pt_gpt_free(&gpt);
    return 0;
}
