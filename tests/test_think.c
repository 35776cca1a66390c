/* test_think.c — ThinK on a tiny random model and hand-built KV states, against a float64 restatement of its rule
 * (kvpress's ThinKPress): per layer and KV head, channel c scores sum_{t, r} q[t][r][c]^2 x sum_i k[i][c]^2 (the
 * window's queries of the group's heads, the prompt's keys), the top d' kept; attention over the pruned prompt plus
 * whole recent tokens equals float64 attention with the prompt keys' pruned channels zeroed; the measured share is
 * (d' + head_dim) elements + a position per prompt slot; budget 100% and lambda=0 decode as full attention; budgets
 * under what pruning reaches, token budgets and bad options are refused by name. Device-tier memory is read and
 * written only through the backend, so the suite also runs under KVB_GUARD=1 (test_think_guard). */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util_common.h"
#include "util_method.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "methods/method.h"
#include "methods/think.h"

enum { L = 4, NH = 4, NKV = 2, G = NH / NKV, HD = 16, E = NH * HD, FF = 48, V = 300, CTX = 512, W = 8 };

static uint64_t rng = 23;

static float frand(float s) { return util_frand(&rng, s); }

/* Every layer gets n random tokens at positions 0..n-1, as if prefilled (channel c's keys scaled by 0.3 + c/8, so
 * the channels differ in size as real keys' do), and W window queries of random size per channel. */
static float win_q[L][W][NH * HD];
static void fill_prompt(kvb_ctx *c, int64_t n) {
    char err[256];
    const int kvd = NKV * HD;
    float *k = malloc((size_t)n * kvd * sizeof *k), *v = malloc((size_t)n * kvd * sizeof *v);
    int32_t *pos = malloc((size_t)n * sizeof *pos), wpos[W];
    for (int l = 0; l < L; l++) {
        for (int64_t i = 0; i < n * kvd; i++) k[i] = frand(1.0f) * (0.3f + (float)(i % HD) / 8), v[i] = frand(1.0f);
        for (int64_t i = 0; i < n; i++) pos[i] = (int32_t)i;
        CU_ASSERT_FATAL(kvc_append(c->kv, l, n, k, v, pos, NULL, err, sizeof err) == 0);
        for (int t = 0; t < W; t++)
            for (int e = 0; e < NH * HD; e++) win_q[l][t][e] = frand(1.0f) * (float)(1 + (e * 7 + l) % 5);
        util_dev_write(c->be, c->obs_q + (size_t)l * c->obs_cap * c->model->cfg.q_dim, win_q[l], sizeof win_q[l]);
    }
    for (int t = 0; t < W; t++) wpos[t] = (int32_t)(n - W + t);
    util_dev_write(c->be, c->obs_pos, wpos, sizeof wpos);
    c->obs_n = W;
    c->n_past = n;
    free(k), free(v), free(pos);
}

/* The float64 channel scores of (l, g) from the head's keys and the window, and the top dk (ascending) into want;
 * the margin of the dk-th over the next. */
static double ref_channels(const util_kv_head *hv, kvb_dtype dt, int l, int g, int dk, int32_t *want) {
    double score[HD], margin = 1, kth = 1;
    for (int ch = 0; ch < HD; ch++) {
        double qs = 0, ks = 0;
        for (int t = 0; t < W; t++)
            for (int r = 0; r < G; r++) qs += (double)win_q[l][t][(g * G + r) * HD + ch] * win_q[l][t][(g * G + r) * HD + ch];
        for (int64_t i = 0; i < hv->n; i++) ks += util_elem(hv->k, dt, (size_t)i * HD + ch) * util_elem(hv->k, dt, (size_t)i * HD + ch);
        score[ch] = qs * ks;
    }
    util_topk_ref(score, HD, dk, want, &margin, &kth);
    return margin / kth;
}

/* The kept channels of every layer and head equal the float64 top d' of the score, d' from lambda (kvpress's
 * int(head_dim x ratio) pruned); then, with 3 whole tokens decoded after the prompt, the attend hook's output for 2
 * query rows (the second sees one more recent token) equals float64 softmax attention over the prompt with its
 * keys' pruned channels zeroed and the recent tokens whole, scale 1/sqrt(head_dim). */
