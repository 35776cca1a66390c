/* streamingllm.c — StreamingLLM (Xiao et al.; survey in papers/002): attention sinks (the first tokens) plus a
 * recent window; every other token is physically removed from the KV store.
 *
 * Choices (flags):
 * - Budget B tokens per head = budget x current length ("30%" tracks the sequence, so 100% never evicts);
 *   a token budget is fixed. sinks = max(4, 1% of the prompt) (OmniKV's setting: 1% sinks, the rest window);
 *   `sinks=N` overrides, `window=N` fixes the window instead of deriving it from the budget.
 * - Prefill is exact (what KV-compression benchmarks do): the cache is cut to sinks+window when the prompt
 *   is in, then every decode step evicts the oldest non-sink token before attention.
 * - Positions: original positions are kept (RoPE as computed at append). The paper's in-cache re-positioning
 *   is not supported (`reposition=1` is refused). */
#include "methods/method.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct {
    kvb_method base;
    int64_t sinks, window; /* window < 0: derived from the budget */
    int64_t sinks_opt;
} sllm;

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

/* Tokens the head may hold at sequence length len. */
static int64_t keep_at(sllm *s, int64_t len) {
    if (s->window >= 0) return s->sinks + s->window < len ? s->sinks + s->window : len;
    return kvb_method_budget_at(&s->base, len);
}

/* Evict the oldest non-sink tokens of every head of a layer until it holds `keep` (on the backend: a head holds
 * at least one non-sink token while it holds more than keep >= sinks), the layer's heads in one backend call. */
static int evict_to(sllm *s, kvb_ctx *c, int l, int64_t keep, char *err, size_t err_len) {
    return kvc_evict_heads(c->kv, l, c->model->cfg.n_head_kv, NULL, NULL, (int32_t)s->sinks, INT32_MAX, keep, NULL,
                           err, err_len);
}

static int sllm_after_prefill(void *self, kvb_ctx *c, char *err, size_t err_len) {
    sllm *s = self;
    int64_t n = c->n_past;
    s->base.n_prompt = n;
    int64_t b;
    if (kvb_method_budget_tokens(&s->base, n, &b, err, err_len)) return -1;
    s->sinks = s->sinks_opt >= 0 ? s->sinks_opt : (int64_t)ceil(0.01 * (double)n);
    if (s->sinks_opt < 0 && s->sinks < 4) s->sinks = 4;
    int64_t keep = keep_at(s, n);
    if (s->sinks > keep) s->sinks = keep;
    if (keep >= n) return 0;
    /* after prefill slots are in position order: keep [0, sinks) and the last keep - sinks */
    int32_t *idx = malloc((size_t)keep * sizeof *idx);
    if (!idx) return ERR("out of memory");
    for (int64_t i = 0; i < s->sinks; i++) idx[i] = (int32_t)i;
    for (int64_t i = s->sinks; i < keep; i++) idx[i] = (int32_t)(n - keep + i);
    int rc = 0, from, to; /* every layer, or one (a layer-wise end of prefill: engine/model.h kvb_prefill_layers) */
    kvb_prefill_layers(c, &from, &to);
    for (int l = from; l < to && !rc; l++)
        for (int h = 0; h < c->model->cfg.n_head_kv && !rc && !kvb_layer_window(&c->model->cfg, l); h++) /* a local layer keeps its window */ rc = kvc_retain(c->kv, l, h, idx, keep, err, err_len);
    free(idx);
    return rc;
}

static int sllm_select(void *self, kvb_ctx *c, int layer, kvb_src *src, int64_t n_q, char *err, size_t err_len) {
    sllm *s = self;
    if (c->in_prefill) return 0;
    if (evict_to(s, c, layer, keep_at(s, kvb_cur_len(c, n_q)), err, err_len)) return -1;
    kvb_src_from_store(c, layer, src);
    return 0;
}

static int64_t sllm_expected(kvb_method *m, kvb_ctx *c, int layer) {
    (void)layer;
    return c->in_prefill ? c->n_past : keep_at((sllm *)m, c->n_past);
}

static void sllm_describe(kvb_method *m, char *buf, size_t cap) {
    sllm *s = (sllm *)m;
    snprintf(buf, cap, "sinks=%lld window=%lld", (long long)s->sinks,
             (long long)(s->window >= 0 ? s->window : keep_at(s, m->n_prompt) - s->sinks));
}

static void sllm_destroy(kvb_method *m) { free(m); }

static kvb_method *streamingllm_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len) {
    (void)c;
    sllm *s = calloc(1, sizeof *s);
    if (!s) { ERR("out of memory"); return NULL; }
    s->sinks_opt = -1;
    s->window = -1;
    int64_t v;
    int r;
    if ((r = kvb_opts_int(o, "sinks", &s->sinks_opt, err, err_len)) < 0) goto fail;
    if (r && s->sinks_opt < 0) { ERR("streamingllm: sinks must be >= 0"); goto fail; }
    if ((r = kvb_opts_int(o, "window", &s->window, err, err_len)) < 0) goto fail;
    if (r && s->window < 1) { ERR("streamingllm: window must be >= 1"); goto fail; }
    if ((r = kvb_opts_int(o, "reposition", &v, err, err_len)) < 0) goto fail;
    if (r && v) { ERR("streamingllm: reposition=1 (in-cache positions) is not supported; original positions are kept"); goto fail; }
    if (s->window >= 0 && s->sinks_opt < 0) s->sinks_opt = 4;
    s->base.budget = *b;
    s->base.imposes_budget = s->window < 0;
    return &s->base;
fail:
    free(s);
    return NULL;
}

const kvb_method_def kvb_method_streamingllm = {
    .name = "streamingllm",
    .summary = "attention sinks + recent window, the rest evicted",
    .traits = KVB_NEEDS_BUDGET | KVB_SHARES_PREFILL | KVB_LAYER_LOCAL,
    .create = streamingllm_create,
    .hooks = {.select = sllm_select, .after_prefill = sllm_after_prefill},
    .expected_tokens = sllm_expected,
    .describe = sllm_describe,
    .destroy = sllm_destroy,
};
