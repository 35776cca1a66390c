/* compactor.c — Compactor's leverage scores (Chari & Van Durme 2025, "Compactor: Calibrated Query-Agnostic KV Cache
 * Compression with Approximate Leverage Scores", arXiv 2507.08143), as kvpress's LeverageScorePress scores them: a
 * key matters as much as it is an outlier of the head's key geometry, its statistical leverage among the prompt's
 * pre-RoPE keys centred on their mean,
 *
 *     X = K_pre - mean_j K_pre,   score_j = x_j^T (X^T X + jitter I)^-1 x_j = ||L^-1 x_j||^2,   L L^T = X^T X + jitter I
 *
 * (paper sec. 3, eq. 3-4, with kvpress's Cholesky and its first jitter, 1e-2). Query-agnostic: no attention is
 * computed. Once the prompt is in, each layer and KV head keeps its top B tokens; decode appends without evicting.
 *
 * Choices (the paper and the press leave them open, or kvbench differs):
 * - The exact leverage, in head_dim dimensions: kvpress (and the paper) first multiply X by a Gaussian sketch of 48
 *   columns drawn by torch.randn, an approximation kvbench cannot repeat draw for draw; without it the score is the
 *   quantity the sketch approximates (head_dim <= 256 keeps the Gram matrix small). So kept sets agree with kvpress's
 *   only as well as its sketch approximates the leverage.
 * - CompactorPress blends these scores (z-scored, times `blending` = the compression ratio) with a chunked
 *   non-causal attention of every prompt query (NonCausalAttnPress) and protects 8 + 4 tokens at the ends; that
 *   attention needs every prompt query, which a shared prefill does not keep: not implemented. This is kvpress's
 *   LeverageScorePress (its z-scoring, a positive affine map per layer, changes no head's ranking: left out).
 * - Pre-RoPE keys: the cached keys derotated exactly (rope at -pos: slots in position order after prefill, positions
 *   the token indices). YaRN's magnitude scales a head's keys uniformly: no effect on leverage.
 * - Budget B per head = budget x prompt length rounded (kvb_budget_tokens; kvpress: int(n (1 - ratio))); ties to
 *   the earlier token.
 * - How it is computed: the keys as f32 (block_minmax with one-row blocks), derotated (rope / rope_ext), centred
 *   (probs_reduce's column sum, gather_f32 replicating it, axpby_f32), the Gram matrix by gram_f32 (double sums over
 *   the tokens in order; one launch on CUDA, where d block_scores calls over rows of n tokens took seconds a layer),
 *   d x d floats copied to the host (one counted copy per head), Cholesky and L^-1 on the host in double, L^-1
 *   copied up, proj_sqnorms, topk_idx, kvc_retain_dev.
 * - Against kvpress 0.5.5 (test_kvpress_kept, default model, 3765 tokens, 1129 kept): LeverageScorePress with a
 *   square sketch (64 columns = head_dim: invertible, so the exact leverage) Jaccard 0.848 at least per head (layer
 *   0), 0.972 on average; with its default 48-column sketch 0.61 and 0.745, the sketch's approximation. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "methods/method.h"

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)
#define JITTER 1e-2   /* kvpress's chol_with_jitter(..., jitter=1e-2): its first try */
#define MAX_DIM 256

typedef struct {
    kvb_method base;
    int64_t keep; /* tokens kept per head after prefill */
} compactor;

typedef struct {
    float *kf, *kc, *rep, *m, *gram, *linv, *score; /* device */
    int32_t *neg_pos, *mod_d, *idx;                 /* device */
    double *g, *l;                                       /* host [d][d] */
    float *gh;                                           /* host [d][d] */
    size_t nd_bytes;
} scratch;

/* L^-1 of the Cholesky factor of g + jitter I (d x d, symmetrized), raising the jitter tenfold on failure as kvpress
 * does (five tries); into lf as floats. 0, or -1 when g is not positive definite even then. */
