/* model_load.c — a model's weights bound from its GGUF file (or generated: synthetic:<shape>), by name.
 *
 * The tensors of each architecture are llama.cpp's (its load_arch_tensors): the same names and shapes, optional
 * where it makes them optional. Every tensor of the file must be bound by some role: one that none takes (an
 * attention sink, an output bias, a second set of RoPE factors) would change the math if llama.cpp used it, so
 * it is refused with one line naming it, as llama.cpp refuses a file with tensors it did not load. */
#include "engine/model.h"
#include "engine/synthetic.h"

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
    {"gemma-3-270m", "gemma-3-270m-q4_k_m.gguf"},
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

/* The file being bound and which of its tensors have a role. */
typedef struct {
    const gguf_file *f;
    unsigned char *used; /* [n_tensors] */
    char *err;
    size_t err_len;
} binder;

/* Bind a weight matrix of the expected shape [cols, rows]. */
static int bind_matrix(binder *b, const char *name, int64_t cols, int64_t rows, kvb_weight *w) {
    char *err = b->err;
    size_t err_len = b->err_len;
    const gguf_tensor *t = gguf_find_tensor(b->f, name);
    if (!t) return ERR("missing tensor '%s'", name);
    b->used[t - b->f->tensors] = 1;
    if ((int64_t)t->ne[0] != cols || (int64_t)t->ne[1] != rows || t->ne[2] != 1 || t->ne[3] != 1)
        return ERR("tensor '%s' has shape [%llu, %llu], expected [%lld, %lld]", name, (unsigned long long)t->ne[0],
                   (unsigned long long)t->ne[1], (long long)cols, (long long)rows);
    w->data = t->data;
    w->type = t->type;
    w->rows = rows;
    w->cols = cols;
    return 0;
}

/* Bind an F32 vector of n elements; absent is an error when required, else *out = NULL. */
static int bind_vector(binder *b, const char *name, int64_t n, int required, const float **out) {
    char *err = b->err;
    size_t err_len = b->err_len;
    const gguf_tensor *t = gguf_find_tensor(b->f, name);
    *out = NULL;
    if (!t) return required ? ERR("missing tensor '%s'", name) : 0;
    b->used[t - b->f->tensors] = 1;
    if (t->type != GGML_T_F32) return ERR("tensor '%s' must be F32, found %s", name, ggml_type_name(t->type));
    if ((int64_t)t->ne[0] != n || t->n_dims != 1) return ERR("tensor '%s' must have %lld elements", name, (long long)n);
    if (((uintptr_t)t->data) % sizeof(float)) return ERR("tensor '%s' is misaligned", name);
    *out = t->data;
    return 0;
}

static int bind_layer(binder *b, const kvb_config *c, int l, kvb_layer *L) {
    const int64_t kv_dim = (int64_t)c->n_head_kv * c->head_dim, E = c->n_embd, Q = c->q_dim;
    char n[96];
#define NAME(s) (snprintf(n, sizeof n, "blk.%d.%s", l, s), n)
    if (bind_vector(b, NAME("attn_norm.weight"), E, 1, &L->attn_norm) ||
        bind_vector(b, NAME("ffn_norm.weight"), E, 1, &L->ffn_norm) ||
        bind_matrix(b, NAME("attn_q.weight"), E, Q, &L->wq) || bind_matrix(b, NAME("attn_k.weight"), E, kv_dim, &L->wk) ||
        bind_matrix(b, NAME("attn_v.weight"), E, kv_dim, &L->wv) ||
        bind_matrix(b, NAME("attn_output.weight"), Q, E, &L->wo) ||
        bind_matrix(b, NAME("ffn_gate.weight"), E, c->n_ff, &L->w_gate) ||
        bind_matrix(b, NAME("ffn_up.weight"), E, c->n_ff, &L->w_up) ||
        bind_matrix(b, NAME("ffn_down.weight"), c->n_ff, E, &L->w_down))
        return -1;
    if (c->has_qkv_bias &&
        (bind_vector(b, NAME("attn_q.bias"), Q, 1, &L->bq) || bind_vector(b, NAME("attn_k.bias"), kv_dim, 1, &L->bk) ||
         bind_vector(b, NAME("attn_v.bias"), kv_dim, 1, &L->bv)))
        return -1;
    if (c->qk_norm && (bind_vector(b, NAME("attn_q_norm.weight"), c->head_dim, 1, &L->q_norm) ||
                       bind_vector(b, NAME("attn_k_norm.weight"), c->head_dim, 1, &L->k_norm)))
        return -1;
    if (c->post_norms && (bind_vector(b, NAME("post_attention_norm.weight"), E, 1, &L->attn_post_norm) ||
                          bind_vector(b, NAME("post_ffw_norm.weight"), E, 1, &L->ffn_post_norm)))
        return -1;
#undef NAME
    return 0;
}

kvb_model *kvb_model_load(const char *path, char *err, size_t err_len) {
    kvb_model *m = calloc(1, sizeof *m);
    if (!m) { snprintf(err, err_len, "out of memory"); return NULL; }
    snprintf(m->path, sizeof m->path, "%s", path);
    binder b = {NULL, NULL, err, err_len};
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
    b.f = f;
    b.used = calloc(f->n_tensors ? f->n_tensors : 1, 1);
    if (!b.used) {
        snprintf(err, err_len, "out of memory");
        goto fail;
    }
    const gguf_tensor *emb = gguf_find_tensor(f, "token_embd.weight");
    if (!emb) {
        snprintf(err, err_len, "missing tensor 'token_embd.weight'");
        goto fail;
    }
    if (emb->ne[1] > (1u << 24)) { /* the tokenizer's own bound; n_vocab is an int */
        snprintf(err, err_len, "%s: tensor 'token_embd.weight' has %llu rows, more than the %d tokens a vocabulary may "
                 "have", path, (unsigned long long)emb->ne[1], 1 << 24);
        goto fail;
    }
    m->cfg.n_vocab = (int)emb->ne[1];
    if (bind_matrix(&b, "token_embd.weight", c->n_embd, c->n_vocab, &m->tok_embd)) goto fail;
    if (gguf_find_tensor(f, "output.weight")) {
        if (bind_matrix(&b, "output.weight", c->n_embd, c->n_vocab, &m->output)) goto fail;
    } else {
        m->output = m->tok_embd;
        m->cfg.tied_output = 1;
    }
    if (bind_vector(&b, "output_norm.weight", c->n_embd, 1, &m->output_norm)) goto fail;
    /* Llama 3.1+: one divisor per rotated pair (llama.cpp: llama arch only; elsewhere the tensor stays unbound and
     * is refused below) */
    if (!strcmp(c->arch, "llama") && bind_vector(&b, "rope_freqs.weight", c->n_rot / 2, 0, &m->rope_freqs)) goto fail;
    m->layers = calloc((size_t)c->n_layer, sizeof *m->layers);
    if (!m->layers) {
        snprintf(err, err_len, "out of memory");
        goto fail;
    }
    for (int l = 0; l < c->n_layer; l++)
        if (bind_layer(&b, c, l, &m->layers[l])) goto fail;
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (!b.used[i]) {
            char shown[128];
            snprintf(err, err_len, "%s: tensor '%s' is not implemented for %s (it may change the math; kvbench refuses "
                     "rather than ignore it)", path, gguf_str_safe(f->tensors[i].name, shown, sizeof shown), c->arch);
            goto fail;
        }
    free(b.used);
    b.used = NULL;
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
    free(b.used);
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
