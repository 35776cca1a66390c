/* test_loaders.c — dataset loaders and generators (benchmarks/loaders.h) on the real sample files in
 * ../shared/data (skipped with one line when a fresh clone has nothing beside it, a failure in CI) and on records,
 * configs and malformed files written to /tmp. Golden FNV-1a hashes of prompts were computed
 * with Python from the official code paths: LongBench dataset2prompt[task].format(**record), and
 * LongMemEval's prepare_prompt (sessions sorted by date, has_answer dropped, json.dumps / "nl"). */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util_common.h"
#include "benchmarks/loaders.h"

#define DATA "../shared/data"
#define LB_CONFIG DATA "/longbench/config"
#define LB_REC DATA "/longbench/reconstructed_from_minilongbench"
#define LB_OFF DATA "/longbench/official_jsonl"
#define LME_ORACLE DATA "/longmemeval/longmemeval_oracle.sample.json"
#define LME_S DATA "/longmemeval/longmemeval_s_cleaned.sample8.json"
#define SHAREGPT DATA "/sharegpt/sharegpt_v3_cleaned_split.top50_by_turns.json"
#define ESSAYS DATA "/niah/PaulGrahamEssays"

static char err[1024];
static char tmpdir[256];
static char own_config[300]; /* <tmpdir>/lb_config: two tasks of the official config, for records written here */

/* LongBench's dataset2prompt.json / dataset2maxlen.json entries of hotpotqa and multifieldqa_en (THUDM/LongBench
 * LongBench/config), spelled out: the tests of records written here need no ../shared. */
static int write_own_config(void) {
    static const struct { const char *task, *tmpl; int max_new; } tasks[] = {
        {"hotpotqa", "Answer the question based on the given passages. Only give me the answer and do not output any "
                     "other words.\n\nThe following are given passages.\n{context}\n\nAnswer the question based on the "
                     "given passages. Only give me the answer and do not output any other words.\n\nQuestion: {input}\n"
                     "Answer:", 32},
        {"multifieldqa_en", "Read the following text and answer briefly.\n\n{context}\n\nNow, answer the following "
                            "question based on the above text, only give me the answer and do not output any other "
                            "words.\n\nQuestion: {input}\nAnswer:", 64}};
    snprintf(own_config, sizeof own_config, "%s/lb_config", tmpdir);
    if (mkdir(own_config, 0700)) return -1;
    cJSON *prompts = cJSON_CreateObject(), *maxlen = cJSON_CreateObject();
    for (size_t i = 0; i < sizeof tasks / sizeof *tasks; i++) {
        cJSON_AddStringToObject(prompts, tasks[i].task, tasks[i].tmpl);
        cJSON_AddNumberToObject(maxlen, tasks[i].task, tasks[i].max_new);
    }
    int rc = 0;
    cJSON *const docs[2] = {prompts, maxlen};
    const char *const names[2] = {"dataset2prompt.json", "dataset2maxlen.json"};
    for (int k = 0; k < 2; k++) {
        char path[400], *js = cJSON_Print(docs[k]);
        snprintf(path, sizeof path, "%s/%s", own_config, names[k]);
        FILE *f = js ? fopen(path, "wb") : NULL;
        if (!f || fputs(js, f) < 0) rc = -1;
        if (f && fclose(f)) rc = -1;
        free(js);
    }
    cJSON_Delete(prompts), cJSON_Delete(maxlen);
    return rc;
}

/* The sample records a test reads: 0 (the test returns) when one of them is missing, see UTIL_SHARED_DATA. */
#define NEEDS(rel) UTIL_SHARED_DATA((rel), NULL, 0)
#define NEEDS_LB(sub) (NEEDS("longbench/config") && NEEDS("longbench/" sub))

static uint64_t fnv1a(const char *s) {
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

/* Writes text to <tmpdir>/<name> and returns the path (static buffer per call site is not needed:
 * callers copy it). */
static const char *write_tmp(const char *name, const char *text) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return NULL;
    fputs(text, f);
    fclose(f);
    return path;
}

