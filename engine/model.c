/* model.c — the inference context and the forward pass (weights: model_load.c; architectures: arch.c).
 *
 * The forward pass follows llama.cpp's graph for each architecture (forward_chunk spells the layer out) so that
 * token ids and logits agree with it. The phases carry the names of Round Attention's latency decomposition
 * (calc_qkv_and_rope, update_cache, attn_forward, attn_output, mlp), which are also the profiler's and NVTX's
 * names. Sliding-window layers (Gemma 3's local layers, Mistral) attend over their window through the
 * attention_window op, and their KV store holds only the window: after each step (a prefill chunk or a decode
 * token) a local layer drops the slots older than the newest query's window (trim_window), so its bytes are W
 * tokens per KV head however long the context. Method hooks do not run on local layers (a method works on the
 * global layers; docs/methods.md "Hybrid models"). */
#include "engine/model.h"
#include "engine/forward.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ERR(...) (snprintf(err, err_len, __VA_ARGS__), -1)

/* 1 when layer l attends over the sliding window only */
static int is_local(const kvb_config *cfg, int l) { return cfg->n_swa > 0 && cfg->swa_layer[l]; }

int kvb_layer_window(const kvb_config *cfg, int l) { return is_local(cfg, l) ? cfg->n_swa : 0; }

int64_t kvb_full_tokens_at(const kvb_config *cfg, int l, int64_t n_past) {
    return is_local(cfg, l) && n_past > cfg->n_swa ? cfg->n_swa : n_past;
}

int64_t kvb_ctx_full_tokens(const kvb_ctx *c, int l) { return kvb_full_tokens_at(&c->model->cfg, l, c->n_past); }

/* After a step whose newest query is at position p, a local layer keeps positions p-W+1..p: the next step's
 * queries (p+1..) need p-W+2.. of them, and the one older slot keeps the held count at W. Its slots are in
 * position order (appended, and no method touches a local layer), so the oldest are its first slots. */
static int trim_window(kvb_ctx *c, int l, int64_t newest_pos, char *err, size_t err_len) {
    const int64_t W = c->model->cfg.n_swa, keep = newest_pos + 1 < W ? newest_pos + 1 : W;
    for (int h = 0; h < c->model->cfg.n_head_kv; h++) {
        int64_t n = kvc_n(c->kv, l, h);
        if (n > keep && kvc_drop_front(c->kv, l, h, n - keep, err, err_len)) return -1;
    }
    return 0;
}

/* Layer l's RoPE: the model's (scaled where its GGUF says so, with the rope_freqs divisors), or on a Gemma 3 local
 * layer its own base and no interpolation (llama.cpp's get_rope_freq_base/scale for SWA layers). */
static kvb_rope_params layer_rope(const kvb_model *m, int l) {
    const kvb_config *cfg = &m->cfg;
    kvb_rope_params r = cfg->rope;
    r.freq_factors = m->rope_freqs;
    if (cfg->post_norms && is_local(cfg, l)) { /* gemma3 */
        r.freq_base = cfg->rope_freq_base_swa;
        r.freq_scale = 1.0f;
    }
    return r;
}

