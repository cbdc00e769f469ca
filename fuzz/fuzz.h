/* fuzz.h -- what the harnesses in fuzz/ share. Each harness is one small
   file: it includes ptrain.h (with the implementation), then this header,
   and defines LLVMFuzzerTestOneInput (the libFuzzer entry) for one parser
   of outside input. A new harness is one more such file and its name in the
   Makefile's FUZZERS.

   Built with clang -fsanitize=fuzzer -DPT_FUZZ_LIBFUZZER, libFuzzer brings
   main. Built without it (any compiler, e.g. gcc with ASan + UBSan), the main
   below runs every input named on the command line -- files, or directories
   of files -- or stdin when none is named: AFL++ runs it with @@ or on stdin,
   and `make test` replays the seed corpus and fuzz/crashes/ through it. */
#ifndef PTRAIN_FUZZ_H
#define PTRAIN_FUZZ_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A per-process file holding data, for loaders that take a path; suffix
   picks a format by name (".bin"). Returns the path, NULL if it cannot be
   written. */
static inline const char *fuzz_file(const uint8_t *data, size_t size, const char *suffix) {
    static char path[256];
    const char *dir = getenv("TMPDIR");
    FILE *f;
    int ok;
    snprintf(path, sizeof path, "%s/ptrain-fuzz-%ld%s", dir && *dir ? dir : "/tmp",
             (long)getpid(), suffix);
    if (!(f = fopen(path, "wb"))) return NULL;
    ok = size == 0 || fwrite(data, 1, size, f) == size;
    ok = fclose(f) == 0 && ok;
    return ok ? path : NULL;
}

/* An argument vector from the input: arguments separated by NUL bytes,
   after argv[0] = prog, at most max of them; argv[argc] = NULL. Returns
   argc; *buf (free it) holds the strings. */
static inline int fuzz_argv(const uint8_t *data, size_t size, const char *prog, char **argv,
                            int max, char **buf) {
    int argc = 1;
    size_t i, start = 0;
    *buf = (char *)malloc(size + 1);
    argv[0] = (char *)prog;
    argv[1] = NULL;
    if (!*buf) return 1;
    memcpy(*buf, data, size);
    (*buf)[size] = 0;
    for (i = 0; i <= size && argc < max; i++)
        if ((*buf)[i] == 0) {
            if (i > start || i < size) argv[argc++] = *buf + start;
            start = i + 1;
        }
    argv[argc] = NULL;
    return argc;
}

#ifndef PT_FUZZ_LIBFUZZER
#include <dirent.h>
#include <sys/stat.h>

/* Runs the harness on one file's bytes; returns 1 if the file was read. */
static int fuzz_run_file(FILE *f) {
    size_t n = 0, cap = 1 << 16, k;
    uint8_t *buf = (uint8_t *)malloc(cap), *bigger;
    if (!buf) return 0;
    while ((k = fread(buf + n, 1, cap - n, f)) > 0) {
        n += k;
        if (n == cap) {
            if (!(bigger = (uint8_t *)realloc(buf, cap *= 2))) {
                free(buf);
                return 0;
            }
            buf = bigger;
        }
    }
    LLVMFuzzerTestOneInput(buf, n);
    free(buf);
    return 1;
}

static int fuzz_run_path(const char *path) {
    struct stat sb;
    FILE *f;
    int ran;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        DIR *d = opendir(path);
        struct dirent *e;
        char sub[4096];
        ran = 0;
        if (!d) return 0;
        while ((e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.') continue; /* ".", "..", hidden files */
            snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
            ran += fuzz_run_path(sub);
        }
        closedir(d);
        return ran;
    }
    if (!(f = fopen(path, "rb"))) {
        fprintf(stderr, "fuzz: cannot open '%s'\n", path);
        return -1000000; /* makes the total negative: a missing input is an error */
    }
    ran = fuzz_run_file(f);
    fclose(f);
    return ran;
}

int main(int argc, char **argv) {
    int i, ran = 0;
    if (argc < 2) ran = fuzz_run_file(stdin);
    for (i = 1; i < argc; i++) ran += fuzz_run_path(argv[i]);
    printf("fuzz: %d inputs ran without a finding\n", ran < 0 ? 0 : ran);
    return ran < 0;
}
#endif

#endif
