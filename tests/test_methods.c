/* test_methods.c — each KV-cache method on a tiny random model and on hand-built KV states where the right
 * kept set is known or recomputed here in float64: StreamingLLM's sinks + window, H2O's heavy hitters after
 * known probabilities, SnapKV's window scores + max pooling + top-k, OmniKV's selection and its propagation to
 * the right layers, Round Attention's round choice under each strategy, PoD's gate and merge, the random
 * control's kept set (budget, sinks, window, seeded, uniform). Also: what each method needs from a session,
 * a shared prefill (fork + adopt) gives exactly what each method's own prefill gives, and bad budgets,
 * options and missing profiles are one-line errors. Device-tier memory (KV slots, activations, the observation
 * window, what a select hook points at) is read and written only through the backend (util_dev_*, util_kv_head_copy),
 * so the suite also runs under KVB_GUARD=1 (test_methods_guard); hand-made probabilities, queries and rows stay host
 * arrays, which the CPU backend's ops read. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "benchmarks/suitecheck.h"
#include "util_common.h"
#include "util_gguf_writer.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "methods/fidelity.h"
#include "methods/method.h"
#include "methods/profile.h"

enum { L = 8, E = 32, NH = 4, NKV = 2, HD = 8, FF = 48, V = 300, CTX = 512 };

static kvb_model *model;
static char model_path[256];
static uint64_t rng = 99;

static float frand(float s) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return s * ((float)((rng >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f);
}

static int write_tiny(const char *path) {
    gw_random r = {rng, 0.5f, NULL};
    gw_tiny t = {"llama", L, E, NH, NKV, FF, V, CTX, 0, NULL, gw_random_tensor, &r};
    int rc = gw_write_tiny(&t, path);
    free(r.buf);
    rng = r.state; /* the tests draw on from where the weights ended */
    return rc;
}

static kvb_ctx *new_ctx(kvb_dtype dt) {
    char err[256];
    kvb_ctx_params p = kvb_ctx_default_params();
    p.kv_dtype = dt;
    p.n_ctx = CTX;
    p.n_threads = 2;
    p.n_batch = 64;
    kvb_ctx *c = kvb_ctx_create(model, &p, err, sizeof err);
    CU_ASSERT_FATAL(c != NULL);
    return c;
}

static kvb_method *make(const char *name, kvb_ctx *c, const char *budget, const char *opts) {
    char err[256];
    kvb_budget b;
    CU_ASSERT_FATAL(kvb_budget_parse(budget, &b, err, sizeof err) == 0);
    kvb_opts o = {0};
    if (opts) CU_ASSERT_FATAL(kvb_opts_add(&o, opts, err, sizeof err) == 0);
    kvb_method *m = kvb_method_create(name, c, &b, &o, err, sizeof err);
    if (!m) fprintf(stderr, "\n  %s: %s\n", name, err);
    CU_ASSERT_FATAL(m != NULL);
    return m;
}

/* Fill every layer with n random tokens at positions 0..n-1 (round r = pos / round_len), as if prefilled. */
static void fill_store(kvb_ctx *c, int64_t n, int round_len) {
    char err[256];
    int kvd = NKV * HD;
    float *k = malloc((size_t)n * kvd * sizeof *k), *v = malloc((size_t)n * kvd * sizeof *v);
    int32_t *pos = malloc((size_t)n * sizeof *pos), *rnd = malloc((size_t)n * sizeof *rnd);
    for (int l = 0; l < L; l++) {
        for (int64_t i = 0; i < n * kvd; i++) k[i] = frand(1.0f), v[i] = frand(1.0f);
        for (int64_t i = 0; i < n; i++) pos[i] = (int32_t)i, rnd[i] = round_len ? (int32_t)(i / round_len) : 0;
        CU_ASSERT_FATAL(kvc_append(c->kv, l, n, k, v, pos, rnd, err, sizeof err) == 0);
    }
    c->n_past = n;
    free(k), free(v), free(pos), free(rnd);
}

/* Sorted positions a head holds. */
static int64_t head_positions(kvb_ctx *c, kvc_store *kv, int l, int h, int32_t *out) {
    util_kv_head hc = util_kv_head_copy(kv, l, h);
    int64_t n = hc.n;
    memcpy(out, hc.pos, (size_t)n * sizeof *out);
    kvb_sort_i32(out, n);
    util_kv_head_free(&hc);
    (void)c;
    return n;
}

/* ---- StreamingLLM ---- */

