/* batch.c — one decode step over many contexts (batch.h): the layer of forward_chunk (engine/model.c) with the
 * matmuls, norms and RoPE over the step's B rows, and each sequence's cache update and attention in between. */
#include "engine/batch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/forward.h"

#define ERR(...) (snprintf(err, err_len, __VA_ARGS__), -1)

struct kvb_batch {
    kvb_model *model;
    kvb_backend *be;
    kvb_mem mem;
    int cap;
    /* device rows [cap][...]: the step's activations, as a context's are for a prefill chunk */
    float *x, *xn, *q, *k, *v, *att, *ffn_g, *ffn_u, *logits_d;
    int32_t *pos_d;
    int32_t *pos; /* host */
};

/* the workspace's arrays with their row widths, walked by create and free alike */
static void arrays(kvb_batch *b, float ***p, int64_t *w) {
    const kvb_config *cfg = &b->model->cfg;
    const int64_t kv_dim = (int64_t)cfg->n_head_kv * cfg->head_dim;
    float **ptr[9] = {&b->x, &b->xn, &b->q, &b->att, &b->k, &b->v, &b->ffn_g, &b->ffn_u, &b->logits_d};
    int64_t wid[9] = {cfg->n_embd, cfg->n_embd, cfg->q_dim, cfg->q_dim, kv_dim, kv_dim, cfg->n_ff, cfg->n_ff, cfg->n_vocab};
    memcpy(p, ptr, sizeof ptr);
    memcpy(w, wid, sizeof wid);
}

kvb_batch *kvb_batch_create(kvb_model *m, kvb_backend *be, int cap, char *err, size_t err_len) {
    if (!m || !be || cap <= 0) {
        snprintf(err, err_len, "batch: a model, a backend and a size of at least 1 are needed (size %d)", cap);
        return NULL;
    }
    kvb_batch *b = calloc(1, sizeof *b);
    if (!b) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    b->model = m;
    b->be = be;
    b->cap = cap;
    kvb_mem_init(&b->mem);
    kvb_mem_set_allocator(&b->mem, be->allocator);
    float **p[9];
    int64_t w[9];
    arrays(b, p, w);
    int ok = 1;
    for (int i = 0; i < 9; i++)
        ok &= (*p[i] = kvb_mem_alloc(&b->mem, KVB_TIER_DEVICE, KVB_MEM_WORKSPACE, (size_t)(w[i] * cap) * sizeof(float))) != NULL;
    b->pos_d = kvb_mem_alloc(&b->mem, KVB_TIER_DEVICE, KVB_MEM_WORKSPACE, (size_t)cap * sizeof(int32_t));
    b->pos = calloc((size_t)cap, sizeof *b->pos);
    if (!ok || !b->pos_d || !b->pos) {
        snprintf(err, err_len, "out of memory allocating a batch of %d sequences", cap);
        kvb_batch_free(b);
        return NULL;
    }
    return b;
}

void kvb_batch_free(kvb_batch *b) {
    if (!b) return;
    float **p[9];
    int64_t w[9];
    arrays(b, p, w);
    for (int i = 0; i < 9; i++)
        kvb_mem_free(&b->mem, KVB_TIER_DEVICE, KVB_MEM_WORKSPACE, *p[i], (size_t)(w[i] * b->cap) * sizeof(float));
    kvb_mem_free(&b->mem, KVB_TIER_DEVICE, KVB_MEM_WORKSPACE, b->pos_d, (size_t)b->cap * sizeof(int32_t));
    free(b->pos);
    kvb_mem_destroy(&b->mem);
    free(b);
}

int kvb_batch_cap(const kvb_batch *b) { return b->cap; }

int64_t kvb_batch_bytes(const kvb_batch *b) {
    return kvb_mem_current((kvb_mem *)&b->mem, KVB_TIER_DEVICE, KVB_MEM_WORKSPACE);
}

/* Everything about the step that can be wrong before it starts, so a refused step changes no context. */
static int check_step(const kvb_batch *b, kvb_ctx *const *cs, const int32_t *ids, int n, char *err, size_t err_len) {
    if (n <= 0 || n > b->cap) return ERR("batch: %d sequences in a step (1 to %d)", n, b->cap);
    char sub[256];
    for (int i = 0; i < n; i++) {
        if (!cs[i]) return ERR("batch: sequence %d has no context", i);
        if (cs[i]->model != b->model) return ERR("batch: sequence %d runs another model", i);
        if (cs[i]->be != b->be) return ERR("batch: sequence %d runs on another backend (share the batch's)", i);
        if (kvb_fwd_check(cs[i], ids[i], sub, sizeof sub)) return ERR("batch: sequence %d: %s", i, sub);
        for (int j = 0; j < i; j++)
            if (cs[j] == cs[i]) return ERR("batch: sequences %d and %d are the same context", j, i);
    }
    return 0;
}

