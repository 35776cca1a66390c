/* test_finch.c — Finch on a tiny random model against a float64 restatement of the paper's chunked prefill: the
 * test prefills the context chunk by chunk itself and feeds the question (the prompt's last tokens) after each chunk; a hook captures each layer's queries and keys, and each cached
 * slot scores the float64 sum over the KV head's query heads and the question's rows of their causal softmax; the
 * top B - |question| are kept (host lists) and the question's KV dropped before the next chunk, which takes its
 * positions; after the last chunk the question's KV stays. The method
 * must end with the same positions in every layer and KV head. Also: the prefill never held the whole prompt (its
 * reported peak is under full's and at least what the test's steps held), the extra prefill it reports is the
 * question's tokens per compressing step, a shared prefill adopted equals the method's own prefill, decode appends,
 * budget 100% is the plain prefill, bad options are refused. Device-tier memory is read only through the backend,
 * so the suite also runs under KVB_GUARD=1 (test_finch_guard). */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util_common.h"
#include "util_method.h"
#include "engine/model.h"
#include "methods/method.h"

enum { L = 4, NH = 4, NKV = 2, G = NH / NKV, HD = 16, E = NH * HD, FF = 48, V = 300, CTX = 1024 };
enum { N = 300, CHUNK = 64, Q = 8, B = 90, BC = B - Q }; /* "30%" of 300 tokens; chunk=64 question=8 */

static uint64_t rng = 41;

/* A boundary closer than this could be flipped by the engine's f32 sums: scores are sums of 16 probabilities of
 * about 1/100, each rounded to ~1e-9, so 1e-7 is a hundred times their error (the seeded prompt's closest boundary
 * is 8e-7). */
#define TIE 1e-7

static void prompt_ids(int32_t *ids) {
    for (int i = 0; i < N; i++) ids[i] = 3 + (int32_t)((i * 61 + (i * i) % 23) % 290);
}

/* the reference's scores while the question runs: per layer, KV head and slot */
static double ref[L][NKV][CTX];
static int capturing;
static kvb_dtype ref_dt;

static int capture(void *self, kvb_ctx *d, int layer, const float *q, int64_t n_q, char *err, size_t err_len) {
    (void)self, (void)err, (void)err_len;
    if (!capturing) return 0;
    float *qh = malloc((size_t)n_q * NH * HD * sizeof *qh);
    util_dev_read(d->be, qh, q, (size_t)n_q * NH * HD * sizeof *qh);
    const double scale = d->model->cfg.attn_scale;
    for (int g = 0; g < NKV; g++) {
        util_kv_head hv = util_kv_head_copy(d->kv, layer, g);
        double *p = malloc((size_t)hv.n * sizeof *p);
        for (int r = g * G; r < (g + 1) * G; r++)
            for (int64_t t = 0; t < n_q; t++) {
                const float *qr = qh + ((size_t)t * NH + r) * HD;
                double mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j < hv.n; j++) {
                    p[j] = NAN;
                    if (hv.pos[j] > d->pos[t]) continue; /* causal */
                    double s = 0;
                    for (int e = 0; e < HD; e++) s += (double)qr[e] * util_elem(hv.k, ref_dt, (size_t)j * HD + e);
                    p[j] = s * scale;
                    if (p[j] > mx) mx = p[j];
                }
                for (int64_t j = 0; j < hv.n; j++)
                    if (!isnan(p[j])) sum += exp(p[j] - mx);
                for (int64_t j = 0; j < hv.n; j++)
                    if (!isnan(p[j])) ref[layer][g][j] += exp(p[j] - mx) / sum;
            }
        free(p);
        util_kv_head_free(&hv);
    }
    free(qh);
    return 0;
}

/* Keep the top BC of the first m slots by ref, then `tail` slots after them, in every layer and KV head of c. */
static int reference_keep(kvb_ctx *c, int64_t m, int64_t tail) {
    char err[256];
    int near_ties = 0;
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) {
            int32_t keep[CTX];
            double margin = 1;
            util_topk_ref(ref[l][g], m, BC, keep, &margin, NULL);
            near_ties += margin < TIE;
            for (int64_t i = 0; i < tail; i++) keep[BC + i] = (int32_t)(m + i);
            CU_ASSERT_FATAL(kvc_retain(c->kv, l, g, keep, BC + tail, err, sizeof err) == 0);
        }
    return near_ties;
}

/* The paper's chunked prefill restated (the tiny model has no sliding-window layers: the question runs in place and
 * leaves with the evicted): the kept positions per layer and head into want; the most KV bytes held at any step;
 * the question tokens fed before the last step. */
