/* First translation unit: the implementation, linked with two_tu_a.c. */
#define PTRAIN_IMPLEMENTATION
#include "../ptrain.h"
#include <stdio.h>

int two_tu_status_count(void);
int main(void) {
    pt_gpt_config c;
    if (pt_gpt_config_preset("tiny", &c) != PT_OK) return 1;
    if (two_tu_status_count() != (int)PT_STATUS_COUNT + 1) return 1;
    printf("two translation units: ok (%d statuses)\n", (int)PT_STATUS_COUNT);
    return 0;
}
