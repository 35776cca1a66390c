/* results.c — load a run directory (run.json + results.jsonl) and group its records into cells (see
 * results.h). A cell's records are kept sorted by (sample_id, line), so its scores, and with them the
 * bootstrap interval, do not depend on the order shards or resumed runs appended them. */
#include "reports/results.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/fsutil.h"
#include "methods/method.h"
#include "reports/stats.h"

#define ERR(...) (snprintf(err, err_len, __VA_ARGS__), -1)

static const double MIB = 1024.0 * 1024.0;

/* ---- one record ---- */

typedef struct {
    const char *path;
    long line;
    char *err;
    size_t err_len;
} where;

static int bad(const where *w, const char *what, const char *key) {
    snprintf(w->err, w->err_len, "%s:%ld: %s%s%s", w->path, w->line, key ? "field \"" : "", key ? key : "", what);
    return -1;
}

/* A number anywhere in the record that is not finite (1e999 parses as infinity): no command may read it as a
 * value, and a rewrite (merge) would print it as null. The top-level key it is under, or NULL. */
static const char *non_finite(const cJSON *o) {
    for (const cJSON *c = o ? o->child : NULL; c; c = c->next)
        if ((cJSON_IsNumber(c) && !isfinite(c->valuedouble)) || ((cJSON_IsObject(c) || cJSON_IsArray(c)) && non_finite(c)))
            return c->string ? c->string : (o->string ? o->string : "?");
    return NULL;
}

/* ---- the reader ---- */

int kvb_results_open(kvb_results_reader *r, const char *path, char *err, size_t err_len) {
    memset(r, 0, sizeof *r);
    r->path = path;
    r->f = kvb_fopen_regular(path, err, err_len);
    return r->f ? 0 : -1;
}

static int blank_n(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isspace((unsigned char)s[i])) return 0;
    return 1;
}

int kvb_results_next(kvb_results_reader *r, kvb_record *rec, cJSON **json, char *err, size_t err_len) {
    kvb_record_init(rec);
    if (json) *json = NULL;
    for (;;) {
        errno = 0;
        ssize_t n = getline(&r->line, &r->cap, r->f);
        if (n < 0) {
            if (ferror(r->f)) return ERR("%s:%ld: read error: %s", r->path, r->line_no + 1, strerror(errno));
            return 0;
        }
        where w = {r->path, ++r->line_no, err, err_len};
        if (r->line[n - 1] != '\n') { /* cut by a crash mid-append: the runner drops it on resume too */
            r->n_torn += !blank_n(r->line, (size_t)n);
            return 0;
        }
        r->good_end += n;
        const char *nul = memchr(r->line, 0, (size_t)n);
        if (nul) {
            char what[64];
            snprintf(what, sizeof what, "a NUL byte at column %ld", (long)(nul - r->line) + 1);
            return bad(&w, what, NULL);
        }
        if (blank_n(r->line, (size_t)n)) continue;
        const char *end = NULL;
        cJSON *o = cJSON_ParseWithLengthOpts(r->line, (size_t)n, &end, 0);
        if (o && !blank_n(end, (size_t)(r->line + n - end))) {
            char what[96];
            snprintf(what, sizeof what, "unexpected text after the record (column %ld)", (long)(end - r->line) + 1);
            cJSON_Delete(o);
            return bad(&w, what, NULL);
        }
        if (!o) {
            const char *at = cJSON_GetErrorPtr();
            char what[96];
            long col = at && at >= r->line && at <= r->line + n ? (long)(at - r->line) + 1 : 0;
            snprintf(what, sizeof what, "not valid JSON (near column %ld)", col);
            return bad(&w, what, NULL);
        }
        const char *nf = cJSON_IsObject(o) ? non_finite(o) : NULL;
        char why[400];
        int rc = nf ? bad(&w, "\" holds a number that is not finite", nf)
                    : kvb_record_from_json(o, rec, r->lean, why, sizeof why) ? bad(&w, why, NULL) : 0;
        rec->line = r->line_no;
        if (rc) kvb_record_free(rec);
        if (rc || !json) cJSON_Delete(o);
        else *json = o;
        return rc ? -1 : 1;
    }
}

void kvb_results_close(kvb_results_reader *r) {
    if (r->f) fclose(r->f);
    free(r->line);
    memset(r, 0, sizeof *r);
}

/* ---- the run ---- */

