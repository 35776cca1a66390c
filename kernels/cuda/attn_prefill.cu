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
 * Fragment layouts: mma.cuh.
 *
 * v2 (KVB_PREFILL_TC=2, k_attn_prefill_tc2): the same products and the same online softmax, with
 *  - rows = (query, head of the GQA group) pairs of one KV head, 128 a block (8 warps of 16): a staged K/V tile
 *    serves the whole group (v1 stages it once per query head, G times over) and twice the rows;
 *  - K/V tiles double-buffered through cp.async (the next tile's copies in flight while this one is computed);
 *  - K and V fragments by ldmatrix (.trans for V): one instruction per two mma where v1 issues 2-4 shared loads
 *    per mma;
 *  - which tiles a block needs decided from per-tile position bounds computed once per call (k_tile_bounds: the
 *    min and max position of each 64-entry tile of each KV head's list), with no barrier: v1 loads and reduces
 *    every tile's positions behind three barriers, skipped tiles too; a tile every key of which every row sees
 *    skips the mask test.
 */
#include <cuda_fp16.h>
#include <cuda_pipeline.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels/cuda/attn_prefill.h"
#include "kernels/cuda/attn_split.cuh"
#include "kernels/cuda/candidate.h"
#include "kernels/cuda/mma.cuh"

enum { PQ = 64, PK = 64, PWARPS = 4 };

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

/* ---- v2 ---- */

enum { P2K = 64, P2WARPS = 8, P2ROWS = P2WARPS * 16 };

/* per KV head g and 64-entry tile j of its list: {min, max} key position of the tile's real entries (list order).
 * grid (n_head_kv, ceil(tiles / 256)), 256 threads, one tile a thread */
__global__ void k_tile_bounds(kvb_cuda_attn a, int64_t n_tiles, int2 *bnd) {
    const int g = blockIdx.x;
    const int64_t j = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
    if (j >= n_tiles) return;
    const int32_t *kp = a.k_pos[g], *ix = a.idx ? a.idx[g] : NULL;
    if (!kp) return; /* a KV head without positions takes no mask: the kernel never reads its bounds */
    const int64_t len = ix ? a.n_idx[g] : a.n_kv[g];
    int32_t lo = INT_MAX, hi = INT_MIN;
    for (int64_t e = j * P2K; e < len && e < (j + 1) * P2K; e++) {
        const int32_t p = kp[ix ? ix[e] : e];
        lo = min(lo, p);
        hi = max(hi, p);
    }
    bnd[(int64_t)g * n_tiles + j] = make_int2(lo, hi);
}

/* grid (n_head_kv, ceil(n_q * G / P2ROWS)); P2WARPS warps; dynamic shared memory: two stages of K and V tiles
 * [P2K][D + 8] halves and their key positions [P2K]. bnd: k_tile_bounds' (NULL without the mask). */
template <int D>
__global__ void __launch_bounds__(P2WARPS * 32, 1) k_attn_prefill_tc2(kvb_cuda_attn a, const int2 *bnd, int64_t n_tiles) {
    constexpr int KS = D + 8, DK = D / 16, DN = D / 8, CH = D / 8; /* CH: 16-byte chunks a row */
    constexpr int STAGE = 2 * P2K * KS * 2 + P2K * 4;              /* bytes a stage: K, V, positions */
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ int32_t s_qmax, s_qmin;
    const int kvh = blockIdx.x, G = a.n_head / a.n_head_kv;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gi = lane >> 2, ci = lane & 3;
    const int64_t n_rows = a.n_q * G, row0 = (int64_t)blockIdx.y * P2ROWS;
    const __half *K = (const __half *)a.k[kvh], *V = (const __half *)a.v[kvh];
    const int32_t *kp = (a.q_pos && a.k_pos) ? a.k_pos[kvh] : NULL;
    const int32_t *ix = a.idx ? a.idx[kvh] : NULL;
    const int64_t len = ix ? a.n_idx[kvh] : a.n_kv[kvh];
    const int32_t wnd = kp ? a.window : 0;
    const int64_t my_tiles = (len + P2K - 1) / P2K; /* this KV head's; n_tiles: the longest list's */
    if (kp) bnd += (int64_t)kvh * n_tiles;

    /* this thread's two rows (g and g + 8 of its warp's 16): query t, head h, position; Q as A fragments */
    const int64_t r0 = row0 + warp * 16 + gi, r1 = r0 + 8;
    const int64_t t0 = r0 / G, t1 = r1 / G;
    const int h0 = kvh * G + (int)(r0 % G), h1 = kvh * G + (int)(r1 % G);
    const bool ok0 = r0 < n_rows, ok1 = r1 < n_rows;
    const int32_t qp0 = ok0 ? (kp ? a.q_pos[t0] : INT_MAX - 1) : INT_MIN;
    const int32_t qp1 = ok1 ? (kp ? a.q_pos[t1] : INT_MAX - 1) : INT_MIN;
    uint32_t qa[DK][4];
    {
        const float *q0 = a.q + (t0 * a.n_head + h0) * (int64_t)D, *q1 = a.q + (t1 * a.n_head + h1) * (int64_t)D;
#pragma unroll
        for (int kk = 0; kk < DK; kk++) {
            const int d0 = kk * 16 + 2 * ci, d1 = d0 + 8;
            qa[kk][0] = ok0 ? pack_half2(q0[d0], q0[d0 + 1]) : 0u;
            qa[kk][1] = ok1 ? pack_half2(q1[d0], q1[d0 + 1]) : 0u;
            qa[kk][2] = ok0 ? pack_half2(q0[d1], q0[d1 + 1]) : 0u;
            qa[kk][3] = ok1 ? pack_half2(q1[d1], q1[d1 + 1]) : 0u;
        }
    }
    /* the block's latest and earliest query positions (tile skipping) */
    if (threadIdx.x == 0) s_qmax = INT_MIN, s_qmin = INT_MAX;
    __syncthreads();
    if (threadIdx.x < P2ROWS && row0 + threadIdx.x < n_rows && kp) {
        const int32_t p = a.q_pos[(row0 + threadIdx.x) / G];
        atomicMax(&s_qmax, p);
        atomicMin(&s_qmin, p);
    }
    __syncthreads();
    const int32_t qmax = s_qmax, qmin = s_qmin;
    /* tile j is needed unless no row sees any of its keys: all later than every query, or (window) all a window or
     * more before every query. Uniform over the block: every thread reads the same bounds. */
    auto needed = [&](int64_t j) -> bool {
        if (!kp) return true;
        const int2 b = bnd[j];
        if (b.x > qmax) return false;
        return !(wnd > 0 && (int64_t)b.y + wnd <= (int64_t)qmin);
    };
    auto next_tile = [&](int64_t j) -> int64_t {
        while (j < my_tiles && !needed(j)) j++;
        return j;
    };
    /* stage st: K, V [P2K][KS] halves, positions [P2K] */
    auto stage_k = [&](int st) { return (__half *)(smem + st * STAGE); };
    auto stage_v = [&](int st) { return (__half *)(smem + st * STAGE) + P2K * KS; };
    auto stage_p = [&](int st) { return (int32_t *)(smem + st * STAGE + 2 * P2K * KS * 2); };
    auto issue = [&](int64_t j, int st) { /* tile j's copies into stage st (rows past the list: zeros, never visible) */
        __half *Kd = stage_k(st), *Vd = stage_v(st);
        const int64_t kb = j * P2K;
        for (int x = threadIdx.x; x < P2K * CH; x += blockDim.x) {
            const int r = x / CH, cc = x % CH;
            const int64_t e = kb + r;
            if (e < len) {
                const int64_t slot = ix ? ix[e] : e;
                __pipeline_memcpy_async(Kd + r * KS + cc * 8, (const uint4 *)(K + slot * D) + cc, 16);
                __pipeline_memcpy_async(Vd + r * KS + cc * 8, (const uint4 *)(V + slot * D) + cc, 16);
            } else {
                *(uint4 *)(Kd + r * KS + cc * 8) = make_uint4(0, 0, 0, 0);
                *(uint4 *)(Vd + r * KS + cc * 8) = make_uint4(0, 0, 0, 0);
            }
        }
        if (threadIdx.x < P2K) {
            int32_t *pd = stage_p(st) + threadIdx.x;
            const int64_t e = kb + threadIdx.x;
            if (e >= len) *pd = INT_MAX;
            else if (!kp) *pd = INT_MIN;
            else __pipeline_memcpy_async(pd, kp + (ix ? ix[e] : e), 4);
        }
        __pipeline_commit();
    };

    float o[DN][4];
#pragma unroll
    for (int dn = 0; dn < DN; dn++) o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

    int64_t j = next_tile(0);
    if (j < my_tiles) issue(j, 0);
    int st = 0;
    while (j < my_tiles) {
        const int64_t jn = next_tile(j + 1);
        if (jn < my_tiles) {
            issue(jn, st ^ 1);
            __pipeline_wait_prior(1); /* tile j's copies have landed; jn's are in flight */
        } else {
            __pipeline_wait_prior(0);
        }
        __syncthreads();
        const __half *Ks = stage_k(st), *Vs = stage_v(st);
        const int32_t *kpos = stage_p(st);
        /* every key of the tile visible to every row of the block, the whole tile real: no mask test */
        const bool all = kp ? (j + 1) * P2K <= len && bnd[j].y <= qmin &&
                                  (wnd == 0 || (int64_t)qmax - bnd[j].x < (int64_t)wnd)
                            : (j + 1) * P2K <= len;
        /* S = Q K^T: 8 column tiles of 8 keys; ldmatrix x4 takes 8 keys x 32 dims (two k steps) */
        float s[P2K / 8][4];
#pragma unroll
        for (int nt = 0; nt < P2K / 8; nt++) {
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
            const uint32_t base = smem_addr(Ks + (nt * 8 + (lane & 7)) * KS + (lane >> 3) * 8);
#pragma unroll
            for (int kk = 0; kk < DK; kk += 2) {
                uint32_t b[4];
                ldmatrix_x4(b, base + kk * 16 * 2);
                mma16816(s[nt], qa[kk], b[0], b[1]);
                mma16816(s[nt], qa[kk + 1], b[2], b[3]);
            }
        }
        /* scale, mask, the rows' maxima over the tile (a row's 64 columns sit in the 4 lanes of a quad) */
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < P2K / 8; nt++) {
            if (all) {
                s[nt][0] *= a.scale, s[nt][1] *= a.scale, s[nt][2] *= a.scale, s[nt][3] *= a.scale;
                if (!ok0) s[nt][0] = s[nt][1] = -INFINITY;
                if (!ok1) s[nt][2] = s[nt][3] = -INFINITY;
            } else {
                const int k0 = nt * 8 + 2 * ci;
                const int32_t p0 = kpos[k0], p1 = kpos[k0 + 1];
                s[nt][0] = !key_hidden(p0, qp0, wnd) ? s[nt][0] * a.scale : -INFINITY;
                s[nt][1] = !key_hidden(p1, qp0, wnd) ? s[nt][1] * a.scale : -INFINITY;
                s[nt][2] = !key_hidden(p0, qp1, wnd) ? s[nt][2] * a.scale : -INFINITY;
                s[nt][3] = !key_hidden(p1, qp1, wnd) ? s[nt][3] * a.scale : -INFINITY;
            }
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
        uint32_t pa[P2K / 16][4];
        float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
        for (int nt = 0; nt < P2K / 8; nt++) {
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
#pragma unroll
        for (int dn = 0; dn < DN; dn++) {
            o[dn][0] *= c0;
            o[dn][1] *= c0;
            o[dn][2] *= c1;
            o[dn][3] *= c1;
        }
        /* O += P V: ldmatrix.trans x4 takes 16 keys x 16 dims (two n tiles of 8 dims) */
        {
            const uint32_t base = smem_addr(Vs + ((lane & 7) + ((lane >> 3) & 1) * 8) * KS + (lane >> 4) * 8);
#pragma unroll
            for (int ks = 0; ks < P2K / 16; ks++) {
#pragma unroll
                for (int dn = 0; dn < DN; dn += 2) {
                    uint32_t b[4];
                    ldmatrix_x4_trans(b, base + (ks * 16 * KS + dn * 8) * 2);
                    mma16816(o[dn], pa[ks], b[0], b[1]);
                    mma16816(o[dn + 1], pa[ks], b[2], b[3]);
                }
            }
        }
        __syncthreads(); /* stage st is consumed: the next iteration's copies may overwrite it */
        j = jn;
        st ^= 1;
    }
    /* out = O / l per row; lse = m + log l (quad lane 0 writes it) */
    const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
#pragma unroll
    for (int dn = 0; dn < DN; dn++) {
        const int d = dn * 8 + 2 * ci;
        if (ok0) *(float2 *)(a.out + (t0 * a.n_head + h0) * (int64_t)D + d) = make_float2(o[dn][0] * inv0, o[dn][1] * inv0);
        if (ok1) *(float2 *)(a.out + (t1 * a.n_head + h1) * (int64_t)D + d) = make_float2(o[dn][2] * inv1, o[dn][3] * inv1);
    }
    if (a.lse && ci == 0) {
        if (ok0) a.lse[(int64_t)h0 * a.n_q + t0] = l0 > 0.f ? m0 + logf(l0) : -INFINITY;
        if (ok1) a.lse[(int64_t)h1 * a.n_q + t1] = l1 > 0.f ? m1 + logf(l1) : -INFINITY;
    }
}

template <int D> static size_t prefill2_smem(void) {
    return (size_t)2 * (2 * P2K * (D + 8) * sizeof(__half) + P2K * sizeof(int32_t));
}

template <int D> static size_t prefill_smem(void) { return (size_t)2 * PK * (D + 8) * sizeof(__half) + PK * sizeof(int32_t); }

static int g_prefill_tc = -1; /* -1 = not chosen yet, 0 = off, 1 = v1, 2 = v2 */

extern "C" void kvb_cuda_attention_set_prefill_tc(int v) { g_prefill_tc = v == 1 || v == 2 ? v : 0; }

/* Tensor cores on by default since the H200 run of 2026-11-26 (v1: synthetic:llama3.1-8b at 32K, TTFT 31.4 s ->
 * 7.3 s), v2 since the H200 run of 2026-11-27 (32K prefill 4435 -> 6890 tok/s in one call; test_cuda_ops within v1's
 * bounds, test_cuda_model agreeing step for step with v1); KVB_PREFILL_TC=0 turns them off, =1 takes v1 */
extern "C" int kvb_cuda_attention_prefill_tc(void) {
    if (g_prefill_tc < 0) {
        const char *v = getenv("KVB_PREFILL_TC");
        const int k = v && *v ? atoi(v) : 2;
        g_prefill_tc = k == 0 ? 0 : k == 1 ? 1 : 2;
    }
    return g_prefill_tc;
}

int kvb_cuda_prefill_tc_fits(const kvb_cuda_attn *a) {
    return a->kv_f16 && (a->head_dim == 64 || a->head_dim == 128) && a->n_q >= KVB_PREFILL_TC_MIN_Q &&
           (a->n_q * (a->n_head / a->n_head_kv) + PQ - 1) / PQ <= 65535 && kvb_cuda_attention_prefill_tc();
}

size_t kvb_cuda_prefill_tc_ws(const kvb_cuda_attn *a) {
    return (size_t)a->n_head_kv * (size_t)((a->max_len + P2K - 1) / P2K) * sizeof(int2) + 256;
}

int kvb_cuda_prefill_tc(const kvb_cuda_attn *c, void *ws, cudaStream_t s) {
    static int raised;
    if (!raised) { /* 64-key K and V tiles of d = 128 take 34 KB (v2: two stages, 69 KB); d = 64 fits the default */
        cudaFuncSetAttribute(k_attn_prefill_tc<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)prefill_smem<128>());
        cudaFuncSetAttribute(k_attn_prefill_tc<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)prefill_smem<64>());
        cudaFuncSetAttribute(k_attn_prefill_tc2<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)prefill2_smem<128>());
        cudaFuncSetAttribute(k_attn_prefill_tc2<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)prefill2_smem<64>());
        raised = 1;
    }
    if (kvb_cuda_attention_prefill_tc() == 2) {
        const int64_t rows = c->n_q * (c->n_head / c->n_head_kv), n_tiles = (c->max_len + P2K - 1) / P2K;
        int2 *bnd = NULL;
        if (c->q_pos && c->k_pos && n_tiles > 0) {
            bnd = (int2 *)ws;
            const dim3 gb((unsigned)c->n_head_kv, (unsigned)((n_tiles + 255) / 256));
            k_tile_bounds<<<gb, 256, 0, s>>>(*c, n_tiles, bnd);
        }
        const dim3 grid((unsigned)c->n_head_kv, (unsigned)((rows + P2ROWS - 1) / P2ROWS));
        if (c->head_dim == 64) k_attn_prefill_tc2<64><<<grid, P2WARPS * 32, prefill2_smem<64>(), s>>>(*c, bnd, n_tiles);
        else k_attn_prefill_tc2<128><<<grid, P2WARPS * 32, prefill2_smem<128>(), s>>>(*c, bnd, n_tiles);
        return cudaGetLastError() == cudaSuccess ? 0 : -1;
    }
    const dim3 grid((unsigned)c->n_head, (unsigned)((c->n_q + PQ - 1) / PQ));
    if (c->head_dim == 64) k_attn_prefill_tc<64><<<grid, PWARPS * 32, prefill_smem<64>(), s>>>(*c);
    else k_attn_prefill_tc<128><<<grid, PWARPS * 32, prefill_smem<128>(), s>>>(*c);
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}
