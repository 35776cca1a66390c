/* report.h — a run directory's report: RUN_DIR/summary.csv (one row per method, budget, benchmark and
 * task), RUN_DIR/report.md (paper-style score table with 95% bootstrap intervals and deltas to full
 * attention, efficiency table, LongMemEval by question type, LongBench-E length bins, NIAH heatmaps,
 * error counts) and the SVG charts it links (niah-<method>-<budget>.svg, accuracy-vs-budget.svg,
 * latency-vs-context.svg). Every file is written to NAME.tmp, fsynced and renamed. */
#ifndef KVB_REPORT_H
#define KVB_REPORT_H

#include <stddef.h>
#include <stdio.h>

#include "reports/results.h"

/* Read RUN_DIR and write its summary.csv, report.md and charts. 0, or -1 + err ("path:LINE: why" for a
 * malformed record). */
int kvb_report_write(const char *run_dir, char *err, size_t err_len);
/* Read RUN_DIR and print its main score table and efficiency table (Markdown) to out. 0 or -1 + err. */
int kvb_report_print_main(const char *run_dir, FILE *out, char *err, size_t err_len);

/* The main score table of a summarised run: rows method@budget, a column per task, Avg. */
void kvb_report_main_table(const kvb_summary *s, FILE *out);
/* The efficiency table: TTFT, decode ms/token, device KV, % of full, host KV, moved, decode speedup. */
void kvb_report_efficiency_table(const kvb_run *run, const kvb_summary *s, FILE *out);
/* summary.csv's text (malloc'd), or NULL when out of memory. */
char *kvb_report_csv(const kvb_summary *s);
/* A file-name-safe form of name: [A-Za-z0-9._-] kept, '%' -> "pct", anything else -> '_', no leading '.'. */
void kvb_report_safe_name(const char *name, char *out, size_t cap);

#endif
