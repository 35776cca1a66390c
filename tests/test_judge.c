/* test_judge.c — the judge client against a fault-injecting server started here (429 with Retry-After, an
 * endless Retry-After, 500s, replies slower than the timeout or the batch deadline, truncated JSON, missing
 * choices, a reply without a score, a server that always fails, one that echoes the Authorization header);
 * the API key and URL userinfo never reach a file; judged suite runs record verdicts and judge errors, and a
 * stalled judge loses no generation. `kvbench serve` itself is tested in test_serve.c. */
#define _GNU_SOURCE /* memmem */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <dirent.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "util_common.h"
#include "judge/client.h"
#include "judge/judges.h"

#define KEY "sk-test-SECRET-4242"

static struct MHD_Daemon *fault;
static int fault_port;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int hits_429, hits_500, hits_total, auth_ok, auth_seen, hits_dedupe;
static volatile int stall_judge; /* "case=stall" requests get a 429 with Retry-After 30 while set */
static char tmpdir[64] = "/tmp/kvb_judge_XXXXXX";


static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, const char *text, const char *retry_after) {
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_MUST_COPY);
    if (retry_after) MHD_add_response_header(r, "Retry-After", retry_after);
    MHD_add_response_header(r, "Content-Type", "application/json");
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

/* A JSON string's text for s with every character written as a \u escape. */
static void u_escape_all(const char *s, char *out, size_t cap) {
    size_t o = 0;
    for (; *s && o + 7 < cap; s++) o += (size_t)snprintf(out + o, cap - o, "\\u%04x", (unsigned char)*s);
    out[o] = 0;
}

/* s with each 'S' written \u0053 and each '/' written \/ (both legal JSON spellings of the same text). */
static void escape_some(const char *s, char *out, size_t cap) {
    size_t o = 0;
    for (; *s && o + 7 < cap; s++) {
        if (*s == 'S') o += (size_t)snprintf(out + o, cap - o, "\\u0053");
        else if (*s == '/') o += (size_t)snprintf(out + o, cap - o, "\\/");
        else out[o++] = *s;
    }
    out[o] = 0;
}

/* A reply of `total` bytes streamed in pieces (chunked, or with a Content-Length when declared): a judge that
 * will not stop talking. */
static ssize_t huge_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    uint64_t total = (uint64_t)(uintptr_t)cls;
    if (pos >= total) return MHD_CONTENT_READER_END_OF_STREAM;
    size_t n = total - pos < max ? (size_t)(total - pos) : max;
    memset(buf, ' ', n);
    if (pos == 0 && n) buf[0] = '[';
    return (ssize_t)n;
}

#define MANY_CHOICES 140000 /* 26 bytes each: 3.6 MB, under the client's reply cap */
static char *many_choices_reply;

static enum MHD_Result on_fault(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                const char *version, const char *data, size_t *size, void **con) {
    (void)cls, (void)url, (void)method, (void)version;
    const char *body = NULL;
    if (util_http_body(con, data, size, &body)) return MHD_YES;
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    pthread_mutex_lock(&mu);
    hits_total++;
    if (auth) auth_seen++, auth_ok += !strcmp(auth, "Bearer " KEY);
    pthread_mutex_unlock(&mu);
    const char *ok = "{\"id\":\"x\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"yes\"}}]}";
    if (!body) body = "";
    if (strstr(body, "case=429once")) {
        pthread_mutex_lock(&mu);
        int first = hits_429++ == 0;
        pthread_mutex_unlock(&mu);
        return first ? reply(c, 429, "{\"error\":{\"message\":\"rate limited\"}}", "1") : reply(c, 200, ok, NULL);
    }
    if (strstr(body, "case=500twice")) {
        pthread_mutex_lock(&mu);
        int fail = hits_500++ < 2;
        pthread_mutex_unlock(&mu);
        return fail ? reply(c, 500, "{\"error\":{\"message\":\"boom\"}}", NULL) : reply(c, 200, ok, NULL);
    }
    if (strstr(body, "case=huge")) { /* 50 MB */
        uint64_t total = 50ull << 20;
        struct MHD_Response *r = MHD_create_response_from_callback(strstr(body, "case=hugelength") ? total : MHD_SIZE_UNKNOWN,
                                                                   64 * 1024, huge_reader, (void *)(uintptr_t)total, NULL);
        enum MHD_Result rc = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        return rc;
    }
    if (strstr(body, "case=manychoices")) return reply(c, 200, many_choices_reply, NULL);
    if (strstr(body, "case=redirect")) {
        struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        char loc[256];
        snprintf(loc, sizeof loc, "file://%s/not-a-judge.json", tmpdir);
        MHD_add_response_header(r, "Location", loc);
        enum MHD_Result rc = MHD_queue_response(c, 302, r);
        MHD_destroy_response(r);
        return rc;
    }
    /* a server that echoes the Authorization header spelled with JSON escapes: every character \u-escaped, or
     * only some ('S' as \u0053, '/' as \/), in a reply, a JSON error body and a plain-text error body */
    if (strstr(body, "case=escaped")) {
        char all[1024], some[512], text[2048];
        u_escape_all(auth ? auth : "(none)", all, sizeof all);
        escape_some(auth ? auth : "(none)", some, sizeof some);
        if (strstr(body, "case=escapedecho")) {
            snprintf(text, sizeof text, "{\"choices\":[{\"message\":{\"role\":\"assistant\",\"content\":\"Score: 5 (all: %s; some: %s)\"}}]}",
                     all, some);
            return reply(c, 200, text, NULL);
        }
        if (strstr(body, "case=escaped500")) {
            snprintf(text, sizeof text, "{\"error\":{\"message\":\"down; you sent %s\",\"detail\":\"%s\"}}", all, some);
            return reply(c, 500, text, NULL);
        }
        snprintf(text, sizeof text, "<html>bad gateway: you sent %s</html>", all); /* not JSON */
        return reply(c, 502, text, NULL);
    }
    /* a server that echoes the Authorization header (as some proxies and debug endpoints do) */
    char echo[1024];
    snprintf(echo, sizeof echo, "{\"error\":{\"message\":\"down; you sent Authorization: %.400s\"}}", auth ? auth : "(none)");
    if (strstr(body, "case=always500")) return reply(c, 500, echo, NULL);
    if (strstr(body, "case=echo")) {
        snprintf(echo, sizeof echo, "{\"choices\":[{\"message\":{\"role\":\"assistant\",\"content\":\"Score: 5 (auth was %.400s)\"}}]}",
                 auth ? auth : "(none)");
        return reply(c, 200, echo, NULL);
    }
    if (strstr(body, "case=429ra1")) return reply(c, 429, "{\"error\":{\"message\":\"slow down\"}}", "1");
    if (strstr(body, "case=429long")) return reply(c, 429, "{\"error\":{\"message\":\"come back tomorrow\"}}", "100000");
    if (strstr(body, "case=dedupe")) {
        pthread_mutex_lock(&mu);
        hits_dedupe++;
        pthread_mutex_unlock(&mu);
    }
    if (strstr(body, "case=stall") && stall_judge) return reply(c, 429, "{\"error\":{\"message\":\"busy\"}}", "50");
    if (strstr(body, "case=slow")) {
        usleep(1500 * 1000);
        return reply(c, 200, ok, NULL);
    }
    if (strstr(body, "case=truncated")) return reply(c, 200, "{\"id\":\"x\",\"choices\":[{\"mess", NULL);
    if (strstr(body, "case=nochoices")) return reply(c, 200, "{\"id\":\"x\",\"object\":\"chat.completion\"}", NULL);
    if (strstr(body, "case=noscore"))
        return reply(c, 200, "{\"choices\":[{\"message\":{\"role\":\"assistant\",\"content\":\"I cannot grade this.\"}}]}", NULL);
    if (strstr(body, "case=quality"))
        return reply(c, 200, "{\"choices\":[{\"message\":{\"role\":\"assistant\",\"content\":\"{'factual accuracy': 9, "
                             "'meeting user needs': 6, 'overall score': 7}}\"}}]}", NULL);
    return reply(c, 200, ok, NULL);
}

