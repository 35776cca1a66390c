/* hidden.h — query-agnostic evaluation (DESIGN.md "Question visible or hidden"; kvpress's protocol): the
 * context is prefilled and compressed before the question is seen, then the question is prefilled on the
 * compressed cache and the answer decoded. This module finds where the question starts in a built prompt. */
#ifndef KVB_HIDDEN_H
#define KVB_HIDDEN_H

#include <stddef.h>
#include <stdint.h>

#include "benchmarks/prompt.h"
#include "benchmarks/sample.h"
#include "engine/model.h"

/* The number of leading prompt ids that hold everything up to the end of the sample's context (chat template
 * head, instructions, context): the longest common prefix of p->ids and the ids of the rendered prompt cut
 * right after the context, so the split never changes a token of the prompt. A prompt truncated in the middle
 * (p->truncated) splits where the ids of the rendered text after the context start, matched from the prompt's
 * end. Needs s->context inside s->prompt, and a cut that left the question whole; 0 (*split in [1, p->n)), or
 * -1 with a one-line reason. */
int kvb_hidden_split(const kvb_model *m, const kvb_sample *s, const kvb_prompt *p, int64_t *split, char *err,
                     size_t err_len);

/* The prompt of a carried turn (kvb_sample.carried: SCBench's multi-turn KV cache reuse) as the official code
 * feeds its cache (eval_utils.py create_multiturn_prompt with the chat template, GreedySearch.test): piece 1 is the
 * first user message in the chat template with the assistant prompt opened, as a single prompt renders it; piece
 * j > 1 is the template's rendering of [system "", assistant <reference answer j-1>, user <follow-up j>] with the
 * assistant prompt opened, less its rendering of [system ""] alone, then the sample's assistant prefill (SCBench's
 * summary: "This paper", after every follow-up). Each piece is tokenized alone (piece 1 with the model's BOS, the
 * rest without), so the ids are the concatenation the official code prefills turn after turn; one round per piece.
 * *split: the end of piece 1 (the first turn's prompt, compressed once); *own: where this turn's piece starts (=
 * *split for turn 2, 0 for turn 1). The turn is never cut: longer than max_tokens is an error. 0, or -1 + err. */
int kvb_carried_build(const kvb_model *m, const kvb_sample *s, int64_t max_tokens, kvb_prompt *p, int64_t *split,
                      int64_t *own, char *err, size_t err_len);

#endif
