/* record.h — the result record: one line of RUN_DIR/results.jsonl per (method, budget, benchmark, task, sample).
 *
 * The record is declared once, by the field list KVB_RECORD_FIELDS below: each row is a JSON key, its type, its
 * flags and a member of kvb_record of the same name. The struct, the field table (kvb_record_fields) and with
 * them the writer (kvb_record_to_json: what `kvbench run` appends) and the reader (kvb_record_from_json: what
 * run's resume, report, compare, history and merge read, through reports/results.h) are all made from it, so a
 * new field is one row here: written, read, type-checked and round-trip tested without another edit.
 *
 * Field types and how an absent value is held:
 *   STR   char *      NULL when absent or null ("" error texts count as none on reading)
 *   NUM   double      NAN when absent or null; finite when present, and not negative unless SIGNED
 *   BOOL  int         0 when absent or null
 *   STRS  kvb_strs    an array of strings; n = 0 when absent or null
 *   OBJ   cJSON *     a JSON object another module defines (the judge's verdict, the fingerprint, the phase
 *                     breakdown); NULL when absent or null
 * Flags:
 *   KVB_RF_REQUIRED  present and not null in every record (method, budget, task)
 *   KVB_RF_OMIT      the writer leaves it out when absent (NULL / NAN / 0), rather than writing null
 *   KVB_RF_TIMING    a measure of time: two runs of one cell differ in it (merge does not compare it)
 *   KVB_RF_UNIT      a number in [0, 1]
 *   KVB_RF_SIGNED    a number that may be negative (a needle's depth: -1 when none was placed)
 *   KVB_RF_BULK      text a report does not use (prediction, answers, ...): checked, but not kept by a lean read
 *
 * The reader is strict: a key that is no field, a key twice, a required field missing or null, a field of
 * another type, a number not finite or a UNIT number outside [0, 1] are errors, each one line. */
#ifndef KVB_RECORD_H
#define KVB_RECORD_H

#include <stddef.h>

struct cJSON;

typedef struct {
    char **v;
    int n;
} kvb_strs;

typedef enum { KVB_RF_STR, KVB_RF_NUM, KVB_RF_BOOL, KVB_RF_STRS, KVB_RF_OBJ } kvb_rf_type;

enum { KVB_RF_REQUIRED = 1 << 0, KVB_RF_OMIT = 1 << 1, KVB_RF_TIMING = 1 << 2, KVB_RF_UNIT = 1 << 3, KVB_RF_BULK = 1 << 4,
       KVB_RF_SIGNED = 1 << 5 };

