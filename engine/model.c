/* model.c — llama-family config, weights and the forward pass.
 *
 * The forward pass follows llama.cpp's graph for arch llama/qwen2 so that token
 * ids and logits agree with it: per layer
 *   x += Wo · attn(rope(Wq·n(x)), rope(Wk·n(x)), Wv·n(x))       n = RMSNorm(attn_norm)
 *   x += Wdown · (silu(Wgate·n'(x)) * Wup·n'(x))                 n' = RMSNorm(ffn_norm)
 * and logits = Wout · RMSNorm(output_norm)(x). The phases carry the names of
 * Round Attention's latency decomposition (calc_qkv_and_rope, update_cache,
 * attn_forward, attn_output, mlp), which are also the profiler's and NVTX's names. */
#include "engine/model.h"
#include "engine/synthetic.h"


#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#define ERR(...) (snprintf(err, err_len, __VA_ARGS__), -1)

/* Models kvbench fetches by name (scripts/fetch-model.sh NAME) into the model cache. */
static const struct {
    const char *name, *file;
} known_models[] = {
    {"default", "SmolLM2-135M-Instruct.Q4_1.gguf"},
    {"qwen2.5-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct.gguf"},
};

int kvb_model_resolve(const char *name, char *path_out, size_t path_cap, char *err, size_t err_len) {
    syn_spec syn;
    if (syn_is_name(name) && syn_parse(name, &syn, err, err_len)) return -1;
    const char *file = NULL;
    for (size_t i = 0; i < sizeof known_models / sizeof *known_models; i++)
        if (!strcmp(name, known_models[i].name)) file = known_models[i].file;
    if (!file) {
        if ((size_t)snprintf(path_out, path_cap, "%s", name) >= path_cap) return ERR("model path too long");
        return 0;
    }
    const char *dir = getenv("KVB_MODEL_DIR");
    const char *home = getenv("HOME");
    int n;
    if (dir && *dir)
        n = snprintf(path_out, path_cap, "%s/%s", dir, file);
    else
        n = snprintf(path_out, path_cap, "%s/.cache/kvbench/models/%s", home ? home : ".", file);
    if (n < 0 || (size_t)n >= path_cap) return ERR("model path too long");
    FILE *f = fopen(path_out, "rb");
    if (!f) return ERR("model '%s' not found at %s (run scripts/fetch-model.sh %s)", name, path_out, name);
    fclose(f);
    return 0;
}

static int get_u32_arch(const gguf_file *f, const char *arch, const char *suffix, uint32_t *out, char *err,
                        size_t err_len) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return gguf_get_u32(f, key, out, err, err_len);
}

int kvb_config_read(const gguf_file *f, kvb_config *cfg, char *err, size_t err_len) {
    memset(cfg, 0, sizeof *cfg);
    gguf_str arch;
    if (gguf_get_str(f, "general.architecture", &arch, err, err_len)) return -1;
    char shown[128];
    if (arch.len >= sizeof cfg->arch)
        return ERR("unsupported architecture '%s' (supported: llama, qwen2)", gguf_str_safe(arch, shown, sizeof shown));
    memcpy(cfg->arch, arch.ptr, arch.len);
    cfg->arch[arch.len] = 0;
    if (strcmp(cfg->arch, "llama") && strcmp(cfg->arch, "qwen2"))
        return ERR("unsupported architecture '%s' (supported: llama, qwen2)", gguf_str_safe(arch, shown, sizeof shown));
    uint32_t v;
    if (get_u32_arch(f, cfg->arch, "block_count", &v, err, err_len)) return -1;
    cfg->n_layer = (int)v;
    if (get_u32_arch(f, cfg->arch, "embedding_length", &v, err, err_len)) return -1;
    cfg->n_embd = (int)v;
    if (get_u32_arch(f, cfg->arch, "feed_forward_length", &v, err, err_len)) return -1;
    cfg->n_ff = (int)v;
    if (get_u32_arch(f, cfg->arch, "attention.head_count", &v, err, err_len)) return -1;
    cfg->n_head = (int)v;
    cfg->n_head_kv = cfg->n_head;
    char key[128];
    snprintf(key, sizeof key, "%s.attention.head_count_kv", cfg->arch);
    if (gguf_find(f, key) && gguf_get_u32(f, key, &v, err, err_len) == 0) cfg->n_head_kv = (int)v;
    if (get_u32_arch(f, cfg->arch, "context_length", &v, err, err_len)) return -1;
    cfg->n_ctx_train = (int)v;
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", cfg->arch);
    if (gguf_get_f32(f, key, &cfg->rms_eps, err, err_len)) return -1;
    /* a NaN or negative epsilon (or 0, which divides an all-zero row, e.g. a padding token's embedding, by
     * zero) and a base that is not a positive number make every logit NaN; refuse them here, by key, rather
     * than let generation read NaN logits as "the first token is end of generation" */
    if (!(cfg->rms_eps > 0) || !isfinite(cfg->rms_eps))
        return ERR("%s is %g: it must be a positive finite number", key, (double)cfg->rms_eps);
    cfg->rope_freq_base = 10000.0f;
    snprintf(key, sizeof key, "%s.rope.freq_base", cfg->arch);
    if (gguf_find(f, key) && gguf_get_f32(f, key, &cfg->rope_freq_base, err, err_len)) return -1;
    if (!(cfg->rope_freq_base > 0) || !isfinite(cfg->rope_freq_base))
        return ERR("%s is %g: it must be a positive finite number", key, (double)cfg->rope_freq_base);
    if (cfg->n_layer <= 0 || cfg->n_layer > 1024 || cfg->n_embd <= 0 || cfg->n_embd > 65536 || cfg->n_head <= 0 ||
        cfg->n_head > 1024 || cfg->n_head_kv <= 0 || cfg->n_head % cfg->n_head_kv || cfg->n_embd % cfg->n_head ||
        cfg->n_ff <= 0 || cfg->n_ff > 1 << 20 || cfg->n_ctx_train <= 0)
        return ERR("implausible model dimensions in metadata (layers %d, embd %d, heads %d/%d, ffn %d)", cfg->n_layer,
                   cfg->n_embd, cfg->n_head, cfg->n_head_kv, cfg->n_ff);
    cfg->head_dim = cfg->n_embd / cfg->n_head;
    cfg->n_rot = cfg->head_dim;
    snprintf(key, sizeof key, "%s.rope.dimension_count", cfg->arch);
    if (gguf_find(f, key)) {
        if (gguf_get_u32(f, key, &v, err, err_len)) return -1;
        if ((int)v > cfg->head_dim || v % 2) return ERR("rope dimension %u does not fit head size %d", v, cfg->head_dim);
        cfg->n_rot = (int)v;
    }
    cfg->rope_neox = strcmp(cfg->arch, "qwen2") == 0;
    cfg->has_qkv_bias = strcmp(cfg->arch, "qwen2") == 0;
    return 0;
}

