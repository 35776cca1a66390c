/* quant_lowbit.c — Q2_K, Q3_K (2- and 3-bit K-quants) and the 4-bit non-linear I-quants IQ4_XS (256-value
 * super-blocks) and IQ4_NL (32-value blocks), as ggml's CPU backend dots them: Q2_K, Q3_K and IQ4_XS against
 * Q8_K activations, IQ4_NL against Q8_0 (ggml-cpu quants.c, x86).
 *
 * As in quant_k.c, a block's integer lanes are exact and only the float steps carry an order; the scalar twins
 * take llama.cpp's AVX2 order step for step (ggml_vec_dot_{q2_K,q3_K,iq4_xs}_q8_K, ggml_vec_dot_iq4_nl_q8_0):
 *   Q2_K    per block: acc = fma(-d_y dmin, mins . bsums lanes, acc), then acc = fma(d_y d, lanes, acc)
 *   Q3_K    per block: acc = fma(d_y d, lanes, acc); values (2 low bits | high bit << 2) - 4, scales 6-bit - 32
 *   IQ4_XS  per block: acc = fma(d d_y, lanes, acc); values from the 16-entry table, 6-bit scales - 32
 *   IQ4_NL  blocks two at a time into two accumulators (even, odd), summed lane-wise before the horizontal
 *           sum; an odd last block added after it, sum + (d_y d_x) * integer dot, the product rounded (llama.cpp's
 *           build leaves that add unfused)
 * and every horizontal sum is gc_sum8's. scripts/ggml_dots_check.sh finds llama.cpp's bytes for all four. The
 * quantizers are simple per-group fits for tests and synthetic rows, not ggml's searches (the dots do not
 * depend on how the weights were chosen); real weights come from llama.cpp's quantizer (scripts/requantize.py). */
#include "kernels/cpu/quant_k.h"

#include <math.h>
#include <string.h>

#include "kernels/cpu/ggml_compat.h" /* gc_sum8 */
#include "kernels/cpu/quant_simd.h"

static inline float F(kvb_f16 h) { return kvb_f16_to_f32(h); }

/* a * b rounded to float before the caller adds it: kept from being fused into that add (-ffp-contract=fast) */
static float mul_rounded(float a, float b) {
    volatile float p = a * b;
    return p;
}

/* ggml's kvalues_iq4nl: the 16 levels of IQ4_NL and IQ4_XS */
static const int8_t IQ4_LEVELS[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

int quant_lowbit_has(ggml_type t) {
    return t == GGML_T_Q2_K || t == GGML_T_Q3_K || t == GGML_T_IQ4_XS || t == GGML_T_IQ4_NL;
}

/* ---------- unpacking: the quants in value order, and each 16-value group's scale ---------- */

/* Q2_K: value 128j + 32k + l is bits 2k..2k+1 of qs[32j + l]; group g: scale scales[g] & 15, min scales[g] >> 4 */
static void unpack_q2_K(const block_q2_K *b, int8_t *w) {
    for (int j = 0; j < 2; j++)
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < 32; l++) w[128 * j + 32 * k + l] = (int8_t)((b->qs[32 * j + l] >> (2 * k)) & 3);
}

/* Q3_K: the 2 low bits as Q2_K's, the third from bit 4j + k of hmask[l], minus 4 (so -4..3) */
static void unpack_q3_K(const block_q3_K *b, int8_t *w) {
    for (int j = 0; j < 2; j++)
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < 32; l++) {
                const int lo = (b->qs[32 * j + l] >> (2 * k)) & 3, hi = (b->hmask[l] >> (4 * j + k)) & 1;
                w[128 * j + 32 * k + l] = (int8_t)((lo | hi << 2) - 4);
            }
}