static void on_fault_done(void *cls, struct MHD_Connection *c, void **con, enum MHD_RequestTerminationCode t) {
    (void)cls, (void)c, (void)t;
    util_http_body_free(con);
}

static void cfg_fault(kvb_judge_cfg *c, char *url, size_t cap) {
    kvb_judge_cfg_defaults(c);
    snprintf(url, cap, "http://127.0.0.1:%d/v1", fault_port);
    c->base_url = url;
    c->model = "fault-judge";
    c->timeout_s = 0.5;
    c->max_retries = 2;
    c->backoff_s = 0.05;
}

static void test_fault_cases_end_as_documented(void) {
    const char *cases[] = {"case=ok", "case=429once", "case=500twice", "case=slow", "case=truncated", "case=nochoices",
                           "case=noscore", "case=quality"};
    enum { N = 8 };
    kvb_judge_req r[N];
    memset(r, 0, sizeof r);
    for (int i = 0; i < N; i++) r[i].messages_json = kvb_judge_user_message(cases[i]);
    kvb_judge_cfg c;
    char url[128], err[256];
    cfg_fault(&c, url, sizeof url);
    double t0 = (double)time(NULL);
    CU_ASSERT_FATAL(kvb_judge_run(&c, r, N, err, sizeof err) == 0);
    CU_ASSERT(r[0].ok && r[0].attempts == 1 && !strcmp(r[0].replies[0], "yes"));
    CU_ASSERT(r[1].ok && r[1].attempts == 2);                 /* 429, waited Retry-After, then success */
    CU_ASSERT((double)time(NULL) - t0 >= 1.0);
    CU_ASSERT(r[2].ok && r[2].attempts == 3);                 /* 500, 500, success */
    CU_ASSERT(!r[3].ok && r[3].attempts == 3 && strstr(r[3].error, "imeout")); /* every attempt timed out */
    CU_ASSERT(!r[4].ok && strstr(r[4].error, "unparseable"));
    CU_ASSERT(!r[5].ok && strstr(r[5].error, "no choices"));
    double score = 0;
    CU_ASSERT(r[6].ok && kvb_quality_parse(r[6].replies[0], &score) == -1); /* judge error: no score */
    CU_ASSERT(r[7].ok && kvb_quality_parse(r[7].replies[0], &score) == 0 && score == 7.0);
    for (int i = 0; i < N; i++) {
        if (!r[i].ok) CU_ASSERT(r[i].error[0] != 0 && strchr(r[i].error, '\n') == NULL);
        kvb_judge_req_clear(&r[i]);
        free(r[i].messages_json);
    }
}

static void test_circuit_breaker_stops_sending(void) {
    enum { N = 10 };
    kvb_judge_req r[N];
    memset(r, 0, sizeof r);
    for (int i = 0; i < N; i++) {
        char q[64];
        snprintf(q, sizeof q, "case=always500 #%d", i); /* distinct: identical requests would be sent once */
        r[i].messages_json = kvb_judge_user_message(q);
    }
    kvb_judge_cfg c;
    char url[128], err[256];
    cfg_fault(&c, url, sizeof url);
    c.concurrency = 1;
    c.max_retries = 10;
    c.breaker = 3;
    int before = hits_total;
    CU_ASSERT_FATAL(kvb_judge_run(&c, r, N, err, sizeof err) == 0);
    CU_ASSERT(hits_total - before == 3);
    int open = 0;
    for (int i = 0; i < N; i++) {
        CU_ASSERT(!r[i].ok);
        open += strstr(r[i].error, "circuit breaker open") != NULL;
        kvb_judge_req_clear(&r[i]);
        free(r[i].messages_json);
    }
    CU_ASSERT(open >= N - 1);
}

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Run fn in a child process and wait at most limit_s for it: a stalled client fails the test instead of
 * hanging it. The child's exit status: 0 = all its assertions held. */
static int bounded(int (*fn)(void), double limit_s) {
    pid_t pid = fork();
    if (pid == 0) _exit(fn());
    double t0 = mono_s();
    int st = 0;
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (mono_s() - t0 > limit_s) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            fprintf(stderr, "\n  still running after %.0f s: killed\n", limit_s);
            return -1;
        }
        usleep(20000);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A 429 with Retry-After: 100000 fails at once (cap 60 s); a cap below the asked wait fails too; a batch
 * deadline ends a request slower than it. */
