/* cmd_history.c — `kvbench history RUN_DIR...`: a suite's trend over runs (nightly pages). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    char **dirs = calloc((size_t)argc + 1, sizeof *dirs);
    if (!dirs) return cli_fail("history: out of memory");
    int n = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(HELP, stdout);
            free(dirs);
            return 0;
        }
        if (!strcmp(a, "--out")) {
            if (i + 1 >= argc) { free(dirs); return cli_fail("history: --out needs a directory"); }
            out = argv[++i];
        } else if (a[0] == '-') { free(dirs); return cli_fail("history: unknown option '%s' (see --help)", a); }
        else dirs[n++] = argv[i];
    }
    if (!n) { free(dirs); return cli_fail("history: give at least one run directory (see --help)"); }
    char err[1024];
    int rc = kvb_history_write(out, dirs, n, err, sizeof err);
    free(dirs);
    if (rc) return cli_fail("history: %s", err);
    printf("wrote %s/history.md (%d runs)\n", out, n);
    return 0;
}
