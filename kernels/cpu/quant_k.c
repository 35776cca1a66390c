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

int quant_k_is_k(ggml_type t) { return t == GGML_T_Q4_K || t == GGML_T_Q5_K || t == GGML_T_Q6_K; }

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

void quant_k_dequant_row(ggml_type t, const void *src, float *y, int64_t n) {
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

/* lane l = sum over the eight 32-value chunks c of sc16[2c + l/4] * (integer dot of elements 32c+4l..+3):
 * the integers AVX2's maddubs + madd leave in lane l (sc16: the scale of each 16-value group) */
static void k_lanes(const int8_t *w, const int16_t *sc16, const int8_t *y, int32_t lane[8]) {
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
        k_lanes(w, sc16, y[i].qs, lane);
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
        k_lanes(w, sc16, y[i].qs, lane);
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

/* 8 int32 lanes: sum over the 8 chunks of scale[c] (int16 per pair of bytes) * maddubs(q[c], y chunk c) */
static inline __m256i k_sumi(const __m256i *q, const __m256i *scale, const int8_t *y) {
    __m256i sumi = _mm256_setzero_si256();
    for (int c = 0; c < 8; c++) {
        const __m256i p16 = _mm256_maddubs_epi16(q[c], _mm256_loadu_si256((const __m256i *)(y + 32 * c)));
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(scale[c], p16));
    }
    return sumi;
}

/* Q4_K or Q5_K with up to 4 activation rows: each block is unpacked once (quants, scales, mins) */
static void multi_k4(ggml_type t, int64_t n, const void *vx, const uint8_t *act, size_t stride, int n_act, float *out) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    __m128 acc_m[4] = {_mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps()};
    float summs[4] = {0, 0, 0, 0};
    const __m256i m4 = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
    for (int64_t i = 0; i < n / QK_K; i++) {
        __m256i q[8], scale[8];
        kvb_f16 xd, xdmin;
        const uint8_t *scales;
        if (t == GGML_T_Q4_K) {
            const block_q4_K *b = (const block_q4_K *)vx + i;
            for (int j = 0; j < 4; j++) {
                const __m256i bits = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * j));
                q[2 * j] = _mm256_and_si256(bits, m4);
                q[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
            }
            xd = b->d, xdmin = b->dmin, scales = b->scales;
        } else {
            const block_q5_K *b = (const block_q5_K *)vx + i;
            const __m256i hbits = _mm256_loadu_si256((const __m256i *)b->qh);
            for (int j = 0; j < 4; j++) {
                const __m256i bits = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * j));
                const __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(hbits, 2 * j), one);
                const __m256i h1 = _mm256_and_si256(_mm256_srli_epi16(hbits, 2 * j + 1), one);
                q[2 * j] = _mm256_or_si256(_mm256_and_si256(bits, m4), _mm256_slli_epi16(h0, 4));
                q[2 * j + 1] =
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bits, 4), m4), _mm256_slli_epi16(h1, 4));
            }
            xd = b->d, xdmin = b->dmin, scales = b->scales;
        }
        uint8_t sc[8], mn[8];
        k4_scales(scales, sc, mn);
        for (int s = 0; s < 8; s++) scale[s] = _mm256_set1_epi16(sc[s]);
        const __m128i mins = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn));
        const float dx = F(xd), dminx = F(xdmin);
        for (int a = 0; a < n_act; a++) {
            const block_q8_K *y = (const block_q8_K *)(act + a * stride) + i;
            const __m256i sumi = k_sumi(q, scale, y->qs);
            acc[a] = _mm256_fmadd_ps(_mm256_set1_ps(y->d * dx), _mm256_cvtepi32_ps(sumi), acc[a]);
            /* q8s[k] = bsums[2k] + bsums[2k+1] (32-value sums); prod[m] = mins . q8s over 2m, 2m+1 */
            const __m128i q8s = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)y->bsums),
                                               _mm_loadu_si128((const __m128i *)(y->bsums + 8)));
            const __m128i prod = _mm_madd_epi16(mins, q8s);
            const float dmin = -y->d * dminx;
            if (t == GGML_T_Q4_K) {
                acc_m[a] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m[a]);
            } else {
                const __m128i h = _mm_hadd_epi32(_mm_hadd_epi32(prod, prod), prod);
                summs[a] = fmaf(dmin, (float)_mm_cvtsi128_si32(h), summs[a]);
            }
        }
    }
    for (int a = 0; a < n_act; a++) out[a] = gc_sum8v(acc[a]) + (t == GGML_T_Q4_K ? hsum4(acc_m[a]) : summs[a]);
}

