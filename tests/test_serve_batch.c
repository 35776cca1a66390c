/* test_serve_batch.c — `kvbench serve --batching` (judge/serve_batch.h) over loopback, on a tiny random-weight model
 * with one token per byte: concurrent requests, decoded together in one batched step, get the replies the
 * unbatched server gives each alone (greedy), streamed or not, each with its own method; with a KV pool for one
 * request, concurrent requests wait their turn and all complete; a request larger than the pool is a 400 naming
 * the pool, never a wait forever; a SnapKV request is promised bench-serve's layer-wise peak (its compressed cache
 * plus one layer's whole prompt), so it is served on a pool too small for full attention's; a client that leaves
 * while it waits for the pool gives its place back. */
#include <CUnit/Basic.h>
#include <curl/curl.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util_common.h"
#include "util_gguf_writer.h"
#include "engine/kvpool.h"
#include "engine/model.h"
#include "judge/serve.h"

enum { LAYERS = 2, KV_HEADS = 2, N_REQ = 6, MAX_TOK = 12, N_CTX = 4096, LONG_TOK = 3000 };

static char tmpdir[64] = "/tmp/kvb_sbatch_XXXXXX", model_path[128];
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

static int start(int batching, int parallel, int64_t pool_bytes) {
    memset(&sopts, 0, sizeof sopts);
    sopts.model_path = model_path;
    sopts.model_name = "tiny";
    sopts.max_queue = 16;
    sopts.max_body = 1 << 16;
    sopts.n_threads = 2;
    sopts.parallel = parallel;
    sopts.read_timeout_s = 10;
    sopts.batching = batching;
    sopts.kv_pool_bytes = pool_bytes;
    sstop = 0;
    sport = 0;
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

static void stop(void) {
    if (srunning) {
        sstop = 1;
        pthread_join(sthread, NULL);
        srunning = 0;
    }
    sem_destroy(&sready);
}

typedef struct {
    char body[1 << 15];
    size_t n;
    long status;
    const char *req; /* the request body */
} http_res;

static size_t sink(char *p, size_t s, size_t n, void *user) {
    http_res *h = user;
    size_t k = s * n;
    if (h->n + k < sizeof h->body) memcpy(h->body + h->n, p, k), h->n += k, h->body[h->n] = 0;
    return k;
}

static void *post_thread(void *arg) {
    http_res *h = arg;
    char url[96];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/chat/completions", sport);
    CURL *e = curl_easy_init();
    h->n = 0;
    h->body[0] = 0;
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, h->req);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, sink);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, h);
    curl_easy_setopt(e, CURLOPT_TIMEOUT, 120L);
    h->status = 0;
    if (curl_easy_perform(e) == CURLE_OK) curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &h->status);
    curl_easy_cleanup(e);
    return NULL;
}

static char bodies[N_REQ][512];
static const char *methods[N_REQ] = {"full", "snapkv", "full", "streamingllm", "h2o", "full"};
static const char *budgets[N_REQ] = {NULL, "50%", NULL, "40%", "50%", NULL};

static void make_bodies(int stream_odd) {
    for (int i = 0; i < N_REQ; i++) {
        char kv[128] = "";
        if (budgets[i]) snprintf(kv, sizeof kv, ",\"kvbench\":{\"method\":\"%s\",\"budget\":\"%s\"}", methods[i], budgets[i]);
        snprintf(bodies[i], sizeof bodies[i],
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"Request %d: tell me about the number %d and the "
                 "letter %c, please, at some length.\"}],\"max_tokens\":%d,\"temperature\":0%s%s}",
                 i, 17 * i + 3, 'a' + i, MAX_TOK, kv, stream_odd && (i % 2) ? ",\"stream\":true" : "");
    }
}

/* The reply's text: message.content, or the stream's deltas joined. */
static void reply_text(const http_res *h, char *out, size_t cap) {
    out[0] = 0;
    size_t at = 0;
    if (strncmp(h->body, "data: ", 6)) {
        cJSON *j = cJSON_Parse(h->body);
        const cJSON *c = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "message"), "content");
        if (cJSON_IsString(c)) snprintf(out, cap, "%s", c->valuestring);
        cJSON_Delete(j);
        return;
    }
    const char *p = h->body;
    while ((p = strstr(p, "data: "))) {
        p += 6;
        const char *end = strstr(p, "\n\n");
        if (!end) break;
        cJSON *j = cJSON_ParseWithLength(p, (size_t)(end - p));
        const cJSON *c = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "delta"), "content");
        if (cJSON_IsString(c)) at += (size_t)snprintf(out + at, at < cap ? cap - at : 0, "%s", c->valuestring);
        cJSON_Delete(j);
        p = end;
    }
}

