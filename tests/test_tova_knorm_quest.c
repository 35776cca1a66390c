/* test_tova_knorm_quest.c — TOVA, Knorm and Quest on a tiny random model and hand-built KV states, each against
 * a float64 restatement of its rule: the new ops (row norms, page min/max, page scores, page expansion) against
 * float64 loops; TOVA's prefill keeps the top tokens of the last query's head-averaged attention plus the last
 * token and a decode step evicts the argmin (of the head mean, or per KV head with per_head=1); Knorm keeps exactly
 * the lowest key norms (f32 and f16 stores, with and without a recent window); Quest attends the last page plus the
 * top pages by sum_e max(q_e kmin_e, q_e kmax_e) and its attention output equals float64 attention over those
 * pages, while the whole cache stays resident with its metadata counted. Device-tier memory is read and written
 * only through the backend, so the suite also runs under KVB_GUARD=1 (test_tova_knorm_quest_guard). */
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
#include "engine/sampler.h"
#include "methods/method.h"

enum { L = 8, E = 32, NH = 4, NKV = 2, HD = 8, FF = 48, V = 300, CTX = 512, G = NH / NKV };

static uint64_t rng = 7;

static float frand(float s) { return util_frand(&rng, s); }

static kvb_ctx *new_ctx(kvb_dtype dt) { return util_tiny_ctx(dt, CTX); }

static kvb_method *make(const char *name, kvb_ctx *c, const char *budget, const char *opts) {
    return util_make_method(name, c, budget, opts);
}

/* Every layer gets n random tokens at positions 0..n-1, as if prefilled. */
static void fill_store(kvb_ctx *c, int64_t n) {
    char err[256];
    const int kvd = NKV * HD;
    float *k = malloc((size_t)n * kvd * sizeof *k), *v = malloc((size_t)n * kvd * sizeof *v);
    int32_t *pos = malloc((size_t)n * sizeof *pos);
    for (int l = 0; l < L; l++) {
        for (int64_t i = 0; i < n * kvd; i++) k[i] = frand(1.0f), v[i] = frand(1.0f);
        for (int64_t i = 0; i < n; i++) pos[i] = (int32_t)i;
        CU_ASSERT_FATAL(kvc_append(c->kv, l, n, k, v, pos, NULL, err, sizeof err) == 0);
    }
    c->n_past = n;
    free(k), free(v), free(pos);
}

/* ---- the ops against float64 ---- */