static int rope_is_plain(const kvb_rope_params *r) {
    return r->freq_scale == 1.0f && r->ext_factor == 0.0f && r->attn_factor == 1.0f && !r->freq_factors;
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

/* The ops a model's architecture needs beyond every model's (backend.h: NULL where a backend lacks one): one line
 * naming the first missing op, so a backend never runs a model it would compute wrongly. */
static int backend_lacks_op(const kvb_model *m, const kvb_backend *be, char *err, size_t err_len) {
    const kvb_config *cfg = &m->cfg;
    int scaled_rope = 0;
    for (int l = 0; l < cfg->n_layer; l++) {
        kvb_rope_params r = layer_rope(m, l);
        scaled_rope |= !rope_is_plain(&r);
    }
    const struct {
        int needed;
        const void *op;
        const char *name, *why;
    } need[] = {
        {scaled_rope, (const void *)be->rope_ext, "rope_ext", "RoPE scaling or rope_freqs"},
        {cfg->ffn_act == KVB_FFN_GEGLU, (const void *)be->geglu, "geglu", "its GeGLU feed-forward"},
        {cfg->embd_scale != 0.0f, (const void *)be->scale, "scale", "its scaled embeddings"},
        {cfg->n_swa > 0, (const void *)be->attention_window, "attention_window", "its sliding-window layers"},
    };
    for (size_t i = 0; i < sizeof need / sizeof *need; i++)
        if (need[i].needed && !need[i].op)
            return ERR("the %s backend lacks the op '%s' that this %s model needs (%s)", be->name, need[i].name,
                       cfg->arch, need[i].why);
    return 0;
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
    if (backend_lacks_op(m, c->be, err, err_len)) goto fail;
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
    c->q = alloc_f32(c, B * cfg->q_dim);
    c->att = alloc_f32(c, B * cfg->q_dim);
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
    c->ending_layer = -1;
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
    kvb_mem_free(&c->mem, KVB_TIER_DEVICE, KVB_MEM_WORKSPACE, c->q, (size_t)(B * cfg->q_dim) * f);
    kvb_mem_free(&c->mem, KVB_TIER_DEVICE, KVB_MEM_WORKSPACE, c->att, (size_t)(B * cfg->q_dim) * f);
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
    free(c->tokens);
    kvb_mem_free(&c->mem, KVB_TIER_DEVICE, KVB_MEM_METHOD, c->probs, c->probs_bytes);
    kvb_mem_free(&c->mem, KVB_TIER_DEVICE, KVB_MEM_METHOD, c->lse, c->lse_bytes);
    if (c->obs_q) {
        int W = c->obs_cap;
        kvb_mem_free(&c->mem, KVB_TIER_DEVICE, KVB_MEM_METHOD, c->obs_q,
                     (size_t)cfg->n_layer * W * cfg->q_dim * sizeof(float));
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
    c->tokens_n = 0;
    c->cur_round = 0;
    c->in_prefill = 1;
    c->layer_end_at = 0;
    c->layers_ended = 0;
    c->obs_n = 0;
    c->obs_stopped = 0;
    c->dec_calls = 0;
    memset(c->dec_attended, 0, (size_t)c->model->cfg.n_layer * sizeof *c->dec_attended);
}

/* Record ids[0..n) as the tokens at positions n_past.. (before n_past advances). */
static int remember_tokens(kvb_ctx *c, const int32_t *ids, int64_t n, char *err, size_t err_len) {
    if (c->n_past + n > c->tokens_cap) {
        int64_t cap = (c->n_past + n) * 2;
        int32_t *t = realloc(c->tokens, (size_t)cap * sizeof *t);
        if (!t) return ERR("out of memory recording %lld tokens", (long long)(c->n_past + n));
        c->tokens = t;
        c->tokens_cap = cap;
    }
    for (int64_t i = c->tokens_n; i < c->n_past; i++) c->tokens[i] = -1; /* positions not read by the forward pass */
    memcpy(c->tokens + c->n_past, ids, (size_t)n * sizeof *ids);
    c->tokens_n = c->n_past + n;
    return 0;
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
        const int64_t D = c->model->cfg.q_dim;
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
    if (c->tokens_n > 0 && remember_tokens(d, c->tokens, c->tokens_n, err, err_len)) {
        kvb_ctx_free(d);
        return NULL;
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
        size_t bytes = (size_t)cfg->n_layer * h->obs_window * cfg->q_dim * sizeof(float);
        c->obs_q = kvb_mem_alloc(&c->mem, KVB_TIER_DEVICE, KVB_MEM_METHOD, bytes);
        c->obs_pos = kvb_mem_alloc(&c->mem, KVB_TIER_DEVICE, KVB_MEM_METHOD, (size_t)h->obs_window * sizeof(int32_t));
        c->obs_cap = h->obs_window;
        if (!c->obs_q || !c->obs_pos) return ERR("out of memory allocating the observation window");
    }
    return 0;
}

void kvb_ctx_end_prefill_by_layer(kvb_ctx *c, int64_t n_prompt) { c->layer_end_at = n_prompt; }

void kvb_prefill_layers(const kvb_ctx *c, int *from, int *to) {
    *from = c->ending_layer >= 0 ? c->ending_layer : c->layers_ended;
    *to = c->ending_layer >= 0 ? c->ending_layer + 1 : c->model->cfg.n_layer;
}

/* The prompt's last chunk has passed layer l's attention (kvb_ctx_end_prefill_by_layer): every later layer's input
 * is computed, from the uncompressed cache, so the method ends this layer's prefill now, as it would at the end. */
static int end_prefill_layer(kvb_ctx *c, int l, int64_t n, char *err, size_t err_len) {
    c->layers_ended = l + 1;
    if (is_local(&c->model->cfg, l) || !c->hooks || !c->hooks->after_prefill) return 0; /* a local layer keeps its window */
    const int64_t n_past = c->n_past;
    c->n_past += n; /* the hook sees the whole prompt, as at the end of prefill */
    c->ending_layer = l;
    prof_begin(c->prof, PROF_SELECT, l);
    int rc = c->hooks->after_prefill(c->hooks->self, c, err, err_len);
    prof_end(c->prof, PROF_SELECT, l, n, 0);
    c->ending_layer = -1;
    c->n_past = n_past;
    return rc;
}

int kvb_ctx_end_prefill(kvb_ctx *c, char *err, size_t err_len) {
    if (!c->in_prefill) return 0;
    c->in_prefill = 0;
    c->layer_end_at = 0;
    if (c->hooks && c->hooks->after_prefill) {
        kvb_traffic t0 = c->be->traffic;
        prof_begin(c->prof, PROF_SELECT, -1);
        int rc = c->hooks->after_prefill(c->hooks->self, c, err, err_len);
        prof_end(c->prof, PROF_SELECT, -1, c->n_past, 0);
        count_copies(c, &t0);
        if (rc) return -1;
    }
    /* a window nobody reads after the prefill stops here: a decode step would shift it in every layer (three device
     * copies a layer, memmoves on the CPU) for nothing */
    if (c->obs_q && !(c->hooks && c->hooks->obs_decode) && !c->params.keep_window) {
        c->obs_stopped = 1;
        c->obs_n = 0;
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
 * chunk the positions advance (obs_begin); each layer then shifts its rows the same way (obs_push). It records
 * while it exists and the end of prefill has not stopped it (kvb_ctx_end_prefill). */
static int obs_live(const kvb_ctx *c) { return c->obs_q && !c->obs_stopped; }

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
    const int64_t D = c->model->cfg.q_dim;
    float *rows = c->obs_q + (size_t)l * W * D;
    int have = c->obs_have, take = (int)(n < W ? n : W);
    int keep = have + take > W ? W - take : have;
    if (keep < have && dev_copy(c->be, rows, rows + (size_t)(have - keep) * D, (size_t)keep * D * sizeof(float), err, err_len))
        return -1;
    return dev_copy(c->be, rows + (size_t)keep * D, q + (n - take) * D, (size_t)take * D * sizeof(float), err, err_len);
}

/* The largest probabilities of a call (bytes) that a sum_rows method has written and reduced, where attention_colsum
 * takes over: $KVB_COLSUM_MIB MiB (0: always attention_colsum), default 256. */
static size_t colsum_bytes(void) {
    const char *v = getenv("KVB_COLSUM_MIB"); /* read each call: a test switches it between prefills */
    const long mib = v && *v ? atol(v) : 256;
    return (size_t)(mib > 0 ? mib : 0) << 20;
}

/* *buf (of *cap bytes) grown to hold bytes, a quarter spare (its contents are one call's) */
static int ensure_buf(kvb_ctx *c, float **buf, size_t *cap, size_t bytes) {
    if (bytes <= *cap) return 0;
    size_t nb = bytes + bytes / 4;
    float *p = kvb_mem_alloc(&c->mem, KVB_TIER_DEVICE, KVB_MEM_METHOD, nb);
    if (!p) return -1;
    kvb_mem_free(&c->mem, KVB_TIER_DEVICE, KVB_MEM_METHOD, *buf, *cap);
    *buf = p;
    *cap = nb;
    return 0;
}

/* One layer's attention: sources from the store, the method's hooks, the op (over the window on a local layer). */
static int attention_layer(kvb_ctx *c, int l, int64_t n, char *err, size_t err_len) {
    const kvb_config *cfg = &c->model->cfg;
    /* a local layer keeps its window: the method works on the global layers (a method's own attention too: KIVI
     * quantizes the global layers; PoD forms its layer blocks over the global layers) */
    const kvb_hooks *H = is_local(cfg, l) ? NULL : c->hooks;
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
     * decodes without a sync per layer, as full attention does; so does one whose hooks never read the host tier
     * from host code (no_host_reads: OmniKV's offloaded layers, loaded by device reads in the stream's order). */
    if (((H && !H->no_host_reads && kvc_used_bytes(c->kv, KVB_TIER_HOST) > 0) || c->on_visible) && be_sync(be, err, err_len))
        return -1;
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
    a.scale = cfg->attn_scale;
    a.window = is_local(cfg, l) ? cfg->n_swa : 0;
    a.out = c->att;
    int want = H && H->observe && H->wants_probs && H->wants_probs(H->self, c, l, n);
    if (want) {
        int64_t stride = longest > 0 ? longest : 1;
        if (ensure_buf(c, &c->probs, &c->probs_bytes, (size_t)cfg->n_head * n * stride * sizeof(float)))
            return ERR("out of memory for attention probabilities (%lld queries x %lld keys)", (long long)n,
                       (long long)stride);
        a.probs = c->probs;
        a.probs_stride = stride;
    }
    /* a method that reads only the probabilities' column sums (sum_rows): where the call's probabilities are small
     * they are written and reduced (probs_reduce, the cheaper way on a CPU, which the methods took before); past
     * colsum_bytes (a prefill chunk over a long prompt: 2 GB a layer at 32K on the 8B shapes) attention_colsum adds
     * them from the call's lse without writing them */
    float *sums[KVB_MAX_KV_HEADS];
    int want_sums = 0; /* 1: probabilities reduced, 2: attention_colsum */
    if (!want && H && H->sum_rows) {
        if ((want_sums = H->sum_rows(H->self, c, l, c->src, n, sums, err, err_len)) < 0) return -1;
        const int64_t stride = longest > 0 ? longest : 1;
        const size_t pb = (size_t)cfg->n_head * n * stride * sizeof(float);
        if (want_sums && pb <= colsum_bytes()) {
            if (ensure_buf(c, &c->probs, &c->probs_bytes, pb))
                return ERR("out of memory for attention probabilities (%lld queries x %lld keys)", (long long)n,
                           (long long)stride);
            a.probs = c->probs;
            a.probs_stride = stride;
        } else if (want_sums) {
            if (ensure_buf(c, &c->lse, &c->lse_bytes, (size_t)cfg->n_head * n * sizeof(float)))
                return ERR("out of memory for the attention's log-sum-exp (%lld queries)", (long long)n);
            a.lse = c->lse;
            want_sums = 2;
        }
    }
    int handled = 0;
    if (H && H->attend) {
        handled = H->attend(H->self, c, l, &a, err, err_len);
        if (handled < 0) return -1;
        if (handled && want_sums) return ERR("a method's own attention cannot give the column sums its sum_rows asks for");
    }
    if (!handled && (a.window ? be->attention_window(be, &a, err, err_len) : be->attention(be, &a, err, err_len))) return -1;
    if (want_sums == 2 && be->attention_colsum(be, &a, sums, err, err_len)) return -1;
    for (int g = 0; g < HK && want_sums == 1; g++) { /* each KV head's group of heads, as one KV head's layer */
        const int G = cfg->n_head / HK;
        const int64_t len = c->hidx[g] ? c->hnidx[g] : c->hn[g];
        if (be->probs_reduce(be, sums[g], len, a.probs + (int64_t)g * G * n * a.probs_stride, a.probs_stride, G, 1, n,
                             len, NULL, KVB_REDUCE_GROUP_SUM, 1, err, err_len))
            return -1;
    }
    /* no sync: observe's reads of the probabilities are backend ops on the same stream, and a method that copies
     * something down syncs before it reads it (kernels/backend.h); a sync here drained the GPU every layer of every
     * step for TOVA and H2O */
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

/* Q/K normalisation (qwen3, gemma3: per head, before RoPE) and RoPE of n rows of q and k at positions pos_d
 * (device); tc, when not NULL, is the context whose activation observer sees the normalised rows. */
static void qk_norm_rope_rows(const kvb_model *m, kvb_backend *be, kvb_ctx *tc, int l, float *q, float *k,
                              const int32_t *pos_d, int64_t n) {
    const kvb_config *cfg = &m->cfg;
    const kvb_layer *L = &m->layers[l];
    const int HD = cfg->head_dim;
    if (cfg->qk_norm) {
        be->rmsnorm(be, q, q, L->q_norm, HD, n * cfg->n_head, cfg->rms_eps);
        be->rmsnorm(be, k, k, L->k_norm, HD, n * cfg->n_head_kv, cfg->rms_eps);
        if (tc) {
            tap(tc, "Qcur_normed", l, q, n, cfg->q_dim);
            tap(tc, "Kcur_normed", l, k, n, (int64_t)cfg->n_head_kv * HD);
        }
    }
    const kvb_rope_params r = layer_rope(m, l);
    if (!rope_is_plain(&r)) {
        be->rope_ext(be, q, n, cfg->n_head, HD, cfg->n_rot, pos_d, cfg->rope_neox, &r);
        be->rope_ext(be, k, n, cfg->n_head_kv, HD, cfg->n_rot, pos_d, cfg->rope_neox, &r);
    } else if (be->rope_qk) {
        be->rope_qk(be, q, cfg->n_head, k, cfg->n_head_kv, n, HD, cfg->n_rot, pos_d, r.freq_base, cfg->rope_neox);
    } else {
        be->rope(be, q, n, cfg->n_head, HD, cfg->n_rot, pos_d, r.freq_base, cfg->rope_neox);
        be->rope(be, k, n, cfg->n_head_kv, HD, cfg->n_rot, pos_d, r.freq_base, cfg->rope_neox);
    }
}

static void qk_norm_and_rope(kvb_ctx *c, int l, int64_t n) {
    qk_norm_rope_rows(c->model, c->be, c, l, c->q, c->k, c->pos_d, n);
}

/* One chunk of n tokens (n <= n_batch) at positions n_past..n_past+n-1: per layer (llama.cpp's graphs)
 *   llama, qwen2, qwen3:  x += Wo attn(rope(nq(Wq n(x))), rope(nk(Wk n(x))), Wv n(x));  x += ffn(n'(x))
 *   gemma3:               x += post(Wo attn(...));  x += post'(ffn(n'(x)))       (x0 = embd * sqrt(n_embd))
 * with n, n' RMSNorm, nq/nk the per-head norms (qwen3, gemma3; identity elsewhere), ffn = Wdown (act(Wgate .) *
 * Wup .) with act SiLU or tanh-GELU (gemma3). */
static int forward_chunk(kvb_ctx *c, const int32_t *ids, int64_t n, char *err, size_t err_len) {
    const kvb_model *m = c->model;
    const kvb_config *cfg = &m->cfg;
    kvb_backend *be = c->be;
    prof *P = c->prof;
    const int64_t D = cfg->n_embd, QD = cfg->q_dim, kv_dim = (int64_t)cfg->n_head_kv * cfg->head_dim;
    for (int64_t t = 0; t < n; t++) {
        c->pos[t] = (int32_t)(c->n_past + t);
        c->rounds[t] = c->cur_round;
    }
    /* a one-token decode step: the backend may launch it as one unit (a CUDA graph, kernels/cuda/graph.cu) up to its
     * first wait, the logits' for full attention; not under the activation observer or the profiler, which wait
     * at every step of the way */
    if (n == 1 && !c->in_prefill && !c->tap && !prof_enabled(P) && be->step_begin && be->step_begin(be))
        return ERR("%s", be->error);
    if (be->copy(be, c->pos_d, c->pos, (size_t)n * sizeof(int32_t), KVB_COPY_H2D, err, err_len) ||
        be->copy(be, c->rounds_d, c->rounds, (size_t)n * sizeof(int32_t), KVB_COPY_H2D, err, err_len))
        return -1;
    if (obs_live(c) && obs_begin(c, n, err, err_len)) return -1;

    prof_begin(P, PROF_EMBED, -1);
    be->get_rows(be, c->x, &m->tok_embd, ids, n);
    if (cfg->embd_scale != 0.0f) be->scale(be, c->x, cfg->embd_scale, n * D);
    prof_end(P, PROF_EMBED, -1, n, 0);

    int normed = 0; /* c->xn holds this layer's attn_norm already: the previous layer's residual add took the norm */
    for (int l = 0; l < cfg->n_layer; l++) {
        const kvb_layer *L = &m->layers[l];

        prof_begin(P, PROF_CALC_QKV_AND_ROPE, l);
        if (!normed) be->rmsnorm(be, c->xn, c->x, L->attn_norm, D, n, cfg->rms_eps);
        tap(c, "attn_norm", l, c->xn, n, D);
        float *qkv[3] = {c->q, c->k, c->v};
        const kvb_weight *wqkv[3] = {&L->wq, &L->wk, &L->wv};
        if (matmul_n(be, 3, qkv, wqkv, c->xn, n)) return ERR("matmul failed in layer %d: %s", l, be->error);
        if (L->bq) {
            be->add_bias(be, c->q, L->bq, QD, n);
            be->add_bias(be, c->k, L->bk, kv_dim, n);
            be->add_bias(be, c->v, L->bv, kv_dim, n);
        }
        qk_norm_and_rope(c, l, n);
        prof_end(P, PROF_CALC_QKV_AND_ROPE, l, n, 0);
        tap(c, "Qcur", l, c->q, n, QD);
        tap(c, "Kcur", l, c->k, n, kv_dim);
        tap(c, "Vcur", l, c->v, n, kv_dim);

        if (obs_live(c) && obs_push(c, l, c->q, n, err, err_len)) return -1;

        prof_begin(P, PROF_UPDATE_CACHE, l);
        if (kvc_append(c->kv, l, n, c->k, c->v, c->pos_d, c->rounds_d, err, err_len)) return -1;
        prof_end(P, PROF_UPDATE_CACHE, l, n, 0);

        if (attention_layer(c, l, n, err, err_len)) return -1;
        if (is_local(cfg, l) && trim_window(c, l, c->n_past + n - 1, err, err_len)) return -1;
        if (c->in_prefill && c->layer_end_at > 0 && c->n_past + n == c->layer_end_at &&
            end_prefill_layer(c, l, n, err, err_len))
            return -1;
        tap(c, "kqv_out", l, c->att, n, QD);

        prof_begin(P, PROF_ATTN_OUTPUT, l);
        if (be->matmul(be, c->xn, &L->wo, c->att, n)) return ERR("matmul failed in layer %d: %s", l, be->error);
        tap(c, "attn_out", l, c->xn, n, D);
        if (L->attn_post_norm) {
            be->rmsnorm(be, c->xn, c->xn, L->attn_post_norm, D, n, cfg->rms_eps);
            tap(c, "attn_post_norm", l, c->xn, n, D);
        }
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
        if (cfg->ffn_act == KVB_FFN_GEGLU) {
            be->geglu(be, c->ffn_g, c->ffn_g, c->ffn_u, n * cfg->n_ff);
            tap(c, "ffn_geglu", l, c->ffn_g, n, cfg->n_ff);
        } else {
            be->swiglu(be, c->ffn_g, c->ffn_g, c->ffn_u, n * cfg->n_ff);
            tap(c, "ffn_swiglu", l, c->ffn_g, n, cfg->n_ff);
        }
        if (be->matmul(be, c->xn, &L->w_down, c->ffn_g, n)) return ERR("matmul failed in layer %d: %s", l, be->error);
        tap(c, "ffn_out", l, c->xn, n, D);
        if (L->ffn_post_norm) {
            be->rmsnorm(be, c->xn, c->xn, L->ffn_post_norm, D, n, cfg->rms_eps);
            tap(c, "ffn_post_norm", l, c->xn, n, D);
        }
        /* the residual add with the next norm in one op where the backend fuses them (the same results bit for
         * bit; a GPU saves a launch a layer): the next layer's attn_norm, or after the last layer the output norm
         * where the chunk is one token (the LM head reads the last row's norm only) */
        const float *next_norm = l + 1 < cfg->n_layer ? m->layers[l + 1].attn_norm : n == 1 ? m->output_norm : NULL;
        normed = be->add_rmsnorm && next_norm;
        if (normed) be->add_rmsnorm(be, c->x, c->xn, c->xn, next_norm, D, n, cfg->rms_eps);
        else be->add(be, c->x, c->x, c->xn, n * D);
        tap(c, "l_out", l, c->x, n, D);
        prof_end(P, PROF_MLP, l, n, 0);
    }

    prof_begin(P, PROF_LM_HEAD, -1);
    const float *last = c->x + (n - 1) * D;
    if (!normed) be->rmsnorm(be, c->xn, last, m->output_norm, D, 1, cfg->rms_eps);
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
    if (remember_tokens(c, ids, n, err, err_len)) return -1;
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
        /* a decode step that failed part-way: what its backend holds back (a CUDA graph's recording) runs now, as it
         * would have without one, and later work is not recorded into it */
        if (rc == -1 && c->be->step_begin && c->be->sync) c->be->sync(c->be);
        if (rc == FORWARD_NON_FINITE) rc = report_non_finite(c, ids + done, chunk, err, err_len);
        done += chunk;
    }
    count_copies(c, &t0);
    return rc;
}

/* ---- one decode token of one context inside a batched step (engine/forward.h, engine/batch.c) ---- */

void kvb_fwd_qk_norm_rope(const kvb_model *m, kvb_backend *be, int l, float *q, float *k, const int32_t *pos_d,
                          int64_t n) {
    qk_norm_rope_rows(m, be, NULL, l, q, k, pos_d, n);
}

int kvb_fwd_matmul_n(kvb_backend *be, int k, float *const *out, const kvb_weight *const *w, const float *x, int64_t n) {
    return matmul_n(be, k, out, w, x, n);
}

int kvb_fwd_check(const kvb_ctx *c, int32_t id, char *err, size_t err_len) {
    if (c->n_past + 1 > c->params.n_ctx)
        return ERR("context overflow: %lld tokens past + 1 new > context size %d", (long long)c->n_past, c->params.n_ctx);
    if (id < 0 || id >= c->model->cfg.n_vocab)
        return ERR("token id %d out of range (vocabulary %d)", id, c->model->cfg.n_vocab);
    return 0;
}

/* What forward_chunk does before its layers, for one token: its position and round up to the device, the
 * observation window advanced. */
int kvb_fwd_seq_begin(kvb_ctx *c, char *err, size_t err_len) {
    prof_set_stage(c->prof, PROF_DECODE);
    c->pos[0] = (int32_t)c->n_past;
    c->rounds[0] = c->cur_round;
    if (c->be->copy(c->be, c->pos_d, c->pos, sizeof(int32_t), KVB_COPY_H2D, err, err_len) ||
        c->be->copy(c->be, c->rounds_d, c->rounds, sizeof(int32_t), KVB_COPY_H2D, err, err_len))
        return -1;
    return obs_live(c) ? obs_begin(c, 1, err, err_len) : 0;
}

/* Layer l for one token whose q, k, v rows (after RoPE) sit in the batch's buffers: the context's activation
 * pointers are pointed at those rows for the duration, so the cache update, the method's hooks (which read c->q,
 * c->k, c->v) and the attention op see exactly what forward_chunk would give them for n = 1, and the output lands
 * in the batch's att row. */
int kvb_fwd_seq_attend(kvb_ctx *c, int l, float *q, float *k, float *v, float *att, char *err, size_t err_len) {
    if (obs_live(c) && obs_push(c, l, q, 1, err, err_len)) return -1;
    prof_begin(c->prof, PROF_UPDATE_CACHE, l);
    if (kvc_append(c->kv, l, 1, k, v, c->pos_d, c->rounds_d, err, err_len)) return -1;
    prof_end(c->prof, PROF_UPDATE_CACHE, l, 1, 0);
    float *q0 = c->q, *k0 = c->k, *v0 = c->v, *a0 = c->att;
    c->q = q, c->k = k, c->v = v, c->att = att;
    int rc = attention_layer(c, l, 1, err, err_len);
    c->q = q0, c->k = k0, c->v = v0, c->att = a0;
    if (!rc && is_local(&c->model->cfg, l) && trim_window(c, l, c->n_past, err, err_len)) rc = -1;
    return rc;
}

/* After the batch's logits are in c->logits (host): the check forward_chunk makes, then the token counts. */
int kvb_fwd_seq_end(kvb_ctx *c, int32_t id, char *err, size_t err_len) {
    if (first_non_finite(c->logits, c->model->cfg.n_vocab) >= 0) return report_non_finite(c, &id, 1, err, err_len);
    if (remember_tokens(c, &id, 1, err, err_len)) return -1;
    c->n_past += 1;
    c->dec_calls++;
    return 0;
}
