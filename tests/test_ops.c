/* test_ops.c — rmsnorm, rope, swiglu, add, softmax, top-k against float64 references
 * (and, for rmsnorm and rope, against ggml's exact float formula); the ops' double exp against long double. */
#include <CUnit/Basic.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/topk.h"
#include "kernels/cpu/expd.h"
#include "kernels/cpu/ops.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rng_u64(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double rng_unit(void) { return (double)(rng_u64() >> 11) * (1.0 / 9007199254740992.0); }
static float rng_normal(void) {
    double u = rng_unit() + 1e-300, v = rng_unit();
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

static double max_err_rmsnorm, max_err_rope_same_theta, max_err_rope_f64, max_err_swiglu, max_err_softmax;

/* ---- rmsnorm ---- */

static void test_rmsnorm_matches_f64_reference_for_odd_and_model_sizes(void) {
    const int64_t sizes[] = {1, 7, 17, 64, 576, 1000, 4096};
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        const int64_t n = sizes[si], rows = 3;
        float *x = malloc(sizeof(float) * n * rows), *w = malloc(sizeof(float) * n);
        float *y = malloc(sizeof(float) * n * rows);
        for (int64_t i = 0; i < n * rows; i++) x[i] = rng_normal() * (i % 5 == 0 ? 30.0f : 1.0f);
        for (int64_t i = 0; i < n; i++) w[i] = 0.5f + (float)rng_unit();
        const float eps = 1e-5f;
        cpu_rmsnorm(y, x, w, n, rows, eps);
        for (int64_t r = 0; r < rows; r++) {
            double ss = 0;
            for (int64_t i = 0; i < n; i++) ss += (double)x[r * n + i] * x[r * n + i];
            const double sc = 1.0 / sqrt(ss / n + eps);
            for (int64_t i = 0; i < n; i++) {
                const double ref = x[r * n + i] * sc * w[i];
                const double e = fabs(y[r * n + i] - ref) / (fabs(ref) + 1e-30);
                if (e > max_err_rmsnorm) max_err_rmsnorm = e;
                CU_ASSERT(e < 1e-6);
            }
        }
        free(x), free(w), free(y);
    }
}

static void test_rmsnorm_is_bitwise_ggml_formula_and_works_in_place(void) {
    const int64_t n = 576, rows = 4;
    float *x = malloc(sizeof(float) * n * rows), *w = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n * rows);
    for (int64_t i = 0; i < n * rows; i++) x[i] = rng_normal();
    for (int64_t i = 0; i < n; i++) w[i] = rng_normal();
    cpu_rmsnorm(y, x, w, n, rows, 1e-5f);
    int same = 1;
    for (int64_t r = 0; r < rows; r++) {
        /* ggml: double sum of float squares in order, float mean, 1/sqrtf, then (x*scale)*w */
        double sum = 0;
        for (int64_t i = 0; i < n; i++) sum += (double)(x[r * n + i] * x[r * n + i]);
        const float mean = (float)(sum / n), scale = 1.0f / sqrtf(mean + 1e-5f);
        for (int64_t i = 0; i < n; i++) {
            volatile float t = x[r * n + i] * scale;
            same &= (y[r * n + i] == t * w[i]);
        }
    }
    CU_ASSERT(same);
    cpu_rmsnorm(x, x, w, n, rows, 1e-5f);
    CU_ASSERT(memcmp(x, y, sizeof(float) * n * rows) == 0);
    free(x), free(w), free(y);
}

/* ---- rope ---- */

/* ggml's algorithm spelled out independently: float theta by repeated multiplication, then the
 * rotation evaluated in double (so only the angle carries float rounding) */
