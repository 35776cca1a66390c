/* session.c — one sample through the engine: rounds → prefill → decode until the stop rule → cost. */
#include "engine/session.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/kvcache.h"

#define ERR(...) (snprintf(err, err_len, __VA_ARGS__), -1)

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int kvb_rounds_chunk(kvb_rounds *r, int64_t chunk, char *err, size_t err_len) {
    if (chunk <= 0) chunk = r->n > 0 ? r->n : 1;
    int64_t q = r->n % chunk ? r->n % chunk : (r->n < chunk ? r->n : chunk), hist = r->n - q;
    int nr = (int)(hist / chunk) + 1;
    int64_t *end = malloc((size_t)nr * sizeof *end);
    if (!end) return ERR("out of memory");
    for (int i = 0; i + 1 < nr; i++) end[i] = (int64_t)(i + 1) * chunk;
    end[nr - 1] = r->n;
    free(r->round_end);
    r->round_end = end;
    r->n_rounds = nr;
    r->real_rounds = 0;
    return 0;
}

void kvb_rounds_free(kvb_rounds *r) {
    free(r->ids);
    free(r->round_end);
    memset(r, 0, sizeof *r);
}

void kvb_ctx_kv_usage(const kvb_ctx *c, kvb_kv_usage *u) {
    memset(u, 0, sizeof *u);
    u->device_bytes = kvc_used_bytes(c->kv, KVB_TIER_DEVICE);
    u->host_bytes = kvc_used_bytes(c->kv, KVB_TIER_HOST);
    const kvb_config *cfg = &c->model->cfg;
    int64_t full_tokens = 0; /* per KV head, over layers: a local layer holds only its window */
    for (int l = 0; l < cfg->n_layer; l++) full_tokens += kvb_ctx_full_tokens(c, l);
    u->full_bytes = full_tokens * cfg->n_head_kv * kvc_slot_bytes(c->kv);
    u->moved_h2d = c->mem.moved_bytes[KVB_TIER_HOST][KVB_TIER_DEVICE];
    u->moved_d2h = c->mem.moved_bytes[KVB_TIER_DEVICE][KVB_TIER_HOST];
    u->device_frac = u->full_bytes > 0 ? (double)u->device_bytes / (double)u->full_bytes : 0.0;
}

static void usage(const kvb_session *s, kvb_kv_usage *u) {
    if (s->m.usage) s->m.usage(s->m.self, s->c, u);
    else kvb_ctx_kv_usage(s->c, u);
}

int kvb_session_init(kvb_session *s, kvb_ctx *c, const kvb_session_method *m, const kvb_gen_params *p, char *err,
                     size_t err_len) {
    memset(s, 0, sizeof *s);
    s->c = c;
    if (m) s->m = *m;
    s->p = *p;
    s->first_eog = -1;
    tok_stream_init(&s->ts);
    int n_vocab = c->model->cfg.n_vocab;
    if (!(s->gen = malloc((size_t)(p->max_new + 1) * sizeof *s->gen)) ||
        sampler_init(&s->smp, n_vocab, p->temp, p->top_p, p->seed)) {
        kvb_session_free(s);
        return ERR("out of memory");
    }
    return 0;
}

void kvb_session_free(kvb_session *s) {
    sampler_free(&s->smp);
    free(s->gen);
    free(s->text);
    memset(s, 0, sizeof *s);
}

int kvb_prefill_rounds(kvb_ctx *c, const kvb_rounds *r, int r0, int64_t end, const kvb_gen_params *p, char *err,
                       size_t err_len) {
    int64_t at = r0 > 0 ? r->round_end[r0 - 1] : 0;
    if (end > r->n) end = r->n;
    for (int k = r0; k < r->n_rounds && at < end; k++) {
        int64_t stop = r->round_end[k] < end ? r->round_end[k] : end;
        if (kvb_ctx_begin_round(c, k, k == r->n_rounds - 1, err, err_len)) return -1;
        /* pieces of p->chunk from the round's start: the engine's own chunks are unchanged by the split */
        for (int64_t from = at; from < stop;) {
            if (p && p->cancel && p->cancel(p->user)) return ERR("cancelled");
            int64_t n = p && p->chunk > 0 && stop - from > p->chunk ? p->chunk : stop - from;
            if (kvb_forward(c, r->ids + from, n, err, err_len)) return -1;
            from += n;
            if (p && p->progress) p->progress(p->user, "prefill", from, r->n);
        }
        at = stop;
    }
    return 0;
}

static void phases(const kvb_ctx *c, prof_stage st, double *ms) {
    for (int ph = 0; ph < PROF_PHASE_COUNT; ph++) ms[ph] = prof_total_ns(c->prof, st, (prof_phase)ph) / 1e6;
}

