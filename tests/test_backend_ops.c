/* test_backend_ops.c — every data op (kernels/backend.h, "data ops") of every backend present against a
 * reference written here: exact integer/byte code for the moves, selections and indices, float64 for the
 * reductions. The CPU backend always; the CUDA backend when kvb_backend_cuda_create succeeds (else one line
 * says it was skipped). Memory an op reads or writes comes from the backend's allocator when it has one
 * (device tier; host tier where the header says host) and test data moves through the backend's own `copy`.
 *
 * Shapes are random per case (seeded): odd head_dim, GQA groups 1/3/4/7, f16 and f32 rows, empty and full
 * index sets, n = 0, sizes off the block or group, ties and NaN in top-k (tie rule: the lower slot first, on every
 * backend). Where the header fixes a float summation order, the CPU backend is also held to that order bit for
 * bit (the methods' results rest on it); other backends are held to the float64 reference within a bound. Where
 * the header pins every rounding (row_norms, block_scores, quant_groups), every backend is held to it bit for bit.
 * The list of data ops is read from kernels/backend.h itself, and an op without a test here fails the suite. */
#include <CUnit/Basic.h>
#include <ctype.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/cpu/expd.h"
#include "kernels/dtype.h"
#include "util_common.h"

static kvb_backend *backends[3]; /* the CPU with 1 and 3 threads, and CUDA where present */
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
        n_src[j] = kind == 1 ? rnd(5) : 1 + rnd(150); /* often 256 rows or more in all: the CPU's threaded path */
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

/* score a at or below score b, a NaN below every number (the header's order) */
static int score_at_or_below(float a, float b) { return isnan(a) || (!isnan(b) && a <= b); }

/* the reference picks the victim scanning from the last slot down (at or below: the lowest slot wins a tie) */
static int64_t ref_victim(const host_head *h, const float *score, int64_t n, int32_t lo, int32_t hi) {
    int64_t victim = -1;
    for (int64_t j = n - 1; j >= 0; j--) {
        if (h->pos[j] < lo || h->pos[j] >= hi) continue;
        if (victim < 0 || (score ? score_at_or_below(score[j], score[victim]) : h->pos[j] <= h->pos[victim])) victim = j;
    }
    return victim;
}

/* One head of a kv_evict call: its host copy (the reference evicts from it), scores, count and spill. */
typedef struct {
    host_head h;
    int64_t n, cand, count;
    float *score; /* NULL: evicted by position */
    int spill;
} evict_case;

/* kv_evict over nh heads in one call (score: 0 none, 1 every head, 2 each head's own choice; spill likewise) */
static void check_kv_evict(kvb_backend *be, kvb_dtype dt, int head_dim, int nh, int score_mode, int spill_mode) {
    char err[256];
    const size_t rb = (size_t)head_dim * elt(dt);
    const int32_t lo = 100 + (int32_t)rnd(40), hi = rnd(3) ? INT32_MAX : lo + (int32_t)rnd(3 * 70 + 1);
    evict_case *e = calloc((size_t)nh, sizeof *e);
    kvb_kv_head *d = calloc((size_t)nh, sizeof *d);
    int64_t *n = calloc((size_t)nh, sizeof *n), *count = calloc((size_t)nh, sizeof *count);
    float **dscore = calloc((size_t)nh, sizeof *dscore);
    void **dspill = calloc((size_t)nh, sizeof *dspill);
    for (int j = 0; j < nh; j++) {
        evict_case *c = &e[j];
        c->n = n[j] = rnd(70);
        c->h = head_alloc(c->n, rb);
        fill_rows(c->h.k, c->n * head_dim, dt), fill_rows(c->h.v, c->n * head_dim, dt);
        const int repeat = rnd(4) == 0; /* now and then positions shared by two slots: ties by slot */
        for (int64_t i = 0; i < c->n; i++) c->h.pos[i] = (int32_t)(repeat ? i / 2 : i) * 3 + 100, c->h.round[i] = (int32_t)rnd(5);
        for (int64_t i = c->n - 1; i > 0; i--) { /* positions in slot order as evictions leave them */
            int64_t k = rnd(i + 1);
            int32_t t = c->h.pos[i]; c->h.pos[i] = c->h.pos[k]; c->h.pos[k] = t;
        }
        for (int64_t i = 0; i < c->n; i++) c->cand += c->h.pos[i] >= lo && c->h.pos[i] < hi;
        c->count = count[j] = rnd(3) == 0 ? 0 : rnd(2) ? c->cand : rnd(c->cand + 1);
        if (score_mode == 1 || (score_mode == 2 && rnd(2))) {
            c->score = malloc((size_t)c->n * 4 + 4);
            const int nans = rnd(4) == 0; /* now and then NaN scores (a broken method's): the lowest keys */
            for (int64_t i = 0; i < c->n; i++) c->score[i] = nans && rnd(5) == 0 ? NAN : (float)rnd(6) * 0.125f; /* few levels: ties */
            dscore[j] = up(be, c->score, (size_t)c->n * 4);
        }
        c->spill = spill_mode == 1 || (spill_mode == 2 && rnd(2));
        if (c->spill) dspill[j] = dev(be, (size_t)c->count * rb + 1);
        d[j] = head_put(be, &c->h, c->n, rb, KVB_TIER_DEVICE);
    }
    CU_ASSERT(be->kv_evict(be, nh, d, n, rb, score_mode ? dscore : NULL, lo, hi, count, spill_mode ? dspill : NULL, err,
                           sizeof err) == 0);
    for (int j = 0; j < nh; j++) {
        evict_case *c = &e[j];
        uint8_t *spill_ref = malloc((size_t)c->count * rb + 1), *spill_got = malloc((size_t)c->count * rb + 1);
        int64_t m = c->n;
        for (int64_t k = 0; k < c->count; k++, m--) {
            const int64_t v = ref_victim(&c->h, c->score, m, lo, hi), last = m - 1;
            CU_ASSERT_FATAL(v >= 0);
            memcpy(spill_ref + k * rb, c->h.v + v * rb, rb);
            memcpy(c->h.k + v * rb, c->h.k + last * rb, rb), memcpy(c->h.v + v * rb, c->h.v + last * rb, rb);
            c->h.pos[v] = c->h.pos[last], c->h.round[v] = c->h.round[last];
            if (c->score) c->score[v] = c->score[last];
        }
        host_head got = head_alloc(c->n, rb);
        head_get(be, &got, &d[j], m, rb, KVB_TIER_DEVICE);
        CU_ASSERT(heads_equal(&got, &c->h, m, rb));
        if (c->score) {
            float *score_got = malloc((size_t)m * 4 + 4);
            down(be, score_got, dscore[j], (size_t)m * 4);
            CU_ASSERT(memcmp(score_got, c->score, (size_t)m * 4) == 0);
            free(score_got);
        }
        if (c->spill) {
            down(be, spill_got, dspill[j], (size_t)c->count * rb);
            CU_ASSERT(memcmp(spill_got, spill_ref, (size_t)c->count * rb) == 0);
        }
        n[j] = m;
        head_free(&got), free(spill_ref), free(spill_got);
    }
    if (is_cpu(be)) { /* one head asked for one eviction more than it has candidates left: a violation the CPU reports */
        const int bad = (int)rnd(nh);
        for (int j = 0; j < nh; j++) count[j] = j == bad ? e[j].cand - e[j].count + (rnd(2) ? 1 : 0) : 0;
        const int over = count[bad] > e[bad].cand - e[bad].count;
        err[0] = 0;
        CU_ASSERT(be->kv_evict(be, nh, d, n, rb, score_mode ? dscore : NULL, lo, hi, count, NULL, err, sizeof err) ==
                  (over ? -1 : 0));
        CU_ASSERT(!over || strstr(err, "kv_evict"));
    }
    for (int j = 0; j < nh; j++) head_free(&e[j].h), free(e[j].score);
    free(e), free(d), free(n), free(count), free(dscore), free(dspill);
    release_all(be);
}

/* Heads evicted together end as each evicted alone would (the reference's one-at-a-time loop); more than one
 * launch's worth of heads (32 on CUDA) now and then. */
