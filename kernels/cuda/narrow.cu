/* narrow.cu — the CUDA backend's narrow-key ops (kernels/backend.h, "keys narrower than values"): gather_cols (a
 * thread per element) and attention_narrow (a block per query row and head). CPU reference: kernels/cpu/narrow.c.
 *
 * Numerics: compiled like kvops.cu (no fast math, no contraction). attention_narrow keeps the header's orders as
 * attention_quant does (kvquant.cu): a thread's logit sums the kept channels j ascending, thread 0 adds the
 * weights to L in token order and thread e accumulates channel e in token order; only the double exp and log may
 * differ from glibc in the last bit. The logits are computed twice (for the maximum, then per chunk of CHUNK
 * tokens for the weights) so the block's shared memory stays fixed. */
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cuda/kvops.h"
#include "kernels/cuda/narrow.h"

#define CK_LAUNCH(kernel) cuda_kvops_check(o, cudaGetLastError(), #kernel "<<<>>>", __FILE__, __LINE__)

enum { GATHER_THREADS = 256, ATTN_THREADS = 256, CHUNK = 512, MAX_DIM = 256 };

static cuda_kvops *OPS(kvb_backend *be) { return (cuda_kvops *)be->impl; }

/* ---- gather_cols ---- */

template <typename T>
__global__ void k_gather_cols(T *out, int64_t out_stride, const T *x, int64_t in_stride, const int32_t *cols, int m,
                              int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * m) return;
    const int64_t r = i / m;
    const int j = (int)(i % m);
    out[r * out_stride + j] = x[r * in_stride + cols[j]];
}

static int cu_gather_cols(kvb_backend *be, void *out, int64_t out_stride, const void *x, int64_t in_stride,
                          kvb_dtype dtype, const int32_t *cols, int m, int64_t n, char *err, size_t err_len) {
    cuda_kvops *o = OPS(be);
    if (be->error[0]) return cuda_kvops_failed(o, err, err_len);
    if (dtype != KVB_F16 && dtype != KVB_F32) return kvb_errf(err, err_len, "gather_cols: dtype must be f16 or f32");
    if (m < 0 || n < 0 || out_stride < m || in_stride < 1)
        return kvb_errf(err, err_len, "gather_cols: %d columns of %lld rows (strides %lld, %lld)", m, (long long)n,
                        (long long)out_stride, (long long)in_stride);
    if (!m || !n) return 0;
    const unsigned blocks = (unsigned)((n * m + GATHER_THREADS - 1) / GATHER_THREADS);
    if (dtype == KVB_F16)
        k_gather_cols<uint16_t><<<blocks, GATHER_THREADS, 0, o->stream>>>((uint16_t *)out, out_stride,
                                                                           (const uint16_t *)x, in_stride, cols, m, n);
    else
        k_gather_cols<float><<<blocks, GATHER_THREADS, 0, o->stream>>>((float *)out, out_stride, (const float *)x,
                                                                        in_stride, cols, m, n);
    return CK_LAUNCH(k_gather_cols) ? cuda_kvops_failed(o, err, err_len) : 0;
}

/* ---- attention_narrow ---- */

typedef struct {
    const void *k[KVB_MAX_KV_HEADS], *v[KVB_MAX_KV_HEADS];
    const int32_t *pos[KVB_MAX_KV_HEADS];
} narrow_heads;

typedef struct {
    const float *qg;
    const int32_t *q_pos;
    float *out, *lse;
    int64_t n_q, n;
    int n_head, Gq, D, dk, f16;
    float scale;
} narrow_args;

static __device__ float elem(const void *x, int f16, int64_t i) {
    return f16 ? __half2float(((const __half *)x)[i]) : ((const float *)x)[i];
}

/* scaled logit of token i over the kept channels, j ascending; -inf when masked */
static __device__ float logit(const narrow_args &p, const void *k, const int32_t *pos, const float *qs, int64_t i,
                       int32_t qpos) {
    if (p.q_pos && pos[i] > qpos) return -INFINITY;
    float dot = 0;
    for (int j = 0; j < p.dk; j++) dot = __fadd_rn(dot, __fmul_rn(qs[j], elem(k, p.f16, i * p.dk + j)));
    return __fmul_rn(p.scale, dot);
}

