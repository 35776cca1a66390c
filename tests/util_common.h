/* util_common.h — small helpers shared by the test suites. */
#ifndef KVB_TEST_COMMON_H
#define KVB_TEST_COMMON_H

#include <stddef.h>

/* Whole regular file, NUL-terminated (malloc'd); NULL when it cannot be read or is not a regular file. len may be
 * NULL. */
char *util_read_file(const char *path, size_t *len);
/* Path of the default model ($KVB_MODEL_DIR or ~/.cache/kvbench/models); returns 1 if it is readable. */
int util_default_model(char *path, size_t cap);

/* In a running test: a fatal failure naming path when it cannot be read. CI always has the test inputs (setup
 * fetches the default model), so a missing input fails the test instead of letting it pass with nothing checked. */
#define UTIL_REQUIRE_FILE(path) util_require_file((path), __FILE__, __LINE__)
void util_require_file(const char *path, const char *file, unsigned line);

/* Run every registered suite verbosely, clean up, and return the exit code (1 if anything failed). */
int util_run_suites(void);
/* A request body gathered across a microhttpd handler's calls (tests' judge servers): 1 while data arrives
 * (the handler returns MHD_YES), 0 when the body is complete (*body: NUL-terminated, NULL when empty). *con
 * holds the buffer until util_http_body_free (the request-completed callback). */
int util_http_body(void **con, const char *data, size_t *size, const char **body);
void util_http_body_free(void **con);

#endif
