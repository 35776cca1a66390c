/* elemops.c — the CPU backend's elementwise data ops on per-slot vectors (kernels/backend.h: mul_f32, axpby_f32,
 * softmax_rows, proj_sqnorms, proj_l1norms, block_scaled_std, block_normalize, block_ranks): plain loops in the
 * header's order and precision, which the CUDA backend (kernels/cuda/elemops.cu) repeats; proj_sqnorms and
 * proj_l1norms, the costly ones (proj_l1norms: W_o's n_embd rows per slot), run slots in vector lanes across the
 * thread pool. */
#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/kvops.h"
#include "kernels/cpu/ops_vec.h" /* immintrin.h where the compiler targets AVX2 or AVX-512 */

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

static double elem(const void *x, kvb_dtype dtype, size_t at) {
    return dtype == KVB_F16 ? (double)kvb_f16_to_f32(((const kvb_f16 *)x)[at]) : (double)((const float *)x)[at];
}

static int cpu_mul_f32(kvb_backend *be, float *out, const float *a, const float *b, int64_t n, char *err,
                       size_t err_len) {
    (void)be, (void)err, (void)err_len;
    for (int64_t i = 0; i < n; i++) out[i] = a[i] * b[i];
    return 0;
}

static int cpu_axpby_f32(kvb_backend *be, float *out, const float *a, double alpha, const float *b, double beta,
                         double gamma, int64_t n, char *err, size_t err_len) {
    (void)be, (void)err, (void)err_len;
    for (int64_t i = 0; i < n; i++) {
        double s = alpha * (double)a[i];
        if (b) s += beta * (double)b[i];
        out[i] = (float)(s + gamma);
    }
    return 0;
}

static int cpu_softmax_rows(kvb_backend *be, float *x, int64_t stride, int64_t rows, int64_t n, char *err,
                            size_t err_len) {
    (void)be;
    if (rows > 1 && stride < n) return ERR("softmax_rows: stride %lld under %lld columns", (long long)stride, (long long)n);
    for (int64_t r = 0; r < rows; r++) {
        float *row = x + r * stride;
        float m = -INFINITY;
        int nan = 0;
        for (int64_t i = 0; i < n; i++) {
            nan |= isnan(row[i]);
            if (row[i] > m) m = row[i];
        }
        double s = 0;
        for (int64_t i = 0; i < n; i++) s += exp((double)row[i] - m);
        for (int64_t i = 0; i < n; i++) row[i] = nan ? NAN : (float)(exp((double)row[i] - m) / s);
    }
    return 0;
}

/* proj_sqnorms and proj_l1norms: per slot j, d_r = the double sum over e ascending of (double)u[r][e] x[j][e], then
 * out[j] = the sum over r ascending of d_r^2 (square) or |d_r|. Each product of two floats is exact in double, so an
 * FMA adds it with the one rounding the header's add has, and vectors whose lanes are slots keep every slot's sums
 * in the header's order: the same bits as the plain loop (proj_row), which does the slots a vector block does not
 * fill. Slots run in blocks of PJ_LANES across the pool's threads; U is read as doubles, converted once a call.
 * CriticalKV scores every prompt slot this way against W_o's n_embd rows, once per KV head and layer. */
typedef struct {
    float *out;
    const void *x;
    kvb_dtype dtype;
    int dim, m, square;
    int64_t n;
    const double *u; /* [m][dim] */
} proj_job;

static float proj_row(const proj_job *j, int64_t t) {
    double acc = 0;
    for (int r = 0; r < j->m; r++) {
        const double *ur = j->u + (size_t)r * j->dim;
        double d = 0;
        for (int e = 0; e < j->dim; e++) d += ur[e] * elem(j->x, j->dtype, (size_t)t * j->dim + e);
        acc += j->square ? d * d : fabs(d);
    }
    return (float)acc;
}

enum { PJ_MAX_DIM = 512 };
#if defined(__AVX512F__)
#define PJ_LANES 8
typedef __m512d vd;
static inline vd vd_zero(void) { return _mm512_setzero_pd(); }
static inline vd vd_load(const double *p) { return _mm512_load_pd(p); }
static inline vd vd_fma_b(const double *u, vd x, vd d) { return _mm512_fmadd_pd(_mm512_set1_pd(*u), x, d); }
static inline vd vd_term(vd d, int square) { return square ? _mm512_mul_pd(d, d) : _mm512_abs_pd(d); }
static inline vd vd_add(vd a, vd b) { return _mm512_add_pd(a, b); }
static inline void vd_store(double *p, vd a) { _mm512_store_pd(p, a); }
#elif defined(__AVX2__) && defined(__FMA__)
#define PJ_LANES 4
typedef __m256d vd;
static inline vd vd_zero(void) { return _mm256_setzero_pd(); }
static inline vd vd_load(const double *p) { return _mm256_load_pd(p); }
static inline vd vd_fma_b(const double *u, vd x, vd d) { return _mm256_fmadd_pd(_mm256_broadcast_sd(u), x, d); }
static inline vd vd_term(vd d, int square) {
    return square ? _mm256_mul_pd(d, d) : _mm256_andnot_pd(_mm256_set1_pd(-0.0), d);
}
static inline vd vd_add(vd a, vd b) { return _mm256_add_pd(a, b); }
static inline void vd_store(double *p, vd a) { _mm256_store_pd(p, a); }
#endif

