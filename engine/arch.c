/* arch.c — what each architecture is, read from GGUF metadata (kvb_config_read).
 *
 * Supported: llama (SmolLM2, Llama 3.x with its RoPE scaling, Mistral with its sliding window), qwen2 (QKV bias),
 * qwen3 (per-head Q/K RMSNorm), gemma3 (interleaved local and global layers, Q/K norm, sandwich norms, GeGLU).
 * Each follows llama.cpp's loader for it (src/llama-model.cpp and src/models/<arch>.cpp): the same keys, the same
 * defaults, the same derived numbers (YaRN's attention factor, Gemma 3's layer pattern and attention scale).
 *
 * The rule that keeps a number from being silently wrong: every `<arch>.` key must be one this file reads or
 * knows to be harmless, else loading fails with one line naming it (a new scaling type, logit soft-capping, a
 * per-layer head count, a window on an architecture that has none here...). The model loader applies the same
 * rule to tensors (engine/model.c: a tensor no layer binds, e.g. attention sinks or an output bias). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine/model.h"

#define ERR(...) (snprintf(err, err_len, __VA_ARGS__), -1)

enum { ARCH_LLAMA, ARCH_QWEN2, ARCH_QWEN3, ARCH_GEMMA3, ARCH_COUNT };
static const char *const arch_names[ARCH_COUNT] = {"llama", "qwen2", "qwen3", "gemma3"};
#define SUPPORTED "llama, qwen2, qwen3, gemma3"

/* `<arch>.` keys every architecture reads (or that change nothing: vocab_size, rope.scaling.finetuned) */
static const char *const common_keys[] = {
    "block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
    "attention.head_count_kv", "attention.layer_norm_rms_epsilon", "attention.key_length", "attention.value_length",
    "rope.freq_base", "rope.dimension_count", "vocab_size", "rope.scaling.type", "rope.scaling.factor",
    "rope.scale_linear", "rope.scaling.original_context_length", "rope.scaling.attn_factor",
    "rope.scaling.finetuned", "expert_count", "expert_used_count",
};
/* keys only some architectures read */
static const struct {
    int arch;
    const char *key;
} arch_keys[] = {
    {ARCH_LLAMA, "attention.sliding_window"},
    {ARCH_GEMMA3, "attention.sliding_window"},
    {ARCH_GEMMA3, "attention.sliding_window_pattern"},
    {ARCH_GEMMA3, "rope.freq_base_swa"},
    {ARCH_GEMMA3, "final_logit_softcapping"},
};

static int key_known(int arch, const char *suffix) {
    for (size_t i = 0; i < sizeof common_keys / sizeof *common_keys; i++)
        if (!strcmp(suffix, common_keys[i])) return 1;
    for (size_t i = 0; i < sizeof arch_keys / sizeof *arch_keys; i++)
        if (arch_keys[i].arch == arch && !strcmp(suffix, arch_keys[i].key)) return 1;
    return 0;
}

/* an optional u32 `<arch>.<suffix>`: 1 when present (read into *out), 0 when absent, -1 on a bad value */
static int opt_u32(const gguf_file *f, const char *arch, const char *suffix, uint32_t *out, char *err, size_t err_len) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (!gguf_find(f, key)) return 0;
    return gguf_get_u32(f, key, out, err, err_len) ? -1 : 1;
}

static int opt_f32(const gguf_file *f, const char *arch, const char *suffix, float *out, char *err, size_t err_len) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (!gguf_find(f, key)) return 0;
    return gguf_get_f32(f, key, out, err, err_len) ? -1 : 1;
}

static int req_u32(const gguf_file *f, const char *arch, const char *suffix, int *out, char *err, size_t err_len) {
    char key[128];
    uint32_t v;
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (gguf_get_u32(f, key, &v, err, err_len)) return -1;
    if (v > (1u << 30)) return ERR("%s is %u: out of range", key, v);
    *out = (int)v;
    return 0;
}

/* a float key that must be a positive finite number when present */
static int positive(const char *arch, const char *suffix, float v, char *err, size_t err_len) {
    if (v > 0 && isfinite(v)) return 0;
    return ERR("%s.%s is %g: it must be a positive finite number", arch, suffix, (double)v);
}

