/* test_attention.c — cpu_attention against a naive float64 attention: GQA shapes, f32/f16 KV,
 * index lists, causal masks with position gaps, probs and lse, 1 vs 2 threads bit for bit; and
 * cpu_attention_window (arch_ops.c: sliding-window layers) the same way with the window in the mask. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util_common.h"
#include "kernels/dtype.h"
#include "kernels/cpu/arch_ops.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/pool.h"

static uint64_t rng_state = 0x1234567ull;
static uint64_t rng_u64(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double rng_unit(void) { return (double)(rng_u64() >> 11) * (1.0 / 9007199254740992.0); }
UTIL_REFERENCE static float rng_normal(void) {
    double u = rng_unit() + 1e-300, v = rng_unit();
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

static kvb_pool *pool2;
static double max_err_out, max_err_probs, max_rel_probs, max_tol_probs, max_err_lse;

typedef struct {
    int n_head, n_head_kv, d;
    int64_t n_q, n_kv;
    kvb_dtype dt;
    int use_idx, use_mask, query_before_all; /* query_before_all: first query precedes every key */
    int32_t window;                          /* > 0: through cpu_attention_window, key visible iff q - window < k */
    int no_extras;                           /* no probs, no lse (f32 windows: llama.cpp's per-row order) */
} cfg;

/* one problem instance with its own buffers */
typedef struct {
    cfg c;
    float *q;
    int32_t *q_pos;
    void *k[64], *v[64];
    float *kf[64], *vf[64]; /* the values attention must see (f16-rounded when dt is f16) */
    int32_t *k_pos[64], *idx[64];
    int64_t n_kv[64], n_idx[64], L_max, stride;
} problem;

static void problem_init(problem *p, const cfg *c) {
    memset(p, 0, sizeof *p);
    p->c = *c;
    const int D = c->d;
    p->q = malloc(sizeof(float) * c->n_q * c->n_head * D);
    for (int64_t i = 0; i < c->n_q * c->n_head * D; i++) p->q[i] = 2.0f * rng_normal();
    int32_t pos_max = 0;
    for (int g = 0; g < c->n_head_kv; g++) {
        const int64_t n = c->n_kv - (g % 2) * (c->n_kv / 7); /* heads hold different numbers of slots */
        p->n_kv[g] = n;
        p->kf[g] = malloc(sizeof(float) * (n * D + 1));
        p->vf[g] = malloc(sizeof(float) * (n * D + 1));
        const size_t es = c->dt == KVB_F16 ? 2 : 4;
        p->k[g] = malloc(es * (n * D + 1));
        p->v[g] = malloc(es * (n * D + 1));
        for (int64_t i = 0; i < n * D; i++) {
            float kv = rng_normal(), vv = rng_normal();
            if (c->dt == KVB_F16) {
                ((uint16_t *)p->k[g])[i] = kvb_f32_to_f16(kv);
                ((uint16_t *)p->v[g])[i] = kvb_f32_to_f16(vv);
                kv = kvb_f16_to_f32(kvb_f32_to_f16(kv));
                vv = kvb_f16_to_f32(kvb_f32_to_f16(vv));
            } else {
                ((float *)p->k[g])[i] = kv;
                ((float *)p->v[g])[i] = vv;
            }
            p->kf[g][i] = kv;
            p->vf[g][i] = vv;
        }
        /* increasing positions with gaps, as left by eviction */
        p->k_pos[g] = malloc(sizeof(int32_t) * (n + 1));
        int32_t pos = (int32_t)(rng_u64() % 3);
        for (int64_t i = 0; i < n; i++) {
            p->k_pos[g][i] = pos;
            pos += 1 + (rng_u64() % 3 == 0 ? (int32_t)(rng_u64() % 6) : 0);
        }
        if (n > 0 && p->k_pos[g][n - 1] > pos_max) pos_max = p->k_pos[g][n - 1];
        p->n_idx[g] = n;
        if (c->use_idx && g != 1) { /* head 1 keeps a NULL entry: all slots */
            int32_t *perm = malloc(sizeof(int32_t) * (n + 1));
            for (int64_t i = 0; i < n; i++) perm[i] = (int32_t)i;
            for (int64_t i = n - 1; i > 0; i--) {
                int64_t j = (int64_t)(rng_u64() % (uint64_t)(i + 1));
                int32_t t = perm[i];
                perm[i] = perm[j];
                perm[j] = t;
            }
            p->idx[g] = perm; /* unsorted, no duplicates */
            p->n_idx[g] = n > 1 ? n / 2 + 1 : n;
        }
        if (p->n_idx[g] > p->L_max) p->L_max = p->n_idx[g];
    }
    /* the queries are the newest tokens: the last of them sees everything, earlier ones less */
    p->q_pos = malloc(sizeof(int32_t) * c->n_q);
    for (int64_t t = 0; t < c->n_q; t++) p->q_pos[t] = pos_max - (int32_t)(c->n_q - 1 - t) * 2;
    if (c->query_before_all) p->q_pos[0] = -5;
    p->stride = p->L_max + 3;
}