static void test_kv_evict_removes_lowest_key_in_window_ties_to_lower_slot_and_spills_v(void) {
    EACH_BACKEND(be) for (int rep = 0; rep < 6; rep++) for (int hd = 0; hd < COUNT(head_dims); hd++)
        for (int dt = 0; dt < 2; dt++) for (int sc = 0; sc < 3; sc++) {
            const int nh = rnd(8) == 0 ? 33 + (int)rnd(8) : 1 + (int)rnd(4);
            check_kv_evict(be, (kvb_dtype)dt, head_dims[hd], nh, sc, (int)rnd(3));
        }
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

/* attention_colsum: on random queries and keys (shuffled positions, index lists on the even heads, windows), each
 * head's accumulated sums against (a) what `attention` writes as probabilities reduced by probs_reduce's group sum,
 * as H2O scored a chunk before, and (b) float64 from the logits; the lse comes from `attention` on the same
 * arguments. Both within 2e-5 of the sum, relative (float sums of exps of up to 700 terms); no lse is refused. */
static void check_colsum(kvb_backend *be, kvb_dtype dt, int D, int HK, int G, int64_t n_q, int64_t n_kv, int use_idx,
                         int32_t window) {
    char err[256];
    const int H = HK * G;
    const size_t es = elt(dt);
    const void *k[8];
    const int32_t *kpos[8], *idx[8];
    int64_t nk[8], ni[8], len[8], longest = 1;
    float *rows_a[8], *rows_b[8];
    int32_t *hpos = malloc((size_t)HK * n_kv * 4), *hidx = malloc((size_t)HK * n_kv * 4), *qpos = malloc((size_t)n_q * 4);
    uint8_t *hk = malloc((size_t)HK * n_kv * D * es + 1);
    float *q = malloc((size_t)n_q * H * D * 4);
    fill_rows(hk, (int64_t)HK * n_kv * D, dt);
    for (int64_t i = 0; i < n_q * H * D; i++) q[i] = (float)(unit() * 2 - 1);
    for (int64_t t = 0; t < n_q; t++) qpos[t] = (int32_t)(n_kv - n_q + t); /* the chunk's queries are the last keys */
    for (int g = 0; g < HK; g++) {
        for (int64_t sl = 0; sl < n_kv; sl++) hpos[g * n_kv + sl] = (int32_t)((sl * 7919) % n_kv);
        nk[g] = n_kv;
        ni[g] = use_idx && g % 2 == 0 ? n_kv * 3 / 10 + 1 : 0;
        for (int64_t j = 0; j < ni[g]; j++) hidx[g * n_kv + j] = (int32_t)((j * 37 + 11) % n_kv);
        len[g] = ni[g] ? ni[g] : n_kv;
        longest = len[g] > longest ? len[g] : longest;
        k[g] = up(be, hk + (size_t)g * n_kv * D * es, (size_t)n_kv * D * es);
        kpos[g] = up(be, hpos + g * n_kv, (size_t)n_kv * 4);
        idx[g] = ni[g] ? up(be, hidx + g * n_kv, (size_t)ni[g] * 4) : NULL;
    }
    kvb_attn_args a = {0};
    a.n_q = n_q, a.n_head = H, a.n_head_kv = HK, a.head_dim = D, a.kv_dtype = dt, a.scale = 1.0f / sqrtf((float)D);
    a.q = up(be, q, (size_t)n_q * H * D * 4), a.q_pos = up(be, qpos, (size_t)n_q * 4);
    a.k = k, a.v = k, a.k_pos = kpos, a.n_kv = nk, a.idx = use_idx ? idx : NULL, a.n_idx = use_idx ? ni : NULL;
    a.out = dev(be, (size_t)n_q * H * D * 4), a.probs = dev(be, (size_t)H * n_q * longest * 4), a.probs_stride = longest;
    a.lse = dev(be, (size_t)H * n_q * 4), a.window = window;
    CU_ASSERT_FATAL((window ? be->attention_window(be, &a, err, sizeof err) : be->attention(be, &a, err, sizeof err)) == 0);
    float *r0 = malloc((size_t)HK * longest * 4), *ga = malloc((size_t)longest * 4), *gb = malloc((size_t)longest * 4);
    float *lse = malloc((size_t)H * n_q * 4);
    down(be, lse, a.lse, (size_t)H * n_q * 4);
    for (int g = 0; g < HK; g++) {
        float *start = r0 + (size_t)g * longest; /* earlier chunks' sums, accumulated onto */
        for (int64_t j = 0; j < len[g]; j++) start[j] = (float)unit();
        rows_a[g] = up(be, start, (size_t)len[g] * 4), rows_b[g] = up(be, start, (size_t)len[g] * 4);
        CU_ASSERT(be->probs_reduce(be, rows_a[g], len[g], a.probs + (int64_t)g * G * n_q * longest, longest, G, 1, n_q,
                                   len[g], NULL, KVB_REDUCE_GROUP_SUM, 1, err, sizeof err) == 0);
    }
    CU_ASSERT(be->attention_colsum(be, &a, rows_b, err, sizeof err) == 0);
    double worst_a = 0, worst_f = 0;
    for (int g = 0; g < HK; g++) {
        down(be, ga, rows_a[g], (size_t)len[g] * 4);
        down(be, gb, rows_b[g], (size_t)len[g] * 4);
        for (int64_t j = 0; j < len[g]; j++) {
            const int64_t sl = ni[g] && use_idx ? hidx[g * n_kv + j] : j;
            const int32_t kp = hpos[g * n_kv + sl];
            double f = r0[(size_t)g * longest + j];
            for (int r = 0; r < G; r++)
                for (int64_t t = 0; t < n_q; t++) {
                    const int h = g * G + r;
                    if (kp > qpos[t] || (window > 0 && qpos[t] - kp >= window) || lse[h * n_q + t] == -INFINITY) continue;
                    double d = 0;
                    for (int e = 0; e < D; e++) {
                        const size_t at = ((size_t)g * n_kv + sl) * D + e;
                        d += (double)q[(t * H + h) * D + e] *
                             (dt == KVB_F16 ? kvb_f16_to_f32(((kvb_f16 *)hk)[at]) : ((float *)hk)[at]);
                    }
                    f += exp(d * a.scale - lse[h * n_q + t]);
                }
            const double ea = fabs((double)gb[j] - ga[j]) / (1 + fabs(ga[j])), ef = fabs((double)gb[j] - f) / (1 + fabs(f));
            worst_a = ea > worst_a ? ea : worst_a;
            worst_f = ef > worst_f ? ef : worst_f;
        }
    }
    printf("\n    colsum %s d=%d kv_heads=%d group=%d n_q=%lld n_kv=%lld%s window=%d: vs probabilities %.1e", be->name, D,
           HK, G, (long long)n_q, (long long)n_kv, use_idx ? " idx" : "", (int)window, worst_a);
    printf(", vs float64 %.1e", worst_f);
    CU_ASSERT(worst_a <= 2e-5);
    CU_ASSERT(worst_f <= 2e-5);
    a.lse = NULL;
    CU_ASSERT(be->attention_colsum(be, &a, rows_b, err, sizeof err) == -1 && strstr(err, "lse"));
    free(hpos), free(hidx), free(qpos), free(hk), free(q), free(r0), free(ga), free(gb), free(lse);
    release_all(be);
}

static void test_attention_colsum_is_the_group_sum_of_the_probabilities_never_written(void) {
    EACH_BACKEND(be) for (int dt = 0; dt < 2; dt++) {
        check_colsum(be, (kvb_dtype)dt, 128, 2, 4, 37, 300, 1, 0);
        check_colsum(be, (kvb_dtype)dt, 64, 3, 3, 16, 500, 0, 0);
        check_colsum(be, (kvb_dtype)dt, 80, 1, 2, 5, 200, 1, 0);  /* head_dim with no fast path */
        check_colsum(be, (kvb_dtype)dt, 128, 2, 4, 40, 700, 1, 64); /* a sliding window */
        check_colsum(be, (kvb_dtype)dt, 64, 1, 1, 1, 1, 0, 0);      /* one key, one query */
        /* 64 queries or more (KVB_PREFILL_TC_MIN_Q): on a GPU the lse comes from the tensor-core prefill, as it does
         * for a long prompt's chunks, the calls attention_colsum is for */
        check_colsum(be, (kvb_dtype)dt, 128, 2, 4, 96, 600, 1, 0);
        check_colsum(be, (kvb_dtype)dt, 64, 2, 2, 130, 400, 0, 48);
    }
}

static void test_probs_reduce_group_sum_and_max_heads_match_f64_and_cpu_keeps_the_float_order(void) {
    const int64_t ns[] = {0, 1, 13, 300, 4500}; /* 4500: past the CPU's 2048-column blocks of MAX_HEADS */
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

static const float *rank_x; /* the list topk_ref's comparator ranks */
static int rank_cmp(const void *a, const void *b) {
    const int64_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    return ranks_before(rank_x, i, j) ? -1 : ranks_before(rank_x, j, i) ? 1 : 0;
}
static int slot_cmp(const void *a, const void *b) { return (*(const int32_t *)a > *(const int32_t *)b) - (*(const int32_t *)a < *(const int32_t *)b); }

/* out[0..k) = the slots of rank < k (ranks_before's order: a total one), ascending */
static void topk_ref(const float *x, int64_t n, int64_t k, int32_t *out) {
    int32_t *order = malloc((size_t)n * 4 + 4);
    for (int64_t i = 0; i < n; i++) order[i] = (int32_t)i;
    rank_x = x;
    qsort(order, (size_t)n, sizeof *order, rank_cmp);
    qsort(order, (size_t)k, sizeof *order, slot_cmp);
    memcpy(out, order, (size_t)k * 4);
    free(order);
}

/* rows = 0: topk_idx on one list; rows >= 1: topk_rows over rows lists with strides past their lengths (the gaps
 * must stay untouched) */
static void check_topk(kvb_backend *be, int64_t n, int64_t k, int64_t rows) {
    char err[256];
    const int64_t R = rows ? rows : 1, kk = k < 0 ? 0 : k > n ? n : k;
    const int64_t xs = n + (rows ? rnd(3) : 0), is = kk + 1 + (rows ? rnd(3) : 0); /* strides */
    float *x = malloc((size_t)(R * xs) * 4 + 4);
    int32_t *ref = malloc((size_t)(R * is) * 4), *got = malloc((size_t)(R * is) * 4);
    const int32_t sentinel = -77;
    for (int64_t i = 0; i < R * is; i++) ref[i] = got[i] = sentinel;
    for (int64_t r = 0; r < R; r++) {
        float *xr = x + r * xs;
        for (int64_t i = 0; i < xs; i++) {
            const int64_t c = rnd(20);
            xr[i] = c == 0 ? NAN : c == 1 ? INFINITY : c == 2 ? -INFINITY : c == 3 ? -0.0f : c == 4 ? -NAN
                  : (float)rnd(8) * 0.25f; /* ties galore, -0 among the zeros, NaN of either sign */
        }
        topk_ref(xr, n, kk, ref + r * is);
    }
    int32_t *didx = up(be, got, (size_t)(R * is) * 4);
    const float *dx = up(be, x, (size_t)(R * xs) * 4);
    const int rc = rows ? be->topk_rows(be, didx, is, dx, xs, rows, n, k, err, sizeof err)
                        : be->topk_idx(be, didx, dx, n, k, err, sizeof err);
    CU_ASSERT(rc == 0);
    down(be, got, didx, (size_t)(R * is) * 4);
    CU_ASSERT(memcmp(got, ref, (size_t)(R * is) * 4) == 0); /* writes exactly min(k, n) a row, nothing between */
    free(x), free(ref), free(got);
    release_all(be);
}

static void test_topk_idx_is_the_k_largest_in_slot_order_ties_to_lower_slot_nan_last(void) {
    /* 1024 and 1025: either side of the CUDA backend's switch from its shared-memory rank to its radix select */
    const int64_t ns[] = {0, 1, 5, 64, 1000, 1024, 1025, 3001};
    EACH_BACKEND(be) for (int ni = 0; ni < COUNT(ns); ni++) {
        const int64_t n = ns[ni], ks[] = {-1, 0, 1, n / 3, n - 1, n, n + 5};
        for (int ki = 0; ki < COUNT(ks); ki++) check_topk(be, n, ks[ki], 0);
    }
}

/* every row as topk_idx alone on it */
static void test_topk_rows_is_topk_idx_on_every_row(void) {
    const int64_t ns[] = {0, 1, 64, 1025, 2100}, rowss[] = {2, 5};
    EACH_BACKEND(be) for (int ni = 0; ni < COUNT(ns); ni++) for (int ri = 0; ri < COUNT(rowss); ri++) {
        const int64_t n = ns[ni], ks[] = {0, n / 3, n + 5};
        for (int ki = 0; ki < COUNT(ks); ki++) check_topk(be, n, ks[ki], rowss[ri]);
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
        double lane[KVB_POD_LANES] = {0}, m = 0; /* the header's order: interleaved partial sums, then lane order */
        for (int64_t i = 0; i < n_dist; i++) lane[i % KVB_POD_LANES] += p[h * stride + first + i];
        for (int k = 0; k < KVB_POD_LANES; k++) m += lane[k];
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
    const int64_t ns[] = {0, 1, 37, 300, 5568};
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
            float od_f = 0, s_f = 0; /* the header's float order, for the CPU: chunk sums s_f added in chunk order */
            for (int64_t i = 0; i < n_dist; i++) {
                const size_t at = (size_t)(i * head_dim + e);
                const float x = dt == KVB_F16 ? kvb_f16_to_f32(((kvb_f16 *)v)[at]) : ((float *)v)[at];
                od += (double)pd[r * pd_stride + i] * x, mag += fabs((double)pd[r * pd_stride + i] * x);
                s_f += pd[r * pd_stride + i] * x;
                if ((i + 1) % KVB_POD_CHUNK == 0 || i + 1 == n_dist) od_f += s_f, s_f = 0;
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
    const int64_t ns[] = {0, 1, 50, 300, 1300}; /* 300: the threaded path; 1300: three chunks, the last partial */
    const double taus[] = {1.0, 0.5, 0.0};
    EACH_BACKEND(be) for (int gi = 0; gi < COUNT(groups); gi++) for (int di = 0; di < COUNT(dims); di++)
        for (int ni = 0; ni < COUNT(ns); ni++) for (int dt = 0; dt < 2; dt++)
            check_pod_merge(be, groups[gi], dims[di], ns[ni], (kvb_dtype)dt, taus[rnd(3)]);
}

/* ---- knorm, quest: row_norms, block_minmax, block_scores, block_expand ----
 * The header pins every rounding of these (a product of two floats is exact in double, so a fused multiply-add
 * changes nothing; the sums run in a fixed order; sqrt is IEEE; one store as float; min and max are exact), so
 * each has one right answer and every backend is held to it bit for bit. */

static float row_val(const void *rows, kvb_dtype dt, int64_t i) {
    return dt == KVB_F16 ? kvb_f16_to_f32(((const kvb_f16 *)rows)[i]) : ((const float *)rows)[i];
}

static void check_row_norms(kvb_backend *be, kvb_dtype dt, int dim, int64_t n, int negate) {
    char err[256];
    const size_t es = elt(dt);
    uint8_t *k = malloc((size_t)(n * dim) * es + 1);
    float *ref = malloc((size_t)(n + 1) * 4), *got = malloc((size_t)(n + 1) * 4);
    fill_rows(k, n * dim, dt);
    for (int64_t i = 0; i < n; i++) { /* now and then a zero row (negated: -0), or squares past float's range */
        const int64_t kind = rnd(6);
        for (int e = 0; e < dim && kind < 2; e++) {
            const size_t at = (size_t)(i * dim + e);
            if (dt == KVB_F16) ((kvb_f16 *)k)[at] = kind == 0 ? 0 : ((kvb_f16 *)k)[at];
            else ((float *)k)[at] = kind == 0 ? 0.0f : ((float *)k)[at] * 4e19f;
        }
    }
    for (int64_t i = 0; i <= n; i++) ref[i] = got[i] = -777.0f; /* slot n: past the rows, left alone */
    for (int64_t i = 0; i < n; i++) {
        double sum = 0;
        for (int e = 0; e < dim; e++) {
            const double x = row_val(k, dt, i * dim + e);
            sum += x * x;
        }
        ref[i] = negate ? -(float)sqrt(sum) : (float)sqrt(sum);
    }
    float *dout = up(be, got, (size_t)(n + 1) * 4);
    CU_ASSERT(be->row_norms(be, dout, up(be, k, (size_t)(n * dim) * es), dt, dim, n, negate, err, sizeof err) == 0);
    down(be, got, dout, (size_t)(n + 1) * 4);
    CU_ASSERT(memcmp(got, ref, (size_t)(n + 1) * 4) == 0); /* bitwise: the sign of a negated zero counts */
    free(k), free(ref), free(got);
    release_all(be);
}

static void test_row_norms_are_the_double_sum_of_squares_rooted_and_negated_on_request(void) {
    const int64_t ns[] = {0, 1, 7, 300};
    EACH_BACKEND(be) for (int hd = 0; hd < COUNT(head_dims); hd++) for (int ni = 0; ni < COUNT(ns); ni++)
        for (int dt = 0; dt < 2; dt++) for (int neg = 0; neg < 2; neg++)
            check_row_norms(be, (kvb_dtype)dt, head_dims[hd], ns[ni], neg);
}

/* the bounds start as values no row holds: the blocks before from / block and past the last row come back as
 * they went, the others hold their rows' min and max (rows before `from` in from's block included) */
static void check_block_minmax(kvb_backend *be, kvb_dtype dt, int dim, int64_t block, int64_t n) {
    char err[256];
    const size_t es = elt(dt);
    const int64_t from = n ? rnd(n) : 0, nb = ((n + block - 1) / block + 1) * dim;
    uint8_t *k = malloc((size_t)(n * dim) * es + 1);
    float *lo = malloc((size_t)nb * 4), *hi = malloc((size_t)nb * 4), *glo = malloc((size_t)nb * 4), *ghi = malloc((size_t)nb * 4);
    if (rnd(2)) fill_rows(k, n * dim, dt);
    else /* five levels: ties in every block */
        for (int64_t i = 0; i < n * dim; i++) {
            const float x = (float)(rnd(5) - 2) * 0.75f;
            if (dt == KVB_F16) ((kvb_f16 *)k)[i] = kvb_f32_to_f16(x);
            else ((float *)k)[i] = x;
        }
    for (int64_t i = 0; i < nb; i++) lo[i] = 1000.0f + (float)i, hi[i] = -1000.0f - (float)i;
    float *dlo = up(be, lo, (size_t)nb * 4), *dhi = up(be, hi, (size_t)nb * 4);
    CU_ASSERT(be->block_minmax(be, dlo, dhi, up(be, k, (size_t)(n * dim) * es), dt, dim, block, from, n, err, sizeof err) == 0);
    down(be, glo, dlo, (size_t)nb * 4);
    down(be, ghi, dhi, (size_t)nb * 4);
    for (int64_t b = from / block; b * block < n; b++)
        for (int e = 0; e < dim; e++) {
            double mn = INFINITY, mx = -INFINITY;
            for (int64_t r = b * block; r < (b + 1) * block && r < n; r++)
                mn = fmin(mn, row_val(k, dt, r * dim + e)), mx = fmax(mx, row_val(k, dt, r * dim + e));
            lo[b * dim + e] = (float)mn, hi[b * dim + e] = (float)mx;
        }
    int same = 1;
    for (int64_t i = 0; i < nb; i++) same &= glo[i] == lo[i] && ghi[i] == hi[i];
    CU_ASSERT(same);
    free(k), free(lo), free(hi), free(glo), free(ghi);
    release_all(be);
}

static void test_block_minmax_rewrites_the_blocks_from_from_on_with_their_rows_min_and_max(void) {
    const int64_t blocks[] = {1, 3, 16, 32}, ns[] = {0, 1, 15, 16, 17, 100};
    EACH_BACKEND(be) for (int hd = 0; hd < COUNT(head_dims); hd++) for (int bi = 0; bi < COUNT(blocks); bi++)
        for (int ni = 0; ni < COUNT(ns); ni++) for (int dt = 0; dt < 2; dt++)
            check_block_minmax(be, (kvb_dtype)dt, head_dims[hd], blocks[bi], ns[ni]);
}

static void check_block_scores(kvb_backend *be, int G, int dim, int64_t n_block, int group_max) {
    char err[256];
    const int64_t nq = (int64_t)G * dim, nk = n_block * dim;
    float *q = malloc((size_t)nq * 4), *lo = malloc((size_t)nk * 4 + 4), *hi = malloc((size_t)nk * 4 + 4);
    float *ref = malloc((size_t)(n_block + 1) * 4), *got = malloc((size_t)(n_block + 1) * 4);
    for (int64_t i = 0; i < nq; i++) q[i] = rnd(9) == 0 ? 0.0f : (float)(unit() * 4 - 2); /* signs pick min or max */
    if (G > 1 && rnd(3) == 0) memcpy(q + dim, q, (size_t)dim * 4); /* two equal query heads: a tie in the max */
    for (int64_t i = 0; i < nk; i++) {
        const float a = (float)(unit() * 4 - 2), b = rnd(5) == 0 ? a : (float)(unit() * 4 - 2); /* a = b: one-row page */
        lo[i] = a < b ? a : b, hi[i] = a < b ? b : a;
    }
    for (int64_t b = 0; b <= n_block; b++) ref[b] = got[b] = -777.0f;
    for (int64_t b = 0; b < n_block; b++) {
        double score = 0;
        for (int r = 0; r < G; r++) {
            double u = 0;
            for (int e = 0; e < dim; e++)
                u += fmax((double)q[r * dim + e] * lo[b * dim + e], (double)q[r * dim + e] * hi[b * dim + e]);
            score = group_max ? (r == 0 ? u : fmax(score, u)) : score + u;
        }
        ref[b] = (float)score;
    }
    float *dscore = up(be, got, (size_t)(n_block + 1) * 4);
    CU_ASSERT(be->block_scores(be, dscore, up(be, q, (size_t)nq * 4), up(be, lo, (size_t)nk * 4), up(be, hi, (size_t)nk * 4), G,
                               dim, n_block, group_max, err, sizeof err) == 0);
    down(be, got, dscore, (size_t)(n_block + 1) * 4);
    int same = 1;
    for (int64_t b = 0; b <= n_block; b++) same &= got[b] == ref[b];
    CU_ASSERT(same);
    free(q), free(lo), free(hi), free(ref), free(got);
    release_all(be);
}

static void test_block_scores_sum_or_max_each_heads_upper_bound_in_double(void) {
    const int64_t ns[] = {0, 1, 5, 130};
    EACH_BACKEND(be) for (int gi = 0; gi < COUNT(groups); gi++) for (int hd = 0; hd < COUNT(head_dims); hd++)
        for (int ni = 0; ni < COUNT(ns); ni++) for (int gm = 0; gm < 2; gm++)
            check_block_scores(be, groups[gi], head_dims[hd], ns[ni], gm);
}

static void check_block_expand(kvb_backend *be, int64_t block, int64_t n) {
    char err[256];
    const int64_t nb = (n + block - 1) / block;
    int32_t *blocks = malloc((size_t)nb * 4 + 4), *ref = malloc((size_t)(n + 1) * 4), *got = malloc((size_t)(n + 1) * 4);
    for (int64_t j = 0; j < nb; j++) blocks[j] = (int32_t)rnd(100000 / block); /* any order, repeats too */
    int64_t m = 0; /* each block's slots in turn, the last block cut short at n */
    for (int64_t j = 0; j < nb; j++)
        for (int64_t s = 0; s < block && m < n; s++) ref[m++] = (int32_t)(blocks[j] * block + s);
    CU_ASSERT_FATAL(m == n);
    for (int64_t i = 0; i <= n; i++) got[i] = -7;
    ref[n] = -7;
    int32_t *didx = up(be, got, (size_t)(n + 1) * 4);
    CU_ASSERT(be->block_expand(be, didx, up(be, blocks, (size_t)nb * 4), block, n, err, sizeof err) == 0);
    down(be, got, didx, (size_t)(n + 1) * 4);
    CU_ASSERT(memcmp(got, ref, (size_t)(n + 1) * 4) == 0);
    free(blocks), free(ref), free(got);
    release_all(be);
}

static void test_block_expand_lists_each_blocks_slots_and_cuts_the_last_at_n(void) {
    const int64_t blocks[] = {1, 2, 3, 16, 32}, ns[] = {0, 1, 15, 16, 17, 1000, 5001};
    EACH_BACKEND(be) for (int bi = 0; bi < COUNT(blocks); bi++) for (int ni = 0; ni < COUNT(ns); ni++)
        check_block_expand(be, blocks[bi], ns[ni]);
}

/* The layer-wide forms Quest's decode step takes (block_minmax_heads, block_scores_heads, block_expand_rows): each
 * head's results are those of the one-head op called on it alone, bit for bit, with every head's own pointers (K
 * rows and metadata in separate allocations), head counts past one launch's 32, and the gaps between strided rows
 * left as they were. */
enum { PART_MINMAX = 1, PART_SCORES = 2, PART_EXPAND = 4 };
static void check_heads_ops(kvb_backend *be, int parts, kvb_dtype dt, int dim, int G, int64_t block, int64_t n, int H) {
    char err[256];
    const size_t es = elt(dt);
    const int64_t from = n ? rnd(n) : 0, nbk = (n + block - 1) / block, nb = (nbk + 1) * dim;
    /* block_minmax_heads against block_minmax a head at a time, on the same rows and the same starting bounds (the
     * bounds block_scores_heads reads below) */
    void **k = calloc((size_t)H, sizeof *k);
    float **lo1 = calloc((size_t)H, sizeof *lo1), **hi1 = calloc((size_t)H, sizeof *hi1);
    float **lo2 = calloc((size_t)H, sizeof *lo2), **hi2 = calloc((size_t)H, sizeof *hi2);
    uint8_t *rows = malloc((size_t)(n * dim) * es + 1);
    float *init = malloc((size_t)nb * 4), *a = malloc((size_t)nb * 4), *b = malloc((size_t)nb * 4);
    for (int64_t i = 0; i < nb; i++) init[i] = 1000.0f + (float)i;
    for (int h = 0; h < H; h++) {
        fill_rows(rows, n * dim, dt);
        k[h] = up(be, rows, (size_t)(n * dim) * es);
        lo1[h] = up(be, init, (size_t)nb * 4), hi1[h] = up(be, init, (size_t)nb * 4);
        lo2[h] = up(be, init, (size_t)nb * 4), hi2[h] = up(be, init, (size_t)nb * 4);
        CU_ASSERT(be->block_minmax(be, lo1[h], hi1[h], k[h], dt, dim, block, from, n, err, sizeof err) == 0);
    }
    CU_ASSERT(be->block_minmax_heads(be, H, lo2, hi2, (const void *const *)k, dt, dim, block, from, n, err, sizeof err) == 0);
    int same = 1;
    for (int h = 0; h < H; h++) {
        down(be, a, lo1[h], (size_t)nb * 4), down(be, b, lo2[h], (size_t)nb * 4);
        same &= memcmp(a, b, (size_t)nb * 4) == 0;
        down(be, a, hi1[h], (size_t)nb * 4), down(be, b, hi2[h], (size_t)nb * 4);
        same &= memcmp(a, b, (size_t)nb * 4) == 0;
    }
    if (parts & PART_MINMAX) CU_ASSERT(same);
    /* block_scores_heads over those bounds: score rows `stride` apart (a gap after each), query heads G a KV head */
    const int64_t stride = nbk + 1 + rnd(3), ns = (int64_t)H * stride, nq = (int64_t)H * G * dim;
    float *q = malloc((size_t)nq * 4), *s1 = malloc((size_t)ns * 4), *s2 = malloc((size_t)ns * 4);
    for (int64_t i = 0; i < nq; i++) q[i] = (float)(unit() * 4 - 2);
    for (int64_t i = 0; i < ns; i++) s1[i] = -777.0f - (float)i;
    float *dq = up(be, q, (size_t)nq * 4), *ds1 = up(be, s1, (size_t)ns * 4), *ds2 = up(be, s1, (size_t)ns * 4);
    const int gm = (int)rnd(2);
    for (int h = 0; h < H; h++)
        CU_ASSERT(be->block_scores(be, ds1 + h * stride, dq + (int64_t)h * G * dim, lo1[h], hi1[h], G, dim, nbk, gm, err,
                                   sizeof err) == 0);
    CU_ASSERT(be->block_scores_heads(be, H, ds2, stride, dq, (const float *const *)lo2, (const float *const *)hi2, G, dim,
                                     nbk, gm, err, sizeof err) == 0);
    down(be, s1, ds1, (size_t)ns * 4), down(be, s2, ds2, (size_t)ns * 4);
    if (parts & PART_SCORES) CU_ASSERT(same && memcmp(s1, s2, (size_t)ns * 4) == 0);
    /* block_expand_rows: each row's listed blocks, then tail, tail + 1, ...; against the formula, gaps untouched */
    const int64_t listed = nbk > 0 ? rnd(nbk + 1) : 0, tail = rnd(1000), bstride = listed + 1 + rnd(2);
    const int64_t istride = n + 1 + rnd(5), ni = (int64_t)H * istride, nl = (int64_t)H * bstride;
    int32_t *list = malloc((size_t)nl * 4 + 4), *ref = malloc((size_t)ni * 4 + 4), *got = malloc((size_t)ni * 4 + 4);
    for (int64_t i = 0; i < nl; i++) list[i] = (int32_t)rnd(100000 / block);
    for (int64_t i = 0; i < ni; i++) ref[i] = got[i] = -7 - (int32_t)(i % 1000);
    for (int h = 0; h < H; h++)
        for (int64_t i = 0; i < n; i++) {
            const int64_t bl = i / block;
            ref[h * istride + i] = (int32_t)((bl < listed ? list[h * bstride + bl] : tail + bl - listed) * block + i % block);
        }
    int32_t *didx = up(be, got, (size_t)ni * 4);
    CU_ASSERT(be->block_expand_rows(be, H, didx, istride, up(be, list, (size_t)nl * 4), bstride, listed, tail, block, n, err,
                                    sizeof err) == 0);
    down(be, got, didx, (size_t)ni * 4);
    if (parts & PART_EXPAND) CU_ASSERT(memcmp(got, ref, (size_t)ni * 4) == 0);
    free(k), free(lo1), free(hi1), free(lo2), free(hi2), free(rows), free(init), free(a), free(b);
    free(q), free(s1), free(s2), free(list), free(ref), free(got);
    release_all(be);
}

static void check_heads_cases(int parts) {
    const int heads[] = {1, 3, 33};
    const int64_t blocks[] = {1, 16}, ns[] = {0, 1, 17, 100};
    EACH_BACKEND(be) for (int hi = 0; hi < COUNT(heads); hi++) for (int bi = 0; bi < COUNT(blocks); bi++)
        for (int ni = 0; ni < COUNT(ns); ni++) for (int dt = 0; dt < 2; dt++)
            check_heads_ops(be, parts, (kvb_dtype)dt, head_dims[rnd(COUNT(head_dims))], groups[rnd(COUNT(groups))],
                            blocks[bi], ns[ni], heads[hi]);
}

static void test_block_minmax_heads_is_block_minmax_a_head_at_a_time(void) { check_heads_cases(PART_MINMAX); }
static void test_block_scores_heads_is_block_scores_a_head_at_a_time(void) { check_heads_cases(PART_SCORES); }
static void test_block_expand_rows_lists_each_rows_blocks_then_the_tail(void) { check_heads_cases(PART_EXPAND); }

/* ---- AdaKV: fill_idx_f32, split_rows_idx (exact: stores and integer arithmetic) ---- */

static void check_fill_idx_f32(kvb_backend *be, int64_t n, float value) {
    char err[256];
    const int64_t m = n ? 1 + rnd(2 * n) : 5; /* fewer slots than indices now and then: repeats */
    float *dst = malloc((size_t)m * 4), *ref = malloc((size_t)m * 4), *got = malloc((size_t)m * 4);
    int32_t *idx = malloc((size_t)n * 4 + 4);
    for (int64_t i = 0; i < m; i++) dst[i] = ref[i] = (float)unit();
    for (int64_t i = 0; i < n; i++) idx[i] = (int32_t)rnd(m), ref[idx[i]] = value;
    float *ddst = up(be, dst, (size_t)m * 4);
    CU_ASSERT(be->fill_idx_f32(be, ddst, up(be, idx, (size_t)n * 4), n, value, err, sizeof err) == 0);
    down(be, got, ddst, (size_t)m * 4);
    CU_ASSERT(memcmp(got, ref, (size_t)m * 4) == 0); /* the value's bits: -0 and NaN as given */
    free(dst), free(ref), free(got), free(idx);
    release_all(be);
}

static void test_fill_idx_f32_stores_the_value_at_every_listed_slot_and_nowhere_else(void) {
    const int64_t ns[] = {0, 1, 33, 5000};
    const float values[] = {-INFINITY, -0.0f, 3.25f, NAN};
    EACH_BACKEND(be) for (int ni = 0; ni < COUNT(ns); ni++) for (int vi = 0; vi < COUNT(values); vi++)
        check_fill_idx_f32(be, ns[ni], values[vi]);
}

/* rows empty, full or in between; the reference finds each row's indices by scanning for its range */
static void check_split_rows_idx(kvb_backend *be, int rows, int64_t row_len) {
    char err[256];
    int32_t *flat = malloc((size_t)(rows * row_len) * 4 + 4);
    int64_t n = 0;
    for (int r = 0; r < rows; r++) {
        const int kind = (int)rnd(4), pct = (int)rnd(100);
        for (int64_t j = 0; j < row_len; j++)
            if (kind == 1 || (kind > 1 && rnd(100) < pct)) flat[n++] = (int32_t)(r * row_len + j);
    }
    int32_t *cref = malloc((size_t)(rows + 1) * 4), *cgot = malloc((size_t)(rows + 1) * 4);
    int64_t stride = 0;
    for (int r = 0; r < rows; r++) {
        cref[r] = 0;
        for (int64_t i = 0; i < n; i++) cref[r] += flat[i] >= r * row_len && flat[i] < (r + 1) * row_len;
        stride = cref[r] > stride ? cref[r] : stride;
    }
    stride += rnd(3); /* out_stride: the largest count or more */
    const int64_t no = rows * stride + 1;
    int32_t *oref = malloc((size_t)no * 4), *ogot = malloc((size_t)no * 4);
    for (int64_t i = 0; i < no; i++) oref[i] = ogot[i] = -9;
    for (int r = 0; r < rows; r++) {
        int64_t j = 0;
        for (int64_t i = 0; i < n; i++)
            if (flat[i] >= r * row_len && flat[i] < (r + 1) * row_len) oref[r * stride + j++] = (int32_t)(flat[i] - r * row_len);
    }
    for (int r = 0; r <= rows; r++) cgot[r] = -5; /* every row's count is written, and only those */
    cref[rows] = -5;
    int32_t *dout = up(be, ogot, (size_t)no * 4), *dcounts = up(be, cgot, (size_t)(rows + 1) * 4);
    CU_ASSERT(be->split_rows_idx(be, dout, stride, dcounts, up(be, flat, (size_t)n * 4), n, row_len, rows, err, sizeof err) == 0);
    down(be, ogot, dout, (size_t)no * 4);
    down(be, cgot, dcounts, (size_t)(rows + 1) * 4);
    CU_ASSERT(memcmp(cgot, cref, (size_t)(rows + 1) * 4) == 0);
    CU_ASSERT(memcmp(ogot, oref, (size_t)no * 4) == 0);
    free(flat), free(cref), free(cgot), free(oref), free(ogot);
    release_all(be);
}

static void test_split_rows_idx_counts_every_row_and_lists_its_offsets_in_order(void) {
    const int rows[] = {0, 1, 7, 70};
    const int64_t lens[] = {1, 5, 64, 300};
    EACH_BACKEND(be) for (int ri = 0; ri < COUNT(rows); ri++) for (int li = 0; li < COUNT(lens); li++)
        for (int rep = 0; rep < 3; rep++) check_split_rows_idx(be, rows[ri], lens[li]);
}

/* ---- KIVI: quant_groups, attention_quant ---- */

typedef struct {
    int G, bits;
} quant_fmt;
/* G * bits a multiple of 16; some G not a power of two */
static const quant_fmt quant_fmts[] = {{16, 1}, {48, 1}, {8, 2}, {24, 2}, {4, 4}, {12, 4}, {64, 4}, {2, 8}, {6, 8}};

/* f16 directed rounding by bisection over the bit patterns (the non-negative ones ascend with their values):
 * the least f16 >= x, and the greatest f16 <= x; |x| <= 65504 */
static kvb_f16 f16_ceil(float x) { /* x >= 0 */
    unsigned lo = 0, hi = 0x7BFF;
    while (lo < hi) {
        const unsigned mid = (lo + hi) / 2;
        if (kvb_f16_to_f32((kvb_f16)mid) >= x) hi = mid;
        else lo = mid + 1;
    }
    return (kvb_f16)lo;
}

static kvb_f16 f16_floor(float x) {
    if (x < 0) return (kvb_f16)(0x8000 | f16_ceil(-x));
    unsigned lo = 0, hi = 0x7BFF;
    while (lo < hi) {
        const unsigned mid = (lo + hi + 1) / 2;
        if (kvb_f16_to_f32((kvb_f16)mid) <= x) lo = mid;
        else hi = mid - 1;
    }
    return (kvb_f16)lo;
}

/* code i of a group's code bytes: bits [i*bits, (i+1)*bits), least significant first, read a bit at a time */
static int code_get(const uint8_t *codes, int i, int bits) {
    int c = 0;
    for (int b = 0; b < bits; b++) c |= ((codes[(i * bits + b) / 8] >> ((i * bits + b) % 8)) & 1) << b;
    return c;
}

static void code_put(uint8_t *codes, int i, int bits, int c) {
    for (int b = 0; b < bits; b++) codes[(i * bits + b) / 8] |= (uint8_t)(((c >> b) & 1) << ((i * bits + b) % 8));
}

/* value i of a group record as the header dequantizes it: (float)z + (float)code * (float)s, the product first */
static float group_value(const uint8_t *rec, int G, int bits, int i) {
    kvb_f16 sh, zh;
    memcpy(&sh, rec + (size_t)G * bits / 8, 2), memcpy(&zh, rec + (size_t)G * bits / 8 + 2, 2);
    const float prod = (float)code_get(rec, i, bits) * kvb_f16_to_f32(sh);
    return kvb_f16_to_f32(zh) + prod;
}

/* element i of group gi: per channel, group b*d + c holds rows b*G.. of column c; per token, group t*(d/G) + j
 * holds elements j*G.. of row t */
static int64_t group_elem(int64_t gi, int i, int d, int G, int per_channel) {
    return per_channel ? (gi / d * G + i) * d + gi % d : gi / (d / G) * d + gi % (d / G) * G + i;
}

/* Every step of a group's record is an IEEE-rounded operation the header names (f16 rounded down and up, f32
 * subtraction and division, rintf), so the record has one right value and every backend must give it bit for
 * bit. Independently of those steps, each value the backend's record dequantizes to must lie within half a step
 * of the input (float64), the header's promise, with four f32 roundings (2^-24 each) of the magnitudes involved. */
static void check_quant_groups(kvb_backend *be, kvb_dtype dt, quant_fmt f, int d, int64_t n, int per_channel) {
    char err[256];
    const int G = f.G, bits = f.bits, qmax = (1 << bits) - 1;
    const size_t rb = kvb_quant_group_bytes(G, bits), cb = (size_t)G * bits / 8, es = elt(dt);
    const int64_t n_groups = per_channel ? n / G * d : n * (d / G);
    const size_t bytes = (size_t)n_groups * rb + 8; /* 8 bytes past the groups, left alone */
    uint8_t *x = malloc((size_t)(n * d) * es + 1), *ref = malloc(bytes), *got = malloc(bytes);
    const double mag = pow(10.0, unit() * 4 - 2); /* 0.01 .. 100: inside f16's range */
    for (int64_t gi = 0; gi < n_groups; gi++) { /* a group of one value (f16: scale 0), of three, or spread */
        const int kind = (int)rnd(5);
        const double c = (unit() * 2 - 1) * mag;
        for (int i = 0; i < G; i++) {
            const double y = kind == 0 ? c : kind == 1 ? c + (double)(rnd(3) - 1) * mag / 4 : c + (unit() * 2 - 1) * mag;
            const int64_t at = group_elem(gi, i, d, G, per_channel);
            if (dt == KVB_F16) ((kvb_f16 *)x)[at] = kvb_f32_to_f16((float)y);
            else ((float *)x)[at] = (float)y;
        }
    }
    memset(ref, 0, bytes), memset(got, 0xA5, bytes), memset(ref + bytes - 8, 0xA5, 8);
    for (int64_t gi = 0; gi < n_groups; gi++) {
        uint8_t *rec = ref + gi * rb;
        float mn = INFINITY, mx = -INFINITY;
        for (int i = 0; i < G; i++) {
            const float v = row_val(x, dt, group_elem(gi, i, d, G, per_channel));
            mn = v < mn ? v : mn, mx = v > mx ? v : mx;
        }
        const kvb_f16 zh = f16_floor(mn);
        const float z = kvb_f16_to_f32(zh);
        const kvb_f16 sh = f16_ceil((mx - z) / (float)qmax);
        const float s = kvb_f16_to_f32(sh);
        for (int i = 0; i < G; i++) {
            const float r = s > 0 ? rintf((row_val(x, dt, group_elem(gi, i, d, G, per_channel)) - z) / s) : 0.0f;
            code_put(rec, i, bits, r < 0 ? 0 : r > (float)qmax ? qmax : (int)r);
        }
        memcpy(rec + cb, &sh, 2), memcpy(rec + cb + 2, &zh, 2);
    }
    uint8_t *dout = up(be, got, bytes);
    CU_ASSERT(be->quant_groups(be, dout, up(be, x, (size_t)(n * d) * es), dt, n, d, G, bits, per_channel, err, sizeof err) == 0);
    down(be, got, dout, bytes);
    CU_ASSERT(memcmp(got, ref, bytes) == 0);
    int within = 1;
    for (int64_t gi = 0; gi < n_groups; gi++) {
        const uint8_t *rec = got + gi * rb;
        kvb_f16 sh, zh;
        memcpy(&sh, rec + cb, 2), memcpy(&zh, rec + cb + 2, 2);
        const double s = kvb_f16_to_f32(sh), z = kvb_f16_to_f32(zh);
        for (int i = 0; i < G; i++) {
            const double v = row_val(x, dt, group_elem(gi, i, d, G, per_channel)), deq = group_value(rec, G, bits, i);
            within &= s >= 0 && fabs(v - deq) <= s / 2 + 0x1p-22 * (fabs(v) + fabs(z) + qmax * s);
        }
    }
    CU_ASSERT(within);
    free(x), free(ref), free(got);
    release_all(be);
}

static void test_quant_groups_are_the_headers_records_bit_for_bit_within_half_a_step(void) {
    const int widths[] = {1, 3, 17, 64};
    EACH_BACKEND(be) for (int fi = 0; fi < COUNT(quant_fmts); fi++) for (int dt = 0; dt < 2; dt++) {
        const quant_fmt f = quant_fmts[fi];
        for (int wi = 0; wi < COUNT(widths); wi++) /* keys: any width, rows in whole groups */
            for (int64_t m = 0; m < 4; m += 1 + (m > 0)) check_quant_groups(be, (kvb_dtype)dt, f, widths[wi], m * f.G, 1);
        for (int64_t n = 0; n < 7; n += 1 + 3 * (n > 0)) /* values: rows of whole groups, any count */
            for (int m = 1; m <= 3; m += 2) check_quant_groups(be, (kvb_dtype)dt, f, m * f.G, n, 0);
    }
}

/* a head's quantized K or V: random codes, scales (now and then 0) and minima as f16 */
static void random_records(uint8_t *rec, int64_t n_rec, quant_fmt f) {
    const size_t rb = kvb_quant_group_bytes(f.G, f.bits), cb = (size_t)f.G * f.bits / 8;
    fill_bytes(rec, (size_t)n_rec * rb);
    for (int64_t r = 0; r < n_rec; r++) {
        const kvb_f16 sh = rnd(8) == 0 ? 0 : kvb_f32_to_f16((float)(unit() * 4 / ((1 << f.bits) - 1)));
        const kvb_f16 zh = kvb_f32_to_f16((float)(-2 * unit()));
        memcpy(rec + r * rb + cb, &sh, 2), memcpy(rec + r * rb + cb + 2, &zh, 2);
    }
}

/* The reference check shared by the ops that merge a new part of attention into the store's (attention_quant,
 * attention_narrow), for one query row qr (dk wide) over n keys k (dk wide, at positions kpos, or pos0 + i when kpos
 * is NULL; hidden past qpos when masked) and values v (D wide): the scores in float, as the kernel computes them, and
 * in float64; the op's o and l against the store part's o0 and l0 merged with float64 attention (near) and, on the
 * CPU, with the header's float order and the CPU's double exp (kernels/cpu/expd.h) bit for bit (exact); with every key hidden, o and l are o0 and l0 (kept).
 * sf, s64, w64 (n) and accf (D) are scratch. */
static void merged_row_check(int64_t n, int D, int dk, const float *qr, const float *k, const float *v, float scale,
                             int masked, const int32_t *kpos, int32_t pos0, int32_t qpos, float l0, const float *o0,
                             const float *o, float l, int cpu, float *sf, double *s64, double *w64, float *accf,
                             int *kept, int *near, int *exact) {
    float mf = l0; /* the header's float maximum */
    double m = l0, mag_s = 0;
    int64_t seen = 0;
    for (int64_t i = 0; i < n; i++) {
        sf[i] = -INFINITY, s64[i] = -INFINITY;
        if (masked && (kpos ? kpos[i] : pos0 + (int32_t)i) > qpos) continue;
        const float *ki = k + i * dk;
        float dot_f = 0;
        double dot = 0, dmag = 0;
        for (int j = 0; j < dk; j++) dot_f += qr[j] * ki[j], dot += (double)qr[j] * ki[j], dmag += fabs((double)qr[j] * ki[j]);
        sf[i] = scale * dot_f, s64[i] = scale * dot, mag_s = fmax(mag_s, scale * dmag), seen++;
        mf = sf[i] > mf ? sf[i] : mf, m = fmax(m, s64[i]);
    }
    if (!seen) { /* every key hidden: the store's part stands, bit for bit */
        *kept &= !memcmp(o, o0, (size_t)D * 4) && !memcmp(&l, &l0, 4);
        return;
    }
    const double w0 = isfinite(l0) ? exp(l0 - m) : 0.0, w0f = isfinite(l0) ? kvb_exp_d((double)l0 - mf) : 0.0;
    double L = w0, sum_f = 0;
    for (int e = 0; e < D; e++) accf[e] = 0;
    for (int64_t i = 0; i < n; i++) {
        w64[i] = sf[i] == -INFINITY ? 0.0 : exp(s64[i] - m);
        L += w64[i];
        if (sf[i] == -INFINITY) continue;
        const double wf = kvb_exp_d((double)sf[i] - (double)mf); /* the CPU's double exp (kernels/cpu/expd.h) */
        sum_f += wf;
        for (int e = 0; e < D; e++) accf[e] += (float)wf * v[i * D + e];
    }
    const double Lf = w0f + sum_f, ds = (dk + 2) * 0x1p-23 * mag_s;
    for (int e = 0; e < D; e++) {
        double acc = 0, mag = w0 > 0 ? w0 * fabs(o0[e]) : 0;
        for (int64_t i = 0; i < n; i++) acc += w64[i] * v[i * D + e], mag += w64[i] * fabs(v[i * D + e]);
        const double ref = ((w0 > 0 ? w0 * o0[e] : 0) + acc) / L;
        *near &= fabs(o[e] - ref) <= (4 * ds + (double)(n + 4) * 0x1p-23) * mag / L + 1e-30;
        if (cpu) *exact &= o[e] == (float)(((w0f > 0 ? w0f * o0[e] : 0.0) + accf[e]) / Lf);
    }
    const double lse_ref = m + log(L);
    *near &= fabs(l - lse_ref) <= 2 * ds + 0x1p-23 * (fabs(lse_ref) + 1);
    if (cpu) *exact &= l == (float)((double)mf + log(Lf));
}

/* The reference is the header's formula in float64 from the dequantized K and V. Every backend must be within a
 * bound of it: the header computes a logit in float (D products and sums: error ds = (D + 2) 2^-23 sum|scale q k|),
 * which moves each weight and L by up to 2 ds relatively, and sums the weighted values in float ((n + 4) roundings
 * of 2^-23 relative to sum w|v|); lse moves by ds and one rounding. The CPU is also held to the header's float
 * steps bit for bit (only the double exp and log may differ on a GPU). Rows that see no token keep out and lse
 * bit for bit on every backend. Rows whose store part is empty (lse = -inf) hold NaN in out: w0 = 0 must not read it. */
static void check_attention_quant(kvb_backend *be, int HK, int Gq, quant_fmt f, int D, int64_t n, int64_t n_q, int masked) {
    char err[256];
    enum { MAXK = 3 };
    const int H = HK * Gq, G = f.G, bits = f.bits;
    const size_t rb = kvb_quant_group_bytes(G, bits);
    const int64_t nk = n / G * D, nv = n * (D / G), no = n_q * H * D; /* records per head; outputs */
    const int32_t pos0 = (int32_t)rnd(100);
    const float scale = (float)((0.5 + unit()) / sqrt((double)D));
    float *q = malloc((size_t)no * 4), *out0 = malloc((size_t)no * 4), *got = malloc((size_t)no * 4);
    float *lse0 = malloc((size_t)(H * n_q) * 4), *lse = malloc((size_t)(H * n_q) * 4);
    float *kf = malloc((size_t)(HK * n * D) * 4 + 4), *vf = malloc((size_t)(HK * n * D) * 4 + 4), *sf = malloc((size_t)n * 4 + 4);
    float *accf = malloc((size_t)D * 4);
    double *s64 = malloc((size_t)n * 8 + 8), *w64 = malloc((size_t)n * 8 + 8);
    int32_t *qpos = malloc((size_t)n_q * 4);
    const void *dk[MAXK], *dv[MAXK];
    CU_ASSERT_FATAL(HK <= MAXK);
    for (int g = 0; g < HK; g++) {
        uint8_t *k = malloc((size_t)nk * rb + 1), *v = malloc((size_t)nv * rb + 1);
        random_records(k, nk, f), random_records(v, nv, f);
        for (int64_t i = 0; i < n; i++)
            for (int e = 0; e < D; e++) {
                kf[(g * n + i) * D + e] = group_value(k + (size_t)(i / G * D + e) * rb, G, bits, (int)(i % G));
                vf[(g * n + i) * D + e] = group_value(v + (size_t)(i * (D / G) + e / G) * rb, G, bits, e % G);
            }
        dk[g] = up(be, k, (size_t)nk * rb), dv[g] = up(be, v, (size_t)nv * rb);
        free(k), free(v);
    }
    for (int64_t i = 0; i < no; i++) q[i] = (float)(unit() * 2 - 1);
    for (int64_t t = 0; t < n_q; t++) qpos[t] = pos0 - 2 + (int32_t)rnd(n + 4); /* some rows see nothing */
    for (int h = 0; h < H; h++)
        for (int64_t t = 0; t < n_q; t++) { /* the store part: empty, negligible, or comparable */
            const int kind = (int)rnd(4);
            lse0[h * n_q + t] = kind == 0 ? -INFINITY : kind == 1 ? -1000.0f : (float)(unit() * 8 - 3);
            for (int e = 0; e < D; e++) out0[(t * H + h) * D + e] = kind == 0 ? NAN : (float)(unit() * 2 - 1);
        }
    float *dout = up(be, out0, (size_t)no * 4), *dlse = up(be, lse0, (size_t)(H * n_q) * 4);
    kvb_attn_args a = {.n_q = n_q, .n_head = H, .n_head_kv = HK, .head_dim = D, .q = up(be, q, (size_t)no * 4),
                       .q_pos = masked ? up(be, qpos, (size_t)n_q * 4) : NULL, .scale = scale, .out = dout, .lse = dlse};
    kvb_quant_kv qkv = {.k = dk, .v = dv, .n = n, .pos0 = pos0, .group = G, .bits = bits};
    CU_ASSERT(be->attention_quant(be, &a, &qkv, err, sizeof err) == 0);
    down(be, got, dout, (size_t)no * 4);
    down(be, lse, dlse, (size_t)(H * n_q) * 4);
    int kept = 1, near = 1, exact = 1;
    for (int64_t t = 0; t < n_q; t++)
        for (int h = 0; h < H; h++) {
            const int g = h / Gq;
            const float *qr = q + (t * H + h) * D, *o0 = out0 + (t * H + h) * D, *o = got + (t * H + h) * D;
            const float l0 = lse0[h * n_q + t], l = lse[h * n_q + t];
            merged_row_check(n, D, D, qr, kf + g * n * D, vf + g * n * D, scale, masked, NULL, pos0, qpos[t], l0, o0, o, l,
                             is_cpu(be), sf, s64, w64, accf, &kept, &near, &exact);
        }
    CU_ASSERT(kept);
    CU_ASSERT(near);
    CU_ASSERT(exact);
    free(q), free(out0), free(got), free(lse0), free(lse), free(kf), free(vf), free(sf), free(accf), free(s64), free(w64), free(qpos);
    release_all(be);
}

static void test_attention_quant_merges_the_quantized_softmax_into_the_stores_as_float64_says(void) {
    EACH_BACKEND(be) for (int fi = 0; fi < COUNT(quant_fmts); fi++) for (int gi = 0; gi < COUNT(groups); gi++)
        for (int ni = 0; ni < 4; ni++) for (int masked = 0; masked < 2; masked++) {
            const quant_fmt f = quant_fmts[fi];
            /* head_dim up to 128, now and then the most under 256 (the CUDA kernels' most, Gemma-3's head_dim) */
            const int D = f.G * (rnd(6) == 0 ? 256 / f.G : 1 + (int)rnd(128 / f.G));
            /* no tokens, one group, some groups, past 512 (the CUDA kernel's chunk) */
            const int64_t n = f.G * (ni == 0 ? 0 : ni == 1 ? 1 : ni == 2 ? 1 + rnd(24) : (530 + f.G - 1) / f.G);
            check_attention_quant(be, 1 + (int)rnd(3), groups[gi], f, D, n, ni == 3 ? 1 + rnd(2) : 1 + rnd(5), masked);
        }
}


/* ---- ThinK's narrow keys: gather_cols, attention_narrow ---- */

/* Every row's listed columns (repeats and any order allowed), copied bit for bit, strides wider than the rows; the
 * bytes between an output row's m columns and its stride are left as they were. */
static void check_gather_cols(kvb_backend *be, kvb_dtype dt, int64_t n, int m, int64_t in_stride) {
    char err[256];
    const size_t es = elt(dt);
    const int64_t out_stride = m + rnd(3);
    uint8_t *x = malloc((size_t)(n * in_stride) * es + 1), *ref = malloc((size_t)(n * out_stride) * es + 1);
    uint8_t *got = malloc((size_t)(n * out_stride) * es + 1);
    int32_t *cols = malloc((size_t)m * 4 + 4);
    fill_bytes(x, (size_t)(n * in_stride) * es);
    fill_bytes(ref, (size_t)(n * out_stride) * es);
    for (int j = 0; j < m; j++) cols[j] = (int32_t)rnd(in_stride);
    uint8_t *dout = up(be, ref, (size_t)(n * out_stride) * es);
    for (int64_t r = 0; r < n; r++)
        for (int j = 0; j < m; j++) memcpy(ref + (size_t)(r * out_stride + j) * es, x + (size_t)(r * in_stride + cols[j]) * es, es);
    CU_ASSERT(be->gather_cols(be, dout, out_stride, up(be, x, (size_t)(n * in_stride) * es), in_stride, dt,
                              up(be, cols, (size_t)m * 4), m, n, err, sizeof err) == 0);
    down(be, got, dout, (size_t)(n * out_stride) * es);
    CU_ASSERT(memcmp(got, ref, (size_t)(n * out_stride) * es) == 0);
    free(x), free(ref), free(got), free(cols);
    release_all(be);
}

static void test_gather_cols_copies_each_rows_listed_columns_bit_for_bit(void) {
    char err[256];
    const int64_t ns[] = {0, 1, 7, 300};
    EACH_BACKEND(be) for (int di = 0; di < 2; di++) for (int ni = 0; ni < COUNT(ns); ni++) for (int hi = 0; hi < COUNT(head_dims); hi++) {
        const int D = head_dims[hi];
        check_gather_cols(be, di ? KVB_F16 : KVB_F32, ns[ni], 1 + (int)rnd(D), D + rnd(2) * D * (int64_t)rnd(4));
    }
    EACH_BACKEND(be) { /* a stride shorter than the columns is refused by name */
        CU_ASSERT(be->gather_cols(be, dev(be, 64), 2, dev(be, 64), 4, KVB_F32, dev(be, 16), 3, 1, err, sizeof err) == -1);
        CU_ASSERT(strstr(err, "gather_cols") != NULL);
        release_all(be);
    }
}

/* The reference is the header's formula in float64 from the narrow K rows (kept channels) and whole V rows, with
 * positions per KV head in any order (some past a query's position). Bounds as attention_quant's: a logit in float
 * over dk products moves by ds = (dk + 2) 2^-23 sum|scale q k|, the value sums by (n + 4) roundings; the CPU is also
 * held to the header's float steps bit for bit. Rows that see nothing keep out and lse bit for bit; rows whose
 * store part is empty (lse = -inf) hold NaN in out, which w0 = 0 must not read. */
static void check_attention_narrow(kvb_backend *be, int HK, int Gq, int D, int dk, int64_t n, int64_t n_q, int masked,
                                   kvb_dtype dt) {
    char err[256];
    enum { MAXK = 3 };
    const int H = HK * Gq;
    const size_t es = elt(dt);
    const int64_t no = n_q * H * D, ng = n_q * H * dk;
    const float scale = (float)((0.5 + unit()) / sqrt((double)D));
    float *qg = malloc((size_t)ng * 4 + 4), *out0 = malloc((size_t)no * 4), *got = malloc((size_t)no * 4);
    float *lse0 = malloc((size_t)(H * n_q) * 4), *lse = malloc((size_t)(H * n_q) * 4);
    float *kf = malloc((size_t)(HK * n * dk) * 4 + 4), *vf = malloc((size_t)(HK * n * D) * 4 + 4), *sf = malloc((size_t)n * 4 + 4);
    float *accf = malloc((size_t)D * 4);
    double *s64 = malloc((size_t)n * 8 + 8), *w64 = malloc((size_t)n * 8 + 8);
    int32_t *qpos = malloc((size_t)n_q * 4), *pos = malloc((size_t)(HK * n) * 4 + 4);
    const void *dkp[MAXK], *dvp[MAXK];
    const int32_t *dpp[MAXK];
    CU_ASSERT_FATAL(HK <= MAXK);
    for (int g = 0; g < HK; g++) {
        void *k = malloc((size_t)(n * dk) * es + 1), *v = malloc((size_t)(n * D) * es + 1);
        fill_rows(k, n * dk, dt), fill_rows(v, n * D, dt);
        for (int64_t i = 0; i < n * dk; i++) kf[g * n * dk + i] = dt == KVB_F16 ? kvb_f16_to_f32(((kvb_f16 *)k)[i]) : ((float *)k)[i];
        for (int64_t i = 0; i < n * D; i++) vf[g * n * D + i] = dt == KVB_F16 ? kvb_f16_to_f32(((kvb_f16 *)v)[i]) : ((float *)v)[i];
        for (int64_t i = 0; i < n; i++) pos[g * n + i] = (int32_t)rnd(n + 2); /* any order, repeats */
        dkp[g] = up(be, k, (size_t)(n * dk) * es), dvp[g] = up(be, v, (size_t)(n * D) * es);
        dpp[g] = up(be, pos + g * n, (size_t)n * 4);
        free(k), free(v);
    }
    for (int64_t i = 0; i < ng; i++) qg[i] = (float)(unit() * 2 - 1);
    for (int64_t t = 0; t < n_q; t++) qpos[t] = (int32_t)rnd(n + 4) - 2; /* some rows see nothing */
    for (int h = 0; h < H; h++)
        for (int64_t t = 0; t < n_q; t++) { /* the store part: empty, negligible, or comparable */
            const int kind = (int)rnd(4);
            lse0[h * n_q + t] = kind == 0 ? -INFINITY : kind == 1 ? -1000.0f : (float)(unit() * 8 - 3);
            for (int e = 0; e < D; e++) out0[(t * H + h) * D + e] = kind == 0 ? NAN : (float)(unit() * 2 - 1);
        }
    float *dout = up(be, out0, (size_t)no * 4), *dlse = up(be, lse0, (size_t)(H * n_q) * 4);
    kvb_attn_args a = {.n_q = n_q, .n_head = H, .n_head_kv = HK, .head_dim = D, .kv_dtype = dt,
                       .q_pos = masked ? up(be, qpos, (size_t)n_q * 4) : NULL, .scale = scale, .out = dout, .lse = dlse};
    kvb_narrow_kv nk = {.k = dkp, .v = dvp, .pos = dpp, .n = n, .dk = dk, .qg = up(be, qg, (size_t)ng * 4)};
    CU_ASSERT(be->attention_narrow(be, &a, &nk, err, sizeof err) == 0);
    down(be, got, dout, (size_t)no * 4);
    down(be, lse, dlse, (size_t)(H * n_q) * 4);
    int kept = 1, near = 1, exact = 1;
    for (int64_t t = 0; t < n_q; t++)
        for (int h = 0; h < H; h++) {
            const int g = h / Gq;
            const float *qr = qg + (t * H + h) * dk, *o0 = out0 + (t * H + h) * D, *o = got + (t * H + h) * D;
            const float l0 = lse0[h * n_q + t], l = lse[h * n_q + t];
            merged_row_check(n, D, dk, qr, kf + g * n * dk, vf + g * n * D, scale, masked, pos + g * n, 0, qpos[t], l0, o0, o,
                             l, is_cpu(be), sf, s64, w64, accf, &kept, &near, &exact);
        }
    CU_ASSERT(kept);
    CU_ASSERT(near);
    CU_ASSERT(exact);
    free(qg), free(out0), free(got), free(lse0), free(lse), free(kf), free(vf), free(sf), free(accf), free(s64), free(w64);
    free(qpos), free(pos);
    release_all(be);
}

static void test_attention_narrow_merges_the_narrow_key_softmax_into_the_stores_as_float64_says(void) {
    EACH_BACKEND(be) for (int gi = 0; gi < COUNT(groups); gi++) for (int ni = 0; ni < 4; ni++)
        for (int masked = 0; masked < 2; masked++) for (int di = 0; di < 2; di++) {
            const int D = head_dims[rnd(COUNT(head_dims))], dk = 1 + (int)rnd(D);
            /* no tokens, one, some, past 512 (the CUDA kernel's chunk) */
            const int64_t n = ni == 0 ? 0 : ni == 1 ? 1 : ni == 2 ? 2 + rnd(40) : 530 + rnd(20);
            check_attention_narrow(be, 1 + (int)rnd(3), groups[gi], D, dk, n, ni == 3 ? 1 + rnd(2) : 1 + rnd(5), masked,
                                   di ? KVB_F16 : KVB_F32);
        }
}


/* ---- elementwise ops on per-slot vectors: mul_f32, axpby_f32, softmax_rows, proj_sqnorms, block_scaled_std,
 * block_normalize, block_ranks ----
 * The header fixes each one's precision and order (products of floats are exact in double; sums in one order), so
 * the reference below, written from the header in double, is every backend's answer bit for bit; softmax_rows'
 * exp alone may differ from glibc's in the last bit on other backends (held to 4 float ulps there). */

static void fill_signed(float *x, int64_t n, double scale) {
    for (int64_t i = 0; i < n; i++) x[i] = rnd(9) == 0 ? 0.0f : (float)((unit() * 2 - 1) * scale);
}

static int same_bits(const float *a, const float *b, int64_t n) { return !memcmp(a, b, (size_t)n * 4); }

static int within_ulps(const float *got, const float *ref, int64_t n, double ulps) {
    for (int64_t i = 0; i < n; i++) {
        if (isnan(ref[i]) ? !isnan(got[i]) : fabs((double)got[i] - ref[i]) > ulps * 0x1p-23 * fabs((double)ref[i]) + 1e-45)
            return 0;
    }
    return 1;
}

static void check_mul_axpby(kvb_backend *be, int64_t n) {
    char err[256];
    const size_t bytes = (size_t)(n + 1) * 4;
    float *a = malloc(bytes), *b = malloc(bytes), *ref = malloc(bytes), *got = malloc(bytes);
    fill_signed(a, n + 1, 1e3), fill_signed(b, n + 1, 1e-2);
    const double alpha = (unit() - 0.5) * 3, beta = unit() * 7, gamma = rnd(2) ? 0.0 : 1e-2;
    for (int pass = 0; pass < 3; pass++) { /* mul; axpby with b; axpby without */
        for (int64_t i = 0; i <= n; i++) ref[i] = got[i] = -777.0f; /* slot n: past the vector, left alone */
        for (int64_t i = 0; i < n; i++)
            ref[i] = pass == 0 ? a[i] * b[i]
                               : (float)(alpha * (double)a[i] + (pass == 1 ? beta * (double)b[i] : 0.0) + gamma);
        float *dout = up(be, got, bytes), *da = up(be, a, bytes), *db = up(be, b, bytes);
        const int rc = pass == 0 ? be->mul_f32(be, dout, da, db, n, err, sizeof err)
                                 : be->axpby_f32(be, dout, da, alpha, pass == 1 ? db : NULL, beta, gamma, n, err, sizeof err);
        CU_ASSERT(rc == 0);
        down(be, got, dout, bytes);
        CU_ASSERT(same_bits(got, ref, n + 1));
        if (pass == 0) { /* in place: out = a */
            CU_ASSERT(be->mul_f32(be, da, da, db, n, err, sizeof err) == 0);
            down(be, got, da, bytes);
            CU_ASSERT(same_bits(got, ref, n));
        }
        release_all(be);
    }
    free(a), free(b), free(ref), free(got);
}

static void test_mul_f32_and_axpby_f32_are_the_float_product_and_the_double_combination(void) {
    const int64_t ns[] = {0, 1, 17, 1000};
    EACH_BACKEND(be) for (int ni = 0; ni < COUNT(ns); ni++) for (int rep = 0; rep < 3; rep++) check_mul_axpby(be, ns[ni]);
}

static void check_softmax_rows(kvb_backend *be, int64_t rows, int64_t n, int64_t stride, int special) {
    char err[256];
    const int64_t total = rows * stride + 1;
    float *x = malloc((size_t)total * 4), *ref = malloc((size_t)total * 4), *got = malloc((size_t)total * 4);
    fill_signed(x, total, 30);
    if (special == 1 && n) x[rnd(rows) * stride + rnd(n)] = NAN;      /* its row: NaN */
    if (special == 2 && n) for (int64_t i = 0; i < n; i++) x[i] = -INFINITY; /* row 0: -inf throughout */
    if (special == 3 && n > 1) x[stride * (rows - 1)] = -INFINITY;       /* one -inf: probability 0 */
    memcpy(ref, x, (size_t)total * 4);
    for (int64_t r = 0; r < rows; r++) {
        float *row = ref + r * stride;
        double m = -INFINITY, s = 0;
        int nan = 0;
        for (int64_t i = 0; i < n; i++) nan |= isnan(row[i]), m = row[i] > m ? row[i] : m;
        for (int64_t i = 0; i < n; i++) s += exp((double)row[i] - m);
        for (int64_t i = 0; i < n; i++) row[i] = nan ? NAN : (float)(exp((double)row[i] - m) / s);
    }
    float *dx = up(be, x, (size_t)total * 4);
    CU_ASSERT(be->softmax_rows(be, dx, stride, rows, n, err, sizeof err) == 0);
    down(be, got, dx, (size_t)total * 4);
    CU_ASSERT(is_cpu(be) ? same_bits(got, ref, total) : within_ulps(got, ref, total, 4));
    for (int64_t r = 0; r < rows && special == 0 && n; r++) { /* and the rows are distributions */
        double s = 0;
        for (int64_t i = 0; i < n; i++) s += got[r * stride + i];
        CU_ASSERT(fabs(s - 1) < 1e-5);
    }
    free(x), free(ref), free(got);
    release_all(be);
}

static void test_softmax_rows_are_each_rows_double_softmax_in_place_nan_and_minus_inf_as_torch(void) {
    const int64_t shapes[][3] = {{1, 0, 0}, {1, 1, 1}, {3, 17, 20}, {7, 300, 300}, {2, 5000, 5003}};
    EACH_BACKEND(be) for (int si = 0; si < COUNT(shapes); si++) for (int sp = 0; sp < 4; sp++)
        check_softmax_rows(be, shapes[si][0], shapes[si][1], shapes[si][2], sp);
    char err[256];
    EACH_BACKEND(be) { /* rows overlapping: refused with one line */
        float *x = dev(be, 64);
        CU_ASSERT(be->softmax_rows(be, x, 2, 2, 4, err, sizeof err) == -1 && strstr(err, "softmax_rows") != NULL);
        release_all(be);
    }
}

/* the Gram matrix entry by entry, each sum over the rows in order (the header's arithmetic) */
UTIL_REFERENCE static void gram_ref(float *ref, const float *x, int64_t n, int d) {
    for (int a = 0; a < d; a++)
        for (int b = 0; b < d; b++) {
            double acc = 0;
            for (int64_t j = 0; j < n; j++) acc += (double)x[j * d + a] * (double)x[j * d + b];
            ref[a * d + b] = (float)acc;
        }
}

static void check_gram_f32(kvb_backend *be, int d, int64_t n) {
    char err[256];
    float *x = malloc((size_t)(n * d + 1) * 4), *ref = malloc((size_t)(d * d + 1) * 4), *got = malloc((size_t)(d * d + 1) * 4);
    fill_signed(x, n * d + 1, 3.0);
    for (int64_t i = 0; i <= (int64_t)d * d; i++) ref[i] = got[i] = -777.0f;
    gram_ref(ref, x, n, d);
    float *dout = up(be, got, (size_t)(d * d + 1) * 4);
    CU_ASSERT(be->gram_f32(be, dout, up(be, x, (size_t)(n * d + 1) * 4), n, d, err, sizeof err) == 0);
    down(be, got, dout, (size_t)(d * d + 1) * 4);
    CU_ASSERT(same_bits(got, ref, (int64_t)d * d + 1)); /* every entry, and nothing past the last */
    free(x), free(ref), free(got);
    release_all(be);
}

/* Compactor's X^T X: bit for bit the ordered double sums, on the head sizes and row counts around a warp */
static void test_gram_f32_is_each_entrys_double_sum_over_the_rows_in_order(void) {
    char err[256];
    const int64_t ns[] = {0, 1, 31, 257};
    EACH_BACKEND(be) {
        for (int hd = 0; hd < COUNT(head_dims); hd++) for (int ni = 0; ni < COUNT(ns); ni++)
            check_gram_f32(be, head_dims[hd], ns[ni]);
        CU_ASSERT(be->gram_f32(be, NULL, NULL, 4, 0, err, sizeof err) == -1 && strstr(err, "gram_f32") != NULL);
    }
}

static void check_proj_sqnorms(kvb_backend *be, kvb_dtype dt, int dim, int64_t n, int m) {
    char err[256];
    const size_t es = elt(dt);
    uint8_t *x = malloc((size_t)(n * dim) * es + 1);
    float *u = malloc((size_t)(m * dim + 1) * 4), *ref = malloc((size_t)(n + 1) * 4), *got = malloc((size_t)(n + 1) * 4);
    fill_rows(x, n * dim, dt);
    fill_signed(u, (int64_t)m * dim + 1, 0.5);
    for (int64_t j = 0; j <= n; j++) ref[j] = got[j] = -777.0f;
    for (int64_t j = 0; j < n; j++) {
        double acc = 0;
        for (int r = 0; r < m; r++) {
            double d = 0;
            for (int e = 0; e < dim; e++) d += (double)u[r * dim + e] * row_val(x, dt, j * dim + e);
            acc += d * d;
        }
        ref[j] = (float)acc;
    }
    float *dout = up(be, got, (size_t)(n + 1) * 4);
    CU_ASSERT(be->proj_sqnorms(be, dout, up(be, x, (size_t)(n * dim) * es), dt, dim, n,
                               up(be, u, (size_t)(m * dim + 1) * 4), m, err, sizeof err) == 0);
    down(be, got, dout, (size_t)(n + 1) * 4);
    CU_ASSERT(same_bits(got, ref, n + 1));
    free(x), free(u), free(ref), free(got);
    release_all(be);
}

/* u: m rows of dim floats, `pad` floats apart beyond dim (a column slice of a wider matrix) */
static void check_proj_l1norms(kvb_backend *be, kvb_dtype dt, int dim, int64_t n, int m, int pad) {
    char err[256];
    const size_t es = elt(dt);
    const int64_t stride = dim + pad;
    uint8_t *x = malloc((size_t)(n * dim) * es + 1);
    float *u = malloc((size_t)(m * stride + 1) * 4), *ref = malloc((size_t)(n + 1) * 4), *got = malloc((size_t)(n + 1) * 4);
    fill_rows(x, n * dim, dt);
    fill_signed(u, m * stride + 1, 0.5);
    for (int64_t j = 0; j <= n; j++) ref[j] = got[j] = -777.0f;
    for (int64_t j = 0; j < n; j++) {
        double acc = 0;
        for (int r = 0; r < m; r++) {
            double d = 0;
            for (int e = 0; e < dim; e++) d += (double)u[r * stride + e] * row_val(x, dt, j * dim + e);
            acc += fabs(d);
        }
        ref[j] = (float)acc;
    }
    float *dout = up(be, got, (size_t)(n + 1) * 4);
    CU_ASSERT(be->proj_l1norms(be, dout, up(be, x, (size_t)(n * dim) * es), dt, dim, n,
                               up(be, u, (size_t)(m * stride + 1) * 4), stride, m, err, sizeof err) == 0);
    down(be, got, dout, (size_t)(n + 1) * 4);
    CU_ASSERT(same_bits(got, ref, n + 1));
    CU_ASSERT(be->proj_l1norms(be, dout, dout, dt, dim, n, u, dim - 1, m, err, sizeof err) == -1 &&
              strstr(err, "proj_l1norms") != NULL); /* rows overlapping: refused */
    free(x), free(u), free(ref), free(got);
    release_all(be);
}

static void test_proj_sqnorms_and_proj_l1norms_are_the_double_sums_of_each_rows_projections(void) {
    const int64_t ns[] = {0, 1, 33, 200};
    const int ms[] = {0, 1, 5, 32};
    EACH_BACKEND(be) for (int hd = 0; hd < COUNT(head_dims); hd++) for (int ni = 0; ni < COUNT(ns); ni++)
        for (int mi = 0; mi < COUNT(ms); mi++) {
            check_proj_sqnorms(be, (kvb_dtype)rnd(2), head_dims[hd], ns[ni], ms[mi]);
            check_proj_l1norms(be, (kvb_dtype)rnd(2), head_dims[hd], ns[ni], ms[mi], (int)rnd(3) * head_dims[hd]);
        }
}

static void check_block_scaled_std(kvb_backend *be, kvb_dtype dt, int dim, int64_t n, int64_t block) {
    char err[256];
    const size_t es = elt(dt);
    const int64_t nb = n ? (n + block - 1) / block : 1;
    uint8_t *x = malloc((size_t)(n * dim) * es + 1);
    float *lo = malloc((size_t)(nb * dim) * 4), *hi = malloc((size_t)(nb * dim) * 4);
    float *ref = malloc((size_t)(n + 1) * 4), *got = malloc((size_t)(n + 1) * 4);
    fill_rows(x, n * dim, dt);
    for (int64_t i = 0; i < nb * dim; i++) { /* ranges of another block's rows: y outside [0, 1] too */
        lo[i] = (float)(unit() * 2 - 1.5);
        hi[i] = lo[i] + (float)(unit() * 3 + 0.01);
    }
    if (nb * dim > 1 && rnd(3) == 0) hi[1] = lo[1]; /* an empty range: inf or NaN as the division gives */
    for (int64_t i = 0; i <= n; i++) ref[i] = got[i] = -777.0f;
    for (int64_t i = 0; i < n; i++) {
        const float *l = lo + i / block * dim, *h = hi + i / block * dim;
        double mean = 0, ss = 0;
        for (int e = 0; e < dim; e++) mean += (row_val(x, dt, i * dim + e) - (double)l[e]) / ((double)h[e] - l[e]);
        mean /= dim;
        for (int e = 0; e < dim; e++) {
            const double y = (row_val(x, dt, i * dim + e) - (double)l[e]) / ((double)h[e] - l[e]) - mean;
            ss += y * y;
        }
        ref[i] = (float)sqrt(ss / (dim - 1));
    }
    float *dout = up(be, got, (size_t)(n + 1) * 4);
    CU_ASSERT(be->block_scaled_std(be, dout, up(be, x, (size_t)(n * dim) * es), dt, dim, n,
                                   up(be, lo, (size_t)(nb * dim) * 4), up(be, hi, (size_t)(nb * dim) * 4), block, err,
                                   sizeof err) == 0);
    down(be, got, dout, (size_t)(n + 1) * 4);
    int same = 1; /* NaN payloads aside */
    for (int64_t i = 0; i <= n; i++) same &= isnan(ref[i]) ? isnan(got[i]) != 0 : got[i] == ref[i];
    CU_ASSERT(same);
    free(x), free(lo), free(hi), free(ref), free(got);
    release_all(be);
}

static void test_block_scaled_std_is_each_rows_sample_std_after_its_blocks_range_scaling(void) {
    const int64_t ns[] = {0, 1, 16, 130};
    const int64_t blocks[] = {1, 7, 128};
    EACH_BACKEND(be) for (int hd = 0; hd < COUNT(head_dims); hd++) for (int ni = 0; ni < COUNT(ns); ni++)
        for (int bi = 0; bi < COUNT(blocks); bi++)
            check_block_scaled_std(be, (kvb_dtype)rnd(2), head_dims[hd], ns[ni], blocks[bi]);
}

static void check_block_normalize_ranks(kvb_backend *be, int64_t n, int64_t block) {
    char err[256];
    const size_t bytes = (size_t)(n + 1) * 4;
    float *x = malloc(bytes), *ref = malloc(bytes), *got = malloc(bytes), *rank = malloc(bytes);
    for (int64_t i = 0; i <= n; i++) x[i] = rnd(4) == 0 ? (float)rnd(3) : (float)(unit() * 5); /* ties: 0, 1, 2 */
    if (n > 3 && rnd(2)) x[rnd(n)] = NAN, x[rnd(n)] = NAN;
    if (n > 2 && rnd(2)) for (int64_t i = 0; i < block && i < n; i++) x[i] = 0.0f; /* a zero block: 0/0 */
    /* ranks: count the slots of the block sorting before, NaN last, equal keys by slot */
    for (int64_t i = 0; i <= n; i++) rank[i] = -777.0f;
    for (int64_t i = 0; i < n; i++) {
        int64_t c = 0;
        for (int64_t j = i / block * block; j < (i / block + 1) * block && j < n; j++) {
            const int before = isnan(x[j]) ? isnan(x[i]) && j < i : isnan(x[i]) || x[j] < x[i] || (x[j] == x[i] && j < i);
            c += before;
        }
        rank[i] = (float)c;
    }
    memcpy(ref, x, bytes);
    for (int64_t b0 = 0; b0 < n; b0 += block) {
        double s = 0;
        for (int64_t i = b0; i < b0 + block && i < n; i++) s += x[i];
        for (int64_t i = b0; i < b0 + block && i < n; i++) ref[i] = (float)((double)x[i] / s);
    }
    float *dx = up(be, x, bytes), *dr = up(be, got, bytes);
    for (int64_t i = 0; i <= n; i++) got[i] = -777.0f;
    dr = up(be, got, bytes);
    CU_ASSERT(be->block_ranks(be, dr, dx, n, block, err, sizeof err) == 0);
    down(be, got, dr, bytes);
    CU_ASSERT(same_bits(got, rank, n + 1));
    CU_ASSERT(be->block_normalize(be, dx, n, block, err, sizeof err) == 0);
    down(be, got, dx, bytes);
    int same = 1;
    for (int64_t i = 0; i <= n; i++) same &= isnan(ref[i]) ? isnan(got[i]) != 0 : got[i] == ref[i];
    CU_ASSERT(same);
    free(x), free(ref), free(got), free(rank);
    release_all(be);
}

static void test_block_normalize_and_block_ranks_divide_by_and_rank_within_each_block(void) {
    const int64_t ns[] = {0, 1, 16, 100, 513};
    const int64_t blocks[] = {1, 16, 128};
    EACH_BACKEND(be) for (int ni = 0; ni < COUNT(ns); ni++) for (int bi = 0; bi < COUNT(blocks); bi++)
        for (int rep = 0; rep < 2; rep++) check_block_normalize_ranks(be, ns[ni], blocks[bi]);
    char err[256];
    EACH_BACKEND(be) {
        float *x = dev(be, 16);
        CU_ASSERT(be->block_ranks(be, x, x, 4, 0, err, sizeof err) == -1 && strstr(err, "block_ranks") != NULL);
        CU_ASSERT(be->block_normalize(be, x, 4, -1, err, sizeof err) == -1 && strstr(err, "block_normalize") != NULL);
        release_all(be);
    }
}

/* ---- the op table: every data op kernels/backend.h declares has a test here, and every backend has it ----
 *
 * The list is parsed from the header's source. struct kvb_backend opens its data ops with the comment
 * "---- data ops (see above) ----" (its sub-markers "---- knorm, quest", "---- KIVI", "---- AdaKV" stay inside
 * the section) but has no closing marker: the section ends where the backend's lifecycle begins, at the field
 * `free` (then sync, allocator, kv_writer...). So the data ops are the function-pointer fields from that marker
 * up to `free`; the parse also requires each to be an `int` op reporting through (char *err, size_t err_len), as
 * the header's data ops do, so a moved marker or a new kind of field fails loudly instead of being skipped. C
 * cannot find a field by a name read at run time, so the NULL check takes offsets from an explicit table below,
 * which must list exactly the parsed ops. */

enum { MAX_OPS = 64, OP_NAME = 48 };

static int parse_data_ops(char names[][OP_NAME]) {
    const char *dir = getenv("KVB_SOURCE_DIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/kernels/backend.h", dir && *dir ? dir : ".");
    UTIL_REQUIRE_FILE(path);
    char *src = util_read_file(path, NULL);
    CU_ASSERT_FATAL(src != NULL);
    char *st = strstr(src, "struct kvb_backend {"), *mark = st ? strstr(st, "---- data ops") : NULL;
    char *end = st ? strstr(st, "\n};") : NULL;
    CU_ASSERT_FATAL(mark && end && mark < end);
    char *p = strstr(mark, "*/");
    CU_ASSERT_FATAL(p && p < end);
    *end = 0;
    char *w = p + 2; /* comments out, every run of white space to one space: one declaration a line of text */
    for (const char *c = p + 2; *c;) {
        if (c[0] == '/' && c[1] == '*') {
            const char *e = strstr(c + 2, "*/");
            CU_ASSERT_FATAL(e != NULL);
            c = e + 2;
            if (w > p + 2 && w[-1] != ' ') *w++ = ' ';
        } else if (isspace((unsigned char)*c)) {
            if (w > p + 2 && w[-1] != ' ') *w++ = ' ';
            c++;
        } else *w++ = *c++;
    }
    *w = 0;
    int n = 0, found_free = 0;
    for (char *decl = p + 2, *semi; !found_free && (semi = strchr(decl, ';')); decl = semi + 1) {
        *semi = 0;
        char *fp = strstr(decl, "(*");
        if (!fp) continue; /* not a function pointer */
        const size_t len = strspn(fp + 2, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_");
        CU_ASSERT_FATAL(len > 0 && len < OP_NAME && fp[2 + len] == ')');
        if (len == 4 && !strncmp(fp + 2, "free", 4)) {
            found_free = 1;
            break;
        }
        decl += *decl == ' ';
        const size_t dl = strlen(decl) - (semi > decl && semi[-1] == ' ');
        const int is_data_op = !strncmp(decl, "int (*", 6) && dl > 15 && !strncmp(decl + dl - 15, "size_t err_len)", 15);
        if (!is_data_op) printf("\n  backend.h: field %.*s in the data ops is not an int op with err, err_len\n", (int)len, fp + 2);
        CU_ASSERT_FATAL(is_data_op && n < MAX_OPS);
        memcpy(names[n], fp + 2, len), names[n++][len] = 0;
    }
    CU_ASSERT_FATAL(found_free);
    free(src);
    return n;
}

#define OP(f) {#f, offsetof(kvb_backend, f)}
static const struct {
    const char *name;
    size_t offset;
} op_fields[] = {
    OP(copy),         OP(zero), OP(attention_colsum),         OP(kv_gather),    OP(kv_load),         OP(kv_evict),     OP(probs_reduce),
    OP(pool1d),       OP(topk_idx),     OP(topk_rows),    OP(iota),         OP(gather_f32),      OP(round_scores), OP(pod_share),
    OP(pod_merge),    OP(row_norms),    OP(block_minmax), OP(block_scores),    OP(block_expand), OP(block_minmax_heads),
    OP(block_scores_heads), OP(block_expand_rows), OP(quant_groups),
    OP(attention_quant), OP(fill_idx_f32), OP(split_rows_idx), OP(mul_f32),    OP(axpby_f32),       OP(softmax_rows),
    OP(proj_sqnorms), OP(gram_f32),     OP(proj_l1norms), OP(block_scaled_std), OP(block_normalize), OP(block_ranks),
    OP(gather_cols),  OP(attention_narrow),
};
#undef OP

static void test_every_backend_has_every_data_op(void) {
    char names[MAX_OPS][OP_NAME];
    const int n = parse_data_ops(names);
    CU_ASSERT(n == COUNT(op_fields)); /* with every parsed name found below: the same list */
    for (int i = 0; i < n; i++) {
        int at = -1;
        for (int j = 0; j < COUNT(op_fields); j++)
            if (!strcmp(names[i], op_fields[j].name)) at = j;
        if (at < 0) printf("\n  data op %s (kernels/backend.h) is missing from op_fields\n", names[i]);
        CU_ASSERT(at >= 0);
        if (at < 0) continue;
        EACH_BACKEND(be) {
            void (*fn)(void);
            memcpy(&fn, (const char *)be + op_fields[at].offset, sizeof fn);
            if (!fn) printf("\n  backend %s lacks data op %s\n", be->name, names[i]);
            CU_ASSERT(fn != NULL);
        }
    }
}

/* A test covers the ops its name starts with, joined by "_and_" (copy_and_zero_move..., iota_and_gather_f32_...);
 * the longest op name that matches is taken. */
static int covers(const char *test, const char *op, char names[][OP_NAME], int n) {
    for (const char *p = test;;) {
        int hit = -1;
        size_t hit_len = 0;
        for (int i = 0; i < n; i++) {
            const size_t len = strlen(names[i]);
            if (len > hit_len && !strncmp(p, names[i], len) && p[len] == '_') hit = i, hit_len = len;
        }
        if (hit < 0) return 0;
        if (!strcmp(names[hit], op)) return 1;
        p += hit_len + 1;
        if (strncmp(p, "and_", 4)) return 0;
        p += 4;
    }
}

static void test_every_data_op_in_backend_h_has_a_test_here(void) {
    char names[MAX_OPS][OP_NAME];
    const int n = parse_data_ops(names);
    CU_ASSERT_FATAL(n > 0);
    const CU_pSuite suite = CU_get_current_suite();
    CU_ASSERT_FATAL(suite != NULL);
    for (int i = 0; i < n; i++) {
        int tested = 0;
        for (CU_pTest t = suite->pTest; t && !tested; t = t->pNext) tested = covers(t->pName, names[i], names, n);
        if (!tested) printf("\n  data op %s has no test_%s_... in tests/test_backend_ops.c\n", names[i], names[i]);
        CU_ASSERT(tested);
    }
}

/* ---- suite ---- */

static int open_backends(void) {
    char err[256];
    /* the CPU twice: one thread, and three, so that the ops' splits across a pool are held to the same bytes */
    for (int threads = 1; threads <= 3; threads += 2) {
        backends[n_backends] = kvb_backend_cpu_create(threads, err, sizeof err);
        if (!backends[n_backends++]) return 1;
    }
    kvb_backend *cuda = kvb_backend_cuda_create(err, sizeof err);
    if (cuda) backends[n_backends++] = cuda;
    else printf("\n(CUDA backend not tested: %s)\n", err);
    return 0;
}

static int close_backends(void) {
    for (int i = 0; i < n_backends; i++) kvb_backend_free(backends[i]);
    return 0;
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
    ADD(test_attention_colsum_is_the_group_sum_of_the_probabilities_never_written);
    ADD(test_pool1d_max_is_exact_and_avg_counts_the_padding);
    ADD(test_topk_idx_is_the_k_largest_in_slot_order_ties_to_lower_slot_nan_last);
    ADD(test_topk_rows_is_topk_idx_on_every_row);
    ADD(test_iota_and_gather_f32_are_exact);
    ADD(test_round_scores_sum_each_rounds_attention_and_mark_it_present);
    ADD(test_pod_share_normalises_base_heads_distant_mass_and_leaves_others);
    ADD(test_pod_merge_gates_the_distant_output_and_counts_merged_and_skipped_heads);
    ADD(test_row_norms_are_the_double_sum_of_squares_rooted_and_negated_on_request);
    ADD(test_block_minmax_rewrites_the_blocks_from_from_on_with_their_rows_min_and_max);
    ADD(test_block_scores_sum_or_max_each_heads_upper_bound_in_double);
    ADD(test_block_expand_lists_each_blocks_slots_and_cuts_the_last_at_n);
    ADD(test_block_minmax_heads_is_block_minmax_a_head_at_a_time);
    ADD(test_block_scores_heads_is_block_scores_a_head_at_a_time);
    ADD(test_block_expand_rows_lists_each_rows_blocks_then_the_tail);
    ADD(test_quant_groups_are_the_headers_records_bit_for_bit_within_half_a_step);
    ADD(test_attention_quant_merges_the_quantized_softmax_into_the_stores_as_float64_says);
    ADD(test_gather_cols_copies_each_rows_listed_columns_bit_for_bit);
    ADD(test_attention_narrow_merges_the_narrow_key_softmax_into_the_stores_as_float64_says);
    ADD(test_fill_idx_f32_stores_the_value_at_every_listed_slot_and_nowhere_else);
    ADD(test_split_rows_idx_counts_every_row_and_lists_its_offsets_in_order);
    ADD(test_mul_f32_and_axpby_f32_are_the_float_product_and_the_double_combination);
    ADD(test_softmax_rows_are_each_rows_double_softmax_in_place_nan_and_minus_inf_as_torch);
    ADD(test_proj_sqnorms_and_proj_l1norms_are_the_double_sums_of_each_rows_projections);
    ADD(test_gram_f32_is_each_entrys_double_sum_over_the_rows_in_order);
    ADD(test_block_scaled_std_is_each_rows_sample_std_after_its_blocks_range_scaling);
    ADD(test_block_normalize_and_block_ranks_divide_by_and_rank_within_each_block);
    ADD(test_every_data_op_in_backend_h_has_a_test_here);
    return util_run_suites();
}
