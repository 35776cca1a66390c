/* test_bench_serve_url.c — `kvbench bench-serve --url` (judge/loadgen.h) against a `kvbench serve --batching` started
 * in this process on a free port, on a tiny random-weight model with one token per byte: every request of two
 * methods completes, and the counts agree with the server's own (/v1/kvbench/stats, read here before and after):
 * completions, and output tokens = requests x max_new (ignore_eos). Failures are counted, never dropped, and the
 * run exits 1 with one line per cause: a method the server refuses (HTTP 400), a stream that is not SSE (a fake
 * server), a server that answers 500; an unreachable URL is one line and exit 1 before any request; a bearer token
 * or a URL password that a server echoes never reaches the output. */
#include <CUnit/Basic.h>
#include <arpa/inet.h>
#include <curl/curl.h>
#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "util_common.h"
#include "util_gguf_writer.h"
#include "judge/serve.h"

static char tmpdir[64] = "/tmp/kvb_bsurl_XXXXXX", model[128], out_path[160], err_path[160], csv_path[160],
            json_path[160];
static const char *bin;
static kvb_serve_opts sopts;
static volatile sig_atomic_t sstop;
static pthread_t sthread;
static sem_t sready;
static int sport, srunning;
static char serr[512];

static void on_ready(void *user, int port) {
    (void)user;
    sport = port;
    sem_post(&sready);
}

static void *serve_main(void *arg) {
    (void)arg;
    if (kvb_serve(&sopts, &sstop, NULL, on_ready, NULL, serr, sizeof serr)) sem_post(&sready);
    return NULL;
}

/* Run bench-serve with args against URL; its exit code; stdout and stderr in out_path and err_path. */
static int run(const char *url, const char *args) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s bench-serve --model %s --threads 1 --url %s %s >%s 2>%s", bin, model, url, args,
             out_path, err_path);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static int count(const char *text, const char *what) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, what)); p += strlen(what)) n++;
    return n;
}

typedef struct {
    char body[1 << 14];
    size_t n;
} sinkbuf;

static size_t sink(char *p, size_t s, size_t n, void *user) {
    sinkbuf *b = user;
    size_t k = s * n;
    if (b->n + k < sizeof b->body) memcpy(b->body + b->n, p, k), b->n += k, b->body[b->n] = 0;
    return k;
}

/* The server's counter `key` from GET /v1/kvbench/stats, read here independently of bench-serve; -1 on failure. */
static double server_stat(const char *key) {
    char url[96];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/kvbench/stats", sport);
    sinkbuf b = {{0}, 0};
    CURL *e = curl_easy_init();
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, sink);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(e, CURLOPT_TIMEOUT, 30L);
    double v = -1;
    if (curl_easy_perform(e) == CURLE_OK) {
        cJSON *j = cJSON_Parse(b.body);
        const cJSON *x = cJSON_GetObjectItem(j, key);
        if (cJSON_IsNumber(x)) v = x->valuedouble;
        cJSON_Delete(j);
    }
    curl_easy_cleanup(e);
    return v;
}

/* The JSON rows' field for a method (-1 when absent). */
static double row_field(const cJSON *rows, const char *method, const char *key) {
    const cJSON *r;
    cJSON_ArrayForEach(r, rows) {
        const cJSON *m = cJSON_GetObjectItem(r, "method"), *x = cJSON_GetObjectItem(r, key);
        if (cJSON_IsString(m) && !strcmp(m->valuestring, method) && cJSON_IsNumber(x)) return x->valuedouble;
    }
    return -1;
}

enum { REQS = 5, MAX_NEW = 4 };

