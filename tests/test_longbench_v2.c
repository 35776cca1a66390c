/* test_longbench_v2.c — LongBench v2 (benchmarks/longbench_v2.h) against its official code's values on records in
 * its format (tests/fixtures/longbench_v2/, made by scripts/lbv2_fixtures.py from THUDM/LongBench's pred.py,
 * prompts/ and result.py): the records load to get_pred's prompts (zero-shot and CoT), its max_new_tokens and the
 * answer letter; replies are scored as extract_answer and judge score them; the report's LongBench v2 table gives
 * result.py's Overall / Easy / Hard / Short / Medium / Long for those judgements, and accuracy by domain; a suite
 * entry's filters, JSONL, malformed records and the middle cut in the model's tokens. With CoT (cot_data.json and
 * cot_expected.json, made by scripts/longbench_v2_fixtures.py running pred.py's get_pred with --cot on played-back
 * outputs): the second question (0shot_cot_ans.txt) as get_pred builds it from the first output, its middle cut,
 * the answer taken from the second output, and a run through the runner whose records hold both replies. */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util_common.h"
#include "benchmarks/longbench_v2.h"
#include "benchmarks/prompt.h"
#include "benchmarks/registry.h"
#include "benchmarks/runner.h"
#include "benchmarks/score.h"
#include "engine/model.h"
#include "reports/record.h"
#include "reports/report.h"

#define FIX "tests/fixtures/longbench_v2"

static kvb_model *model;
static char err[512], dir[64] = "/tmp/kvb_lbv2_XXXXXX";

static cJSON *expected(void) {
    char *text = util_read_file(FIX "/expected.json", NULL);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    return j;
}

static const char *jstr(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k)->valuestring; }

static void test_official_records_load_to_get_preds_prompts(void) {
    cJSON *e = expected(), *r;
    CU_ASSERT_FATAL(e != NULL);
    char *text = util_read_file(FIX "/data.json", NULL);
    cJSON *data = text ? cJSON_Parse(text) : NULL;
    free(text);
    CU_ASSERT_FATAL(data != NULL);
    for (int cot = 0; cot < 2; cot++) {
        lbv2_opts o = {.cot = cot};
        kvb_samples v = {0};
        CU_ASSERT_FATAL(lbv2_load(FIX "/data.json", &o, &v, err, sizeof err) == 0);
        CU_ASSERT_FATAL(v.n == cJSON_GetArraySize(cJSON_GetObjectItem(e, "records")));
        int i = 0;
        cJSON_ArrayForEach(r, cJSON_GetObjectItem(e, "records")) {
            const kvb_sample *s = &v.v[i];
            const cJSON *d = cJSON_GetArrayItem(data, i++);
            CU_ASSERT_STRING_EQUAL(s->id, jstr(r, "_id"));
            CU_ASSERT_STRING_EQUAL(s->prompt, jstr(r, cot ? "prompt_cot" : "prompt"));
            if (strcmp(s->prompt, jstr(r, cot ? "prompt_cot" : "prompt"))) fprintf(stderr, "\n  got: %s\n", s->prompt);
            CU_ASSERT_STRING_EQUAL(s->task, cot ? "longbench_v2_cot" : "longbench_v2");
            CU_ASSERT(s->max_new_tokens == (cot ? 1024 : 128) && s->use_chat == 1);
            CU_ASSERT(s->n_answers == 1 && !strcmp(s->answers[0], jstr(d, "answer")));
            CU_ASSERT_STRING_EQUAL(s->domain, jstr(d, "domain"));
            CU_ASSERT_STRING_EQUAL(s->qtype, jstr(d, "sub_domain"));
            CU_ASSERT_STRING_EQUAL(s->difficulty, jstr(d, "difficulty"));
            CU_ASSERT_STRING_EQUAL(lbv2_length_bin(s->length), jstr(d, "length"));
            CU_ASSERT_STRING_EQUAL(kvb_benchmark_find("longbench_v2")->length_bin(s), jstr(d, "length"));
            /* the prompt is the template's head, the context, then the question part (hidden questions split there) */
            size_t lc = strlen(s->context), lq = strlen(s->question), lp = strlen(s->prompt);
            CU_ASSERT(lp > lc + lq && !strcmp(s->prompt + lp - lq, s->question) && !strncmp(s->prompt + lp - lq - lc, s->context, lc));
        }
        kvb_samples_free(&v);
    }
    cJSON_Delete(data);
    cJSON_Delete(e);
}