/* Q3_K's sixteen 6-bit scales (minus 32): low nibbles in bytes 0-7, the top two bits packed in bytes 8-11 */
static void q3_K_scales(const uint8_t *q, int8_t sc[16]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = (int8_t)(((q[j] & 0xF) | ((q[8 + j] & 3) << 4)) - 32);
        sc[4 + j] = (int8_t)(((q[4 + j] & 0xF) | (((q[8 + j] >> 2) & 3) << 4)) - 32);
        sc[8 + j] = (int8_t)(((q[j] >> 4) | (((q[8 + j] >> 4) & 3) << 4)) - 32);
        sc[12 + j] = (int8_t)(((q[4 + j] >> 4) | (((q[8 + j] >> 6) & 3) << 4)) - 32);
    }
}

/* inverse of q3_K_scales, from scales + 32 in 0..63 */
static void q3_K_pack_scales(const uint8_t s[16], uint8_t *q) {
    for (int j = 0; j < 4; j++) {
        q[j] = (uint8_t)((s[j] & 0xF) | ((s[8 + j] & 0xF) << 4));
        q[4 + j] = (uint8_t)((s[4 + j] & 0xF) | ((s[12 + j] & 0xF) << 4));
        q[8 + j] = (uint8_t)((s[j] >> 4) | ((s[4 + j] >> 4) << 2) | ((s[8 + j] >> 4) << 4) | ((s[12 + j] >> 4) << 6));
    }
}

/* 16 values of a 4-bit table block: low nibbles are values 0..15, high nibbles 16..31 */
static void unpack_iq4(const uint8_t *qs, int8_t *w) {
    for (int l = 0; l < 16; l++) {
        w[l] = IQ4_LEVELS[qs[l] & 0xF];
        w[l + 16] = IQ4_LEVELS[qs[l] >> 4];
    }
}

/* IQ4_XS: the scale of 32-value chunk c, minus 32 */
static int iq4_xs_scale(const block_iq4_xs *b, int c) {
    return (((b->scales_l[c / 2] >> (4 * (c % 2))) & 0xF) | (((b->scales_h >> (2 * c)) & 3) << 4)) - 32;
}

/* ---------- dequantization (ggml's expressions) ---------- */

void quant_lowbit_dequant_row(ggml_type t, const void *src, float *y, int64_t n) {
    int8_t w[QK_K];
    if (t == GGML_T_IQ4_NL) {
        const block_iq4_nl *b = src;
        for (int64_t i = 0; i < n / QK; i++, y += QK) {
            unpack_iq4(b[i].qs, w);
            const float d = F(b[i].d);
            for (int e = 0; e < QK; e++) y[e] = d * w[e];
        }
        return;
    }
    for (int64_t i = 0; i < n / QK_K; i++, y += QK_K) {
        if (t == GGML_T_Q2_K) {
            const block_q2_K *b = (const block_q2_K *)src + i;
            unpack_q2_K(b, w);
            const float d = F(b->d), dmin = F(b->dmin);
            for (int g = 0; g < 16; g++) {
                const float dl = d * (b->scales[g] & 0xF), ml = dmin * (b->scales[g] >> 4);
                for (int l = 0; l < 16; l++) y[16 * g + l] = dl * w[16 * g + l] - ml;
            }
        } else if (t == GGML_T_Q3_K) {
            const block_q3_K *b = (const block_q3_K *)src + i;
            int8_t sc[16];
            unpack_q3_K(b, w);
            q3_K_scales(b->scales, sc);
            const float d = F(b->d);
            for (int g = 0; g < 16; g++) {
                const float dl = d * sc[g];
                for (int l = 0; l < 16; l++) y[16 * g + l] = dl * w[16 * g + l];
            }
        } else {
            const block_iq4_xs *b = (const block_iq4_xs *)src + i;
            const float d = F(b->d);
            for (int c = 0; c < 8; c++) {
                unpack_iq4(b->qs + 16 * c, w + 32 * c);
                const float dl = d * iq4_xs_scale(b, c);
                for (int l = 0; l < 32; l++) y[32 * c + l] = dl * w[32 * c + l];
            }
        }
    }
}

