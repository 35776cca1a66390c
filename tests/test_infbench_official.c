/* test_infbench_official.c — InfiniteBench's official files end to end: for each of the nine tasks, records in
 * the official format (tests/fixtures/infinitebench/official/<task>.jsonl) load with the prompt InfiniteBench's
 * create_prompt gives (yarn-mistral), get_answer's label and DATA_NAME_TO_MAX_NEW_TOKENS, and their predictions
 * score as compute_scores.py's get_score_one_* scored them (expected.json, made by scripts/infbench_fixtures.py);
 * an over-long prompt keeps its first and last halves in the model's tokens (truncate_input's middle cut); a
 * suite's "path" names one file or the directory of the files; and a suite with "path" runs passkey and
 * kv_retrieval on the default model. */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util_common.h"
#include "benchmarks/infbench.h"
#include "benchmarks/prompt.h"
#include "benchmarks/registry.h"
#include "benchmarks/score.h"
#include "engine/model.h"
#include "engine/tokenizer.h"

#define FIX "tests/fixtures/infinitebench/official"

static kvb_model *model;
static char err[512], dir[64] = "/tmp/kvb_ib_official_XXXXXX";

static cJSON *expected(void) {
    char *text = util_read_file(FIX "/expected.json", NULL);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    return j;
}

/* The label as the loader stores it: a list's strings, a string, a number as "%.17g". */
static int label_strings(const cJSON *label, char out[][256], int cap) {
    int n = 0;
    const cJSON *x;
    if (!cJSON_IsArray(label)) {
        if (cJSON_IsNumber(label)) snprintf(out[n++], 256, "%.17g", label->valuedouble);
        else snprintf(out[n++], 256, "%s", label->valuestring);
        return n;
    }
    cJSON_ArrayForEach(x, label) if (n < cap) snprintf(out[n++], 256, "%s", x->valuestring);
    return n;
}

static void test_official_records_load_and_score_as_the_official_python(void) {
    cJSON *e = expected(), *task;
    CU_ASSERT_FATAL(e != NULL);
    int n_tasks = 0, n_preds = 0;
    cJSON_ArrayForEach(task, cJSON_GetObjectItem(e, "tasks")) {
        char path[256];
        snprintf(path, sizeof path, FIX "/%s.jsonl", task->string);
        kvb_samples v = {0};
        CU_ASSERT_FATAL(infbench_load(path, task->string, 0, &v, err, sizeof err) == 0);
        cJSON *recs = cJSON_GetObjectItem(task, "records"), *rec;
        CU_ASSERT_FATAL(v.n == cJSON_GetArraySize(recs));
        int i = 0;
        cJSON_ArrayForEach(rec, recs) {
            const kvb_sample *s = &v.v[i++];
            char id[32];
            snprintf(id, sizeof id, "%d", cJSON_GetObjectItem(rec, "id")->valueint);
            CU_ASSERT_STRING_EQUAL(s->id, id);
            CU_ASSERT_STRING_EQUAL(s->prompt, cJSON_GetObjectItem(rec, "prompt")->valuestring);
            CU_ASSERT(s->max_new_tokens == cJSON_GetObjectItem(task, "max_new_tokens")->valueint);
            char want[4][256];
            int n = label_strings(cJSON_GetObjectItem(rec, "label"), want, 4);
            CU_ASSERT_FATAL(s->n_answers == n);
            for (int k = 0; k < n; k++) CU_ASSERT_STRING_EQUAL(s->answers[k], want[k]);
            cJSON *p;
            cJSON_ArrayForEach(p, cJSON_GetObjectItem(rec, "predictions")) {
                const char *pred = cJSON_GetObjectItem(p, "prediction")->valuestring;
                double want_score = cJSON_GetObjectItem(p, "score")->valuedouble, got = -1, direct = -1;
                char metric[64];
                /* through the registry's scorer, as the runner scores a record ... */
                CU_ASSERT(kvb_score_sample("infinitebench", s, pred, &got, metric, sizeof metric) == 0);
                /* ... and on the official label itself */
                CU_ASSERT(infbench_score(task->string, pred, cJSON_GetObjectItem(rec, "label"), &direct) == 0);
                CU_ASSERT(fabs(got - want_score) < 1e-12 && fabs(direct - want_score) < 1e-12);
                if (fabs(got - want_score) >= 1e-12)
                    fprintf(stderr, "\n  %s %s %s: %g, official %g\n", task->string, id, pred, got, want_score);
                n_preds++;
            }
        }
        kvb_samples_free(&v);
        n_tasks++;
    }
    CU_ASSERT(n_tasks == 9 && n_preds > 60);
    cJSON_Delete(e);
}

