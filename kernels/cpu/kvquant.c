/* kvquant.c — the CPU backend's quantized-KV ops (kernels/backend.h, "KIVI"): quant_groups and attention_quant,
 * plain loops in the header's orders (kernels/cuda/kvquant.cu computes the same values).
 *
 * attention_quant works per KV head on blocks of `group` tokens: a block's K (per-channel groups) and V
 * (per-token groups) are dequantized once into f32 tiles and serve every query row of the head's GQA group, in
 * row blocks of at most ROW_BLOCK rows so that the logits kept for the two passes stay small. The (KV head, row
 * block) pairs are independent and spread over the backend's thread pool, each thread with its own scratch. The
 * order of every sum is the header's (tokens ascending), whatever the blocking or threading. */
#include "kernels/cpu/kvquant.h"

#include "kernels/cpu/kvops.h"
#include "kernels/cpu/pool.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/dtype.h"

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

enum { ROW_BLOCK = 64, MAX_GROUP = 256 };

/* the f16 nearest to x from below / above (x finite and within f16's range) */
static kvb_f16 f16_down(float x) {
    kvb_f16 h = kvb_f32_to_f16(x);
    if (kvb_f16_to_f32(h) > x) h = (h & 0x8000) ? (kvb_f16)(h + 1) : h == 0 ? (kvb_f16)0x8001 : (kvb_f16)(h - 1);
    return h;
}

static kvb_f16 f16_up(float x) {
    kvb_f16 h = kvb_f32_to_f16(x);
    if (kvb_f16_to_f32(h) < x) h = (h & 0x8000) ? (h == 0x8000 ? (kvb_f16)1 : (kvb_f16)(h - 1)) : (kvb_f16)(h + 1);
    return h;
}

static float elem(const void *x, kvb_dtype dt, int64_t i) {
    return dt == KVB_F16 ? kvb_f16_to_f32(((const kvb_f16 *)x)[i]) : ((const float *)x)[i];
}

/* one group of G values into its record: codes, then scale and minimum as f16 */
static void quant_group(const float *x, int G, int bits, uint8_t *rec) {
    float mn = x[0], mx = x[0];
    for (int i = 1; i < G; i++) {
        if (x[i] < mn) mn = x[i];
        if (x[i] > mx) mx = x[i];
    }
    const int qmax = (1 << bits) - 1;
    const kvb_f16 zh = f16_down(mn), sh = f16_up((mx - kvb_f16_to_f32(zh)) / (float)qmax);
    const float z = kvb_f16_to_f32(zh), s = kvb_f16_to_f32(sh);
    const size_t code_bytes = (size_t)G * bits / 8;
    memset(rec, 0, code_bytes);
    for (int i = 0; i < G; i++) {
        int code = 0;
        if (s > 0) {
            const float r = rintf((x[i] - z) / s);
            code = r < 0 ? 0 : r > (float)qmax ? qmax : (int)r;
        }
        rec[i * bits / 8] |= (uint8_t)(code << (i * bits % 8));
    }
    memcpy(rec + code_bytes, &sh, 2);
    memcpy(rec + code_bytes + 2, &zh, 2);
}

/* the G values of a group record into out[0], out[stride], ... (scale and minimum read once) */
static void dequant_group(const uint8_t *rec, int G, int bits, float *out, size_t stride) {
    kvb_f16 sh, zh;
    memcpy(&sh, rec + (size_t)G * bits / 8, 2);
    memcpy(&zh, rec + (size_t)G * bits / 8 + 2, 2);
    const float s = kvb_f16_to_f32(sh), z = kvb_f16_to_f32(zh);
    const int mask = (1 << bits) - 1;
    for (int i = 0; i < G; i++) out[(size_t)i * stride] = z + (float)((rec[i * bits / 8] >> (i * bits % 8)) & mask) * s;
}

static int check_format(int G, int bits, int d, const char *op, char *err, size_t err_len) {
    if (bits != 1 && bits != 2 && bits != 4 && bits != 8) return ERR("%s: %d bits (1, 2, 4 or 8)", op, bits);
    if (G < 1 || G > MAX_GROUP || G * bits % 16)
        return ERR("%s: group %d x %d bits is not a multiple of 16 bits in [1, %d] values", op, G, bits, MAX_GROUP);
    if (d < 1 || d % G) return ERR("%s: head_dim %d is not a multiple of the group %d", op, d, G);
    return 0;
}

