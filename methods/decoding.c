/* decoding.c — compression while decoding, as kvpress's DecodingPress does it (kvpress, NVIDIA: "DecodingPress",
 * for reasoning models whose generated answer outgrows the prompt): a scorer is applied every `interval` decoding
 * steps to the whole cache (prompt and generated tokens), cutting every layer and KV head down to `target` tokens,
 * so a long answer is compressed as it grows. Between compressions decode appends; a layer holds at most
 * target + interval tokens (the step that triggers a compression appends its token first).
 *
 * The scorers (base=): snapkv (the last `window` queries' attention, pooled, top target - window + the window:
 * SnapKV's score over the current cache, snapkv.h), knorm (lowest key L2 norm, no window: kvpress's KnormPress) and
 * keydiff (-cos(k, mean normalized key): kvpress's KeyDiffPress); each ranks the cache's slots as its method ranks a
 * prompt, with ties to the earlier slot.
 *
 * Choices (the press leaves them open or kvbench differs):
 * - The prompt: the same scorer at the run's budget once the prompt is in (kvpress's PrefillDecodingPress with one
 *   scorer for both); budget 100% leaves the prompt whole: kvpress's DecodingPress alone. Defaults are kvpress's:
 *   interval=512, target=2048.
 * - When: kvpress counts steps per layer in a forward hook, after the step's attention; here the count is of decode
 *   tokens since the last compression, and the compression runs in pre_attend (the step's token appended, before its
 *   attention), in every layer at the same step: that step attends to the compressed cache. A layer holding no more
 *   than `target` tokens is left as it is (kvpress: ratio 0).
 * - Queries for SnapKV: the engine's observation window, the last `window` query rows (post-RoPE) of the layer,
 *   decode steps included: kvpress recomputes them from its buffer of recent hidden states.
 * - Sizes: `target` tokens per KV head exactly (kvpress searches for the ratio whose int() gives target). */
#include "methods/keydiff.h"
#include "methods/snapkv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


typedef enum { BASE_SNAPKV, BASE_KNORM, BASE_KEYDIFF } base_kind;
static const char *const BASE_NAMES[] = {"snapkv", "knorm", "keydiff"};

typedef struct {
    kvb_method base;
    base_kind kind;
    kvb_snap_opts snap;
    int64_t interval, target;
    int64_t keep;      /* tokens per head kept from the prompt */
    int64_t *held;     /* [layer]: tokens per KV head after its last cut (prompt or decode) */
    int64_t *held_len; /* [layer]: the sequence length then */
    int64_t since;     /* decode tokens since the last compression */
    int64_t n_cuts;    /* decode compressions so far */
} decoding;

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)


