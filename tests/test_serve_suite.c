/* test_serve_suite.c — a suite's "serve" block (benchmarks/serve_suite.h, reports/serve_rows.h) as a user runs it
 * (the binary from KVB_BIN), on a tiny random-weight model with one token per byte: `kvbench run` writes the
 * accuracy records and, after them, a throughput row per method@budget and pool size in serve.jsonl, every request
 * completed, each row's output tokens = requests x max_new; report.md carries a "Serving throughput" table with
 * those rows, serve.csv the same rows, and with two pool sizes the throughput-vs-pool chart; a resumed run does not
 * run a recorded row again; `kvbench compare` of the run against itself passes and against a baseline twice as fast
 * fails naming the rows; a sharded run does the block in shard 0 and `kvbench merge` carries its rows; a malformed
 * block is one line and exit 1 before anything runs. */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util_common.h"
#include "util_gguf_writer.h"

enum { REQS = 3, MAX_NEW = 3 };

static char tmpdir[64] = "/tmp/kvb_ssuite_XXXXXX", model[128], suite[160], run_dir[160], base_dir[160], out_path[160],
            err_path[160];
static const char *bin;

static int sh(const char *fmt, const char *a, const char *b) {
    char cmd[2048], what[1024];
    snprintf(what, sizeof what, fmt, a, b);
    snprintf(cmd, sizeof cmd, "%s %s >%s 2>%s", bin, what, out_path, err_path);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static int count(const char *text, const char *what) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, what)); p += strlen(what)) n++;
    return n;
}

static void write_suite(const char *serve) {
    FILE *f = fopen(suite, "w");
    CU_ASSERT_FATAL(f != NULL);
    fprintf(f, "{\"name\": \"serve-test\", \"seed\": 1, \"methods\": [{\"name\": \"full\"}, {\"name\": \"snapkv\"}], \"budgets\": [\"50%%\"],\n"
               " \"benchmarks\": [{\"type\": \"niah\", \"lengths\": [320], \"depths\": [50]}],\n"
               " \"serve\": %s}\n", serve);
    fclose(f);
}

static void test_a_run_carries_throughput_rows_into_its_report(void) {
    char serve[256];
    snprintf(serve, sizeof serve, "{\"clients\": 2, \"requests\": %d, \"prompt_len\": 120, \"max_new\": %d, \"prompts\": 1, "
                                  "\"kv_pool_mib\": [1, 2]}", REQS, MAX_NEW);
    write_suite(serve);
    char args[512];
    snprintf(args, sizeof args, "run %s --model %s --threads 1 --quiet --out %s", suite, model, run_dir);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s >%s 2>%s", bin, args, out_path, err_path);
    int rc = system(cmd);
    char *e = util_read_file(err_path, NULL);
    if (rc) fprintf(stderr, "\n  run: %s", e ? e : "");
    CU_ASSERT_FATAL(rc == 0);
    free(e);
    char path[256];
    snprintf(path, sizeof path, "%s/serve.jsonl", run_dir);
    char *jl = util_read_file(path, NULL);
    CU_ASSERT_FATAL(jl != NULL);
    CU_ASSERT(count(jl, "\n") == 4); /* 2 cells x 2 pools */
    int rows = 0;
    for (char *p = jl, *nl; p && *p; p = nl ? nl + 1 : NULL) {
        nl = strchr(p, '\n');
        if (nl) *nl = 0;
        cJSON *j = cJSON_Parse(p);
        CU_ASSERT_FATAL(j != NULL);
        CU_ASSERT(cJSON_GetObjectItem(j, "ok")->valueint == REQS && cJSON_GetObjectItem(j, "failed")->valueint == 0);
        CU_ASSERT(cJSON_GetObjectItem(j, "output_tokens")->valueint == REQS * MAX_NEW);
        const double pool = cJSON_GetObjectItem(j, "pool_mib")->valuedouble;
        CU_ASSERT(pool == 1 || pool == 2);
        rows++;
        cJSON_Delete(j);
    }
    CU_ASSERT(rows == 4);
    free(jl);
    snprintf(path, sizeof path, "%s/report.md", run_dir);
    char *md = util_read_file(path, NULL);
    CU_ASSERT_FATAL(md != NULL);
    char want[96];
    snprintf(want, sizeof want, "| %d/%d | 0 | 0 |", REQS, REQS);
    CU_ASSERT(strstr(md, "## Serving throughput") && count(md, want) == 4);
    CU_ASSERT(strstr(md, "| full | full | 1.0 |") && strstr(md, "| snapkv | 50% | 2.0 |"));
    CU_ASSERT(strstr(md, "throughput-vs-pool.svg") != NULL);
    free(md);
    snprintf(path, sizeof path, "%s/serve.csv", run_dir);
    char *csv = util_read_file(path, NULL);
    CU_ASSERT(csv && count(csv, "\n") == 5 && strstr(csv, "\nsnapkv,50%,1,3,3,0,0,"));
    free(csv);
    snprintf(path, sizeof path, "%s/throughput-vs-pool.svg", run_dir);
    char *svg = util_read_file(path, NULL);
    CU_ASSERT(svg && strstr(svg, "</svg>") && strstr(svg, ">full<") && strstr(svg, ">snapkv@50%<"));
    free(svg);
    /* resumed: nothing runs again, the rows stay four */
    snprintf(cmd, sizeof cmd, "%s %s >%s 2>%s", bin, args, out_path, err_path);
    CU_ASSERT(system(cmd) == 0);
    e = util_read_file(err_path, NULL);
    CU_ASSERT(e && !strstr(e, "serve full@"));
    free(e);
    snprintf(path, sizeof path, "%s/serve.jsonl", run_dir);
    jl = util_read_file(path, NULL);
    CU_ASSERT(jl && count(jl, "\n") == 4);
    free(jl);
}

