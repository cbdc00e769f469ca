/* sample.c -- load a model and generate text with the KV cache.

   gcc -std=c11 -O2 -Wall -Wextra -Wpedantic -fopenmp examples/sample.c -o build/sample -I/usr/include/x86_64-linux-gnu/openblas-openmp -L/usr/lib/x86_64-linux-gnu/openblas-openmp -Wl,-rpath,/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas -lm

     build/sample model.safetensors --prompt "the cat " --tokens 200
     build/sample gpt2.safetensors --prompt-ids 464,2068,7586 --top-k 40
     build/sample gpt2.safetensors --tokenizer gpt2/ --prompt "The cat"
     build/sample llama-dir/ --prompt "Once upon a time"

   MODEL is a ptrain checkpoint (build/train --checkpoint), a Hugging Face
   GPT-2 or LLaMA model directory (model.safetensors + config.json, and its
   tokenizer.json, the default --tokenizer), or such a model.safetensors
   with its config.json beside it (a GPT-2 one alone too: n_head is then
   --n-head, else n_embd/64). Byte-level models (vocab_size 256) read and
   write text; any other vocabulary reads and writes text through a
   tokenizer (a tokenizer.json or a directory with GPT-2's encoder.json +
   vocab.bpe), or takes the prompt as token ids and prints token ids. */
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

/* The command line, and what it loads. */
typedef struct sample_run {
    const char *model, *prompt_text, *prompt_ids, *tok_path;
    int n_new, top_k, n_head, threads;
    float temperature;
    uint64_t seed;
    char presets[640], dir_tok[4200];
    pt_gpt_config cfg;
    pt_gpt gpt;
    pt_kv_cache cache;
    pt_tokenizer tk;
    int *prompt, *out, n_prompt;
} sample_run;

/* The options into s; -1 to go on, else the exit status. */
static int sample_options(int argc, char **argv, sample_run *s) {
    const char *pos[1] = {NULL};
    int npos, rc;
    cli_opt opts[] = {
        {"prompt", CLI_STR, &s->prompt_text,
         "prompt text: byte-level models, or with --tokenizer (default: \"\\n\")", 0, 0},
        {"tokenizer", CLI_STR, &s->tok_path, "tokenizer.json, or a directory holding one or "
         "GPT-2's encoder.json + vocab.bpe: text in and out (default for a model directory: its "
         "tokenizer.json)", 0, 0},
        {"prompt-ids", CLI_STR, &s->prompt_ids,
         "prompt as comma-separated token ids: 464,2068,7586", 0, 0},
        {"tokens", CLI_INT, &s->n_new, "tokens to generate", 0, 1 << 24},
        {"temperature", CLI_FLOAT, &s->temperature, "sampling temperature (0: greedy)", 0, 100},
        {"top-k", CLI_INT, &s->top_k, "sample among the k most likely tokens (0: all)", 0, 1 << 24},
        {"seed", CLI_U64, &s->seed, "sampling seed", 0, 0},
        {"n-head", CLI_INT, &s->n_head, "n_head of a Hugging Face GPT-2 file alone (0: the "
         "file's config, or n_embd/64)", 0, 1 << 16},
        {"threads", CLI_INT, &s->threads, "OpenMP/BLAS threads (0: all cores)", 0, 1024},
    };
    int nopts = (int)(sizeof opts / sizeof opts[0]);
    char usage[2048];
    snprintf(usage, sizeof usage,
             "usage: sample MODEL [options]\n"
             "Generates text from MODEL: a ptrain checkpoint (build/train --checkpoint), a Hugging\n"
             "Face GPT-2 or LLaMA model directory (model.safetensors + config.json, and\n"
             "tokenizer.json for text), or such a model.safetensors with its config.json beside\n"
             "it (a GPT-2 one alone too). Presets train makes: %s.\n"
             "Byte-level models (vocab_size 256): --prompt TEXT, and the output is text\n"
             "(bytes other than printable ASCII, newline and tab print as '?').\n"
             "Other vocabularies (GPT-2: 50257): --tokenizer PATH --prompt TEXT prints text;\n"
             "without a tokenizer give --prompt-ids (e.g. 50256 is GPT-2's <|endoftext|>) and\n"
             "the output is token ids.\n"
             "The model summary and the speed go to stderr, the generated text to stdout.",
             s->presets);
    if ((rc = cli_parse(argc, argv, opts, nopts, pos, 1, &npos)) != 0) {
        if (rc == 1) cli_usage(stdout, usage, opts, nopts);
        return rc == 1 ? 0 : 1; /* cli_parse printed the error */
    }
    if (npos != 1) {
        fprintf(stderr, "error: give a MODEL: a .safetensors file or a model directory\n");
        cli_usage(stderr, usage, opts, nopts);
        return 1;
    }
    s->model = pos[0];
    if (s->prompt_text && s->prompt_ids) {
        fprintf(stderr, "error: give --prompt or --prompt-ids, not both\n");
        return 1;
    }
    return -1;
}

