/* kvzip.c — KVzip (Kim et al. 2025, "KVzip: Query-Agnostic KV Cache Compression with Context Reconstruction",
 * arXiv 2505.23416), as kvpress's KVzipPress builds it. Query-agnostic: once the prompt is in, the model is asked to
 * repeat it, and each cached KV pair is scored by the most attention it receives while the model does so:
 *
 *     score_j = max over the KV head's query heads r and the reconstruction's rows t of p_r[t][j]
 *
 * where p_r[t] is the softmax of row t's scores over the keys the paper lets a reconstruction chunk see (below).
 * Each layer and KV head keeps the B best-scored pairs; the reconstruction's own KV is then thrown away, so the cache
 * holds the prompt's pairs only, and decode appends.
 *
 * The reconstruction, chunk by chunk (kvpress's prepare): the prompt's tokens are cut into chunks of `chunk` tokens
 * (kvpress: 2048, the default here); chunk k is fed, at positions n, n+1, ... after the n-token prompt, as
 *     "\n\nRepeat the previous context exactly."                                        (k = 0)
 *     "\n\nRepeat the part of the previous context exactly, starting with" + the last 8 tokens of chunk k-1 (k > 0)
 * then the chat template's assistant opening (what the model's template puts after a user turn: kvpress's
 * suffix_ids), then chunk k's tokens. Its rows' softmax is taken over the sinks (the first min(4, start) slots),
 * chunk k's own slots [start, end) and the reconstruction's slots so far (causal by position): kvpress's
 * keys_subsampled; the score of slots [start, end) is the max above over that softmax. The first `sinks` = 4 slots
 * score 1 (kept: kvpress's n_sink). The forward pass itself attends to the whole cache, as in kvpress (only the
 * score is taken over the subset).
 *
 * Choices (the press leaves them open, or kvbench differs):
 * - Where the reconstruction runs: in the context's own cache, as kvpress does: each chunk is fed after the prompt
 *   with the scorer as the context's hooks, then every head is cut back to the prompt's slots (kvc_truncate) and the
 *   context's position, tokens, logits and hooks are restored; its forward passes show in the prefill's phases
 *   (and inside the end of prefill's `select`). On a model with sliding-window layers the reconstruction would push
 *   the prompt's last tokens out of their windows: there each chunk runs on a fork of the context (kvb_ctx_fork),
 *   freed after it, which holds a copy of the prompt's KV too. The most KV held while a chunk is reconstructed (the
 *   store's occupied slots, kvc_used_bytes; the fork's included) is reported (recon_kv_peak_bytes): the prompt plus
 *   a chunk's reconstruction in place, twice the prompt plus it with a fork.
 * - Its cost is reported: extra_prefill_tokens (the reconstruction's tokens, every chunk with its prompt) and
 *   recon_ms in the method's description (the records' params); the time is inside the measured prefill (the end
 *   of prefill runs it: kvb_end_prefill), so inside TTFT.
 * - What is reconstructed: the whole prompt, the chat template's opening included (kvpress skips the template's
 *   prefix, which then scores 0 beside the 4 sinks; kvbench's prompts are rendered whole and the engine does not
 *   mark where the template ends). A model without a tokenizer (synthetic:<shape>) has no repeat prompt: its chunks
 *   are fed bare (the cost is the same but for the prompt's few tokens).
 * - Budget: B per KV head = budget x prompt length (kvbench's rule), shared as kvpress shares it (compress_post):
 *   alloc=global (its default, layerwise = False) keeps the top B x heads x global layers of every score together,
 *   so layers and heads hold different counts; alloc=layer (layerwise = True) the top B x heads of each layer;
 *   alloc=head, B per KV head. kvpress prunes the scores at or below a threshold (ties pruned together); kvbench
 *   keeps exactly the top count, ties to the earlier layer, head and slot. Each layer's mean per head is its claim.
 * - A sliding-window (local) layer keeps its window and is not scored (kvpress skips Gemma 3's sliding layers).
 * - At budget 100% nothing is evicted and no reconstruction runs.
 * - No op of its own: the rows' softmax is the attention op over an index list (kvb_attn_probs); the max over the
 *   group's heads and the rows is probs_reduce's KVB_REDUCE_MAX_HEADS with the group's G x n_q rows taken as its
 *   "heads" (they lie one stride apart in [n_head][n_q][stride]), and the max with the score so far (an engine chunk
 *   holds only part of a reconstruction chunk's rows) is the same reduction over two rows.
 * - Against kvpress's KVzipPress (test_kvpress_kept: the default model, prose_4000 as bare text, 30%, chunk 2048,
 *   n_sink 4, layerwise=False) given a chat template with no prefix, so that it reconstructs the whole prompt as
 *   kvbench does, and the model's assistant opening as its suffix: Jaccard 0.9800 at least per layer and KV head,
 *   0.9982 on average. The press keeps 1129.5 tokens per head on average (its threshold), kvbench 1129. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/chat.h"
#include "methods/method.h"

#define KVZ_FIRST "\n\nRepeat the previous context exactly."
#define KVZ_NEXT "\n\nRepeat the part of the previous context exactly, starting with"
#define KVZ_PROMPT_MAX 128 /* tokens of a chunk's repeat prompt and template opening, at most */
#define KVZ_PREV_TAIL 8 /* tokens of the previous chunk quoted in the next chunk's prompt (kvpress's prev_postfix_size) */

