/* test_record.c — the result record (reports/record.h): every field of the table written by the writer is read
 * back by the results reader (reports/results.h) as it was, field for field, with the lean read keeping all but
 * the BULK ones; absent fields round-trip as absent (OMIT ones left out, the others null); and each way a line can
 * disagree with the table (a required field missing or null, a key that is no field, a key twice, each field of a
 * wrong type, a score outside [0, 1]) is the reader's one-line error "PATH:LINE: field "KEY" ...". The tests walk
 * the table, so a new field is covered without an edit here. */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util_common.h"
#include "reports/record.h"
#include "reports/results.h"

static char dir[64] = "/tmp/kvb_record_XXXXXX";
static char err[512];

#define AT(r, f, T) ((T *)((char *)(r) + (f)->offset))

/* Every field set, each to a value of its own (so two fields swapped would show). */
static void fill(kvb_record *r) {
    int n;
    const kvb_record_field *t = kvb_record_fields(&n);
    kvb_record_init(r);
    for (int i = 0; i < n; i++) {
        const kvb_record_field *f = &t[i];
        char s[96];
        snprintf(s, sizeof s, "%s value \"%d\" \xc3\xa9\n", f->key, i); /* quotes, UTF-8 and a newline survive */
        switch (f->type) {
        case KVB_RF_STR: *AT(r, f, char *) = strdup(s); break;
        case KVB_RF_NUM: *AT(r, f, double) = f->flags & KVB_RF_UNIT ? 0.375 : 1e6 * i + 0.25; break;
        case KVB_RF_BOOL: *AT(r, f, int) = 1; break;
        case KVB_RF_STRS: {
            kvb_strs *a = AT(r, f, kvb_strs);
            a->v = calloc(2, sizeof *a->v);
            a->v[0] = strdup(s), a->v[1] = strdup("");
            a->n = 2;
            break;
        }
        case KVB_RF_OBJ: {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "of", f->key);
            cJSON_AddNumberToObject(o, "n", i);
            *AT(r, f, cJSON *) = o;
            break;
        }
        }
    }
}

/* 1 when field f of a and b holds the same value (absent included). */
static int same_field(const kvb_record_field *f, const kvb_record *a, const kvb_record *b) {
    kvb_record *x = (kvb_record *)a, *y = (kvb_record *)b;
    switch (f->type) {
    case KVB_RF_STR: {
        const char *s = *AT(x, f, char *), *t = *AT(y, f, char *);
        return (!s && !t) || (s && t && !strcmp(s, t));
    }
    case KVB_RF_NUM: {
        double u = *AT(x, f, double), v = *AT(y, f, double);
        return (isnan(u) && isnan(v)) || u == v;
    }
    case KVB_RF_BOOL: return *AT(x, f, int) == *AT(y, f, int);
    case KVB_RF_STRS: {
        const kvb_strs *s = AT(x, f, kvb_strs), *t = AT(y, f, kvb_strs);
        if (s->n != t->n) return 0;
        for (int i = 0; i < s->n; i++)
            if (strcmp(s->v[i], t->v[i])) return 0;
        return 1;
    }
    case KVB_RF_OBJ: {
        const cJSON *s = *AT(x, f, cJSON *), *t = *AT(y, f, cJSON *);
        return (!s && !t) || (s && t && cJSON_Compare(s, t, 1));
    }
    }
    return 0;
}

/* results.jsonl in dir holding the given lines (each gets its '\n'); its path. */
static const char *write_lines(const char *name, const char *const *lines, int n) {
    static char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    CU_ASSERT_FATAL(f != NULL);
    for (int i = 0; i < n; i++) fprintf(f, "%s\n", lines[i]);
    fclose(f);
    return path;
}

/* The writer's line for r. */
static char *line_of(const kvb_record *r) {
    char why[256] = "";
    cJSON *j = kvb_record_to_json(r, why, sizeof why);
    CU_ASSERT_FATAL(j != NULL);
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return text;
}

