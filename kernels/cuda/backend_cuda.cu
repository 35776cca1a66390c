/* backend_cuda.cu — the CUDA implementation of the backend op table (kernels/backend.h).
 *
 * Weights: every matrix is converted to f16 on first use (from any GGUF type, dequantized on the host) and
 * kept on the device for the backend's lifetime; f32 vectors (norms, biases) are copied likewise. Decode
 * matrix-vector products use a bandwidth-bound f16 GEMV; prefill uses cuBLAS (tensor cores, f16 inputs,
 * f32 accumulate and output).
 *
 * Memory (backend.h, "data ops"): the device tier is plain device memory (cudaMalloc), which host code never
 * touches; the host tier is pinned host memory (cudaMallocHost). Op arguments are device memory unless the
 * header says host (get_rows' ids, the attention's per-head pointer arrays and counts, weights and model
 * vectors), so no op asks the driver what a pointer is. KV rows are written by a kernel (kv_writer).
 *
 * Streams: ops enqueue on the compute stream; sync() waits for it. The allocator's copies between tiers run on
 * a copy stream, ordered by events after the compute stream's earlier work and before its later work (the
 * data ops' copies, kvops.cu, and the few bytes an op stages itself, token ids and the attention's pointer
 * block, stay on the compute stream). Every CUDA call
 * and kernel launch is checked (CK, CK_LAUNCH): the first failure is kept in be->error as one line,
 * "cuda: FILE:LINE: CALL: reason", the op that met it fails, and every later int-returning op and sync
 * fails with it, so a broken device gives an error instead of wrong numbers (and never exits the process). */
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "kernels/backend.h"
#include "kernels/cpu/ops.h"
/* kernels/cpu/quant.h (its _Static_asserts are C only) */
void quant_dequant_row(ggml_type t, const void *src, float *dst, int64_t n);
}
#include "kernels/cuda/attention.h"
#include "kernels/cuda/candidate.h"
#include "kernels/cuda/flashinfer.h"
#include "kernels/cuda/kvops.h"
#include "kernels/cuda/narrow.h"

/* CK(call): 0, or -1 with the failure recorded in the backend (needs `im` in scope). CK_LAUNCH(kernel): the
 * same for the launch just made (bad grid or shared memory; faults inside a kernel surface at the next sync). */
#define CK(call) ck(im, (call), #call, __FILE__, __LINE__)
#define CK_LAUNCH(kernel) ck(im, cudaGetLastError(), #kernel "<<<>>>", __FILE__, __LINE__)

/* ---- weight cache: host pointer -> device copy ---- */

typedef struct {
    const void *host;
    void *dev;
    size_t bytes;
    uint64_t print; /* fingerprint of the host bytes: a reused address (a model freed, another mapped) re-uploads */
} wentry;

enum { RING = 32, PARAM_WORDS = 6 * KVB_MAX_KV_HEADS };

typedef struct {
    uintptr_t lo, hi; /* [lo, hi): one device-tier block */
} dev_span;

typedef struct {
    cuda_kvops ops;  /* the data ops' state (kvops.cu); first: an op finds it at be->impl */
    kvb_backend *be; /* whose error[] keeps the first failure */
    int device;
    cudaStream_t stream;
    cublasHandle_t blas;
    kvb_allocator alloc;
    wentry *w;          /* open addressing by host pointer */
    size_t w_cap, w_n;
    size_t weight_bytes; /* device bytes of converted weights */
    /* scratch, grown on demand */
    void *scratch; size_t scratch_bytes;   /* f16 activations for cuBLAS */
    void *attn_ws; size_t attn_ws_bytes;
    /* get_rows' token ids: pinned host staging (refilled once the copy reading it is done) and their device copy */
    int32_t *ids_host; size_t ids_host_bytes;
    cudaEvent_t ids_read;
    void *ids; size_t ids_bytes;
    /* ring of per-call attention parameter blocks (pinned host + device), reused after their event */
    uint64_t *param_host[RING];
    uint64_t *param_dev[RING];
    cudaEvent_t param_ev[RING];
    int param_next;
    /* copies between tiers: their stream, and the events that order it against the compute stream */
    cudaStream_t copy_stream;
    cudaEvent_t compute_mark, copy_mark;
    /* the device-tier blocks handed out, by address: a copy's direction without asking the driver */
    pthread_mutex_t dev_mu;
    dev_span *dev;
    size_t n_dev, cap_dev;
} cuda_impl;
static_assert(offsetof(cuda_impl, ops) == 0, "kvops.cu finds its state at be->impl");

static cuda_impl *IM(kvb_backend *be) { return (cuda_impl *)be->impl; }

/* One backend per process, shared by every context (weights are uploaded once): created on first use and
 * kept until the process exits (the driver releases its memory then). */
static kvb_backend *g_backend;
static int g_refs;

/* Record a failure (the first one wins: later ones are usually its consequences). */
static int fail(cuda_impl *im, const char *file, int line, const char *what, const char *why) {
    const char *base = strrchr(file, '/');
    if (!im->be->error[0])
        snprintf(im->be->error, sizeof im->be->error, "cuda: %s:%d: %s: %s", base ? base + 1 : file, line, what, why);
    return -1;
}

static int ck(cuda_impl *im, cudaError_t e, const char *call, const char *file, int line) {
    return e == cudaSuccess ? 0 : fail(im, file, line, call, cudaGetErrorString(e));
}

/* An int-returning op's answer once the backend has failed. */
static int failed(cuda_impl *im, char *err, size_t err_len) {
    snprintf(err, err_len, "%s", im->be->error);
    return -1;
}

/* A launch whose grid.y is a token count: at most 65535 (the grid's limit), else the backend's error names the op
 * and the way out, as a launch failure would not. */
static int tokens_fit(cuda_impl *im, int64_t n_tok, const char *op) {
    if (n_tok <= 65535) return 1;
    char why[128];
    snprintf(why, sizeof why, "%lld tokens in one call (at most 65535): a smaller --batch", (long long)n_tok);
    fail(im, __FILE__, __LINE__, op, why);
    return 0;
}

/* A decode step's recording (graph.cu) ends and runs: the host is about to wait, free, or upload synchronously. */
static int flush(cuda_impl *im) { return cuda_graph_flush(&im->ops); }

static int grow_dev(cuda_impl *im, void **p, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t want = need + need / 4 + (1 << 20);
    if (cuda_kvops_wait(&im->ops) || (*p && CK(cudaFree(*p)))) return -1;
    *p = NULL;
    *cap = 0;
    if (CK(cudaMalloc(p, want))) return -1;
    *cap = want;
    return 0;
}

static size_t hash_ptr(const void *p, size_t cap) {
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33;
    return (size_t)x & (cap - 1);
}