/* Run the requests, concurrently or one after the other; their texts into out. */
static void run(int concurrent, char out[N_REQ][1024], long *status) {
    http_res *h = calloc(N_REQ, sizeof *h);
    pthread_t th[N_REQ];
    for (int i = 0; i < N_REQ; i++) {
        h[i].req = bodies[i];
        if (concurrent) pthread_create(&th[i], NULL, post_thread, &h[i]);
        else post_thread(&h[i]);
    }
    for (int i = 0; i < N_REQ; i++) {
        if (concurrent) pthread_join(th[i], NULL);
        status[i] = h[i].status;
        reply_text(&h[i], out[i], 1024);
        if (h[i].status != 200) fprintf(stderr, "\n  request %d: %ld %s\n", i, h[i].status, h[i].body);
    }
    free(h);
}

static char ref[N_REQ][1024];

static void check_against_ref(char got[N_REQ][1024], const long *status) {
    for (int i = 0; i < N_REQ; i++) {
        CU_ASSERT(status[i] == 200);
        CU_ASSERT(strlen(got[i]) > 0 && strcmp(got[i], ref[i]) == 0);
        if (strcmp(got[i], ref[i])) fprintf(stderr, "\n  request %d: '%s' vs '%s'\n", i, got[i], ref[i]);
    }
}

static void test_concurrent_batched_replies_equal_unbatched_alone(void) {
    long st[N_REQ];
    make_bodies(0);
    CU_ASSERT_FATAL(start(0, 1, 0) == 0); /* the reference: the unbatched server, one request at a time */
    run(0, ref, st);
    stop();
    for (int i = 0; i < N_REQ; i++) CU_ASSERT_FATAL(st[i] == 200);
    static char got[N_REQ][1024];
    CU_ASSERT_FATAL(start(1, 8, 0) == 0);
    run(1, got, st);
    check_against_ref(got, st);
    make_bodies(1); /* every other one streamed */
    run(1, got, st);
    check_against_ref(got, st);
    stop();
}

/* Bytes of one KV slot (one token of one layer and KV head) on model m. */
static int64_t slot_bytes(kvb_model *m) {
    char err[128];
    kvb_ctx_params cp = kvb_ctx_default_params();
    cp.n_ctx = 16;
    kvb_ctx *c = kvb_ctx_create(m, &cp, err, sizeof err);
    CU_ASSERT_FATAL(c != NULL);
    const int64_t b = kvc_slot_bytes(c->kv);
    kvb_ctx_free(c);
    return b;
}

static void test_pool_for_one_request_serves_all_in_turn(void) {
    char err[128];
    kvb_model *m = kvb_model_load(model_path, err, sizeof err);
    CU_ASSERT_FATAL(m != NULL);
    kvp_pool p;
    CU_ASSERT_FATAL(kvp_init(&p, 1 << 30, slot_bytes(m), 16, err, sizeof err) == 0);
    const int64_t one = kvp_full_pages(&p, &m->cfg, 200) * p.page_bytes; /* room for one prompt + max_tokens */
    kvb_model_free(m);
    long st[N_REQ];
    static char got[N_REQ][1024];
    make_bodies(1);
    CU_ASSERT_FATAL(start(1, 8, one) == 0);
    run(1, got, st);
    check_against_ref(got, st);
    stop();
    /* a pool smaller than one request: refused at once */
    CU_ASSERT_FATAL(start(1, 8, one / 8) == 0);
    http_res *h = calloc(1, sizeof *h);
    h->req = bodies[0];
    post_thread(h);
    CU_ASSERT(h->status == 400 && strstr(h->body, "pool"));
    free(h);
    stop();
}

/* GET /v1/kvbench/stats: the engine's counters (NULL when the request fails). */
static cJSON *get_stats(void) {
    char url[96];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/kvbench/stats", sport);
    http_res *h = calloc(1, sizeof *h);
    CURL *e = curl_easy_init();
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, sink);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, h);
    curl_easy_setopt(e, CURLOPT_TIMEOUT, 30L);
    cJSON *j = curl_easy_perform(e) == CURLE_OK ? cJSON_Parse(h->body) : NULL;
    curl_easy_cleanup(e);
    free(h);
    return j;
}

