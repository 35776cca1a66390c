/* serve_suite.c — a suite's "serve" block, and the needle prompts of bench-serve (serve_suite.h). */
#include "benchmarks/serve_suite.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/fsutil.h"
#include "benchmarks/jsonl.h"
#include "benchmarks/loaders.h"
#include "engine/kvcache.h"
#include "engine/kvpool.h"
#include "methods/opts.h"

#define ERR(...) (snprintf(err, err_len, __VA_ARGS__), -1)

int kvb_serve_needle_prompts(kvb_model *m, int prompt_len, int n, kvb_prompt *out, kvb_load_text *texts, char *err,
                             size_t err_len) {
    double *depths = calloc((size_t)n, sizeof *depths);
    if (!depths) return ERR("out of memory");
    niah_linspace_round(0, 100, n, depths);
    kvb_samples ss = {0};
    int len = prompt_len + 200; /* the generator keeps 200 tokens of a length for the question and the answer */
    int rc = niah_generate(NULL, &len, 1, depths, n, NULL, NULL, NULL, kvb_count_tokens, m, &ss, err, err_len);
    free(depths);
    for (int i = 0; i < ss.n && !rc; i++) {
        rc = kvb_prompt_build(m, &ss.v[i], (int64_t)prompt_len + 512, 0, &out[i], err, err_len);
        if (!rc && texts) {
            texts[i].system = ss.v[i].system ? strdup(ss.v[i].system) : NULL;
            texts[i].user = strdup(ss.v[i].prompt ? ss.v[i].prompt : "");
            if (!texts[i].user || (ss.v[i].system && !texts[i].system)) rc = ERR("out of memory");
        }
    }
    kvb_samples_free(&ss);
    return rc;
}

void kvb_serve_texts_free(kvb_load_text *texts, int n) {
    for (int i = 0; texts && i < n; i++) free((char *)texts[i].system), free((char *)texts[i].user);
}

int64_t kvb_serve_seq_bytes(kvb_model *m, const kvb_ctx_params *cp, int page_tokens, int64_t n_tokens, char *err,
                            size_t err_len) {
    kvb_ctx_params pp = *cp;
    pp.n_ctx = 16;
    pp.n_batch = 1;
    pp.kv_reserve = 0;
    kvb_ctx *probe = kvb_ctx_create(m, &pp, err, err_len);
    if (!probe) return -1;
    kvp_pool pool;
    int64_t bytes = -1;
    if (!kvp_init(&pool, 1L << 40, kvc_slot_bytes(probe->kv), page_tokens, err, err_len))
        bytes = kvp_full_pages(&pool, &m->cfg, n_tokens) * pool.page_bytes;
    kvb_ctx_free(probe);
    return bytes;
}

static const char *const INTS[] = {"clients", "requests", "prompt_len", "max_new", "prompts", "pool_seqs", "max_batch",
                                   "page_tokens", "prefill_chunk"};
static const double INT_LO[] = {1, 1, 16, 1, 1, 1, 1, 1, 0}, INT_HI[] = {4096, 1000000, 1 << 22, 1 << 20, 1024, 1 << 20, 4096, 1 << 16, 1 << 24};

