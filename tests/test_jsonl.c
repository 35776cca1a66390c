/* test_jsonl.c — the benchmark file readers (benchmarks/jsonl.h): JSONL lines of any length with blank lines
 * and CRLF, a malformed line and a torn last line (a writer killed mid-append) named by file and line, the
 * streaming walk over one big array and its malformed forms, and the emulation of Python's json.dumps against
 * CPython's own output (tests/fixtures/json_dumps_ref.json, written by json_dumps_ref.py). */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util_common.h"
#include "benchmarks/jsonl.h"

static char dir[64] = "/tmp/kvb_jsonl_XXXXXX";
static char err[512];

static const char *write_file(const char *name, const char *text, size_t len) {
    static char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    CU_ASSERT_FATAL(f != NULL);
    CU_ASSERT_FATAL(fwrite(text, 1, len, f) == len);
    fclose(f);
    return path;
}

static int one_line(const char *s) { return s[0] && !strchr(s, '\n'); }

/* 1 when err starts with "<path>:<line>: " and holds what. */
static int err_at(const char *path, long line, const char *what) {
    char want[256];
    snprintf(want, sizeof want, "%s:%ld: ", path, line);
    int ok = !strncmp(err, want, strlen(want)) && strstr(err, what) && one_line(err);
    if (!ok) fprintf(stderr, "\n  want \"%s...%s\", got \"%s\"\n", want, what, err);
    return ok;
}

/* Lines of any length (one of 300 000 bytes), blank lines and CRLF endings; line numbers count every line. */
static void test_jsonl_reads_long_lines_blank_lines_and_crlf(void) {
    size_t big = 300000;
    char *text = malloc(big + 200);
    size_t n = (size_t)sprintf(text, "{\"id\": 1}\r\n\n   \n{\"id\": 2, \"s\": \"");
    memset(text + n, 'x', big);
    n += big;
    n += (size_t)sprintf(text + n, "\"}\n{\"id\": 3}"); /* the last line without its newline is whole: read */
    const char *path = write_file("ok.jsonl", text, n);
    kvb_jsonl r;
    CU_ASSERT_FATAL(kvb_jsonl_open(&r, path, err, sizeof err) == 0);
    cJSON *v;
    long want_line[3] = {1, 4, 5};
    for (int i = 0; i < 3; i++) {
        CU_ASSERT_FATAL(kvb_jsonl_next(&r, &v, err, sizeof err) == 1);
        CU_ASSERT(cJSON_GetObjectItem(v, "id")->valueint == i + 1 && r.lineno == want_line[i]);
        if (i == 1) CU_ASSERT(strlen(cJSON_GetObjectItem(v, "s")->valuestring) == big);
        cJSON_Delete(v);
    }
    CU_ASSERT(kvb_jsonl_next(&r, &v, err, sizeof err) == 0 && v == NULL);
    kvb_jsonl_close(&r);
    free(text);
}

/* A malformed line stops the read with "<file>:<line>: invalid JSON ..."; so do two values on one line. */
static void test_jsonl_malformed_line_is_named_by_file_and_line(void) {
    const char *text = "{\"id\": 1}\n{\"id\": 2}\n{\"id\": 3,}\n{\"id\": 4}\n";
    const char *path = write_file("bad.jsonl", text, strlen(text));
    kvb_jsonl r;
    CU_ASSERT_FATAL(kvb_jsonl_open(&r, path, err, sizeof err) == 0);
    cJSON *v;
    CU_ASSERT(kvb_jsonl_next(&r, &v, err, sizeof err) == 1);
    cJSON_Delete(v);
    CU_ASSERT(kvb_jsonl_next(&r, &v, err, sizeof err) == 1);
    cJSON_Delete(v);
    CU_ASSERT(kvb_jsonl_next(&r, &v, err, sizeof err) == -1 && v == NULL);
    CU_ASSERT(err_at(path, 3, "invalid JSON"));
    kvb_jsonl_close(&r);
    text = "{\"id\": 1}\n\n{\"id\": 2} {\"id\": 3}\n";
    path = write_file("two.jsonl", text, strlen(text));
    CU_ASSERT_FATAL(kvb_jsonl_open(&r, path, err, sizeof err) == 0);
    CU_ASSERT(kvb_jsonl_next(&r, &v, err, sizeof err) == 1);
    cJSON_Delete(v);
    CU_ASSERT(kvb_jsonl_next(&r, &v, err, sizeof err) == -1 && err_at(path, 3, "unexpected content after the value"));
    kvb_jsonl_close(&r);
}

/* A writer killed in the middle of an append leaves a last line without its end: an error naming that line,
 * after every whole record before it was read. */
