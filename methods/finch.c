/* finch.c — Finch (Corallo and Papotti 2024, "FINCH: Prompt-guided Key-Value Cache Compression for Large Language
 * Models", TACL, arXiv 2404.12379; kvpress's FinchPress scores the same way in one pass). The prompt is prefilled
 * chunk by chunk and compressed after each chunk, so the cache never holds the whole prompt: after chunk i is in the
 * cache (the B_ctx kept tokens of chunks 0..i-1 + chunk i), the question's tokens are fed after it and each cached token
 * scores the attention the question's rows give it,
 *
 *     score_j = sum over the KV head's query heads r and the question's rows t of p_r[t][j]
 *
 * (kvpress's FinchPress: a mean over the same rows and heads, a positive multiple); each global layer and KV head
 * keeps the top B_ctx and the question's KV is dropped; the next chunk follows. After the last chunk the question is
 * fed for good: its rows score the cache once more, the top B_ctx are kept, and the question's own KV stays (kvpress
 * keeps its window), so the prefill ends holding B_ctx + |question| = B tokens per head, and decode appends.
 *
 * Choices (the paper and the press leave them open, or kvbench differs):
 * - The question is the prompt's last `question` tokens (default 32; at most B - 1 and n - 1). kvpress marks it with
 *   a delimiter token its pipeline inserts; kvbench's prompts carry no marker, so with the question visible these are
 *   the question's last tokens and the chat template's assistant opening (as SnapKV's window). With the question
 *   hidden (`kvbench run`'s kvpress protocol) the method never sees the question: the last tokens of the context
 *   stand in for it.
 * - Where the question goes in each chunk's view: right after the chunk, at the positions that follow it (the
 *   paper's "chunk + question" input), so its distance to the chunk is the same at every step. Before the last
 *   chunk its KV is evicted with the tokens the step drops and the next chunk takes the positions it held, so the
 *   cache holds at most B_ctx + chunk + |question| tokens per head. On a model with sliding-window layers the
 *   question would push the chunk's last tokens out of their windows: there it runs on a fork of the context
 *   (kvb_ctx_fork: the kept tokens + the chunk), freed after scoring, whose KV counts in the measured peak
 *   (2 (B_ctx + chunk) + |question|). A step whose cache is within B_ctx compresses nothing and runs no question.
 * - Chunks of `chunk` = 512 tokens (the paper sizes chunks to the model's context; kvpress's chunk_length splits
 *   only the top-k, not the prefill). Kept positions are the original ones (the paper and kvpress re-rotate keys to
 *   close the gaps; kvbench keeps every method's positions as prefilled).
 * - Budget B per KV head = budget x prompt length (kvbench's rule), B_ctx = B - |question|, per-head top B_ctx, ties
 *   to the earlier slot; no kvpress score normalisation (normalize_scores multiplies row t by its key count, a
 *   per-row constant that changes the sum's weights: not applied).
 * - Its cost is reported in the description (the records' params): extra_prefill_tokens (the question fed once per
 *   compressing step before the last), peak_kv_bytes (the largest KV the store held at any point of the prefill, the
 *   fork's included, measured with kvc_used_bytes) and peak_frac (that over full attention's KV of the prompt).
 * - Its own prefill (def.prefill) serves `generate`, `fidelity`, `bench` and `serve`; a run's shared prefill is
 *   adopted by re-reading the context's tokens (kvb_ctx.tokens), clearing it and prefilling chunk by chunk: the
 *   method's cache never held the whole prompt, but the run's shared prefill did, and its time is in the cell's TTFT.
 *   A prompt the session prefills in rounds (a dialogue) is re-prefilled the same way at the end of prefill.
 * - A sliding-window (local) layer keeps its window and is not scored. At budget 100% the prompt is prefilled whole.
 * - Against kvpress's FinchPress (test_kvpress_kept: the default model, prose_4000, 1129 tokens per head), one chunk
 *   (chunk=8192: the press scores the whole prompt at once) with the press's window set to the last 32 tokens (no
 *   delimiter), rerotate_keys=False and normalize_scores=False: Jaccard 0.9965 at least per layer and KV head, 0.9990
 *   on average. The press's default normalisation moves little here (its sets with and without it: 0.9982 at least,
 *   0.9994 on average); what differs by design is the chunked prefill (chunk < prompt), which the press does not do. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "methods/method.h"

typedef struct {
    kvb_method base;
    kvb_ctx *c;
    int64_t chunk, question; /* options */
    int64_t keep;            /* B: tokens per global layer and KV head after prefill */
    int64_t held;            /* what each global head held at the end of prefill */
    int64_t extra_tokens;    /* question tokens fed on forks */
    int64_t peak_bytes, full_bytes;
    int scoring;             /* 1 while the question's rows are scored */
    int done;                /* the chunked prefill ran */
    int windowed;            /* the model has sliding-window layers: the question runs on a fork */
    kvb_hooks fork_hooks;
    kvb_score_row *acc;      /* [layer][KV head]: attention from the question's rows, per slot */
} finch;

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

