/* cmd_bench_serve.c — `kvbench bench-serve`: what a method buys a server. A load generator (judge/loadgen.h) drives
 * the continuous-batching scheduler in process on a fixed KV pool, or a running `kvbench serve --batching` over
 * HTTP (--url): N closed-loop clients, each sending its next request when the last one ends, or open-loop Poisson
 * arrivals, replay a dataset's prompts (benchmarks/serve_dataset.h: LongBench or ShareGPT records, or the needle
 * generator's, the default) until a fixed number of requests is done or a duration has passed; one row per
 * method@budget (and per pool size: several give the chart of throughput against the pool; docs/serving.md). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "benchmarks/loaders.h"
#include "benchmarks/prompt.h"
#include "benchmarks/serve_dataset.h"
#include "benchmarks/serve_suite.h"
#include "cli/cli.h"
#include "engine/batch.h"
#include "engine/kvcache.h"
#include "engine/kvpool.h"
#include "judge/loadgen.h"
#include "judge/redact.h"
#include "methods/budget.h"
#include "reports/serve_chart.h"

int cmd_bench_serve(int argc, char **argv);

static const char *HELP =
    "usage: kvbench bench-serve [--methods full,snapkv@25%,...] [--clients 16] [--requests 64] [--duration S]\n"
    "                           [--dataset longbench:FILE.jsonl|sharegpt:FILE.json|niah[:LEN]] [--seed N]\n"
    "                           [--prompt-len 1024] [--max-new 64] [--kv-pool-mib N[,N...] | --pool-seqs 4[,N...]]\n"
    "                           [--max-batch 64] [--prompts 8] [--stop-at-eos] [--csv FILE] [--json FILE]\n"
    "                           [--chart FILE] [--url URL [--api-key-env VAR] [--server-model NAME]] [engine options]\n"
    "\n"
    "Throughput of the engine as a server, per KV-cache method, at a fixed KV memory. --clients closed-loop clients\n"
    "replay --prompts needle-in-a-haystack prompts of about --prompt-len tokens (the needle at evenly spread\n"
    "depths), or a dataset's (--dataset), until --requests requests have ended (default 64), or until --duration\n"
    "seconds have passed (no request is sent after it; those in flight finish and count; both given: whichever\n"
    "comes first), each generating --max-new tokens (--stop-at-eos: or fewer).\n"
    "Requests decode together, one batched forward step for all running sequences, on one KV pool of\n"
    "--kv-pool-mib MiB (default: room for --pool-seqs full-attention sequences of prompt + max-new tokens);\n"
    "a request waits until the pool can hold it (no preemption). One Markdown row per method@budget: requests/s,\n"
    "output tokens/s, TTFT and TPOT p50/p90/p99, mean and max running sequences, pool occupancy, waits, failed and\n"
    "lost requests. --csv FILE and --json FILE write the same rows. Several pool sizes (--kv-pool-mib 64,128 or\n"
    "--pool-seqs 2,4,8) run every method at each and write the chart of output tokens/s against the pool (--chart\n"
    "FILE, default throughput-vs-pool.svg).\n"
    "Times are wall-clock on this machine (docs/serving.md). Exit 1 when a request failed (each row says why).\n"
    "--rate R: open loop instead, Poisson arrivals at R requests/s (one seeded schedule for every method); TTFT\n"
    "counts from each request's arrival.\n"
    "--url URL: the same load against a running server (kvbench serve --batching, or any OpenAI-compatible server\n"
    "honouring the \"kvbench\" method/budget field and \"ignore_eos\"), one connection per client, streamed\n"
    "replies: TTFT and TPOT measured client-side from the stream; concurrency and pool occupancy read from the\n"
    "server's /v1/kvbench/stats, '-' when it has none. The prompts are built with --model's tokenizer.\n"
    "\n"
    "options:\n"
    "  --methods LIST         method[@budget] items, comma-separated (default full,snapkv@25%,streamingllm@25%)\n"
    "  --dataset SPEC         the prompts, as `kvbench run` builds them (chat template, the benchmark's truncation to\n"
    "                         the context less the request's max-new; a record that cannot fit is skipped and counted):\n"
    "                         longbench:FILE.jsonl (a task's records; config from FILE's ../config or\n"
    "                         --longbench-config DIR; a request generates the task's dataset2maxlen tokens, capped by\n"
    "                         --max-new), sharegpt:FILE.json (dialogues; a request generates the recorded reply's\n"
    "                         length, capped by --max-new), niah[:LEN] (the default, LEN = --prompt-len).\n"
    "                         Records are shuffled by --seed (default 1); --prompts N: the first N (default all;\n"
    "                         niah: 8); requests cycle through them\n"
    "  --duration S           send requests for S seconds (closed loop: clients stop; open loop: arrivals stop)\n"
    "  --log-requests FILE    one JSON line per request sent: request, prompt, record, max_new, ids (in process)\n"
    "  --page-tokens N        tokens per pool page per KV head (default 16)\n"
    "  --prefill-chunk N      prefill N tokens between two decode steps (default: a prompt's whole prefill)\n"
    "  --decode-only B,...    batched decode alone: for each batch size B, B sequences of --prompt-len tokens,\n"
    "                         one untimed step, then --n-decode (32) batched steps timed\n"
    "                         (scripts/llamacpp_batch_bench.py: llama.cpp's, the same way)\n"
    "  --api-key-env VAR      with --url: the bearer token, read from this environment variable\n"
    "  --server-model NAME    with --url: the request's \"model\" field (default: the first of /v1/models)\n"
    CLI_ENGINE_HELP;

typedef struct {
    char name[128];
    char budget_str[32];
    kvb_budget budget;
} method_item;

/* "full,snapkv@25%" -> items; -1 + err on an unknown method or a bad budget. */
static int parse_methods(const char *list, method_item *out, int cap, int *n, char *err, size_t err_len) {
    *n = 0;
    const char *p = list;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char item[128];
        if (len == 0 || len >= sizeof item) return snprintf(err, err_len, "--methods: empty or overlong item in '%s'", list), -1;
        if (*n == cap) return snprintf(err, err_len, "--methods: more than %d items", cap), -1;
        memcpy(item, p, len);
        item[len] = 0;
        method_item *m = &out[(*n)++];
        memset(m, 0, sizeof *m);
        char *at = strchr(item, '@');
        if (at) *at = 0;
        if (!kvb_method_find(item)) {
            char names[1024];
            kvb_method_names(names, sizeof names);
            return snprintf(err, err_len, "--methods: unknown method '%s' (one of: %.300s)", item, names), -1;
        }
        snprintf(m->name, sizeof m->name, "%s", item);
        if (at) {
            if (kvb_budget_parse(at + 1, &m->budget, err, err_len)) return -1;
            snprintf(m->budget_str, sizeof m->budget_str, "%s", at + 1);
        } else {
            snprintf(m->budget_str, sizeof m->budget_str, "-");
        }
        p = end ? end + 1 : p + len;
    }
    if (*n == 0) return snprintf(err, err_len, "--methods: no method given"), -1;
    return 0;
}

