/* fi_inst.h — the FlashInfer instantiations kvbench builds (kernels/cuda/flashinfer/decode_d*.cu), called by the glue
 * in kernels/cuda/flashinfer.cu. Each is one head_dim, f16 K/V, page size 1, every KV head its own request
 * (flashinfer_layout.h). Host code; every pointer not named _h is device memory. */
#ifndef KVB_CUDA_FI_INST_H
#define KVB_CUDA_FI_INST_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* one batch decode: n_req requests (KV heads) of `group` query heads each, one query each */
typedef struct {
    int n_req, group;
    const float *q;          /* [n_req][group][head_dim]: kvbench's [n_head][head_dim] for one query */
    const void *k_base, *v_base; /* f16 rows; page p at base + p * head_dim */
    int32_t *indices;        /* [indptr_h[n_req]] pages */
    int32_t *indptr;         /* [n_req + 1] */
    int32_t *last_page_len;  /* [n_req], all 1 */
    const int32_t *indptr_h; /* host copy of indptr (the plan splits the lists on the host) */
    float scale;
    void *out_h;             /* [n_req][group][head_dim] f16 */
    float *lse2;             /* NULL or [n_req][group]: base-2 log-sum-exp */
    void *int_ws, *float_ws; /* device workspaces of kvb_fi_decode_ws's sizes */
    void *int_ws_h;          /* pinned host memory as large as int_ws, free of earlier copies */
    size_t int_ws_bytes, float_ws_bytes;
    void *stream;
    char *err;
    size_t err_len;
} kvb_fi_decode_args;

/* one batch prefill, FlashInfer's FA2 path with its causal mask (query t of a request sees entries
 * j <= t + kv_len - n_q): n_req requests (KV heads) of n_q queries x group heads each, no split of the lists */
typedef struct {
    int n_req, group, n_q;
    const void *q_h;         /* f16 [n_req][n_q][group][head_dim] */
    const void *k_base, *v_base;
    int32_t *indices, *kv_indptr, *last_page_len, *qo_indptr; /* device; qo_indptr[g] = g * n_q */
    const int32_t *kv_indptr_h, *qo_indptr_h;
    float scale;
    void *out_h;             /* f16 [n_req][n_q][group][head_dim] */
    float *lse2;             /* NULL or [n_req * n_q][group], base 2 */
    void *int_ws, *int_ws_h; /* device and pinned host, kvb_fi_prefill_int_ws bytes */
    size_t int_ws_bytes;
    void *stream;
    char *err;
    size_t err_len;
} kvb_fi_prefill_args;

/* Upper bound of the int workspace of a prefill (its plan's tiles: 16 packed rows at least a tile). */
size_t kvb_fi_prefill_int_ws(int n_req, int group, int64_t n_q);

/* plan and run; 1 done, 0 when the plan picked a query tile kvbench did not instantiate (nothing written to the
 * outputs: the caller falls back), -1 with the reason in a->err */
int kvb_fi_prefill_d64(const kvb_fi_prefill_args *a);
int kvb_fi_prefill_d128(const kvb_fi_prefill_args *a);

/* Upper bounds of the workspaces a decode of n_req requests needs on a GPU of n_sms SMs. */
void kvb_fi_decode_ws(int n_req, int group, int head_dim, int n_sms, size_t *int_bytes, size_t *float_bytes);

/* plan (split the lists over the GPU) and run; 0, or -1 with the reason in a->err */
int kvb_fi_decode_d64(const kvb_fi_decode_args *a);
int kvb_fi_decode_d128(const kvb_fi_decode_args *a);
int kvb_fi_decode_d256(const kvb_fi_decode_args *a);

#ifdef __cplusplus
}
#endif

#endif
