/* loaders.h — dataset loaders and generators: each fills kvb_samples the way the benchmark's official
 * code builds its inputs (BENCHMARKS.md). Common contract:
 *   - samples are APPENDED to out (initialise it to {0}); limit <= 0 means all;
 *   - 0 on success; -1 on error with a one-line message in err naming the file and the 1-based line
 *     ("<path>:<line>: ..."); on error nothing is appended (what this call added is freed);
 *   - nothing in a file is trusted: wrong types, missing fields and bad JSON are errors, not crashes. */
#ifndef KVB_LOADERS_H
#define KVB_LOADERS_H

#include <stddef.h>
#include <stdint.h>

#include "benchmarks/sample.h"

/* ---- LongBench v1 (THUDM/LongBench pred.py, eval.py) ---- */

/* Loads one task's JSONL (official record schema). config_dir holds dataset2prompt.json and
 * dataset2maxlen.json. task may carry LongBench-E's "_e" suffix (stripped: the template, max length and
 * sample->task are the base task's). prompt = the template with every {field} replaced literally by the
 * record's field ({{ and }} are literal braces, as in str.format). */
int lb_load(const char *jsonl_path, const char *task, const char *config_dir, int limit, kvb_samples *out,
            char *err, size_t err_len);
/* lb_load's flags (lb_load_ex). LB_SPREAD: with a limit N, N records spread evenly over the file (record
 * i*total/N), not its first N. LB_HIDDEN: the question may be hidden from the compressor: each sample also
 * carries `context` (the prompt up to the end of the template's {context}) and `question` (the rest), and the
 * samples whose contexts are equal form a context group (`group` "ctx-<first id>"), moved next to each other
 * in file order of their first member, so the runner prefills each shared context once. */
enum { LB_SPREAD = 1, LB_HIDDEN = 2 };
int lb_load_ex(const char *jsonl_path, const char *task, const char *config_dir, int limit, int flags,
               kvb_samples *out, char *err, size_t err_len);
/* "<data_dir>/<task>.jsonl", or "<data_dir>/<task>_e.jsonl" for LongBench-E; 0, or -1 if it does not fit. */
int lb_data_path(const char *data_dir, const char *task, int longbench_e, char *buf, size_t cap);
/* LongBench-E length bin of eval.py's scorer_e: "0-4k" (< 4000), "4-8k" (< 8000), "8k+"; NULL if length < 0. */
const char *lb_e_bin(int64_t length);
/* pred.py's middle truncation on token ids: if n > max_len, half = int(max_len/2) and the result is
 * ids[:half] + ids[-half:] (2*half tokens: max_len-1 when max_len is odd; and, as in Python, ids[-0:] is
 * the whole list, so max_len 0 or 1 keeps all n). Otherwise ids unchanged. pred.py then decodes both
 * halves and re-tokenizes the text; the caller does that. out has room for n ids (out == ids is fine).
 * Returns the number of ids written, -1 if n < 0 or max_len < 0. */
int64_t lb_truncate_middle(const int32_t *ids, int64_t n, int64_t max_len, int32_t *out);
/* The per-task rules of pred.py/eval.py: chat template used, first-line cut, stop string (NULL if none). */
int lb_task_uses_chat(const char *task);
int lb_task_first_line(const char *task);
const char *lb_task_stop(const char *task);

/* ---- LongMemEval (xiaowu0162/LongMemEval src/generation/run_generation.py) ---- */

/* Loads a JSON array of instances (oracle / S / M files) as the full-history reader sees them:
 * format "json" (the official scripts' default; NULL means json) or "nl"; cot selects the "step by step"
 * prompt. Each sample: prompt = the official single user message; context = its history string;
 * turns = the sessions' turns in the same (date-sorted) order as (user, assistant) rounds;
 * question = "Current Date: <date>\nQuestion: <q>\nAnswer:" (the part of the prompt after the history);
 * answers = [answer] (JSON numbers as decimal strings); qtype = question_type; abstention = id ends
 * in "_abs"; task = the file's base name up to its first '.' when it starts with "longmemeval"
 * (e.g. "longmemeval_oracle"), else "longmemeval"; max_new_tokens = 500 (800 with cot); the file is
 * walked element by element, so memory is the file plus one parsed instance. */
int lme_load(const char *path, const char *format, int cot, int limit, kvb_samples *out, char *err, size_t err_len);
/* The reader prompt for a (possibly truncated) history string; malloc'd, NULL on OOM. */
char *lme_render_prompt(int cot, const char *history, const char *question_date, const char *question);
/* Token budget of the history: model_max_len - gen_len - 1000 (run_generation.py). */
int64_t lme_max_history_tokens(int64_t model_max_len, int64_t gen_len);
/* The reader keeps the FIRST tokens of an over-long history: returns min(n, max_len) (the caller
 * decodes ids[:result] and re-renders with lme_render_prompt); -1 if max_len < 0. */
