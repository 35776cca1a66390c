/* pod.c — PoD, training-free inference (papers/001, eq. 3-4): proximal tokens over distant tokens.
 *
 * Layers are grouped into head-wise blocks of consecutive layers (Algorithm 1; with GQA the blocks are per
 * KV head, so a group's query heads share one block and its keys can really be dropped). In decode, a token
 * attends to its proximal tokens (n_s initial + n_r recent) with the layer's own scores; distant tokens use
 * the attention scores of the lowest layer of the head's block (a^D = Q_base K_base^T / sqrt(d)), computed
 * once there and shared by the block, applied to the layer's own values. The two parts merge with the gate
 * g = sum exp a^P / (sum exp a^P + sum exp a^D) (log-sum-exp weights); when g >= tau the distant part is
 * skipped (tau = 1.0: never, the default). Only the base layer keeps the distant tokens' keys: upper layers
 * keep K and V of proximal tokens and V alone of distant ones — the memory saving, measured.
 *
 * Choices (flags): blocks from the calibration profile (`kvbench calibrate pod`, JS-divergence grouping,
 * delta 0.5), or block=N for uniform blocks of N layers, else an error; sinks=16 (n_s); the proximal window is
 * the budget (n_s + n_r = budget x current length, the paper's "same window size as the baselines"; `recent=N`
 * fixes n_r; no budget: the paper's 4K proximal tokens); tau=1.0. Prefill is exact (PoD's inference saving is in decode).
 *
 * Hybrid models (Gemma 3's sliding-window local layers; docs/methods.md "Hybrid models"): a local layer keeps its
 * window and attends over it as the model does (the engine runs no hook there), so it is no block's member. The
 * blocks are formed over the global layers alone, consecutive in layer order: block=N puts N global layers in a
 * block (Gemma-3-270M's 5, 11, 17 with block=2: {5, 11} and {17}; layer 11 reads layer 5's scores across the local
 * layers between them, which hold only their windows), and the calibration's similarity is measured between global
 * layers and stored with the layers it covers. The proximal window is the budget of the cache the model holds, as
 * for the other methods: n_s + n_r = kvb_method_budget_tokens per global layer (under the windows' share: refused by
 * name). The memory formula counts the windows on both sides. A model whose every layer is local has no block:
 * refused by name. */
#include "methods/method.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "methods/profile.h"

typedef struct {
    uint8_t *v;         /* distant V rows in position order (positions n_s, n_s + 1, ...); device */
    int64_t n, cap;
} vrows;

typedef struct {
    kvb_method base;
    kvb_ctx *c;
    int *bases;         /* [n_head_kv][n_layer]: base layer of (head, layer)'s block */
    int64_t sinks, recent_opt;
    double tau;
    vrows *dist;        /* [n_layer][n_head_kv] (non-base heads) */
    size_t row_bytes;
    /* device memory: */
    float *pd;          /* shared distant probabilities: [n_layer][n_head][pd_cap] (rows of base layers) */
    float *lse_d;       /* [n_layer][n_head] */
    int64_t pd_cap, n_dist;
    float *lse_p;       /* [n_head] the proximal part's log-sum-exp (scratch) */
    float *probs;       /* [n_head][probs_cap] base heads' probabilities (scratch) */
    int64_t probs_cap;
    int64_t *counts;    /* [2]: query heads merged, skipped (pod_merge) */
    int *ev_heads;      /* host [n_head_kv]: one layer's spilling heads and their V row destinations (spill_layer) */
    void **ev_spill;
    int64_t skipped, merged; /* read back from counts */
    char blocks_desc[96];
} pod;

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

static int base_of(const pod *s, int g, int l) { return s->bases[g * s->c->model->cfg.n_layer + l]; }
/* a block's lowest layer; also every sliding-window layer, which belongs to no block and keeps its cache */
static int is_base(const pod *s, int g, int l) { return base_of(s, g, l) == l; }
static vrows *dist_at(pod *s, int l, int g) { return &s->dist[(size_t)l * s->c->model->cfg.n_head_kv + g]; }

