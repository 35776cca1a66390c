/* test_expected_attention.c — ExpectedAttention on a tiny random model and hand-built KV states and query windows,
 * against a float64 restatement of kvpress's ExpectedAttentionPress score with its defaults (use_covariance=True,
 * use_vnorm=True): the window's queries derotated (R(-pos)), their mean and covariance carried by the mean of kvpress's
 * RoPE matrices over positions n .. n+F-1 (cos/sin averaged per frequency), one softmax per query head over the slots
 * after the sinks of mu.k / sqrt(d) + k^T S' k / 2d, averaged over the group, plus epsilon, times ||v||; the sinks
 * kept, the top B kept (ties to the earlier token) — on f32 and f16 stores, with a window that covers the whole
 * prompt (kvpress's statistics exactly) and one that does not; each term alone and the mean term only (cov=0
 * vnorm=0); through the engine at 25/50/75% the prefill ends at the verified budget and decode appends; budget 100%
 * keeps everything. Device-tier memory is read and written only through the backend, so the suite also runs under
 * KVB_GUARD=1 (test_expected_attention_guard). The reference checks run again on a qwen2 model (NEOX RoPE pairs). */
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

enum { L = 4, NH = 4, NKV = 2, HD = 16, E = NH * HD, FF = 48, V = 300, CTX = 512, G = NH / NKV };

static uint64_t rng = 23;

static float frand(float s) { return util_frand(&rng, s); }

/* Every layer gets n random tokens at positions 0..n-1, as if prefilled; keys share a direction, as real keys do, and
 * vary most in the slowest-turning pair (the last: llama's adjacent pairs), which the RoPE average leaves standing. */
static void fill_store(kvb_ctx *c, int64_t n) {
    char err[256];
    const int kvd = NKV * HD;
    float *k = malloc((size_t)n * kvd * sizeof *k), *v = malloc((size_t)n * kvd * sizeof *v);
    int32_t *pos = malloc((size_t)n * sizeof *pos);
    for (int l = 0; l < L; l++) {
        for (int64_t i = 0; i < n * kvd; i++) {
            k[i] = frand(i % HD >= HD - 2 ? 2.0f : 1.0f) + (i % HD < 2 ? 1.0f : 0.0f);
            v[i] = frand(1.0f);
        }
        for (int64_t i = 0; i < n; i++) pos[i] = (int32_t)i;
        CU_ASSERT_FATAL(kvc_append(c->kv, l, n, k, v, pos, NULL, err, sizeof err) == 0);
    }
    c->n_past = n;
    free(k), free(v), free(pos);
}

/* The observation window: the last w query rows of every layer, at positions n - w .. n - 1 (written through the
 * backend); returns the host copy [L][w][E]. Queries share a direction in the slowest pair, so the expected query is not
 * averaged away by the future rotations and the scores are far from uniform. */
static float *fill_window(kvb_ctx *c, int64_t n, int w) {
    size_t bytes = (size_t)L * c->obs_cap * E * sizeof(float);
    float *all = calloc(1, bytes), *rows = malloc((size_t)L * w * E * sizeof *rows);
    int32_t *pos = malloc((size_t)w * sizeof *pos);
    for (int l = 0; l < L; l++)
        for (int t = 0; t < w; t++)
            for (int i = 0; i < E; i++)
                all[((size_t)l * c->obs_cap + t) * E + i] = rows[((size_t)l * w + t) * E + i] =
                    frand(1.0f) + (i % HD >= HD - 2 ? 3.0f : 0.0f);
    for (int t = 0; t < w; t++) pos[t] = (int32_t)(n - w + t);
    util_dev_write(c->be, c->obs_q, all, bytes);
    util_dev_write(c->be, c->obs_pos, pos, (size_t)w * sizeof *pos);
    c->obs_n = w;
    free(all), free(pos);
    return rows;
}

/* Pair i of a head: its two elements (NEOX: i and i + n_rot/2; else 2i and 2i + 1) and its frequency. */
static void pair_of(const kvb_config *cfg, int i, int *a, int *b, double *theta) {
    *a = cfg->rope_neox ? i : 2 * i;
    *b = cfg->rope_neox ? i + cfg->n_rot / 2 : 2 * i + 1;
    *theta = pow((double)cfg->rope.freq_base, -2.0 * i / cfg->n_rot);
}

