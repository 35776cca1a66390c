/* kvcache.h — the KV store: per layer, per KV head, slots of K and V rows with each
 * token's absolute position and dialogue round id, in the device or host tier.
 *
 * Methods evict (retain, evict), select (append_from) and offload (set_tier) through these calls;
 * storage is real: retain shrinks the allocation, so a method's saving shows up in the
 * byte accounting (engine/mem.h) rather than being a mask. Every byte is moved by the store's backend
 * (kernels/backend.h data ops): device-tier rows are never touched by host code, and each move between
 * tiers is a counted copy (be->traffic). Host-tier rows are host memory that host code may read.
 *
 * Two layouts of the device tier, the same rows, positions and occupied bytes under every call (test_kvcache runs in
 * both, test_kvcache_slab compares them call by call):
 *   heads: every (layer, KV head) has its own allocations, sized to what it holds (plus the growth spare);
 *   slab:  a layer's device-tier heads share one K, one V, one position and one round allocation of n_head_kv x cap
 *          slots, head h's region at h x cap slots (kvc_slab): one capacity per layer, that of its longest head
 *          under the same growth rule. FlashInfer's paged decode (attention kernel 5) addresses such a layer from
 *          one base (kernels/cuda/flashinfer_layout.h). A head moved to the host tier leaves the slab (its region
 *          stays allocated until the layer's slab is resized) and comes back into its region when moved back. */
#ifndef KVB_KVCACHE_H
#define KVB_KVCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/mem.h"
#include "kernels/backend.h" /* kvb_kv_writer */
#include "kernels/dtype.h"

typedef struct kvc_store kvc_store;

typedef enum { KVC_LAYOUT_HEADS = 0, KVC_LAYOUT_SLAB = 1 } kvc_layout;

/* One layer's slab: K rows of head h at k + h x head_stride bytes (each head's slot 0 before any kvc_drop_front), V
 * rows at v + h x head_stride, positions and rounds at pos/round + h x cap; device tier. heads: how many of the
 * layer's KV heads are in it (a host-tier head is not). */
typedef struct {
    const void *k, *v;
    const int32_t *pos, *round;
    int64_t cap;
    size_t head_stride;
    int heads;
} kvc_slab;

/* View of one (layer, KV head): rows are head_dim elements of dtype. Pointers are the tier's memory: device-tier
 * ones are for backend ops only (host code must not dereference them). */
typedef struct {
    const void *k, *v;
    const int32_t *pos, *round;
    int64_t n;
    kvb_dtype dtype;
    kvb_tier tier;
} kvc_view;

/* A store for n_layer x n_head_kv heads of head_dim, starting with room for initial_capacity tokens per head, in
 * kvc_default_layout(be). */
kvc_store *kvc_create(int n_layer, int n_head_kv, int head_dim, kvb_dtype dtype, int64_t initial_capacity,
                      kvb_backend *be, kvb_mem *mem, char *err, size_t err_len);
void kvc_free(kvc_store *kv);
/* The layout a new store takes: the slab where FlashInfer reads the cache (the CUDA backend with attention kernel 5:
 * KVB_ATTN_KERNEL=5, --cuda-kernels attn=5, so run.json's cuda_kernels and the fingerprint's attn5 record it),
 * otherwise one allocation per head. */
kvc_layout kvc_default_layout(const kvb_backend *be);
/* Change the layout of a store that holds no storage yet (tests; a caller that knows better); -1 otherwise. */
int kvc_set_layout(kvc_store *kv, kvc_layout layout, char *err, size_t err_len);
kvc_layout kvc_get_layout(const kvc_store *kv);
/* "heads" or "slab" */
const char *kvc_layout_name(kvc_layout layout);
/* Fill *out with layer's slab and return 1; 0 (and *out zeroed) when the layer has none (the heads layout, or
 * nothing allocated). */
int kvc_layer_slab(const kvc_store *kv, int layer, kvc_slab *out);
/* Deep copy (same backend and layout; same accounting tracker unless mem is given). NULL on failure. */
kvc_store *kvc_fork(const kvc_store *src, kvb_mem *mem);
/* Append n_tok tokens to every head of a layer; k, v: [n_tok][n_head_kv][head_dim] f32, pos, round: [n_tok]
 * (round may be NULL = 0), all device memory (the backend's kv_writer stores them; rows for host-tier heads are
 * written on the device and copied down, counted as a device->host move). */
int kvc_append(kvc_store *kv, int layer, int64_t n_tok, const float *k, const float *v, const int32_t *pos,
               const int32_t *round, char *err, size_t err_len);
/* Keep exactly slots idx[0..n) (host list: strictly ascending, in range) of one head, compacting and shrinking
 * storage. */
int kvc_retain(kvc_store *kv, int layer, int h, const int32_t *idx, int64_t n, char *err, size_t err_len);
/* The same with a device-tier list (made by backend ops, e.g. topk_idx): the caller guarantees it is ascending
 * and in range. */
