/* test_metrics.c — LongBench's metrics in C against the official Python implementations: every case of
 * tests/fixtures/longbench_metrics.json (written by scripts/metrics_ref.py running LongBench/metrics.py as
 * eval.py scores a sample) must score the same within 1e-9; plus the dispatch rules (LongBench-E names,
 * Chinese tasks refused) and the runner-facing scorer. */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util_common.h"
#include "benchmarks/metrics.h"
#include "benchmarks/score.h"

/* A JSON array of strings as a NULL-safe C array (caller frees the array, not the strings). */
static const char **strings(const cJSON *a, int *n) {
    *n = cJSON_IsArray(a) ? cJSON_GetArraySize(a) : 0;
    const char **v = calloc((size_t)*n + 1, sizeof *v);
    for (int i = 0; i < *n; i++) v[i] = cJSON_GetArrayItem(a, i)->valuestring;
    return v;
}

static void test_fixture_cases_match_python(void) {
    char *text = util_read_file("tests/fixtures/longbench_metrics.json", NULL);
    CU_ASSERT_FATAL(text != NULL);
    cJSON *root = cJSON_Parse(text);
    free(text);
    const cJSON *cases = cJSON_GetObjectItem(root, "cases"), *c;
    CU_ASSERT_FATAL(cJSON_GetArraySize(cases) >= 100);
    int n_cases = 0, bad = 0;
    double worst = 0;
    cJSON_ArrayForEach(c, cases) {
        const char *task = cJSON_GetObjectItem(c, "task")->valuestring;
        const char *pred = cJSON_GetObjectItem(c, "pred")->valuestring;
        int na, nc;
        const char **ans = strings(cJSON_GetObjectItem(c, "answers"), &na);
        const char **cls = strings(cJSON_GetObjectItem(c, "all_classes"), &nc);
        double want = cJSON_GetObjectItem(c, "score")->valuedouble, got = -1;
        CU_ASSERT(kvb_longbench_score(task, pred, ans, na, cls, nc, &got) == 0);
        CU_ASSERT_STRING_EQUAL(kvb_longbench_metric(task), cJSON_GetObjectItem(c, "metric")->valuestring);
        double d = fabs(got - want);
        if (d > worst) worst = d;
        if (d > 1e-9) {
            bad++;
            fprintf(stderr, "\n  %s: C %.12f, Python %.12f for pred \"%.60s\"", task, got, want, pred);
        }
        free(ans), free(cls);
        n_cases++;
    }
    CU_ASSERT(bad == 0);
    fprintf(stderr, "\n  %d cases, max |C - Python| = %.3g\n", n_cases, worst);
    cJSON_Delete(root);
}

static void test_dispatch_and_refusals(void) {
    CU_ASSERT_STRING_EQUAL(kvb_longbench_metric("hotpotqa_e"), "qa_f1");
    CU_ASSERT_STRING_EQUAL(kvb_longbench_metric("repobench-p"), "code_sim");
    CU_ASSERT(kvb_longbench_metric("dureader") == NULL && kvb_longbench_metric("lsht") == NULL &&
              kvb_longbench_metric("nonsense") == NULL);
    double s;
    const char *a[1] = {"x"};
    CU_ASSERT(kvb_longbench_score("multifieldqa_zh", "x", a, 1, NULL, 0, &s) == -1);
    char msg[256];
    CU_ASSERT(kvb_score_check_task("vcsum", msg, sizeof msg) == -1 && strstr(msg, "jieba"));
    CU_ASSERT(kvb_score_check_task("frobnicate", msg, sizeof msg) == -1 && strstr(msg, "unknown"));
    CU_ASSERT(kvb_score_check_task("qasper", msg, sizeof msg) == 0);
    /* direct values that need no Python to check */
    CU_ASSERT_DOUBLE_EQUAL(kvb_metric_qa_f1("The cat sat", "a cat sat down"), 0.8, 1e-12);
    CU_ASSERT(kvb_metric_rouge_l("", "anything") == 0.0);
    CU_ASSERT(kvb_fuzz_ratio("abc", "abc") == 100 && kvb_fuzz_ratio("", "abc") == 0);
}

static void test_runner_scorer_uses_the_official_rules(void) {
    kvb_sample s = {0};
    char *answers[1] = {"Paris"};
    s.task = "triviaqa";
    s.answers = answers;
    s.n_answers = 1;
    double score = -1;
    char metric[32];
    /* first-line cut for triviaqa: the second line does not count */
    CU_ASSERT(kvb_score_sample("longbench", &s, "\nParis\nLondon Berlin", &score, metric, sizeof metric) == 0);
    CU_ASSERT_DOUBLE_EQUAL(score, 1.0, 1e-12);
    CU_ASSERT_STRING_EQUAL(metric, "qa_f1");
    s.task = "dureader";
    CU_ASSERT(kvb_score_sample("longbench", &s, "Paris", &score, metric, sizeof metric) == -1);
}

int main(void) {
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("metrics", NULL, NULL);
    CU_add_test(s, "fixture cases = official Python values", test_fixture_cases_match_python);
    CU_add_test(s, "dispatch, LongBench-E names, refusals", test_dispatch_and_refusals);
    CU_add_test(s, "runner scorer: first-line cut, metric name", test_runner_scorer_uses_the_official_rules);
    return util_run_suites();
}
