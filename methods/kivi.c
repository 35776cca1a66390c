/* kivi.c — KIVI (Liu et al. 2024, "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache"): the KV
 * cache in 2, 4 or 8 bits, keys per channel and values per token, with the most recent tokens in full precision.
 *
 * Equations (paper §3, Algorithm 1). A group X of G values is stored as codes Q(X) = round((X - z) / s) with
 * z = min X, s = (max X - z) / (2^B - 1), and read back as X' = Q(X) s + z, so |X - X'| <= s/2. Keys are grouped
 * per channel (G consecutive tokens of one channel: the paper's outlier channels get their own ranges), values
 * per token (G consecutive channels of one token). Attention runs over [quantized tokens, dequantized] +
 * [residual tokens, full precision] with one exact softmax over both: the store's residual part by the normal
 * attention op (its log-sum-exp kept), the quantized part and the merge by the attention_quant op.
 *
 * Choices (flags): bits=2 (also 4 and 8; bits=16 = no quantization: full attention token for token),
 * group=32 (G; a multiple of 8 dividing head_dim), residual=128 (R, >= 1). Prefill is exact, then the prompt's
 * KV is quantized as KIVI does after its prefill.
 *
 * When tokens leave the residual (where this differs from the reference implementation, jy-yuan/KIVI
 * models/llama_kivi.py). The reference keeps two residuals: keys are quantized R tokens at a time when their
 * residual reaches R (after the step's logits; the prompt keeps n mod R keys), values one token at a time once
 * more than R are held (the prompt keeps R). A store slot holds a token's K and V together, so here one
 * residual serves both: once it holds R + G tokens, its oldest tokens are quantized in whole groups of G
 * (before the layer's attention), so R <= residual < R + G after every step and the prompt keeps
 * R + (n - R) mod G when n >= R + G (all n otherwise). At attention this keeps R .. R + G - 1 tokens in full
 * precision where the reference keeps 1 .. R keys and R + 1 values: more full-precision keys, as many values
 * give or take G. The codes are packed in bytes with f16 scale and minimum per group as in the reference (its
 * fp16 scale and mn); the minimum is rounded down and the scale up to f16 so the bound above still holds after
 * rounding. The reference runs only without GQA; here a KV head's quantized rows serve its whole group of query
 * heads. The CPU attention_quant runs three threaded passes (kernels/cpu/kvquant.c); decode on the default model
 * at 8000 tokens is still about 2x full's step time (72.6 against 37.9 ms/token: the two passes over the
 * quantized tokens dequantize every K and V group per step).
 *
 * Memory. Quantized tokens leave the store (kvc_retain_dev): the store holds the residual, and the packed codes
 * with their scales live in method-owned device buffers counted in extra_device_bytes: per quantized token and
 * KV head 2 x head_dim x (B/8 + 4/G) bytes (K and V) against the full slot's K + V rows, position and round.
 * expected_tokens is the residual (the store's claim, checked per layer by kvb_method_verify); formula_frac is the
 * quantized size, checked against the measured device bytes. KIVI takes no token budget: its memory is set by
 * bits, group and residual, so a budget given is reported, not imposed, and the measured Mem% is its size.
 * Quantized tokens are the store's oldest slots, positions pos0 = 0 onwards (one sequence; nothing else
 * evicts). They are read by every decode step: fidelity's recall counts them (read_outside); the engine's
 * "tokens attended" statistic sees the store's sources only, the residual.
 *
 * Hybrid models (Gemma 3's sliding-window local layers; docs/methods.md "Hybrid models"): a local layer keeps its
 * window in full precision (the engine runs no hook there); the global layers are quantized as above, and the
 * memory formula counts the windows on both sides. */
#include "methods/method.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint8_t *p;         /* group records (device) */
    int64_t n, cap;     /* bytes used, allocated */
} qbuf;

