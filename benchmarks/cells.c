/* cells.c — a suite's method x budget cells (cells.h). */
#include "benchmarks/cells.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

static int in_list(const char *list, const char *name) {
    if (!list) return 1;
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *c = strchr(p, ',');
        size_t l = c ? (size_t)(c - p) : strlen(p);
        if (l == n && !strncmp(p, name, n)) return 1;
        p += l + (c ? 1 : 0);
    }
    return 0;
}

static int add_cell(kvb_cells *cs, const char *suite_path, const char *method, const char *budget, const cJSON *opts,
                    const kvb_method_needs *nd, char *err, size_t err_len) {
    if (cs->n == KVB_MAX_CELLS) return ERR("suite: more than %d method x budget cells", KVB_MAX_CELLS);
    kvb_run_cell *c = &cs->v[cs->n];
    memset(c, 0, sizeof *c);
    snprintf(c->method, sizeof c->method, "%s", method);
    if (kvb_budget_parse(budget, &c->budget, err, err_len)) return -1;
    kvb_budget_format(&c->budget, c->budget_str, sizeof c->budget_str);
    snprintf(c->budget_given, sizeof c->budget_given, "%s", budget);
    /* a record is known by its method and budget as written ("30%", "30.0%" and "3e1%" are all 30%): one cell each */
    for (int k = 0; k < cs->n; k++) {
        const kvb_run_cell *o = &cs->v[k];
        if (strcmp(o->method, c->method) || strcmp(o->budget_str, c->budget_str)) continue;
        if (strcmp(o->budget_given, c->budget_given))
            return ERR("suite %s: budgets \"%s\" and \"%s\" are one budget (%s): method %s would run it twice", suite_path,
                       o->budget_given, c->budget_given, c->budget_str, method);
        return ERR("suite %s: method %s at budget %s comes twice (is the method listed twice?): a record is known by its "
                   "method and budget", suite_path, method, c->budget_str);
    }
    c->opts = opts;
    c->needs = *nd;
    cs->n++;
    return 0;
}

/* The suite's options of one method with the command line's for it merged in (a command-line key replaces the
 * suite's) into *out: the suite's object itself (or NULL) when the command line adds none. */
static int merged_opts(kvb_cells *cs, const char *name, const cJSON *suite_opts, const kvb_cells_args *a,
                       const cJSON **out, char *err, size_t err_len) {
    kvb_opts cli;
    *out = suite_opts;
    if (kvb_opts_for_method(name, a->opts, a->n_opts, &cli, err, err_len)) return -1;
    if (cli.n == 0) return 0;
    cJSON *m = suite_opts ? cJSON_Duplicate(suite_opts, 1) : cJSON_CreateObject();
    for (int i = 0; m && i < cli.n; i++) {
        cJSON_DeleteItemFromObjectCaseSensitive(m, cli.v[i].key);
        /* a number stays a number, as a suite writes it: window=8 on the command line is the suite's "window": 8 */
        char *end;
        double num = strtod(cli.v[i].val, &end);
        cJSON *v = *cli.v[i].val && !*end && isfinite(num) ? cJSON_CreateNumber(num) : cJSON_CreateString(cli.v[i].val);
        if (!v || !cJSON_AddItemToObject(m, cli.v[i].key, v)) cJSON_Delete(v), cJSON_Delete(m), m = NULL;
    }
    if (!m || !cJSON_AddItemToArray(cs->owned, m)) return cJSON_Delete(m), ERR("out of memory");
    *out = m;
    return 0;
}

/* A suite's "compression_ratios" (kvpress's: [0.25, 0.5] removes that share of the prompt's KV) as the budgets
 * they mean, "75%,50%", into buf. */
static int ratio_budgets(const cJSON *ratios, const char *path, char *buf, size_t cap, char *err, size_t err_len) {
    const cJSON *r;
    size_t at = 0;
    if (!cJSON_IsArray(ratios) || !cJSON_GetArraySize(ratios))
        return ERR("suite %s: \"compression_ratios\" must be a non-empty array of numbers like 0.5", path);
    cJSON_ArrayForEach(r, ratios) {
        char num[32], pct[32];
        if (!cJSON_IsNumber(r)) return ERR("suite %s: compression_ratios must be numbers like 0.5", path);
        snprintf(num, sizeof num, "%.17g", r->valuedouble);
        if (kvb_budget_ratio_str(num, pct, sizeof pct, err, err_len)) return -1;
        at += (size_t)snprintf(buf + at, at < cap ? cap - at : 0, "%s%s", at ? "," : "", pct);
    }
    return at < cap ? 0 : ERR("suite %s: too many compression_ratios", path);
}

/* The budgets as given: --budgets's comma list, else the suite's "budgets" strings or "compression_ratios"; *n = 0
 * when none. The strings point into list_copy (caller frees) or the suite. */