/* "host_load": sessions of {cpus, threads, load_start, load_max, load_end}; a number field may be null. */
static int load_host_load(kvb_run *run, const cJSON *m, const char *path, char *err, size_t err_len) {
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(m, "host_load"), *s;
    run->load_start = run->load_max = NAN;
    if (!arr || cJSON_IsNull(arr)) return 0;
    if (!cJSON_IsArray(arr)) return ERR("%s: field \"host_load\" is not an array", path);
    cJSON_ArrayForEach(s, arr) {
        static const char *const keys[] = {"cpus", "threads", "load_start", "load_max", "load_end"};
        double v[5];
        if (!cJSON_IsObject(s)) return ERR("%s: a \"host_load\" entry is not an object", path);
        for (int k = 0; k < 5; k++) {
            const cJSON *x = cJSON_GetObjectItemCaseSensitive(s, keys[k]);
            v[k] = NAN;
            if (!x || cJSON_IsNull(x)) continue;
            if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble) || x->valuedouble < 0)
                return ERR("%s: \"host_load\" field \"%s\" is not a non-negative number", path, keys[k]);
            v[k] = x->valuedouble;
        }
        if (isfinite(v[0]) && v[0] > run->cpus) run->cpus = (int)v[0];
        if (isfinite(v[1]) && v[1] > run->threads) run->threads = (int)v[1];
        if (!run->n_load_sessions++) run->load_start = v[2];
        for (int k = 2; k < 5; k++)
            if (isfinite(v[k]) && !(v[k] <= run->load_max)) run->load_max = v[k];
    }
    return 0;
}

static int load_meta(kvb_run *run, const char *path, char *err, size_t err_len) {
    char *text = kvb_read_file(path, NULL, err, err_len);
    if (!text) return -1;
    cJSON *m = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(m)) {
        cJSON_Delete(m);
        return ERR("%s: not a JSON object", path);
    }
    static const char *const keys[] = {"suite", "model", "model_sha256", "git_commit", "host", "backend", "flags", "created"};
    char **out[] = {&run->suite, &run->model, &run->model_sha256, &run->git_commit, &run->host, &run->backend, &run->flags, &run->created};
    int rc = 0;
    for (size_t i = 0; i < sizeof keys / sizeof *keys && !rc; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, keys[i]);
        if (v && !cJSON_IsNull(v) && !cJSON_IsString(v)) rc = ERR("%s: field \"%s\" is not a string", path, keys[i]);
        else if (cJSON_IsString(v) && !(*out[i] = strdup(v->valuestring))) rc = ERR("%s: out of memory", path);
    }
    if (!rc) rc = load_host_load(run, m, path, err, err_len);
    cJSON_Delete(m);
    return rc;
}

static int load_records(kvb_run *run, const char *path, char *err, size_t err_len) {
    kvb_results_reader rd;
    if (kvb_results_open(&rd, path, err, err_len)) return -1;
    rd.lean = 1; /* a report needs no predictions: a long run's records stay small */
    size_t cap = 0;
    int rc;
    kvb_record r;
    while ((rc = kvb_results_next(&rd, &r, NULL, err, err_len)) == 1) {
        if (run->n_rec == cap) {
            size_t c = cap ? 2 * cap : 256;
            kvb_record *v = realloc(run->rec, c * sizeof *v);
            if (!v) {
                kvb_record_free(&r);
                rc = ERR("%s: out of memory", path);
                break;
            }
            run->rec = v, cap = c;
        }
        run->rec[run->n_rec++] = r;
    }
    run->n_torn = rd.n_torn;
    kvb_results_close(&rd);
    return rc;
}

/* ---- records the plan does not have ---- */

#define SEP "\x1f"

