/* test_infbench.c — InfiniteBench's scorers (benchmarks/infbench.h) against the scores InfiniteBench's own
 * compute_scores.py gave (tests/fixtures/infinitebench/scores.json, made by scripts/infbench_ref.py): on the
 * official gpt-4 prediction files in ../shared/data/infinitebench/official_answer_keys/ and on edge cases (ROUGE-Lsum
 * of longbook_sum_eng included); the loader of the official jsonl files on small records written here; the
 * seeded generators. */
#include <CUnit/Basic.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util_common.h"
#include "benchmarks/infbench.h"
#include "benchmarks/prompt.h"
#include "engine/model.h"

static kvb_model *model;
static char err[512];

#define KEYS "infinitebench/official_answer_keys" /* in ../shared/data */

static cJSON *fixture(void) {
    char *text = util_read_file("tests/fixtures/infinitebench/scores.json", NULL);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    return j;
}

static void test_gpt4_prediction_files_score_as_the_official_python(void) {
    if (!UTIL_SHARED_DATA(KEYS, NULL, 0)) return;
    cJSON *j = fixture();
    CU_ASSERT_FATAL(j != NULL);
    const cJSON *files = cJSON_GetObjectItem(j, "files"), *f;
    CU_ASSERT(cJSON_GetArraySize(files) == 27); /* 9 tasks x 3 lines */
    int checked = 0;
    cJSON_ArrayForEach(f, files) {
        char path[512];
        snprintf(path, sizeof path, "../shared/data/" KEYS "/%s", cJSON_GetObjectItem(f, "file")->valuestring);
        char *text = util_read_file(path, NULL);
        int want = cJSON_GetObjectItem(f, "line")->valueint, line = 1;
        char *save = NULL, *l = text ? strtok_r(text, "\n", &save) : NULL;
        while (l && line < want) l = strtok_r(NULL, "\n", &save), line++;
        cJSON *r = l ? cJSON_Parse(l) : NULL;
        CU_ASSERT(r != NULL); /* not fatal: j and text are freed below */
        if (!r) {
            fprintf(stderr, "%s: no record on line %d\n", path, want);
            free(text);
            continue;
        }
        double s = -1;
        const char *task = cJSON_GetObjectItem(f, "task")->valuestring;
        CU_ASSERT(infbench_score(task, cJSON_GetObjectItem(r, "prediction")->valuestring, cJSON_GetObjectItem(r, "ground_truth"), &s) == 0);
        CU_ASSERT_DOUBLE_EQUAL(s, cJSON_GetObjectItem(f, "score")->valuedouble, 1e-12);
        if (s != cJSON_GetObjectItem(f, "score")->valuedouble) fprintf(stderr, "%s line %d: %g\n", task, want, s);
        checked++;
        cJSON_Delete(r);
        free(text);
    }
    CU_ASSERT(checked == 27);
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
    CU_ASSERT(infbench_score("math_calc", "x", str, &s) == -1);
    CU_ASSERT(infbench_score("longbook_sum_eng", "x", num, &s) == -1);
    CU_ASSERT(infbench_score("nope", "x", str, &s) == -1);
    CU_ASSERT(infbench_score("passkey", "3", num, &s) == -1);   /* passkey labels are strings */
    CU_ASSERT(infbench_score("code_debug", "A.", str, &s) == -1); /* [fn, letter] */
    CU_ASSERT(infbench_score("math_find", "3", str, &s) == -1);
    CU_ASSERT(infbench_has_scorer("kv_retrieval") && !infbench_has_scorer("math_calc"));
    cJSON_Delete(str);
    cJSON_Delete(num);
}


/* ---- the official files ---- */

static char dir[64];

static void write_file(const char *name, const char *text) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    CU_ASSERT_FATAL(f != NULL);
    fputs(text, f);
    fclose(f);
}

static int load(const char *task, kvb_samples *out) {
    char path[128];
    CU_ASSERT_FATAL(infbench_data_path(dir, task, path, sizeof path) == 0);
    return infbench_load(path, task, 0, out, err, sizeof err);
}

typedef struct {
    const char *task, *record, *prompt, *question;
    const char *answers[3];
    int max_new;
} load_case;