static kvb_score_row *acc_at(finch *s, int l, int g) { return &s->acc[(size_t)l * s->c->model->cfg.n_head_kv + g]; }

/* the question's rows: their attention summed into s->acc, the probabilities never written */
static int finch_sum_rows(void *self, kvb_ctx *c, int layer, const kvb_src *src, int64_t n_q, float **rows, char *err,
                          size_t err_len) {
    (void)n_q;
    finch *s = self;
    if (!s->scoring || kvb_layer_window(&c->model->cfg, layer)) return 0;
    return kvb_score_rows_for_sums(c, acc_at(s, layer, 0), src, rows, err, err_len);
}

/* Feed the question ids[0..q) to x with its rows scored into s->acc (fresh). */
static int score_question(finch *s, kvb_ctx *x, const int32_t *q, int64_t nq, char *err, size_t err_len) {
    const kvb_config *cfg = &x->model->cfg;
    for (int i = 0; i < cfg->n_layer * cfg->n_head_kv; i++) s->acc[i].n = 0;
    s->scoring = 1;
    int rc = kvb_forward(x, q, nq, err, err_len);
    s->scoring = 0;
    return rc;
}

/* Keep, in every global layer and KV head of c (which hold m + have_tail slots), the top b of the first m slots by
 * s->acc, then slots m .. m+tail-1. */
static int compress(finch *s, kvb_ctx *c, int64_t m, int64_t have_tail, int64_t b, int64_t tail, int32_t *idx,
                    char *err, size_t err_len) {
    kvb_backend *be = c->be;
    const kvb_config *cfg = &c->model->cfg;
    for (int l = 0; l < cfg->n_layer; l++)
        for (int g = 0; g < cfg->n_head_kv && !kvb_layer_window(cfg, l); g++) {
            kvb_score_row *a = acc_at(s, l, g);
            if (kvc_n(c->kv, l, g) != m + have_tail || a->n < m)
                return ERR("finch: layer %d head %d holds %lld slots (%lld scored), expected %lld", l, g,
                           (long long)kvc_n(c->kv, l, g), (long long)a->n, (long long)(m + have_tail));
            if (be->topk_idx(be, idx, a->v, m, b, err, err_len) ||
                (tail && be->iota(be, idx + b, (int32_t)m, tail, err, err_len)) ||
                kvc_retain_dev(c->kv, l, g, idx, b + tail, err, err_len))
                return -1;
        }
    return 0;
}

/* Slots per KV head of the first global layer (every global head holds the same count here). */
static int64_t global_slots(const kvb_ctx *c) {
    for (int l = 0; l < c->model->cfg.n_layer; l++)
        if (!kvb_layer_window(&c->model->cfg, l)) return kvc_n(c->kv, l, 0);
    return 0;
}

static void note_peak(finch *s, int64_t bytes) {
    if (bytes > s->peak_bytes) s->peak_bytes = bytes;
}