typedef struct {
    kvb_method base;
    int64_t chunk; /* prompt tokens per reconstruction chunk */
    int64_t sinks; /* first slots scored 1 */
    int64_t keep;  /* B: tokens kept per head after prefill, on average over the pooled heads */
    int alloc;     /* ALLOC_*: how B x heads is shared */
    int pooled;    /* the kept counts per layer are held_layer's */
    int64_t *held_layer; /* [n_layer]: tokens kept over the layer's KV heads (pooled allocations) */
    int64_t extra_tokens;  /* tokens the reconstruction fed through the model */
    int64_t recon_kv_peak; /* the most KV held during the reconstruction: context + fork (bytes, occupied slots) */
    double recon_ms;
    /* during one reconstruction chunk (the scorer hook on the fork) */
    kvb_hooks scorer;
    int64_t n, start, end; /* prompt length; the chunk's slots */
    float *score;          /* device [n_layer][n_head_kv][n] */
    float *tmp;            /* device [2][chunk] */
    int32_t *idx;          /* device: the subset's slot list */
    int64_t idx_cap;
    kvb_src *src;          /* [n_head_kv]: the fork's layer through the list */
} kvzip;

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

enum { ALLOC_GLOBAL = 0, ALLOC_LAYER = 1, ALLOC_HEAD = 2 };
static const char *const ALLOC_NAME[] = {"global", "layer", "head"};

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* pre_attend on the fork: the chunk's rows' attention over sinks + [start, end) + the reconstruction so far, maxed
 * into the scores of [start, end). */
static int kvzip_score(void *self, kvb_ctx *d, int layer, const float *q, int64_t n_q, char *err, size_t err_len) {
    kvzip *s = self;
    const kvb_config *cfg = &d->model->cfg;
    if (kvb_layer_window(cfg, layer)) return 0;
    kvb_backend *be = d->be;
    const int HK = cfg->n_head_kv, G = cfg->n_head / HK;
    const int64_t sink = s->sinks < s->start ? s->sinks : s->start, len = s->end - s->start;
    const int64_t rec = kvb_cur_len(d, n_q) - s->n, m = sink + len + rec;
    if (m > s->idx_cap) return ERR("kvzip: a list of %lld slots is over %lld", (long long)m, (long long)s->idx_cap);
    if ((sink && be->iota(be, s->idx, 0, sink, err, err_len)) ||
        be->iota(be, s->idx + sink, (int32_t)s->start, len, err, err_len) ||
        be->iota(be, s->idx + sink + len, (int32_t)s->n, rec, err, err_len))
        return -1;
    kvb_src_from_store(d, layer, s->src);
    for (int g = 0; g < HK; g++) {
        if (s->src[g].n != s->n + rec)
            return ERR("kvzip: layer %d head %d holds %lld slots, the reconstruction expects %lld", layer, g,
                       (long long)s->src[g].n, (long long)(s->n + rec));
        s->src[g].idx = s->idx;
        s->src[g].n_idx = m;
    }
    float *probs = NULL;
    int64_t stride = 0;
    if (kvb_attn_probs(d, layer, q, d->pos_d, n_q, s->src, &probs, &stride, NULL, err, err_len)) return -1;
    int rc = 0;
    for (int g = 0; g < HK && !rc; g++) {
        float *row = s->score + ((size_t)layer * HK + g) * s->n + s->start;
        rc = be->copy(be, s->tmp, row, (size_t)len * sizeof(float), KVB_COPY_D2D, err, err_len) ||
             be->probs_reduce(be, s->tmp + len, 0, probs + (size_t)g * G * n_q * stride + sink, stride, G * (int)n_q, 1,
                              1, len, NULL, KVB_REDUCE_MAX_HEADS, 0, err, err_len) ||
             be->probs_reduce(be, row, 0, s->tmp, len, 2, 1, 1, len, NULL, KVB_REDUCE_MAX_HEADS, 0, err, err_len);
    }
    kvb_attn_probs_free(d, probs, n_q, stride);
    return rc ? -1 : 0;
}