/* RoPE scaling: llama.cpp's hparams (rope.scaling.*) and the context's derived numbers (llama-context.cpp:
 * YaRN's ext_factor 1 and its attention factor get_mscale(s) / (1 + 0.1 ln s), which rope multiplies back). */
static int read_rope_scaling(const gguf_file *f, kvb_config *cfg, char *err, size_t err_len) {
    const char *a = cfg->arch;
    char key[128];
    kvb_rope_params *r = &cfg->rope;
    r->freq_base = cfg->rope_freq_base;
    r->freq_scale = 1.0f;
    r->ext_factor = 0.0f;
    r->attn_factor = 1.0f;
    r->beta_fast = 32.0f;
    r->beta_slow = 1.0f;
    r->n_ctx_orig = cfg->n_ctx_train;
    enum { NONE, LINEAR, YARN } type = LINEAR; /* llama.cpp's default when the key is absent */
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    if (gguf_find(f, key)) {
        gguf_str s;
        char shown[128];
        if (gguf_get_str(f, key, &s, err, err_len)) return -1;
        if (gguf_str_eq(s, "none")) type = NONE;
        else if (gguf_str_eq(s, "linear")) type = LINEAR;
        else if (gguf_str_eq(s, "yarn")) type = YARN;
        else
            return ERR("%s '%s' is not implemented (kvbench implements none, linear and yarn)", key,
                       gguf_str_safe(s, shown, sizeof shown));
    }
    float factor = 0.0f;
    int rc = opt_f32(f, a, "rope.scaling.factor", &factor, err, err_len);
    if (rc < 0) return -1;
    if (rc == 0 && opt_f32(f, a, "rope.scale_linear", &factor, err, err_len) < 0) return -1;
    if (factor != 0.0f && positive(a, "rope.scaling.factor", factor, err, err_len)) return -1;
    r->freq_scale = factor == 0.0f ? 1.0f : 1.0f / factor;
    uint32_t v;
    if ((rc = opt_u32(f, a, "rope.scaling.original_context_length", &v, err, err_len)) < 0) return -1;
    if (rc && v > 0) r->n_ctx_orig = (int)v;
    float hp_attn = 1.0f;
    if (opt_f32(f, a, "rope.scaling.attn_factor", &hp_attn, err, err_len) < 0) return -1;
    if (positive(a, "rope.scaling.attn_factor", hp_attn, err, err_len)) return -1;
    if (type == NONE) r->freq_scale = 1.0f;
    if (type == YARN) {
        r->ext_factor = 1.0f;
        const float s = 1.0f / r->freq_scale;
        const float mscale = s <= 1.0f ? 1.0f : 0.1f * 1.0f * logf(s) + 1.0f;
        r->attn_factor = mscale;
        r->attn_factor *= 1.0f / (1.0f + 0.1f * logf(s));
    }
    r->attn_factor *= hp_attn;
    cfg->rope_scaled = r->freq_scale != 1.0f || r->ext_factor != 0.0f || r->attn_factor != 1.0f;
    return 0;
}

/* Gemma 3's local layers (llama.cpp's load_swa_pattern(ml, 6)): sliding_window_pattern as a bool array (one per
 * layer), or a period n (layer l is local unless l % n == n - 1; 0 = every layer local), default 6. */
static int read_swa_pattern(const gguf_file *f, kvb_config *cfg, char *err, size_t err_len) {
    char key[128];
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", cfg->arch);
    const gguf_kv *kv = gguf_find(f, key);
    uint32_t period = 6;
    if (kv && kv->val.type == GGUF_VT_ARRAY) {
        const gguf_value *arr;
        if (gguf_get_arr(f, key, GGUF_VT_COUNT, &arr, err, err_len)) return -1;
        if (arr->v.arr.elem_type != GGUF_VT_BOOL && arr->v.arr.elem_type != GGUF_VT_UINT8 &&
            arr->v.arr.elem_type != GGUF_VT_INT32 && arr->v.arr.elem_type != GGUF_VT_UINT32)
            return ERR("%s: an array of %s is not a per-layer pattern kvbench reads", key,
                       gguf_vtype_name(arr->v.arr.elem_type));
        if (arr->v.arr.count != (uint64_t)cfg->n_layer)
            return ERR("%s has %llu entries for %d layers", key, (unsigned long long)arr->v.arr.count, cfg->n_layer);
        for (int l = 0; l < cfg->n_layer; l++) cfg->swa_layer[l] = gguf_arr_i64(arr, (uint64_t)l) != 0;
        return 0;
    }
    if (kv && gguf_get_u32(f, key, &period, err, err_len)) return -1;
    for (int l = 0; l < cfg->n_layer; l++)
        cfg->swa_layer[l] = period == 0 || (uint32_t)l % period < period - 1;
    return 0;
}