static void test_ops_match_float64(void) {
    char err[256];
    kvb_ctx *c = new_ctx(KVB_F32);
    kvb_backend *be = c->be;
    enum { N = 37, P = 8, NP = (N + P - 1) / P };
    float k32[N * HD];
    kvb_f16 k16[N * HD];
    for (int i = 0; i < N * HD; i++) k32[i] = frand(3.0f), k16[i] = kvb_f32_to_f16(k32[i]);
    /* row_norms, both dtypes, negated and not */
    for (int dt = 0; dt < 2; dt++) {
        float out[N];
        const void *k = dt ? (const void *)k16 : (const void *)k32;
        CU_ASSERT_FATAL(be->row_norms(be, out, k, dt ? KVB_F16 : KVB_F32, HD, N, dt, err, sizeof err) == 0);
        int bad = 0;
        for (int i = 0; i < N; i++) {
            double s = 0;
            for (int e = 0; e < HD; e++) s += util_elem(k, dt ? KVB_F16 : KVB_F32, (size_t)i * HD + e) * util_elem(k, dt ? KVB_F16 : KVB_F32, (size_t)i * HD + e);
            bad += out[i] != (float)(dt ? -sqrt(s) : sqrt(s));
        }
        CU_ASSERT_EQUAL(bad, 0);
    }
    /* block_minmax: all pages, then a partial rebuild from row 20 after rows 20.. change */
    float lo[NP * HD], hi[NP * HD];
    for (int i = 0; i < NP * HD; i++) lo[i] = hi[i] = NAN;
    CU_ASSERT_FATAL(be->block_minmax(be, lo, hi, k32, KVB_F32, HD, P, 0, 17, err, sizeof err) == 0);
    for (int i = 20 * HD; i < N * HD; i++) k32[i] = frand(3.0f);
    CU_ASSERT_FATAL(be->block_minmax(be, lo, hi, k32, KVB_F32, HD, P, 17, N, err, sizeof err) == 0);
    int bad = 0;
    for (int b = 0; b < NP; b++)
        for (int e = 0; e < HD; e++) {
            double mn = 1e300, mx = -1e300;
            for (int r = b * P; r < N && r < (b + 1) * P; r++) mn = fmin(mn, k32[r * HD + e]), mx = fmax(mx, k32[r * HD + e]);
            bad += lo[b * HD + e] != (float)mn || hi[b * HD + e] != (float)mx;
        }
    CU_ASSERT_EQUAL(bad, 0);
    /* block_scores: sum and max over a group of 3 query heads */
    float q[3 * HD], score[NP];
    for (int i = 0; i < 3 * HD; i++) q[i] = frand(2.0f);
    for (int gm = 0; gm < 2; gm++) {
        CU_ASSERT_FATAL(be->block_scores(be, score, q, lo, hi, 3, HD, NP, gm, err, sizeof err) == 0);
        bad = 0;
        for (int b = 0; b < NP; b++) {
            double acc = gm ? -1e300 : 0;
            for (int r = 0; r < 3; r++) {
                double u = 0;
                for (int e = 0; e < HD; e++) u += fmax((double)q[r * HD + e] * lo[b * HD + e], (double)q[r * HD + e] * hi[b * HD + e]);
                acc = gm ? fmax(acc, u) : acc + u;
            }
            bad += fabs(score[b] - acc) > 1e-6 * (1 + fabs(acc));
        }
        CU_ASSERT_EQUAL(bad, 0);
    }
    /* block_expand: pages {1, 3, 4} of 8, the last one cut to 5 rows */
    int32_t pages[3] = {1, 3, 4}, idx[21];
    CU_ASSERT_FATAL(be->block_expand(be, idx, pages, P, 21, err, sizeof err) == 0);
    bad = 0;
    for (int i = 0; i < 21; i++) bad += idx[i] != pages[i / P] * P + i % P;
    CU_ASSERT_EQUAL(bad, 0);
    kvb_ctx_free(c);
}

/* ---- TOVA ---- */

/* Prefill: the last query's attention (softmax over the prompt), summed over all heads (or a KV head's group),
 * keeps the top b - 1 earlier tokens + the last. */
