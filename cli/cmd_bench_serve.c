/* cmd_bench_serve.c — `kvbench bench-serve`: what a method buys a server. An in-process load generator drives the
 * continuous-batching scheduler (judge/sched.h) on a fixed KV pool: N closed-loop clients, each sending its next
 * request when the last one ends, replay needle-in-a-haystack prompts until a fixed number of requests is done;
 * one row per method@budget (docs/serving.md). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "benchmarks/loaders.h"
#include "benchmarks/prompt.h"
#include "cli/cli.h"
#include "engine/batch.h"
#include "judge/sched.h"
#include "methods/budget.h"

int cmd_bench_serve(int argc, char **argv);

static const char *HELP =
    "usage: kvbench bench-serve [--methods full,snapkv@25%,...] [--clients 16] [--requests 64]\n"
    "                           [--prompt-len 1024] [--max-new 64] [--kv-pool-mib N | --pool-seqs 4]\n"
    "                           [--max-batch 64] [--prompts 8] [--stop-at-eos] [--csv FILE] [engine options]\n"
    "\n"
    "Throughput of the engine as a server, per KV-cache method, at a fixed KV memory. --clients closed-loop clients\n"
    "replay --prompts needle-in-a-haystack prompts of about --prompt-len tokens (the needle at evenly spread\n"
    "depths) until --requests requests have ended, each generating --max-new tokens (--stop-at-eos: or fewer).\n"
    "Requests decode together, one batched forward step for all running sequences, on one KV pool of\n"
    "--kv-pool-mib MiB (default: room for --pool-seqs full-attention sequences of prompt + max-new tokens);\n"
    "a request waits until the pool can hold it (no preemption). One Markdown row per method@budget: requests/s,\n"
    "output tokens/s, TTFT and TPOT p50/p99, mean and max running sequences, pool occupancy, waits, lost requests.\n"
    "--csv FILE writes the same rows as CSV. Times are wall-clock on this machine (docs/serving.md).\n"
    "--rate R: open loop instead, Poisson arrivals at R requests/s (one seeded schedule for every method); TTFT\n"
    "counts from each request's arrival.\n"
    "\n"
    "options:\n"
    "  --methods LIST         method[@budget] items, comma-separated (default full,snapkv@25%,streamingllm@25%)\n"
    "  --page-tokens N        tokens per pool page per KV head (default 16)\n"
    "  --prefill-chunk N      prefill N tokens between two decode steps (default: a prompt's whole prefill)\n"
    "  --decode-only B,...    batched decode alone: for each batch size B, B sequences of --prompt-len tokens,\n"
    "                         then --n-decode (32) batched steps timed (scripts/llamacpp_batch_bench.py: llama.cpp's)\n"
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

/* what one run collects from its ended requests */
typedef struct {
    int n_done, n_ok, idle;
    double *ttft, *tpot;
    int n_ttft, n_tpot;
    int64_t out_tokens;
    double t_last_done;
    char first_err[384];
} collect;

