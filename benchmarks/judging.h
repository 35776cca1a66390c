/* judging.h — the runner's judge: the verdicts of judge-scored samples, written into their result records.
 *
 * Kinds: LongMemEval (the official per-type prompt, verdict yes/no -> score 1/0), Round Attention's 1-10
 * quality score for multi-round dialogue (ShareGPT; overall score averaged over n replies -> score/10) and
 * the rubric judge for NIAH when a suite asks for it ("judge": true on the niah benchmark; score/10).
 * The records of one sample (one per method x budget) are judged in one batch, so the client keeps several
 * requests in flight. Each record's "judge" field gets {kind, model, base_url, replies, parsed, error,
 * attempts, from_cache, cache_key}; a failed or unparseable judgement leaves "score" null with the error in
 * "judge.error" (a judge error, not a zero), and the run goes on.
 *
 * Configuration: the suite's "judge" object
 *   {"base_url": "http://127.0.0.1:8080/v1", "model": "default", "api_key_env": "OPENAI_API_KEY",
 *    "concurrency": 4, "timeout_s": 60, "max_retries": 4, "breaker": 8, "n": 1, "retry_after_max_s": 60,
 *    "deadline_s": 900,
 *    "cache_dir": "~/.cache/kvbench/judge", "templates": "$KVB_DATA/longmemeval/judge_templates.json"}
 * with the flags of `kvbench run` (--judge-url, --judge-model, --judge-key-env, --judge-refresh) and
 * KVB_JUDGE_URL taking precedence. The key itself is only ever read from the environment by the client. */
#ifndef KVB_JUDGING_H
#define KVB_JUDGING_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "benchmarks/sample.h"

typedef enum { KVB_JK_NONE, KVB_JK_LONGMEMEVAL, KVB_JK_QUALITY, KVB_JK_RUBRIC } kvb_judge_kind;

typedef struct {
    const char *url, *model, *key_env; /* flags; NULL = the suite's */
    int refresh;
} kvb_judge_flags;

typedef struct kvb_runner_judge kvb_runner_judge;

/* The judge a suite configures (suite_judge may be NULL), or NULL without error (*err = 0) when there is
 * none; NULL + err for a bad configuration. resolve expands "~/" and "$KVB_DATA/" paths. */
kvb_runner_judge *kvb_runner_judge_create(const cJSON *suite_judge, const kvb_judge_flags *flags,
                                          void (*resolve)(const char *in, char *out, size_t cap), char *err,
                                          size_t err_len);
void kvb_runner_judge_free(kvb_runner_judge *j);
/* Load the LongMemEval judge prompts (once); 0 or -1 + err naming the file and how to get it. */
int kvb_runner_judge_need_lme(kvb_runner_judge *j, char *err, size_t err_len);
/* Judge the n records of sample s (records with an "error" are left alone; j NULL marks them "no judge
 * configured"). Sets "judge", "metric" and "score" on each. 0, or -1 + err for a setup failure only. */
int kvb_runner_judge_records(kvb_runner_judge *j, kvb_judge_kind kind, const kvb_sample *s, cJSON **recs, int n,
                             char *err, size_t err_len);
/* {"base_url", "model"} for run.json (no key), or NULL when j is NULL. */
cJSON *kvb_runner_judge_describe(const kvb_runner_judge *j);

#endif
