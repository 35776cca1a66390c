/* cake.c — CAKE (Qin et al. 2025, "CAKE: Cascading and Adaptive KV Cache Eviction with Layer Preferences", ICLR
 * 2025, arXiv 2503.12491): layers need the cache unequally, and a layer's need shows in its observation window's
 * attention A (the last w prompt queries over every token, per query head h, row t, token j): how spread it is
 * (spatial dispersion, an entropy) and how much it moves from query to query (temporal shift, a variance).
 *   disp_l = -sum_{h,t,j<n-w} A log(A + 1e-10)           (the official code: over the window rows' prefix part)
 *   shift_l = sum_{h,j<n-w} Var_t(A[h][t][j])            (unbiased variance over the w rows)
 *   P_l = disp_l^(1/tau1) x shift_l^(1/tau2)             (eq. 6, the layer's preference)
 *   B_l = P_l / sum_l' P_l' x (B - w) x L                (eq. 7: the prefix budgets, the window kept on top)
 * and a layer evicts by its indicator (eq. 8): I_j = mean_t A[t][j] + gamma Var_t A[t][j], averaged over a KV
 * head's query heads after SnapKV's pooling (avg_pool1d, kernel 5), keeping its top B_l prefix tokens + the window.
 *
 * Choices:
 * - Budget B per head (budget x prompt length, or a token count) with the window inside it, as SnapKV and PyramidKV
 *   here: every layer keeps w + B_l and the layers hold exactly B x L (the brief: budget x layers in total).
 * - The cascade: the paper (and its code's use_cascading) evicts layer by layer during prefill, re-slicing the
 *   budget as each layer's preference arrives, so memory never exceeds the total; its final allocation is the one
 *   above. kvbench computes it after the prefill from the observation window (the same queries, the same result;
 *   the peak during prefill is the full cache, as for every method that compresses after prefill).
 * - Integer budgets: the official adjust_budgets truncates, caps at n - w and spreads the difference evenly; here
 *   the shares are capped at n - w (the excess re-shared by preference, repeatedly), then floors plus one token for
 *   the largest fractional parts (ties: lower layer), so the layers sum to exactly (B - w) x L. All preferences 0
 *   (a window of one row has no variance): equal shares.
 * - Defaults: window 32, kernel 5, gamma 200, tau1 = tau2 = 1 (the paper tunes tau per model; its model2tau.json).
 *   B <= w: every layer keeps its last B tokens (SnapKV's rule); B >= prompt: nothing is evicted. Decode appends
 *   without evicting (the paper's decode-time eviction, which keeps each layer at its budget, is not done here).
 * - The statistics run on the host in double: no backend op squares or takes logarithms. The window's attention
 *   comes down in one counted copy per layer (n_head x w x n floats), kvbench's cost of this method on a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "methods/cake.h"

typedef struct {
    kvb_method base;
    int64_t window, kernel;
    double gamma, tau1, tau2;
    int n_layer;
    int64_t *keep; /* tokens per KV head each layer kept after prefill */
} cake;

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

int kvb_cake_layer(const float *A, int H, int HK, int64_t w, int64_t stride, int64_t n, int64_t kernel, double gamma,
                   double *disp, double *shift, float *score) {
    const int G = H / HK;
    const int64_t m = n - w;
    double *ind = malloc((size_t)(m > 0 ? m : 1) * sizeof *ind), *acc = calloc((size_t)(m > 0 ? m : 1) * HK, sizeof *acc);
    if (!ind || !acc) {
        free(ind);
        free(acc);
        return -1;
    }
    *disp = 0;
    *shift = 0;
    for (int h = 0; h < H; h++) {
        for (int64_t j = 0; j < m; j++) {
            double sum = 0, sq = 0;
            for (int64_t t = 0; t < w; t++) {
                double a = A[((size_t)h * w + t) * stride + j];
                sum += a;
                *disp -= a * log(a + 1e-10);
            }
            const double mean = sum / (double)w;
            for (int64_t t = 0; t < w; t++) {
                double dlt = A[((size_t)h * w + t) * stride + j] - mean;
                sq += dlt * dlt;
            }
            const double var = w > 1 ? sq / (double)(w - 1) : 0;
            *shift += var;
            ind[j] = mean + gamma * var;
        }
        /* avg_pool1d, same padding, count_include_pad: sum over the clipped window / kernel */
        for (int64_t j = 0; j < m; j++) {
            double s = 0;
            for (int64_t i = j - kernel / 2; i <= j + kernel / 2; i++)
                if (i >= 0 && i < m) s += ind[i];
            acc[(size_t)(h / G) * m + j] += s / (double)kernel;
        }
    }
    for (int64_t i = 0; i < (int64_t)HK * m; i++) score[i] = (float)(acc[i] / G);
    free(ind);
    free(acc);
    return 0;
}