int kvb_serve_suite_check(const cJSON *suite, const char *path, char *err, size_t err_len) {
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(suite, "serve"), *v;
    if (!b) return 0;
    if (!cJSON_IsObject(b)) return ERR("suite %s: \"serve\" must be an object (docs/serving.md)", path);
    cJSON_ArrayForEach(v, b) {
        size_t k = 0;
        while (k < sizeof INTS / sizeof *INTS && strcmp(v->string, INTS[k])) k++;
        if (k < sizeof INTS / sizeof *INTS) {
            if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < INT_LO[k] || v->valuedouble > INT_HI[k])
                return ERR("suite %s: serve.%s must be an integer in [%.0f, %.0f]", path, v->string, INT_LO[k], INT_HI[k]);
        } else if (!strcmp(v->string, "rate")) {
            if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e6)
                return ERR("suite %s: serve.rate must be a number of requests/s in [0, 1e6] (0 = closed loop)", path);
        } else if (!strcmp(v->string, "kv_pool_mib")) {
            const cJSON *x;
            int n = 0, bad = !(cJSON_IsNumber(v) || (cJSON_IsArray(v) && cJSON_GetArraySize(v) >= 1 && cJSON_GetArraySize(v) <= 16));
            if (cJSON_IsNumber(v)) bad = v->valuedouble < 1 || v->valuedouble > 1 << 30;
            else if (cJSON_IsArray(v))
                cJSON_ArrayForEach(x, v) bad |= !cJSON_IsNumber(x) || x->valuedouble < 1 || x->valuedouble > 1 << 30, n++;
            if (bad) return ERR("suite %s: serve.kv_pool_mib must be a size in MiB or an array of 1 to 16 sizes", path);
        } else {
            return ERR("suite %s: serve: unknown member \"%s\" (known: clients, requests, prompt_len, max_new, prompts, "
                       "pool_seqs, kv_pool_mib, rate, max_batch, page_tokens, prefill_chunk)", path, v->string);
        }
    }
    if (cJSON_GetObjectItemCaseSensitive(b, "pool_seqs") && cJSON_GetObjectItemCaseSensitive(b, "kv_pool_mib"))
        return ERR("suite %s: serve: pool_seqs and kv_pool_mib both given; the pool is one or the other", path);
    return 0;
}

/* 1 when serve.jsonl already holds the row of (method, budget, pool). */
static int row_done(const char *text, const char *method, const char *budget, double pool_mib) {
    for (const char *p = text; p && *p;) {
        const char *nl = strchr(p, '\n');
        if (!nl) break; /* a torn last line: the cell runs again */
        char *line = strndup(p, (size_t)(nl - p));
        cJSON *j = line ? cJSON_Parse(line) : NULL;
        free(line);
        const char *m = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "method"));
        const char *b = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "budget"));
        const cJSON *pm = cJSON_GetObjectItemCaseSensitive(j, "pool_mib");
        int hit = m && b && !strcmp(m, method) && !strcmp(b, budget) && cJSON_IsNumber(pm) && fabs(pm->valuedouble - pool_mib) < 1e-3;
        cJSON_Delete(j);
        if (hit) return 1;
        p = nl + 1;
    }
    return 0;
}

