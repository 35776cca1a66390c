/* narrow.c — the CPU backend's narrow-key ops (kernels/backend.h, "keys narrower than values"): gather_cols and
 * attention_narrow, in the header's orders (kernels/cuda/narrow.cu computes the same values).
 *
 * attention_narrow gives each query row of a KV head (its group's query heads together, n_q x n_head_kv tasks) to
 * the backend's thread pool, so a K and a V row are read once per group: the logits (float dot over the kept
 * channels, j ascending), their maximum with the store part's lse, the double weights and their sum in token
 * order, the weighted values in float in token order (vectorised across channels), then the merge. Every sum keeps
 * the header's order whatever the split or the thread count. */
#include "kernels/cpu/narrow.h"

#include "kernels/cpu/expd.h"
#include "kernels/cpu/kvops.h"
#include "kernels/cpu/pool.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/ops_vec.h"
#include "kernels/dtype.h"

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

static int cpu_gather_cols(kvb_backend *be, void *out, int64_t out_stride, const void *x, int64_t in_stride,
                           kvb_dtype dtype, const int32_t *cols, int m, int64_t n, char *err, size_t err_len) {
    (void)be;
    if (dtype != KVB_F16 && dtype != KVB_F32) return ERR("gather_cols: dtype must be f16 or f32");
    if (m < 0 || n < 0 || out_stride < m || in_stride < 1)
        return ERR("gather_cols: %d columns of %lld rows (strides %lld, %lld)", m, (long long)n, (long long)out_stride,
                   (long long)in_stride);
    for (int j = 0; j < m; j++)
        if (cols[j] < 0 || cols[j] >= in_stride)
            return ERR("gather_cols: column %d at %d is outside a row of %lld", (int)cols[j], j, (long long)in_stride);
    if (dtype == KVB_F16) {
        const kvb_f16 *src = x;
        kvb_f16 *dst = out;
        for (int64_t r = 0; r < n; r++)
            for (int j = 0; j < m; j++) dst[r * out_stride + j] = src[r * in_stride + cols[j]];
    } else {
        const float *src = x;
        float *dst = out;
        for (int64_t r = 0; r < n; r++)
            for (int j = 0; j < m; j++) dst[r * out_stride + j] = src[r * in_stride + cols[j]];
    }
    return 0;
}

typedef struct {
    const kvb_attn_args *a;
    const kvb_narrow_kv *s;
    float *scratch; /* per task slot: Gq x (n weights + head_dim sums), then a tile of key rows twice */
    int Gq;
} narrow_job;

static float elem(const void *x, kvb_dtype dt, int64_t i) {
    return dt == KVB_F16 ? kvb_f16_to_f32(((const kvb_f16 *)x)[i]) : ((const float *)x)[i];
}

/* acc[r][e] = sum of w[r][i] v_i[e] over the visible tokens i ascending, for the group's rows r < Gq and e < D: each
 * product rounded, then its add (the header's float order). The lanes run across e in register blocks of up to 4
 * rows x 4 vectors, each block one pass over the tokens, so a sum stays in a register rather than going through
 * memory at every token; a zero weight is skipped there (adding 0 x v changes no sum), the tail channels add it. */
static void weighted_values(float *acc, float *const *w, int Gq, int D, const void *v, kvb_dtype dt, int64_t n,
                            const int32_t *pos, const int32_t *q_pos_t) {
    int e0 = 0;
#if VF_LANES > 1
    const int nvec = D / VF_LANES;
    for (int r0 = 0; r0 < Gq; r0 += 4)
        for (int c0 = 0; c0 < nvec; c0 += 4) {
            const int nr = Gq - r0 < 4 ? Gq - r0 : 4, nc = nvec - c0 < 4 ? nvec - c0 : 4;
            vf a[4][4];
#pragma GCC unroll 4
            for (int rr = 0; rr < 4; rr++)
#pragma GCC unroll 4
                for (int cc = 0; cc < 4; cc++) a[rr][cc] = vf_zero();
            for (int64_t i = 0; i < n; i++) {
                if (q_pos_t && pos[i] > *q_pos_t) continue;
                vf x[4] = {vf_zero(), vf_zero(), vf_zero(), vf_zero()};
#pragma GCC unroll 4
                for (int cc = 0; cc < 4; cc++)
                    if (cc < nc) x[cc] = vf_load_kv(v, dt, i * D + (int64_t)(c0 + cc) * VF_LANES);
#pragma GCC unroll 4
                for (int rr = 0; rr < 4; rr++) {
                    if (rr >= nr || w[r0 + rr][i] == 0) continue;
                    const vf ws = vf_set1(w[r0 + rr][i]);
#pragma GCC unroll 4
                    for (int cc = 0; cc < 4; cc++)
                        if (cc < nc) a[rr][cc] = vf_add(a[rr][cc], vf_mul(ws, x[cc]));
                }
            }
            for (int rr = 0; rr < nr; rr++)
                for (int cc = 0; cc < nc; cc++) vf_store(acc + (size_t)(r0 + rr) * D + (size_t)(c0 + cc) * VF_LANES, a[rr][cc]);
        }
    e0 = nvec * VF_LANES;
#endif
    for (int r = 0; r < Gq; r++)
        for (int e = e0; e < D; e++) acc[(size_t)r * D + e] = 0;
    for (int64_t i = 0; i < n && e0 < D; i++) {
        if (q_pos_t && pos[i] > *q_pos_t) continue;
        for (int e = e0; e < D; e++) {
            const float x = elem(v, dt, i * D + e);
            for (int r = 0; r < Gq; r++) acc[(size_t)r * D + e] += w[r][i] * x;
        }
    }
}

