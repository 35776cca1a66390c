/* gemm.h — prefill matmuls in f32: the weights dequantized a panel of rows at a time (quant_dequant_row) and
 * multiplied with the f32 activations, each pool thread on its own rows: by gemm.c's own AVX-512 kernel in builds
 * for AVX-512, else by OpenBLAS's single-threaded sgemm.
 * Over many tokens this reaches the f32 FMA peak the integer dots (matmul.c) cannot, at the price of
 * llama.cpp's order: the outputs are not bitwise llama.cpp's (backend.h kvb_gemm says when it is used). Builds
 * with neither have no f32 path: cpu_gemm_available() is 0 and cpu_gemm refuses. */
#ifndef KVB_CPU_GEMM_H
#define KVB_CPU_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/dtype.h"
#include "kernels/cpu/pool.h"

/* Fewest tokens for which the backend takes the f32 path (below it the per-chunk dequantization costs more than
 * the faster multiply saves). */
enum { CPU_GEMM_MIN_TOK = 32 };

/* 1 when this build has an f32 path: AVX-512, or OpenBLAS (its own threads then held to one: the pool supplies
 * the parallelism). */
int cpu_gemm_available(void);
/* What runs the f32 path: "AVX-512 f32" (this file's own GEMM, in builds for AVX-512), "OpenBLAS f32", or
 * "integer" (neither: cpu_gemm refuses). */
const char *cpu_gemm_name(void);
/* Workspace bytes cpu_gemm needs for n_threads threads: each a weight panel in f32 and its n_tok results. */
size_t cpu_gemm_ws_bytes(int64_t cols, int64_t n_tok, int n_threads);
/* out[t*rows + r] = sum_c x[t*cols + c] * W[r][c] for t < n_tok, W (rows x cols of type wt, GGUF layout)
 * dequantized to f32; threads split the rows. 0 = ok, -1 = bad arguments or no f32 path in this build. */
int cpu_gemm(float *out, const void *w, ggml_type wt, int64_t rows, int64_t cols, const float *x, int64_t n_tok,
             void *ws, size_t ws_bytes, kvb_pool *pool);

#endif
