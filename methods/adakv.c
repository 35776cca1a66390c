/* adakv.c — AdaKV (Feng et al. 2024, "Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget Allocation for
 * Efficient LLM Inference", arXiv 2407.11550): a layer's heads need the cache unequally, so the layer's budget is
 * shared among its KV heads by their scores instead of split evenly. The paper bounds the L1 loss of eviction by
 * eps <= 2 - 2 sum_h sum_{i kept in h} A_h,i / n_head (A: a scorer's attention weights); for a layer budget of
 * B x n_head the bound is smallest when the kept set is the top B x n_head scores of all heads together (its
 * Algorithm 1), which gives each head B_h = how many of them it holds. A safeguard floor (alpha) keeps a head
 * that scores low everywhere from losing its cache.
 *
 * Here: a wrapper over a scoring method. base=snapkv (default): SnapKV's pooled window scores (snapkv.h) and
 * the same budget B in every layer; base=pyramidkv: the same scores with PyramidKV's per-layer budgets
 * (kvb_pyramid_budgets, option beta). Per layer with budget B and window w (each KV head keeps its window, as
 * SnapKV does and as the paper's Ada-SnapKV does):
 *   1. every head's top f prefix slots are guaranteed: f = floor(alpha B) - w (clamped to [0, B - w]), i.e.
 *      floor(alpha B) tokens per head with its window counted in, as kvpress's AdaKVPress (alpha_safeguard
 *      = 0.2, its n_safe = int(alpha x n_kept) over scores where the window holds the maximum);
 *   2. the top (B - w) x n_head_kv prefix slots of all heads together, the guaranteed ones set to +inf, go to
 *      the heads holding them (ties: lower head, then lower slot);
 *   3. each head keeps its share plus its window: heads really hold different token counts in the store, and
 *      the layer holds exactly B x n_head_kv.
 * All of it runs on the backend (kvb_adakv_allocate: per-head top-k, fill_idx_f32, one top-k over the layer,
 * split_rows_idx); the host reads the per-head counts only (one D2H copy per layer).
 *
 * Choices where the paper leaves them open: the floor counts the window as kvpress does (the paper's code,
 * AdaKV's adaptive_snapkv, takes alpha of the prefix budget and scales the adaptive counts by 1 - alpha, which
 * rounds per head and need not sum to the budget); scores are SnapKV's sums over the window (the paper's code
 * uses the mean: the same order within a layer); no per-layer score normalisation. The budget check
 * (kvb_method_verify) compares a layer's tokens over all heads with expected_tokens x n_head_kv, so
 * expected_tokens is the layer's mean per head, B, which the allocation meets exactly. Decode appends to every
 * head without evicting. B <= w: every head keeps its last B tokens; B >= prompt: nothing is evicted. */
#include "methods/snapkv.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    kvb_method base;
    kvb_snap_opts p;
    int pyramid; /* base=pyramidkv */
    double beta, alpha;
    int n_layer;
    int64_t *keep;              /* each layer's budget: mean tokens per KV head after prefill */
    int64_t head_min, head_max; /* fewest and most tokens one head held after prefill */
} adakv;

/* device buffers of one compression, sized for an n-token prompt */
typedef struct {
    float *score, *pooled; /* [n_head_kv][n] */
    int32_t *out, *flat;   /* [n_head_kv][n] each */
    int32_t *counts;       /* [n_head_kv] */
    size_t bytes;          /* of each [n_head_kv][n] buffer */
} adakv_bufs;

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

int kvb_adakv_allocate(kvb_backend *be, float *score, int rows, int64_t row_len, int64_t k, int64_t floor,
                       int32_t *out, int64_t out_stride, int32_t *counts, int32_t *flat, char *err, size_t err_len) {
    if (floor < 0 || floor > k || k > row_len || (int64_t)rows * row_len >= INT32_MAX || out_stride < row_len)
        return ERR("adakv: cannot share %lld slots per head (floor %lld) among %d heads of %lld", (long long)k,
                   (long long)floor, rows, (long long)row_len);
    for (int h = 0; h < rows && floor > 0; h++) {
        float *row = score + (size_t)h * row_len;
        if (be->topk_idx(be, flat, row, row_len, floor, err, err_len) ||
            be->fill_idx_f32(be, row, flat, floor, INFINITY, err, err_len))
            return -1;
    }
    if (be->topk_idx(be, flat, score, (int64_t)rows * row_len, (int64_t)rows * k, err, err_len)) return -1;
    return be->split_rows_idx(be, out, out_stride, counts, flat, (int64_t)rows * k, row_len, rows, err, err_len);
}

