/* mem.h — byte accounting per tier (device, host) and category, with peaks and tier moves.
 * Every allocation the engine makes for weights, KV, workspaces and method state goes
 * through here, so a run can state what it held, not what it meant to hold. */
#ifndef KVB_MEM_H
#define KVB_MEM_H

#include <stdint.h>
#include <stdio.h>
#include <pthread.h>

#include "kernels/backend.h" /* kvb_tier, kvb_allocator */

typedef enum { KVB_MEM_WEIGHTS = 0, KVB_MEM_KV, KVB_MEM_WORKSPACE, KVB_MEM_METHOD, KVB_MEM_COUNT } kvb_mem_cat;

typedef struct {
    pthread_mutex_t mu;
    const kvb_allocator *alloc; /* where the bytes come from: a GPU backend's allocator, NULL = C heap */
    int64_t cur_bytes[KVB_TIER_COUNT][KVB_MEM_COUNT];
    int64_t peak_bytes[KVB_TIER_COUNT][KVB_MEM_COUNT];
    int64_t tier_cur_bytes[KVB_TIER_COUNT], tier_peak_bytes[KVB_TIER_COUNT];
    int64_t moved_bytes[KVB_TIER_COUNT][KVB_TIER_COUNT]; /* [from][to] */
    int64_t n_moves[KVB_TIER_COUNT][KVB_TIER_COUNT];
} kvb_mem;

/* Zero all counters. */
void kvb_mem_init(kvb_mem *m);
void kvb_mem_destroy(kvb_mem *m);
/* Use this allocator for later allocations (NULL = C heap). Set it before the first allocation. */
void kvb_mem_set_allocator(kvb_mem *m, const kvb_allocator *a);
/* Copy between two blocks allocated through m (or plain host memory). */
void kvb_mem_copy(kvb_mem *m, void *dst, const void *src, size_t bytes);
/* Zeroed, 64-byte aligned memory of `bytes`, accounted to (tier, cat). NULL on failure or bytes == 0. */
void *kvb_mem_alloc(kvb_mem *m, kvb_tier tier, kvb_mem_cat cat, size_t bytes);
/* Resize an allocation made here (contents kept up to the smaller size; new bytes zeroed). NULL on failure
 * (the old block stays valid). */
void *kvb_mem_realloc(kvb_mem *m, kvb_tier tier, kvb_mem_cat cat, void *p, size_t old_bytes, size_t new_bytes);
/* Free an allocation made here; bytes must be what was allocated. NULL is a no-op. */
void kvb_mem_free(kvb_mem *m, kvb_tier tier, kvb_mem_cat cat, void *p, size_t bytes);
/* Account memory not allocated here (e.g. a mapped weights file): delta may be negative. */
void kvb_mem_note(kvb_mem *m, kvb_tier tier, kvb_mem_cat cat, int64_t delta_bytes);
/* Count bytes copied between tiers. */
void kvb_mem_move(kvb_mem *m, kvb_tier from, kvb_tier to, int64_t bytes);
/* Current and peak bytes of (tier, cat); cat = KVB_MEM_COUNT means the whole tier. */
int64_t kvb_mem_current(kvb_mem *m, kvb_tier tier, kvb_mem_cat cat);
int64_t kvb_mem_peak(kvb_mem *m, kvb_tier tier, kvb_mem_cat cat);
/* Set every peak to the current value (e.g. at the start of decode). */
void kvb_mem_reset_peaks(kvb_mem *m);
/* Print a table in MiB. */
void kvb_mem_print(kvb_mem *m, FILE *out);
const char *kvb_tier_name(kvb_tier t);
const char *kvb_mem_cat_name(kvb_mem_cat c);

#endif
