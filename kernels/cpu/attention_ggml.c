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
 * Rows are split evenly over the pool threads; each row's arithmetic is independent of the split. The
 * vector loops run along head_dim, so any head_dim works; AVX2 where compiled for it, the same
 * roundings in scalar code otherwise. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/ggml_compat.h"
#include "kernels/cpu/ops.h"

enum { GA_ALIGN = 64, GA_SLOTS = 32 };

static size_t ga_round(size_t x) { return (x + GA_ALIGN - 1) / GA_ALIGN * GA_ALIGN; }

/* per-thread scratch: scores for the longest list (+ a group of padding), 32 accumulator rows of head_dim */
static size_t thread_bytes(const cpu_attn_args *a, int64_t L_max) {
    return ga_round((size_t)(L_max + 8) * sizeof(float)) + ga_round((size_t)GA_SLOTS * a->head_dim * sizeof(float));
}

size_t cpu_attention_ggml_ws_bytes(const cpu_attn_args *a, int64_t L_max, int n_threads) {
    if (n_threads < 1) n_threads = 1;
    return GA_ALIGN + (size_t)n_threads * thread_bytes(a, L_max);
}

typedef struct {
    const cpu_attn_args *a;
    char *ws;
    size_t tb;
} ga_job;

/* acc[lane][d] += p * v[d]: one fused multiply-add chain per (lane, d) */
static inline void accum_row(float *acc, const float *v, float p, int D) {
    int d = 0;
#if GC_AVX2
    const __m256 vp = _mm256_set1_ps(p);
    for (; d + 8 <= D; d += 8)
        _mm256_storeu_ps(acc + d, _mm256_fmadd_ps(_mm256_loadu_ps(v + d), vp, _mm256_loadu_ps(acc + d)));
#endif
    for (; d < D; d++) acc[d] = fmaf(v[d], p, acc[d]);
}

static void one_row(const cpu_attn_args *a, int64_t t, int h, float *s, float *acc) {
    const int D = a->head_dim, G = a->n_head / a->n_head_kv, g = h / G;
    const float *q = a->q + ((size_t)t * a->n_head + h) * D;
    float *out = a->out + ((size_t)t * a->n_head + h) * D;
    const int32_t *idx = (a->idx && a->idx[g]) ? a->idx[g] : NULL;
    const int64_t n = idx ? a->n_idx[g] : a->n_kv[g];
    const float *K = a->k[g], *V = a->v[g];
    const int32_t *kp = a->k_pos ? a->k_pos[g] : NULL;
    const int masked = a->q_pos != NULL;
    const int32_t qp = masked ? a->q_pos[t] : 0;

    int64_t last = n - 1;
    if (masked)
        while (last >= 0 && kp[idx ? idx[last] : last] > qp) last--;
    if (last < 0) {
        memset(out, 0, (size_t)D * sizeof *out);
        return;
    }
    float mx = -INFINITY;
    for (int64_t j = 0; j <= last; j++) {
        const int64_t sl = idx ? idx[j] : j;
        if (masked && kp[sl] > qp) {
            s[j] = -INFINITY;
            continue;
        }
        s[j] = gc_dot(K + (size_t)sl * D, q, D) * a->scale;
        if (s[j] > mx) mx = s[j];
    }
    const int64_t n_pad = (last + 8) & ~(int64_t)7;
    for (int64_t j = last + 1; j < n_pad; j++) s[j] = -INFINITY;
    double sum = 0.0;
    for (int64_t j = 0; j < n_pad; j += 8) {
#if GC_AVX2
        const __m256 e = gc_expf8(_mm256_sub_ps(_mm256_loadu_ps(s + j), _mm256_set1_ps(mx)));
        _mm256_storeu_ps(s + j, e);
        sum += (double)gc_sum8v(e);
#else
        for (int l = 0; l < 8; l++) s[j + l] = gc_expf(s[j + l] - mx);
        sum += (double)gc_sum8(s + j);
#endif
    }
    const float inv = (float)(1.0 / sum);
    for (int64_t j = 0; j <= last; j++) s[j] *= inv;

    const int slots = a->n_q >= 2 ? 8 : GA_SLOTS;
    memset(acc, 0, (size_t)slots * D * sizeof *acc);
    for (int64_t j = 0; j <= last; j++) {
        const int64_t sl = idx ? idx[j] : j;
        accum_row(acc + (size_t)(j & (slots - 1)) * D, V + (size_t)sl * D, s[j], D);
    }
    for (int d = 0; d < D; d++) {
        if (slots == GA_SLOTS) {
            out[d] = gc_fold32(acc + d, (size_t)D); /* the dot product's fold */
            continue;
        }
        float b[8]; /* the GEMM's 8-lane sum */
        for (int l = 0; l < 8; l++) b[l] = acc[(size_t)l * D + d];
        out[d] = gc_sum8(b);
    }
}

static void rows_job(void *arg, int ith, int nth) {
    ga_job *job = arg;
    const cpu_attn_args *a = job->a;
    char *mine = job->ws + (size_t)ith * job->tb;
    float *s = (float *)mine;
    float *acc = (float *)(mine + job->tb - ga_round((size_t)GA_SLOTS * a->head_dim * sizeof(float)));
    long lo, hi;
    kvb_split((long)(a->n_q * a->n_head), ith, nth, &lo, &hi);
    for (long r = lo; r < hi; r++) one_row(a, r / a->n_head, (int)(r % a->n_head), s, acc);
}

int cpu_attention_ggml(const cpu_attn_args *a, int64_t L_max, kvb_pool *pool) {
    const int nth = kvb_pool_size(pool);
    if (!a->ws || a->ws_bytes < cpu_attention_ggml_ws_bytes(a, L_max, nth)) return -1;
    ga_job job = {a, (char *)ga_round((size_t)(uintptr_t)a->ws), thread_bytes(a, L_max)};
    kvb_pool_run(pool, rows_job, &job);
    return 0;
}
