/* client.c — the judge client (see client.h): a curl multi loop over a queue of requests with backoff. */
#include "judge/client.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "base/fsutil.h"
#include "base/sha256.h"
#include "judge/redact.h"

#define ERR(...) (snprintf(err, err_len, __VA_ARGS__), -1)

void kvb_judge_cfg_defaults(kvb_judge_cfg *c) {
    memset(c, 0, sizeof *c);
    c->concurrency = 4;
    c->timeout_s = 60;
    c->max_retries = 4;
    c->backoff_s = 0.5;
    c->breaker = 8;
    c->max_tokens = 10;
    c->n = 1;
    c->retry_after_max_s = 60;
    c->deadline_s = 900;
}

char *kvb_judge_user_message(const char *content) {
    cJSON *a = cJSON_CreateArray(), *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "user");
    cJSON_AddStringToObject(m, "content", content);
    cJSON_AddItemToArray(a, m);
    char *s = cJSON_PrintUnformatted(a);
    cJSON_Delete(a);
    return s;
}

void kvb_judge_req_clear(kvb_judge_req *r) {
    for (int i = 0; i < r->n_replies; i++) free(r->replies[i]);
    free(r->replies);
    free(r->raw);
    char *m = r->messages_json;
    memset(r, 0, sizeof *r);
    r->messages_json = m;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The request body (no key in it). */
static char *request_body(const kvb_judge_cfg *cfg, const char *messages_json) {
    cJSON *j = cJSON_CreateObject(), *msgs = cJSON_Parse(messages_json);
    if (!msgs) {
        cJSON_Delete(j);
        return NULL;
    }
    cJSON_AddStringToObject(j, "model", cfg->model ? cfg->model : "");
    cJSON_AddItemToObject(j, "messages", msgs);
    cJSON_AddNumberToObject(j, "temperature", cfg->temperature);
    cJSON_AddNumberToObject(j, "max_tokens", cfg->max_tokens);
    cJSON_AddNumberToObject(j, "n", cfg->n);
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return s;
}

static void cache_key(const char *base_url, const char *body, char out[65]) {
    const void *parts[] = {base_url, body};
    const size_t lens[] = {strlen(base_url) + 1, strlen(body)}; /* the URL's NUL separates it from the body */
    if (kvb_sha256(parts, lens, 2, NULL, out)) out[0] = 0;
}

/* A reply body decoded, then redacted (judge/redact.h): r->raw is its redacted tree printed again (what is
 * cached), r->replies the first max_replies choices[i].message.content. The choices are walked once (a reply
 * with a million of them costs one pass), and a batch deadline passed while walking them ends the walk.
 * 0, or -1 + a reason in r->error. */
static int parse_reply(kvb_judge_req *r, const kvb_secrets *sec, const char *body, int max_replies, double deadline) {
    cJSON *j = cJSON_Parse(body);
    if (!j) {
        snprintf(r->error, sizeof r->error, "unparseable reply (not JSON, %zu bytes)", strlen(body));
        return -1;
    }
    int rc = -1;
    char *printed = NULL;
    if (kvb_redact_json(sec, j) || !(printed = cJSON_PrintUnformatted(j)) || !(r->raw = strdup(printed))) {
        snprintf(r->error, sizeof r->error, "out of memory reading the reply");
        goto out;
    }
    cJSON *choices = cJSON_GetObjectItemCaseSensitive(j, "choices");
    if (!cJSON_IsArray(choices) || !choices->child) {
        cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
        const char *msg = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "message"));
        snprintf(r->error, sizeof r->error, "reply has no choices%s%.200s", msg ? ": " : "", msg ? msg : "");
        goto out;
    }
    int want = max_replies > 0 ? max_replies : 1, have = 0, i = 0;
    const cJSON *ch;
    cJSON_ArrayForEach(ch, choices) /* never cJSON_GetArrayItem(i) in a loop: that walks the list from its head */
        if (++have == want) break;  /* more choices than asked for: the extra ones are not read */
    if (!(r->replies = calloc((size_t)have, sizeof *r->replies))) {
        snprintf(r->error, sizeof r->error, "out of memory reading the reply");
        goto out;
    }
    cJSON_ArrayForEach(ch, choices) {
        if (i == have) break;
        if ((i & 1023) == 1023 && now_s() > deadline) {
            snprintf(r->error, sizeof r->error, "judge batch deadline passed while reading the reply (deadline_s)");
            goto out;
        }
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(ch, "message"), "content");
        if (!cJSON_IsString(content)) {
            snprintf(r->error, sizeof r->error, "choices[%d] has no message.content", i);
            goto out;
        }
        if (!(r->replies[r->n_replies++] = strdup(content->valuestring))) {
            snprintf(r->error, sizeof r->error, "out of memory reading the reply");
            goto out;
        }
        i++;
    }
    rc = 0;