static const load_case CASES[] = {
    {"passkey", "{\"id\": 7, \"context\": \"noise 12345 noise\", \"input\": \"What is the pass key?\", \"answer\": \"12345\", \"options\": []}",
     "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz you about "
     "the important information.\n\nnoise 12345 noise\n\nWhat is the pass key?\n\nThe pass key is",
     "\n\nWhat is the pass key?\n\nThe pass key is", {"12345"}, 6},
    {"number_string", "{\"id\": 0, \"context\": \"C\", \"input\": \"What is the sequence of digits?\", \"answer\": [\"0123456789\"]}",
     "There is an important info hidden inside a lot of irrelevant text. Find it. I will quiz you about the important "
     "information there.\n\nC\n\nWhat is the sequence of digits?\n\nThe sequence of digits is",
     "\n\nWhat is the sequence of digits?\n\nThe sequence of digits is", {"0123456789"}, 12},
    {"kv_retrieval", "{\"id\": 1, \"context\": \"JSON data:\\n{\\\"a\\\": \\\"b\\\"}\", \"input\": \"Key: \\\"a\\\"\\nThe value associated with the specified key is: \", \"answer\": \"b\"}",
     "Extract the value corresponding to the specified key in the JSON object below.\n\nJSON data:\n{\"a\": \"b\"}\n\n"
     "Key: \"a\"\nThe value associated with the specified key is: ",
     "\n\nKey: \"a\"\nThe value associated with the specified key is: ", {"b"}, 50},
    {"longbook_sum_eng", "{\"id\": 2, \"context\": \"A {book}.\", \"input\": \"\", \"answer\": [\"It ends.\"]}",
     "Summarize the book below.\n\nA {book}.\n\nSummary:", "\n\nSummary:", {"It ends."}, 1200},
    {"longbook_choice_eng", "{\"id\": 3, \"context\": \"Book\", \"input\": \"Who?\", \"answer\": [\"Bo\"], \"options\": [\"Al\", \"Bo\", \"Cy\", \"Di\"]}",
     "Read the book and answer the question.\n\nBook\n\nQuestion: Who?\nA. Al\nB. Bo\nC. Cy\nD. Di\n\nThe letter of the correct answer is",
     "\n\nQuestion: Who?\nA. Al\nB. Bo\nC. Cy\nD. Di\n\nThe letter of the correct answer is", {"Bo", "B"}, 40},
    {"longbook_qa_eng", "{\"id\": 4, \"context\": \"Book\", \"input\": \"Where?\", \"answer\": [\"Skye\", \"the Hebrides\"], \"options\": []}",
     "Read the book and answer the question. Be very concise in your answer.\n\nBook\n\nQuestion: Where?\nAnswer:",
     "\n\nQuestion: Where?\nAnswer:", {"Skye", "the Hebrides"}, 40},
    {"longdialogue_qa_eng", "{\"id\": 5, \"context\": \"ACE: hi\\n$$MASK$$: yo\", \"input\": \"\", \"answer\": [\"ACE\"]}",
     "Below is a dialogue script where one random occurrence of a character name is replaced with \"$$MASK$$\", and you "
     "should try to guess who that character is.\n\nACE: hi\n$$MASK$$: yo\n\nThe name that has been replaced with $$MASK$$ is likely",
     "\n\nThe name that has been replaced with $$MASK$$ is likely", {"ACE"}, 40},
    {"math_find", "{\"id\": 6, \"context\": \"[3, 9, 1]\", \"input\": \"What is the largest number in the list above? The Largest Number of the list is\", \"answer\": 9}",
     "What is the largest number in the following list?\n\n[3, 9, 1]\n\nWhat is the largest number in the list above? The Largest Number of the list is",
     "\n\nWhat is the largest number in the list above? The Largest Number of the list is", {"9"}, 3},
    {"code_debug", "{\"id\": 8, \"context\": \"def f(): pass\", \"input\": \"\", \"answer\": \"g\", \"options\": [\"f\", \"g\", \"h\", \"i\"]}",
     "Following is a Python code where exactly one of the functions/methods has a deliberate error that makes it crash.\n\n"
     "def f(): pass\n\nOptions:\nA. f\nB. g\nC. h\nD. i\n\nThe correct option is:",
     "\n\nOptions:\nA. f\nB. g\nC. h\nD. i\n\nThe correct option is:", {"g", "B"}, 5},
};

