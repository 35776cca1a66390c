/* cells.h — a suite's method x budget cells: the suite's "methods" and "budgets", narrowed by --methods,
 * budgets replaced by --budgets, and the command line's --method-opt values merged into each method's "opts"
 * (so a record's fingerprint names every option its method ran with). */
#ifndef KVB_CELLS_H
#define KVB_CELLS_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "methods/method.h"

#define KVB_MAX_CELLS 256 /* every method (about 30) at the leaderboard's four ratios, with room */

typedef struct {
    char method[32], budget_str[32]; /* budget_str: canonical (kvb_budget_format), the records' "budget" */
    char budget_given[32];           /* as the suite or --budgets wrote it */
    kvb_budget budget;
    const cJSON *opts;      /* the method's options (the suite's, with the command line's merged), or NULL */
    kvb_method_needs needs; /* what its method asks of the sample's session */
} kvb_run_cell;

typedef struct {
    kvb_run_cell v[KVB_MAX_CELLS];
    int n;
    cJSON *owned; /* merged option objects the cells point into */
} kvb_cells;

/* What narrows and extends the suite (all may be NULL / 0). */
typedef struct {
    const char *suite_path;       /* for errors */
    const char *methods;          /* comma list: only these methods */
    const char *budgets;          /* comma list replacing the suite's budgets */
    const char *const *opts;      /* raw --method-opt values: "key=value" (every method but the baseline) or
                                     "method:key=value" (that method), as `generate` takes them */
    int n_opts;
} kvb_cells_args;

/* Expand a suite's cells; 0, or -1 + one-line error (no methods, unknown method, malformed option, a method
 * needing a budget without one, nothing left after --methods, one cell twice: the same method listed twice, or
 * budgets that are one budget as recorded, "30%" and "30.0%"). Free with kvb_cells_free. */
int kvb_cells_expand(const cJSON *suite, const kvb_cells_args *a, kvb_cells *out, char *err, size_t err_len);
void kvb_cells_free(kvb_cells *c);

#endif
