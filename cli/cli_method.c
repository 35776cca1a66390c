/* cli_method.c — the defaults of the method options every running subcommand shares (CLI_METHOD_OPTS), the
 * options of one method from raw --method-opt values, and the measured-KV report. */
#include <stdio.h>
#include <string.h>

#include "benchmarks/runcal.h"
#include "cli/cli.h"
#include "methods/calibrate.h"

void cli_method_defaults(cli_method_opts *o) {
    memset(o, 0, sizeof *o);
    o->method = "full";
    o->budget.kind = KVB_BUDGET_NONE; /* the method's own default (an error for methods that need one) */
}

int cli_fn_method(void *dst, const char *opt, const char *v, char *err, size_t err_len) {
    if (!kvb_method_find(v)) {
        char names[2048];
        kvb_method_names(names, sizeof names);
        return snprintf(err, err_len, "unknown method '%s' (available: %s)", v, names), -1;
    }
    *(const char **)dst = v;
    return 0;
}

int cli_fn_budget(void *dst, const char *opt, const char *v, char *err, size_t err_len) {
    return kvb_budget_parse(v, dst, err, err_len);
}

int cli_fn_compression_ratio(void *dst, const char *opt, const char *v, char *err, size_t err_len) {
    (void)opt;
    char pct[32];
    return kvb_budget_ratio_str(v, pct, sizeof pct, err, err_len) ? -1 : kvb_budget_parse(pct, dst, err, err_len);
}

int cli_method_opt_prefix_check(const char *v, char *err, size_t err_len) {
    const char *colon = strchr(v, ':'), *eq = strchr(v, '=');
    if (!colon || (eq && eq < colon)) return 0; /* K=V, or a value holding ':' */
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)(colon - v), v);
    if ((size_t)(colon - v) < sizeof name && kvb_method_find(name)) return 0;
    char names[2048];
    kvb_method_names(names, sizeof names);
    return snprintf(err, err_len, "--method-opt %s: no method is named '%s' (available: %s)", v, name, names), -1;
}

int cli_fn_method_opt(void *dst, const char *opt, const char *v, char *err, size_t err_len) {
    return kvb_opts_add(dst, v, err, err_len);
}

void cli_print_kv_usage(const kvb_method *m, const kvb_ctx *c, const char *when, FILE *out) {
    kvb_kv_usage u;
    kvb_method_usage(m, c, &u);
    const double MiB = 1024.0 * 1024.0;
    fprintf(out, "kv %-12s device %8.2f MiB (%5.1f%% of full %.2f MiB)  host %8.2f MiB  moved h2d %.2f MiB d2h %.2f MiB\n",
            when, u.device_bytes / MiB, 100.0 * u.device_frac, u.full_bytes / MiB, u.host_bytes / MiB, u.moved_h2d / MiB,
            u.moved_d2h / MiB);
}

int cli_calibrate_methods(const char *who, kvb_model *m, const kvb_ctx_params *cp, char *const *names, int n,
                          const char *const *raw, int n_raw, int refuse) {
    if (!m->tok) return 0; /* synthetic: nothing to calibrate on; the method names the option that stands in */
    enum { MAX_KINDS = 64 };
    const char *kinds[MAX_KINDS];
    int n_kinds = 0;
    char err[768];
    for (int k = 0; k < n && n_kinds < MAX_KINDS; k++) {
        kvb_opts o;
        kvb_method_needs nd;
        if (kvb_opts_for_method(names[k], raw, n_raw, &o, err, sizeof err) ||
            kvb_method_needs_of(names[k], &o, &nd, err, sizeof err))
            return cli_fail("%s: %s", who, err);
        if (nd.profile) kinds[n_kinds++] = nd.profile;
    }
    if (kvb_calibrate_missing(who, m, cp, kinds, n_kinds, KVB_CAL_SAMPLES, KVB_CAL_ROUNDS, NULL, refuse, stderr, err,
                              sizeof err))
        return cli_fail("%s: %s", who, err);
    return 0;
}
