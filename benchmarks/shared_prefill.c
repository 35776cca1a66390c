/* shared_prefill.c — one exact prefill per sample, kept across the questions of a context group
 * (shared_prefill.h). */
#include "benchmarks/shared_prefill.h"

#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "benchmarks/hidden.h"

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

/* questions of a group differ in length: room for a longer one, so it can reuse the context's prefill */
#define QUESTION_SLACK_TOKENS 64

void kvb_shared_prefill_free(kvb_shared_prefill *sp) {
    kvb_share_free(sp->share, sp->base);
    kvb_ctx_free(sp->hist); /* forks first: they use the base's backend */
    kvb_ctx_free(sp->base);
    kvb_prompt_free(&sp->p);
    free(sp->group);
    memset(sp, 0, sizeof *sp);
}

int64_t kvb_shared_prefill_tokens(const kvb_shared_prefill *sp) { return sp->reused ? sp->p.n - sp->split : sp->p.n; }

/* Whether the prefill kept in sp serves sample s, whose prompt p splits at split: same group, same context ids,
 * a share recording what u needs, and room for the question and answer. */
static int can_reuse(const kvb_shared_prefill *sp, const kvb_sample *s, const kvb_prompt *p, int64_t split,
                     const kvb_method_needs *u, int max_new) {
    return sp->base && sp->hidden && sp->group && s->group && !strcmp(sp->group, s->group) && split == sp->split &&
           !memcmp(p->ids, sp->p.ids, (size_t)split * sizeof *p->ids) && u->obs_window <= sp->obs_window &&
           (!u->prefill_scores || sp->prefill_scores) && !u->own_prefill &&
           p->n + max_new + 1 <= sp->base->params.n_ctx;
}

/* The forward over sp->p up to `end`; a method that prefills the question round itself forks from the history
 * rounds. */
static int prefill(const kvb_prefill_env *e, const kvb_method_needs *u, int64_t end, kvb_shared_prefill *sp,
                   char *err, size_t err_len) {
    int last = sp->p.n_rounds - 1, fork_hist = u->own_prefill && last > 0 && !sp->split;
    double t0 = kvb_now_s();
    if (kvb_prefill_rounds(sp->base, &sp->p, 0, fork_hist ? sp->p.round_end[last - 1] : end, &e->gp, err, err_len)) return -1;
    double fwd_s = kvb_now_s() - t0; /* forward time only: the fork is not prefill */
    if (fork_hist) {
        sp->hist_ms = fwd_s * 1e3;
        if (!(sp->hist = kvb_ctx_fork(sp->base, 0, err, err_len))) return -1;
        t0 = kvb_now_s();
        if (kvb_prefill_rounds(sp->base, &sp->p, last, end, &e->gp, err, err_len)) return -1;
        fwd_s += kvb_now_s() - t0;
    }
    sp->prefill_ms = fwd_s * 1e3;
    for (int ph = 0; ph < PROF_PHASE_COUNT; ph++)
        sp->pre_phase_ms[ph] = prof_total_ns(sp->base->prof, PROF_PREFILL, (prof_phase)ph) / 1e6;
    return 0;
}

int kvb_shared_prefill_run(const kvb_prefill_env *e, const kvb_sample *s, int hidden, const kvb_method_needs *u,
                           int max_new, kvb_shared_prefill *sp, char *err, size_t err_len) {
    kvb_prompt p;
    int64_t split = 0, max_prompt = e->n_ctx - max_new - 1;
    if (kvb_prompt_build(e->model, s, max_prompt, e->round_chunk, &p, err, err_len)) {
        kvb_shared_prefill_free(sp);
        return -1;
    }
    if (hidden && kvb_hidden_split(e->model, s, &p, &split, err, err_len)) {
        kvb_prompt_free(&p);
        kvb_shared_prefill_free(sp);
        return -1;
    }
    if (hidden && can_reuse(sp, s, &p, split, u, max_new)) { /* the question alone is new */
        kvb_prompt_free(&sp->p);
        sp->p = p;
        sp->reused = 1;
        return 0;
    }
    kvb_shared_prefill_free(sp);
    sp->p = p;
    sp->hidden = hidden;
    sp->split = split;
    kvb_ctx_params cp = e->cp;
    int64_t n_ctx = p.n + max_new + 1;
    if (hidden && s->group) { /* the group's later questions fork this context: room for a longer one */
        n_ctx += QUESTION_SLACK_TOKENS;
        if (n_ctx > e->n_ctx) n_ctx = e->n_ctx;
        if (n_ctx < p.n + max_new + 1) n_ctx = p.n + max_new + 1;
        if (!(sp->group = strdup(s->group))) return ERR("out of memory");
    }
    cp.n_ctx = (int)n_ctx;
    if (!(sp->base = kvb_ctx_create(e->model, &cp, err, err_len))) return -1;
    sp->obs_window = u->obs_window;
    sp->prefill_scores = u->prefill_scores;
    if (!(sp->share = kvb_share_create(sp->base, u->obs_window, u->prefill_scores, err, err_len))) return -1;
    /* hidden: the question is prefilled per method, after compression */
    return prefill(e, u, split ? split : p.n, sp, err, err_len);
}
