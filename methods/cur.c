/* cur.c — CurDKV (Sengupta, Chakraborty et al. 2025, "Value-Guided KV Compression for LLMs via Approximated CUR
 * Decomposition", arXiv 2509.15038), as kvpress's CURPress scores it: a token matters as much as its rows weigh in
 * a CUR decomposition of the key and value matrices, whose leverage scores the press approximates by the rows'
 * squared norms, each normalised over a local window of slots:
 *
 *     k2_j = ||k_j||^2 / sum_{i in w(j)} ||k_i||^2,   v2_j = ||v_j||^2 / sum_{i in w(j)} ||v_i||^2,   score_j = k2_j v2_j
 *
 * w(j) the window of `window` slots holding j (slots 0..15, 16..31, ...; the last one partial, as kvpress's zero
 * padding gives). The first `sinks` tokens are kept whatever their score. Once the prompt is in, each layer and KV
 * head keeps its top B tokens; decode appends without evicting.
 *
 * Choices (the paper and the press leave them open, or kvbench differs):
 * - kvpress's defaults: leverage=kv_product (k2 v2), sinks=4, window=16 (use_local_approximation); `leverage=key`,
 *   `value` and `kv_avg` ((k2 + v2) / 2) are kvpress's other types. kvpress's use_random_leverage (a Gaussian
 *   projection to 20 dimensions first) is not offered: its draw is torch's, which kvbench cannot repeat.
 * - The keys are the cached, post-RoPE ones (kvpress scores the cache's keys too); the values as cached.
 * - kvpress divides the scores by their sum per head, a positive multiple that changes no ranking: left out. Its
 *   sinks score 1.0, above every normalised score; here they get 1e30, above any score (so B < sinks keeps the
 *   first B tokens, ties to the earlier token, as everywhere in kvbench; kvpress's torch.topk leaves such ties
 *   unordered). A window of zero rows gives 0/0 = NaN: torch ranks NaN first, kvbench's top-k last.
 * - How it is computed, per layer and KV head, all on the device: row_norms of K and V (each norm rounded to float,
 *   then squared in float by mul_f32: within 2 float roundings of the double sum of squares), block_normalize
 *   over the windows, mul_f32 (or axpby_f32 for kv_avg), fill_idx_f32 for the sinks, topk_idx, kvc_retain_dev.
 * - Budget B per head = budget x prompt length rounded (kvb_budget_tokens; kvpress: int(n (1 - ratio))).
 * - Against kvpress 0.5.5 (test_kvpress_kept, default model, 3765 tokens, 1129 kept): Jaccard 0.995 at least per
 *   head, 0.999 on average. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "methods/method.h"

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)
#define SINK_SCORE 1e30f

typedef enum { LEV_KV_PRODUCT = 0, LEV_KEY, LEV_VALUE, LEV_KV_AVG } leverage;
static const char *const LEVERAGE[] = {"kv_product", "key", "value", "kv_avg"};

typedef struct {
    kvb_method base;
    int64_t sinks, window;
    leverage lev;
    int64_t keep; /* tokens kept per head after prefill */
} cur;

/* score[0..n) of layer l's KV head g; k2, v2: [n] device scratch */
static int cur_scores(const cur *s, kvb_ctx *c, int l, int g, int64_t n, float *k2, float *v2, float *score,
                      char *err, size_t err_len) {
    kvb_backend *be = c->be;
    const int d = c->model->cfg.head_dim;
    const kvc_view v = kvc_head_view(c->kv, l, g); /* slots in position order after prefill */
    if (s->lev != LEV_VALUE &&
        (be->row_norms(be, k2, v.k, v.dtype, d, n, 0, err, err_len) || be->mul_f32(be, k2, k2, k2, n, err, err_len) ||
         be->block_normalize(be, k2, n, s->window, err, err_len)))
        return -1;
    if (s->lev != LEV_KEY &&
        (be->row_norms(be, v2, v.v, v.dtype, d, n, 0, err, err_len) || be->mul_f32(be, v2, v2, v2, n, err, err_len) ||
         be->block_normalize(be, v2, n, s->window, err, err_len)))
        return -1;
    switch (s->lev) {
    case LEV_KV_PRODUCT: return be->mul_f32(be, score, k2, v2, n, err, err_len);
    case LEV_KV_AVG: return be->axpby_f32(be, score, k2, 0.5, v2, 0.5, 0.0, n, err, err_len);
    case LEV_KEY: return be->copy(be, score, k2, (size_t)n * sizeof(float), KVB_COPY_D2D, err, err_len);
    default: return be->copy(be, score, v2, (size_t)n * sizeof(float), KVB_COPY_D2D, err, err_len);
    }
}