static int chol_inverse(const float *gh, int d, double *g, double *l, float *lf) {
    for (int a = 0; a < d; a++)
        for (int b = 0; b < d; b++) g[a * d + b] = 0.5 * ((double)gh[a * d + b] + gh[b * d + a]);
    double jitter = JITTER;
    for (int attempt = 0; attempt < 5; attempt++, jitter *= 10) {
        int ok = 1;
        memset(l, 0, (size_t)d * d * sizeof *l);
        for (int a = 0; a < d && ok; a++)
            for (int b = 0; b <= a && ok; b++) {
                double s = g[a * d + b] + (a == b ? jitter : 0);
                for (int k = 0; k < b; k++) s -= l[a * d + k] * l[b * d + k];
                if (a == b) {
                    if (!(s > 0)) ok = 0;
                    else l[a * d + a] = sqrt(s);
                } else
                    l[a * d + b] = s / l[b * d + b];
            }
        if (!ok) continue;
        for (int c = 0; c < d; c++) /* column c of L^-1 by forward substitution, into g (no longer needed) */
            for (int a = 0; a < d; a++) {
                double s = a == c ? 1.0 : 0.0;
                for (int k = c; k < a; k++) s -= l[a * d + k] * g[k * d + c];
                g[a * d + c] = a < c ? 0.0 : s / l[a * d + a];
            }
        for (int i = 0; i < d * d; i++) lf[i] = (float)g[i];
        return 0;
    }
    return -1;
}

static int head_scores(kvb_ctx *c, int l, int g, int64_t n, scratch *s, char *err, size_t err_len) {
    kvb_backend *be = c->be;
    const kvb_config *cfg = &c->model->cfg;
    const int d = cfg->head_dim;
    const kvc_view v = kvc_head_view(c->kv, l, g); /* slots in position order after prefill */
    if (be->block_minmax(be, s->kf, s->rep, v.k, v.dtype, d, 1, 0, n, err, err_len)) return -1; /* kmax into rep: overwritten below */
    kvb_rope_params r = cfg->rope;
    r.freq_factors = c->model->rope_freqs;
    if (r.freq_scale == 1.0f && r.ext_factor == 0.0f && r.attn_factor == 1.0f && !r.freq_factors)
        be->rope(be, s->kf, n, 1, d, cfg->n_rot, s->neg_pos, r.freq_base, cfg->rope_neox);
    else
        be->rope_ext(be, s->kf, n, 1, d, cfg->n_rot, s->neg_pos, cfg->rope_neox, &r);
    if (be->probs_reduce(be, s->m, d, s->kf, d, 1, 1, n, d, NULL, KVB_REDUCE_GROUP_SUM, 0, err, err_len) ||
        be->gather_f32(be, s->rep, s->m, s->mod_d, n * d, err, err_len) ||
        be->axpby_f32(be, s->kc, s->kf, 1.0, s->rep, -1.0 / (double)n, 0.0, n * d, err, err_len) ||
        be->gram_f32(be, s->gram, s->kc, n, d, err, err_len)) /* X^T X, each entry's sum in double */
        return -1;
    if (be->copy(be, s->gh, s->gram, (size_t)d * d * sizeof(float), KVB_COPY_D2H, err, err_len)) return -1;
    if (be->sync && be->sync(be)) return ERR("%s", be->error);
    float *lf = malloc((size_t)d * d * sizeof *lf);
    if (!lf) return ERR("out of memory");
    int rc = chol_inverse(s->gh, d, s->g, s->l, lf) ? ERR("compactor: layer %d head %d: the keys' Gram matrix is not "
                                                          "positive definite", l, g)
                                                    : 0;
    rc = rc || be->copy(be, s->linv, lf, (size_t)d * d * sizeof *lf, KVB_COPY_H2D, err, err_len) ||
         be->proj_sqnorms(be, s->score, s->kc, KVB_F32, d, n, s->linv, d, err, err_len);
    if (be->sync) be->sync(be); /* lf is read by the copy up */
    free(lf);
    return rc ? -1 : 0;
}

static void scratch_free(kvb_ctx *c, scratch *s, int64_t n, int d) {
    const size_t dd = (size_t)d * d * sizeof(float);
    float *nd[] = {s->kf, s->kc, s->rep};
    for (int i = 0; i < 3; i++) kvb_method_release(c, nd[i], s->nd_bytes);
    kvb_method_release(c, s->m, (size_t)d * sizeof(float));
    kvb_method_release(c, s->gram, dd), kvb_method_release(c, s->linv, dd);
    kvb_method_release(c, s->score, (size_t)n * sizeof(float));
    kvb_method_release(c, s->neg_pos, (size_t)n * sizeof(int32_t)), kvb_method_release(c, s->idx, (size_t)n * sizeof(int32_t));
    kvb_method_release(c, s->mod_d, (size_t)n * d * sizeof(int32_t));
    free(s->g), free(s->l), free(s->gh);
}

