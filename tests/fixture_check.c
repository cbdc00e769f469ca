/* fixture_check: runs a ptrain-fixture-v1 file's protocol (the fixtures'
   README, section 3.4) and compares every quantity with its tolerance.

     build/fixture_check FILE [--threads N] [--verbose]

   Prints one line per quantity (worst error, tolerance, PASS/FAIL) and exits
   0 only if all pass; 1 on a mismatch, 2 if the file cannot be used. */
#define _POSIX_C_SOURCE 200809L /* setenv, execv (cli_passive_wait) */
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"
#include "../examples/cli.h"

#include <math.h>

typedef struct check {
    int failed, total, verbose;
} check;

/* One reported quantity: worst |a-r| and the tolerance at that element;
   ratio = max over elements of |a-r| / tol (NaN counts as failure). */
static void report(check *c, const char *what, double worst_err, double tol_at, double ratio,
                   int force_print) {
    int ok = ratio <= 1.0; /* false for NaN */
    c->total++;
    if (!ok) c->failed++;
    if (!ok || force_print || c->verbose)
        printf("  %-40s max_err %.3e  tol %.3e  %s\n", what, worst_err, tol_at, ok ? "PASS" : "FAIL");
}

/* |a-r| <= atol + rtol*|r| elementwise */
static void compare_elem(check *c, const char *what, const float *a, const float *r, size_t n,
                         double atol, double rtol, int print) {
    double worst = 0.0, tol_at = atol, ratio = 0.0;
    size_t i;
    for (i = 0; i < n; i++) {
        double err = fabs((double)a[i] - (double)r[i]), tol = atol + rtol * fabs((double)r[i]);
        double q = err / tol;
        if (!(q <= ratio)) { /* also catches NaN */
            ratio = q != q ? INFINITY : q;
            worst = err != err ? INFINITY : err;
            tol_at = tol;
        }
    }
    report(c, what, worst, tol_at, ratio, print);
}

/* per tensor: max|a-r| <= 2e-5 * max|r| (if max|r| == 0: |a| <= 1e-12) */
static void compare_grad(check *c, const char *what, const float *a, const float *r, size_t n) {
    double maxr = 0.0, worst = 0.0, tol;
    size_t i;
    for (i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)r[i]);
        if (fabs((double)r[i]) > maxr) maxr = fabs((double)r[i]);
        if (!(e <= worst)) worst = e != e ? INFINITY : e;
    }
    tol = maxr > 0.0 ? 2e-5 * maxr : 1e-12;
    report(c, what, worst, tol, worst / tol, 0);
}

static int meta_double(const pt_safetensors *st, const char *key, double *out) {
    const char *v = pt_st_meta_get(st, key);
    char *end;
    if (!v) {
        fprintf(stderr, "error: fixture metadata lacks '%s'\n", key);
        return 0;
    }
    *out = strtod(v, &end);
    if (*v == 0 || *end || *out != *out) {
        fprintf(stderr, "error: fixture metadata %s='%s' is not a number\n", key, v);
        return 0;
    }
    return 1;
}

static int meta_is(const pt_safetensors *st, const char *key, const char *want) {
    const char *v = pt_st_meta_get(st, key);
    if (v && strcmp(v, want) == 0) return 1;
    fprintf(stderr, "error: fixture metadata %s='%s' is not supported (expected '%s')\n", key,
            v ? v : "(missing)", want);
    return 0;
}

