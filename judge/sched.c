/* sched.c — continuous batching on a fixed KV pool (sched.h has the policy). */
#include "judge/sched.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/batch.h"
#include "engine/kvcache.h"

#define ERR(...) (snprintf(err, err_len, __VA_ARGS__), -1)

/* one request from submit to its end */
typedef struct {
    const kvb_sched *sched;
    kvb_sched_req r;
    int32_t *ids; /* owned copy of r.ids */
    char method[64];
    int has_method;
    kvb_budget budget;
    kvb_opts opts;
    double t_arrive, t_admit, t_first, t_last;
    int waited;
    kvb_ctx *c;
    kvb_method *m;
    kvb_session s;
    int session_live;
    int64_t promised; /* pages */
    int64_t need;     /* pages promised at admission (0: not yet known) */
    int layerwise;    /* its method ends the prefill layer by layer, the prompt prefilled as one chunk */
    int64_t prefill_peak; /* most pages measured held during its prefill */
    kvb_rounds rounds; /* the prompt as one round (ids: the copy above) */
    int64_t round_end, pre_done; /* tokens prefilled so far */
} seq;

struct kvb_sched {
    kvb_sched_opts o;
    kvb_ctx *owner; /* owns the backend every sequence's context shares (it holds no sequence) */
    kvb_batch *batch;
    kvp_pool pool;
    int unlimited;
    double t0;
    seq **wait;
    int n_wait, cap_wait, wait_head_blocked;
    seq **run;
    int n_run;
    seq *pre; /* the admitted request whose prefill is under way (one at a time), or NULL */
    kvb_sched_stats st;
};

static double mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

double kvb_sched_now(const kvb_sched *s) { return mono_ms() - s->t0; }

kvb_sched *kvb_sched_create(const kvb_sched_opts *o, char *err, size_t err_len) {
    kvb_sched *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    s->o = *o;
    if (s->o.max_batch <= 0) s->o.max_batch = 64;
    if (s->o.ctx.n_ctx <= 0) s->o.ctx.n_ctx = o->model->cfg.n_ctx_train;
    s->o.ctx.share_backend = NULL;
    kvb_ctx_params op = s->o.ctx;
    op.n_ctx = 16;
    op.n_batch = 1;
    if (!(s->owner = kvb_ctx_create(o->model, &op, err, err_len))) goto fail;
    s->o.ctx.share_backend = s->owner->be;
    if (!(s->batch = kvb_batch_create(o->model, s->owner->be, s->o.max_batch, err, err_len))) goto fail;
    s->unlimited = o->pool_bytes <= 0;
    if (kvp_init(&s->pool, s->unlimited ? INT64_MAX / 4 : o->pool_bytes, kvc_slot_bytes(s->owner->kv), o->page_tokens,
                 err, err_len))
        goto fail;
    s->run = calloc((size_t)s->o.max_batch, sizeof *s->run);
    if (!s->run) {
        snprintf(err, err_len, "out of memory");
        goto fail;
    }
    s->st.pool_pages = s->unlimited ? 0 : s->pool.n_pages;
    s->st.page_bytes = s->pool.page_bytes;
    s->t0 = mono_ms();
    return s;
fail:
    kvb_sched_free(s);
    return NULL;
}

static void seq_free(seq *q) {
    if (!q) return;
    if (q->session_live) kvb_session_free(&q->s);
    if (q->c) {
        kvb_method_free(q->m, q->c);
        kvb_ctx_free(q->c);
    }
    free(q->ids);
    free(q);
}

void kvb_sched_free(kvb_sched *s) {
    if (!s) return;
    for (int i = 0; i < s->n_wait; i++) seq_free(s->wait[i]);
    for (int i = 0; i < s->n_run; i++) seq_free(s->run[i]);
    seq_free(s->pre);
    free(s->wait);
    free(s->run);
    kvb_batch_free(s->batch);
    kvb_ctx_free(s->owner);
    free(s);
}

int kvb_sched_waiting(const kvb_sched *s) { return s->n_wait; }
int kvb_sched_running(const kvb_sched *s) { return s->n_run + (s->pre != NULL); }

