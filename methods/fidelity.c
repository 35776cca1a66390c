/* fidelity.c — a method teacher-forced against full attention (fidelity.h). */
#include "methods/fidelity.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kept.h"
#include "engine/kvcache.h"
#include "engine/sampler.h"
#include "engine/tokenizer.h"

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

struct kvb_fid_ref {
    kvb_model *m;
    kvb_ctx_params p;
    kvb_ctx *base;     /* full attention after the prompt */
    const int32_t *ids;
    int64_t n;
    int n_gen;
    int ignore_eos;
};

/* One lockstep run: the full fork records its attention (mass per position), the method's context is
 * measured against it. */
typedef struct {
    kvb_ctx *full, *meth;
    kvb_method *method; /* the method measured (its read_outside) */
    int n_layer, n_head, n_head_kv;
    int64_t n_pos;
    float *mass;        /* [n_layer][n_head_kv][n_pos]: full attention of the current step, mean over the group */
    kvb_fid_result *out;
    double *step_recall; /* [n_layer] this step's recall (summed over KV heads) */
    int n_vocab;
    int32_t next;        /* full attention's greedy token of this step: both contexts take it */
} lockstep;

/* Full attention's decode probabilities -> mass per (layer, KV head, position). */
static int ref_wants(void *self, kvb_ctx *c, int layer, int64_t n_q) {
    (void)self, (void)layer;
    return !c->in_prefill && n_q == 1;
}

static int ref_observe(void *self, kvb_ctx *c, int layer, const kvb_src *src, const float *probs, int64_t stride,
                       int64_t n_q, char *err, size_t err_len) {
    (void)n_q;
    lockstep *L = self;
    const int group = L->n_head / L->n_head_kv;
    float *mass = L->mass + (size_t)layer * L->n_head_kv * L->n_pos;
    memset(mass, 0, (size_t)L->n_head_kv * L->n_pos * sizeof *mass);
    float *row = malloc((size_t)(stride > 0 ? stride : 1) * sizeof *row);
    int32_t *pos = malloc((size_t)(L->n_pos > 0 ? L->n_pos : 1) * sizeof *pos);
    int rc = row && pos ? 0 : kvb_errf(err, err_len, "out of memory");
    for (int qh = 0; qh < L->n_head && !rc; qh++) {
        const int h = qh / group;
        int64_t len = 0;
        rc = kvb_src_positions(c, &src[h], pos, &len) ||
             c->be->copy(c->be, row, probs + (size_t)qh * stride, (size_t)len * sizeof *row, KVB_COPY_D2H, err, err_len) ||
             (c->be->sync && c->be->sync(c->be)); /* n_q == 1 */
        float *mh = mass + (size_t)h * L->n_pos;
        for (int64_t i = 0; i < len && !rc; i++)
            if (pos[i] >= 0 && pos[i] < L->n_pos) mh[pos[i]] += row[i] / (float)group;
    }
    free(row);
    free(pos);
    return rc ? kvb_errf(err, err_len, "fidelity: reading full attention's probabilities failed") : 0;
}

/* What the method lets a layer read, against full's mass of the same step. */
static void on_visible(void *user, kvb_ctx *c, int layer, const kvb_src *src, int64_t n_q) {
    lockstep *L = user;
    if (c->in_prefill || n_q != 1) return;
    if (kvb_layer_window(&c->model->cfg, layer)) { /* a local layer attends the model's window in both contexts (no */
        L->step_recall[layer] = 1.0;                 /* method hook runs there, nor full's observer): all of it */
        return;
    }
    const float *mass = L->mass + (size_t)layer * L->n_head_kv * L->n_pos;
    int32_t *pos = malloc((size_t)(L->n_pos > 0 ? L->n_pos : 1) * sizeof *pos);
    double sum = 0;
    const int64_t outside = L->method->def->read_outside ? L->method->def->read_outside(L->method, c, layer) : 0;
    for (int h = 0; h < L->n_head_kv && pos; h++) {
        const float *mh = mass + (size_t)h * L->n_pos;
        int64_t len = 0;
        if (kvb_src_positions(c, &src[h], pos, &len)) len = 0;
        double r = 0;
        int32_t *op = outside > 0 && L->method->def->outside_positions ? malloc((size_t)outside * sizeof *op) : NULL;
        if (op && L->method->def->outside_positions(L->method, c, layer, h, op)) free(op), op = NULL, r = NAN;
        for (int64_t i = 0; i < outside; i++) {
            const int64_t p = op ? op[i] : i;
            if (p >= 0 && p < L->n_pos) r += mh[p];
        }
        free(op);
        for (int64_t i = 0; i < len; i++)
            if (pos[i] >= 0 && pos[i] < L->n_pos) r += mh[pos[i]];
        sum += r;
    }
    free(pos);
    L->step_recall[layer] = sum / L->n_head_kv;
}