static void test_official_records_load_with_the_yarn_mistral_templates_and_labels(void) {
    for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) {
        const load_case *c = &CASES[i];
        char name[64], text[2048];
        snprintf(name, sizeof name, "%s.jsonl", c->task);
        snprintf(text, sizeof text, "%s\n\n%s\n", c->record, c->record); /* a blank line is skipped */
        write_file(name, text);
        kvb_samples v = {0};
        CU_ASSERT_FATAL(load(c->task, &v) == 0);
        CU_ASSERT_FATAL(v.n == 2);
        const kvb_sample *s = &v.v[0];
        CU_ASSERT_STRING_EQUAL(s->task, c->task);
        CU_ASSERT_STRING_EQUAL(s->prompt, c->prompt);
        CU_ASSERT_STRING_EQUAL(s->question, c->question);
        CU_ASSERT(strstr(s->prompt, s->context) && !strcmp(strstr(s->prompt, s->context) + strlen(s->context), s->question));
        CU_ASSERT(s->max_new_tokens == c->max_new && s->use_chat == 1);
        int n = 0;
        while (n < 3 && c->answers[n]) n++;
        CU_ASSERT_FATAL(s->n_answers == n);
        for (int k = 0; k < n; k++) CU_ASSERT_STRING_EQUAL(s->answers[k], c->answers[k]);
        if (strcmp(s->prompt, c->prompt)) fprintf(stderr, "%s: %s\n", c->task, s->prompt);
        kvb_samples_free(&v);
    }
    /* limit, and the line number as id when the record has none */
    write_file("passkey.jsonl", "{\"context\": \"a\", \"input\": \"q\", \"answer\": \"1\"}\n{\"context\": \"b\", \"input\": \"q\", \"answer\": \"2\"}\n");
    kvb_samples v = {0};
    char path[128];
    snprintf(path, sizeof path, "%s/passkey.jsonl", dir);
    CU_ASSERT(infbench_load(path, "passkey", 1, &v, err, sizeof err) == 0 && v.n == 1 && !strcmp(v.v[0].id, "1"));
    kvb_samples_free(&v);
}

static void test_loaded_labels_score_as_get_answer_builds_them(void) {
    double s = -1;
    const char *choice[2] = {"Bo", "B"}, *num[1] = {"9"}, *frac[1] = {"2.5"}, *qa[2] = {"Skye", "the Hebrides"};
    CU_ASSERT(infbench_score_answers("longbook_choice_eng", "B", choice, 2, &s) == 0 && s == 1);
    CU_ASSERT(infbench_score_answers("code_debug", "The answer is: Bo", choice, 2, &s) == 0 && s == 1);
    CU_ASSERT(infbench_score_answers("math_find", "9", num, 1, &s) == 0 && s == 1);
    CU_ASSERT(infbench_score_answers("math_find", "2.5", frac, 1, &s) == 0 && s == 1);
    CU_ASSERT(infbench_score_answers("longbook_qa_eng", "Hebrides", qa, 2, &s) == 0 && s > 0.6);
    CU_ASSERT(infbench_score_answers("longbook_sum_eng", "the hebrides", qa, 2, &s) == 0 && s == 1);
    CU_ASSERT(infbench_score_answers("passkey", "123", num, 0, &s) == -1);
}

static void expect_error(const char *task, const char *text, const char *what) {
    char name[64], want[160];
    snprintf(name, sizeof name, "%s.jsonl", task);
    write_file(name, text);
    kvb_samples v = {0};
    CU_ASSERT(load(task, &v) == -1 && v.n == 0 && v.v == NULL);
    snprintf(want, sizeof want, "%s/%s:2: ", dir, name);
    CU_ASSERT(!strncmp(err, want, strlen(want)) && strstr(err, what) && !strchr(err, '\n'));
    if (strncmp(err, want, strlen(want)) || !strstr(err, what)) fprintf(stderr, "got: %s\n", err);
}