__global__ void __launch_bounds__(ATTN_THREADS) k_attention_narrow(narrow_args p, narrow_heads nh) {
    const int64_t t = blockIdx.x / p.n_head;
    const int h = (int)(blockIdx.x % p.n_head), g = h / p.Gq, e = threadIdx.x;
    const void *k = nh.k[g], *v = nh.v[g];
    const int32_t *pos = nh.pos[g];
    const int32_t qpos = p.q_pos ? p.q_pos[t] : 0;
    __shared__ float qs[MAX_DIM], red[ATTN_THREADS];
    __shared__ double w[CHUNK], l_sh;
    for (int i = e; i < p.dk; i += blockDim.x) qs[i] = p.qg[(t * p.n_head + h) * p.dk + i];
    __syncthreads();
    float m = -INFINITY;
    for (int64_t i = e; i < p.n; i += blockDim.x) m = fmaxf(m, logit(p, k, pos, qs, i, qpos));
    red[e] = m;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s /= 2) {
        if (e < s) red[e] = fmaxf(red[e], red[e + s]);
        __syncthreads();
    }
    if (red[0] == -INFINITY) return; /* nothing visible: out and lse kept */
    float *lse = p.lse + (int64_t)h * p.n_q + t;
    const float lse0 = *lse, M = fmaxf(lse0, red[0]);
    float acc = 0;
    if (e == 0) l_sh = 0;
    for (int64_t c0 = 0; c0 < p.n; c0 += CHUNK) {
        const int nc = (int)(p.n - c0 < CHUNK ? p.n - c0 : CHUNK);
        __syncthreads();
        for (int j = e; j < nc; j += blockDim.x) {
            const float s = logit(p, k, pos, qs, c0 + j, qpos);
            w[j] = s == -INFINITY ? 0.0 : exp((double)s - (double)M);
        }
        __syncthreads();
        if (e == 0)
            for (int j = 0; j < nc; j++) l_sh += w[j];
        if (e < p.D)
            for (int j = 0; j < nc; j++) acc = __fadd_rn(acc, __fmul_rn((float)w[j], elem(v, p.f16, (c0 + j) * p.D + e)));
    }
    __syncthreads();
    const double w0 = isfinite(lse0) ? exp((double)lse0 - (double)M) : 0.0, L = w0 + l_sh;
    if (e < p.D) {
        float *out = p.out + (t * p.n_head + h) * p.D + e;
        *out = (float)(((w0 > 0 ? w0 * (double)*out : 0.0) + (double)acc) / L);
    }
    if (e == 0) *lse = (float)((double)M + log(L));
}

static int cu_attention_narrow(kvb_backend *be, const kvb_attn_args *a, const kvb_narrow_kv *s, char *err,
                               size_t err_len) {
    cuda_kvops *o = OPS(be);
    if (be->error[0]) return cuda_kvops_failed(o, err, err_len);
    if (a->n_head <= 0 || a->n_head_kv <= 0 || a->n_head % a->n_head_kv || a->n_head_kv > KVB_MAX_KV_HEADS)
        return kvb_errf(err, err_len, "attention_narrow: %d query heads over %d KV heads (at most %d)", a->n_head,
                        a->n_head_kv, (int)KVB_MAX_KV_HEADS);
    if (!a->lse) return kvb_errf(err, err_len, "attention_narrow: needs the store part's lse");
    if (a->kv_dtype != KVB_F16 && a->kv_dtype != KVB_F32)
        return kvb_errf(err, err_len, "attention_narrow: K and V must be f16 or f32");
    if (a->head_dim > MAX_DIM) return kvb_errf(err, err_len, "attention_narrow: head_dim %d over %d", a->head_dim, (int)MAX_DIM);
    if (s->dk < 1 || s->dk > a->head_dim || s->n < 0)
        return kvb_errf(err, err_len, "attention_narrow: %d key channels of %d, %lld tokens", s->dk, a->head_dim,
                        (long long)s->n);
    if (s->n == 0 || a->n_q == 0) return 0;
    narrow_heads nh;
    memset(&nh, 0, sizeof nh);
    for (int g = 0; g < a->n_head_kv; g++) nh.k[g] = s->k[g], nh.v[g] = s->v[g], nh.pos[g] = s->pos[g];
    narrow_args p = {s->qg, a->q_pos, a->out, a->lse, a->n_q, s->n, a->n_head, a->n_head / a->n_head_kv, a->head_dim,
                     s->dk, a->kv_dtype == KVB_F16, a->scale};
    k_attention_narrow<<<(unsigned)(a->n_q * a->n_head), ATTN_THREADS, 0, o->stream>>>(p, nh);
    return CK_LAUNCH(k_attention_narrow) ? cuda_kvops_failed(o, err, err_len) : 0;
}

void cuda_install_narrow_ops(kvb_backend *be) {
    be->gather_cols = cu_gather_cols;
    be->attention_narrow = cu_attention_narrow;
}
