/* quant.c — block formats of ggml (see quant.h). The scalar kernels are the
 * reference and are always compiled; AVX2 versions of the hot pairs (Q4_1 x Q8_1,
 * Q8_0 x Q8_0, Q4_0 x Q8_0) are used when the compiler targets AVX2, and give the
 * same bits as the scalar ones. */
#include "engine/quant.h"

#include <math.h>
#include <string.h>

#include "kernels/cpu/ggml_compat.h" /* gc_sum8 */
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define KVB_HAVE_AVX2 1
#endif

static int g_force_scalar;
void quant_force_scalar(int on) { g_force_scalar = on; }

static inline float F(kvb_f16 h) { return kvb_f16_to_f32(h); }

/* ---------- dequantization ---------- */

static void get_scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

static void dequant_q4_K_block(const block_q4_K *b, float *y) {
    const float d = F(b->d), min = F(b->dmin);
    const uint8_t *q = b->qs;
    int is = 0;
    for (int j = 0; j < QK_K; j += 64) {
        uint8_t sc, m;
        get_scale_min_k4(is, b->scales, &sc, &m);
        const float d1 = d * sc, m1 = min * m;
        get_scale_min_k4(is + 1, b->scales, &sc, &m);
        const float d2 = d * sc, m2 = min * m;
        for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0xF) - m1;
        for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
        q += 32;
        is += 2;
    }
}

static void dequant_q6_K_block(const block_q6_K *b, float *y) {
    const float d = F(b->d);
    const uint8_t *ql = b->ql, *qh = b->qh;
    const int8_t *sc = b->scales;
    for (int n = 0; n < QK_K; n += 128) {
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = (int)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            int q2 = (int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * sc[is] * q1;
            y[l + 32] = d * sc[is + 2] * q2;
            y[l + 64] = d * sc[is + 4] * q3;
            y[l + 96] = d * sc[is + 6] * q4;
        }
        y += 128;
        ql += 64;
        qh += 32;
        sc += 8;
    }
}

void quant_dequant_row(ggml_type t, const void *src, float *y, int64_t n) {
    switch (t) {
    case GGML_T_F32:
        memcpy(y, src, (size_t)n * sizeof(float));
        return;
    case GGML_T_F16: {
        const kvb_f16 *s = src;
        for (int64_t i = 0; i < n; i++) y[i] = F(s[i]);
        return;
    }
    case GGML_T_BF16: {
        const kvb_bf16 *s = src;
        for (int64_t i = 0; i < n; i++) y[i] = kvb_bf16_to_f32(s[i]);
        return;
    }
    case GGML_T_Q4_0: {
        const block_q4_0 *b = src;
        for (int64_t i = 0; i < n / QK; i++, y += QK) {
            const float d = F(b[i].d);
            for (int j = 0; j < QK / 2; j++) {
                y[j] = ((b[i].qs[j] & 0xF) - 8) * d;
                y[j + QK / 2] = ((b[i].qs[j] >> 4) - 8) * d;
            }
        }
        return;
    }
    case GGML_T_Q4_1: {
        const block_q4_1 *b = src;
        for (int64_t i = 0; i < n / QK; i++, y += QK) {
            const float d = F(b[i].d), m = F(b[i].m);
            for (int j = 0; j < QK / 2; j++) {
                y[j] = (b[i].qs[j] & 0xF) * d + m;
                y[j + QK / 2] = (b[i].qs[j] >> 4) * d + m;
            }
        }
        return;
    }
    case GGML_T_Q5_0: {
        const block_q5_0 *b = src;
        for (int64_t i = 0; i < n / QK; i++, y += QK) {
            const float d = F(b[i].d);
            uint32_t qh;
            memcpy(&qh, b[i].qh, 4);
            for (int j = 0; j < QK / 2; j++) {
                const uint8_t h0 = (uint8_t)(((qh >> j) << 4) & 0x10), h1 = (uint8_t)((qh >> (j + 12)) & 0x10);
                y[j] = ((int)((b[i].qs[j] & 0xF) | h0) - 16) * d;
                y[j + QK / 2] = ((int)((b[i].qs[j] >> 4) | h1) - 16) * d;
            }
        }
        return;
    }
    case GGML_T_Q8_0: {
        const block_q8_0 *b = src;
        for (int64_t i = 0; i < n / QK; i++, y += QK) {
            const float d = F(b[i].d);
            for (int j = 0; j < QK; j++) y[j] = b[i].qs[j] * d;
        }
        return;
    }
    case GGML_T_Q8_1: {
        const block_q8_1 *b = src;
        for (int64_t i = 0; i < n / QK; i++, y += QK) {
            const float d = F(b[i].d);
            for (int j = 0; j < QK; j++) y[j] = b[i].qs[j] * d;
        }
        return;
    }
    case GGML_T_Q4_K: {
        const block_q4_K *b = src;
        for (int64_t i = 0; i < n / QK_K; i++) dequant_q4_K_block(&b[i], y + i * QK_K);
        return;
    }
    case GGML_T_Q6_K: {
        const block_q6_K *b = src;
        for (int64_t i = 0; i < n / QK_K; i++) dequant_q6_K_block(&b[i], y + i * QK_K);
        return;
    }
    default:
        memset(y, 0, (size_t)n * sizeof(float));
    }
}

