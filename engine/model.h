/* model.h — llama-family models (arch llama, qwen2, qwen3, gemma3: engine/arch.c) from GGUF, and the forward pass.
 *
 * kvb_model holds the read-only part (config, weights mapped from the file,
 * tokenizer); kvb_ctx holds one inference state (KV store, activations,
 * profiler) that prefill and decode advance. The forward pass is written once
 * against the backend op table (kernels/backend.h). */
#ifndef KVB_MODEL_H
#define KVB_MODEL_H

#include <stdint.h>

#include "kernels/backend.h"
#include "engine/gguf.h"
#include "engine/kvcache.h"
#include "engine/mem.h"
#include "engine/profile.h"
#include "engine/tokenizer.h"

enum { KVB_MAX_LAYERS = 1024 };
typedef enum { KVB_FFN_SWIGLU = 0, KVB_FFN_GEGLU = 1 } kvb_ffn_act;

/* An architecture as read from GGUF metadata (engine/arch.c). */
typedef struct {
    char arch[32];
    int n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx_train, n_rot;
    int q_dim;        /* n_head * head_dim: the query width (head_dim from attention.key_length, not always n_embd/n_head) */
    float rms_eps, rope_freq_base;
    int rope_neox;    /* qwen2, qwen3, gemma3: NEOX pairs; llama: adjacent pairs (GGUF permuted Q/K rows) */
    int has_qkv_bias; /* qwen2 */
    int tied_output;  /* output matrix = token embedding */
    /* RoPE scaling (llama.cpp's rope_ext; rope.freq_base is in it too). rope_scaled: linear, YaRN or an attention
     * factor other than 1; the model's rope_freqs (Llama 3.1 divisors) also takes the scaled op. */
    kvb_rope_params rope;
    int rope_scaled;
    int qk_norm;      /* qwen3, gemma3: RMSNorm of each Q and K head before RoPE */
    int post_norms;   /* gemma3: RMSNorm of the attention output and of the FFN output before each residual add */
    kvb_ffn_act ffn_act;
    float embd_scale; /* gemma3: the token embeddings times sqrt(n_embd); 0 = none */
    float attn_scale; /* the softmax scale of q.k: 1/sqrt(head_dim) (gemma3 27B: 1/sqrt(n_embd/n_head)) */
    int n_swa;        /* sliding window in tokens (0 = none): a local layer's query at p sees keys p-n_swa+1..p */
    float rope_freq_base_swa;               /* gemma3: the local layers' RoPE base (their freq_scale is 1) */
    unsigned char swa_layer[KVB_MAX_LAYERS]; /* 1: layer l is local (llama with a window: every layer) */
} kvb_config;

typedef struct {
    const float *attn_norm, *ffn_norm;
    kvb_weight wq, wk, wv, wo, w_gate, w_up, w_down;
    const float *bq, *bk, *bv; /* NULL when absent */
    const float *q_norm, *k_norm;               /* qk_norm: [head_dim] */
    const float *attn_post_norm, *ffn_post_norm; /* post_norms: [n_embd] */
} kvb_layer;

typedef struct {
    char path[1024];
    gguf_file *gguf;
    kvb_config cfg;
    kvb_tokenizer *tok;
    kvb_weight tok_embd, output;
    const float *output_norm;
    const float *rope_freqs; /* llama: [n_rot/2] RoPE divisors (Llama 3.1+ rope_freqs.weight), NULL = none */
    kvb_layer *layers;
    uint64_t weight_bytes;
    void *syn_weights; /* synthetic:<shape> models (engine/synthetic.h): the generated weights; gguf, tok NULL */
} kvb_model;

/* Resolve a known model name ("default", "qwen2.5-coder-0.5b") to its path in the model cache (KVB_MODEL_DIR or
 * ~/.cache/kvbench/models); a "synthetic:<shape>" name is checked and passed through. */
int kvb_model_resolve(const char *name, char *path_out, size_t path_cap, char *err, size_t err_len);
/* Open a GGUF model and bind its weights and tokenizer, or build a synthetic:<shape> model (seeded random
 * weights, no tokenizer). NULL + err on failure. */
kvb_model *kvb_model_load(const char *path, char *err, size_t err_len);
void kvb_model_free(kvb_model *m);
/* Read the config from GGUF metadata (engine/arch.c; exposed for tests): a key that changes the math and is not
 * implemented is an error naming it. */
