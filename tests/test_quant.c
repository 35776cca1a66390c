/* test_quant.c — block formats against hand-built blocks, activation quantization, dot products against
 * float64, SIMD against scalar, and the matmul against a naive float64 product for odd shapes. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "util_common.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/matmul.h"

static float frand(unsigned *s) {
    *s = *s * 1103515245u + 12345u;
    return ((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

static void test_q4_1_block_dequantizes_to_d_times_q_plus_m(void) {
    block_q4_1 b;
    b.d = kvb_f32_to_f16(0.5f);
    b.m = kvb_f32_to_f16(-3.0f);
    for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)((j & 0xF) | ((15 - j) << 4));
    float y[32];
    quant_dequant_row(GGML_T_Q4_1, &b, y, 32);
    for (int j = 0; j < 16; j++) {
        CU_ASSERT_DOUBLE_EQUAL(y[j], 0.5 * j - 3.0, 1e-6);
        CU_ASSERT_DOUBLE_EQUAL(y[j + 16], 0.5 * (15 - j) - 3.0, 1e-6);
    }
}

static void test_q4_0_q5_0_q8_0_blocks_dequantize_by_their_formulas(void) {
    block_q4_0 a;
    a.d = kvb_f32_to_f16(2.0f);
    for (int j = 0; j < 16; j++) a.qs[j] = (uint8_t)(j | (j << 4));
    float y[32];
    quant_dequant_row(GGML_T_Q4_0, &a, y, 32);
    for (int j = 0; j < 16; j++) CU_ASSERT(y[j] == 2.0f * (j - 8) && y[j + 16] == 2.0f * (j - 8));
    block_q5_0 b;
    b.d = kvb_f32_to_f16(0.25f);
    uint32_t qh = 0xA5A5F00Fu; /* the fifth bit of element j is bit j */
    memcpy(b.qh, &qh, 4);
    for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)(j | ((15 - j) << 4));
    quant_dequant_row(GGML_T_Q5_0, &b, y, 32);
    for (int j = 0; j < 32; j++) {
        int lo = j < 16 ? j : 15 - (j - 16);
        int q = lo | (int)(((qh >> j) & 1) << 4);
        CU_ASSERT_DOUBLE_EQUAL(y[j], 0.25 * (q - 16), 1e-6);
    }
    block_q8_0 c;
    c.d = kvb_f32_to_f16(0.125f);
    for (int j = 0; j < 32; j++) c.qs[j] = (int8_t)(j * 8 - 128);
    quant_dequant_row(GGML_T_Q8_0, &c, y, 32);
    for (int j = 0; j < 32; j++) CU_ASSERT(y[j] == 0.125f * (j * 8 - 128));
}

/* the SIMD dequantization (Q4_0, Q5_0, Q8_0 in AVX2 builds; the prefill GEMM's every weight) gives the scalar
 * loops' floats bit for bit, on random quant bytes with random f16 scales, every type the loader reads */
static void test_simd_and_scalar_dequantization_are_bitwise_equal(void) {
    const ggml_type types[] = {GGML_T_Q4_0, GGML_T_Q4_1, GGML_T_Q5_0, GGML_T_Q5_1, GGML_T_Q8_0, GGML_T_Q4_K,
                               GGML_T_Q5_K, GGML_T_Q6_K, GGML_T_F16};
    enum { N = 1024 };
    unsigned s = 5;
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
        const size_t rb = ggml_row_bytes(types[ti], N);
        uint8_t *w = malloc(rb);
        float a[N], b[N];
        for (int trial = 0; trial < 20; trial++) {
            float x[N];
            for (int i = 0; i < N; i++) x[i] = frand(&s) * (1 + trial);
            CU_ASSERT_FATAL(quant_quantize_row(types[ti], x, w, N) == 0);
            /* then the quant bytes scrambled (the scales stay finite): every bit pattern of the quants */
            const size_t be = ggml_block_elems(types[ti]) == 1 ? 0 : ggml_row_bytes(types[ti], ggml_block_elems(types[ti]));
            for (size_t i = 0; be && i < rb; i++)
                if (i % be >= sizeof(kvb_f16) * 2 && (types[ti] != GGML_T_Q6_K || i % be < be - sizeof(kvb_f16) - 16))
                    w[i] = (uint8_t)(frand(&s) * 128 + 128);
            quant_dequant_row(types[ti], w, a, N);
            quant_force_scalar(1);
            quant_dequant_row(types[ti], w, b, N);
            quant_force_scalar(0);
            CU_ASSERT(memcmp(a, b, sizeof a) == 0);
        }
        free(w);
    }
}

