/* helpers.c — what method files share: errors, top-k and sorting of indices, attention probabilities of
 * given queries, store views, method allocations and the packed device copy of offloading methods. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/topk.h"
#include "methods/method.h"

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

void kvb_sort_i32(int32_t *v, int64_t n) { qsort(v, (size_t)n, sizeof *v, cmp_i32); }

int kvb_topk_ascending(const float *score, int64_t n, int64_t k, int32_t *out) {
    kvb_topk_slots(score, n, k, out); /* k clamped to [0, n] */
    return 0;
}

void kvb_src_from_store(const kvb_ctx *c, int layer, kvb_src *src) {
    for (int h = 0; h < c->model->cfg.n_head_kv; h++) {
        kvc_view v = kvc_head_view(c->kv, layer, h);
        kvb_src s = {v.k, v.v, v.pos, v.n, NULL, 0};
        src[h] = s;
    }
}

int64_t kvb_cur_len(const kvb_ctx *c, int64_t n_q) { return (int64_t)c->pos[n_q - 1] + 1; }

int64_t kvb_kept_then_decoded(const kvb_method *m, const kvb_ctx *c, int64_t keep) {
    if (c->in_prefill) return c->n_past;
    return (keep < m->n_prompt ? keep : m->n_prompt) + (c->n_past - m->n_prompt);
}

void *kvb_method_alloc(kvb_ctx *c, size_t bytes) {
    return kvb_mem_alloc(&c->mem, KVB_TIER_DEVICE, KVB_MEM_METHOD, bytes);
}

void kvb_method_release(kvb_ctx *c, void *p, size_t bytes) {
    kvb_mem_free(&c->mem, KVB_TIER_DEVICE, KVB_MEM_METHOD, p, bytes);
}

int kvb_attn_probs(kvb_ctx *c, int layer, const float *q, const int32_t *q_pos, int64_t n_q, const kvb_src *src,
                   float **probs, int64_t *stride, float *lse, char *err, size_t err_len) {
    return kvb_attn_probs_scaled(c, layer, q, q_pos, n_q, src, c->model->cfg.attn_scale, probs, stride, lse, err,
                                 err_len);
}

int kvb_attn_probs_scaled(kvb_ctx *c, int layer, const float *q, const int32_t *q_pos, int64_t n_q,
                          const kvb_src *src, float scale, float **probs, int64_t *stride, float *lse, char *err,
                          size_t err_len) {
    const kvb_config *cfg = &c->model->cfg;
    const int HK = cfg->n_head_kv;
    kvb_src *own = NULL;
    if (!src) {
        own = calloc((size_t)HK, sizeof *own);
        if (!own) return ERR("out of memory");
        kvb_src_from_store(c, layer, own);
        src = own;
    }
    const void **k = calloc((size_t)HK, sizeof *k), **v = calloc((size_t)HK, sizeof *v);
    const int32_t **pos = calloc((size_t)HK, sizeof *pos), **idx = calloc((size_t)HK, sizeof *idx);
    int64_t *n = calloc((size_t)HK, sizeof *n), *nidx = calloc((size_t)HK, sizeof *nidx);
    size_t out_bytes = (size_t)n_q * cfg->n_head * cfg->head_dim * sizeof(float);
    float *out = kvb_method_alloc(c, out_bytes);
    int rc = -1, any_idx = 0;
    int64_t longest = 1;
    *probs = NULL;
    if (!k || !v || !pos || !idx || !n || !nidx || !out) { ERR("out of memory"); goto done; }
    for (int h = 0; h < HK; h++) {
        k[h] = src[h].k;
        v[h] = src[h].v;
        pos[h] = src[h].pos;
        n[h] = src[h].n;
        idx[h] = src[h].idx;
        nidx[h] = src[h].idx ? src[h].n_idx : 0;
        any_idx |= src[h].idx != NULL;
        int64_t len = src[h].idx ? src[h].n_idx : src[h].n;
        if (len > longest) longest = len;
    }
    *probs = kvb_method_alloc(c, (size_t)cfg->n_head * n_q * longest * sizeof(float));
    if (!*probs) { ERR("out of memory for %lld x %lld attention probabilities", (long long)n_q, (long long)longest); goto done; }
    kvb_attn_args a = {0};
    a.n_q = n_q;
    a.n_head = cfg->n_head;
    a.n_head_kv = HK;
    a.head_dim = cfg->head_dim;
    a.q = q;
    a.q_pos = q_pos;
    a.kv_dtype = c->params.kv_dtype;
    a.k = k;
    a.v = v;
    a.k_pos = pos;
    a.n_kv = n;
    a.idx = any_idx ? idx : NULL;
    a.n_idx = any_idx ? nidx : NULL;
    a.scale = scale;
    a.out = out;
    a.probs = *probs;
    a.probs_stride = longest;
    a.lse = lse;
    rc = c->be->attention(c->be, &a, err, err_len);
    *stride = longest;
done:
    if (rc) {
        kvb_attn_probs_free(c, *probs, n_q, longest);
        *probs = NULL;
    }
    free(own);
    free(k);
    free(v);
    free(pos);
    free(idx);
    free(n);
    free(nidx);
    kvb_method_release(c, out, out_bytes);
    return rc;
}

