/* serve_suite.h — throughput beside accuracy: a suite's top-level "serve" block runs every method@budget cell of the
 * suite as a server under load (judge/loadgen.h, in process) after the accuracy records, and appends a row per cell
 * and pool size to RUN_DIR/serve.jsonl, which `kvbench report` and `kvbench compare` read (reports/serve_rows.h).
 *
 *   "serve": {"clients": 16, "requests": 32, "prompt_len": 1024, "max_new": 64, "prompts": 8,
 *             "pool_seqs": 4 | "kv_pool_mib": 128 | [64, 128, 256], "rate": 0, "max_batch": 64,
 *             "page_tokens": 16, "prefill_chunk": 0}
 *
 * Every member is optional (the defaults are bench-serve's); the prompts are the needle-in-a-haystack generator's,
 * as bench-serve replays them. A cell whose row is in serve.jsonl is not run again (a resumed run). Also the
 * needle prompts and the pool sizing bench-serve uses (docs/serving.md). */
#ifndef KVB_SERVE_SUITE_H
#define KVB_SERVE_SUITE_H

#include <cjson/cJSON.h>
#include <stdio.h>

#include "benchmarks/cells.h"
#include "benchmarks/prompt.h"
#include "judge/loadgen.h"

/* The suite's "serve" block checked strictly (types, ranges, no unknown member): 0 (also when there is none), or
 * -1 + a one-line error naming the member. */
int kvb_serve_suite_check(const cJSON *suite, const char *path, char *err, size_t err_len);
/* Run the block, if any, for every cell: rows appended to out_dir/serve.jsonl, one line of progress each on log.
 * 0, or -1 + err. */
int kvb_serve_suite_run(const cJSON *suite, const char *path, kvb_model *m, const kvb_ctx_params *cp,
                        const kvb_cells *cs, const char *out_dir, FILE *log, char *err, size_t err_len);

/* n needle prompts of about prompt_len tokens (depths spread over [0, 100], the NIAH suite's layout and the model's
 * chat template): ids in out[], and (texts not NULL) the messages a server gets, strdup'd (free with
 * kvb_serve_texts_free). 0, or -1 + err. */
int kvb_serve_needle_prompts(kvb_model *m, int prompt_len, int n, kvb_prompt *out, kvb_load_text *texts, char *err,
                             size_t err_len);
void kvb_serve_texts_free(kvb_load_text *texts, int n);
/* Bytes of KV pool full attention holds for one sequence of n_tokens on the model with contexts from cp, in pages of
 * page_tokens: the unit of --pool-seqs. -1 + err on failure. */
int64_t kvb_serve_seq_bytes(kvb_model *m, const kvb_ctx_params *cp, int page_tokens, int64_t n_tokens, char *err,
                            size_t err_len);

#endif
