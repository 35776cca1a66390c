/* util_arch_model.h — small seeded random-weight GGUFs of the newer architectures (llama with RoPE scaling, qwen2
 * with YaRN, qwen3, gemma3 with local and global layers, llama with a sliding window), written in C from a seed so
 * CI needs neither Python nor llama.cpp: test_arch_llamacpp checks them against llama.cpp's fixtures, and the
 * method, calibration and --dump-kept tests run on a hybrid one (util_gemma3_deep). Byte vocabulary (259 tokens),
 * f32 weights, context 4096. */
#ifndef KVB_TEST_ARCH_MODEL_H
#define KVB_TEST_ARCH_MODEL_H

#include <stdint.h>

#include "engine/model.h"

typedef struct {
    const char *name, *arch;
    int n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff;
    float freq_base;
    const char *scaling; /* rope.scaling.type or NULL */
    float scaling_factor;
    int orig_ctx;
    int rope_freqs;      /* llama: write rope_freqs.weight */
    int swa;             /* attention.sliding_window (0 = none) */
    uint64_t seed;
} util_arch_model;

/* gemma3 at Gemma-3-270M's depth with test_arch_llamacpp's gemma3 sizes: 18 layers, of which 5, 11 and 17 are
 * global (llama.cpp's pattern of 6), window 24, 4 query heads on 1 KV head of 32; enough global layers for OmniKV's
 * filter, full and sparse roles and Round Attention's watershed and deep layers. No llama.cpp fixture. */
extern const util_arch_model util_gemma3_deep;

/* Write model M to path (its weights from M->seed); extra (may be NULL): one more key (a string when value is
 * given, else the float 30) or, named blk.*, one more tensor of n_embd floats. 0 = ok. */
int util_arch_model_write(const util_arch_model *M, const char *path, const char *extra, const char *value);
/* M written from its seed into a fresh temporary folder, loaded, and the file and folder removed: the model, or NULL
 * with a line on stderr. */
kvb_model *util_arch_model_load(const util_arch_model *M);

#endif
