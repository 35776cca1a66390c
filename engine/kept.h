/* kept.h — the positions a method kept and attended, per layer and KV head, as JSON lines (--dump-kept).
 *
 * Researchers check a KV-cache method by the tokens it keeps. A kvb_kept observer on a context records what
 * each layer's attention read on its latest decode call (the method's selection: OmniKV's and Quest's picks,
 * Round Attention's rounds), and kvb_kept_write writes, for every (layer, KV head), the positions the store holds
 * (both tiers) and those attended:
 *   {"when": "prefill", "layer": 0, "kv_head": 0, "n": 3, "positions": [0, 1, 7], "host": [], "attended": [0, 7]}
 * positions ascending; "host": the subset held in the host tier (offloaded); "attended" only once a decode call
 * has run. A sliding-window (local) layer's line adds "window": W; its kept set is its window (the method works on
 * the global layers) and its attended list the window the latest query read. Reading device-tier positions is a
 * counted device->host copy (diagnostics only). */
#ifndef KVB_KEPT_H
#define KVB_KEPT_H

#include <stdint.h>
#include <stdio.h>

#include "engine/model.h"

typedef struct kvb_kept kvb_kept;

/* Observe c's attention reads (installs c->on_visible; one observer per context). NULL on out of memory. */
kvb_kept *kvb_kept_attach(kvb_ctx *c);
/* A header line: {<fields> (caller-made JSON members, e.g. "\"method\": \"snapkv\""), "n_prompt": n, "prompt_ids":
 * [...]} (ids may be NULL: no list). 0, or -1 + err when the write failed. */
int kvb_kept_header(FILE *out, const char *fields, const int32_t *ids, int64_t n, char *err, size_t err_len);
/* Write one line per (layer, KV head) of c's current state to out, tagged `when` ("prefill", "end"). 0, or -1 + err
 * (a failed copy or write). */
int kvb_kept_write(kvb_kept *k, kvb_ctx *c, const char *when, FILE *out, char *err, size_t err_len);
/* Detach from c (when still attached) and free. NULL is a no-op. */
void kvb_kept_free(kvb_kept *k, kvb_ctx *c);

/* The positions a source lets attention read, in list order, read down from the backend: out gets
 * (src->idx ? src->n_idx : src->n) entries. 0, or -1 when a copy failed. */
int kvb_src_positions(kvb_ctx *c, const kvb_src *src, int32_t *out, int64_t *n);

#endif
