/* longbench_v2.h — LongBench v2 (THUDM, arXiv 2412.15204): 503 multiple-choice questions over contexts of 8K to
 * 2M words in six domains, as its repository's pred.py and result.py run and score them (THUDM/LongBench, the
 * repository root; read, not copied).
 *
 * Record (data.json, a JSON array; pred.py keeps these fields of the HF set): _id, domain, sub_domain,
 * difficulty ("easy" | "hard"), length ("short" | "medium" | "long"), question, choice_A..choice_D, answer
 * ("A".."D"), context.
 * Prompt: prompts/0shot.txt, or prompts/0shot_cot.txt with chain of thought, filled as get_pred fills them: a
 * chain of replace-alls over the template, $DOC$ <- context.strip(), then $Q$, $C_A$, $C_B$, $C_C$, $C_D$ <- the
 * stripped fields (so a placeholder inside the context is replaced too, as there). One user message in the
 * model's chat template. Too long a prompt keeps its first and last max/2 tokens (query_llm's middle cut; kvbench's
 * prompt builder). max_new_tokens 128, or 1024 with CoT.
 * Score: extract_answer on the reply (its '*' removed): the letter of the first "The correct answer is (X)", else
 * of the first "The correct answer is X", X in A-D; 1 when it is the answer, else 0 (no letter: 0).
 * CoT: pred.py asks a second question after the chain of thought: prompts/0shot_cot_ans.txt (the question and
 * the choices, "The text is too long and omitted here." in place of the text, and the reasoning), filled by the
 * same chain with $COT$ <- the first reply, stripped, replaced last; 128 new tokens, the same middle cut; the
 * answer is extracted from that second reply. The loader fills all but $COT$ into the sample's follow-up
 * (kvb_sample.followup, slot "$COT$"); the runner asks it in the same cell, with the same method and budget, and
 * records both replies (first_prediction: the reasoning; prediction: the scored answer). */
#ifndef KVB_LONGBENCH_V2_H
#define KVB_LONGBENCH_V2_H

#include <stddef.h>

#include "benchmarks/sample.h"

/* What to read of the file; NULL / 0 fields select everything. */
typedef struct {
    int cot;                   /* 0shot_cot.txt, 1024 new tokens */
    int limit;                 /* > 0: at most this many records (after the filters) */
    const char *const *length; /* keep records whose "length" is one of these (n_length of them) */
    int n_length;
    const char *const *difficulty;
    int n_difficulty;
    const char *const *domain;
    int n_domain;
} lbv2_opts;

/* Loads the official data.json (a JSON array, or JSONL: one record a line) into out, task "longbench_v2" (or
 * "longbench_v2_cot"): id = _id, prompt = the filled template, context = the stripped context (as placed in the
 * prompt), question = the template's text after it, filled; answers = [answer letter]; qtype = sub_domain;
 * domain, difficulty; length = 0 / 1 / 2 for short / medium / long (lbv2_length_bin names it back); use_chat.
 * 0, or -1 + one line naming the file and line (loaders.h contract). */
int lbv2_load(const char *path, const lbv2_opts *o, kvb_samples *out, char *err, size_t err_len);

/* extract_answer: the letter 'A'..'D' the reply gives, or 0 for none. */
char lbv2_extract_answer(const char *response);
/* 1 when the reply's extracted letter is answer (a letter "A".."D"), else 0. */
int lbv2_judge(const char *response, const char *answer);
/* "short", "medium", "long" for a sample's length code; NULL for another. */
const char *lbv2_length_bin(long long code);

#endif