static int retry_after_child(void) {
    enum { N = 3 };
    kvb_judge_req r[N];
    memset(r, 0, sizeof r);
    r[0].messages_json = kvb_judge_user_message("case=429long");
    r[1].messages_json = kvb_judge_user_message("case=ok");
    r[2].messages_json = kvb_judge_user_message("case=429ra1");
    kvb_judge_cfg c;
    char url[128], err[256];
    cfg_fault(&c, url, sizeof url);
    c.retry_after_max_s = 60;
    double t0 = mono_s();
    if (kvb_judge_run(&c, r, 2, err, sizeof err)) return 10;
    int bad = 0;
    if (r[0].ok || !strstr(r[0].error, "Retry-After 100000") || !strstr(r[0].error, "cap of 60")) bad |= 1;
    if (mono_s() - t0 > 5) bad |= 2; /* not stalled */
    if (!r[1].ok) bad |= 4;
    /* Retry-After 1 against a cap of 0.5 s: the attempt fails */
    c.retry_after_max_s = 0.5;
    if (kvb_judge_run(&c, &r[2], 1, err, sizeof err) || r[2].ok || !strstr(r[2].error, "cap of 0.5")) bad |= 8;
    /* the batch deadline: a reply taking 1.5 s against a deadline of 0.6 s */
    kvb_judge_req slow = {0};
    slow.messages_json = kvb_judge_user_message("case=slow");
    c.timeout_s = 10;
    c.deadline_s = 0.6;
    t0 = mono_s();
    if (kvb_judge_run(&c, &slow, 1, err, sizeof err) || slow.ok || !strstr(slow.error, "deadline")) bad |= 16;
    if (mono_s() - t0 > 1.4) bad |= 32;
    if (bad) fprintf(stderr, "\n  retry-after/deadline: failures %#x (%s | %s | %s)\n", bad, r[0].error, r[2].error, slow.error);
    kvb_judge_req_clear(&slow);
    for (int i = 0; i < N; i++) kvb_judge_req_clear(&r[i]);
    free(slow.messages_json);
    for (int i = 0; i < N; i++) free(r[i].messages_json);
    return bad;
}

static void test_retry_after_capped_and_batch_deadline(void) {
    CU_ASSERT(bounded(retry_after_child, 20) == 0);
}

/* Identical prompts in one batch are sent once and share the reply. */
static void test_identical_prompts_sent_once(void) {
    enum { N = 4 };
    kvb_judge_req r[N];
    memset(r, 0, sizeof r);
    for (int i = 0; i < N; i++) r[i].messages_json = kvb_judge_user_message(i < 3 ? "case=dedupe same" : "case=dedupe other");
    kvb_judge_cfg c;
    char url[128], err[256];
    cfg_fault(&c, url, sizeof url);
    int before = hits_dedupe;
    CU_ASSERT_FATAL(kvb_judge_run(&c, r, N, err, sizeof err) == 0);
    CU_ASSERT(hits_dedupe - before == 2);
    for (int i = 0; i < N; i++) {
        CU_ASSERT(r[i].ok && r[i].n_replies == 1 && !strcmp(r[i].replies[0], "yes"));
        CU_ASSERT(r[i].shared == (i == 1 || i == 2));
        kvb_judge_req_clear(&r[i]);
        free(r[i].messages_json);
    }
}

static int dir_contains(const char *dir, const char *needle) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int found = 0;
    while ((e = readdir(d)) && !found) {
        if (e->d_name[0] == '.') continue;
        char p[512];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        size_t len;
        char *t = util_read_file(p, &len);
        if (t && memmem(t, len, needle, strlen(needle))) found = 1;
        free(t);
    }
    closedir(d);
    return found;
}

#define URL_PW "PW-SECRET-77"

/* A server echoing the Authorization header (Bearer key or the Basic form of URL userinfo) in error bodies
 * and replies: nothing the client returns or caches holds the key, the password or its base64 form. */
static void test_echoed_secrets_redacted(void) {
    setenv("KVB_TEST_JUDGE_KEY", KEY, 1);
    char cache[128], url[128], err[256];
    snprintf(cache, sizeof cache, "%s/echo-cache", tmpdir);
    snprintf(url, sizeof url, "http://kvbuser:" URL_PW "@127.0.0.1:%d/v1", fault_port);
    const char *b64 = "a3ZidXNlcjpQVy1TRUNSRVQtNzc="; /* base64("kvbuser:PW-SECRET-77"), as curl sends it */
    for (int with_key = 0; with_key < 2; with_key++) {
        kvb_judge_req r[2];
        memset(r, 0, sizeof r);
        r[0].messages_json = kvb_judge_user_message(with_key ? "case=echo k" : "case=echo u");
        r[1].messages_json = kvb_judge_user_message(with_key ? "case=always500 k" : "case=always500 u");
        kvb_judge_cfg c;
        char u2[128];
        cfg_fault(&c, u2, sizeof u2);
        c.base_url = url;
        c.api_key_env = with_key ? "KVB_TEST_JUDGE_KEY" : NULL;
        c.cache_dir = cache;
        c.max_retries = 0;
        CU_ASSERT_FATAL(kvb_judge_run(&c, r, 2, err, sizeof err) == 0);
        CU_ASSERT(r[0].ok && r[0].n_replies == 1 && strstr(r[0].replies[0], "[REDACTED]"));
        CU_ASSERT(!r[1].ok && strstr(r[1].error, "[REDACTED]"));
        for (int i = 0; i < 2; i++) {
            const char *texts[3] = {r[i].error, r[i].raw ? r[i].raw : "", r[i].n_replies ? r[i].replies[0] : ""};
            for (int k = 0; k < 3; k++)
                CU_ASSERT(!strstr(texts[k], KEY) && !strstr(texts[k], URL_PW) && !strstr(texts[k], b64));
            kvb_judge_req_clear(&r[i]);
            free(r[i].messages_json);
        }
    }
    CU_ASSERT(!dir_contains(cache, KEY) && !dir_contains(cache, URL_PW) && !dir_contains(cache, b64) &&
              !dir_contains(cache, "kvbuser"));
    CU_ASSERT(dir_contains(cache, "case=echo")); /* the cache was written */
}

#define SLASH_KEY "sk-test/SECRET+4242"
#define PCT_PW_URL "PW-%3FSECRET77"                /* as written in the URL */
#define PCT_PW "PW-?SECRET77"                      /* as libcurl sends it */
#define PCT_B64 "a3ZidXNlcjpQVy0/U0VDUkVUNzc="     /* base64("kvbuser:PW-?SECRET77"): holds a '/' */

