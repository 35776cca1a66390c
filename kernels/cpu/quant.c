/* quant.c — block formats of ggml (see quant.h); the K-quants are in quant_k.c. The scalar
 * kernels are the reference and are always compiled; AVX2 versions of the pairs (Q4_0, Q5_0,
 * Q8_0 x Q8_0, Q4_1, Q5_1 x Q8_1) are used when the compiler targets AVX2, and give the same
 * bits as the scalar ones. Prefill's tiles (several rows x several tokens per call) are in quant_tile.c. */
#include "kernels/cpu/quant.h"
#include "kernels/cpu/quant_k.h"

#include <math.h>
#include <string.h>

#include "kernels/cpu/ggml_compat.h" /* gc_sum8 */
#include "kernels/cpu/quant_simd.h"

static int g_force_scalar;
void quant_force_scalar(int on) { g_force_scalar = on; }
int quant_scalar_forced(void) { return g_force_scalar; }

static inline float F(kvb_f16 h) { return kvb_f16_to_f32(h); }

/* ---------- dequantization ---------- */

#if KVB_HAVE_AVX2
/* Q4_0, Q5_0, Q8_0 in AVX2: the same signed quants times the same d, so the same floats as the scalar loops
 * below; 0 = done, -1 = another type */
static int dequant_row_avx2(ggml_type t, const void *src, float *y, int64_t n) {
    switch (t) {
    case GGML_T_Q4_0:
        for (int64_t i = 0; i < n / QK; i++, y += QK) {
            const block_q4_0 *b = (const block_q4_0 *)src + i;
            qs_dequant_i8x32(y, _mm256_sub_epi8(qs_unpack_nibbles(b->qs), _mm256_set1_epi8(8)), _mm256_set1_ps(F(b->d)));
        }
        return 0;
    case GGML_T_Q5_0:
        for (int64_t i = 0; i < n / QK; i++, y += QK) {
            const block_q5_0 *b = (const block_q5_0 *)src + i;
            const __m256i q = _mm256_or_si256(qs_unpack_nibbles(b->qs), qs_fifth_bits(b->qh));
            qs_dequant_i8x32(y, _mm256_sub_epi8(q, _mm256_set1_epi8(16)), _mm256_set1_ps(F(b->d)));
        }
        return 0;
    case GGML_T_Q8_0:
        for (int64_t i = 0; i < n / QK; i++, y += QK) {
            const block_q8_0 *b = (const block_q8_0 *)src + i;
            qs_dequant_i8x32(y, _mm256_loadu_si256((const __m256i *)b->qs), _mm256_set1_ps(F(b->d)));
        }
        return 0;
    default: return -1;
    }
}
#endif