static void check_tova_prefill(const char *opts, int per_head) {
    char err[256];
    kvb_ctx *c = new_ctx(KVB_F32);
    const int n = 90, b = 25;
    kvb_method *m = make("tova", c, "25", opts);
    fill_store(c, n);
    size_t obs_bytes = (size_t)L * c->obs_cap * E * sizeof(float);
    float *obs_q = calloc(1, obs_bytes);
    for (int l = 0; l < L; l++)
        for (int i = 0; i < E; i++) obs_q[(size_t)l * c->obs_cap * E + i] = frand(3.0f);
    int32_t last = n - 1;
    util_dev_write(c->be, c->obs_q, obs_q, obs_bytes);
    util_dev_write(c->be, c->obs_pos, &last, sizeof last);
    c->obs_n = 1;
    int32_t want[L][NKV][b];
    for (int l = 0; l < L; l++) {
        double score[NKV][n];
        memset(score, 0, sizeof score);
        for (int h = 0; h < NH; h++) {
            util_kv_head hv = util_kv_head_copy(c->kv, l, h / G);
            const float *qh = obs_q + (size_t)l * c->obs_cap * E + h * HD;
            double lg[n], mx = -1e300, sum = 0;
            for (int j = 0; j < n; j++) {
                double d = 0;
                for (int e = 0; e < HD; e++) d += (double)qh[e] * ((const float *)hv.k)[j * HD + e];
                lg[j] = d / sqrt((double)HD);
                mx = fmax(mx, lg[j]);
            }
            for (int j = 0; j < n; j++) sum += exp(lg[j] - mx);
            for (int g = 0; g < NKV; g++)
                if (!per_head || g == h / G)
                    for (int j = 0; j < n; j++) score[g][j] += exp(lg[j] - mx) / sum;
            util_kv_head_free(&hv);
        }
        for (int g = 0; g < NKV; g++) {
            util_topk_ref(score[g], n - 1, b - 1, want[l][g], NULL, NULL);
            want[l][g][b - 1] = n - 1;
        }
    }
    free(obs_q);
    CU_ASSERT_FATAL(kvb_ctx_end_prefill(c, err, sizeof err) == 0);
    CU_ASSERT(kvb_method_verify(m, c, 1, err, sizeof err) == 0);
    int32_t pos[CTX];
    int mismatches = 0, heads_differ = 0;
    for (int l = 0; l < L; l++) {
        for (int g = 0; g < NKV; g++) {
            CU_ASSERT_EQUAL_FATAL(util_head_positions(c, l, g, pos), b);
            mismatches += memcmp(pos, want[l][g], sizeof want[l][g]) != 0;
        }
        heads_differ += memcmp(want[l][0], want[l][1], sizeof want[l][0]) != 0;
    }
    CU_ASSERT_EQUAL(mismatches, 0);
    CU_ASSERT(per_head ? heads_differ > 0 : heads_differ == 0);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

static void test_tova_prefill_keeps_top_of_last_query_head_mean(void) { check_tova_prefill(NULL, 0); }
static void test_tova_prefill_per_head(void) { check_tova_prefill("per_head=1", 1); }

/* Decode: token 40 arrives on a full 10-token cache; hand-made probabilities of the current query put head group
 * 0's minimum on one token, group 1's on another and the mean's on a third: the default evicts the mean's argmin
 * from every KV head, per_head=1 each group's own. */
static void check_tova_evicts_argmin(const char *opts, int per_head) {
    char err[256];
    kvb_ctx *c = new_ctx(KVB_F32);
    kvb_method *m = make("tova", c, "10", opts);
    fill_store(c, 40); /* the prompt, cut to its last 10 tokens by hand */
    int32_t keep[10];
    for (int i = 0; i < 10; i++) keep[i] = 30 + i;
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) CU_ASSERT_FATAL(kvc_retain(c->kv, l, g, keep, 10, err, sizeof err) == 0);
    c->in_prefill = 0;
    m->n_prompt = 40;
    float k[NKV * HD] = {0}, v[NKV * HD] = {0};
    int32_t p40 = 40;
    for (int l = 0; l < L; l++) CU_ASSERT_FATAL(kvc_append(c->kv, l, 1, k, v, &p40, NULL, err, sizeof err) == 0);
    c->pos[0] = 40;
    CU_ASSERT(m->hooks.wants_probs(m, c, 3, 1) == 1);
    /* slots hold positions 30..40, weight 0.09 each except: group 0's heads 0.01 on 32 and 0.049 on 35, group 1's
     * 0.01 on 37 and 0.05 on 35; head sums 0.2 (32), 0.2 (37), 0.198 (35): 35 is the mean's argmin, 32 group 0's
     * and 37 group 1's */
    float probs[NH * 11];
    for (int h = 0; h < NH; h++) {
        int g = h / G;
        for (int j = 0; j < 11; j++) {
            int p = 30 + j;
            float w = 0.09f;
            if (p == (g ? 37 : 32)) w = 0.01f;
            if (p == 35) w = g ? 0.05f : 0.049f;
            probs[h * 11 + j] = w;
        }
    }
    kvb_src src[NKV];
    for (int l = 0; l < L; l++) {
        kvb_src_from_store(c, l, src);
        CU_ASSERT_FATAL(m->hooks.observe(m, c, l, src, probs, 11, 1, err, sizeof err) == 0);
    }
    c->n_past = 41;
    int32_t pos[CTX];
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) {
            CU_ASSERT_EQUAL_FATAL(util_head_positions(c, l, g, pos), 10);
            int gone = per_head ? (g ? 37 : 32) : 35, found = 0;
            for (int i = 0; i < 10; i++) found |= pos[i] == gone;
            CU_ASSERT(!found);
        }
    CU_ASSERT(kvb_method_verify(m, c, 0, err, sizeof err) == 0);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