/* truncate_input(tok.encode(prompt), max, "middle"): the first and last max//2 ids, decoded and put together. */
static void test_over_long_prompts_keep_their_first_and_last_halves_in_the_models_tokens(void) {
    CU_ASSERT_FATAL(model != NULL);
    kvb_samples v = {0};
    CU_ASSERT_FATAL(infbench_load(FIX "/kv_retrieval.jsonl", "kv_retrieval", 1, &v, err, sizeof err) == 0 && v.n == 1);
    kvb_sample *s = &v.v[0];
    s->use_chat = 0; /* the prompt alone, as eval_yarn_mistral.py feeds it */
    int32_t *ids = NULL;
    int n = 0;
    CU_ASSERT_FATAL(tok_encode(model->tok, s->prompt, strlen(s->prompt), 0, 0, &ids, &n, err, sizeof err) == 0);
    int64_t max = n / 2;
    kvb_prompt p = {0};
    CU_ASSERT_FATAL(kvb_prompt_build(model, s, max, 0, &p, err, sizeof err) == 0);
    CU_ASSERT(p.truncated && p.n <= max);
    int half = (int)(max - 4) / 2; /* the builder leaves 4 tokens for BOS and the like outside a chat template */
    char *head = NULL, *tail = NULL, *dec = NULL;
    CU_ASSERT_FATAL(tok_decode(model->tok, ids, half, &head) == 0 && tok_decode(model->tok, ids + n - half, half, &tail) == 0);
    CU_ASSERT_FATAL(tok_decode(model->tok, p.ids, (int)p.n, &dec) == 0);
    const char *at = strstr(dec, head);
    CU_ASSERT(at != NULL && !strcmp(at + strlen(head), tail)); /* head then tail, nothing between or after */
    CU_ASSERT(strstr(dec, "Extract the value corresponding") && strstr(tail, "The value associated with the specified key is: "));
    free(head), free(tail), free(dec), free(ids);
    kvb_prompt_free(&p);
    kvb_samples_free(&v);
}

/* ---- a suite entry's "path" ---- */

typedef struct { kvb_samples sets[12]; char names[12][64]; int n; } tasks;

static kvb_samples *add_task(void *ctx, const char *name, const char *benchmark, kvb_judge_kind judge, char *e, size_t el) {
    (void)benchmark, (void)judge, (void)e, (void)el;
    tasks *t = ctx;
    snprintf(t->names[t->n], sizeof t->names[0], "%s", name);
    return &t->sets[t->n++];
}

static int expand(const char *in, char *out, size_t cap) { return (size_t)snprintf(out, cap, "%s", in) >= cap ? -1 : 0; }

/* Load one suite entry; *t gets its tasks. */
static int load_entry(const char *json, tasks *t) {
    memset(t, 0, sizeof *t);
    cJSON *b = cJSON_Parse(json);
    CU_ASSERT_FATAL(b != NULL);
    kvb_bench_env env = {.suite_path = "s.json", .n_ctx_train = 8192, .expand_path = expand, .add_task = add_task, .add_ctx = t};
    int rc = kvb_benchmark_find("infinitebench")->load(&env, b, err, sizeof err);
    cJSON_Delete(b);
    return rc;
}

static void free_tasks(tasks *t) {
    for (int i = 0; i < t->n; i++) kvb_samples_free(&t->sets[i]);
}

