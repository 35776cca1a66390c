/* test_finch.c — Finch on a tiny random model against a float64 restatement of the paper's chunked prefill: the
 * test prefills the context chunk by chunk itself and feeds the question (the prompt's last tokens) after each
 * chunk; a hook captures each layer's queries and keys, and each cached slot scores the float64 sum over the KV
 * head's query heads and the question's rows of their causal softmax; the top B - |question| are kept (host lists)
 * and the question's KV dropped before the next chunk, which takes its positions; after the last chunk the
 * question's KV stays. The method must end with the same positions in every layer and KV head. Also: the prefill
 * never held the whole prompt (its reported peak is the restatement's and under full's), the extra prefill it
 * reports is the question's tokens per compressing step, a shared prefill adopted and a plain prefill ended (a
 * dialogue's rounds) each equal the method's own prefill, decode appends, budget 100% is the plain prefill, bad
 * options are refused. Device-tier memory is read only through the backend, so the suite also runs under
 * KVB_GUARD=1 (test_finch_guard). `test_finch MODEL.gguf` runs the restatement on another model (CTest:
 * test_finch_gemma3, the seeded gemma3 model whose sliding-window layers put the question on a fork; its global
 * layers compared, at 120 tokens). */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util_common.h"
#include "util_method.h"
#include "engine/model.h"
#include "methods/method.h"

enum { L = 4, NH = 4, NKV = 2, HD = 16, E = NH * HD, FF = 48, V = 300, CTX = 1024 };
enum { N = 300, CHUNK = 64, Q = 8, B = 90, BC = B - Q }; /* "30%" of 300 tokens; chunk=64 question=8 */
enum { MAXL = 64, MAXKV = 16, MAXB = CTX }; /* the other model's room (test_finch MODEL.gguf) */

/* the model under test: the tiny one, or a seeded one with sliding-window layers given on the command line, where
 * the question runs on a fork and only the global layers are compared */
static kvb_model *model;
static int nl, nh, nkv, hd, grp;
static int64_t b_all, b_ctx; /* B and B - Q per global layer on the model under test */

