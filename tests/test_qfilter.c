/* test_qfilter.c — Q-Filters against float64 restatements: the calibration's top eigenvector (Jacobi) equals power
 * iteration's on Q^T Q and is signed so the mean query projects positively; the method keeps, per layer and KV head,
 * the B tokens whose keys project most on the profile's filter (sum_e f_e k_e in float64, ties to the earlier token)
 * on f32 and f16 stores; through the engine the prefill ends at the budget and decode appends; filters=window runs
 * without a profile; without a profile the method refuses with one line naming `kvbench calibrate qfilter`; a
 * profile of the wrong shape is a one-line error. Device memory goes through the backend only (KVB_GUARD-clean). */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util_common.h"
#include "util_method.h"
#include "engine/model.h"
#include "methods/calibrate.h"
#include "methods/method.h"
#include "methods/profile.h"

enum { L = 4, NH = 4, NKV = 2, HD = 16, E = NH * HD, FF = 48, V = 300, CTX = 512 };

static uint64_t rng = 23;
static char prof_dir[64] = "/tmp/kvb_qfilter_XXXXXX";
static float filt[L][NKV][HD];

static float frand(float s) { return util_frand(&rng, s); }

/* float64 power iteration on A (d x d), from a fixed start: the dominant eigenvector, unit, and its eigenvalue */
static double power_ref(const double *A, int d, double *v) {
    double w[64], lambda = 0;
    for (int i = 0; i < d; i++) v[i] = 1.0 / sqrt(d) + 1e-3 * i;
    for (int it = 0; it < 20000; it++) {
        double norm = 0;
        for (int i = 0; i < d; i++) {
            w[i] = 0;
            for (int j = 0; j < d; j++) w[i] += A[i * d + j] * v[j];
            norm += w[i] * w[i];
        }
        norm = sqrt(norm);
        lambda = norm;
        for (int i = 0; i < d; i++) v[i] = w[i] / norm;
    }
    return lambda;
}

static void test_top_eigvec_is_power_iterations(void) {
    enum { D = 12, N = 40 };
    for (int trial = 0; trial < 5; trial++) {
        double A[D * D] = {0}, v[D], ref[D], lambda = 0;
        for (int r = 0; r < N; r++) { /* A = X^T X with a favoured direction */
            double x[D];
            for (int i = 0; i < D; i++) x[i] = frand(1.0f) + (i == trial ? 2.0 : 0.0);
            for (int i = 0; i < D; i++)
                for (int j = 0; j < D; j++) A[i * D + j] += x[i] * x[j];
        }
        CU_ASSERT_FATAL(kvb_cal_top_eigvec(A, D, v, &lambda) == 0);
        double want = power_ref(A, D, ref), dot = 0;
        for (int i = 0; i < D; i++) dot += v[i] * ref[i];
        CU_ASSERT(fabs(fabs(dot) - 1) < 1e-9);
        CU_ASSERT(fabs(lambda - want) < 1e-9 * want);
    }
}

/* kvb_cal_qfilter_add pools the query heads of a KV head; dirs = the top eigenvector, signed by the mean query */
static void test_filters_are_signed_singular_vectors(void) {
    enum { T = 30, H = 4, HK = 2, D = 8 };
    float q[T][H][D];
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            for (int e = 0; e < D; e++) q[t][h][e] = frand(1.0f) + (e == 2 ? (h < 2 ? -3.0f : 3.0f) : 0.0f);
    double S[HK * D * D] = {0}, sum[HK * D] = {0};
    float f[HK * D];
    kvb_cal_qfilter_add(&q[0][0][0], T, H, HK, D, S, sum);
    CU_ASSERT_FATAL(kvb_cal_qfilter_dirs(S, sum, HK, D, f) == 0);
    for (int g = 0; g < HK; g++) {
        double A[D * D] = {0}, m[D] = {0}, ref[D];
        for (int t = 0; t < T; t++) /* the naive Q^T Q of the group's rows */
            for (int h = g * 2; h < g * 2 + 2; h++)
                for (int a = 0; a < D; a++) {
                    m[a] += q[t][h][a];
                    for (int b = 0; b < D; b++) A[a * D + b] += (double)q[t][h][a] * q[t][h][b];
                }
        power_ref(A, D, ref);
        double dot = 0, mdot = 0;
        for (int e = 0; e < D; e++) dot += f[g * D + e] * ref[e], mdot += f[g * D + e] * m[e];
        CU_ASSERT(fabs(fabs(dot) - 1) < 1e-6);
        CU_ASSERT(mdot > 0); /* the paper's sign */
    }
    CU_ASSERT(f[0 * D + 2] < 0 && f[1 * D + 2] > 0); /* group 0's queries point to -e2, group 1's to +e2 */
}

