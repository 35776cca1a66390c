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
 * - mode=leverage (the default) is kvpress's LeverageScorePress over every prompt token (its z-scoring, a positive
 *   affine map per layer, changes no ranking: left out). mode=compactor is kvpress's CompactorPress (its `blending`
 *   the compression ratio unless blend= is given):
 *
 *       score = blend z(leverage) + z(pool3(mean_group(sum_q softmax(q k^T)) ||v||)),   z(x) = (x - mean) / std
 *
 *   over the tokens between sink_start (8) and sink_end (4) protected ones at the ends, the leverage's mean taken
 *   over those tokens only; the attention non-causal within chunks of `chunk` (256) of them from the first, the
 *   logits unscaled, the last chunk zero-padded (its zero query rows add 1/chunk to each of its columns, and its zero
 *   keys take part in its queries' softmax, as kvpress's padding does); pool3 an average over 3 neighbours counting
 *   the zero padding (avg_pool1d); mean and unbiased std over the layer's KV heads together (std at least 1e-6); the
 *   protected tokens score the layer's maximum. It reads every prompt query between the sinks: the observation
 *   window (`window`, default 4096 rows, n_layer x window x q_dim floats in every fork) must hold them, or the end
 *   of prefill fails naming the prompt's length. The z-scores and the blend are taken on the host in double, from
 *   the counted copies of a layer's per-head scores (3 x n_head_kv x n floats a layer).
 * - ada=1: AdaKV's allocation (kvb_adakv_retain, alpha = 0.2 of the budget protected per head) of the layer's
 *   n_head_kv x B tokens among its heads, as kvpress's AdaKVPress wraps either press (the leaderboard's
 *   adakv_compactor row is mode=compactor ada=1).
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
 *   0), 0.972 on average; with its default 48-column sketch 0.61 and 0.745, the sketch's approximation. mode=compactor
 *   against CompactorPress with a square sketch: 0.937 at least per head, 0.983 on average (0.910, 0.982 under AdaKV);
 *   its attention term alone (blend=0, the press's blending=0) 0.993 and 0.997: what is left apart is the leverage's
 *   near-ties. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "methods/method.h"
#include "methods/snapkv.h" /* kvb_adakv_retain */

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)
#define JITTER 1e-2   /* kvpress's chol_with_jitter(..., jitter=1e-2): its first try */
#define MAX_DIM 256
#define MAX_WINDOW 65536
#define ELT(dt) ((size_t)((dt) == KVB_F16 ? 2 : 4)) /* bytes of a K or V element */

typedef struct {
    kvb_method base;
    int64_t keep;   /* tokens kept per head after prefill (with ada: the layer's mean) */
    int blended;    /* mode=compactor: CompactorPress's blend; 0: LeverageScorePress */
    double blend;   /* the leverage's weight; NAN: the compression ratio */
    double blend_used;
    int64_t chunk, sink_start, sink_end, window;
    int ada;
    double alpha;
    int64_t held[2]; /* with ada: fewest and most tokens one head held after prefill */
} compactor;

typedef struct {
    float *kf, *kc, *rep, *m, *gram, *linv; /* device */
    int32_t *neg_pos, *mod_d;               /* device */
    double *g, *l;                          /* host [d][d] */
    float *gh;                              /* host [d][d] */
    size_t nd_bytes;
} scratch;

/* What the blend and AdaKV need beyond one head's leverage: device rows [HK][span] (lev, the attention's group
 * sums, the value norms), the final scores [HK][n], the padded last chunk, AdaKV's outputs, and their host copies. */
typedef struct {
    float *lev, *asum, *vn, *score, *qpad;
    void *kpad;
    int32_t *pos, *out, *flat, *counts, *idx;
    float *h_lev, *h_asum, *h_vn, *h_score;
    size_t span_bytes, score_bytes, qpad_bytes, kpad_bytes, pos_bytes, ada_bytes;
} blend_scratch;

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

/* Leverage of the cnt keys from slot `off` of layer l, KV head g (slots in position order after prefill), among
 * themselves, into out[0..cnt) (device). s->neg_pos holds -(off + j). */
