/* omnikv.c — OmniKV (papers/004): token-dropping-free dynamic context selection.
 *
 * Filter layers F (paper: {2, 8, 18} of 32 for Llama-3-8B). Layers before the first filter layer, every
 * filter layer and the layer right after it attend to the whole cache. At each decode step a filter layer
 * scores every token (eq. 3-4: max over query heads of the attention of the observation window, weighted
 * by the selector's alpha: `last` = the current query only, `uniform` / `exp` over a 16-token window), takes
 * the top-k, and the sparse layers up to the next filter layer attend only to those tokens (plus the tokens
 * of the current step). Prefill is exact (the paper's prefill is full attention).
 *
 * Budget (Mem%, sec. 5): full layers hold F_share = (2|F| + |L0|) / L of the cache; the sparse layers' token
 * budget is T = (Mem% - F_share) / (1 - F_share) x prompt tokens. A Mem% below F_share is an error (the default
 * layers first drop filter layers to fit: below).
 *
 * Choices (flags): layers=a;b;c, default the paper's layers scaled to the model's depth (round(l x L / 32):
 * 2;8;17 of 30 layers, 2;6;14 of 24). When a Mem% budget is below the scaled layers' F_share, the default drops
 * filter layers from the last one until F_share <= Mem% (24 layers at 30%: 2;6;14 holds 8/24 = 33%, so 2;6 with
 * 6/24 = 25%), keeping at least one; only when even the first alone does not fit is it an error, naming the
 * smallest budget that would. The layers used are in the method's parameters (describe: layers=...) and the note
 * says what was dropped. Given layers (layers=a;b;c, layers=profile) are never changed: a budget below their
 * F_share stays an error. Or layers=profile for the calibrated ones (`kvbench calibrate omnikv`). The default is
 * not the profile because on the default model the calibrated 2;5;8 found no needle where 2;8;17 found 12/15
 * (README), and every command (run, bench, fidelity, serve) must use the same layers; selector=last|uniform|exp; window=16; offload=1 (default: the paper's
 * Mem% is GPU-resident KV, which only holds with offload): sparse layers' KV lives in the host tier and each
 * filter layer does one packed load of the selected tokens for the layers it serves into a device buffer;
 * offload=0 keeps everything on the device and narrows attention with index lists (no memory saving).
 * The initial selection is made when the prompt is in (from the prompt's last queries), so the device holds
 * the budget from the end of prefill on.
 *
 * The end of prefill works on the layers kvb_prefill_layers names, so a server may run it layer by layer, right after
 * each layer's attention (KVB_LAYER_LOCAL; engine/model.h kvb_ctx_end_prefill_by_layer): the prefill is exact and no
 * later layer's input depends on it. T and the buffers come at the first global layer; a sparse layer moves to the
 * host tier as it ends; a filter layer selects and loads its sparse layers once the last of them has ended (its KV
 * and observation-window rows do not change after its attention, so the kept sets, logits and tokens are the end of
 * prefill's, tests/test_layer_prefill.c). What each layer keeps after the prefill is the server's promise
 * (kept_tokens: the prompt in full layers, T in sparse ones; with offload=0 the prompt everywhere, nothing saved).
 *
 * Hybrid models (Gemma 3's sliding-window local layers; docs/methods.md "Hybrid models"): a local layer keeps its
 * window and takes no role (the engine runs no hook there); the roles are dealt over the global layers in order:
 * global layers before the first filter layer, each filter layer and the next global layer after it are full, the
 * others sparse. Filter layers must be global (layers= naming a local one is an error); the default scales the
 * paper's layers over the global layers' count. The budget is of the cache the model holds: with G_f full and G_s
 * sparse global layers at n tokens and the local layers' windows W_loc (tokens summed over them), the sparse layers
 * keep T = (Mem% (G n + W_loc) - G_f n - W_loc) / G_s tokens; a Mem% below (G_f n + W_loc) / (G n + W_loc) is an
 * error naming the windows' share. Without local layers all of this is the paper's rule above. */
#include "methods/method.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "methods/profile.h"

#define MAX_FILTER 8

