/* test_quick_guard.c — the quick suite under KVB_GUARD=1 (kernels/cpu/guard.h): `kvbench run configs/quick.json
 * --limit 1` (each benchmark decoding 40 tokens a sample) finishes with exit 0 and a record for every method of the suite, none with an error, while host
 * code that touches device-tier memory would die with SIGSEGV; and the guard is really on in that environment:
 * a host read of the activations of a context made the way kvbench makes one faults, and without the guard it
 * does not. Runs build/kvbench (path from KVB_BIN, set by CTest) on the default model. */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "benchmarks/suitecheck.h"
#include "util_common.h"
#include "engine/model.h"

static const char *bin;
static char model_path[1024], dir[] = "/tmp/kvb_quick_guard_XXXXXX", suite_path[1100];

/* In a child process: a context on the default model, guarded or not, and a host read of its K activations.
 * Returns the signal that ended the child, 0 when the read went through, -1 when it could not get that far. */
static int host_read_of_activations(int guarded) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        signal(SIGSEGV, SIG_DFL); /* a sanitizer's handler would turn the fault into an exit code */
        if (!guarded) unsetenv("KVB_GUARD");
        char err[256];
        kvb_model *m = kvb_model_load(model_path, err, sizeof err);
        kvb_ctx_params p = kvb_ctx_default_params();
        p.n_ctx = 256;
        p.n_threads = 1;
        kvb_ctx *c = m ? kvb_ctx_create(m, &p, err, sizeof err) : NULL;
        if (!c) _exit(2);
        volatile float x = c->k[0]; /* what library code must never do: device tier, outside an op */
        (void)x;
        _exit(0);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid) return -1;
    return WIFSIGNALED(st) ? WTERMSIG(st) : WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

static void test_the_guard_is_on_in_this_environment(void) {
    UTIL_REQUIRE_FILE(model_path);
    CU_ASSERT_EQUAL(host_read_of_activations(1), SIGSEGV);
    CU_ASSERT_EQUAL(host_read_of_activations(0), 0);
}

/* Methods named by the suite file, as a JSON array of names (caller frees). */
static cJSON *suite_methods(void) {
    char err[256];
    cJSON *suite = kvb_suite_parse(suite_path, err, sizeof err), *names = cJSON_CreateArray(), *m; /* "all" expanded */
    cJSON_ArrayForEach(m, cJSON_GetObjectItemCaseSensitive(suite, "methods")) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(m, "name");
        if (cJSON_IsString(name)) cJSON_AddItemToArray(names, cJSON_CreateString(name->valuestring));
    }
    cJSON_Delete(suite);
    return names;
}

/* The quick suite as written, but each benchmark decoding at most DECODE tokens a sample, into dir/quick.json; 0 on
 * success. The model rarely stops early: NIAH's 300 tokens took 100 of the test's 114 s, in decode steps that are
 * all alike but for the methods' periodic work, and 40 covers KIVI's (a group of 32 leaves the residual). */
enum { DECODE = 40 };
static int write_short_suite(char *out, size_t cap) {
    char *text = util_read_file(suite_path, NULL);
    cJSON *suite = text ? cJSON_Parse(text) : NULL, *b;
    free(text);
    cJSON_ArrayForEach(b, cJSON_GetObjectItemCaseSensitive(suite, "benchmarks")) {
        cJSON_DeleteItemFromObjectCaseSensitive(b, "max_new_tokens");
        cJSON_AddNumberToObject(b, "max_new_tokens", DECODE);
    }
    char *json = suite ? cJSON_Print(suite) : NULL;
    cJSON_Delete(suite);
    snprintf(out, cap, "%s/quick.json", dir);
    FILE *f = json ? fopen(out, "w") : NULL;
    int rc = f && fputs(json, f) >= 0 ? 0 : -1;
    if (f && fclose(f)) rc = -1;
    free(json);
    return rc;
}

