/* kquant_blocks.h — seeded rows of quantized weights made of random bytes (every bit pattern a block can hold,
 * f16 scales kept finite and moderate) and seeded activations: the inputs of tests/fixtures/ggml_dots.json, made
 * the same way by scripts/ggml_dots_check.c (against llama.cpp's kernels, writing the fixture) and by
 * tests/test_kquant.c (against the fixture). Header-only, so the script needs nothing from tests/ but this. */
#ifndef KVB_KQUANT_BLOCKS_H
#define KVB_KQUANT_BLOCKS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/quant.h"

static inline uint32_t kqb_next(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

/* uniform in [-1, 1) on a 2^-15 grid */
static inline float kqb_float(uint32_t *s) { return (float)(kqb_next(s) & 0xffff) / 32768.0f - 1.0f; }

/* byte offsets in a block of t's f16 scale fields (d, then dmin or m where there is one); their count */
static inline int kqb_f16_fields(ggml_type t, size_t at[2]) {
    switch (t) {
    case GGML_T_Q4_1: case GGML_T_Q5_1: case GGML_T_Q4_K: case GGML_T_Q5_K: at[0] = 0, at[1] = 2; return 2;
    case GGML_T_Q2_K: at[0] = offsetof(block_q2_K, d), at[1] = offsetof(block_q2_K, dmin); return 2;
    case GGML_T_Q3_K: at[0] = offsetof(block_q3_K, d); return 1;
    case GGML_T_Q6_K: at[0] = offsetof(block_q6_K, d); return 1;
    default: at[0] = 0; return 1;
    }
}

/* a row of n elements of type t: random bytes, then each block's f16 fields set to values in (-0.01, 0.01) */
static inline void kqb_random_row(ggml_type t, uint8_t *w, int64_t n, uint32_t *s) {
    const size_t bytes = ggml_row_bytes(t, (uint64_t)n), bb = ggml_block_bytes(t);
    for (size_t i = 0; i < bytes; i++) w[i] = (uint8_t)kqb_next(s);
    size_t at[2];
    const int nf = kqb_f16_fields(t, at);
    for (size_t b = 0; b < bytes / bb; b++)
        for (int f = 0; f < nf; f++) {
            const kvb_f16 h = kvb_f32_to_f16(kqb_float(s) * 0.01f);
            memcpy(w + b * bb + at[f], &h, 2);
        }
}

/* the fixture's weight types, its row length and trials per type; a 32-value type's odd trials drop one block
 * (an odd block count) */
static const ggml_type KQB_TYPES[] = {GGML_T_Q4_0, GGML_T_Q4_1, GGML_T_Q5_0, GGML_T_Q5_1, GGML_T_Q8_0,
                                      GGML_T_Q2_K, GGML_T_Q3_K, GGML_T_Q4_K, GGML_T_Q5_K, GGML_T_Q6_K,
                                      GGML_T_IQ4_NL, GGML_T_IQ4_XS};
enum { KQB_N = 4864, KQB_TRIALS = 8 };

static inline int64_t kqb_trial_n(ggml_type t, int trial) {
    return trial % 2 && ggml_block_elems(t) == 32 ? KQB_N - 32 : KQB_N;
}

/* trial's activations x[kqb_trial_n] (large every third trial) */
static inline void kqb_activations(float *x, int64_t n, int trial, uint32_t *s) {
    const float scale = trial % 3 ? 0.5f : 30.0f;
    for (int64_t i = 0; i < n; i++) x[i] = scale * kqb_float(s);
}

#endif