/* x rotated by the average RoPE matrix over n .. n + F - 1 (cos and sin averaged per pair) */
static void avg_rope(const kvb_config *cfg, const double *x, int64_t n, int F, double *out) {
    memcpy(out, x, HD * sizeof *x);
    for (int i = 0; i < cfg->n_rot / 2; i++) {
        int a, b;
        double th, cbar = 0, sbar = 0;
        pair_of(cfg, i, &a, &b, &th);
        for (int p = 0; p < F; p++) cbar += cos((double)(n + p) * th) / F, sbar += sin((double)(n + p) * th) / F;
        out[a] = cbar * x[a] - sbar * x[b];
        out[b] = sbar * x[a] + cbar * x[b];
    }
}

/* kvpress's options: the covariance term, the value norms and epsilon */
typedef struct {
    int cov, vnorm;
    double eps;
} ea_terms;
static const ea_terms MEAN_ONLY = {0, 0, 0}, FULL = {1, 1, 0};

/* kvpress's score of layer l's KV head g (n slots; keys K, values Vr, dtype dt) from the window rows q[w][E] at
 * positions n - w + t: mean mu and covariance S of the derotated queries, carried by the average RoPE matrix R over
 * n .. n + F - 1; softmax over the slots from `sinks` on of (R mu) . k / sqrt(d) [+ k^T R S R^T k / 2d with cov],
 * summed over the group [with vnorm: averaged, plus eps, times ||v||]; the sinks get +inf. */
static void reference(const kvb_config *cfg, const float *q, int w, int64_t n, int g, const void *K, const void *Vr,
                      kvb_dtype dt, int sinks, int F, ea_terms tm, double *score) {
    for (int64_t j = 0; j < n; j++) score[j] = j < sinks ? INFINITY : 0;
    double (*xs)[HD] = malloc((size_t)w * sizeof *xs);
    for (int r = 0; r < G; r++) {
        const int h = g * G + r;
        double mu[HD] = {0}, mup[HD];
        for (int t = 0; t < w; t++) {
            double x[HD];
            for (int e = 0; e < HD; e++) x[e] = q[(size_t)t * E + h * HD + e];
            const double p = (double)(n - w + t);
            for (int i = 0; i < cfg->n_rot / 2; i++) { /* R(-p) */
                int a, b;
                double th;
                pair_of(cfg, i, &a, &b, &th);
                double xa = x[a], xb = x[b], cs = cos(p * th), sn = sin(p * th);
                x[a] = cs * xa + sn * xb;
                x[b] = -sn * xa + cs * xb;
            }
            for (int e = 0; e < HD; e++) mu[e] += x[e] / w, xs[t][e] = x[e];
        }
        avg_rope(cfg, mu, n, F, mup);
        for (int t = 0; t < w && tm.cov; t++) { /* the centred queries, carried by R: S' = (1/w) sum_t u_t u_t^T */
            double ct[HD];
            for (int e = 0; e < HD; e++) ct[e] = xs[t][e] - mu[e];
            avg_rope(cfg, ct, n, F, xs[t]);
        }
        double *lg = malloc((size_t)n * sizeof *lg), mx = -INFINITY, sum = 0;
        for (int64_t j = sinks; j < n; j++) {
            double d = 0;
            for (int e = 0; e < HD; e++) d += mup[e] * util_elem(K, dt, (size_t)j * HD + e);
            lg[j] = d / sqrt((double)HD);
            for (int t = 0; t < w && tm.cov; t++) {
                double u = 0;
                for (int e = 0; e < HD; e++) u += xs[t][e] * util_elem(K, dt, (size_t)j * HD + e);
                lg[j] += u * u / w / HD / 2;
            }
            if (lg[j] > mx) mx = lg[j];
        }
        for (int64_t j = sinks; j < n; j++) sum += exp(lg[j] - mx);
        for (int64_t j = sinks; j < n; j++) score[j] += exp(lg[j] - mx) / sum;
        free(lg);
    }
    for (int64_t j = sinks; j < n && tm.vnorm; j++) {
        double vv = 0;
        for (int e = 0; e < HD; e++) vv += util_elem(Vr, dt, (size_t)j * HD + e) * util_elem(Vr, dt, (size_t)j * HD + e);
        score[j] = (score[j] / G + tm.eps) * sqrt(vv);
    }
    free(xs);
}

