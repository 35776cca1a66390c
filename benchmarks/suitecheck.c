/* suitecheck.c — the strict reading of a suite (suitecheck.h). */
#include "benchmarks/suitecheck.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fsutil.h"
#include "benchmarks/jsonl.h"
#include "benchmarks/registry.h"
#include "methods/method.h"

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

static int blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return 0;
    return 1;
}

static long line_at(const char *buf, const char *at) {
    long line = 1;
    for (const char *p = buf; p < at; p++) line += *p == '\n';
    return line;
}

static int cmp_key(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* The first key an object of v repeats (recursively), or NULL; *oom on allocation failure. */
static const char *repeated_key(const cJSON *v, int *oom) {
    int n = 0;
    for (const cJSON *c = v->child; c; c = c->next) n++;
    if (cJSON_IsObject(v) && n > 1) {
        const char **keys = malloc((size_t)n * sizeof *keys);
        if (!keys) return *oom = 1, NULL;
        int k = 0;
        for (const cJSON *c = v->child; c; c = c->next) keys[k++] = c->string ? c->string : "";
        qsort(keys, (size_t)n, sizeof *keys, cmp_key);
        const char *dup = NULL;
        for (int i = 1; i < n && !dup; i++)
            if (!strcmp(keys[i], keys[i - 1])) dup = keys[i];
        free(keys);
        if (dup) return dup;
    }
    for (const cJSON *c = v->child; c; c = c->next) {
        const char *d = cJSON_IsObject(c) || cJSON_IsArray(c) ? repeated_key(c, oom) : NULL;
        if (d || *oom) return d;
    }
    return NULL;
}

/* The keys a suite object may hold (NULL-terminated): the top level's, read by runner.c (name, model, output, seed,
 * round_chunk, benchmarks, judge, serve), cells.c (methods, budgets, compression_ratios), this file (methods_except),
 * serve_suite.c (serve), runcal.c (calibration), and "description" (read by nothing: the configs' comment); a
 * method entry's, read by cells.c. */
static const char *const TOP_KEYS[] = {"name", "description", "model", "output", "seed", "round_chunk", "methods",
                                       "methods_except", "budgets", "compression_ratios", "benchmarks", "judge", "serve",
                                       "calibration", NULL};
static const char *const METHOD_KEYS[] = {"name", "opts", NULL};

static int in_keys(const char *k, const char *const *keys) {
    for (; keys && *keys; keys++)
        if (!strcmp(k, *keys)) return 1;
    return 0;
}

/* Every key of o one of keys (NULL-terminated), else one line naming the suite, the place (where: "" or "benchmark 2
 * (niah): "), the key and the keys accepted there. */
static int check_keys(const cJSON *o, const char *const *keys, const char *path, const char *where, char *err,
                      size_t err_len) {
    char prefix[1200];
    snprintf(prefix, sizeof prefix, "suite %s: %s", path, where);
    return kvb_json_check_keys(o, keys, prefix, err, err_len);
}

/* Each object entry of an array "methods" holds only METHOD_KEYS; i counts the entries as written (kvb_suite_parse
 * checks before "all" is expanded). */
static int check_method_keys(const cJSON *suite, const char *path, char *err, size_t err_len) {
    const cJSON *methods = cJSON_GetObjectItemCaseSensitive(suite, "methods"), *m;
    if (!cJSON_IsArray(methods)) methods = NULL; /* the cells name what else is wrong */
    int i = 0;
    cJSON_ArrayForEach(m, methods) { /* {"name": ..., "opts": {...}} (cells.c) */
        i++;
        if (!cJSON_IsObject(m)) continue;
        const char *name = kvb_json_str(m, "name", NULL);
        char where[96];
        snprintf(where, sizeof where, "method %d%s%.40s%s: ", i, name ? " (" : "", name ? name : "", name ? ")" : "");
        if (check_keys(m, METHOD_KEYS, path, where, err, err_len)) return -1;
    }
    return 0;
}

/* "methods": "all", or "all" as one entry of the array: every registered method (methods/registry.c's order) the
 * array does not name otherwise (by name or alias) and "methods_except" does not list, but those reading a trained
 * per-model scorer (KVzap's scorer=, which only the suite's own entry can name), with its default options,
 * written in place as {"name": ...} entries where "all" stood. 0, or -1 + one line ("all" twice, another string, a
 * "methods_except" that is not a list of registered methods or stands without "all"). */
static int expand_all_methods(cJSON *suite, const char *path, char *err, size_t err_len) {
    cJSON *methods = cJSON_GetObjectItemCaseSensitive(suite, "methods"), *m;
    const cJSON *except = cJSON_GetObjectItemCaseSensitive(suite, "methods_except");
    int is_all = cJSON_IsString(methods) && !strcmp(methods->valuestring, "all"), n_all = is_all;
    if (except) {
        if (!cJSON_IsArray(except)) return ERR("suite %s: \"methods_except\" must be an array of method names", path);
        cJSON_ArrayForEach(m, except)
            if (!cJSON_IsString(m) || !kvb_method_find(m->valuestring))
                return ERR("suite %s: \"methods_except\" names %s, not a registered method", path,
                           cJSON_IsString(m) ? m->valuestring : "a non-string");
    }
    if (!is_all && !cJSON_IsArray(methods)) return 0; /* the cells name what is wrong (benchmarks/cells.h) */
    cJSON *list = is_all ? NULL : methods; /* the entries besides "all" */
    cJSON_ArrayForEach(m, list) {
        if (!cJSON_IsString(m)) continue;
        if (strcmp(m->valuestring, "all"))
            return ERR("suite %s: an entry of \"methods\" is {\"name\": ...} or \"all\", not \"%.40s\"", path, m->valuestring);
        n_all++;
    }
    if (n_all > 1) return ERR("suite %s: \"all\" comes twice in \"methods\"", path);
    if (!n_all && except) return ERR("suite %s: \"methods_except\" narrows \"all\", and \"methods\" has no \"all\"", path);
    if (!n_all) return 0;
    cJSON *out = cJSON_CreateArray();
    int oom = !out;
    for (const cJSON *e = list ? list->child : NULL;; e = e->next) {
        if (e && !cJSON_IsString(e)) { /* an entry of its own */
            cJSON *d = cJSON_Duplicate(e, 1);
            if (!d || !cJSON_AddItemToArray(out, d)) cJSON_Delete(d), oom = 1;
        } else
            for (int i = 0; !oom && i < kvb_method_count(); i++) { /* "all" */
                const kvb_method_def *def = kvb_method_at(i);
                int named = 0;
                cJSON_ArrayForEach(m, list) {
                    const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "name"));
                    named |= name && kvb_method_find(name) == def;
                }
                cJSON_ArrayForEach(m, except) named |= kvb_method_find(m->valuestring) == def; /* left out */
                named |= def->scorer != NULL; /* KVzap reads a per-model checkpoint: named with its scorer= or not run */
                cJSON *row = named ? NULL : cJSON_CreateObject();
                if (!named && (!row || !cJSON_AddStringToObject(row, "name", def->name) || !cJSON_AddItemToArray(out, row)))
                    cJSON_Delete(row), oom = 1;
            }
        if (oom || !e || !e->next) break;
    }
    if (oom || !cJSON_ReplaceItemInObjectCaseSensitive(suite, "methods", out)) return cJSON_Delete(out), ERR("out of memory");
    return 0;
}