/* The ids of text (no BOS), appended at ids + *n; a model without a tokenizer adds none. */
static int add_text(const kvb_ctx *c, const char *text, int32_t *ids, int64_t *n, int64_t cap, char *err,
                    size_t err_len) {
    if (!c->model->tok || !*text) return 0;
    int32_t *t = NULL;
    int k = 0;
    if (tok_encode(c->model->tok, text, strlen(text), 0, 1, &t, &k, err, err_len)) return -1;
    if (*n + k > cap) {
        free(t);
        return ERR("kvzip: the repeat prompt is over %lld tokens", (long long)cap);
    }
    if (k > 0) memcpy(ids + *n, t, (size_t)k * sizeof *t); /* a tokenizer may give no ids (and no buffer) */
    *n += k;
    free(t);
    return 0;
}

/* What the model's chat template puts between a user turn's text and the assistant's answer (kvpress's suffix),
 * malloc'd ("\n" without a template, as kvpress). */
static char *assistant_opening(const kvb_ctx *c, char *err, size_t err_len) {
    const kvb_model *m = c->model;
    if (!m->gguf || !m->tok) return strdup("\n");
    const char *sep = "\n#############";
    chat_msg msg = {"user", "dummy context\n#############"};
    char *text = NULL;
    chat_kind k = chat_model_kind(m->gguf, m->cfg.arch, NULL);
    if (chat_render(k, &msg, 1, 1, NULL, &text, err, err_len)) return NULL;
    const char *at = strstr(text, sep);
    char *out = strdup(at ? at + strlen(sep) : "\n");
    free(text);
    if (!out) ERR("out of memory");
    return out;
}

/* One reconstruction chunk ids[0..k) after the n-token prompt of c, scored by s->scorer. In place (no sliding-window
 * layer): on c itself, as a prefill with the scorer as its hooks, then every head cut back to the prompt and the
 * context's state (position, tokens, logits, hooks) restored. Otherwise on a fork of c, freed after. The KV held at
 * the chunk's end goes into s->recon_kv_peak. */
static int run_chunk(kvzip *s, kvb_ctx *c, const int32_t *ids, int64_t k, int in_place, float *logits, char *err,
                     size_t err_len) {
    const int64_t n = s->n;
    const kvb_config *cfg = &c->model->cfg;
    if (!in_place) {
        kvb_ctx *d = kvb_ctx_fork(c, 0, err, err_len);
        if (!d) return -1;
        if (d->params.n_ctx < n + k) d->params.n_ctx = (int)(n + k); /* positions past the prompt, on the fork only */
        int rc = kvb_ctx_set_hooks(d, &s->scorer, err, err_len) || kvb_forward(d, ids, k, err, err_len);
        /* the context's prompt, the fork's copy and the reconstruction */
        int64_t held = kvc_used_bytes(c->kv, KVB_TIER_DEVICE) + kvc_used_bytes(d->kv, KVB_TIER_DEVICE);
        if (held > s->recon_kv_peak) s->recon_kv_peak = held;
        kvb_ctx_free(d);
        return rc ? -1 : 0;
    }
    const kvb_hooks *hooks = c->hooks;
    const int in_prefill = c->in_prefill, n_ctx = c->params.n_ctx;
    memcpy(logits, c->logits, (size_t)cfg->n_vocab * sizeof *logits);
    c->hooks = &s->scorer;
    c->in_prefill = 1; /* prefill work: not counted as decode */
    if (c->params.n_ctx < n + k) c->params.n_ctx = (int)(n + k);
    int rc = kvb_forward(c, ids, k, err, err_len);
    int64_t held = kvc_used_bytes(c->kv, KVB_TIER_DEVICE); /* the prompt and the reconstruction */
    if (held > s->recon_kv_peak) s->recon_kv_peak = held;
    for (int l = 0; l < cfg->n_layer; l++)
        for (int g = 0; g < cfg->n_head_kv; g++)
            if (kvc_n(c->kv, l, g) > n && kvc_truncate(c->kv, l, g, n, rc ? NULL : err, rc ? 0 : err_len)) rc = -1;
    c->n_past = n;
    c->tokens_n = n;
    c->hooks = hooks;
    c->in_prefill = in_prefill;
    c->params.n_ctx = n_ctx;
    memcpy(c->logits, logits, (size_t)cfg->n_vocab * sizeof *logits);
    return rc ? -1 : 0;
}

