/* attn_prefill.cu — prefill attention on tensor cores (flash-attention 2 tiling with mma.sync m16n8k16, f16
 * inputs, f32 accumulation): a block takes one query head and 64 queries (a warp per 16), loops over its KV
 * head's key list in tiles of 64 staged in shared memory, and keeps each row's online softmax in registers:
 * S = Q K^T on the tensor cores (Q rounded to f16, the scores scaled in f32), masked by position, then P (f16)
 * times V on the tensor cores. A key tile every row of the block masks out is skipped before its K/V rows are
 * read, so causal prefill over position-ordered slots does about half the work; in a sliding-window layer so is a
 * tile whose every key lies a window or more before every row's query.
 *
 * Semantics as the other attention kernels (kernels/cuda/attention.h): a slot is visible to query t iff there
 * is no mask or k_pos[slot] <= q_pos[t] (and q_pos[t] - window < k_pos[slot] in a sliding-window layer: window > 0,
 * key_hidden); out = 0 and lse = -inf for a row that sees nothing. Rounding differs
 * from the f32 kernels (Q and P in f16): |error| ~1e-3 of the output's scale (test_cuda_ops checks 2e-3).
 *
 * Fragment layouts (PTX ISA, mma.m16n8k16 .f16 .f32; g = lane / 4, c = lane % 4):
 *   A (16x16, row major), 4 regs of 2 halves: {row g, cols 2c..2c+1}, {row g+8, same}, {row g, cols 8+2c..},
 *     {row g+8, cols 8+2c..}
 *   B (16x8, column major), 2 regs: {rows (k) 2c..2c+1, col (n) g}, {rows 8+2c.., col g}
 *   C (16x8 f32), 4 floats: (g, 2c), (g, 2c+1), (g+8, 2c), (g+8, 2c+1) */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels/cuda/attn_prefill.h"
#include "kernels/cuda/attn_split.cuh"
#include "kernels/cuda/candidate.h"

enum { PQ = 64, PK = 64, PWARPS = 4 };

__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *(const uint32_t *)&h;
}

__device__ __forceinline__ uint32_t pack_halves(__half lo, __half hi) {
    return (uint32_t)__half_as_ushort(lo) | ((uint32_t)__half_as_ushort(hi) << 16);
}

/* grid (n_head, ceil(n_q / PQ)); PWARPS warps; dynamic shared memory: K and V tiles [PK][D + 8] halves, the
 * tile's key positions [PK] */
