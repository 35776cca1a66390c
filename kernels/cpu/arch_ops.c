/* arch_ops.c — the CPU ops of the newer architectures (issue 31): RoPE with scaling (Llama 3.1's per-pair
 * divisors, linear, YaRN), GeGLU (Gemma), a scale, and attention over a sliding window (Gemma 3's local
 * layers, Mistral).
 *
 * Each follows ggml's CPU float order, as ops.c does for the older ops, so the forward pass stays within
 * rounding of llama.cpp:
 *  - rope: ggml_rope_cache_init + rope_yarn (theta built by repeated float multiplication, divided by the pair's
 *    freq factor, interpolated by freq_scale and mixed back towards extrapolation by YaRN's ramp between the
 *    correction dims, cos and sin times the magnitude), the pair rotation as ops.c's;
 *  - geglu: ggml's GELU goes through its f16 table (GGML_GELU_FP16): x rounded to f16, gelu(x) in float rounded
 *    to f16, times up in float; |x| >= 10 short-cuts as ggml's. We build the same table once (65,536 floats) and
 *    gather from it 16 or 8 lanes at a time, so the op is a conversion, a gather and a multiply, not a tanhf;
 *  - windowed attention over an f32 cache without probabilities or lse (`--kv-type f32`, the mode that matches
 *    llama.cpp bit for bit): attention_ggml.c's per-row arithmetic (scores by gc_dot, softmax by gc_expf in
 *    groups of 8 summed in double, V accumulated in 8 or 32 slots) over the keys the window leaves visible.
 *    llama.cpp keeps a local layer's keys in a ring of cells, so the order in which it sums them differs from
 *    ours once the ring wraps: agreement there is within rounding, not bit for bit;
 *  - windowed attention otherwise (f16 KV, the default, or probs/lse asked for): attention.c's tiled online
 *    softmax with the window masked (cpu_attention_banded): a K/V block is widened once for the GQA group and a
 *    block of queries, and blocks outside every row's window are skipped, as cpu_attention's numerics are for
 *    the global layers (ggml's order is not kept there either: llama.cpp's f16 path rounds Q to f16). */
#include <pthread.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "kernels/cpu/arch_ops.h"
#include "kernels/cpu/ggml_compat.h"
#include "kernels/cpu/kvops.h"
#include "kernels/cpu/ops.h"

/* ---- rope ---- */

enum { ROPE_MAX_PAIRS = 512 };

static float yarn_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base) {
    return n_dims * logf(n_ctx_orig / (n_rot * 2 * (float)M_PI)) / (2 * logf(base));
}

void cpu_rope_scaled(float *x, int64_t n_tok, int n_head, int head_dim, int n_rot, const int32_t *pos, int neox,
                     const kvb_rope_params *rp) {
    if (n_rot > head_dim) n_rot = head_dim;
    n_rot &= ~1;
    if (n_rot <= 0 || n_head <= 0 || n_rot / 2 > ROPE_MAX_PAIRS) return;
    const int n_pairs = n_rot / 2;
    const float theta_scale = powf(rp->freq_base, -2.0f / (float)n_rot);
    float corr[2] = {0, 0};
    if (rp->ext_factor != 0.0f) {
        const float start = floorf(yarn_corr_dim(n_rot, rp->n_ctx_orig, rp->beta_fast, rp->freq_base));
        const float end = ceilf(yarn_corr_dim(n_rot, rp->n_ctx_orig, rp->beta_slow, rp->freq_base));
        corr[0] = start > 0 ? start : 0;
        corr[1] = end < (float)(n_rot - 1) ? end : (float)(n_rot - 1);
    }
    float cs[ROPE_MAX_PAIRS], sn[ROPE_MAX_PAIRS];
    for (int64_t t = 0; t < n_tok; t++) {
        float theta = (float)pos[t];
        for (int i = 0; i < n_pairs; i++) {
            const float ff = rp->freq_factors ? rp->freq_factors[i] : 1.0f;
            const float extrap = theta / ff;
            const float interp = rp->freq_scale * extrap;
            float th = interp, mscale = rp->attn_factor;
            if (rp->ext_factor != 0.0f) {
                const int i0 = 2 * i;
                const float lo = corr[0], hi = corr[1];
                const float diff = hi - lo > 0.001f ? hi - lo : 0.001f;
                const float y = (float)(i0 / 2 - lo) / diff;
                const float ramp = 1 - (y < 0 ? 0 : y > 1 ? 1 : y);
                const float mix = ramp * rp->ext_factor;
                th = interp * (1 - mix) + extrap * mix;
                mscale *= 1.0f + 0.1f * logf(1.0f / rp->freq_scale);
            }
            cs[i] = cosf(th) * mscale;
            sn[i] = sinf(th) * mscale;
            theta *= theta_scale;
        }
        float *xt = x + t * (int64_t)n_head * head_dim;
        for (int h = 0; h < n_head; h++) {
            float *xh = xt + (int64_t)h * head_dim;
            for (int i = 0; i < n_pairs; i++) {
                const int j0 = neox ? i : 2 * i, j1 = neox ? i + n_pairs : 2 * i + 1;
                const float x0 = xh[j0], x1 = xh[j1];
                xh[j0] = fmaf(x0, cs[i], -(x1 * sn[i])); /* ops.c's contraction, as llama.cpp's build */
                xh[j1] = fmaf(x0, sn[i], x1 * cs[i]);
            }
        }
    }
}

