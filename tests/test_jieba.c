/* test_jieba.c — benchmarks/jieba.c against the jieba Python package (0.42.1): every case of
 * tests/fixtures/jieba/segmentation.json (scripts/jieba_fixtures.py: the committed corpus and its variants, cut by
 * jieba.cut(text, cut_all=False) with and without HMM) must give the same tokens; in CI also the token counts and
 * digests of the Chinese LongBench records beside the clone (tests/fixtures/jieba/shared_digests.json). Needs
 * jieba's data (scripts/fetch-datasets.sh jieba, which scripts/test.sh runs): without it the suite is skipped with
 * one line, except in CI ($CI true or 1), where it fails. */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util_common.h"
#include "base/sha256.h"
#include "benchmarks/jieba.h"

static kvb_jieba *J;

/* tokens of text as one JSON-comparable list: 1 when they equal the strings of want */
static int same_tokens(const char *text, const kvb_jieba_tok *t, int64_t n, const cJSON *want) {
    if (n != cJSON_GetArraySize(want)) return 0;
    for (int64_t i = 0; i < n; i++) {
        const cJSON *w = cJSON_GetArrayItem(want, (int)i);
        if (!cJSON_IsString(w) || strlen(w->valuestring) != (size_t)t[i].len ||
            memcmp(w->valuestring, text + t[i].off, (size_t)t[i].len))
            return 0;
    }
    return 1;
}

static void print_tokens(const char *text, const kvb_jieba_tok *t, int64_t n) {
    for (int64_t i = 0; i < n && i < 40; i++) fprintf(stderr, "%s\"%.*s\"", i ? " " : "", (int)t[i].len, text + t[i].off);
}

static void test_dictionary_is_jiebas(void) {
    CU_ASSERT_EQUAL(kvb_jieba_words(J), 349046);   /* dict.txt's lines */
    CU_ASSERT_EQUAL(kvb_jieba_entries(J), 498113); /* len(jieba.dt.FREQ): words and their prefixes */
    CU_ASSERT_EQUAL(kvb_jieba_total(J), 60101967); /* jieba.dt.total */
}

static void test_corpus_equals_python(void) {
    char *text = util_read_file("tests/fixtures/jieba/segmentation.json", NULL);
    CU_ASSERT_FATAL(text != NULL);
    cJSON *root = cJSON_Parse(text);
    free(text);
    CU_ASSERT_FATAL(root != NULL);
    const cJSON *cases = cJSON_GetObjectItem(root, "cases"), *c;
    int n = 0, eq[2] = {0, 0};
    cJSON_ArrayForEach(c, cases) {
        const char *s = cJSON_GetObjectItem(c, "text")->valuestring;
        for (int hmm = 0; hmm < 2; hmm++) {
            kvb_jieba_tok *t;
            int64_t nt;
            CU_ASSERT_FATAL(kvb_jieba_cut(J, s, hmm, &t, &nt) == 0);
            if (same_tokens(s, t, nt, cJSON_GetObjectItem(c, hmm ? "hmm" : "no_hmm"))) eq[hmm]++;
            else {
                fprintf(stderr, "\n  case %d (%s) differs: ", n, hmm ? "HMM" : "no HMM");
                print_tokens(s, t, nt);
            }
            free(t);
        }
        n++;
    }
    fprintf(stderr, "\n  %d sentences: %d equal with HMM, %d without (jieba %s)\n", n, eq[1], eq[0],
            cJSON_GetObjectItem(cJSON_GetObjectItem(root, "versions"), "jieba")->valuestring);
    CU_ASSERT(n >= 300);
    CU_ASSERT_EQUAL(eq[1], n);
    CU_ASSERT_EQUAL(eq[0], n);
    cJSON_Delete(root);
}

/* sha256 of the tokens, each followed by a NUL byte (scripts/jieba_fixtures.py's digest) */
static void digest(const char *text, const kvb_jieba_tok *t, int64_t n, char hex[65]) {
    const void **parts = malloc((size_t)(2 * n + 1) * sizeof *parts);
    size_t *lens = malloc((size_t)(2 * n + 1) * sizeof *lens);
    for (int64_t i = 0; i < n; i++) {
        parts[2 * i] = text + t[i].off, lens[2 * i] = (size_t)t[i].len;
        parts[2 * i + 1] = "", lens[2 * i + 1] = 1;
    }
    CU_ASSERT(kvb_sha256(parts, lens, (int)(2 * n), NULL, hex) == 0);
    free(parts), free(lens);
}

