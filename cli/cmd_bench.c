/* cmd_bench.c — `kvbench bench`: prefill and decode speed at several contexts, with llama.cpp's figures
 * from the same run beside ours when llama-cpp-python is installed (scripts/llamacpp_bench.py). Both
 * engines see the same token ids (id_i = 1000 + (i*7919) mod 40000), so the work is identical. A model without
 * a tokenizer (synthetic:<shape>) gets seeded random ids and no llama.cpp run. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "cli/cli.h"
#include "engine/sampler.h"
#include "engine/synthetic.h"

static const char *HELP =
    "usage: kvbench bench [--model PATH|default|synthetic:SHAPE] [--contexts 512,2048,8000] [-n 64] [--reps R]\n"
    "                     [--no-peer]\n"
    "\n"
    "For each context length: prefill a prompt of that many tokens, then decode N greedy tokens; prints\n"
    "prefill and decode tokens/s (best of R repetitions, default 1). Then runs llama.cpp on the same token\n"
    "ids with the same thread count and KV type (via scripts/llamacpp_bench.py, when llama-cpp-python is\n"
    "importable)\n"
    "and prints the ratios. --no-peer skips llama.cpp. --json FILE also writes the figures as JSON.\n"
    "\n"
    "options:\n"
    "  --contexts LIST        comma-separated prompt lengths (default 512,2048,8000)\n"
    "  --ctx-len N            one prompt length (the same as --contexts N)\n"
    "  -n N                   decode steps per context (default 64)\n"
    "  --reps R               repetitions, best kept (default 1)\n"
    "  --no-peer              do not run llama.cpp\n"
    "  --json FILE            write results as JSON\n"
    "  --profile              print the phase breakdown of the last context\n"
    "\n"
    "With --method M[,M...] it benchmarks KV-cache methods instead (see `kvbench bench --method all --help`).\n"
    "--model synthetic:SHAPE[?layers=N&seed=S&ctx=N] measures a model of that shape with seeded random F16\n"
    "weights and random token ids, without a weights file (shapes: llama3-8b, llama3.1-8b, qwen2.5-7b,\n"
    "smollm2-135m, tiny).\n"
    CLI_ENGINE_HELP;

enum { MAX_CTX = 16 };

typedef struct {
    long ctx;
    double prefill_tok_s, decode_tok_s;
    double peer_prefill_tok_s, peer_decode_tok_s;
} bench_row;

static int bench_one(kvb_model *m, const kvb_ctx_params *base, long n_prompt, long n_dec, int profile, bench_row *row) {
    char err[512];
    kvb_ctx_params p = *base;
    p.n_ctx = (int)(n_prompt + n_dec + 1);
    p.profile = profile;
    kvb_ctx *c = kvb_ctx_create(m, &p, err, sizeof err);
    if (!c) return cli_fail("bench: %s", err);
    int32_t *ids = malloc((size_t)n_prompt * sizeof *ids);
    if (!ids) {
        kvb_ctx_free(c);
        return cli_fail("bench: out of memory");
    }
    if (m->tok)
        for (long i = 0; i < n_prompt; i++) ids[i] = (int32_t)(1000 + (i * 7919) % 40000);
    else
        syn_random_ids(0, m->cfg.n_vocab, ids, n_prompt);
    kvb_session ses;
    kvb_rounds prompt = {.ids = ids, .n = n_prompt};
    kvb_gen_params gp = {.max_new = (int)n_dec + 1, .ignore_eos = 1}; /* n_dec decode steps */
    int rc = kvb_session_init(&ses, c, NULL, &gp, err, sizeof err) || kvb_rounds_chunk(&prompt, 0, err, sizeof err) ||
             kvb_session_prefill(&ses, &prompt, 0, err, sizeof err) || kvb_session_decode(&ses, err, sizeof err);
    double t_pre = ses.prefill_ms / 1e3, t_dec = ses.decode_ms / 1e3;
    kvb_session_free(&ses);
    free(prompt.round_end);
    if (rc) {
        free(ids);
        kvb_ctx_free(c);
        return cli_fail("bench: %s", err);
    }
    double pre = n_prompt / t_pre, dec = n_dec > 0 ? n_dec / t_dec : 0;
    if (pre > row->prefill_tok_s) row->prefill_tok_s = pre;
    if (dec > row->decode_tok_s) row->decode_tok_s = dec;
    if (profile) prof_print_table(c->prof, stderr);
    free(ids);
    kvb_ctx_free(c);
    return 0;
}