static uint64_t fingerprint(const void *host, size_t bytes, uint64_t shape) {
    const uint8_t *p = (const uint8_t *)host;
    uint64_t h = 1469598103934665603ull ^ shape;
    size_t n = bytes < 64 ? bytes : 64;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    for (size_t i = bytes - n; i < bytes; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static wentry *w_find(cuda_impl *im, const void *host) {
    if (!im->w_cap) return NULL;
    for (size_t i = hash_ptr(host, im->w_cap);; i = (i + 1) & (im->w_cap - 1)) {
        if (im->w[i].host == host) return &im->w[i];
        if (!im->w[i].host) return NULL;
    }
}

static wentry *w_insert(cuda_impl *im, const void *host, void *dev, size_t bytes) {
    if ((im->w_n + 1) * 2 > im->w_cap) {
        size_t cap = im->w_cap ? im->w_cap * 2 : 1024;
        wentry *nw = (wentry *)calloc(cap, sizeof *nw);
        if (!nw) return fail(im, __FILE__, __LINE__, "calloc", "out of memory for the weight table"), (wentry *)NULL;
        for (size_t i = 0; i < im->w_cap; i++)
            if (im->w[i].host) {
                size_t j = hash_ptr(im->w[i].host, cap);
                while (nw[j].host) j = (j + 1) & (cap - 1);
                nw[j] = im->w[i];
            }
        free(im->w);
        im->w = nw;
        im->w_cap = cap;
    }
    size_t j = hash_ptr(host, im->w_cap);
    while (im->w[j].host) j = (j + 1) & (im->w_cap - 1);
    im->w[j].host = host;
    im->w[j].dev = dev;
    im->w[j].bytes = bytes;
    im->w_n++;
    im->weight_bytes += bytes;
    return &im->w[j];
}

/* Record a fresh device copy: replaces e's (same address, other contents) or adds an entry. NULL on failure. */
static void *w_store(cuda_impl *im, wentry *e, const void *host, void *dev, size_t bytes, uint64_t print) {
    if (e) {
        if (cuda_kvops_wait(&im->ops) || CK(cudaFree(e->dev))) return NULL;
        im->weight_bytes += bytes - e->bytes;
        e->dev = dev;
        e->bytes = bytes;
    } else if (!(e = w_insert(im, host, dev, bytes))) {
        cudaFree(dev);
        return NULL;
    }
    e->print = print;
    return e->dev;
}

__global__ void k_f32_to_f16(__half *dst, const float *src, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i < n; i += (int64_t)gridDim.x * blockDim.x) dst[i] = __float2half_rn(src[i]);
}

static unsigned blocks_for(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b > 65535 * 16 ? 65535 * 16 : b);
}

/* The device f16 copy of a weight matrix [rows][cols], converted on first use. NULL on failure. */
static const __half *weight_f16(cuda_impl *im, const kvb_weight *w) {
    const size_t host_bytes = (size_t)ggml_row_bytes(w->type, (uint64_t)w->cols) * (size_t)w->rows;
    const uint64_t print = fingerprint(w->data, host_bytes, ((uint64_t)w->rows << 40) ^ ((uint64_t)w->cols << 8) ^ w->type);
    wentry *e = w_find(im, w->data);
    if (e && e->print == print) return (const __half *)e->dev;
    size_t n = (size_t)w->rows * (size_t)w->cols, bytes = n * sizeof(__half);
    void *dev = NULL;
    if (flush(im) || CK(cudaMalloc(&dev, bytes))) return NULL; /* the upload waits for the stream */
    int rc = 0;
    if (w->type == GGML_T_F16) {
        rc = CK(cudaMemcpy(dev, w->data, bytes, cudaMemcpyHostToDevice));
    } else {
        /* dequantize row blocks on the host into a pinned f32 buffer, convert on the device */
        const int64_t chunk_rows = (int64_t)((size_t)(16 << 20) / ((size_t)w->cols * sizeof(float))) + 1;
        float *host = NULL, *tmp = NULL;
        size_t chunk_bytes = (size_t)chunk_rows * (size_t)w->cols * sizeof(float);
        rc = CK(cudaMallocHost((void **)&host, chunk_bytes)) || CK(cudaMalloc((void **)&tmp, chunk_bytes));
        const size_t row_bytes = (size_t)ggml_row_bytes(w->type, (uint64_t)w->cols);
        for (int64_t r0 = 0; !rc && r0 < w->rows; r0 += chunk_rows) {
            int64_t nr = w->rows - r0 < chunk_rows ? w->rows - r0 : chunk_rows;
            for (int64_t r = 0; r < nr; r++)
                quant_dequant_row(w->type, (const uint8_t *)w->data + (size_t)(r0 + r) * row_bytes,
                                  host + (size_t)r * (size_t)w->cols, w->cols);
            int64_t ne = nr * w->cols;
            if ((rc = CK(cudaMemcpyAsync(tmp, host, (size_t)ne * sizeof(float), cudaMemcpyHostToDevice, im->stream))))
                break;
            k_f32_to_f16<<<blocks_for(ne, 256), 256, 0, im->stream>>>((__half *)dev + (size_t)r0 * (size_t)w->cols, tmp, ne);
            rc = CK_LAUNCH(k_f32_to_f16) || CK(cudaStreamSynchronize(im->stream)); /* the pinned buffer is refilled next */
        }
        rc |= CK(cudaFreeHost(host)) | CK(cudaFree(tmp));
    }
    if (rc) {
        cudaFree(dev);
        return NULL;
    }
    return (const __half *)w_store(im, e, w->data, dev, bytes, print);
}

/* A device copy of an f32 vector the model owns (norm weights, biases: host memory, mapped from the file),
 * uploaded on first use like the weights. NULL on failure. */
static const float *vector_dev(cuda_impl *im, const float *host, int64_t n) {
    const size_t bytes = (size_t)n * sizeof(float);
    const uint64_t print = fingerprint(host, bytes, (uint64_t)n);
    wentry *e = w_find(im, host);
    if (e && e->bytes == bytes && e->print == print) return (const float *)e->dev;
    void *dev = NULL;
    if (flush(im) || CK(cudaMalloc(&dev, bytes))) return NULL; /* cudaMemcpy waits for the stream */
    if (CK(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice))) {
        cudaFree(dev);
        return NULL;
    }
    return (const float *)w_store(im, e, host, dev, bytes, print);
}

/* ---- elementwise kernels ---- */

__global__ void k_get_rows(float *out, const __half *w, const int32_t *ids, int64_t cols) {
    const int64_t i = blockIdx.y;
    const __half *row = w + (int64_t)ids[i] * cols;
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += (int64_t)gridDim.x * blockDim.x)
        out[i * cols + c] = __half2float(row[c]);
}

/* out = rmsnorm(x) per row (a block a row); ADD: x += d first (k_add's sums), out may be d: every thread reads
 * its elements of d before the block's reduction and writes out after it */
template <bool ADD>
__global__ void k_rmsnorm(float *out, float *x, const float *d, const float *w, int64_t n, float eps) {
    float *xr = x + (int64_t)blockIdx.x * n;
    float *orow = out + (int64_t)blockIdx.x * n;
    float s = 0.f;
    if (ADD) {
        const float *dr = d + (int64_t)blockIdx.x * n;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) xr[i] = xr[i] + dr[i];
    }
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += xr[i] * xr[i];
    __shared__ float red[32];
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x < 32) {
        s = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : 0.f;
        for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (threadIdx.x == 0) red[0] = s;
    }
    __syncthreads();
    const float scale = 1.0f / sqrtf(red[0] / (float)n + eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) orow[i] = xr[i] * scale * w[i];
}

/* ggml's angle: theta_i = pos * base^(-2i/n_rot), accumulated as a product in float like ggml does; sin and
 * cos in double (fast-math intrinsics lose accuracy at large angles). */
/* blocks (head, token) of x's n_head heads, then of y's n_head_y (q and k in one launch; y may be NULL) */
__global__ void k_rope(float *x, int n_head, float *y, int n_head_y, int head_dim, int n_rot, const int32_t *pos,
                       float theta_scale, int neox) {
    const int64_t t = blockIdx.y;
    const int h = blockIdx.x;
    const int half_rot = n_rot / 2;
    float *row = h < n_head ? x + (t * n_head + h) * (int64_t)head_dim : y + (t * n_head_y + h - n_head) * (int64_t)head_dim;
    for (int i = threadIdx.x; i < half_rot; i += blockDim.x) {
        float theta = (float)pos[t];
        for (int j = 0; j < i; j++) theta *= theta_scale;
        double s, c;
        sincos((double)theta, &s, &c);
        const int a = neox ? i : 2 * i, b = neox ? i + half_rot : 2 * i + 1;
        const float x0 = row[a], x1 = row[b];
        row[a] = (float)(x0 * c - x1 * s);
        row[b] = (float)(x0 * s + x1 * c);
    }
}