static int count_occurrences(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

/* ---------------------------------------------------------------- LongBench */

static void test_longbench_prompts_equal_python_format_of_the_official_template(void) {
    if (!NEEDS_LB("reconstructed_from_minilongbench") || !NEEDS("longbench/official_jsonl")) return;
    static const struct {
        const char *task, *path;
        int line;
        uint64_t hash;
        size_t bytes;
    } cases[] = {
        {"hotpotqa", LB_REC "/hotpotqa.jsonl", 1, 0xedf9395d254585cfULL, 68109},
        {"trec", LB_REC "/trec.jsonl", 2, 0xc8a66758f78e4f4fULL, 15230},
        {"lcc", LB_REC "/lcc.jsonl", 1, 0xfdf14eff37eed584ULL, 6911},
        {"samsum", LB_REC "/samsum.jsonl", 1, 0x4d36eb89f809bfb6ULL, 35587},
        {"narrativeqa", LB_REC "/narrativeqa.jsonl", 1, 0xa9330ace9d0a1e43ULL, 130742},
        {"qasper", LB_REC "/qasper.jsonl", 1, 0xc2f5327e87724a82ULL, 21679},
        {"multi_news", LB_OFF "/multi_news.first20.jsonl", 1, 0xa0ff7963125788e4ULL, 12631},
        {"passage_retrieval_zh", LB_OFF "/passage_retrieval_zh.first20.jsonl", 20, 0xe4c2142fc0f0d75eULL, 16455},
        {"multifieldqa_zh", LB_OFF "/multifieldqa_zh.first20.jsonl", 3, 0x0acb369121d358d1ULL, 8597},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        kvb_samples v = {0};
        CU_ASSERT_FATAL(lb_load(cases[i].path, cases[i].task, LB_CONFIG, cases[i].line, &v, err, sizeof err) == 0);
        CU_ASSERT_FATAL(v.n == cases[i].line);
        const char *p = v.v[cases[i].line - 1].prompt;
        CU_ASSERT_EQUAL(strlen(p), cases[i].bytes);
        CU_ASSERT(fnv1a(p) == cases[i].hash);
        if (fnv1a(p) != cases[i].hash) printf("\n  %s line %d: prompt differs from str.format", cases[i].task, cases[i].line);
        kvb_samples_free(&v);
    }
}

static void test_longbench_task_rules_follow_pred_and_eval(void) {
    if (!NEEDS_LB("reconstructed_from_minilongbench")) return;
    kvb_samples v = {0};
    CU_ASSERT_FATAL(lb_load(LB_REC "/trec.jsonl", "trec", LB_CONFIG, 0, &v, err, sizeof err) == 0);
    CU_ASSERT_EQUAL(v.n, 8);
    kvb_sample *s = &v.v[0];
    CU_ASSERT(!s->use_chat && s->first_line && !s->stop && s->max_new_tokens == 64);
    CU_ASSERT_EQUAL(s->n_classes, 50);
    int typo = 0;
    for (int i = 0; i < s->n_classes; i++) typo |= !strcmp(s->all_classes[i], "Lasting time of somethin");
    CU_ASSERT(typo);
    CU_ASSERT_STRING_EQUAL(s->task, "trec");
    CU_ASSERT_STRING_EQUAL(s->id, "1"); /* _id is null in the reconstructions: the line number */
    CU_ASSERT_EQUAL(s->length, -1);
    kvb_samples_free(&v);

    CU_ASSERT_FATAL(lb_load(LB_REC "/samsum.jsonl", "samsum", LB_CONFIG, 2, &v, err, sizeof err) == 0);
    CU_ASSERT_EQUAL(v.n, 2);
    CU_ASSERT(v.v[1].stop && !strcmp(v.v[1].stop, "\n") && v.v[1].first_line && !v.v[1].use_chat);
    CU_ASSERT_EQUAL(v.v[1].max_new_tokens, 128);
    kvb_samples_free(&v);

    CU_ASSERT_FATAL(lb_load(LB_REC "/lcc.jsonl", "lcc", LB_CONFIG, 0, &v, err, sizeof err) == 0);
    CU_ASSERT_EQUAL(v.n, 26);
    CU_ASSERT(!v.v[0].use_chat && !v.v[0].first_line && !v.v[0].stop && v.v[0].max_new_tokens == 64);
    CU_ASSERT_STRING_EQUAL(v.v[0].answers[0], "            if e.text == language:");
    CU_ASSERT(strncmp(v.v[0].prompt, "Please complete the code given below. \n", 39) == 0);
    kvb_samples_free(&v);

    CU_ASSERT_FATAL(lb_load(LB_REC "/hotpotqa.jsonl", "hotpotqa", LB_CONFIG, 0, &v, err, sizeof err) == 0);
    CU_ASSERT(v.v[0].use_chat && !v.v[0].first_line && v.v[0].max_new_tokens == 32 && v.v[0].n_classes == 0);
    CU_ASSERT_STRING_EQUAL(v.v[0].answers[0], "Bob Dylan");
    kvb_samples_free(&v);

    CU_ASSERT_FATAL(lb_load(LB_REC "/narrativeqa.jsonl", "narrativeqa", LB_CONFIG, 1, &v, err, sizeof err) == 0);
    CU_ASSERT(strstr(v.v[0].prompt, "asconcisely") != NULL); /* the official template's typo is kept */
    kvb_samples_free(&v);
}

/* LB_HIDDEN: every task's prompt is its context then its question (the template split after {context}, the
 * field text unchanged); records with one context form a group, moved next to its first member. LB_SPREAD:
 * the limit's records at i*total/n of the file. */
static void test_longbench_hidden_splits_at_context_groups_equal_contexts_and_spreads(void) {
    char path[512];
    kvb_samples v = {0};
    /* three questions over two documents: a(1) b(2) a(3) c(4) a(5) */
    kvb_sb f = {0};
    const char *ctx[] = {"Doc A text.", "Doc B text.", "Doc A text.", "Doc C text.", "Doc A text."};
    for (int i = 0; i < 5; i++)
        kvb_sb_addf(&f, "{\"input\": \"q%d?\", \"context\": \"%s\", \"answers\": [\"x\"], \"_id\": \"r%d\"}\n", i + 1, ctx[i], i + 1);
    char *text = kvb_sb_take(&f);
    snprintf(path, sizeof path, "%s", write_tmp("groups.jsonl", text));
    free(text);
    CU_ASSERT_FATAL(lb_load_ex(path, "multifieldqa_en", own_config, 0, LB_HIDDEN, &v, err, sizeof err) == 0);
    static const char *const order[] = {"r1", "r3", "r5", "r2", "r4"};
    CU_ASSERT_EQUAL_FATAL(v.n, 5);
    for (int k = 0; k < 5; k++) {
        CU_ASSERT_STRING_EQUAL(v.v[k].id, order[k]);
        CU_ASSERT(k < 3 ? v.v[k].group && !strcmp(v.v[k].group, "ctx-r1") : !v.v[k].group);
        CU_ASSERT(strstr(v.v[k].question, k < 3 ? (const char *[]){"q1?", "q3?", "q5?"}[k] : "q") != NULL);
    }
    kvb_samples_free(&v);
    /* spread: 2 of 5 are records 0 and 2 (5*0/2, 5*1/2); 5 of 5 are all; the first 2 without it */
    CU_ASSERT_FATAL(lb_load_ex(path, "multifieldqa_en", own_config, 2, LB_SPREAD, &v, err, sizeof err) == 0);
    CU_ASSERT(v.n == 2 && !strcmp(v.v[0].id, "r1") && !strcmp(v.v[1].id, "r3") && !v.v[0].context);
    kvb_samples_free(&v);
    CU_ASSERT_FATAL(lb_load_ex(path, "multifieldqa_en", own_config, 9, LB_SPREAD, &v, err, sizeof err) == 0);
    CU_ASSERT_EQUAL(v.n, 5);
    kvb_samples_free(&v);
    /* the real records with the official templates */
    if (!NEEDS_LB("reconstructed_from_minilongbench")) return;
    static const char *const tasks[] = {"2wikimqa", "gov_report", "lcc", "multifieldqa_zh", "passage_retrieval_en",
                                        "qasper", "samsum", "trec"};
    for (size_t i = 0; i < sizeof tasks / sizeof *tasks; i++) {
        snprintf(path, sizeof path, LB_REC "/%s.jsonl", tasks[i]);
        CU_ASSERT_FATAL(lb_load_ex(path, tasks[i], LB_CONFIG, 3, LB_HIDDEN, &v, err, sizeof err) == 0);
        CU_ASSERT_EQUAL(v.n, 3);
        for (int k = 0; k < v.n; k++) {
            const kvb_sample *x = &v.v[k];
            size_t lc = strlen(x->context);
            CU_ASSERT(x->question && x->question[0] && !x->group);
            CU_ASSERT(!strncmp(x->prompt, x->context, lc) && !strcmp(x->prompt + lc, x->question));
        }
        kvb_samples_free(&v);
    }
    CU_ASSERT_FATAL(lb_load_ex(LB_REC "/lcc.jsonl", "lcc", LB_CONFIG, 4, LB_SPREAD, &v, err, sizeof err) == 0);
    static const char *const lcc[] = {"1", "7", "14", "20"}; /* 26 records: 0, 6.5, 13, 19.5 -> lines 1 7 14 20 */
    CU_ASSERT_EQUAL_FATAL(v.n, 4);
    for (int k = 0; k < 4; k++) CU_ASSERT_STRING_EQUAL(v.v[k].id, lcc[k]);
    kvb_samples_free(&v);
}

static void test_every_reconstructed_task_loads_every_record(void) {
    if (!NEEDS_LB("reconstructed_from_minilongbench")) return;
    static const struct { const char *task; int n; } tasks[] = {
        {"2wikimqa", 13}, {"dureader", 6}, {"gov_report", 12}, {"hotpotqa", 13}, {"lcc", 26},
        {"multifieldqa_en", 7}, {"multifieldqa_zh", 15}, {"musique", 7}, {"narrativeqa", 6}, {"passage_count", 4},
        {"passage_retrieval_en", 15}, {"passage_retrieval_zh", 15}, {"qasper", 9}, {"qmsum", 6}, {"samsum", 15},
        {"trec", 8}, {"triviaqa", 12}, {"vcsum", 6}};
    for (size_t i = 0; i < sizeof tasks / sizeof *tasks; i++) {
        char path[256];
        CU_ASSERT_FATAL(lb_data_path(LB_REC, tasks[i].task, 0, path, sizeof path) == 0);
        kvb_samples v = {0};
        int rc = lb_load(path, tasks[i].task, LB_CONFIG, 0, &v, err, sizeof err);
        CU_ASSERT(rc == 0);
        if (rc) printf("\n  %s: %s", tasks[i].task, err);
        CU_ASSERT_EQUAL(v.n, tasks[i].n);
        for (int k = 0; k < v.n; k++) {
            CU_ASSERT(v.v[k].prompt && strlen(v.v[k].prompt) > 100 && v.v[k].n_answers >= 1);
            CU_ASSERT(!strstr(v.v[k].prompt, "{context}") && !strstr(v.v[k].prompt, "{input}"));
        }
        kvb_samples_free(&v);
    }
}

static void test_official_first20_lines_keep_id_and_length(void) {
    if (!NEEDS_LB("official_jsonl")) return;
    kvb_samples v = {0};
    CU_ASSERT_FATAL(lb_load(LB_OFF "/multi_news.first20.jsonl", "multi_news", LB_CONFIG, 0, &v, err, sizeof err) == 0);
    CU_ASSERT_EQUAL(v.n, 20);
    CU_ASSERT_STRING_EQUAL(v.v[0].id, "e45abfcb82a3c862c0f772e6f461866839955c11ea2f46a8");
    CU_ASSERT_EQUAL(v.v[0].length, 2099);
    CU_ASSERT_STRING_EQUAL(lb_e_bin(v.v[0].length), "0-4k");
    CU_ASSERT(v.v[0].n_classes == 0 && v.v[0].max_new_tokens == 512 && v.v[0].use_chat);
    for (int i = 0; i < v.n; i++) CU_ASSERT(strlen(v.v[i].id) == 48);
    kvb_samples_free(&v);
    CU_ASSERT_FATAL(lb_load(LB_OFF "/passage_retrieval_zh.first20.jsonl", "passage_retrieval_zh", LB_CONFIG, 0, &v,
                            err, sizeof err) == 0);
    CU_ASSERT_EQUAL(v.n, 20);
    CU_ASSERT_STRING_EQUAL(v.v[19].answers[0], "段落5");
    CU_ASSERT_EQUAL(v.v[19].length, 5778);
    CU_ASSERT_STRING_EQUAL(v.v[19].id, "2aa0b0dbbb443da3394cc23c31d623322726d33b233b3636");
    kvb_samples_free(&v);
    CU_ASSERT_FATAL(lb_load(LB_OFF "/multifieldqa_zh.first20.jsonl", "multifieldqa_zh", LB_CONFIG, 5, &v, err,
                            sizeof err) == 0);
    CU_ASSERT_EQUAL(v.n, 5); /* limit */
    CU_ASSERT_STRING_EQUAL(v.v[2].answers[0], "人民币57081.86元。");
    kvb_samples_free(&v);
}

/* Writes one {"context", "input", ...} record per (context, input) pair, JSON-escaped by cJSON. */
static const char *write_records(const char *name, const char *dataset, const char **ctx, const char **inp, int n,
                                 const cJSON *all_classes) {
    FILE *f;
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    if (!(f = fopen(path, "wb"))) return NULL;
    for (int i = 0; i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "input", inp[i]);
        cJSON_AddStringToObject(o, "context", ctx[i]);
        cJSON_AddItemToObject(o, "answers", cJSON_CreateStringArray((const char *[]){"x"}, 1));
        cJSON_AddNullToObject(o, "length");
        cJSON_AddStringToObject(o, "dataset", dataset);
        if (all_classes) cJSON_AddItemToObject(o, "all_classes", cJSON_Duplicate(all_classes, 1));
        char *line = cJSON_PrintUnformatted(o);
        fprintf(f, "%s\n", line);
        free(line);
        cJSON_Delete(o);
    }
    fclose(f);
    return path;
}

