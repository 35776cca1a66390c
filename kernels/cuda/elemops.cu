/* elemops.cu — the CUDA backend's elementwise data ops on per-slot vectors (kernels/backend.h: mul_f32, axpby_f32,
 * softmax_rows, proj_sqnorms, proj_l1norms, block_scaled_std, block_normalize, block_ranks). CPU reference: kernels/cpu/elemops.c.
 *
 * Numerics: compiled like kvops.cu (no fast math, no contraction, IEEE division and sqrt), and every sum runs in the
 * header's order in one thread, so each op gives the CPU's bits; softmax_rows' double exp alone may differ from
 * glibc's in the last bit. A thread per output (slot, row or block), grid-stride; softmax_rows a block per row (the
 * maximum by a shared-memory reduction, which any order gives exactly; the sum by one thread, ascending). */
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>

#include "kernels/cuda/kvops.h"

#define CK_LAUNCH(kernel) cuda_kvops_check(o, cudaGetLastError(), #kernel "<<<>>>", __FILE__, __LINE__)

enum { THREADS = 256 };

static cuda_kvops *OPS(kvb_backend *be) { return (cuda_kvops *)be->impl; }

static unsigned grid_for(int64_t n) {
    const int64_t b = (n + THREADS - 1) / THREADS;
    return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

#define EACH(i, n) for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

__device__ static double elem(const void *x, int f16, int64_t at) {
    return f16 ? (double)__half2float(((const __half *)x)[at]) : (double)((const float *)x)[at];
}

/* the launch's outcome, as an int-returning op reports it */
static int launched(cuda_kvops *o, const char *kernel, char *err, size_t err_len) {
    return cuda_kvops_check(o, cudaGetLastError(), kernel, __FILE__, __LINE__) ? cuda_kvops_failed(o, err, err_len) : 0;
}

__global__ void k_mul_f32(float *out, const float *a, const float *b, int64_t n) {
    EACH(i, n) out[i] = a[i] * b[i];
}

static int cu_mul_f32(kvb_backend *be, float *out, const float *a, const float *b, int64_t n, char *err, size_t err_len) {
    cuda_kvops *o = OPS(be);
    if (be->error[0]) return cuda_kvops_failed(o, err, err_len);
    if (n <= 0) return 0;
    k_mul_f32<<<grid_for(n), THREADS, 0, o->stream>>>(out, a, b, n);
    return launched(o, "k_mul_f32<<<>>>", err, err_len);
}

__global__ void k_axpby_f32(float *out, const float *a, double alpha, const float *b, double beta, double gamma,
                            int64_t n) {
    EACH(i, n) {
        double s = alpha * (double)a[i];
        if (b) s += beta * (double)b[i];
        out[i] = (float)(s + gamma);
    }
}

static int cu_axpby_f32(kvb_backend *be, float *out, const float *a, double alpha, const float *b, double beta,
                        double gamma, int64_t n, char *err, size_t err_len) {
    cuda_kvops *o = OPS(be);
    if (be->error[0]) return cuda_kvops_failed(o, err, err_len);
    if (n <= 0) return 0;
    k_axpby_f32<<<grid_for(n), THREADS, 0, o->stream>>>(out, a, alpha, b, beta, gamma, n);
    return launched(o, "k_axpby_f32<<<>>>", err, err_len);
}

/* a block per row */
__global__ void k_softmax_rows(float *x, int64_t stride, int64_t n) {
    __shared__ float red[THREADS];
    __shared__ int has_nan[THREADS];
    __shared__ double sum;
    float *row = x + (int64_t)blockIdx.x * stride;
    float m = -INFINITY;
    int nan = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        nan |= isnan(row[i]);
        m = row[i] > m ? row[i] : m;
    }
    red[threadIdx.x] = m;
    has_nan[threadIdx.x] = nan;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) {
            red[threadIdx.x] = red[threadIdx.x + s] > red[threadIdx.x] ? red[threadIdx.x + s] : red[threadIdx.x];
            has_nan[threadIdx.x] |= has_nan[threadIdx.x + s];
        }
        __syncthreads();
    }
    m = red[0];
    if (threadIdx.x == 0) {
        double s = 0;
        for (int64_t i = 0; i < n; i++) s += exp((double)row[i] - m);
        sum = s;
    }
    __syncthreads();
    const double s = sum;
    nan = has_nan[0];
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) row[i] = nan ? NAN : (float)(exp((double)row[i] - m) / s);
}

