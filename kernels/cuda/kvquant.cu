/* kvquant.cu — the CUDA backend's quantized-KV ops (kernels/backend.h, "KIVI"): quant_groups (a thread per
 * group) and attention_quant (a block per query row and head). CPU reference: kernels/cpu/kvquant.c.
 *
 * Numerics: compiled like kvops.cu (no fast math, no contraction), so the codes, scales and minima of
 * quant_groups equal the CPU's bit for bit (f16 directed rounding by __float2half_rd / _ru, IEEE division,
 * rintf). attention_quant keeps the header's orders: a thread's logit sums e ascending, thread 0 adds the
 * weights to L in token order and thread e accumulates channel e in token order; only the double exp and log
 * may differ from glibc in the last bit. The logits are computed twice (for the maximum, then per chunk of
 * CHUNK tokens for the weights) so the block's shared memory stays fixed. */
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cuda/kvops.h"

#define CK_LAUNCH(kernel) cuda_kvops_check(o, cudaGetLastError(), #kernel "<<<>>>", __FILE__, __LINE__)

enum { QUANT_THREADS = 128, ATTN_THREADS = 256, CHUNK = 512, MAX_DIM = 256, MAX_GROUP = 1024 };

static cuda_kvops *OPS(kvb_backend *be) { return (cuda_kvops *)be->impl; }

static int check_format(int G, int bits, int d, const char *op, char *err, size_t err_len) {
    if (bits != 1 && bits != 2 && bits != 4 && bits != 8) return kvb_errf(err, err_len, "%s: %d bits (1, 2, 4 or 8)", op, bits);
    if (G < 1 || G > MAX_GROUP || G * bits % 16)
        return kvb_errf(err, err_len, "%s: group %d x %d bits is not a multiple of 16 bits (group <= %d)", op, G, bits,
                        (int)MAX_GROUP);
    if (d < 1 || d % G) return kvb_errf(err, err_len, "%s: head_dim %d is not a multiple of the group %d", op, d, G);
    return 0;
}

__device__ float elem(const void *x, int f16, int64_t i) {
    return f16 ? __half2float(((const __half *)x)[i]) : ((const float *)x)[i];
}

/* value i of a group record */
__device__ float dequant(const uint8_t *rec, int G, int bits, int i) {
    const int code = (rec[i * bits / 8] >> (i * bits % 8)) & ((1 << bits) - 1);
    const __half *m = (const __half *)(rec + G * bits / 8); /* 2-byte aligned: records are a multiple of 2 bytes */
    return __fadd_rn(__half2float(m[1]), __fmul_rn((float)code, __half2float(m[0])));
}

__global__ void k_quant_groups(uint8_t *out, const void *x, int f16, int64_t n_groups, int d, int G, int bits,
                               int per_channel) {
    const int64_t gi = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (gi >= n_groups) return;
    /* element i of group gi (the header's layouts) */
    const int64_t base = per_channel ? gi / d * G * d + gi % d : gi / (d / G) * d + gi % (d / G) * G;
    const int64_t step = per_channel ? d : 1;
    float mn = elem(x, f16, base), mx = mn;
    for (int i = 1; i < G; i++) {
        const float v = elem(x, f16, base + i * step);
        mn = v < mn ? v : mn;
        mx = v > mx ? v : mx;
    }
    const int qmax = (1 << bits) - 1;
    const __half zh = __float2half_rd(mn);
    const float z = __half2float(zh);
    const __half sh = __float2half_ru(__fdiv_rn(__fsub_rn(mx, z), (float)qmax));
    const float s = __half2float(sh);
    uint8_t *rec = out + gi * (int64_t)(G * bits / 8 + 4);
    for (int byte = 0; byte < G * bits / 8; byte++) {
        unsigned acc = 0;
        for (int i = byte * 8 / bits; i < (byte + 1) * 8 / bits; i++) {
            int code = 0;
            if (s > 0) {
                const float r = rintf(__fdiv_rn(__fsub_rn(elem(x, f16, base + i * step), z), s));
                code = r < 0 ? 0 : r > (float)qmax ? qmax : (int)r;
            }
            acc |= (unsigned)code << (i * bits % 8);
        }
        rec[byte] = (uint8_t)acc;
    }
    __half *m = (__half *)(rec + G * bits / 8);
    m[0] = sh;
    m[1] = zh;
}

static int cu_quant_groups(kvb_backend *be, void *out, const void *x, kvb_dtype dtype, int64_t n, int d, int G,
                           int bits, int per_channel, char *err, size_t err_len) {
    cuda_kvops *o = OPS(be);
    if (be->error[0]) return cuda_kvops_failed(o, err, err_len);
    if (check_format(G, bits, per_channel ? G : d, "quant_groups", err, err_len)) return -1;
    if (n < 0 || (per_channel && n % G))
        return kvb_errf(err, err_len, "quant_groups: %lld rows in groups of %d", (long long)n, G);
    const int64_t n_groups = per_channel ? n / G * d : n * (d / G);
    if (n_groups == 0) return 0;
    const int64_t blocks = (n_groups + QUANT_THREADS - 1) / QUANT_THREADS;
    k_quant_groups<<<(unsigned)blocks, QUANT_THREADS, 0, o->stream>>>((uint8_t *)out, x, dtype == KVB_F16, n_groups, d,
                                                                      G, bits, per_channel);
    return CK_LAUNCH(k_quant_groups) ? cuda_kvops_failed(o, err, err_len) : 0;
}

/* ---- attention_quant ---- */

typedef struct {
    const uint8_t *k[KVB_MAX_KV_HEADS], *v[KVB_MAX_KV_HEADS];
} quant_heads;