/* The prefill took ms: measure what it left. */
static void prefilled(kvb_session *s, double ms) {
    s->prefill_ms += ms;
    usage(s, &s->kv_prefill);
    phases(s->c, PROF_PREFILL, s->pre_phase_ms);
}

int kvb_end_prefill(kvb_ctx *c, const kvb_session_method *m, char *err, size_t err_len) {
    if (kvb_ctx_end_prefill(c, err, err_len)) return -1;
    return m && m->verify ? m->verify(m->self, c, 1, err, err_len) : 0;
}

int kvb_session_prefill(kvb_session *s, const kvb_rounds *r, int r0, char *err, size_t err_len) {
    double t0 = now_ms();
    int rc = s->m.prefill && r0 == 0 && !r->real_rounds && r->n_rounds == 1
                 ? s->m.prefill(s->m.self, s->c, r->ids, r->n, err, err_len)
                 : kvb_prefill_rounds(s->c, r, r0, r->n, &s->p, err, err_len);
    if (rc || kvb_end_prefill(s->c, &s->m, err, err_len)) return -1;
    prefilled(s, now_ms() - t0);
    return 0;
}

int kvb_session_prefill_part(kvb_session *s, const kvb_rounds *r, int64_t chunk, int64_t *done, char *err,
                             size_t err_len) {
    if (r->n_rounds != 1 || r->real_rounds || (s->m.prefill && *done == 0)) { /* whole, as kvb_session_prefill */
        if (kvb_session_prefill(s, r, 0, err, err_len)) return -1;
        *done = r->n;
        return 0;
    }
    double t0 = now_ms();
    if (*done == 0 && kvb_ctx_begin_round(s->c, 0, 1, err, err_len)) return -1;
    int64_t n = chunk > 0 && r->n - *done > chunk ? chunk : r->n - *done;
    if (n > 0 && kvb_forward(s->c, r->ids + *done, n, err, err_len)) return -1;
    *done += n;
    if (*done < r->n) {
        s->prefill_ms += now_ms() - t0;
        return 1;
    }
    if (kvb_end_prefill(s->c, &s->m, err, err_len)) return -1;
    prefilled(s, now_ms() - t0);
    return 0;
}

int kvb_session_adopt(kvb_session *s, const void *shared, double shared_ms, const int32_t *tail, int64_t n_tail,
                      char *err, size_t err_len) {
    double t0 = now_ms();
    if ((s->m.adopt && s->m.adopt(s->m.self, s->c, shared, err, err_len)) || kvb_end_prefill(s->c, &s->m, err, err_len) ||
        (n_tail > 0 && kvb_forward(s->c, tail, n_tail, err, err_len)))
        return -1;
    prefilled(s, shared_ms + (now_ms() - t0));
    return 0;
}

int kvb_session_append(kvb_session *s, const int32_t *ids, int64_t n, char *err, size_t err_len) {
    double before[PROF_PHASE_COUNT], after[PROF_PHASE_COUNT], t0 = now_ms();
    phases(s->c, PROF_PREFILL, before);
    if (n > 0 && kvb_forward(s->c, ids, n, err, err_len)) return -1;
    s->prefill_ms += now_ms() - t0;
    phases(s->c, PROF_PREFILL, after);
    for (int ph = 0; ph < PROF_PHASE_COUNT; ph++) s->pre_phase_ms[ph] += after[ph] - before[ph];
    usage(s, &s->kv_prefill);
    return 0;
}

/* Append bytes to the text; 0 or -1 when out of memory. */
static int text_add(kvb_session *s, const char *p, size_t n) {
    if (s->text_n + n + 1 > s->text_cap) {
        size_t cap = (s->text_n + n + 1) * 2;
        char *t = realloc(s->text, cap);
        if (!t) return -1;
        s->text = t;
        s->text_cap = cap;
    }
    memcpy(s->text + s->text_n, p, n);
    s->text_n += n;
    s->text[s->text_n] = 0;
    return 0;
}

/* Cut the text at the first stop string that ends after byte `from` (a new match); 1 when cut. */
static int cut_stop(kvb_session *s, size_t from) {
    for (int i = 0; i < s->p.n_stop && s->text; i++) {
        size_t l = strlen(s->p.stop[i]), at = from >= l ? from - l + 1 : 0;
        char *hit = l ? strstr(s->text + at, s->p.stop[i]) : NULL;
        if (hit) {
            s->text_n = (size_t)(hit - s->text);
            s->text[s->text_n] = 0;
            return 1;
        }
    }
    return 0;
}

/* The sampling half of a step: pick the next token and apply the stop rule. 1 = *next must go through the model
 * (the step generated a token and generation goes on), 0 = no forward pass (finished, maybe with a last token),
 * -1 = error. *ret: kvb_session_step's answer. */
