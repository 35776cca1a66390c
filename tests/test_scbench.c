/* test_scbench.c — SCBench (benchmarks/scbench.h) against its official code's values on records in its format
 * (tests/fixtures/scbench/, made by scripts/scbench_fixtures.py from microsoft/MInference scbench/: eval_utils.py's
 * create_multiturn_prompt / create_scdq_prompt / get_ground_truth, compute_scores.py, repo_qa_utils.py): each turn's
 * messages, rendered in ChatML as the script's tokenizer renders them, are the official prompts of both modes; the
 * per-turn max_new_tokens; each prediction scores what the official scorer gives; turn means equal compute_scores'
 * per-turn figures; nltk's BLEU (method4); the suite entry and malformed records; real samples in ../shared/data. */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util_common.h"
#include "benchmarks/registry.h"
#include "benchmarks/scbench.h"
#include "benchmarks/score.h"
#include "reports/report.h"

#define FIX "tests/fixtures/scbench"

static char err[512];
static cJSON *exp_json;

static cJSON *expected(void) {
    if (!exp_json) {
        char *text = util_read_file(FIX "/expected.json", NULL);
        exp_json = text ? cJSON_Parse(text) : NULL;
        free(text);
    }
    return exp_json;
}

static int load_task(const char *task, int multi_request, kvb_samples *v) {
    char path[256];
    snprintf(path, sizeof path, FIX "/%s.jsonl", task);
    scb_opts o = {.multi_request = multi_request};
    return scb_load(path, task, &o, v, err, sizeof err);
}

/* The sample's messages in ChatML as the fixture script's tokenizer renders them (Qwen2.5's default system). */
static char *chatml(const kvb_sample *s, const char *system) {
    kvb_sb b = {0};
    kvb_sb_addf(&b, "<|im_start|>system\n%s<|im_end|>\n", system);
    if (s->prompt) kvb_sb_addf(&b, "<|im_start|>user\n%s<|im_end|>\n", s->prompt);
    for (int i = 0; i < s->n_turns; i++)
        kvb_sb_addf(&b, "<|im_start|>%s\n%s<|im_end|>\n", s->turns[i].role, s->turns[i].content);
    if (!s->prompt) kvb_sb_addf(&b, "<|im_start|>user\n%s<|im_end|>\n", s->question);
    kvb_sb_adds(&b, "<|im_start|>assistant\n");
    if (s->prefill) kvb_sb_adds(&b, s->prefill);
    return kvb_sb_take(&b);
}

/* The official prompt of turn k (0-based): multi-turn: prompts[0] + ... + prompts[k] (each later prompt is what is
 * prefilled after the previous turn's reference answer); scdq: prompts[0] + prompts[k + 1]. */
static char *official(const cJSON *prompts, int k, int scdq) {
    kvb_sb b = {0};
    if (scdq) {
        kvb_sb_adds(&b, cJSON_GetArrayItem(prompts, 0)->valuestring);
        kvb_sb_adds(&b, cJSON_GetArrayItem(prompts, k + 1)->valuestring);
    } else {
        for (int i = 0; i <= k; i++) kvb_sb_adds(&b, cJSON_GetArrayItem(prompts, i)->valuestring);
    }
    return kvb_sb_take(&b);
}