/* ---------- quantization ---------- */

static void quantize_q8_0(const float *x, block_q8_0 *y, int64_t n) {
    for (int64_t i = 0; i < n / QK; i++, x += QK) {
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(x[j]));
        /* ggml's SIMD quantizer (the one llama.cpp runs on x86): id = 127/amax, ties to even */
        const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
        y[i].d = kvb_f32_to_f16(d);
        for (int j = 0; j < QK; j++) y[i].qs[j] = (int8_t)nearbyintf(x[j] * id);
    }
}

static void quantize_q8_1(const float *x, block_q8_1 *y, int64_t n) {
    for (int64_t i = 0; i < n / QK; i++, x += QK) {
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
        y[i].d = kvb_f32_to_f16(d);
        int sum = 0;
        for (int j = 0; j < QK; j++) {
            y[i].qs[j] = (int8_t)nearbyintf(x[j] * id);
            sum += y[i].qs[j];
        }
        y[i].s = kvb_f32_to_f16(d * (float)sum);
    }
}

int quant_quantize_row(ggml_type t, const float *x, void *dst, int64_t n) {
    switch (t) {
    case GGML_T_F32:
        memcpy(dst, x, (size_t)n * sizeof(float));
        return 0;
    case GGML_T_F16: {
        kvb_f16 *y = dst;
        for (int64_t i = 0; i < n; i++) y[i] = kvb_f32_to_f16(x[i]);
        return 0;
    }
    case GGML_T_Q8_0:
        quantize_q8_0(x, dst, n);
        return 0;
    case GGML_T_Q8_1:
        quantize_q8_1(x, dst, n);
        return 0;
    case GGML_T_Q4_0: {
        block_q4_0 *y = dst;
        for (int64_t i = 0; i < n / QK; i++, x += QK) {
            float amax = 0.0f, max = 0.0f;
            for (int j = 0; j < QK; j++)
                if (fabsf(x[j]) > amax) amax = fabsf(x[j]), max = x[j];
            const float d = max / -8.0f, id = d ? 1.0f / d : 0.0f;
            y[i].d = kvb_f32_to_f16(d);
            for (int j = 0; j < QK / 2; j++) {
                int a = (int)(x[j] * id + 8.5f), b = (int)(x[j + QK / 2] * id + 8.5f);
                a = a > 15 ? 15 : a;
                b = b > 15 ? 15 : b;
                y[i].qs[j] = (uint8_t)(a | (b << 4));
            }
        }
        return 0;
    }
    case GGML_T_Q4_1: {
        block_q4_1 *y = dst;
        for (int64_t i = 0; i < n / QK; i++, x += QK) {
            float mn = x[0], mx = x[0];
            for (int j = 1; j < QK; j++) mn = fminf(mn, x[j]), mx = fmaxf(mx, x[j]);
            const float d = (mx - mn) / 15.0f, id = d ? 1.0f / d : 0.0f;
            y[i].d = kvb_f32_to_f16(d);
            y[i].m = kvb_f32_to_f16(mn);
            for (int j = 0; j < QK / 2; j++) {
                int a = (int)((x[j] - mn) * id + 0.5f), b = (int)((x[j + QK / 2] - mn) * id + 0.5f);
                a = a > 15 ? 15 : a;
                b = b > 15 ? 15 : b;
                y[i].qs[j] = (uint8_t)(a | (b << 4));
            }
        }
        return 0;
    }
    case GGML_T_Q5_0: {
        block_q5_0 *y = dst;
        for (int64_t i = 0; i < n / QK; i++, x += QK) {
            float amax = 0.0f, max = 0.0f;
            for (int j = 0; j < QK; j++)
                if (fabsf(x[j]) > amax) amax = fabsf(x[j]), max = x[j];
            const float d = max / -16.0f, id = d ? 1.0f / d : 0.0f;
            y[i].d = kvb_f32_to_f16(d);
            uint32_t qh = 0;
            for (int j = 0; j < QK / 2; j++) {
                int a = (int)(x[j] * id + 16.5f), b = (int)(x[j + QK / 2] * id + 16.5f);
                a = a > 31 ? 31 : a;
                b = b > 31 ? 31 : b;
                y[i].qs[j] = (uint8_t)((a & 0xF) | ((b & 0xF) << 4));
                qh |= (uint32_t)((a & 0x10) >> 4) << j;
                qh |= (uint32_t)((b & 0x10) >> 4) << (j + QK / 2);
            }
            memcpy(y[i].qh, &qh, 4);
        }
        return 0;
    }
    default:
        return -1;
    }
}

