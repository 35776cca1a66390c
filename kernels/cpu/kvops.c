/* kvops.c — the CPU backend's data ops (kernels/backend.h, "data ops").
 *
 * Each op is the loop the header describes, in the header's order: these replace host loops in the methods
 * (h2o.c, snapkv.c, omnikv.c, round.c, pod.c, streamingllm.c) and the KV store's compaction, and a method's
 * results must not move by one bit, so no loop here is reordered or vectorised by hand; pod_merge alone is
 * vectorised and threaded, across heads and the head dimension, which leaves every element's sum in the same
 * order; kv_evict by position evicts many slots through one sort, to the loop's result. Both tiers are host
 * memory on this backend; `copy` and `kv_gather` still count what they move in be->traffic, as a GPU backend
 * would count what crosses PCIe:
 * - copy: one copy of `bytes` per call;
 * - kv_gather: one copy per array (K, V, pos, round), n rows each, in the call's direction (D2D included);
 * - kv_load: one H2D copy of every head's rows (K, V, pos, round), as a GPU's one packed load;
 * calls that move nothing (bytes = 0, n = 0) are not counted.
 * Preconditions a plain loop can see (a negative index, kv_evict without a candidate, an evict count over n,
 * n_head not a multiple of n_head_kv) give -1 with one line in err. */
#include "kernels/cpu/kvops.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/evict_plan.h"
#include "base/topk.h"
#include "kernels/cpu/ops_vec.h"

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

static void add_traffic(kvb_backend *be, kvb_copy_dir dir, int64_t n, int64_t bytes) {
    be->traffic.n[dir] += n;
    be->traffic.bytes[dir] += bytes;
}

static int check_dir(kvb_copy_dir dir, char *err, size_t err_len) {
    return dir >= KVB_COPY_H2D && dir < KVB_COPY_DIRS ? 0 : ERR("copy: bad direction %d", (int)dir);
}

static int cpu_copy(kvb_backend *be, void *dst, const void *src, size_t bytes, kvb_copy_dir dir, char *err,
                    size_t err_len) {
    if (check_dir(dir, err, err_len)) return -1;
    if (!bytes) return 0;
    memmove(dst, src, bytes);
    add_traffic(be, dir, 1, (int64_t)bytes);
    return 0;
}

static int cpu_zero(kvb_backend *be, void *dst, size_t bytes, char *err, size_t err_len) {
    if (bytes) memset(dst, 0, bytes);
    return 0;
}

static int check_idx(const int32_t *idx, int64_t n, const char *op, char *err, size_t err_len) {
    for (int64_t i = 0; idx && i < n; i++)
        if (idx[i] < 0) return ERR("%s: index %d at %lld is negative", op, idx[i], (long long)i);
    return 0;
}

static int cpu_kv_gather(kvb_backend *be, const kvb_kv_head *dst, int64_t dst_off, const kvb_kv_head *src,
                         const int32_t *idx, int64_t n, size_t row_bytes, kvb_copy_dir dir, char *err,
                         size_t err_len) {
    if (check_dir(dir, err, err_len) || check_idx(idx, n, "kv_gather", err, err_len)) return -1;
    if (n < 0 || dst_off < 0) return ERR("kv_gather: %lld rows at slot %lld", (long long)n, (long long)dst_off);
    if (!n) return 0;
    uint8_t *dk = (uint8_t *)dst->k + (size_t)dst_off * row_bytes, *dv = (uint8_t *)dst->v + (size_t)dst_off * row_bytes;
    int32_t *dpos = dst->pos + dst_off, *dround = dst->round + dst_off;
    for (int64_t i = 0; i < n; i++) {
        const size_t s = (size_t)(idx ? idx[i] : i);
        memcpy(dk + (size_t)i * row_bytes, (const uint8_t *)src->k + s * row_bytes, row_bytes);
        memcpy(dv + (size_t)i * row_bytes, (const uint8_t *)src->v + s * row_bytes, row_bytes);
        dpos[i] = src->pos[s];
        dround[i] = src->round[s];
    }
    add_traffic(be, dir, 4, n * (int64_t)(2 * row_bytes + 2 * sizeof(int32_t)));
    return 0;
}

/* kv_load's rows, all heads' lists end to end, split evenly across the pool's threads: a listed row is scattered,
 * so each thread asks for the K and V rows LOAD_AHEAD rows ahead of the ones it copies */
enum { LOAD_AHEAD = 16, LOAD_MIN_ROWS = 256 };

typedef struct {
    int n_heads;
    const kvb_kv_head *dst, *src;
    const int64_t *dst_off, *n;
    const int32_t *const *idx;
    size_t row_bytes;
    int64_t rows;
} load_job;