/* Cut layer l's n slots per KV head (position order) to `keep` by the scorer. */
static int cut_layer(decoding *s, kvb_ctx *c, int l, int64_t n, int64_t keep, char *err, size_t err_len) {
    kvb_backend *be = c->be;
    const int HK = c->model->cfg.n_head_kv;
    const int64_t d = c->model->cfg.head_dim;
    if (keep >= n) return 0;
    int64_t w = s->kind == BASE_SNAPKV ? kvb_snap_window(c, &s->snap, keep) : 0;
    if (s->kind == BASE_SNAPKV && !w) return kvb_snap_keep_recent(c, l, n, keep, err, err_len);
    const int64_t n_score = n - w, k = keep - w;
    const size_t score_bytes = (size_t)HK * n * sizeof(float), idx_bytes = (size_t)keep * sizeof(int32_t);
    const size_t rows_bytes = s->kind == BASE_KEYDIFF ? (size_t)n * d * sizeof(float) : 0, vec_bytes = (size_t)d * sizeof(float);
    float *score = kvb_method_alloc(c, score_bytes), *pooled = kvb_method_alloc(c, score_bytes);
    int32_t *idx = kvb_method_alloc(c, idx_bytes);
    float *kf = rows_bytes ? kvb_method_alloc(c, rows_bytes) : NULL, *kn = rows_bytes ? kvb_method_alloc(c, rows_bytes) : NULL;
    float *a = kvb_method_alloc(c, vec_bytes), *an = kvb_method_alloc(c, vec_bytes);
    int rc = score && pooled && idx && a && an && (!rows_bytes || (kf && kn)) ? 0 : ERR("decoding: out of memory");
    if (!rc && s->kind == BASE_SNAPKV) rc = kvb_snap_score(c, l, n, w, &s->snap, score, pooled, err, err_len);
    for (int g = 0; g < HK && !rc; g++) {
        float *row = pooled + (size_t)g * n_score;
        if (s->kind == BASE_KNORM) {
            kvc_view v = kvc_head_view(c->kv, l, g);
            rc = be->row_norms(be, row, v.k, v.dtype, (int)d, n, 1, err, err_len);
        } else if (s->kind == BASE_KEYDIFF)
            rc = kvb_keydiff_scores(c, l, g, n, kf, kn, a, an, row, err, err_len);
        rc = rc || be->topk_idx(be, idx, row, n_score, k, err, err_len) ||
             (w && be->iota(be, idx + k, (int32_t)n_score, w, err, err_len)) ||
             kvc_retain_dev(c->kv, l, g, idx, keep, err, err_len);
    }
    kvb_method_release(c, score, score_bytes);
    kvb_method_release(c, pooled, score_bytes);
    kvb_method_release(c, idx, idx_bytes);
    if (rows_bytes) kvb_method_release(c, kf, rows_bytes), kvb_method_release(c, kn, rows_bytes);
    kvb_method_release(c, a, vec_bytes);
    kvb_method_release(c, an, vec_bytes);
    return rc ? -1 : 0;
}

static int decoding_after_prefill(void *self, kvb_ctx *c, char *err, size_t err_len) {
    decoding *s = self;
    const int64_t n = c->n_past;
    s->base.n_prompt = n;
    if (kvb_method_budget_tokens(&s->base, n, &s->keep, err, err_len)) return -1;
    int from, to; /* every layer, or one (a layer-wise end of prefill: engine/model.h kvb_prefill_layers) */
    kvb_prefill_layers(c, &from, &to);
    for (int l = from; l < to; l++) {
        if (kvb_layer_window(&c->model->cfg, l)) continue; /* a local layer keeps its window */
        if (cut_layer(s, c, l, n, s->keep, err, err_len)) return -1;
        s->held[l] = s->keep, s->held_len[l] = n;
    }
    s->since = 0;
    return 0;
}

static int decoding_pre_attend(void *self, kvb_ctx *c, int layer, const float *q, int64_t n_q, char *err, size_t err_len) {
    (void)q;
    decoding *s = self;
    if (c->in_prefill) return 0;
    if (layer == 0) s->since += n_q;
    if (s->since < s->interval) return 0;
    const int64_t len = kvb_cur_len(c, n_q), n = kvc_n(c->kv, layer, 0);
    const int cut = n > s->target;
    if (cut) {
        if (cut_layer(s, c, layer, n, s->target, err, err_len)) return -1;
        s->held[layer] = s->target, s->held_len[layer] = len;
    }
    if (layer == c->model->cfg.n_layer - 1) s->since = 0, s->n_cuts += cut;
    return 0;
}

/* The engine filled each head's source before pre_attend: after a cut the store has moved */
static int decoding_select(void *self, kvb_ctx *c, int layer, kvb_src *src, int64_t n_q, char *err, size_t err_len) {
    (void)self, (void)n_q, (void)err, (void)err_len;
    kvb_src_from_store(c, layer, src);
    return 0;
}

static int64_t decoding_expected(kvb_method *m, kvb_ctx *c, int layer) {
    decoding *s = (decoding *)m;
    if (c->in_prefill) return c->n_past;
    return s->held[layer] + (c->n_past - s->held_len[layer]);
}