typedef struct {
    kvb_method base;
    kvb_ctx *c;
    int n_filter, filter[MAX_FILTER];
    int *kind;       /* per layer: 0 full, 1 filter, 2 sparse, 3 local (sliding window: keeps it, no role) */
    int *served_by;  /* sparse layer -> filter layer index that selects for it */
    int first_global; /* the first global layer: the end of prefill starts there (the budget, the buffers) */
    int group_end[MAX_FILTER]; /* per filter layer: the last layer its selection needs ended (its last sparse layer,
                                  or itself): its packed load waits for it */
    int selector;    /* 0 last, 1 uniform, 2 exp */
    int window, offload;
    double full_share; /* G_f / G: the full global layers' share of the global layers (the whole cache without
                          local layers; a hybrid model's windows add to it, see held_share) */
    int n_global, n_full_global, n_sparse;
    int64_t T;       /* token budget of sparse layers at the end of prefill */
    double tp;       /* |T| / |p|: the sparse layers' share (Mem% budgets track the sequence: 100% = exact) */
    int32_t **sel;   /* per filter layer: selected slots (ascending; device, n_ctx entries) */
    int64_t *n_sel;
    int32_t *sel_host; /* offload: the host copy of a selection the packed load gathers by (n_ctx entries) */
    /* offload: a packed load's head table (layer, head, list, count per entry; n_layer x n_head_kv entries),
     * allocated once with sel_host and refilled by each load */
    int *load_lh;
    const int32_t **load_list;
    int64_t *load_n;
    float *score;     /* a filter layer's token scores (device, n_ctx entries) */
    int32_t *idx_buf; /* offload=0: per filter layer, the index list its sparse layers attend by [MAX_FILTER][idx_cap]
                         (device): the selection, then the current step's slots */
    int64_t idx_cap;
    int64_t idx_len[MAX_FILTER]; /* the store length idx_buf[f] was built for (-1: rebuild), and its n_q */
    int64_t idx_nq[MAX_FILTER];
    int64_t step_n;   /* tokens of the current step appended to the packed buffers */
} omnikv;

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)
enum { K_FULL = 0, K_FILTER = 1, K_SPARSE = 2, K_LOCAL = 3 };

/* the global layers' numbers in order (all layers on a model without sliding windows); their count */
static int global_layers(const kvb_config *cfg, int *out) {
    int n = 0;
    for (int l = 0; l < cfg->n_layer; l++)
        if (!kvb_layer_window(cfg, l)) out[n++] = l;
    return n;
}

/* a filter layer must be a global layer: 0, or -1 + err naming the layer */
static int check_global(const kvb_config *cfg, int l, char *err, size_t err_len) {
    if (!kvb_layer_window(cfg, l)) return 0;
    return ERR("omnikv: filter layer %d is a sliding-window (local) layer of window %d; filter layers are global "
               "layers", l, kvb_layer_window(cfg, l));
}

static int parse_layers(omnikv *s, const char *v, int n_layer, char *err, size_t err_len) {
    s->n_filter = 0;
    const char *p = v;
    while (*p) {
        char *end;
        long l = strtol(p, &end, 10);
        if (end == p) return ERR("omnikv: layers=%s is not a ';'-separated list of layer numbers", v);
        if (l < 0 || l >= n_layer) return ERR("omnikv: filter layer %ld outside the model's layers 0..%d", l, n_layer - 1);
        if (s->n_filter >= MAX_FILTER) return ERR("omnikv: at most %d filter layers", MAX_FILTER);
        if (s->n_filter && l <= s->filter[s->n_filter - 1]) return ERR("omnikv: filter layers must be ascending");
        s->filter[s->n_filter++] = (int)l;
        p = *end == ';' ? end + 1 : end;
        if (*end && *end != ';') return ERR("omnikv: layers=%s is not a ';'-separated list", v);
    }
    if (!s->n_filter) return ERR("omnikv: layers= is empty");
    return 0;
}

/* Roles over the global layers in order (the header): full before the first filter layer, filter, full for the
 * next global layer after a filter layer, sparse otherwise (served by the last filter layer before it). */
static void classify(omnikv *s, const kvb_config *cfg) {
    int n_full = 0, prev_global = -1;
    s->n_global = 0;
    s->first_global = -1;
    for (int f = 0; f < s->n_filter; f++) s->group_end[f] = s->filter[f];
    for (int l = 0; l < cfg->n_layer; l++) {
        s->served_by[l] = -1;
        if (kvb_layer_window(cfg, l)) {
            s->kind[l] = K_LOCAL;
            continue;
        }
        s->kind[l] = K_SPARSE;
        if (l < s->filter[0]) s->kind[l] = K_FULL;
        for (int f = 0; f < s->n_filter; f++) {
            if (l == s->filter[f]) s->kind[l] = K_FILTER;
            else if (prev_global >= 0 && prev_global == s->filter[f]) s->kind[l] = K_FULL;
            if (s->kind[l] == K_SPARSE && l > s->filter[f]) s->served_by[l] = f;
        }
        if (s->kind[l] == K_SPARSE) s->group_end[s->served_by[l]] = l;
        n_full += s->kind[l] != K_SPARSE;
        if (s->first_global < 0) s->first_global = l;
        s->n_global++;
        prev_global = l;
    }
    s->n_full_global = n_full;
    s->n_sparse = s->n_global - n_full;
    s->full_share = s->n_global ? (double)n_full / s->n_global : 1.0;
}

