/* pyramidkv.c — PyramidKV (Cai et al. 2024, "PyramidKV: Dynamic KV Cache Compression based on Pyramidal
 * Information Funneling", arXiv 2406.02069): attention funnels from broad in the bottom layers to a few tokens in
 * the top ones, so the bottom layers get more of the cache. Selection is SnapKV's (snapkv.c, shared through
 * snapkv.h): the last `window` prompt queries score the prefix, the scores are pooled, each KV head keeps its
 * top-k prefix tokens plus the window. Only k changes with the layer.
 *
 * The schedule (paper sec. 3.3, "budget allocation"): with m layers and a mean prefix budget P per head, the top
 * layer keeps k^{m-1} = P / beta, the bottom k^0 = 2P - k^{m-1}, and the layers between an arithmetic sequence
 * k^l = k^0 - l (k^0 - k^{m-1}) / (m - 1), whose mean is P. beta = 20 (the paper's and the references' default).
 *
 * Choices:
 * - Budget B per head (budget x prompt length, or a token count) includes the window w in every layer, as in
 *   KVCache-Factory (pyramidkv_utils.py: max_capacity_prompt = window + prefix): P = B - w is what the pyramid
 *   shapes, so the layers average exactly B and the store measurement equals SnapKV's at the same budget.
 *   kvpress's PyramidKVPress shapes the whole B instead (the window inside each layer's count) and falls back to
 *   uniform SnapKV when its top layer would keep fewer than `window` tokens (e.g. 30% of 4000 tokens with
 *   window 64, beta 20): kvbench keeps the pyramid there. Compare kept sets with kvpress only where it does not
 *   fall back.
 * - The bottom layer is capped at the prefix (n - w), the top then raised so the mean stays P (both
 *   references do this).
 * - Integer shares: the references round each layer on its own (kvpress: round(); KVCache-Factory: integer
 *   division of the step, which loses up to m - 1 tokens in all). Here floors plus one token for the layers with
 *   the largest fractional parts, so the layers sum to exactly m x B (within one token of the real sequence in
 *   every layer) and never grow upwards.
 * - Options are SnapKV's (window=32, kernel=7, pool=max) plus beta; B <= window: every layer keeps its last B
 *   tokens (SnapKV's rule); B >= prompt: nothing is evicted. Decode appends without evicting. */
#include "methods/snapkv.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct {
    kvb_method base;
    kvb_snap_opts p;
    double beta;
    int n_layer;
    int64_t *keep; /* tokens per KV head each layer kept after prefill */
} pyramidkv;

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

void kvb_pyramid_budgets(int n_layer, int64_t n, int64_t budget, int64_t w, double beta, int64_t *keep) {
    const int L = n_layer;
    if (budget >= n || budget <= w || L == 1) {
        for (int l = 0; l < L; l++) keep[l] = budget < n ? budget : n;
        return;
    }
    const double P = (double)(budget - w);
    double top = P / beta, bottom = 2 * P - top;
    if (bottom > (double)(n - w)) {
        bottom = (double)(n - w);
        top = 2 * P - bottom;
    }
    const double step = (bottom - top) / (L - 1);
    int64_t sum = 0;
    for (int l = 0; l < L; l++) {
        keep[l] = (int64_t)floor(bottom - l * step);
        sum += keep[l];
    }
    /* the remainder, one token each to the layers with the largest fractional parts (ties: lower layer) */
    int64_t left = (int64_t)L * (budget - w) - sum;
    for (; left > 0; left--) {
        int best = -1;
        double best_frac = -1;
        for (int l = 0; l < L; l++) {
            double x = bottom - l * step, frac = x - (double)keep[l];
            if (frac > 0 && frac > best_frac) best = l, best_frac = frac;
        }
        if (best < 0) break;
        keep[best]++;
    }
    for (int l = 0; l < L; l++) {
        keep[l] += w;
        if (keep[l] > n) keep[l] = n;
    }
}

static int pyramidkv_after_prefill(void *self, kvb_ctx *c, char *err, size_t err_len) {
    pyramidkv *s = self;
    int64_t n = c->n_past, budget = 0;
    s->base.n_prompt = n;
    if (kvb_method_budget_tokens(&s->base, n, &budget, err, err_len)) return -1;
    /* the pyramid spans the global layers (a hybrid model's local layers keep their window: keep = n) */
    int64_t *g = malloc((size_t)(s->base.n_global > 0 ? s->base.n_global : 1) * sizeof *g);
    if (!g) return ERR("out of memory");
    kvb_pyramid_budgets(s->base.n_global, n, budget, kvb_snap_rows(c, &s->p), s->beta, g);
    for (int l = 0, j = 0; l < s->n_layer; l++) s->keep[l] = kvb_layer_window(&c->model->cfg, l) ? n : g[j++];
    free(g);
    snprintf(s->base.note, sizeof s->base.note, "tokens per KV head: layer 0 %lld .. layer %d %lld",
             (long long)s->keep[0], s->n_layer - 1, (long long)s->keep[s->n_layer - 1]);
    return kvb_snap_compress(c, &s->p, s->keep, err, err_len);
}

static int64_t pyramidkv_expected(kvb_method *m, kvb_ctx *c, int layer) {
    pyramidkv *s = (pyramidkv *)m;
    if (c->in_prefill) return c->n_past;
    int64_t kept = s->keep[layer] < m->n_prompt ? s->keep[layer] : m->n_prompt;
    return kept + (c->n_past - m->n_prompt);
}

static void pyramidkv_describe(kvb_method *m, char *buf, size_t cap) {
    pyramidkv *s = (pyramidkv *)m;
    snprintf(buf, cap, "window=%lld kernel=%lld pool=%s beta=%g keep=%lld..%lld", (long long)s->p.window,
             (long long)s->p.kernel, s->p.avg_pool ? "avg" : "max", s->beta, (long long)s->keep[0],
             (long long)s->keep[s->n_layer - 1]);
}

static void pyramidkv_destroy(kvb_method *m) {
    free(((pyramidkv *)m)->keep);
    free(m);
}

static kvb_method *pyramidkv_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len) {
    pyramidkv *s = calloc(1, sizeof *s);
    if (!s) { ERR("out of memory"); return NULL; }
    s->beta = 20;
    s->n_layer = c->model->cfg.n_layer;
    s->keep = calloc((size_t)s->n_layer, sizeof *s->keep);
    if (!s->keep) { ERR("out of memory"); goto fail; }
    if (kvb_snap_opts_read(o, "pyramidkv", &s->p, err, err_len) || kvb_opts_double(o, "beta", &s->beta, err, err_len) < 0)
        goto fail;
    if (!(s->beta >= 1)) { ERR("pyramidkv: beta must be >= 1"); goto fail; }
    s->base.budget = *b;
    s->base.imposes_budget = 1;
    return &s->base;
fail:
    free(s->keep);
    free(s);
    return NULL;
}

const kvb_method_def kvb_method_pyramidkv = {
    .name = "pyramidkv",
    .summary = "SnapKV's scores, budgets falling linearly from the bottom layer to the top",
    .traits = KVB_NEEDS_BUDGET | KVB_SHARES_PREFILL,
    .obs_window = kvb_snapkv_obs_window,
    .create = pyramidkv_create,
    .hooks = {.after_prefill = pyramidkv_after_prefill},
    .expected_tokens = pyramidkv_expected,
    .describe = pyramidkv_describe,
    .destroy = pyramidkv_destroy,
};
