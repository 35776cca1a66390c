/* test_pyr_adakv.c — PyramidKV and AdaKV (methods/pyramidkv.c, methods/adakv.c) where the right answer is known:
 * PyramidKV's per-layer budgets sum to exactly n_layer x budget, never grow upwards and stay within a token of
 * the paper's real-valued arithmetic sequence; each PyramidKV layer keeps what SnapKV keeps at that layer's
 * budget; AdaKV's per-head allocation equals a float64 restatement of its rule (floor, then the best of all
 * heads together; ties, a head left with its floor) on hand-built scores and on the model's own SnapKV scores;
 * with alpha = 1 AdaKV is SnapKV; the store holds different lengths per head and the layer's sum is the budget.
 * The two data ops AdaKV adds (fill_idx_f32, split_rows_idx) against plain loops. Device memory moves through
 * the backend only, so the suite also runs under KVB_GUARD=1 (test_pyr_adakv_guard). */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util_common.h"
#include "util_gguf_writer.h"
#include "engine/model.h"
#include "methods/method.h"
#include "methods/snapkv.h"

enum { L = 8, E = 32, NH = 4, NKV = 2, HD = 8, FF = 48, V = 300, CTX = 512, N_IDS = 300 };

static kvb_model *model;
static char model_path[256];
static int32_t ids[N_IDS];

/* ---- PyramidKV's budgets ---- */

static void check_pyramid(int n_layer, int64_t n, int64_t budget, int64_t w, double beta) {
    int64_t keep[64];
    kvb_pyramid_budgets(n_layer, n, budget, w, beta, keep);
    int64_t sum = 0, want = budget < n ? budget : n;
    for (int l = 0; l < n_layer; l++) {
        sum += keep[l];
        CU_ASSERT(keep[l] <= n && keep[l] >= (w < want ? w : want));
        if (l) CU_ASSERT(keep[l] <= keep[l - 1]);
    }
    CU_ASSERT_EQUAL(sum, (int64_t)n_layer * want);
    if (budget >= n || budget <= w || n_layer == 1) {
        for (int l = 0; l < n_layer; l++) CU_ASSERT_EQUAL(keep[l], want);
        return;
    }
    /* the paper's sequence in float64: top P/beta, bottom 2P - top (capped at the prefix), linear between */
    double P = (double)(budget - w), top = P / beta, bottom = 2 * P - top;
    if (bottom > (double)(n - w)) bottom = (double)(n - w), top = 2 * P - bottom;
    for (int l = 0; l < n_layer; l++) {
        double x = w + bottom - (bottom - top) * l / (n_layer - 1);
        CU_ASSERT(fabs((double)keep[l] - x) < 1.0);
        if (!(fabs((double)keep[l] - x) < 1.0))
            fprintf(stderr, "\n  L=%d n=%lld B=%lld layer %d: %lld, sequence %.3f\n", n_layer, (long long)n,
                    (long long)budget, l, (long long)keep[l], x);
    }
}

static void test_pyramid_budgets_sum_to_the_budget_and_fall_from_bottom_to_top(void) {
    check_pyramid(30, 4000, 1200, 32, 20); /* the default model at 30% of 4000 tokens */
    check_pyramid(30, 901, 270, 32, 20);
    check_pyramid(30, 1000, 600, 32, 20); /* bottom capped at the prefix */
    check_pyramid(30, 1000, 999, 64, 20);
    check_pyramid(7, 101, 37, 5, 3.5);
    check_pyramid(8, 120, 30, 8, 1); /* beta 1: uniform */
    check_pyramid(32, 5000, 2048, 0, 20);
    check_pyramid(1, 100, 30, 8, 20);
    check_pyramid(30, 100, 8, 8, 20);   /* budget within the window: uniform */
    check_pyramid(30, 100, 150, 8, 20); /* budget over the prompt: nothing evicted */
    int64_t keep[30];
    kvb_pyramid_budgets(30, 4000, 1200, 32, 20, keep);
    CU_ASSERT(keep[0] > 2000 && keep[29] < 120); /* the pyramid's ends: 2P - P/beta + w and P/beta + w */
}

