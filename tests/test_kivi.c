/* test_kivi.c — KIVI (methods/kivi.c) and its ops (kernels/backend.h, "KIVI"): quant_groups and attention_quant
 * on every backend present against a float64 restatement of the header here, and the method on a tiny model
 * (its store, its bytes and its memory formula, and where it must equal full attention).
 *
 * The group records are decoded here from the header's layout, not by the backend's code: the quantization
 * error is held to its bound (|x - x'| <= s/2 per element), attention over quantized KV to a float64 softmax
 * over the same dequantized bits plus the store's rows. Shapes are random per case (seeded): GQA groups 1 and 3,
 * f16 and f32 rows, 2, 4 and 8 bits, groups of 8 and 32, queries inside the quantized range (masked tokens,
 * rows that see no store token). Runs again under KVB_GUARD (test_kivi_guard). On a hybrid model (the seeded
 * gemma3-deep, tests/util_arch_model.h) the local layers keep their windows in full precision and the global layers
 * are quantized, the bytes and the formula counting both. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "kernels/dtype.h"
#include "engine/model.h"
#include "methods/method.h"
#include "util_arch_model.h"
#include "util_common.h"
#include "util_gguf_writer.h"

static kvb_backend *backends[2];
static int n_backends;

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rng_u64(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static int64_t rnd(int64_t n) { return n > 0 ? (int64_t)(rng_u64() % (uint64_t)n) : 0; }
static double unit(void) { return (double)(rng_u64() >> 11) * (1.0 / 9007199254740992.0); }

static void *dev(kvb_backend *be, size_t bytes) {
    void *p = be->allocator->alloc(be->allocator->user, KVB_TIER_DEVICE, bytes ? bytes : 4);
    CU_ASSERT_FATAL(p != NULL);
    return p;
}
static void dev_free(kvb_backend *be, void *p, size_t bytes) {
    if (be->sync) be->sync(be);
    be->allocator->free(be->allocator->user, KVB_TIER_DEVICE, p, bytes ? bytes : 4);
}
static void *up(kvb_backend *be, const void *src, size_t bytes) {
    void *d = dev(be, bytes);
    if (bytes) util_dev_write(be, d, src, bytes);
    return d;
}

static size_t elt(kvb_dtype dt) { return dt == KVB_F16 ? 2 : 4; }
/* n values of dtype (f16 ones rounded to f16), mostly in [-2, 2); a column in eight gets 10x (outlier channels) */
static void fill_rows(void *rows, double *val, int64_t n, int d, kvb_dtype dt) {
    for (int64_t i = 0; i < n * d; i++) {
        float x = (float)((unit() * 4 - 2) * (i % d % 8 == 3 ? 10 : 1));
        if (dt == KVB_F16) ((kvb_f16 *)rows)[i] = kvb_f32_to_f16(x), val[i] = kvb_f16_to_f32(((kvb_f16 *)rows)[i]);
        else ((float *)rows)[i] = x, val[i] = x;
    }
}

/* ---- the header's record layout, restated ---- */

typedef struct {
    double s, z;
    int code;
} decoded;

static decoded decode(const uint8_t *rec, int G, int bits, int i) {
    decoded d;
    const int bit = i * bits;
    d.code = (rec[bit / 8] >> (bit % 8)) & ((1 << bits) - 1);
    kvb_f16 sh, zh;
    memcpy(&sh, rec + G * bits / 8, 2);
    memcpy(&zh, rec + G * bits / 8 + 2, 2);
    d.s = kvb_f16_to_f32(sh);
    d.z = kvb_f16_to_f32(zh);
    return d;
}
static double deq(const uint8_t *rec, int G, int bits, int i) {
    decoded d = decode(rec, G, bits, i);
    return (float)((float)d.z + (float)d.code * (float)d.s);
}
/* element of a quantized K (per channel) or V (per token) segment of head_dim D */
static double deq_k(const uint8_t *k, int64_t tok, int e, int D, int G, int bits) {
    return deq(k + (size_t)(tok / G * D + e) * kvb_quant_group_bytes(G, bits), G, bits, (int)(tok % G));
}
static double deq_v(const uint8_t *v, int64_t tok, int e, int D, int G, int bits) {
    return deq(v + (size_t)(tok * (D / G) + e / G) * kvb_quant_group_bytes(G, bits), G, bits, e % G);
}

