/* attention.c — cpu_attention: causal prefill, decode and index-list (sparse) attention over the KV store.
 *
 * Numerics are ggml's non-flash path: s = (q . k) * scale in f32 (f16 keys widened to f32), softmax with
 * max subtraction and the sum in double, out = sum p v. We compute it with an online softmax (running
 * max m, sum l, unnormalised accumulator) over blocks of KB keys, so nothing of size n_q x n_kv is
 * stored unless probabilities are requested.
 *
 * Work items are (KV head, block of queries, split of the key list). A KV head's query heads (GQA group)
 * and a few queries share each converted K/V block, so K and V are read once per item, not once per
 * head. Decode has few items, so the key list is split (flash-decoding) and the partial (m, l, acc)
 * merged by log-sum-exp afterwards. The decomposition depends only on the shapes, never on the
 * thread count, so results are bitwise identical for any pool size.
 *
 * cpu_attention_banded (arch_ops.h) runs the same items with a sliding window (key visible iff
 * q_pos - window < k_pos <= q_pos): blocks wholly before every row's window are skipped like blocks wholly
 * after every query, and the rest are masked at both ends, so a local layer's prefill costs the window,
 * not the list, and each K/V block is widened once for the GQA group and a block of queries.
 *
 * Two block kernels, chosen by the number of query rows R in an item:
 *  - many rows (prefill): Q is transposed once per item and logits computed as S^T[key][row] with
 *    rows in the vector lanes, so no horizontal sums and no transposition of K;
 *  - few rows (decode): logits S[row][key] by dot products with one horizontal sum each, softmax
 *    vectorised along keys. */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "kernels/cpu/arch_ops.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/ops_vec.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))

enum {
    KB = 64,               /* keys per block */
    PF_AHEAD = 32,         /* index lists: K rows are prefetched this many keys ahead of the logits */
    ROWS_TARGET = 64,      /* query rows (queries x group heads) per item */
    ROWS_TRANSPOSED = 8,   /* from this many rows on, use the S^T kernel */
    ITEMS_TARGET = 64,     /* split keys until there are this many items (load balance, any pool size) */
    SPLIT_MIN_KEYS = 256,  /* ... but never below this many keys per split */
    ALIGN = 64,
};

/* shapes derived once, shared by cpu_attention_ws_bytes and cpu_attention */
typedef struct {
    int G, D, Dp, nvec;       /* group size, head_dim, head_dim padded to lanes, vectors per row */
    int Tq, R_max, Rp_max;    /* queries per item, rows per item, rows padded to lanes */
    int64_t n_qb, n_split, n_items, L_max;
    size_t thread_bytes;      /* scratch per thread */
    size_t stat_off, part_off, thread_off, total_bytes;
} attn_plan;

static int64_t list_len(const cpu_attn_args *a, int g) {
    return (a->idx && a->idx[g]) ? a->n_idx[g] : a->n_kv[g];
}

static size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

/* a*b, or SIZE_MAX on overflow (which then fails every size check) */
static size_t mul_sz(size_t a, size_t b) { return (b && a > SIZE_MAX / b) ? SIZE_MAX : a * b; }
static size_t add_sz(size_t a, size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; }

static int make_plan(const cpu_attn_args *a, int n_threads, attn_plan *p) {
    memset(p, 0, sizeof *p);
    if (a->n_q < 0 || a->n_head <= 0 || a->n_head_kv <= 0 || a->head_dim <= 0 || a->n_head % a->n_head_kv) return -1;
    if (n_threads < 1) n_threads = 1;
    p->G = a->n_head / a->n_head_kv;
    p->D = a->head_dim;
    p->Dp = (int)round_up((size_t)a->head_dim, VF_LANES);
    p->nvec = p->Dp / VF_LANES;
    p->Tq = p->G >= ROWS_TARGET ? 1 : ROWS_TARGET / p->G;
    if (a->n_q > 0 && p->Tq > a->n_q) p->Tq = (int)a->n_q;
    p->R_max = p->Tq * p->G;
    p->Rp_max = (int)round_up((size_t)p->R_max, VF_LANES);
    p->n_qb = (a->n_q + p->Tq - 1) / p->Tq;
    for (int g = 0; g < a->n_head_kv; g++) {
        int64_t L = list_len(a, g);
        if (L > p->L_max) p->L_max = L;
    }
    int64_t base = p->n_qb * a->n_head_kv;
    p->n_split = 1;
    if (base > 0 && base < ITEMS_TARGET) {
        int64_t want = (ITEMS_TARGET + base - 1) / base, cap = (p->L_max + SPLIT_MIN_KEYS - 1) / SPLIT_MIN_KEYS;
        p->n_split = want < cap ? want : cap;
        if (p->n_split < 1) p->n_split = 1;
    }
    p->n_items = base * p->n_split;

    const size_t Dp = (size_t)p->Dp, R = (size_t)p->R_max, Rp = (size_t)p->Rp_max;
    size_t qbuf = mul_sz(Dp, Rp) * sizeof(float); /* Q rows [R][Dp] or Q^T [D][Rp] */
    size_t t = round_up(qbuf, ALIGN);
    t = add_sz(t, round_up(mul_sz(KB * Dp, sizeof(float)), ALIGN) * 2);    /* K, V blocks */
    t = add_sz(t, round_up(mul_sz(KB * Rp, sizeof(float)), ALIGN));        /* logits block */
    t = add_sz(t, round_up(mul_sz(mul_sz(R, Dp), sizeof(float)), ALIGN));  /* accumulators */
    t = add_sz(t, round_up(mul_sz(Rp, 3 * sizeof(float)), ALIGN));         /* m, corr, block sums */
    t = add_sz(t, round_up(mul_sz(R, sizeof(double)), ALIGN));             /* l */
    t = add_sz(t, round_up(mul_sz(Rp, 2 * sizeof(int32_t)), ALIGN));       /* row positions, window starts */
    t = add_sz(t, round_up(KB * sizeof(int32_t), ALIGN));                  /* key positions */
    t = add_sz(t, round_up(KB * sizeof(int64_t), ALIGN));                  /* key slots */
    p->thread_bytes = t;

    const size_t n_rows = mul_sz((size_t)a->n_q, (size_t)a->n_head);
    p->stat_off = 0;
    size_t stat = round_up(mul_sz(n_rows, sizeof(float) + sizeof(double)), ALIGN); /* final m, l per row */
    p->part_off = stat;
    size_t part = 0;
    if (p->n_split > 1)
        part = round_up(mul_sz(mul_sz(n_rows, (size_t)p->n_split), Dp * sizeof(float) + sizeof(float) + sizeof(double)),
                        ALIGN);
    p->thread_off = add_sz(stat, part);
    p->total_bytes = add_sz(add_sz(p->thread_off, mul_sz(t, (size_t)n_threads)), ALIGN); /* ALIGN: base alignment */
    return p->total_bytes == SIZE_MAX ? -1 : 0;
}

