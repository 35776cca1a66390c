/* method.h — the KV-cache method plugin interface (DESIGN.md "Method interface", "Budgets").
 *
 * A method is a set of engine hooks (engine/model.h kvb_hooks) plus its parameters. It is created per
 * sample on a context, before prefill; kvb_ctx_end_prefill runs its compression; decode calls its select /
 * observe / attend hooks. Methods never call kernels directly: they use the backend op table and the KV
 * store, so the same method runs on every backend.
 *
 * Budgets: "30%" = Mem%: that share of the full KV bytes at the end of prefill; "1024" = tokens per layer
 * and KV head. A method declares the device-tier tokens it means to hold per layer (expected_tokens); the run
 * measures what the store really holds and kvb_method_verify fails when they disagree by more than 1%. */
#ifndef KVB_METHOD_H
#define KVB_METHOD_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "engine/model.h"
#include "engine/session.h" /* kvb_kv_usage, kvb_session_method */

typedef enum { KVB_BUDGET_NONE = 0, KVB_BUDGET_FRACTION, KVB_BUDGET_TOKENS } kvb_budget_kind;

typedef struct {
    kvb_budget_kind kind;
    double frac;    /* KVB_BUDGET_FRACTION: (0, 1] */
    int64_t tokens; /* KVB_BUDGET_TOKENS: > 0 */
} kvb_budget;

/* "30%", "0.3" is rejected (ambiguous), "1024" tokens, "full"/"100%"/"" = fraction 1. One-line error. */
int kvb_budget_parse(const char *s, kvb_budget *b, char *err, size_t err_len);
/* "30%", "1024", "full" */
void kvb_budget_format(const kvb_budget *b, char *buf, size_t cap);
/* Tokens per layer and KV head the budget allows for a cache of n tokens (fraction: rounded to nearest, at
 * least 1). Errors when a token budget exceeds n. */
int kvb_budget_tokens(const kvb_budget *b, int64_t n, int64_t *out, char *err, size_t err_len);

/* --method-opt key=value pairs */
#define KVB_MAX_OPTS 16
typedef struct {
    struct { char key[32]; char val[128]; int used; } v[KVB_MAX_OPTS];
    int n;
} kvb_opts;

/* Add "key=value" (comma-separated lists allowed: "a=1,b=2"). */
int kvb_opts_add(kvb_opts *o, const char *kv, char *err, size_t err_len);
/* Add the members of a JSON object {"key": "value" | number} (suites, server requests); where names the
 * object in errors. NULL obj adds nothing. */
int kvb_opts_add_json(kvb_opts *o, const cJSON *obj, const char *where, char *err, size_t err_len);
/* "full, flash, streamingllm, ..." */
void kvb_method_names(char *buf, size_t cap);
/* Value of key or NULL (marks it used). */
const char *kvb_opts_get(kvb_opts *o, const char *key);
/* Typed getters: 0 = absent (out untouched), 1 = read, -1 = malformed (err set). */
int kvb_opts_int(kvb_opts *o, const char *key, int64_t *out, char *err, size_t err_len);
int kvb_opts_double(kvb_opts *o, const char *key, double *out, char *err, size_t err_len);
/* The first option no method read, or NULL. */
const char *kvb_opts_unused(const kvb_opts *o);

typedef struct kvb_method kvb_method;
typedef struct kvb_share kvb_share;
struct kvb_method {
    const char *name;
    kvb_hooks hooks;     /* hooks.self = this struct */
    kvb_budget budget;
    int imposes_budget;  /* 0: the budget is reported, not imposed (full, round) */
    kvc_store *vis;      /* optional device-tier store of packed/selected tokens the method attends to */
    /* Device-tier tokens per KV head the method means to hold in a layer now (store + vis); -1 = no claim. */
    int64_t (*expected_tokens)(kvb_method *m, kvb_ctx *c, int layer);
    /* The device share of the full KV the paper's memory formula gives for the current state (Round
     * Attention eq. 2, OmniKV's Mem%, PoD's key saving from its blocks); NULL = no formula. */
    double (*formula_frac)(kvb_method *m, kvb_ctx *c);
    /* Resolved parameters, "key=value ..." (for results and --help output). */
    void (*describe)(kvb_method *m, char *buf, size_t cap);
    void (*destroy)(kvb_method *m);
    /* Prefill a single prompt (NULL = kvb_forward); Round Attention cuts it into rounds. */
    int (*prefill)(kvb_method *m, kvb_ctx *c, const int32_t *ids, int64_t n, char *err, size_t err_len);
    /* Take over statistics of a shared prefill (kvb_share) instead of having observed the prefill itself;
     * NULL for methods that need none. */
    int (*adopt)(kvb_method *m, kvb_ctx *c, const kvb_share *share, char *err, size_t err_len);
    int needs_prefill_scores; /* accumulated prefill attention (H2O): a shared prefill must record it */
    int64_t extra_device_bytes; /* device KV the method holds outside the stores (PoD's V-only rows) */
    int64_t n_prompt;    /* tokens at the end of prefill (set by after_prefill) */
    char note[160];      /* what the results should say (e.g. "rounds = 512-token chunks") */
};

