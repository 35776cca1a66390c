/* quant_k.c — K-quant weights (Q4_K, Q5_K, Q6_K) dotted against Q8_K activations, as ggml's CPU
 * backend does for these types (vec_dot_type Q8_K, ggml-cpu quants.c).
 *
 * A 256-value block is dotted in integers, then scaled once: the AVX2 kernel keeps 8 int32 lanes per
 * block, lane l holding elements 4l..4l+3 of each 32-value chunk times that chunk's (sub-)scale
 * (maddubs then madd), converts them to float and accumulates d * lane in 8 float lanes with a fused
 * multiply-add; the sub-block minimums of Q4_K/Q5_K go through Q8_K's bsums. The integers are exact,
 * so only the float steps need an order, and the scalar twins take the AVX2 order step for step:
 * same per-block products, same fma chains, same final horizontal sums. That order is llama.cpp's
 * AVX2 order (ggml_vec_dot_q{4,5,6}_K_q8_K, quantize_row_q8_K_ref): scripts/ggml_dots_check.sh compiles
 * llama.cpp's kernels and finds the same bytes. (Where a llama.cpp version repacks a weight type into
 * interleaved row panels for its CPU GEMM — Q4_0 and IQ4_NL, in later versions Q4_K among others —
 * that path sums in another order.) */
#include "kernels/cpu/quant_k.h"

#include <math.h>
#include <string.h>

#include "kernels/cpu/ggml_compat.h" /* gc_sum8 */
#include "kernels/cpu/quant_simd.h"

static inline float F(kvb_f16 h) { return kvb_f16_to_f32(h); }

int quant_k_is_k(ggml_type t) {
    return t == GGML_T_Q4_K || t == GGML_T_Q5_K || t == GGML_T_Q6_K || (quant_lowbit_has(t) && t != GGML_T_IQ4_NL);
}

/* ---------- unpacking ---------- */

/* the 6-bit scales and mins of the eight 32-value sub-blocks of Q4_K/Q5_K (ggml's get_scale_min_k4) */
static void k4_scales(const uint8_t *q, uint8_t sc[8], uint8_t mn[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = q[j] & 63;
        mn[j] = q[j + 4] & 63;
    }
    for (int j = 4; j < 8; j++) {
        sc[j] = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        mn[j] = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* inverse of k4_scales (for the quantizer) */
static void k4_pack_scales(const uint8_t sc[8], const uint8_t mn[8], uint8_t *q) {
    for (int j = 0; j < 4; j++) {
        q[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        q[j + 4] = (uint8_t)(mn[j] | ((mn[j + 4] >> 4) << 6));
        q[j + 8] = (uint8_t)((sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4));
    }
}

/* the 256 quants of a block in value order: Q4_K 0..15, Q5_K 0..31, Q6_K -32..31 */
static void unpack_q4_K(const block_q4_K *b, int8_t *w) {
    for (int j = 0; j < 4; j++)
        for (int l = 0; l < 32; l++) {
            w[64 * j + l] = (int8_t)(b->qs[32 * j + l] & 0xF);
            w[64 * j + 32 + l] = (int8_t)(b->qs[32 * j + l] >> 4);
        }
}

static void unpack_q5_K(const block_q5_K *b, int8_t *w) {
    for (int j = 0; j < 4; j++)
        for (int l = 0; l < 32; l++) {
            w[64 * j + l] = (int8_t)((b->qs[32 * j + l] & 0xF) | (((b->qh[l] >> (2 * j)) & 1) << 4));
            w[64 * j + 32 + l] = (int8_t)((b->qs[32 * j + l] >> 4) | (((b->qh[l] >> (2 * j + 1)) & 1) << 4));
        }
}

static void unpack_q6_K(const block_q6_K *b, int8_t *w) {
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
        int8_t *y = w + 128 * h;
        for (int l = 0; l < 32; l++) {
            y[l] = (int8_t)(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
            y[l + 32] = (int8_t)(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
            y[l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
            y[l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
    }
}

/* ---------- dequantization ---------- */

/* Q4_K/Q5_K: y = (d * sc) * q - dmin * m, ggml's expression */
static void dequant_k4(float d, float dmin, const uint8_t *scales, const int8_t *w, float *y) {
    uint8_t sc[8], mn[8];
    k4_scales(scales, sc, mn);
    for (int s = 0; s < 8; s++) {
        const float ds = d * sc[s], ms = dmin * mn[s];
        for (int l = 0; l < 32; l++) y[32 * s + l] = ds * w[32 * s + l] - ms;
    }
}

#if KVB_HAVE_AVX2
/* Q6_K in AVX2: unpack_q6_K's quants, 32 at a time, times the scalar loop's (d * scale) per 16 values: the
 * same floats */
static void dequant_q6_K_avx2(const block_q6_K *b, float *y) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30), k32 = _mm256_set1_epi8(32);
    const float d = F(b->d);
    for (int h = 0; h < 2; h++, y += 128) {
        const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h));
        const __m256i ql1 = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h + 32));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));
        const __m256i q[4] = {
            _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30)),
            _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m30)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30)),
        };
        for (int k = 0; k < 4; k++) {
            const int g = 8 * h + 2 * k; /* the 16-value groups of values 128h + 32k .. +31 */
            qs_dequant_i8x32_2(y + 32 * k, _mm256_sub_epi8(q[k], k32), _mm256_set1_ps(d * b->scales[g]),
                               _mm256_set1_ps(d * b->scales[g + 1]));
        }
    }
}
#endif