/* Run llama.cpp through its Python binding; fills peer figures. 0 = ran, 1 = unavailable (message printed). */
static int run_peer(const char *model_path, bench_row *rows, int n_rows, long n_dec, int n_threads, const char *kv) {
    char cmd[4096], list[512] = "";
    for (int i = 0; i < n_rows; i++) {
        size_t l = strlen(list);
        snprintf(list + l, sizeof list - l, "%s%ld", i ? "," : "", rows[i].ctx);
    }
    snprintf(cmd, sizeof cmd,
             "python3 '%s/scripts/llamacpp_bench.py' --model '%s' --ctx %s --n-decode %ld --threads %d --kv %s --json",
             cli_source_dir(), model_path, list, n_dec, n_threads, kv);
    FILE *p = popen(cmd, "r");
    if (!p) {
        fprintf(stderr, "llama.cpp: could not start python3\n");
        return 1;
    }
    size_t cap = 1 << 16, n = 0;
    char *out = malloc(cap);
    size_t got;
    while (out && (got = fread(out + n, 1, cap - 1 - n, p)) > 0) n += got;
    int status = pclose(p);
    if (!out) return 1;
    out[n] = 0;
    if (status != 0) {
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        if (code == 3)
            fprintf(stderr, "llama.cpp: not installed (`pip install llama-cpp-python` to compare in the same run)\n");
        else
            fprintf(stderr, "llama.cpp: scripts/llamacpp_bench.py failed (exit %d)\n", code);
        free(out);
        return 1;
    }
    cJSON *j = cJSON_Parse(out);
    free(out);
    cJSON *res = j ? cJSON_GetObjectItem(j, "results") : NULL;
    if (!cJSON_IsArray(res)) {
        fprintf(stderr, "llama.cpp: unreadable output from scripts/llamacpp_bench.py\n");
        cJSON_Delete(j);
        return 1;
    }
    cJSON *r;
    cJSON_ArrayForEach(r, res) {
        cJSON *ctx = cJSON_GetObjectItem(r, "ctx"), *pre = cJSON_GetObjectItem(r, "prefill_tok_s"),
              *dec = cJSON_GetObjectItem(r, "decode_tok_s");
        if (!cJSON_IsNumber(ctx) || !cJSON_IsNumber(pre) || !cJSON_IsNumber(dec)) continue;
        for (int i = 0; i < n_rows; i++)
            if (rows[i].ctx == (long)ctx->valuedouble) {
                rows[i].peer_prefill_tok_s = pre->valuedouble;
                rows[i].peer_decode_tok_s = dec->valuedouble;
            }
    }
    cJSON *ver = cJSON_GetObjectItem(j, "version"), *kv_j = cJSON_GetObjectItem(j, "kv");
    if (cJSON_IsString(ver))
        printf("llama.cpp peer: llama-cpp-python %s, KV %s\n", ver->valuestring,
               cJSON_IsString(kv_j) ? kv_j->valuestring : kv);
    cJSON_Delete(j);
    return 0;
}