int main(int argc, char **argv) {
    int threads = 0, verbose = 0, npos = 0, s, i;
    const char *pos[1] = {NULL};
    cli_opt opts[] = {
        {"threads", CLI_INT, &threads, "OpenMP/BLAS threads (0: all cores)", 0, 1024},
        {"verbose", CLI_FLAG, &verbose, "print every tensor's line", 0, 0},
    };
    int nopts = (int)(sizeof opts / sizeof opts[0]);
    const char *usage = "usage: fixture_check FILE [options]\n"
                        "Runs a ptrain-fixture-v1 file's protocol and checks every quantity.";
    pt_safetensors st;
    pt_gpt_config cfg;
    pt_gpt gpt;
    pt_gpt_desc desc;
    pt_adamw_config opt;
    double B, T, steps, lr, b1, b2, eps, wd;
    int *inputs = NULL, *targets = NULL, rc = 2;
    float *ref = NULL, *losses = NULL;
    char label[128];
    check c = {0, 0, 0};

    cli_passive_wait(argv);
    if ((s = cli_parse(argc, argv, opts, nopts, pos, 1, &npos)) != 0 || npos != 1) {
        cli_usage(s == 1 ? stdout : stderr, usage, opts, nopts);
        return s == 1 ? 0 : 2;
    }
    c.verbose = verbose;
    pt_set_threads(threads);
    st.alloc_ctx = NULL;
    if (pt_st_load(&st, pos[0]) != PT_OK) {
        fprintf(stderr, "error: %s\n", pt_last_error());
        return 2;
    }
    memset(&gpt, 0, sizeof gpt);
    if (!meta_is(&st, "format", "ptrain-fixture-v1") || !meta_is(&st, "decay", "dim>=2") ||
        !meta_is(&st, "gelu", "tanh") || !meta_is(&st, "tied_lm_head", "true") ||
        !meta_double(&st, "B", &B) || !meta_double(&st, "T", &T) ||
        !meta_double(&st, "steps", &steps) || !meta_double(&st, "lr", &lr) ||
        !meta_double(&st, "beta1", &b1) || !meta_double(&st, "beta2", &b2) ||
        !meta_double(&st, "eps", &eps) || !meta_double(&st, "weight_decay", &wd))
        goto out;
    if (!(B >= 1 && B <= 1 << 16 && T >= 1 && T <= 1 << 20 && steps >= 1 && steps <= 1 << 20)) {
        fprintf(stderr, "error: fixture B=%g T=%g steps=%g out of range\n", B, T, steps);
        goto out;
    }
    if (pt_gpt_config_from_st(&st, 0, &cfg) != PT_OK) {
        fprintf(stderr, "error: %s\n", pt_last_error());
        goto out;
    }
    memset(&desc, 0, sizeof desc);
    desc.config = cfg;
    desc.batch = (int)B;
    desc.seq = (int)T;
    if (pt_gpt_init(&gpt, &desc) != PT_OK || pt_gpt_load_weights_st(&gpt, &st) != PT_OK) {
        fprintf(stderr, "error: %s\n", pt_last_error());
        goto out;
    }
    {
        size_t N = (size_t)B * (size_t)T, V = (size_t)cfg.vocab_size;
        int64_t bt[2], one[1], ns[1];
        bt[0] = (int64_t)B;
        bt[1] = (int64_t)T;
        one[0] = 1;
        ns[0] = (int64_t)steps;
        inputs = (int *)malloc(N * sizeof(int));
        targets = (int *)malloc(N * sizeof(int));
        ref = (float *)malloc((N * V > gpt.num_params ? N * V : gpt.num_params) * sizeof(float));
        losses = (float *)malloc((size_t)steps * sizeof(float));
        if (!inputs || !targets || !ref || !losses) {
            fprintf(stderr, "error: out of memory\n");
            goto out;
        }
        if (pt_st_read_i32(&st, "fixture.inputs", inputs, 2, bt) != PT_OK ||
            pt_st_read_i32(&st, "fixture.targets", targets, 2, bt) != PT_OK) {
            fprintf(stderr, "error: %s\n", pt_last_error());
            goto out;
        }
        printf("%s: V=%d C=%d n_head=%d n_layer=%d block=%d B=%d T=%d steps=%d lr=%g wd=%g\n",
               pos[0], cfg.vocab_size, cfg.n_embd, cfg.n_head, cfg.n_layer, cfg.block_size, (int)B,
               (int)T, (int)steps, lr, wd);
        opt.beta1 = (float)b1;
        opt.beta2 = (float)b2;
        opt.eps = (float)eps;
        opt.weight_decay = (float)wd;
        for (s = 0; s < (int)steps; s++) {
            if (pt_gpt_forward(&gpt, inputs, targets, (int)B, (int)T) != PT_OK) {
                fprintf(stderr, "error: %s\n", pt_last_error());
                goto out;
            }
            losses[s] = gpt.loss;
            if (s == 0) {
                int64_t lshape[3];
                float loss_ref;
                lshape[0] = (int64_t)B;
                lshape[1] = (int64_t)T;
                lshape[2] = cfg.vocab_size;
                if (pt_st_read_f32(&st, "fixture.logits", ref, 3, lshape) != PT_OK ||
                    pt_st_read_f32(&st, "fixture.loss", &loss_ref, 1, one) != PT_OK) {
                    fprintf(stderr, "error: %s\n", pt_last_error());
                    goto out;
                }
                compare_elem(&c, "logits", gpt.logits, ref, N * V, 5e-6, 1e-5, 1);
                compare_elem(&c, "loss", &gpt.loss, &loss_ref, 1, 1e-5, 5e-6, 1);
            }
            pt_gpt_backward(&gpt);
            if (s == 0) {
                int fails_before = c.failed;
                for (i = 0; i < gpt.num_tensors; i++) {
                    const pt_param *p = &gpt.table[i];
                    snprintf(label, sizeof label, "fixture.grad.%s", p->name);
                    if (pt_st_read_f32(&st, label, ref, p->ndim, p->shape) != PT_OK) {
                        fprintf(stderr, "error: %s\n", pt_last_error());
                        goto out;
                    }
                    snprintf(label, sizeof label, "grad %s", p->name);
                    compare_grad(&c, label, gpt.grads + p->offset, ref, p->numel);
                }
                printf("  %-40s %d tensors  %s\n", "grads (per tensor, 2e-5 * max|ref|)",
                       gpt.num_tensors, c.failed == fails_before ? "PASS" : "FAIL");
            }
            pt_gpt_adamw_step(&gpt, &opt, (float)lr);
        }
        if (pt_st_read_f32(&st, "fixture.losses", ref, 1, ns) != PT_OK) {
            fprintf(stderr, "error: %s\n", pt_last_error());
            goto out;
        }
        compare_elem(&c, "losses (every step)", losses, ref, (size_t)steps, 1e-5, 5e-6, 1);
        {
            double worst = 0.0;
            const char *worst_name = gpt.table[0].name;
            int fails_before = c.failed;
            for (i = 0; i < gpt.num_tensors; i++) {
                const pt_param *p = &gpt.table[i];
                size_t k;
                snprintf(label, sizeof label, "fixture.final.%s", p->name);
                if (pt_st_read_f32(&st, label, ref, p->ndim, p->shape) != PT_OK) {
                    fprintf(stderr, "error: %s\n", pt_last_error());
                    goto out;
                }
                for (k = 0; k < p->numel; k++) {
                    double e = fabs((double)gpt.params[p->offset + k] - (double)ref[k]);
                    if (!(e <= worst)) {
                        worst = e != e ? INFINITY : e;
                        worst_name = p->name;
                    }
                }
                snprintf(label, sizeof label, "final %s", p->name);
                compare_elem(&c, label, gpt.params + p->offset, ref, p->numel, 2.5e-4, 0.0, 0);
            }
            printf("  %-40s max_err %.3e  tol %.3e  %s (worst: %s)\n", "final params", worst, 2.5e-4,
                   c.failed == fails_before ? "PASS" : "FAIL", worst_name);
        }
    }
    printf("%s: %d of %d checks passed: %s\n", pos[0], c.total - c.failed, c.total,
           c.failed ? "FAIL" : "PASS");
    rc = c.failed ? 1 : 0;
out:
    free(inputs);
    free(targets);
    free(ref);
    free(losses);
    pt_gpt_free(&gpt);
    pt_st_free(&st);
    return rc;
}
