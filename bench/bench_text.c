/* bench_text: encode throughput of ptrain's tokenizer on a text file, on 1
   thread and on all cores, after checking that both give the same ids.

     build/bench_text --tokenizer build/tok/gpt2 FILE [--repeat 3]

   Prints MB/s (median of --repeat runs) for pt_tokenizer_encode (1 thread)
   and pt_tokenizer_encode_parallel (all cores), and the ids to --ids FILE
   for the references to check against (bench/text.sh compares them with
   tiktoken's before timing tiktoken, js-tiktoken and gpt-3-encoder). */
#define _POSIX_C_SOURCE 200809L /* setenv, execv (cli_passive_wait) */
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"
#include "../common/cli.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    const char *tok_path = NULL, *ids_path = NULL, *pos[1] = {NULL};
    int repeat = 3, npos, s, r, rc = 1;
    cli_opt opts[] = {
        {"tokenizer", CLI_STR, &tok_path, "tokenizer.json or GPT-2 directory", 0, 0},
        {"repeat", CLI_INT, &repeat, "timed runs (the median is reported)", 1, 100},
        {"ids", CLI_STR, &ids_path, "write the ids (space-separated) here", 0, 0},
    };
    int nopts = (int)(sizeof opts / sizeof opts[0]);
    pt_tokenizer tk;
    unsigned char *text = NULL;
    int *a = NULL, *b = NULL;
    size_t n = 0, na = 0, nb = 0, i;
    double t1[100], tp[100];
    FILE *f;
    memset(&tk, 0, sizeof tk);
    cli_passive_wait(argv);
    if ((s = cli_parse(argc, argv, opts, nopts, pos, 1, &npos)) != 0 || npos != 1 || !tok_path) {
        cli_usage(s == 1 ? stdout : stderr, "usage: bench_text --tokenizer PATH FILE", opts, nopts);
        return s == 1 ? 0 : 1;
    }
    if (pt_tokenizer_load(&tk, tok_path) != PT_OK ||
        pt_file_read(pos[0], &text, &n, NULL) != PT_OK) {
        fprintf(stderr, "error: %s\n", pt_last_error());
        return 1;
    }
    a = (int *)malloc(sizeof(int) * (n + 1));
    b = (int *)malloc(sizeof(int) * (n + 1));
    if (!a || !b) goto done;
    /* check first: all cores give the one-thread ids */
    if (pt_tokenizer_encode(&tk, text, n, 0, a, &na) != PT_OK ||
        pt_tokenizer_encode_parallel(&tk, text, n, 0, 0, b, &nb, NULL, NULL) != PT_OK) {
        fprintf(stderr, "error: %s\n", pt_last_error());
        goto done;
    }
    if (na != nb || memcmp(a, b, na * sizeof(int)) != 0) {
        fprintf(stderr, "error: the parallel encoder's ids differ from one thread's\n");
        goto done;
    }
    if (ids_path) {
        if (!(f = fopen(ids_path, "w"))) goto done;
        for (i = 0; i < na; i++) fprintf(f, i ? " %d" : "%d", a[i]);
        fprintf(f, "\n");
        fclose(f);
    }
    for (r = 0; r < repeat; r++) {
        double t0 = pt_time_now();
        pt_tokenizer_encode(&tk, text, n, 0, a, &na);
        t1[r] = pt_time_now() - t0;
        t0 = pt_time_now();
        pt_tokenizer_encode_parallel(&tk, text, n, 0, 0, b, &nb, NULL, NULL);
        tp[r] = pt_time_now() - t0;
    }
    qsort(t1, (size_t)repeat, sizeof(double), cmp_double);
    qsort(tp, (size_t)repeat, sizeof(double), cmp_double);
    printf("ptrain %-28s %8.2f MB %9zu tokens  1 thread %7.1f MB/s  %d cores %7.1f MB/s\n", pos[0],
           (double)n / 1e6, na, (double)n / 1e6 / t1[repeat / 2],
#ifdef _OPENMP
           omp_get_num_procs(),
#else
           1,
#endif
           (double)n / 1e6 / tp[repeat / 2]);
    rc = 0;
done:
    free(text);
    free(a);
    free(b);
    pt_tokenizer_free(&tk);
    return rc;
}
