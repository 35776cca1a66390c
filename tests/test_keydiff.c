/* test_keydiff.c — KeyDiff on a tiny random model and hand-built KV states, against a float64 restatement of
 * kvpress's KeyDiffPress: per layer and KV head, anchor = mean_j k_j / ||k_j||, score_j = -cos(k_j, anchor), the
 * top B by score kept (ties to the earlier token), on f32 and f16 stores; a zero key scores 0; through the engine
 * the prefill ends at the budget and decode appends; budget 100% keeps everything. Device-tier memory is read and
 * written only through the backend, so the suite also runs under KVB_GUARD=1 (test_keydiff_guard). */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util_common.h"
#include "util_gguf_writer.h"
#include "util_method.h"
#include "engine/model.h"
#include "methods/method.h"

enum { L = 4, NH = 4, NKV = 2, HD = 16, E = NH * HD, FF = 48, V = 300, CTX = 512 };

static uint64_t rng = 11;

static float frand(float s) { return util_frand(&rng, s); }

static kvb_ctx *new_ctx(kvb_dtype dt) { return util_tiny_ctx(dt, CTX); }

static kvb_method *make(kvb_ctx *c, const char *budget) { return util_make_method("keydiff", c, budget, NULL); }

/* Every layer gets n random tokens at positions 0..n-1, as if prefilled; keys get a common direction (as real
 * keys have) so the anchor is not noise; key `zero` (if >= 0) is all zeros. */
static void fill_store(kvb_ctx *c, int64_t n, int64_t zero) {
    char err[256];
    const int kvd = NKV * HD;
    float *k = malloc((size_t)n * kvd * sizeof *k), *v = malloc((size_t)n * kvd * sizeof *v);
    int32_t *pos = malloc((size_t)n * sizeof *pos);
    for (int l = 0; l < L; l++) {
        for (int64_t i = 0; i < n * kvd; i++) k[i] = frand(1.0f) + (i % HD < 3 ? 1.5f : 0.0f), v[i] = frand(1.0f);
        if (zero >= 0) memset(k + zero * kvd, 0, (size_t)kvd * sizeof *k);
        for (int64_t i = 0; i < n; i++) pos[i] = (int32_t)i;
        CU_ASSERT_FATAL(kvc_append(c->kv, l, n, k, v, pos, NULL, err, sizeof err) == 0);
    }
    c->n_past = n;
    free(k), free(v), free(pos);
}

static void check_keeps_least_like_the_mean(kvb_dtype dt, int64_t zero) {
    char err[256];
    kvb_ctx *c = new_ctx(dt);
    enum { N = 120, B = 30 };
    kvb_method *m = make(c, "25%");
    fill_store(c, N, zero);
    int32_t want[L][NKV][B];
    int near_ties = 0;
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) {
            util_kv_head hv = util_kv_head_copy(c->kv, l, g);
            double score[N], margin = 1;
            util_keydiff_ref(hv.k, dt, N, HD, score);
            util_topk_ref(score, N, B, want[l][g], &margin, NULL);
            near_ties += margin < 1e-5;
            if (zero >= 0) { /* scored 0 (F.normalize's epsilon), above the keys like the mean: kept */
                CU_ASSERT(score[zero] == 0);
                int kept = 0;
                for (int i = 0; i < B; i++) kept |= want[l][g][i] == zero;
                CU_ASSERT(kept);
            }
            util_kv_head_free(&hv);
        }
    CU_ASSERT_EQUAL(near_ties, 0); /* the seeded keys leave no boundary a float rounding could flip */
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
}

static void test_keeps_least_like_the_mean_f32(void) { check_keeps_least_like_the_mean(KVB_F32, -1); }
static void test_keeps_least_like_the_mean_f16(void) { check_keeps_least_like_the_mean(KVB_F16, -1); }
static void test_zero_key_scores_zero(void) { check_keeps_least_like_the_mean(KVB_F32, 17); }

/* Through the engine: the prefill ends at the budget (verified), each decode step appends one token. */
static void test_engine_prefill_holds_budget_decode_appends(void) {
    char err[256];
    kvb_ctx *c = new_ctx(KVB_F16);
    kvb_method *m = make(c, "40");
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
            CU_ASSERT(pos[40] == 150 && pos[43] == 153); /* the decoded tokens, after the 40 kept */
        }
    char desc[64];
    m->def->describe(m, desc, sizeof desc);
    CU_ASSERT_STRING_EQUAL(desc, "keep=40");
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

static void test_full_budget_keeps_everything(void) {
    char err[256];
    kvb_ctx *c = new_ctx(KVB_F32);
    kvb_method *m = make(c, "100%");
    fill_store(c, 64, -1);
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
    CU_ASSERT(kvb_method_needs_of("keydiff", NULL, &nd, err, sizeof err) == 0 && nd.needs_budget && nd.shares_prefill &&
              !nd.obs_window && !nd.prefill_scores && !nd.own_prefill && !nd.profile);
    kvb_ctx *c = new_ctx(KVB_F32);
    util_check_refusals("keydiff", c, "window=4", "no option 'window'");
    kvb_ctx_free(c);
}

static int setup(void) {
    const util_tiny_shape shape = {"keydiff", L, E, NH, NKV, FF, V, CTX};
    return util_tiny_setup(&shape, &rng);
}

static int teardown(void) { return util_tiny_teardown(); }

int main(void) {
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("keydiff", setup, teardown);
    CU_add_test(s, "keeps the keys least like the mean key, as float64 -cos (f32)", test_keeps_least_like_the_mean_f32);
    CU_add_test(s, "keeps the keys least like the mean key, as float64 -cos (f16)", test_keeps_least_like_the_mean_f16);
    CU_add_test(s, "a zero key scores 0 and is kept, as the reference keeps it", test_zero_key_scores_zero);
    CU_add_test(s, "through the engine: prefill at the budget, decode appends", test_engine_prefill_holds_budget_decode_appends);
    CU_add_test(s, "budget 100% keeps everything", test_full_budget_keeps_everything);
    CU_add_test(s, "needs and options", test_needs_and_options);
    return util_run_suites();
}
