/* attention_ggml.c — attention over an f32 KV cache in the exact float order of llama.cpp's CPU backend
 * (its non-flash path), so `--kv-type f32` gives llama.cpp's numbers bit for bit (see ggml_compat.h for
 * why that takes bit-exactness).
 *
 * For each query row (token, head) the scores are materialised over the key list up to its last
 * visible key, as llama.cpp's graph does (KQ = K.Q, softmax(KQ * scale + mask), KQV = V^T . P):
 *  - s_j = dot(k_j, q) in gc_dot's order, times scale; masked keys -inf;
 *  - softmax: max, then exp in groups of 8 keys (gc_expf), each group's sum (gc_sum8) added in double,
 *    p_j = e_j * (float)(1 / sum);
 *  - out[d] = sum_j p_j v_j[d] in the order llama.cpp's matmul takes for the shape: a prompt chunk
 *    (n_q >= 2) goes through its tiled f32 GEMM, 8 lanes by key index mod 8, each a chain of fused
 *    multiply-adds, then gc_sum8; one token (decode) goes through its dot product, 32 slots by key
 *    index mod 32 folded as in gc_dot.
 * Keys past the last visible one contribute exact zeros to all of this, so they are skipped; llama.cpp
 * pads its cache view to 256 cells, which is why its dot products never reach their scalar tails.
 *
 * The work goes to the pool threads in units of one head and up to 32 tokens, dealt round-robin. A unit's
 * rows take turns a key block (64 KiB of K or V rows) at a time, first for the scores, then for the
 * weighted sum, so a block is read from memory once for all the unit's rows rather than once per row:
 * one row at a time, a 3765-token prompt's attention read every head's K and V from L3 for every row and
 * ran at 12 GFLOP/s. Each row's arithmetic is the same as alone, in the same order, whatever the units
 * and threads. The vector loops run along head_dim, so any head_dim works; AVX2 where compiled for it,
 * the same roundings in scalar code otherwise. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/ggml_compat.h"
#include "kernels/cpu/ops.h"

enum {
    GA_ALIGN = 64,
    GA_SLOTS = 32,               /* decode's accumulator slots (the dot product's); a prompt chunk's are 8 */
    GA_ROWS = 32,                /* most query rows (tokens of one head) a unit takes */
    GA_SCORE_BYTES = 1 << 20,    /* a unit's scores at most: fewer rows past 8K keys (a thread's workspace ~1 MiB) */
    GA_BLOCK_BYTES = 64 << 10,   /* the K (then V) rows of one key block */
};

static size_t ga_round(size_t x) { return (x + GA_ALIGN - 1) / GA_ALIGN * GA_ALIGN; }

/* Query rows per unit: up to GA_ROWS tokens of one head, as many as keep their scores within GA_SCORE_BYTES. */
static int unit_rows(const cpu_attn_args *a, int64_t L_max) {
    int64_t r = GA_SCORE_BYTES / ((L_max + 8) * (int64_t)sizeof(float));
    if (r > GA_ROWS) r = GA_ROWS;
    if (r > a->n_q) r = a->n_q;
    return r < 1 ? 1 : (int)r;
}

static int slots_of(const cpu_attn_args *a) { return a->n_q >= 2 ? 8 : GA_SLOTS; }

/* per-thread scratch: each row's scores over the longest list (+ a group of padding) and its accumulator slots */
static size_t thread_bytes(const cpu_attn_args *a, int64_t L_max) {
    const size_t rows = (size_t)unit_rows(a, L_max);
    return ga_round(rows * (size_t)(L_max + 8) * sizeof(float)) +
           ga_round(rows * (size_t)slots_of(a) * a->head_dim * sizeof(float));
}

size_t cpu_attention_ggml_ws_bytes(const cpu_attn_args *a, int64_t L_max, int n_threads) {
    if (n_threads < 1) n_threads = 1;
    return GA_ALIGN + (size_t)n_threads * thread_bytes(a, L_max);
}