int kvb_serve_suite_run(const cJSON *suite, const char *path, kvb_model *m, const kvb_ctx_params *cp,
                        const kvb_cells *cs, const char *out_dir, FILE *log, char *err, size_t err_len) {
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(suite, "serve");
    if (!b) return 0;
    if (kvb_serve_suite_check(suite, path, err, err_len)) return -1;
    if (!m->tok) return ERR("suite %s: serve: the model has no tokenizer", path);
#define NUM(k, d) (cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(b, k)) ? cJSON_GetObjectItemCaseSensitive(b, k)->valuedouble : (d))
    kvb_load_opts lo = {(int)NUM("clients", 16), (int)NUM("requests", 32), (int)NUM("max_new", 64), 1, NUM("rate", 0),
                        (int)NUM("max_batch", 64), (int)NUM("page_tokens", 16), (int)NUM("prefill_chunk", 0), 0,
                        (uint64_t)kvb_json_num(suite, "seed", 1)}; /* the open loop's schedule: the suite's seed */
    const int prompt_len = (int)NUM("prompt_len", 1024), n_prompts = (int)NUM("prompts", 8), pool_seqs = (int)NUM("pool_seqs", 4);
#undef NUM
    kvb_prompt *prompts = calloc((size_t)n_prompts, sizeof *prompts);
    if (!prompts) return ERR("out of memory");
    int rc = kvb_serve_needle_prompts(m, prompt_len, n_prompts, prompts, NULL, err, err_len);
    int64_t longest = 0;
    for (int i = 0; !rc && i < n_prompts; i++) longest = prompts[i].n > longest ? prompts[i].n : longest;
    const int n_ctx = cp->n_ctx > 0 ? cp->n_ctx : m->cfg.n_ctx_train;
    if (!rc && longest + lo.max_new > n_ctx)
        rc = ERR("suite %s: serve: prompts of %lld tokens + max_new %d exceed the context %d", path, (long long)longest,
                 lo.max_new, n_ctx);
    int64_t seq_bytes = rc ? -1 : kvb_serve_seq_bytes(m, cp, lo.page_tokens, longest + lo.max_new, err, err_len);
    if (seq_bytes < 0) rc = -1;
    int64_t pools[16];
    int n_pools = 0;
    const cJSON *pm = cJSON_GetObjectItemCaseSensitive(b, "kv_pool_mib"), *x;
    if (!pm) pools[n_pools++] = pool_seqs * seq_bytes;
    else if (cJSON_IsNumber(pm)) pools[n_pools++] = (int64_t)(pm->valuedouble * 1048576.0);
    else cJSON_ArrayForEach(x, pm) pools[n_pools++] = (int64_t)(x->valuedouble * 1048576.0);
    for (int k = 0; !rc && k < n_pools; k++)
        if (pools[k] < seq_bytes)
            rc = ERR("suite %s: serve: a pool of %.1f MiB cannot hold one request (%.1f MiB of KV under full attention)",
                     path, pools[k] / 1048576.0, seq_bytes / 1048576.0);
    char *file = rc ? NULL : kvb_path_join(out_dir, "serve.jsonl");
    if (!rc && !file) rc = ERR("out of memory");
    char *done = NULL;
    if (!rc && access(file, F_OK) == 0 && !(done = kvb_read_file(file, NULL, err, err_len))) rc = -1;
    int fd = rc ? -1 : kvb_open_regular(file, O_WRONLY | O_CREAT | O_APPEND, 0644, err, err_len);
    if (!rc && fd < 0) rc = -1;
    for (int k = 0; !rc && k < n_pools; k++)
        for (int i = 0; !rc && i < cs->n; i++) {
            const kvb_run_cell *cl = &cs->v[i];
            /* the pool as the row records it: whole pages, as the scheduler counts it */
            const double pool_mib = pools[k] / 1048576.0;
            if (done && row_done(done, cl->method, cl->budget_str, pool_mib)) continue;
            kvb_opts o = {0};
            if (kvb_opts_add_json(&o, cl->opts, cl->method, err, err_len)) {
                rc = -1;
                break;
            }
            lo.pool_bytes = pools[k];
            kvb_load_row r;
            if (kvb_load_run_local(m, cp, cl->method, &cl->budget, &o, &lo, prompts, n_prompts, &r, err, err_len)) {
                rc = -1;
                break;
            }
            cJSON *j = kvb_load_row_json(cl->method, cl->budget_str, &r);
            if (j) cJSON_ReplaceItemInObjectCaseSensitive(j, "pool_mib", cJSON_CreateNumber(pool_mib));
            if (j) cJSON_AddNumberToObject(j, "prompt_len", prompt_len), cJSON_AddNumberToObject(j, "max_new", lo.max_new),
                   cJSON_AddNumberToObject(j, "clients", lo.clients);
            char *line = j ? cJSON_PrintUnformatted(j) : NULL;
            cJSON_Delete(j);
            if (!line) {
                rc = ERR("out of memory");
                break;
            }
            size_t n = strlen(line);
            line[n] = '\n'; /* the terminator becomes the newline: one write per row */
            if (write(fd, line, n + 1) != (ssize_t)(n + 1) || fsync(fd)) rc = ERR("%s: %s", file, strerror(errno));
            free(line);
            if (log)
                fprintf(log, "serve %s@%s, pool %.1f MiB: %d/%d requests, %.1f output tokens/s, mean %.2f sequences\n",
                        cl->method, cl->budget_str, pool_mib, r.ok, r.requests, r.tok_s, r.mean_seqs);
            if (log && (r.failed || r.lost)) /* in the row and the report, never dropped */
                fprintf(log, "serve %s@%s: %d of %d requests failed, %d lost; the first: %s\n", cl->method,
                        cl->budget_str, r.failed, r.requests, r.lost, r.first_err);
        }
    if (fd >= 0) close(fd);
    free(done);
    free(file);
    for (int i = 0; i < n_prompts; i++) kvb_prompt_free(&prompts[i]);
    free(prompts);
    return rc;
}
