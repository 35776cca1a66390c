/* history.c — a suite's history over runs (history.h). Rows are matched by method@budget string, so a run
 * that lacks a row leaves a gap ("-" in the tables, a break in the line) rather than a zero. */
#include "reports/history.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fsutil.h"
#include "methods/method.h"
#include "reports/report.h"
#include "reports/results.h"
#include "reports/svg.h"

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)
#define N_MEASURES 3

static const char *const MEASURE[N_MEASURES] = {"score (x100, mean over tasks)", "decode ms/token", "device KV MiB (after prefill)"};

typedef struct {
    kvb_run run;
    kvb_summary sum;
    int order; /* position given on the command line */
} hrun;

typedef struct {
    char name[96]; /* method@budget */
    double *v;     /* [run * N_MEASURES + measure] */
} hrow;

/* history-<method>-<budget>.svg, each part made file-name safe. */
static void svg_name(const char *row, char *out, size_t cap) {
    char method[96], m_safe[128], b_safe[128];
    snprintf(method, sizeof method, "%s", row);
    char *at = strchr(method, '@');
    if (at) *at = 0;
    kvb_report_safe_name(method, m_safe, sizeof m_safe);
    kvb_report_safe_name(at ? at + 1 : "", b_safe, sizeof b_safe);
    snprintf(out, cap, "history-%s-%s.svg", m_safe, b_safe);
}

static int cmp_run(const void *a, const void *b) {
    const hrun *x = a, *y = b;
    int c = strcmp(x->run.created ? x->run.created : "", y->run.created ? y->run.created : "");
    return c ? c : x->order - y->order;
}

static double mean_of(const double *v, int n) {
    double s = 0;
    int k = 0;
    for (int i = 0; i < n; i++)
        if (isfinite(v[i])) s += v[i], k++;
    return k ? s / k : NAN;
}

/* The three measures of one method@budget row of a run (NAN when the run lacks the row). */
static void row_measures(const kvb_summary *s, const char *name, double out[N_MEASURES]) {
    for (int m = 0; m < N_MEASURES; m++) out[m] = NAN;
    for (int r = 0; r < s->n_rows; r++) {
        char rn[96];
        snprintf(rn, sizeof rn, "%s@%s", s->rows[r].method, s->rows[r].budget);
        if (strcmp(rn, name)) continue;
        double *acc = malloc((size_t)(3 * s->n_cols + 1) * sizeof *acc);
        if (!acc) return;
        for (int c = 0; c < s->n_cols; c++) {
            const kvb_cell *cell = kvb_summary_at(s, r, c);
            acc[c] = cell && cell->n_scored ? 100 * cell->mean : NAN;
            acc[s->n_cols + c] = cell ? cell->decode_ms_per_token : NAN;
            acc[2 * s->n_cols + c] = cell ? cell->kv_device_mib : NAN;
        }
        for (int m = 0; m < N_MEASURES; m++) out[m] = mean_of(acc + m * s->n_cols, s->n_cols);
        free(acc);
        return;
    }
}

static void cell_val(FILE *f, double v, int decimals) {
    if (isfinite(v)) fprintf(f, " %.*f |", decimals, v);
    else fputs(" - |", f);
}

static char *history_md(const hrun *runs, int n, const hrow *rows, int n_rows) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    fprintf(f, "# History of suite %s\n\n", runs[0].run.suite ? runs[0].run.suite : "?");
    fputs("| run | date | commit | host | directory |\n|---|---|---|---|---|\n", f);
    for (int i = 0; i < n; i++)
        fprintf(f, "| %d | %s | %s | %s | %s |\n", i + 1, runs[i].run.created ? runs[i].run.created : "?",
                runs[i].run.git_commit ? runs[i].run.git_commit : "?", runs[i].run.host ? runs[i].run.host : "?", runs[i].run.dir);
    static const int DEC[N_MEASURES] = {1, 2, 2};
    for (int m = 0; m < N_MEASURES; m++) {
        fprintf(f, "\n## %s\n\n| method@budget |", MEASURE[m]);
        for (int i = 0; i < n; i++) fprintf(f, " %d |", i + 1);
        fputs(" last change |\n|---|", f);
        for (int i = 0; i <= n; i++) fputs("---:|", f);
        fputc('\n', f);
        for (int r = 0; r < n_rows; r++) {
            fprintf(f, "| %s |", rows[r].name);
            for (int i = 0; i < n; i++) cell_val(f, rows[r].v[i * N_MEASURES + m], DEC[m]);
            /* the last run against the one before it: where a nightly page says something moved */
            double a = n > 1 ? rows[r].v[(n - 2) * N_MEASURES + m] : NAN, b = rows[r].v[(n - 1) * N_MEASURES + m];
            if (isfinite(a) && isfinite(b)) fprintf(f, " %+.*f |\n", DEC[m], b - a);
            else fputs(" - |\n", f);
        }
    }
    fputs("\nCharts: ", f);
    for (int r = 0; r < n_rows; r++) {
        char file[300];
        svg_name(rows[r].name, file, sizeof file);
        fprintf(f, "%s[%s](%s)", r ? ", " : "", rows[r].name, file);
    }
    fputc('\n', f);
    if (fclose(f)) { free(buf); return NULL; }
    return buf;
}

