/* ops_vec.h — private SIMD helpers shared by the CPU kernels (ops, attention, the methods' data ops; not a public contract).
 *
 * One float vector type `vf` of VF_LANES lanes: AVX-512 when the compiler targets it, else AVX2+FMA,
 * else plain scalar floats, so the kernels are written once. We use intrinsics rather than GCC
 * vector extensions because -std=c11 turns off FMA contraction, and the kernels live on FMAs. */
#ifndef KVB_OPS_VEC_H
#define KVB_OPS_VEC_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/dtype.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#if defined(__AVX512F__)

#define VF_LANES 16
typedef __m512 vf;
static inline vf vf_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void vf_store(float *p, vf a) { _mm512_storeu_ps(p, a); }
static inline vf vf_set1(float x) { return _mm512_set1_ps(x); }
static inline vf vf_zero(void) { return _mm512_setzero_ps(); }
static inline vf vf_add(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf vf_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
static inline vf vf_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf vf_div(vf a, vf b) { return _mm512_div_ps(a, b); }
static inline vf vf_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); } /* a*b + c */
static inline vf vf_max(vf a, vf b) { return _mm512_max_ps(a, b); }
static inline vf vf_min(vf a, vf b) { return _mm512_min_ps(a, b); }
static inline float vf_hsum(vf a) { return _mm512_reduce_add_ps(a); }
static inline float vf_hmax(vf a) { return _mm512_reduce_max_ps(a); }
/* lanes where pos[i] > lim become -inf (the causal mask) */
static inline vf vf_mask_after(vf x, const int32_t *pos, int32_t lim) {
    __m512i p = _mm512_loadu_si512((const void *)pos);
    __mmask16 m = _mm512_cmpgt_epi32_mask(p, _mm512_set1_epi32(lim));
    return _mm512_mask_mov_ps(x, m, _mm512_set1_ps(-INFINITY));
}
/* lanes where lim > pos[i] become -inf (one key position against a vector of query positions) */
static inline vf vf_mask_before(vf x, int32_t kpos, const int32_t *qpos) {
    __m512i q = _mm512_loadu_si512((const void *)qpos);
    __mmask16 m = _mm512_cmpgt_epi32_mask(_mm512_set1_epi32(kpos), q);
    return _mm512_mask_mov_ps(x, m, _mm512_set1_ps(-INFINITY));
}
/* exp on [-inf, +inf]: 2^n * poly(r), r = x - n ln2 in [-ln2/2, ln2/2]; degree-7 Taylor keeps the
 * polynomial error near 5e-9 relative, so the result is within ~2 ulp of expf. Below -104 the true
 * value is under half the smallest subnormal, so 0 is exact rounding (masked logits must give 0). */
static inline vf vf_exp(vf x) {
    x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x); /* operand order keeps NaN */
    x = _mm512_min_ps(_mm512_set1_ps(89.0f), x);
    vf n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vf r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
    vf p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}
/* VF_LANES halves to f32 */
static inline vf vf_load_f16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
/* r[i][j] <- r[j][i]: a 16 x 16 transpose in registers (32-bit unpacks, 64-bit shuffles, then 128-bit lanes) */
static inline void vf_transpose(vf *r) {
    vf t[16], u[16];
    for (int i = 0; i < 16; i += 2) t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]), t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    for (int a = 0; a < 16; a += 4) { /* u[a + b], lane k: rows a..a+3 at column 4k + b */
        u[a] = _mm512_shuffle_ps(t[a], t[a + 2], 0x44), u[a + 1] = _mm512_shuffle_ps(t[a], t[a + 2], 0xEE);
        u[a + 2] = _mm512_shuffle_ps(t[a + 1], t[a + 3], 0x44), u[a + 3] = _mm512_shuffle_ps(t[a + 1], t[a + 3], 0xEE);
    }
    for (int b = 0; b < 4; b++) {
        const vf v0 = _mm512_shuffle_f32x4(u[b], u[4 + b], 0x44), v1 = _mm512_shuffle_f32x4(u[b], u[4 + b], 0xEE);
        const vf v2 = _mm512_shuffle_f32x4(u[8 + b], u[12 + b], 0x44), v3 = _mm512_shuffle_f32x4(u[8 + b], u[12 + b], 0xEE);
        r[b] = _mm512_shuffle_f32x4(v0, v2, 0x88), r[4 + b] = _mm512_shuffle_f32x4(v0, v2, 0xDD);
        r[8 + b] = _mm512_shuffle_f32x4(v1, v3, 0x88), r[12 + b] = _mm512_shuffle_f32x4(v1, v3, 0xDD);
    }
}
/* lane i of the result = sum of the lanes of v[i], for VF_LANES vectors: a transpose-and-add tree,
 * about 3 instructions per sum instead of ~8 for one horizontal sum each */