static void test_jsonl_torn_last_line_is_an_error_naming_it(void) {
    const char *text = "{\"id\": 1}\n{\"id\": 2}\n{\"id\": 3, \"predic";
    const char *path = write_file("torn.jsonl", text, strlen(text));
    kvb_jsonl r;
    CU_ASSERT_FATAL(kvb_jsonl_open(&r, path, err, sizeof err) == 0);
    cJSON *v;
    int whole = 0, rc;
    while ((rc = kvb_jsonl_next(&r, &v, err, sizeof err)) == 1) whole++, cJSON_Delete(v);
    CU_ASSERT(whole == 2 && rc == -1 && err_at(path, 3, "invalid JSON"));
    kvb_jsonl_close(&r);
}

static void test_jsonl_missing_file_is_a_one_line_error(void) {
    kvb_jsonl r;
    char path[128];
    snprintf(path, sizeof path, "%s/none.jsonl", dir);
    CU_ASSERT(kvb_jsonl_open(&r, path, err, sizeof err) == -1);
    char want[200];
    snprintf(want, sizeof want, "%s: cannot open: No such file or directory", path);
    CU_ASSERT_STRING_EQUAL(err, want);
}

/* A FIFO named as a dataset is refused at once, naming it (fopen blocked until a writer came, forever): in a child
 * with an alarm, so a regression fails instead of hanging the suite. */