void quant_k_dequant_row(ggml_type t, const void *src, float *y, int64_t n) {
    if (quant_lowbit_has(t)) {
        quant_lowbit_dequant_row(t, src, y, n);
        return;
    }
#if KVB_HAVE_AVX2
    if (t == GGML_T_Q6_K && !quant_scalar_forced()) {
        for (int64_t i = 0; i < n / QK_K; i++) dequant_q6_K_avx2((const block_q6_K *)src + i, y + i * QK_K);
        return;
    }
#endif
    int8_t w[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++, y += QK_K) {
        switch (t) {
        case GGML_T_Q4_K: {
            const block_q4_K *b = (const block_q4_K *)src + i;
            unpack_q4_K(b, w);
            dequant_k4(F(b->d), F(b->dmin), b->scales, w, y);
            break;
        }
        case GGML_T_Q5_K: {
            const block_q5_K *b = (const block_q5_K *)src + i;
            unpack_q5_K(b, w);
            dequant_k4(F(b->d), F(b->dmin), b->scales, w, y);
            break;
        }
        case GGML_T_Q6_K: {
            const block_q6_K *b = (const block_q6_K *)src + i;
            unpack_q6_K(b, w);
            const float d = F(b->d);
            for (int e = 0; e < QK_K; e++) y[e] = d * b->scales[e / 16] * w[e];
            break;
        }
        case GGML_T_Q8_K: {
            const block_q8_K *b = (const block_q8_K *)src + i;
            for (int e = 0; e < QK_K; e++) y[e] = b->d * b->qs[e];
            break;
        }
        default:
            memset(y, 0, QK_K * sizeof(float));
        }
    }
}

/* ---------- quantization ---------- */

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Q4_K (qmax 15) or Q5_K (qmax 31): per sub-block min/max fit, 6-bit scales and mins relative to the
 * block's largest. Not ggml's iterative fit (make_qkx2_quants): good enough for tests, and the dot
 * products do not depend on how the weights were chosen. */
