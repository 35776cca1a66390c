/* keydiff.h — KeyDiff's score (keydiff.c), shared with the methods that rank by it (decoding.c). */
#ifndef KVB_KEYDIFF_H
#define KVB_KEYDIFF_H

#include <stdint.h>

#include "methods/method.h"

/* the largest head_dim the score takes (its constant rmsnorm weights) */
#define KD_MAX_DIM 512

/* score[j] = -d cos(k_j, a), a = mean_i k_i / ||k_i||, for the n slots of layer l's KV head g (position order
 * after prefill), on the backend; kf, kn: [n][d] scratch, a, an: [d] scratch, score: [n] (all device). */
int kvb_keydiff_scores(kvb_ctx *c, int l, int g, int64_t n, float *kf, float *kn, float *a, float *an, float *score,
                       char *err, size_t err_len);

#endif