static void load_rows(void *arg, int ith, int nth) {
    const load_job *jb = arg;
    const size_t rb = jb->row_bytes;
    int64_t lo = jb->rows * ith / nth, hi = jb->rows * (ith + 1) / nth;
    for (int j = 0; j < jb->n_heads && lo < hi; j++) { /* the part of [lo, hi) in head j's rows */
        const int64_t nj = jb->n[j];
        if (lo >= nj) {
            lo -= nj, hi -= nj;
            continue;
        }
        const int64_t i1 = hi < nj ? hi : nj;
        const int32_t *ix = jb->idx ? jb->idx[j] : NULL;
        const kvb_kv_head *d = &jb->dst[j], *s = &jb->src[j];
        uint8_t *dk = (uint8_t *)d->k + (size_t)jb->dst_off[j] * rb, *dv = (uint8_t *)d->v + (size_t)jb->dst_off[j] * rb;
        for (int64_t i = lo; i < i1; i++) {
            if (ix && i + LOAD_AHEAD < i1) {
                prefetch_row(s->k, ix[i + LOAD_AHEAD], (int)rb);
                prefetch_row(s->v, ix[i + LOAD_AHEAD], (int)rb);
            }
            const size_t sl = (size_t)(ix ? ix[i] : i);
            memcpy(dk + (size_t)i * rb, (const uint8_t *)s->k + sl * rb, rb);
            memcpy(dv + (size_t)i * rb, (const uint8_t *)s->v + sl * rb, rb);
            d->pos[jb->dst_off[j] + i] = s->pos[sl];
            d->round[jb->dst_off[j] + i] = s->round[sl];
        }
        lo = 0, hi -= nj;
    }
}

static int cpu_kv_load(kvb_backend *be, int n_heads, const kvb_kv_head *dst, const int64_t *dst_off,
                       const kvb_kv_head *src, const int32_t *const *idx, const int64_t *n, size_t row_bytes, char *err,
                       size_t err_len) {
    int64_t rows = 0;
    for (int j = 0; j < n_heads; j++) {
        if (n[j] < 0 || dst_off[j] < 0)
            return ERR("kv_load: head %d: %lld rows at slot %lld", j, (long long)n[j], (long long)dst_off[j]);
        if (check_idx(idx ? idx[j] : NULL, n[j], "kv_load", err, err_len)) return -1;
        rows += n[j];
    }
    load_job job = {.n_heads = n_heads, .dst = dst, .dst_off = dst_off, .src = src, .idx = idx, .n = n,
                    .row_bytes = row_bytes, .rows = rows};
    kvb_pool_run(rows >= LOAD_MIN_ROWS ? cpu_backend_pool(be) : NULL, load_rows, &job);
    if (rows) add_traffic(be, KVB_COPY_H2D, 1, rows * (int64_t)(2 * row_bytes + 2 * sizeof(int32_t)));
    return 0;
}

static float row_elem(const void *k, kvb_dtype dtype, size_t at) {
    return dtype == KVB_F16 ? kvb_f16_to_f32(((const kvb_f16 *)k)[at]) : ((const float *)k)[at];
}

/* key of slot a below key of slot b: scores when given (NaN below every number: a total order, so the CUDA
 * backend's reduction picks the same victim), else positions (compared as integers) */
static int key_below(const float *score, const int32_t *pos, int64_t a, int64_t b) {
    if (!score) return pos[a] < pos[b];
    return isnan(score[a]) ? !isnan(score[b]) : score[a] < score[b];
}

/* kv_evict by position (score NULL) of many slots at once (base/evict_plan.h): the spill read first, then the
 * survivors' moves. 1 = done; 0 = positions repeat (or no memory): the caller runs the loop; -1 = fewer candidates
 * than count. */
static int evict_by_pos(const kvb_kv_head *h, int64_t n, size_t row_bytes, int32_t lo, int32_t hi, int64_t count,
                        void *spill_v, char *err, size_t err_len) {
    int64_t *plan = malloc((size_t)count * 3 * sizeof *plan), moves = 0;
    if (!plan) return 0;
    int64_t *spill = plan, *dst = plan + count, *src = plan + 2 * count;
    const int rc = kvb_evict_plan(h->pos, n, lo, hi, count, spill, dst, src, &moves, err, err_len);
    if (rc == 1) {
        uint8_t *k = h->k, *v = h->v;
        for (int64_t c = 0; spill_v && c < count; c++)
            memcpy((uint8_t *)spill_v + (size_t)c * row_bytes, v + (size_t)spill[c] * row_bytes, row_bytes);
        for (int64_t i = 0; i < moves; i++) {
            memcpy(k + (size_t)dst[i] * row_bytes, k + (size_t)src[i] * row_bytes, row_bytes);
            memcpy(v + (size_t)dst[i] * row_bytes, v + (size_t)src[i] * row_bytes, row_bytes);
            h->pos[dst[i]] = h->pos[src[i]];
            h->round[dst[i]] = h->round[src[i]];
        }
    }
    free(plan);
    return rc;
}