/* n tokens, a window of `obs` rows of which the method reads min(obs, window, n - sinks); B kept per head. */
static void check_terms_match_reference(kvb_dtype dt, int64_t n, int obs, int window, int sinks, int F, int64_t B,
                                        ea_terms tm) {
    char err[256], opts[128], budget[16];
    kvb_ctx *c = util_tiny_ctx(dt, CTX);
    snprintf(opts, sizeof opts, "window=%d,sinks=%d,future=%d,cov=%d,vnorm=%d,eps=%g", window, sinks, F, tm.cov, tm.vnorm,
             tm.eps);
    snprintf(budget, sizeof budget, "%lld", (long long)B);
    kvb_method *m = util_make_method("expected", c, budget, opts);
    CU_ASSERT_FATAL(c->obs_cap >= obs);
    fill_store(c, n);
    float *rows = fill_window(c, n, obs);
    int w = obs < window ? obs : window;
    if (w > n - sinks) w = (int)(n - sinks);
    int32_t *want = malloc((size_t)L * NKV * B * sizeof *want);
    double *score = malloc((size_t)n * sizeof *score);
    int near_ties = 0;
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) {
            util_kv_head hv = util_kv_head_copy(c->kv, l, g);
            double margin = 1, kth = 1;
            reference(&c->model->cfg, rows + ((size_t)l * obs + (obs - w)) * E, w, n, g, hv.k, hv.v, dt, sinks, F, tm,
                      score);
            util_topk_ref(score, n, B, want + ((size_t)l * NKV + g) * B, &margin, &kth);
            if (getenv("EA_DEBUG")) fprintf(stderr, "l%d g%d margin %.3g kth %.3g\n", l, g, margin, kth);
            near_ties += margin < 1e-4 * kth; /* f32 probabilities: ~1e-7 relative */
            util_kv_head_free(&hv);
        }
    CU_ASSERT_EQUAL(near_ties, 0); /* no boundary a float rounding could flip */
    CU_ASSERT_FATAL(kvb_ctx_end_prefill(c, err, sizeof err) == 0);
    CU_ASSERT(kvb_method_verify(m, c, 1, err, sizeof err) == 0);
    int32_t pos[CTX];
    int mismatches = 0;
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) {
            CU_ASSERT_EQUAL_FATAL(util_head_positions(c, l, g, pos), B);
            mismatches += memcmp(pos, want + ((size_t)l * NKV + g) * B, (size_t)B * sizeof *pos) != 0;
        }
    CU_ASSERT_EQUAL(mismatches, 0);
    free(want), free(score), free(rows);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

/* kvpress's defaults (the covariance term and the value norms) */
static void check_matches_reference(kvb_dtype dt, int64_t n, int obs, int window, int sinks, int F, int64_t B) {
    check_terms_match_reference(dt, n, obs, window, sinks, F, B, FULL);
}

/* ada=1 (kvpress's leaderboard row, AdaKV over ExpectedAttention): per layer, each head's top floor(alpha B) of the
 * reference score guaranteed (+inf), then the top B x NKV of all heads together (ties: lower head, then lower slot). */
