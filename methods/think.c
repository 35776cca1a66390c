/* think.c — ThinK (Xu et al. 2024, "ThinK: Thinner Key Cache by Query-Driven Pruning", arXiv 2407.21018): the
 * prompt's keys lose the channels the queries barely read, so the key cache is thinner while every token and every
 * value stays.
 *
 * Criterion (paper §3, eq. 5-6; kvpress's ThinKPress). Per layer and KV head, with Q_w the observation window's
 * queries of the head's group (the last `window` prompt queries, post-RoPE, every query head of the group) and K the
 * prompt's keys as cached, channel c scores ||Q_w[:, c]|| ||K[:, c]||: channel c's share of the magnitude of
 * Q_w K^T. Here the score is its square, sum_{t, r} q[t][r][c]^2 x sum_i k[i][c]^2 (float sums: the same order as
 * kvpress's mean-of-squares product, which differs by positive constants). The top d' channels are kept (ties to the
 * lower channel); attention over the pruned prefix reads q . k through those channels only, with the scale kept at
 * 1/sqrt(head_dim), which is what zeroing the pruned channels of K (kvpress) computes.
 *
 * Memory. The prompt's K rows, narrowed to the d' kept channels (backend gather_cols), their V rows (whole) and
 * positions leave the KV store into the method's own device buffers, counted in extra_device_bytes: a prompt slot
 * costs (d' + head_dim) elements + a 4-byte position against the store's 2 x head_dim elements + position + round.
 * Tokens decoded later stay whole in the store (the paper prunes the prefill's keys and keeps the recent ones
 * whole). expected_tokens is what the store holds (the decoded tokens), checked per layer by kvb_method_verify;
 * formula_frac is the narrow prefix plus the store, checked against the measured device bytes. The attend hook runs
 * the store's attention (its log-sum-exp kept), then the backend's attention_narrow over the prefix with q gathered
 * to each KV head's kept channels (gather_cols), merged by log-sum-exp: one exact softmax over both parts.
 *
 * Choices (flags; the paper and kvpress leave them open):
 * - The budget. ThinK's saving is channels, so `--budget F%` is Mem% of the full KV bytes. Values stay whole, so
 *   channel pruning alone reaches no lower than (1 + head_dim) elements per slot, about half the cache; the paper
 *   goes lower by composing ThinK with a token method (it reports ThinK over H2O and SnapKV), and so does base=snapkv
 *   (the default): where pruning lambda of the channels of every prompt token holds no more than F, d' comes from
 *   the budget (the d' in [1, head_dim) whose share is nearest to F, or the heads whole when that is nearer: budget
 *   100% is full attention) and every token stays; below that share, SnapKV (its window, kernel and pool options,
 *   snapkv.h) first keeps the T prompt tokens per head whose pruned slots make F, then ThinK prunes lambda of the
 *   kept keys' channels (kvpress's ComposedPress order). base=none is ThinK alone: d' from the budget at every F,
 *   and a budget under its floor is an error naming the smallest share it reaches. A token budget
 *   (`--budget 1024`) is refused: ThinK's saving is not a token count.
 * - lambda=L (the pruning ratio, paper default 0.4): d' = head_dim - floor(L x head_dim), kvpress's rounding
 *   (n_pruned = int(head_dim x ratio)), so kept channel sets compare with kvpress's. Given, it is the ratio in both
 *   cases above; where the budget covers lambda's share with every token (and always with base=none), the memory is
 *   set by lambda and the budget is reported, not imposed (as KIVI's bits); a budget under its share with base=none
 *   is an error naming that share. Not given: 0.4 where tokens go (base=snapkv).
 * - window=32 (kvpress's window_size): the observation window's rows of the shared prefill (fewer when the prompt
 *   is shorter).
 * - Every global layer and KV head is pruned to the same d' (the paper's uniform ratio); the sliding-window layers
 *   of a hybrid model keep their windows whole (no method hook runs there), and the budget is of the cache the
 *   model holds, windows counted. */
#include "methods/think.h"

