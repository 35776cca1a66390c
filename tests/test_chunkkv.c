/* test_chunkkv.c — ChunkKV on a tiny random model and hand-built KV states, against a float64 restatement of kvpress's
 * ChunkKVPress chunk scores over its base scorer: the base scores (knorm: -||k||; keydiff: -cos(k, mean normalized
 * key)) summed over the KV heads, averaged per chunk of L tokens (the last, partial chunk over its own tokens), and
 * the top B tokens by their chunk's score (ties to the earlier token: the best chunks whole, then the first tokens of
 * the next), the same in every KV head, on f32 and f16 stores; a prompt shorter than a chunk falls back to the base's
 * own per-head top B. Through the engine at 25/50/75% (base snapkv, kvpress's registry) the prefill ends at the
 * verified budget in whole chunks and one partial, and decode appends; budget 100% keeps everything. Device-tier
 * memory is read and written only through the backend, so the suite also runs under KVB_GUARD=1
 * (test_chunkkv_guard). */
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

static uint64_t rng = 31;

static float frand(float s) { return util_frand(&rng, s); }

/* Every layer gets n random tokens at positions 0..n-1, as if prefilled; keys share a direction, as real keys do. */
static void fill_store(kvb_ctx *c, int64_t n) {
    char err[256];
    const int kvd = NKV * HD;
    float *k = malloc((size_t)n * kvd * sizeof *k), *v = malloc((size_t)n * kvd * sizeof *v);
    int32_t *pos = malloc((size_t)n * sizeof *pos);
    for (int l = 0; l < L; l++) {
        for (int64_t i = 0; i < n * kvd; i++) k[i] = frand(1.0f) + (i % HD < 3 ? 1.5f : 0.0f), v[i] = frand(1.0f);
        for (int64_t i = 0; i < n; i++) pos[i] = (int32_t)i;
        CU_ASSERT_FATAL(kvc_append(c->kv, l, n, k, v, pos, NULL, err, sizeof err) == 0);
    }
    c->n_past = n;
    free(k), free(v), free(pos);
}

/* the base score of head g's n keys in float64: knorm -||k||, keydiff -cos(k, anchor) */
static void base_ref(const char *base, const util_kv_head *hv, kvb_dtype dt, int64_t n, double *s) {
    if (!strcmp(base, "keydiff")) {
        util_keydiff_ref(hv->k, dt, n, HD, s);
        return;
    }
    for (int64_t j = 0; j < n; j++) {
        double q = 0;
        for (int e = 0; e < HD; e++) q += util_elem(hv->k, dt, (size_t)j * HD + e) * util_elem(hv->k, dt, (size_t)j * HD + e);
        s[j] = -sqrt(q);
    }
}

static kvb_method *make(kvb_ctx *c, int64_t B, const char *opts) {
    char budget[16];
    snprintf(budget, sizeof budget, "%lld", (long long)B);
    return util_make_method("chunkkv", c, budget, opts);
}

/* n tokens, chunks of cl, B kept: every layer's KV heads keep the top B tokens by chunk mean of the head-summed base. */
static void check_chunks_match_reference(kvb_dtype dt, const char *base, int64_t n, int64_t cl, int64_t B) {
    char err[256], opts[64];
    kvb_ctx *c = util_tiny_ctx(dt, CTX);
    snprintf(opts, sizeof opts, "base=%s,chunk=%lld", base, (long long)cl);
    kvb_method *m = make(c, B, opts);
    fill_store(c, n);
    int32_t *want = malloc((size_t)L * B * sizeof *want);
    double *sum = malloc((size_t)n * sizeof *sum), *s = malloc((size_t)n * sizeof *s), *tok = malloc((size_t)n * sizeof *tok);
    int near_ties = 0;
    for (int l = 0; l < L; l++) {
        for (int64_t j = 0; j < n; j++) sum[j] = 0;
        for (int g = 0; g < NKV; g++) {
            util_kv_head hv = util_kv_head_copy(c->kv, l, g);
            base_ref(base, &hv, dt, n, s);
            for (int64_t j = 0; j < n; j++) sum[j] += s[j];
            util_kv_head_free(&hv);
        }
        for (int64_t c0 = 0; c0 < n; c0 += cl) { /* chunk mean, the partial chunk's over its own tokens */
            int64_t end = c0 + cl < n ? c0 + cl : n;
            double mean = 0;
            for (int64_t j = c0; j < end; j++) mean += sum[j] / (double)(end - c0);
            for (int64_t j = c0; j < end; j++) tok[j] = mean;
        }
        /* ties between chunks only matter across chunks: the chunk margin is the token margin at a chunk edge */
        double margin = 1;
        util_topk_ref(tok, n, B, want + (size_t)l * B, &margin, NULL);
        near_ties += margin > 0 && margin < 1e-5;
    }
    CU_ASSERT_EQUAL(near_ties, 0);
    CU_ASSERT_FATAL(kvb_ctx_end_prefill(c, err, sizeof err) == 0);
    CU_ASSERT(kvb_method_verify(m, c, 1, err, sizeof err) == 0);
    int32_t pos[CTX];
    int mismatches = 0;
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) {
            CU_ASSERT_EQUAL_FATAL(util_head_positions(c, l, g, pos), B);
            mismatches += memcmp(pos, want + (size_t)l * B, (size_t)B * sizeof *pos) != 0;
        }
    CU_ASSERT_EQUAL(mismatches, 0);
    free(want), free(sum), free(s), free(tok);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