static void quantize_k4(const float *x, int qmax, kvb_f16 *d_out, kvb_f16 *dmin_out, uint8_t *scales, uint8_t *q) {
    float sc_f[8], mn_f[8], sc_max = 0.0f, mn_max = 0.0f;
    for (int s = 0; s < 8; s++) {
        float lo = x[32 * s], hi = x[32 * s];
        for (int l = 1; l < 32; l++) lo = fminf(lo, x[32 * s + l]), hi = fmaxf(hi, x[32 * s + l]);
        if (lo > 0.0f) lo = 0.0f;
        sc_f[s] = (hi - lo) / (float)qmax;
        mn_f[s] = -lo;
        sc_max = fmaxf(sc_max, sc_f[s]);
        mn_max = fmaxf(mn_max, mn_f[s]);
    }
    *d_out = kvb_f32_to_f16(sc_max / 63.0f);
    *dmin_out = kvb_f32_to_f16(mn_max / 63.0f);
    const float d = F(*d_out), dmin = F(*dmin_out);
    uint8_t sc[8], mn[8];
    for (int s = 0; s < 8; s++) {
        sc[s] = (uint8_t)(d > 0.0f ? clampi((int)nearbyintf(sc_f[s] / d), 0, 63) : 0);
        mn[s] = (uint8_t)(dmin > 0.0f ? clampi((int)nearbyintf(mn_f[s] / dmin), 0, 63) : 0);
        const float ds = d * sc[s], ms = dmin * mn[s];
        for (int l = 0; l < 32; l++)
            q[32 * s + l] = (uint8_t)(ds > 0.0f ? clampi((int)nearbyintf((x[32 * s + l] + ms) / ds), 0, qmax) : 0);
    }
    k4_pack_scales(sc, mn, scales);
}

static void quantize_q6_K_block(const float *x, block_q6_K *b) {
    float s_f[16], s_max = 0.0f;
    for (int g = 0; g < 16; g++) {
        float amax = 0.0f;
        for (int l = 0; l < 16; l++) amax = fmaxf(amax, fabsf(x[16 * g + l]));
        s_f[g] = amax / 31.0f;
        s_max = fmaxf(s_max, s_f[g]);
    }
    b->d = kvb_f32_to_f16(s_max / 127.0f);
    const float d = F(b->d);
    uint8_t q[QK_K];
    for (int g = 0; g < 16; g++) {
        b->scales[g] = (int8_t)(d > 0.0f ? clampi((int)nearbyintf(s_f[g] / d), -128, 127) : 0);
        const float ds = d * b->scales[g];
        for (int l = 0; l < 16; l++)
            q[16 * g + l] = (uint8_t)(32 + (ds > 0.0f ? clampi((int)nearbyintf(x[16 * g + l] / ds), -32, 31) : 0));
    }
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const uint8_t *v = q + 128 * h;
            b->ql[64 * h + l] = (uint8_t)((v[l] & 0xF) | ((v[l + 64] & 0xF) << 4));
            b->ql[64 * h + 32 + l] = (uint8_t)((v[l + 32] & 0xF) | ((v[l + 96] & 0xF) << 4));
            b->qh[32 * h + l] =
                (uint8_t)((v[l] >> 4) | ((v[l + 32] >> 4) << 2) | ((v[l + 64] >> 4) << 4) | ((v[l + 96] >> 4) << 6));
        }
}

int quant_k_quantize_row(ggml_type t, const float *x, void *dst, int64_t n) {
    if (quant_lowbit_has(t)) return quant_lowbit_quantize_row(t, x, dst, n);
    if (!quant_k_is_k(t)) return -1;
    uint8_t q[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        switch (t) {
        case GGML_T_Q4_K: {
            block_q4_K *b = (block_q4_K *)dst + i;
            quantize_k4(x, 15, &b->d, &b->dmin, b->scales, q);
            for (int j = 0; j < 4; j++)
                for (int l = 0; l < 32; l++) b->qs[32 * j + l] = (uint8_t)(q[64 * j + l] | (q[64 * j + 32 + l] << 4));
            break;
        }
        case GGML_T_Q5_K: {
            block_q5_K *b = (block_q5_K *)dst + i;
            quantize_k4(x, 31, &b->d, &b->dmin, b->scales, q);
            memset(b->qh, 0, sizeof b->qh);
            for (int j = 0; j < 4; j++)
                for (int l = 0; l < 32; l++) {
                    const uint8_t lo = q[64 * j + l], hi = q[64 * j + 32 + l];
                    b->qs[32 * j + l] = (uint8_t)((lo & 0xF) | ((hi & 0xF) << 4));
                    b->qh[l] |= (uint8_t)(((lo >> 4) << (2 * j)) | ((hi >> 4) << (2 * j + 1)));
                }
            break;
        }
        case GGML_T_Q6_K:
            quantize_q6_K_block(x, (block_q6_K *)dst + i);
            break;
        default:
            return -1;
        }
    }
    return 0;
}

