/* round.c — Round Attention (papers/000): round-level KV selection at the watershed layer.
 *
 * Tokens carry the dialogue round they belong to. Layers 0..L_w-1 (the first L_w layers) attend to every
 * round. When a question round begins, the deep layers' (L_w..L-1) KV moves to the host tier; during the
 * question's prefill, layer L_w-1's attention gives the round attention qAtt_k = sum over the question's
 * tokens and all query heads of the attention on round k's tokens (eq. 1), normalised over past rounds; a
 * strategy picks rounds — topk: top 10% (at least 1; the paper's default), fixed: qAtt > 0.1, adaptive:
 * qAtt > mean + k*std — and one packed load brings the selected rounds' KV of every deep layer to the device.
 * Deep layers then attend to the selected rounds plus the current round, for the rest of prefill and for
 * decode. Memory: L_w/L + K/T (1 - L_w/L) of the full cache (eq. 2), reported, not imposed.
 *
 * Choices (flags): lw=N (number of full layers = the paper's 1-based watershed layer; else the calibration
 * profile; else an error), strategy=topk|fixed|adaptive, topk=0.1, threshold=0.1, k=1.0, chunk=512 (single
 * prompts: the prompt is cut into chunk-token rounds from its start, the last (possibly shorter) chunk being the question; the
 * results say so). Budget 100% selects every round (K = T: exact); other budgets are reported, not imposed.
 * History rounds are prefilled exactly (as if computed earlier in the dialogue); the
 * selection is made for the question round.
 *
 * Hybrid models (Gemma 3's sliding-window local layers; docs/methods.md "Hybrid models"): a local layer keeps its
 * window on the device wherever it sits (the engine runs no hook there); the rounds are over the global layers:
 * the watershed layer L_w - 1 must be a global layer (its attention scores the rounds), the deep layers are the
 * global layers from L_w on, and at least one must exist. Eq. 2 becomes the share of the cache the model holds:
 * (sum of the full layers' tokens + the windows + K per deep layer) / (the global layers' tokens + the windows),
 * the paper's formula when no layer is local. */
#include "methods/method.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "methods/profile.h"

typedef struct {
    kvb_method base;
    kvb_ctx *c;
    int lw, strategy; /* 0 topk, 1 fixed, 2 adaptive */
    int first_deep;   /* the first global layer from lw on (lw without local layers) */
    double topk_frac, threshold, k_std;
    int64_t chunk;
    int32_t q_round;  /* round id of the current question, -1 before one */
    int selected, offloaded;
    int n_rounds_total, n_rounds_sel;
    int64_t sel_tokens, cur_tokens;
    char *sel_mask;   /* [max round + 1] */
    int mask_cap;
} round_m;

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

static int round_on_round(void *self, kvb_ctx *c, int32_t r, int is_question, char *err, size_t err_len) {
    round_m *s = self;
    if (!is_question) return 0;
    const int L = c->model->cfg.n_layer, HK = c->model->cfg.n_head_kv;
    s->q_round = r;
    s->selected = 0;
    s->cur_tokens = 0;
    for (int l = s->lw; l < L; l++) {
        if (kvb_layer_window(&c->model->cfg, l)) continue; /* a local layer keeps its window on the device */
        for (int h = 0; h < HK; h++)
            if (kvc_truncate(s->base.vis, l, h, 0, err, err_len)) return -1;
        if (!s->offloaded) {
            prof_begin(c->prof, PROF_D2H, l);
            int rc = kvc_set_layer_tier(c->kv, l, KVB_TIER_HOST, err, err_len);
            prof_end(c->prof, PROF_D2H, l, c->n_past, 0);
            if (rc) return -1;
        }
    }
    s->offloaded = 1;
    return 0;
}

static int round_wants(void *self, kvb_ctx *c, int layer, int64_t n_q) {
    (void)n_q;
    round_m *s = self;
    return s->q_round >= 0 && !s->selected && layer == s->lw - 1 && c->cur_round == s->q_round;
}

