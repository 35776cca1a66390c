#include "util_common.h"
#include "base/clock.h"

#include <CUnit/Basic.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

char *util_read_file(const char *path, size_t *len) {
    struct stat st;
    if (stat(path, &st) || !S_ISREG(st.st_mode)) return NULL; /* a directory opens, but has no size */
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (!buf) return NULL;
    buf[n] = 0;
    if (len) *len = (size_t)n;
    return buf;
}

char *util_read_fixture(const char *path, size_t *len) {
    char *text = util_read_file(path, len);
    if (!text) fprintf(stderr, "cannot read %s (the tests run from the source root, as ctest runs them)\n", path);
    return text;
}

int util_default_model(char *path, size_t cap) {
    const char *dir = getenv("KVB_MODEL_DIR"), *home = getenv("HOME");
    if (dir && *dir) snprintf(path, cap, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", dir);
    else snprintf(path, cap, "%s/.cache/kvbench/models/SmolLM2-135M-Instruct.Q4_1.gguf", home ? home : ".");
    return access(path, R_OK) == 0;
}

void util_require_file(const char *path, const char *file, unsigned line) {
    if (access(path, R_OK) == 0) return;
    char msg[1200];
    snprintf(msg, sizeof msg, "missing input %s (the default model: scripts/fetch-model.sh)", path);
    CU_assertImplementation(CU_FALSE, line, msg, file, "", CU_TRUE); /* copies msg, then leaves the test */
}

int util_shared_data(const char *rel, char *path, size_t cap, const char *file, unsigned line) {
    static int told; /* one skip line per test binary */
    char buf[1024];
    if (!path) path = buf, cap = sizeof buf;
    snprintf(path, cap, "../shared/data/%s", rel);
    if (access(path, R_OK) == 0) return 1;
    const char *ci = getenv("CI");
    if (ci && (!strcmp(ci, "true") || !strcmp(ci, "1"))) {
        char msg[1200];
        snprintf(msg, sizeof msg, "missing %s (CI=true: the benchmark records must be beside the clone)", path);
        CU_assertImplementation(CU_FALSE, line, msg, file, "", CU_FALSE); /* copies msg */
        return 0;
    }
    if (!told++) {
        const char *base = strrchr(file, '/'); /* the test binary is named after its source file */
        base = base ? base + 1 : file;
        int n = (int)strcspn(base, ".");
        fflush(stdout); /* after CUnit's "Test: ... " */
        printf("\n%.*s: skipped: needs %s (only CI and the developers' machines have it; CI=true makes this a "
               "failure)\n", n, base, path);
        fflush(stdout);
    }
    return 0;
}

/* A fatal CUnit failure "what: err" (leaves the running test). */
static void fail(const char *what, const char *err) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s: %s", what, err);
    CU_assertImplementation(CU_FALSE, __LINE__, msg, __FILE__, "", CU_TRUE); /* copies msg */
}

static void dev_copy(kvb_backend *be, void *dst, const void *src, size_t bytes, kvb_copy_dir dir) {
    char err[256] = "";
    if (be->copy(be, dst, src, bytes, dir, err, sizeof err)) fail("backend copy", err);
    if (be->sync && be->sync(be)) fail("backend sync", be->error);
}

void util_dev_read(kvb_backend *be, void *dst, const void *src, size_t bytes) {
    dev_copy(be, dst, src, bytes, KVB_COPY_D2H);
}

void util_dev_write(kvb_backend *be, void *dst, const void *src, size_t bytes) {
    dev_copy(be, dst, src, bytes, KVB_COPY_H2D);
}

