/* test_kquant.c — the K-quant and 4-bit I-quant dots (kernels/cpu/quant_k.c, quant_lowbit.c) against llama.cpp's
 * own kernels and against float64.
 *
 * tests/fixtures/ggml_dots.json holds what llama.cpp's ggml_vec_dot_* return (float bits) for seeded rows of random
 * bytes (tests/kquant_blocks.h; written by scripts/ggml_dots_check.sh --fixture from llama-cpp-python 0.3.36's
 * sources): both our kernels, AVX2 and scalar, must give those bits, and the dot must be the float64 dot of our
 * dequantized operands within float rounding, which pins the dequantization to llama.cpp's reading of every bit
 * of the block. The other tests hold each kernel to its twins (one activation row, four at once, through
 * cpu_matmul) and the quantizers to their step, for every type of the table. */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kquant_blocks.h"
#include "util_common.h"
#include "util_gguf_writer.h"
#include "engine/gguf.h"
#include "kernels/cpu/matmul.h"

enum { N_TYPES = sizeof KQB_TYPES / sizeof *KQB_TYPES };

static int is_k_or_iq4(ggml_type t) { return t != GGML_T_Q4_0 && t != GGML_T_Q4_1 && t != GGML_T_Q5_0 && t != GGML_T_Q5_1 && t != GGML_T_Q8_0; }

/* float64 dot of the dequantized weight row and activation row */
static double dot_f64(ggml_type t, const uint8_t *w, const uint8_t *act, int64_t n, double *abs_sum) {
    float *wd = malloc(sizeof(float) * (size_t)n), *xd = malloc(sizeof(float) * (size_t)n);
    quant_dequant_row(t, w, wd, n);
    quant_dequant_row(quant_act_type(t), act, xd, n);
    double s = 0, a = 0;
    for (int64_t i = 0; i < n; i++) s += (double)wd[i] * xd[i], a += fabs((double)wd[i] * xd[i]);
    free(wd), free(xd);
    *abs_sum = a;
    return s;
}

static void test_dots_are_llamacpps_bits_and_float64_of_the_dequantized_blocks(void) {
    char *json = util_read_file("tests/fixtures/ggml_dots.json", NULL);
    CU_ASSERT_FATAL(json != NULL);
    cJSON *fx = cJSON_Parse(json);
    free(json);
    CU_ASSERT_FATAL(fx != NULL);
    CU_ASSERT_FATAL(cJSON_GetObjectItem(fx, "n")->valueint == KQB_N);
    const cJSON *dots = cJSON_GetObjectItem(fx, "dots");
    static uint8_t wq[KQB_N * 2], act[KQB_N * 2];
    static float x[KQB_N];
    int checked = 0;
    for (int k = 0; k < N_TYPES; k++) {
        const ggml_type t = KQB_TYPES[k];
        const cJSON *want = cJSON_GetObjectItem(dots, ggml_type_name(t));
        CU_ASSERT_FATAL(want != NULL && cJSON_GetArraySize(want) == KQB_TRIALS);
        uint32_t seed = 1000u + (uint32_t)t;
        int same = 0;
        for (int trial = 0; trial < KQB_TRIALS; trial++) {
            const int64_t n = kqb_trial_n(t, trial);
            kqb_random_row(t, wq, n, &seed);
            kqb_activations(x, n, trial, &seed);
            quant_act_quantize(t, x, act, n);
            const uint32_t bits = (uint32_t)cJSON_GetArrayItem(want, trial)->valuedouble;
            for (int scalar = 0; scalar < 2; scalar++) {
                quant_force_scalar(scalar);
                const float got = quant_vec_dot(t, n, wq, act);
                uint32_t got_bits;
                memcpy(&got_bits, &got, 4);
                same += got_bits == bits;
                checked++;
            }
            quant_force_scalar(0);
            float theirs;
            memcpy(&theirs, &bits, 4);
            double abs_sum;
            const double ref = dot_f64(t, wq, act, n, &abs_sum);
            /* Q4_1/Q5_1 fold the minimum through the activations' f16 sum field: looser */
            const double tol = t == GGML_T_Q4_1 || t == GGML_T_Q5_1 ? 2e-3 : 1e-5;
            CU_ASSERT(fabs(theirs - ref) <= tol * abs_sum + 1e-30);
        }
        if (same != 2 * KQB_TRIALS) printf("\n  %s: %d of %d dots with llama.cpp's bits", ggml_type_name(t), same, 2 * KQB_TRIALS);
        CU_ASSERT_EQUAL(same, 2 * KQB_TRIALS);
    }
    CU_ASSERT_EQUAL(checked, 2 * KQB_TRIALS * N_TYPES);
    cJSON_Delete(fx);
}