static double stat_of(const cJSON *j, const char *key) {
    const cJSON *v = cJSON_GetObjectItem(j, key);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

/* Bytes of one pool page (16 slots of one layer and KV head) on the test model. */
static int64_t page_bytes(void) {
    char err[128];
    kvb_model *m = kvb_model_load(model_path, err, sizeof err);
    CU_ASSERT_FATAL(m != NULL);
    const int64_t b = 16 * slot_bytes(m);
    kvb_model_free(m);
    return b;
}

static int64_t pages_of(int64_t tokens) { return (tokens + 15) / 16; }

/* a prompt of about 430 tokens (one a byte) for SnapKV at 25%: about 108 kept per head, beyond its 32-token window */
static void snapkv_body(char *out, size_t cap, const char *extra) {
    char text[512];
    int n = 0;
    for (int i = 0; n < 420; i++) n += snprintf(text + n, sizeof text - (size_t)n, "item %d is %c; ", i, 'a' + i % 26);
    snprintf(out, cap,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],\"max_tokens\":%d,\"temperature\":0,"
             "\"kvbench\":{\"method\":\"snapkv\",\"budget\":\"25%%\"}%s}",
             text, MAX_TOK, extra);
}

static void test_layerwise_method_is_promised_its_compressed_peak(void) {
    static char body[1024];
    snapkv_body(body, sizeof body, "");
    http_res *h = calloc(1, sizeof *h);
    h->req = body;
    CU_ASSERT_FATAL(start(0, 1, 0) == 0); /* the reference: the unbatched server */
    post_thread(h);
    stop();
    CU_ASSERT_FATAL(h->status == 200);
    char want[1024], got[1024];
    reply_text(h, want, sizeof want);
    cJSON *r = cJSON_Parse(h->body);
    const int64_t n = (int64_t)stat_of(cJSON_GetObjectItem(r, "usage"), "prompt_tokens");
    cJSON_Delete(r);
    CU_ASSERT_FATAL(n > 400 && n < 600);
    /* the peak, per KV head: full attention holds prompt + max_tokens in every layer; SnapKV's layer-wise prefill
     * holds one layer's whole prompt and the other layers' kept tokens, each with room for max_tokens */
    const int64_t keep = llround(0.25 * (double)n);
    const int64_t full = KV_HEADS * LAYERS * pages_of(n + MAX_TOK);
    const int64_t layerwise = KV_HEADS * (pages_of(n + MAX_TOK) + (LAYERS - 1) * pages_of(keep + MAX_TOK));
    const int64_t prompt_everywhere = KV_HEADS * LAYERS * pages_of(n); /* a prefill that ends at the last layer */
    CU_ASSERT_FATAL(layerwise < full);
    /* a pool of exactly the layer-wise peak: a promise of full attention's pages would be refused (400) */
    CU_ASSERT_FATAL(start(1, 8, layerwise * page_bytes()) == 0);
    post_thread(h);
    CU_ASSERT(h->status == 200);
    if (h->status != 200) fprintf(stderr, "\n  %ld %s\n", h->status, h->body);
    reply_text(h, got, sizeof got);
    CU_ASSERT(strlen(got) > 0 && strcmp(got, want) == 0);
    cJSON *st = get_stats();
    CU_ASSERT_FATAL(st != NULL);
    CU_ASSERT(stat_of(st, "pool_pages") == (double)layerwise);
    CU_ASSERT(stat_of(st, "pool_peak_reserved") == (double)layerwise); /* promised exactly its layer-wise peak */
    CU_ASSERT(stat_of(st, "finished") == 1 && stat_of(st, "pool_reserved") == 0);
    /* measured at every layer of its prefill: within the promise, and below the whole prompt in every layer */
    CU_ASSERT(stat_of(st, "overdrafts") == 0);
    CU_ASSERT(stat_of(st, "peak_prefill") >= KV_HEADS * pages_of(n));
    CU_ASSERT(stat_of(st, "peak_prefill") <= layerwise && stat_of(st, "peak_prefill") < prompt_everywhere);
    cJSON_Delete(st);
    stop();
    free(h);
}

