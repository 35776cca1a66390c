/* method.h — the KV-cache method plugin interface (DESIGN.md "Method interface", "Budgets").
 *
 * A method is one kvb_method_def, declared once at the end of its file (methods/<name>.c) and named in the
 * registry's list (registry.c KVB_METHODS): its name, aliases and summary; its traits and what it reads from
 * the options (observation window, calibration profile): what it needs from the session; its engine hooks;
 * and the functions the run calls on it (claim, describe, destroy, own prefill, adoption of a shared
 * prefill). Its create parses the options into a per-sample kvb_method (budget and state); the registry then
 * binds the def to it (name, hooks, observation window) and installs the hooks on the context. The end of
 * prefill (compression, then the budget check) is the engine session's (engine/session.h kvb_end_prefill);
 * decode calls the select / observe / attend hooks. Methods never call a backend's kernels directly: they use
 * the backend op table and the KV store, so the same method runs on every backend.
 *
 * Budgets (methods/budget.h): a method declares the device-tier tokens it means to hold per layer
 * (expected_tokens); the run measures what the store really holds and kvb_method_verify fails when they
 * disagree by more than 1%.
 *
 * The registry (registry.c) is the only place that knows methods by name: callers ask it what a method needs
 * (kvb_method_needs_of) instead of testing names. docs/adding-a-method.md walks through adding one. */
#ifndef KVB_METHOD_H
#define KVB_METHOD_H

#include <stddef.h>
#include <stdint.h>

#include "engine/model.h"
#include "engine/session.h" /* kvb_kv_usage, kvb_session_method */
#include "methods/budget.h"
#include "methods/opts.h"

typedef struct kvb_method kvb_method;
typedef struct kvb_method_def kvb_method_def;
typedef struct kvb_share kvb_share;

/* One method, declared once (see above). Every function may be NULL unless it says otherwise. */
struct kvb_method_def {
    const char *name;
    const char *aliases; /* other names of the same method, comma-separated, or NULL */
    const char *summary; /* one line, for --help */
    int traits;          /* KVB_NEEDS_BUDGET | ... (below) */
    /* Observation-window rows it reads, from its options (NULL: none); -1 + err on a malformed option. The
     * registry sets the instance's hooks.obs_window from it: the window is stated here only. */
    int (*obs_window)(kvb_opts *o, int *rows, char *err, size_t err_len);
    /* The calibration profile section it reads with these options (kvb_method_needs.profile; NULL: none). */
    const char *(*profile)(kvb_opts *o);
    /* The per-token scorer it runs on the prefill's hidden states (KVzap's scorer=, methods/kvzap.h), which a shared
     * prefill must run for it (kvb_method_needs.scorer; NULL: none). */
    const char *(*scorer)(kvb_opts *o);
    /* Required: parse the options into a new instance (state, budget, imposes_budget, note) on context c;
     * NULL + one-line error for a bad option or an impossible budget. */
    kvb_method *(*create)(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len);
    /* The engine's per-layer hooks (self and obs_window are the registry's to set). */
    kvb_hooks hooks;
    /* Device-tier tokens per KV head the method means to hold in a layer now (store + vis); -1 = no claim. */
    int64_t (*expected_tokens)(kvb_method *m, kvb_ctx *c, int layer);
    /* Before any prompt: device-tier tokens per KV head each layer keeps (store + vis) at the end of an n-token
     * prompt's prefill, into keep[n_layer] (a local layer's entry is not read: it keeps its window); -1 + err when
     * the budget cannot be met at n. What a server promises a layer-wise end of prefill (KVB_LAYER_LOCAL,
     * judge/sched.h kvb_sched_peak_pages); NULL = kvb_method_budget_tokens in every global layer when the method
     * imposes its budget (SnapKV, StreamingLLM), else the whole prompt. */
    int (*kept_tokens)(const kvb_method *m, int64_t n, int64_t *keep, char *err, size_t err_len);
    /* The device share of the full KV the paper's memory formula gives for the current state (Round
     * Attention eq. 2, OmniKV's Mem%, PoD's key saving from its blocks); NULL = no formula. */
    double (*formula_frac)(kvb_method *m, kvb_ctx *c);
    /* Tokens per KV head a layer's attention reads outside its sources, at positions 0 .. n - 1 (KIVI's quantized
     * prefix, read by its attend hook): n; NULL = none. What fidelity's recall counts as read. */
    int64_t (*read_outside)(kvb_method *m, kvb_ctx *c, int layer);
    /* Their positions when they are not 0 .. n - 1 (ThinK's prompt after SnapKV's choice): KV head h's n into pos
     * (host); 0, or -1. NULL = 0 .. n - 1. */
    int (*outside_positions)(kvb_method *m, kvb_ctx *c, int layer, int h, int32_t *pos);
    /* Resolved parameters, "key=value ..." (for results and --help output). */
    void (*describe)(kvb_method *m, char *buf, size_t cap);
    /* Required: free the instance. */
    void (*destroy)(kvb_method *m);
    /* Prefill a single prompt (NULL = kvb_forward); Round Attention cuts it into rounds. */
    int (*prefill)(kvb_method *m, kvb_ctx *c, const int32_t *ids, int64_t n, char *err, size_t err_len);
    /* Take over statistics of a shared prefill (kvb_share) instead of having observed the prefill itself;
     * NULL for methods that need none. */
    int (*adopt)(kvb_method *m, kvb_ctx *c, const kvb_share *share, char *err, size_t err_len);
};