static int cu_softmax_rows(kvb_backend *be, float *x, int64_t stride, int64_t rows, int64_t n, char *err,
                           size_t err_len) {
    cuda_kvops *o = OPS(be);
    if (be->error[0]) return cuda_kvops_failed(o, err, err_len);
    if (rows > 1 && stride < n)
        return kvb_errf(err, err_len, "softmax_rows: stride %lld under %lld columns", (long long)stride, (long long)n);
    for (int64_t r0 = 0; r0 < rows && n > 0; r0 += 65535) {
        const int64_t nr = rows - r0 < 65535 ? rows - r0 : 65535;
        k_softmax_rows<<<(unsigned)nr, THREADS, 0, o->stream>>>(x + r0 * stride, stride, n);
        if (launched(o, "k_softmax_rows<<<>>>", err, err_len)) return -1;
    }
    return 0;
}

__global__ void k_proj_sqnorms(float *out, const void *x, int f16, int dim, int64_t n, const float *u, int m) {
    EACH(j, n) {
        double acc = 0;
        for (int r = 0; r < m; r++) {
            double d = 0;
            for (int e = 0; e < dim; e++) d += (double)u[(int64_t)r * dim + e] * elem(x, f16, j * dim + e);
            acc += d * d;
        }
        out[j] = (float)acc;
    }
}

static int cu_proj_sqnorms(kvb_backend *be, float *out, const void *x, kvb_dtype dtype, int dim, int64_t n,
                           const float *u, int m, char *err, size_t err_len) {
    cuda_kvops *o = OPS(be);
    if (be->error[0]) return cuda_kvops_failed(o, err, err_len);
    if (dim <= 0 || m < 0) return kvb_errf(err, err_len, "proj_sqnorms: dim %d, %d vectors", dim, m);
    if (n <= 0) return 0;
    k_proj_sqnorms<<<grid_for(n), THREADS, 0, o->stream>>>(out, x, dtype == KVB_F16, dim, n, u, m);
    return launched(o, "k_proj_sqnorms<<<>>>", err, err_len);
}

/* a thread per entry (a, b), a <= b: its sum over the rows in order, mirrored (threads of a warp read one row's
 * consecutive columns); -fmad=false keeps each product and add apart, as on the CPU */
__global__ void k_gram_f32(float *out, const float *x, int64_t n, int d) {
    EACH(i, (int64_t)d * d) {
        const int a = (int)(i / d), b = (int)(i % d);
        if (b < a) continue;
        double acc = 0;
        for (int64_t j = 0; j < n; j++) acc += (double)x[j * d + a] * (double)x[j * d + b];
        out[(int64_t)a * d + b] = out[(int64_t)b * d + a] = (float)acc;
    }
}

static int cu_gram_f32(kvb_backend *be, float *out, const float *x, int64_t n, int d, char *err, size_t err_len) {
    cuda_kvops *o = OPS(be);
    if (be->error[0]) return cuda_kvops_failed(o, err, err_len);
    if (d <= 0 || n < 0) return kvb_errf(err, err_len, "gram_f32: %lld rows of %d", (long long)n, d);
    k_gram_f32<<<grid_for((int64_t)d * d), THREADS, 0, o->stream>>>(out, x, n, d);
    return launched(o, "k_gram_f32<<<>>>", err, err_len);
}

__global__ void k_proj_l1norms(float *out, const void *x, int f16, int dim, int64_t n, const float *u, int64_t u_stride,
                               int m) {
    EACH(j, n) {
        double acc = 0;
        for (int r = 0; r < m; r++) {
            double d = 0;
            for (int e = 0; e < dim; e++) d += (double)u[r * u_stride + e] * elem(x, f16, j * dim + e);
            acc += fabs(d);
        }
        out[j] = (float)acc;
    }
}

static int cu_proj_l1norms(kvb_backend *be, float *out, const void *x, kvb_dtype dtype, int dim, int64_t n,
                           const float *u, int64_t u_stride, int m, char *err, size_t err_len) {
    cuda_kvops *o = OPS(be);
    if (be->error[0]) return cuda_kvops_failed(o, err, err_len);
    if (dim <= 0 || m < 0 || u_stride < dim)
        return kvb_errf(err, err_len, "proj_l1norms: dim %d, %d vectors %lld apart", dim, m, (long long)u_stride);
    if (n <= 0) return 0;
    k_proj_l1norms<<<grid_for(n), THREADS, 0, o->stream>>>(out, x, dtype == KVB_F16, dim, n, u, u_stride, m);
    return launched(o, "k_proj_l1norms<<<>>>", err, err_len);
}

