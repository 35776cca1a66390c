/* shard.h — deterministic shards of a suite. A cell (model, method@budget with its options, benchmark, task,
 * sample) belongs to shard SHA-256(key) mod N, where key is the cell's fields joined by '\n' (see
 * kvb_shard_of). The N shards partition the suite: every cell lands in exactly one, whatever the machine,
 * thread count or order of completion. Shards are numbered from 0, like a Slurm job array's
 * SLURM_ARRAY_TASK_ID with --array=0-(N-1). tests/fixtures/shard_ref.py computes the same indices. */
#ifndef KVB_SHARD_H
#define KVB_SHARD_H

#include <stddef.h>

/* Shard index of count shards; count == 0 means the whole suite (no sharding). */
typedef struct {
    int index, count;
} kvb_shard;

/* Parse "i/N" (0 <= i < N <= 100000). 0, or -1 + a message naming the problem. */
int kvb_shard_parse(const char *text, kvb_shard *out, char *err, size_t err_len);
/* "i/N", or "" for no sharding. */
void kvb_shard_format(const kvb_shard *s, char *out, size_t cap);
/* The shard (0..count-1) of one cell: SHA-256 of "model_sha\nmethod@budget\nopts_json\nbenchmark\ntask\nsample_id"
 * (opts_json: the method's options as compact JSON, "" for none), its first 8 bytes read big-endian, mod
 * count. -1 when count < 1 or the digest fails. */
int kvb_shard_of(const char *model_sha, const char *method, const char *budget, const char *opts_json,
                 const char *benchmark, const char *task, const char *sample_id, int count);

/* Write DIR/plan.jsonl (path): the rows an earlier run of the folder planned, in their order, then rows (JSONL
 * text, one [method, budget, benchmark, task, sample_id, shard] a line) not among them. So the plan names every
 * cell the folder's runs planned: a narrowed run (--methods, --limit) does not make earlier records look like
 * cells of another suite (the report warns of records the plan lacks). 0, or -1 + err. */
int kvb_plan_write(const char *path, const char *rows, char *err, size_t err_len);

#endif
