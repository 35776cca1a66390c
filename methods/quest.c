/* quest.c — Quest (Tang et al. 2024, "Quest: Query-Aware Sparsity for Efficient Long-Context LLM Inference"):
 * query-aware page selection without eviction. The KV cache is cut into pages of P tokens; each page keeps, per
 * channel e, the element-wise minimum m_e and maximum M_e of its keys (the paper's page metadata, updated as
 * decode appends tokens). At each decode step the current query q bounds every page's largest attention logit by
 * its criticality U = sum_e max(q_e m_e, q_e M_e) (paper sec. 3.2-3.3), the top-k pages within the token budget
 * are loaded, and attention is exact over their tokens only. Nothing is evicted: the full KV stays resident.
 *
 * Cost, reported honestly: device KV = 100% of the full cache + the metadata (2 float rows of head_dim per page
 * and KV head: m->extra_device_bytes, and the memory formula 1 + 2 x 4 bytes x head_dim / (P x slot bytes) on
 * the sparse layers); the budget is the tokens attended per step (the run's "tokens attended per layer"), not
 * tokens held, so it is not imposed on memory.
 *
 * Choices (flags):
 * - page=16 (the paper's). The last page (the current token's, possibly partial) is always attended, as in
 *   Quest's kernels; of the other pages the top round((B - r) / P) by U are added, r = the last page's tokens,
 *   so a step attends about B tokens; B >= the sequence: every page (exactly full attention). At a budget of
 *   100% that holds every step, so no metadata is built (device KV = exactly the full cache).
 * - Budget B = budget x current length (a fraction tracks the sequence, so 100% is full attention), or a token
 *   count; Quest's own budgets are token counts (`--budget 1024`).
 * - GQA (the paper's models are MHA): a KV head's pages are ranked by U summed over its group's query heads
 *   (group=sum, default) or by its maximum (group=max); the group attends the same pages.
 * - Metadata is float (Quest's kernels keep it in the KV dtype, fp16: half the overhead on an f16 cache).
 * - skip=2: the first two layers attend densely (the paper's setting, also its code's `layer_id < 2`).
 * - Prefill is exact (Quest applies to decode); a decode chunk of several tokens (a later round's prompt)
 *   attends densely, as Quest's code does for q_len > 1, and its tokens enter the metadata. */
#include "methods/method.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    kvb_method base;
    kvb_ctx *c;
    int64_t page;
    int skip, group_max;
    int all_pages;              /* a fraction budget of 100%: every page every step, so no metadata is kept */
    kvb_score_row *kmin, *kmax; /* [layer][KV head]: [pages][head_dim] page metadata (device) */
    int64_t *meta_n;            /* per layer: tokens the metadata covers */
    float *score;               /* [n_head_kv][page_cap] page scores (device scratch) */
    int32_t *pages;             /* [n_head_kv][page_cap] chosen pages (device scratch) */
    int32_t *idx;               /* [n_head_kv][tok_cap] chosen slots, what attention reads (device scratch) */
    int64_t page_cap, tok_cap;
} quest;

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

static size_t at(const quest *s, int l, int g) { return (size_t)l * s->c->model->cfg.n_head_kv + (size_t)g; }
static int64_t pages_of(const quest *s, int64_t n) { return (n + s->page - 1) / s->page; }

/* Bring layer l's page metadata up to n tokens: the pages from the first one holding a new token are rebuilt. */
static int update_meta(quest *s, kvb_ctx *c, int l, int64_t n, char *err, size_t err_len) {
    const int D = c->model->cfg.head_dim;
    int64_t from = s->meta_n[l], grown = pages_of(s, n) - pages_of(s, from);
    if (n <= from) return 0;
    const int HK = c->model->cfg.n_head_kv;
    float *lo_v[KVB_MAX_KV_HEADS], *hi_v[KVB_MAX_KV_HEADS];
    const void *k[KVB_MAX_KV_HEADS];
    kvb_dtype dtype = KVB_F16;
    for (int g = 0; g < HK; g++) {
        kvb_score_row *lo = &s->kmin[at(s, l, g)], *hi = &s->kmax[at(s, l, g)];
        kvc_view v = kvc_head_view(c->kv, l, g);
        if (v.n != n) return ERR("quest: layer %d head %d holds %lld tokens, head 0 %lld", l, g, (long long)v.n, (long long)n);
        if (kvb_score_row_fit(c, lo, pages_of(s, n) * D, err, err_len) ||
            kvb_score_row_fit(c, hi, pages_of(s, n) * D, err, err_len))
            return -1;
        lo->n = hi->n = pages_of(s, n) * D;
        s->base.extra_device_bytes += 2 * grown * D * (int64_t)sizeof(float);
        lo_v[g] = lo->v, hi_v[g] = hi->v, k[g] = v.k, dtype = v.dtype;
    }
    /* the layer's heads in one call (a decode step rebuilds each head's last page) */
    if (c->be->block_minmax_heads(c->be, HK, lo_v, hi_v, k, dtype, D, s->page, from, n, err, err_len)) return -1;
    s->meta_n[l] = n;
    return 0;
}