/* f32 KV without probabilities or lse: llama.cpp's exact order (attention_ggml.c) */
static int use_ggml_order(const cpu_attn_args *a) { return a->kv_dtype == KVB_F32 && !a->probs && !a->lse; }

size_t cpu_attention_ws_bytes(const cpu_attn_args *a, int n_threads) {
    attn_plan p;
    if (!a || make_plan(a, n_threads, &p)) return 0;
    if (use_ggml_order(a)) return cpu_attention_ggml_ws_bytes(a, p.L_max, n_threads);
    return p.total_bytes;
}

/* per-thread scratch, carved from the workspace */
typedef struct {
    float *q, *kb, *vb, *s, *acc, *m, *corr, *bsum;
    double *l;
    int32_t *rowpos, *rowlo, *kpos; /* rowlo: first visible position (window), INT32_MIN without one */
    int64_t *slots;
} scratch;

typedef struct {
    const cpu_attn_args *a;
    const attn_plan *p;
    char *ws; /* aligned */
    float *stat_m;
    double *stat_l;
    float *part_acc, *part_m; /* [n_split][n_q*n_head][Dp], [n_split][n_q*n_head] */
    double *part_l;
    int32_t window; /* > 0: cpu_attention_banded's sliding window; 0: causal only */
    atomic_long next_item;
} attn_job;

static scratch carve(const attn_job *job, int ith) {
    const attn_plan *p = job->p;
    char *c = job->ws + p->thread_off + (size_t)ith * p->thread_bytes;
    const size_t Dp = (size_t)p->Dp, R = (size_t)p->R_max, Rp = (size_t)p->Rp_max;
    scratch s;
    s.q = (float *)c;       c += round_up(Dp * Rp * sizeof(float), ALIGN);
    s.kb = (float *)c;      c += round_up(KB * Dp * sizeof(float), ALIGN);
    s.vb = (float *)c;      c += round_up(KB * Dp * sizeof(float), ALIGN);
    s.s = (float *)c;       c += round_up(KB * Rp * sizeof(float), ALIGN);
    s.acc = (float *)c;     c += round_up(R * Dp * sizeof(float), ALIGN);
    s.m = (float *)c;
    s.corr = s.m + Rp;
    s.bsum = s.corr + Rp;   c += round_up(Rp * 3 * sizeof(float), ALIGN);
    s.l = (double *)c;      c += round_up(R * sizeof(double), ALIGN);
    s.rowpos = (int32_t *)c;
    s.rowlo = s.rowpos + Rp; c += round_up(Rp * 2 * sizeof(int32_t), ALIGN);
    s.kpos = (int32_t *)c;  c += round_up(KB * sizeof(int32_t), ALIGN);
    s.slots = (int64_t *)c;
    return s;
}


/* ---- many rows: logits S^T[b][r] with query rows in the vector lanes ---- */

