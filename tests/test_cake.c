/* test_cake.c — CAKE against float64 restatements of its formulas: a layer's dispersion (-sum a log(a + 1e-10)),
 * shift (sum of the unbiased variances over the window rows) and eviction indicator (mean + gamma var, pooled, mean
 * over the group) on random attention; the layer budgets (shares by preference, capped, summing exactly); and
 * through the engine on a tiny model, the window's attention recomputed in float64 from the observation queries and
 * the cached keys gives each layer's budget and each head's kept positions; the cache holds B x layers in total;
 * decode appends; 100% keeps everything. Device memory goes through the backend only (KVB_GUARD-clean). */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util_common.h"
#include "util_method.h"
#include "engine/model.h"
#include "methods/cake.h"
#include "methods/method.h"

enum { L = 4, NH = 4, NKV = 2, HD = 16, E = NH * HD, FF = 48, V = 300, CTX = 512 };

static uint64_t rng = 47;

static float frand(float s) { return util_frand(&rng, s); }

/* float64 restatement of one layer (A: [H][W][n] doubles): the pooled indicator per query head first, then the
 * group's mean, as the official code orders it */
static void layer_ref(const double *A, int H, int HK, int W, int n, int kernel, double gamma, double *disp, double *shift,
                      double *score) {
    const int m = n - W, G = H / HK;
    *disp = 0, *shift = 0;
    for (int i = 0; i < HK * m; i++) score[i] = 0;
    for (int h = 0; h < H; h++) {
        double ind[CTX];
        for (int j = 0; j < m; j++) {
            double mean = 0, var = 0;
            for (int t = 0; t < W; t++) mean += A[(h * W + t) * n + j] / W;
            for (int t = 0; t < W; t++) {
                double a = A[(h * W + t) * n + j];
                var += (a - mean) * (a - mean) / (W - 1);
                *disp -= a * log(a + 1e-10);
            }
            *shift += var;
            ind[j] = mean + gamma * var;
        }
        for (int j = 0; j < m; j++) {
            double pooled = 0;
            for (int i = j - kernel / 2; i <= j + kernel / 2; i++) pooled += i >= 0 && i < m ? ind[i] / kernel : 0;
            score[(h / G) * m + j] += pooled / G;
        }
    }
}

static void test_layer_statistics_match_float64(void) {
    enum { H = 4, HK = 2, W = 6, N = 50, STRIDE = 53 };
    static float A[H * W * STRIDE];
    static double Ad[H * W * N], want[HK * (N - W)];
    float got[HK * (N - W)];
    for (int h = 0; h < H; h++)
        for (int t = 0; t < W; t++) {
            double sum = 0;
            for (int j = 0; j < N; j++) sum += (Ad[(h * W + t) * N + j] = exp(3 * frand(1.0f)));
            for (int j = 0; j < N; j++) {
                A[(h * W + t) * STRIDE + j] = (float)(Ad[(h * W + t) * N + j] / sum);
                Ad[(h * W + t) * N + j] = A[(h * W + t) * STRIDE + j];
            }
        }
    double disp, shift, wd, ws;
    CU_ASSERT_FATAL(kvb_cake_layer(A, H, HK, W, STRIDE, N, 5, 200, &disp, &shift, got) == 0);
    layer_ref(Ad, H, HK, W, N, 5, 200, &wd, &ws, want);
    CU_ASSERT(fabs(disp - wd) < 1e-9 * wd && fabs(shift - ws) < 1e-9 * ws);
    double worst = 0;
    for (int i = 0; i < HK * (N - W); i++) worst = fmax(worst, fabs(got[i] - want[i]) / want[i]);
    CU_ASSERT(worst < 1e-6); /* the float the scores are stored in */
}

