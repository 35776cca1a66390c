/* record.c — the result record's field table, writer and reader (record.h). Both directions walk the one
 * table made from KVB_RECORD_FIELDS; what is not a plain field (judge_error, superseded_ok, the "other"
 * benchmark, "" errors) is derived after the walk, in one place each. */
#include "reports/record.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/text.h"

#define KVB_RF_ROW(type, name, flags) {#name, KVB_RF_##type, (flags), offsetof(kvb_record, name)},
static const kvb_record_field FIELDS[] = {KVB_RECORD_FIELDS(KVB_RF_ROW)};
#define N_FIELDS ((int)(sizeof FIELDS / sizeof FIELDS[0]))
_Static_assert(sizeof FIELDS / sizeof FIELDS[0] <= 64, "the reader marks the fields it has seen in 64 bits");

const kvb_record_field *kvb_record_fields(int *n) {
    *n = N_FIELDS;
    return FIELDS;
}

const kvb_record_field *kvb_record_field_find(const char *key) {
    for (int i = 0; key && i < N_FIELDS; i++)
        if (!strcmp(FIELDS[i].key, key)) return &FIELDS[i];
    return NULL;
}

#define AT(r, f, T) ((T *)((char *)(r) + (f)->offset))
#define AT_C(r, f, T) ((const T *)((const char *)(r) + (f)->offset))

void kvb_record_init(kvb_record *r) {
    memset(r, 0, sizeof *r);
    for (int i = 0; i < N_FIELDS; i++)
        if (FIELDS[i].type == KVB_RF_NUM) *AT(r, &FIELDS[i], double) = NAN;
}

static void strs_free(kvb_strs *a) {
    for (int i = 0; i < a->n; i++) free(a->v[i]);
    free(a->v);
}

void kvb_record_free(kvb_record *r) {
    for (int i = 0; i < N_FIELDS; i++) {
        const kvb_record_field *f = &FIELDS[i];
        if (f->type == KVB_RF_STR) free(*AT(r, f, char *));
        else if (f->type == KVB_RF_STRS) strs_free(AT(r, f, kvb_strs));
        else if (f->type == KVB_RF_OBJ) cJSON_Delete(*AT(r, f, cJSON *));
    }
    free(r->judge_error);
    kvb_record_init(r);
}

static int fail(char *why, size_t why_len, const char *key, const char *what) {
    char shown[72];
    snprintf(why, why_len, "field \"%s\"%s", kvb_str_shown(key, shown, sizeof shown), what);
    return -1;
}

/* A present number: finite, not negative unless SIGNED (the others are counts, sizes and times), and in [0, 1] for a
 * UNIT field. */
static int check_num(const kvb_record_field *f, double v, char *why, size_t why_len) {
    if (!isfinite(v)) return fail(why, why_len, f->key, " is not a number");
    if (v < 0 && !(f->flags & (KVB_RF_UNIT | KVB_RF_SIGNED))) {
        char what[96];
        snprintf(what, sizeof what, " = %g is negative", v);
        return fail(why, why_len, f->key, what);
    }
    if ((f->flags & KVB_RF_UNIT) && (v < 0 || v > 1)) {
        char what[96];
        snprintf(what, sizeof what, " = %g is outside [0, 1]", v);
        return fail(why, why_len, f->key, what);
    }
    return 0;
}

/* ---- the writer ---- */

/* The JSON value of one field; *skip = 1 when an OMIT field is absent. NULL + why on error. */
static cJSON *field_json(const kvb_record *r, const kvb_record_field *f, int *skip, char *why, size_t why_len) {
    *skip = 0;
    int absent = 0;
    switch (f->type) {
    case KVB_RF_STR: absent = !*AT_C(r, f, char *); break;
    case KVB_RF_NUM: absent = !isfinite(*AT_C(r, f, double)); break; /* JSON has no infinity: null, as cJSON prints it */
    case KVB_RF_BOOL: absent = !*AT_C(r, f, int); break;
    case KVB_RF_STRS: absent = !AT_C(r, f, kvb_strs)->n; break;
    case KVB_RF_OBJ: absent = !*AT_C(r, f, cJSON *); break;
    }
    if (absent && (f->flags & KVB_RF_REQUIRED)) return fail(why, why_len, f->key, " is missing"), NULL;
    if (absent && (f->flags & KVB_RF_OMIT)) return *skip = 1, NULL;
    cJSON *v = NULL;
    switch (f->type) {
    case KVB_RF_STR: v = absent ? cJSON_CreateNull() : cJSON_CreateString(*AT_C(r, f, char *)); break;
    case KVB_RF_NUM: {
        double x = *AT_C(r, f, double);
        if (!absent && check_num(f, x, why, why_len)) return NULL;
        v = absent ? cJSON_CreateNull() : cJSON_CreateNumber(x);
        break;
    }
    case KVB_RF_BOOL: v = cJSON_CreateBool(*AT_C(r, f, int)); break;
    case KVB_RF_STRS: {
        const kvb_strs *a = AT_C(r, f, kvb_strs);
        v = cJSON_CreateArray();
        for (int i = 0; v && i < a->n; i++) {
            cJSON *s = cJSON_CreateString(a->v[i] ? a->v[i] : "");
            if (!s || !cJSON_AddItemToArray(v, s)) cJSON_Delete(s), cJSON_Delete(v), v = NULL;
        }
        break;
    }
    case KVB_RF_OBJ: v = absent ? cJSON_CreateNull() : cJSON_Duplicate(*AT_C(r, f, cJSON *), 1); break;
    }
    if (!v) snprintf(why, why_len, "out of memory");
    return v;
}