/* ---- the two data ops ---- */

static void *dev_alloc(kvb_backend *be, size_t bytes) { return be->allocator->alloc(be->allocator->user, KVB_TIER_DEVICE, bytes); }
static void dev_free(kvb_backend *be, void *p, size_t bytes) { be->allocator->free(be->allocator->user, KVB_TIER_DEVICE, p, bytes); }

static void test_fill_idx_and_split_rows_idx_are_the_plain_loops(void) {
    char err[256];
    kvb_backend *be = kvb_backend_create("cpu", 1, err, sizeof err);
    CU_ASSERT_FATAL(be != NULL);
    enum { ROWS = 4, ROW = 13, STRIDE = 17 };
    float x[ROWS * ROW], got[ROWS * ROW];
    int32_t flat[ROWS * ROW], out[ROWS * STRIDE], counts[ROWS], n = 0;
    for (int i = 0; i < ROWS * ROW; i++) {
        x[i] = (float)i;
        if ((i * 7) % 5 < 2 && i / ROW != 2) flat[n++] = i; /* row 2 empty */
    }
    float *dx = dev_alloc(be, sizeof x);
    int32_t *dflat = dev_alloc(be, sizeof flat), *dout = dev_alloc(be, sizeof out), *dcounts = dev_alloc(be, sizeof counts);
    util_dev_write(be, dx, x, sizeof x);
    util_dev_write(be, dflat, flat, sizeof flat);
    CU_ASSERT(be->fill_idx_f32(be, dx, dflat, n, -3.5f, err, sizeof err) == 0);
    CU_ASSERT(be->split_rows_idx(be, dout, STRIDE, dcounts, dflat, n, ROW, ROWS, err, sizeof err) == 0);
    util_dev_read(be, got, dx, sizeof got);
    util_dev_read(be, out, dout, sizeof out);
    util_dev_read(be, counts, dcounts, sizeof counts);
    for (int i = 0; i < n; i++) x[flat[i]] = -3.5f;
    CU_ASSERT(memcmp(got, x, sizeof x) == 0);
    int at = 0;
    for (int r = 0; r < ROWS; r++) {
        int c = 0;
        for (; at < n && flat[at] / ROW == r; at++, c++) CU_ASSERT_EQUAL(out[r * STRIDE + c], flat[at] - r * ROW);
        CU_ASSERT_EQUAL(counts[r], c);
    }
    CU_ASSERT_EQUAL(counts[2], 0);
    dev_free(be, dx, sizeof x), dev_free(be, dflat, sizeof flat), dev_free(be, dout, sizeof out);
    dev_free(be, dcounts, sizeof counts);
    kvb_backend_free(be);
}

/* ---- AdaKV's allocation: the rule restated in float64 ---- */

/* slot a of s ranks before slot b: higher score, then lower index */
static int before(const double *s, int a, int b) { return s[a] != s[b] ? s[a] > s[b] : a < b; }

/* want[h][row_len] = 1 where head h keeps its slot: each head's best `floor`, then the best rows x (k - floor)
 * of what is left over all heads (flat index = h x row_len + j: ties go to the lower head, then slot). */
static void ada_reference(const float *score, int rows, int row_len, int k, int floor, char *want) {
    double *s = malloc((size_t)rows * row_len * sizeof *s);
    for (int i = 0; i < rows * row_len; i++) s[i] = score[i];
    memset(want, 0, (size_t)rows * row_len);
    for (int h = 0; h < rows; h++)
        for (int t = 0; t < floor; t++) {
            int best = -1;
            for (int j = h * row_len; j < (h + 1) * row_len; j++)
                if (!want[j] && (best < 0 || before(s, j, best))) best = j;
            want[best] = 1;
        }
    for (int t = 0; t < rows * (k - floor); t++) {
        int best = -1;
        for (int j = 0; j < rows * row_len; j++)
            if (!want[j] && (best < 0 || before(s, j, best))) best = j;
        want[best] = 1;
    }
    free(s);
}