void kvb_sched_get_stats(const kvb_sched *s, kvb_sched_stats *st) {
    *st = s->st;
    st->peak_reserved = s->unlimited ? 0 : s->pool.peak_reserved;
}

int kvb_sched_submit(kvb_sched *s, const kvb_sched_req *r, char *err, size_t err_len) {
    if (!r->ids || r->n <= 0) return ERR("request %lld: no prompt tokens", (long long)r->id);
    if (r->max_new < 1) return ERR("request %lld: max_new must be at least 1", (long long)r->id);
    if ((int64_t)r->n + r->max_new > s->o.ctx.n_ctx)
        return ERR("request %lld: %d prompt tokens + %d new > context %d", (long long)r->id, r->n, r->max_new,
                   s->o.ctx.n_ctx);
    for (int i = 0; i < r->n; i++)
        if (r->ids[i] < 0 || r->ids[i] >= s->o.model->cfg.n_vocab)
            return ERR("request %lld: token id %d out of range (vocabulary %d)", (long long)r->id, r->ids[i],
                       s->o.model->cfg.n_vocab);
    const char *name = r->method ? r->method : s->o.method;
    if (name && !kvb_method_find(name)) return ERR("request %lld: unknown method '%s'", (long long)r->id, name);
    if (s->n_wait == s->cap_wait) {
        int cap = s->cap_wait ? 2 * s->cap_wait : 16;
        seq **w = realloc(s->wait, (size_t)cap * sizeof *w);
        if (!w) return ERR("out of memory");
        s->wait = w;
        s->cap_wait = cap;
    }
    seq *q = calloc(1, sizeof *q);
    if (!q || !(q->ids = malloc((size_t)r->n * sizeof *q->ids))) {
        free(q);
        return ERR("out of memory");
    }
    q->sched = s;
    q->r = *r;
    memcpy(q->ids, r->ids, (size_t)r->n * sizeof *q->ids);
    q->r.ids = q->ids;
    q->has_method = name != NULL;
    if (name) snprintf(q->method, sizeof q->method, "%s", name);
    /* a layer-local end of prefill needs the prompt's last chunk to hold the whole prompt (its context's n_batch is
     * made the prompt's length): the scheduler's prefill is whole, or cut in pieces as long as the prompt */
    q->layerwise = kvb_sched_layerwise(name, s->o.prefill_chunk, r->n);
    q->budget = r->method ? r->budget : s->o.budget;
    if (!r->method) q->opts = s->o.opts;
    else if (r->opts) q->opts = *r->opts;
    q->t_arrive = r->arrive_ms > 0 ? r->arrive_ms : kvb_sched_now(s);
    s->wait[s->n_wait++] = q;
    return 0;
}

/* The request ends: its result to the callback, its pages back to the pool, its memory freed. */
static void end_seq(kvb_sched *s, seq *q, int ok, const char *why, kvb_sched_done_fn done, void *user) {
    kvb_sched_result res;
    memset(&res, 0, sizeof res);
    res.id = q->r.id;
    res.user = q->r.user;
    res.ok = ok;
    if (!ok) snprintf(res.err, sizeof res.err, "%s", why);
    res.n_prompt = q->r.n;
    if (q->session_live) {
        res.finish = q->s.finish;
        res.n_gen = q->s.n_gen;
        res.gen = q->s.gen;
        res.text = q->s.text ? q->s.text : "";
        res.kv_device_bytes = q->s.kv_end.device_bytes;
    }
    res.t_arrive = q->t_arrive;
    res.t_admit = q->t_admit;
    res.t_first = q->t_first;
    res.t_last = q->t_last;
    res.t_done = kvb_sched_now(s);
    res.waited = q->waited;
    if (ok) s->st.finished++;
    else s->st.failed++;
    kvp_release(&s->pool, q->promised);
    q->promised = 0;
    if (done) done(user, &res);
    seq_free(q);
}

