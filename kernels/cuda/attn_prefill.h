/* attn_prefill.h — the tensor-core prefill kernel (attn_prefill.cu), for attention.cu. C++ (nvcc) only. */
#ifndef KVB_CUDA_ATTN_PREFILL_H
#define KVB_CUDA_ATTN_PREFILL_H

#include <cuda_runtime.h>

#include "kernels/cuda/attention.h"

enum { KVB_PREFILL_TC_MIN_Q = 64 }; /* fewer queries take the split kernels */

/* 1 when a call of these shapes takes the tensor-core kernel: f16 K/V, head_dim 64 or 128, at least
 * KVB_PREFILL_TC_MIN_Q queries, and the kernel switched on (kvb_cuda_attention_prefill_tc). */
int kvb_cuda_prefill_tc_fits(const kvb_cuda_attn *a);
/* Device workspace bytes it needs (v2's per-tile position bounds) */
size_t kvb_cuda_prefill_tc_ws(const kvb_cuda_attn *a);
/* Enqueue it on s (out and lse; probabilities are attention.cu's second pass); ws: kvb_cuda_prefill_tc_ws(a) bytes
 * of device memory. 0, or -1 on a launch error. */
int kvb_cuda_prefill_tc(const kvb_cuda_attn *a, void *ws, cudaStream_t s);

#endif
