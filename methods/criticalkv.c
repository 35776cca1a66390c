/* criticalkv.c — CriticalKV (Feng et al. 2025, "Identify Critical KV Cache in LLM Inference from an Output
 * Perturbation Perspective", arXiv 2502.03805), as kvpress's CriticalKVPress and CriticalAdaKVPress wrap a scorer:
 * attention weights alone miss how much a token's value moves the output, which the paper bounds through the output
 * projection; so a base scorer's choice is refined in two stages. For the B tokens a head keeps:
 *
 *     stage 1: the base's top floor(first x B) tokens are kept outright;
 *     stage 2: the rest by (score_j + eps) x mean_{r in group} ||W_o^r v_j||_1                    (paper eq. 9-10)
 *
 * W_o^r the columns of the layer's output projection that query head r's attention output meets. Once the prompt
 * is in, each layer and KV head keeps its B tokens; decode appends without evicting.
 *
 * Choices (the paper and the presses leave them open, or kvbench differs):
 * - base=snapkv (CriticalKVPress(SnapKVPress)) or base=adakv (CriticalAdaKVPress(SnapKVPress)): the base's scores
 *   are kvbench's SnapKV scores (snapkv.h: the last `window` queries' attention summed over the window and the group,
 *   pooled, kernel 7, max) divided by window x G, kvpress's mean over the window and the group; kvpress's SnapKV
 *   pools by avg with kernel 5 and a window of 64, its options here (window, kernel, pool). The window's own tokens
 *   score above every other (kvpress: the scores' max), so they are in stage 1 and kept, as SnapKV keeps them.
 * - base=adakv: kvpress's CriticalAdaKVPress: each head's top floor(alpha B) of the base scores guaranteed, then the
 *   layer's B x n_head_kv best of all heads give each head its budget B_h (kvb_adakv_allocate: the counts come to the
 *   host, one small copy); stage 1 keeps each head's top floor(first x B_h), stage 2 fills B_h by the rescaled score.
 *   Heads hold different counts; the layer holds exactly B x n_head_kv.
 * - Defaults are kvpress's: eps=1e-4, first=0.5 (first_stage_ratio), alpha=0.2 (alpha_safeguard).
 * - Stage 1's count is floor(first x B) with kvbench's B (rounded; kvpress's int((1 - ratio) n first)); ties go to
 *   the earlier token.
 * - How it is computed, on the device: W_o dequantized once per layer (get_rows: [n_embd][q_dim] f32); per query head
 *   proj_l1norms of the KV head's V rows against its column slice of W_o (n_embd rows, q_dim apart), averaged over the
 *   group (axpby_f32); the base's pooled scores scaled (axpby_f32), the window filled (fill_idx_f32), stage 1 by
 *   topk_idx, (score + eps) x norm by axpby_f32 and mul_f32, stage 1 refilled above all, topk_idx, kvc_retain_dev.
 *   Cost: n x n_embd x head_dim double products per query head and layer (the projection kvpress computes too).
 * - Against kvpress 0.5.5 (test_kvpress_kept, default model, 3765 tokens, 1129 kept, SnapKV window=64 kernel=5
 *   pool=avg): Jaccard 0.996 at least per head, 0.999 on average, over SnapKV and over AdaKV. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "methods/snapkv.h"

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)
#define WINDOW_SCORE 1e30f /* above every base score */
#define STAGE1_SCORE 3e38f /* above every rescaled score */

typedef struct {
    kvb_method base;
    kvb_snap_opts p;
    int ada;       /* base=adakv */
    double eps, first, alpha;
    int64_t keep;  /* tokens kept per head after prefill (with ada: the layer's mean) */
    int64_t head_min, head_max;
} criticalkv;

typedef struct {
    float *score, *pooled; /* [n_head_kv][n] each */
    float *norm, *tmp;     /* [n] */
    float *wo;             /* [n_embd][q_dim] */
    int32_t *idx, *win;    /* [n]; [w] the window's slots */
    int32_t *out, *flat, *counts; /* ada: [n_head_kv][n] x2, [n_head_kv] */
    int32_t *rows;         /* host: 0 .. n_embd - 1 */
    size_t hk_bytes, wo_bytes;
} bufs;

