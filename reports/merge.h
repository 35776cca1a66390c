/* merge.h — join run directories (the shards of `kvbench run --shard i/N`, or any runs of one suite and
 * model) into one run directory with the report of an unsharded run. */
#ifndef KVB_MERGE_H
#define KVB_MERGE_H

#include <stddef.h>
#include <stdio.h>

typedef struct {
    int allow_mixed;   /* join runs of different suites, models, commits or plans; the values go to run.json "mixed" */
    int allow_missing; /* write the merge although planned cells have no record; they go to run.json "missing" */
} kvb_merge_opts;

/* Join dirs[0..n) into out_dir: results.jsonl in the suite's run order (DIR/plan.jsonl), plan.jsonl, a
 * run.json that keeps the first run's identity plus "merged_from" (each input's dir, shard, commit, host,
 * device, records), then the report. Records of the same cell (method, budget, benchmark, task, sample_id)
 * that agree on everything but timings are kept once. Refused, with one line naming the problem: runs of
 * different suites, models or commits (unless allow_mixed); a cell recorded twice with different results;
 * planned cells without a record (unless allow_missing); out_dir being an input or a run that is not a
 * merge. A summary line goes to log (may be NULL). 0 or -1 + err. */
int kvb_merge(const char *out_dir, char *const *dirs, int n, const kvb_merge_opts *o, FILE *log, char *err, size_t err_len);

#endif