static inline vf vf_sum_each(const vf *v) {
    __m512 t[8], u[4], w[2];
    for (int k = 0; k < 8; k++)
        t[k] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * k], v[2 * k + 1]), _mm512_unpackhi_ps(v[2 * k], v[2 * k + 1]));
    for (int k = 0; k < 4; k++) {
        const __m512d a = _mm512_castps_pd(t[2 * k]), b = _mm512_castps_pd(t[2 * k + 1]);
        u[k] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    for (int k = 0; k < 2; k++)
        w[k] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * k], u[2 * k + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(u[2 * k], u[2 * k + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

#elif defined(__AVX2__) && defined(__FMA__)

#define VF_LANES 8
typedef __m256 vf;
static inline vf vf_load(const float *p) { return _mm256_loadu_ps(p); }
static inline void vf_store(float *p, vf a) { _mm256_storeu_ps(p, a); }
static inline vf vf_set1(float x) { return _mm256_set1_ps(x); }
static inline vf vf_zero(void) { return _mm256_setzero_ps(); }
static inline vf vf_add(vf a, vf b) { return _mm256_add_ps(a, b); }
static inline vf vf_sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
static inline vf vf_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
static inline vf vf_div(vf a, vf b) { return _mm256_div_ps(a, b); }
static inline vf vf_fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf vf_max(vf a, vf b) { return _mm256_max_ps(a, b); }
static inline vf vf_min(vf a, vf b) { return _mm256_min_ps(a, b); }
static inline float vf_hsum(vf a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline float vf_hmax(vf a) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline vf vf_mask_after(vf x, const int32_t *pos, int32_t lim) {
    __m256i p = _mm256_loadu_si256((const __m256i *)pos);
    __m256 m = _mm256_castsi256_ps(_mm256_cmpgt_epi32(p, _mm256_set1_epi32(lim)));
    return _mm256_blendv_ps(x, _mm256_set1_ps(-INFINITY), m);
}
static inline vf vf_mask_before(vf x, int32_t kpos, const int32_t *qpos) {
    __m256i q = _mm256_loadu_si256((const __m256i *)qpos);
    __m256 m = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(kpos), q));
    return _mm256_blendv_ps(x, _mm256_set1_ps(-INFINITY), m);
}
/* as the AVX-512 version; 2^n is built in the exponent field, valid for n in [-126, 127],
 * so inputs below -87 (exp < 2^-125.5) are flushed to 0 and above 88.5 to +inf */
static inline vf vf_exp(vf x) {
    vf lo = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
    vf hi = _mm256_cmp_ps(x, _mm256_set1_ps(88.5f), _CMP_GT_OQ);
    vf xc = _mm256_max_ps(_mm256_set1_ps(-87.0f), x);
    xc = _mm256_min_ps(_mm256_set1_ps(88.5f), xc);
    vf n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vf r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), xc);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);
    vf p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    vf y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    y = _mm256_andnot_ps(lo, y);
    y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), hi);
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q)); /* NaN stays NaN */
}
static inline vf vf_load_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
/* r[i][j] <- r[j][i]: an 8 x 8 transpose in registers (32-bit unpacks, 64-bit shuffles, then 128-bit halves) */
static inline void vf_transpose(vf *r) {
    vf t[8], u[8];
    for (int i = 0; i < 8; i += 2) t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]), t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    for (int a = 0; a < 8; a += 4) { /* u[a + b], half k: rows a..a+3 at column 4k + b */
        u[a] = _mm256_shuffle_ps(t[a], t[a + 2], 0x44), u[a + 1] = _mm256_shuffle_ps(t[a], t[a + 2], 0xEE);
        u[a + 2] = _mm256_shuffle_ps(t[a + 1], t[a + 3], 0x44), u[a + 3] = _mm256_shuffle_ps(t[a + 1], t[a + 3], 0xEE);
    }
    for (int b = 0; b < 4; b++)
        r[b] = _mm256_permute2f128_ps(u[b], u[4 + b], 0x20), r[4 + b] = _mm256_permute2f128_ps(u[b], u[4 + b], 0x31);
}
static inline vf vf_sum_each(const vf *v) {
    __m256 t[4], u[2];
    for (int k = 0; k < 4; k++)
        t[k] = _mm256_add_ps(_mm256_unpacklo_ps(v[2 * k], v[2 * k + 1]), _mm256_unpackhi_ps(v[2 * k], v[2 * k + 1]));
    for (int k = 0; k < 2; k++) {
        const __m256d a = _mm256_castps_pd(t[2 * k]), b = _mm256_castps_pd(t[2 * k + 1]);
        u[k] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(a, b)), _mm256_castpd_ps(_mm256_unpackhi_pd(a, b)));
    }
    return _mm256_add_ps(_mm256_permute2f128_ps(u[0], u[1], 0x20), _mm256_permute2f128_ps(u[0], u[1], 0x31));
}