cJSON *kvb_record_to_json(const kvb_record *r, char *why, size_t why_len) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return snprintf(why, why_len, "out of memory"), NULL;
    for (int i = 0; i < N_FIELDS; i++) {
        int skip;
        cJSON *v = field_json(r, &FIELDS[i], &skip, why, why_len);
        if (skip) continue;
        if (!v || !cJSON_AddItemToObject(o, FIELDS[i].key, v)) {
            if (v) snprintf(why, why_len, "out of memory");
            cJSON_Delete(v), cJSON_Delete(o);
            return NULL;
        }
    }
    return o;
}

/* ---- the reader ---- */

static int read_field(const cJSON *v, const kvb_record_field *f, kvb_record *r, int keep, char *why, size_t why_len) {
    if (cJSON_IsNull(v)) return 0; /* absent, as kvb_record_init left it */
    switch (f->type) {
    case KVB_RF_STR:
        if (!cJSON_IsString(v)) return fail(why, why_len, f->key, " is not a string");
        if (keep && !(*AT(r, f, char *) = strdup(v->valuestring))) break;
        return 0;
    case KVB_RF_NUM:
        if (!cJSON_IsNumber(v)) return fail(why, why_len, f->key, " is not a number");
        if (check_num(f, v->valuedouble, why, why_len)) return -1;
        *AT(r, f, double) = v->valuedouble;
        return 0;
    case KVB_RF_BOOL:
        if (!cJSON_IsBool(v)) return fail(why, why_len, f->key, " is not a boolean");
        *AT(r, f, int) = cJSON_IsTrue(v);
        return 0;
    case KVB_RF_STRS: {
        const cJSON *s;
        if (!cJSON_IsArray(v)) return fail(why, why_len, f->key, " is not an array of strings");
        cJSON_ArrayForEach(s, v) if (!cJSON_IsString(s)) return fail(why, why_len, f->key, " is not an array of strings");
        if (!keep) return 0;
        kvb_strs *a = AT(r, f, kvb_strs);
        int n = cJSON_GetArraySize(v);
        if (n && !(a->v = calloc((size_t)n, sizeof *a->v))) break;
        cJSON_ArrayForEach(s, v) if (!(a->v[a->n++] = strdup(s->valuestring))) break;
        if (a->n && !a->v[a->n - 1]) break;
        return 0;
    }
    case KVB_RF_OBJ:
        if (!cJSON_IsObject(v)) return fail(why, why_len, f->key, " is neither null nor an object");
        if (keep && !(*AT(r, f, cJSON *) = cJSON_Duplicate(v, 1))) break;
        return 0;
    }
    snprintf(why, why_len, "out of memory");
    return -1;
}

/* "method, budget and task": the required fields, for the error naming a missing one. */
static void required_names(char *out, size_t cap) {
    int n = 0, k = 0;
    for (int i = 0; i < N_FIELDS; i++) n += !!(FIELDS[i].flags & KVB_RF_REQUIRED);
    size_t at = 0;
    out[0] = 0;
    for (int i = 0; i < N_FIELDS && at < cap; i++)
        if (FIELDS[i].flags & KVB_RF_REQUIRED)
            at += (size_t)snprintf(out + at, cap - at, "%s%s", k++ ? (k == n ? " and " : ", ") : "", FIELDS[i].key);
}

/* What is not a plain field: the judge's error and pending flag, supersession, "" errors, the default benchmark. */
static int derive(const cJSON *o, kvb_record *r, char *why, size_t why_len) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, "judge"), *je = cJSON_GetObjectItemCaseSensitive(j, "error");
    if (je && !cJSON_IsNull(je) && !cJSON_IsString(je)) return fail(why, why_len, "judge.error", " is not a string");
    if (cJSON_IsString(je) && je->valuestring[0] && !(r->judge_error = strdup(je->valuestring))) goto oom;
    r->superseded_ok = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "pending")) || r->rerun;
    if (r->error && !r->error[0]) free(r->error), r->error = NULL;
    if (!r->benchmark && !(r->benchmark = strdup("other"))) goto oom;
    return 0;
oom:
    snprintf(why, why_len, "out of memory");
    return -1;
}

int kvb_record_from_json(const cJSON *o, kvb_record *r, int lean, char *why, size_t why_len) {
    kvb_record_init(r);
    if (!cJSON_IsObject(o)) return snprintf(why, why_len, "not a JSON object"), -1;
    uint64_t seen = 0;
    for (const cJSON *v = o->child; v; v = v->next) {
        const kvb_record_field *f = kvb_record_field_find(v->string);
        if (!f) return fail(why, why_len, v->string ? v->string : "", " is not a field of a kvbench result record");
        uint64_t bit = (uint64_t)1 << (f - FIELDS);
        if (seen & bit) return fail(why, why_len, f->key, " appears twice");
        seen |= bit;
        if (read_field(v, f, r, !(lean && (f->flags & KVB_RF_BULK)), why, why_len)) return -1;
    }
    for (int i = 0; i < N_FIELDS; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, FIELDS[i].key);
        if ((FIELDS[i].flags & KVB_RF_REQUIRED) && (!v || cJSON_IsNull(v))) {
            char names[160], what[256]; /* the text around names is 46 bytes */
            required_names(names, sizeof names);
            snprintf(what, sizeof what, " is missing (a kvbench result record needs %s)", names);
            return fail(why, why_len, FIELDS[i].key, what);
        }
    }
    return derive(o, r, why, why_len);
}
