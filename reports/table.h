/* table.h — a run's records summarised: summary.csv and report.md (paper-style score table with deltas to
 * full and mean +- 95% bootstrap half-width, and an efficiency table), and the comparison of two runs that
 * nightly jobs gate on. */
#ifndef KVB_TABLE_H
#define KVB_TABLE_H

#include <stdio.h>

/* Read RUN_DIR/results.jsonl and write RUN_DIR/summary.csv and RUN_DIR/report.md. -1 + "path:line: ..." on a
 * malformed record (a torn last line is skipped). */
int kvb_table_write(const char *run_dir, char *err, size_t err_len);
/* Print the main score table (Markdown) of a run. */
int kvb_table_print_main(const char *run_dir, FILE *out, char *err, size_t err_len);
/* Markdown diff per (method, budget, task): 0 = no regression, 1 = regression beyond a tolerance, -1 = error
 * (unreadable runs, different suites or models unless allow_mismatch). max_score_drop in points (x100 scale),
 * slowdown and memory growth in percent. */
int kvb_table_compare(const char *base_dir, const char *new_dir, double max_score_drop, double max_slowdown_pct,
                      double max_mem_growth_pct, int allow_mismatch, FILE *out, char *err, size_t err_len);

#endif