template <int D>
__global__ void __launch_bounds__(PWARPS * 32) k_attn_prefill_tc(kvb_cuda_attn a) {
    constexpr int KS = D + 8, DK = D / 16, DN = D / 8;
    extern __shared__ __align__(16) unsigned char smem[];
    __half *Ks = (__half *)smem, *Vs = Ks + PK * KS;
    int32_t *kpos = (int32_t *)(Vs + PK * KS);
    __shared__ int32_t s_qmax, s_kmin, s_qmin, s_kmax;
    const int h = blockIdx.x, G = a.n_head / a.n_head_kv, kvh = h / G;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gi = lane >> 2, ci = lane & 3;
    const int64_t t0 = (int64_t)blockIdx.y * PQ, tw = t0 + warp * 16; /* this warp's first query */
    const __half *K = (const __half *)a.k[kvh], *V = (const __half *)a.v[kvh];
    const int32_t *kp = (a.q_pos && a.k_pos) ? a.k_pos[kvh] : NULL;
    const int32_t *ix = a.idx ? a.idx[kvh] : NULL;
    const int64_t len = ix ? a.n_idx[kvh] : a.n_kv[kvh];
    const int32_t wnd = kp ? a.window : 0; /* the window applies with the mask only */

    /* this thread's two query rows (g and g + 8 of the warp's 16), their positions, Q as A fragments */
    const int64_t r0 = tw + gi, r1 = r0 + 8;
    const int32_t qp0 = r0 < a.n_q ? (kp ? a.q_pos[r0] : INT_MAX - 1) : INT_MIN;
    const int32_t qp1 = r1 < a.n_q ? (kp ? a.q_pos[r1] : INT_MAX - 1) : INT_MIN;
    uint32_t qa[DK][4];
    {
        const float *q0 = a.q + (r0 * a.n_head + h) * (int64_t)D, *q1 = a.q + (r1 * a.n_head + h) * (int64_t)D;
#pragma unroll
        for (int kk = 0; kk < DK; kk++) {
            const int d0 = kk * 16 + 2 * ci, d1 = d0 + 8;
            qa[kk][0] = r0 < a.n_q ? pack_half2(q0[d0], q0[d0 + 1]) : 0u;
            qa[kk][1] = r1 < a.n_q ? pack_half2(q1[d0], q1[d0 + 1]) : 0u;
            qa[kk][2] = r0 < a.n_q ? pack_half2(q0[d1], q0[d1 + 1]) : 0u;
            qa[kk][3] = r1 < a.n_q ? pack_half2(q1[d1], q1[d1 + 1]) : 0u;
        }
    }
    /* the block's latest query position: a key tile whose every position is later is skipped; with a window, its
     * earliest too: a tile whose every key is a window or more before it is skipped as well */
    if (threadIdx.x == 0) s_qmax = INT_MIN, s_qmin = INT_MAX;
    __syncthreads();
    if (threadIdx.x < PQ && t0 + threadIdx.x < a.n_q) {
        atomicMax(&s_qmax, kp ? a.q_pos[t0 + threadIdx.x] : INT_MAX - 1);
        if (wnd > 0) atomicMin(&s_qmin, a.q_pos[t0 + threadIdx.x]);
    }
    float o[DN][4];
#pragma unroll
    for (int dn = 0; dn < DN; dn++) o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

    for (int64_t kb = 0; kb < len; kb += PK) {
        __syncthreads(); /* the previous tile is consumed (and s_qmax is final) */
        if (threadIdx.x == 0) s_kmin = INT_MAX, s_kmax = INT_MIN;
        __syncthreads();
        if (threadIdx.x < PK) { /* slot positions; past the list: never visible */
            const int64_t j = kb + threadIdx.x;
            int32_t p = INT_MAX;
            if (j < len) p = kp ? kp[ix ? ix[j] : j] : INT_MIN;
            kpos[threadIdx.x] = p;
            atomicMin(&s_kmin, p);
            if (wnd > 0 && j < len) atomicMax(&s_kmax, p); /* the tile's latest real key */
        }
        __syncthreads();
        if (s_kmin > s_qmax) continue; /* no row of the block sees any key of this tile */
        /* every real key a window or more before every row's query (qp - p >= qmin - kmax >= window): none visible */
        if (wnd > 0 && (int64_t)s_kmax + wnd <= (int64_t)s_qmin) continue;
        /* K and V rows of the tile, 16 bytes a thread at a time */
        for (int x = threadIdx.x; x < PK * (D / 8); x += blockDim.x) {
            const int r = x / (D / 8), cc = x % (D / 8);
            const int64_t j = kb + r;
            uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
            if (j < len) {
                const int64_t slot = ix ? ix[j] : j;
                kv = __ldg((const uint4 *)(K + slot * D) + cc);
                vv = __ldg((const uint4 *)(V + slot * D) + cc);
            }
            *(uint4 *)(Ks + r * KS + cc * 8) = kv;
            *(uint4 *)(Vs + r * KS + cc * 8) = vv;
        }
        __syncthreads();
        /* S = Q K^T: 8 column tiles of 8 keys */
        float s[PK / 8][4];
#pragma unroll
        for (int nt = 0; nt < PK / 8; nt++) {
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
            const __half *kr = Ks + (nt * 8 + gi) * KS + 2 * ci; /* key nt*8+g, dims 2c.. of each k step */
#pragma unroll
            for (int kk = 0; kk < DK; kk++)
                mma16816(s[nt], qa[kk], *(const uint32_t *)(kr + kk * 16), *(const uint32_t *)(kr + kk * 16 + 8));
        }
        /* scale, mask, the rows' maxima over the tile (a row's 64 columns sit in the 4 lanes of a quad) */
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < PK / 8; nt++) {
            const int k0 = nt * 8 + 2 * ci;
            const int32_t p0 = kpos[k0], p1 = kpos[k0 + 1];
            s[nt][0] = !key_hidden(p0, qp0, wnd) ? s[nt][0] * a.scale : -INFINITY;
            s[nt][1] = !key_hidden(p1, qp0, wnd) ? s[nt][1] * a.scale : -INFINITY;
            s[nt][2] = !key_hidden(p0, qp1, wnd) ? s[nt][2] * a.scale : -INFINITY;
            s[nt][3] = !key_hidden(p1, qp1, wnd) ? s[nt][3] * a.scale : -INFINITY;
            mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
            mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
        }
#pragma unroll
        for (int off = 1; off < 4; off <<= 1) {
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
        }
        const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
        const float c0 = m0 == -INFINITY ? 0.f : __expf(m0 - n0), c1 = m1 == -INFINITY ? 0.f : __expf(m1 - n1);
        m0 = n0;
        m1 = n1;
        /* P = exp(S - m) as A fragments (two column tiles make one k step of 16 keys), row sums */
        uint32_t pa[PK / 16][4];
        float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
        for (int nt = 0; nt < PK / 8; nt++) {
            const float e0 = s[nt][0] == -INFINITY ? 0.f : __expf(s[nt][0] - n0);
            const float e1 = s[nt][1] == -INFINITY ? 0.f : __expf(s[nt][1] - n0);
            const float e2 = s[nt][2] == -INFINITY ? 0.f : __expf(s[nt][2] - n1);
            const float e3 = s[nt][3] == -INFINITY ? 0.f : __expf(s[nt][3] - n1);
            sum0 += e0 + e1;
            sum1 += e2 + e3;
            pa[nt / 2][(nt % 2) * 2 + 0] = pack_half2(e0, e1);
            pa[nt / 2][(nt % 2) * 2 + 1] = pack_half2(e2, e3);
        }
#pragma unroll
        for (int off = 1; off < 4; off <<= 1) {
            sum0 += __shfl_xor_sync(0xffffffffu, sum0, off);
            sum1 += __shfl_xor_sync(0xffffffffu, sum1, off);
        }
        l0 = l0 * c0 + sum0;
        l1 = l1 * c1 + sum1;
        /* O = O c + P V: V as B fragments (keys along k, head dims along n), gathered from shared memory */
#pragma unroll
        for (int dn = 0; dn < DN; dn++) {
            o[dn][0] *= c0;
            o[dn][1] *= c0;
            o[dn][2] *= c1;
            o[dn][3] *= c1;
            const __half *vc = Vs + dn * 8 + gi; /* head dim dn*8+g */
#pragma unroll
            for (int ks = 0; ks < PK / 16; ks++) {
                const int k0 = ks * 16 + 2 * ci;
                const uint32_t b0 = pack_halves(vc[k0 * KS], vc[(k0 + 1) * KS]);
                const uint32_t b1 = pack_halves(vc[(k0 + 8) * KS], vc[(k0 + 9) * KS]);
                mma16816(o[dn], pa[ks], b0, b1);
            }
        }
    }
    /* out = O / l per row; lse = m + log l (quad lane 0 writes it) */
    const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
