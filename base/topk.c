/* topk.c — the k best of a host array in slot order: a radix select of the k-th best key, then one ordered pass.
 * The CUDA backend's k_topk_radix (kernels/cuda/kvops.cu) makes the same selection the same way on the device. */
#include "base/topk.h"

#include <math.h>
#include <string.h>

/* A float's rank as an unsigned key: larger numbers larger keys, -0 the same as +0, every NaN 0 (below -inf,
 * whose key is 0x007fffff). Equal keys are exactly the ties of the order, which then go to the lower slot. */
static inline uint32_t order_key(float v) {
    if (isnan(v)) return 0u;
    if (v == 0.0f) v = 0.0f;
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}


void kvb_topk_slots(const float *x, int64_t n, int64_t k, int32_t *idx_out) {
    if (k > n) k = n;
    if (k <= 0) return;
    /* MSB first, the digits bits [21, 32), [10, 21) and [0, 10): after each pass, `prefix` holds the chosen high
     * bits of the k-th best key T and `need` its rank among the slots that share them (1 = the best of them) */
    static const int lo_bit[4] = {32, 21, 10, 0};
    uint32_t prefix = 0;
    int64_t need = k;
    for (int p = 1; p < 4; p++) {
        const int s = lo_bit[p], high = lo_bit[p - 1]; /* this digit's bits: [s, high) */
        const uint32_t digit_mask = (1u << (high - s)) - 1;
        int64_t hist[1 << 11];
        memset(hist, 0, (size_t)(digit_mask + 1) * sizeof hist[0]);
        for (int64_t i = 0; i < n; i++) {
            const uint32_t key = order_key(x[i]);
            if (high < 32 && (key >> high) != (prefix >> high)) continue;
            hist[(key >> s) & digit_mask]++;
        }
        int64_t d = digit_mask;
        for (; d > 0 && hist[d] < need; d--) need -= hist[d];
        prefix |= (uint32_t)d << s;
    }
    /* every slot with a key above T, and the first `need` slots with key T */
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        const uint32_t key = order_key(x[i]);
        if (key > prefix || (key == prefix && need-- > 0)) idx_out[m++] = (int32_t)i;
    }
}