/* 1 when text, or any string of it read as JSON, holds a secret of the escaped-echo test in plain text. */
static int leaks_escaped_secret(const char *text) {
    static const char *secrets[] = {SLASH_KEY, PCT_PW, PCT_PW_URL, PCT_B64, "SECRET"};
    if (!text) return 0;
    for (size_t i = 0; i < sizeof secrets / sizeof *secrets; i++)
        if (strstr(text, secrets[i])) return 1;
    cJSON *j = cJSON_Parse(text);
    char *plain = j ? cJSON_PrintUnformatted(j) : NULL; /* cJSON prints '/' and letters unescaped */
    int leak = 0;
    for (size_t i = 0; plain && i < sizeof secrets / sizeof *secrets; i++) leak |= strstr(plain, secrets[i]) != NULL;
    free(plain);
    cJSON_Delete(j);
    return leak;
}

/* A judge that echoes the Authorization header (Bearer key with a '/', or the Basic form of a percent-encoded
 * URL password) spelled with JSON escapes: the client decodes, then redacts, so no reply, raw body, error line
 * or cache entry holds a secret once read as JSON, and a second run from the cache brings none back. */
static void test_escaped_echo_redacted_after_decoding(void) {
    setenv("KVB_TEST_JUDGE_KEY2", SLASH_KEY, 1);
    char cache[128], url[128], err[256];
    snprintf(cache, sizeof cache, "%s/escaped-cache", tmpdir);
    snprintf(url, sizeof url, "http://kvbuser:%s@127.0.0.1:%d/v1", PCT_PW_URL, fault_port);
    for (int with_key = 0; with_key < 2; with_key++) {
        for (int from_cache = 0; from_cache < 2; from_cache++) {
            enum { N = 3 };
            kvb_judge_req r[N];
            memset(r, 0, sizeof r);
            const char *cases[N] = {"case=escapedecho", "case=escaped500", "case=escapedtext"};
            for (int i = 0; i < N; i++) {
                char q[64];
                snprintf(q, sizeof q, "%s %s", cases[i], with_key ? "k" : "u");
                r[i].messages_json = kvb_judge_user_message(q);
            }
            kvb_judge_cfg c;
            char u2[128];
            cfg_fault(&c, u2, sizeof u2);
            c.base_url = url;
            c.api_key_env = with_key ? "KVB_TEST_JUDGE_KEY2" : NULL;
            c.cache_dir = cache;
            c.max_retries = 0;
            CU_ASSERT_FATAL(kvb_judge_run(&c, r, N, err, sizeof err) == 0);
            CU_ASSERT(r[0].ok && r[0].from_cache == from_cache && r[0].n_replies == 1);
            CU_ASSERT(r[0].n_replies == 1 && strstr(r[0].replies[0], "[REDACTED]"));
            if (!from_cache) CU_ASSERT(!r[1].ok && strstr(r[1].error, "[REDACTED]") && !strchr(r[1].error, '\n'));
            if (!from_cache) CU_ASSERT(!r[2].ok && strstr(r[2].error, "[REDACTED]") && !strchr(r[2].error, '\n'));
            for (int i = 0; i < N; i++) {
                CU_ASSERT(!leaks_escaped_secret(r[i].error) && !leaks_escaped_secret(r[i].raw));
                for (int k = 0; k < r[i].n_replies; k++) CU_ASSERT(!leaks_escaped_secret(r[i].replies[k]));
                if (leaks_escaped_secret(r[i].error) || leaks_escaped_secret(r[i].raw) ||
                    (r[i].n_replies && leaks_escaped_secret(r[i].replies[0])))
                    fprintf(stderr, "\n  %s (%s): a secret came back: %s | %.200s\n", cases[i], with_key ? "key" : "userinfo",
                            r[i].error, r[i].n_replies ? r[i].replies[0] : "");
                kvb_judge_req_clear(&r[i]);
                free(r[i].messages_json);
            }
        }
    }
    CU_ASSERT(!dir_contains(cache, "SECRET") && !dir_contains(cache, PCT_B64) && !dir_contains(cache, "kvbuser"));
    CU_ASSERT(!dir_contains(cache, "\\u0053") && !dir_contains(cache, "\\/")); /* no escaped spelling either */
}

/* A base URL whose scheme is not http or https (file:// reads a local file through libcurl, ftp:// and the
 * rest reach other servers) is refused before anything is sent, with a one-line error naming the scheme;
 * a redirect to a file is not followed. */
