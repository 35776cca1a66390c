/* kvquant.c — the CPU backend's quantized-KV ops (kernels/backend.h, "KIVI"): quant_groups and attention_quant,
 * in the header's orders (kernels/cuda/kvquant.cu computes the same values).
 *
 * attention_quant takes the query rows of every KV head in blocks of at most ROW_BLOCK rows per head, in three
 * passes over the backend's thread pool: the logits, split by blocks of `group` tokens (a block's K is
 * dequantized once into an f32 tile that serves every row, the dot products vectorised across its tokens, up to 4
 * rows x 2 vectors of tokens at once so that the sums' adds overlap); the softmax weights, the rows grouped into a
 * task per thread (expd.h's double exp, the rows' sums interleaved); the weighted values, split by channel group
 * (a token's values dequantized a vector at a time for up to 4 rows, their sums in registers). Codes widen with
 * AVX2 variable shifts where built for it. Every sum keeps the header's order (e ascending for a logit, tokens
 * ascending for L and acc), whatever the split or the thread count. */
#include "kernels/cpu/kvquant.h"

#include "kernels/cpu/expd.h"
#include "kernels/cpu/kvops.h"
#include "kernels/cpu/pool.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/ops_vec.h"
#include "kernels/dtype.h"

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

enum { ROW_BLOCK = 16, MAX_GROUP = 256 };

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

/* a group record's scale and minimum */
static void group_sz(const uint8_t *rec, int G, int bits, float *sc, float *z) {
    kvb_f16 sh, zh;
    memcpy(&sh, rec + (size_t)G * bits / 8, 2);
    memcpy(&zh, rec + (size_t)G * bits / 8 + 2, 2);
    *sc = kvb_f16_to_f32(sh);
    *z = kvb_f16_to_f32(zh);
}

static int code_at(const uint8_t *codes, int i, int bits) { return (codes[i * bits / 8] >> (i * bits % 8)) & ((1 << bits) - 1); }

/* codes i0 .. i0 + VF_LANES - 1 of a group record, as floats (AVX2, AVX-512: the codes' bytes shifted apart per
 * lane; code k of the vector sits at bit k x bits of the little-endian stream from code i0) */
static inline vf codes_vec(const uint8_t *codes, int i0, int bits) {
#if VF_LANES == 16
    if (bits == 8) return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(codes + i0))));
    const uint8_t *at = codes + i0 * bits / 8; /* the 16 codes' 2 x bits bytes */
    uint32_t lo, hi;
    if (bits == 4) memcpy(&lo, at, 4), memcpy(&hi, at + 4, 4); /* codes 0-7 in lo, 8-15 in hi */
    else if (bits == 2) memcpy(&lo, at, 4), hi = lo;
    else { uint16_t h; memcpy(&h, at, 2); lo = hi = h; }
    const __m512i word = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32((int)lo)), _mm256_set1_epi32((int)hi), 1);
    const __m512i k = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i sh = _mm512_mullo_epi32(bits == 4 ? _mm512_and_si512(k, _mm512_set1_epi32(7)) : k, _mm512_set1_epi32(bits));
    return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srlv_epi32(word, sh), _mm512_set1_epi32((1 << bits) - 1)));
#elif VF_LANES == 8
    if (bits == 8) return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(codes + i0))));
    uint32_t word;
    const uint8_t *at = codes + i0 * bits / 8; /* the 8 codes' `bits` bytes */
    if (bits == 4) memcpy(&word, at, 4);
    else if (bits == 2) { uint16_t h; memcpy(&h, at, 2); word = h; }
    else word = at[0];
    const __m256i sh = _mm256_setr_epi32(0, bits, 2 * bits, 3 * bits, 4 * bits, 5 * bits, 6 * bits, 7 * bits);
    const __m256i x = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)word), sh), _mm256_set1_epi32((1 << bits) - 1));
    return _mm256_cvtepi32_ps(x);