typedef struct {
    const cpu_attn_args *a;
    char *ws;
    size_t tb;
    int64_t L_max;
    int rows;        /* tokens per unit */
    long n_units;    /* token blocks x heads */
} ga_job;

/* acc[lane][d] += p * v[d]: one fused multiply-add chain per (lane, d) */
static inline void accum_row(float *acc, const float *v, float p, int D) {
    int d = 0;
#if GC_AVX2 && defined(__AVX512F__)
    const __m512 wp = _mm512_set1_ps(p);
    for (; d + 16 <= D; d += 16)
        _mm512_storeu_ps(acc + d, _mm512_fmadd_ps(_mm512_loadu_ps(v + d), wp, _mm512_loadu_ps(acc + d)));
#endif
#if GC_AVX2
    const __m256 vp = _mm256_set1_ps(p);
    for (; d + 8 <= D; d += 8)
        _mm256_storeu_ps(acc + d, _mm256_fmadd_ps(_mm256_loadu_ps(v + d), vp, _mm256_loadu_ps(acc + d)));
#endif
    for (; d < D; d++) acc[d] = fmaf(v[d], p, acc[d]);
}

/* s[j] = gc_dot(k_j, q) * scale for keys j0..je (list order, slots through idx when given), -inf where masked (the
 * key's position past qp); returns the running max of mx and the scores */
static inline float scores_plain(const float *K, const int32_t *idx, const int32_t *kp, int masked, int32_t qp,
                                 const float *q, float scale, int D, int64_t j0, int64_t je, float *s, float mx) {
    for (int64_t j = j0; j <= je; j++) {
        const int64_t sl = idx ? idx[j] : j;
        if (masked && kp[sl] > qp) {
            s[j] = -INFINITY;
            continue;
        }
        s[j] = gc_dot(K + (size_t)sl * D, q, D) * scale;
        if (s[j] > mx) mx = s[j];
    }
    return mx;
}

#if GC_AVX2 && defined(__AVX512F__)
#define GA_AVX512 1
/* gc_dot(x, q, D)'s 8 lanes before their fold, for D a multiple of 32, in 16-float vectors: lanes 0-7 of c0 are
 * gc_dot's accumulator a0 and lanes 8-15 its a1, c1's are a2 and a3, so the fused multiply-adds are gc_dot's, lane
 * for lane; c0 + c1 is then (a0 + a2 | a1 + a3), and its halves' sum gc_dot's (a0 + a2) + (a1 + a3). */
static inline __m256 dot512_lanes(const float *x, const __m512 *qv, int D) {
    __m512 c0 = _mm512_setzero_ps(), c1 = c0;
    for (int o = 0; o < D / 16; o += 2) {
        c0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + 16 * o), qv[o], c0);
        c1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + 16 * o + 16), qv[o + 1], c1);
    }
    const __m512 c = _mm512_add_ps(c0, c1);
    return _mm256_add_ps(_mm512_castps512_ps256(c), _mm512_extractf32x8_ps(c, 1));
}

/* gc_dot's fold of eight keys' lanes at once: per key (lo + hi halves), then the two horizontal adds, here taking
 * two keys per add; the results come out as keys 0 2 4 6 | 1 3 5 7 and are put back in order */
