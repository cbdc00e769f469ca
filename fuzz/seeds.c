/* seeds.c -- writes the fuzzers' seed corpus: valid and near-valid inputs
   for every harness, generated rather than committed as binary files.

     build/fuzz/seeds DIR      (writes DIR/<harness>/<name>)

   Valid inputs come from the library's own writers (a real small
   checkpoint, a Hugging Face style GPT-2 file, a fixture-shaped file, an
   llm.c token file); near-valid ones are hand-written headers and argument
   vectors that stop at one check each, so that the fuzzers start next to
   every error path. */
#define _POSIX_C_SOURCE 200809L /* mkdir */
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"

#include <sys/stat.h>

static const char *out_dir;
static int failed;

static void put(const char *harness, const char *name, const void *data, size_t n) {
    char path[1024];
    FILE *f;
    snprintf(path, sizeof path, "%s/%s", out_dir, harness);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/%s/%s", out_dir, harness, name);
    if (!(f = fopen(path, "wb")) || fwrite(data, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "seeds: cannot write '%s'\n", path);
        failed = 1;
    }
}

/* a file's bytes, or NULL (n = 0) */
static unsigned char *slurp(const char *path, size_t *n) {
    unsigned char *buf = NULL;
    if (pt_file_read(path, &buf, n, NULL) != PT_OK) {
        fprintf(stderr, "seeds: %s\n", pt_last_error());
        failed = 1;
    }
    return buf;
}

/* safetensors from a header and n zero bytes of data (padded as the writer pads) */
static void put_st(const char *harness, const char *name, const char *json, size_t n) {
    size_t hl = strlen(json), pad = (8 - hl % 8) % 8, i;
    unsigned char *b = (unsigned char *)calloc(8 + hl + pad + n, 1);
    if (!b) return;
    for (i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)(hl + pad) >> (8 * i));
    memcpy(b + 8, json, hl);
    memset(b + 8 + hl, ' ', pad);
    put(harness, name, b, 8 + hl + pad + n);
    free(b);
}

/* the same file as written by the library under another harness's name too */
static void copy(const char *path, const char *harness, const char *name) {
    size_t n = 0;
    unsigned char *b = slurp(path, &n);
    if (b) put(harness, name, b, n);
    free(b);
}

/* A tiny model's checkpoint (1 layer, 8 wide), then damaged copies of it. */
static void checkpoints(const char *tmp) {
    pt_gpt m;
    pt_gpt_desc d;
    pt_train_state state = {12, 1, 3, 0x9E3779B97F4A7C15ull, 0};
    unsigned char *b;
    size_t n = 0;
    memset(&d, 0, sizeof d);
    d.config.vocab_size = 16, d.config.block_size = 4, d.config.n_layer = 1;
    d.config.n_head = 2, d.config.n_embd = 8, d.batch = 1, d.seq = 4;
    if (pt_gpt_init(&m, &d) != PT_OK) {
        fprintf(stderr, "seeds: %s\n", pt_last_error());
        failed = 1;
        return;
    }
    pt_gpt_init_weights(&m, 1);
    if (pt_checkpoint_save(tmp, &m, &state) != PT_OK) {
        fprintf(stderr, "seeds: %s\n", pt_last_error());
        failed = 1;
    }
    pt_gpt_free(&m);
    copy(tmp, "checkpoint", "tiny.safetensors");
    copy(tmp, "safetensors", "checkpoint.safetensors");
    if (!(b = slurp(tmp, &n))) return;
    put("checkpoint", "truncated.safetensors", b, n - 100);      /* data shorter than the header says */
    b[0] ^= 1;                                                   /* header length off by one */
    put("checkpoint", "header_length.safetensors", b, n);
    free(b);
}

/* A Hugging Face style GPT-2 file: no metadata, "transformer." names, half
   precision, the tensors a loader must ignore. n_embd = 64 gives n_head. */