/* The field's value (field, or gold.field) at index i of a record: a string, or a list of strings. */
static const char *field_text(const cJSON *rec, const char *field, int index) {
    const cJSON *v = cJSON_GetObjectItem(rec, field);
    if (!v) v = cJSON_GetObjectItem(cJSON_GetObjectItem(rec, "gold"), field);
    if (cJSON_IsArray(v)) v = cJSON_GetArrayItem(v, index);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static void test_shared_records_equal_python(void) {
    char *text = util_read_file("tests/fixtures/jieba/shared_digests.json", NULL);
    CU_ASSERT_FATAL(text != NULL);
    cJSON *root = cJSON_Parse(text);
    free(text);
    const cJSON *texts = cJSON_GetObjectItem(root, "texts"), *d;
    char path[1024], cur[1024] = "";
    char **lines = NULL;
    int n_lines = 0, n = 0, eq = 0, missing = 0;
    long chars = 0;
    cJSON_ArrayForEach(d, texts) {
        const char *rel = cJSON_GetObjectItem(d, "file")->valuestring;
        if (strcmp(rel, cur)) { /* the records of the next file */
            for (int i = 0; i < n_lines; i++) free(lines[i]);
            free(lines), lines = NULL, n_lines = 0;
            snprintf(cur, sizeof cur, "%s", rel);
            if (!UTIL_SHARED_DATA(rel, path, sizeof path)) { missing = 1; break; }
            FILE *f = fopen(path, "r");
            CU_ASSERT_FATAL(f != NULL);
            char *l = NULL;
            size_t cap = 0;
            while (getline(&l, &cap, f) > 0) {
                lines = realloc(lines, (size_t)(n_lines + 1) * sizeof *lines);
                lines[n_lines++] = strdup(l);
            }
            free(l);
            fclose(f);
        }
        int line = cJSON_GetObjectItem(d, "line")->valueint;
        CU_ASSERT_FATAL(line >= 1 && line <= n_lines);
        cJSON *rec = cJSON_Parse(lines[line - 1]);
        const char *s = field_text(rec, cJSON_GetObjectItem(d, "field")->valuestring,
                                   cJSON_GetObjectItem(d, "index")->valueint);
        CU_ASSERT_FATAL(s != NULL);
        int ok = 1;
        for (int hmm = 0; hmm < 2; hmm++) {
            const cJSON *want = cJSON_GetObjectItem(d, hmm ? "hmm" : "no_hmm");
            kvb_jieba_tok *t;
            int64_t nt;
            char hex[65];
            CU_ASSERT_FATAL(kvb_jieba_cut(J, s, hmm, &t, &nt) == 0);
            digest(s, t, nt, hex);
            if (nt != cJSON_GetArrayItem(want, 0)->valueint || strcmp(hex, cJSON_GetArrayItem(want, 1)->valuestring)) {
                ok = 0;
                fprintf(stderr, "\n  %s:%d %s (%s): %lld tokens, Python %d", rel, line,
                        cJSON_GetObjectItem(d, "field")->valuestring, hmm ? "HMM" : "no HMM", (long long)nt,
                        cJSON_GetArrayItem(want, 0)->valueint);
            }
            free(t);
        }
        chars += (long)strlen(s);
        eq += ok, n++;
        cJSON_Delete(rec);
    }
    for (int i = 0; i < n_lines; i++) free(lines[i]);
    free(lines);
    if (!missing) {
        fprintf(stderr, "\n  %d texts of the shared LongBench zh records (%ld bytes): %d equal, both modes\n", n, chars, eq);
        CU_ASSERT(n >= 200);
        CU_ASSERT_EQUAL(eq, n);
    }
    cJSON_Delete(root);
}

/* Any bytes, invalid UTF-8 included: the tokens cover the text in order, each byte once, in both modes. */
static void test_tokens_partition_any_text(void) {
    static const char *const pieces[] = {"中", "国", "人", "的", "长", "鿕", "鿖", "龘", "𠮷", "a", "Z", "7", ".", "%", "-",
                                         "+", "#", "&", "_", " ", "\r", "\n", "\t", "\xe3\x80\x80", "\xc2\xa0", "。",
                                         "，", "\xff", "\xe4\xb8", "\xc0\xae", "\xed\xa0\x80", "😊"};
    uint64_t x = 0x9E3779B97F4A7C15ull;
    char buf[512];
    int bad = 0;
    for (int k = 0; k < 3000; k++) {
        size_t len = 0;
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int n = (int)(x % 60);
        for (int i = 0; i < n; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            const char *p = pieces[x % (sizeof pieces / sizeof *pieces)];
            if (len + strlen(p) >= sizeof buf) break;
            memcpy(buf + len, p, strlen(p)), len += strlen(p);
        }
        buf[len] = 0;
        for (int hmm = 0; hmm < 2; hmm++) {
            kvb_jieba_tok *t;
            int64_t nt, at = 0;
            CU_ASSERT_FATAL(kvb_jieba_cut(J, buf, hmm, &t, &nt) == 0);
            for (int64_t i = 0; i < nt; i++) {
                if (t[i].off != at || t[i].len <= 0) bad++;
                at = t[i].off + t[i].len;
            }
            if (at != (int64_t)len) bad++;
            free(t);
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
}

/* Loader errors: a missing folder names the fetch command; a malformed line is named by file:line. */
static void test_load_errors_are_one_line(void) {
    char err[600];
    CU_ASSERT(kvb_jieba_load("/nonexistent/jieba", err, sizeof err) == NULL);
    CU_ASSERT(strstr(err, KVB_JIEBA_FETCH) != NULL && !strchr(err, '\n'));
    char dir[] = "/tmp/kvb_jieba_XXXXXX";
    CU_ASSERT_FATAL(mkdtemp(dir) != NULL);
    static const char *const files[][2] = {
        {"dict.txt", "中国 100 ns\n中 5\nbroken-line-without-count\n"},
        {"prob_start.py", "P={'B': -0.26, 'E': -3.14e+100, 'M': -3.14e+100, 'S': -1.46}\n"},
        {"prob_trans.py", "P={'B': {'E': -0.5, 'M': -0.9}, 'E': {'B': -0.6, 'S': -0.8}, 'M': {'E': -0.3, 'M': -1.3},"
                          " 'S': {'B': -0.7, 'S': -0.7}}\n"},
        {"prob_emit.py", "from __future__ import unicode_literals\n\nP={'B': {'\\u4e2d': -1.0}, 'E': {'\\u56fd': -1.0},"
                         " 'M': {}, 'S': {'\\u4e2d': -2.0}}\n"}};
    char p[256];
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i][0]);
        FILE *f = fopen(p, "w");
        fputs(files[i][1], f);
        fclose(f);
    }
    CU_ASSERT(kvb_jieba_load(dir, err, sizeof err) == NULL);
    CU_ASSERT(strstr(err, "dict.txt:3:") != NULL);
    /* a good dictionary: the tiny one cuts as its counts say */
    snprintf(p, sizeof p, "%s/dict.txt", dir);
    FILE *f = fopen(p, "w");
    fputs("中国 100 ns\n中 5\n国 5\n", f);
    fclose(f);
    kvb_jieba *j = kvb_jieba_load(dir, err, sizeof err);
    CU_ASSERT_FATAL(j != NULL);
    CU_ASSERT(kvb_jieba_total(j) == 110 && kvb_jieba_entries(j) == 3);
    kvb_jieba_tok *t;
    int64_t nt;
    CU_ASSERT(kvb_jieba_cut(j, "中国人\r\nab12", 1, &t, &nt) == 0);
    CU_ASSERT(nt == 4 && t[0].len == 6 && t[1].len == 3 && t[2].len == 2 && t[3].len == 4); /* 中国|人|\r\n|ab12 */
    free(t);
    kvb_jieba_free(j);
    snprintf(p, sizeof p, "%s/prob_emit.py", dir);
    f = fopen(p, "w");
    fputs("P={'B': {'\\u4e2d' -1.0}}\n", f);
    fclose(f);
    CU_ASSERT(kvb_jieba_load(dir, err, sizeof err) == NULL && strstr(err, "prob_emit.py:1:") != NULL);
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i][0]);
        unlink(p);
    }
    rmdir(dir);
}

