/* backend.h — the op interface every compute backend implements.
 *
 * The forward pass (engine/model.c) and, later, the KV-cache methods call ops only
 * through this table, so the same code runs on the CPU backend (kernels/cpu/) and
 * the CUDA backend (kernels/cuda/). Activation buffers passed to ops live in the
 * backend's own memory (host memory for the CPU backend). */
#ifndef KVB_BACKEND_H
#define KVB_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "engine/f16.h"
#include "engine/gguf.h"
#include "engine/kvcache.h"
#include "engine/mem.h"

/* A weight matrix as stored in the model file: rows x cols, each row of `cols`
 * elements in `type` (GGUF: ne[0] = cols, ne[1] = rows). */
typedef struct {
    const void *data;
    ggml_type type;
    int64_t rows, cols;
} kvb_weight;

typedef struct kvb_attn_args kvb_attn_args;
/* Attention over the KV store, all heads at once (GQA: query head h uses KV head h / (n_head/n_head_kv)). */
struct kvb_attn_args {
    int64_t n_q;                 /* query tokens */
    int n_head, n_head_kv, head_dim;
    const float *q;              /* [n_q][n_head][head_dim] */
    const int32_t *q_pos;        /* [n_q] absolute positions for the causal mask, or NULL = no mask */
    kvb_dtype kv_dtype;          /* K and V element type: f32 or f16 */
    const void *const *k;        /* per KV head: [n_kv[h]][head_dim] rows */
    const void *const *v;        /* per KV head: [n_kv[h]][head_dim] rows */
    const int32_t *const *k_pos; /* per KV head: absolute position of each slot (mask: visible iff k_pos <= q_pos) */
    const int64_t *n_kv;         /* per KV head: slots */
    const int32_t *const *idx;   /* optional per KV head index list into the slots (NULL = all slots; also
                                    a NULL entry for one head = all) */
    const int64_t *n_idx;        /* per KV head: length of idx[h] */
    float scale;                 /* usually 1/sqrt(head_dim) */
    float *out;                  /* [n_q][n_head][head_dim] */
    float *probs;                /* optional: [n_head][n_q][probs_stride] softmax probabilities over the visible
                                    list (in list order; masked entries 0) */
    int64_t probs_stride;
    float *lse;                  /* optional: [n_head][n_q] log-sum-exp of the scaled logits over visible keys */
    void *ws; size_t ws_bytes;   /* backend workspace (the CPU backend fills it) */
};

typedef struct kvb_backend kvb_backend;
struct kvb_backend {
    const char *name;
    int n_threads;
    /* out[t][r] = W[r] . x[t] for t < n_tok (x quantized to the weight's activation format first) */
    int (*matmul)(kvb_backend *be, float *out, const kvb_weight *w, const float *x, int64_t n_tok);
    /* out[i] = dequantized row ids[i] of w */
    void (*get_rows)(kvb_backend *be, float *out, const kvb_weight *w, const int32_t *ids, int64_t n);
    void (*rmsnorm)(kvb_backend *be, float *out, const float *x, const float *w, int64_t n, int64_t n_rows, float eps);
    void (*rope)(kvb_backend *be, float *x, int64_t n_tok, int n_head, int head_dim, int n_rot, const int32_t *pos,
                 float freq_base, int neox);
    void (*swiglu)(kvb_backend *be, float *out, const float *gate, const float *up, int64_t n);
    void (*add)(kvb_backend *be, float *out, const float *a, const float *b, int64_t n);
    /* out[t][i] += bias[i] for t < n_rows */
    void (*add_bias)(kvb_backend *be, float *x, const float *bias, int64_t n, int64_t n_rows);
    int (*attention)(kvb_backend *be, const kvb_attn_args *a, char *err, size_t err_len);
    void (*softmax)(kvb_backend *be, float *x, int64_t n);
    void (*topk)(kvb_backend *be, const float *x, int64_t n, int64_t k, int32_t *idx_out);
    void (*free)(kvb_backend *be);
    /* Wait for enqueued work: called before host code reads what ops wrote (NULL = ops are synchronous). */
    void (*sync)(kvb_backend *be);
    /* Memory the engine's trackers should allocate from (NULL = C heap) and a device-side KV row writer
     * (NULL = host code); both set by GPU backends, whose kernels cannot read plain heap memory. */
    const kvb_allocator *allocator;
    kvc_writer kv_writer;
    void *impl; /* backend private state (thread pool, workspaces) */
};

/* The CPU backend with n_threads (<= 0: one per core). NULL on failure. */
kvb_backend *kvb_backend_cpu_create(int n_threads, char *err, size_t err_len);
/* The CUDA backend on GPU 0 ($KVB_CUDA_DEVICE picks another). It converts each weight matrix to f16 on first use
 * and caches it by host address for its lifetime: weights must stay mapped and unchanged while it lives (builds with KVB_HAVE_CUDA). NULL + err when there is no GPU or no CUDA build. */
kvb_backend *kvb_backend_cuda_create(char *err, size_t err_len);
/* A backend by name: "cpu" or "cuda". */
kvb_backend *kvb_backend_create(const char *name, int n_threads, char *err, size_t err_len);
/* Release a backend created by any *_create. NULL is a no-op. */
void kvb_backend_free(kvb_backend *be);

#endif
