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

#include "kernels/cuda/attention.h"
#include "kernels/cuda/candidate.h"
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

/* ---- attention_quant v2 (KVB_QUANT_KERNEL=2, a candidate): the tokens split across blocks, then merged ----
 *
 * v1 above runs one block per query row and head and walks every token in order: on the 8B shapes at 32K (32
 * blocks for 132 SMs, 32,640 quantized tokens) KIVI decoded at 238 ms/token on an H200 (2026-11-27), 0.04x full.
 * v2 gives each block one KV head, one query row and a split of SPLIT_MAX tokens or fewer: its GQA group's logits
 * (each key element dequantized once for the group, e ascending per head, in float as v1), the split's maximum
 * m_s, its weights exp(s_i - m_s) and their sum l_s in double, and acc_s[e] = sum_i (float)w_i v_i[e] in token
 * order; k_quant_merge then joins the splits and the store part: M = max(lse, max m_s), L = w0 + sum_s
 * exp(m_s - M) l_s, out[e] = (w0 out[e] + sum_s exp(m_s - M) acc_s[e]) / L. The order of the sums differs from the
 * header's (token order across the whole list), which the backend test allows a GPU (its float64 bound). */
enum { Q2_THREADS = 128, Q2_GQ_MAX = 16, Q2_SMEM_LOGITS = 4096, Q2_E_PER_THREAD = MAX_DIM / Q2_THREADS };

__global__ void __launch_bounds__(Q2_THREADS) k_attention_quant2(quant_args p, quant_heads qh, int64_t split, float *part_m,
                                                                 double *part_l, float *part_acc, int n_split) {
    const int s_i = blockIdx.x, g = blockIdx.y, tid = threadIdx.x, Gq = p.Gq, D = p.D;
    const int64_t t = blockIdx.z, i0 = (int64_t)s_i * split, i1 = i0 + split < p.n ? i0 + split : p.n, ns = i1 - i0;
    const uint8_t *k = qh.k[g], *v = qh.v[g];
    const int32_t qpos = p.q_pos ? p.q_pos[t] : 0;
    const size_t rb = (size_t)(p.G * p.bits / 8 + 4);
    __shared__ float qs[Q2_GQ_MAX * MAX_DIM], lg[Q2_SMEM_LOGITS], red[Q2_THREADS];
    __shared__ double wsum[Q2_THREADS];
    for (int x = tid; x < Gq * D; x += blockDim.x) qs[x] = p.q[(t * p.n_head + (int64_t)g * Gq + x / D) * D + x % D];
    __syncthreads();
    /* the split's logits, token j of the split for every head of the group: lg[h * ns + j] */
    for (int64_t j = tid; j < ns; j += blockDim.x) {
        const int64_t i = i0 + j;
        float dot[Q2_GQ_MAX];
        for (int h = 0; h < Gq; h++) dot[h] = 0;
        const int masked = p.q_pos && p.pos0 + i > qpos;
        if (!masked) {
            const int64_t b = i / p.G;
            const int c = (int)(i % p.G);
            for (int e = 0; e < D; e++) {
                const float kv = dequant(k + (size_t)(b * D + e) * rb, p.G, p.bits, c);
                for (int h = 0; h < Gq; h++) dot[h] = __fadd_rn(dot[h], __fmul_rn(qs[h * D + e], kv));
            }
        }
        for (int h = 0; h < Gq; h++) lg[h * ns + j] = masked ? -INFINITY : __fmul_rn(p.scale, dot[h]);
    }
    __syncthreads();
    float acc[Q2_GQ_MAX][Q2_E_PER_THREAD];
    for (int h = 0; h < Gq; h++) {
        /* the head's maximum over the split, then its weights in place (as floats: (float)w_i is what acc takes) and
         * their double sum */
        float m = -INFINITY;
        for (int64_t j = tid; j < ns; j += blockDim.x) m = fmaxf(m, lg[h * ns + j]);
        red[tid] = m;
        __syncthreads();
        for (int st = blockDim.x / 2; st > 0; st >>= 1) {
            if (tid < st) red[tid] = fmaxf(red[tid], red[tid + st]);
            __syncthreads();
        }
        m = red[0];
        __syncthreads();
        double l = 0;
        for (int64_t j = tid; j < ns; j += blockDim.x) {
            const float sc = lg[h * ns + j];
            const double w = sc == -INFINITY || m == -INFINITY ? 0.0 : exp((double)sc - (double)m);
            l += w;
            lg[h * ns + j] = (float)w;
        }
        wsum[tid] = l;
        __syncthreads();
        for (int st = blockDim.x / 2; st > 0; st >>= 1) {
            if (tid < st) wsum[tid] += wsum[tid + st];
            __syncthreads();
        }
        const size_t at = ((size_t)t * p.n_head + (size_t)g * Gq + h) * n_split + s_i;
        if (tid == 0) part_m[at] = m, part_l[at] = wsum[0];
        for (int r = 0; r < Q2_E_PER_THREAD; r++) acc[h][r] = 0;
    }
    __syncthreads();
    /* acc_s[e] for every head, token order; each element of V dequantized once for the group */
    for (int r = 0; r < Q2_E_PER_THREAD; r++) {
        const int e = tid + r * Q2_THREADS;
        if (e >= D) break;
        for (int64_t j = 0; j < ns; j++) {
            const int64_t i = i0 + j;
            const float vi = dequant(v + (size_t)(i * (D / p.G) + e / p.G) * rb, p.G, p.bits, e % p.G);
            for (int h = 0; h < Gq; h++) acc[h][r] = __fadd_rn(acc[h][r], __fmul_rn(lg[h * ns + j], vi));
        }
        for (int h = 0; h < Gq; h++)
            part_acc[(((size_t)t * p.n_head + (size_t)g * Gq + h) * n_split + s_i) * D + e] = acc[h][r];
    }
}