/* lsht and repobench-p: cut the MiniLongBench rendered prompt back into context/input, reload. */
static void check_rendered(const char *task, const char *prefix, const char *sep_before_input, size_t suffix_len) {
    char path[256];
    snprintf(path, sizeof path, DATA "/longbench/rendered_prompts_minilongbench/%s.jsonl", task);
    char *text = util_read_file(path, NULL);
    CU_ASSERT_FATAL(text != NULL);
    int checked = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *rec = cJSON_Parse(line), *gold = cJSON_GetObjectItem(rec, "gold");
        const char *p = cJSON_GetObjectItem(rec, "origin_prompt")->valuestring;
        size_t n = strlen(p), pre = strlen(prefix);
        CU_ASSERT_FATAL(n > pre + suffix_len && !strncmp(p, prefix, pre));
        char *body = strndup(p + pre, n - pre - suffix_len);
        char *cut = sep_before_input[0] ? strstr(body, sep_before_input) : strchr(body + strlen(body) / 2, '\n');
        for (char *q = cut; sep_before_input[0] && (q = strstr(q + 1, sep_before_input));) cut = q; /* the last one */
        CU_ASSERT_FATAL(cut != NULL);
        char *input = strdup(cut + (sep_before_input[0] ? 1 : 0)); /* the separator's "\n" is the template's */
        *cut = 0;
        const char *c1[] = {body}, *i1[] = {input};
        const char *rp = write_records("rendered.jsonl", task, c1, i1, 1, cJSON_GetObjectItem(gold, "all_classes"));
        kvb_samples v = {0};
        CU_ASSERT_FATAL(lb_load(rp, task, LB_CONFIG, 0, &v, err, sizeof err) == 0);
        CU_ASSERT_STRING_EQUAL(v.v[0].prompt, p);
        CU_ASSERT(!v.v[0].use_chat);
        if (!strcmp(task, "lsht")) CU_ASSERT(v.v[0].n_classes == 24 && v.v[0].first_line);
        kvb_samples_free(&v);
        free(body);
        free(input);
        cJSON_Delete(rec);
        checked++;
    }
    CU_ASSERT(checked >= 8);
    free(text);
}

static void test_refilled_template_reproduces_rendered_minilongbench_prompts(void) {
    if (!NEEDS_LB("rendered_prompts_minilongbench")) return;
    check_rendered("lsht", "请判断给定新闻的类别，下面是一些例子。\n\n", "\n新闻内容：", 0);
    check_rendered("repobench-p", "Please complete the code given below. \n", "", strlen("Next line of code:\n"));
}

static const char *make_config(const char *tmpl) {
    static char dir[300];
    snprintf(dir, sizeof dir, "%s/cfg", tmpdir);
    mkdir(dir, 0700);
    char path[400];
    snprintf(path, sizeof path, "%s/dataset2prompt.json", dir);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "toy", tmpl);
    char *js = cJSON_Print(o);
    FILE *f = fopen(path, "wb");
    fputs(js, f);
    fclose(f);
    free(js);
    cJSON_Delete(o);
    snprintf(path, sizeof path, "%s/dataset2maxlen.json", dir);
    f = fopen(path, "wb");
    fputs("{\"toy\": 7}", f);
    fclose(f);
    return dir;
}

static void test_substituted_braces_are_never_reparsed(void) {
    const char *cfg = make_config("A{{lit}}[{context}]|{input}}}");
    const char *ctx[] = {"def f(x): return {x: '{input}'}"}, *inp[] = {"{context} {{ }"};
    const char *p = write_records("braces.jsonl", "toy", ctx, inp, 1, NULL);
    kvb_samples v = {0};
    CU_ASSERT_FATAL(lb_load(p, "toy", cfg, 0, &v, err, sizeof err) == 0);
    CU_ASSERT_STRING_EQUAL(v.v[0].prompt, "A{lit}[def f(x): return {x: '{input}'}]|{context} {{ }}");
    CU_ASSERT_EQUAL(v.v[0].max_new_tokens, 7);
    kvb_samples_free(&v);
    cfg = make_config("Q: {question}");
    CU_ASSERT(lb_load(p, "toy", cfg, 0, &v, err, sizeof err) == -1);
    CU_ASSERT(strstr(err, "braces.jsonl:1") && strstr(err, "question"));
    cfg = make_config("broken {context");
    CU_ASSERT(lb_load(p, "toy", cfg, 0, &v, err, sizeof err) == -1 && v.n == 0);
}

static void check_lb_error(const char *content, const char *want_loc, const char *want_word) {
    const char *p = write_tmp("bad.jsonl", content);
    kvb_samples v = {0};
    int rc = lb_load(p, "hotpotqa", own_config, 0, &v, err, sizeof err);
    CU_ASSERT(rc == -1 && v.n == 0 && !strchr(err, '\n'));
    CU_ASSERT(strstr(err, p) != NULL);
    CU_ASSERT(strstr(err, want_loc) != NULL);
    if (want_word) CU_ASSERT(strstr(err, want_word) != NULL);
    if (!strstr(err, want_loc) || (want_word && !strstr(err, want_word))) printf("\n  unexpected error: %s", err);
    kvb_samples_free(&v);
}

#define GOOD "{\"input\": \"q\", \"context\": \"c\", \"answers\": [\"a\"], \"length\": 5, \"dataset\": \"hotpotqa\"}\n"

static void test_longbench_malformed_records_name_file_and_line(void) {
    check_lb_error(GOOD GOOD "{\"input\": \"q\", \"context\": \n", ".jsonl:3", "invalid JSON");
    check_lb_error(GOOD "\n" GOOD "[1, 2]\n", ".jsonl:4", "object");
    check_lb_error(GOOD "{\"input\": \"q\", \"context\": \"c\", \"answers\": \"a\"}\n", ".jsonl:2", "answers");
    check_lb_error("{\"input\": \"q\", \"context\": 3, \"answers\": [\"a\"]}\n", ".jsonl:1", "context");
    check_lb_error("{\"input\": \"q\", \"context\": \"c\", \"answers\": [\"a\"], \"_id\": 12}\n", ".jsonl:1", "_id");
    check_lb_error("{\"input\": \"q\", \"context\": \"c\", \"answers\": [\"a\"], \"length\": \"x\"}\n", ".jsonl:1", "length");
    check_lb_error("{\"context\": \"c\", \"answers\": [\"a\"]}\n", ".jsonl:1", "input");
    check_lb_error("{\"input\": \"q\", \"context\": \"c\", \"answers\": [\"a\"], \"dataset\": \"trec\"}\n", ".jsonl:1", "trec");
    check_lb_error(GOOD "{\"input\": \"q\"} trailing\n", ".jsonl:2", "invalid JSON");
    kvb_samples v = {0};
    CU_ASSERT(lb_load(DATA "/no/such.jsonl", "hotpotqa", own_config, 0, &v, err, sizeof err) == -1);
    CU_ASSERT(strstr(err, "no/such.jsonl") != NULL);
    const char *good = write_tmp("good.jsonl", GOOD);
    CU_ASSERT(lb_load(good, "hotpotqa_xx", own_config, 0, &v, err, sizeof err) == -1);
    CU_ASSERT(strstr(err, "hotpotqa_xx") && strstr(err, "dataset2prompt.json"));
    CU_ASSERT(lb_load(good, "hotpotqa", DATA "/nowhere", 0, &v, err, sizeof err) == -1);
    CU_ASSERT(strstr(err, "nowhere/dataset2prompt.json") != NULL);
    CU_ASSERT(v.n == 0 && v.v == NULL);
}

/* Two records with one _id would be one cell of every method (the runner keys a record by its id), the second's
 * result standing for both: refused with one line naming the id and both lines. A record without _id is known
 * by its line number, so an _id equal to another record's line number is the same clash. */