/* KL(p || q) of softmax(a) and softmax(b), in float64. */
static double kl_logits(const float *a, const float *b, int n) {
    double ma = -INFINITY, mb = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (a[i] > ma) ma = a[i];
        if (b[i] > mb) mb = b[i];
    }
    double za = 0, zb = 0;
    for (int i = 0; i < n; i++) za += exp((double)a[i] - ma), zb += exp((double)b[i] - mb);
    double lza = log(za), lzb = log(zb), kl = 0;
    for (int i = 0; i < n; i++) {
        double la = (double)a[i] - ma - lza, lb = (double)b[i] - mb - lzb;
        kl += exp(la) * (la - lb);
    }
    return kl > 0 ? kl : 0; /* rounding can leave a tiny negative for identical distributions */
}

kvb_fid_ref *kvb_fid_ref_create(kvb_model *m, const kvb_ctx_params *p, const int32_t *ids, int64_t n, int n_gen,
                                char *err, size_t err_len) {
    kvb_fid_ref *r = calloc(1, sizeof *r);
    if (!r) { ERR("out of memory"); return NULL; }
    r->m = m;
    r->p = *p;
    r->p.n_ctx = (int)(n + n_gen + 1);
    r->ids = ids;
    r->n = n;
    r->n_gen = n_gen;
    if (!(r->base = kvb_ctx_create(m, &r->p, err, err_len)) || kvb_forward(r->base, ids, n, err, err_len) ||
        kvb_ctx_end_prefill(r->base, err, err_len)) {
        kvb_fid_ref_free(r);
        return NULL;
    }
    return r;
}

void kvb_fid_ref_ignore_eos(kvb_fid_ref *r, int on) { r->ignore_eos = on; }

/* The most slots any layer's KV head of c holds now, into r's maximum (reached at decode step `step`). */
static void note_max_tokens(const kvb_ctx *c, int step, kvb_fid_result *r) {
    for (int l = 0; l < c->model->cfg.n_layer; l++)
        for (int h = 0; h < c->model->cfg.n_head_kv; h++) {
            int64_t n = kvc_n(c->kv, l, h);
            if (n > r->max_head_tokens) r->max_head_tokens = n, r->max_head_step = step;
        }
}

void kvb_fid_ref_free(kvb_fid_ref *r) {
    if (!r) return;
    kvb_ctx_free(r->base);
    free(r);
}

int kvb_fid_result_init(kvb_fid_result *r, int n_layer) {
    memset(r, 0, sizeof *r);
    r->n_layer = n_layer;
    r->recall_sum = calloc((size_t)n_layer, sizeof *r->recall_sum);
    return r->recall_sum ? 0 : -1;
}

void kvb_fid_result_free(kvb_fid_result *r) {
    free(r->recall_sum);
    memset(r, 0, sizeof *r);
}

void kvb_fid_result_add(kvb_fid_result *sum, const kvb_fid_result *r) {
    sum->positions += r->positions;
    sum->agree += r->agree;
    sum->kl_sum += r->kl_sum;
    if (r->kl_max > sum->kl_max) sum->kl_max = r->kl_max;
    for (int l = 0; l < sum->n_layer; l++) sum->recall_sum[l] += r->recall_sum[l];
    sum->recall_steps += r->recall_steps;
    sum->kv = r->kv;
    if (r->max_head_tokens > sum->max_head_tokens) sum->max_head_tokens = r->max_head_tokens, sum->max_head_step = r->max_head_step;
    snprintf(sum->params, sizeof sum->params, "%s", r->params);
}

double kvb_fid_layer_recall(const kvb_fid_result *r, int layer) {
    return r->recall_steps ? r->recall_sum[layer] / r->recall_steps : NAN;
}

double kvb_fid_mean_recall(const kvb_fid_result *r) {
    if (!r->recall_steps || !r->n_layer) return NAN;
    double s = 0;
    for (int l = 0; l < r->n_layer; l++) s += kvb_fid_layer_recall(r, l);
    return s / r->n_layer;
}

/* The full context's pick: its greedy token, after comparing the two next-token distributions. */
static int32_t pick_full(void *user, const float *logits) {
    lockstep *L = user;
    L->next = sampler_argmax(logits, L->n_vocab);
    int32_t mine = sampler_argmax(L->meth->logits, L->n_vocab);
    double kl = kl_logits(logits, L->meth->logits, L->n_vocab);
    L->out->positions++;
    L->out->agree += mine == L->next;
    L->out->kl_sum += kl;
    if (kl > L->out->kl_max) L->out->kl_max = kl;
    return L->next;
}