/* S^T[b][c0 .. c0 + nv*LANES) = scale * sum_d kb[b][d] * Q^T[d][..] for b < nb; two keys share each Q^T load */
ALWAYS_INLINE void logits_t_nv(float *st, int rp, const float *qt, const float *kb, int ks, int d_n, int nb, int c0,
                               const int nv, vf vscale) {
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        vf a0[4], a1[4];
        for (int j = 0; j < nv; j++) a0[j] = a1[j] = vf_zero();
        const float *k0 = kb + (int64_t)b * ks, *k1 = k0 + ks;
        for (int d = 0; d < d_n; d++) {
            const vf x0 = vf_set1(k0[d]), x1 = vf_set1(k1[d]);
            const float *qd = qt + (int64_t)d * rp + c0;
            for (int j = 0; j < nv; j++) {
                const vf qv = vf_load(qd + j * VF_LANES);
                a0[j] = vf_fma(x0, qv, a0[j]);
                a1[j] = vf_fma(x1, qv, a1[j]);
            }
        }
        for (int j = 0; j < nv; j++) {
            vf_store(st + (int64_t)b * rp + c0 + j * VF_LANES, vf_mul(a0[j], vscale));
            vf_store(st + (int64_t)(b + 1) * rp + c0 + j * VF_LANES, vf_mul(a1[j], vscale));
        }
    }
    for (; b < nb; b++) {
        vf a0[4];
        for (int j = 0; j < nv; j++) a0[j] = vf_zero();
        const float *k0 = kb + (int64_t)b * ks;
        for (int d = 0; d < d_n; d++) {
            const vf x0 = vf_set1(k0[d]);
            const float *qd = qt + (int64_t)d * rp + c0;
            for (int j = 0; j < nv; j++) a0[j] = vf_fma(x0, vf_load(qd + j * VF_LANES), a0[j]);
        }
        for (int j = 0; j < nv; j++) vf_store(st + (int64_t)b * rp + c0 + j * VF_LANES, vf_mul(a0[j], vscale));
    }
}

static void logits_t(float *st, int rp, const float *qt, const float *kb, int ks, int d_n, int nb, float scale) {
    const vf vs = vf_set1(scale);
    const int nvec = rp / VF_LANES;
    for (int c = 0; c < nvec; c += 4) {
        switch (nvec - c >= 4 ? 4 : nvec - c) {
        case 4: logits_t_nv(st, rp, qt, kb, ks, d_n, nb, c * VF_LANES, 4, vs); break;
        case 3: logits_t_nv(st, rp, qt, kb, ks, d_n, nb, c * VF_LANES, 3, vs); break;
        case 2: logits_t_nv(st, rp, qt, kb, ks, d_n, nb, c * VF_LANES, 2, vs); break;
        default: logits_t_nv(st, rp, qt, kb, ks, d_n, nb, c * VF_LANES, 1, vs); break;
        }
    }
}

/* ---- V accumulation, shared: acc[r] = acc[r] * corr + sum_b e(r, b) * V[b] ---- */

ALWAYS_INLINE void accum_v_nv(float *acc, const float *vb, int vs, const float *e, int es, int nb, float corr,
                              const int nv) {
    vf a[8];
    for (int j = 0; j < nv; j++) a[j] = vf_load(acc + j * VF_LANES);
    if (corr != 1.0f) {
        const vf vc = vf_set1(corr);
        for (int j = 0; j < nv; j++) a[j] = vf_mul(a[j], vc);
    }
    for (int b = 0; b < nb; b++) {
        const vf ev = vf_set1(e[(int64_t)b * es]);
        const float *vr = vb + (int64_t)b * vs;
        for (int j = 0; j < nv; j++) a[j] = vf_fma(ev, vf_load(vr + j * VF_LANES), a[j]);
    }
    for (int j = 0; j < nv; j++) vf_store(acc + j * VF_LANES, a[j]);
}

static void accum_v(float *acc, const float *vb, int vs, const float *e, int es, int nb, float corr, int nvec) {
    for (int c = 0; c < nvec; c += 8) {
        float *ac = acc + c * VF_LANES;
        const float *vc = vb + c * VF_LANES;
        switch (nvec - c >= 8 ? 8 : nvec - c) {
        case 8: accum_v_nv(ac, vc, vs, e, es, nb, corr, 8); break;
        case 7: accum_v_nv(ac, vc, vs, e, es, nb, corr, 7); break;
        case 6: accum_v_nv(ac, vc, vs, e, es, nb, corr, 6); break;
        case 5: accum_v_nv(ac, vc, vs, e, es, nb, corr, 5); break;
        case 4: accum_v_nv(ac, vc, vs, e, es, nb, corr, 4); break;
        case 3: accum_v_nv(ac, vc, vs, e, es, nb, corr, 3); break;
        case 2: accum_v_nv(ac, vc, vs, e, es, nb, corr, 2); break;
        default: accum_v_nv(ac, vc, vs, e, es, nb, corr, 1); break;
        }
    }
}

/* ---- few rows (decode): K and V read in place, f16 widened in registers ---- */

/* K/V row `slot` chunk c as f32; f16 is a compile-time constant at every call site */
ALWAYS_INLINE vf kv_chunk(const void *base, int64_t slot, int d, int c, const int f16) {
    return f16 ? vf_load_f16((const uint16_t *)base + slot * d + c * VF_LANES)
               : vf_load((const float *)base + slot * d + c * VF_LANES);
}

/* s[r][b] = scale * q_r . k_slot[b] for r < R (< ROWS_TRANSPOSED), b < nb: each key is widened once for
 * all rows; per row the VF_LANES partial-sum vectors of a group of keys are reduced together. With an index
 * list (`list`: its n_list entries from this block's first key on), each group of keys asks for the K rows
 * PF_AHEAD keys on and for its own V rows, which dec_accum reads after this block; values are unchanged. */
