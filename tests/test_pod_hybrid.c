/* test_pod_hybrid.c — PoD on a hybrid model (methods/pod.c "Hybrid models"): the seeded gemma3-deep
 * (tests/util_arch_model.h: 18 layers, 5, 11 and 17 global, window 24, 4 query heads on 1 KV head of 32), written here
 * from its seed. With block=2 the blocks are over the global layers, {5, 11} and {17}: layer 11 is the only upper
 * layer and reads layer 5's scores across the local layers between them. Pinned against what the engine's full
 * attention holds and against float64 code written out here:
 *   - the local layers keep their window, K, V and positions bit for bit those of full attention (all of them at the
 *     end of prefill; after teacher-forced decode steps those below layer 11, whose inputs PoD does not change; the
 *     others hold the last W positions);
 *   - the base layers keep every token, layer 11 its n_s sinks and most recent tokens: the proximal window of the
 *     budget counted on the cache the model holds, (f (3 n + 15 w) - 15 w) / 3 tokens, and V alone of the others;
 *   - the measured device share equals that count over the held cache (windows on both sides);
 *   - a decode step of layer 11 merges its proximal attention with distant attention scored by layer 5's query and
 *     keys (eq. 3-4), against float64;
 *   - block counts global layers: block=4 (more than the 3) is refused with one line. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util_arch_model.h"
#include "util_common.h"
#include "methods/method.h"

enum { N = 300, STEPS = 6, SINKS = 16, BASE = 5, UPPER = 11, TOP = 17 };

static kvb_model *model;
static int32_t ids[N + STEPS];
static uint64_t rng = 7;

static float frand(float s) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return s * ((float)((rng >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f);
}

static kvb_ctx *new_ctx(void) {
    char err[256];
    kvb_ctx_params p = kvb_ctx_default_params();
    p.kv_dtype = KVB_F32;
    p.n_ctx = N + STEPS + 8;
    kvb_ctx *c = kvb_ctx_create(model, &p, err, sizeof err);
    if (!c) fprintf(stderr, "\n  %s", err);
    CU_ASSERT_FATAL(c != NULL);
    return c;
}

static kvb_method *make_pod(kvb_ctx *c, double frac, const char *opts, char *err, size_t err_len) {
    kvb_budget b = {KVB_BUDGET_FRACTION, frac, 0};
    kvb_opts o = {0};
    CU_ASSERT_FATAL(kvb_opts_add(&o, opts, err, err_len) == 0);
    return kvb_method_create("pod", c, &b, &o, err, err_len);
}

/* 1 when (layer, head 0) of a and b hold the same positions, K and V bytes in the same slots */
static int same_head(kvb_ctx *a, kvb_ctx *b, int l) {
    util_kv_head x = util_kv_head_copy(a->kv, l, 0), y = util_kv_head_copy(b->kv, l, 0);
    const size_t row = (size_t)model->cfg.head_dim * sizeof(float);
    int same = x.n == y.n && !memcmp(x.pos, y.pos, (size_t)x.n * sizeof *x.pos) && !memcmp(x.k, y.k, (size_t)x.n * row) &&
               !memcmp(x.v, y.v, (size_t)x.n * row);
    util_kv_head_free(&x), util_kv_head_free(&y);
    return same;
}

/* The largest difference of (layer, head 0)'s K and V between a and b, slot by slot; INFINITY when the positions differ */
static double head_diff(kvb_ctx *a, kvb_ctx *b, int l) {
    util_kv_head x = util_kv_head_copy(a->kv, l, 0), y = util_kv_head_copy(b->kv, l, 0);
    double d = x.n == y.n && !memcmp(x.pos, y.pos, (size_t)x.n * sizeof *x.pos) ? 0 : INFINITY;
    for (int64_t i = 0; i < x.n * model->cfg.head_dim && d < INFINITY; i++)
        d = fmax(d, fmax(fabs(((float *)x.k)[i] - ((float *)y.k)[i]), fabs(((float *)x.v)[i] - ((float *)y.v)[i])));
    util_kv_head_free(&x), util_kv_head_free(&y);
    return d;
}

