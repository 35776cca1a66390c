/* test_backend_ops.c — every data op (kernels/backend.h, "data ops") of every backend present against a
 * reference written here: exact integer/byte code for the moves, selections and indices, float64 for the
 * reductions. The CPU backend always; the CUDA backend when kvb_backend_cuda_create succeeds (else one line
 * says it was skipped). Memory an op reads or writes comes from the backend's allocator when it has one
 * (device tier; host tier where the header says host) and test data moves through the backend's own `copy`.
 *
 * Shapes are random per case (seeded): odd head_dim, GQA groups 1/3/4/7, f16 and f32 rows, empty and full
 * index sets, n = 0, ties and NaN in top-k (tie rule: the lower slot first, on every backend). Where the header
 * fixes a float summation order, the CPU backend is also held to that order bit for bit (the methods' results
 * rest on it); other backends are held to the float64 reference within a bound. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/dtype.h"
#include "util_common.h"

static kvb_backend *backends[2];
static int n_backends;

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static uint64_t rng_u64(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static int64_t rnd(int64_t n) { return n > 0 ? (int64_t)(rng_u64() % (uint64_t)n) : 0; } /* [0, n) */
static double unit(void) { return (double)(rng_u64() >> 11) * (1.0 / 9007199254740992.0); }

static int is_cpu(const kvb_backend *be) { return !strcmp(be->name, "cpu"); }

/* ---- backend memory: every block a case takes is released at its end ---- */

typedef struct {
    void *p;
    size_t bytes;
    kvb_tier tier;
} block;
static block blocks[256];
static int n_blocks;

static void *take(kvb_backend *be, kvb_tier tier, size_t bytes) {
    CU_ASSERT_FATAL(n_blocks < (int)(sizeof blocks / sizeof *blocks));
    if (!bytes) bytes = 4;
    void *p = be->allocator ? be->allocator->alloc(be->allocator->user, tier, bytes) : calloc(1, bytes);
    CU_ASSERT_FATAL(p != NULL);
    blocks[n_blocks++] = (block){p, bytes, tier};
    return p;
}

static void release_all(kvb_backend *be) {
    if (be->sync) be->sync(be);
    for (int i = 0; i < n_blocks; i++) {
        if (be->allocator) be->allocator->free(be->allocator->user, blocks[i].tier, blocks[i].p, blocks[i].bytes);
        else free(blocks[i].p);
    }
    n_blocks = 0;
}

static void *dev(kvb_backend *be, size_t bytes) { return take(be, KVB_TIER_DEVICE, bytes); }
static void *host(kvb_backend *be, size_t bytes) { return take(be, KVB_TIER_HOST, bytes); }

/* a device copy of host bytes */
static void *up(kvb_backend *be, const void *src, size_t bytes) {
    char err[256];
    void *d = dev(be, bytes);
    if (bytes) CU_ASSERT_FATAL(be->copy(be, d, src, bytes, KVB_COPY_H2D, err, sizeof err) == 0);
    return d;
}

/* device bytes into host memory, after the queue drains */
static void down(kvb_backend *be, void *dst, const void *src, size_t bytes) {
    char err[256];
    if (bytes) CU_ASSERT_FATAL(be->copy(be, dst, src, bytes, KVB_COPY_D2H, err, sizeof err) == 0);
    if (be->sync) CU_ASSERT_FATAL(be->sync(be) == 0);
}

static void fill_bytes(void *p, size_t bytes) {
    for (size_t i = 0; i < bytes; i++) ((uint8_t *)p)[i] = (uint8_t)rng_u64();
}

/* probabilities-like values: [0, 1) with some exact zeros, never subnormal */
static void fill_probs(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = rnd(7) == 0 ? 0.0f : (float)(unit() * 0.999 + 1e-6);
}

/* KV rows of dtype: random finite values (f16 rows through the f16 conversion) */
static void fill_rows(void *rows, int64_t n_el, kvb_dtype dt) {
    for (int64_t i = 0; i < n_el; i++) {
        float x = (float)(unit() * 4 - 2);
        if (dt == KVB_F16) ((kvb_f16 *)rows)[i] = kvb_f32_to_f16(x);
        else ((float *)rows)[i] = x;
    }
}

static size_t elt(kvb_dtype dt) { return dt == KVB_F16 ? 2 : 4; }
static const int head_dims[] = {1, 3, 17, 64, 67, 128};
static const int groups[] = {1, 3, 4, 7};
#define COUNT(a) ((int)(sizeof(a) / sizeof *(a)))
#define EACH_BACKEND(be) for (int bi_ = 0; bi_ < n_backends; bi_++) for (kvb_backend *be = backends[bi_]; be; be = NULL)

/* ---- copy, zero ---- */

static void check_copy_zero(kvb_backend *be, size_t bytes) {
    char err[256];
    uint8_t *src = malloc(bytes + 1), *ref = malloc(bytes + 1), *got = malloc(bytes + 1);
    fill_bytes(src, bytes);
    kvb_traffic t0 = be->traffic;
    uint8_t *d = up(be, src, bytes);
    CU_ASSERT(be->traffic.n[KVB_COPY_H2D] - t0.n[KVB_COPY_H2D] == (bytes ? 1 : 0));
    CU_ASSERT(be->traffic.bytes[KVB_COPY_H2D] - t0.bytes[KVB_COPY_H2D] == (int64_t)bytes);
    uint8_t *d2 = dev(be, bytes);
    t0 = be->traffic;
    CU_ASSERT(be->copy(be, d2, d, bytes, KVB_COPY_D2D, err, sizeof err) == 0);
    CU_ASSERT(be->traffic.n[KVB_COPY_D2D] - t0.n[KVB_COPY_D2D] == (bytes ? 1 : 0));
    CU_ASSERT(be->traffic.bytes[KVB_COPY_D2D] - t0.bytes[KVB_COPY_D2D] == (int64_t)bytes);
    memcpy(ref, src, bytes);
    if (bytes > 1) { /* overlapping D2D both ways, like memmove */
        size_t sh = 1 + (size_t)rnd((int64_t)bytes - 1), len = bytes - sh;
        CU_ASSERT(be->copy(be, d2 + sh, d2, len, KVB_COPY_D2D, err, sizeof err) == 0);
        memmove(ref + sh, ref, len);
        CU_ASSERT(be->copy(be, d2, d2 + sh / 2 + 1, bytes - sh / 2 - 1, KVB_COPY_D2D, err, sizeof err) == 0);
        memmove(ref, ref + sh / 2 + 1, bytes - sh / 2 - 1);
    }
    t0 = be->traffic;
    down(be, got, d2, bytes);
    CU_ASSERT(be->traffic.n[KVB_COPY_D2H] - t0.n[KVB_COPY_D2H] == (bytes ? 1 : 0));
    CU_ASSERT(memcmp(got, ref, bytes) == 0);
    size_t z0 = bytes ? (size_t)rnd((int64_t)bytes) : 0;
    CU_ASSERT(be->zero(be, d2 + z0, bytes - z0, err, sizeof err) == 0);
    memset(ref + z0, 0, bytes - z0);
    down(be, got, d2, bytes);
    CU_ASSERT(memcmp(got, ref, bytes) == 0);
    free(src), free(ref), free(got);
    release_all(be);
}

