/* rouge.h — ROUGE-Lsum as Google's rouge_score package (0.1.2, rouge_scorer.py) computes it, which is what HF
 * evaluate's "rouge" metric runs and InfiniteBench's longbook_sum_eng scorer reads (src/compute_scores.py:
 * ROUGE_SCORER.compute(predictions=[pred], references=[label], use_aggregator=False)["rougeLsum"][0]).
 *
 * Sentences: the text split at "\n", empty pieces dropped (no nltk splitting: evaluate leaves split_summaries
 * off). Tokens: the sentence lower-cased, every run of characters outside [a-z0-9] a separator, no stemmer
 * (evaluate's default use_stemmer=False). Python's str.lower() maps only two non-ASCII characters onto [a-z0-9]:
 * U+0130 to "i" + a combining dot and U+212A (Kelvin sign) to "k"; both are honoured, every other non-ASCII
 * byte separates tokens as in Python. Score: summary-level LCS (ROUGE paper section 3.2) with the package's
 * guard against double counting: for each reference sentence, the union of one LCS (the package's backtrack,
 * ties broken the same way) with each candidate sentence; hits use up per-token counts. F = 2PR / (P + R).
 * Several references: the best F (score_multi's argmax). tests/test_infbench.c checks it against the Python. */
#ifndef KVB_ROUGE_H
#define KVB_ROUGE_H

/* ROUGE-Lsum F-measure in [0, 1] of pred against the best of refs[0..n_refs); 0 when either side has no token;
 * -1 on out of memory. */
double kvb_rouge_lsum(const char *pred, const char *const *refs, int n_refs);

#endif