static int compactor_after_prefill(void *self, kvb_ctx *c, char *err, size_t err_len) {
    compactor *cp = self;
    kvb_backend *be = c->be;
    const kvb_config *cfg = &c->model->cfg;
    const int64_t n = c->n_past;
    const int d = cfg->head_dim;
    cp->base.n_prompt = n;
    if (kvb_method_budget_tokens(&cp->base, n, &cp->keep, err, err_len)) return -1;
    int from, to; /* every layer, or one (a layer-wise end of prefill: engine/model.h kvb_prefill_layers) */
    kvb_prefill_layers(c, &from, &to);
    if (cp->keep >= n || from >= to) return 0;
    if (n * d >= INT32_MAX) return ERR("compactor: %lld tokens of %d dimensions are too many", (long long)n, d);
    scratch s = {0};
    s.nd_bytes = (size_t)n * d * sizeof(float);
    s.kf = kvb_method_alloc(c, s.nd_bytes), s.kc = kvb_method_alloc(c, s.nd_bytes);
    s.rep = kvb_method_alloc(c, s.nd_bytes);
    s.m = kvb_method_alloc(c, (size_t)d * sizeof(float));
    s.gram = kvb_method_alloc(c, (size_t)d * d * sizeof(float)), s.linv = kvb_method_alloc(c, (size_t)d * d * sizeof(float));
    s.score = kvb_method_alloc(c, (size_t)n * sizeof(float));
    s.neg_pos = kvb_method_alloc(c, (size_t)n * sizeof(int32_t)), s.idx = kvb_method_alloc(c, (size_t)n * sizeof(int32_t));
    s.mod_d = kvb_method_alloc(c, (size_t)n * d * sizeof(int32_t));
    s.g = malloc((size_t)d * d * sizeof *s.g), s.l = malloc((size_t)d * d * sizeof *s.l);
    s.gh = malloc((size_t)d * d * sizeof *s.gh);
    int32_t *host = malloc((size_t)n * d * sizeof *host);
    int rc = s.kf && s.kc && s.rep && s.m && s.gram && s.linv && s.score && s.neg_pos && s.idx && s.mod_d &&
                     s.g && s.l && s.gh && host
                 ? 0
                 : ERR("compactor: out of memory");
    /* the index tables, made once: -position per slot, i % d (the mean replicated) */
    for (int64_t j = 0; !rc && j < n; j++) host[j] = (int32_t)-j;
    rc = rc || be->copy(be, s.neg_pos, host, (size_t)n * sizeof *host, KVB_COPY_H2D, err, err_len) ||
         (be->sync && be->sync(be));
    for (int64_t i = 0; !rc && i < n * d; i++) host[i] = (int32_t)(i % d);
    rc = rc || be->copy(be, s.mod_d, host, (size_t)n * d * sizeof *host, KVB_COPY_H2D, err, err_len) ||
         (be->sync && be->sync(be));
    free(host);
    for (int l = from; l < to && !rc; l++)
        for (int g = 0; g < cfg->n_head_kv && !rc && !kvb_layer_window(cfg, l); g++) /* a local layer keeps its window */
            rc = head_scores(c, l, g, n, &s, err, err_len) ||
                 be->topk_idx(be, s.idx, s.score, n, cp->keep, err, err_len) ||
                 kvc_retain_dev(c->kv, l, g, s.idx, cp->keep, err, err_len);
    scratch_free(c, &s, n, d);
    return rc ? -1 : 0;
}

static int64_t compactor_expected(kvb_method *m, kvb_ctx *c, int layer) {
    (void)layer;
    compactor *s = (compactor *)m;
    return kvb_kept_then_decoded(m, c, s->keep);
}

static void compactor_describe(kvb_method *m, char *buf, size_t cap) {
    snprintf(buf, cap, "sketch=none keep=%lld", (long long)((compactor *)m)->keep);
}

static void compactor_destroy(kvb_method *m) { free(m); }

static kvb_method *compactor_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len) {
    (void)o;
    if (c->model->cfg.head_dim > MAX_DIM) {
        ERR("compactor: head_dim %d is over %d", c->model->cfg.head_dim, MAX_DIM);
        return NULL;
    }
    compactor *s = calloc(1, sizeof *s);
    if (!s) {
        ERR("out of memory");
        return NULL;
    }
    s->base.budget = *b;
    s->base.imposes_budget = 1;
    return &s->base;
}

const kvb_method_def kvb_method_compactor = {
    .name = "compactor",
    .summary = "Compactor's leverage scores: keeps the tokens whose pre-RoPE keys are the outliers of the head's keys",
    .traits = KVB_NEEDS_BUDGET | KVB_SHARES_PREFILL | KVB_LAYER_LOCAL,
    .create = compactor_create,
    .hooks = {.after_prefill = compactor_after_prefill},
    .expected_tokens = compactor_expected,
    .describe = compactor_describe,
    .destroy = compactor_destroy,
};
