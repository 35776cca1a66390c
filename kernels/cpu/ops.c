/* ops.c — elementwise and row kernels: rmsnorm, rope, swiglu, add, softmax.
 * Attention lives in attention.c. rmsnorm, rope and swiglu take llama.cpp's CPU float order exactly
 * (ggml_compat.h says why that matters), so the forward pass matches it bit for bit. */
#include "kernels/cpu/ops.h"

#include <math.h>
#include <string.h>

#include "kernels/cpu/ggml_compat.h"
#include "kernels/cpu/ops_vec.h"

/* sum_i (double)(x[i]*x[i]) in index order: each square rounds to float and is added in double, as ggml does
 * (a vectorised double sum rounds differently now and then, which a Q8 activation can turn into a flip) */
static double sum_squares_f64(const float *x, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)(x[i] * x[i]);
    return s;
}

void cpu_rmsnorm(float *out, const float *x, const float *w, int64_t n, int64_t n_rows, float eps) {
    if (n <= 0) return;
    for (int64_t r = 0; r < n_rows; r++) {
        const float *xr = x + r * n;
        float *yr = out + r * n;
        /* ggml narrows the mean to float before adding eps, and takes sqrtf; keep that order */
        const float mean = (float)(sum_squares_f64(xr, n) / (double)n);
        const float scale = 1.0f / sqrtf(mean + eps);
        const vf vs = vf_set1(scale);
        int64_t i = 0;
        for (; i + VF_LANES <= n; i += VF_LANES) vf_store(yr + i, vf_mul(vf_mul(vf_load(xr + i), vs), vf_load(w + i)));
        for (; i < n; i++) yr[i] = xr[i] * scale * w[i];
    }
}

enum { ROPE_MAX_PAIRS = 256 };

/* rotate pairs p0 .. p0+np-1 of one head by the angles whose cos/sin are cs[i], sn[i] */
static void rope_pairs(float *xh, int n_pairs, int neox, int p0, int np, const float *cs, const float *sn) {
    for (int i = 0; i < np; i++) {
        const int j0 = neox ? p0 + i : 2 * (p0 + i), j1 = neox ? p0 + i + n_pairs : 2 * (p0 + i) + 1;
        const float x0 = xh[j0], x1 = xh[j1];
        /* llama.cpp's build contracts both into fused multiply-adds whose fused product has x0 (its vector
         * loop reads x0 against the interleaved cos/sin cache); the other product rounds first */
        xh[j0] = fmaf(x0, cs[i], -(x1 * sn[i]));
        xh[j1] = fmaf(x0, sn[i], x1 * cs[i]);
    }
}

void cpu_rope_ext(float *x, int64_t n_tok, int n_head, int head_dim, int n_rot, const int32_t *pos, float freq_base,
                  int neox, const float *freq_factors) {
    if (n_rot > head_dim) n_rot = head_dim;
    n_rot &= ~1;
    if (n_rot <= 0 || n_head <= 0) return;
    const int n_pairs = n_rot / 2;
    const float theta_scale = powf(freq_base, -2.0f / (float)n_rot);
    float cs[ROPE_MAX_PAIRS], sn[ROPE_MAX_PAIRS];
    for (int64_t t = 0; t < n_tok; t++) {
        float *xt = x + t * (int64_t)n_head * head_dim;
        /* theta_i = pos * theta_scale^i built by repeated float multiplication, exactly as ggml's
         * rope cache does (powf per i would round differently at large positions); the cos/sin
         * table is per token, shared by its heads, and chunked only for very large heads */
        float theta = (float)pos[t];
        for (int p0 = 0; p0 < n_pairs; p0 += ROPE_MAX_PAIRS) {
            const int np = n_pairs - p0 < ROPE_MAX_PAIRS ? n_pairs - p0 : ROPE_MAX_PAIRS;
            for (int i = 0; i < np; i++) {
                const float th = freq_factors ? theta / freq_factors[p0 + i] : theta;
                cs[i] = cosf(th);
                sn[i] = sinf(th);
                theta *= theta_scale;
            }
            for (int h = 0; h < n_head; h++) rope_pairs(xt + (int64_t)h * head_dim, n_pairs, neox, p0, np, cs, sn);
        }
    }
}

void cpu_rope(float *x, int64_t n_tok, int n_head, int head_dim, int n_rot, const int32_t *pos, float freq_base,
              int neox) {
    cpu_rope_ext(x, n_tok, n_head, head_dim, n_rot, pos, freq_base, neox, NULL);
}

void cpu_swiglu(float *out, const float *gate, const float *up, int64_t n) {
    /* silu(g) = g / (1 + exp(-g)) with ggml's vector exp on 8 lanes and libm's expf on the tail, like
     * llama.cpp's swiglu (ggml_compat.h) */
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
#if GC_AVX2
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 e = gc_expf8(_mm256_sub_ps(_mm256_setzero_ps(), g));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)),
                                                _mm256_loadu_ps(up + i)));
#else
        for (int l = 0; l < 8; l++) {
            const float g = gate[i + l];
            out[i + l] = g / (1.0f + gc_expf(0.0f - g)) * up[i + l];
        }
#endif
    }
    for (; i < n; i++) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

void cpu_add(float *out, const float *a, const float *b, int64_t n) {
    int64_t i = 0;
    for (; i + VF_LANES <= n; i += VF_LANES) vf_store(out + i, vf_add(vf_load(a + i), vf_load(b + i)));
    for (; i < n; i++) out[i] = a[i] + b[i];
}

void cpu_softmax(float *x, int64_t n) {
    if (n <= 0) return;
    float mx = -INFINITY;
    int64_t i = 0;
    if (n >= VF_LANES) {
        vf m = vf_set1(-INFINITY);
        for (; i + VF_LANES <= n; i += VF_LANES) m = vf_max(m, vf_load(x + i));
        mx = vf_hmax(m);
    }
    for (; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    if (mx == -INFINITY) { /* nothing visible: define the distribution as all zero, not NaN */
        memset(x, 0, (size_t)n * sizeof *x);
        return;
    }
    /* exp per vector, each vector's sum added in double, as ggml's vec soft_max does */
    double sum = 0.0;
    const vf vm = vf_set1(mx);
    for (i = 0; i + VF_LANES <= n; i += VF_LANES) {
        vf e = vf_exp(vf_sub(vf_load(x + i), vm));
        vf_store(x + i, e);
        sum += (double)vf_hsum(e);
    }
    for (; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += (double)x[i];
    }
    const float inv = (float)(1.0 / sum);
    const vf vi = vf_set1(inv);
    for (i = 0; i + VF_LANES <= n; i += VF_LANES) vf_store(x + i, vf_mul(vf_load(x + i), vi));
    for (; i < n; i++) x[i] *= inv;
}

