/* quant_tile.c — prefill's micro-kernels: QUANT_TILE_ROWS weight rows x QUANT_TILE_TOK tokens per call
 * (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 weights).
 *
 * A one-row kernel spends most of its time on what a GEMM can share: unpacking a weight block, loading an
 * activation block, converting the f16 scales of both and multiplying them. Here a weight block is
 * unpacked once for four tokens, an activation block loaded once for two rows, the activations' scales
 * come as floats (converted once per matmul call, quant_tile_scales), the eight products d_w * d_y of a
 * block take one vector multiply and the eight minimum terms m_w * s_y one fused multiply-add; the eight
 * outputs' accumulators stay in registers.
 *
 * Every output keeps the one-row kernel's operations, in its order, on the same lane values: per block,
 * the integer lanes of qs_dot_*, one fma with the same rounded d_w * d_y, the same qs_hsum at the end,
 * then + the minimum sum (a chain of exact products of two halves, so fused and unfused adds agree). */
#include "kernels/cpu/quant.h"

#include <stddef.h>
#include <string.h>

#include "kernels/cpu/quant_simd.h"

static inline float F(kvb_f16 h) { return kvb_f16_to_f32(h); }

static int has_min(ggml_type t) { return t == GGML_T_Q4_1 || t == GGML_T_Q5_1; }

int quant_tile_scale_floats(ggml_type t) {
    switch (t) {
    case GGML_T_Q4_0: case GGML_T_Q5_0: case GGML_T_Q8_0: return QUANT_TILE_TOK;
    case GGML_T_Q4_1: case GGML_T_Q5_1: return 2 * QUANT_TILE_TOK;
    default: return 0;
    }
}

void quant_tile_scales(ggml_type t, const void *act_row, int64_t n, float *group_scales, int slot) {
    const int per_block = quant_tile_scale_floats(t);
    if (has_min(t)) {
        const block_q8_1 *y = act_row;
        for (int64_t i = 0; i < n / QK; i++) {
            group_scales[i * per_block + slot] = F(y[i].d);
            group_scales[i * per_block + QUANT_TILE_TOK + slot] = F(y[i].s);
        }
    } else if (per_block) {
        const block_q8_0 *y = act_row;
        for (int64_t i = 0; i < n / QK; i++) group_scales[i * per_block + slot] = F(y[i].d);
    }
}

#if KVB_HAVE_AVX2
#if defined(__GNUC__)
#define QT_INLINE static inline __attribute__((always_inline))
#else
#define QT_INLINE static inline
#endif

static size_t block_bytes(ggml_type t) {
    switch (t) {
    case GGML_T_Q4_0: return sizeof(block_q4_0);
    case GGML_T_Q4_1: return sizeof(block_q4_1);
    case GGML_T_Q5_0: return sizeof(block_q5_0);
    case GGML_T_Q5_1: return sizeof(block_q5_1);
    default: return sizeof(block_q8_0);
    }
}

/* a weight block's 32 quants in value order as bytes: unsigned for Q4_1/Q5_1, signed (q - offset) else */
QT_INLINE __m256i unpack_block(ggml_type t, const uint8_t *blk) {
    switch (t) {
    case GGML_T_Q4_0:
        return _mm256_sub_epi8(qs_unpack_nibbles(((const block_q4_0 *)blk)->qs), _mm256_set1_epi8(8));
    case GGML_T_Q4_1: return qs_unpack_nibbles(((const block_q4_1 *)blk)->qs);
    case GGML_T_Q5_0: {
        const block_q5_0 *b = (const block_q5_0 *)blk;
        return _mm256_sub_epi8(_mm256_or_si256(qs_unpack_nibbles(b->qs), qs_fifth_bits(b->qh)), _mm256_set1_epi8(16));
    }
    case GGML_T_Q5_1: {
        const block_q5_1 *b = (const block_q5_1 *)blk;
        return _mm256_or_si256(qs_unpack_nibbles(b->qs), qs_fifth_bits(b->qh));
    }
    default: return _mm256_loadu_si256((const __m256i *)((const block_q8_0 *)blk)->qs);
    }
}

/* one token of the tile: its activation block y against both rows' quants, into the rows' accumulators */
QT_INLINE void token_step(int mins, const __m256i q[2], const __m256i aq[2], __m256i y, const float *dd, int k,
                          __m256 *acc0, __m256 *acc1) {
    *acc0 = _mm256_fmadd_ps(_mm256_broadcast_ss(dd + k), qs_dot_u8_i8(aq[0], mins ? y : _mm256_sign_epi8(y, q[0])), *acc0);
    *acc1 = _mm256_fmadd_ps(_mm256_broadcast_ss(dd + QUANT_TILE_TOK + k),
                            qs_dot_u8_i8(aq[1], mins ? y : _mm256_sign_epi8(y, q[1])), *acc1);
}

