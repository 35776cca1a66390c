/* test_lagkv.c — LagKV on a tiny random model and hand-built KV states, against a float64 restatement of kvpress's
 * LagKVPress: after 4 sinks, partitions of `lag` slots; each row of a partition scaled per channel by the next
 * partition's min and max, its sample standard deviation over channels, softmaxed over the partition, for K and V;
 * their mean ranked within the partition (argsort of argsort; cross=1: the mean itself); sinks and tail above every
 * score; the top B kept (ties, which ranks make across partitions, to the earlier token), on f32 and f16 stores. A
 * prompt without two partitions keeps the sinks and the most recent tokens; through the engine the prefill ends at
 * the budget and decode appends; budget 100% keeps everything. Device-tier memory is read and written only through
 * the backend, so the suite also runs under KVB_GUARD=1 (test_lagkv_guard). */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util_common.h"
#include "util_method.h"
#include "engine/model.h"
#include "methods/method.h"

enum { L = 4, NH = 4, NKV = 2, HD = 16, E = NH * HD, FF = 48, V = 300, CTX = 512, SINKS = 4 };

static uint64_t rng = 37;

static float frand(float s) { return util_frand(&rng, s); }

/* Every layer gets n random tokens at positions 0..n-1, as if prefilled. */
static void fill_store(kvb_ctx *c, int64_t n) {
    char err[256];
    const int kvd = NKV * HD;
    float *k = malloc((size_t)n * kvd * sizeof *k), *v = malloc((size_t)n * kvd * sizeof *v);
    int32_t *pos = malloc((size_t)n * sizeof *pos);
    for (int l = 0; l < L; l++) {
        for (int64_t t = 0; t < n; t++) { /* a scale per token: deviations (and softmaxes) well apart */
            const float ks = 2.0f + frand(1.8f), vs = 2.0f + frand(1.8f);
            for (int i = 0; i < kvd; i++) k[t * kvd + i] = ks * frand(1.0f) * (1.0f + (float)(i % 5)), v[t * kvd + i] = vs * frand(2.0f);
        }
        for (int64_t i = 0; i < n; i++) pos[i] = (int32_t)i;
        CU_ASSERT_FATAL(kvc_append(c->kv, l, n, k, v, pos, NULL, err, sizeof err) == 0);
    }
    c->n_past = n;
    free(k), free(v), free(pos);
}

/* softmax over each partition of the scaled rows' sample std, for rows x (K or V) */
static void states_score(const void *x, kvb_dtype dt, int64_t n_part, int lag, double *out) {
    for (int64_t p = 0; p + 1 < n_part; p++) {
        double lo[HD], hi[HD];
        for (int e = 0; e < HD; e++) {
            lo[e] = INFINITY, hi[e] = -INFINITY;
            for (int64_t r = SINKS + (p + 1) * lag; r < SINKS + (p + 2) * lag; r++) {
                const double y = util_elem(x, dt, (size_t)(r * HD + e));
                lo[e] = fmin(lo[e], y), hi[e] = fmax(hi[e], y);
            }
        }
        double *o = out + p * lag, mx = -INFINITY, sum = 0;
        for (int i = 0; i < lag; i++) {
            const int64_t r = SINKS + p * lag + i;
            double y[HD], mean = 0, ss = 0;
            for (int e = 0; e < HD; e++) mean += y[e] = (util_elem(x, dt, (size_t)(r * HD + e)) - lo[e]) / (hi[e] - lo[e]);
            mean /= HD;
            for (int e = 0; e < HD; e++) ss += (y[e] - mean) * (y[e] - mean);
            o[i] = sqrt(ss / (HD - 1));
            mx = fmax(mx, o[i]);
        }
        for (int i = 0; i < lag; i++) sum += exp(o[i] - mx);
        for (int i = 0; i < lag; i++) o[i] = exp(o[i] - mx) / sum;
    }
}

/* kvpress's LagKVPress score of a head; *near: pairs of a partition within a float rounding of each other */
static void lagkv_ref(const util_kv_head *h, kvb_dtype dt, int64_t n, int lag, int cross, double *score, int *near) {
    if (n < SINKS + 2 * lag) {
        for (int64_t j = 0; j < n; j++) score[j] = j < SINKS ? 1.0 : (double)(j - SINKS) / (double)(n - SINKS);
        return;
    }
    const int64_t n_part = (n - SINKS) / lag, end = SINKS + n_part * lag;
    double *ks = malloc((size_t)n * sizeof *ks), *vs = malloc((size_t)n * sizeof *vs);
    states_score(h->k, dt, n_part, lag, ks);
    states_score(h->v, dt, n_part, lag, vs);
    for (int64_t j = 0; j < n; j++) score[j] = 1.0; /* sinks and tail */
    for (int64_t p = 0; p + 1 < n_part; p++)
        for (int i = 0; i < lag; i++) {
            const double m = (ks[p * lag + i] + vs[p * lag + i]) / 2;
            int64_t rank = 0;
            for (int j = 0; j < lag; j++) {
                const double o = (ks[p * lag + j] + vs[p * lag + j]) / 2;
                rank += o < m;
                *near += j > i && fabs(o - m) < 3e-7 * m; /* two float roundings each apart */
            }
            score[SINKS + p * lag + i] = cross ? m : (double)rank / lag;
        }
    (void)end;
    free(ks), free(vs);
}