/* ---- quant_groups ---- */

/* index of element i of group gi in n rows of D (the header's layouts) */
static int64_t group_elem(int per_channel, int64_t gi, int i, int D, int G) {
    return per_channel ? (gi / D * G + i) * D + gi % D : gi / (D / G) * D + gi % (D / G) * G + i;
}

/* Quantize seeded rows on be and check every element against the bound; returns the records (host, malloc'd). */
static uint8_t *check_quant(kvb_backend *be, uint64_t seed, int per_channel, int64_t n, int D, int G, int bits,
                            kvb_dtype dt) {
    char err[256];
    void *rows = malloc((size_t)n * D * elt(dt));
    double *val = malloc((size_t)n * D * sizeof *val);
    rng_state = seed; /* the same rows on every backend */
    fill_rows(rows, val, n, D, dt);
    for (int64_t t = 0; per_channel && t < G; t++) { /* a constant group (column 1, first block): s = 0, exact */
        if (dt == KVB_F16) ((kvb_f16 *)rows)[t * D + 1] = kvb_f32_to_f16(0.5f);
        else ((float *)rows)[t * D + 1] = 0.5f;
        val[t * D + 1] = 0.5;
    }
    const int64_t n_groups = per_channel ? n / G * D : n * (D / G);
    const size_t rb = kvb_quant_group_bytes(G, bits), bytes = (size_t)n_groups * rb;
    void *x = up(be, rows, (size_t)n * D * elt(dt)), *out = dev(be, bytes);
    uint8_t *recs = malloc(bytes);
    CU_ASSERT_FATAL(be->quant_groups(be, out, x, dt, n, D, G, bits, per_channel, err, sizeof err) == 0);
    util_dev_read(be, recs, out, bytes);
    const int qmax = (1 << bits) - 1;
    int bad = 0;
    for (int64_t gi = 0; gi < n_groups; gi++) {
        const uint8_t *rec = recs + (size_t)gi * rb;
        const decoded d0 = decode(rec, G, bits, 0);
        double mn = INFINITY, mx = -INFINITY;
        for (int i = 0; i < G; i++) mn = fmin(mn, val[group_elem(per_channel, gi, i, D, G)]), mx = fmax(mx, val[group_elem(per_channel, gi, i, D, G)]);
        const double tol = 1e-6 * (fabs(d0.z) + qmax * d0.s);
        bad += !(d0.s >= 0 && d0.z <= mn && d0.z + qmax * d0.s >= mx - tol); /* the directed roundings cover the range */
        for (int i = 0; i < G; i++) {
            const double x_i = val[group_elem(per_channel, gi, i, D, G)], e = fabs(x_i - deq(rec, G, bits, i));
            if (e > d0.s / 2 + tol && !bad++)
                fprintf(stderr, "\n  %s group %lld element %d: |%g - deq| = %g > s/2 = %g\n", be->name, (long long)gi, i,
                        x_i, e, d0.s / 2);
        }
        if (per_channel && gi == 1) CU_ASSERT(d0.s == 0 && deq(rec, G, bits, G - 1) == 0.5);
    }
    CU_ASSERT(bad == 0);
    dev_free(be, x, (size_t)n * D * elt(dt));
    dev_free(be, out, bytes);
    free(rows), free(val);
    return recs;
}

