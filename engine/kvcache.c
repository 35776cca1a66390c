#include "engine/kvcache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef KVB_HAVE_CUDA
#include "kernels/cuda/attention.h" /* kvb_cuda_attention_kernel: the slab is FlashInfer's (kernel 5) layout */
#endif

typedef struct {
    uint8_t *k, *v;
    int32_t *pos, *round;
    int64_t n, cap;
    int64_t off;     /* dropped slots before k..round (kvc_drop_front): the allocation starts off slots earlier */
    kvb_tier tier;
    kvb_mem_cat cat; /* KVB_MEM_KV; the append staging rows are workspace */
    int in_slab;     /* the storage is this head's region of its layer's slab (cap = the slab's; nothing to free) */
} kv_head;

/* One layer's device tier under KVC_LAYOUT_SLAB: four allocations of n_head_kv x cap slots, head h's region at
 * h x cap slots in each (kvcache.h: kvc_slab). */
typedef struct {
    uint8_t *k, *v;
    int32_t *pos, *round;
    int64_t cap; /* slots per head; 0 = nothing allocated */
} kv_slab;

struct kvc_store {
    int n_layer, n_head_kv, head_dim;
    kvb_dtype dtype;
    size_t row_bytes;
    int64_t initial_capacity;
    kvb_backend *be;
    kvb_mem *mem;
    kvc_layout layout;
    kv_head *heads;   /* [n_layer][n_head_kv] */
    kv_slab *slabs;   /* [n_layer] (all empty under KVC_LAYOUT_HEADS) */
    kv_head tmp;      /* device workspace a slab head's retain gathers into before it is copied back in place */
    int32_t *idx;     /* device copy of a host index list (retain) */
    int64_t idx_cap;
};

#define ERR(...) (snprintf(err, err_len, __VA_ARGS__), -1)

static kv_head *head_at(const kvc_store *kv, int layer, int h) { return &kv->heads[(size_t)layer * kv->n_head_kv + h]; }

static kvb_kv_head ops_head(const kv_head *hd) { return (kvb_kv_head){hd->k, hd->v, hd->pos, hd->round}; }

static int check_head(const kvc_store *kv, int layer, int h, char *err, size_t err_len) {
    if (layer < 0 || layer >= kv->n_layer || h < 0 || h >= kv->n_head_kv)
        return ERR("kv store: no head (%d, %d) in a store of %d layers x %d heads", layer, h, kv->n_layer, kv->n_head_kv);
    return 0;
}

static void release(kvc_store *kv, kv_head *hd) {
    if (hd->in_slab) { /* the layer's slab owns the memory (slab_resize frees it) */
        hd->k = hd->v = NULL;
        hd->pos = hd->round = NULL;
        hd->cap = hd->off = 0;
        return;
    }
    if (!hd->cap) return;
    size_t rb = kv->row_bytes, c = (size_t)hd->cap, o = (size_t)hd->off;
    kvb_mem_free(kv->mem, hd->tier, hd->cat, hd->k - o * rb, c * rb);
    kvb_mem_free(kv->mem, hd->tier, hd->cat, hd->v - o * rb, c * rb);
    kvb_mem_free(kv->mem, hd->tier, hd->cat, hd->pos - o, c * sizeof(int32_t));
    kvb_mem_free(kv->mem, hd->tier, hd->cat, hd->round - o, c * sizeof(int32_t));
    hd->k = hd->v = NULL;
    hd->pos = hd->round = NULL;
    hd->cap = hd->off = 0;
}

/* Host code is about to read or write host-tier rows: on a GPU backend the device's KV writer may still be
 * writing them in place, and a kv_load may still be reading them (both are queued on the backend's stream), so
 * wait for the queued work first. The CPU backend has no sync (its ops are done when they return). */
static int host_tier_wait(kvc_store *kv, char *err, size_t err_len) {
    return kv->be->sync && kv->be->sync(kv->be) ? ERR("%s", kv->be->error) : 0;
}

/* Copy the first n slots between two heads' arrays: a backend copy in the direction the tiers give (host to
 * host is plain memory). Tier-crossing copies are counted by the backend. */
static int copy_slots(kvc_store *kv, const kv_head *dst, kvb_tier to, const kv_head *src, kvb_tier from, int64_t n,
                      char *err, size_t err_len) {
    const size_t rb = kv->row_bytes, ib = sizeof(int32_t);
    void *d[4] = {dst->k, dst->v, dst->pos, dst->round};
    const void *s[4] = {src->k, src->v, src->pos, src->round};
    const size_t bytes[4] = {(size_t)n * rb, (size_t)n * rb, (size_t)n * ib, (size_t)n * ib};
    if (from == KVB_TIER_HOST && to == KVB_TIER_HOST && n > 0 && host_tier_wait(kv, err, err_len)) return -1;
    for (int i = 0; i < 4 && n > 0; i++) {
        if (from == KVB_TIER_HOST && to == KVB_TIER_HOST) {
            memcpy(d[i], s[i], bytes[i]);
            continue;
        }
        kvb_copy_dir dir = from == KVB_TIER_HOST ? KVB_COPY_H2D : to == KVB_TIER_HOST ? KVB_COPY_D2H : KVB_COPY_D2D;
        if (kv->be->copy(kv->be, d[i], s[i], bytes[i], dir, err, err_len)) return -1;
    }
    return 0;
}