static void hugging_face(const char *tmp) {
    static const char *layer[12] = {
        "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
        "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
        "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"};
    const int64_t C = 64, V = 4, block = 2;
    int64_t shapes[12][2] = {{C, 0}, {C, 0}, {C, 3 * C}, {3 * C, 0}, {C, C}, {C, 0},
                             {C, 0}, {C, 0}, {C, 4 * C}, {4 * C, 0}, {4 * C, C}, {C, 0}};
    static uint16_t zeros[4 * 64 * 64]; /* the largest tensor, in F16 (all 0.0) */
    int64_t s[2];
    char name[96];
    pt_st_writer w;
    int i;
    w.alloc_ctx = NULL;
    pt_st_writer_init(&w);
    s[0] = V, s[1] = C;
    pt_st_writer_add(&w, "transformer.wte.weight", PT_F16, 2, s, zeros);
    s[0] = block;
    pt_st_writer_add(&w, "transformer.wpe.weight", PT_BF16, 2, s, zeros);
    for (i = 0; i < 12; i++) {
        snprintf(name, sizeof name, "transformer.h.0.%s", layer[i]);
        pt_st_writer_add(&w, name, i % 2 ? PT_BF16 : PT_F16, shapes[i][1] ? 2 : 1, shapes[i],
                         zeros);
    }
    s[0] = C;
    pt_st_writer_add(&w, "transformer.ln_f.weight", PT_F16, 1, s, zeros);
    pt_st_writer_add(&w, "transformer.ln_f.bias", PT_F16, 1, s, zeros);
    s[0] = 1, s[1] = 1;
    pt_st_writer_add(&w, "transformer.h.0.attn.bias", PT_BOOL, 2, s, zeros);
    if (pt_st_writer_save(&w, tmp) != PT_OK) {
        fprintf(stderr, "seeds: %s\n", pt_last_error());
        failed = 1;
    }
    pt_st_writer_free(&w);
    copy(tmp, "safetensors", "hugging_face.safetensors");
}

/* The fixture loader's input: metadata, model shape and a batch (B=2, T=3). */
static void fixtures(const char *tmp) {
    static const char *meta[][2] = {
        {"format", "ptrain-fixture-v1"}, {"n_layer", "1"}, {"n_head", "2"}, {"n_embd", "8"},
        {"vocab_size", "16"}, {"block_size", "4"}, {"B", "2"}, {"T", "3"}, {"steps", "2"},
        {"lr", "0.001"}, {"beta1", "0.9"}, {"beta2", "0.95"}, {"eps", "1e-08"},
        {"weight_decay", "0.1"}, {"decay", "dim>=2"}, {"gelu", "tanh"},
        {"tied_lm_head", "true"}, {"ln_eps", "1e-05"}};
    static const int batch[6] = {1, 2, 3, 4, 5, 15};
    const int64_t bt[2] = {2, 3}, one[1] = {1};
    const float loss = 2.75f;
    pt_st_writer w;
    int i;
    w.alloc_ctx = NULL;
    pt_st_writer_init(&w);
    for (i = 0; i < (int)(sizeof meta / sizeof meta[0]); i++)
        pt_st_writer_meta(&w, meta[i][0], meta[i][1]);
    pt_st_writer_add(&w, "fixture.inputs", PT_I32, 2, bt, batch);
    pt_st_writer_add(&w, "fixture.targets", PT_I32, 2, bt, batch);
    pt_st_writer_add(&w, "fixture.loss", PT_F32, 1, one, &loss);
    if (pt_st_writer_save(&w, tmp) != PT_OK) {
        fprintf(stderr, "seeds: %s\n", pt_last_error());
        failed = 1;
    }
    pt_st_writer_free(&w);
    copy(tmp, "fixture", "small.safetensors");
    copy(tmp, "safetensors", "fixture.safetensors");
    /* near-valid: a batch the metadata does not describe */
    put_st("fixture", "batch_shape.safetensors",
           "{\"__metadata__\":{\"format\":\"ptrain-fixture-v1\",\"n_layer\":\"1\",\"n_head\":\"1\","
           "\"n_embd\":\"4\",\"vocab_size\":\"8\",\"block_size\":\"4\",\"B\":\"3\",\"T\":\"2\","
           "\"steps\":\"1\",\"lr\":\"1e-3\",\"beta1\":\"0.9\",\"beta2\":\"0.99\",\"eps\":\"1e-8\","
           "\"weight_decay\":\"0\",\"decay\":\"dim>=2\",\"gelu\":\"tanh\",\"tied_lm_head\":\"true\"},"
           "\"fixture.inputs\":{\"dtype\":\"I32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
           "\"fixture.targets\":{\"dtype\":\"F32\",\"shape\":[3,2],\"data_offsets\":[24,48]}}",
           48);
}

