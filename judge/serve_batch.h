/* serve_batch.h — continuous batching for `kvbench serve --batching` (judge/serve.c): one engine thread decodes
 * every running generation in one batched step (engine/batch.h), and a request's prefill runs whole between two
 * steps, under the engine's lock. Admission waits for room in the batch and, with a KV pool, for the pool to
 * promise full attention's pages for prompt + max_tokens (judge/sched.h's policy: FIFO by lock order, wait, no
 * preemption; the promise shrinks after the prefill to what the method holds plus max_tokens of growth).
 * Internal to judge/: serve.c is its one user. */
#ifndef KVB_SERVE_BATCH_H
#define KVB_SERVE_BATCH_H

#include <signal.h>
#include <stdint.h>

#include "engine/session.h"
#include "methods/method.h"

typedef struct sb_engine sb_engine;

/* One running generation as the engine sees it. The fields below `user` belong to the engine; read them with the
 * lock held. */
typedef struct sb_job {
    kvb_session *ses;  /* prefilled; stepped until it finishes */
    /* a token's new text (engine thread, lock held): a streaming reply appends its event */
    void (*on_token)(struct sb_job *j, const char *piece, size_t n);
    void *user;
    int cancelled;     /* set (lock held) by the connection: dropped at the next step */
    int done;          /* set by the engine: finished, failed (err) or dropped */
    int in;            /* 1 while in the running set */
    char err[256];
    int64_t promised;  /* pool pages */
    const kvb_method *m; /* set by sb_start: what the pool measures at every step (m may be NULL) */
    const kvb_ctx *c;
} sb_job;

/* An engine for model m: contexts made from cp share its backend (cp->n_threads threads in all); at most
 * max_batch generations at once; pool_bytes of KV (0 = no pool). Starts the engine thread, which ends when *stop
 * is set or at sb_free. NULL + err on failure. */
sb_engine *sb_create(kvb_model *m, const kvb_ctx_params *cp, int max_batch, int64_t pool_bytes,
                     volatile sig_atomic_t *stop, char *err, size_t err_len);
void sb_free(sb_engine *e);
/* The context parameters a generation's context must use (the shared backend set). */
kvb_ctx_params sb_ctx_params(const sb_engine *e);
/* Wait for room for a sequence of n_tokens (prompt + max_tokens): 0 with the engine's lock held and *promised
 * pages taken; 1 when give_up(user) said to stop waiting (lock not held); -1 + err when the pool can never hold
 * it (lock not held). */
int sb_admit(sb_engine *e, int64_t n_tokens, int64_t *promised, int (*give_up)(void *), void *user, char *err,
             size_t err_len);
/* After the prefill, lock held: the promise moves to what c (and its method m, may be NULL) holds plus max_new
 * tokens per head, the job joins the running set, the lock is released. */
void sb_start(sb_engine *e, sb_job *j, const kvb_method *m, const kvb_ctx *c, int max_new);
/* Give back an admission that did not start (its prefill failed), lock held; releases the lock. */
void sb_abandon(sb_engine *e, int64_t promised);
void sb_lock(sb_engine *e);
void sb_unlock(sb_engine *e);
/* Lock held: wait until the engine changes something (a step, an end) or timeout_ms passes. */
void sb_wait(sb_engine *e, int timeout_ms);
/* Lock held: take j out of the running set if it is in (a generation left unfinished: cancelled), and give its
 * pages back. */
void sb_forget(sb_engine *e, sb_job *j);

/* The engine's counters since it started (GET /v1/kvbench/stats): generations that finished, failed (an error, the
 * server stopping, a prefill that failed after admission) or were cancelled (the client left); admissions that
 * waited for the pool; decode steps, the sequences they advanced, their time, and the time-weighted sums of
 * running sequences, promised pages and the pages the running sequences were measured to hold after each step (a
 * client takes differences of two reads for the means over its run); sequences measured above their promise
 * (overdrafts: the promise grows to what they hold, as judge/sched.h's). */
typedef struct {
    int64_t finished, failed, cancelled, waits, steps, step_seqs, overdrafts;
    double decode_ms, running_ms, reserved_page_ms, held_page_ms;
    int running, admitted, max_running, max_batch;
    int64_t pool_pages; /* 0 = no pool */
    int64_t page_bytes, pool_reserved, peak_reserved;
} sb_stats;

/* A copy of the counters (takes the lock). */
void sb_get_stats(sb_engine *e, sb_stats *st);

#endif
