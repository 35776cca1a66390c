/* test_cuda_ops.c — every op of the CUDA backend against a float64 reference written here, on seeded random
 * inputs of several shapes (odd sizes, unsorted index lists, positions past 100K), through the backend op
 * table exactly as the engine calls it: buffers from the backend's allocator (plain device memory: the test
 * fills host mirrors and copies them in and out with the allocator's copy), weights in host memory as the
 * model maps them, token ids and per-head pointer arrays on the host. Also the device-side KV row writer
 * through kvc_append.
 *
 * Bounds come from f16: weights are stored as f16 on the GPU (exactly, for F16 weights, so the reference
 * uses the same values) and prefill GEMMs round activations to f16 (relative 2^-11 per element), so a dot
 * product may be off by about 2^-11 * sum|w x|; elementwise ops are f32 and held to 1e-5 relative.
 * Without a GPU the suite prints one line and passes. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "util_common.h"
#include "kernels/backend.h"
#include "kernels/dtype.h"
#include "engine/kvcache.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/flashinfer.h"
#include "kernels/cuda/flashinfer_layout.h"
#include "engine/mem.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/pool.h"

static kvb_backend *be, *cpu; /* cpu: the reference for the architectures' ops */
static kvb_mem mem;
static uint64_t rng = 0x9E3779B97F4A7C15ull;

static double urand(void) { /* [-1, 1) */
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (double)(rng >> 11) / (double)(1ull << 52) - 1.0;
}

static float *dev_f32(int64_t n) { return kvb_mem_alloc(&mem, KVB_TIER_DEVICE, KVB_MEM_WORKSPACE, (size_t)n * 4); }
static void dev_free(void *p, int64_t bytes) { kvb_mem_free(&mem, KVB_TIER_DEVICE, KVB_MEM_WORKSPACE, p, (size_t)bytes); }
/* host mirror -> device memory; device memory -> host mirror (after the ops enqueued so far) */
static void put(void *dev, const void *host, int64_t bytes) { be->allocator->copy(be->allocator->user, dev, host, (size_t)bytes); }
static void get(void *host, const void *dev, int64_t bytes) {
    be->sync(be);
    be->allocator->copy(be->allocator->user, host, dev, (size_t)bytes);
}

/* weights stay allocated until the backend is gone (it caches device copies by host address) */
static void *kept[64];
static int n_kept;
static void keep(void *p) { kept[n_kept++] = p; }

static void fill(float *x, int64_t n, double scale) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)(urand() * scale);
}

/* ---- matmul: F16, Q8_0 and Q4_1 weights; decode GEMV (n_tok <= 4) and cuBLAS (more) ---- */
static void check_matmul(ggml_type type, int64_t rows, int64_t cols, int64_t n_tok) {
    size_t row_bytes = (size_t)ggml_row_bytes(type, (uint64_t)cols);
    uint8_t *wq = malloc(row_bytes * (size_t)rows);
    float *wrow = malloc((size_t)cols * 4);
    double *wd = malloc((size_t)rows * cols * sizeof(double));
    for (int64_t r = 0; r < rows; r++) {
        fill(wrow, cols, 1.0);
        if (type == GGML_T_F16) {
            for (int64_t c = 0; c < cols; c++) ((kvb_f16 *)(wq + r * row_bytes))[c] = kvb_f32_to_f16(wrow[c]);
        } else {
            CU_ASSERT_FATAL(quant_quantize_row(type, wrow, wq + r * row_bytes, cols) == 0);
        }
        quant_dequant_row(type, wq + r * row_bytes, wrow, cols);
        /* what the GPU holds: the dequantized value rounded to f16 */
        for (int64_t c = 0; c < cols; c++) wd[r * cols + c] = kvb_f16_to_f32(kvb_f32_to_f16(wrow[c]));
    }
    kvb_weight w = {wq, type, rows, cols};
    float *dx = dev_f32(n_tok * cols), *dout = dev_f32(n_tok * rows);
    float *x = malloc(n_tok * cols * 4), *out = malloc(n_tok * rows * 4);
    fill(x, n_tok * cols, 1.0);
    put(dx, x, n_tok * cols * 4);
    CU_ASSERT_FATAL(be->matmul(be, dout, &w, dx, n_tok) == 0);
    get(out, dout, n_tok * rows * 4);
    double worst = 0;
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t r = 0; r < rows; r++) {
            double ref = 0, mag = 0;
            for (int64_t c = 0; c < cols; c++) {
                ref += wd[r * cols + c] * x[t * cols + c];
                mag += fabs(wd[r * cols + c] * x[t * cols + c]);
            }
            double e = fabs(out[t * rows + r] - ref) / (mag + 1e-30);
            if (e > worst) worst = e;
        }
    /* GEMV keeps x in f32 (error ~ f32 accumulation); cuBLAS rounds x to f16 */
    double bound = n_tok <= 4 ? 1e-5 : 1.5e-3;
    printf("\n    matmul type %d %lldx%lld n_tok %lld: max error %.2e of sum|wx| (bound %.0e)", (int)type,
           (long long)rows, (long long)cols, (long long)n_tok, worst, bound);
    CU_ASSERT(worst <= bound);
    dev_free(dx, n_tok * cols * 4);
    dev_free(dout, n_tok * rows * 4);
    free(x);
    free(out);
    keep(wq); /* the backend caches weights by address for its lifetime: never reuse one */
    free(wrow);
    free(wd);
}

static void test_matmul(void) {
    check_matmul(GGML_T_F16, 1, 64, 1);
    check_matmul(GGML_T_F16, 577, 576, 1);
    check_matmul(GGML_T_F16, 333, 100, 3); /* cols not a multiple of 8: the scalar GEMV path */
    check_matmul(GGML_T_Q8_0, 1536, 576, 4);
    check_matmul(GGML_T_Q4_1, 576, 1536, 1);
    check_matmul(GGML_T_F16, 1000, 576, 37);
    check_matmul(GGML_T_Q4_1, 513, 1536, 130);
}

/* the fusions the forward pass takes: matmul_n (QKV, gate/up in one GEMV launch), add_rmsnorm and rope_qk equal
 * the separate ops bit for bit, for 1..4 tokens, every GEMV kernel, out aliasing d, both rope pairings */