static void test_malformed_records_are_one_line_errors_naming_file_and_line(void) {
    const char *ok = "{\"id\": 0, \"context\": \"c\", \"input\": \"What is the pass key?\", \"answer\": \"1\"}\n";
    char text[512];
    snprintf(text, sizeof text, "%s{\"input\": \"q\", \"answer\": \"1\"}\n", ok);
    expect_error("passkey", text, "'context'");
    snprintf(text, sizeof text, "%s{\"context\": \"c\", \"input\": 3, \"answer\": \"1\"}\n", ok);
    expect_error("passkey", text, "'input'");
    snprintf(text, sizeof text, "%s{\"context\": \"c\", \"input\": \"q\", \"answer\": 5}\n", ok);
    expect_error("passkey", text, "'answer'");
    snprintf(text, sizeof text, "%s{\"context\": \"c\", \"input\": \"q\", \"answer\": \"1\", \"id\": \"x\"}\n", ok);
    expect_error("passkey", text, "'id'");
    snprintf(text, sizeof text, "%s{\"context\": \"c\", \"input\": \n", ok);
    expect_error("passkey", text, "JSON");
    snprintf(text, sizeof text, "%s[1, 2]\n", ok);
    expect_error("passkey", text, "object");
    const char *opt = "\"options\": [\"a\", \"b\", \"c\", \"d\"]";
    snprintf(text, sizeof text, "{\"context\": \"c\", \"input\": \"q\", \"answer\": \"a\", %s}\n{\"context\": \"c\", \"input\": \"q\", \"answer\": \"z\", %s}\n", opt, opt);
    expect_error("longbook_choice_eng", text, "options");
    snprintf(text, sizeof text, "{\"context\": \"c\", \"input\": \"q\", \"answer\": \"a\", %s}\n{\"context\": \"c\", \"input\": \"q\", \"answer\": \"a\", \"options\": [\"a\"]}\n", opt);
    expect_error("code_debug", text, "4 strings");
    snprintf(text, sizeof text, "{\"context\": \"c\", \"input\": \"The max of\", \"answer\": 1}\n{\"context\": \"c\", \"input\": \"What is it?\", \"answer\": 1}\n");
    expect_error("math_find", text, "The ... of");
    snprintf(text, sizeof text, "{\"context\": \"c\", \"input\": \"The max of\", \"answer\": 1}\n{\"context\": \"c\", \"input\": \"The max of\", \"answer\": \"x\"}\n");
    expect_error("math_find", text, "not a number");
    kvb_samples v = {0};
    CU_ASSERT(infbench_load("/nonexistent/passkey.jsonl", "passkey", 0, &v, err, sizeof err) == -1 && strstr(err, "/nonexistent/passkey.jsonl"));
    CU_ASSERT(infbench_load("x.jsonl", "code_run", 0, &v, err, sizeof err) == -1 && strstr(err, "code_run"));
}

/* eval_yarn_mistral.py's truncate_by_tokens: an over-long prompt keeps its first and last halves, in the model's
 * tokens, so the instruction and the question survive and the middle of the context goes. */
static void test_long_records_are_middle_truncated_in_the_models_tokens(void) {
    CU_ASSERT_FATAL(model != NULL);
    kvb_sb b = {0};
    kvb_sb_adds(&b, "{\"id\": 0, \"context\": \"");
    for (int i = 0; i < 400; i++) kvb_sb_adds(&b, "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.\\n");
    kvb_sb_adds(&b, "\", \"input\": \"What is the pass key?\", \"answer\": \"12345\"}\n");
    char *text = kvb_sb_take(&b);
    write_file("passkey.jsonl", text);
    free(text);
    kvb_samples v = {0};
    CU_ASSERT_FATAL(load("passkey", &v) == 0 && v.n == 1);
    CU_ASSERT(kvb_count_tokens(model, v.v[0].prompt) > 4000);
    kvb_prompt p = {0};
    CU_ASSERT_FATAL(kvb_prompt_build(model, &v.v[0], 1024, 512, &p, err, sizeof err) == 0);
    CU_ASSERT(p.truncated && p.n <= 1024 && p.n >= 1024 - 64 - 4);
    char *dec = NULL;
    CU_ASSERT_FATAL(tok_decode(model->tok, p.ids, (int)p.n, &dec) == 0);
    const char *head = strstr(dec, "There is an important info hidden inside"), *tail = strstr(dec, "What is the pass key?\n\nThe pass key is");
    CU_ASSERT(head && tail && head < tail);
    free(dec);
    kvb_prompt_free(&p);
    kvb_samples_free(&v);
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
        CU_ASSERT_FATAL(infbench_generate(tasks[t], 8192, 3, 1, 5, kvb_count_tokens, model, &a, err, sizeof err) == 0);
        CU_ASSERT_FATAL(infbench_generate(tasks[t], 8192, 3, 1, 5, kvb_count_tokens, model, &b, err, sizeof err) == 0);
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
    CU_ASSERT(infbench_generate("math_find", 2048, 1, 1, 1, kvb_count_tokens, model, &c, err, sizeof err) == -1 && strstr(err, "math_find"));
    CU_ASSERT(infbench_generate("passkey", 40, 1, 1, 1, kvb_count_tokens, model, &c, err, sizeof err) == -1 && c.n == 0);
    /* several queries per haystack: kv_retrieval's only */
    CU_ASSERT(infbench_generate("passkey", 2048, 2, 2, 1, kvb_count_tokens, model, &c, err, sizeof err) == -1 &&
              strstr(err, "kv_retrieval") && c.n == 0);
}