out:
    if (printed) cJSON_free(printed);
    cJSON_Delete(j);
    return rc;
}

/* A cached reply, read through the same decode-then-redact as a fresh one (an entry written before a fix, or by
 * hand, cannot bring a secret back). 1 = a hit. */
static int cache_read(const kvb_judge_cfg *cfg, const kvb_secrets *sec, kvb_judge_req *r, double deadline) {
    if (!cfg->cache_dir || cfg->refresh) return 0;
    char path[1200], e[256];
    snprintf(path, sizeof path, "%s/%s.json", cfg->cache_dir, r->key);
    if (access(path, R_OK)) return 0;
    char *text = kvb_read_file(path, NULL, e, sizeof e);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    cJSON *raw = cJSON_GetObjectItemCaseSensitive(j, "reply");
    int hit = 0;
    if (cJSON_IsString(raw) && parse_reply(r, sec, raw->valuestring, cfg->n, deadline) == 0) {
        r->ok = r->from_cache = hit = 1;
    } else { /* a corrupt cache entry is ignored and rewritten */
        char key[sizeof r->key];
        memcpy(key, r->key, sizeof key);
        kvb_judge_req_clear(r);
        memcpy(r->key, key, sizeof key);
    }
    cJSON_Delete(j);
    return hit;
}

/* The request and its (already redacted) reply under the cache key; every string of the entry is redacted
 * once more, so nothing the client writes holds a secret. */
static void cache_write(const kvb_judge_cfg *cfg, const kvb_secrets *sec, const char *base_url, const kvb_judge_req *r,
                        const char *body) {
    if (!cfg->cache_dir) return;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "base_url", base_url);
    cJSON_AddStringToObject(j, "model", cfg->model ? cfg->model : "");
    cJSON_AddItemToObject(j, "request", cJSON_Parse(body));
    cJSON_AddStringToObject(j, "reply", r->raw);
    char *text = kvb_redact_json(sec, j) ? NULL : cJSON_Print(j);
    cJSON_Delete(j);
    char path[1200], e[256];
    snprintf(path, sizeof path, "%s/%s.json", cfg->cache_dir, r->key);
    if (text) kvb_write_file_atomic(path, text, e, sizeof e);
    free(text);
}

/* ---- the multi loop ---- */

typedef struct {
    kvb_judge_req *r;
    char *body;
    char *buf;
    size_t n, cap;
    double not_before;  /* backoff: do not send before this time */
    double retry_after; /* from the last reply's Retry-After header, seconds (-1 none) */
    CURL *easy;
    int done;
    int dup_of;         /* index of an identical earlier request in the batch, -1 none */
    int too_large;      /* the reply passed KVB_JUDGE_MAX_REPLY_BYTES: the transfer was stopped there */
} job;

/* The reply's bytes, up to KVB_JUDGE_MAX_REPLY_BYTES: a server that keeps streaming is cut off (0 stops the
 * transfer) instead of growing the buffer without end. */
static size_t on_body(char *p, size_t sz, size_t nm, void *u) {
    job *jb = u;
    size_t n = sz * nm;
    if (n > KVB_JUDGE_MAX_REPLY_BYTES - jb->n) {
        jb->too_large = 1;
        return 0;
    }
    if (jb->n + n + 1 > jb->cap) {
        size_t cap = (jb->n + n + 1) * 2;
        if (cap > KVB_JUDGE_MAX_REPLY_BYTES + 1) cap = KVB_JUDGE_MAX_REPLY_BYTES + 1;
        char *b = realloc(jb->buf, cap);
        if (!b) return 0;
        jb->buf = b;
        jb->cap = cap;
    }
    memcpy(jb->buf + jb->n, p, n);
    jb->n += n;
    jb->buf[jb->n] = 0;
    return n;
}

