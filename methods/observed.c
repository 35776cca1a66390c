/* observed.c — ObservedAttention, as kvpress's ObservedAttentionPress scores it (related to H2O, Zhang et al. 2023,
 * "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large Language Models", arXiv 2306.14048; survey
 * in papers/002): once the prompt is in, each layer and KV head keeps the B tokens that received the most attention
 * from the prompt's own queries, averaged over the queries that could see them:
 *
 *     score_j = mean over the group's query heads r of ( sum_{i >= j} p_r[i][j] ) / (n - j)
 *
 * (p_r[i][j]: query i's attention probability on key j in head r, n the prompt length; n - j queries see key j under
 * the causal mask). It is H2O's accumulated prefill score normalised by how many queries could vote, so late tokens
 * are not penalised for having had fewer voters; no recent window, no decode eviction (decode appends).
 *
 * Choices (the press leaves them open or kvbench differs):
 * - Budget B per head = budget x prompt length rounded to nearest (kvbench's rule, kvb_budget_tokens); kvpress keeps
 *   int(n x (1 - ratio)), a floor: the kept counts differ by at most one token. Ties to the earlier token (torch's
 *   topk leaves them unspecified).
 * - The group's heads summed rather than averaged: a positive multiple, the same top-B.
 * - The probabilities are the engine's prefill attention in f32, accumulated per slot as H2O accumulates them
 *   (sum_rows during prefill: the backend's attention_colsum, the group's column sums chunk after chunk, the
 *   probabilities never written), or taken over from a shared prefill (kvb_share_scores, the same sums).
 * - No op of its own: the division by n - j is rmsnorm with host weights w, out_j = x_j w_j / rms(x), rms(x) > 0
 *   the same for every slot of the head (the scores of a head sum to n x G > 0), so the same top-B as x_j / (n - j).
 *   The weights are one constant table, T[i] = 1 / (KVB_OBS_MAX - i): the scores are copied to the end of a row of
 *   P = the next power of two >= n zero-padded slots, and the row's weights are the last P entries of T, so slot j
 *   gets 1 / (n - j). The CUDA backend caches rmsnorm weights by address: one row length per power of two keeps that
 *   cache to ~20 entries however many prompt lengths a suite has.
 * - Against kvpress's ObservedAttentionPress (test_kvpress_kept: the default model, prose_4000, 1129 tokens per head;
 *   the press on transformers' eager attention, kvbench's sums taken over from the shared prefill): Jaccard 0.9929 at
 *   least per layer and KV head, 0.9985 on average; the same definition, the engines' numerics' near-ties. */
#include "methods/method.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define KVB_OBS_MAX ((int64_t)1 << 20) /* the longest prompt scored: 1M tokens (a 4 MiB table) */
#define NORM_EPS 1e-12f                 /* under any head's mean square score (>= G^2 / 4) */

static float *INV_COUNT; /* [KVB_OBS_MAX]: 1 / (KVB_OBS_MAX - i) */
static pthread_once_t INV_ONCE = PTHREAD_ONCE_INIT;
static void inv_count_init(void) {
    INV_COUNT = malloc((size_t)KVB_OBS_MAX * sizeof *INV_COUNT);
    for (int64_t i = 0; INV_COUNT && i < KVB_OBS_MAX; i++) INV_COUNT[i] = (float)(1.0 / (double)(KVB_OBS_MAX - i));
}

typedef struct {
    kvb_method base;
    kvb_ctx *c;
    kvb_score_row *acc; /* [layer][KV head]: attention received from the prompt's queries, aligned with the slots */
    int64_t keep;       /* tokens kept per head after prefill */
} observed;

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

static kvb_score_row *acc_at(observed *s, int l, int g) { return &s->acc[(size_t)l * s->c->model->cfg.n_head_kv + g]; }

/* the prompt's queries only: their attention summed into the accumulators, the probabilities never written */
static int observed_sum_rows(void *self, kvb_ctx *c, int layer, const kvb_src *src, int64_t n_q, float **rows, char *err,
                             size_t err_len) {
    (void)n_q;
    observed *s = self;
    return c->in_prefill ? kvb_score_rows_for_sums(c, acc_at(s, layer, 0), src, rows, err, err_len) : 0;
}

