/* attn_split.cuh — what the split-KV decode kernels share (attention.cu's v1-v3, attn_decode.cu's v4): the block
 * decomposition and the layout of the splits' partials that k_attn_merge reads. C++ (nvcc) only. */
#ifndef KVB_CUDA_ATTN_SPLIT_CUH
#define KVB_CUDA_ATTN_SPLIT_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "kernels/cuda/attention.h"

/* rows per block: a row is a (query, head of the GQA group) pair */
enum { RMAX = 8 };

/* what a block (KV head g, split, chunk of rows) covers: key list entries [j0, j1) and rows row0..row0+R-1 */
struct block_span {
    const int32_t *kp, *ix; /* positions (NULL = no mask) and index list (NULL = all slots) of KV head g */
    int64_t j0, j1;
    int row0, R;
};

__device__ __forceinline__ block_span span_of(const kvb_cuda_attn &a, int g, int split, int chunk, int n_split,
                                              int n_rows) {
    block_span sp;
    sp.kp = (a.q_pos && a.k_pos) ? a.k_pos[g] : NULL;
    sp.ix = a.idx ? a.idx[g] : NULL;
    const int64_t len = sp.ix ? a.n_idx[g] : a.n_kv[g];
    const int64_t per = (len + n_split - 1) / n_split;
    sp.j0 = (int64_t)split * per;
    sp.j1 = sp.j0 + per < len ? sp.j0 + per : len;
    sp.row0 = chunk * RMAX;
    sp.R = n_rows - sp.row0 < RMAX ? n_rows - sp.row0 : RMAX;
    return sp;
}

/* The mask: a key at position kp is hidden from a query at qp when it comes later, or, in a sliding-window layer
 * (window > 0), window or more positions earlier. The distance is taken in unsigned arithmetic, exact for any int32
 * pair once kp <= qp; window = 0 leaves the causal test alone. */
__device__ __forceinline__ bool key_hidden(int32_t kp, int32_t qp, int32_t window) {
    return kp > qp || (window > 0 && (uint32_t)qp - (uint32_t)kp >= (uint32_t)window);
}
/* key_hidden for window > 0 in one compare (a later key's distance wraps past any window), where registers are
 * tight: the same answer for positions in [0, 2^31), which positions are */
__device__ __forceinline__ bool key_hidden_win(int32_t kp, int32_t qp, int32_t window) {
    return (uint32_t)qp - (uint32_t)kp >= (uint32_t)window;
}

/* a split's partial for row i of (KV head g, chunk): [0] the row's max logit m, [1] sum of e^(s - m), [2..2+D) the
 * unnormalised output; rows of a chunk, then splits, D + 2 floats each */
__device__ __forceinline__ float *partial_of(float *part, int g, int n_chunks, int chunk, int i, int n_split,
                                             int split, int D) {
    const int64_t stride = D + 2;
    return part + (((int64_t)g * n_chunks + chunk) * RMAX + i) * (int64_t)n_split * stride + (int64_t)split * stride;
}

/* the end of a block: its W warps' partials (m, l, acc per row, in shared memory) merged into the split's partial
 * of each of its R rows; dst = row 0's partial, row_stride floats from one row's to the next */
template <int W, int RC, int D>
__device__ __forceinline__ void merge_warps(const float (*sm)[RC], const float (*sl)[RC], const float (*sacc)[RC][D], int R,
                                            float *dst, int64_t row_stride) {
    for (int x = threadIdx.x; x < RC * D; x += blockDim.x) {
        const int i = x / D, d = x % D;
        if (i >= R) break;
        float M = -INFINITY;
        for (int w = 0; w < W; w++) M = fmaxf(M, sm[w][i]);
        float L = 0.f, o = 0.f;
        for (int w = 0; w < W; w++) {
            const float c = sm[w][i] == -INFINITY ? 0.f : __expf(sm[w][i] - M);
            L += sl[w][i] * c;
            o += sacc[w][i][d] * c;
        }
        float *row = dst + i * row_stride;
        row[2 + d] = o;
        if (d == 0) row[0] = M, row[1] = L;
    }
}

/* blocks of `kernel` (threads a block, no dynamic shared memory) the whole GPU holds at once */
template <typename Kernel> static int resident_blocks(Kernel kernel, int threads) {
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0) != cudaSuccess || per_sm < 1) per_sm = 1;
    return per_sm * kvb_cuda_sm_count();
}

/* splits of a one-wave decode kernel: at most n_split (the workspace is sized for those) and no more blocks than
 * `resident` (resident_blocks), so every split runs in the one wave; at least 1 */
static inline int one_wave_splits(int resident, int n_split, int blocks_per_split) {
    int n = resident / blocks_per_split;
    if (n > n_split) n = n_split;
    return n < 1 ? 1 : n;
}

#endif