static void test_longbench_duplicate_ids_name_the_id_and_both_lines(void) {
    const char *rec_a = "{\"_id\": \"abc\", \"input\": \"q1\", \"context\": \"c\", \"answers\": [\"a\"]}\n",
               *rec_b = "{\"_id\": \"xyz\", \"input\": \"q2\", \"context\": \"c\", \"answers\": [\"a\"]}\n",
               *rec_a2 = "{\"_id\": \"abc\", \"input\": \"q3\", \"context\": \"d\", \"answers\": [\"b\"]}\n";
    char text[1024];
    snprintf(text, sizeof text, "%s%s\n%s", rec_a, rec_b, rec_a2);
    check_lb_error(text, ".jsonl:4: duplicate _id 'abc' (line 1 has it too)", "every sample needs its own id");
    snprintf(text, sizeof text, "%s%s{\"_id\": \"1\", \"input\": \"q\", \"context\": \"c\", \"answers\": [\"a\"]}\n", GOOD, rec_b);
    check_lb_error(text, ".jsonl:3: duplicate _id '1' (line 1 has it too)", "own id");
    kvb_samples v = {0};
    snprintf(text, sizeof text, "%s%s%s", rec_a, rec_b, rec_a2);
    CU_ASSERT(lb_load(write_tmp("dup_id.jsonl", text), "hotpotqa", own_config, 2, &v, err, sizeof err) == 0); /* the limit stops before */
    CU_ASSERT(v.n == 2);
    kvb_samples_free(&v);
    CU_ASSERT(lb_load_ex(write_tmp("dup_id.jsonl", text), "hotpotqa", own_config, 2, LB_SPREAD, &v, err, sizeof err) == -1);
    CU_ASSERT(v.n == 0 && strstr(err, "duplicate _id 'abc'")); /* spread reads every record */
}

static void test_longbench_e_names_bins_and_suffix(void) {
    CU_ASSERT_STRING_EQUAL(lb_e_bin(0), "0-4k");
    CU_ASSERT_STRING_EQUAL(lb_e_bin(3999), "0-4k");
    CU_ASSERT_STRING_EQUAL(lb_e_bin(4000), "4-8k");
    CU_ASSERT_STRING_EQUAL(lb_e_bin(7999), "4-8k");
    CU_ASSERT_STRING_EQUAL(lb_e_bin(8000), "8k+");
    CU_ASSERT(lb_e_bin(-1) == NULL);
    char buf[64];
    CU_ASSERT(lb_data_path("d", "qasper", 1, buf, sizeof buf) == 0 && !strcmp(buf, "d/qasper_e.jsonl"));
    CU_ASSERT(lb_data_path("d", "qasper", 0, buf, sizeof buf) == 0 && !strcmp(buf, "d/qasper.jsonl"));
    CU_ASSERT(lb_data_path("d", "qasper", 1, buf, 8) == -1);
    const char *ctx[] = {"c"}, *inp[] = {"q"};
    const char *p = write_records("hotpotqa_e.jsonl", "hotpotqa_e", ctx, inp, 1, NULL);
    kvb_samples v = {0};
    CU_ASSERT_FATAL(lb_load(p, "hotpotqa_e", own_config, 0, &v, err, sizeof err) == 0);
    CU_ASSERT_STRING_EQUAL(v.v[0].task, "hotpotqa");
    CU_ASSERT(v.v[0].max_new_tokens == 32 && strstr(v.v[0].prompt, "Question: q\nAnswer:"));
    kvb_samples_free(&v);
}

static void test_middle_truncation_keeps_int_half_at_each_end(void) {
    int32_t ids[10], out[10];
    for (int i = 0; i < 10; i++) ids[i] = i;
    CU_ASSERT_EQUAL(lb_truncate_middle(ids, 10, 4, out), 4);
    CU_ASSERT(out[0] == 0 && out[1] == 1 && out[2] == 8 && out[3] == 9);
    CU_ASSERT_EQUAL(lb_truncate_middle(ids, 10, 5, out), 4); /* odd: 2 * int(5/2) */
    CU_ASSERT(out[1] == 1 && out[2] == 8);
    CU_ASSERT_EQUAL(lb_truncate_middle(ids, 10, 10, out), 10);
    CU_ASSERT_EQUAL(out[9], 9);
    CU_ASSERT_EQUAL(lb_truncate_middle(ids, 10, 1, out), 10); /* ids[-0:] is everything in Python */
    CU_ASSERT_EQUAL(lb_truncate_middle(ids, 10, -1, out), -1);
    CU_ASSERT_EQUAL(lb_truncate_middle(ids, 10, 6, ids), 6); /* in place */
    CU_ASSERT(ids[0] == 0 && ids[2] == 2 && ids[3] == 7 && ids[5] == 9);
}

/* ---------------------------------------------------------------- LongMemEval */

static void test_longmemeval_prompts_equal_the_official_reader(void) {
    if (!NEEDS("longmemeval/longmemeval_oracle.sample.json") || !NEEDS("longmemeval/longmemeval_s_cleaned.sample8.json"))
        return;
    static const struct {
        const char *path, *format;
        int index, cot;
        uint64_t hash;
        size_t bytes;
    } cases[] = {
        {LME_ORACLE, "json", 0, 0, 0x2f142d869e56077eULL, 12038}, {LME_ORACLE, "nl", 0, 1, 0xb84b0d430c99260fULL, 11818},
        {LME_ORACLE, "json", 3, 0, 0xc2b4d47d2e26bd5aULL, 27576}, {LME_ORACLE, "nl", 3, 1, 0x992e03f9ace62122ULL, 26847},
        {LME_ORACLE, "json", 11, 0, 0x9e9cb67ad2364385ULL, 49814}, {LME_ORACLE, "nl", 11, 1, 0xbe3457c9a23880c6ULL, 48535},
        {LME_S, "json", 3, 0, 0xa95e94158dd9cd79ULL, 498948}, {LME_S, "nl", 3, 1, 0x966b843d5bbd8ef8ULL, 478569},
        {LME_S, "json", 7, 0, 0xce38a714f40c378fULL, 508915}, {LME_S, "nl", 7, 1, 0xb854689c374b696cULL, 486569},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        kvb_samples v = {0};
        CU_ASSERT_FATAL(lme_load(cases[i].path, cases[i].format, cases[i].cot, cases[i].index + 1, &v, err, sizeof err) == 0);
        const kvb_sample *s = &v.v[cases[i].index];
        CU_ASSERT_EQUAL(strlen(s->prompt), cases[i].bytes);
        CU_ASSERT(fnv1a(s->prompt) == cases[i].hash);
        if (fnv1a(s->prompt) != cases[i].hash) printf("\n  %s #%d %s: prompt differs", s->id, cases[i].index, cases[i].format);
        char *again = lme_render_prompt(cases[i].cot, s->context, s->date, strstr(s->question, "Question: ") + 10);
        /* the question field ends with the answer cue; re-rendering from context must reproduce prompt */
        char *cue = strrchr(again, '\n');
        CU_ASSERT(cue && !strncmp(s->prompt, again, (size_t)(cue - again)));
        free(again);
        kvb_samples_free(&v);
    }
}

static int turns_alternate(const kvb_sample *s) {
    for (int i = 0; i < s->n_turns; i++)
        if (strcmp(s->turns[i].role, i % 2 ? "assistant" : "user")) return 0;
    return s->n_turns % 2 == 0;
}

static void test_longmemeval_oracle_fields_rounds_and_abstention(void) {
    if (!NEEDS("longmemeval/longmemeval_oracle.sample.json")) return;
    kvb_samples v = {0};
    CU_ASSERT_FATAL(lme_load(LME_ORACLE, "json", 0, 0, &v, err, sizeof err) == 0);
    CU_ASSERT_EQUAL(v.n, 24);
    int n_abs = 0, int_answer = 0;
    for (int i = 0; i < v.n; i++) {
        const kvb_sample *s = &v.v[i];
        n_abs += s->abstention;
        CU_ASSERT_EQUAL(s->abstention, strstr(s->id, "_abs") != NULL);
        CU_ASSERT(turns_alternate(s) && s->n_answers == 1 && s->max_new_tokens == 500 && s->use_chat);
        CU_ASSERT_STRING_EQUAL(s->task, "longmemeval_oracle");
        if (!strcmp(s->id, "00ca467f")) {
            int_answer = 1;
            CU_ASSERT_STRING_EQUAL(s->answers[0], "2"); /* a JSON integer in the file */
            CU_ASSERT_STRING_EQUAL(s->qtype, "multi-session");
        }
    }
    CU_ASSERT(n_abs == 6 && int_answer);
    const kvb_sample *t = &v.v[3]; /* c8090214: its two sessions are stored in reverse date order */
    CU_ASSERT_STRING_EQUAL(t->id, "c8090214");
    CU_ASSERT_EQUAL(t->n_turns, 24);
    CU_ASSERT_STRING_EQUAL(t->turns[0].date, "2023/12/10 (Sun) 11:49");
    CU_ASSERT(t->turns[0].session == 0 && t->turns[23].session == 1);
    CU_ASSERT_STRING_EQUAL(t->turns[23].date, "2023/12/10 (Sun) 23:13");
    int evidence = 0;
    for (int i = 0; i < t->n_turns; i++) evidence += t->turns[i].has_answer;
    CU_ASSERT_EQUAL(evidence, 2);
    CU_ASSERT_STRING_EQUAL(t->question, "Current Date: 2023/12/10 (Sun) 19:41\nQuestion: How many days before I "
                                        "bought the iPhone 13 Pro did I attend the Holiday Market?\nAnswer:");
    CU_ASSERT(strstr(t->prompt, "### Session 1:\nSession Date: 2023/12/10 (Sun) 11:49\nSession Content:\n\n[{\"role\": \"user\", \"content\": ") != NULL);
    CU_ASSERT(!strstr(t->prompt, "has_answer"));
    CU_ASSERT(strstr(t->prompt, t->context) != NULL);
    kvb_samples_free(&v);
    CU_ASSERT_FATAL(lme_load(LME_ORACLE, "nl", 1, 2, &v, err, sizeof err) == 0);
    CU_ASSERT(v.n == 2 && v.v[1].max_new_tokens == 800);
    CU_ASSERT(strstr(v.v[1].question, "Answer (step by step):") && strstr(v.v[1].prompt, "\n\nuser: "));
    kvb_samples_free(&v);
}

