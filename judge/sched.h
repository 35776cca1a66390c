/* sched.h — continuous batching on a fixed KV pool: requests wait, are admitted when the pool has room, prefill,
 * then decode together (one batched forward step for all running sequences: engine/batch.h) and leave when done.
 * The policy (docs/serving.md):
 *   - admission in arrival order (FIFO, no overtaking: a large request is not starved by small ones); a request
 *     is admitted when the pool can promise its peak: full attention's pages for its prompt and its max_new
 *     tokens (the prefill holds the whole prompt before the method compresses it), or, for a method whose end of
 *     prefill is layer-local (methods/method.h KVB_LAYER_LOCAL) and a prompt prefilled whole, what each layer keeps
 *     after the prefill plus one layer's full KV and room for max_new more tokens per head: its context prefills the
 *     prompt as one chunk (n_batch = the prompt's length) and ends each layer's prefill (compresses it, or OmniKV
 *     moves it to the host) right after that layer's attention;
 *   - its prefill runs between two decode steps, whole or (prefill_chunk) one piece per step, one request in
 *     prefill at a time;
 *   - after the prefill the promise shrinks to what its method measurably holds plus room for max_new more tokens
 *     per head, the method's packed-load heads included (so a method that keeps 25% leaves the rest of the pool to
 *     others), and is released when it ends;
 *   - a full pool makes new requests wait; nothing admitted is preempted, so no request is recomputed, dropped or
 *     failed for lack of room. A request larger than the whole pool is refused with an error, never waited on;
 *   - what each running sequence holds is measured at every step, and at every layer of its prefill, against its
 *     promise (an overdraft is counted, never hidden).
 * Each request may carry its own method and budget. Single-threaded: the caller drives kvb_sched_step. */
#ifndef KVB_SCHED_H
#define KVB_SCHED_H

#include <stdint.h>

#include "engine/kvpool.h"
#include "engine/model.h"
#include "engine/session.h"
#include "methods/method.h"

typedef struct {
    kvb_model *model;
    kvb_ctx_params ctx;  /* each sequence's context (n_ctx, kv type, threads, backend, prefill chunk) */
    int max_batch;       /* most running sequences (0 = 64) */
    int64_t pool_bytes;  /* the KV pool; 0 = unlimited (admission by max_batch alone) */
    int page_tokens;     /* tokens per page (0 = 16) */
    int64_t prefill_chunk; /* prefill tokens per iteration between decode steps (0 = the whole prompt at once); a
                            * multiple of ctx.n_batch keeps every result as an unchunked prefill's */
    /* the default method of requests that name none: NULL or "full" = full attention */
    const char *method;
    kvb_budget budget;
    kvb_opts opts;
} kvb_sched_opts;

/* A request: prompt ids (copied at submit), generation limits, its method (NULL: the scheduler's). */
typedef struct {
    int64_t id;
    const int32_t *ids;
    int n;
    int max_new;
    int ignore_eos;
    const char *method;  /* NULL: opts' method, budget and options */
    kvb_budget budget;
    const kvb_opts *opts;
    /* sampling and stop rules as kvb_gen_params' (temp 0 = greedy); stop strings are borrowed until the end */
    float temp, top_p;
    uint64_t seed;
    char *const *stop;
    int n_stop;
    /* each generated token's new text, as it is sampled (a streaming reply); NULL = none */
    void (*on_token)(void *user, const char *piece, size_t n);
    /* polled before each step: nonzero ends the request (ok 0, "cancelled"), its pages back to the pool */
    int (*cancel)(void *user);
    void *user;
    double arrive_ms;    /* when it arrived on the scheduler's clock (an open-loop schedule); 0 = at submit */
} kvb_sched_req;

/* What became of a request (handed to the done callback once, when it ends). Times in ms since the scheduler's
 * creation: arrival (submit), admission, the first and the last token (taken when sampled, as a streaming server
 * sends it), the end. */
typedef struct {
    int64_t id;
    void *user;
    int ok;               /* 0: err says why (refused, or the method failed) */
    char err[384];
    kvb_finish finish;
    int n_prompt, n_gen;
    const int32_t *gen;   /* the generated ids (valid during the callback) */
    const char *text;     /* the generated text (valid during the callback) */
    double t_arrive, t_admit, t_first, t_last, t_done;
    int waited;           /* 1: the pool (not the batch size) made it wait at the head of the queue */
    int64_t kv_device_bytes; /* its measured device KV at the end */
} kvb_sched_result;