/* The logits of tokens [i0, i0 + nt) (nt <= KT_TILE) for the group's Gq query rows into w[r][i0..]: the tile's key
 * rows (contiguous in the segment) widened to f32 at once, turned channel-major (kt[c][lane]) VF_LANES x VF_LANES
 * in registers, then per lane the header's float dot, channels ascending, each product rounded before its add (ISO
 * C: no contraction), times scale; the lanes are tokens, so every token's sum keeps that order exactly. Lanes past
 * nt are zero and not stored. rows: KT_TILE x dk + VF_LANES floats (a transpose's last loads run past the rows). */
enum { KT_TILE = VF_LANES > 8 ? VF_LANES : 8 * VF_LANES };
static void tile_logits(float *const *w, const float *const *qg, int Gq, int dk, float scale, const void *k,
                        kvb_dtype dt, int64_t i0, int nt, float *kt, float *rows) {
    const void *tile = (const char *)k + (size_t)i0 * dk * (dt == KVB_F16 ? 2 : 4);
    vf_widen_row(rows, tile, 0, nt * dk, KT_TILE * dk + VF_LANES, dt);
    for (int b = 0; b < KT_TILE; b += VF_LANES)
        for (int c0 = 0; c0 < dk; c0 += VF_LANES) {
            vf x[VF_LANES]; /* tokens b.. at channels c0.. (past dk: the next row's, never stored) */
            for (int lane = 0; lane < VF_LANES; lane++) x[lane] = vf_load(rows + (size_t)(b + lane) * dk + c0);
            vf_transpose(x);
            for (int c = 0; c < VF_LANES && c0 + c < dk; c++) vf_store(kt + (size_t)(c0 + c) * KT_TILE + b, x[c]);
        }
    for (int b = 0; b < KT_TILE; b += VF_LANES)
        for (int r0 = 0; r0 < Gq; r0 += 4) { /* four rows' sums at once: four chains of adds, one load of K */
            const int nr = Gq - r0 < 4 ? Gq - r0 : 4;
            vf dot[4] = {vf_zero(), vf_zero(), vf_zero(), vf_zero()};
            for (int c = 0; c < dk; c++) {
                const vf x = vf_load(kt + c * KT_TILE + b);
#pragma GCC unroll 4
                for (int rr = 0; rr < 4; rr++)
                    if (rr < nr) dot[rr] = vf_add(dot[rr], vf_mul(vf_set1(qg[r0 + rr][c]), x));
            }
            for (int rr = 0; rr < nr; rr++) {
                float out[VF_LANES];
                vf_store(out, vf_mul(vf_set1(scale), dot[rr]));
                for (int e = 0; e < VF_LANES && b + e < nt; e++) w[r0 + rr][i0 + b + e] = out[e];
            }
        }
}