static int cpu_quant_groups(kvb_backend *be, void *out, const void *x, kvb_dtype dtype, int64_t n, int d, int G,
                            int bits, int per_channel, char *err, size_t err_len) {
    if (check_format(G, bits, per_channel ? G : d, "quant_groups", err, err_len)) return -1; /* per channel: any d */
    if (n < 0 || (per_channel && n % G)) return ERR("quant_groups: %lld rows in groups of %d", (long long)n, G);
    const size_t rb = kvb_quant_group_bytes(G, bits);
    const int64_t n_groups = per_channel ? n / G * d : n * (d / G);
    float *vals = malloc((size_t)G * sizeof *vals);
    if (!vals) return ERR("quant_groups: out of memory");
    for (int64_t gi = 0; gi < n_groups; gi++) {
        for (int i = 0; i < G; i++) {
            const int64_t at = per_channel ? (gi / d * G + i) * d + gi % d : gi / (d / G) * d + gi % (d / G) * G + i;
            vals[i] = elem(x, dtype, at);
        }
        quant_group(vals, G, bits, (uint8_t *)out + (size_t)gi * rb);
    }
    free(vals);
    return 0;
}

/* f32 tiles of tokens b*G .. b*G + G - 1: K from per-channel groups channel-major ([D][G]: a channel's G tokens
 * side by side, so one pass over the channels dots a query with all G tokens at once), V from per-token groups
 * token-major ([G][D]) */
static void dequant_k(float *kt, const uint8_t *k, int64_t b, int D, int G, int bits) {
    const size_t rb = kvb_quant_group_bytes(G, bits);
    for (int e = 0; e < D; e++) dequant_group(k + (size_t)(b * D + e) * rb, G, bits, kt + (size_t)e * G, 1);
}

static void dequant_v(float *vt, const uint8_t *v, int64_t b, int D, int G, int bits) {
    const size_t rb = kvb_quant_group_bytes(G, bits);
    for (int i = 0; i < G; i++)
        for (int j = 0; j < D / G; j++)
            dequant_group(v + (size_t)((b * G + i) * (D / G) + j) * rb, G, bits, vt + (size_t)i * D + j * G, 1);
}

typedef struct {
    float *kt, *vt, *w, *acc; /* tiles [G][D], logits then weights [ROW_BLOCK][n], accumulators [ROW_BLOCK][D] */
    float *m;                 /* [ROW_BLOCK] */
    double *l;                /* [ROW_BLOCK] */
} quant_scratch;

/* Rows r0 .. r0 + nr - 1 of KV head g (row = t * Gq + r: query t, head g * Gq + r). */
static void attend_rows(const kvb_attn_args *a, const kvb_quant_kv *q, int g, int64_t r0, int nr, quant_scratch *s) {
    const int D = a->head_dim, Gq = a->n_head / a->n_head_kv, G = q->group;
    const int64_t n = q->n;
    const uint8_t *k = q->k[g], *v = q->v[g];
    for (int64_t b = 0; b < n / G; b++) { /* pass 1: logits (masked: -inf) */
        dequant_k(s->kt, k, b, D, G, q->bits);
        for (int rr = 0; rr < nr; rr++) {
            const int64_t t = (r0 + rr) / Gq;
            const float *qr = a->q + (t * a->n_head + g * Gq + (r0 + rr) % Gq) * D;
            /* every token's dot sums its channels in ascending order; the G sums run side by side */
            float dot[MAX_GROUP] = {0};
            for (int e = 0; e < D; e++) {
                const float qe = qr[e], *ke = s->kt + (size_t)e * G;
                for (int i = 0; i < G; i++) dot[i] += qe * ke[i];
            }
            for (int i = 0; i < G; i++) {
                const int visible = !a->q_pos || q->pos0 + b * G + i <= a->q_pos[t];
                s->w[(size_t)rr * n + b * G + i] = visible ? a->scale * dot[i] : -INFINITY;
            }
        }
    }
    for (int rr = 0; rr < nr; rr++) { /* max, weights, their sum */
        const int64_t t = (r0 + rr) / Gq, h = g * Gq + (r0 + rr) % Gq;
        float *w = s->w + (size_t)rr * n, m = a->lse[h * a->n_q + t];
        for (int64_t i = 0; i < n; i++) m = w[i] > m ? w[i] : m;
        double l = 0;
        for (int64_t i = 0; i < n; i++) {
            const double wi = w[i] == -INFINITY ? 0.0 : exp((double)w[i] - (double)m);
            l += wi;
            w[i] = (float)wi;
        }
        s->m[rr] = m;
        s->l[rr] = l;
        memset(s->acc + (size_t)rr * D, 0, (size_t)D * sizeof(float));
    }
    for (int64_t b = 0; b < n / G; b++) { /* pass 2: weighted values */
        dequant_v(s->vt, v, b, D, G, q->bits);
        for (int rr = 0; rr < nr; rr++) {
            float *acc = s->acc + (size_t)rr * D;
            const float *w = s->w + (size_t)rr * n + b * G;
            for (int i = 0; i < G; i++)
                for (int e = 0; e < D; e++) acc[e] += w[i] * s->vt[(size_t)i * D + e];
        }
    }
    for (int rr = 0; rr < nr; rr++) { /* merge with the store's part */
        const int64_t t = (r0 + rr) / Gq, h = g * Gq + (r0 + rr) % Gq;
        float *lse = a->lse + h * a->n_q + t, *out = a->out + (t * a->n_head + h) * D;
        const double m = s->m[rr], w0 = isfinite(*lse) ? exp((double)*lse - m) : 0.0, l = w0 + s->l[rr];
        if (!(l > 0)) continue; /* nothing visible */
        for (int e = 0; e < D; e++)
            out[e] = (float)(((w0 > 0 ? w0 * out[e] : 0.0) + s->acc[(size_t)rr * D + e]) / l);
        *lse = (float)(m + log(l));
    }
}

