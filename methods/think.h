/* think.h — what tests read of ThinK (think.c): the key channels a head kept. */
#ifndef KVB_THINK_H
#define KVB_THINK_H

#include <stdint.h>

#include "methods/method.h"

/* The key channels (layer, KV head h) kept after prefill, ascending, into out (host, head_dim entries): their count,
 * 0 when the heads stayed whole (nothing pruned, or a sliding-window layer), -1 + err on a failed copy. m must be a
 * ThinK instance. */
int kvb_think_channels(kvb_method *m, kvb_ctx *c, int layer, int h, int32_t *out, char *err, size_t err_len);

#endif
