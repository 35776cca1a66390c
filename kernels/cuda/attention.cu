/* attention.cu — CUDA attention over the KV store (kernels/cuda/attention.h).
 *
 * One kernel family for decode and prefill: a block takes (KV head, split of the key list, chunk of up to RMAX
 * rows), where a row is a (query, head of the GQA group) pair, so each K/V row is read once per block for all
 * the rows it serves. Splits (flash-decoding) fill the GPU when there are few rows; their partial (m, l, acc)
 * are merged by log-sum-exp in k_attn_merge, which also writes lse. f16 K/V with head_dim 64 or 128 take the
 * tiled path (k_attn_tile); other shapes and f32 K/V the generic one (k_attn_split). Probabilities, when asked
 * for, are a second pass against lse (k_probs_simple). Prefill runs through the same blocks (rows = queries x
 * group); it is correct but slow at long contexts: tensor-core tiling is the next step. */
#include <cuda_fp16.h>
#include <cuda_pipeline.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/attn_decode.h"
#include "kernels/cuda/attn_prefill.h"
#include "kernels/cuda/attn_split.cuh"
#include "kernels/cuda/candidate.h"
#include "kernels/cuda/flashinfer.h"


__device__ __forceinline__ float load_kv(const void *base, int f16, int64_t i) {
    return f16 ? __half2float(((const __half *)base)[i]) : ((const float *)base)[i];
}

/* a lane's E (2 or 4) consecutive halves as floats, in one 4- or 8-byte load */
template <int E>
__device__ __forceinline__ void lane_halves(float (&f)[E], const __half *p) {
    if (E == 4) {
        const uint2 raw = *(const uint2 *)p;
        const float2 a = __half22float2(*(const __half2 *)&raw.x), b = __half22float2(*(const __half2 *)&raw.y);
        f[0] = a.x; f[1] = a.y; f[2 % E] = b.x; f[3 % E] = b.y;
    } else {
        const float2 a = __half22float2(*(const __half2 *)p);
        f[0] = a.x; f[1 % E] = a.y;
    }
}

/* probabilities: exp(s - lse) per list entry; needs lse (kept in the workspace when the caller gave none) */
__global__ void k_probs_simple(kvb_cuda_attn a, const float *lse) {
    const int64_t t = blockIdx.x;
    const int h = blockIdx.y;
    const int G = a.n_head / a.n_head_kv, g = h / G, D = a.head_dim;
    const void *K = a.k[g];
    const int32_t *kp = a.k_pos ? a.k_pos[g] : NULL;
    const int32_t *ix = a.idx ? a.idx[g] : NULL;
    const int64_t len = ix ? a.n_idx[g] : a.n_kv[g];
    const int32_t qp = a.q_pos ? a.q_pos[t] : 0;
    const float *q = a.q + (t * a.n_head + h) * (int64_t)D;
    const float L = lse[(int64_t)h * a.n_q + t];
    float *pr = a.probs + ((int64_t)h * a.n_q + t) * a.probs_stride;
    for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
        const int64_t slot = ix ? ix[j] : j;
        if ((a.q_pos && kp && key_hidden(kp[slot], qp, a.window)) || L == -INFINITY) { pr[j] = 0.f; continue; }
        float s = 0.f;
        for (int d = 0; d < D; d++) s += q[d] * load_kv(K, a.kv_f16, slot * D + d);
        pr[j] = expf(s * a.scale - L);
    }
}

/* v2 of the probabilities (candidate, KVB_PROBS_KERNEL=2; f16 K, head_dim 64/128, GQA groups up to PROBS_GMAX):
 * a block takes one KV head, one query and a chunk of PROBS_CHUNK list entries, so decode fills the GPU; a
 * warp reads each K row once, coalesced, for all G query heads of the group (warp-reduced dots), and takes 32
 * consecutive entries at a time so that lane i writes entry i: coalesced stores. The dot's summation order
 * differs from k_probs_simple's (float rounding). */
enum { PROBS_WARPS = 8, PROBS_CHUNK = 2048, PROBS_GMAX = 8 };

template <int E>
__global__ void __launch_bounds__(PROBS_WARPS * 32) k_probs_warp(kvb_cuda_attn a, const float *lse) {
    constexpr int D = 32 * E;
    const int g = blockIdx.x, G = a.n_head / a.n_head_kv;
    const int64_t t = blockIdx.y, c0 = (int64_t)blockIdx.z * PROBS_CHUNK;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const __half *K = (const __half *)a.k[g];
    const int32_t *kp = (a.q_pos && a.k_pos) ? a.k_pos[g] : NULL;
    const int32_t *ix = a.idx ? a.idx[g] : NULL;
    const int64_t len = ix ? a.n_idx[g] : a.n_kv[g];
    const int64_t c1 = c0 + PROBS_CHUNK < len ? c0 + PROBS_CHUNK : len;
    const int32_t qp = a.q_pos ? a.q_pos[t] : 0;
    float q[PROBS_GMAX][E], L[PROBS_GMAX];
#pragma unroll
    for (int r = 0; r < PROBS_GMAX; r++) {
        const int h = g * G + (r < G ? r : 0);
        const float *qr = a.q + (t * a.n_head + h) * (int64_t)D + lane * E;
#pragma unroll
        for (int e = 0; e < E; e++) q[r][e] = r < G ? qr[e] * a.scale : 0.f;
        L[r] = r < G ? lse[(int64_t)h * a.n_q + t] : 0.f;
    }
    for (int64_t base = c0 + (int64_t)warp * 32; base < c1; base += (int64_t)PROBS_WARPS * 32) {
        float mine[PROBS_GMAX];
#pragma unroll
        for (int r = 0; r < PROBS_GMAX; r++) mine[r] = 0.f;
        const int n = c1 - base < 32 ? (int)(c1 - base) : 32;
        int64_t my_slot = 0;
        bool my_masked = true;
        if (lane < n) {
            my_slot = ix ? ix[base + lane] : base + lane;
            my_masked = kp && key_hidden(kp[my_slot], qp, a.window);
        }
        for (int i = 0; i < n; i++) {
            const int64_t slot = __shfl_sync(0xffffffffu, my_slot, i);
            float kf[E];
            lane_halves<E>(kf, K + slot * D + lane * E);
#pragma unroll
            for (int r = 0; r < PROBS_GMAX; r++) {
                if (r >= G) break;
                float s = 0.f;
#pragma unroll
                for (int e = 0; e < E; e++) s += q[r][e] * kf[e];
#pragma unroll
                for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
                if (lane == i) mine[r] = s;
            }
        }
        if (lane < n)
#pragma unroll
            for (int r = 0; r < PROBS_GMAX; r++) {
                if (r >= G) break;
                float *pr = a.probs + ((int64_t)(g * G + r) * a.n_q + t) * a.probs_stride;
                pr[base + lane] = my_masked || L[r] == -INFINITY ? 0.f : expf(mine[r] - L[r]);
            }
    }
}