ALWAYS_INLINE void dec_logits_nv(float *s, const float *q, int R, const void *kbase, const int64_t *slots, int nb,
                                 int d, float scale, const int f16, const int nv, const int32_t *list,
                                 int64_t n_list, const void *vbase) {
    vf part[ROWS_TRANSPOSED - 1][VF_LANES];
    const vf vs = vf_set1(scale);
    const int row_bytes = d * (f16 ? 2 : 4);
    for (int b0 = 0; b0 < nb; b0 += VF_LANES) {
        const int n = nb - b0 < VF_LANES ? nb - b0 : VF_LANES;
        if (list)
            for (int i = 0; i < n; i++) {
                if (b0 + i + PF_AHEAD < n_list) prefetch_row(kbase, list[b0 + i + PF_AHEAD], row_bytes);
                prefetch_row(vbase, list[b0 + i], row_bytes);
            }
        for (int i = 0; i < VF_LANES; i++) {
            if (i >= n) {
                for (int r = 0; r < R; r++) part[r][i] = vf_zero();
                continue;
            }
            vf kc[8];
            for (int c = 0; c < nv; c++) kc[c] = kv_chunk(kbase, slots[b0 + i], d, c, f16);
            for (int r = 0; r < R; r++) {
                const float *qr = q + (int64_t)r * d;
                vf a0 = vf_zero(), a1 = vf_zero(); /* two chains halve the FMA latency */
                for (int c = 0; c + 1 < nv; c += 2) {
                    a0 = vf_fma(vf_load(qr + c * VF_LANES), kc[c], a0);
                    a1 = vf_fma(vf_load(qr + (c + 1) * VF_LANES), kc[c + 1], a1);
                }
                if (nv & 1) a0 = vf_fma(vf_load(qr + (nv - 1) * VF_LANES), kc[nv - 1], a0);
                part[r][i] = vf_add(a0, a1);
            }
        }
        for (int r = 0; r < R; r++) vf_store(s + (int64_t)r * KB + b0, vf_mul(vf_sum_each(part[r]), vs));
    }
}

static void dec_logits(float *s, const float *q, int R, const void *kbase, const int64_t *slots, int nb, int d,
                       float scale, int f16, const int32_t *list, int64_t n_list, const void *vbase) {
#define DEC_LOGITS_CASE(NV)                                                                         \
    case NV:                                                                                        \
        if (f16) dec_logits_nv(s, q, R, kbase, slots, nb, d, scale, 1, NV, list, n_list, vbase);    \
        else dec_logits_nv(s, q, R, kbase, slots, nb, d, scale, 0, NV, list, n_list, vbase);        \
        break;
    switch (d / VF_LANES) {
        DEC_LOGITS_CASE(1) DEC_LOGITS_CASE(2) DEC_LOGITS_CASE(3) DEC_LOGITS_CASE(4)
        DEC_LOGITS_CASE(5) DEC_LOGITS_CASE(6) DEC_LOGITS_CASE(7) DEC_LOGITS_CASE(8)
    default: break; /* not reached: callers check d / VF_LANES <= 8 */
    }
#undef DEC_LOGITS_CASE
}

/* acc[r][c0 .. c0+NV) = acc * corr[r] + sum_b e[r][b] * v_slot[b][..] for rows r0 .. r0+NR: all rows at once,
 * so each V chunk is widened once and NR*NV independent FMA chains hide the latency */
ALWAYS_INLINE void dec_accum_rn(float *acc, const void *vbase, const int64_t *slots, int d, const float *s,
                                const float *corr, int nb, int r0, int c0, const int f16, const int NR, const int NV) {
    vf a[4][4];
    for (int i = 0; i < NR; i++) {
        const vf vc = vf_set1(corr[r0 + i]);
        for (int j = 0; j < NV; j++) a[i][j] = vf_mul(vf_load(acc + (int64_t)(r0 + i) * d + (c0 + j) * VF_LANES), vc);
    }
    for (int b = 0; b < nb; b++) {
        vf v[4];
        for (int j = 0; j < NV; j++) v[j] = kv_chunk(vbase, slots[b], d, c0 + j, f16);
        for (int i = 0; i < NR; i++) {
            const vf ev = vf_set1(s[(int64_t)(r0 + i) * KB + b]);
            for (int j = 0; j < NV; j++) a[i][j] = vf_fma(ev, v[j], a[i][j]);
        }
    }
    for (int i = 0; i < NR; i++)
        for (int j = 0; j < NV; j++) vf_store(acc + (int64_t)(r0 + i) * d + (c0 + j) * VF_LANES, a[i][j]);
}

static void dec_accum(float *acc, const void *vbase, const int64_t *slots, int d, const float *s, const float *corr,
                      int nb, int R, int f16) {
    const int nvec = d / VF_LANES;
    for (int r0 = 0; r0 < R; r0 += 4)
        for (int c0 = 0; c0 < nvec; c0 += 4) {
            const int nr = R - r0 < 4 ? R - r0 : 4, nv = nvec - c0 < 4 ? nvec - c0 : 4;
#define DEC_ACCUM_CASE(NR, NV)                                                               \
    case NR * 8 + NV:                                                                        \
        if (f16) dec_accum_rn(acc, vbase, slots, d, s, corr, nb, r0, c0, 1, NR, NV);         \
        else dec_accum_rn(acc, vbase, slots, d, s, corr, nb, r0, c0, 0, NR, NV);             \
        break;
            switch (nr * 8 + nv) {
                DEC_ACCUM_CASE(1, 1) DEC_ACCUM_CASE(1, 2) DEC_ACCUM_CASE(1, 3) DEC_ACCUM_CASE(1, 4)
                DEC_ACCUM_CASE(2, 1) DEC_ACCUM_CASE(2, 2) DEC_ACCUM_CASE(2, 3) DEC_ACCUM_CASE(2, 4)
                DEC_ACCUM_CASE(3, 1) DEC_ACCUM_CASE(3, 2) DEC_ACCUM_CASE(3, 3) DEC_ACCUM_CASE(3, 4)
                DEC_ACCUM_CASE(4, 1) DEC_ACCUM_CASE(4, 2) DEC_ACCUM_CASE(4, 3) DEC_ACCUM_CASE(4, 4)
            default: break;
            }
#undef DEC_ACCUM_CASE
        }
}

