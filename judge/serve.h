/* serve.h — `kvbench serve`: an OpenAI-compatible chat-completions server on the engine (libmicrohttpd).
 *
 * GET /v1/models; POST /v1/chat/completions with {model, messages, max_tokens, temperature, top_p, seed,
 * stream, stop, n (1 only)} and an optional extension object "kvbench": {"method": "snapkv", "budget": "30%",
 * "method_opts": {"window": 32}} that picks the KV-cache method per request (the server's default method
 * otherwise), so external harnesses speaking this API can evaluate a method. Non-streaming replies carry
 * "usage" and a "kvbench" object with the measured KV bytes; `stream: true` sends server-sent events as the
 * tokens are generated ("data: {chunk}" lines, then "data: [DONE]").
 *
 * Slow or idle clients cannot lock others out: a connection that sends nothing for read_timeout_s while its
 * request is read is closed, one address holds at most max_per_ip connections, and the generation queue
 * counts only requests that arrived whole (an idle socket takes no slot of it).
 * Binds 127.0.0.1 by default; optional bearer token (read from an environment variable, never logged);
 * request bodies above max_body are refused (413); `parallel` requests run on the engine at a time (each
 * with its own context and a share of the threads), up to max_queue more wait, beyond that 503; malformed JSON or fields -> 400, all with an
 * OpenAI-style {"error": {"message", "type", "param", "code"}} body. */
#ifndef KVB_SERVE_H
#define KVB_SERVE_H

#include <signal.h>
#include <stddef.h>

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
} kvb_serve_opts;

/* Serve until *stop becomes non-zero. Writes the bound port to *port_out (may be NULL) once listening and
 * calls ready(user) then. 0 on a clean stop, -1 + err when the server cannot start. */
int kvb_serve(const kvb_serve_opts *o, volatile sig_atomic_t *stop, int *port_out, void (*ready)(void *user, int port),
              void *user, char *err, size_t err_len);

#endif