static int head_scores(kvb_ctx *c, int l, int g, int64_t off, int64_t cnt, scratch *s, float *out, char *err,
                       size_t err_len) {
    kvb_backend *be = c->be;
    const kvb_config *cfg = &c->model->cfg;
    const int d = cfg->head_dim;
    const kvc_view v = kvc_head_view(c->kv, l, g);
    const void *k = (const char *)v.k + (size_t)off * d * ELT(v.dtype);
    if (be->block_minmax(be, s->kf, s->rep, k, v.dtype, d, 1, 0, cnt, err, err_len)) return -1; /* kmax into rep: overwritten below */
    kvb_rope_params r = cfg->rope;
    r.freq_factors = c->model->rope_freqs;
    if (r.freq_scale == 1.0f && r.ext_factor == 0.0f && r.attn_factor == 1.0f && !r.freq_factors)
        be->rope(be, s->kf, cnt, 1, d, cfg->n_rot, s->neg_pos, r.freq_base, cfg->rope_neox);
    else
        be->rope_ext(be, s->kf, cnt, 1, d, cfg->n_rot, s->neg_pos, cfg->rope_neox, &r);
    if (be->probs_reduce(be, s->m, d, s->kf, d, 1, 1, cnt, d, NULL, KVB_REDUCE_GROUP_SUM, 0, err, err_len) ||
        be->gather_f32(be, s->rep, s->m, s->mod_d, cnt * d, err, err_len) ||
        be->axpby_f32(be, s->kc, s->kf, 1.0, s->rep, -1.0 / (double)cnt, 0.0, cnt * d, err, err_len) ||
        be->gram_f32(be, s->gram, s->kc, cnt, d, err, err_len)) /* X^T X, each entry's sum in double */
        return -1;
    if (be->copy(be, s->gh, s->gram, (size_t)d * d * sizeof(float), KVB_COPY_D2H, err, err_len)) return -1;
    if (be->sync && be->sync(be)) return ERR("%s", be->error);
    float *lf = malloc((size_t)d * d * sizeof *lf);
    if (!lf) return ERR("out of memory");
    int rc = chol_inverse(s->gh, d, s->g, s->l, lf) ? ERR("compactor: layer %d head %d: the keys' Gram matrix is not "
                                                          "positive definite", l, g)
                                                    : 0;
    rc = rc || be->copy(be, s->linv, lf, (size_t)d * d * sizeof *lf, KVB_COPY_H2D, err, err_len) ||
         be->proj_sqnorms(be, out, s->kc, KVB_F32, d, cnt, s->linv, d, err, err_len);
    if (be->sync) be->sync(be); /* lf is read by the copy up */
    free(lf);
    return rc ? -1 : 0;
}

/* NonCausalAttnPress's column sums for layer l: for each chunk of the S tokens from slot off, the softmax of the
 * chunk's queries' unscaled dot products with the chunk's keys (no mask), summed over the queries and each KV head's
 * query group, into t->asum[g][0..S). The queries are the observation window's rows (positions = slots). */
static int chunk_sums(compactor *cp, kvb_ctx *c, int l, int64_t off, int64_t S, blend_scratch *t, char *err,
                      size_t err_len) {
    kvb_backend *be = c->be;
    const kvb_config *cfg = &c->model->cfg;
    const int HK = cfg->n_head_kv, d = cfg->head_dim;
    const int64_t C = cp->chunk, first = c->n_past - c->obs_n; /* position of the window's row 0 */
    const size_t row = (size_t)d * ELT(c->params.kv_dtype);
    kvb_src src[KVB_MAX_KV_HEADS];
    for (int64_t o = 0; o < S; o += C) {
        const int64_t cnt = S - o < C ? S - o : C, p = off + o;
        const float *q = c->obs_q + ((size_t)l * c->obs_cap + (size_t)(p - first)) * cfg->q_dim;
        for (int h = 0; h < HK; h++) {
            const kvc_view v = kvc_head_view(c->kv, l, h);
            src[h] = (kvb_src){(const char *)v.k + p * row, (const char *)v.v + p * row, v.pos + p, C, NULL, 0};
            if (cnt == C) continue;
            void *kh = (char *)t->kpad + (size_t)h * C * row; /* the last chunk: its keys, then zero rows */
            if (be->copy(be, kh, src[h].k, (size_t)cnt * row, KVB_COPY_D2D, err, err_len)) return -1;
            src[h] = (kvb_src){kh, kh, t->pos, C, NULL, 0};
        }
        if (cnt < C) {
            if (be->copy(be, t->qpad, q, (size_t)cnt * cfg->q_dim * sizeof(float), KVB_COPY_D2D, err, err_len))
                return -1;
            q = t->qpad;
        }
        float *probs = NULL;
        int64_t stride = 0;
        int rc = kvb_attn_probs_scaled(c, l, q, NULL, C, src, 1.0f, &probs, &stride, NULL, err, err_len) ||
                 be->probs_reduce(be, t->asum + o, S, probs, stride, cfg->n_head, HK, C, cnt, NULL,
                                  KVB_REDUCE_GROUP_SUM, 0, err, err_len);
        if (probs) kvb_attn_probs_free(c, probs, C, stride);
        if (rc) return -1;
    }
    return 0;
}

