/* qfilter.c — Q-Filters (Godey et al. 2025, "Q-Filters: Leveraging QK Geometry for Efficient KV Cache
 * Compression", arXiv 2503.02812), as kvpress's QFilterPress scores it. Queries and keys of a head share a
 * favoured direction: with u_h the first right singular vector of the head's query matrix, signed so that the mean
 * query projects positively on it (E<q, u_h> > 0), the paper's estimate of the expected logit is
 * E_q <q, k_j> ~ kappa_h <k_j, u_h> with kappa_h > 0. So once the prompt is in, each layer and KV head keeps the B
 * tokens whose cached (post-RoPE) keys project most on its filter u_h, score_j = <k_j, u_h>, and evicts the rest.
 * No attention is computed at compression time; decode appends without evicting.
 *
 * Choices:
 * - Filters: from the model's calibration profile (`kvbench calibrate qfilter`, methods/calibrate.h: the SVD of
 *   every layer's post-RoPE queries, the query heads of a KV head pooled, on calibration text), the paper's
 *   offline filters. kvpress downloads the authors' published filters (nthngdy/<model>_qfilt) and scores
 *   -<k_j, f>, the same ranking when their stored f is -u_h (not checked here: the Hub is out of reach); kvbench
 *   computes its own u_h with the paper's sign and discards the lowest projections, as the paper states (`kvbench
 *   fidelity` on the default model at 25%, prose_4000 and code_python, 32 tokens each: top-1 agreement 85.9%,
 *   SnapKV 78.1%, KeyDiff 79.7%, so the sign keeps attended keys). filters=window instead computes the same SVD
 *   on the prompt's own observation window (the last `window` queries, default 32): no calibration, an online
 *   variant the paper does not have (its queries come down in one counted copy per layer).
 * - kvpress's single-shot press over the whole prompt: no recent window, every global layer compressed; budget B
 *   per head = budget x prompt length (or a token count); ties to the earlier token.
 * - No op of its own: the keys come out as f32 rows (block_minmax with one-row blocks, as keydiff.c), and
 *   block_scores with kmin = kmax = those rows and the filter as the query gives sum_e max(u_e k_e, u_e k_e) =
 *   <k_j, u_h> (products and sum in double). Without a profile (and without filters=window) the method refuses
 *   with one line naming `kvbench calibrate qfilter`; `kvbench run` makes the profile first (its calibration).
 * - Against kvpress's QFilterPress (test_kvpress_kept: the default model, prose_4000, 1129 tokens per head), fed this
 *   file's profile filters (the authors' are on the Hub, out of reach here), negated (the press scores -<f, k>) and
 *   with their components reordered: the filters live in the GGUF's key layout, where RoPE rotates channel pairs
 *   (2j, 2j + 1), and transformers' GGUF loader un-permutes the keys to its pairs (j, j + d/2), so the GGUF's channel
 *   2j + s is transformers' s d/2 + j (fed without the reorder, the sets are unrelated: Jaccard 0.19 on average).
 *   Given the same filters: Jaccard 0.9965 at least per layer and KV head, 0.9994 on average. So the scoring and the
 *   selection are the press's; whether the authors' filters equal these (up to the sign) is not checked. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "methods/calibrate.h"
#include "methods/method.h"
#include "methods/profile.h"

typedef struct {
    kvb_method base;
    int from_window;   /* filters=window */
    int64_t window;    /* its rows */
    float *f;          /* host [L][HK][d]: the filters (from the profile, or from the window at after_prefill) */
    int64_t keep;      /* tokens kept per head after prefill */
} qfilter;

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

/* filters=window: the SVD of the observation-window queries of layers [from, to) (host, after one counted copy per
 * layer) */
static int window_filters(qfilter *s, kvb_ctx *c, int from, int to, char *err, size_t err_len) {
    kvb_backend *be = c->be;
    const kvb_config *cfg = &c->model->cfg;
    const int HK = cfg->n_head_kv, d = cfg->head_dim;
    const int64_t rows = c->obs_n < s->window ? c->obs_n : s->window;
    if (rows < 1) return ERR("qfilter: filters=window needs the prompt's observation window (none was kept)");
    float *q = malloc((size_t)rows * cfg->q_dim * sizeof *q);
    double *S = calloc((size_t)HK * d * d, sizeof *S), *sum = calloc((size_t)HK * d, sizeof *sum);
    int rc = q && S && sum ? 0 : ERR("out of memory");
    for (int l = from; l < to && !rc; l++) {
        const float *src = c->obs_q + ((size_t)l * c->obs_cap + (size_t)(c->obs_n - rows)) * cfg->q_dim;
        memset(S, 0, (size_t)HK * d * d * sizeof *S);
        memset(sum, 0, (size_t)HK * d * sizeof *sum);
        rc = be->copy(be, q, src, (size_t)rows * cfg->q_dim * sizeof *q, KVB_COPY_D2H, err, err_len);
        if (!rc && be->sync && be->sync(be)) rc = ERR("%s", be->error);
        if (rc) break;
        kvb_cal_qfilter_add(q, rows, cfg->n_head, HK, d, S, sum);
        if (kvb_cal_qfilter_dirs(S, sum, HK, d, s->f + (size_t)l * HK * d)) rc = ERR("out of memory");
    }
    free(q);
    free(S);
    free(sum);
    return rc;
}

