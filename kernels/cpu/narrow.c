/* narrow.c — the CPU backend's narrow-key ops (kernels/backend.h, "keys narrower than values"): gather_cols and
 * attention_narrow, in the header's orders (kernels/cuda/narrow.cu computes the same values).
 *
 * attention_narrow gives each query row of a KV head (its group's query heads together, n_q x n_head_kv tasks) to
 * the backend's thread pool, so a K and a V row are read once per group: the logits (float dot over the kept
 * channels, j ascending), their maximum with the store part's lse, the double weights and their sum in token
 * order, the weighted values in float in token order (vectorised across channels), then the merge. Every sum keeps
 * the header's order whatever the split or the thread count. */
#include "kernels/cpu/narrow.h"

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
    float *scratch; /* per task slot: Gq x (n weights + head_dim sums), then one key row */
    int Gq;
} narrow_job;

static float elem(const void *x, kvb_dtype dt, int64_t i) {
    return dt == KVB_F16 ? kvb_f16_to_f32(((const kvb_f16 *)x)[i]) : ((const float *)x)[i];
}

/* acc[r][e] += w[r][i] v[e] for the group's rows r < Gq, e < D (each product rounded, then the sum: the header's
 * float order, the lanes across e) */
static void add_weighted_row(float *acc, const float *const *w, int64_t i, int Gq, int D, const void *v, kvb_dtype dt) {
    int e = 0;
#if VF_LANES > 1
    for (; e + VF_LANES <= D; e += VF_LANES) {
        const vf x = dt == KVB_F16 ? vf_load_f16((const uint16_t *)v + e) : vf_load((const float *)v + e);
        for (int r = 0; r < Gq; r++) {
            if (w[r][i] == 0) continue; /* masked for this row (adding 0 x v changes no sum) */
            float *a = acc + (size_t)r * D + e;
            vf_store(a, vf_add(vf_load(a), vf_mul(vf_set1(w[r][i]), x)));
        }
    }
#endif
    for (; e < D; e++) {
        const float x = elem(v, dt, e);
        for (int r = 0; r < Gq; r++) acc[(size_t)r * D + e] += w[r][i] * x;
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
    const size_t vrow = (size_t)D * (dt == KVB_F16 ? 2 : 4);
    float *w[MAX_G], m[MAX_G], *acc = scratch + (size_t)Gq * s->n, *kr = acc + (size_t)Gq * D;
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
    for (int64_t i = 0; i < s->n; i++) {
        const int masked = a->q_pos && pos[i] > a->q_pos[t];
        seen += !masked;
        if (!masked) /* the key row as f32, once for the group */
            for (int c = 0; c < dk; c++) kr[c] = elem(k, dt, i * dk + c);
        for (int r = 0; r < Gq; r++) {
            if (masked) {
                w[r][i] = -INFINITY;
                continue;
            }
            float dot = 0;
            for (int c = 0; c < dk; c++) dot += qg[r][c] * kr[c];
            w[r][i] = a->scale * dot;
            m[r] = w[r][i] > m[r] ? w[r][i] : m[r];
        }
    }
    if (!seen) return; /* nothing visible: out and lse kept */
    for (int r = 0; r < Gq; r++)
        for (int64_t i = 0; i < s->n; i++) {
            const double wi = w[r][i] == -INFINITY ? 0.0 : exp((double)w[r][i] - (double)m[r]);
            l[r] += wi;
            w[r][i] = (float)wi;
        }
    memset(acc, 0, (size_t)Gq * D * sizeof *acc);
    for (int64_t i = 0; i < s->n; i++)
        if (!a->q_pos || pos[i] <= a->q_pos[t]) add_weighted_row(acc, (const float *const *)w, i, Gq, D, (const uint8_t *)v + i * vrow, dt);
    for (int r = 0; r < Gq; r++) {
        const int h = g * Gq + r;
        float *lse = a->lse + (int64_t)h * a->n_q + t, *out = a->out + (t * a->n_head + h) * D;
        const double w0 = isfinite(*lse) ? exp((double)*lse - (double)m[r]) : 0.0, L = w0 + l[r];
        for (int e = 0; e < D; e++) out[e] = (float)(((w0 > 0 ? w0 * out[e] : 0.0) + acc[(size_t)r * D + e]) / L);
        *lse = (float)((double)m[r] + log(L));
    }
}

static void narrow_task(void *arg, int ith, int nth) {
    const narrow_job *j = arg;
    const kvb_attn_args *a = j->a;
    float *scratch = j->scratch + (size_t)ith * ((size_t)j->Gq * (size_t)(j->s->n + a->head_dim) + (size_t)j->s->dk);
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
    j.scratch = malloc((size_t)nth * ((size_t)j.Gq * (size_t)(s->n + a->head_dim) + (size_t)s->dk) * sizeof *j.scratch);
    if (!j.scratch) return ERR("attention_narrow: out of memory");
    kvb_pool_run(pool, narrow_task, &j);
    free(j.scratch);
    return 0;
}

void cpu_install_narrow_ops(kvb_backend *be) {
    be->gather_cols = cpu_gather_cols;
    be->attention_narrow = cpu_attention_narrow;
}