static void test_quant_groups_error_within_half_a_step_and_the_same_bits_on_every_backend(void) {
    static const int dims[] = {32, 64}, grps[] = {8, 32}, bitss[] = {2, 4, 8};
    for (int di = 0; di < 2; di++)
        for (int gi = 0; gi < 2; gi++)
            for (int bi = 0; bi < 3; bi++)
                for (int dt = 0; dt < 2; dt++)
                    for (int pc = 0; pc < 2; pc++) {
                        const int G = grps[gi], D = dims[di], bits = bitss[bi];
                        const int64_t n = pc ? G * (1 + rnd(4)) : 1 + rnd(40);
                        const size_t bytes = (size_t)(pc ? n / G * D : n * (D / G)) * kvb_quant_group_bytes(G, bits);
                        const uint64_t seed = rng_u64();
                        uint8_t *cpu = check_quant(backends[0], seed, pc, n, D, G, bits, dt ? KVB_F32 : KVB_F16);
                        for (int b = 1; b < n_backends; b++) {
                            uint8_t *other = check_quant(backends[b], seed, pc, n, D, G, bits, dt ? KVB_F32 : KVB_F16);
                            CU_ASSERT(memcmp(cpu, other, bytes) == 0);
                            free(other);
                        }
                        rng_state = seed + 1;
                        free(cpu);
                    }
}

/* ---- attention_quant ---- */

typedef struct {
    int HK, Gq, D, G, bits;
    kvb_dtype dt;
    int64_t nq, nr, n_q; /* quantized tokens, store rows, queries (per KV head) */
} attn_case;

/* Max |out - ref| / (1 + |ref|) over rows, ref in float64: softmax over the quantized tokens (dequantized from the
 * records the op read) and the store's rows, causal by position. */