static int g_probs_kernel; /* 0 = not chosen yet */

extern "C" void kvb_cuda_attention_set_probs_kernel(int k) { g_probs_kernel = k == 2 ? 2 : 1; }

/* v2 by default since the H200 run of 2026-11-26 that found v1 behind OmniKV's slow decode (synthetic:llama3.1-8b at
 * 32K, budget 2048: 17.20 ms/token with v1, 10.56 with v2, full 10.50; v1 takes one block a query head over the
 * whole list); test_cuda_ops holds both to float64. KVB_PROBS_KERNEL=1 takes v1 (kept as the reference, and the
 * path where v2 does not apply: f32 K/V, head_dim other than 64/128, groups over 8) */
static int probs_kernel(void) { return kvb_switch_pick(&g_probs_kernel, "KVB_PROBS_KERNEL", 2, 2); }

extern "C" int kvb_cuda_attention_probs_kernel(void) { return probs_kernel(); }


/* ---- split-KV decode (and chunked prefill): a block = (KV head, split of the list, chunk of <= RMAX rows)
 * where rows are (query, head of the GQA group) pairs, so each K/V row is read once per block for all of them.
 * Warps take keys in turn; a lane holds head_dim/32 contiguous elements (coalesced 8-byte loads for d=128). */
enum { DWARPS = 4 };