static void test_every_turn_renders_the_official_prompts_of_both_modes(void) {
    cJSON *e = expected(), *t;
    CU_ASSERT_FATAL(e != NULL);
    const char *system = cJSON_GetObjectItem(e, "qwen_system")->valuestring;
    int checked = 0;
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(e, "tasks")) {
        for (int scdq = 0; scdq < 2; scdq++) {
            kvb_samples v = {0};
            CU_ASSERT_FATAL(load_task(t->string, scdq, &v) == 0);
            const cJSON *recs = cJSON_GetObjectItem(t, "records"), *mnt = cJSON_GetObjectItem(t, "max_new_tokens");
            int at = 0;
            for (int r = 0; r < cJSON_GetArraySize(recs); r++) {
                const cJSON *prompts = cJSON_GetObjectItem(cJSON_GetArrayItem(recs, r), scdq ? "scdq" : "multi_turn");
                int n_turns = cJSON_GetArraySize(prompts) - scdq;
                for (int k = 0; k < n_turns; k++, at++) {
                    CU_ASSERT_FATAL(at < v.n);
                    const kvb_sample *s = &v.v[at];
                    char *got = chatml(s, system), *want = official(prompts, k, scdq);
                    CU_ASSERT_STRING_EQUAL(got, want);
                    if (strcmp(got, want)) fprintf(stderr, "\n%s %s turn %d\n got: %s\nwant: %s\n", t->string, scdq ? "scdq" : "mt", k + 1, got, want);
                    free(got), free(want);
                    /* max_new_tokens: the task's, or the turn task's in the multi-tasking sets */
                    int m = cJSON_IsNumber(mnt) ? mnt->valueint : cJSON_GetObjectItem(mnt, s->all_classes[0])->valueint;
                    CU_ASSERT(s->max_new_tokens == m);
                    char q[32];
                    snprintf(q, sizeof q, "turn=%d", k + 1);
                    CU_ASSERT_STRING_EQUAL(s->qtype, q);
                    CU_ASSERT_STRING_EQUAL(s->domain, scb_task_group(t->string));
                    CU_ASSERT(s->use_chat == 1);
                    /* the context is in the prompt's first message, the question after it */
                    const char *first = s->prompt ? s->prompt : s->turns[0].content;
                    CU_ASSERT(strstr(first, s->context) != NULL);
                    if (scdq) {
                        CU_ASSERT(s->group != NULL && s->prompt != NULL);
                        size_t lp = strlen(s->prompt), lq = strlen(s->question), lc = strlen(s->context);
                        CU_ASSERT(lp >= lq + lc && !strcmp(s->prompt + lp - lq, s->question) &&
                                  !strncmp(s->prompt + lp - lq - lc, s->context, lc));
                    }
                    checked++;
                }
            }
            CU_ASSERT(at == v.n);
            kvb_samples_free(&v);
        }
    }
    CU_ASSERT(checked >= 90);
    printf("\n  %d turns rendered as the official prompts (both modes)\n", checked);
}

/* The sample of (task, record, turn) in a multi-turn load. */
static const kvb_sample *find_turn(const kvb_samples *v, int record, int turn) {
    int r = -1;
    for (int i = 0; i < v->n; i++) {
        if (!strcmp(v->v[i].qtype, "turn=1")) r++;
        char q[32];
        snprintf(q, sizeof q, "turn=%d", turn);
        if (r == record && !strcmp(v->v[i].qtype, q)) return &v->v[i];
    }
    return NULL;
}

/* Every prediction of a fixture array scored through the registry against its turn loaded with max_turns;
 * returns how many differ from the official score (n = how many were scored). */
static int score_array(const char *key, int max_turns, int *n) {
    cJSON *c;
    int bad = 0;
    const char *cur = "";
    kvb_samples v = {0};
    *n = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(expected(), key)) {
        const char *task = cJSON_GetObjectItem(c, "task")->valuestring;
        if (strcmp(task, cur)) {
            kvb_samples_free(&v);
            char path[256];
            snprintf(path, sizeof path, FIX "/%s.jsonl", task);
            scb_opts o = {.max_turns = max_turns};
            CU_ASSERT_FATAL(scb_load(path, task, &o, &v, err, sizeof err) == 0);
            cur = task;
        }
        const kvb_sample *s = find_turn(&v, cJSON_GetObjectItem(c, "record")->valueint, cJSON_GetObjectItem(c, "turn")->valueint);
        CU_ASSERT_FATAL(s != NULL);
        const char *pred = cJSON_GetObjectItem(c, "prediction")->valuestring;
        double want = cJSON_GetObjectItem(c, "score")->valuedouble, got = -1;
        char metric[64];
        CU_ASSERT(kvb_score_sample("scbench", s, pred, &got, metric, sizeof metric) == 0);
        if (fabs(got - want) > 1e-9) {
            bad++;
            fprintf(stderr, "\n%s %s: %s -> %g, official %g\n", task, s->id, pred, got, want);
        }
        (*n)++;
    }
    kvb_samples_free(&v);
    return bad;
}