static int cur_after_prefill(void *self, kvb_ctx *c, char *err, size_t err_len) {
    cur *s = self;
    kvb_backend *be = c->be;
    const kvb_config *cfg = &c->model->cfg;
    const int64_t n = c->n_past, n_sink = s->sinks < n ? s->sinks : n;
    s->base.n_prompt = n;
    if (kvb_method_budget_tokens(&s->base, n, &s->keep, err, err_len)) return -1;
    int from, to; /* every layer, or one (a layer-wise end of prefill: engine/model.h kvb_prefill_layers) */
    kvb_prefill_layers(c, &from, &to);
    if (s->keep >= n || from >= to) return 0;
    const size_t vec_bytes = (size_t)n * sizeof(float), idx_bytes = (size_t)(s->keep + n_sink + 1) * sizeof(int32_t);
    float *k2 = kvb_method_alloc(c, vec_bytes), *v2 = kvb_method_alloc(c, vec_bytes), *score = kvb_method_alloc(c, vec_bytes);
    int32_t *idx = kvb_method_alloc(c, idx_bytes), *sink = idx + s->keep;
    int rc = k2 && v2 && score && idx ? 0 : ERR("cur: out of memory");
    if (!rc) rc = be->iota(be, sink, 0, n_sink, err, err_len);
    for (int l = from; l < to && !rc; l++)
        for (int g = 0; g < cfg->n_head_kv && !rc && !kvb_layer_window(cfg, l); g++) /* a local layer keeps its window */
            rc = cur_scores(s, c, l, g, n, k2, v2, score, err, err_len) ||
                 be->fill_idx_f32(be, score, sink, n_sink, SINK_SCORE, err, err_len) ||
                 be->topk_idx(be, idx, score, n, s->keep, err, err_len) ||
                 kvc_retain_dev(c->kv, l, g, idx, s->keep, err, err_len);
    kvb_method_release(c, k2, vec_bytes);
    kvb_method_release(c, v2, vec_bytes);
    kvb_method_release(c, score, vec_bytes);
    kvb_method_release(c, idx, idx_bytes);
    return rc ? -1 : 0;
}

static int64_t cur_expected(kvb_method *m, kvb_ctx *c, int layer) {
    (void)layer;
    cur *s = (cur *)m;
    return kvb_kept_then_decoded(m, c, s->keep);
}

static void cur_describe(kvb_method *m, char *buf, size_t cap) {
    const cur *s = (const cur *)m;
    snprintf(buf, cap, "leverage=%s sinks=%lld window=%lld keep=%lld", LEVERAGE[s->lev], (long long)s->sinks,
             (long long)s->window, (long long)s->keep);
}

static void cur_destroy(kvb_method *m) { free(m); }

static kvb_method *cur_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len) {
    (void)c;
    cur *s = calloc(1, sizeof *s);
    if (!s) {
        ERR("out of memory");
        return NULL;
    }
    s->sinks = 4;
    s->window = 16;
    if (kvb_opts_int(o, "sinks", &s->sinks, err, err_len) < 0 || kvb_opts_int(o, "window", &s->window, err, err_len) < 0)
        goto fail;
    if (s->sinks < 0 || s->window < 1) {
        ERR("cur: sinks must be >= 0 and window >= 1");
        goto fail;
    }
    const char *lev = kvb_opts_get(o, "leverage");
    if (lev) {
        int found = -1;
        for (int i = 0; i < (int)(sizeof LEVERAGE / sizeof *LEVERAGE); i++)
            if (!strcmp(lev, LEVERAGE[i])) found = i;
        if (found < 0) {
            ERR("cur: leverage=%s is not kv_product, key, value or kv_avg", lev);
            goto fail;
        }
        s->lev = (leverage)found;
    }
    s->base.budget = *b;
    s->base.imposes_budget = 1;
    return &s->base;
fail:
    free(s);
    return NULL;
}

const kvb_method_def kvb_method_cur = {
    .name = "cur",
    .summary = "CurDKV: keeps the tokens of highest key x value leverage (squared norms over local windows), once after prefill",
    .traits = KVB_NEEDS_BUDGET | KVB_SHARES_PREFILL | KVB_LAYER_LOCAL,
    .create = cur_create,
    .hooks = {.after_prefill = cur_after_prefill},
    .expected_tokens = cur_expected,
    .describe = cur_describe,
    .destroy = cur_destroy,
};
