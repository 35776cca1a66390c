/* test_progress.c — what a suite run says while it runs and what it records about the machine: the progress
 * line (benchmarks/progress.h) in a log (one line per finished sample, nothing within a sample) and on a
 * terminal (within-sample steps rate-limited, driven by a made-up clock), and the host-load sessions in
 * run.json (benchmarks/hostload.h) against /proc/loadavg and sysconf, other run.json fields kept; and what a
 * missing dataset's message offers (benchmarks/datahint.h, configs/sample-data.json). */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util_common.h"
#include "benchmarks/datahint.h"
#include "benchmarks/hostload.h"
#include "benchmarks/progress.h"

static char root[64] = "/tmp/kvb_progress_XXXXXX";
static char err[512];

static int count_of(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; p && (p = strstr(p, needle)); p++) n++;
    return n;
}

/* Drive one sample: begin, 40 steps 10 ms apart, end; then the run's end. Returns what was written. */
static char *one_sample(int tty, int quiet) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    kvb_progress p;
    kvb_progress_init(&p, f, tty, quiet, 100.0);
    p.total = 8;
    kvb_progress_note(&p, KVB_PROG_BEGIN, "niah #1: shared prefill", 100.0);
    for (int i = 1; i <= 40; i++) {
        char what[64];
        snprintf(what, sizeof what, "snapkv@30%% niah #1: decode %d/40 tokens", i);
        kvb_progress_note(&p, KVB_PROG_STEP, what, 100.0 + 0.01 * i);
    }
    p.finished = p.ran = 4;
    kvb_progress_note(&p, KVB_PROG_END, "niah #1: 4 cells, 1000 prompt tokens, 30.0 s", 130.0);
    p.finished = p.ran = 8;
    kvb_progress_note(&p, KVB_PROG_DONE, "done", 160.0);
    fclose(f);
    return buf;
}

static void test_log_gets_one_line_per_sample_and_nothing_within(void) {
    char *out = one_sample(0, 0);
    CU_ASSERT_FATAL(out != NULL);
    CU_ASSERT_EQUAL(count_of(out, "\n"), 2); /* the sample's line and the run's last line */
    CU_ASSERT(strchr(out, '\r') == NULL);
    CU_ASSERT(strstr(out, "decode") == NULL && strstr(out, "shared prefill") == NULL);
    /* 4 of 8 records after 30 s: 50%, ETA 30 s */
    CU_ASSERT(strstr(out, "[4/8]  50% elapsed 00:30 ETA 00:30  niah #1: 4 cells, 1000 prompt tokens, 30.0 s\n") != NULL);
    CU_ASSERT(strstr(out, "[8/8] 100% elapsed 01:00 ETA 00:00  done\n") != NULL);
    free(out);
}

static void test_terminal_steps_are_rate_limited(void) {
    char *out = one_sample(1, 0);
    CU_ASSERT_FATAL(out != NULL);
    /* steps at 10 ms spacing over 0.4 s with a 0.25 s interval: begin at 0, one step at 0.25, then end, done */
    CU_ASSERT_EQUAL(count_of(out, "\r"), 4);
    CU_ASSERT(strstr(out, "decode 25/40 tokens") != NULL);
    CU_ASSERT(strstr(out, "decode 24/40 tokens") == NULL && strstr(out, "decode 40/40") == NULL);
    CU_ASSERT(out[strlen(out) - 1] == '\n'); /* the terminal's line is finished at the end */
    free(out);
    out = one_sample(1, 1);
    CU_ASSERT(out && !out[0]); /* --quiet */
    free(out);
}

static double json_num(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static void test_host_load_sessions_are_appended_to_run_json(void) {
    char path[128];
    snprintf(path, sizeof path, "%s/run.json", root);
    FILE *f = fopen(path, "w");
    CU_ASSERT_FATAL(f != NULL);
    fputs("{\"suite\":\"quick\",\"threads\":3,\"nested\":{\"a\":[1,2]}}\n", f);
    fclose(f);
    kvb_hostload h;
    for (int session = 0; session < 2; session++) {
        CU_ASSERT_FATAL(kvb_hostload_begin(&h, path, session ? 0 : 3, err, sizeof err) == 0);
        kvb_hostload_sample(&h);
        CU_ASSERT_FATAL(kvb_hostload_end(&h, path, err, sizeof err) == 0);
    }
    char *text = util_read_file(path, NULL);
    cJSON *j = cJSON_Parse(text);
    free(text);
    CU_ASSERT_FATAL(j != NULL);
    CU_ASSERT_STRING_EQUAL(cJSON_GetObjectItem(j, "suite")->valuestring, "quick");
    CU_ASSERT(cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "nested"), "a")) == 2);
    const cJSON *arr = cJSON_GetObjectItem(j, "host_load");
    CU_ASSERT_FATAL(cJSON_IsArray(arr) && cJSON_GetArraySize(arr) == 2);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    double ref[3] = {0};
    FILE *la = fopen("/proc/loadavg", "r"); /* an independent reading of the same counter */
    int have = la && fscanf(la, "%lf %lf %lf", &ref[0], &ref[1], &ref[2]) == 3;
    if (la) fclose(la);
    for (int k = 0; k < 2; k++) {
        const cJSON *s = cJSON_GetArrayItem(arr, k);
        CU_ASSERT(json_num(s, "cpus") == (double)cpus);
        CU_ASSERT(json_num(s, "threads") == (k ? (double)cpus : 3));
        CU_ASSERT(cJSON_IsString(cJSON_GetObjectItem(s, "started")));
        double st = json_num(s, "load_start"), mx = json_num(s, "load_max"), en = json_num(s, "load_end");
        CU_ASSERT(isfinite(st) && isfinite(mx) && isfinite(en) && mx >= st - 1e-9 && mx >= en - 1e-9);
        if (have) CU_ASSERT(fabs(en - ref[0]) < 2.0); /* the 1-minute average moves slowly */
    }
    cJSON_Delete(j);
    /* a missing or broken run.json is an error naming it */
    char missing[160];
    snprintf(missing, sizeof missing, "%s/nope/run.json", root);
    CU_ASSERT(kvb_hostload_begin(&h, missing, 1, err, sizeof err) != 0 && strstr(err, "nope/run.json"));
    f = fopen(path, "w");
    fputs("[1,2]", f);
    fclose(f);
    CU_ASSERT(kvb_hostload_end(&h, path, err, sizeof err) != 0 && strstr(err, "not a JSON object"));
    f = fopen(path, "w");
    fputs("{\"suite\":\"quick\"}", f);
    fclose(f);
    CU_ASSERT(kvb_hostload_end(&h, path, err, sizeof err) != 0 && strstr(err, "host_load"));
}

