/* duo.h — DuoAttention's head split (duo.c), for its test. */
#ifndef KVB_DUO_H
#define KVB_DUO_H

#include <stdint.h>

#include "methods/method.h"

/* Tokens per head after prefill, keep[l * n_head_kv + g], for a prompt of n tokens and `budget` tokens per head:
 * over the heads of the layers with global[l] set, the top R = floor(H (budget - s) / (n - s)) by score (s = sink +
 * recent; R = 0 when budget <= s; every head when budget >= n; ties: lower layer, then lower head) keep n, the others
 * share H budget - R n evenly, the higher-scoring ones one more; heads of other layers keep n. Returns R, or -1 on
 * out of memory. */
int kvb_duo_split(int n_layer, int n_head_kv, const unsigned char *global, const double *score, int64_t n, int64_t budget,
                  int64_t sink, int64_t recent, int64_t *keep);

#endif