static void test_predictions_score_as_the_official_scorers(void) {
    CU_ASSERT_FATAL(expected() != NULL);
    const kvb_benchmark *b = kvb_benchmark_find("scbench");
    CU_ASSERT_FATAL(b != NULL && b->score == scb_score);
    int n = 0, bad = score_array("scores", 0, &n);
    CU_ASSERT(bad == 0);
    CU_ASSERT(n >= 220);
    printf("\n  %d predictions scored, %d apart from the official scorers", n, bad);
    /* --max_turns 2: repoqa's needles are the functions of the turns asked (of every record of the repo) */
    bad = score_array("scores_max_turns_2", 2, &n);
    CU_ASSERT(bad == 0 && n >= 50);
    printf("; with max_turns 2, %d, %d apart\n", n, bad);
}

/* compute_scores' per-turn string ("%.3f" of the mean x100; the multi-tasking sets: two per turn, by subtask) */
static void test_turn_means_equal_compute_scores(void) {
    cJSON *e = expected(), *t;
    CU_ASSERT_FATAL(e != NULL);
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(e, "turn_scores")) {
        if (!strcmp(t->string, "scbench_summary_with_needles") || !strcmp(t->string, "scbench_repoqa_and_kv")) continue;
        kvb_samples v = {0};
        CU_ASSERT_FATAL(load_task(t->string, 0, &v) == 0);
        /* the first prediction of every turn, as the script wrote them into its predictions file */
        double sum[8] = {0};
        int cnt[8] = {0}, max_turn = 0;
        cJSON *c;
        int last_r = -1, last_k = -1;
        cJSON_ArrayForEach(c, cJSON_GetObjectItem(e, "scores")) {
            if (strcmp(cJSON_GetObjectItem(c, "task")->valuestring, t->string)) continue;
            int r = cJSON_GetObjectItem(c, "record")->valueint, k = cJSON_GetObjectItem(c, "turn")->valueint;
            if (r == last_r && k == last_k) continue;
            last_r = r, last_k = k;
            const kvb_sample *s = find_turn(&v, r, k);
            double sc;
            char m[64];
            CU_ASSERT_FATAL(s && scb_score(s, cJSON_GetObjectItem(c, "prediction")->valuestring, &sc, m, sizeof m) == 0);
            sum[k] += sc, cnt[k]++;
            if (k > max_turn) max_turn = k;
        }
        kvb_sb b = {0};
        for (int k = 1; k <= max_turn; k++) kvb_sb_addf(&b, "%s%.3f", k > 1 ? "," : "", sum[k] / cnt[k] * 100);
        char *got = kvb_sb_take(&b);
        CU_ASSERT_STRING_EQUAL(got, t->valuestring);
        free(got);
        kvb_samples_free(&v);
    }
}

static void test_bleu_is_nltks_sentence_bleu_with_method4(void) {
    cJSON *e = expected(), *c;
    CU_ASSERT_FATAL(e != NULL);
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(e, "bleu")) {
        double got = scb_bleu_method4(cJSON_GetObjectItem(c, "candidate")->valuestring, cJSON_GetObjectItem(c, "reference")->valuestring);
        double want = cJSON_GetObjectItem(c, "bleu")->valuedouble;
        CU_ASSERT(fabs(got - want) < 1e-12);
        if (fabs(got - want) >= 1e-12) fprintf(stderr, "\nbleu %g, nltk %g\n", got, want);
    }
}