int kvb_config_read(const gguf_file *f, kvb_config *cfg, char *err, size_t err_len);

/* Which matmul a prefill chunk takes on the CPU backend (kernels/backend.h kvb_gemm). AUTO: the f32 GEMM with
 * an f16 KV cache, the integer path with an f32 one: `--kv-type f32` is the llama.cpp-exact mode (every matmul
 * in llama.cpp's order and rounding, tests/test_model_llamacpp.c), so one switch keeps meaning "exact". */
typedef enum { KVB_PREFILL_GEMM_AUTO = 0, KVB_PREFILL_GEMM_INT8 = 1, KVB_PREFILL_GEMM_F32 = 2 } kvb_prefill_gemm;

typedef struct {
    int n_ctx;            /* max tokens (prompt + generated); 0 = model's training context */
    kvb_dtype kv_dtype;   /* KVB_F16 (default) or KVB_F32 */
    int n_threads;        /* 0 = the CPUs this process may use (affinity mask, cgroup quota) */
    int n_batch;          /* prefill chunk size in tokens; 0 = 512 */
    int profile;          /* time phases per layer */
    int trace;            /* keep events for a Chrome trace */
    kvb_backend *share_backend; /* use this backend (owned by another context) instead of creating one */
    const char *backend;        /* "cpu" (default, or $KVB_BACKEND) or "cuda" */
    kvb_prefill_gemm prefill_gemm; /* default AUTO */
    int64_t kv_reserve;   /* KV slots per head allocated up front (0: 256 on the CPU, the context on a GPU); the
                           * benchmarks reserve the whole context so no decode step pays a growth copy */
    int keep_window;      /* the observation window records after the end of prefill whatever the hooks say (tests:
                           * a method that reads it in decode must say so, kvb_hooks.obs_decode) */
} kvb_ctx_params;

typedef struct kvb_ctx kvb_ctx;

/* What one attention call reads for one KV head: slots (k, v, pos, n) and an optional index list into them.
 * The engine fills it from the KV store; a method's select hook may narrow it (idx) or point it at other
 * slots (a packed buffer of selected tokens). */
typedef struct {
    const void *k, *v;
    const int32_t *pos;
    int64_t n;
    const int32_t *idx; /* NULL = all n slots */
    int64_t n_idx;
} kvb_src;

/* Method hooks (methods/method.h builds them; DESIGN.md "Method interface"). Every pointer may be NULL.
 * Hooks return 0, or -1 with a one-line message in err. q: this chunk's queries [n_q][n_head][head_dim]
 * after RoPE; positions c->pos[0..n_q). */
typedef struct {
    void *self;
    /* layer's K/V appended, before attention: score, select, move KV (OmniKV filter layers, Round at L_w) */
    int (*pre_attend)(void *self, kvb_ctx *c, int layer, const float *q, int64_t n_q, char *err, size_t err_len);
    /* narrow or replace what each KV head's attention reads (src pre-filled from the store) */
    int (*select)(void *self, kvb_ctx *c, int layer, kvb_src *src, int64_t n_q, char *err, size_t err_len);
    /* 1 = compute attention probabilities for this call and pass them to observe */
    int (*wants_probs)(void *self, kvb_ctx *c, int layer, int64_t n_q);
    /* probs: [n_head][n_q][stride] over each head's visible list (src order) */
    int (*observe)(void *self, kvb_ctx *c, int layer, const kvb_src *src, const float *probs, int64_t stride,
                   int64_t n_q, char *err, size_t err_len);
    /* the probabilities' column sums over each KV head's group and this call's queries (H2O's and ObservedAttention's
     * prefill scores): fill rows[g] with the device row, holding src[g]'s list (new entries zeroed), that the sums
     * are added to, and return 1; 0 = none this call; -1 = error. Called when wants_probs does not want this call's
     * probabilities, after select. The engine adds them by probs_reduce over the written probabilities, or, where
     * those would pass $KVB_COLSUM_MIB (default 256), by attention_colsum without writing them. */
    int (*sum_rows)(void *self, kvb_ctx *c, int layer, const kvb_src *src, int64_t n_q, float **rows, char *err,
                    size_t err_len);
    /* replace the attention op for a layer: return 1 when handled, 0 to use the normal op, -1 on error (PoD) */
    int (*attend)(void *self, kvb_ctx *c, int layer, kvb_attn_args *a, char *err, size_t err_len);
    /* the prompt is in the cache: compress, offload, freeze budgets (SnapKV, H2O, StreamingLLM, OmniKV, PoD) */
    int (*after_prefill)(void *self, kvb_ctx *c, char *err, size_t err_len);
    /* a dialogue round begins (kvb_ctx_begin_round): is_question = the round whose answer is generated next */
    int (*on_round)(void *self, kvb_ctx *c, int32_t round, int is_question, char *err, size_t err_len);
    /* keep the last obs_window query rows per layer (post-RoPE) in c->obs_q, for window scores */
    int obs_window;
    /* 1: the window is read after the end of prefill too (OmniKV's filter layers, DecodingPress's cuts), so decode
     * keeps recording it; 0: the end of prefill stops it (obs_n 0, no copies per decode step) */
    int obs_decode;
    /* 1: no hook reads host-tier memory from host code without syncing first, so while the store holds host-tier
     * rows (which the device's KV writer may still be writing) the engine need not wait for the device before the
     * layer's hooks; 0: it waits */
    int no_host_reads;
} kvb_hooks;