/* Bind a weight matrix of the expected shape [cols, rows]. */
static int bind_matrix(const gguf_file *f, const char *name, int64_t cols, int64_t rows, kvb_weight *w, char *err,
                       size_t err_len) {
    const gguf_tensor *t = gguf_find_tensor(f, name);
    if (!t) return ERR("missing tensor '%s'", name);
    if ((int64_t)t->ne[0] != cols || (int64_t)t->ne[1] != rows || t->ne[2] != 1 || t->ne[3] != 1)
        return ERR("tensor '%s' has shape [%llu, %llu], expected [%lld, %lld]", name, (unsigned long long)t->ne[0],
                   (unsigned long long)t->ne[1], (long long)cols, (long long)rows);
    w->data = t->data;
    w->type = t->type;
    w->rows = rows;
    w->cols = cols;
    return 0;
}

static int bind_vector(const gguf_file *f, const char *name, int64_t n, int required, const float **out, char *err,
                       size_t err_len) {
    const gguf_tensor *t = gguf_find_tensor(f, name);
    *out = NULL;
    if (!t) return required ? ERR("missing tensor '%s'", name) : 0;
    if (t->type != GGML_T_F32) return ERR("tensor '%s' must be F32, found %s", name, ggml_type_name(t->type));
    if ((int64_t)t->ne[0] != n || t->n_dims != 1) return ERR("tensor '%s' must have %lld elements", name, (long long)n);
    if (((uintptr_t)t->data) % sizeof(float)) return ERR("tensor '%s' is misaligned", name);
    *out = t->data;
    return 0;
}

kvb_model *kvb_model_load(const char *path, char *err, size_t err_len) {
    kvb_model *m = calloc(1, sizeof *m);
    if (!m) { snprintf(err, err_len, "out of memory"); return NULL; }
    snprintf(m->path, sizeof m->path, "%s", path);
    if (syn_is_name(path)) {
        if (syn_model_init(m, path, err, err_len)) goto fail;
        return m;
    }
    char sub[512];
    m->gguf = gguf_open(path, sub, sizeof sub);
    if (!m->gguf) {
        snprintf(err, err_len, "%s: %s", path, sub);
        goto fail;
    }
    if (kvb_config_read(m->gguf, &m->cfg, err, err_len)) goto fail;
    const kvb_config *c = &m->cfg;
    const gguf_file *f = m->gguf;
    int64_t kv_dim = (int64_t)c->n_head_kv * c->head_dim;
    const gguf_tensor *emb = gguf_find_tensor(f, "token_embd.weight");
    if (!emb) {
        snprintf(err, err_len, "missing tensor 'token_embd.weight'");
        goto fail;
    }
    c = &m->cfg;
    if (emb->ne[1] > (1u << 24)) { /* the tokenizer's own bound; n_vocab is an int */
        snprintf(err, err_len, "%s: tensor 'token_embd.weight' has %llu rows, more than the %d tokens a vocabulary may "
                 "have", path, (unsigned long long)emb->ne[1], 1 << 24);
        goto fail;
    }
    m->cfg.n_vocab = (int)emb->ne[1];
    if (bind_matrix(f, "token_embd.weight", c->n_embd, c->n_vocab, &m->tok_embd, err, err_len)) goto fail;
    if (gguf_find_tensor(f, "output.weight")) {
        if (bind_matrix(f, "output.weight", c->n_embd, c->n_vocab, &m->output, err, err_len)) goto fail;
    } else {
        m->output = m->tok_embd;
        m->cfg.tied_output = 1;
    }
    if (bind_vector(f, "output_norm.weight", c->n_embd, 1, &m->output_norm, err, err_len)) goto fail;
    m->layers = calloc((size_t)c->n_layer, sizeof *m->layers);
    if (!m->layers) {
        snprintf(err, err_len, "out of memory");
        goto fail;
    }
    for (int l = 0; l < c->n_layer; l++) {
        kvb_layer *L = &m->layers[l];
        char n[96];
#define NAME(s) (snprintf(n, sizeof n, "blk.%d.%s", l, s), n)
        if (bind_vector(f, NAME("attn_norm.weight"), c->n_embd, 1, &L->attn_norm, err, err_len) ||
            bind_vector(f, NAME("ffn_norm.weight"), c->n_embd, 1, &L->ffn_norm, err, err_len) ||
            bind_matrix(f, NAME("attn_q.weight"), c->n_embd, c->n_embd, &L->wq, err, err_len) ||
            bind_matrix(f, NAME("attn_k.weight"), c->n_embd, kv_dim, &L->wk, err, err_len) ||
            bind_matrix(f, NAME("attn_v.weight"), c->n_embd, kv_dim, &L->wv, err, err_len) ||
            bind_matrix(f, NAME("attn_output.weight"), c->n_embd, c->n_embd, &L->wo, err, err_len) ||
            bind_matrix(f, NAME("ffn_gate.weight"), c->n_embd, c->n_ff, &L->w_gate, err, err_len) ||
            bind_matrix(f, NAME("ffn_up.weight"), c->n_embd, c->n_ff, &L->w_up, err, err_len) ||
            bind_matrix(f, NAME("ffn_down.weight"), c->n_ff, c->n_embd, &L->w_down, err, err_len) ||
            bind_vector(f, NAME("attn_q.bias"), c->n_embd, c->has_qkv_bias, &L->bq, err, err_len) ||
            bind_vector(f, NAME("attn_k.bias"), kv_dim, c->has_qkv_bias, &L->bk, err, err_len) ||
            bind_vector(f, NAME("attn_v.bias"), kv_dim, c->has_qkv_bias, &L->bv, err, err_len))
            goto fail;
#undef NAME
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) m->weight_bytes += f->tensors[i].n_bytes;
    m->tok = tok_load(f, sub, sizeof sub);
    if (!m->tok) {
        snprintf(err, err_len, "%s: %s", path, sub);
        goto fail;
    }
    /* one row per token, as llama.cpp's loader demands (it refuses token_embd.weight of any other shape): extra
     * rows would be ids the tokenizer cannot print (generation printed nothing and exited 0), missing rows ids
     * the embedding cannot look up */
    if (tok_n_vocab(m->tok) != c->n_vocab) {
        snprintf(err, err_len, "%s: tensor 'token_embd.weight' has %d rows but the tokenizer has %d tokens (they "
                 "must be equal)", path, c->n_vocab, tok_n_vocab(m->tok));
        goto fail;
    }
    return m;
fail:
    kvb_model_free(m);
    return NULL;
}

