/* serve_dataset.h — the prompts `kvbench bench-serve --dataset` replays (docs/serving.md): a benchmark's records
 * through its own loader and its registry row's prompt builder, so a request is the prompt `kvbench run` would
 * prefill for that record (chat template included), cut by the benchmark's own truncation to the context less the
 * request's generation:
 *   longbench:FILE.jsonl  one LongBench task's records (the task is the file's name; dataset2prompt.json and
 *                         dataset2maxlen.json from config_dir, default FILE's folder's sibling "config/", the layout
 *                         of $KVB_DATA/longbench); a request generates the task's dataset2maxlen tokens, capped
 *                         by max_new (so, uncapped, its prompt is exactly the runner's); a too-long prompt is
 *                         middle-cut as pred.py does;
 *   sharegpt:FILE.json    ShareGPT conversations as dialogues (the last user message the question); a request
 *                         generates the recorded reply's length in tokens, capped by max_new (no recorded reply:
 *                         max_new); a too-long dialogue drops its latest history rounds, and one whose question
 *                         alone does not fit is skipped and counted;
 *   niah[:LEN]            the needle-in-a-haystack generator's prompts of about LEN tokens (default prompt_len).
 * The records are shuffled by a seed and the first `limit` (0: all) built; requests cycle through them in that
 * order. */
#ifndef KVB_SERVE_DATASET_H
#define KVB_SERVE_DATASET_H

#include <stdint.h>

#include "benchmarks/prompt.h"
#include "judge/loadgen.h"

typedef struct {
    char name[128];         /* for the rows: "longbench:hotpotqa", "sharegpt:<file>", "niah:1024" */
    int n;                  /* prompts built */
    int skipped;            /* records left out (too long for the context even after the benchmark's cut) */
    int truncated;          /* prompts the benchmark's truncation cut */
    kvb_prompt *prompts;    /* ids, n of them */
    int *max_new;           /* per prompt: the tokens a request generates */
    char **record_ids;      /* per prompt: the record's id ("needle-<i>" for niah) */
    kvb_load_text *texts;   /* per prompt, when asked: the messages a server is sent (loadgen.h) */
} kvb_serve_set;

/* The prompts of spec for model m within a context of n_ctx tokens: each request generates max_new (longbench: the
 * task's length, sharegpt: the reply's, capped), prompt_len is niah's default length and limit (niah: the count, default 8) how many
 * records are built, seed orders them; with_texts also fills texts. 0, or -1 + a one-line err (an unknown spec, a
 * missing or malformed file, no record that fits). */
int kvb_serve_dataset_load(kvb_model *m, const char *spec, const char *config_dir, int n_ctx, int max_new,
                           int prompt_len, int limit, uint64_t seed, int with_texts, kvb_serve_set *out, char *err,
                           size_t err_len);
void kvb_serve_set_free(kvb_serve_set *s);

#endif
