/* test_shard.c — deterministic shards (benchmarks/shard.h): indices equal to Python hashlib's
 * (tests/fixtures/shard_ref.py), for N in 1..7 every cell of a suite-sized grid in exactly one shard with
 * no shard empty or lopsided, any field of the cell moving it, --shard i/N parsing with its errors, and a folder's
 * plan.jsonl keeping the cells of all its runs. */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util_common.h"
#include "benchmarks/shard.h"

static const char *SHA = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

static const char *js(const cJSON *o, const char *k) { return cJSON_GetObjectItem(o, k)->valuestring; }

static void test_indices_equal_python_hashlib_reference(void) {
    char *text = util_read_file("tests/fixtures/shard_ref.json", NULL);
    CU_ASSERT_FATAL(text != NULL);
    cJSON *cases = cJSON_Parse(text);
    free(text);
    CU_ASSERT_FATAL(cJSON_GetArraySize(cases) >= 100);
    const cJSON *c;
    int bad = 0;
    cJSON_ArrayForEach(c, cases) {
        int n = cJSON_GetObjectItem(c, "n")->valueint, want = cJSON_GetObjectItem(c, "shard")->valueint;
        int got = kvb_shard_of(js(c, "model"), js(c, "method"), js(c, "budget"), js(c, "opts"), js(c, "benchmark"), js(c, "task"),
                               js(c, "sample_id"), n);
        if (got != want && bad++ < 3) fprintf(stderr, "%s@%s %s #%s N=%d: got %d, want %d\n", js(c, "method"), js(c, "budget"), js(c, "task"), js(c, "sample_id"), n, got, want);
    }
    CU_ASSERT_EQUAL(bad, 0);
    cJSON_Delete(cases);
}

/* A grid shaped like a real suite: 7 methods x 3 budgets (full once) x 4 tasks x 25 samples = 1900 cells. */
static void test_shards_partition_the_suite_for_n_1_to_7(void) {
    static const char *methods[] = {"full", "streamingllm", "h2o", "snapkv", "omnikv", "round", "pod"};
    static const char *opts[] = {"", "", "", "{\"window\":8}", "{\"layers\":\"2;8;17\"}", "", ""};
    static const char *budgets[] = {"10%", "30%", "50%"};
    static const char *tasks[][2] = {{"2stage", "2stage"}, {"niah", "niah"}, {"recall", "recall"}, {"longbench", "hotpotqa"}};
    for (int n = 1; n <= 7; n++) {
        int per_shard[7] = {0}, cells = 0, twice_or_never = 0;
        for (int m = 0; m < 7; m++)
            for (int b = 0; b < (m == 0 ? 1 : 3); b++)
                for (int t = 0; t < 4; t++)
                    for (int s = 0; s < 25; s++) {
                        char id[16];
                        snprintf(id, sizeof id, "%d", s);
                        const char *budget = m == 0 ? "full" : budgets[b];
                        int owners = 0, owner = -1;
                        for (int i = 0; i < n; i++) /* what `run --shard i/N` keeps, asked of every shard */
                            if (kvb_shard_of(SHA, methods[m], budget, opts[m], tasks[t][0], tasks[t][1], id, n) == i) owners++, owner = i;
                        twice_or_never += owners != 1;
                        if (owner >= 0) per_shard[owner]++;
                        cells++;
                    }
        CU_ASSERT_EQUAL(cells, 1900);
        CU_ASSERT_EQUAL(twice_or_never, 0);
        int sum = 0;
        for (int i = 0; i < n; i++) {
            sum += per_shard[i];
            /* a uniform hash: every shard within 25% of cells/N (binomial sd at N=7 is ~5%) */
            CU_ASSERT(per_shard[i] > 0.75 * cells / n && per_shard[i] < 1.25 * cells / n);
        }
        CU_ASSERT_EQUAL(sum, cells);
    }
}

static void test_every_field_of_the_cell_moves_it(void) {
    const int n = 1000;
    int base = kvb_shard_of(SHA, "snapkv", "30%", "{\"window\":8}", "longbench", "hotpotqa", "5", n);
    CU_ASSERT(base >= 0 && base < n);
    CU_ASSERT_EQUAL(kvb_shard_of(SHA, "snapkv", "30%", "{\"window\":8}", "longbench", "hotpotqa", "5", n), base); /* stable */
    const char *v[][7] = {
        {"0000000000000000000000000000000000000000000000000000000000000000", "snapkv", "30%", "{\"window\":8}", "longbench", "hotpotqa", "5"},
        {SHA, "h2o", "30%", "{\"window\":8}", "longbench", "hotpotqa", "5"},
        {SHA, "snapkv", "50%", "{\"window\":8}", "longbench", "hotpotqa", "5"},
        {SHA, "snapkv", "30%", "{\"window\":16}", "longbench", "hotpotqa", "5"},
        {SHA, "snapkv", "30%", "{\"window\":8}", "other", "hotpotqa", "5"},
        {SHA, "snapkv", "30%", "{\"window\":8}", "longbench", "qasper", "5"},
        {SHA, "snapkv", "30%", "{\"window\":8}", "longbench", "hotpotqa", "6"}};
    for (int k = 0; k < 7; k++) /* 1 in 1000 could collide by chance; these fixed inputs do not */
        CU_ASSERT_NOT_EQUAL(kvb_shard_of(v[k][0], v[k][1], v[k][2], v[k][3], v[k][4], v[k][5], v[k][6], n), base);
    CU_ASSERT_EQUAL(kvb_shard_of(SHA, "full", "full", NULL, "niah", "niah", "1", 1), 0);
    CU_ASSERT_EQUAL(kvb_shard_of(SHA, "full", "full", NULL, "niah", "niah", "1", 0), -1);
}