static void rope_ref(double *out, const float *x, int n_head, int hd, int n_rot, int32_t pos, float base, int neox,
                     int float_theta) {
    const int np = n_rot / 2;
    const float ts = powf(base, -2.0f / n_rot);
    for (int h = 0; h < n_head; h++) {
        const float *xh = x + h * hd;
        double *oh = out + h * hd;
        for (int i = 0; i < hd; i++) oh[i] = xh[i];
        float th = (float)pos;
        for (int i = 0; i < np; i++) {
            const double t = float_theta ? (double)th : (double)pos * pow((double)base, -2.0 * i / n_rot);
            th *= ts;
            const int j0 = neox ? i : 2 * i, j1 = neox ? i + np : 2 * i + 1;
            const double c = cos(t), s = sin(t);
            oh[j0] = xh[j0] * c - xh[j1] * s;
            oh[j1] = xh[j0] * s + xh[j1] * c;
        }
    }
}

static void check_rope(int n_head, int hd, int n_rot, int neox, float base) {
    const int32_t pos[] = {0, 1, 2, 17, 100, 1023, 4097, 8000, 7999};
    const int n_tok = (int)(sizeof pos / sizeof *pos);
    const size_t n = (size_t)n_tok * n_head * hd;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    double *ref = malloc((size_t)n_head * hd * sizeof(double));
    for (size_t i = 0; i < n; i++) x[i] = rng_normal();
    memcpy(y, x, n * sizeof(float));
    cpu_rope(y, n_tok, n_head, hd, n_rot, pos, base, neox);
    for (int t = 0; t < n_tok; t++) {
        const float *xt = x + (size_t)t * n_head * hd, *yt = y + (size_t)t * n_head * hd;
        if (pos[t] == 0) CU_ASSERT(memcmp(xt, yt, (size_t)n_head * hd * sizeof(float)) == 0); /* identity */
        /* same float angles: only sin/cos and the rotation rounding differ */
        rope_ref(ref, xt, n_head, hd, n_rot, pos[t], base, neox, 1);
        for (int i = 0; i < n_head * hd; i++) {
            const double e = fabs(yt[i] - ref[i]);
            if (e > max_err_rope_same_theta) max_err_rope_same_theta = e;
            CU_ASSERT(e < 2e-6 * (1.0 + fabs(ref[i])) + 1e-6);
        }
        /* exact angles: the float angle of pair i is off by up to ~pos * i * 2^-23 relative steps */
        rope_ref(ref, xt, n_head, hd, n_rot, pos[t], base, neox, 0);
        for (int h = 0; h < n_head; h++)
            for (int i = 0; i < hd; i++) {
                const int pair = i < n_rot ? (neox ? i % (n_rot / 2) : i / 2) : 0;
                const double dtheta = (double)pos[t] * (pair + 1) * 2.0 * 1.1920929e-7;
                const double bound = 1e-5 + 2.0 * dtheta * 4.0; /* |x0|+|x1| < 4 almost surely */
                const double e = fabs(yt[h * hd + i] - ref[h * hd + i]);
                if (e > max_err_rope_f64) max_err_rope_f64 = e;
                CU_ASSERT(e < bound);
                if (i >= n_rot) CU_ASSERT(yt[h * hd + i] == x[(size_t)t * n_head * hd + h * hd + i]);
            }
    }
    free(x), free(y), free(ref);
}

static void test_rope_normal_mode_matches_reference_at_pos_0_to_8000(void) {
    check_rope(9, 64, 64, 0, 10000.0f);
    check_rope(3, 128, 128, 0, 500000.0f);
    check_rope(2, 80, 80, 0, 10000.0f);
    check_rope(2, 64, 32, 0, 10000.0f); /* partial rotary: dims >= n_rot untouched */
}

static void test_rope_neox_mode_matches_reference_at_pos_0_to_8000(void) {
    check_rope(9, 64, 64, 1, 1000000.0f);
    check_rope(4, 128, 128, 1, 10000.0f);
    check_rope(2, 80, 80, 1, 10000.0f);
    check_rope(2, 64, 32, 1, 10000.0f);
}

