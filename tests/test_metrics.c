/* test_metrics.c — LongBench's metrics in C against the official Python implementations: every case of
 * tests/fixtures/longbench_metrics.json (written by scripts/metrics_ref.py running LongBench/metrics.py as
 * eval.py scores a sample) must score the same within 1e-9; plus the dispatch rules (LongBench-E names,
 * Chinese tasks refused while jieba's data is missing) and the runner-facing scorer. The Chinese metrics' values:
 * tests/test_metrics_zh.c. */
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
    CU_ASSERT_FATAL(cJSON_GetArraySize(cases) >= 120);
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
        CU_ASSERT_STRING_EQUAL(kvb_longbench_metric_name(task), cJSON_GetObjectItem(c, "metric")->valuestring);
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
    CU_ASSERT_STRING_EQUAL(kvb_longbench_metric_name("hotpotqa_e"), "qa_f1");
    CU_ASSERT_STRING_EQUAL(kvb_longbench_metric_name("repobench-p"), "code_sim");
    CU_ASSERT_STRING_EQUAL(kvb_longbench_metric_name("dureader"), "rouge_zh");
    CU_ASSERT_STRING_EQUAL(kvb_longbench_metric_name("lsht"), "classification");
    CU_ASSERT(kvb_longbench_metric_name("nonsense") == NULL);
    double s;
    const char *a[1] = {"x"};
    /* main() points KVB_JIEBA_DIR at nothing: the jieba-scored tasks are refused, naming the fetch command */
    CU_ASSERT(kvb_longbench_score("multifieldqa_zh", "x", a, 1, NULL, 0, &s) == -1);
    char msg[256];
    CU_ASSERT(kvb_score_check_task("vcsum", msg, sizeof msg) == -1 && strstr(msg, "scripts/fetch-datasets.sh jieba"));
    CU_ASSERT(kvb_score_check_task("lsht", msg, sizeof msg) == 0); /* classification: no jieba */
    CU_ASSERT(kvb_score_check_task("passage_retrieval_zh", msg, sizeof msg) == 0);
    CU_ASSERT(kvb_score_check_task("frobnicate", msg, sizeof msg) == -1 && strstr(msg, "unknown"));
    CU_ASSERT(kvb_score_check_task("qasper", msg, sizeof msg) == 0);
    CU_ASSERT(kvb_longbench_score("trec_e", "City\nCountry", (const char *[]){"City"}, 1,
                                  (const char *[]){"City", "Country"}, 2, &s) == 0);
    CU_ASSERT_DOUBLE_EQUAL(s, 1.0, 1e-12); /* LongBench-E name keeps the first-line cut */
}

/* Values that need no Python to check: the rules a reader of metrics.py can verify by hand. */
static void test_direct_values(void) {
    CU_ASSERT_DOUBLE_EQUAL(kvb_metric_qa_f1("The cat sat", "a cat sat down"), 0.8, 1e-12);
    CU_ASSERT(kvb_metric_qa_f1("the a an", "the") == 0.0);          /* nothing left after the articles */
    CU_ASSERT(kvb_metric_qa_f1("NGUYỄN", "Nguyễn") == 1.0);          /* full Unicode lowercase */
    CU_ASSERT(kvb_metric_qa_f1("ΟΔΥΣΣΕΥΣ", "οδυσσευς") == 1.0);      /* final sigma */
    CU_ASSERT(kvb_metric_qa_f1("İ", "i") == 0.0);                    /* U+0130 lowers to "i" + U+0307 */
    CU_ASSERT(kvb_metric_rouge("", "anything") == 0.0);              /* the package raises: empty hypothesis */
    CU_ASSERT(kvb_metric_rouge("...", "a b") == 0.0);                /* only dots: no sentence either */
    CU_ASSERT(kvb_metric_rouge("x", "") == 0.0);
    CU_ASSERT_DOUBLE_EQUAL(kvb_metric_rouge("a b c", "a b c"), 2.0 * (1.0 / (2.0 + 1e-8)), 1e-15);
    CU_ASSERT(kvb_metric_count("１２ and 12", "12") == 0.5);         /* \d+ matches fullwidth digits too */
    CU_ASSERT(kvb_metric_retrieval("3, 4", "no paragraph here") == 0.0);
    CU_ASSERT_DOUBLE_EQUAL(kvb_metric_retrieval("Paragraph 3, or 13", "Paragraph 3"), 0.5, 1e-12);
    CU_ASSERT(kvb_fuzz_ratio("abc", "abc") == 100 && kvb_fuzz_ratio("", "abc") == 0 && kvb_fuzz_ratio("", "") == 100);
    CU_ASSERT(kvb_fuzz_ratio("ab", "ac") == 50);
    CU_ASSERT(kvb_fuzz_ratio("abcd", "abce") == 75); /* 2 * 3 / 8 */
    CU_ASSERT(kvb_fuzz_ratio("a", "ab") == 67);      /* 66.67 */
    CU_ASSERT_DOUBLE_EQUAL(kvb_metric_code_sim("# c\n// d\n```\nx = 1", "x = 1"), 1.0, 1e-12);
    /* classification: "Organ" is inside the gold "Organ of body" and is dropped */
    const char *cls[] = {"Organ", "Organ of body", "City"};
    CU_ASSERT_DOUBLE_EQUAL(kvb_metric_classification("Organ of body", "Organ of body", cls, 3), 1.0, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(kvb_metric_classification("City or Organ of body", "Organ of body", cls, 3), 0.5, 1e-12);
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
    setenv("KVB_JIEBA_DIR", "/nonexistent/kvb-jieba", 1); /* before the first use: jieba's data absent */
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("metrics", NULL, NULL);
    CU_add_test(s, "fixture cases = official Python values", test_fixture_cases_match_python);
    CU_add_test(s, "dispatch, LongBench-E names, refusals", test_dispatch_and_refusals);
    CU_add_test(s, "direct values: articles, Unicode case and digits, empty Rouge, fuzz.ratio", test_direct_values);
    CU_add_test(s, "runner scorer: first-line cut, metric name", test_runner_scorer_uses_the_official_rules);
    return util_run_suites();
}
