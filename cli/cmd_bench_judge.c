/* cmd_bench_judge.c — `kvbench bench-judge`: judgments per second of the judge client against a local
 * `kvbench serve` (started in this process on a free loopback port) at several client concurrencies. */
#include <cjson/cJSON.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "judge/client.h"
#include "judge/serve.h"

static const char *HELP =
    "usage: kvbench bench-judge [--model PATH|default] [--concurrency 1,4,16] [--requests 32] [--parallel 2]\n"
    "                           [--max-tokens 10]\n"
    "\n"
    "Starts `kvbench serve` in this process (loopback, free port, --parallel generations at once sharing the\n"
    "threads), then sends --requests distinct LongMemEval-style yes/no judgements (one user message,\n"
    "temperature 0, max_tokens 10, no cache) through the judge client at each client concurrency and prints\n"
    "judgments/s, mean latency and errors.\n" CLI_ENGINE_HELP;

typedef struct {
    kvb_serve_opts o;
    volatile sig_atomic_t stop;
    int port, rc;
    char err[512];
    pthread_mutex_t mu;
    pthread_cond_t cv;
} bj_server;

static void bj_ready(void *user, int port) {
    bj_server *s = user;
    pthread_mutex_lock(&s->mu);
    s->port = port;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static void *bj_thread(void *arg) {
    bj_server *s = arg;
    s->rc = kvb_serve(&s->o, &s->stop, NULL, bj_ready, s, s->err, sizeof s->err);
    pthread_mutex_lock(&s->mu);
    if (!s->port) s->port = -1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static char *judge_messages(int i) {
    char q[512];
    snprintf(q, sizeof q,
             "I will give you a question, a correct answer, and a response from a model. Please answer yes if the "
             "response contains the correct answer. Otherwise, answer no.\n\nQuestion: What is %d plus %d?\n\n"
             "Correct Answer: %d\n\nModel Response: The sum is %d.\n\nIs the model response correct? Answer yes or no only.",
             i, i + 3, 2 * i + 3, 2 * i + 3 + (i % 2));
    return kvb_judge_user_message(q);
}

int cmd_bench_judge(int argc, char **argv) {
    cli_engine_opts eo;
    cli_engine_defaults(&eo);
    const char *conc = "1,4,16";
    long n_req = 32, parallel = 2, max_tokens = 10;
    cli_opt opts[] = {CLI_STR("--concurrency", &conc), CLI_LONG("--requests", &n_req, 1, 100000),
                      CLI_LONG("--parallel", &parallel, 1, 64), CLI_LONG("--max-tokens", &max_tokens, 1, 4096),
                      CLI_ENGINE_OPTS(&eo), CLI_END};
    int stop = cli_parse("bench-judge", HELP, opts, 0, argc, argv, NULL);
    if (stop >= 0) return stop;
    /* the levels read whole before the server starts: a bad one is refused before any level is measured */
    enum { MAX_LEVELS = 16 };
    int levels[MAX_LEVELS], n_levels = 0;
    for (const char *s = conc;;) {
        char *end;
        long c = strtol(s, &end, 10);
        if (end == s || c < 1 || c > 1024 || (*end && *end != ',') || n_levels == MAX_LEVELS)
            return cli_fail("bench-judge: --concurrency expects up to %d comma-separated integers in [1, 1024], got '%s'",
                            MAX_LEVELS, conc);
        levels[n_levels++] = (int)c;
        if (!*end) break;
        s = end + 1;
    }
    char path[1024], err[512];
    if (kvb_model_resolve(eo.model, path, sizeof path, err, sizeof err)) return cli_fail("bench-judge: %s", err);
    bj_server srv;
    memset(&srv, 0, sizeof srv);
    pthread_mutex_init(&srv.mu, NULL);
    pthread_cond_init(&srv.cv, NULL);
    srv.o.model_path = path;
    srv.o.host = "127.0.0.1";
    srv.o.max_queue = 1024;
    srv.o.max_body = 1 << 20;
    srv.o.n_threads = eo.ctx.n_threads;
    srv.o.ctx = eo.ctx; /* the engine options reach the judge's generations, as in serve */
    if (!strcmp(eo.ctx.backend, "cuda") && parallel > 1) /* serve's rule, in this command's words */
        return cli_fail("bench-judge: --backend cuda judges one request at a time (its one stream is shared): --parallel 1");
    srv.o.parallel = (int)parallel;
    srv.o.method = "full";
    signal(SIGPIPE, SIG_IGN);
    pthread_t th;
    pthread_create(&th, NULL, bj_thread, &srv);
    pthread_mutex_lock(&srv.mu);
    while (!srv.port) pthread_cond_wait(&srv.cv, &srv.mu);
    pthread_mutex_unlock(&srv.mu);
    if (srv.port < 0) {
        pthread_join(th, NULL);
        return cli_fail("bench-judge: %s", srv.err);
    }
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1", srv.port);
    printf("judge: kvbench serve (%s, --parallel %ld) at %s, %ld requests per level, max_tokens %ld\n\n", path, parallel,
           url, n_req, max_tokens);
    printf("| client concurrency | judgments/s | mean s/judgment | errors | speedup vs 1 |\n|---|---|---|---|---|\n");
    double base = 0;
    int rc = 0;
    for (int l = 0; l < n_levels; l++) {
        int c = levels[l];
        kvb_judge_req *reqs = calloc((size_t)n_req, sizeof *reqs);
        for (long i = 0; i < n_req; i++) reqs[i].messages_json = judge_messages((int)i);
        kvb_judge_cfg cfg;
        kvb_judge_cfg_defaults(&cfg);
        cfg.base_url = url;
        cfg.model = "default";
        cfg.concurrency = c;
        cfg.timeout_s = 600;
        cfg.deadline_s = 0; /* measuring the server: every request gets its answer, however long the batch */
        cfg.max_tokens = (int)max_tokens;
        double t0 = cli_now();
        int jr = kvb_judge_run(&cfg, reqs, (int)n_req, err, sizeof err);
        double dt = cli_now() - t0;
        int errors = 0;
        for (long i = 0; i < n_req; i++) {
            errors += !reqs[i].ok;
            kvb_judge_req_clear(&reqs[i]);
            free(reqs[i].messages_json);
        }
        free(reqs);
        if (jr) { rc = cli_fail("bench-judge: %s", err); break; }
        double jps = n_req / dt;
        if (base == 0) base = jps;
        printf("| %d | %.2f | %.3f | %d | %.2fx |\n", c, jps, dt / n_req, errors, jps / base);
        fflush(stdout);
    }
    srv.stop = 1;
    pthread_join(th, NULL);
    return rc;
}