/* 130 tokens: 6 chunks of 20 and a partial chunk of 10; 47 kept = 2 chunks and 7 tokens of a third */
static void test_knorm_chunks_f32(void) { check_chunks_match_reference(KVB_F32, "knorm", 130, 20, 47); }
static void test_knorm_chunks_f16(void) { check_chunks_match_reference(KVB_F16, "knorm", 130, 20, 47); }
/* 100 tokens in chunks of 16 (a partial chunk of 4), 50 kept */
static void test_keydiff_chunks(void) { check_chunks_match_reference(KVB_F32, "keydiff", 100, 16, 50); }
/* chunk 1: every token its own chunk, the base's head-summed top B */
static void test_chunk_of_one_is_the_head_sum(void) { check_chunks_match_reference(KVB_F16, "knorm", 90, 1, 30); }

/* A prompt shorter than one chunk: each KV head keeps the base's own top B (kvpress: the base press compresses). */
static void test_short_prompt_falls_back_to_the_base(void) {
    char err[256];
    enum { N = 15, B = 5 };
    kvb_ctx *c = util_tiny_ctx(KVB_F32, CTX);
    kvb_method *m = make(c, B, "base=knorm");
    fill_store(c, N);
    int32_t want[L][NKV][B];
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) {
            util_kv_head hv = util_kv_head_copy(c->kv, l, g);
            double s[N];
            base_ref("knorm", &hv, KVB_F32, N, s);
            util_topk_ref(s, N, B, want[l][g], NULL, NULL);
            util_kv_head_free(&hv);
        }
    CU_ASSERT_FATAL(kvb_ctx_end_prefill(c, err, sizeof err) == 0);
    int32_t pos[CTX];
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++)
            CU_ASSERT(util_head_positions(c, l, g, pos) == B && !memcmp(pos, want[l][g], sizeof want[l][g]));
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

/* The kept positions (sorted, the prompt's n tokens) are whole chunks of cl and the first tokens of at most one more. */
static int whole_chunks(const int32_t *pos, int64_t kept, int64_t n, int64_t cl) {
    int partial = 0;
    for (int64_t c0 = 0; c0 < n; c0 += cl) {
        int64_t end = c0 + cl < n ? c0 + cl : n, have = 0, first = 1;
        for (int64_t i = 0; i < kept; i++)
            if (pos[i] >= c0 && pos[i] < end) first &= pos[i] == c0 + have, have++;
        if (have && have < end - c0) {
            if (!first || partial++) return 0;
        }
    }
    return 1;
}

/* Through the engine at 25/50/75% with kvpress's base (snapkv): the prefill ends at the budget in whole chunks (and
 * one partial), the observation window's chunks among them, and each decode step appends one token. */