/* Device pages q holds now (store heads, the method's packed-load heads and its other device buffers), the heads'
 * slots grown by grow tokens (a packed-load head takes each decoded token's row as a store head does: OmniKV's sparse
 * layers, Round Attention's deep ones). */
int64_t kvb_sched_held_pages(const kvp_pool *p, const kvb_method *m, const kvb_ctx *c, int64_t grow) {
    kvb_kv_usage u;
    if (m) kvb_method_usage(m, c, &u);
    else kvb_ctx_kv_usage(c, &u);
    const kvc_store *vis = m ? m->vis : NULL;
    int64_t extra = u.device_bytes - kvc_used_bytes(c->kv, KVB_TIER_DEVICE);
    if (vis) extra -= kvc_used_bytes(vis, KVB_TIER_DEVICE);
    return kvp_ctx_pages(p, c, grow, extra > 0 ? extra : 0) + (vis ? kvp_store_pages(p, &c->model->cfg, vis, grow) : 0);
}

static int64_t held_pages(const kvb_sched *s, const seq *q, int64_t grow) {
    return kvb_sched_held_pages(&s->pool, q->m, q->c, grow);
}

/* Move q's promise to `pages`: pages given back, or taken (an overdraft when the pool lacks them). */
static void repromise(kvb_sched *s, seq *q, int64_t pages) {
    if (kvp_repromise(&s->pool, &q->promised, pages)) s->st.overdrafts++;
}

/* The engine's observer of each layer's attention during q's prefill (its KV appended; with a layer-wise end, the
 * layers before it already compressed): what q holds there, the prefill's peak, measured. */
static void watch_prefill(void *user, kvb_ctx *c, int layer, const kvb_src *src, int64_t n_q) {
    (void)c, (void)layer, (void)src, (void)n_q;
    seq *q = user;
    const int64_t h = held_pages(q->sched, q, 0);
    if (h > q->prefill_peak) q->prefill_peak = h;
}

/* Context, method, session and prefill of a request; -1 + why on failure. */
static int start_seq(kvb_sched *s, seq *q, char *why, size_t why_len) {
    kvb_ctx_params cp = s->o.ctx;
    if (q->layerwise && cp.n_batch < q->r.n) cp.n_batch = q->r.n; /* the prompt in one forward chunk */
    if (!(q->c = kvb_ctx_create(s->o.model, &cp, why, why_len))) return -1;
    if (q->has_method) {
        kvb_opts o = q->opts; /* a method marks what it reads: a fresh copy per request */
        if (!(q->m = kvb_method_create(q->method, q->c, &q->budget, &o, why, why_len))) return -1;
    }
    if (q->layerwise) kvb_ctx_end_prefill_by_layer(q->c, q->r.n);
    q->c->on_visible = watch_prefill;
    q->c->on_visible_user = q;
    kvb_session_method seam = kvb_method_seam(q->m);
    kvb_gen_params gp = {0};
    gp.max_new = q->r.max_new;
    gp.ignore_eos = q->r.ignore_eos;
    gp.temp = q->r.temp;
    gp.top_p = q->r.top_p;
    gp.seed = q->r.seed;
    gp.stop = q->r.stop;
    gp.n_stop = q->r.n_stop;
    if (kvb_session_init(&q->s, q->c, &seam, &gp, why, why_len)) return -1;
    q->session_live = 1;
    q->round_end = q->r.n;
    kvb_rounds rounds = {q->ids, q->r.n, &q->round_end, 1, 0, 0};
    q->rounds = rounds;
    return 0;
}

/* One piece of the prefill under way (opts.prefill_chunk tokens, or all): when it ends, the request joins the
 * running set with its promise moved to what its method holds. */