static int evict_head(const kvb_kv_head *h, int64_t n, size_t row_bytes, float *score, int32_t lo, int32_t hi,
                      int64_t count, void *spill_v, char *err, size_t err_len) {
    if (count > n) return ERR("kv_evict: %lld evictions from %lld slots", (long long)count, (long long)n);
    const int fast = !score && count > 1 ? evict_by_pos(h, n, row_bytes, lo, hi, count, spill_v, err, err_len) : 0;
    if (fast) return fast < 0 ? -1 : 0;
    uint8_t *k = h->k, *v = h->v;
    for (int64_t c = 0; c < count; c++, n--) {
        int64_t victim = -1;
        for (int64_t j = 0; j < n; j++)
            if (h->pos[j] >= lo && h->pos[j] < hi && (victim < 0 || key_below(score, h->pos, j, victim))) victim = j;
        if (victim < 0)
            return ERR("kv_evict: no slot with position in [%d, %d) among %lld (eviction %lld of %lld)", lo, hi,
                       (long long)n, (long long)c + 1, (long long)count);
        if (spill_v) memcpy((uint8_t *)spill_v + (size_t)c * row_bytes, v + (size_t)victim * row_bytes, row_bytes);
        const int64_t last = n - 1;
        if (victim != last) {
            memcpy(k + (size_t)victim * row_bytes, k + (size_t)last * row_bytes, row_bytes);
            memcpy(v + (size_t)victim * row_bytes, v + (size_t)last * row_bytes, row_bytes);
            h->pos[victim] = h->pos[last];
            h->round[victim] = h->round[last];
            if (score) score[victim] = score[last];
        }
    }
    return 0;
}

static int cpu_kv_evict(kvb_backend *be, int n_heads, const kvb_kv_head *h, const int64_t *n, size_t row_bytes,
                        float *const *score, int32_t lo, int32_t hi, const int64_t *count, void *const *spill_v,
                        char *err, size_t err_len) {
    for (int j = 0; j < n_heads; j++)
        if (count[j] > 0 && evict_head(&h[j], n[j], row_bytes, score ? score[j] : NULL, lo, hi, count[j],
                                       spill_v ? spill_v[j] : NULL, err, err_len))
            return -1;
    return 0;
}

/* attention_colsum: every (KV head, list entry) a task of its own sums, split over the pool by entries */
typedef struct {
    const kvb_attn_args *a;
    float *const *out;
    int64_t total; /* entries over every KV head */
} colsum_job;

static void colsum_task(void *arg, int ith, int nth) {
    const colsum_job *jb = arg;
    const kvb_attn_args *a = jb->a;
    const int G = a->n_head / a->n_head_kv, D = a->head_dim;
    long lo, hi;
    kvb_split((long)jb->total, ith, nth, &lo, &hi);
    int g = 0;
    int64_t first = 0; /* the entries of heads before g */
    for (long e = lo; e < hi; e++) {
        int64_t len = a->idx && a->idx[g] ? a->n_idx[g] : a->n_kv[g];
        while (e - first >= len) first += len, g++, len = a->idx && a->idx[g] ? a->n_idx[g] : a->n_kv[g];
        const int64_t j = e - first, slot = a->idx && a->idx[g] ? a->idx[g][j] : j;
        const int32_t kp = a->k_pos && a->k_pos[g] ? a->k_pos[g][slot] : 0;
        float acc = jb->out[g][j];
        for (int r = 0; r < G; r++) {
            const int h = g * G + r;
            for (int64_t t = 0; t < a->n_q; t++) {
                const float lse = a->lse[(int64_t)h * a->n_q + t];
                if (lse == -INFINITY) continue;
                if (a->q_pos && a->k_pos && a->k_pos[g]) {
                    const int32_t qp = a->q_pos[t];
                    if (kp > qp || (a->window > 0 && (int64_t)qp - kp >= a->window)) continue;
                }
                const float *q = a->q + (t * a->n_head + h) * (int64_t)D;
                float d = 0;
                for (int i = 0; i < D; i++) d += q[i] * row_elem(a->k[g], a->kv_dtype, (size_t)slot * D + i);
                acc += expf(a->scale * d - lse);
            }
        }
        jb->out[g][j] = acc;
    }
}

static int cpu_attention_colsum(kvb_backend *be, const kvb_attn_args *a, float *const *out, char *err, size_t err_len) {
    if (a->n_head <= 0 || a->n_head_kv <= 0 || a->n_head % a->n_head_kv || !a->lse)
        return ERR("attention_colsum: %d query heads over %d KV heads%s", a->n_head, a->n_head_kv,
                   a->lse ? "" : ", no lse");
    colsum_job jb = {a, out, 0};
    for (int g = 0; g < a->n_head_kv; g++) jb.total += a->idx && a->idx[g] ? a->n_idx[g] : a->n_kv[g];
    if (jb.total <= 0 || a->n_q <= 0) return 0;
    kvb_pool_run(jb.total * a->n_q >= 4096 ? cpu_backend_pool(be) : NULL, colsum_task, &jb);
    return 0;
}