/* A request sent on a raw connection (closed by the caller: a client that leaves). -1 on failure. */
static int send_raw(const char *body) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)sport)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    char head[256];
    int hn = snprintf(head, sizeof head,
                      "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      "Content-Length: %zu\r\n\r\n",
                      strlen(body));
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) || send(fd, head, (size_t)hn, MSG_NOSIGNAL) != hn ||
        send(fd, body, strlen(body), MSG_NOSIGNAL) != (ssize_t)strlen(body)) {
        if (fd >= 0) close(fd);
        return -1;
    }
    return fd;
}

/* Poll the stats until key reaches at least v (10 s at most): 1 when it did. */
static int stats_reach(const char *key, double v) {
    for (int i = 0; i < 5000; i++) {
        cJSON *st = get_stats();
        const double x = stat_of(st, key);
        cJSON_Delete(st);
        if (x >= v) return 1;
        usleep(2000);
    }
    return 0;
}

static void test_client_leaving_while_it_waits_gives_its_place_back(void) {
    static char a_body[1024], b_body[1024];
    snapkv_body(b_body, sizeof b_body, "");
    /* A: a long generation (thousands of steps, so it still runs when B leaves) on nearly the whole pool (full
     * attention: no method shrinks its promise) */
    snprintf(a_body, sizeof a_body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"a long one\"}],\"max_tokens\":%d,"
             "\"ignore_eos\":true,\"temperature\":0}",
             LONG_TOK);
    const int64_t pool = KV_HEADS * LAYERS * pages_of(LONG_TOK + 100);
    CU_ASSERT_FATAL(start(1, 8, pool * page_bytes()) == 0);
    http_res *a = calloc(1, sizeof *a), *c = calloc(1, sizeof *c);
    a->req = a_body;
    pthread_t ta;
    CU_ASSERT_FATAL(pthread_create(&ta, NULL, post_thread, a) == 0);
    CU_ASSERT_FATAL(stats_reach("running", 1));
    /* B waits at the head of the queue for the pool (its context and method made, to know its promise), then its
     * client leaves */
    const int fd = send_raw(b_body);
    CU_ASSERT_FATAL(fd >= 0);
    CU_ASSERT(stats_reach("waits", 1));
    close(fd);
    pthread_join(ta, NULL);
    CU_ASSERT(a->status == 200);
    /* C, the same request as B, is then served, and the pool ends empty: B held nothing once it left */
    c->req = b_body;
    post_thread(c);
    CU_ASSERT(c->status == 200);
    cJSON *st = get_stats();
    CU_ASSERT_FATAL(st != NULL);
    /* B never ran: A and C finished, nothing failed or was cancelled */
    CU_ASSERT(stat_of(st, "finished") == 2 && stat_of(st, "failed") == 0 && stat_of(st, "cancelled") == 0);
    CU_ASSERT(stat_of(st, "pool_reserved") == 0 && stat_of(st, "admitted") == 0 && stat_of(st, "running") == 0);
    cJSON_Delete(st);
    stop();
    free(a);
    free(c);
}

static int setup(void) {
    if (!mkdtemp(tmpdir)) return -1;
    snprintf(model_path, sizeof model_path, "%s/tiny-bytes.gguf", tmpdir);
    gw_random r = {11, 0.5f, NULL};
    gw_tiny t = {"llama", LAYERS, 32, 4, KV_HEADS, 48, GW_BYTE_VOCAB, N_CTX, 1,
                 "<|im_start|>system\nYou are tiny.<|im_end|>\n{% for m in messages %}...{% endfor %}", gw_random_tensor, &r};
    int rc = gw_write_tiny(&t, model_path);
    free(r.buf);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    return rc;
}

static int teardown(void) {
    unlink(model_path);
    rmdir(tmpdir);
    curl_global_cleanup();
    return 0;
}

int main(void) {
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("serve --batching", setup, teardown);
    CU_add_test(s, "concurrent requests decoded together reply as the unbatched server alone (plain and streamed)",
                test_concurrent_batched_replies_equal_unbatched_alone);
    CU_add_test(s, "a KV pool for one request serves concurrent requests in turn; a request over the pool is a 400",
                test_pool_for_one_request_serves_all_in_turn);
    CU_add_test(s, "a SnapKV request is promised its layer-wise peak: served on a pool too small for full attention's",
                test_layerwise_method_is_promised_its_compressed_peak);
    CU_add_test(s, "a client that leaves while it waits for the pool gives its place back",
                test_client_leaving_while_it_waits_gives_its_place_back);
    return util_run_suites();
}
