/* calibration.h — calibrating a model for the methods that read its profile (methods/profile.h): the inputs
 * (prompt files cut into rounds, or synthetic multi-round recall dialogues), the papers' analyses
 * (methods/calibrate.h), the curves (DIR/calibrate-KIND.csv) and per-layer tables (DIR/calibrate-KIND.md), and
 * the result stored in the profile. `kvbench calibrate` (cli/cmd_calibrate.c) parses its options into kvb_cal_opts;
 * a run (benchmarks/runcal.c) asks for the sections its cells read with kvb_calibrate_request. The rules of each
 * analysis are in calibration.c's header. */
#ifndef KVB_CALIBRATION_H
#define KVB_CALIBRATION_H

#include <stddef.h>

#include "engine/model.h"

typedef struct {
    const char *kind, *out_dir; /* "round", "omnikv", "pod", "qfilter" or "duo"; where the CSV and table go */
    const char *files[64];      /* calibration texts (none: synthetic dialogues) */
    int n_files;
    long samples, rounds, chunk, max_tokens, n_filter, span, q;
    double frac, eps, topk, delta;
    int dry_run;          /* print and save the CSV, do not touch the profile */
    int quiet;            /* `run`'s calibration: errors only; the result goes to result */
    char *result;         /* out (may be NULL): the result in one line */
    size_t result_cap;
    char *err;            /* set by kvb_calibrate */
    size_t err_len;
} kvb_cal_opts;

/* `kvbench calibrate`'s defaults (span -1: the model's L/4). */
void kvb_cal_defaults(kvb_cal_opts *o);
/* Calibrate o->kind on m with contexts of cp (n_ctx: a cap; 0 = the model's): results on stdout and progress on
 * stderr unless o->quiet, the CSV and table under o->out_dir, the profile section stored unless o->dry_run. 0, or
 * -1 + one-line err. */
int kvb_calibrate(kvb_model *m, const kvb_ctx_params *cp, kvb_cal_opts *o, char *err, size_t err_len);

/* One calibration a run asks for (benchmarks/runcal.h). */
typedef struct {
    const char *kind;    /* the profile section to make: "round", "omnikv", "pod", "qfilter" or "duo" (methods/profile.h) */
    const char *out_dir; /* where its curves and tables go (DIR/calibration) */
    int samples, rounds; /* synthetic dialogues (the suite's "calibration", else KVB_CAL_SAMPLES, KVB_CAL_ROUNDS) */
    char result[160];    /* out: the result in one line, e.g. "watershed layer 12 (lw = 13 of 30)" */
} kvb_cal_request;

/* The request with `kvbench calibrate KIND`'s defaults otherwise, quiet. 0, or -1 + err. */
int kvb_calibrate_request(kvb_model *m, const kvb_ctx_params *cp, kvb_cal_request *rq, char *err, size_t err_len);

#endif