static void check_keeps(kvb_dtype dt, const char *opts, int lag, int cross, int64_t n, const char *budget, int64_t B) {
    char err[256];
    kvb_ctx *c = util_tiny_ctx(dt, CTX);
    kvb_method *m = util_make_method("lagkv", c, budget, opts);
    fill_store(c, n);
    static int32_t want[L][NKV][CTX];
    int near = 0;
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) {
            util_kv_head hv = util_kv_head_copy(c->kv, l, g);
            double score[CTX], margin = 1, kth = 1;
            lagkv_ref(&hv, dt, n, lag, cross, score, &near);
            util_topk_ref(score, n, B, want[l][g], &margin, &kth);
            if (cross) near += margin < 3e-7 * kth;
            util_kv_head_free(&hv);
        }
    CU_ASSERT_EQUAL(near, 0); /* the seeded rows leave no order a float rounding could flip */
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

/* 150 tokens, lag 16: 4 sinks, 8 scored partitions, a tail of 18; 75 kept = 22 + ranks 15..10 + 5 of rank 9 */
static void test_keeps_the_top_ranks_f32(void) { check_keeps(KVB_F32, "lag=16", 16, 0, 150, "50%", 75); }
static void test_keeps_the_top_ranks_f16(void) { check_keeps(KVB_F16, "lag=16", 16, 0, 150, "25%", 38); }
static void test_cross_scoring_ranks_the_softmax_itself(void) { check_keeps(KVB_F32, "lag=16,cross=1", 16, 1, 200, "30%", 60); }
static void test_default_lag_on_a_longer_prompt(void) { check_keeps(KVB_F32, NULL, 128, 0, 400, "40%", 160); }
static void test_short_prompt_keeps_sinks_and_recent(void) { check_keeps(KVB_F32, "lag=16", 16, 0, 30, "50%", 15); }
static void test_budget_under_the_sinks_keeps_the_first_tokens(void) { check_keeps(KVB_F32, "lag=16", 16, 0, 150, "3", 3); }

static void test_engine_prefill_holds_budget_decode_appends(void) {
    char err[256];
    kvb_ctx *c = util_tiny_ctx(KVB_F16, CTX);
    kvb_method *m = util_make_method("lagkv", c, "40", "lag=16");
    int32_t ids[150];
    for (int i = 0; i < 150; i++) ids[i] = 3 + (i * 37) % 290;
    CU_ASSERT_FATAL(kvb_method_prefill(m, c, ids, 150, err, sizeof err) == 0);
    for (int s = 0; s < 4; s++) {
        int32_t id = 9 + s;
        CU_ASSERT_FATAL(kvb_forward(c, &id, 1, err, sizeof err) == 0);
        CU_ASSERT(kvb_method_verify(m, c, 0, err, sizeof err) == 0);
    }
    int32_t pos[CTX];
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) {
            CU_ASSERT_EQUAL(util_head_positions(c, l, g, pos), 44);
            CU_ASSERT(pos[0] == 0 && pos[3] == 3 && pos[39] == 149); /* sinks and the tail's last token */
            CU_ASSERT(pos[40] == 150 && pos[43] == 153);
        }
    char desc[96];
    m->def->describe(m, desc, sizeof desc);
    CU_ASSERT_STRING_EQUAL(desc, "sinks=4 lag=16 cross=0 keep=40");
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

static void test_full_budget_keeps_everything(void) {
    char err[256];
    kvb_ctx *c = util_tiny_ctx(KVB_F32, CTX);
    kvb_method *m = util_make_method("lagkv", c, "100%", "lag=16");
    fill_store(c, 100);
    CU_ASSERT_FATAL(kvb_ctx_end_prefill(c, err, sizeof err) == 0);
    CU_ASSERT(kvb_method_verify(m, c, 1, err, sizeof err) == 0);
    int32_t pos[CTX];
    for (int l = 0; l < L; l++) CU_ASSERT_EQUAL(util_head_positions(c, l, 1, pos), 100);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

static void test_needs_and_options(void) {
    char err[256];
    kvb_method_needs nd;
    CU_ASSERT(kvb_method_needs_of("lagkv", NULL, &nd, err, sizeof err) == 0 && nd.needs_budget && nd.shares_prefill &&
              !nd.obs_window && !nd.prefill_scores && !nd.own_prefill && !nd.profile);
    kvb_ctx *c = util_tiny_ctx(KVB_F32, CTX);
    util_check_refusals("lagkv", c, "lag=1", "lag >= 2");
    util_check_refusals("lagkv", c, "cross=2", "cross 0 or 1");
    kvb_ctx_free(c);
}

static int setup(void) {
    const util_tiny_shape shape = {"lagkv", L, E, NH, NKV, FF, V, CTX};
    return util_tiny_setup(&shape, &rng);
}

static int teardown(void) { return util_tiny_teardown(); }

int main(void) {
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("lagkv", setup, teardown);
    CU_add_test(s, "keeps the top ranks of the lag-relative scores, as float64 LagKVPress (f32)", test_keeps_the_top_ranks_f32);
    CU_add_test(s, "keeps the top ranks of the lag-relative scores, as float64 LagKVPress (f16)", test_keeps_the_top_ranks_f16);
    CU_add_test(s, "cross=1 ranks the mean softmax across partitions", test_cross_scoring_ranks_the_softmax_itself);
    CU_add_test(s, "lag=128 (the default) on a 400-token prompt", test_default_lag_on_a_longer_prompt);
    CU_add_test(s, "a prompt without two partitions keeps the sinks and the most recent", test_short_prompt_keeps_sinks_and_recent);
    CU_add_test(s, "a budget under the sinks keeps the first tokens", test_budget_under_the_sinks_keeps_the_first_tokens);
    CU_add_test(s, "through the engine: prefill at the budget, sinks and tail kept, decode appends", test_engine_prefill_holds_budget_decode_appends);
    CU_add_test(s, "budget 100% keeps everything", test_full_budget_keeps_everything);
    CU_add_test(s, "needs and options", test_needs_and_options);
    return util_run_suites();
}