/* Headers that each stop at one check of the reader. */
static void headers(void) {
    static const char *h[][2] = {
        {"empty", "{}"},
        {"metadata", "{\"__metadata__\":{\"format\":\"ptrain-checkpoint-v1\",\"n_layer\":\"1\","
                     "\"n_head\":\"2\",\"n_embd\":\"8\",\"vocab_size\":\"16\",\"block_size\":"
                     "\"4\",\"ln_eps\":\"1e-5\"}}"},
        {"dtypes", "{\"a\":{\"dtype\":\"F16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
                   "\"b\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[12,14]},"
                   "\"c\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[16,24]},"
                   "\"d\":{\"dtype\":\"I32\",\"shape\":[0,5],\"data_offsets\":[24,24]},"
                   "\"e\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[24,32]},"
                   "\"f\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1],\"data_offsets\":[32,33]},"
                   "\"g\":{\"dtype\":\"BOOL\",\"shape\":[2],\"data_offsets\":[33,35]},"
                   "\"h\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[36,40]}}"},
        {"escapes", "{\"\\u00e9\\ud83d\\ude00\\n\\t\\\"\\\\\\/\":{\"dtype\":\"U8\",\"shape\":[1],"
                    "\"data_offsets\":[0,1],\"extra\":[1,{\"x\":null},true,false,-1.5e3,\"s\"]}}"},
        {"overlap", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                    "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}"},
        {"duplicate", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}"},
        {"big_shape", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
                      "\"data_offsets\":[0,0]}}"},
        {"nine_dims", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],"
                      "\"data_offsets\":[0,1]}}"},
        {"unknown_dtype", "{\"a\":{\"dtype\":\"F8_E4M3\",\"shape\":[1],\"data_offsets\":[0,1]}}"},
        {"gpt2_shapes", "{\"wte.weight\":{\"dtype\":\"F32\",\"shape\":[2,64],\"data_offsets\":"
                        "[0,512]},\"wpe.weight\":{\"dtype\":\"F32\",\"shape\":[1,64],"
                        "\"data_offsets\":[512,768]}}"},
    };
    static const size_t data[] = {0, 0, 40, 1, 12, 8, 0, 1, 1, 768};
    int i;
    for (i = 0; i < (int)(sizeof h / sizeof h[0]); i++) {
        put_st("safetensors", h[i][0], h[i][1], data[i]);
        if (i < 2) put_st("checkpoint", h[i][0], h[i][1], data[i]);
    }
}

/* llm.c token files: valid, then one broken field each, version 2 (uint32);
   and raw bytes */
static void tokens(void) {
    static unsigned char b[1024 + 2 * 64];
    const char *text = "7+5=12\nthe cat sees a red ball near the river.\n";
    int32_t head[3] = {PT_TOKENS_MAGIC, 1, 64};
    int i;
    memcpy(b, head, sizeof head);
    for (i = 0; i < 64; i++) {
        b[1024 + 2 * i] = (unsigned char)(i * 37);
        b[1024 + 2 * i + 1] = (unsigned char)(i % 3);
    }
    b[1020] = 3, b[1021] = 7, b[1022] = 5, b[1023] = 1; /* the harness's loader shape */
    put("tokens", "llmc.bin", b, sizeof b);
    put("tokens", "llmc_short.bin", b, sizeof b - 2);
    head[2] = 1 << 30;
    memcpy(b, head, sizeof head);
    put("tokens", "llmc_count.bin", b, sizeof b);
    head[1] = 3;
    memcpy(b, head, sizeof head);
    put("tokens", "llmc_version.bin", b, sizeof b);
    head[1] = 2, head[2] = 32; /* version 2: uint32 ids, some over 65,535 */
    memcpy(b, head, sizeof head);
    for (i = 0; i < 32; i++) {
        uint32_t id = (uint32_t)(i * 4099 % 100277);
        memcpy(b + 1024 + 4 * i, &id, 4);
    }
    put("tokens", "llmc_v2.bin", b, sizeof b);
    put("tokens", "text", text, strlen(text));
}