static void prefill_part(kvb_sched *s, kvb_sched_done_fn done, void *user) {
    seq *q = s->pre;
    char why[384];
    const double t = mono_ms();
    const int rc = kvb_session_prefill_part(&q->s, &q->rounds, s->o.prefill_chunk, &q->pre_done, why, sizeof why);
    s->st.prefill_ms += mono_ms() - t;
    s->st.busy_ms += mono_ms() - t;
    s->st.prefill_parts++;
    if (rc > 0) return;
    s->pre = NULL;
    if (rc < 0) {
        end_seq(s, q, 0, why, done, user);
        return;
    }
    s->st.prefills++;
    q->c->on_visible = NULL;
    if (q->prefill_peak > s->st.peak_prefill) s->st.peak_prefill = q->prefill_peak;
    if (q->prefill_peak > q->promised) s->st.overdrafts++; /* measured above its promise while it prefilled */
    repromise(s, q, held_pages(s, q, q->r.max_new));
    s->run[s->n_run++] = q;
    if (s->n_run > s->st.max_running) s->st.max_running = s->n_run;
}

int kvb_sched_layerwise(const char *method, int64_t prefill_chunk, int64_t n_prompt) {
    const kvb_method_def *d = method ? kvb_method_find(method) : NULL;
    return d && (d->traits & KVB_LAYER_LOCAL) && (prefill_chunk <= 0 || prefill_chunk >= n_prompt);
}

int64_t kvb_sched_peak_pages(const kvp_pool *p, const kvb_config *cfg, const kvb_method *m, int layerwise,
                             int64_t n_prompt, int64_t max_new, char *why, size_t why_len) {
    const int64_t full = kvp_full_pages(p, cfg, n_prompt + max_new);
    if (!layerwise || !m || (!m->def->kept_tokens && !m->imposes_budget)) return full;
    int64_t keep[KVB_MAX_LAYERS]; /* per layer, at the end of prefill */
    if (m->def->kept_tokens) {
        if (m->def->kept_tokens(m, n_prompt, keep, why, why_len)) return -1;
    } else {
        if (kvb_method_budget_tokens(m, n_prompt, &keep[0], why, why_len)) return -1;
        for (int l = 1; l < cfg->n_layer; l++) keep[l] = keep[0];
    }
    const int64_t lw = kvp_layerwise_pages(p, cfg, n_prompt, keep, max_new);
    return lw < full ? lw : full;
}

/* The pages q is promised at admission, its peak (q->need, worked out once: kvb_sched_peak_pages); a layer-wise
 * request's context and method are made here, to know what it keeps. -1 + why when the context or method cannot be
 * made. */
static int admission_pages(kvb_sched *s, seq *q, char *why, size_t why_len) {
    if (q->need > 0) return 0;
    if (q->layerwise && !q->c && start_seq(s, q, why, why_len)) return -1;
    const int64_t need = kvb_sched_peak_pages(&s->pool, &s->o.model->cfg, q->layerwise ? q->m : NULL, q->layerwise,
                                              q->r.n, q->r.max_new, why, why_len);
    if (need < 0) return -1;
    q->need = need;
    return 0;
}

/* Admit the first waiting request when the batch and the pool have room (refusing those the pool can never hold),
 * unless a prefill is under way; then advance the prefill by one piece. */
static void admit(kvb_sched *s, kvb_sched_done_fn done, void *user) {
    while (!s->pre && s->n_wait > 0 && s->n_run < s->o.max_batch) {
        seq *q = s->wait[0];
        char why[384];
        if (admission_pages(s, q, why, sizeof why)) {
            memmove(s->wait, s->wait + 1, (size_t)--s->n_wait * sizeof *s->wait);
            end_seq(s, q, 0, why, done, user);
            continue;
        }
        const int64_t need = q->need;
        if (need > s->pool.n_pages) {
            snprintf(why, sizeof why,
                     "request %lld needs %lld KV pages (%.1f MiB) at its peak; the pool holds %lld (%.1f MiB)",
                     (long long)q->r.id, (long long)need, need * (double)s->pool.page_bytes / 1048576.0,
                     (long long)s->pool.n_pages, s->pool.n_pages * (double)s->pool.page_bytes / 1048576.0);
            memmove(s->wait, s->wait + 1, (size_t)--s->n_wait * sizeof *s->wait);
            s->st.refused++;
            end_seq(s, q, 0, why, done, user);
            continue;
        }
        if (kvp_reserve(&s->pool, need)) {
            if (!q->waited) s->st.waits++;
            q->waited = 1;
            return;
        }
        memmove(s->wait, s->wait + 1, (size_t)--s->n_wait * sizeof *s->wait);
        q->promised = need;
        q->t_admit = kvb_sched_now(s);
        if (!q->c && start_seq(s, q, why, sizeof why)) {
            end_seq(s, q, 0, why, done, user);
            return;
        }
        s->pre = q;
    }
    if (s->pre) prefill_part(s, done, user);
}

