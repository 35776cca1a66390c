#include "engine/kvcache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint8_t *k, *v;
    int32_t *pos, *round;
    int64_t n, cap;
    kvb_tier tier;
} kv_head;

struct kvc_store {
    int n_layer, n_head_kv, head_dim;
    kvb_dtype dtype;
    size_t row_bytes;
    int64_t initial_capacity;
    kvb_mem *mem;
    kv_head *heads; /* [n_layer][n_head_kv] */
    kvb_kv_writer writer; /* a backend's device-side writer; NULL = rows converted and stored by the host */
    void *writer_user;
};

#define ERR(...) (snprintf(err, err_len, __VA_ARGS__), -1)

static kv_head *head_at(const kvc_store *kv, int layer, int h) { return &kv->heads[(size_t)layer * kv->n_head_kv + h]; }

static int check_head(const kvc_store *kv, int layer, int h, char *err, size_t err_len) {
    if (layer < 0 || layer >= kv->n_layer || h < 0 || h >= kv->n_head_kv)
        return ERR("kv store: no head (%d, %d) in a store of %d layers x %d heads", layer, h, kv->n_layer, kv->n_head_kv);
    return 0;
}

static void release(kvc_store *kv, kv_head *hd) {
    if (!hd->cap) return;
    size_t rb = kv->row_bytes, c = (size_t)hd->cap;
    kvb_mem_free(kv->mem, hd->tier, KVB_MEM_KV, hd->k, c * rb);
    kvb_mem_free(kv->mem, hd->tier, KVB_MEM_KV, hd->v, c * rb);
    kvb_mem_free(kv->mem, hd->tier, KVB_MEM_KV, hd->pos, c * sizeof(int32_t));
    kvb_mem_free(kv->mem, hd->tier, KVB_MEM_KV, hd->round, c * sizeof(int32_t));
    hd->k = hd->v = NULL;
    hd->pos = hd->round = NULL;
    hd->cap = 0;
}

/* Reallocate a head to exactly cap slots in tier (cap >= n). */
static int resize(kvc_store *kv, kv_head *hd, int64_t cap, kvb_tier tier) {
    if (cap == 0) {
        release(kv, hd);
        hd->tier = tier;
        return 0;
    }
    size_t rb = kv->row_bytes, c = (size_t)cap, n = (size_t)hd->n;
    uint8_t *k = kvb_mem_alloc(kv->mem, tier, KVB_MEM_KV, c * rb);
    uint8_t *v = kvb_mem_alloc(kv->mem, tier, KVB_MEM_KV, c * rb);
    int32_t *pos = kvb_mem_alloc(kv->mem, tier, KVB_MEM_KV, c * sizeof(int32_t));
    int32_t *round = kvb_mem_alloc(kv->mem, tier, KVB_MEM_KV, c * sizeof(int32_t));
    if (!k || !v || !pos || !round) {
        kvb_mem_free(kv->mem, tier, KVB_MEM_KV, k, c * rb);
        kvb_mem_free(kv->mem, tier, KVB_MEM_KV, v, c * rb);
        kvb_mem_free(kv->mem, tier, KVB_MEM_KV, pos, c * sizeof(int32_t));
        kvb_mem_free(kv->mem, tier, KVB_MEM_KV, round, c * sizeof(int32_t));
        return -1;
    }
    if (n) {
        kvb_mem_copy(kv->mem, k, hd->k, n * rb);
        kvb_mem_copy(kv->mem, v, hd->v, n * rb);
        kvb_mem_copy(kv->mem, pos, hd->pos, n * sizeof(int32_t));
        kvb_mem_copy(kv->mem, round, hd->round, n * sizeof(int32_t));
    }
    release(kv, hd);
    hd->k = k;
    hd->v = v;
    hd->pos = pos;
    hd->round = round;
    hd->cap = cap;
    hd->tier = tier;
    return 0;
}

