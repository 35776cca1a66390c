/* test_gemm.c — the CPU backend's f32 prefill GEMM (kernels/cpu/gemm.h): its results against float64 of the
 * dequantized weights for every weight type the engine reads, and when the backend takes it (the token threshold,
 * the integer mode, the engine's choice per KV type). Without OpenBLAS the GEMM tests check that it refuses. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util_common.h"
#include "engine/model.h"
#include "kernels/backend.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quant.h"

static float frand(unsigned *s) {
    *s = *s * 1103515245u + 12345u;
    return ((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* rows x cols random weights of type t (BF16, which quant_quantize_row lacks: the f32 bits truncated) */
static uint8_t *random_weights(ggml_type t, int64_t rows, int64_t cols, unsigned *s) {
    size_t rb = ggml_row_bytes(t, (uint64_t)cols);
    uint8_t *w = malloc(rb * (size_t)rows);
    float *row = malloc(sizeof(float) * (size_t)cols);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < cols; c++) row[c] = frand(s);
        if (t != GGML_T_BF16) {
            CU_ASSERT_FATAL(quant_quantize_row(t, row, w + (size_t)r * rb, cols) == 0);
            continue;
        }
        kvb_bf16 *d = (kvb_bf16 *)(w + (size_t)r * rb);
        for (int64_t c = 0; c < cols; c++) {
            uint32_t u;
            memcpy(&u, &row[c], sizeof u);
            d[c] = (kvb_bf16)(u >> 16);
        }
    }
    free(row);
    return w;
}

static float *random_floats(int64_t n, unsigned *s) {
    float *x = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) x[i] = frand(s);
    return x;
}

/* worst |out - ref| / (1 + sum |w||x|) over the outputs, ref in float64 of the dequantized weights and f32 x */
UTIL_REFERENCE static double worst_error(const float *out, const uint8_t *w, ggml_type t, int64_t rows, int64_t cols,
                                         const float *x, int64_t n_tok) {
    size_t rb = ggml_row_bytes(t, (uint64_t)cols);
    float *row = malloc(sizeof(float) * (size_t)cols);
    double worst = 0;
    for (int64_t r = 0; r < rows; r++) {
        quant_dequant_row(t, w + (size_t)r * rb, row, cols);
        for (int64_t k = 0; k < n_tok; k++) {
            double ref = 0, mag = 0;
            for (int64_t c = 0; c < cols; c++) {
                ref += (double)row[c] * x[k * cols + c];
                mag += fabs((double)row[c] * x[k * cols + c]);
            }
            double d = fabs(out[k * rows + r] - ref) / (1 + mag);
            if (!(d <= worst)) worst = d; /* NaN (an output never written) counts as the worst */
        }
    }
    free(row);
    return worst;
}

/* every type, rows that leave a partial panel (OpenBLAS: cols 256: panels of 256 rows; cols 4096: 32; AVX-512:
 * panels of 32 rows) and a partial split unit, columns in one pass and in several (AVX-512: 4096 in two passes of
 * 2048, 4864 in 1792 + 1792 + 1280), 17/33/100 tokens (partial 12-token tiles), 1 and 2 threads: within f32
 * rounding of the float64 product */
static void test_gemm_matches_float64_for_every_type_and_odd_shapes(void) {
    if (!cpu_gemm_available()) {
        float out, x = 0;
        CU_ASSERT(cpu_gemm(&out, &x, GGML_T_F32, 1, 1, &x, 1, &out, sizeof out, NULL) == -1);
        return;
    }
    const ggml_type types[] = {GGML_T_Q4_0, GGML_T_Q4_1, GGML_T_Q5_0, GGML_T_Q5_1, GGML_T_Q8_0, GGML_T_Q4_K,
                               GGML_T_Q5_K, GGML_T_Q6_K, GGML_T_F16,  GGML_T_BF16, GGML_T_F32};
    const int64_t shapes[][2] = {{300, 256}, {100, 4096}, {40, 4864}}, ntok[] = {17, 33, 100};
    kvb_pool *pools[2] = {kvb_pool_create(1), kvb_pool_create(2)};
    unsigned s = 11;
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++)
        for (int si = 0; si < 3; si++)
            for (int ni = 0; ni < 3; ni++) {
                const int64_t rows = shapes[si][0], cols = shapes[si][1], nt = ntok[ni];
                uint8_t *w = random_weights(types[ti], rows, cols, &s);
                float *x = random_floats(nt * cols, &s), *out = malloc(sizeof(float) * (size_t)(nt * rows));
                for (int p = 0; p < 2; p++) {
                    size_t ws_bytes = cpu_gemm_ws_bytes(cols, nt, kvb_pool_size(pools[p]));
                    void *ws = malloc(ws_bytes);
                    memset(out, 0xff, sizeof(float) * (size_t)(nt * rows)); /* NaN: a row left unwritten fails */
                    CU_ASSERT(cpu_gemm(out, w, types[ti], rows, cols, x, nt, ws, ws_bytes, pools[p]) == 0);
                    double worst = worst_error(out, w, types[ti], rows, cols, x, nt);
                    if (!(worst < 1e-5))
                        printf("\n%s %lldx%lld, %lld tokens, %d threads: error %g\n", ggml_type_name(types[ti]),
                               (long long)rows, (long long)cols, (long long)nt, p + 1, worst);
                    CU_ASSERT(worst < 1e-5);
                    free(ws);
                }
                free(w), free(x), free(out);
            }
    kvb_pool_free(pools[0]);
    kvb_pool_free(pools[1]);
}