int64_t lme_truncate_head(int64_t n, int64_t max_len);

/* ---- ShareGPT (multi-round chat; FastChat's cleaned_split layout) ---- */

/* [{"id", "conversations":[{"from","value"}]}]: chunks "<id>_<k>" of one conversation are merged in
 * order of k; leading assistant ("gpt") messages are dropped; human -> user, gpt -> assistant. Sample:
 * turns = every round but the last, question = the last user message, answers = [its recorded reply]
 * when there is one; qtype = sharegpt_bucket(rounds incl. the last). Conversations without a user
 * message are skipped (they still count toward limit). limit counts conversations in order of first
 * appearance; chunks appearing later in the file are still merged into them. */
int sharegpt_load(const char *path, int limit, kvb_samples *out, char *err, size_t err_len);
/* Round Attention's buckets: "mini" [0,10), "small" [10,30), "medium" [30,50), "large" >= 50 rounds. */
const char *sharegpt_bucket(int n_rounds);

/* ---- 2StageRetr (antgroup/OmniKV tiny_runs/make_2_stage_questions.py, benchmark/long_bench/cot_pred.py) ---- */

/* n_samples prompts; dictionary sizes cycle over OmniKV's [40,50,60,70,80,90,100,140,180,200] when
 * (min_pairs, max_pairs) = (40, 200), else over 10 sizes evenly spaced in [min_pairs, max_pairs]
 * (1 <= min_pairs <= max_pairs <= 10000). Deterministic for a seed. */
int twostage_generate(uint64_t seed, int n_samples, int min_pairs, int max_pairs, int cot, kvb_samples *out,
                      char *err, size_t err_len);
/* OmniKV's 2stage.jsonl: {"prompt", "answers"}; the CoT variant (the file's own wording). */
int twostage_load(const char *path, int limit, kvb_samples *out, char *err, size_t err_len);
/* Switches a 2StageRetr sample to cot_pred.py's CoT (cot = 1) or direct-answer variant: the sentence
 * swap in the prompt and the assistant prefill; 0 / -1 (OOM). */
int twostage_set_variant(kvb_sample *s, int cot);

/* ---- Needle in a haystack (gkamradt/LLMTest_NeedleInAHaystack llm_needle_haystack_tester.py) ---- */

/* Number of tokens of text as the model's tokenizer splits it, without BOS or other added tokens; < 0 on
 * failure. */
typedef int64_t (*kvb_count_tokens_fn)(void *ctx, const char *text);

#define NIAH_DEFAULT_NEEDLE \
    "\nThe best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.\n"
#define NIAH_DEFAULT_QUESTION "What is the best thing to do in San Francisco?"
#define NIAH_DEFAULT_KEY_PHRASE "eat a sandwich and sit in Dolores Park on a sunny day"
#define NIAH_CONTEXT_BUFFER_TOKENS 200 /* final_context_length_buffer */

/* One sample per (length, depth), lengths outer: the haystack (sorted *.txt of haystack_dir, or the
 * built-in generated filler when NULL) is repeated until it holds max(lengths) tokens, cut to
 * L - 200 - tokens(needle) tokens, and the needle goes in at depth% of it, moved back to just after
 * the previous '.' (depth 100: appended). needle/question/key_phrase NULL = the classic defaults;
 * count_tokens NULL = niah_count_words. Sample: context = haystack with needle, question = the
 * official second user message, prompt = context "\n\n" question, system = the official system
 * message, answers = [key_phrase], length = tokens of context. */
int niah_generate(const char *haystack_dir, const int *lengths, int n_len, const double *depths, int n_depth,
                  const char *needle, const char *question, const char *key_phrase, kvb_count_tokens_fn count_tokens,
                  void *tok_ctx, kvb_samples *out, char *err, size_t err_len);
/* Whitespace-separated words: a stand-in tokenizer (tests, quick runs). */
int64_t niah_count_words(void *ctx, const char *text);
/* np.round(np.linspace(lo, hi, n)) as the tester builds its default grid (round half to even). */
void niah_linspace_round(double lo, double hi, int n, double *out);
/* The built-in filler: deterministic English-like sentences, at least min_bytes long; NULL on OOM. */
char *niah_filler_text(size_t min_bytes);

/* ---- Multi-round recall (kvbench's own generator) ---- */

/* n_dialogues dialogues of n_rounds (user, assistant) rounds of filler chat; min(n_rounds, 4) distinct
 * personal facts are planted in distinct rounds; the question asks for one of them. answers = [the
 * exact value], qtype = "round=<r>" (1-based round of the asked fact). Deterministic per seed. */
int recall_generate(uint64_t seed, int n_dialogues, int n_rounds, kvb_samples *out, char *err, size_t err_len);

#endif
