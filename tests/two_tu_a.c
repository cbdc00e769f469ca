/* Second translation unit: declarations only (the header must be includable
   everywhere while one file holds the implementation). */
#include "../ptrain.h"

int two_tu_status_count(void);
int two_tu_status_count(void) {
    return (int)PT_STATUS_COUNT + (pt_status_str(PT_ERR_FORMAT)[0] == 'P');
}
