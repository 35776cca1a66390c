/* scbench.h — SCBench (Microsoft, "SCBench: A KV Cache-Centric Analysis of Long-Context Methods", arXiv 2412.10319):
 * shared-context tasks, several questions over one long context, asked as multi-turn dialogue or as independent
 * requests, scored per turn; following microsoft/MInference scbench/ (eval_utils.py create_multiturn_prompt,
 * create_scdq_prompt, GreedySearch.test / test_scdq; run_scbench.py get_pred; compute_scores.py; repo_qa_utils.py;
 * read at 0ff346d, not copied).
 *
 * Record (one JSON object a line, data/<task>.jsonl of microsoft/SCBench): id, context (mf: a list of integers,
 * formatted as Python's str() of it; absent: "input"), multi_turns = [{input, answer, options (choice_eng),
 * name (repoqa: the function), task (the multi-tasking sets: the turn's task)}], lang and repo (repoqa).
 *
 * Tasks and capability groups: string retrieval (scbench_kv, scbench_prefix_suffix, scbench_vt), semantic retrieval
 * (scbench_repoqa, scbench_qa_eng, scbench_qa_chn, scbench_choice_eng), global information (scbench_many_shot,
 * scbench_mf, scbench_summary), multi-tasking (scbench_summary_with_needles, scbench_repoqa_and_kv).
 *
 * One sample per turn (the first max_turns turns; run_scbench.py's --max_turns, default 5), the chat-template prompts
 * as the official code builds them with --use_chat_template:
 *   multi-turn (default; golden context): turn 1 is multiturn_templates[task] filled with the context and the first
 *     turn, one user message; turn k > 1 is that message, then for each earlier turn j the assistant's reference
 *     answer str(answer_j) and the next user message multiturn_follow_up_templates_in_chat_tempate[task] (the model's
 *     own earlier replies are discarded, as GreedySearch.test does), ending with turn k's; scbench_summary's later
 *     turns open the assistant reply with "This paper". Sample: prompt (turn 1) or turns + question (k > 1).
 *   multi-turn with KV cache reuse ("kv_reuse", the default; task "<task>_reuse"): the same turns, each a carried
 *     sample of group "<task>_reuse/<id>" (kvb_sample.carried), so the runner prefills and compresses the first turn's
 *     prompt once and appends each later turn's piece to that cache, as GreedySearch.test does with any KV cache
 *     method (kvcompression.py compresses the first prefill only and appends follow-up turns; the tokens generated
 *     in a turn go to a temporary cache cleared after it, so the cache holds the reference answers, not the
 *     model's): hidden.h kvb_carried_build builds the official pieces. "kv_reuse": false keeps the whole prompt
 *     per turn (GreedySearch_vLLM.test, the official vLLM path: every turn's full token list generated anew).
 *   multi-request ("scdq"): one user message, multiturn_templates_scdq[task] filled with the context, immediately
 *     followed by the turn's query (choice / QA: the template's second part filled; else the turn's input), as
 *     test_scdq prefills the context once and each query after it. Samples of a record share group "<task>/<id>", so
 *     a suite entry with "question": "hidden" prefills and compresses the context once for all its queries
 *     (shared_prefill.h) and counts that prefill once.
 * Context length: the context is cut in the middle to max_context_tokens of the model (get_pred cuts the first
 * prompt, in tokens, to max_seq_length - max_new_tokens * turns, minus 1000 for scdq); here the context alone, in
 * characters, searched with the model's token count so its two halves hold at most that many tokens.
 *
 * Sample fields: id "<record id>/t<k>", task (multi-request: "<task>_scdq"), qtype "turn=<k>" (1-based), domain =
 * the capability group, context = the (cut) context, question = what follows it, max_new_tokens =
 * DATA_NAME_TO_MAX_NEW_TOKENS (the multi-tasking sets per turn task), use_chat = 1; answers = the labels as the
 * official scorer iterates them (get_ground_truth's: a string label a scorer loops over is split into its
 * characters, as Python's `for x in label` does: many_shot, qa_chn, vt when a string); all_classes[0] = the turn's
 * scoring task (scbench_kv, scbench_passkey, ...), and for repoqa turns [1] = the function's name, then (name, code)
 * of every repoqa turn asked of the loaded records of the same "repo", in file order (compute_scores'
 * needle_by_repo): the needles the answer is matched against.
 *
 * Scores (compute_scores.py through Multiturnbench_to_Infinitebench): kv, prefix_suffix: the label is a substring
 * of the prediction; vt: string_match_all (the share of labels in the lower-cased prediction, rounded to 0.01);
 * qa_eng, many_shot: its longdialogue_qa_eng (some label, upper-cased, is in the upper-cased stripped prediction);
 * choice_eng: longbook_choice_eng on [answer, letter] (infbench.h); qa_chn: qa_f1_score_zh (character F1 after
 * normalize_zh_answer, best label); summary: ROUGE-Lsum (rouge.h); mf: math_find; passkey: the first run of digits
 * equals the label; repoqa: pass@1 at similarity 0.8 (repo_qa_utils.compute_score: the output's first ``` code
 * block, or the output, stripped; nltk sentence_bleu with SmoothingFunction().method4 against every needle, split at
 * whitespace; 1 when the most similar needle is the turn's function and its BLEU >= 0.8). The per-turn score of a
 * task is the mean over records, as compute_scores groups by turn_idx.
 * Differences: tree-sitter is not run on the code block (sanitize_output returns the first function tree-sitter
 * finds in it: the same text when the block holds the function alone); \s, str.lower/upper and str.strip are
 * ASCII here. */