ggml_type quant_act_type(ggml_type t) {
    switch (t) {
    case GGML_T_Q4_0: case GGML_T_Q5_0: case GGML_T_Q8_0: return GGML_T_Q8_0;
    case GGML_T_Q4_1: return GGML_T_Q8_1;
    case GGML_T_F16: return GGML_T_F16;
    default: return GGML_T_F32;
    }
}

size_t quant_act_row_bytes(ggml_type t, int64_t n) {
    switch (quant_act_type(t)) {
    case GGML_T_Q8_0: return (size_t)(n / QK) * sizeof(block_q8_0);
    case GGML_T_Q8_1: return (size_t)(n / QK) * sizeof(block_q8_1);
    case GGML_T_F16: return (size_t)n * sizeof(kvb_f16);
    default: return (size_t)n * sizeof(float);
    }
}

void quant_act_quantize(ggml_type t, const float *x, void *dst, int64_t n) {
    quant_quantize_row(quant_act_type(t), x, dst, n);
}

/* ---------- scalar dot products ---------- */

/* Q4_0, Q4_1 and Q8_0 follow the AVX2 kernels' (and llama.cpp's) float order, so scalar builds give
 * the same bits: lane l of a block holds the integer dot of elements 4l..4l+3, each lane accumulates
 * scale x lane in a fused multiply-add chain over the blocks, and the 8 lanes are summed at the end. */
static void acc_lanes(float acc[8], float d, const int8_t *w, const int8_t *y) {
    for (int l = 0; l < 8; l++) {
        int s = 0;
        for (int e = 4 * l; e < 4 * l + 4; e++) s += w[e] * y[e];
        acc[l] = fmaf(d, (float)s, acc[l]);
    }
}

/* the 32 weights of a 4-bit block (low nibbles, then high), minus offset */
static void unpack_q4(const uint8_t *qs, int offset, int8_t *w) {
    for (int j = 0; j < QK / 2; j++) {
        w[j] = (int8_t)((qs[j] & 0xF) - offset);
        w[j + QK / 2] = (int8_t)((qs[j] >> 4) - offset);
    }
}