static int cpu_probs_reduce(kvb_backend *be, float *out, int64_t out_stride, const float *probs, int64_t stride,
                            int n_head, int n_head_kv, int64_t n_q, int64_t n, const double *w, int mode,
                            int accumulate, char *err, size_t err_len) {
    if (n_head <= 0 || n_head_kv <= 0 || n_head % n_head_kv)
        return ERR("probs_reduce: %d query heads over %d KV heads", n_head, n_head_kv);
    if (n <= 0) return 0;
    if (mode == KVB_REDUCE_GROUP_SUM) { /* h2o_observe's and snapkv's head_scores' loop */
        const int G = n_head / n_head_kv;
        for (int g = 0; g < n_head_kv; g++) {
            float *o = out + (int64_t)g * out_stride;
            if (!accumulate) memset(o, 0, (size_t)n * sizeof *o);
            for (int r = 0; r < G; r++)
                for (int64_t t = 0; t < n_q; t++) {
                    const float *p = probs + ((int64_t)(g * G + r) * n_q + t) * stride;
                    for (int64_t j = 0; j < n; j++) o[j] += p[j];
                }
        }
        return 0;
    }
    if (mode == KVB_REDUCE_MAX_HEADS) { /* omnikv's filter_scores, kvzip's rows */
        if (!accumulate) memset(out, 0, (size_t)n * sizeof *out);
        /* a block of columns at a time, the heads' rows read along (contiguous; a max does not depend on order) */
        enum { COLS = 2048 };
        float m[COLS];
        for (int64_t t = 0; t < n_q; t++) {
            const double wt = w ? w[t] : 1.0;
            for (int64_t j0 = 0; j0 < n; j0 += COLS) {
                const int64_t nj = n - j0 < COLS ? n - j0 : COLS;
                for (int64_t j = 0; j < nj; j++) m[j] = 0;
                for (int h = 0; h < n_head; h++) {
                    const float *p = probs + ((int64_t)h * n_q + t) * stride + j0;
                    for (int64_t j = 0; j < nj; j++) m[j] = p[j] > m[j] ? p[j] : m[j];
                }
                for (int64_t j = 0; j < nj; j++) out[j0 + j] += (float)(wt * m[j]);
            }
        }
        return 0;
    }
    return ERR("probs_reduce: unknown mode %d", mode);
}

static int cpu_pool1d(kvb_backend *be, float *out, int64_t out_stride, const float *in, int64_t in_stride,
                      int64_t rows, int64_t n, int64_t kernel, int avg, char *err, size_t err_len) {
    if (kernel < 1) return ERR("pool1d: kernel %lld", (long long)kernel);
    const int64_t r = kernel / 2;
    for (int64_t row = 0; row < rows; row++) {
        const float *x = in + row * in_stride;
        float *y = out + row * out_stride;
        for (int64_t i = 0; i < n; i++) {
            float m = -INFINITY;
            double sum = 0;
            for (int64_t j = i - r; j <= i + r; j++) {
                if (j < 0 || j >= n) continue;
                if (x[j] > m) m = x[j];
                sum += x[j];
            }
            y[i] = avg ? (float)(sum / (double)kernel) : m;
        }
    }
    return 0;
}

static int cpu_topk_idx(kvb_backend *be, int32_t *idx, const float *score, int64_t n, int64_t k, char *err,
                        size_t err_len) {
    kvb_topk_slots(score, n, k, idx); /* k clamped to [0, n] */
    return 0;
}

static int cpu_topk_rows(kvb_backend *be, int32_t *idx, int64_t idx_stride, const float *score, int64_t score_stride,
                         int64_t rows, int64_t n, int64_t k, char *err, size_t err_len) {
    for (int64_t r = 0; r < rows; r++) kvb_topk_slots(score + r * score_stride, n, k, idx + r * idx_stride);
    return 0;
}

static int cpu_iota(kvb_backend *be, int32_t *idx, int32_t start, int64_t n, char *err, size_t err_len) {
    for (int64_t i = 0; i < n; i++) idx[i] = start + (int32_t)i;
    return 0;
}

static int cpu_gather_f32(kvb_backend *be, float *dst, const float *src, const int32_t *idx, int64_t n, char *err,
                          size_t err_len) {
    if (check_idx(idx, n, "gather_f32", err, err_len)) return -1;
    for (int64_t i = 0; i < n; i++) dst[i] = src[idx[i]];
    return 0;
}

static int cpu_round_scores(kvb_backend *be, double *out, int32_t *present, int n_round, const float *probs,
                            int64_t stride, int n_head, int n_head_kv, int64_t n_q, const int32_t *const *round,
                            const int64_t *n, int32_t skip, char *err, size_t err_len) {
    if (n_head <= 0 || n_head_kv <= 0 || n_head % n_head_kv)
        return ERR("round_scores: %d query heads over %d KV heads", n_head, n_head_kv);
    const int G = n_head / n_head_kv;
    for (int g = 0; g < n_head_kv; g++)
        for (int r = 0; r < G; r++)
            for (int64_t t = 0; t < n_q; t++) {
                const float *p = probs + ((int64_t)(g * G + r) * n_q + t) * stride;
                for (int64_t j = 0; j < n[g]; j++) {
                    const int32_t rd = round[g][j];
                    if (rd == skip || rd < 0 || rd >= n_round) continue;
                    out[rd] += p[j];
                    present[rd] = 1;
                }
            }
    return 0;
}

/* pod_share's distant mass in the header's order: p[i] into partial sum i % KVB_POD_LANES, the sums then added in
 * lane order. Each lane is one double add chain, so vectors of lanes keep the bits; a single chain (the order
 * before) spent a dependent add per slot: 5,568 a head at 8K tokens, on every base head of every decode step. */