static void test_code_block_is_the_first_fenced_block(void) {
    char *s = scb_code_block("Sure:\n```python\ndef f():\n    return 1\n```\n```\nx\n```");
    CU_ASSERT_STRING_EQUAL(s, "def f():\n    return 1\n");
    free(s);
    s = scb_code_block("  no block here \n");
    CU_ASSERT_STRING_EQUAL(s, "no block here");
    free(s);
    s = scb_code_block("```\n\n  body\n```");
    CU_ASSERT_STRING_EQUAL(s, "  body\n");
    free(s);
}

static void test_malformed_records_are_refused_with_file_and_line(void) {
    char path[] = "/tmp/kvb_scb_XXXXXX";
    int fd = mkstemp(path);
    CU_ASSERT_FATAL(fd >= 0);
    const char *text = "{\"id\": 0, \"context\": \"c\", \"multi_turns\": [{\"input\": \"q\", \"answer\": \"a\"}]}\n"
                       "{\"id\": 1, \"context\": \"c\", \"multi_turns\": [{\"input\": \"q\"}]}\n";
    CU_ASSERT_FATAL(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
    close(fd);
    kvb_samples v = {0};
    scb_opts o = {0};
    CU_ASSERT(scb_load(path, "scbench_kv", &o, &v, err, sizeof err) == -1);
    CU_ASSERT(strstr(err, ":2: a turn's 'answer' is missing") != NULL);
    CU_ASSERT(v.n == 0 && v.v == NULL);
    CU_ASSERT(scb_load(path, "scbench_nope", &o, &v, err, sizeof err) == -1);
    o.limit = 1;
    CU_ASSERT(scb_load(path, "scbench_kv", &o, &v, err, sizeof err) == 0 && v.n == 1);
    kvb_samples_free(&v);
    CU_ASSERT(scb_load(FIX "/scbench_choice_eng.jsonl", "scbench_kv", &(scb_opts){0}, &v, err, sizeof err) == 0);
    kvb_samples_free(&v);
    unlink(path);
}

static void test_max_turns_and_the_middle_cut(void) {
    kvb_samples v = {0};
    scb_opts o = {.max_turns = 2};
    CU_ASSERT_FATAL(scb_load(FIX "/scbench_kv.jsonl", "scbench_kv", &o, &v, err, sizeof err) == 0);
    CU_ASSERT(v.n == 4); /* 3 + 2 turns, each cut to 2 */
    kvb_samples_free(&v);
    /* bytes as tokens: a context cut to 20 keeps its first and last 10 */
    o = (scb_opts){.max_context_tokens = 20};
    CU_ASSERT_FATAL(scb_load(FIX "/scbench_kv.jsonl", "scbench_kv", &o, &v, err, sizeof err) == 0);
    CU_ASSERT(strlen(v.v[0].context) > 20); /* no token counter: not cut */
    kvb_samples_free(&v);
}

static int64_t count_bytes(void *ctx, const char *text) {
    (void)ctx;
    return (int64_t)strlen(text);
}

static void test_context_cut_keeps_head_and_tail_within_the_tokens(void) {
    kvb_samples v = {0};
    scb_opts o = {.max_context_tokens = 20, .count_tokens = count_bytes};
    CU_ASSERT_FATAL(scb_load(FIX "/scbench_kv.jsonl", "scbench_kv", &o, &v, err, sizeof err) == 0);
    const char *c = v.v[0].context;
    CU_ASSERT(strlen(c) <= 20 && strlen(c) >= 16);
    CU_ASSERT(!strncmp(c, "{\"2a8f-11\"", 5) && c[strlen(c) - 1] == '}');
    CU_ASSERT(strstr(v.v[0].prompt, c) != NULL);
    kvb_samples_free(&v);
}

/* the suite entry through the registry: tasks from a folder, a single file, multi-request task names and groups */
typedef struct { kvb_samples sets[16]; char names[16][96]; int n; } sink;

static kvb_samples *add_task(void *ctx, const char *name, const char *benchmark, kvb_judge_kind judge, char *e, size_t el) {
    (void)benchmark, (void)judge, (void)e, (void)el;
    sink *k = ctx;
    snprintf(k->names[k->n], sizeof k->names[0], "%s", name);
    return &k->sets[k->n++];
}

static int expand(const char *in, char *out, size_t cap) { return snprintf(out, cap, "%s", in) >= (int)cap ? -1 : 0; }

static void test_suite_entry_loads_tasks_of_a_folder_or_file(void) {
    sink k = {0};
    kvb_bench_env env = {.suite_path = "t.json", .n_ctx_train = 32768, .expand_path = expand, .add_task = add_task, .add_ctx = &k};
    const kvb_benchmark *b = kvb_benchmark_find("scbench");
    cJSON *entry = cJSON_Parse("{\"type\": \"scbench\", \"path\": \"" FIX "\", \"tasks\": [\"scbench_kv\", \"scbench_vt\"], "
                               "\"mode\": \"multi_request\", \"samples\": 1}");
    CU_ASSERT_FATAL(b && b->load(&env, entry, err, sizeof err) == 0);
    CU_ASSERT(k.n == 2 && !strcmp(k.names[0], "scbench_kv_scdq") && !strcmp(k.names[1], "scbench_vt_scdq"));
    CU_ASSERT(k.sets[0].n == 3 && !strcmp(k.sets[0].v[0].group, "scbench_kv/0") && !strcmp(k.sets[0].v[2].group, "scbench_kv/0"));
    cJSON_Delete(entry);
    entry = cJSON_Parse("{\"type\": \"scbench\", \"path\": \"" FIX "/scbench_qa_eng.jsonl\"}");
    CU_ASSERT(b->load(&env, entry, err, sizeof err) == 0);
    /* multi-turn with KV cache reuse, the default: one carried group per record */
    CU_ASSERT(k.n == 3 && !strcmp(k.names[2], "scbench_qa_eng_reuse") && k.sets[2].n == 4 && k.sets[2].v[0].carried &&
              k.sets[2].v[0].group && !strncmp(k.sets[2].v[0].group, "scbench_qa_eng_reuse/", 21));
    cJSON_Delete(entry);
    entry = cJSON_Parse("{\"type\": \"scbench\", \"path\": \"" FIX "\", \"tasks\": [\"scbench_kv\"], \"mode\": \"both\"}");
    CU_ASSERT(b->load(&env, entry, err, sizeof err) == -1 && strstr(err, "\"mode\"") != NULL);
    cJSON_Delete(entry);
    entry = cJSON_Parse("{\"type\": \"scbench\", \"path\": \"" FIX "\", \"tasks\": [\"scbench_kv\"], \"question\": \"hidden\"}");
    CU_ASSERT(b->load(&env, entry, err, sizeof err) == -1 && strstr(err, "multi_request") != NULL);
    cJSON_Delete(entry);
    entry = cJSON_Parse("{\"type\": \"scbench\", \"path\": \"/nonexistent\", \"tasks\": [\"scbench_kv\"], \"optional\": true}");
    env.optional = 1;
    CU_ASSERT(b->load(&env, entry, err, sizeof err) == 0 && k.n == 3);
    cJSON_Delete(entry);
    for (int i = 0; i < k.n; i++) kvb_samples_free(&k.sets[i]);
}

/* The records a run would write for the first prediction of every turn of qa_chn (multi-turn) and of kv asked as
 * multi-request with the question hidden (its first query holding the context's prefill): the report's SCBench
 * table gives compute_scores' per-turn figures, the prefill tokens summed (the context once), and the groups. */
static void test_report_gives_turn_scores_prefill_once_and_groups(void) {
    cJSON *e = expected(), *c;
    CU_ASSERT_FATAL(e != NULL);
    char dir[] = "/tmp/kvb_scb_run_XXXXXX", p[128];
    CU_ASSERT_FATAL(mkdtemp(dir) != NULL);
    snprintf(p, sizeof p, "%s/run.json", dir);
    FILE *f = fopen(p, "w");
    CU_ASSERT_FATAL(f != NULL);
    fputs("{\"suite\":\"scb\",\"model\":\"m.gguf\",\"model_sha256\":\"s\",\"git_commit\":\"c\",\"host\":\"h\",\"backend\":\"cpu\","
          "\"flags\":\"\",\"created\":\"2026-01-01T00:00:00Z\"}\n", f);
    fclose(f);
    snprintf(p, sizeof p, "%s/results.jsonl", dir);
    CU_ASSERT_FATAL((f = fopen(p, "w")) != NULL);
    static const char *const TASKS[2] = {"scbench_qa_chn", "scbench_kv"};
    for (int t = 0; t < 2; t++) {
        kvb_samples v = {0};
        CU_ASSERT_FATAL(load_task(TASKS[t], t, &v) == 0);
        int last_r = -1, last_k = -1;
        cJSON_ArrayForEach(c, cJSON_GetObjectItem(e, "scores")) {
            if (strcmp(cJSON_GetObjectItem(c, "task")->valuestring, TASKS[t])) continue;
            int r = cJSON_GetObjectItem(c, "record")->valueint, k = cJSON_GetObjectItem(c, "turn")->valueint;
            if (r == last_r && k == last_k) continue;
            last_r = r, last_k = k;
            const kvb_sample *s = NULL;
            for (int i = 0, rr = -1; i < v.n && !s; i++) { /* the scdq samples of a record follow each other too */
                if (!strcmp(v.v[i].qtype, "turn=1")) rr++;
                char q[16];
                snprintf(q, sizeof q, "turn=%d", k);
                if (rr == r && !strcmp(v.v[i].qtype, q)) s = &v.v[i];
            }
            CU_ASSERT_FATAL(s != NULL);
            double sc;
            char m[64];
            CU_ASSERT_FATAL(scb_score(s, cJSON_GetObjectItem(c, "prediction")->valuestring, &sc, m, sizeof m) == 0);
            fprintf(f, "{\"method\":\"full\",\"budget\":\"full\",\"benchmark\":\"scbench\",\"task\":\"%s%s\",\"sample_id\":\"%s\","
                       "\"score\":%.17g,\"metric\":\"%s\",\"qtype\":\"%s\",\"domain\":\"%s\",\"prefill_tokens\":%d",
                    s->task, t ? "+hidden" : "", s->id, sc, m, s->qtype, s->domain, t && k > 1 ? 10 : 100);
            if (t) fprintf(f, ",\"context_group\":\"%s\",\"shared_prefill\":\"%s\"", s->group, k > 1 ? "reused" : "first");
            fputs("}\n", f);
        }
        kvb_samples_free(&v);
    }
    fclose(f);
    CU_ASSERT_FATAL(kvb_report_write(dir, err, sizeof err) == 0);
    snprintf(p, sizeof p, "%s/report.md", dir);
    char *md = util_read_file(p, NULL);
    CU_ASSERT_FATAL(md != NULL);
    CU_ASSERT(strstr(md, "| task | method@budget | prefill tokens | prefill s | all | turn=1 | turn=2 | turn=3 |") != NULL);
    /* compute_scores: qa_chn "66.667,40.000"; kv "100.000,100.000,100.000"; 3 turns of qa_chn prefilled whole */
    CU_ASSERT(strstr(md, "| scbench_qa_chn | full@full | 300 | 0.0 | 57.8 (3) | 66.7 (2) | 40.0 (1) |") != NULL);
    /* kv: 2 records, 5 queries: each context once (100) and the later queries alone (10 each) */
    CU_ASSERT(strstr(md, "| scbench_kv_scdq+hidden | full@full | 230 | 0.0 | 100.0 (5) | 100.0 (2) | 100.0 (2) | 100.0 (1) |") != NULL);
    CU_ASSERT(strstr(md, "| full@full | 84.2 (8) | 100.0 (5) | 57.8 (3) |") != NULL);
    if (!strstr(md, "| scbench_qa_chn | full@full | 300")) fprintf(stderr, "\n%s\n", strstr(md, "## SCBench") ? strstr(md, "## SCBench") : md);
    free(md);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CU_ASSERT(system(cmd) == 0);
}

/* real SCBench files in ../shared/data/scbench: every task present loads in both modes. The shared records
 * (2026-11-26) hold no SCBench: where ../shared/data is there without it, one line and a skip, in CI too; without
 * ../shared/data at all, the usual rule (a failure under CI=true) */
static void test_shared_samples_load(void) {
    char dir[512];
    if (access("../shared/data", R_OK) == 0 && access("../shared/data/scbench", R_OK) != 0) {
        printf("\n    skipped: ../shared/data holds no scbench/ (scripts/fetch-datasets.sh scbench fetches the real files)");
        return;
    }
    if (!UTIL_SHARED_DATA("scbench", dir, sizeof dir)) return;
    static const char *const T[] = {"scbench_kv", "scbench_prefix_suffix", "scbench_vt", "scbench_repoqa", "scbench_qa_eng",
                                    "scbench_qa_chn", "scbench_choice_eng", "scbench_many_shot", "scbench_mf", "scbench_summary",
                                    "scbench_summary_with_needles", "scbench_repoqa_and_kv"};
    int found = 0;
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++) {
        char path[700];
        scb_data_path(dir, T[i], path, sizeof path);
        if (access(path, R_OK)) continue;
        found++;
        for (int mr = 0; mr < 2; mr++) {
            kvb_samples v = {0};
            scb_opts o = {.multi_request = mr, .limit = 2};
            CU_ASSERT(scb_load(path, T[i], &o, &v, err, sizeof err) == 0);
            if (v.n == 0) fprintf(stderr, "\n%s: %s\n", path, err);
            for (int j = 0; j < v.n; j++) {
                double sc;
                char m[64];
                CU_ASSERT(scb_score(&v.v[j], v.v[j].answers[0], &sc, m, sizeof m) == 0);
            }
            kvb_samples_free(&v);
        }
    }
    CU_ASSERT(found > 0);
}