static void test_tova_decode_evicts_head_mean_argmin(void) { check_tova_evicts_argmin(NULL, 0); }
static void test_tova_decode_per_head_evicts_each_argmin(void) { check_tova_evicts_argmin("per_head=1", 1); }

/* Through the engine: prefill then decode steps hold the budget every step (a token budget: fixed size). */
static void test_tova_engine_holds_budget(void) {
    char err[256];
    kvb_ctx *c = new_ctx(KVB_F16);
    kvb_method *m = make("tova", c, "30", NULL);
    int32_t ids[120];
    for (int i = 0; i < 120; i++) ids[i] = 3 + (i * 31) % 290;
    CU_ASSERT_FATAL(kvb_method_prefill(m, c, ids, 120, err, sizeof err) == 0);
    for (int s = 0; s < 5; s++) {
        int32_t id = 7 + s;
        CU_ASSERT_FATAL(kvb_forward(c, &id, 1, err, sizeof err) == 0);
        CU_ASSERT(kvb_method_verify(m, c, 0, err, sizeof err) == 0);
    }
    int32_t a[CTX], b[CTX];
    for (int l = 0; l < L; l++) { /* the head mean: every KV head holds the same tokens */
        CU_ASSERT_EQUAL(util_head_positions(c, l, 0, a), 30);
        CU_ASSERT_EQUAL(util_head_positions(c, l, 1, b), 30);
        CU_ASSERT(memcmp(a, b, 30 * sizeof *a) == 0);
    }
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

/* ---- Knorm ---- */

static void check_knorm(kvb_dtype dt, const char *opts, int window) {
    char err[256];
    kvb_ctx *c = new_ctx(dt);
    const int n = 80, b = 20;
    kvb_method *m = make("knorm", c, "25%", opts);
    fill_store(c, n);
    int32_t want[L][NKV][b];
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) {
            util_kv_head hv = util_kv_head_copy(c->kv, l, g);
            double neg[n];
            for (int j = 0; j < n; j++) {
                double s = 0;
                for (int e = 0; e < HD; e++) s += util_elem(hv.k, dt, (size_t)j * HD + e) * util_elem(hv.k, dt, (size_t)j * HD + e);
                neg[j] = -sqrt(s);
            }
            util_topk_ref(neg, n - window, b - window, want[l][g], NULL, NULL);
            for (int i = 0; i < window; i++) want[l][g][b - window + i] = n - window + i;
            util_kv_head_free(&hv);
        }
    CU_ASSERT_FATAL(kvb_ctx_end_prefill(c, err, sizeof err) == 0);
    CU_ASSERT(kvb_method_verify(m, c, 1, err, sizeof err) == 0);
    int32_t pos[CTX];
    int mismatches = 0;
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) {
            CU_ASSERT_EQUAL_FATAL(util_head_positions(c, l, g, pos), b);
            mismatches += memcmp(pos, want[l][g], sizeof want[l][g]) != 0;
        }
    CU_ASSERT_EQUAL(mismatches, 0);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