static void problem_free(problem *p) {
    free(p->q), free(p->q_pos);
    for (int g = 0; g < p->c.n_head_kv; g++) {
        free(p->k[g]), free(p->v[g]), free(p->kf[g]), free(p->vf[g]), free(p->k_pos[g]), free(p->idx[g]);
    }
}

typedef struct {
    float *out, *probs, *lse;
} result;

static int run_attn(const problem *p, kvb_pool *pool, result *r, char *err) {
    const cfg *c = &p->c;
    cpu_attn_args a;
    memset(&a, 0, sizeof a);
    a.n_q = c->n_q;
    a.n_head = c->n_head;
    a.n_head_kv = c->n_head_kv;
    a.head_dim = c->d;
    a.q = p->q;
    a.q_pos = c->use_mask ? p->q_pos : NULL;
    a.kv_dtype = c->dt;
    a.k = (const void *const *)p->k;
    a.v = (const void *const *)p->v;
    a.k_pos = (const int32_t *const *)p->k_pos;
    a.n_kv = p->n_kv;
    a.idx = c->use_idx ? (const int32_t *const *)p->idx : NULL;
    a.n_idx = p->n_idx;
    a.scale = 1.0f / sqrtf((float)c->d);
    const size_t n_out = (size_t)c->n_q * c->n_head * c->d, n_probs = (size_t)c->n_head * c->n_q * p->stride;
    r->out = malloc(sizeof(float) * n_out);
    r->probs = malloc(sizeof(float) * n_probs);
    r->lse = malloc(sizeof(float) * c->n_q * c->n_head);
    for (size_t i = 0; i < n_probs; i++) r->probs[i] = 12345.0f; /* sentinel: past the list stays untouched */
    a.out = r->out;
    if (!c->no_extras) {
        a.probs = r->probs;
        a.probs_stride = p->stride;
        a.lse = r->lse;
    }
    a.window = c->window;
    a.ws_bytes = cpu_attention_ws_bytes(&a, kvb_pool_size(pool));
    a.ws = malloc(a.ws_bytes);
    int rc = c->window ? cpu_attention_window(&a, pool, err, 256) : cpu_attention(&a, pool, err, 256);
    free(a.ws);
    return rc;
}

static void result_free(result *r) { free(r->out), free(r->probs), free(r->lse); }