static void test_engine_budgets_hold_in_chunks(void) {
    char err[256];
    const char *budgets[] = {"25%", "50%", "75%"};
    const int64_t keeps[] = {38, 75, 113}; /* of 150, rounded */
    int32_t ids[150];
    for (int i = 0; i < 150; i++) ids[i] = 3 + (i * 37) % 290;
    for (int b = 0; b < 3; b++) {
        kvb_ctx *c = util_tiny_ctx(KVB_F16, CTX);
        kvb_method *m = util_make_method("chunkkv", c, budgets[b], NULL);
        CU_ASSERT_FATAL(kvb_method_prefill(m, c, ids, 150, err, sizeof err) == 0);
        for (int s = 0; s < 3; s++) {
            int32_t id = 9 + s;
            CU_ASSERT_FATAL(kvb_forward(c, &id, 1, err, sizeof err) == 0);
            CU_ASSERT(kvb_method_verify(m, c, 0, err, sizeof err) == 0);
        }
        int32_t pos[CTX], first = -1;
        int same = 1;
        for (int l = 0; l < L; l++)
            for (int g = 0; g < NKV; g++) {
                CU_ASSERT_EQUAL_FATAL(util_head_positions(c, l, g, pos), keeps[b] + 3);
                CU_ASSERT(whole_chunks(pos, keeps[b], 150, 20));
                CU_ASSERT(pos[keeps[b] - 1] == 149 && pos[keeps[b]] == 150); /* the window's last chunk; decode */
                if (g == 0) first = pos[0];
                else same &= pos[0] == first; /* the same chunks in every KV head of a layer */
            }
        CU_ASSERT(same);
        char desc[64], want[64];
        m->def->describe(m, desc, sizeof desc);
        snprintf(want, sizeof want, "base=snapkv chunk=20 keep=%lld", (long long)keeps[b]);
        CU_ASSERT_STRING_EQUAL(desc, want);
        kvb_method_free(m, c);
        kvb_ctx_free(c);
    }
}

static void test_full_budget_keeps_everything(void) {
    char err[256];
    kvb_ctx *c = util_tiny_ctx(KVB_F32, CTX);
    kvb_method *m = util_make_method("chunkkv", c, "100%", "base=knorm");
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
    CU_ASSERT(kvb_method_needs_of("chunkkv", NULL, &nd, err, sizeof err) == 0 && nd.needs_budget && nd.shares_prefill &&
              nd.obs_window == 32 && !nd.prefill_scores && !nd.own_prefill && !nd.profile);
    const char *opts[] = {"base=knorm", "base=keydiff", "base=expected,window=8", "base=snapkv,window=16"};
    const int rows[] = {0, 0, 8, 16};
    for (int i = 0; i < 4; i++) {
        kvb_opts o = {0};
        CU_ASSERT_FATAL(kvb_opts_add(&o, opts[i], err, sizeof err) == 0);
        CU_ASSERT(kvb_method_needs_of("chunkkv", &o, &nd, err, sizeof err) == 0 && nd.obs_window == rows[i]);
    }
    kvb_ctx *c = util_tiny_ctx(KVB_F32, CTX);
    util_check_refusals("chunkkv", c, "base=h2o", "base must be");
    util_check_refusals("chunkkv", c, "chunk=0", "chunk must be in");
    util_check_refusals("chunkkv", c, "kernel=3,base=knorm", "no option 'kernel'");
    kvb_ctx_free(c);
}

static int setup(void) {
    const util_tiny_shape shape = {"chunkkv", L, E, NH, NKV, FF, V, CTX};
    return util_tiny_setup(&shape, &rng);
}

static int teardown(void) { return util_tiny_teardown(); }

int main(void) {
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("chunkkv", setup, teardown);
    CU_add_test(s, "knorm base: top B by float64 chunk mean, the same in every head (f32)", test_knorm_chunks_f32);
    CU_add_test(s, "knorm base: top B by float64 chunk mean, the same in every head (f16)", test_knorm_chunks_f16);
    CU_add_test(s, "keydiff base, chunks of 16 with a partial one", test_keydiff_chunks);
    CU_add_test(s, "chunks of one token: the head-summed base", test_chunk_of_one_is_the_head_sum);
    CU_add_test(s, "a prompt shorter than a chunk: the base's own per-head top B", test_short_prompt_falls_back_to_the_base);
    CU_add_test(s, "through the engine at 25/50/75% (snapkv): whole chunks at the budget, decode appends",
                test_engine_budgets_hold_in_chunks);
    CU_add_test(s, "budget 100% keeps everything", test_full_budget_keeps_everything);
    CU_add_test(s, "needs and options", test_needs_and_options);
    return util_run_suites();
}
