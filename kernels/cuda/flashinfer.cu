/* flashinfer.cu — attention kernel 5 (flashinfer.h): decides per call whether FlashInfer's paged decode or causal
 * prefill gives kvbench's answer (flashinfer_layout.h: the layout and the mask rule), builds its page indices on the
 * device from kvbench's per-head pointers and index lists, calls the instantiation of the head_dim
 * (kernels/cuda/flashinfer/, built only with KVB_FLASHINFER) and converts its f16 output and base-2 log-sum-exp to
 * kvbench's f32 output and natural log-sum-exp (prefill: and its request-major rows back to kvbench's order). Every
 * refused call goes to kvbench's own kernels (attention.cu).
 *
 * The KV heads must be one slab (flashinfer_layout.h): the KV store lays a layer out so when kernel 5 is chosen
 * (engine/kvcache.h, KVC_LAYOUT_SLAB), and FlashInfer then reads it in place from the slab's lowest head, each head's
 * pages at its region's offset. Every refusal is counted by reason (kvb_fi_refused_for), the first of each reason
 * written to stderr, and a process that called kernel 5 writes its counts at exit: a head moved to the host tier
 * takes its layer out of one slab, so its calls go to v4 and show as "not one slab".
 *
 * The plan needs the per-head lengths on the host: from c->host_heads when the caller has them, else read back
 * from the device (a wait for the stream), as is the mask check's verdict. The pinned staging those copies and
 * FlashInfer's plan use is a ring of slots, each reused only after the event recorded behind its call's copies (one
 * caller at a time, like the kernel switches). */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/attn_split.cuh"
#include "kernels/cuda/flashinfer.h"
#include "kernels/cuda/flashinfer/fi_inst.h"
#include "kernels/cuda/flashinfer_layout.h"

static long long g_served, g_refused, g_refused_for[KVB_FI_WHY_COUNT];
static char g_refusal[192] = "";

extern "C" void kvb_fi_counts(long long *served, long long *refused) {
    if (served) *served = g_served;
    if (refused) *refused = g_refused;
}

extern "C" const char *kvb_fi_last_refusal(void) { return g_refusal; }

extern "C" long long kvb_fi_refused_for(kvb_fi_why why) {
    return why >= 0 && why < KVB_FI_WHY_COUNT ? g_refused_for[why] : 0;
}

/* at exit, where kernel 5 was called: did FlashInfer run the attention, or kvbench's kernels (and why)? */
static void report_at_exit(void) {
    fprintf(stderr,
            "kvbench: attention kernel 5: FlashInfer served %lld calls, refused %lld (not one slab %lld, shape %lld, "
            "mask %lld, other %lld)\n",
            g_served, g_refused, g_refused_for[KVB_FI_NOT_SLAB], g_refused_for[KVB_FI_SHAPE],
            g_refused_for[KVB_FI_MASK], g_refused_for[KVB_FI_OTHER]);
}

static void note_call(void) {
    static int registered;
    if (!registered) registered = 1, atexit(report_at_exit);
}

/* 0, with the reason kept for kvb_fi_last_refusal, counted by kind, written to stderr the first time of its kind,
 * and given to the caller */
static int refuse(char *err, size_t err_len, kvb_fi_why kind, const char *why) {
    static const char *const names[KVB_FI_WHY_COUNT] = {"not one slab", "shape", "mask", "other"};
    g_refused++;
    if (!g_refused_for[kind]++)
        fprintf(stderr, "kvbench: attention kernel 5: kvbench's kernels run the calls FlashInfer refuses (%s), "
                        "counted from here; the first: %s\n", names[kind], why);
    snprintf(g_refusal, sizeof g_refusal, "%s", why);
    snprintf(err, err_len, "%s", why);
    return 0;
}

#ifndef KVB_HAVE_FLASHINFER

extern "C" int kvb_fi_compiled(void) { return 0; }
extern "C" size_t kvb_fi_ws(const kvb_cuda_attn *a) { (void)a; return 0; }
extern "C" int kvb_fi_attention(kvb_cuda_attn *c, void *ws, size_t ws_bytes, void *stream, char *err, size_t err_len) {
    (void)c, (void)ws, (void)ws_bytes, (void)stream;
    note_call();
    return refuse(err, err_len, KVB_FI_OTHER,
                  "flashinfer: not in this build (KVB_FLASHINFER off: scripts/setup.sh fetches its headers)");
}

