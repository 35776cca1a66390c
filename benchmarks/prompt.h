/* prompt.h — a benchmark sample turned into the token ids the engine prefills, with round boundaries.
 *
 * Single prompts (LongBench, 2StageRetr, NIAH, LongMemEval's official single message): the prompt text,
 * middle-truncated in tokens as LongBench's pred.py does when it is longer than the budget, wrapped in the
 * model's chat template when the sample asks (system message, assistant prefill), tokenized; rounds are
 * `round_chunk`-token chunks from the start (the last, possibly shorter, chunk is the question) so round-level
 * methods can run on them, and the results say so. Dialogues (multi-round recall, ShareGPT): each (user,
 * assistant) round is rendered with the chat template as its own segment, so the round boundaries are the
 * real ones; the final user question and the assistant prompt form the question round. A dialogue longer
 * than the budget drops its latest history rounds (the head is kept, as LongMemEval's reader does). */
#ifndef KVB_PROMPT_H
#define KVB_PROMPT_H

#include <stdint.h>

#include "benchmarks/sample.h"
#include "engine/model.h"
#include "engine/session.h"

/* round_end: round r covers [round_end[r-1], round_end[r]); the last round is the question; truncated: tokens
 * or rounds were dropped to fit. */
typedef kvb_rounds kvb_prompt;

/* A prompt builder: the prompt of sample s within max_tokens (prompt only; the caller leaves room for generation),
 * single prompts cut into round_chunk-token rounds; 0, or -1 + one-line err (out then holds nothing). Each
 * benchmark's row (registry.h) names the builder its samples take. */
typedef int (*kvb_prompt_fn)(const kvb_model *m, const kvb_sample *s, int64_t max_tokens, int round_chunk,
                             kvb_prompt *out, char *err, size_t err_len);

/* A single prompt (s->prompt): middle-cut, in the chat template when s->use_chat, chunked into rounds. */
int kvb_prompt_single(const kvb_model *m, const kvb_sample *s, int64_t max_tokens, int round_chunk, kvb_prompt *out,
                      char *err, size_t err_len);
/* A dialogue (s->turns, then s->question): one round per (user, assistant) pair, latest history dropped to fit;
 * round_chunk is unused (the rounds are the dialogue's own). */
int kvb_prompt_dialogue(const kvb_model *m, const kvb_sample *s, int64_t max_tokens, int round_chunk, kvb_prompt *out,
                        char *err, size_t err_len);
/* Either, by the sample's shape (a dialogue when it has turns and a question but no prompt): for benchmarks whose
 * samples take both (SCBench: a session's first turn is one prompt, its later turns dialogues) and for callers
 * with no benchmark row (calibration, bench-serve). */
int kvb_prompt_build(const kvb_model *m, const kvb_sample *s, int64_t max_tokens, int round_chunk, kvb_prompt *out,
                     char *err, size_t err_len);
void kvb_prompt_free(kvb_prompt *p);
/* A single prompt's text as kvb_prompt_build tokenizes it, with `text` as the user message: the model's chat
 * template around it (the sample's system message, the template's default one) and the sample's assistant
 * prefill after it when s->use_chat, else text itself; malloc'd, NULL + err on failure. */
char *kvb_prompt_render(const kvb_model *m, const kvb_sample *s, const char *text, char *err, size_t err_len);
/* A single prompt's user text after the middle cut kvb_prompt_single makes within max_tokens (before the chat
 * template): what a server is sent so that its template gives the same prompt (bench-serve --url); malloc'd, NULL +
 * err on failure. */
char *kvb_prompt_cut_text(const kvb_model *m, const kvb_sample *s, int64_t max_tokens, char *err, size_t err_len);
/* Tokens of text for model (a kvb_model *), no BOS: the kvb_count_tokens_fn the generators take; -1 on failure. */
int64_t kvb_count_tokens(void *model, const char *text);

#endif