static void test_rope_freq_factors_divide_the_angle(void) {
    const int hd = 64, nh = 2, np = hd / 2;
    const int32_t pos[2] = {5, 3000};
    float x[2 * 2 * 64], y[2 * 2 * 64], ff[32];
    for (int i = 0; i < 2 * nh * hd; i++) x[i] = rng_normal();
    for (int i = 0; i < np; i++) ff[i] = 1.0f + (float)i;
    memcpy(y, x, sizeof x);
    cpu_rope_ext(y, 2, nh, hd, hd, pos, 10000.0f, 0, ff);
    const float ts = powf(10000.0f, -2.0f / hd);
    for (int t = 0; t < 2; t++) {
        float th = (float)pos[t];
        for (int i = 0; i < np; i++) {
            const double a = (double)(th / ff[i]);
            th *= ts;
            for (int h = 0; h < nh; h++) {
                const float *xp = x + (t * nh + h) * hd + 2 * i;
                const float *yp = y + (t * nh + h) * hd + 2 * i;
                CU_ASSERT(fabs(yp[0] - (xp[0] * cos(a) - xp[1] * sin(a))) < 1e-5);
                CU_ASSERT(fabs(yp[1] - (xp[0] * sin(a) + xp[1] * cos(a))) < 1e-5);
            }
        }
    }
}

/* ---- swiglu, add ---- */

static void test_swiglu_matches_f64_and_survives_large_inputs(void) {
    const int64_t n = 1037;
    float *g = malloc(n * sizeof(float)), *u = malloc(n * sizeof(float)), *o = malloc(n * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        g[i] = rng_normal() * 4.0f;
        u[i] = rng_normal();
    }
    g[0] = 100.0f, g[1] = -100.0f, g[2] = 0.0f, g[3] = -88.0f, g[4] = 90.0f, g[20] = -200.0f;
    cpu_swiglu(o, g, u, n);
    for (int64_t i = 0; i < n; i++) {
        const double ref = (double)g[i] / (1.0 + exp(-(double)g[i])) * u[i];
        const double e = fabs(o[i] - ref);
        if (e / (fabs(ref) + 1e-30) > max_err_swiglu && fabs(ref) > 1e-30) max_err_swiglu = e / fabs(ref);
        CU_ASSERT(isfinite(o[i]));
        CU_ASSERT(e <= 1e-6 * fabs(ref) + 1e-35);
    }
    cpu_swiglu(g, g, u, n); /* aliasing */
    CU_ASSERT(memcmp(g, o, n * sizeof(float)) == 0);
    free(g), free(u), free(o);
}

static void test_add_is_exact_float_sum(void) {
    const int64_t n = 77;
    float a[77], b[77], o[77];
    for (int i = 0; i < n; i++) a[i] = rng_normal(), b[i] = rng_normal();
    cpu_add(o, a, b, n);
    int same = 1;
    for (int i = 0; i < n; i++) same &= (o[i] == a[i] + b[i]);
    CU_ASSERT(same);
}

/* ---- softmax ---- */

static void test_softmax_matches_f64_with_masked_entries(void) {
    const int64_t sizes[] = {1, 5, 16, 37, 1000, 8003};
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        const int64_t n = sizes[si];
        float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
        for (int64_t i = 0; i < n; i++) x[i] = rng_normal() * 5.0f + 3.0f;
        for (int64_t i = 1; i < n; i += 3) x[i] = -INFINITY;
        memcpy(y, x, n * sizeof(float));
        cpu_softmax(y, n);
        double mx = -INFINITY, s = 0;
        for (int64_t i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
        for (int64_t i = 0; i < n; i++) s += exp((double)x[i] - mx);
        double tot = 0;
        for (int64_t i = 0; i < n; i++) {
            const double ref = exp((double)x[i] - mx) / s;
            const double e = fabs(y[i] - ref);
            if (e / (ref + 1e-30) > max_err_softmax && ref > 1e-30) max_err_softmax = e / ref;
            /* x - max is rounded in float (as in ggml): relative error |x - max| * 2^-24 on top of exp's ulps */
            const double tol = ref == 0.0 ? 0.0 : ref * (5e-7 + fabs((double)x[i] - mx) * 1.2e-7);
            CU_ASSERT(e <= tol + 1e-40);
            if (x[i] == -INFINITY) CU_ASSERT(y[i] == 0.0f);
            tot += y[i];
        }
        CU_ASSERT(fabs(tot - 1.0) < 1e-5);
        free(x), free(y);
    }
}

