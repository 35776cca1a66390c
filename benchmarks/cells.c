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

static int add_cell(kvb_cells *cs, const char *method, const char *budget, const cJSON *opts, const kvb_method_needs *nd,
                    char *err, size_t err_len) {
    if (cs->n == KVB_MAX_CELLS) return ERR("suite: more than %d method x budget cells", KVB_MAX_CELLS);
    kvb_run_cell *c = &cs->v[cs->n];
    memset(c, 0, sizeof *c);
    snprintf(c->method, sizeof c->method, "%s", method);
    if (kvb_budget_parse(budget, &c->budget, err, err_len)) return -1;
    kvb_budget_format(&c->budget, c->budget_str, sizeof c->budget_str);
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

static int budget_list(const cJSON *suite, const kvb_cells_args *a, char *out, size_t cap, char *err, size_t err_len) {
    const cJSON *budgets = cJSON_GetObjectItemCaseSensitive(suite, "budgets");
    out[0] = 0;
    if (a->budgets) snprintf(out, cap, "%s", a->budgets);
    else if (cJSON_IsArray(budgets)) {
        const cJSON *b;
        cJSON_ArrayForEach(b, budgets) {
            if (!cJSON_IsString(b)) return ERR("suite %s: budgets must be strings like \"30%%\"", a->suite_path);
            size_t l = strlen(out);
            snprintf(out + l, cap - l, "%s%s", l ? "," : "", b->valuestring);
        }
    }
    return 0;
}

int kvb_cells_expand(const cJSON *suite, const kvb_cells_args *a, kvb_cells *cs, char *err, size_t err_len) {
    memset(cs, 0, sizeof *cs);
    const cJSON *methods = cJSON_GetObjectItemCaseSensitive(suite, "methods");
    if (!cJSON_IsArray(methods) || cJSON_GetArraySize(methods) == 0)
        return ERR("suite %s: \"methods\" must be a non-empty array", a->suite_path);
    char blist[256];
    if (budget_list(suite, a, blist, sizeof blist, err, err_len)) return -1;
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
            if (add_cell(cs, name, "full", opts, &nd, err, err_len)) return -1;
            continue;
        }
        if (!blist[0]) return ERR("suite %s: method %s needs \"budgets\"", a->suite_path, name);
        char tmp[256];
        snprintf(tmp, sizeof tmp, "%s", blist);
        for (char *save, *t = strtok_r(tmp, ",", &save); t; t = strtok_r(NULL, ",", &save))
            if (add_cell(cs, name, t, opts, &nd, err, err_len)) return -1;
    }
    if (!cs->n) return ERR("no method of the suite is left after --methods %s", a->methods ? a->methods : "");
    return 0;
}

void kvb_cells_free(kvb_cells *c) {
    cJSON_Delete(c->owned);
    c->owned = NULL;
}
