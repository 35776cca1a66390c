/* serve_batch.c — the engine thread of `kvbench serve --batching` (serve_batch.h).
 *
 * One mutex guards the running set, the pool and every job's engine fields; the engine thread holds it for a
 * decode step and lets go between steps, waiting a little when another thread asked for it, so a waiting
 * admission or a reply is not starved by the next step. Admissions queue in arrival order; only the head may
 * admit, and only the head holds a context while it waits (made to work out its promise). */
#include "judge/serve_batch.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/batch.h"
#include "engine/kvcache.h"
#include "engine/kvpool.h"
#include "judge/sched.h"

typedef struct waiter {
    struct waiter *next;
} waiter;

struct sb_engine {
    kvb_model *model;
    kvb_ctx *owner; /* owns the backend; holds no sequence */
    kvb_ctx_params cp;
    kvb_batch *batch;
    int max_batch;
    kvp_pool pool;
    int pooled;
    volatile sig_atomic_t *stop;
    int quit;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_int want; /* threads waiting for the lock */
    sb_job **run;
    int n_run, n_admitted; /* running, and admitted (running or prefilling) */
    waiter *queue_head, *queue_tail;
    pthread_t thread;
    int thread_started;
    sb_stats st;
};

static void deadline_in(struct timespec *t, int ms) {
    clock_gettime(CLOCK_REALTIME, t);
    t->tv_nsec += (long)ms * 1000000L;
    t->tv_sec += t->tv_nsec / 1000000000L;
    t->tv_nsec %= 1000000000L;
}

void sb_lock(sb_engine *e) {
    atomic_fetch_add(&e->want, 1);
    pthread_mutex_lock(&e->mu);
    atomic_fetch_sub(&e->want, 1);
}

void sb_unlock(sb_engine *e) { pthread_mutex_unlock(&e->mu); }

void sb_wait(sb_engine *e, int timeout_ms) {
    struct timespec t;
    deadline_in(&t, timeout_ms);
    pthread_cond_timedwait(&e->cv, &e->mu, &t);
}

static double mono_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* Lock held: j leaves the running set (done, with err when not empty: counted failed, or cancelled). */
static void drop(sb_engine *e, int i, const char *err) {
    sb_job *j = e->run[i];
    if (!err || !err[0]) e->st.finished++;
    else if (!strcmp(err, "cancelled")) e->st.cancelled++;
    else e->st.failed++;
    j->done = 1;
    j->in = 0;
    if (err && err[0]) snprintf(j->err, sizeof j->err, "%s", err);
    memmove(e->run + i, e->run + i + 1, (size_t)(e->n_run - i - 1) * sizeof *e->run);
    e->n_run--;
}

/* Device pages job j holds now, with room for grow more tokens per head: the scheduler's measure. */
static int64_t held_pages(const sb_engine *e, const sb_job *j, int64_t grow) {
    return kvb_sched_held_pages(&e->pool, j->m, j->c, grow);
}

/* Lock held: one batched step of every running job (cancelled ones dropped first). */
static void step(sb_engine *e) {
    for (int i = e->n_run - 1; i >= 0; i--)
        if (e->run[i]->cancelled) drop(e, i, "cancelled");
    const int k = e->n_run;
    if (k == 0) return;
    kvb_session *ss[k];
    int ret[k];
    const char *piece[k];
    size_t len[k];
    for (int i = 0; i < k; i++) ss[i] = e->run[i]->ses;
    char why[256];
    const double t0 = mono_ms();
    int rc = kvb_session_step_batch(ss, k, e->batch, ret, piece, len, why, sizeof why);
    const double step_ms = mono_ms() - t0;
    e->st.steps++;
    e->st.step_seqs += k;
    e->st.decode_ms += step_ms;
    e->st.running_ms += k * step_ms;
    if (e->pooled) e->st.reserved_page_ms += (double)e->pool.reserved * step_ms;
    for (int i = k - 1; i >= 0; i--) {
        sb_job *j = e->run[i];
        if (rc) {
            drop(e, i, why);
            continue;
        }
        if (ret[i] == 1 && len[i] && j->on_token) j->on_token(j, piece[i], len[i]);
        if (j->ses->finish) drop(e, i, NULL);
    }
    if (!e->pooled || rc) return;
    int64_t held = 0; /* what the running sequences hold after the step, against their promises */
    for (int i = 0; i < e->n_run; i++) {
        sb_job *j = e->run[i];
        const int64_t h = held_pages(e, j, 0);
        held += h;
        if (h > j->promised) { /* above its promise: an overdraft whether or not the pool had the pages */
            kvp_repromise(&e->pool, &j->promised, h);
            e->st.overdrafts++;
        }
    }
    e->st.held_page_ms += (double)held * step_ms;
}

