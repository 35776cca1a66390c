/* duo.c — DuoAttention (Xiao et al. 2024, "DuoAttention: Efficient Long-Context LLM Inference with Retrieval and
 * Streaming Heads", arXiv 2410.10819): only some heads retrieve from the whole context; the others attend to the
 * attention sinks and the recent tokens. Once the prompt is in, retrieval heads keep their full cache and streaming
 * heads keep `sink` first + their recent tokens; decode appends to every head without evicting (as kvpress's
 * DuoAttentionPress, which compresses the prompt only).
 *
 * The head split: the authors optimise a gate per head on synthetic passkey data (their attn_patterns); kvbench
 * ranks heads by a training-free retrieval score from `kvbench calibrate duo` (methods/calibrate.h,
 * benchmarks/calibration.c): the attention mass the question of synthetic passkey prompts puts on the pass key,
 * mean over a KV head's query heads, stored in the model's profile. A head is a KV head (its G query heads share its
 * cache). split=window instead scores each head on the prompt itself: the mass its observation window (the last
 * `window` queries, default 32) puts outside the sinks and the recent tokens, i.e. what a streaming head would lose
 * (an online variant the paper does not have; the window's attention comes down in one counted copy per layer).
 *
 * The budget decides how many heads retrieve (kvpress's head_compression_ratio is the other way round: the share of
 * streaming heads, from which it reports the compression). With H = global layers x KV heads, a prompt of n tokens,
 * B tokens per head (budget x n, or a token count) and s = sink + recent: the top R = floor(H (B - s) / (n - s))
 * heads by score retrieve (R = 0 when B <= s); the other H - R heads share what is left, H B - R n tokens, evenly
 * (the higher-scoring ones one more token each when it does not divide), each as min(sink, w) first tokens plus its
 * last w - min(sink, w). So the cache holds exactly B x H tokens and every streaming head at least s (the floor
 * leaves them s or more): heads hold different counts, as AdaKV's do, and the budget check compares each layer's
 * mean per head. Ties in the score: the lower layer, then the lower head. Defaults sink=16, recent=64: the paper's
 * 64 + 256 (1:4) for contexts of 32K-1M scaled to the few-thousand-token prompts kvbench runs on a CPU.
 *
 * Against kvpress's DuoAttentionPress (test_kvpress_kept: the default model, prose_4000): the press, which masks the
 * streaming heads' middle rather than evicting it, is fed this file's split (the profile's scores, the top R heads
 * retrieving, as head_compression_ratio = (H - R) / H) at 1126 tokens per head, where the streaming heads' share
 * divides evenly (25 of 90 heads retrieve, 65 keep 16 + 95): the same positions on every head (Jaccard 1). What the
 * comparison does not cover: the authors' gates (their patterns are for 7-8B models only, and out of reach here),
 * and the press's fixed sink_size/recent_size, which kvbench derives from the budget instead. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "methods/duo.h"
#include "methods/profile.h"

typedef struct {
    kvb_method base;
    int from_window;    /* split=window */
    int64_t window;     /* its rows */
    int64_t sink, recent;
    int n_layer, n_head_kv;
    double *score;      /* [L][HK] retrieval scores (profile, or the window's at after_prefill) */
    int64_t *keep;      /* [L][HK] tokens each head kept after prefill */
    int64_t *layer_keep; /* [L] the layer's mean per head, rounded */
    int n_retrieval, n_heads;
} duo;

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

/* split=window: per global layer, the window's attention mass outside [0, sink) and [n - recent, n), mean over the
 * KV head's query heads and the rows (host, after one counted copy of the window's probabilities per layer). */