template <int E, int F16>
__global__ void __launch_bounds__(DWARPS * 32) k_attn_split(kvb_cuda_attn a, int n_split, int n_rows, float *part) {
    const int g = blockIdx.x, split = blockIdx.y, chunk = blockIdx.z;
    const int G = a.n_head / a.n_head_kv, D = a.head_dim;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const void *K = a.k[g], *V = a.v[g];
    const block_span sp = span_of(a, g, split, chunk, n_split, n_rows);
    const int32_t *kp = sp.kp, *ix = sp.ix;
    const int64_t j0 = sp.j0, j1 = sp.j1;
    const int row0 = sp.row0, R = sp.R;
    /* rows r = row0 + i: query t = r / G, head h = g * G + r % G */
    float qv[RMAX][E], acc[RMAX][E], m[RMAX], l[RMAX];
    int32_t qp[RMAX];
#pragma unroll
    for (int i = 0; i < RMAX; i++) {
        const int r = row0 + (i < R ? i : 0);
        const int64_t t = r / G;
        const int h = g * G + r % G;
        const float *q = a.q + (t * a.n_head + h) * (int64_t)D;
#pragma unroll
        for (int e = 0; e < E; e++) {
            const int d = lane * E + e;
            qv[i][e] = (i < R && d < D) ? q[d] * a.scale : 0.f;
            acc[i][e] = 0.f;
        }
        m[i] = -INFINITY;
        l[i] = 0.f;
        qp[i] = a.q_pos ? a.q_pos[t] : 0;
    }
    /* U keys per warp per step, all loads issued before the math (several rows in flight per warp) */
    constexpr int U = E >= 8 ? 2 : 4;
    for (int64_t jb = j0 + (int64_t)warp * U; jb < j1; jb += (int64_t)DWARPS * U) {
        float kf[U][E], vf[U][E];
        int32_t pos[U];
        bool ok[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t j = jb + u;
            ok[u] = j < j1;
            const int64_t slot = ok[u] ? (ix ? ix[j] : j) : 0;
            pos[u] = (kp && ok[u]) ? kp[slot] : 0;
            const int64_t base = slot * D + lane * E;
            if (F16 && E % 4 == 0 && (D == 32 * E)) {
#pragma unroll
                for (int e = 0; e < E; e += 4) {
                    uint2 kr = make_uint2(0, 0), vr = make_uint2(0, 0);
                    if (ok[u]) {
                        kr = __ldg((const uint2 *)((const __half *)K + base + e));
                        vr = __ldg((const uint2 *)((const __half *)V + base + e));
                    }
                    float2 k0 = __half22float2(*(__half2 *)&kr.x), k1 = __half22float2(*(__half2 *)&kr.y);
                    float2 v0 = __half22float2(*(__half2 *)&vr.x), v1 = __half22float2(*(__half2 *)&vr.y);
                    kf[u][e] = k0.x; kf[u][e + 1] = k0.y; kf[u][e + 2] = k1.x; kf[u][e + 3] = k1.y;
                    vf[u][e] = v0.x; vf[u][e + 1] = v0.y; vf[u][e + 2] = v1.x; vf[u][e + 3] = v1.y;
                }
            } else {
#pragma unroll
                for (int e = 0; e < E; e++) {
                    const int d = lane * E + e;
                    kf[u][e] = (ok[u] && d < D) ? load_kv(K, F16, base + e) : 0.f;
                    vf[u][e] = (ok[u] && d < D) ? load_kv(V, F16, base + e) : 0.f;
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (!ok[u]) break;
#pragma unroll
            for (int i = 0; i < RMAX; i++) {
                if (i >= R) break;
                float s = 0.f;
#pragma unroll
                for (int e = 0; e < E; e++) s += qv[i][e] * kf[u][e];
#pragma unroll
                for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
                if (kp && key_hidden(pos[u], qp[i], a.window)) continue;
                const float mn = fmaxf(m[i], s), c = __expf(m[i] - mn), p = __expf(s - mn);
                l[i] = l[i] * c + p;
#pragma unroll
                for (int e = 0; e < E; e++) acc[i][e] = acc[i][e] * c + p * vf[u][e];
                m[i] = mn;
            }
        }
    }
    /* merge the warps, write this split's partial (m, l, acc[D]) per row */
    __shared__ float sm[DWARPS][RMAX], sl[DWARPS][RMAX];
    extern __shared__ float sacc[]; /* [DWARPS][RMAX][32 * E] */
    if (lane == 0)
        for (int i = 0; i < RMAX; i++) { sm[warp][i] = m[i]; sl[warp][i] = l[i]; }
    for (int i = 0; i < RMAX; i++)
        for (int e = 0; e < E; e++) sacc[(warp * RMAX + i) * 32 * E + lane * E + e] = acc[i][e];
    __syncthreads();
    for (int i = warp; i < R; i += DWARPS) {
        float M = -INFINITY;
        for (int w = 0; w < DWARPS; w++) M = fmaxf(M, sm[w][i]);
        float L = 0.f;
        for (int w = 0; w < DWARPS; w++) L += sm[w][i] == -INFINITY ? 0.f : sl[w][i] * __expf(sm[w][i] - M);
        float *dst = partial_of(part, g, (int)gridDim.z, chunk, i, n_split, split, D);
        for (int d = lane; d < D; d += 32) {
            float o = 0.f;
            for (int w = 0; w < DWARPS; w++)
                o += sm[w][i] == -INFINITY ? 0.f : sacc[(w * RMAX + i) * 32 * E + d] * __expf(sm[w][i] - M);
            dst[2 + d] = o;
        }
        if (lane == 0) { dst[0] = M; dst[1] = L; }
    }
}

/* ---- the fast decode path (f16 K/V, head_dim 64 or 128): a warp takes 32 keys at a time, stages their K rows
 * in shared memory with coalesced 16-byte loads (row stride padded so a quarter-warp's 16-byte reads hit
 * distinct banks), each lane scores one key for every row of the block, one warp max per tile updates the
 * online softmax, and the P.V pass reads each V row once per warp, coalesced, each lane owning E dims.
 * Two kernels share the steps below: k_attn_tile loads a tile through registers; k_attn_tile2 (v2)
 * double-buffers each warp's tiles in shared memory with asynchronous copies, so the next tile streams in while
 * the current one is scored. Same arithmetic in the same order: the same results, bit for bit. */

/* the block's query rows, pre-scaled, into qs [RMAX][D] (zeros past R) */
template <int E>
__device__ __forceinline__ void stage_q(float *qs, const kvb_cuda_attn &a, int g, int G, int row0, int R) {
    constexpr int D = 32 * E;
    for (int x = threadIdx.x; x < RMAX * D; x += blockDim.x) {
        const int i = x / D, d = x % D;
        float v = 0.f;
        if (i < R) {
            const int r = row0 + i;
            v = a.q[((int64_t)(r / G) * a.n_head + g * G + r % G) * D + d] * a.scale;
        }
        qs[x] = v;
    }
}

/* one tile of n <= 32 keys (K rows Kw, V rows Vw in shared memory, this lane's key at position my_pos) folded
 * into the rows' online softmax (m, l per lane share, acc) */
template <int E>
__device__ __forceinline__ void fold_tile(const __half *Kw, const __half *Vw, float *Pw, const float *qs, int n, int R,
                                          int lane, const int32_t *kp, int32_t my_pos, const int32_t (&qp)[RMAX],
                                          int32_t window, float (&m)[RMAX], float (&l)[RMAX], float (&acc)[RMAX][E]) {
    constexpr int D = 32 * E, KS = D + 8, CH = D / 8;
    float s[RMAX];
#pragma unroll
    for (int i = 0; i < RMAX; i++) s[i] = 0.f;
#pragma unroll
    for (int cc = 0; cc < CH; cc++) {
        uint4 kr = *(const uint4 *)(Kw + lane * KS + cc * 8);
        const __half2 *h2 = (const __half2 *)&kr;
        float2 f0 = __half22float2(h2[0]), f1 = __half22float2(h2[1]), f2 = __half22float2(h2[2]),
               f3 = __half22float2(h2[3]);
#pragma unroll
        for (int i = 0; i < RMAX; i++) {
            if (i >= R) break;
            const float4 a0 = *(const float4 *)(qs + i * D + cc * 8), a1 = *(const float4 *)(qs + i * D + cc * 8 + 4);
            s[i] += a0.x * f0.x + a0.y * f0.y + a0.z * f1.x + a0.w * f1.y + a1.x * f2.x + a1.y * f2.y + a1.z * f3.x +
                    a1.w * f3.y;
        }
    }
#pragma unroll
    for (int i = 0; i < RMAX; i++) {
        if (i >= R) break;
        const bool vis = lane < n && !(kp && key_hidden(my_pos, qp[i], window));
        const float si = vis ? s[i] : -INFINITY;
        float tm = si;
#pragma unroll
        for (int o = 16; o; o >>= 1) tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, o));
        const float mn = fmaxf(m[i], tm);
        const float c = m[i] == -INFINITY ? 0.f : __expf(m[i] - mn);
        const float p = si == -INFINITY ? 0.f : __expf(si - mn);
        l[i] = l[i] * c + p; /* this lane's share; summed over the warp at the end */
#pragma unroll
        for (int e = 0; e < E; e++) acc[i][e] *= c;
        m[i] = mn;
        Pw[i * 32 + lane] = p;
    }
    __syncwarp();
#pragma unroll 8
    for (int k = 0; k < n; k++) {
        float vf[E];
        lane_halves<E>(vf, Vw + k * KS + lane * E);
#pragma unroll
        for (int i = 0; i < RMAX; i++) {
            if (i >= R) break;
            const float p = Pw[i * 32 + k];
#pragma unroll
            for (int e = 0; e < E; e++) acc[i][e] += p * vf[e];
        }
    }
    __syncwarp();
}

/* after the tiles: the warps' (m, l, acc) merged through shared memory (the tiles' space, free again) into this
 * split's partial (m, l, acc[D]) per row */
template <int E>
__device__ __forceinline__ void write_partials(unsigned char *smem, const block_span &sp, int g, int split,
                                               int n_split, float *part, int warp, int lane, const float (&m)[RMAX],
                                               float (&l)[RMAX], const float (&acc)[RMAX][E]) {
    constexpr int D = 32 * E;
#pragma unroll
    for (int i = 0; i < RMAX; i++)
#pragma unroll
        for (int o = 16; o; o >>= 1) l[i] += __shfl_xor_sync(0xffffffffu, l[i], o);
    __syncthreads();
    float *sm = (float *)smem, *sl = sm + DWARPS * RMAX, *sacc = sl + DWARPS * RMAX; /* sacc [DWARPS][RMAX][D] */
    if (lane == 0)
        for (int i = 0; i < RMAX; i++) { sm[warp * RMAX + i] = m[i]; sl[warp * RMAX + i] = l[i]; }
#pragma unroll
    for (int i = 0; i < RMAX; i++)
#pragma unroll
        for (int e = 0; e < E; e++) sacc[(warp * RMAX + i) * D + lane * E + e] = acc[i][e];
    __syncthreads();
    const int chunk = blockIdx.z;
    for (int i = warp; i < sp.R; i += DWARPS) {
        float M = -INFINITY;
        for (int w = 0; w < DWARPS; w++) M = fmaxf(M, sm[w * RMAX + i]);
        float L = 0.f;
        for (int w = 0; w < DWARPS; w++) L += sm[w * RMAX + i] == -INFINITY ? 0.f : sl[w * RMAX + i] * __expf(sm[w * RMAX + i] - M);
        float *dst = partial_of(part, g, (int)gridDim.z, chunk, i, n_split, split, D);
        for (int d = lane; d < D; d += 32) {
            float o = 0.f;
            for (int w = 0; w < DWARPS; w++)
                o += sm[w * RMAX + i] == -INFINITY ? 0.f : sacc[(w * RMAX + i) * D + d] * __expf(sm[w * RMAX + i] - M);
            dst[2 + d] = o;
        }
        if (lane == 0) { dst[0] = M; dst[1] = L; }
    }
}

