/* test_bench_serve.c — `kvbench bench-serve` as a user runs it (the binary from KVB_BIN, set by CTest), on a tiny
 * random-weight model with one token per byte: a run of two methods ends with every request completed and none
 * lost, one Markdown row and one CSV row per method, closed loop or open (--rate); --decode-only prints one row per batch size; bad input (an
 * unknown method, an empty list, a bad budget, a pool below one request, a prompt over the context, bad batch
 * sizes) is one line on stderr and exit 1; several --kv-pool-mib sizes write a well-formed SVG chart of output
 * tokens/s against the pool with a line per method, and a JSON row per method and pool. */
#include <cjson/cJSON.h>
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util_common.h"
#include "util_gguf_writer.h"

static char tmpdir[64] = "/tmp/kvb_bserve_XXXXXX", model[128], out_path[160], err_path[160], csv_path[160],
            svg_path[160], json_path[160];
static const char *bin;

/* Run bench-serve with args; its exit code; stdout and stderr in out_path and err_path. */
static int run(const char *args) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s bench-serve --model %s --threads 1 %s >%s 2>%s", bin, model, args, out_path, err_path);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static int count(const char *text, const char *what) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, what)); p += strlen(what)) n++;
    return n;
}

/* exit 1 with one line on stderr naming what */
static void check_refused(const char *args, const char *what) {
    CU_ASSERT(run(args) == 1);
    char *e = util_read_file(err_path, NULL);
    CU_ASSERT_FATAL(e != NULL);
    CU_ASSERT(count(e, "\n") == 1 && strncmp(e, "kvbench: ", 9) == 0 && strstr(e, what) != NULL);
    if (!strstr(e, what)) fprintf(stderr, "\n  %s -> %s", args, e);
    free(e);
}

static void test_two_methods_complete_every_request(void) {
    char args[512];
    snprintf(args, sizeof args, "--methods full,snapkv@50%% --clients 3 --requests 5 --prompts 2 --prompt-len 160 "
                                "--max-new 4 --pool-seqs 2 --csv %s", csv_path);
    CU_ASSERT_FATAL(run(args) == 0);
    char *o = util_read_file(out_path, NULL), *c = util_read_file(csv_path, NULL);
    CU_ASSERT_FATAL(o != NULL && c != NULL);
    CU_ASSERT(strstr(o, "| full | - | 5/5 | 0 |") != NULL);
    CU_ASSERT(strstr(o, "| snapkv | 50% | 5/5 | 0 |") != NULL);
    CU_ASSERT(count(c, "\n") == 3 && strstr(c, "\nfull,-,5,5,0,0,") && strstr(c, "\nsnapkv,50%,5,5,0,0,"));
    free(o);
    free(c);
}

static void test_open_loop_completes_every_request(void) {
    CU_ASSERT_FATAL(run("--methods full --rate 40 --requests 6 --prompts 2 --prompt-len 120 --max-new 3") == 0);
    char *o = util_read_file(out_path, NULL);
    CU_ASSERT_FATAL(o != NULL);
    CU_ASSERT(strstr(o, "open loop at 40 requests/s") && strstr(o, "| full | - | 6/6 | 0 |"));
    free(o);
}

static void test_decode_only_one_row_per_batch_size(void) {
    int rc = run("--decode-only 1,3 --prompt-len 32 --n-decode 4");
    char *o = util_read_file(out_path, NULL), *e = util_read_file(err_path, NULL);
    if (rc) fprintf(stderr, "\n  %s", e ? e : "");
    free(e);
    CU_ASSERT_FATAL(rc == 0);
    CU_ASSERT_FATAL(o != NULL);
    CU_ASSERT(strstr(o, "\n| 1 | 32 | 4 | ") != NULL && strstr(o, "\n| 3 | 32 | 4 | ") != NULL);
    free(o);
}