#else

extern "C" int kvb_fi_compiled(void) { return 1; }

static size_t up256(size_t n) { return (n + 255) & ~(size_t)255; }


/* Bounds from FlashInfer's DecodePlan: the requests after splitting are at most max(n_req, the plan's grid), and its
 * grid is at most 32 blocks an SM (the hardware's limit of resident blocks). */
extern "C" void kvb_fi_decode_ws(int n_req, int group, int head_dim, int sms, size_t *int_bytes, size_t *float_bytes) {
    const size_t P = (size_t)(n_req > 32 * sms ? n_req : 32 * sms);
    *int_bytes = 3 * (P + 1) * 4 + 4 + P + 6 * 16 + 256;
    *float_bytes = (size_t)group * P * (size_t)head_dim * 4 + (size_t)group * P * 4 + 3 * 16 + 256; /* sized as f32 */
}

extern "C" size_t kvb_fi_prefill_int_ws(int n_req, int group, int64_t n_q) {
    const size_t P = (size_t)n_req * (size_t)((n_q * group + 15) / 16 + 1);
    return 3 * P * 4 + ((size_t)n_req + 1) * 4 + 4 + 5 * 16 + 256;
}

/* the device workspace of one call, in this order */
struct fi_ws {
    int32_t *flag;                     /* the mask check's verdict: 1 = FlashInfer's mask would differ */
    int32_t *head_row, *indptr, *last; /* [H], [H+1], [H], then qo_indptr [H+1] (one copy from the staging) */
    int32_t *qo_indptr;
    int32_t *indices;                  /* [H * max_len] at most */
    __half *q_h, *out_h;               /* [n_q][n_head][head_dim] each (q_h: prefill only) */
    float *lse2;                       /* [n_q][n_head]: FlashInfer's base-2 lse (prefill; decode writes in place) */
    float *lse;                        /* [n_head][n_q]: natural lse for the probabilities when the caller gave none */
    void *int_ws, *float_ws;
    size_t int_bytes, float_bytes, small_bytes, total;
};

static fi_ws carve(const kvb_cuda_attn *a, void *base) {
    fi_ws w;
    memset(&w, 0, sizeof w);
    const int H = a->n_head_kv, G = a->n_head / H;
    const bool pre = a->n_q > 1;
    size_t fi_int = 0, fi_float = 0;
    if (pre) fi_int = kvb_fi_prefill_int_ws(H, G, a->n_q);
    else kvb_fi_decode_ws(H, G, a->head_dim, kvb_cuda_sm_count(), &fi_int, &fi_float);
    const size_t rows = (size_t)a->n_q * (size_t)a->n_head;
    char *p = (char *)base;
    size_t off = 0;
#define TAKE(field, type, bytes) (w.field = (type)(p ? p + off : NULL), off += up256(bytes))
    TAKE(flag, int32_t *, 4);
    w.small_bytes = (4 * (size_t)H + 2) * 4;
    TAKE(head_row, int32_t *, w.small_bytes);
    if (p) w.indptr = w.head_row + H, w.last = w.head_row + 2 * H + 1, w.qo_indptr = w.head_row + 3 * H + 1;
    TAKE(indices, int32_t *, (size_t)H * (size_t)a->max_len * 4);
    if (pre) TAKE(q_h, __half *, rows * a->head_dim * 2);
    TAKE(out_h, __half *, rows * a->head_dim * 2);
    if (pre) TAKE(lse2, float *, rows * 4);
    TAKE(lse, float *, rows * 4);
    TAKE(int_ws, void *, fi_int);
    if (fi_float) TAKE(float_ws, void *, fi_float);
#undef TAKE
    w.int_bytes = fi_int;
    w.float_bytes = fi_float;
    w.total = off;
    return w;
}