typedef struct {
    kvb_method base;
    kvb_ctx *c;
    int64_t bits, group, residual;
    size_t rec_bytes;   /* one group's record: kvb_quant_group_bytes(group, bits) */
    qbuf *kq, *vq;      /* [n_layer][n_head_kv]: K in per-channel groups, V in per-token groups */
    int64_t *n_quant;   /* [n_layer] tokens quantized per KV head */
    int32_t *idx;       /* device [residual + group]: slots kept by kvc_retain_dev */
    float *lse;         /* device [n_head][lse_rows]: the store part's log-sum-exp */
    int64_t lse_rows;
    const void **kp, **vp; /* host [n_head_kv]: one layer's buffers for attention_quant */
} kivi;

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

/* Tokens quantized per head once n have been seen: whole groups leave the residual when it holds R + G. */
static int64_t quant_count(const kivi *s, int64_t n) {
    if (s->bits == 16 || n < s->residual + s->group) return 0;
    return (n - s->residual) / s->group * s->group;
}

/* Room for `more` bytes in a buffer (device; grown by a quarter). */
static int qbuf_reserve(kivi *s, qbuf *q, int64_t more, char *err, size_t err_len) {
    if (q->n + more <= q->cap) return 0;
    int64_t cap = q->cap + q->cap / 4 + 64 * (int64_t)s->rec_bytes;
    if (cap < q->n + more) cap = q->n + more;
    uint8_t *p = kvb_mem_alloc(&s->c->mem, KVB_TIER_DEVICE, KVB_MEM_KV, (size_t)cap);
    if (!p) return ERR("kivi: out of memory for quantized KV");
    if (q->n && s->c->be->copy(s->c->be, p, q->p, (size_t)q->n, KVB_COPY_D2D, err, err_len)) {
        kvb_mem_free(&s->c->mem, KVB_TIER_DEVICE, KVB_MEM_KV, p, (size_t)cap);
        return -1;
    }
    kvb_mem_free(&s->c->mem, KVB_TIER_DEVICE, KVB_MEM_KV, q->p, (size_t)q->cap);
    q->p = p;
    q->cap = cap;
    return 0;
}

/* Quantize the oldest tokens of every KV head of a layer that the residual rule lets go, and drop them from the
 * store. */
static int flush(kivi *s, kvb_ctx *c, int l, char *err, size_t err_len) {
    const kvb_config *cfg = &c->model->cfg;
    const int HK = cfg->n_head_kv, D = cfg->head_dim, G = (int)s->group, B = (int)s->bits;
    const int64_t held = kvc_n(c->kv, l, 0), f = quant_count(s, s->n_quant[l] + held) - s->n_quant[l];
    if (f <= 0) return 0;
    const int64_t bytes = f * D / G * (int64_t)s->rec_bytes; /* per head, K and V alike */
    if (c->be->iota(c->be, s->idx, (int32_t)f, held - f, err, err_len)) return -1;
    for (int h = 0; h < HK; h++) {
        qbuf *kq = &s->kq[(size_t)l * HK + h], *vq = &s->vq[(size_t)l * HK + h];
        if (kvc_n(c->kv, l, h) != held) return ERR("kivi: layer %d heads hold different token counts", l);
        kvc_view v = kvc_head_view(c->kv, l, h);
        if (qbuf_reserve(s, kq, bytes, err, err_len) || qbuf_reserve(s, vq, bytes, err, err_len) ||
            c->be->quant_groups(c->be, kq->p + kq->n, v.k, v.dtype, f, D, G, B, 1, err, err_len) ||
            c->be->quant_groups(c->be, vq->p + vq->n, v.v, v.dtype, f, D, G, B, 0, err, err_len) ||
            kvc_retain_dev(c->kv, l, h, s->idx, held - f, err, err_len))
            return -1;
        kq->n += bytes;
        vq->n += bytes;
    }
    s->n_quant[l] += f;
    s->base.extra_device_bytes += 2 * bytes * HK;
    return 0;
}

