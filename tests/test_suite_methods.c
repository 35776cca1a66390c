/* test_suite_methods.c — a suite's "methods": "all" (benchmarks/suitecheck.h, kvb_suite_parse): every registered
 * method in the registry's order with its default options; "all" inside the array stands for the registered methods
 * the array does not name otherwise (by name or alias), where it stands; "all" twice or another string is a one-line
 * error; "methods_except" leaves the methods it names out of "all"; the suites shipped to run every method (quick,
 * standard, ruler, sample-data) run every registered method they do not name in "methods_except", each once, and every
 * suite in configs/ passes kvb_suite_check and expands into cells; an unknown key (top level, benchmark entry, method
 * entry) is a one-line error naming it. */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util_common.h"
#include "benchmarks/cells.h"
#include "benchmarks/suitecheck.h"
#include "methods/method.h"

static char dir[64] = "/tmp/kvb_suite_methods_XXXXXX";
static char err[512];

/* The suite {"name": "t", "methods": <methods>, "budgets": ["30%"], "benchmarks": []} read by kvb_suite_parse. */
static cJSON *parse_with(const char *methods) {
    char path[128];
    snprintf(path, sizeof path, "%s/suite.json", dir);
    FILE *f = fopen(path, "w");
    CU_ASSERT_FATAL(f != NULL);
    fprintf(f, "{\"name\": \"t\", \"methods\": %s, \"budgets\": [\"30%%\"], \"benchmarks\": []}", methods);
    fclose(f);
    err[0] = 0;
    return kvb_suite_parse(path, err, sizeof err);
}

/* The i-th entry's name and options. */
static const char *name_at(const cJSON *suite, int i) {
    return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(suite, "methods"), i), "name"));
}
static const cJSON *opts_at(const cJSON *suite, int i) {
    return cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(suite, "methods"), i), "opts");
}

/* Methods "all" leaves out: those reading a trained per-model scorer (KVzap's scorer=), which a suite names itself */
static int n_scorer_methods(void) {
    int n = 0;
    for (int i = 0; i < kvb_method_count(); i++) n += kvb_method_at(i)->scorer != NULL;
    return n;
}

static void test_all_is_every_registered_method_in_registry_order(void) {
    cJSON *s = parse_with("\"all\"");
    CU_ASSERT_FATAL(s != NULL);
    const int n_all = kvb_method_count() - n_scorer_methods();
    CU_ASSERT(n_scorer_methods() >= 1); /* kvzap */
    CU_ASSERT_EQUAL(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(s, "methods")), n_all);
    for (int i = 0, k = 0; i < kvb_method_count(); i++) {
        if (kvb_method_at(i)->scorer) continue;
        CU_ASSERT(name_at(s, k) && !strcmp(name_at(s, k), kvb_method_at(i)->name));
        CU_ASSERT(opts_at(s, k) == NULL); /* default options */
        k++;
    }
    kvb_cells cs;
    kvb_cells_args a = {"suite.json", NULL, NULL, NULL, 0};
    CU_ASSERT_FATAL(kvb_cells_expand(s, &a, &cs, err, sizeof err) == 0);
    CU_ASSERT_EQUAL(cs.n, n_all); /* one budget: a cell per method, the baseline's at "full" */
    kvb_cells_free(&cs);
    cJSON_Delete(s);
}

static void test_all_in_the_array_is_the_methods_not_named_otherwise(void) {
    cJSON *s = parse_with("[{\"name\": \"flash\"}, \"all\", {\"name\": \"snapkv\", \"opts\": {\"window\": 8}}]");
    CU_ASSERT_FATAL(s != NULL);
    int n = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(s, "methods"));
    CU_ASSERT_EQUAL(n, kvb_method_count() - n_scorer_methods()); /* full by its alias and snapkv are not repeated */
    CU_ASSERT_STRING_EQUAL(name_at(s, 0), "flash");
    CU_ASSERT_STRING_EQUAL(name_at(s, n - 1), "snapkv");
    CU_ASSERT(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(opts_at(s, n - 1), "window")) == 8);
    for (int i = 0, k = 1; i < kvb_method_count(); i++) { /* between them, the rest in registry order */
        const char *m = kvb_method_at(i)->name;
        if (!strcmp(m, "full") || !strcmp(m, "snapkv") || kvb_method_at(i)->scorer) continue;
        CU_ASSERT(name_at(s, k) && !strcmp(name_at(s, k), m));
        k++;
    }
    cJSON_Delete(s);
    s = parse_with("[{\"name\": \"h2o\"}]"); /* no "all": as written */
    CU_ASSERT(s && cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(s, "methods")) == 1);
    cJSON_Delete(s);
}