static void *engine_main(void *arg) {
    sb_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    while (!*e->stop && !e->quit) {
        if (e->n_run == 0) {
            sb_wait(e, 50);
            continue;
        }
        step(e);
        pthread_cond_broadcast(&e->cv);
        /* between steps: let a waiting admission (its prefill) or a reply take the lock */
        pthread_mutex_unlock(&e->mu);
        if (atomic_load(&e->want) > 0) usleep(200);
        else sched_yield();
        pthread_mutex_lock(&e->mu);
    }
    for (int i = e->n_run - 1; i >= 0; i--) drop(e, i, "server stopping");
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

sb_engine *sb_create(kvb_model *m, const kvb_ctx_params *cp, int max_batch, int64_t pool_bytes,
                     volatile sig_atomic_t *stop, char *err, size_t err_len) {
    sb_engine *e = calloc(1, sizeof *e);
    if (!e) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    e->model = m;
    e->stop = stop;
    e->max_batch = max_batch > 0 ? max_batch : 1;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    kvb_ctx_params op = *cp;
    op.n_ctx = 16;
    op.n_batch = 1;
    op.share_backend = NULL;
    if (!(e->owner = kvb_ctx_create(m, &op, err, err_len))) goto fail;
    e->cp = *cp;
    e->cp.share_backend = e->owner->be;
    if (!(e->batch = kvb_batch_create(m, e->owner->be, e->max_batch, err, err_len))) goto fail;
    e->pooled = pool_bytes > 0;
    if (kvp_init(&e->pool, e->pooled ? pool_bytes : INT64_MAX / 4, kvc_slot_bytes(e->owner->kv), 16, err, err_len))
        goto fail;
    if (!(e->run = calloc((size_t)e->max_batch, sizeof *e->run))) {
        snprintf(err, err_len, "out of memory");
        goto fail;
    }
    if (pthread_create(&e->thread, NULL, engine_main, e)) {
        snprintf(err, err_len, "cannot start the engine thread");
        goto fail;
    }
    e->thread_started = 1;
    return e;
fail:
    sb_free(e);
    return NULL;
}

void sb_free(sb_engine *e) {
    if (!e) return;
    if (e->thread_started) {
        pthread_mutex_lock(&e->mu);
        e->quit = 1;
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    kvb_batch_free(e->batch);
    kvb_ctx_free(e->owner);
    free(e->run);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

kvb_ctx_params sb_ctx_params(const sb_engine *e) { return e->cp; }

static void dequeue(sb_engine *e, waiter *w) {
    waiter **p = &e->queue_head;
    while (*p && *p != w) p = &(*p)->next;
    if (*p) *p = w->next;
    if (e->queue_tail == w) {
        e->queue_tail = NULL;
        for (waiter *q = e->queue_head; q; q = q->next) e->queue_tail = q;
    }
}

int64_t sb_peak_pages(const sb_engine *e, const kvb_method *m, int layerwise, int64_t n_prompt, int64_t max_new,
                      char *err, size_t err_len) {
    return kvb_sched_peak_pages(&e->pool, &e->model->cfg, m, layerwise, n_prompt, max_new, err, err_len);
}

int sb_admit(sb_engine *e, int64_t (*peak)(void *user, char *err, size_t err_len), int64_t *promised,
             int (*give_up)(void *), void *user, char *err, size_t err_len) {
    waiter w = {NULL};
    int waited = 0;
    int64_t need = -1; /* worked out at the head of the queue: only the head holds a context while it waits */
    sb_lock(e);
    if (e->queue_tail) e->queue_tail->next = &w;
    else e->queue_head = &w;
    e->queue_tail = &w;
    for (;;) {
        if (e->queue_head == &w && need < 0) {
            need = peak(user, err, err_len);
            const int never = need >= 0 && e->pooled && need > e->pool.n_pages;
            if (never)
                snprintf(err, err_len,
                         "the request needs %lld KV pages (%.1f MiB) at its peak; the pool holds %lld (%.1f MiB)",
                         (long long)need, need * (double)e->pool.page_bytes / 1048576.0, (long long)e->pool.n_pages,
                         e->pool.n_pages * (double)e->pool.page_bytes / 1048576.0);
            if (need < 0 || never) { /* refused at its turn: a failure, as the scheduler counts it */
                e->st.failed++;
                dequeue(e, &w);
                pthread_cond_broadcast(&e->cv);
                sb_unlock(e);
                return -1;
            }
        }
        if (e->queue_head == &w && e->n_admitted < e->max_batch) {
            if (!kvp_reserve(&e->pool, need)) break;
            if (!waited) e->st.waits++; /* the pool, not the batch, holds the head of the queue */
            waited = 1;
        }
        if (give_up(user) || *e->stop || e->quit) {
            dequeue(e, &w);
            pthread_cond_broadcast(&e->cv);
            sb_unlock(e);
            return 1;
        }
        sb_wait(e, 100);
    }
    dequeue(e, &w);
    e->n_admitted++;
    *promised = need;
    pthread_cond_broadcast(&e->cv); /* the next in the queue is now the head */
    return 0;
}

/* The engine's observer of each layer's attention during a job's prefill (its KV appended; with a layer-wise end,
 * the layers before it already compressed): what the job holds there, the prefill's peak, measured. */
static void watch_prefill(void *user, kvb_ctx *c, int layer, const kvb_src *src, int64_t n_q) {
    (void)c, (void)layer, (void)src, (void)n_q;
    sb_job *j = user;
    const int64_t h = held_pages(j->e, j, 0);
    if (h > j->prefill_peak) j->prefill_peak = h;
}

void sb_prefill(sb_engine *e, sb_job *j, const kvb_method *m, kvb_ctx *c) {
    j->m = m;
    j->c = c;
    j->e = e;
    j->prefill_peak = 0;
    if (!e->pooled) return;
    c->on_visible = watch_prefill;
    c->on_visible_user = j;
}

void sb_start(sb_engine *e, sb_job *j, int max_new) {
    j->c->on_visible = NULL;
    if (j->prefill_peak > e->st.peak_prefill) e->st.peak_prefill = j->prefill_peak;
    if (j->prefill_peak > j->promised) e->st.overdrafts++; /* measured above its promise while it prefilled */
    const int64_t pages = held_pages(e, j, max_new);
    if (kvp_repromise(&e->pool, &j->promised, pages)) e->st.overdrafts++;
    j->done = 0;
    j->in = 1;
    e->run[e->n_run++] = j;
    if (e->n_run > e->st.max_running) e->st.max_running = e->n_run;
    pthread_cond_broadcast(&e->cv);
    sb_unlock(e);
}

void sb_abandon(sb_engine *e, int64_t promised) {
    kvp_release(&e->pool, promised);
    e->st.failed++;
    e->n_admitted--;
    pthread_cond_broadcast(&e->cv);
    sb_unlock(e);
}

void sb_forget(sb_engine *e, sb_job *j) {
    for (int i = 0; i < e->n_run; i++)
        if (e->run[i] == j) {
            drop(e, i, "cancelled");
            break;
        }
    kvp_release(&e->pool, j->promised);
    j->promised = 0;
    e->n_admitted--;
    pthread_cond_broadcast(&e->cv);
}

void sb_get_stats(sb_engine *e, sb_stats *st) {
    sb_lock(e);
    *st = e->st;
    st->running = e->n_run;
    st->admitted = e->n_admitted;
    st->max_batch = e->max_batch;
    st->pool_pages = e->pooled ? e->pool.n_pages : 0;
    st->page_bytes = e->pool.page_bytes;
    st->pool_reserved = e->pooled ? e->pool.reserved : 0;
    st->peak_reserved = e->pooled ? e->pool.peak_reserved : 0;
    sb_unlock(e);
}