static int window_scores(duo *s, kvb_ctx *c, int64_t n, char *err, size_t err_len) {
    kvb_backend *be = c->be;
    const kvb_config *cfg = &c->model->cfg;
    const int H = cfg->n_head, HK = cfg->n_head_kv, G = H / HK;
    const int64_t w = c->obs_n < s->window ? c->obs_n : s->window;
    if (w < 1) return ERR("duo: split=window needs the prompt's observation window (none was kept)");
    const int64_t lo = s->sink < n ? s->sink : n, hi = n - s->recent > lo ? n - s->recent : lo;
    float *host = NULL;
    int rc = 0;
    for (int l = 0; l < s->n_layer && !rc; l++) {
        if (kvb_layer_window(cfg, l)) continue;
        const float *q = c->obs_q + ((size_t)l * c->obs_cap + (size_t)(c->obs_n - w)) * cfg->q_dim;
        float *probs = NULL;
        int64_t stride = 0;
        if (kvb_attn_probs(c, l, q, c->obs_pos + (c->obs_n - w), w, NULL, &probs, &stride, NULL, err, err_len)) return -1;
        size_t bytes = (size_t)H * w * stride * sizeof(float);
        free(host);
        host = malloc(bytes);
        rc = host ? be->copy(be, host, probs, bytes, KVB_COPY_D2H, err, err_len) : ERR("out of memory");
        if (!rc && be->sync && be->sync(be)) rc = ERR("%s", be->error);
        kvb_attn_probs_free(c, probs, w, stride);
        for (int g = 0; g < HK && !rc; g++) {
            double m = 0;
            for (int h = g * G; h < (g + 1) * G; h++)
                for (int64_t t = 0; t < w; t++)
                    for (int64_t j = lo; j < hi; j++) m += host[((size_t)h * w + t) * stride + j];
            s->score[(size_t)l * HK + g] = m / ((double)G * w);
        }
    }
    free(host);
    return rc;
}

int kvb_duo_split(int n_layer, int n_head_kv, const unsigned char *global, const double *score, int64_t n, int64_t budget,
                  int64_t sink, int64_t recent, int64_t *keep) {
    int H = 0;
    for (int l = 0; l < n_layer; l++) H += global[l] ? n_head_kv : 0;
    const int64_t s0 = sink + recent;
    const int R = budget >= n ? H : s0 < budget ? (int)((int64_t)H * (budget - s0) / (n - s0)) : 0;
    /* rank the global heads by score, descending (ties: lower layer, then lower head) */
    int *rank = malloc((size_t)(H > 0 ? H : 1) * sizeof *rank);
    if (!rank) return -1;
    int k = 0;
    for (int l = 0; l < n_layer; l++)
        for (int g = 0; g < n_head_kv && global[l]; g++) rank[k++] = l * n_head_kv + g;
    for (int i = 1; i < H; i++) /* insertion sort, stable: equal scores keep index order */
        for (int j = i; j > 0 && score[rank[j - 1]] < score[rank[j]]; j--) {
            int t = rank[j];
            rank[j] = rank[j - 1];
            rank[j - 1] = t;
        }
    for (int i = 0; i < n_layer * n_head_kv; i++) keep[i] = n; /* local layers, retrieval heads */
    const int S = H - R;
    if (S > 0) {
        const int64_t left = (int64_t)H * (budget < n ? budget : n) - (int64_t)R * n, base = left / S, extra = left % S;
        for (int i = R; i < H; i++) keep[rank[i]] = base + (i - R < extra);
    }
    free(rank);
    return R;
}

static int duo_after_prefill(void *self, kvb_ctx *c, char *err, size_t err_len) {
    duo *s = self;
    kvb_backend *be = c->be;
    const kvb_config *cfg = &c->model->cfg;
    const int L = s->n_layer, HK = s->n_head_kv;
    const int64_t n = c->n_past;
    int64_t budget = 0;
    s->base.n_prompt = n;
    if (kvb_method_budget_tokens(&s->base, n, &budget, err, err_len)) return -1;
    unsigned char global[1024];
    if (L > 1024) return ERR("duo: %d layers (at most 1024)", L);
    for (int l = 0; l < L; l++) global[l] = !kvb_layer_window(cfg, l);
    if (budget < n && s->from_window && window_scores(s, c, n, err, err_len)) return -1;
    int R = kvb_duo_split(L, HK, global, s->score, n, budget, s->sink, s->recent, s->keep);
    if (R < 0) return ERR("out of memory");
    s->n_retrieval = R;
    s->n_heads = 0;
    for (int l = 0; l < L; l++) s->n_heads += global[l] ? HK : 0;
    const size_t idx_bytes = (size_t)n * sizeof(int32_t);
    int32_t *idx = budget < n ? kvb_method_alloc(c, idx_bytes) : NULL;
    int rc = budget < n && !idx ? ERR("duo: out of memory") : 0;
    for (int l = 0; l < L && !rc; l++) {
        int64_t sum = 0;
        for (int g = 0; g < HK && !rc; g++) {
            const int64_t w = s->keep[(size_t)l * HK + g], first = s->sink < w ? s->sink : w;
            sum += w;
            if (w >= n || !global[l]) continue;
            rc = be->iota(be, idx, 0, first, err, err_len) || be->iota(be, idx + first, (int32_t)(n - (w - first)), w - first, err, err_len) ||
                 kvc_retain_dev(c->kv, l, g, idx, w, err, err_len);
        }
        s->layer_keep[l] = (sum + HK / 2) / HK;
    }
    kvb_method_release(c, idx, idx_bytes);
    if (!rc && R < s->n_heads)
        snprintf(s->base.note, sizeof s->base.note, "%d of %d heads retrieve (full cache), the rest keep %lld sinks + recent",
                 R, s->n_heads, (long long)s->sink);
    return rc ? -1 : 0;
}

