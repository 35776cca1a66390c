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
 *   math_find               the first number (\d+\.\d+|\d+) equals the label (int or float).
 * Not scored: longbook_sum_eng (ROUGE-Lsum of HF evaluate), longbook_qa_chn, code_run, math_calc. Digits and
 * whitespace are ASCII where Python's would be Unicode. */
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

/* Seeded generators for the synthetic tasks "passkey", "number_string", "kv_retrieval" following
 * data/construct_synthetic_dataset.py (noise lines around one passkey / 10-digit string line; a JSON object of
 * UUID pairs) at `length` tokens of the model (prompt + max_new_tokens <= length, the largest haystack that
 * fits), with src/prompt.py's yarn_mistral_templates (the open-model prompts). Depths sweep 0..100% over the
 * samples as the official grid does (passkey: 5 samples per depth, number_string 10, kv_retrieval 1).
 * Sample: prompt = the template filled, context, question = the text after the context, answers = [key],
 * max_new_tokens 6 / 12 / 50, use_chat = 1, depth = percent depth of the needle, length = prompt tokens.
 * 0, or -1 with a one-line message (loaders.h contract). */
int infbench_generate(const char *task, int length, int n_samples, uint64_t seed, kvb_count_tokens_fn count_tokens,
                      void *tok_ctx, kvb_samples *out, char *err, size_t err_len);

#endif
