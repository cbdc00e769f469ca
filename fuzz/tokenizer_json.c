/* tokenizer_json.c -- fuzzes the Hugging Face tokenizer.json reader
   (pt_tokenizer_parse_hf); a tokenizer it accepts must encode the input
   itself as text and decode it back exactly, and save and load back to the
   same tokenizer. See fuzz.h. */
#define _POSIX_C_SOURCE 200809L /* fuzz.h: getpid, opendir, stat */
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    pt_tokenizer tk, back;
    int *ids;
    unsigned char *out;
    size_t n = 0, m = 0;
    const char *path;
    memset(&tk, 0, sizeof tk);
    memset(&back, 0, sizeof back);
    if (pt_tokenizer_parse_hf(&tk, data, size) != PT_OK) return 0;
    ids = (int *)malloc(sizeof(int) * (size + 1));
    out = (unsigned char *)malloc(size + 1);
    if (ids && out && pt_tokenizer_encode(&tk, data, size, size & 1, ids, &n) == PT_OK) {
        if (pt_tokenizer_decode(&tk, ids, n, out, size, &m) != PT_OK || m != size ||
            memcmp(out, data, size) != 0)
            abort();
    }
    path = fuzz_file((const uint8_t *)"", 0, ".json");
    if (path && pt_tokenizer_save(&tk, path) == PT_OK) {
        if (pt_tokenizer_load(&back, path) != PT_OK || back.fingerprint != tk.fingerprint) abort();
        pt_tokenizer_free(&back);
    }
    free(ids);
    free(out);
    pt_tokenizer_free(&tk);
    return 0;
}