/* Read the records of path: 0 when all read, else -1 with err. */
static int read_all(const char *path, int lean, kvb_record *out, int max, int *n) {
    kvb_results_reader rd;
    *n = 0;
    if (kvb_results_open(&rd, path, err, sizeof err)) return -1;
    rd.lean = lean;
    int rc = 0;
    while (*n < max && (rc = kvb_results_next(&rd, &out[*n], NULL, err, sizeof err)) == 1) (*n)++;
    kvb_results_close(&rd);
    return rc < 0 ? -1 : 0;
}

static void test_every_field_written_is_read_back_as_it_was(void) {
    kvb_record full, none, back[2];
    fill(&full);
    kvb_record_init(&none);
    none.method = strdup("snapkv"), none.budget = strdup("30%"), none.task = strdup("t"); /* the required ones */
    char *lines[2] = {line_of(&full), line_of(&none)};
    const char *path = write_lines("roundtrip.jsonl", (const char *const *)lines, 2);
    int n_fields, n;
    const kvb_record_field *t = kvb_record_fields(&n_fields);
    CU_ASSERT(n_fields >= 40); /* the fields results.jsonl had when the table was made */
    for (int lean = 0; lean < 2; lean++) {
        CU_ASSERT_FATAL(read_all(path, lean, back, 2, &n) == 0 && n == 2);
        for (int i = 0; i < n_fields; i++) {
            const kvb_record_field *f = &t[i];
            int kept = !lean || !(f->flags & KVB_RF_BULK);
            kvb_record empty;
            kvb_record_init(&empty);
            CU_ASSERT(same_field(f, &back[0], kept ? &full : &empty));
            if (!same_field(f, &back[0], kept ? &full : &empty)) fprintf(stderr, "\n  field %s (lean %d) differs\n", f->key, lean);
            if (strcmp(f->key, "benchmark")) CU_ASSERT(same_field(f, &back[1], &none)); /* absent stays absent */
        }
        CU_ASSERT_STRING_EQUAL(back[1].benchmark, "other"); /* the reader's default */
        CU_ASSERT(back[0].line == 1 && back[1].line == 2);
        for (int i = 0; i < n; i++) kvb_record_free(&back[i]);
    }
    /* absent: an OMIT field is left out, any other written as null (every key of the table otherwise) */
    cJSON *j = cJSON_Parse(lines[1]);
    for (int i = 0; i < n_fields; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, t[i].key);
        int omit = !!(t[i].flags & KVB_RF_OMIT), req = !!(t[i].flags & KVB_RF_REQUIRED);
        CU_ASSERT(omit ? v == NULL : req || (v && (cJSON_IsNull(v) || cJSON_IsFalse(v) || cJSON_GetArraySize(v) == 0)));
    }
    CU_ASSERT(cJSON_GetArraySize(j) <= n_fields);
    cJSON_Delete(j);
    /* the keys in table order, as the writer writes them */
    j = cJSON_Parse(lines[0]);
    int k = 0;
    for (const cJSON *v = j->child; v; v = v->next, k++) CU_ASSERT(k < n_fields && !strcmp(v->string, t[k].key));
    CU_ASSERT(k == n_fields);
    cJSON_Delete(j);
    free(lines[0]), free(lines[1]);
    kvb_record_free(&full), kvb_record_free(&none);
}

/* The derived members: judge.error and pending, rerun, "" error texts. */
static void test_judge_error_pending_rerun_and_empty_error_are_derived(void) {
    const char *lines[] = {
        "{\"method\":\"a\",\"budget\":\"b\",\"task\":\"t\",\"judge\":{\"error\":\"timeout\"},\"error\":\"\"}",
        "{\"method\":\"a\",\"budget\":\"b\",\"task\":\"t\",\"judge\":{\"pending\":true,\"error\":\"\"}}",
        "{\"method\":\"a\",\"budget\":\"b\",\"task\":\"t\",\"rerun\":true,\"judge\":null}",
    };
    kvb_record r[3];
    int n;
    CU_ASSERT_FATAL(read_all(write_lines("derived.jsonl", lines, 3), 1, r, 3, &n) == 0 && n == 3);
    CU_ASSERT(r[0].judge_error && !strcmp(r[0].judge_error, "timeout") && !r[0].error && !r[0].superseded_ok);
    CU_ASSERT(!r[1].judge_error && r[1].superseded_ok && r[1].judge == NULL); /* lean: judge checked, not kept */
    CU_ASSERT(r[2].superseded_ok && r[2].rerun);
    for (int i = 0; i < n; i++) kvb_record_free(&r[i]);
    const char *bad[] = {"{\"method\":\"a\",\"budget\":\"b\",\"task\":\"t\",\"judge\":{\"error\":5}}"};
    CU_ASSERT(read_all(write_lines("judge-error.jsonl", bad, 1), 0, r, 1, &n) == -1);
    CU_ASSERT(strstr(err, "judge-error.jsonl:1: field \"judge.error\" is not a string") && !strchr(err, '\n'));
}