static void test_copy_and_zero_move_exact_bytes_overlap_like_memmove_and_count_traffic(void) {
    const size_t sizes[] = {0, 1, 2, 7, 4099, 100000};
    EACH_BACKEND(be) for (int i = 0; i < COUNT(sizes); i++) check_copy_zero(be, sizes[i]);
}

/* ---- kv_gather ---- */

typedef struct { /* a KV head as host arrays */
    uint8_t *k, *v;
    int32_t *pos, *round;
} host_head;

static host_head head_alloc(int64_t n, size_t rb) {
    host_head h = {malloc((size_t)n * rb + 1), malloc((size_t)n * rb + 1), malloc((size_t)n * 4 + 4), malloc((size_t)n * 4 + 4)};
    return h;
}
static void head_free(host_head *h) { free(h->k), free(h->v), free(h->pos), free(h->round); }

/* the backend's copy of a host head in a tier (host tier: written directly, as host code may) */
static kvb_kv_head head_put(kvb_backend *be, const host_head *h, int64_t n, size_t rb, kvb_tier tier) {
    if (tier == KVB_TIER_HOST) {
        kvb_kv_head d = {host(be, (size_t)n * rb), host(be, (size_t)n * rb), host(be, (size_t)n * 4), host(be, (size_t)n * 4)};
        memcpy(d.k, h->k, (size_t)n * rb), memcpy(d.v, h->v, (size_t)n * rb);
        memcpy(d.pos, h->pos, (size_t)n * 4), memcpy(d.round, h->round, (size_t)n * 4);
        return d;
    }
    kvb_kv_head d = {up(be, h->k, (size_t)n * rb), up(be, h->v, (size_t)n * rb), up(be, h->pos, (size_t)n * 4),
                     up(be, h->round, (size_t)n * 4)};
    return d;
}

static void head_get(kvb_backend *be, host_head *h, const kvb_kv_head *d, int64_t n, size_t rb, kvb_tier tier) {
    if (tier == KVB_TIER_HOST) {
        if (be->sync) CU_ASSERT_FATAL(be->sync(be) == 0);
        memcpy(h->k, d->k, (size_t)n * rb), memcpy(h->v, d->v, (size_t)n * rb);
        memcpy(h->pos, d->pos, (size_t)n * 4), memcpy(h->round, d->round, (size_t)n * 4);
        return;
    }
    down(be, h->k, d->k, (size_t)n * rb), down(be, h->v, d->v, (size_t)n * rb);
    down(be, h->pos, d->pos, (size_t)n * 4), down(be, h->round, d->round, (size_t)n * 4);
}

static void head_random(host_head *h, int64_t n, size_t rb) {
    fill_bytes(h->k, (size_t)n * rb), fill_bytes(h->v, (size_t)n * rb);
    for (int64_t i = 0; i < n; i++) h->pos[i] = (int32_t)rnd(1 << 20), h->round[i] = (int32_t)rnd(9) - 1;
}

static int heads_equal(const host_head *a, const host_head *b, int64_t n, size_t rb) {
    return !memcmp(a->k, b->k, (size_t)n * rb) && !memcmp(a->v, b->v, (size_t)n * rb) &&
           !memcmp(a->pos, b->pos, (size_t)n * 4) && !memcmp(a->round, b->round, (size_t)n * 4);
}