int kvb_config_read(const gguf_file *f, kvb_config *cfg, char *err, size_t err_len) {
    memset(cfg, 0, sizeof *cfg);
    gguf_str arch_s;
    if (gguf_get_str(f, "general.architecture", &arch_s, err, err_len)) return -1;
    char shown[128];
    int arch = -1;
    for (int i = 0; i < ARCH_COUNT; i++)
        if (gguf_str_eq(arch_s, arch_names[i])) arch = i;
    if (arch < 0)
        return ERR("unsupported architecture '%s' (supported: " SUPPORTED ")", gguf_str_safe(arch_s, shown, sizeof shown));
    snprintf(cfg->arch, sizeof cfg->arch, "%s", arch_names[arch]);
    const char *a = cfg->arch;
    const size_t prefix = strlen(a) + 1;

    /* every key of the architecture is one we read or know to be harmless */
    for (uint64_t i = 0; i < f->n_kv; i++) {
        gguf_str k = f->kv[i].key;
        if (k.len <= prefix || memcmp(k.ptr, a, prefix - 1) || k.ptr[prefix - 1] != '.') continue;
        char suffix[128] = "";
        int ok = k.len - prefix < sizeof suffix && !memchr(k.ptr, 0, k.len);
        if (ok) memcpy(suffix, k.ptr + prefix, k.len - prefix), suffix[k.len - prefix] = 0;
        if (!ok || !key_known(arch, suffix))
            return ERR("key '%s' is not implemented for %s (it may change the math; kvbench refuses rather than ignore "
                       "it)", gguf_str_safe(k, shown, sizeof shown), a);
    }

    if (req_u32(f, a, "block_count", &cfg->n_layer, err, err_len) ||
        req_u32(f, a, "embedding_length", &cfg->n_embd, err, err_len) ||
        req_u32(f, a, "feed_forward_length", &cfg->n_ff, err, err_len) ||
        req_u32(f, a, "attention.head_count", &cfg->n_head, err, err_len) ||
        req_u32(f, a, "context_length", &cfg->n_ctx_train, err, err_len))
        return -1;
    cfg->n_head_kv = cfg->n_head;
    uint32_t v;
    int rc;
    if ((rc = opt_u32(f, a, "attention.head_count_kv", &v, err, err_len)) < 0) return -1;
    if (rc) cfg->n_head_kv = (int)v;
    if ((rc = opt_u32(f, a, "expert_count", &v, err, err_len)) < 0) return -1;
    if (rc && v > 0) return ERR("%s.expert_count is %u: mixture-of-experts layers are not implemented", a, v);
    char key[128];
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", a);
    if (gguf_get_f32(f, key, &cfg->rms_eps, err, err_len)) return -1;
    /* a NaN or negative epsilon (or 0, which divides an all-zero row, e.g. a padding token's embedding, by
     * zero) and a base that is not a positive number make every logit NaN; refuse them here, by key, rather
     * than let generation read NaN logits as "the first token is end of generation" */
    if (positive(a, "attention.layer_norm_rms_epsilon", cfg->rms_eps, err, err_len)) return -1;
    cfg->rope_freq_base = 10000.0f;
    if (opt_f32(f, a, "rope.freq_base", &cfg->rope_freq_base, err, err_len) < 0) return -1;
    if (positive(a, "rope.freq_base", cfg->rope_freq_base, err, err_len)) return -1;
    if (cfg->n_layer <= 0 || cfg->n_layer > KVB_MAX_LAYERS || cfg->n_embd <= 0 || cfg->n_embd > 65536 ||
        cfg->n_head <= 0 || cfg->n_head > 1024 || cfg->n_head_kv <= 0 || cfg->n_head % cfg->n_head_kv ||
        cfg->n_ff <= 0 || cfg->n_ff > 1 << 20 || cfg->n_ctx_train <= 0)
        return ERR("implausible model dimensions in metadata (layers %d, embd %d, heads %d/%d, ffn %d)", cfg->n_layer,
                   cfg->n_embd, cfg->n_head, cfg->n_head_kv, cfg->n_ff);
    /* the head size: attention.key_length where given (Qwen3-0.6B, Gemma 3: not n_embd / n_head) */
    cfg->head_dim = cfg->n_embd % cfg->n_head ? 0 : cfg->n_embd / cfg->n_head;
    if ((rc = opt_u32(f, a, "attention.key_length", &v, err, err_len)) < 0) return -1;
    if (rc) cfg->head_dim = (int)v;
    uint32_t v_len = (uint32_t)cfg->head_dim;
    if (opt_u32(f, a, "attention.value_length", &v_len, err, err_len) < 0) return -1;
    if (cfg->head_dim <= 0 || cfg->head_dim > 1024 || cfg->head_dim % 2)
        return ERR("implausible head size %d (embd %d, heads %d)", cfg->head_dim, cfg->n_embd, cfg->n_head);
    if ((int)v_len != cfg->head_dim)
        return ERR("%s.attention.value_length %u differs from the key length %d: not implemented", a, v_len,
                   cfg->head_dim);
    cfg->q_dim = cfg->n_head * cfg->head_dim;
    cfg->n_rot = cfg->head_dim;
    if ((rc = opt_u32(f, a, "rope.dimension_count", &v, err, err_len)) < 0) return -1;
    if (rc) {
        if (v == 0 || (int)v > cfg->head_dim || v % 2)
            return ERR("rope dimension %u does not fit head size %d", v, cfg->head_dim);
        cfg->n_rot = (int)v;
    }
    if (read_rope_scaling(f, cfg, err, err_len)) return -1;

    cfg->rope_neox = arch != ARCH_LLAMA;
    cfg->has_qkv_bias = arch == ARCH_QWEN2;
    cfg->qk_norm = arch == ARCH_QWEN3 || arch == ARCH_GEMMA3;
    cfg->attn_scale = 1.0f / sqrtf((float)cfg->head_dim);
    cfg->ffn_act = KVB_FFN_SWIGLU;
    if ((rc = opt_u32(f, a, "attention.sliding_window", &v, err, err_len)) < 0) return -1;
    if (rc && v > 0) {
        if (v > INT32_MAX / 2) return ERR("%s.attention.sliding_window %u is out of range", a, v);
        cfg->n_swa = (int)v;
        /* llama (Mistral v0.1): every layer attends over the window; gemma3: its pattern */
        for (int l = 0; l < cfg->n_layer; l++) cfg->swa_layer[l] = 1;
    }
    if (arch == ARCH_GEMMA3) {
        cfg->post_norms = 1;
        cfg->ffn_act = KVB_FFN_GEGLU;
        cfg->embd_scale = sqrtf((float)cfg->n_embd);
        /* gemma_pytorch: query_pre_attn_scalar = n_embd / n_head for the 27B (62 layers), head_dim otherwise */
        if (cfg->n_layer == 62) cfg->attn_scale = 1.0f / sqrtf((float)(cfg->n_embd / cfg->n_head));
        float cap = 0.0f;
        if (opt_f32(f, a, "final_logit_softcapping", &cap, err, err_len) < 0) return -1;
        if (cap != 0.0f) return ERR("%s.final_logit_softcapping %g: logit soft-capping is not implemented", a, (double)cap);
        cfg->rope_freq_base_swa = 10000.0f; /* llama.cpp's default for the local layers */
        if (cfg->n_swa > 0) {
            if (read_swa_pattern(f, cfg, err, err_len)) return -1;
            if (opt_f32(f, a, "rope.freq_base_swa", &cfg->rope_freq_base_swa, err, err_len) < 0) return -1;
            if (positive(a, "rope.freq_base_swa", cfg->rope_freq_base_swa, err, err_len)) return -1;
        }
    }
    return 0;
}