/* mean and unbiased standard deviation (at least 1e-6, torch's clamp_min) of x[0..n) in double */
static void mean_std(const double *x, int64_t n, double *mean, double *std) {
    double s = 0, ss = 0;
    for (int64_t i = 0; i < n; i++) s += x[i];
    *mean = n ? s / (double)n : 0;
    for (int64_t i = 0; i < n; i++) ss += (x[i] - *mean) * (x[i] - *mean);
    *std = n > 1 ? sqrt(ss / (double)(n - 1)) : 0;
    if (!(*std >= 1e-6)) *std = 1e-6;
}

/* The layer's final scores on the host, h_score[HK][n]: CompactorPress's blend of the leverage (h_lev) and the
 * pooled attention sums times the value norms (h_asum, h_vn), each z-scored over the layer; the ends at the max. */
static int blend_scores(compactor *cp, int HK, int G, int64_t n, int64_t off, int64_t S, blend_scratch *t, char *err,
                        size_t err_len) {
    const int64_t m = (int64_t)HK * S;
    double *a = malloc((size_t)(m ? m : 1) * sizeof *a), *lz = malloc((size_t)(m ? m : 1) * sizeof *lz);
    if (!a || !lz) {
        free(a), free(lz);
        return ERR("out of memory");
    }
    for (int64_t i = 0; i < m; i++) lz[i] = t->h_lev[i];
    for (int g = 0; g < HK; g++) /* avg_pool1d(kernel 3, padding 1): the padding counts */
        for (int64_t j = 0; j < S; j++) {
            const float *sum = t->h_asum + (size_t)g * S, *vn = t->h_vn + (size_t)g * S;
            double acc = 0;
            for (int64_t k = j - 1; k <= j + 1; k++)
                if (k >= 0 && k < S) acc += (double)(sum[k] / (float)G * vn[k]);
            a[(size_t)g * S + j] = acc / 3.0;
        }
    double am, as, lm, ls;
    mean_std(a, m, &am, &as);
    mean_std(lz, m, &lm, &ls);
    float top = -FLT_MAX;
    for (int g = 0; g < HK; g++)
        for (int64_t j = 0; j < S; j++) {
            const size_t i = (size_t)g * S + j;
            const float v = (float)(cp->blend_used * ((lz[i] - lm) / ls) + (a[i] - am) / as);
            t->h_score[(size_t)g * n + off + j] = v;
            if (v > top) top = v;
        }
    if (!m) top = 0;
    for (int g = 0; g < HK; g++)
        for (int64_t j = 0; j < n; j++)
            if (j < off || j >= off + S) t->h_score[(size_t)g * n + j] = top;
    free(a), free(lz);
    return 0;
}

/* Keep the layer's tokens by t->score ([HK][n], device): each head its top keep, or AdaKV's allocation. */
static int retain_layer(compactor *cp, kvb_ctx *c, int l, int64_t n, blend_scratch *t, char *err, size_t err_len) {
    kvb_backend *be = c->be;
    const int HK = c->model->cfg.n_head_kv;
    if (!cp->ada) {
        for (int g = 0; g < HK; g++)
            if (be->topk_idx(be, t->idx, t->score + (size_t)g * n, n, cp->keep, err, err_len) ||
                kvc_retain_dev(c->kv, l, g, t->idx, cp->keep, err, err_len))
                return -1;
        return 0;
    }
    return kvb_adakv_retain(c, l, t->score, n, cp->keep, cp->alpha, t->out, t->flat, t->counts, cp->held, err, err_len);
}

