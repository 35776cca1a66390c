/* cmd_serve.c — `kvbench serve`: the OpenAI-compatible server (judge/serve.h). */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "judge/serve.h"

static const char *HELP =
    "usage: kvbench serve [--model PATH|default] [--host 127.0.0.1] [--port 8080] [--api-key-env VAR]\n"
    "                     [--max-queue 8] [--max-body 4194304] [--method M --budget B --method-opt K=V]\n"
    "\n"
    "An OpenAI-compatible chat-completions server on the engine: GET /v1/models, POST /v1/chat/completions\n"
    "(non-streaming, or server-sent events with \"stream\": true). Any GGUF model; any KV-cache method as the\n"
    "default, or per request with {\"kvbench\": {\"method\": \"snapkv\", \"budget\": \"30%\", \"method_opts\": {...}}}.\n"
    "Replies carry the measured KV bytes in a \"kvbench\" object. --parallel N requests run at once (default 1,\n"
    "each with its own context and a share of --threads), --max-queue more wait, beyond that 503. --api-key-env VAR requires \"Authorization: Bearer $VAR\". Binds 127.0.0.1 unless\n"
    "--host says otherwise. --port 0 picks a free port. Stops on SIGINT / SIGTERM.\n"
    "--batching: continuous batching: up to --parallel (default 16) generations decode together in one step,\n"
    "each prefill between two steps; --kv-pool-mib N: admission waits until the KV pool can hold the request\n"
    "(docs/serving.md).\n"
    "Slow clients: a connection silent for --read-timeout S (10) while its request is read is closed; one address\n"
    "holds at most --max-per-ip N (32) connections, all addresses --max-connections N (256); a request not whole\n"
    "--request-timeout S (30) after it began is cut off however slowly it trickles. Message content over\n"
    "--max-prompt-bytes N (default 6 per token of the context) is refused (413) before it is tokenized.\n"
    "Engine options apply to every generation; --ctx N caps a request's prompt + max_tokens + 1 (default: the\n"
    "model's context). --backend cuda runs one generation at a time (--parallel 1) unless --batching.\n"
    "\n"
    "options:\n"
    "  --verbose              one line per request on stderr\n" CLI_METHOD_HELP CLI_ENGINE_HELP;

static volatile sig_atomic_t stop_flag;
static void on_signal(int sig) {
    (void)sig;
    stop_flag = 1;
}

static void on_ready(void *user, int port) {
    const char *host = user;
    printf("kvbench serve: listening on http://%s:%d/v1\n", host, port);
    fflush(stdout);
}

int cmd_serve(int argc, char **argv) {
    cli_engine_opts eo;
    cli_engine_defaults(&eo);
    cli_method_opts mo;
    cli_method_defaults(&mo);
    kvb_serve_opts o;
    memset(&o, 0, sizeof o);
    o.host = "127.0.0.1";
    o.port = 8080;
    o.max_queue = 8;
    long max_body = 4L << 20, max_prompt = 0, pool_mib = 0;
    cli_opt opts[] = {CLI_FLAG("--verbose", &o.verbose), CLI_STR("--host", &o.host),
                      CLI_INT("--port", &o.port, 0, 65535), CLI_STR("--api-key-env", &o.api_key_env),
                      CLI_INT("--read-timeout", &o.read_timeout_s, 1, 3600),
                      CLI_INT("--max-per-ip", &o.max_per_ip, 1, 4096),
                      CLI_INT("--max-connections", &o.max_connections, 1, 65536),
                      CLI_INT("--request-timeout", &o.request_timeout_s, 1, 3600),
                      CLI_LONG("--max-prompt-bytes", &max_prompt, 1, 1L << 30),
                      CLI_INT("--max-queue", &o.max_queue, 0, 4096), CLI_LONG("--max-body", &max_body, 1024, 1L << 30),
                      CLI_STR("--name", &o.model_name), CLI_INT("--parallel", &o.parallel, 1, 64), CLI_METHOD_OPTS(&mo),
                      CLI_FLAG("--batching", &o.batching), CLI_LONG("--kv-pool-mib", &pool_mib, 1, 1L << 30),
                      CLI_ENGINE_OPTS(&eo), CLI_END};
    int stop = cli_parse("serve", HELP, opts, 0, argc, argv, NULL);
    if (stop >= 0) return stop;
    if (pool_mib && !o.batching) return cli_fail("serve: --kv-pool-mib needs --batching (the pool is the batch's)");
    o.kv_pool_bytes = (int64_t)pool_mib << 20;
    if (o.batching && o.parallel == 0) o.parallel = 16; /* batching one at a time would buy nothing */
    o.max_body = (size_t)max_body;
    o.max_prompt_bytes = (size_t)max_prompt; /* 0: the default, from the context */
    char path[1024], err[512];
    if (kvb_model_resolve(eo.model, path, sizeof path, err, sizeof err)) return cli_fail("serve: %s", err);
    o.model_path = path;
    o.n_threads = eo.ctx.n_threads;
    o.ctx = eo.ctx; /* backend, KV type, prefill chunk and GEMM; --ctx caps a request */
    o.method = mo.method;
    o.budget = mo.budget;
    o.opts = mo.opts;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGPIPE, SIG_IGN);
    if (kvb_serve(&o, &stop_flag, NULL, on_ready, (void *)o.host, err, sizeof err)) return cli_fail("%s", err);
    return 0;
}