#include "methods/snapkv.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    kvb_method base;
    kvb_ctx *c;
    double lambda;      /* < 0: not given (d' from the budget, 0.4 where tokens go) */
    int with_snap;      /* base=snapkv: tokens go where channels alone keep more than the budget */
    kvb_snap_opts snap;
    int64_t keep;       /* prompt tokens per KV head kept (n_prompt: every one) */
    int64_t window;     /* observation rows read */
    int dk;             /* kept key channels per head (head_dim: none pruned) */
    int moved;          /* 1: the prompt's KV is in the narrow buffers */
    int64_t n_prefix;   /* prompt tokens per KV head in the narrow buffers (keep) */
    size_t es;          /* element bytes of the store */
    uint8_t **kn, **vw; /* [n_layer] device: [HK][n_prefix][dk] keys, [HK][n_prefix][head_dim] values */
    int32_t **pos;      /* [n_layer] device: [HK][n_prefix] positions */
    int32_t *chan;      /* device [n_layer][HK][head_dim]: each head's kept channels, ascending (first dk) */
    float *lse, *qg;    /* device scratch: [n_head][rows], [rows][n_head][dk] */
    int64_t rows;
    const void **kp, **vp;
    const int32_t **pp; /* host [HK]: one layer's narrow segment for attention_narrow */
} think;

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

/* bytes of a pruned prompt slot: dk key elements, head_dim value elements, a position */
static double narrow_slot(const think *s, int dk) {
    return (double)((size_t)dk * s->es + (size_t)s->c->model->cfg.head_dim * s->es + sizeof(int32_t));
}

/* The device share of the full cache with `kept` prompt tokens per KV head pruned to dk channels (dk 0 or head_dim:
 * kept whole in the store) and n_past tokens seen: the global layers' kept prompt plus their decoded tokens, the
 * local layers' windows whole. */
static double share_at(const think *s, const kvb_ctx *c, int dk, int64_t kept) {
    const kvb_config *cfg = &c->model->cfg;
    const double slot = (double)kvc_slot_bytes(c->kv), row = dk > 0 && dk < cfg->head_dim ? narrow_slot(s, dk) : slot;
    double held = 0, whole = 0;
    for (int l = 0; l < cfg->n_layer; l++) {
        const double full = (double)kvb_ctx_full_tokens(c, l) * slot;
        whole += full;
        held += kvb_layer_window(cfg, l) ? full : (double)kept * row + (double)(c->n_past - s->base.n_prompt) * slot;
    }
    return whole > 0 ? held / whole : 1.0;
}

static int lambda_dk(double lambda, int D) {
    const int dk = D - (int)floor(lambda * D + 1e-9);
    return dk < 1 ? 1 : dk;
}

/* d' (and the tokens kept) for this prompt: see the header's choices. -1 + a line when the budget is under what
 * the method reaches. */
static int resolve(think *s, kvb_ctx *c, char *err, size_t err_len) {
    const int D = c->model->cfg.head_dim;
    const int64_t n = c->n_past;
    const double f = s->base.budget.frac, tol = 0.01 * f + 1.0 / (double)(n > 0 ? n : 1);
    const int frac = s->base.budget.kind == KVB_BUDGET_FRACTION;
    s->keep = n;
    if (s->lambda >= 0 || s->with_snap) { /* lambda's channels with every token */
        const int dk = lambda_dk(s->lambda >= 0 ? s->lambda : 0.4, D);
        const double share = share_at(s, c, dk, n);
        if (frac && f < share - tol) {
            if (!s->with_snap)
                return ERR("think: budget %g%% is below the share lambda=%g keeps (%.1f%% of the cache: %d of %d key "
                           "channels, values whole)", 100 * f, s->lambda, 100 * share, dk, D);
            /* SnapKV keeps the tokens whose pruned slots make the budget */
            int64_t b;
            if (kvb_method_budget_tokens(&s->base, n, &b, err, err_len)) return -1;
            s->dk = dk;
            s->keep = dk < D ? llround((double)b * (double)kvc_slot_bytes(c->kv) / narrow_slot(s, dk)) : b;
            s->keep = s->keep < 1 ? 1 : s->keep > n ? n : s->keep;
            return 0;
        }
        if (s->lambda >= 0 || !frac) { /* the memory is lambda's; the budget is reported */
            s->dk = dk;
            s->base.imposes_budget = 0;
            snprintf(s->base.note, sizeof s->base.note, "key channels pruned by lambda=%g, every token kept (the "
                     "budget is reported)", s->lambda >= 0 ? s->lambda : 0.4);
            return 0;
        }
    }
    int best = D;
    double best_gap = fabs(1.0 - f);
    for (int dk = 1; dk < D; dk++) {
        const double gap = fabs(share_at(s, c, dk, n) - f);
        if (gap < best_gap) best = dk, best_gap = gap;
    }
    if (best_gap > tol)
        return ERR("think: budget %g%% is below the share key-channel pruning alone reaches (%.1f%% of the cache with "
                   "1 of %d key channels kept; values stay whole): base=snapkv drops tokens too", 100 * f,
                   100 * share_at(s, c, 1, n), D);
    s->dk = best;
    return 0;
}