/* 1 when (layer, head 0) holds exactly positions [lo, hi) and [0, sinks) */
static int holds(kvb_ctx *c, int l, int sinks, int64_t lo, int64_t hi) {
    util_kv_head x = util_kv_head_copy(c->kv, l, 0);
    int ok = x.n == sinks + (hi - lo);
    for (int64_t i = 0; i < x.n && ok; i++) ok = (x.pos[i] >= 0 && x.pos[i] < sinks) || (x.pos[i] >= lo && x.pos[i] < hi);
    util_kv_head_free(&x);
    return ok;
}

static void test_local_layers_keep_full_windows_blocks_over_global_layers(void) {
    const kvb_config *cfg = &model->cfg;
    const int W = cfg->n_swa, n_local = cfg->n_layer - 3;
    CU_ASSERT_FATAL(W > 0 && kvb_layer_window(cfg, BASE) == 0 && kvb_layer_window(cfg, UPPER) == 0 &&
                    kvb_layer_window(cfg, TOP) == 0 && n_local == 15);
    char err[512];
    kvb_ctx *full = new_ctx(), *c = new_ctx();
    kvb_method *m = make_pod(c, 0.5, "block=2", err, sizeof err);
    if (!m) fprintf(stderr, "\n  %s", err);
    CU_ASSERT_FATAL(m != NULL);
    CU_ASSERT_FATAL(kvb_forward(full, ids, N, err, sizeof err) == 0 && kvb_ctx_end_prefill(full, err, sizeof err) == 0);
    CU_ASSERT_FATAL(kvb_method_prefill(m, c, ids, N, err, sizeof err) == 0);
    /* the proximal window: the budget per global layer of the cache the model holds */
    const double whole = 3.0 * N + (double)n_local * W;
    const int64_t prox = llround((0.5 * whole - (double)n_local * W) / 3.0);
    CU_ASSERT_FATAL(prox > SINKS && prox < N);
    for (int l = 0; l < cfg->n_layer; l++)
        if (kvb_layer_window(cfg, l)) {
            CU_ASSERT(kvc_n(c->kv, l, 0) == W);
            CU_ASSERT(same_head(c, full, l));
        }
    CU_ASSERT(kvc_n(c->kv, BASE, 0) == N && kvc_n(c->kv, TOP, 0) == N && same_head(c, full, BASE) && same_head(c, full, TOP));
    CU_ASSERT(holds(c, UPPER, SINKS, N - (prox - SINKS), N));
    const int64_t v_row = cfg->head_dim * (int64_t)sizeof(float);
    CU_ASSERT_EQUAL(m->extra_device_bytes, (N - prox) * v_row);
    /* the measured share against the count: 2 base layers n, layer 11 prox K+V and n - prox V rows, the windows */
    kvb_kv_usage u;
    kvb_method_usage(m, c, &u);
    const double slot = (double)kvc_slot_bytes(c->kv);
    const double want = ((2.0 * N + prox + (double)n_local * W) * slot + (double)(N - prox) * v_row) / (whole * slot);
    printf("\n    prefill %d: proximal %lld, device share %.4f (count %.4f)", N, (long long)prox, u.device_frac, want);
    CU_ASSERT(fabs(u.device_frac - want) < 1e-9);
    CU_ASSERT(kvb_method_verify(m, c, 1, err, sizeof err) == 0);
    /* teacher-forced decode: every local layer holds its last W; those below layer 5 stay full's bit for bit, those
     * between 5 and 11 within float rounding (layer 5 attends through PoD's hook, which also writes its
     * probabilities for layer 11: the same attention, summed in another order); above 11 PoD changes the inputs */
    for (int i = 0; i < STEPS; i++) {
        CU_ASSERT_FATAL(kvb_forward(full, &ids[N + i], 1, err, sizeof err) == 0);
        CU_ASSERT_FATAL(kvb_forward(c, &ids[N + i], 1, err, sizeof err) == 0);
    }
    double worst = 0;
    const int64_t len = N + STEPS, prox_now = llround((0.5 * (3.0 * len + (double)n_local * W) - (double)n_local * W) / 3.0);
    for (int l = 0; l < cfg->n_layer; l++)
        if (kvb_layer_window(cfg, l)) {
            CU_ASSERT(holds(c, l, 0, len - W, len));
            if (l < BASE) CU_ASSERT(same_head(c, full, l));
            if (l > BASE && l < UPPER) {
                const double d = head_diff(c, full, l);
                worst = fmax(worst, d);
                CU_ASSERT(d < 1e-4);
            }
        }
    printf("\n    after %d decode steps: local layers 6-10 within %.1e of full's", STEPS, worst);
    CU_ASSERT(same_head(c, full, BASE));
    /* decode keeps n_s sinks + the latest; the appended token's own K/V are there (the step before attention) */
    CU_ASSERT(holds(c, UPPER, SINKS, len - (prox_now - SINKS), len));
    CU_ASSERT(kvb_method_verify(m, c, 0, err, sizeof err) == 0);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
    kvb_ctx_free(full);
}

