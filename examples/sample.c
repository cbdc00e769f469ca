/* sample.c -- load a model and generate text with the KV cache.

   gcc -std=c11 -O2 -Wall -Wextra -Wpedantic -fopenmp examples/sample.c -o build/sample -I/usr/include/x86_64-linux-gnu/openblas-openmp -L/usr/lib/x86_64-linux-gnu/openblas-openmp -Wl,-rpath,/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas -lm

     build/sample model.safetensors --prompt "the cat " --tokens 200
     build/sample gpt2.safetensors --prompt-ids 464,2068,7586 --top-k 40

     build/sample gpt2.safetensors --tokenizer gpt2/ --prompt "The cat"

   MODEL is a ptrain checkpoint (build/train --checkpoint) or a Hugging Face
   GPT-2 model.safetensors. Byte-level models (vocab_size 256) read and write
   text; any other vocabulary reads and writes text through --tokenizer (a
   tokenizer.json or a directory with GPT-2's encoder.json + vocab.bpe), or
   takes the prompt as token ids and prints token ids. */
#define _POSIX_C_SOURCE 200809L /* setenv, execv (cli_passive_wait) */
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"
#include "../common/cli.h"

/* "464,2068,7586" -> ids (room for strlen(arg) of them); every id must be in
   [0, V). Returns the count, or -1 after printing the error. */
static int parse_ids(const char *arg, int V, int *ids) {
    const char *s = arg;
    int n = 0;
    while (*s) {
        char *end;
        long v;
        errno = 0;
        v = strtol(s, &end, 10);
        if (end == s || errno || v < 0 || v >= V) {
            fprintf(stderr,
                    "error: --prompt-ids %s: '%s' does not start with a token id in [0, %d)\n",
                    arg, s, V);
            return -1;
        }
        if (*end && (*end != ',' || !end[1])) {
            fprintf(stderr, "error: --prompt-ids %s: expected ids separated by single commas, "
                            "found '%s'\n", arg, end);
            return -1;
        }
        ids[n++] = (int)v;
        s = *end ? end + 1 : end;
    }
    return n;
}