/* One method on one context (a sample): what its create made, bound to its def by the registry. Method files
 * embed it as the first member of their state. */
struct kvb_method {
    const kvb_method_def *def; /* set by the registry */
    const char *name;          /* def->name (set by the registry) */
    kvb_hooks hooks;           /* def->hooks; self = this struct, obs_window from def->obs_window (the registry's) */
    kvb_budget budget;
    int imposes_budget;  /* 0: the budget is reported, not imposed (full, round) */
    kvc_store *vis;      /* optional device-tier store of packed/selected tokens the method attends to */
    int64_t extra_device_bytes; /* device KV the method holds outside the stores (PoD's V-only rows) */
    int64_t n_prompt;    /* tokens at the end of prefill (set by after_prefill) */
    char note[160];      /* what the results should say (e.g. "rounds = 512-token chunks") */
    int n_global, n_local; /* the model's layers (kvb_method_bind_layers): local = sliding-window, kept whole */
    int64_t window;        /* the local layers' window in tokens */
};

/* What a method needs from the session that runs it (engine/session.h): its def's traits and option readers
 * resolved for given options, before any context exists (derived, never declared by a method). */
typedef struct {
    const char *name;     /* canonical name, aliases resolved ("flash" -> "full") */
    int needs_budget;     /* 1: a budget is required and imposed; 0: takes no budget (full) or reports it (round) */
    int prefill_scores;   /* needs accumulated prefill attention from a shared prefill (H2O) */
    int obs_window;       /* rows of the observation window it reads from a shared prefill (SnapKV: its
                             `window` option, default 32; 0 = none) — read from the options given */
    int own_prefill;      /* prefills round by round itself (Round Attention): a shared prefill forks it after
                             the history rounds and it prefills the question round */
    int shares_prefill;   /* may adopt a shared exact prefill (all but methods whose prefill is not exact) */
    int takes_budget;     /* 0: refuses any budget below 100% (full, the baseline): a suite runs it once */
    const char *profile;  /* the calibration profile section it reads with these options (methods/profile.h:
                             "round" without lw=, "pod" without block=, "omnikv" with layers=profile), or NULL */
    char scorer[128];     /* the scorer a shared prefill runs for it (KVzap's scorer=; "" = none): one per share */
} kvb_method_needs;

