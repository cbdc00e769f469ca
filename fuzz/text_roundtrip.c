/* text_roundtrip.c -- decode(encode(x)) == x for any bytes x, with both
   pre-tokenizers, special tokens allowed or not, through a tokenizer that
   pt_bpe_train learns once from a fixed text; the parallel encoder equals the
   serial one, and pt_utf8_stream passes every byte on exactly once. The
   first input byte picks the pattern and flags. See fuzz.h. */
#define _POSIX_C_SOURCE 200809L /* fuzz.h: getpid, opendir, stat */
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"
#include "fuzz.h"

static pt_tokenizer g_tk[2];

static void train_once(void) {
    static const char *const text =
        "the quick brown fox's 12345 jumps over the lazy dog; THE DOG'LL sleep.\n\n  "
        "caf\xc3\xa9 na\xc3\xafve \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80\xf0\x9f\x98\x80 <|endoftext|>"
        "    int main(void) { return 0; }\r\n\t\tx = y + 42;\n";
    pt_bpe_train_desc d;
    char buf[4096];
    int k, i;
    size_t n = 0;
    for (i = 0; i < 8; i++) {
        memcpy(buf + n, text, strlen(text));
        n += strlen(text);
    }
    for (k = 0; k < 2; k++) {
        memset(&d, 0, sizeof d);
        d.vocab_size = 400;
        d.pretok = k ? PT_PRETOK_CL100K : PT_PRETOK_GPT2;
        d.threads = 1;
        if (pt_bpe_train(&g_tk[k], buf, n, &d) != PT_OK) abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const pt_tokenizer *tk;
    int *ids, *ids2;
    unsigned char *out;
    char *st;
    size_t n = 0, n2 = 0, m = 0, i, o = 0;
    int flags;
    pt_utf8_stream us;
    if (!g_tk[0].tok_off) train_once();
    if (size < 1) return 0;
    flags = data[0];
    tk = &g_tk[flags & 1];
    data++, size--;
    ids = (int *)malloc(sizeof(int) * (size + 1));
    ids2 = (int *)malloc(sizeof(int) * (size + 1));
    out = (unsigned char *)malloc(size + 1);
    st = (char *)malloc(size + 8);
    if (ids && ids2 && out && st) {
        if (pt_tokenizer_encode(tk, data, size, flags & 2, ids, &n) != PT_OK) abort();
        if (pt_tokenizer_decode(tk, ids, n, out, size, &m) != PT_OK || m != size ||
            (size && memcmp(out, data, size) != 0))
            abort();
        if (pt_tokenizer_encode_parallel(tk, data, size, flags & 2, 2, ids2, &n2, NULL, NULL) != PT_OK ||
            n2 != n || (n && memcmp(ids, ids2, n * sizeof(int)) != 0))
            abort();
        /* token by token through the stream: the same bytes */
        memset(&us, 0, sizeof us);
        for (i = 0; i < n; i++) {
            size_t len;
            const unsigned char *b = pt_tokenizer_bytes(tk, ids[i], &len);
            char tmp[4096];
            size_t got;
            if (!b || len + 3 > sizeof tmp) abort();
            got = pt_utf8_stream_put(&us, b, len, tmp);
            if (o + got > size) abort();
            memcpy(st + o, tmp, got);
            o += got;
        }
        o += pt_utf8_stream_flush(&us, st + o);
        if (o != size || (size && memcmp(st, data, size) != 0)) abort();
    }
    free(ids);
    free(ids2);
    free(out);
    free(st);
    return 0;
}
