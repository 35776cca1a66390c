/* kvzap.h — KVzap's scorer (methods/kvzap.c): a per-layer linear map or 2-layer MLP from the attention's input
 * (the layer's attn_norm output, c->xn) to one score per KV head and token, recorded during prefill. The method
 * and a shared prefill (methods/share.c, which records the scores for the kvzap cells adopting it) both use it. */
#ifndef KVB_KVZAP_H
#define KVB_KVZAP_H

#include <stddef.h>
#include <stdint.h>

#include "engine/model.h"

typedef struct kvb_kvzap kvb_kvzap;

/* The scorer named by spec on a model of cfg: a KVzap checkpoint (a directory holding model.safetensors, as
 * KVzapModel.save_pretrained writes it, or the .safetensors file), or "random" (a seeded random linear scorer: the
 * machinery on any model, not KVzap's accuracy). Its layers must match cfg (n_layer modules, n_embd inputs,
 * n_head_kv outputs). NULL + one line naming the file and the mismatch. */
kvb_kvzap *kvb_kvzap_open(const char *spec, const kvb_config *cfg, char *err, size_t err_len);
/* Score the n_q rows of c->xn (layer's attention input, positions c->pos[0..n_q)) and record them; 0, or -1. */
int kvb_kvzap_record(kvb_kvzap *z, kvb_ctx *c, int layer, int64_t n_q, char *err, size_t err_len);
/* Layer's recorded scores, [n][n_head_kv] by position; *n = positions 0..n-1 all recorded (0 when a gap). */
const float *kvb_kvzap_scores(const kvb_kvzap *z, int layer, int64_t *n);
/* Copy src's recorded scores into dst (same spec); 0, or -1. */
int kvb_kvzap_take(kvb_kvzap *dst, const kvb_kvzap *src, char *err, size_t err_len);
const char *kvb_kvzap_spec(const kvb_kvzap *z);
/* what the scorer is, as the method describes it: "mlp hidden=16", "linear" or "random" */
void kvb_kvzap_kind(const kvb_kvzap *z, char *buf, size_t cap);
void kvb_kvzap_free(kvb_kvzap *z);

#endif
