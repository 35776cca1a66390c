/* runcal.c — the calibrations a run makes before its cells (runcal.h). */
#include "benchmarks/runcal.h"

#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "benchmarks/calibration.h"
#include "benchmarks/runopts.h"
#include "methods/calibrate.h"
#include "methods/profile.h"

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

/* The suite's "calibration": {"samples": N, "rounds": N} over the defaults (the bounds of `kvbench calibrate`). */
static int read_inputs(const cJSON *suite, int *samples, int *rounds, char *err, size_t err_len) {
    *samples = KVB_CAL_SAMPLES, *rounds = KVB_CAL_ROUNDS;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(suite, "calibration");
    if (!c) return 0;
    if (!cJSON_IsObject(c)) return ERR("suite: \"calibration\" must be an object {\"samples\": N, \"rounds\": N}");
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(c, "samples"), *r = cJSON_GetObjectItemCaseSensitive(c, "rounds");
    if (s && (!cJSON_IsNumber(s) || s->valuedouble < 1 || s->valuedouble > 1000 || s->valuedouble != s->valueint))
        return ERR("suite: \"calibration\" \"samples\" must be an integer in [1, 1000]");
    if (r && (!cJSON_IsNumber(r) || r->valuedouble < 3 || r->valuedouble > 10000 || r->valuedouble != r->valueint))
        return ERR("suite: \"calibration\" \"rounds\" must be an integer in [3, 10000]");
    if (s) *samples = s->valueint;
    if (r) *rounds = r->valueint;
    return 0;
}

static const char *base_name(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* One missing section: calibrated here (benchmarks/calibration.h, the caller's engine settings), or with refuse an
 * error naming the command that makes it. */
static int make_section(const char *who, kvb_model *m, const kvb_ctx_params *cp, kvb_cal_request *rq, int refuse,
                        FILE *log, char *err, size_t err_len) {
    const char *name = base_name(m->path);
    if (refuse)
        return ERR("no %s calibration for %s: run `kvbench calibrate %s --model %s` first (or drop --no-calibrate)",
                   rq->kind, name, rq->kind, m->path);
    if (!strcmp(rq->kind, "duo")) /* DuoAttention's calibration makes its own inputs (benchmarks/calibration.c) */
        fprintf(log, "%s: no duo calibration for %s: calibrating (%d synthetic passkey prompt%s) ...\n", who, name,
                rq->samples, rq->samples == 1 ? "" : "s");
    else
        fprintf(log, "%s: no %s calibration for %s: calibrating (%d dialogue%s of %d rounds) ...\n", who, rq->kind, name,
                rq->samples, rq->samples == 1 ? "" : "s", rq->rounds);
    double t0 = kvb_now_s();
    char why[512];
    if (kvb_calibrate_request(m, cp, rq, why, sizeof why)) return ERR("%s calibration failed: %s", rq->kind, why);
    fprintf(log, "%s: %s; %.0f s, stored in the model's profile, tables in %s\n", rq->kind, rq->result, kvb_now_s() - t0,
            rq->out_dir);
    return 0;
}

int kvb_calibrate_missing(const char *who, kvb_model *m, const kvb_ctx_params *cp, const char *const *kinds, int n_kinds,
                          int samples, int rounds, const char *out_dir, int refuse, FILE *log,
                          char *err, size_t err_len) {
    char tmp[] = "/tmp/kvb_calibration_XXXXXX";
    kvb_cal_request rq = {.out_dir = out_dir, .samples = samples, .rounds = rounds};
    for (int i = 0; i < n_kinds; i++) {
        int seen = 0;
        for (int j = 0; j < i; j++) seen |= !strcmp(kinds[i], kinds[j]);
        if (seen) continue;
        /* under the lock: another shard may be making this section now; then it is there when the lock comes */
        if (kvb_profile_lock(m, err, err_len)) return -1;
        int has = kvb_profile_has(m, kinds[i], err, err_len), rc = has < 0 ? -1 : 0;
        if (has == 0 && !rq.out_dir && !refuse && !(rq.out_dir = mkdtemp(tmp)))
            rc = ERR("cannot make a folder for the calibration tables (%s)", tmp);
        rq.kind = kinds[i];
        rq.result[0] = 0;
        if (has == 0 && !rc) rc = make_section(who, m, cp, &rq, refuse, log, err, err_len);
        kvb_profile_unlock();
        if (rc) return -1;
    }
    return 0;
}

int kvb_run_calibrate(const kvb_run_opts *o, kvb_model *m, const cJSON *suite, const kvb_cells *cs, const char *out_dir,
                      FILE *log, char *err, size_t err_len) {
    const char *kinds[KVB_MAX_CELLS];
    int n = 0;
    for (int k = 0; k < cs->n; k++)
        if (cs->v[k].needs.profile) kinds[n++] = cs->v[k].needs.profile;
    if (!n) return 0;
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/calibration", out_dir);
    int samples, rounds;
    if (read_inputs(suite, &samples, &rounds, err, err_len)) return -1;
    kvb_ctx_params cp = kvb_run_ctx_params(o);
    return kvb_calibrate_missing("run", m, &cp, kinds, n, samples, rounds, dir, o->no_calibrate, log, err,
                                 err_len);
}