util_kv_head util_kv_head_copy(kvc_store *kv, int layer, int h) {
    char err[256] = "";
    int64_t n = kvc_n(kv, layer, h);
    size_t row_bytes = (size_t)(kvc_slot_bytes(kv) - 2 * (int64_t)sizeof(int32_t)) / 2; /* slot = K + V + pos + round */
    size_t m = (size_t)(n > 0 ? n : 1);
    util_kv_head hc = {malloc(m * row_bytes), malloc(m * row_bytes), malloc(m * sizeof(int32_t)), n};
    int32_t *idx = malloc(m * sizeof *idx);
    if (!hc.k || !hc.v || !hc.pos || !idx) fail("util_kv_head_copy", "out of memory");
    for (int64_t i = 0; i < n; i++) idx[i] = (int32_t)i;
    int rc = kvc_gather(kv, layer, h, idx, n, hc.k, hc.v, hc.pos, err, sizeof err);
    free(idx);
    if (rc) fail("kvc_gather", err);
    return hc;
}

void util_kv_head_free(util_kv_head *hc) {
    free(hc->k), free(hc->v), free(hc->pos);
    *hc = (util_kv_head){0};
}

/* $KVB_TEST_ONLY / $KVB_TEST_SKIP: the test of that exact name alone, or every test but it (CTest runs a suite's
 * whole-model test apart, in the release build only); -1 when the name is no test of the suites, so a renamed test
 * cannot drop out unnoticed. */
static int select_tests(void) {
    const char *only = getenv("KVB_TEST_ONLY"), *skip = getenv("KVB_TEST_SKIP");
    const int keep_only = only && *only;
    const char *name = keep_only ? only : skip && *skip ? skip : NULL;
    if (!name) return 0;
    int found = 0;
    for (CU_pSuite s = CU_get_registry()->pSuite; s; s = s->pNext)
        for (CU_pTest t = s->pTest; t; t = t->pNext) {
            const int match = !strcmp(t->pName, name);
            found += match;
            CU_set_test_active(t, keep_only == match);
        }
    if (!found) {
        fprintf(stderr, "%s=\"%s\": no test of that name\n", keep_only ? "KVB_TEST_ONLY" : "KVB_TEST_SKIP", name);
        return -1;
    }
    CU_set_fail_on_inactive(CU_FALSE);
    return 0;
}

/* $KVB_TEST_TIMES=1: each test's wall time on stderr ("time: suite/test 12.3 s"), to see where a suite's minutes go.
 * Each test function runs through timed_test, which looks the running test up in the table of their functions. */
enum { MAX_TIMED = 512 };
static struct { CU_pTest t; CU_TestFunc f; } timed[MAX_TIMED];
static int n_timed;

static void timed_test(void) {
    CU_pTest t = CU_get_current_test();
    for (int i = 0; i < n_timed; i++)
        if (timed[i].t == t) {
            const double t0 = kvb_now_s();
            timed[i].f();
            fprintf(stderr, "\ntime: %s/%s %.1f s\n", CU_get_current_suite()->pName, t->pName, kvb_now_s() - t0);
            return;
        }
}

static void time_tests(void) {
    const char *on = getenv("KVB_TEST_TIMES");
    if (!on || strcmp(on, "1")) return;
    for (CU_pSuite s = CU_get_registry()->pSuite; s; s = s->pNext)
        for (CU_pTest t = s->pTest; t && n_timed < MAX_TIMED; t = t->pNext) {
            timed[n_timed].t = t, timed[n_timed++].f = t->pTestFunc;
            t->pTestFunc = timed_test;
        }
}

int util_run_suites(void) {
    if (select_tests()) {
        CU_cleanup_registry();
        return 1;
    }
    time_tests();
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned fails = CU_get_number_of_failures() + CU_get_number_of_tests_failed();
    CU_cleanup_registry();
    return fails ? 1 : 0;
}

typedef struct { char *b; size_t n; } http_body;

int util_http_body(void **con, const char *data, size_t *size, const char **body) {
    if (!*con) {
        *con = calloc(1, sizeof(http_body));
        return 1;
    }
    http_body *b = *con;
    if (*size) {
        b->b = realloc(b->b, b->n + *size + 1);
        memcpy(b->b + b->n, data, *size);
        b->n += *size;
        b->b[b->n] = 0;
        *size = 0;
        return 1;
    }
    *body = b->b;
    return 0;
}

void util_http_body_free(void **con) {
    http_body *b = *con;
    if (b) free(b->b), free(b);
    *con = NULL;
}
