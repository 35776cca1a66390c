/* merge.c — join run directories (merge.h). Records are matched by their cell key; two records of one cell
 * are the same result when they agree on every field but the timings (a re-queued shard re-runs a cell
 * with the same prediction and KV bytes but other milliseconds). The output follows the plan's order, which
 * is the order an unsharded run appends in, so its results.jsonl and report line up with one. */
#include "reports/merge.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/fsutil.h"
#include "methods/method.h"
#include "reports/report.h"
#include "reports/results.h"
#include "reports/serve_rows.h"

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)
#define SEP "\x1f"

/* Fields that measure time (KVB_RF_TIMING in reports/record.h): they differ between two runs of the same cell
 * and are not compared. */
static int is_timing(const char *key) {
    const kvb_record_field *f = kvb_record_field_find(key);
    return f && (f->flags & KVB_RF_TIMING);
}

typedef struct {
    char *key;
    cJSON *rec;
    int dir;
    long line;
    size_t pos; /* output order */
} mrec;

typedef struct {
    char *key;
    size_t pos;
} pkey;

typedef struct {
    cJSON *run;
    char shard[32];
    size_t n_rec;
    int n_torn; /* a torn last line (a crash mid-append), not merged */
} minput;

typedef struct {
    minput *in;
    mrec *rec;
    size_t n_rec, cap_rec;
    pkey *plan;  /* union of the inputs' plans, in order */
    cJSON *plan_rows;
    size_t n_plan, cap_plan;
    int have_plan;
} mstate;