kvc_store *kvc_create(int n_layer, int n_head_kv, int head_dim, kvb_dtype dtype, int64_t initial_capacity,
                      kvb_mem *mem, char *err, size_t err_len) {
    if (n_layer <= 0 || n_head_kv <= 0 || head_dim <= 0 || initial_capacity < 0 || !mem)
        { snprintf(err, err_len, "kv store: bad shape (%d layers, %d heads, head_dim %d)", n_layer, n_head_kv, head_dim); return NULL; }
    kvc_store *kv = calloc(1, sizeof *kv);
    if (!kv) { snprintf(err, err_len, "kv store: out of memory"); return NULL; }
    kv->n_layer = n_layer;
    kv->n_head_kv = n_head_kv;
    kv->head_dim = head_dim;
    kv->dtype = dtype;
    kv->row_bytes = (size_t)head_dim * (dtype == KVB_F16 ? 2 : 4);
    kv->initial_capacity = initial_capacity;
    kv->mem = mem;
    kv->heads = calloc((size_t)n_layer * (size_t)n_head_kv, sizeof *kv->heads);
    if (!kv->heads) {
        free(kv);
        { snprintf(err, err_len, "kv store: out of memory"); return NULL; }
    }
    return kv;
}

void kvc_free(kvc_store *kv) {
    if (!kv) return;
    kvc_clear(kv);
    free(kv->heads);
    free(kv);
}

void kvc_clear(kvc_store *kv) {
    for (int i = 0; i < kv->n_layer * kv->n_head_kv; i++) {
        release(kv, &kv->heads[i]);
        kv->heads[i].n = 0;
    }
}

kvc_store *kvc_fork(const kvc_store *src, kvb_mem *mem) {
    char err[128];
    kvc_store *kv = kvc_create(src->n_layer, src->n_head_kv, src->head_dim, src->dtype, src->initial_capacity,
                               mem ? mem : src->mem, err, sizeof err);
    if (!kv) return NULL;
    for (int i = 0; i < src->n_layer * src->n_head_kv; i++) {
        const kv_head *s = &src->heads[i];
        kv_head *d = &kv->heads[i];
        d->tier = s->tier;
        if (s->n == 0) continue;
        if (resize(kv, d, s->n, s->tier)) {
            kvc_free(kv);
            return NULL;
        }
        kvb_mem_copy(kv->mem, d->k, s->k, (size_t)s->n * kv->row_bytes);
        kvb_mem_copy(kv->mem, d->v, s->v, (size_t)s->n * kv->row_bytes);
        kvb_mem_copy(kv->mem, d->pos, s->pos, (size_t)s->n * sizeof(int32_t));
        kvb_mem_copy(kv->mem, d->round, s->round, (size_t)s->n * sizeof(int32_t));
        d->n = s->n;
    }
    kv->writer = src->writer;
    kv->writer_user = src->writer_user;
    return kv;
}

static void store_row(const kvc_store *kv, uint8_t *dst, const float *src) {
    if (kv->dtype == KVB_F32) {
        memcpy(dst, src, kv->row_bytes);
    } else {
        kvb_f16 *d = (kvb_f16 *)dst;
        for (int i = 0; i < kv->head_dim; i++) d[i] = kvb_f32_to_f16(src[i]);
    }
}