void quant_k_quantize_q8_K(const float *x, block_q8_K *y, int64_t n) {
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK_K; j++)
            if (fabsf(x[j]) > amax) amax = fabsf(x[j]), max = x[j];
        memset(y[i].bsums, 0, sizeof y[i].bsums);
        if (amax == 0.0f) {
            y[i].d = 0.0f;
            memset(y[i].qs, 0, QK_K);
            continue;
        }
        /* ggml: iscale = -127/max (the signed extreme maps to -127), product rounded to float, then to the
         * nearest integer, ties to even (its nearest_int) */
        const float iscale = -127.0f / max;
        for (int j = 0; j < QK_K; j++) {
            const float v = iscale * x[j];
            const int q = (int)nearbyintf(v);
            y[i].qs[j] = (int8_t)(q < 127 ? q : 127);
            y[i].bsums[j / 16] = (int16_t)(y[i].bsums[j / 16] + y[i].qs[j]);
        }
        y[i].d = 1.0f / iscale;
    }
}

/* ---------- scalar dot products (the AVX2 order) ---------- */

void quant_k_lanes(const int8_t *w, const int16_t *sc16, const int8_t *y, int32_t lane[8]) {
    for (int l = 0; l < 8; l++) lane[l] = 0;
    for (int c = 0; c < 8; c++)
        for (int l = 0; l < 8; l++) {
            const int e = 32 * c + 4 * l;
            const int32_t p = w[e] * y[e] + w[e + 1] * y[e + 1] + w[e + 2] * y[e + 2] + w[e + 3] * y[e + 3];
            lane[l] += sc16[2 * c + l / 4] * p;
        }
}

/* Q4_K and Q5_K share everything but the unpacking and how the minimums are accumulated: Q4_K keeps
 * them in 4 float lanes (llama.cpp's acc_m), Q5_K in one float, fused (its `summs += dmin * sum`, which
 * llama.cpp's build contracts to an fma). */
static float dot_k4_scalar(ggml_type t, int64_t n, const void *vx, const block_q8_K *y) {
    float acc[8] = {0}, acc_m[4] = {0}, summs = 0.0f;
    int8_t w[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++) {
        kvb_f16 xd, xdmin;
        const uint8_t *scales;
        if (t == GGML_T_Q4_K) {
            const block_q4_K *b = (const block_q4_K *)vx + i;
            unpack_q4_K(b, w);
            xd = b->d, xdmin = b->dmin, scales = b->scales;
        } else {
            const block_q5_K *b = (const block_q5_K *)vx + i;
            unpack_q5_K(b, w);
            xd = b->d, xdmin = b->dmin, scales = b->scales;
        }
        uint8_t sc[8], mn[8];
        k4_scales(scales, sc, mn);
        int16_t sc16[16];
        for (int s = 0; s < 8; s++) sc16[2 * s] = sc16[2 * s + 1] = sc[s];
        int32_t lane[8];
        quant_k_lanes(w, sc16, y[i].qs, lane);
        const float d = y[i].d * F(xd), dmin = -y[i].d * F(xdmin);
        for (int l = 0; l < 8; l++) acc[l] = fmaf(d, (float)lane[l], acc[l]);
        const int16_t *bs = y[i].bsums;
        int32_t prod[4];
        for (int m = 0; m < 4; m++)
            prod[m] = mn[2 * m] * (bs[4 * m] + bs[4 * m + 1]) + mn[2 * m + 1] * (bs[4 * m + 2] + bs[4 * m + 3]);
        if (t == GGML_T_Q4_K)
            for (int m = 0; m < 4; m++) acc_m[m] = fmaf(dmin, (float)prod[m], acc_m[m]);
        else
            summs = fmaf(dmin, (float)(prod[0] + prod[1] + prod[2] + prod[3]), summs);
    }
    if (t == GGML_T_Q4_K) return gc_sum8(acc) + ((acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]));
    return gc_sum8(acc) + summs;
}