static double pod_distant_mass(const float *p, int64_t n) {
    _Alignas(64) double lane[KVB_POD_LANES] = {0};
    int64_t i = 0;
#if defined(__AVX512F__)
    __m512d a[KVB_POD_LANES / 8];
    for (int k = 0; k < KVB_POD_LANES / 8; k++) a[k] = _mm512_setzero_pd();
    for (; i + KVB_POD_LANES <= n; i += KVB_POD_LANES)
        for (int k = 0; k < KVB_POD_LANES / 8; k++) a[k] = _mm512_add_pd(a[k], _mm512_cvtps_pd(_mm256_loadu_ps(p + i + 8 * k)));
    for (int k = 0; k < KVB_POD_LANES / 8; k++) _mm512_store_pd(lane + 8 * k, a[k]);
#elif defined(__AVX2__)
    __m256d a[KVB_POD_LANES / 4];
    for (int k = 0; k < KVB_POD_LANES / 4; k++) a[k] = _mm256_setzero_pd();
    for (; i + KVB_POD_LANES <= n; i += KVB_POD_LANES)
        for (int k = 0; k < KVB_POD_LANES / 4; k++) a[k] = _mm256_add_pd(a[k], _mm256_cvtps_pd(_mm_loadu_ps(p + i + 4 * k)));
    for (int k = 0; k < KVB_POD_LANES / 4; k++) _mm256_store_pd(lane + 4 * k, a[k]);
#else
    for (; i + KVB_POD_LANES <= n; i += KVB_POD_LANES)
        for (int k = 0; k < KVB_POD_LANES; k++) lane[k] += p[i + k];
#endif
    for (int k = 0; i < n; i++, k++) lane[k] += p[i]; /* i is a multiple of the lanes here: lane k = slot i's */
    double m = 0;
    for (int k = 0; k < KVB_POD_LANES; k++) m += lane[k];
    return m;
}

static int cpu_pod_share(kvb_backend *be, float *pd, int64_t pd_stride, float *lse_d, const float *probs,
                         int64_t stride, const float *lse_p, int n_head, const unsigned char *is_base,
                         int64_t first, int64_t n_dist, char *err, size_t err_len) {
    for (int h = 0; h < n_head; h++) {
        if (!is_base[h]) continue;
        const float *p = probs + (int64_t)h * stride + first;
        const double m = pod_distant_mass(p, n_dist);
        float *d = pd + (int64_t)h * pd_stride;
        const float inv = m > 0 ? (float)(1.0 / m) : 0.0f;
        for (int64_t i = 0; i < n_dist; i++) d[i] = p[i] * inv;
        lse_d[h] = m > 0 ? (float)(lse_p[h] + log(m)) : -INFINITY;
    }
    return 0;
}


/* pod_merge's o_D, split into tasks of up to POD_NH merged heads x 2 POD_CW elements (a cache line of f16
 * rows on AVX2) x one KVB_POD_CHUNK of distant rows: a task streams its chunk's rows in tiles of POD_TILE, each
 * tile once per POD_CW elements (the second pass hits L1), with its sums in registers within a tile and in the
 * chunk's partial sums between tiles; the chunks' sums are then added in chunk order. Per element the sums are
 * the header's: products added in ascending row order within a chunk, a multiply then an add (no FMA), so the
 * result is the same bits whatever the split, the vector width or the thread count. */
#define POD_NH 4               /* merged heads per task */
#define POD_CW (2 * VF_LANES)  /* elements per register block */
#define POD_TILE 256           /* rows per tile */
enum { POD_MAX_G = 256 };      /* query heads per KV head */

typedef struct {
    const float *w[POD_MAX_G]; /* per merged head: its distant weights */
    int head[POD_MAX_G];       /* per merged head: its row in a chunk's sums */
    int n_merged, G;
    const void *v;
    kvb_dtype dtype;
    int head_dim;
    int64_t n_dist, n_chunks;
    float *part;               /* [n_chunks][G][head_dim]: each chunk's sums, zeroed */
} pod_merge_job;


/* merged heads m0..m0+nh-1, elements [e0, e0 + POD_CW), rows [i0, i1) into sums od ([G][head_dim]); nh is a
 * constant where inlined */
static inline __attribute__((always_inline)) void pod_merge_block(const pod_merge_job *j, float *od, int m0, int nh,
                                                                  int e0, int64_t i0, int64_t i1) {
    const size_t D = (size_t)j->head_dim;
    vf a[POD_NH][2];
    for (int r = 0; r < nh; r++) {
        const float *o = od + (size_t)j->head[m0 + r] * D + (size_t)e0;
        a[r][0] = vf_load(o);
        a[r][1] = vf_load(o + VF_LANES);
    }
    for (int64_t i = i0; i < i1; i++) {
        const size_t at = (size_t)i * D + (size_t)e0;
        const vf x0 = vf_load_kv(j->v, j->dtype, at), x1 = vf_load_kv(j->v, j->dtype, at + VF_LANES);
        for (int r = 0; r < nh; r++) {
            const vf wi = vf_set1(j->w[m0 + r][i]);
            a[r][0] = vf_add(a[r][0], vf_mul(wi, x0));
            a[r][1] = vf_add(a[r][1], vf_mul(wi, x1));
        }
    }
    for (int r = 0; r < nh; r++) {
        float *o = od + (size_t)j->head[m0 + r] * D + (size_t)e0;
        vf_store(o, a[r][0]);
        vf_store(o + VF_LANES, a[r][1]);
    }
}

static void pod_merge_span(const pod_merge_job *j, float *od, int m0, int nh, int e0, int64_t i0, int64_t i1) {
    switch (nh) {
    case 4: pod_merge_block(j, od, m0, 4, e0, i0, i1); break;
    case 3: pod_merge_block(j, od, m0, 3, e0, i0, i1); break;
    case 2: pod_merge_block(j, od, m0, 2, e0, i0, i1); break;
    default: pod_merge_block(j, od, m0, 1, e0, i0, i1); break;
    }
}