/* the rows' positions and an empty online softmax */
template <int E>
__device__ __forceinline__ void init_rows(const kvb_cuda_attn &a, int row0, int R, int G, int32_t (&qp)[RMAX],
                                          float (&m)[RMAX], float (&l)[RMAX], float (&acc)[RMAX][E]) {
#pragma unroll
    for (int i = 0; i < RMAX; i++) {
        qp[i] = (a.q_pos && i < R) ? a.q_pos[(row0 + i) / G] : 0;
        m[i] = -INFINITY;
        l[i] = 0.f;
#pragma unroll
        for (int e = 0; e < E; e++) acc[i][e] = 0.f;
    }
}

/* n keys of the tile from list entry t0: this lane's slot and position */
__device__ __forceinline__ int64_t tile_slot(const int32_t *ix, const int32_t *kp, int64_t t0, int n, int lane,
                                             int32_t *pos) {
    int64_t slot = 0;
    *pos = 0;
    if (lane < n) {
        slot = ix ? ix[t0 + lane] : t0 + lane;
        if (kp) *pos = kp[slot];
    }
    return slot;
}

__device__ __forceinline__ int tile_keys(int64_t tb, int64_t j1) { return tb < j1 ? (j1 - tb < 32 ? (int)(j1 - tb) : 32) : 0; }

template <int E>
__global__ void __launch_bounds__(DWARPS * 32) k_attn_tile(kvb_cuda_attn a, int n_split, int n_rows, float *part) {
    constexpr int D = 32 * E, KS = D + 8, CH = D / 8;
    extern __shared__ __align__(16) unsigned char smem[];
    __half *Ks = (__half *)smem;                                        /* [DWARPS][32][KS] */
    __half *Vs = Ks + DWARPS * 32 * KS;                                 /* [DWARPS][32][KS] */
    float *qs = (float *)(smem + 2 * DWARPS * 32 * KS * sizeof(__half)); /* [RMAX][D] */
    float *Ps = qs + RMAX * D;                                          /* [DWARPS][RMAX][32] */
    int64_t *slots = (int64_t *)(Ps + DWARPS * RMAX * 32);              /* [DWARPS][32] */
    const int g = blockIdx.x, split = blockIdx.y, chunk = blockIdx.z;
    const int G = a.n_head / a.n_head_kv;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const __half *K = (const __half *)a.k[g], *V = (const __half *)a.v[g];
    const block_span sp = span_of(a, g, split, chunk, n_split, n_rows);
    stage_q<E>(qs, a, g, G, sp.row0, sp.R);
    int32_t qp[RMAX];
    float m[RMAX], l[RMAX], acc[RMAX][E];
    init_rows<E>(a, sp.row0, sp.R, G, qp, m, l, acc);
    __syncthreads();
    __half *Kw = Ks + warp * 32 * KS, *Vw = Vs + warp * 32 * KS;
    float *Pw = Ps + warp * RMAX * 32;
    int64_t *Sw = slots + warp * 32;
    for (int64_t tb = sp.j0 + (int64_t)warp * 32; tb < sp.j1; tb += (int64_t)DWARPS * 32) {
        const int n = tile_keys(tb, sp.j1);
        int32_t my_pos;
        Sw[lane] = tile_slot(sp.ix, sp.kp, tb, n, lane, &my_pos);
        __syncwarp();
        /* the tile's K and V rows in one burst of 16-byte loads (all in flight before the first store) */
        uint4 kb[CH], vb[CH];
#pragma unroll
        for (int c = 0; c < CH; c++) {
            const int x = lane + 32 * c, r = x / CH, cc = x % CH;
            kb[c] = vb[c] = make_uint4(0, 0, 0, 0);
            if (r < n) {
                kb[c] = __ldg((const uint4 *)(K + Sw[r] * D) + cc);
                vb[c] = __ldg((const uint4 *)(V + Sw[r] * D) + cc);
            }
        }
#pragma unroll
        for (int c = 0; c < CH; c++) {
            const int x = lane + 32 * c, r = x / CH, cc = x % CH;
            *(uint4 *)(Kw + r * KS + cc * 8) = kb[c];
            *(uint4 *)(Vw + r * KS + cc * 8) = vb[c];
        }
        __syncwarp();
        fold_tile<E>(Kw, Vw, Pw, qs, n, sp.R, lane, sp.kp, my_pos, qp, a.window, m, l, acc);
    }
    write_partials<E>(smem, sp, g, split, n_split, part, warp, lane, m, l, acc);
}

/* v2: n keys from list entry t0 copied asynchronously into a tile buffer (Kd, Vd); rows past n are not loaded
 * (their lanes are masked, their V rows never read). Returns this lane's key position. */
template <int E>
__device__ __forceinline__ int32_t issue_tile(__half *Kd, __half *Vd, const __half *K, const __half *V,
                                              const int32_t *ix, const int32_t *kp, int64_t t0, int n, int lane) {
    constexpr int D = 32 * E, KS = D + 8, CH = D / 8;
    int32_t my_pos;
    const int64_t my_slot = tile_slot(ix, kp, t0, n, lane, &my_pos);
#pragma unroll
    for (int c = 0; c < CH; c++) {
        const int x = lane + 32 * c, r = x / CH, cc = x % CH;
        const int64_t slot = __shfl_sync(0xffffffffu, my_slot, r);
        if (r < n) {
            __pipeline_memcpy_async(Kd + r * KS + cc * 8, (const uint4 *)(K + slot * D) + cc, 16);
            __pipeline_memcpy_async(Vd + r * KS + cc * 8, (const uint4 *)(V + slot * D) + cc, 16);
        }
    }
    __pipeline_commit();
    return my_pos;
}

