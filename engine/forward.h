/* forward.h — the pieces of the forward pass (engine/model.c) that the batched decode step (engine/batch.c)
 * shares, so both run the same code per sequence. Engine-internal: nothing outside engine/ includes it. */
#ifndef KVB_FORWARD_H
#define KVB_FORWARD_H

#include "engine/model.h"

/* Q/K norms (qwen3, gemma3) and RoPE of n rows of q and k at device positions pos_d. */
void kvb_fwd_qk_norm_rope(const kvb_model *m, kvb_backend *be, int l, float *q, float *k, const int32_t *pos_d,
                          int64_t n);
/* k matmuls over one input (the backend's fused op when it has one). */
int kvb_fwd_matmul_n(kvb_backend *be, int k, float *const *out, const kvb_weight *const *w, const float *x, int64_t n);
/* c has room for one more token, and id is in the vocabulary. */
int kvb_fwd_check(const kvb_ctx *c, int32_t id, char *err, size_t err_len);
/* One decode token of c begins: its position and round on the device, the observation window advanced. */
int kvb_fwd_seq_begin(kvb_ctx *c, char *err, size_t err_len);
/* Layer l of that token: q, k, v (after RoPE; device rows) into the cache and through the method's hooks and the
 * attention op, whose output goes to att. */
int kvb_fwd_seq_attend(kvb_ctx *c, int l, float *q, float *k, float *v, float *att, char *err, size_t err_len);
/* c->logits holds the token's logits: refuse non-finite ones (the error names where they began), then count it. */
int kvb_fwd_seq_end(kvb_ctx *c, int32_t id, char *err, size_t err_len);

#endif