/* The share of the cache held at n tokens (global layers n each, local layers windows_tokens in all) when the sparse
 * global layers keep t tokens each. */
static double held_share(const omnikv *s, int64_t n, int64_t windows_tokens, double t) {
    const double whole = (double)s->n_global * (double)n + (double)windows_tokens;
    if (whole <= 0) return 1.0;
    return ((double)s->n_full_global * (double)n + (double)windows_tokens + s->n_sparse * t) / whole;
}

/* the local layers' tokens summed at n tokens (each its window, or the sequence while shorter) */
static int64_t windows_tokens(const kvb_config *cfg, int64_t n) {
    int64_t w = 0;
    for (int l = 0; l < cfg->n_layer; l++)
        if (kvb_layer_window(cfg, l)) w += kvb_full_tokens_at(cfg, l, n);
    return w;
}

/* the paper's {2, 8, 18} of 32 layers scaled to the global layers' count (all layers without local ones) */
static void default_layers(omnikv *s, const kvb_config *cfg) {
    static const int paper[3] = {2, 8, 18};
    int gl[KVB_MAX_LAYERS];
    const int G = global_layers(cfg, gl);
    s->n_filter = 0;
    for (int i = 0; i < 3 && G > 0; i++) {
        int j = (int)lround(paper[i] * (double)G / 32.0);
        if (j >= G) j = G - 1;
        if (s->n_filter && gl[j] <= s->filter[s->n_filter - 1]) continue;
        s->filter[s->n_filter++] = gl[j];
    }
}

static int layers_str(const omnikv *s, int n_filter, char *buf, size_t cap) {
    int n = 0;
    buf[0] = 0;
    for (int f = 0; f < n_filter && n >= 0 && (size_t)n < cap; f++)
        n += snprintf(buf + n, cap - (size_t)n, "%s%d", f ? ";" : "", s->filter[f]);
    return n;
}

/* The default layers under a Mem% budget (the header's rule): the paper's scaled layers, the last filter layer
 * dropped while the full layers' share exceeds the budget, at least one kept. */
static int fit_default_layers(omnikv *s, const kvb_config *cfg, const kvb_budget *b, char *err, size_t err_len) {
    const int n_layer = cfg->n_layer;
    default_layers(s, cfg);
    if (!s->n_filter) return ERR("omnikv: the model has no global layer (every layer is a sliding-window layer)");
    classify(s, cfg);
    if (b->kind != KVB_BUDGET_FRACTION) return 0;
    const int n_scaled = s->n_filter;
    const double scaled_share = s->full_share;
    while (s->n_filter > 1 && b->frac < s->full_share - 1e-9) {
        s->n_filter--;
        classify(s, cfg);
    }
    char all[64], kept[64];
    layers_str(s, n_scaled, all, sizeof all);
    layers_str(s, s->n_filter, kept, sizeof kept);
    if (b->frac < s->full_share - 1e-9)
        return ERR("omnikv: budget %.1f%% is below the share of the full-attention layers even with one filter layer "
                   "(layers=%s: %.1f%% of %d %slayers); the smallest budget that fits is %.1f%%",
                   100 * b->frac, kept, 100 * s->full_share, s->n_global, s->n_global < n_layer ? "global " : "",
                   ceil(1000 * s->full_share - 1e-6) / 10);
    if (s->n_filter < n_scaled) {
        /* the layer lists are short (at most MAX_FILTER numbers): the note never fills; a cut one would still read */
        int n = snprintf(s->base.note, sizeof s->base.note, "default layers %s (the paper's 2;8;18 of 32 scaled) ", all);
        if (n > 0 && (size_t)n < sizeof s->base.note)
            snprintf(s->base.note + n, sizeof s->base.note - (size_t)n, "hold %.1f%% > budget %.1f%%: layers=%s (%.1f%%)",
                     100 * scaled_share, 100 * b->frac, kept, 100 * s->full_share);
    }
    return 0;
}