static void test_replies_score_as_extract_answer_and_judge(void) {
    cJSON *e = expected(), *r, *x;
    CU_ASSERT_FATAL(e != NULL);
    lbv2_opts o = {0};
    kvb_samples v = {0};
    CU_ASSERT_FATAL(lbv2_load(FIX "/data.json", &o, &v, err, sizeof err) == 0);
    int i = 0, n = 0;
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(e, "records")) {
        const kvb_sample *s = &v.v[i++];
        cJSON_ArrayForEach(x, cJSON_GetObjectItem(r, "responses")) {
            const char *resp = jstr(x, "response");
            const cJSON *pred = cJSON_GetObjectItem(x, "pred");
            char want = cJSON_IsString(pred) ? pred->valuestring[0] : 0, got = lbv2_extract_answer(resp);
            CU_ASSERT(got == want);
            if (got != want) fprintf(stderr, "\n  %s: %c, official %c\n", resp, got ? got : '-', want ? want : '-');
            double score = -1;
            char metric[48];
            CU_ASSERT(kvb_score_sample("longbench_v2", s, resp, &score, metric, sizeof metric) == 0);
            CU_ASSERT(score == (cJSON_IsTrue(cJSON_GetObjectItem(x, "judge")) ? 1.0 : 0.0) && !strcmp(metric, "longbench_v2_acc"));
            n++;
        }
    }
    CU_ASSERT(n == 32);
    kvb_samples_free(&v);
    cJSON_Delete(e);
}

/* The records a run would write for each sample's first reply, then the report's LongBench v2 table. */
static void test_report_gives_result_pys_table_and_accuracy_by_domain(void) {
    cJSON *e = expected(), *r;
    CU_ASSERT_FATAL(e != NULL);
    lbv2_opts o = {0};
    kvb_samples v = {0};
    CU_ASSERT_FATAL(lbv2_load(FIX "/data.json", &o, &v, err, sizeof err) == 0);
    char run[128], p[192];
    snprintf(run, sizeof run, "%s/run", dir);
    CU_ASSERT_FATAL(mkdir(run, 0755) == 0);
    snprintf(p, sizeof p, "%s/run.json", run);
    FILE *f = fopen(p, "w");
    CU_ASSERT_FATAL(f != NULL);
    fputs("{\"suite\":\"lbv2\",\"model\":\"m.gguf\",\"model_sha256\":\"s\",\"git_commit\":\"c\",\"host\":\"h\",\"backend\":\"cpu\","
          "\"flags\":\"\",\"created\":\"2026-01-01T00:00:00Z\"}\n", f);
    fclose(f);
    snprintf(p, sizeof p, "%s/results.jsonl", run);
    CU_ASSERT_FATAL((f = fopen(p, "w")) != NULL);
    int i = 0;
    double by_domain_correct = 0;
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(e, "records")) {
        const kvb_sample *s = &v.v[i++];
        double score = -1;
        char metric[48];
        CU_ASSERT(kvb_score_sample("longbench_v2", s, jstr(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "responses"), 0), "response"),
                                   &score, metric, sizeof metric) == 0);
        if (!strcmp(s->domain, "Multi-Document QA")) by_domain_correct += score;
        fprintf(f, "{\"method\":\"full\",\"budget\":\"full\",\"benchmark\":\"longbench_v2\",\"task\":\"%s\",\"sample_id\":\"%s\","
                   "\"score\":%g,\"metric\":\"%s\",\"qtype\":\"%s\",\"length_bin\":\"%s\",\"difficulty\":\"%s\",\"domain\":\"%s\"}\n",
                s->task, s->id, score, metric, s->qtype, lbv2_length_bin(s->length), s->difficulty, s->domain);
    }
    fclose(f);
    CU_ASSERT_FATAL(kvb_report_write(run, err, sizeof err) == 0);
    snprintf(p, sizeof p, "%s/report.md", run);
    char *md = util_read_file(p, NULL);
    CU_ASSERT_FATAL(md != NULL);
    CU_ASSERT(strstr(md, "| task | method@budget | Overall | easy | hard | short | medium | long | Single-Document QA | "
                         "Multi-Document QA | Long In-context Learning | Long-dialogue History Understanding | "
                         "Code Repository Understanding | Long Structured Data Understanding |") != NULL);
    const char *row = strstr(md, "| longbench_v2 | full@full |");
    CU_ASSERT_FATAL(row != NULL);
    static const char *const COLS[] = {"Overall", "Easy", "Hard", "Short", "Medium", "Long"};
    const char *at = row + strlen("| longbench_v2 | full@full |");
    for (int k = 0; k < 6; k++) {
        double got;
        int used = 0;
        CU_ASSERT_FATAL(sscanf(at, " %lf (%*d) |%n", &got, &used) == 1 && used > 0);
        char a[16], b[16];
        snprintf(a, sizeof a, "%.1f", got);
        snprintf(b, sizeof b, "%.1f", cJSON_GetObjectItem(cJSON_GetObjectItem(e, "result"), COLS[k])->valuedouble);
        CU_ASSERT_STRING_EQUAL(a, b); /* result.py's round(100 * acc, 1) */
        at += used;
    }
    /* then the domains: Single-Document QA (2 records), Multi-Document QA (2) ... */
    double sd, mdq;
    CU_ASSERT(sscanf(at, " %lf (2) | %lf (2) |", &sd, &mdq) == 2 && fabs(mdq - 50.0 * by_domain_correct) < 1e-9);
    free(md);
    kvb_samples_free(&v);
    cJSON_Delete(e);
}

