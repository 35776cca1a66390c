/* topk.h — the one top-k of host arrays: the CPU backend's topk_idx op and the methods' host-side helpers
 * (methods/helpers.c, calibration) share its order, so a selection made on the host and one made by the CPU
 * backend keep the same slots. */
#ifndef KVB_TOPK_H
#define KVB_TOPK_H

#include <stdint.h>

/* The slots of the k largest values of x[0..n) in ascending slot order: larger value first, ties broken by lower
 * slot, -0 equal to +0, NaN ranked below every number; k is clamped to n, k <= 0 writes nothing. O(n): four
 * reads of x, no allocation. */
void kvb_topk_slots(const float *x, int64_t n, int64_t k, int32_t *idx_out);

#endif
