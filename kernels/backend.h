/* backend.h — the op interface every compute backend implements: the ground floor of kvbench.
 *
 * The forward pass (engine/model.c) and the KV-cache methods call ops only through this table, so the
 * same code runs on the CPU backend (kernels/cpu/) and the CUDA backend (kernels/cuda/). Activation
 * buffers passed to ops live in the backend's own memory (host memory for the CPU backend). The table
 * names no engine type: weights, KV rows and memory are plain pointers, sizes and dtypes, and what the
 * engine needs from a GPU backend (an allocator, a KV row writer) are plain function pointers it adapts
 * its KV store and memory trackers to. */
#ifndef KVB_BACKEND_H
#define KVB_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/dtype.h"

/* Where memory lives: next to the compute (GPU memory on CUDA) or on the host (pinned on CUDA). */
typedef enum { KVB_TIER_DEVICE = 0, KVB_TIER_HOST = 1, KVB_TIER_COUNT } kvb_tier;

/* Memory a GPU backend hands out for both the host and its kernels to address (device tier: GPU-resident,
 * host tier: pinned host memory). alloc returns zeroed memory or NULL; copy is a synchronous copy between
 * any two such blocks. The engine's memory trackers (engine/mem.h) allocate through it. */
typedef struct {
    void *(*alloc)(void *user, kvb_tier tier, size_t bytes);
    void (*free)(void *user, kvb_tier tier, void *p, size_t bytes);
    void (*copy)(void *user, void *dst, const void *src, size_t bytes);
    void *user;
} kvb_allocator;

/* Where one KV head's new rows go in a kv_writer call (its slots n_before onwards). */
typedef struct {
    void *k, *v;
    int32_t *pos, *round;
} kvb_kv_rows;
enum { KVB_MAX_KV_HEADS = 64 }; /* KV heads a kv_writer call and the CUDA attention take */
/* A device-side KV row writer: converts and stores n_tok rows of every head of a layer in one go:
 * dst[h].k[t] = k[t][h] (as dtype), likewise v; pos and round copied (round NULL = 0). 0, or -1 + err. */
typedef int (*kvb_kv_writer)(void *user, int n_head_kv, int head_dim, kvb_dtype dtype, int64_t n_tok,
                             const kvb_kv_rows *dst, const float *k, const float *v, const int32_t *pos,
                             const int32_t *round, char *err, size_t err_len);

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
    /* Ops that return int give 0, or -1 with the reason in err (matmul, which takes none: in `error`). Ops that
     * return nothing record a failure in `error` (only GPU backends, whose ops run asynchronously, can fail
     * there), and the next int-returning op or sync reports it: a failed GPU backend stays failed. */
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
    /* Wait for enqueued work: called before host code reads what ops wrote (NULL = ops are synchronous).
     * 0, or -1 when an op has failed (the reason in `error`). */
    int (*sync)(kvb_backend *be);
    /* Memory the engine's trackers should allocate from (NULL = C heap) and a device-side KV row writer
     * (NULL = host code; called with the backend as user); both set by GPU backends, whose kernels cannot
     * read plain heap memory. */
    const kvb_allocator *allocator;
    kvb_kv_writer kv_writer;
    void *impl;      /* backend private state (thread pool, workspaces) */
    char error[256]; /* one line: why an op failed ("" = none; see above) */
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