static char *cell_key(const char *m, const char *b, const char *bench, const char *task, const char *id) {
    size_t n = strlen(m) + strlen(b) + strlen(bench) + strlen(task) + strlen(id) + 5;
    char *k = malloc(n);
    if (k) snprintf(k, n, "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s", m, b, bench, task, id);
    return k;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* plan.jsonl's rows [method, budget, benchmark, task, sample_id, shard] as sorted keys; *n = 0 without a plan. */
static int load_plan_keys(const char *path, char ***keys, size_t *n, char *err, size_t err_len) {
    *keys = NULL, *n = 0;
    size_t len, cap = 0;
    char *text = access(path, F_OK) ? NULL : kvb_read_file(path, &len, err, err_len);
    if (!text) return access(path, F_OK) ? 0 : -1;
    int rc = 0;
    long line = 0;
    for (char *p = text, *nl; !rc && p < text + len; p = nl + 1) {
        nl = memchr(p, '\n', (size_t)(text + len - p));
        if (!nl) nl = text + len;
        line++;
        if (memchr(p, 0, (size_t)(nl - p))) { rc = ERR("%s:%ld: a NUL byte", path, line); break; }
        *nl = 0;
        if (blank_n(p, (size_t)(nl - p))) continue;
        cJSON *row = cJSON_Parse(p);
        const char *f[5] = {0};
        for (int i = 0; i < 5; i++) f[i] = cJSON_GetStringValue(cJSON_GetArrayItem(row, i));
        if (!cJSON_IsArray(row) || !f[0] || !f[1] || !f[2] || !f[3] || !f[4])
            rc = ERR("%s:%ld: not a plan row [method, budget, benchmark, task, sample_id, shard]", path, line);
        if (!rc && *n == cap) {
            char **v = realloc(*keys, (cap = cap ? 2 * cap : 256) * sizeof *v);
            if (!v) rc = ERR("%s: out of memory", path);
            else *keys = v;
        }
        if (!rc && !((*keys)[*n] = cell_key(f[0], f[1], f[2], f[3], f[4]))) rc = ERR("%s: out of memory", path);
        if (!rc) (*n)++;
        cJSON_Delete(row);
    }
    free(text);
    if (!rc && *n) qsort(*keys, *n, sizeof **keys, cmp_str);
    return rc;
}

/* Count and name the records whose cell the plan does not have (a suite edited since, records appended from
 * elsewhere): they would become report rows without a word. */
static int find_unplanned(kvb_run *run, const char *plan_path, char *err, size_t err_len) {
    char **keys;
    size_t n_keys;
    if (load_plan_keys(plan_path, &keys, &n_keys, err, err_len)) return -1;
    char *names = NULL;
    size_t names_len = 0;
    FILE *f = n_keys ? open_memstream(&names, &names_len) : NULL;
    int rc = n_keys && !f ? ERR("%s: out of memory", plan_path) : 0;
    for (size_t i = 0; !rc && n_keys && i < run->n_rec; i++) {
        const kvb_record *r = &run->rec[i];
        char *k = cell_key(r->method, r->budget, r->benchmark, r->task, r->sample_id ? r->sample_id : "");
        if (!k) { rc = ERR("%s: out of memory", plan_path); break; }
        if (!bsearch(&k, keys, n_keys, sizeof *keys, cmp_str) && run->n_unplanned++ < 3)
            fprintf(f, "%s%.60s@%.20s %.40s/%.60s #%.60s", run->n_unplanned > 1 ? ", " : "", r->method, r->budget, r->benchmark,
                    r->task, r->sample_id ? r->sample_id : "");
        free(k);
    }
    if (f && fclose(f) && !rc) rc = ERR("%s: out of memory", plan_path);
    if (!rc && run->n_unplanned) {
        for (char *c = names; *c; c++) /* control characters from a record are not printed raw */
            if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
        run->unplanned = names;
    } else free(names);
    for (size_t i = 0; i < n_keys; i++) free(keys[i]);
    free(keys);
    return rc;
}

int kvb_run_load(const char *run_dir, kvb_run *run, char *err, size_t err_len) {
    memset(run, 0, sizeof *run);
    size_t cap = strlen(run_dir) + sizeof "/results.jsonl";
    char *path = malloc(cap);
    if (!path || !(run->dir = strdup(run_dir))) {
        free(path);
        return ERR("%s: out of memory", run_dir);
    }
    snprintf(path, cap, "%s/run.json", run_dir);
    int rc = load_meta(run, path, err, err_len);
    snprintf(path, cap, "%s/results.jsonl", run_dir);
    if (!rc) rc = load_records(run, path, err, err_len);
    snprintf(path, cap, "%s/plan.jsonl", run_dir);
    if (!rc) rc = find_unplanned(run, path, err, err_len);
    free(path);
    if (rc) kvb_run_free(run);
    return rc;
}

void kvb_run_free(kvb_run *run) {
    for (size_t i = 0; i < run->n_rec; i++) kvb_record_free(&run->rec[i]);
    free(run->rec);
    free(run->dir);
    free(run->unplanned);
    free(run->suite), free(run->model), free(run->model_sha256), free(run->git_commit);
    free(run->host), free(run->backend), free(run->flags), free(run->created);
    memset(run, 0, sizeof *run);
}

/* ---- budgets and rows ---- */

kvb_rbudget_kind kvb_rbudget_parse(const char *budget, double *value) {
    char *end;
    *value = NAN;
    if (!strcmp(budget, "full")) return KVB_RB_FULL;
    double v = strtod(budget, &end);
    if (end == budget || !isfinite(v)) return KVB_RB_OTHER;
    *value = v;
    if (!strcmp(end, "%")) return KVB_RB_PERCENT;
    return *end ? KVB_RB_OTHER : KVB_RB_TOKENS;
}

int kvb_row_is_full(const kvb_row *row) {
    const kvb_method_def *m = kvb_method_find(row->method); /* the baseline, by any of its names */
    return m && (m->traits & KVB_NO_BUDGET);
}

/* ---- grouping into cells ---- */

static int str_cmp(const char *a, const char *b) { return strcmp(a ? a : "", b ? b : ""); }

static int same_cell(const kvb_record *a, const kvb_record *b) {
    return !strcmp(a->method, b->method) && !strcmp(a->budget, b->budget) && !strcmp(a->benchmark, b->benchmark) &&
           !strcmp(a->task, b->task);
}

/* (method, budget, benchmark, task, sample_id, line): cells contiguous, duplicates adjacent, last one last */
static int cmp_rec(const void *pa, const void *pb) {
    const kvb_record *a = *(const kvb_record *const *)pa, *b = *(const kvb_record *const *)pb;
    int c = strcmp(a->method, b->method);
    if (!c) c = strcmp(a->budget, b->budget);
    if (!c) c = strcmp(a->benchmark, b->benchmark);
    if (!c) c = strcmp(a->task, b->task);
    if (!c) c = str_cmp(a->sample_id, b->sample_id);
    return c ? c : (a->line > b->line) - (a->line < b->line);
}

/* A name with the first line it appears on, and its rank once ordered. */
typedef struct {
    const char *a, *b;
    long first, group_first;
    kvb_rbudget_kind kind;
    double value;
} name_line;

static int cmp_pair(const void *pa, const void *pb) {
    const name_line *x = pa, *y = pb;
    int c = strcmp(x->a, y->a);
    return c ? c : strcmp(x->b, y->b);
}

static int cmp_row_order(const void *pa, const void *pb) {
    const name_line *x = pa, *y = pb;
    kvb_row rx = {x->a, x->b, NAN}, ry = {y->a, y->b, NAN};
    int fx = kvb_row_is_full(&rx), fy = kvb_row_is_full(&ry);
    if (fx != fy) return fy - fx;
    if (fx && strcmp(x->a, y->a)) return strcmp(x->a, kvb_method_find(x->a)->name) ? 1 : -1; /* full before flash */
    if (x->kind != y->kind) return (int)x->kind - (int)y->kind;
    if (x->kind != KVB_RB_OTHER && x->value != y->value) return x->value < y->value ? -1 : 1;
    return (x->first > y->first) - (x->first < y->first);
}

static int cmp_col_order(const void *pa, const void *pb) {
    const name_line *x = pa, *y = pb;
    if (x->group_first != y->group_first) return x->group_first < y->group_first ? -1 : 1;
    return (x->first > y->first) - (x->first < y->first);
}

/* Sort pairs by name, merge equal ones keeping the earliest line; returns the distinct count. */
static int unique_pairs(name_line *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_pair);
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m && !cmp_pair(&v[m - 1], &v[i])) {
            if (v[i].first < v[m - 1].first) v[m - 1].first = v[i].first;
            continue;
        }
        v[m++] = v[i];
    }
    return m;
}

