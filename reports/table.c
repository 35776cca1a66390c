/* table.c — summary.csv, report.md and run comparison (see table.h). Means carry a 95% percentile
 * bootstrap interval (1000 resamples, splitmix64 seeded with 1: deterministic). */
#include "reports/table.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/fsutil.h"

#define ERR(...) (snprintf(err, err_len, __VA_ARGS__), -1)

typedef struct {
    char row[80], task[64];
    double *scores;
    int n_scores, n, errors, cap;
    double ttft, decode, dev, dev_end, host, full, moved, attended; /* sums */
} cell;

typedef struct {
    cell *c;
    int n, cap;
    char suite[96], model_sha[80];
} run;

static cell *find_cell(run *r, const char *row, const char *task) {
    for (int i = 0; i < r->n; i++)
        if (!strcmp(r->c[i].row, row) && !strcmp(r->c[i].task, task)) return &r->c[i];
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 32;
        r->c = realloc(r->c, (size_t)r->cap * sizeof *r->c);
    }
    cell *c = &r->c[r->n++];
    memset(c, 0, sizeof *c);
    snprintf(c->row, sizeof c->row, "%s", row);
    snprintf(c->task, sizeof c->task, "%s", task);
    return c;
}

static double num(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : 0.0;
}

static void run_free(run *r) {
    for (int i = 0; i < r->n; i++) free(r->c[i].scores);
    free(r->c);
}

static int run_load(const char *dir, run *r, char *err, size_t err_len) {
    memset(r, 0, sizeof *r);
    char path[1200];
    snprintf(path, sizeof path, "%s/run.json", dir);
    char *meta = kvb_read_file(path, NULL, err, err_len);
    if (!meta) return -1;
    cJSON *m = cJSON_Parse(meta);
    free(meta);
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(m, "suite"), *sha = cJSON_GetObjectItemCaseSensitive(m, "model_sha256");
    snprintf(r->suite, sizeof r->suite, "%s", cJSON_IsString(s) ? s->valuestring : "?");
    snprintf(r->model_sha, sizeof r->model_sha, "%s", cJSON_IsString(sha) ? sha->valuestring : "?");
    cJSON_Delete(m);
    snprintf(path, sizeof path, "%s/results.jsonl", dir);
    size_t len;
    char *text = kvb_read_file(path, &len, err, err_len);
    if (!text) return -1;
    long line = 0;
    for (char *p = text; *p;) {
        char *nl = strchr(p, '\n');
        line++;
        if (!nl) break; /* a torn last record: skipped */
        *nl = 0;
        cJSON *rec = cJSON_Parse(p);
        const cJSON *me = cJSON_GetObjectItemCaseSensitive(rec, "method"), *bu = cJSON_GetObjectItemCaseSensitive(rec, "budget"),
                    *ta = cJSON_GetObjectItemCaseSensitive(rec, "task");
        if (!rec || !cJSON_IsString(me) || !cJSON_IsString(bu) || !cJSON_IsString(ta)) {
            cJSON_Delete(rec);
            free(text);
            run_free(r);
            return ERR("%s:%ld: not a kvbench result record", path, line);
        }
        char row[80];
        snprintf(row, sizeof row, "%s@%s", me->valuestring, bu->valuestring);
        cell *c = find_cell(r, row, ta->valuestring);
        c->n++;
        const cJSON *sc = cJSON_GetObjectItemCaseSensitive(rec, "score"), *e = cJSON_GetObjectItemCaseSensitive(rec, "error");
        if (cJSON_IsString(e)) c->errors++;
        if (cJSON_IsNumber(sc)) {
            if (c->n_scores == c->cap) {
                c->cap = c->cap ? 2 * c->cap : 16;
                c->scores = realloc(c->scores, (size_t)c->cap * sizeof *c->scores);
            }
            c->scores[c->n_scores++] = sc->valuedouble;
        }
        c->ttft += num(rec, "ttft_ms");
        c->decode += num(rec, "decode_ms_per_token");
        c->dev += num(rec, "kv_device_bytes");
        c->dev_end += num(rec, "kv_device_bytes_end");
        c->host += num(rec, "kv_host_bytes");
        c->full += num(rec, "kv_full_bytes");
        c->moved += num(rec, "moved_bytes");
        c->attended += num(rec, "attended_per_layer");
        cJSON_Delete(rec);
        p = nl + 1;
    }
    free(text);
    return 0;
}