#else
    float f[VF_LANES];
    for (int k = 0; k < VF_LANES; k++) f[k] = (float)code_at(codes, i0 + k, bits);
    return vf_load(f);
#endif
}

/* values i0 .. i0 + VF_LANES - 1 of a group record, and value i alone: z + code * s */
static inline vf deq_vec(const uint8_t *rec, int i0, int bits, float sc, float z) {
    return vf_add(vf_set1(z), vf_mul(codes_vec(rec, i0, bits), vf_set1(sc)));
}

static float deq_at(const uint8_t *rec, int i, int bits, float sc, float z) { return z + (float)code_at(rec, i, bits) * sc; }

/* the D group records of a K block (rb bytes apart) dequantized channel-major into kt ([D][G]); bits a constant
 * where inlined */
static inline __attribute__((always_inline)) void dequant_tile_bits(const uint8_t *k, int D, int G, int bits, float *kt) {
    const size_t rb = kvb_quant_group_bytes(G, bits);
    const int iv = G - G % VF_LANES;
    for (int e = 0; e < D; e++, k += rb, kt += G) {
        float sc, z;
        group_sz(k, G, bits, &sc, &z);
        for (int i = 0; i < iv; i += VF_LANES) vf_store(kt + i, deq_vec(k, i, bits, sc, z));
        for (int i = iv; i < G; i++) kt[i] = deq_at(k, i, bits, sc, z);
    }
}

static void dequant_tile(const uint8_t *k, int D, int G, int bits, float *kt) {
    switch (bits) {
    case 1: dequant_tile_bits(k, D, G, 1, kt); break;
    case 2: dequant_tile_bits(k, D, G, 2, kt); break;
    case 4: dequant_tile_bits(k, D, G, 4, kt); break;
    default: dequant_tile_bits(k, D, G, 8, kt); break;
    }
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

typedef struct {
    const kvb_attn_args *a;
    const kvb_quant_kv *q;
    int Gq, D, G, HK;
    int64_t n, r0;   /* quantized tokens; the block's first row (row = t * Gq + r: query t, head g * Gq + r) */
    int nr;          /* rows in the block */
    float *w;        /* [HK][ROW_BLOCK][n]: logits, then weights */
    float *acc;      /* [HK][ROW_BLOCK][D] */
    float *m;        /* [HK][ROW_BLOCK] */
    double *l;       /* [HK][ROW_BLOCK] */
    float *tile;     /* per thread: [D][G] */
} quant_job;

static size_t slot(int g, int rr) { return (size_t)g * ROW_BLOCK + (size_t)rr; }
static int64_t row_t(const quant_job *j, int rr) { return (j->r0 + rr) / j->Gq; }
static int row_h(const quant_job *j, int g, int rr) { return g * j->Gq + (int)((j->r0 + rr) % j->Gq); }

/* rows r0 .. r0 + nr - 1's logits for tokens i0 .. i0 + nc x VF_LANES - 1 of a block (nr, nc constants where
 * inlined): nr x nc independent sums, each e ascending, so that the adds' latency overlaps */
static inline __attribute__((always_inline)) void logits_block(const quant_job *j, const float *kt, int g, int64_t b,
                                                               int r0, int nr, int i0, int nc) {
    const kvb_attn_args *a = j->a;
    const float *qr[4];
    vf acc[4][2];
    for (int r = 0; r < nr; r++) {
        qr[r] = a->q + (row_t(j, r0 + r) * a->n_head + row_h(j, g, r0 + r)) * j->D;
        for (int c = 0; c < nc; c++) acc[r][c] = vf_zero();
    }
    for (int e = 0; e < j->D; e++) {
        vf k[2];
        for (int c = 0; c < nc; c++) k[c] = vf_load(kt + (size_t)e * j->G + i0 + c * VF_LANES);
        for (int r = 0; r < nr; r++) {
            const vf qe = vf_set1(qr[r][e]);
            for (int c = 0; c < nc; c++) acc[r][c] = vf_add(acc[r][c], vf_mul(qe, k[c]));
        }
    }
    const vf sc = vf_set1(a->scale);
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nc; c++) vf_store(j->w + slot(g, r0 + r) * j->n + b * j->G + i0 + c * VF_LANES, vf_mul(sc, acc[r][c]));
}