/* Token scores S_j = sum_w alpha_w max_h A[h, w, j] over the window rows of a filter layer (on the backend).
 * given: the probabilities of the layer's own attention call for the current query (the `last` selector in
 * decode), else they are computed for the window rows. */
static int filter_scores(omnikv *s, kvb_ctx *c, int l, const float *given, int64_t given_stride, float *score,
                         int64_t n, char *err, size_t err_len) {
    const kvb_config *cfg = &c->model->cfg;
    int w = s->selector == 0 ? 1 : (c->obs_n < s->window ? c->obs_n : s->window);
    const float *q = c->obs_q + ((size_t)l * c->obs_cap + (c->obs_n - w)) * cfg->q_dim;
    const int32_t *qpos = c->obs_pos + (c->obs_n - w);
    float *probs = NULL;
    const float *pr = given;
    int64_t stride = given_stride;
    if (!given) {
        if (kvb_attn_probs(c, l, q, qpos, w, NULL, &probs, &stride, NULL, err, err_len)) return -1;
        pr = probs;
    }
    double alpha[1024]; /* window <= 1024 (read_selector) */
    for (int t = 0; t < w; t++) alpha[t] = s->selector == 2 ? pow(2.0, (double)(t + 1 - w)) : 1.0;
    int rc = c->be->probs_reduce(c->be, score, n, pr, stride, cfg->n_head, cfg->n_head_kv, w, n,
                                 s->selector == 2 ? alpha : NULL, KVB_REDUCE_MAX_HEADS, 0, err, err_len);
    if (probs) kvb_attn_probs_free(c, probs, w, stride);
    return rc;
}

/* Select the top-T of the tokens before `upto` at filter layer index f and (offload) load them packed: the
 * selection comes down to the host (the paper's index list), which gathers the host-tier rows into one copy up. */
static int select_and_load(omnikv *s, kvb_ctx *c, int f, int64_t upto, const float *probs, int64_t stride, char *err,
                           size_t err_len) {
    int l = s->filter[f];
    kvb_backend *be = c->be;
    const int HK = c->model->cfg.n_head_kv;
    int64_t k = s->base.budget.kind == KVB_BUDGET_TOKENS ? s->T : (int64_t)llround(s->tp * (double)upto);
    if (k < 1) k = 1;
    if (k > upto) k = upto;
    if (filter_scores(s, c, l, probs, stride, s->score, upto, err, err_len) ||
        be->topk_idx(be, s->sel[f], s->score, upto, k, err, err_len))
        return -1;
    s->n_sel[f] = k;
    s->idx_len[f] = -1; /* a new selection: the sparse layers' list is rebuilt */
    if (!s->offload) return 0;
    /* the selection down (a wait for the filter layer's work: the selection's phase), the sparse heads emptied and
     * given room; then PROF_H2D times the transfer alone, what bench's loads table holds to the pinned copy rate */
    if (be->copy(be, s->sel_host, s->sel[f], (size_t)k * sizeof(int32_t), KVB_COPY_D2H, err, err_len) ||
        (be->sync && be->sync(be)))
        return be->error[0] ? ERR("%s", be->error) : -1;
    /* every sparse layer this filter serves, every KV head: one packed load */
    const int L = c->model->cfg.n_layer;
    int *lay = s->load_lh, *hd = s->load_lh + L * HK, m = 0, rc = 0;
    for (int j = 0; j < L && !rc; j++) {
        if (s->kind[j] != K_SPARSE || s->served_by[j] != f) continue;
        for (int h = 0; h < HK && !rc; h++) {
            rc = kvc_truncate(s->base.vis, j, h, 0, err, err_len);
            lay[m] = j, hd[m] = h, s->load_list[m] = s->sel_host, s->load_n[m] = k, m++;
        }
    }
    if (!rc) rc = kvc_reserve_heads(s->base.vis, m, lay, hd, s->load_n, err, err_len);
    prof_begin(c->prof, PROF_H2D, l);
    if (!rc) rc = kvc_load(s->base.vis, c->kv, m, lay, hd, s->load_list, s->load_n, err, err_len);
    prof_end(c->prof, PROF_H2D, l, k, rc ? 0 : (int64_t)m * k * kvc_slot_bytes(c->kv));
    return rc;
}

/* The sparse layers' budget at the end of an n-token prompt (the header's rule): T tokens, and for a Mem% budget tp,
 * the share that tracks the sequence (0 for a token budget). -1 + err when the budget cannot be met at n. */