/* Pick rounds from normalised scores p[0..n) (entries of absent rounds are < 0). */
static void choose(round_m *s, const double *p, int n, char *mask) {
    int present = 0;
    double mean = 0, var = 0;
    for (int r = 0; r < n; r++)
        if (p[r] >= 0) {
            present++;
            mean += p[r];
        }
    if (!present) return;
    mean /= present;
    for (int r = 0; r < n; r++)
        if (p[r] >= 0) var += (p[r] - mean) * (p[r] - mean);
    double sd = sqrt(var / present);
    if (s->base.budget.kind == KVB_BUDGET_FRACTION && s->base.budget.frac >= 1.0) { /* 100%: K = T */
        for (int r = 0; r < n; r++) mask[r] = p[r] >= 0;
        return;
    }
    if (s->strategy == 0) {
        int k = (int)ceil(s->topk_frac * present - 1e-9);
        if (k < 1) k = 1;
        for (int i = 0; i < k; i++) {
            int best = -1;
            for (int r = 0; r < n; r++)
                if (p[r] >= 0 && !mask[r] && (best < 0 || p[r] > p[best])) best = r;
            if (best >= 0) mask[best] = 1;
        }
        return;
    }
    double cut = s->strategy == 1 ? s->threshold : mean + s->k_std * sd;
    for (int r = 0; r < n; r++)
        if (p[r] >= 0 && p[r] > cut) mask[r] = 1;
}

/* The selected rounds' tokens of every deep (global) layer, every KV head, in one packed load (host -> device). */
static int load_selected(round_m *s, kvb_ctx *c, char *err, size_t err_len) {
    const kvb_config *cfg = &c->model->cfg;
    const int L = cfg->n_layer, HK = cfg->n_head_kv;
    int H = 0;
    int64_t total = 0;
    for (int l = s->lw; l < L; l++)
        if (!kvb_layer_window(cfg, l)) {
            H += HK;
            for (int h = 0; h < HK; h++) total += kvc_n(c->kv, l, h);
        }
    int32_t *idx = malloc((size_t)(total > 0 ? total : 1) * sizeof *idx);
    int *lay = malloc((size_t)(H > 0 ? H : 1) * 2 * sizeof *lay), *hd = lay ? lay + H : NULL;
    const int32_t **lists = malloc((size_t)(H > 0 ? H : 1) * sizeof *lists);
    int64_t *counts = malloc((size_t)(H > 0 ? H : 1) * sizeof *counts), at = 0;
    int rc = idx && lay && lists && counts ? 0 : ERR("out of memory");
    /* Every head of every layer is appended the same rounds in the same slot order (the store writes a token's
     * round to all heads; Round Attention evicts nothing), so the heads' lists are normally one list: a head whose
     * round array equals the previous list's head's (memcmp, far cheaper than the per-slot test) shares that list,
     * which kv_load then sends up once. Any head that differs gets its own list, as before. */
    const int32_t *prev_round = NULL;
    int64_t prev_n = -1, prev_at = 0, prev_m = 0, rows = 0;
    for (int l = s->lw, j = 0; l < L && !rc; l++)
        for (int h = 0; h < HK && !rc && !kvb_layer_window(cfg, l); h++, j++) {
            kvc_view v = kvc_head_view(c->kv, l, h); /* host tier (offloaded when the question began): host reads */
            if (v.tier != KVB_TIER_HOST) { rc = ERR("round: layer %d is not offloaded", l); break; }
            int64_t m = 0;
            if (prev_round && v.n == prev_n && !memcmp(v.round, prev_round, (size_t)v.n * sizeof(int32_t))) {
                lists[j] = idx + prev_at, m = prev_m;
            } else {
                for (int64_t t = 0; t < v.n; t++)
                    if (v.round[t] != s->q_round && v.round[t] < s->mask_cap && s->sel_mask[v.round[t]])
                        idx[at + m++] = (int32_t)t;
                lists[j] = idx + at;
                prev_round = v.round, prev_n = v.n, prev_at = at, prev_m = m;
                at += m;
            }
            lay[j] = l, hd[j] = h, counts[j] = m;
            rows += m;
            if (l == s->first_deep && h == 0) s->sel_tokens = m;
        }
    if (!rc && kvc_bytes(s->base.vis, KVB_TIER_COUNT) == 0) {
        /* The first load: its heads would be allocated at exactly the selection's size, and the question's own
         * rows (appended right after, then one a decode step) would reallocate every deep head twice, the second
         * time in the first decode step (per head four allocations, a copy and four frees that wait for the
         * device). Give them the room the store's growth rule would (a quarter more, plus 64) plus a prefill
         * chunk. */
        int64_t most = 0;
        for (int j = 0; j < H; j++) most = counts[j] > most ? counts[j] : most;
        const int64_t chunk = c->params.n_batch > 0 ? c->params.n_batch : 512;
        kvc_store *vis = kvc_create(L, HK, c->model->cfg.head_dim, c->params.kv_dtype, most + most / 4 + 64 + chunk,
                                    c->be, &c->mem, err, err_len);
        if (!vis) rc = -1;
        else {
            kvc_free(s->base.vis);
            s->base.vis = vis;
        }
    }
    /* the destination heads' allocations before the timed copy: PROF_H2D is the transfer alone, what bench's loads
     * table holds to the pinned copy rate (the lists and the allocations count in the phase around it) */
    if (!rc) rc = kvc_reserve_heads(s->base.vis, H, lay, hd, counts, err, err_len);
    prof_begin(c->prof, PROF_H2D, s->first_deep);
    if (!rc) rc = kvc_load(s->base.vis, c->kv, H, lay, hd, lists, counts, err, err_len);
    prof_end(c->prof, PROF_H2D, s->first_deep, s->sel_tokens, rc ? 0 : rows * kvc_slot_bytes(c->kv));
    free(idx);
    free(lay);
    free(lists);
    free(counts);
    return rc;
}