__global__ void k_swiglu(float *out, const float *g, const float *u, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float a = g[i];
        out[i] = a / (1.0f + expf(-a)) * u[i];
    }
}

__global__ void k_add(float *out, const float *a, const float *b, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = a[i] + b[i];
}

__global__ void k_add_bias(float *x, const float *bias, int64_t n, int64_t total) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x)
        x[i] += bias[i % n];
}

/* ---- GEMV for decode: out[t][r] = W[r] . x[t], t < NT; one warp per row, 16-byte weight loads ---- */

/* acc += 8 weights (one 16-byte group) . 8 inputs (a, b) */
__device__ __forceinline__ void dot8(float &acc, uint4 raw, float4 a, float4 b) {
    const __half2 *h2 = (const __half2 *)&raw;
    float wf[8];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float2 f = __half22float2(h2[k]);
        wf[2 * k] = f.x;
        wf[2 * k + 1] = f.y;
    }
    acc += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w + wf[4] * b.x + wf[5] * b.y + wf[6] * b.z + wf[7] * b.w;
}

/* one 16-byte group of 8 weights times x[t][c0 .. c0+7] into acc[t] */
template <int NT>
__device__ __forceinline__ void gemv_group(float (&acc)[NT], uint4 raw, const float *x, int64_t cols, int64_t c0) {
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float4 *xv = (const float4 *)(x + t * cols + c0);
        dot8(acc[t], raw, __ldg(xv), __ldg(xv + 1));
    }
}

static int g_gemv_kernel; /* 0 = not chosen yet, else 1..6 */

/* 5, the default: v4 for launches of GEMV5_V4_ROWS rows or more, v1 below (the same sums bit for bit). On the H200
 * (ncu, 2026-11-26, 8B shapes): v4 read 79% of DRAM peak on gate+up (28672 rows) and 86% on lm_head where v1 read
 * 74% and 81%; on 4096 rows (256 blocks of v4 against v1's 512) v4 read 43% where v1 read 56% */
enum { GEMV5_V4_ROWS = 8192 };

extern "C" void kvb_cuda_set_gemv_kernel(int k) { g_gemv_kernel = k >= 1 && k <= 6 ? k : 5; }

static int gemv_kernel(void) { return kvb_switch_pick(&g_gemv_kernel, "KVB_GEMV_KERNEL", 6, 5); }

static int gemv6_warps(void);

extern "C" const char *kvb_cuda_kernels(void) {
    static char line[256]; /* the longest (FlashInfer, prefetch, KIVI v2, graphs) is about 200 characters */
    char gv[40] = ""; /* v5's rule, v6's warps a row (they change its rounding) */
    if (gemv_kernel() == 5) snprintf(gv, sizeof gv, " (v4 from 8192 rows, v1 below)");
    if (gemv_kernel() == 6) snprintf(gv, sizeof gv, " (%d warps a row)", gemv6_warps());
    char attn[96]; /* kernel 5 is FlashInfer's decode where it applies, v4 elsewhere (flashinfer.h) */
    if (kvb_cuda_attention_kernel() == 5)
        snprintf(attn, sizeof attn, "FlashInfer%s (v4 where it does not apply)", kvb_fi_compiled() ? "" : " [not built]");
    else
        snprintf(attn, sizeof attn, "v%d", kvb_cuda_attention_kernel());
    if (kvb_cuda_attn_prefetch()) /* v4's candidate L2 prefetch */
        snprintf(attn + strlen(attn), sizeof attn - strlen(attn), " (prefetch %d ahead)", kvb_cuda_attn_prefetch());
    snprintf(line, sizeof line, "attention %s, prefill %s, GEMV v%d%s, probabilities v%d%s%s", attn,
             kvb_cuda_attention_prefill_tc() == 2 ? "tensor cores v2" : kvb_cuda_attention_prefill_tc() ? "tensor cores v1"
                                                                                        : "CUDA cores", gemv_kernel(),
             gv, kvb_cuda_attention_probs_kernel(),
             kvb_cuda_quant_kernel() == 2 ? ", KIVI attention v2" : "",
             kvb_cuda_graph_on() ? ", decode steps as CUDA graphs" : "");
    return line;
}

extern "C" const char *kvb_cuda_kernels_tag(void) {
    static char tag[48];
    char w6[8] = "";
    if (gemv_kernel() == 6) snprintf(w6, sizeof w6, "w%d", gemv6_warps());
    char pf[8] = "";
    if (kvb_cuda_attn_prefetch()) snprintf(pf, sizeof pf, "pf%d", kvb_cuda_attn_prefetch());
    snprintf(tag, sizeof tag, "attn%d%s.%s.gemv%d%s.probs%d%s%s", kvb_cuda_attention_kernel(), pf,
             kvb_cuda_attention_prefill_tc() == 2 ? "tc2" : kvb_cuda_attention_prefill_tc() ? "tc" : "notc", gemv_kernel(),
             w6, kvb_cuda_attention_probs_kernel(), kvb_cuda_quant_kernel() == 2 ? ".quant2" : "",
             kvb_cuda_graph_on() ? ".graph" : "");
    return tag;
}

/* one row's dot products by a warp: lane l takes 16-byte groups l, l+32, ...; V2 (the candidate,
 * KVB_GEMV_KERNEL=2) keeps four in flight (its per-lane partial sums then add in another order: float rounding
 * differs from v1) */
template <int NT, int VER>
__device__ __forceinline__ void gemv_row(float (&acc)[NT], const uint4 *w4, const float *x, int64_t cols, int lane) {
    const int64_t nv = cols >> 3;
    int64_t v = lane;
    if (VER == 3) { /* v3: eight 16-byte loads in flight per lane, then folded in v1's order (the same sums) */
        for (; v < nv; v += 256) {
            uint4 r[8];
#pragma unroll
            for (int k = 0; k < 8; k++) r[k] = v + 32 * k < nv ? __ldg(w4 + v + 32 * k) : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int k = 0; k < 8; k++)
                if (v + 32 * k < nv) gemv_group<NT>(acc, r[k], x, cols, (v + 32 * k) * 8);
        }
        return;
    }
    if (VER == 2)
        for (; v + 96 < nv; v += 128) {
            const uint4 r0 = __ldg(w4 + v), r1 = __ldg(w4 + v + 32), r2 = __ldg(w4 + v + 64), r3 = __ldg(w4 + v + 96);
            gemv_group<NT>(acc, r0, x, cols, v * 8);
            gemv_group<NT>(acc, r1, x, cols, (v + 32) * 8);
            gemv_group<NT>(acc, r2, x, cols, (v + 64) * 8);
            gemv_group<NT>(acc, r3, x, cols, (v + 96) * 8);
        }
    for (; v < nv; v += 32) gemv_group<NT>(acc, __ldg(w4 + v), x, cols, v * 8);
}

/* the warp's sums into out[t][r] */
template <int NT>
__device__ __forceinline__ void gemv_store(float (&acc)[NT], float *out, int64_t rows, int64_t r, int lane) {
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float s = acc[t];
        for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) out[t * rows + r] = s;
    }
}

/* Decode GEMV: up to three matrices of one width over one input in one launch (one for a plain matmul); a warp
 * takes row r of their rows laid end to end, with 16-byte weight loads when the width allows, else one element
 * per lane at a time */