static int kivi_after_prefill(void *self, kvb_ctx *c, char *err, size_t err_len) {
    kivi *s = self;
    if (s->bits == 16) return 0; /* no quantization: full attention */
    s->base.n_prompt = c->n_past;
    for (int l = 0; l < c->model->cfg.n_layer; l++) /* a local layer keeps its window in full precision */
        if (!kvb_layer_window(&c->model->cfg, l) && flush(s, c, l, err, err_len)) return -1;
    return 0;
}

static int kivi_select(void *self, kvb_ctx *c, int layer, kvb_src *src, int64_t n_q, char *err, size_t err_len) {
    kivi *s = self;
    if (c->in_prefill || s->bits == 16) return 0;
    if (flush(s, c, layer, err, err_len)) return -1;
    kvb_src_from_store(c, layer, src); /* the store may have moved */
    return 0;
}

static int kivi_attend(void *self, kvb_ctx *c, int layer, kvb_attn_args *a, char *err, size_t err_len) {
    kivi *s = self;
    if (c->in_prefill || s->bits == 16 || s->n_quant[layer] == 0) return 0;
    kvb_backend *be = c->be;
    const int H = c->model->cfg.n_head, HK = c->model->cfg.n_head_kv;
    if (a->n_q > s->lse_rows) {
        kvb_method_release(c, s->lse, (size_t)H * s->lse_rows * sizeof(float));
        s->lse_rows = a->n_q;
        if (!(s->lse = kvb_method_alloc(c, (size_t)H * s->lse_rows * sizeof(float)))) {
            s->lse_rows = 0;
            return ERR("kivi: out of memory");
        }
    }
    for (int g = 0; g < HK; g++) {
        s->kp[g] = s->kq[(size_t)layer * HK + g].p;
        s->vp[g] = s->vq[(size_t)layer * HK + g].p;
    }
    kvb_quant_kv q = {s->kp, s->vp, s->n_quant[layer], 0, (int)s->group, (int)s->bits};
    a->lse = s->lse;
    int rc = be->attention(be, a, err, err_len) || be->attention_quant(be, a, &q, err, err_len);
    a->lse = NULL;
    return rc ? -1 : 1;
}

static int64_t kivi_read_outside(kvb_method *m, kvb_ctx *c, int layer) { return ((kivi *)m)->n_quant[layer]; }

static int64_t kivi_expected(kvb_method *m, kvb_ctx *c, int layer) {
    return c->n_past - quant_count((kivi *)m, c->n_past);
}

/* The quantized size: residual slots in full, quantized tokens as K and V group records, of the cache the model
 * holds (a local layer: its window in full on both sides). */
static double kivi_formula(kvb_method *m, kvb_ctx *c) {
    kivi *s = (kivi *)m;
    const kvb_config *cfg = &c->model->cfg;
    const int64_t n = c->n_past, nq = quant_count(s, n), D = cfg->head_dim;
    const double slot = (double)kvc_slot_bytes(c->kv);
    const double global = (double)(n - nq) * slot + 2.0 * (double)(nq * D / s->group) * (double)s->rec_bytes;
    double held = 0, whole = 0;
    for (int l = 0; l < cfg->n_layer; l++) {
        const double full = (double)kvb_ctx_full_tokens(c, l) * slot;
        whole += full;
        held += kvb_layer_window(cfg, l) ? full : global;
    }
    return n && whole > 0 ? held / whole : 1.0;
}

static void kivi_describe(kvb_method *m, char *buf, size_t cap) {
    kivi *s = (kivi *)m;
    snprintf(buf, cap, "bits=%lld group=%lld residual=%lld quantized=%lld", (long long)s->bits, (long long)s->group,
             (long long)s->residual, (long long)quant_count(s, m->n_prompt));
}

