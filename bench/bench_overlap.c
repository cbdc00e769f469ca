/* bench_overlap: does a started all-reduce progress while a rank computes?

     mpirun -n 2 build/bench_overlap_mpi [--mb 16] [--reps 5] [--slices 200]
     bench/overlap.sh          the same across 2 network-namespace hosts at several
                               link rates (tests/hosts.sh), with and without Open MPI's
                               TCP progress thread

   Per repetition, every rank (times are rank 0's, medians over --reps):
     comm     a blocking all-reduce (AVG) of --mb MiB of floats
     compute  sgemm work sized to last about as long as comm (calibrated once)
     none     start the all-reduce, compute, wait: no MPI call while computing
     test     the same with pt_comm_test after each of --slices slices of compute
   "exposed" is a variant's time minus compute: the communication it did not
   hide; the ratio exposed/comm is 1 when nothing overlapped and 0 when all
   did; max(comm, compute) is the best a variant can do. The check first: the
   started all-reduce gives the blocking one's bits. */
#define _POSIX_C_SOURCE 200809L
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef PTRAIN_MPI

#define GEMM 96 /* one compute unit: a 96^3 sgemm (1.8 MFLOP) */

static float g_a[GEMM * GEMM], g_b[GEMM * GEMM], g_c[GEMM * GEMM];

static void compute(long units) {
    long i;
    for (i = 0; i < units; i++) pt_sgemm(0, 0, GEMM, GEMM, GEMM, 1.0f, g_a, GEMM, g_b, GEMM, 0.5f, g_c, GEMM);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void fill(float *x, size_t n, int rank, int rep) {
    size_t i;
    for (i = 0; i < n; i++) x[i] = (float)((i * 2654435761u + (size_t)rank * 97u + (size_t)rep) % 1000u) * 1e-3f - 0.5f;
}

/* Starts the all-reduce of x, computes units in `slices` slices (testing the
   request after each when test != 0), waits; returns the seconds. */
static double overlapped(pt_comm *w, float *x, size_t n, long units, int slices, int test,
                         pt_status *st) {
    pt_comm_req q;
    double t0;
    int s, done = 0;
    pt_comm_barrier(w);
    t0 = pt_time_now();
    *st = pt_comm_all_reduce_start(w, x, n, PT_REDUCE_AVG, &q);
    for (s = 0; s < slices && *st == PT_OK; s++) {
        compute(units / slices + (s < units % slices));
        if (test && !done) *st = pt_comm_test(&q, &done);
    }
    if (*st == PT_OK) *st = pt_comm_wait(&q);
    return pt_time_now() - t0;
}

int main(int argc, char **argv) {
    pt_comm w;
    double mb = 16, tc[64], tp[64], tn[64], tt[64], t0, c, p, none, test;
    int reps = 5, slices = 200, r, i;
    long units;
    size_t n;
    float *x, *y;
    pt_status st = PT_OK;
    float cal;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mb") && i + 1 < argc) mb = atof(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--slices") && i + 1 < argc) slices = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: mpirun -n N %s [--mb MiB] [--reps N] [--slices N]\n", argv[0]);
            return 2;
        }
    }
    if (!(mb > 0 && mb <= 4096) || reps < 1 || reps > 64 || slices < 1) {
        fprintf(stderr, "bench_overlap: --mb in (0, 4096], --reps in [1, 64], --slices >= 1\n");
        return 2;
    }
    if (pt_comm_mpi_init(&w, &argc, &argv) != PT_OK) {
        fprintf(stderr, "%s\n", pt_last_error());
        return 1;
    }
    n = (size_t)(mb * 1048576.0 / sizeof(float));
    x = (float *)malloc(n * sizeof(float));
    y = (float *)malloc(n * sizeof(float));
    if (!x || !y) {
        fprintf(stderr, "bench_overlap: out of memory\n");
        return 1;
    }
    for (i = 0; i < GEMM * GEMM; i++) g_a[i] = g_b[i] = (float)(i % 7) * 0.01f;
    /* the check: a started all-reduce gives the blocking one's bits */
    fill(x, n, w.rank, 0);
    memcpy(y, x, n * sizeof(float));
    if (pt_comm_all_reduce(&w, y, n, PT_REDUCE_AVG) != PT_OK ||
        overlapped(&w, x, n, 1, 1, 1, &st) < 0 || st != PT_OK || memcmp(x, y, n * sizeof(float))) {
        fprintf(stderr, "rank %d: the started all-reduce differs from the blocking one (%s)\n",
                w.rank, st != PT_OK ? pt_last_error() : "bits");
        return 1;
    }
    /* calibrate: compute units lasting about one blocking all-reduce */
    for (r = 0; r < 3; r++) {
        pt_comm_barrier(&w);
        t0 = pt_time_now();
        pt_comm_all_reduce(&w, y, n, PT_REDUCE_AVG);
        tc[r] = pt_time_now() - t0;
        t0 = pt_time_now();
        compute(200);
        tp[r] = (pt_time_now() - t0) / 200;
    }
    c = median(tc, 3), p = median(tp, 3);
    cal = (float)(c / p);
    pt_comm_broadcast(&w, &cal, 1, 0);
    units = (long)cal > 1 ? (long)cal : 1;
    for (r = 0; r < reps; r++) {
        fill(x, n, w.rank, r);
        pt_comm_barrier(&w);
        t0 = pt_time_now();
        pt_comm_all_reduce(&w, x, n, PT_REDUCE_AVG);
        tc[r] = pt_time_now() - t0;
        pt_comm_barrier(&w);
        t0 = pt_time_now();
        compute(units);
        tp[r] = pt_time_now() - t0;
        tn[r] = overlapped(&w, x, n, units, 1, 0, &st);
        tt[r] = st == PT_OK ? overlapped(&w, x, n, units, slices, 1, &st) : 0;
        if (st != PT_OK) {
            fprintf(stderr, "rank %d: %s\n", w.rank, pt_last_error());
            return 1;
        }
    }
    c = median(tc, reps), p = median(tp, reps), none = median(tn, reps), test = median(tt, reps);
    if (w.rank == 0) {
        printf("all-reduce of %.1f MiB over %d ranks, compute %ld x sgemm %d^3 in %d slices, "
               "median of %d\n",
               mb, w.size, units, GEMM, slices, reps);
        printf("  comm %.1f ms  compute %.1f ms  limit max(comm, compute) %.1f ms\n", c * 1e3,
               p * 1e3, (c > p ? c : p) * 1e3);
        printf("  none: %7.1f ms  exposed %6.1f ms = %.2f of comm\n", none * 1e3, (none - p) * 1e3,
               (none - p) / c);
        printf("  test: %7.1f ms  exposed %6.1f ms = %.2f of comm\n", test * 1e3, (test - p) * 1e3,
               (test - p) / c);
    }
    free(x);
    free(y);
    pt_comm_free(&w);
    pt_comm_mpi_finalize();
    return 0;
}

#else

int main(void) {
    fprintf(stderr, "bench_overlap measures MPI progress: build it with -DPTRAIN_MPI (make "
                    "build/bench_overlap_mpi)\n");
    return 2;
}

#endif