static long cell_first_line(const kvb_run *run, const kvb_cell *c) {
    long first = run->rec[c->rec[0]].line;
    for (size_t i = 1; i < c->n; i++)
        if (run->rec[c->rec[i]].line < first) first = run->rec[c->rec[i]].line;
    return first;
}

static int build_rows(const kvb_run *run, kvb_summary *s) {
    name_line *v = calloc((size_t)s->n_cells + 1, sizeof *v);
    if (!v) return -1;
    for (int i = 0; i < s->n_cells; i++) {
        v[i] = (name_line){s->cells[i].method, s->cells[i].budget, cell_first_line(run, &s->cells[i]), 0, 0, 0};
        v[i].kind = kvb_rbudget_parse(v[i].b, &v[i].value);
    }
    int n = unique_pairs(v, s->n_cells);
    qsort(v, (size_t)n, sizeof *v, cmp_row_order);
    s->rows = calloc((size_t)n + 1, sizeof *s->rows);
    for (int i = 0; s->rows && i < n; i++) s->rows[i] = (kvb_row){v[i].a, v[i].b, NAN};
    s->n_rows = s->rows ? n : 0;
    s->ref_row = s->n_rows && kvb_row_is_full(&s->rows[0]) ? 0 : -1;
    free(v);
    return s->rows ? 0 : -1;
}