/* Channel scores of layer l, every KV head: sum over the window rows and the group's query heads of q^2, times
 * sum over the prompt's keys of k^2, per channel; the top dk channels (ascending) into s->chan. */
static int score_layer(think *s, kvb_ctx *c, int l, int64_t n, float *qsq, float *qsum, float *kf, float *kx,
                       float *ksq, char *err, size_t err_len) {
    kvb_backend *be = c->be;
    const kvb_config *cfg = &c->model->cfg;
    const int H = cfg->n_head, HK = cfg->n_head_kv, D = cfg->head_dim;
    const int64_t w = c->obs_n < s->window ? c->obs_n : s->window, qd = cfg->q_dim;
    if (w < 1) return ERR("think: no observation window rows (the prefill kept none)");
    const float *q = c->obs_q + ((size_t)l * c->obs_cap + (size_t)(c->obs_n - w)) * qd;
    if (be->mul_f32(be, qsq, q, q, w * qd, err, err_len)) return -1;
    for (int64_t t = 0; t < w; t++) /* row t as probabilities [n_head][1][head_dim]: the group's sum per channel */
        if (be->probs_reduce(be, qsum, D, qsq + t * qd, D, H, HK, 1, D, NULL, KVB_REDUCE_GROUP_SUM, t > 0, err, err_len))
            return -1;
    for (int g = 0; g < HK; g++) {
        kvc_view v = kvc_head_view(c->kv, l, g); /* slots in position order after prefill */
        if (v.n != n) return ERR("think: layer %d head %d holds %lld tokens, the prompt %lld", l, g, (long long)v.n, (long long)n);
        if (be->block_minmax(be, kf, kx, v.k, v.dtype, D, 1, 0, n, err, err_len) ||
            be->mul_f32(be, kf, kf, kf, n * D, err, err_len) ||
            be->probs_reduce(be, ksq + (size_t)g * D, D, kf, D, 1, 1, n, D, NULL, KVB_REDUCE_GROUP_SUM, 0, err, err_len))
            return -1;
    }
    if (be->mul_f32(be, ksq, ksq, qsum, (int64_t)HK * D, err, err_len)) return -1;
    for (int g = 0; g < HK; g++)
        if (be->topk_idx(be, s->chan + ((size_t)l * HK + g) * D, ksq + (size_t)g * D, D, s->dk, err, err_len)) return -1;
    return 0;
}

/* Move layer l's prompt out of the store: keys narrowed to the kept channels, values and positions as they are. */
static int move_layer(think *s, kvb_ctx *c, int l, int64_t n, char *err, size_t err_len) {
    kvb_backend *be = c->be;
    const int HK = c->model->cfg.n_head_kv, D = c->model->cfg.head_dim;
    const size_t kb = (size_t)n * s->dk * s->es, vb = (size_t)n * D * s->es, pb = (size_t)n * sizeof(int32_t);
    s->kn[l] = kvb_mem_alloc(&c->mem, KVB_TIER_DEVICE, KVB_MEM_KV, kb * HK);
    s->vw[l] = kvb_mem_alloc(&c->mem, KVB_TIER_DEVICE, KVB_MEM_KV, vb * HK);
    s->pos[l] = kvb_mem_alloc(&c->mem, KVB_TIER_DEVICE, KVB_MEM_KV, pb * HK);
    if (!s->kn[l] || !s->vw[l] || !s->pos[l]) return ERR("think: out of memory for the pruned prompt");
    for (int g = 0; g < HK; g++) {
        kvc_view v = kvc_head_view(c->kv, l, g);
        if (be->gather_cols(be, s->kn[l] + g * kb, s->dk, v.k, D, v.dtype, s->chan + ((size_t)l * HK + g) * D, s->dk, n,
                            err, err_len) ||
            be->copy(be, s->vw[l] + g * vb, v.v, vb, KVB_COPY_D2D, err, err_len) ||
            be->copy(be, (uint8_t *)s->pos[l] + g * pb, v.pos, pb, KVB_COPY_D2D, err, err_len) ||
            kvc_truncate(c->kv, l, g, 0, err, err_len))
            return -1;
    }
    s->base.extra_device_bytes += (int64_t)((kb + vb + pb) * HK);
    return 0;
}