/* idx kinds: 0 NULL (slots 0..n-1), 1 empty, 2 full set in random order, 3 random slots with repeats */
static void check_kv_gather(kvb_backend *be, kvb_copy_dir dir, size_t rb, int kind) {
    char err[256];
    int64_t n_src = kind == 1 ? rnd(5) : 1 + rnd(60), n;
    int32_t *idx = malloc((size_t)(2 * n_src + 1) * 4);
    if (kind == 0) n = rnd(n_src + 1);
    else if (kind == 1) n = 0;
    else if (kind == 2) {
        n = n_src;
        for (int64_t i = 0; i < n; i++) idx[i] = (int32_t)i;
        for (int64_t i = n - 1; i > 0; i--) {
            int64_t j = rnd(i + 1);
            int32_t t = idx[i]; idx[i] = idx[j]; idx[j] = t;
        }
    } else {
        n = rnd(2 * n_src + 1);
        for (int64_t i = 0; i < n; i++) idx[i] = (int32_t)rnd(n_src);
    }
    const int64_t off = rnd(5), n_dst = off + n + rnd(4);
    host_head src = head_alloc(n_src, rb), dst = head_alloc(n_dst, rb), ref = head_alloc(n_dst, rb), got = head_alloc(n_dst, rb);
    head_random(&src, n_src, rb);
    head_random(&dst, n_dst, rb);
    memcpy(ref.k, dst.k, (size_t)n_dst * rb), memcpy(ref.v, dst.v, (size_t)n_dst * rb);
    memcpy(ref.pos, dst.pos, (size_t)n_dst * 4), memcpy(ref.round, dst.round, (size_t)n_dst * 4);
    for (int64_t i = 0; i < n; i++) {
        const int64_t s = kind == 0 ? i : idx[i];
        memcpy(ref.k + (off + i) * rb, src.k + s * rb, rb);
        memcpy(ref.v + (off + i) * rb, src.v + s * rb, rb);
        ref.pos[off + i] = src.pos[s];
        ref.round[off + i] = src.round[s];
    }
    const kvb_tier st = dir == KVB_COPY_H2D ? KVB_TIER_HOST : KVB_TIER_DEVICE;
    const kvb_tier dt = dir == KVB_COPY_D2H ? KVB_TIER_HOST : KVB_TIER_DEVICE;
    kvb_kv_head s = head_put(be, &src, n_src, rb, st), d = head_put(be, &dst, n_dst, rb, dt);
    const int32_t *ix = kind == 0 ? NULL : dir == KVB_COPY_D2D ? up(be, idx, (size_t)n * 4) : idx;
    kvb_traffic t0 = be->traffic;
    CU_ASSERT(be->kv_gather(be, &d, off, &s, ix, n, rb, dir, err, sizeof err) == 0);
    const int64_t packed = n * (int64_t)(2 * rb + 8);
    CU_ASSERT(be->traffic.n[dir] - t0.n[dir] == (n ? 4 : 0));
    /* a GPU brings a D2H index list's span of slots over (min..max: fewer rows than the list where it repeats
     * slots, more where it skips) and counts what crossed: exactly the span's bytes */
    const int64_t moved = be->traffic.bytes[dir] - t0.bytes[dir];
    int64_t expect = packed;
    if (dir == KVB_COPY_D2H && kind != 0 && n && !is_cpu(be)) {
        int32_t lo = idx[0], hi = idx[0];
        for (int64_t i = 1; i < n; i++) lo = idx[i] < lo ? idx[i] : lo, hi = idx[i] > hi ? idx[i] : hi;
        expect = ((int64_t)hi - lo + 1) * (int64_t)(2 * rb + 8);
    }
    CU_ASSERT(moved == expect);
    for (int o = 0; o < KVB_COPY_DIRS; o++)
        if (o != (int)dir) CU_ASSERT(be->traffic.n[o] == t0.n[o]);
    head_get(be, &got, &d, n_dst, rb, dt);
    CU_ASSERT(heads_equal(&got, &ref, n_dst, rb));
    head_free(&src), head_free(&dst), head_free(&ref), head_free(&got);
    free(idx);
    release_all(be);
}

/* kv_load: up to 6 heads, each with its own index list kind (as check_kv_gather's) or none at all (lists NULL) */
static void check_kv_load(kvb_backend *be, size_t rb, int no_lists) {
    char err[256];
    enum { MAXH = 6 };
    const int nh = 1 + (int)rnd(MAXH);
    host_head src[MAXH], dst[MAXH], ref[MAXH], got[MAXH];
    kvb_kv_head s[MAXH], d[MAXH];
    int32_t *idx[MAXH];
    int64_t n[MAXH], off[MAXH], n_src[MAXH], n_dst[MAXH], packed = 0;
    for (int j = 0; j < nh; j++) {
        const int kind = no_lists ? 0 : (int)rnd(4);
        n_src[j] = kind == 1 ? rnd(5) : 1 + rnd(60);
        idx[j] = malloc((size_t)(2 * n_src[j] + 1) * 4);
        if (kind == 0) n[j] = rnd(n_src[j] + 1);
        else if (kind == 1) n[j] = 0;
        else if (kind == 2) {
            n[j] = n_src[j];
            for (int64_t i = 0; i < n[j]; i++) idx[j][i] = (int32_t)i;
            for (int64_t i = n[j] - 1; i > 0; i--) {
                int64_t k = rnd(i + 1);
                int32_t t = idx[j][i]; idx[j][i] = idx[j][k]; idx[j][k] = t;
            }
        } else {
            n[j] = rnd(2 * n_src[j] + 1);
            for (int64_t i = 0; i < n[j]; i++) idx[j][i] = (int32_t)rnd(n_src[j]);
        }
        if (kind == 0)
            for (int64_t i = 0; i < n[j]; i++) idx[j][i] = (int32_t)i; /* the same as no list */
        off[j] = rnd(5), n_dst[j] = off[j] + n[j] + rnd(4);
        src[j] = head_alloc(n_src[j], rb), dst[j] = head_alloc(n_dst[j], rb), ref[j] = head_alloc(n_dst[j], rb),
        got[j] = head_alloc(n_dst[j], rb);
        head_random(&src[j], n_src[j], rb);
        head_random(&dst[j], n_dst[j], rb);
        memcpy(ref[j].k, dst[j].k, (size_t)n_dst[j] * rb), memcpy(ref[j].v, dst[j].v, (size_t)n_dst[j] * rb);
        memcpy(ref[j].pos, dst[j].pos, (size_t)n_dst[j] * 4), memcpy(ref[j].round, dst[j].round, (size_t)n_dst[j] * 4);
        for (int64_t i = 0; i < n[j]; i++) {
            const int64_t x = idx[j][i];
            memcpy(ref[j].k + (off[j] + i) * rb, src[j].k + x * rb, rb);
            memcpy(ref[j].v + (off[j] + i) * rb, src[j].v + x * rb, rb);
            ref[j].pos[off[j] + i] = src[j].pos[x];
            ref[j].round[off[j] + i] = src[j].round[x];
        }
        s[j] = head_put(be, &src[j], n_src[j], rb, KVB_TIER_HOST);
        d[j] = head_put(be, &dst[j], n_dst[j], rb, KVB_TIER_DEVICE);
        packed += n[j] * (int64_t)(2 * rb + 8);
    }
    kvb_traffic t0 = be->traffic;
    CU_ASSERT(be->kv_load(be, nh, d, off, s, no_lists ? NULL : (const int32_t *const *)idx, n, rb, err, sizeof err) == 0);
    CU_ASSERT(be->traffic.n[KVB_COPY_H2D] - t0.n[KVB_COPY_H2D] == (packed ? 1 : 0));
    const int64_t moved = be->traffic.bytes[KVB_COPY_H2D] - t0.bytes[KVB_COPY_H2D];
    CU_ASSERT(is_cpu(be) ? moved == packed : moved >= packed); /* a GPU also counts the index lists it sends */
    CU_ASSERT(be->traffic.n[KVB_COPY_D2H] == t0.n[KVB_COPY_D2H] && be->traffic.n[KVB_COPY_D2D] == t0.n[KVB_COPY_D2D]);
    for (int j = 0; j < nh; j++) {
        head_get(be, &got[j], &d[j], n_dst[j], rb, KVB_TIER_DEVICE);
        CU_ASSERT(heads_equal(&got[j], &ref[j], n_dst[j], rb));
        head_free(&src[j]), head_free(&dst[j]), head_free(&ref[j]), head_free(&got[j]);
        free(idx[j]);
    }
    release_all(be);
}