static void write_file(const char *name, const char *text) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    CU_ASSERT_FATAL(f != NULL);
    fputs(text, f);
    fclose(f);
}

typedef struct { kvb_samples set; char name[64]; int n; } one_task;

static kvb_samples *add_task(void *ctx, const char *name, const char *benchmark, kvb_judge_kind judge, char *e, size_t el) {
    (void)benchmark, (void)judge, (void)e, (void)el;
    one_task *t = ctx;
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n++;
    return &t->set;
}

static int expand(const char *in, char *out, size_t cap) { return (size_t)snprintf(out, cap, "%s", in) >= cap ? -1 : 0; }

static int load_entry(const char *json, one_task *t, int limit) {
    memset(t, 0, sizeof *t);
    cJSON *b = cJSON_Parse(json);
    CU_ASSERT_FATAL(b != NULL);
    kvb_bench_env env = {.suite_path = "s.json", .n_ctx_train = 8192, .limit = limit, .expand_path = expand,
                         .add_task = add_task, .add_ctx = t, .optional = cJSON_IsTrue(cJSON_GetObjectItem(b, "optional"))};
    int rc = kvb_benchmark_find("longbench_v2")->load(&env, b, err, sizeof err);
    cJSON_Delete(b);
    return rc;
}

static void test_suite_entries_filter_and_refuse_in_one_line(void) {
    one_task t;
    CU_ASSERT(load_entry("{\"type\": \"longbench_v2\", \"path\": \"" FIX "/data.json\"}", &t, 0) == 0);
    CU_ASSERT(t.n == 1 && !strcmp(t.name, "longbench_v2") && t.set.n == 8);
    kvb_samples_free(&t.set);
    CU_ASSERT(load_entry("{\"type\": \"longbench_v2\", \"path\": \"" FIX "/data.json\", \"cot\": true, \"length\": [\"short\", \"long\"], "
                         "\"difficulty\": [\"easy\"]}", &t, 0) == 0);
    CU_ASSERT(!strcmp(t.name, "longbench_v2_cot") && t.set.n == 3); /* easy and short or long: records 1, 6, 8 */
    for (int i = 0; i < t.set.n; i++) CU_ASSERT(!strcmp(t.set.v[i].difficulty, "easy") && t.set.v[i].length != 1 && t.set.v[i].max_new_tokens == 1024);
    kvb_samples_free(&t.set);
    CU_ASSERT(load_entry("{\"type\": \"longbench_v2\", \"path\": \"" FIX "/data.json\", \"domain\": [\"Multi-Document QA\"], \"samples\": 5}", &t, 1) == 0);
    CU_ASSERT(t.set.n == 1 && !strcmp(t.set.v[0].domain, "Multi-Document QA")); /* --limit 1 under samples 5 */
    kvb_samples_free(&t.set);
    CU_ASSERT(load_entry("{\"type\": \"longbench_v2\", \"path\": \"/nonexistent/data.json\", \"optional\": true}", &t, 0) == 0 && t.n == 0);
    static const struct { const char *entry, *says; } BAD[] = {
        {"{\"type\": \"longbench_v2\", \"path\": \"/nonexistent/data.json\"}", "/nonexistent/data.json not found"},
        {"{\"type\": \"longbench_v2\", \"path\": \"" FIX "/data.json\", \"length\": [\"tiny\"]}", "\"tiny\", not one of its values"},
        {"{\"type\": \"longbench_v2\", \"path\": \"" FIX "/data.json\", \"difficulty\": \"easy\"}", "non-empty array"},
        {"{\"type\": \"longbench_v2\", \"path\": \"" FIX "/data.json\", \"domain\": [3]}", "a non-string"},
    };
    for (size_t i = 0; i < sizeof BAD / sizeof *BAD; i++) {
        int rc = load_entry(BAD[i].entry, &t, 0);
        CU_ASSERT(rc == -1 && strstr(err, BAD[i].says) && !strchr(err, '\n'));
        if (rc != -1 || !strstr(err, BAD[i].says)) fprintf(stderr, "\n  %s: %s\n", BAD[i].entry, err);
        kvb_samples_free(&t.set);
    }
}