static float dot_q6_K_scalar(int64_t n, const block_q6_K *x, const block_q8_K *y) {
    float acc[8] = {0};
    int8_t w[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++) {
        /* the unsigned 6-bit values dotted, the offset 32 taken off per lane through Q8_K's bsums: lane l loses
         * 32 (scale[2l] bsums[2l] + scale[2l+1] bsums[2l+1]), as llama.cpp's AVX2 kernel splits it */
        unpack_q6_K(&x[i], w);
        for (int j = 0; j < QK_K; j++) w[j] = (int8_t)(w[j] + 32);
        int16_t sc16[16];
        for (int g = 0; g < 16; g++) sc16[g] = x[i].scales[g];
        int32_t lane[8];
        quant_k_lanes(w, sc16, y[i].qs, lane);
        const int16_t *bs = y[i].bsums;
        for (int l = 0; l < 8; l++) lane[l] -= 32 * (sc16[2 * l] * bs[2 * l] + sc16[2 * l + 1] * bs[2 * l + 1]);
        const float d = y[i].d * F(x[i].d);
        for (int l = 0; l < 8; l++) acc[l] = fmaf(d, (float)lane[l], acc[l]);
    }
    return gc_sum8(acc);
}

/* ---------- AVX2 ---------- */
#if KVB_HAVE_AVX2
/* (m0 + m2) + (m1 + m3) */
static inline float hsum4(__m128 s) {
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* shuffle k of K4_SHUFFLE broadcasts the int16 at position k of a 128-bit half to all of its 16 lanes */
static const uint8_t K4_SHUFFLE[8][32] = {
#define S2(a) a, a + 1, a, a + 1, a, a + 1, a, a + 1, a, a + 1, a, a + 1, a, a + 1, a, a + 1
    {S2(0), S2(0)}, {S2(2), S2(2)}, {S2(4), S2(4)}, {S2(6), S2(6)},
    {S2(8), S2(8)}, {S2(10), S2(10)}, {S2(12), S2(12)}, {S2(14), S2(14)},
#undef S2
};
static inline __m256i k4_pick(__m256i scales, int k) {
    return _mm256_shuffle_epi8(scales, _mm256_loadu_si256((const __m256i *)K4_SHUFFLE[k]));
}

/* Q4_K/Q5_K's twelve scale bytes as 16 int16: the eight 6-bit scales (low half), then the eight mins — the
 * bit layout of k4_scales done on 32-bit words */
static inline __m256i k4_scales_mins(const uint8_t *q) {
    uint32_t u[3];
    memcpy(u, q, 12);
    const uint32_t m6 = 0x3f3f3f3f, m4 = 0x0f0f0f0f, m2 = 0x03030303;
    const uint32_t sc_lo = u[0] & m6, mn_lo = u[1] & m6;
    const uint32_t sc_hi = (u[2] & m4) | (((u[0] >> 6) & m2) << 4);
    const uint32_t mn_hi = ((u[2] >> 4) & m4) | (((u[1] >> 6) & m2) << 4);
    return _mm256_cvtepu8_epi16(_mm_set_epi32((int)mn_hi, (int)mn_lo, (int)sc_hi, (int)sc_lo));
}

/* Q4_K (Q5 = 0) or Q5_K (Q5 = 1) against N activation rows. The quants of a 64-value pair of chunks are
 * built once and dotted with every row; every row's integer lanes are the scalar k_lanes', so the float
 * steps (one fma per block, then the minimums, the horizontal sums) are the only order that matters. */
QS_INLINE void rows_k4(const int Q5, const int N, int64_t n, const void *vx, const uint8_t *act, size_t stride,
                       float *out) {
    __m256 acc[4];
    __m128 acc_m[4];
    float summs[4];
    for (int a = 0; a < N; a++) acc[a] = _mm256_setzero_ps(), acc_m[a] = _mm_setzero_ps(), summs[a] = 0.0f;
    const __m256i m4 = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
    for (int64_t i = 0; i < n / QK_K; i++) {
        const block_q4_K *b4 = (const block_q4_K *)vx + i;
        const block_q5_K *b5 = (const block_q5_K *)vx + i;
        const uint8_t *qs = Q5 ? b5->qs : b4->qs;
        const __m256i sm = k4_scales_mins(Q5 ? b5->scales : b4->scales);
        const __m256i scales = _mm256_permute2x128_si256(sm, sm, 0x00);
        const __m128i mins = _mm256_extracti128_si256(sm, 1);
        const __m256i hbits = Q5 ? _mm256_loadu_si256((const __m256i *)b5->qh) : _mm256_setzero_si256();
        __m256i sumi[4];
        for (int a = 0; a < N; a++) sumi[a] = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
            __m256i ql = _mm256_and_si256(bits, m4), qh = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
            if (Q5) {
                ql = _mm256_or_si256(ql, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * j), one), 4));
                qh = _mm256_or_si256(qh,
                                     _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * j + 1), one), 4));
            }
            const __m256i sl = k4_pick(scales, 2 * j), sh = k4_pick(scales, 2 * j + 1);
            for (int a = 0; a < N; a++) {
                const int8_t *y = ((const block_q8_K *)(act + a * stride) + i)->qs + 64 * j;
                const __m256i pl = _mm256_madd_epi16(sl, _mm256_maddubs_epi16(ql, _mm256_loadu_si256((const __m256i *)y)));
                const __m256i ph =
                    _mm256_madd_epi16(sh, _mm256_maddubs_epi16(qh, _mm256_loadu_si256((const __m256i *)(y + 32))));
                sumi[a] = _mm256_add_epi32(sumi[a], _mm256_add_epi32(pl, ph));
            }
        }
        const float dx = F(Q5 ? b5->d : b4->d), dminx = F(Q5 ? b5->dmin : b4->dmin);
        for (int a = 0; a < N; a++) {
            const block_q8_K *y = (const block_q8_K *)(act + a * stride) + i;
            acc[a] = _mm256_fmadd_ps(_mm256_set1_ps(y->d * dx), _mm256_cvtepi32_ps(sumi[a]), acc[a]);
            /* q8s[k] = bsums[2k] + bsums[2k+1] (32-value sums); prod[m] = mins . q8s over 2m, 2m+1 */
            const __m128i q8s = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)y->bsums),
                                               _mm_loadu_si128((const __m128i *)(y->bsums + 8)));
            const __m128i prod = _mm_madd_epi16(mins, q8s);
            const float dmin = -y->d * dminx;
            if (!Q5) {
                acc_m[a] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m[a]);
            } else {
                const __m128i h = _mm_hadd_epi32(_mm_hadd_epi32(prod, prod), prod);
                summs[a] = fmaf(dmin, (float)_mm_cvtsi128_si32(h), summs[a]);
            }
        }
    }
    for (int a = 0; a < N; a++) out[a] = gc_sum8v(acc[a]) + (Q5 ? summs[a] : hsum4(acc_m[a]));
}

