/* share.c — one exact prefill for many methods: a recorder installed as the context's hooks keeps the
 * observation window (engine) and, when asked, the attention every prefill query gives each slot (H2O's
 * accumulated score, summed over the group's query heads) and KVzap's scores; forks of the context then adopt it. */
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "methods/kvzap.h"
#include "methods/method.h"

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

struct kvb_share {
    kvb_hooks hooks;
    kvb_ctx *c;
    int obs_window, want_scores;
    kvb_score_row *acc; /* [layer][head] */
    kvb_kvzap *zap;     /* KVzap's scorer, run on each prefill chunk (NULL: none) */
    double scorer_ms;   /* its time: the device drained first, so the forward's queued work is not counted in it */
};

static int share_pre_attend(void *self, kvb_ctx *c, int layer, const float *q, int64_t n_q, char *err, size_t err_len) {
    (void)q;
    kvb_share *s = self;
    if (!s->zap || !c->in_prefill) return 0;
    if (c->be->sync && c->be->sync(c->be)) return ERR("%s", c->be->error);
    const double t0 = kvb_now_s();
    int rc = kvb_kvzap_record(s->zap, c, layer, n_q, err, err_len);
    s->scorer_ms += (kvb_now_s() - t0) * 1e3;
    return rc;
}

double kvb_share_scorer_ms(const kvb_share *s) { return s ? s->scorer_ms : 0; }

int kvb_share_run_scorer(kvb_share *s, const char *spec, char *err, size_t err_len) {
    if (s->zap) return strcmp(kvb_kvzap_spec(s->zap), spec) ? ERR("a shared prefill runs one KVzap scorer") : 0;
    if (s->c->n_past) return ERR("a shared prefill's scorer must be set before its prefill");
    if (!(s->zap = kvb_kvzap_open(spec, &s->c->model->cfg, err, err_len))) return -1;
    s->hooks.pre_attend = share_pre_attend;
    return 0;
}

kvb_share *kvb_share_for(kvb_ctx *c, const kvb_method_needs *u, char *err, size_t err_len) {
    kvb_share *s = kvb_share_create(c, u->obs_window, u->prefill_scores, err, err_len);
    if (s && u->scorer[0] && kvb_share_run_scorer(s, u->scorer, err, err_len)) {
        kvb_share_free(s, c);
        return NULL;
    }
    return s;
}

const kvb_kvzap *kvb_share_kvzap(const kvb_share *s) { return s->zap; }

int kvb_share_ran_scorer(const kvb_share *s, const char *spec) {
    return s && s->zap && !strcmp(kvb_kvzap_spec(s->zap), spec);
}

/* the prefill's queries: their attention summed per slot (H2O's score), the probabilities never written */
static int share_sum_rows(void *self, kvb_ctx *c, int layer, const kvb_src *src, int64_t n_q, float **rows, char *err,
                          size_t err_len) {
    (void)n_q;
    kvb_share *s = self;
    if (!s->want_scores || !c->in_prefill) return 0;
    return kvb_score_rows_for_sums(c, &s->acc[(size_t)layer * c->model->cfg.n_head_kv], src, rows, err, err_len);
}

kvb_share *kvb_share_create(kvb_ctx *c, int obs_window, int want_scores, char *err, size_t err_len) {
    const kvb_config *cfg = &c->model->cfg;
    size_t nh = (size_t)cfg->n_layer * cfg->n_head_kv;
    kvb_share *s = calloc(1, sizeof *s);
    if (s) {
        s->c = c;
        s->acc = calloc(nh, sizeof *s->acc);
    }
    if (!s || !s->acc) {
        kvb_share_free(s, NULL);
        ERR("out of memory");
        return NULL;
    }
    s->obs_window = obs_window;
    s->want_scores = want_scores;
    s->hooks.self = s;
    s->hooks.obs_window = obs_window;
    s->hooks.obs_decode = 1; /* the shared prefill's forks copy the window whenever they are made */
    if (want_scores) s->hooks.sum_rows = share_sum_rows;
    if (kvb_ctx_set_hooks(c, &s->hooks, err, err_len)) {
        kvb_share_free(s, NULL);
        return NULL;
    }
    return s;
}

const float *kvb_share_scores(const kvb_share *s, int layer, int h, int64_t *n) {
    if (!s->want_scores) return NULL;
    size_t i = (size_t)layer * s->c->model->cfg.n_head_kv + h;
    *n = s->acc[i].n;
    return s->acc[i].v;
}

int kvb_share_obs_window(const kvb_share *s) { return s->obs_window; }

void kvb_share_free(kvb_share *s, kvb_ctx *c) {
    if (!s) return;
    if (c && c->hooks == &s->hooks) c->hooks = NULL;
    if (s->acc) {
        size_t nh = (size_t)s->c->model->cfg.n_layer * s->c->model->cfg.n_head_kv;
        for (size_t i = 0; i < nh; i++) kvb_score_row_free(s->c, &s->acc[i]);
    }
    free(s->acc);
    kvb_kvzap_free(s->zap);
    free(s);
}

int kvb_share_serves(const kvb_share *s, const kvb_method *m, char *err, size_t err_len) {
    if (m->def->scorer && !(s && s->zap))
        return ERR("method %s needs its scorer's prefill scores: the shared prefill did not run one", m->name);
    if ((m->def->traits & KVB_PREFILL_SCORES) && (!s || !s->want_scores))
        return ERR("method %s needs prefill attention scores: the shared prefill did not record them", m->name);
    if (m->hooks.obs_window > 0 && (!s || s->obs_window < m->hooks.obs_window))
        return ERR("method %s needs a %d-token observation window, the shared prefill kept %d", m->name, m->hooks.obs_window,
                   s ? s->obs_window : 0);
    return 0;
}