/* 1 when the XML text is well formed as far as elements go: every start tag closed by its own end tag, in order,
 * one root; declarations, comments and self-closing tags skipped. */
static int xml_balanced(const char *x) {
    char stack[64][32];
    int depth = 0, roots = 0;
    for (const char *p = strchr(x, '<'); p; p = strchr(p + 1, '<')) {
        if (p[1] == '?' || p[1] == '!') continue;
        const char *end = strchr(p, '>');
        if (!end) return 0;
        if (p[1] == '/') {
            size_t n = strcspn(p + 2, " >");
            if (depth == 0 || n != strlen(stack[depth - 1]) || strncmp(p + 2, stack[depth - 1], n)) return 0;
            depth--;
            continue;
        }
        if (end[-1] == '/') continue; /* <line ... /> */
        size_t n = strcspn(p + 1, " >/\n");
        if (depth == 64 || n == 0 || n >= sizeof stack[0]) return 0;
        if (depth == 0) roots++;
        memcpy(stack[depth], p + 1, n);
        stack[depth++][n] = 0;
    }
    return depth == 0 && roots == 1;
}

static void test_several_pools_write_the_chart(void) {
    char args[512];
    snprintf(args, sizeof args, "--methods full,snapkv@50%% --kv-pool-mib 1,2 --clients 2 --requests 3 --prompts 1 "
                                "--prompt-len 120 --max-new 3 --chart %s --json %s", svg_path, json_path);
    CU_ASSERT_FATAL(run(args) == 0);
    char *o = util_read_file(out_path, NULL), *svg = util_read_file(svg_path, NULL), *js = util_read_file(json_path, NULL);
    CU_ASSERT_FATAL(o && svg && js);
    CU_ASSERT(strstr(o, "KV pool 1.0 MiB:") && strstr(o, "KV pool 2.0 MiB:") && count(o, "| full | - | 3/3 | 0 | 0 |") == 2);
    CU_ASSERT(strncmp(svg, "<svg", 4) == 0 || strncmp(svg, "<?xml", 5) == 0);
    CU_ASSERT(xml_balanced(svg));
    CU_ASSERT(strstr(svg, "KV pool (MiB)") && strstr(svg, "output tokens/s") && strstr(svg, ">full<") &&
              strstr(svg, ">snapkv@50%<"));
    /* a row per method and pool, each at its pool */
    cJSON *rows = cJSON_Parse(js);
    CU_ASSERT_FATAL(cJSON_IsArray(rows) && cJSON_GetArraySize(rows) == 4);
    const double want[4] = {1, 1, 2, 2};
    for (int i = 0; i < 4; i++) {
        const cJSON *r = cJSON_GetArrayItem(rows, i);
        CU_ASSERT(fabs(cJSON_GetObjectItem(r, "pool_mib")->valuedouble - want[i]) < 0.05);
        CU_ASSERT(cJSON_GetObjectItem(r, "ok")->valueint == 3 && cJSON_GetObjectItem(r, "output_tokens")->valueint == 9);
    }
    cJSON_Delete(rows);
    free(o), free(svg), free(js);
    /* --pool-seqs 1,3: pools of one and three full-attention sequences, the second three times the first */
    snprintf(args, sizeof args, "--methods full --pool-seqs 1,3 --clients 2 --requests 2 --prompts 1 --prompt-len 120 "
                                "--max-new 3 --chart %s --json %s", svg_path, json_path);
    CU_ASSERT_FATAL(run(args) == 0);
    js = util_read_file(json_path, NULL);
    rows = cJSON_Parse(js);
    CU_ASSERT_FATAL(cJSON_IsArray(rows) && cJSON_GetArraySize(rows) == 2);
    const double p1 = cJSON_GetObjectItem(cJSON_GetArrayItem(rows, 0), "pool_mib")->valuedouble,
                 p3 = cJSON_GetObjectItem(cJSON_GetArrayItem(rows, 1), "pool_mib")->valuedouble;
    CU_ASSERT(p1 > 0 && fabs(p3 / p1 - 3) < 1e-9);
    CU_ASSERT(cJSON_GetObjectItem(cJSON_GetArrayItem(rows, 0), "max_seqs")->valueint == 1); /* one sequence fits */
    cJSON_Delete(rows);
    free(js);
}