struct gemv_set {
    const __half *w[3];
    float *out[3];
    int64_t rows[3];
};

template <int NT, int VER>
__global__ void __launch_bounds__(256) k_gemv_n(gemv_set s, const float *x, int64_t cols) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int64_t r = (int64_t)blockIdx.x * (blockDim.x >> 5) + warp;
    int i = 0;
    while (i < 3 && r >= s.rows[i]) r -= s.rows[i++];
    if (i == 3) return;
    const __half *wr = s.w[i] + r * cols;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.f;
    if ((cols & 7) == 0) {
        gemv_row<NT, VER>(acc, (const uint4 *)wr, x, cols, lane);
    } else {
        for (int64_t c = lane; c < cols; c += 32) {
            const float wv = __half2float(wr[c]);
#pragma unroll
            for (int t = 0; t < NT; t++) acc[t] += wv * x[t * cols + c];
        }
    }
    gemv_store<NT>(acc, s.out[i], s.rows[i], r, lane);
}

/* v4 (KVB_GEMV_KERNEL=4): a warp takes GEMV4_ROWS rows at once, so each 16-byte group of x it loads serves that
 * many rows (v1-v3 load x once per row: as many L1 bytes as weight bytes, twice over), with two groups of each row
 * in flight; each row's per-lane sums add in v1's order, so the results are v1's bit for bit */
enum { GEMV4_ROWS = 4, GEMV4_WARPS = 4 };

template <int NT>
__global__ void __launch_bounds__(GEMV4_WARPS * 32) k_gemv_r4(gemv_set s, const float *x, int64_t cols, int64_t total) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t first = ((int64_t)blockIdx.x * GEMV4_WARPS + warp) * GEMV4_ROWS;
    const uint4 *w4[GEMV4_ROWS];
    float *out[GEMV4_ROWS];
    int64_t row[GEMV4_ROWS], rows[GEMV4_ROWS];
#pragma unroll
    for (int k = 0; k < GEMV4_ROWS; k++) { /* row first + k of the matrices laid end to end (NULL past the end) */
        int64_t r = first + k;
        int i = 0;
        while (i < 3 && r >= s.rows[i]) r -= s.rows[i++];
        const bool ok = first + k < total && i < 3;
        w4[k] = ok ? (const uint4 *)(s.w[i] + r * cols) : NULL;
        out[k] = ok ? s.out[i] : NULL;
        row[k] = r, rows[k] = ok ? s.rows[i] : 0;
    }
    float acc[GEMV4_ROWS][NT];
#pragma unroll
    for (int k = 0; k < GEMV4_ROWS; k++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[k][t] = 0.f;
    const int64_t nv = cols >> 3;
    for (int64_t v = lane; v < nv; v += 64) {
        uint4 w[2][GEMV4_ROWS];
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int k = 0; k < GEMV4_ROWS; k++)
                w[h][k] = w4[k] && v + 32 * h < nv ? __ldg(w4[k] + v + 32 * h) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            if (v + 32 * h >= nv) break;
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const float4 *xv = (const float4 *)(x + t * cols + (v + 32 * h) * 8);
                const float4 a = __ldg(xv), b = __ldg(xv + 1);
#pragma unroll
                for (int k = 0; k < GEMV4_ROWS; k++) dot8(acc[k][t], w[h][k], a, b);
            }
        }
    }
#pragma unroll
    for (int k = 0; k < GEMV4_ROWS; k++)
        if (out[k]) gemv_store<NT>(acc[k], out[k], rows[k], row[k], lane);
}

/* v6 (KVB_GEMV_KERNEL=6, a candidate): a block of W warps a row (W = 4, or KVB_GEMV6_WARPS = 2, 4 or 8), the row's
 * 16-byte groups dealt to its threads in turn (thread i takes groups i, i + 32 W, ...) with four loads in flight a
 * thread; each thread's sums, then each warp's by shuffles, then the warps' in order (float rounding differs from
 * v1's, as v2's does). On the H200's 8B shapes v1 gives a 4096-row matrix one warp a row, 4096 warps: about 31 an SM
 * with one 16-byte load each in flight, which read 56% of DRAM peak (v4: 43%); v6 puts W warps on each row and four
 * loads in flight on each thread. Not yet run on a GPU: gpu-check's gemv-8b step times W = 2, 4 and 8. */
template <int NT, int W>
__global__ void __launch_bounds__(W * 32) k_gemv_v6(gemv_set s, const float *x, int64_t cols) {
    constexpr int T = W * 32;
    __shared__ float part[W][NT];
    int64_t r = blockIdx.x;
    int i = 0;
    while (i < 3 && r >= s.rows[i]) r -= s.rows[i++];
    if (i == 3) return; /* the whole block: no barrier is skipped by part of it */
    const uint4 *w4 = (const uint4 *)(s.w[i] + r * cols);
    const int64_t nv = cols >> 3;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.f;
    int64_t v = threadIdx.x;
    for (; v + 3 * T < nv; v += 4 * T) {
        const uint4 r0 = __ldg(w4 + v), r1 = __ldg(w4 + v + T), r2 = __ldg(w4 + v + 2 * T), r3 = __ldg(w4 + v + 3 * T);
        gemv_group<NT>(acc, r0, x, cols, v * 8);
        gemv_group<NT>(acc, r1, x, cols, (v + T) * 8);
        gemv_group<NT>(acc, r2, x, cols, (v + 2 * T) * 8);
        gemv_group<NT>(acc, r3, x, cols, (v + 3 * T) * 8);
    }
    for (; v < nv; v += T) gemv_group<NT>(acc, __ldg(w4 + v), x, cols, v * 8);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float sum = acc[t];
        for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (lane == 0) part[warp][t] = sum;
    }
    __syncthreads();
    if (threadIdx.x < NT) {
        float sum = part[0][threadIdx.x];
#pragma unroll
        for (int w = 1; w < W; w++) sum += part[w][threadIdx.x];
        s.out[i][threadIdx.x * s.rows[i] + r] = sum;
    }
}

static int g_gemv6_warps; /* 0 = not read yet */

/* v6's warps a row: $KVB_GEMV6_WARPS when it is 2, 4 or 8, else 4 (read once; the tests' setter first) */
extern "C" void kvb_cuda_set_gemv6_warps(int w) { g_gemv6_warps = w == 2 || w == 8 ? w : 4; }

static int gemv6_warps(void) {
    if (!g_gemv6_warps) {
        const char *v = getenv("KVB_GEMV6_WARPS");
        kvb_cuda_set_gemv6_warps(v ? atoi(v) : 4);
    }
    return g_gemv6_warps;
}

/* ---- KV rows: one launch per layer for every head (kv_writer) ---- */

typedef struct {
    kvb_kv_rows dst[KVB_MAX_KV_HEADS];
} writer_params;

__global__ void k_kv_write(writer_params p, int n_head_kv, int head_dim, int f16, const float *k, const float *v,
                           const int32_t *pos, const int32_t *round) {
    const int64_t t = blockIdx.x;
    const int h = blockIdx.y;
    const float *ks = k + (t * n_head_kv + h) * (int64_t)head_dim;
    const float *vs = v + (t * n_head_kv + h) * (int64_t)head_dim;
    const kvb_kv_rows d = p.dst[h];
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        if (f16) {
            ((__half *)d.k)[t * head_dim + i] = __float2half_rn(ks[i]);
            ((__half *)d.v)[t * head_dim + i] = __float2half_rn(vs[i]);
        } else {
            ((float *)d.k)[t * head_dim + i] = ks[i];
            ((float *)d.v)[t * head_dim + i] = vs[i];
        }
    }
    if (threadIdx.x == 0) {
        d.pos[t] = pos[t];
        d.round[t] = round ? round[t] : 0;
    }
}

