/* guard.c — KVB_GUARD (guard.h): the device tier in a mapping that is readable only while a backend op runs. */
#include "kernels/cpu/guard.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- the arena: one per process ----
 *
 * Protection is switched over [base, end) with end = the top rounded up to HUGE_BYTES, and memory goes back
 * to the system only in whole aligned HUGE_BYTES pieces, so the arena's transparent huge pages are never split:
 * an mprotect then rewrites one entry per 2 MiB instead of one per 4 KiB page (200 MiB in use: ~20 us per op
 * instead of ~5 ms). Blocks are page multiples; a block handed out again is zeroed where it may hold old data
 * (below `dirty`); above it pages are fresh or released, so zero already. */

enum { HUGE_BYTES = 2 << 20 };

typedef struct {
    size_t off, len; /* bytes from the base, page multiples */
} extent;

static struct {
    pthread_mutex_t mu;
    uint8_t *base;
    size_t reserved_bytes, page_bytes;
    size_t top_bytes;   /* [0, top) has been handed out; the free extents below it are in `free` */
    size_t dirty_bytes; /* above this offset the pages read as zeros */
    int depth;          /* ops running (nested or in other threads) */
    extent *free;       /* free extents below the top, by address, never adjacent */
    size_t n_free, cap_free;
} A = {.mu = PTHREAD_MUTEX_INITIALIZER};

static size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }
static size_t open_end(void) { return round_up(A.top_bytes, HUGE_BYTES); }

/* A failed mprotect leaves the guard in a state that either hides bugs or kills correct code: not
 * recoverable, and only possible when the system is out of mappings. */
static void protect(size_t off, size_t len, int prot) {
    if (len && mprotect(A.base + off, len, prot)) {
        perror("kvbench guard: mprotect");
        abort();
    }
}

/* Reserve the address range once (under A.mu): as large as the system lets us, from 64 GiB down, aligned to
 * huge pages. */
static int arena_reserve(void) {
    if (A.base) return 0;
    A.page_bytes = (size_t)sysconf(_SC_PAGESIZE);
    for (size_t bytes = (size_t)64 << 30; bytes >= (size_t)256 << 20; bytes /= 2) {
        void *p = mmap(NULL, bytes + HUGE_BYTES, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) continue;
        A.base = (uint8_t *)round_up((uintptr_t)p, HUGE_BYTES);
        A.reserved_bytes = bytes;
        madvise(A.base, bytes, MADV_HUGEPAGE); /* a hint: without it (THP off) the guard is only slower */
        return 0;
    }
    return -1;
}

static void arena_open(void) {
    pthread_mutex_lock(&A.mu);
    if (A.depth++ == 0) protect(0, open_end(), PROT_READ | PROT_WRITE);
    pthread_mutex_unlock(&A.mu);
}

static void arena_close(void) {
    pthread_mutex_lock(&A.mu);
    if (--A.depth == 0) protect(0, open_end(), PROT_NONE);
    pthread_mutex_unlock(&A.mu);
}

/* Give [lo, hi)'s whole huge pages back to the system (under A.mu): they read as zeros afterwards. */
static void release(size_t lo, size_t hi) {
    lo = round_up(lo, HUGE_BYTES);
    hi = hi / HUGE_BYTES * HUGE_BYTES;
    if (lo < hi) madvise(A.base + lo, hi - lo, MADV_DONTNEED);
}

/* Record a freed block (under A.mu), merged with its neighbours, and release what it completes: whole huge
 * pages inside the merged extent, or, when it reaches the top, everything above the new top. */