/* the backend's matmul op with gemm = mode over n_tok tokens, against cpu_matmul (int8 = 1) or cpu_gemm: bitwise */
static int backend_matmul_equals(kvb_backend *be, kvb_gemm mode, int64_t n_tok, int int8) {
    const int64_t rows = 70, cols = 576;
    unsigned s = 3;
    uint8_t *w = random_weights(GGML_T_Q4_1, rows, cols, &s);
    float *x = random_floats(n_tok * cols, &s), *got = malloc(sizeof(float) * (size_t)(n_tok * rows));
    float *want = malloc(sizeof(float) * (size_t)(n_tok * rows));
    kvb_weight wt = {w, GGML_T_Q4_1, rows, cols};
    be->gemm = mode;
    CU_ASSERT_FATAL(be->matmul(be, got, &wt, x, n_tok) == 0);
    kvb_pool *pool = kvb_pool_create(be->n_threads);
    size_t ws_bytes = int8 ? cpu_matmul_ws_bytes(wt.type, cols, n_tok) : cpu_gemm_ws_bytes(cols, n_tok, be->n_threads);
    void *ws = malloc(ws_bytes);
    int rc = int8 ? cpu_matmul(want, w, wt.type, rows, cols, x, n_tok, ws, ws_bytes, pool)
                  : cpu_gemm(want, w, wt.type, rows, cols, x, n_tok, ws, ws_bytes, pool);
    CU_ASSERT(rc == 0);
    int same = memcmp(got, want, sizeof(float) * (size_t)(n_tok * rows)) == 0;
    kvb_pool_free(pool);
    free(ws), free(w), free(x), free(got), free(want);
    return same;
}

/* below CPU_GEMM_MIN_TOK tokens, and in the integer mode at any length, the op is the integer path bit for bit;
 * from the threshold on in the f32 mode it is the GEMM (where the build has OpenBLAS) */
static void test_backend_takes_gemm_only_from_threshold_in_f32_mode(void) {
    char err[256];
    kvb_backend *be = kvb_backend_cpu_create(2, err, sizeof err);
    CU_ASSERT_FATAL(be != NULL);
    CU_ASSERT(backend_matmul_equals(be, KVB_GEMM_F32, 1, 1));
    CU_ASSERT(backend_matmul_equals(be, KVB_GEMM_F32, CPU_GEMM_MIN_TOK - 1, 1));
    CU_ASSERT(backend_matmul_equals(be, KVB_GEMM_INT8, CPU_GEMM_MIN_TOK, 1));
    CU_ASSERT(backend_matmul_equals(be, KVB_GEMM_INT8, 100, 1));
    CU_ASSERT(backend_matmul_equals(be, KVB_GEMM_F32, CPU_GEMM_MIN_TOK, !cpu_gemm_available()));
    CU_ASSERT(backend_matmul_equals(be, KVB_GEMM_F32, 100, !cpu_gemm_available()));
    CU_ASSERT_STRING_EQUAL(kvb_backend_cpu_gemm_name(KVB_GEMM_INT8), "integer");
    CU_ASSERT_STRING_EQUAL(kvb_backend_cpu_gemm_name(KVB_GEMM_F32), cpu_gemm_available() ? cpu_gemm_name() : "integer");
    kvb_backend_free(be);
}

/* auto: the f32 GEMM with an f16 KV cache, the integer path with an f32 one (the llama.cpp-exact mode); an
 * explicit choice wins over the KV type */
static void test_auto_mode_keeps_the_exact_f32_kv_mode_on_integers(void) {
    kvb_ctx_params p = kvb_ctx_default_params();
    CU_ASSERT_EQUAL(p.prefill_gemm, KVB_PREFILL_GEMM_AUTO);
    CU_ASSERT_EQUAL(kvb_ctx_gemm(&p), KVB_GEMM_F32);
    p.kv_dtype = KVB_F32;
    CU_ASSERT_EQUAL(kvb_ctx_gemm(&p), KVB_GEMM_INT8);
    p.prefill_gemm = KVB_PREFILL_GEMM_F32;
    CU_ASSERT_EQUAL(kvb_ctx_gemm(&p), KVB_GEMM_F32);
    p.kv_dtype = KVB_F16;
    p.prefill_gemm = KVB_PREFILL_GEMM_INT8;
    CU_ASSERT_EQUAL(kvb_ctx_gemm(&p), KVB_GEMM_INT8);
}

int main(void) {
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("gemm", NULL, NULL);
    CU_add_test(s, "GEMM matches float64 for every type and odd shapes",
                test_gemm_matches_float64_for_every_type_and_odd_shapes);
    CU_add_test(s, "backend takes the GEMM only from the threshold in f32 mode",
                test_backend_takes_gemm_only_from_threshold_in_f32_mode);
    CU_add_test(s, "auto mode keeps the exact f32-KV mode on integers", test_auto_mode_keeps_the_exact_f32_kv_mode_on_integers);
    return util_run_suites();
}