/* One decode step of layers 5 and 11 through PoD's hooks with random queries, against float64: layer 5 exact over
 * every token; layer 11 its own logits over its proximal tokens, layer 5's query and keys over the distant ones
 * (applied to layer 11's V), merged by the log-sum-exp gate (eq. 4). */
static void test_upper_global_layer_reads_the_base_global_layers_scores(void) {
    const kvb_config *cfg = &model->cfg;
    const int H = cfg->n_head, HD = cfg->head_dim;
    char err[512];
    kvb_ctx *c = new_ctx();
    kvb_method *m = make_pod(c, 1.0, "block=2,recent=40", err, sizeof err); /* proximal = 16 sinks + 40 recent */
    CU_ASSERT_FATAL(m != NULL);
    CU_ASSERT_FATAL(kvb_forward(c, ids, N, err, sizeof err) == 0);
    util_kv_head up0 = util_kv_head_copy(c->kv, UPPER, 0); /* layer 11's V in position order, before PoD moves them */
    float *V11 = malloc((size_t)N * HD * sizeof *V11);
    for (int64_t i = 0; i < up0.n; i++) memcpy(V11 + (size_t)up0.pos[i] * HD, (const float *)up0.v + i * HD, (size_t)HD * sizeof(float));
    util_kv_head_free(&up0);
    CU_ASSERT_FATAL(kvb_ctx_end_prefill(c, err, sizeof err) == 0);
    CU_ASSERT_FATAL(kvc_n(c->kv, UPPER, 0) == SINKS + 40 && kvc_n(c->kv, BASE, 0) == N);
    /* the step at position N: append a token's K/V to both layers, then the hooks as the engine calls them */
    float k[64], v[64], q5[256], q11[256], out5[256], out11[256];
    CU_ASSERT_FATAL(HD <= 64 && H * HD <= 256);
    int32_t pn = N;
    for (int l = 0; l < 2; l++) {
        for (int i = 0; i < HD; i++) k[i] = frand(1), v[i] = frand(1);
        CU_ASSERT_FATAL(kvc_append(c->kv, l ? UPPER : BASE, 1, k, v, &pn, NULL, err, sizeof err) == 0);
    }
    c->pos[0] = N;
    for (int i = 0; i < H * HD; i++) q5[i] = frand(1.5f), q11[i] = frand(1.5f);
    for (int l = 0; l < 2; l++) {
        const int layer = l ? UPPER : BASE;
        kvb_src src[1];
        kvb_src_from_store(c, layer, src);
        CU_ASSERT_FATAL(m->hooks.select(m, c, layer, src, 1, err, sizeof err) == 0);
        const void *hk[1] = {src[0].k}, *hv[1] = {src[0].v};
        const int32_t *hp[1] = {src[0].pos};
        int64_t hn[1] = {src[0].n};
        kvb_attn_args a = {0};
        a.n_q = 1, a.n_head = H, a.n_head_kv = 1, a.head_dim = HD, a.q = l ? q11 : q5, a.q_pos = c->pos;
        a.kv_dtype = KVB_F32, a.k = hk, a.v = hv, a.k_pos = hp, a.n_kv = hn, a.scale = 1.0f / sqrtf((float)HD);
        a.out = l ? out11 : out5;
        CU_ASSERT_FATAL(m->hooks.attend(m, c, layer, &a, err, sizeof err) == 1);
    }
    util_kv_head b = util_kv_head_copy(c->kv, BASE, 0), u = util_kv_head_copy(c->kv, UPPER, 0);
    const float *bk = b.k, *bv = b.v, *uk = u.k, *uv = u.v;
    double *lg = malloc((N + 1) * sizeof *lg);
    int64_t *slot_of = malloc((N + 1) * sizeof *slot_of);
    for (int j = 0; j <= N; j++) slot_of[j] = -1;
    for (int64_t i = 0; i < b.n; i++) slot_of[b.pos[i]] = i;
    double worst5 = 0, worst11 = 0;
    for (int h = 0; h < H; h++) {
        /* layer 5: exact */
        double mx = -1e300, s = 0, o[64] = {0};
        for (int j = 0; j <= N; j++) {
            double d = 0;
            for (int e = 0; e < HD; e++) d += (double)q5[h * HD + e] * bk[slot_of[j] * HD + e];
            lg[j] = d / sqrt((double)HD);
            mx = lg[j] > mx ? lg[j] : mx;
        }
        for (int j = 0; j <= N; j++) s += exp(lg[j] - mx);
        for (int j = 0; j <= N; j++)
            for (int e = 0; e < HD; e++) o[e] += exp(lg[j] - mx) / s * bv[slot_of[j] * HD + e];
        for (int e = 0; e < HD; e++) worst5 = fmax(worst5, fabs(o[e] - out5[h * HD + e]));
        /* layer 11: proximal (its own q and K) and distant (layer 5's logits lg, layer 11's V) */
        double lp = -1e300, ld = -1e300, sp = 0, sd = 0, op[64] = {0}, od[64] = {0};
        for (int64_t i = 0; i < u.n; i++) {
            double d = 0;
            for (int e = 0; e < HD; e++) d += (double)q11[h * HD + e] * uk[i * HD + e];
            lp = fmax(lp, d / sqrt((double)HD));
        }
        for (int64_t i = 0; i < u.n; i++) {
            double d = 0;
            for (int e = 0; e < HD; e++) d += (double)q11[h * HD + e] * uk[i * HD + e];
            const double w = exp(d / sqrt((double)HD) - lp);
            sp += w;
            for (int e = 0; e < HD; e++) op[e] += w * uv[i * HD + e];
        }
        int n_dist = 0;
        for (int j = SINKS; j <= N - 40; j++) ld = fmax(ld, lg[j]), n_dist++;
        for (int j = SINKS; j <= N - 40; j++) {
            const double w = exp(lg[j] - ld);
            sd += w;
            for (int e = 0; e < HD; e++) od[e] += w * V11[(size_t)j * HD + e];
        }
        CU_ASSERT(n_dist == N + 1 - (SINKS + 40) && u.n == SINKS + 40);
        const double gate = 1.0 / (1.0 + exp(ld + log(sd) - lp - log(sp))); /* eq. 4 */
        CU_ASSERT(gate > 0 && gate < 1);
        for (int e = 0; e < HD; e++) worst11 = fmax(worst11, fabs(out11[h * HD + e] - (gate * op[e] / sp + (1 - gate) * od[e] / sd)));
    }
    printf("\n    layer 5 exact within %.1e, layer 11 merged within %.1e", worst5, worst11);
    CU_ASSERT(worst5 < 1e-4 && worst11 < 1e-4);
    free(lg), free(slot_of), free(V11);
    util_kv_head_free(&b), util_kv_head_free(&u);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

static void test_block_counts_global_layers(void) {
    char err[512];
    kvb_ctx *c = new_ctx();
    CU_ASSERT(make_pod(c, 0.5, "block=4", err, sizeof err) == NULL);
    CU_ASSERT(strstr(err, "[1, 3]") && strstr(err, "global layers") && !strchr(err, '\n'));
    printf("\n    %s", err);
    kvb_method *m = make_pod(c, 0.5, "block=3", err, sizeof err); /* one block of the three */
    CU_ASSERT(m != NULL);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

int main(void) {
    model = util_arch_model_load(&util_gemma3_deep);
    if (!model) return 1;
    for (int i = 0; i < N + STEPS; i++) ids[i] = (int32_t)(3 + (i * 37 + i / 7) % (model->cfg.n_vocab - 3));
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("pod on a hybrid model", NULL, NULL);
    CU_add_test(s, "local layers keep full's windows; blocks over the global layers", test_local_layers_keep_full_windows_blocks_over_global_layers);
    CU_add_test(s, "layer 11 reads layer 5's scores across the local layers (float64)", test_upper_global_layer_reads_the_base_global_layers_scores);
    CU_add_test(s, "block counts global layers", test_block_counts_global_layers);
    int rc = util_run_suites();
    kvb_model_free(model);
    return rc;
}