static void test_every_request_completes_and_counts_agree_with_the_server(void) {
    char url[64], args[512];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", sport);
    const double fin0 = server_stat("finished"), steps0 = server_stat("steps");
    CU_ASSERT_FATAL(fin0 >= 0 && steps0 >= 0);
    snprintf(args, sizeof args, "--methods full,snapkv@50%% --clients 3 --requests %d --prompts 2 --prompt-len 160 "
                                "--max-new %d --csv %s --json %s", REQS, MAX_NEW, csv_path, json_path);
    int rc = run(url, args);
    char *o = util_read_file(out_path, NULL), *e = util_read_file(err_path, NULL), *c = util_read_file(csv_path, NULL),
         *js = util_read_file(json_path, NULL);
    if (rc) fprintf(stderr, "\n  bench-serve --url: %s", e ? e : "");
    CU_ASSERT_FATAL(rc == 0 && o && c && js);
    char want[64];
    snprintf(want, sizeof want, "| full | - | %d/%d | 0 | 0 |", REQS, REQS);
    CU_ASSERT(strstr(o, want) != NULL);
    snprintf(want, sizeof want, "| snapkv | 50%% | %d/%d | 0 | 0 |", REQS, REQS);
    CU_ASSERT(strstr(o, want) != NULL);
    CU_ASSERT(count(c, "\n") == 3);
    /* the server saw every completion, and counted them as bench-serve did */
    CU_ASSERT(server_stat("finished") - fin0 == 2 * REQS);
    CU_ASSERT(server_stat("steps") > steps0);
    cJSON *rows = cJSON_Parse(js);
    CU_ASSERT_FATAL(cJSON_IsArray(rows) && cJSON_GetArraySize(rows) == 2);
    CU_ASSERT(row_field(rows, "full", "server_ok") == REQS && row_field(rows, "snapkv", "server_ok") == REQS);
    CU_ASSERT(row_field(rows, "full", "ok") == REQS && row_field(rows, "full", "failed") == 0);
    /* ignore_eos: every request streams max_new tokens, as usage.completion_tokens says */
    CU_ASSERT(row_field(rows, "full", "output_tokens") == REQS * MAX_NEW);
    CU_ASSERT(row_field(rows, "snapkv", "output_tokens") == REQS * MAX_NEW);
    /* concurrency from the server: between 1 and the clients */
    const double ms = row_field(rows, "full", "mean_seqs");
    CU_ASSERT(ms >= 1 && ms <= 3);
    CU_ASSERT(row_field(rows, "full", "ttft_p50_ms") > 0 && row_field(rows, "full", "tpot_p99_ms") > 0);
    /* the pool from the server: what the running sequences held, measured, within what they were promised */
    const double held = row_field(rows, "full", "pool_held_mean_pct"), promised = row_field(rows, "full", "pool_promised_mean_pct");
    CU_ASSERT(held > 0 && held <= promised + 1e-9);
    CU_ASSERT(row_field(rows, "full", "overdrafts") == 0 && row_field(rows, "snapkv", "overdrafts") == 0);
    /* per running sequence (both means are weighted by decode-step time), SnapKV at 50% holds less than full */
    CU_ASSERT(row_field(rows, "snapkv", "pool_held_mean_pct") / row_field(rows, "snapkv", "mean_seqs") <
              0.8 * held / row_field(rows, "full", "mean_seqs"));
    cJSON_Delete(rows);
    free(o), free(e), free(c), free(js);
}

static void test_open_loop_completes_every_request(void) {
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/", sport);
    const double fin0 = server_stat("finished");
    CU_ASSERT_FATAL(run(url, "--methods streamingllm@50% --rate 40 --clients 4 --requests 4 --prompts 2 --prompt-len 120 "
                             "--max-new 3") == 0);
    char *o = util_read_file(out_path, NULL);
    CU_ASSERT(o && strstr(o, "open loop at 40 requests/s") && strstr(o, "| streamingllm | 50% | 4/4 | 0 | 0 |"));
    CU_ASSERT(server_stat("finished") - fin0 == 4);
    free(o);
}

/* --dataset sharegpt over HTTP: the dialogues as messages (the server templates them), each request's max_tokens its
 * recorded reply's length (bytes: one token each) capped by --max-new, as the server's completion tokens show; then
 * --duration: every request sent is counted by the client and the server alike. */
