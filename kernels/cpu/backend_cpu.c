/* backend_cpu.c — the CPU implementation of the backend op table (kernels/backend.h).
 * Thin wrappers: the kernels live in matmul.c and ops.c; this file owns the
 * thread pool and the scratch buffers they need, grown on demand and kept. Both memory tiers are the C heap
 * (under KVB_GUARD the device tier is guard.c's arena), and KV rows are stored by an op (kv_writer) like on
 * a GPU, so the engine never writes device-tier bytes itself. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/cpu/arch_ops.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/guard.h"
#include "kernels/cpu/kvops.h"
#include "kernels/cpu/kvquant.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/narrow.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/pool.h"

typedef struct {
    kvb_pool *pool;
    void *act_ws; /* quantized activations for matmul, or the f32 weight panels of the prefill GEMM */
    size_t act_ws_bytes;
    void *attn_ws;
    size_t attn_ws_bytes;
} cpu_impl;

static int grow(void **buf, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t want = need + need / 4 + 4096;
    void *p = NULL;
    if (posix_memalign(&p, 64, want)) return -1;
    free(*buf);
    *buf = p;
    *cap = want;
    return 0;
}

int kvb_backend_cpu_gemm_f32(kvb_gemm gemm) { return gemm == KVB_GEMM_F32 && cpu_gemm_available(); }

/* the f32 GEMM where the engine allows it, the chunk is long enough and the build has OpenBLAS; else integer */
static int use_gemm(const kvb_backend *be, int64_t n_tok) {
    return n_tok >= CPU_GEMM_MIN_TOK && kvb_backend_cpu_gemm_f32(be->gemm);
}

const char *kvb_backend_cpu_gemm_name(kvb_gemm gemm) { return kvb_backend_cpu_gemm_f32(gemm) ? cpu_gemm_name() : "integer"; }

static int cpu_be_matmul(kvb_backend *be, float *out, const kvb_weight *w, const float *x, int64_t n_tok) {
    cpu_impl *im = be->impl;
    const int gemm = use_gemm(be, n_tok);
    size_t need = gemm ? cpu_gemm_ws_bytes(w->cols, n_tok, kvb_pool_size(im->pool))
                       : cpu_matmul_ws_bytes(w->type, w->cols, n_tok);
    if (grow(&im->act_ws, &im->act_ws_bytes, need))
        return snprintf(be->error, sizeof be->error, "out of memory for the matmul workspace (%zu bytes)", need), -1;
    if (gemm ? cpu_gemm(out, w->data, w->type, w->rows, w->cols, x, n_tok, im->act_ws, im->act_ws_bytes, im->pool)
             : cpu_matmul(out, w->data, w->type, w->rows, w->cols, x, n_tok, im->act_ws, im->act_ws_bytes, im->pool))
        return snprintf(be->error, sizeof be->error, "matmul: bad arguments (%s, %lld x %lld)", ggml_type_name(w->type),
                        (long long)w->rows, (long long)w->cols), -1;
    return 0;
}

static void cpu_be_get_rows(kvb_backend *be, float *out, const kvb_weight *w, const int32_t *ids, int64_t n) {
    cpu_get_rows(out, w->data, w->type, w->cols, ids, (int)n);
}

static void cpu_be_rmsnorm(kvb_backend *be, float *out, const float *x, const float *w, int64_t n, int64_t n_rows,
                           float eps) {
    cpu_rmsnorm(out, x, w, n, n_rows, eps);
}

static void cpu_be_rope(kvb_backend *be, float *x, int64_t n_tok, int n_head, int head_dim, int n_rot,
                        const int32_t *pos, float freq_base, int neox) {
    cpu_rope(x, n_tok, n_head, head_dim, n_rot, pos, freq_base, neox);
}

static void cpu_be_swiglu(kvb_backend *be, float *out, const float *gate, const float *up, int64_t n) {
    cpu_swiglu(out, gate, up, n);
}

static void cpu_be_add(kvb_backend *be, float *out, const float *a, const float *b, int64_t n) {
    cpu_add(out, a, b, n);
}

static void cpu_be_add_bias(kvb_backend *be, float *x, const float *bias, int64_t n, int64_t n_rows) {
    for (int64_t r = 0; r < n_rows; r++) cpu_add(x + r * n, x + r * n, bias, n);
}

/* the fusions are the separate ops here (the same bits; nothing to save on the CPU but the engine's path) */
static int cpu_be_matmul_n(kvb_backend *be, int k, float *const *out, const kvb_weight *const *w, const float *x,
                           int64_t n_tok) {
    for (int i = 0; i < k; i++)
        if (cpu_be_matmul(be, out[i], w[i], x, n_tok)) return -1;
    return 0;
}

static void cpu_be_add_rmsnorm(kvb_backend *be, float *x, const float *d, float *out, const float *w, int64_t n,
                               int64_t n_rows, float eps) {
    cpu_add(x, x, d, n * n_rows);
    cpu_rmsnorm(out, x, w, n, n_rows, eps);
}

static void cpu_be_rope_qk(kvb_backend *be, float *q, int n_head, float *k, int n_head_kv, int64_t n_tok, int head_dim,
                           int n_rot, const int32_t *pos, float freq_base, int neox) {
    cpu_rope(q, n_tok, n_head, head_dim, n_rot, pos, freq_base, neox);
    cpu_rope(k, n_tok, n_head_kv, head_dim, n_rot, pos, freq_base, neox);
}