template <int E>
__global__ void __launch_bounds__(DWARPS * 32) k_attn_tile2(kvb_cuda_attn a, int n_split, int n_rows, float *part) {
    constexpr int D = 32 * E, KS = D + 8, TILE = 32 * KS; /* halves per K (or V) tile */
    extern __shared__ __align__(16) unsigned char smem[];
    __half *Ts = (__half *)smem;                                      /* [DWARPS][2 buffers][K, V][32][KS] */
    float *qs = (float *)(smem + 4 * DWARPS * TILE * sizeof(__half)); /* [RMAX][D] */
    float *Ps = qs + RMAX * D;                                        /* [DWARPS][RMAX][32] */
    const int g = blockIdx.x, split = blockIdx.y, chunk = blockIdx.z;
    const int G = a.n_head / a.n_head_kv;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const __half *K = (const __half *)a.k[g], *V = (const __half *)a.v[g];
    const block_span sp = span_of(a, g, split, chunk, n_split, n_rows);
    __half *Tw = Ts + warp * 4 * TILE;
    float *Pw = Ps + warp * RMAX * 32;
    const int64_t step = (int64_t)DWARPS * 32;
    int64_t tb = sp.j0 + (int64_t)warp * 32;
    int n = tile_keys(tb, sp.j1), buf = 0;
    int32_t my_pos = n > 0 ? issue_tile<E>(Tw, Tw + TILE, K, V, sp.ix, sp.kp, tb, n, lane) : 0; /* before q */
    stage_q<E>(qs, a, g, G, sp.row0, sp.R);
    int32_t qp[RMAX];
    float m[RMAX], l[RMAX], acc[RMAX][E];
    init_rows<E>(a, sp.row0, sp.R, G, qp, m, l, acc);
    __syncthreads();
    while (n > 0) {
        const int64_t tn = tb + step;
        const int n_next = tile_keys(tn, sp.j1);
        __half *Kn = Tw + (buf ^ 1) * 2 * TILE;
        int32_t pos_next = 0;
        if (n_next > 0) {
            pos_next = issue_tile<E>(Kn, Kn + TILE, K, V, sp.ix, sp.kp, tn, n_next, lane);
            __pipeline_wait_prior(1); /* this tile's copies have landed; the next tile's are in flight */
        } else {
            __pipeline_wait_prior(0);
        }
        __syncwarp();
        const __half *Kw = Tw + buf * 2 * TILE;
        fold_tile<E>(Kw, Kw + TILE, Pw, qs, n, sp.R, lane, sp.kp, my_pos, qp, a.window, m, l, acc); /* ends with a syncwarp */
        tb = tn;
        n = n_next;
        my_pos = pos_next;
        buf ^= 1;
    }
    write_partials<E>(smem, sp, g, split, n_split, part, warp, lane, m, l, acc);
}

template <int E> static size_t tile2_smem(void) {
    constexpr int D = 32 * E, KS = D + 8;
    return (size_t)4 * DWARPS * 32 * KS * 2 + (size_t)RMAX * D * 4 + (size_t)DWARPS * RMAX * 32 * 4;
}

template <int E> static size_t tile_smem(void) {
    constexpr int D = 32 * E, KS = D + 8;
    return (size_t)2 * DWARPS * 32 * KS * 2 + (size_t)RMAX * D * 4 + (size_t)DWARPS * RMAX * 32 * 4 + DWARPS * 32 * 8;
}

/* ---- v3 (KVB_ATTN_KERNEL=3): registers only, for bandwidth. A block = (KV head, split, chunk of rows) as above.
 * A key is read by LPK = D/8 lanes, each holding 8 contiguous dims of its K and V rows (one 16-byte load each,
 * straight to registers; U keys per lane in flight); the LPK lanes sum their partial dot products by shuffles,
 * and each lane keeps its group's online softmax (m, l) and its 8 dims of acc for each of the RC rows, one
 * rescale per U keys. At the end the groups of a warp merge by shuffles and the warps through shared memory
 * into the split's partial, in the layout k_attn_merge reads. No shared-memory staging of K or V, so the only
 * limit on the bytes in flight is registers. */
enum { V3_WARPS = 4 };
extern "C" int kvb_cuda_sm_count(void) {
    static int sms;
    if (!sms) {
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
            sms <= 0)
            sms = 1;
    }
    return sms;
}

/* WIN: a sliding-window layer's mask (a.window > 0); a template switch so that the causal instantiations keep their
 * registers (a runtime test reshuffled them: 244 -> 168 for d = 128, 4 rows) */