static void free_insert(size_t off, size_t len) {
    size_t lo = 0, hi = A.n_free;
    while (lo < hi) { /* i = the first extent above off */
        size_t mid = (lo + hi) / 2;
        if (A.free[mid].off < off) lo = mid + 1;
        else hi = mid;
    }
    size_t i = lo;
    int joins_prev = i > 0 && A.free[i - 1].off + A.free[i - 1].len == off;
    int joins_next = i < A.n_free && off + len == A.free[i].off;
    extent *e;
    if (joins_prev && joins_next) {
        A.free[i - 1].len += len + A.free[i].len;
        memmove(&A.free[i], &A.free[i + 1], (A.n_free - i - 1) * sizeof *A.free);
        A.n_free--;
        e = &A.free[i - 1];
    } else if (joins_prev) {
        e = &A.free[i - 1];
        e->len += len;
    } else if (joins_next) {
        e = &A.free[i];
        e->off = off;
        e->len += len;
    } else {
        if (A.n_free == A.cap_free) {
            size_t cap = A.cap_free ? 2 * A.cap_free : 64;
            extent *f = realloc(A.free, cap * sizeof *f);
            if (!f) return; /* the block's addresses stay unused: a loss, not a fault */
            A.free = f;
            A.cap_free = cap;
        }
        memmove(&A.free[i + 1], &A.free[i], (A.n_free - i) * sizeof *A.free);
        A.free[i] = (extent){off, len};
        A.n_free++;
        e = &A.free[i];
    }
    if (e->off + e->len < A.top_bytes) {
        release(e->off, e->off + e->len);
        return;
    }
    const size_t old_end = open_end();
    A.top_bytes = e->off; /* the last extent reaches the top: the top comes down */
    A.n_free--;
    release(A.top_bytes, old_end);
    if (A.dirty_bytes > open_end()) A.dirty_bytes = open_end();
    if (A.depth) protect(open_end(), old_end - open_end(), PROT_NONE); /* above the end is always closed */
}

static void *arena_alloc(void *user, kvb_tier tier, size_t bytes) {
    if (tier == KVB_TIER_HOST) { /* host code may touch the host tier: the heap */
        void *p = NULL;
        if (!bytes || posix_memalign(&p, 64, bytes)) return NULL;
        return memset(p, 0, bytes);
    }
    if (!bytes || bytes > A.reserved_bytes) return NULL;
    const size_t len = round_up(bytes, A.page_bytes);
    size_t off = SIZE_MAX;
    pthread_mutex_lock(&A.mu);
    for (size_t i = 0; i < A.n_free; i++) { /* first fit */
        if (A.free[i].len < len) continue;
        off = A.free[i].off;
        A.free[i].off += len;
        if (!(A.free[i].len -= len)) {
            memmove(&A.free[i], &A.free[i + 1], (A.n_free - i - 1) * sizeof *A.free);
            A.n_free--;
        }
        break;
    }
    if (off == SIZE_MAX && len <= A.reserved_bytes - A.top_bytes) {
        const size_t old_end = open_end();
        off = A.top_bytes;
        A.top_bytes += len;
        if (A.depth) protect(old_end, open_end() - old_end, PROT_READ | PROT_WRITE);
    }
    size_t stale = 0; /* bytes at the block's start that may hold a freed block's data */
    if (off != SIZE_MAX) {
        stale = A.dirty_bytes > off ? A.dirty_bytes - off : 0;
        if (stale > len) stale = len;
        if (off + len > A.dirty_bytes) A.dirty_bytes = off + len;
    }
    pthread_mutex_unlock(&A.mu);
    if (off == SIZE_MAX) return NULL;
    if (stale) {
        arena_open();
        memset(A.base + off, 0, stale);
        arena_close();
    }
    return A.base + off;
}

static void arena_free(void *user, kvb_tier tier, void *p, size_t bytes) {
    if (!p) return;
    if (tier == KVB_TIER_HOST) {
        free(p);
        return;
    }
    const size_t off = (size_t)((uint8_t *)p - A.base), len = round_up(bytes, A.page_bytes);
    pthread_mutex_lock(&A.mu);
    if ((uint8_t *)p < A.base || off % A.page_bytes || off >= A.top_bytes || len > A.top_bytes - off) {
        fprintf(stderr, "kvbench guard: freeing %p (%zu bytes), not a device-tier block of the arena\n", p, bytes);
        abort(); /* a programmer's error: the caller's tier or size is wrong */
    }
    free_insert(off, len);
    pthread_mutex_unlock(&A.mu);
}

static void arena_copy(void *user, void *dst, const void *src, size_t bytes) {
    arena_open();
    memmove(dst, src, bytes);
    arena_close();
}

static const kvb_allocator arena_allocator = {arena_alloc, arena_free, arena_copy, NULL};

/* ---- the guarded backend: inner's ops with the arena open ---- */

typedef struct {
    kvb_backend be; /* what callers hold (be.impl points back here) */
    kvb_backend *in;
} guard;

#define IN(be) (((guard *)(be)->impl)->in)

/* After an op: the arena closed, and what the op recorded in inner's table shown in the caller's. */
static void guard_close(kvb_backend *be) {
    kvb_backend *in = IN(be);
    for (int d = 0; d < KVB_COPY_DIRS; d++) {
        be->traffic.n[d] += in->traffic.n[d];
        be->traffic.bytes[d] += in->traffic.bytes[d];
    }
    memset(&in->traffic, 0, sizeof in->traffic);
    if (in->error[0]) memcpy(be->error, in->error, sizeof be->error);
    arena_close();
}