/* ---------- quantization (simple fits, for tests) ---------- */

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* the index of the table level nearest v */
static int iq4_index(float v) {
    int best = 0;
    for (int k = 1; k < 16; k++)
        if (fabsf(v - IQ4_LEVELS[k]) < fabsf(v - IQ4_LEVELS[best])) best = k;
    return best;
}

/* the 32 values x as table indices for scale ds (value = ds * level) */
static void quantize_iq4_block(const float *x, float ds, uint8_t *qs) {
    for (int l = 0; l < 16; l++) {
        const int a = ds != 0.0f ? iq4_index(x[l] / ds) : 8, b = ds != 0.0f ? iq4_index(x[l + 16] / ds) : 8;
        qs[l] = (uint8_t)(a | b << 4);
    }
}

/* signed extreme of n values (the one of largest magnitude) */
static float signed_max(const float *x, int n) {
    float m = 0.0f;
    for (int l = 0; l < n; l++)
        if (fabsf(x[l]) > fabsf(m)) m = x[l];
    return m;
}

static void quantize_q2_K(const float *x, block_q2_K *b) {
    float sc_f[16], mn_f[16], sc_max = 0.0f, mn_max = 0.0f;
    for (int g = 0; g < 16; g++) {
        float lo = 0.0f, hi = x[16 * g];
        for (int l = 0; l < 16; l++) lo = fminf(lo, x[16 * g + l]), hi = fmaxf(hi, x[16 * g + l]);
        sc_f[g] = (hi - lo) / 3.0f, mn_f[g] = -lo;
        sc_max = fmaxf(sc_max, sc_f[g]), mn_max = fmaxf(mn_max, mn_f[g]);
    }
    b->d = kvb_f32_to_f16(sc_max / 15.0f);
    b->dmin = kvb_f32_to_f16(mn_max / 15.0f);
    const float d = F(b->d), dmin = F(b->dmin);
    memset(b->qs, 0, sizeof b->qs);
    for (int g = 0; g < 16; g++) {
        const int sc = d > 0.0f ? clampi((int)nearbyintf(sc_f[g] / d), 0, 15) : 0;
        const int mn = dmin > 0.0f ? clampi((int)nearbyintf(mn_f[g] / dmin), 0, 15) : 0;
        b->scales[g] = (uint8_t)(sc | mn << 4);
        const float ds = d * sc, ms = dmin * mn;
        for (int l = 0; l < 16; l++) {
            const int e = 16 * g + l, q = ds > 0.0f ? clampi((int)nearbyintf((x[e] + ms) / ds), 0, 3) : 0;
            b->qs[32 * (e / 128) + e % 32] |= (uint8_t)(q << (2 * (e % 128 / 32)));
        }
    }
}

static void quantize_q3_K(const float *x, block_q3_K *b) {
    float s_f[16], s_max = 0.0f;
    for (int g = 0; g < 16; g++) {
        s_f[g] = -signed_max(x + 16 * g, 16) / 4.0f; /* the extreme maps to -4, the far end of -4..3 */
        s_max = fmaxf(s_max, fabsf(s_f[g]));
    }
    b->d = kvb_f32_to_f16(s_max / 31.0f);
    const float d = F(b->d);
    uint8_t s[16];
    memset(b->qs, 0, sizeof b->qs);
    memset(b->hmask, 0, sizeof b->hmask);
    for (int g = 0; g < 16; g++) {
        const int sc = d > 0.0f ? clampi((int)nearbyintf(s_f[g] / d), -32, 31) : 0;
        s[g] = (uint8_t)(sc + 32);
        const float ds = d * sc;
        for (int l = 0; l < 16; l++) {
            const int e = 16 * g + l, q = (ds != 0.0f ? clampi((int)nearbyintf(x[e] / ds), -4, 3) : 0) + 4;
            const int j = e / 128, k = e % 128 / 32;
            b->qs[32 * j + e % 32] |= (uint8_t)((q & 3) << (2 * k));
            b->hmask[e % 32] |= (uint8_t)((q >> 2) << (4 * j + k));
        }
    }
    q3_K_pack_scales(s, b->scales);
}