/* --decode-only: batched decode alone, as scripts/llamacpp_batch_bench.py measures llama.cpp's: for each batch
 * size B, B contexts prefilled with ctx_len ids 1000 + ((i + 131 b) * 7919) % 40000 (sequence b; modulo a smaller
 * vocabulary), one untimed batched step, then n_decode batched steps of one token each, timed. */
static int decode_only(kvb_model *m, const cli_engine_opts *eo, const int *sizes, int n_sizes, int ctx_len, int n_decode,
                       char *err, size_t err_len) {
    kvb_ctx_params p = eo->ctx;
    p.n_ctx = ctx_len + n_decode + 8;
    p.kv_reserve = p.n_ctx; /* no growth copy inside the timed steps */
    kvb_ctx_params op = p;
    op.n_ctx = 16, op.n_batch = 1, op.kv_reserve = 0;
    kvb_ctx *owner = kvb_ctx_create(m, &op, err, err_len);
    if (!owner) return -1;
    p.share_backend = owner->be;
    int32_t *ids = malloc((size_t)ctx_len * sizeof *ids);
    int rc = ids ? 0 : (snprintf(err, err_len, "out of memory"), -1);
    printf("| sequences | context | decode steps | ms/step | decode tok/s |\n|---|---|---|---|---|\n");
    for (int k = 0; k < n_sizes && !rc; k++) {
        const int B = sizes[k];
        kvb_ctx **cs = calloc((size_t)B, sizeof *cs);
        int32_t *next = calloc((size_t)B, sizeof *next);
        kvb_batch *b = kvb_batch_create(m, owner->be, B, err, err_len);
        rc = cs && next && b ? 0 : -1;
        if (rc && !err[0]) snprintf(err, err_len, "out of memory");
        for (int i = 0; i < B && !rc; i++) {
            for (int t = 0; t < ctx_len; t++) ids[t] = (int32_t)((1000 + ((t + 131 * i) * 7919) % 40000) % m->cfg.n_vocab);
            rc = (cs[i] = kvb_ctx_create(m, &p, err, err_len)) ? kvb_forward(cs[i], ids, ctx_len, err, err_len) : -1;
            if (!rc) rc = kvb_ctx_end_prefill(cs[i], err, err_len);
        }
        struct timespec t0, t1;
        /* step 0 untimed (the script's llama.cpp run takes one too: llama.cpp reserves its graph there), then the
         * timed steps at positions ctx_len + 1 .. ctx_len + n_decode, as the script's */
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (int s = 0; s <= n_decode && !rc; s++) {
            if (s == 1) clock_gettime(CLOCK_MONOTONIC, &t0);
            for (int i = 0; i < B; i++) next[i] = (int32_t)((1000 + ((ctx_len + s + 131 * i) * 7919) % 40000) % m->cfg.n_vocab);
            rc = kvb_batch_decode(b, cs, next, B, err, err_len);
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
        if (!rc) printf("| %d | %d | %d | %.2f | %.1f |\n", B, ctx_len, n_decode, ms / n_decode, B * n_decode / (ms / 1e3));
        fflush(stdout);
        for (int i = 0; i < B && cs; i++) kvb_ctx_free(cs[i]);
        kvb_batch_free(b);
        free(cs);
        free(next);
    }
    free(ids);
    kvb_ctx_free(owner);
    return rc;
}

/* --log-requests: one JSON line per request sent, the record named (the test's view of what was served). */
typedef struct {
    FILE *f;
    const kvb_serve_set *set;
} request_log;

static void log_request(void *user, int request, int prompt, int max_new, const int32_t *ids, int n_ids) {
    request_log *l = user;
    cJSON *j = cJSON_CreateObject(), *a = ids ? cJSON_AddArrayToObject(j, "ids") : NULL;
    cJSON_AddNumberToObject(j, "request", request);
    cJSON_AddNumberToObject(j, "prompt", prompt);
    cJSON_AddStringToObject(j, "record", l->set->record_ids[prompt]);
    cJSON_AddNumberToObject(j, "max_new", max_new);
    for (int i = 0; a && i < n_ids; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    char *text = cJSON_PrintUnformatted(j);
    if (text) fprintf(l->f, "%s\n", text);
    free(text);
    cJSON_Delete(j);
}

/* The first of opts[0..n) that argv gives, or NULL */
static const char *first_given(int argc, char **argv, const char *const *opts, int n) {
    for (int i = 0; i < n; i++)
        if (cli_given(argc, argv, opts[i])) return opts[i];
    return NULL;
}

/* "64" or "32,64,128" -> values (MiB, or sequences) of option opt; -1 + err. */
static int parse_pools(const char *opt, const char *list, long *out, int cap, int *n, char *err, size_t err_len) {
    *n = 0;
    for (const char *q = list; *q;) {
        char *end;
        long v = strtol(q, &end, 10);
        if (end == q || v < 1 || v > (1L << 30) || (*end && *end != ',') || *n == cap)
            return snprintf(err, err_len, "%s expects up to %d positive sizes like 64 or 32,64,128, got '%s'", opt, cap, list), -1;
        out[(*n)++] = v;
        q = *end ? end + 1 : end;
    }
    if (*n == 0) return snprintf(err, err_len, "%s expects positive sizes like 64 or 32,64,128", opt), -1;
    return 0;
}

int cmd_bench_serve(int argc, char **argv) {
    cli_engine_opts eo;
    cli_engine_defaults(&eo);
    const char *methods = "full,snapkv@25%,streamingllm@25%", *csv = NULL, *json = NULL, *chart = NULL;
    const char *url = NULL, *api_key_env = NULL, *server_model = NULL, *pool_list = NULL;
    kvb_load_opts lo = {16, 0, 64, 1, 0, 0, 0, 0, 0, 1};
    int prompt_len = 1024, n_prompts = 0, stop_at_eos = 0, seed = 1;
    const char *dataset = NULL, *lb_config = NULL, *log_path = NULL;
    double duration_s = 0;
    const char *seqs_list = NULL;
    const char *decode_sizes = NULL;
    int n_decode = 32;
    cli_opt opts[] = {CLI_STR("--methods", &methods), CLI_INT("--clients", &lo.clients, 1, 4096),
                      CLI_INT("--requests", &lo.requests, 1, 1000000), CLI_INT("--prompt-len", &prompt_len, 16, 1 << 22),
                      CLI_INT("--max-new", &lo.max_new, 1, 1 << 20), CLI_STR("--kv-pool-mib", &pool_list),
                      CLI_STR("--pool-seqs", &seqs_list), CLI_INT("--max-batch", &lo.max_batch, 1, 4096),
                      CLI_INT("--prompts", &n_prompts, 1, 1 << 20), CLI_STR("--dataset", &dataset),
                      CLI_STR("--longbench-config", &lb_config), CLI_INT("--seed", &seed, 0, 1 << 30),
                      CLI_FLOAT("--duration", &duration_s, 0.001, 1e7), CLI_STR("--log-requests", &log_path),
                      CLI_INT("--page-tokens", &lo.page_tokens, 1, 1 << 16),
                      CLI_FLAG("--stop-at-eos", &stop_at_eos), CLI_STR("--csv", &csv), CLI_STR("--json", &json),
                      CLI_STR("--chart", &chart), CLI_STR("--url", &url), CLI_STR("--api-key-env", &api_key_env),
                      CLI_STR("--server-model", &server_model),
                      CLI_STR("--decode-only", &decode_sizes), CLI_INT("--n-decode", &n_decode, 1, 1 << 20), CLI_FLOAT("--rate", &lo.rate, 0.001, 1e6),
                      CLI_INT("--prefill-chunk", &lo.prefill_chunk, 1, 1 << 24),
                      CLI_ENGINE_OPTS(&eo), CLI_END};
    int stop = cli_parse("bench-serve", HELP, opts, 0, argc, argv, NULL);
    if (stop >= 0) return stop;
    lo.ignore_eos = !stop_at_eos;
    if (lo.requests == 0 && duration_s == 0) lo.requests = 64;
    char err[512];
    method_item items[32];
    int n_items = 0;
    if (parse_methods(methods, items, 32, &n_items, err, sizeof err)) return cli_fail("bench-serve: %s", err);
    long pools[16];
    int n_pools = 0;
    if (pool_list && parse_pools("--kv-pool-mib", pool_list, pools, 16, &n_pools, err, sizeof err))
        return cli_fail("bench-serve: %s", err);
    long seqs[16] = {4};
    int n_seqs = 1;
    if (seqs_list && parse_pools("--pool-seqs", seqs_list, seqs, 16, &n_seqs, err, sizeof err)) return cli_fail("bench-serve: %s", err);
    if (seqs_list && pool_list) return cli_fail("bench-serve: --kv-pool-mib and --pool-seqs both given; the pool is one or the other");
    if (url && (pool_list || seqs_list || lo.max_batch || lo.page_tokens || lo.prefill_chunk || decode_sizes))
        return cli_fail("bench-serve: --url measures the server as it was started: --kv-pool-mib, --pool-seqs, "
                        "--max-batch, --page-tokens, --prefill-chunk and --decode-only are the server's (kvbench serve) "
                        "or in-process only");
    if (!url && (api_key_env || server_model)) return cli_fail("bench-serve: --api-key-env and --server-model need --url");
    /* options that would change nothing here are refused by name, not ignored */
    static const char *const engine_only[] = {"--backend", "--kv-type", "--batch", "--prefill-gemm", "--cuda-kernels"};
    const char *o1;
    if (url && (o1 = first_given(argc, argv, engine_only, 5)))
        return cli_fail("bench-serve: %s is the server's with --url (kvbench serve takes it); here only the tokenizer runs", o1);
    static const char *const load_only[] = {"--methods", "--clients", "--requests", "--duration", "--rate", "--dataset",
                                            "--prompts", "--seed", "--max-new", "--stop-at-eos", "--log-requests",
                                            "--longbench-config", "--chart", "--csv", "--json", "--ctx"};
    if (decode_sizes && (o1 = first_given(argc, argv, load_only, 16)))
        return cli_fail("bench-serve: %s does not apply to --decode-only (batched decode steps of --prompt-len tokens, "
                        "--n-decode steps each)", o1);
    if (!decode_sizes && cli_given(argc, argv, "--n-decode")) return cli_fail("bench-serve: --n-decode needs --decode-only");
    if (!url && lo.rate > 0 && cli_given(argc, argv, "--clients"))
        return cli_fail("bench-serve: --clients with --rate: in process the open loop has no client count (arrivals "
                        "follow the rate; --max-batch bounds a step)");
    lo.seed = (uint64_t)seed;
    if (chart && n_pools < 2 && n_seqs < 2)
        return cli_fail("bench-serve: --chart needs several --kv-pool-mib or --pool-seqs sizes (e.g. 32,64,128 or 2,4,8)");
    if (!lo.max_batch) lo.max_batch = 64;
    if (!lo.page_tokens) lo.page_tokens = 16;
    int sizes[64], n_sizes = 0;
    for (const char *q = decode_sizes; q && *q && n_sizes < 64;) {
        char *end;
        long v = strtol(q, &end, 10);
        if (end == q || v < 1 || v > 4096 || (*end && *end != ','))
            return cli_fail("bench-serve: --decode-only expects batch sizes like 1,2,4,8, got '%s'", decode_sizes);
        sizes[n_sizes++] = (int)v;
        q = *end ? end + 1 : end;
    }
    if (decode_sizes && n_sizes == 0) return cli_fail("bench-serve: --decode-only expects batch sizes like 1,2,4,8");
    kvb_model *m = cli_load_model(&eo);
    if (!m) return 1;
    if (n_sizes) {
        printf("bench-serve --decode-only: %s, %d threads requested (0 = all usable)\n\n", m->path, eo.ctx.n_threads);
        err[0] = 0;
        int drc = decode_only(m, &eo, sizes, n_sizes, prompt_len, n_decode, err, sizeof err);
        kvb_model_free(m);
        return drc ? cli_fail("bench-serve: %s", err) : 0;
    }
    if (!m->tok) {
        kvb_model_free(m);
        return cli_fail("bench-serve: the model has no tokenizer (a synthetic model): the prompts need one");
    }
    const int n_ctx = eo.ctx.n_ctx > 0 ? eo.ctx.n_ctx : m->cfg.n_ctx_train;
    kvb_serve_set set;
    int rc = kvb_serve_dataset_load(m, dataset ? dataset : "niah", lb_config, n_ctx, lo.max_new, prompt_len, n_prompts,
                                    (uint64_t)seed, url != NULL, &set, err, sizeof err);
    if (rc) {
        kvb_model_free(m);
        return cli_fail("bench-serve: %s", err);
    }
    kvb_prompt *prompts = set.prompts;
    n_prompts = set.n;
    int64_t longest = 0, shortest = INT64_MAX;
    int most_new = 0, fewest_new = INT32_MAX;
    for (int i = 0; i < n_prompts; i++) {
        longest = prompts[i].n > longest ? prompts[i].n : longest;
        shortest = prompts[i].n < shortest ? prompts[i].n : shortest;
        most_new = set.max_new[i] > most_new ? set.max_new[i] : most_new;
        fewest_new = set.max_new[i] < fewest_new ? set.max_new[i] : fewest_new;
    }
    if (!rc && !url && longest + most_new > n_ctx)
        rc = (snprintf(err, sizeof err, "the longest prompt (%lld tokens) + --max-new %d exceeds the context %d (--ctx)",
                       (long long)longest, most_new, n_ctx), -1);
    /* the pools: --kv-pool-mib, or full attention's pages for --pool-seqs of the longest prompt + max-new */
    kvb_ctx *probe = NULL;
    if (!rc && !url) {
        kvb_ctx_params pp = eo.ctx;
        pp.n_ctx = 16;
        pp.n_batch = 1;
        probe = kvb_ctx_create(m, &pp, err, sizeof err);
        rc = probe ? 0 : -1;
    }
    kvp_pool pool;
    int64_t seq_bytes = 0, pool_bytes[16];
    if (!rc && !url) rc = kvp_init(&pool, 1L << 40, kvc_slot_bytes(probe->kv), lo.page_tokens, err, sizeof err);
    if (!rc && !url) {
        seq_bytes = kvp_full_pages(&pool, &m->cfg, longest + most_new) * pool.page_bytes;
        if (n_pools == 0)
            for (int k = 0; k < n_seqs; k++) pool_bytes[n_pools++] = seqs[k] * seq_bytes;
        else
            for (int k = 0; k < n_pools; k++) pool_bytes[k] = (int64_t)pools[k] << 20;
        /* admission promises full attention's pages for the prefill (judge/sched.h): a pool below one sequence
         * would refuse every request */
        for (int k = 0; k < n_pools && !rc; k++)
            if (pool_bytes[k] / pool.page_bytes * pool.page_bytes < seq_bytes)
                rc = (snprintf(err, sizeof err,
                               "--kv-pool-mib %.1f cannot hold one request (%lld prompt + %d new tokens need %.1f MiB of KV "
                               "under full attention while they prefill)",
                               pool_bytes[k] / 1048576.0, (long long)longest, most_new, seq_bytes / 1048576.0), -1);
    }
    if (url) n_pools = 1, pool_bytes[0] = 0;
    if (!rc) {
        char load[96], where[2400];
        if (lo.rate > 0) snprintf(load, sizeof load, "open loop at %.3g requests/s (Poisson, seeded)", lo.rate);
        else snprintf(load, sizeof load, "%d closed-loop clients", lo.clients);
        if (url) {
            char shown[1024]; /* without its userinfo (judge/redact.h) */
            kvb_url_strip_userinfo(url, shown, sizeof shown, NULL, 0, NULL, 0);
            snprintf(where, sizeof where, "server %s (prompts by %s's tokenizer)", shown, m->path);
        } else {
            snprintf(where, sizeof where, "%s, KV pool %.1f MiB%s (%.2f full-attention sequences of %lld tokens; pages of "
                     "%d tokens), max batch %d, %d threads, backend %s", m->path, pool_bytes[0] / 1048576.0,
                     n_pools > 1 ? " and more" : "", (double)pool_bytes[0] / seq_bytes, (long long)(longest + most_new),
                     lo.page_tokens, lo.max_batch, probe->be->n_threads, probe->be->name);
        }
        char until[96], skipped[96] = "";
        if (duration_s > 0 && lo.requests > 0) snprintf(until, sizeof until, "for %g s or %d requests", duration_s, lo.requests);
        else if (duration_s > 0) snprintf(until, sizeof until, "for %g s", duration_s);
        else snprintf(until, sizeof until, "%d requests", lo.requests);
        if (set.skipped || set.truncated)
            snprintf(skipped, sizeof skipped, " (%d cut by the benchmark's truncation, %d records skipped: too long)",
                     set.truncated, set.skipped);
        printf("bench-serve: %s, %s, %s, %d prompts of %s%s of %lld-%lld tokens, %d new tokens%s\n\n", where, load,
               until, n_prompts, set.name, skipped, (long long)shortest, (long long)longest, most_new,
               fewest_new < most_new ? " at most (each record's reply length)" : lo.ignore_eos ? "" : " at most");
    }
    kvb_ctx_free(probe);
    FILE *cf = NULL;
    request_log rl = {NULL, &set};
    if (!rc && log_path && !(rl.f = fopen(log_path, "w"))) rc = (snprintf(err, sizeof err, "cannot write %s", log_path), -1);
    const kvb_load_plan plan = {duration_s, set.max_new, rl.f ? log_request : NULL, &rl};
    if (!rc && csv && !(cf = fopen(csv, "w"))) rc = (snprintf(err, sizeof err, "cannot write %s", csv), -1);
    if (cf) kvb_load_csv_header(cf);
    cJSON *jrows = json ? cJSON_CreateArray() : NULL;
    double *tok_s = calloc((size_t)n_items * n_pools, sizeof *tok_s);
    if (!rc && (!tok_s || (json && !jrows))) rc = (snprintf(err, sizeof err, "out of memory"), -1);
    int any_failed = 0;
    for (int k = 0; k < n_pools && !rc; k++) {
        lo.pool_bytes = pool_bytes[k];
        if (n_pools > 1) printf("KV pool %.1f MiB:\n\n", pool_bytes[k] / 1048576.0);
        kvb_load_md_header(stdout);
        fflush(stdout);
        for (int i = 0; i < n_items && !rc; i++) {
            kvb_load_row r;
            if (url)
                rc = kvb_load_run_url_plan(url, api_key_env, server_model, items[i].name, items[i].budget_str, &lo, &plan,
                                           set.texts, n_prompts, &r, err, sizeof err);
            else
                rc = kvb_load_run_local_plan(m, &eo.ctx, items[i].name, &items[i].budget, NULL, &lo, &plan, prompts,
                                             n_prompts, &r, err, sizeof err);
            if (rc) break;
            snprintf(r.dataset, sizeof r.dataset, "%s", set.name);
            tok_s[(size_t)i * n_pools + k] = r.tok_s;
            kvb_load_md_row(stdout, items[i].name, items[i].budget_str, &r);
            fflush(stdout);
            if (r.failed || r.lost) {
                any_failed = 1;
                fprintf(stderr, "bench-serve: %s%s%s: %d of %d requests failed, %d lost; the first: %s\n", items[i].name,
                        strcmp(items[i].budget_str, "-") ? "@" : "", strcmp(items[i].budget_str, "-") ? items[i].budget_str : "",
                        r.failed, r.requests, r.lost, r.first_err);
            }
            if (r.requests == 0)
                fprintf(stderr, "bench-serve: %s: no request was sent within --duration %g s (the first arrival came later)\n",
                        items[i].name, duration_s);
            if (r.overdrafts > 0) fprintf(stderr, "bench-serve: %s: %lld sequences held more than promised\n", items[i].name, (long long)r.overdrafts);
            if (url && r.server_ok >= 0 && r.server_ok != r.ok)
                fprintf(stderr, "bench-serve: %s@%s: the server counted %lld completions over the run, the clients %d "
                        "(another client of the server?)\n", items[i].name, items[i].budget_str, (long long)r.server_ok, r.ok);
            if (cf) kvb_load_csv_row(cf, items[i].name, items[i].budget_str, &r);
            cJSON *jr = jrows ? kvb_load_row_json(items[i].name, items[i].budget_str, &r) : NULL;
            if (jrows && (!jr || !cJSON_AddItemToArray(jrows, jr))) rc = (snprintf(err, sizeof err, "out of memory"), -1);
        }
        if (n_pools > 1) putchar('\n');
    }
    if (cf && fclose(cf) && !rc) rc = (snprintf(err, sizeof err, "cannot write %s", csv), -1);
    if (rl.f && fclose(rl.f) && !rc) rc = (snprintf(err, sizeof err, "cannot write %s", log_path), -1);
    if (!rc && jrows) {
        char *text = cJSON_Print(jrows);
        FILE *jf = text ? fopen(json, "w") : NULL;
        if (!jf || fputs(text, jf) < 0 || fputc('\n', jf) < 0) rc = (snprintf(err, sizeof err, "cannot write %s", json), -1);
        if (jf && fclose(jf) && !rc) rc = (snprintf(err, sizeof err, "cannot write %s", json), -1);
        free(text);
    }
    if (!rc && n_pools > 1) {
        const char *names[32];
        char labels[32][170];
        double mib[16];
        for (int i = 0; i < n_items; i++) {
            if (strcmp(items[i].budget_str, "-")) snprintf(labels[i], sizeof labels[i], "%.127s@%.31s", items[i].name, items[i].budget_str);
            else snprintf(labels[i], sizeof labels[i], "%.127s", items[i].name);
            names[i] = labels[i];
        }
        for (int k = 0; k < n_pools; k++) mib[k] = pool_bytes[k] / 1048576.0;
        const char *path = chart ? chart : "throughput-vs-pool.svg";
        rc = kvb_serve_chart_write(path, names, n_items, mib, n_pools, tok_s, err, sizeof err);
        if (!rc) printf("chart: %s\n", path);
    }
    cJSON_Delete(jrows);
    free(tok_s);
    kvb_serve_set_free(&set);
    kvb_model_free(m);
    if (rc) return cli_fail("bench-serve: %s", err);
    return any_failed ? 1 : 0;
}
