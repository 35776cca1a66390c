/* snapkv.c — SnapKV (Li et al.; survey in papers/002): once the prompt is in, each layer and KV head scores
 * the prefix tokens by the attention the last `window` queries give them (summed over the window and over the
 * group's query heads), smooths the scores with a 1-D max pool (kernel 7, same padding), keeps the top-k
 * prefix tokens plus the window itself, and evicts the rest. Decode appends without evicting.
 *
 * Choices (flags): window=32, kernel=7, pool=max|avg (max: the and KVCache-Factory's default).
 * Budget B per head = budget x prompt length (or a token count); k = B - window. When B <= window the cache
 * keeps the last B tokens. */
#include "methods/method.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    kvb_method base;
    int64_t window, kernel;
    int avg_pool;
    int64_t keep; /* tokens kept per head after prefill */
} snapkv;

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

/* One layer: the window's attention over the prompt, summed over the window and each group's query heads (per
 * KV head, prefix slots only), pooled, top-k; all on the backend. score, pooled: [n_head_kv][n_prefix]; idx:
 * [keep] (device). */
static int compress_layer(snapkv *s, kvb_ctx *c, int l, int64_t n, int64_t w, int32_t *idx, float *score,
                          float *pooled, char *err, size_t err_len) {
    kvb_backend *be = c->be;
    const kvb_config *cfg = &c->model->cfg;
    const float *q = c->obs_q + ((size_t)l * c->obs_cap + (size_t)(c->obs_n - w)) * cfg->n_embd;
    float *probs = NULL;
    int64_t stride = 0;
    if (kvb_attn_probs(c, l, q, c->obs_pos + (c->obs_n - w), w, NULL, &probs, &stride, NULL, err, err_len)) return -1;
    int64_t n_prefix = n - w, k = s->keep - w;
    int rc = be->probs_reduce(be, score, n_prefix, probs, stride, cfg->n_head, cfg->n_head_kv, w, n_prefix, NULL,
                              KVB_REDUCE_GROUP_SUM, 0, err, err_len) ||
             be->pool1d(be, pooled, n_prefix, score, n_prefix, cfg->n_head_kv, n_prefix, s->kernel, s->avg_pool, err,
                        err_len);
    for (int g = 0; g < cfg->n_head_kv && !rc; g++)
        rc = be->topk_idx(be, idx, pooled + (size_t)g * n_prefix, n_prefix, k, err, err_len) ||
             be->iota(be, idx + k, (int32_t)n_prefix, w, err, err_len) ||
             kvc_retain_dev(c->kv, l, g, idx, s->keep, err, err_len);
    kvb_attn_probs_free(c, probs, w, stride);
    return rc ? -1 : 0;
}

static int snapkv_after_prefill(void *self, kvb_ctx *c, char *err, size_t err_len) {
    snapkv *s = self;
    int64_t n = c->n_past;
    s->base.n_prompt = n;
    if (kvb_budget_tokens(&s->base.budget, n, &s->keep, err, err_len)) return -1;
    if (s->keep >= n) return 0;
    int64_t w = c->obs_n < s->window ? c->obs_n : s->window;
    if (s->keep <= w) w = 0; /* budget smaller than the window: keep the most recent tokens */
    const int HK = c->model->cfg.n_head_kv;
    int rc = 0;
    if (w == 0) {
        int32_t *idx = malloc((size_t)(s->keep > 0 ? s->keep : 1) * sizeof *idx);
        if (!idx) return ERR("out of memory");
        for (int64_t i = 0; i < s->keep; i++) idx[i] = (int32_t)(n - s->keep + i);
        for (int l = 0; l < c->model->cfg.n_layer && !rc; l++)
            for (int h = 0; h < HK && !rc; h++) rc = kvc_retain(c->kv, l, h, idx, s->keep, err, err_len);
        free(idx);
        return rc;
    }
    size_t idx_bytes = (size_t)s->keep * sizeof(int32_t), score_bytes = (size_t)HK * n * sizeof(float);
    int32_t *idx = kvb_method_alloc(c, idx_bytes);
    float *score = kvb_method_alloc(c, score_bytes), *pooled = kvb_method_alloc(c, score_bytes);
    if (!idx || !score || !pooled) rc = ERR("out of memory");
    for (int l = 0; l < c->model->cfg.n_layer && !rc; l++) rc = compress_layer(s, c, l, n, w, idx, score, pooled, err, err_len);
    kvb_method_release(c, idx, idx_bytes);
    kvb_method_release(c, score, score_bytes);
    kvb_method_release(c, pooled, score_bytes);
    return rc;
}

static int64_t snapkv_expected(kvb_method *m, kvb_ctx *c, int layer) {
    (void)layer;
    snapkv *s = (snapkv *)m;
    if (c->in_prefill) return c->n_past;
    return (s->keep < m->n_prompt ? s->keep : m->n_prompt) + (c->n_past - m->n_prompt);
}

static void snapkv_describe(kvb_method *m, char *buf, size_t cap) {
    snapkv *s = (snapkv *)m;
    snprintf(buf, cap, "window=%lld kernel=%lld pool=%s keep=%lld", (long long)s->window, (long long)s->kernel,
             s->avg_pool ? "avg" : "max", (long long)s->keep);
}

static void snapkv_destroy(kvb_method *m) { free(m); }

/* Observation-window rows SnapKV reads: its `window` option (registry: what a shared prefill must keep). */
int kvb_snapkv_obs_window(kvb_opts *o, int *rows, char *err, size_t err_len) {
    int64_t w = 32;
    if (kvb_opts_int(o, "window", &w, err, err_len) < 0) return -1;
    if (w < 1 || w > 4096) return ERR("snapkv: window must be in [1, 4096]");
    *rows = (int)w;
    return 0;
}

kvb_method *kvb_snapkv_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len) {
    (void)c;
    snapkv *s = calloc(1, sizeof *s);
    if (!s) { ERR("out of memory"); return NULL; }
    int window = 0;
    s->kernel = 7;
    if (kvb_snapkv_obs_window(o, &window, err, err_len) || kvb_opts_int(o, "kernel", &s->kernel, err, err_len) < 0)
        goto fail;
    s->window = window;
    if (s->kernel < 1 || s->kernel % 2 == 0) { ERR("snapkv: kernel must be odd and >= 1"); goto fail; }
    const char *pool = kvb_opts_get(o, "pool");
    if (pool && strcmp(pool, "max") && strcmp(pool, "avg")) { ERR("snapkv: pool must be max or avg"); goto fail; }
    s->avg_pool = pool && !strcmp(pool, "avg");
    s->base.name = "snapkv";
    s->base.budget = *b;
    s->base.imposes_budget = 1;
    s->base.hooks.obs_window = (int)s->window;
    s->base.hooks.after_prefill = snapkv_after_prefill;
    s->base.expected_tokens = snapkv_expected;
    s->base.describe = snapkv_describe;
    s->base.destroy = snapkv_destroy;
    return &s->base;
fail:
    free(s);
    return NULL;
}
