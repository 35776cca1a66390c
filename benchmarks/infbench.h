/* infbench.h — InfiniteBench's official per-task scorers (OpenBMB/InfiniteBench src/compute_scores.py) in C:
 * the score of one prediction against the label as the official result files hold it (a JSON string, number
 * or list: choice and code_debug labels are [text, letter]). tests/test_infbench.c checks them against values
 * the official functions computed on the gpt-4 prediction files and extra cases (scripts/infbench_ref.py).
 *
 *   passkey, number_string  the first run of ASCII digits in the prediction equals the label;
 *   kv_retrieval            the label is a word of the prediction split at whitespace and \n : " ' . , ? ! { };
 *   longbook_choice_eng     the first letter, the whole prediction, the text after an answer prefix, or the first
 *                           word inside "ABCD", tried in the official order;
 *   longbook_qa_eng         token F1 after SQuAD normalisation, max over the labels (LongBench's qa_f1);
 *   longdialogue_qa_eng     the first label is one of the upper-cased words of the prediction;
 *   code_debug              "<letter>." / "<letter>:" at the start, or the letter / function name after the
 *                           first answer prefix of the official list that occurs;
 *   math_find               the first number (\d+\.\d+|\d+) equals the label (int or float);
 *   longbook_sum_eng        ROUGE-Lsum F of HF evaluate's "rouge" (Google's rouge_score, benchmarks/rouge.h), the
 *                           best over the label's summaries.
 * Not scored: longbook_qa_chn, code_run, math_calc. Digits and whitespace are ASCII where Python's would be
 * Unicode. */
#ifndef KVB_INFBENCH_H
#define KVB_INFBENCH_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "benchmarks/loaders.h"

/* 1 when task has a scorer here, else 0. */
int infbench_has_scorer(const char *task);
/* Score in [0, 1] of pred against label (the official ground_truth); 0, or -1 for a task without a scorer or
 * a label of the wrong type. */
int infbench_score(const char *task, const char *pred, const cJSON *label, double *score);

/* The score of pred against a sample's answers as the loaders and generators store them (the label rebuilt:
 * a string for passkey / number_string / kv_retrieval, the number for math_find, the list otherwise). 0 / -1. */
int infbench_score_answers(const char *task, const char *pred, const char *const *answers, int n_answers, double *score);

/* ---- the official files (src/eval_utils.py, src/prompt.py's yarn_mistral_templates) ---- */

/* 1 when task has a loader: passkey, number_string, kv_retrieval, longbook_sum_eng, longbook_choice_eng,
 * longbook_qa_eng, longdialogue_qa_eng, math_find, code_debug. */
int infbench_has_loader(const char *task);
/* "<data_dir>/<task>.jsonl" (DATA_NAME_TO_PATH); 0, or -1 if it does not fit. */
int infbench_data_path(const char *data_dir, const char *task, char *buf, size_t cap);
/* Loads one task's official jsonl ({"id": int, "context", "input", "answer", "options"}), loaders.h contract.
 * prompt = the yarn_mistral template filled as create_prompt does (input as {input} / {question}; options as
 * {OPTION_A..D}; math_find's {prefix} "What is <the ... number> in the following list?" from input's first
 * "The .+ of", ASCII lower-cased); context = the record's context; question = the template after {context},
 * filled (what question hidden prefills after the compressed context); answers = get_answer's label: [text,
 * letter] for longbook_choice_eng / code_debug, the number for math_find (as "%.17g"), else the string(s);
 * max_new_tokens = DATA_NAME_TO_MAX_NEW_TOKENS; use_chat = 1 (as the generators); id = the record's id, else the
 * line number. The official middle truncation (first and last max//2 tokens) is kvb_prompt_build's. */
int infbench_load(const char *path, const char *task, int limit, kvb_samples *out, char *err, size_t err_len);

/* Seeded generators for the synthetic tasks "passkey", "number_string", "kv_retrieval" following
 * data/construct_synthetic_dataset.py (noise lines around one passkey / 10-digit string line; a JSON object of
 * UUID pairs) at `length` tokens of the model (prompt + max_new_tokens <= length, the largest haystack that
 * fits), with src/prompt.py's yarn_mistral_templates (the open-model prompts). Depths sweep 0..100% over the
 * samples as the official grid does (passkey: 5 samples per depth, number_string 10, kv_retrieval 1).
 * Sample: prompt = the template filled, context, question = the text after the context, answers = [key],
 * max_new_tokens 6 / 12 / 50, use_chat = 1, depth = percent depth of the needle, length = prompt tokens.
 * queries_per_context > 1 (kv_retrieval only): consecutive samples share one haystack, that many queries each,
 * asking pairs spread over its depth ((j + 0.5) / queries), the haystack fitted to the first query's prompt; they
 * carry group "<task>_<length>_g<k>" (kvb_sample.group) so the runner prefills the haystack once when the
 * question is hidden. 0, or -1 with a one-line message (loaders.h contract). */
int infbench_generate(const char *task, int length, int n_samples, int queries_per_context, uint64_t seed,
                      kvb_count_tokens_fn count_tokens, void *tok_ctx, kvb_samples *out, char *err, size_t err_len);

#endif
