/* bpe_train.c -- learn a byte-level BPE vocabulary from text files.

   gcc -std=c11 -O2 -Wall -Wextra -Wpedantic -fopenmp examples/bpe_train.c -o build/bpe_train -DPTRAIN_NO_BLAS -lm

     build/bpe_train --vocab-size 16384 --output tok.json FILE...
     build/tokenize --tokenizer tok.json --output FILE.bin FILE

   Counts the pieces of GPT-2's pre-tokenizer (--pattern cl100k: cl100k's) on
   all cores, merges the most frequent pair until the vocabulary is full, and
   writes a Hugging Face tokenizer.json (bytes, merges, <|endoftext|> last).
   --check FILE prints the tokens per byte of FILE (held-out text) beside
   those of --compare TOKENIZER (e.g. GPT-2's). */
#define _POSIX_C_SOURCE 200809L /* setenv, execv (cli_passive_wait) */
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"
#include "../common/cli.h"

static double g_t0;

static void progress(int merges, int total, void *ctx) {
    (void)ctx;
    fprintf(stderr, "\rbpe_train: %d / %d merges, %.1f s", merges, total, pt_time_now() - g_t0);
    if (merges == total) fputc('\n', stderr);
}

/* The bytes of path appended to buf (grown as needed), then a newline; NULL
   (buf freed) after a message: a file that cannot be read, or is empty. */
static unsigned char *append_file(const char *path, unsigned char *buf, size_t *n, size_t *cap) {
    FILE *f = fopen(path, "rb");
    size_t got, start = 0;
    if (!f) {
        fprintf(stderr, "error: cannot open '%s': %s\n", path, strerror(errno));
        free(buf);
        return NULL;
    }
    do {
        if (*n + 65536 > *cap) {
            unsigned char *nb = (unsigned char *)realloc(buf, *cap = 2 * *cap + 65536);
            if (!nb) {
                fprintf(stderr, "error: out of memory reading '%s'\n", path);
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nb;
        }
        got = fread(buf + *n, 1, *cap - *n, f);
        *n += got;
        start += got;
    } while (got > 0);
    if (ferror(f) || start == 0) { /* a directory opens, and fails to read */
        if (start == 0 && !ferror(f)) fprintf(stderr, "error: '%s' is empty: no text\n", path);
        else fprintf(stderr, "error: cannot read '%s': %s\n", path, strerror(errno));
        free(buf);
        fclose(f);
        return NULL;
    }
    fclose(f);
    buf[(*n)++] = '\n'; /* files apart: no piece spans two */
    return buf;
}

/* tokens per byte of text under tk */
static double per_byte(const pt_tokenizer *tk, const unsigned char *text, size_t n) {
    int *ids = (int *)malloc(sizeof(int) * (n + 1));
    size_t k = 0;
    if (!ids || pt_tokenizer_encode_parallel(tk, text, n, 0, 0, ids, &k, NULL, NULL) != PT_OK) k = 0;
    free(ids);
    return n ? (double)k / (double)n : 0.0;
}

int main(int argc, char **argv) {
    const char *out = NULL, *pattern = "gpt2", *check = NULL, *compare = NULL, *pos[256];
    int vocab = 4096, threads = 0, min_freq = 2, npos, s, i, rc = 1;
    cli_opt opts[] = {
        {"vocab-size", CLI_INT, &vocab, "tokens: 256 bytes + merges + <|endoftext|>", 257, 1 << 24},
        {"output", CLI_STR, &out, "the tokenizer.json to write", 0, 0},
        {"pattern", CLI_STR, &pattern, "pre-tokenizer: gpt2 or cl100k", 0, 0},
        {"min-frequency", CLI_INT, &min_freq, "stop when the best pair is rarer", 1, 1 << 30},
        {"threads", CLI_INT, &threads, "threads (0: all cores)", 0, 1024},
        {"check", CLI_STR, &check, "held-out text: print tokens per byte", 0, 0},
        {"compare", CLI_STR, &compare, "another tokenizer for --check (tokenizer.json or GPT-2 dir)", 0, 0},
    };
    int nopts = (int)(sizeof opts / sizeof opts[0]);
    const char *usage = "usage: bpe_train --output TOKENIZER.json [options] FILE...\n"
                        "Learns a byte-level BPE vocabulary from text files.";
    pt_tokenizer tk, other;
    pt_bpe_train_desc d;
    unsigned char *text = NULL;
    size_t n = 0, cap = 0;
    double dt;

    memset(&tk, 0, sizeof tk);
    memset(&other, 0, sizeof other);
    cli_passive_wait(argv);
    if ((s = cli_parse(argc, argv, opts, nopts, pos, 256, &npos)) != 0) {
        if (s == 1) cli_usage(stdout, usage, opts, nopts);
        return s == 1 ? 0 : 1;
    }
    if (npos < 1 || !out) {
        fprintf(stderr, "error: give --output and at least one text FILE\n");
        cli_usage(stderr, usage, opts, nopts);
        return 1;
    }
    if (strcmp(pattern, "gpt2") != 0 && strcmp(pattern, "cl100k") != 0) {
        fprintf(stderr, "error: --pattern %s: expected gpt2 or cl100k\n", pattern);
        return 1;
    }
    if (!cli_probe_write("--output", out, "training")) return 1;
    if (check) { /* found out now, not after the training */
        FILE *f = fopen(check, "rb");
        if (!f || cli_is_dir(check)) {
            fprintf(stderr, "error: --check %s: %s\n", check,
                    f ? "is a directory" : strerror(errno));
            if (f) fclose(f);
            return 1;
        }
        fclose(f);
    }
    for (i = 0; i < npos; i++)
        if (!(text = append_file(pos[i], text, &n, &cap))) return 1;
    memset(&d, 0, sizeof d);
    d.vocab_size = vocab;
    d.pretok = strcmp(pattern, "gpt2") == 0 ? PT_PRETOK_GPT2 : PT_PRETOK_CL100K;
    d.min_frequency = min_freq;
    d.threads = threads;
    d.progress = progress;
    g_t0 = pt_time_now();
    if (pt_bpe_train(&tk, text, n, &d) != PT_OK || pt_tokenizer_save(&tk, out) != PT_OK) {
        fprintf(stderr, "error: %s\n", pt_last_error());
        goto done;
    }
    dt = pt_time_now() - g_t0;
    fprintf(stderr, "bpe_train: %.1f MB of text -> %d tokens (%d merges) in %.2f s, %s\n", (double)n / 1e6,
            tk.n_vocab, tk.n_merges, dt, out);
    if (check) {
        size_t m = 0, c2 = 0;
        unsigned char *held = append_file(check, NULL, &m, &c2);
        if (!held) goto done;
        m--; /* the newline append_file adds */
        printf("tokens per byte of %s: %.4f (%s, %d tokens)", check, per_byte(&tk, held, m), out, tk.n_vocab);
        if (compare) {
            if (pt_tokenizer_load(&other, compare) != PT_OK) {
                fprintf(stderr, "\nerror: %s\n", pt_last_error());
                free(held);
                goto done;
            }
            printf(", %.4f (%s, %d tokens)", per_byte(&other, held, m), compare, other.n_vocab);
        }
        printf("\n");
        free(held);
    }
    rc = 0;
done:
    free(text);
    pt_tokenizer_free(&tk);
    pt_tokenizer_free(&other);
    return rc;
}