/* random bytes: AVX2 and scalar, one activation row at a time and 1-4 at once, all the same bits */
static void test_simd_scalar_and_multi_row_dots_agree_on_random_blocks(void) {
    enum { N = 1024 + 32 * 3 }; /* 35 blocks of 32 (odd: IQ4_NL's tail), 4 K-blocks + 96 values unused by them */
    static uint8_t wq[N * 2], xq[4][N * 2];
    static float x[N];
    uint32_t s = 77;
    for (int k = 0; k < N_TYPES; k++) {
        const ggml_type t = KQB_TYPES[k];
        if (!is_k_or_iq4(t)) continue;
        const int64_t n = ggml_block_elems(t) == 32 ? N : 1024;
        for (int trial = 0; trial < 6; trial++) {
            kqb_random_row(t, wq, n, &s);
            for (int a = 0; a < 4; a++) {
                kqb_activations(x, n, trial + a, &s);
                quant_act_quantize(t, x, xq[a], n);
            }
            float single[2][4], multi[2][4][4];
            for (int simd = 0; simd < 2; simd++) {
                quant_force_scalar(!simd);
                for (int a = 0; a < 4; a++) single[simd][a] = quant_vec_dot(t, n, wq, xq[a]);
                for (int m = 1; m <= 4; m++) quant_vec_dot_multi(t, n, wq, xq, sizeof xq[0], m, multi[simd][m - 1]);
            }
            quant_force_scalar(0);
            CU_ASSERT(memcmp(single[0], single[1], sizeof single[0]) == 0);
            for (int simd = 0; simd < 2; simd++)
                for (int m = 1; m <= 4; m++) CU_ASSERT(memcmp(multi[simd][m - 1], single[0], sizeof(float) * m) == 0);
        }
    }
}

/* each quantizer's row dequantizes to within its step of the input (the test and synthetic rows' fits) */
static void test_quantizers_round_trip_within_their_step(void) {
    enum { N = 512 };
    float x[N], y[N];
    uint8_t q[N * 2];
    uint32_t s = 5;
    for (int k = 0; k < N_TYPES; k++) {
        const ggml_type t = KQB_TYPES[k];
        if (!is_k_or_iq4(t)) continue;
        for (int i = 0; i < N; i++) x[i] = kqb_float(&s) * (i % 64 < 8 ? 4.0f : 1.0f);
        CU_ASSERT_FATAL(quant_quantize_row(t, x, q, N) == 0);
        quant_dequant_row(t, q, y, N);
        double err = 0, amax = 0;
        for (int i = 0; i < N; i++) err = fmax(err, fabs((double)y[i] - x[i])), amax = fmax(amax, fabs(x[i]));
        /* levels per block: 2-bit 4, 3-bit 8, IQ4 16 (non-uniform, widest gap 24/127 of the range), 4-6 bits more */
        const double step = t == GGML_T_Q2_K ? 2.0 / 3 : t == GGML_T_Q3_K ? 2.0 / 7 : t == GGML_T_Q6_K ? 2.0 / 63 : 2.0 / 15;
        if (err > step * amax) printf("\n  %s: round trip off by %.3f of %.3f", ggml_type_name(t), err, amax);
        CU_ASSERT(err <= step * amax);
    }
}