static int64_t prox_at(pod *s, int64_t len) {
    int64_t b;
    char e[8];
    if (s->recent_opt >= 0) b = s->sinks + s->recent_opt;
    else if (s->base.budget.kind == KVB_BUDGET_NONE) b = 4096; /* the paper's 4K proximal tokens */
    else if (kvb_method_budget_tokens(&s->base, len, &b, e, sizeof e)) b = len;
    if (b < s->sinks + 1) b = s->sinks + 1;
    return b < len ? b : len;
}

/* Room for `more` distant V rows (device; grown by a quarter, the first time too: decode adds a row per step,
 * and a copy of every held row at the first step would cost more than a step's attention). */
static int vrows_reserve(pod *s, vrows *d, int64_t more, char *err, size_t err_len) {
    if (d->n + more <= d->cap) return 0;
    int64_t cap = d->cap + d->cap / 4 + 64;
    if (cap < d->n + more) cap = d->n + more + (d->n + more) / 4 + 64;
    uint8_t *v = kvb_mem_alloc(&s->c->mem, KVB_TIER_DEVICE, KVB_MEM_KV, (size_t)cap * s->row_bytes);
    if (!v) return ERR("pod: out of memory");
    if (d->n && s->c->be->copy(s->c->be, v, d->v, (size_t)d->n * s->row_bytes, KVB_COPY_D2D, err, err_len)) {
        kvb_mem_free(&s->c->mem, KVB_TIER_DEVICE, KVB_MEM_KV, v, (size_t)cap * s->row_bytes);
        return -1;
    }
    kvb_mem_free(&s->c->mem, KVB_TIER_DEVICE, KVB_MEM_KV, d->v, (size_t)d->cap * s->row_bytes);
    d->v = v;
    d->cap = cap;
    return 0;
}

/* Move the oldest non-sink tokens of every non-base head of layer l into its distant V rows until it holds
 * `prox`: the backend evicts them in position order (n_s, n_s + 1, ...) and writes their V rows after the held
 * ones, the layer's heads in one call. */
static int spill_layer(pod *s, kvb_ctx *c, int l, int64_t prox, char *err, size_t err_len) {
    int m = 0;
    int64_t rows = 0;
    for (int g = 0; g < c->model->cfg.n_head_kv; g++) {
        vrows *d = dist_at(s, l, g);
        const int64_t over = kvc_n(c->kv, l, g) - prox;
        if (is_base(s, g, l) || over <= 0) continue;
        if (vrows_reserve(s, d, over, err, err_len)) return -1;
        s->ev_heads[m] = g, s->ev_spill[m++] = d->v + (size_t)d->n * s->row_bytes;
        d->n += over, rows += over; /* the rows the eviction below writes */
    }
    if (m && kvc_evict_heads(c->kv, l, m, s->ev_heads, NULL, (int32_t)s->sinks, INT32_MAX, prox, s->ev_spill, err,
                             err_len))
        return -1;
    s->base.extra_device_bytes += rows * (int64_t)s->row_bytes; /* rows held (the allocation's slack is in kvb_mem) */
    return 0;
}

static int pod_after_prefill(void *self, kvb_ctx *c, char *err, size_t err_len) {
    pod *s = self;
    const kvb_config *cfg = &c->model->cfg;
    s->base.n_prompt = c->n_past;
    int64_t b;
    if (kvb_method_budget_tokens(&s->base, c->n_past, &b, err, err_len)) return -1;
    int64_t prox = prox_at(s, c->n_past);
    for (int l = 0; l < cfg->n_layer; l++)
        if (spill_layer(s, c, l, prox, err, err_len)) return -1;
    /* spill leaves slots unordered; that is fine: attention reads positions per slot */
    return 0;
}

static int pod_select(void *self, kvb_ctx *c, int layer, kvb_src *src, int64_t n_q, char *err, size_t err_len) {
    pod *s = self;
    if (c->in_prefill) return 0;
    if (spill_layer(s, c, layer, prox_at(s, kvb_cur_len(c, n_q)), err, err_len)) return -1;
    kvb_src_from_store(c, layer, src);
    return 0;
}

