/* test_arch_ops.c — the CPU GeGLU (kernels/cpu/arch_ops.c): its table-and-gather form gives, for every gate, the
 * bits of ggml's definition (the gate rounded to f16, gelu_tanh of it rounded to f16, times up; |x| >= 10
 * short-cut), and that table is gelu_tanh within f16 rounding of a float64 evaluation of the formula. The windowed
 * attention's checks are in test_attention.c. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/arch_ops.h"
#include "kernels/dtype.h"

static uint64_t rng_state = 0x5eedull;
static uint64_t rng_u64(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static float rng_range(float lo, float hi) { return lo + (hi - lo) * (float)((rng_u64() >> 40) * (1.0 / 16777216.0)); }

/* ggml's per-element definition, spelled out through the table entry */
static float geglu_def(float x, float u) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x * u;
    return cpu_gelu_f16(kvb_f32_to_f16(x)) * u;
}

static int same_float_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

static void test_geglu_equals_the_per_element_definition_bit_for_bit(void) {
    /* every f16 gate (infinities and NaNs included), random gates over GELU's range and just around the +-10
     * short-cuts, at a length that leaves a scalar tail after the vector loop */
    const int64_t n = (1 << 16) + 20000 + 4003;
    float *gate = malloc(sizeof(float) * n), *up = malloc(sizeof(float) * n), *out = malloc(sizeof(float) * n);
    CU_ASSERT_FATAL(gate && up && out);
    int64_t i = 0;
    for (; i < (1 << 16); i++) gate[i] = kvb_f16_to_f32((kvb_f16)i);
    for (; i < (1 << 16) + 20000; i++) gate[i] = rng_range(-12.0f, 12.0f);
    for (; i < n; i++) gate[i] = (rng_u64() & 1 ? 10.0f : -10.0f) + rng_range(-0.01f, 0.01f);
    for (i = 0; i < n; i++) up[i] = rng_range(-3.0f, 3.0f);
    cpu_geglu(out, gate, up, n);
    int64_t diff = 0;
    for (i = 0; i < n; i++) diff += !same_float_bits(out[i], geglu_def(gate[i], up[i]));
    printf("\n    %lld of %lld differ", (long long)diff, (long long)n);
    CU_ASSERT_EQUAL(diff, 0);
    /* out aliasing gate, and every length from 0 to 40 (the vector loops' edges) */
    for (int64_t len = 0; len <= 40; len++) {
        float g[40], u[40], o[40];
        for (int64_t j = 0; j < len; j++) g[j] = gate[(1 << 16) + j], u[j] = up[j];
        memcpy(o, g, sizeof(float) * (size_t)len);
        cpu_geglu(o, o, u, len);
        for (int64_t j = 0; j < len; j++) CU_ASSERT(same_float_bits(o[j], geglu_def(g[j], u[j])));
    }
    free(gate), free(up), free(out);
}

/* the table: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) of each finite f16 x, rounded to f16, within half an
 * f16 ulp of the float64 value plus the float evaluation's rounding */
static void test_gelu_table_is_gelu_tanh_within_f16_rounding(void) {
    double worst = 0.0;
    for (uint32_t h = 0; h < (1u << 16); h++) {
        const float x = kvb_f16_to_f32((kvb_f16)h);
        if (!isfinite(x)) continue;
        const double xd = x, ref = 0.5 * xd * (1.0 + tanh(0.7978845608028654 * (xd + 0.044715 * xd * xd * xd)));
        const double got = cpu_gelu_f16((kvb_f16)h);
        /* f16 rounding: half an ulp of the result (2^-25 among the subnormals); the float evaluation: 1 + tanh
         * cancels for negative x, leaving a few float ulps of 1 times |x| / 2 */
        const double tol = 0.5 * 0x1p-10 * fabs(ref) + 0x1p-25 + (fabs(xd) + fabs(ref)) * 0x1p-22;
        const double r = fabs(got - ref) / tol;
        if (r > worst) worst = r;
        CU_ASSERT(r <= 1.0);
    }
    printf("\n    worst |table - gelu| / tolerance: %.4f", worst);
}

int main(void) {
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("arch_ops", NULL, NULL);
    CU_add_test(s, "geglu equals the per-element definition bit for bit",
                test_geglu_equals_the_per_element_definition_bit_for_bit);
    CU_add_test(s, "gelu table is gelu_tanh within f16 rounding", test_gelu_table_is_gelu_tanh_within_f16_rounding);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    const unsigned fails = CU_get_number_of_failures();
    CU_cleanup_registry();
    return fails != 0;
}