/* cpu_matmul on the new types: every output is the scalar one-row dot's bits (1 and 2 threads, 1-5 tokens) */
static void test_matmul_outputs_are_the_scalar_dots(void) {
    const ggml_type types[] = {GGML_T_Q2_K, GGML_T_Q3_K, GGML_T_IQ4_XS, GGML_T_IQ4_NL};
    const int rows = 19, ntoks[] = {1, 5};
    kvb_pool *pools[2] = {kvb_pool_create(1), kvb_pool_create(2)};
    uint32_t s = 9;
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++)
        for (int ni = 0; ni < 2; ni++) {
            const ggml_type t = types[ti];
            const int cols = t == GGML_T_IQ4_NL ? 896 + 32 : 768, nt = ntoks[ni];
            const size_t rb = ggml_row_bytes(t, (uint64_t)cols);
            uint8_t *w = malloc(rb * rows), *xq = malloc(quant_act_row_bytes(t, cols));
            float *x = malloc(sizeof(float) * (size_t)nt * cols), *out = malloc(sizeof(float) * (size_t)nt * rows * 2);
            for (int r = 0; r < rows; r++) kqb_random_row(t, w + r * rb, cols, &s);
            for (int i = 0; i < nt * cols; i++) x[i] = kqb_float(&s);
            const size_t ws = cpu_matmul_ws_bytes(t, cols, nt);
            void *act = malloc(ws);
            for (int p = 0; p < 2; p++)
                CU_ASSERT(cpu_matmul(out + (size_t)p * nt * rows, w, t, rows, cols, x, nt, act, ws, pools[p]) == 0);
            CU_ASSERT(memcmp(out, out + (size_t)nt * rows, sizeof(float) * (size_t)nt * rows) == 0);
            int differs = 0;
            quant_force_scalar(1);
            for (int tk = 0; tk < nt; tk++) {
                quant_act_quantize(t, x + (size_t)tk * cols, xq, cols);
                for (int r = 0; r < rows; r++) {
                    const float one = quant_vec_dot(t, cols, w + r * rb, xq);
                    differs += memcmp(&one, &out[(size_t)tk * rows + r], sizeof one) != 0;
                }
            }
            quant_force_scalar(0);
            CU_ASSERT_EQUAL(differs, 0);
            free(w), free(xq), free(x), free(out), free(act);
        }
    kvb_pool_free(pools[0]);
    kvb_pool_free(pools[1]);
}

/* the GGUF reader takes every type of the table and refuses the other I-quants by name */
static void test_gguf_reads_the_new_types_and_names_the_refused_iquants(void) {
    static uint8_t data[256 * 2];
    char err[512];
    for (int k = 0; k < N_TYPES; k++) {
        const uint64_t ne[1] = {256};
        gw_writer *w = gw_new();
        gw_tensor(w, "t", KQB_TYPES[k], 1, ne, data, ggml_row_bytes(KQB_TYPES[k], 256));
        uint8_t *buf;
        gguf_file *f = gw_open(w, &buf, err, sizeof err);
        CU_ASSERT(f != NULL);
        if (f) gguf_close(f);
        free(buf); /* gw_open freed the writer */
    }
    const struct { int type; const char *name; } refused[] = {{16, "IQ2_XXS"}, {18, "IQ3_XXS"}, {19, "IQ1_S"}, {21, "IQ3_S"}};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        const uint64_t ne[1] = {256};
        gw_writer *w = gw_new();
        gw_tensor(w, "t", (ggml_type)refused[i].type, 1, ne, data, 110);
        uint8_t *buf;
        size_t len;
        gw_finish(w, &buf, &len);
        CU_ASSERT(gguf_open_mem(buf, len, err, sizeof err) == NULL && strstr(err, refused[i].name));
        free(buf);
        gw_free(w);
    }
}

int main(void) {
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("kquant", NULL, NULL);
    CU_add_test(s, "dots are llama.cpp's bits and float64 of the dequantized blocks",
                test_dots_are_llamacpps_bits_and_float64_of_the_dequantized_blocks);
    CU_add_test(s, "SIMD, scalar and multi-row dots agree on random blocks",
                test_simd_scalar_and_multi_row_dots_agree_on_random_blocks);
    CU_add_test(s, "quantizers round trip within their step", test_quantizers_round_trip_within_their_step);
    CU_add_test(s, "matmul outputs are the scalar dots", test_matmul_outputs_are_the_scalar_dots);
    CU_add_test(s, "gguf reads the new types and names the refused I-quants",
                test_gguf_reads_the_new_types_and_names_the_refused_iquants);
    return util_run_suites();
}