static void test_quick_suite_runs_every_method_without_error(void) {
    UTIL_REQUIRE_FILE(model_path);
    UTIL_REQUIRE_FILE(suite_path);
    char cmd[4096], path[1200], short_suite[1200];
    CU_ASSERT_FATAL(write_short_suite(short_suite, sizeof short_suite) == 0);
    /* nothing calibrated here (run's own calibration is test_calibrate's subject; it took 75 s of this test's 116 s
     * in a fresh release pass): the methods' inputs given, and --no-calibrate */
    snprintf(cmd, sizeof cmd,
             "%s run %s --limit 1 --out %s/quick --quiet --no-calibrate " UTIL_NO_CALIBRATION_OPTS " >%s/run.log 2>&1",
             bin, short_suite, dir, dir);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int st = system(cmd);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    int rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    CU_ASSERT_EQUAL(rc, 0);
    if (rc != 0) {
        fprintf(stderr, "\n  kvbench run exited %d (signal %d); its output ends:\n", rc, WIFSIGNALED(st) ? WTERMSIG(st) : 0);
        snprintf(cmd, sizeof cmd, "tail -n 20 %s/run.log >&2", dir);
        if (system(cmd)) fprintf(stderr, "  (no log)\n");
    }
    /* every record has "error": null; every method of the suite has records */
    snprintf(path, sizeof path, "%s/quick/results.jsonl", dir);
    char *text = util_read_file(path, NULL);
    CU_ASSERT_FATAL(text != NULL);
    cJSON *methods = suite_methods();
    int n_methods = cJSON_GetArraySize(methods), n_records = 0, n_errors = 0;
    int *per_method = calloc((size_t)n_methods + 1, sizeof *per_method);
    for (char *save, *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        cJSON *r = cJSON_Parse(line);
        const cJSON *error = cJSON_GetObjectItemCaseSensitive(r, "error"),
                    *method = cJSON_GetObjectItemCaseSensitive(r, "method");
        n_records++;
        if (!cJSON_IsNull(error)) {
            n_errors++;
            fprintf(stderr, "\n  record with an error: %.300s\n", line);
        }
        for (int i = 0; i < n_methods; i++)
            if (cJSON_IsString(method) && !strcmp(method->valuestring, cJSON_GetArrayItem(methods, i)->valuestring))
                per_method[i]++;
        cJSON_Delete(r);
    }
    CU_ASSERT(n_methods > 0);
    CU_ASSERT(n_records > 0);
    CU_ASSERT_EQUAL(n_errors, 0);
    for (int i = 0; i < n_methods; i++) {
        CU_ASSERT(per_method[i] > 0);
        if (!per_method[i]) fprintf(stderr, "\n  no record for %s\n", cJSON_GetArrayItem(methods, i)->valuestring);
    }
    fprintf(stderr, "\n  quick suite under the guard: %d records of %d methods in %.0f s\n", n_records, n_methods,
            (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    free(per_method);
    cJSON_Delete(methods);
    free(text);
}

int main(void) {
    bin = getenv("KVB_BIN");
    const char *src = getenv("KVB_SOURCE_DIR");
    if (!bin) {
        fprintf(stderr, "needs KVB_BIN (set by CTest)\n");
        return 1;
    }
    util_default_model(model_path, sizeof model_path);
    snprintf(suite_path, sizeof suite_path, "%s/configs/quick.json", src && *src ? src : ".");
    if (!mkdtemp(dir)) return 1;
    setenv("KVB_GUARD", "1", 1); /* for kvbench and the context check alike */
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("quick suite under the guard", NULL, NULL);
    CU_add_test(s, "the guard is on in this environment", test_the_guard_is_on_in_this_environment);
    CU_add_test(s, "quick suite --limit 1: every method, no error", test_quick_suite_runs_every_method_without_error);
    int rc = util_run_suites();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) rc = 1;
    return rc;
}