static int sparse_budget(const omnikv *s, const kvb_config *cfg, int64_t n, double *tp, int64_t *T, char *err,
                         size_t err_len) {
    *tp = 0.0;
    if (s->base.budget.kind == KVB_BUDGET_TOKENS) {
        if (s->base.budget.tokens > n)
            return ERR("budget of %lld tokens is more than the prompt's %lld tokens", (long long)s->base.budget.tokens,
                       (long long)n);
        *T = s->base.budget.tokens;
        return 0;
    }
    const double f = s->base.budget.frac;
    const int64_t w = windows_tokens(cfg, n);
    const double floor_share = held_share(s, n, w, 0.0);
    if (f < floor_share - 1e-9) {
        if (w > 0)
            return ERR("omnikv: budget %.1f%% is below the share of its full-attention layers and the local layers' "
                       "windows in the cache the model holds at %lld tokens (%.1f%%, the windows %.1f%%)", 100 * f,
                       (long long)n, 100 * floor_share, 100 * (double)w / ((double)s->n_global * n + (double)w));
        return ERR("omnikv: budget %.1f%% is below the share of its full-attention layers (%.1f%%)", 100 * f,
                   100 * floor_share);
    }
    /* T from f (G n + W_loc) = G_f n + W_loc + G_s T (the header); the paper's (f - F) / (1 - F) n without windows */
    *tp = s->n_sparse > 0 ? (f - floor_share) * ((double)s->n_global * n + (double)w) / ((double)s->n_sparse * n) : 1.0;
    if (*tp > 1.0) *tp = 1.0;
    *T = (int64_t)llround(*tp * (double)n);
    if (*T < 1) *T = 1;
    if (*T > n) *T = n;
    return 0;
}

/* The start of the end of prefill, once (at the first global layer): the budget and the buffers. */
static int begin_end_of_prefill(omnikv *s, kvb_ctx *c, char *err, size_t err_len) {
    const kvb_config *cfg = &c->model->cfg;
    const int64_t n = c->n_past;
    s->base.n_prompt = n;
    if (sparse_budget(s, cfg, n, &s->tp, &s->T, err, err_len)) return -1;
    for (int f = 0; f < s->n_filter; f++) { /* k grows with the sequence */
        if (!s->sel[f]) s->sel[f] = kvb_method_alloc(c, (size_t)c->params.n_ctx * sizeof(int32_t));
        if (!s->sel[f]) return ERR("out of memory");
    }
    if (!s->score) s->score = kvb_method_alloc(c, (size_t)c->params.n_ctx * sizeof(float));
    if (!s->score) return ERR("out of memory");
    if (s->offload && !s->sel_host) {
        const size_t heads = (size_t)cfg->n_layer * (size_t)cfg->n_head_kv;
        s->sel_host = malloc((size_t)c->params.n_ctx * sizeof(int32_t));
        s->load_lh = malloc(2 * heads * sizeof *s->load_lh);
        s->load_list = malloc(heads * sizeof *s->load_list);
        s->load_n = malloc(heads * sizeof *s->load_n);
        if (!s->sel_host || !s->load_lh || !s->load_list || !s->load_n) {
            free(s->sel_host), free(s->load_lh), free(s->load_list), free(s->load_n);
            s->sel_host = NULL, s->load_lh = NULL, s->load_list = NULL, s->load_n = NULL;
            return ERR("out of memory");
        }
    }
    s->step_n = 0;
    if (s->offload && kvc_bytes(s->base.vis, KVB_TIER_COUNT) == 0) {
        /* The packed buffer's heads would be allocated at exactly the first selection's size, so the first decode
         * step's append of its own row reallocated every sparse head (four allocations, a copy and four frees
         * that wait for the device, per head). Start them with the room the store's growth rule would give them
         * (a quarter more, plus 64): the first selection, its growth and the step's rows fit. (Made at the first
         * layer's end: a head takes memory only when a load fills it.) */
        int64_t k0 = s->base.budget.kind == KVB_BUDGET_TOKENS ? s->T : (int64_t)llround(s->tp * (double)n);
        if (k0 < 1) k0 = 1;
        if (k0 > n) k0 = n;
        kvc_store *vis = kvc_create(cfg->n_layer, cfg->n_head_kv, cfg->head_dim, c->params.kv_dtype, k0 + k0 / 4 + 64,
                                    c->be, &c->mem, err, err_len);
        if (!vis) return -1;
        kvc_free(s->base.vis);
        s->base.vis = vis;
    }
    return 0;
}