/* pass 1, per (KV head, block of G tokens): K dequantized channel-major ([D][G]: a channel's G tokens side by
 * side), then each row's G logits, e ascending, masked by position */
static void pass_logits(void *arg, int ith, int nth) {
    const quant_job *j = arg;
    const kvb_attn_args *a = j->a;
    const int64_t nb = j->n / j->G;
    const size_t rb = kvb_quant_group_bytes(j->G, j->q->bits);
    const int iv = j->G - j->G % VF_LANES; /* tokens done in vectors */
    float *kt = j->tile + (size_t)ith * j->D * j->G;
    long lo, hi;
    kvb_split((long)(j->HK * nb), ith, nth, &lo, &hi);
    for (long task = lo; task < hi; task++) {
        const int g = (int)(task / nb);
        const int64_t b = task % nb;
        const uint8_t *k = j->q->k[g];
        dequant_tile(k + (size_t)(b * j->D) * rb, j->D, j->G, j->q->bits, kt);
        for (int i0 = 0; i0 < iv; i0 += 2 * VF_LANES) {
            const int nc = iv - i0 >= 2 * VF_LANES ? 2 : 1;
            for (int r0 = 0; r0 < j->nr; r0 += 4) {
                const int nr = j->nr - r0 < 4 ? j->nr - r0 : 4;
#define LB(R, C) logits_block(j, kt, g, b, r0, R, i0, C)
                if (nc == 2) switch (nr) { case 4: LB(4, 2); break; case 3: LB(3, 2); break; case 2: LB(2, 2); break; default: LB(1, 2); }
                else switch (nr) { case 4: LB(4, 1); break; case 3: LB(3, 1); break; case 2: LB(2, 1); break; default: LB(1, 1); }
#undef LB
            }
        }
        for (int rr = 0; rr < j->nr; rr++) {
            const int64_t t = row_t(j, rr);
            const float *qr = a->q + (t * a->n_head + row_h(j, g, rr)) * j->D;
            float *w = j->w + slot(g, rr) * j->n + b * j->G;
            for (int i0 = iv; i0 < j->G; i0++) {
                float dot = 0;
                for (int e = 0; e < j->D; e++) dot += qr[e] * kt[(size_t)e * j->G + i0];
                w[i0] = a->scale * dot;
            }
            const int64_t p0 = j->q->pos0 + b * j->G; /* the block's first position */
            if (a->q_pos && p0 + j->G - 1 > a->q_pos[t])
                for (int i = 0; i < j->G; i++)
                    if (p0 + i > a->q_pos[t]) w[i] = -INFINITY;
        }
    }
}

/* a row's maximum with m, as the scalar `m = w[i] > m ? w[i] : m` keeps it (NaN skipped), in vectors */
static float row_max(const float *w, int64_t n, float m) {
    if (m != m) return m; /* nothing is above NaN there */
    int64_t i = 0;
    vf v = vf_set1(m);
    for (; i + VF_LANES <= n; i += VF_LANES) v = vf_max(vf_load(w + i), v); /* lane: w > v ? w : v */
    float r = vf_hmax(v);
    r = m > r ? m : r;
    for (; i < n; i++) r = w[i] > r ? w[i] : r;
    return r;
}

/* pass 2, per task of up to KVB_EXPD_ROWS rows (as many tasks as threads where the rows allow): each row's
 * maximum (with the store part's lse), the weights (expd.h's double exp, in vectors) and their sum, the rows'
 * sums interleaved */
