/* test_serve.c — `kvbench serve` with the default model over loopback: the judge client against it, bad input
 * answered with the right status (fractional counts, NUL in content, an OmniKV budget below its full layers'
 * share, ...) while the server stays up, and idle clients that cannot lock others out. */
#include <CUnit/Basic.h>
#include <arpa/inet.h>
#include <curl/curl.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "util_common.h"
#include "judge/client.h"
#include "judge/judges.h"

static char tmpdir[64] = "/tmp/kvb_serve_XXXXXX";

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- against kvbench serve ---- */

static pid_t serve_pid;
static int serve_port;

static int start_serve(const char *extra) {
    const char *bin = getenv("KVB_BIN");
    if (!bin) return -1;
    int fds[2];
    if (pipe(fds)) return -1;
    serve_pid = fork();
    if (serve_pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "exec '%s' serve --port 0 --threads 2 --max-queue 2 --max-body 4096 %s", bin, extra);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    FILE *f = fdopen(fds[0], "r");
    char line[256] = "";
    if (!fgets(line, sizeof line, f)) return -1;
    fclose(f);
    char *p = strstr(line, "127.0.0.1:");
    serve_port = p ? atoi(p + 10) : 0;
    return serve_port > 0 ? 0 : -1;
}

static void stop_serve(void) {
    if (serve_pid > 0) {
        kill(serve_pid, SIGTERM);
        int st;
        waitpid(serve_pid, &st, 0);
        CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0); /* a clean stop, no crash */
    }
    serve_pid = 0;
}

static void test_client_against_kvbench_serve(void) {
    CU_ASSERT_FATAL(start_serve("") == 0);
    /* a LongMemEval-shaped judgement: template file as the dataset fetch writes it */
    char tpath[128], err[256];
    snprintf(tpath, sizeof tpath, "%s/judge_templates.json", tmpdir);
    FILE *f = fopen(tpath, "w");
    const char *t = "Question: {}\\n\\nCorrect Answer: {}\\n\\nModel Response: {}\\n\\nIs the model response correct? Answer yes or no only.";
    fprintf(f, "{\"default\": \"%s\", \"temporal-reasoning\": \"%s\", \"knowledge-update\": \"%s\", "
               "\"single-session-preference\": \"%s\", \"abstention\": \"%s\"}", t, t, t, t, t);
    fclose(f);
    kvb_lme_templates *tm = kvb_lme_templates_load(tpath, err, sizeof err);
    CU_ASSERT_FATAL(tm != NULL);
    char *prompt = kvb_lme_prompt(tm, "single-session-user", 0, "What colour is my car?", "red", "Your car is red.", err, sizeof err);
    CU_ASSERT_FATAL(prompt != NULL);
    CU_ASSERT(strstr(prompt, "Question: What colour is my car?\n\nCorrect Answer: red") != NULL);
    kvb_judge_req r[3];
    memset(r, 0, sizeof r);
    for (int i = 0; i < 3; i++) r[i].messages_json = kvb_judge_user_message(prompt);
    kvb_judge_cfg c;
    kvb_judge_cfg_defaults(&c);
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1", serve_port);
    c.base_url = url;
    c.model = "default";
    c.timeout_s = 120;
    c.concurrency = 3;
    CU_ASSERT_FATAL(kvb_judge_run(&c, r, 3, err, sizeof err) == 0);
    for (int i = 0; i < 3; i++) {
        CU_ASSERT(r[i].ok && r[i].http_status == 200 && r[i].n_replies == 1);
        if (!r[i].ok) fprintf(stderr, "\n  judge request %d: %s\n", i, r[i].error);
        if (r[i].ok && r[0].ok) CU_ASSERT(kvb_lme_verdict(r[i].replies[0]) == kvb_lme_verdict(r[0].replies[0])); /* greedy */
        kvb_judge_req_clear(&r[i]);
        free(r[i].messages_json);
    }
    free(prompt);
    kvb_lme_templates_free(tm);
    stop_serve();
}

typedef struct { char body[8192]; long status; } http_res;

static size_t sink(char *p, size_t s, size_t n, void *u) {
    http_res *h = u;
    size_t have = strlen(h->body), k = s * n;
    if (have + k < sizeof h->body) memcpy(h->body + have, p, k), h->body[have + k] = 0;
    return s * n;
}

