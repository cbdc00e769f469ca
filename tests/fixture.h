/* fixture.h -- reads a ptrain-fixture-v1 file (../shared/fixtures/README.md):
   its settings, model shape (GPT-2, or LLaMA as its section 7) and batch,
   every value checked. Used by
   tests/fixture_check.c and fuzz/fixture.c. Include after ptrain.h. */
#ifndef PTRAIN_FIXTURE_H
#define PTRAIN_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A fixture's run: the model, the batch (B, T), steps and AdamW settings. */
typedef struct fixture {
    const pt_safetensors *st;
    pt_gpt_config cfg;
    int B, T, steps;
    double lr;
    pt_adamw_config opt;
    const int *inputs, *targets; /* (B, T) */
} fixture;

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

/* An I32 tensor of shape (B, T) into a new array (the caller frees it);
   NULL after an error message. */
static int *read_batch(const pt_safetensors *st, const char *name, int B, int T) {
    const pt_st_tensor *t = pt_st_find(st, name);
    int64_t bt[2];
    int *x = NULL;
    bt[0] = B, bt[1] = T;
    /* allocate only a batch the file holds: the metadata's B and T alone could ask for
       terabytes; otherwise x stays NULL and pt_st_read_i32 refuses before writing */
    if (t && t->ndim == 2 && t->shape[0] == B && t->shape[1] == T &&
        !(x = (int *)malloc((size_t)B * (size_t)T * sizeof(int)))) {
        fprintf(stderr, "error: out of memory\n");
        return NULL;
    }
    if (pt_st_read_i32(st, name, x, 2, bt) != PT_OK) {
        fprintf(stderr, "error: %s\n", pt_last_error());
        free(x);
        return NULL;
    }
    return x;
}

/* The fixture's settings, model shape and batch from st into j (its inputs
   and targets are the caller's to free: fixture_free); 0 after an error
   message. */
static int fixture_read(const pt_safetensors *st, fixture *j) {
    double B, T, steps, b1, b2, eps, wd;
    const char *arch = pt_st_meta_get(st, "arch");
    /* GPT-2 (no arch key): tanh GELU and a tied head; LLaMA (section 7): the
       architecture's keys, which pt_gpt_config_from_st reads */
    int llama = arch && strcmp(arch, "llama") == 0;
    if (arch && !llama) {
        fprintf(stderr, "error: fixture metadata arch='%s' is not supported (expected 'llama' "
                "or none)\n", arch);
        return 0;
    }
    if (!meta_is(st, "format", "ptrain-fixture-v1") || !meta_is(st, "decay", "dim>=2") ||
        (!llama && (!meta_is(st, "gelu", "tanh") || !meta_is(st, "tied_lm_head", "true"))) ||
        (llama && (!meta_is(st, "norm", "rmsnorm") || !meta_is(st, "mlp", "swiglu") ||
                   !meta_is(st, "rope", "rotate_half"))) ||
        !meta_double(st, "B", &B) || !meta_double(st, "T", &T) ||
        !meta_double(st, "steps", &steps) || !meta_double(st, "lr", &j->lr) ||
        !meta_double(st, "beta1", &b1) || !meta_double(st, "beta2", &b2) ||
        !meta_double(st, "eps", &eps) || !meta_double(st, "weight_decay", &wd))
        return 0;
    if (!(B >= 1 && B <= 1 << 16 && T >= 1 && T <= 1 << 20 && steps >= 1 && steps <= 1 << 20)) {
        fprintf(stderr, "error: fixture B=%g T=%g steps=%g out of range\n", B, T, steps);
        return 0;
    }
    if (pt_gpt_config_from_st(st, 0, &j->cfg) != PT_OK) {
        fprintf(stderr, "error: %s\n", pt_last_error());
        return 0;
    }
    j->B = (int)B;
    j->T = (int)T;
    j->steps = (int)steps;
    j->opt.beta1 = (float)b1;
    j->opt.beta2 = (float)b2;
    j->opt.eps = (float)eps;
    j->opt.weight_decay = (float)wd;
    return (j->inputs = read_batch(st, "fixture.inputs", j->B, j->T)) != NULL &&
           (j->targets = read_batch(st, "fixture.targets", j->B, j->T)) != NULL;
}

static void fixture_free(fixture *j) {
    free((void *)j->inputs);
    free((void *)j->targets);
    j->inputs = j->targets = NULL;
}

#endif