static void check_attention(kvb_backend *be, const attn_case *k) {
    char err[256];
    const int H = k->HK * k->Gq, D = k->D, G = k->G, bits = k->bits;
    const int64_t nk = k->nq * D / G, nv = k->nq * (D / G); /* group records of K and V per head */
    const size_t rb = kvb_quant_group_bytes(G, bits), row_bytes = (size_t)D * elt(k->dt);
    uint8_t *kq_h[4], *vq_h[4];
    double *kr_val[4], *vr_val[4];
    const void *kq[4], *vq[4], *kr[4], *vr[4];
    const int32_t *kpos[4];
    int64_t n_kv[4];
    void *tmp = malloc((size_t)(k->nq + k->nr) * row_bytes);
    double *tval = malloc((size_t)(k->nq + k->nr) * D * sizeof *tval);
    int32_t *pos = malloc((size_t)(k->nr + 1) * sizeof *pos);
    for (int64_t j = 0; j < k->nr; j++) pos[j] = (int32_t)(k->nq + j);
    for (int g = 0; g < k->HK; g++) {
        for (int kv = 0; kv < 2; kv++) { /* the quantized segment: quantized on the device, read back for the reference */
            const int64_t recs = kv ? nv : nk;
            fill_rows(tmp, tval, k->nq, D, k->dt);
            void *x = up(be, tmp, (size_t)k->nq * row_bytes), *q = dev(be, (size_t)recs * rb);
            CU_ASSERT_FATAL(be->quant_groups(be, q, x, k->dt, k->nq, D, G, bits, !kv, err, sizeof err) == 0);
            uint8_t *h = malloc((size_t)recs * rb + 1);
            util_dev_read(be, h, q, (size_t)recs * rb);
            dev_free(be, x, (size_t)k->nq * row_bytes);
            if (kv) vq[g] = q, vq_h[g] = h;
            else kq[g] = q, kq_h[g] = h;
        }
        for (int kv = 0; kv < 2; kv++) { /* the store's rows */
            double *val = malloc((size_t)k->nr * D * sizeof *val + 8);
            fill_rows(tmp, val, k->nr, D, k->dt);
            if (kv) vr[g] = up(be, tmp, (size_t)k->nr * row_bytes), vr_val[g] = val;
            else kr[g] = up(be, tmp, (size_t)k->nr * row_bytes), kr_val[g] = val;
        }
        kpos[g] = up(be, pos, (size_t)k->nr * sizeof *pos);
        n_kv[g] = k->nr;
    }
    const int64_t nqd = k->n_q * H * D;
    float *qh = malloc((size_t)nqd * sizeof *qh), *out = malloc((size_t)nqd * sizeof *out), *lse = malloc((size_t)H * k->n_q * sizeof *lse);
    int32_t *qpos = malloc((size_t)k->n_q * sizeof *qpos);
    for (int64_t i = 0; i < nqd; i++) qh[i] = (float)(unit() * 2 - 1);
    for (int64_t t = 0; t < k->n_q; t++) /* decode: the last position; a chunk: anywhere, inside the quantized range too */
        qpos[t] = (int32_t)(k->n_q == 1 ? k->nq + k->nr - 1 : rnd(k->nq + k->nr));
    kvb_attn_args a = {0};
    a.n_q = k->n_q, a.n_head = H, a.n_head_kv = k->HK, a.head_dim = D, a.kv_dtype = k->dt;
    a.q = up(be, qh, (size_t)nqd * sizeof *qh);
    a.q_pos = up(be, qpos, (size_t)k->n_q * sizeof *qpos);
    a.k = kr, a.v = vr, a.k_pos = kpos, a.n_kv = n_kv;
    a.scale = 1.0f / sqrtf((float)D);
    a.out = dev(be, (size_t)nqd * sizeof(float));
    a.lse = dev(be, (size_t)H * k->n_q * sizeof(float));
    kvb_quant_kv qkv = {kq, vq, k->nq, 0, G, bits};
    CU_ASSERT_FATAL(be->attention(be, &a, err, sizeof err) == 0);
    CU_ASSERT_FATAL(be->attention_quant(be, &a, &qkv, err, sizeof err) == 0);
    util_dev_read(be, out, a.out, (size_t)nqd * sizeof *out);
    util_dev_read(be, lse, a.lse, (size_t)H * k->n_q * sizeof *lse);
    double worst = 0, worst_lse = 0;
    double *s = malloc((size_t)(k->nq + k->nr) * sizeof *s);
    for (int64_t t = 0; t < k->n_q; t++)
        for (int h = 0; h < H; h++) {
            const int g = h / k->Gq;
            const float *qr = qh + (t * H + h) * D;
            double m = -INFINITY, l = 0;
            for (int64_t i = 0; i < k->nq + k->nr; i++) { /* quantized tokens, then the store's */
                s[i] = -INFINITY;
                if (i > qpos[t]) continue;
                double dot = 0;
                for (int e = 0; e < D; e++)
                    dot += qr[e] * (i < k->nq ? deq_k(kq_h[g], i, e, D, G, bits) : kr_val[g][(i - k->nq) * D + e]);
                s[i] = dot * a.scale;
                m = fmax(m, s[i]);
            }
            for (int64_t i = 0; i < k->nq + k->nr; i++) l += s[i] == -INFINITY ? 0 : exp(s[i] - m);
            for (int e = 0; e < D; e++) {
                double o = 0;
                for (int64_t i = 0; i < k->nq + k->nr; i++)
                    if (s[i] != -INFINITY)
                        o += exp(s[i] - m) / l * (i < k->nq ? deq_v(vq_h[g], i, e, D, G, bits) : vr_val[g][(i - k->nq) * D + e]);
                worst = fmax(worst, fabs(out[(t * H + h) * D + e] - o) / (1 + fabs(o)));
            }
            worst_lse = fmax(worst_lse, fabs(lse[h * k->n_q + t] - (m + log(l))) / (1 + fabs(m + log(l))));
        }
    CU_ASSERT(worst < 2e-5 && worst_lse < 1e-5);
    if (!(worst < 2e-5 && worst_lse < 1e-5))
        fprintf(stderr, "\n  %s HK=%d Gq=%d D=%d G=%d bits=%d %s nq=%lld nr=%lld n_q=%lld: out %.3g lse %.3g\n", be->name,
                k->HK, k->Gq, D, G, bits, k->dt == KVB_F16 ? "f16" : "f32", (long long)k->nq, (long long)k->nr,
                (long long)k->n_q, worst, worst_lse);
    for (int g = 0; g < k->HK; g++) {
        dev_free(be, (void *)kq[g], (size_t)nk * rb), dev_free(be, (void *)vq[g], (size_t)nv * rb);
        dev_free(be, (void *)kr[g], (size_t)k->nr * row_bytes), dev_free(be, (void *)vr[g], (size_t)k->nr * row_bytes);
        dev_free(be, (void *)kpos[g], (size_t)k->nr * sizeof *pos);
        free(kq_h[g]), free(vq_h[g]), free(kr_val[g]), free(vr_val[g]);
    }
    dev_free(be, (void *)a.q, (size_t)nqd * sizeof(float)), dev_free(be, (void *)a.q_pos, (size_t)k->n_q * sizeof(int32_t));
    dev_free(be, a.out, (size_t)nqd * sizeof(float)), dev_free(be, a.lse, (size_t)H * k->n_q * sizeof(float));
    free(tmp), free(tval), free(pos), free(qh), free(out), free(lse), free(qpos), free(s);
}

