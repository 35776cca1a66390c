/* cli_method.c — the defaults of the method options every running subcommand shares (CLI_METHOD_OPTS), the
 * options of one method from raw --method-opt values, and the measured-KV report. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

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
