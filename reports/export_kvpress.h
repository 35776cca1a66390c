/* export_kvpress.h — a kvbench run directory written in NVIDIA kvpress's evaluation layout, so its rows can
 * stand next to the leaderboard's (`kvbench export --kvpress RUN_DIR OUT`).
 *
 * kvpress's evaluation/evaluate.py writes one directory per run of (dataset, data_dir, model, press,
 * compression ratio), named by its components joined with "__" — "ruler__4096__Qwen--Qwen3-8B__snapkv__0.50",
 * with "__query_aware" when the question was in the compressed prompt — and in it predictions.csv (the dataset's
 * columns but the context, with predicted_answer and compression_ratio), metrics.json (its dataset's scorer
 * output, indent 4) and config.yaml (its EvaluationConfig, keys in that order). This module writes the same for
 * every (benchmark, task, method, budget) kvpress can name:
 *   - press: kvpress's PRESS_REGISTRY key, the name its evaluation takes (kvb_kvpress_press below);
 *   - compression ratio: 1 - the budget share ("25%" is 0.75); full attention is no_press at 0.00; a token
 *     budget has no ratio and is skipped;
 *   - dataset: RULER (data_dir = the length, task = the RULER task), LongBench (data_dir = the task) and
 *     InfiniteBench's official tasks (data_dir = the task); other benchmarks are skipped.
 * Records are read through reports/results.h (the reader every command shares): the last record of a cell
 * wins; a sample that failed or has no score is skipped and counted. Scores are kvbench's, per sample, in
 * kvpress's scale (x100, rounded to 2 decimals as its scorers round). */
#ifndef KVB_EXPORT_KVPRESS_H
#define KVB_EXPORT_KVPRESS_H

#include <stddef.h>

typedef struct {
    const char *model; /* the model's name in directory names and config.yaml (an HF id such as "Qwen/Qwen3-8B");
                          NULL: the run's model file name without ".gguf" */
    int force;         /* write into an OUT that exists and is not empty */
} kvb_kvpress_opts;

typedef struct {
    size_t n_exported, n_dirs;
    size_t n_unrepresentable; /* records of a method, budget or benchmark kvpress has no name for */
    size_t n_failed;          /* records of a sample that failed or was not scored */
    char skipped[512];        /* what was skipped, one line without '\n' ("" when nothing) */
} kvb_kvpress_stats;

/* kvpress's press for a kvbench method with its resolved parameters (the record's method_params: the base of
 * adakv, chunkkv and decoding, expected's ada): *press_name = the PRESS_REGISTRY key, *press_class = the
 * class kvpress's repr shows. 0, or -1 when kvpress has no such press (h2o, omnikv, round, pod, quest, kivi,
 * or a base kvpress does not wrap that way). */
int kvb_kvpress_press(const char *method, const char *method_params, const char **press_name, const char **press_class);

/* kvpress's dataset for a kvbench (benchmark, task): dataset ("ruler"), data_dir ("4096", or "" for none) and
 * kvpress's task name ("niah_single_1"). 0, or -1 when kvpress has no such dataset or task. */
int kvb_kvpress_dataset(const char *benchmark, const char *task, char *dataset, size_t dataset_cap, char *data_dir,
                        size_t data_dir_cap, char *kv_task, size_t kv_task_cap);

/* Write RUN_DIR's records into OUT in kvpress's layout (created; refused when it exists and is not empty,
 * unless o->force). 0 + *st, or -1 + one line: the run cannot be loaded (run.json or results.jsonl missing or
 * malformed, "PATH:LINE: why"), OUT cannot be created or written, OUT is not empty, or no record kvpress can
 * represent. */
int kvb_export_kvpress(const char *run_dir, const char *out_dir, const kvb_kvpress_opts *o, kvb_kvpress_stats *st,
                       char *err, size_t err_len);

#endif