static void test_jsonl_and_malformed_records(void) {
    const char *ok = "{\"_id\": \"a\", \"domain\": \"D\", \"sub_domain\": \"S\", \"difficulty\": \"hard\", \"length\": \"long\", "
                     "\"question\": \"Q?\", \"choice_A\": \"1\", \"choice_B\": \"2\", \"choice_C\": \"3\", \"choice_D\": \"4\", "
                     "\"answer\": \"D\", \"context\": \" ctx \"}";
    char text[2048], path[128];
    snprintf(path, sizeof path, "%s/v2.jsonl", dir);
    snprintf(text, sizeof text, "%s\n\n%s\n", ok, ok);
    write_file("v2.jsonl", text);
    lbv2_opts o = {0};
    kvb_samples v = {0};
    CU_ASSERT(lbv2_load(path, &o, &v, err, sizeof err) == 0 && v.n == 2 && !strcmp(v.v[1].context, "ctx") && v.v[1].length == 2);
    kvb_samples_free(&v);
    static const struct { const char *from, *to, *says; } BAD[] = {
        {"\"answer\": \"D\"", "\"answer\": \"E\"", "'answer' is not a letter A-D"},
        {"\"length\": \"long\"", "\"length\": 3", "'length' is missing or not a string"},
        {"\"length\": \"long\"", "\"length\": \"huge\"", "'length' is not short"},
        {"\"difficulty\": \"hard\"", "\"difficulty\": \"medium\"", "'difficulty' is not easy or hard"},
        {"\"context\": \" ctx \"", "\"ctxt\": \"x\"", "'context' is missing"},
        {"\"_id\": \"a\"", "\"_id\": \"a\",,", "JSON"},
    };
    for (size_t i = 0; i < sizeof BAD / sizeof *BAD; i++) {
        char bad[1024];
        const char *at = strstr(ok, BAD[i].from);
        snprintf(bad, sizeof bad, "%.*s%s%s", (int)(at - ok), ok, BAD[i].to, at + strlen(BAD[i].from));
        snprintf(text, sizeof text, "%s\n%s\n", ok, bad);
        write_file("v2.jsonl", text);
        CU_ASSERT(lbv2_load(path, &o, &v, err, sizeof err) == -1 && v.n == 0);
        char want[160];
        snprintf(want, sizeof want, "%s:2: ", path);
        CU_ASSERT(!strncmp(err, want, strlen(want)) && strstr(err, BAD[i].says) && !strchr(err, '\n'));
        if (!strstr(err, BAD[i].says)) fprintf(stderr, "\n  got: %s\n", err);
    }
    /* one array, the line of the element named */
    snprintf(text, sizeof text, "[\n%s,\n{\"_id\": \"b\"}\n]\n", ok);
    write_file("v2.json", text);
    snprintf(path, sizeof path, "%s/v2.json", dir);
    CU_ASSERT(lbv2_load(path, &o, &v, err, sizeof err) == -1 && strstr(err, "v2.json:3: '") && v.n == 0);
}

