/* compare.c — a run against a baseline (see compare.h). Cells are matched by (method, budget, task) and
 * listed in the baseline's table order; a value missing on either side is shown "-" and never counts as a
 * slowdown or a memory growth. Thresholds get 1e-9 of slack so a change of exactly the tolerance passes. */
#include "reports/compare.h"

#include <math.h>
#include <string.h>

#include "reports/results.h"
#include "reports/serve_rows.h"

#define ERR(...) (snprintf(err, err_len, __VA_ARGS__), -1)

typedef struct { double drop, slow_pct, mem_pct; } tolerances;

static int same(const char *a, const char *b) { return !strcmp(a ? a : "", b ? b : ""); }

static int refuse_mismatch(const kvb_run *a, const kvb_run *b, char *err, size_t err_len) {
    char sa[96], sb[96];
    if (!same(a->suite, b->suite))
        return ERR("runs of different suites: '%s' (%s/run.json) vs '%s' (%s/run.json); pass allow_mismatch "
                   "(kvbench compare --allow-mismatch) to compare them anyway",
                   kvb_str_shown(a->suite ? a->suite : "?", sa, sizeof sa), a->dir, kvb_str_shown(b->suite ? b->suite : "?", sb, sizeof sb), b->dir);
    if (!same(a->model_sha256, b->model_sha256))
        return ERR("runs of different models: sha256 %.16s (%s/run.json) vs %.16s (%s/run.json); pass allow_mismatch "
                   "(kvbench compare --allow-mismatch) to compare them anyway",
                   a->model_sha256 ? a->model_sha256 : "?", a->dir, b->model_sha256 ? b->model_sha256 : "?", b->dir);
    return 0;
}

/* Markdown-safe text: '|' escaped, newlines flattened. */
static void md(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '|') fputs("\\|", f);
        else fputc(*s == '\n' || *s == '\r' ? ' ' : *s, f);
    }
}

/* "+1.0" / "−2.1" with a unit suffix, or "-" when not finite. */
static void signed_num(FILE *f, double d, const char *unit) {
    if (!isfinite(d)) {
        fputc('-', f);
        return;
    }
    double r = round(d * 10) / 10;
    if (r < 0) fprintf(f, "\u2212%.1f%s", -r, unit);
    else fprintf(f, "+%.1f%s", r + 0.0, unit);
}

static void value(FILE *f, const char *fmt, double v) {
    if (isfinite(v)) fprintf(f, fmt, v);
    else fputc('-', f);
}

static double growth_pct(double base, double cur) { return isfinite(base) && base > 0 && isfinite(cur) ? 100 * (cur / base - 1) : NAN; }

/* One diff row; returns 1 when the cell regressed. */
static int diff_row(const kvb_cell *a, const kvb_cell *b, const tolerances *t, FILE *f) {
    double sa = a->n_scored ? 100 * a->mean : NAN, sb = b->n_scored ? 100 * b->mean : NAN;
    double dt = growth_pct(a->decode_ms_per_token, b->decode_ms_per_token), dm = growth_pct(a->kv_device_mib, b->kv_device_mib);
    int bad_score = (a->n_scored && !b->n_scored) || (isfinite(sa) && isfinite(sb) && sb < sa - t->drop - 1e-9);
    int bad_time = isfinite(dt) && dt > t->slow_pct + 1e-9, bad_mem = isfinite(dm) && dm > t->mem_pct + 1e-9;
    fputs("| ", f), md(f, a->method), fputc('@', f), md(f, a->budget), fputs(" | ", f), md(f, a->task), fputs(" | ", f);
    value(f, "%.1f", sa), fputs(" | ", f), value(f, "%.1f", sb), fputs(" | ", f), signed_num(f, sb - sa, "");
    fputs(bad_score ? " ✗ | " : " | ", f);
    value(f, "%.2f", a->decode_ms_per_token), fputs(" | ", f), value(f, "%.2f", b->decode_ms_per_token), fputs(" | ", f);
    signed_num(f, dt, "%"), fputs(bad_time ? " ✗ | " : " | ", f);
    value(f, "%.2f", a->kv_device_mib), fputs(" | ", f), value(f, "%.2f", b->kv_device_mib), fputs(" | ", f);
    signed_num(f, dm, "%"), fputs(bad_mem ? " ✗ |\n" : " |\n", f);
    return bad_score || bad_time || bad_mem;
}

