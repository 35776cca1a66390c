/* ruler.h — RULER (NVIDIA/RULER) synthetic tasks: seeded generators for the 13 tasks of its default config
 * (scripts/synthetic.yaml, scripts/config_tasks.sh) at a context length measured in the model's tokens, and
 * its scorers (scripts/eval/synthetic/constants.py). See ruler.c for the recipes followed and the choices made.
 *
 * Each sample: prompt = RULER's "input" (the task template filled, the answer prefix cut off), prefill = the
 * answer prefix (the assistant turn starts with it, as RULER's predictions append it after the model's chat
 * template), context = the haystack / document part, question = the text after the context, answers = RULER's
 * "outputs", max_new_tokens = the task's tokens_to_generate, length = tokens(input + answer prefix) +
 * tokens_to_generate (RULER's "length", without the chat template), ctx_tokens = the target length,
 * depth = percent depth of the first needle / chain / gold document in the context (-1 where none), qtype =
 * "len=<L>". */
#ifndef KVB_RULER_H
#define KVB_RULER_H

#include <stddef.h>
#include <stdint.h>

#include "benchmarks/loaders.h"

#define RULER_N_TASKS 13

typedef struct {
    const char *task;       /* one of ruler_task_name(0..12), e.g. "niah_single_1" */
    int length;             /* RULER's max_seq_length: input + answer prefix + tokens_to_generate, in tokens */
    int n_samples;
    uint64_t seed;
    const char *essay_dir;  /* directory of Paul Graham essays (*.txt, read in sorted order); essay tasks */
    const char *words_dir;  /* wonderwords' assets: nounlist.txt, adjectivelist.txt, verblist.txt */
    const char *qa_path;    /* qa_1: SQuAD v2 dev JSON; qa_2: HotpotQA dev (distractor) JSON */
    kvb_count_tokens_fn count_tokens; /* NULL = niah_count_words */
    void *tok_ctx;
    int per_query;          /* niah_multiquery: each sample's queries posed one at a time, one sample each with
                               niah.py's singular template, over the official (multi-query) haystack; the samples
                               of a haystack form a context group (kvb_sample.group) */
} ruler_opts;

/* What a task reads besides the seed. */
enum { RULER_NEEDS_ESSAY = 1, RULER_NEEDS_WORDS = 2, RULER_NEEDS_QA = 4 };

/* Name of task i (0 <= i < RULER_N_TASKS) in config_tasks.sh order; NULL otherwise. */
const char *ruler_task_name(int i);
/* RULER_NEEDS_* flags of a task; -1 for an unknown task. */
int ruler_task_needs(const char *task);
/* Appends o->n_samples samples of o->task (loaders.h contract); 0, or -1 with a one-line message. */
int ruler_generate(const ruler_opts *o, kvb_samples *out, char *err, size_t err_len);

/* evaluate.py's postprocess_pred in place: strip, every character in [\x00-\x1f] becomes '\n', strip. */
void ruler_postprocess(char *pred);
/* One sample's share under string_match_all: the fraction of refs found (case-insensitive) in pred, [0, 1]. */
double ruler_match_all(const char *pred, const char *const *refs, int n_refs);
/* One sample's share under string_match_part: 1 if any ref is found (case-insensitive) in pred, else 0. */
double ruler_match_part(const char *pred, const char *const *refs, int n_refs);
/* The task's metric: "string_match_part" for qa_1/qa_2, "string_match_all" otherwise (NULL if unknown). */
const char *ruler_metric_name(const char *task);
/* A sample's score in [0, 1] (postprocess, then the task's metric); 0, or -1 for an unknown task. RULER's
 * task score is 100 x the mean of these, rounded to 2 decimals. */
int ruler_score(const char *task, const char *pred, const char *const *refs, int n_refs, double *score);

#endif
