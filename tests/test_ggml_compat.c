/* test_ggml_compat.c — llama.cpp's float order (kernels/cpu/ggml_compat.h) and the attention built on it.
 *
 * - gc_expf against libm's expf over the whole float range (the scheme's documented error is under
 *   2 ulp; below -103.97 it flushes to 0, above 88.38 to +inf), and the 8-lane version bit for bit
 *   against the scalar one, including the lanes that take the large-|n| scaling path;
 * - gc_dot (AVX2 when compiled for it) bit for bit against gc_dot_scalar, and both against float64;
 * - cpu_attention on an f32 cache (the llama.cpp-order path) bit for bit against a plain restatement of
 *   the order written here from the scalar helpers, for prompt chunks and single tokens, causal masks,
 *   index lists and GQA, key positions in order and shuffled (masked keys before a row's last visible one), over
 *   several key blocks and query units (fewer tokens a unit past 8K keys), with 1 and 2 threads; and against float64
 *   within 1e-5.
 * The end-to-end check that this order is llama.cpp's is test_model_llamacpp (logits within 2e-2,
 * 5e-6 on the fixture machine). */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util_common.h"
#include "kernels/cpu/ggml_compat.h"
#include "kernels/cpu/ops.h"

static uint64_t rng = 0x243F6A8885A308D3ull;
static uint32_t rnd32(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}
static float rnd_unit(void) { return (float)(rnd32() >> 8) / 16777216.0f; } /* [0, 1) */
static float rnd_sym(void) { return 2.0f * rnd_unit() - 1.0f; }

static int same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

/* distance in units in the last place between two finite floats of the same sign */
static double ulps(float a, float b) {
    if (a == b) return 0;
    const float big = fmaxf(fabsf(a), fabsf(b));
    return fabs((double)a - (double)b) / (double)(nextafterf(big, INFINITY) - big);
}

static void test_expf_is_within_2_ulp_of_libm_and_flushes_at_the_ends(void) {
    double worst = 0;
    for (int i = 0; i <= 2000000; i++) {
        const float x = -103.9f + (88.3f + 103.9f) * (float)i / 2000000.0f;
        const float got = gc_expf(x), want = expf(x);
        if (want < 0x1p-126f) continue; /* subnormal results: compared below in absolute terms */
        const double u = ulps(got, want);
        if (u > worst) worst = u;
    }
    printf("\n  gc_expf vs expf on [-103.9, 88.3]: max %.2f ulp", worst);
    CU_ASSERT(worst <= 2.5);
    for (float x = -103.9f; x < -87.3f; x += 0.01f) CU_ASSERT(fabsf(gc_expf(x) - expf(x)) <= 0x1p-148f);
    CU_ASSERT(gc_expf(0.0f) == 1.0f);
    CU_ASSERT(gc_expf(-INFINITY) == 0.0f); /* masked logits */
    CU_ASSERT(gc_expf(-200.0f) == 0.0f);
    CU_ASSERT(isinf(gc_expf(89.0f)) && gc_expf(89.0f) > 0);
    CU_ASSERT(isinf(gc_expf(INFINITY)));
}

static void test_vector_expf_and_sums_are_bitwise_the_scalar_ones(void) {
#if GC_AVX2
    int bad = 0;
    float x[8], y[8];
    for (int t = 0; t < 200000; t++) {
        /* mostly softmax-like inputs; every 4th vector spans the far ends so the scaling path runs */
        for (int l = 0; l < 8; l++) x[l] = t % 4 == 3 ? 230.0f * rnd_sym() : 20.0f * rnd_sym() - 10.0f;
        if (t % 97 == 0) x[t % 8] = -INFINITY;
        _mm256_storeu_ps(y, gc_expf8(_mm256_loadu_ps(x)));
        for (int l = 0; l < 8; l++) bad += !same_bits(y[l], gc_expf(x[l]));
        bad += !same_bits(gc_sum8v(_mm256_loadu_ps(y)), gc_sum8(y));
    }
    CU_ASSERT_EQUAL(bad, 0);
#else
    printf("\n  (scalar build: gc_expf is the only version)");
#endif
}

static void test_dot_is_bitwise_the_scalar_order_and_close_to_float64(void) {
    const int64_t sizes[] = {1, 7, 31, 32, 33, 64, 80, 128, 1000, 4096};
    float *x = malloc(4096 * sizeof *x), *y = malloc(4096 * sizeof *y);
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        const int64_t n = sizes[k];
        for (int rep = 0; rep < 50; rep++) {
            double ref = 0, mag = 0;
            for (int64_t i = 0; i < n; i++) {
                x[i] = rnd_sym() * (rep % 3 ? 1.0f : 50.0f), y[i] = rnd_sym();
                ref += (double)x[i] * y[i], mag += fabs((double)x[i] * y[i]);
            }
            const float a = gc_dot(x, y, n), b = gc_dot_scalar(x, y, n);
            CU_ASSERT(same_bits(a, b));
            CU_ASSERT(fabs(a - ref) <= 1e-6 * mag + 1e-30);
        }
    }
    free(x), free(y);
}