static void check_ada_matches_reference(kvb_dtype dt, int64_t n, int obs, int sinks, int64_t B, double alpha) {
    char err[256], opts[96], budget[16];
    kvb_ctx *c = util_tiny_ctx(dt, CTX);
    snprintf(opts, sizeof opts, "window=%d,sinks=%d,ada=1,alpha=%g", obs, sinks, alpha);
    snprintf(budget, sizeof budget, "%lld", (long long)B);
    kvb_method *m = util_make_method("expected", c, budget, opts);
    fill_store(c, n);
    float *rows = fill_window(c, n, obs);
    const int w = obs < n - sinks ? obs : (int)(n - sinks);
    const int64_t f = (int64_t)(alpha * (double)B);
    double *all = malloc((size_t)NKV * n * sizeof *all);
    int32_t *top = malloc((size_t)NKV * B * sizeof *top), *safe = malloc((size_t)(f ? f : 1) * sizeof *safe);
    int32_t want[L][NKV][CTX], nwant[L][NKV];
    int near_ties = 0, uneven = 0;
    for (int l = 0; l < L; l++) {
        for (int g = 0; g < NKV; g++) {
            util_kv_head hv = util_kv_head_copy(c->kv, l, g);
            double *row = all + (size_t)g * n;
            reference(&c->model->cfg, rows + ((size_t)l * obs + (obs - w)) * E, w, n, g, hv.k, hv.v, dt, sinks, 512,
                      (ea_terms){1, 1, 1e-2}, row);
            if (f) util_topk_ref(row, n, f, safe, NULL, NULL);
            for (int64_t i = 0; i < f; i++) row[safe[i]] = INFINITY;
            util_kv_head_free(&hv);
        }
        double margin = 1, kth = 1;
        util_topk_ref(all, NKV * n, NKV * B, top, &margin, &kth);
        near_ties += isfinite(margin) && margin < 1e-4 * kth;
        for (int g = 0; g < NKV; g++) nwant[l][g] = 0;
        for (int64_t i = 0; i < NKV * B; i++) {
            int g = (int)(top[i] / n);
            want[l][g][nwant[l][g]++] = (int32_t)(top[i] % n);
        }
        uneven += nwant[l][0] != B;
    }
    CU_ASSERT_EQUAL(near_ties, 0);
    CU_ASSERT(uneven > 0); /* the heads really hold different counts somewhere */
    CU_ASSERT_FATAL(kvb_ctx_end_prefill(c, err, sizeof err) == 0);
    CU_ASSERT(kvb_method_verify(m, c, 1, err, sizeof err) == 0);
    int32_t pos[CTX];
    int mismatches = 0;
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) {
            int64_t got = util_head_positions(c, l, g, pos);
            mismatches += got != nwant[l][g] || memcmp(pos, want[l][g], (size_t)got * sizeof *pos) != 0;
        }
    CU_ASSERT_EQUAL(mismatches, 0);
    char desc[128];
    m->def->describe(m, desc, sizeof desc);
    CU_ASSERT(strstr(desc, "ada=1 alpha=") != NULL);
    free(all), free(top), free(safe), free(rows);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

static void test_ada_shares_the_layer_budget_f32(void) { check_ada_matches_reference(KVB_F32, 120, 32, 4, 30, 0.2); }
static void test_ada_shares_the_layer_budget_f16(void) { check_ada_matches_reference(KVB_F16, 100, 24, 0, 40, 0.5); }

/* window 64 >= n - sinks (the option raised): the statistics of every query but the sinks, as kvpress takes them */
static void test_whole_prompt_statistics_f32(void) { check_matches_reference(KVB_F32, 60, 60, 64, 4, 512, 20); }
static void test_whole_prompt_statistics_f16(void) { check_matches_reference(KVB_F16, 60, 60, 64, 4, 512, 20); }
/* the last 16 rows of 120 tokens, no sinks, a short future */
static void test_recent_window_statistics(void) { check_matches_reference(KVB_F32, 120, 16, 16, 0, 32, 30); }
static void test_recent_window_statistics_sinks(void) { check_matches_reference(KVB_F16, 120, 32, 32, 8, 100, 50); }
/* cov=0 vnorm=0: the mean term alone (kvpress's use_covariance=False, use_vnorm=False) */
static void test_mean_term_only(void) {
    check_terms_match_reference(KVB_F32, 120, 32, 32, 4, 512, 30, MEAN_ONLY);
    check_terms_match_reference(KVB_F16, 60, 60, 64, 4, 512, 20, MEAN_ONLY);
}
/* one term at a time, and epsilon */
static void test_covariance_or_value_norms_alone(void) {
    check_terms_match_reference(KVB_F32, 120, 32, 32, 4, 512, 30, (ea_terms){1, 0, 0});
    check_terms_match_reference(KVB_F32, 120, 32, 32, 4, 512, 30, (ea_terms){0, 1, 0.05});
}