static void test_jsonl_fifo_is_refused_not_waited_on(void) {
    char path[128];
    snprintf(path, sizeof path, "%s/data.fifo", dir);
    CU_ASSERT_FATAL(mkfifo(path, 0644) == 0);
    pid_t child = fork();
    CU_ASSERT_FATAL(child >= 0);
    if (child == 0) {
        alarm(10);
        kvb_jsonl r;
        int rc = kvb_jsonl_open(&r, path, err, sizeof err);
        _exit(rc == -1 && strstr(err, path) && strstr(err, "is a FIFO, not a regular file") ? 0 : 1);
    }
    int st = 0;
    CU_ASSERT(waitpid(child, &st, 0) == child && WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* The big-array walk yields each element with its first line; a UTF-8 BOM and whitespace are skipped. */
static void test_array_walk_yields_elements_with_their_lines(void) {
    const char *text = "\xEF\xBB\xBF\n[\n  {\"a\": 1},\n  {\"a\":\n   2}, [3, \"]\"],\n  \"s\\\"]\" , 5\n]\n";
    kvb_jarray a;
    CU_ASSERT_FATAL(kvb_jarray_begin(&a, "big.json", text, strlen(text), err, sizeof err) == 0);
    cJSON *v;
    long line, lines[5] = {3, 4, 5, 6, 6};
    for (int i = 0; i < 5; i++) {
        CU_ASSERT_FATAL(kvb_jarray_next(&a, &v, &line, err, sizeof err) == 1);
        CU_ASSERT(line == lines[i]);
        if (i == 1) CU_ASSERT(cJSON_GetObjectItem(v, "a")->valueint == 2);
        if (i == 2) CU_ASSERT(cJSON_IsArray(v) && !strcmp(cJSON_GetArrayItem(v, 1)->valuestring, "]"));
        if (i == 3) CU_ASSERT_STRING_EQUAL(v->valuestring, "s\"]");
        if (i == 4) CU_ASSERT(v->valueint == 5);
        cJSON_Delete(v);
    }
    CU_ASSERT(kvb_jarray_next(&a, &v, &line, err, sizeof err) == 0);
    CU_ASSERT(kvb_jarray_next(&a, &v, &line, err, sizeof err) == 0); /* and stays at the end */
    CU_ASSERT(kvb_jarray_begin(&a, "empty.json", " [ ] ", 5, err, sizeof err) == 0);
    CU_ASSERT(kvb_jarray_next(&a, &v, &line, err, sizeof err) == 0);
}

/* Each malformed array is one line naming the file and the line of the fault. */
static void test_array_walk_names_the_line_of_each_fault(void) {
    static const struct { const char *text; long line; const char *what; } cases[] = {
        {"{\"a\": 1}", 1, "expected a JSON array"},
        {"\n\n[1,\n 2,\n]", 5, "trailing ','"},
        {"[1\n 2]", 2, "expected ',' or ']'"},
        {"[1,\n {\"a\": [2, 3]}", 2, "not closed"},
        {"[1, 2]\n[3]", 2, "unexpected content after the array"},
        {"[,1]", 1, "unexpected ','"},
        {"[1,\n\n {\"a\" 2}]", 3, "invalid JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        kvb_jarray a;
        err[0] = 0;
        int rc = kvb_jarray_begin(&a, "f.json", cases[i].text, strlen(cases[i].text), err, sizeof err);
        cJSON *v = NULL;
        long line;
        if (rc == 0)
            while ((rc = kvb_jarray_next(&a, &v, &line, err, sizeof err)) == 1) cJSON_Delete(v), v = NULL;
        CU_ASSERT(rc == -1 && v == NULL && err_at("f.json", cases[i].line, cases[i].what));
    }
}

/* One value alone: whitespace after it is fine, anything else is an error on its line (first_line + the
 * newlines before it). Keys repeat as in Python's json module: the last one wins. */
static void test_parse_one_value_and_last_key_wins(void) {
    const char *t = "{\"a\": 1,\n \"b\": [1,\n 2]}  \n\t";
    cJSON *v = kvb_json_parse("x.json", 10, t, strlen(t), err, sizeof err);
    CU_ASSERT_FATAL(v != NULL);
    cJSON_Delete(v);
    t = "{\"a\": 1,\n \"b\": 2}  x\n";
    CU_ASSERT(kvb_json_parse("x.json", 10, t, strlen(t), err, sizeof err) == NULL && err_at("x.json", 11, "unexpected content"));
    t = "{\"a\": 1,\n\n \"b\": tru}";
    CU_ASSERT(kvb_json_parse("x.json", 10, t, strlen(t), err, sizeof err) == NULL && err_at("x.json", 12, "invalid JSON"));
    v = cJSON_Parse("{\"k\": 1, \"other\": 0, \"k\": 2}");
    CU_ASSERT(kvb_json_get(v, "k") && kvb_json_get(v, "k")->valueint == 2);
    CU_ASSERT(kvb_json_get(v, "K") == NULL && kvb_json_get(cJSON_GetObjectItem(v, "other"), "k") == NULL);
    cJSON_Delete(v);
}

/* json.dumps as CPython writes it, for every case of the fixture (escapes, \u escapes of non-ASCII and
 * surrogate pairs above U+FFFF, number forms, nesting, key order, and a key dropped from every object). */
static void test_dumps_py_equals_cpython_json_dumps(void) {
    char *text = util_read_file("tests/fixtures/json_dumps_ref.json", NULL);
    if (!text) CU_FAIL_FATAL("tests/fixtures/json_dumps_ref.json missing (python3 tests/fixtures/json_dumps_ref.py)");
    cJSON *ref = cJSON_Parse(text);
    free(text);
    CU_ASSERT_FATAL(cJSON_GetArraySize(ref) >= 10);
    const cJSON *c;
    cJSON_ArrayForEach(c, ref) {
        const char *in = cJSON_GetObjectItem(c, "in")->valuestring, *want = cJSON_GetObjectItem(c, "out")->valuestring;
        const cJSON *skip = cJSON_GetObjectItem(c, "skip");
        cJSON *v = kvb_json_parse("case", 1, in, strlen(in), err, sizeof err);
        CU_ASSERT_FATAL(v != NULL);
        kvb_sb b = {0};
        kvb_json_dumps_py(&b, v, cJSON_IsString(skip) ? skip->valuestring : NULL);
        char *got = kvb_sb_take(&b);
        CU_ASSERT_FATAL(got != NULL);
        CU_ASSERT_STRING_EQUAL(got, want);
        if (strcmp(got, want)) fprintf(stderr, "\n  in:   %s\n  want: %s\n  got:  %s\n", in, want, got);
        free(got);
        cJSON_Delete(v);
    }
    cJSON_Delete(ref);
}

/* Bytes that are not UTF-8 (Python could not have loaded them) come out as U+FFFD, one per bad byte. */
static void test_dumps_py_replaces_invalid_utf8(void) {
    cJSON *v = cJSON_CreateString("a\xff" "b\xc3(\xe2\x82");
    kvb_sb b = {0};
    kvb_json_dumps_py(&b, v, NULL);
    char *got = kvb_sb_take(&b);
    CU_ASSERT_STRING_EQUAL(got, "\"a\\ufffdb\\ufffd(\\ufffd\\ufffd\"");
    free(got);
    cJSON_Delete(v);
}

int main(void) {
    if (!mkdtemp(dir)) return 1;
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("jsonl", NULL, NULL);
    CU_add_test(s, "jsonl reads long lines, blank lines and CRLF", test_jsonl_reads_long_lines_blank_lines_and_crlf);
    CU_add_test(s, "jsonl malformed line is named by file and line", test_jsonl_malformed_line_is_named_by_file_and_line);
    CU_add_test(s, "jsonl torn last line is an error naming it", test_jsonl_torn_last_line_is_an_error_naming_it);
    CU_add_test(s, "jsonl missing file is a one-line error", test_jsonl_missing_file_is_a_one_line_error);
    CU_add_test(s, "jsonl FIFO is refused, not waited on", test_jsonl_fifo_is_refused_not_waited_on);
    CU_add_test(s, "array walk yields elements with their lines", test_array_walk_yields_elements_with_their_lines);
    CU_add_test(s, "array walk names the line of each fault", test_array_walk_names_the_line_of_each_fault);
    CU_add_test(s, "parse one value; the last key wins", test_parse_one_value_and_last_key_wins);
    CU_add_test(s, "dumps_py equals CPython's json.dumps", test_dumps_py_equals_cpython_json_dumps);
    CU_add_test(s, "dumps_py replaces invalid UTF-8", test_dumps_py_replaces_invalid_utf8);
    int rc = util_run_suites();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) rc = 1;
    return rc;
}
