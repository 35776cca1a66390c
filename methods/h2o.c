/* h2o.c — H2O heavy-hitter oracle (Zhang et al.; survey in papers/002): each token's score is the attention
 * it has received, accumulated over prefill and every decode step (GQA: summed over the query heads of the
 * KV head's group); the cache keeps the heavy hitters plus the most recent tokens, half and half of the
 * budget, and evicts the lowest-scoring non-recent token at every step once full.
 *
 * Choices (flags):
 * - Budget B per head = budget x current length ("30%" tracks the sequence, so 100% never evicts); a token
 *   budget is fixed. `heavy=F` sets the heavy-hitter share (default 0.5).
 * - Prefill is exact and scores every query's attention (the paper's accumulation over the prompt); the
 *   cache is cut once the prompt is in (`KVCache-Factory`-style), then decode evicts every step. */
#include "methods/method.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    kvb_method base;
    kvb_ctx *c;
    double heavy_share;
    kvb_score_row *acc; /* [layer][head], aligned with the store's slots */
    float **rows;       /* host [n_head_kv]: one layer's accumulators, for kvc_evict_heads */
} h2o;

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

static kvb_score_row *acc_at(h2o *s, int l, int h) { return &s->acc[(size_t)l * s->c->model->cfg.n_head_kv + h]; }

static int64_t recent_of(h2o *s, int64_t b) { return b - (int64_t)floor(s->heavy_share * (double)b); }

/* decode: the step's probabilities (one query: n_head rows), for the eviction that follows */
static int h2o_wants(void *self, kvb_ctx *c, int layer, int64_t n_q) {
    (void)self; (void)layer; (void)n_q;
    return !c->in_prefill;
}

/* prefill: every query's attention summed into the accumulators, the probabilities never written */
static int h2o_sum_rows(void *self, kvb_ctx *c, int layer, const kvb_src *src, int64_t n_q, float **rows, char *err,
                        size_t err_len) {
    (void)n_q;
    h2o *s = self;
    return c->in_prefill ? kvb_score_rows_for_sums(c, acc_at(s, layer, 0), src, rows, err, err_len) : 0;
}

static int h2o_observe(void *self, kvb_ctx *c, int layer, const kvb_src *src, const float *probs, int64_t stride,
                       int64_t n_q, char *err, size_t err_len) {
    h2o *s = self;
    const kvb_config *cfg = &c->model->cfg;
    for (int g = 0; g < cfg->n_head_kv; g++) {
        if (kvb_score_row_add(c, acc_at(s, layer, g), probs, stride, g, n_q, src[g].n, err, err_len)) return -1;
    }
    if (c->in_prefill) return 0;
    /* decode: evict the lowest-scoring non-recent tokens down to the budget (ties: the lowest slot) */
    int64_t len = kvb_cur_len(c, n_q), b = kvb_method_budget_at(&s->base, len), recent = recent_of(s, b);
    for (int g = 0; g < cfg->n_head_kv; g++) s->rows[g] = acc_at(s, layer, g)->v;
    if (kvc_evict_heads(c->kv, layer, cfg->n_head_kv, NULL, s->rows, INT32_MIN, (int32_t)(len - recent), b, NULL, err,
                        err_len))
        return -1;
    for (int g = 0; g < cfg->n_head_kv; g++) {
        kvb_score_row *a = acc_at(s, layer, g);
        if (a->n > b) a->n = b; /* each row followed its head's slots down to the budget */
    }
    return 0;
}

static int h2o_after_prefill(void *self, kvb_ctx *c, char *err, size_t err_len) {
    h2o *s = self;
    kvb_backend *be = c->be;
    int64_t n = c->n_past;
    s->base.n_prompt = n;
    int64_t b;
    if (kvb_method_budget_tokens(&s->base, n, &b, err, err_len)) return -1;
    b = kvb_method_budget_at(&s->base, n);
    int from, to; /* every layer, or one (a layer-wise end of prefill: engine/model.h kvb_prefill_layers) */
    kvb_prefill_layers(c, &from, &to);
    if (b >= n || from >= to) return 0;
    int64_t recent = recent_of(s, b), heavy = b - recent, cand = n - recent;
    size_t idx_bytes = (size_t)b * sizeof(int32_t), tmp_bytes = (size_t)(b > 0 ? b : 1) * sizeof(float);
    int32_t *idx = kvb_method_alloc(c, idx_bytes ? idx_bytes : 1);
    float *tmp = kvb_method_alloc(c, tmp_bytes);
    int rc = idx && tmp ? 0 : ERR("h2o: out of memory");
    for (int l = from; l < to && !rc; l++)
        for (int h = 0; h < c->model->cfg.n_head_kv && !rc && !kvb_layer_window(&c->model->cfg, l); h++) /* a local layer keeps its window */ {
            kvb_score_row *a = acc_at(s, l, h);
            /* slots are in position order after prefill: candidates are [0, cand), recent [cand, n) */
            rc = be->topk_idx(be, idx, a->v, cand, heavy, err, err_len) ||
                 be->iota(be, idx + heavy, (int32_t)cand, recent, err, err_len) ||
                 be->gather_f32(be, tmp, a->v, idx, b, err, err_len) ||
                 be->copy(be, a->v, tmp, (size_t)b * sizeof(float), KVB_COPY_D2D, err, err_len) ||
                 kvc_retain_dev(c->kv, l, h, idx, b, err, err_len);
            a->n = b;
        }
    kvb_method_release(c, idx, idx_bytes ? idx_bytes : 1);
    kvb_method_release(c, tmp, tmp_bytes);
    return rc ? -1 : 0;
}