/* Feed the reconstruction chunk by chunk, scoring the prompt's slots into s->score. */
static int reconstruct(kvzip *s, kvb_ctx *c, char *err, size_t err_len) {
    const int64_t n = s->n, cap = (s->chunk < n ? s->chunk : n) + KVZ_PROMPT_MAX;
    int in_place = 1;
    for (int l = 0; l < c->model->cfg.n_layer; l++) in_place &= !kvb_layer_window(&c->model->cfg, l);
    char *suffix = assistant_opening(c, err, err_len);
    int32_t *ids = malloc((size_t)cap * sizeof *ids), *prompt = malloc((size_t)n * sizeof *prompt);
    float *logits = malloc((size_t)c->model->cfg.n_vocab * sizeof *logits);
    int rc = suffix && ids && prompt && logits ? 0 : (suffix ? ERR("out of memory") : -1);
    if (!rc) memcpy(prompt, c->tokens, (size_t)n * sizeof *prompt); /* an in-place chunk grows c->tokens */
    for (s->start = 0; s->start < n && !rc; s->start = s->end) {
        s->end = s->start + s->chunk < n ? s->start + s->chunk : n;
        int64_t k = 0;
        if (s->start == 0) rc = add_text(c, KVZ_FIRST, ids, &k, cap, err, err_len);
        else {
            rc = add_text(c, KVZ_NEXT, ids, &k, cap, err, err_len);
            int64_t tail = s->start < KVZ_PREV_TAIL ? s->start : KVZ_PREV_TAIL;
            if (!rc && c->model->tok && k + tail <= cap) {
                memcpy(ids + k, prompt + s->start - tail, (size_t)tail * sizeof *ids);
                k += tail;
            }
        }
        if (!rc) rc = add_text(c, suffix, ids, &k, cap, err, err_len);
        if (rc) break;
        if (k > KVZ_PROMPT_MAX) {
            rc = ERR("kvzip: the repeat prompt is %lld tokens, over %d", (long long)k, KVZ_PROMPT_MAX);
            break;
        }
        memcpy(ids + k, prompt + s->start, (size_t)(s->end - s->start) * sizeof *ids);
        k += s->end - s->start;
        rc = run_chunk(s, c, ids, k, in_place, logits, err, err_len);
        s->extra_tokens += k;
    }
    free(suffix);
    free(ids);
    free(prompt);
    free(logits);
    return rc ? -1 : 0;
}

/* kvpress's pooled allocations: the top B x heads of every global layer's heads together (alloc=global) or of each
 * layer's (alloc=layer), each head keeping the ones it holds: one top-k over the scores' rows (local layers' rows
 * set to -inf), split back into heads (split_rows_idx); the host reads the counts (one D2H copy). */
