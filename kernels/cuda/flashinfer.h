/* flashinfer.h — attention kernel 5 (KVB_ATTN_KERNEL=5, --cuda-kernels attn=5): FlashInfer's paged decode and FA2
 * causal prefill over kvbench's KV store, where their semantics give kvbench's answer (flashinfer_layout.h states the layout and the mask
 * rule); kvbench's own kernels everywhere else. FlashInfer's headers come from the pinned flashinfer-python wheel
 * (scripts/setup.sh); a build without them (KVB_FLASHINFER off) keeps these entry points and always falls back.
 * Called by kernels/cuda/attention.cu; host code, callable from C. */
#ifndef KVB_CUDA_FLASHINFER_H
#define KVB_CUDA_FLASHINFER_H

#include <stddef.h>

#include "kernels/cuda/attention.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when this build holds FlashInfer's kernels, else 0 */
int kvb_fi_compiled(void);
/* Device workspace bytes kvb_fi_attention needs for these shapes (0 when it would never run them). */
size_t kvb_fi_ws(const kvb_cuda_attn *a);
/* Enqueue the attention on stream through FlashInfer when the rule allows. Returns 1 when done (c->out and, when
 * asked, c->lse written; when c->probs is asked without c->lse, c->lse is pointed at workspace holding the
 * natural lse, for the probabilities' pass); 0 when not taken (the reason in err; outputs untouched: the caller
 * runs its own kernel); -1 on a CUDA or FlashInfer failure (err). May wait for the stream: without
 * c->host_heads, or with a mask to check, it reads the per-head words or the check's verdict back first. */
int kvb_fi_attention(kvb_cuda_attn *c, void *ws, size_t ws_bytes, void *stream, char *err, size_t err_len);
/* Calls FlashInfer served and calls it refused since the process began, and the last refusal's reason. */
void kvb_fi_counts(long long *served, long long *refused);
const char *kvb_fi_last_refusal(void);
/* Why kernel 5 left a call to kvbench's kernels: the KV heads are not one slab (flashinfer_layout.h: a layer of the
 * KV store's slab layout is; one allocation per head, or a head moved to the host tier, is not), a shape or dtype
 * with no instantiation (head_dim, GQA group, f32 K/V, a prefill's tile), kvbench's mask is not FlashInfer's
 * (hidden keys in a decode list, a prefill out of causal order or over index lists), or anything else (no
 * FlashInfer in the build, a workspace sized without kernel 5, an empty list). The first refusal of each reason is
 * written to stderr, once; a process that called kernel 5 writes its served and refused counts at exit. */
typedef enum { KVB_FI_NOT_SLAB, KVB_FI_SHAPE, KVB_FI_MASK, KVB_FI_OTHER, KVB_FI_WHY_COUNT } kvb_fi_why;
/* Calls refused for one reason since the process began. */
long long kvb_fi_refused_for(kvb_fi_why why);

#ifdef __cplusplus
}
#endif

#endif
