/* cmd_report.c — `kvbench report RUN_DIR` and `kvbench compare BASE NEW`. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "reports/report.h"
#include "reports/compare.h"

static const char *REPORT_HELP =
    "usage: kvbench report RUN_DIR\n"
    "\n"
    "Reads RUN_DIR/run.json and RUN_DIR/results.jsonl and writes RUN_DIR/summary.csv, RUN_DIR/report.md\n"
    "(paper-style score table with deltas to full and mean +- 95% bootstrap interval, efficiency table with\n"
    "measured KV), then prints the main table.\n";

static const char *COMPARE_HELP =
    "usage: kvbench compare BASE_RUN NEW_RUN [--max-score-drop X] [--max-slowdown P%] [--max-mem-growth P%]\n"
    "                       [--allow-mismatch]\n"
    "\n"
    "Prints a Markdown diff of two runs per (method, budget, task): score, decode ms/token and device KV.\n"
    "Exits 1 when a cell regresses beyond a tolerance: score below base by more than X points (x100 scale,\n"
    "default 2), decode slower by more than P% (default 10%), device KV larger by more than P% (default 1%).\n"
    "Runs of different suites or models are refused unless --allow-mismatch.\n";

int cmd_report(int argc, char **argv) {
    int n_pos, stop = cli_parse("report", REPORT_HELP, NULL, argc, argc, argv, &n_pos);
    if (stop >= 0) return stop;
    if (n_pos != 1) return cli_fail("report: give one run directory (see --help)");
    char err[1024];
    if (kvb_report_write(argv[1], err, sizeof err)) return cli_fail("report: %s", err);
    if (kvb_report_print_main(argv[1], stdout, err, sizeof err)) return cli_fail("report: %s", err);
    return 0;
}

/* --max-slowdown 10% or 10 */
static int pct_fn(void *dst, const char *opt, const char *v, char *err, size_t err_len) {
    char buf[64];
    snprintf(buf, sizeof buf, "%s", v);
    size_t l = strlen(buf);
    if (l && buf[l - 1] == '%') buf[l - 1] = 0;
    return cli_number(opt, buf, 0, 1e6, 0, dst, err, err_len);
}

int cmd_compare(int argc, char **argv) {
    double drop = 2.0, slow = 10.0, mem = 1.0;
    int allow = 0;
    cli_opt opts[] = {CLI_FLAG("--allow-mismatch", &allow), CLI_FLOAT("--max-score-drop", &drop, 0, 100),
                      CLI_FN("--max-slowdown", &slow, pct_fn), CLI_FN("--max-mem-growth", &mem, pct_fn), CLI_END};
    int n_pos, stop = cli_parse("compare", COMPARE_HELP, opts, argc, argc, argv, &n_pos);
    if (stop >= 0) return stop;
    if (n_pos > 2) return cli_fail("compare: give exactly two run directories");
    if (n_pos < 2) return cli_fail("compare: give two run directories (see --help)");
    const char *base = argv[1], *cur = argv[2];
    char err[1024];
    int rc = kvb_compare(base, cur, drop, slow, mem, allow, stdout, err, sizeof err);
    if (rc < 0) return cli_fail("compare: %s", err);
    return rc;
}