void quant_dequant_row(ggml_type t, const void *src, float *y, int64_t n) {
#if KVB_HAVE_AVX2
    if (!g_force_scalar && !dequant_row_avx2(t, src, y, n)) return;
#endif
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
    case GGML_T_Q5_1: {
        const block_q5_1 *b = src;
        for (int64_t i = 0; i < n / QK; i++, y += QK) {
            const float d = F(b[i].d), m = F(b[i].m);
            uint32_t qh;
            memcpy(&qh, b[i].qh, 4);
            for (int j = 0; j < QK / 2; j++) {
                const uint8_t h0 = (uint8_t)(((qh >> j) << 4) & 0x10), h1 = (uint8_t)((qh >> (j + 12)) & 0x10);
                y[j] = ((b[i].qs[j] & 0xF) | h0) * d + m;
                y[j + QK / 2] = ((b[i].qs[j] >> 4) | h1) * d + m;
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
    case GGML_T_Q4_K: case GGML_T_Q5_K: case GGML_T_Q6_K: case GGML_T_Q8_K: case GGML_T_Q2_K: case GGML_T_Q3_K:
    case GGML_T_IQ4_XS: case GGML_T_IQ4_NL:
        quant_k_dequant_row(t, src, y, n);
        return;
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

/* 32 five-bit values: low nibbles of values j and j+16 share byte j; the fifth bit of value j is bit j of qh */
static void pack_q5(const uint8_t *q, uint8_t *qs, uint8_t *qh_out) {
    uint32_t qh = 0;
    for (int j = 0; j < QK / 2; j++) {
        qs[j] = (uint8_t)((q[j] & 0xF) | ((q[j + QK / 2] & 0xF) << 4));
        qh |= (uint32_t)(q[j] >> 4) << j;
        qh |= (uint32_t)(q[j + QK / 2] >> 4) << (j + QK / 2);
    }
    memcpy(qh_out, &qh, 4);
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
            uint8_t q[QK];
            for (int j = 0; j < QK; j++) {
                const int v = (int)(x[j] * id + 16.5f);
                q[j] = (uint8_t)(v > 31 ? 31 : v);
            }
            pack_q5(q, y[i].qs, y[i].qh);
        }
        return 0;
    }
    case GGML_T_Q5_1: {
        block_q5_1 *y = dst;
        for (int64_t i = 0; i < n / QK; i++, x += QK) {
            float mn = x[0], mx = x[0];
            for (int j = 1; j < QK; j++) mn = fminf(mn, x[j]), mx = fmaxf(mx, x[j]);
            const float d = (mx - mn) / 31.0f, id = d ? 1.0f / d : 0.0f;
            y[i].d = kvb_f32_to_f16(d);
            y[i].m = kvb_f32_to_f16(mn);
            uint8_t q[QK];
            for (int j = 0; j < QK; j++) {
                const int v = (int)((x[j] - mn) * id + 0.5f);
                q[j] = (uint8_t)(v > 31 ? 31 : v);
            }
            pack_q5(q, y[i].qs, y[i].qh);
        }
        return 0;
    }
    case GGML_T_Q8_K:
        quant_k_quantize_q8_K(x, dst, n);
        return 0;
    default:
        return quant_k_quantize_row(t, x, dst, n);
    }
}

ggml_type quant_act_type(ggml_type t) {
    switch (t) {
    case GGML_T_Q4_0: case GGML_T_Q5_0: case GGML_T_Q8_0: case GGML_T_IQ4_NL: return GGML_T_Q8_0;
    case GGML_T_Q4_1: case GGML_T_Q5_1: return GGML_T_Q8_1;
    case GGML_T_Q2_K: case GGML_T_Q3_K: case GGML_T_Q4_K: case GGML_T_Q5_K: case GGML_T_Q6_K: case GGML_T_IQ4_XS:
        return GGML_T_Q8_K;
    case GGML_T_F16: return GGML_T_F16;
    default: return GGML_T_F32;
    }
}

size_t quant_act_row_bytes(ggml_type t, int64_t n) {
    switch (quant_act_type(t)) {
    case GGML_T_Q8_0: return (size_t)(n / QK) * sizeof(block_q8_0);
    case GGML_T_Q8_1: return (size_t)(n / QK) * sizeof(block_q8_1);
    case GGML_T_Q8_K: return (size_t)(n / QK_K) * sizeof(block_q8_K);
    case GGML_T_F16: return (size_t)n * sizeof(kvb_f16);
    default: return (size_t)n * sizeof(float);
    }
}

void quant_act_quantize(ggml_type t, const float *x, void *dst, int64_t n) {
    quant_quantize_row(quant_act_type(t), x, dst, n);
}

/* ---------- scalar dot products ---------- */

/* Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 follow the AVX2 kernels' (and llama.cpp's) float order, so scalar builds give
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

/* the 32 weights of a 5-bit block in value order, minus offset */
static void unpack_q5(const uint8_t *qs, const uint8_t *qh_bytes, int offset, int8_t *w) {
    uint32_t qh;
    memcpy(&qh, qh_bytes, 4);
    for (int j = 0; j < QK / 2; j++) {
        w[j] = (int8_t)(((qs[j] & 0xF) | (((qh >> j) & 1) << 4)) - offset);
        w[j + QK / 2] = (int8_t)(((qs[j] >> 4) | (((qh >> (j + QK / 2)) & 1) << 4)) - offset);
    }
}

static float dot_q5_0_q8_0(int64_t n, const block_q5_0 *x, const block_q8_0 *y) {
    float acc[8] = {0};
    int8_t w[QK];
    for (int64_t i = 0; i < n / QK; i++) {
        unpack_q5(x[i].qs, x[i].qh, 16, w);
        acc_lanes(acc, F(x[i].d) * F(y[i].d), w, y[i].qs);
    }
    return gc_sum8(acc);
}

/* the minimum term m * s is a product of two halves, exact in float, so fused (llama.cpp's build contracts
 * `summs += m * s`) and unfused sums agree; Q4_1's twin writes it unfused */
static float dot_q5_1_q8_1(int64_t n, const block_q5_1 *x, const block_q8_1 *y) {
    float acc[8] = {0}, summs = 0.0f;
    int8_t w[QK];
    for (int64_t i = 0; i < n / QK; i++) {
        unpack_q5(x[i].qs, x[i].qh, 0, w);
        acc_lanes(acc, F(x[i].d) * F(y[i].d), w, y[i].qs);
        summs = fmaf(F(x[i].m), F(y[i].s), summs);
    }
    return gc_sum8(acc) + summs;
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

/* ---------- AVX2 ---------- */
#if KVB_HAVE_AVX2
static void multi_q4_1(int64_t n, const block_q4_1 *x, const uint8_t *act, size_t stride, int n_act, float *out) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    float summs[4] = {0, 0, 0, 0};
    for (int64_t i = 0; i < n / QK; i++) {
        const __m256i q = qs_unpack_nibbles(x[i].qs);
        const float d = F(x[i].d), m = F(x[i].m);
        for (int j = 0; j < n_act; j++) {
            const block_q8_1 *y = (const block_q8_1 *)(act + j * stride) + i;
            const __m256i yq = _mm256_loadu_si256((const __m256i *)y->qs);
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d * F(y->d)), qs_dot_u8_i8(q, yq), acc[j]);
            summs[j] += m * F(y->s);
        }
    }
    for (int j = 0; j < n_act; j++) out[j] = gc_sum8v(acc[j]) + summs[j];
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
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d * F(y->d)), qs_dot_u8_i8(aq, yq), acc[j]);
        }
    }
    for (int j = 0; j < n_act; j++) out[j] = gc_sum8v(acc[j]);
}

