/* fixture.c -- fuzzes the fixture reader (tests/fixture.h, as
   tests/fixture_check.c uses it): the metadata, model shape and batch of a
   ptrain-fixture-v1 file, after the safetensors reader. See fuzz.h. */
#define _POSIX_C_SOURCE 200809L
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"
#include "../tests/fixture.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    pt_safetensors st;
    fixture f;
    memset(&st, 0, sizeof st);
    memset(&f, 0, sizeof f);
    if (pt_st_parse(&st, data, size) != PT_OK) return 0;
    fixture_read(&st, &f);
    fixture_free(&f);
    pt_st_free(&st);
    return 0;
}