static int64_t reference_finch(const int32_t *ids, kvb_dtype dt, int32_t want[L][NKV][B], int64_t *peak) {
    char err[256];
    ref_dt = dt;
    kvb_ctx *c = util_tiny_ctx(dt, CTX);
    kvb_hooks h = {.pre_attend = capture};
    CU_ASSERT_FATAL(kvb_ctx_set_hooks(c, &h, err, sizeof err) == 0);
    const int64_t ctx_n = N - Q;
    int64_t fed = 0;
    int near_ties = 0;
    *peak = 0;
    for (int64_t start = 0; start < ctx_n; start += CHUNK) {
        const int64_t end = start + CHUNK < ctx_n ? start + CHUNK : ctx_n, m0 = kvc_n(c->kv, 0, 0);
        CU_ASSERT_FATAL(kvb_forward(c, ids + start, end - start, err, sizeof err) == 0);
        const int64_t m = m0 + (end - start);
        memset(ref, 0, sizeof ref);
        if (kvc_used_bytes(c->kv, KVB_TIER_DEVICE) > *peak) *peak = kvc_used_bytes(c->kv, KVB_TIER_DEVICE);
        if (end == ctx_n) {
            capturing = 1;
            CU_ASSERT_FATAL(kvb_forward(c, ids + ctx_n, Q, err, sizeof err) == 0);
            capturing = 0;
            if (kvc_used_bytes(c->kv, KVB_TIER_DEVICE) > *peak) *peak = kvc_used_bytes(c->kv, KVB_TIER_DEVICE);
            near_ties += reference_keep(c, m, Q);
            break;
        }
        if (m <= BC) continue;
        capturing = 1;
        CU_ASSERT_FATAL(kvb_forward(c, ids + ctx_n, Q, err, sizeof err) == 0); /* right after the chunk */
        capturing = 0;
        if (kvc_used_bytes(c->kv, KVB_TIER_DEVICE) > *peak) *peak = kvc_used_bytes(c->kv, KVB_TIER_DEVICE);
        fed += Q;
        near_ties += reference_keep(c, m, 0); /* the question's slots are not kept */
        c->n_past = end;                      /* the next chunk takes the question's positions */
    }
    CU_ASSERT_EQUAL(near_ties, 0); /* no boundary a float rounding could flip (TIE) */
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) CU_ASSERT_EQUAL_FATAL(util_head_positions(c, l, g, want[l][g]), B);
    kvb_ctx_free(c);
    return fed;
}

static int64_t described(kvb_method *m, const char *key) {
    char desc[256];
    m->def->describe(m, desc, sizeof desc);
    const char *at = strstr(desc, key);
    CU_ASSERT_FATAL(at != NULL);
    return atoll(at + strlen(key));
}

static void check_paper_chunked_prefill(kvb_dtype dt) {
    char err[256];
    int32_t ids[N], want[L][NKV][B];
    prompt_ids(ids);
    int64_t peak_ref = 0;
    const int64_t fed = reference_finch(ids, dt, want, &peak_ref);
    kvb_ctx *c = util_tiny_ctx(dt, CTX);
    kvb_method *m = util_make_method("finch", c, "30%", "chunk=64,question=8");
    CU_ASSERT_FATAL(kvb_method_prefill(m, c, ids, N, err, sizeof err) == 0); /* verified at the end of prefill */
    int32_t pos[CTX];
    int mismatches = 0;
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) {
            CU_ASSERT_EQUAL_FATAL(util_head_positions(c, l, g, pos), B);
            mismatches += memcmp(pos, want[l][g], sizeof want[l][g]) != 0;
            for (int i = 0; i < Q; i++) CU_ASSERT(pos[BC + i] == N - Q + i); /* the question stays */
        }
    CU_ASSERT_EQUAL(mismatches, 0);
    CU_ASSERT_EQUAL(described(m, "extra_prefill_tokens="), fed);
    CU_ASSERT(fed > 0);
    const int64_t peak = described(m, "peak_kv_bytes="), full = kvc_full_bytes_for(c->kv, N);
    CU_ASSERT_EQUAL(peak, peak_ref); /* the store's peak, as the restatement measured it */
    CU_ASSERT(peak < full);           /* the cache never held the whole prompt */
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

static void test_paper_chunked_prefill_f32(void) { check_paper_chunked_prefill(KVB_F32); }
static void test_paper_chunked_prefill_f16(void) { check_paper_chunked_prefill(KVB_F16); }