static void test_a_suite_path_names_one_file_or_the_directory_of_the_files(void) {
    tasks t;
    /* a directory: <dir>/<task>.jsonl for each task named */
    CU_ASSERT(load_entry("{\"type\": \"infinitebench\", \"path\": \"" FIX "\", \"tasks\": [\"passkey\", \"kv_retrieval\"]}", &t) == 0);
    CU_ASSERT(t.n == 2 && !strcmp(t.names[0], "passkey") && !strcmp(t.names[1], "kv_retrieval") && t.sets[0].n == 3 && t.sets[1].n == 3);
    free_tasks(&t);
    /* "samples" keeps the first N records */
    CU_ASSERT(load_entry("{\"type\": \"infinitebench\", \"path\": \"" FIX "\", \"tasks\": [\"math_find\"], \"samples\": 2}", &t) == 0);
    CU_ASSERT(t.n == 1 && t.sets[0].n == 2);
    free_tasks(&t);
    /* one file: its task named, or told by the file's name (the example) */
    CU_ASSERT(load_entry("{\"type\": \"infinitebench\", \"tasks\": [\"passkey\"], \"path\": \"" FIX "/passkey.jsonl\"}", &t) == 0);
    CU_ASSERT(t.n == 1 && !strcmp(t.names[0], "passkey") && t.sets[0].n == 3);
    free_tasks(&t);
    CU_ASSERT(load_entry("{\"type\": \"infinitebench\", \"path\": \"" FIX "/code_debug.jsonl\"}", &t) == 0);
    CU_ASSERT(t.n == 1 && !strcmp(t.names[0], "code_debug") && t.sets[0].n == 2);
    free_tasks(&t);
    /* a file's records read as the task named (a file named otherwise) */
    CU_ASSERT(load_entry("{\"type\": \"infinitebench\", \"tasks\": [\"number_string\"], \"path\": \"" FIX "/passkey.jsonl\"}", &t) == 0);
    CU_ASSERT(t.n == 1 && !strcmp(t.names[0], "number_string") && t.sets[0].v[0].max_new_tokens == 12);
    free_tasks(&t);
    /* "data_dir" is the directory form */
    CU_ASSERT(load_entry("{\"type\": \"infinitebench\", \"data_dir\": \"" FIX "\", \"tasks\": [\"longbook_sum_eng\"]}", &t) == 0);
    CU_ASSERT(t.n == 1 && t.sets[0].n == 2);
    free_tasks(&t);
    /* refusals, one line each */
    static const struct { const char *entry, *says; } BAD[] = {
        {"{\"type\": \"infinitebench\", \"path\": \"" FIX "/passkey.jsonl\", \"tasks\": [\"passkey\", \"kv_retrieval\"]}", "one file"},
        {"{\"type\": \"infinitebench\", \"path\": \"" FIX "/expected.json\"}", "one file"},
        {"{\"type\": \"infinitebench\", \"path\": \"" FIX "\"}", "directory"},
        {"{\"type\": \"infinitebench\", \"path\": \"" FIX "\", \"tasks\": [\"code_run\"]}", "no loader for task code_run"},
        {"{\"type\": \"infinitebench\", \"path\": \"" FIX "\", \"tasks\": \"passkey\"}", "array"},
        {"{\"type\": \"infinitebench\", \"path\": \"" FIX "\", \"data_dir\": \"" FIX "\", \"tasks\": [\"passkey\"]}", "not both"},
        {"{\"type\": \"infinitebench\", \"path\": \"" FIX "\", \"tasks\": [\"passkey\"], \"lengths\": [4096]}", "lengths"},
        {"{\"type\": \"infinitebench\", \"path\": \"/nonexistent/passkey.jsonl\"}", "/nonexistent/passkey.jsonl not found"},
        {"{\"type\": \"infinitebench\", \"path\": \"/nonexistent\", \"tasks\": [\"kv_retrieval\"]}", "/nonexistent/kv_retrieval.jsonl not found"},
        {"{\"type\": \"infinitebench\", \"tasks\": [\"passkey\"]}", "\"path\""},
    };
    for (size_t i = 0; i < sizeof BAD / sizeof *BAD; i++) {
        int rc = load_entry(BAD[i].entry, &t);
        CU_ASSERT(rc == -1 && strstr(err, BAD[i].says) && !strchr(err, '\n'));
        if (rc != -1 || !strstr(err, BAD[i].says)) fprintf(stderr, "\n  %s: %s\n", BAD[i].entry, err);
        free_tasks(&t);
    }
    /* optional: an absent file is skipped */
    CU_ASSERT(load_entry("{\"type\": \"infinitebench\", \"path\": \"/nonexistent\", \"optional\": true, \"tasks\": [\"passkey\"]}", &t) == 0 && t.n == 0);
}

