/* test_decoding.c — compression while decoding (kvpress's DecodingPress) on a tiny random model: a 2K-token greedy
 * generation with SnapKV every 128 steps down to 1024 tokens holds at most 1024 + 128 tokens per layer and KV head
 * at every step, its claim verified at every step, and its tokens' agreement with full attention's printed; a
 * decode compression keeps, per layer and KV head, the top `target` of the whole cache (prompt and generated slots)
 * by a float64 restatement of the scorer (knorm: -||k||; keydiff: -cos(k, mean normalized key)); SnapKV's keeps
 * its window; the prompt is cut by the scorer at the budget; between compressions decode appends; options. Device
 * memory is touched only through the backend (test_decoding_guard). */
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

enum { L = 4, NH = 4, NKV = 2, HD = 16, E = NH * HD, FF = 48, V = 300, CTX = 2560 };

static uint64_t rng = 11;

static float frand(float s) { return util_frand(&rng, s); }

static kvb_ctx *new_ctx(kvb_dtype dt) { return util_tiny_ctx(dt, CTX); }

static kvb_method *make(kvb_ctx *c, const char *budget, const char *opts) {
    return util_make_method("decoding", c, budget, opts);
}

/* Append tokens from..to-1 to every layer (positions = from..), random keys with a common direction. */
static void append_tokens(kvb_ctx *c, int64_t from, int64_t to) {
    char err[256];
    const int kvd = NKV * HD;
    int64_t n = to - from;
    float *k = malloc((size_t)n * kvd * sizeof *k), *v = malloc((size_t)n * kvd * sizeof *v);
    int32_t *pos = malloc((size_t)n * sizeof *pos);
    for (int l = 0; l < L; l++) {
        for (int64_t i = 0; i < n * kvd; i++) k[i] = frand(1.0f) + (i % HD < 3 ? 1.5f : 0.0f), v[i] = frand(1.0f);
        for (int64_t i = 0; i < n; i++) pos[i] = (int32_t)(from + i);
        CU_ASSERT_FATAL(kvc_append(c->kv, l, n, k, v, pos, NULL, err, sizeof err) == 0);
    }
    free(k), free(v), free(pos);
}

static void knorm_ref(const void *k, kvb_dtype dt, int64_t n, double *score) {
    for (int64_t j = 0; j < n; j++) {
        double s = 0;
        for (int e = 0; e < HD; e++) s += util_elem(k, dt, (size_t)j * HD + e) * util_elem(k, dt, (size_t)j * HD + e);
        score[j] = -sqrt(s);
    }
}

/* A prompt of N (kept whole at 100%), then a decode chunk of `interval` tokens reaching the interval: in pre_attend
 * every layer and head is cut to `target`, the top of the whole cache by the float64 score; the claim holds. */
static void check_decode_cut(kvb_dtype dt, const char *base, int keydiff) {
    char err[256], opts[96];
    enum { N = 140, STEP = 20, T = 50 };
    kvb_ctx *c = new_ctx(dt);
    snprintf(opts, sizeof opts, "base=%s,interval=%d,target=%d", base, STEP, T);
    kvb_method *m = make(c, "100%", opts);
    append_tokens(c, 0, N);
    c->n_past = N;
    CU_ASSERT_FATAL(kvb_ctx_end_prefill(c, err, sizeof err) == 0);
    CU_ASSERT(kvb_method_verify(m, c, 1, err, sizeof err) == 0);
    append_tokens(c, N, N + STEP); /* the chunk's K/V are in the store when pre_attend runs */
    for (int i = 0; i < STEP; i++) c->pos[i] = N + i;
    int32_t want[L][NKV][T];
    int near_ties = 0;
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) {
            util_kv_head hv = util_kv_head_copy(c->kv, l, g);
            double score[N + STEP], margin = 1;
            if (keydiff) util_keydiff_ref(hv.k, dt, N + STEP, HD, score);
            else knorm_ref(hv.k, dt, N + STEP, score);
            util_topk_ref(score, N + STEP, T, want[l][g], &margin, NULL);
            near_ties += margin < 1e-5;
            util_kv_head_free(&hv);
        }
    CU_ASSERT_EQUAL(near_ties, 0);
    for (int l = 0; l < L; l++) CU_ASSERT_FATAL(m->hooks.pre_attend(m, c, l, NULL, STEP, err, sizeof err) == 0);
    c->n_past = N + STEP;
    CU_ASSERT(kvb_method_verify(m, c, 0, err, sizeof err) == 0);
    int32_t pos[CTX];
    int mismatches = 0;
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) {
            CU_ASSERT_EQUAL_FATAL(util_head_positions(c, l, g, pos), T);
            mismatches += memcmp(pos, want[l][g], sizeof want[l][g]) != 0;
        }
    CU_ASSERT_EQUAL(mismatches, 0);
    /* the next chunk short of the interval appends without a cut */
    append_tokens(c, N + STEP, N + STEP + 5);
    for (int i = 0; i < 5; i++) c->pos[i] = N + STEP + i;
    for (int l = 0; l < L; l++) CU_ASSERT_FATAL(m->hooks.pre_attend(m, c, l, NULL, 5, err, sizeof err) == 0);
    c->n_past = N + STEP + 5;
    CU_ASSERT(kvb_method_verify(m, c, 0, err, sizeof err) == 0);
    CU_ASSERT_EQUAL(util_head_positions(c, 1, 1, pos), T + 5);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