/* Method traits (kvb_method_def.traits), the data behind kvb_method_needs. */
enum {
    KVB_NEEDS_BUDGET = 1 << 0,
    KVB_NO_BUDGET = 1 << 1,
    KVB_PREFILL_SCORES = 1 << 2,
    KVB_OWN_PREFILL = 1 << 3,
    KVB_SHARES_PREFILL = 1 << 4,
    /* its end of prefill is layer-local: after_prefill ends the layers kvb_prefill_layers names, and ending layer l
     * reads only layer l and earlier ones (their KV, their observation-window rows: SnapKV and StreamingLLM compress
     * l from l alone; OmniKV moves a sparse layer to the host and, once the last sparse layer a filter layer serves
     * has ended, selects from the filter layer and loads them) and changes nothing a later layer's input is computed
     * from; so a prompt prefilled as one chunk may end layer by layer (engine/model.h kvb_ctx_end_prefill_by_layer)
     * with the same kept sets, and a server promises it what each layer keeps (kept_tokens) plus one layer's full KV
     * (judge/sched.h) */
    KVB_LAYER_LOCAL = 1 << 5,
    /* it reads the observation window after the end of prefill (OmniKV's filter layers score with it every step,
     * DecodingPress's SnapKV base at each cut), so decode keeps recording it; for every other method the end of
     * prefill stops the window (engine/model.h kvb_hooks.obs_decode; test_obs_window holds each method to it) */
    KVB_DECODE_WINDOW = 1 << 6,
    /* no hook reads host-tier KV memory from host code without a sync of its own first (OmniKV: its loads read the
     * host tier on the device, in the stream's order, and its selection comes down by its own synced copy; Round
     * Attention reads its offloaded round ids on the host once a question, after the sync that brings its round
     * scores down), so the engine does not wait for the device before each layer's hooks while host-tier rows exist
     * (engine/model.h kvb_hooks.no_host_reads; test_host_waits counts each method's waits in a decode step) */
    KVB_NO_HOST_READS = 1 << 7,
};

/* A method's budget on its model (kvb_budget_tokens, kvb_budget_at) per global layer. On a hybrid model (Gemma 3's
 * sliding-window local layers, which keep their window and are no method's to touch) a fraction f is of the
 * cache the model really holds: each of G global layers keeps (f (G n + L w) - L w) / G tokens for L local
 * layers of w = min(n, window), so the whole cache is f of full's; -1 + a line naming the windows' share when
 * that is under one token. Every layer global: the plain budget. */
int kvb_method_budget_tokens(const kvb_method *m, int64_t n, int64_t *out, char *err, size_t err_len);
int64_t kvb_method_budget_at(const kvb_method *m, int64_t len);
/* Count the model's global and local layers into m (the registry, after create). */
void kvb_method_bind_layers(kvb_method *m, const kvb_config *cfg);

/* Registered method by name or alias (NULL = unknown). */
const kvb_method_def *kvb_method_find(const char *name);
int kvb_method_count(void);
const kvb_method_def *kvb_method_at(int i);
/* "full (flash), streamingllm, ..." for help and error messages */
void kvb_method_names(char *buf, size_t cap);
/* What `--method all` means: every method but the baseline and those reading a trained per-model scorer (KVzap),
 * comma-separated ("streamingllm,h2o,...") */
void kvb_method_names_all(char *buf, size_t cap);
/* What method `name` with options o needs from the session (aliases resolved); -1 + one-line error for an
 * unknown method or a malformed option it reads. Does not mark options used. */
int kvb_method_needs_of(const char *name, const kvb_opts *o, kvb_method_needs *out, char *err, size_t err_len);
/* Adds nd to u, the needs of a shared prefill that several methods adopt: the largest window, the scores and the own
 * prefill if any of them asks. */
void kvb_method_needs_merge(kvb_method_needs *u, const kvb_method_needs *nd);

/* Create a method by name on a context and install its hooks. Unknown name, bad option or impossible
 * budget: NULL + one-line error. Options no method read are an error. */
kvb_method *kvb_method_create(const char *name, kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err,
                              size_t err_len);