/* query_llm: a prompt over max_len tokens keeps its first and last max_len//2 (kvbench's prompt builder). */
static void test_over_long_prompts_are_middle_cut_in_the_models_tokens(void) {
    CU_ASSERT_FATAL(model != NULL);
    lbv2_opts o = {0};
    kvb_samples v = {0};
    CU_ASSERT_FATAL(lbv2_load(FIX "/data.json", &o, &v, err, sizeof err) == 0);
    kvb_prompt p = {0};
    CU_ASSERT_FATAL(kvb_prompt_build(model, &v.v[0], 64 + 60, 0, &p, err, sizeof err) == 0);
    CU_ASSERT(p.truncated && p.n <= 64 + 60);
    char *dec = NULL;
    CU_ASSERT_FATAL(tok_decode(model->tok, p.ids, (int)p.n, &dec) == 0);
    CU_ASSERT(strstr(dec, "Please read the following text") && strstr(dec, "The correct answer is (insert answer here)"));
    CU_ASSERT(!strstr(dec, "1 Introduction")); /* the middle went */
    free(dec);
    kvb_prompt_free(&p);
    kvb_samples_free(&v);
}


static cJSON *read_json(const char *path) {
    char *text = util_read_file(path, NULL);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    return j;
}

/* get_pred --cot: the first prompt and 1024 tokens, then 0shot_cot_ans.txt with $COT$ <- the first output stripped,
 * 128 tokens, and extract_answer on the second output. */
static void test_cot_asks_pred_pys_second_question_and_scores_its_reply(void) {
    cJSON *e = read_json(FIX "/cot_expected.json"), *r;
    CU_ASSERT_FATAL(e != NULL);
    lbv2_opts o = {.cot = 1};
    kvb_samples v = {0};
    CU_ASSERT_FATAL(lbv2_load(FIX "/cot_data.json", &o, &v, err, sizeof err) == 0);
    CU_ASSERT_FATAL(v.n == cJSON_GetArraySize(cJSON_GetObjectItem(e, "records")) && v.n == 5);
    int i = 0, same = 0;
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(e, "records")) {
        const kvb_sample *s = &v.v[i++];
        CU_ASSERT_STRING_EQUAL(s->id, jstr(r, "_id"));
        CU_ASSERT_STRING_EQUAL(s->prompt, jstr(r, "prompt_cot"));
        CU_ASSERT(s->max_new_tokens == cJSON_GetObjectItem(r, "max_new_cot")->valueint);
        CU_ASSERT(s->followup_max_new == cJSON_GetObjectItem(r, "max_new_ans")->valueint);
        CU_ASSERT_STRING_EQUAL(s->followup_slot, "$COT$");
        char *second = kvb_sample_followup_prompt(s, jstr(r, "output_cot"));
        CU_ASSERT_FATAL(second != NULL);
        CU_ASSERT_STRING_EQUAL(second, jstr(r, "prompt_ans"));
        if (strcmp(second, jstr(r, "prompt_ans"))) fprintf(stderr, "\n  got: %s\n", second);
        same += !strcmp(second, jstr(r, "prompt_ans"));
        char *strip = kvb_py_strip(jstr(r, "output_cot")), *resp = kvb_py_strip(jstr(r, "output_ans"));
        CU_ASSERT(strip && !strcmp(strip, jstr(r, "response_cot")) && resp && !strcmp(resp, jstr(r, "response")));
        const cJSON *pred = cJSON_GetObjectItem(r, "pred");
        CU_ASSERT(lbv2_extract_answer(jstr(r, "output_ans")) == (cJSON_IsString(pred) ? pred->valuestring[0] : 0));
        double score = -1;
        char metric[48];
        CU_ASSERT(kvb_score_sample("longbench_v2", s, jstr(r, "output_ans"), &score, metric, sizeof metric) == 0);
        CU_ASSERT(score == (cJSON_IsTrue(cJSON_GetObjectItem(r, "judge")) ? 1.0 : 0.0));
        free(second), free(strip), free(resp);
    }
    CU_ASSERT(same == 5);
    /* zero-shot records ask once */
    kvb_samples z = {0};
    lbv2_opts o0 = {0};
    CU_ASSERT(lbv2_load(FIX "/cot_data.json", &o0, &z, err, sizeof err) == 0 && z.n == 5 && !z.v[0].followup);
    kvb_samples_free(&z);
    kvb_samples_free(&v);
    cJSON_Delete(e);
}