static int round_observe(void *self, kvb_ctx *c, int layer, const kvb_src *src, const float *probs, int64_t stride,
                         int64_t n_q, char *err, size_t err_len) {
    round_m *s = self;
    const kvb_config *cfg = &c->model->cfg;
    int32_t maxr = s->q_round;
    if (maxr + 1 > s->mask_cap) {
        free(s->sel_mask);
        s->mask_cap = maxr + 1;
        s->sel_mask = calloc((size_t)s->mask_cap, 1);
        if (!s->sel_mask) return ERR("out of memory");
    }
    memset(s->sel_mask, 0, (size_t)s->mask_cap);
    /* eq. 1 on the backend: per round, the attention of the question's tokens (all heads) on its tokens */
    kvb_backend *be = c->be;
    const size_t score_bytes = (size_t)s->mask_cap * sizeof(double), flag_bytes = (size_t)s->mask_cap * sizeof(int32_t);
    double *score = calloc((size_t)s->mask_cap, sizeof *score);
    int32_t *present = calloc((size_t)s->mask_cap, sizeof *present);
    double *score_d = kvb_method_alloc(c, score_bytes);
    int32_t *present_d = kvb_method_alloc(c, flag_bytes);
    const int32_t *rounds[KVB_MAX_KV_HEADS];
    int64_t n[KVB_MAX_KV_HEADS];
    for (int g = 0; g < cfg->n_head_kv; g++) {
        rounds[g] = kvc_head_view(c->kv, layer, g).round;
        n[g] = src[g].n;
    }
    int rc = score && present && score_d && present_d ? 0 : ERR("out of memory");
    rc = rc || be->round_scores(be, score_d, present_d, s->mask_cap, probs, stride, cfg->n_head, cfg->n_head_kv, n_q,
                                rounds, n, s->q_round, err, err_len) ||
         be->copy(be, score, score_d, score_bytes, KVB_COPY_D2H, err, err_len) ||
         be->copy(be, present, present_d, flag_bytes, KVB_COPY_D2H, err, err_len);
    /* the wait that also covers the host-tier rows load_selected reads on the host (the device's KV writer's, in
     * the stream's order): the engine's wait before every layer's hooks is off (KVB_NO_HOST_READS) */
    if (!rc && be->sync && be->sync(be)) rc = ERR("%s", be->error);
    kvb_method_release(c, score_d, score_bytes);
    kvb_method_release(c, present_d, flag_bytes);
    if (rc) {
        free(score);
        free(present);
        return -1;
    }
    double tot = 0;
    int n_present = 0;
    for (int r = 0; r < s->mask_cap; r++)
        if (present[r]) {
            tot += score[r];
            n_present++;
        }
    for (int r = 0; r < s->mask_cap; r++) score[r] = present[r] ? (tot > 0 ? score[r] / tot : 0) : -1.0;
    choose(s, score, s->mask_cap, s->sel_mask);
    s->n_rounds_total = n_present;
    s->n_rounds_sel = 0;
    for (int r = 0; r < s->mask_cap; r++) s->n_rounds_sel += s->sel_mask[r];
    free(score);
    free(present);
    s->selected = 1;
    return load_selected(s, c, err, err_len);
}

