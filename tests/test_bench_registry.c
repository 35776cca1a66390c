/* test_bench_registry.c — the benchmark table (benchmarks/registry.h): every row is whole and scored one way (a
 * scorer, or a judge kind), types are unique and found by name, every suite in configs/ names only types of the
 * table, and kvb_score_sample dispatches through the rows (substring for niah, none for a judged or unknown type). */
#include <CUnit/Basic.h>
#include <glob.h>
#include <stdlib.h>
#include <string.h>

#include "util_common.h"
#include "benchmarks/registry.h"
#include "benchmarks/score.h"

static void test_every_row_is_whole_and_scored_one_way(void) {
    CU_ASSERT(kvb_benchmark_count() > 0);
    for (int i = 0; i < kvb_benchmark_count(); i++) {
        const kvb_benchmark *b = kvb_benchmark_at(i);
        CU_ASSERT_FATAL(b && b->type && b->load);
        CU_ASSERT((b->score != NULL) != (b->judge != KVB_JK_NONE)); /* a scorer or a judge, not both, not neither */
        CU_ASSERT(kvb_benchmark_find(b->type) == b);                 /* unique: the first row of its name is itself */
    }
    CU_ASSERT(kvb_benchmark_at(kvb_benchmark_count()) == NULL && kvb_benchmark_at(-1) == NULL);
    CU_ASSERT(kvb_benchmark_find("nosuch") == NULL && kvb_benchmark_find(NULL) == NULL);
    char names[256];
    kvb_benchmark_names(names, sizeof names);
    for (int i = 0; i < kvb_benchmark_count(); i++) CU_ASSERT(strstr(names, kvb_benchmark_at(i)->type) != NULL);
}

/* every "type" of every suite shipped in configs/ is a row (a suite with an unknown type fails before any run) */
static void test_every_suite_names_known_types(void) {
    glob_t g;
    CU_ASSERT_FATAL(glob("configs/*.json", 0, NULL, &g) == 0);
    glob("configs/paper/*.json", GLOB_APPEND, NULL, &g);
    int n = 0;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        char *text = util_read_file(g.gl_pathv[i], NULL);
        CU_ASSERT_FATAL(text != NULL);
        cJSON *j = cJSON_Parse(text), *b;
        CU_ASSERT(j != NULL);
        cJSON_ArrayForEach(b, cJSON_GetObjectItemCaseSensitive(j, "benchmarks")) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(b, "type");
            int known = cJSON_IsString(t) && kvb_benchmark_find(t->valuestring);
            CU_ASSERT(known);
            if (!known) fprintf(stderr, "\n  %s: unknown benchmark type\n", g.gl_pathv[i]);
            n++;
        }
        cJSON_Delete(j);
        free(text);
    }
    CU_ASSERT(n > 0);
    globfree(&g);
}

static void test_score_sample_goes_through_the_rows(void) {
    char *answers[] = {"blue whale"};
    kvb_sample s = {0};
    s.task = "niah";
    s.answers = answers;
    s.n_answers = 1;
    double score = -1;
    char metric[48];
    CU_ASSERT(kvb_score_sample("niah", &s, "It is the Blue Whale.", &score, metric, sizeof metric) == 0);
    CU_ASSERT(score == 1.0 && !strcmp(metric, "substring"));
    CU_ASSERT(kvb_score_sample("niah", &s, "a shark", &score, metric, sizeof metric) == 0 && score == 0.0);
    CU_ASSERT(kvb_score_sample("longmemeval", &s, "blue whale", &score, metric, sizeof metric) == -1 &&
              !strcmp(metric, "none")); /* judged, never scored here */
    CU_ASSERT(kvb_score_sample("nosuch", &s, "blue whale", &score, metric, sizeof metric) == -1);
    s.task = "no_such_ruler_task";
    CU_ASSERT(kvb_score_sample("ruler", &s, "blue whale", &score, metric, sizeof metric) == -1); /* no metric */
}

int main(void) {
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("bench_registry", NULL, NULL);
    CU_add_test(s, "every row is whole and scored one way", test_every_row_is_whole_and_scored_one_way);
    CU_add_test(s, "every suite in configs/ names known types", test_every_suite_names_known_types);
    CU_add_test(s, "kvb_score_sample goes through the rows", test_score_sample_goes_through_the_rows);
    return util_run_suites();
}