static void test_attention_quant_equals_float64_softmax_over_quantized_and_store_tokens(void) {
    for (int b = 0; b < n_backends; b++)
        for (int c = 0; c < 24; c++) {
            attn_case k;
            k.HK = 1 + (int)rnd(2);
            k.Gq = c % 2 ? 3 : 1;
            k.D = c % 3 ? 64 : 32;
            k.G = c % 4 < 2 ? 32 : 8;
            k.bits = c % 6 < 2 ? 2 : c % 6 < 4 ? 4 : 8;
            if (c % 7 == 3) k.G = 4, k.bits = k.bits == 2 ? 4 : k.bits; /* groups under a vector: the scalar path */
            k.dt = c % 5 < 3 ? KVB_F16 : KVB_F32;
            k.nq = k.G * (1 + rnd(6));
            k.nr = 1 + rnd(40);
            k.n_q = c % 3 == 2 ? 7 : 1;
            check_attention(backends[b], &k);
        }
}

/* ---- the method on a tiny model ---- */

enum { L = 3, E = 128, NH = 4, NKV = 2, HD = E / NH, FF = 64, V = 300, CTX = 512 };

static kvb_model *model;
static char dir[] = "/tmp/kvb_kivi_XXXXXX", model_path[256];

static kvb_ctx *new_ctx(void) {
    char err[256];
    kvb_ctx_params p = kvb_ctx_default_params();
    p.n_ctx = CTX;
    p.n_threads = 2;
    p.n_batch = 64;
    kvb_ctx *c = kvb_ctx_create(model, &p, err, sizeof err);
    CU_ASSERT_FATAL(c != NULL);
    return c;
}

static kvb_method *make(kvb_ctx *c, const char *name, const char *opts) {
    char err[256];
    kvb_budget b = {KVB_BUDGET_FRACTION, 0.3, 0}; /* kivi: reported, not imposed */
    if (!strcmp(name, "full")) b.kind = KVB_BUDGET_NONE;
    kvb_opts o = {0};
    if (opts) CU_ASSERT_FATAL(kvb_opts_add(&o, opts, err, sizeof err) == 0);
    kvb_method *m = kvb_method_create(name, c, &b, &o, err, sizeof err);
    if (!m) fprintf(stderr, "\n  %s %s: %s\n", name, opts ? opts : "", err);
    CU_ASSERT_FATAL(m != NULL);
    return m;
}

static int shared_prefill; /* run_method adopts a shared prefill instead of prefilling */

/* Prefill n_prompt seeded ids, then decode n_gen greedy steps; logits of every step into lg ([n_gen + 1][V]).
 * After each step: the store holds the residual rule's tokens, the measured bytes equal the quantized size (counted
 * here from the rule) and kvb_method_verify agrees. */