static int round_select(void *self, kvb_ctx *c, int layer, kvb_src *src, int64_t n_q, char *err, size_t err_len) {
    round_m *s = self;
    if (s->q_round < 0 || !s->selected || layer < s->lw) return 0;
    if (layer == s->first_deep) s->cur_tokens += n_q;
    return kvb_vis_attend_packed(&s->base, c, layer, src, n_q, err, err_len);
}

static int round_after_prefill(void *self, kvb_ctx *c, char *err, size_t err_len) {
    (void)err;
    (void)err_len;
    round_m *s = self;
    s->base.n_prompt = c->n_past;
    return 0;
}

static int64_t round_expected(kvb_method *m, kvb_ctx *c, int layer) {
    round_m *s = (round_m *)m;
    if (layer < s->lw || s->q_round < 0) return c->n_past;
    if (!s->selected) return 0;
    return s->sel_tokens + s->cur_tokens;
}

/* eq. 2: L_w/L + K/T (1 - L_w/L), K/T = tokens of the selected rounds and the current one over all tokens; on a
 * hybrid model the share of the cache it holds (the header), which is eq. 2 when no layer is local */
static double round_formula(kvb_method *m, kvb_ctx *c) {
    round_m *s = (round_m *)m;
    if (s->q_round < 0 || !s->selected || c->n_past == 0) return 1.0;
    const kvb_config *cfg = &c->model->cfg;
    double held = 0, whole = 0;
    for (int l = 0; l < cfg->n_layer; l++) {
        const double full = (double)kvb_ctx_full_tokens(c, l);
        whole += full;
        held += l < s->lw || kvb_layer_window(cfg, l) ? full : (double)(s->sel_tokens + s->cur_tokens);
    }
    return whole > 0 ? held / whole : 1.0;
}

static void round_describe(kvb_method *m, char *buf, size_t cap) {
    round_m *s = (round_m *)m;
    static const char *st[] = {"topk", "fixed", "adaptive"};
    snprintf(buf, cap, "lw=%d strategy=%s rounds=%d/%d selected_tokens=%lld", s->lw, st[s->strategy],
             s->n_rounds_sel, s->n_rounds_total, (long long)s->sel_tokens);
}

static void round_destroy(kvb_method *m) {
    round_m *s = (round_m *)m;
    kvc_free(s->base.vis);
    free(s->sel_mask);
    free(s);
}

/* Single prompt: chunk-token rounds from the start (aligned with the engine's prefill chunks, so a 100%
 * budget is bit-exact); the last, possibly shorter, chunk is the question. */
static int round_prefill(kvb_method *m, kvb_ctx *c, const int32_t *ids, int64_t n, char *err, size_t err_len) {
    round_m *s = (round_m *)m;
    kvb_rounds r = {.ids = (int32_t *)ids, .n = n};
    int rc = kvb_rounds_chunk(&r, s->chunk, err, err_len) || kvb_prefill_rounds(c, &r, 0, n, NULL, err, err_len);
    if (!rc)
        snprintf(m->note, sizeof m->note, "single prompt: rounds are %lld-token chunks (%d rounds)", (long long)s->chunk,
                 r.n_rounds);
    free(r.round_end);
    return rc ? -1 : 0;
}

/* The profile section Round Attention reads: its watershed layer, unless lw= is given (registry). */
static const char *round_profile(kvb_opts *o) { return kvb_opts_get(o, "lw") ? NULL : "round"; }

/* On a hybrid model: the watershed layer lw - 1 is global and a global layer follows it (the header); first_deep. */
static int check_watershed(round_m *s, const kvb_config *cfg, char *err, size_t err_len) {
    s->first_deep = -1;
    for (int l = s->lw; l < cfg->n_layer && s->first_deep < 0; l++)
        if (!kvb_layer_window(cfg, l)) s->first_deep = l;
    if (kvb_layer_window(cfg, s->lw - 1) || s->first_deep < 0) {
        char globals[256];
        int n = 0;
        globals[0] = 0;
        for (int l = 0; l < cfg->n_layer && n >= 0 && (size_t)n < sizeof globals; l++)
            if (!kvb_layer_window(cfg, l)) n += snprintf(globals + n, sizeof globals - (size_t)n, "%s%d", n ? "," : "", l);
        if (kvb_layer_window(cfg, s->lw - 1))
            return ERR("round: lw=%d puts the watershed on layer %d, a sliding-window (local) layer; on this hybrid "
                       "model it must be a global layer (global layers: %s; lw = one more)", s->lw, s->lw - 1, globals);
        return ERR("round: lw=%d leaves no global layer after the watershed to select rounds for (global layers: %s); "
                   "too few global layers for Round Attention unless lw is lower", s->lw, globals);
    }
    return 0;
}