/* The profile's "qfilter" section: filters [L][NKV][HD] (or a wrong shape when bad = 1) */
static void store_profile(int bad) {
    char err[256];
    cJSON *sec = cJSON_CreateObject(), *fl = cJSON_CreateArray();
    for (int l = 0; l < (bad ? L - 1 : L); l++) {
        cJSON *row = cJSON_CreateArray();
        for (int g = 0; g < NKV; g++) {
            cJSON *dir = cJSON_CreateArray();
            for (int e = 0; e < HD; e++) cJSON_AddItemToArray(dir, cJSON_CreateNumber(filt[l][g][e]));
            cJSON_AddItemToArray(row, dir);
        }
        cJSON_AddItemToArray(fl, row);
    }
    cJSON_AddItemToObject(sec, "filters", fl);
    CU_ASSERT_FATAL(kvb_profile_store(util_tiny, "qfilter", sec, err, sizeof err) == 0);
    cJSON_Delete(sec);
}

static void clear_profile(void) {
    char path[1024], err[256];
    CU_ASSERT_FATAL(kvb_profile_path(util_tiny, path, sizeof path, err, sizeof err) == 0);
    unlink(path);
}

/* Every layer gets n random tokens at positions 0..n-1, as if prefilled. */
static void fill_store(kvb_ctx *c, int64_t n) {
    char err[256];
    const int kvd = NKV * HD;
    float *k = malloc((size_t)n * kvd * sizeof *k), *v = malloc((size_t)n * kvd * sizeof *v);
    int32_t *pos = malloc((size_t)n * sizeof *pos);
    for (int l = 0; l < L; l++) {
        for (int64_t i = 0; i < n * kvd; i++) k[i] = frand(1.0f), v[i] = frand(1.0f);
        for (int64_t i = 0; i < n; i++) pos[i] = (int32_t)i;
        CU_ASSERT_FATAL(kvc_append(c->kv, l, n, k, v, pos, NULL, err, sizeof err) == 0);
    }
    c->n_past = n;
    free(k), free(v), free(pos);
}

static void check_keeps_largest_projection(kvb_dtype dt) {
    char err[256];
    enum { N = 120, B = 30 };
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++)
            for (int e = 0; e < HD; e++) filt[l][g][e] = frand(1.0f);
    store_profile(0);
    kvb_ctx *c = util_tiny_ctx(dt, CTX);
    kvb_method *m = util_make_method("qfilter", c, "25%", NULL);
    fill_store(c, N);
    int32_t want[L][NKV][B];
    int near_ties = 0;
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) {
            util_kv_head hv = util_kv_head_copy(c->kv, l, g);
            double score[N], margin = 1;
            for (int j = 0; j < N; j++) {
                score[j] = 0;
                for (int e = 0; e < HD; e++) score[j] += (double)filt[l][g][e] * util_elem(hv.k, dt, (size_t)j * HD + e);
            }
            util_topk_ref(score, N, B, want[l][g], &margin, NULL);
            near_ties += margin < 1e-5;
            util_kv_head_free(&hv);
        }
    CU_ASSERT_EQUAL(near_ties, 0);
    CU_ASSERT_FATAL(kvb_ctx_end_prefill(c, err, sizeof err) == 0);
    CU_ASSERT(kvb_method_verify(m, c, 1, err, sizeof err) == 0);
    int32_t pos[CTX];
    int mismatches = 0;
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) {
            CU_ASSERT_EQUAL_FATAL(util_head_positions(c, l, g, pos), B);
            mismatches += memcmp(pos, want[l][g], sizeof want[l][g]) != 0;
        }
    CU_ASSERT_EQUAL(mismatches, 0);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
    clear_profile();
}

static void test_keeps_largest_projection_f32(void) { check_keeps_largest_projection(KVB_F32); }
static void test_keeps_largest_projection_f16(void) { check_keeps_largest_projection(KVB_F16); }

/* Through the engine, both filter sources: the prefill ends at the budget (verified), decode appends. */
static void check_engine(const char *opts) {
    char err[256];
    kvb_ctx *c = util_tiny_ctx(KVB_F16, CTX);
    kvb_method *m = util_make_method("qfilter", c, "40", opts);
    int32_t ids[150];
    for (int i = 0; i < 150; i++) ids[i] = 3 + (i * 37) % 290;
    CU_ASSERT_FATAL(kvb_method_prefill(m, c, ids, 150, err, sizeof err) == 0);
    for (int s = 0; s < 3; s++) {
        int32_t id = 9 + s;
        CU_ASSERT_FATAL(kvb_forward(c, &id, 1, err, sizeof err) == 0);
        CU_ASSERT(kvb_method_verify(m, c, 0, err, sizeof err) == 0);
    }
    int32_t pos[CTX];
    for (int l = 0; l < L; l++) {
        CU_ASSERT_EQUAL(util_head_positions(c, l, 0, pos), 43);
        CU_ASSERT(pos[40] == 150 && pos[42] == 152);
    }
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

static void test_engine_with_profile(void) {
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++)
            for (int e = 0; e < HD; e++) filt[l][g][e] = frand(1.0f);
    store_profile(0);
    check_engine(NULL);
    clear_profile();
}