typedef struct {
    const char *name;
    const char *summary;
    kvb_method *(*create)(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len);
} kvb_method_info;

/* Registered methods (full, flash, streamingllm, h2o, snapkv, omnikv, round, pod). */
const kvb_method_info *kvb_method_find(const char *name);
int kvb_method_count(void);
const kvb_method_info *kvb_method_at(int i);

/* Create a method by name on a context and install its hooks. Unknown name, bad option or impossible
 * budget: NULL + one-line error. Options no method read are an error. */
kvb_method *kvb_method_create(const char *name, kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err,
                              size_t err_len);
/* Uninstall the hooks from c and free. NULL is a no-op. */
void kvb_method_free(kvb_method *m, kvb_ctx *c);

/* Prefill a prompt with the method (its own prefill or kvb_forward), end prefill (the method compresses),
 * and verify the budget. */
int kvb_method_prefill(kvb_method *m, kvb_ctx *c, const int32_t *ids, int64_t n, char *err, size_t err_len);

/* ---- shared prefill (DESIGN.md "Data flow") ----
 * One exact prefill serves every method that compresses after prefill: install a kvb_share on a context
 * before prefill (it keeps the observation window and, when asked, H2O's accumulated attention per slot),
 * then per method kvb_ctx_fork the context and kvb_method_adopt the share. */
typedef struct kvb_share kvb_share;
kvb_share *kvb_share_create(kvb_ctx *c, int obs_window, int want_scores, char *err, size_t err_len);
/* Accumulated attention of every prefill query on slot j of (layer, KV head), summed over the group's heads. */
const float *kvb_share_scores(const kvb_share *s, int layer, int h, int64_t *n);
int kvb_share_obs_window(const kvb_share *s);
void kvb_share_free(kvb_share *s, kvb_ctx *c);
/* Install a method on a forked context of a shared prefill: adopt the share's statistics, end prefill
 * (compression), verify. */
int kvb_method_adopt(kvb_method *m, kvb_ctx *c, const kvb_share *s, char *err, size_t err_len);

/* Measured KV of a context: store + the method's own device buffers. */
void kvb_method_usage(const kvb_method *m, const kvb_ctx *c, kvb_kv_usage *u);
/* The method as an engine session sees it (own prefill, verify, usage). m may be NULL (full attention). */
kvb_session_method kvb_method_seam(kvb_method *m);

/* Check measured device KV per layer against the method's claim, and (at the end of prefill) the total
 * against the budget, within 1% (at least one token per head). -1 + "method X: layer L holds ..." on failure. */
int kvb_method_verify(kvb_method *m, kvb_ctx *c, int end_of_prefill, char *err, size_t err_len);

/* Shared helpers for method files. */
/* Format a one-line error into err; returns -1. */
int kvb_errf(char *err, size_t err_len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Indices of the k largest scores (ties: lower index first), written ascending into out. -1 = out of memory. */
int kvb_topk_ascending(const float *score, int64_t n, int64_t k, int32_t *out);
/* Sort int32 ascending. */
void kvb_sort_i32(int32_t *v, int64_t n);
/* Attention probabilities of queries q ([n_q][n_head][head_dim], positions q_pos) over one layer's KV as given
 * by src (per KV head; NULL = the whole store layer), causal by position. *probs (malloc'd, caller frees) is
 * [n_head][n_q][*stride] in each head's list order; lse (optional, [n_head][n_q]). */
int kvb_attn_probs(kvb_ctx *c, int layer, const float *q, const int32_t *q_pos, int64_t n_q, const kvb_src *src,
                   float **probs, int64_t *stride, float *lse, char *err, size_t err_len);
/* Offloading methods (OmniKV, Round Attention): copy the current chunk's n_q newest slots of a host-tier layer
 * into the method's device buffer m->vis (their write to the host store is counted as a device->host move)
 * and point src at the buffer. */
int kvb_vis_attend_packed(kvb_method *m, kvb_ctx *c, int layer, kvb_src *src, int64_t n_q, char *err, size_t err_len);
/* Fill src[n_head_kv] with the store's views of a layer. */
void kvb_src_from_store(const kvb_ctx *c, int layer, kvb_src *src);
/* Current sequence length during a hook: positions of the chunk being processed included. */
int64_t kvb_cur_len(const kvb_ctx *c, int64_t n_q);
/* Allocate zeroed method state accounted to (device, method). */
void *kvb_method_alloc(kvb_ctx *c, size_t bytes);
void kvb_method_release(kvb_ctx *c, void *p, size_t bytes);

#endif