static const char *jstr(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static char *make_key(const char *m, const char *b, const char *bench, const char *task, const char *id) {
    size_t n = strlen(m) + strlen(b) + strlen(bench) + strlen(task) + strlen(id) + 5;
    char *k = malloc(n);
    if (k) snprintf(k, n, "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s", m, b, bench, task, id);
    return k;
}

/* "method@budget benchmark/task #id" from a key. */
static void cell_name(const char *key, char *out, size_t cap) {
    char f[5][200] = {{0}};
    const char *p = key;
    for (int i = 0; i < 5 && p; i++) {
        const char *e = strchr(p, SEP[0]);
        size_t l = e ? (size_t)(e - p) : strlen(p);
        snprintf(f[i], sizeof f[i], "%.*s", (int)(l < 199 ? l : 199), p);
        p = e ? e + 1 : NULL;
    }
    snprintf(out, cap, "%s@%s %s/%s #%s", f[0], f[1], f[2], f[3], f[4]);
}

static int cmp_rec(const void *a, const void *b) {
    const mrec *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    if (c) return c;
    if (x->dir != y->dir) return x->dir - y->dir;
    return x->line < y->line ? -1 : x->line > y->line;
}

/* plan order; records outside the plan (all at pos n_plan) by input and line */
static int cmp_pos(const void *a, const void *b) {
    const mrec *x = a, *y = b;
    if (x->pos != y->pos) return x->pos < y->pos ? -1 : 1;
    if (x->dir != y->dir) return x->dir - y->dir;
    return x->line < y->line ? -1 : x->line > y->line;
}

static int cmp_rec_key(const void *a, const void *b) { return strcmp(((const mrec *)a)->key, ((const mrec *)b)->key); }

static int cmp_pkey(const void *a, const void *b) { return strcmp(((const pkey *)a)->key, ((const pkey *)b)->key); }

/* DIR/results.jsonl through the reader every command shares (results.h): the same records report and run accept. */
static int load_results(mstate *st, int d, const char *dir, char *err, size_t err_len) {
    char *path = kvb_path_join(dir, "results.jsonl");
    kvb_results_reader rd;
    if (!path) return ERR("out of memory");
    int rc = kvb_results_open(&rd, path, err, err_len);
    rd.lean = 1; /* the line itself (j) is what is merged */
    kvb_record r;
    cJSON *j = NULL;
    while (!rc && (rc = kvb_results_next(&rd, &r, &j, err, err_len)) == 1) {
        rc = 0;
        if (st->n_rec == st->cap_rec) {
            size_t cap = st->cap_rec ? 2 * st->cap_rec : 256;
            mrec *nr = realloc(st->rec, cap * sizeof *nr);
            if (!nr) rc = ERR("out of memory");
            else st->rec = nr, st->cap_rec = cap;
        }
        mrec *x = &st->rec[st->n_rec];
        if (!rc && !(x->key = make_key(r.method, r.budget, r.benchmark, r.task, r.sample_id ? r.sample_id : "")))
            rc = ERR("out of memory");
        if (!rc) {
            x->rec = j, x->dir = d, x->line = r.line, x->pos = 0;
            j = NULL;
            st->n_rec++;
            st->in[d].n_rec++;
        }
        cJSON_Delete(j);
        kvb_record_free(&r);
    }
    st->in[d].n_torn = rd.n_torn;
    kvb_results_close(&rd);
    free(path);
    return rc < 0 ? -1 : 0;
}

/* DIR/plan.jsonl's cells added to the union (absent file: nothing, the run predates plans). */
static int load_plan(mstate *st, const char *dir, char *err, size_t err_len) {
    char *path = kvb_path_join(dir, "plan.jsonl"), e2[512];
    if (!path) return ERR("out of memory");
    if (access(path, F_OK)) return free(path), 0;
    size_t len;
    char *text = kvb_read_file(path, &len, e2, sizeof e2);
    if (!text) return free(path), ERR("%s", e2);
    const char *nul = memchr(text, 0, len);
    if (nul) { /* the rows after it would be dropped without a word */
        long line = 1;
        for (const char *q = text; q < nul; q++) line += *q == '\n';
        ERR("%s:%ld: a NUL byte", path, line);
        return free(text), free(path), -1;
    }
    st->have_plan = 1;
    /* a sorted copy of the union so far, to skip cells another input already planned */
    pkey *sorted = st->n_plan ? malloc(st->n_plan * sizeof *sorted) : NULL;
    size_t n_sorted = st->n_plan;
    if (n_sorted && !sorted) { free(text); return ERR("out of memory"); }
    if (n_sorted) memcpy(sorted, st->plan, n_sorted * sizeof *sorted), qsort(sorted, n_sorted, sizeof *sorted, cmp_pkey);
    long line = 0;
    int rc = 0;
    for (char *save, *s = strtok_r(text, "\n", &save); s && !rc; s = strtok_r(NULL, "\n", &save)) {
        line++;
        cJSON *row = cJSON_Parse(s);
        const char *f[5] = {0};
        for (int i = 0; i < 5; i++) f[i] = cJSON_IsString(cJSON_GetArrayItem(row, i)) ? cJSON_GetArrayItem(row, i)->valuestring : NULL;
        if (!cJSON_IsArray(row) || !f[0] || !f[1] || !f[2] || !f[3] || !f[4]) {
            cJSON_Delete(row);
            rc = ERR("%s:%ld: not a plan row [method, budget, benchmark, task, sample_id, shard]", path, line);
            break;
        }
        pkey k = {make_key(f[0], f[1], f[2], f[3], f[4]), st->n_plan};
        if (!k.key) { cJSON_Delete(row); rc = ERR("out of memory"); break; }
        if (n_sorted && bsearch(&k, sorted, n_sorted, sizeof *sorted, cmp_pkey)) {
            free(k.key);
            cJSON_Delete(row);
            continue;
        }
        if (st->n_plan == st->cap_plan) {
            size_t cap = st->cap_plan ? 2 * st->cap_plan : 256;
            pkey *np = realloc(st->plan, cap * sizeof *np);
            if (!np) { free(k.key); cJSON_Delete(row); rc = ERR("out of memory"); break; }
            st->plan = np, st->cap_plan = cap;
        }
        st->plan[st->n_plan++] = k;
        cJSON_AddItemToArray(st->plan_rows, row);
    }
    free(sorted);
    free(text);
    free(path);
    return rc;
}

/* The first field (other than timings) on which two records of one cell differ, or NULL when they agree. */
static const char *differs(const cJSON *a, const cJSON *b) {
    const cJSON *x;
    cJSON_ArrayForEach(x, a) {
        if (is_timing(x->string)) continue;
        const cJSON *y = cJSON_GetObjectItemCaseSensitive(b, x->string);
        if (!y || !cJSON_Compare(x, y, 1)) return x->string;
    }
    cJSON_ArrayForEach(x, b)
        if (!is_timing(x->string) && !cJSON_GetObjectItemCaseSensitive(a, x->string)) return x->string;
    return NULL;
}

/* Runs must agree on suite, model and commit (and on the shard count); else refused or recorded. */
static int check_identity(mstate *st, char *const *dirs, int n, int allow, cJSON *mixed, char *err, size_t err_len) {
    static const char *const KEYS[] = {"suite", "model_sha256", "git_commit"};
    static const char *const WHAT[] = {"suites", "models", "commits"};
    for (size_t k = 0; k < 3; k++) {
        const char *v0 = jstr(st->in[0].run, KEYS[k]);
        cJSON *vals = NULL;
        for (int d = 0; d < n; d++) {
            const char *v = jstr(st->in[d].run, KEYS[k]);
            if (!v) return ERR("%s/run.json has no \"%s\"", dirs[d], KEYS[k]);
            if (!strcmp(v, v0 ? v0 : "")) continue;
            if (!allow)
                return ERR("mixed %s: '%s' (%s) and '%s' (%s); --allow-mixed merges them anyway (recorded in run.json)",
                           WHAT[k], v0, dirs[0], v, dirs[d]);
            if (!vals) {
                vals = cJSON_AddArrayToObject(mixed, KEYS[k]);
                cJSON_AddItemToArray(vals, cJSON_CreateString(v0));
            }
            int seen = 0;
            const cJSON *x;
            cJSON_ArrayForEach(x, vals) seen |= !strcmp(x->valuestring, v);
            if (!seen) cJSON_AddItemToArray(vals, cJSON_CreateString(v));
        }
    }
    for (int d = 1; d < n; d++) {
        const char *a = strchr(st->in[0].shard, '/'), *b = strchr(st->in[d].shard, '/');
        if (a && b && strcmp(a, b) && !allow)
            return ERR("mixed shard counts: %s (%s) and %s (%s); --allow-mixed merges them anyway", st->in[0].shard, dirs[0],
                       st->in[d].shard, dirs[d]);
    }
    return 0;
}

static int same_dir(const char *a, const char *b) {
    struct stat x, y;
    return stat(a, &x) == 0 && stat(b, &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

static char *join_records(mrec *r, size_t n) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    for (size_t i = 0; i < n; i++) {
        char *t = cJSON_PrintUnformatted(r[i].rec);
        if (!t) { fclose(f); free(buf); return NULL; }
        fprintf(f, "%s\n", t);
        free(t);
    }
    if (fclose(f)) { free(buf); return NULL; }
    return buf;
}

static int write_outputs(mstate *st, const char *out_dir, char *const *dirs, int n, mrec *uniq, size_t n_uniq,
                         cJSON *mixed, cJSON *missing, char *err, size_t err_len) {
    if (kvb_mkdirs(out_dir)) return ERR("cannot create %s: %s", out_dir, strerror(errno));
    cJSON *run = cJSON_Duplicate(st->in[0].run, 1);
    if (!run) return ERR("out of memory");
    /* the sweep's date: the earliest input's (history orders runs by it) */
    const char *created = jstr(run, "created");
    for (int d = 1; d < n; d++) {
        const char *c = jstr(st->in[d].run, "created");
        if (c && (!created || strcmp(c, created) < 0)) created = c;
    }
    cJSON_ReplaceItemInObject(run, "created", cJSON_CreateString(created ? created : ""));
    int dirty = 0;
    cJSON *from = cJSON_CreateArray();
    for (int d = 0; d < n; d++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "dir", dirs[d]);
        static const char *const KEEP[] = {"shard", "git_commit", "git_dirty", "host", "backend", "device", "build_flags", "created"};
        for (size_t k = 0; k < sizeof KEEP / sizeof *KEEP; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(st->in[d].run, KEEP[k]);
            cJSON_AddItemToObject(o, KEEP[k], v ? cJSON_Duplicate(v, 1) : cJSON_CreateNull());
        }
        dirty |= cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(st->in[d].run, "git_dirty"));
        cJSON_AddNumberToObject(o, "records", (double)st->in[d].n_rec);
        cJSON_AddItemToArray(from, o);
    }
    cJSON_DeleteItemFromObject(run, "shard");
    cJSON_AddNullToObject(run, "shard");
    cJSON_DeleteItemFromObject(run, "git_dirty");
    cJSON_AddBoolToObject(run, "git_dirty", dirty);
    char ts[64];
    time_t t = time(NULL);
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", gmtime(&t));
    cJSON_DeleteItemFromObject(run, "merged");
    cJSON_AddStringToObject(run, "merged", ts);
    cJSON_DeleteItemFromObject(run, "merged_from");
    cJSON_AddItemToObject(run, "merged_from", from);
    cJSON_DeleteItemFromObject(run, "mixed");
    if (cJSON_GetArraySize(mixed)) cJSON_AddItemToObject(run, "mixed", cJSON_Duplicate(mixed, 1));
    cJSON_DeleteItemFromObject(run, "missing");
    if (cJSON_GetArraySize(missing)) cJSON_AddItemToObject(run, "missing", cJSON_Duplicate(missing, 1));
    char *run_text = cJSON_Print(run), *res_text = join_records(uniq, n_uniq), *plan_text = NULL;
    cJSON_Delete(run);
    size_t plen = 0;
    FILE *pf = open_memstream(&plan_text, &plen);
    const cJSON *row;
    if (pf) {
        cJSON_ArrayForEach(row, st->plan_rows) {
            char *l = cJSON_PrintUnformatted(row);
            if (l) fprintf(pf, "%s\n", l);
            free(l);
        }
        fclose(pf);
    }
    char *res_path = kvb_path_join(out_dir, "results.jsonl"), *plan_path = kvb_path_join(out_dir, "plan.jsonl"), *run_path = kvb_path_join(out_dir, "run.json");
    int rc = !run_text || !res_text || !plan_text || !res_path || !plan_path || !run_path ? ERR("out of memory") : 0;
    /* results first: a run.json next to stale results would make a wrong merge look finished */
    if (!rc) rc = kvb_write_file_atomic(res_path, res_text, err, err_len);
    if (!rc && st->have_plan) rc = kvb_write_file_atomic(plan_path, plan_text, err, err_len);
    if (!rc) rc = kvb_write_file_atomic(run_path, run_text, err, err_len);
    if (!rc) rc = kvb_serve_rows_merge(out_dir, dirs, n, err, err_len); /* a suite's "serve" rows (shard 0's) */
    free(res_path), free(plan_path), free(run_path);
    free(run_text);
    free(res_text);
    free(plan_text);
    return rc ? rc : kvb_report_write(out_dir, err, err_len);
}