/* X(TYPE, name, flags): every field of a record, in the order the writer writes them. */
#define KVB_RECORD_FIELDS(X)                                                                                        \
    X(STR, method, KVB_RF_REQUIRED)                                                                                 \
    X(STR, budget, KVB_RF_REQUIRED)        /* canonical ("30%", "1024", "full") */                                  \
    X(STR, method_params, KVB_RF_BULK)     /* the method's resolved parameters, as it describes them */             \
    X(STR, benchmark, 0)                   /* "other" on reading when absent */                                     \
    X(STR, task, KVB_RF_REQUIRED)                                                                                   \
    X(STR, sample_id, 0)                   /* a resume finds the record by it (the runner requires it) */           \
    X(STR, qtype, 0)                       /* LongMemEval's question type; LongBench v2's sub-domain */             \
    X(STR, length_bin, 0)                  /* LongBench-E's 0-4k / 4-8k / 8k+; LongBench v2's short / medium / long */ \
    X(STR, difficulty, KVB_RF_OMIT)        /* LongBench v2's easy / hard */                                         \
    X(STR, domain, KVB_RF_OMIT)            /* LongBench v2's domain */                                              \
    X(NUM, ctx_len, KVB_RF_OMIT)           /* a synthetic context's length in tokens (needle grid) */               \
    X(NUM, depth, KVB_RF_OMIT | KVB_RF_SIGNED) /* where its needle is (-1: none) */                                 \
    X(BOOL, abstention, 0)                 /* LongMemEval abstention question */                                    \
    X(NUM, prompt_tokens, 0)                                                                                        \
    X(STR, question, KVB_RF_BULK)          /* "visible" or "hidden" (compressed before the question) */             \
    X(STR, context_group, KVB_RF_BULK)     /* questions sharing one context, question hidden */                     \
    X(STR, shared_prefill, KVB_RF_BULK)    /* "first" holds the group's prefill cost, "reused" does not */          \
    X(NUM, prefill_tokens, 0)                                                                                       \
    X(NUM, prompt_rounds, 0)                                                                                        \
    X(BOOL, prompt_truncated, 0)                                                                                    \
    X(NUM, generated_tokens, 0)                                                                                     \
    X(STR, prediction, KVB_RF_BULK)                                                                                 \
    X(STR, first_prediction, KVB_RF_BULK | KVB_RF_OMIT) /* a follow-up's first reply (LongBench v2's CoT); scored: prediction */ \
    X(STRS, answers, KVB_RF_BULK)                                                                                   \
    X(STR, metric, 0)                                                                                               \
    X(NUM, score, KVB_RF_UNIT)             /* NAN when unscored */                                                  \
    X(OBJ, judge, KVB_RF_BULK)             /* benchmarks/judging.c's verdict, or {"pending": true} */               \
    X(STR, error, 0)                       /* the sample's failure, NULL when it ran */                             \
    X(NUM, ttft_ms, KVB_RF_TIMING)                                                                                  \
    X(NUM, prefill_ms, KVB_RF_TIMING)                                                                               \
    X(NUM, decode_ms_per_token, KVB_RF_TIMING)                                                                      \
    X(OBJ, breakdown, KVB_RF_TIMING | KVB_RF_BULK) /* {"prefill": {phase: ms}, "decode": {...}} */                  \
    X(NUM, kv_device_bytes, 0)             /* device KV held after prefill */                                       \
    X(NUM, kv_device_bytes_end, 0)         /* ... at the end of decode */                                           \
    X(NUM, kv_host_bytes, 0)                                                                                        \
    X(NUM, kv_full_bytes, 0)               /* what full attention would hold */                                     \
    X(NUM, moved_bytes, 0)                 /* host <-> device */                                                    \
    X(NUM, attended_per_layer, 0)                                                                                   \
    X(STR, note, KVB_RF_BULK)              /* the method's note ("single prompt: rounds are 512-token chunks") */   \
    X(NUM, seed, 0)                                                                                                 \
    X(STR, model_sha256, 0)                                                                                         \
    X(OBJ, fingerprint, KVB_RF_BULK)       /* benchmarks/fingerprint.h */                                           \
    X(BOOL, rerun, KVB_RF_OMIT)            /* --rerun-changed: supersedes an earlier record of the cell */

#define KVB_RF_CTYPE_STR char *
#define KVB_RF_CTYPE_NUM double
#define KVB_RF_CTYPE_BOOL int
#define KVB_RF_CTYPE_STRS kvb_strs
#define KVB_RF_CTYPE_OBJ struct cJSON *
#define KVB_RF_MEMBER(type, name, flags) KVB_RF_CTYPE_##type name;

/* One record. Every member it owns (strings, arrays, objects) is freed by kvb_record_free. */
typedef struct {
    KVB_RECORD_FIELDS(KVB_RF_MEMBER)
    /* derived on reading, not written */
    char *judge_error; /* judge.error when a non-empty string: the judge did not answer or no score parsed */
    int superseded_ok; /* judge.pending (a verdict record follows) or rerun: its key repeating is no duplicate */
    long line;         /* 1-based line in results.jsonl, set by the results reader */
} kvb_record;

/* A row of the field table. */
typedef struct {
    const char *key;
    kvb_rf_type type;
    unsigned flags;
    size_t offset; /* of its member in kvb_record */
} kvb_record_field;

/* The field table, in writing order; *n = its length. */
const kvb_record_field *kvb_record_fields(int *n);
/* The field named key, or NULL. */
const kvb_record_field *kvb_record_field_find(const char *key);

/* A record with every field absent (numbers NAN). */
void kvb_record_init(kvb_record *r);
/* Release what a record owns and leave it as kvb_record_init does. */
void kvb_record_free(kvb_record *r);

/* The record as a JSON object, every field in table order (caller deletes); a number not finite is written as
 * absent. NULL + "why" (a required field missing, a UNIT number outside [0, 1], out of memory). */
struct cJSON *kvb_record_to_json(const kvb_record *r, char *why, size_t why_len);
/* Fill *r (kvb_record_free it, also after an error) from a parsed line; lean: BULK fields are checked but not
 * kept. 0, or -1 + one line "field \"KEY\" is not a string" (no path: the caller adds "PATH:LINE: "). */
int kvb_record_from_json(const struct cJSON *o, kvb_record *r, int lean, char *why, size_t why_len);

#endif
