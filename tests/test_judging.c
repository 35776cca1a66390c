/* test_judging.c — the runner's judge (benchmarks/judging.h) against a judge server started here that answers by
 * recipe and keeps every request: the configuration and its precedence (flags, KVB_JUDGE_URL, the suite), the
 * LongMemEval prompt chosen per question type with the abstention prompt for _abs ids and filled with (question,
 * answer, response) as evaluate_qa.py does, its request (temperature 0, max_tokens 10, n 1) and label ('yes' in
 * the lowercased reply), Round Attention's quality score (the overall score averaged over n replies, / 10) with
 * the conversation's tail, the rubric judge, and judge failures that leave the score null (BENCHMARKS.md 2, 7);
 * a judge echoing the key in JSON escapes leaves it in no record, and a file:// judge URL reads no file. */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <ctype.h>
#include <curl/curl.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util_common.h"
#include "benchmarks/judging.h"

static char dir[64] = "/tmp/kvb_judging_XXXXXX";
static char url[128], templates[128], cache[128];
static char err[512];

/* ---- the judge server: replies by the "#reply=<recipe>" found in the prompt ---- */

static struct MHD_Daemon *judge;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static cJSON *requests; /* every request body received, in order */


static const struct { const char *name; const char *replies[2]; } RECIPES[] = {
    {"yes", {"Yes."}},
    {"no", {"No, it is not."}},
    {"eyes", {"Nope. Use your eyes."}},  /* evaluate_qa.py: 'yes' in response.lower() -> correct */
    {"q78", {"{'factual accuracy': 9, 'overall score': 7}", "{'overall score': 8}}"}},
    {"q7none", {"{'overall score': 7}", "I cannot grade this."}},
    {"noscore", {"I cannot grade this."}},
    {"s8", {"Score: 8"}},
};

static enum MHD_Result respond(struct MHD_Connection *c, unsigned status, cJSON *j) {
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", "application/json");
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *u, const char *method,
                                  const char *version, const char *data, size_t *size, void **con) {
    (void)cls, (void)u, (void)method, (void)version;
    const char *body = NULL;
    if (util_http_body(con, data, size, &body)) return MHD_YES;
    cJSON *req = body ? cJSON_Parse(body) : NULL;
    const char *prompt = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(req, "messages"), 0), "content"));
    int n = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(req, "n"));
    pthread_mutex_lock(&mu);
    cJSON_AddItemToArray(requests, cJSON_Duplicate(req, 1));
    pthread_mutex_unlock(&mu);
    const char *tag = prompt ? strstr(prompt, "#reply=") : NULL;
    int k = -1;
    for (size_t i = 0; tag && k < 0 && i < sizeof RECIPES / sizeof *RECIPES; i++) {
        size_t l = strlen(RECIPES[i].name);
        if (!strncmp(tag + 7, RECIPES[i].name, l) && !isalnum((unsigned char)tag[7 + l])) k = (int)i;
    }
    int echo_key = tag && !strncmp(tag + 7, "echokey", 7);
    cJSON_Delete(req); /* (tag pointed into it) */
    if (echo_key) { /* "Score: 8" and the Authorization header, every character \u-escaped */
        const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
        char esc[512] = "", text[1024];
        for (size_t i = 0, o = 0; auth && auth[i] && o + 7 < sizeof esc; i++) o += (size_t)snprintf(esc + o, sizeof esc - o, "\\u%04x", (unsigned char)auth[i]);
        snprintf(text, sizeof text, "{\"choices\":[{\"message\":{\"role\":\"assistant\",\"content\":\"Score: 8 (you sent %s)\"}}]}", esc);
        struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_COPY);
        enum MHD_Result rc = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        return rc;
    }
    if (k < 0) return respond(c, 500, cJSON_Parse("{\"error\": {\"message\": \"judge down\"}}"));
    cJSON *j = cJSON_CreateObject(), *choices = cJSON_AddArrayToObject(j, "choices");
    for (int i = 0; i < (n > 0 ? n : 1); i++) {
        const char *text = RECIPES[k].replies[RECIPES[k].replies[i % 2] ? i % 2 : 0];
        cJSON *ch = cJSON_CreateObject(), *m = cJSON_AddObjectToObject(ch, "message");
        cJSON_AddNumberToObject(ch, "index", i);
        cJSON_AddStringToObject(m, "role", "assistant");
        cJSON_AddStringToObject(m, "content", text);
        cJSON_AddItemToArray(choices, ch);
    }
    return respond(c, 200, j);
}

