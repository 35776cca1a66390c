/* elemops.c — the CPU backend's elementwise data ops on per-slot vectors (kernels/backend.h: mul_f32, axpby_f32,
 * softmax_rows, proj_sqnorms, proj_l1norms, block_scaled_std, block_normalize, block_ranks): plain loops in the
 * header's order and precision, which the CUDA backend (kernels/cuda/elemops.cu) repeats; proj_l1norms, the costly
 * one (W_o's n_embd rows per slot), splits its rows across the thread pool. */
#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/kvops.h"

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

static int cpu_proj_sqnorms(kvb_backend *be, float *out, const void *x, kvb_dtype dtype, int dim, int64_t n,
                            const float *u, int m, char *err, size_t err_len) {
    (void)be;
    if (dim <= 0 || m < 0) return ERR("proj_sqnorms: dim %d, %d vectors", dim, m);
    for (int64_t j = 0; j < n; j++) {
        double acc = 0;
        for (int r = 0; r < m; r++) {
            const float *ur = u + (size_t)r * dim;
            double d = 0;
            for (int e = 0; e < dim; e++) d += (double)ur[e] * elem(x, dtype, (size_t)j * dim + e);
            acc += d * d;
        }
        out[j] = (float)acc;
    }
    return 0;
}

typedef struct {
    float *out;
    const void *x;
    kvb_dtype dtype;
    int dim, m;
    int64_t n, u_stride;
    const float *u;
} l1_job;

static void proj_l1_tasks(void *arg, int ith, int nth) {
    const l1_job *j = arg;
    long lo, hi;
    kvb_split((long)j->n, ith, nth, &lo, &hi);
    for (long t = lo; t < hi; t++) {
        double acc = 0;
        for (int r = 0; r < j->m; r++) {
            const float *ur = j->u + (size_t)r * (size_t)j->u_stride;
            double d = 0;
            for (int e = 0; e < j->dim; e++) d += (double)ur[e] * elem(j->x, j->dtype, (size_t)t * j->dim + e);
            acc += fabs(d);
        }
        j->out[t] = (float)acc;
    }
}

/* rows split across the pool's threads: each row's sums in the header's order */
static int cpu_proj_l1norms(kvb_backend *be, float *out, const void *x, kvb_dtype dtype, int dim, int64_t n,
                            const float *u, int64_t u_stride, int m, char *err, size_t err_len) {
    if (dim <= 0 || m < 0 || u_stride < dim) return ERR("proj_l1norms: dim %d, %d vectors %lld apart", dim, m, (long long)u_stride);
    l1_job job = {out, x, dtype, dim, m, n, u_stride, u};
    kvb_pool_run(n >= 64 ? cpu_backend_pool(be) : NULL, proj_l1_tasks, &job);
    return 0;
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

void cpu_install_elem_ops(kvb_backend *be) {
    be->mul_f32 = cpu_mul_f32;
    be->axpby_f32 = cpu_axpby_f32;
    be->softmax_rows = cpu_softmax_rows;
    be->proj_sqnorms = cpu_proj_sqnorms;
    be->proj_l1norms = cpu_proj_l1norms;
    be->block_scaled_std = cpu_block_scaled_std;
    be->block_normalize = cpu_block_normalize;
    be->block_ranks = cpu_block_ranks;
}