static int fit_pd(pod *s, int64_t n, char *err, size_t err_len) {
    if (n <= s->pd_cap) return 0;
    const kvb_config *cfg = &s->c->model->cfg;
    int64_t cap = n + n / 4 + 64;
    size_t old = (size_t)cfg->n_layer * cfg->n_head * s->pd_cap * sizeof(float);
    float *p = kvb_method_alloc(s->c, (size_t)cfg->n_layer * cfg->n_head * cap * sizeof(float));
    if (!p) return ERR("pod: out of memory for shared scores");
    kvb_method_release(s->c, s->pd, old);
    s->pd = p;
    s->pd_cap = cap;
    return 0;
}

static int pod_attend(void *self, kvb_ctx *c, int layer, kvb_attn_args *a, char *err, size_t err_len) {
    pod *s = self;
    if (c->in_prefill || a->n_q != 1) return 0;
    kvb_backend *be = c->be;
    const kvb_config *cfg = &c->model->cfg;
    const int HK = cfg->n_head_kv, G = cfg->n_head / HK, D = cfg->head_dim;
    int64_t len = kvb_cur_len(c, 1), n_dist = len - prox_at(s, len);
    if (n_dist < 0) n_dist = 0;
    s->n_dist = n_dist;
    if (fit_pd(s, n_dist, err, err_len)) return -1;
    unsigned char base_head[256]; /* per query head: its KV head is the base of its block here */
    int any_base = 0, has_upper = 0;
    for (int h = 0; h < cfg->n_head; h++) base_head[h] = (unsigned char)is_base(s, h / G, layer);
    for (int g = 0; g < HK; g++) {
        any_base |= is_base(s, g, layer);
        has_upper |= !is_base(s, g, layer);
    }
    int64_t stride = 0;
    for (int g = 0; g < HK; g++) stride = a->n_kv[g] > stride ? a->n_kv[g] : stride;
    int want = n_dist > 0 && any_base;
    if (want && stride > s->probs_cap) {
        kvb_method_release(c, s->probs, (size_t)cfg->n_head * s->probs_cap * sizeof(float));
        s->probs_cap = stride + stride / 4 + 64;
        s->probs = kvb_method_alloc(c, (size_t)cfg->n_head * s->probs_cap * sizeof(float));
        if (!s->probs) {
            s->probs_cap = 0;
            return ERR("pod: out of memory");
        }
    }
    a->probs = want ? s->probs : NULL;
    a->probs_stride = want ? s->probs_cap : 0;
    a->lse = s->lse_p;
    /* base heads: the layer's own probabilities over every token give the shared distant scores directly (one
     * attention pass; slot = position there) */
    int rc = be->attention(be, a, err, err_len) ||
             (want && be->pod_share(be, s->pd + (size_t)layer * cfg->n_head * s->pd_cap, s->pd_cap,
                                    s->lse_d + (size_t)layer * cfg->n_head, s->probs, s->probs_cap, s->lse_p,
                                    cfg->n_head, base_head, s->sinks, n_dist, err, err_len));
    a->lse = NULL;
    a->probs = NULL;
    if (rc) return -1;
    if (n_dist == 0 || !has_upper) return 1;
    for (int g = 0; g < HK; g++) {
        if (is_base(s, g, layer)) continue;
        int b = base_of(s, g, layer);
        const vrows *d = dist_at(s, layer, g);
        if (d->n != n_dist)
            return ERR("pod: layer %d head %d holds %lld distant rows, expected %lld", layer, g, (long long)d->n, (long long)n_dist);
        size_t hb = (size_t)b * cfg->n_head + (size_t)g * G; /* the group's rows at its base layer */
        if (be->pod_merge(be, a->out + (size_t)g * G * D, s->lse_p + (size_t)g * G, s->lse_d + hb, s->pd + hb * s->pd_cap,
                          s->pd_cap, d->v, a->kv_dtype, G, D, n_dist, s->tau, s->counts, err, err_len))
            return -1;
    }
    return 1;
}

