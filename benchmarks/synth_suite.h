/* synth_suite.h — the suite runner's "ruler" and "infinitebench" benchmark entries (runner.h): their JSON
 * options turned into generated tasks, one per (task, length), named "<task>_<length>". Kept apart from
 * runner.c so the runner stays one concern; the runner passes what it owns through kvb_bench_env. */
#ifndef KVB_SYNTH_SUITE_H
#define KVB_SYNTH_SUITE_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "benchmarks/registry.h" /* kvb_bench_env */


/* {"type": "ruler", "lengths": [...], "samples": N, "tasks": [...] (default all 13), "haystack", "words_dir",
 * "squad", "hotpotqa"}: a task whose data is absent is skipped with one line on stderr. 0 / -1 + err. */
int kvb_synth_load_ruler(const kvb_bench_env *env, const cJSON *b, char *err, size_t err_len);
/* {"type": "infinitebench", "lengths": [...], "samples": N, "tasks": ["passkey", "number_string",
 * "kv_retrieval"]}: the generated synthetic tasks, one per (task, length); or {"type": "infinitebench",
 * "path": FILE or DIR, "tasks": [...], "samples": N, "optional": true}: the official files, tasks named as the
 * files (any of infbench_has_loader's nine): a directory holds DIR/<task>.jsonl for each task named ("data_dir":
 * DIR says the same), a file is one task (the one "tasks" names, else its name <task>.jsonl says); "lengths" is
 * refused there (the records are cut to the model's context). An absent file is an error, or with "optional" one
 * line on stderr and the task skipped. 0 / -1 + err. */
int kvb_synth_load_infbench(const kvb_bench_env *env, const cJSON *b, char *err, size_t err_len);

#endif