static void test_dataset_dialogues_and_duration_over_http(void) {
    static const char *const REPLY[2] = {"ab", "a reply of many bytes"};
    char path[200], url[64], args[768];
    snprintf(path, sizeof path, "%s/sg.json", tmpdir);
    FILE *f = fopen(path, "wb");
    CU_ASSERT_FATAL(f != NULL);
    fprintf(f, "[");
    for (int i = 0; i < 2; i++)
        fprintf(f, "%s{\"id\": \"c%d\", \"conversations\": [{\"from\": \"human\", \"value\": \"hello\"}, {\"from\": \"gpt\", "
                   "\"value\": \"hi there\"}, {\"from\": \"human\", \"value\": \"a question %d?\"}, {\"from\": \"gpt\", "
                   "\"value\": \"%s\"}]}", i ? ", " : "", i, i, REPLY[i]);
    fprintf(f, "]\n");
    fclose(f);
    snprintf(url, sizeof url, "http://127.0.0.1:%d", sport);
    const double fin0 = server_stat("finished");
    snprintf(args, sizeof args, "--dataset sharegpt:%s --methods full --clients 2 --requests 4 --max-new 5 --json %s", path,
             json_path);
    CU_ASSERT_FATAL(run(url, args) == 0);
    char *js = util_read_file(json_path, NULL);
    cJSON *rows = cJSON_Parse(js);
    CU_ASSERT(row_field(rows, "full", "ok") == 4 && row_field(rows, "full", "server_ok") == 4);
    CU_ASSERT(row_field(rows, "full", "output_tokens") == 2 * (2 + 5)); /* each record twice: 2, and 21 capped to 5 */
    CU_ASSERT(server_stat("finished") - fin0 == 4);
    cJSON_Delete(rows);
    free(js);
    snprintf(args, sizeof args, "--dataset niah:100 --prompts 2 --methods full --clients 2 --duration 1 --max-new 2 --json %s",
             json_path);
    const double fin1 = server_stat("finished");
    CU_ASSERT_FATAL(run(url, args) == 0);
    js = util_read_file(json_path, NULL);
    rows = cJSON_Parse(js);
    const double sent = row_field(rows, "full", "requests");
    CU_ASSERT(sent >= 2 && row_field(rows, "full", "ok") == sent && row_field(rows, "full", "lost") == 0);
    CU_ASSERT(server_stat("finished") - fin1 == sent && row_field(rows, "full", "wall_s") >= 1);
    cJSON_Delete(rows);
    free(js);
    unlink(path);
}

static void test_refused_requests_are_counted_failed_and_exit_1(void) {
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1", sport);
    const double failed0 = server_stat("failed"), fin0 = server_stat("finished");
    /* a token budget larger than the prompt: the server answers 400 to each request */
    CU_ASSERT(run(url, "--methods snapkv@100000 --clients 2 --requests 3 --prompts 1 --prompt-len 100 --max-new 2") == 1);
    char *o = util_read_file(out_path, NULL), *e = util_read_file(err_path, NULL);
    CU_ASSERT_FATAL(o && e);
    CU_ASSERT(strstr(o, "| snapkv | 100000 | 0/3 | 3 | 0 |") != NULL);
    CU_ASSERT(count(e, "\n") == 1 && strstr(e, "3 of 3 requests failed") && strstr(e, "HTTP 400"));
    /* the server refused them after admission (the budget is checked against the tokenized prompt): its failures */
    CU_ASSERT(server_stat("finished") == fin0 && server_stat("failed") - failed0 == 3);
    free(o), free(e);
}