static int finch_prefill(kvb_method *m, kvb_ctx *c, const int32_t *ids, int64_t n, char *err, size_t err_len) {
    finch *s = (finch *)m;
    m->n_prompt = n;
    s->peak_bytes = s->extra_tokens = 0;
    s->done = 1;
    s->full_bytes = 0; /* full attention's KV of the prompt: a local layer holds its window */
    for (int l = 0; l < c->model->cfg.n_layer; l++)
        s->full_bytes += kvb_full_tokens_at(&c->model->cfg, l, n) * c->model->cfg.n_head_kv * kvc_slot_bytes(c->kv);
    if (kvb_method_budget_tokens(m, n, &s->keep, err, err_len)) return -1;
    if (s->keep >= n) { /* nothing to evict: the plain prefill */
        s->held = n;
        int rc = kvb_forward(c, ids, n, err, err_len);
        note_peak(s, kvc_used_bytes(c->kv, KVB_TIER_DEVICE));
        return rc;
    }
    if (s->keep < 2) return ERR("finch: a budget of %lld tokens leaves no room beside the question", (long long)s->keep);
    int64_t q = s->question < s->keep - 1 ? s->question : s->keep - 1;
    if (q > n - 1) q = n - 1;
    const int64_t ctx_n = n - q, b = s->keep - q;
    const int32_t *question = ids + ctx_n;
    const size_t idx_bytes = (size_t)s->keep * sizeof(int32_t);
    int32_t *idx = kvb_method_alloc(c, idx_bytes);
    int rc = idx ? 0 : ERR("finch: out of memory");
    for (int64_t start = 0; start < ctx_n && !rc; start += s->chunk) {
        const int64_t end = start + s->chunk < ctx_n ? start + s->chunk : ctx_n;
        if ((rc = kvb_forward(c, ids + start, end - start, err, err_len))) break;
        note_peak(s, kvc_used_bytes(c->kv, KVB_TIER_DEVICE));
        const int64_t slots = global_slots(c);
        if (end == ctx_n) { /* the question for good: scored, then kept */
            if ((rc = score_question(s, c, question, q, err, err_len))) break;
            note_peak(s, kvc_used_bytes(c->kv, KVB_TIER_DEVICE));
            if (slots > b) rc = compress(s, c, slots, q, b, q, idx, err, err_len);
            s->held = (slots > b ? b : slots) + q;
            break;
        }
        if (slots <= b) continue; /* nothing to evict yet */
        if (!s->windowed) { /* in place: the question's KV goes with the evicted */
            if ((rc = score_question(s, c, question, q, err, err_len))) break;
            note_peak(s, kvc_used_bytes(c->kv, KVB_TIER_DEVICE));
            s->extra_tokens += q;
            rc = compress(s, c, slots, q, b, 0, idx, err, err_len);
            c->n_past = end; /* the next chunk follows the last one */
            continue;
        }
        for (int l = 0; l < c->model->cfg.n_layer && !rc; l++) /* sized on c: the fork's adds never reallocate */
            for (int g = 0; g < c->model->cfg.n_head_kv && !rc && !kvb_layer_window(&c->model->cfg, l); g++)
                rc = kvb_score_row_fit(c, acc_at(s, l, g), slots + q, err, err_len);
        kvb_ctx *d = rc ? NULL : kvb_ctx_fork(c, 0, err, err_len);
        if (!d) {
            rc = -1;
            break;
        }
        rc = kvb_ctx_set_hooks(d, &s->fork_hooks, err, err_len) || score_question(s, d, question, q, err, err_len);
        note_peak(s, kvc_used_bytes(c->kv, KVB_TIER_DEVICE) + kvc_used_bytes(d->kv, KVB_TIER_DEVICE));
        kvb_ctx_free(d);
        s->extra_tokens += q;
        if (!rc) rc = compress(s, c, slots, 0, b, 0, idx, err, err_len);
    }
    kvb_method_release(c, idx, idx_bytes);
    return rc ? -1 : 0;
}

/* The context holds the whole prompt (a run's shared prefill, or rounds prefilled by the session): prefill it again
 * chunk by chunk from its tokens. */