static void test_parse_i_of_n_and_its_errors(void) {
    kvb_shard s = {-1, -1};
    char err[256], buf[32];
    CU_ASSERT_EQUAL(kvb_shard_parse("0/4", &s, err, sizeof err), 0);
    CU_ASSERT(s.index == 0 && s.count == 4);
    CU_ASSERT_EQUAL(kvb_shard_parse("6/7", &s, err, sizeof err), 0);
    kvb_shard_format(&s, buf, sizeof buf);
    CU_ASSERT_STRING_EQUAL(buf, "6/7");
    kvb_shard none = {0, 0};
    kvb_shard_format(&none, buf, sizeof buf);
    CU_ASSERT_STRING_EQUAL(buf, "");
    static const char *bad[][2] = {{"4/4", "i must be in [0, N-1]"}, {"-1/4", "i must be in"}, {"1/0", "N must be in"},
                                   {"4", "expects i/N"}, {"a/4", "integer i"}, {"1/4x", "integer N"}, {"1/", "integer N"},
                                   {"/4", "integer i"}, {"0/100001", "N must be in"}};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        err[0] = 0;
        CU_ASSERT_EQUAL(kvb_shard_parse(bad[k][0], &s, err, sizeof err), -1);
        CU_ASSERT_PTR_NOT_NULL(strstr(err, bad[k][1]));
        CU_ASSERT_PTR_NULL(strchr(err, '\n'));
    }
}

/* A folder's plan.jsonl keeps the cells every run of it planned: a narrowed run (--methods, --limit) adds what is
 * new after the earlier rows and repeats nothing (it replaced the plan, so the cells of the earlier run's records
 * looked like another suite's); a plan that is not kvbench's (NUL byte, torn last row) is refused, naming it. */
static void test_plan_keeps_the_cells_of_every_run_of_the_folder(void) {
    char path[] = "/tmp/kvb_plan_XXXXXX", err[512];
    int fd = mkstemp(path);
    CU_ASSERT_FATAL(fd >= 0);
    close(fd);
    unlink(path);
    const char *first = "[\"full\",\"full\",\"niah\",\"niah\",\"1\",0]\n[\"h2o\",\"30%\",\"niah\",\"niah\",\"1\",0]\n";
    CU_ASSERT_FATAL(kvb_plan_write(path, first, err, sizeof err) == 0);
    CU_ASSERT_FATAL(kvb_plan_write(path, "[\"full\",\"full\",\"niah\",\"niah\",\"1\",0]\n[\"full\",\"full\",\"niah\",\"niah\",\"2\",0]\n",
                                   err, sizeof err) == 0);
    char *got = util_read_file(path, NULL);
    CU_ASSERT(got && !strcmp(got, "[\"full\",\"full\",\"niah\",\"niah\",\"1\",0]\n[\"h2o\",\"30%\",\"niah\",\"niah\",\"1\",0]\n"
                                  "[\"full\",\"full\",\"niah\",\"niah\",\"2\",0]\n"));
    free(got);
    FILE *f = fopen(path, "a");
    fputs("[\"x\"", f);
    fclose(f);
    CU_ASSERT(kvb_plan_write(path, first, err, sizeof err) == -1 && strstr(err, path) && strstr(err, "no newline"));
    f = fopen(path, "w");
    fwrite("[\"x\"]\0\n", 1, 7, f);
    fclose(f);
    CU_ASSERT(kvb_plan_write(path, first, err, sizeof err) == -1 && strstr(err, "a NUL byte"));
    unlink(path);
}

int main(void) {
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("shard", NULL, NULL);
    CU_add_test(s, "indices equal Python hashlib reference", test_indices_equal_python_hashlib_reference);
    CU_add_test(s, "shards partition the suite for N 1 to 7", test_shards_partition_the_suite_for_n_1_to_7);
    CU_add_test(s, "every field of the cell moves it", test_every_field_of_the_cell_moves_it);
    CU_add_test(s, "parse i/N and its errors", test_parse_i_of_n_and_its_errors);
    CU_add_test(s, "plan keeps the cells of every run of the folder", test_plan_keeps_the_cells_of_every_run_of_the_folder);
    return util_run_suites();
}
