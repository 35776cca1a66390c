/* tova.c — TOVA, Token Omission Via Attention (Oren et al. 2024, "Transformers are Multi-State RNNs"): the KV
 * cache is a bounded multi-state; once it holds its limit B, every decode step drops the state (token) whose
 * attention weight under the current query is lowest, the weight averaged over the heads (the paper's eq. for
 * the TOVA policy: argmin_j mean_h softmax(q_h K_h^T / sqrt(d))_j). Every KV head then drops the same token.
 *
 * Prefill (as kvpress's TOVAPress, which compresses once the prompt is in): the prompt's last query scores the
 * earlier prompt tokens by its attention (softmax over the whole prompt, itself included), averaged over the heads;
 * the last token is always kept (kvpress pads it with the maximum score), the top B - 1 others are kept.
 *
 * Choices (flags):
 * - per_head=0 (default, the paper): one score row, the sum over all query heads (the mean up to a constant
 *   factor: GQA groups are not separated), shared by every KV head; per_head=1: each KV head ranks by the sum over
 *   its group's query heads, so heads keep different tokens.
 * - Budget B per KV head = budget x current length, like H2O here ("30%" tracks the sequence so 100% never evicts;
 *   the paper's fixed multi-state size is a token budget, `--budget 512`).
 * - Decode candidates are every held token, the current one included (the paper's policy; kvpress only protects
 *   the last token in its prefill compression). A decode chunk of several tokens is scored by its last query.
 * - Attention is exact over what is held; eviction happens after the step's attention (the step reads B + 1). */
#include "methods/method.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct {
    kvb_method base;
    kvb_ctx *c;
    int per_head;
    float *score;     /* [n_head_kv][score_cap] one step's scores (device) */
    int64_t score_cap;
    float **rows;     /* host [n_head_kv]: the heads' rows of score, for kvc_evict_heads */
} tova;

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

static int fit_score(tova *s, int64_t n, char *err, size_t err_len) {
    if (n <= s->score_cap) return 0;
    const int HK = s->c->model->cfg.n_head_kv;
    if (!s->rows && !(s->rows = malloc((size_t)HK * sizeof *s->rows))) return ERR("tova: out of memory");
    int64_t cap = n + n / 4 + 64;
    kvb_method_release(s->c, s->score, (size_t)HK * s->score_cap * sizeof(float));
    s->score_cap = 0;
    if (!(s->score = kvb_method_alloc(s->c, (size_t)HK * cap * sizeof(float)))) return ERR("tova: out of memory");
    s->score_cap = cap;
    for (int g = 0; g < HK; g++) s->rows[g] = s->score + (size_t)g * cap;
    return 0;
}

/* Scores of the first n slots from one query row of probs ([n_head][rows][stride], row t): per KV head g into
 * s->score + g * score_cap, the sum over all heads (every g gets the same row) or over g's group (per_head). */
static int score_row(tova *s, const float *probs, int64_t stride, int64_t rows, int64_t t, int64_t n, char *err,
                     size_t err_len) {
    kvb_backend *be = s->c->be;
    const kvb_config *cfg = &s->c->model->cfg;
    /* one row t of every head: head h at probs + h * rows * stride + t * stride */
    const float *p = probs + t * stride;
    const int64_t hstride = rows * stride;
    if (s->per_head)
        return be->probs_reduce(be, s->score, s->score_cap, p, hstride, cfg->n_head, cfg->n_head_kv, 1, n, NULL,
                                KVB_REDUCE_GROUP_SUM, 0, err, err_len);
    /* one sum over every head into row 0, then copied to the other KV heads' rows, doubling the rows each copy: the
     * same sums as reducing once per KV head, which read every head's probabilities n_head_kv times (8 passes a layer
     * on the 8B shapes). Each head needs its own row: kv_evict moves its entries as it evicts. */
    if (be->probs_reduce(be, s->score, n, p, hstride, cfg->n_head, 1, 1, n, NULL, KVB_REDUCE_GROUP_SUM, 0, err, err_len))
        return -1;
    const int HK = cfg->n_head_kv;
    for (int k = 1; k < HK; k *= 2) {
        const int m = k < HK - k ? k : HK - k; /* rows 0..m-1 to k..k+m-1 (n <= score_cap: no overlap) */
        if (be->copy(be, s->score + (size_t)k * s->score_cap, s->score, ((size_t)(m - 1) * s->score_cap + n) * sizeof(float),
                     KVB_COPY_D2D, err, err_len))
            return -1;
    }
    return 0;
}

static int tova_wants(void *self, kvb_ctx *c, int layer, int64_t n_q) {
    tova *s = self;
    return !c->in_prefill && kvc_n(c->kv, layer, 0) > kvb_method_budget_at(&s->base, kvb_cur_len(c, n_q));
}