/* The end of prefill over the layers kvb_prefill_layers names: every layer at the end of prefill, or one right after
 * its attention (the trait KVB_LAYER_LOCAL; each layer's end needs only that layer and earlier ones, and no later
 * layer's input depends on it). A sparse layer moves to the host tier as it ends; a filter layer selects for its
 * sparse layers and loads them packed once the last of them has ended (its group_end), from the filter layer's
 * observation window and KV, which nothing changes after its attention: the same selection and loads as at the end
 * of prefill. */
static int omnikv_after_prefill(void *self, kvb_ctx *c, char *err, size_t err_len) {
    omnikv *s = self;
    const int64_t n = c->n_past;
    int from, to;
    kvb_prefill_layers(c, &from, &to);
    if (from <= s->first_global && s->first_global < to && begin_end_of_prefill(s, c, err, err_len)) return -1;
    for (int l = from; l < to && s->offload; l++)
        if (s->kind[l] == K_SPARSE) {
            prof_begin(c->prof, PROF_D2H, l);
            int rc = kvc_set_layer_tier(c->kv, l, KVB_TIER_HOST, err, err_len);
            prof_end(c->prof, PROF_D2H, l, n, 0);
            if (rc) return -1;
        }
    for (int f = 0; f < s->n_filter; f++)
        if (from <= s->group_end[f] && s->group_end[f] < to && select_and_load(s, c, f, n, NULL, 0, err, err_len))
            return -1;
    return 0;
}

static int filter_index(const omnikv *s, int layer) {
    int f = 0;
    while (s->filter[f] != layer) f++;
    return f;
}

/* window selectors: score the window's queries before the filter layer's attention */
static int omnikv_pre_attend(void *self, kvb_ctx *c, int layer, const float *q, int64_t n_q, char *err,
                             size_t err_len) {
    (void)q;
    omnikv *s = self;
    if (c->in_prefill || s->kind[layer] != K_FILTER) return 0;
    s->step_n = n_q;
    if (s->selector == 0 && n_q == 1) return 0; /* `last`: from the attention call itself (observe) */
    return select_and_load(s, c, filter_index(s, layer), kvc_n(c->kv, layer, 0) - n_q, NULL, 0, err, err_len);
}

static int omnikv_wants(void *self, kvb_ctx *c, int layer, int64_t n_q) {
    omnikv *s = self;
    return !c->in_prefill && s->kind[layer] == K_FILTER && s->selector == 0 && n_q == 1;
}

/* `last` selector: the filter layer's own probabilities for the current query (slots in position order) */
static int omnikv_observe(void *self, kvb_ctx *c, int layer, const kvb_src *src, const float *probs, int64_t stride,
                          int64_t n_q, char *err, size_t err_len) {
    (void)src;
    omnikv *s = self;
    return select_and_load(s, c, filter_index(s, layer), kvc_n(c->kv, layer, 0) - n_q, probs, stride, err, err_len);
}

static int omnikv_select(void *self, kvb_ctx *c, int layer, kvb_src *src, int64_t n_q, char *err, size_t err_len) {
    omnikv *s = self;
    if (c->in_prefill || s->kind[layer] != K_SPARSE) return 0;
    const int HK = c->model->cfg.n_head_kv;
    int f = s->served_by[layer];
    int64_t len = kvc_n(c->kv, layer, 0);
    if (s->offload) {
        /* the current step's K/V rows join the packed buffer (written to the host store as well) */
        return kvb_vis_attend_packed(&s->base, c, layer, src, n_q, err, err_len);
    }
    int64_t need = s->n_sel[f] + n_q;
    const size_t row = sizeof(int32_t) * MAX_FILTER;
    if (need > s->idx_cap) {
        kvb_method_release(c, s->idx_buf, (size_t)s->idx_cap * row);
        /* room for the selection's growth (a Mem% budget's k grows with the sequence): no reallocation, which
         * waits for the device, every few steps */
        s->idx_cap = need + need / 4 + 64;
        s->idx_buf = kvb_method_alloc(c, (size_t)s->idx_cap * row);
        if (!s->idx_buf) return ERR("out of memory");
        for (int i = 0; i < MAX_FILTER; i++) s->idx_len[i] = -1;
    }
    /* Every sparse layer a filter layer serves attends to the same list: its selection, then the slots of the
     * current step (the store of each layer holds the whole sequence, so the same slots). Built at the first of
     * them in a step, reused by the others: two ops a filter layer and step instead of two a sparse layer. */
    int32_t *idx = s->idx_buf + (size_t)f * s->idx_cap;
    if (s->idx_len[f] != len || s->idx_nq[f] != n_q) {
        if (c->be->copy(c->be, idx, s->sel[f], (size_t)s->n_sel[f] * sizeof(int32_t), KVB_COPY_D2D, err, err_len) ||
            c->be->iota(c->be, idx + s->n_sel[f], (int32_t)(len - n_q), n_q, err, err_len))
            return -1;
        s->idx_len[f] = len, s->idx_nq[f] = n_q;
    }
    for (int h = 0; h < HK; h++) {
        src[h].idx = idx;
        src[h].n_idx = need;
    }
    return 0;
}

