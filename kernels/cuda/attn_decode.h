/* attn_decode.h — decode attention v4 on tensor cores (attn_decode.cu), for attention.cu. C++ (nvcc) only. */
#ifndef KVB_CUDA_ATTN_DECODE_H
#define KVB_CUDA_ATTN_DECODE_H

#include <cuda_runtime.h>

#include "kernels/cuda/attention.h"

/* Enqueue v4 for f16 K/V with head_dim 64 or 128: blocks (KV head, split, chunk of rows) as attention.cu's split
 * kernels, at most n_split splits (the workspace's), writing their partials into part for k_attn_merge. Returns the
 * splits used (the merge's n_split), or 0 when the shapes are not v4's. */
int kvb_cuda_decode_tc(const kvb_cuda_attn *a, int n_split, int n_rows, int n_chunks, float *part, cudaStream_t s);

#endif