static void test_only_http_and_https_judge_urls(void) {
    char path[160], url[256], err[256];
    snprintf(path, sizeof path, "%s/not-a-judge.json", tmpdir);
    FILE *f = fopen(path, "w");
    CU_ASSERT_FATAL(f != NULL);
    fputs("{\"choices\":[{\"message\":{\"role\":\"assistant\",\"content\":\"LOCAL-FILE-CONTENT\"}}]}", f);
    fclose(f);
    static const struct { const char *fmt, *named; } bad[] = {
        {"file://%s?", "'file'"}, {"FILE://%s?", "'FILE'"}, {"ftp://127.0.0.1/%s", "'ftp'"},
        {"gopher://127.0.0.1/%s", "'gopher'"}, {"127.0.0.1:8080%s", "no scheme"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        kvb_judge_req r = {0};
        r.messages_json = kvb_judge_user_message("case=ok");
        kvb_judge_cfg c;
        char u2[128];
        cfg_fault(&c, u2, sizeof u2);
        snprintf(url, sizeof url, bad[i].fmt, path);
        c.base_url = url;
        err[0] = 0;
        CU_ASSERT(kvb_judge_run(&c, &r, 1, err, sizeof err) == -1);
        CU_ASSERT(strstr(err, bad[i].named) && !strchr(err, '\n'));
        CU_ASSERT(!r.ok && r.attempts == 0);
        CU_ASSERT(!strstr(r.error, "LOCAL-FILE") && !(r.n_replies && strstr(r.replies[0], "LOCAL-FILE")));
        if (!strstr(err, bad[i].named)) fprintf(stderr, "\n  %s: rc/err '%s' (reply %s, error %s)\n", url, err,
                                                 r.n_replies ? r.replies[0] : "-", r.error);
        kvb_judge_req_clear(&r);
        free(r.messages_json);
    }
    /* http in any case is fine; a 302 to a file:// URL is an HTTP error, not a read of the file */
    kvb_judge_req r[2];
    memset(r, 0, sizeof r);
    r[0].messages_json = kvb_judge_user_message("case=ok");
    r[1].messages_json = kvb_judge_user_message("case=redirect");
    kvb_judge_cfg c;
    char u2[128];
    cfg_fault(&c, u2, sizeof u2);
    snprintf(url, sizeof url, "HTTP://127.0.0.1:%d/v1", fault_port);
    c.base_url = url;
    CU_ASSERT_FATAL(kvb_judge_run(&c, r, 2, err, sizeof err) == 0);
    CU_ASSERT(r[0].ok);
    CU_ASSERT(!r[1].ok && r[1].http_status == 302 && !strstr(r[1].error, "LOCAL-FILE"));
    for (int i = 0; i < 2; i++) {
        kvb_judge_req_clear(&r[i]);
        free(r[i].messages_json);
    }
}

static long maxrss_kib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

/* A judge streaming 50 MB (chunked, or with its Content-Length) fails its request with a one-line error naming
 * the cap, at once (no retry), and the client's memory grows by far less than the reply (each case in a
 * fresh child, so its peak RSS is its own). */
static int huge_declared;

static int huge_reply_child(void) {
    kvb_judge_req r = {0};
    r.messages_json = kvb_judge_user_message(huge_declared ? "case=hugelength" : "case=huge");
    kvb_judge_cfg c;
    char url[128], err[256], cap[64];
    cfg_fault(&c, url, sizeof url);
    c.timeout_s = 20;
    long rss0 = maxrss_kib();
    if (kvb_judge_run(&c, &r, 1, err, sizeof err)) return 1;
    long grown_kib = maxrss_kib() - rss0;
    snprintf(cap, sizeof cap, "larger than %d bytes", KVB_JUDGE_MAX_REPLY_BYTES);
    int bad = 0;
    if (r.ok || !strstr(r.error, cap) || r.attempts != 1) bad |= 2;
    if (grown_kib > 16 * 1024) bad |= 4;
    if (bad) fprintf(stderr, "\n  %s 50 MB reply: error '%s', %d attempts, max RSS grew %ld KiB\n", huge_declared ? "declared" : "chunked",
                     r.error, r.attempts, grown_kib);
    kvb_judge_req_clear(&r);
    free(r.messages_json);
    return bad;
}

static void test_reply_over_the_size_cap_is_not_stored(void) {
    for (huge_declared = 0; huge_declared < 2; huge_declared++) CU_ASSERT(bounded(huge_reply_child, 60) == 0);
}

/* 140,000 choices: read in one pass (cJSON_GetArrayItem(i) per choice took quadratic time), and no more of
 * them than the n asked for. */
static int many_choices_child(void) {
    int bad = 0;
    for (int k = 0; k < 2; k++) {
        kvb_judge_req r = {0};
        r.messages_json = kvb_judge_user_message("case=manychoices");
        kvb_judge_cfg c;
        char url[128], err[256];
        cfg_fault(&c, url, sizeof url);
        c.timeout_s = 20;
        c.n = k == 0 ? 1 : 1000000;
        double t0 = mono_s();
        if (kvb_judge_run(&c, &r, 1, err, sizeof err)) return 1;
        double secs = mono_s() - t0;
        if (!r.ok || r.n_replies != (k == 0 ? 1 : MANY_CHOICES)) bad |= 2;
        if (secs > 3) bad |= 4;
        if (bad) fprintf(stderr, "\n  %d choices, n %d: ok %d, %d replies, %.2f s (%s)\n", MANY_CHOICES, c.n, r.ok, r.n_replies, secs, r.error);
        kvb_judge_req_clear(&r);
        free(r.messages_json);
    }
    return bad;
}

static void test_many_choices_are_read_in_linear_time(void) {
    CU_ASSERT(bounded(many_choices_child, 30) == 0);
}

static void test_cache_and_the_key_never_written(void) {
    setenv("KVB_TEST_JUDGE_KEY", KEY, 1);
    char cache[128];
    snprintf(cache, sizeof cache, "%s/judge-cache", tmpdir);
    enum { N = 3 };
    kvb_judge_req r[N];
    memset(r, 0, sizeof r);
    const char *q[N] = {"q1", "q2", "q3"};
    for (int i = 0; i < N; i++) r[i].messages_json = kvb_judge_user_message(q[i]);
    kvb_judge_cfg c;
    char url[128], err[256];
    cfg_fault(&c, url, sizeof url);
    c.api_key_env = "KVB_TEST_JUDGE_KEY";
    c.cache_dir = cache;
    int before = hits_total, auth_before = auth_ok;
    CU_ASSERT_FATAL(kvb_judge_run(&c, r, N, err, sizeof err) == 0);
    CU_ASSERT(hits_total - before == N && auth_ok - auth_before == N); /* the key was sent */
    for (int i = 0; i < N; i++) CU_ASSERT(r[i].ok && !r[i].from_cache);
    CU_ASSERT_FATAL(kvb_judge_run(&c, r, N, err, sizeof err) == 0);
    CU_ASSERT(hits_total - before == N); /* all from the cache */
    for (int i = 0; i < N; i++) CU_ASSERT(r[i].ok && r[i].from_cache && !strcmp(r[i].replies[0], "yes"));
    c.refresh = 1;
    CU_ASSERT_FATAL(kvb_judge_run(&c, r, N, err, sizeof err) == 0);
    CU_ASSERT(hits_total - before == 2 * N);
    CU_ASSERT(!dir_contains(cache, KEY));
    CU_ASSERT(!dir_contains(cache, "SECRET"));
    CU_ASSERT(dir_contains(cache, "q2")); /* the request itself is auditable */
    for (int i = 0; i < N; i++) {
        kvb_judge_req_clear(&r[i]);
        free(r[i].messages_json);
    }
}

/* ---- a judged suite run: verdicts and judge errors in the records, the key in no file ---- */

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CU_ASSERT_FATAL(f != NULL);
    fputs(text, f);
    fclose(f);
}