static long post(const char *path, const char *body, http_res *out) {
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", serve_port, path);
    CURL *e = curl_easy_init();
    memset(out, 0, sizeof *out);
    curl_easy_setopt(e, CURLOPT_URL, url);
    if (body) curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, sink);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, out);
    curl_easy_setopt(e, CURLOPT_TIMEOUT, 120L);
    CURLcode cc = curl_easy_perform(e);
    if (cc == CURLE_OK) curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &out->status);
    curl_easy_cleanup(e);
    return out->status;
}

static void *client_thread(void *arg) {
    http_res *h = arg;
    post("/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"Name a colour.\"}],\"max_tokens\":8}", h);
    return NULL;
}

static void test_serve_bad_input(void) {
    CU_ASSERT_FATAL(start_serve("") == 0);
    http_res *h = malloc(sizeof *h);
    char big[6000];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = 0;
    CU_ASSERT(post("/v1/chat/completions", big, h) == 413);
    CU_ASSERT(post("/v1/chat/completions", "{\"messages\": [", h) == 400 && strstr(h->body, "\"error\""));
    CU_ASSERT(post("/v1/chat/completions", "{\"model\":\"gpt-9\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", h) == 404);
    CU_ASSERT(post("/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":-5}", h) == 400);
    CU_ASSERT(strstr(h->body, "max_tokens") != NULL);
    CU_ASSERT(post("/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"kvbench\":{\"method\":\"nope\"}}", h) == 400);
    CU_ASSERT(post("/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"kvbench\":{\"method\":\"snapkv\",\"budget\":\"200%\"}}", h) == 400);
    CU_ASSERT(post("/v1/nothing", NULL, h) == 404);
    /* fractional counts, a NUL inside the content and an OmniKV budget below its full layers' share are the
     * client's errors (400 naming the field), not silently rounded, truncated or a server error */
    CU_ASSERT(post("/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":1.5}", h) == 400);
    CU_ASSERT(strstr(h->body, "'n'") != NULL);
    CU_ASSERT(post("/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":1.7}", h) == 400);
    CU_ASSERT(strstr(h->body, "max_tokens") != NULL);
    CU_ASSERT(post("/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"ab\\u0000cd\"}]}", h) == 400);
    CU_ASSERT(strstr(h->body, "NUL") != NULL);
    CU_ASSERT(post("/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\\\u0000 is fine\"}],\"max_tokens\":1}", h) == 200);
    CU_ASSERT(post("/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"kvbench\":{\"method\":\"omnikv\",\"budget\":\"2%\"}}", h) == 400);
    CU_ASSERT(strstr(h->body, "omnikv") && strstr(h->body, "budget"));
    /* a stream answers with server-sent events that end in [DONE] */
    CU_ASSERT(post("/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":4,\"stream\":true}", h) == 200);
    CU_ASSERT(strstr(h->body, "data: {") && strstr(h->body, "data: [DONE]"));
    /* many concurrent clients: each one gets 200 or 503 (queue of 2), none is dropped, the server stays up */
    enum { C = 12 };
    pthread_t th[C];
    http_res *res = calloc(C, sizeof *res);
    for (int i = 0; i < C; i++) pthread_create(&th[i], NULL, client_thread, &res[i]);
    int ok = 0, busy = 0;
    for (int i = 0; i < C; i++) {
        pthread_join(th[i], NULL);
        ok += res[i].status == 200;
        busy += res[i].status == 503;
    }
    CU_ASSERT(ok >= 1 && ok + busy == C);
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/models", serve_port);
    CURL *e = curl_easy_init();
    memset(h, 0, sizeof *h);
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, sink);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, h);
    CU_ASSERT(curl_easy_perform(e) == CURLE_OK);
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &h->status);
    curl_easy_cleanup(e);
    CU_ASSERT(h->status == 200 && strstr(h->body, "\"object\":\"list\""));
    free(res);
    free(h);
    stop_serve();
}

static long rss_kib(pid_t pid) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) kib = atol(line + 6);
    if (f) fclose(f);
    return kib;
}

/* An authenticated request (GET or POST body) with a time limit; its status, its wall time in *secs. */
static long timed_request(const char *path, const char *body, long limit_ms, double *secs) {
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", serve_port, path);
    http_res *h = calloc(1, sizeof *h);
    CURL *e = curl_easy_init();
    struct curl_slist *hd = curl_slist_append(NULL, "Authorization: Bearer serve-key-123");
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, hd);
    if (body) curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, sink);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, h);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, limit_ms);
    double t0 = mono_s();
    long status = 0;
    if (curl_easy_perform(e) == CURLE_OK) curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
    *secs = mono_s() - t0;
    curl_easy_cleanup(e);
    curl_slist_free_all(hd);
    free(h);
    return status;
}