/* Reallocate a head to exactly cap slots in tier (cap >= n), keeping its slots. */
static int resize(kvc_store *kv, kv_head *hd, int64_t cap, kvb_tier tier, char *err, size_t err_len) {
    if (cap == 0) {
        release(kv, hd);
        hd->tier = tier;
        return 0;
    }
    size_t rb = kv->row_bytes, c = (size_t)cap;
    kv_head nh = {0};
    nh.cat = hd->cat;
    nh.k = kvb_mem_alloc(kv->mem, tier, nh.cat, c * rb);
    nh.v = kvb_mem_alloc(kv->mem, tier, nh.cat, c * rb);
    nh.pos = kvb_mem_alloc(kv->mem, tier, nh.cat, c * sizeof(int32_t));
    nh.round = kvb_mem_alloc(kv->mem, tier, nh.cat, c * sizeof(int32_t));
    nh.n = hd->n;
    nh.cap = cap;
    nh.tier = tier;
    if (!nh.k || !nh.v || !nh.pos || !nh.round) {
        nh.cap = cap;
        release(kv, &nh); /* (kvb_mem_free skips the NULL ones) */
        return ERR("kv store: out of memory for %lld slots", (long long)cap);
    }
    if (copy_slots(kv, &nh, tier, hd, hd->tier, hd->n, err, err_len)) {
        release(kv, &nh);
        return -1;
    }
    release(kv, hd);
    *hd = nh;
    return 0;
}

/* The storage for n slots that decode will append to: a quarter spare (and 16), the store's one growth rule. */
static int64_t with_spare(int64_t n) { return n + n / 4 + 16; }

/* ---- the slab layout (kvcache.h: kvc_slab): a layer's device-tier heads share four allocations ---- */

static int layer_of(const kvc_store *kv, const kv_head *hd) { return (int)((hd - kv->heads) / kv->n_head_kv); }
static int head_of(const kvc_store *kv, const kv_head *hd) { return (int)((hd - kv->heads) % kv->n_head_kv); }

/* Point a slab head at its region of the layer's slab, off slots in. */
static void slab_bind(kvc_store *kv, int l, int h) {
    const kv_slab *s = &kv->slabs[l];
    kv_head *hd = head_at(kv, l, h);
    const size_t rb = kv->row_bytes, at = (size_t)h * (size_t)s->cap + (size_t)hd->off;
    hd->cap = s->cap;
    if (!s->cap) {
        hd->k = hd->v = NULL;
        hd->pos = hd->round = NULL;
        hd->off = 0;
        return;
    }
    hd->k = s->k + at * rb;
    hd->v = s->v + at * rb;
    hd->pos = s->pos + at;
    hd->round = s->round + at;
}

static void slab_free(kvc_store *kv, kv_slab *s) {
    const size_t slots = (size_t)kv->n_head_kv * (size_t)s->cap;
    kvb_mem_free(kv->mem, KVB_TIER_DEVICE, KVB_MEM_KV, s->k, slots * kv->row_bytes);
    kvb_mem_free(kv->mem, KVB_TIER_DEVICE, KVB_MEM_KV, s->v, slots * kv->row_bytes);
    kvb_mem_free(kv->mem, KVB_TIER_DEVICE, KVB_MEM_KV, s->pos, slots * sizeof(int32_t));
    kvb_mem_free(kv->mem, KVB_TIER_DEVICE, KVB_MEM_KV, s->round, slots * sizeof(int32_t));
    *s = (kv_slab){0};
}

/* Reallocate layer l's slab to cap slots a head (>= every slab head's n; 0 = free it), each slab head's slots
 * moved to the start of its region (a device-to-device copy, uncounted like a per-head reallocation's). */
static int slab_resize(kvc_store *kv, int l, int64_t cap, char *err, size_t err_len) {
    kv_slab ns = {0};
    if (cap > 0) {
        const size_t slots = (size_t)kv->n_head_kv * (size_t)cap;
        ns.k = kvb_mem_alloc(kv->mem, KVB_TIER_DEVICE, KVB_MEM_KV, slots * kv->row_bytes);
        ns.v = kvb_mem_alloc(kv->mem, KVB_TIER_DEVICE, KVB_MEM_KV, slots * kv->row_bytes);
        ns.pos = kvb_mem_alloc(kv->mem, KVB_TIER_DEVICE, KVB_MEM_KV, slots * sizeof(int32_t));
        ns.round = kvb_mem_alloc(kv->mem, KVB_TIER_DEVICE, KVB_MEM_KV, slots * sizeof(int32_t));
        ns.cap = cap;
        if (!ns.k || !ns.v || !ns.pos || !ns.round) {
            slab_free(kv, &ns); /* (kvb_mem_free skips the NULL ones) */
            return ERR("kv store: out of memory for a slab of %d heads x %lld slots", kv->n_head_kv, (long long)cap);
        }
        for (int h = 0; h < kv->n_head_kv; h++) {
            const kv_head *hd = head_at(kv, l, h);
            if (!hd->in_slab || !hd->n) continue;
            const size_t at = (size_t)h * (size_t)cap;
            kv_head dst = {0};
            dst.k = ns.k + at * kv->row_bytes, dst.v = ns.v + at * kv->row_bytes, dst.pos = ns.pos + at;
            dst.round = ns.round + at;
            if (copy_slots(kv, &dst, KVB_TIER_DEVICE, hd, KVB_TIER_DEVICE, hd->n, err, err_len)) {
                slab_free(kv, &ns);
                return -1;
            }
        }
    }
    slab_free(kv, &kv->slabs[l]);
    kv->slabs[l] = ns;
    for (int h = 0; h < kv->n_head_kv; h++)
        if (head_at(kv, l, h)->in_slab) head_at(kv, l, h)->off = 0, slab_bind(kv, l, h);
    return 0;
}