void kvb_model_free(kvb_model *m) {
    if (!m) return;
    tok_free(m->tok);
    free(m->layers);
    syn_model_release(m);
    gguf_close(m->gguf);
    free(m);
}

kvb_ctx_params kvb_ctx_default_params(void) {
    kvb_ctx_params p = {0};
    p.kv_dtype = KVB_F16;
    p.n_batch = 512;
    const char *b = getenv("KVB_BACKEND");
    p.backend = b && *b ? b : "cpu";
    return p;
}

kvb_gemm kvb_ctx_gemm(const kvb_ctx_params *p) {
    if (p->prefill_gemm == KVB_PREFILL_GEMM_AUTO) return p->kv_dtype == KVB_F32 ? KVB_GEMM_INT8 : KVB_GEMM_F32;
    return p->prefill_gemm == KVB_PREFILL_GEMM_F32 ? KVB_GEMM_F32 : KVB_GEMM_INT8;
}

static int64_t f16_bytes(const kvb_weight *w) { return w->data ? w->rows * w->cols * 2 : 0; }

/* Bytes of the model with every matrix in f16 and vectors in f32 (what the CUDA backend uploads). */
static int64_t model_f16_bytes(const kvb_model *m) {
    const kvb_config *cfg = &m->cfg;
    int64_t b = f16_bytes(&m->tok_embd) + (m->output.data != m->tok_embd.data ? f16_bytes(&m->output) : 0);
    b += (int64_t)cfg->n_embd * 4 * (2 * (int64_t)cfg->n_layer + 1);
    for (int l = 0; l < cfg->n_layer; l++) {
        const kvb_layer *L = &m->layers[l];
        b += f16_bytes(&L->wq) + f16_bytes(&L->wk) + f16_bytes(&L->wv) + f16_bytes(&L->wo) + f16_bytes(&L->w_gate) +
             f16_bytes(&L->w_up) + f16_bytes(&L->w_down);
        if (L->bq) b += 4 * (L->wq.rows + L->wk.rows + L->wv.rows);
    }
    return b;
}

/* Host code is about to read what ops wrote (a GPU backend enqueues asynchronously): wait, and report an op
 * that failed since (a backend's failure is sticky, so a sync that ignores it reports at the next one). */
static int be_sync(kvb_backend *be, char *err, size_t err_len) {
    return be->sync && be->sync(be) ? ERR("%s", be->error) : 0;
}
static void be_sync_quiet(void *be) { be_sync(be, NULL, 0); } /* for the profiler's timestamps */

/* A device-to-device copy (overlap allowed). */
static int dev_copy(kvb_backend *be, void *dst, const void *src, size_t bytes, char *err, size_t err_len) {
    return bytes ? be->copy(be, dst, src, bytes, KVB_COPY_D2D, err, err_len) : 0;
}

/* Copies the backend made since t0 (data ops: packed loads, offload writes, positions up, logits down) go to
 * the profiler's current stage. */
static void count_copies(kvb_ctx *c, const kvb_traffic *t0) {
    for (int d = 0; d < KVB_COPY_DIRS; d++)
        prof_add_copies(c->prof, d, c->be->traffic.n[d] - t0->n[d], c->be->traffic.bytes[d] - t0->bytes[d]);
}

static float *alloc_f32(kvb_ctx *c, int64_t n) {
    return kvb_mem_alloc(&c->mem, KVB_TIER_DEVICE, KVB_MEM_WORKSPACE, (size_t)n * sizeof(float));
}

