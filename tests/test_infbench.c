/* test_infbench.c — InfiniteBench's scorers (benchmarks/infbench.h) against the scores InfiniteBench's own
 * compute_scores.py gave (tests/fixtures/infinitebench/scores.json, made by scripts/infbench_ref.py): on the
 * official gpt-4 prediction files in ../shared/data/infinitebench/official_answer_keys/ and on edge cases. */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util_common.h"
#include "benchmarks/infbench.h"

#define KEYS "../shared/data/infinitebench/official_answer_keys/"

static cJSON *fixture(void) {
    char *text = util_read_file("tests/fixtures/infinitebench/scores.json", NULL);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    return j;
}

static void test_gpt4_prediction_files_score_as_the_official_python(void) {
    cJSON *j = fixture();
    CU_ASSERT_FATAL(j != NULL);
    const cJSON *files = cJSON_GetObjectItem(j, "files"), *f;
    CU_ASSERT(cJSON_GetArraySize(files) == 24); /* 8 tasks x 3 lines */
    int checked = 0;
    cJSON_ArrayForEach(f, files) {
        char path[512];
        snprintf(path, sizeof path, KEYS "%s", cJSON_GetObjectItem(f, "file")->valuestring);
        char *text = util_read_file(path, NULL);
        CU_ASSERT_FATAL(text != NULL);
        int want = cJSON_GetObjectItem(f, "line")->valueint, line = 1;
        char *save = NULL, *l = strtok_r(text, "\n", &save);
        while (l && line < want) l = strtok_r(NULL, "\n", &save), line++;
        CU_ASSERT_FATAL(l != NULL);
        cJSON *r = cJSON_Parse(l);
        CU_ASSERT_FATAL(r != NULL);
        double s = -1;
        const char *task = cJSON_GetObjectItem(f, "task")->valuestring;
        CU_ASSERT(infbench_score(task, cJSON_GetObjectItem(r, "prediction")->valuestring, cJSON_GetObjectItem(r, "ground_truth"), &s) == 0);
        CU_ASSERT_DOUBLE_EQUAL(s, cJSON_GetObjectItem(f, "score")->valuedouble, 1e-12);
        if (s != cJSON_GetObjectItem(f, "score")->valuedouble) fprintf(stderr, "%s line %d: %g\n", task, want, s);
        checked++;
        cJSON_Delete(r);
        free(text);
    }
    CU_ASSERT(checked == 24);
    cJSON_Delete(j);
}

static void test_edge_cases_score_as_the_official_python(void) {
    cJSON *j = fixture();
    CU_ASSERT_FATAL(j != NULL);
    const cJSON *cases = cJSON_GetObjectItem(j, "cases"), *c;
    CU_ASSERT(cJSON_GetArraySize(cases) >= 20);
    cJSON_ArrayForEach(c, cases) {
        const char *task = cJSON_GetObjectItem(c, "task")->valuestring, *pred = cJSON_GetObjectItem(c, "pred")->valuestring;
        double s = -1;
        CU_ASSERT(infbench_score(task, pred, cJSON_GetObjectItem(c, "label"), &s) == 0);
        CU_ASSERT_DOUBLE_EQUAL(s, cJSON_GetObjectItem(c, "score")->valuedouble, 1e-12);
        if (s != cJSON_GetObjectItem(c, "score")->valuedouble) fprintf(stderr, "%s '%s': %g\n", task, pred, s);
    }
    cJSON_Delete(j);
}

static void test_unscored_tasks_and_bad_labels_are_refused(void) {
    double s;
    cJSON *str = cJSON_CreateString("x"), *num = cJSON_CreateNumber(3);
    CU_ASSERT(infbench_score("longbook_sum_eng", "x", str, &s) == -1);
    CU_ASSERT(infbench_score("nope", "x", str, &s) == -1);
    CU_ASSERT(infbench_score("passkey", "3", num, &s) == -1);   /* passkey labels are strings */
    CU_ASSERT(infbench_score("code_debug", "A.", str, &s) == -1); /* [fn, letter] */
    CU_ASSERT(infbench_score("math_find", "3", str, &s) == -1);
    CU_ASSERT(infbench_has_scorer("kv_retrieval") && !infbench_has_scorer("math_calc"));
    cJSON_Delete(str);
    cJSON_Delete(num);
}

int main(void) {
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("infbench", NULL, NULL);
    CU_add_test(s, "gpt4 prediction files score as the official python", test_gpt4_prediction_files_score_as_the_official_python);
    CU_add_test(s, "edge cases score as the official python", test_edge_cases_score_as_the_official_python);
    CU_add_test(s, "unscored tasks and bad labels are refused", test_unscored_tasks_and_bad_labels_are_refused);
    return util_run_suites();
}