static size_t on_header(char *p, size_t sz, size_t nm, void *u) {
    job *jb = u;
    size_t n = sz * nm;
    if (n > 12 && !strncasecmp(p, "Retry-After:", 12)) {
        char *end;
        double v = strtod(p + 12, &end);
        if (end != p + 12 && v >= 0) jb->retry_after = v; /* an HTTP-date falls back to our own backoff */
    }
    return n;
}

static CURL *make_easy(const kvb_judge_cfg *cfg, job *jb, struct curl_slist **hdrs, const char *url, double left_s) {
    CURL *e = curl_easy_init();
    if (!e) return NULL;
    jb->n = 0;
    jb->retry_after = -1;
    jb->too_large = 0;
    /* http and https only, for this handle and any redirect (which stays off): a base URL such as file:///etc/x?
     * is refused up front (kvb_judge_check_url), and libcurl itself could not read it either */
#if LIBCURL_VERSION_NUM >= 0x075500 /* 7.85.0: the _STR forms; the bitmask ones are deprecated there */
    CURLcode pc = curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    if (pc == CURLE_OK) pc = curl_easy_setopt(e, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
#else
    CURLcode pc = curl_easy_setopt(e, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
    if (pc == CURLE_OK) pc = curl_easy_setopt(e, CURLOPT_REDIR_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    if (pc != CURLE_OK || curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L) != CURLE_OK) {
        curl_easy_cleanup(e);
        return NULL;
    }
    curl_easy_setopt(e, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)KVB_JUDGE_MAX_REPLY_BYTES); /* a declared length over it */
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, jb->body);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, jb);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, jb);
    double to_s = cfg->timeout_s < left_s ? cfg->timeout_s : left_s; /* no attempt outlives the batch deadline */
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)(to_s * 1000) > 0 ? (long)(to_s * 1000) : 1L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)(cfg->timeout_s * 1000 < 10000 ? cfg->timeout_s * 1000 : 10000));
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, *hdrs);
    curl_easy_setopt(e, CURLOPT_PRIVATE, jb);
    return e;
}

static double backoff(const kvb_judge_cfg *cfg, int attempt, unsigned *seed) {
    double b = cfg->backoff_s * pow(2.0, attempt - 1);
    if (b > 30) b = 30;
    return b * (0.5 + 0.5 * (double)rand_r(seed) / RAND_MAX);
}

/* A request that will not be sent (again): its error set, counted done. */
static void finish(job *jb, int *remaining, const char *fmt, double a, double b) {
    if (fmt) snprintf(jb->r->error, sizeof jb->r->error, fmt, a, b);
    jb->done = 1;
    (*remaining)--;
}