/* One argument vector as a seed: the arguments NUL-separated. */
static void put_args(const char *harness, int i, const char *const *args) {
    char buf[1024], name[32];
    size_t n = 0;
    int k;
    for (k = 0; args[k]; k++) {
        size_t len = strlen(args[k]) + 1;
        memcpy(buf + n, args[k], len);
        n += len;
    }
    snprintf(name, sizeof name, "args%02d", i);
    put(harness, name, buf, n ? n - 1 : 0);
}

/* Argument vectors of build/train (NUL-separated), from tests/run.sh and more. */
static void arguments(void) {
    static const char *argv[][24] = {
        {"--preset", "tiny", "--steps", "40", "--batch", "4", "--seq", "32", "--eval-every", "20",
         "--log-every", "20", "--sample-tokens", "40", "--checkpoint", "c.safetensors",
         "--threads", "2"},
        {"--preset", "tiny", "--block-size", "64", "--seq", "128", "--steps", "1", "--batch",
         "1", "--sample-tokens", "0"},
        {"--steps", "12x"},
        {"--preset", "gpt5"},
        {"--embd", "100", "--heads", "3"},
        {"--preset", "tiny", "--tp", "3", "--steps", "1", "--sample-tokens", "0"},
        {"--preset", "tiny", "--dp", "3", "--batch", "8", "--steps", "1"},
        {"--preset", "tiny", "--steps", "1", "--trace", "x.json"},
        {"--preset", "tiny", "--steps", "3", "--batch", "4", "--seq", "16", "--pp", "2",
         "--grad-accum", "2", "--schedule", "zb-h1", "--trace", "t.json"},
        {"--layers=4", "--pp", "2", "--chunks=2", "--schedule", "interleaved", "--grad-accum",
         "4", "--recompute", "selective", "--tp", "2", "--dp", "2", "--zero", "1", "--batch", "8"},
        {"--data", "x.bin", "--data-format", "llmc", "--resume", "c.safetensors"},
        {"--data-format", "utf8"},
        {"--recompute", "some"},
        {"--seed", "18446744073709551615", "--lr=1e-400"},
        {"--temperature", "nan", "--top-k", "-1"},
        {"--val-fraction", "0.95", "--grad-clip", "inf"},
        {"--help"},
        {"--verbose", "--", "--steps"},
        {"--preset", "gpt2-1558m", "--embd", "131072", "--layers", "4096", "--block-size",
         "1048576", "--seq", "1048576", "--batch", "1048576"},
    };
    int i;
    for (i = 0; i < (int)(sizeof argv / sizeof argv[0]); i++) put_args("train_cli", i, argv[i]);
}

/* build/plan's command lines: presets, every flag, refusals, extremes. */
static void plan_arguments(void) {
    static const char *argv[][32] = {
        {"--preset", "megatron-1t"},
        {"--preset=gpt-175b", "--hw", "mi250x", "--json", "--stages"},
        {"--layers", "80", "--hidden", "12288", "--heads", "96", "--seq", "2048", "--vocab",
         "51200", "--tp", "8", "--pp", "8", "--gpus", "1536", "--batch", "2304", "--microbatch",
         "2", "--chunks", "2", "--zero", "1", "--recompute", "full", "--hw", "a100-80g", "--json"},
        {"--layers", "96", "--hidden", "12288", "--heads", "96", "--gpus", "384", "--batch",
         "1536", "--microbatch", "4", "--zero", "3", "--recompute", "selective"},
        {"--preset", "megatron-145.6b", "--schedule", "zb-h1", "--chunks", "1", "--recompute",
         "none", "--tokens", "3e11", "--hw", "h100-80g"},
        {"--gpus", "100", "--tp", "8"},
        {"--preset", "megatron-1t", "--pp", "8", "--gpus", "384", "--batch", "384"},
        {"--preset", "gpt-9t"},
        {"--recompute", "most", "--schedule", "2f2b"},
        {"--layers", "4096", "--hidden", "131072", "--heads", "65536", "--seq", "1048576",
         "--vocab", "16777216", "--tp", "65536", "--pp", "64", "--gpus", "16777216", "--batch",
         "16777216", "--microbatch", "1"},
        {"--pp", "64", "--gpus", "64", "--layers", "64", "--batch", "16000000"},
        {"--tokens", "nan", "--top", "0", "--zero", "4"},
        {"--help"},
    };
    int i;
    for (i = 0; i < (int)(sizeof argv / sizeof argv[0]); i++) put_args("plan_cli", i, argv[i]);
}

