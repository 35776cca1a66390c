/* test_observed.c — ObservedAttention on a tiny random model, against a float64 restatement of kvpress's
 * ObservedAttentionPress: per KV head, score_j = mean over the group's heads of the attention the prompt's queries
 * gave key j, divided by the n - j queries that could see it; the top B kept (ties to the earlier token), on f32 and
 * f16 stores, with the probabilities observed chunk by chunk as a chunked prefill hands them over; the set differs
 * from the undivided (H2O) sum; through the engine the prefill ends at the budget and decode appends; budget 100%
 * keeps everything. Device-tier memory is touched only through the backend (test_observed_guard). */
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

static kvb_method *make(kvb_ctx *c, const char *budget) { return util_make_method("observed", c, budget, NULL); }

/* Append tokens from..to-1 (positions = slots) to every layer, random K/V. */
static void append_tokens(kvb_ctx *c, int64_t from, int64_t to) {
    char err[256];
    const int kvd = NKV * HD;
    int64_t n = to - from;
    float *k = malloc((size_t)n * kvd * sizeof *k), *v = malloc((size_t)n * kvd * sizeof *v);
    int32_t *pos = malloc((size_t)n * sizeof *pos);
    for (int l = 0; l < L; l++) {
        for (int64_t i = 0; i < n * kvd; i++) k[i] = frand(1.0f), v[i] = frand(1.0f);
        for (int64_t i = 0; i < n; i++) pos[i] = (int32_t)(from + i);
        CU_ASSERT_FATAL(kvc_append(c->kv, l, n, k, v, pos, NULL, err, sizeof err) == 0);
    }
    c->n_past = to;
    free(k), free(v), free(pos);
}

/* Causal attention rows of queries from..to-1 over slots 0..to-1 for every head, as the engine hands them to
 * observe ([NH][n_q][stride = to]): positive, summing to 1, with a few heavy keys per head so scores spread. */
static float *causal_probs(int64_t from, int64_t to) {
    int64_t nq = to - from;
    float *p = calloc((size_t)NH * nq * to, sizeof *p);
    for (int h = 0; h < NH; h++)
        for (int64_t t = 0; t < nq; t++) {
            float *row = p + ((size_t)h * nq + t) * to;
            int64_t i = from + t;
            double sum = 0;
            for (int64_t j = 0; j <= i; j++) {
                float x = 0.05f + fabsf(frand(1.0f)) + ((j * 7 + h) % 11 == 0 ? 3.0f : 0.0f);
                row[j] = x, sum += x;
            }
            for (int64_t j = 0; j <= i; j++) row[j] = (float)(row[j] / sum);
        }
    return p;
}

/* kvpress's ObservedAttentionPress score in float64 for KV head g: mean over the group's heads of the attention
 * every query gave key j, divided by the n - j queries that could see it; probs given as chunks */
static void observed_ref(float *const *chunk, const int64_t *bounds, int n_chunks, int g, int64_t n, double *score) {
    const int G = NH / NKV;
    for (int64_t j = 0; j < n; j++) score[j] = 0;
    for (int k = 0; k < n_chunks; k++) {
        int64_t from = bounds[k], to = bounds[k + 1], nq = to - from;
        for (int r = 0; r < G; r++)
            for (int64_t t = 0; t < nq; t++)
                for (int64_t j = 0; j < to; j++) score[j] += chunk[k][((size_t)(g * G + r) * nq + t) * to + j];
    }
    for (int64_t j = 0; j < n; j++) score[j] /= (double)G * (double)(n - j);
}

/* Prefill in chunks through the sum_rows hook (the slots grow chunk by chunk, as in a chunked prefill), then the
 * kept set of every layer and KV head against the float64 restatement. */