/* Observer of what each layer's attention read (kvbench fidelity): called after select. */
typedef void (*kvb_visible_fn)(void *user, kvb_ctx *c, int layer, const kvb_src *src, int64_t n_q);

/* Observer of intermediate activations (numerics diagnosis, scripts/llamacpp_diff.py): called after each
 * step of the forward pass with llama.cpp's graph names (attn_norm, Qcur, Kcur, Vcur, kqv_out, attn_out,
 * ffn_inp, ffn_norm, ffn_gate, ffn_up, ffn_swiglu, ffn_out, l_out, result_norm, result_output), layer
 * (-1 outside the layers) and a host view of n_rows rows of row_len floats (synced first). */
typedef void (*kvb_tap_fn)(void *user, const char *name, int layer, const float *data, int64_t n_rows,
                           int64_t row_len);

struct kvb_ctx {
    kvb_model *model;
    kvb_ctx_params params;
    kvb_backend *be;
    kvb_mem mem;
    kvc_store *kv;
    prof *prof;
    int64_t n_past;       /* tokens processed so far (next absolute position) */
    /* host memory: the token read at each position 0..tokens_n-1 (forks copy it; -1 where the KV was not made by
     * the forward pass, as tests build it), for methods that feed the prompt through the model again (KVzip's
     * reconstruction) after a shared prefill they never saw */
    int32_t *tokens;
    int64_t tokens_n, tokens_cap;
    /* activations for one chunk of up to n_batch tokens (device tier: for backend ops only) */
    float *x, *xn, *q, *k, *v, *att, *ffn_g, *ffn_u, *logits_d;
    int32_t *pos_d, *rounds_d; /* device copies of pos and rounds */
    /* host memory: the last token's logits (copied down after each forward call), the chunk's positions and
     * round ids */
    float *logits;
    int32_t *pos, *rounds;
    /* per KV head views for the attention op */
    const void **hk, **hv;
    const int32_t **hpos;
    int64_t *hn;
    const int32_t **hidx;
    int64_t *hnidx;
    kvb_src *src;           /* [n_head_kv] per-call attention sources */
    /* method hooks (NULL = full attention) */
    const kvb_hooks *hooks;
    kvb_visible_fn on_visible;
    void *on_visible_user;
    kvb_tap_fn tap;         /* activation observer (NULL = none) */
    void *tap_user;
    int32_t cur_round;      /* round id tagged on appended tokens (multi-round sessions) */
    int in_prefill;         /* 1 until kvb_ctx_end_prefill */
    /* probabilities buffer for observe, and the lse of a call whose column sums a method takes (sum_rows) (device,
     * grown on demand, method category) */
    float *probs;
    size_t probs_bytes;
    float *lse;
    size_t lse_bytes;
    /* observation window: last obs_window query rows per layer, oldest first ([layer][w][n_head*head_dim]);
     * device memory, as is obs_pos */
    float *obs_q;
    int32_t *obs_pos;       /* [w] positions of the kept rows */
    int obs_n;              /* rows kept (<= obs_window) */
    int obs_cap;            /* obs_window the buffer was sized for */
    int obs_stopped;        /* the end of prefill stopped the window (hooks->obs_decode 0): obs_n 0, nothing recorded
                             * until kvb_ctx_reset */
    int obs_have;           /* rows kept before the current chunk */
    /* the end of prefill layer by layer (kvb_ctx_end_prefill_by_layer): the chunk that reaches layer_end_at tokens
     * runs after_prefill for each layer right after that layer's attention (0 = at the end of prefill only) */
    int64_t layer_end_at;
    int layers_ended;       /* layers [0, layers_ended) whose prefill has ended */
    int ending_layer;       /* the layer whose after_prefill runs now; -1 = kvb_ctx_end_prefill (every layer left) */
    /* attention statistics per layer: sum over decode calls of mean visible tokens per KV head */
    double *dec_attended;
    int64_t dec_calls;
};

