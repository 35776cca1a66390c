/* attn_decode.cu — decode attention v4 (KVB_ATTN_KERNEL=4): split-KV decode with both products on the tensor
 * cores (mma.sync m16n8k16, f16 inputs, f32 accumulation), the K and V rows loaded straight from global memory
 * into the fragments' registers, 16-byte loads, no shared-memory staging.
 *
 * A block = (KV head, split of the key list, chunk of <= RMAX rows) as the other split kernels (attn_split.cuh);
 * its warps take tiles of 16 keys in turn. In a warp, lane = 4 g + c:
 *  - S = Q K^T: Q is the A operand (rows g of the chunk; rows 8-15 zero), K^T the B operand of two 8-key n-tiles.
 *    A dot product does not depend on the order of the dimensions, so Q and K use the same permuted order in
 *    which lane c of key g holds 16-byte pieces 4j + c of the K row (one coalesced load each) exactly where the
 *    B fragment wants them. Q is split into f16 hi + lo parts (two mma each), so the scores are f32-accurate.
 *  - The online softmax of row g runs on the S fragment (the row's four lanes reduce its max by shuffles).
 *  - O^T += V^T P^T: V^T is the A operand (16 dims x 16 keys), P^T the B operand — exactly S's fragment, so P
 *    never leaves registers (split into hi + lo halves like Q). Lane g of a key holds 16 dims of its V row (again
 *    in a permuted order, undone when the output is written); the A fragment pairs two keys' halves with one
 *    byte permute each.
 * Against v3 (CUDA cores, 16 lanes per key and their shuffle reductions) this issues about a tenth of the
 * instructions per key, so the kernel is bound by memory, not by issue. Fragment layouts: mma.cuh. */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels/cuda/attn_decode.h"
#include "kernels/cuda/attn_split.cuh"
#include "kernels/cuda/mma.cuh"

enum { V4_WARPS = 4, V4_TILE = 16 };

/* two floats as an f16 pair (lo in the low half) and the pair of their rounding residues */
__device__ __forceinline__ void split_half2(float x0, float x1, uint32_t &hi, uint32_t &lo) {
    const __half h0 = __float2half_rn(x0), h1 = __float2half_rn(x1);
    const __half l0 = __float2half_rn(x0 - __half2float(h0)), l1 = __float2half_rn(x1 - __half2float(h1));
    hi = (uint32_t)__half_as_ushort(h0) | ((uint32_t)__half_as_ushort(h1) << 16);
    lo = (uint32_t)__half_as_ushort(l0) | ((uint32_t)__half_as_ushort(l1) << 16);
}

__device__ __forceinline__ uint32_t word_of(const uint4 &v, int w) {
    return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;
}

/* bytes at p (16-byte aligned, a multiple of 16) into L2, a hint: nothing read depends on it. Hopper: one bulk
 * prefetch; the PTX for older GPUs: a prefetch per 128-byte line */
__device__ __forceinline__ void prefetch_l2(const void *p, uint32_t bytes) {
#if __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#else
    for (uint32_t o = 0; o < bytes; o += 128) asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)p + o));
#endif
}

/* K's permuted order: k-step s of the QK product takes, from lane c, halves h = 0..3 (b0 = h 0-1, b1 = h 2-3)
 * of the physical dimension below; lane c loads 16-byte pieces 4j + c of the row, j < D/32 */
__device__ __forceinline__ int k_dim(int s, int c, int h) { return 8 * (4 * (s >> 1) + c) + 4 * (s & 1) + h; }

/* V's permuted order: lane g holds, of each V row, halves hh = 0..D/8-1 at these physical dimensions (16-byte
 * pieces 8 j + g, j < D/64: the eight lanes of a key read its row in 128 contiguous bytes a load) */
__device__ __forceinline__ int v_dim(int g, int hh) { return 8 * (8 * (hh >> 3) + g) + (hh & 7); }

