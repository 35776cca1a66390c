/* batch.h — batched decoding: one forward step advances many contexts by one token each.
 *
 * The matmuls run once over the B token rows (the weights are read once for all sequences, which is what makes a
 * server's throughput grow with concurrency); attention runs per sequence over its own KV store, through its own
 * method's hooks and budget, exactly as kvb_forward does for one token (engine/forward.h holds the shared code).
 * Each row's arithmetic does not depend on the other rows on the CPU backend (the integer matmul's rows and its
 * four-token tiles give the same bits: kernels/cpu/matmul.c), so a sequence decodes token for token as it would
 * alone (tests/test_batch.c). The step forces the integer matmul (KVB_GEMM_INT8) even at 32 rows and more, where a
 * prefill chunk would take the f32 GEMM, for that reason. On CUDA, 5 rows and more go through cuBLAS instead of the
 * GEMV kernel that one token takes: results per sequence agree to rounding, not bit for bit. */
#ifndef KVB_BATCH_H
#define KVB_BATCH_H

#include <stdint.h>

#include "engine/model.h"

typedef struct kvb_batch kvb_batch;

/* Workspace for decode steps of up to cap sequences of model m on backend be (every context in a step must use
 * this model and this backend: create them with kvb_ctx_params.share_backend). NULL + err on failure. */
kvb_batch *kvb_batch_create(kvb_model *m, kvb_backend *be, int cap, char *err, size_t err_len);
void kvb_batch_free(kvb_batch *b);
/* Largest step the workspace takes. */
int kvb_batch_cap(const kvb_batch *b);
/* Device bytes of the workspace (activations of cap rows, the cap rows of logits). */
int64_t kvb_batch_bytes(const kvb_batch *b);
/* One decode step: token ids[i] through context cs[i] for i < n (n <= cap, each context once), each at its own
 * position n_past; afterwards cs[i]->logits holds its next-token logits, as kvb_forward(cs[i], &ids[i], 1) would
 * leave them. Arguments are checked before any context changes (a full context, a bad id, another model or
 * backend: -1 naming the sequence). A failure inside the step (a method hook, non-finite logits) names its
 * sequence; the contexts of that step are then in an unspecified state. */
int kvb_batch_decode(kvb_batch *b, kvb_ctx *const *cs, const int32_t *ids, int n, char *err, size_t err_len);

#endif
