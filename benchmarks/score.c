/* score.c — the benchmarks' scorers, and a sample's score through its benchmark's row (registry.h). */
#include "benchmarks/score.h"

#include "benchmarks/metrics.h"
#include "benchmarks/infbench.h"
#include "benchmarks/jieba.h"
#include "benchmarks/longbench_v2.h"
#include "benchmarks/registry.h"
#include "benchmarks/ruler.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

int kvb_contains_ci(const char *hay, const char *needle) {
    size_t n = strlen(needle);
    if (n == 0) return 1;
    for (const char *p = hay; *p; p++) {
        size_t i = 0;
        while (i < n && p[i] && tolower((unsigned char)p[i]) == tolower((unsigned char)needle[i])) i++;
        if (i == n) return 1;
    }
    return 0;
}

static double any_substring(const kvb_sample *s, const char *pred) {
    for (int i = 0; i < s->n_answers; i++)
        if (kvb_contains_ci(pred, s->answers[i])) return 1.0;
    return 0.0;
}

int kvb_score_check_task(const char *task, char *msg, size_t cap) {
    const char *metric = kvb_longbench_metric_name(task);
    if (!metric) {
        snprintf(msg, cap, "unknown LongBench task '%s'", task);
        return -1;
    }
    char err[700];
    if (kvb_longbench_metric_needs_jieba(metric) && !kvb_jieba_shared(err, sizeof err)) {
        snprintf(msg, cap, "LongBench task '%s' is scored on jieba's segmentation (run %s): %s", task, KVB_JIEBA_FETCH,
                 err);
        return -1;
    }
    return 0;
}

int kvb_score_substring(const kvb_sample *s, const char *prediction, double *score, char *metric, size_t metric_cap) {
    *score = any_substring(s, prediction);
    snprintf(metric, metric_cap, "substring");
    return 0;
}

int kvb_score_ruler(const kvb_sample *s, const char *prediction, double *score, char *metric, size_t metric_cap) {
    if (!s->task || !ruler_metric_name(s->task) ||
        ruler_score(s->task, prediction, (const char *const *)s->answers, s->n_answers, score))
        return -1;
    snprintf(metric, metric_cap, "%s", ruler_metric_name(s->task));
    return 0;
}

int kvb_score_infbench(const kvb_sample *s, const char *prediction, double *score, char *metric, size_t metric_cap) {
    if (!s->task || !infbench_has_scorer(s->task) ||
        infbench_score_answers(s->task, prediction, (const char *const *)s->answers, s->n_answers, score))
        return -1;
    snprintf(metric, metric_cap, "infinitebench_%s", s->task);
    return 0;
}

int kvb_score_longbench(const kvb_sample *s, const char *prediction, double *score, char *metric, size_t metric_cap) {
    if (!s->task || !kvb_longbench_metric_name(s->task) ||
        kvb_longbench_score(s->task, prediction, (const char *const *)s->answers, s->n_answers,
                            (const char *const *)s->all_classes, s->n_classes, score))
        return -1;
    snprintf(metric, metric_cap, "%s", kvb_longbench_metric_name(s->task));
    return 0;
}

int kvb_score_longbench_v2(const kvb_sample *s, const char *prediction, double *score, char *metric, size_t metric_cap) {
    if (s->n_answers != 1) return -1;
    *score = lbv2_judge(prediction, s->answers[0]);
    snprintf(metric, metric_cap, "longbench_v2_acc");
    return 0;
}

int kvb_score_sample(const char *benchmark, const kvb_sample *s, const char *prediction, double *score, char *metric,
                     size_t metric_cap) {
    const kvb_benchmark *b = kvb_benchmark_find(benchmark);
    if (b && b->score && b->score(s, prediction, score, metric, metric_cap) == 0) return 0;
    snprintf(metric, metric_cap, "none");
    return -1;
}
