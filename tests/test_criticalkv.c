/* test_criticalkv.c — CriticalKV on a tiny random model and hand-built KV states and query windows, against a float64
 * restatement of kvpress's CriticalKVPress and CriticalAdaKVPress over SnapKV's scores: per layer and KV head, the base
 * score (SnapKV's pooled window attention, as kvb_snap_score gives it, over window x G: kvpress's mean; the window
 * above every other), stage 1 its top floor(first B) kept, stage 2 the rest by (score + eps) x mean over the group of
 * ||W_o^r v_j||_1 (W_o as the engine dequantizes it), ties to the earlier token; base=adakv: the safeguard and AdaKV's
 * budgets per head first. On f32 and f16 stores; through the engine at 25/50/75% the prefill ends at the verified
 * budget and decode appends; budget 100% keeps everything. Device-tier memory is read and written only through the
 * backend, so the suite also runs under KVB_GUARD=1 (test_criticalkv_guard). */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util_common.h"
#include "util_method.h"
#include "engine/model.h"
#include "methods/method.h"
#include "methods/snapkv.h"

enum { L = 4, NH = 4, NKV = 2, HD = 16, E = NH * HD, FF = 48, V = 300, CTX = 512, G = NH / NKV };

static uint64_t rng = 41;

static float frand(float s) { return util_frand(&rng, s); }

/* Every layer gets n random tokens at positions 0..n-1, as if prefilled; values of varied scale per token. */
static void fill_store(kvb_ctx *c, int64_t n) {
    char err[256];
    const int kvd = NKV * HD;
    float *k = malloc((size_t)n * kvd * sizeof *k), *v = malloc((size_t)n * kvd * sizeof *v);
    int32_t *pos = malloc((size_t)n * sizeof *pos);
    for (int l = 0; l < L; l++) {
        for (int64_t t = 0; t < n; t++) {
            const float vs = 1.5f + frand(1.2f);
            for (int i = 0; i < kvd; i++) k[t * kvd + i] = frand(1.5f), v[t * kvd + i] = vs * frand(1.0f);
        }
        for (int64_t i = 0; i < n; i++) pos[i] = (int32_t)i;
        CU_ASSERT_FATAL(kvc_append(c->kv, l, n, k, v, pos, NULL, err, sizeof err) == 0);
    }
    c->n_past = n;
    free(k), free(v), free(pos);
}

/* the observation window: the last w query rows of every layer, at positions n - w .. n - 1 */
static void fill_window(kvb_ctx *c, int64_t n, int w) {
    size_t bytes = (size_t)L * c->obs_cap * E * sizeof(float);
    float *all = calloc(1, bytes);
    int32_t *pos = malloc((size_t)w * sizeof *pos);
    for (int l = 0; l < L; l++)
        for (int t = 0; t < w; t++)
            for (int i = 0; i < E; i++) all[((size_t)l * c->obs_cap + t) * E + i] = frand(2.0f);
    for (int t = 0; t < w; t++) pos[t] = (int32_t)(n - w + t);
    util_dev_write(c->be, c->obs_q, all, bytes);
    util_dev_write(c->be, c->obs_pos, pos, (size_t)w * sizeof *pos);
    c->obs_n = w;
    free(all), free(pos);
}

/* the base scores of layer l, [NKV][n]: SnapKV's pooled scores / (w G) (kvb_snap_score, read back), the window +inf */
static void base_scores(kvb_ctx *c, int l, int64_t n, int w, double *out) {
    char err[256];
    kvb_snap_opts p = {w, 7, 0};
    const int64_t np = n - w;
    const size_t bytes = (size_t)NKV * np * sizeof(float);
    float *score = kvb_method_alloc(c, bytes), *pooled = kvb_method_alloc(c, bytes), *host = malloc(bytes);
    CU_ASSERT_FATAL(kvb_snap_score(c, l, n, w, &p, score, pooled, err, sizeof err) == 0);
    util_dev_read(c->be, host, pooled, bytes);
    for (int g = 0; g < NKV; g++)
        for (int64_t j = 0; j < n; j++) out[g * n + j] = j < np ? host[g * np + j] / ((double)w * G) : INFINITY;
    kvb_method_release(c, score, bytes), kvb_method_release(c, pooled, bytes);
    free(host);
}

/* mean over KV head g's query heads of ||W_o^r v_j||_1, W_o: [E][E] (rows n_embd, columns q_dim) */
static void value_norms(const float *wo, const util_kv_head *hv, kvb_dtype dt, int64_t n, int g, double *pn) {
    for (int64_t j = 0; j < n; j++) {
        pn[j] = 0;
        for (int r = 0; r < G; r++) {
            const int h = g * G + r;
            double s = 0;
            for (int i = 0; i < E; i++) {
                double d = 0;
                for (int e = 0; e < HD; e++) d += (double)wo[(size_t)i * E + h * HD + e] * util_elem(hv->v, dt, (size_t)(j * HD + e));
                s += fabs(d);
            }
            pn[j] += s / G;
        }
    }
}