/* query row t of KV head g: its Gq query heads together, so each K and V row is read once for the group */
static void narrow_rows(const narrow_job *j, int64_t t, int g, float *scratch) {
    enum { MAX_G = 64 };
    const kvb_attn_args *a = j->a;
    const kvb_narrow_kv *s = j->s;
    const int dk = s->dk, D = a->head_dim, Gq = j->Gq;
    const kvb_dtype dt = a->kv_dtype;
    const int32_t *pos = s->pos[g];
    const void *k = s->k[g], *v = s->v[g];
    float *w[MAX_G], m[MAX_G], *acc = scratch + (size_t)Gq * s->n, *kt = acc + (size_t)Gq * D;
    double l[MAX_G];
    const float *qg[MAX_G];
    for (int r = 0; r < Gq; r++) {
        const int h = g * Gq + r;
        w[r] = scratch + (size_t)r * s->n;
        qg[r] = s->qg + (t * a->n_head + h) * dk;
        m[r] = a->lse[(int64_t)h * a->n_q + t];
        l[r] = 0;
    }
    int64_t seen = 0;
    for (int64_t i0 = 0; i0 < s->n; i0 += KT_TILE) { /* the logits a tile of tokens at a time, lanes over tokens */
        const int nt = s->n - i0 < KT_TILE ? (int)(s->n - i0) : KT_TILE;
        tile_logits(w, qg, Gq, dk, a->scale, k, dt, i0, nt, kt, kt + (size_t)dk * KT_TILE);
        for (int64_t i = i0; i < i0 + nt; i++) {
            const int masked = a->q_pos && pos[i] > a->q_pos[t];
            seen += !masked;
            for (int r = 0; r < Gq; r++) {
                if (masked) w[r][i] = -INFINITY;
                else m[r] = w[r][i] > m[r] ? w[r][i] : m[r];
            }
        }
    }
    if (!seen) return; /* nothing visible: out and lse kept */
    for (int r0 = 0; r0 < Gq; r0 += KVB_EXPD_ROWS)
        kvb_exp_weights_rows(w + r0, Gq - r0 < KVB_EXPD_ROWS ? Gq - r0 : KVB_EXPD_ROWS, s->n, m + r0, l + r0);
    weighted_values(acc, w, Gq, D, v, dt, s->n, pos, a->q_pos ? &a->q_pos[t] : NULL);
    for (int r = 0; r < Gq; r++) {
        const int h = g * Gq + r;
        float *lse = a->lse + (int64_t)h * a->n_q + t, *out = a->out + (t * a->n_head + h) * D;
        const double w0 = isfinite(*lse) ? kvb_exp_d((double)*lse - (double)m[r]) : 0.0, L = w0 + l[r];
        for (int e = 0; e < D; e++) out[e] = (float)(((w0 > 0 ? w0 * out[e] : 0.0) + acc[(size_t)r * D + e]) / L);
        *lse = (float)((double)m[r] + log(L));
    }
}

/* floats of one task slot's scratch: Gq x (n weights + head_dim sums), a tile of dk-channel key rows channel-major,
 * the same tile as rows (tile_logits) */
static size_t slot_floats(int Gq, int64_t n, int D, int dk) {
    return (size_t)Gq * (size_t)(n + D) + (size_t)dk * KT_TILE * 2 + VF_LANES;
}

static void narrow_task(void *arg, int ith, int nth) {
    const narrow_job *j = arg;
    const kvb_attn_args *a = j->a;
    float *scratch = j->scratch + (size_t)ith * slot_floats(j->Gq, j->s->n, a->head_dim, j->s->dk);
    long lo, hi;
    kvb_split((long)(a->n_q * a->n_head_kv), ith, nth, &lo, &hi);
    for (long r = lo; r < hi; r++) narrow_rows(j, r / a->n_head_kv, (int)(r % a->n_head_kv), scratch);
}

static int cpu_attention_narrow(kvb_backend *be, const kvb_attn_args *a, const kvb_narrow_kv *s, char *err,
                                size_t err_len) {
    if (a->n_head <= 0 || a->n_head_kv <= 0 || a->n_head % a->n_head_kv)
        return ERR("attention_narrow: %d query heads over %d KV heads", a->n_head, a->n_head_kv);
    if (!a->lse) return ERR("attention_narrow: needs the store part's lse");
    if (a->kv_dtype != KVB_F16 && a->kv_dtype != KVB_F32) return ERR("attention_narrow: K and V must be f16 or f32");
    if (s->dk < 1 || s->dk > a->head_dim || s->n < 0)
        return ERR("attention_narrow: %d key channels of %d, %lld tokens", s->dk, a->head_dim, (long long)s->n);
    if (a->n_head / a->n_head_kv > 64) return ERR("attention_narrow: %d query heads per KV head (at most 64)", a->n_head / a->n_head_kv);
    if (s->n == 0 || a->n_q == 0) return 0;
    kvb_pool *pool = cpu_backend_pool(be);
    const int nth = kvb_pool_size(pool);
    narrow_job j = {.a = a, .s = s, .Gq = a->n_head / a->n_head_kv};
    j.scratch = malloc((size_t)nth * slot_floats(j.Gq, s->n, a->head_dim, s->dk) * sizeof *j.scratch);
    if (!j.scratch) return ERR("attention_narrow: out of memory");
    kvb_pool_run(pool, narrow_task, &j);
    free(j.scratch);
    return 0;
}

void cpu_install_narrow_ops(kvb_backend *be) {
    be->gather_cols = cpu_gather_cols;
    be->attention_narrow = cpu_attention_narrow;
}
