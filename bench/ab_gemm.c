/* bench/ab_gemm.sh's driver: two trees' GEMMs (old_gemm, new_gemm, from
   bench/ab_gemm_side.c) on a model's layer GEMMs at B*T rows, in the layouts
   its kernels call them (GPT-2's Conv1D W[IN,OUT]: forward NN, d(input) NT,
   d(weight) TN; LLaMA's nn.Linear W[OUT,IN]: NT, NN, TN), the backward ones
   accumulating (beta 1) as the step does, fp32 and bf16. Each product runs
   REPS times a side, old and new alternated (old first on even rounds, new
   on odd), on NB sets of operands used in turn, so each call finds its
   operands out of the cache as the step does. Prints each side's median
   GFLOP/s (after a call each untimed) by the wall clock and by CPU time (the process's, all threads:
   run with OMP_WAIT_POLICY=passive so that waiting threads sleep and CPU
   time counts the work alone, the steadier ratio on a shared machine), the
   ratios new/old of the medians, and whether both give the same bits (one
   more call each on the same operands and C).
   usage: ab_gemm REPS CONFIG [FILTER]   CONFIG: gpt2-124m or llama-124m, or
   gpt2-head: the fused head's three GEMMs on one block of 1024 rows
   (PT__HEAD_ROWS) at V 50257, C 768, on 3 operand sets (each 200 MB). */
#define _POSIX_C_SOURCE 200112L /* clock_gettime */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void old_gemm(int bf16, int ta, int tb, int M, int N, int K, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc);
void new_gemm(int bf16, int ta, int tb, int M, int N, int K, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc);

#define NB 6      /* operand sets */
#define MAXREP 99

typedef struct shape { char name[32]; int ta, tb, M, N, K, acc; } shape; /* acc: beta 1 */

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmpd);
    return v[n / 2];
}

/* the 12 layer GEMMs of a model with width C, qkv width Q3, MLP up width Fi
   (SwiGLU: gate and up), down width F, on R rows; wt: nn.Linear layouts */
static int layer_shapes(shape *s, int R, int C, int Q3, int Fi, int F, int wt) {
    const int io[4][2] = {{C, Q3}, {C, C}, {C, Fi}, {F, C}};
    const char *nm[4] = {"qkv", "attn proj", "mlp up", "mlp down"};
    int k, l, n = 0;
    for (k = 0; k < 4; k++)
        for (l = 0; l < 3; l++, n++) {
            int IN = io[k][0], OUT = io[k][1];
            s[n].acc = l > 0; /* the backward products add into the gradients */
            snprintf(s[n].name, sizeof s[n].name, "%s %s", nm[k],
                     l == 0 ? "fwd" : l == 1 ? "dinp" : "dW");
            if (l == 0) s[n].ta = 0, s[n].tb = wt, s[n].M = R, s[n].N = OUT, s[n].K = IN;
            else if (l == 1) s[n].ta = 0, s[n].tb = !wt, s[n].M = R, s[n].N = IN, s[n].K = OUT;
            else s[n].ta = 1, s[n].tb = 0, s[n].M = wt ? OUT : IN, s[n].N = wt ? IN : OUT,
                 s[n].K = R;
        }
    return n;
}

/* the fused head's GEMMs on a block of R rows (pt_head_xent_fused):
   logits = x wte^T, dx += dlogits wte, dwte += dlogits^T x */