kvb_ctx *kvb_ctx_create(kvb_model *m, const kvb_ctx_params *p, char *err, size_t err_len) {
    kvb_ctx *c = calloc(1, sizeof *c);
    if (!c) { snprintf(err, err_len, "out of memory"); return NULL; }
    c->model = m;
    c->params = p ? *p : kvb_ctx_default_params();
    const kvb_config *cfg = &m->cfg;
    if (c->params.n_ctx <= 0) c->params.n_ctx = cfg->n_ctx_train;
    if (c->params.n_batch <= 0) c->params.n_batch = 512;
    kvb_mem_init(&c->mem);
    c->be = c->params.share_backend ? c->params.share_backend
                                    : kvb_backend_create(c->params.backend, c->params.n_threads, err, err_len);
    if (!c->be) goto fail;
    /* the activations and the KV store live in the backend's device tier: allocate them where it allocates */
    kvb_mem_set_allocator(&c->mem, c->be->allocator);
    /* weights as the backend holds them: the mapped file on the CPU, f16 copies on a GPU */
    kvb_mem_note(&c->mem, KVB_TIER_DEVICE, KVB_MEM_WEIGHTS,
                 c->be->discrete ? model_f16_bytes(m) : (int64_t)m->weight_bytes);
    /* on a GPU every growth of a head is an allocation, a copy and a free that wait for the device: start
     * with room for the context the caller asked for (a method's retain shrinks it to its budget), or 4096
     * tokens when it left the size to the model */
    int64_t cap0 = 256;
    if (c->be->discrete) cap0 = p && p->n_ctx > 0 ? c->params.n_ctx : (c->params.n_ctx < 4096 ? c->params.n_ctx : 4096);
    if (p && p->kv_reserve > cap0) cap0 = p->kv_reserve;
    c->kv = kvc_create(cfg->n_layer, cfg->n_head_kv, cfg->head_dim, c->params.kv_dtype, cap0, c->be, &c->mem, err,
                       err_len);
    if (!c->kv) goto fail;
    c->prof = prof_create(cfg->n_layer, c->params.profile || c->params.trace, c->params.trace);
    if (c->be->sync) prof_set_sync(c->prof, be_sync_quiet, c->be);
    int64_t B = c->params.n_batch, kv_dim = (int64_t)cfg->n_head_kv * cfg->head_dim;
    c->x = alloc_f32(c, B * cfg->n_embd);
    c->xn = alloc_f32(c, B * cfg->n_embd);
    c->q = alloc_f32(c, B * cfg->n_embd);
    c->att = alloc_f32(c, B * cfg->n_embd);
    c->k = alloc_f32(c, B * kv_dim);
    c->v = alloc_f32(c, B * kv_dim);
    c->ffn_g = alloc_f32(c, B * cfg->n_ff);
    c->ffn_u = alloc_f32(c, B * cfg->n_ff);
    c->logits_d = alloc_f32(c, cfg->n_vocab);
    c->pos_d = kvb_mem_alloc(&c->mem, KVB_TIER_DEVICE, KVB_MEM_WORKSPACE, (size_t)B * sizeof(int32_t));
    c->rounds_d = kvb_mem_alloc(&c->mem, KVB_TIER_DEVICE, KVB_MEM_WORKSPACE, (size_t)B * sizeof(int32_t));
    c->logits = calloc((size_t)cfg->n_vocab, sizeof *c->logits);
    c->pos = calloc((size_t)B, sizeof *c->pos);
    c->rounds = calloc((size_t)B, sizeof *c->rounds);
    c->hk = calloc((size_t)cfg->n_head_kv, sizeof *c->hk);
    c->hv = calloc((size_t)cfg->n_head_kv, sizeof *c->hv);
    c->hpos = calloc((size_t)cfg->n_head_kv, sizeof *c->hpos);
    c->hn = calloc((size_t)cfg->n_head_kv, sizeof *c->hn);
    c->hidx = calloc((size_t)cfg->n_head_kv, sizeof *c->hidx);
    c->hnidx = calloc((size_t)cfg->n_head_kv, sizeof *c->hnidx);
    c->src = calloc((size_t)cfg->n_head_kv, sizeof *c->src);
    c->dec_attended = calloc((size_t)cfg->n_layer, sizeof *c->dec_attended);
    c->in_prefill = 1;
    if (!c->hidx || !c->hnidx || !c->src || !c->dec_attended) {
        snprintf(err, err_len, "out of memory allocating activations");
        goto fail;
    }
    if (!c->x || !c->xn || !c->q || !c->att || !c->k || !c->v || !c->ffn_g || !c->ffn_u || !c->logits || !c->pos || !c->rounds ||
        !c->logits_d || !c->pos_d || !c->rounds_d ||
        !c->hk || !c->hv || !c->hpos || !c->hn) {
        snprintf(err, err_len, "out of memory allocating activations");
        goto fail;
    }
    return c;
fail:
    kvb_ctx_free(c);
    return NULL;
}

void kvb_ctx_free(kvb_ctx *c) {
    if (!c) return;
    const kvb_config *cfg = &c->model->cfg;
    int64_t B = c->params.n_batch, kv_dim = (int64_t)cfg->n_head_kv * cfg->head_dim;
    size_t f = sizeof(float);
    kvb_mem_free(&c->mem, KVB_TIER_DEVICE, KVB_MEM_WORKSPACE, c->x, (size_t)(B * cfg->n_embd) * f);
    kvb_mem_free(&c->mem, KVB_TIER_DEVICE, KVB_MEM_WORKSPACE, c->xn, (size_t)(B * cfg->n_embd) * f);
    kvb_mem_free(&c->mem, KVB_TIER_DEVICE, KVB_MEM_WORKSPACE, c->q, (size_t)(B * cfg->n_embd) * f);
    kvb_mem_free(&c->mem, KVB_TIER_DEVICE, KVB_MEM_WORKSPACE, c->att, (size_t)(B * cfg->n_embd) * f);
    kvb_mem_free(&c->mem, KVB_TIER_DEVICE, KVB_MEM_WORKSPACE, c->k, (size_t)(B * kv_dim) * f);
    kvb_mem_free(&c->mem, KVB_TIER_DEVICE, KVB_MEM_WORKSPACE, c->v, (size_t)(B * kv_dim) * f);
    kvb_mem_free(&c->mem, KVB_TIER_DEVICE, KVB_MEM_WORKSPACE, c->ffn_g, (size_t)(B * cfg->n_ff) * f);
    kvb_mem_free(&c->mem, KVB_TIER_DEVICE, KVB_MEM_WORKSPACE, c->ffn_u, (size_t)(B * cfg->n_ff) * f);
    kvb_mem_free(&c->mem, KVB_TIER_DEVICE, KVB_MEM_WORKSPACE, c->logits_d, (size_t)cfg->n_vocab * f);
    kvb_mem_free(&c->mem, KVB_TIER_DEVICE, KVB_MEM_WORKSPACE, c->pos_d, (size_t)B * sizeof(int32_t));
    kvb_mem_free(&c->mem, KVB_TIER_DEVICE, KVB_MEM_WORKSPACE, c->rounds_d, (size_t)B * sizeof(int32_t));
    free(c->logits);
    free(c->pos);
    free(c->rounds);
    free(c->hk);
    free(c->hv);
    free(c->hpos);
    free(c->hn);
    free(c->hidx);
    free(c->hnidx);
    free(c->src);
    free(c->dec_attended);
    kvb_mem_free(&c->mem, KVB_TIER_DEVICE, KVB_MEM_METHOD, c->probs, c->probs_bytes);
    if (c->obs_q) {
        int W = c->obs_cap;
        kvb_mem_free(&c->mem, KVB_TIER_DEVICE, KVB_MEM_METHOD, c->obs_q,
                     (size_t)cfg->n_layer * W * cfg->n_embd * sizeof(float));
        kvb_mem_free(&c->mem, KVB_TIER_DEVICE, KVB_MEM_METHOD, c->obs_pos, (size_t)W * sizeof(int32_t));
    }
    kvc_free(c->kv);
    prof_free(c->prof);
    if (!c->params.share_backend) kvb_backend_free(c->be);
    free(c);
}

