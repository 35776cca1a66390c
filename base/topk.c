/* topk.c — a heap of the k best kept in the output, sorted in place at the end. */
#include "base/topk.h"

#include <math.h>

/* total order for top-k: larger value first, NaN after every number, then lower index first */
static int ranks_before(const float *x, int32_t a, int32_t b) {
    const float va = x[a], vb = x[b];
    const int na = isnan(va), nb = isnan(vb);
    if (na != nb) return nb;
    if (!na && va != vb) return va > vb;
    return a < b;
}

/* heap whose root is the element that ranks last among those kept */
static void heap_sift_down(const float *x, int32_t *h, int64_t n, int64_t i) {
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, worst = i;
        if (l < n && ranks_before(x, h[worst], h[l])) worst = l;
        if (r < n && ranks_before(x, h[worst], h[r])) worst = r;
        if (worst == i) return;
        int32_t t = h[i];
        h[i] = h[worst];
        h[worst] = t;
        i = worst;
    }
}

void kvb_topk(const float *x, int64_t n, int64_t k, int32_t *idx_out) {
    if (k > n) k = n;
    if (k <= 0) return;
    int32_t *h = idx_out; /* the heap is built in the output and sorted in place at the end */
    for (int64_t i = 0; i < k; i++) h[i] = (int32_t)i;
    for (int64_t i = k / 2; i-- > 0;) heap_sift_down(x, h, k, i);
    for (int64_t i = k; i < n; i++) {
        if (ranks_before(x, (int32_t)i, h[0])) {
            h[0] = (int32_t)i;
            heap_sift_down(x, h, k, 0);
        }
    }
    /* heapsort: the root ranks last, so moving it to the end leaves the array in rank order */
    for (int64_t m = k; m > 1; m--) {
        int32_t t = h[0];
        h[0] = h[m - 1];
        h[m - 1] = t;
        heap_sift_down(x, h, m - 1, 0);
    }
}
