/* test_table.c — summary.csv, report.md and compare on hand-made runs: means and the bootstrap interval
 * against a float64 recomputation, deltas to full, compare's exit codes within and beyond each tolerance,
 * a torn last record skipped, a malformed record named by file and line, runs of different suites refused. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util_common.h"
#include "reports/table.h"

static char root[64] = "/tmp/kvb_table_XXXXXX";

/* A run: full + snapkv on one task, scores given, decode ms and KV bytes given. */
static void make_run(const char *name, const char *suite, const double *full, const double *snap, int n, double snap_ms,
                     double snap_kv, const char *tail) {
    char dir[256], path[300];
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/run.json", dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "{\"suite\": \"%s\", \"model_sha256\": \"abc\"}\n", suite);
    fclose(f);
    snprintf(path, sizeof path, "%s/results.jsonl", dir);
    f = fopen(path, "w");
    for (int i = 0; i < n; i++) {
        fprintf(f, "{\"method\":\"full\",\"budget\":\"full\",\"task\":\"t1\",\"sample_id\":\"%d\",\"score\":%g,\"decode_ms_per_token\":10,"
                   "\"kv_device_bytes\":1048576,\"kv_full_bytes\":1048576,\"error\":null}\n", i, full[i]);
        fprintf(f, "{\"method\":\"snapkv\",\"budget\":\"30%%\",\"task\":\"t1\",\"sample_id\":\"%d\",\"score\":%g,\"decode_ms_per_token\":%g,"
                   "\"kv_device_bytes\":%g,\"kv_full_bytes\":1048576,\"error\":null}\n", i, snap[i], snap_ms, snap_kv);
    }
    if (tail) fputs(tail, f);
    fclose(f);
}

static char *path_of(const char *name, const char *file) {
    static char p[300];
    snprintf(p, sizeof p, "%s/%s/%s", root, name, file);
    return p;
}

static void test_summary_and_report(void) {
    double full[6] = {1, 1, 0, 1, 1, 0}, snap[6] = {1, 0, 0, 1, 0, 0};
    make_run("a", "s", full, snap, 6, 5, 314572.8, "{\"method\":\"full\",\"bud"); /* torn last line */
    char err[256];
    CU_ASSERT_FATAL(kvb_table_write(path_of("a", ""), err, sizeof err) == 0);
    size_t len;
    char *csv = util_read_file(path_of("a", "summary.csv"), &len);
    CU_ASSERT_FATAL(csv != NULL);
    CU_ASSERT(strstr(csv, "full@full,t1,6,6,0.666667,") != NULL);
    CU_ASSERT(strstr(csv, "snapkv@30%,t1,6,6,0.333333,") != NULL);
    /* the interval holds the mean and has a sane width for 6 Bernoulli draws */
    char *line = strstr(csv, "snapkv@30%,t1,");
    double m, lo, hi;
    CU_ASSERT_FATAL(sscanf(line, "snapkv@30%%,t1,6,6,%lf,%lf,%lf", &m, &lo, &hi) == 3);
    CU_ASSERT(lo <= m && m <= hi && hi - lo > 0.2 && hi - lo < 0.9);
    free(csv);
    char *md = util_read_file(path_of("a", "report.md"), &len);
    CU_ASSERT_FATAL(md != NULL);
    CU_ASSERT(strstr(md, "| full@full | 66.7 ±") != NULL);
    CU_ASSERT(strstr(md, "(-33.3)") != NULL);            /* delta to full */
    CU_ASSERT(strstr(md, "| snapkv@30% | 6 |") != NULL);  /* efficiency row */
    CU_ASSERT(strstr(md, "2.00x") != NULL);               /* 10 ms vs 5 ms */
    CU_ASSERT(strstr(md, "| 30.0 |") != NULL);            /* % of full */
    free(md);
}

static int cmp(const char *a, const char *b, double drop, double slow, double mem) {
    char err[256];
    FILE *devnull = fopen("/dev/null", "w");
    char pa[300], pb[300];
    snprintf(pa, sizeof pa, "%s", path_of(a, ""));
    snprintf(pb, sizeof pb, "%s", path_of(b, ""));
    int rc = kvb_table_compare(pa, pb, drop, slow, mem, 0, devnull, err, sizeof err);
    fclose(devnull);
    return rc;
}

static void test_compare_tolerances(void) {
    double full[4] = {1, 1, 1, 1}, snap[4] = {1, 1, 0, 0}, snap_worse[4] = {1, 0, 0, 0};
    make_run("base", "s", full, snap, 4, 5.0, 300000, NULL);
    make_run("same", "s", full, snap, 4, 5.0, 300000, NULL);
    make_run("worse", "s", full, snap_worse, 4, 5.0, 300000, NULL);  /* -25 points */
    make_run("slower", "s", full, snap, 4, 6.0, 300000, NULL);       /* +20% */
    make_run("bigger", "s", full, snap, 4, 5.0, 330000, NULL);       /* +10% */
    make_run("other", "other-suite", full, snap, 4, 5.0, 300000, NULL);
    CU_ASSERT(cmp("base", "same", 2, 10, 1) == 0);
    CU_ASSERT(cmp("base", "worse", 2, 10, 1) == 1);
    CU_ASSERT(cmp("base", "worse", 30, 10, 1) == 0);
    CU_ASSERT(cmp("base", "slower", 2, 10, 1) == 1);
    CU_ASSERT(cmp("base", "slower", 2, 25, 1) == 0);
    CU_ASSERT(cmp("base", "bigger", 2, 10, 1) == 1);
    CU_ASSERT(cmp("base", "bigger", 2, 10, 15) == 0);
    CU_ASSERT(cmp("base", "other", 2, 10, 1) == -1);
}

static void test_malformed_record(void) {
    double full[2] = {1, 0}, snap[2] = {0, 0};
    make_run("bad", "s", full, snap, 2, 5, 1, "not json\n{\"method\":\"full\",\"budget\":\"full\",\"task\":\"t1\"}\n");
    char err[256];
    CU_ASSERT(kvb_table_write(path_of("bad", ""), err, sizeof err) == -1);
    CU_ASSERT(strstr(err, "results.jsonl:5: not a kvbench result record") != NULL);
}

int main(void) {
    if (!mkdtemp(root)) return 1;
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("reports", NULL, NULL);
    CU_add_test(s, "summary.csv and report.md", test_summary_and_report);
    CU_add_test(s, "compare: exit 1 beyond each tolerance, 0 within", test_compare_tolerances);
    CU_add_test(s, "malformed record named by file and line", test_malformed_record);
    int rc = util_run_suites();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd)) rc = 1;
    return rc;
}
