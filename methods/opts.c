/* opts.c — method options: key=value pairs, read (and marked used) by the method that knows them. */
#include "methods/opts.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "methods/method.h" /* kvb_errf */

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

static int opts_add_one(kvb_opts *o, const char *s, size_t len, char *err, size_t err_len) {
    const char *eq = memchr(s, '=', len);
    if (!eq || eq == s) return ERR("method option '%.*s' is not key=value", (int)len, s);
    size_t kl = (size_t)(eq - s), vl = len - kl - 1;
    if (kl >= sizeof o->v[0].key || vl >= sizeof o->v[0].val) return ERR("method option '%.*s' is too long", (int)len, s);
    int slot = -1;
    for (int i = 0; i < o->n; i++)
        if (strlen(o->v[i].key) == kl && !memcmp(o->v[i].key, s, kl)) slot = i;
    if (slot < 0) {
        if (o->n >= KVB_MAX_OPTS) return ERR("too many method options (at most %d)", KVB_MAX_OPTS);
        slot = o->n++;
    }
    memcpy(o->v[slot].key, s, kl);
    o->v[slot].key[kl] = 0;
    memcpy(o->v[slot].val, eq + 1, vl);
    o->v[slot].val[vl] = 0;
    o->v[slot].used = 0;
    return 0;
}

int kvb_opts_add(kvb_opts *o, const char *kv, char *err, size_t err_len) {
    /* split on commas that start a new key=value (layer lists like layers=2;8;18 use ';') */
    const char *p = kv;
    while (*p) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        if (len && opts_add_one(o, p, len, err, err_len)) return -1;
        p += len + (c ? 1 : 0);
    }
    return 0;
}

int kvb_opts_add_json(kvb_opts *o, const cJSON *obj, const char *where, char *err, size_t err_len) {
    const cJSON *x;
    cJSON_ArrayForEach(x, obj) {
        char kv[200];
        if (cJSON_IsString(x)) snprintf(kv, sizeof kv, "%s=%s", x->string, x->valuestring);
        else if (cJSON_IsNumber(x)) snprintf(kv, sizeof kv, "%s=%g", x->string, x->valuedouble);
        else return ERR("%s: option %s must be a string or number", where, x->string);
        if (kvb_opts_add(o, kv, err, err_len)) return -1;
    }
    return 0;
}

const char *kvb_opts_get(kvb_opts *o, const char *key) {
    if (!o) return NULL;
    for (int i = 0; i < o->n; i++)
        if (!strcmp(o->v[i].key, key)) {
            o->v[i].used = 1;
            return o->v[i].val;
        }
    return NULL;
}

int kvb_opts_int(kvb_opts *o, const char *key, int64_t *out, char *err, size_t err_len) {
    const char *s = kvb_opts_get(o, key);
    if (!s) return 0;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end || errno) return ERR("method option %s=%s is not an integer", key, s);
    *out = v;
    return 1;
}

int kvb_opts_double(kvb_opts *o, const char *key, double *out, char *err, size_t err_len) {
    const char *s = kvb_opts_get(o, key);
    if (!s) return 0;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(v)) return ERR("method option %s=%s is not a number", key, s);
    *out = v;
    return 1;
}

const char *kvb_opts_unused(const kvb_opts *o) {
    if (!o) return NULL;
    for (int i = 0; i < o->n; i++)
        if (!o->v[i].used) return o->v[i].key;
    return NULL;
}

int kvb_opts_for_method(const char *name, const char *const *raw, int n_raw, kvb_opts *o, char *err, size_t err_len) {
    memset(o, 0, sizeof *o);
    const kvb_method_def *info = kvb_method_find(name);
    int baseline = info && (info->traits & KVB_NO_BUDGET); /* takes no options: unprefixed ones skip it */
    for (int i = 0; i < n_raw; i++) {
        const char *colon = strchr(raw[i], ':'), *eq = strchr(raw[i], '=');
        if (colon && (!eq || colon < eq)) {
            if (strlen(name) != (size_t)(colon - raw[i]) || strncmp(raw[i], name, (size_t)(colon - raw[i]))) continue;
            if (kvb_opts_add(o, colon + 1, err, err_len)) return -1;
        } else if (!baseline && kvb_opts_add(o, raw[i], err, err_len)) {
            return -1;
        }
    }
    return 0;
}