/* 1 when err is one line "<path>:<line>: field "<key>"<what>". */
static int err_is(const char *path, int line, const char *key, const char *what) {
    char want[512];
    snprintf(want, sizeof want, "%s:%d: field \"%s\"%s", path, line, key, what);
    int ok = !strncmp(err, want, strlen(want)) && !strchr(err, '\n');
    if (!ok) fprintf(stderr, "\n  want \"%s...\", got \"%s\"\n", want, err);
    return ok;
}

/* Reading one line of text (after a good record, so the error names line 2). */
static int read_second(const char *text, const char **path) {
    kvb_record good, r[2];
    kvb_record_init(&good);
    good.method = strdup("full"), good.budget = strdup("full"), good.task = strdup("t");
    char *first = line_of(&good);
    const char *lines[] = {first, text};
    *path = write_lines("bad.jsonl", lines, 2);
    int n, rc = read_all(*path, 0, r, 2, &n);
    for (int i = 0; i < n; i++) kvb_record_free(&r[i]);
    free(first);
    kvb_record_free(&good);
    return rc;
}

static void test_missing_extra_twice_and_wrong_type_are_one_line_errors(void) {
    kvb_record full;
    fill(&full);
    char why[256];
    cJSON *base = kvb_record_to_json(&full, why, sizeof why);
    CU_ASSERT_FATAL(base != NULL);
    int n_fields;
    const kvb_record_field *t = kvb_record_fields(&n_fields);
    const char *path;
    for (int i = 0; i < n_fields; i++) {
        const kvb_record_field *f = &t[i];
        cJSON *j = cJSON_Duplicate(base, 1);
        char *text;
        if (f->flags & KVB_RF_REQUIRED) { /* missing, then null */
            cJSON_DeleteItemFromObjectCaseSensitive(j, f->key);
            text = cJSON_PrintUnformatted(j);
            CU_ASSERT(read_second(text, &path) == -1 && err_is(path, 2, f->key, " is missing"));
            free(text);
            cJSON_AddNullToObject(j, f->key);
            text = cJSON_PrintUnformatted(j);
            CU_ASSERT(read_second(text, &path) == -1 && err_is(path, 2, f->key, " is missing"));
            free(text);
        }
        /* of another type */
        static const char *const what[] = {[KVB_RF_STR] = " is not a string", [KVB_RF_NUM] = " is not a number",
                                           [KVB_RF_BOOL] = " is not a boolean", [KVB_RF_STRS] = " is not an array of strings",
                                           [KVB_RF_OBJ] = " is neither null nor an object"};
        cJSON *wrong = f->type == KVB_RF_STR ? cJSON_CreateNumber(5)
                       : f->type == KVB_RF_STRS ? cJSON_Parse("[\"a\", 1]")
                                                : cJSON_CreateString("5");
        cJSON_DeleteItemFromObjectCaseSensitive(j, f->key);
        cJSON_AddItemToObject(j, f->key, wrong);
        text = cJSON_PrintUnformatted(j);
        CU_ASSERT(read_second(text, &path) == -1 && err_is(path, 2, f->key, what[f->type]));
        free(text);
        cJSON_Delete(j);
        /* twice: the second copy of the key, as the writer wrote it */
        char *line = cJSON_PrintUnformatted(base), *twice = malloc(strlen(line) + 300);
        cJSON *v = cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(base, f->key), 1);
        char *vtext = v ? cJSON_PrintUnformatted(v) : strdup("null");
        snprintf(twice, strlen(line) + 300, "%.*s,\"%s\":%.200s}", (int)strlen(line) - 1, line, f->key, vtext);
        CU_ASSERT(read_second(twice, &path) == -1 && err_is(path, 2, f->key, " appears twice"));
        free(line), free(twice), free(vtext);
        cJSON_Delete(v);
    }
    /* a key that is no field */
    cJSON *j = cJSON_Duplicate(base, 1);
    cJSON_AddNumberToObject(j, "kv_bytes", 1);
    char *text = cJSON_PrintUnformatted(j);
    CU_ASSERT(read_second(text, &path) == -1 && err_is(path, 2, "kv_bytes", " is not a field of a kvbench result record"));
    free(text);
    cJSON_Delete(j);
    /* a UNIT number outside [0, 1]: refused by the reader and by the writer */
    for (int i = 0; i < n_fields; i++) {
        if (!(t[i].flags & KVB_RF_UNIT)) continue;
        j = cJSON_Duplicate(base, 1);
        cJSON_ReplaceItemInObjectCaseSensitive(j, t[i].key, cJSON_CreateNumber(1.5));
        text = cJSON_PrintUnformatted(j);
        CU_ASSERT(read_second(text, &path) == -1 && err_is(path, 2, t[i].key, " = 1.5 is outside [0, 1]"));
        free(text);
        cJSON_Delete(j);
        double keep = *AT(&full, &t[i], double);
        *AT(&full, &t[i], double) = 1.5;
        CU_ASSERT(kvb_record_to_json(&full, why, sizeof why) == NULL && strstr(why, " = 1.5 is outside [0, 1]"));
        *AT(&full, &t[i], double) = keep;
    }
    /* JSON has no infinity: the writer writes a number that is not finite as absent (null), as cJSON prints it */
    full.ttft_ms = INFINITY;
    j = kvb_record_to_json(&full, why, sizeof why);
    CU_ASSERT(j && cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "ttft_ms")));
    cJSON_Delete(j);
    /* the writer refuses a record without a required field */
    free(full.task), full.task = NULL;
    CU_ASSERT(kvb_record_to_json(&full, why, sizeof why) == NULL && !strcmp(why, "field \"task\" is missing"));
    cJSON_Delete(base);
    kvb_record_free(&full);
}

