/* runner.h — the suite runner: (method x budget x task x sample) cells from a suite JSON, run on one engine
 * with one shared exact prefill per sample, scored, and appended as crash-safe JSONL records.
 *
 * Suite JSON (files in configs/):
 *   {"name": "quick", "model": "default", "output": "runs/quick", "seed": 1, "round_chunk": 512,
 *    "methods": [{"name": "full"}, {"name": "round", "opts": {"lw": 10}}, ...] (or "all": every registered method,
 *    default options; "all" in the list: those it does not name otherwise; benchmarks/suitecheck.h),
 *    "budgets": ["30%"],
 *    "benchmarks": [
 *      {"type": "2stage", "samples": 40, "min_pairs": 40, "max_pairs": 200, "cot": false},
 *      {"type": "niah", "lengths": [1000, 4000, 8000], "depths": [0, 25, 50, 75, 100], "haystack": null},
 *      {"type": "recall", "dialogues": 20, "rounds": 12},
 *      {"type": "longbench", "data_dir": "...", "config_dir": "...", "tasks": [...], "limit": 5, "e": false},
 *      {"type": "longmemeval", "path": "...", "limit": 5},
 *      {"type": "sharegpt", "path": "...", "limit": 5},
 *      {"type": "ruler", "lengths": [4096], "samples": 25, "tasks": [...], "haystack": "...", "words_dir": "...",
 *       "squad": "...", "hotpotqa": "..."} (benchmarks/ruler.h; tasks named "<task>_<length>"),
 *      {"type": "infinitebench", "tasks": ["passkey", "number_string", "kv_retrieval"], "lengths": [4096],
 *       "samples": 20} (benchmarks/infbench.h, synth_suite.h)],
 *    "judge": {"base_url": "http://127.0.0.1:8080/v1", "model": "default", ...} (benchmarks/judging.h),
 *    "optional": a benchmark with "optional": true is skipped (with a line saying so) when its data is absent,
 *    "calibration": {"samples": 4, "rounds": 12} (optional: the synthetic dialogues of the calibrations the run
 *    makes, benchmarks/runcal.h; default `kvbench calibrate`'s)}
 * longmemeval and sharegpt are scored by the judge; niah too with "judge": true on it.
 * Any benchmark may set "max_new_tokens" to cap generation below the official length, and "question": "hidden"
 * (default "visible") to compress the context before the question is prefilled (benchmarks/hidden.h; its tasks
 * are named "<task>+hidden"); then the questions of a context group (ruler "per_query": true, infinitebench
 * "queries_per_context": K) share one prefill of their context (benchmarks/shared_prefill.h), and the records say
 * "context_group" and "shared_prefill": "first" (its prefill figures hold the context's) or "reused".
 * `full` runs once at budget "full"; every other method runs at every budget. Paths may start with "~/"
 * or "$KVB_DATA/". The suite is read strictly (benchmarks/suitecheck.h): a malformed key, an unknown method
 * option or one cell twice is a one-line error before anything is written. */
#ifndef KVB_RUNNER_H
#define KVB_RUNNER_H

#include <stdio.h>

#include "benchmarks/shard.h"
#include "engine/model.h"

typedef struct {
    const char *suite_path;
    const char *out_dir;   /* NULL = the suite's "output" */
    const char *model;     /* NULL = the suite's "model" */
    int limit;             /* > 0: at most this many samples per task */
    const char *methods;   /* comma list filter, NULL = all of the suite's */
    const char *budgets;   /* comma list replacing the suite's budgets, NULL = keep */
    int n_threads;
    int quiet;             /* no progress line */
    int profile;           /* time the phases into the records' "breakdown" (--profile; on a GPU each phase then waits
                            * for the device inside the timed decode, so without it the run times decode as
                            * `kvbench bench` does) */
    const char *argv_line; /* recorded in run.json */
    const char *judge_url, *judge_model, *judge_key_env; /* override the suite's "judge" (benchmarks/judging.h) */
    int judge_refresh;     /* ignore cached judge replies */
    int rerun_changed;     /* rerun cells whose stored record's fingerprint differs (else that is an error) */
    kvb_shard shard;       /* run only this shard's cells (count 0 = all); every run writes DIR/plan.jsonl */
    const char *const *method_opts; /* --method-opt values merged into the suite's method options (cells.h) */
    int n_method_opts;
    /* engine settings (0 / NULL = default): KV element type, backend, prefill chunk, a context cap (prompts
     * are truncated to fit it as to the model's training context); those that change results join the records'
     * fingerprints; and the prefill matmul (engine/model.h kvb_prefill_gemm) */
    int kv_f32;
    const char *backend;
    int n_batch, n_ctx;
    kvb_prefill_gemm prefill_gemm;
    const char *dump_kept; /* append each cell's kept positions (engine/kept.h) to this JSONL file */
    /* Before the cells run, each profile section the cells' methods read (kvb_method_needs.profile) that the
     * model lacks is calibrated as `kvbench calibrate KIND` does (benchmarks/calibration.h, with the run's engine
     * settings) and stored in the profile (benchmarks/runcal.h); with no_calibrate, a missing section is an error
     * naming the command that makes it. */
    int no_calibrate;
} kvb_run_opts;

/* Run (or resume) a suite; a resume reuses a record only when its fingerprint matches (fingerprint.h). Returns 0 when every cell has a record (per-sample failures are records with an
 * "error" field), -1 with a one-line message on a fatal error (bad suite, missing model, results from
 * another suite, unwritable output). Writes the report and prints its main table to out at the end. */
int kvb_run_suite(const kvb_run_opts *o, FILE *out, char *err, size_t err_len);

#endif