static void on_done(void *cls, struct MHD_Connection *c, void **con, enum MHD_RequestTerminationCode t) {
    (void)cls, (void)c, (void)t;
    util_http_body_free(con);
}

/* The last request the judge received (a copy), or NULL. */
static cJSON *last_request(void) {
    pthread_mutex_lock(&mu);
    int n = cJSON_GetArraySize(requests);
    cJSON *r = n ? cJSON_Duplicate(cJSON_GetArrayItem(requests, n - 1), 1) : NULL;
    pthread_mutex_unlock(&mu);
    return r;
}

static int n_requests(void) {
    pthread_mutex_lock(&mu);
    int n = cJSON_GetArraySize(requests);
    pthread_mutex_unlock(&mu);
    return n;
}

static const char *prompt_of(const cJSON *req) {
    return cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(req, "messages"), 0), "content"));
}

static double num(const cJSON *o, const char *k) { return cJSON_GetNumberValue(cJSON_GetObjectItem(o, k)); }

/* ---- the judge under test ---- */

static void same_path(const char *in, char *out, size_t cap) { snprintf(out, cap, "%s", in); }

/* A judge on the server above (two replies per request where the kind allows). */
static kvb_runner_judge *make_judge(void) {
    char text[1024];
    snprintf(text, sizeof text, "{\"base_url\": \"%s\", \"model\": \"judge-m\", \"cache_dir\": \"%s\", \"templates\": \"%s\","
             " \"max_retries\": 0, \"timeout_s\": 10, \"n\": 2}", url, cache, templates);
    cJSON *sj = cJSON_Parse(text);
    CU_ASSERT_FATAL(sj != NULL);
    kvb_runner_judge *j = kvb_runner_judge_create(sj, NULL, same_path, err, sizeof err);
    cJSON_Delete(sj);
    if (!j) fprintf(stderr, "\n  judge: %s\n", err);
    CU_ASSERT_FATAL(j != NULL);
    return j;
}

static cJSON *record(const char *prediction) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "prediction", prediction);
    return r;
}

static const char *judge_str(const cJSON *rec, const char *k) {
    return cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(rec, "judge"), k));
}

/* Without a URL anywhere there is no judge and no error; its records then say so and keep a null score, and a
 * record that failed before judging is left alone. */
static void test_no_judge_configured(void) {
    unsetenv("KVB_JUDGE_URL");
    err[0] = 'x';
    cJSON *sj = cJSON_Parse("{\"model\": \"m\"}");
    CU_ASSERT(kvb_runner_judge_create(sj, NULL, same_path, err, sizeof err) == NULL && err[0] == 0);
    CU_ASSERT(kvb_runner_judge_create(NULL, NULL, same_path, err, sizeof err) == NULL && err[0] == 0);
    /* a judge flag with no judge anywhere is refused by name (it was dropped without a word) */
    kvb_judge_flags fl = {NULL, "m2", NULL, 0};
    CU_ASSERT(kvb_runner_judge_create(sj, &fl, same_path, err, sizeof err) == NULL && strstr(err, "--judge-model needs a judge"));
    kvb_judge_flags fr = {NULL, NULL, NULL, 1};
    CU_ASSERT(kvb_runner_judge_create(NULL, &fr, same_path, err, sizeof err) == NULL && strstr(err, "--judge-refresh needs a judge"));
    cJSON_Delete(sj);
    CU_ASSERT(kvb_runner_judge_describe(NULL) == NULL);
    kvb_sample s;
    kvb_sample_init(&s);
    cJSON *recs[2] = {record("an answer"), cJSON_Parse("{\"error\": \"prefill failed\"}")};
    int before = n_requests();
    CU_ASSERT(kvb_runner_judge_records(NULL, KVB_JK_RUBRIC, &s, recs, 2, err, sizeof err) == 0);
    CU_ASSERT(judge_str(recs[0], "error") && strstr(judge_str(recs[0], "error"), "no judge configured"));
    CU_ASSERT(cJSON_IsNull(cJSON_GetObjectItem(recs[0], "score")));
    CU_ASSERT(cJSON_GetObjectItem(recs[1], "judge") == NULL && cJSON_GetObjectItem(recs[1], "score") == NULL);
    CU_ASSERT(n_requests() == before);
    cJSON_Delete(recs[0]), cJSON_Delete(recs[1]);
}