static int64_t omnikv_expected(kvb_method *m, kvb_ctx *c, int layer) {
    omnikv *s = (omnikv *)m;
    if (c->in_prefill || s->kind[layer] != K_SPARSE) return c->n_past;
    if (!s->offload) return c->n_past;
    return s->n_sel[s->served_by[layer]] + s->step_n;
}

/* What each layer keeps on the device at the end of an n-token prompt's prefill (the promise of a layer-wise end):
 * with offload, the sparse layers their T and the others the prompt; without, every layer the prompt. */
static int omnikv_kept(const kvb_method *m, int64_t n, int64_t *keep, char *err, size_t err_len) {
    const omnikv *s = (const omnikv *)m;
    const kvb_config *cfg = &s->c->model->cfg;
    double tp;
    int64_t T;
    if (sparse_budget(s, cfg, n, &tp, &T, err, err_len)) return -1;
    for (int l = 0; l < cfg->n_layer; l++) keep[l] = s->offload && s->kind[l] == K_SPARSE ? T : n;
    return 0;
}

/* Mem% = F + |T|/|p| (1 - F) (sec. 5), with |T| the tokens the sparse layers hold now; on a hybrid model the shares
 * are of the cache it holds (held_share: the local layers' windows on both sides) */
static double omnikv_formula(kvb_method *m, kvb_ctx *c) {
    omnikv *s = (omnikv *)m;
    if (!s->offload || c->n_past == 0 || !s->n_sparse) return 1.0;
    int64_t t = s->n_sel[0] + s->step_n;
    return held_share(s, c->n_past, windows_tokens(&c->model->cfg, c->n_past), (double)t);
}

static void omnikv_describe(kvb_method *m, char *buf, size_t cap) {
    omnikv *s = (omnikv *)m;
    static const char *sel[] = {"last", "uniform", "exp"};
    char layers[64];
    layers_str(s, s->n_filter, layers, sizeof layers);
    int n = snprintf(buf, cap, "layers=%s", layers);
    if (n > 0 && (size_t)n < cap)
        snprintf(buf + n, cap - (size_t)n, " selector=%s offload=%d full_share=%.3f T=%lld", sel[s->selector],
                 s->offload, s->full_share, (long long)s->T);
}

static void omnikv_destroy(kvb_method *m) {
    omnikv *s = (omnikv *)m;
    for (int f = 0; f < MAX_FILTER && s->sel; f++)
        kvb_method_release(s->c, s->sel[f], (size_t)s->c->params.n_ctx * sizeof(int32_t));
    free(s->sel);
    free(s->n_sel);
    free(s->kind);
    free(s->served_by);
    free(s->sel_host);
    free(s->load_lh);
    free(s->load_list);
    free(s->load_n);
    kvb_method_release(s->c, s->score, (size_t)s->c->params.n_ctx * sizeof(float));
    kvb_method_release(s->c, s->idx_buf, (size_t)s->idx_cap * sizeof(int32_t) * MAX_FILTER);
    kvc_free(s->base.vis);
    free(s);
}

/* selector=last|uniform|exp (0, 1, 2; default last) and window=N (default 16) */
static int read_selector(kvb_opts *o, int *selector, int *window, char *err, size_t err_len) {
    const char *sel = kvb_opts_get(o, "selector");
    *selector = 0;
    if (sel) {
        if (!strcmp(sel, "last")) *selector = 0;
        else if (!strcmp(sel, "uniform")) *selector = 1;
        else if (!strcmp(sel, "exp")) *selector = 2;
        else return ERR("omnikv: selector must be last, uniform or exp");
    }
    int64_t v = 16;
    if (kvb_opts_int(o, "window", &v, err, err_len) < 0) return -1;
    if (v < 1 || v > 1024) return ERR("omnikv: window must be in [1, 1024]");
    *window = (int)v;
    return 0;
}

/* Observation-window rows OmniKV reads: the current query (`last`) or its window (registry: what a shared
 * prefill must keep). */
