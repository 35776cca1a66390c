/* evict_plan.c — the eviction by position of evict_plan.h: one sort of the candidates, then the loop's moves
 * replayed on a slot map (no row touched), then the final layout read off the map. */
#include "base/evict_plan.h"

#include <stdio.h>
#include <stdlib.h>

static int cmp_u64(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

int kvb_evict_plan(const int32_t *pos, int64_t n, int32_t lo, int32_t hi, int64_t count, int64_t *spill, int64_t *dst,
                   int64_t *src, int64_t *n_moves, char *err, size_t err_len) {
    *n_moves = 0;
    if (count <= 0) return 1;
    uint64_t *key = malloc((size_t)n * sizeof *key);
    int64_t *where = malloc((size_t)n * sizeof *where);
    int64_t *at = malloc((size_t)n * sizeof *at);
    int rc = 0;
    int64_t m = 0;
    if (!key || !where || !at) goto done;
    for (int64_t j = 0; j < n; j++) /* position above lo (below 2^32), then slot (below 2^32) */
        if (pos[j] >= lo && pos[j] < hi) key[m++] = (uint64_t)((int64_t)pos[j] - lo) << 32 | (uint64_t)j;
    qsort(key, (size_t)m, sizeof *key, cmp_u64);
    for (int64_t i = 1; i < m; i++)
        if (key[i] >> 32 == key[i - 1] >> 32) goto done; /* repeated positions: the loop decides by slot */
    if (m < count) {
        snprintf(err, err_len, "kv_evict: no slot with position in [%d, %d) among %lld (eviction %lld of %lld)", lo, hi,
                 (long long)(n - m), (long long)m + 1, (long long)count);
        rc = -1;
        goto done;
    }
    /* where[r]: the slot original row r sits in; at[s]: the original row slot s holds */
    for (int64_t j = 0; j < n; j++) where[j] = at[j] = j;
    for (int64_t c = 0, left = n; c < count; c++, left--) {
        const int64_t row = (int64_t)(key[c] & 0xffffffffu), victim = where[row], last = left - 1;
        spill[c] = row; /* a row only ever moves whole: the victim's row is its original one */
        if (victim != last) {
            at[victim] = at[last];
            where[at[victim]] = victim;
        }
    }
    /* a row moves only out of a last slot (>= n - count), so a slot below n - count holds its own row or one of those */
    for (int64_t s = 0; s < n - count; s++)
        if (at[s] != s) dst[*n_moves] = s, src[*n_moves] = at[s], ++*n_moves;
    rc = 1;
done:
    free(key), free(where), free(at);
    return rc;
}
