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

/* out[i] = max (or mean) of in[i-r .. i+r] clipped to [0, n) (max_pool1d / avg_pool1d with same padding;
 * avg divides by the kernel size like count_include_pad). */
static void pool1d(const float *in, float *out, int64_t n, int64_t kernel, int avg) {
    int64_t r = kernel / 2;
    for (int64_t i = 0; i < n; i++) {
        float m = -INFINITY;
        double sum = 0;
        for (int64_t j = i - r; j <= i + r; j++) {
            if (j < 0 || j >= n) continue;
            if (in[j] > m) m = in[j];
            sum += in[j];
        }
        out[i] = avg ? (float)(sum / (double)kernel) : m;
    }
}

/* Scores of the prefix slots [0, n_prefix) of one KV head from window probabilities. */
static void head_scores(const kvb_ctx *c, const float *probs, int64_t stride, int64_t w, int g, int64_t n_prefix,
                        float *score) {
    const int G = c->model->cfg.n_head / c->model->cfg.n_head_kv;
    memset(score, 0, (size_t)n_prefix * sizeof(float));
    for (int r = 0; r < G; r++)
        for (int64_t t = 0; t < w; t++) {
            const float *p = probs + ((int64_t)(g * G + r) * w + t) * stride;
            for (int64_t j = 0; j < n_prefix; j++) score[j] += p[j];
        }
}

static int compress_layer(snapkv *s, kvb_ctx *c, int l, int64_t n, int64_t w, int32_t *idx, float *score,
                          float *pooled, char *err, size_t err_len) {
    const int64_t D = c->model->cfg.n_embd;
    const float *q = c->obs_q + ((size_t)l * c->obs_cap + (size_t)(c->obs_n - w)) * D;
    float *probs = NULL;
    int64_t stride = 0;
    if (kvb_attn_probs(c, l, q, c->obs_pos + (c->obs_n - w), w, NULL, &probs, &stride, NULL, err, err_len)) return -1;
    int64_t n_prefix = n - w, k = s->keep - w;
    int rc = 0;
    for (int g = 0; g < c->model->cfg.n_head_kv && !rc; g++) {
        head_scores(c, probs, stride, w, g, n_prefix, score);
        pool1d(score, pooled, n_prefix, s->kernel, s->avg_pool);
        if (kvb_topk_ascending(pooled, n_prefix, k, idx)) { rc = ERR("out of memory"); break; }
        for (int64_t i = 0; i < w; i++) idx[k + i] = (int32_t)(n_prefix + i);
        rc = kvc_retain(c->kv, l, g, idx, s->keep, err, err_len);
    }
    free(probs);
    return rc;
}

static int snapkv_after_prefill(void *self, kvb_ctx *c, char *err, size_t err_len) {
    snapkv *s = self;
    int64_t n = c->n_past;
    s->base.n_prompt = n;
    if (kvb_budget_tokens(&s->base.budget, n, &s->keep, err, err_len)) return -1;
    if (s->keep >= n) return 0;
    int64_t w = c->obs_n < s->window ? c->obs_n : s->window;
    if (s->keep <= w) w = 0; /* budget smaller than the window: keep the most recent tokens */
    int32_t *idx = malloc((size_t)s->keep * sizeof *idx);
    float *score = malloc((size_t)n * sizeof *score), *pooled = malloc((size_t)n * sizeof *pooled);
    int rc = 0;
    if (!idx || !score || !pooled) rc = ERR("out of memory");
    for (int l = 0; l < c->model->cfg.n_layer && !rc; l++) {
        if (w == 0) {
            for (int64_t i = 0; i < s->keep; i++) idx[i] = (int32_t)(n - s->keep + i);
            for (int h = 0; h < c->model->cfg.n_head_kv && !rc; h++) rc = kvc_retain(c->kv, l, h, idx, s->keep, err, err_len);
        } else {
            rc = compress_layer(s, c, l, n, w, idx, score, pooled, err, err_len);
        }
    }
    free(idx);
    free(score);
    free(pooled);
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