static void quantize_iq4_xs(const float *x, block_iq4_xs *b) {
    float s_f[8], s_max = 0.0f;
    for (int c = 0; c < 8; c++) {
        s_f[c] = signed_max(x + 32 * c, 32) / IQ4_LEVELS[0];
        s_max = fmaxf(s_max, fabsf(s_f[c]));
    }
    b->d = kvb_f32_to_f16(s_max / 31.0f);
    const float d = F(b->d);
    b->scales_h = 0;
    memset(b->scales_l, 0, sizeof b->scales_l);
    for (int c = 0; c < 8; c++) {
        const int ls = (d > 0.0f ? clampi((int)nearbyintf(s_f[c] / d), -32, 31) : 0) + 32;
        b->scales_l[c / 2] |= (uint8_t)((ls & 0xF) << (4 * (c % 2)));
        b->scales_h |= (uint16_t)((ls >> 4) << (2 * c));
        quantize_iq4_block(x + 32 * c, d * (ls - 32), b->qs + 16 * c);
    }
}

int quant_lowbit_quantize_row(ggml_type t, const float *x, void *dst, int64_t n) {
    switch (t) {
    case GGML_T_IQ4_NL:
        for (int64_t i = 0; i < n / QK; i++, x += QK) {
            block_iq4_nl *b = (block_iq4_nl *)dst + i;
            b->d = kvb_f32_to_f16(signed_max(x, QK) / IQ4_LEVELS[0]);
            quantize_iq4_block(x, F(b->d), b->qs);
        }
        return 0;
    case GGML_T_Q2_K:
        for (int64_t i = 0; i < n / QK_K; i++) quantize_q2_K(x + QK_K * i, (block_q2_K *)dst + i);
        return 0;
    case GGML_T_Q3_K:
        for (int64_t i = 0; i < n / QK_K; i++) quantize_q3_K(x + QK_K * i, (block_q3_K *)dst + i);
        return 0;
    case GGML_T_IQ4_XS:
        for (int64_t i = 0; i < n / QK_K; i++) quantize_iq4_xs(x + QK_K * i, (block_iq4_xs *)dst + i);
        return 0;
    default:
        return -1;
    }
}

/* ---------- scalar dot products (the AVX2 order) ---------- */

static float dot_q2_K_scalar(int64_t n, const block_q2_K *x, const block_q8_K *y) {
    float acc[8] = {0};
    int8_t w[QK_K];
    int16_t sc16[16];
    int32_t lane[8];
    for (int64_t i = 0; i < n / QK_K; i++) {
        unpack_q2_K(&x[i], w);
        for (int g = 0; g < 16; g++) sc16[g] = x[i].scales[g] & 0xF;
        quant_k_lanes(w, sc16, y[i].qs, lane);
        const float d = y[i].d * F(x[i].d), dmin = -y[i].d * F(x[i].dmin);
        const int16_t *bs = y[i].bsums;
        for (int l = 0; l < 8; l++) {
            const int32_t prod = (x[i].scales[2 * l] >> 4) * bs[2 * l] + (x[i].scales[2 * l + 1] >> 4) * bs[2 * l + 1];
            acc[l] = fmaf(dmin, (float)prod, acc[l]);
        }
        for (int l = 0; l < 8; l++) acc[l] = fmaf(d, (float)lane[l], acc[l]);
    }
    return gc_sum8(acc);
}