static kvb_ctx *new_ctx(kvb_dtype dt) {
    if (model == util_tiny) return util_tiny_ctx(dt, CTX);
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

static int windowed(int l) { return kvb_layer_window(&model->cfg, l) != 0; }

static uint64_t rng = 41;

/* A boundary closer than this could be flipped by the engine's f32 sums: scores are sums of 16 probabilities of
 * about 1/100, each rounded to ~1e-9, so 1e-7 is a hundred times their error (the seeded prompt's closest boundary
 * is 8e-7). */
#define TIE 1e-7

static void prompt_ids(int32_t *ids) {
    const int span = (model->cfg.n_vocab < 293 ? model->cfg.n_vocab : 293) - 3; /* ids 3 .. 292 on the tiny model */
    for (int i = 0; i < N; i++) ids[i] = 3 + (int32_t)((i * 61 + (i * i) % 23) % span);
}

/* the reference's scores while the question runs: per layer, KV head and slot */
static double ref[MAXL][MAXKV][CTX];
static int capturing;
static kvb_dtype ref_dt;

static int capture(void *self, kvb_ctx *d, int layer, const float *q, int64_t n_q, char *err, size_t err_len) {
    (void)self, (void)err, (void)err_len;
    if (!capturing) return 0;
    if (windowed(layer)) return 0;
    float *qh = malloc((size_t)n_q * nh * hd * sizeof *qh);
    util_dev_read(d->be, qh, q, (size_t)n_q * nh * hd * sizeof *qh);
    const double scale = d->model->cfg.attn_scale;
    for (int g = 0; g < nkv; g++) {
        util_kv_head hv = util_kv_head_copy(d->kv, layer, g);
        double *p = malloc((size_t)hv.n * sizeof *p);
        for (int r = g * grp; r < (g + 1) * grp; r++)
            for (int64_t t = 0; t < n_q; t++) {
                const float *qr = qh + ((size_t)t * nh + r) * hd;
                double mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j < hv.n; j++) {
                    p[j] = NAN;
                    if (hv.pos[j] > d->pos[t]) continue; /* causal */
                    double s = 0;
                    for (int e = 0; e < hd; e++) s += (double)qr[e] * util_elem(hv.k, ref_dt, (size_t)j * hd + e);
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

/* Keep the top b_ctx of the first m slots by ref, then `tail` slots after them, in every global layer and KV head of
 * c. */
static int reference_keep(kvb_ctx *c, int64_t m, int64_t tail) {
    char err[256];
    int near_ties = 0;
    for (int l = 0; l < nl; l++)
        for (int g = 0; g < nkv && !windowed(l); g++) {
            int32_t keep[CTX];
            double margin = 1;
            util_topk_ref(ref[l][g], m, b_ctx, keep, &margin, NULL);
            near_ties += margin < TIE;
            for (int64_t i = 0; i < tail; i++) keep[b_ctx + i] = (int32_t)(m + i);
            CU_ASSERT_FATAL(kvc_retain(c->kv, l, g, keep, b_ctx + tail, err, sizeof err) == 0);
        }
    return near_ties;
}

/* Slots per KV head of the first global layer. */
static int64_t global_n(kvb_ctx *c) {
    for (int l = 0; l < nl; l++)
        if (!windowed(l)) return kvc_n(c->kv, l, 0);
    return 0;
}

/* The paper's chunked prefill restated (without sliding-window layers the question runs in place and leaves with
 * the evicted; with them, on a fork): the kept positions per global layer and head into want; the most KV bytes held
 * at any step; the question tokens fed before the last step. */
static int64_t reference_finch(const int32_t *ids, kvb_dtype dt, int32_t want[MAXL][MAXKV][MAXB], int64_t *peak) {
    char err[256];
    ref_dt = dt;
    int any_window = 0;
    for (int l = 0; l < nl; l++) any_window |= windowed(l);
    kvb_ctx *c = new_ctx(dt);
    kvb_hooks h = {.pre_attend = capture};
    CU_ASSERT_FATAL(kvb_ctx_set_hooks(c, &h, err, sizeof err) == 0);
    const int64_t ctx_n = N - Q;
    int64_t fed = 0;
    int near_ties = 0;
    *peak = 0;
    for (int64_t start = 0; start < ctx_n; start += CHUNK) {
        const int64_t end = start + CHUNK < ctx_n ? start + CHUNK : ctx_n, m0 = global_n(c);
        CU_ASSERT_FATAL(kvb_forward(c, ids + start, end - start, err, sizeof err) == 0);
        const int64_t m = m0 + (end - start);
        memset(ref, 0, sizeof ref);
        if (kvc_used_bytes(c->kv, KVB_TIER_DEVICE) > *peak) *peak = kvc_used_bytes(c->kv, KVB_TIER_DEVICE);
        if (end == ctx_n) {
            capturing = 1;
            CU_ASSERT_FATAL(kvb_forward(c, ids + ctx_n, Q, err, sizeof err) == 0);
            capturing = 0;
            if (kvc_used_bytes(c->kv, KVB_TIER_DEVICE) > *peak) *peak = kvc_used_bytes(c->kv, KVB_TIER_DEVICE);
            if (m > b_ctx) near_ties += reference_keep(c, m, Q);
            break;
        }
        if (m <= b_ctx) continue;
        if (any_window) { /* on a fork: the context's windows are the chunks' alone */
            kvb_ctx *d = kvb_ctx_fork(c, 0, err, sizeof err);
            CU_ASSERT_FATAL(d != NULL && kvb_ctx_set_hooks(d, &h, err, sizeof err) == 0);
            capturing = 1;
            CU_ASSERT_FATAL(kvb_forward(d, ids + ctx_n, Q, err, sizeof err) == 0);
            capturing = 0;
            int64_t both = kvc_used_bytes(c->kv, KVB_TIER_DEVICE) + kvc_used_bytes(d->kv, KVB_TIER_DEVICE);
            if (both > *peak) *peak = both;
            kvb_ctx_free(d);
            fed += Q;
            near_ties += reference_keep(c, m, 0);
            continue;
        }
        capturing = 1;
        CU_ASSERT_FATAL(kvb_forward(c, ids + ctx_n, Q, err, sizeof err) == 0); /* right after the chunk */
        capturing = 0;
        if (kvc_used_bytes(c->kv, KVB_TIER_DEVICE) > *peak) *peak = kvc_used_bytes(c->kv, KVB_TIER_DEVICE);
        fed += Q;
        near_ties += reference_keep(c, m, 0); /* the question's slots are not kept */
        c->n_past = end;                      /* the next chunk takes the question's positions */
    }
    CU_ASSERT_EQUAL(near_ties, 0); /* no boundary a float rounding could flip (TIE) */
    for (int l = 0; l < nl; l++)
        for (int g = 0; g < nkv && !windowed(l); g++) CU_ASSERT_EQUAL_FATAL(util_head_positions(c, l, g, want[l][g]), b_all);
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
    static int32_t want[MAXL][MAXKV][MAXB];
    int32_t ids[N];
    prompt_ids(ids);
    kvb_ctx *c = new_ctx(dt);
    /* 30% of the tiny model's cache; on a hybrid one a share leaves its few global layers little, so 120 tokens */
    kvb_method *m = util_make_method("finch", c, model == util_tiny ? "30%" : "120", "chunk=64,question=8");
    CU_ASSERT_FATAL(kvb_method_budget_tokens(m, N, &b_all, err, sizeof err) == 0); /* kvbench's rule for B */
    b_ctx = b_all - Q;
    int64_t peak_ref = 0;
    const int64_t fed = reference_finch(ids, dt, want, &peak_ref);
    CU_ASSERT_FATAL(kvb_method_prefill(m, c, ids, N, err, sizeof err) == 0); /* verified at the end of prefill */
    int32_t pos[CTX];
    int mismatches = 0;
    for (int l = 0; l < nl; l++)
        for (int g = 0; g < nkv && !windowed(l); g++) {
            CU_ASSERT_EQUAL_FATAL(util_head_positions(c, l, g, pos), b_all);
            mismatches += memcmp(pos, want[l][g], (size_t)b_all * sizeof *pos) != 0;
            for (int i = 0; i < Q; i++) CU_ASSERT(pos[b_ctx + i] == N - Q + i); /* the question stays */
        }
    CU_ASSERT_EQUAL(mismatches, 0);
    CU_ASSERT_EQUAL(described(m, "extra_prefill_tokens="), fed);
    CU_ASSERT(fed > 0);
    int64_t full = 0; /* full attention's KV of the prompt: a local layer holds its window */
    for (int l = 0; l < nl; l++) full += kvb_full_tokens_at(&model->cfg, l, N) * nkv * kvc_slot_bytes(c->kv);
    const int64_t peak = described(m, "peak_kv_bytes=");
    CU_ASSERT_EQUAL(peak, peak_ref); /* the store's peak, as the restatement measured it */
    /* the cache never held the whole prompt; with sliding-window layers the question's fork holds a second copy,
     * which on this short prompt reaches full's */
    if (model == util_tiny) CU_ASSERT(peak < full);
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

/* A prompt the session prefilled itself (a dialogue's rounds) is prefilled again chunk by chunk at the end of
 * prefill: the same cache and next tokens as the method's own prefill. */
static void test_end_of_prefill_reprefills_a_plain_prefill(void) {
    char err[256];
    int32_t ids[N];
    prompt_ids(ids);
    kvb_ctx *a = util_tiny_ctx(KVB_F16, CTX), *b = util_tiny_ctx(KVB_F16, CTX);
    kvb_method *ma = util_make_method("finch", a, "30%", "chunk=64,question=8");
    kvb_method *mb = util_make_method("finch", b, "30%", "chunk=64,question=8");
    CU_ASSERT_FATAL(kvb_method_prefill(ma, a, ids, N, err, sizeof err) == 0);
    CU_ASSERT_FATAL(kvb_forward(b, ids, 100, err, sizeof err) == 0 && kvb_forward(b, ids + 100, N - 100, err, sizeof err) == 0);
    CU_ASSERT_FATAL(kvb_ctx_end_prefill(b, err, sizeof err) == 0);
    CU_ASSERT(!b->in_prefill && b->n_past == N);
    CU_ASSERT(kvb_method_verify(mb, b, 1, err, sizeof err) == 0);
    int32_t pa[CTX], pb[CTX];
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) {
            CU_ASSERT_EQUAL_FATAL(util_head_positions(a, l, g, pa), util_head_positions(b, l, g, pb));
            CU_ASSERT(memcmp(pa, pb, B * sizeof *pa) == 0);
        }
    CU_ASSERT(memcmp(a->logits, b->logits, (size_t)V * sizeof *a->logits) == 0);
    kvb_method_free(mb, b);
    kvb_method_free(ma, a);
    kvb_ctx_free(b);
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

static void bind_model(kvb_model *m) {
    model = m;
    nl = m->cfg.n_layer, nh = m->cfg.n_head, nkv = m->cfg.n_head_kv, hd = m->cfg.head_dim, grp = nh / nkv;
}

static int setup(void) {
    const util_tiny_shape shape = {"finch", L, E, NH, NKV, FF, V, CTX};
    if (util_tiny_setup(&shape, &rng)) return -1;
    bind_model(util_tiny);
    return 0;
}

static int teardown(void) { return util_tiny_teardown(); }

static char other_path[1024];
static int other_setup(void) {
    char err[256];
    kvb_model *m = kvb_model_load(other_path, err, sizeof err);
    if (!m) return fprintf(stderr, "%s\n", err), -1;
    if (m->cfg.n_layer > MAXL || m->cfg.n_head_kv > MAXKV || m->cfg.n_vocab < 16) {
        fprintf(stderr, "%s: over the test's room\n", other_path);
        kvb_model_free(m);
        return -1;
    }
    bind_model(m);
    return 0;
}

static int other_teardown(void) {
    kvb_model_free(model);
    return 0;
}

int main(int argc, char **argv) {
    CU_initialize_registry();
    if (argc == 2) { /* a seeded model with sliding-window layers (CTest: arch_models/gemma3.gguf) */
        snprintf(other_path, sizeof other_path, "%s", argv[1]);
        CU_pSuite o = CU_add_suite("finch on another model", other_setup, other_teardown);
        CU_add_test(o, "the paper's chunked prefill, as float64 (f32)", test_paper_chunked_prefill_f32);
        return util_run_suites();
    }
    CU_pSuite s = CU_add_suite("finch", setup, teardown);
    CU_add_test(s, "the paper's chunked prefill, as float64 (f32)", test_paper_chunked_prefill_f32);
    CU_add_test(s, "the paper's chunked prefill, as float64 (f16)", test_paper_chunked_prefill_f16);
    CU_add_test(s, "a shared prefill adopted equals the own prefill", test_adopted_shared_prefill_equals_own);
    CU_add_test(s, "a plain prefill is prefilled again chunk by chunk at its end", test_end_of_prefill_reprefills_a_plain_prefill);
    CU_add_test(s, "through the engine: prefill at the budget, decode appends", test_decode_appends_after_the_kept);
    CU_add_test(s, "budget 100% is the plain prefill", test_full_budget_is_the_plain_prefill);
    CU_add_test(s, "needs and options", test_needs_and_options);
    return util_run_suites();
}
