/* fixture.c -- fuzzes the fixture loader of tests/fixture_check.c: the
   metadata, model shape and batch of a ptrain-fixture-v1 file
   (fixture_read), after the safetensors reader. See fuzz.h. */
#define main fixture_check_main /* the program's own main is not run */
#include "../tests/fixture_check.c"
#undef main
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    pt_safetensors st;
    job j;
    memset(&st, 0, sizeof st);
    memset(&j, 0, sizeof j);
    if (pt_st_parse(&st, data, size) != PT_OK) return 0;
    fixture_read(&st, &j);
    free((void *)j.inputs);
    free((void *)j.targets);
    pt_st_free(&st);
    return 0;
}