static int h2o_adopt(kvb_method *m, kvb_ctx *c, const kvb_share *share, char *err, size_t err_len) {
    h2o *s = (h2o *)m;
    for (int l = 0; l < c->model->cfg.n_layer; l++)
        for (int h = 0; h < c->model->cfg.n_head_kv && !kvb_layer_window(&c->model->cfg, l); h++) {
            int64_t n = 0;
            const float *src = kvb_share_scores(share, l, h, &n);
            kvb_score_row *a = acc_at(s, l, h);
            if (n != kvc_n(c->kv, l, h)) return ERR("h2o: shared prefill scored %lld slots, the cache holds %lld", (long long)n, (long long)kvc_n(c->kv, l, h));
            if (kvb_score_row_fit(c, a, n, err, err_len) ||
                (n && c->be->copy(c->be, a->v, src, (size_t)n * sizeof(float), KVB_COPY_D2D, err, err_len)))
                return -1;
            a->n = n;
        }
    return 0;
}

static int64_t h2o_expected(kvb_method *m, kvb_ctx *c, int layer) {
    (void)layer;
    return c->in_prefill ? c->n_past : kvb_method_budget_at(m, c->n_past);
}

static void h2o_describe(kvb_method *m, char *buf, size_t cap) {
    h2o *s = (h2o *)m;
    int64_t b = kvb_method_budget_at(&s->base, m->n_prompt);
    snprintf(buf, cap, "heavy=%lld recent=%lld", (long long)(b - recent_of(s, b)), (long long)recent_of(s, b));
}

static void h2o_destroy(kvb_method *m) {
    h2o *s = (h2o *)m;
    if (s->acc) {
        int n = s->c->model->cfg.n_layer * s->c->model->cfg.n_head_kv;
        for (int i = 0; i < n; i++) kvb_score_row_free(s->c, &s->acc[i]);
        free(s->acc);
    }
    free(s->rows);
    free(s);
}

static kvb_method *h2o_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len) {
    h2o *s = calloc(1, sizeof *s);
    if (!s) { ERR("out of memory"); return NULL; }
    s->c = c;
    s->heavy_share = 0.5;
    int r = kvb_opts_double(o, "heavy", &s->heavy_share, err, err_len);
    if (r < 0) { free(s); return NULL; }
    if (!(s->heavy_share >= 0 && s->heavy_share < 1)) { ERR("h2o: heavy must be in [0, 1)"); free(s); return NULL; }
    s->acc = calloc((size_t)c->model->cfg.n_layer * c->model->cfg.n_head_kv, sizeof *s->acc);
    s->rows = malloc((size_t)c->model->cfg.n_head_kv * sizeof *s->rows);
    if (!s->acc || !s->rows) { ERR("out of memory"); free(s->acc); free(s->rows); free(s); return NULL; }
    s->base.budget = *b;
    s->base.imposes_budget = 1;
    return &s->base;
}

const kvb_method_def kvb_method_h2o = {
    .name = "h2o",
    .summary = "heavy hitters + recent tokens, evicting every step",
    .traits = KVB_NEEDS_BUDGET | KVB_SHARES_PREFILL | KVB_PREFILL_SCORES | KVB_LAYER_LOCAL,
    .create = h2o_create,
    .hooks = {.wants_probs = h2o_wants, .observe = h2o_observe, .sum_rows = h2o_sum_rows, .after_prefill = h2o_after_prefill},
    .expected_tokens = h2o_expected,
    .describe = h2o_describe,
    .destroy = h2o_destroy,
    .adopt = h2o_adopt,
};
