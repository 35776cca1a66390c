/* util_arch_model.c — the seeded architecture models (util_arch_model.h). */
#include "util_arch_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util_gguf_writer.h"

enum { UTIL_ARCH_N_CTX = 4096 };

const util_arch_model util_gemma3_deep = {"gemma3-deep", "gemma3", 18, 64, 4, 1, 32, 128, 1000000.0f, NULL, 0, 0, 0, 24, 17};

static uint64_t rng;
static float frand(float lo, float hi) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (hi - lo) * (float)((rng >> 40) & 0xffffff) / 16777216.0f;
}

static void tensor(gw_writer *g, const char *name, int64_t cols, int64_t rows, float lo, float hi) {
    float *d = malloc((size_t)(cols * rows) * sizeof *d);
    for (int64_t i = 0; i < cols * rows; i++) d[i] = frand(lo, hi);
    uint64_t ne[2] = {(uint64_t)cols, (uint64_t)rows};
    gw_tensor(g, name, GGML_T_F32, rows > 1 ? 2 : 1, ne, d, (size_t)(cols * rows) * sizeof(float));
    free(d);
}

/* the GPT-2 byte symbol of byte b (as util_gguf_writer's byte vocabulary) */
static void byte_symbol(int b, char out[4]) {
    static int cp[256];
    if (!cp['!']) {
        int n = 0;
        for (int i = 0; i < 256; i++) cp[i] = (i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174) ? i : 256 + n++;
    }
    int c = cp[b];
    if (c < 0x80) out[0] = (char)c, out[1] = 0;
    else out[0] = (char)(0xC0 | (c >> 6)), out[1] = (char)(0x80 | (c & 0x3F)), out[2] = 0;
}