/* Q6_K against N activation rows: the unsigned 6-bit values dotted, the offset 32 taken off through bsums */
QS_INLINE void rows_q6_K(const int N, int64_t n, const block_q6_K *x, const uint8_t *act, size_t stride, float *out) {
    __m256 acc[4];
    for (int a = 0; a < N; a++) acc[a] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0xF), m3 = _mm256_set1_epi8(3);
    for (int64_t i = 0; i < n / QK_K; i++) {
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)x[i].scales);
        const __m256i scales16 = _mm256_cvtepi8_epi16(sc8);
        __m256i sumi[4];
        for (int a = 0; a < N; a++) {
            /* (q - 32) . y as q . y minus 32 x (scales . bsums), lane by lane as llama.cpp splits it */
            const block_q8_K *y = (const block_q8_K *)(act + a * stride) + i;
            sumi[a] = _mm256_sub_epi32(_mm256_setzero_si256(),
                                       _mm256_slli_epi32(_mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums),
                                                                           scales16), 5));
        }
        for (int h = 0; h < 2; h++) {
            const __m256i lo1 = _mm256_loadu_si256((const __m256i *)(x[i].ql + 64 * h));
            const __m256i lo2 = _mm256_loadu_si256((const __m256i *)(x[i].ql + 64 * h + 32));
            const __m256i hi = _mm256_loadu_si256((const __m256i *)(x[i].qh + 32 * h));
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(lo1, m4), _mm256_slli_epi16(_mm256_and_si256(hi, m3), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(lo2, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hi, 2), m3), 4));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo1, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hi, 4), m3), 4));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo2, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hi, 6), m3), 4));
            for (int k = 0; k < 4; k++) {
                /* chunk c = 4h + k: scales[2c] on its first 16 values, scales[2c+1] on the rest */
                const int c = 4 * h + k;
                const __m256i scale = qs_scale_pair(sc8, c);
                for (int a = 0; a < N; a++) {
                    const int8_t *y = ((const block_q8_K *)(act + a * stride) + i)->qs + 32 * c;
                    sumi[a] = _mm256_add_epi32(
                        sumi[a], _mm256_madd_epi16(scale, _mm256_maddubs_epi16(q[k], _mm256_loadu_si256((const __m256i *)y))));
                }
            }
        }
        const float dx = F(x[i].d);
        for (int a = 0; a < N; a++) {
            const block_q8_K *y = (const block_q8_K *)(act + a * stride) + i;
            acc[a] = _mm256_fmadd_ps(_mm256_set1_ps(y->d * dx), _mm256_cvtepi32_ps(sumi[a]), acc[a]);
        }
    }
    for (int a = 0; a < N; a++) out[a] = gc_sum8v(acc[a]);
}