static float dot_q3_K_scalar(int64_t n, const block_q3_K *x, const block_q8_K *y) {
    float acc[8] = {0};
    int8_t w[QK_K], sc[16];
    int16_t sc16[16];
    int32_t lane[8];
    for (int64_t i = 0; i < n / QK_K; i++) {
        unpack_q3_K(&x[i], w);
        q3_K_scales(x[i].scales, sc);
        for (int g = 0; g < 16; g++) sc16[g] = sc[g];
        quant_k_lanes(w, sc16, y[i].qs, lane);
        const float d = y[i].d * F(x[i].d);
        for (int l = 0; l < 8; l++) acc[l] = fmaf(d, (float)lane[l], acc[l]);
    }
    return gc_sum8(acc);
}

static float dot_iq4_xs_scalar(int64_t n, const block_iq4_xs *x, const block_q8_K *y) {
    float acc[8] = {0};
    int8_t w[QK_K];
    int16_t sc16[16];
    int32_t lane[8];
    for (int64_t i = 0; i < n / QK_K; i++) {
        for (int c = 0; c < 8; c++) {
            unpack_iq4(x[i].qs + 16 * c, w + 32 * c);
            sc16[2 * c] = sc16[2 * c + 1] = (int16_t)iq4_xs_scale(&x[i], c);
        }
        quant_k_lanes(w, sc16, y[i].qs, lane);
        const float d = F(x[i].d) * y[i].d;
        for (int l = 0; l < 8; l++) acc[l] = fmaf(d, (float)lane[l], acc[l]);
    }
    return gc_sum8(acc);
}

static float dot_iq4_nl_scalar(int64_t n, const block_iq4_nl *x, const block_q8_0 *y) {
    float acc[2][8] = {{0}};
    int8_t w[QK];
    const int64_t nb = n / QK;
    int64_t i = 0;
    for (; i + 1 < nb; i += 2)
        for (int h = 0; h < 2; h++) {
            const block_iq4_nl *b = &x[i + h];
            const block_q8_0 *yb = &y[i + h];
            unpack_iq4(b->qs, w);
            for (int l = 0; l < 8; l++) {
                const int e = 4 * l;
                const int32_t s =
                    w[e] * yb->qs[e] + w[e + 1] * yb->qs[e + 1] + w[e + 2] * yb->qs[e + 2] + w[e + 3] * yb->qs[e + 3];
                acc[h][l] = fmaf(F(yb->d) * F(b->d), (float)s, acc[h][l]);
            }
        }
    float lanes[8];
    for (int l = 0; l < 8; l++) lanes[l] = acc[0][l] + acc[1][l];
    float sum = gc_sum8(lanes);
    for (; i < nb; i++) {
        unpack_iq4(x[i].qs, w);
        int32_t s = 0;
        for (int e = 0; e < QK; e++) s += w[e] * y[i].qs[e];
        sum += mul_rounded(F(y[i].d) * F(x[i].d), (float)s);
    }
    return sum;
}