static int observed_after_prefill(void *self, kvb_ctx *c, char *err, size_t err_len) {
    observed *s = self;
    kvb_backend *be = c->be;
    const kvb_config *cfg = &c->model->cfg;
    const int64_t n = c->n_past;
    s->base.n_prompt = n;
    if (kvb_method_budget_tokens(&s->base, n, &s->keep, err, err_len)) return -1;
    int from, to; /* every layer, or one (a layer-wise end of prefill: engine/model.h kvb_prefill_layers) */
    kvb_prefill_layers(c, &from, &to);
    if (s->keep >= n || from >= to) return 0;
    if (n > KVB_OBS_MAX) return ERR("observed: a prompt of %lld tokens is over %lld", (long long)n, (long long)KVB_OBS_MAX);
    pthread_once(&INV_ONCE, inv_count_init);
    if (!INV_COUNT) return ERR("out of memory");
    int64_t P = 1;
    while (P < n) P <<= 1;
    const float *w = INV_COUNT + (KVB_OBS_MAX - P); /* w[P - n + j] = 1 / (n - j) */
    const size_t row_bytes = (size_t)P * sizeof(float), idx_bytes = (size_t)s->keep * sizeof(int32_t);
    float *row = kvb_method_alloc(c, row_bytes), *norm = kvb_method_alloc(c, row_bytes); /* zeroed */
    int32_t *idx = kvb_method_alloc(c, idx_bytes);
    int rc = row && norm && idx ? 0 : ERR("observed: out of memory");
    for (int l = from; l < to && !rc; l++)
        for (int g = 0; g < cfg->n_head_kv && !rc && !kvb_layer_window(cfg, l); g++) /* a local layer keeps its window */ {
            kvb_score_row *a = acc_at(s, l, g);
            if (a->n != n) {
                rc = ERR("observed: layer %d head %d scored %lld slots of %lld", l, g, (long long)a->n, (long long)n);
                break;
            }
            rc = be->copy(be, row + (P - n), a->v, (size_t)n * sizeof(float), KVB_COPY_D2D, err, err_len);
            if (rc) break;
            be->rmsnorm(be, norm, row, w, P, 1, NORM_EPS);
            rc = be->topk_idx(be, idx, norm + (P - n), n, s->keep, err, err_len) ||
                 kvc_retain_dev(c->kv, l, g, idx, s->keep, err, err_len);
        }
    kvb_method_release(c, row, row_bytes);
    kvb_method_release(c, norm, row_bytes);
    kvb_method_release(c, idx, idx_bytes);
    return rc ? -1 : 0;
}

/* A shared prefill kept every prompt query's attention per slot (H2O's record): the same sums observe makes. */
static int observed_adopt(kvb_method *m, kvb_ctx *c, const kvb_share *share, char *err, size_t err_len) {
    observed *s = (observed *)m;
    for (int l = 0; l < c->model->cfg.n_layer; l++)
        for (int g = 0; g < c->model->cfg.n_head_kv && !kvb_layer_window(&c->model->cfg, l); g++) {
            int64_t n = 0;
            const float *src = kvb_share_scores(share, l, g, &n);
            kvb_score_row *a = acc_at(s, l, g);
            if (n != kvc_n(c->kv, l, g))
                return ERR("observed: shared prefill scored %lld slots, the cache holds %lld", (long long)n,
                           (long long)kvc_n(c->kv, l, g));
            if (kvb_score_row_fit(c, a, n, err, err_len) ||
                (n && c->be->copy(c->be, a->v, src, (size_t)n * sizeof(float), KVB_COPY_D2D, err, err_len)))
                return -1;
            a->n = n;
        }
    return 0;
}

static int64_t observed_expected(kvb_method *m, kvb_ctx *c, int layer) {
    (void)layer;
    observed *s = (observed *)m;
    return kvb_kept_then_decoded(m, c, s->keep);
}

static void observed_describe(kvb_method *m, char *buf, size_t cap) {
    snprintf(buf, cap, "keep=%lld", (long long)((observed *)m)->keep);
}

static void observed_destroy(kvb_method *m) {
    observed *s = (observed *)m;
    if (s->acc) {
        int n = s->c->model->cfg.n_layer * s->c->model->cfg.n_head_kv;
        for (int i = 0; i < n; i++) kvb_score_row_free(s->c, &s->acc[i]);
        free(s->acc);
    }
    free(s);
}

static kvb_method *observed_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len) {
    (void)o;
    observed *s = calloc(1, sizeof *s);
    if (s) s->acc = calloc((size_t)c->model->cfg.n_layer * c->model->cfg.n_head_kv, sizeof *s->acc);
    if (!s || !s->acc) {
        free(s);
        ERR("out of memory");
        return NULL;
    }
    s->c = c;
    s->base.budget = *b;
    s->base.imposes_budget = 1;
    return &s->base;
}

const kvb_method_def kvb_method_observed = {
    .name = "observed",
    .summary = "keeps the tokens the prompt's queries attended most, averaged over the queries that saw them",
    .traits = KVB_NEEDS_BUDGET | KVB_SHARES_PREFILL | KVB_PREFILL_SCORES | KVB_LAYER_LOCAL,
    .create = observed_create,
    .hooks = {.sum_rows = observed_sum_rows, .after_prefill = observed_after_prefill},
    .expected_tokens = observed_expected,
    .describe = observed_describe,
    .destroy = observed_destroy,
    .adopt = observed_adopt,
};