static void pass_weights(void *arg, int ith, int nth) {
    const quant_job *j = arg;
    const int rows = j->HK * j->nr, per = (rows + nth - 1) / nth < KVB_EXPD_ROWS ? (rows + nth - 1) / nth : KVB_EXPD_ROWS;
    long lo, hi;
    kvb_split((long)((rows + per - 1) / per), ith, nth, &lo, &hi);
    for (long task = lo; task < hi; task++) {
        float *w[KVB_EXPD_ROWS], m[KVB_EXPD_ROWS];
        double l[KVB_EXPD_ROWS];
        size_t sl[KVB_EXPD_ROWS];
        const int q0 = (int)task * per, k = rows - q0 < per ? rows - q0 : per;
        for (int r = 0; r < k; r++) {
            const int g = (q0 + r) / j->nr, rr = (q0 + r) % j->nr;
            sl[r] = slot(g, rr);
            w[r] = j->w + sl[r] * j->n;
            m[r] = row_max(w[r], j->n, j->a->lse[row_h(j, g, rr) * j->a->n_q + row_t(j, rr)]);
        }
        kvb_exp_weights_rows(w, k, j->n, m, l);
        for (int r = 0; r < k; r++) {
            j->m[sl[r]] = m[r];
            j->l[sl[r]] = l[r];
            memset(j->acc + sl[r] * j->D, 0, (size_t)j->D * sizeof(float));
        }
    }
}

/* pass 3, per (KV head, channel group): rows r0 .. r0 + nr - 1 over elements e0 .. e0 + nc x VF_LANES - 1 of
 * the group (nr, nc constants where inlined), each token's values dequantized once for every row, the nr x nc
 * sums in registers (each tokens ascending) */
static inline __attribute__((always_inline)) void values_block(const quant_job *j, int g, int cg, int e0, int nc,
                                                               int r0, int nr) {
    const int n_cg = j->D / j->G;
    const size_t rb = kvb_quant_group_bytes(j->G, j->q->bits);
    const uint8_t *v = j->q->v[g];
    vf a[4][2];
    const float *w[4];
    for (int r = 0; r < nr; r++) {
        for (int c = 0; c < nc; c++) a[r][c] = vf_load(j->acc + slot(g, r0 + r) * j->D + (size_t)cg * j->G + e0 + c * VF_LANES);
        w[r] = j->w + slot(g, r0 + r) * j->n;
    }
    for (int64_t i = 0; i < j->n; i++) {
        const uint8_t *rec = v + (size_t)(i * n_cg + cg) * rb;
        float sc, z;
        group_sz(rec, j->G, j->q->bits, &sc, &z);
        vf x[2];
        for (int c = 0; c < nc; c++) x[c] = deq_vec(rec, e0 + c * VF_LANES, j->q->bits, sc, z);
        for (int r = 0; r < nr; r++) {
            const vf wr = vf_set1(w[r][i]);
            for (int c = 0; c < nc; c++) a[r][c] = vf_add(a[r][c], vf_mul(wr, x[c]));
        }
    }
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nc; c++) vf_store(j->acc + slot(g, r0 + r) * j->D + (size_t)cg * j->G + e0 + c * VF_LANES, a[r][c]);
}