static void check_channels_and_split_attention(kvb_dtype dt, const char *opts, int dk) {
    char err[256];
    enum { N = 90, R = 3, NQ = 2 };
    kvb_ctx *c = util_tiny_ctx(dt, CTX);
    kvb_method *m = util_make_method("think", c, "100%", opts);
    fill_prompt(c, N);
    util_kv_head before[L][NKV];
    int32_t want[L][NKV][HD];
    int near_ties = 0;
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) {
            before[l][g] = util_kv_head_copy(c->kv, l, g);
            near_ties += ref_channels(&before[l][g], dt, l, g, dk, want[l][g]) < 1e-4;
        }
    CU_ASSERT_EQUAL(near_ties, 0); /* no boundary a float rounding could flip */
    CU_ASSERT_FATAL(kvb_ctx_end_prefill(c, err, sizeof err) == 0);
    CU_ASSERT(kvb_method_verify(m, c, 1, err, sizeof err) == 0);
    int wrong = 0;
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) {
            int32_t got[HD];
            CU_ASSERT_EQUAL_FATAL(kvb_think_channels(m, c, l, g, got, err, sizeof err), dk);
            wrong += memcmp(got, want[l][g], (size_t)dk * sizeof *got) != 0;
            CU_ASSERT_EQUAL(kvc_n(c->kv, l, g), 0); /* the prompt left the store */
        }
    CU_ASSERT_EQUAL(wrong, 0);
    /* recent whole tokens at positions N .. N + R - 1 */
    const int kvd = NKV * HD;
    float rk[R * NKV * HD], rv[R * NKV * HD], q[NQ * NH * HD], out[NQ * NH * HD];
    int32_t rpos[R] = {N, N + 1, N + 2}, qpos[NQ] = {N + 1, N + 2};
    kvb_backend *be = c->be;
    float *dq = kvb_method_alloc(c, sizeof q), *dout = kvb_method_alloc(c, sizeof out);
    int32_t *dqpos = kvb_method_alloc(c, sizeof qpos);
    CU_ASSERT_FATAL(dq && dout && dqpos);
    double max_err = 0, max_ref = 0;
    for (int l = 0; l < L; l++) {
        for (int i = 0; i < R * kvd; i++) rk[i] = frand(1.0f), rv[i] = frand(1.0f);
        for (int i = 0; i < NQ * NH * HD; i++) q[i] = frand(1.5f);
        float *dk_rows = kvb_method_alloc(c, sizeof rk), *dv_rows = kvb_method_alloc(c, sizeof rv);
        int32_t *dpos = kvb_method_alloc(c, sizeof rpos);
        util_dev_write(be, dk_rows, rk, sizeof rk), util_dev_write(be, dv_rows, rv, sizeof rv);
        util_dev_write(be, dpos, rpos, sizeof rpos);
        CU_ASSERT_FATAL(kvc_append(c->kv, l, R, dk_rows, dv_rows, dpos, NULL, err, sizeof err) == 0);
        kvb_method_release(c, dk_rows, sizeof rk), kvb_method_release(c, dv_rows, sizeof rv);
        kvb_method_release(c, dpos, sizeof rpos);
        util_kv_head recent[NKV];
        kvb_src src[NKV];
        kvb_src_from_store(c, l, src);
        const void *kp[NKV], *vp[NKV];
        const int32_t *pp[NKV];
        int64_t nk[NKV];
        for (int g = 0; g < NKV; g++) kp[g] = src[g].k, vp[g] = src[g].v, pp[g] = src[g].pos, nk[g] = src[g].n;
        util_dev_write(be, dq, q, sizeof q), util_dev_write(be, dqpos, qpos, sizeof qpos);
        kvb_attn_args a = {.n_q = NQ, .n_head = NH, .n_head_kv = NKV, .head_dim = HD, .q = dq, .q_pos = dqpos,
                           .kv_dtype = dt, .k = kp, .v = vp, .k_pos = pp, .n_kv = nk, .scale = 1.0f / sqrtf((float)HD),
                           .out = dout};
        CU_ASSERT_FATAL(m->hooks.attend(m->hooks.self, c, l, &a, err, sizeof err) == 1);
        util_dev_read(be, out, dout, sizeof out);
        for (int g = 0; g < NKV; g++) recent[g] = util_kv_head_copy(c->kv, l, g);
        for (int t = 0; t < NQ; t++)
            for (int h = 0; h < NH; h++) {
                const int g = h / G;
                const util_kv_head *p = &before[l][g], *r = &recent[g];
                const float *qr = q + (t * NH + h) * HD;
                double s[N + R], mx = -INFINITY, sum = 0;
                int kept[HD] = {0};
                for (int j = 0; j < dk; j++) kept[want[l][g][j]] = 1;
                for (int i = 0; i < N + R; i++) {
                    const int recent_tok = i >= N;
                    double dot = 0;
                    if (recent_tok && r->pos[i - N] > qpos[t]) {
                        s[i] = -INFINITY;
                        continue;
                    }
                    for (int e = 0; e < HD; e++)
                        dot += (double)qr[e] * (recent_tok ? util_elem(r->k, dt, (size_t)(i - N) * HD + e)
                                                           : kept[e] ? util_elem(p->k, dt, (size_t)i * HD + e) : 0.0);
                    s[i] = dot / sqrt((double)HD);
                    mx = fmax(mx, s[i]);
                }
                for (int i = 0; i < N + R; i++) sum += s[i] == -INFINITY ? 0 : exp(s[i] - mx);
                for (int e = 0; e < HD; e++) {
                    double ref = 0;
                    for (int i = 0; i < N + R; i++)
                        if (s[i] != -INFINITY)
                            ref += exp(s[i] - mx) / sum *
                                   (i >= N ? util_elem(r->v, dt, (size_t)(i - N) * HD + e) : util_elem(p->v, dt, (size_t)i * HD + e));
                    max_err = fmax(max_err, fabs(out[(t * NH + h) * HD + e] - ref));
                    max_ref = fmax(max_ref, fabs(ref));
                }
            }
        for (int g = 0; g < NKV; g++) util_kv_head_free(&recent[g]);
    }
    CU_ASSERT(max_ref > 0.01);
    CU_ASSERT(max_err < 2e-6);
    if (!(max_err < 2e-6)) printf("\n  split attention off by %g\n", max_err);
    kvb_method_release(c, dq, sizeof q), kvb_method_release(c, dout, sizeof out), kvb_method_release(c, dqpos, sizeof qpos);
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) util_kv_head_free(&before[l][g]);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

