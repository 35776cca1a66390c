/* lagkv.c — LagKV (Liang et al. 2025, "LagKV: Lag-Relative Information of the KV Cache Tells Which Tokens Are
 * Important", arXiv 2504.04704), as kvpress's LagKVPress scores it: without attention, a token's importance is how
 * much its key and value stand out against the *next* partition's statistics. After `sinks` tokens the prompt is cut
 * into partitions of `lag` slots; for partition p and its successor p + 1 (the reference), per channel e,
 *
 *     y_ie = (x_ie - min_{p+1,e}) / (max_{p+1,e} - min_{p+1,e}),   s_i = softmax over the partition of std_e(y_i)
 *
 * (paper eq. 2-4; std the sample standard deviation), for x = K and x = V; score_i = (s^K_i + s^V_i) / 2, replaced
 * by its rank within the partition (kvpress's argsort().argsort() / lag, without cross_scoring). The sinks and the
 * tail (the last full partition, which has no successor, and the partial one after it) score above every rank.
 * Once the prompt is in, each layer and KV head keeps its top B tokens; decode appends without evicting.
 *
 * Choices (the paper and the press leave them open, or kvbench differs):
 * - kvpress's defaults: sinks=4, lag=128, cross=0. `cross=1` is kvpress's cross_scoring: the mean softmax itself
 *   ranks across partitions, not its rank within one.
 * - A prompt shorter than sinks + 2 lag has no partition with a successor: kvpress scores the slots after the sinks
 *   by position (arange / (n - sinks)), so the sinks and the most recent tokens are kept; so here.
 * - kvpress applies the press once, to the whole prompt (its paper compresses partition by partition while
 *   prefilling); kvbench too. The keys are the cached, post-RoPE ones, as kvpress's.
 * - Ranks tie across partitions (one slot of each rank per partition): ties go to the earlier token, as everywhere in
 *   kvbench; kvpress leaves the order to torch.topk, so kept sets agree up to which partitions fill the last rank.
 *   The sinks and tail score 1e30 (kvpress: 1.0, above every rank / lag); B below them keeps the earliest.
 * - kvpress computes in the model's dtype (bf16 or f16); here the scaling and the deviations are in double, the
 *   softmax in double, stored as float. A channel with max = min in the reference divides by 0 (inf or NaN, as
 *   torch's): kvbench's top-k ranks NaN last, torch's first.
 * - How it is computed, per layer and KV head, all on the device: block_minmax over the partitions, block_scaled_std
 *   with the next partition's ranges, softmax_rows per partition, for K and V; axpby_f32 (the mean); block_ranks;
 *   fill_idx_f32 for the sinks and tail; topk_idx; kvc_retain_dev. The short prompt: two iota lists.
 * - Budget B per head = budget x prompt length rounded (kvb_budget_tokens; kvpress: int(n (1 - ratio))).
 * - Against kvpress 0.5.5 (test_kvpress_kept, default model, 3765 tokens, 1129 kept): Jaccard 0.989 at least per
 *   head, 0.993 on average; the rank ties and the engines' last bits account for the rest. */
#include <stdio.h>
#include <stdlib.h>

#include "methods/method.h"

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)
#define KEEP_SCORE 1e30f

typedef struct {
    kvb_method base;
    int64_t sinks, lag;
    int cross;
    int64_t keep; /* tokens kept per head after prefill */
} lagkv;

typedef struct {
    float *lo, *hi;       /* [partitions][d] */
    float *sk, *sv;       /* [scored] the K and V softmaxes, then their mean in sk */
    float *score;         /* [n] */
    int32_t *idx, *fixed; /* [keep] the kept slots; [sinks + tail] the sinks and the tail */
} scratch;

/* the softmaxed scaled deviations of x's scored partitions (rows from slot `sinks` on) into out */
static int partition_scores(const lagkv *s, kvb_ctx *c, const void *x, kvb_dtype dt, int64_t n_part, float *lo,
                            float *hi, float *out, char *err, size_t err_len) {
    kvb_backend *be = c->be;
    const int d = c->model->cfg.head_dim;
    const void *rows = (const char *)x + (size_t)s->sinks * (size_t)d * (dt == KVB_F16 ? 2 : 4);
    const int64_t scored = (n_part - 1) * s->lag;
    return be->block_minmax(be, lo, hi, rows, dt, d, s->lag, 0, n_part * s->lag, err, err_len) ||
           be->block_scaled_std(be, out, rows, dt, d, scored, lo + d, hi + d, s->lag, err, err_len) ||
           be->softmax_rows(be, out, s->lag, n_part - 1, s->lag, err, err_len);
}

static int lagkv_head(const lagkv *s, kvb_ctx *c, int l, int g, int64_t n, const scratch *w, char *err,
                      size_t err_len) {
    kvb_backend *be = c->be;
    const int64_t n_part = (n - s->sinks) / s->lag, end = s->sinks + n_part * s->lag, scored = (n_part - 1) * s->lag;
    const int64_t tail = n - (end - s->lag);
    const kvc_view v = kvc_head_view(c->kv, l, g); /* slots in position order after prefill */
    if (partition_scores(s, c, v.k, v.dtype, n_part, w->lo, w->hi, w->sk, err, err_len) ||
        partition_scores(s, c, v.v, v.dtype, n_part, w->lo, w->hi, w->sv, err, err_len) ||
        be->axpby_f32(be, s->cross ? w->score + s->sinks : w->sk, w->sk, 0.5, w->sv, 0.5, 0.0, scored, err, err_len))
        return -1;
    if (!s->cross && be->block_ranks(be, w->score + s->sinks, w->sk, scored, s->lag, err, err_len)) return -1;
    return be->iota(be, w->fixed, 0, (int32_t)s->sinks, err, err_len) ||
           be->iota(be, w->fixed + s->sinks, (int32_t)(end - s->lag), tail, err, err_len) ||
           be->fill_idx_f32(be, w->score, w->fixed, s->sinks + tail, KEEP_SCORE, err, err_len) ||
           be->topk_idx(be, w->idx, w->score, n, s->keep, err, err_len) ||
           kvc_retain_dev(c->kv, l, g, w->idx, s->keep, err, err_len);
}