/* The last record of (method, sample_id) in results.jsonl (the one that counts: a judged cell's generation
 * record is followed by its complete one), parsed (caller frees), or NULL. */
static cJSON *record_of(const char *results, const char *method, const char *id) {
    char *all = util_read_file(results, NULL);
    cJSON *found = NULL;
    for (char *save, *line = all ? strtok_r(all, "\n", &save) : NULL; line; line = strtok_r(NULL, "\n", &save)) {
        cJSON *r = cJSON_Parse(line);
        if (r && !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(r, "method")), method) &&
            !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(r, "sample_id")), id))
            cJSON_Delete(found), found = r;
        else
            cJSON_Delete(r);
    }
    free(all);
    return found;
}

static const char *judge_str(const cJSON *r, const char *key) {
    return cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(r, "judge"), key));
}

/* The judged suite runs need kvbench (KVB_BIN, set by ctest) and the default model: without them they fail. */
static const char *need_bin_and_model(void) {
    char model[1024];
    util_default_model(model, sizeof model);
    UTIL_REQUIRE_FILE(model);
    const char *bin = getenv("KVB_BIN");
    if (!bin) CU_FAIL_FATAL("KVB_BIN is not set (ctest sets it to the kvbench binary)");
    return bin;
}

static void test_judged_run_records_verdicts(void) {
    const char *bin = need_bin_and_model();
    char p[6][256];
    const char *names[6] = {"lme.json", "sg.json", "tmpl.json", "suite.json", "run", "cache"};
    for (int i = 0; i < 6; i++) snprintf(p[i], sizeof p[i], "%s/%s", tmpdir, names[i]);
    /* LongMemEval-shaped data: an ordinary question and an abstention one, whose template makes the judge fail */
    write_text(p[0],
               "[{\"question_id\": \"q1\", \"question_type\": \"single-session-user\", \"question\": \"What colour is my car?\","
               " \"answer\": \"red\", \"question_date\": \"2023/05/30 (Tue) 10:00\", \"haystack_dates\": [\"2023/05/20 (Sat) 09:00\"],"
               " \"haystack_session_ids\": [\"s1\"], \"haystack_sessions\": [[{\"role\": \"user\", \"content\": \"I bought a red car.\"},"
               " {\"role\": \"assistant\", \"content\": \"Congratulations on the red car!\"}]], \"answer_session_ids\": [\"s1\"]},"
               " {\"question_id\": \"q2_abs\", \"question_type\": \"single-session-user\", \"question\": \"What colour is my boat?\","
               " \"answer\": \"You did not mention a boat.\", \"question_date\": \"2023/05/30 (Tue) 10:00\", \"haystack_dates\": [\"2023/05/20 (Sat) 09:00\"],"
               " \"haystack_session_ids\": [\"s1\"], \"haystack_sessions\": [[{\"role\": \"user\", \"content\": \"I bought a red car.\"},"
               " {\"role\": \"assistant\", \"content\": \"Nice!\"}]], \"answer_session_ids\": [\"s1\"]}]");
    /* dialogues: the quality judge answers a score for one (case=quality) and text without a score for the other */
    write_text(p[1],
               "[{\"id\": \"d1\", \"conversations\": [{\"from\": \"human\", \"value\": \"Hi, I am planning a trip.\"},"
               " {\"from\": \"gpt\", \"value\": \"Where to?\"}, {\"from\": \"human\", \"value\": \"Rome. case=quality What should I see?\"},"
               " {\"from\": \"gpt\", \"value\": \"The Colosseum.\"}]},"
               " {\"id\": \"d2\", \"conversations\": [{\"from\": \"human\", \"value\": \"Name a fruit.\"}, {\"from\": \"gpt\", \"value\": \"Apple.\"},"
               " {\"from\": \"human\", \"value\": \"Another one?\"}, {\"from\": \"gpt\", \"value\": \"Pear.\"}]}]");
    const char *t = "Question: {}\\nCorrect Answer: {}\\nModel Response: {}\\nIs the model response correct? Answer yes or no only.";
    char tm[2048];
    snprintf(tm, sizeof tm, "{\"default\": \"%s\", \"temporal-reasoning\": \"%s\", \"knowledge-update\": \"%s\", "
             "\"single-session-preference\": \"%s\", \"abstention\": \"case=always500 %s\"}", t, t, t, t, t);
    write_text(p[2], tm);
    char suite[4096];
    snprintf(suite, sizeof suite,
             "{\"name\": \"judged\", \"model\": \"default\", \"output\": \"%s\", \"methods\": [{\"name\": \"full\"}, "
             "{\"name\": \"streamingllm\"}], \"budgets\": [\"50%%\"],"
             " \"judge\": {\"model\": \"fault-judge\", \"timeout_s\": 5, \"max_retries\": 1, \"cache_dir\": \"%s\", \"templates\": \"%s\"},"
             " \"benchmarks\": [{\"type\": \"longmemeval\", \"path\": \"%s\", \"max_new_tokens\": 8},"
             " {\"type\": \"sharegpt\", \"path\": \"%s\", \"max_new_tokens\": 8}]}",
             p[4], p[5], p[2], p[0], p[1]);
    write_text(p[3], suite);
    pthread_mutex_lock(&mu);
    int auth_before = auth_ok;
    pthread_mutex_unlock(&mu);
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "KVB_TEST_JUDGE_KEY='%s' '%s' run '%s' --quiet --threads 2 --judge-url http://kvbuser:" URL_PW "@127.0.0.1:%d/v1 "
             "--judge-key-env KVB_TEST_JUDGE_KEY > %s/run.log 2>&1",
             KEY, bin, p[3], fault_port, tmpdir);
    int rc = system(cmd);
    CU_ASSERT_FATAL(WIFEXITED(rc) && WEXITSTATUS(rc) == 0); /* judge errors do not stop the run */
    char results[300];
    snprintf(results, sizeof results, "%s/results.jsonl", p[4]);
    const char *methods[2] = {"full", "streamingllm"};
    for (int m = 0; m < 2; m++) {
        cJSON *ok = record_of(results, methods[m], "q1"), *abs = record_of(results, methods[m], "q2_abs"),
              *good = record_of(results, methods[m], "d1"), *bad = record_of(results, methods[m], "d2");
        CU_ASSERT_FATAL(ok && abs && good && bad);
        /* verdict "yes" -> 1, stored with the judge model, the raw reply and the parsed value */
        CU_ASSERT(cJSON_GetNumberValue(cJSON_GetObjectItem(ok, "score")) == 1.0);
        CU_ASSERT_STRING_EQUAL(judge_str(ok, "model"), "fault-judge");
        CU_ASSERT_STRING_EQUAL(cJSON_GetStringValue(cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(ok, "judge"), "replies"), 0)), "yes");
        CU_ASSERT(cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetObjectItem(ok, "judge"), "parsed")) == 1.0);
        /* a judge that keeps failing: a judge error, the score left empty (not 0) */
        CU_ASSERT(cJSON_IsNull(cJSON_GetObjectItem(abs, "score")));
        CU_ASSERT(judge_str(abs, "error") && strstr(judge_str(abs, "error"), "500"));
        /* quality: overall 7 of 10; a reply without a score is a judge error */
        CU_ASSERT_DOUBLE_EQUAL(cJSON_GetNumberValue(cJSON_GetObjectItem(good, "score")), 0.7, 1e-12);
        CU_ASSERT(cJSON_IsNull(cJSON_GetObjectItem(bad, "score")) && judge_str(bad, "error") != NULL);
        cJSON_Delete(ok), cJSON_Delete(abs), cJSON_Delete(good), cJSON_Delete(bad);
    }
    /* the report counts the judge errors: 2 per method (q2_abs, d2) */
    char path[300];
    snprintf(path, sizeof path, "%s/summary.csv", p[4]);
    char *csv = util_read_file(path, NULL);
    CU_ASSERT_FATAL(csv != NULL);
    int errs = 0;
    for (char *save, *line = strtok_r(csv, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        int field = 0;
        for (char *q = line; *q && field < 9; q++) field += *q == ',';
        if (field == 9 && strncmp(line, "method,", 7)) {
            char *q = line;
            for (int k = 0; k < 9; k++) q = strchr(q, ',') + 1;
            errs += atoi(q);
        }
    }
    free(csv);
    CU_ASSERT(errs == 4);
    /* the key went out in the Authorization header, and into no file of the run or the judge cache */
    pthread_mutex_lock(&mu);
    CU_ASSERT(auth_ok > auth_before);
    pthread_mutex_unlock(&mu);
    CU_ASSERT(!dir_contains(p[4], KEY) && !dir_contains(p[5], KEY) && !dir_contains(tmpdir, KEY));
    /* the judge echoed the key into an error body (case=always500): redacted; the URL's userinfo is in no
     * file (run.json, records, report, cache, the run's stderr) */
    cJSON *abs = record_of(results, "full", "q2_abs");
    CU_ASSERT(abs && judge_str(abs, "error") && strstr(judge_str(abs, "error"), "[REDACTED]"));
    CU_ASSERT(abs && judge_str(abs, "base_url") && !strstr(judge_str(abs, "base_url"), "kvbuser"));
    cJSON_Delete(abs);
    CU_ASSERT(!dir_contains(p[4], URL_PW) && !dir_contains(p[5], URL_PW) && !dir_contains(tmpdir, URL_PW));
    CU_ASSERT(!dir_contains(p[4], "kvbuser") && !dir_contains(p[5], "kvbuser"));
    /* a second run is free: every cell is recorded, the judge is not asked again */
    pthread_mutex_lock(&mu);
    int hits = hits_total;
    pthread_mutex_unlock(&mu);
    rc = system(cmd);
    CU_ASSERT(WIFEXITED(rc) && WEXITSTATUS(rc) == 0);
    pthread_mutex_lock(&mu);
    CU_ASSERT(hits_total == hits);
    pthread_mutex_unlock(&mu);
}