/* A run's shared prefill, adopted: the same cache and the same next tokens as the method's own prefill. */
static void test_adopted_shared_prefill_equals_own(void) {
    char err[256];
    int32_t ids[N];
    prompt_ids(ids);
    kvb_ctx *a = util_tiny_ctx(KVB_F16, CTX);
    kvb_method *ma = util_make_method("finch", a, "30%", "chunk=64,question=8");
    CU_ASSERT_FATAL(kvb_method_prefill(ma, a, ids, N, err, sizeof err) == 0);
    kvb_ctx *base = util_tiny_ctx(KVB_F16, CTX);
    kvb_share *sh = kvb_share_create(base, 0, 0, err, sizeof err);
    CU_ASSERT_FATAL(sh != NULL && kvb_forward(base, ids, N, err, sizeof err) == 0);
    kvb_ctx *b = kvb_ctx_fork(base, 0, err, sizeof err);
    kvb_method *mb = util_make_method("finch", b, "30%", "chunk=64,question=8");
    CU_ASSERT_FATAL(kvb_method_adopt(mb, b, sh, err, sizeof err) == 0);
    int32_t pa[CTX], pb[CTX];
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) {
            CU_ASSERT_EQUAL_FATAL(util_head_positions(a, l, g, pa), util_head_positions(b, l, g, pb));
            CU_ASSERT(memcmp(pa, pb, B * sizeof *pa) == 0);
        }
    CU_ASSERT(memcmp(a->logits, b->logits, (size_t)V * sizeof *a->logits) == 0);
    CU_ASSERT_EQUAL(described(ma, "peak_kv_bytes="), described(mb, "peak_kv_bytes="));
    kvb_method_free(mb, b);
    kvb_ctx_free(b);
    kvb_share_free(sh, base);
    kvb_ctx_free(base);
    kvb_method_free(ma, a);
    kvb_ctx_free(a);
}

static void test_decode_appends_after_the_kept(void) {
    char err[256];
    int32_t ids[N];
    prompt_ids(ids);
    kvb_ctx *c = util_tiny_ctx(KVB_F16, CTX);
    kvb_method *m = util_make_method("finch", c, "50", NULL); /* question=32: 18 context tokens + the question */
    CU_ASSERT_FATAL(kvb_method_prefill(m, c, ids, N, err, sizeof err) == 0);
    for (int s = 0; s < 4; s++) {
        int32_t id = 9 + s;
        CU_ASSERT_FATAL(kvb_forward(c, &id, 1, err, sizeof err) == 0);
        CU_ASSERT(kvb_method_verify(m, c, 0, err, sizeof err) == 0);
    }
    int32_t pos[CTX];
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) {
            CU_ASSERT_EQUAL(util_head_positions(c, l, g, pos), 54);
            CU_ASSERT(pos[18] == N - 32 && pos[49] == N - 1); /* the question */
            CU_ASSERT(pos[50] == N && pos[53] == N + 3);      /* the decoded tokens */
        }
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

static void test_full_budget_is_the_plain_prefill(void) {
    char err[256];
    int32_t ids[N];
    prompt_ids(ids);
    kvb_ctx *a = util_tiny_ctx(KVB_F32, CTX), *b = util_tiny_ctx(KVB_F32, CTX);
    kvb_method *m = util_make_method("finch", a, "100%", NULL);
    CU_ASSERT_FATAL(kvb_method_prefill(m, a, ids, N, err, sizeof err) == 0);
    CU_ASSERT_FATAL(kvb_forward(b, ids, N, err, sizeof err) == 0);
    int32_t pos[CTX];
    for (int l = 0; l < L; l++) CU_ASSERT_EQUAL(util_head_positions(a, l, 1, pos), N);
    CU_ASSERT(memcmp(a->logits, b->logits, (size_t)V * sizeof *a->logits) == 0);
    CU_ASSERT_EQUAL(described(m, "extra_prefill_tokens="), 0);
    kvb_method_free(m, a);
    kvb_ctx_free(a);
    kvb_ctx_free(b);
}

static void test_needs_and_options(void) {
    char err[256];
    kvb_method_needs nd;
    CU_ASSERT(kvb_method_needs_of("finch", NULL, &nd, err, sizeof err) == 0 && nd.needs_budget && nd.shares_prefill &&
              !nd.obs_window && !nd.prefill_scores && !nd.own_prefill && !nd.profile);
    kvb_ctx *c = util_tiny_ctx(KVB_F32, CTX);
    util_check_refusals("finch", c, "chunk=0", "chunk=0");
    util_check_refusals("finch", c, "question=0", "question=0");
    util_check_refusals("finch", c, "window=4", "no option 'window'");
    kvb_ctx_free(c);
}

static int setup(void) {
    const util_tiny_shape shape = {"finch", L, E, NH, NKV, FF, V, CTX};
    return util_tiny_setup(&shape, &rng);
}

static int teardown(void) { return util_tiny_teardown(); }

int main(void) {
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("finch", setup, teardown);
    CU_add_test(s, "the paper's chunked prefill, as float64 (f32)", test_paper_chunked_prefill_f32);
    CU_add_test(s, "the paper's chunked prefill, as float64 (f16)", test_paper_chunked_prefill_f16);
    CU_add_test(s, "a shared prefill adopted equals the own prefill", test_adopted_shared_prefill_equals_own);
    CU_add_test(s, "through the engine: prefill at the budget, decode appends", test_decode_appends_after_the_kept);
    CU_add_test(s, "budget 100% is the plain prefill", test_full_budget_is_the_plain_prefill);
    CU_add_test(s, "needs and options", test_needs_and_options);
    return util_run_suites();
}