static void test_fused_ops_equal_the_separate_ops(void) {
    const int64_t cols = 576, rows[3] = {577, 193, 190}; /* not multiples of 4: GEMV v4's warps straddle matrices */
    kvb_f16 *wq[3];
    kvb_weight w[3];
    for (int i = 0; i < 3; i++) {
        wq[i] = malloc((size_t)rows[i] * cols * sizeof(kvb_f16));
        for (int64_t j = 0; j < rows[i] * cols; j++) wq[i][j] = kvb_f32_to_f16((float)urand());
        w[i] = (kvb_weight){wq[i], GGML_T_F16, rows[i], cols};
        keep(wq[i]);
    }
    float *x = malloc(4 * cols * 4), *a = malloc(4 * 577 * 4), *b = malloc(4 * 577 * 4);
    fill(x, 4 * cols, 1.0);
    float *dx = dev_f32(4 * cols), *dsep[3], *dfused[3];
    put(dx, x, 4 * cols * 4);
    for (int i = 0; i < 3; i++) dsep[i] = dev_f32(4 * rows[i]), dfused[i] = dev_f32(4 * rows[i]);
    int same = 1;
    for (int kern = 1; kern <= 6; kern++) {
        kvb_cuda_set_gemv_kernel(kern);
        for (int64_t n_tok = 1; n_tok <= 4; n_tok++)
            for (int k = 2; k <= 3; k++) {
                const kvb_weight *wp[3] = {&w[0], &w[1], &w[2]};
                for (int i = 0; i < k; i++) CU_ASSERT_FATAL(be->matmul(be, dsep[i], &w[i], dx, n_tok) == 0);
                CU_ASSERT_FATAL(be->matmul_n(be, k, dfused, wp, dx, n_tok) == 0);
                for (int i = 0; i < k; i++) {
                    get(a, dsep[i], n_tok * rows[i] * 4);
                    get(b, dfused[i], n_tok * rows[i] * 4);
                    same &= memcmp(a, b, (size_t)(n_tok * rows[i] * 4)) == 0;
                }
            }
    }
    kvb_cuda_set_gemv_kernel(1);
    CU_ASSERT(same);
    /* add_rmsnorm(x, d, out = d) against add then rmsnorm */
    const int64_t n = 576, nr = 3;
    float *nw = malloc(n * 4), *hx = malloc(nr * n * 4), *hd = malloc(nr * n * 4);
    fill(nw, n, 1.0), fill(hx, nr * n, 2.0), fill(hd, nr * n, 2.0);
    keep(nw);
    float *x1 = dev_f32(nr * n), *x2 = dev_f32(nr * n), *d1 = dev_f32(nr * n), *o2 = dev_f32(nr * n);
    put(x1, hx, nr * n * 4), put(x2, hx, nr * n * 4), put(d1, hd, nr * n * 4);
    be->add(be, x2, x2, d1, nr * n);
    be->rmsnorm(be, o2, x2, nw, n, nr, 1e-5f);
    be->add_rmsnorm(be, x1, d1, d1, nw, n, nr, 1e-5f);
    float *r1 = malloc(nr * n * 4), *r2 = malloc(nr * n * 4);
    get(r1, x1, nr * n * 4), get(r2, x2, nr * n * 4);
    CU_ASSERT(memcmp(r1, r2, (size_t)(nr * n * 4)) == 0);
    get(r1, d1, nr * n * 4), get(r2, o2, nr * n * 4);
    CU_ASSERT(memcmp(r1, r2, (size_t)(nr * n * 4)) == 0);
    printf("\n    fused ops: matmul_n %s, add_rmsnorm %s", same ? "equal" : "DIFFER", memcmp(r1, r2, (size_t)(nr * n * 4)) ? "DIFFERS" : "equal");
    /* rope_qk against two rope calls: 5 tokens, 9 query and 3 KV heads of 64, shuffled positions, both pairings */
    const int nt = 5, HQ = 9, HK = 3, HDIM = 64;
    float *rq = malloc(nt * HQ * HDIM * 4), *rk = malloc(nt * HK * HDIM * 4), *ro1 = malloc(nt * HQ * HDIM * 4), *ro2 = malloc(nt * HQ * HDIM * 4);
    int32_t pos[5] = {7, 0, 4096, 3, 123};
    fill(rq, nt * HQ * HDIM, 1.0), fill(rk, nt * HK * HDIM, 1.0);
    int32_t *dpos = kvb_mem_alloc(&mem, KVB_TIER_DEVICE, KVB_MEM_WORKSPACE, sizeof pos);
    float *q1 = dev_f32(nt * HQ * HDIM), *q2 = dev_f32(nt * HQ * HDIM), *k1 = dev_f32(nt * HK * HDIM), *k2 = dev_f32(nt * HK * HDIM);
    put(dpos, pos, sizeof pos);
    int rope_same = 1;
    for (int neox = 0; neox <= 1; neox++) {
        put(q1, rq, nt * HQ * HDIM * 4), put(q2, rq, nt * HQ * HDIM * 4), put(k1, rk, nt * HK * HDIM * 4), put(k2, rk, nt * HK * HDIM * 4);
        be->rope(be, q1, nt, HQ, HDIM, HDIM, dpos, 10000.0f, neox);
        be->rope(be, k1, nt, HK, HDIM, HDIM, dpos, 10000.0f, neox);
        be->rope_qk(be, q2, HQ, k2, HK, nt, HDIM, HDIM, dpos, 10000.0f, neox);
        get(ro1, q1, nt * HQ * HDIM * 4), get(ro2, q2, nt * HQ * HDIM * 4);
        rope_same &= memcmp(ro1, ro2, (size_t)(nt * HQ * HDIM * 4)) == 0;
        get(ro1, k1, nt * HK * HDIM * 4), get(ro2, k2, nt * HK * HDIM * 4);
        rope_same &= memcmp(ro1, ro2, (size_t)(nt * HK * HDIM * 4)) == 0;
    }
    CU_ASSERT(rope_same);
    kvb_mem_free(&mem, KVB_TIER_DEVICE, KVB_MEM_WORKSPACE, dpos, sizeof pos);
    dev_free(q1, nt * HQ * HDIM * 4), dev_free(q2, nt * HQ * HDIM * 4), dev_free(k1, nt * HK * HDIM * 4), dev_free(k2, nt * HK * HDIM * 4);
    free(rq), free(rk), free(ro1), free(ro2);
    dev_free(dx, 4 * cols * 4);
    for (int i = 0; i < 3; i++) dev_free(dsep[i], 4 * rows[i] * 4), dev_free(dfused[i], 4 * rows[i] * 4);
    dev_free(x1, nr * n * 4), dev_free(x2, nr * n * 4), dev_free(d1, nr * n * 4), dev_free(o2, nr * n * 4);
    free(x), free(a), free(b), free(hx), free(hd), free(r1), free(r2);
}

/* the candidate GEMV (four loads in flight per lane): its unrolled body, the tail, every token count */
static void test_matmul_gemv2(void) {
    kvb_cuda_set_gemv_kernel(2);
    check_matmul(GGML_T_F16, 577, 576, 1);   /* 72 groups: the tail loop only */
    check_matmul(GGML_T_F16, 300, 4096, 1);  /* 512 groups: the unrolled body */
    check_matmul(GGML_T_Q8_0, 1536, 1568, 2);
    check_matmul(GGML_T_Q4_1, 100, 14336, 3);
    check_matmul(GGML_T_F16, 64, 1032, 4);
    check_matmul(GGML_T_F16, 333, 100, 3);   /* cols % 8 != 0: the v1 scalar path still */
    kvb_cuda_set_gemv_kernel(1);
}

/* a GEMV candidate (v3: eight loads in flight per lane, predicated tail; v4: four rows a warp, the input loaded
 * once for them): one pass and several, every token count, row counts that are not a multiple of the warp's, and
 * the sums equal v1's bit for bit (the same order) */
static void check_gemv_equals_v1(int kern) {
    kvb_cuda_set_gemv_kernel(kern);
    check_matmul(GGML_T_F16, 577, 576, 1);   /* 72 groups: one partial pass */
    check_matmul(GGML_T_F16, 300, 4096, 1);  /* 512 groups: two full passes */
    check_matmul(GGML_T_Q8_0, 1536, 1568, 2);
    check_matmul(GGML_T_Q4_1, 100, 14336, 3);
    check_matmul(GGML_T_F16, 64, 1032, 4);
    check_matmul(GGML_T_F16, 333, 100, 3);   /* cols % 8 != 0: the scalar path */
    check_matmul(GGML_T_F16, 3, 8, 2);       /* fewer rows than a warp takes */
    const int64_t rows = 97, cols = 4104;
    kvb_f16 *wq = malloc((size_t)rows * cols * sizeof(kvb_f16));
    for (int64_t j = 0; j < rows * cols; j++) wq[j] = kvb_f32_to_f16((float)urand());
    kvb_weight w = {wq, GGML_T_F16, rows, cols};
    float *x = malloc(cols * 4), *a = malloc(rows * 4), *b = malloc(rows * 4), *dx = dev_f32(cols), *dy = dev_f32(rows);
    fill(x, cols, 1.0);
    put(dx, x, cols * 4);
    CU_ASSERT_FATAL(be->matmul(be, dy, &w, dx, 1) == 0);
    get(b, dy, rows * 4);
    kvb_cuda_set_gemv_kernel(1);
    CU_ASSERT_FATAL(be->matmul(be, dy, &w, dx, 1) == 0);
    get(a, dy, rows * 4);
    CU_ASSERT(memcmp(a, b, (size_t)rows * 4) == 0);
    dev_free(dx, cols * 4);
    dev_free(dy, rows * 4);
    keep(wq);
    free(x), free(a), free(b);
}

/* v6 (the candidate: a block of four warps a row, four loads in flight a thread, the warps' sums added in order):
 * a partial pass, the unrolled body with a tail, every token count, fused sets through matmul_n, and cols % 8 != 0
 * on v1's scalar path; float64 bounds, as v2's (its sums run in another order than v1's) */
static void test_matmul_gemv6(void) {
    kvb_cuda_set_gemv_kernel(6);
    for (int w = 2; w <= 8; w *= 2) { /* 2, 4 and 8 warps a row (KVB_GEMV6_WARPS) */
        kvb_cuda_set_gemv6_warps(w);
        printf("\n    %d warps a row:", w);
        check_matmul(GGML_T_F16, 577, 576, 1);   /* 72 groups: the tail loop only */
        check_matmul(GGML_T_F16, 300, 4096, 1);  /* 512 groups: the unrolled body */
        check_matmul(GGML_T_F16, 129, 4104, 2);  /* 513 groups: the body, then a one-group tail */
        check_matmul(GGML_T_Q8_0, 1536, 1568, 2);
        check_matmul(GGML_T_Q4_1, 100, 14336, 3);
        check_matmul(GGML_T_F16, 64, 1032, 4);
        check_matmul(GGML_T_F16, 333, 100, 3);   /* cols % 8 != 0: the v1 scalar path */
        check_matmul(GGML_T_F16, 3, 8, 2);       /* one group a row */
    }
    kvb_cuda_set_gemv6_warps(4);
    kvb_cuda_set_gemv_kernel(1);
}

static void test_matmul_gemv3(void) { check_gemv_equals_v1(3); }

static void test_matmul_gemv4(void) { check_gemv_equals_v1(4); }

/* v5 (the default) takes v4 from 8192 rows: both sides of the threshold */
static void test_matmul_gemv5(void) {
    check_gemv_equals_v1(5);
    kvb_cuda_set_gemv_kernel(5);
    check_matmul(GGML_T_F16, 8192, 64, 1);
    check_matmul(GGML_T_F16, 8191, 64, 2);
    kvb_cuda_set_gemv_kernel(1);
}

