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

/* 1 when task has a scorer here, else 0. */
int infbench_has_scorer(const char *task);
/* Score in [0, 1] of pred against label (the official ground_truth); 0, or -1 for a task without a scorer or
 * a label of the wrong type. */
int infbench_score(const char *task, const char *pred, const cJSON *label, double *score);

#endif
