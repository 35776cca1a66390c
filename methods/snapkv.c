/* snapkv.c — SnapKV (Li et al.; survey in papers/002): once the prompt is in, each layer and KV head scores
 * the prefix tokens by the attention the last `window` queries give them (summed over the window and over the
 * group's query heads), smooths the scores with a 1-D max pool (kernel 7, same padding), keeps the top-k
 * prefix tokens plus the window itself, and evicts the rest. Decode appends without evicting.
 *
 * Choices (flags): window=32, kernel=7, pool=max|avg (max: the and KVCache-Factory's default).
 * Budget B per head = budget x prompt length (or a token count); k = B - window. When B <= window the cache
 * keeps the last B tokens. The scoring and the compression with a budget per layer are shared (snapkv.h) with
 * PyramidKV and AdaKV, which differ only in how many tokens each layer and head keeps. */
#include "methods/snapkv.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    kvb_method base;
    kvb_snap_opts p;
    int64_t keep; /* tokens kept per head after prefill */
} snapkv;

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

int64_t kvb_snap_rows(const kvb_ctx *c, const kvb_snap_opts *p) { return c->obs_n < p->window ? c->obs_n : p->window; }

int64_t kvb_snap_window(const kvb_ctx *c, const kvb_snap_opts *p, int64_t keep) {
    int64_t w = kvb_snap_rows(c, p);
    return keep <= w ? 0 : w;
}

int kvb_snap_score(kvb_ctx *c, int l, int64_t n, int64_t w, const kvb_snap_opts *p, float *score, float *pooled,
                   char *err, size_t err_len) {
    kvb_backend *be = c->be;
    const kvb_config *cfg = &c->model->cfg;
    const float *q = c->obs_q + ((size_t)l * c->obs_cap + (size_t)(c->obs_n - w)) * cfg->q_dim;
    float *probs = NULL;
    int64_t stride = 0;
    if (kvb_attn_probs(c, l, q, c->obs_pos + (c->obs_n - w), w, NULL, &probs, &stride, NULL, err, err_len)) return -1;
    int64_t n_prefix = n - w;
    int rc = be->probs_reduce(be, score, n_prefix, probs, stride, cfg->n_head, cfg->n_head_kv, w, n_prefix, NULL,
                              KVB_REDUCE_GROUP_SUM, 0, err, err_len) ||
             be->pool1d(be, pooled, n_prefix, score, n_prefix, cfg->n_head_kv, n_prefix, p->kernel, p->avg_pool, err,
                        err_len);
    kvb_attn_probs_free(c, probs, w, stride);
    return rc ? -1 : 0;
}

int kvb_snap_keep_recent(kvb_ctx *c, int l, int64_t n, int64_t keep, char *err, size_t err_len) {
    int32_t *idx = malloc((size_t)(keep > 0 ? keep : 1) * sizeof *idx);
    if (!idx) return ERR("out of memory");
    for (int64_t i = 0; i < keep; i++) idx[i] = (int32_t)(n - keep + i);
    int rc = 0;
    for (int h = 0; h < c->model->cfg.n_head_kv && !rc; h++) rc = kvc_retain(c->kv, l, h, idx, keep, err, err_len);
    free(idx);
    return rc;
}

/* One layer: SnapKV's scores, then per KV head its top keep - w prefix slots and the window; all on the backend.
 * score, pooled: [n_head_kv][n - w]; idx: [keep] (device). */
static int compress_layer(kvb_ctx *c, const kvb_snap_opts *p, int l, int64_t n, int64_t w, int64_t keep, int32_t *idx,
                          float *score, float *pooled, char *err, size_t err_len) {
    kvb_backend *be = c->be;
    int64_t n_prefix = n - w, k = keep - w;
    int rc = kvb_snap_score(c, l, n, w, p, score, pooled, err, err_len);
    for (int g = 0; g < c->model->cfg.n_head_kv && !rc; g++)
        rc = be->topk_idx(be, idx, pooled + (size_t)g * n_prefix, n_prefix, k, err, err_len) ||
             be->iota(be, idx + k, (int32_t)n_prefix, w, err, err_len) ||
             kvc_retain_dev(c->kv, l, g, idx, keep, err, err_len);
    return rc ? -1 : 0;
}