/* The longest slab head of a layer (plus add[h] slots where add is given), and whether one has dropped slots. */
static int64_t slab_longest(const kvc_store *kv, int l, const int64_t *add, int *dropped) {
    int64_t most = 0;
    for (int h = 0; h < kv->n_head_kv; h++) {
        const kv_head *hd = head_at(kv, l, h);
        if (!hd->in_slab) continue;
        const int64_t n = hd->n + (add ? add[h] : 0);
        if (n > most) most = n;
        if (dropped && hd->off > 0) *dropped = 1;
    }
    return most;
}

/* Room in layer l's slab for add[h] more slots after each slab head's n: the store's growth rule (reserve) applied
 * to the layer, whose one capacity is its longest head's: grow by a quarter, or compact (a head has dropped
 * slots at its front) into a quarter more than the longest head will hold. */
static int slab_reserve(kvc_store *kv, int l, const int64_t *add, char *err, size_t err_len) {
    const kv_slab *s = &kv->slabs[l];
    int fits = 1, dropped = 0;
    for (int h = 0; h < kv->n_head_kv; h++) {
        const kv_head *hd = head_at(kv, l, h);
        if (hd->in_slab && hd->off + hd->n + add[h] > s->cap) fits = 0;
    }
    if (fits) return 0;
    const int64_t most = slab_longest(kv, l, add, &dropped);
    int64_t cap = s->cap ? with_spare(s->cap) : (kv->initial_capacity > 0 ? kv->initial_capacity : 16);
    if (dropped) {
        const int64_t need = with_spare(most);
        cap = s->cap > need ? s->cap : need;
    }
    if (cap < most) cap = most;
    return slab_resize(kv, l, cap, err, err_len);
}

/* Room for `more` slots after the head's n (grow by a quarter: a compacted head stays close to its budget while
 * decode appends). A head with dropped slots at its front (a sliding window) is compacted into storage with a
 * quarter of its rows spare, so it copies its window once per n/4 steps, not every step. A slab head grows its
 * layer's slab by the same rule. */
static int reserve(kvc_store *kv, kv_head *hd, int64_t more, char *err, size_t err_len) {
    if (hd->off + hd->n + more <= hd->cap) return 0;
    if (hd->in_slab) {
        int64_t add[KVB_MAX_KV_HEADS] = {0};
        add[head_of(kv, hd)] = more;
        return slab_reserve(kv, layer_of(kv, hd), add, err, err_len);
    }
    int64_t cap = hd->cap ? with_spare(hd->cap) : (kv->initial_capacity > 0 ? kv->initial_capacity : 16);
    if (hd->off > 0) {
        int64_t need = with_spare(hd->n + more);
        cap = hd->cap > need ? hd->cap : need;
    }
    if (cap < hd->n + more) cap = hd->n + more;
    return resize(kv, hd, cap, hd->tier, err, err_len);
}

kvc_store *kvc_create(int n_layer, int n_head_kv, int head_dim, kvb_dtype dtype, int64_t initial_capacity,
                      kvb_backend *be, kvb_mem *mem, char *err, size_t err_len) {
    if (n_layer <= 0 || n_head_kv <= 0 || n_head_kv > KVB_MAX_KV_HEADS || head_dim <= 0 || initial_capacity < 0 || !mem ||
        !be || !be->kv_writer) {
        snprintf(err, err_len, "kv store: bad shape (%d layers, %d heads, head_dim %d) or no backend", n_layer, n_head_kv,
                 head_dim);
        return NULL;
    }
    kvc_store *kv = calloc(1, sizeof *kv);
    if (!kv) { snprintf(err, err_len, "kv store: out of memory"); return NULL; }
    kv->n_layer = n_layer;
    kv->n_head_kv = n_head_kv;
    kv->head_dim = head_dim;
    kv->dtype = dtype;
    kv->row_bytes = (size_t)head_dim * (dtype == KVB_F16 ? 2 : 4);
    kv->initial_capacity = initial_capacity;
    kv->be = be;
    kv->mem = mem;
    kv->heads = calloc((size_t)n_layer * (size_t)n_head_kv, sizeof *kv->heads);
    kv->slabs = calloc((size_t)n_layer, sizeof *kv->slabs);
    if (!kv->heads || !kv->slabs) {
        kvc_free(kv);
        snprintf(err, err_len, "kv store: out of memory");
        return NULL;
    }
    for (int i = 0; i < n_layer * n_head_kv; i++) kv->heads[i].cat = KVB_MEM_KV;
    kv->tmp.cat = KVB_MEM_WORKSPACE;
    kvc_set_layout(kv, kvc_default_layout(be), err, err_len); /* an empty store: cannot fail */
    return kv;
}

kvc_layout kvc_default_layout(const kvb_backend *be) {
#ifdef KVB_HAVE_CUDA
    /* the discrete backend is the CUDA one; FlashInfer's paged decode addresses a layer's heads from one base */
    if (be && be->discrete && kvb_cuda_attention_kernel() == 5) return KVC_LAYOUT_SLAB;
#else
    (void)be;
#endif
    return KVC_LAYOUT_HEADS;
}

const char *kvc_layout_name(kvc_layout layout) { return layout == KVC_LAYOUT_SLAB ? "slab" : "heads"; }

int kvc_set_layout(kvc_store *kv, kvc_layout layout, char *err, size_t err_len) {
    if (layout != KVC_LAYOUT_HEADS && layout != KVC_LAYOUT_SLAB) return ERR("kv store: bad layout %d", (int)layout);
    for (int i = 0; i < kv->n_layer * kv->n_head_kv; i++)
        if (kv->heads[i].cap || kv->heads[i].tier != KVB_TIER_DEVICE)
            return ERR("kv store: the layout changes only while the store holds no storage (layer %d head %d has some)",
                       i / kv->n_head_kv, i % kv->n_head_kv);
    for (int l = 0; l < kv->n_layer; l++)
        if (kv->slabs[l].cap) return ERR("kv store: the layout changes only while the store holds no storage");
    kv->layout = layout;
    for (int i = 0; i < kv->n_layer * kv->n_head_kv; i++) kv->heads[i].in_slab = layout == KVC_LAYOUT_SLAB;
    return 0;
}