/* One layer's scores (leverage, and with mode=compactor the chunks' attention) and its retained tokens. */
static int layer_keep(compactor *cp, kvb_ctx *c, int l, int64_t off, int64_t S, scratch *s, blend_scratch *t,
                      char *err, size_t err_len) {
    kvb_backend *be = c->be;
    const kvb_config *cfg = &c->model->cfg;
    const int HK = cfg->n_head_kv;
    const int64_t n = c->n_past;
    if (!cp->blended) { /* the leverage itself: every token, no ends protected */
        for (int g = 0; g < HK; g++)
            if (head_scores(c, l, g, 0, n, s, t->score + (size_t)g * n, err, err_len)) return -1;
        return retain_layer(cp, c, l, n, t, err, err_len);
    }
    for (int g = 0; g < HK; g++)
        if ((S > 0 && head_scores(c, l, g, off, S, s, t->lev + (size_t)g * S, err, err_len)) ||
            (S > 0 && be->row_norms(be, t->vn + (size_t)g * S,
                                    (const char *)kvc_head_view(c->kv, l, g).v +
                                        (size_t)off * cfg->head_dim * ELT(c->params.kv_dtype),
                                    c->params.kv_dtype, cfg->head_dim, S, 0, err, err_len)))
            return -1;
    if (S > 0 && chunk_sums(cp, c, l, off, S, t, err, err_len)) return -1;
    const size_t span = (size_t)HK * S * sizeof(float);
    if (S > 0 && (be->copy(be, t->h_lev, t->lev, span, KVB_COPY_D2H, err, err_len) ||
                  be->copy(be, t->h_asum, t->asum, span, KVB_COPY_D2H, err, err_len) ||
                  be->copy(be, t->h_vn, t->vn, span, KVB_COPY_D2H, err, err_len)))
        return -1;
    if (be->sync && be->sync(be)) return ERR("%s", be->error);
    if (blend_scores(cp, HK, cfg->n_head / HK, n, off, S, t, err, err_len) ||
        be->copy(be, t->score, t->h_score, (size_t)HK * n * sizeof(float), KVB_COPY_H2D, err, err_len) ||
        (be->sync && be->sync(be))) /* h_score is rewritten by the next layer */
        return -1;
    return retain_layer(cp, c, l, n, t, err, err_len);
}

static void scratch_free(kvb_ctx *c, scratch *s, int64_t n, int d) {
    const size_t dd = (size_t)d * d * sizeof(float);
    float *nd[] = {s->kf, s->kc, s->rep};
    for (int i = 0; i < 3; i++) kvb_method_release(c, nd[i], s->nd_bytes);
    kvb_method_release(c, s->m, (size_t)d * sizeof(float));
    kvb_method_release(c, s->gram, dd), kvb_method_release(c, s->linv, dd);
    kvb_method_release(c, s->neg_pos, (size_t)n * sizeof(int32_t));
    kvb_method_release(c, s->mod_d, (size_t)n * d * sizeof(int32_t));
    free(s->g), free(s->l), free(s->gh);
}

static void blend_free(kvb_ctx *c, blend_scratch *t, int HK) {
    kvb_method_release(c, t->lev, t->span_bytes), kvb_method_release(c, t->asum, t->span_bytes);
    kvb_method_release(c, t->vn, t->span_bytes), kvb_method_release(c, t->score, t->score_bytes);
    kvb_method_release(c, t->qpad, t->qpad_bytes), kvb_method_release(c, t->kpad, t->kpad_bytes);
    kvb_method_release(c, t->pos, t->pos_bytes);
    kvb_method_release(c, t->out, t->ada_bytes), kvb_method_release(c, t->flat, t->ada_bytes);
    kvb_method_release(c, t->counts, t->ada_bytes ? (size_t)HK * sizeof(int32_t) : 0);
    kvb_method_release(c, t->idx, t->score_bytes / (size_t)HK);
    free(t->h_lev), free(t->h_asum), free(t->h_vn), free(t->h_score);
}