static void test_softmax_of_all_masked_row_is_zero_not_nan(void) {
    float x[20];
    for (int i = 0; i < 20; i++) x[i] = -INFINITY;
    cpu_softmax(x, 20);
    for (int i = 0; i < 20; i++) CU_ASSERT(x[i] == 0.0f);
}

/* ---- top-k ---- */

static const float *cmp_vals;
static int cmp_rank(const void *pa, const void *pb) {
    const int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    const float va = cmp_vals[a], vb = cmp_vals[b];
    const int na = isnan(va), nb = isnan(vb);
    if (na != nb) return na ? 1 : -1;
    if (!na && va != vb) return va > vb ? -1 : 1;
    return a < b ? -1 : 1;
}

static int cmp_slot(const void *pa, const void *pb) {
    const int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    return (a > b) - (a < b);
}

/* the reference: every slot sorted by the rank order, its first k, then sorted by slot */
static void check_topk(const float *x, int64_t n, int64_t k) {
    int32_t *all = malloc(n * sizeof(int32_t)), *got = malloc((k + 1) * sizeof(int32_t));
    for (int64_t i = 0; i < n; i++) all[i] = (int32_t)i;
    cmp_vals = x;
    qsort(all, n, sizeof *all, cmp_rank);
    qsort(all, k, sizeof *all, cmp_slot);
    got[k] = -77;
    kvb_topk_slots(x, n, k, got);
    CU_ASSERT(memcmp(all, got, k * sizeof(int32_t)) == 0);
    CU_ASSERT(got[k] == -77); /* writes exactly k */
    free(all), free(got);
}

static void test_topk_is_the_k_best_in_slot_order_ties_by_lower_index(void) {
    const int64_t n = 1000;
    float *x = malloc(n * sizeof(float));
    for (int64_t i = 0; i < n; i++) x[i] = (float)(rng_u64() % 10); /* many ties */
    const int64_t ks[] = {0, 1, 2, 7, 100, 999, 1000};
    for (size_t i = 0; i < sizeof ks / sizeof *ks; i++) check_topk(x, n, ks[i]);
    for (int64_t i = 0; i < n; i++) x[i] = rng_normal();
    x[3] = NAN, x[500] = -INFINITY, x[501] = INFINITY;
    for (size_t i = 0; i < sizeof ks / sizeof *ks; i++) check_topk(x, n, ks[i]);
    /* the radix select's edges: -0 ties +0, NaNs of either sign tie each other below -inf, denormals, keys that
     * differ only in the low digit, and ties across the k-th value */
    const float edge[] = {0.0f, -0.0f, -NAN, NAN, -INFINITY, 1e-45f, -1e-45f, 1.0f, nextafterf(1.0f, 2.0f),
                          nextafterf(1.0f, 0.0f), -0.0f, 0.0f, 1.0f, -NAN, FLT_MAX, -FLT_MAX, 1.0f};
    const int64_t ne = sizeof edge / sizeof *edge;
    for (int64_t kk = 0; kk <= ne; kk++) check_topk(edge, ne, kk);
    for (int64_t i = 0; i < n; i++) {
        const uint64_t c = rng_u64() % 6;
        x[i] = c == 0 ? -0.0f : c == 1 ? 0.0f : c == 2 ? (i & 1 ? NAN : -NAN) : c == 3 ? nextafterf(2.0f, 3.0f) : 2.0f;
    }
    for (size_t i = 0; i < sizeof ks / sizeof *ks; i++) check_topk(x, n, ks[i]);
    const float small[3] = {1.0f, 1.0f, 1.0f};
    check_topk(small, 3, 3);
    free(x);
}