static void test_kept_channels_and_split_attention_f32(void) { check_channels_and_split_attention(KVB_F32, "lambda=0.4", 10); }
static void test_kept_channels_and_split_attention_f16(void) { check_channels_and_split_attention(KVB_F16, "lambda=0.7", 5); }
static void test_one_channel_kept(void) { check_channels_and_split_attention(KVB_F32, "lambda=0.97", 1); }

/* The share of a pruned prompt slot, as think.c's header states it. */
static double slot_share(kvb_ctx *c, int dk, size_t es) {
    return (double)((size_t)(dk + HD) * es + 4) / (double)kvc_slot_bytes(c->kv);
}

/* Through the engine at a Mem% budget: d' is the channel count whose share is nearest, the measured device share
 * after prefill is it, decode appends whole tokens to the store (verified each step) and reads the pruned prompt. */
static void test_engine_budget_derives_channels_and_decode_appends_whole_tokens(void) {
    char err[256];
    kvb_ctx *c = util_tiny_ctx(KVB_F16, CTX);
    kvb_method *m = util_make_method("think", c, "80%", NULL);
    int32_t ids[150];
    for (int i = 0; i < 150; i++) ids[i] = 3 + (i * 37) % 290;
    CU_ASSERT_FATAL(kvb_method_prefill(m, c, ids, 150, err, sizeof err) == 0);
    int best = 1;
    for (int dk = 2; dk < HD; dk++)
        if (fabs(slot_share(c, dk, 2) - 0.8) < fabs(slot_share(c, best, 2) - 0.8)) best = dk;
    kvb_kv_usage u;
    kvb_method_usage(m, c, &u);
    CU_ASSERT(fabs(u.device_frac - slot_share(c, best, 2)) < 1e-9);
    CU_ASSERT(fabs(u.device_frac - 0.8) < 0.01 * 0.8);
    int32_t ch[HD];
    CU_ASSERT_EQUAL(kvb_think_channels(m, c, 2, 1, ch, err, sizeof err), best);
    for (int s = 0; s < 4; s++) {
        const int32_t id = sampler_argmax(c->logits, V);
        CU_ASSERT_FATAL(kvb_forward(c, &id, 1, err, sizeof err) == 0);
        CU_ASSERT(kvb_method_verify(m, c, 0, err, sizeof err) == 0);
    }
    int32_t pos[CTX];
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) {
            CU_ASSERT_EQUAL(util_head_positions(c, l, g, pos), 4);
            CU_ASSERT(pos[0] == 150 && pos[3] == 153); /* the decoded tokens only */
        }
    CU_ASSERT_EQUAL(m->def->read_outside(m, c, 0), 150);
    char desc[128], want[128];
    m->def->describe(m, desc, sizeof desc);
    snprintf(want, sizeof want, "base=snapkv lambda=%.4g channels=%d/%d window=32 keep=150 (from the budget)",
             1.0 - (double)best / HD, best, HD);
    CU_ASSERT_STRING_EQUAL(desc, want);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

