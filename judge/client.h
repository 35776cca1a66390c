/* client.h — an OpenAI-compatible chat-completions client for judges (libcurl multi + cJSON).
 *
 * Many requests in flight (a concurrency limit), a per-request timeout, retries with exponential backoff and
 * jitter on 429 / 5xx / connection errors and timeouts (honouring Retry-After up to retry_after_max_s: a
 * server asking for a longer wait fails that request instead of stalling the run), an overall deadline per
 * batch (what is not answered by then fails with a judge error), and a circuit breaker that stops sending
 * after N consecutive failed attempts and says so. Identical requests in one batch (same cache key) are sent
 * once and share the reply. Replies are cached on disk by content
 * (sha256 of base URL, model, messages and parameters): `cache_dir/<key>.json` holds the request and the raw
 * reply, so re-running is free and every verdict is auditable; refresh ignores the cache. The API key is
 * read from an environment variable at send time and is never written anywhere: a reply or error body that
 * echoes it (or the URL's userinfo), plainly or spelled with JSON escapes, is decoded and then redacted before
 * it is returned, cached or reported (judge/redact.h), and the cache stores the URL without userinfo. A failed
 * or unparseable request is reported per request; the batch always completes.
 *
 * What a judge server can make the client do is bounded: http and https only (the base URL's scheme is
 * checked up front, every libcurl handle is limited to them, redirects are not followed), a reply body of at
 * most KVB_JUDGE_MAX_REPLY_BYTES (the transfer is stopped there and the request fails), at most n choices
 * read from a reply, in one pass. */
#ifndef KVB_JUDGE_CLIENT_H
#define KVB_JUDGE_CLIENT_H

#include <stddef.h>

/* The largest judge reply body read (bytes); a longer one fails its request with a one-line error. */
#define KVB_JUDGE_MAX_REPLY_BYTES (4 << 20)

typedef struct {
    const char *base_url;     /* e.g. http://127.0.0.1:8080/v1 (".../chat/completions" is appended) */
    const char *model;
    const char *api_key_env;  /* environment variable with the key; NULL or unset = no Authorization header */
    int concurrency;          /* default 4 */
    double timeout_s;         /* per attempt, default 60 */
    int max_retries;          /* retries after the first attempt, default 4 */
    double backoff_s;         /* first backoff, default 0.5 (doubles, x0.5-1.0 jitter, capped at 30 s) */
    int breaker;              /* consecutive failed attempts that open the breaker, default 8 */
    const char *cache_dir;    /* NULL = no cache */
    int refresh;              /* ignore cached replies (still write new ones) */
    double temperature;       /* default 0 */
    int max_tokens;           /* default 10 */
    int n;                    /* choices per request, default 1 */
    double retry_after_max_s; /* longest Retry-After obeyed, default 60; a longer one fails the request */
    double deadline_s;        /* the whole batch, default 900; 0 = none */
} kvb_judge_cfg;

typedef struct {
    /* in */
    char *messages_json;      /* JSON array of {"role", "content"} (owned by the caller) */
    /* out */
    int ok;                   /* 1 = a reply with choices came back */
    char **replies;           /* choices[i].message.content (the first n of them; extra choices are not read) */
    int n_replies;
    char *raw;                /* the reply body decoded, redacted and printed again (as cached) */
    char error[256];          /* why not ok (judge error) */
    int attempts, from_cache, http_status;
    int unreachable;          /* 1 = its last attempt made no connection (host not resolved, connection refused) */
    char key[65];             /* cache key */
    int shared;               /* 1 = the reply of an identical request earlier in the batch (sent once) */
} kvb_judge_req;

void kvb_judge_cfg_defaults(kvb_judge_cfg *c);
/* 0 when url's scheme is http or https (any case); else -1 + a one-line error naming the scheme. */
int kvb_judge_check_url(const char *url, char *err, size_t err_len);
/* Send every request (or read it from the cache). 0 when the batch ran (individual failures are in the
 * requests), -1 + err only for a setup failure (a base URL that is not http or https, curl init, unwritable
 * cache directory). */
int kvb_judge_run(const kvb_judge_cfg *cfg, kvb_judge_req *reqs, int n, char *err, size_t err_len);
void kvb_judge_req_clear(kvb_judge_req *r); /* frees outputs, keeps messages_json */
/* messages_json for one user message: [{"role": "user", "content": content}] (malloc'd; NULL on OOM). */
char *kvb_judge_user_message(const char *content);

#endif
