/* loadgen.h — the load `kvbench bench-serve` and a suite's "serve" block put on a server, and the row it measures
 * (docs/serving.md). Two targets, one workload and one row:
 *   - in process: the continuous-batching scheduler (judge/sched.h) on a fixed KV pool, no network;
 *   - a URL: a running `kvbench serve` (or any OpenAI-compatible server that honours the "kvbench" method/budget
 *     field and "ignore_eos"), one libcurl connection per client thread, streamed replies; TTFT and TPOT are taken
 *     client-side from the server-sent events, and concurrency and pool occupancy from the server's
 *     GET /v1/kvbench/stats when it has one (marked unavailable otherwise).
 * The workload: `clients` closed-loop clients (each sends its next request when its last one ends) until
 * `requests` have ended, or (rate > 0) open-loop Poisson arrivals at `rate` requests/s from one seeded schedule; a
 * plan (kvb_load_plan, the *_plan entry points) adds a duration and per-prompt generation lengths.
 * A request that fails (refused, an HTTP error, a broken stream) is counted as failed with its reason, never
 * dropped: ok + failed = requests, and `lost` counts those that never ended (0 unless the run itself broke). */
#ifndef KVB_LOADGEN_H
#define KVB_LOADGEN_H

#include <stdint.h>
#include <stdio.h>

#include "engine/model.h"
#include "engine/session.h"
#include "methods/method.h"

typedef struct {
    int clients;       /* closed loop: clients; open loop: the most requests in flight over a URL */
    int requests;
    int max_new;
    int ignore_eos;    /* 1: every request generates max_new tokens */
    double rate;       /* > 0: open loop, Poisson arrivals at this many requests/s */
    /* in process only */
    int max_batch, page_tokens, prefill_chunk;
    int64_t pool_bytes; /* 0 = unlimited */
    uint64_t seed;      /* the open loop's arrival schedule (0 and 1: the same, the default) */
} kvb_load_opts;

/* One row: a method@budget under the load. NAN = unavailable (no completed request, or a URL without stats). */
typedef struct {
    int requests, ok, failed, lost;
    int64_t out_tokens;
    double wall_s, req_s, tok_s, step_tok_s;
    double ttft50, ttft90, ttft99, tpot50, tpot90, tpot99; /* ms */
    double mean_seqs, max_seqs;           /* running sequences per decode step (time-weighted); the most at once */
    double pool_mean, pool_peak, held_mean; /* % of the pool promised (mean, peak) and measured held (mean) */
    double pool_mib;                      /* the pool (MiB), NAN when none */
    int64_t waits, overdrafts;            /* -1 = unavailable */
    int64_t server_ok, server_failed;     /* URL: completions and failures the server counted over the row; -1 = no stats */
    char first_err[384];                  /* the first failed request's reason */
    char dataset[128];                    /* the prompts' source, set by the caller ("" = not written) */
} kvb_load_row;

/* A prompt for a URL: the messages sent (system may be NULL: the server's template default); history: n_history
 * earlier messages before user, alternating user, assistant (a dialogue's kept rounds; NULL for a single prompt). */
typedef struct {
    const char *system, *user;
    const char *const *history;
    int n_history;
} kvb_load_text;

/* What a dataset replay adds to the workload (bench-serve --dataset, --duration); {0} = none of it.
 *   duration_s > 0: no request is sent after this many seconds from the start (closed loop: a client whose request
 *     ends later stops; open loop: the seeded schedule ends there); the requests in flight then finish and are
 *     counted, and the row's window runs from the start to the last end. lo->requests > 0 also stops the run
 *     (whichever comes first); lo->requests = 0 means no count limit.
 *   max_new: per prompt, the tokens its requests generate (NULL: lo->max_new for every prompt).
 *   on_submit: called as each request is handed over (in process: to the scheduler, with its ids; over a URL: as
 *     its body is sent, ids NULL), from one thread at a time: request number, prompt index, max_new. */
typedef struct {
    double duration_s;
    const int *max_new;
    void (*on_submit)(void *user, int request, int prompt, int max_new, const int32_t *ids, int n_ids);
    void *user;
} kvb_load_plan;

/* The workload in process on model m: contexts from cp, the method by name (NULL = full attention) at budget b with
 * options o (NULL = its defaults), prompts[i % n] as the requests' ids. 0, or -1 + err when the scheduler itself
 * fails. */
int kvb_load_run_local(kvb_model *m, const kvb_ctx_params *cp, const char *method, const kvb_budget *b,
                       const kvb_opts *o, const kvb_load_opts *lo, const kvb_rounds *prompts, int n_prompts, kvb_load_row *out, char *err,
                       size_t err_len);
/* The same with a plan (NULL = none): a dataset's per-prompt lengths, a duration. */
int kvb_load_run_local_plan(kvb_model *m, const kvb_ctx_params *cp, const char *method, const kvb_budget *b,
                            const kvb_opts *o, const kvb_load_opts *lo, const kvb_load_plan *plan, const kvb_rounds *prompts,
                            int n_prompts, kvb_load_row *out, char *err, size_t err_len);

/* The workload against base_url (http[s]://host:port[/v1]; "/v1" is added to a URL without a path), the method and
 * budget strings sent in the "kvbench" field (method NULL = the server's default), model the "model" field (NULL:
 * the first model the server's /v1/models lists), the bearer token read from the environment variable api_key_env (NULL = none). -1 + err when the
 * server cannot be reached before the run (a one-line reason); a request that fails later is counted in the row. */
int kvb_load_run_url(const char *base_url, const char *api_key_env, const char *model, const char *method,
                     const char *budget, const kvb_load_opts *lo, const kvb_load_text *prompts, int n_prompts,
                     kvb_load_row *out, char *err, size_t err_len);
/* The same with a plan (NULL = none). */
int kvb_load_run_url_plan(const char *base_url, const char *api_key_env, const char *model, const char *method,
                          const char *budget, const kvb_load_opts *lo, const kvb_load_plan *plan,
                          const kvb_load_text *prompts, int n_prompts, kvb_load_row *out, char *err, size_t err_len);

/* Rows as Markdown (header once, then a row each), CSV (the same columns, machine units) and JSON; the dataset is the
 * last column ("-" when unset). */
void kvb_load_md_header(FILE *f);
void kvb_load_md_row(FILE *f, const char *method, const char *budget, const kvb_load_row *r);
void kvb_load_csv_header(FILE *f);
void kvb_load_csv_row(FILE *f, const char *method, const char *budget, const kvb_load_row *r);
/* {"method", "budget", ...every field above; NAN and -1 as null}; NULL when out of memory. cJSON *. */
void *kvb_load_row_json(const char *method, const char *budget, const kvb_load_row *r);

#endif