int util_arch_model_write(const util_arch_model *M, const char *path, const char *extra, const char *value) {
    gw_writer *g = gw_new();
    char key[128];
    rng = M->seed;
    gw_kv_str(g, "general.architecture", M->arch);
#define K(s) (snprintf(key, sizeof key, "%s.%s", M->arch, s), key)
    gw_kv_u32(g, K("block_count"), (uint32_t)M->n_layer);
    gw_kv_u32(g, K("context_length"), UTIL_ARCH_N_CTX);
    gw_kv_u32(g, K("embedding_length"), (uint32_t)M->n_embd);
    gw_kv_u32(g, K("feed_forward_length"), (uint32_t)M->n_ff);
    gw_kv_u32(g, K("attention.head_count"), (uint32_t)M->n_head);
    gw_kv_u32(g, K("attention.head_count_kv"), (uint32_t)M->n_head_kv);
    gw_kv_u32(g, K("attention.key_length"), (uint32_t)M->head_dim);
    gw_kv_u32(g, K("attention.value_length"), (uint32_t)M->head_dim);
    gw_kv_f32(g, K("rope.freq_base"), M->freq_base);
    gw_kv_f32(g, K("attention.layer_norm_rms_epsilon"), 1e-6f);
    if (M->scaling) {
        gw_kv_str(g, K("rope.scaling.type"), M->scaling);
        gw_kv_f32(g, K("rope.scaling.factor"), M->scaling_factor);
        if (M->orig_ctx) gw_kv_u32(g, K("rope.scaling.original_context_length"), (uint32_t)M->orig_ctx);
    }
    if (M->swa) gw_kv_u32(g, K("attention.sliding_window"), (uint32_t)M->swa);
    if (M->swa && !strcmp(M->arch, "gemma3")) gw_kv_f32(g, K("rope.freq_base_swa"), 10000.0f);
#undef K
    gw_kv_str(g, "tokenizer.ggml.model", "gpt2");
    gw_kv_str(g, "tokenizer.ggml.pre", "gpt-2");
    static char toks_buf[GW_BYTE_VOCAB][16];
    const char *toks[GW_BYTE_VOCAB];
    int32_t types[GW_BYTE_VOCAB];
    static const char *const specials[3] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    for (int i = 0; i < GW_BYTE_VOCAB; i++) {
        if (i < 3) snprintf(toks_buf[i], sizeof toks_buf[i], "%s", specials[i]);
        else byte_symbol(i - 3, toks_buf[i]);
        toks[i] = toks_buf[i];
        types[i] = i < 3 ? 3 : 1;
    }
    gw_kv_arr_str(g, "tokenizer.ggml.tokens", toks, GW_BYTE_VOCAB);
    gw_kv_arr_i32(g, "tokenizer.ggml.token_type", types, GW_BYTE_VOCAB);
    const char *merges[1] = {"a b"}; /* "ab" is no token: never applies */
    gw_kv_arr_str(g, "tokenizer.ggml.merges", merges, 1);
    gw_kv_u32(g, "tokenizer.ggml.bos_token_id", 1);
    gw_kv_u32(g, "tokenizer.ggml.eos_token_id", 2);
    gw_kv_bool(g, "tokenizer.ggml.add_bos_token", 0);
    if (extra && strncmp(extra, "blk.", 4) && value) gw_kv_str(g, extra, value);
    else if (extra && strncmp(extra, "blk.", 4)) gw_kv_f32(g, extra, 30.0f);

    const int E = M->n_embd, Q = M->n_head * M->head_dim, KV = M->n_head_kv * M->head_dim, F = M->n_ff;
    const int gemma = !strcmp(M->arch, "gemma3"), qk_norm = gemma || !strcmp(M->arch, "qwen3");
    const float w = 0.25f, emb = gemma ? 0.125f : 1.0f; /* gemma scales embeddings by sqrt(n_embd) = 8 */
    tensor(g, "token_embd.weight", E, GW_BYTE_VOCAB, -emb, emb);
    tensor(g, "output_norm.weight", E, 1, 0.8f, 1.2f);
    if (M->rope_freqs) { /* Llama 3.1's divisors: 1 for high frequencies, up to 8 for low ones, smooth between */
        float ff[64];
        for (int i = 0; i < M->head_dim / 2; i++) ff[i] = 1.0f + 7.0f * (float)i / (float)(M->head_dim / 2 - 1);
        uint64_t ne[1] = {(uint64_t)(M->head_dim / 2)};
        gw_tensor(g, "rope_freqs.weight", GGML_T_F32, 1, ne, ff, (size_t)(M->head_dim / 2) * sizeof(float));
    }
    for (int l = 0; l < M->n_layer; l++) {
        char n[64];
#define N(s) (snprintf(n, sizeof n, "blk.%d.%s", l, s), n)
        tensor(g, N("attn_norm.weight"), E, 1, 0.8f, 1.2f);
        tensor(g, N("ffn_norm.weight"), E, 1, 0.8f, 1.2f);
        tensor(g, N("attn_q.weight"), E, Q, -w, w);
        tensor(g, N("attn_k.weight"), E, KV, -w, w);
        tensor(g, N("attn_v.weight"), E, KV, -w, w);
        tensor(g, N("attn_output.weight"), Q, E, -w, w);
        tensor(g, N("ffn_gate.weight"), E, F, -w, w);
        tensor(g, N("ffn_up.weight"), E, F, -w, w);
        tensor(g, N("ffn_down.weight"), F, E, -w, w);
        if (!strcmp(M->arch, "qwen2")) {
            tensor(g, N("attn_q.bias"), Q, 1, -0.1f, 0.1f);
            tensor(g, N("attn_k.bias"), KV, 1, -0.1f, 0.1f);
            tensor(g, N("attn_v.bias"), KV, 1, -0.1f, 0.1f);
        }
        if (qk_norm) {
            tensor(g, N("attn_q_norm.weight"), M->head_dim, 1, 0.8f, 1.2f);
            tensor(g, N("attn_k_norm.weight"), M->head_dim, 1, 0.8f, 1.2f);
        }
        if (gemma) {
            tensor(g, N("post_attention_norm.weight"), E, 1, 0.8f, 1.2f);
            tensor(g, N("post_ffw_norm.weight"), E, 1, 0.8f, 1.2f);
        }
#undef N
    }
    if (extra && !strncmp(extra, "blk.", 4)) tensor(g, extra, E, 1, 0.0f, 1.0f);
    int rc = gw_write_file(g, path);
    gw_free(g);
    return rc;
}


kvb_model *util_arch_model_load(const util_arch_model *M) {
    char dir[] = "/tmp/kvb_arch_XXXXXX", path[256], err[512];
    if (!mkdtemp(dir)) return fprintf(stderr, "mkdtemp failed\n"), NULL;
    snprintf(path, sizeof path, "%s/%s.gguf", dir, M->name);
    kvb_model *m = NULL;
    if (util_arch_model_write(M, path, NULL, NULL)) fprintf(stderr, "writing %s failed\n", path);
    else if (!(m = kvb_model_load(path, err, sizeof err))) fprintf(stderr, "%s\n", err);
    unlink(path);
    rmdir(dir);
    return m;
}