/* ---- attention: the documented order, restated one element at a time ---- */

typedef struct {
    int n_q, n_head, n_head_kv, D;
    int64_t n_kv;
    int with_idx, causal;
    int shuffled; /* the slots' positions a permutation: masked keys before a row's last visible one */
} shape;

static void reference_row(const kvb_attn_args *a, int64_t t, int h, float *out, double *f64_out) {
    const int D = a->head_dim, g = h / (a->n_head / a->n_head_kv);
    const float *q = a->q + ((size_t)t * a->n_head + h) * D;
    const int32_t *idx = a->idx && a->idx[g] ? a->idx[g] : NULL;
    const int64_t n = idx ? a->n_idx[g] : a->n_kv[g];
    const float *K = a->k[g], *V = a->v[g];
    float *s = malloc((size_t)(n + 8) * sizeof *s);
    double *w = malloc((size_t)(n + 1) * sizeof *w);
    int64_t last = -1;
    float mx = -INFINITY;
    double mx64 = -INFINITY;
    for (int64_t j = 0; j < n; j++) {
        const int64_t sl = idx ? idx[j] : j;
        const int vis = !a->q_pos || a->k_pos[g][sl] <= a->q_pos[t];
        s[j] = vis ? gc_dot_scalar(K + sl * D, q, D) * a->scale : -INFINITY;
        w[j] = -INFINITY;
        if (vis) {
            double d = 0;
            for (int i = 0; i < D; i++) d += (double)K[sl * D + i] * q[i];
            w[j] = d * a->scale;
            if (w[j] > mx64) mx64 = w[j];
            last = j;
            if (s[j] > mx) mx = s[j];
        }
    }
    for (int i = 0; i < D; i++) out[i] = 0, f64_out[i] = 0;
    if (last >= 0) {
        const int64_t n_pad = (last + 8) / 8 * 8;
        for (int64_t j = last + 1; j < n_pad; j++) s[j] = -INFINITY;
        double sum = 0, sum64 = 0;
        for (int64_t j = 0; j < n_pad; j += 8) {
            for (int l = 0; l < 8; l++) s[j + l] = gc_expf(s[j + l] - mx);
            sum += (double)gc_sum8(s + j);
        }
        const float inv = (float)(1.0 / sum);
        for (int64_t j = 0; j <= last; j++) s[j] *= inv;
        for (int64_t j = 0; j <= last; j++) sum64 += w[j] == -INFINITY ? 0 : exp(w[j] - mx64);
        const int slots = a->n_q >= 2 ? 8 : 32;
        for (int d = 0; d < D; d++) {
            float acc[32] = {0};
            for (int64_t j = 0; j <= last; j++) {
                const int64_t sl = idx ? idx[j] : j;
                acc[j % slots] = fmaf(V[sl * D + d], s[j], acc[j % slots]);
                if (w[j] != -INFINITY) f64_out[d] += exp(w[j] - mx64) / sum64 * V[sl * D + d];
            }
            out[d] = slots == 8 ? gc_sum8(acc) : gc_fold32(acc, 1);
        }
    }
    free(s), free(w);
}

