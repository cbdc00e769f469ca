/* serve_req.c -- fuzzes build/serve's request parser (common/serve_req.h:
   the body of POST /v1/completions): the input is the body. A request it
   takes must hold ids in the vocabulary and stop strings of 1..64 bytes; one
   it refuses must say why. Whatever it holds is then written back as JSON
   (serve_json_str, serve_error_json), which must be valid UTF-8 with every
   control byte escaped. See fuzz.h. */
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"
#include "../common/serve_req.h"
#include "fuzz.h"

/* b is JSON-safe text: no control byte, no invalid UTF-8 left unescaped */
static void check_json(const serve_buf *b) {
    size_t i;
    for (i = 0; i < b->n; i++)
        if ((unsigned char)b->p[i] < 0x20) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    serve_req r;
    serve_buf b;
    int i;
    memset(&b, 0, sizeof b);
    if (serve_req_parse(&r, (const char *)data, size, 256) == 0) {
        for (i = 0; r.prompt_is_ids && i < r.n_ids; i++)
            if (r.ids[i] < 0 || r.ids[i] >= 256) abort();
        for (i = 0; i < r.n_stop; i++)
            if (!r.stop[i][0] || strlen(r.stop[i]) > SERVE_STOP_LEN) abort();
        if (r.max_tokens < 0 || !(r.temperature >= 0.0f && r.temperature <= 2.0f)) abort();
        if (!r.prompt_is_ids) serve_json_str(&b, r.text, r.text_len);
    } else {
        if (!r.err[0]) abort(); /* a refusal always says why */
        serve_error_json(&b, r.err, "invalid_request_error", r.param, NULL);
    }
    serve_json_str(&b, (const char *)data, size); /* any bytes */
    check_json(&b);
    free(b.p);
    serve_req_free(&r);
    return 0;
}
