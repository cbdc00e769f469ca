/* tokens.c -- fuzzes the token file loader: llm.c token files (version 1,
   and ptrain's version 2 of uint32 ids) in memory (pt_tokens_parse_llmc) and
   from a path (pt_tokens_load picks the format by the ".bin" name), raw
   bytes, and the batches a loader cuts from them with a batch, sequence
   length and resume position taken from the input. See fuzz.h. */
#define _POSIX_C_SOURCE 200809L /* fuzz.h: getpid, opendir, stat */
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"
#include "fuzz.h"

/* Batches from both splits of t, shaped by four bytes of the input. */
static void batches(const pt_tokens *t, const uint8_t *data, size_t size) {
    uint8_t k[4] = {0, 0, 0, 0};
    pt_loader_desc d;
    pt_split split;
    int in[4 * 32], out[4 * 32], i;
    memcpy(k, data, size < 4 ? size : 4);
    memset(&d, 0, sizeof d);
    d.batch = 1 + k[0] % 4;
    d.seq = 1 + k[1] % 32;
    d.val_fraction = (float)(k[2] % 10) / 10.0f; /* 0: the default 0.1 */
    d.seed = k[3];
    if (pt_tokens_check(t, t->vocab_size) != PT_OK) return;
    for (split = PT_SPLIT_ALL; split <= PT_SPLIT_VAL; split++) {
        pt_loader l;
        memset(&l, 0, sizeof l);
        if (pt_loader_init(&l, t, split, &d) != PT_OK) continue;
        pt_loader_seek(&l, k[3], (size_t)k[2] * 7); /* as a checkpoint's data_pos would */
        for (i = 0; i < 3; i++) pt_loader_next(&l, in, i % 2 ? NULL : out);
        pt_loader_free(&l);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    pt_tokens t, f;
    size_t i;
    const char *path = fuzz_file(data, size, ".bin");
    pt_status s;
    memset(&t, 0, sizeof t);
    memset(&f, 0, sizeof f);
    s = pt_tokens_parse_llmc(&t, data, size);
    if (s == PT_OK) batches(&t, data + 1024 - 4, 4); /* the header's last, unused bytes */
    /* the same bytes through the file loader: the same verdict and tokens */
    if (path && (pt_tokens_load(&f, path, PT_TOKENS_AUTO) == PT_OK) != (s == PT_OK)) abort();
    if (s == PT_OK && (f.n != t.n || !f.data != !t.data)) abort();
    for (i = 0; s == PT_OK && i < t.n; i++)
        if (pt_tokens_at(&f, i) != pt_tokens_at(&t, i)) abort();
    pt_tokens_free(&t);
    pt_tokens_free(&f);
    if (pt_tokens_from_bytes(&t, data, size) == PT_OK) batches(&t, data, size);
    pt_tokens_free(&t);
    return 0;
}