/* Budget 100% (nothing pruned) and lambda=0 decode token for token as full attention. */
static void test_full_budget_and_lambda_zero_decode_as_full_attention(void) {
    char err[256];
    enum { N = 120, GEN = 12 };
    int32_t ids[N], ref[GEN], got[GEN];
    for (int i = 0; i < N; i++) ids[i] = 3 + (i * 53) % 290;
    for (int run = 0; run < 3; run++) {
        kvb_ctx *c = util_tiny_ctx(KVB_F16, CTX);
        kvb_method *m = run == 0 ? NULL : util_make_method("think", c, "100%", run == 2 ? "lambda=0" : NULL);
        CU_ASSERT_FATAL(kvb_method_prefill(m, c, ids, N, err, sizeof err) == 0);
        int32_t *out = run ? got : ref;
        for (int i = 0; i < GEN; i++) {
            out[i] = sampler_argmax(c->logits, V);
            CU_ASSERT_FATAL(kvb_forward(c, &out[i], 1, err, sizeof err) == 0);
        }
        if (m) {
            kvb_kv_usage u;
            kvb_method_usage(m, c, &u);
            CU_ASSERT(u.device_frac == 1.0);
            CU_ASSERT(kvb_method_verify(m, c, 0, err, sizeof err) == 0);
            CU_ASSERT(memcmp(ref, got, sizeof ref) == 0);
        }
        kvb_method_free(m, c);
        kvb_ctx_free(c);
    }
}

/* With base=none, a budget pruning cannot reach names the smallest share it reaches, and lambda's share above the
 * budget is an error naming it; a token budget, a bad lambda and a bad base are refused. */
static void test_refusals_name_the_problem(void) {
    char err[256];
    kvb_ctx *c = util_tiny_ctx(KVB_F16, CTX);
    util_check_refusals("think", c, "lambda=1", "lambda must be in [0, 1)");
    util_check_refusals("think", c, "base=h2o", "base must be snapkv or none");
    kvb_budget b30 = {KVB_BUDGET_FRACTION, 0.3, 0}, tok = {KVB_BUDGET_TOKENS, 0, 64};
    kvb_opts o = {0};
    CU_ASSERT_FATAL(kvb_opts_add(&o, "base=none", err, sizeof err) == 0);
    CU_ASSERT(kvb_method_create("think", c, &b30, &o, err, sizeof err) == NULL);
    char floor_txt[32];
    snprintf(floor_txt, sizeof floor_txt, "(%.1f%% of the cache", 100 * slot_share(c, 1, 2));
    CU_ASSERT(strstr(err, "below the share") && strstr(err, floor_txt));
    CU_ASSERT(kvb_method_create("think", c, &tok, &o, err, sizeof err) == NULL && strstr(err, "token budget"));
    kvb_method *m = util_make_method("think", c, "60%", "lambda=0.25,base=none");
    int32_t ids[40];
    for (int i = 0; i < 40; i++) ids[i] = 5 + i;
    CU_ASSERT(kvb_method_prefill(m, c, ids, 40, err, sizeof err) == -1 && strstr(err, "below the share lambda=0.25"));
    kvb_method_free(m, c);
    kvb_ctx_free(c);
    kvb_method_needs nd;
    CU_ASSERT(kvb_method_needs_of("think", NULL, &nd, err, sizeof err) == 0 && nd.needs_budget && nd.shares_prefill &&
              nd.obs_window == 32 && !nd.prefill_scores && !nd.own_prefill && !nd.profile);
}