cJSON *kvb_suite_parse(const char *path, char *err, size_t err_len) {
    char e2[512];
    size_t len = 0;
    char *buf = kvb_read_file(path, &len, e2, sizeof e2);
    if (!buf) return ERR("cannot read suite %s", e2), NULL;
    const char *end = NULL;
    cJSON *suite = cJSON_ParseWithLengthOpts(buf, len, &end, 0);
    if (!suite || !cJSON_IsObject(suite)) {
        ERR("suite %s:%ld: not valid JSON%s", path, line_at(buf, end && end >= buf && end <= buf + len ? end : buf),
            suite ? " (a suite is one object)" : "");
    } else if (!blank(end, (size_t)(buf + len - end))) {
        const char *at = end;
        while (at < buf + len && blank(at, 1)) at++;
        ERR("suite %s:%ld: text after the suite's JSON object (%s)", path, line_at(buf, at), *at ? "a suite is one object" : "a NUL byte");
    } else {
        int oom = 0;
        const char *dup = repeated_key(suite, &oom);
        if (oom) ERR("out of memory");
        else if (dup) ERR("suite %s: key \"%.60s\" appears twice in one object (which one counts is not defined)", path, dup);
        else if (!check_method_keys(suite, path, err, err_len) && !expand_all_methods(suite, path, err, err_len)) {
            free(buf);
            return suite;
        }
    }
    cJSON_Delete(suite);
    free(buf);
    return NULL;
}