#else /* portable scalar fallback: one lane */

#include "kernels/dtype.h"
#define VF_LANES 1
typedef float vf;
static inline vf vf_load(const float *p) { return *p; }
static inline void vf_store(float *p, vf a) { *p = a; }
static inline vf vf_set1(float x) { return x; }
static inline vf vf_zero(void) { return 0.0f; }
static inline vf vf_add(vf a, vf b) { return a + b; }
static inline vf vf_sub(vf a, vf b) { return a - b; }
static inline vf vf_mul(vf a, vf b) { return a * b; }
static inline vf vf_div(vf a, vf b) { return a / b; }
static inline vf vf_fma(vf a, vf b, vf c) { return fmaf(a, b, c); }
static inline vf vf_max(vf a, vf b) { return a > b ? a : b; }
static inline vf vf_min(vf a, vf b) { return a < b ? a : b; }
static inline float vf_hsum(vf a) { return a; }
static inline float vf_hmax(vf a) { return a; }
static inline vf vf_mask_after(vf x, const int32_t *pos, int32_t lim) { return *pos > lim ? -INFINITY : x; }
static inline vf vf_mask_before(vf x, int32_t kpos, const int32_t *qpos) { return kpos > *qpos ? -INFINITY : x; }
static inline vf vf_exp(vf x) { return expf(x); }
static inline vf vf_load_f16(const uint16_t *p) { return kvb_f16_to_f32(*p); }
static inline void vf_transpose(vf *r) { (void)r; }
static inline vf vf_sum_each(const vf *v) { return v[0]; }

#endif

/* ---- KV rows (f16 or f32), shared by the attention kernels and the methods' data ops ---- */

/* Prefetch of a row an index list names (row_bytes from base + slot x row_bytes). A list's rows are scattered, so
 * the hardware's stream prefetch, which carries the dense path, misses them: attention over a list was read at half
 * the dense path's bytes/s or less without it (attention.c), and kv_load's copies likewise (kvops.c). */
static inline void prefetch_row(const void *base, int32_t slot, int row_bytes) {
    const char *r = (const char *)base + (int64_t)slot * row_bytes;
    for (int o = 0; o < row_bytes; o += 64) __builtin_prefetch(r + o);
}

/* VF_LANES elements of f16 or f32 rows from element `at` */
static inline __attribute__((always_inline)) vf vf_load_kv(const void *rows, kvb_dtype dt, int64_t at) {
    return dt == KVB_F16 ? vf_load_f16((const uint16_t *)rows + at) : vf_load((const float *)rows + at);
}

/* row `slot` (d elements) of f16 or f32 rows widened to f32 into dst, zeros from d up to dp */
static inline __attribute__((always_inline)) void vf_widen_row(float *dst, const void *rows, int64_t slot, int d, int dp,
                                                               kvb_dtype dt) {
    if (dt == KVB_F32) {
        memcpy(dst, (const float *)rows + slot * d, (size_t)d * sizeof(float));
    } else {
        const uint16_t *src = (const uint16_t *)rows + slot * d;
        int i = 0;
        for (; i + VF_LANES <= d; i += VF_LANES) vf_store(dst + i, vf_load_f16(src + i));
        for (; i < d; i++) dst[i] = kvb_f16_to_f32(src[i]);
    }
    for (int i = d; i < dp; i++) dst[i] = 0.0f;
}

#endif
