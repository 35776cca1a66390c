/* expd.h — the CPU backend's exp in double, the one its ops use where the header says exp((double)x): the
 * softmax weights of attention_quant and attention_narrow (kvquant.c, narrow.c) and their merges.
 *
 * exp(x) = 2^n p(r): n = rint(x log2 e), r = x - n ln2 (two FMAs over ln2 split high/low), p = the degree-13
 * Taylor polynomial of e^r by Horner's rule in FMAs (|r| <= ln2/2: truncation under 5e-18 relative), then
 * p x 2^n rounded once (scalar: two exact-or-once-rounded multiplies; AVX-512: scalef). Every step is an IEEE
 * operation with one rounding, so the scalar kvb_exp_d and each lane of kvb_exp_d_n give the same bits on any
 * x86-64 or other IEEE machine (libm's exp differs by libm). Within about 1 ulp of the true value
 * (test_ops holds it to expl); exp(-inf) = 0, exp(NaN) = NaN, exp(x > 709.8) = +inf. */
#ifndef KVB_CPU_EXPD_H
#define KVB_CPU_EXPD_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define KVB_EXPD_LOG2E 1.4426950408889634074
#define KVB_EXPD_LN2HI 6.93147180369123816490e-01 /* ln 2's top 32 bits: n x LN2HI is exact */
#define KVB_EXPD_LN2LO 1.90821492927058770002e-10
/* the input range kept: below -1100 the result is 0 and above 710 it is +inf either way */
#define KVB_EXPD_LO (-1100.0)
#define KVB_EXPD_HI 710.0

/* e^r on |r| <= ln2/2: 1/k! for k = 13 .. 0, by Horner's rule */
#define KVB_EXPD_POLY(FMA, SET1, r)                                                                               \
    FMA(FMA(FMA(FMA(FMA(FMA(FMA(FMA(FMA(FMA(FMA(FMA(FMA(SET1(1.0 / 6227020800.0), r, SET1(1.0 / 479001600.0)), r, \
    SET1(1.0 / 39916800.0)), r, SET1(1.0 / 3628800.0)), r, SET1(1.0 / 362880.0)), r, SET1(1.0 / 40320.0)), r,    \
    SET1(1.0 / 5040.0)), r, SET1(1.0 / 720.0)), r, SET1(1.0 / 120.0)), r, SET1(1.0 / 24.0)), r, SET1(1.0 / 6.0)),  \
    r, SET1(0.5)), r, SET1(1.0)), r, SET1(1.0))

static inline double kvb_expd_set1(double x) { return x; }

/* 2^k for an integer k in [-1022, 1023], exactly */
static inline double kvb_expd_pow2(double k) {
    const uint64_t bits = (uint64_t)((int64_t)k + 1023) << 52;
    double p;
    memcpy(&p, &bits, sizeof p);
    return p;
}

static inline double kvb_exp_d(double x) {
    x = x < KVB_EXPD_LO ? KVB_EXPD_LO : x; /* comparisons false for NaN: it passes through */
    x = x > KVB_EXPD_HI ? KVB_EXPD_HI : x;
    if (x != x) return x;
    const double n = rint(x * KVB_EXPD_LOG2E);
    const double r = fma(-n, KVB_EXPD_LN2LO, fma(-n, KVB_EXPD_LN2HI, x));
    const double p = KVB_EXPD_POLY(fma, kvb_expd_set1, r);
    /* n in [-1587, 1024]: p 2^n1 is exact (normal), the second multiply rounds once */
    const double n1 = floor(n * 0.5);
    return p * kvb_expd_pow2(n1) * kvb_expd_pow2(n - n1);
}

/* out[i] = x[i] == -inf ? 0 : kvb_exp_d((double)x[i] - m) for i < n, in vectors where built for them (expd.c) */
void kvb_exp_d_n(const float *x, double m, double *out, int64_t n);

/* softmax weights in place, as the ops' headers say, for rows w[r] (r < nr, nr <= KVB_EXPD_ROWS) of n weights
 * each: w[r][i] = (float)e_i with e_i = kvb_exp_d((double)w[r][i] - m[r]) (0 for -inf), and l[r] = the sum of the
 * e_i in double, i ascending (the rows' sums interleaved so that their adds overlap) */
enum { KVB_EXPD_ROWS = 8 };
void kvb_exp_weights_rows(float *const *w, int nr, int64_t n, const float *m, double *l);

#endif
