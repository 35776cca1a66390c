/* arch_ops.cu — the CUDA backend's ops of the newer architectures (kernels/backend.h: rope_ext, geglu, scale; CPU
 * reference kernels/cpu/arch_ops.c). attention_window is the attention kernels' own, with kvb_cuda_attn.window
 * (backend_cuda.cu, attn_split.cuh: key_hidden).
 *
 * Numerics: compiled like kvops.cu (no fast math, no contraction, IEEE division), so each op repeats the CPU's float
 * operations in the CPU's order:
 *  - rope_ext: what the CPU derives per pair (the freq factor, YaRN's ramp mix, the magnitude) is derived on the host
 *    by the same float code and passed by value; a thread builds its pair's angle as the CPU does (pos times
 *    theta_scale one multiplication at a time, divided by the factor, interpolated, mixed), takes sin and cos in
 *    double rounded to float (glibc's sinf and cosf are correctly rounded), scales them and rotates with the CPU's
 *    fma. Equal to the CPU up to an angle's last bit where the CPU build contracts (-march=native) what this file
 *    does not: an error of pos * 2^-23 rad at most, as the float angle itself carries.
 *  - geglu: ggml's f16 GELU table itself, built once on first use from the CPU's entry (cpu_gelu_f16 for each of the
 *    65536 f16 gates, the ones at and past +-10 included: a gate in (-10, -9.996) rounds to f16 -10 and reads
 *    gelu(-10), which the CPU's short-cut on the unrounded gate does not take) and uploaded; a thread rounds its
 *    gate to f16, looks it up and multiplies by up in float, with the CPU's |x| >= 10 short-cuts on the unrounded
 *    gate: the CPU's result bit for bit (the H200 run of 2026-11-26 found 12 of 70001 apart when the table was
 *    built through cpu_geglu, short-cuts and all).
 *  - scale: x * s in float. */
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/kvops.h"
extern "C" {
#include "kernels/cpu/arch_ops.h"
#include "kernels/dtype.h"
}

#define CK(call) cuda_kvops_check(o, (call), #call, __FILE__, __LINE__)
#define CK_LAUNCH(kernel) cuda_kvops_check(o, cudaGetLastError(), #kernel "<<<>>>", __FILE__, __LINE__)

enum { ROPE_PAIRS = 256, THREADS = 256 }; /* rotated dims up to 512 (head_dim 512) */

static cuda_kvops *OPS(kvb_backend *be) { return (cuda_kvops *)be->impl; }

/* A void op's failure that is no CUDA call's: kept in be->error like one (the first failure wins). */
static void op_fail(kvb_backend *be, const char *why) {
    if (!be->error[0]) snprintf(be->error, sizeof be->error, "cuda: %s", why);
}

static unsigned grid_for(int64_t n) {
    const int64_t b = (n + THREADS - 1) / THREADS;
    return (unsigned)(b < 1 ? 1 : b > 65535 * 16 ? 65535 * 16 : b);
}

/* ---- rope_ext ---- */

/* the call's constants, by value (2 KB of kernel parameters) */
struct rope_consts {
    float theta_scale, freq_scale, mscale;
    int yarn;                /* ext_factor != 0: th = interp (1 - mix) + extrap mix */
    float ff[ROPE_PAIRS];    /* the pairs' divisors (1 without rope_freqs) */
    float mix[ROPE_PAIRS];   /* YaRN's ramp times ext_factor */
};

static float yarn_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base) {
    return n_dims * logf(n_ctx_orig / (n_rot * 2 * (float)M_PI)) / (2 * logf(base));
}

/* blocks (head, token); a thread per pair */
__global__ void k_rope_ext(float *x, int n_head, int head_dim, int n_pairs, const int32_t *pos, int neox,
                           rope_consts rc) {
    const int64_t t = blockIdx.y;
    float *xh = x + (t * n_head + blockIdx.x) * (int64_t)head_dim;
    for (int i = threadIdx.x; i < n_pairs; i += blockDim.x) {
        float theta = (float)pos[t];
        for (int j = 0; j < i; j++) theta = __fmul_rn(theta, rc.theta_scale);
        const float extrap = __fdiv_rn(theta, rc.ff[i]);
        const float interp = __fmul_rn(rc.freq_scale, extrap);
        float th = interp;
        if (rc.yarn) th = __fadd_rn(__fmul_rn(interp, __fsub_rn(1.0f, rc.mix[i])), __fmul_rn(extrap, rc.mix[i]));
        double s, c;
        sincos((double)th, &s, &c);
        const float cs = __fmul_rn((float)c, rc.mscale), sn = __fmul_rn((float)s, rc.mscale);
        const int j0 = neox ? i : 2 * i, j1 = neox ? i + n_pairs : 2 * i + 1;
        const float x0 = xh[j0], x1 = xh[j1];
        xh[j0] = __fmaf_rn(x0, cs, -__fmul_rn(x1, sn));
        xh[j1] = __fmaf_rn(x0, sn, __fmul_rn(x1, cs));
    }
}

