/* attention.h — CUDA attention over the KV store: causal prefill (flash-attention tiling, online softmax)
 * and split-KV decode (flash-decoding), GQA, over all slots or a per-KV-head index list.
 *
 * Same semantics as the CPU op (kernels/backend.h, kvb_attn_args): query head h reads KV head
 * h / (n_head / n_head_kv); a slot is visible iff q_pos == NULL, k_pos[g] == NULL or k_pos[g][slot] <= q_pos[t]
 * (and, in a sliding-window layer, window > 0, also k_pos[g][slot] > q_pos[t] - window);
 * probs (optional) are softmax probabilities over each head's list in list order, masked entries 0;
 * lse (optional) is the log-sum-exp of the scaled logits over the visible keys (-INFINITY when none is
 * visible, and then the output row is 0).
 *
 * Every pointer in kvb_cuda_attn is a device pointer, including the per-KV-head arrays and the
 * pointers they hold. Callable from C. */
#ifndef KVB_CUDA_ATTENTION_H
#define KVB_CUDA_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int64_t n_q;                 /* query tokens */
    int n_head, n_head_kv, head_dim; /* head_dim: any value 1..256 (fast paths for 64 and 128) */
    const float *q;              /* [n_q][n_head][head_dim] */
    const int32_t *q_pos;        /* [n_q] or NULL (no mask) */
    int kv_f16;                  /* 1: K/V rows are IEEE half; 0: float */
    const void *const *k;        /* [n_head_kv] -> [n_kv[g]][head_dim] */
    const void *const *v;        /* [n_head_kv] -> [n_kv[g]][head_dim] */
    const int32_t *const *k_pos; /* [n_head_kv] -> [n_kv[g]] absolute positions; NULL array or entry = no mask */
    const int64_t *n_kv;         /* [n_head_kv] slots */
    const int32_t *const *idx;   /* NULL, or [n_head_kv] -> [n_idx[g]] slot indices (a NULL entry = all slots) */
    const int64_t *n_idx;        /* [n_head_kv] (with idx) */
    int64_t max_len;             /* host-side: the longest list over the KV heads (grid sizing) */
    float scale;
    float *out;                  /* [n_q][n_head][head_dim] */
    float *probs;                /* optional [n_head][n_q][probs_stride] */
    int64_t probs_stride;        /* >= max_len when probs != NULL */
    float *lse;                  /* optional [n_head][n_q] */
    int kernel;                  /* f16 head_dim 64/128: 1 = the tiled kernel, 2 = v2 (double-buffered async copies),
                                  * 3 = v3 (register-only: K/V rows straight to registers, one wave of blocks),
                                  * 4 = v4 (both products on tensor cores, K/V rows straight into the fragments);
                                  * 5 = FlashInfer's paged decode / causal prefill where they give kvbench's
                                  * answer, kvbench's kernels (v4) elsewhere (flashinfer.h; f16 output);
                                  * 0 = kvb_cuda_attention_kernel(). Results equal to rounding (bench-attention times all) */
    int32_t window;              /* > 0: a sliding-window layer, where the mask applies (q_pos and k_pos given) a key is
                                  * visible iff q_pos - window < k_pos <= q_pos; 0 = no window. Every kernel path
                                  * takes it in its mask test (attn_split.cuh: key_hidden) */
    const uint64_t *host_heads;  /* optional, HOST memory: the per-KV-head words k[H] v[H] k_pos[H] n_kv[H] idx[H]
                                  * n_idx[H] (backend_cuda.cu's parameter block; 0 for a NULL entry), so kernel 5
                                  * plans without reading them back from the device; NULL = read back (a wait) */
} kvb_cuda_attn;

/* The kernel a call with kernel = 0 takes: 4 by default (measured fastest on an H200, 2026-11-26: docs/gpu.md),
 * 1, 2, 3 or 5 (FlashInfer, flashinfer.h) where $KVB_ATTN_KERNEL says so before the first call, or as set here. */
void kvb_cuda_attention_set_kernel(int kernel);
int kvb_cuda_attention_kernel(void);
/* Prefill (>= 64 queries, f16 K/V, head_dim 64/128) on tensor cores (attn_prefill.cu: Q and P rounded to f16,
 * |error| ~1e-3 of the output's scale): 2 (v2, the default since the H200 run of 2026-11-27: 1.55x v1 at 32K),
 * 1 (v1, on since 2026-11-26: TTFT 4.3x shorter at 32K) or 0 (off), from $KVB_PREFILL_TC before the first call,
 * or as set here. */
void kvb_cuda_attention_set_prefill_tc(int on);
int kvb_cuda_attention_prefill_tc(void);
/* The probabilities' pass: 2 (the default since the H200 run of 2026-11-26: a block per KV head, query and chunk of
 * the list, coalesced; f16, head_dim 64/128, groups up to 8, else 1) or 1 (a block per query and head); before any
 * call: $KVB_PROBS_KERNEL, else 2. */
void kvb_cuda_attention_set_probs_kernel(int k);
int kvb_cuda_attention_probs_kernel(void);
/* Decode v4's L2 prefetch, a candidate (attn_decode.cu): 0 = off (the default), 1 or 2 = each warp prefetches the K and
 * V rows of its tile that many turns ahead into L2 (bulk prefetches of contiguous rows; with an index list, the
 * slots' rows one by one). A hint: results are bit for bit those without it. $KVB_ATTN_PREFETCH before the first
 * call, or as set here. */
void kvb_cuda_set_attn_prefetch(int tiles);
int kvb_cuda_attn_prefetch(void);
/* The GPU's multiprocessors (asked once; 1 when the driver cannot say): what the split kernels size their grids by. */
int kvb_cuda_sm_count(void);
/* Device workspace bytes kvb_cuda_attention needs for these shapes (split-KV partials). */
size_t kvb_cuda_attention_ws(const kvb_cuda_attn *a);
/* Enqueue the attention on stream (a cudaStream_t; NULL = default). ws: device memory of at least
 * kvb_cuda_attention_ws(a) bytes. Returns 0, or -1 with a one-line message in err (bad shapes or a
 * launch error). */
int kvb_cuda_attention(const kvb_cuda_attn *a, void *ws, size_t ws_bytes, void *stream, char *err, size_t err_len);

#ifdef __cplusplus
}
#endif

#endif