/* ---- statistics ---- */

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double mean(const double *v, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += v[i];
    return n ? s / n : NAN;
}

/* half-width of the 95% percentile bootstrap interval of the mean */
static double boot_hw(const double *v, int n) {
    if (n < 2) return 0;
    enum { B = 1000 };
    double *m = malloc(B * sizeof *m);
    uint64_t st = 1;
    for (int b = 0; b < B; b++) {
        double s = 0;
        for (int i = 0; i < n; i++) s += v[splitmix(&st) % (uint64_t)n];
        m[b] = s / n;
    }
    qsort(m, B, sizeof *m, cmp_d);
    double hw = (m[(int)(0.975 * (B - 1))] - m[(int)(0.025 * (B - 1))]) / 2;
    free(m);
    return hw;
}

/* ---- tables ---- */

static int row_order(const char *a, const char *b) {
    int fa = !strncmp(a, "full@", 5) || !strncmp(a, "flash@", 6), fb = !strncmp(b, "full@", 5) || !strncmp(b, "flash@", 6);
    if (fa != fb) return fa ? -1 : 1;
    return strcmp(a, b);
}

typedef struct { char **v; int n; } names;

static void add_name(names *s, const char *x) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->v[i], x)) return;
    s->v = realloc(s->v, (size_t)(s->n + 1) * sizeof *s->v);
    s->v[s->n++] = strdup(x);
}

static void free_names(names *s) {
    for (int i = 0; i < s->n; i++) free(s->v[i]);
    free(s->v);
}

static void collect(run *r, names *rows, names *tasks) {
    memset(rows, 0, sizeof *rows);
    memset(tasks, 0, sizeof *tasks);
    for (int i = 0; i < r->n; i++) add_name(rows, r->c[i].row), add_name(tasks, r->c[i].task);
    for (int i = 0; i < rows->n; i++)
        for (int j = i + 1; j < rows->n; j++)
            if (row_order(rows->v[i], rows->v[j]) > 0) {
                char *t = rows->v[i];
                rows->v[i] = rows->v[j];
                rows->v[j] = t;
            }
}

static cell *get(run *r, const char *row, const char *task) {
    for (int i = 0; i < r->n; i++)
        if (!strcmp(r->c[i].row, row) && !strcmp(r->c[i].task, task)) return &r->c[i];
    return NULL;
}

static const char *full_row(const names *rows) {
    return rows->n && (!strncmp(rows->v[0], "full@", 5) || !strncmp(rows->v[0], "flash@", 6)) ? rows->v[0] : NULL;
}

static void main_table(run *r, FILE *f) {
    names rows, tasks;
    collect(r, &rows, &tasks);
    const char *full = full_row(&rows);
    fprintf(f, "| method@budget |");
    for (int t = 0; t < tasks.n; t++) fprintf(f, " %s |", tasks.v[t]);
    fprintf(f, " Avg |\n|---|");
    for (int t = 0; t <= tasks.n; t++) fprintf(f, "---|");
    fputc('\n', f);
    for (int i = 0; i < rows.n; i++) {
        fprintf(f, "| %s |", rows.v[i]);
        double avg = 0, favg = 0;
        int k = 0, fk = 0;
        for (int t = 0; t < tasks.n; t++) {
            cell *c = get(r, rows.v[i], tasks.v[t]), *fc = full ? get(r, full, tasks.v[t]) : NULL;
            if (!c || !c->n_scores) {
                fprintf(f, " - |");
                continue;
            }
            double m = 100 * mean(c->scores, c->n_scores), hw = 100 * boot_hw(c->scores, c->n_scores);
            avg += m, k++;
            if (fc && fc->n_scores && c != fc) {
                double fm = 100 * mean(fc->scores, fc->n_scores);
                favg += fm, fk++;
                fprintf(f, " %.1f ± %.1f (%+.1f) |", m, hw, m - fm);
            } else {
                fprintf(f, " %.1f ± %.1f |", m, hw);
            }
        }
        if (k && fk == k) fprintf(f, " %.1f (%+.1f) |\n", avg / k, avg / k - favg / fk);
        else if (k) fprintf(f, " %.1f |\n", avg / k);
        else fprintf(f, " - |\n");
    }
    free_names(&rows);
    free_names(&tasks);
}

