/* client.c — the judge client (see client.h): a curl multi loop over a queue of requests with backoff. */
#include "judge/client.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <errno.h>
#include <math.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/fsutil.h"

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

static void cache_key(const kvb_judge_cfg *cfg, const char *body, char out[65]) {
    unsigned char md[32];
    unsigned int len = 0;
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    EVP_DigestInit_ex(c, EVP_sha256(), NULL);
    EVP_DigestUpdate(c, cfg->base_url, strlen(cfg->base_url) + 1);
    EVP_DigestUpdate(c, body, strlen(body));
    EVP_DigestFinal_ex(c, md, &len);
    EVP_MD_CTX_free(c);
    for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", md[i]);
}

/* choices[i].message.content of a raw reply; 0 or -1 + a reason in r->error. */
static int parse_reply(kvb_judge_req *r, const char *raw) {
    cJSON *j = cJSON_Parse(raw);
    if (!j) {
        snprintf(r->error, sizeof r->error, "unparseable reply (not JSON, %zu bytes)", strlen(raw));
        return -1;
    }
    cJSON *choices = cJSON_GetObjectItemCaseSensitive(j, "choices");
    int n = cJSON_IsArray(choices) ? cJSON_GetArraySize(choices) : 0;
    if (n == 0) {
        cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
        const char *msg = cJSON_IsObject(e) && cJSON_IsString(cJSON_GetObjectItem(e, "message")) ? cJSON_GetObjectItem(e, "message")->valuestring : NULL;
        snprintf(r->error, sizeof r->error, "reply has no choices%s%.200s", msg ? ": " : "", msg ? msg : "");
        cJSON_Delete(j);
        return -1;
    }
    r->replies = calloc((size_t)n, sizeof *r->replies);
    for (int i = 0; i < n && r->replies; i++) {
        cJSON *msg = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(choices, i), "message");
        cJSON *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
        if (!cJSON_IsString(content)) {
            snprintf(r->error, sizeof r->error, "choices[%d] has no message.content", i);
            cJSON_Delete(j);
            return -1;
        }
        r->replies[r->n_replies++] = strdup(content->valuestring);
    }
    cJSON_Delete(j);
    return 0;
}

static int cache_read(const kvb_judge_cfg *cfg, kvb_judge_req *r) {
    if (!cfg->cache_dir || cfg->refresh) return 0;
    char path[1200], e[256];
    snprintf(path, sizeof path, "%s/%s.json", cfg->cache_dir, r->key);
    if (access(path, R_OK)) return 0;
    char *text = kvb_read_file(path, NULL, e, sizeof e);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    cJSON *raw = cJSON_GetObjectItemCaseSensitive(j, "reply");
    int hit = 0;
    if (cJSON_IsString(raw) && parse_reply(r, raw->valuestring) == 0) {
        r->raw = strdup(raw->valuestring);
        r->ok = r->from_cache = hit = 1;
    } else {
        kvb_judge_req_clear(r); /* a corrupt cache entry is ignored and rewritten */
    }
    cJSON_Delete(j);
    return hit;
}

static void cache_write(const kvb_judge_cfg *cfg, const kvb_judge_req *r, const char *body) {
    if (!cfg->cache_dir) return;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "base_url", cfg->base_url);
    cJSON_AddStringToObject(j, "model", cfg->model ? cfg->model : "");
    cJSON_AddItemToObject(j, "request", cJSON_Parse(body));
    cJSON_AddStringToObject(j, "reply", r->raw);
    char *text = cJSON_Print(j);
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
} job;

static size_t on_body(char *p, size_t sz, size_t nm, void *u) {
    job *jb = u;
    size_t n = sz * nm;
    if (jb->n + n + 1 > jb->cap) {
        size_t cap = (jb->n + n + 1) * 2;
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
    if (n > 12 && !strncasecmp(p, "Retry-After:", 12)) jb->retry_after = atof(p + 12);
    return n;
}

static CURL *make_easy(const kvb_judge_cfg *cfg, job *jb, struct curl_slist **hdrs, const char *url) {
    CURL *e = curl_easy_init();
    if (!e) return NULL;
    jb->n = 0;
    jb->retry_after = -1;
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, jb->body);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, jb);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, jb);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)(cfg->timeout_s * 1000));
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