static int qfilter_after_prefill(void *self, kvb_ctx *c, char *err, size_t err_len) {
    qfilter *s = self;
    kvb_backend *be = c->be;
    const kvb_config *cfg = &c->model->cfg;
    const int64_t n = c->n_past, d = cfg->head_dim;
    const int HK = cfg->n_head_kv;
    s->base.n_prompt = n;
    if (kvb_method_budget_tokens(&s->base, n, &s->keep, err, err_len)) return -1;
    int from, to; /* every layer, or one (a layer-wise end of prefill: engine/model.h kvb_prefill_layers) */
    kvb_prefill_layers(c, &from, &to);
    if (s->keep >= n || from >= to) return 0;
    if (s->from_window && window_filters(s, c, from, to, err, err_len)) return -1;
    const size_t rows_bytes = (size_t)n * d * sizeof(float), f_bytes = (size_t)(to - from) * HK * d * sizeof(float),
                 score_bytes = (size_t)n * sizeof(float), idx_bytes = (size_t)s->keep * sizeof(int32_t);
    float *kmin = kvb_method_alloc(c, rows_bytes), *kmax = kvb_method_alloc(c, rows_bytes);
    float *f = kvb_method_alloc(c, f_bytes), *score = kvb_method_alloc(c, score_bytes);
    int32_t *idx = kvb_method_alloc(c, idx_bytes);
    int rc = kmin && kmax && f && score && idx ? 0 : ERR("qfilter: out of memory");
    if (!rc) rc = be->copy(be, f, s->f + (size_t)from * HK * d, f_bytes, KVB_COPY_H2D, err, err_len); /* [from, to) */
    for (int l = from; l < to && !rc; l++)
        for (int g = 0; g < HK && !rc && !kvb_layer_window(cfg, l); g++) { /* a local layer keeps its window */
            kvc_view v = kvc_head_view(c->kv, l, g);
            rc = be->block_minmax(be, kmin, kmax, v.k, v.dtype, (int)d, 1, 0, n, err, err_len) ||
                 be->block_scores(be, score, f + ((size_t)(l - from) * HK + g) * d, kmin, kmax, 1, (int)d, n, 0, err, err_len) ||
                 be->topk_idx(be, idx, score, n, s->keep, err, err_len) ||
                 kvc_retain_dev(c->kv, l, g, idx, s->keep, err, err_len);
        }
    kvb_method_release(c, kmin, rows_bytes);
    kvb_method_release(c, kmax, rows_bytes);
    kvb_method_release(c, f, f_bytes);
    kvb_method_release(c, score, score_bytes);
    kvb_method_release(c, idx, idx_bytes);
    return rc ? -1 : 0;
}

static int64_t qfilter_expected(kvb_method *m, kvb_ctx *c, int layer) {
    (void)layer;
    qfilter *s = (qfilter *)m;
    return kvb_kept_then_decoded(m, c, s->keep);
}

static void qfilter_describe(kvb_method *m, char *buf, size_t cap) {
    qfilter *s = (qfilter *)m;
    if (s->from_window) snprintf(buf, cap, "filters=window window=%lld keep=%lld", (long long)s->window, (long long)s->keep);
    else snprintf(buf, cap, "filters=profile keep=%lld", (long long)s->keep);
}

static void qfilter_destroy(kvb_method *m) {
    free(((qfilter *)m)->f);
    free(m);
}

/* filters=profile (default) or window; -1 + err otherwise */
static int read_source(kvb_opts *o, int *from_window, char *err, size_t err_len) {
    const char *v = kvb_opts_get(o, "filters");
    if (v && strcmp(v, "profile") && strcmp(v, "window")) return ERR("qfilter: filters must be profile or window");
    *from_window = v && !strcmp(v, "window");
    return 0;
}

/* The observation window it reads: `window` rows (default 32) with filters=window, none otherwise. */
static int qfilter_obs_window(kvb_opts *o, int *rows, char *err, size_t err_len) {
    int from_window = 0;
    int64_t w = 32;
    if (read_source(o, &from_window, err, err_len)) return -1;
    *rows = 0;
    if (!from_window) return 0;
    if (kvb_opts_int(o, "window", &w, err, err_len) < 0) return -1;
    if (w < 1 || w > 4096) return ERR("qfilter: window must be in [1, 4096]");
    *rows = (int)w;
    return 0;
}

static const char *qfilter_profile(kvb_opts *o) {
    const char *v = kvb_opts_get(o, "filters");
    return v && !strcmp(v, "window") ? NULL : "qfilter";
}

static kvb_method *qfilter_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len) {
    const kvb_config *cfg = &c->model->cfg;
    qfilter *s = calloc(1, sizeof *s);
    if (s) s->f = malloc((size_t)cfg->n_layer * cfg->n_head_kv * cfg->head_dim * sizeof *s->f);
    if (!s || !s->f) {
        ERR("out of memory");
        goto fail;
    }
    int rows = 0;
    if (read_source(o, &s->from_window, err, err_len) || qfilter_obs_window(o, &rows, err, err_len)) goto fail;
    s->window = rows;
    if (!s->from_window) {
        int got = kvb_profile_qfilter(c->model, s->f, err, err_len);
        if (got < 0) goto fail;
        if (!got) {
            ERR("qfilter: no Q-Filters for this model: run `kvbench calibrate qfilter --model %s` (or pass --method-opt "
                "filters=window)", c->model->path);
            goto fail;
        }
    }
    s->base.budget = *b;
    s->base.imposes_budget = 1;
    return &s->base;
fail:
    if (s) free(s->f);
    free(s);
    return NULL;
}

const kvb_method_def kvb_method_qfilter = {
    .name = "qfilter",
    .summary = "keeps the tokens whose keys project most on the head's query direction (SVD, calibrated)",
    .traits = KVB_NEEDS_BUDGET | KVB_SHARES_PREFILL | KVB_LAYER_LOCAL,
    .obs_window = qfilter_obs_window,
    .profile = qfilter_profile,
    .create = qfilter_create,
    .hooks = {.after_prefill = qfilter_after_prefill},
    .expected_tokens = qfilter_expected,
    .describe = qfilter_describe,
    .destroy = qfilter_destroy,
};