static void test_q4_k_and_q6_k_blocks_follow_their_scale_layout(void) {
    /* Q4_K: sub-block s (32 values) has 6-bit scale sc[s] and min mn[s]; y = d*sc*q - dmin*mn */
    block_q4_K b;
    memset(&b, 0, sizeof b);
    b.d = kvb_f32_to_f16(0.5f);
    b.dmin = kvb_f32_to_f16(0.25f);
    uint8_t sc[8] = {1, 2, 3, 4, 33, 40, 50, 63}, mn[8] = {5, 6, 7, 8, 17, 20, 60, 1};
    for (int s = 0; s < 4; s++) {
        b.scales[s] = (uint8_t)((sc[s] & 63) | ((sc[s + 4] >> 4) << 6));
        b.scales[s + 4] = (uint8_t)((mn[s] & 63) | ((mn[s + 4] >> 4) << 6));
        b.scales[s + 8] = (uint8_t)((sc[s + 4] & 0xF) | ((mn[s + 4] & 0xF) << 4));
    }
    for (int i = 0; i < 128; i++) b.qs[i] = (uint8_t)((i % 16) | (((i * 7) % 16) << 4));
    float y[256];
    quant_dequant_row(GGML_T_Q4_K, &b, y, 256);
    for (int i = 0; i < 256; i++) {
        int group = i / 64, in = i % 64, s = group * 2 + (in >= 32), l = in % 32;
        uint8_t byte = b.qs[group * 32 + l];
        int q = in < 32 ? (byte & 0xF) : (byte >> 4);
        CU_ASSERT_DOUBLE_EQUAL(y[i], 0.5 * sc[s] * q - 0.25 * mn[s], 1e-5);
    }
    /* Q6_K: 6-bit q = 4 low bits (ql) + 2 high bits (qh), minus 32, times d * scale[16-value group] */
    block_q6_K c;
    memset(&c, 0, sizeof c);
    c.d = kvb_f32_to_f16(0.1f);
    for (int i = 0; i < 16; i++) c.scales[i] = (int8_t)(i - 8);
    for (int i = 0; i < 128; i++) c.ql[i] = (uint8_t)(i * 37);
    for (int i = 0; i < 64; i++) c.qh[i] = (uint8_t)(i * 91);
    quant_dequant_row(GGML_T_Q6_K, &c, y, 256);
    for (int i = 0; i < 256; i++) {
        int half = i / 128, r = i % 128, quarter = r / 32, l = r % 32;
        const uint8_t *ql = c.ql + half * 64, *qh = c.qh + half * 32;
        int low = quarter == 0 ? ql[l] & 0xF : quarter == 1 ? ql[l + 32] & 0xF : quarter == 2 ? ql[l] >> 4 : ql[l + 32] >> 4;
        int high = (qh[l] >> (2 * quarter)) & 3;
        int q = (low | (high << 4)) - 32;
        int scale = c.scales[half * 8 + quarter * 2 + l / 16];
        CU_ASSERT_DOUBLE_EQUAL(y[i], kvb_f16_to_f32(c.d) * scale * q, 1e-5);
    }
}

static void test_q5_1_block_dequantizes_to_d_times_q_plus_m(void) {
    block_q5_1 b;
    b.d = kvb_f32_to_f16(0.5f);
    b.m = kvb_f32_to_f16(-4.0f);
    uint32_t qh = 0x0F0FA5C3u;
    memcpy(b.qh, &qh, 4);
    for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)((j & 0xF) | ((15 - j) << 4));
    float y[32];
    quant_dequant_row(GGML_T_Q5_1, &b, y, 32);
    for (int j = 0; j < 32; j++) {
        int q = (j < 16 ? j : 15 - (j - 16)) | (int)(((qh >> j) & 1) << 4);
        CU_ASSERT(y[j] == 0.5f * q - 4.0f);
    }
}