int kvb_batch_decode(kvb_batch *b, kvb_ctx *const *cs, const int32_t *ids, int n, char *err, size_t err_len) {
    if (check_step(b, cs, ids, n, err, err_len)) return -1;
    const kvb_model *m = b->model;
    const kvb_config *cfg = &m->cfg;
    kvb_backend *be = b->be;
    const int64_t D = cfg->n_embd, QD = cfg->q_dim, KVD = (int64_t)cfg->n_head_kv * cfg->head_dim;
    char sub[512];
#define SEQ_FAIL(i) ERR("batch: sequence %d: %s", (i), sub)
    /* one token decodes on the integer matmul (kernels/cpu/gemm.h): so must every row of the step (batch.h) */
    be->gemm = KVB_GEMM_INT8;
    for (int i = 0; i < n; i++) {
        if (kvb_fwd_seq_begin(cs[i], sub, sizeof sub)) return SEQ_FAIL(i);
        b->pos[i] = (int32_t)cs[i]->n_past;
    }
    if (be->copy(be, b->pos_d, b->pos, (size_t)n * sizeof(int32_t), KVB_COPY_H2D, err, err_len)) return -1;

    be->get_rows(be, b->x, &m->tok_embd, ids, n);
    if (cfg->embd_scale != 0.0f) be->scale(be, b->x, cfg->embd_scale, n * D);
    int normed = 0; /* b->xn holds this layer's attn_norm already (fused into the previous layer's residual add) */
    for (int l = 0; l < cfg->n_layer; l++) {
        const kvb_layer *L = &m->layers[l];
        if (!normed) be->rmsnorm(be, b->xn, b->x, L->attn_norm, D, n, cfg->rms_eps);
        float *qkv[3] = {b->q, b->k, b->v};
        const kvb_weight *wqkv[3] = {&L->wq, &L->wk, &L->wv};
        if (kvb_fwd_matmul_n(be, 3, qkv, wqkv, b->xn, n)) return ERR("matmul failed in layer %d: %s", l, be->error);
        if (L->bq) {
            be->add_bias(be, b->q, L->bq, QD, n);
            be->add_bias(be, b->k, L->bk, KVD, n);
            be->add_bias(be, b->v, L->bv, KVD, n);
        }
        kvb_fwd_qk_norm_rope(m, be, l, b->q, b->k, b->pos_d, n);
        for (int i = 0; i < n; i++)
            if (kvb_fwd_seq_attend(cs[i], l, b->q + i * QD, b->k + i * KVD, b->v + i * KVD, b->att + i * QD, sub,
                                   sizeof sub))
                return SEQ_FAIL(i);
        if (be->matmul(be, b->xn, &L->wo, b->att, n)) return ERR("matmul failed in layer %d: %s", l, be->error);
        if (L->attn_post_norm) be->rmsnorm(be, b->xn, b->xn, L->attn_post_norm, D, n, cfg->rms_eps);
        if (be->add_rmsnorm) {
            be->add_rmsnorm(be, b->x, b->xn, b->xn, L->ffn_norm, D, n, cfg->rms_eps);
        } else {
            be->add(be, b->x, b->x, b->xn, n * D);
            be->rmsnorm(be, b->xn, b->x, L->ffn_norm, D, n, cfg->rms_eps);
        }
        float *gu[2] = {b->ffn_g, b->ffn_u};
        const kvb_weight *wgu[2] = {&L->w_gate, &L->w_up};
        if (kvb_fwd_matmul_n(be, 2, gu, wgu, b->xn, n)) return ERR("matmul failed in layer %d: %s", l, be->error);
        if (cfg->ffn_act == KVB_FFN_GEGLU) be->geglu(be, b->ffn_g, b->ffn_g, b->ffn_u, n * cfg->n_ff);
        else be->swiglu(be, b->ffn_g, b->ffn_g, b->ffn_u, n * cfg->n_ff);
        if (be->matmul(be, b->xn, &L->w_down, b->ffn_g, n)) return ERR("matmul failed in layer %d: %s", l, be->error);
        if (L->ffn_post_norm) be->rmsnorm(be, b->xn, b->xn, L->ffn_post_norm, D, n, cfg->rms_eps);
        /* the residual add with the next norm (the next layer's, or the output norm) in one op where fused */
        const float *next_norm = l + 1 < cfg->n_layer ? m->layers[l + 1].attn_norm : m->output_norm;
        normed = be->add_rmsnorm != NULL;
        if (normed) be->add_rmsnorm(be, b->x, b->xn, b->xn, next_norm, D, n, cfg->rms_eps);
        else be->add(be, b->x, b->x, b->xn, n * D);
    }
    if (!normed) be->rmsnorm(be, b->xn, b->x, m->output_norm, D, n, cfg->rms_eps);
    if (be->matmul(be, b->logits_d, &m->output, b->xn, n)) return ERR("matmul failed in the output layer: %s", be->error);
    const size_t row_bytes = (size_t)cfg->n_vocab * sizeof(float);
    for (int i = 0; i < n; i++)
        if (be->copy(be, cs[i]->logits, b->logits_d + (size_t)i * cfg->n_vocab, row_bytes, KVB_COPY_D2H, err, err_len))
            return -1;
    if (be->sync && be->sync(be)) return ERR("%s", be->error);
    for (int i = 0; i < n; i++)
        if (kvb_fwd_seq_end(cs[i], ids[i], sub, sizeof sub)) return SEQ_FAIL(i);
#undef SEQ_FAIL
    return 0;
}