static void test_get_rows(void) {
    const int64_t rows = 1001, cols = 576;
    size_t rb = (size_t)ggml_row_bytes(GGML_T_Q8_0, cols);
    uint8_t *wq = malloc(rb * rows);
    float *tmp = malloc(cols * 4);
    for (int64_t r = 0; r < rows; r++) {
        fill(tmp, cols, 2.0);
        quant_quantize_row(GGML_T_Q8_0, tmp, wq + r * rb, cols);
    }
    kvb_weight w = {wq, GGML_T_Q8_0, rows, cols};
    int32_t ids[5] = {0, 1000, 7, 7, 512}; /* host memory, as the op takes them */
    float *dout = dev_f32(5 * cols), *out = malloc(5 * cols * 4);
    be->get_rows(be, dout, &w, ids, 5);
    get(out, dout, 5 * cols * 4);
    double worst = 0;
    for (int i = 0; i < 5; i++) {
        quant_dequant_row(GGML_T_Q8_0, wq + ids[i] * rb, tmp, cols);
        for (int64_t c = 0; c < cols; c++) {
            double e = fabs(out[i * cols + c] - tmp[c]) / (fabs(tmp[c]) + 1e-6);
            if (e > worst) worst = e;
        }
    }
    printf("\n    get_rows Q8_0: max relative error %.2e (f16 rounding bound 4.9e-4)", worst);
    CU_ASSERT(worst <= 4.9e-4);
    dev_free(dout, 5 * cols * 4);
    free(out);
    keep(wq);
    free(tmp);
}

static void test_rmsnorm_swiglu_add(void) {
    const int64_t n = 1537, rows = 3, bytes = n * rows * 4;
    float *dx = dev_f32(n * rows), *dout = dev_f32(n * rows), *dg = dev_f32(n * rows), *du = dev_f32(n * rows);
    float *x = malloc(bytes), *o = malloc(bytes), *g = malloc(bytes), *u = malloc(bytes);
    float *w = malloc(n * 4), *bias = malloc(n * 4); /* model vectors live in host memory */
    fill(x, n * rows, 3.0);
    fill(w, n, 1.0);
    fill(g, n * rows, 8.0);
    fill(u, n * rows, 1.0);
    fill(bias, n, 0.5);
    put(dx, x, bytes);
    put(dg, g, bytes);
    put(du, u, bytes);
    be->rmsnorm(be, dout, dx, w, n, rows, 1e-5f);
    get(o, dout, bytes);
    double worst = 0;
    for (int64_t r = 0; r < rows; r++) {
        double ss = 0;
        for (int64_t i = 0; i < n; i++) ss += (double)x[r * n + i] * x[r * n + i];
        double sc = 1.0 / sqrt(ss / n + 1e-5);
        for (int64_t i = 0; i < n; i++) {
            double ref = x[r * n + i] * sc * w[i], e = fabs(o[r * n + i] - ref) / (fabs(ref) + 1e-3);
            if (e > worst) worst = e;
        }
    }
    printf("\n    rmsnorm: max relative error %.2e", worst);
    CU_ASSERT(worst <= 1e-5);
    be->swiglu(be, dout, dg, du, n * rows);
    get(o, dout, bytes);
    worst = 0;
    for (int64_t i = 0; i < n * rows; i++) {
        double a = g[i], ref = a / (1 + exp(-a)) * u[i], e = fabs(o[i] - ref) / (fabs(ref) + 1e-3);
        if (e > worst) worst = e;
    }
    printf("\n    swiglu: max relative error %.2e", worst);
    CU_ASSERT(worst <= 1e-5);
    be->add(be, dout, dg, du, n * rows);
    be->add_bias(be, dout, bias, n, rows);
    get(o, dout, bytes);
    worst = 0;
    for (int64_t i = 0; i < n * rows; i++) {
        double ref = (double)g[i] + u[i] + bias[i % n], e = fabs(o[i] - ref);
        if (e > worst) worst = e;
    }
    printf("\n    add + add_bias: max error %.2e", worst);
    CU_ASSERT(worst <= 1e-5);
    dev_free(dx, bytes); dev_free(dout, bytes); dev_free(dg, bytes); dev_free(du, bytes);
    free(x); free(o); free(g); free(u);
    free(w);
    free(bias);
}

static void check_rope(int neox, int head_dim, int n_rot, float base) {
    const int n_tok = 5, n_head = 3;
    const int64_t n = (int64_t)n_tok * n_head * head_dim;
    float *dx = dev_f32(n), *x = malloc(n * 4), *x0 = malloc(n * 4);
    int32_t *pos = kvb_mem_alloc(&mem, KVB_TIER_DEVICE, KVB_MEM_WORKSPACE, n_tok * 4);
    int32_t ps[5] = {0, 1, 17, 4095, 131071};
    put(pos, ps, sizeof ps);
    fill(x0, n, 1.0);
    put(dx, x0, n * 4);
    be->rope(be, dx, n_tok, n_head, head_dim, n_rot, pos, base, neox);
    get(x, dx, n * 4);
    double worst = 0;
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < n_head; h++) {
            const float *r0 = x0 + ((int64_t)t * n_head + h) * head_dim;
            const float *r1 = x + ((int64_t)t * n_head + h) * head_dim;
            for (int i = 0; i < head_dim; i++) {
                double ref = r0[i];
                if (i < n_rot) {
                    int pair = neox ? i % (n_rot / 2) : i / 2;
                    int a = neox ? pair : 2 * pair, b = neox ? pair + n_rot / 2 : 2 * pair + 1;
                    double th = ps[t] * pow(base, -2.0 * pair / n_rot), c = cos(th), s = sin(th);
                    ref = (i == a) ? r0[a] * c - r0[b] * s : r0[a] * s + r0[b] * c;
                }
                double e = fabs(r1[i] - ref);
                if (e > worst) worst = e;
            }
        }
    /* float angles at position 131071 carry ~1e-2 rad of rounding (in ggml too): bound by position */
    printf("\n    rope neox=%d d=%d rot=%d: max abs error %.2e", neox, head_dim, n_rot, worst);
    CU_ASSERT(worst <= 3e-2);
    dev_free(dx, n * 4);
    dev_free(pos, n_tok * 4);
    free(x);
    free(x0);
}

static void test_rope(void) {
    check_rope(0, 64, 64, 100000.0f);
    check_rope(1, 128, 128, 1000000.0f);
    check_rope(0, 80, 32, 10000.0f);
}

/* rope_ext (issue 31) against the CPU backend's op, which follows ggml: the per-pair constants are the CPU's own
 * float code, the angles the same float products; sin and cos may differ in the last bit, and the angle too where
 * the CPU build contracts what the GPU file does not, an error of pos * 2^-23 rad: bound 4e-6 + 3e-7 pos. Cases:
 * Llama 3.1's rope_freqs divisors, linear scaling, YaRN (ramp between the correction dims, magnitude, attn_factor),
 * partial rotation, head_dim 256, both pairings, shuffled positions up to 131071. */
static void check_rope_ext(int neox, int head_dim, int n_rot, kvb_rope_params rp, int with_factors) {
    const int n_tok = 6, n_head = 3;
    const int64_t n = (int64_t)n_tok * n_head * head_dim;
    int32_t ps[6] = {4095, 0, 131071, 17, 1, 700};
    float *x0 = malloc(n * 4), *xc = malloc(n * 4), *xg = malloc(n * 4), *ff = malloc(head_dim / 2 * 4);
    for (int i = 0; i < head_dim / 2; i++) ff[i] = i < head_dim / 8 ? 1.0f : (float)(1.0 + 7.0 * (urand() + 1) / 2);
    rp.freq_factors = with_factors ? ff : NULL;
    fill(x0, n, 1.0);
    memcpy(xc, x0, n * 4);
    cpu->rope_ext(cpu, xc, n_tok, n_head, head_dim, n_rot, ps, neox, &rp);
    float *dx = dev_f32(n);
    int32_t *dpos = kvb_mem_alloc(&mem, KVB_TIER_DEVICE, KVB_MEM_WORKSPACE, sizeof ps);
    put(dx, x0, n * 4);
    put(dpos, ps, sizeof ps);
    be->rope_ext(be, dx, n_tok, n_head, head_dim, n_rot, dpos, neox, &rp);
    get(xg, dx, n * 4);
    CU_ASSERT(be->sync(be) == 0);
    double worst = 0; /* of |error| / bound */
    int64_t same = 0;
    for (int t = 0; t < n_tok; t++)
        for (int64_t i = 0; i < (int64_t)n_head * head_dim; i++) {
            const int64_t k = (int64_t)t * n_head * head_dim + i;
            const double e = fabs((double)xg[k] - xc[k]) / (4e-6 + 3e-7 * ps[t]);
            same += xg[k] == xc[k];
            if (e > worst) worst = e;
        }
    printf("\n    rope_ext neox=%d d=%d rot=%d scale %.3g ext %.0f attn %.3g%s: %lld of %lld equal, max error %.2f of "
           "the bound", neox, head_dim, n_rot, rp.freq_scale, rp.ext_factor, rp.attn_factor,
           with_factors ? " rope_freqs" : "", (long long)same, (long long)n, worst);
    CU_ASSERT(worst <= 1.0);
    dev_free(dx, n * 4);
    kvb_mem_free(&mem, KVB_TIER_DEVICE, KVB_MEM_WORKSPACE, dpos, sizeof ps);
    free(x0), free(xc), free(xg), free(ff);
}

