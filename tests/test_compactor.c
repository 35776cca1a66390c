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

/* leverage of the n keys (post-RoPE as cached, at positions p0 ..) of one head: derotated, centred,
 * x^T (X^T X + 1e-2 I)^-1 x */
static void leverage_ref(const kvb_config *cfg, const void *K, kvb_dtype dt, int64_t p0, int64_t n, double *score) {
    double (*x)[HD] = malloc((size_t)n * sizeof *x), mean[HD] = {0}, G[HD][HD] = {{0}}, Lc[HD][HD] = {{0}};
    for (int64_t j = 0; j < n; j++) {
        for (int e = 0; e < HD; e++) x[j][e] = util_elem(K, dt, (size_t)((p0 + j) * HD + e));
        for (int i = 0; i < cfg->n_rot / 2; i++) { /* R(-p): llama's adjacent pairs */
            const int a = cfg->rope_neox ? i : 2 * i, b = cfg->rope_neox ? i + cfg->n_rot / 2 : 2 * i + 1;
            const double th = pow((double)cfg->rope.freq_base, -2.0 * i / cfg->n_rot), cs = cos((double)(p0 + j) * th),
                         sn = sin((double)(p0 + j) * th);
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
            leverage_ref(&c->model->cfg, hv.k, dt, 0, n, score);
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
    CU_ASSERT_STRING_EQUAL(desc, "mode=leverage sketch=none keep=64");
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

/* ---- mode=compactor: kvpress's CompactorPress, restated in float64 ---- */

/* mean and unbiased std (torch's .std(), clamped at 1e-6) */
static void zstats(const double *x, int64_t n, double *m, double *sd) {
    double s = 0, ss = 0;
    for (int64_t i = 0; i < n; i++) s += x[i];
    *m = s / (double)n;
    for (int64_t i = 0; i < n; i++) ss += (x[i] - *m) * (x[i] - *m);
    *sd = n > 1 ? sqrt(ss / (double)(n - 1)) : 0;
    if (*sd < 1e-6) *sd = 1e-6;
}

/* CompactorPress's scores of one layer, out[g][0..n): the n slots (positions 0..n-1) of its KV heads K, V and the
 * prompt's queries q ([n][NH][HD], post-RoPE) for an n-token prompt. The ends (first 8, last 4) get the layer's max;
 * between them, blend z(leverage) + z(pool3(mean over the group of the non-causal chunks' softmax(q k^T) column
 * sums) ||v||), the last chunk zero-padded (queries and keys) as NonCausalAttnPress pads it. */
static void compactor_ref(const kvb_config *cfg, const util_kv_head *hv, kvb_dtype dt, const float *q, int64_t n,
                          int64_t chunk, double blend, double (*out)[CTX]) {
    const int G = NH / NKV;
    const int64_t off = n < 8 ? n : 8, right = n - off < 4 ? n - off : 4, S = n - off - right;
    static double lev[NKV * CTX], att[NKV * CTX], raw[NKV][CTX];
    for (int g = 0; g < NKV; g++) {
        leverage_ref(cfg, hv[g].k, dt, off, S, lev + (size_t)g * S);
        for (int64_t j = 0; j < S; j++) raw[g][j] = 0;
        for (int64_t c0 = 0; c0 < S; c0 += chunk)
            for (int r = 0; r < G; r++)
                for (int64_t t = 0; t < chunk; t++) { /* chunk query rows; the padding's are zero */
                    double lg[CTX], mx = -INFINITY, sum = 0;
                    for (int64_t j = 0; j < chunk; j++) {
                        double dot = 0;
                        if (c0 + t < S && c0 + j < S)
                            for (int e = 0; e < HD; e++)
                                dot += (double)q[((off + c0 + t) * NH + g * G + r) * HD + e] *
                                       util_elem(hv[g].k, dt, (size_t)((off + c0 + j) * HD + e));
                        lg[j] = dot;
                        if (dot > mx) mx = dot;
                    }
                    for (int64_t j = 0; j < chunk; j++) sum += exp(lg[j] - mx);
                    for (int64_t j = 0; j < chunk && c0 + j < S; j++) raw[g][c0 + j] += exp(lg[j] - mx) / sum;
                }
        for (int64_t j = 0; j < S; j++) {
            double vn = 0;
            for (int e = 0; e < HD; e++) vn += pow(util_elem(hv[g].v, dt, (size_t)((off + j) * HD + e)), 2);
            raw[g][j] = raw[g][j] / G * sqrt(vn);
        }
        for (int64_t j = 0; j < S; j++) /* avg_pool1d(3, padding 1), the padding counted */
            att[(size_t)g * S + j] = ((j > 0 ? raw[g][j - 1] : 0) + raw[g][j] + (j + 1 < S ? raw[g][j + 1] : 0)) / 3;
    }
    double lm, ls, am, as, top = -INFINITY;
    zstats(lev, NKV * S, &lm, &ls);
    zstats(att, NKV * S, &am, &as);
    for (int g = 0; g < NKV; g++)
        for (int64_t j = 0; j < S; j++) {
            const size_t i = (size_t)g * S + j;
            out[g][off + j] = blend * (lev[i] - lm) / ls + (att[i] - am) / as;
            if (out[g][off + j] > top) top = out[g][off + j];
        }
    for (int g = 0; g < NKV; g++)
        for (int64_t j = 0; j < n; j++)
            if (j < off || j >= off + S) out[g][j] = top;
}

/* AdaKV's allocation as kvpress's AdaKVPress makes it: each head's top `floor` raised to the top, then the NKV x B
 * best of the layer (ties: lower head, then lower slot). kept[g][j] = 1 for the kept. gap: the last kept score minus
 * the best dropped one, relative to the last kept (how near a tie the reference is). */
static void adakv_ref(double (*score)[CTX], int64_t n, int64_t B, int64_t floor, int (*kept)[CTX], double *gap) {
    static double s[NKV][CTX];
    for (int g = 0; g < NKV; g++) {
        int32_t top[CTX];
        for (int64_t j = 0; j < n; j++) s[g][j] = score[g][j];
        util_topk_ref(score[g], n, floor, top, NULL, NULL);
        for (int64_t i = 0; i < floor; i++) s[g][top[i]] = INFINITY;
        for (int64_t j = 0; j < n; j++) kept[g][j] = 0;
    }
    double last = INFINITY;
    for (int64_t k = 0; k < NKV * B; k++) { /* the next best of the layer */
        int bg = -1;
        int64_t bj = -1;
        for (int g = 0; g < NKV; g++)
            for (int64_t j = 0; j < n; j++)
                if (!kept[g][j] && (bg < 0 || s[g][j] > s[bg][bj])) bg = g, bj = j;
        kept[bg][bj] = 1, last = s[bg][bj];
    }
    double next = -INFINITY;
    for (int g = 0; g < NKV; g++)
        for (int64_t j = 0; j < n; j++)
            if (!kept[g][j] && s[g][j] > next) next = s[g][j];
    *gap = (last - next) / fabs(last); /* relative: a head's raw leverage is small (its sum is head_dim) */
}

/* An n-token prompt prefilled once (a shared prefill keeping every query row), the method forked from it at budget B
 * with opts: its kept sets equal the float64 reference's (per head top B, or with ada AdaKV's allocation). */
static void check_blend(kvb_dtype dt, int64_t n, const char *budget, int64_t B, const char *opts, double blend,
                        int64_t chunk, int ada, int lev_only) {
    char err[256];
    int32_t ids[CTX];
    for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)(3 + (i * 37) % 290); /* distinct tokens: no tied keys */
    kvb_ctx *base = util_tiny_ctx(dt, CTX);
    kvb_share *sh = kvb_share_create(base, (int)n, 0, err, sizeof err);
    CU_ASSERT_FATAL(sh != NULL);
    CU_ASSERT_FATAL(kvb_forward(base, ids, n, err, sizeof err) == 0);
    CU_ASSERT_FATAL(base->obs_n == n);
    const int64_t qd = (int64_t)NH * HD;
    float *q = malloc((size_t)L * n * qd * sizeof *q);
    for (int l = 0; l < L; l++)
        CU_ASSERT_FATAL(base->be->copy(base->be, q + (size_t)l * n * qd, base->obs_q + (size_t)l * base->obs_cap * qd,
                                       (size_t)n * qd * sizeof *q, KVB_COPY_D2H, err, sizeof err) == 0);
    CU_ASSERT_FATAL(!base->be->sync || base->be->sync(base->be) == 0);
    /* the fork keeps the rows from the first one past the protected start: the window's row 0 is position 8 */
    const int64_t w = n > 8 ? n - 8 : 1;
    kvb_ctx *c = kvb_ctx_fork(base, (int)w, err, sizeof err);
    CU_ASSERT_FATAL(c != NULL);
    char all[128];
    snprintf(all, sizeof all, lev_only ? "%s" : "%s,window=%lld", opts, (long long)w);
    kvb_method *m = util_make_method("compactor", c, budget, all);
    static int want[L][NKV][CTX];
    double worst = INFINITY;
    for (int l = 0; l < L; l++) {
        util_kv_head hv[NKV];
        for (int g = 0; g < NKV; g++) hv[g] = util_kv_head_copy(c->kv, l, g);
        static double score[NKV][CTX];
        if (lev_only) /* mode=leverage: every token's leverage, raw */
            for (int g = 0; g < NKV; g++) leverage_ref(&c->model->cfg, hv[g].k, dt, 0, n, score[g]);
        else
            compactor_ref(&c->model->cfg, hv, dt, q + (size_t)l * n * qd, n, chunk, blend, score);
        if (ada) {
            double gap;
            const int64_t floor = (int64_t)(0.2 * (double)B); /* kvpress 0.5.5: at least 1 */
            adakv_ref(score, n, B, floor > 0 ? floor : 1, want[l], &gap);
            if (gap < worst) worst = gap;
        } else
            for (int g = 0; g < NKV; g++) {
                int32_t top[CTX];
                double margin = 1, kth = 1;
                util_topk_ref(score[g], n, B, top, &margin, &kth);
                for (int64_t j = 0; j < n; j++) want[l][g][j] = 0;
                for (int64_t i = 0; i < B; i++) want[l][g][top[i]] = 1;
                if (margin / fabs(kth) < worst) worst = margin / fabs(kth);
            }
        for (int g = 0; g < NKV; g++) util_kv_head_free(&hv[g]);
    }
    CU_ASSERT(worst > 1e-5); /* no boundary a float rounding could flip (relative) */
    CU_ASSERT_FATAL(kvb_method_adopt(m, c, sh, err, sizeof err) == 0);
    CU_ASSERT(kvb_method_verify(m, c, 1, err, sizeof err) == 0);
    int mismatches = 0, total = 0;
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) {
            int32_t pos[CTX];
            const int64_t k = util_head_positions(c, l, g, pos);
            int have[CTX] = {0};
            for (int64_t i = 0; i < k; i++) have[pos[i]] = 1;
            for (int64_t j = 0; j < n; j++) mismatches += have[j] != want[l][g][j];
            total += (int)k;
        }
    CU_ASSERT_EQUAL(mismatches, 0);
    CU_ASSERT_EQUAL(total, L * NKV * B);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
    kvb_share_free(sh, base);
    kvb_ctx_free(base);
    free(q);
}

/* 150 tokens: 138 between the ends, chunks of 32 (four whole, the last of 10 padded); blend the ratio (0.7) */
static void test_blend_f32(void) { check_blend(KVB_F32, 150, "30%", 45, "mode=compactor,chunk=32", 0.7, 32, 0, 0); }
/* f16, chunks of 64 (two whole, one of 36), a blend given, AdaKV's allocation */
static void test_blend_ada_f16(void) {
    check_blend(KVB_F16, 176, "25%", 44, "mode=compactor,chunk=64,blend=2,ada=1", 2.0, 64, 1, 0);
}
/* one chunk wider than the tokens (all padding past them), a token budget: blend 1 - B/n; then 76 tokens, 64
 * between the ends: two whole chunks of 32, none padded */
static void test_blend_one_padded_chunk(void) {
    check_blend(KVB_F32, 90, "30", 30, "mode=compactor,chunk=128", 1.0 - 30.0 / 90.0, 128, 0, 0);
    check_blend(KVB_F32, 76, "50%", 38, "mode=compactor,chunk=32", 0.5, 32, 0, 0);
}
/* mode=leverage under AdaKV: every token's raw leverage, the layer's heads compared */
static void test_leverage_ada(void) { check_blend(KVB_F32, 140, "30%", 42, "ada=1", 0, 0, 1, 1); }

/* 10 tokens, every one at an end (8 + 2): all tie at the layer's top, each head keeps the first B */
static void test_blend_all_ends(void) {
    char err[256];
    int32_t ids[10];
    for (int i = 0; i < 10; i++) ids[i] = 3 + i * 7;
    kvb_ctx *c = util_tiny_ctx(KVB_F32, CTX);
    kvb_method *m = util_make_method("compactor", c, "30%", "mode=compactor");
    CU_ASSERT_FATAL(kvb_method_prefill(m, c, ids, 10, err, sizeof err) == 0);
    int32_t pos[CTX];
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) {
            CU_ASSERT_EQUAL_FATAL(util_head_positions(c, l, g, pos), 3);
            CU_ASSERT(pos[0] == 0 && pos[1] == 1 && pos[2] == 2);
        }
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

/* the window must hold every query between the ends; fewer rows fail the end of prefill naming it */
static void test_blend_window_too_small(void) {
    char err[256];
    int32_t ids[100];
    for (int i = 0; i < 100; i++) ids[i] = 3 + (i * 37) % 290;
    kvb_ctx *c = util_tiny_ctx(KVB_F32, CTX);
    kvb_method *m = util_make_method("compactor", c, "30%", "mode=compactor,window=50");
    CU_ASSERT(kvb_method_prefill(m, c, ids, 100, err, sizeof err) != 0);
    CU_ASSERT(strstr(err, "observation window holds 50") != NULL);
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
    util_check_refusals("compactor", c, "mode=blend", "mode must be leverage or compactor");
    util_check_refusals("compactor", c, "chunk=64", "chunk goes with mode=compactor");
    util_check_refusals("compactor", c, "alpha=0.3", "no option 'alpha'"); /* alpha with ada=1 only */
    util_check_refusals("compactor", c, "mode=compactor,window=0", "window must be in");
    kvb_opts o = {0};
    CU_ASSERT(kvb_opts_add(&o, "mode=compactor,window=300", err, sizeof err) == 0);
    CU_ASSERT(kvb_method_needs_of("compactor", &o, &nd, err, sizeof err) == 0 && nd.obs_window == 300);
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
    CU_add_test(s, "mode=compactor: CompactorPress's blend as float64, chunks of 32 (f32)", test_blend_f32);
    CU_add_test(s, "mode=compactor, ada=1: AdaKV's allocation of the blend as float64 (f16)", test_blend_ada_f16);
    CU_add_test(s, "mode=compactor: one chunk wider than the prompt, a token budget", test_blend_one_padded_chunk);
    CU_add_test(s, "mode=compactor: a window short of the prompt fails naming it", test_blend_window_too_small);
    CU_add_test(s, "mode=compactor: a prompt of ends only keeps each head's first tokens", test_blend_all_ends);
    CU_add_test(s, "mode=leverage, ada=1: AdaKV's allocation of the leverage as float64", test_leverage_ada);
    CU_add_test(s, "needs and options", test_needs_and_options);
    return util_run_suites();
}
