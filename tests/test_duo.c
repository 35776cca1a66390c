/* test_duo.c — DuoAttention against restatements of its rule: the head split (the top R = floor(H (B - s) /
 * (n - s)) heads by retrieval score keep everything, the others share what is left evenly, the higher-scoring one
 * token more) checked against a brute-force reference over random scores; the calibration's retrieval score (mass on
 * the key's tokens, mean over a KV head's query heads and rows) against naive float64 sums; on a filled store each
 * head holds exactly the reference's positions (all, or its sinks + its recent tokens) and the budget check passes;
 * split=window runs without a profile; a missing profile is one line naming `kvbench calibrate duo`. */
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
#include "methods/duo.h"
#include "methods/method.h"
#include "methods/profile.h"

enum { L = 4, NH = 4, NKV = 2, HD = 16, E = NH * HD, FF = 48, V = 300, CTX = 512 };

static uint64_t rng = 31;
static char prof_dir[64] = "/tmp/kvb_duo_XXXXXX";

static float frand(float s) { return util_frand(&rng, s); }

/* Brute force: R = the largest r with r (n - s) <= H (B - s) (0 when B <= s, all when B >= n); heads ranked by
 * repeatedly taking the highest remaining score (the lowest index on ties). */
static void split_ref(int H, const double *score, int64_t n, int64_t B, int64_t s, int64_t *keep, int *R_out) {
    int R = 0;
    if (B >= n) R = H;
    else if (B > s)
        while (R < H && (int64_t)(R + 1) * (n - s) <= (int64_t)H * (B - s)) R++;
    int order[256];
    unsigned char taken[256] = {0};
    for (int i = 0; i < H; i++) {
        int best = -1;
        for (int k = 0; k < H; k++)
            if (!taken[k] && (best < 0 || score[k] > score[best])) best = k;
        taken[best] = 1;
        order[i] = best;
    }
    int64_t left = (int64_t)H * (B < n ? B : n) - (int64_t)R * n;
    for (int i = 0; i < H; i++) {
        if (i < R) keep[order[i]] = n;
        else {
            int S = H - R, k = i - R;
            keep[order[i]] = left / S + (k < left % S);
        }
    }
    *R_out = R;
}

static void test_split_matches_brute_force(void) {
    enum { LL = 6, HK = 4 };
    unsigned char global[LL] = {1, 1, 0, 1, 1, 1}; /* layer 2 is a local (sliding-window) layer: untouched */
    for (int trial = 0; trial < 300; trial++) {
        double score[LL * HK], gscore[LL * HK];
        int64_t keep[LL * HK], want[LL * HK];
        for (int i = 0; i < LL * HK; i++) score[i] = (double)((trial * 7 + i * 13) % 9); /* many ties */
        int64_t n = 50 + trial % 400, B = 1 + (trial * 37) % (n + 20), sink = trial % 5, recent = 1 + trial % 40;
        int R = kvb_duo_split(LL, HK, global, score, n, B, sink, recent, keep), Rw = 0, H = 0;
        int map[LL * HK];
        for (int l = 0; l < LL; l++)
            for (int g = 0; g < HK && global[l]; g++) map[H] = l * HK + g, gscore[H++] = score[l * HK + g];
        int64_t wk[LL * HK];
        split_ref(H, gscore, n, B, sink + recent, wk, &Rw);
        for (int i = 0; i < LL * HK; i++) want[i] = n;
        for (int i = 0; i < H; i++) want[map[i]] = wk[i];
        CU_ASSERT_EQUAL(R, Rw);
        CU_ASSERT(memcmp(keep, want, sizeof keep) == 0);
        int64_t total = 0;
        for (int i = 0; i < H; i++) total += keep[map[i]];
        CU_ASSERT_EQUAL(total, (int64_t)H * (B < n ? B : n)); /* exactly the budget */
        for (int i = 0; i < H && B > sink + recent && B < n; i++) CU_ASSERT(keep[map[i]] >= sink + recent);
    }
}

static void test_calibration_mass_is_the_naive_sum(void) {
    enum { LL = 3, H = 4, HK = 2, Q = 3, N = 20 };
    float rows[LL][H][Q][N];
    for (int i = 0; i < LL * H * Q * N; i++) (&rows[0][0][0][0])[i] = (frand(1.0f) + 1) / N;
    double mass[LL * HK] = {0};
    kvb_cal_duo_mass(&rows[0][0][0][0], LL, H, HK, Q, N, 5, 9, mass);
    for (int l = 0; l < LL; l++)
        for (int g = 0; g < HK; g++) {
            double want = 0;
            for (int r = 0; r < H / HK; r++)
                for (int t = 0; t < Q; t++)
                    for (int j = 5; j < 9; j++) want += rows[l][g * (H / HK) + r][t][j];
            want /= (double)(H / HK) * Q;
            CU_ASSERT(fabs(mass[l * HK + g] - want) < 1e-12);
        }
}

static void store_profile(const double *score, int n_layer) {
    char err[256];
    cJSON *sec = cJSON_CreateObject(), *sc = cJSON_CreateArray();
    for (int l = 0; l < n_layer; l++) cJSON_AddItemToArray(sc, cJSON_CreateDoubleArray(score + l * NKV, NKV));
    cJSON_AddItemToObject(sec, "scores", sc);
    CU_ASSERT_FATAL(kvb_profile_store(util_tiny, "duo", sec, err, sizeof err) == 0);
    cJSON_Delete(sec);
}