static void test_rope_ext_equals_the_cpu_op(void) {
    const kvb_rope_params plain = {500000.0f, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f, 8192, NULL};
    check_rope_ext(0, 128, 128, plain, 1); /* Llama 3.1: rope_freqs only */
    kvb_rope_params lin = plain;
    lin.freq_base = 10000.0f, lin.freq_scale = 0.25f;
    check_rope_ext(1, 64, 64, lin, 0);     /* linear */
    check_rope_ext(1, 256, 256, lin, 0);   /* gemma3's global layers: head_dim 256, linear */
    kvb_rope_params yarn = {1000000.0f, 0.25f, 1.0f, 1.0f, 32.0f, 1.0f, 4096, NULL};
    check_rope_ext(1, 128, 128, yarn, 0);  /* YaRN */
    yarn.attn_factor = 0.8f;
    check_rope_ext(0, 128, 128, yarn, 1);  /* YaRN with divisors and an attention factor */
    check_rope_ext(1, 80, 32, yarn, 0);    /* partial rotation */
}

/* geglu and scale against the CPU backend's ops, bit for bit: gates across GELU's range, the |x| >= 10 short-cuts
 * on both sides of them, zero, tiny and f16-subnormal gates, in place (out = gate) as the forward pass calls it */
static void test_geglu_and_scale_equal_the_cpu_ops(void) {
    const int64_t n = 70001;
    float *g = malloc(n * 4), *u = malloc(n * 4), *oc = malloc(n * 4), *og = malloc(n * 4);
    for (int64_t i = 0; i < n; i++) g[i] = (float)(urand() * 12.0), u[i] = (float)(urand() * 2.0);
    const float edge[] = {10.0f, -10.0f, 9.999999f, -9.999999f, 10.000001f, -10.000001f, 0.0f, -0.0f, 1e-7f, -3e-6f,
                          6e-8f, 1e-30f, 65504.0f, -1e6f, 0.5f, -0.5f, 3.0f, -3.0f};
    for (size_t i = 0; i < sizeof edge / sizeof *edge; i++) g[i] = edge[i];
    for (int64_t i = 18; i < 18 + 4096; i++) g[i] = (float)((i - 18) / 4096.0 * 20.0 - 10.0); /* a sweep */
    float *dg = dev_f32(n), *du = dev_f32(n);
    put(dg, g, n * 4);
    put(du, u, n * 4);
    be->geglu(be, dg, dg, du, n);
    get(og, dg, n * 4);
    cpu->geglu(cpu, oc, g, u, n);
    int64_t diff = 0;
    for (int64_t i = 0; i < n; i++) diff += memcmp(&og[i], &oc[i], 4) != 0;
    printf("\n    geglu: %lld of %lld differ from the CPU op's bits", (long long)diff, (long long)n);
    CU_ASSERT(diff == 0);
    const float s = sqrtf(640.0f); /* gemma3's embedding scale */
    put(dg, g, n * 4);
    be->scale(be, dg, s, n);
    get(og, dg, n * 4);
    memcpy(oc, g, n * 4);
    cpu->scale(cpu, oc, s, n);
    CU_ASSERT(memcmp(og, oc, n * 4) == 0);
    CU_ASSERT(be->sync(be) == 0);
    dev_free(dg, n * 4), dev_free(du, n * 4);
    free(g), free(u), free(oc), free(og);
}

/* attention through the op table vs float64: KV rows, index lists and outputs in device memory, the per-head
 * arrays on the host, shuffled positions with a causal mask, probabilities and lse. One case per path:
 * the tiled f16 path (head_dim 64, 128), the generic path (odd head_dim, f32 KV), decode (1 query, split keys)
 * and prefill-sized query blocks. */
/* bounds on |error| vs float64 (the tensor-core prefill rounds Q and P to f16: looser) */
static double tol_out = 1e-4, tol_probs = 1e-5, tol_lse = 1e-4;
/* 1: key positions in slot order (pos = slot) instead of shuffled, so a block of early queries masks whole key
 * tiles: the tensor-core prefill's tile skip is taken */
static int ordered_pos;
/* > 0: the cases run through attention_window with this window (visible iff q_pos - window < k_pos <= q_pos) */
static int attn_window;
/* 1: query positions past every key's (q_pos[t] = n_kv + t), so the mask hides nothing: FlashInfer's decode applies */
static int qpos_past_all;
/* 1 (with ordered_pos): the queries are the last n_q keys (q_pos[t] = n_kv - n_q + t), as a prefill chunk appended
 * before its attention: FlashInfer's causal prefill applies */
static int qpos_causal_tail;
/* 1: every head's K and V rows in one device block (K of head g, then its V, head after head), as a per-layer slab
 * would hold them: FlashInfer's layout rule (V at one distance from K) holds whatever the allocator does */
static int kv_slab;

/* check_attention's float64 reference: every (query, head) row's scores, softmax, output and lse against what the
 * kernel wrote, rows split over a thread pool (on one core it was most of this suite's time on a GPU box: 121 s,
 * the 33-billion-product prefill cases above all). Each thread keeps its own worst errors; the caller takes the
 * largest. */
typedef struct {
    int D, HK, G, n_q, n_head;
    int64_t n_kv, longest;
    int use_idx;
    int32_t *const *idx;
    const int64_t *ni;
    const int32_t *hpos, *qpos;
    const float *q;
    const double *kd, *vd;
    const float *out, *probs, *lse;
    float scale;
    double *we, *wp, *wl; /* per thread */
    int *blind;
} attn_ref;

static kvb_pool *ref_pool;

static void attn_ref_rows(void *arg, int ith, int nth) {
    const attn_ref *r = arg;
    const int D = r->D, G = r->G, n_q = r->n_q, n_head = r->n_head;
    const int64_t n_kv = r->n_kv, longest = r->longest;
    double *sc = malloc((size_t)(longest > 0 ? longest : 1) * sizeof(double)), *o = malloc((size_t)D * sizeof(double));
    double we = 0, wp = 0, wl = 0;
    int blind = 0;
    long lo, hi;
    kvb_split((long)n_q * n_head, ith, nth, &lo, &hi);
    for (long row = lo; row < hi && sc && o; row++) {
        const int t = (int)(row / n_head), h = (int)(row % n_head), g = h / G;
        const int32_t *list = r->use_idx ? r->idx[g] : NULL;
        const int64_t len = list ? r->ni[g] : n_kv;
        double m = -INFINITY, l = 0;
        for (int64_t j = 0; j < len; j++) {
            int64_t sl = list ? list[j] : j;
            const int32_t kp = r->hpos[g * n_kv + sl];
            if (kp > r->qpos[t] || (attn_window && (int64_t)r->qpos[t] - kp >= attn_window)) { sc[j] = -INFINITY; continue; }
            double d = 0;
            for (int i = 0; i < D; i++) d += (double)r->q[((int64_t)t * n_head + h) * D + i] * r->kd[((size_t)g * n_kv + sl) * D + i];
            sc[j] = d * r->scale;
            if (sc[j] > m) m = sc[j];
        }
        for (int64_t j = 0; j < len; j++) l += sc[j] == -INFINITY ? 0 : exp(sc[j] - m);
        for (int i = 0; i < D; i++) o[i] = 0;
        for (int64_t j = 0; j < len; j++) {
            double p = sc[j] == -INFINITY ? 0 : exp(sc[j] - m) / l;
            int64_t sl = list ? list[j] : j;
            for (int i = 0; i < D; i++) o[i] += p * r->vd[((size_t)g * n_kv + sl) * D + i];
            double e = fabs(r->probs[((int64_t)h * n_q + t) * longest + j] - p);
            if (e > wp) wp = e;
        }
        for (int i = 0; i < D; i++) {
            double e = fabs(r->out[((int64_t)t * n_head + h) * D + i] - o[i]);
            if (e > we) we = e;
        }
        blind += m == -INFINITY;
        const float ls = r->lse[h * n_q + t];
        double e = m == -INFINITY ? (ls == -INFINITY ? 0 : INFINITY) : fabs(ls - (m + log(l)));
        if (e > wl) wl = e;
    }
    if (!sc || !o) we = INFINITY; /* out of memory fails the check, never passes it */
    r->we[ith] = we, r->wp[ith] = wp, r->wl[ith] = wl, r->blind[ith] = blind;
    free(sc), free(o);
}