/* kv_retrieval with 3 queries per haystack: 5 samples = haystacks of 3 and 2 queries, each group one context,
 * its queries asking different pairs spread over the depth; the groups differ. */
static void test_kv_retrieval_queries_per_context_share_one_haystack(void) {
    CU_ASSERT_FATAL(model != NULL);
    kvb_samples a = {0};
    CU_ASSERT_FATAL(infbench_generate("kv_retrieval", 2048, 5, 3, 5, kvb_count_tokens, model, &a, err, sizeof err) == 0);
    CU_ASSERT_FATAL(a.n == 5);
    for (int i = 0; i < a.n; i++) {
        const kvb_sample *s = &a.v[i], *first = &a.v[i / 3 * 3];
        char group[64];
        snprintf(group, sizeof group, "kv_retrieval_2048_g%d", i / 3);
        CU_ASSERT(s->group && !strcmp(s->group, group));
        CU_ASSERT_STRING_EQUAL(s->context, first->context);
        CU_ASSERT(s->length + 50 <= 2048 + 8); /* fitted to the first query; a UUID tokenizes within a few tokens */
        if (i % 3) CU_ASSERT(strcmp(s->question, a.v[i - 1].question) != 0 && s->depth > a.v[i - 1].depth);
    }
    CU_ASSERT(strcmp(a.v[0].context, a.v[3].context) != 0);
    kvb_samples_free(&a);
}

int main(void) {
    char path[1024];
    if (util_default_model(path, sizeof path)) model = kvb_model_load(path, err, sizeof err);
    snprintf(dir, sizeof dir, "/tmp/kvb_infbench_XXXXXX");
    if (!mkdtemp(dir)) return 1;
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("infbench", NULL, NULL);
    CU_add_test(s, "gpt4 prediction files score as the official python", test_gpt4_prediction_files_score_as_the_official_python);
    CU_add_test(s, "edge cases score as the official python", test_edge_cases_score_as_the_official_python);
    CU_add_test(s, "unscored tasks and bad labels are refused", test_unscored_tasks_and_bad_labels_are_refused);
    CU_add_test(s, "synthetic generators follow the official recipe and templates", test_synthetic_generators_follow_the_official_recipe_and_templates);
    CU_add_test(s, "kv_retrieval queries per context share one haystack", test_kv_retrieval_queries_per_context_share_one_haystack);
    CU_add_test(s, "official records load with the yarn-mistral templates and labels", test_official_records_load_with_the_yarn_mistral_templates_and_labels);
    CU_add_test(s, "loaded labels score as get_answer builds them", test_loaded_labels_score_as_get_answer_builds_them);
    CU_add_test(s, "malformed records are one-line errors naming file and line", test_malformed_records_are_one_line_errors_naming_file_and_line);
    CU_add_test(s, "long records are middle-truncated in the model's tokens", test_long_records_are_middle_truncated_in_the_models_tokens);
    int rc = util_run_suites();
    kvb_model_free(model);
    static const char *const names[] = {"passkey", "number_string", "kv_retrieval", "longbook_sum_eng", "longbook_choice_eng",
                                        "longbook_qa_eng", "longdialogue_qa_eng", "math_find", "code_debug"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char path[128];
        snprintf(path, sizeof path, "%s/%s.jsonl", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
    return rc;
}
