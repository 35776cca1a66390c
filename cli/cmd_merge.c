/* cmd_merge.c — `kvbench merge OUT DIR...`: join shard (or any same-suite) run directories into one run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "reports/merge.h"
#include "reports/report.h"

static const char *HELP =
    "usage: kvbench merge OUT DIR... [--allow-mixed] [--allow-missing]\n"
    "\n"
    "Joins run directories — the shards of `kvbench run --shard i/N`, or any runs of one suite and model — into\n"
    "OUT: results.jsonl in the order an unsharded run writes (each run's plan.jsonl), a run.json with every\n"
    "input's provenance under \"merged_from\", summary.csv, report.md and charts; prints the main table.\n"
    "A cell recorded by two inputs is kept once when both agree on everything but timings.\n"
    "\n"
    "Refused (one line, exit 1): runs of different suites, models or commits; a cell recorded twice with\n"
    "different results (named); planned cells with no record (named: a shard missing or unfinished); OUT\n"
    "being an input, or a run directory that is not an earlier merge.\n"
    "\n"
    "options:\n"
    "  --allow-mixed          merge runs of different suites, models or commits (listed in run.json \"mixed\")\n"
    "  --allow-missing        write the merge although cells are missing (listed in run.json \"missing\")\n";

int cmd_merge(int argc, char **argv) {
    kvb_merge_opts o = {0};
    const char *out = NULL;
    char **dirs = calloc((size_t)argc + 1, sizeof *dirs);
    if (!dirs) return cli_fail("merge: out of memory");
    int n = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(HELP, stdout);
            free(dirs);
            return 0;
        }
        if (!strcmp(a, "--allow-mixed")) o.allow_mixed = 1;
        else if (!strcmp(a, "--allow-missing")) o.allow_missing = 1;
        else if (a[0] == '-') { free(dirs); return cli_fail("merge: unknown option '%s' (see --help)", a); }
        else if (!out) out = a;
        else dirs[n++] = argv[i];
    }
    if (!out || !n) { free(dirs); return cli_fail("merge: give OUT and at least one run directory (see --help)"); }
    char err[2048];
    int rc = kvb_merge(out, dirs, n, &o, stderr, err, sizeof err);
    free(dirs);
    if (rc) return cli_fail("merge: %s", err);
    if (kvb_report_print_main(out, stdout, err, sizeof err)) return cli_fail("merge: %s", err);
    return 0;
}