/* ---- geglu, scale ---- */

/* ggml_gelu_f32 as llama.cpp's x86 build computes it: ggml-cpu is compiled as GNU C with FMA, so GCC contracts
 * 1 + a*x*x into one fused multiply-add (we build as ISO C, which does not contract: the fma is written out).
 * Unfused, one of the table's 65,536 f16 entries comes out one f16 ulp apart, enough to move Gemma-3-270M's
 * logits by 0.45-0.82 on half of its llama.cpp fixture's prompts through the Q8 roundings of 18 layers. */
static float gelu_tanh(float x) {
    const float a = 0.044715f, s = 0.79788456080286535587989211986876f;
    return 0.5f * x * (1.0f + tanhf(s * x * fmaf(a * x, x, 1.0f)));
}

float cpu_gelu_f16(kvb_f16 h) { return kvb_f16_to_f32(kvb_f32_to_f16(gelu_tanh(kvb_f16_to_f32(h)))); }

/* cpu_gelu_f16 of every f16 bit pattern, built once (ggml builds its table at ggml_init) */
static float gelu_table[1 << 16];
static pthread_once_t gelu_table_once = PTHREAD_ONCE_INIT;

static void gelu_table_build(void) {
    for (uint32_t h = 0; h < (1u << 16); h++) gelu_table[h] = cpu_gelu_f16((kvb_f16)h);
}

static inline float geglu_one(float x, float u) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x * u;
    return gelu_table[kvb_f32_to_f16(x)] * u;
}