static void test_unreachable_url_is_one_line_and_exit_1(void) {
    /* a port nothing listens on: bound, then closed */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    CU_ASSERT_FATAL(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
                    getsockname(fd, (struct sockaddr *)&a, &al) == 0);
    close(fd);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", ntohs(a.sin_port));
    CU_ASSERT(run(url, "--methods full --requests 2 --prompts 1 --prompt-len 100 --max-new 2") == 1);
    char *e = util_read_file(err_path, NULL);
    CU_ASSERT_FATAL(e != NULL);
    CU_ASSERT(count(e, "\n") == 1 && strncmp(e, "kvbench: ", 9) == 0 && strstr(e, "cannot reach"));
    free(e);
    CU_ASSERT(run("ftp://127.0.0.1:1", "--methods full --requests 1") == 1);
    e = util_read_file(err_path, NULL);
    CU_ASSERT(e && count(e, "\n") == 1 && strstr(e, "--url"));
    free(e);
    CU_ASSERT(run(url, "--kv-pool-mib 64 --requests 1") == 1); /* the pool is the server's */
    e = util_read_file(err_path, NULL);
    CU_ASSERT(e && count(e, "\n") == 1 && strstr(e, "--kv-pool-mib"));
    free(e);
}

/* ---- a fake server: /v1/models answers, /v1/chat/completions replies `fake_reply` with `fake_status` ---- */
static const char *fake_reply;
static unsigned fake_status;

static enum MHD_Result fake_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                    const char *version, const char *data, size_t *size, void **con) {
    (void)cls, (void)method, (void)version, (void)data;
    if (!*con) { /* headers in */
        *con = conn;
        return MHD_YES;
    }
    if (*size) { /* the body: not read */
        *size = 0;
        return MHD_YES;
    }
    const int models = !strcmp(url, "/v1/models");
    const char *body = models ? "{\"object\":\"list\",\"data\":[]}" : fake_reply;
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(r, "Content-Type", models ? "application/json" : "text/event-stream");
    enum MHD_Result rc = MHD_queue_response(conn, models ? 200 : fake_status, r);
    MHD_destroy_response(r);
    return rc;
}

/* bench-serve against the fake: exit 1, every request failed, one line on stderr holding `what`. */
static void check_fake(const char *reply, unsigned status, const char *what) {
    fake_reply = reply;
    fake_status = status;
    struct MHD_Daemon *d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION, 0, NULL, NULL,
                                            fake_request, NULL, MHD_OPTION_END);
    CU_ASSERT_FATAL(d != NULL);
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", info ? info->port : 0);
    CU_ASSERT(run(url, "--methods full --clients 2 --requests 3 --prompts 1 --prompt-len 100 --max-new 2") == 1);
    MHD_stop_daemon(d);
    char *o = util_read_file(out_path, NULL), *e = util_read_file(err_path, NULL);
    CU_ASSERT_FATAL(o && e);
    CU_ASSERT(strstr(o, "| full | - | 0/3 | 3 | 0 |") != NULL);
    /* no stats endpoint: concurrency and the pool are unavailable, not zero */
    CU_ASSERT(strstr(o, "| - | - | - | - | - | niah:100 |\n") != NULL);
    CU_ASSERT(count(e, "\n") == 1 && strstr(e, what) != NULL);
    if (!strstr(e, what)) fprintf(stderr, "\n  %s", e);
    free(o), free(e);
}

static void test_secrets_echoed_by_a_server_are_redacted(void) {
    fake_reply = "{\"error\":{\"message\":\"bad Authorization: Bearer SECRET-tok-42 from user:pw-9931\"}}";
    fake_status = 500;
    struct MHD_Daemon *d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION, 0, NULL, NULL,
                                            fake_request, NULL, MHD_OPTION_END);
    CU_ASSERT_FATAL(d != NULL);
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    char url[96];
    snprintf(url, sizeof url, "http://user:pw-9931@127.0.0.1:%d", info ? info->port : 0);
    setenv("KVB_TEST_BSURL_KEY", "SECRET-tok-42", 1);
    CU_ASSERT(run(url, "--api-key-env KVB_TEST_BSURL_KEY --methods full --requests 1 --prompts 1 --prompt-len 100 "
                       "--max-new 2") == 1);
    unsetenv("KVB_TEST_BSURL_KEY");
    MHD_stop_daemon(d);
    char *o = util_read_file(out_path, NULL), *e = util_read_file(err_path, NULL);
    CU_ASSERT_FATAL(o && e);
    CU_ASSERT(!strstr(o, "SECRET-tok-42") && !strstr(o, "pw-9931") && !strstr(e, "SECRET-tok-42") && !strstr(e, "pw-9931"));
    CU_ASSERT(strstr(e, "HTTP 500") && strstr(e, "[REDACTED]"));
    free(o), free(e);
}