static int compactor_after_prefill(void *self, kvb_ctx *c, char *err, size_t err_len) {
    compactor *cp = self;
    kvb_backend *be = c->be;
    const kvb_config *cfg = &c->model->cfg;
    const int64_t n = c->n_past;
    const int d = cfg->head_dim, HK = cfg->n_head_kv;
    cp->base.n_prompt = n;
    if (kvb_method_budget_tokens(&cp->base, n, &cp->keep, err, err_len)) return -1;
    int from, to; /* every layer, or one (a layer-wise end of prefill: engine/model.h kvb_prefill_layers) */
    kvb_prefill_layers(c, &from, &to);
    if (cp->keep >= n || from >= to) return 0;
    if (n * d >= INT32_MAX) return ERR("compactor: %lld tokens of %d dimensions are too many", (long long)n, d);
    if (HK > KVB_MAX_KV_HEADS) return ERR("compactor: %d KV heads (at most %d)", HK, KVB_MAX_KV_HEADS);
    /* mode=compactor: the tokens between the protected ends, off .. off + S - 1 (kvpress's left_keep, right_keep) */
    const int64_t off = cp->blended ? (n < cp->sink_start ? n : cp->sink_start) : 0;
    const int64_t right = cp->blended ? (n - off < cp->sink_end ? n - off : cp->sink_end) : 0, S = n - off - right;
    if (cp->blended && S > 0 && c->obs_n < n - off)
        return ERR("compactor: mode=compactor reads the queries of the prompt's %lld tokens after the first %lld, "
                   "but the observation window holds %d (window=%lld; raise it up to %d)",
                   (long long)(n - off), (long long)off, c->obs_n, (long long)cp->window, MAX_WINDOW);
    cp->blend_used = !isnan(cp->blend) ? cp->blend
                     : cp->base.budget.kind == KVB_BUDGET_FRACTION ? 1.0 - cp->base.budget.frac
                                                                  : 1.0 - (double)cp->keep / (double)n;
    if (from == 0) cp->held[0] = -1, cp->held[1] = 0; /* a prompt's first layer (a layer-wise end: one at a time) */
    const int64_t lev_n = cp->blended ? S : n; /* the rows one head's leverage is taken over */
    scratch s = {0};
    blend_scratch t = {0};
    s.nd_bytes = (size_t)(lev_n > 0 ? lev_n : 1) * d * sizeof(float); /* lev_n 0: every token at an end */
    s.kf = kvb_method_alloc(c, s.nd_bytes), s.kc = kvb_method_alloc(c, s.nd_bytes);
    s.rep = kvb_method_alloc(c, s.nd_bytes);
    s.m = kvb_method_alloc(c, (size_t)d * sizeof(float));
    s.gram = kvb_method_alloc(c, (size_t)d * d * sizeof(float)), s.linv = kvb_method_alloc(c, (size_t)d * d * sizeof(float));
    s.neg_pos = kvb_method_alloc(c, (size_t)n * sizeof(int32_t));
    s.mod_d = kvb_method_alloc(c, (size_t)n * d * sizeof(int32_t));
    s.g = malloc((size_t)d * d * sizeof *s.g), s.l = malloc((size_t)d * d * sizeof *s.l);
    s.gh = malloc((size_t)d * d * sizeof *s.gh);
    t.score_bytes = (size_t)HK * n * sizeof(float);
    t.score = kvb_method_alloc(c, t.score_bytes), t.idx = kvb_method_alloc(c, (size_t)n * sizeof(int32_t));
    int have = s.kf && s.kc && s.rep && s.m && s.gram && s.linv && s.neg_pos && s.mod_d && s.g && s.l && s.gh &&
               t.score && t.idx;
    if (cp->ada) {
        t.ada_bytes = (size_t)HK * n * sizeof(int32_t);
        t.out = kvb_method_alloc(c, t.ada_bytes), t.flat = kvb_method_alloc(c, t.ada_bytes);
        t.counts = kvb_method_alloc(c, (size_t)HK * sizeof(int32_t));
        have = have && t.out && t.flat && t.counts;
    }
    if (cp->blended) {
        const size_t row = (size_t)d * ELT(c->params.kv_dtype);
        t.span_bytes = (size_t)HK * (S > 0 ? S : 1) * sizeof(float);
        t.qpad_bytes = (size_t)cp->chunk * cfg->q_dim * sizeof(float);
        t.kpad_bytes = (size_t)HK * cp->chunk * row;
        t.lev = kvb_method_alloc(c, t.span_bytes), t.asum = kvb_method_alloc(c, t.span_bytes);
        t.vn = kvb_method_alloc(c, t.span_bytes);
        t.qpad = kvb_method_alloc(c, t.qpad_bytes), t.kpad = kvb_method_alloc(c, t.kpad_bytes);
        t.pos_bytes = (size_t)cp->chunk * sizeof(int32_t);
        t.pos = kvb_method_alloc(c, t.pos_bytes);
        t.h_lev = malloc(t.span_bytes), t.h_asum = malloc(t.span_bytes), t.h_vn = malloc(t.span_bytes);
        t.h_score = malloc(t.score_bytes);
        have = have && t.lev && t.asum && t.vn && t.qpad && t.kpad && t.pos && t.h_lev && t.h_asum && t.h_vn &&
               t.h_score;
    }
    int32_t *host = malloc((size_t)n * d * sizeof *host);
    int rc = have && host ? 0 : ERR("compactor: out of memory");
    /* the index tables, made once: -position per slot, i % d (the mean replicated) */
    for (int64_t j = 0; !rc && j < lev_n; j++) host[j] = (int32_t)-(off + j);
    rc = rc || be->copy(be, s.neg_pos, host, (size_t)lev_n * sizeof *host, KVB_COPY_H2D, err, err_len) ||
         (be->sync && be->sync(be));
    for (int64_t i = 0; !rc && i < lev_n * d; i++) host[i] = (int32_t)(i % d);
    rc = rc || be->copy(be, s.mod_d, host, (size_t)lev_n * d * sizeof *host, KVB_COPY_H2D, err, err_len) ||
         (be->sync && be->sync(be));
    free(host);
    if (!rc && cp->blended) /* the padded chunk: zero query and key rows, positions 0 .. chunk - 1 (no mask reads them) */
        rc = be->zero(be, t.qpad, t.qpad_bytes, err, err_len) || be->zero(be, t.kpad, t.kpad_bytes, err, err_len) ||
             be->iota(be, t.pos, 0, cp->chunk, err, err_len);
    for (int l = from; l < to && !rc; l++)
        if (!kvb_layer_window(cfg, l)) /* a local layer keeps its window */
            rc = layer_keep(cp, c, l, off, S, &s, &t, err, err_len);
    scratch_free(c, &s, n, d);
    blend_free(c, &t, HK);
    if (!rc && cp->ada)
        snprintf(cp->base.note, sizeof cp->base.note, "tokens per KV head after prefill: %lld .. %lld (layer mean %lld)",
                 (long long)cp->held[0], (long long)cp->held[1], (long long)cp->keep);
    return rc ? -1 : 0;
}