/* An integer in [lo, hi] when present. */
static int check_int(const cJSON *o, const char *key, double lo, double hi, const char *path, const char *where,
                     char *err, size_t err_len) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi)
        return ERR("suite %s: %s\"%s\" must be an integer in [%.0f, %.0f]", path, where, key, lo, hi);
    return 0;
}

static int check_type(const cJSON *o, const char *key, int (*is)(const cJSON *), const char *what, const char *path,
                      const char *where, char *err, size_t err_len) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (v && !is(v)) return ERR("suite %s: %s\"%s\" must be %s", path, where, key, what);
    return 0;
}

static int is_string(const cJSON *v) { return cJSON_IsString(v); }
static int is_bool(const cJSON *v) { return cJSON_IsBool(v); }

static int check_benchmark(const cJSON *b, int i, const char *path, int n_ctx, char *err, size_t err_len) {
    static const char *const counts[] = {"samples", "dialogues", "min_pairs", "max_pairs", "rounds"};
    static const char *const switches[] = {"optional", "cot", "e", "spread", "per_query", "ignore_eos"};
    char where[48];
    snprintf(where, sizeof where, "benchmark %d: ", i + 1);
    if (!cJSON_IsObject(b)) return ERR("suite %s: benchmark %d must be an object", path, i + 1);
    if (check_type(b, "type", is_string, "a string", path, where, err, err_len)) return -1;
    /* an unknown key (a misspelled "lenghts") would leave the loader's default in place: refused. An unknown or
     * missing type is the runner's error (it names the types). */
    const kvb_benchmark *row = kvb_benchmark_find(kvb_json_str(b, "type", NULL));
    if (row) { /* accepted, in this order: "type", the row's keys, the other common keys */
        const char *acc[64];
        size_t n = 0;
        const char *const *common = kvb_benchmark_common_keys();
        acc[n++] = "type";
        for (const char *const *k = row->keys; k && *k && n < 40; k++) acc[n++] = *k;
        for (const char *const *k = common; *k && n < 63; k++)
            if (strcmp(*k, "type") && !in_keys(*k, row->keys)) acc[n++] = *k;
        acc[n] = NULL;
        char w2[96];
        snprintf(w2, sizeof w2, "benchmark %d (%s): ", i + 1, row->type);
        if (check_keys(b, acc, path, w2, err, err_len)) return -1;
    }
    for (size_t k = 0; k < sizeof counts / sizeof *counts; k++)
        if (check_int(b, counts[k], 1, 1e6, path, where, err, err_len)) return -1;
    if (check_int(b, "limit", 0, 1e9, path, where, err, err_len)) return -1;
    for (size_t k = 0; k < sizeof switches / sizeof *switches; k++)
        if (check_type(b, switches[k], is_bool, "true or false", path, where, err, err_len)) return -1;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(b, "type");
    if (cJSON_IsString(type) && !strcmp(type->valuestring, "niah") &&
        check_type(b, "judge", is_bool, "true or false", path, where, err, err_len))
        return -1;
    const cJSON *mn = cJSON_GetObjectItemCaseSensitive(b, "max_new_tokens");
    double hi = n_ctx / 2;
    if (n_ctx > 0 && mn && (!cJSON_IsNumber(mn) || mn->valuedouble != floor(mn->valuedouble) || mn->valuedouble < 1 || mn->valuedouble > hi))
        return ERR("suite %s: %s\"max_new_tokens\" must be an integer in [1, %.0f] (tokens; at most half the model's context "
                   "of %d, the prompt keeps the rest)", path, where, hi, n_ctx);
    return 0;
}

