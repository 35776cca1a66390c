/* serve.h — `kvbench serve`: an OpenAI-compatible chat-completions server on the engine (libmicrohttpd).
 *
 * GET /v1/models; POST /v1/chat/completions with {model, messages, max_tokens, temperature, top_p, seed, stream,
 * stop, n (1 only), ignore_eos (vLLM's and llama.cpp's extension: generate max_tokens whatever)} and an optional
 * extension object "kvbench": {"method": "snapkv", "budget": "30%", "method_opts": {"window": 32}} that picks the
 * KV-cache method per request (the server's default method otherwise), so external harnesses speaking this API can
 * evaluate a method. Non-streaming replies carry "usage" and a "kvbench" object with the measured KV bytes; `stream:
 * true` sends server-sent events as the tokens are generated ("data: {chunk}" lines, then "data: [DONE]"). GET
 * /v1/kvbench/stats gives the batching engine's counters (judge/serve_batch.h's sb_stats; {"batching": false}
 * without it) to load generators such as `bench-serve --url`.
 *
 * Slow or idle clients cannot lock others out: a connection that sends nothing for read_timeout_s while its
 * request is read is closed, and so is one whose request (headers and body) is not whole request_timeout_s
 * after it began, however slowly it trickles; one address holds at most max_per_ip connections; a new
 * connection beyond max_connections takes the place of the one that has been reading its request the
 * longest; the generation queue counts only requests that arrived whole (an idle socket takes no slot of it).
 * Binds 127.0.0.1 by default; optional bearer token (read from an environment variable, never logged),
 * checked on the headers before any body is read (401 at once, the body never read); Content-Length with
 * Transfer-Encoding is a 400; request bodies above max_body are refused (413, at once when declared);
 * message content above max_prompt_bytes is refused (413) before it is tokenized; `parallel` requests run on
 * the engine at a time (each with its own context and a share of the threads), up to max_queue more wait,
 * beyond that 503; malformed JSON or fields (a token budget larger than the prompt included) -> 400, all
 * with an OpenAI-style {"error": {"message", "type", "param", "code"}} body. Message content is always
 * tokenized as plain text: "<|im_start|>" written by a user is text, not a control token. When *stop is set,
 * running generations end at their next prefill chunk or decode step and the server returns. */
#ifndef KVB_SERVE_H
#define KVB_SERVE_H

#include <signal.h>
#include <stddef.h>

#include "engine/chat.h"
#include "methods/method.h"

typedef struct {
    const char *model_path;   /* GGUF */
    const char *model_name;   /* name in /v1/models and replies (default: the file's base name) */
    const char *host;         /* default 127.0.0.1 */
    int port;                 /* 0 = pick a free port (printed) */
    const char *api_key_env;  /* env var holding the bearer token; NULL = no auth */
    int max_queue;            /* waiting requests beyond the running one (default 8) */
    size_t max_body;          /* bytes (default 4 MiB) */
    int n_threads;            /* engine threads in all (0 = all cores), split between the parallel slots */
    int parallel;             /* generations running at once (default 1), each with its own context */
    const char *method;       /* default method (default full) */
    kvb_budget budget;
    kvb_opts opts;
    int verbose;              /* one log line per request on stderr */
    int read_timeout_s;       /* a connection idle this long while its request is read is closed (default 10) */
    int max_per_ip;           /* connections at once from one address (default 32) */
    int max_connections;      /* connections at once in all (default 256; a waiting socket costs a thread) */
    int request_timeout_s;    /* a request (headers + body) not whole this long after it began is cut off (default 30) */
    size_t max_prompt_bytes;  /* message content in all, bytes (default 6 per token of the model's context) */
    int batching;             /* continuous batching (judge/serve_batch.h): `parallel` = the most generations decoded
                               * together in one step, all threads on one backend */
    int64_t kv_pool_bytes;    /* with batching: the KV pool admission waits on (0 = none; docs/serving.md) */
    /* every generation's context: backend, KV type, prefill chunk and GEMM as given (a zero ctx.backend: the defaults,
     * kvb_ctx_default_params); ctx.n_ctx > 0 is the largest prompt + max_tokens + 1 a request may ask (at most the
     * model's context; 0: the model's); ctx.n_threads is not read (n_threads above). The CUDA backend is one stream
     * shared by every context, so with it `parallel` above 1 needs `batching` (one engine thread). */
    kvb_ctx_params ctx;
} kvb_serve_opts;

/* Serve until *stop becomes non-zero. Writes the bound port to *port_out (may be NULL) once listening and
 * calls ready(user) then. 0 on a clean stop, -1 + err when the server cannot start. */
int kvb_serve(const kvb_serve_opts *o, volatile sig_atomic_t *stop, int *port_out, void (*ready)(void *user, int port),
              void *user, char *err, size_t err_len);

/* The prompt's tokens for messages in the model's chat template: the template's own control tokens parsed
 * as such, each message's content tokenized as plain text (with the template text around it, as one run
 * between control tokens), so a content without control-token text gets the tokens of the rendered prompt.
 * ids malloc'd; 0, or -1 + a one-line error (invalid UTF-8, OOM). */
int kvb_serve_encode_prompt(const kvb_model *m, const chat_msg *msgs, int n, int32_t **ids, int *n_ids, char *err,
                            size_t err_len);

#endif
