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

#endif