void kvb_ctx_reset(kvb_ctx *c) {
    kvc_clear(c->kv);
    c->n_past = 0;
    c->cur_round = 0;
    c->in_prefill = 1;
    c->obs_n = 0;
    c->dec_calls = 0;
    memset(c->dec_attended, 0, (size_t)c->model->cfg.n_layer * sizeof *c->dec_attended);
}

kvb_ctx *kvb_ctx_fork(const kvb_ctx *c, int obs_window, char *err, size_t err_len) {
    kvb_ctx_params p = c->params;
    p.share_backend = c->be; /* same threads: forks run one after another, never at the same time */
    kvb_ctx *d = kvb_ctx_create(c->model, &p, err, err_len);
    if (!d) return NULL;
    kvc_store *kv = kvc_fork(c->kv, &d->mem);
    if (!kv) {
        kvb_ctx_free(d);
        snprintf(err, err_len, "out of memory copying the KV store");
        return NULL;
    }
    kvc_free(d->kv);
    d->kv = kv;
    if (obs_window > 0) {
        kvb_hooks none = {0};
        none.obs_window = obs_window;
        if (kvb_ctx_set_hooks(d, &none, err, err_len)) {
            kvb_ctx_free(d);
            return NULL;
        }
        d->hooks = NULL;
        const int64_t D = c->model->cfg.n_embd;
        int keep = c->obs_q ? (c->obs_n < obs_window ? c->obs_n : obs_window) : 0;
        for (int l = 0; l < c->model->cfg.n_layer && keep; l++)
            if (dev_copy(c->be, d->obs_q + (size_t)l * obs_window * D,
                         c->obs_q + ((size_t)l * c->obs_cap + (c->obs_n - keep)) * D, (size_t)keep * D * sizeof(float),
                         err, err_len)) {
                kvb_ctx_free(d);
                return NULL;
            }
        if (keep && dev_copy(c->be, d->obs_pos, c->obs_pos + (c->obs_n - keep), (size_t)keep * sizeof(int32_t), err,
                             err_len)) {
            kvb_ctx_free(d);
            return NULL;
        }
        d->obs_n = keep;
    }
    d->n_past = c->n_past;
    d->cur_round = c->cur_round;
    memcpy(d->logits, c->logits, (size_t)c->model->cfg.n_vocab * sizeof(float));
    return d;
}

int kvb_ctx_set_hooks(kvb_ctx *c, const kvb_hooks *h, char *err, size_t err_len) {
    const kvb_config *cfg = &c->model->cfg;
    if (c->in_prefill != 1) return ERR("method hooks must be installed before the end of prefill");
    if (c->obs_q && h && h->obs_window > c->obs_cap)
        return ERR("method needs an observation window of %d rows, the shared prefill kept %d", h->obs_window, c->obs_cap);
    if (!c->obs_q && c->n_past && h && h->obs_window > 0)
        return ERR("method needs an observation window, but the context was prefilled without one");
    c->hooks = h;
    if (h && h->obs_window > 0 && !c->obs_q) {
        size_t bytes = (size_t)cfg->n_layer * h->obs_window * cfg->n_embd * sizeof(float);
        c->obs_q = kvb_mem_alloc(&c->mem, KVB_TIER_DEVICE, KVB_MEM_METHOD, bytes);
        c->obs_pos = kvb_mem_alloc(&c->mem, KVB_TIER_DEVICE, KVB_MEM_METHOD, (size_t)h->obs_window * sizeof(int32_t));
        c->obs_cap = h->obs_window;
        if (!c->obs_q || !c->obs_pos) return ERR("out of memory allocating the observation window");
    }
    return 0;
}

int kvb_ctx_end_prefill(kvb_ctx *c, char *err, size_t err_len) {
    if (!c->in_prefill) return 0;
    c->in_prefill = 0;
    if (c->hooks && c->hooks->after_prefill) {
        kvb_traffic t0 = c->be->traffic;
        prof_begin(c->prof, PROF_SELECT, -1);
        int rc = c->hooks->after_prefill(c->hooks->self, c, err, err_len);
        prof_end(c->prof, PROF_SELECT, -1, c->n_past, 0);
        count_copies(c, &t0);
        if (rc) return -1;
    }
    return 0;
}

int kvb_ctx_begin_round(kvb_ctx *c, int32_t round, int is_question, char *err, size_t err_len) {
    if (round < c->cur_round) return ERR("round %d begins after round %d: rounds must not go back", round, c->cur_round);
    c->cur_round = round;
    if (c->hooks && c->hooks->on_round) return c->hooks->on_round(c->hooks->self, c, round, is_question, err, err_len);
    return 0;
}

double kvb_ctx_mean_attended(const kvb_ctx *c, int layer) {
    return c->dec_calls > 0 ? c->dec_attended[layer] / (double)c->dec_calls : 0.0;
}

