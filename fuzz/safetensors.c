/* safetensors.c -- fuzzes the safetensors reader (pt_st_parse), every
   tensor read through pt_st_read_f32/_i32, and the model built from the
   file (pt_gpt_config_from_st, pt_gpt_load_weights_st). See fuzz.h. */
#define _POSIX_C_SOURCE 200809L /* fuzz.h: getpid, opendir, stat */
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"
#include "fuzz.h"

#define FUZZ_MAX_PARAMS (1 << 20) /* bigger models only have their config checked */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    pt_safetensors st;
    pt_gpt_config cfg;
    int i;
    memset(&st, 0, sizeof st);
    if (pt_st_parse(&st, data, size) != PT_OK) return 0;
    for (i = 0; i < st.n_meta; i++) pt_st_meta_get(&st, st.meta[i].key);
    for (i = 0; i < st.n_tensors; i++) {
        const pt_st_tensor *t = pt_st_find(&st, st.tensors[i].name);
        /* the reader checked that the bytes hold the shape: at most size/1 elements */
        size_t n = (size_t)(t->end - t->begin) / pt_dtype_size(t->dtype);
        void *buf = malloc(n * 4 + 4);
        if (buf) {
            pt_st_read_f32(&st, t->name, (float *)buf, t->ndim, t->shape);
            pt_st_read_i32(&st, t->name, (int *)buf, t->ndim, t->shape);
        }
        free(buf);
    }
    if (pt_gpt_config_from_st(&st, 0, &cfg) == PT_OK && pt_gpt_num_params(&cfg) <= FUZZ_MAX_PARAMS) {
        pt_gpt m;
        pt_gpt_desc d;
        memset(&d, 0, sizeof d);
        d.config = cfg, d.batch = 1, d.seq = 1, d.inference = 1;
        if (pt_gpt_init(&m, &d) == PT_OK) {
            pt_gpt_load_weights_st(&m, &st);
            pt_gpt_free(&m);
        }
    }
    pt_st_free(&st);
    return 0;
}