#ifdef PJ_LANES
/* slots t0 .. t0 + PJ_LANES - 1, a lane each: their rows transposed to [dim][lane] doubles, then four rows of U at a
 * time (four independent add chains), each chain over e ascending, its terms added to acc in r order */
static void proj_block(const proj_job *j, int64_t t0) {
    _Alignas(64) double xt[PJ_MAX_DIM * PJ_LANES], o[PJ_LANES];
    const int D = j->dim;
    for (int l = 0; l < PJ_LANES; l++)
        for (int e = 0; e < D; e++) xt[e * PJ_LANES + l] = elem(j->x, j->dtype, (size_t)(t0 + l) * D + e);
    vd acc = vd_zero();
    int r = 0;
    for (; r + 4 <= j->m; r += 4) {
        const double *u0 = j->u + (size_t)r * D, *u1 = u0 + D, *u2 = u1 + D, *u3 = u2 + D;
        vd d0 = vd_zero(), d1 = vd_zero(), d2 = vd_zero(), d3 = vd_zero();
        for (int e = 0; e < D; e++) {
            const vd x = vd_load(xt + e * PJ_LANES);
            d0 = vd_fma_b(u0 + e, x, d0);
            d1 = vd_fma_b(u1 + e, x, d1);
            d2 = vd_fma_b(u2 + e, x, d2);
            d3 = vd_fma_b(u3 + e, x, d3);
        }
        acc = vd_add(vd_add(vd_add(vd_add(acc, vd_term(d0, j->square)), vd_term(d1, j->square)), vd_term(d2, j->square)),
                     vd_term(d3, j->square));
    }
    for (; r < j->m; r++) {
        const double *ur = j->u + (size_t)r * D;
        vd d = vd_zero();
        for (int e = 0; e < D; e++) d = vd_fma_b(ur + e, vd_load(xt + e * PJ_LANES), d);
        acc = vd_add(acc, vd_term(d, j->square));
    }
    vd_store(o, acc);
    for (int l = 0; l < PJ_LANES; l++) j->out[t0 + l] = (float)o[l];
}
#else
#define PJ_LANES 1
#endif

static void proj_tasks(void *arg, int ith, int nth) {
    const proj_job *j = arg;
    const int64_t blocks = (j->n + PJ_LANES - 1) / PJ_LANES;
    long lo, hi;
    kvb_split((long)blocks, ith, nth, &lo, &hi);
    for (long b = lo; b < hi; b++) {
        const int64_t t0 = (int64_t)b * PJ_LANES;
#if PJ_LANES > 1
        if (t0 + PJ_LANES <= j->n && j->dim <= PJ_MAX_DIM) {
            proj_block(j, t0);
            continue;
        }
#endif
        for (int64_t t = t0; t < t0 + PJ_LANES && t < j->n; t++) j->out[t] = proj_row(j, t);
    }
}

/* U as doubles ([m][dim], from rows u_stride apart), then the slots across the pool's threads */
static int proj_norms(kvb_backend *be, const char *op, float *out, const void *x, kvb_dtype dtype, int dim, int64_t n,
                      const float *u, int64_t u_stride, int m, int square, char *err, size_t err_len) {
    if (n <= 0 || m == 0) {
        for (int64_t t = 0; t < n; t++) out[t] = 0.0f;
        return 0;
    }
    double *ud = malloc((size_t)m * (size_t)dim * sizeof *ud);
    if (!ud) return ERR("%s: out of memory", op);
    for (int r = 0; r < m; r++)
        for (int e = 0; e < dim; e++) ud[(size_t)r * dim + e] = u[(size_t)r * (size_t)u_stride + e];
    proj_job job = {out, x, dtype, dim, m, square, n, ud};
    kvb_pool_run(n >= 64 ? cpu_backend_pool(be) : NULL, proj_tasks, &job);
    free(ud);
    return 0;
}

static int cpu_proj_sqnorms(kvb_backend *be, float *out, const void *x, kvb_dtype dtype, int dim, int64_t n,
                            const float *u, int m, char *err, size_t err_len) {
    if (dim <= 0 || m < 0) return ERR("proj_sqnorms: dim %d, %d vectors", dim, m);
    return proj_norms(be, "proj_sqnorms", out, x, dtype, dim, n, u, dim, m, 1, err, err_len);
}