static void decoding_describe(kvb_method *m, char *buf, size_t cap) {
    decoding *s = (decoding *)m;
    int at = snprintf(buf, cap, "base=%s interval=%lld target=%lld keep=%lld compressions=%lld", BASE_NAMES[s->kind],
                      (long long)s->interval, (long long)s->target, (long long)s->keep, (long long)s->n_cuts);
    if (s->kind == BASE_SNAPKV && at > 0 && (size_t)at < cap)
        snprintf(buf + at, cap - (size_t)at, " window=%lld kernel=%lld pool=%s", (long long)s->snap.window,
                 (long long)s->snap.kernel, s->snap.avg_pool ? "avg" : "max");
}

static void decoding_destroy(kvb_method *m) {
    decoding *s = (decoding *)m;
    free(s->held), free(s->held_len), free(s);
}

static int read_base(kvb_opts *o, base_kind *kind, char *err, size_t err_len) {
    const char *b = kvb_opts_get(o, "base");
    *kind = BASE_SNAPKV;
    if (!b) return 0;
    for (int i = 0; i < 3; i++)
        if (!strcmp(b, BASE_NAMES[i])) return *kind = (base_kind)i, 0;
    return ERR("decoding: base must be snapkv, knorm or keydiff, not '%s'", b);
}

/* The observation window: SnapKV's when it is the scorer. */
static int decoding_obs_window(kvb_opts *o, int *rows, char *err, size_t err_len) {
    base_kind kind;
    *rows = 0;
    if (read_base(o, &kind, err, err_len)) return -1;
    return kind == BASE_SNAPKV ? kvb_snapkv_obs_window(o, rows, err, err_len) : 0;
}

static kvb_method *decoding_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len) {
    decoding *s = calloc(1, sizeof *s);
    const int L = c->model->cfg.n_layer;
    if (s) s->held = calloc((size_t)L, sizeof *s->held), s->held_len = calloc((size_t)L, sizeof *s->held_len);
    if (!s || !s->held || !s->held_len) {
        if (s) decoding_destroy(&s->base);
        ERR("out of memory");
        return NULL;
    }
    s->interval = 512, s->target = 2048;
    int rc = read_base(o, &s->kind, err, err_len) || kvb_opts_int(o, "interval", &s->interval, err, err_len) < 0 ||
             kvb_opts_int(o, "target", &s->target, err, err_len) < 0 ||
             (s->kind == BASE_SNAPKV && kvb_snap_opts_read(o, "decoding", &s->snap, err, err_len));
    if (!rc && s->interval < 1) rc = ERR("decoding: interval must be >= 1");
    if (!rc && s->target < 1) rc = ERR("decoding: target must be >= 1");
    if (!rc && s->kind == BASE_KEYDIFF && c->model->cfg.head_dim > KD_MAX_DIM)
        rc = ERR("decoding: head_dim %d is over %d", c->model->cfg.head_dim, KD_MAX_DIM);
    if (rc) {
        decoding_destroy(&s->base);
        return NULL;
    }
    s->base.budget = *b;
    s->base.imposes_budget = 1;
    return &s->base;
}

const kvb_method_def kvb_method_decoding = {
    .name = "decoding",
    .summary = "a scorer (snapkv, knorm, keydiff) every `interval` decode steps down to `target` tokens (DecodingPress)",
    .traits = KVB_NEEDS_BUDGET | KVB_SHARES_PREFILL | KVB_LAYER_LOCAL | KVB_DECODE_WINDOW,
    .obs_window = decoding_obs_window,
    .create = decoding_create,
    .hooks = {.pre_attend = decoding_pre_attend, .select = decoding_select, .after_prefill = decoding_after_prefill},
    .expected_tokens = decoding_expected,
    .describe = decoding_describe,
    .destroy = decoding_destroy,
};
