/* keydiff.c — KeyDiff (Park et al. 2025, "KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM
 * Inference", arXiv 2504.15364), as kvpress's KeyDiffPress scores it: keys that look like the average key are
 * redundant, so once the prompt is in, each layer and KV head keeps the B tokens whose (post-RoPE, as cached) keys
 * are least similar to the anchor a = mean_j k_j / ||k_j||, score_j = -cos(k_j, a), and evicts the rest. Like
 * Knorm the score is query-independent: no attention is computed. Decode appends without evicting.
 *
 * Choices:
 * - kvpress's single-shot press over the whole prompt (the paper evicts block by block while prefilling; kvpress
 *   gets that by wrapping the press in its BlockPress): no recent window, every layer compressed, the anchor over
 *   all prompt keys of the head.
 * - Budget B per head = budget x prompt length (or a token count); ties to the earlier token.
 * - No op of its own: the score is composed from the backend's existing ops, per head: block_minmax with one-row
 *   blocks (the stored K rows as f32), rmsnorm with unit weights (each row / its RMS = sqrt(d) k / ||k||),
 *   probs_reduce's column sum (d^(1/2) x the anchor x n), rmsnorm with weights -1 (the anchor, normalized and
 *   negated), block_scores with kmin = kmax = the normalized keys (their dot with it): score_j = -d cos(k_j, a),
 *   a positive multiple of kvpress's, so the same top-k. A zero key scores 0, as with F.normalize's epsilon.
 * - Against kvpress's KeyDiffPress (test_kvpress_kept: the default model, prose_4000, 1129 tokens per head; the same
 *   definition): Jaccard 0.9947 at least per layer and KV head, 0.9986 on average, the engines' numerics' near-ties. */
#include "methods/keydiff.h"

#include <stdio.h>
#include <stdlib.h>

/* rmsnorm's weights are host vectors; constant ones keep the CUDA backend's cache of them (by address) at two */
#define R4(x) x, x, x, x
#define R16(x) R4(x), R4(x), R4(x), R4(x)
#define R64(x) R16(x), R16(x), R16(x), R16(x)
#define R512(x) R64(x), R64(x), R64(x), R64(x), R64(x), R64(x), R64(x), R64(x)
static const float ONES[KD_MAX_DIM] = {R512(1.0f)}, MINUS_ONES[KD_MAX_DIM] = {R512(-1.0f)};
#define NORM_EPS 1e-12f /* under every key's mean square but a zero key's */

typedef struct {
    kvb_method base;
    int64_t keep; /* tokens kept per head after prefill */
} keydiff;

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

int kvb_keydiff_scores(kvb_ctx *c, int l, int g, int64_t n, float *kf, float *kn, float *a, float *an, float *score,
                       char *err, size_t err_len) {
    kvb_backend *be = c->be;
    const int d = c->model->cfg.head_dim;
    kvc_view v = kvc_head_view(c->kv, l, g); /* slots in position order after prefill */
    if (be->block_minmax(be, kf, kn, v.k, v.dtype, d, 1, 0, n, err, err_len)) return -1;
    be->rmsnorm(be, kn, kf, ONES, d, n, NORM_EPS);
    if (be->probs_reduce(be, a, d, kn, d, 1, 1, n, d, NULL, KVB_REDUCE_GROUP_SUM, 0, err, err_len)) return -1;
    be->rmsnorm(be, an, a, MINUS_ONES, d, 1, NORM_EPS);
    return be->block_scores(be, score, an, kn, kn, 1, d, n, 0, err, err_len);
}

static int keydiff_after_prefill(void *self, kvb_ctx *c, char *err, size_t err_len) {
    keydiff *s = self;
    kvb_backend *be = c->be;
    const kvb_config *cfg = &c->model->cfg;
    const int64_t n = c->n_past, d = cfg->head_dim;
    s->base.n_prompt = n;
    if (kvb_method_budget_tokens(&s->base, n, &s->keep, err, err_len)) return -1;
    int from, to; /* every layer, or one (a layer-wise end of prefill: engine/model.h kvb_prefill_layers) */
    kvb_prefill_layers(c, &from, &to);
    if (s->keep >= n || from >= to) return 0;
    const size_t rows_bytes = (size_t)n * d * sizeof(float), vec_bytes = (size_t)d * sizeof(float),
                 score_bytes = (size_t)n * sizeof(float), idx_bytes = (size_t)s->keep * sizeof(int32_t);
    float *kf = kvb_method_alloc(c, rows_bytes), *kn = kvb_method_alloc(c, rows_bytes);
    float *a = kvb_method_alloc(c, vec_bytes), *an = kvb_method_alloc(c, vec_bytes);
    float *score = kvb_method_alloc(c, score_bytes);
    int32_t *idx = kvb_method_alloc(c, idx_bytes);
    int rc = kf && kn && a && an && score && idx ? 0 : ERR("keydiff: out of memory");
    for (int l = from; l < to && !rc; l++)
        for (int g = 0; g < cfg->n_head_kv && !rc && !kvb_layer_window(cfg, l); g++) /* a local layer keeps its window */
            rc = kvb_keydiff_scores(c, l, g, n, kf, kn, a, an, score, err, err_len) ||
                 be->topk_idx(be, idx, score, n, s->keep, err, err_len) ||
                 kvc_retain_dev(c->kv, l, g, idx, s->keep, err, err_len);
    kvb_method_release(c, kf, rows_bytes);
    kvb_method_release(c, kn, rows_bytes);
    kvb_method_release(c, a, vec_bytes);
    kvb_method_release(c, an, vec_bytes);
    kvb_method_release(c, score, score_bytes);
    kvb_method_release(c, idx, idx_bytes);
    return rc ? -1 : 0;
}

static int64_t keydiff_expected(kvb_method *m, kvb_ctx *c, int layer) {
    (void)layer;
    keydiff *s = (keydiff *)m;
    return kvb_kept_then_decoded(m, c, s->keep);
}

static void keydiff_describe(kvb_method *m, char *buf, size_t cap) {
    snprintf(buf, cap, "keep=%lld", (long long)((keydiff *)m)->keep);
}

static void keydiff_destroy(kvb_method *m) { free(m); }

static kvb_method *keydiff_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len) {
    (void)o;
    if (c->model->cfg.head_dim > KD_MAX_DIM) {
        ERR("keydiff: head_dim %d is over %d", c->model->cfg.head_dim, KD_MAX_DIM);
        return NULL;
    }
    keydiff *s = calloc(1, sizeof *s);
    if (!s) {
        ERR("out of memory");
        return NULL;
    }
    s->base.budget = *b;
    s->base.imposes_budget = 1;
    return &s->base;
}

const kvb_method_def kvb_method_keydiff = {
    .name = "keydiff",
    .summary = "keeps the tokens whose keys are least like the mean key (cosine), once after prefill",
    .traits = KVB_NEEDS_BUDGET | KVB_SHARES_PREFILL | KVB_LAYER_LOCAL,
    .create = keydiff_create,
    .hooks = {.after_prefill = keydiff_after_prefill},
    .expected_tokens = keydiff_expected,
    .describe = keydiff_describe,
    .destroy = keydiff_destroy,
};
