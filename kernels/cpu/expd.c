/* expd.c — the array form of the ops' double exp (expd.h): AVX-512 eight lanes, AVX2 four, each lane kvb_exp_d's
 * steps, the tail by kvb_exp_d itself. */
#include "kernels/cpu/expd.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

/* out[i] = x[i] == -inf ? 0 : kvb_exp_d((double)x[i] - m) for i < n, in vectors where built for them */
void kvb_exp_d_n(const float *x, double m, double *out, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__)
    const __m512d vm = _mm512_set1_pd(m);
    for (; i + 8 <= n; i += 8) {
        const __m256 xf = _mm256_loadu_ps(x + i);
        __m512d v = _mm512_sub_pd(_mm512_cvtps_pd(xf), vm);
        v = _mm512_max_pd(_mm512_set1_pd(KVB_EXPD_LO), v); /* operand order keeps NaN */
        v = _mm512_min_pd(_mm512_set1_pd(KVB_EXPD_HI), v);
        const __m512d nd = _mm512_roundscale_pd(_mm512_mul_pd(v, _mm512_set1_pd(KVB_EXPD_LOG2E)),
                                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m512d r = _mm512_fnmadd_pd(nd, _mm512_set1_pd(KVB_EXPD_LN2HI), v);
        r = _mm512_fnmadd_pd(nd, _mm512_set1_pd(KVB_EXPD_LN2LO), r);
        const __m512d p = KVB_EXPD_POLY(_mm512_fmadd_pd, _mm512_set1_pd, r);
        const __mmask8 ninf = _mm256_cmp_ps_mask(xf, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ);
        _mm512_storeu_pd(out + i, _mm512_maskz_mov_pd((__mmask8)~ninf, _mm512_scalef_pd(p, nd)));
    }
#elif defined(__AVX2__) && defined(__FMA__)
    const __m256d vm = _mm256_set1_pd(m), magic = _mm256_set1_pd(0x1p52);
    for (; i + 4 <= n; i += 4) {
        const __m128 xf = _mm_loadu_ps(x + i);
        __m256d v = _mm256_sub_pd(_mm256_cvtps_pd(xf), vm);
        v = _mm256_max_pd(_mm256_set1_pd(KVB_EXPD_LO), v); /* operand order keeps NaN */
        v = _mm256_min_pd(_mm256_set1_pd(KVB_EXPD_HI), v);
        const __m256d nd = _mm256_round_pd(_mm256_mul_pd(v, _mm256_set1_pd(KVB_EXPD_LOG2E)),
                                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256d r = _mm256_fnmadd_pd(nd, _mm256_set1_pd(KVB_EXPD_LN2HI), v);
        r = _mm256_fnmadd_pd(nd, _mm256_set1_pd(KVB_EXPD_LN2LO), r);
        const __m256d p = KVB_EXPD_POLY(_mm256_fmadd_pd, _mm256_set1_pd, r);
        /* 2^n1 and 2^(n - n1) from their biased exponents (integers below 2^52: + 2^52 puts them in the low bits) */
        const __m256d n1 = _mm256_floor_pd(_mm256_mul_pd(nd, _mm256_set1_pd(0.5)));
        const __m256d e1 = _mm256_add_pd(n1, _mm256_set1_pd(1023.0)), e2 = _mm256_add_pd(_mm256_sub_pd(nd, n1), _mm256_set1_pd(1023.0));
        const __m256i b1 = _mm256_slli_epi64(_mm256_sub_epi64(_mm256_castpd_si256(_mm256_add_pd(e1, magic)), _mm256_castpd_si256(magic)), 52);
        const __m256i b2 = _mm256_slli_epi64(_mm256_sub_epi64(_mm256_castpd_si256(_mm256_add_pd(e2, magic)), _mm256_castpd_si256(magic)), 52);
        const __m256d y = _mm256_mul_pd(_mm256_mul_pd(p, _mm256_castsi256_pd(b1)), _mm256_castsi256_pd(b2));
        const __m256d ninf = _mm256_cmp_pd(_mm256_cvtps_pd(xf), _mm256_set1_pd(-INFINITY), _CMP_EQ_OQ);
        _mm256_storeu_pd(out + i, _mm256_andnot_pd(ninf, y)); /* NaN lanes: v, nd, p and y are NaN */
    }
#endif
    for (; i < n; i++) out[i] = x[i] == -INFINITY ? 0.0 : kvb_exp_d((double)x[i] - m);
}


enum { EXPD_CHUNK = 256 };

/* rows r < nr (a constant where inlined) of one chunk: e[r][0..c) into w[r][i0..) and added to l[r] in order */
static inline __attribute__((always_inline)) void sum_chunk(float *const *w, int nr, int64_t i0, int c,
                                                            double (*e)[EXPD_CHUNK], double *l) {
    double s[KVB_EXPD_ROWS];
    for (int r = 0; r < nr; r++) s[r] = l[r];
    for (int i = 0; i < c; i++)
        for (int r = 0; r < nr; r++) {
            s[r] += e[r][i];
            w[r][i0 + i] = (float)e[r][i];
        }
    for (int r = 0; r < nr; r++) l[r] = s[r];
}

void kvb_exp_weights_rows(float *const *w, int nr, int64_t n, const float *m, double *l) {
    double e[KVB_EXPD_ROWS][EXPD_CHUNK];
    for (int r = 0; r < nr; r++) l[r] = 0;
    for (int64_t i0 = 0; i0 < n; i0 += EXPD_CHUNK) {
        const int c = n - i0 < EXPD_CHUNK ? (int)(n - i0) : EXPD_CHUNK;
        for (int r = 0; r < nr; r++) kvb_exp_d_n(w[r] + i0, (double)m[r], e[r], c);
        switch (nr) {
        case 1: sum_chunk(w, 1, i0, c, e, l); break;
        case 2: sum_chunk(w, 2, i0, c, e, l); break;
        case 3: sum_chunk(w, 3, i0, c, e, l); break;
        case 4: sum_chunk(w, 4, i0, c, e, l); break;
        case 5: sum_chunk(w, 5, i0, c, e, l); break;
        case 6: sum_chunk(w, 6, i0, c, e, l); break;
        case 7: sum_chunk(w, 7, i0, c, e, l); break;
        default: sum_chunk(w, 8, i0, c, e, l); break;
        }
    }
}
