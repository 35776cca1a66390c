/* test_compactor.c — Compactor's leverage scores on a tiny random model and hand-built KV states, against a float64
 * restatement of kvpress's LeverageScorePress without its random sketch: per layer and KV head, the cached keys
 * derotated to pre-RoPE (R(-j)), centred on their mean, score_j = x_j^T (X^T X + 1e-2 I)^-1 x_j (a Cholesky solve in
 * double), the top B kept (ties to the earlier token), on f32 and f16 stores; through the engine at 25/50/75% the
 * prefill ends at the verified budget and decode appends; budget 100% keeps everything. Device-tier memory is read
 * and written only through the backend, so the suite also runs under KVB_GUARD=1 (test_compactor_guard). */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util_common.h"
#include "util_method.h"
#include "engine/model.h"
#include "methods/method.h"

enum { L = 4, NH = 4, NKV = 2, HD = 16, E = NH * HD, FF = 48, V = 300, CTX = 512 };

static uint64_t rng = 53;

static float frand(float s) { return util_frand(&rng, s); }

/* Every layer gets n random tokens at positions 0..n-1, as if prefilled; channels of different spread and a few
 * outlying tokens, so leverage is far from uniform. */
static void fill_store(kvb_ctx *c, int64_t n) {
    char err[256];
    const int kvd = NKV * HD;
    float *k = malloc((size_t)n * kvd * sizeof *k), *v = malloc((size_t)n * kvd * sizeof *v);
    int32_t *pos = malloc((size_t)n * sizeof *pos);
    for (int l = 0; l < L; l++) {
        for (int64_t t = 0; t < n; t++) {
            const float out = t % 11 == 3 ? 3.0f : 1.0f;
            for (int i = 0; i < kvd; i++) k[t * kvd + i] = out * frand(0.5f + (float)(i % HD) / HD) + 0.3f, v[t * kvd + i] = frand(1.0f);
        }
        for (int64_t i = 0; i < n; i++) pos[i] = (int32_t)i;
        CU_ASSERT_FATAL(kvc_append(c->kv, l, n, k, v, pos, NULL, err, sizeof err) == 0);
    }
    c->n_past = n;
    free(k), free(v), free(pos);
}

/* leverage of the n keys (post-RoPE as cached) of one head: derotated, centred, x^T (X^T X + 1e-2 I)^-1 x */
static void leverage_ref(const kvb_config *cfg, const void *K, kvb_dtype dt, int64_t n, double *score) {
    double (*x)[HD] = malloc((size_t)n * sizeof *x), mean[HD] = {0}, G[HD][HD] = {{0}}, Lc[HD][HD] = {{0}};
    for (int64_t j = 0; j < n; j++) {
        for (int e = 0; e < HD; e++) x[j][e] = util_elem(K, dt, (size_t)(j * HD + e));
        for (int i = 0; i < cfg->n_rot / 2; i++) { /* R(-j): llama's adjacent pairs */
            const int a = cfg->rope_neox ? i : 2 * i, b = cfg->rope_neox ? i + cfg->n_rot / 2 : 2 * i + 1;
            const double th = pow((double)cfg->rope.freq_base, -2.0 * i / cfg->n_rot), cs = cos(j * th), sn = sin(j * th);
            const double xa = x[j][a], xb = x[j][b];
            x[j][a] = cs * xa + sn * xb;
            x[j][b] = -sn * xa + cs * xb;
        }
        for (int e = 0; e < HD; e++) mean[e] += x[j][e] / n;
    }
    for (int64_t j = 0; j < n; j++)
        for (int e = 0; e < HD; e++) x[j][e] -= mean[e];
    for (int a = 0; a < HD; a++)
        for (int b = 0; b < HD; b++) {
            for (int64_t j = 0; j < n; j++) G[a][b] += x[j][a] * x[j][b];
            if (a == b) G[a][b] += 1e-2;
        }
    for (int a = 0; a < HD; a++) /* Cholesky */
        for (int b = 0; b <= a; b++) {
            double s = G[a][b];
            for (int k = 0; k < b; k++) s -= Lc[a][k] * Lc[b][k];
            Lc[a][b] = a == b ? sqrt(s) : s / Lc[b][b];
        }
    for (int64_t j = 0; j < n; j++) { /* ||L^-1 x||^2 by forward substitution */
        double y[HD], s2 = 0;
        for (int a = 0; a < HD; a++) {
            double s = x[j][a];
            for (int k = 0; k < a; k++) s -= Lc[a][k] * y[k];
            y[a] = s / Lc[a][a];
            s2 += y[a] * y[a];
        }
        score[j] = s2;
    }
    free(x);
}

