/* flashinfer_layout.h — how kvbench's KV store is handed to FlashInfer's paged attention (attention kernel 5,
 * kernels/cuda/flashinfer.cu), in plain C so the CPU tests can check it (tests/test_flashinfer_layout.c).
 *
 * FlashInfer's paged KV takes one K base, one V base and int32 page indices shared by K and V. With page size 1 a
 * page is one row, so each KV head becomes its own request (num_kv_heads = 1, num_qo_heads = the GQA group) whose
 * page indices are
 *     page = head_row[g] + slot,   head_row[g] = (k[g] - k_base) / row_bytes,   k_base = min_g k[g],
 * with v_base = k_base + (v[g] - k[g]), which must be the same for every head (one index addresses both rows).
 * The KV store's slab layout (engine/kvcache.h: kvc_slab, the default with kernel 5) is such a layer: head g's K
 * rows at slab.k + g x cap rows, its V rows at slab.v + g x cap rows, so head_row[g] = g x cap + off[g] - off_min
 * (off: the head's dropped front) and v - k = slab.v - slab.k for every head. No copy. Anything else is "not one
 * slab" and refused, and kvbench's own kernels run: heads whose rows are off the row grid from the lowest, whose V
 * sits at another distance from K (one allocation per head, or a head of a slab layer moved to the host tier),
 * pages past int32 (a slab of heads x cap >= 2^31 rows), list entries past int32 together, or an empty list
 * (kvb_fi_layout_plan says which).
 *
 * FlashInfer's log-sum-exp is base 2 (log2 sum 2^(s log2 e)); kvbench's is natural: lse = lse2 * ln 2.
 *
 * Mask rule (FlashInfer is used only where its mask gives kvbench's answer; otherwise kernel 5 falls back):
 *   decode (one query): FlashInfer attends over the whole list, so it is used when kvbench's mask hides none of
 *     the listed keys: no positions, or every listed key with k_pos <= q_pos (and inside the window);
 *   prefill (several queries): FlashInfer's causal mask (query t sees list entries j <= t + len - n_q) equals
 *     kvbench's when there are no index lists, no window, and every head's positions are its slots in order
 *     ending at the last query: k_pos[g][j] = q_pos[n_q-1] - (n_kv[g]-1) + j and q_pos[t] = q_pos[0] + t;
 *     without positions, no mask at all. */
#ifndef KVB_CUDA_FLASHINFER_LAYOUT_H
#define KVB_CUDA_FLASHINFER_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__CUDACC__)
#define KVB_FI_HD __host__ __device__
#else
#define KVB_FI_HD
#endif

/* the most KV heads (requests) one call of kernel 5 plans for */
#define KVB_FI_MAX_HEADS 1024

/* where the heads' rows sit for FlashInfer */
typedef struct {
    uintptr_t k_base, v_base; /* FlashInfer's k_data and v_data */
    int64_t total;            /* page indices of all heads together (the sum of the list lengths) */
} kvb_fi_layout;

/* Plan the layout of n_heads KV heads: k[g], v[g] their rows' addresses, n_kv[g] their slots, len[g] the entries
 * their list holds (n_kv[g] for a whole head), row_bytes one row (head_dim x element size). Fills lay, head_row[g]
 * (the page of slot 0 of head g) and indptr[0..n_heads] (the prefix sums of len, FlashInfer's request boundaries).
 * Returns 0, or -1 with the reason in err when FlashInfer cannot address these heads (the caller falls back). */
int kvb_fi_layout_plan(int n_heads, const uintptr_t *k, const uintptr_t *v, const int64_t *n_kv, const int64_t *len,
                       size_t row_bytes, kvb_fi_layout *lay, int32_t *head_row, int32_t *indptr, char *err,
                       size_t err_len);

/* the page of list entry `slot` (a slot number: j itself for a whole head, idx[g][j] for a list) of a head */
static inline KVB_FI_HD int32_t kvb_fi_page(int32_t head_row, int32_t slot) { return head_row + slot; }

/* FlashInfer's base-2 log-sum-exp as kvbench's natural one (-inf stays -inf) */
static inline KVB_FI_HD float kvb_fi_lse_natural(float lse2) { return lse2 * 0.69314718055994531f; }

/* Whether FlashInfer's batch decode takes this GQA group and head_dim (the instantiations kvbench builds:
 * groups 1, 2, 3, 4, 6, 8, 16; head_dim 64, 128, 256; f16 K/V). 1 or 0. */
int kvb_fi_decode_shape_ok(int group, int head_dim, int kv_f16);

#ifdef __cplusplus
}
#endif

#endif