static int64_t duo_expected(kvb_method *m, kvb_ctx *c, int layer) {
    duo *s = (duo *)m;
    if (c->in_prefill) return c->n_past;
    return s->layer_keep[layer] + (c->n_past - m->n_prompt);
}

static void duo_describe(kvb_method *m, char *buf, size_t cap) {
    duo *s = (duo *)m;
    snprintf(buf, cap, "split=%s sink=%lld recent=%lld retrieval=%d/%d", s->from_window ? "window" : "profile",
             (long long)s->sink, (long long)s->recent, s->n_retrieval, s->n_heads);
}

static void duo_destroy(kvb_method *m) {
    duo *s = (duo *)m;
    free(s->score);
    free(s->keep);
    free(s->layer_keep);
    free(s);
}

static int read_split(kvb_opts *o, int *from_window, char *err, size_t err_len) {
    const char *v = kvb_opts_get(o, "split");
    if (v && strcmp(v, "profile") && strcmp(v, "window")) return ERR("duo: split must be profile or window");
    *from_window = v && !strcmp(v, "window");
    return 0;
}

/* The observation window it reads: `window` rows (default 32) with split=window, none otherwise. */
static int duo_obs_window(kvb_opts *o, int *rows, char *err, size_t err_len) {
    int from_window = 0;
    int64_t w = 32;
    if (read_split(o, &from_window, err, err_len)) return -1;
    *rows = 0;
    if (!from_window) return 0;
    if (kvb_opts_int(o, "window", &w, err, err_len) < 0) return -1;
    if (w < 1 || w > 4096) return ERR("duo: window must be in [1, 4096]");
    *rows = (int)w;
    return 0;
}

static const char *duo_profile(kvb_opts *o) {
    const char *v = kvb_opts_get(o, "split");
    return v && !strcmp(v, "window") ? NULL : "duo";
}

static kvb_method *duo_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len) {
    const kvb_config *cfg = &c->model->cfg;
    duo *s = calloc(1, sizeof *s);
    if (!s) { ERR("out of memory"); return NULL; }
    s->n_layer = cfg->n_layer;
    s->n_head_kv = cfg->n_head_kv;
    s->sink = 16;
    s->recent = 64;
    s->score = calloc((size_t)s->n_layer * s->n_head_kv, sizeof *s->score);
    s->keep = calloc((size_t)s->n_layer * s->n_head_kv, sizeof *s->keep);
    s->layer_keep = calloc((size_t)s->n_layer, sizeof *s->layer_keep);
    int rows = 0;
    if (!s->score || !s->keep || !s->layer_keep) { ERR("out of memory"); goto fail; }
    if (read_split(o, &s->from_window, err, err_len) || duo_obs_window(o, &rows, err, err_len) ||
        kvb_opts_int(o, "sink", &s->sink, err, err_len) < 0 || kvb_opts_int(o, "recent", &s->recent, err, err_len) < 0)
        goto fail;
    s->window = rows;
    if (s->sink < 0) { ERR("duo: sink must be >= 0"); goto fail; }
    if (s->recent < 1) { ERR("duo: recent must be >= 1"); goto fail; }
    if (!s->from_window) {
        int got = kvb_profile_duo_scores(c->model, s->score, err, err_len);
        if (got < 0) goto fail;
        if (!got) {
            ERR("duo: no retrieval-head scores for this model: run `kvbench calibrate duo --model %s` (or pass "
                "--method-opt split=window)", c->model->path);
            goto fail;
        }
    }
    s->base.budget = *b;
    s->base.imposes_budget = 1;
    return &s->base;
fail:
    duo_destroy(&s->base);
    return NULL;
}

const kvb_method_def kvb_method_duo = {
    .name = "duo",
    .summary = "retrieval heads keep the full cache, streaming heads sinks + recent; the budget sets how many retrieve",
    .traits = KVB_NEEDS_BUDGET | KVB_SHARES_PREFILL,
    .obs_window = duo_obs_window,
    .profile = duo_profile,
    .create = duo_create,
    .hooks = {.after_prefill = duo_after_prefill},
    .expected_tokens = duo_expected,
    .describe = duo_describe,
    .destroy = duo_destroy,
};