static void test_engine_window_filters(void) { check_engine("filters=window,window=16"); }

/* The calibration's engine run on the tiny model: S = sum of q q^T over the prompt's queries is symmetric with a
 * positive trace in every layer and head. */
static void test_calibration_run_collects_queries(void) {
    char err[256];
    kvb_ctx *c = util_tiny_ctx(KVB_F32, CTX);
    int32_t ids[100];
    for (int i = 0; i < 100; i++) ids[i] = 3 + (i * 41) % 290;
    double *S = calloc((size_t)L * NKV * HD * HD, sizeof *S), *sum = calloc((size_t)L * NKV * HD, sizeof *sum);
    CU_ASSERT_FATAL(kvb_cal_qfilter_run(c, ids, 100, S, sum, err, sizeof err) == 0);
    for (int lg = 0; lg < L * NKV; lg++) {
        const double *a = S + (size_t)lg * HD * HD;
        double trace = 0, asym = 0;
        for (int i = 0; i < HD; i++) {
            trace += a[i * HD + i];
            for (int j = 0; j < HD; j++) asym += fabs(a[i * HD + j] - a[j * HD + i]);
        }
        CU_ASSERT(trace > 0 && asym == 0);
    }
    CU_ASSERT(c->hooks == NULL && c->n_past == 0); /* the context is handed back reset, without hooks */
    free(S);
    free(sum);
    kvb_ctx_free(c);
}

static void test_missing_or_bad_profile_is_one_line(void) {
    char err[256] = "";
    kvb_ctx *c = util_tiny_ctx(KVB_F32, CTX);
    kvb_budget b = {KVB_BUDGET_FRACTION, 0.3, 0};
    kvb_opts o = {0};
    clear_profile();
    kvb_method *m = kvb_method_create("qfilter", c, &b, &o, err, sizeof err);
    CU_ASSERT(m == NULL && strstr(err, "kvbench calibrate qfilter") && !strchr(err, '\n'));
    store_profile(1);
    err[0] = 0;
    m = kvb_method_create("qfilter", c, &b, &o, err, sizeof err);
    CU_ASSERT(m == NULL && strstr(err, "qfilter.filters") && !strchr(err, '\n'));
    clear_profile();
    util_check_refusals("qfilter", c, "filters=svd", "filters must be profile or window");
    kvb_method_needs nd;
    CU_ASSERT(kvb_method_needs_of("qfilter", NULL, &nd, err, sizeof err) == 0 && nd.profile && !strcmp(nd.profile, "qfilter") &&
              nd.obs_window == 0 && nd.shares_prefill);
    CU_ASSERT(kvb_opts_add(&o, "filters=window", err, sizeof err) == 0);
    CU_ASSERT(kvb_method_needs_of("qfilter", &o, &nd, err, sizeof err) == 0 && !nd.profile && nd.obs_window == 32);
    kvb_ctx_free(c);
}

static int setup(void) {
    if (!mkdtemp(prof_dir)) return -1;
    setenv("KVB_PROFILE_DIR", prof_dir, 1);
    const util_tiny_shape shape = {"qfilter", L, E, NH, NKV, FF, V, CTX};
    return util_tiny_setup(&shape, &rng);
}

static int teardown(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", prof_dir);
    if (system(cmd)) return -1;
    return util_tiny_teardown();
}

int main(void) {
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("qfilter", setup, teardown);
    CU_add_test(s, "top eigenvector (Jacobi) = float64 power iteration", test_top_eigvec_is_power_iterations);
    CU_add_test(s, "filters: Q^T Q's top eigenvector per KV head, signed by the mean query", test_filters_are_signed_singular_vectors);
    CU_add_test(s, "keeps the keys projecting most on the filter, as float64 (f32)", test_keeps_largest_projection_f32);
    CU_add_test(s, "keeps the keys projecting most on the filter, as float64 (f16)", test_keeps_largest_projection_f16);
    CU_add_test(s, "through the engine with a profile: budget held, decode appends", test_engine_with_profile);
    CU_add_test(s, "through the engine with filters=window: no profile needed", test_engine_window_filters);
    CU_add_test(s, "the calibration run collects every layer's queries", test_calibration_run_collects_queries);
    CU_add_test(s, "a missing or malformed profile is a one-line error naming the fix", test_missing_or_bad_profile_is_one_line);
    return util_run_suites();
}