static int cuda_kv_writer(void *user, int n_head_kv, int head_dim, kvb_dtype dtype, int64_t n_tok,
                          const kvb_kv_rows *dst, const float *k, const float *v, const int32_t *pos,
                          const int32_t *round, char *err, size_t err_len) {
    kvb_backend *be = (kvb_backend *)user;
    cuda_impl *im = IM(be);
    if (be->error[0]) return failed(im, err, err_len);
    if (n_head_kv > KVB_MAX_KV_HEADS || n_tok > 65535 * 1024)
        return snprintf(err, err_len, "cuda kv writer: %d KV heads x %lld tokens (at most %d x %d)", n_head_kv,
                        (long long)n_tok, (int)KVB_MAX_KV_HEADS, 65535 * 1024), -1;
    writer_params p;
    memset(&p, 0, sizeof p);
    int to_host = 0;
    for (int h = 0; h < n_head_kv; h++) p.dst[h] = dst[h], to_host += dst[h].host != 0;
    if (to_host) { /* host-tier heads (pinned: mapped for the device) are written in place over PCIe */
        be->traffic.n[KVB_COPY_D2H] += 1;
        be->traffic.bytes[KVB_COPY_D2H] +=
            (int64_t)to_host * n_tok * (int64_t)(2 * (size_t)head_dim * (dtype == KVB_F16 ? 2u : 4u) + 2 * sizeof(int32_t));
    }
    dim3 grid((unsigned)n_tok, (unsigned)n_head_kv);
    k_kv_write<<<grid, head_dim < 128 ? 64 : 128, 0, im->stream>>>(p, n_head_kv, head_dim, dtype == KVB_F16, k, v, pos, round);
    return CK_LAUNCH(k_kv_write) ? failed(im, err, err_len) : 0;
}

/* ---- allocator for the engine's trackers ---- */

/* the first device-tier block starting above p (under dev_mu) */
static size_t dev_after(const cuda_impl *im, uintptr_t p) {
    size_t lo = 0, hi = im->n_dev;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (im->dev[mid].lo <= p) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* 1 when p is in a device-tier block of this allocator; anything else is host memory (pinned or not) */
static int on_device(cuda_impl *im, const void *p) {
    pthread_mutex_lock(&im->dev_mu);
    size_t i = dev_after(im, (uintptr_t)p);
    int in = i > 0 && (uintptr_t)p < im->dev[i - 1].hi;
    pthread_mutex_unlock(&im->dev_mu);
    return in;
}

static int dev_note(cuda_impl *im, void *p, size_t bytes) {
    pthread_mutex_lock(&im->dev_mu);
    if (im->n_dev == im->cap_dev) {
        size_t cap = im->cap_dev ? 2 * im->cap_dev : 256;
        dev_span *d = (dev_span *)realloc(im->dev, cap * sizeof *d);
        if (!d) {
            pthread_mutex_unlock(&im->dev_mu);
            return -1;
        }
        im->dev = d;
        im->cap_dev = cap;
    }
    size_t i = dev_after(im, (uintptr_t)p);
    memmove(&im->dev[i + 1], &im->dev[i], (im->n_dev - i) * sizeof *im->dev);
    im->dev[i].lo = (uintptr_t)p;
    im->dev[i].hi = (uintptr_t)p + bytes;
    im->n_dev++;
    pthread_mutex_unlock(&im->dev_mu);
    return 0;
}

static void dev_forget(cuda_impl *im, void *p) {
    pthread_mutex_lock(&im->dev_mu);
    size_t i = dev_after(im, (uintptr_t)p);
    if (i > 0 && im->dev[i - 1].lo == (uintptr_t)p) {
        memmove(&im->dev[i - 1], &im->dev[i], (im->n_dev - i) * sizeof *im->dev);
        im->n_dev--;
    }
    pthread_mutex_unlock(&im->dev_mu);
}

static void *cuda_alloc(void *user, kvb_tier tier, size_t bytes) {
    cuda_impl *im = (cuda_impl *)user;
    void *p = NULL;
    if (tier == KVB_TIER_HOST) {
        if (cudaMallocHost(&p, bytes) != cudaSuccess) { cudaGetLastError(); return NULL; }
        return memset(p, 0, bytes);
    }
    if (cudaMalloc(&p, bytes) != cudaSuccess) { cudaGetLastError(); return NULL; } /* out of GPU memory */
    if (CK(cudaMemsetAsync(p, 0, bytes, im->stream)) || dev_note(im, p, bytes)) { /* zeroed before any op runs */
        cudaFree(p);
        return NULL;
    }
    return p;
}

static void cuda_free(void *user, kvb_tier tier, void *p, size_t bytes) {
    cuda_impl *im = (cuda_impl *)user;
    if (!p) return;
    flush(im); /* recorded work may still use it */
    if (tier == KVB_TIER_DEVICE) {
        dev_forget(im, p);
        CK(cudaFree(p)); /* waits for the work that may still use it */
    } else if (!CK(cudaStreamSynchronize(im->copy_stream)) && !CK(cudaStreamSynchronize(im->stream))) {
        /* pinned host-tier memory is used from both streams: a copy may still read or fill it, and on the compute
         * stream the KV writer may still write it in place and kv_load read it (mapped): both wait before it goes */
        CK(cudaFreeHost(p));
    }
}

/* Enqueue a copy on the copy stream after the work enqueued on the compute stream so far, and make the
 * compute stream's later work wait for it. 0, or -1 (recorded). */
static int copy_across(cuda_impl *im, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    return CK(cudaEventRecord(im->compute_mark, im->stream)) ||
           CK(cudaStreamWaitEvent(im->copy_stream, im->compute_mark, 0)) ||
           CK(cudaMemcpyAsync(dst, src, bytes, kind, im->copy_stream)) ||
           CK(cudaEventRecord(im->copy_mark, im->copy_stream)) || CK(cudaStreamWaitEvent(im->stream, im->copy_mark, 0));
}

/* The allocator's synchronous copy: device to device on the compute stream, anything touching host memory on
 * the copy stream (each end's side from the device blocks handed out). */
static void cuda_copy(void *user, void *dst, const void *src, size_t bytes) {
    cuda_impl *im = (cuda_impl *)user;
    if (flush(im)) return; /* a synchronous copy */
    const int from_host = !on_device(im, src), to_host = !on_device(im, dst);
    if (!from_host && !to_host) {
        if (!CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, im->stream)))
            CK(cudaStreamSynchronize(im->stream));
        return;
    }
    const cudaMemcpyKind kind = from_host && to_host ? cudaMemcpyHostToHost
                                : from_host          ? cudaMemcpyHostToDevice
                                                     : cudaMemcpyDeviceToHost;
    if (!copy_across(im, dst, src, bytes, kind)) CK(cudaStreamSynchronize(im->copy_stream));
}

/* ---- ops ---- */

/* A one-token decode step begins: recorded as one graph where $KVB_CUDA_GRAPH=1 (graph.cu) */
static int cuda_step_begin(kvb_backend *be) { return cuda_graph_begin(&IM(be)->ops); }

extern "C" void kvb_cuda_graph_counts(long long *steps, long long *graphs, long long *nodes) {
    const cuda_graph *g = g_backend && kvb_cuda_graph_on() ? &IM(g_backend)->ops.graph : NULL;
    *steps = g ? g->steps : 0, *graphs = g ? g->graphs : 0, *nodes = g ? g->nodes : 0;
}

