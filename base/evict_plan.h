/* evict_plan.h — kv_evict by position (no scores) of many slots at once, planned on the host: the CPU backend
 * applies the plan with memcpy, the CUDA backend with two gathers (kernels/cuda/kvops.cu), so both leave a head
 * exactly as the one-at-a-time loop of kernels/backend.h does (each victim the lowest position in [lo, hi), the
 * last slot moved into its place) without a scan per eviction (PoD spills thousands of slots after prefill). */
#ifndef KVB_EVICT_PLAN_H
#define KVB_EVICT_PLAN_H

#include <stddef.h>
#include <stdint.h>

/* Plan the eviction of `count` of the n slots whose positions pos[0..n) lie in [lo, hi). With distinct
 * positions the victims are the `count` lowest there, in ascending order, whatever the moves; so
 * spill[c] = the slot that holds the c-th victim now (the loop's spill order, read before any move), and the
 * survivors that move are dst[i] <- src[i], i < *n_moves <= count, every src at or past n - count and every dst
 * below it: the moves read no slot another move writes, in any order. spill, dst and src hold count entries.
 * 1 = planned; 0 = positions in [lo, hi) repeat (ties go by slot, which the moves reorder: run the loop) or no
 * memory; -1 + err = fewer than count slots in [lo, hi). */
int kvb_evict_plan(const int32_t *pos, int64_t n, int32_t lo, int32_t hi, int64_t count, int64_t *spill, int64_t *dst,
                   int64_t *src, int64_t *n_moves, char *err, size_t err_len);

#endif