#ifndef KVB_SCBENCH_H
#define KVB_SCBENCH_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "benchmarks/loaders.h"
#include "benchmarks/registry.h"
#include "benchmarks/sample.h"

typedef struct {
    int multi_request;          /* 0: multi-turn with the reference answers in the history; 1: multi-request */
    int kv_reuse;               /* multi-turn: the turns of a record carry one KV cache (kvb_sample.carried) */
    int limit;                  /* > 0: at most this many records */
    int max_turns;              /* > 0: the first max_turns turns of each record (0: 5, run_scbench.py's default) */
    long long max_context_tokens; /* > 0 (with count_tokens): cut the context in the middle to this many tokens */
    kvb_count_tokens_fn count_tokens;
    void *tok_ctx;
} scb_opts;

/* 1 when task is one SCBench task kvbench loads (the twelve above). */
int scb_task_known(const char *task);
/* The capability group of a task ("String Retrieval", "Semantic Retrieval", "Global Information", "Multi-tasking"),
 * or NULL. */
const char *scb_task_group(const char *task);
/* "<dir>/<task>.jsonl"; 0, or -1 if it does not fit. */
int scb_data_path(const char *dir, const char *task, char *buf, size_t cap);
/* max_new_tokens of a turn of `task` whose own task is turn_task (the multi-tasking sets; else NULL); 0 unknown. */
int scb_max_new_tokens(const char *task, const char *turn_task);

/* Loads one task's official jsonl (path) into out, one sample per turn (above). 0, or -1 + one line naming the file
 * and line (loaders.h contract). */
int scb_load(const char *path, const char *task, const scb_opts *o, kvb_samples *out, char *err, size_t err_len);

/* The score in [0, 1] of a turn's prediction (the registry's scorer); metric = the turn's scoring task. 0 / -1. */
int scb_score(const kvb_sample *s, const char *prediction, double *score, char *metric, size_t metric_cap);

/* nltk's sentence_bleu([reference split at whitespace], candidate split at whitespace, smoothing method4), both
 * stripped first; -1 on out of memory. */
double scb_bleu_method4(const char *candidate, const char *reference);
/* repo_qa_utils.sanitize_output without tree-sitter: the first ``` code block's body, else the stripped output;
 * malloc'd or NULL. */
char *scb_code_block(const char *output);

/* The suite entry {"type": "scbench", "path": <dir or .jsonl>, "tasks": [...], "mode": "multi_turn" |
 * "multi_request", "kv_reuse": true | false (multi_turn only; default true), "samples": records, "max_turns": N,
 * "max_context_tokens": N, "optional": true} (registry.h); "question": "hidden" is refused with multi_turn (its
 * first question is seen by the compression, as the official code's). */
int scb_bench_load(const kvb_bench_env *env, const cJSON *entry, char *err, size_t err_len);

#endif
