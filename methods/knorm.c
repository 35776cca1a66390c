/* knorm.c — Knorm (Devoto et al. 2024, "A simple and effective L2 norm-based strategy for KV cache
 * compression"): the paper observes that keys with a low L2 norm ||k_j||_2 draw high attention, so once the prompt
 * is in, each layer and KV head keeps the B tokens whose (post-RoPE, as cached) keys have the lowest norm and
 * evicts the rest. The score is query-independent: no attention is computed. Decode appends without evicting.
 *
 * Choices (flags):
 * - As kvpress's KnormPress (score = -||k||, top-k per KV head, every layer compressed): no recent window by
 *   default; window=N keeps the last N prompt tokens besides the B - N lowest-norm earlier ones.
 * - Budget B per head = budget x prompt length (or a token count), ties to the earlier token. Norms are summed in
 *   double from the stored K rows (f16 or f32). */
#include "methods/method.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct {
    kvb_method base;
    int64_t window;
    int64_t keep; /* tokens kept per head after prefill */
} knorm;

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

static int knorm_after_prefill(void *self, kvb_ctx *c, char *err, size_t err_len) {
    knorm *s = self;
    kvb_backend *be = c->be;
    const kvb_config *cfg = &c->model->cfg;
    int64_t n = c->n_past;
    s->base.n_prompt = n;
    if (kvb_method_budget_tokens(&s->base, n, &s->keep, err, err_len)) return -1;
    int from, to; /* every layer, or one (a layer-wise end of prefill: engine/model.h kvb_prefill_layers) */
    kvb_prefill_layers(c, &from, &to);
    if (s->keep >= n || from >= to) return 0;
    int64_t w = s->window < s->keep ? s->window : s->keep, cand = n - w;
    size_t idx_bytes = (size_t)s->keep * sizeof(int32_t), score_bytes = (size_t)n * sizeof(float);
    int32_t *idx = kvb_method_alloc(c, idx_bytes);
    float *score = kvb_method_alloc(c, score_bytes);
    int rc = idx && score ? 0 : ERR("knorm: out of memory");
    for (int l = from; l < to && !rc; l++)
        for (int g = 0; g < cfg->n_head_kv && !rc && !kvb_layer_window(cfg, l); g++) /* a local layer keeps its window */ {
            kvc_view v = kvc_head_view(c->kv, l, g); /* slots in position order after prefill */
            rc = be->row_norms(be, score, v.k, v.dtype, cfg->head_dim, cand, 1, err, err_len) ||
                 be->topk_idx(be, idx, score, cand, s->keep - w, err, err_len) ||
                 be->iota(be, idx + s->keep - w, (int32_t)cand, w, err, err_len) ||
                 kvc_retain_dev(c->kv, l, g, idx, s->keep, err, err_len);
        }
    kvb_method_release(c, idx, idx_bytes);
    kvb_method_release(c, score, score_bytes);
    return rc ? -1 : 0;
}

static int64_t knorm_expected(kvb_method *m, kvb_ctx *c, int layer) {
    (void)layer;
    knorm *s = (knorm *)m;
    return kvb_kept_then_decoded(m, c, s->keep);
}

static void knorm_describe(kvb_method *m, char *buf, size_t cap) {
    knorm *s = (knorm *)m;
    snprintf(buf, cap, "window=%lld keep=%lld", (long long)s->window, (long long)s->keep);
}

static void knorm_destroy(kvb_method *m) { free(m); }

static kvb_method *knorm_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len) {
    (void)c;
    knorm *s = calloc(1, sizeof *s);
    if (!s) { ERR("out of memory"); return NULL; }
    if (kvb_opts_int(o, "window", &s->window, err, err_len) < 0) { free(s); return NULL; }
    if (s->window < 0) { ERR("knorm: window must be >= 0"); free(s); return NULL; }
    s->base.budget = *b;
    s->base.imposes_budget = 1;
    return &s->base;
}

const kvb_method_def kvb_method_knorm = {
    .name = "knorm",
    .summary = "keeps the tokens whose keys have the lowest L2 norm, once after prefill",
    .traits = KVB_NEEDS_BUDGET | KVB_SHARES_PREFILL | KVB_LAYER_LOCAL,
    .create = knorm_create,
    .hooks = {.after_prefill = knorm_after_prefill},
    .expected_tokens = knorm_expected,
    .describe = knorm_describe,
    .destroy = knorm_destroy,
};