static float dot_q4_0_q8_0(int64_t n, const block_q4_0 *x, const block_q8_0 *y) {
    float acc[8] = {0};
    int8_t w[QK];
    for (int64_t i = 0; i < n / QK; i++) {
        unpack_q4(x[i].qs, 8, w);
        acc_lanes(acc, F(x[i].d) * F(y[i].d), w, y[i].qs);
    }
    return gc_sum8(acc);
}

static float dot_q4_1_q8_1(int64_t n, const block_q4_1 *x, const block_q8_1 *y) {
    float acc[8] = {0}, summs = 0.0f;
    int8_t w[QK];
    for (int64_t i = 0; i < n / QK; i++) {
        unpack_q4(x[i].qs, 0, w);
        acc_lanes(acc, F(x[i].d) * F(y[i].d), w, y[i].qs);
        summs += F(x[i].m) * F(y[i].s);
    }
    return gc_sum8(acc) + summs;
}

static float dot_q5_0_q8_0(int64_t n, const block_q5_0 *x, const block_q8_0 *y) {
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK; i++) {
        uint32_t qh;
        memcpy(&qh, x[i].qh, 4);
        int s = 0;
        for (int j = 0; j < QK / 2; j++) {
            const uint8_t h0 = (uint8_t)(((qh >> j) << 4) & 0x10), h1 = (uint8_t)((qh >> (j + 12)) & 0x10);
            s += ((int)((x[i].qs[j] & 0xF) | h0) - 16) * y[i].qs[j] +
                 ((int)((x[i].qs[j] >> 4) | h1) - 16) * y[i].qs[j + QK / 2];
        }
        sum += s * F(x[i].d) * F(y[i].d);
    }
    return sum;
}

static float dot_q8_0_q8_0(int64_t n, const block_q8_0 *x, const block_q8_0 *y) {
    float acc[8] = {0};
    for (int64_t i = 0; i < n / QK; i++) acc_lanes(acc, F(x[i].d) * F(y[i].d), x[i].qs, y[i].qs);
    return gc_sum8(acc);
}

static float dot_f32(int64_t n, const float *x, const float *y) {
    float sum = 0.0f;
#if KVB_HAVE_AVX2
    if (!g_force_scalar) {
        __m256 acc = _mm256_setzero_ps();
        int64_t i = 0;
        const int64_t n8 = n - n % 8;
        for (; i < n8; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), acc);
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
        s = _mm_hadd_ps(s, s);
        s = _mm_hadd_ps(s, s);
        sum = _mm_cvtss_f32(s);
        for (; i < n; i++) sum += x[i] * y[i];
        return sum;
    }
#endif
    for (int64_t i = 0; i < n; i++) sum += x[i] * y[i];
    return sum;
}

/* K-quants: dequantize a block at a time and dot with f32 activations */
static float dot_k_f32(ggml_type t, int64_t n, const void *w, const float *x) {
    float buf[QK_K], sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        if (t == GGML_T_Q4_K) dequant_q4_K_block((const block_q4_K *)w + i, buf);
        else dequant_q6_K_block((const block_q6_K *)w + i, buf);
        sum += dot_f32(QK_K, buf, x + i * QK_K);
    }
    return sum;
}

/* ---------- AVX2 ---------- */
#if KVB_HAVE_AVX2
static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 32 nibbles of a 16-byte block as 32 bytes: low nibbles first, then high */
static inline __m256i unpack_nibbles(const uint8_t *qs) {
    const __m128i raw = _mm_loadu_si128((const __m128i *)qs);
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

/* sum of u8 x i8 products as 8 floats */
static inline __m256 dot_u8_i8(__m256i u, __m256i s) {
    const __m256i p16 = _mm256_maddubs_epi16(u, s);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

/* sum of i8 x i8 products as 8 floats */
static inline __m256 dot_i8_i8(__m256i a, __m256i b) {
    return dot_u8_i8(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
}

static void multi_q4_1(int64_t n, const block_q4_1 *x, const uint8_t *act, size_t stride, int n_act, float *out) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    float summs[4] = {0, 0, 0, 0};
    for (int64_t i = 0; i < n / QK; i++) {
        const __m256i q = unpack_nibbles(x[i].qs);
        const float d = F(x[i].d), m = F(x[i].m);
        for (int j = 0; j < n_act; j++) {
            const block_q8_1 *y = (const block_q8_1 *)(act + j * stride) + i;
            const __m256i yq = _mm256_loadu_si256((const __m256i *)y->qs);
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d * F(y->d)), dot_u8_i8(q, yq), acc[j]);
            summs[j] += m * F(y->s);
        }
    }
    for (int j = 0; j < n_act; j++) out[j] = hsum_ps(acc[j]) + summs[j];
}