static void test_kv_load_brings_many_heads_up_in_one_counted_copy(void) {
    char err[256];
    EACH_BACKEND(be) {
        for (int rep = 0; rep < 24; rep++)
            for (int hd = 0; hd < COUNT(head_dims); hd++) for (int dt = 0; dt < 2; dt++)
                check_kv_load(be, (size_t)head_dims[hd] * elt((kvb_dtype)dt), rep % 4 == 3);
        /* bad input: a negative row count or index is refused before anything moves */
        int64_t bad_n = -1, zero = 0;
        kvb_kv_head h = {0};
        CU_ASSERT(be->kv_load(be, 1, &h, &zero, &h, NULL, &bad_n, 64, err, sizeof err) == -1 && strstr(err, "kv_load"));
    }
}

static void test_kv_gather_copies_index_sets_in_every_direction_and_counts_each_array(void) {
    EACH_BACKEND(be) for (int dir = 0; dir < KVB_COPY_DIRS; dir++) for (int kind = 0; kind < 4; kind++)
        for (int hd = 0; hd < COUNT(head_dims); hd++) for (int dt = 0; dt < 2; dt++)
            check_kv_gather(be, (kvb_copy_dir)dir, (size_t)head_dims[hd] * elt((kvb_dtype)dt), kind);
}

/* ---- kv_evict ---- */

/* the reference picks the victim scanning from the last slot down (<=: the lowest slot wins a tie) */
static int64_t ref_victim(const host_head *h, const float *score, int64_t n, int32_t lo, int32_t hi) {
    int64_t victim = -1;
    for (int64_t j = n - 1; j >= 0; j--) {
        if (h->pos[j] < lo || h->pos[j] >= hi) continue;
        if (victim < 0 || (score ? score[j] <= score[victim] : h->pos[j] <= h->pos[victim])) victim = j;
    }
    return victim;
}

static void check_kv_evict(kvb_backend *be, kvb_dtype dt, int head_dim, int with_score, int with_spill) {
    char err[256];
    const size_t rb = (size_t)head_dim * elt(dt);
    const int64_t n = rnd(70);
    host_head h = head_alloc(n, rb), got = head_alloc(n, rb);
    fill_rows(h.k, n * head_dim, dt), fill_rows(h.v, n * head_dim, dt);
    const int repeat = rnd(4) == 0; /* now and then positions shared by two slots: ties by slot */
    for (int64_t i = 0; i < n; i++) h.pos[i] = (int32_t)(repeat ? i / 2 : i) * 3 + 100, h.round[i] = (int32_t)rnd(5);
    for (int64_t i = n - 1; i > 0; i--) { /* positions in slot order as evictions leave them */
        int64_t j = rnd(i + 1);
        int32_t t = h.pos[i]; h.pos[i] = h.pos[j]; h.pos[j] = t;
    }
    float *score = malloc((size_t)n * 4 + 4), *score_got = malloc((size_t)n * 4 + 4);
    for (int64_t i = 0; i < n; i++) score[i] = (float)rnd(6) * 0.125f; /* few levels: ties */
    int32_t lo = 100 + (int32_t)rnd(40), hi = rnd(3) ? INT32_MAX : lo + (int32_t)rnd(3 * n + 1);
    int64_t cand = 0;
    for (int64_t i = 0; i < n; i++) cand += h.pos[i] >= lo && h.pos[i] < hi;
    const int64_t count = rnd(2) ? cand : rnd(cand + 1);
    kvb_kv_head d = head_put(be, &h, n, rb, KVB_TIER_DEVICE);
    float *dscore = with_score ? up(be, score, (size_t)n * 4) : NULL;
    uint8_t *dspill = with_spill ? dev(be, (size_t)count * rb) : NULL;
    CU_ASSERT(be->kv_evict(be, &d, n, rb, dscore, lo, hi, count, dspill, err, sizeof err) == 0);
    uint8_t *spill_ref = malloc((size_t)count * rb + 1), *spill_got = malloc((size_t)count * rb + 1);
    int64_t m = n;
    for (int64_t c = 0; c < count; c++, m--) {
        const int64_t v = ref_victim(&h, with_score ? score : NULL, m, lo, hi), last = m - 1;
        CU_ASSERT_FATAL(v >= 0);
        memcpy(spill_ref + c * rb, h.v + v * rb, rb);
        memcpy(h.k + v * rb, h.k + last * rb, rb), memcpy(h.v + v * rb, h.v + last * rb, rb);
        h.pos[v] = h.pos[last], h.round[v] = h.round[last], score[v] = score[last];
    }
    head_get(be, &got, &d, m, rb, KVB_TIER_DEVICE);
    CU_ASSERT(heads_equal(&got, &h, m, rb));
    if (with_score) {
        down(be, score_got, dscore, (size_t)m * 4);
        CU_ASSERT(memcmp(score_got, score, (size_t)m * 4) == 0);
    }
    if (with_spill) {
        down(be, spill_got, dspill, (size_t)count * rb);
        CU_ASSERT(memcmp(spill_got, spill_ref, (size_t)count * rb) == 0);
    }
    if (is_cpu(be)) { /* one eviction more than there are candidates left: a violation the CPU reports */
        const int64_t left = cand - count, k = rnd(2) ? 1 : left + 1;
        err[0] = 0;
        CU_ASSERT(be->kv_evict(be, &d, m, rb, dscore, lo, hi, k, NULL, err, sizeof err) == (k > left ? -1 : 0));
        CU_ASSERT(k <= left || err[0]);
    }
    head_free(&h), head_free(&got);
    free(score), free(score_got), free(spill_ref), free(spill_got);
    release_all(be);
}