static void check_keeps_most_attended(kvb_dtype dt, const char *budget, int64_t B) {
    char err[256];
    kvb_ctx *c = new_ctx(dt);
    enum { N = 150, MAXB = 150 };
    kvb_method *m = make(c, budget);
    const int64_t bounds[] = {0, 64, 128, N};
    const int n_chunks = 3;
    float *chunk[3];
    kvb_src src[NKV];
    for (int k = 0; k < n_chunks; k++) {
        append_tokens(c, bounds[k], bounds[k + 1]);
        chunk[k] = causal_probs(bounds[k], bounds[k + 1]);
        const int64_t nq = bounds[k + 1] - bounds[k];
        for (int l = 0; l < L; l++) {
            kvb_src_from_store(c, l, src);
            float *rows[NKV];
            CU_ASSERT_FATAL(m->hooks.sum_rows(m, c, l, src, nq, rows, err, sizeof err) == 1);
            /* what the engine adds to them (attention_colsum): each group's column sums of the chunk's rows */
            for (int g = 0; g < NKV; g++)
                CU_ASSERT_FATAL(c->be->probs_reduce(c->be, rows[g], src[g].n, chunk[k] + (int64_t)g * (NH / NKV) * nq * bounds[k + 1],
                                                    bounds[k + 1], NH / NKV, 1, nq, src[g].n, NULL, KVB_REDUCE_GROUP_SUM, 1,
                                                    err, sizeof err) == 0);
        }
    }
    int32_t want[NKV][MAXB];
    int near_ties = 0;
    for (int g = 0; g < NKV; g++) {
        double score[N], margin = 1;
        observed_ref(chunk, bounds, n_chunks, g, N, score);
        double kth;
        util_topk_ref(score, N, B, want[g], &margin, &kth);
        margin /= kth;
        near_ties += B < N && margin < 1e-5;
    }
    CU_ASSERT_EQUAL(near_ties, 0); /* the seeded rows leave no boundary a float rounding could flip */
    CU_ASSERT_FATAL(kvb_ctx_end_prefill(c, err, sizeof err) == 0);
    CU_ASSERT(kvb_method_verify(m, c, 1, err, sizeof err) == 0);
    int32_t pos[CTX];
    int mismatches = 0;
    for (int l = 0; l < L; l++) /* every layer saw the same rows: the same kept set */
        for (int g = 0; g < NKV; g++) {
            CU_ASSERT_EQUAL_FATAL(util_head_positions(c, l, g, pos), B);
            mismatches += memcmp(pos, want[g], (size_t)B * sizeof *pos) != 0;
        }
    CU_ASSERT_EQUAL(mismatches, 0);
    /* not H2O: the plain sum favours early keys (more voters); dividing by the voters must change the set */
    if (B < N) {
        double sum[N];
        int32_t h2o[MAXB];
        double margin;
        observed_ref(chunk, bounds, n_chunks, 0, N, sum);
        for (int64_t j = 0; j < N; j++) sum[j] *= (double)(N - j);
        double kth2;
        util_topk_ref(sum, N, B, h2o, &margin, &kth2);
        margin /= kth2;
        CU_ASSERT(memcmp(h2o, want[0], (size_t)B * sizeof *h2o) != 0);
    }
    for (int k = 0; k < n_chunks; k++) free(chunk[k]);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

static void test_keeps_most_attended_per_voter_f32(void) { check_keeps_most_attended(KVB_F32, "25%", 38); }
static void test_keeps_most_attended_per_voter_f16(void) { check_keeps_most_attended(KVB_F16, "30", 30); }
static void test_full_budget_keeps_everything(void) { check_keeps_most_attended(KVB_F32, "100%", 150); }

/* Through the engine: the prefill's own attention is observed, the prefill ends at the budget (verified), decode
 * appends and asks for no probabilities. */
static void test_engine_prefill_holds_budget_decode_appends(void) {
    char err[256];
    kvb_ctx *c = new_ctx(KVB_F16);
    kvb_method *m = make(c, "40");
    int32_t ids[150];
    for (int i = 0; i < 150; i++) ids[i] = 3 + (i * 37) % 290;
    CU_ASSERT_FATAL(kvb_method_prefill(m, c, ids, 150, err, sizeof err) == 0);
    kvb_src src[NKV];
    float *rows[NKV];
    kvb_src_from_store(c, 0, src);
    CU_ASSERT(m->hooks.wants_probs == NULL && m->hooks.sum_rows(m, c, 0, src, 1, rows, err, sizeof err) == 0);
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

/* Through the engine both ways a prefill's column sums are taken: the probabilities written and reduced (small
 * calls, the default) and attention_colsum from the lse (KVB_COLSUM_MIB=0, what a long prompt takes): the same kept
 * slots in every layer and KV head. */
static void test_column_sums_from_the_lse_keep_what_the_written_probabilities_keep(void) {
    char err[256];
    int32_t ids[150], pos[2][L][NKV][CTX];
    int64_t n[2][L][NKV];
    for (int i = 0; i < 150; i++) ids[i] = 3 + (i * 37) % 290;
    for (int way = 0; way < 2; way++) {
        if (way) setenv("KVB_COLSUM_MIB", "0", 1);
        kvb_ctx *c = new_ctx(KVB_F16);
        c->params.n_batch = 64; /* three chunks: sums accumulated chunk after chunk */
        kvb_method *m = make(c, "40");
        CU_ASSERT_FATAL(kvb_method_prefill(m, c, ids, 150, err, sizeof err) == 0);
        for (int l = 0; l < L; l++)
            for (int g = 0; g < NKV; g++) n[way][l][g] = util_head_positions(c, l, g, pos[way][l][g]);
        kvb_method_free(m, c);
        kvb_ctx_free(c);
        unsetenv("KVB_COLSUM_MIB");
    }
    int same = 1;
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++)
            same &= n[0][l][g] == 40 && n[1][l][g] == 40 && !memcmp(pos[0][l][g], pos[1][l][g], 40 * sizeof(int32_t));
    CU_ASSERT(same);
}

static void test_needs_and_options(void) {
    char err[256];
    kvb_method_needs nd;
    CU_ASSERT(kvb_method_needs_of("observed", NULL, &nd, err, sizeof err) == 0 && nd.needs_budget &&
              nd.shares_prefill && nd.prefill_scores && !nd.obs_window && !nd.own_prefill && !nd.profile);
    kvb_ctx *c = new_ctx(KVB_F32);
    util_check_refusals("observed", c, "window=4", "no option 'window'");
    kvb_ctx_free(c);
}

static int setup(void) {
    const util_tiny_shape shape = {"observed", L, E, NH, NKV, FF, V, CTX};
    return util_tiny_setup(&shape, &rng);
}

static int teardown(void) { return util_tiny_teardown(); }

int main(void) {
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("observed", setup, teardown);
    CU_add_test(s, "column sums from the lse keep what the written probabilities keep",
                test_column_sums_from_the_lse_keep_what_the_written_probabilities_keep);
    CU_add_test(s, "keeps the keys most attended per voting query, as float64 kvpress (f32, chunked)", test_keeps_most_attended_per_voter_f32);
    CU_add_test(s, "keeps the keys most attended per voting query, as float64 kvpress (f16, tokens)", test_keeps_most_attended_per_voter_f16);
    CU_add_test(s, "budget 100% keeps everything", test_full_budget_keeps_everything);
    CU_add_test(s, "through the engine: prefill at the budget, decode appends without probabilities", test_engine_prefill_holds_budget_decode_appends);
    CU_add_test(s, "needs and options", test_needs_and_options);
    return util_run_suites();
}
