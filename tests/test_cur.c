/* test_cur.c — CurDKV on a tiny random model and hand-built KV states, against a float64 restatement of kvpress's
 * CURPress: per layer and KV head, k2_j = ||k_j||^2 and v2_j = ||v_j||^2 each divided by its window's sum (windows
 * of 16 slots, the last partial), score_j = k2_j v2_j (kv_product) or (k2_j + v2_j) / 2 (kv_avg), the first 4 tokens
 * kept, the top B by score kept (ties to the earlier token), on f32 and f16 stores; through the engine the prefill
 * ends at the budget and decode appends; budget 100% keeps everything. Device-tier memory is read and written only
 * through the backend, so the suite also runs under KVB_GUARD=1 (test_cur_guard). */
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

static uint64_t rng = 23;

static float frand(float s) { return util_frand(&rng, s); }

/* Every layer gets n random tokens at positions 0..n-1, as if prefilled; rows of varied scale so norms differ. */
static void fill_store(kvb_ctx *c, int64_t n) {
    char err[256];
    const int kvd = NKV * HD;
    float *k = malloc((size_t)n * kvd * sizeof *k), *v = malloc((size_t)n * kvd * sizeof *v);
    int32_t *pos = malloc((size_t)n * sizeof *pos);
    for (int l = 0; l < L; l++) {
        for (int64_t t = 0; t < n; t++) {
            const float ks = 0.2f + (frand(1.0f) + 1.0f), vs = 0.2f + (frand(1.0f) + 1.0f);
            for (int i = 0; i < kvd; i++) k[t * kvd + i] = ks * frand(1.0f), v[t * kvd + i] = vs * frand(1.0f);
        }
        for (int64_t i = 0; i < n; i++) pos[i] = (int32_t)i;
        CU_ASSERT_FATAL(kvc_append(c->kv, l, n, k, v, pos, NULL, err, sizeof err) == 0);
    }
    c->n_past = n;
    free(k), free(v), free(pos);
}

/* kvpress's score, in double: squared norms over their windows, combined; the sinks 1 */
static void cur_ref(const util_kv_head *h, kvb_dtype dt, int64_t n, int window, int avg, int sinks, double *score) {
    double *k2 = malloc((size_t)n * sizeof *k2), *v2 = malloc((size_t)n * sizeof *v2);
    for (int64_t j = 0; j < n; j++) {
        k2[j] = v2[j] = 0;
        for (int e = 0; e < HD; e++) {
            const double a = util_elem(h->k, dt, (size_t)(j * HD + e)), b = util_elem(h->v, dt, (size_t)(j * HD + e));
            k2[j] += a * a, v2[j] += b * b;
        }
    }
    for (int64_t w0 = 0; w0 < n; w0 += window) {
        double sk = 0, sv = 0;
        for (int64_t j = w0; j < w0 + window && j < n; j++) sk += k2[j], sv += v2[j];
        for (int64_t j = w0; j < w0 + window && j < n; j++) k2[j] /= sk, v2[j] /= sv;
    }
    double total = 0;
    for (int64_t j = 0; j < n; j++) total += score[j] = avg ? (k2[j] + v2[j]) / 2 : k2[j] * v2[j];
    for (int64_t j = 0; j < n; j++) score[j] = j < sinks ? 1.0 : score[j] / total;
    free(k2), free(v2);
}

static void check_keeps_top_leverage(kvb_dtype dt, const char *opts, int avg, int window, int64_t n, const char *budget,
                                     int64_t B) {
    char err[256];
    kvb_ctx *c = util_tiny_ctx(dt, CTX);
    kvb_method *m = util_make_method("cur", c, budget, opts);
    fill_store(c, n);
    int32_t want[L][NKV][CTX];
    int near_ties = 0;
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) {
            util_kv_head hv = util_kv_head_copy(c->kv, l, g);
            double score[CTX], margin = 1, kth = 1;
            cur_ref(&hv, dt, n, window, avg, 4, score);
            util_topk_ref(score, n, B, want[l][g], &margin, &kth);
            near_ties += B > 4 && margin < 1e-5 * kth;
            util_kv_head_free(&hv);
        }
    CU_ASSERT_EQUAL(near_ties, 0); /* the seeded rows leave no boundary a float rounding could flip */
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