static int count_lines_with(const char *path, const char *needle) {
    char *all = util_read_file(path, NULL);
    int n = 0;
    for (char *save, *line = all ? strtok_r(all, "\n", &save) : NULL; line; line = strtok_r(NULL, "\n", &save))
        n += !needle || strstr(line, needle) != NULL;
    free(all);
    return n;
}

/* A judge that stalls (429, Retry-After 50 s) does not hold the predictions hostage: each generation's
 * record is on disk before its verdict (judge.pending); a run killed then resumes by judging the stored
 * predictions, without generating again, and the report counts each cell once. */
static void test_stalled_judge_loses_no_generation(void) {
    const char *bin = need_bin_and_model();
    char data[256], suite[256], out[256], results[300], cache[256];
    snprintf(data, sizeof data, "%s/stall.json", tmpdir);
    snprintf(suite, sizeof suite, "%s/stall-suite.json", tmpdir);
    snprintf(out, sizeof out, "%s/stall-run", tmpdir);
    snprintf(cache, sizeof cache, "%s/stall-cache", tmpdir);
    snprintf(results, sizeof results, "%s/results.jsonl", out);
    write_text(data, "[{\"id\": \"s1\", \"conversations\": [{\"from\": \"human\", \"value\": \"Hi. case=stall case=quality\"},"
                     " {\"from\": \"gpt\", \"value\": \"Hello!\"}, {\"from\": \"human\", \"value\": \"Name a colour.\"},"
                     " {\"from\": \"gpt\", \"value\": \"Blue.\"}]}]");
    char text[2048];
    snprintf(text, sizeof text,
             "{\"name\": \"stall\", \"model\": \"default\", \"output\": \"%s\", \"methods\": [{\"name\": \"full\"}, "
             "{\"name\": \"streamingllm\"}], \"budgets\": [\"50%%\"], \"judge\": {\"model\": \"fault-judge\", \"cache_dir\": \"%s\", "
             "\"max_retries\": 1}, \"benchmarks\": [{\"type\": \"sharegpt\", \"path\": \"%s\", \"max_new_tokens\": 4}]}",
             out, cache, data);
    write_text(suite, text);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1", fault_port);
    stall_judge = 1;
    pid_t pid = fork();
    CU_ASSERT_FATAL(pid >= 0);
    if (pid == 0) {
        int fd = open("/dev/null", 1);
        dup2(fd, 1), dup2(fd, 2);
        execl(bin, bin, "run", suite, "--quiet", "--threads", "2", "--judge-url", url, (char *)NULL);
        _exit(127);
    }
    double t0 = mono_s();
    while (count_lines_with(results, "\"pending\":true") < 2 && mono_s() - t0 < 45) usleep(100000);
    int pending = count_lines_with(results, "\"pending\":true");
    kill(pid, SIGKILL); /* while the judge makes it wait */
    int st;
    waitpid(pid, &st, 0);
    CU_ASSERT(pending == 2);
    CU_ASSERT(count_lines_with(results, NULL) == 2); /* no verdict yet */
    cJSON *gen = record_of(results, "streamingllm", "s1");
    CU_ASSERT_FATAL(gen != NULL);
    CU_ASSERT(cJSON_IsNull(cJSON_GetObjectItem(gen, "score")));
    /* the judge is back: the resume judges the stored predictions */
    stall_judge = 0;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' run '%s' --quiet --threads 2 --judge-url %s > %s/stall.log 2>&1", bin, suite, url, tmpdir);
    int rc = system(cmd);
    CU_ASSERT(WIFEXITED(rc) && WEXITSTATUS(rc) == 0);
    CU_ASSERT(count_lines_with(results, NULL) == 4);
    cJSON *fin = record_of(results, "streamingllm", "s1");
    CU_ASSERT_FATAL(fin != NULL);
    CU_ASSERT_DOUBLE_EQUAL(cJSON_GetNumberValue(cJSON_GetObjectItem(fin, "score")), 0.7, 1e-12);
    /* the same generation, not a new one: its timings are the stored ones */
    CU_ASSERT_STRING_EQUAL(cJSON_GetStringValue(cJSON_GetObjectItem(fin, "prediction")),
                           cJSON_GetStringValue(cJSON_GetObjectItem(gen, "prediction")));
    CU_ASSERT(cJSON_GetNumberValue(cJSON_GetObjectItem(fin, "ttft_ms")) == cJSON_GetNumberValue(cJSON_GetObjectItem(gen, "ttft_ms")));
    cJSON_Delete(gen), cJSON_Delete(fin);
    char report[300];
    snprintf(report, sizeof report, "%s/report.md", out);
    char *md = util_read_file(report, NULL);
    CU_ASSERT(md && !strstr(md, "duplicate"));
    free(md);
}