static void test_compare_diffs_the_throughput_rows(void) {
    CU_ASSERT(sh("compare %s %s", run_dir, run_dir) == 0);
    char *o = util_read_file(out_path, NULL);
    CU_ASSERT(o && strstr(o, "### Serving throughput") && strstr(o, "0 throughput regression(s) in 4 matched row(s)"));
    free(o);
    /* a baseline twice as fast: every row is a regression at the default tolerance */
    char cmd[1024], path[256];
    snprintf(cmd, sizeof cmd, "cp -r %s %s", run_dir, base_dir);
    CU_ASSERT_FATAL(system(cmd) == 0);
    snprintf(path, sizeof path, "%s/serve.jsonl", base_dir);
    char *jl = util_read_file(path, NULL);
    CU_ASSERT_FATAL(jl != NULL);
    FILE *f = fopen(path, "w");
    CU_ASSERT_FATAL(f != NULL);
    for (char *p = jl, *nl; p && *p; p = nl ? nl + 1 : NULL) {
        nl = strchr(p, '\n');
        if (nl) *nl = 0;
        cJSON *j = cJSON_Parse(p);
        cJSON *t = cJSON_GetObjectItem(j, "output_tokens_per_s");
        cJSON_SetNumberValue(t, t->valuedouble * 2);
        char *s = cJSON_PrintUnformatted(j);
        fprintf(f, "%s\n", s);
        free(s);
        cJSON_Delete(j);
    }
    fclose(f);
    free(jl);
    CU_ASSERT(sh("compare %s %s", base_dir, run_dir) == 1);
    o = util_read_file(out_path, NULL);
    CU_ASSERT(o && strstr(o, "4 throughput regression(s) in 4 matched row(s)") && count(o, "\u221250.0% ✗") == 4);
    free(o);
}

static void test_a_sharded_run_keeps_its_rows_through_merge(void) {
    char s0[200], s1[200], merged[200], cmd[2048], path[256];
    snprintf(s0, sizeof s0, "%s/s0", tmpdir);
    snprintf(s1, sizeof s1, "%s/s1", tmpdir);
    snprintf(merged, sizeof merged, "%s/merged", tmpdir);
    const char *shards[2] = {s0, s1};
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "%s run %s --model %s --threads 1 --quiet --shard %d/2 --out %s >%s 2>%s", bin, suite,
                 model, i, shards[i], out_path, err_path);
        CU_ASSERT_FATAL(system(cmd) == 0);
        snprintf(path, sizeof path, "%s/serve.jsonl", shards[i]);
        CU_ASSERT((access(path, F_OK) == 0) == (i == 0)); /* shard 0 alone runs the serve block */
    }
    snprintf(cmd, sizeof cmd, "%s merge %s %s %s >%s 2>%s", bin, merged, s0, s1, out_path, err_path);
    CU_ASSERT_FATAL(system(cmd) == 0);
    snprintf(path, sizeof path, "%s/serve.jsonl", merged);
    char *jl = util_read_file(path, NULL);
    CU_ASSERT(jl && count(jl, "\n") == 4);
    free(jl);
    snprintf(path, sizeof path, "%s/report.md", merged);
    char *md = util_read_file(path, NULL);
    CU_ASSERT(md && strstr(md, "## Serving throughput") && strstr(md, "| snapkv | 50% | 2.0 |"));
    free(md);
}