/* The method's context is fed full attention's token (teacher forcing). */
static int32_t pick_forced(void *user, const float *logits) {
    (void)logits;
    return ((lockstep *)user)->next;
}

int kvb_fidelity_run(kvb_fid_ref *r, const char *method, const kvb_budget *b, kvb_opts *o, kvb_fid_result *out,
                     char *err, size_t err_len) {
    const kvb_config *cfg = &r->m->cfg;
    lockstep L = {0};
    L.n_layer = cfg->n_layer;
    L.n_head = cfg->n_head;
    L.n_head_kv = cfg->n_head_kv;
    L.n_pos = r->p.n_ctx;
    L.n_vocab = cfg->n_vocab;
    L.out = out;
    kvb_fid_result_init(out, cfg->n_layer);
    L.step_recall = calloc((size_t)cfg->n_layer, sizeof *L.step_recall);
    L.mass = calloc((size_t)cfg->n_layer * cfg->n_head_kv * L.n_pos, sizeof *L.mass);
    kvb_hooks capture = {0};
    capture.self = &L;
    capture.wants_probs = ref_wants;
    capture.observe = ref_observe;
    kvb_method *meth = NULL;
    kvb_session fs = {0}, ms = {0};
    kvb_rounds prompt = {.ids = (int32_t *)r->ids, .n = r->n};
    kvb_method_needs nd;
    int rc = -1;
    if (!out->recall_sum || !L.step_recall || !L.mass) { ERR("out of memory"); goto done; }
    if (kvb_method_needs_of(method, o, &nd, err, err_len)) goto done;
    if (!(L.full = kvb_ctx_fork(r->base, 0, err, err_len)) || kvb_ctx_set_hooks(L.full, &capture, err, err_len) ||
        kvb_ctx_end_prefill(L.full, err, err_len))
        goto done;
    kvb_ctx_params p = r->p;
    p.share_backend = r->base->be; /* one thread pool: the contexts take turns */
    if (!(L.meth = kvb_ctx_create(r->m, &p, err, err_len))) goto done;
    kvb_budget none = {KVB_BUDGET_NONE, 0, 0};
    if (!(meth = kvb_method_create(method, L.meth, nd.takes_budget ? b : &none, o, err, err_len))) goto done;
    kvb_session_method seam = kvb_method_seam(meth);
    kvb_gen_params gf = {.max_new = r->n_gen, .ignore_eos = r->ignore_eos, .pick = pick_full, .user = &L}, gm = gf;
    gm.pick = pick_forced;
    if (kvb_session_init(&fs, L.full, NULL, &gf, err, err_len) || kvb_session_init(&ms, L.meth, &seam, &gm, err, err_len) ||
        kvb_rounds_chunk(&prompt, 0, err, err_len) || kvb_session_prefill(&ms, &prompt, 0, err, err_len))
        goto done;
    L.meth->on_visible = on_visible;
    L.meth->on_visible_user = &L;
    L.method = meth;
    note_max_tokens(L.meth, 0, out);
    for (;;) {
        for (int l = 0; l < cfg->n_layer; l++) L.step_recall[l] = NAN;
        const char *piece;
        size_t n;
        int f = kvb_session_step(&fs, &piece, &n, err, err_len);
        if (f < 0) goto done;
        if (f == 0 || fs.finish) break; /* full attention's last token: nothing more to compare */
        if (kvb_session_step(&ms, &piece, &n, err, err_len) < 0) goto done;
        note_max_tokens(L.meth, out->recall_steps + 1, out);
        for (int l = 0; l < cfg->n_layer; l++) {
            if (isnan(L.step_recall[l])) { ERR("fidelity: layer %d of %s reported no attention sources", l, method); goto done; }
            out->recall_sum[l] += L.step_recall[l];
        }
        out->recall_steps++;
    }
    if (kvb_session_finish(&ms, err, err_len)) goto done;
    out->kv = ms.kv_end;
    if (meth->def->describe) meth->def->describe(meth, out->params, sizeof out->params);
    rc = 0;
done:
    free(prompt.round_end);
    kvb_session_free(&fs);
    kvb_session_free(&ms);
    if (meth) kvb_method_free(meth, L.meth);
    kvb_ctx_free(L.meth); /* forks and sharers first: they use the base's backend */
    kvb_ctx_free(L.full);
    free(L.mass);
    free(L.step_recall);
    if (rc) kvb_fid_result_free(out);
    return rc;
}