static void check_keeps(kvb_dtype dt, int64_t n, const char *budget, int64_t B) {
    char err[256];
    kvb_ctx *c = util_tiny_ctx(dt, CTX);
    kvb_method *m = util_make_method("compactor", c, budget, NULL);
    fill_store(c, n);
    static int32_t want[L][NKV][CTX];
    int near = 0;
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) {
            util_kv_head hv = util_kv_head_copy(c->kv, l, g);
            double score[CTX], margin = 1, kth = 1;
            leverage_ref(&c->model->cfg, hv.k, dt, n, score);
            util_topk_ref(score, n, B, want[l][g], &margin, &kth);
            near += margin < 1e-4 * kth;
            util_kv_head_free(&hv);
        }
    CU_ASSERT_EQUAL(near, 0); /* the seeded keys leave no boundary a float rounding could flip */
    CU_ASSERT_FATAL(kvb_ctx_end_prefill(c, err, sizeof err) == 0);
    CU_ASSERT(kvb_method_verify(m, c, 1, err, sizeof err) == 0);
    int32_t pos[CTX];
    int mismatches = 0;
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) {
            CU_ASSERT_EQUAL_FATAL(util_head_positions(c, l, g, pos), B);
            mismatches += memcmp(pos, want[l][g], (size_t)B * sizeof(int32_t)) != 0;
        }
    CU_ASSERT_EQUAL(mismatches, 0);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

static void test_keeps_the_highest_leverage_f32(void) { check_keeps(KVB_F32, 150, "25%", 38); }
static void test_keeps_the_highest_leverage_f16(void) { check_keeps(KVB_F16, 200, "50%", 100); }

static void test_engine_budgets_hold_decode_appends(void) {
    char err[256];
    const char *budgets[] = {"25%", "50%", "75%"};
    const int64_t keeps[] = {38, 75, 113}; /* of 150, rounded */
    int32_t ids[150];
    for (int i = 0; i < 150; i++) ids[i] = 3 + (i * 37) % 290;
    for (int b = 0; b < 3; b++) {
        kvb_ctx *c = util_tiny_ctx(KVB_F16, CTX);
        kvb_method *m = util_make_method("compactor", c, budgets[b], NULL);
        CU_ASSERT_FATAL(kvb_method_prefill(m, c, ids, 150, err, sizeof err) == 0);
        for (int s = 0; s < 3; s++) {
            int32_t id = 9 + s;
            CU_ASSERT_FATAL(kvb_forward(c, &id, 1, err, sizeof err) == 0);
            CU_ASSERT(kvb_method_verify(m, c, 0, err, sizeof err) == 0);
        }
        int32_t pos[CTX];
        for (int l = 0; l < L; l++)
            for (int g = 0; g < NKV; g++) {
                CU_ASSERT_EQUAL(util_head_positions(c, l, g, pos), keeps[b] + 3);
                CU_ASSERT(pos[keeps[b]] == 150 && pos[keeps[b] + 2] == 152); /* the decoded tokens */
            }
        kvb_method_free(m, c);
        kvb_ctx_free(c);
    }
}

static void test_full_budget_keeps_everything(void) {
    char err[256];
    kvb_ctx *c = util_tiny_ctx(KVB_F32, CTX);
    kvb_method *m = util_make_method("compactor", c, "100%", NULL);
    fill_store(c, 64);
    CU_ASSERT_FATAL(kvb_ctx_end_prefill(c, err, sizeof err) == 0);
    CU_ASSERT(kvb_method_verify(m, c, 1, err, sizeof err) == 0);
    int32_t pos[CTX];
    for (int l = 0; l < L; l++) CU_ASSERT_EQUAL(util_head_positions(c, l, 1, pos), 64);
    char desc[64];
    m->def->describe(m, desc, sizeof desc);
    CU_ASSERT_STRING_EQUAL(desc, "sketch=none keep=64");
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

static void test_needs_and_options(void) {
    char err[256];
    kvb_method_needs nd;
    CU_ASSERT(kvb_method_needs_of("compactor", NULL, &nd, err, sizeof err) == 0 && nd.needs_budget &&
              nd.shares_prefill && !nd.obs_window && !nd.prefill_scores && !nd.own_prefill && !nd.profile);
    kvb_ctx *c = util_tiny_ctx(KVB_F32, CTX);
    util_check_refusals("compactor", c, "sketch=48", "no option 'sketch'");
    kvb_ctx_free(c);
}

static int setup(void) {
    const util_tiny_shape shape = {"compactor", L, E, NH, NKV, FF, V, CTX};
    return util_tiny_setup(&shape, &rng);
}

static int teardown(void) { return util_tiny_teardown(); }

int main(void) {
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("compactor", setup, teardown);
    CU_add_test(s, "keeps the highest leverage of the centred pre-RoPE keys, as float64 (f32)", test_keeps_the_highest_leverage_f32);
    CU_add_test(s, "keeps the highest leverage of the centred pre-RoPE keys, as float64 (f16)", test_keeps_the_highest_leverage_f16);
    CU_add_test(s, "through the engine at 25/50/75%: budget held, decode appends", test_engine_budgets_hold_decode_appends);
    CU_add_test(s, "budget 100% keeps everything", test_full_budget_keeps_everything);
    CU_add_test(s, "needs and options", test_needs_and_options);
    return util_run_suites();
}