void kvb_attn_probs_free(kvb_ctx *c, float *probs, int64_t n_q, int64_t stride) {
    kvb_method_release(c, probs, (size_t)c->model->cfg.n_head * n_q * stride * sizeof(float));
}
int kvb_vis_attend_packed(kvb_method *m, kvb_ctx *c, int layer, kvb_src *src, int64_t n_q, char *err, size_t err_len) {
    /* the chunk's rows are still in the activations: store them on the device beside the packed load */
    if (kvc_append(m->vis, layer, n_q, c->k, c->v, c->pos_d, c->rounds_d, err, err_len)) return -1;
    for (int h = 0; h < c->model->cfg.n_head_kv; h++) {
        kvc_view v = kvc_head_view(m->vis, layer, h);
        kvb_src x = {v.k, v.v, v.pos, v.n, NULL, 0};
        src[h] = x;
    }
    return 0;
}

int kvb_score_row_fit(kvb_ctx *c, kvb_score_row *a, int64_t n, char *err, size_t err_len) {
    if (n <= a->cap) return 0;
    int64_t cap = n + n / 4 + 64;
    float *v = kvb_method_alloc(c, (size_t)cap * sizeof(float));
    if (!v) return ERR("out of memory for %lld attention scores", (long long)cap);
    if (a->n && c->be->copy(c->be, v, a->v, (size_t)a->n * sizeof(float), KVB_COPY_D2D, err, err_len)) {
        kvb_method_release(c, v, (size_t)cap * sizeof(float));
        return -1;
    }
    kvb_method_release(c, a->v, (size_t)a->cap * sizeof(float));
    a->v = v;
    a->cap = cap;
    return 0;
}

/* a grown to n slots, the new ones 0 */
static int score_row_grow(kvb_ctx *c, kvb_score_row *a, int64_t n, char *err, size_t err_len) {
    if (kvb_score_row_fit(c, a, n, err, err_len)) return -1;
    if (n > a->n && c->be->zero(c->be, a->v + a->n, (size_t)(n - a->n) * sizeof(float), err, err_len)) return -1;
    a->n = n;
    return 0;
}

int kvb_score_rows_for_sums(kvb_ctx *c, kvb_score_row *rows, const kvb_src *src, float **out, char *err, size_t err_len) {
    for (int g = 0; g < c->model->cfg.n_head_kv; g++) {
        if (score_row_grow(c, &rows[g], src[g].n, err, err_len)) return -1;
        out[g] = rows[g].v;
    }
    return 1;
}

int kvb_score_row_add(kvb_ctx *c, kvb_score_row *a, const float *probs, int64_t stride, int g, int64_t n_q, int64_t n,
                      char *err, size_t err_len) {
    kvb_backend *be = c->be;
    const int G = c->model->cfg.n_head / c->model->cfg.n_head_kv;
    if (score_row_grow(c, a, n, err, err_len)) return -1;
    /* the group's G query heads are rows g*G.. of probs: reduce them as a one-KV-head layer */
    return be->probs_reduce(be, a->v, n, probs + (int64_t)g * G * n_q * stride, stride, G, 1, n_q, n, NULL,
                            KVB_REDUCE_GROUP_SUM, 1, err, err_len);
}

void kvb_score_row_free(kvb_ctx *c, kvb_score_row *a) {
    kvb_method_release(c, a->v, (size_t)a->cap * sizeof(float));
    *a = (kvb_score_row){0};
}