/* ---- one work item ---- */

typedef struct {
    int g, R, Rp, tq;
    int64_t t0, j0, j1;
} item_desc;

static void run_item(attn_job *job, scratch *sc, const item_desc *it) {
    const cpu_attn_args *a = job->a;
    const attn_plan *p = job->p;
    const int g = it->g, R = it->R, Rp = it->Rp, G = p->G, D = p->D, Dp = p->Dp, nvec = p->nvec;
    const int transposed = R >= ROWS_TRANSPOSED;
    const int masked = a->q_pos != NULL;
    const int32_t *idx = (a->idx && a->idx[g]) ? a->idx[g] : NULL;
    const int32_t *kpos_g = masked ? a->k_pos[g] : NULL;
    const int direct = a->kv_dtype == KVB_F32 && !idx && D == Dp; /* use cache rows in place */
    /* few rows: read K/V in place (no block copy) when rows are whole vectors that fit in registers */
    const int inplace = !transposed && D == Dp && nvec <= 8;
    const int f16 = a->kv_dtype == KVB_F16;

    const int windowed = masked && job->window > 0;
    int32_t qmin = INT32_MAX, qmax = INT32_MIN, lomin = INT32_MAX, lomax = INT32_MIN;
    for (int r = 0; r < Rp; r++) {
        int32_t qp = INT32_MAX, lo = INT32_MIN; /* padding rows: never masked, never stored */
        if (r < R) {
            qp = masked ? a->q_pos[it->t0 + r / G] : INT32_MAX;
            if (windowed) { /* first visible position, clamped (positions are >= 0 in practice) */
                const int64_t l = (int64_t)qp - job->window + 1;
                lo = l < INT32_MIN ? INT32_MIN : (int32_t)l;
            }
            if (qp < qmin) qmin = qp;
            if (qp > qmax) qmax = qp;
            if (lo < lomin) lomin = lo;
            if (lo > lomax) lomax = lo;
        }
        sc->rowpos[r] = qp;
        sc->rowlo[r] = lo;
        sc->m[r] = -FLT_MAX; /* not -inf: keeps m_old - m_new finite-or-(-inf), never NaN */
    }
    for (int r = 0; r < R; r++) sc->l[r] = 0.0;
    memset(sc->acc, 0, (size_t)R * Dp * sizeof(float));
    for (int r = 0; r < R; r++) {
        const float *qr = a->q + ((it->t0 + r / G) * a->n_head + (int64_t)g * G + r % G) * D;
        if (transposed) {
            for (int d = 0; d < D; d++) sc->q[(int64_t)d * Rp + r] = qr[d];
        } else {
            memcpy(sc->q + (int64_t)r * Dp, qr, (size_t)D * sizeof(float));
            for (int d = D; d < Dp; d++) sc->q[(int64_t)r * Dp + d] = 0.0f;
        }
    }
    if (transposed)
        for (int d = 0; d < D; d++)
            for (int r = R; r < Rp; r++) sc->q[(int64_t)d * Rp + r] = 0.0f;

    for (int64_t jb = it->j0; jb < it->j1; jb += KB) {
        const int nb = (int)(it->j1 - jb < KB ? it->j1 - jb : KB);
        int need_mask = 0;
        if (masked) {
            int32_t kmin = INT32_MAX, kmax = INT32_MIN;
            for (int b = 0; b < nb; b++) {
                const int32_t kp = kpos_g[idx ? idx[jb + b] : jb + b];
                sc->kpos[b] = kp;
                kmin = kp < kmin ? kp : kmin;
                kmax = kp > kmax ? kp : kmax;
            }
            for (int b = nb; b < KB; b++) sc->kpos[b] = INT32_MAX;
            /* every key after every query, or before every row's window: skip, but probs must read 0 there */
            if (kmin > qmax || (windowed && kmax < lomin)) {
                if (a->probs)
                    for (int r = 0; r < R; r++) {
                        float *pr = a->probs + (((int64_t)g * G + r % G) * a->n_q + it->t0 + r / G) * a->probs_stride;
                        for (int b = 0; b < nb; b++) pr[jb + b] = -INFINITY;
                    }
                continue;
            }
            need_mask = kmax > qmin || (windowed && kmin < lomax);
        }
        for (int b = 0; b < nb; b++) sc->slots[b] = idx ? idx[jb + b] : jb + b;
        const float *kb = NULL, *vb = NULL;
        if (direct) {
            kb = (const float *)a->k[g] + jb * D;
            vb = (const float *)a->v[g] + jb * D;
        } else if (!inplace) {
            for (int b = 0; b < nb; b++) {
                vf_widen_row(sc->kb + (int64_t)b * Dp, a->k[g], sc->slots[b], D, Dp, a->kv_dtype);
                vf_widen_row(sc->vb + (int64_t)b * Dp, a->v[g], sc->slots[b], D, Dp, a->kv_dtype);
            }
            kb = sc->kb;
            vb = sc->vb;
        }

        if (transposed) {
            float *st = sc->s;
            logits_t(st, Rp, sc->q, kb, Dp, D, nb, a->scale);
            if (need_mask)
                for (int b = 0; b < nb; b++)
                    for (int c = 0; c < Rp; c += VF_LANES) {
                        vf x = vf_mask_before(vf_load(st + (int64_t)b * Rp + c), sc->kpos[b], sc->rowpos + c);
                        if (windowed) x = vf_mask_after(x, sc->rowlo + c, sc->kpos[b]); /* key before the window */
                        vf_store(st + (int64_t)b * Rp + c, x);
                    }
            if (a->probs)
                for (int r = 0; r < R; r++) {
                    float *pr = a->probs + (((int64_t)g * G + r % G) * a->n_q + it->t0 + r / G) * a->probs_stride + jb;
                    for (int b = 0; b < nb; b++) pr[b] = st[(int64_t)b * Rp + r];
                }
            for (int c = 0; c < Rp; c += VF_LANES) {
                vf bm = vf_set1(-INFINITY);
                for (int b = 0; b < nb; b++) bm = vf_max(bm, vf_load(st + (int64_t)b * Rp + c));
                const vf mo = vf_load(sc->m + c), mn = vf_max(mo, bm);
                vf_store(sc->corr + c, vf_exp(vf_sub(mo, mn)));
                vf_store(sc->m + c, mn);
                vf bs = vf_zero();
                for (int b = 0; b < nb; b++) {
                    const vf e = vf_exp(vf_sub(vf_load(st + (int64_t)b * Rp + c), mn));
                    vf_store(st + (int64_t)b * Rp + c, e);
                    bs = vf_add(bs, e);
                }
                vf_store(sc->bsum + c, bs);
            }
            for (int r = 0; r < R; r++) {
                sc->l[r] = sc->l[r] * sc->corr[r] + sc->bsum[r];
                accum_v(sc->acc + (int64_t)r * Dp, vb, Dp, st + r, Rp, nb, sc->corr[r], nvec);
            }
        } else {
            if (inplace) {
                if (idx && jb == it->j0) /* the first PF_AHEAD keys of the item: nothing asked for them */
                    for (int64_t j = jb; j < jb + PF_AHEAD && j < it->j1; j++)
                        prefetch_row(a->k[g], idx[j], D * (f16 ? 2 : 4));
                dec_logits(sc->s, sc->q, R, a->k[g], sc->slots, nb, D, a->scale, f16, idx ? idx + jb : NULL,
                           it->j1 - jb, a->v[g]);
            } else {
                for (int r = 0; r < R; r++) {
                    const float *qr = sc->q + (int64_t)r * Dp;
                    for (int b = 0; b < nb; b++) {
                        const float *kr = kb + (int64_t)b * Dp;
                        vf acc = vf_zero();
                        for (int c = 0; c < Dp; c += VF_LANES) acc = vf_fma(vf_load(qr + c), vf_load(kr + c), acc);
                        sc->s[(int64_t)r * KB + b] = vf_hsum(acc) * a->scale;
                    }
                }
            }
            for (int r = 0; r < R; r++) {
                float *sr = sc->s + (int64_t)r * KB;
                for (int b = nb; b < KB; b++) sr[b] = -INFINITY;
                if (need_mask)
                    for (int b = 0; b < KB; b += VF_LANES) {
                        vf x = vf_mask_after(vf_load(sr + b), sc->kpos + b, sc->rowpos[r]);
                        if (windowed) x = vf_mask_before(x, sc->rowlo[r], sc->kpos + b); /* before the window */
                        vf_store(sr + b, x);
                    }
                if (a->probs) {
                    float *pr = a->probs + (((int64_t)g * G + r % G) * a->n_q + it->t0 + r / G) * a->probs_stride + jb;
                    memcpy(pr, sr, (size_t)nb * sizeof(float));
                }
                vf bm = vf_set1(-INFINITY);
                for (int b = 0; b < KB; b += VF_LANES) bm = vf_max(bm, vf_load(sr + b));
                const float mo = sc->m[r], bmax = vf_hmax(bm), mn = bmax > mo ? bmax : mo;
                const float corr = mn > mo ? expf(mo - mn) : 1.0f;
                sc->m[r] = mn;
                const vf vmn = vf_set1(mn);
                vf bs = vf_zero();
                for (int b = 0; b < KB; b += VF_LANES) {
                    const vf e = vf_exp(vf_sub(vf_load(sr + b), vmn));
                    vf_store(sr + b, e);
                    bs = vf_add(bs, e);
                }
                sc->l[r] = sc->l[r] * corr + vf_hsum(bs);
                sc->corr[r] = corr;
                if (!inplace) accum_v(sc->acc + (int64_t)r * Dp, vb, Dp, sr, 1, nb, corr, nvec);
            }
            if (inplace) dec_accum(sc->acc, a->v[g], sc->slots, D, sc->s, sc->corr, nb, R, f16);
        }
    }
}