/* naive float64 attention for every (head, query) */
UTIL_REFERENCE static void check_against_reference(const problem *p, const result *r) {
    const cfg *c = &p->c;
    const int D = c->d, G = c->n_head / c->n_head_kv;
    const double scale = 1.0f / sqrtf((float)D);
    double *s = malloc(sizeof(double) * (p->L_max + 1)), *o = malloc(sizeof(double) * D);
    double *mag = malloc(sizeof(double) * (p->L_max + 1)); /* scale * sum |q_d k_d|: size of the f32 dot error */
    for (int h = 0; h < c->n_head; h++) {
        const int g = h / G;
        const int64_t L = p->n_idx[g];
        for (int64_t t = 0; t < c->n_q; t++) {
            const float *qr = p->q + (t * c->n_head + h) * D;
            double M = -INFINITY, magM = 0;
            for (int64_t j = 0; j < L; j++) {
                const int64_t slot = (c->use_idx && p->idx[g]) ? p->idx[g][j] : j;
                if (c->use_mask && (p->k_pos[g][slot] > p->q_pos[t] ||
                                    (c->window > 0 && (int64_t)p->q_pos[t] - p->k_pos[g][slot] >= c->window))) {
                    s[j] = -INFINITY;
                    continue;
                }
                double dot = 0, am = 0;
                for (int d = 0; d < D; d++) {
                    dot += (double)qr[d] * p->kf[g][slot * D + d];
                    am += fabs((double)qr[d] * p->kf[g][slot * D + d]);
                }
                s[j] = dot * scale;
                mag[j] = am * scale;
                if (s[j] > M) M = s[j], magM = mag[j];
            }
            double sum = 0;
            for (int d = 0; d < D; d++) o[d] = 0;
            for (int64_t j = 0; j < L; j++) {
                if (s[j] == -INFINITY) continue;
                const int64_t slot = (c->use_idx && p->idx[g]) ? p->idx[g][j] : j;
                const double e = exp(s[j] - M);
                sum += e;
                for (int d = 0; d < D; d++) o[d] += e * p->vf[g][slot * D + d];
            }
            const float *ro = r->out + (t * c->n_head + h) * D;
            for (int d = 0; d < D; d++) {
                const double ref = sum > 0 ? o[d] / sum : 0.0;
                const double e = fabs(ro[d] - ref);
                if (e > max_err_out) max_err_out = e;
                CU_ASSERT(e < 2e-5);
            }
            if (c->no_extras) continue;
            const float lse = r->lse[h * c->n_q + t];
            if (sum > 0) {
                const double e = fabs(lse - (M + log(sum)));
                if (e > max_err_lse) max_err_lse = e;
                CU_ASSERT(e < 1e-5 * (1.0 + fabs(M)));
            } else {
                CU_ASSERT(lse == -INFINITY);
            }
            const float *pr = r->probs + (h * c->n_q + t) * p->stride;
            for (int64_t j = 0; j < L; j++) {
                const double ref = (sum > 0 && s[j] != -INFINITY) ? exp(s[j] - M) / sum : 0.0;
                const double e = fabs(pr[j] - ref);
                if (e > max_err_probs) max_err_probs = e;
                if (ref > 1e-6 && e / ref > max_rel_probs) max_rel_probs = e / ref;
                /* relative error of p = error of s - M: the f32 dot errors of s and M (a few ulps of the
                 * sum of |terms|), plus the float rounding of s - M, plus a few ulps for exp and 1/sum */
                const double tol =
                    ref == 0.0 ? 0.0 : ref * (1e-6 + fabs(s[j] - M) * 1.2e-7 + (mag[j] + magM) * 2.4e-7);
                if (ref > 1e-6 && e / tol > max_tol_probs) max_tol_probs = e / tol;
                CU_ASSERT(e <= tol + 1e-10);
                if (ref == 0.0) CU_ASSERT(pr[j] == 0.0f);
            }
            for (int64_t j = L; j < p->stride; j++) CU_ASSERT(pr[j] == 12345.0f);
        }
    }
    free(s), free(o), free(mag);
}

static int same_bits(const problem *p, const result *a, const result *b) {
    const cfg *c = &p->c;
    if (c->no_extras) return !memcmp(a->out, b->out, sizeof(float) * c->n_q * c->n_head * c->d);
    return !memcmp(a->out, b->out, sizeof(float) * c->n_q * c->n_head * c->d) &&
           !memcmp(a->probs, b->probs, sizeof(float) * c->n_head * c->n_q * p->stride) &&
           !memcmp(a->lse, b->lse, sizeof(float) * c->n_q * c->n_head);
}

static const int shapes[3][3] = {{9, 3, 64}, {32, 8, 128}, {4, 4, 80}};
static const int64_t nqs[3] = {1, 5, 37}, nkvs[3] = {1, 63, 1000};