__global__ void k_block_scaled_std(float *out, const void *x, int f16, int dim, int64_t n, const float *lo,
                                   const float *hi, int64_t block) {
    EACH(i, n) {
        const float *l = lo + i / block * dim, *h = hi + i / block * dim;
        double mean = 0, ss = 0;
        for (int e = 0; e < dim; e++) mean += (elem(x, f16, i * dim + e) - l[e]) / ((double)h[e] - l[e]);
        mean /= dim;
        for (int e = 0; e < dim; e++) {
            const double y = (elem(x, f16, i * dim + e) - l[e]) / ((double)h[e] - l[e]) - mean;
            ss += y * y;
        }
        out[i] = (float)sqrt(ss / (dim - 1));
    }
}

static int cu_block_scaled_std(kvb_backend *be, float *out, const void *x, kvb_dtype dtype, int dim, int64_t n,
                               const float *lo, const float *hi, int64_t block, char *err, size_t err_len) {
    cuda_kvops *o = OPS(be);
    if (be->error[0]) return cuda_kvops_failed(o, err, err_len);
    if (dim <= 0 || block <= 0) return kvb_errf(err, err_len, "block_scaled_std: dim %d, block %lld", dim, (long long)block);
    if (n <= 0) return 0;
    k_block_scaled_std<<<grid_for(n), THREADS, 0, o->stream>>>(out, x, dtype == KVB_F16, dim, n, lo, hi, block);
    return launched(o, "k_block_scaled_std<<<>>>", err, err_len);
}

/* a thread per block */
__global__ void k_block_normalize(float *x, int64_t n, int64_t block, int64_t n_block) {
    EACH(b, n_block) {
        const int64_t b0 = b * block, end = b0 + block < n ? b0 + block : n;
        double s = 0;
        for (int64_t i = b0; i < end; i++) s += x[i];
        for (int64_t i = b0; i < end; i++) x[i] = (float)((double)x[i] / s);
    }
}

static int cu_block_normalize(kvb_backend *be, float *x, int64_t n, int64_t block, char *err, size_t err_len) {
    cuda_kvops *o = OPS(be);
    if (be->error[0]) return cuda_kvops_failed(o, err, err_len);
    if (block <= 0) return kvb_errf(err, err_len, "block_normalize: block %lld", (long long)block);
    if (n <= 0) return 0;
    const int64_t n_block = (n + block - 1) / block;
    k_block_normalize<<<grid_for(n_block), THREADS, 0, o->stream>>>(x, n, block, n_block);
    return launched(o, "k_block_normalize<<<>>>", err, err_len);
}

__device__ static int sorts_before(float a, int64_t i, float b, int64_t j) {
    if (isnan(a) || isnan(b)) return isnan(a) ? isnan(b) && i < j : 1;
    return a < b || (a == b && i < j);
}

__global__ void k_block_ranks(float *out, const float *x, int64_t n, int64_t block) {
    EACH(i, n) {
        const int64_t b0 = i / block * block, end = b0 + block < n ? b0 + block : n;
        int64_t rank = 0;
        for (int64_t j = b0; j < end; j++) rank += sorts_before(x[j], j, x[i], i);
        out[i] = (float)rank;
    }
}

static int cu_block_ranks(kvb_backend *be, float *out, const float *x, int64_t n, int64_t block, char *err,
                          size_t err_len) {
    cuda_kvops *o = OPS(be);
    if (be->error[0]) return cuda_kvops_failed(o, err, err_len);
    if (block <= 0) return kvb_errf(err, err_len, "block_ranks: block %lld", (long long)block);
    if (n <= 0) return 0;
    k_block_ranks<<<grid_for(n), THREADS, 0, o->stream>>>(out, x, n, block);
    return launched(o, "k_block_ranks<<<>>>", err, err_len);
}

void cuda_install_elem_ops(kvb_backend *be) {
    be->mul_f32 = cu_mul_f32;
    be->axpby_f32 = cu_axpby_f32;
    be->softmax_rows = cu_softmax_rows;
    be->proj_sqnorms = cu_proj_sqnorms;
    be->gram_f32 = cu_gram_f32;
    be->proj_l1norms = cu_proj_l1norms;
    be->block_scaled_std = cu_block_scaled_std;
    be->block_normalize = cu_block_normalize;
    be->block_ranks = cu_block_ranks;
}
