/* score.h — which metric scores a sample, and the score (in [0, 1]) of a prediction.
 *   2stage, recall: case-insensitive substring accuracy of the answer (OmniKV's exact match; recall's planted
 *                   value);
 *   niah:           case-insensitive substring of the needle's key phrase;
 *   longbench:      the official per-task metric (benchmarks/metrics.h: qa_f1, Rouge-L, classification,
 *                   retrieval, count, code_sim, and the Chinese qa_f1_zh, rouge_zh, retrieval_zh), with eval.py's
 *                   first-line cut for trec, triviaqa, samsum, lsht; multifieldqa_zh, dureader and vcsum need
 *                   jieba's data (scripts/fetch-datasets.sh jieba);
 *   ruler:          RULER's string_match_all (string_match_part for qa_1/qa_2) after its postprocess_pred;
 *   infinitebench:  the official per-task scorer (benchmarks/infbench.h) of the synthetic tasks.
 * Judge-scored benchmarks (longmemeval, sharegpt) are not scored here. */
#ifndef KVB_SCORE_H
#define KVB_SCORE_H

#include <stddef.h>

#include "benchmarks/sample.h"

/* 0 = scored (*score, metric name), -1 = this sample has no automatic score: its benchmark's scorer
 * (registry.h), or none for a judged benchmark or an unknown one. */
int kvb_score_sample(const char *benchmark, const kvb_sample *s, const char *prediction, double *score, char *metric,
                     size_t metric_cap);
/* 0 when a LongBench task can be scored; -1 + a message saying why not (unknown task; a Chinese task whose
 * metric needs jieba's data when it cannot be loaded: the message names the fetch command). */
int kvb_score_check_task(const char *task, char *msg, size_t cap);
/* The scorers of the benchmark table (registry.h), by metric family: 0 = scored, -1 = not scorable (a task
 * without a metric). substring: 2stage, recall, niah; ruler, infbench, longbench: the official per-task metric. */
int kvb_score_substring(const kvb_sample *s, const char *prediction, double *score, char *metric, size_t metric_cap);
int kvb_score_ruler(const kvb_sample *s, const char *prediction, double *score, char *metric, size_t metric_cap);
int kvb_score_infbench(const kvb_sample *s, const char *prediction, double *score, char *metric, size_t metric_cap);
int kvb_score_longbench(const kvb_sample *s, const char *prediction, double *score, char *metric, size_t metric_cap);
/* LongBench v2: 1 when pred.py's extract_answer finds the answer letter in the reply, else 0 ("longbench_v2_acc"). */
int kvb_score_longbench_v2(const kvb_sample *s, const char *prediction, double *score, char *metric, size_t metric_cap);
/* Case-insensitive (ASCII) substring test. */
int kvb_contains_ci(const char *hay, const char *needle);

#endif