int cmd_bench(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--method") || !strcmp(argv[i], "--methods")) return cmd_bench_methods(argc, argv);
    cli_engine_opts eo;
    cli_engine_defaults(&eo);
    const char *contexts = "512,2048,8000", *json_path = NULL;
    long n_dec = 64, reps = 1;
    int no_peer = 0, profile = 0;
    cli_opt opts[] = {CLI_FLAG("--no-peer", &no_peer), CLI_FLAG("--profile", &profile),
                      CLI_STR("--contexts", &contexts), CLI_STR("--ctx-len", &contexts), CLI_STR("--json", &json_path),
                      CLI_LONG("-n", &n_dec, 0, 100000), CLI_LONG("--reps", &reps, 1, 100), CLI_ENGINE_OPTS(&eo),
                      CLI_END};
    int stop = cli_parse("bench", HELP, opts, 0, argc, argv, NULL);
    if (stop >= 0) return stop;
    int peer = !no_peer;
    bench_row rows[MAX_CTX] = {0};
    int n_rows = 0;
    for (const char *s = contexts; *s;) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > 1 << 24 || (*end && *end != ',') || n_rows == MAX_CTX)
            return cli_fail("bench: --contexts expects up to %d comma-separated positive integers, got '%s'", MAX_CTX,
                            contexts);
        rows[n_rows++].ctx = v;
        s = *end ? end + 1 : end;
    }
    kvb_model *m = cli_load_model(&eo);
    if (!m) return 1;
    for (int i = 0; i < n_rows; i++)
        if (rows[i].ctx + n_dec + 1 > m->cfg.n_ctx_train && eo.ctx.n_ctx == 0) {
            int ctx_train = m->cfg.n_ctx_train; /* read before the model is freed */
            kvb_model_free(m);
            return cli_fail("bench: context %ld + %ld decode steps exceeds the model's context of %d", rows[i].ctx,
                            n_dec, ctx_train);
        }
    char err[512];
    kvb_backend *probe = kvb_backend_create(eo.ctx.backend, eo.ctx.n_threads, err, sizeof err);
    if (!probe) {
        kvb_model_free(m);
        return cli_fail("bench: %s", err);
    }
    int n_threads = probe->n_threads;
    const int on_gpu = probe->allocator != NULL;
    kvb_backend_free(probe);
    if (on_gpu) peer = 0; /* llama-cpp-python here is a CPU build: no like-for-like peer */
    const char *kv = eo.ctx.kv_dtype == KVB_F16 ? "f16" : "f32";
    printf("kvbench bench: %s, backend %s, %d threads, KV %s, decode %ld tokens, best of %ld\n", m->path,
           eo.ctx.backend, n_threads, kv, n_dec, reps);
    for (int i = 0; i < n_rows; i++) {
        for (long r = 0; r < reps; r++)
            if (bench_one(m, &eo.ctx, rows[i].ctx, n_dec, profile && i == n_rows - 1 && r == reps - 1, &rows[i])) {
                kvb_model_free(m);
                return 1;
            }
        printf("  ctx %6ld: prefill %8.1f tok/s, decode %7.1f tok/s\n", rows[i].ctx, rows[i].prefill_tok_s,
               rows[i].decode_tok_s);
        fflush(stdout);
    }
    if (peer && m->syn_weights) {
        fprintf(stderr, "llama.cpp: skipped (a synthetic model has no GGUF file for llama.cpp to load)\n");
        peer = 0;
    }
    int have_peer = peer && run_peer(m->path, rows, n_rows, n_dec, n_threads, kv) == 0;
    printf("\n| ctx | prefill tok/s | decode tok/s |");
    if (have_peer) printf(" llama.cpp prefill | llama.cpp decode | prefill ratio | decode ratio |");
    printf("\n|---:|---:|---:|%s\n", have_peer ? "---:|---:|---:|---:|" : "");
    for (int i = 0; i < n_rows; i++) {
        bench_row *b = &rows[i];
        printf("| %ld | %.1f | %.1f |", b->ctx, b->prefill_tok_s, b->decode_tok_s);
        if (have_peer && b->peer_prefill_tok_s > 0)
            printf(" %.1f | %.1f | %.2fx | %.2fx |", b->peer_prefill_tok_s, b->peer_decode_tok_s,
                   b->prefill_tok_s / b->peer_prefill_tok_s, b->decode_tok_s / b->peer_decode_tok_s);
        else if (have_peer)
            printf(" - | - | - | - |");
        printf("\n");
    }
    if (json_path) {
        FILE *f = fopen(json_path, "w");
        if (!f) {
            kvb_model_free(m);
            return cli_fail("bench: cannot write %s", json_path);
        }
        fprintf(f, "{\"engine\":\"kvbench\",\"threads\":%d,\"n_decode\":%ld,\"results\":[", n_threads, n_dec);
        for (int i = 0; i < n_rows; i++)
            fprintf(f, "%s{\"ctx\":%ld,\"prefill_tok_s\":%.3f,\"decode_tok_s\":%.3f,\"peer_prefill_tok_s\":%.3f,"
                       "\"peer_decode_tok_s\":%.3f}",
                    i ? "," : "", rows[i].ctx, rows[i].prefill_tok_s, rows[i].decode_tok_s, rows[i].peer_prefill_tok_s,
                    rows[i].peer_decode_tok_s);
        fprintf(f, "]}\n");
        fclose(f);
    }
    kvb_model_free(m);
    return 0;
}
