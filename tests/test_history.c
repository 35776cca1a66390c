/* test_history.c — `kvbench history` (reports/history.h) on three hand-made runs given out of date order:
 * history.md lists them by date with their commits, each measure's table holds the values recomputed here
 * (mean over tasks of each task's mean score, x100; mean decode ms/token; mean device KV MiB) and the last
 * change; one SVG per method@budget with the three charts; errors name the run. */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util_common.h"
#include "reports/history.h"

static char root[64] = "/tmp/kvb_history_XXXXXX";
static char err[1024];

static char *dir_of(const char *name) {
    static char d[8][256];
    static int k;
    k = (k + 1) % 8;
    snprintf(d[k], sizeof d[k], "%s/%s", root, name);
    return d[k];
}

/* A run of snapkv@30% and full on two tasks; snapkv's scores on task "b" are sb[0..3], its decode ms dec,
 * its KV bytes kv. */
static void make_run(const char *name, const char *created, const char *commit, const double sb[4], double dec, double kv) {
    char p[400];
    mkdir(dir_of(name), 0755);
    snprintf(p, sizeof p, "%s/run.json", dir_of(name));
    FILE *f = fopen(p, "w");
    CU_ASSERT_FATAL(f != NULL);
    fprintf(f, "{\"suite\":\"nightly\",\"model_sha256\":\"s\",\"git_commit\":\"%s\",\"host\":\"h\",\"created\":\"%s\"}\n", commit, created);
    fclose(f);
    snprintf(p, sizeof p, "%s/results.jsonl", dir_of(name));
    f = fopen(p, "w");
    CU_ASSERT_FATAL(f != NULL);
    for (int i = 0; i < 4; i++) {
        fprintf(f, "{\"method\":\"full\",\"budget\":\"full\",\"benchmark\":\"x\",\"task\":\"a\",\"sample_id\":\"%d\",\"score\":1,"
                   "\"decode_ms_per_token\":20,\"kv_device_bytes\":2097152}\n", i);
        fprintf(f, "{\"method\":\"snapkv\",\"budget\":\"30%%\",\"benchmark\":\"x\",\"task\":\"a\",\"sample_id\":\"%d\",\"score\":%g,"
                   "\"decode_ms_per_token\":%g,\"kv_device_bytes\":%g}\n", i, i < 2 ? 1.0 : 0.5, dec, kv);
        fprintf(f, "{\"method\":\"snapkv\",\"budget\":\"30%%\",\"benchmark\":\"x\",\"task\":\"b\",\"sample_id\":\"%d\",\"score\":%g,"
                   "\"decode_ms_per_token\":%g,\"kv_device_bytes\":%g}\n", i, sb[i], dec + 2, kv);
    }
    fclose(f);
}

static void test_history_orders_runs_and_recomputes_each_measure(void) {
    static const double good[4] = {1, 1, 1, 0}, bad[4] = {0, 0, 0.5, 0};
    make_run("n2", "2026-03-03T02:00:00Z", "ccc333", bad, 9, 314572.8);     /* the night something moved */
    make_run("n0", "2026-03-01T02:00:00Z", "aaa111", good, 10, 629145.6);
    make_run("n1", "2026-03-02T02:00:00Z", "bbb222", good, 10, 629145.6);
    char *dirs[] = {dir_of("n2"), dir_of("n0"), dir_of("n1")};
    CU_ASSERT_EQUAL_FATAL(kvb_history_write(dir_of("hist"), dirs, 3, err, sizeof err), 0);
    char p[400];
    snprintf(p, sizeof p, "%s/history.md", dir_of("hist"));
    char *md = util_read_file(p, NULL);
    CU_ASSERT_PTR_NOT_NULL_FATAL(md);
    /* runs by date, whatever the order given */
    char *r1 = strstr(md, "| 1 | 2026-03-01T02:00:00Z | aaa111 |"), *r2 = strstr(md, "| 2 | 2026-03-02T02:00:00Z | bbb222 |"),
         *r3 = strstr(md, "| 3 | 2026-03-03T02:00:00Z | ccc333 |");
    CU_ASSERT(r1 && r2 && r3 && r1 < r2 && r2 < r3);
    /* score: mean of task means x100. good: a = 75, b = 75 -> 75.0; bad: a = 75, b = 12.5 -> 43.75 */
    double a = (1 + 1 + 0.5 + 0.5) / 4 * 100, bg = (1 + 1 + 1 + 0) / 4.0 * 100, bb = (0 + 0 + 0.5 + 0) / 4 * 100;
    char want[256];
    snprintf(want, sizeof want, "| snapkv@30%% | %.1f | %.1f | %.1f | %+.1f |", (a + bg) / 2, (a + bg) / 2, (a + bb) / 2, (a + bb) / 2 - (a + bg) / 2);
    CU_ASSERT_PTR_NOT_NULL(strstr(md, want));
    if (!strstr(md, want)) fprintf(stderr, "want %s in\n%s\n", want, md);
    CU_ASSERT_PTR_NOT_NULL(strstr(md, "| full@full | 100.0 | 100.0 | 100.0 | +0.0 |"));
    /* decode ms/token: mean over tasks of (dec, dec + 2) */
    CU_ASSERT_PTR_NOT_NULL(strstr(md, "| snapkv@30% | 11.00 | 11.00 | 10.00 | -1.00 |"));
    /* device KV MiB: 0.6 then 0.3 */
    CU_ASSERT_PTR_NOT_NULL(strstr(md, "| snapkv@30% | 0.60 | 0.60 | 0.30 | -0.30 |"));
    free(md);
    snprintf(p, sizeof p, "%s/history-snapkv-30pct.svg", dir_of("hist"));
    char *svg = util_read_file(p, NULL);
    CU_ASSERT_PTR_NOT_NULL_FATAL(svg);
    int charts = 0, lines = 0;
    for (char *s = svg; (s = strstr(s, "<svg ")); s++) charts++;
    for (char *s = svg; (s = strstr(s, "<polyline")); s++) lines++;
    CU_ASSERT_EQUAL(charts, 4); /* the document and its three charts */
    CU_ASSERT_EQUAL(lines, 3);
    CU_ASSERT_PTR_NOT_NULL(strstr(svg, "snapkv@30%: decode ms/token"));
    free(svg);
    snprintf(p, sizeof p, "%s/history-full-full.svg", dir_of("hist"));
    CU_ASSERT_EQUAL(access(p, R_OK), 0);
}

static void test_history_errors_name_the_run(void) {
    char *dirs[] = {dir_of("n0"), dir_of("missing")};
    CU_ASSERT_EQUAL(kvb_history_write(dir_of("hist2"), dirs, 2, err, sizeof err), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "missing"));
    CU_ASSERT_PTR_NULL(strchr(err, '\n'));
    CU_ASSERT_EQUAL(kvb_history_write(dir_of("hist2"), dirs, 0, err, sizeof err), -1);
}

int main(void) {
    if (!mkdtemp(root)) return 1;
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("history", NULL, NULL);
    CU_add_test(s, "history orders runs and recomputes each measure", test_history_orders_runs_and_recomputes_each_measure);
    CU_add_test(s, "history errors name the run", test_history_errors_name_the_run);
    int rc = util_run_suites();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd)) rc = 1;
    return rc;
}
