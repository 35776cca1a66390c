/* hostload.h — how busy the machine was while a suite ran, kept in run.json so a report can tell measured
 * timings from timings taken on a loaded machine. Each invocation of `kvbench run` (a first run or a resume)
 * appends one session to run.json's "host_load" array:
 *   {"started": "2026-...Z", "cpus": 2, "threads": 2, "load_start": 0.4, "load_max": 3.1, "load_end": 2.9}
 * Loads are the 1-minute load average (getloadavg); load_max is the largest seen at the start, once per
 * sample and at the end. */
#ifndef KVB_HOSTLOAD_H
#define KVB_HOSTLOAD_H

#include <stddef.h>

typedef struct {
    int cpus, threads;             /* online CPUs; worker threads the run uses */
    double load_start, load_max;   /* 1-minute load average; NAN when the system gives none */
} kvb_hostload;

/* Online CPU count (at least 1). */
int kvb_hostload_cpus(void);
/* The 1-minute load average, NAN when unavailable. */
double kvb_hostload_now(void);
/* Start a session: sample the load, append it to RUN_JSON's "host_load". threads <= 0 means one per CPU. */
int kvb_hostload_begin(kvb_hostload *h, const char *run_json, int threads, char *err, size_t err_len);
/* Sample the load again (cheap; called once per sample) and keep the maximum. */
void kvb_hostload_sample(kvb_hostload *h);
/* End the session: write load_end and load_max into the last "host_load" entry of RUN_JSON. */
int kvb_hostload_end(kvb_hostload *h, const char *run_json, char *err, size_t err_len);

#endif