/* Room for the per-head scratch lists (no copy: they hold one step's values). */
static int fit_scratch(quest *s, kvb_ctx *c, int64_t n_pages, int64_t n_tok, char *err, size_t err_len) {
    const size_t HK = (size_t)c->model->cfg.n_head_kv;
    if (n_pages > s->page_cap) {
        kvb_method_release(c, s->score, HK * s->page_cap * sizeof(float));
        kvb_method_release(c, s->pages, HK * s->page_cap * sizeof(int32_t));
        s->page_cap = n_pages + n_pages / 4 + 16;
        s->score = kvb_method_alloc(c, HK * s->page_cap * sizeof(float));
        s->pages = kvb_method_alloc(c, HK * s->page_cap * sizeof(int32_t));
    }
    if (n_tok > s->tok_cap) {
        kvb_method_release(c, s->idx, HK * s->tok_cap * sizeof(int32_t));
        s->tok_cap = n_tok + n_tok / 4 + 256;
        s->idx = kvb_method_alloc(c, HK * s->tok_cap * sizeof(int32_t));
    }
    return s->score && s->pages && s->idx ? 0 : ERR("quest: out of memory");
}

static int quest_select(void *self, kvb_ctx *c, int layer, kvb_src *src, int64_t n_q, char *err, size_t err_len) {
    quest *s = self;
    if (c->in_prefill || layer < s->skip || s->all_pages) return 0;
    kvb_backend *be = c->be;
    const kvb_config *cfg = &c->model->cfg;
    const int G = cfg->n_head / cfg->n_head_kv, D = cfg->head_dim;
    const int64_t n = src[0].n, P = s->page;
    if (update_meta(s, c, layer, n, err, err_len)) return -1;
    if (n_q != 1) return 0;
    /* the last page (r tokens) always; m of the n_pages - 1 others, by criticality */
    int64_t n_pages = pages_of(s, n), r = n - (n_pages - 1) * P, b = kvb_method_budget_at(&s->base, kvb_cur_len(c, n_q));
    int64_t m = b > r ? (b - r + P / 2) / P : 0;
    if (m >= n_pages - 1) return 0; /* every page: full attention */
    if (fit_scratch(s, c, n_pages, m * P + r, err, err_len)) return -1;
    /* every KV head at once (a GPU takes the heads side by side: one launch each for the scores, the top m pages
     * and their slots, where a head at a time took 4 launches a head) */
    const int HK = cfg->n_head_kv;
    const float *lo_v[KVB_MAX_KV_HEADS], *hi_v[KVB_MAX_KV_HEADS];
    for (int g = 0; g < HK; g++) lo_v[g] = s->kmin[at(s, layer, g)].v, hi_v[g] = s->kmax[at(s, layer, g)].v;
    if (be->block_scores_heads(be, HK, s->score, s->page_cap, c->q, lo_v, hi_v, G, D, n_pages - 1, s->group_max, err,
                               err_len) ||
        be->topk_rows(be, s->pages, s->page_cap, s->score, s->page_cap, HK, n_pages - 1, m, err, err_len) ||
        be->block_expand_rows(be, HK, s->idx, s->tok_cap, s->pages, s->page_cap, m, n_pages - 1, P, m * P + r, err,
                              err_len))
        return -1;
    for (int g = 0; g < HK; g++) {
        src[g].idx = s->idx + (size_t)g * s->tok_cap;
        src[g].n_idx = m * P + r;
    }
    return 0;
}

static int quest_after_prefill(void *self, kvb_ctx *c, char *err, size_t err_len) {
    quest *s = self;
    int64_t n = c->n_past, b;
    s->base.n_prompt = n;
    if (kvb_method_budget_tokens(&s->base, n, &b, err, err_len)) return -1;
    for (int l = s->skip; l < c->model->cfg.n_layer && !s->all_pages; l++)
        if (!kvb_layer_window(&c->model->cfg, l) && update_meta(s, c, l, n, err, err_len)) return -1; /* local: window */
    return 0;
}

static int64_t quest_expected(kvb_method *m, kvb_ctx *c, int layer) {
    (void)m; (void)layer;
    return c->n_past; /* nothing is evicted */
}