#define GUARDED_VOID(op, params, ...)                                                                          \
    static void guarded_##op params {                                                                          \
        arena_open();                                                                                          \
        IN(be)->op(IN(be), __VA_ARGS__);                                                                       \
        guard_close(be);                                                                                       \
    }
#define GUARDED_INT(op, params, ...)                                                                           \
    static int guarded_##op params {                                                                           \
        arena_open();                                                                                          \
        int rc = IN(be)->op(IN(be), __VA_ARGS__);                                                              \
        guard_close(be);                                                                                       \
        return rc;                                                                                             \
    }

/* matmul reads the caller's gemm setting from the table it is given: pass it on */
static int guarded_matmul(kvb_backend *be, float *out, const kvb_weight *w, const float *x, int64_t n_tok) {
    IN(be)->gemm = be->gemm;
    arena_open();
    int rc = IN(be)->matmul(IN(be), out, w, x, n_tok);
    guard_close(be);
    return rc;
}

GUARDED_VOID(get_rows, (kvb_backend *be, float *out, const kvb_weight *w, const int32_t *ids, int64_t n), out, w, ids, n)
GUARDED_VOID(rmsnorm, (kvb_backend *be, float *out, const float *x, const float *w, int64_t n, int64_t n_rows, float eps),
             out, x, w, n, n_rows, eps)
GUARDED_VOID(rope, (kvb_backend *be, float *x, int64_t n_tok, int n_head, int head_dim, int n_rot, const int32_t *pos,
                    float freq_base, int neox), x, n_tok, n_head, head_dim, n_rot, pos, freq_base, neox)
GUARDED_VOID(swiglu, (kvb_backend *be, float *out, const float *gate, const float *up, int64_t n), out, gate, up, n)
GUARDED_VOID(add, (kvb_backend *be, float *out, const float *a, const float *b, int64_t n), out, a, b, n)
GUARDED_VOID(add_bias, (kvb_backend *be, float *x, const float *bias, int64_t n, int64_t n_rows), x, bias, n, n_rows)
GUARDED_INT(attention, (kvb_backend *be, const kvb_attn_args *a, char *err, size_t err_len), a, err, err_len)
GUARDED_VOID(rope_qk, (kvb_backend *be, float *q, int n_head, float *k, int n_head_kv, int64_t n_tok, int head_dim,
                       int n_rot, const int32_t *pos, float freq_base, int neox),
             q, n_head, k, n_head_kv, n_tok, head_dim, n_rot, pos, freq_base, neox)
GUARDED_VOID(rope_ext, (kvb_backend *be, float *x, int64_t n_tok, int n_head, int head_dim, int n_rot, const int32_t *pos,
                        int neox, const kvb_rope_params *rp), x, n_tok, n_head, head_dim, n_rot, pos, neox, rp)
GUARDED_VOID(geglu, (kvb_backend *be, float *out, const float *gate, const float *up, int64_t n), out, gate, up, n)
GUARDED_VOID(scale, (kvb_backend *be, float *x, float s, int64_t n), x, s, n)
GUARDED_INT(attention_window, (kvb_backend *be, const kvb_attn_args *a, char *err, size_t err_len), a, err, err_len)
GUARDED_VOID(add_rmsnorm, (kvb_backend *be, float *x, const float *d, float *out, const float *w, int64_t n,
                           int64_t n_rows, float eps), x, d, out, w, n, n_rows, eps)

/* matmul_n passes the caller's gemm setting on, as matmul does */
static int guarded_matmul_n(kvb_backend *be, int k, float *const *out, const kvb_weight *const *w, const float *x,
                            int64_t n_tok) {
    IN(be)->gemm = be->gemm;
    arena_open();
    int rc = IN(be)->matmul_n(IN(be), k, out, w, x, n_tok);
    guard_close(be);
    return rc;
}
GUARDED_INT(copy, (kvb_backend *be, void *dst, const void *src, size_t bytes, kvb_copy_dir dir, char *err,
                   size_t err_len), dst, src, bytes, dir, err, err_len)
GUARDED_INT(zero, (kvb_backend *be, void *dst, size_t bytes, char *err, size_t err_len), dst, bytes, err, err_len)
GUARDED_INT(kv_gather, (kvb_backend *be, const kvb_kv_head *dst, int64_t dst_off, const kvb_kv_head *src,
                        const int32_t *idx, int64_t n, size_t row_bytes, kvb_copy_dir dir, char *err, size_t err_len),
            dst, dst_off, src, idx, n, row_bytes, dir, err, err_len)