kvc_layout kvc_get_layout(const kvc_store *kv) { return kv->layout; }

int kvc_layer_slab(const kvc_store *kv, int layer, kvc_slab *out) {
    *out = (kvc_slab){0};
    if (layer < 0 || layer >= kv->n_layer || !kv->slabs[layer].cap) return 0;
    const kv_slab *s = &kv->slabs[layer];
    *out = (kvc_slab){s->k, s->v, s->pos, s->round, s->cap, (size_t)s->cap * kv->row_bytes, 0};
    for (int h = 0; h < kv->n_head_kv; h++) out->heads += head_at(kv, layer, h)->in_slab;
    return 1;
}

void kvc_free(kvc_store *kv) {
    if (!kv) return;
    if (kv->heads && kv->slabs) kvc_clear(kv);
    kvb_mem_free(kv->mem, KVB_TIER_DEVICE, KVB_MEM_WORKSPACE, kv->idx, (size_t)kv->idx_cap * sizeof(int32_t));
    free(kv->heads);
    free(kv->slabs);
    free(kv);
}

void kvc_clear(kvc_store *kv) {
    for (int i = 0; i < kv->n_layer * kv->n_head_kv; i++) {
        release(kv, &kv->heads[i]);
        kv->heads[i].n = 0;
    }
    for (int l = 0; l < kv->n_layer; l++) slab_free(kv, &kv->slabs[l]);
    release(kv, &kv->tmp);
}

kvc_store *kvc_fork(const kvc_store *src, kvb_mem *mem) {
    char err[160];
    kvc_store *kv = kvc_create(src->n_layer, src->n_head_kv, src->head_dim, src->dtype, src->initial_capacity, src->be,
                               mem ? mem : src->mem, err, sizeof err);
    if (!kv) return NULL;
    if (kvc_set_layout(kv, src->layout, err, sizeof err)) {
        kvc_free(kv);
        return NULL;
    }
    for (int i = 0; i < src->n_layer * src->n_head_kv; i++) kv->heads[i].tier = src->heads[i].tier;
    for (int i = 0; i < src->n_layer * src->n_head_kv; i++) kv->heads[i].in_slab = src->heads[i].in_slab;
    for (int l = 0; l < src->n_layer; l++) { /* a slab of the source's capacity, each slab head copied into place */
        if (!src->slabs[l].cap) continue;
        if (slab_resize(kv, l, src->slabs[l].cap, err, sizeof err)) {
            kvc_free(kv);
            return NULL;
        }
        for (int h = 0; h < src->n_head_kv; h++) {
            const kv_head *s = head_at(src, l, h);
            kv_head *d = head_at(kv, l, h);
            if (!s->in_slab) continue;
            if (copy_slots(kv, d, KVB_TIER_DEVICE, s, KVB_TIER_DEVICE, s->n, err, sizeof err)) {
                kvc_free(kv);
                return NULL;
            }
            d->n = s->n;
        }
    }
    for (int i = 0; i < src->n_layer * src->n_head_kv; i++) {
        const kv_head *s = &src->heads[i];
        kv_head *d = &kv->heads[i];
        if (s->n == 0 || s->in_slab) continue;
        /* the source's capacity, not its rows: a fork decodes on at once, and a head sized exactly would reallocate
         * and copy itself in the first (timed) decode step */
        if (resize(kv, d, s->cap > s->n ? s->cap : s->n, s->tier, err, sizeof err) ||
            copy_slots(kv, d, d->tier, s, s->tier, s->n, err, sizeof err)) {
            kvc_free(kv);
            return NULL;
        }
        d->n = s->n;
    }
    return kv;
}

int kvc_append(kvc_store *kv, int layer, int64_t n_tok, const float *k, const float *v, const int32_t *pos,
               const int32_t *round, char *err, size_t err_len) {
    if (check_head(kv, layer, 0, err, err_len)) return -1;
    if (n_tok <= 0) return n_tok == 0 ? 0 : ERR("kv store: negative token count");
    kvb_kv_rows dst[KVB_MAX_KV_HEADS];
    int to_host = 0;
    if (kv->layout == KVC_LAYOUT_SLAB) { /* the layer's slab grows once for all its heads */
        int64_t add[KVB_MAX_KV_HEADS];
        for (int h = 0; h < kv->n_head_kv; h++) add[h] = n_tok;
        if (slab_reserve(kv, layer, add, err, err_len)) return -1;
    }
    for (int h = 0; h < kv->n_head_kv; h++) {
        kv_head *hd = head_at(kv, layer, h);
        if (reserve(kv, hd, n_tok, err, err_len)) return -1;
        size_t s = (size_t)hd->n;
        /* a host-tier head (offloaded) is written in place: the writer crosses to it and counts the copy down */
        dst[h] = (kvb_kv_rows){hd->k + s * kv->row_bytes, hd->v + s * kv->row_bytes, hd->pos + s, hd->round + s,
                               hd->tier == KVB_TIER_HOST};
        to_host += hd->tier == KVB_TIER_HOST;
    }
    if (kv->be->kv_writer(kv->be, kv->n_head_kv, kv->head_dim, kv->dtype, n_tok, dst, k, v, pos, round, err, err_len))
        return -1;
    for (int h = 0; h < kv->n_head_kv; h++) head_at(kv, layer, h)->n += n_tok;
    if (to_host) kvb_mem_move(kv->mem, KVB_TIER_DEVICE, KVB_TIER_HOST, n_tok * to_host * kvc_slot_bytes(kv));
    return 0;
}