static void test_decode_cut_knorm_f32(void) { check_decode_cut(KVB_F32, "knorm", 0); }
static void test_decode_cut_knorm_f16(void) { check_decode_cut(KVB_F16, "knorm", 0); }
static void test_decode_cut_keydiff_f32(void) { check_decode_cut(KVB_F32, "keydiff", 1); }
static void test_decode_cut_keydiff_f16(void) { check_decode_cut(KVB_F16, "keydiff", 1); }

static int32_t argmax(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Greedy generation of n_gen tokens after a prompt; with a method, the most tokens any layer and head holds after
 * every step must stay <= cap and its claim must verify. Returns the tokens (caller frees); *peak, *cuts. */
static int32_t *generate(kvb_method *(*mk)(kvb_ctx *), const int32_t *prompt, int n_prompt, int n_gen, int64_t cap,
                         int64_t *peak, int *bad_steps) {
    char err[256];
    kvb_ctx *c = new_ctx(KVB_F16);
    kvb_method *m = mk ? mk(c) : NULL;
    int32_t *out = malloc((size_t)n_gen * sizeof *out);
    CU_ASSERT_FATAL(kvb_method_prefill(m, c, prompt, n_prompt, err, sizeof err) == 0);
    *peak = 0, *bad_steps = 0;
    for (int s = 0; s < n_gen; s++) {
        out[s] = argmax(c->logits, V);
        if (s + 1 == n_gen) break;
        int rc = kvb_forward(c, &out[s], 1, err, sizeof err);
        if (rc) fprintf(stderr, "\n  step %d: %s\n", s, err);
        CU_ASSERT_FATAL(rc == 0);
        if (!m) continue;
        int64_t most = 0;
        for (int l = 0; l < L; l++)
            for (int g = 0; g < NKV; g++)
                if (kvc_n(c->kv, l, g) > most) most = kvc_n(c->kv, l, g);
        if (most > *peak) *peak = most;
        *bad_steps += most > cap || kvb_method_verify(m, c, 0, err, sizeof err) != 0;
    }
    if (m) {
        char desc[160];
        m->def->describe(m, desc, sizeof desc);
        printf("\n    decoding: %s, peak %lld tokens per layer and head", desc, (long long)*peak);
    }
    kvb_method_free(m, c);
    kvb_ctx_free(c);
    return out;
}

static kvb_method *snap_128_1024(kvb_ctx *c) { return make(c, "100%", "base=snapkv,interval=128,target=1024"); }

/* The must-show on the tiny model: 2K generated tokens, SnapKV every 128 steps to 1024 tokens. */
static void test_2k_generation_holds_target_plus_interval(void) {
    enum { NP = 200, NG = 2048 };
    int32_t prompt[NP];
    for (int i = 0; i < NP; i++) prompt[i] = 3 + (i * 37) % 290;
    int64_t peak = 0, peak_full = 0;
    int bad = 0, bad_full = 0;
    int32_t *dec = generate(snap_128_1024, prompt, NP, NG, 1024 + 128, &peak, &bad);
    int32_t *full = generate(NULL, prompt, NP, NG, 0, &peak_full, &bad_full);
    CU_ASSERT_EQUAL(bad, 0);            /* <= 1152 tokens and the claim at every step */
    CU_ASSERT(peak == 1024 + 128 - 1);  /* after a step: target + interval - 1 (the cut comes before attention) */
    int same = 0, first_diff = -1;
    for (int i = 0; i < NG; i++) {
        same += dec[i] == full[i];
        if (dec[i] != full[i] && first_diff < 0) first_diff = i;
    }
    printf("\n    2048 greedy tokens: %d same as full attention's (%.1f%%), first difference at token %d ", same,
           100.0 * same / NG, first_diff);
    CU_ASSERT(first_diff < 0 || first_diff >= 1024 - NP); /* identical while nothing was cut */
    free(dec), free(full);
}

/* The prompt is cut by the scorer at the budget (SnapKV's window kept), decode appends until the interval. */
static void test_prompt_cut_at_budget_snapkv_window(void) {
    char err[256];
    kvb_ctx *c = new_ctx(KVB_F32);
    kvb_method *m = make(c, "60", "base=snapkv,interval=64,target=100,window=8");
    int32_t ids[150];
    for (int i = 0; i < 150; i++) ids[i] = 3 + (i * 37) % 290;
    CU_ASSERT_FATAL(kvb_method_prefill(m, c, ids, 150, err, sizeof err) == 0);
    int32_t pos[CTX];
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) {
            CU_ASSERT_EQUAL_FATAL(util_head_positions(c, l, g, pos), 60);
            CU_ASSERT(pos[52] == 142 && pos[59] == 149); /* the window */
        }
    for (int s = 0; s < 70; s++) {
        int32_t id = 9 + s % 200;
        CU_ASSERT_FATAL(kvb_forward(c, &id, 1, err, sizeof err) == 0);
        CU_ASSERT(kvb_method_verify(m, c, 0, err, sizeof err) == 0);
        int64_t n = util_head_positions(c, 2, 1, pos);
        CU_ASSERT_EQUAL(n, s + 1 < 64 ? 60 + s + 1 : 100 + (s + 1 - 64));
        if (s + 1 == 64) CU_ASSERT(pos[92] == 150 + 56 && pos[99] == 150 + 63); /* the window: the last 8 queries' keys */
    }
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

static void test_needs_and_options(void) {
    char err[256];
    kvb_method_needs nd;
    CU_ASSERT(kvb_method_needs_of("decoding", NULL, &nd, err, sizeof err) == 0 && nd.needs_budget && nd.shares_prefill &&
              nd.obs_window == 32 && !nd.prefill_scores && !nd.own_prefill);
    kvb_opts kn = {0};
    CU_ASSERT_FATAL(kvb_opts_add(&kn, "base=knorm", err, sizeof err) == 0);
    CU_ASSERT(kvb_method_needs_of("decoding", &kn, &nd, err, sizeof err) == 0 && nd.obs_window == 0);
    kvb_ctx *c = new_ctx(KVB_F32);
    kvb_budget b = {KVB_BUDGET_FRACTION, 0.3, 0};
    const char *bad[][2] = {{"base=h2o", "base must be"}, {"interval=0", "interval"}, {"target=0", "target"},
                            {"base=knorm,window=8", "no option 'window'"}, {"kernel=4", "kernel"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        kvb_opts o = {0};
        CU_ASSERT_FATAL(kvb_opts_add(&o, bad[i][0], err, sizeof err) == 0);
        err[0] = 0;
        CU_ASSERT(kvb_method_create("decoding", c, &b, &o, err, sizeof err) == NULL && strstr(err, bad[i][1]));
    }
    kvb_opts o = {0};
    kvb_method *m = kvb_method_create("decoding", c, &b, &o, err, sizeof err);
    CU_ASSERT_FATAL(m != NULL);
    char desc[160];
    m->def->describe(m, desc, sizeof desc);
    CU_ASSERT(strstr(desc, "base=snapkv interval=512 target=2048") == desc); /* kvpress's defaults */
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

static int setup(void) {
    const util_tiny_shape shape = {"decoding", L, E, NH, NKV, FF, V, CTX};
    return util_tiny_setup(&shape, &rng);
}

static int teardown(void) { return util_tiny_teardown(); }

int main(void) {
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("decoding", setup, teardown);
    CU_add_test(s, "a decode cut keeps the top target of the cache by float64 -||k|| (knorm, f32)", test_decode_cut_knorm_f32);
    CU_add_test(s, "a decode cut keeps the top target of the cache by float64 -||k|| (knorm, f16)", test_decode_cut_knorm_f16);
    CU_add_test(s, "a decode cut keeps the top target of the cache by float64 -cos (keydiff, f32)", test_decode_cut_keydiff_f32);
    CU_add_test(s, "a decode cut keeps the top target of the cache by float64 -cos (keydiff, f16)", test_decode_cut_keydiff_f16);
    CU_add_test(s, "the prompt cut at the budget with SnapKV's window, decode appends until the interval", test_prompt_cut_at_budget_snapkv_window);
    CU_add_test(s, "2K tokens, SnapKV every 128 steps to 1024: <= 1152 per layer at every step, agreement printed", test_2k_generation_holds_target_plus_interval);
    CU_add_test(s, "needs and options", test_needs_and_options);
    return util_run_suites();
}