/* Bad settings are one-line errors naming the setting; the URL comes from the flag, else KVB_JUDGE_URL, else
 * the suite; what is described for run.json has no userinfo. */
static void test_configuration_errors_and_precedence(void) {
    static const struct { const char *json, *what; } bad[] = {
        {"\"judge here\"", "\"judge\" must be an object"},
        {"{\"base_url\": \"http://h/v1\", \"concurrency\": 0}", "\"concurrency\""},
        {"{\"base_url\": \"http://h/v1\", \"n\": 17}", "\"n\""},
        {"{\"base_url\": \"http://h/v1\", \"timeout_s\": \"5\"}", "\"timeout_s\""},
        {"{\"base_url\": \"http://h/v1\", \"timeout\": 5}", "unknown key \"timeout\""}, /* its default would stay */
    };
    unsetenv("KVB_JUDGE_URL");
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cJSON *sj = cJSON_Parse(bad[i].json);
        err[0] = 0;
        CU_ASSERT(kvb_runner_judge_create(sj, NULL, same_path, err, sizeof err) == NULL);
        CU_ASSERT(strstr(err, bad[i].what) && !strchr(err, '\n'));
        cJSON_Delete(sj);
    }
    cJSON *sj = cJSON_Parse("{\"base_url\": \"http://suite.example/v1\", \"model\": \"suite-m\"}");
    const char *which[3];
    kvb_judge_flags fl = {"http://kvbuser:s3cret@flag.example/v1", "flag-m", NULL, 0};
    setenv("KVB_JUDGE_URL", "http://env.example/v1", 1);
    for (int k = 0; k < 3; k++) {
        if (k == 1) fl.url = NULL, fl.model = NULL;
        if (k == 2) unsetenv("KVB_JUDGE_URL");
        kvb_runner_judge *j = kvb_runner_judge_create(sj, &fl, same_path, err, sizeof err);
        CU_ASSERT_FATAL(j != NULL);
        cJSON *d = kvb_runner_judge_describe(j);
        static char got[3][128];
        snprintf(got[k], sizeof got[k], "%s %s", cJSON_GetStringValue(cJSON_GetObjectItem(d, "base_url")),
                 cJSON_GetStringValue(cJSON_GetObjectItem(d, "model")));
        which[k] = got[k];
        cJSON_Delete(d);
        kvb_runner_judge_free(j);
    }
    CU_ASSERT_STRING_EQUAL(which[0], "http://flag.example/v1 flag-m");
    CU_ASSERT_STRING_EQUAL(which[1], "http://env.example/v1 suite-m");
    CU_ASSERT_STRING_EQUAL(which[2], "http://suite.example/v1 suite-m");
    cJSON_Delete(sj);
}

static void lme_sample(kvb_sample *s, const char *qtype, int abstention, const char *question_tail) {
    kvb_sample_init(s);
    s->id = strdup(abstention ? "q1_abs" : "q1");
    s->qtype = strdup(qtype);
    s->abstention = abstention;
    char q[256];
    snprintf(q, sizeof q, "Current Date: 2023/05/30 (Tue) 10:00\nQuestion: How many days ago did I buy the car?\n%s", question_tail);
    s->question = strdup(q);
    kvb_sample_add_answer(s, "18 days");
}

/* One prompt per question type (single-session-user/assistant and multi-session share the default one) and the
 * abstention prompt for any _abs question; filled positionally with the raw question (the reader's "Current
 * Date" and "Answer:" lines removed, the CoT tail too), the answer and the response. One request each:
 * temperature 0, max_tokens 10, n 1 even when the suite asks for more, the judge's model. */
