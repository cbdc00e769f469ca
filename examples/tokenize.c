/* tokenize.c -- text files into token ids with a byte-level BPE tokenizer.

   gcc -std=c11 -O2 -Wall -Wextra -Wpedantic -fopenmp examples/tokenize.c -o build/tokenize -DPTRAIN_NO_BLAS -lm

     build/tokenize --tokenizer gpt2/ --print-ids FILE        ids on one line
     build/tokenize --tokenizer tokenizer.json FILE.txt --output FILE.bin
     build/tokenize --tokenizer gpt2/ --decode FILE.bin       back to text
     build/tokenize --tokenizer gpt2/ --info                  sizes and peak memory

   --tokenizer is a Hugging Face tokenizer.json or a directory holding GPT-2's
   encoder.json and vocab.bpe. The .bin output is an llm.c token file: a
   header of 256 int32 (magic 20240520, version 1, token count) and uint16
   tokens; a vocabulary over 65,536 tokens writes version 2 with uint32
   tokens (ptrain's variant; llm.c reads only version 1). Encoding runs on
   all cores over chunks cut where the tokens cannot change, with a progress
   line on stderr (on a terminal; else a line every 5 s). Bad paths (a
   directory, an empty file, an --output that cannot be written) are refused
   by name before any work. Special tokens (<|endoftext|>) in the text are ordinary
   text unless --allow-special. */
#define _POSIX_C_SOURCE 200809L /* setenv, execv (cli_passive_wait) */
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"
#include "../common/cli.h"
#include "../common/progress.h"

static unsigned char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    unsigned char *buf = NULL;
    size_t cap = 0, got;
    *n = 0;
    if (!f) {
        fprintf(stderr, "error: cannot open '%s': %s\n", path, strerror(errno));
        return NULL;
    }
    do {
        if (*n + 65536 > cap) {
            unsigned char *nb = (unsigned char *)realloc(buf, cap = 2 * cap + 65536);
            if (!nb) {
                free(buf);
                fclose(f);
                fprintf(stderr, "error: out of memory reading '%s'\n", path);
                return NULL;
            }
            buf = nb;
        }
        got = fread(buf + *n, 1, cap - *n, f);
        *n += got;
    } while (got > 0);
    if (ferror(f)) { /* a directory: fopen succeeds, reading fails */
        fprintf(stderr, "error: cannot read '%s': %s\n", path, strerror(errno));
        free(buf);
        buf = NULL;
    }
    fclose(f);
    return buf;
}

