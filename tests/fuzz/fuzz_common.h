/* fuzz_common.h — what the libFuzzer harnesses share: a private scratch directory (loaders and the suite
 * parser read files) and writing one input there. */
#ifndef KVB_FUZZ_COMMON_H
#define KVB_FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char fuzz_dir[64];

/* The scratch directory, made once per process and removed at exit. */
static void fuzz_cleanup(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", fuzz_dir);
    if (fuzz_dir[0] && system(cmd)) {}
}

static const char *fuzz_scratch(void) {
    if (!fuzz_dir[0]) {
        snprintf(fuzz_dir, sizeof fuzz_dir, "/tmp/kvb_fuzz_XXXXXX");
        if (!mkdtemp(fuzz_dir)) abort();
        atexit(fuzz_cleanup);
    }
    return fuzz_dir;
}

/* Write bytes to scratch/name; the path goes to out. */
static void fuzz_write(const char *name, const uint8_t *data, size_t n, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s", fuzz_scratch(), name);
    FILE *f = fopen(out, "wb");
    if (!f) abort();
    if (n && fwrite(data, 1, n, f) != n) abort();
    fclose(f);
}

#endif