static int64_t compactor_expected(kvb_method *m, kvb_ctx *c, int layer) {
    (void)layer;
    compactor *s = (compactor *)m;
    return kvb_kept_then_decoded(m, c, s->keep);
}

static void compactor_describe(kvb_method *m, char *buf, size_t cap) {
    compactor *s = (compactor *)m;
    int at = snprintf(buf, cap, "mode=%s sketch=none", s->blended ? "compactor" : "leverage");
    if (at > 0 && (size_t)at < cap && s->blended) {
        if (isnan(s->blend) && s->base.n_prompt == 0)
            at += snprintf(buf + at, cap - (size_t)at, " blend=ratio");
        else
            at += snprintf(buf + at, cap - (size_t)at, " blend=%g", isnan(s->blend) ? s->blend_used : s->blend);
        if (at > 0 && (size_t)at < cap)
            at += snprintf(buf + at, cap - (size_t)at, " chunk=%lld sink_start=%lld sink_end=%lld window=%lld",
                           (long long)s->chunk, (long long)s->sink_start, (long long)s->sink_end, (long long)s->window);
    }
    if (at > 0 && (size_t)at < cap && s->ada) at += snprintf(buf + at, cap - (size_t)at, " ada=1 alpha=%g", s->alpha);
    if (at > 0 && (size_t)at < cap) snprintf(buf + at, cap - (size_t)at, " keep=%lld", (long long)s->keep);
}

static void compactor_destroy(kvb_method *m) { free(m); }