typedef void (*kvb_sched_done_fn)(void *user, const kvb_sched_result *r);

/* Over the scheduler's life. */
typedef struct {
    int64_t steps;                 /* batched decode steps */
    int64_t step_seqs;             /* sum over decode steps of the running sequences (tokens the steps sampled) */
    int64_t prefills, finished, failed, refused, cancelled, waits, overdrafts;
    int64_t prefill_parts;         /* prefill pieces run (prefills when unchunked) */
    int max_running;
    double running_ms;             /* sum over decode steps of (running sequences x step ms) */
    double busy_ms;                /* time inside decode steps and prefills */
    double decode_ms, prefill_ms;
    int64_t pool_pages, page_bytes, peak_reserved;
    double reserved_page_ms;       /* sum over steps of (promised pages x step ms) */
    double held_page_ms;           /* sum over decode steps of (measured pages x step ms) */
    int64_t peak_held;             /* most pages measured held at once */
    int64_t peak_prefill;          /* most pages one sequence was measured to hold during its prefill */
} kvb_sched_stats;

typedef struct kvb_sched kvb_sched;

kvb_sched *kvb_sched_create(const kvb_sched_opts *o, char *err, size_t err_len);
void kvb_sched_free(kvb_sched *s);
/* ms since the scheduler was created (the clock of kvb_sched_result). */
double kvb_sched_now(const kvb_sched *s);
/* Queue a request (arrival now). -1 + err for a malformed one (no tokens, max_new < 1, prompt + max_new over the
 * context); a request the pool can never hold is accepted and ends refused (ok 0) at its turn. */
int kvb_sched_submit(kvb_sched *s, const kvb_sched_req *r, char *err, size_t err_len);
/* One iteration: admit the first waiting request when it fits (or go on with the prefill under way) and prefill it
 * (a piece of it), then one batched decode step of every
 * running sequence; requests that end go to done(user, result). 0, or -1 when the scheduler itself fails (its
 * backend); a request's own failure is its result, not the scheduler's. */
int kvb_sched_step(kvb_sched *s, kvb_sched_done_fn done, void *user, char *err, size_t err_len);
/* Requests waiting and running. */
int kvb_sched_waiting(const kvb_sched *s);
int kvb_sched_running(const kvb_sched *s);
void kvb_sched_get_stats(const kvb_sched *s, kvb_sched_stats *st);

/* The device pages a sequence holds now, with room for grow more tokens in each of its heads: its context's store,
 * its method's packed-load heads (m->vis: OmniKV's, Round Attention's; they grow with each decoded token) and its
 * method's other device buffers, measured (kvb_method_usage). m NULL = full attention. */
int64_t kvb_sched_held_pages(const kvp_pool *p, const kvb_method *m, const kvb_ctx *c, int64_t grow);
/* Whether a request's method ends its prefill layer by layer: it declares KVB_LAYER_LOCAL (methods/method.h) and the
 * prompt is prefilled whole (prefill_chunk 0 or at least n_prompt); its context then prefills the prompt as one chunk
 * (n_batch = n_prompt) and calls kvb_ctx_end_prefill_by_layer before it. method NULL = full attention (0). */
int kvb_sched_layerwise(const char *method, int64_t prefill_chunk, int64_t n_prompt);
/* The pages a request is promised at admission, its peak: full attention's pages for n_prompt + max_new tokens; or,
 * when layerwise, the sum over layers of what each keeps after the prefill (its method's kept_tokens; without one,
 * kvb_method_budget_tokens in every global layer when m imposes its budget) plus the most one layer adds while it
 * holds the whole prompt, with room for max_new more tokens per head (kvp_layerwise_pages), whichever is less.
 * m NULL = full attention. -1 + why when m's budget cannot be worked out. */
int64_t kvb_sched_peak_pages(const kvp_pool *p, const kvb_config *cfg, const kvb_method *m, int layerwise,
                             int64_t n_prompt, int64_t max_new, char *why, size_t why_len);

#endif
