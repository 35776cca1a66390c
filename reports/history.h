/* history.h — runs of one suite over time (nightly runs): OUT/history.md with a table per measure (score,
 * decode ms/token, device KV MiB) of every method@budget over the runs, oldest first, with each run's
 * date and commit, and OUT/history-<method>-<budget>.svg: the three trends stacked. */
#ifndef KVB_HISTORY_H
#define KVB_HISTORY_H

#include <stddef.h>

/* Read dirs[0..n) (run.json + results.jsonl), order them by run.json "created" (then by the order given),
 * and write out_dir/history.md and one SVG per method@budget. A row's score is the mean of its tasks' mean
 * scores (x100); decode ms/token and device KV MiB are means over its tasks. 0 or -1 + err. */
int kvb_history_write(const char *out_dir, char *const *dirs, int n, char *err, size_t err_len);

#endif
