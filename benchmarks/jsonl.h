/* jsonl.h — reading the benchmark files: JSONL lines of any length (getline, no fixed buffers), a
 * streaming walk over the elements of one big top-level JSON array (LongMemEval S is ~277 MB, ShareGPT
 * ~670 MB: each element is parsed alone, so memory is the file plus one element), Python-semantics key
 * lookup, and a byte-exact emulation of Python's json.dumps (LongMemEval's history string).
 * Every error is one line naming the file and the 1-based line number. */
#ifndef KVB_JSONL_H
#define KVB_JSONL_H

#include "base/fsutil.h" /* kvb_read_file */
#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdio.h>

#include "benchmarks/sample.h"

/* ---- JSONL ---- */
typedef struct {
    FILE *f;
    const char *path;
    char *line;
    size_t cap;
    long lineno; /* 1-based number of the line last returned */
} kvb_jsonl;

/* Opens path, a regular file; 0 / -1 ("<path>: cannot open: <reason>", or "<path>: is a FIFO, not a regular
 * file" for a FIFO, device or directory, refused at once instead of blocking). */
int kvb_jsonl_open(kvb_jsonl *r, const char *path, char *err, size_t err_len);
/* Next non-blank line parsed as one JSON value: 1 = *out set (caller deletes), 0 = end of file,
 * -1 = error ("<path>:<line>: ..."). A trailing '\r' is ignored. */
int kvb_jsonl_next(kvb_jsonl *r, cJSON **out, char *err, size_t err_len);
void kvb_jsonl_close(kvb_jsonl *r);

/* ---- whole files and one big array ---- */


typedef struct {
    const char *path;
    const char *buf;
    size_t len, pos;
    long line; /* 1-based line of buf[pos] */
    int done;
} kvb_jarray;

/* Starts walking buf, which must hold one JSON array; 0 / -1. */
int kvb_jarray_begin(kvb_jarray *a, const char *path, const char *buf, size_t len, char *err, size_t err_len);
/* Parses the next element: 1 = *out set (caller deletes) and *line = its first line, 0 = end of the
 * array (trailing content after it is an error), -1 = error. */
int kvb_jarray_next(kvb_jarray *a, cJSON **out, long *line, char *err, size_t err_len);

/* Parses text[0..len) as one JSON value (nothing but whitespace after it). On error: NULL and
 * "<path>:<line>: invalid JSON ..." where line = first_line + newlines before the error position. */
cJSON *kvb_json_parse(const char *path, long first_line, const char *text, size_t len, char *err, size_t err_len);

/* Object member by exact key; the last one when the key repeats (what Python's json module keeps). */
cJSON *kvb_json_get(const cJSON *obj, const char *key);
/* A suite entry's optional member: the string (number) at key, def when absent or of another type (first member
 * of that key, as cJSON_GetObjectItemCaseSensitive finds it) */
const char *kvb_json_str(const cJSON *obj, const char *key, const char *def);
double kvb_json_num(const cJSON *obj, const char *key, double def);
/* Every member of object o is named in keys (NULL-terminated): 0; else -1 + one line in err, "<prefix>unknown key
 * "K" (accepted: a, b, ...)", so a misspelled setting is refused rather than left at its default. */
int kvb_json_check_keys(const cJSON *o, const char *const *keys, const char *prefix, char *err, size_t err_len);

/* Appends Python's json.dumps(v) (ensure_ascii=True, separators ", " and ": ", keys in file order),
 * leaving out the members named skip_key (may be NULL) of every object in v. */
void kvb_json_dumps_py(kvb_sb *b, const cJSON *v, const char *skip_key);

#endif