GUARDED_INT(kv_load, (kvb_backend *be, int n_heads, const kvb_kv_head *dst, const int64_t *dst_off, const kvb_kv_head *src,
                      const int32_t *const *idx, const int64_t *n, size_t row_bytes, char *err, size_t err_len),
            n_heads, dst, dst_off, src, idx, n, row_bytes, err, err_len)
GUARDED_INT(kv_evict, (kvb_backend *be, int n_heads, const kvb_kv_head *h, const int64_t *n, size_t row_bytes,
                       float *const *score, int32_t lo, int32_t hi, const int64_t *count, void *const *spill_v,
                       char *err, size_t err_len),
            n_heads, h, n, row_bytes, score, lo, hi, count, spill_v, err, err_len)
GUARDED_INT(probs_reduce, (kvb_backend *be, float *out, int64_t out_stride, const float *probs, int64_t stride,
                           int n_head, int n_head_kv, int64_t n_q, int64_t n, const double *w, int mode, int accumulate,
                           char *err, size_t err_len),
            out, out_stride, probs, stride, n_head, n_head_kv, n_q, n, w, mode, accumulate, err, err_len)
GUARDED_INT(pool1d, (kvb_backend *be, float *out, int64_t out_stride, const float *in, int64_t in_stride, int64_t rows,
                     int64_t n, int64_t kernel, int avg, char *err, size_t err_len),
            out, out_stride, in, in_stride, rows, n, kernel, avg, err, err_len)
GUARDED_INT(topk_idx, (kvb_backend *be, int32_t *idx, const float *score, int64_t n, int64_t k, char *err,
                       size_t err_len), idx, score, n, k, err, err_len)
GUARDED_INT(topk_rows, (kvb_backend *be, int32_t *idx, int64_t idx_stride, const float *score, int64_t score_stride,
                        int64_t rows, int64_t n, int64_t k, char *err, size_t err_len),
            idx, idx_stride, score, score_stride, rows, n, k, err, err_len)
GUARDED_INT(iota, (kvb_backend *be, int32_t *idx, int32_t start, int64_t n, char *err, size_t err_len), idx, start, n,
            err, err_len)
GUARDED_INT(gather_f32, (kvb_backend *be, float *dst, const float *src, const int32_t *idx, int64_t n, char *err,
                         size_t err_len), dst, src, idx, n, err, err_len)
GUARDED_INT(round_scores, (kvb_backend *be, double *out, int32_t *present, int n_round, const float *probs,
                           int64_t stride, int n_head, int n_head_kv, int64_t n_q, const int32_t *const *round,
                           const int64_t *n, int32_t skip, char *err, size_t err_len),
            out, present, n_round, probs, stride, n_head, n_head_kv, n_q, round, n, skip, err, err_len)
GUARDED_INT(pod_share, (kvb_backend *be, float *pd, int64_t pd_stride, float *lse_d, const float *probs, int64_t stride,
                        const float *lse_p, int n_head, const unsigned char *is_base, int64_t first, int64_t n_dist,
                        char *err, size_t err_len),
            pd, pd_stride, lse_d, probs, stride, lse_p, n_head, is_base, first, n_dist, err, err_len)
GUARDED_INT(pod_merge, (kvb_backend *be, float *out, const float *lse_p, const float *lse_d, const float *pd,
                        int64_t pd_stride, const void *v, kvb_dtype dtype, int G, int head_dim, int64_t n_dist,
                        double tau, int64_t *counts, char *err, size_t err_len),
            out, lse_p, lse_d, pd, pd_stride, v, dtype, G, head_dim, n_dist, tau, counts, err, err_len)
/* knorm, quest (issue 19) */
GUARDED_INT(row_norms, (kvb_backend *be, float *out, const void *k, kvb_dtype dtype, int dim, int64_t n, int negate,
                        char *err, size_t err_len), out, k, dtype, dim, n, negate, err, err_len)
GUARDED_INT(block_minmax, (kvb_backend *be, float *kmin, float *kmax, const void *k, kvb_dtype dtype, int dim,
                           int64_t block, int64_t from, int64_t n, char *err, size_t err_len),
            kmin, kmax, k, dtype, dim, block, from, n, err, err_len)
