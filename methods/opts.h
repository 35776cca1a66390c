/* opts.h — method options: --method-opt key=value pairs, suite and request "opts" objects. A method reads
 * the keys it knows (which marks them used); a key no method read is an error at creation. */
#ifndef KVB_OPTS_H
#define KVB_OPTS_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#define KVB_MAX_OPTS 16
typedef struct {
    struct { char key[32]; char val[128]; int used; } v[KVB_MAX_OPTS];
    int n;
} kvb_opts;

/* Add "key=value" (comma-separated lists allowed: "a=1,b=2"). */
int kvb_opts_add(kvb_opts *o, const char *kv, char *err, size_t err_len);
/* Add the members of a JSON object {"key": "value" | number} (suites, server requests); where names the
 * object in errors. NULL obj adds nothing. */
int kvb_opts_add_json(kvb_opts *o, const cJSON *obj, const char *where, char *err, size_t err_len);
/* Value of key or NULL (marks it used). */
const char *kvb_opts_get(kvb_opts *o, const char *key);
/* Typed getters: 0 = absent (out untouched), 1 = read, -1 = malformed (err set). */
int kvb_opts_int(kvb_opts *o, const char *key, int64_t *out, char *err, size_t err_len);
int kvb_opts_double(kvb_opts *o, const char *key, double *out, char *err, size_t err_len);
/* The options of method `name` among raw --method-opt values: "name:key=value" ones, and unprefixed "key=value"
 * ones unless name is the baseline (full takes no options). 0, or -1 + err. */
int kvb_opts_for_method(const char *name, const char *const *raw, int n_raw, kvb_opts *o, char *err, size_t err_len);
/* The first option no method read, or NULL. */
const char *kvb_opts_unused(const kvb_opts *o);

#endif