static void test_kv_evict_removes_lowest_key_in_window_ties_to_lower_slot_and_spills_v(void) {
    EACH_BACKEND(be) for (int rep = 0; rep < 6; rep++) for (int hd = 0; hd < COUNT(head_dims); hd++)
        for (int dt = 0; dt < 2; dt++) for (int sc = 0; sc < 2; sc++)
            check_kv_evict(be, (kvb_dtype)dt, head_dims[hd], sc, (int)rnd(2));
}

/* ---- probs_reduce ---- */

static void check_probs_reduce(kvb_backend *be, int mode, int HK, int G, int64_t n_q, int64_t n, int accumulate, int weighted) {
    char err[256];
    const int H = HK * G;
    const int64_t stride = n + rnd(3), out_stride = n + 1 + rnd(3), out_rows = mode == KVB_REDUCE_GROUP_SUM ? HK : 1;
    const int64_t np = (int64_t)H * n_q * stride, no = out_rows * out_stride;
    float *p = malloc((size_t)np * 4 + 4), *out0 = malloc((size_t)no * 4 + 4), *got = malloc((size_t)no * 4 + 4);
    float *exact = malloc((size_t)no * 4 + 4);
    double *w = malloc((size_t)n_q * 8 + 8);
    fill_probs(p, np);
    fill_probs(out0, no);
    const int exp_selector = (int)rnd(2); /* OmniKV's `exp` weights, or any */
    for (int64_t t = 0; t < n_q; t++) w[t] = exp_selector ? pow(2.0, (double)(t + 1 - n_q)) : 0.1 + unit();
    const double *wt = weighted ? w : NULL;
    float *dout = up(be, out0, (size_t)no * 4);
    CU_ASSERT(be->probs_reduce(be, dout, out_stride, up(be, p, (size_t)np * 4), stride, H, HK, n_q, n, wt, mode, accumulate,
                               err, sizeof err) == 0);
    down(be, got, dout, (size_t)no * 4);
    memcpy(exact, out0, (size_t)no * 4);
    for (int64_t o = 0; o < out_rows; o++)
        for (int64_t j = 0; j < n; j++) {
            double ref = accumulate ? out0[o * out_stride + j] : 0, mag = fabs(ref);
            float e = accumulate ? out0[o * out_stride + j] : 0.0f; /* the header's float order */
            if (mode == KVB_REDUCE_GROUP_SUM) {
                for (int r = 0; r < G; r++)
                    for (int64_t t = 0; t < n_q; t++) {
                        const float x = p[((o * G + r) * n_q + t) * stride + j];
                        ref += x, mag += x, e += x;
                    }
            } else {
                for (int64_t t = 0; t < n_q; t++) {
                    double mx = 0;
                    for (int h = 0; h < H; h++) mx = fmax(mx, p[((int64_t)h * n_q + t) * stride + j]);
                    ref += (wt ? wt[t] : 1.0) * mx, mag += (wt ? wt[t] : 1.0) * mx;
                    e += (float)((wt ? wt[t] : 1.0) * (float)mx);
                }
            }
            exact[o * out_stride + j] = e;
            CU_ASSERT(fabs(got[o * out_stride + j] - ref) <= 1e-6 * (double)(G * n_q + 1) * mag + 1e-30);
        }
    for (int64_t o = 0; o < out_rows; o++) /* columns n.. untouched */
        CU_ASSERT(!memcmp(got + o * out_stride + n, out0 + o * out_stride + n, (size_t)(out_stride - n) * 4));
    if (is_cpu(be)) CU_ASSERT(memcmp(got, exact, (size_t)no * 4) == 0);
    free(p), free(out0), free(got), free(exact), free(w);
    release_all(be);
}

static void test_probs_reduce_group_sum_and_max_heads_match_f64_and_cpu_keeps_the_float_order(void) {
    const int64_t ns[] = {0, 1, 13, 300};
    EACH_BACKEND(be) for (int gi = 0; gi < COUNT(groups); gi++) for (int HK = 1; HK <= 3; HK++)
        for (int ni = 0; ni < COUNT(ns); ni++) for (int acc = 0; acc < 2; acc++) {
            check_probs_reduce(be, KVB_REDUCE_GROUP_SUM, HK, groups[gi], 1 + rnd(5), ns[ni], acc, 0);
            check_probs_reduce(be, KVB_REDUCE_MAX_HEADS, HK, groups[gi], 1 + rnd(5), ns[ni], acc, (int)rnd(2));
        }
}

/* ---- pool1d ---- */

static void check_pool1d(kvb_backend *be, int64_t rows, int64_t n, int64_t kernel, int avg) {
    char err[256];
    const int64_t in_stride = n + rnd(3), out_stride = n + rnd(3);
    float *in = malloc((size_t)(rows * in_stride) * 4 + 4), *got = malloc((size_t)(rows * out_stride) * 4 + 4);
    for (int64_t i = 0; i < rows * in_stride; i++) in[i] = (float)(unit() * 2 - 0.5);
    float *dout = dev(be, (size_t)(rows * out_stride) * 4);
    CU_ASSERT(be->pool1d(be, dout, out_stride, up(be, in, (size_t)(rows * in_stride) * 4), in_stride, rows, n, kernel, avg,
                         err, sizeof err) == 0);
    down(be, got, dout, (size_t)(rows * out_stride) * 4);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < n; i++) {
            double mx = -INFINITY, sum = 0, mag = 0;
            for (int64_t j = i - kernel / 2; j <= i + kernel / 2; j++)
                if (j >= 0 && j < n) mx = fmax(mx, in[r * in_stride + j]), sum += in[r * in_stride + j], mag += fabs(in[r * in_stride + j]);
            const float g = got[r * out_stride + i];
            CU_ASSERT(avg ? fabs(g - sum / (double)kernel) <= 1e-6 * mag / (double)kernel + 1e-30 : g == (float)mx);
            if (is_cpu(be) && avg) CU_ASSERT(g == (float)(sum / (double)kernel)); /* sum: double, in order */
        }
    free(in), free(got);
    release_all(be);
}