/* The observation window keeps the newest obs_window query rows per layer, oldest first. At the start of a
 * chunk the positions advance (obs_begin); each layer then shifts its rows the same way (obs_push). */
static int obs_begin(kvb_ctx *c, int64_t n, char *err, size_t err_len) {
    const int W = c->obs_cap;
    int have = c->obs_n;
    int take = (int)(n < W ? n : W);
    int keep = have + take > W ? W - take : have;
    c->obs_have = have;
    c->obs_n = keep + take;
    if (keep < have && dev_copy(c->be, c->obs_pos, c->obs_pos + (have - keep), (size_t)keep * sizeof(int32_t), err, err_len))
        return -1;
    return dev_copy(c->be, c->obs_pos + keep, c->pos_d + (n - take), (size_t)take * sizeof(int32_t), err, err_len);
}

static int obs_push(kvb_ctx *c, int l, const float *q, int64_t n, char *err, size_t err_len) {
    const int W = c->obs_cap;
    const int64_t D = c->model->cfg.n_embd;
    float *rows = c->obs_q + (size_t)l * W * D;
    int have = c->obs_have, take = (int)(n < W ? n : W);
    int keep = have + take > W ? W - take : have;
    if (keep < have && dev_copy(c->be, rows, rows + (size_t)(have - keep) * D, (size_t)keep * D * sizeof(float), err, err_len))
        return -1;
    return dev_copy(c->be, rows + (size_t)keep * D, q + (n - take) * D, (size_t)take * D * sizeof(float), err, err_len);
}

static int ensure_probs(kvb_ctx *c, size_t bytes) {
    if (bytes <= c->probs_bytes) return 0;
    size_t nb = bytes + bytes / 4;
    float *p = kvb_mem_alloc(&c->mem, KVB_TIER_DEVICE, KVB_MEM_METHOD, nb);
    if (!p) return -1;
    kvb_mem_free(&c->mem, KVB_TIER_DEVICE, KVB_MEM_METHOD, c->probs, c->probs_bytes);
    c->probs = p;
    c->probs_bytes = nb;
    return 0;
}

/* One layer's attention: sources from the store, the method's hooks, the op. */
static int attention_layer(kvb_ctx *c, int l, int64_t n, char *err, size_t err_len) {
    const kvb_config *cfg = &c->model->cfg;
    const kvb_hooks *H = c->hooks;
    kvb_backend *be = c->be;
    prof *P = c->prof;
    const int HK = cfg->n_head_kv;
    for (int h = 0; h < HK; h++) {
        kvc_view hv = kvc_head_view(c->kv, l, h);
        kvb_src s = {hv.k, hv.v, hv.pos, hv.n, NULL, 0};
        c->src[h] = s;
    }
    /* The only memory host code may read here is the host tier (pinned), whose new rows of any layer the device's
     * KV writer may still be writing: while the store holds host-tier rows, wait for it before a hook or the
     * observer runs. Device-tier work needs no wait (the hooks' ops queue behind it on the same stream, and a
     * hook that copies device data down waits for its own copy), so a method whose heads are all on the device
     * decodes without a sync per layer, as full attention does. */
    if (((H && kvc_used_bytes(c->kv, KVB_TIER_HOST) > 0) || c->on_visible) && be_sync(be, err, err_len)) return -1;
    if (H && (H->pre_attend || H->select)) {
        prof_begin(P, PROF_SELECT, l);
        if (H->pre_attend && H->pre_attend(H->self, c, l, c->q, n, err, err_len)) return -1;
        if (H->select && H->select(H->self, c, l, c->src, n, err, err_len)) return -1;
        prof_end(P, PROF_SELECT, l, n, 0);
    }
    if (c->on_visible) c->on_visible(c->on_visible_user, c, l, c->src, n);
    int any_idx = 0;
    int64_t longest = 0;
    double visible = 0;
    for (int h = 0; h < HK; h++) {
        const kvb_src *s = &c->src[h];
        c->hk[h] = s->k;
        c->hv[h] = s->v;
        c->hpos[h] = s->pos;
        c->hn[h] = s->n;
        c->hidx[h] = s->idx;
        c->hnidx[h] = s->idx ? s->n_idx : 0;
        any_idx |= s->idx != NULL;
        int64_t len = s->idx ? s->n_idx : s->n;
        if (len > longest) longest = len;
        visible += (double)len;
    }
    if (!c->in_prefill) c->dec_attended[l] += visible / HK;

    prof_begin(P, PROF_ATTN_FORWARD, l);
    kvb_attn_args a = {0};
    a.n_q = n;
    a.n_head = cfg->n_head;
    a.n_head_kv = HK;
    a.head_dim = cfg->head_dim;
    a.q = c->q;
    a.q_pos = c->pos_d;
    a.kv_dtype = c->params.kv_dtype;
    a.k = c->hk;
    a.v = c->hv;
    a.k_pos = c->hpos;
    a.n_kv = c->hn;
    a.idx = any_idx ? c->hidx : NULL;
    a.n_idx = any_idx ? c->hnidx : NULL;
    a.scale = 1.0f / sqrtf((float)cfg->head_dim);
    a.out = c->att;
    int want = H && H->observe && H->wants_probs && H->wants_probs(H->self, c, l, n);
    if (want) {
        int64_t stride = longest > 0 ? longest : 1;
        if (ensure_probs(c, (size_t)cfg->n_head * n * stride * sizeof(float)))
            return ERR("out of memory for attention probabilities (%lld queries x %lld keys)", (long long)n,
                       (long long)stride);
        a.probs = c->probs;
        a.probs_stride = stride;
    }
    int handled = 0;
    if (H && H->attend) {
        handled = H->attend(H->self, c, l, &a, err, err_len);
        if (handled < 0) return -1;
    }
    if (!handled && be->attention(be, &a, err, err_len)) return -1;
    if (want && be_sync(be, err, err_len)) return -1;
    if (want && H->observe(H->self, c, l, c->src, a.probs, a.probs_stride, n, err, err_len)) return -1;
    prof_end(P, PROF_ATTN_FORWARD, l, n, 0);
    return 0;
}