static void test_longmemeval_prompt_per_question_type(void) {
    static const struct { const char *qtype; int abs; const char *tmpl; } cases[] = {
        {"single-session-user", 0, "DEFAULT"}, {"single-session-assistant", 0, "DEFAULT"}, {"multi-session", 0, "DEFAULT"},
        {"temporal-reasoning", 0, "TEMPORAL"}, {"knowledge-update", 0, "UPDATE"},
        {"single-session-preference", 0, "PREFERENCE"}, {"temporal-reasoning", 1, "ABSTENTION"},
    };
    kvb_runner_judge *j = make_judge();
    CU_ASSERT_FATAL(kvb_runner_judge_need_lme(j, err, sizeof err) == 0);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        kvb_sample s;
        lme_sample(&s, cases[i].qtype, cases[i].abs, i % 2 ? "Answer:" : "Answer (step by step):");
        char pred[64];
        snprintf(pred, sizeof pred, "It was 19 days ago (case %zu). #reply=yes", i);
        cJSON *rec = record(pred);
        int before = n_requests();
        CU_ASSERT_FATAL(kvb_runner_judge_records(j, KVB_JK_LONGMEMEVAL, &s, &rec, 1, err, sizeof err) == 0);
        CU_ASSERT(n_requests() == before + 1);
        cJSON *req = last_request();
        char want[256];
        snprintf(want, sizeof want, "%s|How many days ago did I buy the car?|18 days|%s|", cases[i].tmpl, pred);
        CU_ASSERT_STRING_EQUAL(prompt_of(req), want);
        CU_ASSERT(num(req, "temperature") == 0 && num(req, "max_tokens") == 10 && num(req, "n") == 1);
        CU_ASSERT_STRING_EQUAL(cJSON_GetStringValue(cJSON_GetObjectItem(req, "model")), "judge-m");
        CU_ASSERT(num(rec, "score") == 1 && !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(rec, "metric")), "judge_yes"));
        CU_ASSERT(judge_str(rec, "kind") && !strcmp(judge_str(rec, "kind"), "longmemeval"));
        cJSON_Delete(req);
        cJSON_Delete(rec);
        kvb_sample_free(&s);
    }
    kvb_runner_judge_free(j);
}

/* The label is evaluate_qa.py's: 'yes' anywhere in the lowercased reply, so "Nope. Use your eyes." counts as
 * correct; "No" is 0. The reply is kept with the parsed value; an unknown question type is a judge error. */
static void test_longmemeval_label_is_yes_in_the_lowercased_reply(void) {
    kvb_runner_judge *j = make_judge();
    CU_ASSERT_FATAL(kvb_runner_judge_need_lme(j, err, sizeof err) == 0);
    kvb_sample s;
    lme_sample(&s, "multi-session", 0, "Answer:");
    cJSON *recs[3] = {record("a #reply=no"), record("b #reply=eyes"), record("c #reply=yes")};
    CU_ASSERT_FATAL(kvb_runner_judge_records(j, KVB_JK_LONGMEMEVAL, &s, recs, 3, err, sizeof err) == 0);
    CU_ASSERT(num(recs[0], "score") == 0 && num(recs[1], "score") == 1 && num(recs[2], "score") == 1);
    const cJSON *v = cJSON_GetObjectItem(recs[1], "judge");
    CU_ASSERT(num(v, "parsed") == 1 && cJSON_IsNull(cJSON_GetObjectItem(v, "error")));
    CU_ASSERT_STRING_EQUAL(cJSON_GetStringValue(cJSON_GetArrayItem(cJSON_GetObjectItem(v, "replies"), 0)), "Nope. Use your eyes.");
    for (int i = 0; i < 3; i++) cJSON_Delete(recs[i]);
    free(s.qtype);
    s.qtype = strdup("daily-chitchat");
    cJSON *rec = record("d #reply=yes");
    CU_ASSERT(kvb_runner_judge_records(j, KVB_JK_LONGMEMEVAL, &s, &rec, 1, err, sizeof err) == 0);
    CU_ASSERT(judge_str(rec, "error") && strstr(judge_str(rec, "error"), "daily-chitchat"));
    CU_ASSERT(cJSON_IsNull(cJSON_GetObjectItem(rec, "score")));
    cJSON_Delete(rec);
    kvb_sample_free(&s);
    kvb_runner_judge_free(j);
}

static void dialogue(kvb_sample *s, int n_rounds, size_t turn_len) {
    kvb_sample_init(s);
    s->id = strdup("d1");
    char *text = malloc(turn_len + 32);
    for (int r = 0; r < n_rounds; r++) {
        snprintf(text, turn_len + 32, "user says %d ", r);
        memset(text + strlen(text), 'u', turn_len), text[turn_len] = 0;
        kvb_sample_add_message(s, "user", text, NULL);
        snprintf(text, turn_len + 32, "assistant says %d ", r);
        memset(text + strlen(text), 'a', turn_len), text[turn_len] = 0;
        kvb_sample_add_message(s, "assistant", text, NULL);
    }
    free(text);
    s->question = strdup("And what should I see in Rome?");
}

