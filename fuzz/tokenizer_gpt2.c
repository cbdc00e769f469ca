/* tokenizer_gpt2.c -- fuzzes GPT-2's two-file reader
   (pt_tokenizer_parse_gpt2): the input is encoder.json, a NUL byte, then
   vocab.bpe. A tokenizer it accepts must encode the input as text and decode
   it back exactly. See fuzz.h. */
#define _POSIX_C_SOURCE 200809L /* fuzz.h: getpid, opendir, stat */
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    pt_tokenizer tk;
    const uint8_t *nul = (const uint8_t *)memchr(data, 0, size);
    size_t ne = nul ? (size_t)(nul - data) : size, n = 0, m = 0;
    int *ids;
    unsigned char *out;
    memset(&tk, 0, sizeof tk);
    if (pt_tokenizer_parse_gpt2(&tk, data, ne, nul ? nul + 1 : data + size, nul ? size - ne - 1 : 0) != PT_OK)
        return 0;
    ids = (int *)malloc(sizeof(int) * (size + 1));
    out = (unsigned char *)malloc(size + 1);
    if (ids && out && pt_tokenizer_encode(&tk, data, size, 1, ids, &n) == PT_OK) {
        if (pt_tokenizer_decode(&tk, ids, n, out, size, &m) != PT_OK || m != size ||
            memcmp(out, data, size) != 0)
            abort();
    }
    free(ids);
    free(out);
    pt_tokenizer_free(&tk);
    return 0;
}
