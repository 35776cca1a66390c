/* quant.h — ggml's block formats, dequantization, activation quantization and dot products.
 *
 * Weights stay quantized; before a matmul the activation row is quantized once to the
 * weight type's activation format, exactly as ggml's CPU backend does (Q4_0/Q5_0/Q8_0/IQ4_NL
 * weights -> Q8_0, Q4_1/Q5_1 -> Q8_1, Q2_K..Q6_K/IQ4_XS -> Q8_K, F16 -> F16, BF16/F32 -> F32),
 * and the dot product is integer per block, then scaled in llama.cpp's float order.
 * Matching ggml's activation rounding and order is what keeps our logits next to
 * llama.cpp's. The K-quants live in quant_k.c, Q2_K, Q3_K and the 4-bit I-quants in quant_lowbit.c. */
#ifndef KVB_QUANT_H
#define KVB_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/dtype.h"

#define QK 32
#define QK_K 256

typedef struct { kvb_f16 d; uint8_t qs[QK / 2]; } block_q4_0;
typedef struct { kvb_f16 d, m; uint8_t qs[QK / 2]; } block_q4_1;
typedef struct { kvb_f16 d; uint8_t qh[4]; uint8_t qs[QK / 2]; } block_q5_0; /* qh: bit j = 5th bit of value j */
typedef struct { kvb_f16 d, m; uint8_t qh[4]; uint8_t qs[QK / 2]; } block_q5_1;
typedef struct { kvb_f16 d; int8_t qs[QK]; } block_q8_0;
typedef struct { kvb_f16 d, s; int8_t qs[QK]; } block_q8_1; /* s = d * sum(qs) */
typedef struct { kvb_f16 d, dmin; uint8_t scales[12]; uint8_t qs[QK_K / 2]; } block_q4_K;
typedef struct { kvb_f16 d, dmin; uint8_t scales[12]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; } block_q5_K;
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; kvb_f16 d; } block_q6_K;
typedef struct { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; kvb_f16 d, dmin; } block_q2_K; /* scale | min << 4 */
typedef struct { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; kvb_f16 d; } block_q3_K;
typedef struct { kvb_f16 d; uint8_t qs[QK / 2]; } block_iq4_nl; /* 4-bit indices into a 16-value table */
typedef struct { kvb_f16 d; uint16_t scales_h; uint8_t scales_l[QK_K / 64]; uint8_t qs[QK_K / 2]; } block_iq4_xs;
/* activations for K-quant weights: d = amax / -127 (float), bsums[g] = sum of qs over group g of 16 */
typedef struct { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; } block_q8_K;

_Static_assert(sizeof(block_q4_0) == 18, "q4_0 layout");
_Static_assert(sizeof(block_q4_1) == 20, "q4_1 layout");
_Static_assert(sizeof(block_q5_0) == 22, "q5_0 layout");
_Static_assert(sizeof(block_q5_1) == 24, "q5_1 layout");
_Static_assert(sizeof(block_q8_0) == 34, "q8_0 layout");
_Static_assert(sizeof(block_q8_1) == 36, "q8_1 layout");
_Static_assert(sizeof(block_q4_K) == 144, "q4_K layout");
_Static_assert(sizeof(block_q5_K) == 176, "q5_K layout");
_Static_assert(sizeof(block_q6_K) == 210, "q6_K layout");
_Static_assert(sizeof(block_q8_K) == 292, "q8_K layout");
_Static_assert(sizeof(block_q2_K) == 84, "q2_K layout");
_Static_assert(sizeof(block_q3_K) == 110, "q3_K layout");
_Static_assert(sizeof(block_iq4_nl) == 18, "iq4_nl layout");
_Static_assert(sizeof(block_iq4_xs) == 136, "iq4_xs layout");

/* Dequantize n elements (a multiple of the block size) of type t. */
void quant_dequant_row(ggml_type t, const void *src, float *dst, int64_t n);
/* Quantize n floats to a weight type (round to nearest; for tests and synthetic models). 0 = ok, -1 = unsupported. */
int quant_quantize_row(ggml_type t, const float *src, void *dst, int64_t n);
/* Activation format used with weights of type t. */
ggml_type quant_act_type(ggml_type weight_type);
/* Bytes of one activation row of n elements for weights of type t. */
size_t quant_act_row_bytes(ggml_type weight_type, int64_t n);
/* Quantize an activation row x[n] into dst, in the activation format of weight_type. */
void quant_act_quantize(ggml_type weight_type, const float *x, void *dst, int64_t n);
/* Dot product of one weight row and one activation row (both n elements). */
float quant_vec_dot(ggml_type weight_type, int64_t n, const void *w_row, const void *act_row);
/* Dot of one weight row with n_act activation rows (stride act_stride bytes): out[j]. n_act <= 4. */
void quant_vec_dot_multi(ggml_type weight_type, int64_t n, const void *w_row, const void *act, size_t act_stride,
                         int n_act, float *out);
/* Force the portable scalar kernels (1) or allow SIMD (0); for tests. */
void quant_force_scalar(int on);
/* 1 while quant_force_scalar is on. */
int quant_scalar_forced(void);

/* Prefill tiles (quant_tile.c): QUANT_TILE_ROWS weight rows x QUANT_TILE_TOK activation rows per call, each
 * output bitwise equal to quant_vec_dot's. The activations' block scales come as floats, per group of
 * QUANT_TILE_TOK tokens: block i's floats start at i * quant_tile_scale_floats(), d_y of token slot k at
 * + k, and (Q8_1) s_y at + QUANT_TILE_TOK + k. */
enum { QUANT_TILE_ROWS = 2, QUANT_TILE_TOK = 4 };
/* Floats of a token group's scales per weight block; 0 when weight_type has no tile. */
int quant_tile_scale_floats(ggml_type weight_type);
/* Write the scales of one quantized activation row (n elements) into token slot `slot` of its group. */
void quant_tile_scales(ggml_type weight_type, const void *act_row, int64_t n, float *group_scales, int slot);
/* out[k * out_stride + r] = w row r (w_stride bytes apart) . activation row k (act_stride apart), for
 * r < QUANT_TILE_ROWS, k < QUANT_TILE_TOK. 0 = done; -1 = no tile for the type here (or scalar kernels
 * forced): nothing written. */
int quant_vec_dot_tile(ggml_type weight_type, int64_t n, const void *w, size_t w_stride, const void *act,
                       size_t act_stride, const float *group_scales, float *out, size_t out_stride);

#endif