/* Q5_K: Q4_K's layout plus a fifth bit: value 64g + l (l < 32) takes bit 2g of qh[l], value 64g + 32 + l bit 2g+1 */
static void test_q5_k_block_takes_the_fifth_bit_from_qh(void) {
    block_q5_K b;
    memset(&b, 0, sizeof b);
    b.d = kvb_f32_to_f16(0.25f);
    b.dmin = kvb_f32_to_f16(0.5f);
    uint8_t sc[8] = {63, 1, 17, 32, 5, 48, 2, 33}, mn[8] = {0, 63, 9, 16, 31, 1, 40, 7};
    for (int s = 0; s < 4; s++) {
        b.scales[s] = (uint8_t)((sc[s] & 63) | ((sc[s + 4] >> 4) << 6));
        b.scales[s + 4] = (uint8_t)((mn[s] & 63) | ((mn[s + 4] >> 4) << 6));
        b.scales[s + 8] = (uint8_t)((sc[s + 4] & 0xF) | ((mn[s + 4] & 0xF) << 4));
    }
    for (int i = 0; i < 128; i++) b.qs[i] = (uint8_t)((i * 5 % 16) | (((i * 11) % 16) << 4));
    for (int l = 0; l < 32; l++) b.qh[l] = (uint8_t)(l * 73 + 19);
    float y[256];
    quant_dequant_row(GGML_T_Q5_K, &b, y, 256);
    for (int i = 0; i < 256; i++) {
        int g = i / 64, in = i % 64, s = 2 * g + (in >= 32), l = in % 32;
        int lo = in < 32 ? b.qs[32 * g + l] & 0xF : b.qs[32 * g + l] >> 4;
        int q = lo | (((b.qh[l] >> s) & 1) << 4);
        CU_ASSERT_DOUBLE_EQUAL(y[i], 0.25 * sc[s] * q - 0.5 * mn[s], 1e-5);
    }
}

/* Q8_K as ggml: d = max/-127 of the signed extreme, q = round-half-even(x * (-127/max)), bsums per 16 */
static void test_q8_k_maps_the_extreme_to_minus_127_and_sums_groups_of_16(void) {
    float x[512];
    unsigned s = 17;
    for (int i = 0; i < 256; i++) x[i] = frand(&s) * 5.0f;
    x[77] = 9.0f; /* positive extreme -> -127 */
    for (int i = 256; i < 512; i++) x[i] = 0.0f;
    block_q8_K b[2];
    memset(b, 0x55, sizeof b);
    CU_ASSERT_EQUAL(quant_act_type(GGML_T_Q6_K), GGML_T_Q8_K);
    CU_ASSERT_EQUAL(quant_act_row_bytes(GGML_T_Q4_K, 512), 2 * sizeof(block_q8_K));
    quant_act_quantize(GGML_T_Q5_K, x, b, 512);
    CU_ASSERT(b[0].qs[77] == -127);
    CU_ASSERT(b[0].d == 1.0f / (-127.0f / 9.0f));
    for (int g = 0; g < 16; g++) {
        int sum = 0;
        for (int l = 0; l < 16; l++) sum += b[0].qs[16 * g + l];
        CU_ASSERT_EQUAL(b[0].bsums[g], sum);
    }
    for (int i = 0; i < 256; i++) CU_ASSERT(fabs(b[0].qs[i] * (double)b[0].d - x[i]) <= fabs(b[0].d) * 0.5001);
    /* an all-zero block: d = 0, quants and sums 0 */
    CU_ASSERT(b[1].d == 0.0f && b[1].bsums[3] == 0 && b[1].qs[100] == 0);
}