/* Uninstall the hooks from c and free. NULL is a no-op. */
void kvb_method_free(kvb_method *m, kvb_ctx *c);

/* Prefill a prompt with the method outside a session (its own prefill or kvb_forward), then the end of prefill
 * (engine/session.h kvb_end_prefill: the method compresses, its budget is verified). m may be NULL. */
int kvb_method_prefill(kvb_method *m, kvb_ctx *c, const int32_t *ids, int64_t n, char *err, size_t err_len);

/* ---- shared prefill (DESIGN.md "Data flow") ----
 * One exact prefill serves every method that compresses after prefill: install a kvb_share on a context
 * before prefill (it keeps the observation window and, when asked, H2O's accumulated attention per slot),
 * then per method kvb_ctx_fork the context and kvb_method_adopt the share. What the share must keep comes from
 * the methods that will adopt it (kvb_method_needs_of): obs_window = the largest of their obs_window (fork
 * with the same), want_scores = any of them needs prefill_scores; a method adopts any share that keeps at
 * least what it needs. */
kvb_share *kvb_share_create(kvb_ctx *c, int obs_window, int want_scores, char *err, size_t err_len);
/* The share the methods of needs u (merged: kvb_method_needs_merge) adopt: its window, scores and scorer. */
kvb_share *kvb_share_for(kvb_ctx *c, const kvb_method_needs *u, char *err, size_t err_len);
/* Accumulated attention of every prefill query on slot j of (layer, KV head), summed over the group's heads. */
const float *kvb_share_scores(const kvb_share *s, int layer, int h, int64_t *n);
int kvb_share_obs_window(const kvb_share *s);
/* Run KVzap's scorer spec (methods/kvzap.h) on every prefill chunk, for the kvzap cells that adopt the share; 0, or
 * -1 + err (an unreadable scorer). Before the prefill. */
int kvb_share_run_scorer(kvb_share *s, const char *spec, char *err, size_t err_len);
/* The scores it recorded (NULL: it ran none), and whether it ran spec. */
const struct kvb_kvzap *kvb_share_kvzap(const kvb_share *s);
int kvb_share_ran_scorer(const kvb_share *s, const char *spec);
/* The time its scorer took (ms, host clock, the device drained before each call): what the cells that do not read
 * the scores are not charged (benchmarks/shared_prefill.h kvb_shared_prefill_cell_ms). */
double kvb_share_scorer_ms(const kvb_share *s);
/* 0 when share s kept what method m needs to adopt it (H2O's scores, the observation window), else -1 + a line
 * naming what is missing. s may be NULL (nothing kept). */
int kvb_share_serves(const kvb_share *s, const kvb_method *m, char *err, size_t err_len);
void kvb_share_free(kvb_share *s, kvb_ctx *c);
/* Install a method on a forked context of a shared prefill outside a session: adopt the share's statistics
 * (the seam's adopt: refused when the share kept less than the method needs), then kvb_end_prefill. */
int kvb_method_adopt(kvb_method *m, kvb_ctx *c, const kvb_share *s, char *err, size_t err_len);

/* Measured KV of a context: store + the method's own device buffers. */
void kvb_method_usage(const kvb_method *m, const kvb_ctx *c, kvb_kv_usage *u);
/* The method as an engine session sees it (own prefill, adoption of a shared prefill, verify, usage), made from
 * its def. m may be NULL (full attention). */
kvb_session_method kvb_method_seam(kvb_method *m);

/* Check measured device KV per layer against the method's claim, and (at the end of prefill) the total
 * against the budget, within 1% (at least one token per head). -1 + "method X: layer L holds ..." on failure. */
int kvb_method_verify(kvb_method *m, kvb_ctx *c, int end_of_prefill, char *err, size_t err_len);

/* Shared helpers for method files. */
/* Indices of the k largest scores of a host array (ties: lower index first, NaN below every number), written
 * ascending into out: base/topk.c's kvb_topk (the order of the backends' topk_idx), sorted by index. Data on the
 * device goes through the backend's topk_idx instead. Returns 0 (kept int for callers). */