static int keep_pooled(kvzip *s, kvb_ctx *c, char *err, size_t err_len) {
    kvb_backend *be = c->be;
    const kvb_config *cfg = &c->model->cfg;
    const int HK = cfg->n_head_kv, rows = cfg->n_layer * HK;
    const int64_t n = s->n;
    int n_global = 0;
    for (int l = 0; l < cfg->n_layer; l++) n_global += !kvb_layer_window(cfg, l);
    const int64_t k_all = s->alloc == ALLOC_GLOBAL ? s->keep * HK * n_global : s->keep * HK;
    const size_t iota_bytes = (size_t)n * sizeof(int32_t), out_bytes = (size_t)rows * n * sizeof(int32_t),
                 flat_bytes = (size_t)k_all * sizeof(int32_t), count_bytes = (size_t)rows * sizeof(int32_t);
    int32_t *iota = kvb_method_alloc(c, iota_bytes), *out = kvb_method_alloc(c, out_bytes);
    int32_t *flat = kvb_method_alloc(c, flat_bytes), *counts = kvb_method_alloc(c, count_bytes);
    int32_t *counts_h = malloc(count_bytes);
    int rc = iota && out && flat && counts && counts_h ? 0 : ERR("kvzip: out of memory");
    if (!rc) rc = be->iota(be, iota, 0, n, err, err_len) || be->zero(be, counts, count_bytes, err, err_len);
    for (int l = 0; l < cfg->n_layer && !rc; l++)
        for (int g = 0; g < HK && !rc && kvb_layer_window(cfg, l); g++)
            rc = be->fill_idx_f32(be, s->score + ((size_t)l * HK + g) * n, iota, n, -INFINITY, err, err_len);
    if (!rc && s->alloc == ALLOC_GLOBAL)
        rc = be->topk_idx(be, flat, s->score, (int64_t)rows * n, k_all, err, err_len) ||
             be->split_rows_idx(be, out, n, counts, flat, k_all, n, rows, err, err_len);
    for (int l = 0; l < cfg->n_layer && !rc && s->alloc == ALLOC_LAYER; l++)
        if (!kvb_layer_window(cfg, l))
            rc = be->topk_idx(be, flat, s->score + (size_t)l * HK * n, (int64_t)HK * n, k_all, err, err_len) ||
                 be->split_rows_idx(be, out + (size_t)l * HK * n, n, counts + (size_t)l * HK, flat, k_all, n, HK, err,
                                    err_len);
    if (!rc) rc = be->copy(be, counts_h, counts, count_bytes, KVB_COPY_D2H, err, err_len) ||
                  (be->sync && be->sync(be) ? ERR("kvzip: %s", be->error) : 0);
    for (int l = 0; l < cfg->n_layer && !rc; l++) {
        s->held_layer[l] = 0;
        for (int g = 0; g < HK && !rc && !kvb_layer_window(cfg, l); g++) {
            const int r = l * HK + g;
            rc = kvc_retain_dev(c->kv, l, g, out + (size_t)r * n, counts_h[r], err, err_len);
            s->held_layer[l] += counts_h[r];
        }
    }
    s->pooled = !rc;
    kvb_method_release(c, iota, iota_bytes);
    kvb_method_release(c, out, out_bytes);
    kvb_method_release(c, flat, flat_bytes);
    kvb_method_release(c, counts, count_bytes);
    free(counts_h);
    return rc ? -1 : 0;
}

static int kvzip_after_prefill(void *self, kvb_ctx *c, char *err, size_t err_len) {
    kvzip *s = self;
    kvb_backend *be = c->be;
    const kvb_config *cfg = &c->model->cfg;
    const int64_t n = c->n_past, HK = cfg->n_head_kv;
    s->base.n_prompt = n;
    if (kvb_method_budget_tokens(&s->base, n, &s->keep, err, err_len)) return -1;
    if (s->keep >= n) return 0;
    if (c->tokens_n < n) return ERR("kvzip: the context knows %lld of its %lld tokens", (long long)c->tokens_n, (long long)n);
    for (int64_t i = 0; i < n; i++)
        if (c->tokens[i] < 0) return ERR("kvzip: the token at position %lld is unknown (the KV was not made by the forward pass)", (long long)i);
    const double t0 = now_ms();
    s->n = n;
    const int64_t chunk = s->chunk < n ? s->chunk : n;
    s->idx_cap = s->sinks + 2 * chunk + KVZ_PROMPT_MAX; /* sinks + the chunk's slots + its reconstruction */
    const size_t score_bytes = (size_t)cfg->n_layer * HK * n * sizeof(float), tmp_bytes = 2 * (size_t)chunk * sizeof(float),
                 list_bytes = (size_t)s->idx_cap * sizeof(int32_t), keep_bytes = (size_t)s->keep * sizeof(int32_t);
    s->score = kvb_method_alloc(c, score_bytes); /* zeroed */
    s->tmp = kvb_method_alloc(c, tmp_bytes);
    s->idx = kvb_method_alloc(c, list_bytes);
    int32_t *keep = kvb_method_alloc(c, keep_bytes);
    const int64_t sinks = s->sinks < n ? s->sinks : n;
    int rc = s->score && s->tmp && s->idx && keep ? 0 : ERR("kvzip: out of memory");
    if (!rc && sinks) rc = be->iota(be, s->idx, 0, sinks, err, err_len);
    for (int64_t r = 0; r < cfg->n_layer * HK && !rc && sinks; r++)
        rc = be->fill_idx_f32(be, s->score + r * n, s->idx, sinks, 1.0f, err, err_len);
    if (!rc) rc = reconstruct(s, c, err, err_len);
    if (!rc && s->alloc != ALLOC_HEAD) rc = keep_pooled(s, c, err, err_len);
    for (int l = 0; l < cfg->n_layer && !rc && s->alloc == ALLOC_HEAD; l++)
        for (int g = 0; g < HK && !rc && !kvb_layer_window(cfg, l); g++) /* a local layer keeps its window */
            rc = be->topk_idx(be, keep, s->score + ((size_t)l * HK + g) * n, n, s->keep, err, err_len) ||
                 kvc_retain_dev(c->kv, l, g, keep, s->keep, err, err_len);
    kvb_method_release(c, s->score, score_bytes);
    kvb_method_release(c, s->tmp, tmp_bytes);
    kvb_method_release(c, s->idx, list_bytes);
    kvb_method_release(c, keep, keep_bytes);
    s->score = s->tmp = NULL;
    s->idx = NULL;
    s->recon_ms = now_ms() - t0;
    return rc ? -1 : 0;
}