/* every shape x n_q x n_kv x dtype x index list x mask; check(p, result with 2 threads) */
static void sweep(int with_reference) {
    char err[256];
    for (int si = 0; si < 3; si++)
        for (int qi = 0; qi < 3; qi++)
            for (int ki = 0; ki < 3; ki++)
                for (int dt = 0; dt < 2; dt++)
                    for (int ui = 0; ui < 2; ui++)
                        for (int mi = 0; mi < 2; mi++) {
                            cfg c = {shapes[si][0], shapes[si][1], shapes[si][2], nqs[qi], nkvs[ki],
                                     dt ? KVB_F16 : KVB_F32, ui, mi, 0, 0, 0};
                            problem p;
                            problem_init(&p, &c);
                            result r2;
                            int rc = run_attn(&p, pool2, &r2, err);
                            CU_ASSERT_EQUAL_FATAL(rc, 0);
                            if (with_reference) {
                                check_against_reference(&p, &r2);
                            } else {
                                result r1;
                                CU_ASSERT_EQUAL_FATAL(run_attn(&p, NULL, &r1, err), 0);
                                CU_ASSERT(same_bits(&p, &r1, &r2));
                                result_free(&r1);
                            }
                            result_free(&r2);
                            problem_free(&p);
                        }
}

static void test_attention_matches_f64_over_shapes_dtypes_masks_and_index_lists(void) { sweep(1); }

static void test_attention_one_and_two_threads_give_identical_bits(void) { sweep(0); }

static void test_long_decode_splits_keys_and_matches_reference(void) {
    const cfg cs[] = {{9, 3, 64, 1, 8000, KVB_F16, 0, 1, 0, 0, 0}, {9, 3, 64, 1, 8000, KVB_F32, 1, 0, 0, 0, 0},
                      {8, 2, 128, 32, 3000, KVB_F16, 0, 0, 0, 0, 0} /* SnapKV-style window scores, no mask */};
    char err[256];
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) {
        problem p;
        problem_init(&p, &cs[i]);
        result r1, r2;
        CU_ASSERT_EQUAL_FATAL(run_attn(&p, pool2, &r2, err), 0);
        CU_ASSERT_EQUAL_FATAL(run_attn(&p, NULL, &r1, err), 0);
        check_against_reference(&p, &r2);
        CU_ASSERT(same_bits(&p, &r1, &r2));
        result_free(&r1), result_free(&r2);
        problem_free(&p);
    }
}

static void test_head_dims_off_the_vector_width_use_fallback_kernels_and_match(void) {
    /* 72: not a multiple of the AVX-512 width; 256: too wide to keep a row in registers */
    const int dims[2] = {72, 256};
    const int64_t nq[3] = {1, 5, 37};
    char err[256];
    for (int di = 0; di < 2; di++)
        for (int qi = 0; qi < 3; qi++)
            for (int v = 0; v < 4; v++) {
                const cfg c = {4, 2, dims[di], nq[qi], 300, v & 1 ? KVB_F16 : KVB_F32, v >> 1, 1, 0, 0, 0};
                problem p;
                problem_init(&p, &c);
                result r1, r2;
                CU_ASSERT_EQUAL_FATAL(run_attn(&p, pool2, &r2, err), 0);
                CU_ASSERT_EQUAL_FATAL(run_attn(&p, NULL, &r1, err), 0);
                check_against_reference(&p, &r2);
                CU_ASSERT(same_bits(&p, &r1, &r2));
                result_free(&r1), result_free(&r2);
                problem_free(&p);
            }
}

static void test_query_with_no_visible_key_gets_zero_output_and_minus_inf_lse(void) {
    const cfg cs[] = {{9, 3, 64, 1, 100, KVB_F16, 0, 1, 1, 0, 0}, {9, 3, 64, 37, 1000, KVB_F32, 1, 1, 1, 0, 0},
                      {4, 4, 80, 5, 1, KVB_F32, 0, 1, 1, 0, 0}};
    char err[256];
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) {
        problem p;
        problem_init(&p, &cs[i]);
        result r;
        CU_ASSERT_EQUAL_FATAL(run_attn(&p, pool2, &r, err), 0);
        check_against_reference(&p, &r); /* also checks probs 0 for the blind query */
        for (int h = 0; h < cs[i].n_head; h++) {
            CU_ASSERT(r.lse[h * cs[i].n_q + 0] == -INFINITY);
            for (int d = 0; d < cs[i].d; d++) CU_ASSERT(r.out[h * cs[i].d + d] == 0.0f);
        }
        result_free(&r);
        problem_free(&p);
    }
}