/* Round Attention's judge: the overall score of each of the n replies (the paper's dict-like text, stray brace
 * and all), averaged, / 10; a reply without one is left out, none at all is a judge error. The prompt holds the
 * conversation as "User:" / "Assistant:" lines, the last question and the answer; 128 tokens, n from the suite. */
static void test_quality_score_is_the_mean_overall_score_over_n_replies(void) {
    kvb_runner_judge *j = make_judge();
    kvb_sample s;
    dialogue(&s, 2, 20);
    cJSON *recs[3] = {record("The Colosseum. #reply=q78"), record("The Forum. #reply=q7none"), record("Rome. #reply=noscore")};
    CU_ASSERT_FATAL(kvb_runner_judge_records(j, KVB_JK_QUALITY, &s, recs, 3, err, sizeof err) == 0);
    CU_ASSERT_DOUBLE_EQUAL(num(recs[0], "score"), 0.75, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(num(cJSON_GetObjectItem(recs[0], "judge"), "parsed"), 7.5, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(num(recs[1], "score"), 0.7, 1e-12);
    CU_ASSERT(cJSON_IsNull(cJSON_GetObjectItem(recs[2], "score")) && judge_str(recs[2], "error"));
    CU_ASSERT_STRING_EQUAL(cJSON_GetStringValue(cJSON_GetObjectItem(recs[0], "metric")), "judge_quality");
    cJSON *req = last_request();
    const char *p = prompt_of(req);
    CU_ASSERT_FATAL(p != NULL);
    CU_ASSERT(strstr(p, "\nUser: user says 0 uuuuuu") && strstr(p, "\nAssistant: assistant says 1 aaa"));
    CU_ASSERT(strstr(p, "And what should I see in Rome?") && strstr(p, "#reply="));
    CU_ASSERT(strstr(p, "overall score") != NULL);
    CU_ASSERT(num(req, "max_tokens") == 128 && num(req, "n") == 2);
    cJSON_Delete(req);
    for (int i = 0; i < 3; i++) cJSON_Delete(recs[i]);
    kvb_sample_free(&s);
    kvb_runner_judge_free(j);
}

/* A conversation longer than the judge can read is cut to its last 12000 bytes, at a line start. */
static void test_quality_prompt_keeps_the_conversations_tail(void) {
    kvb_runner_judge *j = make_judge();
    kvb_sample s;
    dialogue(&s, 40, 500); /* 80 lines of ~520 bytes: ~41 KB */
    cJSON *rec = record("#reply=q78");
    CU_ASSERT_FATAL(kvb_runner_judge_records(j, KVB_JK_QUALITY, &s, &rec, 1, err, sizeof err) == 0);
    cJSON *req = last_request();
    const char *p = prompt_of(req), *h = p ? strstr(p, "[Conversation so far]\n") : NULL;
    CU_ASSERT_FATAL(h != NULL);
    h += strlen("[Conversation so far]\n");
    const char *end = strstr(h, "\n\n[Last question]");
    CU_ASSERT_FATAL(end != NULL);
    CU_ASSERT(end - h <= 12000 && end - h > 11000);
    CU_ASSERT(!strncmp(h, "User: ", 6) || !strncmp(h, "Assistant: ", 11));
    CU_ASSERT(strstr(h, "assistant says 39 ") != NULL && strstr(p, "user says 0 ") == NULL);
    cJSON_Delete(req);
    cJSON_Delete(rec);
    kvb_sample_free(&s);
    kvb_runner_judge_free(j);
}

/* The rubric judge (NIAH): "Score: N" of 10, with the question and the reference answer in the prompt. */
static void test_rubric_score_is_n_of_10(void) {
    kvb_runner_judge *j = make_judge();
    kvb_sample s;
    kvb_sample_init(&s);
    s.question = strdup("What is the best thing to do in San Francisco?");
    kvb_sample_add_answer(&s, "eat a sandwich and sit in Dolores Park on a sunny day");
    cJSON *rec = record("Eat a sandwich. #reply=s8");
    CU_ASSERT_FATAL(kvb_runner_judge_records(j, KVB_JK_RUBRIC, &s, &rec, 1, err, sizeof err) == 0);
    CU_ASSERT_DOUBLE_EQUAL(num(rec, "score"), 0.8, 1e-12);
    CU_ASSERT_STRING_EQUAL(cJSON_GetStringValue(cJSON_GetObjectItem(rec, "metric")), "judge_rubric");
    cJSON *req = last_request();
    CU_ASSERT(strstr(prompt_of(req), "best thing to do in San Francisco") && strstr(prompt_of(req), "Dolores Park"));
    CU_ASSERT(num(req, "max_tokens") == 16);
    cJSON_Delete(req);
    cJSON_Delete(rec);
    kvb_sample_free(&s);
    kvb_runner_judge_free(j);
}

/* A judge that fails is a judge error on the record (status in it), the score null, not a zero; the batch
 * itself succeeds. */
static void test_failing_judge_leaves_the_score_null(void) {
    kvb_runner_judge *j = make_judge();
    kvb_sample s;
    kvb_sample_init(&s);
    s.question = strdup("q");
    kvb_sample_add_answer(&s, "a");
    cJSON *rec = record("#reply=none-of-them");
    CU_ASSERT(kvb_runner_judge_records(j, KVB_JK_RUBRIC, &s, &rec, 1, err, sizeof err) == 0);
    CU_ASSERT(cJSON_IsNull(cJSON_GetObjectItem(rec, "score")));
    CU_ASSERT(judge_str(rec, "error") && strstr(judge_str(rec, "error"), "500"));
    cJSON_Delete(rec);
    kvb_sample_free(&s);
    kvb_runner_judge_free(j);
}

/* A judge that echoes the API key with every character \u-escaped: the record (a line of results.jsonl) holds
 * the verdict and "[REDACTED]", and no spelling of the key once read as JSON. */
static void test_escaped_key_echo_reaches_no_record(void) {
    setenv("KVB_TEST_JUDGING_KEY", "sk-judging-SECRET-99", 1);
    char text[1024];
    snprintf(text, sizeof text, "{\"base_url\": \"%s\", \"api_key_env\": \"KVB_TEST_JUDGING_KEY\", \"cache_dir\": \"%s/echo\","
             " \"max_retries\": 0, \"timeout_s\": 10}", url, dir);
    cJSON *sj = cJSON_Parse(text);
    kvb_runner_judge *j = kvb_runner_judge_create(sj, NULL, same_path, err, sizeof err);
    cJSON_Delete(sj);
    CU_ASSERT_FATAL(j != NULL);
    kvb_sample s;
    kvb_sample_init(&s);
    s.question = strdup("q");
    kvb_sample_add_answer(&s, "a");
    cJSON *rec = record("#reply=echokey");
    CU_ASSERT(kvb_runner_judge_records(j, KVB_JK_RUBRIC, &s, &rec, 1, err, sizeof err) == 0);
    CU_ASSERT(num(rec, "score") == 0.8);
    char *line = cJSON_PrintUnformatted(rec); /* as written to results.jsonl; cJSON reads escapes back as characters */
    CU_ASSERT(line && !strstr(line, "SECRET") && strstr(line, "[REDACTED]"));
    if (line && strstr(line, "SECRET")) fprintf(stderr, "\n  record: %.300s\n", line);
    free(line);
    cJSON_Delete(rec);
    kvb_sample_free(&s);
    kvb_runner_judge_free(j);
}

/* A judge base URL of file:// (libcurl would read the local file) is refused with an error naming the scheme;
 * the file's text reaches no record. */
static void test_file_url_judge_reads_no_file(void) {
    char path[160], text[512];
    snprintf(path, sizeof path, "%s/local.json", dir);
    FILE *f = fopen(path, "w");
    CU_ASSERT_FATAL(f != NULL);
    fputs("{\"choices\":[{\"message\":{\"content\":\"Score: 9 LOCAL-FILE-TEXT\"}}]}", f);
    fclose(f);
    snprintf(text, sizeof text, "{\"base_url\": \"file://%s?\", \"max_retries\": 0}", path);
    cJSON *sj = cJSON_Parse(text);
    err[0] = 0;
    kvb_runner_judge *j = kvb_runner_judge_create(sj, NULL, same_path, err, sizeof err);
    cJSON_Delete(sj);
    if (!j) { /* refused when configured: as good */
        CU_ASSERT(strstr(err, "file") != NULL);
        return;
    }
    kvb_sample s;
    kvb_sample_init(&s);
    s.question = strdup("q");
    kvb_sample_add_answer(&s, "a");
    cJSON *rec = record("an answer");
    err[0] = 0;
    CU_ASSERT(kvb_runner_judge_records(j, KVB_JK_RUBRIC, &s, &rec, 1, err, sizeof err) == -1);
    CU_ASSERT(strstr(err, "'file'") && !strchr(err, '\n'));
    char *line = cJSON_PrintUnformatted(rec);
    CU_ASSERT(line && !strstr(line, "LOCAL-FILE-TEXT"));
    free(line);
    cJSON_Delete(rec);
    kvb_sample_free(&s);
    kvb_runner_judge_free(j);
}

/* Missing LongMemEval prompts: an error naming the file and how to get it. */
static void test_missing_judge_prompts_name_the_file(void) {
    char text[512];
    snprintf(text, sizeof text, "{\"base_url\": \"%s\", \"templates\": \"%s/nowhere.json\"}", url, dir);
    cJSON *sj = cJSON_Parse(text);
    kvb_runner_judge *j = kvb_runner_judge_create(sj, NULL, same_path, err, sizeof err);
    cJSON_Delete(sj);
    CU_ASSERT_FATAL(j != NULL);
    CU_ASSERT(kvb_runner_judge_need_lme(j, err, sizeof err) == -1);
    CU_ASSERT(strstr(err, "nowhere.json") && strstr(err, "scripts/fetch-datasets.sh longmemeval") && !strchr(err, '\n'));
    kvb_runner_judge_free(j);
}

int main(void) {
    if (!mkdtemp(dir)) return 1;
    snprintf(templates, sizeof templates, "%s/judge_templates.json", dir);
    snprintf(cache, sizeof cache, "%s/cache", dir);
    FILE *f = fopen(templates, "w");
    if (!f) return 1;
    /* stand-ins for the official texts (the project fetches those): each names its kind, slots in order */
    fputs("{\"default\": \"DEFAULT|{}|{}|{}|\", \"temporal-reasoning\": \"TEMPORAL|{}|{}|{}|\", \"knowledge-update\": "
          "\"UPDATE|{}|{}|{}|\", \"single-session-preference\": \"PREFERENCE|{}|{}|{}|\", \"abstention\": \"ABSTENTION|{}|{}|{}|\"}",
          f);
    fclose(f);
    requests = cJSON_CreateArray();
    curl_global_init(CURL_GLOBAL_DEFAULT);
    judge = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL, on_request, NULL,
                             MHD_OPTION_NOTIFY_COMPLETED, on_done, NULL, MHD_OPTION_END);
    if (!judge) return 1;
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1", MHD_get_daemon_info(judge, MHD_DAEMON_INFO_BIND_PORT)->port);
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("judging", NULL, NULL);
    CU_add_test(s, "no judge configured", test_no_judge_configured);
    CU_add_test(s, "configuration errors and precedence", test_configuration_errors_and_precedence);
    CU_add_test(s, "LongMemEval prompt per question type", test_longmemeval_prompt_per_question_type);
    CU_add_test(s, "LongMemEval label is 'yes' in the lowercased reply", test_longmemeval_label_is_yes_in_the_lowercased_reply);
    CU_add_test(s, "quality score is the mean overall score over n replies", test_quality_score_is_the_mean_overall_score_over_n_replies);
    CU_add_test(s, "quality prompt keeps the conversation's tail", test_quality_prompt_keeps_the_conversations_tail);
    CU_add_test(s, "rubric score is N of 10", test_rubric_score_is_n_of_10);
    CU_add_test(s, "a failing judge leaves the score null", test_failing_judge_leaves_the_score_null);
    CU_add_test(s, "missing judge prompts name the file", test_missing_judge_prompts_name_the_file);
    CU_add_test(s, "an escaped echo of the key reaches no record", test_escaped_key_echo_reaches_no_record);
    CU_add_test(s, "a file:// judge URL reads no file", test_file_url_judge_reads_no_file);
    int rc = util_run_suites();
    MHD_stop_daemon(judge);
    cJSON_Delete(requests);
    curl_global_cleanup();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) rc = 1;
    return rc;
}