/* Compact a device-tier head to the slots of a device index list: gather them into new storage for n slots with
 * the growth spare, so the decode step after a compression appends in place instead of reallocating and copying
 * the head inside the timed decode (what the first append would otherwise do: the spare is what it would add). */
static int slab_retain(kvc_store *kv, kv_head *hd, const int32_t *idx, int64_t n, char *err, size_t err_len);

static int retain_gather(kvc_store *kv, kv_head *hd, const int32_t *idx, int64_t n, char *err, size_t err_len) {
    if (hd->in_slab) return slab_retain(kv, hd, idx, n, err, err_len);
    kv_head old = *hd;
    *hd = (kv_head){0};
    hd->tier = old.tier;
    hd->cat = old.cat;
    if (resize(kv, hd, n > 0 ? with_spare(n) : 0, old.tier, err, err_len)) {
        *hd = old;
        return -1;
    }
    kvb_kv_head d = ops_head(hd), s = ops_head(&old);
    int rc = n > 0 ? kv->be->kv_gather(kv->be, &d, 0, &s, idx, n, kv->row_bytes, KVB_COPY_D2D, err, err_len) : 0;
    hd->n = n;
    release(kv, &old);
    return rc;
}

/* A slab head keeps its region: the listed slots are gathered into the store's workspace and copied back to the
 * region's start. The slab then keeps the growth spare of reserve: it is cut to a quarter more than its longest head
 * once that is well under it (the last head of a layer compressed to a budget), and grown to it when the retained
 * head would lack the spare a per-head store gives it. */
static int slab_retain(kvc_store *kv, kv_head *hd, const int32_t *idx, int64_t n, char *err, size_t err_len) {
    const int l = layer_of(kv, hd), h = head_of(kv, hd);
    if (n > kv->tmp.cap) {
        release(kv, &kv->tmp);
        if (resize(kv, &kv->tmp, n, KVB_TIER_DEVICE, err, err_len)) return -1;
    }
    kvb_kv_head d = ops_head(&kv->tmp), s = ops_head(hd);
    if (n > 0 && kv->be->kv_gather(kv->be, &d, 0, &s, idx, n, kv->row_bytes, KVB_COPY_D2D, err, err_len)) return -1;
    hd->off = 0;
    slab_bind(kv, l, h);
    if (copy_slots(kv, hd, KVB_TIER_DEVICE, &kv->tmp, KVB_TIER_DEVICE, n, err, err_len)) return -1;
    hd->n = n;
    const int64_t most = slab_longest(kv, l, NULL, NULL), target = most > 0 ? with_spare(most) : 0;
    const int64_t cap = kv->slabs[l].cap;
    return cap > target || cap < with_spare(n) ? slab_resize(kv, l, target, err, err_len) : 0;
}

int kvc_retain(kvc_store *kv, int layer, int h, const int32_t *idx, int64_t n, char *err, size_t err_len) {
    if (check_head(kv, layer, h, err, err_len)) return -1;
    kv_head *hd = head_at(kv, layer, h);
    if (n < 0 || n > hd->n) return ERR("kv store: retain of %lld slots from %lld", (long long)n, (long long)hd->n);
    for (int64_t i = 0; i < n; i++) {
        if (idx[i] < 0 || idx[i] >= hd->n)
            return ERR("kv store: retain index %d out of range [0, %lld) at layer %d head %d", idx[i], (long long)hd->n,
                       layer, h);
        if (i > 0 && idx[i] <= idx[i - 1])
            return ERR("kv store: retain indices must be strictly ascending (layer %d head %d)", layer, h);
    }
    if (hd->tier == KVB_TIER_HOST) { /* host memory: compact in place (idx ascending, so i <= idx[i]) */
        if (host_tier_wait(kv, err, err_len)) return -1;
        size_t rb = kv->row_bytes;
        for (int64_t i = 0; i < n; i++) {
            memmove(hd->k + (size_t)i * rb, hd->k + (size_t)idx[i] * rb, rb);
            memmove(hd->v + (size_t)i * rb, hd->v + (size_t)idx[i] * rb, rb);
            hd->pos[i] = hd->pos[idx[i]];
            hd->round[i] = hd->round[idx[i]];
        }
        hd->n = n;
        /* give memory back only when the head shrank to well under its storage (a reallocation of pinned host
         * memory is slow, and decode appends right after) */
        return hd->cap > 2 * with_spare(n) ? resize(kv, hd, n > 0 ? with_spare(n) : 0, hd->tier, err, err_len) : 0;
    }
    if (n > kv->idx_cap) {
        int32_t *p = kvb_mem_alloc(kv->mem, KVB_TIER_DEVICE, KVB_MEM_WORKSPACE, (size_t)n * sizeof(int32_t));
        if (!p) return ERR("kv store: out of memory for an index list of %lld", (long long)n);
        kvb_mem_free(kv->mem, KVB_TIER_DEVICE, KVB_MEM_WORKSPACE, kv->idx, (size_t)kv->idx_cap * sizeof(int32_t));
        kv->idx = p;
        kv->idx_cap = n;
    }
    if (n > 0 && kv->be->copy(kv->be, kv->idx, idx, (size_t)n * sizeof(int32_t), KVB_COPY_H2D, err, err_len)) return -1;
    return retain_gather(kv, hd, kv->idx, n, err, err_len);
}