/* Sliding windows (Gemma 3's local layers, Mistral): windows from 1 (the query's own position only) to longer
 * than the list, GQA shapes with Gemma-3-270M's (4 heads on 1 KV head of 256), prefill blocks and decode, f16 and
 * f32, unsorted index lists, with and without probs/lse (f32 without them: llama.cpp's per-row order; the rest:
 * attention.c's tiled kernel with the window masked and whole blocks outside it skipped). */
static void test_window_attention_matches_f64_and_one_and_two_threads_agree(void) {
    static const int shp[3][3] = {{4, 1, 256}, {9, 3, 64}, {8, 2, 72}};
    static const int32_t windows[4] = {1, 13, 100, 4000};
    static const int64_t nq[3] = {1, 37, 130};
    char err[256];
    int n_cases = 0;
    for (int si = 0; si < 3; si++)
        for (int wi = 0; wi < 4; wi++)
            for (int qi = 0; qi < 3; qi++)
                for (int v = 0; v < 8; v++) {
                    if ((si + wi + qi + v) % 2) continue; /* half the grid: every pair of options still meets */
                    const int f16 = v & 1, idx = (v >> 1) & 1, extras = v >> 2;
                    const cfg c = {shp[si][0], shp[si][1], shp[si][2], nq[qi], 600, f16 ? KVB_F16 : KVB_F32,
                                   idx, 1, qi == 1, windows[wi], !extras};
                    problem p;
                    problem_init(&p, &c);
                    result r1, r2;
                    CU_ASSERT_EQUAL_FATAL(run_attn(&p, pool2, &r2, err), 0);
                    CU_ASSERT_EQUAL_FATAL(run_attn(&p, NULL, &r1, err), 0);
                    check_against_reference(&p, &r2);
                    CU_ASSERT(same_bits(&p, &r1, &r2));
                    result_free(&r1), result_free(&r2);
                    problem_free(&p);
                    n_cases++;
                }
    printf("\n    %d windowed cases", n_cases);
}

/* A window only changes which keys are visible: with a window longer than every distance it equals cpu_attention
 * bit for bit on the tiled path (the same items, blocks and roundings); window 0 is refused with one line. */
static void test_window_longer_than_the_list_equals_causal_attention_bit_for_bit(void) {
    char err[256];
    for (int f16 = 0; f16 < 2; f16++) {
        cfg c = {4, 1, 256, 37, 500, f16 ? KVB_F16 : KVB_F32, 0, 1, 0, 0, 0};
        problem p;
        problem_init(&p, &c);
        result rc, rw;
        CU_ASSERT_EQUAL_FATAL(run_attn(&p, pool2, &rc, err), 0);
        p.c.window = 1 << 30;
        CU_ASSERT_EQUAL_FATAL(run_attn(&p, pool2, &rw, err), 0);
        CU_ASSERT(same_bits(&p, &rc, &rw));
        result_free(&rc), result_free(&rw);
        p.c.window = 0;
        cpu_attn_args a;
        memset(&a, 0, sizeof a);
        a.n_q = 1, a.n_head = 4, a.n_head_kv = 1, a.head_dim = 256, a.q = p.q, a.q_pos = p.q_pos;
        a.kv_dtype = c.dt, a.k = (const void *const *)p.k, a.v = (const void *const *)p.v;
        a.k_pos = (const int32_t *const *)p.k_pos, a.n_kv = p.n_kv, a.n_idx = p.n_idx, a.scale = 0.0625f;
        float out[4 * 256];
        a.out = out;
        err[0] = 0;
        CU_ASSERT_EQUAL(cpu_attention_window(&a, pool2, err, sizeof err), -1);
        CU_ASSERT(strstr(err, "window") != NULL);
        CU_ASSERT_EQUAL(cpu_attention_banded(&a, pool2, err, sizeof err), -1);
        problem_free(&p);
    }
}