int kvb_topk_ascending(const float *score, int64_t n, int64_t k, int32_t *out);
/* Sort int32 ascending. */
void kvb_sort_i32(int32_t *v, int64_t n);
/* Attention probabilities of queries q ([n_q][n_head][head_dim], positions q_pos; device) over one layer's KV as
 * given by src (per KV head; NULL = the whole store layer), causal by position. *probs (device, release with
 * kvb_attn_probs_free) is [n_head][n_q][*stride] in each head's list order; lse (optional, device, [n_head][n_q]). */
int kvb_attn_probs(kvb_ctx *c, int layer, const float *q, const int32_t *q_pos, int64_t n_q, const kvb_src *src,
                   float **probs, int64_t *stride, float *lse, char *err, size_t err_len);
/* The same with the logits scaled by `scale` instead of the model's own (cfg.attn_scale; gemma3 27B: not
 * 1/sqrt(head_dim)), and q_pos NULL for no mask: Compactor's non-causal chunks take the raw dot products. */
int kvb_attn_probs_scaled(kvb_ctx *c, int layer, const float *q, const int32_t *q_pos, int64_t n_q,
                          const kvb_src *src, float scale, float **probs, int64_t *stride, float *lse, char *err,
                          size_t err_len);
void kvb_attn_probs_free(kvb_ctx *c, float *probs, int64_t n_q, int64_t stride);
/* Offloading methods (OmniKV, Round Attention): append the current chunk's K/V rows (the activations, on the
 * device) to the method's device buffer m->vis beside its packed load (the store's own append wrote them to the
 * host tier, counted there as a device->host move) and point src at the buffer. */
int kvb_vis_attend_packed(kvb_method *m, kvb_ctx *c, int layer, kvb_src *src, int64_t n_q, char *err, size_t err_len);
/* Fill src[n_head_kv] with the store's views of a layer. */
void kvb_src_from_store(const kvb_ctx *c, int layer, kvb_src *src);
/* Current sequence length during a hook: positions of the chunk being processed included. */
int64_t kvb_cur_len(const kvb_ctx *c, int64_t n_q);
/* The claim of a method that cuts the prompt once and then lets decode append (expected_tokens): the prompt so far
 * while it is prefilled, then min(keep, prompt) plus the tokens decoded since. */
int64_t kvb_kept_then_decoded(const kvb_method *m, const kvb_ctx *c, int64_t keep);
/* Per-slot attention scores on the device, aligned with a KV head's slots (H2O's accumulated attention, a shared
 * prefill's record of it). */
typedef struct {
    float *v;
    int64_t n, cap;
} kvb_score_row;
/* Room for n scores (kept ones copied). */
int kvb_score_row_fit(kvb_ctx *c, kvb_score_row *a, int64_t n, char *err, size_t err_len);
/* Grow to n slots (new ones 0) and add the attention probabilities ([n_head][n_q][stride], device) of KV head g's
 * query heads, summed over the group and the rows (backend probs_reduce). */
int kvb_score_row_add(kvb_ctx *c, kvb_score_row *a, const float *probs, int64_t stride, int g, int64_t n_q, int64_t n,
                      char *err, size_t err_len);
/* A sum_rows hook's answer (engine/model.h) for one layer's score rows rows[0..n_head_kv): each grown to its head's
 * list (src[g].n slots, new ones 0) and handed out in out[g], for the engine to add the probabilities' column sums
 * to (attention_colsum, never writing the probabilities); 1, or -1 + err. */
int kvb_score_rows_for_sums(kvb_ctx *c, kvb_score_row *rows, const kvb_src *src, float **out, char *err, size_t err_len);
void kvb_score_row_free(kvb_ctx *c, kvb_score_row *a);
/* Allocate zeroed method state accounted to (device, method): device memory, for backend ops. */
void *kvb_method_alloc(kvb_ctx *c, size_t bytes);
void kvb_method_release(kvb_ctx *c, void *p, size_t bytes);

#endif