/* query_llm cuts the second prompt as it cuts the first: its first and last max/2 tokens. */
static void test_an_over_long_second_question_is_middle_cut(void) {
    CU_ASSERT_FATAL(model != NULL);
    lbv2_opts o = {.cot = 1};
    kvb_samples v = {0};
    CU_ASSERT_FATAL(lbv2_load(FIX "/cot_data.json", &o, &v, err, sizeof err) == 0);
    kvb_sb b = {0};
    for (int i = 0; i < 200; i++) kvb_sb_addf(&b, "Step %d: the abstract is weighed again. ", i);
    char *cot = kvb_sb_take(&b);
    kvb_sample s2;
    kvb_sample_init(&s2);
    s2.prompt = kvb_sample_followup_prompt(&v.v[0], cot);
    s2.use_chat = 1;
    CU_ASSERT_FATAL(s2.prompt != NULL);
    kvb_prompt p = {0};
    CU_ASSERT_FATAL(kvb_prompt_build(model, &s2, 400, 0, &p, err, sizeof err) == 0);
    CU_ASSERT(p.truncated && p.n <= 400);
    char *dec = NULL;
    CU_ASSERT_FATAL(tok_decode(model->tok, p.ids, (int)p.n, &dec) == 0);
    CU_ASSERT(strstr(dec, "The text is too long and omitted here.") && strstr(dec, "Step 0:") &&
              strstr(dec, "Format your response as follows") && !strstr(dec, "Step 100:"));
    free(dec), free(cot);
    kvb_prompt_free(&p);
    kvb_sample_free(&s2);
    kvb_samples_free(&v);
}

/* The whole flow in the runner on the default model: each record keeps the reasoning (first_prediction) and the
 * answer (prediction, scored), and its prefill counts both prompts: the second built from the recorded reasoning. */
