/* candidate.h — the switches of the candidate kernels (KVB_ATTN_KERNEL, KVB_PREFILL_TC, KVB_GEMV_KERNEL,
 * KVB_PROBS_KERNEL): each reads its variable once, unless a setter (the tests', --cuda-kernels) chose first. */
#ifndef KVB_CUDA_CANDIDATE_H
#define KVB_CUDA_CANDIDATE_H

#include <stdlib.h>

/* *cur: 0 = not chosen yet, 1 = off, 2 = on; on first use on iff $var reads as the number `on` */
static inline int kvb_switch_on(int *cur, const char *var, int on) {
    if (!*cur) {
        const char *v = getenv(var);
        *cur = v && atoi(v) == on ? 2 : 1;
    }
    return *cur == 2;
}

/* *cur: 0 = not chosen yet, else the kernel (1..n); on first use $var when it reads as one of 1..n, else dflt */
static inline int kvb_switch_pick(int *cur, const char *var, int n, int dflt) {
    if (!*cur) {
        const char *v = getenv(var);
        const int k = v && *v ? atoi(v) : 0;
        *cur = k >= 1 && k <= n ? k : dflt;
    }
    return *cur;
}

#endif