/* a prompt without two partitions after the sinks: the first min(B, sinks) tokens and the most recent rest */
static int lagkv_short(const lagkv *s, kvb_ctx *c, int l, int g, int64_t n, int32_t *idx, char *err, size_t err_len) {
    kvb_backend *be = c->be;
    const int64_t first = s->keep < s->sinks ? s->keep : s->sinks;
    return be->iota(be, idx, 0, (int32_t)first, err, err_len) ||
           be->iota(be, idx + first, (int32_t)(n - (s->keep - first)), s->keep - first, err, err_len) ||
           kvc_retain_dev(c->kv, l, g, idx, s->keep, err, err_len);
}

static int lagkv_after_prefill(void *self, kvb_ctx *c, char *err, size_t err_len) {
    lagkv *s = self;
    const kvb_config *cfg = &c->model->cfg;
    const int64_t n = c->n_past, d = cfg->head_dim;
    s->base.n_prompt = n;
    if (kvb_method_budget_tokens(&s->base, n, &s->keep, err, err_len)) return -1;
    int from, to; /* every layer, or one (a layer-wise end of prefill: engine/model.h kvb_prefill_layers) */
    kvb_prefill_layers(c, &from, &to);
    if (s->keep >= n || from >= to) return 0;
    const int full = n >= s->sinks + 2 * s->lag;
    const int64_t n_part = full ? (n - s->sinks) / s->lag : 0;
    const size_t range_bytes = (size_t)(n_part * d) * sizeof(float), vec_bytes = (size_t)n * sizeof(float),
                 idx_bytes = (size_t)(s->keep + n + 1) * sizeof(int32_t);
    scratch w = {0};
    if (full) {
        w.lo = kvb_method_alloc(c, range_bytes), w.hi = kvb_method_alloc(c, range_bytes);
        w.sk = kvb_method_alloc(c, vec_bytes), w.sv = kvb_method_alloc(c, vec_bytes);
        w.score = kvb_method_alloc(c, vec_bytes);
    }
    w.idx = kvb_method_alloc(c, idx_bytes);
    w.fixed = w.idx ? w.idx + s->keep : NULL;
    int rc = w.idx && (!full || (w.lo && w.hi && w.sk && w.sv && w.score)) ? 0 : ERR("lagkv: out of memory");
    for (int l = from; l < to && !rc; l++)
        for (int g = 0; g < cfg->n_head_kv && !rc && !kvb_layer_window(cfg, l); g++) /* a local layer keeps its window */
            rc = full ? lagkv_head(s, c, l, g, n, &w, err, err_len) : lagkv_short(s, c, l, g, n, w.idx, err, err_len);
    if (full) {
        kvb_method_release(c, w.lo, range_bytes), kvb_method_release(c, w.hi, range_bytes);
        kvb_method_release(c, w.sk, vec_bytes), kvb_method_release(c, w.sv, vec_bytes);
        kvb_method_release(c, w.score, vec_bytes);
    }
    kvb_method_release(c, w.idx, idx_bytes);
    return rc ? -1 : 0;
}

static int64_t lagkv_expected(kvb_method *m, kvb_ctx *c, int layer) {
    (void)layer;
    lagkv *s = (lagkv *)m;
    return kvb_kept_then_decoded(m, c, s->keep);
}

static void lagkv_describe(kvb_method *m, char *buf, size_t cap) {
    const lagkv *s = (const lagkv *)m;
    snprintf(buf, cap, "sinks=%lld lag=%lld cross=%d keep=%lld", (long long)s->sinks, (long long)s->lag, s->cross,
             (long long)s->keep);
}

static void lagkv_destroy(kvb_method *m) { free(m); }

static kvb_method *lagkv_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len) {
    (void)c;
    lagkv *s = calloc(1, sizeof *s);
    if (!s) {
        ERR("out of memory");
        return NULL;
    }
    s->sinks = 4;
    s->lag = 128;
    int64_t cross = 0;
    if (kvb_opts_int(o, "sinks", &s->sinks, err, err_len) < 0 || kvb_opts_int(o, "lag", &s->lag, err, err_len) < 0 ||
        kvb_opts_int(o, "cross", &cross, err, err_len) < 0)
        goto fail;
    if (s->sinks < 0 || s->lag < 2 || (cross != 0 && cross != 1)) {
        ERR("lagkv: sinks must be >= 0, lag >= 2 and cross 0 or 1");
        goto fail;
    }
    s->cross = (int)cross;
    s->base.budget = *b;
    s->base.imposes_budget = 1;
    return &s->base;
fail:
    free(s);
    return NULL;
}

const kvb_method_def kvb_method_lagkv = {
    .name = "lagkv",
    .summary = "LagKV: keeps the tokens whose keys and values stand out against the next partition's ranges, once after prefill",
    .traits = KVB_NEEDS_BUDGET | KVB_SHARES_PREFILL | KVB_LAYER_LOCAL,
    .create = lagkv_create,
    .hooks = {.after_prefill = lagkv_after_prefill},
    .expected_tokens = lagkv_expected,
    .describe = lagkv_describe,
    .destroy = lagkv_destroy,
};