static void multi_q4_K(int64_t n, const void *w, const uint8_t *act, size_t stride, int n_act, float *out) {
#define CALL(N) rows_k4(0, N, n, w, act, stride, out)
    QS_ROWS_BY_N(CALL, n_act)
#undef CALL
}
static void multi_q5_K(int64_t n, const void *w, const uint8_t *act, size_t stride, int n_act, float *out) {
#define CALL(N) rows_k4(1, N, n, w, act, stride, out)
    QS_ROWS_BY_N(CALL, n_act)
#undef CALL
}
static void multi_q6_K(int64_t n, const void *w, const uint8_t *act, size_t stride, int n_act, float *out) {
#define CALL(N) rows_q6_K(N, n, w, act, stride, out)
    QS_ROWS_BY_N(CALL, n_act)
#undef CALL
}
#endif

void quant_k_dot_multi(ggml_type t, int64_t n, const void *w, const void *act, size_t stride, int n_act, float *out,
                       int simd) {
    if (quant_lowbit_has(t)) {
        quant_lowbit_dot_multi(t, n, w, act, stride, n_act, out, simd);
        return;
    }
#if KVB_HAVE_AVX2
    if (simd) {
        switch (t) {
        case GGML_T_Q4_K: multi_q4_K(n, w, act, stride, n_act, out); return;
        case GGML_T_Q5_K: multi_q5_K(n, w, act, stride, n_act, out); return;
        case GGML_T_Q6_K: multi_q6_K(n, w, act, stride, n_act, out); return;
        default: break;
        }
    }
#else
    (void)simd;
#endif
    for (int a = 0; a < n_act; a++) {
        const block_q8_K *y = (const block_q8_K *)((const uint8_t *)act + a * stride);
        out[a] = t == GGML_T_Q6_K ? dot_q6_K_scalar(n, w, y) : dot_k4_scalar(t, n, w, y);
    }
}