static inline __m256 fold8(__m256 k0, __m256 k1, __m256 k2, __m256 k3, __m256 k4, __m256 k5, __m256 k6, __m256 k7) {
    const __m256 t01 = _mm256_add_ps(_mm256_permute2f128_ps(k0, k1, 0x20), _mm256_permute2f128_ps(k0, k1, 0x31));
    const __m256 t23 = _mm256_add_ps(_mm256_permute2f128_ps(k2, k3, 0x20), _mm256_permute2f128_ps(k2, k3, 0x31));
    const __m256 t45 = _mm256_add_ps(_mm256_permute2f128_ps(k4, k5, 0x20), _mm256_permute2f128_ps(k4, k5, 0x31));
    const __m256 t67 = _mm256_add_ps(_mm256_permute2f128_ps(k6, k7, 0x20), _mm256_permute2f128_ps(k6, k7, 0x31));
    const __m256 f = _mm256_hadd_ps(_mm256_hadd_ps(t01, t23), _mm256_hadd_ps(t45, t67));
    return _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* scores_plain with AVX-512 for D a multiple of 32, at most 256: eight keys at a time, the rest through scores_plain */
static inline float scores512(const float *K, const int32_t *idx, const int32_t *kp, int masked, int32_t qp,
                              const float *q, float scale, int D, int64_t j0, int64_t je, float *s, float mx) {
    __m512 qv[16];
    for (int o = 0; o < D / 16; o++) qv[o] = _mm512_loadu_ps(q + 16 * o);
    const __m256 vs = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(-INFINITY);
    __m256 vmx = _mm256_set1_ps(mx);
    int64_t j = j0;
#define GA_K(i) (K + (size_t)(idx ? idx[j + (i)] : j + (i)) * D)
    for (; j + 8 <= je + 1; j += 8) {
        __m256 v = fold8(dot512_lanes(GA_K(0), qv, D), dot512_lanes(GA_K(1), qv, D), dot512_lanes(GA_K(2), qv, D),
                         dot512_lanes(GA_K(3), qv, D), dot512_lanes(GA_K(4), qv, D), dot512_lanes(GA_K(5), qv, D),
                         dot512_lanes(GA_K(6), qv, D), dot512_lanes(GA_K(7), qv, D));
        v = _mm256_mul_ps(v, vs);
        if (masked) {
            const __m256i p = idx ? _mm256_i32gather_epi32(kp, _mm256_loadu_si256((const __m256i *)(idx + j)), 4)
                                  : _mm256_loadu_si256((const __m256i *)(kp + j));
            v = _mm256_blendv_ps(v, ninf, _mm256_castsi256_ps(_mm256_cmpgt_epi32(p, _mm256_set1_epi32(qp))));
        }
        _mm256_storeu_ps(s + j, v);
        vmx = _mm256_max_ps(vmx, v);
    }
#undef GA_K
    _Alignas(32) float m8[8];
    _mm256_store_ps(m8, vmx);
    for (int l = 0; l < 8; l++)
        if (m8[l] > mx) mx = m8[l];
    return scores_plain(K, idx, kp, masked, qp, q, scale, D, j, je, s, mx);
}

/* a prompt chunk's weighted sum over keys j0..je of one row (j0 a multiple of 8), for D a multiple of 16: per 16
 * columns, the 8 slots' accumulators in registers while the keys go by in order (each element's chain of fused
 * multiply-adds is accum_row's), the keys past the last whole group of 8 through accum_row */
static inline void pv8_512(float *acc, const float *V, const int32_t *idx, const float *p, int64_t j0, int64_t je,
                           int D) {
    const int64_t jg = j0 + ((je - j0 + 1) & ~(int64_t)7); /* keys j0 .. jg-1 in groups of 8 */
    for (int c = 0; c < D; c += 16) {
        __m512 a0 = _mm512_loadu_ps(acc + c), a1 = _mm512_loadu_ps(acc + D + c), a2 = _mm512_loadu_ps(acc + 2 * D + c),
               a3 = _mm512_loadu_ps(acc + 3 * D + c), a4 = _mm512_loadu_ps(acc + 4 * D + c),
               a5 = _mm512_loadu_ps(acc + 5 * D + c), a6 = _mm512_loadu_ps(acc + 6 * D + c),
               a7 = _mm512_loadu_ps(acc + 7 * D + c);
#define GA_PV(i, a) a = _mm512_fmadd_ps(_mm512_loadu_ps(row(i) + c), _mm512_set1_ps(p[j + (i)]), a)
#define GA_PV8                                                                                                         \
    GA_PV(0, a0), GA_PV(1, a1), GA_PV(2, a2), GA_PV(3, a3), GA_PV(4, a4), GA_PV(5, a5), GA_PV(6, a6), GA_PV(7, a7)
        if (idx) {
#define row(i) (V + (size_t)idx[j + (i)] * D)
            for (int64_t j = j0; j < jg; j += 8) GA_PV8;
#undef row
        } else {
#define row(i) (V + (size_t)(j + (i)) * D)
            for (int64_t j = j0; j < jg; j += 8) GA_PV8;
#undef row
        }
#undef GA_PV8
#undef GA_PV
        _mm512_storeu_ps(acc + c, a0), _mm512_storeu_ps(acc + D + c, a1), _mm512_storeu_ps(acc + 2 * D + c, a2);
        _mm512_storeu_ps(acc + 3 * D + c, a3), _mm512_storeu_ps(acc + 4 * D + c, a4);
        _mm512_storeu_ps(acc + 5 * D + c, a5), _mm512_storeu_ps(acc + 6 * D + c, a6);
        _mm512_storeu_ps(acc + 7 * D + c, a7);
    }
    for (int64_t j = jg; j <= je; j++)
        accum_row(acc + (size_t)(j & 7) * D, V + (size_t)(idx ? idx[j] : j) * D, p[j], D);
}
#else
#define GA_AVX512 0
#endif

/* One unit: head h, tokens t0 .. t0 + nr - 1. Every row's arithmetic is the one-row order described above (its keys
 * in list order, the same operations); the rows only take turns a key block at a time, so a block's K and V rows
 * are read from memory once for all of them. s: nr score rows of `ss` floats; acc: nr rows of `slots` x D. */
static void one_unit(const cpu_attn_args *a, int h, int64_t t0, int nr, float *s, int64_t ss, float *acc) {
    const int D = a->head_dim, G = a->n_head / a->n_head_kv, g = h / G;
    const int32_t *idx = (a->idx && a->idx[g]) ? a->idx[g] : NULL;
    const int64_t n = idx ? a->n_idx[g] : a->n_kv[g];
    const float *K = a->k[g], *V = a->v[g];
    const int32_t *kp = a->k_pos ? a->k_pos[g] : NULL;
    const int masked = a->q_pos != NULL;
    const int slots = slots_of(a);
    /* keys per block: a multiple of 32, so a block starts on slot 0 of the prompt's 8 and the decode's 32 */
    int64_t block = GA_BLOCK_BYTES / ((int64_t)D * (int64_t)sizeof(float)) / 32 * 32;
    if (block < 32) block = 32;

    int64_t last[GA_ROWS], last_max = -1;
    float mx[GA_ROWS];
    for (int r = 0; r < nr; r++) {
        last[r] = n - 1;
        if (masked) {
            const int32_t qp = a->q_pos[t0 + r];
            while (last[r] >= 0 && kp[idx ? idx[last[r]] : last[r]] > qp) last[r]--;
        }
        if (last[r] > last_max) last_max = last[r];
        mx[r] = -INFINITY;
    }

    /* scores, a key block at a time for every row: s_j = dot(k_j, q) * scale, masked keys -inf */
    for (int64_t j0 = 0; j0 <= last_max; j0 += block) {
        const int64_t j1 = j0 + block - 1 < last_max ? j0 + block - 1 : last_max;
        for (int r = 0; r < nr; r++) {
            const float *q = a->q + ((size_t)(t0 + r) * a->n_head + h) * D;
            const int32_t qp = masked ? a->q_pos[t0 + r] : 0;
            float *sr = s + (size_t)r * ss;
            const int64_t je = j1 < last[r] ? j1 : last[r];
#if GA_AVX512
            if (D % 32 == 0 && D <= 256) {
                if (je >= j0) mx[r] = scores512(K, idx, kp, masked, qp, q, a->scale, D, j0, je, sr, mx[r]);
                continue;
            }
#endif
            mx[r] = scores_plain(K, idx, kp, masked, qp, q, a->scale, D, j0, je, sr, mx[r]);
        }
    }

    /* each row's softmax: exp in groups of 8 (gc_expf), the groups' sums (gc_sum8) added in double */
    for (int r = 0; r < nr; r++) {
        if (last[r] < 0) continue;
        float *sr = s + (size_t)r * ss;
        const int64_t n_pad = (last[r] + 8) & ~(int64_t)7;
        for (int64_t j = last[r] + 1; j < n_pad; j++) sr[j] = -INFINITY;
        double sum = 0.0;
        for (int64_t j = 0; j < n_pad; j += 8) {
#if GC_AVX2
            const __m256 e = gc_expf8(_mm256_sub_ps(_mm256_loadu_ps(sr + j), _mm256_set1_ps(mx[r])));
            _mm256_storeu_ps(sr + j, e);
            sum += (double)gc_sum8v(e);
#else
            for (int l = 0; l < 8; l++) sr[j + l] = gc_expf(sr[j + l] - mx[r]);
            sum += (double)gc_sum8(sr + j);
#endif
        }
        const float inv = (float)(1.0 / sum);
        for (int64_t j = 0; j <= last[r]; j++) sr[j] *= inv;
    }

    /* out = sum_j p_j v_j: each row's keys in order, into slot j mod `slots`, a key block at a time */
    memset(acc, 0, (size_t)nr * slots * D * sizeof *acc);
    for (int64_t j0 = 0; j0 <= last_max; j0 += block) {
        const int64_t j1 = j0 + block - 1 < last_max ? j0 + block - 1 : last_max;
        for (int r = 0; r < nr; r++) {
            const float *sr = s + (size_t)r * ss;
            float *ar = acc + (size_t)r * slots * D;
            const int64_t je = j1 < last[r] ? j1 : last[r];
#if GA_AVX512
            if (slots == 8 && D % 16 == 0) {
                if (je >= j0) pv8_512(ar, V, idx, sr, j0, je, D);
                continue;
            }
#endif
            for (int64_t j = j0; j <= je; j++) {
                const int64_t sl = idx ? idx[j] : j;
                accum_row(ar + (size_t)(j & (slots - 1)) * D, V + (size_t)sl * D, sr[j], D);
            }
        }
    }
    for (int r = 0; r < nr; r++) {
        float *out = a->out + ((size_t)(t0 + r) * a->n_head + h) * D;
        const float *ar = acc + (size_t)r * slots * D;
        if (last[r] < 0) { /* no visible key */
            memset(out, 0, (size_t)D * sizeof *out);
            continue;
        }
        for (int d = 0; d < D; d++) {
            if (slots == GA_SLOTS) {
                out[d] = gc_fold32(ar + d, (size_t)D); /* the dot product's fold */
                continue;
            }
            float b[8]; /* the GEMM's 8-lane sum */
            for (int l = 0; l < 8; l++) b[l] = ar[(size_t)l * D + d];
            out[d] = gc_sum8(b);
        }
    }
}

/* Units (token block, head) are dealt round-robin, so every thread gets early and late blocks of a causal chunk. */
static void units_job(void *arg, int ith, int nth) {
    ga_job *job = arg;
    const cpu_attn_args *a = job->a;
    char *mine = job->ws + (size_t)ith * job->tb;
    const int64_t ss = job->L_max + 8;
    float *s = (float *)mine;
    float *acc = (float *)(mine + ga_round((size_t)job->rows * (size_t)ss * sizeof(float)));
    for (long u = ith; u < job->n_units; u += nth) {
        const int64_t t0 = (u / a->n_head) * job->rows;
        const int nr = (int)(a->n_q - t0 < job->rows ? a->n_q - t0 : job->rows);
        one_unit(a, (int)(u % a->n_head), t0, nr, s, ss, acc);
    }
}

int cpu_attention_ggml(const cpu_attn_args *a, int64_t L_max, kvb_pool *pool) {
    const int nth = kvb_pool_size(pool);
    if (!a->ws || a->ws_bytes < cpu_attention_ggml_ws_bytes(a, L_max, nth)) return -1;
    const int rows = unit_rows(a, L_max);
    ga_job job = {a, (char *)ga_round((size_t)(uintptr_t)a->ws), thread_bytes(a, L_max), L_max, rows,
                  (long)((a->n_q + rows - 1) / rows) * a->n_head};
    kvb_pool_run(pool, units_job, &job);
    return 0;
}