static void clear_profile(void) {
    char path[1024], err[256];
    CU_ASSERT_FATAL(kvb_profile_path(util_tiny, path, sizeof path, err, sizeof err) == 0);
    unlink(path);
}

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

/* On a store of N tokens at 40%: each head holds the reference's count, as its sinks + its most recent tokens (a
 * streaming head) or everything (a retrieval head); the budget check passes; decode appends to every head. */
static void test_heads_keep_sinks_and_recent(void) {
    char err[256];
    enum { N = 200 };
    double score[L * NKV];
    for (int i = 0; i < L * NKV; i++) score[i] = frand(1.0f);
    store_profile(score, L);
    kvb_ctx *c = util_tiny_ctx(KVB_F16, CTX);
    kvb_method *m = util_make_method("duo", c, "40%", "sink=4,recent=16");
    fill_store(c, N);
    int64_t want[L * NKV];
    int R = 0;
    split_ref(L * NKV, score, N, 80, 20, want, &R);
    CU_ASSERT_EQUAL(R, 2); /* floor(8 x 60 / 180) */
    CU_ASSERT_FATAL(kvb_ctx_end_prefill(c, err, sizeof err) == 0);
    CU_ASSERT(kvb_method_verify(m, c, 1, err, sizeof err) == 0);
    int32_t pos[CTX];
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) {
            int64_t w = want[l * NKV + g], got = util_head_positions(c, l, g, pos);
            CU_ASSERT_EQUAL_FATAL(got, w);
            int ok = 1;
            for (int64_t i = 0; i < w; i++) ok &= pos[i] == (i < 4 || w == N ? i : N - (w - i));
            CU_ASSERT(ok);
        }
    for (int s = 0; s < 3; s++) {
        int32_t id = 5 + s;
        CU_ASSERT_FATAL(kvb_forward(c, &id, 1, err, sizeof err) == 0);
        CU_ASSERT(kvb_method_verify(m, c, 0, err, sizeof err) == 0);
    }
    CU_ASSERT_EQUAL(util_head_positions(c, 0, 0, pos), want[0] + 3);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
    clear_profile();
}

/* split=window through the engine: the budget holds at 25/50/75% and 100% keeps everything. */
static void test_window_split_through_the_engine(void) {
    char err[256];
    const char *budgets[4] = {"25%", "50%", "75%", "100%"};
    int32_t ids[180];
    for (int i = 0; i < 180; i++) ids[i] = 3 + (i * 29) % 290;
    for (int b = 0; b < 4; b++) {
        kvb_ctx *c = util_tiny_ctx(KVB_F16, CTX);
        kvb_method *m = util_make_method("duo", c, budgets[b], "split=window,window=16,sink=4,recent=16");
        CU_ASSERT_FATAL(kvb_method_prefill(m, c, ids, 180, err, sizeof err) == 0);
        kvb_kv_usage u;
        kvb_method_usage(m, c, &u);
        CU_ASSERT(fabs(u.device_frac - (b + 1) * 0.25) < 0.01);
        kvb_method_free(m, c);
        kvb_ctx_free(c);
    }
}

static void test_missing_profile_is_one_line(void) {
    char err[256] = "";
    clear_profile();
    kvb_ctx *c = util_tiny_ctx(KVB_F32, CTX);
    kvb_budget b = {KVB_BUDGET_FRACTION, 0.3, 0};
    kvb_opts o = {0};
    kvb_method *m = kvb_method_create("duo", c, &b, &o, err, sizeof err);
    CU_ASSERT(m == NULL && strstr(err, "kvbench calibrate duo") && !strchr(err, '\n'));
    double score[L * NKV] = {0};
    store_profile(score, L - 1); /* a layer short */
    err[0] = 0;
    m = kvb_method_create("duo", c, &b, &o, err, sizeof err);
    CU_ASSERT(m == NULL && strstr(err, "duo.scores") && !strchr(err, '\n'));
    clear_profile();
    util_check_refusals("duo", c, "split=learned", "split must be profile or window");
    kvb_method_needs nd;
    CU_ASSERT(kvb_method_needs_of("duo", NULL, &nd, err, sizeof err) == 0 && nd.profile && !strcmp(nd.profile, "duo"));
    kvb_ctx_free(c);
}

static int setup(void) {
    if (!mkdtemp(prof_dir)) return -1;
    setenv("KVB_PROFILE_DIR", prof_dir, 1);
    const util_tiny_shape shape = {"duo", L, E, NH, NKV, FF, V, CTX};
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
    CU_pSuite s = CU_add_suite("duo", setup, teardown);
    CU_add_test(s, "head split = brute force: top R retrieve, the rest share the rest, exactly B x H", test_split_matches_brute_force);
    CU_add_test(s, "calibration's retrieval score = naive float64 mass on the key", test_calibration_mass_is_the_naive_sum);
    CU_add_test(s, "retrieval heads keep all, streaming heads sinks + recent; budget verified", test_heads_keep_sinks_and_recent);
    CU_add_test(s, "split=window through the engine at 25/50/75/100%", test_window_split_through_the_engine);
    CU_add_test(s, "a missing or malformed profile is a one-line error naming the fix", test_missing_profile_is_one_line);
    return util_run_suites();
}
