/* quant_simd.h — the AVX2 steps the block dot products share (private to kernels/cpu): quant.c's one-row
 * kernels and quant_tile.c's prefill tiles build every block's 8 integer lanes from these and sum an
 * accumulator's lanes with gc_sum8v, so both give the same bits. */
#ifndef KVB_QUANT_SIMD_H
#define KVB_QUANT_SIMD_H

#include <stdint.h>
#include <string.h>

#include "kernels/cpu/ggml_compat.h" /* gc_sum8v: the 8 lanes' sum, in llama.cpp's hsum_float_8 order */

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define KVB_HAVE_AVX2 1

/* 32 nibbles of a 16-byte block as 32 bytes: low nibbles first, then high */
static inline __m256i qs_unpack_nibbles(const uint8_t *qs) {
    const __m128i raw = _mm_loadu_si128((const __m128i *)qs);
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

/* 32 bits as 32 bytes: 0x10 where bit j of qh is set (the fifth bit of 5-bit value j) */
static inline __m256i qs_fifth_bits(const uint8_t *qh) {
    uint32_t b;
    memcpy(&b, qh, 4);
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)b),
                                               _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                                 0x0101010101010101, 0x0000000000000000));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}

/* sum of u8 x i8 products, lane l = elements 4l..4l+3, as 8 floats. Every caller's u is at most 128 (nibbles, or
 * |q| of an int8), so maddubs' int16 pair sums never saturate (|128 x -128 x 2| fits) and VNNI's dpbusd, which sums
 * the same four products into the same int32 lane in one instruction, gives the same integers (llama.cpp takes it
 * too where the CPU has it) */
static inline __m256 qs_dot_u8_i8(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s));
#elif defined(__AVXVNNI__)
    return _mm256_cvtepi32_ps(_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s));
#else
    const __m256i p16 = _mm256_maddubs_epi16(u, s);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
#endif
}

/* i8 x i8 products summed in pairs as 16 int16: |a| times b with a's sign (llama.cpp's mul_add_epi8) */
static inline __m256i qs_maddubs_i8(__m256i a, __m256i b) {
    return _mm256_maddubs_epi16(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
}

/* the int8 scales 2c and 2c+1 of sc (16 of them) as 16 int16: eight times scale 2c, then eight times 2c+1 (the
 * scales of the two 16-value groups of 32-value chunk c, as madd takes them after a maddubs) */
static inline __m256i qs_scale_pair(__m128i sc, int c) {
    const __m128i pick = _mm_or_si128(_mm_set1_epi64x(0x0101010101010101ll * (2 * c)),
                                      _mm_set_epi64x(0x0101010101010101ll, 0));
    return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc, pick));
}

#if defined(__GNUC__)
#define QS_INLINE static inline __attribute__((always_inline))
#else
#define QS_INLINE static inline
#endif

/* a kernel's activation-row count n_act (1-4) as a constant, so its row loop unrolls and its sums stay in
 * registers: call_n(N) is the call for N rows */
#define QS_ROWS_BY_N(call_n, n_act) \
    switch (n_act) {                \
    case 1: call_n(1); break;       \
    case 2: call_n(2); break;       \
    case 3: call_n(3); break;       \
    default: call_n(4); break;      \
    }

/* y[0..31] = (float)q[j] * d for the 32 int8 of q: each int converted exactly and rounded once, as the scalar
 * dequantization loops do (the prefill GEMM dequantizes every weight once per call) */
static inline void qs_dequant_i8x32(float *y, __m256i q, __m256 d) {
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    _mm256_storeu_ps(y, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), d));
    _mm256_storeu_ps(y + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), d));
    _mm256_storeu_ps(y + 16, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), d));
    _mm256_storeu_ps(y + 24, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), d));
}

/* the same with d_lo for q's first 16 values and d_hi for the last 16 (Q6_K's 16-value groups) */
static inline void qs_dequant_i8x32_2(float *y, __m256i q, __m256 d_lo, __m256 d_hi) {
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    _mm256_storeu_ps(y, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), d_lo));
    _mm256_storeu_ps(y + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), d_lo));
    _mm256_storeu_ps(y + 16, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), d_hi));
    _mm256_storeu_ps(y + 24, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), d_hi));
}

/* sum of i8 x i8 products as 8 floats: |a| times b with a's sign */
static inline __m256 qs_dot_i8_i8(__m256i a, __m256i b) {
    return qs_dot_u8_i8(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
}
#endif

#endif