template <int D, int RC, int U, bool WIN>
__global__ void __launch_bounds__(V3_WARPS * 32) k_attn_dec(kvb_cuda_attn a, int n_split, int n_rows, float *part) {
    constexpr int LPK = D / 8, KPW = 32 / LPK;
    __shared__ float sm[V3_WARPS][RC], sl[V3_WARPS][RC], sacc[V3_WARPS][RC][D];
    const int g = blockIdx.x, split = blockIdx.y, chunk = blockIdx.z;
    const int G = a.n_head / a.n_head_kv;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, grp = lane / LPK, sub = lane % LPK;
    const __half *K = (const __half *)a.k[g], *V = (const __half *)a.v[g];
    const block_span sp = span_of(a, g, split, chunk, n_split, n_rows);
    float q[RC][8], m[RC], l[RC], acc[RC][8];
    int32_t qp[RC];
#pragma unroll
    for (int i = 0; i < RC; i++) {
        const int r = sp.row0 + i;
        m[i] = -INFINITY;
        l[i] = 0.f;
        qp[i] = 0;
#pragma unroll
        for (int e = 0; e < 8; e++) q[i][e] = 0.f, acc[i][e] = 0.f;
        if (i < sp.R) {
            const float *qr = a.q + ((int64_t)(r / G) * a.n_head + g * G + r % G) * D + sub * 8;
#pragma unroll
            for (int e = 0; e < 8; e++) q[i][e] = qr[e] * a.scale;
            if (a.q_pos) qp[i] = a.q_pos[r / G];
        }
    }
    const int64_t step = (int64_t)V3_WARPS * U * KPW;
    for (int64_t t0 = sp.j0 + (int64_t)warp * U * KPW; t0 < sp.j1; t0 += step) {
        int64_t slot[U];
        int32_t kpos[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t j = t0 + u * KPW + grp;
            slot[u] = j < sp.j1 ? (sp.ix ? (int64_t)sp.ix[j] : j) : -1;
        }
        uint4 kr[U], vr[U];
#pragma unroll
        for (int u = 0; u < U; u++) { /* every load of the pass issued before the first use */
            kr[u] = vr[u] = make_uint4(0, 0, 0, 0);
            kpos[u] = 0;
            if (slot[u] >= 0) {
                kr[u] = __ldg((const uint4 *)(K + slot[u] * D + sub * 8));
                vr[u] = __ldg((const uint4 *)(V + slot[u] * D + sub * 8));
                if (sp.kp) kpos[u] = sp.kp[slot[u]];
            }
        }
        float s[U][RC];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const __half2 *h2 = (const __half2 *)&kr[u];
            float kf[8];
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const float2 f = __half22float2(h2[c]);
                kf[2 * c] = f.x, kf[2 * c + 1] = f.y;
            }
#pragma unroll
            for (int i = 0; i < RC; i++) {
                float d = 0.f;
#pragma unroll
                for (int e = 0; e < 8; e++) d += q[i][e] * kf[e];
#pragma unroll
                for (int o = LPK / 2; o; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
                s[u][i] = d;
            }
        }
#pragma unroll
        for (int i = 0; i < RC; i++) {
            float mx = m[i];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const bool vis = slot[u] >= 0 && !(sp.kp && (WIN ? key_hidden_win(kpos[u], qp[i], a.window) : kpos[u] > qp[i]));
                s[u][i] = vis ? s[u][i] : -INFINITY;
                mx = fmaxf(mx, s[u][i]);
            }
            if (mx == -INFINITY) continue; /* nothing visible to this row yet */
            const float c = __expf(m[i] - mx); /* 0 when m was -inf */
            l[i] *= c;
#pragma unroll
            for (int e = 0; e < 8; e++) acc[i][e] *= c;
#pragma unroll
            for (int u = 0; u < U; u++) {
                const float p = s[u][i] == -INFINITY ? 0.f : __expf(s[u][i] - mx);
                l[i] += p;
                const __half2 *h2 = (const __half2 *)&vr[u];
#pragma unroll
                for (int cc = 0; cc < 4; cc++) {
                    const float2 f = __half22float2(h2[cc]);
                    acc[i][2 * cc] += p * f.x;
                    acc[i][2 * cc + 1] += p * f.y;
                }
            }
            m[i] = mx;
        }
    }
    /* the warp's key groups (lanes sub, sub + LPK, ...) merged by shuffles */
#pragma unroll
    for (int o = LPK; o < 32; o <<= 1)
#pragma unroll
        for (int i = 0; i < RC; i++) {
            const float mo = __shfl_xor_sync(0xffffffffu, m[i], o), lo = __shfl_xor_sync(0xffffffffu, l[i], o);
            const float M = fmaxf(m[i], mo);
            const float cs = m[i] == -INFINITY ? 0.f : __expf(m[i] - M), co = mo == -INFINITY ? 0.f : __expf(mo - M);
            l[i] = l[i] * cs + lo * co;
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const float ao = __shfl_xor_sync(0xffffffffu, acc[i][e], o);
                acc[i][e] = acc[i][e] * cs + ao * co;
            }
            m[i] = M;
        }
    if (lane < LPK) {
#pragma unroll
        for (int i = 0; i < RC; i++) {
            if (lane == 0) sm[warp][i] = m[i], sl[warp][i] = l[i];
#pragma unroll
            for (int e = 0; e < 8; e++) sacc[warp][i][lane * 8 + e] = acc[i][e];
        }
    }
    __syncthreads();
    merge_warps<V3_WARPS, RC, D>(sm, sl, sacc, sp.R, partial_of(part, g, (int)gridDim.z, chunk, 0, n_split, split, D),
                                 (int64_t)n_split * (D + 2));
}

/* v3's splits: one wave (attn_split.cuh) */
template <int D, int RC, int U, bool WIN> static int dec_splits(int n_split, int blocks_per_split) {
    static const int resident = resident_blocks(k_attn_dec<D, RC, U, WIN>, V3_WARPS * 32);
    return one_wave_splits(resident, n_split, blocks_per_split);
}

/* merge the splits of each row: out = sum_s acc_s e^{m_s - M} / sum_s l_s e^{m_s - M}; lse = M + log L. A block per
 * row: its threads take the splits in parallel for M and the weights e^{m_s - M} (kept in shared memory), then each
 * warp a share of the splits (warp w: splits w, w + 8, ...), its lanes the output dimensions (coalesced rows), and
 * the warps' sums add in shared memory (plan() caps splits at 1024). The H200 runs of 2026-11-26 timed the earlier
 * form — every thread one dimension over all the splits in turn, 49 dependent loads at 32K — at 9.2 us a call at
 * batch 1, 20% of the decode attention's time there. */
enum { MERGE_THREADS = 256, MERGE_WARPS = MERGE_THREADS / 32, MERGE_MAX_SPLITS = 1024, MERGE_MAX_D = 256 };

__device__ __forceinline__ float block_reduce(float v, bool is_max, float *red) {
    for (int o = 16; o; o >>= 1) {
        const float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, w) : v + w;
    }
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    v = red[0];
    for (int w = 1; w < MERGE_THREADS / 32; w++) v = is_max ? fmaxf(v, red[w]) : v + red[w];
    __syncthreads(); /* red is reused by the next reduction */
    return v;
}

__global__ void __launch_bounds__(MERGE_THREADS) k_attn_merge(kvb_cuda_attn a, int n_split, int n_rows, int n_chunks,
                                                              const float *part) {
    __shared__ float wgt[MERGE_MAX_SPLITS], red[MERGE_WARPS];
    __shared__ float sums[MERGE_WARPS][MERGE_MAX_D];
    const int g = blockIdx.x, r = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int G = a.n_head / a.n_head_kv, D = a.head_dim, stride = D + 2;
    const int chunk = r / RMAX, i = r % RMAX;
    const float *src = part + (((int64_t)g * n_chunks + chunk) * RMAX + i) * (int64_t)n_split * stride;
    float M = -INFINITY;
    for (int s = threadIdx.x; s < n_split; s += MERGE_THREADS) M = fmaxf(M, src[(int64_t)s * stride]);
    M = block_reduce(M, true, red);
    float L = 0.f;
    for (int s = threadIdx.x; s < n_split; s += MERGE_THREADS) {
        const float ms = src[(int64_t)s * stride];
        const float w = ms == -INFINITY ? 0.f : __expf(ms - M);
        wgt[s] = w;
        L += w * src[(int64_t)s * stride + 1];
    }
    L = block_reduce(L, false, red); /* its barrier also publishes wgt */
    float o[MERGE_MAX_D / 32];
#pragma unroll
    for (int k = 0; k < MERGE_MAX_D / 32; k++) o[k] = 0.f;
#pragma unroll 2
    for (int s = warp; s < n_split; s += MERGE_WARPS) {
        const float w = wgt[s], *row = src + (int64_t)s * stride + 2;
#pragma unroll
        for (int k = 0; k < MERGE_MAX_D / 32; k++)
            if (lane + 32 * k < D) o[k] += w * row[lane + 32 * k];
    }
#pragma unroll
    for (int k = 0; k < MERGE_MAX_D / 32; k++)
        if (lane + 32 * k < D) sums[warp][lane + 32 * k] = o[k];
    __syncthreads();
    const int64_t t = r / G;
    const int h = g * G + r % G;
    float *out = a.out + (t * a.n_head + h) * (int64_t)D;
    for (int d = threadIdx.x; d < D; d += MERGE_THREADS) {
        float v = 0.f;
#pragma unroll
        for (int w = 0; w < MERGE_WARPS; w++) v += sums[w][d];
        out[d] = L > 0.f ? v / L : 0.f;
    }
    if (threadIdx.x == 0 && a.lse) a.lse[(int64_t)h * a.n_q + t] = L > 0.f ? M + logf(L) : -INFINITY;
}