/* Requests whose cancel says so end now, waiting or running. */
static void reap_cancelled(kvb_sched *s, kvb_sched_done_fn done, void *user) {
    int kept = 0;
    for (int i = 0; i < s->n_wait; i++) {
        seq *q = s->wait[i];
        if (q->r.cancel && q->r.cancel(q->r.user)) {
            s->st.cancelled++;
            end_seq(s, q, 0, "cancelled", done, user);
        } else {
            s->wait[kept++] = q;
        }
    }
    s->n_wait = kept;
    kept = 0;
    for (int i = 0; i < s->n_run; i++) {
        seq *q = s->run[i];
        if (q->r.cancel && q->r.cancel(q->r.user)) {
            s->st.cancelled++;
            end_seq(s, q, 0, "cancelled", done, user);
        } else {
            s->run[kept++] = q;
        }
    }
    s->n_run = kept;
    if (s->pre && s->pre->r.cancel && s->pre->r.cancel(s->pre->r.user)) {
        seq *q = s->pre;
        s->pre = NULL;
        s->st.cancelled++;
        end_seq(s, q, 0, "cancelled", done, user);
    }
}

int kvb_sched_step(kvb_sched *s, kvb_sched_done_fn done, void *user, char *err, size_t err_len) {
    reap_cancelled(s, done, user);
    admit(s, done, user);
    const int k = s->n_run;
    if (k == 0) return 0;
    kvb_session **ss = malloc((size_t)k * sizeof *ss);
    int *ret = malloc((size_t)k * sizeof *ret);
    const char **piece = malloc((size_t)k * sizeof *piece);
    size_t *len = malloc((size_t)k * sizeof *len);
    if (!ss || !ret || !piece || !len) {
        free(ss), free(ret), free(piece), free(len);
        return ERR("out of memory");
    }
    for (int i = 0; i < k; i++) ss[i] = &s->run[i]->s;
    const double t_begin = mono_ms(), t_tok = kvb_sched_now(s);
    char why[384];
    const int rc = kvb_session_step_batch(ss, k, s->batch, ret, piece, len, why, sizeof why);
    const double step_ms = mono_ms() - t_begin;
    s->st.steps++;
    s->st.step_seqs += k;
    s->st.decode_ms += step_ms;
    s->st.busy_ms += step_ms;
    s->st.running_ms += k * step_ms;
    s->st.reserved_page_ms += (double)s->pool.reserved * step_ms;
    int64_t held = 0;
    int kept = 0;
    for (int i = 0; i < k; i++) {
        seq *q = s->run[i];
        if (rc) { /* the step's sessions are unusable (session.h): each request ends with the step's error */
            end_seq(s, q, 0, why, done, user);
            continue;
        }
        if (ret[i] == 1) {
            if (q->t_first == 0) q->t_first = t_tok;
            q->t_last = t_tok;
            if (q->r.on_token && len[i]) q->r.on_token(q->r.user, piece[i], len[i]);
        }
        if (q->s.finish) {
            char ferr[384];
            int ok = kvb_session_finish(&q->s, ferr, sizeof ferr) == 0;
            end_seq(s, q, ok, ferr, done, user);
            continue;
        }
        int64_t h = held_pages(s, q, 0);
        held += h;
        if (h > q->promised) repromise(s, q, h);
        s->run[kept++] = q;
    }
    s->n_run = kept;
    s->st.held_page_ms += (double)held * step_ms;
    if (held > s->st.peak_held) s->st.peak_held = held;
    free(ss), free(ret), free(piece), free(len);
    return 0;
}