static void test_streamingllm_keeps_sinks_and_window(void) {
    char err[256];
    kvb_ctx *c = new_ctx(KVB_F32);
    kvb_method *m = make("streamingllm", c, "20", "sinks=4");
    fill_store(c, 100, 0);
    CU_ASSERT_FATAL(kvb_ctx_end_prefill(c, err, sizeof err) == 0);
    int32_t pos[128];
    for (int l = 0; l < L; l++)
        for (int h = 0; h < NKV; h++) {
            CU_ASSERT_EQUAL_FATAL(head_positions(c, c->kv, l, h, pos), 20);
            for (int i = 0; i < 4; i++) CU_ASSERT_EQUAL(pos[i], i);
            for (int i = 4; i < 20; i++) CU_ASSERT_EQUAL(pos[i], 80 + i);
        }
    CU_ASSERT(kvb_method_verify(m, c, 1, err, sizeof err) == 0);
    /* three decode steps through the engine: the window slides, sinks stay */
    for (int s = 0; s < 3; s++) {
        int32_t id = 5 + s;
        CU_ASSERT_FATAL(kvb_forward(c, &id, 1, err, sizeof err) == 0);
    }
    CU_ASSERT_EQUAL(head_positions(c, c->kv, 3, 1, pos), 20);
    for (int i = 0; i < 4; i++) CU_ASSERT_EQUAL(pos[i], i);
    for (int i = 4; i < 20; i++) CU_ASSERT_EQUAL(pos[i], 83 + i);
    CU_ASSERT(kvb_method_verify(m, c, 0, err, sizeof err) == 0);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

/* ---- H2O ---- */

static void test_h2o_keeps_heavy_hitters_and_recent(void) {
    char err[256];
    kvb_ctx *c = new_ctx(KVB_F32);
    kvb_method *m = make("h2o", c, "10", NULL); /* 5 heavy + 5 recent */
    const int n = 40, G = NH / NKV;
    fill_store(c, n, 0);
    /* one prefill query row per head: head group g puts mass on tokens {3, 7, 11, 19, 23} (+g) */
    float *probs = calloc((size_t)NH * n, sizeof *probs);
    int heavy[5] = {3, 7, 11, 19, 23};
    for (int h = 0; h < NH; h++)
        for (int j = 0; j < n; j++) probs[h * n + j] = 0.001f * (float)(j % 5);
    for (int h = 0; h < NH; h++)
        for (int i = 0; i < 5; i++) probs[h * n + heavy[i] + h / G] += 0.5f;
    kvb_src src[NKV];
    for (int l = 0; l < L; l++) {
        kvb_src_from_store(c, l, src);
        CU_ASSERT_FATAL(m->hooks.observe(m, c, l, src, probs, n, 1, err, sizeof err) == 0);
    }
    CU_ASSERT_FATAL(kvb_ctx_end_prefill(c, err, sizeof err) == 0);
    int32_t pos[64];
    for (int g = 0; g < NKV; g++) {
        CU_ASSERT_EQUAL_FATAL(head_positions(c, c->kv, 2, g, pos), 10);
        for (int i = 0; i < 5; i++) CU_ASSERT_EQUAL(pos[i], heavy[i] + g);
        for (int i = 5; i < 10; i++) CU_ASSERT_EQUAL(pos[i], 30 + i);
    }
    /* a decode step: token 40 arrives; non-recent = the heavy hitters and token 35 (recent = the newest 5);
     * heavy[0]+g gets no new mass, the others do, so it has the lowest total and is evicted */
    float k[NKV * HD] = {0}, v[NKV * HD] = {0};
    int32_t p40 = 40;
    for (int l = 0; l < L; l++) CU_ASSERT_FATAL(kvc_append(c->kv, l, 1, k, v, &p40, NULL, err, sizeof err) == 0);
    c->pos[0] = 40;
    float *p2 = calloc((size_t)NH * 11, sizeof *p2);
    for (int l = 0; l < L; l++) {
        kvb_src_from_store(c, l, src);
        for (int g = 0; g < NKV; g++) {
            util_kv_head hv = util_kv_head_copy(c->kv, l, g);
            for (int r = 0; r < G; r++)
                for (int j = 0; j < hv.n; j++)
                    p2[(g * G + r) * 11 + j] = hv.pos[j] == heavy[0] + g ? 0.0f : (hv.pos[j] < 30 ? 0.3f : 0.6f);
            util_kv_head_free(&hv);
        }
        CU_ASSERT_FATAL(m->hooks.observe(m, c, l, src, p2, 11, 1, err, sizeof err) == 0);
    }
    c->n_past = 41;
    for (int g = 0; g < NKV; g++) {
        int64_t nn = head_positions(c, c->kv, 5, g, pos);
        CU_ASSERT_EQUAL(nn, 10); /* 41 x 10/40 tokens, budget fixed in tokens */
        int has_evicted = 0;
        for (int i = 0; i < nn; i++) has_evicted |= pos[i] == heavy[0] + g;
        CU_ASSERT(!has_evicted);
    }
    free(probs);
    free(p2);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

/* ---- SnapKV: float64 reference of window scores, pooling and top-k ---- */

static void test_snapkv_matches_float64_reference(void) {
    char err[256];
    kvb_ctx *c = new_ctx(KVB_F32);
    const int n = 120, w = 8, keep = 30, G = NH / NKV;
    kvb_method *m = make("snapkv", c, "30", "window=8,kernel=7");
    fill_store(c, n, 0);
    /* observation window: the last w query rows of every layer (device memory: written through the backend) */
    size_t obs_bytes = (size_t)L * c->obs_cap * E * sizeof(float);
    float *obs_q = malloc(obs_bytes);
    int32_t obs_pos[w];
    util_dev_read(c->be, obs_q, c->obs_q, obs_bytes);
    for (int l = 0; l < L; l++)
        for (int t = 0; t < w; t++)
            for (int i = 0; i < E; i++) obs_q[((size_t)l * c->obs_cap + t) * E + i] = frand(2.0f);
    for (int t = 0; t < w; t++) obs_pos[t] = n - w + t;
    util_dev_write(c->be, c->obs_q, obs_q, obs_bytes);
    util_dev_write(c->be, c->obs_pos, obs_pos, sizeof obs_pos);
    c->obs_n = w;
    /* reference kept sets before compression */
    int32_t want[L][NKV][keep];
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) {
            util_kv_head hv = util_kv_head_copy(c->kv, l, g);
            const float *K = hv.k;
            double score[n];
            memset(score, 0, sizeof score);
            for (int r = 0; r < G; r++)
                for (int t = 0; t < w; t++) {
                    const float *q = obs_q + ((size_t)l * c->obs_cap + t) * E + (g * G + r) * HD;
                    int qp = n - w + t;
                    double lg[n], mx = -1e300, sum = 0;
                    for (int j = 0; j <= qp; j++) {
                        double d = 0;
                        for (int e = 0; e < HD; e++) d += (double)q[e] * K[j * HD + e];
                        lg[j] = d / sqrt((double)HD);
                        if (lg[j] > mx) mx = lg[j];
                    }
                    for (int j = 0; j <= qp; j++) sum += exp(lg[j] - mx);
                    for (int j = 0; j < n - w; j++) score[j] += exp(lg[j] - mx) / sum;
                }
            double pooled[n];
            for (int j = 0; j < n - w; j++) {
                pooled[j] = -1e300;
                for (int d = -3; d <= 3; d++)
                    if (j + d >= 0 && j + d < n - w && score[j + d] > pooled[j]) pooled[j] = score[j + d];
            }
            /* top keep-w by pooled score, ties to the lower index */
            char taken[n];
            memset(taken, 0, sizeof taken);
            for (int i = 0; i < keep - w; i++) {
                int best = -1;
                for (int j = 0; j < n - w; j++)
                    if (!taken[j] && (best < 0 || pooled[j] > pooled[best] + 1e-7)) best = j;
                taken[best] = 1;
            }
            int k = 0;
            for (int j = 0; j < n - w; j++)
                if (taken[j]) want[l][g][k++] = j;
            for (int j = n - w; j < n; j++) want[l][g][k++] = j;
            util_kv_head_free(&hv);
        }
    free(obs_q);
    CU_ASSERT_FATAL(kvb_ctx_end_prefill(c, err, sizeof err) == 0);
    int32_t pos[128];
    int mismatches = 0;
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) {
            CU_ASSERT_EQUAL_FATAL(head_positions(c, c->kv, l, g, pos), keep);
            mismatches += memcmp(pos, want[l][g], sizeof want[l][g]) != 0;
        }
    CU_ASSERT_EQUAL(mismatches, 0);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

/* ---- OmniKV: selection at filter layers reaches exactly the layers they serve ---- */

typedef struct {
    int32_t pos[L][NKV][CTX];
    int64_t n[L][NKV];
} seen_t;

static void record_visible(void *user, kvb_ctx *c, int layer, const kvb_src *src, int64_t n_q) {
    (void)n_q;
    seen_t *s = user;
    if (c->in_prefill) return;
    static int32_t pos[CTX], idx[CTX]; /* host copies of the head's positions and index list */
    for (int h = 0; h < NKV; h++) {
        int64_t n = src[h].idx ? src[h].n_idx : src[h].n;
        CU_ASSERT_FATAL(src[h].n <= CTX && n <= CTX);
        util_dev_read(c->be, pos, src[h].pos, (size_t)src[h].n * sizeof *pos);
        if (src[h].idx) util_dev_read(c->be, idx, src[h].idx, (size_t)n * sizeof *idx);
        for (int64_t i = 0; i < n; i++) s->pos[layer][h][i] = pos[src[h].idx ? idx[i] : i];
        kvb_sort_i32(s->pos[layer][h], n);
        s->n[layer][h] = n;
    }
}

static void check_omnikv(const char *opts) {
    char err[256];
    kvb_ctx *c = new_ctx(KVB_F32);
    /* layers 1 and 4 filter: full 0, 1, 2, 4, 5; sparse 3 (served by 1), 6 and 7 (served by 4) */
    kvb_method *m = make("omnikv", c, "70%", opts);
    int32_t ids[200];
    for (int i = 0; i < 200; i++) ids[i] = 3 + (i * 37) % 290;
    CU_ASSERT_FATAL(kvb_method_prefill(m, c, ids, 200, err, sizeof err) == 0);
    seen_t *seen = calloc(1, sizeof *seen);
    c->on_visible = record_visible;
    c->on_visible_user = seen;
    int32_t next = 17;
    CU_ASSERT_FATAL(kvb_forward(c, &next, 1, err, sizeof err) == 0);
    /* F = 5/8; T/p = (0.7 - 0.625) / 0.375 = 0.2 of the 200 earlier tokens = 40, + the current token */
    for (int l = 0; l < L; l++)
        for (int h = 0; h < NKV; h++) {
            int sparse = l == 3 || l == 6 || l == 7;
            CU_ASSERT_EQUAL(seen->n[l][h], sparse ? 41 : 201);
            if (sparse) CU_ASSERT_EQUAL(seen->pos[l][h][40], 200);
        }
    CU_ASSERT(memcmp(seen->pos[6], seen->pos[7], sizeof seen->pos[6]) == 0); /* one selection, two layers */
    CU_ASSERT(memcmp(seen->pos[6][0], seen->pos[6][1], 41 * sizeof(int32_t)) == 0); /* shared by heads */
    CU_ASSERT(memcmp(seen->pos[3][0], seen->pos[6][0], 41 * sizeof(int32_t)) != 0); /* different filters */
    /* the filter layer's choice: top-40 of max over heads of the current query's attention (float64) */
    for (int f = 0; f < 2; f++) {
        int fl = f ? 4 : 1, served = f ? 6 : 3;
        float q[E];
        util_dev_read(c->be, q, c->obs_q + ((size_t)fl * c->obs_cap + (c->obs_n - 1)) * E, sizeof q);
        double score[201];
        for (int j = 0; j < 201; j++) score[j] = 0;
        for (int h = 0; h < NH; h++) {
            util_kv_head hv = util_kv_head_copy(c->kv, fl, h / (NH / NKV));
            double lg[201], mx = -1e300, sum = 0;
            for (int j = 0; j < 201; j++) {
                double d = 0;
                for (int e = 0; e < HD; e++) d += (double)q[h * HD + e] * ((const float *)hv.k)[j * HD + e];
                lg[j] = d / sqrt((double)HD);
                if (lg[j] > mx) mx = lg[j];
            }
            for (int j = 0; j < 201; j++) sum += exp(lg[j] - mx);
            for (int j = 0; j < 201; j++) {
                double p = exp(lg[j] - mx) / sum;
                if (p > score[j]) score[j] = p;
            }
            util_kv_head_free(&hv);
        }
        int ok = 1;
        for (int i = 0; i < 40; i++) { /* every chosen token scores at least as high as every unchosen one */
            int chosen = seen->pos[served][0][i];
            for (int j = 0; j < 200; j++) {
                int in = 0;
                for (int k = 0; k < 40; k++) in |= seen->pos[served][0][k] == j;
                if (!in && score[j] > score[chosen] + 1e-5) ok = 0;
            }
        }
        CU_ASSERT(ok);
    }
    CU_ASSERT(kvb_method_verify(m, c, 0, err, sizeof err) == 0);
    free(seen);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

static void test_omnikv_offload_selection_propagates(void) { check_omnikv("layers=1;4,offload=1"); }
static void test_omnikv_index_lists_select_the_same(void) { check_omnikv("layers=1;4,offload=0"); }

/* ---- Round Attention: choice of rounds under each strategy ---- */

static void check_round(const char *opts, const char *budget, const int *want_sel, int n_want) {
    char err[256];
    kvb_ctx *c = new_ctx(KVB_F32);
    kvb_method *m = make("round", c, budget, opts);
    const int n_hist = 100, rl = 10; /* 10 past rounds of 10 tokens */
    fill_store(c, n_hist, rl);
    c->cur_round = 9;
    CU_ASSERT_FATAL(kvb_ctx_begin_round(c, 10, 1, err, sizeof err) == 0);
    /* the question: 5 tokens of round 10, appended to every layer */
    float k[5 * NKV * HD], v[5 * NKV * HD];
    int32_t pos[5], rnd[5];
    for (int i = 0; i < 5 * NKV * HD; i++) k[i] = frand(1), v[i] = frand(1);
    for (int i = 0; i < 5; i++) pos[i] = n_hist + i, rnd[i] = 10, c->pos[i] = n_hist + i;
    for (int l = 0; l < L; l++) CU_ASSERT_FATAL(kvc_append(c->kv, l, 5, k, v, pos, rnd, err, sizeof err) == 0);
    /* as in the forward pass, the chunk's rows are also the activations (the packed buffer takes them from there) */
    util_dev_write(c->be, c->k, k, sizeof k), util_dev_write(c->be, c->v, v, sizeof v);
    util_dev_write(c->be, c->pos_d, pos, sizeof pos), util_dev_write(c->be, c->rounds_d, rnd, sizeof rnd);
    /* hand-made probabilities at layer lw-1: round masses 0.40, 0.25, 0.12, 0.08 and 0.025 each for the rest */
    double mass[10] = {0.025, 0.40, 0.025, 0.12, 0.025, 0.25, 0.025, 0.08, 0.025, 0.025};
    int64_t stride = n_hist + 5;
    float *probs = calloc((size_t)NH * 5 * stride, sizeof *probs);
    for (int h = 0; h < NH; h++)
        for (int t = 0; t < 5; t++)
            for (int j = 0; j < n_hist; j++) probs[((int64_t)h * 5 + t) * stride + j] = (float)(mass[j / rl] / rl * 0.9);
    kvb_src src[NKV];
    int lw = 3;
    kvb_src_from_store(c, lw - 1, src);
    CU_ASSERT_FATAL(m->hooks.wants_probs(m, c, lw - 1, 5) == 1);
    kvb_traffic t0 = c->be->traffic;
    CU_ASSERT_FATAL(m->hooks.observe(m, c, lw - 1, src, probs, stride, 5, err, sizeof err) == 0);
    /* the selected rounds of every deep layer and head came up in one packed copy, of exactly their rows */
    CU_ASSERT_EQUAL(c->be->traffic.n[KVB_COPY_H2D] - t0.n[KVB_COPY_H2D], 1);
    CU_ASSERT_EQUAL(c->be->traffic.bytes[KVB_COPY_H2D] - t0.bytes[KVB_COPY_H2D],
                    (int64_t)(L - lw) * NKV * n_want * rl * kvc_slot_bytes(c->kv));
    /* a deep layer now sees the selected rounds + the current one */
    CU_ASSERT_FATAL(m->hooks.select(m, c, 5, src, 5, err, sizeof err) == 0);
    int sel[11] = {0};
    int32_t seen[n_hist + 5];
    CU_ASSERT_FATAL(src[0].n <= n_hist + 5);
    util_dev_read(c->be, seen, src[0].pos, (size_t)src[0].n * sizeof *seen);
    for (int64_t i = 0; i < src[0].n; i++) sel[seen[i] >= n_hist ? 10 : seen[i] / rl] = 1;
    int got = 0;
    for (int r = 0; r < 10; r++) got += sel[r];
    CU_ASSERT_EQUAL(got, n_want);
    for (int i = 0; i < n_want; i++) CU_ASSERT(sel[want_sel[i]]);
    CU_ASSERT(sel[10]);
    CU_ASSERT_EQUAL(src[0].n, n_want * rl + 5);
    /* shallow layers still see everything */
    kvb_src_from_store(c, 1, src);
    CU_ASSERT(m->hooks.select(m, c, 1, src, 5, err, sizeof err) == 0 && src[0].n == n_hist + 5);
    free(probs);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

static void test_round_topk(void) { int w[1] = {1}; check_round("lw=3,strategy=topk", "30%", w, 1); }
static void test_round_topk_30pct(void) { int w[3] = {1, 5, 3}; check_round("lw=3,strategy=topk,topk=0.3", "30%", w, 3); }
static void test_round_fixed(void) { int w[3] = {1, 5, 3}; check_round("lw=3,strategy=fixed,threshold=0.1", "30%", w, 3); }
static void test_round_adaptive(void) { int w[2] = {1, 5}; check_round("lw=3,strategy=adaptive,k=1.0", "30%", w, 2); }
static void test_round_full_budget_selects_all(void) {
    int w[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    check_round("lw=3", "100%", w, 10);
}

/* Round Attention's measured device KV equals eq. 2 on a real run (single prompt in 50-token rounds). */
static void test_round_memory_matches_formula(void) {
    char err[256];
    kvb_ctx *c = new_ctx(KVB_F16);
    kvb_method *m = make("round", c, "30%", "lw=3,chunk=50,strategy=topk,topk=0.2");
    int32_t ids[300];
    for (int i = 0; i < 300; i++) ids[i] = 3 + (i * 71) % 290;
    CU_ASSERT_FATAL(kvb_method_prefill(m, c, ids, 300, err, sizeof err) == 0);
    for (int i = 0; i < 6; i++) {
        int32_t t = 9 + i;
        CU_ASSERT_FATAL(kvb_forward(c, &t, 1, err, sizeof err) == 0);
    }
    kvb_kv_usage u;
    kvb_method_usage(m, c, &u);
    /* 5 past rounds of 50, top 20% = 1 round; current round = 50 + 6 tokens; T = 306 */
    double want = 3.0 / L + (50.0 + 56.0) / 306.0 * (1.0 - 3.0 / L);
    CU_ASSERT(fabs(u.device_frac - want) < 0.02 * want);
    CU_ASSERT(fabs(m->def->formula_frac(m, c) - want) < 1e-9);
    CU_ASSERT(u.host_bytes == (int64_t)(L - 3) * NKV * 306 * kvc_slot_bytes(c->kv));
    CU_ASSERT(u.moved_h2d > 0);
    CU_ASSERT(kvb_method_verify(m, c, 0, err, sizeof err) == 0);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

/* ---- PoD: proximal + distant merge against float64 ---- */

static void test_pod_gate_and_merge_match_float64(void) {
    char err[256];
    kvb_ctx *c = new_ctx(KVB_F32);
    const int n = 60, sinks = 4, recent = 12, G = NH / NKV;
    kvb_method *m = make("pod", c, "16", "block=2,sinks=4"); /* proximal = 16 = 4 sinks + 12 recent */
    fill_store(c, n, 0);
    /* layer 1's V rows (position order) before PoD moves the distant ones out of the store */
    float V1[NKV][64][HD];
    for (int g = 0; g < NKV; g++) {
        util_kv_head hc = util_kv_head_copy(c->kv, 1, g);
        memcpy(V1[g], hc.v, sizeof(float) * n * HD);
        util_kv_head_free(&hc);
    }
    CU_ASSERT_FATAL(kvb_ctx_end_prefill(c, err, sizeof err) == 0);
    CU_ASSERT_EQUAL(kvc_n(c->kv, 1, 0), 16);      /* upper layer: proximal K+V only */
    CU_ASSERT_EQUAL(kvc_n(c->kv, 0, 0), n);       /* base layer: everything */
    CU_ASSERT_EQUAL(kvc_n(c->kv, 2, 1), n);       /* bases 0, 2, 4, 6 with block=2 */
    CU_ASSERT_EQUAL(kvc_n(c->kv, 7, 1), 16);
    CU_ASSERT_EQUAL(m->extra_device_bytes, (int64_t)NKV * 4 * (n - 16) * HD * (int64_t)sizeof(float)); /* distant V rows of
                                                                                   the 4 non-base layers */
    CU_ASSERT(kvb_method_verify(m, c, 1, err, sizeof err) == 0); /* measured = the blocks' formula */
    /* decode step at position n: append one token to layers 0 and 1, then run PoD's hooks as the engine does */
    float k[NKV * HD], v[NKV * HD];
    int32_t pn = n;
    for (int l = 0; l < 2; l++) {
        for (int i = 0; i < NKV * HD; i++) k[i] = frand(1), v[i] = frand(1);
        CU_ASSERT_FATAL(kvc_append(c->kv, l, 1, k, v, &pn, NULL, err, sizeof err) == 0);
    }
    c->pos[0] = n;
    float q0[E], q1[E], out0[E], out1[E];
    for (int i = 0; i < E; i++) q0[i] = frand(2), q1[i] = frand(2);
    kvb_src src[NKV];
    const void *hk[NKV], *hv[NKV];
    const int32_t *hp[NKV];
    int64_t hn[NKV];
    for (int l = 0; l < 2; l++) {
        kvb_src_from_store(c, l, src);
        CU_ASSERT_FATAL(m->hooks.select(m, c, l, src, 1, err, sizeof err) == 0);
        for (int g = 0; g < NKV; g++) hk[g] = src[g].k, hv[g] = src[g].v, hp[g] = src[g].pos, hn[g] = src[g].n;
        kvb_attn_args a = {0};
        a.n_q = 1, a.n_head = NH, a.n_head_kv = NKV, a.head_dim = HD, a.q = l ? q1 : q0, a.q_pos = c->pos;
        a.kv_dtype = KVB_F32, a.k = hk, a.v = hv, a.k_pos = hp, a.n_kv = hn, a.scale = 1.0f / sqrtf((float)HD);
        a.out = l ? out1 : out0;
        CU_ASSERT_FATAL(m->hooks.attend(m, c, l, &a, err, sizeof err) == 1);
    }
    /* float64 reference: base layer 0 = exact attention; layer 1 = gate-merged proximal/distant */
    for (int g = 0; g < NKV; g++) {
        util_kv_head b = util_kv_head_copy(c->kv, 0, g), u = util_kv_head_copy(c->kv, 1, g);
        for (int r = 0; r < G; r++) {
            int h = g * G + r;
            /* layer 0 exact */
            double lg[64], mx = -1e300, s = 0, o[HD] = {0};
            for (int j = 0; j <= n; j++) {
                double d = 0;
                for (int e = 0; e < HD; e++) d += (double)q0[h * HD + e] * ((const float *)b.k)[j * HD + e];
                lg[j] = d / sqrt((double)HD);
                mx = lg[j] > mx ? lg[j] : mx;
            }
            for (int j = 0; j <= n; j++) s += exp(lg[j] - mx);
            for (int j = 0; j <= n; j++)
                for (int e = 0; e < HD; e++) o[e] += exp(lg[j] - mx) / s * ((const float *)b.v)[j * HD + e];
            for (int e = 0; e < HD; e++) CU_ASSERT(fabs(o[e] - out0[h * HD + e]) < 1e-4);
            /* layer 1: proximal = positions < sinks or > n - recent; distant logits from layer 0's q and K */
            double lp = -1e300, ld = -1e300, sp = 0, sd = 0, op[HD] = {0}, od[HD] = {0};
            double pl[64], dl[64];
            int np = 0, nd = 0;
            int pidx[64], didx[64];
            for (int j = 0; j <= n; j++) {
                if (j < sinks || j > n - recent) { /* proximal: own K of layer 1 (held in the store) */
                    int slot = -1;
                    for (int i = 0; i < u.n; i++) if (u.pos[i] == j) slot = i;
                    CU_ASSERT_FATAL(slot >= 0);
                    double d = 0;
                    for (int e = 0; e < HD; e++) d += (double)q1[h * HD + e] * ((const float *)u.k)[slot * HD + e];
                    pl[np] = d / sqrt((double)HD), pidx[np++] = slot;
                } else {
                    double d = 0;
                    for (int e = 0; e < HD; e++) d += (double)q0[h * HD + e] * ((const float *)b.k)[j * HD + e];
                    dl[nd] = d / sqrt((double)HD), didx[nd++] = j;
                }
            }
            for (int i = 0; i < np; i++) lp = pl[i] > lp ? pl[i] : lp;
            for (int i = 0; i < nd; i++) ld = dl[i] > ld ? dl[i] : ld;
            for (int i = 0; i < np; i++) sp += exp(pl[i] - lp);
            for (int i = 0; i < nd; i++) sd += exp(dl[i] - ld);
            for (int i = 0; i < np; i++)
                for (int e = 0; e < HD; e++) op[e] += exp(pl[i] - lp) / sp * ((const float *)u.v)[pidx[i] * HD + e];
            for (int i = 0; i < nd; i++)
                for (int e = 0; e < HD; e++) od[e] += exp(dl[i] - ld) / sd * V1[g][didx[i]][e];
            double lse_p = lp + log(sp), lse_d = ld + log(sd);
            double gate = 1.0 / (1.0 + exp(lse_d - lse_p)); /* eq. 4 */
            CU_ASSERT(gate > 0 && gate < 1 && nd == n + 1 - 16);
            for (int e = 0; e < HD; e++) CU_ASSERT(fabs(out1[h * HD + e] - (gate * op[e] + (1 - gate) * od[e])) < 1e-4);
        }
        util_kv_head_free(&b), util_kv_head_free(&u);
    }
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}


/* ---- fidelity: teacher forcing, KL and attention-mass recall against a float64 reference ---- */

/* KL(softmax(a) || softmax(b)) in float64, written out here. */
static double kl_ref(const float *a, const float *b, int n) {
    double ma = a[0], mb = b[0], za = 0, zb = 0, kl = 0;
    for (int i = 1; i < n; i++) ma = a[i] > ma ? a[i] : ma, mb = b[i] > mb ? b[i] : mb;
    for (int i = 0; i < n; i++) za += exp(a[i] - ma), zb += exp(b[i] - mb);
    for (int i = 0; i < n; i++) {
        double pa = exp(a[i] - ma) / za, pb = exp(b[i] - mb) / zb;
        kl += pa * log(pa / pb);
    }
    return kl;
}

static void test_fidelity_matches_float64_reference(void) {
    enum { N = 200 };
    char err[256];
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = 3 + (int32_t)((i * 7919u) % (V - 3));
    kvb_ctx_params p = kvb_ctx_default_params();
    p.kv_dtype = KVB_F32;
    p.n_threads = 2;
    p.n_batch = 64;
    kvb_fid_ref *ref = kvb_fid_ref_create(model, &p, ids, N, 2, err, sizeof err);
    CU_ASSERT_FATAL(ref != NULL);
    kvb_budget b;
    kvb_opts o = {0};
    kvb_fid_result r;
    /* full against itself: every token agrees, KL 0, all of the mass seen */
    CU_ASSERT_FATAL(kvb_budget_parse("100%", &b, err, sizeof err) == 0);
    CU_ASSERT_FATAL(kvb_fidelity_run(ref, "full", &b, &o, &r, err, sizeof err) == 0);
    CU_ASSERT(r.positions == 2 && r.agree == 2 && r.kl_sum < 1e-12 && r.recall_steps == 1);
    CU_ASSERT(r.max_head_tokens == N + 1 && r.max_head_step == 1); /* the prompt, then the one decoded token */
    for (int l = 0; l < L; l++) CU_ASSERT_DOUBLE_EQUAL(r.recall_sum[l], 1.0, 1e-5);
    kvb_fid_result_free(&r);

    /* StreamingLLM with 32 tokens per head */
    CU_ASSERT_FATAL(kvb_budget_parse("32", &b, err, sizeof err) == 0);
    CU_ASSERT_FATAL(kvb_fidelity_run(ref, "streamingllm", &b, &o, &r, err, sizeof err) == 0);
    /* reference, step 0: full's and the method's logits after the prompt */
    kvb_ctx *full = new_ctx(KVB_F32), *sl = new_ctx(KVB_F32);
    kvb_method *m = make("streamingllm", sl, "32", NULL);
    CU_ASSERT_FATAL(kvb_forward(full, ids, N, err, sizeof err) == 0 && kvb_ctx_end_prefill(full, err, sizeof err) == 0);
    CU_ASSERT_FATAL(kvb_method_prefill(m, sl, ids, N, err, sizeof err) == 0);
    int32_t t0 = sampler_argmax(full->logits, V);
    double kl = kl_ref(full->logits, sl->logits, V);
    int agree = sampler_argmax(sl->logits, V) == t0;
    /* step 1: both fed full's token; the method's visible positions recorded; full's probabilities from its
     * cached keys and the layer's query (observation window), in float64 */
    kvb_ctx *fq = kvb_ctx_fork(full, 1, err, sizeof err);
    CU_ASSERT_FATAL(fq != NULL);
    static seen_t seen;
    sl->on_visible = record_visible;
    sl->on_visible_user = &seen;
    CU_ASSERT_FATAL(kvb_forward(fq, &t0, 1, err, sizeof err) == 0 && kvb_forward(sl, &t0, 1, err, sizeof err) == 0);
    kl += kl_ref(fq->logits, sl->logits, V);
    agree += sampler_argmax(sl->logits, V) == sampler_argmax(fq->logits, V);
    CU_ASSERT(r.positions == 2 && r.agree == agree);
    CU_ASSERT_DOUBLE_EQUAL(r.kl_sum, kl, 1e-6 + 1e-4 * kl);
    CU_ASSERT(kl > 1e-6); /* a 32-token cache of 201 does change the distribution */
    int partial = 0;
    for (int l = 0; l < L; l++) {
        float q[E]; /* the step's query row: [NH][HD] */
        util_dev_read(fq->be, q, fq->obs_q + (size_t)l * fq->obs_cap * E, sizeof q);
        double recall = 0;
        for (int h = 0; h < NKV; h++) {
            util_kv_head kv = util_kv_head_copy(fq->kv, l, h);
            double mass[N + 1] = {0};
            for (int g = 0; g < NH / NKV; g++) {
                const float *qh = q + (size_t)(h * (NH / NKV) + g) * HD;
                double sc[N + 1], mx = -1e300, z = 0;
                for (int64_t i = 0; i < kv.n; i++) {
                    const float *k = (const float *)kv.k + i * HD;
                    double d = 0;
                    for (int e = 0; e < HD; e++) d += (double)qh[e] * k[e];
                    sc[i] = d / sqrt((double)HD);
                    mx = sc[i] > mx ? sc[i] : mx;
                }
                for (int64_t i = 0; i < kv.n; i++) z += exp(sc[i] - mx);
                for (int64_t i = 0; i < kv.n; i++) mass[kv.pos[i]] += exp(sc[i] - mx) / z / (NH / NKV);
            }
            for (int64_t i = 0; i < seen.n[l][h]; i++) recall += mass[seen.pos[l][h][i]];
            util_kv_head_free(&kv);
        }
        recall /= NKV;
        CU_ASSERT_DOUBLE_EQUAL(r.recall_sum[l], recall, 1e-5);
        partial += recall < 0.999;
    }
    CU_ASSERT(partial > 0);
    kvb_fid_result_free(&r);
    kvb_method_free(m, sl);
    kvb_ctx_free(fq);
    kvb_ctx_free(sl);
    kvb_ctx_free(full);
    kvb_fid_ref_free(ref);
}

/* ---- random: the control ---- */

/* Kept positions of every head of a random method with seed `seed` on a copy of base (n tokens). */
static void random_kept(kvb_ctx *base, const char *budget, int seed, int32_t out[L][NKV][CTX], int64_t n_out[L][NKV]) {
    char err[256], opts[32];
    kvb_ctx *c = kvb_ctx_fork(base, 0, err, sizeof err);
    CU_ASSERT_FATAL(c != NULL);
    snprintf(opts, sizeof opts, "seed=%d", seed);
    kvb_method *m = make("random", c, budget, opts);
    CU_ASSERT_FATAL(kvb_ctx_end_prefill(c, err, sizeof err) == 0);
    CU_ASSERT(kvb_method_verify(m, c, 1, err, sizeof err) == 0);
    for (int l = 0; l < L; l++)
        for (int h = 0; h < NKV; h++) n_out[l][h] = head_positions(c, c->kv, l, h, out[l][h]);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

static void test_random_keeps_budget_sinks_window_same_set_per_seed(void) {
    static int32_t a[L][NKV][CTX], b[L][NKV][CTX], d[L][NKV][CTX];
    int64_t na[L][NKV], nb[L][NKV], nd[L][NKV];
    const int n = 200, keep = 60;
    kvb_ctx *base = new_ctx(KVB_F32);
    fill_store(base, n, 0);
    random_kept(base, "30%", 1, a, na);
    random_kept(base, "30%", 1, b, nb);
    random_kept(base, "30%", 2, d, nd);
    int same_seed_differs = 0, other_seed_same = 0, heads_same = 0, layers_same = 0;
    for (int l = 0; l < L; l++)
        for (int h = 0; h < NKV; h++) {
            CU_ASSERT_EQUAL_FATAL(na[l][h], keep);
            for (int i = 0; i < 4; i++) CU_ASSERT_EQUAL(a[l][h][i], i);               /* sinks */
            for (int i = 0; i < 32; i++) CU_ASSERT_EQUAL(a[l][h][keep - 32 + i], n - 32 + i); /* window */
            same_seed_differs += memcmp(a[l][h], b[l][h], keep * sizeof(int32_t)) != 0;
            other_seed_same += memcmp(a[l][h], d[l][h], keep * sizeof(int32_t)) == 0;
        }
    for (int l = 0; l < L; l++) heads_same += !memcmp(a[l][0], a[l][1], keep * sizeof(int32_t));
    for (int l = 1; l < L; l++) layers_same += !memcmp(a[l][0], a[0][0], keep * sizeof(int32_t));
    CU_ASSERT_EQUAL(same_seed_differs, 0);
    CU_ASSERT_EQUAL(other_seed_same, 0);
    CU_ASSERT_EQUAL(heads_same, 0);  /* independent per KV head, as kvpress */
    CU_ASSERT_EQUAL(layers_same, 0); /* and per layer */
    /* a budget below sinks + window: the sinks, then the newest tokens */
    random_kept(base, "10", 1, a, na);
    for (int i = 0; i < 4; i++) CU_ASSERT_EQUAL(a[3][1][i], i);
    for (int i = 4; i < 10; i++) CU_ASSERT_EQUAL(a[3][1][i], n - 10 + i);
    kvb_ctx_free(base);
}

/* Over 1000 seeds x 16 heads, each middle position is kept with frequency pick / middle: a chi-square over the
 * 64 middle positions below 63 + 5 sqrt(2 x 63) and no position off by more than 5 standard deviations. */
static void test_random_middle_is_uniform(void) {
    static int32_t kept[L][NKV][CTX];
    int64_t nk[L][NKV];
    const int n = 100, middle = n - 4 - 32, pick = 60 - 4 - 32, seeds = 1000, draws = seeds * L * NKV;
    long count[100] = {0};
    kvb_ctx *base = new_ctx(KVB_F32);
    fill_store(base, n, 0);
    for (int seed = 1; seed <= seeds; seed++) {
        random_kept(base, "60", seed, kept, nk);
        for (int l = 0; l < L; l++)
            for (int h = 0; h < NKV; h++)
                for (int i = 4; i < 4 + pick; i++) count[kept[l][h][i]]++;
    }
    double p = (double)pick / middle, want = draws * p, var = draws * p * (1 - p), chi2 = 0, worst = 0;
    for (int j = 4; j < 4 + middle; j++) {
        chi2 += (count[j] - want) * (count[j] - want) / var;
        if (fabs(count[j] - want) > worst) worst = fabs(count[j] - want);
    }
    CU_ASSERT(chi2 < 63 + 5 * sqrt(2.0 * 63));
    CU_ASSERT(worst < 5 * sqrt(var));
    if (chi2 >= 63 + 5 * sqrt(2.0 * 63)) fprintf(stderr, "\n  chi-square %.1f over %d positions worst %.1f sd %.1f\n", chi2, middle, worst, sqrt(var));
    kvb_ctx_free(base);
}

/* ---- the method contract ---- */

static void test_needs_come_from_the_registry_and_options(void) {
    char err[256];
    kvb_method_needs nd;
    kvb_opts o = {0};
    CU_ASSERT_FATAL(kvb_method_needs_of("flash", NULL, &nd, err, sizeof err) == 0);
    CU_ASSERT(!strcmp(nd.name, "full") && !nd.takes_budget && !nd.needs_budget && nd.shares_prefill && !nd.obs_window);
    CU_ASSERT(kvb_method_needs_of("snapkv", NULL, &nd, err, sizeof err) == 0 && nd.obs_window == 32 && nd.needs_budget);
    CU_ASSERT_FATAL(kvb_opts_add(&o, "window=64", err, sizeof err) == 0);
    CU_ASSERT(kvb_method_needs_of("snapkv", &o, &nd, err, sizeof err) == 0 && nd.obs_window == 64);
    CU_ASSERT_STRING_EQUAL(kvb_opts_unused(&o), "window"); /* asking did not use the option */
    CU_ASSERT(kvb_method_needs_of("omnikv", NULL, &nd, err, sizeof err) == 0 && nd.obs_window == 1);
    CU_ASSERT(kvb_method_needs_of("omnikv", &o, &nd, err, sizeof err) == 0 && nd.obs_window == 1); /* `last` */
    CU_ASSERT_FATAL(kvb_opts_add(&o, "selector=uniform", err, sizeof err) == 0);
    CU_ASSERT(kvb_method_needs_of("omnikv", &o, &nd, err, sizeof err) == 0 && nd.obs_window == 64);
    CU_ASSERT(kvb_method_needs_of("h2o", NULL, &nd, err, sizeof err) == 0 && nd.prefill_scores && nd.shares_prefill);
    CU_ASSERT(kvb_method_needs_of("round", NULL, &nd, err, sizeof err) == 0 && nd.own_prefill && !nd.shares_prefill &&
              !nd.needs_budget && nd.takes_budget);
    CU_ASSERT(kvb_method_needs_of("random", NULL, &nd, err, sizeof err) == 0 && nd.needs_budget && nd.shares_prefill &&
              !nd.prefill_scores && !nd.obs_window && !nd.own_prefill);
    CU_ASSERT(kvb_method_needs_of("nosuch", NULL, &nd, err, sizeof err) == -1 && strstr(err, "unknown method 'nosuch'"));
    kvb_opts bad = {0};
    CU_ASSERT_FATAL(kvb_opts_add(&bad, "window=wide", err, sizeof err) == 0);
    CU_ASSERT(kvb_method_needs_of("snapkv", &bad, &nd, err, sizeof err) == -1 && strstr(err, "window=wide"));
    CU_ASSERT(kvb_method_find("flash") == kvb_method_find("full"));
}

/* `--method all` is every registered method but the baseline, in registry order; every def names itself, finds
 * itself, has the functions the run calls and a budget trait that says what a budget means to it */
static void test_method_all_and_defs_come_from_the_registry(void) {
    char all[1024], want[1024] = "";
    size_t at = 0;
    for (int i = 0; i < kvb_method_count(); i++) {
        const kvb_method_def *d = kvb_method_at(i);
        CU_ASSERT(d->name && d->summary && d->create && d->destroy);
        CU_ASSERT(kvb_method_find(d->name) == d);
        CU_ASSERT(!((d->traits & KVB_NEEDS_BUDGET) && (d->traits & KVB_NO_BUDGET)));
        CU_ASSERT(!((d->traits & KVB_OWN_PREFILL) && (d->traits & KVB_SHARES_PREFILL)));
        if (!(d->traits & KVB_NO_BUDGET) && !d->scorer) /* kvzap's scorer is a per-model file: named, never in "all" */
            at += (size_t)snprintf(want + at, sizeof want - at, "%s%s", at ? "," : "", d->name);
    }
    kvb_method_names_all(all, sizeof all);
    CU_ASSERT_STRING_EQUAL(all, want);
    CU_ASSERT(kvb_method_at(kvb_method_count()) == NULL && kvb_method_at(-1) == NULL);
}

/* The quick suite says it runs every method, and test_quick_guard runs it under the guard: read as the runner reads
 * it ("methods": "all" expanded from the registry by kvb_suite_parse), every registered method is in it (a new
 * method missing from it fails here, in a fast test), but those reading a trained per-model scorer (kvzap's
 * scorer=: "all" leaves them out, and the generic tests here run them with scorer=random) */
static void test_quick_suite_lists_every_registered_method(void) {
    char err[256];
    cJSON *suite = kvb_suite_parse("configs/quick.json", err, sizeof err), *m;
    CU_ASSERT_FATAL(suite != NULL);
    for (int i = 0; i < kvb_method_count(); i++) {
        int found = 0;
        cJSON_ArrayForEach(m, cJSON_GetObjectItemCaseSensitive(suite, "methods")) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(m, "name");
            found |= cJSON_IsString(name) && kvb_method_find(name->valuestring) == kvb_method_at(i);
        }
        /* or left out by name, for its wall time (the suite's description says which and why) */
        cJSON_ArrayForEach(m, cJSON_GetObjectItemCaseSensitive(suite, "methods_except"))
            found |= kvb_method_find(m->valuestring) == kvb_method_at(i);
        found |= kvb_method_at(i)->scorer != NULL; /* kvzap reads a per-model checkpoint no suite can ship */
        CU_ASSERT(found);
        if (!found) fprintf(stderr, "\n  configs/quick.json neither lists nor leaves out %s\n", kvb_method_at(i)->name);
    }
    cJSON_Delete(suite);
}

/* kvb_topk_ascending = the k largest (ties to the lower index), as indices ascending; brute force reference */
static void test_topk_ascending_is_the_k_largest_ties_to_lower_index(void) {
    float x[97];
    int32_t got[97], want[97];
    for (int trial = 0; trial < 200; trial++) {
        int n = 1 + trial % 97, k = (trial * 31) % (n + 1);
        for (int i = 0; i < n; i++) x[i] = (float)((trial * 7 + i * 13) % (1 + trial % 9)); /* many ties */
        char taken[97] = {0};
        for (int r = 0; r < k; r++) {
            int best = -1;
            for (int i = 0; i < n; i++)
                if (!taken[i] && (best < 0 || x[i] > x[best])) best = i;
            taken[best] = 1;
        }
        int m = 0;
        for (int i = 0; i < n; i++)
            if (taken[i]) want[m++] = i;
        CU_ASSERT_FATAL(kvb_topk_ascending(x, n, k, got) == 0);
        CU_ASSERT(!memcmp(got, want, (size_t)k * sizeof *got));
    }
}

/* ---- shared prefill = own prefill ---- */

static void greedy(kvb_ctx *c, int32_t *out, int n) {
    char err[256];
    for (int i = 0; i < n; i++) {
        out[i] = sampler_argmax(c->logits, V);
        CU_ASSERT_FATAL(kvb_forward(c, &out[i], 1, err, sizeof err) == 0);
    }
}

/* Every method that may share a prefill (the registry's KVB_SHARES_PREFILL): its own prefill and its adoption of a
 * shared one hold the same KV and decode the same tokens. A method added to the registry is in this test. Pinned:
 * the options some need on this tiny model (snapkv's windows, omnikv's layers, pod's block, kivi's groups, qfilter's
 * and duo's profile-free sources), and
 * extra option sets of quest and tova, which also run with their defaults. */
static const struct { const char *method, *opts; } SHARE_PINNED[] = {
    {"snapkv", "window=16"}, {"snapkv", "window=64"}, {"omnikv", "layers=1;4"}, {"pod", "block=2"},
    {"quest", "page=8"},     {"tova", "per_head=1"},   {"kivi", "bits=2,group=8,residual=16"},
    {"qfilter", "filters=window"}, {"duo", "split=window"}, /* no calibration profile on the tiny model */
    {"kvzap", "scorer=random"}, /* no KVzap checkpoint for the tiny model: a seeded random scorer */
};

static void test_shared_prefill_equals_own_prefill(void) {
    const char *names[64][2];
    size_t n_names = 0;
    for (int i = 0; i < kvb_method_count(); i++) {
        const kvb_method_def *d = kvb_method_at(i);
        if (!(d->traits & KVB_SHARES_PREFILL)) continue;
        int pinned = 0;
        for (size_t k = 0; k < sizeof SHARE_PINNED / sizeof *SHARE_PINNED; k++)
            if (!strcmp(SHARE_PINNED[k].method, d->name)) {
                names[n_names][0] = d->name, names[n_names++][1] = SHARE_PINNED[k].opts;
                pinned = strcmp(d->name, "quest") && strcmp(d->name, "tova"); /* theirs are extra sets */
            }
        if (!pinned) names[n_names][0] = d->name, names[n_names++][1] = NULL;
        CU_ASSERT_FATAL(n_names + 2 < sizeof names / sizeof *names);
    }
    char err[256];
    int32_t ids[300];
    for (int i = 0; i < 300; i++) ids[i] = 3 + (i * 53) % 290;
    for (size_t k = 0; k < n_names; k++) {
        const char *budget = kvb_method_find(names[k][0])->traits & KVB_NO_BUDGET ? "100%" : "70%";
        kvb_ctx *a = new_ctx(KVB_F16);
        kvb_method *ma = make(names[k][0], a, budget, names[k][1]);
        int prc = kvb_method_prefill(ma, a, ids, 300, err, sizeof err);
        if (prc) fprintf(stderr, "\n  %s: %s\n", names[k][0], err);
        CU_ASSERT_FATAL(prc == 0);
        int32_t ta[12], tb[12];
        kvb_kv_usage ua, ub;
        kvb_method_usage(ma, a, &ua);
        greedy(a, ta, 12);

        /* the share keeps what the method says it needs, read from its options */
        kvb_method_needs nd;
        kvb_opts o = {0};
        if (names[k][1]) CU_ASSERT_FATAL(kvb_opts_add(&o, names[k][1], err, sizeof err) == 0);
        CU_ASSERT_FATAL(kvb_method_needs_of(names[k][0], &o, &nd, err, sizeof err) == 0 && nd.shares_prefill);
        kvb_ctx *base = new_ctx(KVB_F16);
        kvb_share *sh = kvb_share_for(base, &nd, err, sizeof err);
        CU_ASSERT_FATAL(sh != NULL);
        CU_ASSERT_FATAL(kvb_forward(base, ids, 300, err, sizeof err) == 0);
        kvb_ctx *b = kvb_ctx_fork(base, nd.obs_window, err, sizeof err);
        CU_ASSERT_FATAL(b != NULL);
        kvb_method *mb = make(names[k][0], b, budget, names[k][1]);
        CU_ASSERT_FATAL(kvb_method_adopt(mb, b, sh, err, sizeof err) == 0);
        kvb_method_usage(mb, b, &ub);
        greedy(b, tb, 12);
        CU_ASSERT_EQUAL(ua.device_bytes, ub.device_bytes);
        int same = !memcmp(ta, tb, sizeof ta);
        if (!same) fprintf(stderr, "\n  %s: shared prefill decodes differently\n", names[k][0]);
        CU_ASSERT(same);
        kvb_method_free(ma, a);
        kvb_method_free(mb, b);
        kvb_share_free(sh, base);
        kvb_ctx_free(a);
        kvb_ctx_free(b);
        kvb_ctx_free(base);
    }
}

/* ---- errors ---- */

static void expect_create_error(const char *name, const char *budget, const char *opts, const char *needle) {
    char err[256] = "";
    kvb_ctx *c = new_ctx(KVB_F16);
    kvb_budget b = {KVB_BUDGET_NONE, 0, 0};
    if (budget) CU_ASSERT_FATAL(kvb_budget_parse(budget, &b, err, sizeof err) == 0);
    kvb_opts o = {0};
    if (opts) CU_ASSERT_FATAL(kvb_opts_add(&o, opts, err, sizeof err) == 0);
    kvb_method *m = kvb_method_create(name, c, &b, &o, err, sizeof err);
    CU_ASSERT(m == NULL);
    CU_ASSERT(strstr(err, needle) != NULL);
    CU_ASSERT(strchr(err, '\n') == NULL);
    if (!strstr(err, needle)) fprintf(stderr, "\n  got: %s\n", err);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

static void test_bad_budgets_and_options(void) {
    char err[256];
    kvb_budget b;
    CU_ASSERT(kvb_budget_parse("0%", &b, err, sizeof err) == -1 && strstr(err, "outside"));
    CU_ASSERT(kvb_budget_parse("150%", &b, err, sizeof err) == -1);
    CU_ASSERT(kvb_budget_parse("0", &b, err, sizeof err) == -1);
    CU_ASSERT(kvb_budget_parse("0.3", &b, err, sizeof err) == -1 && strstr(err, "%"));
    CU_ASSERT(kvb_budget_parse("lots", &b, err, sizeof err) == -1);
    CU_ASSERT(kvb_budget_parse("30%", &b, err, sizeof err) == 0 && b.kind == KVB_BUDGET_FRACTION && fabs(b.frac - 0.3) < 1e-12);
    CU_ASSERT(kvb_budget_parse("1024", &b, err, sizeof err) == 0 && b.kind == KVB_BUDGET_TOKENS && b.tokens == 1024);
    expect_create_error("nosuch", "30%", NULL, "unknown method 'nosuch'");
    expect_create_error("streamingllm", NULL, NULL, "needs a budget");
    expect_create_error("random", NULL, NULL, "needs a budget");
    expect_create_error("random", "30%", "sinks=-1", "must be >= 0");
    expect_create_error("snapkv", "30%", "windw=8", "has no option 'windw'");
    expect_create_error("round", "30%", "lw=8", "outside the model's layers");
    expect_create_error("round", "30%", "lw=0", "outside the model's layers");
    expect_create_error("omnikv", "30%", "layers=2;9", "outside the model's layers");
    expect_create_error("full", "30%", NULL, "keeps the whole cache");
    expect_create_error("pod", "30%", NULL, "calibrate pod");
    expect_create_error("round", "30%", NULL, "calibrate round");
    /* a token budget larger than the prompt fails at the end of prefill */
    kvb_ctx *c = new_ctx(KVB_F16);
    kvb_method *m = make("h2o", c, "500", NULL);
    int32_t ids[50];
    for (int i = 0; i < 50; i++) ids[i] = 5 + i;
    CU_ASSERT(kvb_method_prefill(m, c, ids, 50, err, sizeof err) == -1);
    CU_ASSERT(strstr(err, "more than the prompt") != NULL);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
    /* a shared prefill that kept no scores cannot serve H2O, a fork that kept 16 rows not SnapKV's 32 */
    kvb_ctx *base = new_ctx(KVB_F16);
    kvb_share *sh = kvb_share_create(base, 16, 0, err, sizeof err);
    CU_ASSERT_FATAL(sh != NULL && kvb_forward(base, ids, 50, err, sizeof err) == 0);
    c = kvb_ctx_fork(base, 16, err, sizeof err);
    m = make("h2o", c, "50%", NULL);
    CU_ASSERT(kvb_method_adopt(m, c, sh, err, sizeof err) == -1 && strstr(err, "needs prefill attention scores"));
    kvb_method_free(m, c);
    kvb_ctx_free(c);
    c = kvb_ctx_fork(base, 16, err, sizeof err);
    kvb_opts none = {0};
    CU_ASSERT(kvb_method_create("snapkv", c, &b, &none, err, sizeof err) == NULL && strstr(err, "kept 16"));
    kvb_ctx_free(c);
    kvb_share_free(sh, base);
    kvb_ctx_free(base);
    /* OmniKV below its full layers' share: known before any prompt, so creation fails (a request error in
     * `serve`, not a server error after a prefill) */
    c = new_ctx(KVB_F16);
    kvb_opts o = {0};
    CU_ASSERT_FATAL(kvb_budget_parse("20%", &b, err, sizeof err) == 0 && kvb_opts_add(&o, "layers=1;4", err, sizeof err) == 0);
    CU_ASSERT(kvb_method_create("omnikv", c, &b, &o, err, sizeof err) == NULL);
    CU_ASSERT(strstr(err, "below the share") != NULL);
    kvb_ctx_free(c);
}

/* OmniKV's default filter layers are the paper's {2, 8, 18}/32 scaled to the model (L = 8: round(0.5, 2,
 * 4.5) = 1;2;5) whether or not a calibration profile exists, so run, bench and fidelity agree; the profile's
 * layers are used only with layers=profile, and asking for a missing one says how to make it. */
static void test_omnikv_default_layers_are_the_papers_scaled_profile_on_request(void) {
    char err[256] = "", desc[240];
    expect_create_error("omnikv", "50%", "layers=profile", "calibrate omnikv");
    cJSON *v = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(v, "layers");
    cJSON_AddItemToArray(arr, cJSON_CreateNumber(3)), cJSON_AddItemToArray(arr, cJSON_CreateNumber(6));
    CU_ASSERT_FATAL(kvb_profile_store(model, "omnikv", v, err, sizeof err) == 0);
    cJSON_Delete(v);
    const char *opts[2] = {NULL, "layers=profile"}, *want[2] = {"layers=1;2;5 ", "layers=3;6 "};
    for (int k = 0; k < 2; k++) {
        kvb_ctx *c = new_ctx(KVB_F16);
        kvb_method *m = make("omnikv", c, "90%", opts[k]); /* above both layer sets' full share */
        m->def->describe(m, desc, sizeof desc);
        CU_ASSERT(!strncmp(desc, want[k], strlen(want[k])));
        if (strncmp(desc, want[k], strlen(want[k]))) fprintf(stderr, "\n  got: %s\n", desc);
        kvb_method_free(m, c);
        kvb_ctx_free(c);
    }
    char path[1100];
    CU_ASSERT_FATAL(kvb_profile_path(model, path, sizeof path, err, sizeof err) == 0);
    unlink(path); /* the other tests expect no profile */
}

static char dir[] = "/tmp/kvb_methods_XXXXXX";

static int setup(void) {
    if (!mkdtemp(dir)) return -1;
    snprintf(model_path, sizeof model_path, "%s/tiny.gguf", dir);
    setenv("KVB_PROFILE_DIR", dir, 1); /* empty: no calibration profiles */
    if (write_tiny(model_path)) return -1;
    char err[256];
    model = kvb_model_load(model_path, err, sizeof err);
    return model ? 0 : -1;
}

static int teardown(void) {
    kvb_model_free(model);
    unlink(model_path);
    rmdir(dir);
    return 0;
}

int main(void) {
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("methods", setup, teardown);
    CU_add_test(s, "streamingllm keeps sinks + window", test_streamingllm_keeps_sinks_and_window);
    CU_add_test(s, "h2o keeps heavy hitters + recent, evicts the lowest", test_h2o_keeps_heavy_hitters_and_recent);
    CU_add_test(s, "snapkv = float64 window scores, max pool, top-k", test_snapkv_matches_float64_reference);
    CU_add_test(s, "omnikv offload: selection reaches the layers served", test_omnikv_offload_selection_propagates);
    CU_add_test(s, "omnikv index lists select the same", test_omnikv_index_lists_select_the_same);
    CU_add_test(s, "round topk 10%", test_round_topk);
    CU_add_test(s, "round topk 30%", test_round_topk_30pct);
    CU_add_test(s, "round fixed > 0.1", test_round_fixed);
    CU_add_test(s, "round adaptive mean + k std", test_round_adaptive);
    CU_add_test(s, "round at 100% selects every round", test_round_full_budget_selects_all);
    CU_add_test(s, "round device KV = eq. 2", test_round_memory_matches_formula);
    CU_add_test(s, "pod gate and merge vs float64", test_pod_gate_and_merge_match_float64);
    CU_add_test(s, "random keeps budget, sinks, window; same set per seed", test_random_keeps_budget_sinks_window_same_set_per_seed);
    CU_add_test(s, "random middle is uniform over seeds", test_random_middle_is_uniform);
    CU_add_test(s, "needs come from the registry and the options", test_needs_come_from_the_registry_and_options);
    CU_add_test(s, "--method all and every def come from the registry", test_method_all_and_defs_come_from_the_registry);
    CU_add_test(s, "the quick suite lists every registered method", test_quick_suite_lists_every_registered_method);
    CU_add_test(s, "top-k ascending: k largest, ties to lower index", test_topk_ascending_is_the_k_largest_ties_to_lower_index);
    CU_add_test(s, "shared prefill = own prefill", test_shared_prefill_equals_own_prefill);
    CU_add_test(s, "bad budgets, options, profiles", test_bad_budgets_and_options);
    CU_add_test(s, "omnikv default layers are the paper's scaled, the profile's on request",
                test_omnikv_default_layers_are_the_papers_scaled_profile_on_request);
    CU_add_test(s, "fidelity: KL, agreement, recall vs float64", test_fidelity_matches_float64_reference);
    return util_run_suites();
}