int kvb_suite_check(const cJSON *suite, const char *path, int n_ctx, char *err, size_t err_len) {
    static const char *const strings[] = {"name", "model", "output"};
    if (check_keys(suite, TOP_KEYS, path, "", err, err_len)) return -1;
    for (size_t k = 0; k < sizeof strings / sizeof *strings; k++)
        if (check_type(suite, strings[k], is_string, "a string", path, "", err, err_len)) return -1;
    if (check_int(suite, "seed", 0, 9007199254740992.0, path, "", err, err_len)) return -1;
    if (check_int(suite, "round_chunk", 1, 1 << 20, path, "", err, err_len)) return -1;
    const cJSON *benches = cJSON_GetObjectItemCaseSensitive(suite, "benchmarks"), *b;
    if (benches && !cJSON_IsArray(benches)) return ERR("suite %s: \"benchmarks\" must be an array", path);
    int i = 0;
    cJSON_ArrayForEach(b, benches) if (check_benchmark(b, i++, path, n_ctx, err, err_len)) return -1;
    if (check_method_keys(suite, path, err, err_len)) return -1;
    return 0;
}

kvb_ctx *kvb_method_check_ctx(kvb_model *m, const kvb_ctx_params *p, char *err, size_t err_len) {
    kvb_ctx_params small = *p;
    small.n_ctx = 256, small.kv_reserve = 0, small.profile = small.trace = 0;
    return kvb_ctx_create(m, &small, err, err_len);
}

int kvb_method_check(kvb_ctx *c, const char *name, kvb_opts *o, char *err, size_t err_len) {
    /* at the whole budget: the options are checked here; whether a budget is feasible for a method on a sample
     * (OmniKV below its full layers' share) stays a per-cell error record */
    kvb_budget whole = {.kind = KVB_BUDGET_FRACTION, .frac = 1.0};
    kvb_method *meth = kvb_method_create(name, c, &whole, o, err, err_len);
    kvb_method_free(meth, c);
    return meth ? 0 : -1;
}

int kvb_suite_check_methods(const kvb_cells *cs, const char *path, kvb_model *m, const kvb_ctx_params *p, int with_profile,
                            char *err, size_t err_len) {
    kvb_ctx *c = NULL;
    int rc = 0;
    for (int k = 0; !rc && k < cs->n; k++) {
        const kvb_run_cell *cl = &cs->v[k];
        if (!!cl->needs.profile != !!with_profile) continue;
        char e2[512];
        if (!c && !(c = kvb_method_check_ctx(m, p, e2, sizeof e2))) {
            rc = ERR("suite %s: checking the methods' options: %s", path, e2);
            break;
        }
        kvb_opts o = {0};
        if (kvb_opts_add_json(&o, cl->opts, cl->method, e2, sizeof e2) || kvb_method_check(c, cl->method, &o, e2, sizeof e2))
            rc = ERR("suite %s: method %s: %s", path, cl->method, e2);
    }
    kvb_ctx_free(c);
    return rc;
}