static void on_done(void *user, const kvb_sched_result *r) {
    collect *c = user;
    c->n_done++;
    c->idle++;
    if (r->t_done > c->t_last_done) c->t_last_done = r->t_done;
    if (!r->ok) {
        if (!c->first_err[0]) snprintf(c->first_err, sizeof c->first_err, "%s", r->err);
        return;
    }
    c->n_ok++;
    c->out_tokens += r->n_gen;
    if (r->n_gen > 0) c->ttft[c->n_ttft++] = r->t_first - r->t_arrive;
    if (r->n_gen > 1) c->tpot[c->n_tpot++] = (r->t_last - r->t_first) / (r->n_gen - 1);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* nearest-rank percentile of v[0..n) (sorted here); NAN when empty */
static double pct(double *v, int n, double p) {
    if (n <= 0) return NAN;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int k = (int)ceil(p / 100.0 * n);
    return v[k < 1 ? 0 : k - 1];
}

typedef struct {
    int clients, requests, max_new, ignore_eos, max_batch, page_tokens;
    double rate; /* > 0: open loop, Poisson arrivals at this many requests/s (clients unused) */
    int prefill_chunk; /* prefill tokens between two decode steps (0 = the whole prompt) */
    int64_t pool_bytes;
} load_opts;

typedef struct {
    double wall_s, req_s, tok_s, step_tok_s, ttft50, ttft99, tpot50, tpot99, mean_seqs, pool_mean, pool_peak, held_mean;
    int ok, failed, lost, max_seqs;
    int64_t waits, overdrafts;
    char first_err[384];
} row;

static int run_one(kvb_model *m, const cli_engine_opts *eo, const method_item *mi, const load_opts *lo,
                   kvb_prompt *prompts, int n_prompts, row *out, char *err, size_t err_len) {
    kvb_sched_opts so;
    memset(&so, 0, sizeof so);
    so.model = m;
    so.ctx = eo->ctx;
    so.max_batch = lo->max_batch;
    so.pool_bytes = lo->pool_bytes;
    so.page_tokens = lo->page_tokens;
    so.prefill_chunk = lo->prefill_chunk;
    so.method = mi->name;
    so.budget = mi->budget;
    kvb_sched *s = kvb_sched_create(&so, err, err_len);
    if (!s) return -1;
    collect c;
    memset(&c, 0, sizeof c);
    c.idle = lo->clients;
    c.ttft = calloc((size_t)lo->requests, sizeof *c.ttft);
    c.tpot = calloc((size_t)lo->requests, sizeof *c.tpot);
    int rc = c.ttft && c.tpot ? 0 : (snprintf(err, err_len, "out of memory"), -1);
    int submitted = 0;
    const double t_start = kvb_sched_now(s);
    /* open loop: arrival times from a seeded exponential stream, the same schedule for every method */
    double *arrive = lo->rate > 0 ? calloc((size_t)lo->requests, sizeof *arrive) : NULL;
    if (lo->rate > 0 && !arrive && !rc) rc = (snprintf(err, err_len, "out of memory"), -1);
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    for (int i = 0; arrive && i < lo->requests; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        const double u = ((double)(rng >> 11) + 0.5) / 9007199254740992.0; /* (0, 1) */
        arrive[i] = (i ? arrive[i - 1] : t_start) - log(u) / lo->rate * 1e3;
    }
    if (arrive) c.idle = 0;
    while (!rc && c.n_done < lo->requests) {
        if (arrive) { /* the requests due by now; idle until the next when there is nothing to do */
            const double now = kvb_sched_now(s);
            c.idle = 0; /* (on_done counts ends as free clients: none here) */
            while (submitted + c.idle < lo->requests && arrive[submitted + c.idle] <= now) c.idle++;
            if (c.idle == 0 && kvb_sched_waiting(s) == 0 && kvb_sched_running(s) == 0) {
                if (submitted < lo->requests && arrive[submitted] > now)
                    usleep((useconds_t)((arrive[submitted] - now) * 1e3));
                continue;
            }
        }
        for (; c.idle > 0 && submitted < lo->requests; submitted++, c.idle--) {
            const kvb_prompt *p = &prompts[submitted % n_prompts];
            kvb_sched_req r;
            memset(&r, 0, sizeof r);
            r.id = submitted;
            r.ids = p->ids;
            r.n = (int)p->n;
            r.max_new = lo->max_new;
            r.ignore_eos = lo->ignore_eos;
            if (arrive) r.arrive_ms = arrive[submitted]; /* TTFT from the arrival, not from when the loop got to it */
            if (kvb_sched_submit(s, &r, err, err_len)) rc = -1;
            if (rc) break;
        }
        if (!rc) rc = kvb_sched_step(s, on_done, &c, err, err_len);
    }
    if (!rc) {
        kvb_sched_stats st;
        kvb_sched_get_stats(s, &st);
        memset(out, 0, sizeof *out);
        out->wall_s = (c.t_last_done - t_start) / 1e3;
        out->ok = c.n_ok;
        out->failed = c.n_done - c.n_ok;
        out->lost = lo->requests - c.n_done;
        out->req_s = out->wall_s > 0 ? c.n_ok / out->wall_s : 0;
        out->tok_s = out->wall_s > 0 ? c.out_tokens / out->wall_s : 0;
        /* the tokens the batched steps made per second of step time (prefills left out): batching's own gain */
        out->step_tok_s = st.decode_ms > 0 ? st.step_seqs / (st.decode_ms / 1e3) : 0;
        out->ttft50 = pct(c.ttft, c.n_ttft, 50);
        out->ttft99 = pct(c.ttft, c.n_ttft, 99);
        out->tpot50 = pct(c.tpot, c.n_tpot, 50);
        out->tpot99 = pct(c.tpot, c.n_tpot, 99);
        out->mean_seqs = st.decode_ms > 0 ? st.running_ms / st.decode_ms : 0;
        out->max_seqs = st.max_running;
        out->pool_mean = st.pool_pages && st.decode_ms > 0 ? 100.0 * st.reserved_page_ms / st.decode_ms / st.pool_pages : NAN;
        out->held_mean = st.pool_pages && st.decode_ms > 0 ? 100.0 * st.held_page_ms / st.decode_ms / st.pool_pages : NAN;
        out->pool_peak = st.pool_pages ? 100.0 * st.peak_reserved / st.pool_pages : NAN;
        out->waits = st.waits;
        out->overdrafts = st.overdrafts;
        snprintf(out->first_err, sizeof out->first_err, "%s", c.first_err);
    }
    free(arrive);
    free(c.ttft);
    free(c.tpot);
    kvb_sched_free(s);
    return rc;
}

/* The needle prompts: n depths spread over [0, 100] at one context length, built as the NIAH suite builds them
 * (chat template, official layout). */
static int make_prompts(kvb_model *m, int prompt_len, int n, kvb_prompt *out, char *err, size_t err_len) {
    double *depths = calloc((size_t)n, sizeof *depths);
    if (!depths) return snprintf(err, err_len, "out of memory"), -1;
    niah_linspace_round(0, 100, n, depths);
    kvb_samples ss = {0};
    int len = prompt_len + 200; /* the generator keeps 200 tokens of a length for the question and the answer */
    int rc = niah_generate(NULL, &len, 1, depths, n, NULL, NULL, NULL, kvb_count_tokens, m, &ss, err, err_len);
    free(depths);
    for (int i = 0; i < ss.n && !rc; i++) rc = kvb_prompt_build(m, &ss.v[i], (int64_t)prompt_len + 512, 0, &out[i], err, err_len);
    kvb_samples_free(&ss);
    return rc;
}

/* --decode-only: batched decode alone, as scripts/llamacpp_batch_bench.py measures llama.cpp's: for each batch
 * size B, B contexts prefilled with ctx_len ids 1000 + ((i + 131 b) * 7919) % 40000 (sequence b; modulo a smaller
 * vocabulary), then n_decode batched steps of one token each, timed. */
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
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (int s = 0; s < n_decode && !rc; s++) {
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

static void print_cell(FILE *f, double v, const char *fmt) {
    if (isnan(v)) fprintf(f, " - |");
    else {
        fputc(' ', f);
        fprintf(f, fmt, v);
        fputs(" |", f);
    }
}

int cmd_bench_serve(int argc, char **argv) {
    cli_engine_opts eo;
    cli_engine_defaults(&eo);
    const char *methods = "full,snapkv@25%,streamingllm@25%", *csv = NULL;
    load_opts lo = {16, 64, 64, 1, 64, 16, 0, 0, 0};
    int prompt_len = 1024, n_prompts = 8, pool_seqs = 4, stop_at_eos = 0;
    long pool_mib = 0;
    const char *decode_sizes = NULL;
    int n_decode = 32;
    cli_opt opts[] = {CLI_STR("--methods", &methods), CLI_INT("--clients", &lo.clients, 1, 4096),
                      CLI_INT("--requests", &lo.requests, 1, 1000000), CLI_INT("--prompt-len", &prompt_len, 16, 1 << 22),
                      CLI_INT("--max-new", &lo.max_new, 1, 1 << 20), CLI_LONG("--kv-pool-mib", &pool_mib, 1, 1L << 30),
                      CLI_INT("--pool-seqs", &pool_seqs, 1, 1 << 20), CLI_INT("--max-batch", &lo.max_batch, 1, 4096),
                      CLI_INT("--prompts", &n_prompts, 1, 1024), CLI_INT("--page-tokens", &lo.page_tokens, 1, 1 << 16),
                      CLI_FLAG("--stop-at-eos", &stop_at_eos), CLI_STR("--csv", &csv),
                      CLI_STR("--decode-only", &decode_sizes), CLI_INT("--n-decode", &n_decode, 1, 1 << 20), CLI_FLOAT("--rate", &lo.rate, 0.001, 1e6),
                      CLI_INT("--prefill-chunk", &lo.prefill_chunk, 1, 1 << 24),
                      CLI_ENGINE_OPTS(&eo), CLI_END};
    int stop = cli_parse("bench-serve", HELP, opts, 0, argc, argv, NULL);
    if (stop >= 0) return stop;
    lo.ignore_eos = !stop_at_eos;
    char err[512];
    method_item items[32];
    int n_items = 0;
    if (parse_methods(methods, items, 32, &n_items, err, sizeof err)) return cli_fail("bench-serve: %s", err);
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
    kvb_prompt *prompts = calloc((size_t)n_prompts, sizeof *prompts);
    int rc = prompts ? make_prompts(m, prompt_len, n_prompts, prompts, err, sizeof err) : -1;
    if (!prompts) snprintf(err, sizeof err, "out of memory");
    int64_t longest = 0;
    for (int i = 0; i < n_prompts && !rc; i++) longest = prompts[i].n > longest ? prompts[i].n : longest;
    const int n_ctx = eo.ctx.n_ctx > 0 ? eo.ctx.n_ctx : m->cfg.n_ctx_train;
    if (!rc && longest + lo.max_new > n_ctx)
        rc = (snprintf(err, sizeof err, "the longest prompt (%lld tokens) + --max-new %d exceeds the context %d (--ctx)",
                       (long long)longest, lo.max_new, n_ctx), -1);
    /* the pool: --kv-pool-mib, or full attention's pages for --pool-seqs of the longest prompt + max-new */
    kvb_ctx *probe = NULL;
    if (!rc) {
        kvb_ctx_params pp = eo.ctx;
        pp.n_ctx = 16;
        pp.n_batch = 1;
        probe = kvb_ctx_create(m, &pp, err, sizeof err);
        rc = probe ? 0 : -1;
    }
    kvp_pool pool;
    if (!rc) rc = kvp_init(&pool, 1L << 40, kvc_slot_bytes(probe->kv), lo.page_tokens, err, sizeof err);
    int64_t seq_bytes = 0;
    if (!rc) {
        seq_bytes = kvp_full_pages(&pool, &m->cfg, longest + lo.max_new) * pool.page_bytes;
        lo.pool_bytes = pool_mib > 0 ? (int64_t)pool_mib << 20 : pool_seqs * seq_bytes;
        /* admission promises full attention's pages for the prefill (judge/sched.h): a pool below one sequence
         * would refuse every request */
        if (lo.pool_bytes / pool.page_bytes * pool.page_bytes < seq_bytes)
            rc = (snprintf(err, sizeof err,
                           "--kv-pool-mib %ld cannot hold one request (%lld prompt + %d new tokens need %.1f MiB of KV "
                           "under full attention while they prefill)",
                           pool_mib, (long long)longest, lo.max_new, seq_bytes / 1048576.0), -1);
    }
    if (!rc) {
        char load[96];
        if (lo.rate > 0) snprintf(load, sizeof load, "open loop at %.3g requests/s (Poisson, seeded)", lo.rate);
        else snprintf(load, sizeof load, "%d closed-loop clients", lo.clients);
        printf("bench-serve: %s, %s, %d requests, %d needle prompts of %lld-%lld tokens, %d new tokens%s, "
               "KV pool %.1f MiB (%.2f full-attention sequences of %lld tokens; pages of %d tokens), max batch %d, "
               "%d threads, backend %s\n\n",
               m->path, load, lo.requests, n_prompts, (long long)prompts[0].n, (long long)longest, lo.max_new,
               lo.ignore_eos ? "" : " at most", lo.pool_bytes / 1048576.0, (double)lo.pool_bytes / seq_bytes,
               (long long)(longest + lo.max_new), lo.page_tokens, lo.max_batch, probe->be->n_threads, probe->be->name);
    }
    kvb_ctx_free(probe);
    FILE *cf = NULL;
    if (!rc && csv && !(cf = fopen(csv, "w"))) rc = (snprintf(err, sizeof err, "cannot write %s", csv), -1);
    if (cf)
        fputs("method,budget,requests,ok,failed,lost,wall_s,requests_per_s,output_tokens_per_s,step_tokens_per_s,ttft_p50_ms,ttft_p99_ms,"
              "tpot_p50_ms,tpot_p99_ms,mean_seqs,max_seqs,pool_promised_mean_pct,pool_promised_peak_pct,"
              "pool_held_mean_pct,waits,overdrafts\n", cf);
    if (!rc) {
        puts("| method | budget | ok/requests | lost | req/s | out tok/s | step tok/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | "
             "TPOT p99 ms | mean seqs | max seqs | pool promised mean / peak % | pool held mean % | waits |");
        puts("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
        fflush(stdout);
    }
    for (int i = 0; i < n_items && !rc; i++) {
        row r;
        rc = run_one(m, &eo, &items[i], &lo, prompts, n_prompts, &r, err, sizeof err);
        if (rc) break;
        printf("| %s | %s | %d/%d | %d |", items[i].name, items[i].budget_str, r.ok, lo.requests, r.lost);
        print_cell(stdout, r.req_s, "%.2f");
        print_cell(stdout, r.tok_s, "%.1f");
        print_cell(stdout, r.step_tok_s, "%.1f");
        print_cell(stdout, r.ttft50, "%.0f");
        print_cell(stdout, r.ttft99, "%.0f");
        print_cell(stdout, r.tpot50, "%.1f");
        print_cell(stdout, r.tpot99, "%.1f");
        print_cell(stdout, r.mean_seqs, "%.2f");
        printf(" %d |", r.max_seqs);
        if (isnan(r.pool_mean)) printf(" - |");
        else printf(" %.0f / %.0f |", r.pool_mean, r.pool_peak);
        print_cell(stdout, r.held_mean, "%.0f");
        printf(" %lld |\n", (long long)r.waits);
        fflush(stdout);
        if (r.failed) fprintf(stderr, "bench-serve: %s: %d requests failed; the first: %s\n", items[i].name, r.failed, r.first_err);
        if (r.overdrafts) fprintf(stderr, "bench-serve: %s: %lld sequences held more than promised\n", items[i].name, (long long)r.overdrafts);
        if (cf)
            fprintf(cf, "%s,%s,%d,%d,%d,%d,%.3f,%.4f,%.2f,%.2f,%.1f,%.1f,%.2f,%.2f,%.3f,%d,%.1f,%.1f,%.1f,%lld,%lld\n",
                    items[i].name, items[i].budget_str, lo.requests, r.ok, r.failed, r.lost, r.wall_s, r.req_s, r.tok_s, r.step_tok_s,
                    r.ttft50, r.ttft99, r.tpot50, r.tpot99, r.mean_seqs, r.max_seqs, r.pool_mean, r.pool_peak,
                    r.held_mean, (long long)r.waits, (long long)r.overdrafts);
    }
    if (cf && fclose(cf) && !rc) rc = (snprintf(err, sizeof err, "cannot write %s", csv), -1);
    for (int i = 0; prompts && i < n_prompts; i++) kvb_prompt_free(&prompts[i]);
    free(prompts);
    kvb_model_free(m);
    return rc ? cli_fail("bench-serve: %s", err) : 0;
}