/* WIN: a sliding-window layer's mask (a.window > 0), a template switch: at 168 registers (three blocks a
 * multiprocessor) the runtime test makes d = 128 spill, so the causal instantiation stays as it was and the window's
 * takes the one-compare test (key_hidden_win) */
template <int D, bool WIN, bool PF>
__global__ void __launch_bounds__(V4_WARPS * 32, 3) k_attn_dec_tc(kvb_cuda_attn a, int n_split, int n_rows, float *part,
                                                                  int pf) {
    constexpr int KS = D / 16; /* k-steps of S = Q K^T, and m-tiles (16 dims) of O^T */
    constexpr int KJ = D / 32; /* 16-byte pieces of a K row per lane */
    constexpr int VJ = D / 64; /* 16-byte pieces of a V row per lane */
    __shared__ float sm[V4_WARPS][RMAX], sl[V4_WARPS][RMAX], sacc[V4_WARPS][RMAX][D];
    const int kh = blockIdx.x, split = blockIdx.y, chunk = blockIdx.z;
    const int G = a.n_head / a.n_head_kv;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const __half *K = (const __half *)a.k[kh], *V = (const __half *)a.v[kh];
    const block_span sp = span_of(a, kh, split, chunk, n_split, n_rows);
    /* row g's query (scaled) as A fragments, hi and lo: [s][0] = a0 (cols 2c..), [s][1] = a2 (cols 8 + 2c..) */
    const bool row_ok = g < sp.R;
    uint32_t qh[KS][2], ql[KS][2];
    int32_t qp = 0;
    {
        const int r = sp.row0 + (row_ok ? g : 0);
        const float *q = a.q + ((int64_t)(r / G) * a.n_head + kh * G + r % G) * D;
        if (row_ok && a.q_pos) qp = a.q_pos[r / G];
#pragma unroll
        for (int s = 0; s < KS; s++)
#pragma unroll
            for (int w = 0; w < 2; w++) {
                const float x0 = row_ok ? q[k_dim(s, c, 2 * w)] * a.scale : 0.f;
                const float x1 = row_ok ? q[k_dim(s, c, 2 * w + 1)] * a.scale : 0.f;
                split_half2(x0, x1, qh[s][w], ql[s][w]);
            }
    }
    float m = -INFINITY, l = 0.f; /* row g's running max (equal in its four lanes) and this lane's share of the sum */
    float acc[KS][4];             /* O^T m-tile i: (dim(i, g), row 2c), (dim(i, g), 2c + 1), (dim(i, g + 8), 2c), ... */
#pragma unroll
    for (int i = 0; i < KS; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    int32_t pix = -1; /* with pf and an index list: the slot of key (lane) of the tile pf ahead, prefetched at the end */
    for (int64_t t0 = sp.j0 + (int64_t)warp * V4_TILE; t0 < sp.j1; t0 += (int64_t)V4_WARPS * V4_TILE) {
        /* the candidate prefetch (KVB_ATTN_PREFETCH, pf > 0): the K and V rows of this warp's tile pf turns ahead into
         * L2, so its loads then wait on L2 rather than DRAM. All slots: two bulk prefetches of the tile's contiguous
         * rows; an index list: its 16 slots read now, their rows prefetched after this tile's arithmetic */
        if (PF) {
            const int64_t tn = t0 + (int64_t)pf * V4_WARPS * V4_TILE;
            if (!sp.ix) {
                if (lane < 2 && tn < sp.j1) {
                    const int64_t n = sp.j1 - tn < V4_TILE ? sp.j1 - tn : V4_TILE;
                    prefetch_l2((lane ? V : K) + tn * D, (uint32_t)(n * D * sizeof(__half)));
                }
            } else {
                pix = lane < V4_TILE && tn + lane < sp.j1 ? __ldg(sp.ix + tn + lane) : -1;
            }
        }
        /* K rows this lane loads: keys g and 8 + g of the tile; V rows (and S's columns): 2c, 2c + 1, 8 + 2c, 9 + 2c */
        int64_t ks[2], vs[4];
#pragma unroll
        for (int n = 0; n < 2; n++) {
            const int64_t j = t0 + 8 * n + g;
            ks[n] = j < sp.j1 ? (sp.ix ? (int64_t)sp.ix[j] : j) : -1;
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int64_t j = t0 + 8 * (u >> 1) + 2 * c + (u & 1);
            vs[u] = j < sp.j1 ? (sp.ix ? (int64_t)sp.ix[j] : j) : -1;
        }
        uint4 kr[2][KJ], vr[4][VJ];
        int32_t kpos[4];
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int j = 0; j < KJ; j++)
                kr[n][j] = ks[n] >= 0 ? __ldg((const uint4 *)(K + ks[n] * D) + 4 * j + c) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < 4; u++) {
#pragma unroll
            for (int j = 0; j < VJ; j++)
                vr[u][j] = vs[u] >= 0 ? __ldg((const uint4 *)(V + vs[u] * D) + 8 * j + g) : make_uint4(0, 0, 0, 0);
            kpos[u] = vs[u] >= 0 && sp.kp ? sp.kp[vs[u]] : 0;
        }
        /* S = Q K^T: s[n][0..1] = row g, keys 8n + 2c, 8n + 2c + 1 (2..3: rows 8-15, unused) */
        float s[2][4];
#pragma unroll
        for (int n = 0; n < 2; n++) {
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
            for (int st = 0; st < KS; st++) {
                const uint32_t b0 = word_of(kr[n][st >> 1], 2 * (st & 1)), b1 = word_of(kr[n][st >> 1], 2 * (st & 1) + 1);
                mma_16816(s[n], qh[st][0], 0u, qh[st][1], 0u, b0, b1);
                mma_16816(s[n], ql[st][0], 0u, ql[st][1], 0u, b0, b1);
            }
        }
        /* the online softmax of row g over the tile's 16 keys (this lane holds 4 of them) */
        float sv[4], mx = -INFINITY;
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const bool vis = row_ok && vs[u] >= 0 &&
                             !(sp.kp && (WIN ? key_hidden_win(kpos[u], qp, a.window) : kpos[u] > qp));
            sv[u] = vis ? s[u >> 1][u & 1] : -INFINITY;
            mx = fmaxf(mx, sv[u]);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mn = fmaxf(m, mx);
        const float alpha = mn == -INFINITY ? 1.f : __expf(m - mn); /* 0 when m was -inf */
        float p[4];
#pragma unroll
        for (int u = 0; u < 4; u++) p[u] = sv[u] == -INFINITY ? 0.f : __expf(sv[u] - mn);
        l = l * alpha + ((p[0] + p[1]) + (p[2] + p[3]));
        m = mn;
        /* O^T's columns are rows 2c and 2c + 1, whose factors lanes 8c and 8c + 4 hold */
        const float al0 = __shfl_sync(0xffffffffu, alpha, 8 * c), al1 = __shfl_sync(0xffffffffu, alpha, 8 * c + 4);
        /* P^T as the B operand: b0 = keys 2c, 2c + 1 of row g (n-tile 0), b1 = keys 8 + 2c, 9 + 2c */
        uint32_t ph0, pl0, ph1, pl1;
        split_half2(p[0], p[1], ph0, pl0);
        split_half2(p[2], p[3], ph1, pl1);
#pragma unroll
        for (int i = 0; i < KS; i++) {
            acc[i][0] *= al0, acc[i][1] *= al1, acc[i][2] *= al0, acc[i][3] *= al1;
            /* word i of a V piece: dims (i, g) (low half) and (i, g + 8) of that key */
            const uint32_t x0 = word_of(vr[0][i >> 2], i & 3), x1 = word_of(vr[1][i >> 2], i & 3);
            const uint32_t x2 = word_of(vr[2][i >> 2], i & 3), x3 = word_of(vr[3][i >> 2], i & 3);
            const uint32_t a0 = __byte_perm(x0, x1, 0x5410), a1 = __byte_perm(x0, x1, 0x7632);
            const uint32_t a2 = __byte_perm(x2, x3, 0x5410), a3 = __byte_perm(x2, x3, 0x7632);
            mma_16816(acc[i], a0, a1, a2, a3, ph0, ph1);
            mma_16816(acc[i], a0, a1, a2, a3, pl0, pl1);
        }
        if (PF && pix >= 0) {
            prefetch_l2(K + (int64_t)pix * D, D * sizeof(__half));
            prefetch_l2(V + (int64_t)pix * D, D * sizeof(__half));
        }
    }
    /* the warp's partial into shared memory: row g's (m, l) from its lane c = 0, O in physical dimensions */
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (c == 0) sm[warp][g] = m, sl[warp][g] = l;
#pragma unroll
    for (int i = 0; i < KS; i++) {
        const int d = v_dim(g, 2 * i); /* dim (i, g); (i, g + 8) is the next one */
        sacc[warp][2 * c][d] = acc[i][0];
        sacc[warp][2 * c + 1][d] = acc[i][1];
        sacc[warp][2 * c][d + 1] = acc[i][2];
        sacc[warp][2 * c + 1][d + 1] = acc[i][3];
    }
    __syncthreads();
    merge_warps<V4_WARPS, RMAX, D>(sm, sl, sacc, sp.R, partial_of(part, kh, (int)gridDim.z, chunk, 0, n_split, split, D),
                                   (int64_t)n_split * (D + 2));
}