static int think_after_prefill(void *self, kvb_ctx *c, char *err, size_t err_len) {
    think *s = self;
    const kvb_config *cfg = &c->model->cfg;
    const int64_t n = c->n_past, D = cfg->head_dim, HK = cfg->n_head_kv;
    s->base.n_prompt = n;
    if (resolve(s, c, err, err_len)) return -1;
    if (s->keep < n) { /* SnapKV's choice of the prompt's tokens first */
        int64_t *keep = malloc((size_t)cfg->n_layer * sizeof *keep);
        if (!keep) return ERR("think: out of memory");
        for (int l = 0; l < cfg->n_layer; l++) keep[l] = s->keep;
        const int rc = kvb_snap_compress(c, &s->snap, keep, err, err_len);
        free(keep);
        if (rc) return -1;
    }
    if (s->dk >= D || n == 0) return 0; /* no channel pruned: the kept tokens stay whole in the store */
    const int64_t w = c->obs_n < s->window ? c->obs_n : s->window, k = s->keep;
    const size_t qsq_b = (size_t)(w > 0 ? w : 1) * cfg->q_dim * sizeof(float), vec_b = (size_t)HK * D * sizeof(float),
                 rows_b = (size_t)k * D * sizeof(float);
    float *qsq = kvb_method_alloc(c, qsq_b), *qsum = kvb_method_alloc(c, vec_b), *ksq = kvb_method_alloc(c, vec_b);
    float *kf = kvb_method_alloc(c, rows_b), *kx = kvb_method_alloc(c, rows_b);
    int rc = !qsq || !qsum || !ksq || !kf || !kx ? ERR("think: out of memory for the channel scores") : 0;
    s->n_prefix = k; /* the narrow buffers' size, for their release */
    for (int l = 0; !rc && l < cfg->n_layer; l++)
        if (!kvb_layer_window(cfg, l))
            rc = score_layer(s, c, l, k, qsq, qsum, kf, kx, ksq, err, err_len) || move_layer(s, c, l, k, err, err_len) ? -1 : 0;
    kvb_method_release(c, qsq, qsq_b), kvb_method_release(c, qsum, vec_b), kvb_method_release(c, ksq, vec_b);
    kvb_method_release(c, kf, rows_b), kvb_method_release(c, kx, rows_b);
    if (rc) return -1;
    s->moved = 1;
    return 0;
}

static int think_attend(void *self, kvb_ctx *c, int layer, kvb_attn_args *a, char *err, size_t err_len) {
    think *s = self;
    if (c->in_prefill || !s->moved || kvb_layer_window(&c->model->cfg, layer)) return 0;
    kvb_backend *be = c->be;
    const int H = a->n_head, HK = a->n_head_kv, D = a->head_dim, G = H / HK, dk = s->dk;
    if (a->n_q > s->rows) {
        kvb_method_release(c, s->lse, (size_t)H * s->rows * sizeof(float));
        kvb_method_release(c, s->qg, (size_t)H * s->rows * dk * sizeof(float));
        s->rows = a->n_q;
        s->lse = kvb_method_alloc(c, (size_t)H * s->rows * sizeof(float));
        s->qg = kvb_method_alloc(c, (size_t)H * s->rows * dk * sizeof(float));
        if (!s->lse || !s->qg) return ERR("think: out of memory");
    }
    for (int h = 0; h < H; h++) /* q at its KV head's kept channels */
        if (be->gather_cols(be, s->qg + (size_t)h * dk, (int64_t)H * dk, a->q + (size_t)h * D, (int64_t)H * D, KVB_F32,
                            s->chan + ((size_t)layer * HK + h / G) * D, dk, a->n_q, err, err_len))
            return -1;
    const size_t kb = (size_t)s->n_prefix * dk * s->es, vb = (size_t)s->n_prefix * D * s->es;
    for (int g = 0; g < HK; g++) {
        s->kp[g] = s->kn[layer] + g * kb;
        s->vp[g] = s->vw[layer] + g * vb;
        s->pp[g] = s->pos[layer] + (size_t)g * s->n_prefix;
    }
    kvb_narrow_kv nk = {s->kp, s->vp, s->pp, s->n_prefix, dk, s->qg};
    a->lse = s->lse;
    int rc = be->attention(be, a, err, err_len) || be->attention_narrow(be, a, &nk, err, err_len);
    a->lse = NULL;
    return rc ? -1 : 1;
}