/* Key saving from the blocks: a non-base (layer, head) holds K and V of its proximal tokens and V alone of
 * its distant ones; a base one holds everything, a sliding-window layer its window. Share of the K+V bytes of the
 * cache the model holds (the windows counted on both sides). */
static double pod_formula(kvb_method *m, kvb_ctx *c) {
    pod *s = (pod *)m;
    const kvb_config *cfg = &c->model->cfg;
    int64_t n = c->n_past, prox = prox_at(s, n), dist = n - prox > 0 ? n - prox : 0;
    double slot = (double)kvc_slot_bytes(c->kv), row = (double)s->row_bytes, have = 0, whole = 0;
    for (int l = 0; l < cfg->n_layer; l++) {
        const double held = (double)kvb_ctx_full_tokens(c, l); /* n, or a local layer's window */
        whole += cfg->n_head_kv * held * slot;
        for (int g = 0; g < cfg->n_head_kv; g++) have += is_base(s, g, l) ? held * slot : prox * slot + dist * row;
    }
    return whole > 0 ? have / whole : 1.0;
}

static void pod_describe(kvb_method *m, char *buf, size_t cap) {
    pod *s = (pod *)m;
    kvb_backend *be = s->c->be;
    int64_t counts[2];
    char err[8];
    if (!be->copy(be, counts, s->counts, sizeof counts, KVB_COPY_D2H, err, sizeof err) && !(be->sync && be->sync(be))) {
        s->merged = counts[0];
        s->skipped = counts[1];
    }
    snprintf(buf, cap, "%s sinks=%lld proximal=%lld tau=%g skipped=%lld merged=%lld", s->blocks_desc,
             (long long)s->sinks, (long long)prox_at(s, m->n_prompt), s->tau, (long long)s->skipped, (long long)s->merged);
}

static void pod_destroy(kvb_method *m) {
    pod *s = (pod *)m;
    const kvb_config *cfg = &s->c->model->cfg;
    if (s->dist)
        for (int i = 0; i < cfg->n_layer * cfg->n_head_kv; i++)
            kvb_mem_free(&s->c->mem, KVB_TIER_DEVICE, KVB_MEM_KV, s->dist[i].v, (size_t)s->dist[i].cap * s->row_bytes);
    free(s->dist);
    kvb_method_release(s->c, s->pd, (size_t)cfg->n_layer * cfg->n_head * s->pd_cap * sizeof(float));
    kvb_method_release(s->c, s->lse_d, (size_t)cfg->n_layer * cfg->n_head * sizeof(float));
    kvb_method_release(s->c, s->lse_p, (size_t)cfg->n_head * sizeof(float));
    kvb_method_release(s->c, s->probs, (size_t)cfg->n_head * s->probs_cap * sizeof(float));
    kvb_method_release(s->c, s->counts, 2 * sizeof(int64_t));
    free(s->bases);
    free(s->ev_heads);
    free(s->ev_spill);
    free(s);
}

/* The profile section PoD reads: its layer blocks, unless block= is given (registry). */
static const char *pod_profile(kvb_opts *o) { return kvb_opts_get(o, "block") ? NULL : "pod"; }