/* Cells of `have` that `other` lacks, as a bullet list; returns how many. */
static int only_in(const kvb_summary *have, const kvb_summary *other, const char *label, FILE *f) {
    int n = 0;
    for (int i = 0; i < have->n_rows; i++)
        for (int j = 0; j < have->n_cols; j++) {
            const kvb_cell *c = kvb_summary_at(have, i, j);
            if (!c || kvb_summary_find(other, c->method, c->budget, c->task)) continue;
            if (!n++) fprintf(f, "\nOnly in %s:\n\n", label);
            fputs("- ", f), md(f, c->method), fputc('@', f), md(f, c->budget), fputc(' ', f), md(f, c->task);
            fputs(" (", f), md(f, c->benchmark), fputs(")\n", f);
        }
    return n;
}

/* How many cells of a there are (*n_a) and how many of them b has too. */
static int n_matched(const kvb_summary *a, const kvb_summary *b, int *n_a) {
    int n = 0;
    *n_a = 0;
    for (int i = 0; i < a->n_rows; i++)
        for (int j = 0; j < a->n_cols; j++) {
            const kvb_cell *c = kvb_summary_at(a, i, j);
            if (c) ++*n_a, n += kvb_summary_find(b, c->method, c->budget, c->task) != NULL;
        }
    return n;
}

static int diff(const kvb_run *ra, const kvb_summary *a, const kvb_run *rb, const kvb_summary *b, const tolerances *t, FILE *f) {
    char sa[96], sb[96];
    fprintf(f, "## kvbench compare\n\nbase: %s (suite %s, commit %s)  \nnew: %s (suite %s, commit %s)\n\n", ra->dir,
            kvb_str_shown(ra->suite ? ra->suite : "?", sa, sizeof sa), ra->git_commit ? ra->git_commit : "?", rb->dir,
            kvb_str_shown(rb->suite ? rb->suite : "?", sb, sizeof sb), rb->git_commit ? rb->git_commit : "?");
    fputs("| method@budget | task | score base | score new | Δ score | decode ms/token base | new | Δ | KV device MiB base "
          "| new | Δ |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n", f);
    int bad = 0, matched = 0;
    for (int i = 0; i < a->n_rows; i++)
        for (int j = 0; j < a->n_cols; j++) {
            const kvb_cell *ca = kvb_summary_at(a, i, j), *cb = ca ? kvb_summary_find(b, ca->method, ca->budget, ca->task) : NULL;
            if (cb) bad += diff_row(ca, cb, t, f), matched++;
        }
    only_in(a, b, "base", f);
    only_in(b, a, "new", f);
    if (bad) fprintf(f, "\n%d regression(s), marked ✗, in %d matched cell(s)", bad, matched);
    else fprintf(f, "\nNo regression in %d matched cell(s)", matched);
    fprintf(f, " (tolerances: score drop %.1f points, decode slowdown %.1f%%, device KV growth %.1f%%).\n", t->drop,
            t->slow_pct, t->mem_pct);
    return bad ? 1 : 0;
}

int kvb_compare(const char *base_dir, const char *new_dir, double max_score_drop, double max_slowdown_pct,
                double max_mem_growth_pct, int allow_mismatch, FILE *out, char *err, size_t err_len) {
    kvb_run ra, rb;
    kvb_summary a, b;
    memset(&a, 0, sizeof a), memset(&b, 0, sizeof b);
    if (kvb_run_load(base_dir, &ra, err, err_len)) return -1;
    int rc = kvb_run_load(new_dir, &rb, err, err_len);
    if (!rc && !allow_mismatch) rc = refuse_mismatch(&ra, &rb, err, err_len);
    if (!rc) rc = kvb_summary_build(&ra, &a, err, err_len);
    if (!rc) rc = kvb_summary_build(&rb, &b, err, err_len);
    int n_base = 0;
    /* a new run that holds none of the base's cells (killed before its first record, another --limit) is no pass */
    if (!rc && n_matched(&a, &b, &n_base) == 0 && n_base > 0)
        rc = ERR("%s has none of the %d cell(s) of %s (no records of them): nothing to compare", new_dir, n_base,
                 base_dir);
    tolerances t = {max_score_drop, max_slowdown_pct, max_mem_growth_pct};
    if (!rc) rc = diff(&ra, &a, &rb, &b, &t, out);
    if (rc >= 0) { /* a suite's "serve" rows (serve_rows.h): output tokens/s gated by the decode slowdown tolerance */
        int serve_bad = kvb_serve_rows_compare(base_dir, new_dir, max_slowdown_pct, out, err, err_len);
        rc = serve_bad < 0 ? -1 : serve_bad > 0 ? 1 : rc;
    }
    kvb_summary_free(&a), kvb_summary_free(&b);
    kvb_run_free(&ra), kvb_run_free(&rb);
    return rc;
}
