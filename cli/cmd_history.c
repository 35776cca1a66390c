/* cmd_history.c — `kvbench history RUN_DIR...`: a suite's trend over runs (nightly pages). */
#include <stdio.h>

#include "cli/cli.h"
#include "reports/history.h"

static const char *HELP =
    "usage: kvbench history RUN_DIR... [--out DIR]\n"
    "\n"
    "Orders the runs by their run.json date and writes DIR/history.md (each run's date, commit and host, then\n"
    "per method@budget: score, decode ms/token and device KV MiB in every run, and the change of the last\n"
    "run against the one before) and DIR/history-<method>-<budget>.svg (the three trends, one chart each).\n"
    "\n"
    "options:\n"
    "  --out DIR              where to write (default: history)\n";

int cmd_history(int argc, char **argv) {
    const char *out = "history";
    cli_opt opts[] = {CLI_STR("--out", &out), CLI_END};
    int n, stop = cli_parse("history", HELP, opts, argc, argc, argv, &n);
    if (stop >= 0) return stop;
    if (!n) return cli_fail("history: give at least one run directory (see --help)");
    char err[1024];
    int rc = kvb_history_write(out, argv + 1, n, err, sizeof err);
    if (rc) return cli_fail("history: %s", err);
    printf("wrote %s/history.md (%d runs)\n", out, n);
    return 0;
}