void kvb_cake_budgets(int L, const double *pref, int64_t total, int64_t cap, int64_t *out) {
    double *share = malloc((size_t)L * sizeof *share);
    unsigned char *capped = calloc((size_t)L, 1);
    if (!share || !capped || L < 1) { /* out of memory: equal shares (the caller's total still holds) */
        for (int l = 0; l < L; l++) out[l] = total / L + (l < total % L);
        free(share);
        free(capped);
        return;
    }
    double left = (double)total;
    for (int round = 0; round < L; round++) { /* water-filling: cap, re-share the excess among the others */
        double psum = 0;
        int free_layers = 0;
        for (int l = 0; l < L; l++)
            if (!capped[l]) psum += pref[l] > 0 ? pref[l] : 0, free_layers++;
        int changed = 0;
        for (int l = 0; l < L; l++) {
            if (capped[l]) continue;
            share[l] = psum > 0 ? left * (pref[l] > 0 ? pref[l] : 0) / psum : left / free_layers;
            if (share[l] > (double)cap) {
                share[l] = (double)cap;
                capped[l] = 1;
                left -= (double)cap;
                changed = 1;
            }
        }
        if (!changed) break;
    }
    int64_t sum = 0;
    for (int l = 0; l < L; l++) {
        out[l] = (int64_t)floor(share[l]);
        if (out[l] > cap) out[l] = cap;
        sum += out[l];
    }
    for (int64_t rest = total - sum; rest > 0; rest--) { /* largest fractional parts first (ties: lower layer) */
        int best = -1;
        double best_frac = -1;
        for (int l = 0; l < L; l++) {
            double frac = share[l] - (double)out[l];
            if (out[l] < cap && frac > best_frac) best = l, best_frac = frac;
        }
        if (best < 0) break;
        out[best]++;
    }
    free(share);
    free(capped);
}

/* The window's attention of global layer l to the host: A [n_head][w][*stride] (caller frees). */
static float *window_probs(kvb_ctx *c, int l, int64_t w, int64_t *stride, char *err, size_t err_len) {
    kvb_backend *be = c->be;
    const kvb_config *cfg = &c->model->cfg;
    const float *q = c->obs_q + ((size_t)l * c->obs_cap + (size_t)(c->obs_n - w)) * cfg->q_dim;
    float *probs = NULL;
    if (kvb_attn_probs(c, l, q, c->obs_pos + (c->obs_n - w), w, NULL, &probs, stride, NULL, err, err_len)) return NULL;
    size_t bytes = (size_t)cfg->n_head * w * *stride * sizeof(float);
    float *host = malloc(bytes);
    int rc = host ? be->copy(be, host, probs, bytes, KVB_COPY_D2H, err, err_len) : ERR("out of memory");
    if (!rc && be->sync && be->sync(be)) rc = ERR("%s", be->error);
    kvb_attn_probs_free(c, probs, w, *stride);
    if (rc) {
        free(host);
        return NULL;
    }
    return host;
}

static int keep_recent(kvb_ctx *c, int l, int64_t n, int64_t keep, char *err, size_t err_len) {
    int32_t *idx = malloc((size_t)(keep > 0 ? keep : 1) * sizeof *idx);
    if (!idx) return ERR("out of memory");
    for (int64_t i = 0; i < keep; i++) idx[i] = (int32_t)(n - keep + i);
    int rc = 0;
    for (int g = 0; g < c->model->cfg.n_head_kv && !rc; g++) rc = kvc_retain(c->kv, l, g, idx, keep, err, err_len);
    free(idx);
    return rc;
}