/* How many of the sockets the server has closed (EOF or reset). */
static int count_closed(const int *fd, int n) {
    int closed = 0;
    for (int i = 0; i < n; i++) {
        char b[64];
        ssize_t r = recv(fd[i], b, sizeof b, MSG_DONTWAIT);
        closed += r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
    }
    return closed;
}

/* 100 idle clients (half a request line each, from another loopback address) do not lock out an
 * authenticated client: /v1/models and a chat completion answer within 2 s; at most --max-per-ip of the idle
 * connections are kept, and those are closed after --read-timeout; the server's memory stays bounded. */
static void test_serve_idle_connections_lock_nobody_out(void) {
    setenv("KVB_TEST_SERVE_KEY", "serve-key-123", 1);
    CU_ASSERT_FATAL(start_serve("--api-key-env KVB_TEST_SERVE_KEY --read-timeout 2 --max-per-ip 16") == 0);
    double secs;
    const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":2}";
    CU_ASSERT(timed_request("/v1/models", NULL, 2000, &secs) == 200);
    double t_chat0 = 0;
    CU_ASSERT(timed_request("/v1/chat/completions", chat, 30000, &secs) == 200); /* warm: weights paged in */
    CU_ASSERT(timed_request("/v1/chat/completions", chat, 30000, &t_chat0) == 200); /* the compute time, alone */
    long rss0 = rss_kib(serve_pid);
    enum { IDLE = 100 };
    int fd[IDLE], opened = 0;
    struct sockaddr_in from = {0}, to = {0};
    from.sin_family = to.sin_family = AF_INET;
    inet_pton(AF_INET, "127.0.0.2", &from.sin_addr);
    inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    to.sin_port = htons((uint16_t)serve_port);
    for (int i = 0; i < IDLE; i++) {
        fd[i] = socket(AF_INET, SOCK_STREAM, 0);
        if (fd[i] < 0 || bind(fd[i], (struct sockaddr *)&from, sizeof from) || connect(fd[i], (struct sockaddr *)&to, sizeof to)) {
            if (fd[i] >= 0) close(fd[i]);
            break;
        }
        const char *part = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"; /* and then nothing */
        if (send(fd[i], part, strlen(part), MSG_NOSIGNAL) < 0) {}
        opened++;
    }
    CU_ASSERT_FATAL(opened == IDLE);
    usleep(300000);
    int refused = count_closed(fd, IDLE);
    CU_ASSERT(refused >= IDLE - 16); /* the per-address cap */
    long rss1 = rss_kib(serve_pid);
    double t_models, t_chat;
    long s_models = timed_request("/v1/models", NULL, 2000, &t_models);
    long s_chat = timed_request("/v1/chat/completions", chat, 30000, &t_chat);
    CU_ASSERT(s_models == 200 && t_models < 2.0);
    /* the chat's own compute varies with the machine's load (seconds on 2 busy cores): the idle clients may
     * add at most 2 s to it */
    CU_ASSERT(s_chat == 200 && t_chat < t_chat0 + 2.0);
    usleep(3500000);                  /* past --read-timeout 2 */
    int closed = count_closed(fd, IDLE);
    CU_ASSERT(closed == IDLE);
    long rss2 = rss_kib(serve_pid);
    fprintf(stderr, "\n  serve with %d idle connections: /v1/models %.3f s, chat %.3f s (%.3f s alone); idle closed at once %d, after the "
                    "read timeout %d; RSS %ld KiB before, %ld KiB while held, %ld KiB after\n",
            IDLE, t_models, t_chat, t_chat0, refused, closed, rss0, rss1, rss2);
    CU_ASSERT(rss1 > 0 && rss1 - rss0 < 64 * 1024);
    for (int i = 0; i < IDLE; i++) close(fd[i]);
    stop_serve();
}

int main(void) {
    char model[1024];
    if (!getenv("KVB_BIN") || !util_default_model(model, sizeof model)) {
        fprintf(stderr, "needs KVB_BIN and the default model (scripts/fetch-model.sh)\n");
        return 1;
    }
    if (!mkdtemp(tmpdir)) return 1;
    signal(SIGPIPE, SIG_IGN);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("serve", NULL, NULL);
    CU_add_test(s, "client against kvbench serve", test_client_against_kvbench_serve);
    CU_add_test(s, "kvbench serve under bad input", test_serve_bad_input);
    CU_add_test(s, "idle connections lock nobody out of kvbench serve", test_serve_idle_connections_lock_nobody_out);
    int rc = util_run_suites();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd)) rc = 1;
    curl_global_cleanup();
    return rc;
}