/* ---- the ops' double exp (kernels/cpu/expd.h) ---- */

/* |got - want| in units of the double spacing at want (long double want; subnormal spacing below 2^-1022) */
static double ulps(double got, long double want) {
    const long double sp = want == 0 ? 0x1p-1074L : fmaxl(ldexpl(1.0L, ilogbl(want) - 52), 0x1p-1074L);
    return (double)(fabsl((long double)got - want) / sp);
}

static double max_ulp_expd;

static void test_expd_within_an_ulp_of_expl_and_its_vector_form_gives_the_same_bits(void) {
    enum { N = 4096 };
    float *x = malloc(N * sizeof *x);
    double *out = malloc(N * sizeof *out);
    double worst = 0;
    /* scalar against long double: across the range that gives normal, subnormal, 0 and inf */
    for (int i = 0; i < 200000; i++) {
        const double v = i < 100000 ? -40.0 * rng_unit() : -760.0 + 1480.0 * rng_unit();
        const double got = kvb_exp_d(v);
        const long double want = expl((long double)v);
        if (want > 0x1p-1022L && want < 0x1p1023L) worst = fmax(worst, ulps(got, want));
        else if (want <= 0x1p-1022L) { CU_ASSERT(fabsl((long double)got - want) <= 0x1p-1074L); } /* subnormal: a step */
        else { CU_ASSERT(isinf(got) || ulps(got, want) <= 1.0); }
    }
    max_ulp_expd = worst;
    CU_ASSERT(worst <= 1.0);
    CU_ASSERT(kvb_exp_d(0.0) == 1.0 && kvb_exp_d(-INFINITY) == 0.0 && kvb_exp_d(1e300) == INFINITY);
    CU_ASSERT(kvb_exp_d(-800.0) == 0.0 && isnan(kvb_exp_d(NAN)) && kvb_exp_d(-745.0) > 0.0);
    /* the array form: -inf gives 0, the rest the scalar's bits, in the vector body and the tail alike */
    const float edge[] = {-INFINITY, NAN, 0.0f, -0.0f, 1.0f, -1.0f, 88.0f, -87.0f, 700.0f, 710.0f, 1e30f, -1e30f, -744.0f,
                          -745.5f, -708.5f, 0.5f * 0.6931472f, -0.5f * 0.6931472f, INFINITY};
    const int ne = (int)(sizeof edge / sizeof *edge);
    const double ms[] = {0.0, 3.5, -2.25, 40.0};
    for (int mi = 0; mi < 4; mi++) {
        for (int i = 0; i < N; i++)
            x[i] = i < ne ? edge[i] : i % 97 == 0 ? -INFINITY : (float)(ms[mi] + (rng_unit() * 2 - 1) * (i % 3 ? 20.0 : 800.0));
        for (int64_t n = 0; n <= 19; n++) { /* every tail length */
            kvb_exp_d_n(x + 3, ms[mi], out, n);
            for (int64_t i = 0; i < n; i++) {
                const double want = x[3 + i] == -INFINITY ? 0.0 : kvb_exp_d((double)x[3 + i] - ms[mi]);
                CU_ASSERT(!memcmp(&out[i], &want, sizeof want));
            }
        }
        kvb_exp_d_n(x, ms[mi], out, N);
        int same = 1;
        for (int i = 0; i < N; i++) {
            const double want = x[i] == -INFINITY ? 0.0 : kvb_exp_d((double)x[i] - ms[mi]);
            same &= !memcmp(&out[i], &want, sizeof want);
        }
        CU_ASSERT(same);
    }
    free(x), free(out);
}