/* Hardware profiles as the library writes them (pt_hw_save): each preset, and
   a calibrated machine's (exec ptrain, cores and the one-thread rates); then
   near-valid ones that each stop at one check of the reader. */
static void hardware(const char *tmp) {
    static const char *presets[] = {"a100-80g", "h100-80g", "mi250x"};
    static const char *bad[][2] = {
        {"missing_field", "name = x\npeak_flops = 1e12\ngemm_eff = 0.5\n"},
        {"not_a_number", "name = x\npeak_flops = fast\n"},
        {"negative", "peak_flops = -1\n"},
        {"unknown_key", "# comment\n\nname = x\nflops = 3\n"},
        {"exec", "exec = tpu\n"},
        {"no_equals", "peak_flops 1e12\n"},
        {"crlf", "name = x\r\npeak_flops = 1e12\r\n"},
        {"huge_ints", "per_node = 1e30\ncores = 4294967296\n"},
        {"long_line", "name = aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                      "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                      "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                      "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa = 1\n"},
    };
    char name[64];
    pt_hw hw;
    int i;
    for (i = 0; i < 4; i++) {
        if (i < 3) {
            pt_hw_preset(presets[i], &hw);
        } else { /* a calibrated machine (pt_hw_calibrate's fields, rates made up) */
            memset(&hw, 0, sizeof hw);
            snprintf(hw.name, sizeof hw.name, "local");
            hw.peak_flops = 2.5e11, hw.gemm_eff = 1, hw.gemm_dim = 40, hw.attn_flops = 6e10;
            hw.mem_bw = 2e10, hw.mem_bytes = 8e9, hw.kernel_s = 2e-6, hw.per_node = 2;
            hw.intra_bw = 5e9, hw.intra_lat = 3e-6, hw.inter_bw = 5e9, hw.inter_lat = 3e-6;
            hw.cores = 2, hw.exec = PT_EXEC_PTRAIN;
            hw.core_flops = 1.25e11, hw.core_gemm_eff = 1, hw.core_gemm_dim = 30;
            hw.core_attn_flops = 3e10, hw.core_mem_bw = 1.2e10, hw.core_kernel_s = 1e-6;
        }
        if (pt_hw_save(&hw, tmp) != PT_OK) {
            fprintf(stderr, "seeds: %s\n", pt_last_error());
            failed = 1;
            continue;
        }
        snprintf(name, sizeof name, "%s.txt", i < 3 ? presets[i] : "local");
        copy(tmp, "hw", name);
    }
    for (i = 0; i < (int)(sizeof bad / sizeof bad[0]); i++) put("hw", bad[i][0], bad[i][1], strlen(bad[i][1]));
}

/* Hugging Face config.json texts: a LLaMA 3.1 config, a LLaMA 2 one
   without num_key_value_heads, near-valid ones that stop at one check each,
   a GPT-2 config as transformers writes it, and a GPT-2 one whose heads do
   not divide its width. */
static void hf_configs(void) {
    static const char *texts[] = {
        ("{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, \"hidden_act\": "
        "\"silu\", \"hidden_size\": 64, \"intermediate_size\": 176, \"max_position_embeddings\": "
        "128, \"mlp_bias\": false, \"model_type\": \"llama\", \"num_attention_heads\": 4, "
        "\"num_hidden_layers\": 2, \"num_key_value_heads\": 2, \"rms_norm_eps\": 1e-05, "
        "\"rope_scaling\": {\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
        "\"original_max_position_embeddings\": 64, \"rope_type\": \"llama3\"}, \"rope_theta\": "
        "500000.0, \"tie_word_embeddings\": false, \"vocab_size\": 256}"),
        ("{\"hidden_size\": 32, \"intermediate_size\": 88, \"num_attention_heads\": 4, "
        "\"num_hidden_layers\": 1, \"vocab_size\": 32, \"max_position_embeddings\": 16, "
        "\"rope_scaling\": null, \"tie_word_embeddings\": true}"),
        ("{\"hidden_size\": 32, \"intermediate_size\": 88, \"num_attention_heads\": 4, "
        "\"num_key_value_heads\": 3, \"num_hidden_layers\": 1, \"vocab_size\": 32, "
        "\"max_position_embeddings\": 16}"),
        ("{\"hidden_size\": 30, \"intermediate_size\": 88, \"num_attention_heads\": 4, "
        "\"num_hidden_layers\": 1, \"vocab_size\": 32, \"max_position_embeddings\": 16}"),
        "{\"hidden_size\": 32, \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}}",
        "{\"hidden_size\": 32, \"attention_bias\": true, \"mlp_bias\": false}",
        "{\"model_type\": \"gpt2\", \"hidden_size\": 1e309}",
        ("{\"activation_function\": \"gelu_new\", \"architectures\": [\"GPT2LMHeadModel\"], "
        "\"layer_norm_epsilon\": 1e-05, \"model_type\": \"gpt2\", \"n_embd\": 64, \"n_head\": 4, "
        "\"n_inner\": null, \"n_layer\": 2, \"n_positions\": 128, \"vocab_size\": 256}"),
        ("{\"model_type\": \"gpt2\", \"n_embd\": 64, \"n_head\": 5, \"n_layer\": 2, "
        "\"n_positions\": 128, \"vocab_size\": 256, \"tie_word_embeddings\": false}"),
    };
    char name[32];
    int i;
    for (i = 0; i < (int)(sizeof texts / sizeof texts[0]); i++) {
        snprintf(name, sizeof name, "config%d.json", i);
        put("hf_config", name, texts[i], strlen(texts[i]));
    }
}

/* Request bodies for build/serve's parser (fuzz/serve_req.c): valid ones and
   near-valid ones that stop at one check each. */
static void serve_requests(void) {
    static const char *texts[] = {
        "{\"model\": \"m\", \"prompt\": \"the cat \", \"max_tokens\": 16, \"temperature\": 0.8, "
        "\"top_k\": 40, \"seed\": 3, \"stop\": [\"\\n\", \".\"], \"stream\": true, \"n\": 1}",
        "{\"prompt\": [464, 2068, 7586], \"max_tokens\": null, \"stop\": \"x\"}",
        "{\"prompt\": [\"one \\u00e9\\ud83d\\ude00\"], \"seed\": -1}",
        "{\"prompt\": [1, 2, 256]}",
        "{\"prompt\": \"a\", \"max_tokens\": 1e300}",
        "{\"prompt\": \"a\", \"temperature\": 3}",
        "{\"prompt\": \"a\", \"stop\": [\"a\", \"b\", \"c\", \"d\", \"e\"]}",
        "{\"prompt\": \"a\", \"stream\": \"yes\"}",
        "{\"max_tokens\": 3}",
        "{\"prompt\": \"a\"} trailing",
        "[1, 2]",
    };
    char name[32];
    int i;
    for (i = 0; i < (int)(sizeof texts / sizeof texts[0]); i++) {
        snprintf(name, sizeof name, "request%d.json", i);
        put("serve_req", name, texts[i], strlen(texts[i]));
    }
}

/* a token as encoder.json spells it: its byte-level string, JSON-quoted */
static size_t json_bytelevel(char *o, const unsigned char *b, size_t n) {
    size_t i, k = 0;
    o[k++] = '"';
    for (i = 0; i < n; i++) {
        char c[2];
        size_t l = pt_bytelevel_encode(b + i, 1, c);
        if (l == 1 && (c[0] == '"' || c[0] == '\\')) o[k++] = '\\';
        memcpy(o + k, c, l);
        k += l;
    }
    o[k++] = '"';
    return k;
}

/* tokenizers: a small trained one as tokenizer.json (both patterns) and as
   GPT-2's two files (encoder.json NUL vocab.bpe), near-valid variants, and
   texts for the round trip */
static void tokenizers(const char *tmp) {
    static const char *const text =
        "the quick brown fox's 12345 jumps over the lazy dog; THE DOG'LL sleep.\n\n  caf\xc3\xa9 "
        "\xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80 <|endoftext|>    int main(void) { return 0; }\r\n";
    static const char *const texts[] = {
        "\x00Hello world's  end\n", "\x01x = 12345;\n\n\tfoo(bar)\r\n", "\x02" "a<|endoftext|>b",
        "\x03\xff\xfe\xc3\x28 \xe2\x82 caf\xc3\xa9 \xf0\x9f\x98", "\x01    \n\n   x   "};
    static const char arrays[] =
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[[\"a\",\"b\"]]},"
        "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"use_regex\":true},\"added_tokens\":[{\"id\":3,"
        "\"content\":\"<|x|>\"}]}";
    pt_tokenizer tk;
    pt_bpe_train_desc d;
    int k, id;
    size_t i;
    for (k = 0; k < 2; k++) {
        size_t n = 0;
        unsigned char *b;
        memset(&tk, 0, sizeof tk);
        memset(&d, 0, sizeof d);
        d.vocab_size = 320;
        d.pretok = k ? PT_PRETOK_CL100K : PT_PRETOK_GPT2;
        if (pt_bpe_train(&tk, text, strlen(text), &d) != PT_OK || pt_tokenizer_save(&tk, tmp) != PT_OK) {
            fprintf(stderr, "seeds: %s\n", pt_last_error());
            failed = 1;
            return;
        }
        b = slurp(tmp, &n);
        if (b) {
            put("tokenizer_json", k ? "cl100k.json" : "gpt2.json", b, n);
            put("tokenizer_json", k ? "cl100k_truncated.json" : "gpt2_truncated.json", b, n / 2);
        }
        free(b);
        if (k == 0) { /* encoder.json NUL vocab.bpe */
            size_t cap = 64 * (size_t)tk.n_vocab + 64, o = 0;
            char *g = (char *)malloc(cap);
            int *pair = (int *)malloc(2 * sizeof(int) * ((size_t)tk.n_merges + 1)), a, c, r;
            if (!g || !pair) {
                free(g);
                free(pair);
                return;
            }
            o += (size_t)sprintf(g, "{");
            for (id = 0; id < tk.n_vocab; id++) {
                size_t len;
                const unsigned char *t = pt_tokenizer_bytes(&tk, id, &len);
                o += json_bytelevel(g + o, t, len);
                o += (size_t)sprintf(g + o, ": %d%s", id, id + 1 < tk.n_vocab ? ", " : "}");
            }
            g[o++] = 0;
            o += (size_t)sprintf(g + o, "#version: 0.2\n");
            for (a = 0; a < tk.n_vocab; a++) /* the merges by rank */
                for (c = 0; c < tk.n_vocab; c++)
                    if ((r = pt_tokenizer_merge(&tk, a, c, NULL)) >= 0 && r < tk.n_merges)
                        pair[2 * r] = a, pair[2 * r + 1] = c;
            for (r = 0; r < tk.n_merges; r++) {
                size_t la, lb;
                const unsigned char *ta = pt_tokenizer_bytes(&tk, pair[2 * r], &la);
                const unsigned char *tc = pt_tokenizer_bytes(&tk, pair[2 * r + 1], &lb);
                o += pt_bytelevel_encode(ta, la, g + o);
                g[o++] = ' ';
                o += pt_bytelevel_encode(tc, lb, g + o);
                g[o++] = '\n';
            }
            put("tokenizer_gpt2", "gpt2", g, o);
            put("tokenizer_gpt2", "gpt2_truncated", g, o - 7);
            free(g);
            free(pair);
        }
        pt_tokenizer_free(&tk);
    }
    put("tokenizer_json", "arrays.json", arrays, sizeof arrays - 1);
    put("tokenizer_gpt2", "tiny", "{\"a\": 0}\0#version: 0.2\na a\n", 27);
    for (i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "text%zu", i);
        put("text_roundtrip", name, texts[i], i == 0 ? 20 : strlen(texts[i]));
    }
    remove(tmp);
}

int main(int argc, char **argv) {
    char tmp[1024];
    if (argc != 2) {
        fprintf(stderr, "usage: seeds DIR\n");
        return 2;
    }
    out_dir = argv[1];
    mkdir(out_dir, 0755);
    snprintf(tmp, sizeof tmp, "%s/.tmp.safetensors", out_dir);
    checkpoints(tmp);
    hugging_face(tmp);
    fixtures(tmp);
    headers();
    tokens();
    arguments();
    plan_arguments();
    hardware(tmp);
    hf_configs();
    serve_requests();
    remove(tmp);
    snprintf(tmp, sizeof tmp, "%s/.tmp.json", out_dir);
    tokenizers(tmp);
    remove(tmp);
    return failed;
}