typedef struct {
    const float *q;
    const int32_t *q_pos;
    float *out, *lse;
    int64_t n_q, n;
    int n_head, Gq, D, G, bits;
    int32_t pos0;
    float scale;
} quant_args;

/* scaled logit of token i (quantized keys of KV head `k`), e ascending; -inf when masked */
__device__ float logit(const quant_args &p, const uint8_t *k, const float *qs, int64_t i, int32_t qpos) {
    if (p.q_pos && p.pos0 + i > qpos) return -INFINITY;
    const size_t rb = (size_t)(p.G * p.bits / 8 + 4);
    const int64_t b = i / p.G;
    const int c = (int)(i % p.G);
    float dot = 0;
    for (int e = 0; e < p.D; e++)
        dot = __fadd_rn(dot, __fmul_rn(qs[e], dequant(k + (size_t)(b * p.D + e) * rb, p.G, p.bits, c)));
    return __fmul_rn(p.scale, dot);
}

__global__ void __launch_bounds__(ATTN_THREADS) k_attention_quant(quant_args p, quant_heads qh) {
    const int64_t t = blockIdx.x / p.n_head;
    const int h = (int)(blockIdx.x % p.n_head), g = h / p.Gq, e = threadIdx.x;
    const uint8_t *k = qh.k[g], *v = qh.v[g];
    const int32_t qpos = p.q_pos ? p.q_pos[t] : 0;
    const size_t rb = (size_t)(p.G * p.bits / 8 + 4);
    __shared__ float qs[MAX_DIM], red[ATTN_THREADS];
    __shared__ double w[CHUNK], l_sh;
    for (int i = e; i < p.D; i += blockDim.x) qs[i] = p.q[(t * p.n_head + h) * p.D + i];
    __syncthreads();
    float m = -INFINITY;
    for (int64_t i = e; i < p.n; i += blockDim.x) m = fmaxf(m, logit(p, k, qs, i, qpos));
    red[e] = m;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s /= 2) {
        if (e < s) red[e] = fmaxf(red[e], red[e + s]);
        __syncthreads();
    }
    float *lse = p.lse + (int64_t)h * p.n_q + t;
    const float lse0 = *lse, M = fmaxf(lse0, red[0]);
    if (M == -INFINITY) return; /* nothing visible: out and lse kept */
    float acc = 0;
    if (e == 0) l_sh = 0;
    for (int64_t c0 = 0; c0 < p.n; c0 += CHUNK) {
        const int nc = (int)(p.n - c0 < CHUNK ? p.n - c0 : CHUNK);
        __syncthreads();
        for (int j = e; j < nc; j += blockDim.x) {
            const float s = logit(p, k, qs, c0 + j, qpos);
            w[j] = s == -INFINITY ? 0.0 : exp((double)s - (double)M);
        }
        __syncthreads();
        if (e == 0)
            for (int j = 0; j < nc; j++) l_sh += w[j];
        if (e < p.D)
            for (int j = 0; j < nc; j++) {
                const int64_t i = c0 + j;
                const float vi = dequant(v + (size_t)(i * (p.D / p.G) + e / p.G) * rb, p.G, p.bits, e % p.G);
                acc = __fadd_rn(acc, __fmul_rn((float)w[j], vi));
            }
    }
    __syncthreads();
    const double w0 = isfinite(lse0) ? exp((double)lse0 - (double)M) : 0.0, L = w0 + l_sh;
    if (e < p.D) {
        float *out = p.out + (t * p.n_head + h) * p.D + e;
        *out = (float)(((w0 > 0 ? w0 * (double)*out : 0.0) + (double)acc) / L);
    }
    if (e == 0) *lse = (float)((double)M + log(L));
}

static int cu_attention_quant(kvb_backend *be, const kvb_attn_args *a, const kvb_quant_kv *q, char *err,
                              size_t err_len) {
    cuda_kvops *o = OPS(be);
    if (be->error[0]) return cuda_kvops_failed(o, err, err_len);
    if (a->n_head <= 0 || a->n_head_kv <= 0 || a->n_head % a->n_head_kv || a->n_head_kv > KVB_MAX_KV_HEADS)
        return kvb_errf(err, err_len, "attention_quant: %d query heads over %d KV heads (at most %d)", a->n_head,
                        a->n_head_kv, (int)KVB_MAX_KV_HEADS);
    if (!a->lse) return kvb_errf(err, err_len, "attention_quant: needs the store part's lse");
    if (a->head_dim > MAX_DIM) return kvb_errf(err, err_len, "attention_quant: head_dim %d over %d", a->head_dim, (int)MAX_DIM);
    if (check_format(q->group, q->bits, a->head_dim, "attention_quant", err, err_len)) return -1;
    if (q->n < 0 || q->n % q->group)
        return kvb_errf(err, err_len, "attention_quant: %lld tokens in groups of %d", (long long)q->n, q->group);
    if (q->n == 0 || a->n_q == 0) return 0;
    quant_heads qh;
    memset(&qh, 0, sizeof qh);
    for (int g = 0; g < a->n_head_kv; g++) qh.k[g] = (const uint8_t *)q->k[g], qh.v[g] = (const uint8_t *)q->v[g];
    quant_args p = {a->q, a->q_pos, a->out, a->lse, a->n_q, q->n, a->n_head, a->n_head / a->n_head_kv, a->head_dim,
                    q->group, q->bits, q->pos0, a->scale};
    k_attention_quant<<<(unsigned)(a->n_q * a->n_head), ATTN_THREADS, 0, o->stream>>>(p, qh);
    return CK_LAUNCH(k_attention_quant) ? cuda_kvops_failed(o, err, err_len) : 0;
}

void cuda_install_kvquant_ops(kvb_backend *be) {
    be->quant_groups = cu_quant_groups;
    be->attention_quant = cu_attention_quant;
}