static kvb_method *pod_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len) {
    const kvb_config *cfg = &c->model->cfg;
    /* the blocks are over the global layers (the header); a local layer keeps its window */
    int gl[KVB_MAX_LAYERS], n_global = 0;
    for (int l = 0; l < cfg->n_layer; l++)
        if (!kvb_layer_window(cfg, l)) gl[n_global++] = l;
    if (!n_global) {
        ERR("pod: the model has no global layer (every layer is a sliding-window layer of window %d): no layer block "
            "to share scores in", kvb_layer_window(cfg, 0));
        return NULL;
    }
    pod *s = calloc(1, sizeof *s);
    if (!s) { ERR("out of memory"); return NULL; }
    s->c = c;
    s->sinks = 16;
    s->recent_opt = -1;
    s->tau = 1.0;
    s->row_bytes = (size_t)cfg->head_dim * (c->params.kv_dtype == KVB_F16 ? 2 : 4);
    s->bases = calloc((size_t)cfg->n_layer * cfg->n_head_kv, sizeof *s->bases);
    s->dist = calloc((size_t)cfg->n_layer * cfg->n_head_kv, sizeof *s->dist);
    s->lse_d = kvb_method_alloc(c, (size_t)cfg->n_layer * cfg->n_head * sizeof(float));
    s->lse_p = kvb_method_alloc(c, (size_t)cfg->n_head * sizeof(float));
    s->counts = kvb_method_alloc(c, 2 * sizeof(int64_t));
    s->ev_heads = malloc((size_t)cfg->n_head_kv * sizeof *s->ev_heads);
    s->ev_spill = malloc((size_t)cfg->n_head_kv * sizeof *s->ev_spill);
    if (!s->bases || !s->dist || !s->lse_d || !s->lse_p || !s->counts || !s->ev_heads || !s->ev_spill) {
        ERR("out of memory");
        goto fail;
    }
    if (cfg->n_head > 256) { ERR("pod: more than 256 query heads"); goto fail; }
    int64_t block = 0;
    int r;
    if ((r = kvb_opts_int(o, "block", &block, err, err_len)) < 0) goto fail;
    if (r) {
        if (block < 1 || block > n_global) {
            if (n_global < cfg->n_layer)
                ERR("pod: block must be in [1, %d]: it counts global layers (this model's %d sliding-window layers keep "
                    "their windows and belong to no block)", n_global, cfg->n_layer - n_global);
            else ERR("pod: block must be in [1, %d]", cfg->n_layer);
            goto fail;
        }
        for (int g = 0; g < cfg->n_head_kv; g++) {
            for (int l = 0; l < cfg->n_layer; l++) s->bases[g * cfg->n_layer + l] = l; /* local layers: their own */
            for (int i = 0; i < n_global; i++) s->bases[g * cfg->n_layer + gl[i]] = gl[i / block * block];
        }
        snprintf(s->blocks_desc, sizeof s->blocks_desc, "block=%lld", (long long)block);
    } else {
        int got = kvb_profile_pod_bases(c->model, s->bases, err, err_len);
        if (got < 0) goto fail;
        if (!got) { ERR("pod: no layer blocks for this model: run `kvbench calibrate pod` or pass --method-opt block=N"); goto fail; }
        snprintf(s->blocks_desc, sizeof s->blocks_desc, "blocks=profile");
    }
    if ((r = kvb_opts_int(o, "sinks", &s->sinks, err, err_len)) < 0) goto fail;
    if (s->sinks < 0) { ERR("pod: sinks must be >= 0"); goto fail; }
    if ((r = kvb_opts_int(o, "recent", &s->recent_opt, err, err_len)) < 0) goto fail;
    if (r && s->recent_opt < 1) { ERR("pod: recent must be >= 1"); goto fail; }
    if (kvb_opts_double(o, "tau", &s->tau, err, err_len) < 0) goto fail;
    if (!(s->tau >= 0 && s->tau <= 1)) { ERR("pod: tau must be in [0, 1]"); goto fail; }
    s->base.budget = *b;
    s->base.imposes_budget = 0;
    return &s->base;
fail:
    pod_destroy(&s->base);
    return NULL;
}

const kvb_method_def kvb_method_pod = {
    .name = "pod",
    .summary = "PoD: proximal tokens exact, distant ones share the block's base-layer scores",
    .traits = KVB_SHARES_PREFILL,
    .profile = pod_profile,
    .create = pod_create,
    .hooks = {.select = pod_select, .attend = pod_attend, .after_prefill = pod_after_prefill},
    .formula_frac = pod_formula,
    .describe = pod_describe,
    .destroy = pod_destroy,
};
