/* kvpool.c — page accounting of the serving pool (kvpool.h). */
#include "engine/kvpool.h"

#include <stdio.h>

#include "engine/kvcache.h"

static int64_t div_up(int64_t a, int64_t b) { return a <= 0 ? 0 : (a + b - 1) / b; }

int kvp_init(kvp_pool *p, int64_t pool_bytes, int64_t slot_bytes, int page_tokens, char *err, size_t err_len) {
    p->page_tokens = page_tokens > 0 ? page_tokens : 16;
    p->page_bytes = p->page_tokens * slot_bytes;
    p->n_pages = p->page_bytes > 0 ? pool_bytes / p->page_bytes : 0;
    p->reserved = p->peak_reserved = 0;
    if (p->n_pages < 1) {
        snprintf(err, err_len, "KV pool of %lld bytes holds no page of %lld bytes (%lld tokens of one KV head)",
                 (long long)pool_bytes, (long long)p->page_bytes, (long long)p->page_tokens);
        return -1;
    }
    return 0;
}

int64_t kvp_full_pages(const kvp_pool *p, const kvb_config *cfg, int64_t n_tokens) {
    int64_t pages = 0;
    for (int l = 0; l < cfg->n_layer; l++) pages += div_up(kvb_full_tokens_at(cfg, l, n_tokens), p->page_tokens);
    return pages * cfg->n_head_kv;
}

int64_t kvp_layerwise_pages(const kvp_pool *p, const kvb_config *cfg, int64_t n_tokens, const int64_t *keep,
                            int64_t grow_tokens) {
    int64_t pages = 0, whole = 0; /* whole: the most one global layer adds while it holds the whole prompt */
    for (int l = 0; l < cfg->n_layer; l++) {
        if (kvb_layer_window(cfg, l)) {
            pages += div_up(kvb_full_tokens_at(cfg, l, n_tokens + grow_tokens), p->page_tokens);
            continue;
        }
        const int64_t kept = keep[l] < n_tokens ? keep[l] : n_tokens;
        const int64_t at_keep = div_up(kept + grow_tokens, p->page_tokens);
        const int64_t at_full = div_up(n_tokens + grow_tokens, p->page_tokens);
        pages += at_keep;
        if (at_full - at_keep > whole) whole = at_full - at_keep;
    }
    return (pages + whole) * cfg->n_head_kv;
}

int64_t kvp_ctx_pages(const kvp_pool *p, const kvb_ctx *c, int64_t grow_tokens, int64_t extra_bytes) {
    const kvb_config *cfg = &c->model->cfg;
    int64_t pages = 0;
    for (int l = 0; l < cfg->n_layer; l++) {
        const int64_t W = kvb_layer_window(cfg, l);
        for (int h = 0; h < cfg->n_head_kv; h++) {
            kvc_view v = kvc_head_view(c->kv, l, h);
            if (v.tier != KVB_TIER_DEVICE) continue;
            int64_t n = v.n + grow_tokens;
            pages += div_up(W > 0 && n > W ? W : n, p->page_tokens);
        }
    }
    return pages + div_up(extra_bytes, p->page_bytes);
}

int64_t kvp_store_pages(const kvp_pool *p, const kvb_config *cfg, const kvc_store *s, int64_t grow_tokens) {
    int64_t pages = 0;
    for (int l = 0; l < cfg->n_layer; l++)
        for (int h = 0; h < cfg->n_head_kv; h++) {
            kvc_view v = kvc_head_view(s, l, h);
            if (v.tier == KVB_TIER_DEVICE && v.n > 0) pages += div_up(v.n + grow_tokens, p->page_tokens);
        }
    return pages;
}

int kvp_reserve(kvp_pool *p, int64_t pages) {
    if (pages > p->n_pages - p->reserved) return 1;
    kvp_force(p, pages);
    return 0;
}

void kvp_force(kvp_pool *p, int64_t pages) {
    p->reserved += pages;
    if (p->reserved > p->peak_reserved) p->peak_reserved = p->reserved;
}

void kvp_release(kvp_pool *p, int64_t pages) { p->reserved -= pages; }

int kvp_repromise(kvp_pool *p, int64_t *promised, int64_t pages) {
    const int64_t d = pages - *promised;
    *promised = pages;
    if (d <= 0) {
        kvp_release(p, -d);
        return 0;
    }
    if (!kvp_reserve(p, d)) return 0;
    kvp_force(p, d);
    return 1;
}

int64_t kvp_free_pages(const kvp_pool *p) { return p->n_pages - p->reserved; }