static void test_knorm_keeps_lowest_norms_f32(void) { check_knorm(KVB_F32, NULL, 0); }
static void test_knorm_keeps_lowest_norms_f16(void) { check_knorm(KVB_F16, NULL, 0); }
static void test_knorm_window_keeps_recent(void) { check_knorm(KVB_F32, "window=6", 6); }

/* ---- Quest ---- */

/* What one decode step's attention read and wrote, per layer (host copies). */
typedef struct {
    float q[L][NH * HD], out[L][NH * HD];
    int32_t slots[L][NKV][CTX];
    int64_t n[L][NKV];
} quest_seen;

static void quest_tap(void *user, const char *name, int layer, const float *data, int64_t n_rows, int64_t row_len) {
    quest_seen *s = user;
    if (layer < 0 || n_rows != 1 || row_len != NH * HD) return;
    if (!strcmp(name, "Qcur")) memcpy(s->q[layer], data, sizeof s->q[layer]);
    if (!strcmp(name, "kqv_out")) memcpy(s->out[layer], data, sizeof s->out[layer]);
}

static void quest_visible(void *user, kvb_ctx *c, int layer, const kvb_src *src, int64_t n_q) {
    quest_seen *s = user;
    if (c->in_prefill || n_q != 1) return;
    for (int h = 0; h < NKV; h++) {
        int64_t n = s->n[layer][h] = src[h].idx ? src[h].n_idx : src[h].n;
        CU_ASSERT_FATAL(n <= CTX);
        if (src[h].idx) util_dev_read(c->be, s->slots[layer][h], src[h].idx, (size_t)n * sizeof(int32_t));
        else
            for (int64_t i = 0; i < n; i++) s->slots[layer][h][i] = (int32_t)i;
    }
}

/* float64: the pages Quest should pick for KV head g (sorted slots) and attention over them for its query heads. */
static int quest_reference(const util_kv_head *hv, const float *q, int64_t b, int page, int32_t *slots, double *out) {
    const int64_t n = hv->n, np = (n + page - 1) / page, r = n - (np - 1) * page;
    const float *K = hv->k, *Vr = hv->v;
    double *u = calloc((size_t)np, sizeof *u);
    for (int64_t p = 0; p < np - 1; p++)
        for (int h = 0; h < G; h++)
            for (int e = 0; e < HD; e++) {
                double mn = 1e300, mx = -1e300;
                for (int64_t j = p * page; j < (p + 1) * page; j++) mn = fmin(mn, K[j * HD + e]), mx = fmax(mx, K[j * HD + e]);
                u[p] += fmax(q[h * HD + e] * mn, q[h * HD + e] * mx);
            }
    int64_t m = b > r ? (b - r + page / 2) / page : 0;
    if (m > np - 1) m = np - 1;
    int32_t *top = calloc((size_t)np, sizeof *top);
    util_topk_ref(u, (int)(np - 1), (int)m, top, NULL, NULL);
    top[m] = (int32_t)(np - 1);
    int k = 0;
    for (int64_t i = 0; i <= m; i++)
        for (int64_t j = top[i] * page; j < n && j < (top[i] + 1) * page; j++) slots[k++] = (int32_t)j;
    for (int h = 0; h < G; h++) { /* attention of query head h over the chosen slots */
        double lg[CTX], mx = -1e300, sum = 0;
        for (int i = 0; i < k; i++) {
            double d = 0;
            for (int e = 0; e < HD; e++) d += (double)q[h * HD + e] * K[slots[i] * HD + e];
            lg[i] = d / sqrt((double)HD);
            mx = fmax(mx, lg[i]);
        }
        for (int i = 0; i < k; i++) sum += exp(lg[i] - mx);
        for (int e = 0; e < HD; e++) {
            double o = 0;
            for (int i = 0; i < k; i++) o += exp(lg[i] - mx) / sum * Vr[slots[i] * HD + e];
            out[h * HD + e] = o;
        }
    }
    free(u);
    free(top);
    return k;
}