int kvc_retain_dev(kvc_store *kv, int layer, int h, const int32_t *idx, int64_t n, char *err, size_t err_len) {
    if (check_head(kv, layer, h, err, err_len)) return -1;
    kv_head *hd = head_at(kv, layer, h);
    if (n < 0 || n > hd->n) return ERR("kv store: retain of %lld slots from %lld", (long long)n, (long long)hd->n);
    if (hd->tier != KVB_TIER_DEVICE) return ERR("kv store: a device index list for a host-tier head (layer %d)", layer);
    return retain_gather(kv, hd, idx, n, err, err_len);
}

int kvc_evict_heads(kvc_store *kv, int layer, int n_heads, const int *heads, float *const *score, int32_t lo,
                    int32_t hi, int64_t keep, void *const *spill_v, char *err, size_t err_len) {
    enum { CHUNK = 32 }; /* heads per backend call (a GPU's one launch) */
    if (keep < 0) return ERR("kv store: evict down to %lld slots", (long long)keep);
    for (int j0 = 0; j0 < n_heads; j0 += CHUNK) {
        kvb_kv_head x[CHUNK];
        int64_t n[CHUNK], count[CHUNK];
        float *sc[CHUNK];
        void *sp[CHUNK];
        const int m = n_heads - j0 < CHUNK ? n_heads - j0 : CHUNK;
        int any = 0;
        for (int i = 0; i < m; i++) {
            const int h = heads ? heads[j0 + i] : j0 + i;
            if (check_head(kv, layer, h, err, err_len)) return -1;
            const kv_head *hd = head_at(kv, layer, h);
            count[i] = hd->n > keep ? hd->n - keep : 0;
            if (count[i] && hd->tier != KVB_TIER_DEVICE)
                return ERR("kv store: eviction from a host-tier head (layer %d)", layer);
            x[i] = ops_head(hd), n[i] = hd->n;
            sc[i] = score ? score[j0 + i] : NULL, sp[i] = spill_v ? spill_v[j0 + i] : NULL;
            any |= count[i] > 0;
        }
        if (any && kv->be->kv_evict(kv->be, m, x, n, kv->row_bytes, sc, lo, hi, count, sp, err, err_len)) return -1;
        for (int i = 0; i < m; i++) head_at(kv, layer, heads ? heads[j0 + i] : j0 + i)->n -= count[i];
    }
    return 0;
}

int kvc_evict(kvc_store *kv, int layer, int h, float *score, int32_t lo, int32_t hi, int64_t count, void *spill_v,
              char *err, size_t err_len) {
    if (check_head(kv, layer, h, err, err_len)) return -1;
    const kv_head *hd = head_at(kv, layer, h);
    if (count <= 0) return 0;
    if (count > hd->n) return ERR("kv store: evict %lld of %lld slots", (long long)count, (long long)hd->n);
    return kvc_evict_heads(kv, layer, 1, &h, &score, lo, hi, hd->n - count, &spill_v, err, err_len);
}

int kvc_drop_front(kvc_store *kv, int layer, int h, int64_t count, char *err, size_t err_len) {
    if (check_head(kv, layer, h, err, err_len)) return -1;
    kv_head *hd = head_at(kv, layer, h);
    if (count < 0 || count > hd->n) return ERR("kv store: drop %lld of %lld slots", (long long)count, (long long)hd->n);
    if (count == 0) return 0;
    if (count == hd->n) { /* nothing left: start the storage over */
        hd->n = 0;
        hd->k -= (size_t)hd->off * kv->row_bytes, hd->v -= (size_t)hd->off * kv->row_bytes;
        hd->pos -= hd->off, hd->round -= hd->off;
        hd->off = 0;
        return 0;
    }
    /* the rows stay where they are (no copy, slot order kept): the head's view starts count slots later */
    hd->k += (size_t)count * kv->row_bytes;
    hd->v += (size_t)count * kv->row_bytes;
    hd->pos += count;
    hd->round += count;
    hd->off += count;
    hd->n -= count;
    return 0;
}

int kvc_truncate(kvc_store *kv, int layer, int h, int64_t n, char *err, size_t err_len) {
    if (check_head(kv, layer, h, err, err_len)) return -1;
    kv_head *hd = head_at(kv, layer, h);
    if (n < 0 || n > hd->n) return ERR("kv store: truncate to %lld of %lld slots", (long long)n, (long long)hd->n);
    hd->n = n;
    return 0;
}

static int check_list(const kv_head *s, const int32_t *idx, int64_t n, char *err, size_t err_len) {
    for (int64_t i = 0; i < n; i++)
        if (idx[i] < 0 || idx[i] >= s->n) return ERR("kv store: index %d out of range [0, %lld)", idx[i], (long long)s->n);
    return 0;
}

int kvc_gather(kvc_store *kv, int layer, int h, const int32_t *idx, int64_t n, void *k_out, void *v_out,
               int32_t *pos_out, char *err, size_t err_len) {
    if (check_head(kv, layer, h, err, err_len)) return -1;
    kv_head *hd = head_at(kv, layer, h);
    if (check_list(hd, idx, n, err, err_len)) return -1;
    int32_t *pos = malloc((size_t)(n > 0 ? n : 1) * sizeof *pos), *round = malloc((size_t)(n > 0 ? n : 1) * sizeof *round);
    int rc = pos && round ? 0 : ERR("kv store: out of memory");
    size_t rb = kv->row_bytes;
    if (!rc && hd->tier == KVB_TIER_HOST) {
        rc = host_tier_wait(kv, err, err_len);
        for (int64_t i = 0; !rc && i < n; i++) {
            memcpy((uint8_t *)k_out + (size_t)i * rb, hd->k + (size_t)idx[i] * rb, rb);
            memcpy((uint8_t *)v_out + (size_t)i * rb, hd->v + (size_t)idx[i] * rb, rb);
            pos[i] = hd->pos[idx[i]];
        }
    } else if (!rc && n > 0) {
        kvb_kv_head d = {k_out, v_out, pos, round}, s = ops_head(hd);
        rc = kv->be->kv_gather(kv->be, &d, 0, &s, idx, n, rb, KVB_COPY_D2H, err, err_len);
        if (!rc && kv->be->sync && kv->be->sync(kv->be)) rc = ERR("%s", kv->be->error);
    }
    if (!rc && pos_out) memcpy(pos_out, pos, (size_t)n * sizeof *pos);
    free(pos);
    free(round);
    return rc;
}

