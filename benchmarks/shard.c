/* shard.c — deterministic shards (shard.h). SHA-256 rather than a faster hash: it is the same on every
 * platform and in Python's hashlib, so a shard's cells can be checked from outside (tests/fixtures). */
#include "benchmarks/shard.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/fsutil.h"
#include "base/sha256.h"
#include "methods/method.h"

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)
#define MAX_SHARDS 100000

int kvb_shard_parse(const char *text, kvb_shard *out, char *err, size_t err_len) {
    const char *slash = text ? strchr(text, '/') : NULL;
    if (!slash) return ERR("--shard expects i/N (e.g. 0/4), got '%s'", text ? text : "");
    char *end;
    errno = 0;
    long i = strtol(text, &end, 10);
    if (errno || end != slash || end == text) return ERR("--shard expects i/N with an integer i, got '%s'", text);
    long n = strtol(slash + 1, &end, 10);
    if (errno || *end || end == slash + 1) return ERR("--shard expects i/N with an integer N, got '%s'", text);
    if (n < 1 || n > MAX_SHARDS) return ERR("--shard %s: N must be in [1, %d]", text, MAX_SHARDS);
    if (i < 0 || i >= n) return ERR("--shard %s: i must be in [0, N-1] (shards are numbered from 0)", text);
    out->index = (int)i;
    out->count = (int)n;
    return 0;
}

void kvb_shard_format(const kvb_shard *s, char *out, size_t cap) {
    if (s->count > 0) snprintf(out, cap, "%d/%d", s->index, s->count);
    else if (cap) out[0] = 0;
}

int kvb_shard_of(const char *model_sha, const char *method, const char *budget, const char *opts_json,
                 const char *benchmark, const char *task, const char *sample_id, int count) {
    if (count < 1) return -1;
    if (count == 1) return 0;
    const char *parts[] = {model_sha, "\n", method, "@", budget, "\n", opts_json ? opts_json : "", "\n",
                           benchmark, "\n", task, "\n", sample_id ? sample_id : ""};
    unsigned char md[32];
    if (kvb_sha256((const void *const *)parts, NULL, (int)(sizeof parts / sizeof *parts), md, NULL)) return -1;
    uint64_t h = 0;
    for (int k = 0; k < 8; k++) h = h << 8 | md[k];
    return (int)(h % (uint64_t)count);
}

static int cmp_line(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int kvb_plan_write(const char *path, const char *rows, char *err, size_t err_len) {
    char *old = NULL, **have = NULL, *copy = strdup(rows), *out = NULL;
    size_t old_len = 0, n_have = 0, out_len = 0;
    FILE *f = NULL;
    int rc = copy ? 0 : ERR("out of memory");
    if (!rc && access(path, F_OK) == 0 && !(old = kvb_read_file(path, &old_len, err, err_len))) rc = -1;
    if (!rc && old && memchr(old, 0, old_len)) rc = ERR("%s: a NUL byte: not a plan written by kvbench", path);
    if (!rc && old && old_len && old[old_len - 1] != '\n') rc = ERR("%s: the last row has no newline: not a plan written by kvbench", path);
    for (size_t i = 0; !rc && old && i < old_len; i++) n_have += old[i] == '\n';
    if (!rc && n_have && !(have = malloc(n_have * sizeof *have))) rc = ERR("out of memory");
    char *old_lines = !rc && old ? strdup(old) : NULL;
    if (!rc && old && !old_lines) rc = ERR("out of memory");
    n_have = 0;
    for (char *save, *l = old_lines ? strtok_r(old_lines, "\n", &save) : NULL; !rc && l; l = strtok_r(NULL, "\n", &save)) have[n_have++] = l;
    if (n_have) qsort(have, n_have, sizeof *have, cmp_line);
    if (!rc && !(f = open_memstream(&out, &out_len))) rc = ERR("out of memory");
    if (!rc && old) fputs(old, f);
    for (char *save, *l = !rc ? strtok_r(copy, "\n", &save) : NULL; l; l = strtok_r(NULL, "\n", &save))
        if (!n_have || !bsearch(&l, have, n_have, sizeof *have, cmp_line)) fprintf(f, "%s\n", l);
    if (f && fclose(f) && !rc) rc = ERR("out of memory");
    if (!rc) rc = kvb_write_file_atomic(path, out ? out : "", err, err_len);
    free(old), free(old_lines), free(have), free(copy), free(out);
    return rc;
}