static void test_q8_1_sum_field_is_d_times_sum_of_quants(void) {
    float x[64];
    unsigned s = 7;
    for (int i = 0; i < 64; i++) x[i] = frand(&s) * 3.0f;
    block_q8_1 b[2];
    quant_act_quantize(GGML_T_Q4_1, x, b, 64);
    for (int k = 0; k < 2; k++) {
        int sum = 0, amax_q = 0;
        for (int j = 0; j < 32; j++) sum += b[k].qs[j], amax_q = abs(b[k].qs[j]) > amax_q ? abs(b[k].qs[j]) : amax_q;
        CU_ASSERT_EQUAL(amax_q, 127);
        CU_ASSERT_DOUBLE_EQUAL(kvb_f16_to_f32(b[k].s), kvb_f16_to_f32(kvb_f32_to_f16(kvb_f16_to_f32(b[k].d) * sum)),
                               fabs(kvb_f16_to_f32(b[k].s)) * 2e-3 + 1e-3);
        for (int j = 0; j < 32; j++) CU_ASSERT(fabs(b[k].qs[j] * kvb_f16_to_f32(b[k].d) - x[k * 32 + j]) <= kvb_f16_to_f32(b[k].d) * 0.51 + 1e-3);
    }
}

/* For each weight type: dot(W row, quantized x) equals the float64 dot of the dequantized operands. */
static void test_vec_dot_of_every_type_matches_float64_of_dequantized_operands(void) {
    ggml_type types[] = {GGML_T_F32,  GGML_T_F16,  GGML_T_Q4_0, GGML_T_Q4_1, GGML_T_Q5_0,
                         GGML_T_Q5_1, GGML_T_Q8_0, GGML_T_Q4_K, GGML_T_Q5_K, GGML_T_Q6_K};
    const int n = 1536;
    float *w = malloc(n * sizeof *w), *x = malloc(n * sizeof *x), *wd = malloc(n * sizeof *wd), *xd = malloc(n * sizeof *xd);
    uint8_t *wq = malloc((size_t)n * 4), *xq = malloc((size_t)n * 4);
    unsigned s = 11;
    for (int i = 0; i < n; i++) w[i] = frand(&s), x[i] = frand(&s) * 2.0f;
    for (size_t k = 0; k < sizeof types / sizeof *types; k++) {
        ggml_type t = types[k];
        CU_ASSERT_FATAL(quant_quantize_row(t, w, wq, n) == 0);
        quant_dequant_row(t, wq, wd, n);
        quant_act_quantize(t, x, xq, n);
        quant_dequant_row(quant_act_type(t), xq, xd, n);
        double ref = 0, ref_exact = 0, ref_abs = 0;
        for (int i = 0; i < n; i++)
            ref += (double)wd[i] * xd[i], ref_exact += (double)w[i] * x[i], ref_abs += fabs((double)wd[i] * xd[i]);
        for (int simd = 0; simd < 2; simd++) {
            quant_force_scalar(!simd);
            float got = quant_vec_dot(t, n, wq, xq);
            /* Q4_1/Q5_1 fold the block minimum through the f16 sum field: a little looser. The others,
             * K-quants included, are exact integers times float scales: a few roundings of sum |w x| */
            double tol = t == GGML_T_Q4_1 || t == GGML_T_Q5_1 ? 2e-2 : 2e-3;
            CU_ASSERT(fabs(got - ref) <= tol * (1 + fabs(ref)));
            if (t != GGML_T_Q4_1 && t != GGML_T_Q5_1 && t != GGML_T_F16) CU_ASSERT(fabs(got - ref) <= 1e-5 * ref_abs);
            CU_ASSERT(fabs(got - ref_exact) <= 0.05 * sqrt((double)n)); /* quantization noise only */
        }
        quant_force_scalar(0);
    }
    free(w), free(x), free(wd), free(xd), free(wq), free(xq);
}