int main(void) {
    char dir[1024], err[700];
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("jieba", NULL, NULL);
    CU_add_test(s, "loader errors: missing data names the fetch, bad lines file:line", test_load_errors_are_one_line);
    if (kvb_jieba_dir(dir, sizeof dir) == 0 && kvb_jieba_present(dir)) {
        J = kvb_jieba_load(dir, err, sizeof err);
        if (!J) fprintf(stderr, "test_jieba: %s\n", err);
        CU_add_test(s, "dictionary: words, prefix entries, total as jieba's", test_dictionary_is_jiebas);
        CU_add_test(s, "fixture corpus: every sentence cut as jieba cuts it (HMM on and off)", test_corpus_equals_python);
        CU_add_test(s, "shared LongBench zh records: token counts and digests as jieba's", test_shared_records_equal_python);
        CU_add_test(s, "any bytes: the tokens cover the text in order, each byte once", test_tokens_partition_any_text);
        if (!J) { CU_cleanup_registry(); return 1; }
    } else {
        const char *ci = getenv("CI");
        if (ci && (!strcmp(ci, "true") || !strcmp(ci, "1"))) {
            fprintf(stderr, "test_jieba: jieba's data is not in %s (CI=true: scripts/test.sh runs %s)\n", dir,
                    KVB_JIEBA_FETCH);
            CU_cleanup_registry();
            return 1;
        }
        printf("test_jieba: skipped the segmentation tests: jieba's data is not in %s (%s)\n", dir, KVB_JIEBA_FETCH);
    }
    int rc = util_run_suites();
    kvb_jieba_free(J);
    return rc;
}
