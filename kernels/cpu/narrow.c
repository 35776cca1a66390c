/* narrow.c — the CPU backend's narrow-key ops (kernels/backend.h, "keys narrower than values"): gather_cols and
 * attention_narrow, in the header's orders (kernels/cuda/narrow.cu computes the same values).
 *
 * attention_narrow gives each query row of a head (n_q x n_head rows) to one task of the backend's thread pool:
 * its logits (float dot over the kept channels, j ascending), their maximum with the store part's lse, the double
 * weights and their sum in token order, the weighted values in float in token order, then the merge. Every sum
 * keeps the header's order whatever the thread count. */
#include "kernels/cpu/narrow.h"

#include "kernels/cpu/kvops.h"
#include "kernels/cpu/pool.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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
    float *scratch; /* per task slot: n weights + head_dim sums */
    int Gq;
} narrow_job;

static float elem(const void *x, kvb_dtype dt, int64_t i) {
    return dt == KVB_F16 ? kvb_f16_to_f32(((const kvb_f16 *)x)[i]) : ((const float *)x)[i];
}

/* one query row t of head h */
static void narrow_row(const narrow_job *j, int64_t t, int h, float *w, float *acc) {
    const kvb_attn_args *a = j->a;
    const kvb_narrow_kv *s = j->s;
    const int g = h / j->Gq, dk = s->dk, D = a->head_dim;
    const kvb_dtype dt = a->kv_dtype;
    const float *qg = s->qg + (t * a->n_head + h) * dk;
    const int32_t *pos = s->pos[g];
    const void *k = s->k[g], *v = s->v[g];
    float *lse = a->lse + (int64_t)h * a->n_q + t, m = *lse;
    int64_t seen = 0;
    for (int64_t i = 0; i < s->n; i++) {
        if (a->q_pos && pos[i] > a->q_pos[t]) {
            w[i] = -INFINITY;
            continue;
        }
        float dot = 0;
        for (int c = 0; c < dk; c++) dot += qg[c] * elem(k, dt, i * dk + c);
        w[i] = a->scale * dot;
        m = w[i] > m ? w[i] : m;
        seen++;
    }
    if (!seen) return; /* nothing visible: out and lse kept */
    double l = 0;
    for (int e = 0; e < D; e++) acc[e] = 0;
    for (int64_t i = 0; i < s->n; i++) {
        if (w[i] == -INFINITY) continue;
        const double wi = exp((double)w[i] - (double)m);
        l += wi;
        const float wf = (float)wi;
        for (int e = 0; e < D; e++) acc[e] += wf * elem(v, dt, i * D + e);
    }
    const double w0 = isfinite(*lse) ? exp((double)*lse - (double)m) : 0.0, L = w0 + l;
    float *out = a->out + (t * a->n_head + h) * D;
    for (int e = 0; e < D; e++) out[e] = (float)(((w0 > 0 ? w0 * out[e] : 0.0) + acc[e]) / L);
    *lse = (float)((double)m + log(L));
}

static void narrow_task(void *arg, int ith, int nth) {
    const narrow_job *j = arg;
    const kvb_attn_args *a = j->a;
    float *w = j->scratch + (size_t)ith * (size_t)(j->s->n + a->head_dim), *acc = w + j->s->n;
    long lo, hi;
    kvb_split((long)(a->n_q * a->n_head), ith, nth, &lo, &hi);
    for (long r = lo; r < hi; r++) narrow_row(j, r / a->n_head, (int)(r % a->n_head), w, acc);
}

static int cpu_attention_narrow(kvb_backend *be, const kvb_attn_args *a, const kvb_narrow_kv *s, char *err,
                                size_t err_len) {
    if (a->n_head <= 0 || a->n_head_kv <= 0 || a->n_head % a->n_head_kv)
        return ERR("attention_narrow: %d query heads over %d KV heads", a->n_head, a->n_head_kv);
    if (!a->lse) return ERR("attention_narrow: needs the store part's lse");
    if (a->kv_dtype != KVB_F16 && a->kv_dtype != KVB_F32) return ERR("attention_narrow: K and V must be f16 or f32");
    if (s->dk < 1 || s->dk > a->head_dim || s->n < 0)
        return ERR("attention_narrow: %d key channels of %d, %lld tokens", s->dk, a->head_dim, (long long)s->n);
    if (s->n == 0 || a->n_q == 0) return 0;
    kvb_pool *pool = cpu_backend_pool(be);
    const int nth = kvb_pool_size(pool);
    narrow_job j = {.a = a, .s = s, .Gq = a->n_head / a->n_head_kv};
    j.scratch = malloc((size_t)nth * (size_t)(s->n + a->head_dim) * sizeof *j.scratch);
    if (!j.scratch) return ERR("attention_narrow: out of memory");
    kvb_pool_run(pool, narrow_task, &j);
    free(j.scratch);
    return 0;
}

void cpu_install_narrow_ops(kvb_backend *be) {
    be->gather_cols = cpu_gather_cols;
    be->attention_narrow = cpu_attention_narrow;
}