/* Through the engine at 25/50/75%: the prefill ends at the budget (verified), the sinks are kept, each decode step
 * appends one token. */
static void test_engine_budgets_hold_decode_appends(void) {
    char err[256];
    const char *budgets[] = {"25%", "50%", "75%"};
    const int64_t keeps[] = {38, 75, 113}; /* of 150, rounded */
    int32_t ids[150];
    for (int i = 0; i < 150; i++) ids[i] = 3 + (i * 37) % 290;
    for (int b = 0; b < 3; b++) {
        kvb_ctx *c = util_tiny_ctx(KVB_F16, CTX);
        kvb_method *m = util_make_method("expected", c, budgets[b], NULL);
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
                CU_ASSERT(pos[0] == 0 && pos[3] == 3);                            /* the sinks */
                CU_ASSERT(pos[keeps[b]] == 150 && pos[keeps[b] + 2] == 152); /* the decoded tokens */
            }
        char desc[128], want[128];
        m->def->describe(m, desc, sizeof desc);
        snprintf(want, sizeof want, "window=32 sinks=4 future=512 cov=1 vnorm=1 eps=0 keep=%lld", (long long)keeps[b]);
        CU_ASSERT_STRING_EQUAL(desc, want);
        kvb_method_free(m, c);
        kvb_ctx_free(c);
    }
}