static void test_budgets_share_by_preference_exactly(void) {
    for (int trial = 0; trial < 200; trial++) {
        const int n_l = 1 + trial % 9;
        double pref[9];
        int64_t out[9];
        for (int l = 0; l < n_l; l++) pref[l] = trial % 7 == 0 ? 0 : (double)((trial * 13 + l * 7) % 11);
        const int64_t cap = 20 + trial % 50, total = (trial * 31) % (n_l * cap + 1);
        kvb_cake_budgets(n_l, pref, total, cap, out);
        int64_t sum = 0;
        double psum = 0;
        for (int l = 0; l < n_l; l++) sum += out[l], psum += pref[l];
        CU_ASSERT_EQUAL(sum, total);
        /* the reference: water-filling by bisection on a level x, share_l = min(cap, x pref_l); what the layers with
         * a preference cannot hold goes to the others evenly, by a second level (all of them when psum = 0) */
        double share[9], left = (double)total;
        for (int stage = 0; stage < 2; stage++) {
            double lo = 0, hi = 1e12;
            for (int it = 0; it < 300; it++) {
                double x = (lo + hi) / 2, s2 = 0;
                for (int l = 0; l < n_l; l++) {
                    double w = stage == 0 ? pref[l] : (psum > 0 && pref[l] > 0 ? 0 : 1);
                    s2 += fmin((double)cap, x * w);
                }
                if (s2 < left) lo = x;
                else hi = x;
            }
            double used = 0;
            for (int l = 0; l < n_l; l++) {
                double w = stage == 0 ? pref[l] : (psum > 0 && pref[l] > 0 ? 0 : 1);
                double sh = fmin((double)cap, hi * w);
                share[l] = stage == 0 ? (psum > 0 ? sh : 0) : share[l] + sh;
                used += sh;
            }
            if (stage == 0 && psum > 0) left -= fmin(used, left);
            if (left <= 1e-9) break;
        }
        for (int l = 0; l < n_l; l++) CU_ASSERT(out[l] <= cap && fabs((double)out[l] - share[l]) < 1 + 1e-6);
    }
}

/* Through the engine at 30%: the reference recomputes each layer's window attention in float64 from the observation
 * queries and the cached keys, then the budgets (kvb_cake_budgets on its preferences) and each head's top tokens. */