int main(int argc, char **argv) {
    const char *prompt_text = NULL, *prompt_ids = NULL, *tok_path = NULL, *pos[1] = {NULL};
    int n_new = 256, top_k = 40, n_head = 0, threads = 0, npos, s, n_prompt = 0, i, rc = 1;
    float temperature = 0.8f;
    uint64_t seed = 1337;
    cli_opt opts[] = {
        {"prompt", CLI_STR, &prompt_text,
         "prompt text: byte-level models, or with --tokenizer (default: \"\\n\")", 0, 0},
        {"tokenizer", CLI_STR, &tok_path,
         "tokenizer.json or a GPT-2 directory (encoder.json + vocab.bpe): text in and out", 0, 0},
        {"prompt-ids", CLI_STR, &prompt_ids, "prompt as comma-separated token ids: 464,2068,7586",
         0, 0},
        {"tokens", CLI_INT, &n_new, "tokens to generate", 0, 1 << 24},
        {"temperature", CLI_FLOAT, &temperature, "sampling temperature (0: greedy)", 0, 100},
        {"top-k", CLI_INT, &top_k, "sample among the k most likely tokens (0: all)", 0, 1 << 24},
        {"seed", CLI_U64, &seed, "sampling seed", 0, 0},
        {"n-head", CLI_INT, &n_head, "n_head (0: the checkpoint's, or n_embd/64 for Hugging Face)",
         0, 1 << 16},
        {"threads", CLI_INT, &threads, "OpenMP/BLAS threads (0: all cores)", 0, 1024},
    };
    int nopts = (int)(sizeof opts / sizeof opts[0]);
    const char *usage =
        "usage: sample MODEL.safetensors [options]\n"
        "Generates text from a ptrain checkpoint or a Hugging Face GPT-2 safetensors file.\n"
        "Byte-level models (vocab_size 256): --prompt TEXT, and the output is text\n"
        "(bytes other than printable ASCII, newline and tab print as '?').\n"
        "Other vocabularies (GPT-2: 50257): --tokenizer PATH --prompt TEXT prints text;\n"
        "without a tokenizer give --prompt-ids (e.g. 50256 is GPT-2's <|endoftext|>) and\n"
        "the output is token ids.\n"
        "The model summary and the speed go to stderr, the generated text to stdout.";
    pt_gpt_config cfg;
    pt_gpt_desc desc;
    pt_gpt gpt;
    pt_kv_cache cache;
    pt_sample_desc sd;
    pt_tokenizer tk;
    int *prompt = NULL, *out = NULL;
    double t0, dt;

    memset(&gpt, 0, sizeof gpt);
    memset(&cache, 0, sizeof cache);
    memset(&tk, 0, sizeof tk);
    cli_passive_wait(argv);
    if ((s = cli_parse(argc, argv, opts, nopts, pos, 1, &npos)) != 0) {
        if (s == 1) cli_usage(stdout, usage, opts, nopts);
        return s == 1 ? 0 : 1; /* cli_parse printed the error */
    }
    if (npos != 1) {
        fprintf(stderr, "error: give a MODEL.safetensors file\n");
        cli_usage(stderr, usage, opts, nopts);
        return 1;
    }
    pt_set_threads(threads);

    /* the config first: it says how to read the prompt */
    if (pt_gpt_config_from_file(pos[0], n_head, &cfg) != PT_OK) goto fail;

    /* the prompt: bytes for byte-level models, else ids */
    if (prompt_text && prompt_ids) {
        fprintf(stderr, "error: give --prompt or --prompt-ids, not both\n");
        goto done;
    }
    if (tok_path) {
        if (pt_tokenizer_load(&tk, tok_path) != PT_OK) goto fail;
        if (tk.n_vocab > cfg.vocab_size) {
            fprintf(stderr, "error: the tokenizer %s has %d ids but the model's vocab_size is %d: "
                            "not this model's tokenizer\n", tok_path, tk.n_vocab, cfg.vocab_size);
            goto done;
        }
    }
    if (!prompt_ids && !tok_path && cfg.vocab_size != 256) {
        fprintf(stderr, "error: vocab_size=%d is not byte-level (256): give --tokenizer PATH for "
                        "text, or the prompt as --prompt-ids (see --help)\n", cfg.vocab_size);
        goto done;
    }
    if (tok_path && !prompt_ids) { /* text through the tokenizer; special tokens allowed */
        const char *p = prompt_text ? prompt_text : "\n";
        size_t np = 0;
        if (!(prompt = (int *)malloc(sizeof(int) * (strlen(p) + 1)))) goto oom;
        if (pt_tokenizer_encode(&tk, p, strlen(p), 1, prompt, &np) != PT_OK) goto fail;
        n_prompt = (int)np;
    } else if (prompt_ids) {
        if (!(prompt = (int *)malloc(sizeof(int) * (strlen(prompt_ids) + 1)))) goto oom;
        if ((n_prompt = parse_ids(prompt_ids, cfg.vocab_size, prompt)) < 0) goto done;
    } else {
        const char *p = prompt_text ? prompt_text : "\n";
        n_prompt = (int)strlen(p);
        if (!(prompt = (int *)malloc(sizeof(int) * (size_t)(n_prompt + 1)))) goto oom;
        for (i = 0; i < n_prompt; i++) prompt[i] = (unsigned char)p[i];
    }
    if (n_prompt == 0) {
        fprintf(stderr, "error: the prompt is empty; generation needs at least one token\n");
        goto done;
    }

    /* weights into a model of batch 1 and seq 1: generation runs on the KV
       cache, not on the training activations */
    memset(&desc, 0, sizeof desc);
    desc.config = cfg;
    desc.batch = 1;
    desc.seq = 1;
    desc.inference = 1; /* weights only: no gradients or AdamW state */
    if (pt_gpt_init(&gpt, &desc) != PT_OK || pt_gpt_load_weights(&gpt, pos[0]) != PT_OK ||
        pt_kv_cache_init(&cache, &gpt) != PT_OK)
        goto fail;
    fprintf(stderr, "model: %s\n  vocab_size %d, block_size %d, n_layer %d, n_head %d, n_embd %d, "
                    "ln_eps %g\n  %lld parameters (%.2fM)\n",
            pos[0], cfg.vocab_size, cfg.block_size, cfg.n_layer, gpt.config.n_head, cfg.n_embd,
            (double)gpt.config.ln_eps, (long long)gpt.num_params, (double)gpt.num_params / 1e6);

    if (!(out = (int *)malloc(sizeof(int) * (size_t)(n_new + 1)))) goto oom;

    sd.temperature = temperature;
    sd.top_k = top_k;
    sd.seed = seed;
    t0 = pt_time_now();
    if (pt_gpt_generate(&gpt, &cache, prompt, n_prompt, out, n_new, &sd) != PT_OK) goto fail;
    dt = pt_time_now() - t0;

    fprintf(stderr, "---\n");
    if (tok_path) {
        cli_print_text(&tk, prompt, n_prompt);
        cli_print_text(&tk, out, n_new);
        putchar('\n');
    } else if (cfg.vocab_size == 256) {
        cli_print_bytes(prompt, n_prompt);
        cli_print_bytes(out, n_new);
        putchar('\n');
    } else {
        for (i = 0; i < n_new; i++) printf(i ? ",%d" : "%d", out[i]);
        putchar('\n');
    }
    fflush(stdout);
    fprintf(stderr, "---\n%d tokens in %.3f s: %.1f tokens/s (temperature %g, top-k %d, seed %llu; "
                    "the time includes the %d-token prompt)\n",
            n_new, dt, dt > 0 ? n_new / dt : 0.0, (double)temperature, top_k,
            (unsigned long long)seed, n_prompt);
    rc = 0;
    goto done;
oom:
    fprintf(stderr, "error: out of memory\n");
    goto done;
fail:
    fprintf(stderr, "error: %s\n", pt_last_error());
done:
    free(prompt);
    free(out);
    pt_kv_cache_free(&cache);
    pt_gpt_free(&gpt);
    pt_tokenizer_free(&tk);
    return rc;
}