__global__ void k_quant_merge(quant_args p, const float *part_m, const double *part_l, const float *part_acc, int n_split) {
    const int64_t t = blockIdx.x / p.n_head;
    const int h = (int)(blockIdx.x % p.n_head);
    const size_t row = ((size_t)t * p.n_head + h) * n_split;
    float *lse = p.lse + (int64_t)h * p.n_q + t;
    const float lse0 = *lse;
    float M = lse0;
    for (int s = 0; s < n_split; s++) M = fmaxf(M, part_m[row + s]);
    if (M == -INFINITY) return; /* nothing visible: out and lse kept */
    const double w0 = isfinite(lse0) ? exp((double)lse0 - (double)M) : 0.0;
    double L = w0;
    for (int s = 0; s < n_split; s++)
        if (part_m[row + s] != -INFINITY) L += exp((double)part_m[row + s] - (double)M) * part_l[row + s];
    for (int e = threadIdx.x; e < p.D; e += blockDim.x) {
        float *out = p.out + (t * p.n_head + h) * p.D + e;
        double sum = w0 > 0 ? w0 * (double)*out : 0.0;
        for (int s = 0; s < n_split; s++)
            if (part_m[row + s] != -INFINITY) sum += exp((double)part_m[row + s] - (double)M) * (double)part_acc[(row + s) * p.D + e];
        *out = (float)(sum / L);
    }
    __syncthreads();
    if (threadIdx.x == 0) *lse = (float)((double)M + log(L));
}

static int g_quant_kernel = 0; /* 0 = not chosen yet; 1 = v1 (default), 2 = v2 */

extern "C" int kvb_cuda_quant_kernel(void) { return kvb_switch_pick(&g_quant_kernel, "KVB_QUANT_KERNEL", 2, 1); }

/* v2's split: about two blocks an SM; a split's logits of the whole group fit the block's shared memory */
static int64_t quant2_split(const kvb_attn_args *a, const quant_args &p) {
    const int64_t cap = Q2_SMEM_LOGITS / p.Gq;
    int64_t want = (2 * (int64_t)kvb_cuda_sm_count() + a->n_head_kv * a->n_q - 1) / (a->n_head_kv * a->n_q);
    if (want < 1) want = 1;
    int64_t split = (p.n + want - 1) / want;
    split = (split + 31) / 32 * 32;
    return split > cap ? cap : split;
}

/* v2 takes the call when its grid fits: at most 65535 query rows and splits (v1 takes the rest) */
static int quant2_fits(const kvb_attn_args *a, const quant_args &p) {
    if (p.Gq > Q2_GQ_MAX || a->n_q > 65535) return 0;
    const int64_t split = quant2_split(a, p);
    return (p.n + split - 1) / split <= 65535;
}

static int attention_quant2(cuda_kvops *o, const kvb_attn_args *a, const quant_args &p, const quant_heads &qh, char *err,
                            size_t err_len) {
    const int64_t split = quant2_split(a, p), n_split = (p.n + split - 1) / split;
    const size_t rows = (size_t)a->n_q * a->n_head * n_split;
    uint8_t *scratch = (uint8_t *)cuda_kvops_scratch(o, rows * (sizeof(float) + sizeof(double) + (size_t)p.D * sizeof(float)));
    if (!scratch) return cuda_kvops_failed(o, err, err_len);
    double *part_l = (double *)scratch;
    float *part_m = (float *)(part_l + rows), *part_acc = part_m + rows;
    k_attention_quant2<<<dim3((unsigned)n_split, (unsigned)a->n_head_kv, (unsigned)a->n_q), Q2_THREADS, 0, o->stream>>>(
        p, qh, split, part_m, part_l, part_acc, (int)n_split);
    if (CK_LAUNCH(k_attention_quant2)) return cuda_kvops_failed(o, err, err_len);
    k_quant_merge<<<(unsigned)(a->n_q * a->n_head), 128, 0, o->stream>>>(p, part_m, part_l, part_acc, (int)n_split);
    return CK_LAUNCH(k_quant_merge) ? cuda_kvops_failed(o, err, err_len) : 0;
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
    if (kvb_cuda_quant_kernel() == 2 && quant2_fits(a, p)) return attention_quant2(o, a, p, qh, err, err_len);
    k_attention_quant<<<(unsigned)(a->n_q * a->n_head), ATTN_THREADS, 0, o->stream>>>(p, qh);
    return CK_LAUNCH(k_attention_quant) ? cuda_kvops_failed(o, err, err_len) : 0;
}

void cuda_install_kvquant_ops(kvb_backend *be) {
    be->quant_groups = cu_quant_groups;
    be->attention_quant = cu_attention_quant;
}