/* the scalar kernels take the AVX2 kernels' float order (llama.cpp's), so they agree bit for bit */
static void test_simd_and_scalar_dots_are_bitwise_equal(void) {
    ggml_type types[] = {GGML_T_Q4_0, GGML_T_Q4_1, GGML_T_Q5_0, GGML_T_Q5_1, GGML_T_Q8_0,
                         GGML_T_Q4_K, GGML_T_Q5_K, GGML_T_Q6_K};
    const int n = 1536, nt = sizeof types / sizeof *types;
    float w[1536], x[1536];
    uint8_t wq[1536 * 2], xq[1536 * 2];
    unsigned s = 3;
    int compared = 0;
    for (int trial = 0; trial < 20; trial++) {
        const float scale = trial % 2 ? 40.0f : 0.3f; /* large activations as well as small */
        for (int i = 0; i < n; i++) w[i] = frand(&s), x[i] = scale * frand(&s);
        for (int k = 0; k < nt; k++) {
            CU_ASSERT_FATAL(quant_quantize_row(types[k], w, wq, n) == 0);
            quant_act_quantize(types[k], x, xq, n);
            quant_force_scalar(1);
            float a = quant_vec_dot(types[k], n, wq, xq);
            quant_force_scalar(0);
            float b = quant_vec_dot(types[k], n, wq, xq);
            CU_ASSERT(memcmp(&a, &b, sizeof a) == 0);
            compared++;
        }
    }
    CU_ASSERT_EQUAL(compared, 20 * nt);
}

/* F16 weights (synthetic models, F16 GGUFs): llama.cpp's accumulation order in both the AVX2+F16C loop and the
 * scalar one (bit for bit), the tail past a multiple of 32 included, and within float rounding of float64 */
static void test_f16_dots_simd_and_scalar_agree_and_match_float64(void) {
    const int lens[] = {32, 96, 1536, 1549, 7, 4096 + 31};
    unsigned s = 5;
    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
        const int n = lens[li];
        kvb_f16 *w = malloc((size_t)n * sizeof *w), *x = malloc((size_t)n * sizeof *x);
        double ref = 0, ref_abs = 0;
        for (int i = 0; i < n; i++) {
            w[i] = kvb_f32_to_f16(frand(&s));
            x[i] = kvb_f32_to_f16(frand(&s) * 8.0f);
            const double p = (double)kvb_f16_to_f32(w[i]) * kvb_f16_to_f32(x[i]);
            ref += p, ref_abs += fabs(p);
        }
        quant_force_scalar(1);
        const float a = quant_vec_dot(GGML_T_F16, n, w, x);
        quant_force_scalar(0);
        const float b = quant_vec_dot(GGML_T_F16, n, w, x);
        CU_ASSERT(memcmp(&a, &b, sizeof a) == 0);
        CU_ASSERT(fabs(a - ref) <= 1e-6 * ref_abs + 1e-6);
        free(w), free(x);
    }
}

/* Random bytes make every bit pattern a block can hold (extreme scales, all fifth/sixth bits, negative Q6_K
 * scales) that a quantizer would not produce; SIMD and scalar must still agree bit for bit, one activation
 * row at a time and four at once. */