static void efficiency_table(run *r, FILE *f) {
    names rows, tasks;
    collect(r, &rows, &tasks);
    const double MiB = 1024.0 * 1024.0;
    double full_dec = 0;
    fprintf(f, "| method@budget | samples | TTFT ms | decode ms/token | speedup vs full | KV device MiB (prefill / end) | %% of full | "
               "KV host MiB | moved MiB | attended/layer | errors |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < rows.n; i++) {
        cell a = {0};
        for (int t = 0; t < tasks.n; t++) {
            cell *c = get(r, rows.v[i], tasks.v[t]);
            if (!c) continue;
            a.n += c->n, a.errors += c->errors, a.ttft += c->ttft, a.decode += c->decode, a.dev += c->dev;
            a.dev_end += c->dev_end, a.host += c->host, a.full += c->full, a.moved += c->moved, a.attended += c->attended;
        }
        if (!a.n) continue;
        double dec = a.decode / a.n;
        if (i == 0 && full_row(&rows)) full_dec = dec;
        char sp[32] = "-";
        if (full_dec > 0 && dec > 0) snprintf(sp, sizeof sp, "%.2fx", full_dec / dec);
        fprintf(f, "| %s | %d | %.0f | %.2f | %s | %.2f / %.2f | %.1f | %.2f | %.2f | %.0f | %d |\n", rows.v[i], a.n, a.ttft / a.n,
                dec, sp, a.dev / a.n / MiB, a.dev_end / a.n / MiB, a.full > 0 ? 100 * a.dev / a.full : 0, a.host / a.n / MiB,
                a.moved / a.n / MiB, a.attended / a.n, a.errors);
    }
    free_names(&rows);
    free_names(&tasks);
}

static int write_csv(run *r, const char *dir, char *err, size_t err_len) {
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    const double MiB = 1024.0 * 1024.0;
#define ADD(...)                                                                  \
    do {                                                                          \
        int w = snprintf(buf + n, cap - n, __VA_ARGS__);                          \
        if (w >= 0 && (size_t)w >= cap - n) {                                     \
            cap = (cap + (size_t)w) * 2;                                          \
            buf = realloc(buf, cap);                                              \
            w = snprintf(buf + n, cap - n, __VA_ARGS__);                          \
        }                                                                         \
        n += (size_t)(w > 0 ? w : 0);                                             \
    } while (0)
    ADD("method_budget,task,n,n_scored,mean,ci95_low,ci95_high,errors,ttft_ms,decode_ms_per_token,kv_device_mib,"
        "kv_device_end_mib,kv_host_mib,moved_mib,attended_per_layer\n");
    for (int i = 0; i < r->n; i++) {
        cell *c = &r->c[i];
        double m = c->n_scores ? mean(c->scores, c->n_scores) : NAN, hw = boot_hw(c->scores, c->n_scores);
        ADD("%s,%s,%d,%d,%.6f,%.6f,%.6f,%d,%.3f,%.4f,%.4f,%.4f,%.4f,%.4f,%.1f\n", c->row, c->task, c->n, c->n_scores, m, m - hw,
            m + hw, c->errors, c->ttft / c->n, c->decode / c->n, c->dev / c->n / MiB, c->dev_end / c->n / MiB, c->host / c->n / MiB,
            c->moved / c->n / MiB, c->attended / c->n);
    }
#undef ADD
    char path[1200];
    snprintf(path, sizeof path, "%s/summary.csv", dir);
    int rc = kvb_write_file_atomic(path, buf, err, err_len);
    free(buf);
    return rc;
}

int kvb_table_write(const char *run_dir, char *err, size_t err_len) {
    run r;
    if (run_load(run_dir, &r, err, err_len)) return -1;
    int rc = write_csv(&r, run_dir, err, err_len);
    char path[1200];
    snprintf(path, sizeof path, "%s/report.md", run_dir);
    char *md = NULL;
    size_t mdn = 0;
    FILE *f = open_memstream(&md, &mdn);
    fprintf(f, "# kvbench report: %s\n\nModel sha256 %s. Scores x100, mean ± half-width of the 95%% bootstrap interval; "
               "(±d) = difference to full attention.\n\n## Scores\n\n", r.suite, r.model_sha);
    main_table(&r, f);
    fprintf(f, "\n## Efficiency (means over samples; KV measured in the run)\n\n");
    efficiency_table(&r, f);
    fclose(f);
    if (!rc) rc = kvb_write_file_atomic(path, md, err, err_len);
    free(md);
    run_free(&r);
    return rc;
}

