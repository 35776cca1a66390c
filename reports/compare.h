/* compare.h — a run against a baseline run, per (method, budget, task) cell: a Markdown diff of score,
 * decode ms/token and device KV, and a verdict nightly jobs gate on. */
#ifndef KVB_COMPARE_H
#define KVB_COMPARE_H

#include <stddef.h>
#include <stdio.h>

/* Compare new_dir against base_dir and print the diff to out. A cell regresses when its mean score falls
 * below base's by more than max_score_drop points (x100 scale), or had scores in base and has none now; when
 * its decode ms/token exceeds base x (1 + max_slowdown_pct/100); or when its device KV after prefill exceeds
 * base x (1 + max_mem_growth_pct/100). A suite's "serve" rows (reports/serve_rows.h) are diffed too: one regresses
 * when its output tokens/s falls below base / (1 + max_slowdown_pct/100) or it failed requests base did not. Runs
 * of different suites or models (run.json "suite",
 * "model_sha256") are refused unless allow_mismatch. 0 = no regression, 1 = regression(s), -1 = error. */
int kvb_compare(const char *base_dir, const char *new_dir, double max_score_drop, double max_slowdown_pct,
                double max_mem_growth_pct, int allow_mismatch, FILE *out, char *err, size_t err_len);

#endif