/* one head: stage 1 = top floor(first keep) of sc (set to +inf), then (sc + eps) pn, top keep into want; *near counts
 * a boundary within a float rounding */
static void refine_ref(double *sc, const double *pn, int64_t n, int64_t keep, double first, double eps, int32_t *want,
                       int *near) {
    const int64_t k1 = (int64_t)(first * (double)keep);
    int32_t *top = malloc((size_t)(n + 1) * sizeof *top);
    double margin = 1, kth = 1;
    if (k1 > 0) {
        util_topk_ref(sc, n, k1, top, &margin, &kth);
        *near += isfinite(kth) && margin < 1e-6 * kth; /* the base's own ties (max pooling) are exact: a margin of 0 */
        *near -= isfinite(kth) && margin == 0;
    }
    for (int64_t j = 0; j < n; j++) sc[j] = (sc[j] + eps) * pn[j];
    for (int64_t i = 0; i < k1; i++) sc[top[i]] = INFINITY;
    util_topk_ref(sc, n, keep, want, &margin, &kth);
    *near += isfinite(kth) && margin < 1e-5 * kth;
    free(top);
}

static void check_keeps(kvb_dtype dt, int ada, int64_t n, int w, int64_t B) {
    char err[256], opts[96], budget[16];
    kvb_ctx *c = util_tiny_ctx(dt, CTX);
    snprintf(opts, sizeof opts, "window=%d,base=%s", w, ada ? "adakv" : "snapkv");
    snprintf(budget, sizeof budget, "%lld", (long long)B);
    kvb_method *m = util_make_method("criticalkv", c, budget, opts);
    CU_ASSERT_FATAL(c->obs_cap >= w);
    fill_store(c, n);
    fill_window(c, n, w);
    static int32_t want[L][NKV][CTX];
    int64_t nwant[L][NKV];
    int near = 0, uneven = 0;
    double *sc = malloc((size_t)NKV * n * sizeof *sc), *pn = malloc((size_t)NKV * n * sizeof *pn);
    float *wo = malloc((size_t)E * E * sizeof *wo), *dwo = kvb_method_alloc(c, (size_t)E * E * sizeof *wo);
    int32_t rows[E], *top = malloc((size_t)NKV * n * sizeof *top);
    for (int i = 0; i < E; i++) rows[i] = i;
    for (int l = 0; l < L; l++) {
        c->be->get_rows(c->be, dwo, &c->model->layers[l].wo, rows, E); /* W_o as the engine dequantizes it */
        util_dev_read(c->be, wo, dwo, (size_t)E * E * sizeof *wo);
        base_scores(c, l, n, w, sc);
        for (int g = 0; g < NKV; g++) {
            util_kv_head hv = util_kv_head_copy(c->kv, l, g);
            value_norms(wo, &hv, dt, n, g, pn + g * n);
            util_kv_head_free(&hv);
        }
        for (int g = 0; g < NKV; g++) nwant[l][g] = B;
        if (ada) { /* the safeguard, then the layer's best B x NKV give each head its budget */
            const int64_t safe = (int64_t)(0.2 * (double)B);
            for (int g = 0; g < NKV && safe; g++) {
                util_topk_ref(sc + g * n, n, safe, top, NULL, NULL);
                for (int64_t i = 0; i < safe; i++) sc[g * n + top[i]] = INFINITY;
            }
            double margin = 1, kth = 1;
            util_topk_ref(sc, NKV * n, NKV * B, top, &margin, &kth);
            near += isfinite(kth) && margin < 1e-6 * kth && margin != 0;
            for (int g = 0; g < NKV; g++) nwant[l][g] = 0;
            for (int64_t i = 0; i < NKV * B; i++) nwant[l][top[i] / n]++;
            uneven += nwant[l][0] != B;
        }
        for (int g = 0; g < NKV; g++) refine_ref(sc + g * n, pn + g * n, n, nwant[l][g], 0.5, 1e-4, want[l][g], &near);
    }
    CU_ASSERT_EQUAL(near, 0); /* the seeded rows leave no boundary a float rounding could flip */
    if (ada) CU_ASSERT(uneven > 0);
    kvb_method_release(c, dwo, (size_t)E * E * sizeof *wo);
    CU_ASSERT_FATAL(kvb_ctx_end_prefill(c, err, sizeof err) == 0);
    CU_ASSERT(kvb_method_verify(m, c, 1, err, sizeof err) == 0);
    int32_t pos[CTX];
    int mismatches = 0;
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) {
            const int64_t got = util_head_positions(c, l, g, pos);
            mismatches += got != nwant[l][g] || memcmp(pos, want[l][g], (size_t)got * sizeof *pos) != 0;
        }
    CU_ASSERT_EQUAL(mismatches, 0);
    free(sc), free(pn), free(wo), free(top);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