static int build_cols(const kvb_run *run, kvb_summary *s) {
    name_line *v = calloc((size_t)s->n_cells + 1, sizeof *v);
    if (!v) return -1;
    for (int i = 0; i < s->n_cells; i++)
        v[i] = (name_line){s->cells[i].benchmark, s->cells[i].task, cell_first_line(run, &s->cells[i]), 0, 0, 0};
    int n = unique_pairs(v, s->n_cells); /* sorted by benchmark: its tasks are contiguous */
    for (int i = 0, j; i < n; i = j) {
        long g = v[i].first;
        for (j = i; j < n && !strcmp(v[j].a, v[i].a); j++) g = v[j].first < g ? v[j].first : g;
        for (int k = i; k < j; k++) v[k].group_first = g;
    }
    qsort(v, (size_t)n, sizeof *v, cmp_col_order);
    s->cols = calloc((size_t)n + 1, sizeof *s->cols);
    for (int i = 0; s->cols && i < n; i++) s->cols[i] = (kvb_col){v[i].a, v[i].b};
    s->n_cols = s->cols ? n : 0;
    free(v);
    return s->cols ? 0 : -1;
}

static int place_cells(kvb_summary *s) {
    s->grid = calloc((size_t)s->n_rows * (size_t)s->n_cols + 1, sizeof *s->grid);
    if (!s->grid) return -1;
    for (int i = 0; i < s->n_cells; i++) {
        kvb_cell *c = &s->cells[i];
        for (c->row = 0; c->row < s->n_rows; c->row++)
            if (!strcmp(s->rows[c->row].method, c->method) && !strcmp(s->rows[c->row].budget, c->budget)) break;
        for (c->col = 0; c->col < s->n_cols; c->col++)
            if (!strcmp(s->cols[c->col].benchmark, c->benchmark) && !strcmp(s->cols[c->col].task, c->task)) break;
        s->grid[(size_t)c->row * (size_t)s->n_cols + (size_t)c->col] = c;
    }
    return 0;
}

/* Mean of the finite values a record field holds, over samples that ran; positive_only for timings. */
static double field_mean(const kvb_run *run, const kvb_cell *c, size_t offset, int positive_only) {
    double sum = 0;
    size_t n = 0;
    for (size_t i = 0; i < c->n; i++) {
        const kvb_record *r = &run->rec[c->rec[i]];
        double v = *(const double *)((const char *)r + offset);
        if (r->error || !isfinite(v) || (positive_only && v <= 0)) continue;
        sum += v, n++;
    }
    return n ? sum / (double)n : NAN;
}

static int cell_stats(const kvb_run *run, kvb_cell *c) {
    c->scores = malloc((c->n + 1) * sizeof *c->scores);
    if (!c->scores) return -1;
    for (size_t i = 0; i < c->n; i++) {
        const kvb_record *r = &run->rec[c->rec[i]];
        if (!isnan(r->score)) c->scores[c->n_scored++] = r->score;
        c->judge_errors += r->judge_error != NULL;
        c->sample_errors += r->error != NULL;
    }
    c->mean = kvb_stats_mean(c->scores, c->n_scored);
    if (kvb_stats_bootstrap_ci(c->scores, c->n_scored, KVB_BOOT_RESAMPLES, KVB_BOOT_SEED, &c->ci_lo, &c->ci_hi)) return -1;
#define FIELD(f, pos) field_mean(run, c, offsetof(kvb_record, f), pos)
    c->ttft_ms = FIELD(ttft_ms, 1);
    c->decode_ms_per_token = FIELD(decode_ms_per_token, 1);
    c->attended_per_layer = FIELD(attended_per_layer, 0);
    c->kv_device_mib = FIELD(kv_device_bytes, 0) / MIB;
    c->kv_device_end_mib = FIELD(kv_device_bytes_end, 0) / MIB;
    c->kv_host_mib = FIELD(kv_host_bytes, 0) / MIB;
    c->kv_full_mib = FIELD(kv_full_bytes, 0) / MIB;
    c->moved_mib = FIELD(moved_bytes, 0) / MIB;
#undef FIELD
    return 0;
}