static void check_shape(const shape *sh, kvb_pool *pool, double *worst64) {
    const int G = sh->n_head_kv, D = sh->D;
    const size_t n_qd = (size_t)sh->n_q * sh->n_head * D;
    float *q = malloc(sizeof(float) * n_qd), *out = malloc(sizeof(float) * n_qd);
    float *k[4], *v[4];
    int32_t *kp[4], *idx[4], qpos[128];
    int64_t n_kv[4], n_idx[4];
    const void *kk[4], *vv[4];
    const int32_t *kpp[4], *ii[4];
    for (size_t i = 0; i < n_qd; i++) q[i] = rnd_sym() * 3.0f;
    for (int g = 0; g < G; g++) {
        n_kv[g] = sh->n_kv;
        k[g] = malloc(sizeof(float) * sh->n_kv * D), v[g] = malloc(sizeof(float) * sh->n_kv * D);
        kp[g] = malloc(sizeof(int32_t) * sh->n_kv), idx[g] = malloc(sizeof(int32_t) * sh->n_kv);
        for (int64_t i = 0; i < sh->n_kv * D; i++) k[g][i] = rnd_sym(), v[g][i] = rnd_sym();
        for (int64_t i = 0; i < sh->n_kv; i++) kp[g][i] = (int32_t)i;
        for (int64_t i = sh->n_kv - 1; sh->shuffled && i > 0; i--) {
            const int64_t j = rnd32() % (uint32_t)(i + 1);
            const int32_t x = kp[g][i];
            kp[g][i] = kp[g][j], kp[g][j] = x;
        }
        n_idx[g] = 0;
        for (int64_t i = 0; i < sh->n_kv; i++)
            if (rnd32() % 3) idx[g][n_idx[g]++] = (int32_t)i; /* about two thirds of the slots, in order */
        kk[g] = k[g], vv[g] = v[g], kpp[g] = kp[g], ii[g] = (g == 1) ? NULL : idx[g]; /* head 1: no list */
    }
    for (int t = 0; t < sh->n_q; t++) qpos[t] = (int32_t)(sh->n_kv - sh->n_q + t);
    kvb_attn_args a = {0};
    a.n_q = sh->n_q, a.n_head = sh->n_head, a.n_head_kv = G, a.head_dim = D, a.q = q;
    a.q_pos = sh->causal ? qpos : NULL;
    a.kv_dtype = KVB_F32, a.k = kk, a.v = vv, a.k_pos = kpp, a.n_kv = n_kv;
    a.idx = sh->with_idx ? ii : NULL, a.n_idx = sh->with_idx ? n_idx : NULL;
    a.scale = 1.0f / sqrtf((float)D), a.out = out;
    a.ws_bytes = cpu_attention_ws_bytes(&a, kvb_pool_size(pool));
    a.ws = malloc(a.ws_bytes);
    char err[256];
    CU_ASSERT_FATAL(cpu_attention(&a, pool, err, sizeof err) == 0);
    float *ref = malloc(sizeof(float) * D);
    double *ref64 = malloc(sizeof(double) * D);
    int bad = 0;
    for (int t = 0; t < sh->n_q; t++)
        for (int h = 0; h < sh->n_head; h++) {
            reference_row(&a, t, h, ref, ref64);
            const float *o = out + ((size_t)t * sh->n_head + h) * D;
            for (int d = 0; d < D; d++) {
                bad += !same_bits(o[d], ref[d]);
                const double e = fabs(o[d] - ref64[d]);
                if (e > *worst64) *worst64 = e;
            }
        }
    CU_ASSERT_EQUAL(bad, 0);
    if (bad) printf("\n  n_q %d heads %d/%d D %d n_kv %lld idx %d causal %d: %d elements differ", sh->n_q, sh->n_head,
                    G, D, (long long)sh->n_kv, sh->with_idx, sh->causal, bad);
    for (int g = 0; g < G; g++) free(k[g]), free(v[g]), free(kp[g]), free(idx[g]);
    free(q), free(out), free(ref), free(ref64), free(a.ws);
}

static void test_f32_attention_follows_the_documented_order_bit_for_bit(void) {
    const shape shapes[] = {
        {1, 9, 3, 64, 1, 0, 1, 0},     {1, 9, 3, 64, 300, 0, 1, 0},  {1, 9, 3, 64, 1000, 1, 1, 0},
        {5, 9, 3, 64, 300, 0, 1, 0},   {33, 9, 3, 64, 33, 0, 1, 0},  {17, 4, 2, 128, 500, 1, 1, 0},
        {3, 4, 4, 80, 257, 0, 0, 0},   {2, 2, 1, 7, 40, 1, 1, 0},    {64, 8, 2, 64, 700, 0, 1, 0},
        {40, 4, 2, 64, 600, 1, 1, 1},  {70, 4, 1, 96, 300, 0, 1, 1},  {30, 2, 1, 32, 9000, 0, 1, 0},
    };
    double worst64 = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) CU_ASSERT_FATAL(shapes[i].n_q <= 128); /* qpos */
    for (int th = 1; th <= 2; th++) {
        kvb_pool *pool = kvb_pool_create(th);
        for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) check_shape(&shapes[i], pool, &worst64);
        kvb_pool_free(pool);
    }
    printf("\n  max |out - float64| %.2e", worst64);
    CU_ASSERT(worst64 <= 1e-5);
}

int main(void) {
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("ggml_compat", NULL, NULL);
    CU_add_test(s, "expf within 2 ulp of libm, flushes at the ends", test_expf_is_within_2_ulp_of_libm_and_flushes_at_the_ends);
    CU_add_test(s, "vector expf and sums are bitwise the scalar ones", test_vector_expf_and_sums_are_bitwise_the_scalar_ones);
    CU_add_test(s, "dot: bitwise the scalar order, close to float64", test_dot_is_bitwise_the_scalar_order_and_close_to_float64);
    CU_add_test(s, "f32 attention follows the documented order bit for bit",
                test_f32_attention_follows_the_documented_order_bit_for_bit);
    return util_run_suites();
}