/* Layer l's sliding window in tokens, 0 on a global layer. */
int kvb_layer_window(const kvb_config *cfg, int l);
/* Tokens per KV head full attention holds in layer l after n_past tokens: a local layer its window (it drops
 * older slots after each step), a global layer every token. */
int64_t kvb_full_tokens_at(const kvb_config *cfg, int l, int64_t n_past);
/* The same for a context now (its n_past). */
int64_t kvb_ctx_full_tokens(const kvb_ctx *c, int l);

kvb_ctx_params kvb_ctx_default_params(void);
kvb_ctx *kvb_ctx_create(kvb_model *m, const kvb_ctx_params *p, char *err, size_t err_len);
/* The backend's matmul setting for p (prefill_gemm with AUTO resolved by the KV type). */
kvb_gemm kvb_ctx_gemm(const kvb_ctx_params *p);
void kvb_ctx_free(kvb_ctx *c);
/* Run tokens through the model at positions n_past.. (in chunks); logits of the last token -> c->logits. */
int kvb_forward(kvb_ctx *c, const int32_t *ids, int64_t n, char *err, size_t err_len);
/* A new context in the state of c (KV store, position, logits, round, observation window copied; no hooks,
 * still in prefill), with its own accounting and c's backend (free the fork before c; do not run both at once): methods that compress after an exact prefill
 * share one prefill this way (DESIGN.md "Data flow"). obs_window: the copy's window size (>= c's rows are
 * kept; 0 = none). NULL + err on failure. */
kvb_ctx *kvb_ctx_fork(const kvb_ctx *c, int obs_window, char *err, size_t err_len);
/* Install method hooks (NULL = full attention); allocates the observation window. Call before prefill. */
int kvb_ctx_set_hooks(kvb_ctx *c, const kvb_hooks *h, char *err, size_t err_len);
/* The prompt has been processed: runs the method's after_prefill hook; later calls are decode. */
int kvb_ctx_end_prefill(kvb_ctx *c, char *err, size_t err_len);
/* The prompt ends at n_prompt tokens and the method's end of prefill is layer-local (methods/method.h
 * KVB_LAYER_LOCAL: ending a layer reads only that layer and earlier ones, and no later layer's input depends on it):
 * the forward chunk that reaches n_prompt runs after_prefill for each layer right after the layer's attention (the
 * hook sees n_past = n_prompt), so a prompt prefilled as one chunk holds at most one layer's full KV beside the ended
 * ones; kvb_ctx_end_prefill then runs it for the layers left. Call before the prefill's last chunk. */
void kvb_ctx_end_prefill_by_layer(kvb_ctx *c, int64_t n_prompt);
/* The layers an after_prefill hook ends now, [*from, *to): the one layer of a layer-wise end, else those left. */
void kvb_prefill_layers(const kvb_ctx *c, int *from, int *to);
/* Tag following tokens with a round id and tell the method (multi-round sessions; Round Attention). */
int kvb_ctx_begin_round(kvb_ctx *c, int32_t round, int is_question, char *err, size_t err_len);
/* Mean tokens attended per KV head in a layer over decode steps (0 before any). */
double kvb_ctx_mean_attended(const kvb_ctx *c, int layer);
/* Forget everything (KV store cleared, n_past = 0). */
void kvb_ctx_reset(kvb_ctx *c);

#endif
