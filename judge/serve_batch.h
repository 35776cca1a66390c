/* serve_batch.h — continuous batching for `kvbench serve --batching` (judge/serve.c): one engine thread decodes
 * every running generation in one batched step (engine/batch.h), and a request's prefill runs whole between two
 * steps, under the engine's lock. Admission waits for room in the batch and, with a KV pool, for the pool to
 * promise the request's peak, the pages bench-serve's scheduler promises it (judge/sched.h kvb_sched_peak_pages:
 * full attention's for prompt + max_tokens, or, for a method that ends its prefill layer by layer, its compressed
 * cache plus one layer's whole prompt); the policy is judge/sched.h's: FIFO by lock order, wait, no preemption, the
 * promise measured at every layer of the prefill and every step, and shrunk after the prefill to what the method
 * holds plus max_tokens of growth. Internal to judge/: serve.c is its one user. */
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
    /* set by sb_prefill: what the pool measures at every layer of the prefill and every step (m may be NULL) */
    const kvb_method *m;
    kvb_ctx *c;
    sb_engine *e;
    int64_t prefill_peak; /* most pages measured held during the prefill */
} sb_job;

/* An engine for model m: contexts made from cp share its backend (cp->n_threads threads in all); at most
 * max_batch generations at once; pool_bytes of KV (0 = no pool). Starts the engine thread, which ends when *stop
 * is set or at sb_free. NULL + err on failure. */
sb_engine *sb_create(kvb_model *m, const kvb_ctx_params *cp, int max_batch, int64_t pool_bytes,
                     volatile sig_atomic_t *stop, char *err, size_t err_len);
void sb_free(sb_engine *e);
/* The context parameters a generation's context must use (the shared backend set). */
kvb_ctx_params sb_ctx_params(const sb_engine *e);
/* The pages a request is promised at admission, its peak: judge/sched.h's kvb_sched_peak_pages on the engine's pool
 * (m: its method, NULL = full attention; layerwise: kvb_sched_layerwise's answer for a whole prefill). -1 + err when
 * m's budget cannot be worked out. */
int64_t sb_peak_pages(const sb_engine *e, const kvb_method *m, int layerwise, int64_t n_prompt, int64_t max_new,
                      char *err, size_t err_len);
/* Wait, in arrival order, for room in the batch and the pool. When the request reaches the head of the queue,
 * peak(user) is called once with the engine's lock held: it makes the request's context and method and returns the
 * pages to promise (sb_peak_pages), or -1 + err. 0 with the lock held and *promised pages taken; 1 when
 * give_up(user) said to stop waiting (lock not held); -1 + err when peak failed or the pool can never hold the
 * request (lock not held). */
int sb_admit(sb_engine *e, int64_t (*peak)(void *user, char *err, size_t err_len), int64_t *promised,
             int (*give_up)(void *), void *user, char *err, size_t err_len);
/* Lock held, before the prefill of admitted job j on context c (its method m, may be NULL): what c holds is measured
 * at every layer's attention (c->on_visible), its peak kept for sb_start. */
void sb_prefill(sb_engine *e, sb_job *j, const kvb_method *m, kvb_ctx *c);
/* After the prefill, lock held: the prefill's peak is checked against the promise (an overdraft counted), the
 * promise moves to what j's context and method hold plus max_new tokens per head, the job joins the running set,
 * the lock is released. */
void sb_start(sb_engine *e, sb_job *j, int max_new);
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
 * server stopping, a request refused at its turn in the queue: its method, its budget or a pool too small for its
 * peak, or a prefill that failed after admission) or were cancelled (the client left); admissions that
 * waited for the pool; decode steps, the sequences they advanced, their time, and the time-weighted sums of
 * running sequences, promised pages and the pages the running sequences were measured to hold after each step (a
 * client takes differences of two reads for the means over its run); sequences measured above their promise, in
 * their prefill or after a step (overdrafts: the promise grows to what they hold, as judge/sched.h's); the most
 * pages one generation was measured to hold during its prefill. */
typedef struct {
    int64_t finished, failed, cancelled, waits, steps, step_seqs, overdrafts;
    double decode_ms, running_ms, reserved_page_ms, held_page_ms;
    int running, admitted, max_running, max_batch;
    int64_t pool_pages; /* 0 = no pool */
    int64_t page_bytes, pool_reserved, peak_reserved, peak_prefill;
} sb_stats;

/* A copy of the counters (takes the lock). */
void sb_get_stats(sb_engine *e, sb_stats *st);

#endif
