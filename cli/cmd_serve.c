/* cmd_serve.c — `kvbench serve`: the OpenAI-compatible server (judge/serve.h). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
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
    "Slow clients: a connection silent for --read-timeout S (10) while its request is read is closed; one address\n"
    "holds at most --max-per-ip N (32) connections, all addresses --max-connections N (256).\n"
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
    o.max_body = 4u << 20;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = cli_engine_opt(&eo, argc, argv, &i);
        if (r == 0) r = cli_method_opt(&mo, argc, argv, &i);
        if (r < 0) return 1;
        if (r > 0) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(HELP, stdout);
            return 0;
        }
        if (!strcmp(a, "--verbose")) { o.verbose = 1; continue; }
        if (i + 1 >= argc) return cli_fail("serve: %s needs a value (or is unknown; see --help)", a);
        const char *v = argv[++i];
        long n;
        if (!strcmp(a, "--host")) o.host = v;
        else if (!strcmp(a, "--port")) { if (cli_int("--port", v, 0, 65535, &n)) return 1; o.port = (int)n; }
        else if (!strcmp(a, "--api-key-env")) o.api_key_env = v;
        else if (!strcmp(a, "--read-timeout")) { if (cli_int("--read-timeout", v, 1, 3600, &n)) return 1; o.read_timeout_s = (int)n; }
        else if (!strcmp(a, "--max-per-ip")) { if (cli_int("--max-per-ip", v, 1, 4096, &n)) return 1; o.max_per_ip = (int)n; }
        else if (!strcmp(a, "--max-connections")) { if (cli_int("--max-connections", v, 1, 65536, &n)) return 1; o.max_connections = (int)n; }
        else if (!strcmp(a, "--max-queue")) { if (cli_int("--max-queue", v, 0, 4096, &n)) return 1; o.max_queue = (int)n; }
        else if (!strcmp(a, "--max-body")) { if (cli_int("--max-body", v, 1024, 1L << 30, &n)) return 1; o.max_body = (size_t)n; }
        else if (!strcmp(a, "--name")) o.model_name = v;
        else if (!strcmp(a, "--parallel")) { if (cli_int("--parallel", v, 1, 64, &n)) return 1; o.parallel = (int)n; }
        else return cli_fail("serve: unknown option '%s' (see --help)", a);
    }
    char path[1024], err[512];
    if (kvb_model_resolve(eo.model, path, sizeof path, err, sizeof err)) return cli_fail("serve: %s", err);
    o.model_path = path;
    o.n_threads = eo.ctx.n_threads;
    o.method = mo.method;
    o.budget = mo.budget;
    o.opts = mo.opts;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGPIPE, SIG_IGN);
    if (kvb_serve(&o, &stop_flag, NULL, on_ready, (void *)o.host, err, sizeof err)) return cli_fail("%s", err);
    return 0;
}
