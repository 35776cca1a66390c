/* profile.h — host-clock timers around the forward pass's phases, per stage and layer, and the host<->device
 * traffic per stage.
 *
 * The phase names are Round Attention's latency decomposition and the NVTX range names (domain "kvbench",
 * emitted on every backend when the NVTX v3 headers were found at configure; see profile.c for the range,
 * category and payload layout), so a breakdown table, a Perfetto trace and an Nsight timeline line up.
 * A NULL or disabled profiler, with no NVTX tool attached, costs a branch per call. */
#ifndef KVB_PROFILE_H
#define KVB_PROFILE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum {
    PROF_EMBED = 0, PROF_CALC_QKV_AND_ROPE, PROF_UPDATE_CACHE, PROF_ATTN_FORWARD, PROF_ATTN_OUTPUT, PROF_MLP,
    PROF_LM_HEAD, PROF_SELECT, PROF_H2D, PROF_D2H, PROF_SAMPLE, PROF_PHASE_COUNT
} prof_phase;

typedef enum { PROF_PREFILL = 0, PROF_DECODE = 1, PROF_STAGE_COUNT } prof_stage;

typedef struct prof prof;

/* A profiler for n_layer layers; enabled = accumulate totals; trace = also keep events for prof_write_trace. */
prof *prof_create(int n_layer, int enabled, int trace);
void prof_free(prof *p);
/* GPU backends: call sync(user) before each clock read while timing, so phases measure device work. */
void prof_set_sync(prof *p, void (*sync)(void *), void *user);
/* Stage that following events count toward. */
void prof_set_stage(prof *p, prof_stage s);
/* 1 when p accumulates timings (it then waits for the backend at every phase boundary) */
int prof_enabled(const prof *p);
/* Start / end a phase (layer -1 = not per layer); end records token and byte counts with the event. */
void prof_begin(prof *p, prof_phase ph, int layer);
void prof_end(prof *p, prof_phase ph, int layer, int64_t tokens, int64_t bytes);
/* Accumulated nanoseconds and calls of (stage, phase), over all layers. */
int64_t prof_total_ns(const prof *p, prof_stage s, prof_phase ph);
int64_t prof_calls(const prof *p, prof_stage s, prof_phase ph);
/* Bytes the ends of (stage, phase) recorded, over all layers (e.g. what a method's packed loads moved). */
int64_t prof_total_bytes(const prof *p, prof_stage s, prof_phase ph);
/* Nanoseconds of (stage, phase) in one layer. */
int64_t prof_layer_ns(const prof *p, prof_stage s, prof_phase ph, int layer);
/* Host<->device traffic, counted toward the current stage: n copies of bytes in all, in direction dir
 * (0 = h2d, 1 = d2h, 2 = d2d: kvb_copy_dir's values). Counted whether or not timing is enabled. */
void prof_add_copies(prof *p, int dir, int64_t n, int64_t bytes);
/* Copies and bytes of (stage, direction) so far; zeros for a NULL profiler or a bad direction. */
void prof_copies(const prof *p, prof_stage s, int dir, int64_t *n, int64_t *bytes);
/* Phase name as used in tables, traces and NVTX ranges. */
const char *prof_phase_name(prof_phase ph);
const char *prof_stage_name(prof_stage s);
/* Breakdown table: one row per phase, prefill and decode columns; then copies and MiB per direction. */
void prof_print_table(const prof *p, FILE *out);
/* Chrome/Perfetto trace JSON ("traceEvents", complete events in microseconds); written to path.tmp, then renamed. */
int prof_write_trace(const prof *p, const char *path, char *err, size_t err_len);

#endif
