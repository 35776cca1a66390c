#include "engine/mem.h"

#include <stdlib.h>
#include <string.h>

void kvb_mem_init(kvb_mem *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
}

void kvb_mem_destroy(kvb_mem *m) { pthread_mutex_destroy(&m->mu); }

void kvb_mem_set_allocator(kvb_mem *m, const kvb_allocator *a) { m->alloc = a; }

void kvb_mem_copy(kvb_mem *m, void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    if (m && m->alloc && m->alloc->copy) m->alloc->copy(m->alloc->user, dst, src, bytes);
    else memcpy(dst, src, bytes);
}

static void account(kvb_mem *m, kvb_tier tier, kvb_mem_cat cat, int64_t delta) {
    pthread_mutex_lock(&m->mu);
    m->cur_bytes[tier][cat] += delta;
    m->tier_cur_bytes[tier] += delta;
    if (m->cur_bytes[tier][cat] > m->peak_bytes[tier][cat]) m->peak_bytes[tier][cat] = m->cur_bytes[tier][cat];
    if (m->tier_cur_bytes[tier] > m->tier_peak_bytes[tier]) m->tier_peak_bytes[tier] = m->tier_cur_bytes[tier];
    pthread_mutex_unlock(&m->mu);
}

void *kvb_mem_alloc(kvb_mem *m, kvb_tier tier, kvb_mem_cat cat, size_t bytes) {
    if (bytes == 0 || bytes > (size_t)INT64_MAX / 2) return NULL;
    void *p = NULL;
    if (m->alloc) {
        p = m->alloc->alloc(m->alloc->user, tier, bytes);
        if (!p) return NULL;
    } else {
        if (posix_memalign(&p, 64, bytes)) return NULL;
        memset(p, 0, bytes);
    }
    account(m, tier, cat, (int64_t)bytes);
    return p;
}

void *kvb_mem_realloc(kvb_mem *m, kvb_tier tier, kvb_mem_cat cat, void *p, size_t old_bytes, size_t new_bytes) {
    if (new_bytes == 0) {
        kvb_mem_free(m, tier, cat, p, old_bytes);
        return NULL;
    }
    void *q = kvb_mem_alloc(m, tier, cat, new_bytes);
    if (!q) return NULL;
    if (p) kvb_mem_copy(m, q, p, old_bytes < new_bytes ? old_bytes : new_bytes);
    kvb_mem_free(m, tier, cat, p, old_bytes);
    return q;
}

void kvb_mem_free(kvb_mem *m, kvb_tier tier, kvb_mem_cat cat, void *p, size_t bytes) {
    if (!p) return;
    if (m->alloc) m->alloc->free(m->alloc->user, tier, p, bytes);
    else free(p);
    account(m, tier, cat, -(int64_t)bytes);
}

void kvb_mem_note(kvb_mem *m, kvb_tier tier, kvb_mem_cat cat, int64_t delta_bytes) { account(m, tier, cat, delta_bytes); }

void kvb_mem_move(kvb_mem *m, kvb_tier from, kvb_tier to, int64_t bytes) {
    pthread_mutex_lock(&m->mu);
    m->moved_bytes[from][to] += bytes;
    m->n_moves[from][to]++;
    pthread_mutex_unlock(&m->mu);
}

int64_t kvb_mem_current(kvb_mem *m, kvb_tier tier, kvb_mem_cat cat) {
    pthread_mutex_lock(&m->mu);
    int64_t v = cat == KVB_MEM_COUNT ? m->tier_cur_bytes[tier] : m->cur_bytes[tier][cat];
    pthread_mutex_unlock(&m->mu);
    return v;
}

int64_t kvb_mem_peak(kvb_mem *m, kvb_tier tier, kvb_mem_cat cat) {
    pthread_mutex_lock(&m->mu);
    int64_t v = cat == KVB_MEM_COUNT ? m->tier_peak_bytes[tier] : m->peak_bytes[tier][cat];
    pthread_mutex_unlock(&m->mu);
    return v;
}

void kvb_mem_reset_peaks(kvb_mem *m) {
    pthread_mutex_lock(&m->mu);
    for (int t = 0; t < KVB_TIER_COUNT; t++) {
        m->tier_peak_bytes[t] = m->tier_cur_bytes[t];
        for (int c = 0; c < KVB_MEM_COUNT; c++) m->peak_bytes[t][c] = m->cur_bytes[t][c];
    }
    pthread_mutex_unlock(&m->mu);
}

const char *kvb_tier_name(kvb_tier t) { return t == KVB_TIER_DEVICE ? "device" : t == KVB_TIER_HOST ? "host" : "?"; }

const char *kvb_mem_cat_name(kvb_mem_cat c) {
    static const char *names[] = {"weights", "kv", "workspace", "method"};
    return (unsigned)c < KVB_MEM_COUNT ? names[c] : "total";
}

void kvb_mem_print(kvb_mem *m, FILE *out) {
    const double MiB = 1024.0 * 1024.0;
    fprintf(out, "| tier | category | current MiB | peak MiB |\n|---|---|---:|---:|\n");
    for (int t = 0; t < KVB_TIER_COUNT; t++) {
        for (int c = 0; c <= KVB_MEM_COUNT; c++)
            fprintf(out, "| %s | %s | %.2f | %.2f |\n", kvb_tier_name((kvb_tier)t), kvb_mem_cat_name((kvb_mem_cat)c),
                    kvb_mem_current(m, (kvb_tier)t, (kvb_mem_cat)c) / MiB, kvb_mem_peak(m, (kvb_tier)t, (kvb_mem_cat)c) / MiB);
    }
    fprintf(out, "moved host->device: %.2f MiB in %lld moves; device->host: %.2f MiB in %lld moves\n",
            m->moved_bytes[KVB_TIER_HOST][KVB_TIER_DEVICE] / MiB, (long long)m->n_moves[KVB_TIER_HOST][KVB_TIER_DEVICE],
            m->moved_bytes[KVB_TIER_DEVICE][KVB_TIER_HOST] / MiB, (long long)m->n_moves[KVB_TIER_DEVICE][KVB_TIER_HOST]);
}