static void multi_q6_K(int64_t n, const block_q6_K *x, const uint8_t *act, size_t stride, int n_act, float *out) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    const __m256i m4 = _mm256_set1_epi8(0xF), m3 = _mm256_set1_epi8(3);
    for (int64_t i = 0; i < n / QK_K; i++) {
        __m256i q[8], scale[8];
        for (int h = 0; h < 2; h++) {
            const __m256i lo1 = _mm256_loadu_si256((const __m256i *)(x[i].ql + 64 * h));
            const __m256i lo2 = _mm256_loadu_si256((const __m256i *)(x[i].ql + 64 * h + 32));
            const __m256i hi = _mm256_loadu_si256((const __m256i *)(x[i].qh + 32 * h));
            q[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(lo1, m4), _mm256_slli_epi16(_mm256_and_si256(hi, m3), 4));
            q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(lo2, m4),
                                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hi, 2), m3), 4));
            q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo1, 4), m4),
                                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hi, 4), m3), 4));
            q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo2, 4), m4),
                                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hi, 6), m3), 4));
        }
        /* chunk c: scales[2c] on its first 16 values, scales[2c+1] on the rest, as int16 */
        for (int c = 0; c < 8; c++)
            scale[c] = _mm256_set_m128i(_mm_set1_epi16(x[i].scales[2 * c + 1]), _mm_set1_epi16(x[i].scales[2 * c]));
        const float dx = F(x[i].d);
        const __m256i scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[i].scales));
        for (int a = 0; a < n_act; a++) {
            const block_q8_K *y = (const block_q8_K *)(act + a * stride) + i;
            /* (q - 32) . y as q . y minus 32 x (scales . bsums), lane by lane as llama.cpp splits it */
            const __m256i off = _mm256_slli_epi32(
                _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), scales16), 5);
            __m256i sumi = _mm256_setzero_si256();
            for (int c = 0; c < 8; c++) {
                const __m256i yq = _mm256_loadu_si256((const __m256i *)(y->qs + 32 * c));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(scale[c], _mm256_maddubs_epi16(q[c], yq)));
            }
            sumi = _mm256_sub_epi32(sumi, off);
            acc[a] = _mm256_fmadd_ps(_mm256_set1_ps(y->d * dx), _mm256_cvtepi32_ps(sumi), acc[a]);
        }
    }
    for (int a = 0; a < n_act; a++) out[a] = gc_sum8v(acc[a]);
}
#endif

void quant_k_dot_multi(ggml_type t, int64_t n, const void *w, const void *act, size_t stride, int n_act, float *out,
                       int simd) {
#if KVB_HAVE_AVX2
    if (simd) {
        if (t == GGML_T_Q6_K) multi_q6_K(n, w, act, stride, n_act, out);
        else multi_k4(t, n, w, act, stride, n_act, out);
        return;
    }
#else
    (void)simd;
#endif
    for (int a = 0; a < n_act; a++) {
        const block_q8_K *y = (const block_q8_K *)((const uint8_t *)act + a * stride);
        out[a] = t == GGML_T_Q6_K ? dot_q6_K_scalar(n, w, y) : dot_k4_scalar(t, n, w, y);
    }
}