/* An llm.c token file (version 1 or 2) back to text on stdout. */
static int decode_file(const pt_tokenizer *tk, const unsigned char *b, size_t n, const char *path) {
    int32_t h[3];
    size_t count, width, i;
    if (n < 1024) goto bad;
    memcpy(h, b, sizeof h);
    width = h[1] == 1 ? 2 : h[1] == 2 ? 4 : 0;
    count = (size_t)(uint32_t)h[2];
    if (h[0] != PT_TOKENS_MAGIC || !width || (n - 1024) / width != count || (n - 1024) % width) goto bad;
    for (i = 0; i < count; i++) {
        const unsigned char *p = b + 1024 + i * width;
        int id = width == 2 ? p[0] | p[1] << 8 : (int)((uint32_t)p[0] | (uint32_t)p[1] << 8 |
                                                       (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        size_t len;
        const unsigned char *t = pt_tokenizer_bytes(tk, id, &len);
        if (!t) {
            fprintf(stderr, "error: %s: token %zu is %d, not in the tokenizer's vocabulary of %d\n", path,
                    i, id, tk->n_vocab);
            return 1;
        }
        fwrite(t, 1, len, stdout);
    }
    return 0;
bad:
    fprintf(stderr, "error: %s is not an llm.c token file (magic 20240520, version 1 or 2, "
                    "a count that matches the size)\n", path);
    return 1;
}

int main(int argc, char **argv) {
    const char *tok_path = NULL, *out_path = NULL, *pos[1] = {NULL};
    int print_ids = 0, decode = 0, allow_special = 0, threads = 0, info = 0, npos, s, rc = 1;
    cli_opt opts[] = {
        {"tokenizer", CLI_STR, &tok_path, "tokenizer.json, or a directory with encoder.json + vocab.bpe", 0, 0},
        {"print-ids", CLI_FLAG, &print_ids, "print the ids space-separated on one line", 0, 0},
        {"output", CLI_STR, &out_path, "write an llm.c token file (.bin)", 0, 0},
        {"decode", CLI_FLAG, &decode, "FILE is a token file: print its text", 0, 0},
        {"allow-special", CLI_FLAG, &allow_special, "match special tokens such as <|endoftext|>", 0, 0},
        {"threads", CLI_INT, &threads, "threads (0: all cores)", 0, 1024},
        {"info", CLI_FLAG, &info, "print the tokenizer's size and this process's peak memory", 0, 0},
    };
    int nopts = (int)(sizeof opts / sizeof opts[0]);
    const char *usage =
        "usage: tokenize --tokenizer PATH FILE (--print-ids | --output OUT.bin | --decode)\n"
        "Encodes a text file with a byte-level BPE tokenizer (GPT-2, cl100k, LLaMA 3 style).";
    pt_tokenizer tk;
    progress_bytes pr;
    unsigned char *text = NULL;
    int *ids = NULL;
    size_t n = 0, n_ids = 0, i;

    memset(&tk, 0, sizeof tk);
    cli_passive_wait(argv);
    if ((s = cli_parse(argc, argv, opts, nopts, pos, 1, &npos)) != 0) {
        if (s == 1) cli_usage(stdout, usage, opts, nopts);
        return s == 1 ? 0 : 1;
    }
    if (info && tok_path && npos == 0) {
        if (pt_tokenizer_load(&tk, tok_path) != PT_OK) {
            fprintf(stderr, "error: %s\n", pt_last_error());
            return 1;
        }
        printf("tokenizer %s: %d ids, %d merges, %d special, pattern %s%s, tables %zu bytes, "
               "peak memory %ld kB\n", tok_path, tk.n_vocab, tk.n_merges, tk.n_special,
               tk.pretok == PT_PRETOK_GPT2 ? "gpt2" : "cl100k", tk.ignore_merges ? " (ignore_merges)" : "",
               pt_tokenizer_memory(&tk), cli_peak_rss_kb());
        pt_tokenizer_free(&tk);
        return 0;
    }
    if (npos != 1 || !tok_path || (print_ids + decode + (out_path != NULL)) != 1) {
        fprintf(stderr, "error: give --tokenizer PATH, one FILE and one of --print-ids, --output, --decode\n");
        cli_usage(stderr, usage, opts, nopts);
        return 1;
    }
    if (out_path && !cli_probe_write("--output", out_path, "tokenizing")) return 1;
    if (pt_tokenizer_load(&tk, tok_path) != PT_OK) {
        fprintf(stderr, "error: %s\n", pt_last_error());
        return 1;
    }
    if (!(text = read_all(pos[0], &n))) goto done;
    if (decode) {
        rc = decode_file(&tk, text, n, pos[0]);
        goto done;
    }
    if (n == 0) {
        fprintf(stderr, "error: '%s' is empty: nothing to tokenize\n", pos[0]);
        goto done;
    }
    if (!(ids = (int *)malloc(sizeof(int) * (n + 1)))) {
        fprintf(stderr, "error: out of memory for %zu ids\n", n);
        goto done;
    }
    progress_bytes_start(&pr, "tokenize");
    if (pt_tokenizer_encode_parallel(&tk, text, n, allow_special, threads, ids, &n_ids,
                                     out_path ? progress_bytes_cb : NULL, &pr) != PT_OK) {
        fprintf(stderr, "error: %s: %s\n", pos[0], pt_last_error());
        goto done;
    }
    if (print_ids) {
        for (i = 0; i < n_ids; i++) printf(i ? " %d" : "%d", ids[i]);
        putchar('\n');
    } else {
        if (pt_tokens_write_llmc(out_path, ids, n_ids, NULL) != PT_OK) {
            fprintf(stderr, "error: %s\n", pt_last_error());
            goto done;
        }
        fprintf(stderr, "tokenize: %zu bytes -> %zu tokens (%.3f tokens/byte) in %s\n", n, n_ids,
                n ? (double)n_ids / (double)n : 0.0, out_path);
    }
    rc = 0;
done:
    if (fflush(stdout) != 0) rc = 1;
    free(text);
    free(ids);
    pt_tokenizer_free(&tk);
    return rc;
}
