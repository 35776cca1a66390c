/* ggml_dots_check.c — kvbench's activation quantizers and dot products against llama.cpp's own compiled
 * CPU kernels, bit for bit (built and run by scripts/ggml_dots_check.sh; needs a llama.cpp checkout).
 * For each weight type: random weights quantized by kvbench, random activations at two scales, and
 * llama.cpp's quantize_row_q8_* and ggml_vec_dot_*; prints how many of the trials are byte-identical. Every
 * other trial of a 32-value type drops one block, so an odd block count (IQ4_NL's tail) is checked too.
 * With --fixture FILE it also writes llama.cpp's dots of the seeded random-byte rows of tests/kquant_blocks.h as
 * JSON (tests/fixtures/ggml_dots.json, which tests/test_kquant.c checks without llama.cpp). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kernels/cpu/quant.h"
#include "tests/kquant_blocks.h"

typedef void (*ggml_quantize_fn)(const float *x, void *y, int64_t k);
typedef void (*ggml_dot_fn)(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by, int nrc);
#define GGML_DOT(name) void name(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by, int nrc);
void quantize_row_q8_0(const float *x, void *y, int64_t k);
void quantize_row_q8_1(const float *x, void *y, int64_t k);
void quantize_row_q8_K(const float *x, void *y, int64_t k);
GGML_DOT(ggml_vec_dot_q4_0_q8_0)
GGML_DOT(ggml_vec_dot_q4_1_q8_1)
GGML_DOT(ggml_vec_dot_q5_0_q8_0)
GGML_DOT(ggml_vec_dot_q5_1_q8_1)
GGML_DOT(ggml_vec_dot_q8_0_q8_0)
GGML_DOT(ggml_vec_dot_q4_K_q8_K)
GGML_DOT(ggml_vec_dot_q5_K_q8_K)
GGML_DOT(ggml_vec_dot_q6_K_q8_K)
GGML_DOT(ggml_vec_dot_q2_K_q8_K)
GGML_DOT(ggml_vec_dot_q3_K_q8_K)
GGML_DOT(ggml_vec_dot_iq4_xs_q8_K)
GGML_DOT(ggml_vec_dot_iq4_nl_q8_0)

static float frand(unsigned *s) {
    *s = *s * 1103515245u + 12345u;
    return ((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* llama.cpp's dot of each fixture trial (random-byte weights, its own activation quantizer), as float bits */
static int write_fixture(const char *path, const ggml_type *types, const ggml_quantize_fn *quantize,
                         const ggml_dot_fn *dot, int n_types) {
    FILE *f = fopen(path, "w");
    if (!f) return perror(path), 1;
    static uint8_t wq[KQB_N * 2], act[KQB_N * 2];
    static float x[KQB_N];
    fprintf(f, "{\"engine\":\"llama.cpp ggml_vec_dot_* (scripts/ggml_dots_check.sh)\",\"n\":%d,\"trials\":%d,"
               "\"dots\":{", KQB_N, KQB_TRIALS);
    for (int k = 0; k < n_types; k++) {
        uint32_t seed = 1000u + (uint32_t)types[k];
        fprintf(f, "%s\"%s\":[", k ? "," : "", ggml_type_name(types[k]));
        for (int trial = 0; trial < KQB_TRIALS; trial++) {
            const int64_t n = kqb_trial_n(types[k], trial);
            kqb_random_row(types[k], wq, n, &seed);
            kqb_activations(x, n, trial, &seed);
            quantize[k](x, act, n);
            float d;
            dot[k]((int)n, &d, 0, wq, 0, act, 0, 1);
            uint32_t bits;
            memcpy(&bits, &d, 4);
            fprintf(f, "%s%u", trial ? "," : "", bits);
        }
        fprintf(f, "]");
    }
    fprintf(f, "}}\n");
    return fclose(f) != 0;
}

int main(int argc, char **argv) {
    const struct {
        ggml_type t;
        ggml_quantize_fn quantize;
        ggml_dot_fn dot;
    } cases[] = {
        {GGML_T_Q4_0, quantize_row_q8_0, ggml_vec_dot_q4_0_q8_0}, {GGML_T_Q4_1, quantize_row_q8_1, ggml_vec_dot_q4_1_q8_1},
        {GGML_T_Q5_0, quantize_row_q8_0, ggml_vec_dot_q5_0_q8_0}, {GGML_T_Q5_1, quantize_row_q8_1, ggml_vec_dot_q5_1_q8_1},
        {GGML_T_Q8_0, quantize_row_q8_0, ggml_vec_dot_q8_0_q8_0}, {GGML_T_Q4_K, quantize_row_q8_K, ggml_vec_dot_q4_K_q8_K},
        {GGML_T_Q5_K, quantize_row_q8_K, ggml_vec_dot_q5_K_q8_K}, {GGML_T_Q6_K, quantize_row_q8_K, ggml_vec_dot_q6_K_q8_K},
        {GGML_T_Q2_K, quantize_row_q8_K, ggml_vec_dot_q2_K_q8_K}, {GGML_T_Q3_K, quantize_row_q8_K, ggml_vec_dot_q3_K_q8_K},
        {GGML_T_IQ4_XS, quantize_row_q8_K, ggml_vec_dot_iq4_xs_q8_K},
        {GGML_T_IQ4_NL, quantize_row_q8_0, ggml_vec_dot_iq4_nl_q8_0},
    };
    enum { N = 4864, TRIALS = 200 }; /* Qwen2.5-0.5B's FFN width: 19 K-blocks, 152 small blocks */
    static float w[N], x[N];
    static uint8_t wq[N * 2], ours_act[N * 2], ggml_act[N * 2];
    unsigned seed = 7;
    int failed = 0;
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        int act_same = 0, dot_same = 0;
        for (int trial = 0; trial < TRIALS; trial++) {
            const float scale = trial % 3 ? 0.5f : 30.0f;
            const int n = trial % 2 && ggml_block_elems(cases[k].t) == 32 ? N - 32 : N;
            for (int i = 0; i < n; i++) w[i] = frand(&seed), x[i] = scale * frand(&seed);
            quant_quantize_row(cases[k].t, w, wq, n);
            quant_act_quantize(cases[k].t, x, ours_act, n);
            cases[k].quantize(x, ggml_act, n);
            act_same += !memcmp(ours_act, ggml_act, quant_act_row_bytes(cases[k].t, n));
            /* both dots on llama.cpp's activations, so a dot difference is the dot's own */
            float ours = quant_vec_dot(cases[k].t, n, wq, ggml_act), theirs;
            cases[k].dot(n, &theirs, 0, wq, 0, ggml_act, 0, 1);
            dot_same += !memcmp(&ours, &theirs, sizeof ours);
        }
        printf("%-6s activations identical %3d/%d, dots identical %3d/%d\n", ggml_type_name(cases[k].t), act_same,
               TRIALS, dot_same, TRIALS);
        failed |= act_same != TRIALS || dot_same != TRIALS;
    }
    if (argc == 3 && !strcmp(argv[1], "--fixture")) {
        const int nt = (int)(sizeof KQB_TYPES / sizeof *KQB_TYPES);
        ggml_quantize_fn q[16];
        ggml_dot_fn d[16];
        for (int i = 0; i < nt; i++)
            for (size_t k = 0; k < sizeof cases / sizeof *cases; k++)
                if (cases[k].t == KQB_TYPES[i]) q[i] = cases[k].quantize, d[i] = cases[k].dot;
        failed |= write_fixture(argv[2], KQB_TYPES, q, d, nt);
    }
    return failed;
}