static void test_keeps_top_kv_product_f32(void) { check_keeps_top_leverage(KVB_F32, NULL, 0, 16, 150, "25%", 38); }
static void test_keeps_top_kv_product_f16(void) { check_keeps_top_leverage(KVB_F16, NULL, 0, 16, 150, "50%", 75); }
static void test_kv_avg_and_window_options(void) {
    check_keeps_top_leverage(KVB_F32, "leverage=kv_avg,window=7", 1, 7, 101, "75%", 76);
}
static void test_budget_under_the_sinks_keeps_the_first_tokens(void) {
    check_keeps_top_leverage(KVB_F32, NULL, 0, 16, 64, "3", 3);
}

static void test_engine_prefill_holds_budget_decode_appends(void) {
    char err[256];
    kvb_ctx *c = util_tiny_ctx(KVB_F16, CTX);
    kvb_method *m = util_make_method("cur", c, "40", NULL);
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
            CU_ASSERT(pos[0] == 0 && pos[3] == 3); /* the sinks */
            CU_ASSERT(pos[40] == 150 && pos[43] == 153); /* the decoded tokens, after the 40 kept */
        }
    char desc[96];
    m->def->describe(m, desc, sizeof desc);
    CU_ASSERT_STRING_EQUAL(desc, "leverage=kv_product sinks=4 window=16 keep=40");
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

static void test_full_budget_keeps_everything(void) {
    char err[256];
    kvb_ctx *c = util_tiny_ctx(KVB_F32, CTX);
    kvb_method *m = util_make_method("cur", c, "100%", NULL);
    fill_store(c, 64);
    CU_ASSERT_FATAL(kvb_ctx_end_prefill(c, err, sizeof err) == 0);
    CU_ASSERT(kvb_method_verify(m, c, 1, err, sizeof err) == 0);
    int32_t pos[CTX];
    for (int l = 0; l < L; l++) CU_ASSERT_EQUAL(util_head_positions(c, l, 1, pos), 64);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

static void test_needs_and_options(void) {
    char err[256];
    kvb_method_needs nd;
    CU_ASSERT(kvb_method_needs_of("cur", NULL, &nd, err, sizeof err) == 0 && nd.needs_budget && nd.shares_prefill &&
              !nd.obs_window && !nd.prefill_scores && !nd.own_prefill && !nd.profile);
    kvb_ctx *c = util_tiny_ctx(KVB_F32, CTX);
    util_check_refusals("cur", c, "leverage=gaussian", "leverage=gaussian");
    util_check_refusals("cur", c, "window=0", "window >= 1");
    kvb_ctx_free(c);
}

static int setup(void) {
    const util_tiny_shape shape = {"cur", L, E, NH, NKV, FF, V, CTX};
    return util_tiny_setup(&shape, &rng);
}

static int teardown(void) { return util_tiny_teardown(); }

int main(void) {
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("cur", setup, teardown);
    CU_add_test(s, "keeps the top k2 v2 over windows of 16, as float64 CURPress (f32)", test_keeps_top_kv_product_f32);
    CU_add_test(s, "keeps the top k2 v2 over windows of 16, as float64 CURPress (f16)", test_keeps_top_kv_product_f16);
    CU_add_test(s, "leverage=kv_avg and window=7 as the reference", test_kv_avg_and_window_options);
    CU_add_test(s, "a budget under the sinks keeps the first tokens", test_budget_under_the_sinks_keeps_the_first_tokens);
    CU_add_test(s, "through the engine: prefill at the budget, sinks kept, decode appends", test_engine_prefill_holds_budget_decode_appends);
    CU_add_test(s, "budget 100% keeps everything", test_full_budget_keeps_everything);
    CU_add_test(s, "needs and options", test_needs_and_options);
    return util_run_suites();
}