static int step_pick(kvb_session *s, int32_t *next, int *ret, const char **piece, size_t *n, char *err, size_t err_len) {
    *piece = "", *n = 0, *ret = 0;
    if (s->finish) return 0;
    if (s->t_decode0 == 0) s->t_decode0 = now_ms();
    if (s->n_gen >= s->p.max_new) {
        s->finish = KVB_FINISH_LENGTH;
        return 0;
    }
    kvb_ctx *c = s->c;
    prof_begin(c->prof, PROF_SAMPLE, -1);
    *next = s->p.pick ? s->p.pick(s->p.user, c->logits) : sampler_sample(&s->smp, c->logits);
    prof_end(c->prof, PROF_SAMPLE, -1, 1, 0);
    if (!s->p.ignore_eos && tok_is_eog(c->model->tok, *next)) {
        if (s->n_gen == 0) s->first_eog = *next;
        s->finish = KVB_FINISH_EOS;
        return 0;
    }
    s->gen[s->n_gen++] = *next;
    size_t before = s->text_n;
    char buf[1024];
    int np = c->model->tok ? tok_stream_push(&s->ts, c->model->tok, *next, buf, sizeof buf) : 0;
    if (np > 0 && text_add(s, buf, (size_t)np)) return ERR("out of memory");
    if (cut_stop(s, before)) s->finish = KVB_FINISH_STOP;
    else if (s->n_gen == s->p.max_new) s->finish = KVB_FINISH_LENGTH;
    *piece = s->text ? s->text + before : "";
    *n = s->text_n > before ? s->text_n - before : 0;
    *ret = 1;
    return s->finish ? 0 : 1;
}

/* The token went through the model. */
static void step_done(kvb_session *s) {
    s->steps++;
    if (s->p.progress) s->p.progress(s->p.user, "decode", s->n_gen, s->p.max_new);
}

int kvb_session_step(kvb_session *s, const char **piece, size_t *n, char *err, size_t err_len) {
    int32_t next = 0;
    int ret, go = step_pick(s, &next, &ret, piece, n, err, err_len);
    if (go <= 0) return go < 0 ? -1 : ret;
    if (kvb_forward(s->c, &next, 1, err, err_len)) return -1;
    step_done(s);
    return 1;
}

int kvb_session_step_batch(kvb_session *const *ss, int n, kvb_batch *b, int *ret, const char **piece, size_t *len,
                           char *err, size_t err_len) {
    if (n <= 0) return 0;
    kvb_ctx **cs = malloc((size_t)n * sizeof *cs);
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    int *who = malloc((size_t)n * sizeof *who);
    int rc = cs && ids && who ? 0 : ERR("out of memory");
    int k = 0;
    for (int i = 0; i < n && !rc; i++) {
        int32_t next = 0;
        char sub[384];
        int go = step_pick(ss[i], &next, &ret[i], &piece[i], &len[i], sub, sizeof sub);
        if (go < 0) rc = ERR("sequence %d: %s", i, sub);
        else if (go) cs[k] = ss[i]->c, ids[k] = next, who[k++] = i;
    }
    if (!rc && k > 0) rc = kvb_batch_decode(b, cs, ids, k, err, err_len);
    for (int j = 0; j < k && !rc; j++) step_done(ss[who[j]]);
    free(cs);
    free(ids);
    free(who);
    return rc;
}

int kvb_session_finish(kvb_session *s, char *err, size_t err_len) {
    char tail[64];
    int nt = tok_stream_flush(&s->ts, tail, sizeof tail);
    size_t before = s->text_n;
    if (nt > 0 && text_add(s, tail, (size_t)nt)) return ERR("out of memory");
    if (s->finish != KVB_FINISH_STOP && cut_stop(s, before)) s->finish = KVB_FINISH_STOP;
    if (!s->text && text_add(s, "", 0)) return ERR("out of memory");
    s->decode_ms = s->t_decode0 > 0 ? now_ms() - s->t_decode0 : 0;
    if (s->m.verify && s->m.verify(s->m.self, s->c, 0, err, err_len)) return -1;
    usage(s, &s->kv_end);
    const int L = s->c->model->cfg.n_layer;
    double att = 0;
    for (int l = 0; l < L; l++) att += kvb_ctx_mean_attended(s->c, l);
    s->attended = att / L;
    phases(s->c, PROF_DECODE, s->dec_phase_ms);
    return 0;
}

int kvb_session_decode(kvb_session *s, char *err, size_t err_len) {
    const char *piece;
    size_t n;
    int r;
    while ((r = kvb_session_step(s, &piece, &n, err, err_len)) > 0) {
    }
    return r < 0 ? -1 : kvb_session_finish(s, err, err_len);
}

double kvb_session_ms_per_token(const kvb_session *s) { return s->steps ? s->decode_ms / s->steps : 0; }