extern "C" const char *kvb_cuda_graph_stats(void) {
    static char line[256];
    line[0] = 0;
    if (g_backend && kvb_cuda_graph_on()) cuda_graph_summary(&IM(g_backend)->ops, line, sizeof line);
    return line;
}

static int cuda_sync(kvb_backend *be) {
    cuda_impl *im = IM(be);
    if (!cuda_kvops_wait(&im->ops)) CK(cudaGetLastError());
    return be->error[0] ? -1 : 0;
}

/* k_gemv_n (v1, v2, v3) or k_gemv_r4 (v4) over the matrices of s (total rows) for n_tok <= 4 tokens, by KVB_GEMV_KERNEL
 * (5: by the rows) */
/* L(NT), a launch for NT tokens, taken for the call's n_tok (1..3, else 4) */
#define BY_TOKENS(L)                                                                                                 \
    switch (n_tok) {                                                                                                 \
    case 1: L(1); break;                                                                                             \
    case 2: L(2); break;                                                                                             \
    case 3: L(3); break;                                                                                             \
    default: L(4); break;                                                                                            \
    }

static int gemv_launch(cuda_impl *im, const gemv_set *s, int64_t total, const float *x, int64_t cols, int64_t n_tok) {
    int ver = gemv_kernel();
    if (ver == 5) ver = total >= GEMV5_V4_ROWS ? 4 : 1;
    if (ver == 6 && (cols & 7) == 0) { /* a block a row (cols % 8 != 0: v1's scalar path below) */
        const unsigned g6 = (unsigned)total;
        const int w6 = gemv6_warps();
#define GEMV_V6(NT)                                                                                                 \
    (w6 == 2   ? k_gemv_v6<NT, 2><<<g6, 64, 0, im->stream>>>(*s, x, cols)                                           \
     : w6 == 8 ? k_gemv_v6<NT, 8><<<g6, 256, 0, im->stream>>>(*s, x, cols)                                          \
               : k_gemv_v6<NT, 4><<<g6, 128, 0, im->stream>>>(*s, x, cols))
        BY_TOKENS(GEMV_V6)
#undef GEMV_V6
        return CK_LAUNCH(k_gemv_v6);
    }
    if (ver == 4 && (cols & 7) == 0) {
        const int64_t per = (int64_t)GEMV4_WARPS * GEMV4_ROWS;
        const unsigned g4 = (unsigned)((total + per - 1) / per);
#define GEMV_R4(NT) k_gemv_r4<NT><<<g4, GEMV4_WARPS * 32, 0, im->stream>>>(*s, x, cols, total)
        BY_TOKENS(GEMV_R4)
#undef GEMV_R4
        return CK_LAUNCH(k_gemv_r4);
    }
    const int warps = 8;
    const unsigned grid = (unsigned)((total + warps - 1) / warps);
#define GEMV_N(NT) (ver == 3   ? k_gemv_n<NT, 3><<<grid, warps * 32, 0, im->stream>>>(*s, x, cols) \
                    : ver == 2 ? k_gemv_n<NT, 2><<<grid, warps * 32, 0, im->stream>>>(*s, x, cols) \
                               : k_gemv_n<NT, 1><<<grid, warps * 32, 0, im->stream>>>(*s, x, cols))
    BY_TOKENS(GEMV_N)
#undef GEMV_N
    return CK_LAUNCH(k_gemv_n);
}
#undef BY_TOKENS

static int cuda_matmul(kvb_backend *be, float *out, const kvb_weight *w, const float *x, int64_t n_tok) {
    cuda_impl *im = IM(be);
    const __half *wd = be->error[0] ? NULL : weight_f16(im, w);
    if (!wd) return -1;
    const int64_t rows = w->rows, cols = w->cols;
    if (n_tok <= 0) return 0;
    if (n_tok <= 4) {
        gemv_set s;
        memset(&s, 0, sizeof s);
        s.w[0] = wd, s.out[0] = out, s.rows[0] = rows;
        return gemv_launch(im, &s, rows, x, cols, n_tok);
    }
    /* out (row-major n_tok x rows) = column-major rows x n_tok = W^T(col-major cols x rows)^T * X(cols x n_tok);
     * cuBLAS runs outside a decode step's recording (it may take workspace of its own) */
    const int64_t nx = n_tok * cols;
    if (flush(im) || grow_dev(im, &im->scratch, &im->scratch_bytes, (size_t)nx * sizeof(__half))) return -1;
    k_f32_to_f16<<<blocks_for(nx, 256), 256, 0, im->stream>>>((__half *)im->scratch, x, nx);
    if (CK_LAUNCH(k_f32_to_f16)) return -1;
    const float alpha = 1.0f, beta = 0.0f;
    cublasStatus_t st = cublasGemmEx(im->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)n_tok, (int)cols, &alpha, wd,
                                     CUDA_R_16F, (int)cols, im->scratch, CUDA_R_16F, (int)cols, &beta, out, CUDA_R_32F,
                                     (int)rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return st == CUBLAS_STATUS_SUCCESS ? 0 : fail(im, __FILE__, __LINE__, "cublasGemmEx", cublasGetStatusString(st));
}

static void cuda_get_rows(kvb_backend *be, float *out, const kvb_weight *w, const int32_t *ids, int64_t n) {
    cuda_impl *im = IM(be);
    const __half *wd = weight_f16(im, w);
    const size_t bytes = (size_t)n * sizeof(int32_t);
    if (!wd || n <= 0 || !tokens_fit(im, n, "get_rows") || grow_dev(im, &im->ids, &im->ids_bytes, bytes)) return;
    /* ids are host memory, maybe a caller's temporary: staged in pinned memory, whose previous copy is done (or in a
     * decode step's recording, its arena) */
    const void *rec = cuda_graph_stage(&im->ops, ids, bytes);
    if (rec) {
        if (CK(cudaMemcpyAsync(im->ids, rec, bytes, cudaMemcpyHostToDevice, im->stream))) return;
        dim3 grid((unsigned)((w->cols + 255) / 256), (unsigned)n);
        k_get_rows<<<grid, 256, 0, im->stream>>>(out, wd, (const int32_t *)im->ids, w->cols);
        CK_LAUNCH(k_get_rows);
        return;
    }
    if (CK(cudaEventSynchronize(im->ids_read))) return;
    if (bytes > im->ids_host_bytes) {
        if (CK(cudaFreeHost(im->ids_host))) return;
        im->ids_host = NULL;
        im->ids_host_bytes = 0;
        if (CK(cudaMallocHost((void **)&im->ids_host, bytes + 4096))) return;
        im->ids_host_bytes = bytes + 4096;
    }
    memcpy(im->ids_host, ids, bytes);
    if (CK(cudaMemcpyAsync(im->ids, im->ids_host, bytes, cudaMemcpyHostToDevice, im->stream)) ||
        CK(cudaEventRecord(im->ids_read, im->stream)))
        return;
    dim3 grid((unsigned)((w->cols + 255) / 256), (unsigned)n);
    k_get_rows<<<grid, 256, 0, im->stream>>>(out, wd, (const int32_t *)im->ids, w->cols);
    CK_LAUNCH(k_get_rows);
}

static void cuda_rmsnorm(kvb_backend *be, float *out, const float *x, const float *w, int64_t n, int64_t n_rows,
                         float eps) {
    cuda_impl *im = IM(be);
    const float *wd = vector_dev(im, w, n);
    if (!wd) return;
    k_rmsnorm<false><<<(unsigned)n_rows, 256, 0, im->stream>>>(out, (float *)x, NULL, wd, n, eps);
    CK_LAUNCH(k_rmsnorm);
}