static void test_full_budget_keeps_everything(void) {
    char err[256];
    kvb_ctx *c = util_tiny_ctx(KVB_F32, CTX);
    kvb_method *m = util_make_method("expected", c, "100%", NULL);
    fill_store(c, 64);
    free(fill_window(c, 64, 8));
    CU_ASSERT_FATAL(kvb_ctx_end_prefill(c, err, sizeof err) == 0);
    CU_ASSERT(kvb_method_verify(m, c, 1, err, sizeof err) == 0);
    int32_t pos[CTX];
    for (int l = 0; l < L; l++) CU_ASSERT_EQUAL(util_head_positions(c, l, 1, pos), 64);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

/* A budget under the sinks keeps the first tokens. */
static void test_budget_under_the_sinks_keeps_the_first(void) {
    char err[256];
    kvb_ctx *c = util_tiny_ctx(KVB_F32, CTX);
    kvb_method *m = util_make_method("expected", c, "3", "sinks=6");
    fill_store(c, 50);
    free(fill_window(c, 50, 8));
    CU_ASSERT_FATAL(kvb_ctx_end_prefill(c, err, sizeof err) == 0);
    int32_t pos[CTX];
    for (int l = 0; l < L; l++)
        CU_ASSERT(util_head_positions(c, l, 0, pos) == 3 && pos[0] == 0 && pos[1] == 1 && pos[2] == 2);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

static void test_needs_and_options(void) {
    char err[256];
    kvb_method_needs nd;
    CU_ASSERT(kvb_method_needs_of("expected", NULL, &nd, err, sizeof err) == 0 && nd.needs_budget && nd.shares_prefill &&
              nd.obs_window == 32 && !nd.prefill_scores && !nd.own_prefill && !nd.profile);
    kvb_opts o = {0};
    CU_ASSERT_FATAL(kvb_opts_add(&o, "window=16", err, sizeof err) == 0);
    CU_ASSERT(kvb_method_needs_of("expected", &o, &nd, err, sizeof err) == 0 && nd.obs_window == 16);
    kvb_ctx *c = util_tiny_ctx(KVB_F32, CTX);
    util_check_refusals("expected", c, "kernel=3", "no option 'kernel'");
    util_check_refusals("expected", c, "window=0", "window must be in");
    util_check_refusals("expected", c, "future=0", "future must be in");
    util_check_refusals("expected", c, "alpha=0.3", "no option 'alpha'"); /* alpha goes with ada=1 */
    util_check_refusals("expected", c, "ada=2", "ada must be 0 or 1");
    kvb_ctx_free(c);
}

/* The same checks on a qwen2 model: NEOX pairs (i, i + d/2), its own RoPE base. */
static void test_neox_pairs_match_reference(void) {
    CU_ASSERT_FATAL(util_tiny->cfg.rope_neox);
    check_matches_reference(KVB_F32, 60, 60, 64, 4, 512, 20);
    check_matches_reference(KVB_F16, 120, 32, 32, 8, 100, 50);
}

static void test_neox_engine_budget_holds(void) {
    char err[256];
    int32_t ids[150];
    for (int i = 0; i < 150; i++) ids[i] = 3 + (i * 37) % 290;
    kvb_ctx *c = util_tiny_ctx(KVB_F16, CTX);
    kvb_method *m = util_make_method("expected", c, "50%", NULL);
    CU_ASSERT_FATAL(kvb_method_prefill(m, c, ids, 150, err, sizeof err) == 0);
    int32_t id = 9, pos[CTX];
    CU_ASSERT_FATAL(kvb_forward(c, &id, 1, err, sizeof err) == 0);
    CU_ASSERT(kvb_method_verify(m, c, 0, err, sizeof err) == 0);
    for (int l = 0; l < L; l++) CU_ASSERT(util_head_positions(c, l, 1, pos) == 76 && pos[75] == 150);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

static char qdir[64], qpath[128];

static int setup_qwen2(void) {
    snprintf(qdir, sizeof qdir, "/tmp/kvb_expected_qwen2_XXXXXX");
    if (!mkdtemp(qdir)) return -1;
    snprintf(qpath, sizeof qpath, "%s/tiny.gguf", qdir);
    gw_random r = {rng, 0.5f, NULL};
    gw_tiny t = {"qwen2", L, E, NH, NKV, FF, V, CTX, 0, NULL, gw_random_tensor, &r};
    int rc = gw_write_tiny(&t, qpath);
    free(r.buf);
    rng = r.state;
    char err[256];
    util_tiny = rc ? NULL : kvb_model_load(qpath, err, sizeof err);
    return util_tiny ? 0 : -1;
}

static int teardown_qwen2(void) {
    kvb_model_free(util_tiny);
    util_tiny = NULL;
    unlink(qpath);
    rmdir(qdir);
    return 0;
}

static int setup(void) {
    const util_tiny_shape shape = {"expected", L, E, NH, NKV, FF, V, CTX};
    return util_tiny_setup(&shape, &rng);
}

static int teardown(void) { return util_tiny_teardown(); }

int main(void) {
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("expected", setup, teardown);
    CU_add_test(s, "whole-prompt statistics: kvpress's float64 score, top B (f32)", test_whole_prompt_statistics_f32);
    CU_add_test(s, "whole-prompt statistics: kvpress's float64 score, top B (f16)", test_whole_prompt_statistics_f16);
    CU_add_test(s, "recent-window statistics, no sinks, short future", test_recent_window_statistics);
    CU_add_test(s, "recent-window statistics with 8 sinks (f16)", test_recent_window_statistics_sinks);
    CU_add_test(s, "cov=0 vnorm=0: the mean term alone, as float64", test_mean_term_only);
    CU_add_test(s, "the covariance term alone; the value norms alone with eps", test_covariance_or_value_norms_alone);
    CU_add_test(s, "through the engine at 25/50/75%: budget held, sinks kept, decode appends",
                test_engine_budgets_hold_decode_appends);
    CU_add_test(s, "budget 100% keeps everything", test_full_budget_keeps_everything);
    CU_add_test(s, "a budget under the sinks keeps the first tokens", test_budget_under_the_sinks_keeps_the_first);
    CU_add_test(s, "ada=1: AdaKV's allocation of the float64 scores among the heads (f32)", test_ada_shares_the_layer_budget_f32);
    CU_add_test(s, "ada=1: AdaKV's allocation of the float64 scores among the heads (f16)", test_ada_shares_the_layer_budget_f16);
    CU_add_test(s, "needs and options", test_needs_and_options);
    CU_pSuite q = CU_add_suite("expected on qwen2 (NEOX RoPE)", setup_qwen2, teardown_qwen2);
    CU_add_test(q, "NEOX pairs: kvpress's float64 score, top B (f32, f16)", test_neox_pairs_match_reference);
    CU_add_test(q, "NEOX: through the engine at 50%, budget held", test_neox_engine_budget_holds);
    return util_run_suites();
}