static int g_kernel; /* 0 = not chosen yet */

extern "C" void kvb_cuda_attention_set_kernel(int kernel) { g_kernel = kernel >= 1 && kernel <= 5 ? kernel : 4; }

/* v4 by default since the H200 runs of 2026-11-26 (bench-attention: 1.2-1.8x v3's GB/s, 99-103% of the copy rate at
 * batch 8 from 32K; float64 checks and test_cuda_model green); KVB_ATTN_KERNEL=1, 2 or 3 takes the older kernels,
 * kept as references; 5 FlashInfer's decode and prefill where they apply (flashinfer.cu), kvbench's kernels elsewhere */
extern "C" int kvb_cuda_attention_kernel(void) { return kvb_switch_pick(&g_kernel, "KVB_ATTN_KERNEL", 5, 4); }

/* the kernel this call asks for: its own, else the switch */
static int kernel_of(const kvb_cuda_attn *a) { return a->kernel >= 1 && a->kernel <= 5 ? a->kernel : kvb_cuda_attention_kernel(); }

static void plan(const kvb_cuda_attn *a, int *n_split, int *n_rows, int *n_chunks) {
    const int G = a->n_head / a->n_head_kv;
    *n_rows = (int)(a->n_q * G);
    *n_chunks = (*n_rows + RMAX - 1) / RMAX;
    int64_t blocks = (int64_t)a->n_head_kv * *n_chunks;
    int64_t want = (4LL * kvb_cuda_sm_count() + blocks - 1) / blocks;
    int64_t cap = (a->max_len + 255) / 256;
    if (want > cap) want = cap;
    if (want < 1) want = 1;
    if (want > MERGE_MAX_SPLITS) want = MERGE_MAX_SPLITS;
    *n_split = (int)want;
}

/* the prefill path's workspace: its lse (when the caller wants probabilities without one) first, 256-byte
 * aligned, then the tile bounds (kvb_cuda_prefill_tc_ws) */
static size_t lse_bytes(const kvb_cuda_attn *a) {
    return ((size_t)a->n_head * (size_t)a->n_q * sizeof(float) + 255) & ~(size_t)255;
}

extern "C" size_t kvb_cuda_attention_ws(const kvb_cuda_attn *a) {
    if (a->n_head_kv < 1 || a->n_head % a->n_head_kv || a->n_q < 1) return 256;
    int n_split, n_rows, n_chunks;
    plan(a, &n_split, &n_rows, &n_chunks);
    size_t part = (size_t)a->n_head_kv * n_chunks * RMAX * n_split * (size_t)(a->head_dim + 2) * sizeof(float);
    const size_t lse = lse_bytes(a);
    const size_t pre = kvb_cuda_prefill_tc_ws(a) + lse; /* the prefill path: its lse, then its tile bounds */
    size_t ws = part + lse + 512 > pre ? part + lse + 512 : pre;
    if (kernel_of(a) == 5 && kvb_fi_ws(a) > ws) ws = kvb_fi_ws(a); /* FlashInfer's, or the fallback's */
    return ws;
}