static int omnikv_obs_window(kvb_opts *o, int *rows, char *err, size_t err_len) {
    int selector = 0, window = 0;
    if (read_selector(o, &selector, &window, err, err_len)) return -1;
    *rows = selector == 0 ? 1 : window;
    return 0;
}

/* The profile section OmniKV reads: its filter layers, only with layers=profile (registry). */
static const char *omnikv_profile(kvb_opts *o) {
    const char *layers = kvb_opts_get(o, "layers");
    return layers && !strcmp(layers, "profile") ? "omnikv" : NULL;
}

static kvb_method *omnikv_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len) {
    const kvb_config *cfg = &c->model->cfg;
    omnikv *s = calloc(1, sizeof *s);
    if (!s) { ERR("out of memory"); return NULL; }
    s->c = c;
    for (int f = 0; f < MAX_FILTER; f++) s->idx_len[f] = -1;
    s->offload = 1;
    s->kind = calloc((size_t)cfg->n_layer, sizeof *s->kind);
    s->served_by = calloc((size_t)cfg->n_layer, sizeof *s->served_by);
    s->sel = calloc(MAX_FILTER, sizeof *s->sel);
    s->n_sel = calloc(MAX_FILTER, sizeof *s->n_sel);
    if (!s->kind || !s->served_by || !s->sel || !s->n_sel) { ERR("out of memory"); goto fail; }
    const char *layers = kvb_opts_get(o, "layers");
    if (layers && !strcmp(layers, "profile")) {
        int got = kvb_profile_omnikv_layers(c->model, s->filter, MAX_FILTER, err, err_len);
        if (got < 0) goto fail;
        if (!got) { ERR("omnikv: layers=profile but the model has no omnikv calibration (run: kvbench calibrate omnikv)"); goto fail; }
        s->n_filter = got;
    } else if (layers) {
        if (parse_layers(s, layers, cfg->n_layer, err, err_len)) goto fail;
    } else if (fit_default_layers(s, cfg, b, err, err_len)) {
        goto fail;
    }
    for (int f = 0; f < s->n_filter; f++)
        if (check_global(cfg, s->filter[f], err, err_len)) goto fail;
    if (read_selector(o, &s->selector, &s->window, err, err_len)) goto fail;
    int64_t v;
    int r;
    if ((r = kvb_opts_int(o, "offload", &v, err, err_len)) < 0) goto fail;
    if (r) s->offload = v != 0;
    classify(s, cfg);
    /* known before any prompt (on a hybrid model the windows add to this floor: checked after prefill): a request/cell error at creation, not an engine failure after a prefill */
    if (b->kind == KVB_BUDGET_FRACTION && b->frac < s->full_share - 1e-9) {
        ERR("omnikv: budget %.1f%% is below the share of its full-attention layers (%.1f%%)", 100 * b->frac, 100 * s->full_share);
        goto fail;
    }
    if (s->offload) {
        s->base.vis = kvc_create(cfg->n_layer, cfg->n_head_kv, cfg->head_dim, c->params.kv_dtype, 0, c->be, &c->mem, err,
                                 err_len);
        if (!s->base.vis) goto fail;
    }
    s->base.budget = *b;
    /* A fraction budget is the device share the offload keeps (the sparse layers' share set to match it); a
     * token budget is the paper's: T selected tokens per sparse layer while the full layers keep everything,
     * which its memory formula (checked every time) states, not T/n. */
    s->base.imposes_budget = s->offload && b->kind == KVB_BUDGET_FRACTION;
    return &s->base;
fail:
    omnikv_destroy(&s->base);
    return NULL;
}

const kvb_method_def kvb_method_omnikv = {
    .name = "omnikv",
    .summary = "filter layers pick the tokens the sparse layers attend to",
    .traits = KVB_NEEDS_BUDGET | KVB_SHARES_PREFILL | KVB_LAYER_LOCAL | KVB_DECODE_WINDOW | KVB_NO_HOST_READS,
    .obs_window = omnikv_obs_window,
    .profile = omnikv_profile,
    .create = omnikv_create,
    .hooks = {.pre_attend = omnikv_pre_attend, .select = omnikv_select, .wants_probs = omnikv_wants, .observe = omnikv_observe, .after_prefill = omnikv_after_prefill},
    .expected_tokens = omnikv_expected,
    .kept_tokens = omnikv_kept,
    .formula_frac = omnikv_formula,
    .describe = omnikv_describe,
    .destroy = omnikv_destroy,
};
