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

int64_t kvb_shared_prefill_tokens(const kvb_shared_prefill *sp) {
    return sp->reused ? sp->p.n - (sp->own > sp->split ? sp->own : sp->split) : sp->p.n;
}

int kvb_shared_prefill_adopt(kvb_session *ses, const kvb_shared_prefill *sp, double shared_ms, char *err, size_t err_len) {
    int64_t own = sp->own > sp->split ? sp->own : sp->split;
    if (own == sp->split) /* the whole prompt (no split), a hidden question, or a carried first turn */
        return kvb_session_adopt(ses, sp->share, shared_ms, sp->p.ids + sp->split, sp->split ? sp->p.n - sp->split : 0,
                                 err, err_len);
    if (kvb_session_adopt(ses, sp->share, shared_ms, sp->p.ids + sp->split, own - sp->split, err, err_len)) return -1;
    if (sp->reused) { /* the cache as the group's earlier turns left it: theirs to count */
        ses->prefill_ms = 0;
        memset(ses->pre_phase_ms, 0, sizeof ses->pre_phase_ms);
    }
    return kvb_session_append(ses, sp->p.ids + own, sp->p.n - own, err, err_len);
}

double kvb_shared_prefill_cell_ms(const kvb_shared_prefill *sp, const kvb_method_needs *nd) {
    return sp->prefill_ms - (nd->scorer[0] ? 0 : sp->scorer_ms);
}

/* Whether the prefill kept in sp serves sample s, whose prompt p splits at split: same group, same context ids,
 * a share recording what u needs, and room for the question and answer. A cell whose method prefills itself
 * (u->own_prefill) does not stop the others' reuse: with a split it is refused anyway (runner.c run_cell). */
static int can_reuse(const kvb_shared_prefill *sp, const kvb_sample *s, const kvb_prompt *p, int64_t split,
                     const kvb_method_needs *u, int max_new) {
    return sp->base && sp->hidden && sp->group && s->group && !strcmp(sp->group, s->group) && split == sp->split &&
           !memcmp(p->ids, sp->p.ids, (size_t)split * sizeof *p->ids) && u->obs_window <= sp->obs_window &&
           (!u->prefill_scores || sp->prefill_scores) && (!u->scorer[0] || kvb_share_ran_scorer(sp->share, u->scorer)) && p->n + max_new + 1 <= sp->base->params.n_ctx;
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
    sp->scorer_ms = kvb_share_scorer_ms(sp->share);
    for (int ph = 0; ph < PROF_PHASE_COUNT; ph++)
        sp->pre_phase_ms[ph] = prof_total_ns(sp->base->prof, PROF_PREFILL, (prof_phase)ph) / 1e6;
    return 0;
}

/* The context that prefills sp->p (room for its answer, and for a group's later questions), the share recording
 * what u needs, and the forward. s: the sample (its group), NULL for bare ids. */
static int start(const kvb_prefill_env *e, const kvb_sample *s, int carried, const kvb_method_needs *u, int max_new,
                 kvb_shared_prefill *sp, char *err, size_t err_len) {
    kvb_ctx_params cp = e->cp;
    int64_t n_ctx = sp->p.n + max_new + 1;
    if (sp->hidden && s && s->group) { /* the group's later questions fork this context: room for a longer one (a
                                        * carried conversation's later turns: the whole context) */
        n_ctx += carried ? e->n_ctx : QUESTION_SLACK_TOKENS;
        if (n_ctx > e->n_ctx) n_ctx = e->n_ctx;
        if (n_ctx < sp->p.n + max_new + 1) n_ctx = sp->p.n + max_new + 1;
        if (!(sp->group = strdup(s->group))) return ERR("out of memory");
    }
    cp.n_ctx = (int)n_ctx;
    /* the prompt and its answer reserved up front, as full attention's timed decode needs: grown chunk by chunk, a head can end
     * the prefill with no room left (a 512-token chunk grows it to exactly its rows), and every cell's fork keeps
     * that capacity, so full attention's first timed decode step would reallocate and copy every head */
    cp.kv_reserve = sp->p.n + max_new + 1;
    if (!(sp->base = kvb_ctx_create(e->model, &cp, err, err_len))) return -1;
    sp->obs_window = u->obs_window;
    sp->prefill_scores = u->prefill_scores;
    if (!(sp->share = kvb_share_for(sp->base, u, err, err_len))) return -1;
    /* hidden: the question is prefilled per method, after compression */
    return prefill(e, u, sp->split ? sp->split : sp->p.n, sp, err, err_len);
}

int kvb_shared_prefill_run(const kvb_prefill_env *e, const kvb_sample *s, int hidden, const kvb_method_needs *u,
                           int max_new, kvb_shared_prefill *sp, char *err, size_t err_len) {
    kvb_prompt p;
    int64_t split = 0, own = 0, max_prompt = e->n_ctx - max_new - 1;
    kvb_prompt_fn build = e->prompt ? e->prompt : kvb_prompt_build;
    int carried = s->carried && s->group;
    if (carried ? kvb_carried_build(e->model, s, max_prompt, &p, &split, &own, err, err_len)
                : build(e->model, s, max_prompt, e->round_chunk, &p, err, err_len)) {
        kvb_shared_prefill_free(sp);
        return -1;
    }
    hidden |= carried;
    if (hidden && !carried && kvb_hidden_split(e->model, s, &p, &split, err, err_len)) {
        kvb_prompt_free(&p);
        kvb_shared_prefill_free(sp);
        return -1;
    }
    if (hidden && can_reuse(sp, s, &p, split, u, max_new)) { /* the question alone is new */
        kvb_prompt_free(&sp->p);
        sp->p = p;
        sp->own = own;
        sp->reused = 1;
        return 0;
    }
    kvb_shared_prefill_free(sp);
    sp->p = p;
    sp->hidden = hidden;
    sp->split = split;
    sp->own = own;
    return start(e, s, carried, u, max_new, sp, err, err_len);
}

int kvb_shared_prefill_ids(const kvb_prefill_env *e, const int32_t *ids, int64_t n, const kvb_method_needs *u,
                           int max_new, kvb_shared_prefill *sp, char *err, size_t err_len) {
    kvb_shared_prefill_free(sp);
    if (!(sp->p.ids = malloc((size_t)n * sizeof *ids))) return ERR("out of memory");
    memcpy(sp->p.ids, ids, (size_t)n * sizeof *ids);
    sp->p.n = n;
    if (kvb_rounds_chunk(&sp->p, 0, err, err_len)) return -1;
    return start(e, NULL, 0, u, max_new, sp, err, err_len);
}