static void multi_q5_0(int64_t n, const block_q5_0 *x, const uint8_t *act, size_t stride, int n_act, float *out) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t i = 0; i < n / QK; i++) {
        const __m256i q = _mm256_sub_epi8(_mm256_or_si256(qs_unpack_nibbles(x[i].qs), qs_fifth_bits(x[i].qh)),
                                          _mm256_set1_epi8(16));
        /* |q| and the sign moved onto y once per block: each activation then costs one maddubs */
        const __m256i aq = _mm256_sign_epi8(q, q);
        const float d = F(x[i].d);
        for (int j = 0; j < n_act; j++) {
            const block_q8_0 *y = (const block_q8_0 *)(act + j * stride) + i;
            const __m256i yq = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)y->qs), q);
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d * F(y->d)), qs_dot_u8_i8(aq, yq), acc[j]);
        }
    }
    for (int j = 0; j < n_act; j++) out[j] = gc_sum8v(acc[j]);
}

static void multi_q5_1(int64_t n, const block_q5_1 *x, const uint8_t *act, size_t stride, int n_act, float *out) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    float summs[4] = {0, 0, 0, 0};
    for (int64_t i = 0; i < n / QK; i++) {
        const __m256i q = _mm256_or_si256(qs_unpack_nibbles(x[i].qs), qs_fifth_bits(x[i].qh));
        const float d = F(x[i].d), m = F(x[i].m);
        for (int j = 0; j < n_act; j++) {
            const block_q8_1 *y = (const block_q8_1 *)(act + j * stride) + i;
            const __m256i yq = _mm256_loadu_si256((const __m256i *)y->qs);
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d * F(y->d)), qs_dot_u8_i8(q, yq), acc[j]);
            summs[j] = fmaf(m, F(y->s), summs[j]);
        }
    }
    for (int j = 0; j < n_act; j++) out[j] = gc_sum8v(acc[j]) + summs[j];
}

static void multi_q4_0(int64_t n, const block_q4_0 *x, const uint8_t *act, size_t stride, int n_act, float *out) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t i = 0; i < n / QK; i++) {
        const __m256i q = _mm256_sub_epi8(qs_unpack_nibbles(x[i].qs), _mm256_set1_epi8(8));
        const float d = F(x[i].d);
        for (int j = 0; j < n_act; j++) {
            const block_q8_0 *y = (const block_q8_0 *)(act + j * stride) + i;
            const __m256i yq = _mm256_loadu_si256((const __m256i *)y->qs);
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d * F(y->d)), qs_dot_i8_i8(q, yq), acc[j]);
        }
    }
    for (int j = 0; j < n_act; j++) out[j] = gc_sum8v(acc[j]);
}
#endif