int kvc_append(kvc_store *kv, int layer, int64_t n_tok, const float *k, const float *v, const int32_t *pos,
               const int32_t *round, char *err, size_t err_len) {
    if (check_head(kv, layer, 0, err, err_len)) return -1;
    if (n_tok <= 0) return n_tok == 0 ? 0 : ERR("kv store: negative token count");
    const int64_t stride = (int64_t)kv->n_head_kv * kv->head_dim;
    for (int h = 0; h < kv->n_head_kv; h++) {
        kv_head *hd = head_at(kv, layer, h);
        if (hd->n + n_tok > hd->cap) {
            /* grow by a quarter: a compacted head (retain) stays close to its budget while decode appends */
            int64_t cap = hd->cap ? hd->cap + hd->cap / 4 + 16 : (kv->initial_capacity > 0 ? kv->initial_capacity : 16);
            if (cap < hd->n + n_tok) cap = hd->n + n_tok;
            if (resize(kv, hd, cap, hd->tier))
                return ERR("kv store: out of memory growing layer %d head %d to %lld tokens", layer, h, (long long)cap);
        }
        for (int64_t t = 0; t < n_tok && !kv->writer; t++) { /* (a writer stores every head at once, below) */
            int64_t s = hd->n + t;
            store_row(kv, hd->k + (size_t)s * kv->row_bytes, k + t * stride + (int64_t)h * kv->head_dim);
            store_row(kv, hd->v + (size_t)s * kv->row_bytes, v + t * stride + (int64_t)h * kv->head_dim);
            hd->pos[s] = pos[t];
            hd->round[s] = round ? round[t] : 0;
        }
        hd->n += n_tok;
    }
    if (kv->writer) {
        kvb_kv_rows dst[KVB_MAX_KV_HEADS];
        if (kv->n_head_kv > KVB_MAX_KV_HEADS) return ERR("kv store: %d KV heads exceed the writer's %d", kv->n_head_kv, KVB_MAX_KV_HEADS);
        for (int h = 0; h < kv->n_head_kv; h++) {
            kv_head *hd = head_at(kv, layer, h);
            int64_t s = hd->n - n_tok;
            dst[h].k = hd->k + (size_t)s * kv->row_bytes;
            dst[h].v = hd->v + (size_t)s * kv->row_bytes;
            dst[h].pos = hd->pos + s;
            dst[h].round = hd->round + s;
        }
        if (kv->writer(kv->writer_user, kv->n_head_kv, kv->head_dim, kv->dtype, n_tok, dst, k, v, pos, round, err,
                       err_len))
            return -1;
    }
    return 0;
}

void kvc_set_writer(kvc_store *kv, kvb_kv_writer w, void *user) {
    kv->writer = w;
    kv->writer_user = user;
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
    size_t rb = kv->row_bytes;
    for (int64_t i = 0; i < n; i++) { /* idx ascending, so i <= idx[i]: forward compaction is safe */
        int64_t s = idx[i];
        if (s == i) continue;
        memmove(hd->k + (size_t)i * rb, hd->k + (size_t)s * rb, rb);
        memmove(hd->v + (size_t)i * rb, hd->v + (size_t)s * rb, rb);
        hd->pos[i] = hd->pos[s];
        hd->round[i] = hd->round[s];
    }
    hd->n = n;
    if (resize(kv, hd, n, hd->tier)) return ERR("kv store: out of memory compacting layer %d head %d", layer, h);
    return 0;
}

int kvc_truncate(kvc_store *kv, int layer, int h, int64_t n, char *err, size_t err_len) {
    if (check_head(kv, layer, h, err, err_len)) return -1;
    kv_head *hd = head_at(kv, layer, h);
    if (n < 0 || n > hd->n) return ERR("kv store: truncate to %lld of %lld slots", (long long)n, (long long)hd->n);
    hd->n = n;
    return 0;
}

int kvc_gather(kvc_store *kv, int layer, int h, const int32_t *idx, int64_t n, void *k_out, void *v_out,
               int32_t *pos_out, char *err, size_t err_len) {
    if (check_head(kv, layer, h, err, err_len)) return -1;
    kv_head *hd = head_at(kv, layer, h);
    size_t rb = kv->row_bytes;
    for (int64_t i = 0; i < n; i++) {
        if (idx[i] < 0 || idx[i] >= hd->n)
            return ERR("kv store: gather index %d out of range [0, %lld)", idx[i], (long long)hd->n);
        memcpy((uint8_t *)k_out + (size_t)i * rb, hd->k + (size_t)idx[i] * rb, rb);
        memcpy((uint8_t *)v_out + (size_t)i * rb, hd->v + (size_t)idx[i] * rb, rb);
        if (pos_out) pos_out[i] = hd->pos[idx[i]];
    }
    if (hd->tier == KVB_TIER_HOST && n > 0) kvb_mem_move(kv->mem, KVB_TIER_HOST, KVB_TIER_DEVICE, (int64_t)(2 * rb) * n);
    return 0;
}