static void scratch_free(quant_scratch *s) { free(s->kt), free(s->w), free(s->acc), free(s->l); }

/* Scratch for blocks of up to rb rows (decode: the GQA group, so the logits stay small). */
static int scratch_alloc(quant_scratch *s, int G, int D, int64_t n, int rb) {
    s->kt = malloc((size_t)2 * G * D * sizeof(float));
    s->w = malloc((size_t)rb * n * sizeof(float));
    s->acc = malloc((size_t)rb * (D + 1) * sizeof(float));
    s->l = malloc((size_t)rb * sizeof(double));
    if (!s->kt || !s->w || !s->acc || !s->l) return -1;
    s->vt = s->kt + (size_t)G * D;
    s->m = s->acc + (size_t)rb * D;
    return 0;
}

typedef struct {
    const kvb_attn_args *a;
    const kvb_quant_kv *q;
    int64_t rows, row_blocks; /* query rows per KV head, and their blocks of ROW_BLOCK */
    quant_scratch *s;         /* one per thread */
} quant_job;

/* Thread ith's share of the (KV head, row block) pairs. */
static void quant_job_run(void *arg, int ith, int nth) {
    const quant_job *j = arg;
    long lo, hi;
    kvb_split((long)(j->a->n_head_kv * j->row_blocks), ith, nth, &lo, &hi);
    for (long item = lo; item < hi; item++) {
        const int g = (int)(item / j->row_blocks);
        const int64_t r0 = item % j->row_blocks * ROW_BLOCK;
        attend_rows(j->a, j->q, g, r0, j->rows - r0 < ROW_BLOCK ? (int)(j->rows - r0) : ROW_BLOCK, &j->s[ith]);
    }
}

static int cpu_attention_quant(kvb_backend *be, const kvb_attn_args *a, const kvb_quant_kv *q, char *err,
                               size_t err_len) {
    if (a->n_head <= 0 || a->n_head_kv <= 0 || a->n_head % a->n_head_kv)
        return ERR("attention_quant: %d query heads over %d KV heads", a->n_head, a->n_head_kv);
    if (!a->lse) return ERR("attention_quant: needs the store part's lse");
    if (check_format(q->group, q->bits, a->head_dim, "attention_quant", err, err_len)) return -1;
    if (q->n < 0 || q->n % q->group) return ERR("attention_quant: %lld tokens in groups of %d", (long long)q->n, q->group);
    if (q->n == 0 || a->n_q == 0) return 0;
    kvb_pool *pool = cpu_backend_pool(be);
    const int nth = kvb_pool_size(pool);
    quant_job job = {a, q, a->n_q * (a->n_head / a->n_head_kv), 0, calloc((size_t)nth, sizeof(quant_scratch))};
    job.row_blocks = (job.rows + ROW_BLOCK - 1) / ROW_BLOCK;
    int ok = job.s != NULL;
    const int rb = job.rows < ROW_BLOCK ? (int)job.rows : ROW_BLOCK;
    for (int t = 0; ok && t < nth; t++) ok = scratch_alloc(&job.s[t], q->group, a->head_dim, q->n, rb) == 0;
    if (ok) kvb_pool_run(pool, quant_job_run, &job);
    for (int t = 0; job.s && t < nth; t++) scratch_free(&job.s[t]);
    free(job.s);
    return ok ? 0 : ERR("attention_quant: out of memory");
}

void cpu_install_kvquant_ops(kvb_backend *be) {
    be->quant_groups = cpu_quant_groups;
    be->attention_quant = cpu_attention_quant;
}
