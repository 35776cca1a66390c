/* test_metrics_zh.c — LongBench's Chinese metrics in C (benchmarks/metrics.c over benchmarks/jieba.c) against the
 * official Python: every case of tests/fixtures/jieba/longbench_zh_metrics.json (scripts/metrics_zh_ref.py running
 * LongBench/metrics.py as eval.py scores a sample: multifieldqa_zh, dureader, vcsum, lsht, passage_retrieval_zh)
 * must score the same within 1e-9; in CI also the predictions made from the Chinese LongBench records beside the
 * clone (tests/fixtures/jieba/longbench_zh_shared_scores.json). Needs jieba's data (scripts/fetch-datasets.sh
 * jieba, which scripts/test.sh runs): without it the suite is skipped with one line, except in CI ($CI true or 1),
 * where it fails. */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util_common.h"
#include "benchmarks/jieba.h"
#include "benchmarks/metrics.h"
#include "benchmarks/score.h"

/* A JSON array of strings as a C array (caller frees the array, not the strings). */
static const char **strings(const cJSON *a, int *n) {
    *n = cJSON_IsArray(a) ? cJSON_GetArraySize(a) : 0;
    const char **v = calloc((size_t)*n + 1, sizeof *v);
    for (int i = 0; i < *n; i++) v[i] = cJSON_GetArrayItem(a, i)->valuestring;
    return v;
}

static cJSON *read_json(const char *path) {
    char *text = util_read_file(path, NULL);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    free(text);
    return root;
}

static void test_fixture_cases_match_python(void) {
    cJSON *root = read_json("tests/fixtures/jieba/longbench_zh_metrics.json");
    CU_ASSERT_FATAL(root != NULL);
    const cJSON *c;
    int n = 0, bad = 0, per_task[5] = {0};
    static const char *const tasks[5] = {"multifieldqa_zh", "dureader", "vcsum", "lsht", "passage_retrieval_zh"};
    double worst = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases")) {
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
            fprintf(stderr, "\n  %s: C %.12f, Python %.12f for pred \"%.80s\"", task, got, want, pred);
        }
        for (int t = 0; t < 5; t++) per_task[t] += !strcmp(task, tasks[t]);
        free(ans), free(cls);
        n++;
    }
    fprintf(stderr, "\n  %d cases (", n);
    for (int t = 0; t < 5; t++) fprintf(stderr, "%s%s %d", t ? ", " : "", tasks[t], per_task[t]);
    fprintf(stderr, "), %d equal, max |C - Python| = %.3g\n", n - bad, worst);
    for (int t = 0; t < 5; t++) CU_ASSERT(per_task[t] >= 10);
    CU_ASSERT(bad == 0);
    cJSON_Delete(root);
}

/* The first (from_end: last) n code points of s, malloc'd (Python's s[:n], s[-n:]). */
static char *cp_slice(const char *s, long n, int from_end) {
    size_t len = strlen(s), *start = malloc((len + 1) * sizeof *start);
    long total = 0;
    for (size_t i = 0; i < len; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) start[total++] = i;
    start[total] = len;
    long a = from_end ? (total > n ? total - n : 0) : 0, b = from_end ? total : (n < total ? n : total);
    char *out = strndup(s + start[a], start[b] - start[a]);
    free(start);
    return out;
}

static long cp_count(const char *s) {
    long n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) n += (*p & 0xC0) != 0x80;
    return n;
}

typedef struct {
    cJSON **rec;
    int n;
} records;

/* The records of one shared file, in the script's shape: answers, all_classes, context (lsht's rendered prompts:
 * gold.answers, gold.all_classes, the prompt's last 300 code points). */
static records load_records(const char *path) {
    records r = {0};
    FILE *f = fopen(path, "r");
    char *l = NULL;
    size_t cap = 0;
    while (f && getline(&l, &cap, f) > 0) {
        cJSON *x = cJSON_Parse(l);
        cJSON *gold = cJSON_DetachItemFromObject(x, "gold");
        if (gold) {
            char *ctx = cp_slice(cJSON_GetObjectItem(x, "origin_prompt")->valuestring, 300, 1);
            cJSON_Delete(x);
            x = gold;
            cJSON_AddStringToObject(x, "context", ctx);
            free(ctx);
        }
        r.rec = realloc(r.rec, (size_t)(r.n + 1) * sizeof *r.rec);
        r.rec[r.n++] = x;
    }
    free(l);
    if (f) fclose(f);
    return r;
}

static void free_records(records *r) {
    for (int i = 0; i < r->n; i++) cJSON_Delete(r->rec[i]);
    free(r->rec);
    r->rec = NULL, r->n = 0;
}

static const char *first_answer(const cJSON *rec) {
    return cJSON_GetArrayItem(cJSON_GetObjectItem(rec, "answers"), 0)->valuestring;
}