int kvb_judge_run(const kvb_judge_cfg *cfg, kvb_judge_req *reqs, int n, char *err, size_t err_len) {
    if (!cfg->base_url) return ERR("judge: no base URL");
    if (cfg->cache_dir && kvb_mkdirs(cfg->cache_dir)) return ERR("judge: cannot create cache %s: %s", cfg->cache_dir, strerror(errno));
    static int curl_ready;
    if (!curl_ready && curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK) curl_ready = 1;
    char url[1200];
    size_t bl = strlen(cfg->base_url);
    snprintf(url, sizeof url, "%s%schat/completions", cfg->base_url, bl && cfg->base_url[bl - 1] == '/' ? "" : "/");
    struct curl_slist *hdrs = curl_slist_append(NULL, "Content-Type: application/json");
    const char *key = cfg->api_key_env ? getenv(cfg->api_key_env) : NULL;
    if (key && *key) {
        size_t l = strlen(key) + 32;
        char *h = malloc(l);
        snprintf(h, l, "Authorization: Bearer %s", key);
        hdrs = curl_slist_append(hdrs, h);
        memset(h, 0, l);
        free(h);
    }
    job *jobs = calloc((size_t)(n > 0 ? n : 1), sizeof *jobs);
    CURLM *multi = curl_multi_init();
    if (!jobs || !multi || !hdrs) {
        free(jobs);
        curl_multi_cleanup(multi);
        curl_slist_free_all(hdrs);
        return ERR("judge: cannot initialise libcurl");
    }
    int remaining = 0;
    for (int i = 0; i < n; i++) {
        kvb_judge_req *r = &reqs[i];
        kvb_judge_req_clear(r);
        jobs[i].r = r;
        jobs[i].body = request_body(cfg, r->messages_json);
        if (!jobs[i].body) {
            snprintf(r->error, sizeof r->error, "messages are not a JSON array");
            jobs[i].done = 1;
            continue;
        }
        cache_key(cfg, jobs[i].body, r->key);
        if (cache_read(cfg, r)) jobs[i].done = 1;
        else remaining++;
    }
    int active = 0, consecutive_fail = 0, open = 0, next = 0;
    unsigned seed = 12345;
    while (remaining > 0) {
        double t = now_s();
        /* start what may start */
        for (int k = 0; k < n && active < (cfg->concurrency > 0 ? cfg->concurrency : 1) && !open; k++) {
            int i = (next + k) % n;
            job *jb = &jobs[i];
            if (jb->done || jb->easy || jb->not_before > t) continue;
            jb->easy = make_easy(cfg, jb, &hdrs, url);
            if (!jb->easy) continue;
            jb->r->attempts++;
            curl_multi_add_handle(multi, jb->easy);
            active++;
            next = i + 1;
        }
        if (open) { /* the breaker: fail everything not yet done and not in flight */
            for (int i = 0; i < n; i++)
                if (!jobs[i].done && !jobs[i].easy) {
                    snprintf(jobs[i].r->error, sizeof jobs[i].r->error,
                             "circuit breaker open after %d consecutive failures; not sent", consecutive_fail);
                    jobs[i].done = 1;
                    remaining--;
                }
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
            int retryable = cc != CURLE_OK || status == 429 || status >= 500;
            if (!retryable && status == 200) {
                if (parse_reply(r, jb->buf ? jb->buf : "") == 0) {
                    r->raw = strdup(jb->buf);
                    r->ok = 1;
                    r->error[0] = 0;
                    cache_write(cfg, r, jb->body);
                }
                consecutive_fail = 0;
                jb->done = 1;
                remaining--;
                continue;
            }
            if (cc != CURLE_OK) snprintf(r->error, sizeof r->error, "%s", curl_easy_strerror(cc));
            else snprintf(r->error, sizeof r->error, "HTTP %ld: %.160s", status, jb->buf ? jb->buf : "");
            if (retryable) {
                consecutive_fail++;
                if (cfg->breaker > 0 && consecutive_fail >= cfg->breaker) open = 1;
            }
            if (!retryable || r->attempts > cfg->max_retries || open) {
                jb->done = 1;
                remaining--;
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
    free(jobs);
    curl_multi_cleanup(multi);
    curl_slist_free_all(hdrs);
    return 0;
}