int kvc_set_tier(kvc_store *kv, int layer, int h, kvb_tier tier, char *err, size_t err_len) {
    if (check_head(kv, layer, h, err, err_len)) return -1;
    if (tier != KVB_TIER_DEVICE && tier != KVB_TIER_HOST) return ERR("kv store: bad tier %d", (int)tier);
    kv_head *hd = head_at(kv, layer, h);
    if (hd->tier == tier) return 0;
    kvb_tier from = hd->tier;
    int64_t moved = hd->n * kvc_slot_bytes(kv);
    if (kv->layout == KVC_LAYOUT_SLAB && tier == KVB_TIER_DEVICE) { /* back into its region of the slab */
        kv_head old = *hd;
        hd->n = hd->off = 0;
        hd->in_slab = 1;
        hd->tier = KVB_TIER_DEVICE;
        slab_bind(kv, layer, h);
        /* with the growth spare a moved head gets (below), here the longest head's: the slab grows when it lacks it */
        const int64_t longest = slab_longest(kv, layer, NULL, NULL);
        const int64_t spare = with_spare(old.n > longest ? old.n : longest);
        if ((old.n > 0 && kv->slabs[layer].cap < with_spare(old.n) && slab_resize(kv, layer, spare, err, err_len)) ||
            copy_slots(kv, hd, KVB_TIER_DEVICE, &old, KVB_TIER_HOST, old.n, err, err_len)) {
            *hd = old;
            return -1;
        }
        hd->n = old.n;
        release(kv, &old);
        if (moved) kvb_mem_move(kv->mem, from, tier, moved);
        return 0;
    }
    /* the moved head keeps the growth spare: decode appends to it next (on the host tier, a reallocation there is
     * a pinned allocation and a copy of the head inside the timed decode). A slab head leaving for the host tier
     * takes per-head host storage; its region stays in the slab, which is freed once no head is left in it. */
    const int was_in_slab = hd->in_slab;
    if (resize(kv, hd, hd->n > 0 ? with_spare(hd->n) : 0, tier, err, err_len)) return -1;
    hd->in_slab = 0;
    if (was_in_slab && kv->slabs[layer].cap) {
        int left = 0;
        for (int g = 0; g < kv->n_head_kv; g++) left += head_at(kv, layer, g)->in_slab;
        if (!left) slab_free(kv, &kv->slabs[layer]);
    }
    if (moved) kvb_mem_move(kv->mem, from, tier, moved);
    return 0;
}

int kvc_set_layer_tier(kvc_store *kv, int layer, kvb_tier tier, char *err, size_t err_len) {
    for (int h = 0; h < kv->n_head_kv; h++)
        if (kvc_set_tier(kv, layer, h, tier, err, err_len)) return -1;
    return 0;
}

kvc_view kvc_head_view(const kvc_store *kv, int layer, int h) {
    const kv_head *hd = head_at(kv, layer, h);
    kvc_view v = {hd->k, hd->v, hd->pos, hd->round, hd->n, kv->dtype, hd->tier};
    return v;
}

int64_t kvc_n(const kvc_store *kv, int layer, int h) { return head_at(kv, layer, h)->n; }

int64_t kvc_slot_bytes(const kvc_store *kv) { return (int64_t)(2 * kv->row_bytes + 2 * sizeof(int32_t)); }

int64_t kvc_bytes(const kvc_store *kv, kvb_tier tier) {
    int64_t s = 0;
    for (int i = 0; i < kv->n_layer * kv->n_head_kv; i++)
        if ((tier == KVB_TIER_COUNT || kv->heads[i].tier == tier) && !kv->heads[i].in_slab)
            s += kv->heads[i].cap * kvc_slot_bytes(kv);
    if (tier == KVB_TIER_COUNT || tier == KVB_TIER_DEVICE) /* a slab: every head's region, held or not */
        for (int l = 0; l < kv->n_layer; l++) s += kv->n_head_kv * kv->slabs[l].cap * kvc_slot_bytes(kv);
    return s;
}

int64_t kvc_used_bytes(const kvc_store *kv, kvb_tier tier) {
    int64_t s = 0;
    for (int i = 0; i < kv->n_layer * kv->n_head_kv; i++)
        if (tier == KVB_TIER_COUNT || kv->heads[i].tier == tier) s += kv->heads[i].n * kvc_slot_bytes(kv);
    return s;
}

int64_t kvc_full_bytes_for(const kvc_store *kv, int64_t n_tokens) {
    return 2 * (int64_t)kv->n_layer * kv->n_head_kv * (int64_t)kv->row_bytes * n_tokens;
}