int kvb_snap_compress(kvb_ctx *c, const kvb_snap_opts *p, const int64_t *keep, char *err, size_t err_len) {
    const int64_t n = c->n_past;
    const int L = c->model->cfg.n_layer, HK = c->model->cfg.n_head_kv;
    int from, to; /* every layer, or one (a layer-wise end of prefill: engine/model.h kvb_prefill_layers) */
    kvb_prefill_layers(c, &from, &to);
    int64_t most = 1;
    for (int l = 0; l < L; l++)
        if (keep[l] < n && keep[l] > most) most = keep[l];
    size_t idx_bytes = (size_t)most * sizeof(int32_t), score_bytes = (size_t)HK * n * sizeof(float);
    int32_t *idx = kvb_method_alloc(c, idx_bytes);
    float *score = kvb_method_alloc(c, score_bytes), *pooled = kvb_method_alloc(c, score_bytes);
    int rc = !idx || !score || !pooled ? ERR("out of memory") : 0;
    for (int l = from; l < to && !rc; l++) {
        if (keep[l] >= n || kvb_layer_window(&c->model->cfg, l)) continue; /* a local layer keeps its window */
        int64_t w = kvb_snap_window(c, p, keep[l]);
        rc = w ? compress_layer(c, p, l, n, w, keep[l], idx, score, pooled, err, err_len)
               : kvb_snap_keep_recent(c, l, n, keep[l], err, err_len);
    }
    kvb_method_release(c, idx, idx_bytes);
    kvb_method_release(c, score, score_bytes);
    kvb_method_release(c, pooled, score_bytes);
    return rc;
}

static int snapkv_after_prefill(void *self, kvb_ctx *c, char *err, size_t err_len) {
    snapkv *s = self;
    int64_t n = c->n_past;
    s->base.n_prompt = n;
    if (kvb_method_budget_tokens(&s->base, n, &s->keep, err, err_len)) return -1;
    if (s->keep >= n) return 0;
    const int L = c->model->cfg.n_layer;
    int64_t *keep = malloc((size_t)L * sizeof *keep);
    if (!keep) return ERR("out of memory");
    for (int l = 0; l < L; l++) keep[l] = s->keep;
    int rc = kvb_snap_compress(c, &s->p, keep, err, err_len);
    free(keep);
    return rc;
}

static int64_t snapkv_expected(kvb_method *m, kvb_ctx *c, int layer) {
    (void)layer;
    snapkv *s = (snapkv *)m;
    return kvb_kept_then_decoded(m, c, s->keep);
}

static void snapkv_describe(kvb_method *m, char *buf, size_t cap) {
    snapkv *s = (snapkv *)m;
    snprintf(buf, cap, "window=%lld kernel=%lld pool=%s keep=%lld", (long long)s->p.window, (long long)s->p.kernel,
             s->p.avg_pool ? "avg" : "max", (long long)s->keep);
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

int kvb_snap_opts_read(kvb_opts *o, const char *who, kvb_snap_opts *p, char *err, size_t err_len) {
    int window = 0;
    p->kernel = 7;
    if (kvb_snapkv_obs_window(o, &window, err, err_len) || kvb_opts_int(o, "kernel", &p->kernel, err, err_len) < 0)
        return -1;
    p->window = window;
    if (p->kernel < 1 || p->kernel % 2 == 0) return ERR("%s: kernel must be odd and >= 1", who);
    const char *pool = kvb_opts_get(o, "pool");
    if (pool && strcmp(pool, "max") && strcmp(pool, "avg")) return ERR("%s: pool must be max or avg", who);
    p->avg_pool = pool && !strcmp(pool, "avg");
    return 0;
}

static kvb_method *snapkv_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len) {
    (void)c;
    snapkv *s = calloc(1, sizeof *s);
    if (!s) { ERR("out of memory"); return NULL; }
    if (kvb_snap_opts_read(o, "snapkv", &s->p, err, err_len)) {
        free(s);
        return NULL;
    }
    s->base.budget = *b;
    s->base.imposes_budget = 1;
    return &s->base;
}

const kvb_method_def kvb_method_snapkv = {
    .name = "snapkv",
    .summary = "prefix voted by the last queries, pooled, top-k + window",
    .traits = KVB_NEEDS_BUDGET | KVB_SHARES_PREFILL | KVB_LAYER_LOCAL,
    .obs_window = kvb_snapkv_obs_window,
    .create = snapkv_create,
    .hooks = {.after_prefill = snapkv_after_prefill},
    .expected_tokens = snapkv_expected,
    .describe = snapkv_describe,
    .destroy = snapkv_destroy,
};