static void test_snapkv_base_f32(void) { check_keeps(KVB_F32, 0, 150, 32, 50); }
static void test_snapkv_base_f16(void) { check_keeps(KVB_F16, 0, 120, 16, 70); }
static void test_adakv_base_f32(void) { check_keeps(KVB_F32, 1, 150, 32, 60); }
static void test_adakv_base_f16(void) { check_keeps(KVB_F16, 1, 120, 16, 40); }

static void test_engine_budgets_hold_decode_appends(void) {
    char err[256];
    const char *budgets[] = {"25%", "50%", "75%"};
    const int64_t keeps[] = {38, 75, 113}; /* of 150, rounded */
    int32_t ids[150];
    for (int i = 0; i < 150; i++) ids[i] = 3 + (i * 37) % 290;
    for (int b = 0; b < 3; b++)
        for (int ada = 0; ada < 2; ada++) {
            kvb_ctx *c = util_tiny_ctx(KVB_F16, CTX);
            kvb_method *m = util_make_method("criticalkv", c, budgets[b], ada ? "base=adakv" : NULL);
            CU_ASSERT_FATAL(kvb_method_prefill(m, c, ids, 150, err, sizeof err) == 0);
            for (int s = 0; s < 3; s++) {
                int32_t id = 9 + s;
                CU_ASSERT_FATAL(kvb_forward(c, &id, 1, err, sizeof err) == 0);
                CU_ASSERT(kvb_method_verify(m, c, 0, err, sizeof err) == 0);
            }
            int32_t pos[CTX];
            int64_t total = 0;
            for (int l = 0; l < L; l++)
                for (int g = 0; g < NKV; g++) {
                    const int64_t got = util_head_positions(c, l, g, pos);
                    total += got;
                    CU_ASSERT(pos[got - 1] == 152 && pos[got - 4] == 149); /* the window's last token, then decode */
                    if (!ada) CU_ASSERT_EQUAL(got, keeps[b] + 3);
                }
            CU_ASSERT_EQUAL(total, (int64_t)L * NKV * (keeps[b] + 3));
            kvb_method_free(m, c);
            kvb_ctx_free(c);
        }
}

static void test_full_budget_keeps_everything(void) {
    char err[256];
    kvb_ctx *c = util_tiny_ctx(KVB_F32, CTX);
    kvb_method *m = util_make_method("criticalkv", c, "100%", NULL);
    fill_store(c, 64);
    fill_window(c, 64, 32);
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
    CU_ASSERT(kvb_method_needs_of("criticalkv", NULL, &nd, err, sizeof err) == 0 && nd.needs_budget &&
              nd.shares_prefill && nd.obs_window == 32 && !nd.prefill_scores && !nd.own_prefill && !nd.profile);
    kvb_ctx *c = util_tiny_ctx(KVB_F32, CTX);
    util_check_refusals("criticalkv", c, "base=h2o", "base must be snapkv or adakv");
    util_check_refusals("criticalkv", c, "first=2", "must be in [0, 1]");
    util_check_refusals("criticalkv", c, "alpha=0.5", "no option 'alpha'"); /* alpha is base=adakv's */
    kvb_ctx_free(c);
}

static int setup(void) {
    const util_tiny_shape shape = {"criticalkv", L, E, NH, NKV, FF, V, CTX};
    return util_tiny_setup(&shape, &rng);
}

static int teardown(void) { return util_tiny_teardown(); }

int main(void) {
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("criticalkv", setup, teardown);
    CU_add_test(s, "base=snapkv: two stages over ||W_o v||_1, as float64 CriticalKVPress (f32)", test_snapkv_base_f32);
    CU_add_test(s, "base=snapkv: two stages over ||W_o v||_1, as float64 CriticalKVPress (f16)", test_snapkv_base_f16);
    CU_add_test(s, "base=adakv: head budgets, then two stages, as float64 CriticalAdaKVPress (f32)", test_adakv_base_f32);
    CU_add_test(s, "base=adakv: head budgets, then two stages, as float64 CriticalAdaKVPress (f16)", test_adakv_base_f16);
    CU_add_test(s, "through the engine at 25/50/75%: budget held, window kept, decode appends", test_engine_budgets_hold_decode_appends);
    CU_add_test(s, "budget 100% keeps everything", test_full_budget_keeps_everything);
    CU_add_test(s, "needs and options", test_needs_and_options);
    return util_run_suites();
}