void cpu_geglu(float *out, const float *gate, const float *up, int64_t n) {
    pthread_once(&gelu_table_once, gelu_table_build);
    int64_t i = 0;
#if defined(__AVX512F__)
    const __m512 lo = _mm512_set1_ps(-10.0f), hi = _mm512_set1_ps(10.0f);
    for (; i + 16 <= n; i += 16) {
        const __m512 x = _mm512_loadu_ps(gate + i), u = _mm512_loadu_ps(up + i);
        const __m512i h = _mm512_cvtepu16_epi32(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        __m512 g = _mm512_i32gather_ps(h, gelu_table, 4);
        g = _mm512_mul_ps(_mm512_mask_mov_ps(g, _mm512_cmp_ps_mask(x, hi, _CMP_GE_OQ), x), u); /* x >= 10: x u */
        g = _mm512_mask_mov_ps(g, _mm512_cmp_ps_mask(x, lo, _CMP_LE_OQ), _mm512_setzero_ps()); /* x <= -10: +0 */
        _mm512_storeu_ps(out + i, g);
    }
#elif defined(__AVX2__) && defined(__F16C__)
    const __m256 lo = _mm256_set1_ps(-10.0f), hi = _mm256_set1_ps(10.0f);
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(gate + i), u = _mm256_loadu_ps(up + i);
        const __m256i h = _mm256_cvtepu16_epi32(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        __m256 g = _mm256_i32gather_ps(gelu_table, h, 4);
        g = _mm256_mul_ps(_mm256_blendv_ps(g, x, _mm256_cmp_ps(x, hi, _CMP_GE_OQ)), u);
        g = _mm256_blendv_ps(g, _mm256_setzero_ps(), _mm256_cmp_ps(x, lo, _CMP_LE_OQ)); /* +0, not 0 x up */
        _mm256_storeu_ps(out + i, g);
    }
#endif
    for (; i < n; i++) out[i] = geglu_one(gate[i], up[i]);
}

void cpu_scale(float *x, float s, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

/* ---- attention over a sliding window ---- */

enum { WA_SLOTS = 32 };

typedef struct {
    const kvb_attn_args *a;
    const unsigned char *sorted; /* per KV head: 1 when its list's positions ascend (binary search for the window) */
    float *ws;
    int64_t per_thread; /* floats of scratch per thread */
} wa_job;

/* position of list entry j of KV head g */
static inline int32_t wa_pos(const kvb_attn_args *a, int g, int64_t j) {
    const int32_t *idx = a->idx && a->idx[g] ? a->idx[g] : NULL;
    return a->k_pos[g][idx ? idx[j] : j];
}

static inline int64_t wa_len(const kvb_attn_args *a, int g) {
    return a->idx && a->idx[g] ? a->n_idx[g] : a->n_kv[g];
}

/* the row r of K or V head g as floats (f16 rows converted into tmp) */
static inline const float *wa_row(const kvb_attn_args *a, const void *base, int64_t slot, float *tmp) {
    const int D = a->head_dim;
    if (a->kv_dtype == KVB_F32) return (const float *)base + (size_t)slot * D;
    const kvb_f16 *h = (const kvb_f16 *)base + (size_t)slot * D;
    for (int d = 0; d < D; d++) tmp[d] = kvb_f16_to_f32(h[d]);
    return tmp;
}

static void wa_row_job(const wa_job *job, int64_t t, int h, float *s, float *acc, float *tmp) {
    const kvb_attn_args *a = job->a;
    const int D = a->head_dim, G = a->n_head / a->n_head_kv, g = h / G;
    const float *q = a->q + ((size_t)t * a->n_head + h) * D;
    float *out = a->out + ((size_t)t * a->n_head + h) * D;
    const int32_t *idx = a->idx && a->idx[g] ? a->idx[g] : NULL;
    const int64_t n = wa_len(a, g);
    const int masked = a->q_pos != NULL;
    const int32_t qp = masked ? a->q_pos[t] : INT32_MAX;
    const int64_t lo_pos = masked ? (int64_t)qp - a->window : INT64_MIN; /* visible iff lo_pos < pos <= qp */
    float *pr = a->probs ? a->probs + ((size_t)h * a->n_q + t) * a->probs_stride : NULL;
    if (pr)
        for (int64_t j = 0; j < n; j++) pr[j] = 0.0f;

    int64_t first = 0, last = n - 1;
    if (masked && job->sorted[g]) { /* binary searches over ascending positions */
        int64_t l = 0, r = n;
        while (l < r) {
            int64_t m = l + (r - l) / 2;
            if (wa_pos(a, g, m) <= lo_pos) l = m + 1; else r = m;
        }
        first = l;
        l = first, r = n;
        while (l < r) {
            int64_t m = l + (r - l) / 2;
            if (wa_pos(a, g, m) <= qp) l = m + 1; else r = m;
        }
        last = l - 1;
    } else if (masked) {
        while (last >= 0 && (wa_pos(a, g, last) > qp || wa_pos(a, g, last) <= lo_pos)) last--;
        while (first <= last && (wa_pos(a, g, first) > qp || wa_pos(a, g, first) <= lo_pos)) first++;
    }
    if (last < first) {
        memset(out, 0, (size_t)D * sizeof *out);
        if (a->lse) a->lse[(size_t)h * a->n_q + t] = -INFINITY;
        return;
    }
    /* scores from the group of 8 that holds `first` on, indexed by list entry as llama.cpp's cache row is (its
     * softmax sums groups of 8 cells, its V product takes slots by cell index; masked keys add exact zeros) */
    const int64_t base = first & ~(int64_t)7, len = last - base + 1;
    float mx = -INFINITY;
    for (int64_t j = 0; j < len; j++) {
        const int64_t sl = idx ? idx[base + j] : base + j;
        const int32_t kp = masked ? a->k_pos[g][sl] : 0;
        if (base + j < first || (masked && (kp > qp || kp <= lo_pos))) {
            s[j] = -INFINITY;
            continue;
        }
        s[j] = gc_dot(wa_row(a, a->k[g], sl, tmp), q, D) * a->scale;
        if (s[j] > mx) mx = s[j];
    }
    const int64_t n_pad = (len + 7) & ~(int64_t)7;
    for (int64_t j = len; j < n_pad; j++) s[j] = -INFINITY;
    double sum = 0.0;
    for (int64_t j = 0; j < n_pad; j += 8) {
        for (int l = 0; l < 8; l++) s[j + l] = gc_expf(s[j + l] - mx);
        sum += (double)gc_sum8(s + j);
    }
    const float inv = (float)(1.0 / sum);
    for (int64_t j = 0; j < len; j++) s[j] *= inv;
    if (pr)
        for (int64_t j = 0; j < len; j++) pr[base + j] = s[j];
    if (a->lse) a->lse[(size_t)h * a->n_q + t] = mx + (float)log(sum);

    const int slots = a->n_q >= 2 ? 8 : WA_SLOTS;
    memset(acc, 0, (size_t)slots * D * sizeof *acc);
    for (int64_t j = 0; j < len; j++) {
        if (base + j < first) continue; /* before the window: adds exact zeros */
        const int64_t sl = idx ? idx[base + j] : base + j;
        const float *v = wa_row(a, a->v[g], sl, tmp);
        float *ac = acc + (size_t)((base + j) & (slots - 1)) * D;
        for (int d = 0; d < D; d++) ac[d] = fmaf(v[d], s[j], ac[d]);
    }
    for (int d = 0; d < D; d++) {
        if (slots == WA_SLOTS) {
            out[d] = gc_fold32(acc + d, (size_t)D);
            continue;
        }
        float b[8];
        for (int l = 0; l < 8; l++) b[l] = acc[(size_t)l * D + d];
        out[d] = gc_sum8(b);
    }
}

static void wa_rows(void *arg, int ith, int nth) {
    wa_job *job = arg;
    const kvb_attn_args *a = job->a;
    float *mine = job->ws + (size_t)ith * job->per_thread;
    float *acc = mine, *tmp = acc + (size_t)WA_SLOTS * a->head_dim, *s = tmp + a->head_dim;
    long lo, hi;
    kvb_split((long)(a->n_q * a->n_head), ith, nth, &lo, &hi);
    for (long r = lo; r < hi; r++) wa_row_job(job, r / a->n_head, (int)(r % a->n_head), s, acc, tmp);
}

int cpu_attention_window(const kvb_attn_args *a, kvb_pool *pool, char *err, size_t err_len) {
    if (!a || !a->q || !a->out || !a->k || !a->v || !a->n_kv || a->n_head <= 0 || a->n_head_kv <= 0 ||
        a->n_head % a->n_head_kv || a->head_dim <= 0)
        return kvb_errf(err, err_len, "attention_window: bad arguments");
    if (a->window <= 0) return kvb_errf(err, err_len, "attention_window: window %d is not positive", a->window);
    if (a->q_pos && !a->k_pos) return kvb_errf(err, err_len, "attention_window: q_pos given without k_pos");
    if (a->kv_dtype != KVB_F32 && a->kv_dtype != KVB_F16)
        return kvb_errf(err, err_len, "attention_window: kv_dtype must be f32 or f16");
    if (a->n_q == 0) return 0;
    int64_t longest = 0;
    unsigned char sorted[KVB_MAX_KV_HEADS];
    if (a->n_head_kv > KVB_MAX_KV_HEADS) return kvb_errf(err, err_len, "attention_window: too many KV heads");
    for (int g = 0; g < a->n_head_kv; g++) {
        const int64_t n = wa_len(a, g);
        if (n > longest) longest = n;
        sorted[g] = 1;
        for (int64_t j = 1; a->q_pos && j < n && sorted[g]; j++) sorted[g] = wa_pos(a, g, j - 1) <= wa_pos(a, g, j);
    }
    if (a->probs && a->probs_stride < longest)
        return kvb_errf(err, err_len, "attention_window: probs_stride %lld < longest key list %lld",
                        (long long)a->probs_stride, (long long)longest);
    const int nth = kvb_pool_size(pool);
    if (a->kv_dtype != KVB_F32 || a->probs || a->lse) { /* the tiled path (header comment) */
        kvb_attn_args b = *a;
        b.ws_bytes = cpu_attention_banded_ws_bytes(a, nth);
        if (!b.ws_bytes) return kvb_errf(err, err_len, "attention_window: bad shapes or size overflow");
        b.ws = malloc(b.ws_bytes);
        if (!b.ws) return kvb_errf(err, err_len, "attention_window: out of memory for %zu bytes", b.ws_bytes);
        const int rc = cpu_attention_banded(&b, pool, err, err_len);
        free(b.ws);
        return rc;
    }
    const int64_t per_thread = (int64_t)(WA_SLOTS + 1) * a->head_dim + longest + 16;
    float *ws = malloc((size_t)nth * (size_t)per_thread * sizeof(float));
    if (!ws) return kvb_errf(err, err_len, "attention_window: out of memory for %lld keys", (long long)longest);
    wa_job job = {a, sorted, ws, per_thread};
    kvb_pool_run(pool, wa_rows, &job);
    free(ws);
    return 0;
}

/* ---- the backend table's entries ---- */

static void be_rope_ext(kvb_backend *be, float *x, int64_t n_tok, int n_head, int head_dim, int n_rot,
                        const int32_t *pos, int neox, const kvb_rope_params *rp) {
    (void)be;
    cpu_rope_scaled(x, n_tok, n_head, head_dim, n_rot, pos, neox, rp);
}

static void be_geglu(kvb_backend *be, float *out, const float *gate, const float *up, int64_t n) {
    (void)be;
    cpu_geglu(out, gate, up, n);
}

static void be_scale(kvb_backend *be, float *x, float s, int64_t n) {
    (void)be;
    cpu_scale(x, s, n);
}

static int be_attention_window(kvb_backend *be, const kvb_attn_args *a, char *err, size_t err_len) {
    return cpu_attention_window(a, cpu_backend_pool(be), err, err_len);
}

void cpu_install_arch_ops(kvb_backend *be) {
    be->rope_ext = be_rope_ext;
    be->geglu = be_geglu;
    be->scale = be_scale;
    be->attention_window = be_attention_window;
}