static int cpu_proj_l1norms(kvb_backend *be, float *out, const void *x, kvb_dtype dtype, int dim, int64_t n,
                            const float *u, int64_t u_stride, int m, char *err, size_t err_len) {
    if (dim <= 0 || m < 0 || u_stride < dim) return ERR("proj_l1norms: dim %d, %d vectors %lld apart", dim, m, (long long)u_stride);
    return proj_norms(be, "proj_l1norms", out, x, dtype, dim, n, u, u_stride, m, 0, err, err_len);
}

static int cpu_block_scaled_std(kvb_backend *be, float *out, const void *x, kvb_dtype dtype, int dim, int64_t n,
                                const float *lo, const float *hi, int64_t block, char *err, size_t err_len) {
    (void)be;
    if (dim <= 0 || block <= 0) return ERR("block_scaled_std: dim %d, block %lld", dim, (long long)block);
    for (int64_t i = 0; i < n; i++) {
        const float *l = lo + (size_t)(i / block) * dim, *h = hi + (size_t)(i / block) * dim;
        double mean = 0, ss = 0;
        for (int e = 0; e < dim; e++) mean += (elem(x, dtype, (size_t)i * dim + e) - l[e]) / ((double)h[e] - l[e]);
        mean /= dim;
        for (int e = 0; e < dim; e++) {
            const double y = (elem(x, dtype, (size_t)i * dim + e) - l[e]) / ((double)h[e] - l[e]) - mean;
            ss += y * y;
        }
        out[i] = (float)sqrt(ss / (dim - 1));
    }
    return 0;
}

static int cpu_block_normalize(kvb_backend *be, float *x, int64_t n, int64_t block, char *err, size_t err_len) {
    (void)be;
    if (block <= 0) return ERR("block_normalize: block %lld", (long long)block);
    for (int64_t b0 = 0; b0 < n; b0 += block) {
        const int64_t end = b0 + block < n ? b0 + block : n;
        double s = 0;
        for (int64_t i = b0; i < end; i++) s += x[i];
        for (int64_t i = b0; i < end; i++) x[i] = (float)((double)x[i] / s);
    }
    return 0;
}

/* the header's order: numbers ascending, NaN after them, equal keys (NaNs too) by slot */
static int sorts_before(float a, int64_t i, float b, int64_t j) {
    if (isnan(a) || isnan(b)) return isnan(a) ? isnan(b) && i < j : 1;
    return a < b || (a == b && i < j);
}

static int cpu_block_ranks(kvb_backend *be, float *out, const float *x, int64_t n, int64_t block, char *err,
                           size_t err_len) {
    (void)be;
    if (block <= 0) return ERR("block_ranks: block %lld", (long long)block);
    for (int64_t i = 0; i < n; i++) {
        const int64_t b0 = i / block * block, end = b0 + block < n ? b0 + block : n;
        int64_t rank = 0;
        for (int64_t j = b0; j < end; j++) rank += sorts_before(x[j], j, x[i], i);
        out[i] = (float)rank;
    }
    return 0;
}

/* j outer, so each row is read once; every sum still runs over j ascending (a product then an add, never fused:
 * ISO C, no contraction); out is symmetric, as double products commute */
static int cpu_gram_f32(kvb_backend *be, float *out, const float *x, int64_t n, int d, char *err, size_t err_len) {
    if (d <= 0 || n < 0) return ERR("gram_f32: %lld rows of %d", (long long)n, d);
    double *acc = calloc((size_t)d * (size_t)d, sizeof *acc);
    if (!acc) return ERR("gram_f32: out of memory");
    for (int64_t j = 0; j < n; j++) {
        const float *r = x + j * d;
        for (int a = 0; a < d; a++) {
            const double xa = r[a];
            double *row = acc + (size_t)a * d;
            for (int b = a; b < d; b++) {
                const double p = xa * r[b];
                row[b] += p;
            }
        }
    }
    for (int a = 0; a < d; a++)
        for (int b = a; b < d; b++) out[(size_t)a * d + b] = out[(size_t)b * d + a] = (float)acc[(size_t)a * d + b];
    free(acc);
    return 0;
}

void cpu_install_elem_ops(kvb_backend *be) {
    be->mul_f32 = cpu_mul_f32;
    be->axpby_f32 = cpu_axpby_f32;
    be->softmax_rows = cpu_softmax_rows;
    be->proj_sqnorms = cpu_proj_sqnorms;
    be->gram_f32 = cpu_gram_f32;
    be->proj_l1norms = cpu_proj_l1norms;
    be->block_scaled_std = cpu_block_scaled_std;
    be->block_normalize = cpu_block_normalize;
    be->block_ranks = cpu_block_ranks;
}