static void attn_ref_check(attn_ref *r, double *we, double *wp, double *wl, int *blind) {
    const int nth = kvb_pool_size(ref_pool);
    double *w = calloc((size_t)nth * 3, sizeof(double));
    int *b = calloc((size_t)nth, sizeof(int));
    CU_ASSERT_FATAL(w && b);
    r->we = w, r->wp = w + nth, r->wl = w + 2 * nth, r->blind = b;
    kvb_pool_run(ref_pool, attn_ref_rows, r);
    *we = *wp = *wl = 0, *blind = 0;
    for (int i = 0; i < nth; i++) {
        if (r->we[i] > *we) *we = r->we[i];
        if (r->wp[i] > *wp) *wp = r->wp[i];
        if (r->wl[i] > *wl) *wl = r->wl[i];
        *blind += b[i];
    }
    free(w), free(b);
}

static void check_attention(int D, int HK, int G, int n_q, int64_t n_kv, int f16, int use_idx) {
    const int n_head = HK * G;
    const size_t es = f16 ? 2 : 4;
    void **k = calloc(HK, sizeof *k), **v = calloc(HK, sizeof *v);
    int32_t **kpos = calloc(HK, sizeof *kpos), **idx = calloc(HK, sizeof *idx), **didx = calloc(HK, sizeof *didx);
    int64_t *nk = calloc(HK, sizeof *nk), *ni = calloc(HK, sizeof *ni);
    /* host mirrors of one head's rows and of every head's positions */
    uint8_t *hk = malloc(n_kv * D * es), *hv = malloc(n_kv * D * es);
    int32_t *hpos = malloc((size_t)HK * n_kv * 4);
    double *kd = malloc((size_t)HK * n_kv * D * sizeof(double)), *vd = malloc((size_t)HK * n_kv * D * sizeof(double));
    int64_t longest = 0;
    uint8_t *slab = kv_slab ? kvb_mem_alloc(&mem, KVB_TIER_DEVICE, KVB_MEM_KV, 2 * HK * n_kv * D * es) : NULL;
    for (int g = 0; g < HK; g++) {
        k[g] = slab ? slab + (size_t)(2 * g) * n_kv * D * es : kvb_mem_alloc(&mem, KVB_TIER_DEVICE, KVB_MEM_KV, n_kv * D * es);
        v[g] = slab ? slab + (size_t)(2 * g + 1) * n_kv * D * es : kvb_mem_alloc(&mem, KVB_TIER_DEVICE, KVB_MEM_KV, n_kv * D * es);
        kpos[g] = kvb_mem_alloc(&mem, KVB_TIER_DEVICE, KVB_MEM_KV, n_kv * 4);
        nk[g] = n_kv;
        for (int64_t sl = 0; sl < n_kv; sl++) {
            hpos[g * n_kv + sl] = (int32_t)(ordered_pos ? sl : (sl * 7919) % n_kv); /* shuffled positions */
            for (int i = 0; i < D; i++) {
                size_t o = (size_t)sl * D + i, r = ((size_t)g * n_kv + sl) * D + i;
                float kf = (float)urand(), vf = (float)urand();
                if (f16) {
                    ((kvb_f16 *)hk)[o] = kvb_f32_to_f16(kf);
                    ((kvb_f16 *)hv)[o] = kvb_f32_to_f16(vf);
                    kd[r] = kvb_f16_to_f32(((kvb_f16 *)hk)[o]);
                    vd[r] = kvb_f16_to_f32(((kvb_f16 *)hv)[o]);
                } else {
                    ((float *)hk)[o] = kf;
                    ((float *)hv)[o] = vf;
                    kd[r] = kf;
                    vd[r] = vf;
                }
            }
        }
        put(k[g], hk, n_kv * D * es);
        put(v[g], hv, n_kv * D * es);
        put(kpos[g], hpos + g * n_kv, n_kv * 4);
        if (use_idx && g % 2 == 0) { /* unsorted lists; odd heads read every slot */
            ni[g] = n_kv * 3 / 10 + 1;
            idx[g] = malloc(ni[g] * 4);
            for (int64_t j = 0; j < ni[g]; j++) idx[g][j] = (int32_t)((j * 37 + 11) % n_kv);
            didx[g] = kvb_mem_alloc(&mem, KVB_TIER_DEVICE, KVB_MEM_METHOD, ni[g] * 4);
            put(didx[g], idx[g], ni[g] * 4);
        }
        int64_t len = idx[g] ? ni[g] : n_kv;
        if (len > longest) longest = len;
    }
    const int64_t nqe = (int64_t)n_q * n_head * D;
    const int64_t probs_bytes = (int64_t)n_head * n_q * longest * 4, lse_bytes = (int64_t)n_head * n_q * 4;
    float *q = malloc(nqe * 4), *out = malloc(nqe * 4), *probs = malloc(probs_bytes), *lse = malloc(lse_bytes);
    int32_t *qpos = malloc(n_q * 4);
    fill(q, nqe, 1.0);
    for (int t = 0; t < n_q; t++) qpos[t] = (int32_t)(t == 0 ? n_kv / 10 : (int64_t)t * n_kv / n_q + 3);
    if (qpos_past_all)
        for (int t = 0; t < n_q; t++) qpos[t] = (int32_t)(n_kv + t);
    if (qpos_causal_tail)
        for (int t = 0; t < n_q; t++) qpos[t] = (int32_t)(n_kv - n_q + t);
    /* kernel 5: FlashInfer must serve exactly the calls its rule and layout allow (flashinfer_layout.h) */
    int fi_expect = 0;
    long long fi_served0 = 0;
    if (kvb_cuda_attention_kernel() == 5) {
        uintptr_t *ku = calloc(HK, sizeof *ku), *vu = calloc(HK, sizeof *vu);
        int64_t *len = calloc(HK, sizeof *len);
        int32_t *row = calloc(HK, 4), *ptr = calloc(HK + 1, 4);
        for (int g = 0; g < HK; g++) {
            ku[g] = (uintptr_t)k[g], vu[g] = (uintptr_t)v[g];
            len[g] = use_idx && idx[g] ? ni[g] : n_kv;
        }
        kvb_fi_layout lay;
        char why[160];
        const int decode_ok = n_q == 1 && qpos_past_all && kvb_fi_decode_shape_ok(G, D, f16);
        const int prefill_ok = n_q > 1 && qpos_causal_tail && ordered_pos && !use_idx && f16 && (D == 64 || D == 128) &&
                               !attn_window && n_kv >= n_q && (int64_t)n_q * G > 16;
        fi_expect = kvb_fi_compiled() && (decode_ok || prefill_ok) &&
                    kvb_fi_layout_plan(HK, ku, vu, nk, len, (size_t)D * es, &lay, row, ptr, why, sizeof why) == 0;
        kvb_fi_counts(&fi_served0, NULL);
        free(ku), free(vu), free(len), free(row), free(ptr);
    }
    float *dq = dev_f32(nqe), *dout = dev_f32(nqe), *dprobs = dev_f32(probs_bytes / 4), *dlse = dev_f32(lse_bytes / 4);
    int32_t *dqpos = kvb_mem_alloc(&mem, KVB_TIER_DEVICE, KVB_MEM_WORKSPACE, n_q * 4);
    put(dq, q, nqe * 4);
    put(dqpos, qpos, n_q * 4);
    kvb_attn_args a = {0};
    a.n_q = n_q; a.n_head = n_head; a.n_head_kv = HK; a.head_dim = D;
    a.q = dq; a.q_pos = dqpos; a.kv_dtype = f16 ? KVB_F16 : KVB_F32;
    a.k = (const void *const *)k; a.v = (const void *const *)v; a.k_pos = (const int32_t *const *)kpos; a.n_kv = nk;
    a.idx = use_idx ? (const int32_t *const *)didx : NULL; a.n_idx = use_idx ? ni : NULL;
    a.scale = 1.0f / sqrtf((float)D); a.out = dout; a.probs = dprobs; a.probs_stride = longest; a.lse = dlse;
    a.window = attn_window;
    char err[256];
    int rc = attn_window ? be->attention_window(be, &a, err, sizeof err) : be->attention(be, &a, err, sizeof err);
    if (rc) printf("\n    attention: %s", err);
    CU_ASSERT_FATAL(rc == 0);
    if (kvb_cuda_attention_kernel() == 5) {
        long long fi_served1;
        kvb_fi_counts(&fi_served1, NULL);
        printf("\n    kernel 5: %s", fi_served1 > fi_served0 ? "FlashInfer" : "fell back");
        if (fi_served1 == fi_served0) printf(" (%s)", kvb_fi_last_refusal());
        CU_ASSERT((fi_served1 > fi_served0) == fi_expect);
    }
    get(out, dout, nqe * 4);
    get(probs, dprobs, probs_bytes);
    get(lse, dlse, lse_bytes);
    attn_ref r = {D, HK, G, n_q, n_head, n_kv, longest, use_idx, idx, ni, hpos, qpos, q, kd, vd, out, probs, lse, a.scale, NULL, NULL, NULL, NULL};
    double we, wp, wl;
    int blind; /* rows that see no key (lse must be -inf, out 0) */
    attn_ref_check(&r, &we, &wp, &wl, &blind);
    /* f32 accumulation over up to 20K keys of values in [-1, 1]: errors of a few 1e-6 */
    printf("\n    attention d=%d kv_heads=%d group=%d n_q=%d n_kv=%lld %s%s: out %.2e, probs %.2e, lse %.2e", D, HK, G,
           n_q, (long long)n_kv, f16 ? "f16" : "f32", use_idx ? " idx" : "", we, wp, wl);
    if (attn_window) printf(" (window %d: %d of %d rows see no key)", attn_window, blind, n_q * n_head);
    CU_ASSERT(we <= tol_out);
    CU_ASSERT(wp <= tol_probs);
    CU_ASSERT(wl <= tol_lse);
    for (int g = 0; g < HK; g++) {
        if (!slab) kvb_mem_free(&mem, KVB_TIER_DEVICE, KVB_MEM_KV, k[g], n_kv * D * es);
        if (!slab) kvb_mem_free(&mem, KVB_TIER_DEVICE, KVB_MEM_KV, v[g], n_kv * D * es);
        kvb_mem_free(&mem, KVB_TIER_DEVICE, KVB_MEM_KV, kpos[g], n_kv * 4);
        if (didx[g]) kvb_mem_free(&mem, KVB_TIER_DEVICE, KVB_MEM_METHOD, didx[g], ni[g] * 4);
        free(idx[g]);
    }
    dev_free(dq, nqe * 4); dev_free(dout, nqe * 4); dev_free(dprobs, probs_bytes); dev_free(dlse, lse_bytes);
    kvb_mem_free(&mem, KVB_TIER_DEVICE, KVB_MEM_WORKSPACE, dqpos, n_q * 4);
    if (slab) kvb_mem_free(&mem, KVB_TIER_DEVICE, KVB_MEM_KV, slab, 2 * HK * n_kv * D * es);
    free(k); free(v); free(kpos); free(idx); free(didx); free(nk); free(ni); free(kd); free(vd);
    free(hk); free(hv); free(hpos); free(q); free(qpos);
    free(out); free(probs); free(lse);
}

