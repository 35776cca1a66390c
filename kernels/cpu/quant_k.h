/* quant_k.h — the K-quants (Q4_K, Q5_K, Q6_K: 256-value super-blocks) and their Q8_K activations.
 * Used through quant.h; these are the pieces quant.c dispatches to. */
#ifndef KVB_QUANT_K_H
#define KVB_QUANT_K_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/quant.h"

/* 1 if t is a K-quant weight type handled here (Q4_K, Q5_K, Q6_K). */
int quant_k_is_k(ggml_type t);
/* Dequantize n elements (a multiple of 256) of a K type, or of Q8_K. */
void quant_k_dequant_row(ggml_type t, const void *src, float *dst, int64_t n);
/* Quantize n floats to a K weight type (a simple per-block fit, for tests). 0 = ok, -1 = not a K type. */
int quant_k_quantize_row(ggml_type t, const float *x, void *dst, int64_t n);
/* Quantize n activations to Q8_K as ggml's quantize_row_q8_K_ref does (same rounding, same bits). */
void quant_k_quantize_q8_K(const float *x, block_q8_K *dst, int64_t n);
/* out[j] = dot of a K-quant weight row with Q8_K activation row j (stride bytes apart), j < n_act <= 4;
 * simd = 0 takes the scalar kernels, which give the same bits as the AVX2 ones. */
void quant_k_dot_multi(ggml_type t, int64_t n, const void *w, const void *act, size_t stride, int n_act, float *out,
                       int simd);

#endif