/* mean over KV head g's query heads r of ||W_o^r v_j||_1 into b->norm */
static int value_norms(kvb_ctx *c, int l, int g, int64_t n, bufs *b, char *err, size_t err_len) {
    kvb_backend *be = c->be;
    const kvb_config *cfg = &c->model->cfg;
    const int d = cfg->head_dim, G = cfg->n_head / cfg->n_head_kv;
    const kvc_view v = kvc_head_view(c->kv, l, g); /* slots in position order after prefill */
    for (int r = 0; r < G; r++) { /* norm = sum over r of ||W_o^r v||_1 / G, added in r order */
        const int64_t h = (int64_t)g * G + r;
        float *dst = r ? b->tmp : b->norm;
        if (be->proj_l1norms(be, dst, v.v, v.dtype, d, n, b->wo + h * d, cfg->q_dim, cfg->n_embd, err, err_len) ||
            (r ? be->axpby_f32(be, b->norm, b->norm, 1.0, dst, 1.0 / G, 0.0, n, err, err_len)
               : be->axpby_f32(be, b->norm, dst, 1.0 / G, NULL, 0.0, 0.0, n, err, err_len)))
            return -1;
    }
    return 0;
}

/* head g keeps `keep` of its n slots: stage 1 the top floor(first x keep) of its base score row, stage 2 by the
 * rescaled score (the row is overwritten) */
static int refine_head(const criticalkv *s, kvb_ctx *c, int l, int g, int64_t n, int64_t keep, float *row, bufs *b,
                       char *err, size_t err_len) {
    kvb_backend *be = c->be;
    const int64_t k1 = (int64_t)(s->first * (double)keep);
    return (k1 > 0 && be->topk_idx(be, b->idx, row, n, k1, err, err_len)) ||
           value_norms(c, l, g, n, b, err, err_len) ||
           be->axpby_f32(be, row, row, 1.0, NULL, 0.0, s->eps, n, err, err_len) ||
           be->mul_f32(be, row, row, b->norm, n, err, err_len) ||
           (k1 > 0 && be->fill_idx_f32(be, row, b->idx, k1, STAGE1_SCORE, err, err_len)) ||
           be->topk_idx(be, b->idx, row, n, keep, err, err_len) ||
           kvc_retain_dev(c->kv, l, g, b->idx, keep, err, err_len);
}

static void held(criticalkv *s, int64_t tokens) {
    if (s->head_min < 0 || tokens < s->head_min) s->head_min = tokens;
    if (tokens > s->head_max) s->head_max = tokens;
}

static int critical_layer(criticalkv *s, kvb_ctx *c, int l, int64_t n, int64_t w, bufs *b, char *err, size_t err_len) {
    kvb_backend *be = c->be;
    const kvb_config *cfg = &c->model->cfg;
    const int HK = cfg->n_head_kv, G = cfg->n_head / HK;
    const kvb_layer *ly = &c->model->layers[l];
    const int64_t np = n - w;
    if (kvb_snap_score(c, l, n, w, &s->p, b->score, b->pooled, err, err_len)) return -1; /* score: scratch */
    be->get_rows(be, b->wo, &ly->wo, b->rows, cfg->n_embd);
    for (int g = 0; g < HK; g++) { /* the base's score rows [HK][n]: kvpress's means, the window above them */
        float *row = b->score + (size_t)g * n;
        if (be->axpby_f32(be, row, b->pooled + (size_t)g * np, 1.0 / ((double)w * G), NULL, 0.0, 0.0, np, err,
                          err_len) ||
            be->fill_idx_f32(be, row, b->win, w, WINDOW_SCORE, err, err_len))
            return -1;
    }
    if (!s->ada) {
        for (int g = 0; g < HK; g++) {
            if (refine_head(s, c, l, g, n, s->keep, b->score + (size_t)g * n, b, err, err_len)) return -1;
            held(s, s->keep);
        }
        return 0;
    }
    /* AdaKV's budgets from the base scores (on a copy: the allocation overwrites the safeguard slots) */
    int32_t counts[KVB_MAX_KV_HEADS];
    if (be->copy(be, b->pooled, b->score, b->hk_bytes, KVB_COPY_D2D, err, err_len) ||
        kvb_adakv_allocate(be, b->pooled, HK, n, s->keep, (int64_t)(s->alpha * (double)s->keep), b->out, n, b->counts,
                           b->flat, err, err_len) ||
        be->copy(be, counts, b->counts, (size_t)HK * sizeof *counts, KVB_COPY_D2H, err, err_len))
        return -1;
    if (be->sync && be->sync(be)) return ERR("%s", be->error);
    for (int g = 0; g < HK; g++) {
        float *row = b->score + (size_t)g * n;
        const int64_t safe = (int64_t)(s->alpha * (double)s->keep); /* kvpress: the safeguard first, as AdaKV */
        if ((safe > 0 && (be->topk_idx(be, b->idx, row, n, safe, err, err_len) ||
                          be->fill_idx_f32(be, row, b->idx, safe, STAGE1_SCORE, err, err_len))) ||
            refine_head(s, c, l, g, n, counts[g], row, b, err, err_len))
            return -1;
        held(s, counts[g]);
    }
    return 0;
}