int kvb_think_channels(kvb_method *m, kvb_ctx *c, int layer, int h, int32_t *out, char *err, size_t err_len) {
    const think *s = (think *)m;
    const kvb_config *cfg = &c->model->cfg;
    if (!s->moved || kvb_layer_window(cfg, layer)) return 0;
    const int32_t *chan = s->chan + ((size_t)layer * cfg->n_head_kv + h) * cfg->head_dim;
    if (c->be->copy(c->be, out, chan, (size_t)s->dk * sizeof(int32_t), KVB_COPY_D2H, err, err_len) ||
        (c->be->sync && c->be->sync(c->be)))
        return ERR("think: reading the kept channels back");
    return s->dk;
}

static int64_t think_expected(kvb_method *m, kvb_ctx *c, int layer) {
    const think *s = (think *)m;
    return s->moved ? c->n_past - s->base.n_prompt : kvb_kept_then_decoded(m, c, s->keep);
}

static double think_formula(kvb_method *m, kvb_ctx *c) {
    const think *s = (think *)m;
    return s->moved ? share_at(s, c, s->dk, s->n_prefix) : share_at(s, c, 0, s->keep < m->n_prompt ? s->keep : m->n_prompt);
}

static int64_t think_read_outside(kvb_method *m, kvb_ctx *c, int layer) {
    const think *s = (think *)m;
    return s->moved && !kvb_layer_window(&c->model->cfg, layer) ? s->n_prefix : 0;
}

/* the pruned prompt's positions of (layer, h), copied down when fidelity asks (one counted copy) */
static int think_outside_positions(kvb_method *m, kvb_ctx *c, int layer, int h, int32_t *pos) {
    const think *s = (think *)m;
    const int64_t n = think_read_outside(m, c, layer);
    char err[8];
    if (!n) return 0;
    return c->be->copy(c->be, pos, s->pos[layer] + (size_t)h * n, (size_t)n * sizeof *pos, KVB_COPY_D2H, err, sizeof err) ||
                   (c->be->sync && c->be->sync(c->be))
               ? -1
               : 0;
}

static void think_describe(kvb_method *m, char *buf, size_t cap) {
    const think *s = (think *)m;
    const int D = s->c->model->cfg.head_dim, dk = s->dk ? s->dk : D;
    snprintf(buf, cap, "base=%s lambda=%.4g channels=%d/%d window=%lld keep=%lld%s", s->with_snap ? "snapkv" : "none",
             1.0 - (double)dk / D, dk, D, (long long)s->window, (long long)(s->keep < m->n_prompt ? s->keep : m->n_prompt),
             s->lambda >= 0 || s->keep < m->n_prompt ? "" : " (from the budget)");
}

static void think_destroy(kvb_method *m) {
    think *s = (think *)m;
    const kvb_config *cfg = &s->c->model->cfg;
    const int HK = cfg->n_head_kv, D = cfg->head_dim, H = cfg->n_head;
    for (int l = 0; s->kn && l < cfg->n_layer; l++) {
        const size_t n = (size_t)s->n_prefix * HK;
        kvb_mem_free(&s->c->mem, KVB_TIER_DEVICE, KVB_MEM_KV, s->kn[l], n * s->dk * s->es);
        kvb_mem_free(&s->c->mem, KVB_TIER_DEVICE, KVB_MEM_KV, s->vw[l], n * D * s->es);
        kvb_mem_free(&s->c->mem, KVB_TIER_DEVICE, KVB_MEM_KV, s->pos[l], n * sizeof(int32_t));
    }
    kvb_method_release(s->c, s->chan, (size_t)cfg->n_layer * HK * D * sizeof(int32_t));
    kvb_method_release(s->c, s->lse, (size_t)H * s->rows * sizeof(float));
    kvb_method_release(s->c, s->qg, (size_t)H * s->rows * s->dk * sizeof(float));
    free(s->kn), free(s->vw), free(s->pos), free(s->kp), free(s->vp), free(s->pp);
    free(s);
}

