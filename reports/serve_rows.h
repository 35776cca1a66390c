/* serve_rows.h — the throughput rows of a suite's "serve" block (RUN_DIR/serve.jsonl, written by the runner through
 * benchmarks/serve_suite.h): a row per method@budget and KV pool size, beside the accuracy rows. `kvbench report`
 * writes them as RUN_DIR/serve.csv, a "Serving throughput" section of report.md and, with several pool sizes,
 * throughput-vs-pool.svg; `kvbench compare` diffs them (docs/serving.md). */
#ifndef KVB_SERVE_ROWS_H
#define KVB_SERVE_ROWS_H

#include <stddef.h>
#include <stdio.h>

/* One row; NAN = unavailable. */
typedef struct {
    char method[64], budget[32];
    double pool_mib;
    int requests, ok, failed, lost;
    double req_s, tok_s, ttft50, ttft90, ttft99, tpot50, tpot90, tpot99, mean_seqs, max_seqs, pool_mean;
} kvb_serve_rec;

/* RUN_DIR/serve.jsonl's rows (the last of a method@budget@pool kept): 0 with *rows malloc'd (n 0 and NULL when the
 * file is absent), or -1 + err naming the file and line of a malformed one. */
int kvb_serve_rows_load(const char *run_dir, kvb_serve_rec **rows, int *n, char *err, size_t err_len);
/* The Markdown section (a heading and a table; nothing when n is 0). */
void kvb_serve_rows_md(const kvb_serve_rec *rows, int n, FILE *f);
/* RUN_DIR/serve.csv, and RUN_DIR/throughput-vs-pool.svg when the rows hold several pool sizes: 1 when the chart was
 * written, 0 when not, -1 + err. Nothing is written when n is 0. */
int kvb_serve_rows_write(const char *run_dir, const kvb_serve_rec *rows, int n, char *err, size_t err_len);
/* out_dir/serve.jsonl as the inputs' serve.jsonl one after the other (complete lines; the last row of a cell wins
 * when read), written atomically; nothing when no input has one (kvbench merge: a sharded run's rows are shard 0's).
 * 0, or -1 + err. */
int kvb_serve_rows_merge(const char *out_dir, char *const *dirs, int n, char *err, size_t err_len);
/* The rows of new_dir against base_dir's, matched by method, budget and pool: output tokens/s and TTFT p50. A row
 * regresses when its output tokens/s falls below base / (1 + max_slowdown_pct/100), or it failed or lost requests
 * that base did not. Prints a section to out when either run has rows; returns the regressions, or -1 + err. */
int kvb_serve_rows_compare(const char *base_dir, const char *new_dir, double max_slowdown_pct, FILE *out, char *err,
                           size_t err_len);

#endif