/* Each row's measured device KV, % of full (see kvb_row). */
static void row_kv(const kvb_run *run, kvb_summary *s) {
    for (int i = 0; i < s->n_rows; i++) {
        double sum = 0;
        size_t n = 0;
        for (int j = 0; j < s->n_cols; j++) {
            const kvb_cell *c = kvb_summary_at(s, i, j);
            for (size_t k = 0; c && k < c->n; k++) {
                const kvb_record *r = &run->rec[c->rec[k]];
                if (r->error || !isfinite(r->kv_device_bytes) || !(r->kv_full_bytes > 0)) continue;
                sum += 100 * r->kv_device_bytes / r->kv_full_bytes, n++;
            }
        }
        s->rows[i].kv_device_pct = n ? sum / (double)n : NAN;
    }
}

/* Cut the sorted records into cells, keeping only the last of records with the same sample_id. */
static int cut_cells(const kvb_run *run, const kvb_record **sorted, kvb_summary *s) {
    s->cells = calloc(run->n_rec + 1, sizeof *s->cells);
    if (!s->cells) return -1;
    for (size_t i = 0, j; i < run->n_rec; i = j) {
        for (j = i; j < run->n_rec && same_cell(sorted[i], sorted[j]); j++) {}
        kvb_cell *c = &s->cells[s->n_cells++];
        const kvb_record *r = sorted[i];
        *c = (kvb_cell){.method = r->method, .budget = r->budget, .benchmark = r->benchmark, .task = r->task};
        if (!(c->rec = malloc((j - i) * sizeof *c->rec))) return -1;
        for (size_t k = i; k < j; k++) {
            const kvb_record *a = sorted[k], *b = k + 1 < j ? sorted[k + 1] : NULL;
            if (b && a->sample_id && b->sample_id && !strcmp(a->sample_id, b->sample_id)) {
                s->n_duplicates += !a->superseded_ok && !b->superseded_ok; /* the runner's own supersessions */
                continue;
            }
            c->rec[c->n++] = (size_t)(a - run->rec);
        }
    }
    return 0;
}

int kvb_summary_build(const kvb_run *run, kvb_summary *s, char *err, size_t err_len) {
    memset(s, 0, sizeof *s);
    s->ref_row = -1;
    const kvb_record **sorted = malloc((run->n_rec + 1) * sizeof *sorted);
    int rc = sorted ? 0 : -1;
    for (size_t i = 0; !rc && i < run->n_rec; i++) sorted[i] = &run->rec[i];
    if (!rc) qsort(sorted, run->n_rec, sizeof *sorted, cmp_rec);
    if (!rc) rc = cut_cells(run, sorted, s);
    free(sorted);
    if (!rc) rc = build_rows(run, s);
    if (!rc) rc = build_cols(run, s);
    if (!rc) rc = place_cells(s);
    for (int i = 0; !rc && i < s->n_cells; i++) rc = cell_stats(run, &s->cells[i]);
    if (!rc) row_kv(run, s);
    if (rc) {
        kvb_summary_free(s);
        return ERR("%s: out of memory summarising %zu records", run->dir, run->n_rec);
    }
    return 0;
}

void kvb_summary_free(kvb_summary *s) {
    for (int i = 0; s->cells && i < s->n_cells; i++) free(s->cells[i].rec), free(s->cells[i].scores);
    free(s->cells), free(s->rows), free(s->cols), free(s->grid);
    memset(s, 0, sizeof *s);
    s->ref_row = -1;
}

const kvb_cell *kvb_summary_at(const kvb_summary *s, int row, int col) {
    if (row < 0 || col < 0 || row >= s->n_rows || col >= s->n_cols) return NULL;
    return s->grid[(size_t)row * (size_t)s->n_cols + (size_t)col];
}

const kvb_cell *kvb_summary_find(const kvb_summary *s, const char *method, const char *budget, const char *task) {
    for (int i = 0; i < s->n_cells; i++) {
        const kvb_cell *c = &s->cells[i];
        if (!strcmp(c->method, method) && !strcmp(c->budget, budget) && !strcmp(c->task, task)) return c;
    }
    return NULL;
}