static void test_prompts_and_parsers(void) {
    const char *args[3] = {"A", "B{x}", "C"};
    char *s = kvb_format_positional("q={} a={} r={} {{lit}}", args, 3);
    CU_ASSERT_STRING_EQUAL(s, "q=A a=B{x} r=C {lit}");
    free(s);
    CU_ASSERT(kvb_lme_verdict("Yes.") == 1 && kvb_lme_verdict("no") == 0 && kvb_lme_verdict("YES") == 1);
    double v;
    CU_ASSERT(kvb_quality_parse("{'factual accuracy': 9, 'overall score': 7}}", &v) == 0 && v == 7);
    CU_ASSERT(kvb_quality_parse("{\"Overall Score\" : 8.5}", &v) == 0 && v == 8.5);
    CU_ASSERT(kvb_quality_parse("overall score: eleven", &v) == -1);
    CU_ASSERT(kvb_quality_parse("{'overall score': 42}", &v) == -1);
    CU_ASSERT(kvb_rubric_parse("Score: 9", &v) == 0 && v == 9);
    /* strtod reads "nan": no comparison fails on NaN, so the range check must be written to refuse it (found by
     * fuzz_judge_reply; its input is in tests/fuzz/corpus/judge_reply) */
    CU_ASSERT(kvb_rubric_parse("Score: =nan", &v) == -1);
    CU_ASSERT(kvb_quality_parse("{'overall score': NaN}", &v) == -1);
    CU_ASSERT(kvb_rubric_parse("Score: inf", &v) == -1);
}

int main(void) {
    if (!mkdtemp(tmpdir)) return 1;
    signal(SIGPIPE, SIG_IGN);
    const char *one = "{\"message\":{\"content\":\"y\"}},"; /* 26 bytes */
    size_t one_n = strlen(one);
    many_choices_reply = malloc(16 + MANY_CHOICES * one_n);
    if (!many_choices_reply) return 1;
    char *w = many_choices_reply + sprintf(many_choices_reply, "{\"choices\":[");
    for (int i = 0; i < MANY_CHOICES; i++, w += one_n) memcpy(w, one, one_n);
    strcpy(w - 1, "]}");
    curl_global_init(CURL_GLOBAL_DEFAULT);
    fault = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL, on_fault, NULL,
                             MHD_OPTION_NOTIFY_COMPLETED, on_fault_done, NULL, MHD_OPTION_END);
    if (!fault) return 1;
    fault_port = MHD_get_daemon_info(fault, MHD_DAEMON_INFO_BIND_PORT)->port;
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("judge", NULL, NULL);
    CU_add_test(s, "prompts and parsers", test_prompts_and_parsers);
    CU_add_test(s, "fault cases end as documented", test_fault_cases_end_as_documented);
    CU_add_test(s, "circuit breaker stops sending", test_circuit_breaker_stops_sending);
    CU_add_test(s, "cache; the key is never written", test_cache_and_the_key_never_written);
    CU_add_test(s, "Retry-After is capped; a batch has a deadline", test_retry_after_capped_and_batch_deadline);
    CU_add_test(s, "identical prompts in a batch are sent once", test_identical_prompts_sent_once);
    CU_add_test(s, "echoed key and URL userinfo are redacted", test_echoed_secrets_redacted);
    CU_add_test(s, "an escaped echo of a secret is redacted after decoding", test_escaped_echo_redacted_after_decoding);
    CU_add_test(s, "only http and https judge URLs", test_only_http_and_https_judge_urls);
    CU_add_test(s, "a reply over the size cap is not stored", test_reply_over_the_size_cap_is_not_stored);
    CU_add_test(s, "many choices are read in linear time", test_many_choices_are_read_in_linear_time);
    CU_add_test(s, "a judged run records verdicts and judge errors", test_judged_run_records_verdicts);
    CU_add_test(s, "a stalled judge loses no generation", test_stalled_judge_loses_no_generation);
    int rc = util_run_suites();
    MHD_stop_daemon(fault);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (getenv("KVB_KEEP_TMP")) fprintf(stderr, "kept %s\n", tmpdir);
    else if (system(cmd)) rc = 1;
    curl_global_cleanup();
    free(many_choices_reply);
    return rc;
}