/* The model's config, its tokenizer (--tokenizer, else a model directory's
   tokenizer.json) checked against it, and the prompt as ids: bytes for
   byte-level models, the tokenizer's ids, or --prompt-ids. 1 on success,
   else 0 after a message. */
static int sample_prompt(sample_run *s) {
    if (pt_gpt_config_from_file(s->model, s->n_head, &s->cfg) != PT_OK) goto fail;
    if (!s->tok_path && !s->prompt_ids &&
        cli_model_tokenizer(s->model, s->dir_tok, sizeof s->dir_tok))
        s->tok_path = s->dir_tok;
    if (s->tok_path) {
        if (pt_tokenizer_load(&s->tk, s->tok_path) != PT_OK) goto fail;
        if (s->tk.n_vocab > s->cfg.vocab_size) {
            fprintf(stderr, "error: the tokenizer %s has %d ids but the model's vocab_size is %d: "
                            "not this model's tokenizer\n", s->tok_path, s->tk.n_vocab,
                    s->cfg.vocab_size);
            return 0;
        }
    }
    if (!s->prompt_ids && !s->tok_path && s->cfg.vocab_size != 256) {
        fprintf(stderr, "error: vocab_size=%d is not byte-level (256): give --tokenizer PATH for "
                        "text, or the prompt as --prompt-ids (see --help)\n", s->cfg.vocab_size);
        return 0;
    }
    if (s->prompt_ids) {
        if (!(s->prompt = (int *)malloc(sizeof(int) * (strlen(s->prompt_ids) + 1)))) goto oom;
        if ((s->n_prompt = parse_ids(s->prompt_ids, s->cfg.vocab_size, s->prompt)) < 0) return 0;
    } else {
        const char *p = s->prompt_text ? s->prompt_text : "\n";
        size_t np = strlen(p), i;
        if (!(s->prompt = (int *)malloc(sizeof(int) * (np + 1)))) goto oom;
        if (s->tok_path) { /* text through the tokenizer; special tokens allowed */
            if (pt_tokenizer_encode(&s->tk, p, strlen(p), 1, s->prompt, &np) != PT_OK) goto fail;
        } else {
            for (i = 0; i < np; i++) s->prompt[i] = (unsigned char)p[i];
        }
        s->n_prompt = (int)np;
    }
    if (s->n_prompt == 0) {
        fprintf(stderr, "error: the prompt is empty; generation needs at least one token\n");
        return 0;
    }
    return 1;
oom:
    fprintf(stderr, "error: out of memory\n");
    return 0;
fail:
    fprintf(stderr, "error: %s\n", pt_last_error());
    return 0;
}

/* The weights into a model of batch 1 and seq 1 (generation runs on the KV
   cache, not on the training activations), and its summary on stderr. 1 on
   success, else 0 (the error in pt_last_error). */
