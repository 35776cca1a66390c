/* suitecheck.h — the strict reading of a suite (runner.h's format): one validator, so a suite is read the same
 * way wherever it is read (`kvbench run`, the suite fuzzer through it). Each refusal is one line naming the suite,
 * the key (and the benchmark, by its index) and what is accepted:
 * - the file is one JSON object and nothing else (text after it, a NUL byte included, is refused with its line);
 * - no object repeats a key (cJSON would keep the first silently; Python's json the last): named;
 * - no key is unknown (a misspelling would run the default silently): the top level's (name, description, model,
 *   output, seed, round_chunk, methods, methods_except, budgets, compression_ratios, benchmarks, judge, serve,
 *   calibration), a benchmark entry's (its registry row's keys and kvb_benchmark_common_keys; an unknown "type" is
 *   the runner's error), a method entry's (name, opts; checked by kvb_suite_parse before "all" is expanded, so the
 *   entry's index is as written): named with its place and the keys accepted there;
 * - "methods": "all" is every registered method (methods/registry.c's order) with its default options, and "all" as
 *   one entry of the list the registered methods the list does not name otherwise (by name or alias), at its place:
 *   kvb_suite_parse writes them in as {"name": ...} entries (so run.json's suite_config lists what ran); "all" twice
 *   or another string entry is refused;
 * - typed keys have their type and range: "name", "model", "output" strings; "seed" an integer in [0, 2^53];
 *   "round_chunk" an integer in [1, 2^20]; per benchmark "type" a string, the counts ("samples", "dialogues",
 *   "min_pairs", "max_pairs", "rounds") integers in [1, 10^6], "limit" an integer in [0, 10^9], the switches
 *   ("optional", "cot", "e", "spread", "per_query", and a niah's "judge") true or false, "max_new_tokens" an integer
 *   in [1, half the model's context] (a prompt needs the rest).
 * The cells get the rest (benchmarks/cells.h: names, budgets, duplicates) and the methods their options
 * (kvb_suite_check_methods: methods/'s own check, as `generate` and `serve` make it). */
#ifndef KVB_SUITECHECK_H
#define KVB_SUITECHECK_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "benchmarks/cells.h"
#include "engine/model.h"

/* Read and parse the suite file at path (a regular file), "all" methods expanded: its JSON object (caller deletes),
 * or NULL + one line. */
cJSON *kvb_suite_parse(const char *path, char *err, size_t err_len);
/* Check the typed keys above. n_ctx: the model's context, max_new_tokens's bound (0: max_new_tokens is left for
 * a later call that knows the model). 0, or -1 + one line. */
int kvb_suite_check(const cJSON *suite, const char *path, int n_ctx, char *err, size_t err_len);
/* Create each cell's method with its options (at the whole budget: a budget a method cannot meet on some sample stays
 * that cell's error record) on a small context of m and free it again, so an unknown option ({"nosuch": 1}) or a
 * malformed value is refused before any cell runs, naming the method and the option (methods/method.h
 * kvb_method_create: what `generate` and `serve` refuse). with_profile: 0 checks the
 * cells whose method reads no calibration profile (before a run writes anything), 1 those that do (once the
 * run's calibrations made the profile). 0, or -1 + one line. */
int kvb_suite_check_methods(const kvb_cells *cs, const char *path, kvb_model *m, const kvb_ctx_params *p, int with_profile,
                            char *err, size_t err_len);
/* The pieces of that check, for a list of methods not in a suite (`bench --method`): the small context of m (256
 * tokens, nothing reserved, no profiling) the methods are made on, or NULL + one line; and method `name` with
 * options o made at the whole budget on it and freed again: 0, or -1 + the method's one line. */
kvb_ctx *kvb_method_check_ctx(kvb_model *m, const kvb_ctx_params *p, char *err, size_t err_len);
int kvb_method_check(kvb_ctx *c, const char *name, kvb_opts *o, char *err, size_t err_len);

#endif