/* The table is what the struct is: keys unique, every member's offset inside kvb_record and distinct. */
static void test_the_table_is_whole(void) {
    int n;
    const kvb_record_field *t = kvb_record_fields(&n);
    for (int i = 0; i < n; i++) {
        CU_ASSERT(kvb_record_field_find(t[i].key) == &t[i]);
        CU_ASSERT(t[i].offset < sizeof(kvb_record));
        for (int k = 0; k < i; k++) CU_ASSERT(t[k].offset != t[i].offset && strcmp(t[k].key, t[i].key));
    }
    CU_ASSERT(kvb_record_field_find("nosuch") == NULL && kvb_record_field_find("judge_error") == NULL);
    CU_ASSERT(kvb_record_field_find("method")->flags & KVB_RF_REQUIRED);
    CU_ASSERT(kvb_record_field_find("ttft_ms")->flags & KVB_RF_TIMING); /* merge does not compare it */
}

int main(void) {
    if (!mkdtemp(dir)) return 1;
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("record", NULL, NULL);
    CU_add_test(s, "every field written is read back as it was", test_every_field_written_is_read_back_as_it_was);
    CU_add_test(s, "judge error, pending, rerun and empty error are derived", test_judge_error_pending_rerun_and_empty_error_are_derived);
    CU_add_test(s, "missing, extra, twice and wrong type are one-line errors", test_missing_extra_twice_and_wrong_type_are_one_line_errors);
    CU_add_test(s, "the table is whole", test_the_table_is_whole);
    int rc = util_run_suites();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) rc = 1;
    return rc;
}
