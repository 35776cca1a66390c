/* results.h — a run directory's records in memory: RUN_DIR/run.json (provenance) and RUN_DIR/results.jsonl
 * (one record per method, budget, benchmark, task and sample), and those records grouped into the cells
 * the report and the comparison are made of. Loading never skips a record silently: a malformed line is an
 * error naming the file and line; only a last line without its '\n' (a record cut by a crash, which the
 * runner also drops when it resumes) is ignored, and counted.
 *
 * One reader (kvb_results_open/next) reads results.jsonl for every command: the runner's resume, report,
 * compare, history and merge, so a file one of them accepts is accepted by all, record for record. Its rules:
 * the file is a regular file (a FIFO is refused, not waited on); each line is one JSON object, a kvb_record
 * as reports/record.h reads it (its fields only, each once and of its type, the required ones present, a score
 * in [0, 1]), every number in it, nested ones too, finite; a NUL
 * byte anywhere in a line is an error (it used to end the file early for some readers); a line of only
 * whitespace is skipped; a last line without its '\n' is torn: not a record, counted. Every error is one line
 * "PATH:LINE: why". */
#ifndef KVB_RESULTS_H
#define KVB_RESULTS_H

#include <stddef.h>
#include <stdio.h>

#include "base/text.h" /* kvb_str_shown, for the names a report prints */
#include "reports/record.h" /* kvb_record: the fields of a line, written and read from one table */

struct cJSON;

/* An open results.jsonl (see the rules above). */
typedef struct {
    FILE *f;
    const char *path;
    char *line;
    size_t cap;
    long line_no;  /* 1-based number of the line last read */
    long good_end; /* byte offset just past the last whole line read */
    int n_torn;    /* 1 when the file ends in a line without its '\n' (not a record) */
    int lean;      /* leave out the BULK fields (prediction, answers, ...: record.h) */
} kvb_results_reader;

/* Open path; 0, or -1 + "PATH: cannot open: why" (errno ENOENT when it does not exist) or "PATH: is a FIFO,
 * not a regular file". */
int kvb_results_open(kvb_results_reader *r, const char *path, char *err, size_t err_len);
/* The next record: 1 = *rec filled (kvb_record_free it) and, when json is not NULL, *json = the line parsed
 * (caller deletes); 0 = end of file (n_torn, good_end final); -1 = error "PATH:LINE: why". The record has every
 * field unless r->lean (set after open), which keeps the fields a report needs and checks the others. */
int kvb_results_next(kvb_results_reader *r, kvb_record *rec, struct cJSON **json, char *err, size_t err_len);
void kvb_results_close(kvb_results_reader *r);

/* A loaded run directory. run.json strings are NULL when absent. */
typedef struct {
    char *dir;
    char *suite, *model, *model_sha256, *git_commit, *host, *backend, *flags, *created;
    kvb_record *rec;
    size_t n_rec;
    int n_torn; /* a last line without '\n' (cut by a crash), ignored */
    /* records of cells RUN_DIR/plan.jsonl (the cells the run planned) does not have: kept, counted, the first
     * few named in unplanned ("method@budget benchmark/task #id, ..."); 0 and NULL when there is no plan */
    size_t n_unplanned;
    char *unplanned;
    /* run.json's "host_load" sessions (benchmarks/hostload.h): 0 sessions when absent (older runs) */
    int n_load_sessions, cpus, threads; /* cpus, threads: the largest of any session */
    double load_start, load_max;        /* 1-minute load average: the first session's start; the largest seen; NAN if none */
} kvb_run;

/* Load RUN_DIR/run.json, RUN_DIR/results.jsonl and, when present, RUN_DIR/plan.jsonl (to find records of
 * cells the run never planned). 0, or -1 + "path:LINE: why" (run is then empty). */
int kvb_run_load(const char *run_dir, kvb_run *run, char *err, size_t err_len);
/* Release everything a loaded run owns (safe on a zeroed or failed run). */
void kvb_run_free(kvb_run *run);

/* Budget kinds, in the order rows are shown: full, % of the full KV, tokens per layer and head, other. */
typedef enum { KVB_RB_FULL, KVB_RB_PERCENT, KVB_RB_TOKENS, KVB_RB_OTHER } kvb_rbudget_kind;
/* Classify a budget string ("full", "30%", "1024"); *value gets the percent or token count. */
kvb_rbudget_kind kvb_rbudget_parse(const char *budget, double *value);

/* A (method, budget, benchmark, task) cell: its records and their aggregates. Cost means skip samples that
 * failed (error set) and fields they lack; timings count only when > 0. NAN where nothing counted. */
typedef struct {
    const char *method, *budget, *benchmark, *task; /* borrowed from the run */
    int row, col;         /* indices into kvb_summary.rows / .cols */
    size_t *rec, n;       /* the cell's records (indices into run->rec, run order, duplicates dropped) */
    double *scores;       /* the n_scored scores, in record order */
    size_t n_scored;
    double mean, ci_lo, ci_hi; /* score in [0, 1] with its 95% bootstrap interval (stats.h) */
    int judge_errors, sample_errors;
    double ttft_ms, decode_ms_per_token, attended_per_layer;
    double kv_device_mib, kv_device_end_mib, kv_host_mib, kv_full_mib, moved_mib;
} kvb_cell;

/* A method@budget row. kv_device_pct: the device KV it really held after prefill, % of full attention's KV
 * (mean over the samples that ran, from the records' measured bytes); NAN when no record measured it. Rows
 * are labelled and plotted by it: a budget is what was asked, this is what was held. */
typedef struct { const char *method, *budget; double kv_device_pct; } kvb_row;
typedef struct { const char *benchmark, *task; } kvb_col;    /* a task column */

/* A run's cells on a grid: rows ordered full-attention reference first, then by budget (% ascending, then
 * tokens), then by first appearance; columns grouped by benchmark in order of first appearance. */
typedef struct {
    kvb_row *rows;
    kvb_col *cols;
    kvb_cell *cells;
    kvb_cell **grid; /* n_rows x n_cols, NULL where the run has no such cell */
    int n_rows, n_cols, n_cells;
    int ref_row;         /* the full-attention row deltas are taken against, -1 when none */
    size_t n_duplicates; /* records repeating an earlier (method, budget, benchmark, task, sample_id): last kept */
} kvb_summary;

/* Group a loaded run into cells and compute each cell's statistics. 0, or -1 + err (out of memory). */
int kvb_summary_build(const kvb_run *run, kvb_summary *s, char *err, size_t err_len);
/* Release a summary (safe on a zeroed one). */
void kvb_summary_free(kvb_summary *s);
/* The cell at (row, col), or NULL. */
const kvb_cell *kvb_summary_at(const kvb_summary *s, int row, int col);
/* The cell for (method, budget, task) in any benchmark, or NULL. */
const kvb_cell *kvb_summary_find(const kvb_summary *s, const char *method, const char *budget, const char *task);
/* 1 if the row is full attention (method full/flash, or budget "full"). */
int kvb_row_is_full(const kvb_row *row);

#endif