/* F16 x F16 in llama.cpp's order (ggml_vec_dot_f16 on AVX2): four 8-lane accumulators over steps of 32
 * elements (fused multiply-adds), folded 0+2, 1+3, then 0+1, the 8 lanes summed as (0+4, 1+5, 2+6, 3+7) by two
 * horizontal adds, the tail past a multiple of 32 added in double. The scalar loop keeps that order exactly. */
static float dot_f16_scalar(int64_t n, const kvb_f16 *x, const kvb_f16 *y) {
    const int64_t np = n & ~(int64_t)31;
    float acc[4][8] = {{0}};
    for (int64_t i = 0; i < np; i += 32)
        for (int j = 0; j < 4; j++)
            for (int k = 0; k < 8; k++) acc[j][k] = fmaf(F(x[i + 8 * j + k]), F(y[i + 8 * j + k]), acc[j][k]);
    float s[8], t[4];
    for (int k = 0; k < 8; k++) s[k] = (acc[0][k] + acc[2][k]) + (acc[1][k] + acc[3][k]);
    for (int k = 0; k < 4; k++) t[k] = s[k] + s[k + 4];
    double sum = (t[0] + t[1]) + (t[2] + t[3]);
    for (int64_t i = np; i < n; i++) sum += (double)(F(x[i]) * F(y[i]));
    return (float)sum;
}

#if KVB_HAVE_AVX2 && defined(__F16C__)
static float dot_f16_avx2(int64_t n, const kvb_f16 *x, const kvb_f16 *y) {
    const int64_t np = n & ~(int64_t)31;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t i = 0; i < np; i += 32)
        for (int j = 0; j < 4; j++) {
            const __m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i + 8 * j)));
            const __m256 b = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(y + i + 8 * j)));
            acc[j] = _mm256_fmadd_ps(a, b, acc[j]);
        }
    acc[0] = _mm256_add_ps(acc[0], acc[2]);
    acc[1] = _mm256_add_ps(acc[1], acc[3]);
    acc[0] = _mm256_add_ps(acc[0], acc[1]);
    const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(acc[0]), _mm256_extractf128_ps(acc[0], 1));
    const __m128 t1 = _mm_hadd_ps(t0, t0);
    double sum = _mm_cvtss_f32(_mm_hadd_ps(t1, t1));
    for (int64_t i = np; i < n; i++) sum += (double)(F(x[i]) * F(y[i]));
    return (float)sum;
}
#endif

static float dot_one(ggml_type t, int64_t n, const void *w, const void *a) {
    switch (t) {
    case GGML_T_Q4_0: return dot_q4_0_q8_0(n, w, a);
    case GGML_T_Q4_1: return dot_q4_1_q8_1(n, w, a);
    case GGML_T_Q5_0: return dot_q5_0_q8_0(n, w, a);
    case GGML_T_Q5_1: return dot_q5_1_q8_1(n, w, a);
    case GGML_T_Q8_0: return dot_q8_0_q8_0(n, w, a);
    case GGML_T_F32: return dot_f32(n, w, a);
    case GGML_T_F16:
#if KVB_HAVE_AVX2 && defined(__F16C__)
        if (!g_force_scalar) return dot_f16_avx2(n, w, a);
#endif
        return dot_f16_scalar(n, w, a);
    case GGML_T_BF16: {
        const kvb_bf16 *x = w;
        const float *y = a;
        float s = 0.0f;
        for (int64_t i = 0; i < n; i++) s += kvb_bf16_to_f32(x[i]) * y[i];
        return s;
    }
    default: return 0.0f;
    }
}

void quant_vec_dot_multi(ggml_type t, int64_t n, const void *w, const void *act, size_t stride, int n_act,
                         float *out) {
    if (quant_k_is_k(t) || t == GGML_T_IQ4_NL) {
        quant_k_dot_multi(t, n, w, act, stride, n_act, out, !g_force_scalar);
        return;
    }
#if KVB_HAVE_AVX2
    if (!g_force_scalar) {
        switch (t) {
        case GGML_T_Q4_1: multi_q4_1(n, w, act, stride, n_act, out); return;
        case GGML_T_Q8_0: multi_q8_0(n, w, act, stride, n_act, out); return;
        case GGML_T_Q4_0: multi_q4_0(n, w, act, stride, n_act, out); return;
        case GGML_T_Q5_0: multi_q5_0(n, w, act, stride, n_act, out); return;
        case GGML_T_Q5_1: multi_q5_1(n, w, act, stride, n_act, out); return;
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