static void multi_q8_0(int64_t n, const block_q8_0 *x, const uint8_t *act, size_t stride, int n_act, float *out) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t i = 0; i < n / QK; i++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)x[i].qs);
        const __m256i aq = _mm256_sign_epi8(q, q);
        const float d = F(x[i].d);
        for (int j = 0; j < n_act; j++) {
            const block_q8_0 *y = (const block_q8_0 *)(act + j * stride) + i;
            const __m256i yq = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)y->qs), q);
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d * F(y->d)), dot_u8_i8(aq, yq), acc[j]);
        }
    }
    for (int j = 0; j < n_act; j++) out[j] = hsum_ps(acc[j]);
}

static void multi_q4_0(int64_t n, const block_q4_0 *x, const uint8_t *act, size_t stride, int n_act, float *out) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t i = 0; i < n / QK; i++) {
        const __m256i q = _mm256_sub_epi8(unpack_nibbles(x[i].qs), _mm256_set1_epi8(8));
        const float d = F(x[i].d);
        for (int j = 0; j < n_act; j++) {
            const block_q8_0 *y = (const block_q8_0 *)(act + j * stride) + i;
            const __m256i yq = _mm256_loadu_si256((const __m256i *)y->qs);
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d * F(y->d)), dot_i8_i8(q, yq), acc[j]);
        }
    }
    for (int j = 0; j < n_act; j++) out[j] = hsum_ps(acc[j]);
}
#endif

static float dot_one(ggml_type t, int64_t n, const void *w, const void *a) {
    switch (t) {
    case GGML_T_Q4_0: return dot_q4_0_q8_0(n, w, a);
    case GGML_T_Q4_1: return dot_q4_1_q8_1(n, w, a);
    case GGML_T_Q5_0: return dot_q5_0_q8_0(n, w, a);
    case GGML_T_Q8_0: return dot_q8_0_q8_0(n, w, a);
    case GGML_T_F32: return dot_f32(n, w, a);
    case GGML_T_F16: {
        const kvb_f16 *x = w, *y = a;
        float s = 0.0f;
        for (int64_t i = 0; i < n; i++) s += F(x[i]) * F(y[i]);
        return s;
    }
    case GGML_T_BF16: {
        const kvb_bf16 *x = w;
        const float *y = a;
        float s = 0.0f;
        for (int64_t i = 0; i < n; i++) s += kvb_bf16_to_f32(x[i]) * y[i];
        return s;
    }
    case GGML_T_Q4_K: case GGML_T_Q6_K: return dot_k_f32(t, n, w, a);
    default: return 0.0f;
    }
}

void quant_vec_dot_multi(ggml_type t, int64_t n, const void *w, const void *act, size_t stride, int n_act,
                         float *out) {
#if KVB_HAVE_AVX2
    if (!g_force_scalar) {
        switch (t) {
        case GGML_T_Q4_1: multi_q4_1(n, w, act, stride, n_act, out); return;
        case GGML_T_Q8_0: multi_q8_0(n, w, act, stride, n_act, out); return;
        case GGML_T_Q4_0: multi_q4_0(n, w, act, stride, n_act, out); return;
        default: break;
        }
    }
#endif
    for (int j = 0; j < n_act; j++) out[j] = dot_one(t, n, w, (const uint8_t *)act + j * stride);
}

float quant_vec_dot(ggml_type t, int64_t n, const void *w, const void *act) {
    float out;
    quant_vec_dot_multi(t, n, w, act, 0, 1, &out);
    return out;
}