/* k matmuls over one input: decode (<= 4 tokens) with matrices of one width in one GEMV launch, anything else
 * one matmul at a time */
static int cuda_matmul_n(kvb_backend *be, int k, float *const *out, const kvb_weight *const *w, const float *x,
                         int64_t n_tok) {
    cuda_impl *im = IM(be);
    int fuse = k >= 1 && k <= 3 && n_tok >= 1 && n_tok <= 4;
    for (int i = 1; fuse && i < k; i++) fuse = w[i]->cols == w[0]->cols;
    if (!fuse) {
        for (int i = 0; i < k; i++)
            if (cuda_matmul(be, out[i], w[i], x, n_tok)) return -1;
        return 0;
    }
    gemv_set s;
    memset(&s, 0, sizeof s);
    int64_t total = 0;
    for (int i = 0; i < k; i++) {
        s.w[i] = be->error[0] ? NULL : weight_f16(im, w[i]);
        if (!s.w[i]) return -1;
        s.out[i] = out[i];
        s.rows[i] = w[i]->rows;
        total += w[i]->rows;
    }
    return gemv_launch(im, &s, total, x, w[0]->cols, n_tok);
}

static void cuda_add_rmsnorm(kvb_backend *be, float *x, const float *d, float *out, const float *w, int64_t n,
                             int64_t n_rows, float eps) {
    cuda_impl *im = IM(be);
    const float *wd = vector_dev(im, w, n);
    if (!wd) return;
    k_rmsnorm<true><<<(unsigned)n_rows, 256, 0, im->stream>>>(out, x, d, wd, n, eps);
    CK_LAUNCH(k_rmsnorm);
}

static void cuda_rope(kvb_backend *be, float *x, int64_t n_tok, int n_head, int head_dim, int n_rot, const int32_t *pos,
                      float freq_base, int neox) {
    cuda_impl *im = IM(be);
    if (n_tok <= 0 || !tokens_fit(im, n_tok, "rope")) return;
    const float theta_scale = powf(freq_base, -2.0f / (float)n_rot);
    dim3 grid((unsigned)n_head, (unsigned)n_tok);
    k_rope<<<grid, 64, 0, im->stream>>>(x, n_head, NULL, 0, head_dim, n_rot, pos, theta_scale, neox);
    CK_LAUNCH(k_rope);
}

static void cuda_rope_qk(kvb_backend *be, float *q, int n_head, float *k, int n_head_kv, int64_t n_tok, int head_dim,
                         int n_rot, const int32_t *pos, float freq_base, int neox) {
    cuda_impl *im = IM(be);
    if (n_tok <= 0 || !tokens_fit(im, n_tok, "rope")) return;
    const float theta_scale = powf(freq_base, -2.0f / (float)n_rot);
    dim3 grid((unsigned)(n_head + n_head_kv), (unsigned)n_tok);
    k_rope<<<grid, 64, 0, im->stream>>>(q, n_head, k, n_head_kv, head_dim, n_rot, pos, theta_scale, neox);
    CK_LAUNCH(k_rope);
}

static void cuda_swiglu(kvb_backend *be, float *out, const float *gate, const float *up, int64_t n) {
    cuda_impl *im = IM(be);
    k_swiglu<<<blocks_for(n, 256), 256, 0, im->stream>>>(out, gate, up, n);
    CK_LAUNCH(k_swiglu);
}

static void cuda_add(kvb_backend *be, float *out, const float *a, const float *b, int64_t n) {
    cuda_impl *im = IM(be);
    k_add<<<blocks_for(n, 256), 256, 0, im->stream>>>(out, a, b, n);
    CK_LAUNCH(k_add);
}

static void cuda_add_bias(kvb_backend *be, float *x, const float *bias, int64_t n, int64_t n_rows) {
    cuda_impl *im = IM(be);
    const float *bd = vector_dev(im, bias, n);
    if (!bd) return;
    k_add_bias<<<blocks_for(n * n_rows, 256), 256, 0, im->stream>>>(x, bd, n, n * n_rows);
    CK_LAUNCH(k_add_bias);
}

/* Parameter block layout in one ring slot: k[H] v[H] k_pos[H] n_kv[H] idx[H] n_idx[H] (8 bytes each). The
 * host arrays of per-head pointers and counts go to the device in one copy; everything they point to, and q,
 * q_pos, out, probs and lse, is device memory already (backend.h). window > 0: a sliding-window layer's mask. */
static int attend(kvb_backend *be, const kvb_attn_args *a, int32_t window, char *err, size_t err_len) {
    cuda_impl *im = IM(be);
    const int H = a->n_head_kv;
    if (be->error[0]) return failed(im, err, err_len);
    if (H <= 0 || H > KVB_MAX_KV_HEADS) {
        snprintf(err, err_len, "cuda attention: %d KV heads (1..%d supported)", H, (int)KVB_MAX_KV_HEADS);
        return -1;
    }
    /* FlashInfer (kernel 5) plans on the host and waits: a decode step's recording (graph.cu) runs first */
    if (kvb_cuda_attention_kernel() == 5 && flush(im)) return failed(im, err, err_len);
    const int slot = im->param_next;
    im->param_next = (slot + 1) % RING;
    /* recording a decode step, the block is written here and staged in the step's arena; else the slot's pinned
     * words once the copy that last read them is done */
    uint64_t rec_words[PARAM_WORDS];
    const int recording = im->ops.graph.capturing;
    if (!recording && CK(cudaEventSynchronize(im->param_ev[slot]))) return failed(im, err, err_len);
    uint64_t *ph = recording ? rec_words : im->param_host[slot];
    int64_t max_len = 0;
    for (int g = 0; g < H; g++) {
        const int has_idx = a->idx && a->idx[g];
        const int64_t len = has_idx ? a->n_idx[g] : a->n_kv[g];
        if (len > max_len) max_len = len;
        ph[0 * H + g] = (uint64_t)(uintptr_t)a->k[g];
        ph[1 * H + g] = (uint64_t)(uintptr_t)a->v[g];
        ph[2 * H + g] = (uint64_t)(uintptr_t)(a->k_pos ? a->k_pos[g] : NULL);
        ph[3 * H + g] = (uint64_t)a->n_kv[g];
        ph[4 * H + g] = (uint64_t)(uintptr_t)(has_idx ? a->idx[g] : NULL);
        ph[5 * H + g] = (uint64_t)(has_idx ? a->n_idx[g] : 0);
    }
    uint64_t *pd = im->param_dev[slot];
    const void *up = ph;
    if (recording && !(up = cuda_graph_stage(&im->ops, ph, 6 * (size_t)H * sizeof(uint64_t)))) {
        /* no room in the arena: the recording has ended; the slot's own words, as without one */
        if (be->error[0] || CK(cudaEventSynchronize(im->param_ev[slot]))) return failed(im, err, err_len);
        memcpy(im->param_host[slot], ph, 6 * (size_t)H * sizeof(uint64_t));
        up = ph = im->param_host[slot];
    }
    if (CK(cudaMemcpyAsync(pd, up, 6 * (size_t)H * sizeof(uint64_t), cudaMemcpyHostToDevice, im->stream)))
        return failed(im, err, err_len);

    kvb_cuda_attn c;
    memset(&c, 0, sizeof c);
    c.n_q = a->n_q;
    c.n_head = a->n_head;
    c.n_head_kv = H;
    c.head_dim = a->head_dim;
    c.q = a->q;
    c.q_pos = a->q_pos;
    c.kv_f16 = a->kv_dtype == KVB_F16;
    c.k = (const void *const *)(pd + 0 * H);
    c.v = (const void *const *)(pd + 1 * H);
    c.k_pos = a->k_pos ? (const int32_t *const *)(pd + 2 * H) : NULL;
    c.n_kv = (const int64_t *)(pd + 3 * H);
    c.idx = a->idx ? (const int32_t *const *)(pd + 4 * H) : NULL;
    c.n_idx = a->idx ? (const int64_t *)(pd + 5 * H) : NULL;
    c.max_len = max_len;
    c.scale = a->scale;
    c.out = a->out;
    c.probs = a->probs;
    c.probs_stride = a->probs_stride;
    c.lse = a->lse;
    c.window = window;
    c.host_heads = ph; /* the same words on the host: kernel 5 plans from them, without a read-back */

    size_t ws = kvb_cuda_attention_ws(&c);
    if (grow_dev(im, &im->attn_ws, &im->attn_ws_bytes, ws ? ws : 256)) return failed(im, err, err_len);
    int rc = kvb_cuda_attention(&c, im->attn_ws, im->attn_ws_bytes, im->stream, err, err_len);
    if (ph == im->param_host[slot] && CK(cudaEventRecord(im->param_ev[slot], im->stream))) /* the slot's reuse */
        return failed(im, err, err_len);
    return rc;
}