/* one type's tile; `t` is a constant at each call, so the type tests fold away. The eight accumulators are
 * named variables: as an array, GCC stores them back every block. */
QT_INLINE void tile(ggml_type t, int64_t nb, const uint8_t *w, size_t w_stride, const uint8_t *act,
                    size_t act_stride, const float *sc, float *out, size_t out_stride) {
    enum { T = QUANT_TILE_TOK };
    const int mins = has_min(t), per_block = quant_tile_scale_floats(t);
    const size_t wb = block_bytes(t), ab = mins ? sizeof(block_q8_1) : sizeof(block_q8_0);
    const uint8_t *y0 = act + (mins ? offsetof(block_q8_1, qs) : offsetof(block_q8_0, qs));
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    __m256 msum = a00;
    _Alignas(32) float dd[2 * T];
    for (int64_t i = 0; i < nb; i++) {
        __m256i q[2], aq[2];
        kvb_f16 dw[2], mw[2] = {0};
        for (int r = 0; r < 2; r++) {
            const uint8_t *blk = w + r * w_stride + i * wb;
            q[r] = unpack_block(t, blk);
            aq[r] = mins ? q[r] : _mm256_sign_epi8(q[r], q[r]);
            memcpy(&dw[r], blk, sizeof dw[r]);
            if (mins) memcpy(&mw[r], blk + sizeof(kvb_f16), sizeof mw[r]);
        }
        /* lane 4r + k: d_w(row r) * d_y(token k), and m_w(row r) * s_y(token k) */
        const __m128 dy = _mm_loadu_ps(sc + i * per_block);
        const __m256 dwv = _mm256_set_m128(_mm_set1_ps(F(dw[1])), _mm_set1_ps(F(dw[0])));
        _mm256_store_ps(dd, _mm256_mul_ps(dwv, _mm256_set_m128(dy, dy)));
        if (mins) {
            const __m128 sy = _mm_loadu_ps(sc + i * per_block + T);
            const __m256 mwv = _mm256_set_m128(_mm_set1_ps(F(mw[1])), _mm_set1_ps(F(mw[0])));
            msum = _mm256_fmadd_ps(mwv, _mm256_set_m128(sy, sy), msum);
        }
        const uint8_t *y = y0 + i * ab;
        token_step(mins, q, aq, _mm256_loadu_si256((const __m256i *)y), dd, 0, &a00, &a10);
        token_step(mins, q, aq, _mm256_loadu_si256((const __m256i *)(y + act_stride)), dd, 1, &a01, &a11);
        token_step(mins, q, aq, _mm256_loadu_si256((const __m256i *)(y + 2 * act_stride)), dd, 2, &a02, &a12);
        token_step(mins, q, aq, _mm256_loadu_si256((const __m256i *)(y + 3 * act_stride)), dd, 3, &a03, &a13);
    }
    const __m256 acc[2][T] = {{a00, a01, a02, a03}, {a10, a11, a12, a13}};
    _Alignas(32) float ms[2 * T];
    _mm256_store_ps(ms, msum);
    for (int r = 0; r < 2; r++)
        for (int k = 0; k < T; k++)
            out[k * out_stride + r] = mins ? gc_sum8v(acc[r][k]) + ms[T * r + k] : gc_sum8v(acc[r][k]);
}
#endif

int quant_vec_dot_tile(ggml_type t, int64_t n, const void *w, size_t w_stride, const void *act, size_t act_stride,
                       const float *group_scales, float *out, size_t out_stride) {
#if KVB_HAVE_AVX2
    if (quant_scalar_forced()) return -1;
    const int64_t nb = n / QK;
    switch (t) {
    case GGML_T_Q4_0: tile(GGML_T_Q4_0, nb, w, w_stride, act, act_stride, group_scales, out, out_stride); return 0;
    case GGML_T_Q4_1: tile(GGML_T_Q4_1, nb, w, w_stride, act, act_stride, group_scales, out, out_stride); return 0;
    case GGML_T_Q5_0: tile(GGML_T_Q5_0, nb, w, w_stride, act, act_stride, group_scales, out, out_stride); return 0;
    case GGML_T_Q5_1: tile(GGML_T_Q5_1, nb, w, w_stride, act, act_stride, group_scales, out, out_stride); return 0;
    case GGML_T_Q8_0: tile(GGML_T_Q8_0, nb, w, w_stride, act, act_stride, group_scales, out, out_stride); return 0;
    default: return -1;
    }
#else
    (void)t, (void)n, (void)w, (void)w_stride, (void)act, (void)act_stride, (void)group_scales, (void)out,
        (void)out_stride;
    return -1;
#endif
}