static void cu_rope_ext(kvb_backend *be, float *x, int64_t n_tok, int n_head, int head_dim, int n_rot,
                        const int32_t *pos, int neox, const kvb_rope_params *rp) {
    cuda_kvops *o = OPS(be);
    if (n_rot > head_dim) n_rot = head_dim; /* the CPU's clipping */
    n_rot &= ~1;
    if (n_rot <= 0 || n_head <= 0 || n_tok <= 0 || be->error[0]) return;
    const int n_pairs = n_rot / 2;
    if (n_pairs > ROPE_PAIRS || n_tok > 65535) {
        char why[96];
        snprintf(why, sizeof why, "rope_ext: %d rotated dims or %lld tokens (at most %d and 65535)", n_rot,
                 (long long)n_tok, 2 * ROPE_PAIRS);
        return op_fail(be, why);
    }
    /* the CPU's per-pair arithmetic (cpu_rope_scaled), once per call here */
    rope_consts rc;
    memset(&rc, 0, sizeof rc);
    rc.theta_scale = powf(rp->freq_base, -2.0f / (float)n_rot);
    rc.freq_scale = rp->freq_scale;
    rc.yarn = rp->ext_factor != 0.0f;
    rc.mscale = rp->attn_factor;
    float corr[2] = {0, 0};
    if (rc.yarn) {
        const float start = floorf(yarn_corr_dim(n_rot, rp->n_ctx_orig, rp->beta_fast, rp->freq_base));
        const float end = ceilf(yarn_corr_dim(n_rot, rp->n_ctx_orig, rp->beta_slow, rp->freq_base));
        corr[0] = start > 0 ? start : 0;
        corr[1] = end < (float)(n_rot - 1) ? end : (float)(n_rot - 1);
        rc.mscale *= 1.0f + 0.1f * logf(1.0f / rp->freq_scale);
    }
    for (int i = 0; i < n_pairs; i++) {
        rc.ff[i] = rp->freq_factors ? rp->freq_factors[i] : 1.0f;
        if (rc.yarn) {
            const float lo = corr[0], hi = corr[1];
            const float diff = hi - lo > 0.001f ? hi - lo : 0.001f;
            const float y = (float)(i - lo) / diff;
            const float ramp = 1 - (y < 0 ? 0 : y > 1 ? 1 : y);
            rc.mix[i] = ramp * rp->ext_factor;
        }
    }
    const dim3 grid((unsigned)n_head, (unsigned)n_tok);
    k_rope_ext<<<grid, 64, 0, o->stream>>>(x, n_head, head_dim, n_pairs, pos, neox, rc);
    CK_LAUNCH(k_rope_ext);
}

/* ---- geglu ---- */

__global__ void k_geglu(float *out, const float *gate, const float *up, const __half *table, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float x = gate[i];
        if (x <= -10.0f) out[i] = 0.0f;
        else if (x >= 10.0f) out[i] = __fmul_rn(x, up[i]);
        else out[i] = __fmul_rn(__half2float(table[__half_as_ushort(__float2half_rn(x))]), up[i]);
    }
}

/* ggml's GELU table (f16 in, f16 out) on the device, built by the CPU op on first use. NULL on failure. */
static const __half *gelu_table(cuda_kvops *o) {
    if (o->gelu_table) return (const __half *)o->gelu_table;
    enum { N = 65536 };
    kvb_f16 *tab = (kvb_f16 *)malloc(N * sizeof(kvb_f16));
    void *dev = NULL;
    if (tab) {
        for (int h = 0; h < N; h++) tab[h] = kvb_f32_to_f16(cpu_gelu_f16((kvb_f16)h)); /* exact: an f16 value */
        if (cuda_graph_flush(o) || CK(cudaMalloc(&dev, N * sizeof(kvb_f16))) ||
            CK(cudaMemcpyAsync(dev, tab, N * sizeof(kvb_f16), cudaMemcpyHostToDevice, o->stream)) ||
            CK(cudaStreamSynchronize(o->stream))) {
            cudaFree(dev);
            dev = NULL;
        }
    } else {
        op_fail(o->be, "geglu: out of host memory for the GELU table");
    }
    free(tab);
    o->gelu_table = dev;
    return (const __half *)dev;
}

static void cu_geglu(kvb_backend *be, float *out, const float *gate, const float *up, int64_t n) {
    cuda_kvops *o = OPS(be);
    if (n <= 0 || be->error[0]) return;
    const __half *table = gelu_table(o);
    if (!table) return;
    k_geglu<<<grid_for(n), THREADS, 0, o->stream>>>(out, gate, up, table, n);
    CK_LAUNCH(k_geglu);
}

/* ---- scale ---- */

__global__ void k_scale(float *x, float s, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] = __fmul_rn(x[i], s);
}

static void cu_scale(kvb_backend *be, float *x, float s, int64_t n) {
    cuda_kvops *o = OPS(be);
    if (n <= 0 || be->error[0]) return;
    k_scale<<<grid_for(n), THREADS, 0, o->stream>>>(x, s, n);
    CK_LAUNCH(k_scale);
}

void cuda_install_arch_ops(kvb_backend *be) {
    be->rope_ext = cu_rope_ext;
    be->geglu = cu_geglu;
    be->scale = cu_scale;
}