/* kvb_exp_weights_rows against the header's loop row by row (kvb_exp_d, sums in double in order): the same bits for
 * every row count, lengths across the chunk and vector boundaries, -inf and NaN weights */
static void test_exp_weights_rows_are_each_rows_softmax_weights_and_sum_in_order(void) {
    enum { MAXN = 700 };
    float *buf = malloc((size_t)KVB_EXPD_ROWS * MAXN * 2 * sizeof *buf);
    const int64_t ns[] = {0, 1, 7, 16, 255, 256, 257, 513, MAXN};
    for (int nr = 1; nr <= KVB_EXPD_ROWS; nr++)
        for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
            const int64_t n = ns[ni];
            float *w[KVB_EXPD_ROWS], m[KVB_EXPD_ROWS];
            double l[KVB_EXPD_ROWS];
            int same = 1;
            for (int r = 0; r < nr; r++) {
                w[r] = buf + (size_t)r * MAXN;
                float *ref = buf + (size_t)(KVB_EXPD_ROWS + r) * MAXN;
                m[r] = (float)(rng_unit() * 8 - 2);
                for (int64_t i = 0; i < n; i++) {
                    const uint64_t c = rng_u64() % 50;
                    ref[i] = w[r][i] = c == 0 ? -INFINITY : c == 1 ? NAN : m[r] - (float)(rng_unit() * 30);
                }
            }
            kvb_exp_weights_rows(w, nr, n, m, l);
            for (int r = 0; r < nr; r++) {
                const float *ref = buf + (size_t)(KVB_EXPD_ROWS + r) * MAXN;
                double lr = 0;
                for (int64_t i = 0; i < n; i++) {
                    const double e = ref[i] == -INFINITY ? 0.0 : kvb_exp_d((double)ref[i] - (double)m[r]);
                    lr += e;
                    const float ef = (float)e;
                    same &= !memcmp(&w[r][i], &ef, sizeof ef);
                }
                same &= !memcmp(&l[r], &lr, sizeof lr);
            }
            CU_ASSERT(same);
        }
    free(buf);
}

/* the test's name is its function name: it states the behaviour pinned down */
#define ADD(fn) CU_add_test(s, #fn + 5, fn)

int main(void) {
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("ops", NULL, NULL);
    ADD(test_rmsnorm_matches_f64_reference_for_odd_and_model_sizes);
    ADD(test_rmsnorm_is_bitwise_ggml_formula_and_works_in_place);
    ADD(test_rope_normal_mode_matches_reference_at_pos_0_to_8000);
    ADD(test_rope_neox_mode_matches_reference_at_pos_0_to_8000);
    ADD(test_rope_freq_factors_divide_the_angle);
    ADD(test_swiglu_matches_f64_and_survives_large_inputs);
    ADD(test_add_is_exact_float_sum);
    ADD(test_softmax_matches_f64_with_masked_entries);
    ADD(test_softmax_of_all_masked_row_is_zero_not_nan);
    ADD(test_topk_is_the_k_best_in_slot_order_ties_by_lower_index);
    ADD(test_expd_within_an_ulp_of_expl_and_its_vector_form_gives_the_same_bits);
    ADD(test_exp_weights_rows_are_each_rows_softmax_weights_and_sum_in_order);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    printf("\nmax errors: rmsnorm rel %.3g, rope abs (same float angles) %.3g, rope abs (f64 angles) %.3g, "
           "swiglu rel %.3g, softmax rel %.3g, double exp %.3g ulp\n",
           max_err_rmsnorm, max_err_rope_same_theta, max_err_rope_f64, max_err_swiglu, max_err_softmax, max_ulp_expd);
    const unsigned fails = CU_get_number_of_failures();
    CU_cleanup_registry();
    return fails != 0;
}