static void test_simd_scalar_and_multi_row_dots_agree_on_random_blocks(void) {
    ggml_type types[] = {GGML_T_Q4_0, GGML_T_Q4_1, GGML_T_Q5_0, GGML_T_Q5_1, GGML_T_Q8_0,
                         GGML_T_Q4_K, GGML_T_Q5_K, GGML_T_Q6_K};
    const int n = 1024;
    static uint8_t wq[1024 * 2], xq[4][1024 * 2];
    float x[1024];
    unsigned s = 23;
    for (size_t k = 0; k < sizeof types / sizeof *types; k++) {
        ggml_type t = types[k];
        size_t wb = ggml_row_bytes(t, n);
        for (int trial = 0; trial < 10; trial++) {
            for (size_t i = 0; i < wb; i++) wq[i] = (uint8_t)(frand(&s) * 128 + 128);
            /* keep the f16 scales finite and moderate: overwrite each block's f16 fields with sane values */
            uint32_t be = ggml_block_elems(t), bb = ggml_block_bytes(t);
            for (uint32_t b = 0; b < n / be; b++) {
                uint8_t *blk = wq + (size_t)b * bb;
                kvb_f16 d = kvb_f32_to_f16(frand(&s) * 0.01f), m = kvb_f32_to_f16(frand(&s) * 0.01f);
                size_t d_at = t == GGML_T_Q6_K ? offsetof(block_q6_K, d) : 0;
                memcpy(blk + d_at, &d, 2);
                if (t == GGML_T_Q4_1 || t == GGML_T_Q5_1 || t == GGML_T_Q4_K || t == GGML_T_Q5_K)
                    memcpy(blk + 2, &m, 2);
            }
            for (int a = 0; a < 4; a++) {
                for (int i = 0; i < n; i++) x[i] = frand(&s) * (a + 1) * 3.0f;
                quant_act_quantize(t, x, xq[a], n);
            }
            float single[2][4], multi[2][4];
            for (int simd = 0; simd < 2; simd++) {
                quant_force_scalar(!simd);
                for (int a = 0; a < 4; a++) single[simd][a] = quant_vec_dot(t, n, wq, xq[a]);
                quant_vec_dot_multi(t, n, wq, xq, sizeof xq[0], 4, multi[simd]);
            }
            quant_force_scalar(0);
            CU_ASSERT(memcmp(single[0], single[1], sizeof single[0]) == 0);
            CU_ASSERT(memcmp(multi[0], single[0], sizeof single[0]) == 0);
            CU_ASSERT(memcmp(multi[1], single[0], sizeof single[0]) == 0);
            /* and against float64 of the dequantized operands */
            float wd[1024], xd[1024];
            quant_dequant_row(t, wq, wd, n);
            for (int a = 0; a < 4; a++) {
                quant_dequant_row(quant_act_type(t), xq[a], xd, n);
                double ref = 0, ref_abs = 0;
                for (int i = 0; i < n; i++) ref += (double)wd[i] * xd[i], ref_abs += fabs((double)wd[i] * xd[i]);
                double tol = t == GGML_T_Q4_1 || t == GGML_T_Q5_1 ? 2e-3 : 1e-5;
                CU_ASSERT(fabs(single[0][a] - ref) <= tol * ref_abs + 1e-30);
            }
        }
    }
}

/* fills n elements' worth of blocks of type t with random bytes, f16 scales (and minimums) kept moderate */
static void random_blocks(ggml_type t, uint8_t *wq, int n, unsigned *s) {
    size_t wb = ggml_row_bytes(t, n);
    for (size_t i = 0; i < wb; i++) wq[i] = (uint8_t)(frand(s) * 128 + 128);
    uint32_t be = ggml_block_elems(t), bb = ggml_block_bytes(t);
    for (uint32_t b = 0; b < n / be; b++) {
        uint8_t *blk = wq + (size_t)b * bb;
        kvb_f16 d = kvb_f32_to_f16(frand(s) * 0.01f), m = kvb_f32_to_f16(frand(s) * 0.01f);
        memcpy(blk + (t == GGML_T_Q6_K ? offsetof(block_q6_K, d) : 0), &d, 2);
        if (t == GGML_T_Q4_1 || t == GGML_T_Q5_1 || t == GGML_T_Q4_K || t == GGML_T_Q5_K) memcpy(blk + 2, &m, 2);
    }
}

/* The prefill tile (QUANT_TILE_ROWS rows x QUANT_TILE_TOK tokens) on random blocks gives each output the bits of
 * the scalar one-row dot, written at its row and token in the output's layout. */
static void test_prefill_tile_equals_scalar_dots_on_random_blocks(void) {
    ggml_type types[] = {GGML_T_Q4_0, GGML_T_Q4_1, GGML_T_Q5_0, GGML_T_Q5_1, GGML_T_Q8_0,
                         GGML_T_Q4_K, GGML_T_Q5_K, GGML_T_Q6_K};
    enum { N = 512, R = QUANT_TILE_ROWS, T = QUANT_TILE_TOK, OUT_STRIDE = 5 };
    static uint8_t wq[R][N * 2], xq[T][N * 2];
    static float scales[N / QK * 2 * T];
    float x[N];
    unsigned s = 41;
    int tiled = 0;
    for (size_t k = 0; k < sizeof types / sizeof *types; k++)
        for (int trial = 0; trial < 5; trial++) {
            ggml_type t = types[k];
            for (int r = 0; r < R; r++) random_blocks(t, wq[r], N, &s);
            for (int a = 0; a < T; a++) {
                for (int i = 0; i < N; i++) x[i] = frand(&s) * (a + 1) * 3.0f;
                quant_act_quantize(t, x, xq[a], N);
                quant_tile_scales(t, xq[a], N, scales, a);
            }
            float out[T * OUT_STRIDE];
            if (quant_vec_dot_tile(t, N, wq[0], sizeof wq[0], xq, sizeof xq[0], scales, out, OUT_STRIDE)) continue;
            tiled++;
            quant_force_scalar(1);
            for (int r = 0; r < R; r++)
                for (int a = 0; a < T; a++) {
                    float ref = quant_vec_dot(t, N, wq[r], xq[a]);
                    CU_ASSERT(memcmp(&ref, &out[a * OUT_STRIDE + r], sizeof ref) == 0);
                }
            quant_force_scalar(0);
        }
#if defined(__AVX2__) && defined(__FMA__)
    CU_ASSERT(tiled >= 5 * 5); /* the five 32-value types at least (the tiles are AVX2 code) */
#else
    CU_ASSERT(tiled == 0);
#endif
}

