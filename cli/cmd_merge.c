/* cmd_merge.c — `kvbench merge OUT DIR...`: join shard (or any same-suite) run directories into one run. */
#include <stdio.h>

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
    cli_opt opts[] = {CLI_FLAG("--allow-mixed", &o.allow_mixed), CLI_FLAG("--allow-missing", &o.allow_missing),
                      CLI_END};
    int n, stop = cli_parse("merge", HELP, opts, argc, argc, argv, &n);
    if (stop >= 0) return stop;
    if (n < 2) return cli_fail("merge: give OUT and at least one run directory (see --help)");
    const char *out = argv[1];
    char err[2048];
    int rc = kvb_merge(out, argv + 2, n - 1, &o, stderr, err, sizeof err);
    if (rc) return cli_fail("merge: %s", err);
    if (kvb_report_print_main(out, stdout, err, sizeof err)) return cli_fail("merge: %s", err);
    return 0;
}