static void test_bad_arguments_are_rejected_with_a_message(void) {
    cfg c = {9, 3, 64, 5, 63, KVB_F32, 1, 1, 0, 0, 0};
    problem p;
    problem_init(&p, &c);
    cpu_attn_args a;
    memset(&a, 0, sizeof a);
    float out[5 * 9 * 64], probs[9 * 5 * 100];
    a.n_q = 5, a.n_head = 9, a.n_head_kv = 3, a.head_dim = 64, a.q = p.q, a.q_pos = p.q_pos;
    a.kv_dtype = KVB_F32, a.k = (const void *const *)p.k, a.v = (const void *const *)p.v;
    a.k_pos = (const int32_t *const *)p.k_pos, a.n_kv = p.n_kv, a.idx = (const int32_t *const *)p.idx;
    a.n_idx = p.n_idx, a.scale = 0.125f, a.out = out;
    a.ws_bytes = cpu_attention_ws_bytes(&a, 2);
    CU_ASSERT(a.ws_bytes > 0);
    a.ws = malloc(a.ws_bytes);
    char err[256] = "";
    CU_ASSERT_EQUAL(cpu_attention(&a, pool2, err, sizeof err), 0);

    int32_t saved = p.idx[0][3];
    p.idx[0][3] = (int32_t)p.n_kv[0];
    err[0] = 0;
    CU_ASSERT_EQUAL(cpu_attention(&a, pool2, err, sizeof err), -1);
    CU_ASSERT(strstr(err, "idx[0]") != NULL);
    p.idx[0][3] = saved;

    a.probs = probs, a.probs_stride = 10;
    err[0] = 0;
    CU_ASSERT_EQUAL(cpu_attention(&a, pool2, err, sizeof err), -1);
    CU_ASSERT(strstr(err, "probs_stride") != NULL);
    a.probs = NULL;

    a.ws_bytes -= 1;
    err[0] = 0;
    CU_ASSERT_EQUAL(cpu_attention(&a, pool2, err, sizeof err), -1);
    CU_ASSERT(strstr(err, "workspace") != NULL);
    a.ws_bytes += 1;

    a.n_head_kv = 4;
    err[0] = 0;
    CU_ASSERT_EQUAL(cpu_attention(&a, pool2, err, sizeof err), -1);
    CU_ASSERT(err[0] != 0);
    CU_ASSERT_EQUAL(cpu_attention_ws_bytes(&a, 2), 0);
    free(a.ws);
    problem_free(&p);
}

int main(void) {
    pool2 = kvb_pool_create(2);
    if (!pool2 || CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("attention", NULL, NULL);
    CU_add_test(s, "attention matches f64 over shapes, dtypes, masks and index lists",
                test_attention_matches_f64_over_shapes_dtypes_masks_and_index_lists);
    CU_add_test(s, "attention with one and two threads gives identical bits",
                test_attention_one_and_two_threads_give_identical_bits);
    CU_add_test(s, "long decode splits keys and matches reference", test_long_decode_splits_keys_and_matches_reference);
    CU_add_test(s, "head dims off the vector width use fallback kernels and match",
                test_head_dims_off_the_vector_width_use_fallback_kernels_and_match);
    CU_add_test(s, "query with no visible key gets zero output and -inf lse",
                test_query_with_no_visible_key_gets_zero_output_and_minus_inf_lse);
    CU_add_test(s, "window attention matches f64, and one and two threads agree",
                test_window_attention_matches_f64_and_one_and_two_threads_agree);
    CU_add_test(s, "window longer than the list equals causal attention bit for bit",
                test_window_longer_than_the_list_equals_causal_attention_bit_for_bit);
    CU_add_test(s, "bad arguments are rejected with a message", test_bad_arguments_are_rejected_with_a_message);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    printf("\nmax errors vs f64: out abs %.3g, probs abs %.3g (rel %.3g), lse abs %.3g; "
           "worst probs error / tolerance %.2f\n",
           max_err_out, max_err_probs, max_rel_probs, max_err_lse, max_tol_probs);
    const unsigned fails = CU_get_number_of_failures();
    CU_cleanup_registry();
    kvb_pool_free(pool2);
    return fails != 0;
}