/* item number -> (KV head, query block, split); the last query blocks (most keys under a causal
 * mask) are handed out first so the tail of the schedule is short */
static void describe_item(const attn_job *job, int64_t i, item_desc *it) {
    const cpu_attn_args *a = job->a;
    const attn_plan *p = job->p;
    const int64_t sp = i % p->n_split, rest = i / p->n_split;
    it->g = (int)(rest % a->n_head_kv);
    const int64_t qb = p->n_qb - 1 - rest / a->n_head_kv;
    it->t0 = qb * p->Tq;
    it->tq = (int)(a->n_q - it->t0 < p->Tq ? a->n_q - it->t0 : p->Tq);
    it->R = it->tq * p->G;
    it->Rp = (int)round_up((size_t)it->R, VF_LANES);
    const int64_t L = list_len(a, it->g);
    it->j0 = L * sp / p->n_split;
    it->j1 = L * (sp + 1) / p->n_split;
}

static void phase_items(void *arg, int ith, int nth) {
    attn_job *job = arg;
    const cpu_attn_args *a = job->a;
    const attn_plan *p = job->p;
    scratch sc = carve(job, ith);
    const size_t n_rows = (size_t)a->n_q * a->n_head;
    for (;;) {
        const int64_t i = atomic_fetch_add_explicit(&job->next_item, 1, memory_order_relaxed);
        if (i >= p->n_items) break;
        item_desc it;
        describe_item(job, i, &it);
        const int64_t sp = i % p->n_split;
        run_item(job, &sc, &it);
        for (int r = 0; r < it.R; r++) {
            const int64_t t = it.t0 + r / p->G, h = (int64_t)it.g * p->G + r % p->G, row = t * a->n_head + h;
            const float *acc = sc.acc + (int64_t)r * p->Dp;
            if (p->n_split == 1) {
                float *o = a->out + row * p->D;
                const float inv = sc.l[r] > 0.0 ? (float)(1.0 / sc.l[r]) : 0.0f;
                for (int d = 0; d < p->D; d++) o[d] = acc[d] * inv;
                job->stat_m[row] = sc.m[r];
                job->stat_l[row] = sc.l[r];
            } else {
                const size_t prow = (size_t)sp * n_rows + (size_t)row;
                memcpy(job->part_acc + prow * p->Dp, acc, (size_t)p->Dp * sizeof(float));
                job->part_m[prow] = sc.m[r];
                job->part_l[prow] = sc.l[r];
            }
        }
    }
}

