/* serve_model.h -- a model for inference, as build/sample loads it: a ptrain
   checkpoint, a Hugging Face GPT-2 or LLaMA directory, or such a
   model.safetensors with its config.json; its tokenizer (--tokenizer, else a
   model directory's tokenizer.json) checked against it. build/serve and
   build/eval load through it. Needs ptrain.h's implementation and cli.h. */
#ifndef PTRAIN_SERVE_MODEL_H
#define PTRAIN_SERVE_MODEL_H

typedef struct serve_model {
    pt_gpt_config cfg;
    pt_gpt gpt;
    pt_tokenizer tk;
    int has_tk; /* text through tk; else bytes (vocab_size 256) or token ids only */
    char tok_path[4200];
} serve_model;

/* 1, or 0 after printing the error. */
static inline int serve_model_load(serve_model *s, const char *model, const char *tok) {
    pt_gpt_desc desc;
    memset(s, 0, sizeof *s);
    if (pt_gpt_config_from_file(model, 0, &s->cfg) != PT_OK) goto fail;
    if (tok) snprintf(s->tok_path, sizeof s->tok_path, "%s", tok);
    else if (!cli_model_tokenizer(model, s->tok_path, sizeof s->tok_path)) s->tok_path[0] = 0;
    if (s->tok_path[0]) {
        if (pt_tokenizer_load(&s->tk, s->tok_path) != PT_OK) goto fail;
        s->has_tk = 1;
        if (s->tk.n_vocab > s->cfg.vocab_size) {
            fprintf(stderr, "error: the tokenizer %s has %d ids but the model's vocab_size is %d: "
                            "not this model's tokenizer\n", s->tok_path, s->tk.n_vocab,
                    s->cfg.vocab_size);
            return 0;
        }
    }
    memset(&desc, 0, sizeof desc);
    desc.config = s->cfg;
    desc.batch = 1;
    desc.seq = 1;
    desc.inference = 1; /* weights only */
    if (pt_gpt_init(&s->gpt, &desc) != PT_OK || pt_gpt_load_weights(&s->gpt, model) != PT_OK)
        goto fail;
    return 1;
fail:
    fprintf(stderr, "error: %s\n", pt_last_error());
    return 0;
}

static inline void serve_model_free(serve_model *s) {
    pt_gpt_free(&s->gpt);
    if (s->has_tk) pt_tokenizer_free(&s->tk);
}

/* Text into ids (room for n + 1): the tokenizer's (special tokens allowed),
   or bytes for a byte-level model. The count, or -1 (no way to read text). */
static inline int serve_model_encode(const serve_model *s, const char *text, size_t n, int *ids) {
    size_t i, k = n + 1;
    if (s->has_tk) return pt_tokenizer_encode(&s->tk, text, n, 1, ids, &k) == PT_OK ? (int)k : -1;
    if (s->cfg.vocab_size != 256) return -1;
    for (i = 0; i < n; i++) ids[i] = (unsigned char)text[i];
    return (int)n;
}

/* The bytes of token id (NULL, 0 when it has none: an id-only model). */
static inline const unsigned char *serve_model_bytes(const serve_model *s, int id, size_t *len,
                                                     unsigned char *byte) {
    if (s->has_tk) return pt_tokenizer_bytes(&s->tk, id, len);
    *len = s->cfg.vocab_size == 256 ? 1 : 0;
    *byte = (unsigned char)id;
    return *len ? byte : NULL;
}

#endif