static void test_longmemeval_s_sessions_become_padded_rounds(void) {
    if (!NEEDS("longmemeval/longmemeval_s_cleaned.sample8.json")) return;
    static const int want_turns[8] = {458, 548, 486, 462, 496, 494, 556, 614};
    kvb_samples v = {0};
    CU_ASSERT_FATAL(lme_load(LME_S, NULL, 0, 0, &v, err, sizeof err) == 0);
    CU_ASSERT_EQUAL(v.n, 8);
    for (int i = 0; i < v.n && i < 8; i++) {
        const kvb_sample *s = &v.v[i];
        CU_ASSERT_EQUAL(s->n_turns, want_turns[i]);
        CU_ASSERT(turns_alternate(s));
        for (int k = 1; k < s->n_turns; k++) CU_ASSERT(s->turns[k].session >= s->turns[k - 1].session);
    }
    CU_ASSERT_STRING_EQUAL(v.v[0].task, "longmemeval_s_cleaned");
    CU_ASSERT(v.v[6].abstention && v.v[7].abstention && !v.v[0].abstention);
    kvb_samples_free(&v);
}

static void test_longmemeval_truncation_helpers(void) {
    CU_ASSERT_EQUAL(lme_max_history_tokens(128000, 500), 126500);
    CU_ASSERT_EQUAL(lme_max_history_tokens(32000, 800), 30200);
    CU_ASSERT_EQUAL(lme_truncate_head(200000, 126500), 126500);
    CU_ASSERT_EQUAL(lme_truncate_head(100, 126500), 100);
    CU_ASSERT_EQUAL(lme_truncate_head(100, -1), -1);
    char *p = lme_render_prompt(0, "H", "D", "Q?");
    CU_ASSERT_STRING_EQUAL(p, "I will give you several history chats between you and a user. Please answer the question "
                              "based on the relevant chat history.\n\n\nHistory Chats:\n\nH\n\nCurrent Date: D\n"
                              "Question: Q?\nAnswer:");
    free(p);
}

static void check_lme_error(const char *content, const char *want_loc, const char *want_word) {
    const char *p = write_tmp("bad_lme.json", content);
    kvb_samples v = {0};
    CU_ASSERT(lme_load(p, "json", 0, 0, &v, err, sizeof err) == -1 && v.n == 0);
    CU_ASSERT(strstr(err, p) && strstr(err, want_loc) && !strchr(err, '\n'));
    if (want_word) CU_ASSERT(strstr(err, want_word) != NULL);
    if (!strstr(err, want_loc) || (want_word && !strstr(err, want_word))) printf("\n  unexpected error: %s", err);
}

#define LME_OK "{\"question_id\": \"q1\", \"question_type\": \"t\", \"question\": \"Q\", \"answer\": 3,\n" \
               " \"question_date\": \"d\", \"haystack_dates\": [\"d0\"], \"haystack_session_ids\": [\"s\"],\n" \
               " \"haystack_sessions\": [[{\"role\": \"user\", \"content\": \"hi\"}]]}"

static void test_longmemeval_malformed_files_name_file_and_line(void) {
    check_lme_error("[" LME_OK ",\n" LME_OK ",\n {\"question_id\": 5}]", ":7", "question_id");
    check_lme_error("[\n" LME_OK ",\n{\"x\": [1, 2,,]}]", ":5", "invalid JSON");
    check_lme_error("[\n\n{\"a\": }]", ":3", "invalid JSON");
    check_lme_error("{\"not\": \"an array\"}", ":1", "array");
    check_lme_error("[" LME_OK, ":3", "not closed");
    check_lme_error("[" LME_OK "] x", ":3", "after the array");
    check_lme_error("[" LME_OK ",]", ":3", "trailing");
    char bad[1024];
    snprintf(bad, sizeof bad, "[%s]", LME_OK);
    char *at = strstr(bad, "[\"d0\"]");
    memcpy(at, "[  1 ]", 6);
    check_lme_error(bad, ":1", "haystack_dates");
    snprintf(bad, sizeof bad, "[%s]", LME_OK);
    at = strstr(bad, "\"user\"");
    memcpy(at, "\"tool\"", 6);
    check_lme_error(bad, ":1", "role");
    kvb_samples v = {0};
    CU_ASSERT(lme_load(DATA "/longmemeval/missing.json", "json", 0, 0, &v, err, sizeof err) == -1);
    CU_ASSERT(strstr(err, "missing.json") != NULL);
    CU_ASSERT(lme_load(LME_ORACLE, "xml", 0, 0, &v, err, sizeof err) == -1 && strstr(err, "xml"));
    snprintf(bad, sizeof bad, "[%s]", LME_OK);
    const char *p = write_tmp("ok_lme.json", bad);
    CU_ASSERT_FATAL(lme_load(p, "nl", 0, 0, &v, err, sizeof err) == 0);
    CU_ASSERT_STRING_EQUAL(v.v[0].answers[0], "3");
    CU_ASSERT(v.v[0].n_turns == 2 && v.v[0].turns[1].content[0] == 0); /* the unanswered user turn gets "" */
    CU_ASSERT_STRING_EQUAL(v.v[0].task, "longmemeval");
    kvb_samples_free(&v);
}

/* ---------------------------------------------------------------- ShareGPT */

static void test_sharegpt_real_file_drops_leading_gpt_and_splits_last_round(void) {
    if (!NEEDS("sharegpt/sharegpt_v3_cleaned_split.top50_by_turns.json")) return;
    kvb_samples v = {0};
    CU_ASSERT_FATAL(sharegpt_load(SHAREGPT, 0, &v, err, sizeof err) == 0);
    CU_ASSERT_EQUAL(v.n, 50);
    char *text = util_read_file(SHAREGPT, NULL);
    cJSON *all = cJSON_Parse(text);
    free(text);
    CU_ASSERT_FATAL(all != NULL);
    int leading_gpt = 0;
    for (int i = 0; i < v.n; i++) {
        const cJSON *conv = cJSON_GetObjectItem(cJSON_GetArrayItem(all, i), "conversations");
        const kvb_sample *s = &v.v[i];
        const cJSON *m, *first_human = NULL, *last_human = NULL, *last = NULL;
        cJSON_ArrayForEach(m, conv) {
            if (!strcmp(cJSON_GetObjectItem(m, "from")->valuestring, "human")) {
                if (!first_human) first_human = m;
                last_human = m;
            }
            last = m;
        }
        leading_gpt += !strcmp(cJSON_GetObjectItem(conv->child, "from")->valuestring, "gpt");
        CU_ASSERT(turns_alternate(s));
        CU_ASSERT_STRING_EQUAL(s->question, cJSON_GetObjectItem(last_human, "value")->valuestring);
        CU_ASSERT(s->n_answers == 1 && !strcmp(s->answers[0], cJSON_GetObjectItem(last, "value")->valuestring));
        if (s->n_turns) CU_ASSERT_STRING_EQUAL(s->turns[0].content, cJSON_GetObjectItem(first_human, "value")->valuestring);
        CU_ASSERT_STRING_EQUAL(s->qtype, sharegpt_bucket(kvb_sample_n_rounds(s) + 1));
    }
    CU_ASSERT_EQUAL(leading_gpt, 13);
    CU_ASSERT_STRING_EQUAL(v.v[2].id, "gIYtTfa"); /* "gIYtTfa_10" starts with gpt */
    cJSON_Delete(all);
    kvb_samples_free(&v);
}