int kvc_append_from(kvc_store *dst, int dl, int dh, const kvc_store *src, int sl, int sh, const int32_t *idx,
                    int64_t n, int count_move, char *err, size_t err_len) {
    if (check_head(dst, dl, dh, err, err_len) || check_head(src, sl, sh, err, err_len)) return -1;
    if (dst->row_bytes != src->row_bytes) return ERR("kv store: copy between stores of different row sizes");
    kv_head *d = head_at(dst, dl, dh);
    const kv_head *s = head_at(src, sl, sh);
    if (check_list(s, idx, n, err, err_len) || reserve(dst, d, n, err, err_len)) return -1;
    if (n == 0) return 0;
    if (s->tier == d->tier) /* same tier: only the tier-crossing packed loads and offload writes are expected */
        return ERR("kv store: append_from within the %s tier (layer %d)", kvb_tier_name(d->tier), dl);
    kvb_kv_head x = ops_head(d), y = ops_head(s);
    kvb_copy_dir dir = s->tier == KVB_TIER_HOST ? KVB_COPY_H2D : KVB_COPY_D2H;
    if (dst->be->kv_gather(dst->be, &x, d->n, &y, idx, n, dst->row_bytes, dir, err, err_len)) return -1;
    d->n += n;
    if (count_move) kvb_mem_move(dst->mem, s->tier, d->tier, n * kvc_slot_bytes(dst));
    return 0;
}

int kvc_reserve_heads(kvc_store *dst, int n_heads, const int *layer, const int *head, const int64_t *n, char *err,
                      size_t err_len) {
    if (n_heads < 0 || n_heads > dst->n_layer * dst->n_head_kv) return ERR("kv store: a reserve of %d heads", n_heads);
    int64_t *add = calloc((size_t)dst->n_layer * (size_t)dst->n_head_kv, sizeof *add); /* slab heads: by layer */
    if (!add) return ERR("out of memory");
    int rc = 0;
    for (int j = 0; j < n_heads && !rc; j++) {
        if (check_head(dst, layer[j], head[j], err, err_len) || n[j] < 0) {
            rc = n[j] < 0 ? ERR("kv store: a reserve of %lld slots", (long long)n[j]) : -1;
            break;
        }
        kv_head *d = head_at(dst, layer[j], head[j]);
        if (d->in_slab) add[(size_t)layer[j] * dst->n_head_kv + head[j]] = n[j];
        else rc = reserve(dst, d, n[j], err, err_len);
    }
    for (int l = 0; l < dst->n_layer && !rc && dst->layout == KVC_LAYOUT_SLAB; l++)
        if (slab_reserve(dst, l, add + (size_t)l * dst->n_head_kv, err, err_len)) rc = -1;
    free(add);
    return rc;
}

int kvc_load(kvc_store *dst, const kvc_store *src, int n_heads, const int *layer, const int *head,
             const int32_t *const *idx, const int64_t *n, char *err, size_t err_len) {
    if (n_heads < 0 || n_heads > dst->n_layer * dst->n_head_kv) return ERR("kv store: a load of %d heads", n_heads);
    if (dst->row_bytes != src->row_bytes) return ERR("kv store: copy between stores of different row sizes");
    kvb_kv_head *x = malloc((size_t)(n_heads ? n_heads : 1) * sizeof *x), *y = malloc((size_t)(n_heads ? n_heads : 1) * sizeof *y);
    int64_t *off = malloc((size_t)(n_heads ? n_heads : 1) * sizeof *off);
    int rc = x && y && off ? 0 : ERR("out of memory");
    int64_t moved = 0;
    for (int j = 0; j < n_heads && !rc; j++) {
        const int l = layer[j], h = head[j];
        if (check_head(dst, l, h, err, err_len) || check_head(src, l, h, err, err_len)) { rc = -1; break; }
        kv_head *d = head_at(dst, l, h);
        const kv_head *sh = head_at(src, l, h);
        if (sh->tier != KVB_TIER_HOST || d->tier != KVB_TIER_DEVICE) {
            rc = ERR("kv store: a load goes from the host tier to the device tier (layer %d head %d)", l, h);
            break;
        }
        for (int i = 0; i < j; i++)
            if (layer[i] == l && head[i] == h) rc = ERR("kv store: layer %d head %d twice in one load", l, h);
        const int32_t *ix = idx ? idx[j] : NULL;
        if (!rc && (n[j] < 0 || (!ix && n[j] > sh->n)))
            rc = ERR("kv store: %lld slots of a head of %lld", (long long)n[j], (long long)sh->n);
        if (rc || (ix && check_list(sh, ix, n[j], err, err_len))) {
            rc = -1;
            break;
        }
    }
    if (!rc) rc = kvc_reserve_heads(dst, n_heads, layer, head, n, err, err_len); /* nothing where a caller reserved */
    for (int j = 0; j < n_heads && !rc; j++) { /* after every reserve: a reserve may move a head */
        kv_head *d = head_at(dst, layer[j], head[j]);
        x[j] = ops_head(d);
        y[j] = ops_head(head_at(src, layer[j], head[j]));
        off[j] = d->n;
        moved += n[j];
    }
    if (!rc && moved && dst->be->kv_load(dst->be, n_heads, x, off, y, idx, n, dst->row_bytes, err, err_len)) rc = -1;
    for (int j = 0; j < n_heads && !rc; j++) head_at(dst, layer[j], head[j])->n += n[j];
    if (!rc && moved) kvb_mem_move(dst->mem, KVB_TIER_HOST, KVB_TIER_DEVICE, moved * kvc_slot_bytes(dst));
    free(x);
    free(y);
    free(off);
    return rc;
}

int64_t kvc_layer_used_bytes(const kvc_store *kv, int layer, kvb_tier tier) {
    int64_t s = 0;
    for (int h = 0; h < kv->n_head_kv; h++) {
        const kv_head *hd = head_at(kv, layer, h);
        if (tier == KVB_TIER_COUNT || hd->tier == tier) s += hd->n * kvc_slot_bytes(kv);
    }
    return s;
}