static void test_shared_records_match_python(void) {
    cJSON *root = read_json("tests/fixtures/jieba/longbench_zh_shared_scores.json");
    CU_ASSERT_FATAL(root != NULL);
    const cJSON *d;
    char cur[512] = "", path[1024];
    records rs = {0};
    int n = 0, bad = 0, missing = 0;
    cJSON_ArrayForEach(d, cJSON_GetObjectItem(root, "scores")) {
        const char *rel = cJSON_GetObjectItem(d, "file")->valuestring;
        if (strcmp(rel, cur)) {
            free_records(&rs);
            snprintf(cur, sizeof cur, "%s", rel);
            if (!UTIL_SHARED_DATA(rel, path, sizeof path)) { missing = 1; break; }
            rs = load_records(path);
        }
        int line = cJSON_GetObjectItem(d, "line")->valueint;
        CU_ASSERT_FATAL(line >= 1 && line <= rs.n);
        const cJSON *rec = rs.rec[line - 1], *next = rs.rec[line % rs.n];
        const char *kind = cJSON_GetObjectItem(d, "pred")->valuestring, *task = cJSON_GetObjectItem(d, "task")->valuestring;
        const char *gold = first_answer(rec);
        char *pred = !strcmp(kind, "gold") ? strdup(gold)
                   : !strcmp(kind, "half") ? cp_slice(gold, cp_count(gold) / 2, 0)
                   : !strcmp(kind, "other") ? strdup(first_answer(next))
                   : cp_slice(cJSON_GetObjectItem(rec, "context")->valuestring, 300, 0);
        int na, nc;
        const char **ans = strings(cJSON_GetObjectItem(rec, "answers"), &na);
        const char **cls = strings(cJSON_GetObjectItem(rec, "all_classes"), &nc);
        double got = -1, want = cJSON_GetObjectItem(d, "score")->valuedouble;
        CU_ASSERT(kvb_longbench_score(task, pred, ans, na, cls, nc, &got) == 0);
        if (fabs(got - want) > 1e-9) {
            bad++;
            fprintf(stderr, "\n  %s:%d %s (%s): C %.12f, Python %.12f", rel, line, task, kind, got, want);
        }
        n++;
        free(pred), free(ans), free(cls);
    }
    free_records(&rs);
    if (!missing) {
        fprintf(stderr, "\n  %d predictions on the shared LongBench zh records: %d equal\n", n, n - bad);
        CU_ASSERT(n >= 300);
        CU_ASSERT(bad == 0);
    }
    cJSON_Delete(root);
}

/* What a reader of metrics.py can check by hand, and the runner-facing scorer. */
static void test_direct_values(void) {
    double s;
    char metric[32];
    CU_ASSERT_DOUBLE_EQUAL(kvb_metric_retrieval_zh("段落3，或者段落13", "段落3"), 0.5, 1e-12);
    CU_ASSERT(kvb_metric_retrieval_zh("3", "没有段落编号") == 0.0); /* the official code raises: 0 */
    kvb_sample smp = {0};
    char *answers[1] = {"教育"};
    char *classes[3] = {"教育", "体育", "经济"};
    smp.task = "lsht", smp.answers = answers, smp.n_answers = 1, smp.all_classes = classes, smp.n_classes = 3;
    CU_ASSERT(kvb_score_sample("longbench", &smp, "\n教育\n体育", &s, metric, sizeof metric) == 0); /* first line */
    CU_ASSERT_DOUBLE_EQUAL(s, 1.0, 1e-12);
    CU_ASSERT_STRING_EQUAL(metric, "classification");
    char *gold[1] = {"北京是中国的首都"};
    smp.task = "multifieldqa_zh", smp.answers = gold, smp.all_classes = NULL, smp.n_classes = 0;
    CU_ASSERT(kvb_score_sample("longbench", &smp, "北京是中国的首都。", &s, metric, sizeof metric) == 0);
    CU_ASSERT_DOUBLE_EQUAL(s, 1.0, 1e-12); /* "。" is normalised away */
    CU_ASSERT_STRING_EQUAL(metric, "qa_f1_zh");
    /* a generation cut inside a character is scored as pred.py's lossy decode gives it: one U+FFFD per maximal
     * invalid subpart ("北京" + U+FFFD against "北京": F1 2/3, where a U+FFFD per byte would give 1/2) */
    gold[0] = "北京";
    CU_ASSERT(kvb_score_sample("longbench", &smp, "\xe5\x8c\x97\xe4\xba\xac\xe4\xba", &s, metric, sizeof metric) == 0);
    CU_ASSERT_DOUBLE_EQUAL(s, 2.0 / 3.0, 1e-12);
    CU_ASSERT(kvb_score_sample("longbench", &smp, "\xe5\x8c\x97\xe4\xba\xac\xf0\x9f\x98", &s, metric, sizeof metric) == 0);
    CU_ASSERT_DOUBLE_EQUAL(s, 2.0 / 3.0, 1e-12);
    char msg[256];
    CU_ASSERT(kvb_score_check_task("vcsum", msg, sizeof msg) == 0); /* the data is here: no refusal */
}

int main(void) {
    char dir[1024];
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("metrics_zh", NULL, NULL);
    if (kvb_jieba_dir(dir, sizeof dir) == 0 && kvb_jieba_present(dir)) {
        CU_add_test(s, "fixture cases = official Python values (five Chinese tasks)", test_fixture_cases_match_python);
        CU_add_test(s, "shared LongBench zh records: scores = official Python values", test_shared_records_match_python);
        CU_add_test(s, "direct values: 段落N, lsht's first line, zh punctuation; runner scorer", test_direct_values);
    } else {
        const char *ci = getenv("CI");
        if (ci && (!strcmp(ci, "true") || !strcmp(ci, "1"))) {
            fprintf(stderr, "test_metrics_zh: jieba's data is not in %s (CI=true: scripts/test.sh runs %s)\n", dir,
                    KVB_JIEBA_FETCH);
            CU_cleanup_registry();
            return 1;
        }
        printf("test_metrics_zh: skipped: jieba's data is not in %s (%s)\n", dir, KVB_JIEBA_FETCH);
    }
    return util_run_suites();
}