int kvc_set_tier(kvc_store *kv, int layer, int h, kvb_tier tier, char *err, size_t err_len) {
    if (check_head(kv, layer, h, err, err_len)) return -1;
    if (tier != KVB_TIER_DEVICE && tier != KVB_TIER_HOST) return ERR("kv store: bad tier %d", (int)tier);
    kv_head *hd = head_at(kv, layer, h);
    if (hd->tier == tier) return 0;
    kvb_tier from = hd->tier;
    int64_t moved = hd->n * kvc_slot_bytes(kv);
    if (resize(kv, hd, hd->n, tier)) return ERR("kv store: out of memory moving layer %d head %d", layer, h);
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
        if (tier == KVB_TIER_COUNT || kv->heads[i].tier == tier) s += kv->heads[i].cap * kvc_slot_bytes(kv);
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

int kvc_remove(kvc_store *kv, int layer, int h, int64_t slot, char *err, size_t err_len) {
    if (check_head(kv, layer, h, err, err_len)) return -1;
    kv_head *hd = head_at(kv, layer, h);
    if (slot < 0 || slot >= hd->n)
        return ERR("kv store: remove of slot %lld of %lld (layer %d head %d)", (long long)slot, (long long)hd->n, layer, h);
    int64_t last = hd->n - 1;
    if (slot != last) {
        size_t rb = kv->row_bytes;
        memcpy(hd->k + (size_t)slot * rb, hd->k + (size_t)last * rb, rb);
        memcpy(hd->v + (size_t)slot * rb, hd->v + (size_t)last * rb, rb);
        hd->pos[slot] = hd->pos[last];
        hd->round[slot] = hd->round[last];
    }
    hd->n = last;
    return 0;
}

int kvc_append_from(kvc_store *dst, int dl, int dh, const kvc_store *src, int sl, int sh, const int32_t *idx,
                    int64_t n, int count_move, char *err, size_t err_len) {
    if (check_head(dst, dl, dh, err, err_len) || check_head(src, sl, sh, err, err_len)) return -1;
    if (dst->row_bytes != src->row_bytes) return ERR("kv store: copy between stores of different row sizes");
    kv_head *d = head_at(dst, dl, dh);
    const kv_head *s = head_at(src, sl, sh);
    for (int64_t i = 0; i < n; i++)
        if (idx[i] < 0 || idx[i] >= s->n)
            return ERR("kv store: copy index %d out of range [0, %lld)", idx[i], (long long)s->n);
    if (d->n + n > d->cap) {
        int64_t cap = d->cap ? d->cap + d->cap / 4 + 16 : (dst->initial_capacity > 0 ? dst->initial_capacity : 16);
        if (cap < d->n + n) cap = d->n + n;
        if (resize(dst, d, cap, d->tier))
            return ERR("kv store: out of memory growing layer %d head %d to %lld tokens", dl, dh, (long long)cap);
    }
    size_t rb = dst->row_bytes;
    for (int64_t i = 0; i < n; i++) {
        int64_t t = d->n + i, f = idx[i];
        memcpy(d->k + (size_t)t * rb, s->k + (size_t)f * rb, rb);
        memcpy(d->v + (size_t)t * rb, s->v + (size_t)f * rb, rb);
        d->pos[t] = s->pos[f];
        d->round[t] = s->round[f];
    }
    d->n += n;
    if (count_move && s->tier != d->tier && n > 0) kvb_mem_move(dst->mem, s->tier, d->tier, n * kvc_slot_bytes(dst));
    return 0;
}

int64_t kvc_layer_used_bytes(const kvc_store *kv, int layer, kvb_tier tier) {
    int64_t s = 0;
    for (int h = 0; h < kv->n_head_kv; h++) {
        const kv_head *hd = head_at(kv, layer, h);
        if (tier == KVB_TIER_COUNT || hd->tier == tier) s += hd->n * kvc_slot_bytes(kv);
    }
    return s;
}