int kvb_table_print_main(const char *run_dir, FILE *out, char *err, size_t err_len) {
    run r;
    if (run_load(run_dir, &r, err, err_len)) return -1;
    fprintf(out, "\n%s — scores x100 (mean ± 95%% CI, difference to full)\n\n", r.suite);
    main_table(&r, out);
    fprintf(out, "\n");
    efficiency_table(&r, out);
    fprintf(out, "\n(%s/report.md, %s/summary.csv)\n", run_dir, run_dir);
    run_free(&r);
    return 0;
}

int kvb_table_compare(const char *base_dir, const char *new_dir, double max_score_drop, double max_slowdown_pct,
                      double max_mem_growth_pct, int allow_mismatch, FILE *out, char *err, size_t err_len) {
    run a, b;
    if (run_load(base_dir, &a, err, err_len)) return -1;
    if (run_load(new_dir, &b, err, err_len)) {
        run_free(&a);
        return -1;
    }
    int rc = 0;
    if (!allow_mismatch && (strcmp(a.suite, b.suite) || strcmp(a.model_sha, b.model_sha))) {
        rc = ERR("runs differ: suite '%s' vs '%s', model %.12s vs %.12s (use --allow-mismatch)", a.suite, b.suite, a.model_sha,
                 b.model_sha);
        goto done;
    }
    fprintf(out, "| method@budget | task | score base | score new | Δ | decode ms base | new | Δ%% | KV MiB base | new | Δ%% | |\n"
                 "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    const double MiB = 1024.0 * 1024.0;
    int regressions = 0, only = 0;
    for (int i = 0; i < a.n; i++) {
        cell *ca = &a.c[i], *cb = get(&b, ca->row, ca->task);
        if (!cb) {
            fprintf(out, "| %s | %s | only in base | | | | | | | | | |\n", ca->row, ca->task);
            only++;
            continue;
        }
        double sa = ca->n_scores ? 100 * mean(ca->scores, ca->n_scores) : NAN, sb = cb->n_scores ? 100 * mean(cb->scores, cb->n_scores) : NAN;
        double da = ca->decode / ca->n, db = cb->decode / cb->n, ka = ca->dev / ca->n / MiB, kb = cb->dev / cb->n / MiB;
        int bad_s = isfinite(sa) && isfinite(sb) && sb < sa - max_score_drop;
        int bad_t = da > 0 && db > da * (1 + max_slowdown_pct / 100);
        int bad_m = ka > 0 && kb > ka * (1 + max_mem_growth_pct / 100);
        regressions += bad_s || bad_t || bad_m;
        fprintf(out, "| %s | %s | %.1f | %.1f | %+.1f%s | %.2f | %.2f | %+.1f%s | %.2f | %.2f | %+.1f%s | %s |\n", ca->row, ca->task, sa, sb,
                sb - sa, bad_s ? " ✗" : "", da, db, da > 0 ? 100 * (db - da) / da : 0, bad_t ? " ✗" : "", ka, kb,
                ka > 0 ? 100 * (kb - ka) / ka : 0, bad_m ? " ✗" : "", bad_s || bad_t || bad_m ? "regression" : "ok");
    }
    for (int i = 0; i < b.n; i++)
        if (!get(&a, b.c[i].row, b.c[i].task)) {
            fprintf(out, "| %s | %s | only in new | | | | | | | | | |\n", b.c[i].row, b.c[i].task);
            only++;
        }
    fprintf(out, "\n%d regression(s) beyond tolerance (score drop > %.1f points, slowdown > %.0f%%, KV growth > %.0f%%); "
                 "%d cell(s) in one run only\n", regressions, max_score_drop, max_slowdown_pct, max_mem_growth_pct, only);
    rc = regressions ? 1 : 0;
done:
    run_free(&a);
    run_free(&b);
    return rc;
}
