/* full.c — exact attention over the whole cache (alias flash): the baseline every method is measured
 * against. No hooks; it holds every token on the device tier and claims exactly that. A budget below 100%
 * is an error: full keeps everything by definition. */
#include "methods/method.h"

#include <stdio.h>
#include <stdlib.h>

static int64_t full_expected(kvb_method *m, kvb_ctx *c, int layer) {
    (void)m;
    (void)layer;
    return c->n_past;
}

static void full_describe(kvb_method *m, char *buf, size_t cap) {
    (void)m;
    snprintf(buf, cap, "exact");
}

static void full_destroy(kvb_method *m) { free(m); }

static kvb_method *full_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len) {
    (void)c;
    (void)o;
    if (b->kind == KVB_BUDGET_TOKENS || (b->kind == KVB_BUDGET_FRACTION && b->frac < 1.0)) {
        snprintf(err, err_len, "method full keeps the whole cache: give it no budget (or 100%%)");
        return NULL;
    }
    kvb_method *m = calloc(1, sizeof *m);
    if (!m) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    m->budget = *b;
    return m;
}

const kvb_method_def kvb_method_full = {
    .name = "full",
    .aliases = "flash",
    .summary = "exact attention over the whole cache (the baseline)",
    .traits = KVB_NO_BUDGET | KVB_SHARES_PREFILL,
    .create = full_create,
    .expected_tokens = full_expected,
    .describe = full_describe,
    .destroy = full_destroy,
};