static void test_attention(void) {
    check_attention(64, 2, 3, 3, 1000, 1, 1);    /* tiled path, rows in two chunks, lists + full heads */
    check_attention(128, 2, 4, 1, 20000, 1, 1);  /* decode, Llama-3 group, split keys */
    check_attention(128, 1, 4, 1, 33, 1, 0);     /* a partial tile */
    check_attention(80, 2, 2, 5, 777, 1, 1);     /* odd head_dim: generic path */
    check_attention(64, 3, 3, 1, 4097, 0, 1);    /* f32 KV */
    check_attention(7, 1, 1, 2, 1, 1, 0);        /* one slot, head_dim 7 */
    check_attention(64, 3, 3, 130, 600, 1, 0);   /* a prefill-sized block of queries */
    check_attention(256, 1, 4, 3, 500, 1, 1);    /* head_dim 256 (gemma3): the generic path */
    check_attention(256, 2, 2, 1, 3000, 0, 0);
}

/* attention_window (issue 31: gemma3's local layers, Mistral) vs float64 with the window in the mask, on every
 * kernel path: windows far smaller than the lists (down to 1: only the key at the query's own position, which index
 * lists may leave out: rows that see nothing, lse -inf), index lists, shuffled and ordered positions, decode and
 * prefill-sized blocks, head_dim 256; each path pinned as the other attention tests pin it */
static void check_window_paths(void) {
    attn_window = 50;   check_attention(64, 2, 3, 3, 1000, 1, 1);
    attn_window = 4096; check_attention(128, 2, 4, 1, 20000, 1, 1);
    attn_window = 10;   check_attention(128, 8, 4, 1, 65, 1, 1);
    attn_window = 300;  check_attention(64, 4, 1, 1, 5000, 1, 1);
    attn_window = 64;   check_attention(64, 3, 3, 130, 600, 1, 0);
    ordered_pos = 1;
    attn_window = 500;  check_attention(128, 2, 4, 3, 2000, 1, 1);
    ordered_pos = 0;
    attn_window = 0;
}

static void test_attention_window(void) {
    check_window_paths();                        /* v1 (tiled), pinned in main */
    attn_window = 100;  check_attention(80, 2, 2, 5, 777, 1, 1);   /* generic path */
    attn_window = 1;    check_attention(64, 3, 3, 1, 4097, 0, 1);  /* f32 KV, window 1 */
    attn_window = 128;  check_attention(256, 1, 4, 3, 500, 1, 1);  /* head_dim 256 */
    attn_window = 0;
    const int was = kvb_cuda_attention_kernel();
    for (int kern = 2; kern <= 4; kern++) { /* v2 (double-buffered), v3 (registers), v4 (tensor-core decode) */
        kvb_cuda_attention_set_kernel(kern);
        check_window_paths();
    }
    kvb_cuda_attention_set_kernel(was);
    kvb_cuda_attention_set_probs_kernel(2);      /* the candidate probabilities pass */
    attn_window = 2000; check_attention(128, 2, 4, 1, 20000, 1, 1);
    attn_window = 64;   check_attention(64, 3, 3, 130, 600, 1, 0);
    attn_window = 0;
    kvb_cuda_attention_set_probs_kernel(1);
    /* prefill on tensor cores: with positions in slot order, tiles a window or more before a whole block of queries
     * are skipped (the skip from below), as are tiles after it */
    const int tc = kvb_cuda_attention_prefill_tc();
    for (int version = 1; version <= 2; version++) { /* v1 and v2 (KVB_PREFILL_TC=2) */
        kvb_cuda_attention_set_prefill_tc(version);
        tol_out = tol_probs = tol_lse = 3e-3;
        attn_window = 64;   check_attention(64, 3, 3, 130, 600, 1, 0);
        attn_window = 100;  check_attention(128, 2, 4, 200, 1000, 1, 1);
        ordered_pos = 1;
        attn_window = 256;  check_attention(128, 2, 4, 200, 4000, 1, 0);
        attn_window = 50;   check_attention(64, 2, 3, 150, 3000, 1, 1);
        attn_window = 1;    check_attention(128, 1, 4, 64, 640, 1, 0);
        attn_window = 512;  check_attention(128, 2, 4, 512, 5000, 1, 0); /* a prefill chunk late in a long cache */
        ordered_pos = 0;
        attn_window = 0;
        tol_out = 1e-4, tol_probs = 1e-5, tol_lse = 1e-4;
    }
    kvb_cuda_attention_set_prefill_tc(tc);
    /* refused: no window, or no positions for the window to narrow */
    char err[256];
    float *dq = dev_f32(64), *dout = dev_f32(64);
    const int64_t one = 1;
    const void *kv[1] = {dq};
    kvb_attn_args a = {0};
    a.n_q = 1, a.n_head = 1, a.n_head_kv = 1, a.head_dim = 64, a.q = dq, a.kv_dtype = KVB_F32, a.k = kv, a.v = kv;
    a.n_kv = &one, a.scale = 0.125f, a.out = dout;
    CU_ASSERT(be->attention_window(be, &a, err, sizeof err) == -1); /* window 0 */
    a.window = 8;
    CU_ASSERT(be->attention_window(be, &a, err, sizeof err) == -1); /* no positions */
    printf("\n    attention_window without positions: %s", err);
    CU_ASSERT(be->sync(be) == 0); /* refusals leave the backend usable */
    dev_free(dq, 64 * 4), dev_free(dout, 64 * 4);
}

/* the double-buffered tiled kernel (v2) on the tiled cases: the same float64 bounds */
static void test_attention_v2(void) {
    const int was = kvb_cuda_attention_kernel();
    kvb_cuda_attention_set_kernel(2);
    check_attention(64, 2, 3, 3, 1000, 1, 1);
    check_attention(128, 2, 4, 1, 20000, 1, 1);
    check_attention(128, 1, 4, 1, 33, 1, 0);
    check_attention(128, 8, 4, 1, 65, 1, 1);     /* two tiles per warp at most: the last buffer switch */
    check_attention(64, 3, 3, 130, 600, 1, 0);
    kvb_cuda_attention_set_kernel(was);
}

/* v3 (register-only, KVB_ATTN_KERNEL=3) and v4 (tensor cores, KVB_ATTN_KERNEL=4) on every shape they take: 4-row and
 * 8-row blocks, head_dim 64 and 128, chunks of rows, index lists, masks, GQA groups of 1 to 7, a list shorter than a
 * warp's pass, a long list over many splits; the float64 bounds of the other kernels */