static int64_t kvzip_expected(kvb_method *m, kvb_ctx *c, int layer) {
    kvzip *s = (kvzip *)m;
    if (c->in_prefill) return c->n_past;
    const int HK = c->model->cfg.n_head_kv;
    if (s->pooled) /* the layer's mean per head (verify compares the layer's sum, within a token per head) */
        return (s->held_layer[layer] + HK / 2) / HK + (c->n_past - m->n_prompt);
    return kvb_kept_then_decoded(m, c, s->keep);
}

static void kvzip_describe(kvb_method *m, char *buf, size_t cap) {
    kvzip *s = (kvzip *)m;
    snprintf(buf, cap, "keep=%lld alloc=%s chunk=%lld sinks=%lld extra_prefill_tokens=%lld recon_ms=%.1f recon_kv_peak_bytes=%lld",
             (long long)s->keep, ALLOC_NAME[s->alloc], (long long)s->chunk, (long long)s->sinks, (long long)s->extra_tokens, s->recon_ms,
             (long long)s->recon_kv_peak);
}

static void kvzip_destroy(kvb_method *m) {
    free(((kvzip *)m)->src);
    free(((kvzip *)m)->held_layer);
    free(m);
}

static kvb_method *kvzip_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len) {
    int64_t chunk = 2048, sinks = 4;
    if (kvb_opts_int(o, "chunk", &chunk, err, err_len) < 0 || kvb_opts_int(o, "sinks", &sinks, err, err_len) < 0)
        return NULL;
    const char *a = kvb_opts_get(o, "alloc");
    int alloc = ALLOC_GLOBAL;
    if (a) {
        for (alloc = 0; alloc < 3 && strcmp(a, ALLOC_NAME[alloc]); alloc++) {
        }
        if (alloc == 3) {
            ERR("kvzip: alloc=%s: global, layer or head", a);
            return NULL;
        }
    }
    if (chunk < 1 || chunk > (1 << 24)) {
        ERR("kvzip: chunk=%lld: a reconstruction chunk is 1 to %d tokens", (long long)chunk, 1 << 24);
        return NULL;
    }
    if (sinks < 0 || sinks > 1024) {
        ERR("kvzip: sinks=%lld: 0 to 1024 sink tokens", (long long)sinks);
        return NULL;
    }
    kvzip *s = calloc(1, sizeof *s);
    if (s) s->src = calloc((size_t)c->model->cfg.n_head_kv, sizeof *s->src);
    if (s) s->held_layer = calloc((size_t)c->model->cfg.n_layer, sizeof *s->held_layer);
    if (!s || !s->src || !s->held_layer) {
        if (s) free(s->src);
        free(s);
        ERR("out of memory");
        return NULL;
    }
    s->chunk = chunk;
    s->sinks = sinks;
    s->alloc = alloc;
    s->scorer.self = s;
    s->scorer.pre_attend = kvzip_score;
    s->base.budget = *b;
    s->base.imposes_budget = 1;
    return &s->base;
}

const kvb_method_def kvb_method_kvzip = {
    .name = "kvzip",
    .summary = "keeps the KV pairs most attended while the model repeats the prompt (query-agnostic; extra prefill)",
    .traits = KVB_NEEDS_BUDGET | KVB_SHARES_PREFILL,
    .create = kvzip_create,
    .hooks = {.after_prefill = kvzip_after_prefill},
    .expected_tokens = kvzip_expected,
    .describe = kvzip_describe,
    .destroy = kvzip_destroy,
};