/* Observation-window rows ThinK reads: its `window` option (32, kvpress's window_size). */
static int think_obs_window(kvb_opts *o, int *rows, char *err, size_t err_len) {
    int64_t w = 32;
    if (kvb_opts_int(o, "window", &w, err, err_len) < 0) return -1;
    if (w < 1 || w > 4096) return ERR("think: window must be in [1, 4096]");
    *rows = (int)w;
    return 0;
}

static kvb_method *think_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len) {
    const kvb_config *cfg = &c->model->cfg;
    think *s = calloc(1, sizeof *s);
    if (!s) { ERR("out of memory"); return NULL; }
    s->c = c;
    s->lambda = -1;
    s->keep = INT64_MAX;
    s->es = c->params.kv_dtype == KVB_F16 ? 2 : 4;
    int window = 0, r;
    if (think_obs_window(o, &window, err, err_len)) goto fail;
    s->window = window;
    const char *base = kvb_opts_get(o, "base");
    if (base && strcmp(base, "snapkv") && strcmp(base, "none")) { ERR("think: base must be snapkv or none"); goto fail; }
    s->with_snap = !base || !strcmp(base, "snapkv");
    if (s->with_snap && kvb_snap_opts_read(o, "think", &s->snap, err, err_len)) goto fail;
    if ((r = kvb_opts_double(o, "lambda", &s->lambda, err, err_len)) < 0) goto fail;
    if (r && !(s->lambda >= 0 && s->lambda < 1)) { ERR("think: lambda must be in [0, 1)"); goto fail; }
    if (b->kind == KVB_BUDGET_TOKENS) {
        ERR("think: a token budget does not apply (ThinK keeps every token and prunes key channels): give a share, "
            "e.g. --budget 70%%");
        goto fail;
    }
    if (b->kind != KVB_BUDGET_FRACTION && !r) { ERR("think: needs a budget (--budget 70%%) or lambda="); goto fail; }
    const int D = cfg->head_dim, HK = cfg->n_head_kv;
    int hybrid = 0;
    for (int l = 0; l < cfg->n_layer; l++) hybrid |= kvb_layer_window(cfg, l) != 0;
    if (!r && !hybrid && !s->with_snap) { /* the floor, known before the prompt where every layer is global */
        const double floor_share = narrow_slot(s, 1) / (double)kvc_slot_bytes(c->kv);
        if (b->frac < floor_share - 0.01 * b->frac) {
            ERR("think: budget %g%% is below the share key-channel pruning alone reaches (%.1f%% of the cache with 1 of "
                "%d key channels kept; values stay whole): base=snapkv drops tokens too", 100 * b->frac, 100 * floor_share, D);
            goto fail;
        }
    }
    s->kn = calloc((size_t)cfg->n_layer, sizeof *s->kn);
    s->vw = calloc((size_t)cfg->n_layer, sizeof *s->vw);
    s->pos = calloc((size_t)cfg->n_layer, sizeof *s->pos);
    s->kp = calloc((size_t)HK, sizeof *s->kp);
    s->vp = calloc((size_t)HK, sizeof *s->vp);
    s->pp = calloc((size_t)HK, sizeof *s->pp);
    s->chan = kvb_method_alloc(c, (size_t)cfg->n_layer * HK * D * sizeof(int32_t));
    if (!s->kn || !s->vw || !s->pos || !s->kp || !s->vp || !s->pp || !s->chan) { ERR("out of memory"); goto fail; }
    s->base.budget = *b;
    s->base.imposes_budget = 1; /* 0 once resolve finds the memory set by lambda */
    return &s->base;
fail:
    think_destroy(&s->base);
    return NULL;
}

const kvb_method_def kvb_method_think = {
    .name = "think",
    .summary = "ThinK: prunes the prompt's key channels the window's queries read least (+ SnapKV's tokens below its floor)",
    .traits = KVB_NEEDS_BUDGET | KVB_SHARES_PREFILL,
    .obs_window = think_obs_window,
    .create = think_create,
    .hooks = {.attend = think_attend, .after_prefill = think_after_prefill},
    .expected_tokens = think_expected,
    .formula_frac = think_formula,
    .read_outside = think_read_outside,
    .outside_positions = think_outside_positions,
    .describe = think_describe,
    .destroy = think_destroy,
};