/* cpu_matmul vs naive float64 on dequantized weights and activations, odd shapes, 1 and 2 threads; every output
 * bitwise equal to the scalar one-row dot of the quantized types (token counts that leave 1-3 tokens past the last full tile, row
 * counts that leave an odd row). */
static void test_matmul_matches_float64_for_odd_shapes_and_threads(void) {
    ggml_type types[] = {GGML_T_F32,  GGML_T_Q4_1, GGML_T_Q8_0, GGML_T_Q4_0, GGML_T_Q5_0,
                         GGML_T_Q5_1, GGML_T_Q4_K, GGML_T_Q5_K, GGML_T_Q6_K};
    int rows_list[] = {1, 7, 193}, cols_list[] = {32, 576, 1536}, cols_k[] = {256, 768, 1536}, ntok_list[] = {1, 3, 5, 17};
    kvb_pool *pools[2] = {kvb_pool_create(1), kvb_pool_create(2)};
    unsigned s = 5;
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++)
        for (int ri = 0; ri < 3; ri++)
            for (int ci = 0; ci < 3; ci++)
                for (int ni = 0; ni < 4; ni++) {
                    ggml_type t = types[ti];
                    int rows = rows_list[ri], nt = ntok_list[ni];
                    int cols = ggml_block_elems(t) == QK_K ? cols_k[ci] : cols_list[ci];
                    size_t rb = ggml_row_bytes(t, (uint64_t)cols);
                    float *wf = malloc(sizeof(float) * (size_t)rows * cols), *x = malloc(sizeof(float) * (size_t)nt * cols);
                    float *row = malloc(sizeof(float) * cols), *xr = malloc(sizeof(float) * cols);
                    uint8_t *w = malloc(rb * rows), *xq = malloc(quant_act_row_bytes(t, cols));
                    for (int i = 0; i < rows * cols; i++) wf[i] = frand(&s);
                    for (int i = 0; i < nt * cols; i++) x[i] = frand(&s);
                    for (int r = 0; r < rows; r++) quant_quantize_row(t, wf + (size_t)r * cols, w + r * rb, cols);
                    size_t ws = cpu_matmul_ws_bytes(t, cols, nt);
                    void *act = malloc(ws);
                    float *out[2];
                    for (int p = 0; p < 2; p++) {
                        out[p] = malloc(sizeof(float) * (size_t)nt * rows);
                        CU_ASSERT(cpu_matmul(out[p], w, t, rows, cols, x, nt, act, ws, pools[p]) == 0);
                    }
                    double worst = 0;
                    int multi_differs = 0;
                    for (int tk = 0; tk < nt; tk++) {
                        quant_act_quantize(t, x + (size_t)tk * cols, xq, cols);
                        quant_dequant_row(quant_act_type(t), xq, xr, cols);
                        for (int r = 0; r < rows; r++) {
                            quant_dequant_row(t, w + r * rb, row, cols);
                            double ref = 0;
                            for (int c = 0; c < cols; c++) ref += (double)row[c] * xr[c];
                            double d = fabs(out[0][(size_t)tk * rows + r] - ref) / (1 + fabs(ref));
                            if (d > worst) worst = d;
                            /* tiles and four tokens at a time give each token the bits of the scalar dot
                             * (F32 has no scalar twin in the AVX2 order: the SIMD one-row dot there) */
                            quant_force_scalar(t != GGML_T_F32);
                            float one = quant_vec_dot(t, cols, w + r * rb, xq);
                            quant_force_scalar(0);
                            if (memcmp(&one, &out[0][(size_t)tk * rows + r], sizeof one)) multi_differs++;
                        }
                    }
                    CU_ASSERT(worst <= (t == GGML_T_Q4_1 || t == GGML_T_Q5_1 ? 2e-2 : 2e-3));
                    CU_ASSERT_EQUAL(multi_differs, 0);
                    CU_ASSERT(memcmp(out[0], out[1], sizeof(float) * (size_t)nt * rows) == 0);
                    free(out[0]), free(out[1]), free(act), free(wf), free(x), free(row), free(xr), free(w), free(xq);
                }
    kvb_pool_free(pools[0]);
    kvb_pool_free(pools[1]);
}