static void bufs_free(kvb_ctx *c, bufs *b, int64_t n) {
    const size_t vec = (size_t)n * sizeof(float);
    kvb_method_release(c, b->score, b->hk_bytes), kvb_method_release(c, b->pooled, b->hk_bytes);
    kvb_method_release(c, b->norm, vec), kvb_method_release(c, b->tmp, vec);
    kvb_method_release(c, b->wo, b->wo_bytes);
    kvb_method_release(c, b->idx, (size_t)n * sizeof(int32_t)), kvb_method_release(c, b->win, (size_t)n * sizeof(int32_t));
    kvb_method_release(c, b->out, b->hk_bytes), kvb_method_release(c, b->flat, b->hk_bytes);
    kvb_method_release(c, b->counts, KVB_MAX_KV_HEADS * sizeof(int32_t));
    free(b->rows);
}

static int criticalkv_after_prefill(void *self, kvb_ctx *c, char *err, size_t err_len) {
    criticalkv *s = self;
    const kvb_config *cfg = &c->model->cfg;
    const int64_t n = c->n_past;
    s->base.n_prompt = n;
    s->head_min = -1, s->head_max = 0;
    if (kvb_method_budget_tokens(&s->base, n, &s->keep, err, err_len)) return -1;
    if (s->keep >= n) return 0;
    if (cfg->n_head_kv > KVB_MAX_KV_HEADS) return ERR("criticalkv: %d KV heads (at most %d)", cfg->n_head_kv, KVB_MAX_KV_HEADS);
    const int64_t w = kvb_snap_window(c, &s->p, s->keep);
    bufs b = {0};
    b.hk_bytes = (size_t)cfg->n_head_kv * n * sizeof(float);
    b.wo_bytes = (size_t)cfg->n_embd * cfg->q_dim * sizeof(float);
    b.score = kvb_method_alloc(c, b.hk_bytes), b.pooled = kvb_method_alloc(c, b.hk_bytes);
    b.norm = kvb_method_alloc(c, (size_t)n * sizeof(float)), b.tmp = kvb_method_alloc(c, (size_t)n * sizeof(float));
    b.wo = kvb_method_alloc(c, b.wo_bytes);
    b.idx = kvb_method_alloc(c, (size_t)n * sizeof(int32_t)), b.win = kvb_method_alloc(c, (size_t)n * sizeof(int32_t));
    if (s->ada) {
        b.out = kvb_method_alloc(c, b.hk_bytes), b.flat = kvb_method_alloc(c, b.hk_bytes);
        b.counts = kvb_method_alloc(c, KVB_MAX_KV_HEADS * sizeof(int32_t));
    }
    b.rows = malloc((size_t)cfg->n_embd * sizeof *b.rows);
    int rc = b.score && b.pooled && b.norm && b.tmp && b.wo && b.idx && b.win && b.rows &&
                     (!s->ada || (b.out && b.flat && b.counts))
                 ? 0
                 : ERR("criticalkv: out of memory");
    for (int i = 0; !rc && i < cfg->n_embd; i++) b.rows[i] = i;
    if (!rc && w) rc = c->be->iota(c->be, b.win, (int32_t)(n - w), w, err, err_len);
    for (int l = 0; l < cfg->n_layer && !rc; l++) {
        if (kvb_layer_window(cfg, l)) continue; /* a local layer keeps its window */
        if (!w) { /* the budget is under the window: the most recent tokens, as SnapKV */
            rc = kvb_snap_keep_recent(c, l, n, s->keep, err, err_len);
            held(s, s->keep);
        } else
            rc = critical_layer(s, c, l, n, w, &b, err, err_len);
    }
    bufs_free(c, &b, n);
    if (!rc && s->ada)
        snprintf(s->base.note, sizeof s->base.note, "tokens per KV head after prefill: %lld .. %lld (layer mean %lld)",
                 (long long)s->head_min, (long long)s->head_max, (long long)s->keep);
    return rc ? -1 : 0;
}