int kvc_retain_dev(kvc_store *kv, int layer, int h, const int32_t *idx, int64_t n, char *err, size_t err_len);
/* Evict `count` slots of one head with the backend's kv_evict (lowest score, or lowest position when score is
 * NULL, among slots with lo <= pos < hi; swap-remove, so slot order is not kept: every slot carries its
 * absolute position, which is all attention needs). score: device, aligned with the slots (moved with them);
 * spill_v (device, optional): receives the victims' V rows in eviction order. Storage is kept for reuse. */
int kvc_evict(kvc_store *kv, int layer, int h, float *score, int32_t lo, int32_t hi, int64_t count, void *spill_v,
              char *err, size_t err_len);
/* kvc_evict over several heads of one layer, each down to `keep` slots (a head holding no more is left alone):
 * head heads[j] (heads NULL: head j) with score[j] and spill_v[j] (host arrays, or NULL for none). One backend
 * call for up to 32 heads, where a GPU evicts them side by side in one launch. */
int kvc_evict_heads(kvc_store *kv, int layer, int n_heads, const int *heads, float *const *score, int32_t lo,
                    int32_t hi, int64_t keep, void *const *spill_v, char *err, size_t err_len);
/* Append slots idx[0..n) (host list) of src head (sl, sh) to dst head (dl, dh) (same row size): one backend
 * gather (host->device from a host-tier head, device->host into one). count_move = count the bytes as a move
 * between the two heads' tiers in the byte accounting when they differ (a packed load or an offload write). */
/* A packed load: for every j < n_heads, append slots idx[j][0..n[j]) (host lists; NULL = slots 0..n[j]-1) of
 * src's head (layer[j], head[j]), which is in the host tier, to dst's head (layer[j], head[j]) in the device
 * tier: one backend kv_load, one counted H2D copy, the bytes counted as a move host -> device. */
int kvc_load(kvc_store *dst, const kvc_store *src, int n_heads, const int *layer, const int *head,
             const int32_t *const *idx, const int64_t *n, char *err, size_t err_len);
/* What kvc_load does before its copy, alone: room for n[j] more slots in dst's head (layer[j], head[j]) for every
 * j < n_heads, allocated (by layer on a slab store) where it is lacking. A load of the same counts then allocates
 * nothing, so a method can keep its allocations out of the timed copy (Round Attention, OmniKV: PROF_H2D is the
 * transfer that bench's loads table holds to the pinned copy rate). */
int kvc_reserve_heads(kvc_store *dst, int n_heads, const int *layer, const int *head, const int64_t *n, char *err,
                      size_t err_len);
int kvc_append_from(kvc_store *dst, int dl, int dh, const kvc_store *src, int sl, int sh, const int32_t *idx,
                    int64_t n, int count_move, char *err, size_t err_len);
/* Occupied bytes of one layer in a tier (KVB_TIER_COUNT = both). */
int64_t kvc_layer_used_bytes(const kvc_store *kv, int layer, kvb_tier tier);
/* Drop slots 0..count) of one head, keeping the others in order (a sliding-window layer forgets its oldest
 * tokens: appended in position order, they are its first slots). No copy: the storage is compacted by a later
 * append that needs room; the occupied bytes (kvc_used_bytes) drop at once. */
int kvc_drop_front(kvc_store *kv, int layer, int h, int64_t count, char *err, size_t err_len);
/* Drop slots n.. of one head. */
int kvc_truncate(kvc_store *kv, int layer, int h, int64_t n, char *err, size_t err_len);
/* Empty every head (storage released). */
void kvc_clear(kvc_store *kv);
/* Copy slots idx[0..n) (host list) of one head into caller host buffers (k_out/v_out: n rows of dtype; pos_out
 * may be NULL): a counted device->host read for a device-tier head (tests and diagnostics). */
int kvc_gather(kvc_store *kv, int layer, int h, const int32_t *idx, int64_t n, void *k_out, void *v_out,
               int32_t *pos_out, char *err, size_t err_len);
/* Move one head's / a whole layer's storage to a tier (bytes and moves counted). */
int kvc_set_tier(kvc_store *kv, int layer, int h, kvb_tier tier, char *err, size_t err_len);
int kvc_set_layer_tier(kvc_store *kv, int layer, kvb_tier tier, char *err, size_t err_len);
/* View of one head (valid until the next call that changes that head; in the slab layout, any head of its layer:
 * the layer's slab may be reallocated). */
kvc_view kvc_head_view(const kvc_store *kv, int layer, int h);
/* Tokens held by one head. */
int64_t kvc_n(const kvc_store *kv, int layer, int h);
/* Bytes allocated in a tier (all heads; KVB_TIER_COUNT = both tiers): a slab counts whole, n_head_kv x cap slots,
 * whatever its heads hold. */
int64_t kvc_bytes(const kvc_store *kv, kvb_tier tier);
/* Bytes of occupied slots in a tier (KVB_TIER_COUNT = both tiers). */
int64_t kvc_used_bytes(const kvc_store *kv, kvb_tier tier);
/* Bytes per slot (K row + V row + position + round). */
int64_t kvc_slot_bytes(const kvc_store *kv);
/* Bytes of K+V rows a full cache of n_tokens would hold (2 x layers x heads x head_dim x element size x n). */
int64_t kvc_full_bytes_for(const kvc_store *kv, int64_t n_tokens);

#endif