/* elements [e0, e1) under POD_CW wide, rows [i0, i1), one element at a time in the same order */
static void pod_merge_tail(const pod_merge_job *j, float *od, int m0, int nh, int e0, int e1, int64_t i0, int64_t i1) {
    for (int e = e0; e < e1; e++)
        for (int r = m0; r < m0 + nh; r++) {
            float *s = od + (size_t)j->head[r] * j->head_dim + (size_t)e;
            for (int64_t i = i0; i < i1; i++) *s += j->w[r][i] * row_elem(j->v, j->dtype, (size_t)i * j->head_dim + (size_t)e);
        }
}

/* task t: chunk t % n_chunks of head group and element span t / n_chunks; a thread takes a contiguous run of tasks */
static void pod_merge_tasks(void *arg, int ith, int nth) {
    const pod_merge_job *j = arg;
    const int n_groups = (j->n_merged + POD_NH - 1) / POD_NH, n_spans = (j->head_dim + 2 * POD_CW - 1) / (2 * POD_CW);
    const int64_t n_tasks = (int64_t)n_groups * n_spans * j->n_chunks;
    const int64_t t0 = n_tasks * ith / nth, t1 = n_tasks * (ith + 1) / nth;
    for (int64_t t = t0; t < t1; t++) {
        const int64_t c = t % j->n_chunks, hs = t / j->n_chunks;
        const int m0 = (int)(hs / n_spans) * POD_NH, nh = j->n_merged - m0 < POD_NH ? j->n_merged - m0 : POD_NH;
        const int e0 = (int)(hs % n_spans) * 2 * POD_CW, e1 = e0 + 2 * POD_CW < j->head_dim ? e0 + 2 * POD_CW : j->head_dim;
        const int ev = e0 + (e1 - e0) / POD_CW * POD_CW; /* end of the vector blocks */
        const int64_t c0 = c * KVB_POD_CHUNK, c1 = c0 + KVB_POD_CHUNK < j->n_dist ? c0 + KVB_POD_CHUNK : j->n_dist;
        float *od = j->part + (size_t)c * j->G * j->head_dim;
        for (int64_t i0 = c0; i0 < c1 && ev > e0; i0 += POD_TILE) {
            const int64_t i1 = i0 + POD_TILE < c1 ? i0 + POD_TILE : c1;
            for (int e = e0; e < ev; e += POD_CW) pod_merge_span(j, od, m0, nh, e, i0, i1);
        }
        pod_merge_tail(j, od, m0, nh, ev, e1, c0, c1);
    }
}

static int cpu_pod_merge(kvb_backend *be, float *out, const float *lse_p, const float *lse_d, const float *pd,
                         int64_t pd_stride, const void *v, kvb_dtype dtype, int G, int head_dim, int64_t n_dist,
                         double tau, int64_t *counts, char *err, size_t err_len) {
    if (G < 1 || G > POD_MAX_G) return ERR("pod_merge: %d query heads per KV head (1..%d)", G, POD_MAX_G);
    double gate[POD_MAX_G];
    pod_merge_job job = {.v = v, .dtype = dtype, .head_dim = head_dim, .n_dist = n_dist, .G = G};
    for (int r = 0; r < G; r++) {
        const double lp = lse_p[r], ld = lse_d[r];
        gate[r] = isfinite(ld) ? 1.0 / (1.0 + exp(ld - lp)) : 1.0; /* eq. 4 */
        const int merge = !(gate[r] >= tau);
        counts[merge ? 0 : 1]++;
        if (merge) {
            job.w[job.n_merged] = pd + (int64_t)r * pd_stride;
            job.head[job.n_merged++] = r;
        }
    }
    if (!job.n_merged) return 0;
    /* each chunk's sums for every merged head at once, split across the pool's threads, then o_D = their sum */
    job.n_chunks = n_dist > 0 ? (n_dist + KVB_POD_CHUNK - 1) / KVB_POD_CHUNK : 1;
    const size_t per = (size_t)G * head_dim, floats = per * (size_t)(job.n_chunks + 1);
    _Alignas(64) float stack[8192];
    float *buf = floats <= sizeof stack / sizeof *stack ? stack : malloc(floats * sizeof *buf);
    if (!buf) return ERR("pod_merge: out of memory");
    memset(buf, 0, floats * sizeof *buf);
    float *od = buf;
    job.part = buf + per;
    kvb_pool_run(n_dist >= 256 ? cpu_backend_pool(be) : NULL, pod_merge_tasks, &job);
    for (int64_t c = 0; c < job.n_chunks; c++)
        for (size_t k = 0; k < per; k++) od[k] += job.part[(size_t)c * per + k];
    for (int r = 0; r < G; r++) {
        if (gate[r] >= tau) continue;
        float *o = out + (int64_t)r * head_dim;
        for (int e = 0; e < head_dim; e++) o[e] = (float)(gate[r] * o[e] + (1.0 - gate[r]) * od[(size_t)r * head_dim + e]);
    }
    if (buf != stack) free(buf);
    return 0;
}