/* kvb_adakv_allocate on the CPU backend against ada_reference; counts returned in got_counts (rows <= 8) */
static void check_allocation(kvb_backend *be, const float *score, int rows, int row_len, int k, int floor,
                             int32_t *got_counts) {
    char err[256];
    size_t sb = (size_t)rows * row_len * sizeof(float), ib = (size_t)rows * row_len * sizeof(int32_t);
    float *dscore = dev_alloc(be, sb);
    int32_t *dout = dev_alloc(be, ib), *dflat = dev_alloc(be, ib), *dcounts = dev_alloc(be, 8 * sizeof(int32_t));
    int32_t *out = malloc(ib);
    char *want = malloc((size_t)rows * row_len);
    util_dev_write(be, dscore, score, sb);
    CU_ASSERT_FATAL(kvb_adakv_allocate(be, dscore, rows, row_len, k, floor, dout, row_len, dcounts, dflat, err, sizeof err) == 0);
    util_dev_read(be, out, dout, ib);
    util_dev_read(be, got_counts, dcounts, (size_t)rows * sizeof(int32_t));
    ada_reference(score, rows, row_len, k, floor, want);
    int total = 0, mismatches = 0;
    for (int h = 0; h < rows; h++) {
        int c = 0;
        for (int j = 0; j < row_len; j++)
            if (want[h * row_len + j]) mismatches += c >= got_counts[h] || out[h * row_len + c++] != j;
        mismatches += c != got_counts[h];
        total += got_counts[h];
    }
    CU_ASSERT_EQUAL(total, rows * k);
    CU_ASSERT_EQUAL(mismatches, 0);
    free(out), free(want);
    dev_free(be, dscore, sb), dev_free(be, dout, ib), dev_free(be, dflat, ib);
    dev_free(be, dcounts, 8 * sizeof(int32_t));
}

static void test_adakv_allocation_equals_the_float64_rule(void) {
    char err[256];
    kvb_backend *be = kvb_backend_create("cpu", 1, err, sizeof err);
    CU_ASSERT_FATAL(be != NULL);
    /* head 0 scores high everywhere, head 1 low (left with its floor), head 2 ties with head 0 at the cut */
    static const float s[3][10] = {
        {0.90f, 0.80f, 0.85f, 0.70f, 0.95f, 0.60f, 0.75f, 0.88f, 0.92f, 0.50f},
        {0.01f, 0.02f, 0.09f, 0.03f, 0.04f, 0.05f, 0.06f, 0.07f, 0.08f, 0.00f},
        {0.50f, 0.50f, 0.50f, 0.50f, 0.99f, 0.50f, 0.50f, 0.50f, 0.50f, 0.50f}};
    int32_t counts[8];
    check_allocation(be, &s[0][0], 3, 10, 4, 1, counts); /* 12 slots: 1 + 1 floors, 10 best of the rest */
    CU_ASSERT(counts[0] == 10 && counts[1] == 1 && counts[2] == 1);
    check_allocation(be, &s[0][0], 3, 10, 5, 1, counts); /* 15: head 0 full, the 0.5 ties go to head 2's lowest */
    CU_ASSERT(counts[0] == 10 && counts[1] == 1 && counts[2] == 4);
    check_allocation(be, &s[0][0], 3, 10, 4, 4, counts); /* floor = k: every head its own top k (SnapKV) */
    CU_ASSERT(counts[0] == 4 && counts[1] == 4 && counts[2] == 4);
    check_allocation(be, &s[0][0], 3, 10, 4, 0, counts); /* no floor: head 1 gets nothing */
    CU_ASSERT(counts[1] == 0);
    /* random scores on a coarse grid (many ties), random k and floor */
    uint64_t r = 7;
    for (int t = 0; t < 40; t++) {
        float x[4 * 37];
        int rows = 1 + t % 4, row_len = 5 + (t * 11) % 33;
        for (int i = 0; i < rows * row_len; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            x[i] = (float)((r >> 33) % 6) / 8.0f + (i / row_len == 1 ? 0.3f : 0.0f);
        }
        int k = 1 + t % row_len, floor = (t * 5) % (k + 1);
        check_allocation(be, x, rows, row_len, k, floor, counts);
    }
    kvb_backend_free(be);
}