static void test_bad_input_is_one_line_and_exit_1(void) {
    check_refused("--methods nosuch", "unknown method 'nosuch'");
    check_refused("--methods ''", "--methods is empty");
    check_refused("--methods snapkv@abc", "abc");
    /* the tiny model's KV is small: pages of 8192 tokens make one request (4 pages) larger than a 1 MiB pool (3) */
    check_refused("--kv-pool-mib 1 --page-tokens 8192 --prompt-len 100", "cannot hold one request");
    check_refused("--prompt-len 2000 --max-new 64", "exceeds the context");
    check_refused("--decode-only 1,x", "--decode-only");
    check_refused("--clients 0", "--clients");
    check_refused("--rate 0", "--rate");
    check_refused("--kv-pool-mib 1,x", "--kv-pool-mib");
    check_refused("--kv-pool-mib 2 --chart c.svg", "--chart needs several");
    check_refused("--api-key-env X", "need --url");
    check_refused("--pool-seqs 2 --kv-pool-mib 4", "both given");
    check_refused("--pool-seqs 0", "--pool-seqs");
    /* options that would change nothing in that mode are refused by name, not ignored */
    check_refused("--decode-only 1,2 --methods full", "--methods does not apply to --decode-only");
    check_refused("--decode-only 1 --csv x.csv", "--csv does not apply to --decode-only");
    check_refused("--n-decode 4", "--n-decode needs --decode-only");
    check_refused("--rate 2 --clients 3", "--clients with --rate");
    check_refused("--url http://127.0.0.1:9 --kv-type f32", "--kv-type is the server's with --url");
}

static int setup(void) {
    bin = getenv("KVB_BIN");
    if (!bin || !mkdtemp(tmpdir)) return -1;
    snprintf(model, sizeof model, "%s/tiny.gguf", tmpdir);
    snprintf(out_path, sizeof out_path, "%s/out.txt", tmpdir);
    snprintf(err_path, sizeof err_path, "%s/err.txt", tmpdir);
    snprintf(csv_path, sizeof csv_path, "%s/rows.csv", tmpdir);
    snprintf(svg_path, sizeof svg_path, "%s/chart.svg", tmpdir);
    snprintf(json_path, sizeof json_path, "%s/rows.json", tmpdir);
    gw_random r = {3, 0.5f, NULL};
    gw_tiny t = {"llama", 2, 32, 4, 2, 48, GW_BYTE_VOCAB, 1024, 1,
                 "<|im_start|>system\nYou are tiny.<|im_end|>\n{% for m in messages %}...{% endfor %}", gw_random_tensor, &r};
    int rc = gw_write_tiny(&t, model);
    free(r.buf);
    return rc;
}

static int teardown(void) {
    unlink(model), unlink(out_path), unlink(err_path), unlink(csv_path), unlink(svg_path), unlink(json_path);
    rmdir(tmpdir);
    return 0;
}

int main(void) {
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("bench-serve", setup, teardown);
    CU_add_test(s, "two methods: every request completes, none lost, a row each (Markdown and CSV)",
                test_two_methods_complete_every_request);
    CU_add_test(s, "--rate: open-loop arrivals, every request completes", test_open_loop_completes_every_request);
    CU_add_test(s, "--decode-only: one row per batch size", test_decode_only_one_row_per_batch_size);
    CU_add_test(s, "several --kv-pool-mib sizes: a well-formed chart, a row per method and pool",
                test_several_pools_write_the_chart);
    CU_add_test(s, "bad input is one line on stderr and exit 1", test_bad_input_is_one_line_and_exit_1);
    return util_run_suites();
}