static void check_decode_kernel(int kernel) {
    const int was = kvb_cuda_attention_kernel();
    kvb_cuda_attention_set_kernel(kernel);
    check_attention(64, 2, 3, 3, 1000, 1, 1);
    check_attention(128, 2, 4, 1, 20000, 1, 1);
    check_attention(128, 1, 4, 1, 33, 1, 0);
    check_attention(128, 8, 4, 1, 65, 1, 1);
    check_attention(64, 3, 3, 130, 600, 1, 0);
    check_attention(64, 4, 1, 1, 5000, 1, 1);
    check_attention(128, 2, 7, 1, 3000, 1, 1);
    check_attention(128, 2, 4, 2, 9, 1, 0);
    check_attention(128, 1, 8, 1, 70001, 1, 0);
    ordered_pos = 1;
    check_attention(128, 2, 4, 3, 2000, 1, 1);
    ordered_pos = 0;
    kvb_cuda_attention_set_kernel(was);
}

static void test_attention_v3(void) { check_decode_kernel(3); }

static void test_attention_v4(void) { check_decode_kernel(4); }

/* v4 with the candidate L2 prefetch (KVB_ATTN_PREFETCH=1 and 2: bulk prefetches of contiguous rows, or an index
 * list's rows one by one): a hint, so the same bounds on every shape, windows included, and no fault from a prefetch
 * past a list's or a split's end */
static void test_attention_v4_prefetch(void) {
    const int was = kvb_cuda_attention_kernel();
    for (int pf = 1; pf <= 2; pf++) {
        kvb_cuda_set_attn_prefetch(pf);
        CU_ASSERT_EQUAL(kvb_cuda_attn_prefetch(), pf);
        check_decode_kernel(4);
        kvb_cuda_attention_set_kernel(4);
        check_window_paths();
        kvb_cuda_attention_set_kernel(was);
    }
    kvb_cuda_set_attn_prefetch(0);
    CU_ASSERT(be->sync(be) == 0);
}

/* the candidate probabilities pass (KVB_PROBS_KERNEL=2): decode and prefill-sized blocks, index lists, masks,
 * more entries than one chunk of a block, head_dim 64 and 128 */
static void test_attention_probs_v2(void) {
    kvb_cuda_attention_set_probs_kernel(2);
    check_attention(64, 2, 3, 3, 1000, 1, 1);
    check_attention(128, 2, 4, 1, 20000, 1, 1);
    check_attention(128, 1, 4, 1, 33, 1, 0);
    check_attention(64, 3, 3, 130, 600, 1, 0);
    check_attention(80, 2, 2, 5, 777, 1, 1); /* odd head_dim: the v1 pass still */
    kvb_cuda_attention_set_probs_kernel(1);
}

/* kernel 5 (KVB_ATTN_KERNEL=5): FlashInfer's paged decode, page size 1, each KV head its own request, where every
 * listed key is visible (queries past every key): dense and with index lists (some heads whole), GQA groups 1 to 8,
 * head_dim 64, 128 and 256, a long list over many splits; its f16 output held to 2e-3, its converted lse to 1e-3;
 * prefill chunks appended at the end of the cache (FA2, causal), head_dim 64/128, 3e-3 like the tensor-core
 * prefill; then the calls it must refuse (keys the mask hides, shuffled prefill positions, index lists in prefill,
 * f32 K/V, a group or head_dim it has no instantiation for, a 16-row prefill), which kvbench's kernels answer to
 * their own bounds. Each case runs with K/V allocated per head, then in one slab. Whether each call was
 * FlashInfer's is checked against the layout rule computed here on the same pointers (check_attention). */
static void test_attention_flashinfer(void) {
    if (!kvb_fi_compiled()) {
        printf("\n    FlashInfer is not in this build (KVB_FLASHINFER off): kernel 5 falls back, checked below");
    }
    const int was = kvb_cuda_attention_kernel();
    long long served0, refused0, served1, refused1;
    kvb_fi_counts(&served0, &refused0);
    kvb_cuda_attention_set_kernel(5);
    for (kv_slab = 0; kv_slab <= 1; kv_slab++) { /* the allocator's layout (FlashInfer where it fits), then slabs */
        printf("\n    K/V %s:", kv_slab ? "in one slab a call" : "allocated per head");
        qpos_past_all = 1;
        tol_out = 2e-3, tol_probs = 1e-4, tol_lse = 1e-3;
        check_attention(128, 2, 4, 1, 20000, 1, 0);  /* dense decode, Llama-3 group */
        check_attention(128, 2, 4, 1, 20000, 1, 1);  /* index lists on even heads, odd heads whole */
        check_attention(64, 3, 3, 1, 1000, 1, 1);
        check_attention(64, 4, 1, 1, 5000, 1, 1);
        check_attention(128, 1, 8, 1, 70001, 1, 0);  /* many splits */
        check_attention(256, 2, 2, 1, 3000, 1, 1);   /* head_dim 256 */
        check_attention(128, 8, 4, 1, 65, 1, 1);
        ordered_pos = 1;
        check_attention(128, 2, 6, 1, 2000, 1, 1);
        ordered_pos = 0;
        tol_out = 1e-4, tol_probs = 1e-5, tol_lse = 1e-4;
        check_attention(128, 2, 7, 1, 3000, 1, 1);   /* refused: group 7 */
        check_attention(80, 2, 2, 1, 777, 1, 1);     /* refused: head_dim 80 */
        check_attention(64, 3, 3, 1, 4097, 0, 1);    /* refused: f32 K/V */
        check_attention(64, 3, 3, 130, 600, 1, 0);   /* refused: prefill positions shuffled */
        qpos_past_all = 0;
        /* prefill (FA2, causal): the queries are the last keys, positions in slot order; f16 Q and P */
        ordered_pos = 1, qpos_causal_tail = 1;
        tol_out = tol_probs = tol_lse = 3e-3;
        check_attention(128, 2, 4, 200, 1000, 1, 0);
        check_attention(64, 3, 3, 130, 600, 1, 0);
        check_attention(128, 8, 4, 512, 8000, 1, 0);
        check_attention(64, 1, 8, 70, 2000, 1, 0);
        check_attention(128, 2, 7, 90, 1500, 1, 0);  /* a group FlashInfer's decode has no instantiation for */
        check_attention(128, 4, 1, 64, 64, 1, 0);    /* as many keys as queries; a 64-row tile */
        check_attention(128, 1, 4, 4, 9, 1, 0);      /* refused: 16 packed rows */
        check_attention(128, 2, 4, 200, 1000, 1, 1); /* refused: index lists */
        check_attention(256, 1, 4, 30, 500, 1, 0);   /* refused: head_dim 256 */
        ordered_pos = 0, qpos_causal_tail = 0;
        tol_out = 1e-4, tol_probs = 1e-5, tol_lse = 1e-4;
    }
    kv_slab = 0;
    check_attention(128, 2, 4, 1, 20000, 1, 1);  /* refused: the mask hides keys */
    attn_window = 2000; check_attention(128, 2, 4, 1, 20000, 1, 1);
    attn_window = 0;
    kvb_cuda_attention_set_kernel(was);
    kvb_fi_counts(&served1, &refused1);
    /* the layout rule decides each call (asserted in check_attention): with per-head allocations FlashInfer serves
     * where the allocator happened to place every V at one distance from its K; the slab pass always fits */
    printf("\n    kernel 5: FlashInfer served %lld calls, refused %lld", served1 - served0, refused1 - refused0);
    CU_ASSERT(!kvb_fi_compiled() || served1 - served0 >= 14); /* at least the slab pass's 8 decodes and 6 prefills */
}

/* prefill on tensor cores (KVB_PREFILL_TC): prefill-sized query blocks, masks by shuffled positions, index
 * lists, a partial last block of queries, head_dim 64 and 128 */
static void test_attention_prefill_tc(void) {
    const int was = kvb_cuda_attention_prefill_tc();
    for (int version = 1; version <= 2; version++) { /* v1, then v2 (KVB_PREFILL_TC=2: GQA rows, cp.async, ldmatrix) */
        printf("\n    prefill tensor cores v%d:", version);
        kvb_cuda_attention_set_prefill_tc(version);
        tol_out = tol_probs = tol_lse = 3e-3;
        check_attention(64, 3, 3, 130, 600, 1, 0);
        check_attention(128, 2, 4, 200, 1000, 1, 1);
        check_attention(128, 1, 4, 64, 64, 1, 0);
        check_attention(128, 8, 4, 300, 5000, 1, 0);
        check_attention(128, 4, 1, 100, 777, 1, 1);  /* no GQA: a block's rows are 128 queries */
        check_attention(64, 1, 8, 70, 2000, 1, 0);   /* a group of 8: 16 queries a block */
        check_attention(128, 2, 7, 90, 1500, 1, 0);  /* a group that does not divide a block's rows */
        ordered_pos = 1; /* positions in slot order: the blocks of early queries skip the key tiles they all mask */
        check_attention(128, 2, 4, 200, 4000, 1, 0);
        check_attention(64, 2, 3, 150, 3000, 1, 1);
        check_attention(128, 8, 4, 512, 8000, 1, 0); /* a prefill chunk at the end of a long cache: most tiles full */
        ordered_pos = 0;
        tol_out = 1e-4, tol_probs = 1e-5, tol_lse = 1e-4;
    }
    kvb_cuda_attention_set_prefill_tc(was);
}