/* the shapes kernel 5 may take at all; NULL, or why not */
static const char *shape_refusal(const kvb_cuda_attn *a) {
    if (a->max_len < 1) return "flashinfer: an empty list";
    if (a->n_q > 1) { /* prefill: FA2, causal, head_dim 64 and 128 */
        if (!a->kv_f16 || (a->head_dim != 64 && a->head_dim != 128))
            return "flashinfer: prefill is instantiated for f16 K/V and head_dim 64/128 only";
        if (a->window > 0) return "flashinfer: prefill with a window is not instantiated";
        if (!a->q_pos || !a->k_pos) return "flashinfer: prefill without positions (no mask) is not instantiated";
        if (a->n_q * (int64_t)a->n_head > INT32_MAX / 2) return "flashinfer: prefill past int32 rows";
        if (a->n_q * (int64_t)(a->n_head / a->n_head_kv) <= 16) /* FlashInfer's plan would pick a 16-row tile */
            return "flashinfer: a prefill of 16 packed rows or fewer (query tile 16 is not instantiated)";
        return NULL;
    }
    if (!kvb_fi_decode_shape_ok(a->n_head / a->n_head_kv, a->head_dim, a->kv_f16))
        return "flashinfer: not an instantiated shape (f16 K/V, head_dim 64/128/256, GQA group 1/2/3/4/6/8/16)";
    return NULL;
}

extern "C" size_t kvb_fi_ws(const kvb_cuda_attn *a) {
    if (a->n_head_kv < 1 || a->n_head % a->n_head_kv || a->n_q < 1 || shape_refusal(a)) return 0;
    return carve(a, NULL).total;
}

/* 1 in *flag unless FlashInfer's causal mask is kvbench's for this prefill: every head has positions, in slot order,
 * ending at the last query's, and the queries' positions are consecutive (flashinfer_layout.h) */
__global__ void k_fi_prefill_positions(kvb_cuda_attn a, int32_t *flag) {
    const int g = blockIdx.y;
    const int32_t *kp = a.k_pos[g];
    if (!kp) { *flag = 1; return; }
    const int64_t n = a.n_kv[g];
    const int64_t first = (int64_t)a.q_pos[a.n_q - 1] - (n - 1);
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += (int64_t)gridDim.x * blockDim.x)
        if (kp[j] != first + j) *flag = 1;
    if (g == 0)
        for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < a.n_q; t += (int64_t)gridDim.x * blockDim.x)
            if ((int64_t)a.q_pos[t] != (int64_t)a.q_pos[0] + t) *flag = 1;
}

/* prefill's queries as FlashInfer's requests read them: f32 [t][g*G + r][d] -> f16 [g][t][r][d] */
__global__ void k_fi_q_to_requests(const float *q, __half *q_h, int64_t n_q, int H, int G, int D) {
    const int64_t n = n_q * H * G * (int64_t)D;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int d = (int)(i % D);
        const int64_t row = i / D; /* (g, t, r) */
        const int r = (int)(row % G);
        const int64_t t = (row / G) % n_q, g = row / G / n_q;
        q_h[i] = __float2half(q[(t * H * G + g * G + r) * D + d]);
    }
}

/* prefill's outputs back: f16 [g][t][r][d] -> f32 [t][g*G + r][d]; base-2 lse [g][t][r] -> natural [g*G + r][t] */
__global__ void k_fi_prefill_finish(const __half *out_h, float *out, const float *lse2, float *lse, int64_t n_q, int H,
                                    int G, int D) {
    const int64_t n = n_q * H * G * (int64_t)D;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int d = (int)(i % D);
        const int64_t row = i / D;
        const int r = (int)(row % G);
        const int64_t t = (row / G) % n_q, g = row / G / n_q;
        out[(t * H * G + g * G + r) * D + d] = __half2float(out_h[i]);
        if (lse && d == 0) lse[(g * G + r) * n_q + t] = kvb_fi_lse_natural(lse2[row]);
    }
}

/* 1 in *flag when kvbench's mask hides a listed key of some head (decode: the one query's position) */
__global__ void k_fi_any_hidden(kvb_cuda_attn a, int32_t *flag) {
    const int g = blockIdx.y;
    const int32_t *kp = a.k_pos[g];
    if (!kp) return;
    const int32_t *ix = a.idx ? a.idx[g] : NULL;
    const int64_t len = ix ? a.n_idx[g] : a.n_kv[g];
    const int32_t qp = a.q_pos[0];
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < len; j += (int64_t)gridDim.x * blockDim.x)
        if (key_hidden(kp[ix ? ix[j] : j], qp, a.window)) *flag = 1;
}

