/* cmd_report.c — `kvbench report RUN_DIR` and `kvbench compare BASE NEW`. */
#include <stdio.h>
#include <stdlib.h>
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
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        fputs(REPORT_HELP, stdout);
        return 0;
    }
    if (argc != 2) return cli_fail("report: give one run directory (see --help)");
    char err[1024];
    if (kvb_report_write(argv[1], err, sizeof err)) return cli_fail("report: %s", err);
    if (kvb_report_print_main(argv[1], stdout, err, sizeof err)) return cli_fail("report: %s", err);
    return 0;
}

static int pct(const char *opt, const char *v, double *out) {
    char buf[64];
    snprintf(buf, sizeof buf, "%s", v);
    size_t l = strlen(buf);
    if (l && buf[l - 1] == '%') buf[l - 1] = 0;
    return cli_float(opt, buf, 0, 1e6, out);
}

int cmd_compare(int argc, char **argv) {
    const char *base = NULL, *cur = NULL;
    double drop = 2.0, slow = 10.0, mem = 1.0;
    int allow = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(COMPARE_HELP, stdout);
            return 0;
        }
        if (!strcmp(a, "--allow-mismatch")) { allow = 1; continue; }
        if (a[0] != '-') {
            if (!base) base = a;
            else if (!cur) cur = a;
            else return cli_fail("compare: give exactly two run directories");
            continue;
        }
        if (i + 1 >= argc) return cli_fail("compare: %s needs a value", a);
        const char *v = argv[++i];
        if (!strcmp(a, "--max-score-drop")) { if (cli_float(a, v, 0, 100, &drop)) return 1; }
        else if (!strcmp(a, "--max-slowdown")) { if (pct(a, v, &slow)) return 1; }
        else if (!strcmp(a, "--max-mem-growth")) { if (pct(a, v, &mem)) return 1; }
        else return cli_fail("compare: unknown option '%s' (see --help)", a);
    }
    if (!base || !cur) return cli_fail("compare: give two run directories (see --help)");
    char err[1024];
    int rc = kvb_compare(base, cur, drop, slow, mem, allow, stdout, err, sizeof err);
    if (rc < 0) return cli_fail("compare: %s", err);
    return rc;
}
