/* kvpool.h — a fixed KV pool for serving: one budget of pages that every running sequence's KV draws from, so a
 * method that keeps less lets more sequences run at once (DESIGN.md "KV store": "the device tier can draw from one
 * fixed pool shared by many sequences").
 *
 * A page is page_tokens slots (K row, V row, position, round) of one (layer, KV head), as vLLM's blocks are; a
 * sequence holds, per head, its slots rounded up to whole pages (its KV store's and its method's packed loads'),
 * plus the method's other device buffers rounded up to pages. The pool is accounting over the stores' real
 * allocations (engine/kvcache.c keeps a head's slots contiguous, which the attention ops read as one array): it
 * decides admission from what each sequence is measured to hold, and the scheduler (judge/sched.h) checks the
 * measure against the promise at every step. Host-tier heads (offload) are outside the pool. */
#ifndef KVB_KVPOOL_H
#define KVB_KVPOOL_H

#include <stdint.h>

#include "engine/model.h"

typedef struct {
    int64_t page_tokens, page_bytes, n_pages; /* the pool: n_pages of page_bytes */
    int64_t reserved;                         /* pages promised to admitted sequences */
    int64_t peak_reserved;
} kvp_pool;

/* A pool of pool_bytes (whole pages) for slots of slot_bytes (kvc_slot_bytes), page_tokens slots a page.
 * -1 + err when it cannot hold one page. */
int kvp_init(kvp_pool *p, int64_t pool_bytes, int64_t slot_bytes, int page_tokens, char *err, size_t err_len);
/* Pages full attention holds for a sequence of n tokens on a model (a sliding-window layer: its window). */
int64_t kvp_full_pages(const kvp_pool *p, const kvb_config *cfg, int64_t n_tokens);
/* Pages a sequence of an n-token prompt peaks at when its method keeps keep[l] tokens per head of global layer l at
 * the end of prefill and ends the prefill layer by layer (engine/model.h kvb_ctx_end_prefill_by_layer, one chunk):
 * every layer at its kept size (a local layer: its window; keep[l] not read) and the one global layer that adds the
 * most while it holds the whole prompt, each grown by grow_tokens. */
int64_t kvp_layerwise_pages(const kvp_pool *p, const kvb_config *cfg, int64_t n_tokens, const int64_t *keep,
                            int64_t grow_tokens);
/* Pages context c holds now in the device tier, each head's slots grown by grow_tokens first (a local layer
 * capped at its window), plus extra_bytes of the method's own device buffers. */
int64_t kvp_ctx_pages(const kvp_pool *p, const kvb_ctx *c, int64_t grow_tokens, int64_t extra_bytes);
/* Pages a method's own KV store of model shape cfg (a packed load: methods/method.h kvb_method.vis) holds in the
 * device tier, each head that holds slots grown by grow_tokens (such a head takes each decoded token's row; an empty
 * one stays empty). */
int64_t kvp_store_pages(const kvp_pool *p, const kvb_config *cfg, const kvc_store *s, int64_t grow_tokens);
/* Promise pages: 0, or 1 when the pool lacks them (nothing promised). */
int kvp_reserve(kvp_pool *p, int64_t pages);
/* Promise pages whatever the pool holds (a sequence measured above its promise: the overdraft shows in the
 * occupancy, it is never hidden). */
void kvp_force(kvp_pool *p, int64_t pages);
void kvp_release(kvp_pool *p, int64_t pages);
/* Moves a promise of *promised pages to `pages`: the difference given back, or promised; 1 when the pool lacked it
 * (promised anyway, kvp_force: an overdraft), else 0. */
int kvp_repromise(kvp_pool *p, int64_t *promised, int64_t pages);
/* Pages not promised (negative when overdrawn). */
int64_t kvp_free_pages(const kvp_pool *p);

#endif