/* The float64 top dk channels of keys k (n rows, dtype dt) against the window rows wq ([w][NH*HD]) of KV head g. */
static double ref_channels_of(const float *wq, int w, const void *k, int64_t n, kvb_dtype dt, int g, int dk, int32_t *want) {
    double score[HD], margin = 1, kth = 1;
    for (int ch = 0; ch < HD; ch++) {
        double qs = 0, ks = 0;
        for (int t = 0; t < w; t++)
            for (int r = 0; r < G; r++) qs += (double)wq[t * NH * HD + (g * G + r) * HD + ch] * wq[t * NH * HD + (g * G + r) * HD + ch];
        for (int64_t i = 0; i < n; i++) ks += util_elem(k, dt, (size_t)i * HD + ch) * util_elem(k, dt, (size_t)i * HD + ch);
        score[ch] = qs * ks;
    }
    util_topk_ref(score, HD, dk, want, &margin, &kth);
    return margin / kth;
}

/* Below lambda's share (base=snapkv, the default): the prompt tokens ThinK keeps per head are SnapKV's at that token
 * budget (the same kept positions as the snapkv method keeps), their keys' channels are the float64 top d' over those
 * keys, the measured share is the budget, and decode appends whole tokens. */
static void test_below_lambdas_share_snapkv_keeps_the_tokens_then_channels_are_pruned(void) {
    char err[256];
    enum { N = 200 };
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = 3 + (i * 41) % 290;
    kvb_ctx *c = util_tiny_ctx(KVB_F16, CTX);
    c->params.keep_window = 1; /* the reference below reads the window ThinK scored channels with */
    kvb_method *m = util_make_method("think", c, "35%", NULL);
    CU_ASSERT_FATAL(kvb_method_prefill(m, c, ids, N, err, sizeof err) == 0);
    const int dk = HD - (int)(0.4 * HD); /* lambda 0.4, kvpress's int() */
    kvb_kv_usage u;
    kvb_method_usage(m, c, &u);
    CU_ASSERT(fabs(u.device_frac - 0.35) < 0.01 * 0.35 + 1.0 / N);
    const int64_t keep = m->def->read_outside(m, c, 0);
    CU_ASSERT(keep > 32 && keep < N);
    CU_ASSERT(fabs((double)keep * ((dk + HD) * 2 + 4) - 0.35 * N * kvc_slot_bytes(c->kv)) <= ((dk + HD) * 2 + 4));
    char budget[32];
    snprintf(budget, sizeof budget, "%lld", (long long)keep);
    kvb_ctx *sc = util_tiny_ctx(KVB_F16, CTX);
    kvb_method *sm = util_make_method("snapkv", sc, budget, NULL);
    CU_ASSERT_FATAL(kvb_method_prefill(sm, sc, ids, N, err, sizeof err) == 0);
    float wq[32 * NH * HD];
    CU_ASSERT_FATAL(c->obs_n == 32);
    int wrong_pos = 0, wrong_ch = 0, near_ties = 0;
    for (int l = 0; l < L; l++) {
        util_dev_read(c->be, wq, c->obs_q + (size_t)l * c->obs_cap * c->model->cfg.q_dim, sizeof wq);
        for (int g = 0; g < NKV; g++) {
            int32_t got_pos[N], snap_pos[CTX], got_ch[HD], want_ch[HD];
            CU_ASSERT_FATAL(m->def->outside_positions(m, c, l, g, got_pos) == 0);
            CU_ASSERT_EQUAL_FATAL(util_head_positions(sc, l, g, snap_pos), keep);
            wrong_pos += memcmp(got_pos, snap_pos, (size_t)keep * sizeof *got_pos) != 0; /* both in slot order, ascending */
            util_kv_head hv = util_kv_head_copy(sc->kv, l, g);
            near_ties += ref_channels_of(wq, 32, hv.k, hv.n, KVB_F16, g, dk, want_ch) < 1e-4;
            CU_ASSERT_EQUAL_FATAL(kvb_think_channels(m, c, l, g, got_ch, err, sizeof err), dk);
            wrong_ch += memcmp(got_ch, want_ch, (size_t)dk * sizeof *got_ch) != 0;
            util_kv_head_free(&hv);
        }
    }
    CU_ASSERT_EQUAL(near_ties, 0);
    CU_ASSERT_EQUAL(wrong_pos, 0);
    CU_ASSERT_EQUAL(wrong_ch, 0);
    for (int s = 0; s < 3; s++) {
        const int32_t id = sampler_argmax(c->logits, V);
        CU_ASSERT_FATAL(kvb_forward(c, &id, 1, err, sizeof err) == 0);
        CU_ASSERT(kvb_method_verify(m, c, 0, err, sizeof err) == 0);
    }
    CU_ASSERT_EQUAL(kvc_n(c->kv, 1, 0), 3);
    kvb_method_free(sm, sc);
    kvb_ctx_free(sc);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

/* lambda=0 prunes no channel, so below 100% SnapKV's tokens stay whole in the store: the same positions, K and V as
 * the snapkv method keeps at the budget, and the run's verification holds. */
static void test_lambda_zero_below_the_budget_is_snapkv(void) {
    char err[256];
    enum { N = 160 };
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = 7 + (i * 29) % 290;
    kvb_ctx *c = util_tiny_ctx(KVB_F32, CTX), *sc = util_tiny_ctx(KVB_F32, CTX);
    kvb_method *m = util_make_method("think", c, "40%", "lambda=0"), *sm = util_make_method("snapkv", sc, "40%", NULL);
    CU_ASSERT_FATAL(kvb_method_prefill(m, c, ids, N, err, sizeof err) == 0);
    CU_ASSERT_FATAL(kvb_method_prefill(sm, sc, ids, N, err, sizeof err) == 0);
    CU_ASSERT(kvb_method_verify(m, c, 1, err, sizeof err) == 0);
    CU_ASSERT_EQUAL(m->def->read_outside(m, c, 0), 0);
    int differ = 0;
    for (int l = 0; l < L; l++)
        for (int g = 0; g < NKV; g++) {
            util_kv_head a = util_kv_head_copy(c->kv, l, g), b = util_kv_head_copy(sc->kv, l, g);
            differ += a.n != 64 || b.n != 64 || memcmp(a.pos, b.pos, 64 * sizeof *a.pos) || memcmp(a.k, b.k, 64 * HD * 4) ||
                      memcmp(a.v, b.v, 64 * HD * 4);
            util_kv_head_free(&a), util_kv_head_free(&b);
        }
    CU_ASSERT_EQUAL(differ, 0);
    kvb_method_free(sm, sc), kvb_method_free(m, c);
    kvb_ctx_free(sc), kvb_ctx_free(c);
}

static int setup(void) {
    const util_tiny_shape shape = {"think", L, E, NH, NKV, FF, V, CTX};
    return util_tiny_setup(&shape, &rng);
}

static int teardown(void) { return util_tiny_teardown(); }

int main(void) {
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("think", setup, teardown);
    CU_add_test(s, "kept channels = float64 top d' of |Q_w[:,c]|^2 |K[:,c]|^2; split attention = pruned-key reference (f32)",
                test_kept_channels_and_split_attention_f32);
    CU_add_test(s, "kept channels and split attention (f16 store)", test_kept_channels_and_split_attention_f16);
    CU_add_test(s, "one kept channel", test_one_channel_kept);
    CU_add_test(s, "a Mem% budget picks d', holds its share, decode appends whole tokens",
                test_engine_budget_derives_channels_and_decode_appends_whole_tokens);
    CU_add_test(s, "budget 100% and lambda=0 decode as full attention", test_full_budget_and_lambda_zero_decode_as_full_attention);
    CU_add_test(s, "below lambda's share SnapKV keeps the tokens, then their key channels are pruned",
                test_below_lambdas_share_snapkv_keeps_the_tokens_then_channels_are_pruned);
    CU_add_test(s, "lambda=0 below the budget keeps SnapKV's tokens whole", test_lambda_zero_below_the_budget_is_snapkv);
    CU_add_test(s, "refusals name the problem", test_refusals_name_the_problem);
    return util_run_suites();
}