/* v4's splits: one wave (attn_split.cuh) */
template <int D, bool WIN, bool PF> static int v4_splits(int n_split, int blocks_per_split) {
    static const int resident = resident_blocks(k_attn_dec_tc<D, WIN, PF>, V4_WARPS * 32);
    return one_wave_splits(resident, n_split, blocks_per_split);
}

/* KVB_ATTN_PREFETCH: 0 (the default), or the tiles ahead v4 prefetches into L2 (1 or 2): a candidate */
static int g_prefetch = -1;

extern "C" void kvb_cuda_set_attn_prefetch(int tiles) { g_prefetch = tiles == 1 || tiles == 2 ? tiles : 0; }

extern "C" int kvb_cuda_attn_prefetch(void) {
    if (g_prefetch < 0) {
        const char *v = getenv("KVB_ATTN_PREFETCH");
        kvb_cuda_set_attn_prefetch(v ? atoi(v) : 0);
    }
    return g_prefetch;
}

int kvb_cuda_decode_tc(const kvb_cuda_attn *a, int n_split, int n_rows, int n_chunks, float *part, cudaStream_t s) {
    if (!a->kv_f16 || (a->head_dim != 64 && a->head_dim != 128)) return 0;
    const int pf = kvb_cuda_attn_prefetch();
    const int bps = a->n_head_kv * n_chunks;
    int ns;
#define V4_PF(DD, WW, PP)                                                                                            \
    ns = v4_splits<DD, WW, PP>(n_split, bps);                                                                        \
    k_attn_dec_tc<DD, WW, PP><<<dim3((unsigned)a->n_head_kv, (unsigned)ns, (unsigned)n_chunks), V4_WARPS * 32, 0, s>>>( \
        *a, ns, n_rows, part, pf)
#define V4(DD, WW)                                                                                                   \
    if (pf) { V4_PF(DD, WW, true); }                                                                                 \
    else { V4_PF(DD, WW, false); }
    const bool win = a->window > 0;
    if (a->head_dim == 128 && win) { V4(128, true); }
    else if (a->head_dim == 128) { V4(128, false); }
    else if (win) { V4(64, true); }
    else { V4(64, false); }
#undef V4
#undef V4_PF
    return ns;
}