/* The activation observer sees a host copy of device rows. */
static void tap(kvb_ctx *c, const char *name, int layer, const float *data, int64_t n_rows, int64_t row_len) {
    if (!c->tap) return;
    size_t bytes = (size_t)(n_rows * row_len) * sizeof(float);
    float *host = malloc(bytes ? bytes : 1);
    char err[8];
    if (host && !c->be->copy(c->be, host, data, bytes, KVB_COPY_D2H, err, sizeof err) && !be_sync(c->be, NULL, 0))
        c->tap(c->tap_user, name, layer, host, n_rows, row_len);
    free(host);
}

/* One chunk of n tokens (n <= n_batch) at positions n_past..n_past+n-1. */
/* k matmuls over one input: the backend's fused op when it has one (the same results) */
static int matmul_n(kvb_backend *be, int k, float *const *out, const kvb_weight *const *w, const float *x, int64_t n) {
    if (be->matmul_n) return be->matmul_n(be, k, out, w, x, n);
    for (int i = 0; i < k; i++)
        if (be->matmul(be, out[i], w[i], x, n)) return -1;
    return 0;
}

/* forward_chunk's return when the logits hold NaN or Inf (err not yet written) */
enum { FORWARD_NON_FINITE = -2 };

/* Index of the first NaN or Inf in x[0..n), or -1. */
static int64_t first_non_finite(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return i;
    return -1;
}

static int forward_chunk(kvb_ctx *c, const int32_t *ids, int64_t n, char *err, size_t err_len) {
    const kvb_model *m = c->model;
    const kvb_config *cfg = &m->cfg;
    kvb_backend *be = c->be;
    prof *P = c->prof;
    const int64_t D = cfg->n_embd, kv_dim = (int64_t)cfg->n_head_kv * cfg->head_dim;
    for (int64_t t = 0; t < n; t++) {
        c->pos[t] = (int32_t)(c->n_past + t);
        c->rounds[t] = c->cur_round;
    }
    if (be->copy(be, c->pos_d, c->pos, (size_t)n * sizeof(int32_t), KVB_COPY_H2D, err, err_len) ||
        be->copy(be, c->rounds_d, c->rounds, (size_t)n * sizeof(int32_t), KVB_COPY_H2D, err, err_len))
        return -1;
    if (c->obs_q && obs_begin(c, n, err, err_len)) return -1;

    prof_begin(P, PROF_EMBED, -1);
    be->get_rows(be, c->x, &m->tok_embd, ids, n);
    prof_end(P, PROF_EMBED, -1, n, 0);

    for (int l = 0; l < cfg->n_layer; l++) {
        const kvb_layer *L = &m->layers[l];

        prof_begin(P, PROF_CALC_QKV_AND_ROPE, l);
        be->rmsnorm(be, c->xn, c->x, L->attn_norm, D, n, cfg->rms_eps);
        tap(c, "attn_norm", l, c->xn, n, D);
        float *qkv[3] = {c->q, c->k, c->v};
        const kvb_weight *wqkv[3] = {&L->wq, &L->wk, &L->wv};
        if (matmul_n(be, 3, qkv, wqkv, c->xn, n)) return ERR("matmul failed in layer %d: %s", l, be->error);
        if (L->bq) {
            be->add_bias(be, c->q, L->bq, D, n);
            be->add_bias(be, c->k, L->bk, kv_dim, n);
            be->add_bias(be, c->v, L->bv, kv_dim, n);
        }
        if (be->rope_qk) {
            be->rope_qk(be, c->q, cfg->n_head, c->k, cfg->n_head_kv, n, cfg->head_dim, cfg->n_rot, c->pos_d,
                        cfg->rope_freq_base, cfg->rope_neox);
        } else {
            be->rope(be, c->q, n, cfg->n_head, cfg->head_dim, cfg->n_rot, c->pos_d, cfg->rope_freq_base, cfg->rope_neox);
            be->rope(be, c->k, n, cfg->n_head_kv, cfg->head_dim, cfg->n_rot, c->pos_d, cfg->rope_freq_base, cfg->rope_neox);
        }
        prof_end(P, PROF_CALC_QKV_AND_ROPE, l, n, 0);
        tap(c, "Qcur", l, c->q, n, D);
        tap(c, "Kcur", l, c->k, n, kv_dim);
        tap(c, "Vcur", l, c->v, n, kv_dim);

        if (c->obs_q && obs_push(c, l, c->q, n, err, err_len)) return -1;

        prof_begin(P, PROF_UPDATE_CACHE, l);
        if (kvc_append(c->kv, l, n, c->k, c->v, c->pos_d, c->rounds_d, err, err_len)) return -1;
        prof_end(P, PROF_UPDATE_CACHE, l, n, 0);

        if (attention_layer(c, l, n, err, err_len)) return -1;
        tap(c, "kqv_out", l, c->att, n, D);

        prof_begin(P, PROF_ATTN_OUTPUT, l);
        if (be->matmul(be, c->xn, &L->wo, c->att, n)) return ERR("matmul failed in layer %d: %s", l, be->error);
        tap(c, "attn_out", l, c->xn, n, D);
        if (be->add_rmsnorm) { /* the residual add and the MLP's norm in one op (the norm counts as attn_output) */
            be->add_rmsnorm(be, c->x, c->xn, c->xn, L->ffn_norm, D, n, cfg->rms_eps);
            tap(c, "ffn_inp", l, c->x, n, D);
            prof_end(P, PROF_ATTN_OUTPUT, l, n, 0);
            prof_begin(P, PROF_MLP, l);
        } else {
            be->add(be, c->x, c->x, c->xn, n * D);
            tap(c, "ffn_inp", l, c->x, n, D);
            prof_end(P, PROF_ATTN_OUTPUT, l, n, 0);
            prof_begin(P, PROF_MLP, l);
            be->rmsnorm(be, c->xn, c->x, L->ffn_norm, D, n, cfg->rms_eps);
        }
        tap(c, "ffn_norm", l, c->xn, n, D);
        float *gu[2] = {c->ffn_g, c->ffn_u};
        const kvb_weight *wgu[2] = {&L->w_gate, &L->w_up};
        if (matmul_n(be, 2, gu, wgu, c->xn, n)) return ERR("matmul failed in layer %d: %s", l, be->error);
        tap(c, "ffn_gate", l, c->ffn_g, n, cfg->n_ff);
        tap(c, "ffn_up", l, c->ffn_u, n, cfg->n_ff);
        be->swiglu(be, c->ffn_g, c->ffn_g, c->ffn_u, n * cfg->n_ff);
        tap(c, "ffn_swiglu", l, c->ffn_g, n, cfg->n_ff);
        if (be->matmul(be, c->xn, &L->w_down, c->ffn_g, n)) return ERR("matmul failed in layer %d: %s", l, be->error);
        tap(c, "ffn_out", l, c->xn, n, D);
        be->add(be, c->x, c->x, c->xn, n * D);
        tap(c, "l_out", l, c->x, n, D);
        prof_end(P, PROF_MLP, l, n, 0);
    }

    prof_begin(P, PROF_LM_HEAD, -1);
    const float *last = c->x + (n - 1) * D;
    be->rmsnorm(be, c->xn, last, m->output_norm, D, 1, cfg->rms_eps);
    tap(c, "result_norm", -1, c->xn, 1, D);
    if (be->matmul(be, c->logits_d, &m->output, c->xn, 1)) return ERR("matmul failed in the output layer: %s", be->error);
    if (be->copy(be, c->logits, c->logits_d, (size_t)cfg->n_vocab * sizeof(float), KVB_COPY_D2H, err, err_len) ||
        be_sync(be, err, err_len))
        return -1;
    tap(c, "result_output", -1, c->logits_d, 1, cfg->n_vocab);
    prof_end(P, PROF_LM_HEAD, -1, 1, 0);
    /* a NaN weight or activation makes every logit NaN, which sampling would read as some token (often end of
     * generation): stop here instead; kvb_forward says where it began */
    if (first_non_finite(c->logits, cfg->n_vocab) >= 0) return FORWARD_NON_FINITE;
    c->n_past += n;
    if (!c->in_prefill) c->dec_calls++;
    return 0;
}