/* Decode steps through the engine on a 100-token prompt, budget 40 tokens: per sparse layer and KV head the
 * attended slots are the last page + round((40 - r) / 16) top pages by the float64 bound, and the attention
 * output equals float64 attention over them; the first two layers attend densely. */
static void test_quest_attends_top_pages_exactly(void) {
    char err[256];
    kvb_ctx *c = new_ctx(KVB_F32);
    kvb_method *m = make("quest", c, "40", NULL);
    int32_t ids[100];
    for (int i = 0; i < 100; i++) ids[i] = 3 + (i * 37) % 290;
    CU_ASSERT_FATAL(kvb_method_prefill(m, c, ids, 100, err, sizeof err) == 0);
    quest_seen *seen = calloc(1, sizeof *seen);
    c->tap = quest_tap, c->tap_user = seen;
    c->on_visible = quest_visible, c->on_visible_user = seen;
    int checked = 0, slots_wrong = 0;
    double worst = 0;
    for (int step = 0; step < 3; step++) {
        int32_t id = 11 + step;
        CU_ASSERT_FATAL(kvb_forward(c, &id, 1, err, sizeof err) == 0);
        CU_ASSERT(kvb_method_verify(m, c, 0, err, sizeof err) == 0);
        for (int l = 0; l < L; l++)
            for (int g = 0; g < NKV; g++) {
                util_kv_head hv = util_kv_head_copy(c->kv, l, g);
                int32_t want[CTX];
                double out[G * HD];
                int k = quest_reference(&hv, seen->q[l] + g * G * HD, l < 2 ? hv.n : 40, 16, want, out);
                CU_ASSERT_EQUAL_FATAL(seen->n[l][g], k);
                slots_wrong += memcmp(seen->slots[l][g], want, (size_t)k * sizeof *want) != 0;
                for (int i = 0; i < G * HD; i++) worst = fmax(worst, fabs(seen->out[l][g * G * HD + i] - out[i]));
                checked += l >= 2 && k < hv.n;
                util_kv_head_free(&hv);
            }
    }
    CU_ASSERT_EQUAL(slots_wrong, 0);
    CU_ASSERT(worst < 1e-5);
    CU_ASSERT_EQUAL(checked, 3 * (L - 2) * NKV); /* every sparse layer and head attended a subset */
    free(seen);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

/* Nothing is evicted; the measured device KV is the full cache plus the page metadata of the sparse layers. */
static void test_quest_keeps_everything_and_counts_metadata(void) {
    char err[256];
    kvb_ctx *c = new_ctx(KVB_F16);
    kvb_method *m = make("quest", c, "30%", "page=8,skip=1");
    int32_t ids[150];
    for (int i = 0; i < 150; i++) ids[i] = 3 + (i * 13) % 290;
    CU_ASSERT_FATAL(kvb_method_prefill(m, c, ids, 150, err, sizeof err) == 0);
    for (int s = 0; s < 11; s++) {
        int32_t id = 5 + s;
        CU_ASSERT_FATAL(kvb_forward(c, &id, 1, err, sizeof err) == 0);
    }
    CU_ASSERT(kvb_method_verify(m, c, 0, err, sizeof err) == 0);
    for (int l = 0; l < L; l++) CU_ASSERT_EQUAL(kvc_n(c->kv, l, 0), 161);
    int64_t pages = (161 + 7) / 8;
    CU_ASSERT_EQUAL(m->extra_device_bytes, (int64_t)(L - 1) * NKV * pages * 2 * HD * (int64_t)sizeof(float));
    /* a sparse layer attends about 30% of the sequence (151..161 tokens over the steps) */
    CU_ASSERT(fabs(kvb_ctx_mean_attended(c, 4) - 0.3 * 156) < 8.0); /* within half a page of 30% on average */
    CU_ASSERT(fabs(kvb_ctx_mean_attended(c, 0) - 156) < 1e-9);     /* dense: the mean of 151..161 */
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

/* Budget 100% (or above the sequence): every page, no index list: full attention token for token. */
static void test_quest_full_budget_is_full_attention(void) {
    char err[256];
    kvb_ctx *a = new_ctx(KVB_F32), *b = new_ctx(KVB_F32);
    kvb_method *m = make("quest", a, "100%", "skip=0");
    int32_t ids[70];
    for (int i = 0; i < 70; i++) ids[i] = 3 + (i * 7) % 290;
    CU_ASSERT_FATAL(kvb_method_prefill(m, a, ids, 70, err, sizeof err) == 0);
    CU_ASSERT_FATAL(kvb_forward(b, ids, 70, err, sizeof err) == 0);
    CU_ASSERT_FATAL(kvb_ctx_end_prefill(b, err, sizeof err) == 0);
    int same = 1;
    for (int s = 0; s < 6; s++) {
        int32_t id = 9 + s;
        CU_ASSERT_FATAL(kvb_forward(a, &id, 1, err, sizeof err) == 0);
        CU_ASSERT_FATAL(kvb_forward(b, &id, 1, err, sizeof err) == 0);
        same &= memcmp(a->logits, b->logits, (size_t)V * sizeof(float)) == 0;
    }
    CU_ASSERT(same);
    CU_ASSERT_EQUAL(m->extra_device_bytes, 0); /* nothing to choose: no metadata */
    kvb_method_free(m, a);
    kvb_ctx_free(a);
    kvb_ctx_free(b);
}

static void greedy(kvb_ctx *c, int32_t *out, int n) {
    char err[256];
    for (int i = 0; i < n; i++) {
        out[i] = sampler_argmax(c->logits, V);
        CU_ASSERT_FATAL(kvb_forward(c, &out[i], 1, err, sizeof err) == 0);
    }
}

/* A shared exact prefill (fork + adopt, as `kvbench run`) decodes as the method's own prefill does. */
static void test_shared_prefill_equals_own_prefill(void) {
    static const char *names[][2] = {{"tova", NULL}, {"tova", "per_head=1"}, {"knorm", NULL}, {"quest", "page=8"}};
    char err[256];
    int32_t ids[200];
    for (int i = 0; i < 200; i++) ids[i] = 3 + (i * 53) % 290;
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        kvb_ctx *a = new_ctx(KVB_F16);
        kvb_method *ma = make(names[k][0], a, "40%", names[k][1]);
        CU_ASSERT_FATAL(kvb_method_prefill(ma, a, ids, 200, err, sizeof err) == 0);
        int32_t ta[10], tb[10];
        kvb_kv_usage ua, ub;
        greedy(a, ta, 10);
        kvb_method_usage(ma, a, &ua);
        kvb_method_needs nd;
        kvb_opts o = {0};
        if (names[k][1]) CU_ASSERT_FATAL(kvb_opts_add(&o, names[k][1], err, sizeof err) == 0);
        CU_ASSERT_FATAL(kvb_method_needs_of(names[k][0], &o, &nd, err, sizeof err) == 0 && nd.shares_prefill);
        kvb_ctx *base = new_ctx(KVB_F16);
        kvb_share *sh = kvb_share_create(base, 32, nd.prefill_scores, err, sizeof err); /* a wider window than asked */
        CU_ASSERT_FATAL(sh != NULL && kvb_forward(base, ids, 200, err, sizeof err) == 0);
        kvb_ctx *b = kvb_ctx_fork(base, nd.obs_window, err, sizeof err);
        CU_ASSERT_FATAL(b != NULL);
        kvb_method *mb = make(names[k][0], b, "40%", names[k][1]);
        CU_ASSERT_FATAL(kvb_method_adopt(mb, b, sh, err, sizeof err) == 0);
        greedy(b, tb, 10);
        kvb_method_usage(mb, b, &ub);
        CU_ASSERT_EQUAL(ua.device_bytes, ub.device_bytes);
        CU_ASSERT(memcmp(ta, tb, sizeof ta) == 0);
        CU_ASSERT(kvb_method_verify(mb, b, 0, err, sizeof err) == 0);
        kvb_method_free(ma, a);
        kvb_method_free(mb, b);
        kvb_share_free(sh, base);
        kvb_ctx_free(a);
        kvb_ctx_free(b);
        kvb_ctx_free(base);
    }
}

static void test_options_and_needs(void) {
    char err[256];
    kvb_method_needs nd;
    CU_ASSERT(kvb_method_needs_of("tova", NULL, &nd, err, sizeof err) == 0 && nd.obs_window == 1 && nd.needs_budget &&
              nd.shares_prefill);
    CU_ASSERT(kvb_method_needs_of("knorm", NULL, &nd, err, sizeof err) == 0 && nd.obs_window == 0 && nd.needs_budget);
    CU_ASSERT(kvb_method_needs_of("quest", NULL, &nd, err, sizeof err) == 0 && nd.needs_budget && nd.shares_prefill);
    const char *bad[][2] = {{"tova", "per_head=2"}, {"knorm", "window=-1"}, {"quest", "page=0"},
                            {"quest", "group=mean"}, {"quest", "skip=99"}, {"quest", "pages=4"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kvb_ctx *c = new_ctx(KVB_F32);
        kvb_budget b = {KVB_BUDGET_FRACTION, 0.3, 0};
        kvb_opts o = {0};
        CU_ASSERT_FATAL(kvb_opts_add(&o, bad[i][1], err, sizeof err) == 0);
        err[0] = 0;
        CU_ASSERT(kvb_method_create(bad[i][0], c, &b, &o, err, sizeof err) == NULL && err[0]);
        kvb_ctx_free(c);
    }
}

static int setup(void) {
    const util_tiny_shape shape = {"tkq", L, E, NH, NKV, FF, V, CTX};
    return util_tiny_setup(&shape, &rng);
}

static int teardown(void) { return util_tiny_teardown(); }

int main(void) {
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("tova_knorm_quest", setup, teardown);
    CU_add_test(s, "ops: row norms, page min/max, page scores, page expansion vs float64", test_ops_match_float64);
    CU_add_test(s, "tova prefill keeps the top of the last query's head mean + the last token",
                test_tova_prefill_keeps_top_of_last_query_head_mean);
    CU_add_test(s, "tova prefill per_head=1 ranks by each group", test_tova_prefill_per_head);
    CU_add_test(s, "tova decode evicts the head mean's argmin from every head", test_tova_decode_evicts_head_mean_argmin);
    CU_add_test(s, "tova decode per_head=1 evicts each group's argmin", test_tova_decode_per_head_evicts_each_argmin);
    CU_add_test(s, "tova through the engine holds its budget, heads alike", test_tova_engine_holds_budget);
    CU_add_test(s, "knorm keeps the lowest key norms (f32)", test_knorm_keeps_lowest_norms_f32);
    CU_add_test(s, "knorm keeps the lowest key norms (f16)", test_knorm_keeps_lowest_norms_f16);
    CU_add_test(s, "knorm window=6 keeps the recent tokens too", test_knorm_window_keeps_recent);
    CU_add_test(s, "quest attends the last page + top pages, output = float64 attention over them",
                test_quest_attends_top_pages_exactly);
    CU_add_test(s, "quest keeps everything, counts its metadata", test_quest_keeps_everything_and_counts_metadata);
    CU_add_test(s, "quest at 100% is full attention token for token", test_quest_full_budget_is_full_attention);
    CU_add_test(s, "shared prefill = own prefill", test_shared_prefill_equals_own_prefill);
    CU_add_test(s, "options and needs", test_options_and_needs);
    return util_run_suites();
}