static int sample_model(sample_run *s) {
    pt_gpt_desc desc;
    char arch[256];
    memset(&desc, 0, sizeof desc);
    desc.config = s->cfg;
    desc.batch = 1;
    desc.seq = 1;
    desc.inference = 1; /* weights only: no gradients or AdamW state */
    if (pt_gpt_init(&s->gpt, &desc) != PT_OK || pt_gpt_load_weights(&s->gpt, s->model) != PT_OK ||
        pt_kv_cache_init(&s->cache, &s->gpt) != PT_OK)
        return 0;
    cli_model_arch(&s->cfg, arch, sizeof arch);
    fprintf(stderr, "model: %s, %s\n  vocab_size %d, block_size %d, n_layer %d, n_head %d, n_embd "
                    "%d, ln_eps %g\n  %lld parameters (%.2fM)%s%s\n",
            s->model, arch, s->cfg.vocab_size, s->cfg.block_size, s->cfg.n_layer,
            s->gpt.config.n_head, s->cfg.n_embd, (double)s->gpt.config.ln_eps,
            (long long)s->gpt.num_params, (double)s->gpt.num_params / 1e6,
            s->tok_path ? "; tokenizer " : "", s->tok_path ? s->tok_path : "");
    return 1;
}

/* Generates and prints the prompt and what follows it. 1, or 0 (the error
   in pt_last_error). */
static int sample_generate(sample_run *s) {
    pt_sample_desc sd;
    double t0, dt;
    int i;
    if (!(s->out = (int *)malloc(sizeof(int) * (size_t)(s->n_new + 1))))
        return pt_error(PT_ERR_OOM, "out of memory"), 0;
    sd.temperature = s->temperature;
    sd.top_k = s->top_k;
    sd.seed = s->seed;
    t0 = pt_time_now();
    if (pt_gpt_generate(&s->gpt, &s->cache, s->prompt, s->n_prompt, s->out, s->n_new, &sd) !=
        PT_OK)
        return 0;
    dt = pt_time_now() - t0;
    fprintf(stderr, "---\n");
    if (s->tok_path) {
        cli_print_text(&s->tk, s->prompt, s->n_prompt);
        cli_print_text(&s->tk, s->out, s->n_new);
        putchar('\n');
    } else if (s->cfg.vocab_size == 256) {
        cli_print_bytes(s->prompt, s->n_prompt);
        cli_print_bytes(s->out, s->n_new);
        putchar('\n');
    } else {
        for (i = 0; i < s->n_new; i++) printf(i ? ",%d" : "%d", s->out[i]);
        putchar('\n');
    }
    fflush(stdout);
    fprintf(stderr, "---\n%d tokens in %.3f s: %.1f tokens/s (temperature %g, top-k %d, seed %llu; "
                    "the time includes the %d-token prompt)\n",
            s->n_new, dt, dt > 0 ? s->n_new / dt : 0.0, (double)s->temperature, s->top_k,
            (unsigned long long)s->seed, s->n_prompt);
    return 1;
}

int main(int argc, char **argv) {
    sample_run *s = (sample_run *)calloc(1, sizeof(sample_run));
    int rc = 1;
    if (!s) return 1;
    s->n_new = 256, s->top_k = 40, s->temperature = 0.8f, s->seed = 1337;
    cli_presets(s->presets, sizeof s->presets);
    cli_passive_wait(argv);
    if ((rc = sample_options(argc, argv, s)) < 0) {
        pt_set_threads(s->threads);
        rc = 1;
        if (sample_prompt(s)) {
            if (sample_model(s) && sample_generate(s)) rc = 0;
            else fprintf(stderr, "error: %s\n", pt_last_error());
        }
    }
    free(s->prompt);
    free(s->out);
    pt_kv_cache_free(&s->cache);
    pt_gpt_free(&s->gpt);
    pt_tokenizer_free(&s->tk);
    free(s);
    return rc;
}