static void test_pool1d_max_is_exact_and_avg_counts_the_padding(void) {
    const int64_t ns[] = {0, 1, 2, 7, 50}, kernels[] = {1, 3, 7, 9};
    EACH_BACKEND(be) for (int ni = 0; ni < COUNT(ns); ni++) for (int ki = 0; ki < COUNT(kernels); ki++)
        for (int avg = 0; avg < 2; avg++) check_pool1d(be, 1 + rnd(3), ns[ni], kernels[ki], avg);
}

/* ---- topk_idx, iota, gather_f32 ---- */

/* slot a ranks before slot b: larger value, NaN below every number, then the lower slot */
static int ranks_before(const float *x, int64_t a, int64_t b) {
    if (isnan(x[a]) != isnan(x[b])) return isnan(x[b]);
    if (!isnan(x[a]) && x[a] != x[b]) return x[a] > x[b];
    return a < b;
}

static void check_topk(kvb_backend *be, int64_t n, int64_t k) {
    char err[256];
    float *x = malloc((size_t)n * 4 + 4);
    for (int64_t i = 0; i < n; i++) {
        const int64_t c = rnd(20);
        x[i] = c == 0 ? NAN : c == 1 ? INFINITY : c == 2 ? -INFINITY : (float)rnd(8) * 0.25f; /* ties galore */
    }
    const int64_t kk = k < 0 ? 0 : k > n ? n : k;
    int32_t *ref = malloc((size_t)n * 4 + 4), *got = malloc((size_t)(kk + 1) * 4);
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t rank = 0;
        for (int64_t j = 0; j < n; j++) rank += ranks_before(x, j, i);
        if (rank < kk) ref[m++] = (int32_t)i;
    }
    CU_ASSERT_FATAL(m == kk);
    const int32_t sentinel = -77;
    for (int64_t i = 0; i <= kk; i++) got[i] = sentinel;
    int32_t *didx = up(be, got, (size_t)(kk + 1) * 4);
    CU_ASSERT(be->topk_idx(be, didx, up(be, x, (size_t)n * 4), n, k, err, sizeof err) == 0);
    down(be, got, didx, (size_t)(kk + 1) * 4);
    CU_ASSERT(memcmp(got, ref, (size_t)kk * 4) == 0);
    CU_ASSERT(got[kk] == sentinel); /* writes exactly min(k, n) */
    free(x), free(ref), free(got);
    release_all(be);
}

static void test_topk_idx_is_the_k_largest_in_slot_order_ties_to_lower_slot_nan_last(void) {
    const int64_t ns[] = {0, 1, 5, 64, 1000, 3001};
    EACH_BACKEND(be) for (int ni = 0; ni < COUNT(ns); ni++) {
        const int64_t n = ns[ni], ks[] = {-1, 0, 1, n / 3, n - 1, n, n + 5};
        for (int ki = 0; ki < COUNT(ks); ki++) check_topk(be, n, ks[ki]);
    }
}

static void test_iota_and_gather_f32_are_exact(void) {
    char err[256];
    const int64_t ns[] = {0, 1, 33, 5000};
    EACH_BACKEND(be) for (int ni = 0; ni < COUNT(ns); ni++) {
        const int64_t n = ns[ni], n_src = n + 3;
        const int32_t start = (int32_t)rnd(100000) - 500;
        int32_t *idx = malloc((size_t)n * 4 + 4), *ref = malloc((size_t)n * 4 + 4);
        float *src = malloc((size_t)n_src * 4), *got = malloc((size_t)n * 4 + 4);
        int32_t *didx = dev(be, (size_t)n * 4);
        CU_ASSERT(be->iota(be, didx, start, n, err, sizeof err) == 0);
        down(be, idx, didx, (size_t)n * 4);
        for (int64_t i = 0; i < n; i++) ref[i] = start + (int32_t)i;
        CU_ASSERT(memcmp(idx, ref, (size_t)n * 4) == 0);
        for (int64_t i = 0; i < n_src; i++) src[i] = (float)unit();
        for (int64_t i = 0; i < n; i++) idx[i] = (int32_t)rnd(n_src);
        float *dg = dev(be, (size_t)n * 4);
        CU_ASSERT(be->gather_f32(be, dg, up(be, src, (size_t)n_src * 4), up(be, idx, (size_t)n * 4), n, err, sizeof err) == 0);
        down(be, got, dg, (size_t)n * 4);
        int same = 1;
        for (int64_t i = 0; i < n; i++) same &= got[i] == src[idx[i]];
        CU_ASSERT(same);
        free(idx), free(ref), free(src), free(got);
        release_all(be);
    }
}

/* ---- round_scores ---- */