#pragma unroll
    for (int dn = 0; dn < DN; dn++) {
        const int d = dn * 8 + 2 * ci;
        if (r0 < a.n_q) {
            float *out = a.out + (r0 * a.n_head + h) * (int64_t)D + d;
            out[0] = o[dn][0] * inv0;
            out[1] = o[dn][1] * inv0;
        }
        if (r1 < a.n_q) {
            float *out = a.out + (r1 * a.n_head + h) * (int64_t)D + d;
            out[0] = o[dn][2] * inv1;
            out[1] = o[dn][3] * inv1;
        }
    }
    if (a.lse && ci == 0) {
        if (r0 < a.n_q) a.lse[(int64_t)h * a.n_q + r0] = l0 > 0.f ? m0 + logf(l0) : -INFINITY;
        if (r1 < a.n_q) a.lse[(int64_t)h * a.n_q + r1] = l1 > 0.f ? m1 + logf(l1) : -INFINITY;
    }
}

template <int D> static size_t prefill_smem(void) { return (size_t)2 * PK * (D + 8) * sizeof(__half) + PK * sizeof(int32_t); }

static int g_prefill_tc; /* 0 = not chosen yet, 1 = off, 2 = on */

extern "C" void kvb_cuda_attention_set_prefill_tc(int on) { g_prefill_tc = on ? 2 : 1; }

/* on by default since the H200 run of 2026-11-26 (synthetic:llama3.1-8b at 32K: TTFT 31.4 s -> 7.3 s; test_cuda_ops
 * within its 3e-3 bound, test_cuda_model green); KVB_PREFILL_TC=0 turns it off */
extern "C" int kvb_cuda_attention_prefill_tc(void) {
    if (!g_prefill_tc) {
        const char *v = getenv("KVB_PREFILL_TC");
        g_prefill_tc = v && *v && atoi(v) == 0 ? 1 : 2;
    }
    return g_prefill_tc == 2;
}

int kvb_cuda_prefill_tc_fits(const kvb_cuda_attn *a) {
    return a->kv_f16 && (a->head_dim == 64 || a->head_dim == 128) && a->n_q >= KVB_PREFILL_TC_MIN_Q &&
           (a->n_q + PQ - 1) / PQ <= 65535 && kvb_cuda_attention_prefill_tc();
}

int kvb_cuda_prefill_tc(const kvb_cuda_attn *c, cudaStream_t s) {
    static int raised;
    if (!raised) { /* 64-key K and V tiles of d = 128 take 34 KB; d = 64 fits the default */
        cudaFuncSetAttribute(k_attn_prefill_tc<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)prefill_smem<128>());
        cudaFuncSetAttribute(k_attn_prefill_tc<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)prefill_smem<64>());
        raised = 1;
    }
    const dim3 grid((unsigned)c->n_head, (unsigned)((c->n_q + PQ - 1) / PQ));
    if (c->head_dim == 64) k_attn_prefill_tc<64><<<grid, PWARPS * 32, prefill_smem<64>(), s>>>(*c);
    else k_attn_prefill_tc<128><<<grid, PWARPS * 32, prefill_smem<128>(), s>>>(*c);
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}