static void pass_values(void *arg, int ith, int nth) {
    const quant_job *j = arg;
    const int n_cg = j->D / j->G, G = j->G, bits = j->q->bits;
    const size_t rb = kvb_quant_group_bytes(G, bits);
    long lo, hi;
    const int ev = G % VF_LANES == 0 ? G : 0; /* elements done in vectors */
    kvb_split((long)j->HK * n_cg, ith, nth, &lo, &hi);
    for (long task = lo; task < hi; task++) {
        const int g = (int)(task / n_cg), cg = (int)(task % n_cg);
        for (int e0 = 0; e0 < ev; e0 += 2 * VF_LANES) {
            const int nc = ev - e0 >= 2 * VF_LANES ? 2 : 1;
            for (int r0 = 0; r0 < j->nr; r0 += 4) {
                const int nr = j->nr - r0 < 4 ? j->nr - r0 : 4;
#define VB(R, C) values_block(j, g, cg, e0, C, r0, R)
                if (nc == 2) switch (nr) { case 4: VB(4, 2); break; case 3: VB(3, 2); break; case 2: VB(2, 2); break; default: VB(1, 2); }
                else switch (nr) { case 4: VB(4, 1); break; case 3: VB(3, 1); break; case 2: VB(2, 1); break; default: VB(1, 1); }
#undef VB
            }
        }
        for (int e = ev; e < G; e++) /* groups of fewer values than a vector: one element at a time */
            for (int rr = 0; rr < j->nr; rr++) {
                float *acc = j->acc + slot(g, rr) * j->D + (size_t)cg * G + e;
                const float *w = j->w + slot(g, rr) * j->n;
                for (int64_t i = 0; i < j->n; i++) {
                    const uint8_t *rec = j->q->v[g] + (size_t)(i * n_cg + cg) * rb;
                    float sc, z;
                    group_sz(rec, G, bits, &sc, &z);
                    *acc += w[i] * deq_at(rec, e, bits, sc, z);
                }
            }
    }
}

/* the quantized part merged into the store's: out and lse per row */
static void merge_rows(const quant_job *j) {
    const kvb_attn_args *a = j->a;
    for (int g = 0; g < j->HK; g++)
        for (int rr = 0; rr < j->nr; rr++) {
            const int64_t t = row_t(j, rr), h = row_h(j, g, rr);
            float *lse = a->lse + h * a->n_q + t, *out = a->out + (t * a->n_head + h) * j->D;
            const double m = j->m[slot(g, rr)], w0 = isfinite(*lse) ? kvb_exp_d((double)*lse - m) : 0.0;
            const double l = w0 + j->l[slot(g, rr)];
            if (!(l > 0)) continue; /* nothing visible */
            const float *acc = j->acc + slot(g, rr) * j->D;
            for (int e = 0; e < j->D; e++) out[e] = (float)(((w0 > 0 ? w0 * out[e] : 0.0) + acc[e]) / l);
            *lse = (float)(m + log(l));
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
    const int nth = kvb_pool_size(pool), HK = a->n_head_kv, D = a->head_dim;
    quant_job j = {.a = a, .q = q, .Gq = a->n_head / HK, .D = D, .G = q->group, .HK = HK, .n = q->n};
    const size_t rows = (size_t)HK * ROW_BLOCK;
    j.w = malloc(rows * (size_t)q->n * sizeof *j.w);
    j.acc = malloc(rows * (size_t)(D + 1) * sizeof *j.acc);
    j.l = malloc(rows * sizeof *j.l);
    j.tile = malloc((size_t)nth * D * q->group * sizeof *j.tile);
    const int ok = j.w && j.acc && j.l && j.tile;
    if (ok) {
        j.m = j.acc + rows * (size_t)D;
        const int64_t per_head = a->n_q * j.Gq;
        for (j.r0 = 0; j.r0 < per_head; j.r0 += ROW_BLOCK) {
            j.nr = (int)(per_head - j.r0 < ROW_BLOCK ? per_head - j.r0 : ROW_BLOCK);
            kvb_pool_run(pool, pass_logits, &j);
            kvb_pool_run(pool, pass_weights, &j);
            kvb_pool_run(pool, pass_values, &j);
            merge_rows(&j);
        }
    }
    free(j.w), free(j.acc), free(j.l), free(j.tile);
    return ok ? 0 : ERR("attention_quant: out of memory");
}

void cpu_install_kvquant_ops(kvb_backend *be) {
    be->quant_groups = cpu_quant_groups;
    be->attention_quant = cpu_attention_quant;
}