/* `attention` ignores a->window (backend.h): the engine sends window layers to attention_window */
static int cuda_attention(kvb_backend *be, const kvb_attn_args *a, char *err, size_t err_len) {
    return attend(be, a, 0, err, err_len);
}

/* A sliding-window layer: the window narrows the causal mask, so it needs the mask's positions (the CPU op would
 * attend over every key without them) */
static int cuda_attention_window(kvb_backend *be, const kvb_attn_args *a, char *err, size_t err_len) {
    if (a->window <= 0) return kvb_errf(err, err_len, "cuda attention_window: window %d is not positive", a->window);
    if (!a->q_pos || !a->k_pos)
        return kvb_errf(err, err_len, "cuda attention_window: a window of %d needs query and key positions", a->window);
    for (int g = 0; g < a->n_head_kv && g < KVB_MAX_KV_HEADS; g++)
        if (!a->k_pos[g]) return kvb_errf(err, err_len, "cuda attention_window: KV head %d has no key positions", g);
    return attend(be, a, a->window, err, err_len);
}

/* One backend per process, shared by every context (weights are uploaded once): g_backend, above */

static void cuda_be_free(kvb_backend *be) {
    if (be == g_backend) {
        /* kept for the process's lifetime once created: contexts come and go (one per sample, per
         * benchmark point) and re-uploading the weights each time would dominate short runs */
        if (g_refs > 0) g_refs--;
        return;
    }
    cuda_impl *im = IM(be);
    if (im) {
        cuda_graph_release(&im->ops); /* a recording in progress is dropped: the stream can then drain */
        cudaStreamSynchronize(im->stream);
        for (size_t i = 0; i < im->w_cap; i++)
            if (im->w[i].host) cudaFree(im->w[i].dev);
        free(im->w);
        cudaFree(im->scratch);
        cudaFree(im->attn_ws);
        cudaFree(im->ids);
        cudaFreeHost(im->ids_host);
        if (im->ids_read) cudaEventDestroy(im->ids_read);
        if (im->copy_stream) cudaStreamDestroy(im->copy_stream);
        if (im->compute_mark) cudaEventDestroy(im->compute_mark);
        if (im->copy_mark) cudaEventDestroy(im->copy_mark);
        free(im->dev);
        pthread_mutex_destroy(&im->dev_mu);
        for (int i = 0; i < RING; i++) {
            cudaFreeHost(im->param_host[i]);
            cudaFree(im->param_dev[i]);
            cudaEventDestroy(im->param_ev[i]);
        }
        if (im->blas) cublasDestroy(im->blas);
        cuda_kvops_release(&im->ops);
        cudaStreamDestroy(im->stream);
        free(im);
    }
    free(be);
}

extern "C" kvb_backend *kvb_backend_cuda_create(char *err, size_t err_len) {
    if (g_backend) {
        g_refs++;
        return g_backend;
    }
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        snprintf(err, err_len, "no GPU: no CUDA device is usable (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "no devices");
        cudaGetLastError();
        return NULL;
    }
    kvb_backend *be = (kvb_backend *)calloc(1, sizeof *be);
    cuda_impl *im = (cuda_impl *)calloc(1, sizeof *im);
    if (!be || !im) {
        free(be);
        free(im);
        snprintf(err, err_len, "out of memory creating the CUDA backend");
        return NULL;
    }
    im->be = be;
    be->impl = im;
    pthread_mutex_init(&im->dev_mu, NULL);
    const char *dev = getenv("KVB_CUDA_DEVICE");
    im->device = dev && *dev ? atoi(dev) : 0;
    if (cudaSetDevice(im->device) != cudaSuccess || cudaStreamCreate(&im->stream) != cudaSuccess ||
        cublasCreate(&im->blas) != CUBLAS_STATUS_SUCCESS) {
        snprintf(err, err_len, "could not initialise CUDA device %d (%s)", im->device, cudaGetErrorString(cudaGetLastError()));
        free(be);
        free(im);
        return NULL;
    }
    cublasSetStream(im->blas, im->stream);
    if (CK(cudaStreamCreateWithFlags(&im->copy_stream, cudaStreamNonBlocking)) ||
        CK(cudaEventCreateWithFlags(&im->compute_mark, cudaEventDisableTiming)) ||
        CK(cudaEventCreateWithFlags(&im->copy_mark, cudaEventDisableTiming)) ||
        CK(cudaEventCreateWithFlags(&im->ids_read, cudaEventDisableTiming))) {
        failed(im, err, err_len);
        cuda_be_free(be);
        return NULL;
    }
    cublasSetMathMode(im->blas, CUBLAS_DEFAULT_MATH);
    for (int i = 0; i < RING; i++)
        if (CK(cudaMallocHost((void **)&im->param_host[i], PARAM_WORDS * sizeof(uint64_t))) ||
            CK(cudaMalloc((void **)&im->param_dev[i], PARAM_WORDS * sizeof(uint64_t))) ||
            CK(cudaEventCreateWithFlags(&im->param_ev[i], cudaEventDisableTiming))) {
            failed(im, err, err_len);
            cuda_be_free(be);
            return NULL;
        }
    if (cuda_install_data_ops(be, &im->ops, im->stream)) {
        failed(im, err, err_len);
        cuda_be_free(be);
        return NULL;
    }
    cuda_install_kvquant_ops(be);
    cuda_install_narrow_ops(be);
    cuda_install_arch_ops(be);
    cuda_install_elem_ops(be);
    im->alloc.alloc = cuda_alloc;
    im->alloc.free = cuda_free;
    im->alloc.copy = cuda_copy;
    im->alloc.user = im;
    be->name = "cuda";
    be->discrete = 1;
    be->n_threads = 1;
    be->matmul = cuda_matmul;
    be->get_rows = cuda_get_rows;
    be->rmsnorm = cuda_rmsnorm;
    be->matmul_n = cuda_matmul_n;
    be->rope_qk = cuda_rope_qk;
    be->add_rmsnorm = cuda_add_rmsnorm;
    be->rope = cuda_rope;
    be->swiglu = cuda_swiglu;
    be->add = cuda_add;
    be->add_bias = cuda_add_bias;
    be->attention = cuda_attention;
    be->attention_window = cuda_attention_window;
    be->free = cuda_be_free;
    be->sync = cuda_sync;
    be->step_begin = cuda_step_begin;
    be->allocator = &im->alloc;
    be->kv_writer = cuda_kv_writer;
    g_backend = be;
    g_refs = 1;
    return be;
}