/* ---------- AVX2 ---------- */
#if KVB_HAVE_AVX2
/* Q2_K (Q3 = 0) or Q3_K (Q3 = 1) against N activation rows: each 32-value chunk's quants built once */
QS_INLINE void rows_q23_K(const int Q3, const int N, int64_t n, const void *vx, const uint8_t *act, size_t stride,
                          float *out) {
    __m256 acc[4];
    for (int a = 0; a < N; a++) acc[a] = _mm256_setzero_ps();
    const __m256i m3 = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
    for (int64_t i = 0; i < n / QK_K; i++) {
        const block_q2_K *b2 = (const block_q2_K *)vx + i;
        const block_q3_K *b3 = (const block_q3_K *)vx + i;
        __m128i sc8;
        float dx;
        if (Q3) {
            int8_t sc[16];
            q3_K_scales(b3->scales, sc);
            sc8 = _mm_loadu_si128((const __m128i *)sc);
            dx = F(b3->d);
        } else {
            const __m128i raw = _mm_loadu_si128((const __m128i *)b2->scales);
            sc8 = _mm_and_si128(raw, _mm_set1_epi8(0xF));
            const __m256i mins = _mm256_cvtepi8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0xF)));
            const float dminx = F(b2->dmin);
            for (int a = 0; a < N; a++) {
                const block_q8_K *y = (const block_q8_K *)(act + a * stride) + i;
                const __m256i prod = _mm256_madd_epi16(mins, _mm256_loadu_si256((const __m256i *)y->bsums));
                acc[a] = _mm256_fmadd_ps(_mm256_set1_ps(-y->d * dminx), _mm256_cvtepi32_ps(prod), acc[a]);
            }
            dx = F(b2->d);
        }
        const uint8_t *qs = Q3 ? b3->qs : b2->qs;
        const __m256i hbits = Q3 ? _mm256_loadu_si256((const __m256i *)b3->hmask) : _mm256_setzero_si256();
        __m256i sumi[4];
        for (int a = 0; a < N; a++) sumi[a] = _mm256_setzero_si256();
        for (int j = 0; j < 2; j++) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
            for (int k = 0; k < 4; k++) {
                const int c = 4 * j + k;
                const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * k), m3);
                /* Q3_K: 4 where the high bit is clear, taken off after the maddubs (llama.cpp's split) */
                const __m256i h4 = Q3 ? _mm256_andnot_si256(_mm256_slli_epi16(_mm256_srli_epi16(hbits, c), 2), four)
                                      : _mm256_setzero_si256();
                const __m256i scale = qs_scale_pair(sc8, c);
                for (int a = 0; a < N; a++) {
                    const __m256i yq =
                        _mm256_loadu_si256((const __m256i *)(((const block_q8_K *)(act + a * stride) + i)->qs + 32 * c));
                    __m256i p16 = _mm256_maddubs_epi16(lo, yq);
                    if (Q3) p16 = _mm256_sub_epi16(p16, _mm256_maddubs_epi16(h4, yq));
                    sumi[a] = _mm256_add_epi32(sumi[a], _mm256_madd_epi16(scale, p16));
                }
            }
        }
        for (int a = 0; a < N; a++) {
            const block_q8_K *y = (const block_q8_K *)(act + a * stride) + i;
            acc[a] = _mm256_fmadd_ps(_mm256_set1_ps(y->d * dx), _mm256_cvtepi32_ps(sumi[a]), acc[a]);
        }
    }
    for (int a = 0; a < N; a++) out[a] = gc_sum8v(acc[a]);
}

/* the 32 table values of a 16-byte IQ4 block: low nibbles, then high */
static inline __m256i iq4_values(const uint8_t *qs) {
    const __m128i levels = _mm_loadu_si128((const __m128i *)IQ4_LEVELS), m4 = _mm_set1_epi8(0xF);
    const __m128i bits = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_set_m128i(_mm_shuffle_epi8(levels, _mm_and_si128(_mm_srli_epi16(bits, 4), m4)),
                            _mm_shuffle_epi8(levels, _mm_and_si128(bits, m4)));
}

QS_INLINE void rows_iq4_xs(const int N, int64_t n, const block_iq4_xs *x, const uint8_t *act, size_t stride,
                           float *out) {
    __m256 acc[4];
    for (int a = 0; a < N; a++) acc[a] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        __m256i sumi[4];
        for (int a = 0; a < N; a++) sumi[a] = _mm256_setzero_si256();
        for (int c = 0; c < 8; c++) {
            const __m256i q = iq4_values(x[i].qs + 16 * c), scale = _mm256_set1_epi16((short)iq4_xs_scale(&x[i], c));
            for (int a = 0; a < N; a++) {
                const __m256i yq =
                    _mm256_loadu_si256((const __m256i *)(((const block_q8_K *)(act + a * stride) + i)->qs + 32 * c));
                sumi[a] = _mm256_add_epi32(sumi[a], _mm256_madd_epi16(qs_maddubs_i8(q, yq), scale));
            }
        }
        const float dx = F(x[i].d);
        for (int a = 0; a < N; a++) {
            const block_q8_K *y = (const block_q8_K *)(act + a * stride) + i;
            acc[a] = _mm256_fmadd_ps(_mm256_set1_ps(dx * y->d), _mm256_cvtepi32_ps(sumi[a]), acc[a]);
        }
    }
    for (int a = 0; a < N; a++) out[a] = gc_sum8v(acc[a]);
}