/* ---- knorm, quest (issue 19) ---- */

static int cpu_row_norms(kvb_backend *be, float *out, const void *k, kvb_dtype dtype, int dim, int64_t n, int negate,
                         char *err, size_t err_len) {
    if (dim <= 0) return ERR("row_norms: dim %d", dim);
    for (int64_t i = 0; i < n; i++) {
        double sum = 0;
        for (int e = 0; e < dim; e++) {
            const double x = row_elem(k, dtype, (size_t)i * dim + e);
            sum += x * x;
        }
        const float norm = (float)sqrt(sum);
        out[i] = negate ? -norm : norm;
    }
    return 0;
}

static int cpu_block_minmax(kvb_backend *be, float *kmin, float *kmax, const void *k, kvb_dtype dtype, int dim,
                            int64_t block, int64_t from, int64_t n, char *err, size_t err_len) {
    if (dim <= 0 || block <= 0 || from < 0) return ERR("block_minmax: dim %d, block %lld, from %lld", dim, (long long)block, (long long)from);
    for (int64_t b = from / block; b * block < n; b++) {
        float *lo = kmin + (size_t)b * dim, *hi = kmax + (size_t)b * dim;
        const int64_t end = (b + 1) * block < n ? (b + 1) * block : n;
        for (int e = 0; e < dim; e++) {
            float mn = INFINITY, mx = -INFINITY;
            for (int64_t r = b * block; r < end; r++) {
                const float x = row_elem(k, dtype, (size_t)r * dim + e);
                if (x < mn) mn = x;
                if (x > mx) mx = x;
            }
            lo[e] = mn;
            hi[e] = mx;
        }
    }
    return 0;
}

typedef struct {
    float *score;
    const float *q, *kmin, *kmax;
    int G, dim, group_max;
    int64_t n_block;
} block_scores_job;

/* blocks [b0, b1) in the header's order: on AVX-512 eight blocks at a time, their kmin and kmax transposed once into
 * double tiles ([e][block]) that serve every query head, the lanes over blocks (each lane's sums keep e and r
 * ascending; max_pd picks as `a > c ? a : c` does, zeros and NaN included); the rest one by one */
enum { BS_MAX_DIM = 256 };
static void block_scores_range(const block_scores_job *j, int64_t b0, int64_t b1) {
    const int dim = j->dim, G = j->G;
    int64_t b = b0;
#if defined(__AVX512F__)
    double tlo[BS_MAX_DIM * 8], thi[BS_MAX_DIM * 8];
    for (; b + 8 <= b1 && dim <= BS_MAX_DIM; b += 8) {
        const float *lo = j->kmin + (size_t)b * dim, *hi = j->kmax + (size_t)b * dim;
        for (int k = 0; k < 8; k++)
            for (int e = 0; e < dim; e++) tlo[e * 8 + k] = lo[(size_t)k * dim + e], thi[e * 8 + k] = hi[(size_t)k * dim + e];
        __m512d acc = _mm512_setzero_pd();
        for (int r = 0; r < G; r++) {
            const float *qr = j->q + (size_t)r * dim;
            __m512d u = _mm512_setzero_pd();
            for (int e = 0; e < dim; e++) {
                const __m512d qd = _mm512_set1_pd((double)qr[e]);
                const __m512d a = _mm512_mul_pd(qd, _mm512_loadu_pd(tlo + e * 8));
                const __m512d c = _mm512_mul_pd(qd, _mm512_loadu_pd(thi + e * 8));
                u = _mm512_add_pd(u, _mm512_max_pd(a, c));
            }
            acc = j->group_max ? (r == 0 ? u : _mm512_max_pd(u, acc)) : _mm512_add_pd(acc, u);
        }
        _mm256_storeu_ps(j->score + b, _mm512_cvtpd_ps(acc));
    }
#endif
    for (; b < b1; b++) {
        const float *lo = j->kmin + (size_t)b * dim, *hi = j->kmax + (size_t)b * dim;
        double acc = 0;
        for (int r = 0; r < G; r++) {
            const float *qr = j->q + (size_t)r * dim;
            double u = 0;
            for (int e = 0; e < dim; e++) {
                const double a = (double)qr[e] * lo[e], c = (double)qr[e] * hi[e];
                u += a > c ? a : c;
            }
            acc = j->group_max ? (r == 0 || u > acc ? u : acc) : acc + u;
        }
        j->score[b] = (float)acc;
    }
}

static void block_scores_task(void *arg, int ith, int nth) {
    const block_scores_job *j = arg;
    long lo, hi;
    kvb_split((long)((j->n_block + 7) / 8), ith, nth, &lo, &hi); /* whole vectors of blocks per thread */
    const int64_t b1 = (int64_t)hi * 8;
    block_scores_range(j, (int64_t)lo * 8, b1 < j->n_block ? b1 : j->n_block);
}

static int cpu_block_scores(kvb_backend *be, float *score, const float *q, const float *kmin, const float *kmax, int G,
                            int dim, int64_t n_block, int group_max, char *err, size_t err_len) {
    if (G <= 0 || dim <= 0) return ERR("block_scores: %d query heads of dim %d", G, dim);
    block_scores_job j = {score, q, kmin, kmax, G, dim, group_max, n_block};
    kvb_pool_run(n_block >= 64 ? cpu_backend_pool(be) : NULL, block_scores_task, &j);
    return 0;
}