static int budget_list(const cJSON *suite, const kvb_cells_args *a, const char ***out, int *n, char **list_copy, char *err,
                       size_t err_len) {
    const cJSON *budgets = cJSON_GetObjectItemCaseSensitive(suite, "budgets"), *b;
    const cJSON *ratios = cJSON_GetObjectItemCaseSensitive(suite, "compression_ratios");
    *out = NULL, *n = 0, *list_copy = NULL;
    int cap = 0;
    char from_ratios[1024];
    if (ratios && budgets) return ERR("suite %s: give \"budgets\" or \"compression_ratios\", not both", a->suite_path);
    const char *given = a->budgets;
    if (!given && ratios) {
        if (ratio_budgets(ratios, a->suite_path, from_ratios, sizeof from_ratios, err, err_len)) return -1;
        given = from_ratios;
    }
    if (given) {
        if (!(*list_copy = strdup(given))) return ERR("out of memory");
        for (const char *p = given; *p; p++) cap += *p == ',';
        if (!(*out = malloc((size_t)(cap + 1) * sizeof **out))) return ERR("out of memory");
        for (char *save, *t = strtok_r(*list_copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) (*out)[(*n)++] = t;
        return 0;
    }
    if (budgets && !cJSON_IsArray(budgets)) return ERR("suite %s: \"budgets\" must be an array of strings like \"30%%\"", a->suite_path);
    if (!(*out = malloc((size_t)(cJSON_GetArraySize(budgets) + 1) * sizeof **out))) return ERR("out of memory");
    cJSON_ArrayForEach(b, budgets) {
        if (!cJSON_IsString(b)) return ERR("suite %s: budgets must be strings like \"30%%\"", a->suite_path);
        (*out)[(*n)++] = b->valuestring;
    }
    return 0;
}

static int expand(const cJSON *methods, const kvb_cells_args *a, const char **blist, int n_budgets, kvb_cells *cs,
                  char *err, size_t err_len);

int kvb_cells_expand(const cJSON *suite, const kvb_cells_args *a, kvb_cells *cs, char *err, size_t err_len) {
    memset(cs, 0, sizeof *cs);
    const cJSON *methods = cJSON_GetObjectItemCaseSensitive(suite, "methods");
    if (!cJSON_IsArray(methods) || cJSON_GetArraySize(methods) == 0)
        return ERR("suite %s: \"methods\" must be a non-empty array", a->suite_path);
    const char **blist = NULL;
    char *list_copy = NULL;
    int n_budgets = 0, rc = budget_list(suite, a, &blist, &n_budgets, &list_copy, err, err_len);
    if (!rc) rc = expand(methods, a, blist, n_budgets, cs, err, err_len);
    free(blist), free(list_copy);
    return rc;
}

/* The cells of every method of the suite (narrowed by a->methods) at every budget. */
static int expand(const cJSON *methods, const kvb_cells_args *a, const char **blist, int n_budgets, kvb_cells *cs,
                  char *err, size_t err_len) {
    if (!(cs->owned = cJSON_CreateArray())) return ERR("out of memory");
    const cJSON *m;
    cJSON_ArrayForEach(m, methods) {
        const cJSON *jn = cJSON_GetObjectItemCaseSensitive(m, "name");
        const char *name = cJSON_IsString(jn) ? jn->valuestring : NULL;
        if (!name) return ERR("suite %s: every method needs a \"name\"", a->suite_path);
        if (!kvb_method_find(name)) return ERR("suite %s: unknown method '%s'", a->suite_path, name);
        if (!in_list(a->methods, name)) continue;
        const cJSON *opts;
        if (merged_opts(cs, name, cJSON_GetObjectItemCaseSensitive(m, "opts"), a, &opts, err, err_len)) return -1;
        kvb_opts o = {0};
        kvb_method_needs nd;
        if (kvb_opts_add_json(&o, opts, name, err, err_len) || kvb_method_needs_of(name, &o, &nd, err, err_len)) return -1;
        if (!nd.takes_budget) { /* the baseline: one cell */
            if (add_cell(cs, a->suite_path, name, "full", opts, &nd, err, err_len)) return -1;
            continue;
        }
        if (!n_budgets) return ERR("suite %s: method %s needs \"budgets\"", a->suite_path, name);
        for (int i = 0; i < n_budgets; i++)
            if (add_cell(cs, a->suite_path, name, blist[i], opts, &nd, err, err_len)) return -1;
    }
    if (!cs->n) return ERR("no method of the suite is left after --methods %s", a->methods ? a->methods : "");
    return 0;
}

void kvb_cells_free(kvb_cells *c) {
    cJSON_Delete(c->owned);
    c->owned = NULL;
}