static void test_sharegpt_chunks_merge_by_id_in_index_order(void) {
    const char *p = write_tmp("sg.json",
        "[{\"id\": \"abc_4\", \"conversations\": [{\"from\": \"gpt\", \"value\": \"g2\"}, {\"from\": \"human\", \"value\": \"h3\"},\n"
        "   {\"from\": \"gpt\", \"value\": \"g3\"}]},\n"
        " {\"id\": \"zzz\", \"conversations\": [{\"from\": \"human\", \"value\": \"only\"}]},\n"
        " {\"id\": \"lead_0\", \"conversations\": [{\"from\": \"gpt\", \"value\": \"x\"}, {\"from\": \"gpt\", \"value\": \"y\"},\n"
        "   {\"from\": \"human\", \"value\": \"q\"}, {\"from\": \"gpt\", \"value\": \"a\"}]},\n"
        " {\"id\": \"nobody_0\", \"conversations\": [{\"from\": \"gpt\", \"value\": \"monologue\"}]},\n"
        " {\"id\": \"abc_0\", \"conversations\": [{\"from\": \"human\", \"value\": \"h1\"}, {\"from\": \"gpt\", \"value\": \"g1\"},\n"
        "   {\"from\": \"human\", \"value\": \"h2\"}]}]\n");
    kvb_samples v = {0};
    CU_ASSERT_FATAL(sharegpt_load(p, 0, &v, err, sizeof err) == 0);
    CU_ASSERT_EQUAL_FATAL(v.n, 3); /* "nobody" has no user message */
    const kvb_sample *s = &v.v[0];
    CU_ASSERT_STRING_EQUAL(s->id, "abc");
    CU_ASSERT_EQUAL_FATAL(s->n_turns, 4);
    CU_ASSERT(!strcmp(s->turns[0].content, "h1") && !strcmp(s->turns[1].content, "g1"));
    CU_ASSERT(!strcmp(s->turns[2].content, "h2") && !strcmp(s->turns[3].content, "g2"));
    CU_ASSERT(!strcmp(s->question, "h3") && s->n_answers == 1 && !strcmp(s->answers[0], "g3"));
    CU_ASSERT(!strcmp(v.v[1].id, "zzz") && !strcmp(v.v[1].question, "only") && v.v[1].n_answers == 0 && v.v[1].n_turns == 0);
    CU_ASSERT(!strcmp(v.v[2].id, "lead") && !strcmp(v.v[2].question, "q") && v.v[2].n_turns == 0);
    CU_ASSERT_STRING_EQUAL(v.v[2].answers[0], "a");
    kvb_samples_free(&v);
    CU_ASSERT_FATAL(sharegpt_load(p, 1, &v, err, sizeof err) == 0); /* the limit still merges later chunks */
    CU_ASSERT(v.n == 1 && v.v[0].n_turns == 4);
    kvb_samples_free(&v);
}

static void test_sharegpt_buckets_follow_round_attention(void) {
    CU_ASSERT_STRING_EQUAL(sharegpt_bucket(1), "mini");
    CU_ASSERT_STRING_EQUAL(sharegpt_bucket(9), "mini");
    CU_ASSERT_STRING_EQUAL(sharegpt_bucket(10), "small");
    CU_ASSERT_STRING_EQUAL(sharegpt_bucket(29), "small");
    CU_ASSERT_STRING_EQUAL(sharegpt_bucket(30), "medium");
    CU_ASSERT_STRING_EQUAL(sharegpt_bucket(49), "medium");
    CU_ASSERT_STRING_EQUAL(sharegpt_bucket(50), "large");
    CU_ASSERT_STRING_EQUAL(sharegpt_bucket(100), "large");
}