/* FlashInfer's page indices: entry j of head g is page head_row[g] + slot (flashinfer_layout.h) */
__global__ void k_fi_pages(kvb_cuda_attn a, const int32_t *head_row, const int32_t *indptr, int32_t *indices) {
    const int g = blockIdx.y;
    const int32_t *ix = a.idx ? a.idx[g] : NULL;
    const int64_t len = indptr[g + 1] - indptr[g];
    int32_t *dst = indices + indptr[g];
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < len; j += (int64_t)gridDim.x * blockDim.x)
        dst[j] = kvb_fi_page(head_row[g], ix ? ix[j] : (int32_t)j);
}

/* f16 output -> kvbench's f32 output; base-2 lse -> natural, in place (decode: row h of [H][G] is head h) */
__global__ void k_fi_finish(const __half *out_h, float *out, int64_t n, float *lse, int n_head) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        out[i] = __half2float(out_h[i]);
        if (lse && i < n_head) lse[i] = kvb_fi_lse_natural(lse[i]);
    }
}

/* pinned staging: the per-head words read back [6H] and the verdict, head_row/indptr/last [3H+1], the plan's
 * page-locked int workspace. A ring of slots, each reused after the event recorded behind its call's copies, so
 * back-to-back calls do not wait for each other's kernels. */
enum { STAGE_RING = 8 };
static struct {
    void *host;
    size_t bytes;
    cudaEvent_t done;
} g_stage[STAGE_RING];
static int g_stage_next;

static void *stage(int slot, size_t bytes, char *err, size_t err_len) {
    if (!g_stage[slot].done && cudaEventCreateWithFlags(&g_stage[slot].done, cudaEventDisableTiming) != cudaSuccess) {
        snprintf(err, err_len, "flashinfer: cudaEventCreate failed");
        return NULL;
    }
    if (cudaEventSynchronize(g_stage[slot].done) != cudaSuccess) { /* that call's copies out of the slot */
        snprintf(err, err_len, "flashinfer: %s", cudaGetErrorString(cudaGetLastError()));
        return NULL;
    }
    if (bytes <= g_stage[slot].bytes) return g_stage[slot].host;
    if (g_stage[slot].host) cudaFreeHost(g_stage[slot].host);
    g_stage[slot].bytes = 0;
    if (cudaMallocHost(&g_stage[slot].host, bytes + bytes / 4) != cudaSuccess) {
        g_stage[slot].host = NULL;
        snprintf(err, err_len, "flashinfer: cudaMallocHost of %zu bytes failed", bytes);
        return NULL;
    }
    g_stage[slot].bytes = bytes + bytes / 4;
    return g_stage[slot].host;
}