static void check_round_scores(kvb_backend *be, int HK, int G, int64_t n_q) {
    char err[256];
    const int H = HK * G, n_round = 1 + (int)rnd(8);
    const int32_t skip = (int32_t)rnd(n_round + 1);
    int64_t n[8], stride = 0;
    int32_t *rounds[8];
    const int32_t *drounds[8];
    for (int g = 0; g < HK; g++) {
        n[g] = rnd(4) == 0 ? 0 : rnd(60);
        stride = n[g] > stride ? n[g] : stride;
        rounds[g] = malloc((size_t)n[g] * 4 + 4);
        for (int64_t j = 0; j < n[g]; j++) rounds[g][j] = (int32_t)rnd(n_round + 3) - 1; /* some out of range */
        drounds[g] = up(be, rounds[g], (size_t)n[g] * 4);
    }
    stride += rnd(3);
    const int64_t np = (int64_t)H * n_q * stride;
    float *p = malloc((size_t)np * 4 + 4);
    fill_probs(p, np);
    double out0[8] = {0}, ref[8], got[8];
    int32_t present0[8] = {0}, present_ref[8], present_got[8];
    for (int r = 0; r < n_round; r++) out0[r] = ref[r] = unit(), present0[r] = present_ref[r] = (int32_t)rnd(2);
    double *dout = up(be, out0, sizeof out0);
    int32_t *dpresent = up(be, present0, sizeof present0);
    CU_ASSERT(be->round_scores(be, dout, dpresent, n_round, up(be, p, (size_t)np * 4), stride, H, HK, n_q, drounds, n, skip,
                               err, sizeof err) == 0);
    down(be, got, dout, (size_t)n_round * 8);
    down(be, present_got, dpresent, (size_t)n_round * 4);
    for (int g = 0; g < HK; g++)
        for (int r = 0; r < G; r++)
            for (int64_t t = 0; t < n_q; t++)
                for (int64_t j = 0; j < n[g]; j++) {
                    const int32_t rd = rounds[g][j];
                    if (rd < 0 || rd >= n_round || rd == skip) continue;
                    ref[rd] += p[((int64_t)(g * G + r) * n_q + t) * stride + j];
                    present_ref[rd] = 1;
                }
    for (int r = 0; r < n_round; r++) CU_ASSERT(fabs(got[r] - ref[r]) <= 1e-12 * (fabs(ref[r]) + 1));
    if (is_cpu(be)) CU_ASSERT(memcmp(got, ref, (size_t)n_round * 8) == 0); /* ref: the header's order */
    CU_ASSERT(memcmp(present_got, present_ref, (size_t)n_round * 4) == 0);
    for (int g = 0; g < HK; g++) free(rounds[g]);
    free(p);
    release_all(be);
}

static void test_round_scores_sum_each_rounds_attention_and_mark_it_present(void) {
    EACH_BACKEND(be) for (int rep = 0; rep < 8; rep++) for (int gi = 0; gi < COUNT(groups); gi++)
        check_round_scores(be, 1 + (int)rnd(3), groups[gi], 1 + rnd(4));
}

/* ---- PoD: pod_share, pod_merge ---- */

static void check_pod_share(kvb_backend *be, int H, int64_t first, int64_t n_dist) {
    char err[256];
    const int64_t stride = first + n_dist + rnd(3), pd_stride = n_dist + rnd(3);
    unsigned char is_base[16];
    float *p = malloc((size_t)(H * stride) * 4 + 4), *pd0 = malloc((size_t)(H * pd_stride) * 4 + 4);
    float *pd = malloc((size_t)(H * pd_stride) * 4 + 4), lse_p[16] = {0}, lse0[16] = {0}, lse[16];
    fill_probs(p, H * stride);
    fill_probs(pd0, H * pd_stride);
    for (int h = 0; h < H; h++) {
        is_base[h] = (unsigned char)rnd(2);
        lse_p[h] = (float)(unit() * 20 - 10);
        lse0[h] = 123.0f;
        if (rnd(4) == 0) memset(p + h * stride + first, 0, (size_t)n_dist * 4); /* no distant mass */
    }
    float *dpd = up(be, pd0, (size_t)(H * pd_stride) * 4), *dlse = up(be, lse0, sizeof lse0);
    CU_ASSERT(be->pod_share(be, dpd, pd_stride, dlse, up(be, p, (size_t)(H * stride) * 4), stride, up(be, lse_p, sizeof lse_p),
                            H, is_base, first, n_dist, err, sizeof err) == 0);
    down(be, pd, dpd, (size_t)(H * pd_stride) * 4);
    down(be, lse, dlse, sizeof lse);
    for (int h = 0; h < H; h++) {
        if (!is_base[h]) {
            CU_ASSERT(lse[h] == 123.0f && !memcmp(pd + h * pd_stride, pd0 + h * pd_stride, (size_t)pd_stride * 4));
            continue;
        }
        double m = 0;
        for (int64_t i = 0; i < n_dist; i++) m += p[h * stride + first + i];
        const float inv = m > 0 ? (float)(1.0 / m) : 0.0f; /* the header's float steps, for the CPU */
        for (int64_t i = 0; i < n_dist; i++) {
            const double ref = m > 0 ? p[h * stride + first + i] / m : 0;
            CU_ASSERT(fabs(pd[h * pd_stride + i] - ref) <= 1e-6 * ref);
            if (is_cpu(be)) CU_ASSERT(pd[h * pd_stride + i] == p[h * stride + first + i] * inv);
        }
        if (is_cpu(be)) CU_ASSERT(lse[h] == (m > 0 ? (float)(lse_p[h] + log(m)) : -INFINITY));
        CU_ASSERT(m > 0 ? fabs(lse[h] - (lse_p[h] + log(m))) <= 1e-6 * (fabs(lse_p[h] + log(m)) + 1) : lse[h] == -INFINITY);
    }
    free(p), free(pd0), free(pd);
    release_all(be);
}

static void test_pod_share_normalises_base_heads_distant_mass_and_leaves_others(void) {
    const int64_t ns[] = {0, 1, 37, 300};
    EACH_BACKEND(be) for (int ni = 0; ni < COUNT(ns); ni++) for (int H = 1; H <= 16; H += 5)
        check_pod_share(be, H, rnd(2) ? 16 : 0, ns[ni]);
}

