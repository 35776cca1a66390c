/* quant_k.h — the K-quants (Q2_K..Q6_K: 256-value super-blocks), the 4-bit I-quants (IQ4_XS, and IQ4_NL's
 * 32-value blocks) and the Q8_K activations. Used through quant.h; these are the pieces quant.c dispatches to.
 * Q4_K, Q5_K and Q6_K live in quant_k.c, the others in quant_lowbit.c. */
#ifndef KVB_QUANT_K_H
#define KVB_QUANT_K_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/quant.h"

/* 1 if t is a weight type dotted against Q8_K here (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS). */
int quant_k_is_k(ggml_type t);
/* Dequantize n elements (a multiple of 256) of a K type, or of Q8_K; IQ4_NL too (a multiple of 32). */
void quant_k_dequant_row(ggml_type t, const void *src, float *dst, int64_t n);
/* Quantize n floats to a K weight type (a simple per-block fit, for tests). 0 = ok, -1 = not a K type. */
int quant_k_quantize_row(ggml_type t, const float *x, void *dst, int64_t n);
/* Quantize n activations to Q8_K as ggml's quantize_row_q8_K_ref does (same rounding, same bits). */
void quant_k_quantize_q8_K(const float *x, block_q8_K *dst, int64_t n);
/* out[j] = dot of a K-quant weight row with Q8_K activation row j (stride bytes apart), j < n_act <= 4;
 * simd = 0 takes the scalar kernels, which give the same bits as the AVX2 ones. */
void quant_k_dot_multi(ggml_type t, int64_t n, const void *w, const void *act, size_t stride, int n_act, float *out,
                       int simd);


/* ---- private to kernels/cpu ---- */
/* lane l = sum over the eight 32-value chunks c of sc16[2c + l/4] * (integer dot of elements 32c+4l..+3): the
 * integers AVX2's maddubs + madd leave in lane l (sc16: the scale of each 16-value group) */
void quant_k_lanes(const int8_t *w, const int16_t *sc16, const int8_t *y, int32_t lane[8]);
/* quant_lowbit.c: Q2_K, Q3_K, IQ4_XS (Q8_K activations) and IQ4_NL (Q8_0 activations) */
int quant_lowbit_has(ggml_type t);
void quant_lowbit_dequant_row(ggml_type t, const void *src, float *dst, int64_t n);
int quant_lowbit_quantize_row(ggml_type t, const float *x, void *dst, int64_t n);
void quant_lowbit_dot_multi(ggml_type t, int64_t n, const void *w, const void *act, size_t stride, int n_act,
                            float *out, int simd);

#endif
