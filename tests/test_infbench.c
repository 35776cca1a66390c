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
#include "engine/model.h"

static kvb_model *model;
static char err[512];

static int64_t count_model(void *ctx, const char *text) {
    const kvb_model *m = ctx;
    int32_t *ids = NULL;
    int n = 0;
    char e[64];
    if (tok_encode(m->tok, text, strlen(text), 0, 0, &ids, &n, e, sizeof e)) return -1;
    free(ids);
    return n;
}

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


static int starts_with(const char *s, const char *p) { return s && !strncmp(s, p, strlen(p)); }

static void test_synthetic_generators_follow_the_official_recipe_and_templates(void) {
    CU_ASSERT_FATAL(model != NULL);
    const char *tasks[3] = {"passkey", "number_string", "kv_retrieval"};
    const char *head[3] = {
        "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz you about the important information.\n\n",
        "There is an important info hidden inside a lot of irrelevant text. Find it. I will quiz you about the important information there.\n\n",
        "Extract the value corresponding to the specified key in the JSON object below.\n\n"};
    int max_new[3] = {6, 12, 50};
    for (int t = 0; t < 3; t++) {
        kvb_samples a = {0}, b = {0};
        CU_ASSERT_FATAL(infbench_generate(tasks[t], 8192, 3, 5, count_model, model, &a, err, sizeof err) == 0);
        CU_ASSERT_FATAL(infbench_generate(tasks[t], 8192, 3, 5, count_model, model, &b, err, sizeof err) == 0);
        CU_ASSERT_FATAL(a.n == 3);
        for (int i = 0; i < a.n; i++) {
            const kvb_sample *s = &a.v[i];
            CU_ASSERT_STRING_EQUAL(s->prompt, b.v[i].prompt); /* seeded */
            CU_ASSERT(starts_with(s->prompt, head[t]));
            CU_ASSERT(!strncmp(s->prompt + strlen(head[t]), s->context, strlen(s->context)));
            CU_ASSERT_STRING_EQUAL(s->prompt + strlen(head[t]) + strlen(s->context), s->question);
            CU_ASSERT(s->max_new_tokens == max_new[t] && s->n_answers == 1);
            /* prompt + generation within 1% below the length (8192: a noise line or a UUID pair is 0.3-0.6% of it), in the model's tokens */
            CU_ASSERT(s->length + max_new[t] <= 8192 && s->length + max_new[t] >= 8192 * 0.99);
            if (s->length + max_new[t] < 8192 * 0.99) fprintf(stderr, "%s: %lld tokens\n", tasks[t], (long long)s->length);
            char needle[160];
            const char *key = s->answers[0];
            if (t == 0) {
                CU_ASSERT(strlen(key) == 5);
                snprintf(needle, sizeof needle, "The pass key is %s. Remember it. %s is the pass key.\n", key, key);
                CU_ASSERT_STRING_EQUAL(s->question, "\n\nWhat is the pass key?\n\nThe pass key is");
            } else if (t == 1) {
                CU_ASSERT(strlen(key) == 10);
                snprintf(needle, sizeof needle, "The sequence of digits is %s. Remember it. %s is the sequence of digits.\n", key, key);
                CU_ASSERT_STRING_EQUAL(s->question, "\n\nWhat is the sequence of digits?\n\nThe sequence of digits is");
            } else {
                CU_ASSERT(strlen(key) == 36);
                CU_ASSERT(starts_with(s->context, "JSON data:\n{\""));
                CU_ASSERT(starts_with(s->question, "\n\n\nKey: \""));
                char k[40];
                snprintf(k, sizeof k, "%.36s", s->question + 9);
                snprintf(needle, sizeof needle, "\"%s\": \"%s\"", k, key);
                CU_ASSERT(strstr(s->question, "\"\nThe value associated with the specified key is: ") != NULL);
            }
            const char *at = strstr(s->context, needle);
            CU_ASSERT_FATAL(at != NULL);
            /* the needle at the recorded depth: share of the noise lines (pairs) before it */
            if (t < 2) {
                int before = 0, total = 0;
                for (const char *p = s->context; (p = strstr(p, "The grass is green.")); p++) total++, before += p < at;
                CU_ASSERT_DOUBLE_EQUAL(s->depth, 100.0 * before / total, 1e-9);
            } else {
                int before = 0, total = 0;
                for (const char *p = s->context; (p = strstr(p, "\": \"")); p++) total++, before += p < at;
                CU_ASSERT_DOUBLE_EQUAL(s->depth, 100.0 * before / total, 1e-9);
            }
        }
        /* depths sweep the grid: the last sample of kv_retrieval sits at the end */
        if (t == 2) CU_ASSERT(a.v[0].depth == 0 && a.v[2].depth > 90);
        kvb_samples_free(&a), kvb_samples_free(&b);
    }
    kvb_samples c = {0};
    CU_ASSERT(infbench_generate("math_find", 2048, 1, 1, count_model, model, &c, err, sizeof err) == -1 && strstr(err, "math_find"));
    CU_ASSERT(infbench_generate("passkey", 40, 1, 1, count_model, model, &c, err, sizeof err) == -1 && c.n == 0);
}

int main(void) {
    char path[1024];
    if (util_default_model(path, sizeof path)) model = kvb_model_load(path, err, sizeof err);
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("infbench", NULL, NULL);
    CU_add_test(s, "gpt4 prediction files score as the official python", test_gpt4_prediction_files_score_as_the_official_python);
    CU_add_test(s, "edge cases score as the official python", test_edge_cases_score_as_the_official_python);
    CU_add_test(s, "unscored tasks and bad labels are refused", test_unscored_tasks_and_bad_labels_are_refused);
    CU_add_test(s, "synthetic generators follow the official recipe and templates", test_synthetic_generators_follow_the_official_recipe_and_templates);
    int rc = util_run_suites();
    kvb_model_free(model);
    return rc;
}