/* ---- the methods on a tiny model ---- */

static kvb_ctx *new_ctx(void) {
    char err[256];
    kvb_ctx_params p = kvb_ctx_default_params();
    p.kv_dtype = KVB_F32;
    p.n_ctx = CTX;
    p.n_threads = 1;
    p.n_batch = 64;
    p.keep_window = 1; /* the references below read a context's window after its prefill */
    kvb_ctx *c = kvb_ctx_create(model, &p, err, sizeof err);
    CU_ASSERT_FATAL(c != NULL);
    return c;
}

/* a context prefilled with ids by method name (budget, opts): verified by kvb_method_prefill */
static kvb_ctx *prefilled(const char *name, const char *budget, const char *opts, kvb_method **m) {
    char err[256];
    kvb_ctx *c = new_ctx();
    kvb_budget b;
    CU_ASSERT_FATAL(kvb_budget_parse(budget, &b, err, sizeof err) == 0);
    kvb_opts o = {0};
    if (opts) CU_ASSERT_FATAL(kvb_opts_add(&o, opts, err, sizeof err) == 0);
    *m = kvb_method_create(name, c, &b, &o, err, sizeof err);
    if (!*m) fprintf(stderr, "\n  %s: %s\n", name, err);
    CU_ASSERT_FATAL(*m != NULL);
    int rc = kvb_method_prefill(*m, c, ids, N_IDS, err, sizeof err);
    if (rc) fprintf(stderr, "\n  %s: %s\n", name, err);
    CU_ASSERT_FATAL(rc == 0);
    return c;
}