static kvb_method *round_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len) {
    const kvb_config *cfg = &c->model->cfg;
    int n_global = 0;
    for (int l = 0; l < cfg->n_layer; l++) n_global += !kvb_layer_window(cfg, l);
    if (n_global < 2) {
        ERR("round: too few global layers for Round Attention (%d of %d layers; the others are sliding-window layers): "
            "it needs a global watershed layer and a global layer after it", n_global, cfg->n_layer);
        return NULL;
    }
    round_m *s = calloc(1, sizeof *s);
    if (!s) { ERR("out of memory"); return NULL; }
    s->c = c;
    s->q_round = -1;
    s->topk_frac = 0.1;
    s->threshold = 0.1;
    s->k_std = 1.0;
    s->chunk = 512;
    int64_t v;
    int r;
    if ((r = kvb_opts_int(o, "lw", &v, err, err_len)) < 0) goto fail;
    if (r) {
        if (v < 1 || v >= cfg->n_layer) { ERR("round: lw=%lld is outside the model's layers (1..%d)", (long long)v, cfg->n_layer - 1); goto fail; }
        s->lw = (int)v;
    } else {
        int got = kvb_profile_round_lw(c->model, &s->lw, err, err_len);
        if (got < 0) goto fail;
        if (!got) {
            ERR("round: no watershed layer for this model: run `kvbench calibrate round` or pass --method-opt lw=N");
            goto fail;
        }
        if (s->lw < 1 || s->lw >= cfg->n_layer) { ERR("round: calibration profile's lw=%d is outside the model's layers", s->lw); goto fail; }
    }
    if (check_watershed(s, cfg, err, err_len)) goto fail;
    const char *st = kvb_opts_get(o, "strategy");
    if (st) {
        if (!strcmp(st, "topk")) s->strategy = 0;
        else if (!strcmp(st, "fixed")) s->strategy = 1;
        else if (!strcmp(st, "adaptive")) s->strategy = 2;
        else { ERR("round: strategy must be topk, fixed or adaptive"); goto fail; }
    }
    if (kvb_opts_double(o, "topk", &s->topk_frac, err, err_len) < 0 ||
        kvb_opts_double(o, "threshold", &s->threshold, err, err_len) < 0 || kvb_opts_double(o, "k", &s->k_std, err, err_len) < 0 ||
        kvb_opts_int(o, "chunk", &s->chunk, err, err_len) < 0)
        goto fail;
    if (!(s->topk_frac > 0 && s->topk_frac <= 1)) { ERR("round: topk must be in (0, 1]"); goto fail; }
    if (s->chunk < 1) { ERR("round: chunk must be >= 1"); goto fail; }
    s->base.vis = kvc_create(cfg->n_layer, cfg->n_head_kv, cfg->head_dim, c->params.kv_dtype, 0, c->be, &c->mem, err,
                             err_len);
    if (!s->base.vis) goto fail;
    s->base.budget = *b;
    s->base.imposes_budget = 0;
    return &s->base;
fail:
    round_destroy(&s->base);
    return NULL;
}

const kvb_method_def kvb_method_round = {
    .name = "round",
    .summary = "Round Attention: rounds picked at the watershed layer, deep layers' on host",
    /* no host reads in the hooks but round_observe's, which syncs before it reads the round ids (load_selected) */
    .traits = KVB_OWN_PREFILL | KVB_NO_HOST_READS,
    .profile = round_profile,
    .create = round_create,
    .hooks = {.select = round_select, .wants_probs = round_wants, .observe = round_observe, .after_prefill = round_after_prefill, .on_round = round_on_round},
    .expected_tokens = round_expected,
    .formula_frac = round_formula,
    .describe = round_describe,
    .destroy = round_destroy,
    .prefill = round_prefill,
};
