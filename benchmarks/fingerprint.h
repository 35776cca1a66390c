/* fingerprint.h — what determines a result record, and the resume index built from results.jsonl.
 *
 * Every record carries "fingerprint": {"sha256", and one entry per field}: the model's sha256, the method,
 * its options from the suite (canonical JSON, keys sorted), the budget, the benchmark's parameters
 * (canonical JSON without the count-only keys "limit", "samples", "dialogues" and "optional", whose effect
 * on a sample is in the sample's own hash), a hash of the sample's content (prompt, turns, question,
 * answers, stop string, ...), the generation settings (max new tokens, seed, round chunk, greedy) and the
 * kvbench record version. A resumed run reuses a record only when every field matches; otherwise the
 * runner stops with a one-line error naming the cell and the first differing field, or (--rerun-changed)
 * runs the cell again and appends the new record, which supersedes the old one.
 *
 * Records of judged tasks are written in two steps so that a killed run loses no generation: the record
 * is appended as soon as the prediction exists, with "judge": {"kind", "pending": true} and a null score;
 * when the verdict (or the judge's error) arrives the complete record is appended with the same key. The
 * last record of a key wins, here and in the reports (reports/results.c); a resume re-judges a key whose
 * last record is still pending, from its stored prediction, without generating again. */
#ifndef KVB_FINGERPRINT_H
#define KVB_FINGERPRINT_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "benchmarks/sample.h"

/* Bumped whenever the engine, a method or a metric changes what a record would hold for the same inputs. */
#define KVB_RECORD_VERSION "kvbench-0.1/records-2"

typedef struct {
    const char *model_sha256, *method, *budget;
    const cJSON *method_opts;   /* the suite's "opts" of the method, or NULL */
    const cJSON *benchmark;     /* the suite's benchmark object, or NULL */
    const char *sample_sha256;  /* kvb_fp_sample */
    int max_new_tokens, round_chunk;
    double seed;
    const char *engine;         /* engine settings that change results beside the defaults ("kv=f32 ctx=4096"),
                                   or NULL / "" for none */
} kvb_fp_in;

/* sha256 (hex) of everything in a sample that reaches the prompt or the scoring. */
void kvb_fp_sample(const kvb_sample *s, char out[65]);
/* The "fingerprint" object of a record (caller owns), NULL on OOM. */
cJSON *kvb_fp_make(const kvb_fp_in *in);
/* 0 when stored and now agree; else 1 with the first differing field's name and both values (one line) in
 * why, e.g. "method_opts: stored {\"window\":32}, now {\"window\":8}". A NULL stored fingerprint differs. */
int kvb_fp_compare(const cJSON *stored, const cJSON *now, char *why, size_t why_len);

/* The resume index: for each record key (method|budget|task|sample_id) the last record's fingerprint and,
 * when that record still waits for its verdict, the record itself. */
typedef struct {
    char *key;
    cJSON *fingerprint; /* NULL for a record written without one */
    cJSON *pending;     /* the whole record when its judge is pending, else NULL */
    long line;
} kvb_fp_entry;

typedef struct {
    kvb_fp_entry *v;
    int n, cap;
} kvb_fp_index;

/* The key of a cell's record, "method|budget|task|id" with '|' and '\\' inside a field escaped by a '\\' (so
 * distinct cells never share a key), written into buf[cap] as snprintf writes; returns the length the whole key
 * needs (a longer one is cut: kvb_fp_key_new has no limit; ids of any length, LongBench's _id included). */
size_t kvb_fp_key(char *buf, size_t cap, const char *method, const char *budget, const char *task, const char *id);
/* The whole key, malloc'd; NULL when out of memory. */
char *kvb_fp_key_new(const char *method, const char *budget, const char *task, const char *id);
/* Add one parsed record (line number for the order); 0, or -1 when it is not a result record. */
int kvb_fp_index_add(kvb_fp_index *ix, const cJSON *rec, long line);
/* Sort and keep the last record of each key; call once after the adds. */
void kvb_fp_index_finish(kvb_fp_index *ix);
/* The entry of a key, or NULL. */
const kvb_fp_entry *kvb_fp_index_find(const kvb_fp_index *ix, const char *key);
void kvb_fp_index_free(kvb_fp_index *ix);

#endif