static void run_method(const char *name, const char *opts, int64_t R, int64_t G, int bits, int64_t n_prompt, int n_gen,
                       float *lg) {
    char err[256];
    int32_t *ids = malloc((size_t)n_prompt * sizeof *ids);
    for (int64_t i = 0; i < n_prompt; i++) ids[i] = (int32_t)(1 + (i * 7919) % (V - 1));
    kvb_ctx *base = NULL, *c;
    kvb_share *share = NULL;
    if (shared_prefill) { /* as `kvbench run` does: one exact prefill, forked and adopted */
        base = new_ctx();
        CU_ASSERT_FATAL((share = kvb_share_create(base, 0, 0, err, sizeof err)) != NULL);
        CU_ASSERT_FATAL(kvb_forward(base, ids, n_prompt, err, sizeof err) == 0);
        CU_ASSERT_FATAL((c = kvb_ctx_fork(base, 0, err, sizeof err)) != NULL);
    } else {
        c = new_ctx();
    }
    kvb_method *m = make(c, name, opts);
    CU_ASSERT_FATAL(shared_prefill ? kvb_method_adopt(m, c, share, err, sizeof err) == 0
                                   : kvb_method_prefill(m, c, ids, n_prompt, err, sizeof err) == 0);
    for (int step = 0; step <= n_gen; step++) {
        memcpy(lg + (size_t)step * V, c->logits, V * sizeof *lg);
        const int64_t n = c->n_past, nq = bits == 16 || n < R + G ? 0 : (n - R) / G * G;
        for (int l = 0; l < L; l++)
            for (int h = 0; h < NKV; h++) CU_ASSERT(kvc_n(c->kv, l, h) == n - nq);
        kvb_kv_usage u;
        kvb_method_usage(m, c, &u);
        const int64_t slot = kvc_slot_bytes(c->kv), quant = 2 * nq * (HD / G) * (G * bits / 8 + 4);
        CU_ASSERT(u.device_bytes == (int64_t)L * NKV * ((n - nq) * slot + quant));
        CU_ASSERT(u.full_bytes == (int64_t)L * NKV * n * slot);
        CU_ASSERT(kvb_method_verify(m, c, 0, err, sizeof err) == 0);
        if (step == n_gen) break;
        int32_t next = 0;
        for (int i = 1; i < V; i++) next = c->logits[i] > c->logits[next] ? i : next;
        CU_ASSERT_FATAL(kvb_forward(c, &next, 1, err, sizeof err) == 0);
    }
    free(ids);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
    if (share) kvb_share_free(share, base);
    kvb_ctx_free(base);
}

static float max_diff(const float *a, const float *b, int64_t n) {
    float d = 0;
    for (int64_t i = 0; i < n; i++) d = fmaxf(d, fabsf(a[i] - b[i]));
    return d;
}

static void test_kivi_store_holds_the_residual_device_bytes_are_the_quantized_size_shared_prefill_or_not(void) {
    enum { N_GEN = 40 };
    float *full = malloc((size_t)(N_GEN + 1) * V * sizeof *full), *got = malloc((size_t)(N_GEN + 1) * V * sizeof *got);
    run_method("full", NULL, 1 << 30, 8, 16, 150, N_GEN, full);
    run_method("kivi", "bits=2,group=8,residual=16", 16, 8, 2, 150, N_GEN, got); /* 128 quantized after prefill */
    const float d2 = max_diff(full, got, (int64_t)(N_GEN + 1) * V);
    run_method("kivi", "bits=4,group=32,residual=20", 20, 32, 4, 150, N_GEN, got);
    run_method("kivi", "bits=8,group=8,residual=1", 1, 8, 8, 150, N_GEN, got); /* quantized down to 1..8 tokens */
    const float d8 = max_diff(full, got, (int64_t)(N_GEN + 1) * V);
    CU_ASSERT(d8 > 0 && d8 < d2); /* more bits, nearer full attention */
    if (!(d8 > 0 && d8 < d2)) fprintf(stderr, "\n  logits off full by %g at 8 bits, %g at 2 bits\n", d8, d2);
    float *own = malloc((size_t)(N_GEN + 1) * V * sizeof *own);
    run_method("kivi", NULL, 128, 32, 2, 300, N_GEN, own); /* the defaults: 160 quantized after prefill */
    shared_prefill = 1;
    run_method("kivi", NULL, 128, 32, 2, 300, N_GEN, got);
    shared_prefill = 0;
    CU_ASSERT(memcmp(own, got, (size_t)(N_GEN + 1) * V * sizeof *got) == 0); /* a shared prefill changes nothing */
    free(own);
    free(full), free(got);
}