GUARDED_INT(block_scores, (kvb_backend *be, float *score, const float *q, const float *kmin, const float *kmax, int G,
                           int dim, int64_t n_block, int group_max, char *err, size_t err_len),
            score, q, kmin, kmax, G, dim, n_block, group_max, err, err_len)
GUARDED_INT(block_expand, (kvb_backend *be, int32_t *idx, const int32_t *blocks, int64_t block, int64_t n, char *err,
                           size_t err_len), idx, blocks, block, n, err, err_len)
GUARDED_INT(attention_colsum, (kvb_backend *be, const kvb_attn_args *a, float *const *out, char *err, size_t err_len), a,
            out, err, err_len)
GUARDED_INT(block_minmax_heads, (kvb_backend *be, int n_heads, float *const *kmin, float *const *kmax, const void *const *k,
                                 kvb_dtype dtype, int dim, int64_t block, int64_t from, int64_t n, char *err, size_t err_len),
            n_heads, kmin, kmax, k, dtype, dim, block, from, n, err, err_len)
GUARDED_INT(block_scores_heads, (kvb_backend *be, int n_heads, float *score, int64_t score_stride, const float *q,
                                 const float *const *kmin, const float *const *kmax, int G, int dim, int64_t n_block,
                                 int group_max, char *err, size_t err_len),
            n_heads, score, score_stride, q, kmin, kmax, G, dim, n_block, group_max, err, err_len)
GUARDED_INT(block_expand_rows, (kvb_backend *be, int rows, int32_t *idx, int64_t idx_stride, const int32_t *blocks,
                                int64_t blocks_stride, int64_t n_listed, int64_t tail, int64_t block, int64_t n, char *err,
                                size_t err_len),
            rows, idx, idx_stride, blocks, blocks_stride, n_listed, tail, block, n, err, err_len)

/* KIVI's quantized KV */
GUARDED_INT(quant_groups, (kvb_backend *be, void *out, const void *x, kvb_dtype dtype, int64_t n, int d, int G, int bits,
                           int per_channel, char *err, size_t err_len), out, x, dtype, n, d, G, bits, per_channel, err, err_len)
GUARDED_INT(attention_quant, (kvb_backend *be, const kvb_attn_args *a, const kvb_quant_kv *q, char *err, size_t err_len),
            a, q, err, err_len)
/* ThinK's narrow keys */
GUARDED_INT(gather_cols, (kvb_backend *be, void *out, int64_t out_stride, const void *x, int64_t in_stride, kvb_dtype dtype,
                          const int32_t *cols, int m, int64_t n, char *err, size_t err_len),
            out, out_stride, x, in_stride, dtype, cols, m, n, err, err_len)
GUARDED_INT(attention_narrow, (kvb_backend *be, const kvb_attn_args *a, const kvb_narrow_kv *s, char *err, size_t err_len),
            a, s, err, err_len)

GUARDED_INT(fill_idx_f32, (kvb_backend *be, float *dst, const int32_t *idx, int64_t n, float value, char *err,
                           size_t err_len), dst, idx, n, value, err, err_len)
GUARDED_INT(split_rows_idx, (kvb_backend *be, int32_t *out, int64_t out_stride, int32_t *counts, const int32_t *flat,
                             int64_t n, int64_t row_len, int rows, char *err, size_t err_len),
            out, out_stride, counts, flat, n, row_len, rows, err, err_len)

/* elementwise ops (issue 38) */
GUARDED_INT(mul_f32, (kvb_backend *be, float *out, const float *a, const float *b, int64_t n, char *err, size_t err_len),
            out, a, b, n, err, err_len)
GUARDED_INT(axpby_f32, (kvb_backend *be, float *out, const float *a, double alpha, const float *b, double beta,
                        double gamma, int64_t n, char *err, size_t err_len), out, a, alpha, b, beta, gamma, n, err, err_len)
GUARDED_INT(softmax_rows, (kvb_backend *be, float *x, int64_t stride, int64_t rows, int64_t n, char *err, size_t err_len),
            x, stride, rows, n, err, err_len)
GUARDED_INT(gram_f32, (kvb_backend *be, float *out, const float *x, int64_t n, int d, char *err, size_t err_len), out, x, n,
            d, err, err_len)
GUARDED_INT(proj_sqnorms, (kvb_backend *be, float *out, const void *x, kvb_dtype dtype, int dim, int64_t n,
                           const float *u, int m, char *err, size_t err_len), out, x, dtype, dim, n, u, m, err, err_len)