static void test_all_twice_or_another_string_is_a_one_line_error(void) {
    CU_ASSERT(parse_with("[\"all\", \"all\"]") == NULL);
    CU_ASSERT(strstr(err, "\"all\" comes twice in \"methods\"") && !strchr(err, '\n'));
    CU_ASSERT(parse_with("[\"all\", \"snapkv\"]") == NULL);
    CU_ASSERT(strstr(err, "an entry of \"methods\" is {\"name\": ...} or \"all\", not \"snapkv\"") && !strchr(err, '\n'));
    cJSON *s = parse_with("\"some\""); /* not "all": the cells say what "methods" must be */
    kvb_cells cs;
    kvb_cells_args a = {"suite.json", NULL, NULL, NULL, 0};
    CU_ASSERT(s && kvb_cells_expand(s, &a, &cs, err, sizeof err) == -1 && strstr(err, "\"methods\""));
    kvb_cells_free(&cs);
    cJSON_Delete(s);
}

/* "methods_except" leaves registered methods (by name or alias) out of "all"; it must name registered methods and
 * narrow an "all". */
static void test_methods_except_leaves_methods_out_of_all(void) {
    char path[128];
    snprintf(path, sizeof path, "%s/except.json", dir);
    const char *const bad[][2] = {
        {"\"all\", \"methods_except\": [\"nosuch\"]", "names nosuch, not a registered method"},
        {"\"all\", \"methods_except\": \"snapkv\"", "must be an array of method names"},
        {"[{\"name\": \"h2o\"}], \"methods_except\": [\"snapkv\"]", "has no \"all\""},
    };
    for (int k = 0; k < 4; k++) {
        FILE *f = fopen(path, "w");
        CU_ASSERT_FATAL(f != NULL);
        fprintf(f, "{\"name\": \"t\", \"methods\": %s, \"budgets\": [\"30%%\"], \"benchmarks\": []}",
                k < 3 ? bad[k][0] : "\"all\", \"methods_except\": [\"flash\", \"snapkv\"]");
        fclose(f);
        cJSON *s = kvb_suite_parse(path, err, sizeof err);
        if (k < 3) {
            CU_ASSERT(s == NULL && strstr(err, bad[k][1]) && !strchr(err, '\n'));
            continue;
        }
        CU_ASSERT_FATAL(s != NULL);
        const cJSON *ms = cJSON_GetObjectItemCaseSensitive(s, "methods");
        CU_ASSERT_EQUAL(cJSON_GetArraySize(ms), kvb_method_count() - 2 - n_scorer_methods());
        for (int i = 0, at = 0; i < kvb_method_count(); i++) { /* the others, in registry order */
            const char *m = kvb_method_at(i)->name;
            if (!strcmp(m, "full") || !strcmp(m, "snapkv") || kvb_method_at(i)->scorer) continue;
            CU_ASSERT(name_at(s, at) && !strcmp(name_at(s, at), m));
            at++;
        }
        cJSON_Delete(s);
    }
}

/* A key no reader of its place reads (a misspelling: the run would use the default) is one line naming the suite, the
 * place (top level, benchmark i (type), method i (name)), the key and the keys accepted there; "all" expands into
 * entries that pass. */