#define FI_CK(call)                                                                                                   \
    do {                                                                                                              \
        cudaError_t e_ = (call);                                                                                      \
        if (e_ != cudaSuccess) {                                                                                      \
            snprintf(err, err_len, "flashinfer: %s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            return -1;                                                                                                \
        }                                                                                                             \
    } while (0)

static unsigned grid_of(int64_t n) { return (unsigned)((n + 255) / 256 < 1024 ? (n + 255) / 256 : 1024); }

extern "C" int kvb_fi_attention(kvb_cuda_attn *c, void *ws, size_t ws_bytes, void *stream, char *err, size_t err_len) {
    note_call();
    const char *why = shape_refusal(c);
    if (why) return refuse(err, err_len, c->max_len < 1 ? KVB_FI_OTHER : KVB_FI_SHAPE, why);
    const int H = c->n_head_kv, G = c->n_head / H, D = c->head_dim;
    if (H > KVB_FI_MAX_HEADS)
        return refuse(err, err_len, KVB_FI_SHAPE, "flashinfer: more KV heads than kernel 5 plans for");
    const bool pre = c->n_q > 1;
    const fi_ws w = carve(c, ws);
    if (ws_bytes < w.total) return refuse(err, err_len, KVB_FI_OTHER, "flashinfer: workspace sized without kernel 5");
    const cudaStream_t s = (cudaStream_t)stream;
    const size_t words = 6 * (size_t)H * 8;
    const int slot = g_stage_next;
    g_stage_next = (slot + 1) % STAGE_RING;
    void *host = stage(slot, up256(words + 8) + up256(w.small_bytes) + w.int_bytes, err, err_len);
    if (!host) return -1;
    uint64_t *hw = (uint64_t *)host; /* k[H] v[H] k_pos[H] n_kv[H] idx[H] n_idx[H], then the verdict */
    int32_t *verdict = (int32_t *)(hw + 6 * H);
    int32_t *hsmall = (int32_t *)((char *)host + up256(words + 8));
    void *plan_h = (char *)hsmall + up256(w.small_bytes);
    bool wait = false;
    if (c->host_heads) {
        memcpy(hw, c->host_heads, words);
    } else { /* the per-head words, read back (the arrays may be anywhere: one copy each) */
        FI_CK(cudaMemcpyAsync(hw + 0 * H, c->k, H * 8, cudaMemcpyDeviceToHost, s));
        FI_CK(cudaMemcpyAsync(hw + 1 * H, c->v, H * 8, cudaMemcpyDeviceToHost, s));
        FI_CK(cudaMemcpyAsync(hw + 3 * H, c->n_kv, H * 8, cudaMemcpyDeviceToHost, s));
        if (c->idx) {
            FI_CK(cudaMemcpyAsync(hw + 4 * H, c->idx, H * 8, cudaMemcpyDeviceToHost, s));
            FI_CK(cudaMemcpyAsync(hw + 5 * H, c->n_idx, H * 8, cudaMemcpyDeviceToHost, s));
        } else {
            memset(hw + 4 * H, 0, 2 * (size_t)H * 8);
        }
        wait = true;
    }
    *verdict = 0;
    if (c->q_pos && c->k_pos) { /* decode: does the mask hide a listed key? prefill: is it FlashInfer's causal mask? */
        FI_CK(cudaMemsetAsync(w.flag, 0, 4, s));
        if (pre) k_fi_prefill_positions<<<dim3(grid_of(c->max_len), (unsigned)H), 256, 0, s>>>(*c, w.flag);
        else k_fi_any_hidden<<<dim3(grid_of(c->max_len), (unsigned)H), 256, 0, s>>>(*c, w.flag);
        FI_CK(cudaGetLastError());
        FI_CK(cudaMemcpyAsync(verdict, w.flag, 4, cudaMemcpyDeviceToHost, s));
        wait = true;
    }
    if (wait) FI_CK(cudaStreamSynchronize(s));
    uintptr_t kh[KVB_FI_MAX_HEADS], vh[KVB_FI_MAX_HEADS];
    int64_t nk[KVB_FI_MAX_HEADS], len[KVB_FI_MAX_HEADS];
    for (int g = 0; g < H; g++) {
        kh[g] = (uintptr_t)hw[0 * H + g];
        vh[g] = (uintptr_t)hw[1 * H + g];
        nk[g] = (int64_t)hw[3 * H + g];
        len[g] = c->idx && hw[4 * H + g] ? (int64_t)hw[5 * H + g] : nk[g];
        if (pre && c->idx && hw[4 * H + g])
            return refuse(err, err_len, KVB_FI_MASK, "flashinfer: prefill over index lists");
        if (pre && nk[g] < c->n_q)
            return refuse(err, err_len, KVB_FI_MASK, "flashinfer: prefill with fewer keys than queries");
    }
    if (*verdict)
        return refuse(err, err_len, KVB_FI_MASK, pre ? "flashinfer: prefill positions are not FlashInfer's causal order"
                                        : "flashinfer: the mask hides a listed key (decode attends over whole lists)");
    int32_t *head_row = hsmall, *indptr = hsmall + H, *last = hsmall + 2 * H + 1, *qo_indptr = hsmall + 3 * H + 1;
    kvb_fi_layout lay;
    char why_lay[160];
    if (kvb_fi_layout_plan(H, kh, vh, nk, len, (size_t)D * 2, &lay, head_row, indptr, why_lay, sizeof why_lay))
        return refuse(err, err_len, strstr(why_lay, "not one slab") ? KVB_FI_NOT_SLAB : KVB_FI_OTHER, why_lay);
    for (int g = 0; g < H; g++) last[g] = 1;
    for (int g = 0; g <= H; g++) qo_indptr[g] = (int32_t)(g * c->n_q);
    FI_CK(cudaMemcpyAsync(w.head_row, hsmall, w.small_bytes, cudaMemcpyHostToDevice, s));
    k_fi_pages<<<dim3(grid_of(c->max_len), (unsigned)H), 256, 0, s>>>(*c, w.head_row, w.indptr, w.indices);
    FI_CK(cudaGetLastError());
    float *lse_out = c->lse ? c->lse : c->probs ? w.lse : NULL; /* the probabilities' pass reads the natural lse */
    int rc;
    if (pre) {
        const int64_t n = c->n_q * (int64_t)c->n_head * D;
        k_fi_q_to_requests<<<grid_of(n), 256, 0, s>>>(c->q, w.q_h, c->n_q, H, G, D);
        FI_CK(cudaGetLastError());
        kvb_fi_prefill_args fa;
        memset(&fa, 0, sizeof fa);
        fa.n_req = H, fa.group = G, fa.n_q = (int)c->n_q, fa.q_h = w.q_h;
        fa.k_base = (const void *)lay.k_base, fa.v_base = (const void *)lay.v_base;
        fa.indices = w.indices, fa.kv_indptr = w.indptr, fa.last_page_len = w.last, fa.qo_indptr = w.qo_indptr;
        fa.kv_indptr_h = indptr, fa.qo_indptr_h = qo_indptr, fa.scale = c->scale, fa.out_h = w.out_h;
        fa.lse2 = lse_out ? w.lse2 : NULL, fa.int_ws = w.int_ws, fa.int_ws_h = plan_h, fa.int_ws_bytes = w.int_bytes;
        fa.stream = s, fa.err = err, fa.err_len = err_len;
        rc = D == 64 ? kvb_fi_prefill_d64(&fa) : kvb_fi_prefill_d128(&fa);
        FI_CK(cudaEventRecord(g_stage[slot].done, s)); /* the slot's copies are behind this */
        if (rc == 0)
            return refuse(err, err_len, KVB_FI_SHAPE, "flashinfer: its plan chose a query tile not instantiated (64, 128)");
        if (rc < 0) return -1;
        k_fi_prefill_finish<<<grid_of(n), 256, 0, s>>>(w.out_h, c->out, w.lse2, lse_out, c->n_q, H, G, D);
    } else {
        kvb_fi_decode_args fa;
        memset(&fa, 0, sizeof fa);
        fa.n_req = H, fa.group = G, fa.q = c->q, fa.k_base = (const void *)lay.k_base, fa.v_base = (const void *)lay.v_base;
        fa.indices = w.indices, fa.indptr = w.indptr, fa.last_page_len = w.last, fa.indptr_h = indptr;
        fa.scale = c->scale, fa.out_h = w.out_h, fa.lse2 = lse_out; /* [H][G] = kvbench's [n_head] for one query */
        fa.int_ws = w.int_ws, fa.float_ws = w.float_ws, fa.int_ws_h = plan_h;
        fa.int_ws_bytes = w.int_bytes, fa.float_ws_bytes = w.float_bytes, fa.stream = s, fa.err = err, fa.err_len = err_len;
        rc = D == 64 ? kvb_fi_decode_d64(&fa) : D == 128 ? kvb_fi_decode_d128(&fa) : kvb_fi_decode_d256(&fa);
        FI_CK(cudaEventRecord(g_stage[slot].done, s)); /* the slot's copies are behind this */
        if (rc) return -1;
        const int64_t n = (int64_t)c->n_head * D;
        k_fi_finish<<<grid_of(n), 256, 0, s>>>(w.out_h, c->out, n, lse_out, c->n_head);
    }
    FI_CK(cudaGetLastError());
    c->lse = lse_out;
    g_served++;
    return 1;
}

#endif