static void test_sharegpt_malformed_entries_name_file_and_line(void) {
    static const struct { const char *text, *loc, *word; } cases[] = {
        {"[{\"id\": \"a\", \"conversations\": []},\n {\"id\": \"b\", \"conversations\": [{\"from\": \"robot\", \"value\": \"v\"}]}]", ":2", "from"},
        {"[{\"id\": \"a\", \"conversations\": {}}]", ":1", "conversations"},
        {"[{\"id\": 7, \"conversations\": []}]", ":1", "id"},
        {"[\n{\"id\": \"a\", \"conversations\": []},\n{\"id\" \"b\"}]", ":3", "invalid JSON"},
        {"[{\"id\": \"a\", \"conversations\": [{\"from\": \"human\", \"value\": null}]}]", ":1", "value"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *p = write_tmp("sg_bad.json", cases[i].text);
        kvb_samples v = {0};
        CU_ASSERT(sharegpt_load(p, 0, &v, err, sizeof err) == -1 && v.n == 0);
        CU_ASSERT(strstr(err, p) && strstr(err, cases[i].loc) && strstr(err, cases[i].word));
        if (!strstr(err, cases[i].loc) || !strstr(err, cases[i].word)) printf("\n  unexpected error: %s", err);
    }
}

/* ---------------------------------------------------------------- 2StageRetr */

/* Checks the dict of a 2StageRetr prompt: n_pairs entries with keys 0..n-1 in order, and the colour of
 * a+b is the answer. Returns the number of pairs, -1 when something is off. */
static int check_twostage_prompt(const kvb_sample *s) {
    const char *d = strstr(s->prompt, "The Dict is {"), *eq = strstr(s->prompt, "}\nThe equation is ");
    if (!d || !eq) return -1;
    int a, b, n = 0;
    if (sscanf(eq, "}\nThe equation is %d + %d = ?", &a, &b) != 2) return -1;
    const char *p = d + strlen("The Dict is {");
    int found = 0;
    while (p < eq) {
        int key, used;
        char color[32];
        if (sscanf(p, "%d: '%31[a-z]'%n", &key, color, &used) != 2 || key != n) return -1;
        if (key == a + b) found = !strcmp(color, s->answers[0]);
        n++;
        p += used;
        if (!strncmp(p, ", ", 2)) p += 2;
    }
    return found ? n : -1;
}

static void test_twostage_generator_is_seeded_and_the_answer_is_in_the_dict(void) {
    kvb_samples a = {0}, b = {0}, c = {0};
    CU_ASSERT_FATAL(twostage_generate(42, 20, 40, 200, 1, &a, err, sizeof err) == 0);
    CU_ASSERT_FATAL(twostage_generate(42, 20, 40, 200, 1, &b, err, sizeof err) == 0);
    CU_ASSERT_FATAL(twostage_generate(43, 20, 40, 200, 1, &c, err, sizeof err) == 0);
    static const int sizes[10] = {40, 50, 60, 70, 80, 90, 100, 140, 180, 200};
    int differ = 0;
    for (int i = 0; i < 20; i++) {
        CU_ASSERT_STRING_EQUAL(a.v[i].prompt, b.v[i].prompt);
        differ += strcmp(a.v[i].prompt, c.v[i].prompt) != 0;
        CU_ASSERT_EQUAL(check_twostage_prompt(&a.v[i]), sizes[i % 10]);
        static const char intro[] = "Let's play a game. You have a dict and a mathematical addition equation. ";
        CU_ASSERT(!strncmp(a.v[i].prompt, intro, strlen(intro)));
        CU_ASSERT(strstr(a.v[i].prompt, "= ?\nMUST first output the result of the addition, and then answer the "
                                        "corresponding value based on the result.") != NULL);
        CU_ASSERT(a.v[i].max_new_tokens == 200 && a.v[i].use_chat && !strncmp(a.v[i].prefill, "First, for a precise", 20));
    }
    CU_ASSERT(differ >= 19);
    kvb_samples_free(&b);
    CU_ASSERT_FATAL(twostage_generate(42, 3, 40, 200, 0, &b, err, sizeof err) == 0);
    CU_ASSERT(strstr(b.v[0].prompt, "= ?\nDirectly answer the corresponding color based on the equation result.") != NULL);
    CU_ASSERT(!strstr(b.v[0].prompt, "MUST") && strstr(b.v[0].prefill, "The corresponding color is"));
    CU_ASSERT_STRING_EQUAL(b.v[0].system, "You are a helpful assistant.");
    CU_ASSERT(twostage_set_variant(&b.v[0], 1) == 0 && !strcmp(b.v[0].prompt, a.v[0].prompt));
    kvb_samples_free(&a);
    kvb_samples_free(&b);
    kvb_samples_free(&c);
}

static void test_twostage_sizes_range_up_to_10000_pairs(void) {
    kvb_samples v = {0};
    CU_ASSERT_FATAL(twostage_generate(1, 2, 10000, 10000, 1, &v, err, sizeof err) == 0);
    CU_ASSERT_EQUAL(check_twostage_prompt(&v.v[0]), 10000);
    CU_ASSERT_EQUAL(check_twostage_prompt(&v.v[1]), 10000);
    CU_ASSERT_STRING_EQUAL(v.v[1].qtype, "pairs=10000");
    kvb_samples_free(&v);
    CU_ASSERT_FATAL(twostage_generate(5, 10, 1, 10, 1, &v, err, sizeof err) == 0);
    CU_ASSERT(check_twostage_prompt(&v.v[0]) == 1 && strstr(v.v[0].prompt, "0 + 0 = ?"));
    CU_ASSERT(check_twostage_prompt(&v.v[9]) == 10);
    kvb_samples_free(&v);
    CU_ASSERT(twostage_generate(1, 2, 10, 10001, 1, &v, err, sizeof err) == -1 && strstr(err, "10000"));
    CU_ASSERT(twostage_generate(1, 2, 0, 10, 1, &v, err, sizeof err) == -1);
    CU_ASSERT(twostage_generate(1, 2, 50, 40, 1, &v, err, sizeof err) == -1 && v.n == 0);
}

static void test_twostage_jsonl_loads_omnikv_records(void) {
    const char *p = write_tmp("2stage.jsonl",
        "{\"prompt\": \"The Dict is {0: 'red'}\\nThe equation is 0 + 0 = ?\\nMUST first output the result of the "
        "addition, and then answer the corresponding value based on the result.\", \"answers\": [\"red\"]}\n"
        "{\"prompt\": \"P2\", \"answers\": [\"blue\"]}\n");
    kvb_samples v = {0};
    CU_ASSERT_FATAL(twostage_load(p, 0, &v, err, sizeof err) == 0);
    CU_ASSERT(v.n == 2 && !strcmp(v.v[0].answers[0], "red") && !strcmp(v.v[1].id, "2"));
    CU_ASSERT(strstr(v.v[0].prompt, "MUST first") && v.v[0].prefill && !strcmp(v.v[0].task, "2stage"));
    CU_ASSERT(twostage_set_variant(&v.v[0], 0) == 0 && strstr(v.v[0].prompt, "= ?\nDirectly answer"));
    kvb_samples_free(&v);
    p = write_tmp("2stage_bad.jsonl", "{\"prompt\": \"P\", \"answers\": [\"red\"]}\n{\"prompt\": \"P\", \"answers\": \"red\"}\n");
    CU_ASSERT(twostage_load(p, 0, &v, err, sizeof err) == -1 && v.n == 0);
    CU_ASSERT(strstr(err, p) && strstr(err, ":2") && strstr(err, "answers"));
}

/* ---------------------------------------------------------------- NIAH */

static int64_t count_chars4(void *ctx, const char *text) {
    (void)ctx;
    return (int64_t)(strlen(text) + 3) / 4;
}

static int64_t count_fail(void *ctx, const char *text) {
    (void)ctx;
    (void)text;
    return -1;
}

static void test_niah_needle_sits_at_depth_after_a_period(void) {
    if (!NEEDS("niah/PaulGrahamEssays")) return;
    const int lengths[] = {1000, 3000};
    const double depths[] = {0, 25, 50, 100};
    kvb_samples v = {0};
    CU_ASSERT_FATAL(niah_generate(ESSAYS, lengths, 2, depths, 4, NULL, NULL, NULL, NULL, NULL, &v, err, sizeof err) == 0);
    CU_ASSERT_EQUAL_FATAL(v.n, 8);
    char *first = util_read_file(ESSAYS "/addiction.txt", NULL); /* sorted first */
    CU_ASSERT_FATAL(first != NULL);
    int64_t needle_words = niah_count_words(NULL, NIAH_DEFAULT_NEEDLE);
    for (int i = 0; i < v.n; i++) {
        const kvb_sample *s = &v.v[i];
        int len = lengths[i / 4];
        double depth = depths[i % 4];
        CU_ASSERT(s->ctx_tokens == len && s->depth == depth);
        CU_ASSERT_EQUAL(count_occurrences(s->context, NIAH_DEFAULT_NEEDLE), 1);
        int64_t words = niah_count_words(NULL, s->context);
        CU_ASSERT(words <= len - 200 + 1 && words >= len - 200 - 1); /* +1: a needle put inside "x.Y" splits a word */
        CU_ASSERT_EQUAL(s->length, words);
        const char *at = strstr(s->context, NIAH_DEFAULT_NEEDLE);
        char *before = strndup(s->context, (size_t)(at - s->context));
        int64_t wb = niah_count_words(NULL, before), ctx_words = words - needle_words;
        if (depth == 0) CU_ASSERT(at == s->context);
        if (depth == 100) CU_ASSERT(!strcmp(at, NIAH_DEFAULT_NEEDLE));
        if (depth > 0 && depth < 100) {
            CU_ASSERT(at[-1] == '.');
            CU_ASSERT(wb <= (int64_t)(ctx_words * depth / 100) + 1 && wb >= (int64_t)(ctx_words * depth / 100) - 150);
        }
        if (depth != 0) CU_ASSERT(!strncmp(s->context, first, 200));
        CU_ASSERT_STRING_EQUAL(s->answers[0], NIAH_DEFAULT_KEY_PHRASE);
        CU_ASSERT(strstr(s->question, "What is the best thing to do in San Francisco? Don't give") == s->question);
        CU_ASSERT(!strncmp(s->prompt, s->context, strlen(s->context)) && strstr(s->prompt, "\n\nWhat is the best"));
        CU_ASSERT(!strncmp(s->system, "You are a helpful AI bot", 24));
        free(before);
    }
    CU_ASSERT_STRING_EQUAL(v.v[1].qtype, "len=1000,depth=25");
    free(first);
    kvb_samples_free(&v);
}

static void test_niah_builtin_filler_is_deterministic_and_needle_free(void) {
    const int lengths[] = {2000};
    const double depths[] = {50};
    kvb_samples a = {0}, b = {0};
    CU_ASSERT_FATAL(niah_generate(NULL, lengths, 1, depths, 1, NULL, NULL, NULL, count_chars4, NULL, &a, err, sizeof err) == 0);
    CU_ASSERT_FATAL(niah_generate(NULL, lengths, 1, depths, 1, NULL, NULL, NULL, count_chars4, NULL, &b, err, sizeof err) == 0);
    CU_ASSERT_STRING_EQUAL(a.v[0].context, b.v[0].context);
    CU_ASSERT(count_chars4(NULL, a.v[0].context) <= 1800 && count_chars4(NULL, a.v[0].context) >= 1798);
    CU_ASSERT_EQUAL(count_occurrences(a.v[0].context, "San Francisco"), 1);
    const char *at = strstr(a.v[0].context, NIAH_DEFAULT_NEEDLE);
    CU_ASSERT(at && at[-1] == '.');
    char *small = niah_filler_text(1000), *big = niah_filler_text(5000);
    CU_ASSERT(strlen(small) >= 1000 && !strncmp(small, big, strlen(small)));
    free(small);
    free(big);
    kvb_samples_free(&a);
    kvb_samples_free(&b);
    const char *needle = " The secret word is pumpkin. ";
    CU_ASSERT_FATAL(niah_generate(NULL, lengths, 1, depths, 1, needle, "What is the secret word?", "pumpkin", NULL, NULL,
                                  &a, err, sizeof err) == 0);
    CU_ASSERT(strstr(a.v[0].context, needle) && !strcmp(a.v[0].answers[0], "pumpkin"));
    CU_ASSERT(!strncmp(a.v[0].question, "What is the secret word? Don't", 30));
    kvb_samples_free(&a);
}

static void test_niah_default_grid_is_numpy_rounded_linspace(void) {
    double l[35], d[35];
    niah_linspace_round(1000, 16000, 35, l);
    niah_linspace_round(0, 100, 35, d);
    CU_ASSERT(l[0] == 1000 && l[1] == 1441 && l[3] == 2324 && l[9] == 4971 && l[34] == 16000);
    CU_ASSERT(d[0] == 0 && d[1] == 3 && d[9] == 26 && d[26] == 76 && d[34] == 100);
}

static void test_niah_bad_arguments_are_errors(void) {
    const int small[] = {150}, ok[] = {1000};
    const double depths[] = {50}, bad_depth[] = {150};
    kvb_samples v = {0};
    CU_ASSERT(niah_generate(NULL, small, 1, depths, 1, NULL, NULL, NULL, NULL, NULL, &v, err, sizeof err) == -1);
    CU_ASSERT(strstr(err, "150") != NULL);
    CU_ASSERT(niah_generate(NULL, ok, 1, bad_depth, 1, NULL, NULL, NULL, NULL, NULL, &v, err, sizeof err) == -1);
    CU_ASSERT(niah_generate(DATA "/niah/nothing_here", ok, 1, depths, 1, NULL, NULL, NULL, NULL, NULL, &v, err, sizeof err) == -1);
    CU_ASSERT(strstr(err, "nothing_here") != NULL);
    CU_ASSERT(niah_generate(tmpdir, ok, 1, depths, 1, NULL, NULL, NULL, NULL, NULL, &v, err, sizeof err) == -1);
    CU_ASSERT(niah_generate(NULL, ok, 1, depths, 1, NULL, NULL, NULL, count_fail, NULL, &v, err, sizeof err) == -1);
    CU_ASSERT(niah_generate(NULL, ok, 0, depths, 1, NULL, NULL, NULL, NULL, NULL, &v, err, sizeof err) == -1);
    /* a haystack whose repetitions add no token (one word, no space: "wordword..." stays one word) would be
     * repeated forever (found by tests/fuzz/fuzz_loaders): an error */
    char hay[300], txt[320];
    snprintf(hay, sizeof hay, "%s/oneword", tmpdir);
    snprintf(txt, sizeof txt, "%s/a.txt", hay);
    CU_ASSERT_FATAL(mkdir(hay, 0755) == 0);
    FILE *f = fopen(txt, "w");
    CU_ASSERT_FATAL(f != NULL);
    fputs("word", f);
    fclose(f);
    CU_ASSERT(niah_generate(hay, ok, 1, depths, 1, NULL, NULL, NULL, niah_count_words, NULL, &v, err, sizeof err) == -1);
    CU_ASSERT(strstr(err, "adds no tokens") != NULL);
    CU_ASSERT(v.n == 0);
}

/* ---------------------------------------------------------------- recall */

static void test_recall_fact_lives_in_the_named_round_only(void) {
    kvb_samples a = {0}, b = {0}, c = {0};
    CU_ASSERT_FATAL(recall_generate(7, 6, 20, &a, err, sizeof err) == 0);
    CU_ASSERT_FATAL(recall_generate(7, 6, 20, &b, err, sizeof err) == 0);
    CU_ASSERT_FATAL(recall_generate(8, 6, 20, &c, err, sizeof err) == 0);
    int differ = 0;
    for (int i = 0; i < a.n; i++) {
        const kvb_sample *s = &a.v[i];
        CU_ASSERT(s->n_turns == 40 && turns_alternate(s) && s->prompt == NULL && s->n_answers == 1);
        int r = 0;
        CU_ASSERT_FATAL(sscanf(s->qtype, "round=%d", &r) == 1 && r >= 1 && r <= 20);
        for (int k = 0; k < s->n_turns; k++)
            CU_ASSERT((strstr(s->turns[k].content, s->answers[0]) != NULL) == (k == 2 * (r - 1)));
        int facts = 0; /* the small-talk questions hold no '.', a stated fact ends with one */
        for (int k = 0; k < s->n_turns; k += 2) facts += strchr(s->turns[k].content, '.') != NULL;
        CU_ASSERT_EQUAL(facts, 4);
        for (int k = 0; k < s->n_turns; k++) CU_ASSERT_STRING_EQUAL(s->turns[k].content, b.v[i].turns[k].content);
        CU_ASSERT_STRING_EQUAL(s->question, b.v[i].question);
        differ += strcmp(s->answers[0], c.v[i].answers[0]) != 0 || strcmp(s->qtype, c.v[i].qtype) != 0;
    }
    CU_ASSERT(differ >= 4);
    kvb_samples_free(&a);
    kvb_samples_free(&b);
    kvb_samples_free(&c);
    CU_ASSERT_FATAL(recall_generate(3, 2, 1, &a, err, sizeof err) == 0);
    CU_ASSERT(a.v[0].n_turns == 2 && !strcmp(a.v[0].qtype, "round=1") && strstr(a.v[0].turns[0].content, a.v[0].answers[0]));
    CU_ASSERT(recall_generate(3, 2, 0, &a, err, sizeof err) == -1 && a.n == 2);
    kvb_samples_free(&a);
}

/* ---------------------------------------------------------------- shared */

static void test_round_builder_pads_missing_sides(void) {
    kvb_sample s;
    kvb_sample_init(&s);
    CU_ASSERT(kvb_sample_add_message(&s, "system", "sys", NULL) == 0);
    CU_ASSERT(kvb_sample_add_message(&s, "assistant", "a0", NULL) == 0); /* user "" first */
    CU_ASSERT(kvb_sample_add_message(&s, "user", "u1", NULL) == 0);
    CU_ASSERT(kvb_sample_add_message(&s, "user", "u2", NULL) == 0); /* assistant "" between */
    CU_ASSERT(kvb_sample_add_message(&s, "system", "late", NULL) == 1);
    CU_ASSERT(kvb_sample_close_rounds(&s) == 0);
    static const char *const want[][2] = {{"system", "sys"}, {"user", ""}, {"assistant", "a0"}, {"user", "u1"},
                                          {"assistant", ""}, {"user", "u2"}, {"assistant", ""}};
    CU_ASSERT_EQUAL_FATAL(s.n_turns, 7);
    for (int i = 0; i < 7; i++)
        CU_ASSERT(!strcmp(s.turns[i].role, want[i][0]) && !strcmp(s.turns[i].content, want[i][1]));
    CU_ASSERT_EQUAL(kvb_sample_n_rounds(&s), 3);
    kvb_sample_free(&s);
    CU_ASSERT(s.turns == NULL && s.n_turns == 0);
}

static void test_failed_load_leaves_earlier_samples_untouched(void) {
    kvb_samples v = {0};
    CU_ASSERT_FATAL(recall_generate(1, 3, 2, &v, err, sizeof err) == 0);
    const char *p = write_tmp("late_bad.jsonl", GOOD GOOD GOOD "{oops}\n");
    CU_ASSERT(lb_load(p, "hotpotqa", own_config, 0, &v, err, sizeof err) == -1);
    CU_ASSERT(v.n == 3 && !strcmp(v.v[2].task, "recall"));
    CU_ASSERT(lb_load(p, "hotpotqa", own_config, 2, &v, err, sizeof err) == 0); /* the limit stops before */
    CU_ASSERT(v.n == 5 && v.v[4].length == 5);
    kvb_samples_free(&v);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/kvb_test_loaders_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        fprintf(stderr, "cannot create %s\n", tmpdir);
        return 1;
    }
    if (write_own_config()) {
        fprintf(stderr, "cannot write %s\n", own_config);
        return 1;
    }
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("loaders", NULL, NULL);
    CU_add_test(s, "longbench prompts equal python format of the official template", test_longbench_prompts_equal_python_format_of_the_official_template);
    CU_add_test(s, "longbench task rules follow pred and eval", test_longbench_task_rules_follow_pred_and_eval);
    CU_add_test(s, "every reconstructed task loads every record", test_every_reconstructed_task_loads_every_record);
    CU_add_test(s, "longbench hidden splits at context, groups equal contexts, spreads",
                test_longbench_hidden_splits_at_context_groups_equal_contexts_and_spreads);
    CU_add_test(s, "official first20 lines keep id and length", test_official_first20_lines_keep_id_and_length);
    CU_add_test(s, "refilled template reproduces rendered minilongbench prompts", test_refilled_template_reproduces_rendered_minilongbench_prompts);
    CU_add_test(s, "substituted braces are never reparsed", test_substituted_braces_are_never_reparsed);
    CU_add_test(s, "longbench malformed records name file and line", test_longbench_malformed_records_name_file_and_line);
    CU_add_test(s, "longbench-e names, bins and suffix", test_longbench_e_names_bins_and_suffix);
    CU_add_test(s, "longbench duplicate ids name the id and both lines", test_longbench_duplicate_ids_name_the_id_and_both_lines);
    CU_add_test(s, "middle truncation keeps int(half) at each end", test_middle_truncation_keeps_int_half_at_each_end);
    CU_add_test(s, "longmemeval prompts equal the official reader", test_longmemeval_prompts_equal_the_official_reader);
    CU_add_test(s, "longmemeval oracle fields, rounds and abstention", test_longmemeval_oracle_fields_rounds_and_abstention);
    CU_add_test(s, "longmemeval S sessions become padded rounds", test_longmemeval_s_sessions_become_padded_rounds);
    CU_add_test(s, "longmemeval truncation helpers", test_longmemeval_truncation_helpers);
    CU_add_test(s, "longmemeval malformed files name file and line", test_longmemeval_malformed_files_name_file_and_line);
    CU_add_test(s, "sharegpt real file drops leading gpt and splits the last round", test_sharegpt_real_file_drops_leading_gpt_and_splits_last_round);
    CU_add_test(s, "sharegpt chunks merge by id in index order", test_sharegpt_chunks_merge_by_id_in_index_order);
    CU_add_test(s, "sharegpt buckets follow round attention", test_sharegpt_buckets_follow_round_attention);
    CU_add_test(s, "sharegpt malformed entries name file and line", test_sharegpt_malformed_entries_name_file_and_line);
    CU_add_test(s, "2stage generator is seeded and the answer is in the dict", test_twostage_generator_is_seeded_and_the_answer_is_in_the_dict);
    CU_add_test(s, "2stage sizes range up to 10000 pairs", test_twostage_sizes_range_up_to_10000_pairs);
    CU_add_test(s, "2stage jsonl loads omnikv records", test_twostage_jsonl_loads_omnikv_records);
    CU_add_test(s, "niah needle sits at depth after a period", test_niah_needle_sits_at_depth_after_a_period);
    CU_add_test(s, "niah builtin filler is deterministic and needle free", test_niah_builtin_filler_is_deterministic_and_needle_free);
    CU_add_test(s, "niah default grid is numpy rounded linspace", test_niah_default_grid_is_numpy_rounded_linspace);
    CU_add_test(s, "niah bad arguments are errors", test_niah_bad_arguments_are_errors);
    CU_add_test(s, "recall fact lives in the named round only", test_recall_fact_lives_in_the_named_round_only);
    CU_add_test(s, "round builder pads missing sides", test_round_builder_pads_missing_sides);
    CU_add_test(s, "failed load leaves earlier samples untouched", test_failed_load_leaves_earlier_samples_untouched);
    int rc = util_run_suites();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "note: could not remove %s\n", tmpdir);
    return rc;
}