/* the probabilities' second pass (when asked for: against c->lse), then the launches' verdict */
static int probs_and_check(const kvb_cuda_attn *c, cudaStream_t s, char *err, size_t err_len) {
    const int G = c->n_head / c->n_head_kv;
    const int64_t chunks = (c->max_len + PROBS_CHUNK - 1) / PROBS_CHUNK;
    if (c->probs && probs_kernel() == 2 && c->kv_f16 && (c->head_dim == 64 || c->head_dim == 128) &&
        G <= PROBS_GMAX && c->n_q <= 65535 && chunks >= 1 && chunks <= 65535) {
        const dim3 grid((unsigned)c->n_head_kv, (unsigned)c->n_q, (unsigned)chunks);
        if (c->head_dim == 64) k_probs_warp<2><<<grid, PROBS_WARPS * 32, 0, s>>>(*c, c->lse);
        else k_probs_warp<4><<<grid, PROBS_WARPS * 32, 0, s>>>(*c, c->lse);
    } else if (c->probs) {
        k_probs_simple<<<dim3((unsigned)c->n_q, (unsigned)c->n_head), 256, 0, s>>>(*c, c->lse);
    }
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        snprintf(err, err_len, "cuda attention: launch failed: %s", cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

extern "C" int kvb_cuda_attention(const kvb_cuda_attn *a, void *ws, size_t ws_bytes, void *stream, char *err,
                                  size_t err_len) {
    if (a->head_dim < 1 || a->head_dim > 256 || a->n_head_kv < 1 || a->n_head % a->n_head_kv) {
        snprintf(err, err_len, "cuda attention: unsupported shapes (head_dim %d, %d heads, %d KV heads)", a->head_dim,
                 a->n_head, a->n_head_kv);
        return -1;
    }
    if (a->probs && a->probs_stride < a->max_len) {
        snprintf(err, err_len, "cuda attention: probs_stride %lld < longest list %lld", (long long)a->probs_stride,
                 (long long)a->max_len);
        return -1;
    }
    if (ws_bytes < kvb_cuda_attention_ws(a)) {
        snprintf(err, err_len, "cuda attention: workspace too small");
        return -1;
    }
    if (a->n_q <= 0) return 0;
    cudaStream_t s = (cudaStream_t)stream;
    kvb_cuda_attn c = *a;
    if (kernel_of(a) == 5) { /* FlashInfer where its semantics are kvbench's (flashinfer_layout.h), else on below */
        const int fi = kvb_fi_attention(&c, ws, ws_bytes, s, err, err_len);
        if (fi < 0) return -1;
        if (fi == 1) return probs_and_check(&c, s, err, err_len);
        c = *a; /* refused: nothing was written; kvbench's kernels, v4 where the switch decides */
    }
    if (kvb_cuda_prefill_tc_fits(a)) { /* prefill on tensor cores; probabilities from its lse, as below */
        if (a->probs && !a->lse) c.lse = (float *)ws;
        const size_t lse = lse_bytes(a);
        if (kvb_cuda_prefill_tc(&c, (char *)ws + lse, s)) {
            snprintf(err, err_len, "cuda attention: prefill launch failed: %s", cudaGetErrorString(cudaGetLastError()));
            return -1;
        }
        return probs_and_check(&c, s, err, err_len);
    }
    int n_split, n_rows, n_chunks;
    plan(a, &n_split, &n_rows, &n_chunks);
    float *part = (float *)ws;
    size_t part_bytes = (size_t)a->n_head_kv * n_chunks * RMAX * n_split * (size_t)(a->head_dim + 2) * sizeof(float);
    if (a->probs && !a->lse) c.lse = (float *)((char *)ws + ((part_bytes + 255) & ~(size_t)255));
    if (n_chunks > 65535 || n_rows > 65535) { /* the merge's grid.y is the rows */
        snprintf(err, err_len, "cuda attention: %lld query rows per KV head exceed the grid (65535): a smaller --batch",
                 (long long)n_rows);
        return -1;
    }
    dim3 grid((unsigned)a->n_head_kv, (unsigned)n_split, (unsigned)n_chunks);
    const int D = a->head_dim;
    const int E = D <= 64 ? 2 : D <= 128 ? 4 : 8;
    const size_t shm = (size_t)DWARPS * RMAX * 32 * E * sizeof(float);
    if (a->kv_f16 && (D == 64 || D == 128)) {
        static int raised_tile;
        if (!raised_tile) { /* K and V tiles of four warps exceed the default 48 KB of dynamic shared memory */
            cudaFuncSetAttribute(k_attn_tile<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)tile_smem<2>());
            cudaFuncSetAttribute(k_attn_tile<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)tile_smem<4>());
            cudaFuncSetAttribute(k_attn_tile2<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)tile2_smem<2>());
            cudaFuncSetAttribute(k_attn_tile2<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)tile2_smem<4>());
            raised_tile = 1;
        }
        const int kern = kernel_of(a) == 5 ? 4 : kernel_of(a); /* 5 refused above: v4 */
        if (kern == 4) { /* v4, tensor cores (attn_decode.cu): its own split count, the merge told so */
            const int ns = kvb_cuda_decode_tc(&c, n_split, n_rows, n_chunks, part, s);
            k_attn_merge<<<dim3((unsigned)a->n_head_kv, (unsigned)n_rows), MERGE_THREADS, 0, s>>>(c, ns, n_rows, n_chunks, part);
            return probs_and_check(&c, s, err, err_len);
        }
        if (kern == 3) { /* v3: its own split count (one wave), the merge told so */
            const int bps = (int)a->n_head_kv * n_chunks;
            int ns;
#define DEC(DD, RR, UU, WW)                                                                                          \
    ns = dec_splits<DD, RR, UU, WW>(n_split, bps);                                                                   \
    k_attn_dec<DD, RR, UU, WW><<<dim3((unsigned)a->n_head_kv, (unsigned)ns, (unsigned)n_chunks), V3_WARPS * 32, 0, s>>>( \
        c, ns, n_rows, part)
            const bool win = c.window > 0 && c.q_pos && c.k_pos;
            if (D == 128 && n_rows <= 4) { if (win) { DEC(128, 4, 8, true); } else { DEC(128, 4, 8, false); } }
            else if (D == 128) { if (win) { DEC(128, 8, 4, true); } else { DEC(128, 8, 4, false); } }
            else if (n_rows <= 4) { if (win) { DEC(64, 4, 8, true); } else { DEC(64, 4, 8, false); } }
            else { if (win) { DEC(64, 8, 4, true); } else { DEC(64, 8, 4, false); } }
#undef DEC
            k_attn_merge<<<dim3((unsigned)a->n_head_kv, (unsigned)n_rows), MERGE_THREADS, 0, s>>>(c, ns, n_rows, n_chunks, part);
            return probs_and_check(&c, s, err, err_len);
        }
        if (kern == 2 && D == 64) k_attn_tile2<2><<<grid, DWARPS * 32, tile2_smem<2>(), s>>>(c, n_split, n_rows, part);
        else if (kern == 2) k_attn_tile2<4><<<grid, DWARPS * 32, tile2_smem<4>(), s>>>(c, n_split, n_rows, part);
        else if (D == 64) k_attn_tile<2><<<grid, DWARPS * 32, tile_smem<2>(), s>>>(c, n_split, n_rows, part);
        else k_attn_tile<4><<<grid, DWARPS * 32, tile_smem<4>(), s>>>(c, n_split, n_rows, part);
    } else if (E == 2) {
        if (a->kv_f16) k_attn_split<2, 1><<<grid, DWARPS * 32, shm, s>>>(c, n_split, n_rows, part);
        else k_attn_split<2, 0><<<grid, DWARPS * 32, shm, s>>>(c, n_split, n_rows, part);
    } else if (E == 4) {
        if (a->kv_f16) k_attn_split<4, 1><<<grid, DWARPS * 32, shm, s>>>(c, n_split, n_rows, part);
        else k_attn_split<4, 0><<<grid, DWARPS * 32, shm, s>>>(c, n_split, n_rows, part);
    } else {
        static int raised;
        if (!raised) {
            cudaFuncSetAttribute(k_attn_split<8, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024);
            cudaFuncSetAttribute(k_attn_split<8, 0>, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024);
            raised = 1;
        }
        if (a->kv_f16) k_attn_split<8, 1><<<grid, DWARPS * 32, shm, s>>>(c, n_split, n_rows, part);
        else k_attn_split<8, 0><<<grid, DWARPS * 32, shm, s>>>(c, n_split, n_rows, part);
    }
    k_attn_merge<<<dim3((unsigned)a->n_head_kv, (unsigned)n_rows), MERGE_THREADS, 0, s>>>(c, n_split, n_rows, n_chunks, part);
    return probs_and_check(&c, s, err, err_len);
}
