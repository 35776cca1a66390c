/* util_common.h — small helpers shared by the test suites. */
#ifndef KVB_TEST_COMMON_H
#define KVB_TEST_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "engine/kvcache.h"
#include "kernels/backend.h"

/* Whole regular file, NUL-terminated (malloc'd); NULL when it cannot be read or is not a regular file. len may be
 * NULL. */
char *util_read_file(const char *path, size_t *len);
/* util_read_file for a file of the repository (tests/fixtures/...): when it cannot be read, one line on stderr
 * naming it (tests run from the source root, as ctest runs them). */
char *util_read_fixture(const char *path, size_t *len);
/* kvbench options that give the methods reading a calibration profile their inputs (Round's watershed, PoD's
 * blocks, Q-Filters' filters and DuoAttention's split from the prompt's window), for whole-model runs that are not
 * about calibration: CTest gives every test a profile directory that cannot be made (CMakeLists.txt). */
#define UTIL_NO_CALIBRATION_OPTS                                                                                   \
    "--method-opt round:lw=13 --method-opt pod:block=3 --method-opt qfilter:filters=window --method-opt duo:split=window "     \
    "--method-opt kvzap:scorer=random"
/* Path of the default model ($KVB_MODEL_DIR or ~/.cache/kvbench/models); returns 1 if it is readable. */
int util_default_model(char *path, size_t cap);

/* In a running test: a fatal failure naming path when it cannot be read. CI always has the test inputs (setup
 * fetches the default model), so a missing input fails the test instead of letting it pass with nothing checked. */
/* A test's own float64 reference or data generator, left out of the sanitizers (-fsanitize=address,undefined of
 * KVB_SANITIZE): under them it dominated test_attention's time (56% its reference, 12% its Gaussian draws), and
 * the code under test stays instrumented. */
#if defined(__clang__) || defined(__GNUC__)
#define UTIL_REFERENCE __attribute__((no_sanitize("address", "undefined")))
#else
#define UTIL_REFERENCE
#endif

#define UTIL_REQUIRE_FILE(path) util_require_file((path), __FILE__, __LINE__)
void util_require_file(const char *path, const char *file, unsigned line);

/* The benchmark records beside a development checkout, ../shared/data/<rel> (tests run from the checkout's root;
 * never copied into the project): 1 when it is there (path, when not NULL, gets "../shared/data/<rel>"). When it is
 * missing, 0, and in CI ($CI "true" or "1", where it is always there) a failure of the running test naming the
 * path; elsewhere (a fresh clone with nothing beside it) the test is skipped: the first miss in a test binary prints
 * one line saying so. The caller returns, or leaves out the part that needs the records. */
#define UTIL_SHARED_DATA(rel, path, cap) util_shared_data((rel), (path), (cap), __FILE__, __LINE__)
int util_shared_data(const char *rel, char *path, size_t cap, const char *file, unsigned line);

/* Run every registered suite verbosely, clean up, and return the exit code (1 if anything failed). $KVB_TEST_ONLY
 * names the one test to run, $KVB_TEST_SKIP one to leave out (exact names; a name that is no test fails). */
int util_run_suites(void);
/* A request body gathered across a microhttpd handler's calls (tests' judge servers): 1 while data arrives
 * (the handler returns MHD_YES), 0 when the body is complete (*body: NUL-terminated, NULL when empty). *con
 * holds the buffer until util_http_body_free (the request-completed callback). */
int util_http_body(void **con, const char *data, size_t *size, const char **body);
void util_http_body_free(void **con);

/* ---- device-tier memory from a test ----
 * Host code never touches device-tier bytes (under KVB_GUARD it dies with SIGSEGV), so tests read and write them
 * through the backend: one counted copy (be->copy) and a sync. A failure is a fatal test failure. */

/* bytes of device-tier src into host dst */
void util_dev_read(kvb_backend *be, void *dst, const void *src, size_t bytes);
/* bytes of host src into device-tier dst */
void util_dev_write(kvb_backend *be, void *dst, const void *src, size_t bytes);

/* A host copy of one KV head's slots in slot order (either tier): k, v: n rows of the store's dtype. */
typedef struct {
    void *k, *v;
    int32_t *pos;
    int64_t n;
} util_kv_head;
/* Copy (layer, h) of kv to the host with kvc_gather; free with util_kv_head_free. */
util_kv_head util_kv_head_copy(kvc_store *kv, int layer, int h);
void util_kv_head_free(util_kv_head *hc);

#endif