static void test_kivi_bits_16_and_a_residual_holding_everything_equal_full_attention(void) {
    enum { N_GEN = 12 };
    float *full = malloc((size_t)(N_GEN + 1) * V * sizeof *full), *got = malloc((size_t)(N_GEN + 1) * V * sizeof *got);
    run_method("full", NULL, 1 << 30, 8, 16, 100, N_GEN, full);
    run_method("kivi", "bits=16", 128, 32, 16, 100, N_GEN, got);
    CU_ASSERT(memcmp(full, got, (size_t)(N_GEN + 1) * V * sizeof *got) == 0);
    run_method("kivi", "bits=2,residual=200", 200, 32, 2, 100, N_GEN, got);
    CU_ASSERT(memcmp(full, got, (size_t)(N_GEN + 1) * V * sizeof *got) == 0);
    free(full), free(got);
}

static kvb_model *hybrid;
static char hybrid_path[300];

/* gemma3-deep (window 24; 15 local, 3 global layers), 150 prompt tokens and 10 greedy steps: the local layers hold
 * their windows, the global ones the residual rule's tokens; device bytes = the windows in full + each global layer's
 * residual and quantized records; kvb_method_verify (the formula within 2%) agrees; bits=16 equals full bit for bit. */
static void hybrid_run(const char *name, const char *opts, int64_t R, int64_t G, int bits, float *lg) {
    enum { N_PROMPT = 150, N_GEN = 10 };
    const kvb_config *cfg = &hybrid->cfg;
    const int HKV = cfg->n_head_kv, D = cfg->head_dim, HV = cfg->n_vocab;
    char err[512];
    kvb_ctx_params p = kvb_ctx_default_params();
    p.n_ctx = 256;
    kvb_ctx *c = kvb_ctx_create(hybrid, &p, err, sizeof err);
    CU_ASSERT_FATAL(c != NULL);
    kvb_budget b = {KVB_BUDGET_NONE, 0, 0};
    kvb_opts o = {0};
    if (opts) CU_ASSERT_FATAL(kvb_opts_add(&o, opts, err, sizeof err) == 0);
    kvb_method *m = kvb_method_create(name, c, &b, &o, err, sizeof err);
    if (!m) fprintf(stderr, "\n  %s: %s", name, err);
    CU_ASSERT_FATAL(m != NULL);
    int32_t ids[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++) ids[i] = (int32_t)(3 + (i * 7919) % (HV - 3));
    CU_ASSERT_FATAL(kvb_method_prefill(m, c, ids, N_PROMPT, err, sizeof err) == 0);
    for (int step = 0; step <= N_GEN; step++) {
        memcpy(lg + (size_t)step * HV, c->logits, (size_t)HV * sizeof *lg);
        const int64_t n = c->n_past, nq = bits == 16 || n < R + G ? 0 : (n - R) / G * G;
        const int64_t slot = kvc_slot_bytes(c->kv), quant = 2 * nq * (D / G) * (G * bits / 8 + 4);
        int64_t want = 0;
        for (int l = 0; l < cfg->n_layer; l++) {
            const int W = kvb_layer_window(cfg, l);
            const int64_t held = W ? (n < W ? n : W) : n - nq;
            for (int h = 0; h < HKV; h++) CU_ASSERT(kvc_n(c->kv, l, h) == held);
            want += HKV * (held * slot + (W ? 0 : quant));
        }
        kvb_kv_usage u;
        kvb_method_usage(m, c, &u);
        CU_ASSERT(u.device_bytes == want);
        const int verified = kvb_method_verify(m, c, 0, err, sizeof err) == 0;
        if (!verified) fprintf(stderr, "\n  %s", err);
        CU_ASSERT(verified);
        if (step == N_GEN) break;
        int32_t next = 0;
        for (int i = 1; i < HV; i++) next = c->logits[i] > c->logits[next] ? i : next;
        CU_ASSERT_FATAL(kvb_forward(c, &next, 1, err, sizeof err) == 0);
    }
    kvb_method_free(m, c);
    kvb_ctx_free(c);
}