/* The first activation of a forward pass that holds NaN or Inf (llama.cpp's graph name and layer, -1 outside
 * the layers), found by the activation observer. */
typedef struct {
    const char *name;
    int layer;
} non_finite_site;

static void non_finite_tap(void *user, const char *name, int layer, const float *x, int64_t n_rows, int64_t row_len) {
    non_finite_site *s = user;
    if (!s->name && first_non_finite(x, n_rows * row_len) >= 0) {
        s->name = name;
        s->layer = layer;
    }
}

/* The chunk ids[0..n) gave non-finite logits: find the first non-finite activation by running the chunk again
 * on a copy of the context whose KV store is cut back to before it, with an observer that checks every
 * activation (only now: the normal path checks the logits alone), and write the one-line error. */
static int report_non_finite(kvb_ctx *c, const int32_t *ids, int64_t n, char *err, size_t err_len) {
    const kvb_config *cfg = &c->model->cfg;
    int64_t n_bad = 0;
    for (int64_t i = 0; i < cfg->n_vocab; i++) n_bad += !isfinite(c->logits[i]);
    non_finite_site site = {NULL, -1};
    char sub[256];
    kvb_ctx *d = kvb_ctx_fork(c, 0, sub, sizeof sub);
    if (d) {
        int cut_failed = 0; /* the chunk's rows are each head's last n (appended at the end) */
        for (int l = 0; l < cfg->n_layer && !cut_failed; l++)
            for (int h = 0; h < cfg->n_head_kv && !cut_failed; h++) {
                int64_t k = kvc_n(d->kv, l, h);
                cut_failed = k >= n ? kvc_truncate(d->kv, l, h, k - n, sub, sizeof sub) : 0;
            }
        if (!cut_failed) {
            d->tap = non_finite_tap;
            d->tap_user = &site;
            forward_chunk(d, ids, n, sub, sizeof sub);
        }
        kvb_ctx_free(d);
    }
    char where[96] = "";
    if (site.name && site.layer >= 0) snprintf(where, sizeof where, "; the first is in layer %d (%s)", site.layer, site.name);
    else if (site.name) snprintf(where, sizeof where, "; the first is in the output layer (%s)", site.name);
    return ERR("the logits after position %lld are not finite (%lld of %d are NaN or Inf)%s: the model's weights "
               "or activations hold NaN or Inf", (long long)(c->n_past + n - 1), (long long)n_bad, cfg->n_vocab, where);
}

int kvb_forward(kvb_ctx *c, const int32_t *ids, int64_t n, char *err, size_t err_len) {
    if (n <= 0) return ERR("no tokens to process");
    if (c->n_past + n > c->params.n_ctx)
        return ERR("context overflow: %lld tokens past + %lld new > context size %d", (long long)c->n_past,
                   (long long)n, c->params.n_ctx);
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->model->cfg.n_vocab)
            return ERR("token id %d out of range (vocabulary %d)", ids[i], c->model->cfg.n_vocab);
    prof_set_stage(c->prof, n > 1 ? PROF_PREFILL : PROF_DECODE);
    c->be->gemm = kvb_ctx_gemm(&c->params); /* set per call: forks and shared backends may differ */
    kvb_traffic t0 = c->be->traffic;
    int rc = 0;
    for (int64_t done = 0; done < n && !rc;) {
        int64_t chunk = n - done < c->params.n_batch ? n - done : c->params.n_batch;
        rc = forward_chunk(c, ids + done, chunk, err, err_len);
        if (rc == FORWARD_NON_FINITE) rc = report_non_finite(c, ids + done, chunk, err, err_len);
        done += chunk;
    }
    count_copies(c, &t0);
    return rc;
}