static void test_an_unknown_key_is_refused_naming_it(void) {
    static const struct { const char *suite, *want; } cases[] = {
        {"{\"name\": \"t\", \"methdos\": [{\"name\": \"full\"}], \"benchmarks\": []}",
         ": unknown key \"methdos\" (accepted: name, description, model, output, seed, round_chunk, methods,"},
        {"{\"name\": \"t\", \"methods\": [{\"name\": \"full\"}], \"benchmarks\": [{\"type\": \"recall\"}, "
         "{\"type\": \"niah\", \"lenghts\": [100], \"depths\": [0]}]}",
         ": benchmark 2 (niah): unknown key \"lenghts\" (accepted: type, lengths, depths, haystack, judge, limit, optional, "
         "question, max_new_tokens, ignore_eos)"},
        {"{\"name\": \"t\", \"methods\": [\"all\", {\"name\": \"snapkv\", \"opt\": {\"window\": 4}}], \"benchmarks\": []}",
         ": method 2 (snapkv): unknown key \"opt\" (accepted: name, opts)"},
        {"{\"name\": \"t\", \"methods\": \"all\", \"benchmarks\": [{\"type\": \"longbench\", \"tasks\": [], \"e\": true, "
         "\"spread\": true, \"question\": \"hidden\", \"limit\": 2, \"optional\": true}]}",
         NULL},
    };
    char path[128];
    snprintf(path, sizeof path, "%s/keys.json", dir);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        FILE *f = fopen(path, "w");
        CU_ASSERT_FATAL(f != NULL);
        fputs(cases[i].suite, f);
        fclose(f);
        err[0] = 0;
        cJSON *s = kvb_suite_parse(path, err, sizeof err); /* a method entry's keys: before "all" is expanded */
        int rc = s ? kvb_suite_check(s, path, 0, err, sizeof err) : -1;
        CU_ASSERT(cases[i].want ? rc == -1 && strstr(err, cases[i].want) && !strchr(err, '\n') : rc == 0);
        if (cases[i].want ? !strstr(err, cases[i].want) : rc) fprintf(stderr, "\n  case %zu: %s\n", i, err);
        cJSON_Delete(s);
    }
}

/* A suite that says it runs every method does (a new method needs no edit of it), and every suite expands. */
static void test_shipped_suites_expand_and_every_method_suites_have_every_method(void) {
    static const char *const every[] = {"configs/quick.json", "configs/standard.json", "configs/ruler.json",
                                        "configs/sample-data.json"};
    glob_t g;
    CU_ASSERT_FATAL(glob("configs/*.json", 0, NULL, &g) == 0);
    glob("configs/paper/*.json", GLOB_APPEND, NULL, &g);
    glob("configs/models/*.json", GLOB_APPEND, NULL, &g);
    for (size_t i = 0; i < g.gl_pathc; i++) {
        cJSON *s = kvb_suite_parse(g.gl_pathv[i], err, sizeof err);
        kvb_cells cs = {0};
        kvb_cells_args a = {g.gl_pathv[i], NULL, NULL, NULL, 0};
        int ok = s && kvb_suite_check(s, g.gl_pathv[i], 0, err, sizeof err) == 0 && /* no unknown key */
                 kvb_cells_expand(s, &a, &cs, err, sizeof err) == 0;
        CU_ASSERT(ok);
        if (!ok) fprintf(stderr, "\n  %s: %s\n", g.gl_pathv[i], err);
        for (size_t k = 0; ok && k < sizeof every / sizeof *every; k++) {
            if (strcmp(g.gl_pathv[i], every[k])) continue;
            const cJSON *except = cJSON_GetObjectItemCaseSensitive(s, "methods_except"), *x;
            for (int m = 0; m < kvb_method_count(); m++) {
                int found = 0;
                for (int c = 0; c < cs.n; c++) found += kvb_method_find(cs.v[c].method) == kvb_method_at(m);
                cJSON_ArrayForEach(x, except) found += kvb_method_find(x->valuestring) == kvb_method_at(m); /* said */
                found += kvb_method_at(m)->scorer != NULL; /* kvzap: a per-model checkpoint, never in "all" */
                CU_ASSERT(found >= 1);
                if (!found) fprintf(stderr, "\n  %s does not run %s\n", g.gl_pathv[i], kvb_method_at(m)->name);
            }
        }
        kvb_cells_free(&cs);
        cJSON_Delete(s);
    }
    globfree(&g);
}

int main(void) {
    if (!mkdtemp(dir)) return 1;
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("suite_methods", NULL, NULL);
    CU_add_test(s, "\"all\" is every registered method in registry order", test_all_is_every_registered_method_in_registry_order);
    CU_add_test(s, "\"all\" in the array is the methods not named otherwise", test_all_in_the_array_is_the_methods_not_named_otherwise);
    CU_add_test(s, "\"all\" twice or another string is a one-line error", test_all_twice_or_another_string_is_a_one_line_error);
    CU_add_test(s, "\"methods_except\" leaves methods out of \"all\"", test_methods_except_leaves_methods_out_of_all);
    CU_add_test(s, "an unknown key is refused, naming it", test_an_unknown_key_is_refused_naming_it);
    CU_add_test(s, "shipped suites expand; every-method suites have every method",
                test_shipped_suites_expand_and_every_method_suites_have_every_method);
    int rc = util_run_suites();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) rc = 1;
    return rc;
}