static int cpu_be_attention(kvb_backend *be, const kvb_attn_args *a, char *err, size_t err_len) {
    cpu_impl *im = be->impl;
    cpu_attn_args args = *a;
    size_t need = cpu_attention_ws_bytes(&args, kvb_pool_size(im->pool));
    if (grow(&im->attn_ws, &im->attn_ws_bytes, need)) {
        snprintf(err, err_len, "out of memory for the attention workspace (%zu bytes)", need);
        return -1;
    }
    args.ws = im->attn_ws;
    args.ws_bytes = im->attn_ws_bytes;
    return cpu_attention(&args, im->pool, err, err_len);
}


/* The KV row writer (kvb_kv_writer): rows converted to the store's dtype. */
static int cpu_kv_writer(void *user, int n_head_kv, int head_dim, kvb_dtype dtype, int64_t n_tok, const kvb_kv_rows *dst,
                         const float *k, const float *v, const int32_t *pos, const int32_t *round, char *err,
                         size_t err_len) {
    (void)err, (void)err_len;
    const int64_t stride = (int64_t)n_head_kv * head_dim;
    int to_host = 0;
    for (int h = 0; h < n_head_kv; h++) to_host += dst[h].host != 0;
    if (to_host) { /* rows written into the host tier: one counted copy down, as a GPU's writer counts them */
        kvb_backend *be = user;
        be->traffic.n[KVB_COPY_D2H] += 1;
        be->traffic.bytes[KVB_COPY_D2H] +=
            (int64_t)to_host * n_tok * (int64_t)(2 * (size_t)head_dim * (dtype == KVB_F16 ? 2u : 4u) + 2 * sizeof(int32_t));
    }
    for (int h = 0; h < n_head_kv; h++)
        for (int64_t t = 0; t < n_tok; t++) {
            const float *ks = k + t * stride + (int64_t)h * head_dim, *vs = v + t * stride + (int64_t)h * head_dim;
            if (dtype == KVB_F32) {
                memcpy((float *)dst[h].k + t * head_dim, ks, (size_t)head_dim * sizeof(float));
                memcpy((float *)dst[h].v + t * head_dim, vs, (size_t)head_dim * sizeof(float));
            } else {
                kvb_f16 *kd = (kvb_f16 *)dst[h].k + t * head_dim, *vd = (kvb_f16 *)dst[h].v + t * head_dim;
                for (int i = 0; i < head_dim; i++) kd[i] = kvb_f32_to_f16(ks[i]), vd[i] = kvb_f32_to_f16(vs[i]);
            }
            dst[h].pos[t] = pos[t];
            dst[h].round[t] = round ? round[t] : 0;
        }
    return 0;
}

/* ---- allocator: both tiers on the C heap ---- */

static void *heap_alloc(void *user, kvb_tier tier, size_t bytes) {
    void *p = NULL;
    if (!bytes || posix_memalign(&p, 64, bytes)) return NULL;
    return memset(p, 0, bytes);
}

static void heap_free(void *user, kvb_tier tier, void *p, size_t bytes) { free(p); }

static void heap_copy(void *user, void *dst, const void *src, size_t bytes) { memmove(dst, src, bytes); }

static const kvb_allocator heap_allocator = {heap_alloc, heap_free, heap_copy, NULL};

static void cpu_be_free(kvb_backend *be) {
    cpu_impl *im = be->impl;
    if (im) {
        kvb_pool_free(im->pool);
        free(im->act_ws);
        free(im->attn_ws);
        free(im);
    }
    free(be);
}

kvb_pool *cpu_backend_pool(const kvb_backend *be) { return ((const cpu_impl *)be->impl)->pool; }

int kvb_backend_cpu_default_threads(void) { return kvb_pool_default_threads(); }

kvb_backend *kvb_backend_cpu_create(int n_threads, char *err, size_t err_len) {
    kvb_backend *be = calloc(1, sizeof *be);
    cpu_impl *im = calloc(1, sizeof *im);
    if (!be || !im) {
        free(be);
        free(im);
        snprintf(err, err_len, "out of memory creating the CPU backend");
        return NULL;
    }
    im->pool = kvb_pool_create(n_threads);
    if (!im->pool) {
        free(be);
        free(im);
        snprintf(err, err_len, "could not start the CPU thread pool");
        return NULL;
    }
    be->name = "cpu";
    be->n_threads = kvb_pool_size(im->pool);
    be->matmul = cpu_be_matmul;
    be->get_rows = cpu_be_get_rows;
    be->rmsnorm = cpu_be_rmsnorm;
    be->rope = cpu_be_rope;
    be->swiglu = cpu_be_swiglu;
    be->add = cpu_be_add;
    be->add_bias = cpu_be_add_bias;
    be->matmul_n = cpu_be_matmul_n;
    be->add_rmsnorm = cpu_be_add_rmsnorm;
    be->rope_qk = cpu_be_rope_qk;
    be->attention = cpu_be_attention;
    be->free = cpu_be_free;
    be->kv_writer = cpu_kv_writer;
    cpu_install_data_ops(be);
    cpu_install_kvquant_ops(be);
    cpu_install_narrow_ops(be); /* gather_cols, attention_narrow (narrow.c) */
    cpu_install_arch_ops(be); /* rope_ext, geglu, scale, attention_window (arch_ops.c) */
    be->impl = im;
    be->allocator = &heap_allocator;
    return kvb_guard_wanted() ? kvb_guard_wrap(be, err, err_len) : be;
}