static void test_broken_streams_and_server_errors_count_as_failed(void) {
    check_fake("data: {not json\n\n", 200, "malformed SSE");
    /* a token count no int holds (found by fuzz_sse_stream): a reason, never a cast out of range */
    check_fake("data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}],\"usage\":{\"completion_tokens\":2e40}}\n\n"
               "data: [DONE]\n\n", 200, "usage.completion_tokens 2e+40 is not a token count");
    check_fake("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n", 200, "without \"data: [DONE]\"");
    check_fake("{\"error\":{\"message\":\"engine on fire\"}}", 500, "HTTP 500: engine on fire");
}

static int setup(void) {
    bin = getenv("KVB_BIN");
    if (!bin || !mkdtemp(tmpdir)) return -1;
    snprintf(model, sizeof model, "%s/tiny.gguf", tmpdir);
    snprintf(out_path, sizeof out_path, "%s/out.txt", tmpdir);
    snprintf(err_path, sizeof err_path, "%s/err.txt", tmpdir);
    snprintf(csv_path, sizeof csv_path, "%s/rows.csv", tmpdir);
    snprintf(json_path, sizeof json_path, "%s/rows.json", tmpdir);
    gw_random r = {3, 0.5f, NULL};
    gw_tiny t = {"llama", 2, 32, 4, 2, 48, GW_BYTE_VOCAB, 1024, 1,
                 "<|im_start|>system\nYou are tiny.<|im_end|>\n{% for m in messages %}...{% endfor %}", gw_random_tensor, &r};
    int rc = gw_write_tiny(&t, model);
    free(r.buf);
    if (rc) return -1;
    memset(&sopts, 0, sizeof sopts);
    sopts.model_path = model;
    sopts.model_name = "tiny";
    sopts.max_queue = 16;
    sopts.max_body = 1 << 20;
    sopts.n_threads = 1;
    sopts.parallel = 4;
    sopts.read_timeout_s = 10;
    sopts.batching = 1;
    sopts.kv_pool_bytes = 1 << 20;
    sem_init(&sready, 0, 0);
    if (pthread_create(&sthread, NULL, serve_main, NULL)) return -1;
    srunning = 1;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 30;
    if (sem_timedwait(&sready, &until) || sport <= 0) {
        fprintf(stderr, "server did not start: %s\n", serr);
        return -1;
    }
    return 0;
}

static int teardown(void) {
    if (srunning) {
        sstop = 1;
        pthread_join(sthread, NULL);
    }
    sem_destroy(&sready);
    unlink(model), unlink(out_path), unlink(err_path), unlink(csv_path), unlink(json_path);
    rmdir(tmpdir);
    return 0;
}

int main(void) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("bench-serve --url", setup, teardown);
    CU_add_test(s, "every request completes; counts agree with the server's stats",
                test_every_request_completes_and_counts_agree_with_the_server);
    CU_add_test(s, "--rate: open-loop arrivals over HTTP, every request completes", test_open_loop_completes_every_request);
    CU_add_test(s, "--dataset sharegpt and --duration over HTTP: per-record max_tokens, every request counted",
                test_dataset_dialogues_and_duration_over_http);
    CU_add_test(s, "requests the server refuses are counted failed, exit 1", test_refused_requests_are_counted_failed_and_exit_1);
    CU_add_test(s, "an unreachable or bad URL is one line and exit 1", test_unreachable_url_is_one_line_and_exit_1);
    CU_add_test(s, "a broken stream or a 500 is a failed request, with its reason",
                test_broken_streams_and_server_errors_count_as_failed);
    CU_add_test(s, "a token or URL password echoed by a server is redacted", test_secrets_echoed_by_a_server_are_redacted);
    return util_run_suites();
}
