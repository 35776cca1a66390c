/* flashinfer_layout.c — the page layout FlashInfer reads kvbench's KV store through (flashinfer_layout.h).
 * Plain C, built in every configuration so the CPU tests hold it. */
#include "kernels/cuda/flashinfer_layout.h"

#include <stdio.h>

int kvb_fi_layout_plan(int n_heads, const uintptr_t *k, const uintptr_t *v, const int64_t *n_kv, const int64_t *len,
                       size_t row_bytes, kvb_fi_layout *lay, int32_t *head_row, int32_t *indptr, char *err,
                       size_t err_len) {
    if (n_heads < 1 || row_bytes == 0) {
        snprintf(err, err_len, "flashinfer: %d KV heads, %zu-byte rows", n_heads, row_bytes);
        return -1;
    }
    uintptr_t base = k[0];
    for (int g = 1; g < n_heads; g++)
        if (k[g] < base) base = k[g];
    /* V at one distance from K for every head (modulo 2^64: a V below its K is as good) */
    const uintptr_t delta = v[0] - k[0];
    int64_t total = 0;
    indptr[0] = 0;
    for (int g = 0; g < n_heads; g++) {
        if (v[g] - k[g] != delta) {
            snprintf(err, err_len, "flashinfer: not one slab: KV head %d's V is not at KV head 0's distance from its K "
                                    "(an allocation of its own, or a head moved to the host tier)", g);
            return -1;
        }
        const uintptr_t off = k[g] - base;
        if (off % row_bytes) {
            snprintf(err, err_len,
                     "flashinfer: not one slab: KV head %d's rows are not aligned to %zu-byte rows from the lowest head", g,
                     row_bytes);
            return -1;
        }
        const uintptr_t row = off / row_bytes;
        /* the last page of the head must fit int32: row + n_kv - 1 <= INT32_MAX */
        if (n_kv[g] < 0 || len[g] < 0 || row > (uintptr_t)INT32_MAX || (uint64_t)n_kv[g] > (uint64_t)INT32_MAX - row + 1) {
            snprintf(err, err_len, "flashinfer: not one slab: KV head %d's pages (row %llu, %lld slots) pass int32", g,
                     (unsigned long long)row, (long long)n_kv[g]);
            return -1;
        }
        if (len[g] < 1) {
            snprintf(err, err_len, "flashinfer: KV head %d's list is empty", g);
            return -1;
        }
        head_row[g] = (int32_t)row;
        total += len[g];
        if (total > INT32_MAX) {
            snprintf(err, err_len, "flashinfer: the lists hold %lld entries together, past int32", (long long)total);
            return -1;
        }
        indptr[g + 1] = (int32_t)total;
    }
    lay->k_base = base;
    lay->v_base = base + delta;
    lay->total = total;
    return 0;
}

int kvb_fi_decode_shape_ok(int group, int head_dim, int kv_f16) {
    const int group_ok = group == 1 || group == 2 || group == 3 || group == 4 || group == 6 || group == 8 || group == 16;
    return kv_f16 && group_ok && (head_dim == 64 || head_dim == 128 || head_dim == 256);
}