static int reprefill(kvb_method *m, kvb_ctx *c, char *err, size_t err_len) {
    const int64_t n = c->n_past;
    if (c->tokens_n < n) return ERR("finch: the context knows %lld of its %lld tokens", (long long)c->tokens_n, (long long)n);
    int32_t *ids = malloc((size_t)(n > 0 ? n : 1) * sizeof *ids);
    if (!ids) return ERR("out of memory");
    if (n > 0) memcpy(ids, c->tokens, (size_t)n * sizeof *ids);
    int rc = 0;
    for (int64_t i = 0; i < n && !rc; i++)
        if (ids[i] < 0) rc = ERR("finch: the token at position %lld is unknown (the KV was not made by the forward pass)", (long long)i);
    const int32_t round = c->cur_round;
    if (!rc) {
        kvb_ctx_reset(c);
        c->cur_round = round;
        rc = n > 0 ? finch_prefill(m, c, ids, n, err, err_len) : 0;
    }
    free(ids);
    return rc;
}

static int finch_adopt(kvb_method *m, kvb_ctx *c, const kvb_share *share, char *err, size_t err_len) {
    (void)share;
    return reprefill(m, c, err, err_len);
}

/* The end of prefill: a prompt the session prefilled itself (dialogue rounds) is prefilled again chunk by chunk. */
static int finch_after_prefill(void *self, kvb_ctx *c, char *err, size_t err_len) {
    finch *s = self;
    if (s->done) return 0;
    int rc = reprefill(&s->base, c, err, err_len);
    c->in_prefill = 0; /* the reset reopened it */
    return rc;
}

static int64_t finch_expected(kvb_method *m, kvb_ctx *c, int layer) {
    (void)layer;
    finch *s = (finch *)m;
    if (c->in_prefill) return -1;
    return s->held + (c->n_past - m->n_prompt);
}

static void finch_describe(kvb_method *m, char *buf, size_t cap) {
    finch *s = (finch *)m;
    snprintf(buf, cap, "keep=%lld chunk=%lld question=%lld extra_prefill_tokens=%lld peak_kv_bytes=%lld peak_frac=%.3f",
             (long long)s->keep, (long long)s->chunk, (long long)s->question, (long long)s->extra_tokens,
             (long long)s->peak_bytes, s->full_bytes > 0 ? (double)s->peak_bytes / (double)s->full_bytes : 0.0);
}

static void finch_destroy(kvb_method *m) {
    finch *s = (finch *)m;
    if (s->acc) {
        int n = s->c->model->cfg.n_layer * s->c->model->cfg.n_head_kv;
        for (int i = 0; i < n; i++) kvb_score_row_free(s->c, &s->acc[i]);
        free(s->acc);
    }
    free(s);
}

static kvb_method *finch_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len) {
    int64_t chunk = 512, question = 32;
    if (kvb_opts_int(o, "chunk", &chunk, err, err_len) < 0 || kvb_opts_int(o, "question", &question, err, err_len) < 0)
        return NULL;
    if (chunk < 1 || chunk > (1 << 24)) {
        ERR("finch: chunk=%lld: a chunk is 1 to %d tokens", (long long)chunk, 1 << 24);
        return NULL;
    }
    if (question < 1 || question > 4096) {
        ERR("finch: question=%lld: the question is 1 to 4096 tokens", (long long)question);
        return NULL;
    }
    finch *s = calloc(1, sizeof *s);
    if (s) s->acc = calloc((size_t)c->model->cfg.n_layer * c->model->cfg.n_head_kv, sizeof *s->acc);
    if (!s || !s->acc) {
        free(s);
        ERR("out of memory");
        return NULL;
    }
    s->c = c;
    for (int l = 0; l < c->model->cfg.n_layer; l++) s->windowed |= kvb_layer_window(&c->model->cfg, l) != 0;
    s->chunk = chunk;
    s->question = question;
    s->fork_hooks = (kvb_hooks){.self = s, .sum_rows = finch_sum_rows};
    s->base.budget = *b;
    s->base.imposes_budget = 1;
    return &s->base;
}

const kvb_method_def kvb_method_finch = {
    .name = "finch",
    .summary = "prefills the prompt chunk by chunk, keeping after each the tokens its question's tokens attend most",
    .traits = KVB_NEEDS_BUDGET | KVB_SHARES_PREFILL,
    .create = finch_create,
    .hooks = {.sum_rows = finch_sum_rows, .after_prefill = finch_after_prefill},
    .expected_tokens = finch_expected,
    .describe = finch_describe,
    .destroy = finch_destroy,
    .prefill = finch_prefill,
    .adopt = finch_adopt,
};
