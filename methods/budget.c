/* budget.c — parsing, formatting and sizing KV budgets. */
#include "methods/budget.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "methods/method.h" /* kvb_errf */

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

int kvb_budget_parse(const char *s, kvb_budget *b, char *err, size_t err_len) {
    memset(b, 0, sizeof *b);
    if (!s || !*s || !strcmp(s, "full")) {
        b->kind = KVB_BUDGET_FRACTION;
        b->frac = 1.0;
        return 0;
    }
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno) return ERR("budget '%s' is not a number (use e.g. 30%% or 1024 tokens)", s);
    if (*end == '%' && end[1] == 0) {
        if (!(v > 0) || v > 100) return ERR("budget %s is outside (0%%, 100%%]", s);
        b->kind = KVB_BUDGET_FRACTION;
        b->frac = v / 100.0;
        return 0;
    }
    if (*end) return ERR("budget '%s' is not a number (use e.g. 30%% or 1024 tokens)", s);
    if (v != floor(v)) return ERR("budget '%s': a fraction needs a %% sign (e.g. 30%%), tokens are whole", s);
    if (v <= 0) return ERR("budget %s must be positive", s);
    if (v > 1e9) return ERR("budget %s tokens is too large", s);
    b->kind = KVB_BUDGET_TOKENS;
    b->tokens = (int64_t)v;
    return 0;
}

int kvb_budget_ratio_str(const char *r, char *pct, size_t cap, char *err, size_t err_len) {
    char *end = NULL;
    errno = 0;
    double v = r && *r ? strtod(r, &end) : NAN;
    if (!r || !*r || *end || errno || !(v >= 0 && v < 1))
        return ERR("compression ratio '%s' must be a number in [0, 1) (kvpress's: the share of the prompt's KV removed; "
                   "0.75 = budget 25%%)", r ? r : "");
    if (v == 0) snprintf(pct, cap, "full");
    else snprintf(pct, cap, "%g%%", (1.0 - v) * 100.0);
    return 0;
}

void kvb_budget_format(const kvb_budget *b, char *buf, size_t cap) {
    if (b->kind == KVB_BUDGET_TOKENS) snprintf(buf, cap, "%lld", (long long)b->tokens);
    else if (b->kind == KVB_BUDGET_FRACTION && b->frac < 1.0) snprintf(buf, cap, "%g%%", b->frac * 100.0);
    else snprintf(buf, cap, "full");
}

/* kvb_budget_tokens on a model of n_global global and n_local local layers of window `window` (method.h
 * kvb_method_budget_tokens); n_local = 0: every layer global. */
static int budget_tokens_hybrid(const kvb_budget *b, int n_global, int n_local, int64_t window, int64_t n, int64_t *out,
                                char *err, size_t err_len) {
    double f = b->kind == KVB_BUDGET_FRACTION ? b->frac : 1.0; /* NONE: everything */
    if (b->kind == KVB_BUDGET_TOKENS || n_local == 0 || f >= 1.0) return kvb_budget_tokens(b, n, out, err, err_len);
    const int64_t w = n < window ? n : window;
    const double local = (double)n_local * (double)w, all = (double)n_global * (double)n + local;
    const double t = n_global > 0 ? (f * all - local) / n_global : -1;
    if (t < 0.5) {
        *out = 1;
        if (!err) return -1;
        return ERR("budget %g%% is below the share the %d sliding-window layers' windows hold (%.1f%% of the cache at "
                   "%lld tokens): the method works on the global layers only", 100 * f, n_local, 100.0 * local / all,
                   (long long)n);
    }
    int64_t ti = (int64_t)llround(t);
    *out = ti > n ? n : ti;
    return 0;
}

void kvb_method_bind_layers(kvb_method *m, const kvb_config *cfg) {
    m->n_global = m->n_local = 0;
    m->window = 0;
    for (int l = 0; l < cfg->n_layer; l++) {
        int w = kvb_layer_window(cfg, l);
        if (w) m->n_local++, m->window = w;
        else m->n_global++;
    }
}

int kvb_method_budget_tokens(const kvb_method *m, int64_t n, int64_t *out, char *err, size_t err_len) {
    return budget_tokens_hybrid(&m->budget, m->n_global, m->n_local, m->window, n, out, err, err_len);
}

int64_t kvb_method_budget_at(const kvb_method *m, int64_t len) {
    if (m->budget.kind == KVB_BUDGET_TOKENS || !m->n_local) return kvb_budget_at(&m->budget, len);
    int64_t t = len;
    budget_tokens_hybrid(&m->budget, m->n_global, m->n_local, m->window, len, &t, NULL, 0);
    return t < len ? t : len;
}

int kvb_budget_tokens(const kvb_budget *b, int64_t n, int64_t *out, char *err, size_t err_len) {
    if (b->kind == KVB_BUDGET_TOKENS) {
        if (b->tokens > n)
            return ERR("budget of %lld tokens is more than the prompt's %lld tokens", (long long)b->tokens,
                       (long long)n);
        *out = b->tokens;
        return 0;
    }
    double f = b->kind == KVB_BUDGET_FRACTION ? b->frac : 1.0; /* NONE: everything */
    int64_t t = (int64_t)llround(f * (double)n);
    *out = t < 1 ? 1 : (t > n ? n : t);
    return 0;
}

int64_t kvb_budget_at(const kvb_budget *b, int64_t len) {
    int64_t t = len;
    if (b->kind == KVB_BUDGET_TOKENS) t = b->tokens;
    else kvb_budget_tokens(b, len, &t, NULL, 0); /* a fraction (or none) is never an error */
    return t < len ? t : len;
}