static void test_a_cot_run_records_both_replies_and_scores_the_second(void) {
    CU_ASSERT_FATAL(model != NULL);
    char suite[128], out[128], mpath[1024];
    CU_ASSERT_FATAL(util_default_model(mpath, sizeof mpath));
    snprintf(suite, sizeof suite, "%s/cot_suite.json", dir);
    snprintf(out, sizeof out, "%s/cot_run", dir);
    FILE *f = fopen(suite, "w");
    CU_ASSERT_FATAL(f != NULL);
    fprintf(f, "{\"name\": \"lbv2-cot\", \"model\": \"default\", \"seed\": 1, \"methods\": [{\"name\": \"full\"}, "
               "{\"name\": \"streamingllm\"}], \"budgets\": [\"50%%\"], \"benchmarks\": [{\"type\": \"longbench_v2\", "
               "\"path\": \"%s/cot_data.json\", \"cot\": true, \"samples\": 2, \"max_new_tokens\": 48}]}\n", FIX);
    fclose(f);
    kvb_run_opts ro = {.suite_path = suite, .out_dir = out, .quiet = 1}; /* the default threads (KVB_THREADS) */
    FILE *devnull = fopen("/dev/null", "w");
    int rc = kvb_run_suite(&ro, devnull, err, sizeof err);
    fclose(devnull);
    CU_ASSERT_FATAL(rc == 0);
    if (rc) fprintf(stderr, "\n  %s\n", err);
    char res[192];
    snprintf(res, sizeof res, "%s/results.jsonl", out);
    char *text = util_read_file(res, NULL);
    CU_ASSERT_FATAL(text != NULL);
    lbv2_opts o = {.cot = 1};
    kvb_samples v = {0};
    CU_ASSERT_FATAL(lbv2_load(FIX "/cot_data.json", &o, &v, err, sizeof err) == 0);
    int n = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        kvb_record r;
        char why[256];
        CU_ASSERT_FATAL(j && kvb_record_from_json(j, &r, 0, why, sizeof why) == 0);
        const kvb_sample *s = !strcmp(r.sample_id, v.v[0].id) ? &v.v[0] : &v.v[1];
        CU_ASSERT(!r.error && !strcmp(r.task, "longbench_v2_cot"));
        CU_ASSERT_FATAL(r.first_prediction != NULL && r.prediction != NULL);
        CU_ASSERT(r.score == lbv2_judge(r.prediction, s->answers[0]));
        /* the second prompt, made from the recorded first reply, is the rest of the prefill */
        kvb_sample s2;
        kvb_sample_init(&s2);
        s2.prompt = kvb_sample_followup_prompt(s, r.first_prediction);
        s2.use_chat = 1;
        kvb_prompt p1 = {0}, p2 = {0};
        CU_ASSERT_FATAL(kvb_prompt_build(model, s, model->cfg.n_ctx_train, 0, &p1, err, sizeof err) == 0);
        CU_ASSERT_FATAL(kvb_prompt_build(model, &s2, model->cfg.n_ctx_train, 0, &p2, err, sizeof err) == 0);
        CU_ASSERT(r.prompt_tokens == (double)p1.n && r.prefill_tokens == (double)(p1.n + p2.n));
        if (r.prefill_tokens != (double)(p1.n + p2.n))
            fprintf(stderr, "\n  prefill %g, prompts %lld + %lld\n", r.prefill_tokens, (long long)p1.n, (long long)p2.n);
        CU_ASSERT(r.generated_tokens > 0 && r.generated_tokens <= 48 + 48);
        kvb_prompt_free(&p1), kvb_prompt_free(&p2);
        kvb_sample_free(&s2);
        kvb_record_free(&r);
        cJSON_Delete(j);
        n++;
    }
    CU_ASSERT(n == 4); /* 2 records x (full, streamingllm@50%) */
    free(text);
    kvb_samples_free(&v);
}

int main(void) {
    char path[1024];
    if (util_default_model(path, sizeof path)) model = kvb_model_load(path, err, sizeof err);
    if (!mkdtemp(dir)) return 1;
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("longbench_v2", NULL, NULL);
    CU_add_test(s, "official records load to get_pred's prompts", test_official_records_load_to_get_preds_prompts);
    CU_add_test(s, "replies score as extract_answer and judge", test_replies_score_as_extract_answer_and_judge);
    CU_add_test(s, "the report gives result.py's table and accuracy by domain", test_report_gives_result_pys_table_and_accuracy_by_domain);
    CU_add_test(s, "suite entries filter, and refuse in one line", test_suite_entries_filter_and_refuse_in_one_line);
    CU_add_test(s, "JSONL and malformed records", test_jsonl_and_malformed_records);
    CU_add_test(s, "over-long prompts are middle-cut in the model's tokens", test_over_long_prompts_are_middle_cut_in_the_models_tokens);
    CU_add_test(s, "CoT asks pred.py's second question and scores its reply", test_cot_asks_pred_pys_second_question_and_scores_its_reply);
    CU_add_test(s, "an over-long second question is middle-cut", test_an_over_long_second_question_is_middle_cut);
    CU_add_test(s, "a CoT run records both replies and scores the second", test_a_cot_run_records_both_replies_and_scores_the_second);
    int rc = util_run_suites();
    kvb_model_free(model);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) rc = 1;
    return rc;
}