/* With sample records beside the checkout (CI has ../shared beside the clone) the hint names them and the
 * suite that runs on them; without, it still says where datasets go. Every path of that suite exists. */
static void test_missing_dataset_hint_offers_the_sample_data(void) {
    char hint[2048], path[1200];
    const char *src = getenv("KVB_SOURCE_DIR");
    CU_ASSERT_FATAL(src != NULL);
    CU_ASSERT(kvb_data_sample_path("nosuch", path, sizeof path) == 0 && !path[0]);
    char checkout[128]; /* a checkout with nothing beside it (under root: /tmp/shared may exist) */
    snprintf(checkout, sizeof checkout, "%s/checkout", root);
    CU_ASSERT_FATAL(mkdir(checkout, 0700) == 0);
    setenv("KVB_SOURCE_DIR", checkout, 1);
    setenv("KVB_DATA", "/data/kvb", 1);
    CU_ASSERT(kvb_data_sample_path("longbench", path, sizeof path) == 0 && !path[0]);
    kvb_data_hint("longbench", hint, sizeof hint);
    CU_ASSERT(strstr(hint, "/data/kvb") && !strstr(hint, "sample"));
    setenv("KVB_SOURCE_DIR", src, 1);
    unsetenv("KVB_DATA");
    /* this checkout, with the sample records beside it */
    if (!UTIL_SHARED_DATA("longbench/reconstructed_from_minilongbench", NULL, 0) ||
        !UTIL_SHARED_DATA("longmemeval/longmemeval_oracle.sample.json", NULL, 0))
        return;
    CU_ASSERT_FATAL(kvb_data_sample_path("longbench", path, sizeof path) == 1);
    snprintf(hint, sizeof hint, "%s/../shared/data/longbench/reconstructed_from_minilongbench", src);
    CU_ASSERT_STRING_EQUAL(path, hint);
    kvb_data_hint("longmemeval", hint, sizeof hint);
    CU_ASSERT(strstr(hint, "$KVB_DATA") && strstr(hint, "longmemeval_oracle.sample.json") && strstr(hint, "configs/sample-data.json"));
    /* configs/sample-data.json points at files that exist (run from the checkout's root, as ctest does) */
    char *text = util_read_file("configs/sample-data.json", NULL);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    CU_ASSERT_FATAL(j != NULL);
    int checked = 0;
    const cJSON *b;
    cJSON_ArrayForEach(b, cJSON_GetObjectItem(j, "benchmarks")) {
        const char *keys[3] = {"haystack", "config_dir", "path"};
        for (int k = 0; k < 3; k++) {
            const cJSON *v = cJSON_GetObjectItem(b, keys[k]);
            if (!cJSON_IsString(v)) continue;
            CU_ASSERT(access(v->valuestring, R_OK) == 0);
            checked++;
        }
        const cJSON *dir = cJSON_GetObjectItem(b, "data_dir"), *t;
        cJSON_ArrayForEach(t, cJSON_GetObjectItem(b, "tasks")) {
            snprintf(path, sizeof path, "%s/%s.jsonl", dir->valuestring, t->valuestring);
            CU_ASSERT(access(path, R_OK) == 0);
            checked++;
        }
    }
    CU_ASSERT(checked == 12); /* haystack, config, LongMemEval and 9 LongBench tasks */
    cJSON_Delete(j);
}

int main(void) {
    if (!mkdtemp(root)) return 1;
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("progress", NULL, NULL);
    CU_add_test(s, "log gets one line per sample and nothing within", test_log_gets_one_line_per_sample_and_nothing_within);
    CU_add_test(s, "terminal steps are rate limited", test_terminal_steps_are_rate_limited);
    CU_add_test(s, "host load sessions are appended to run.json", test_host_load_sessions_are_appended_to_run_json);
    CU_add_test(s, "missing dataset hint offers the sample data", test_missing_dataset_hint_offers_the_sample_data);
    int rc = util_run_suites();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd)) rc = 1;
    return rc;
}