/* per output row: merge the splits by log-sum-exp, then lse and normalised probabilities */
static void phase_finish(void *arg, int ith, int nth) {
    attn_job *job = arg;
    const cpu_attn_args *a = job->a;
    const attn_plan *p = job->p;
    const size_t n_rows = (size_t)a->n_q * a->n_head;
    long lo, hi;
    kvb_split((long)n_rows, ith, nth, &lo, &hi);
    for (long row = lo; row < hi; row++) {
        float M = job->stat_m[row];
        double L = job->stat_l[row];
        if (p->n_split > 1) {
            M = -FLT_MAX;
            for (int64_t sp = 0; sp < p->n_split; sp++) {
                const float ms = job->part_m[(size_t)sp * n_rows + (size_t)row];
                M = ms > M ? ms : M;
            }
            float *o = a->out + (int64_t)row * p->D;
            memset(o, 0, (size_t)p->D * sizeof(float));
            L = 0.0;
            for (int64_t sp = 0; sp < p->n_split; sp++) {
                const size_t pr = (size_t)sp * n_rows + (size_t)row;
                if (job->part_l[pr] == 0.0) continue;
                const float w = expf(job->part_m[pr] - M);
                L += job->part_l[pr] * w;
                const float *acc = job->part_acc + pr * p->Dp;
                for (int d = 0; d < p->D; d++) o[d] += acc[d] * w;
            }
            const float inv = L > 0.0 ? (float)(1.0 / L) : 0.0f;
            for (int d = 0; d < p->D; d++) o[d] *= inv;
        }
        const int64_t t = row / a->n_head, h = row % a->n_head, g = h / p->G;
        if (a->lse) a->lse[h * a->n_q + t] = L > 0.0 ? (float)((double)M + log(L)) : -INFINITY;
        if (a->probs) {
            float *pr = a->probs + (h * a->n_q + t) * a->probs_stride;
            const int64_t n = list_len(a, (int)g);
            if (L <= 0.0) {
                memset(pr, 0, (size_t)n * sizeof(float));
                continue;
            }
            const float inv = (float)(1.0 / L);
            const vf vm = vf_set1(M), vi = vf_set1(inv);
            int64_t j = 0;
            for (; j + VF_LANES <= n; j += VF_LANES)
                vf_store(pr + j, vf_mul(vf_exp(vf_sub(vf_load(pr + j), vm)), vi));
            for (; j < n; j++) pr[j] = expf(pr[j] - M) * inv;
        }
    }
}

static int fail(char *err, size_t err_len, const char *msg) {
    if (err && err_len) snprintf(err, err_len, "cpu_attention: %s", msg);
    return -1;
}