static void kivi_destroy(kvb_method *m) {
    kivi *s = (kivi *)m;
    const kvb_config *cfg = &s->c->model->cfg;
    for (int i = 0; (s->kq || s->vq) && i < cfg->n_layer * cfg->n_head_kv; i++) {
        if (s->kq) kvb_mem_free(&s->c->mem, KVB_TIER_DEVICE, KVB_MEM_KV, s->kq[i].p, (size_t)s->kq[i].cap);
        if (s->vq) kvb_mem_free(&s->c->mem, KVB_TIER_DEVICE, KVB_MEM_KV, s->vq[i].p, (size_t)s->vq[i].cap);
    }
    kvb_method_release(s->c, s->idx, (size_t)(s->residual + s->group) * sizeof(int32_t));
    kvb_method_release(s->c, s->lse, (size_t)cfg->n_head * s->lse_rows * sizeof(float));
    free(s->kq), free(s->vq), free(s->n_quant), free(s->kp), free(s->vp);
    free(s);
}

static int read_opts(kivi *s, const kvb_config *cfg, kvb_opts *o, char *err, size_t err_len) {
    if (kvb_opts_int(o, "bits", &s->bits, err, err_len) < 0 || kvb_opts_int(o, "group", &s->group, err, err_len) < 0 ||
        kvb_opts_int(o, "residual", &s->residual, err, err_len) < 0)
        return -1;
    if (s->bits != 2 && s->bits != 4 && s->bits != 8 && s->bits != 16) return ERR("kivi: bits must be 2, 4, 8 or 16");
    if (s->group < 8 || s->group % 8 || s->group > 1024) return ERR("kivi: group must be a multiple of 8 in [8, 1024]");
    if (s->bits != 16 && cfg->head_dim % s->group)
        return ERR("kivi: group %lld does not divide head_dim %d", (long long)s->group, cfg->head_dim);
    if (s->residual < 1 || s->residual > INT32_MAX / 2) return ERR("kivi: residual must be >= 1");
    return 0;
}

static kvb_method *kivi_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len) {
    const kvb_config *cfg = &c->model->cfg;
    kivi *s = calloc(1, sizeof *s);
    if (!s) { ERR("out of memory"); return NULL; }
    s->c = c;
    s->bits = 2;
    s->group = 32;
    s->residual = 128;
    if (read_opts(s, cfg, o, err, err_len)) goto fail;
    s->rec_bytes = kvb_quant_group_bytes((int)s->group, s->bits == 16 ? 8 : (int)s->bits);
    const size_t heads = (size_t)cfg->n_layer * cfg->n_head_kv;
    s->kq = calloc(heads, sizeof *s->kq);
    s->vq = calloc(heads, sizeof *s->vq);
    s->n_quant = calloc((size_t)cfg->n_layer, sizeof *s->n_quant);
    s->kp = calloc((size_t)cfg->n_head_kv, sizeof *s->kp);
    s->vp = calloc((size_t)cfg->n_head_kv, sizeof *s->vp);
    s->idx = kvb_method_alloc(c, (size_t)(s->residual + s->group) * sizeof(int32_t));
    if (!s->kq || !s->vq || !s->n_quant || !s->kp || !s->vp || !s->idx) { ERR("out of memory"); goto fail; }
    s->base.budget = *b;
    s->base.imposes_budget = 0;
    snprintf(s->base.note, sizeof s->base.note, "KV in %lld bits (no token budget): Mem%% is the measured size",
             (long long)s->bits);
    return &s->base;
fail:
    kivi_destroy(&s->base);
    return NULL;
}

const kvb_method_def kvb_method_kivi = {
    .name = "kivi",
    .summary = "KIVI: keys per channel, values per token in 2/4/8 bits, recent tokens in full",
    .traits = KVB_SHARES_PREFILL,
    .create = kivi_create,
    .hooks = {.select = kivi_select, .attend = kivi_attend, .after_prefill = kivi_after_prefill},
    .expected_tokens = kivi_expected,
    .formula_frac = kivi_formula,
    .read_outside = kivi_read_outside,
    .describe = kivi_describe,
    .destroy = kivi_destroy,
};