GUARDED_INT(proj_l1norms, (kvb_backend *be, float *out, const void *x, kvb_dtype dtype, int dim, int64_t n,
                           const float *u, int64_t u_stride, int m, char *err, size_t err_len),
            out, x, dtype, dim, n, u, u_stride, m, err, err_len)
GUARDED_INT(block_scaled_std, (kvb_backend *be, float *out, const void *x, kvb_dtype dtype, int dim, int64_t n,
                               const float *lo, const float *hi, int64_t block, char *err, size_t err_len),
            out, x, dtype, dim, n, lo, hi, block, err, err_len)
GUARDED_INT(block_normalize, (kvb_backend *be, float *x, int64_t n, int64_t block, char *err, size_t err_len),
            x, n, block, err, err_len)
GUARDED_INT(block_ranks, (kvb_backend *be, float *out, const float *x, int64_t n, int64_t block, char *err,
                          size_t err_len), out, x, n, block, err, err_len)

static int guarded_sync(kvb_backend *be) {
    arena_open();
    int rc = IN(be)->sync(IN(be));
    guard_close(be);
    return rc;
}

/* the writer's user is the backend (backend.h): the caller passes the guarded one, inner gets its own */
static int guarded_kv_writer(void *user, int n_head_kv, int head_dim, kvb_dtype dtype, int64_t n_tok,
                             const kvb_kv_rows *dst, const float *k, const float *v, const int32_t *pos,
                             const int32_t *round, char *err, size_t err_len) {
    kvb_backend *be = user;
    arena_open();
    int rc = IN(be)->kv_writer(IN(be), n_head_kv, head_dim, dtype, n_tok, dst, k, v, pos, round, err, err_len);
    guard_close(be);
    return rc;
}

static void guard_free(kvb_backend *be) {
    guard *g = be->impl;
    kvb_backend_free(g->in);
    free(g); /* the arena stays: blocks may still be freed (see guard.h) */
}

int kvb_guard_wanted(void) {
    const char *v = getenv("KVB_GUARD");
    return v && *v && strcmp(v, "0") != 0;
}

kvb_backend *kvb_guard_wrap(kvb_backend *in, char *err, size_t err_len) {
    pthread_mutex_lock(&A.mu);
    int rc = arena_reserve();
    pthread_mutex_unlock(&A.mu);
    guard *g = rc ? NULL : calloc(1, sizeof *g);
    if (!g) {
        snprintf(err, err_len, rc ? "KVB_GUARD: could not reserve the guarded arena (mmap)" : "out of memory");
        kvb_backend_free(in);
        return NULL;
    }
    g->in = in;
    kvb_backend *be = &g->be;
    be->name = in->name;
    be->discrete = in->discrete;
    be->n_threads = in->n_threads;
    be->impl = g;
    be->free = guard_free;
    be->allocator = &arena_allocator;
#define WRAP(op) be->op = in->op ? guarded_##op : NULL
    WRAP(matmul); WRAP(get_rows); WRAP(rmsnorm); WRAP(rope); WRAP(swiglu); WRAP(add); WRAP(add_bias);
    WRAP(attention); WRAP(matmul_n); WRAP(add_rmsnorm); WRAP(rope_qk);
    WRAP(rope_ext); WRAP(geglu); WRAP(scale); WRAP(attention_window); /* arch_ops.c */
    WRAP(copy); WRAP(zero); WRAP(kv_gather); WRAP(kv_load); WRAP(kv_evict); WRAP(probs_reduce); WRAP(pool1d); WRAP(topk_idx); WRAP(topk_rows);
    WRAP(iota); WRAP(gather_f32); WRAP(round_scores); WRAP(pod_share); WRAP(pod_merge);
    WRAP(row_norms); WRAP(block_minmax); WRAP(block_scores); WRAP(block_expand); /* knorm, quest */
    WRAP(block_minmax_heads); WRAP(block_scores_heads); WRAP(block_expand_rows); WRAP(attention_colsum);
    WRAP(quant_groups); WRAP(attention_quant);
    WRAP(gather_cols); WRAP(attention_narrow);
    WRAP(fill_idx_f32); WRAP(split_rows_idx);
    WRAP(mul_f32); WRAP(axpby_f32); WRAP(softmax_rows); WRAP(proj_sqnorms); WRAP(gram_f32); WRAP(proj_l1norms); WRAP(block_scaled_std);
    WRAP(block_normalize); WRAP(block_ranks);
    WRAP(sync); WRAP(kv_writer);
#undef WRAP
    return be;
}
