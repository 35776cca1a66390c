/* ggml_compat.h — float arithmetic in the exact order of llama.cpp's x86 CPU backend (private to kernels/cpu).
 *
 * A 30-layer model whose activations are rounded to 8 bits before every matmul (Q8_1/Q8_0) turns a
 * one-ulp difference anywhere into logit differences of 0.3-0.7: llama.cpp itself moves its logits that
 * far when only its attention kernel changes (flash on/off) or when tokens go one at a time. So agreeing
 * with llama.cpp to 2e-2 (issue 2) means doing each float operation in the order its AVX2+FMA build does:
 *
 *  - exp: the vector expf ggml uses for softmax and SiLU, a range reduction x = n ln2 + b with
 *    n = round(x / ln2) taken from the 1.5 * 2^23 shift trick, then 2^n * (1 + p(b)) with a degree-5
 *    polynomial (the ARM optimized-routines scheme), and separate scaling where |n| > 126;
 *  - dot products of f32 vectors (attention scores, decode P.V): four 8-lane accumulators over steps of
 *    32, folded as (a0 + a2) + (a1 + a3), then the 8 lanes by halves and two pairwise adds, the rest of
 *    the vector one fused multiply-add at a time;
 *  - an 8-lane vector's sum (softmax groups, prompt P.V): halves added, then ((0+2)+(1+3)).
 *
 * Every function has a scalar version with the same roundings (fmaf, explicit order), used when the
 * compiler does not target AVX2+FMA, so the results are bitwise the same on any x86 or other CPU; the
 * AVX2 versions are the fast path and are tested against the scalar ones bit for bit. */
#ifndef KVB_GGML_COMPAT_H
#define KVB_GGML_COMPAT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define GC_AVX2 1
#else
#define GC_AVX2 0
#endif

static inline uint32_t gc_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}
static inline float gc_float(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* the constants of the scheme: shift 1.5 * 2^23, 1/ln2, ln2 split in a high and a low part, and the
 * polynomial's coefficients (hex floats, as the scheme publishes them) */
#define GC_SHIFT 0x1.8p23f
#define GC_INV_LN2 0x1.715476p+0f
#define GC_LN2_HI 0x1.62e4p-1f
#define GC_LN2_LO 0x1.7f7d1cp-20f
#define GC_P1 0x1.ffffecp-1f
#define GC_P2 0x1.fffdb6p-2f
#define GC_P3 0x1.555e66p-3f
#define GC_P4 0x1.573e2ep-5f
#define GC_P5 0x1.0e4020p-7f

/* one lane of the vector expf */
static inline float gc_expf(float x) {
    const float z = fmaf(x, GC_INV_LN2, GC_SHIFT);
    const float n = z - GC_SHIFT;
    const float b = fmaf(-n, GC_LN2_LO, fmaf(-n, GC_LN2_HI, x));
    const uint32_t e = gc_bits(z) << 23;
    const float k = gc_float(e + gc_bits(1.0f));
    const float u = b * b;
    const float j = fmaf(fmaf(fmaf(GC_P5, b, GC_P4), u, fmaf(GC_P3, b, GC_P2)), u, GC_P1 * b);
    const float an = fabsf(n);
    if (!(an > 126.0f)) return fmaf(j, k, k);
    /* 2^n outside the float exponent range: scale in two steps (s1 * s2 = 2^n), or saturate */
    const uint32_t g = n <= 0.0f ? 0x82000000u : 0u;
    const float s1 = gc_float(g + 0x7f000000u);
    if (an > 192.0f) return s1 * s1;
    const float s2 = gc_float(e - g);
    return fmaf(s2, j, s2) * s1;
}

/* ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)): an 8-lane sum, halves first */
static inline float gc_sum8(const float *v) {
    const float h0 = v[0] + v[4], h1 = v[1] + v[5], h2 = v[2] + v[6], h3 = v[3] + v[7];
    return (h0 + h2) + (h1 + h3);
}

/* gc_dot's fold of its 32 accumulator slots a[i * stride], i = 8 * register + lane */
static inline float gc_fold32(const float *a, size_t stride) {
    float b[8];
    for (int l = 0; l < 8; l++)
        b[l] = (a[l * stride] + a[(16 + l) * stride]) + (a[(8 + l) * stride] + a[(24 + l) * stride]);
    const float t0 = b[0] + b[4], t1 = b[1] + b[5], t2 = b[2] + b[6], t3 = b[3] + b[7];
    return (t0 + t1) + (t2 + t3);
}

/* dot product of n floats in the vector order described above, in scalar code */
static inline float gc_dot_scalar(const float *x, const float *y, int64_t n) {
    const int64_t np = n & ~(int64_t)31;
    float a[32] = {0};
    for (int64_t i = 0; i < np; i += 32)
        for (int s = 0; s < 32; s++) a[s] = fmaf(x[i + s], y[i + s], a[s]);
    float sum = gc_fold32(a, 1);
    for (int64_t i = np; i < n; i++) sum = fmaf(x[i], y[i], sum);
    return sum;
}

/* the same with AVX2 where compiled for it */
static inline float gc_dot(const float *x, const float *y, int64_t n) {
#if GC_AVX2
    const int64_t np = n & ~(int64_t)31;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    for (int64_t i = 0; i < np; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), _mm256_loadu_ps(y + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), _mm256_loadu_ps(y + i + 24), a3);
    }
    a0 = _mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3));
    const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
    const __m128 t1 = _mm_hadd_ps(t0, t0);
    float sum = _mm_cvtss_f32(_mm_hadd_ps(t1, t1));
    for (int64_t i = np; i < n; i++) sum = fmaf(x[i], y[i], sum);
    return sum;
#else
    return gc_dot_scalar(x, y, n);
#endif
}

#if GC_AVX2
/* gc_expf on 8 lanes (bitwise the same as 8 calls) */
static inline __m256 gc_expf8(__m256 x) {
    const __m256 shift = _mm256_set1_ps(GC_SHIFT);
    const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(GC_INV_LN2), shift);
    const __m256 n = _mm256_sub_ps(z, shift);
    const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(GC_LN2_LO), _mm256_fnmadd_ps(n, _mm256_set1_ps(GC_LN2_HI), x));
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
    const __m256 k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1.0f))));
    const __m256 an = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
    const __m256 big = _mm256_cmp_ps(an, _mm256_set1_ps(126.0f), _CMP_GT_OQ);
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(GC_P5), b, _mm256_set1_ps(GC_P4)), u,
                        _mm256_fmadd_ps(_mm256_set1_ps(GC_P3), b, _mm256_set1_ps(GC_P2))),
        u, _mm256_mul_ps(_mm256_set1_ps(GC_P1), b));
    const __m256 normal = _mm256_fmadd_ps(j, k, k);
    if (!_mm256_movemask_ps(big)) return normal;
    const __m256i g = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
                                       _mm256_set1_epi32((int)0x82000000u));
    const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f000000)));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    const __m256 huge = _mm256_cmp_ps(an, _mm256_set1_ps(192.0f), _CMP_GT_OQ);
    const __m256 scaled = _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1);
    __m256 r = _mm256_blendv_ps(normal, scaled, big);
    return _mm256_blendv_ps(r, _mm256_mul_ps(s1, s1), huge);
}

/* gc_sum8 of a vector */
static inline float gc_sum8v(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

#endif