/* mode: 1 = compactor (the blend), 0 = leverage (the default) */
static int read_mode(kvb_opts *o, int *blended, char *err, size_t err_len) {
    const char *mode = kvb_opts_get(o, "mode");
    *blended = mode && !strcmp(mode, "compactor");
    if (mode && !*blended && strcmp(mode, "leverage")) return ERR("compactor: mode must be leverage or compactor");
    return 0;
}

static int compactor_obs_window(kvb_opts *o, int *rows, char *err, size_t err_len) {
    int blended = 0;
    int64_t w = 4096;
    if (read_mode(o, &blended, err, err_len)) return -1;
    *rows = 0;
    if (!blended) return 0;
    if (kvb_opts_int(o, "window", &w, err, err_len) < 0) return -1;
    if (w < 1 || w > MAX_WINDOW) return ERR("compactor: window must be in [1, %d]", MAX_WINDOW);
    *rows = (int)w;
    return 0;
}

static kvb_method *compactor_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len) {
    if (c->model->cfg.head_dim > MAX_DIM) {
        ERR("compactor: head_dim %d is over %d", c->model->cfg.head_dim, MAX_DIM);
        return NULL;
    }
    compactor *s = calloc(1, sizeof *s);
    if (!s) {
        ERR("out of memory");
        return NULL;
    }
    int64_t ada = 0;
    int rows = 0;
    s->blend = NAN, s->chunk = 256, s->sink_start = 8, s->sink_end = 4, s->alpha = 0.2;
    int rc = read_mode(o, &s->blended, err, err_len) || kvb_opts_int(o, "ada", &ada, err, err_len) < 0;
    if (!rc && ada != 0 && ada != 1) rc = ERR("compactor: ada must be 0 or 1");
    if (!rc && ada && kvb_opts_double(o, "alpha", &s->alpha, err, err_len) < 0) rc = -1; /* read with ada=1 only */
    if (!rc && !(s->alpha >= 0 && s->alpha <= 1)) rc = ERR("compactor: alpha must be in [0, 1]");
    static const char *const blend_keys[] = {"blend", "chunk", "sink_start", "sink_end", "window"};
    for (size_t i = 0; !rc && !s->blended && i < sizeof blend_keys / sizeof *blend_keys; i++)
        if (kvb_opts_get(o, blend_keys[i])) rc = ERR("compactor: %s goes with mode=compactor", blend_keys[i]);
    if (!rc && s->blended)
        rc = kvb_opts_double(o, "blend", &s->blend, err, err_len) < 0 ||
             kvb_opts_int(o, "chunk", &s->chunk, err, err_len) < 0 ||
             kvb_opts_int(o, "sink_start", &s->sink_start, err, err_len) < 0 ||
             kvb_opts_int(o, "sink_end", &s->sink_end, err, err_len) < 0 ||
             compactor_obs_window(o, &rows, err, err_len);
    if (!rc && s->blended && !isnan(s->blend) && !(s->blend >= 0 && s->blend <= 100))
        rc = ERR("compactor: blend must be in [0, 100]");
    if (!rc && s->blended && (s->chunk < 1 || s->chunk > 4096)) rc = ERR("compactor: chunk must be in [1, 4096]");
    if (!rc && s->blended && (s->sink_start < 0 || s->sink_start > 4096 || s->sink_end < 0 || s->sink_end > 4096))
        rc = ERR("compactor: sink_start and sink_end must be in [0, 4096]");
    if (rc) {
        free(s);
        return NULL;
    }
    s->window = rows;
    s->ada = (int)ada;
    s->base.budget = *b;
    s->base.imposes_budget = 1;
    return &s->base;
}

const kvb_method_def kvb_method_compactor = {
    .name = "compactor",
    .summary = "Compactor: keeps the tokens whose pre-RoPE keys are the head's leverage outliers (mode=compactor: CompactorPress's blend)",
    .traits = KVB_NEEDS_BUDGET | KVB_SHARES_PREFILL | KVB_LAYER_LOCAL,
    .obs_window = compactor_obs_window,
    .create = compactor_create,
    .hooks = {.after_prefill = compactor_after_prefill},
    .expected_tokens = compactor_expected,
    .describe = compactor_describe,
    .destroy = compactor_destroy,
};