int kvb_adakv_retain(kvb_ctx *c, int l, float *score, int64_t n, int64_t keep, double alpha, int32_t *out,
                     int32_t *flat, int32_t *counts_d, int64_t held_range[2], char *err, size_t err_len) {
    kvb_backend *be = c->be;
    const int HK = c->model->cfg.n_head_kv;
    int32_t counts[KVB_MAX_KV_HEADS];
    if (HK > KVB_MAX_KV_HEADS) return ERR("adakv: %d KV heads (at most %d)", HK, KVB_MAX_KV_HEADS);
    int64_t floor = (int64_t)(alpha * (double)keep); /* kvpress 0.5.5: at least 1 where alpha > 0 and keep > 0 */
    if (alpha > 0 && keep > 0 && floor < 1) floor = 1;
    if (kvb_adakv_allocate(be, score, HK, n, keep, floor, out, n, counts_d, flat, err, err_len) ||
        be->copy(be, counts, counts_d, (size_t)HK * sizeof *counts, KVB_COPY_D2H, err, err_len))
        return -1;
    if (be->sync && be->sync(be)) return ERR("%s", be->error);
    for (int h = 0; h < HK; h++) {
        if (kvc_retain_dev(c->kv, l, h, out + (size_t)h * n, counts[h], err, err_len)) return -1;
        if (held_range[0] < 0 || counts[h] < held_range[0]) held_range[0] = counts[h];
        if (counts[h] > held_range[1]) held_range[1] = counts[h];
    }
    return 0;
}

static void held(adakv *a, int64_t tokens) {
    if (a->head_min < 0 || tokens < a->head_min) a->head_min = tokens;
    if (tokens > a->head_max) a->head_max = tokens;
}

/* One layer of an n-token prompt: scores, the allocation among heads, each head's share + window retained. */
static int adakv_layer(adakv *a, kvb_ctx *c, int l, int64_t n, adakv_bufs *b, char *err, size_t err_len) {
    kvb_backend *be = c->be;
    const int HK = c->model->cfg.n_head_kv;
    const int64_t keep = a->keep[l], w = kvb_snap_window(c, &a->p, keep);
    if (keep >= n || !w) {
        held(a, keep < n ? keep : n);
        return keep < n ? kvb_snap_keep_recent(c, l, n, keep, err, err_len) : 0;
    }
    const int64_t n_prefix = n - w, k = keep - w;
    int64_t floor_prefix = (int64_t)(a->alpha * (double)keep) - w;
    floor_prefix = floor_prefix < 0 ? 0 : floor_prefix > k ? k : floor_prefix;
    int32_t counts[KVB_MAX_KV_HEADS];
    if (kvb_snap_score(c, l, n, w, &a->p, b->score, b->pooled, err, err_len) ||
        kvb_adakv_allocate(be, b->pooled, HK, n_prefix, k, floor_prefix, b->out, n, b->counts, b->flat, err,
                           err_len) ||
        be->copy(be, counts, b->counts, (size_t)HK * sizeof *counts, KVB_COPY_D2H, err, err_len))
        return -1;
    if (be->sync && be->sync(be)) return ERR("%s", be->error);
    for (int h = 0; h < HK; h++) {
        int32_t *idx = b->out + (size_t)h * n;
        if (be->iota(be, idx + counts[h], (int32_t)n_prefix, w, err, err_len) ||
            kvc_retain_dev(c->kv, l, h, idx, counts[h] + w, err, err_len))
            return -1;
        held(a, counts[h] + w);
    }
    return 0;
}

