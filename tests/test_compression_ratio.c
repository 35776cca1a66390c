/* test_compression_ratio.c — kvpress's compression ratio beside kvbench's budget: a ratio R (the share of the
 * prompt's KV removed) is the budget (1 - R) x 100%, the same budget as that --budget down to the records'
 * "budget" string; ratios outside [0, 1) and non-numbers are refused; a suite's "compression_ratios" expand into
 * the same cells as the "budgets" they mean, and a suite giving both is refused. */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <string.h>

#include "util_common.h"
#include "benchmarks/cells.h"
#include "methods/budget.h"

static void same_budget(const char *ratio, const char *pct) {
    char got[32], err[256];
    kvb_budget a, b;
    CU_ASSERT_FATAL(kvb_budget_ratio_str(ratio, got, sizeof got, err, sizeof err) == 0);
    CU_ASSERT_STRING_EQUAL(got, pct);
    CU_ASSERT_FATAL(kvb_budget_parse(got, &a, err, sizeof err) == 0 && kvb_budget_parse(pct, &b, err, sizeof err) == 0);
    CU_ASSERT(a.kind == b.kind && a.frac == b.frac);
    char fa[32], fb[32];
    kvb_budget_format(&a, fa, sizeof fa), kvb_budget_format(&b, fb, sizeof fb);
    CU_ASSERT_STRING_EQUAL(fa, fb);
}

static void test_ratio_is_one_minus_budget(void) {
    same_budget("0.25", "75%");
    same_budget("0.5", "50%");
    same_budget("0.75", "25%");
    same_budget("0.875", "12.5%");
    same_budget("0.7", "30%"); /* 1 - 0.7 = 0.30000000000000004: the same "30%" */
    same_budget("0.9", "10%");
    same_budget("0", "full");
}

static void test_bad_ratios_refused(void) {
    const char *bad[] = {"1", "1.5", "-0.1", "abc", "0.5x", "", "25%", "nan"};
    char got[32], err[256];
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err[0] = 0;
        CU_ASSERT(kvb_budget_ratio_str(bad[i], got, sizeof got, err, sizeof err) == -1);
        CU_ASSERT(strstr(err, "compression ratio") != NULL);
    }
}

static int expand(const char *json, kvb_cells *cs, char *err, size_t err_len) {
    cJSON *suite = cJSON_Parse(json);
    CU_ASSERT_FATAL(suite != NULL);
    kvb_cells_args a = {"suite.json", NULL, NULL, NULL, 0};
    int rc = kvb_cells_expand(suite, &a, cs, err, err_len);
    if (rc) kvb_cells_free(cs);
    cJSON_Delete(suite);
    return rc;
}

static void test_suite_ratios_are_its_budgets(void) {
    char err[256];
    kvb_cells r, b;
    CU_ASSERT_FATAL(expand("{\"methods\": [{\"name\": \"snapkv\"}, {\"name\": \"full\"}], \"compression_ratios\": [0.25, 0.5, 0.875]}",
                           &r, err, sizeof err) == 0);
    CU_ASSERT_FATAL(expand("{\"methods\": [{\"name\": \"snapkv\"}, {\"name\": \"full\"}], \"budgets\": [\"75%\", \"50%\", \"12.5%\"]}",
                           &b, err, sizeof err) == 0);
    CU_ASSERT_EQUAL_FATAL(r.n, b.n);
    CU_ASSERT(r.n >= 3);
    for (int i = 0; i < r.n; i++) {
        CU_ASSERT_STRING_EQUAL(r.v[i].method, b.v[i].method);
        CU_ASSERT_STRING_EQUAL(r.v[i].budget_str, b.v[i].budget_str);
    }
    kvb_cells_free(&r), kvb_cells_free(&b);
}

static void test_suite_ratio_errors(void) {
    char err[256];
    kvb_cells cs;
    CU_ASSERT(expand("{\"methods\": [{\"name\": \"snapkv\"}], \"budgets\": [\"50%\"], \"compression_ratios\": [0.5]}", &cs,
                     err, sizeof err) == -1 && strstr(err, "not both"));
    CU_ASSERT(expand("{\"methods\": [{\"name\": \"snapkv\"}], \"compression_ratios\": [\"0.5\"]}", &cs, err, sizeof err) == -1 &&
              strstr(err, "numbers"));
    CU_ASSERT(expand("{\"methods\": [{\"name\": \"snapkv\"}], \"compression_ratios\": [1.0]}", &cs, err, sizeof err) == -1 &&
              strstr(err, "[0, 1)"));
    CU_ASSERT(expand("{\"methods\": [{\"name\": \"snapkv\"}], \"compression_ratios\": []}", &cs, err, sizeof err) == -1);
}

int main(void) {
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("compression_ratio", NULL, NULL);
    CU_add_test(s, "ratio R is the budget (1 - R) x 100%, the same record string", test_ratio_is_one_minus_budget);
    CU_add_test(s, "ratios outside [0, 1) and non-numbers are refused", test_bad_ratios_refused);
    CU_add_test(s, "a suite's compression_ratios expand as the budgets they mean", test_suite_ratios_are_its_budgets);
    CU_add_test(s, "a suite with budgets and ratios, or malformed ratios, is refused", test_suite_ratio_errors);
    return util_run_suites();
}
