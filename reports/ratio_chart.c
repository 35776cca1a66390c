/* ratio_chart.c — average score vs compression ratio, one line per method (ratio_chart.h). The report's
 * accuracy-vs-budget.svg places rows at the KV they held, measured; this chart places them at the ratio asked,
 * as kvpress's leaderboard does, so the two plots can be laid side by side. */
#include "reports/ratio_chart.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/fsutil.h"
#include "kernels/backend.h" /* kvb_errf */
#include "reports/svg.h"

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

/* A row's Avg: the mean of its task means x100 (report.md's Avg column), NAN when no task scored. */
static double avg_of(const kvb_summary *s, int row) {
    double sum = 0;
    int n = 0;
    for (int j = 0; j < s->n_cols; j++) {
        const kvb_cell *c = kvb_summary_at(s, row, j);
        if (c && c->n_scored) sum += 100 * c->mean, n++;
    }
    return n ? sum / n : NAN;
}

/* The compression ratio of a row's budget, NAN when it has none (full, tokens) or no score. */
static double ratio_of(const kvb_summary *s, int row) {
    double pct;
    if (row == s->ref_row || kvb_row_is_full(&s->rows[row])) return NAN;
    if (kvb_rbudget_parse(s->rows[row].budget, &pct) != KVB_RB_PERCENT || !isfinite(avg_of(s, row))) return NAN;
    return 1.0 - pct / 100.0;
}

char *kvb_ratio_chart_svg(const kvb_summary *s, int *oom) {
    *oom = 0;
    int n = s->n_rows;
    kvb_svg_series *se = calloc((size_t)n + 1, sizeof *se);
    double *x = malloc(((size_t)n + 1) * sizeof *x), *y = malloc(((size_t)n + 1) * sizeof *y);
    char *svg = NULL;
    if (!se || !x || !y) {
        *oom = 1;
        goto out;
    }
    int n_se = 0, n_pts = 0, swept = 0;
    if (s->ref_row >= 0 && isfinite(avg_of(s, s->ref_row)))
        se[n_se++] = (kvb_svg_series){"full (reference)", NULL, NULL, 0, avg_of(s, s->ref_row)};
    for (int i = 0; i < n; i++) {
        if (!isfinite(ratio_of(s, i))) continue;
        int seen = 0;
        for (int k = 0; k < n_se && !seen; k++) seen = se[k].n && !strcmp(se[k].name, s->rows[i].method);
        if (seen) continue;
        kvb_svg_series *c = &se[n_se];
        *c = (kvb_svg_series){s->rows[i].method, x + n_pts, y + n_pts, 0, NAN};
        for (int r = i; r < n; r++) { /* every row of the method, inserted by ratio: the line runs left to right */
            double rx = ratio_of(s, r);
            if (!isfinite(rx) || strcmp(s->rows[r].method, c->name)) continue;
            int at = c->n++;
            for (; at > 0 && x[n_pts + at - 1] > rx; at--) x[n_pts + at] = x[n_pts + at - 1], y[n_pts + at] = y[n_pts + at - 1];
            x[n_pts + at] = rx, y[n_pts + at] = avg_of(s, r);
        }
        n_pts += c->n, n_se++;
        if (c->n >= 2) swept = 1;
    }
    if (swept) {
        kvb_svg_chart ch = {"Score vs compression ratio (kvpress's leaderboard plot)",
                            "compression ratio (share of the prompt's KV removed, as asked)", "Avg score (x100)", 0, 0, 1,
                            0, 100, se, n_se};
        if (!(svg = kvb_svg_line_chart(&ch))) *oom = 1;
    }
out:
    free(se), free(x), free(y);
    return svg;
}

int kvb_ratio_chart_write(const char *run_dir, const kvb_summary *s, char *err, size_t err_len) {
    int oom;
    char *svg = kvb_ratio_chart_svg(s, &oom);
    if (!svg) return oom ? ERR("%s: out of memory", run_dir) : 0;
    char *path = kvb_path_join(run_dir, "score-vs-compression-ratio.svg");
    int rc = path ? kvb_write_file_atomic(path, svg, err, err_len) : ERR("%s: out of memory", run_dir);
    free(svg), free(path);
    return rc ? -1 : 1;
}