static int adakv_after_prefill(void *self, kvb_ctx *c, char *err, size_t err_len) {
    adakv *a = self;
    const int64_t n = c->n_past;
    const int HK = c->model->cfg.n_head_kv;
    int64_t budget = 0;
    a->base.n_prompt = n;
    if (kvb_method_budget_tokens(&a->base, n, &budget, err, err_len)) return -1;
    if (HK > KVB_MAX_KV_HEADS) return ERR("adakv: %d KV heads (at most %d)", HK, KVB_MAX_KV_HEADS);
    if (a->pyramid) kvb_pyramid_budgets(a->n_layer, n, budget, kvb_snap_rows(c, &a->p), a->beta, a->keep);
    else
        for (int l = 0; l < a->n_layer; l++) a->keep[l] = budget;
    a->head_min = -1;
    a->head_max = 0;
    adakv_bufs b = {0};
    b.bytes = (size_t)HK * n * sizeof(float);
    b.score = kvb_method_alloc(c, b.bytes);
    b.pooled = kvb_method_alloc(c, b.bytes);
    b.out = kvb_method_alloc(c, b.bytes);
    b.flat = kvb_method_alloc(c, b.bytes);
    b.counts = kvb_method_alloc(c, (size_t)HK * sizeof(int32_t));
    int rc = !b.score || !b.pooled || !b.out || !b.flat || !b.counts ? ERR("out of memory") : 0;
    for (int l = 0; l < a->n_layer && !rc; l++) rc = kvb_layer_window(&c->model->cfg, l) ? 0 : adakv_layer(a, c, l, n, &b, err, err_len);
    kvb_method_release(c, b.score, b.bytes);
    kvb_method_release(c, b.pooled, b.bytes);
    kvb_method_release(c, b.out, b.bytes);
    kvb_method_release(c, b.flat, b.bytes);
    kvb_method_release(c, b.counts, (size_t)HK * sizeof(int32_t));
    if (!rc)
        snprintf(a->base.note, sizeof a->base.note, "tokens per KV head after prefill: %lld .. %lld (layer mean %lld .. %lld)",
                 (long long)a->head_min, (long long)a->head_max, (long long)a->keep[a->n_layer - 1], (long long)a->keep[0]);
    return rc;
}

static int64_t adakv_expected(kvb_method *m, kvb_ctx *c, int layer) {
    adakv *a = (adakv *)m;
    if (c->in_prefill) return c->n_past;
    int64_t kept = a->keep[layer] < m->n_prompt ? a->keep[layer] : m->n_prompt;
    return kept + (c->n_past - m->n_prompt);
}

static void adakv_describe(kvb_method *m, char *buf, size_t cap) {
    adakv *a = (adakv *)m;
    int at = snprintf(buf, cap, "base=%s window=%lld kernel=%lld pool=%s alpha=%g", a->pyramid ? "pyramidkv" : "snapkv",
                      (long long)a->p.window, (long long)a->p.kernel, a->p.avg_pool ? "avg" : "max", a->alpha);
    if (a->pyramid && at > 0 && (size_t)at < cap) snprintf(buf + at, cap - (size_t)at, " beta=%g", a->beta);
}

static void adakv_destroy(kvb_method *m) {
    free(((adakv *)m)->keep);
    free(m);
}

static kvb_method *adakv_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len) {
    adakv *a = calloc(1, sizeof *a);
    if (!a) { ERR("out of memory"); return NULL; }
    a->alpha = 0.2;
    a->beta = 20;
    a->n_layer = c->model->cfg.n_layer;
    a->keep = calloc((size_t)a->n_layer, sizeof *a->keep);
    const char *base = kvb_opts_get(o, "base");
    if (!a->keep) { ERR("out of memory"); goto fail; }
    if (base && strcmp(base, "snapkv") && strcmp(base, "pyramidkv")) { ERR("adakv: base must be snapkv or pyramidkv"); goto fail; }
    a->pyramid = base && !strcmp(base, "pyramidkv");
    if (kvb_snap_opts_read(o, "adakv", &a->p, err, err_len) || kvb_opts_double(o, "alpha", &a->alpha, err, err_len) < 0 ||
        (a->pyramid && kvb_opts_double(o, "beta", &a->beta, err, err_len) < 0))
        goto fail;
    if (!(a->alpha >= 0 && a->alpha <= 1)) { ERR("adakv: alpha must be in [0, 1]"); goto fail; }
    if (!(a->beta >= 1)) { ERR("adakv: beta must be >= 1"); goto fail; }
    a->base.budget = *b;
    a->base.imposes_budget = 1;
    return &a->base;
fail:
    free(a->keep);
    free(a);
    return NULL;
}

const kvb_method_def kvb_method_adakv = {
    .name = "adakv",
    .summary = "a layer's budget shared among its KV heads by score (base=snapkv|pyramidkv)",
    .traits = KVB_NEEDS_BUDGET | KVB_SHARES_PREFILL,
    .obs_window = kvb_snapkv_obs_window,
    .create = adakv_create,
    .hooks = {.after_prefill = adakv_after_prefill},
    .expected_tokens = adakv_expected,
    .describe = adakv_describe,
    .destroy = adakv_destroy,
};