static void test_a_malformed_block_is_one_line_and_exit_1(void) {
    static const char *bad[][2] = {{"{\"clients\": 0}", "serve.clients"},
                                   {"{\"speed\": 3}", "unknown member \"speed\""},
                                   {"{\"kv_pool_mib\": [1, \"x\"]}", "serve.kv_pool_mib"},
                                   {"{\"pool_seqs\": 2, \"kv_pool_mib\": 4}", "both given"},
                                   {"[1]", "\"serve\" must be an object"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        write_suite(bad[i][0]);
        CU_ASSERT(sh("run %s --model %s --threads 1 --quiet --out /nonexistent/never", suite, model) == 1);
        char *e = util_read_file(err_path, NULL);
        CU_ASSERT(e && count(e, "\n") == 1 && strstr(e, bad[i][1]));
        if (e && !strstr(e, bad[i][1])) fprintf(stderr, "\n  %s -> %s", bad[i][0], e);
        free(e);
    }
}

/* --ctx caps the serve block's requests as it caps the samples (the block ran at the model's context) */
static void test_ctx_caps_the_serve_blocks_prompts(void) {
    FILE *f = fopen(suite, "w");
    CU_ASSERT_FATAL(f != NULL);
    fprintf(f, "{\"name\": \"serve-ctx\", \"seed\": 1, \"methods\": [{\"name\": \"full\"}], \"budgets\": [\"50%%\"],\n"
               " \"benchmarks\": [{\"type\": \"niah\", \"lengths\": [320], \"depths\": [50]}],\n"
               " \"serve\": {\"clients\": 1, \"requests\": 1, \"prompt_len\": 500, \"max_new\": 3, \"prompts\": 1}}\n");
    fclose(f);
    char dir[200];
    snprintf(dir, sizeof dir, "%s/ctx", tmpdir);
    char args[600];
    snprintf(args, sizeof args, "run %s --model %s --threads 1 --quiet --ctx 400 --out %s", suite, model, dir);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s >%s 2>%s", bin, args, out_path, err_path);
    const int rc = system(cmd);
    char *e = util_read_file(err_path, NULL);
    CU_ASSERT(rc != 0 && e && strstr(e, "serve: prompts of") && strstr(e, "exceed the context 400"));
    if (!e || !strstr(e, "exceed the context 400")) fprintf(stderr, "\n  run --ctx 400: %s", e ? e : "(no stderr)");
    free(e);
}

static int setup(void) {
    bin = getenv("KVB_BIN");
    if (!bin || !mkdtemp(tmpdir)) return -1;
    snprintf(model, sizeof model, "%s/tiny.gguf", tmpdir);
    snprintf(suite, sizeof suite, "%s/suite.json", tmpdir);
    snprintf(run_dir, sizeof run_dir, "%s/run", tmpdir);
    snprintf(base_dir, sizeof base_dir, "%s/base", tmpdir);
    snprintf(out_path, sizeof out_path, "%s/out.txt", tmpdir);
    snprintf(err_path, sizeof err_path, "%s/err.txt", tmpdir);
    gw_random r = {3, 0.5f, NULL};
    gw_tiny t = {"llama", 2, 32, 4, 2, 48, GW_BYTE_VOCAB, 1024, 1,
                 "<|im_start|>system\nYou are tiny.<|im_end|>\n{% for m in messages %}...{% endfor %}", gw_random_tensor, &r};
    int rc = gw_write_tiny(&t, model);
    free(r.buf);
    return rc;
}

static int teardown(void) {
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) ? -1 : 0;
}

int main(void) {
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("serve suite", setup, teardown);
    CU_add_test(s, "a run carries throughput rows into its report, csv and chart; resumed, none runs again",
                test_a_run_carries_throughput_rows_into_its_report);
    CU_add_test(s, "compare diffs the throughput rows and flags a slower run", test_compare_diffs_the_throughput_rows);
    CU_add_test(s, "a sharded run: shard 0 runs the block, merge keeps its rows", test_a_sharded_run_keeps_its_rows_through_merge);
    CU_add_test(s, "a malformed serve block is one line and exit 1", test_a_malformed_block_is_one_line_and_exit_1);
    CU_add_test(s, "--ctx caps the serve block's prompts", test_ctx_caps_the_serve_blocks_prompts);
    return util_run_suites();
}