static void test_engine_keeps_the_reference_tokens(void) {
    char err[256];
    enum { N = 200, W = 16 };
    const int G = NH / NKV, m = N - W;
    kvb_ctx *c = util_tiny_ctx(KVB_F32, CTX);
    kvb_method *m_ = util_make_method("cake", c, "30%", "window=16");
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = 3 + (i * 43) % 290;
    CU_ASSERT_FATAL(kvb_forward(c, ids, N, err, sizeof err) == 0);
    CU_ASSERT_FATAL(c->obs_n == W);
    const float scale = util_tiny->cfg.attn_scale;
    static float q[L][W][NH * HD];
    int32_t qpos[W];
    for (int l = 0; l < L; l++) util_dev_read(c->be, q[l], c->obs_q + (size_t)l * c->obs_cap * NH * HD, sizeof q[l]);
    util_dev_read(c->be, qpos, c->obs_pos, sizeof qpos);
    static double A[NH * W * N], score[L][NKV * (N - W)];
    double pref[L];
    for (int l = 0; l < L; l++) {
        util_kv_head hk[NKV];
        for (int g = 0; g < NKV; g++) hk[g] = util_kv_head_copy(c->kv, l, g);
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < W; t++) {
                double mx = -INFINITY, sum = 0, *row = A + (h * W + t) * N;
                for (int j = 0; j < N; j++) {
                    row[j] = -INFINITY;
                    if (hk[h / G].pos[j] > qpos[t]) continue;
                    double dot = 0;
                    for (int e = 0; e < HD; e++) dot += (double)q[l][t][h * HD + e] * util_elem(hk[h / G].k, KVB_F32, (size_t)j * HD + e);
                    row[j] = scale * dot;
                    mx = fmax(mx, row[j]);
                }
                for (int j = 0; j < N; j++) sum += row[j] == -INFINITY ? 0 : exp(row[j] - mx);
                for (int j = 0; j < N; j++) row[j] = row[j] == -INFINITY ? 0 : exp(row[j] - mx) / sum;
            }
        for (int g = 0; g < NKV; g++) util_kv_head_free(&hk[g]);
        double disp, shift;
        layer_ref(A, NH, NKV, W, N, 5, 200, &disp, &shift, score[l]);
        pref[l] = disp * shift;
    }
    int64_t prefix[L];
    kvb_cake_budgets(L, pref, (int64_t)L * (60 - W), m, prefix); /* 30% of 200 = 60 per head */
    CU_ASSERT_FATAL(kvb_ctx_end_prefill(c, err, sizeof err) == 0);
    CU_ASSERT(kvb_method_verify(m_, c, 1, err, sizeof err) == 0);
    int32_t pos[CTX], want[N];
    int64_t total = 0;
    int mismatches = 0, near_ties = 0;
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) {
            int64_t got = util_head_positions(c, l, g, pos);
            CU_ASSERT_EQUAL(got, prefix[l] + W);
            total += got;
            double margin = 1;
            util_topk_ref(score[l] + g * m, m, prefix[l], want, &margin, NULL);
            if (margin < 1e-6) { near_ties++; continue; } /* float attention could break such a tie either way */
            for (int i = 0; i < W; i++) want[prefix[l] + i] = m + i;
            mismatches += got != prefix[l] + W || memcmp(pos, want, (size_t)got * sizeof *pos) != 0;
        }
    CU_ASSERT_EQUAL(total, (int64_t)L * NKV * 60);
    CU_ASSERT_EQUAL(mismatches, 0);
    CU_ASSERT(near_ties <= 1);
    int32_t id = 7;
    CU_ASSERT_FATAL(kvb_forward(c, &id, 1, err, sizeof err) == 0);
    CU_ASSERT(kvb_method_verify(m_, c, 0, err, sizeof err) == 0);
    kvb_method_free(m_, c);
    kvb_ctx_free(c);
}

static void test_full_budget_and_options(void) {
    char err[256];
    kvb_ctx *c = util_tiny_ctx(KVB_F16, CTX);
    kvb_method *m = util_make_method("cake", c, "100%", NULL);
    int32_t ids[120];
    for (int i = 0; i < 120; i++) ids[i] = 3 + (i * 17) % 290;
    CU_ASSERT_FATAL(kvb_method_prefill(m, c, ids, 120, err, sizeof err) == 0);
    int32_t pos[CTX];
    for (int l = 0; l < L; l++) CU_ASSERT_EQUAL(util_head_positions(c, l, 1, pos), 120);
    kvb_method_free(m, c);
    util_check_refusals("cake", c, "kernel=4", "kernel must be odd");
    util_check_refusals("cake", c, "tau1=0", "tau1 and tau2 must be > 0");
    kvb_method_needs nd;
    CU_ASSERT(kvb_method_needs_of("cake", NULL, &nd, err, sizeof err) == 0 && nd.obs_window == 32 && nd.shares_prefill && !nd.profile);
    kvb_ctx_free(c);
}

static int setup(void) {
    const util_tiny_shape shape = {"cake", L, E, NH, NKV, FF, V, CTX};
    return util_tiny_setup(&shape, &rng);
}

static int teardown(void) { return util_tiny_teardown(); }

int main(void) {
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("cake", setup, teardown);
    CU_add_test(s, "dispersion, shift and indicator = float64 restatement", test_layer_statistics_match_float64);
    CU_add_test(s, "layer budgets: shares by preference, capped, summing exactly", test_budgets_share_by_preference_exactly);
    CU_add_test(s, "through the engine: float64 attention gives the budgets and kept tokens", test_engine_keeps_the_reference_tokens);
    CU_add_test(s, "budget 100% keeps everything; bad options refused", test_full_budget_and_options);
    return util_run_suites();
}
