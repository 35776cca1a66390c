/* runcal.h — a run calibrates what its cells need (runner.h kvb_run_opts.no_calibrate, benchmarks/calibration.h).
 *
 * Round Attention without lw=, PoD without block= and OmniKV with layers=profile read the model's calibration
 * profile (methods/profile.h); a suite naming them on a model without that profile section would fail every
 * such cell. So before the cells run, each missing section is calibrated once, with `kvbench calibrate KIND`'s
 * defaults, its curves and tables under DIR/calibration/, and stored; a later run (or another suite) finds it.
 * Shards and Slurm array tasks that share a profile directory calibrate one at a time under the profile's lock
 * (kvb_profile_lock): the first makes the section, the others wait and then find it, so the profile is written
 * once and never by two processes at a time. */
#ifndef KVB_RUNCAL_H
#define KVB_RUNCAL_H

#include <cjson/cJSON.h>
#include <stdio.h>

#include "benchmarks/cells.h"
#include "benchmarks/runner.h"
#include "engine/model.h"

/* The sections kinds[0..n_kinds) (repeats allowed) that m's profile lacks, each made once under the profile's lock
 * with `kvbench calibrate KIND`'s inputs (samples dialogues of rounds rounds), the engine settings cp, tables under
 * out_dir (NULL: a new /tmp/kvb_calibration_XXXXXX, made only when something is calibrated), one progress line and
 * one result line each on log, prefixed by who. With refuse, a missing section is an error naming the command
 * that makes it (and --no-calibrate, the flag that asks for refuse). `bench --method` and `fidelity` call it for
 * their methods. 0, or -1 + err. */
int kvb_calibrate_missing(const char *who, kvb_model *m, const kvb_ctx_params *cp, const char *const *kinds, int n_kinds,
                          int samples, int rounds, const char *out_dir, int refuse, FILE *log, char *err,
                          size_t err_len);

/* Make the sections the cells read and the model lacks (one progress line and one result line each on log).
 * 0, or -1 + one-line err: a failed calibration, a corrupt profile, a malformed suite "calibration", or, with
 * o->no_calibrate, a missing section (naming `kvbench calibrate KIND --model PATH`). */
int kvb_run_calibrate(const kvb_run_opts *o, kvb_model *m, const cJSON *suite, const kvb_cells *cs, const char *out_dir,
                      FILE *log, char *err, size_t err_len);

#endif