int kvb_judge_check_url(const char *url, char *err, size_t err_len) {
    if (!url || !*url) return ERR("judge: no base URL");
    size_t n = strspn(url, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-");
    if (n == 0 || strncmp(url + n, "://", 3)) return ERR("judge: the base URL has no scheme (http:// or https:// only)");
    if ((n == 4 && !strncasecmp(url, "http", 4)) || (n == 5 && !strncasecmp(url, "https", 5))) return 0;
    return ERR("judge: base URL scheme '%.*s' is not allowed (http or https only)", n > 16 ? 16 : (int)n, url);
}

int kvb_judge_run(const kvb_judge_cfg *cfg, kvb_judge_req *reqs, int n, char *err, size_t err_len) {
    /* the deadline covers the whole batch: cache reads and reading replies included */
    double deadline = cfg->deadline_s > 0 ? now_s() + cfg->deadline_s : 1e300;
    if (kvb_judge_check_url(cfg->base_url, err, err_len)) return -1;
    if (cfg->cache_dir && kvb_mkdirs(cfg->cache_dir)) return ERR("judge: cannot create cache %s: %s", cfg->cache_dir, strerror(errno));
    static int curl_ready;
    if (!curl_ready && curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK) curl_ready = 1;
    /* secrets: the key and the URL's userinfo; what is stored or reported uses the URL without userinfo */
    char url[1200], base[1024], userinfo[512], password[512];
    kvb_url_strip_userinfo(cfg->base_url, base, sizeof base, userinfo, sizeof userinfo, password, sizeof password);
    kvb_secrets sec = {0};
    size_t bl = strlen(cfg->base_url);
    snprintf(url, sizeof url, "%s%schat/completions", cfg->base_url, bl && cfg->base_url[bl - 1] == '/' ? "" : "/");
    struct curl_slist *hdrs = curl_slist_append(NULL, "Content-Type: application/json");
    const char *key = cfg->api_key_env ? getenv(cfg->api_key_env) : NULL;
    int sec_rc = kvb_secrets_add(&sec, key) | kvb_secrets_add_url_part(&sec, userinfo) | kvb_secrets_add_url_part(&sec, password);
    memset(userinfo, 0, sizeof userinfo);
    memset(password, 0, sizeof password);
    if (key && *key) {
        size_t l = strlen(key) + 32;
        char *h = malloc(l);
        if (h) {
            snprintf(h, l, "Authorization: Bearer %s", key);
            hdrs = curl_slist_append(hdrs, h);
            memset(h, 0, l);
            free(h);
        }
    }
    job *jobs = calloc((size_t)(n > 0 ? n : 1), sizeof *jobs);
    CURLM *multi = curl_multi_init();
    if (!jobs || !multi || !hdrs || sec_rc) {
        free(jobs);
        curl_multi_cleanup(multi);
        curl_slist_free_all(hdrs);
        kvb_secrets_free(&sec);
        return ERR("judge: cannot initialise libcurl");
    }
    int remaining = 0;
    for (int i = 0; i < n; i++) {
        kvb_judge_req *r = &reqs[i];
        kvb_judge_req_clear(r);
        jobs[i].r = r;
        jobs[i].dup_of = -1;
        jobs[i].body = request_body(cfg, r->messages_json);
        if (!jobs[i].body) {
            snprintf(r->error, sizeof r->error, "messages are not a JSON array");
            jobs[i].done = 1;
            continue;
        }
        cache_key(base, jobs[i].body, r->key);
        for (int k = 0; k < i && jobs[i].dup_of < 0; k++)
            if (jobs[k].body && !strcmp(reqs[k].key, r->key)) jobs[i].dup_of = jobs[k].dup_of >= 0 ? jobs[k].dup_of : k;
        if (jobs[i].dup_of >= 0) jobs[i].done = 1; /* sent once: copied from its first occurrence below */
        else if (cache_read(cfg, &sec, r, deadline)) jobs[i].done = 1;
        else remaining++;
    }
    int active = 0, consecutive_fail = 0, open = 0, next = 0;
    unsigned seed = 12345;
    while (remaining > 0) {
        double t = now_s();
        if (t >= deadline) { /* everything unanswered fails, in flight or not */
            for (int i = 0; i < n; i++) {
                if (jobs[i].done) continue;
                if (jobs[i].easy) {
                    curl_multi_remove_handle(multi, jobs[i].easy);
                    curl_easy_cleanup(jobs[i].easy);
                    jobs[i].easy = NULL;
                    active--;
                }
                finish(&jobs[i], &remaining, "judge batch deadline of %g s passed (deadline_s)", cfg->deadline_s, 0);
            }
            break;
        }
        /* start what may start */
        for (int k = 0; k < n && active < (cfg->concurrency > 0 ? cfg->concurrency : 1) && !open; k++) {
            int i = (next + k) % n;
            job *jb = &jobs[i];
            if (jb->done || jb->easy || jb->not_before > t) continue;
            jb->easy = make_easy(cfg, jb, &hdrs, url, deadline - t);
            if (!jb->easy) {
                finish(jb, &remaining, "judge: cannot set up a libcurl handle (http and https only)", 0, 0);
                continue;
            }
            jb->r->attempts++;
            curl_multi_add_handle(multi, jb->easy);
            active++;
            next = i + 1;
        }
        if (open) { /* the breaker: fail everything not yet done and not in flight */
            for (int i = 0; i < n; i++)
                if (!jobs[i].done && !jobs[i].easy)
                    finish(&jobs[i], &remaining, "circuit breaker open after %g consecutive failures; not sent", consecutive_fail, 0);
            if (remaining == 0) break;
        }
        int running = 0;
        curl_multi_perform(multi, &running);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(multi, &left))) {
            if (msg->msg != CURLMSG_DONE) continue;
            job *jb;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&jb);
            long status = 0;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_RESPONSE_CODE, &status);
            CURLcode cc = msg->data.result;
            curl_multi_remove_handle(multi, msg->easy_handle);
            curl_easy_cleanup(msg->easy_handle);
            jb->easy = NULL;
            active--;
            kvb_judge_req *r = jb->r;
            r->http_status = (int)status;
            if (jb->too_large || cc == CURLE_FILESIZE_EXCEEDED) { /* the same reply again would be as large: no retry */
                snprintf(r->error, sizeof r->error, "judge reply larger than %d bytes (KVB_JUDGE_MAX_REPLY_BYTES); not read",
                         KVB_JUDGE_MAX_REPLY_BYTES);
                consecutive_fail++;
                if (cfg->breaker > 0 && consecutive_fail >= cfg->breaker) open = 1;
                finish(jb, &remaining, NULL, 0, 0);
                continue;
            }
            int retryable = cc != CURLE_OK || status == 429 || status >= 500;
            if (!retryable && status == 200) {
                /* decoded, then redacted: an echoing server gets no secret into a record, the cache or an error */
                if (parse_reply(r, &sec, jb->buf ? jb->buf : "", cfg->n, deadline) == 0) {
                    r->ok = 1;
                    r->error[0] = 0;
                    cache_write(cfg, &sec, base, r, jb->body);
                }
                consecutive_fail = 0;
                finish(jb, &remaining, NULL, 0, 0);
                continue;
            }
            r->unreachable =
                cc == CURLE_COULDNT_RESOLVE_HOST || cc == CURLE_COULDNT_RESOLVE_PROXY || cc == CURLE_COULDNT_CONNECT;
            if (cc != CURLE_OK) {
                snprintf(r->error, sizeof r->error, "%s", curl_easy_strerror(cc));
            } else { /* the whole body decoded and redacted before it is cut to an error line */
                char *shown = kvb_redact_decoded(&sec, strdup(jb->buf ? jb->buf : ""));
                snprintf(r->error, sizeof r->error, "HTTP %ld: %.160s", status, shown ? shown : "(body not shown: out of memory)");
                for (char *c = r->error; *c; c++)
                    if (*c == '\n' || *c == '\r') *c = ' '; /* one line */
                free(shown);
            }
            if (retryable) {
                consecutive_fail++;
                if (cfg->breaker > 0 && consecutive_fail >= cfg->breaker) open = 1;
            }
            if (!retryable || r->attempts > cfg->max_retries || open) {
                finish(jb, &remaining, NULL, 0, 0);
                continue;
            }
            if (jb->retry_after > cfg->retry_after_max_s) {
                finish(jb, &remaining, "HTTP 429/5xx with Retry-After %g s, above the cap of %g s (retry_after_max_s)",
                       jb->retry_after, cfg->retry_after_max_s);
                continue;
            }
            double wait = jb->retry_after >= 0 ? jb->retry_after : backoff(cfg, r->attempts, &seed);
            jb->not_before = now_s() + wait;
        }
        if (remaining > 0) curl_multi_poll(multi, NULL, 0, 50, NULL);
    }
    for (int i = 0; i < n; i++) {
        if (jobs[i].easy) {
            curl_multi_remove_handle(multi, jobs[i].easy);
            curl_easy_cleanup(jobs[i].easy);
        }
        free(jobs[i].body);
        free(jobs[i].buf);
    }
    /* identical requests share the reply of the one that was sent */
    for (int i = 0; i < n; i++) {
        if (jobs[i].dup_of < 0) continue;
        kvb_judge_req *r = &reqs[i], *src = &reqs[jobs[i].dup_of];
        r->ok = src->ok, r->attempts = 0, r->from_cache = src->from_cache, r->http_status = src->http_status, r->shared = 1;
        r->unreachable = src->unreachable;
        memcpy(r->error, src->error, sizeof r->error); /* (distinct requests: i is not its own duplicate) */
        r->raw = src->raw ? strdup(src->raw) : NULL;
        if (src->n_replies && (r->replies = calloc((size_t)src->n_replies, sizeof *r->replies)))
            for (int k = 0; k < src->n_replies; k++) r->replies[r->n_replies++] = strdup(src->replies[k] ? src->replies[k] : "");
    }
    free(jobs);
    curl_multi_cleanup(multi);
    curl_slist_free_all(hdrs);
    kvb_secrets_free(&sec);
    return 0;
}