int main(void) {
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("scbench", NULL, NULL);
    CU_add_test(s, "every turn renders the official prompts of both modes", test_every_turn_renders_the_official_prompts_of_both_modes);
    CU_add_test(s, "predictions score as the official scorers", test_predictions_score_as_the_official_scorers);
    CU_add_test(s, "turn means equal compute_scores", test_turn_means_equal_compute_scores);
    CU_add_test(s, "bleu is nltk's sentence_bleu with method4", test_bleu_is_nltks_sentence_bleu_with_method4);
    CU_add_test(s, "code block is the first fenced block", test_code_block_is_the_first_fenced_block);
    CU_add_test(s, "malformed records are refused with file and line", test_malformed_records_are_refused_with_file_and_line);
    CU_add_test(s, "max turns and the middle cut", test_max_turns_and_the_middle_cut);
    CU_add_test(s, "context cut keeps head and tail within the tokens", test_context_cut_keeps_head_and_tail_within_the_tokens);
    CU_add_test(s, "suite entry loads tasks of a folder or file", test_suite_entry_loads_tasks_of_a_folder_or_file);
    CU_add_test(s, "report gives turn scores, the prefill once and the groups", test_report_gives_turn_scores_prefill_once_and_groups);
    CU_add_test(s, "shared samples load", test_shared_samples_load);
    int rc = util_run_suites();
    cJSON_Delete(exp_json);
    return rc;
}
