/* ratio_chart.h — the budget sweep as kvpress's leaderboard plots it: average score vs compression ratio, one
 * line per method, full attention as a dashed reference (score-vs-compression-ratio.svg beside report.md). */
#ifndef KVB_RATIO_CHART_H
#define KVB_RATIO_CHART_H

#include <stddef.h>

#include "reports/results.h"

/* The chart's SVG (malloc'd) for a summary: x = kvpress's compression ratio of each row's budget asked for
 * (1 - B/100 of a "B%" budget; token budgets have none), y = the row's Avg (mean of its task means, x100); a
 * series per method with at least 2 such rows; full attention as a horizontal line. NULL when no method has
 * 2 ratios (nothing to sweep) or out of memory (*oom set). */
char *kvb_ratio_chart_svg(const kvb_summary *s, int *oom);

/* Write RUN_DIR/score-vs-compression-ratio.svg for the summary: 1 written, 0 nothing to draw, -1 + err. */
int kvb_ratio_chart_write(const char *run_dir, const kvb_summary *s, char *err, size_t err_len);

#endif