/* Device share of the full cache: 1 + the metadata of the sparse layers' pages (verify checks it at 2%). */
static double quest_formula(kvb_method *m, kvb_ctx *c) {
    quest *s = (quest *)m;
    const kvb_config *cfg = &c->model->cfg;
    if (c->n_past <= 0 || c->in_prefill || s->all_pages) return 1.0;
    int meta_layers = 0; /* the global layers from skip on (a local layer keeps its window, no pages) */
    int64_t full_tokens = 0;
    for (int l = 0; l < cfg->n_layer; l++) {
        meta_layers += l >= s->skip && !kvb_layer_window(cfg, l);
        full_tokens += kvb_ctx_full_tokens(c, l);
    }
    double meta = (double)meta_layers * pages_of(s, c->n_past) * 2.0 * cfg->head_dim * sizeof(float);
    return 1.0 + meta / ((double)full_tokens * (double)kvc_slot_bytes(c->kv));
}

static void quest_describe(kvb_method *m, char *buf, size_t cap) {
    quest *s = (quest *)m;
    snprintf(buf, cap, "page=%lld skip=%d group=%s attend=%lld", (long long)s->page, s->skip,
             s->group_max ? "max" : "sum", (long long)kvb_method_budget_at(&s->base, m->n_prompt));
}

static void quest_destroy(kvb_method *m) {
    quest *s = (quest *)m;
    kvb_ctx *c = s->c;
    const size_t HK = (size_t)c->model->cfg.n_head_kv, nh = (size_t)c->model->cfg.n_layer * HK;
    for (size_t i = 0; s->kmin && i < nh; i++) kvb_score_row_free(c, &s->kmin[i]), kvb_score_row_free(c, &s->kmax[i]);
    kvb_method_release(c, s->score, HK * s->page_cap * sizeof(float));
    kvb_method_release(c, s->pages, HK * s->page_cap * sizeof(int32_t));
    kvb_method_release(c, s->idx, HK * s->tok_cap * sizeof(int32_t));
    free(s->kmin);
    free(s->kmax);
    free(s->meta_n);
    free(s);
}

static int read_opts(quest *s, kvb_opts *o, int n_layer, char *err, size_t err_len) {
    int64_t skip = 2;
    s->page = 16;
    if (kvb_opts_int(o, "page", &s->page, err, err_len) < 0 || kvb_opts_int(o, "skip", &skip, err, err_len) < 0)
        return -1;
    if (s->page < 1 || s->page > 4096) return ERR("quest: page must be in [1, 4096]");
    if (skip < 0 || skip > n_layer) return ERR("quest: skip must be in [0, %d] (layers)", n_layer);
    s->skip = (int)skip;
    const char *group = kvb_opts_get(o, "group");
    if (group && strcmp(group, "sum") && strcmp(group, "max")) return ERR("quest: group must be sum or max");
    s->group_max = group && !strcmp(group, "max");
    return 0;
}

static kvb_method *quest_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len) {
    const kvb_config *cfg = &c->model->cfg;
    quest *s = calloc(1, sizeof *s);
    if (!s) { ERR("out of memory"); return NULL; }
    s->c = c;
    size_t nh = (size_t)cfg->n_layer * cfg->n_head_kv;
    s->kmin = calloc(nh, sizeof *s->kmin);
    s->kmax = calloc(nh, sizeof *s->kmax);
    s->meta_n = calloc((size_t)cfg->n_layer, sizeof *s->meta_n);
    if (!s->kmin || !s->kmax || !s->meta_n) { ERR("out of memory"); quest_destroy(&s->base); return NULL; }
    if (read_opts(s, o, cfg->n_layer, err, err_len)) { quest_destroy(&s->base); return NULL; }
    s->base.budget = *b;
    s->all_pages = b->kind == KVB_BUDGET_FRACTION && b->frac >= 1.0;
    s->base.imposes_budget = 0; /* the budget is what a step attends; the whole KV stays resident */
    snprintf(s->base.note, sizeof s->base.note,
             "device KV = full + page min/max; a step attends ~budget tokens (pages of %lld; layers < %d dense)",
             (long long)s->page, s->skip);
    return &s->base;
}

const kvb_method_def kvb_method_quest = {
    .name = "quest",
    .summary = "Quest: all KV resident, each step attends the top pages by min/max key bounds",
    .traits = KVB_NEEDS_BUDGET | KVB_SHARES_PREFILL,
    .create = quest_create,
    .hooks = {.select = quest_select, .after_prefill = quest_after_prefill},
    .expected_tokens = quest_expected,
    .formula_frac = quest_formula,
    .describe = quest_describe,
    .destroy = quest_destroy,
};
