/* registry.h — the benchmarks a suite may name: one row per suite "type" (DESIGN.md "Benchmarks"), with its
 * loader (the suite entry's options turned into tasks of samples), its prompt builder, its scorer, the judge kind
 * its tasks are scored by, and how its records bin lengths. The runner (load, prompt) and score.c
 * (kvb_score_sample) look a type up here instead of testing names, and tests iterate the table.
 *
 * A prompt builder (prompt.h) turns a sample into token ids: kvb_prompt_single (one prompt: the official middle
 * cut, the chat template, chunked rounds), kvb_prompt_dialogue (a conversation's own rounds) or kvb_prompt_build
 * (either, by the sample's shape); each loader puts its benchmark's official prompt template into the sample.
 * Adding a benchmark is its loader (and scorer, unless judged) plus one row. */
#ifndef KVB_BENCH_REGISTRY_H
#define KVB_BENCH_REGISTRY_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "benchmarks/judging.h"
#include "benchmarks/loaders.h"
#include "benchmarks/prompt.h"
#include "benchmarks/sample.h"

/* What the runner lends a loader. */
typedef struct {
    const char *suite_path;  /* for messages */
    int n_ctx_train;         /* lengths above the model's context are refused */
    int limit;               /* > 0: at most this many samples per task */
    uint64_t seed;
    int optional;            /* the entry's "optional": absent data (or judge) skips it with one line on stderr */
    /* "~/", "$KVB_DATA/" expanded into out[cap]; -1 when it does not fit (a path is refused, never cut) */
    int (*expand_path)(const char *in, char *out, size_t cap);
    kvb_count_tokens_fn count_tokens;
    void *tok_ctx;
    /* a new task of the run scored as `judge` says (KVB_JK_NONE: by its row's scorer): its sample set, or NULL + err */
    kvb_samples *(*add_task)(void *ctx, const char *name, const char *benchmark, kvb_judge_kind judge, char *err,
                             size_t err_len);
    void *add_ctx;
    int have_judge;          /* the suite or flags configure a judge */
    /* make the judge ready for `kind` (LongMemEval's prompts); 0 or -1 + err */
    int (*ready_judge)(void *ctx, kvb_judge_kind kind, char *err, size_t err_len);
} kvb_bench_env;

typedef struct {
    const char *type;        /* the suite entry's "type" */
    /* the entry's tasks, added through env->add_task; 0 or -1 + one-line err */
    int (*load)(const kvb_bench_env *env, const cJSON *entry, char *err, size_t err_len);
    kvb_prompt_fn prompt;    /* its samples' token ids (prompt.h) */
    /* a prediction's score in [0, 1] and the metric's name; -1 = no automatic score. NULL: judged (see judge). */
    int (*score)(const kvb_sample *s, const char *prediction, double *score, char *metric, size_t metric_cap);
    kvb_judge_kind judge;    /* how its tasks are judged by default (KVB_JK_NONE: scored; niah: rubric on request) */
    /* the record's "length_bin" (LongBench-E's 0-4k/4-8k/8k+), NULL = none */
    const char *(*length_bin)(const kvb_sample *s);
    /* the entry keys its loader reads besides kvb_benchmark_common_keys' (NULL-terminated): any other key of an
     * entry of this type is refused (benchmarks/suitecheck.h), so a misspelled one is not silently a default */
    const char *const *keys;
} kvb_benchmark;

/* The entry keys every type takes, read by the runner (NULL-terminated): "type", "limit", "optional", "question",
 * "max_new_tokens", "ignore_eos". */
const char *const *kvb_benchmark_common_keys(void);

/* The row of a suite "type" (NULL = unknown). */
const kvb_benchmark *kvb_benchmark_find(const char *type);
int kvb_benchmark_count(void);
const kvb_benchmark *kvb_benchmark_at(int i);
/* "2stage, recall, ..." for error messages */
void kvb_benchmark_names(char *buf, size_t cap);

#endif