static void check_pod_merge(kvb_backend *be, int G, int head_dim, int64_t n_dist, kvb_dtype dt, double tau) {
    char err[256];
    const int64_t pd_stride = n_dist + rnd(3);
    float lse_p[8] = {0}, lse_d[8] = {0};
    for (int r = 0; r < G; r++) { /* gates far from 0.5, and now and then no distant part (lse_d = -inf) */
        lse_p[r] = (float)(unit() * 10 - 5);
        lse_d[r] = rnd(5) == 0 ? -INFINITY : lse_p[r] + (float)(rnd(2) ? 1 + unit() * 3 : -1 - unit() * 3);
    }
    float *pd = malloc((size_t)(G * pd_stride) * 4 + 4), *out0 = malloc((size_t)G * head_dim * 4);
    float *got = malloc((size_t)G * head_dim * 4);
    uint8_t *v = malloc((size_t)n_dist * head_dim * elt(dt) + 1);
    fill_probs(pd, G * pd_stride);
    fill_rows(v, n_dist * head_dim, dt);
    for (int64_t i = 0; i < (int64_t)G * head_dim; i++) out0[i] = (float)(unit() * 2 - 1);
    int64_t counts0[2] = {3, 5}, counts[2], merged = 0, skipped = 0;
    float *dout = up(be, out0, (size_t)G * head_dim * 4);
    int64_t *dcounts = up(be, counts0, sizeof counts0);
    CU_ASSERT(be->pod_merge(be, dout, up(be, lse_p, sizeof lse_p), up(be, lse_d, sizeof lse_d), up(be, pd, (size_t)(G * pd_stride) * 4),
                            pd_stride, up(be, v, (size_t)n_dist * head_dim * elt(dt)), dt, G, head_dim, n_dist, tau, dcounts,
                            err, sizeof err) == 0);
    down(be, got, dout, (size_t)G * head_dim * 4);
    down(be, counts, dcounts, sizeof counts);
    for (int r = 0; r < G; r++) {
        const double gate = isfinite(lse_d[r]) ? 1.0 / (1.0 + exp((double)lse_d[r] - lse_p[r])) : 1.0;
        if (gate >= tau) {
            skipped++;
            CU_ASSERT(!memcmp(got + r * head_dim, out0 + r * head_dim, (size_t)head_dim * 4));
            continue;
        }
        merged++;
        for (int e = 0; e < head_dim; e++) {
            double od = 0, mag = 0;
            float od_f = 0; /* the header's float order, for the CPU */
            for (int64_t i = 0; i < n_dist; i++) {
                const size_t at = (size_t)(i * head_dim + e);
                const float x = dt == KVB_F16 ? kvb_f16_to_f32(((kvb_f16 *)v)[at]) : ((float *)v)[at];
                od += (double)pd[r * pd_stride + i] * x, mag += fabs((double)pd[r * pd_stride + i] * x);
                od_f += pd[r * pd_stride + i] * x;
            }
            const double o = out0[r * head_dim + e], ref = gate * o + (1 - gate) * od;
            CU_ASSERT(fabs(got[r * head_dim + e] - ref) <= 1e-6 * (fabs(o) + (double)(n_dist + 1) * mag) + 1e-30);
            if (is_cpu(be)) CU_ASSERT(got[r * head_dim + e] == (float)(gate * o + (1.0 - gate) * od_f));
        }
    }
    CU_ASSERT(counts[0] == counts0[0] + merged && counts[1] == counts0[1] + skipped);
    free(pd), free(out0), free(got), free(v);
    release_all(be);
}

static void test_pod_merge_gates_the_distant_output_and_counts_merged_and_skipped_heads(void) {
    const int dims[] = {1, 17, 64, 300};
    const int64_t ns[] = {0, 1, 50, 300}; /* 300: the threaded path */
    const double taus[] = {1.0, 0.5, 0.0};
    EACH_BACKEND(be) for (int gi = 0; gi < COUNT(groups); gi++) for (int di = 0; di < COUNT(dims); di++)
        for (int ni = 0; ni < COUNT(ns); ni++) for (int dt = 0; dt < 2; dt++)
            check_pod_merge(be, groups[gi], dims[di], ns[ni], (kvb_dtype)dt, taus[rnd(3)]);
}

/* ---- suite ---- */

static int open_backends(void) {
    char err[256];
    backends[n_backends] = kvb_backend_cpu_create(1, err, sizeof err);
    if (!backends[n_backends++]) return 1;
    kvb_backend *cuda = kvb_backend_cuda_create(err, sizeof err);
    if (cuda) backends[n_backends++] = cuda;
    else printf("\n(CUDA backend not tested: %s)\n", err);
    return 0;
}

static int close_backends(void) {
    for (int i = 0; i < n_backends; i++) kvb_backend_free(backends[i]);
    return 0;
}

static void test_every_backend_has_every_data_op(void) {
    EACH_BACKEND(be) CU_ASSERT(be->copy && be->zero && be->kv_gather && be->kv_evict && be->probs_reduce && be->pool1d &&
                               be->topk_idx && be->iota && be->gather_f32 && be->round_scores && be->pod_share && be->pod_merge &&
                               be->row_norms && be->block_minmax && be->block_scores && be->block_expand &&
                               be->fill_idx_f32 && be->split_rows_idx && be->quant_groups && be->attention_quant && be->kv_load);
}

#define ADD(fn) CU_add_test(s, #fn + 5, fn)

int main(void) {
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("backend_ops", open_backends, close_backends);
    ADD(test_every_backend_has_every_data_op);
    ADD(test_copy_and_zero_move_exact_bytes_overlap_like_memmove_and_count_traffic);
    ADD(test_kv_gather_copies_index_sets_in_every_direction_and_counts_each_array);
    ADD(test_kv_load_brings_many_heads_up_in_one_counted_copy);
    ADD(test_kv_evict_removes_lowest_key_in_window_ties_to_lower_slot_and_spills_v);
    ADD(test_probs_reduce_group_sum_and_max_heads_match_f64_and_cpu_keeps_the_float_order);
    ADD(test_pool1d_max_is_exact_and_avg_counts_the_padding);
    ADD(test_topk_idx_is_the_k_largest_in_slot_order_ties_to_lower_slot_nan_last);
    ADD(test_iota_and_gather_f32_are_exact);
    ADD(test_round_scores_sum_each_rounds_attention_and_mark_it_present);
    ADD(test_pod_share_normalises_base_heads_distant_mass_and_leaves_others);
    ADD(test_pod_merge_gates_the_distant_output_and_counts_merged_and_skipped_heads);
    return util_run_suites();
}