QS_INLINE void rows_iq4_nl(const int N, int64_t n, const block_iq4_nl *x, const uint8_t *act, size_t stride,
                           float *out) {
    __m256 acc[4][2];
    for (int a = 0; a < N; a++) acc[a][0] = acc[a][1] = _mm256_setzero_ps();
    const __m256i one = _mm256_set1_epi16(1);
    const int64_t nb = n / QK;
    int64_t i = 0;
    for (; i + 1 < nb; i += 2)
        for (int h = 0; h < 2; h++) {
            const __m256i q = iq4_values(x[i + h].qs);
            const float dx = F(x[i + h].d);
            for (int a = 0; a < N; a++) {
                const block_q8_0 *y = (const block_q8_0 *)(act + a * stride) + i + h;
                const __m256i p = _mm256_madd_epi16(qs_maddubs_i8(q, _mm256_loadu_si256((const __m256i *)y->qs)), one);
                acc[a][h] = _mm256_fmadd_ps(_mm256_set1_ps(F(y->d) * dx), _mm256_cvtepi32_ps(p), acc[a][h]);
            }
        }
    int8_t w[QK];
    if (i < nb) unpack_iq4(x[i].qs, w);
    for (int a = 0; a < N; a++) {
        float sum = gc_sum8v(_mm256_add_ps(acc[a][0], acc[a][1]));
        if (i < nb) {
            const block_q8_0 *y = (const block_q8_0 *)(act + a * stride) + i;
            int32_t s = 0;
            for (int e = 0; e < QK; e++) s += w[e] * y->qs[e];
            sum += mul_rounded(F(y->d) * F(x[i].d), (float)s);
        }
        out[a] = sum;
    }
}
#endif

void quant_lowbit_dot_multi(ggml_type t, int64_t n, const void *w, const void *act, size_t stride, int n_act,
                            float *out, int simd) {
#if KVB_HAVE_AVX2
    if (simd) {
        const uint8_t *a8 = act;
        switch (t) {
#define CALL(N) rows_q23_K(0, N, n, w, a8, stride, out)
        case GGML_T_Q2_K: QS_ROWS_BY_N(CALL, n_act) return;
#undef CALL
#define CALL(N) rows_q23_K(1, N, n, w, a8, stride, out)
        case GGML_T_Q3_K: QS_ROWS_BY_N(CALL, n_act) return;
#undef CALL
#define CALL(N) rows_iq4_xs(N, n, w, a8, stride, out)
        case GGML_T_IQ4_XS: QS_ROWS_BY_N(CALL, n_act) return;
#undef CALL
#define CALL(N) rows_iq4_nl(N, n, w, a8, stride, out)
        case GGML_T_IQ4_NL: QS_ROWS_BY_N(CALL, n_act) return;
#undef CALL
        default: break;
        }
    }
#else
    (void)simd;
#endif
    for (int a = 0; a < n_act; a++) {
        const void *y = (const uint8_t *)act + a * stride;
        switch (t) {
        case GGML_T_Q2_K: out[a] = dot_q2_K_scalar(n, w, y); break;
        case GGML_T_Q3_K: out[a] = dot_q3_K_scalar(n, w, y); break;
        case GGML_T_IQ4_XS: out[a] = dot_iq4_xs_scalar(n, w, y); break;
        case GGML_T_IQ4_NL: out[a] = dot_iq4_nl_scalar(n, w, y); break;
        default: out[a] = 0.0f;
        }
    }
}
