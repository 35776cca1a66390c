/* model.h — llama-family models (arch llama, qwen2) from GGUF, and the forward pass.
 *
 * kvb_model holds the read-only part (config, weights mapped from the file,
 * tokenizer); kvb_ctx holds one inference state (KV store, activations,
 * profiler) that prefill and decode advance. The forward pass is written once
 * against the backend op table (engine/backend.h). */
#ifndef KVB_MODEL_H
#define KVB_MODEL_H

#include <stdint.h>

#include "engine/backend.h"
#include "engine/gguf.h"
#include "engine/kvcache.h"
#include "engine/mem.h"
#include "engine/profile.h"
#include "engine/tokenizer.h"

typedef struct {
    char arch[32];
    int n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx_train, n_rot;
    float rms_eps, rope_freq_base;
    int rope_neox;    /* qwen2: NEOX pairs; llama: adjacent pairs (GGUF permuted Q/K rows) */
    int has_qkv_bias; /* qwen2 */
    int tied_output;  /* output matrix = token embedding */
} kvb_config;

typedef struct {
    const float *attn_norm, *ffn_norm;
    kvb_weight wq, wk, wv, wo, w_gate, w_up, w_down;
    const float *bq, *bk, *bv; /* NULL when absent */
} kvb_layer;

typedef struct {
    char path[1024];
    gguf_file *gguf;
    kvb_config cfg;
    kvb_tokenizer *tok;
    kvb_weight tok_embd, output;
    const float *output_norm;
    kvb_layer *layers;
    uint64_t weight_bytes;
} kvb_model;

/* Resolve "default" to the cached default model path (KVB_MODEL_DIR or ~/.cache/kvbench/models). */
int kvb_model_resolve(const char *name, char *path_out, size_t path_cap, char *err, size_t err_len);
/* Open a GGUF model and bind its weights and tokenizer. NULL + err on failure. */
kvb_model *kvb_model_load(const char *path, char *err, size_t err_len);
void kvb_model_free(kvb_model *m);
/* Read the config from GGUF metadata (exposed for tests). */
int kvb_config_read(const gguf_file *f, kvb_config *cfg, char *err, size_t err_len);

typedef struct {
    int n_ctx;            /* max tokens (prompt + generated); 0 = model's training context */
    kvb_dtype kv_dtype;   /* KVB_F16 (default) or KVB_F32 */
    int n_threads;        /* 0 = all cores */
    int n_batch;          /* prefill chunk size in tokens; 0 = 512 */
    int profile;          /* time phases per layer */
    int trace;            /* keep events for a Chrome trace */
} kvb_ctx_params;

typedef struct {
    kvb_model *model;
    kvb_ctx_params params;
    kvb_backend *be;
    kvb_mem mem;
    kvc_store *kv;
    prof *prof;
    int64_t n_past;       /* tokens processed so far (next absolute position) */
    /* activations for one chunk of up to n_batch tokens */
    float *x, *xn, *q, *k, *v, *att, *ffn_g, *ffn_u, *logits;
    int32_t *pos;
    /* per KV head views for the attention op */
    const void **hk, **hv;
    const int32_t **hpos;
    int64_t *hn;
} kvb_ctx;

kvb_ctx_params kvb_ctx_default_params(void);
kvb_ctx *kvb_ctx_create(kvb_model *m, const kvb_ctx_params *p, char *err, size_t err_len);
void kvb_ctx_free(kvb_ctx *c);
/* Run tokens through the model at positions n_past.. (in chunks); logits of the last token -> c->logits. */
int kvb_forward(kvb_ctx *c, const int32_t *ids, int64_t n, char *err, size_t err_len);
/* Forget everything (KV store cleared, n_past = 0). */
void kvb_ctx_reset(kvb_ctx *c);

#endif