/* Three line charts stacked in one SVG document: each chart's root <svg> is nested at its offset. */
static char *row_svg(const hrun *runs, int n, const hrow *row) {
    double *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = x && y ? open_memstream(&buf, &len) : NULL;
    if (!f) { free(x), free(y); return NULL; }
    const int w = 820, h = 480;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\">\n", w, h * N_MEASURES, w,
            h * N_MEASURES);
    int ok = 1;
    for (int m = 0; m < N_MEASURES && ok; m++) {
        for (int i = 0; i < n; i++) x[i] = i + 1, y[i] = row->v[i * N_MEASURES + m];
        char title[200], xl[200];
        snprintf(title, sizeof title, "%s: %s", row->name, MEASURE[m]);
        snprintf(xl, sizeof xl, "run (1 = oldest, %s .. %s; dates and commits in history.md)",
                 runs[0].run.git_commit ? runs[0].run.git_commit : "?", runs[n - 1].run.git_commit ? runs[n - 1].run.git_commit : "?");
        kvb_svg_series s = {row->name, x, y, n, NAN};
        kvb_svg_chart c = {title, xl, MEASURE[m], 0, 0.5, n + 0.5, m == 0 ? 0 : NAN, m == 0 ? 100 : NAN, &s, 1};
        char *chart = kvb_svg_line_chart(&c);
        ok = chart && !strncmp(chart, "<svg ", 5);
        if (ok) fprintf(f, "<svg y=\"%d\" %s", m * h, chart + 5);
        free(chart);
    }
    fputs("</svg>\n", f);
    free(x), free(y);
    if (fclose(f) || !ok) { free(buf); return NULL; }
    return buf;
}

int kvb_history_write(const char *out_dir, char *const *dirs, int n, char *err, size_t err_len) {
    if (n < 1) return ERR("give at least one run directory");
    hrun *runs = calloc((size_t)n, sizeof *runs);
    hrow *rows = NULL;
    int n_rows = 0, rc = -1;
    if (!runs) return ERR("out of memory");
    for (int i = 0; i < n; i++) {
        runs[i].order = i;
        if (kvb_run_load(dirs[i], &runs[i].run, err, err_len) || kvb_summary_build(&runs[i].run, &runs[i].sum, err, err_len)) goto done;
    }
    qsort(runs, (size_t)n, sizeof *runs, cmp_run);
    for (int i = 0; i < n; i++)
        for (int r = 0; r < runs[i].sum.n_rows; r++) {
            char name[96];
            snprintf(name, sizeof name, "%s@%s", runs[i].sum.rows[r].method, runs[i].sum.rows[r].budget);
            int seen = 0;
            for (int k = 0; k < n_rows && !seen; k++) seen = !strcmp(rows[k].name, name);
            if (seen) continue;
            hrow *nr = realloc(rows, (size_t)(n_rows + 1) * sizeof *nr);
            if (!nr) { ERR("out of memory"); goto done; }
            rows = nr;
            memset(&rows[n_rows], 0, sizeof *rows);
            snprintf(rows[n_rows].name, sizeof rows[n_rows].name, "%s", name);
            if (!(rows[n_rows++].v = malloc((size_t)n * N_MEASURES * sizeof(double)))) { ERR("out of memory"); goto done; }
        }
    for (int r = 0; r < n_rows; r++)
        for (int i = 0; i < n; i++) row_measures(&runs[i].sum, rows[r].name, rows[r].v + i * N_MEASURES);
    if (kvb_mkdirs(out_dir)) { ERR("cannot create %s: %s", out_dir, strerror(errno)); goto done; }
    char *md = history_md(runs, n, rows, n_rows), *path = kvb_path_join(out_dir, "history.md");
    int wrc = md && path ? kvb_write_file_atomic(path, md, err, err_len) : ERR("out of memory");
    free(md), free(path);
    if (wrc) goto done;
    for (int r = 0; r < n_rows; r++) {
        char file[300];
        svg_name(rows[r].name, file, sizeof file);
        char *svg = row_svg(runs, n, &rows[r]);
        if (!svg) { ERR("out of memory"); goto done; }
        path = kvb_path_join(out_dir, file);
        wrc = path ? kvb_write_file_atomic(path, svg, err, err_len) : ERR("out of memory");
        free(svg), free(path);
        if (wrc) goto done;
    }
    rc = 0;
done:
    for (int i = 0; i < n; i++) kvb_summary_free(&runs[i].sum), kvb_run_free(&runs[i].run);
    for (int r = 0; r < n_rows; r++) free(rows[r].v);
    free(rows);
    free(runs);
    return rc;
}