static int64_t criticalkv_expected(kvb_method *m, kvb_ctx *c, int layer) {
    (void)layer;
    criticalkv *s = (criticalkv *)m;
    return kvb_kept_then_decoded(m, c, s->keep);
}

static void criticalkv_describe(kvb_method *m, char *buf, size_t cap) {
    const criticalkv *s = (const criticalkv *)m;
    int at = snprintf(buf, cap, "base=%s eps=%g first=%g window=%lld kernel=%lld pool=%s", s->ada ? "adakv" : "snapkv",
                      s->eps, s->first, (long long)s->p.window, (long long)s->p.kernel, s->p.avg_pool ? "avg" : "max");
    if (at > 0 && (size_t)at < cap && s->ada) at += snprintf(buf + at, cap - (size_t)at, " alpha=%g", s->alpha);
    if (at > 0 && (size_t)at < cap) snprintf(buf + at, cap - (size_t)at, " keep=%lld", (long long)s->keep);
}

static void criticalkv_destroy(kvb_method *m) { free(m); }

static kvb_method *criticalkv_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len) {
    (void)c;
    criticalkv *s = calloc(1, sizeof *s);
    if (!s) {
        ERR("out of memory");
        return NULL;
    }
    s->eps = 1e-4, s->first = 0.5, s->alpha = 0.2;
    const char *base = kvb_opts_get(o, "base");
    int rc = 0;
    if (base && strcmp(base, "snapkv") && strcmp(base, "adakv")) rc = ERR("criticalkv: base must be snapkv or adakv");
    s->ada = base && !strcmp(base, "adakv");
    if (!rc && (kvb_snap_opts_read(o, "criticalkv", &s->p, err, err_len) ||
                kvb_opts_double(o, "eps", &s->eps, err, err_len) < 0 ||
                kvb_opts_double(o, "first", &s->first, err, err_len) < 0 ||
                (s->ada && kvb_opts_double(o, "alpha", &s->alpha, err, err_len) < 0)))
        rc = -1;
    if (!rc && !(s->eps >= 0 && s->eps <= 1 && s->first >= 0 && s->first <= 1 && s->alpha >= 0 && s->alpha <= 1))
        rc = ERR("criticalkv: eps, first and alpha must be in [0, 1]");
    if (rc) {
        free(s);
        return NULL;
    }
    s->base.budget = *b;
    s->base.imposes_budget = 1;
    return &s->base;
}

const kvb_method_def kvb_method_criticalkv = {
    .name = "criticalkv",
    .summary = "CriticalKV: SnapKV's (or AdaKV's) choice refined by the values' output-projection norms ||W_o v||_1",
    .traits = KVB_NEEDS_BUDGET | KVB_SHARES_PREFILL,
    .obs_window = kvb_snapkv_obs_window,
    .create = criticalkv_create,
    .hooks = {.after_prefill = criticalkv_after_prefill},
    .expected_tokens = criticalkv_expected,
    .describe = criticalkv_describe,
    .destroy = criticalkv_destroy,
};