static void test_get_rows_returns_dequantized_rows(void) {
    float w[4 * 64];
    unsigned s = 9;
    for (int i = 0; i < 256; i++) w[i] = frand(&s);
    uint8_t q[4 * 68];
    for (int r = 0; r < 4; r++) quant_quantize_row(GGML_T_Q8_0, w + r * 64, q + r * 68, 64);
    int32_t ids[2] = {3, 1};
    float out[128], ref[64];
    cpu_get_rows(out, q, GGML_T_Q8_0, 64, ids, 2);
    quant_dequant_row(GGML_T_Q8_0, q + 3 * 68, ref, 64);
    CU_ASSERT(memcmp(out, ref, sizeof ref) == 0);
    quant_dequant_row(GGML_T_Q8_0, q + 1 * 68, ref, 64);
    CU_ASSERT(memcmp(out + 64, ref, sizeof ref) == 0);
}

int main(void) {
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("quant", NULL, NULL);
    CU_add_test(s, "Q4_1 block dequantizes to d*q+m", test_q4_1_block_dequantizes_to_d_times_q_plus_m);
    CU_add_test(s, "Q4_0, Q5_0, Q8_0 blocks dequantize by their formulas", test_q4_0_q5_0_q8_0_blocks_dequantize_by_their_formulas);
    CU_add_test(s, "Q4_K and Q6_K blocks follow their scale layout", test_q4_k_and_q6_k_blocks_follow_their_scale_layout);
    CU_add_test(s, "SIMD and scalar dequantization are bitwise equal", test_simd_and_scalar_dequantization_are_bitwise_equal);
    CU_add_test(s, "Q5_1 block dequantizes to d*q+m", test_q5_1_block_dequantizes_to_d_times_q_plus_m);
    CU_add_test(s, "Q5_K block takes the fifth bit from qh", test_q5_k_block_takes_the_fifth_bit_from_qh);
    CU_add_test(s, "Q8_K maps the extreme to -127 and sums groups of 16",
                test_q8_k_maps_the_extreme_to_minus_127_and_sums_groups_of_16);
    CU_add_test(s, "Q8_1 sum field is d times the sum of quants", test_q8_1_sum_field_is_d_times_sum_of_quants);
    CU_add_test(s, "vec_dot of every type matches float64 of dequantized operands", test_vec_dot_of_every_type_matches_float64_of_dequantized_operands);
    CU_add_test(s, "SIMD and scalar dots are bitwise equal", test_simd_and_scalar_dots_are_bitwise_equal);
    CU_add_test(s, "F16 dots: SIMD and scalar bitwise equal, float64 close", test_f16_dots_simd_and_scalar_agree_and_match_float64);
    CU_add_test(s, "SIMD, scalar and multi-row dots agree on random blocks",
                test_simd_scalar_and_multi_row_dots_agree_on_random_blocks);
    CU_add_test(s, "prefill tile equals scalar dots on random blocks", test_prefill_tile_equals_scalar_dots_on_random_blocks);
    CU_add_test(s, "matmul matches float64 for odd shapes and thread counts", test_matmul_matches_float64_for_odd_shapes_and_threads);
    CU_add_test(s, "get_rows returns dequantized rows", test_get_rows_returns_dequantized_rows);
    return util_run_suites();
}