static void done(kvb_method *m, kvb_ctx *c) {
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

/* positions (layer l, head h) holds, ascending */
static int64_t positions(kvb_ctx *c, int l, int h, int32_t *out) {
    util_kv_head hc = util_kv_head_copy(c->kv, l, h);
    int64_t n = hc.n;
    memcpy(out, hc.pos, (size_t)n * sizeof *out);
    kvb_sort_i32(out, n);
    util_kv_head_free(&hc);
    return n;
}

static int same_head(kvb_ctx *a, int la, kvb_ctx *b, int lb, int h) {
    int32_t pa[N_IDS], pb[N_IDS];
    int64_t na = positions(a, la, h, pa), nb = positions(b, lb, h, pb);
    return na == nb && !memcmp(pa, pb, (size_t)na * sizeof *pa);
}

static void test_pyramidkv_layers_keep_what_snapkv_keeps_at_their_budget(void) {
    kvb_method *m, *ms;
    kvb_ctx *c = prefilled("pyramidkv", "30%", "window=8,beta=4", &m);
    int64_t keep[L];
    kvb_pyramid_budgets(L, N_IDS, 90, 8, 4, keep);
    CU_ASSERT(keep[0] > keep[L - 1]);
    int mismatches = 0;
    for (int l = 0; l < L; l++) {
        char budget[32];
        snprintf(budget, sizeof budget, "%lld", (long long)keep[l]);
        kvb_ctx *s = prefilled("snapkv", budget, "window=8", &ms);
        for (int h = 0; h < NKV; h++) {
            CU_ASSERT_EQUAL(kvc_n(c->kv, l, h), keep[l]);
            mismatches += !same_head(c, l, s, l, h);
        }
        done(ms, s);
    }
    CU_ASSERT_EQUAL(mismatches, 0);
    done(m, c);
}

static void test_a_budget_within_the_window_keeps_the_last_tokens_everywhere(void) {
    const char *names[][2] = {{"pyramidkv", "window=8"}, {"adakv", "window=8,base=pyramidkv"}};
    for (int k = 0; k < 2; k++) {
        kvb_method *m;
        kvb_ctx *c = prefilled(names[k][0], "6", names[k][1], &m);
        int32_t pos[N_IDS];
        int wrong = 0;
        for (int l = 0; l < L; l++)
            for (int h = 0; h < NKV; h++)
                wrong += positions(c, l, h, pos) != 6 || pos[0] != N_IDS - 6 || pos[5] != N_IDS - 1;
        CU_ASSERT_EQUAL(wrong, 0);
        done(m, c);
    }
}

static void test_adakv_with_alpha_one_is_snapkv(void) {
    kvb_method *ma, *ms;
    kvb_ctx *a = prefilled("adakv", "30%", "window=8,alpha=1", &ma), *s = prefilled("snapkv", "30%", "window=8", &ms);
    int mismatches = 0;
    for (int l = 0; l < L; l++)
        for (int h = 0; h < NKV; h++) mismatches += !same_head(a, l, s, l, h);
    CU_ASSERT_EQUAL(mismatches, 0);
    done(ma, a), done(ms, s);
}

/* AdaKV's store against the rule restated on the model's own SnapKV scores (read back from an unevicted
 * context prefilled the same way), for both bases; the layer's heads sum to its budget and decode verifies. */
static void check_adakv_on_model(const char *opts, int pyramid, double alpha) {
    char err[256];
    const int64_t n = N_IDS, w = 8, budget = 90;
    kvb_method *m, *mf;
    kvb_ctx *c = prefilled("adakv", "30%", opts, &m);
    kvb_ctx *f = prefilled("snapkv", "100%", "window=8", &mf); /* nothing evicted: its store and window remain */
    kvb_snap_opts p = {8, 7, 0};
    int64_t keep[L];
    if (pyramid) kvb_pyramid_budgets(L, n, budget, w, 20, keep);
    else
        for (int l = 0; l < L; l++) keep[l] = budget;
    size_t sb = (size_t)NKV * n * sizeof(float);
    float *score = kvb_method_alloc(f, sb), *pooled = kvb_method_alloc(f, sb), *host = malloc(sb);
    char *want = malloc((size_t)NKV * n);
    int mismatches = 0, uneven = 0, at_floor = 0;
    for (int l = 0; l < L; l++) {
        CU_ASSERT_FATAL(kvb_snap_score(f, l, n, w, &p, score, pooled, err, sizeof err) == 0);
        util_dev_read(f->be, host, pooled, (size_t)NKV * (n - w) * sizeof(float));
        int64_t k = keep[l] - w, floor = (int64_t)(alpha * (double)keep[l]) - w;
        ada_reference(host, NKV, (int)(n - w), (int)k, (int)(floor < 0 ? 0 : floor), want);
        int64_t sum = 0;
        for (int h = 0; h < NKV; h++) {
            int32_t pos[N_IDS], ref[N_IDS];
            int64_t got = positions(c, l, h, pos), nr = 0;
            for (int j = 0; j < n - w; j++)
                if (want[h * (n - w) + j]) ref[nr++] = j;
            for (int64_t j = n - w; j < n; j++) ref[nr++] = (int32_t)j;
            mismatches += got != nr || memcmp(pos, ref, (size_t)nr * sizeof *pos);
            uneven += got != keep[l];
            at_floor += floor > 0 && got == floor + w;
            sum += got;
        }
        CU_ASSERT_EQUAL(sum, NKV * keep[l]);
    }
    CU_ASSERT_EQUAL(mismatches, 0);
    CU_ASSERT(uneven > 0); /* heads really hold different counts */
    if (alpha >= 0.5) CU_ASSERT(at_floor > 0); /* a high floor binds somewhere */
    for (int s = 0; s < 3; s++) {
        int32_t id = 5 + s;
        CU_ASSERT_FATAL(kvb_forward(c, &id, 1, err, sizeof err) == 0);
    }
    CU_ASSERT(kvb_method_verify(m, c, 0, err, sizeof err) == 0);
    kvb_method_release(f, score, sb), kvb_method_release(f, pooled, sb);
    free(host), free(want);
    done(m, c), done(mf, f);
}

static void test_adakv_store_follows_the_rule_on_snapkv_scores(void) { check_adakv_on_model("window=8", 0, 0.2); }
static void test_adakv_on_pyramidkv_budgets(void) { check_adakv_on_model("window=8,base=pyramidkv,alpha=0.9", 1, 0.9); }

static void expect_error(const char *name, const char *opts, const char *needle) {
    char err[256] = "";
    kvb_ctx *c = new_ctx();
    kvb_budget b = {KVB_BUDGET_FRACTION, 0.3, 0};
    kvb_opts o = {0};
    CU_ASSERT_FATAL(kvb_opts_add(&o, opts, err, sizeof err) == 0);
    kvb_method *m = kvb_method_create(name, c, &b, &o, err, sizeof err);
    CU_ASSERT(m == NULL && strstr(err, needle) != NULL);
    if (!strstr(err, needle)) fprintf(stderr, "\n  got: %s\n", err);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

static void test_bad_options_are_one_line_errors(void) {
    expect_error("pyramidkv", "beta=0.5", "beta must be >= 1");
    expect_error("adakv", "base=h2o", "base must be snapkv or pyramidkv");
    expect_error("adakv", "alpha=1.5", "alpha must be in [0, 1]");
    expect_error("adakv", "beta=10", "no option 'beta'"); /* beta only with base=pyramidkv */
    expect_error("adakv", "kernel=4", "kernel must be odd");
}

static char dir[] = "/tmp/kvb_pyr_XXXXXX";

static int setup(void) {
    if (!mkdtemp(dir)) return -1;
    snprintf(model_path, sizeof model_path, "%s/tiny.gguf", dir);
    gw_random r = {11, 0.5f, NULL};
    gw_tiny t = {"llama", L, E, NH, NKV, FF, V, CTX, 0, NULL, gw_random_tensor, &r};
    int rc = gw_write_tiny(&t, model_path);
    free(r.buf);
    if (rc) return -1;
    for (int i = 0; i < N_IDS; i++) ids[i] = 3 + (i * 53) % 290;
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
    CU_pSuite s = CU_add_suite("pyramidkv, adakv", setup, teardown);
    CU_add_test(s, "pyramid budgets sum to the budget, fall from bottom to top", test_pyramid_budgets_sum_to_the_budget_and_fall_from_bottom_to_top);
    CU_add_test(s, "fill_idx_f32 and split_rows_idx are the plain loops", test_fill_idx_and_split_rows_idx_are_the_plain_loops);
    CU_add_test(s, "adakv allocation = the float64 rule (ties, floor-only heads)", test_adakv_allocation_equals_the_float64_rule);
    CU_add_test(s, "pyramidkv layers keep what snapkv keeps at their budget", test_pyramidkv_layers_keep_what_snapkv_keeps_at_their_budget);
    CU_add_test(s, "a budget within the window keeps the last tokens everywhere", test_a_budget_within_the_window_keeps_the_last_tokens_everywhere);
    CU_add_test(s, "adakv with alpha=1 is snapkv", test_adakv_with_alpha_one_is_snapkv);
    CU_add_test(s, "adakv store follows the rule on snapkv scores", test_adakv_store_follows_the_rule_on_snapkv_scores);
    CU_add_test(s, "adakv on pyramidkv budgets", test_adakv_on_pyramidkv_budgets);
    CU_add_test(s, "bad options are one-line errors", test_bad_options_are_one_line_errors);
    return util_run_suites();
}
