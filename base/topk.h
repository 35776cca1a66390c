/* topk.h — the one top-k of host arrays: the CPU backend's top-k op and the methods' host-side helpers
 * (methods/helpers.c, calibration) share its order, so a selection made on the host and one made by the CPU
 * backend keep the same slots. */
#ifndef KVB_TOPK_H
#define KVB_TOPK_H

#include <stdint.h>

/* Indices of the k largest values of x[0..n), sorted by value descending, ties broken by lower index, NaN
 * ranked below every number; k is clamped to n, k <= 0 writes nothing. O(n log k), no allocation. */
void kvb_topk(const float *x, int64_t n, int64_t k, int32_t *idx_out);

#endif
