/* hostload.c — CPU count and load average of a suite run, appended to run.json (see hostload.h). run.json
 * is rewritten whole (read, edit, atomic rename), so the other fields written by the runner stay as they are. */
#include "benchmarks/hostload.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "base/fsutil.h"

#define ERR(...) (snprintf(err, err_len, __VA_ARGS__), -1)

int kvb_hostload_cpus(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 1 << 20 ? 1 << 20 : (int)n;
}

double kvb_hostload_now(void) {
    double l[1];
    return getloadavg(l, 1) == 1 && isfinite(l[0]) ? l[0] : NAN;
}

void kvb_hostload_sample(kvb_hostload *h) {
    double l = kvb_hostload_now();
    if (isfinite(l) && (!isfinite(h->load_max) || l > h->load_max)) h->load_max = l;
}

/* A load as JSON: null when the system reported none. */
static cJSON *load_json(double v) { return isfinite(v) ? cJSON_CreateNumber(round(v * 100) / 100) : cJSON_CreateNull(); }

static cJSON *read_json(const char *path, char *err, size_t err_len) {
    char *text = kvb_read_file(path, NULL, err, err_len);
    if (!text) return NULL;
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        (void)ERR("%s: not a JSON object", path);
        return NULL;
    }
    return j;
}

static int write_json(const char *path, cJSON *j, char *err, size_t err_len) {
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    if (!text) return ERR("%s: out of memory", path);
    int rc = kvb_write_file_atomic(path, text, err, err_len);
    free(text);
    return rc;
}

int kvb_hostload_begin(kvb_hostload *h, const char *run_json, int threads, char *err, size_t err_len) {
    h->cpus = kvb_hostload_cpus();
    h->threads = threads > 0 ? threads : h->cpus;
    h->load_start = h->load_max = kvb_hostload_now();
    cJSON *j = read_json(run_json, err, err_len);
    if (!j) return -1;
    cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, "host_load");
    if (!cJSON_IsArray(arr)) {
        cJSON_DeleteItemFromObjectCaseSensitive(j, "host_load");
        arr = cJSON_AddArrayToObject(j, "host_load");
    }
    char ts[64];
    time_t t = time(NULL);
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", gmtime(&t));
    cJSON *s = cJSON_CreateObject();
    cJSON_AddItemToArray(arr, s);
    cJSON_AddStringToObject(s, "started", ts);
    cJSON_AddNumberToObject(s, "cpus", h->cpus);
    cJSON_AddNumberToObject(s, "threads", h->threads);
    cJSON_AddItemToObject(s, "load_start", load_json(h->load_start));
    return write_json(run_json, j, err, err_len);
}

int kvb_hostload_end(kvb_hostload *h, const char *run_json, char *err, size_t err_len) {
    double end = kvb_hostload_now();
    kvb_hostload_sample(h);
    cJSON *j = read_json(run_json, err, err_len);
    if (!j) return -1;
    cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, "host_load");
    int n = cJSON_IsArray(arr) ? cJSON_GetArraySize(arr) : 0;
    cJSON *s = n ? cJSON_GetArrayItem(arr, n - 1) : NULL;
    if (!cJSON_IsObject(s)) {
        cJSON_Delete(j);
        return ERR("%s: no \"host_load\" session to end", run_json);
    }
    cJSON_DeleteItemFromObjectCaseSensitive(s, "load_max");
    cJSON_DeleteItemFromObjectCaseSensitive(s, "load_end");
    cJSON_AddItemToObject(s, "load_max", load_json(h->load_max));
    cJSON_AddItemToObject(s, "load_end", load_json(end));
    return write_json(run_json, j, err, err_len);
}