/* decode: drop the lowest-scoring tokens down to the budget (normally one) */
static int tova_observe(void *self, kvb_ctx *c, int layer, const kvb_src *src, const float *probs, int64_t stride,
                        int64_t n_q, char *err, size_t err_len) {
    tova *s = self;
    const int HK = c->model->cfg.n_head_kv;
    int64_t b = kvb_method_budget_at(&s->base, kvb_cur_len(c, n_q)), n = src[0].n;
    if (fit_score(s, n, err, err_len) || score_row(s, probs, stride, n_q, n_q - 1, n, err, err_len)) return -1;
    return kvc_evict_heads(c->kv, layer, HK, NULL, s->rows, INT32_MIN, INT32_MAX, b, NULL, err, err_len);
}

/* One layer after prefill: the last query's attention over the prompt; keep the top b - 1 earlier tokens + the last. */
static int compress_layer(tova *s, kvb_ctx *c, int l, int64_t n, int64_t b, int32_t *idx, char *err, size_t err_len) {
    kvb_backend *be = c->be;
    const float *q = c->obs_q + ((size_t)l * c->obs_cap + (size_t)(c->obs_n - 1)) * c->model->cfg.q_dim;
    float *probs = NULL;
    int64_t stride = 0;
    if (kvb_attn_probs(c, l, q, c->obs_pos + (c->obs_n - 1), 1, NULL, &probs, &stride, NULL, err, err_len)) return -1;
    int rc = score_row(s, probs, stride, 1, 0, n - 1, err, err_len);
    for (int g = 0; g < c->model->cfg.n_head_kv && !rc; g++) /* per_head=0: every head keeps head 0's list */
        rc = ((s->per_head || g == 0) &&
              (be->topk_idx(be, idx, s->score + (size_t)g * s->score_cap, n - 1, b - 1, err, err_len) ||
               be->iota(be, idx + b - 1, (int32_t)(n - 1), 1, err, err_len))) ||
             kvc_retain_dev(c->kv, l, g, idx, b, err, err_len);
    kvb_attn_probs_free(c, probs, 1, stride);
    return rc ? -1 : 0;
}

static int tova_after_prefill(void *self, kvb_ctx *c, char *err, size_t err_len) {
    tova *s = self;
    int64_t n = c->n_past, b;
    s->base.n_prompt = n;
    if (kvb_method_budget_tokens(&s->base, n, &b, err, err_len)) return -1;
    b = kvb_method_budget_at(&s->base, n);
    int from, to; /* every layer, or one (a layer-wise end of prefill: engine/model.h kvb_prefill_layers) */
    kvb_prefill_layers(c, &from, &to);
    if (b >= n || from >= to) return 0;
    if (c->obs_n < 1) return ERR("tova: no query of the prompt was kept (observation window)");
    int32_t *idx = kvb_method_alloc(c, (size_t)b * sizeof(int32_t));
    int rc = idx && !fit_score(s, n, err, err_len) ? 0 : -1;
    if (!idx) ERR("tova: out of memory");
    for (int l = from; l < to && !rc; l++) rc = kvb_layer_window(&c->model->cfg, l) ? 0 : compress_layer(s, c, l, n, b, idx, err, err_len);
    kvb_method_release(c, idx, (size_t)b * sizeof(int32_t));
    return rc;
}

static int64_t tova_expected(kvb_method *m, kvb_ctx *c, int layer) {
    (void)layer;
    return c->in_prefill ? c->n_past : kvb_method_budget_at(m, c->n_past);
}

static void tova_describe(kvb_method *m, char *buf, size_t cap) {
    tova *s = (tova *)m;
    snprintf(buf, cap, "per_head=%d keep=%lld", s->per_head, (long long)kvb_method_budget_at(&s->base, m->n_prompt));
}

static void tova_destroy(kvb_method *m) {
    tova *s = (tova *)m;
    kvb_method_release(s->c, s->score, (size_t)s->c->model->cfg.n_head_kv * s->score_cap * sizeof(float));
    free(s->rows);
    free(s);
}

/* Observation-window rows TOVA reads: the prompt's last query. */
static int tova_obs_window(kvb_opts *o, int *rows, char *err, size_t err_len) {
    (void)o; (void)err; (void)err_len;
    *rows = 1;
    return 0;
}

static kvb_method *tova_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len) {
    tova *s = calloc(1, sizeof *s);
    if (!s) { ERR("out of memory"); return NULL; }
    s->c = c;
    int64_t per_head = 0;
    if (kvb_opts_int(o, "per_head", &per_head, err, err_len) < 0) { free(s); return NULL; }
    if (per_head != 0 && per_head != 1) { ERR("tova: per_head must be 0 or 1"); free(s); return NULL; }
    s->per_head = (int)per_head;
    s->base.budget = *b;
    s->base.imposes_budget = 1;
    return &s->base;
}

const kvb_method_def kvb_method_tova = {
    .name = "tova",
    .summary = "TOVA: evicts the token the current query attends least (head mean), every step",
    .traits = KVB_NEEDS_BUDGET | KVB_SHARES_PREFILL | KVB_LAYER_LOCAL,
    .obs_window = tova_obs_window,
    .create = tova_create,
    .hooks = {.wants_probs = tova_wants, .observe = tova_observe, .after_prefill = tova_after_prefill},
    .expected_tokens = tova_expected,
    .describe = tova_describe,
    .destroy = tova_destroy,
};