static int cpu_block_expand(kvb_backend *be, int32_t *idx, const int32_t *blocks, int64_t block, int64_t n, char *err,
                            size_t err_len) {
    if (block <= 0) return ERR("block_expand: block %lld", (long long)block);
    for (int64_t i = 0; i < n; i++) idx[i] = (int32_t)(blocks[i / block] * block + i % block);
    return 0;
}

/* the heads one by one through the one-head ops (their results by construction) */
static int cpu_block_minmax_heads(kvb_backend *be, int n_heads, float *const *kmin, float *const *kmax,
                                  const void *const *k, kvb_dtype dtype, int dim, int64_t block, int64_t from, int64_t n,
                                  char *err, size_t err_len) {
    if (n_heads < 0) return ERR("block_minmax_heads: %d heads", n_heads);
    for (int j = 0; j < n_heads; j++)
        if (cpu_block_minmax(be, kmin[j], kmax[j], k[j], dtype, dim, block, from, n, err, err_len)) return -1;
    return 0;
}

static int cpu_block_scores_heads(kvb_backend *be, int n_heads, float *score, int64_t score_stride, const float *q,
                                  const float *const *kmin, const float *const *kmax, int G, int dim, int64_t n_block,
                                  int group_max, char *err, size_t err_len) {
    if (n_heads < 0) return ERR("block_scores_heads: %d heads", n_heads);
    for (int j = 0; j < n_heads; j++)
        if (cpu_block_scores(be, score + (size_t)j * score_stride, q + (size_t)j * G * dim, kmin[j], kmax[j], G, dim,
                             n_block, group_max, err, err_len))
            return -1;
    return 0;
}

static int cpu_block_expand_rows(kvb_backend *be, int rows, int32_t *idx, int64_t idx_stride, const int32_t *blocks,
                                 int64_t blocks_stride, int64_t n_listed, int64_t tail, int64_t block, int64_t n,
                                 char *err, size_t err_len) {
    if (block <= 0 || rows < 0 || n_listed < 0)
        return ERR("block_expand_rows: %d rows, block %lld, %lld listed", rows, (long long)block, (long long)n_listed);
    for (int j = 0; j < rows; j++) {
        int32_t *out = idx + (size_t)j * idx_stride;
        const int32_t *list = blocks + (size_t)j * blocks_stride;
        for (int64_t i = 0; i < n; i++) {
            const int64_t b = i / block;
            out[i] = (int32_t)((b < n_listed ? list[b] : tail + b - n_listed) * block + i % block);
        }
    }
    return 0;
}

/* ---- AdaKV: fill_idx_f32, split_rows_idx ---- */

static int cpu_fill_idx_f32(kvb_backend *be, float *dst, const int32_t *idx, int64_t n, float value, char *err,
                            size_t err_len) {
    if (check_idx(idx, n, "fill_idx_f32", err, err_len)) return -1;
    for (int64_t i = 0; i < n; i++) dst[idx[i]] = value;
    return 0;
}

static int cpu_split_rows_idx(kvb_backend *be, int32_t *out, int64_t out_stride, int32_t *counts, const int32_t *flat,
                              int64_t n, int64_t row_len, int rows, char *err, size_t err_len) {
    if (row_len < 1 || rows < 0) return ERR("split_rows_idx: %d rows of %lld", rows, (long long)row_len);
    for (int r = 0; r < rows; r++) counts[r] = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t r = flat[i] / row_len;
        if (flat[i] < 0 || r >= rows || (i && flat[i] <= flat[i - 1]))
            return ERR("split_rows_idx: index %d at %lld out of order or range", flat[i], (long long)i);
        if (counts[r] >= out_stride) return ERR("split_rows_idx: row %lld holds more than %lld", (long long)r, (long long)out_stride);
        out[r * out_stride + counts[r]++] = (int32_t)(flat[i] - r * row_len);
    }
    return 0;
}

void cpu_install_data_ops(kvb_backend *be) {
    be->copy = cpu_copy;
    be->zero = cpu_zero;
    be->kv_gather = cpu_kv_gather;
    be->kv_load = cpu_kv_load;
    be->kv_evict = cpu_kv_evict;
    be->probs_reduce = cpu_probs_reduce;
    be->pool1d = cpu_pool1d;
    be->topk_idx = cpu_topk_idx;
    be->topk_rows = cpu_topk_rows;
    be->iota = cpu_iota;
    be->gather_f32 = cpu_gather_f32;
    be->round_scores = cpu_round_scores;
    be->pod_share = cpu_pod_share;
    be->pod_merge = cpu_pod_merge;
    be->row_norms = cpu_row_norms;
    be->block_minmax = cpu_block_minmax;
    be->block_scores = cpu_block_scores;
    be->block_expand = cpu_block_expand;
    be->block_minmax_heads = cpu_block_minmax_heads;
    be->block_scores_heads = cpu_block_scores_heads;
    be->block_expand_rows = cpu_block_expand_rows;
    be->attention_colsum = cpu_attention_colsum;
    be->fill_idx_f32 = cpu_fill_idx_f32;
    be->split_rows_idx = cpu_split_rows_idx;
    cpu_install_elem_ops(be);
}