static int head_shapes(shape *s, int R, int C, int V) {
    const shape h[3] = {{"head logits", 0, 1, 0, 0, 0, 0}, {"head dx", 0, 0, 0, 0, 0, 1},
                        {"head dwte", 1, 0, 0, 0, 0, 1}};
    int k;
    for (k = 0; k < 3; k++) s[k] = h[k];
    s[0].M = R, s[0].N = V, s[0].K = C;
    s[1].M = R, s[1].N = C, s[1].K = V;
    s[2].M = V, s[2].N = C, s[2].K = R;
    return 3;
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 9, n, k, bf, b, r, nb = NB;
    const char *config = argc > 2 ? argv[2] : "gpt2-124m", *only = argc > 3 ? argv[3] : NULL;
    shape s[12];
    size_t big = 0, i;
    float *A[NB], *B[NB], *C[NB];
    if (reps < 1 || reps > MAXREP) reps = 9;
    if (strcmp(config, "gpt2-124m") == 0) n = layer_shapes(s, 2048, 768, 2304, 3072, 3072, 0);
    else if (strcmp(config, "llama-124m") == 0) /* 4 kv heads of 64, SwiGLU hidden 2048 */
        n = layer_shapes(s, 2048, 768, 1280, 4096, 2048, 1);
    else if (strcmp(config, "gpt2-head") == 0) n = head_shapes(s, 1024, 768, 50257), nb = 3;
    else {
        fprintf(stderr, "usage: ab_gemm REPS gpt2-124m|llama-124m|gpt2-head [FILTER]\n");
        return 2;
    }
    for (k = 0; k < n; k++) {
        size_t m = (size_t)s[k].M * s[k].K, q = (size_t)s[k].K * s[k].N, c = (size_t)s[k].M * s[k].N;
        big = m > big ? m : big, big = q > big ? q : big, big = c > big ? c : big;
    }
    big = (big + 15) / 16 * 16; /* aligned_alloc: a multiple of 64 bytes */
    for (b = 0; b < nb; b++) {
        A[b] = (float *)aligned_alloc(64, big * 4), B[b] = (float *)aligned_alloc(64, big * 4);
        C[b] = (float *)aligned_alloc(64, big * 4);
        if (!A[b] || !B[b] || !C[b]) return 2;
        for (i = 0; i < big; i++) {
            A[b][i] = (float)((i * 7919 + (size_t)b) % 1000) / 1000.0f - 0.5f;
            B[b][i] = (float)((i * 104729 + (size_t)b) % 997) / 997.0f - 0.5f;
            C[b][i] = 0.0f;
        }
    }
    printf("%s layer GEMMs, %d calls a side alternated, medians; GFLOP/s by the wall clock and "
           "by CPU time; new/old time ratios (< 1: new faster)\n", config, reps);
    for (bf = 0; bf < 2; bf++) {
        double sum[2][2] = {{0, 0}, {0, 0}};
        for (k = 0; k < n; k++) {
            const shape *g = &s[k];
            int lda = g->ta ? g->M : g->K, ldb = g->tb ? g->K : g->N, same;
            float beta = g->acc ? 1.0f : 0.0f;
            double wall[2][MAXREP], cpu[2][MAXREP], fl = 2.0 * g->M * g->N * (double)g->K, mw[2], mc[2];
            if (only && !strstr(g->name, only)) continue;
            old_gemm(bf, g->ta, g->tb, g->M, g->N, g->K, A[0], lda, B[0], ldb, beta, C[0], g->N);
            new_gemm(bf, g->ta, g->tb, g->M, g->N, g->K, A[1], lda, B[1], ldb, beta, C[1], g->N);
            for (r = 0; r < reps; r++)
                for (b = 0; b < 2; b++) {
                    int side = r & 1 ? 1 - b : b, set = (2 * r + b) % nb;
                    double w0 = omp_get_wtime(), c0 = cpu_now();
                    (side ? new_gemm : old_gemm)(bf, g->ta, g->tb, g->M, g->N, g->K, A[set], lda,
                                                 B[set], ldb, beta, C[set], g->N);
                    cpu[side][r] = cpu_now() - c0, wall[side][r] = omp_get_wtime() - w0;
                }
            for (i = 0; i < (size_t)g->M * g->N; i++) C[0][i] = C[1][i] = 0.25f;
            old_gemm(bf, g->ta, g->tb, g->M, g->N, g->K, A[2], lda, B[2], ldb, beta, C[0], g->N);
            new_gemm(bf, g->ta, g->tb, g->M, g->N, g->K, A[2], lda, B[2], ldb, beta, C[1], g->N);
            same = memcmp(C[0], C[1], (size_t)g->M * g->N * 4) == 0;
            for (b = 0; b < 2; b++) {
                mw[b] = median(wall[b], reps), mc[b] = median(cpu[b], reps);
                sum[0][b] += mw[b], sum[1][b] += mc[b];
            }
            printf("  %s %-14s %c%c %5d %5d %5d | wall %6.1f %6.1f  %.3f | cpu %6.1f %6.1f  %.3f | %s\n",
                   bf ? "bf16" : "fp32", g->name, g->ta ? 'T' : 'N', g->tb ? 'T' : 'N', g->M, g->N,
                   g->K, fl / mw[0] / 1e9, fl / mw[1] / 1e9, mw[1] / mw[0], fl / mc[0] / 1e9,
                   fl / mc[1] / 1e9, mc[1] / mc[0], same ? "same bits" : "DIFFERENT BITS");
        }
        if (sum[0][0] > 0)
            printf("%s sum of the medians, new/old: wall %.3f, cpu %.3f\n", bf ? "bf16" : "fp32",
                   sum[0][1] / sum[0][0], sum[1][1] / sum[1][0]);
    }
    return 0;
}