/* `kvbench run` of a suite naming the fixtures' directory: every record of passkey and kv_retrieval runs on the
 * default model under each method and is scored by InfiniteBench's rule for its task. */
static void test_a_suite_with_path_runs_passkey_and_kv_retrieval_on_the_default_model(void) {
    const char *bin = getenv("KVB_BIN");
    CU_ASSERT_FATAL(bin != NULL && model != NULL);
    char suite[128], results[128], cmd[1024];
    snprintf(suite, sizeof suite, "%s/suite.json", dir);
    snprintf(results, sizeof results, "%s/out/results.jsonl", dir);
    FILE *f = fopen(suite, "w");
    CU_ASSERT_FATAL(f != NULL);
    fprintf(f, "{\"name\": \"ib-path\", \"model\": \"default\", \"seed\": 1,\n"
               " \"methods\": [{\"name\": \"full\"}, {\"name\": \"snapkv\", \"opts\": {\"window\": 8}}], \"budgets\": [\"50%%\"],\n"
               " \"benchmarks\": [{\"type\": \"infinitebench\", \"path\": \"%s/" FIX "\", \"tasks\": [\"passkey\", \"kv_retrieval\"]}]}\n",
            getenv("KVB_SOURCE_DIR") ? getenv("KVB_SOURCE_DIR") : ".");
    fclose(f);
    snprintf(cmd, sizeof cmd, "'%s' run %s --out %s/out --quiet --threads 2 > /dev/null 2>%s/err.txt", bin, suite, dir, dir);
    int st = system(cmd);
    CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    char *text = util_read_file(results, NULL);
    CU_ASSERT_FATAL(text != NULL);
    int n = 0, by_task[2] = {0, 0}, right = 0;
    for (char *save, *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        cJSON *r = cJSON_Parse(line);
        CU_ASSERT_FATAL(r != NULL);
        const char *task = cJSON_GetObjectItem(r, "task")->valuestring, *metric = cJSON_GetObjectItem(r, "metric")->valuestring;
        double score = cJSON_GetObjectItem(r, "score")->valuedouble;
        int k = !strcmp(task, "passkey") ? 0 : !strcmp(task, "kv_retrieval") ? 1 : -1;
        CU_ASSERT_FATAL(k >= 0);
        by_task[k]++;
        char want[64];
        snprintf(want, sizeof want, "infinitebench_%s", task);
        CU_ASSERT(!strcmp(metric, want) && (score == 0 || score == 1) && cJSON_IsNull(cJSON_GetObjectItem(r, "error")));
        CU_ASSERT(!strcmp(cJSON_GetObjectItem(r, "benchmark")->valuestring, "infinitebench"));
        right += score == 1;
        n++;
        cJSON_Delete(r);
    }
    free(text);
    CU_ASSERT(n == 12 && by_task[0] == 6 && by_task[1] == 6); /* 3 records x 2 methods each */
    fprintf(stderr, "\n  %d of %d records right on the default model\n", right, n);
}

int main(void) {
    char path[1024];
    if (util_default_model(path, sizeof path)) model = kvb_model_load(path, err, sizeof err);
    if (!mkdtemp(dir)) return 1;
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("infbench_official", NULL, NULL);
    CU_add_test(s, "official records load and score as the official python", test_official_records_load_and_score_as_the_official_python);
    CU_add_test(s, "a suite's path names one file or the directory of the files", test_a_suite_path_names_one_file_or_the_directory_of_the_files);
    /* the model's tests need the default model, which CI always has (scripts/fetch-model.sh) */
    CU_add_test(s, "over-long prompts keep their first and last halves in the model's tokens", test_over_long_prompts_keep_their_first_and_last_halves_in_the_models_tokens);
    CU_add_test(s, "a suite with path runs passkey and kv_retrieval on the default model", test_a_suite_with_path_runs_passkey_and_kv_retrieval_on_the_default_model);
    int rc = util_run_suites();
    kvb_model_free(model);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) rc = 1;
    return rc;
}
