/* budget.h — KV budgets (DESIGN.md "Budgets"): "30%" = Mem%, that share of the full KV bytes at the end of
 * prefill; "1024" = tokens per layer and KV head. */
#ifndef KVB_BUDGET_H
#define KVB_BUDGET_H

#include <stddef.h>
#include <stdint.h>

typedef enum { KVB_BUDGET_NONE = 0, KVB_BUDGET_FRACTION, KVB_BUDGET_TOKENS } kvb_budget_kind;

typedef struct {
    kvb_budget_kind kind;
    double frac;    /* KVB_BUDGET_FRACTION: (0, 1] */
    int64_t tokens; /* KVB_BUDGET_TOKENS: > 0 */
} kvb_budget;

/* "30%", "0.3" is rejected (ambiguous), "1024" tokens, "full"/"100%"/"" = fraction 1. One-line error. */
int kvb_budget_parse(const char *s, kvb_budget *b, char *err, size_t err_len);
/* kvpress's compression ratio R (remove R of the prompt's KV) as the budget string it means, into pct: "25%" for
 * 0.75, "full" for 0 (the fraction 1 - R through "%g%%", so ratio 0.7 and "30%" are the same budget, down to the
 * records' "budget" string); -1 + one-line error unless r is a plain number in [0, 1). */
int kvb_budget_ratio_str(const char *r, char *pct, size_t cap, char *err, size_t err_len);
/* "30%", "1024", "full" */
void kvb_budget_format(const kvb_budget *b, char *buf, size_t cap);
/* Tokens per layer and KV head the budget allows for a cache of n tokens (fraction: rounded to nearest, at
 * least 1). Errors when a token budget exceeds n. */
int kvb_budget_tokens(const kvb_budget *b, int64_t n, int64_t *out, char *err, size_t err_len);
/* Tokens per KV head a method that evicts as the sequence grows may hold at length len: a token budget as given,
 * a fraction of len (kvb_budget_tokens), never more than len. */
int64_t kvb_budget_at(const kvb_budget *b, int64_t len);

#endif