static void test_kivi_on_a_hybrid_model_quantizes_the_global_layers_and_keeps_the_windows(void) {
    const size_t n = 11 * (size_t)hybrid->cfg.n_vocab;
    float *full = malloc(n * sizeof *full), *got = malloc(n * sizeof *got);
    hybrid_run("full", NULL, 1 << 30, 8, 16, full);
    hybrid_run("kivi", "bits=16", 128, 32, 16, got);
    CU_ASSERT(memcmp(full, got, n * sizeof *got) == 0);
    hybrid_run("kivi", "bits=2,group=8,residual=16", 16, 8, 2, got); /* 128 of 150 quantized on the global layers */
    CU_ASSERT(max_diff(full, got, (int64_t)n) > 0);
    free(full), free(got);
}

static void test_kivi_rejects_bad_options(void) {
    static const char *bad[] = {"bits=3", "bits=1", "group=12", "group=64", "residual=0"}; /* head_dim 32: group 64 */
    char err[256];
    kvb_ctx *c = new_ctx();
    for (int i = 0; i < (int)(sizeof bad / sizeof *bad); i++) {
        kvb_budget b = {KVB_BUDGET_NONE, 0, 0};
        kvb_opts o = {0};
        CU_ASSERT_FATAL(kvb_opts_add(&o, bad[i], err, sizeof err) == 0);
        kvb_method *m = kvb_method_create("kivi", c, &b, &o, err, sizeof err);
        CU_ASSERT(m == NULL && strstr(err, "kivi"));
        if (m) kvb_method_free(m, c);
    }
    kvb_ctx_free(c);
}

static int setup(void) {
    char err[256];
    backends[n_backends++] = kvb_backend_cpu_create(1, err, sizeof err);
    if (!backends[0]) return -1;
    if ((backends[n_backends] = kvb_backend_cuda_create(err, sizeof err))) n_backends++;
    else fprintf(stderr, "\n  CUDA backend skipped: %s\n", err);
    if (!mkdtemp(dir)) return -1;
    snprintf(model_path, sizeof model_path, "%s/tiny.gguf", dir);
    gw_random r = {7, 0.5f, NULL};
    gw_tiny t = {"llama", L, E, NH, NKV, FF, V, CTX, 0, NULL, gw_random_tensor, &r};
    int rc = gw_write_tiny(&t, model_path);
    free(r.buf);
    if (rc) return -1;
    model = kvb_model_load(model_path, err, sizeof err);
    snprintf(hybrid_path, sizeof hybrid_path, "%s/gemma3-deep.gguf", dir);
    if (!model || util_arch_model_write(&util_gemma3_deep, hybrid_path, NULL, NULL)) return -1;
    hybrid = kvb_model_load(hybrid_path, err, sizeof err);
    return hybrid ? 0 : -1;
}

static int teardown(void) {
    for (int b = 0; b < n_backends; b++) kvb_backend_free(backends[b]);
    kvb_model_free(model);
    kvb_model_free(hybrid);
    unlink(model_path);
    unlink(hybrid_path);
    rmdir(dir);
    return 0;
}

int main(void) {
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("kivi", setup, teardown);
    CU_add_test(s, "quant_groups: |x - deq| <= s/2, same bits per backend",
                test_quant_groups_error_within_half_a_step_and_the_same_bits_on_every_backend);
    CU_add_test(s, "attention_quant = float64 softmax over quantized + store tokens",
                test_attention_quant_equals_float64_softmax_over_quantized_and_store_tokens);
    CU_add_test(s, "kivi: store = residual, device bytes = quantized size, shared prefill or not",
                test_kivi_store_holds_the_residual_device_bytes_are_the_quantized_size_shared_prefill_or_not);
    CU_add_test(s, "kivi: bits=16 and an all-covering residual = full",
                test_kivi_bits_16_and_a_residual_holding_everything_equal_full_attention);
    CU_add_test(s, "kivi: on a hybrid model, quantized global layers and full-precision windows",
                test_kivi_on_a_hybrid_model_quantizes_the_global_layers_and_keeps_the_windows);
    CU_add_test(s, "kivi: bad options", test_kivi_rejects_bad_options);
    return util_run_suites();
}