static int cake_after_prefill(void *self, kvb_ctx *c, char *err, size_t err_len) {
    cake *s = self;
    const kvb_config *cfg = &c->model->cfg;
    const int L = s->n_layer, HK = cfg->n_head_kv;
    const int64_t n = c->n_past;
    int64_t budget = 0;
    s->base.n_prompt = n;
    if (kvb_method_budget_tokens(&s->base, n, &budget, err, err_len)) return -1;
    for (int l = 0; l < L; l++) s->keep[l] = n;
    if (budget >= n) return 0;
    const int64_t w = c->obs_n < s->window ? c->obs_n : s->window;
    if (budget <= w || w < 1) { /* SnapKV's rule: the last B tokens */
        int rc = 0;
        for (int l = 0; l < L && !rc; l++)
            if (!kvb_layer_window(cfg, l)) rc = keep_recent(c, l, n, budget, err, err_len), s->keep[l] = budget;
        return rc;
    }
    const int64_t m = n - w;
    int n_global = 0;
    int *gl = malloc((size_t)L * sizeof *gl);
    double *pref = calloc((size_t)L, sizeof *pref);
    int64_t *prefix = calloc((size_t)L, sizeof *prefix);
    float *score = malloc((size_t)L * HK * m * sizeof *score);
    int32_t *idx = malloc((size_t)n * sizeof *idx); /* a layer may keep up to n */
    int rc = gl && pref && prefix && score && idx ? 0 : ERR("cake: out of memory");
    for (int l = 0; l < L && !rc; l++) {
        if (kvb_layer_window(cfg, l)) continue; /* a local layer keeps its window */
        int64_t stride = 0;
        float *A = window_probs(c, l, w, &stride, err, err_len);
        double disp = 0, shift = 0;
        if (!A) rc = -1;
        else if (kvb_cake_layer(A, cfg->n_head, HK, w, stride, n, s->kernel, s->gamma, &disp, &shift,
                                score + (size_t)n_global * HK * m))
            rc = ERR("cake: out of memory");
        free(A);
        pref[n_global] = pow(disp, 1 / s->tau1) * pow(shift, 1 / s->tau2);
        if (!isfinite(pref[n_global])) pref[n_global] = 0;
        gl[n_global++] = l;
    }
    if (!rc) kvb_cake_budgets(n_global, pref, (int64_t)n_global * (budget - w), m, prefix);
    for (int k = 0; k < n_global && !rc; k++) {
        const int l = gl[k];
        s->keep[l] = prefix[k] + w;
        for (int g = 0; g < HK && !rc; g++) {
            kvb_topk_ascending(score + ((size_t)k * HK + g) * m, m, prefix[k], idx);
            for (int64_t i = 0; i < w; i++) idx[prefix[k] + i] = (int32_t)(m + i);
            rc = kvc_retain(c->kv, l, g, idx, prefix[k] + w, err, err_len);
        }
    }
    if (!rc && n_global > 0) {
        int64_t lo = s->keep[gl[0]], hi = lo;
        for (int k = 0; k < n_global; k++) lo = s->keep[gl[k]] < lo ? s->keep[gl[k]] : lo, hi = s->keep[gl[k]] > hi ? s->keep[gl[k]] : hi;
        snprintf(s->base.note, sizeof s->base.note, "tokens per KV head by layer preference: %lld .. %lld", (long long)lo, (long long)hi);
    }
    free(gl);
    free(pref);
    free(prefix);
    free(score);
    free(idx);
    return rc ? -1 : 0;
}

static int64_t cake_expected(kvb_method *m, kvb_ctx *c, int layer) {
    cake *s = (cake *)m;
    if (c->in_prefill) return c->n_past;
    return s->keep[layer] + (c->n_past - m->n_prompt);
}

static void cake_describe(kvb_method *m, char *buf, size_t cap) {
    cake *s = (cake *)m;
    snprintf(buf, cap, "window=%lld kernel=%lld gamma=%g tau1=%g tau2=%g", (long long)s->window, (long long)s->kernel, s->gamma,
             s->tau1, s->tau2);
}

static void cake_destroy(kvb_method *m) {
    free(((cake *)m)->keep);
    free(m);
}

/* Observation-window rows CAKE reads: its `window` option (default 32). */
static int cake_obs_window(kvb_opts *o, int *rows, char *err, size_t err_len) {
    int64_t w = 32;
    if (kvb_opts_int(o, "window", &w, err, err_len) < 0) return -1;
    if (w < 1 || w > 4096) return ERR("cake: window must be in [1, 4096]");
    *rows = (int)w;
    return 0;
}

static kvb_method *cake_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len) {
    cake *s = calloc(1, sizeof *s);
    if (!s) { ERR("out of memory"); return NULL; }
    s->n_layer = c->model->cfg.n_layer;
    s->keep = calloc((size_t)s->n_layer, sizeof *s->keep);
    s->kernel = 5;
    s->gamma = 200;
    s->tau1 = s->tau2 = 1;
    int rows = 0;
    if (!s->keep) { ERR("out of memory"); goto fail; }
    if (cake_obs_window(o, &rows, err, err_len) || kvb_opts_int(o, "kernel", &s->kernel, err, err_len) < 0 ||
        kvb_opts_double(o, "gamma", &s->gamma, err, err_len) < 0 || kvb_opts_double(o, "tau1", &s->tau1, err, err_len) < 0 ||
        kvb_opts_double(o, "tau2", &s->tau2, err, err_len) < 0)
        goto fail;
    s->window = rows;
    if (s->kernel < 1 || s->kernel % 2 == 0) { ERR("cake: kernel must be odd and >= 1"); goto fail; }
    if (!(s->gamma >= 0) || !isfinite(s->gamma)) { ERR("cake: gamma must be >= 0"); goto fail; }
    if (!(s->tau1 > 0) || !(s->tau2 > 0) || !isfinite(s->tau1) || !isfinite(s->tau2)) { ERR("cake: tau1 and tau2 must be > 0"); goto fail; }
    s->base.budget = *b;
    s->base.imposes_budget = 1;
    return &s->base;
fail:
    free(s->keep);
    free(s);
    return NULL;
}

const kvb_method_def kvb_method_cake = {
    .name = "cake",
    .summary = "layer budgets by attention dispersion x shift, eviction by window mean + variance",
    .traits = KVB_NEEDS_BUDGET | KVB_SHARES_PREFILL,
    .obs_window = cake_obs_window,
    .create = cake_create,
    .hooks = {.after_prefill = cake_after_prefill},
    .expected_tokens = cake_expected,
    .describe = cake_describe,
    .destroy = cake_destroy,
};