static int check_args(const cpu_attn_args *a, const attn_plan *p, char *err, size_t err_len) {
    char msg[160];
    if (!a->q || !a->out) return fail(err, err_len, "q and out are required");
    if (a->kv_dtype != KVB_F32 && a->kv_dtype != KVB_F16) return fail(err, err_len, "kv_dtype must be f32 or f16");
    if (!a->k || !a->v || !a->n_kv) return fail(err, err_len, "k, v and n_kv are required");
    if (a->q_pos && !a->k_pos) return fail(err, err_len, "q_pos given without k_pos");
    if (a->idx && !a->n_idx) return fail(err, err_len, "idx given without n_idx");
    for (int g = 0; g < a->n_head_kv; g++) {
        const int64_t n = a->n_kv[g];
        if (n < 0 || n > INT32_MAX) {
            snprintf(msg, sizeof msg, "n_kv[%d] = %lld out of range", g, (long long)n);
            return fail(err, err_len, msg);
        }
        if (n > 0 && (!a->k[g] || !a->v[g] || (a->q_pos && !a->k_pos[g]))) {
            snprintf(msg, sizeof msg, "KV head %d has slots but no K, V or positions", g);
            return fail(err, err_len, msg);
        }
        if (a->idx && a->idx[g]) {
            if (a->n_idx[g] < 0) {
                snprintf(msg, sizeof msg, "n_idx[%d] is negative", g);
                return fail(err, err_len, msg);
            }
            for (int64_t j = 0; j < a->n_idx[g]; j++)
                if (a->idx[g][j] < 0 || a->idx[g][j] >= n) {
                    snprintf(msg, sizeof msg, "idx[%d][%lld] = %d outside [0, %lld)", g, (long long)j, a->idx[g][j],
                             (long long)n);
                    return fail(err, err_len, msg);
                }
        }
    }
    if (a->probs && a->probs_stride < p->L_max) {
        snprintf(msg, sizeof msg, "probs_stride %lld < longest key list %lld", (long long)a->probs_stride,
                 (long long)p->L_max);
        return fail(err, err_len, msg);
    }
    return 0;
}

/* the tiled items over a plan already checked; window > 0 only from cpu_attention_banded */
static int run_tiled(const cpu_attn_args *a, const attn_plan *pp, int32_t window, kvb_pool *pool, char *err,
                     size_t err_len);

int cpu_attention(const cpu_attn_args *a, kvb_pool *pool, char *err, size_t err_len) {
    if (!a) return fail(err, err_len, "no arguments");
    const int nth = kvb_pool_size(pool);
    attn_plan p;
    if (make_plan(a, nth, &p)) return fail(err, err_len, "bad shape (heads, head_dim, n_q) or size overflow");
    if (check_args(a, &p, err, err_len)) return -1;
    if (a->n_q == 0) return 0;
    if (use_ggml_order(a)) {
        if (cpu_attention_ggml(a, p.L_max, pool) == 0) return 0;
        char msg[128];
        snprintf(msg, sizeof msg, "workspace of %zu bytes, need %zu for %d threads", a->ws_bytes,
                 cpu_attention_ggml_ws_bytes(a, p.L_max, nth), nth);
        return fail(err, err_len, msg);
    }
    return run_tiled(a, &p, 0, pool, err, err_len);
}

size_t cpu_attention_banded_ws_bytes(const cpu_attn_args *a, int n_threads) {
    attn_plan p;
    if (!a || make_plan(a, n_threads, &p)) return 0;
    return p.total_bytes;
}

int cpu_attention_banded(const cpu_attn_args *a, kvb_pool *pool, char *err, size_t err_len) {
    if (!a) return fail(err, err_len, "no arguments");
    if (a->window <= 0) return fail(err, err_len, "banded attention without a positive window");
    attn_plan p;
    if (make_plan(a, kvb_pool_size(pool), &p))
        return fail(err, err_len, "bad shape (heads, head_dim, n_q) or size overflow");
    if (check_args(a, &p, err, err_len)) return -1;
    if (a->n_q == 0) return 0;
    return run_tiled(a, &p, a->window, pool, err, err_len);
}

static int run_tiled(const cpu_attn_args *a, const attn_plan *pp, int32_t window, kvb_pool *pool, char *err,
                     size_t err_len) {
    const attn_plan p = *pp;
    if (!a->ws || a->ws_bytes < p.total_bytes) {
        char msg[128];
        snprintf(msg, sizeof msg, "workspace of %zu bytes, need %zu for %d threads", a->ws_bytes, p.total_bytes,
                 kvb_pool_size(pool));
        return fail(err, err_len, msg);
    }
    attn_job job;
    memset(&job, 0, sizeof job);
    job.a = a;
    job.p = &p;
    job.window = window;
    job.ws = (char *)round_up((size_t)(uintptr_t)a->ws, ALIGN);
    const size_t n_rows = (size_t)a->n_q * a->n_head;
    /* doubles first in each region, so every array is aligned for its type */
    job.stat_l = (double *)(job.ws + p.stat_off);
    job.stat_m = (float *)(job.ws + p.stat_off + n_rows * sizeof(double));
    if (p.n_split > 1) {
        char *c = job.ws + p.part_off;
        job.part_l = (double *)c;
        c += n_rows * (size_t)p.n_split * sizeof(double);
        job.part_acc = (float *)c;
        c += n_rows * (size_t)p.n_split * (size_t)p.Dp * sizeof(float);
        job.part_m = (float *)c;
    }
    atomic_init(&job.next_item, 0);
    kvb_pool_run(pool, phase_items, &job);
    if (p.n_split > 1 || a->probs || a->lse) kvb_pool_run(pool, phase_finish, &job);
    return 0;
}