/* OUT may be new, empty, or an earlier merge (re-merging after a re-queued shard); never an input. */
static int check_out(const char *out_dir, char *const *dirs, int n, char *err, size_t err_len) {
    for (int d = 0; d < n; d++)
        if (same_dir(out_dir, dirs[d])) return ERR("OUT %s is also an input; merge into a new directory", out_dir);
    char *path = kvb_path_join(out_dir, "run.json"), *res = kvb_path_join(out_dir, "results.jsonl"), e2[256];
    if (!path || !res) return free(path), free(res), ERR("out of memory");
    int no_run = access(path, F_OK) != 0, has_res = access(res, F_OK) == 0;
    free(res);
    if (no_run) {
        free(path);
        return has_res ? ERR("OUT %s holds results.jsonl without run.json; choose another OUT", out_dir) : 0;
    }
    char *text = kvb_read_file(path, NULL, e2, sizeof e2);
    free(path);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    int ok = cJSON_GetObjectItemCaseSensitive(j, "merged_from") != NULL;
    cJSON_Delete(j);
    return ok ? 0 : ERR("OUT %s holds a run that is not a merge; choose another OUT", out_dir);
}

int kvb_merge(const char *out_dir, char *const *dirs, int n, const kvb_merge_opts *o, FILE *log, char *err, size_t err_len) {
    if (n < 1) return ERR("give at least one run directory to merge");
    if (check_out(out_dir, dirs, n, err, err_len)) return -1;
    mstate st = {0};
    int rc = -1;
    cJSON *mixed = cJSON_CreateObject(), *missing = cJSON_CreateArray();
    mrec *uniq = NULL;
    st.in = calloc((size_t)n, sizeof *st.in);
    st.plan_rows = cJSON_CreateArray();
    if (!st.in || !mixed || !missing || !st.plan_rows) { ERR("out of memory"); goto done; }
    for (int d = 0; d < n; d++) {
        char *path = kvb_path_join(dirs[d], "run.json"), e2[512];
        char *text = path ? kvb_read_file(path, NULL, e2, sizeof e2) : NULL;
        if (!path) snprintf(e2, sizeof e2, "out of memory");
        if (text) st.in[d].run = cJSON_Parse(text);
        free(text);
        if (!text) ERR("%s is not a run directory (%s)", dirs[d], e2);
        else if (!cJSON_IsObject(st.in[d].run)) ERR("%s: not valid JSON", path);
        free(path);
        if (!cJSON_IsObject(st.in[d].run)) goto done;
        snprintf(st.in[d].shard, sizeof st.in[d].shard, "%s", jstr(st.in[d].run, "shard") ? jstr(st.in[d].run, "shard") : "");
        for (int e = 0; e < d; e++)
            if (same_dir(dirs[d], dirs[e])) { ERR("%s is given twice", dirs[d]); goto done; }
    }
    if (check_identity(&st, dirs, n, o->allow_mixed, mixed, err, err_len)) goto done;
    for (int d = 0; d < n; d++)
        if (load_results(&st, d, dirs[d], err, err_len) || load_plan(&st, dirs[d], err, err_len)) goto done;
    /* duplicates: identical results kept once, different ones refused */
    qsort(st.rec, st.n_rec, sizeof *st.rec, cmp_rec);
    uniq = malloc((st.n_rec + 1) * sizeof *uniq);
    if (!uniq) { ERR("out of memory"); goto done; }
    size_t n_uniq = 0, n_dup = 0;
    for (size_t i = 0; i < st.n_rec; i++) {
        if (n_uniq && !strcmp(uniq[n_uniq - 1].key, st.rec[i].key)) {
            const char *f = differs(uniq[n_uniq - 1].rec, st.rec[i].rec);
            if (f) {
                char name[1024];
                cell_name(st.rec[i].key, name, sizeof name);
                ERR("conflicting records of cell %s: %s/results.jsonl:%ld and %s/results.jsonl:%ld differ in \"%s\"", name,
                    dirs[uniq[n_uniq - 1].dir], uniq[n_uniq - 1].line, dirs[st.rec[i].dir], st.rec[i].line, f);
                goto done;
            }
            n_dup++;
            continue;
        }
        uniq[n_uniq++] = st.rec[i];
    }
    /* order: the plan's (an unsharded run's append order), then unplanned records by input and line */
    pkey *sorted_plan = st.n_plan ? malloc(st.n_plan * sizeof *sorted_plan) : NULL;
    if (st.n_plan && !sorted_plan) { ERR("out of memory"); goto done; }
    if (st.n_plan) memcpy(sorted_plan, st.plan, st.n_plan * sizeof *sorted_plan), qsort(sorted_plan, st.n_plan, sizeof *sorted_plan, cmp_pkey);
    for (size_t i = 0; i < n_uniq; i++) {
        pkey k = {uniq[i].key, 0}, *hit = st.n_plan ? bsearch(&k, sorted_plan, st.n_plan, sizeof *sorted_plan, cmp_pkey) : NULL;
        uniq[i].pos = hit ? hit->pos : st.n_plan;
    }
    free(sorted_plan);
    size_t n_missing = 0;
    char first[5][1024];
    for (size_t p = 0; p < st.n_plan; p++) {
        mrec k = {.key = st.plan[p].key};
        if (n_uniq && bsearch(&k, uniq, n_uniq, sizeof *uniq, cmp_rec_key)) continue;
        if (n_missing < 5) cell_name(st.plan[p].key, first[n_missing], sizeof first[n_missing]);
        char name[1024];
        cell_name(st.plan[p].key, name, sizeof name);
        cJSON_AddItemToArray(missing, cJSON_CreateString(name));
        n_missing++;
    }
    if (n_missing && !o->allow_missing) {
        char list[2048] = "";
        for (size_t i = 0; i < n_missing && i < 5; i++) {
            size_t l = strlen(list);
            snprintf(list + l, sizeof list - l, "%s%s", i ? ", " : "", first[i]);
        }
        char more[64] = "";
        if (n_missing > 5) snprintf(more, sizeof more, " and %zu more", n_missing - 5);
        ERR("%zu of %zu planned cells have no record: %s%s (a shard not run or not finished? --allow-missing merges anyway)",
            n_missing, st.n_plan, list, more);
        goto done;
    }
    qsort(uniq, n_uniq, sizeof *uniq, cmp_pos);
    if (write_outputs(&st, out_dir, dirs, n, uniq, n_uniq, mixed, missing, err, err_len)) goto done;
    for (int d = 0; log && d < n; d++)
        if (st.in[d].n_torn) fprintf(log, "warning: %s/results.jsonl: a torn last line (cut by a crash) was not merged\n", dirs[d]);
    if (log)
        fprintf(log, "merged %d runs into %s: %zu records (%zu identical duplicates dropped), %zu of %zu planned cells missing%s\n", n,
                out_dir, n_uniq, n_dup, n_missing, st.n_plan, st.have_plan ? "" : " (no plan.jsonl: missing cells not checked)");
    rc = 0;
done:
    free(uniq);
    for (size_t i = 0; i < st.n_rec; i++) free(st.rec[i].key), cJSON_Delete(st.rec[i].rec);
    free(st.rec);
    for (size_t i = 0; i < st.n_plan; i++) free(st.plan[i].key);
    free(st.plan);
    for (int d = 0; st.in && d < n; d++) cJSON_Delete(st.in[d].run);
    free(st.in);
    cJSON_Delete(st.plan_rows);
    cJSON_Delete(mixed);
    cJSON_Delete(missing);
    return rc;
}