/* kvc_append through the backend's device writer, then the store's rows copied out */
static void test_kv_writer(void) {
    char err[256];
    const int HK = 3, D = 64;
    kvc_store *kv = kvc_create(2, HK, D, KVB_F16, 4, be, &mem, err, sizeof err); /* rows stored by be->kv_writer */
    CU_ASSERT_FATAL(kv != NULL);
    const int64_t n_tok = 37, n = n_tok * HK * D;
    float *dk = dev_f32(n), *dv = dev_f32(n), *k = malloc(n * 4), *v = malloc(n * 4);
    int32_t *dpos = kvb_mem_alloc(&mem, KVB_TIER_DEVICE, KVB_MEM_WORKSPACE, n_tok * 4), pos[37];
    fill(k, n, 4.0);
    fill(v, n, 4.0);
    for (int t = 0; t < n_tok; t++) pos[t] = 1000 + t;
    put(dk, k, n * 4);
    put(dv, v, n * 4);
    put(dpos, pos, n_tok * 4);
    CU_ASSERT_FATAL(kvc_append(kv, 1, 20, dk, dv, dpos, NULL, err, sizeof err) == 0); /* grows past capacity 4 */
    CU_ASSERT_FATAL(kvc_append(kv, 1, 17, dk + 20 * HK * D, dv + 20 * HK * D, dpos + 20, NULL, err, sizeof err) == 0);
    int bad = 0;
    kvb_f16 hk[37 * 64], hv[37 * 64];
    int32_t hp[37], hr[37];
    for (int h = 0; h < HK; h++) {
        kvc_view view = kvc_head_view(kv, 1, h);
        CU_ASSERT_FATAL(view.n == n_tok);
        get(hk, view.k, sizeof hk);
        get(hv, view.v, sizeof hv);
        get(hp, view.pos, sizeof hp);
        get(hr, view.round, sizeof hr);
        for (int64_t t = 0; t < n_tok; t++) {
            bad += hp[t] != 1000 + t || hr[t] != 0;
            for (int i = 0; i < D; i++) {
                bad += hk[t * D + i] != kvb_f32_to_f16(k[(t * HK + h) * D + i]);
                bad += hv[t * D + i] != kvb_f32_to_f16(v[(t * HK + h) * D + i]);
            }
        }
    }
    printf("\n    kv writer: %d mismatching elements of %lld", bad, (long long)(n_tok * HK * (2 * D + 2)));
    CU_ASSERT(bad == 0);
    /* a host-tier (offloaded) layer is written in place through the pinned mapping: one counted copy down */
    CU_ASSERT_FATAL(kvc_set_layer_tier(kv, 0, KVB_TIER_HOST, err, sizeof err) == 0);
    kvb_traffic t0 = be->traffic;
    CU_ASSERT_FATAL(kvc_append(kv, 0, n_tok, dk, dv, dpos, NULL, err, sizeof err) == 0);
    CU_ASSERT_FATAL(be->sync(be) == 0);
    CU_ASSERT(be->traffic.n[KVB_COPY_D2H] - t0.n[KVB_COPY_D2H] == 1);
    CU_ASSERT(be->traffic.bytes[KVB_COPY_D2H] - t0.bytes[KVB_COPY_D2H] == n_tok * HK * kvc_slot_bytes(kv));
    bad = 0;
    for (int h = 0; h < HK; h++) {
        kvc_view view = kvc_head_view(kv, 0, h); /* host memory: read directly */
        CU_ASSERT_FATAL(view.tier == KVB_TIER_HOST && view.n == n_tok);
        for (int64_t t = 0; t < n_tok; t++) {
            bad += view.pos[t] != 1000 + t || view.round[t] != 0;
            for (int i = 0; i < D; i++) {
                bad += ((const kvb_f16 *)view.k)[t * D + i] != kvb_f32_to_f16(k[(t * HK + h) * D + i]);
                bad += ((const kvb_f16 *)view.v)[t * D + i] != kvb_f32_to_f16(v[(t * HK + h) * D + i]);
            }
        }
    }
    printf("\n    kv writer into the host tier: %d mismatching elements", bad);
    CU_ASSERT(bad == 0);
    kvc_free(kv);
    dev_free(dk, n * 4);
    dev_free(dv, n * 4);
    dev_free(dpos, n_tok * 4);
    free(k);
    free(v);
}

int main(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        printf("test_cuda_ops: no CUDA GPU (%s), skipped\n", e != cudaSuccess ? cudaGetErrorString(e) : "no devices");
        return 0;
    }
    char err[256];
    be = kvb_backend_cuda_create(err, sizeof err);
    if (!be) {
        fprintf(stderr, "test_cuda_ops: %s\n", err);
        return 1;
    }
    cpu = kvb_backend_cpu_create(1, err, sizeof err);
    if (!cpu) {
        fprintf(stderr, "test_cuda_ops: %s\n", err);
        return 1;
    }
    kvb_mem_init(&mem);
    kvb_mem_set_allocator(&mem, be->allocator);
    ref_pool = kvb_pool_create(0); /* the float64 references' threads: every CPU this process may use */
    /* every kernel switch pinned to the reference kernels, whatever the environment says (KVB_ATTN_KERNEL,
     * KVB_PREFILL_TC, KVB_PROBS_KERNEL, KVB_GEMV_KERNEL): the cases below hold them to their own bounds, and
     * each candidate's test turns it on for its cases and back off */
    kvb_cuda_attention_set_kernel(1);
    kvb_cuda_attention_set_prefill_tc(0);
    kvb_cuda_attention_set_probs_kernel(1);
    kvb_cuda_set_gemv_kernel(1);
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("CUDA ops vs float64", NULL, NULL);
    CU_add_test(s, "matmul (F16, Q8_0, Q4_1; GEMV and cuBLAS)", test_matmul);
    CU_add_test(s, "matmul through the candidate GEMV (KVB_GEMV_KERNEL=2)", test_matmul_gemv2);
    CU_add_test(s, "matmul through GEMV v3 (KVB_GEMV_KERNEL=3), equal to v1", test_matmul_gemv3);
    CU_add_test(s, "matmul through GEMV v4 (KVB_GEMV_KERNEL=4), equal to v1", test_matmul_gemv4);
    CU_add_test(s, "matmul through GEMV v5 (v4 from 8192 rows, the default), equal to v1", test_matmul_gemv5);
    CU_add_test(s, "matmul through the candidate GEMV v6 (KVB_GEMV_KERNEL=6: four warps a row)", test_matmul_gemv6);
    CU_add_test(s, "fused matmul_n, add_rmsnorm and rope_qk equal the separate ops", test_fused_ops_equal_the_separate_ops);
    CU_add_test(s, "get_rows", test_get_rows);
    CU_add_test(s, "rmsnorm, swiglu, add, add_bias", test_rmsnorm_swiglu_add);
    CU_add_test(s, "rope (llama pairs, neox, partial rotation)", test_rope);
    CU_add_test(s, "rope_ext (rope_freqs, linear, YaRN) equals the CPU op", test_rope_ext_equals_the_cpu_op);
    CU_add_test(s, "geglu and scale equal the CPU ops bit for bit", test_geglu_and_scale_equal_the_cpu_ops);
    CU_add_test(s, "attention through the op table", test_attention);
    CU_add_test(s, "attention v2 (double-buffered tiles) through the op table", test_attention_v2);
    CU_add_test(s, "attention v3 (register-only) through the op table", test_attention_v3);
    CU_add_test(s, "attention v4 (tensor-core decode) through the op table", test_attention_v4);
    CU_add_test(s, "attention v4 with the candidate L2 prefetch (1 and 2 tiles ahead)", test_attention_v4_prefetch);
    CU_add_test(s, "prefill attention on tensor cores through the op table", test_attention_prefill_tc);
    CU_add_test(s, "attention probabilities, candidate pass (KVB_PROBS_KERNEL=2)", test_attention_probs_v2);
    CU_add_test(s, "attention kernel 5 (FlashInfer decode) through the op table, and its refusals", test_attention_flashinfer);
    CU_add_test(s, "attention_window (sliding window) on every kernel path", test_attention_window);
    CU_add_test(s, "KV rows written on the device", test_kv_writer);
    int rc = util_run_suites();
    kvb_pool_free(ref_pool);
    kvb_backend_free(be);
    kvb_backend_free(cpu);
    kvb_mem_destroy(&mem);
    for (int i = 0; i < n_kept; i++) free(kept[i]);
    return rc;
}
