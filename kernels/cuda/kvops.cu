/* kvops.cu — the CUDA backend's data ops (kernels/backend.h, "data ops"): one small kernel per op on the
 * backend's stream, checked after every launch.
 *
 * Numerics: where the header fixes a summation order, a thread owns an output and loops in that order; this
 * file is compiled without fast math (CMakeLists.txt: -ftz=false -prec-div=true -fmad=false), so float and
 * double arithmetic rounds as on the CPU and those outputs match the CPU backend bit for bit. Only the double
 * exp and log of pod_share and pod_merge may differ from glibc in the last bit. top-k is a one-block radix
 * select (O(n)), or for n <= 1024 a one-block rank in shared memory; round_scores still runs a thread per round
 * over all probabilities.
 *
 * Moves between tiers (be->traffic counts every array copied, as the CPU backend does):
 * - copy: one cudaMemcpyAsync (overlapping device ranges go through scratch: still one counted copy);
 * - kv_gather D2D: one kernel, counted as 4 D2D copies (K, V, pos, round) of the rows gathered;
 * - kv_gather H2D: the host packs the indexed rows of the (pinned) host-tier head into pinned staging and
 *   makes one copy per array; without an index list the arrays are copied as they are;
 * - kv_gather D2H: without an index list one copy per array straight into the host-tier head; with one, one
 *   copy per array of the span of slots the list covers into staging, a stream sync, and the host unpacks:
 *   the bytes counted are the span's, which is what crossed.
 * - kv_load: one kernel reads the listed rows of every head straight from the pinned host tier (mapped into the
 *   device's address space: UVA) into place, after one copy up of the index lists and head table: counted as
 *   one H2D copy of the rows' bytes plus that table's.
 * An H2D source in pinned memory is read asynchronously: the host must not change it before be->sync.
 * Preconditions the host can see (negative host indices, bad shapes) give -1 with one line in err; device
 * index lists are trusted, and kv_evict without a candidate stops evicting (the CPU backend reports it). */
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "base/evict_plan.h"
}
#include "kernels/cuda/kvops.h"

/* CK(call): 0, or -1 with the failure recorded in be->error (needs `o` in scope); CK_LAUNCH: the same for the
 * launch just made. */
#define CK(call) ck(o, (call), #call, __FILE__, __LINE__)
#define CK_LAUNCH(kernel) ck(o, cudaGetLastError(), #kernel "<<<>>>", __FILE__, __LINE__)

static cuda_kvops *OPS(kvb_backend *be) { return (cuda_kvops *)be->impl; }

static int ck(cuda_kvops *o, cudaError_t e, const char *call, const char *file, int line) {
    if (e == cudaSuccess) return 0;
    const char *base = strrchr(file, '/');
    if (!o->be->error[0]) /* the first failure wins: later ones are usually its consequences */
        snprintf(o->be->error, sizeof o->be->error, "cuda: %s:%d: %s: %s", base ? base + 1 : file, line, call,
                 cudaGetErrorString(e));
    return -1;
}

/* an int-returning op's answer once the backend has failed */
static int failed(cuda_kvops *o, char *err, size_t err_len) {
    snprintf(err, err_len, "%s", o->be->error);
    return -1;
}

static unsigned blocks_for(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b > 65535 * 16 ? 65535 * 16 : b);
}

static void add_traffic(kvb_backend *be, kvb_copy_dir dir, int64_t n, int64_t bytes) {
    be->traffic.n[dir] += n;
    be->traffic.bytes[dir] += bytes;
}

/* the host waits for the stream (a decode step's recording, graph.cu, runs first): kvops.h */
int cuda_kvops_wait(cuda_kvops *o) { return cuda_graph_flush(o) || CK(cudaStreamSynchronize(o->stream)); }

/* a device buffer of at least need bytes (a smaller one is freed once the stream has drained) */
static int grow_dev(cuda_kvops *o, void **p, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    if (cuda_kvops_wait(o) || (*p && CK(cudaFree(*p)))) return -1;
    *p = NULL;
    *cap = 0;
    size_t want = need + need / 4 + 4096;
    if (CK(cudaMalloc(p, want))) return -1;
    *cap = want;
    return 0;
}

/* a pinned host buffer of at least need bytes, free for the host to write (the copies reading it have run) */
static uint8_t *host_buf(cuda_kvops *o, uint8_t **p, size_t *cap, cudaEvent_t done, size_t need) {
    if (cuda_graph_flush(o) || CK(cudaEventSynchronize(done))) return NULL; /* a recording holds no real event */
    if (need > *cap) {
        if (*p && CK(cudaFreeHost(*p))) return NULL;
        *p = NULL;
        *cap = 0;
        size_t want = need + need / 4 + 4096;
        if (CK(cudaMallocHost((void **)p, want))) return NULL;
        *cap = want;
    }
    return *p;
}

/* A device copy of bytes (> 0) of host parameters for the kernels enqueued next. It takes the next slot of a ring:
 * the host waits only for that slot's previous copy up (made KVOPS_PARAM_RING calls ago, so normally long done),
 * never for the work queued since, and the device copy stays intact for the kernels reading it (a later copy into
 * the same slot is stream-ordered after them). NULL on failure. */
static const void *params_in(cuda_kvops *o, const void *host, size_t bytes) {
    const int i = o->param_next;
    o->param_next = (i + 1) % KVOPS_PARAM_RING;
    if (grow_dev(o, &o->param_dev[i], &o->param_dev_bytes[i], bytes)) return NULL;
    const void *rec = cuda_graph_stage(o, host, bytes); /* a decode step's recording reads them from its arena */
    if (rec)
        return CK(cudaMemcpyAsync(o->param_dev[i], rec, bytes, cudaMemcpyHostToDevice, o->stream)) ? NULL : o->param_dev[i];
    uint8_t *h = host_buf(o, &o->param[i], &o->param_bytes[i], o->param_done[i], bytes);
    if (!h) return NULL;
    memcpy(h, host, bytes);
    if (CK(cudaMemcpyAsync(o->param_dev[i], h, bytes, cudaMemcpyHostToDevice, o->stream)) ||
        CK(cudaEventRecord(o->param_done[i], o->stream)))
        return NULL;
    return o->param_dev[i];
}

/* ---- copy, zero ---- */

static int cu_copy(kvb_backend *be, void *dst, const void *src, size_t bytes, kvb_copy_dir dir, char *err,
                   size_t err_len) {
    cuda_kvops *o = OPS(be);
    if (be->error[0]) return failed(o, err, err_len);
    if (dir < KVB_COPY_H2D || dir >= KVB_COPY_DIRS) return kvb_errf(err, err_len, "copy: bad direction %d", (int)dir);
    if (!bytes) return 0;
    static const cudaMemcpyKind kinds[KVB_COPY_DIRS] = {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
                                                         cudaMemcpyDeviceToDevice};
    const uint8_t *s = (const uint8_t *)src;
    uint8_t *d = (uint8_t *)dst;
    /* a decode step's recording: host bytes going up are staged in its arena (small ones; larger ones end the
     * recording), and a copy down ends it (the host reads the result after a wait) */
    if (dir == KVB_COPY_H2D && o->graph.capturing) {
        /* pageable memory only: a pinned source (the host tier) may be written by recorded work before the copy runs,
         * which must then read it in stream order, as without a recording */
        cudaPointerAttributes at;
        const int pageable = cudaPointerGetAttributes(&at, src) == cudaSuccess && at.type == cudaMemoryTypeUnregistered;
        cudaGetLastError(); /* a pointer the driver does not know is not an error here */
        const void *rec = pageable && bytes <= 4096 ? cuda_graph_stage(o, src, bytes) : NULL;
        if (rec) s = (const uint8_t *)rec;
        else if (cuda_graph_flush(o)) return failed(o, err, err_len);
    }
    if (dir == KVB_COPY_D2H && cuda_graph_flush(o)) return failed(o, err, err_len);
    if (dir == KVB_COPY_D2D && s != d && s < d + bytes && d < s + bytes) { /* overlap: memmove through scratch */
        if (grow_dev(o, &o->scratch, &o->scratch_bytes, bytes) ||
            CK(cudaMemcpyAsync(o->scratch, s, bytes, cudaMemcpyDeviceToDevice, o->stream)))
            return failed(o, err, err_len);
        s = (const uint8_t *)o->scratch;
    }
    if (s != d && CK(cudaMemcpyAsync(d, s, bytes, kinds[dir], o->stream))) return failed(o, err, err_len);
    add_traffic(be, dir, 1, (int64_t)bytes);
    return 0;
}

static int cu_zero(kvb_backend *be, void *dst, size_t bytes, char *err, size_t err_len) {
    cuda_kvops *o = OPS(be);
    if (be->error[0]) return failed(o, err, err_len);
    if (bytes && CK(cudaMemsetAsync(dst, 0, bytes, o->stream))) return failed(o, err, err_len);
    return 0;
}

/* ---- kv_gather ---- */

/* the block's threads copy one row (words when everything is 4-byte aligned) */
__device__ void copy_row(uint8_t *dst, const uint8_t *src, size_t rb) {
    if (((uintptr_t)dst | (uintptr_t)src | rb) & 3) {
        for (size_t b = threadIdx.x; b < rb; b += blockDim.x) dst[b] = src[b];
    } else {
        for (size_t w = threadIdx.x; w < rb / 4; w += blockDim.x) ((uint32_t *)dst)[w] = ((const uint32_t *)src)[w];
    }
}

__global__ void k_kv_gather(kvb_kv_head dst, int64_t off, kvb_kv_head src, const int32_t *idx, int64_t n, size_t rb) {
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const int64_t s = idx ? idx[i] : i, t = off + i;
        copy_row((uint8_t *)dst.k + t * rb, (const uint8_t *)src.k + s * rb, rb);
        copy_row((uint8_t *)dst.v + t * rb, (const uint8_t *)src.v + s * rb, rb);
        if (threadIdx.x == 0) {
            dst.pos[t] = src.pos[s];
            dst.round[t] = src.round[s];
        }
    }
}

/* one copy per array of slots [0, n) of `from` into slots off.. of `to` */
static int copy_arrays(cuda_kvops *o, const kvb_kv_head *to, int64_t off, const kvb_kv_head *from, int64_t n,
                       size_t rb, cudaMemcpyKind kind) {
    const size_t rows = (size_t)n * rb, ints = (size_t)n * sizeof(int32_t);
    return CK(cudaMemcpyAsync((uint8_t *)to->k + (size_t)off * rb, from->k, rows, kind, o->stream)) ||
           CK(cudaMemcpyAsync((uint8_t *)to->v + (size_t)off * rb, from->v, rows, kind, o->stream)) ||
           CK(cudaMemcpyAsync(to->pos + off, from->pos, ints, kind, o->stream)) ||
           CK(cudaMemcpyAsync(to->round + off, from->round, ints, kind, o->stream));
}

/* staging laid out pos | round | K | V for n slots (ints first: aligned whatever the row size) */
static kvb_kv_head staged(uint8_t *h, int64_t n, size_t rb) {
    kvb_kv_head s;
    s.pos = (int32_t *)h;
    s.round = s.pos + n;
    s.k = h + (size_t)n * 2 * sizeof(int32_t);
    s.v = (uint8_t *)s.k + (size_t)n * rb;
    return s;
}

static int gather_h2d(cuda_kvops *o, const kvb_kv_head *dst, int64_t off, const kvb_kv_head *src,
                      const int32_t *idx, int64_t n, size_t rb) {
    if (!idx) return copy_arrays(o, dst, off, src, n, rb, cudaMemcpyHostToDevice);
    uint8_t *h = host_buf(o, &o->stage, &o->stage_bytes, o->stage_done, (size_t)n * (2 * rb + 2 * sizeof(int32_t)));
    if (!h) return -1;
    /* the host reads host-tier rows the KV writer (queued on this stream) may still be writing in place: wait */
    if (cuda_kvops_wait(o)) return -1;
    kvb_kv_head p = staged(h, n, rb);
    for (int64_t i = 0; i < n; i++) {
        const size_t s = (size_t)idx[i];
        memcpy((uint8_t *)p.k + (size_t)i * rb, (const uint8_t *)src->k + s * rb, rb);
        memcpy((uint8_t *)p.v + (size_t)i * rb, (const uint8_t *)src->v + s * rb, rb);
        p.pos[i] = src->pos[s];
        p.round[i] = src->round[s];
    }
    return copy_arrays(o, dst, off, &p, n, rb, cudaMemcpyHostToDevice) || CK(cudaEventRecord(o->stage_done, o->stream));
}

/* D2H with an index list: the span of slots it covers comes over, the host unpacks. *span: slots moved. */
static int gather_d2h(cuda_kvops *o, const kvb_kv_head *dst, int64_t off, const kvb_kv_head *src,
                      const int32_t *idx, int64_t n, size_t rb, int64_t *span) {
    int32_t lo = idx[0], hi = idx[0];
    for (int64_t i = 1; i < n; i++) lo = idx[i] < lo ? idx[i] : lo, hi = idx[i] > hi ? idx[i] : hi;
    *span = (int64_t)hi - lo + 1;
    uint8_t *h = host_buf(o, &o->stage, &o->stage_bytes, o->stage_done, (size_t)*span * (2 * rb + 2 * sizeof(int32_t)));
    if (!h) return -1;
    kvb_kv_head p = staged(h, *span, rb), from;
    from.k = (uint8_t *)src->k + (size_t)lo * rb;
    from.v = (uint8_t *)src->v + (size_t)lo * rb;
    from.pos = src->pos + lo;
    from.round = src->round + lo;
    if (copy_arrays(o, &p, 0, &from, *span, rb, cudaMemcpyDeviceToHost) || cuda_kvops_wait(o)) return -1;
    for (int64_t i = 0; i < n; i++) {
        const size_t s = (size_t)(idx[i] - lo), t = (size_t)(off + i);
        memcpy((uint8_t *)dst->k + t * rb, (const uint8_t *)p.k + s * rb, rb);
        memcpy((uint8_t *)dst->v + t * rb, (const uint8_t *)p.v + s * rb, rb);
        dst->pos[t] = p.pos[s];
        dst->round[t] = p.round[s];
    }
    return 0;
}

static int cu_kv_gather(kvb_backend *be, const kvb_kv_head *dst, int64_t dst_off, const kvb_kv_head *src,
                        const int32_t *idx, int64_t n, size_t row_bytes, kvb_copy_dir dir, char *err, size_t err_len) {
    cuda_kvops *o = OPS(be);
    if (be->error[0]) return failed(o, err, err_len);
    if (dir < KVB_COPY_H2D || dir >= KVB_COPY_DIRS) return kvb_errf(err, err_len, "kv_gather: bad direction %d", (int)dir);
    if (n < 0 || dst_off < 0) return kvb_errf(err, err_len, "kv_gather: %lld rows at slot %lld", (long long)n, (long long)dst_off);
    if (!n) return 0;
    for (int64_t i = 0; idx && dir != KVB_COPY_D2D && i < n; i++) /* host index lists only */
        if (idx[i] < 0) return kvb_errf(err, err_len, "kv_gather: index %d at %lld is negative", idx[i], (long long)i);
    int64_t slots = n;
    int rc;
    if (dir != KVB_COPY_D2D && cuda_graph_flush(o)) return failed(o, err, err_len); /* host memory: no recording */
    if (dir == KVB_COPY_D2D) {
        k_kv_gather<<<blocks_for(n, 1), 64, 0, o->stream>>>(*dst, dst_off, *src, idx, n, row_bytes);
        rc = CK_LAUNCH(k_kv_gather);
    } else if (dir == KVB_COPY_H2D) {
        rc = gather_h2d(o, dst, dst_off, src, idx, n, row_bytes);
    } else {
        rc = idx ? gather_d2h(o, dst, dst_off, src, idx, n, row_bytes, &slots)
                 : copy_arrays(o, dst, dst_off, src, n, row_bytes, cudaMemcpyDeviceToHost);
    }
    if (rc) return failed(o, err, err_len);
    add_traffic(be, dir, 4, slots * (int64_t)(2 * row_bytes + 2 * sizeof(int32_t)));
    return 0;
}

/* ---- kv_load: many heads' listed rows from the pinned host tier, one kernel ---- */

typedef struct {
    kvb_kv_head dst, src;
    int64_t off, n, at; /* at: where the head's list starts in the list area; -1 = slots 0..n-1 */
    int wide;           /* 1: K and V rows of both heads 16-byte aligned, row_bytes a multiple of 16 */
} load_head;

/* LOAD_ROWS: rows a warp moves per turn; LOAD_U: 16-byte words a lane has in flight (loads first, then stores) */
enum { LOAD_WARPS = 8, LOAD_MAX_X = 512, LOAD_ROWS = 8, LOAD_U = 8 };

/* a warp copies one row: 16-byte words when both ends and the size allow it */
__device__ void warp_copy_row(uint8_t *dst, const uint8_t *src, size_t rb, int lane) {
    if (!(((uintptr_t)dst | (uintptr_t)src | rb) & 15)) {
        for (size_t w = lane; w < rb / 16; w += 32) ((uint4 *)dst)[w] = ((const uint4 *)src)[w];
    } else if (!(((uintptr_t)dst | (uintptr_t)src | rb) & 3)) {
        for (size_t w = lane; w < rb / 4; w += 32) ((uint32_t *)dst)[w] = ((const uint32_t *)src)[w];
    } else {
        for (size_t b = lane; b < rb; b += 32) dst[b] = src[b];
    }
}

/* blockIdx.y = head. Aligned heads (wide): a warp takes LOAD_ROWS rows at a time and spreads their K and V words
 * over all 32 lanes, each lane issuing up to LOAD_U 16-byte loads from the pinned host rows before it stores any,
 * so many PCIe reads are in flight (one row per warp used 8 of 32 lanes for a 128-byte row and waited for each
 * row). Other heads: a warp copies one row at a time. */
__global__ void __launch_bounds__(LOAD_WARPS * 32) k_kv_load(const load_head *heads, const int32_t *lists, size_t rb) {
    const load_head h = heads[blockIdx.y];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (!h.wide) {
        for (int64_t i = (int64_t)blockIdx.x * LOAD_WARPS + warp; i < h.n; i += (int64_t)gridDim.x * LOAD_WARPS) {
            const int64_t s = h.at >= 0 ? lists[h.at + i] : i, t = h.off + i;
            warp_copy_row((uint8_t *)h.dst.k + t * rb, (const uint8_t *)h.src.k + s * rb, rb, lane);
            warp_copy_row((uint8_t *)h.dst.v + t * rb, (const uint8_t *)h.src.v + s * rb, rb, lane);
            if (lane == 0) {
                h.dst.pos[t] = h.src.pos[s];
                h.dst.round[t] = h.src.round[s];
            }
        }
        return;
    }
    __shared__ int64_t slot[LOAD_WARPS][LOAD_ROWS];
    const int wpr = (int)(rb / 16);
    for (int64_t i0 = ((int64_t)blockIdx.x * LOAD_WARPS + warp) * LOAD_ROWS; i0 < h.n;
         i0 += (int64_t)gridDim.x * LOAD_WARPS * LOAD_ROWS) {
        const int rows = h.n - i0 < LOAD_ROWS ? (int)(h.n - i0) : LOAD_ROWS;
        if (lane < rows) {
            const int64_t s = h.at >= 0 ? lists[h.at + i0 + lane] : i0 + lane, t = h.off + i0 + lane;
            slot[warp][lane] = s;
            h.dst.pos[t] = h.src.pos[s];
            h.dst.round[t] = h.src.round[s];
        }
        __syncwarp();
        const int items = rows * wpr, total = 2 * items; /* K words of the rows, then V words */
        for (int f0 = 0; f0 < total; f0 += 32 * LOAD_U) {
            uint4 w[LOAD_U];
#pragma unroll
            for (int u = 0; u < LOAD_U; u++) {
                const int f = f0 + u * 32 + lane;
                if (f < total) {
                    const int g = f < items ? f : f - items, r = g / wpr;
                    const uint8_t *src = (const uint8_t *)(f < items ? h.src.k : h.src.v) + (size_t)slot[warp][r] * rb;
                    w[u] = ((const uint4 *)src)[g - r * wpr];
                }
            }
#pragma unroll
            for (int u = 0; u < LOAD_U; u++) {
                const int f = f0 + u * 32 + lane;
                if (f < total) {
                    const int g = f < items ? f : f - items, r = g / wpr;
                    uint8_t *dst = (uint8_t *)(f < items ? h.dst.k : h.dst.v) + (size_t)(h.off + i0 + r) * rb;
                    ((uint4 *)dst)[g - r * wpr] = w[u];
                }
            }
        }
        __syncwarp(); /* every lane has read slot[] before the next turn writes it */
    }
}

static int cu_kv_load(kvb_backend *be, int n_heads, const kvb_kv_head *dst, const int64_t *dst_off,
                      const kvb_kv_head *src, const int32_t *const *idx, const int64_t *n, size_t row_bytes, char *err,
                      size_t err_len) {
    cuda_kvops *o = OPS(be);
    if (be->error[0]) return failed(o, err, err_len);
    if (n_heads < 0 || n_heads > 65535) return kvb_errf(err, err_len, "kv_load: %d heads", n_heads);
    int64_t rows = 0, max_n = 0;
    for (int j = 0; j < n_heads; j++) {
        if (n[j] < 0 || dst_off[j] < 0)
            return kvb_errf(err, err_len, "kv_load: head %d: %lld rows at slot %lld", j, (long long)n[j],
                            (long long)dst_off[j]);
        rows += n[j];
        max_n = n[j] > max_n ? n[j] : max_n;
    }
    if (!rows) return 0;
    /* The head table, then every distinct list once, in one parameter block (a host staging area first). Heads
     * that share a list (OmniKV: one selection for every head of the layers a filter layer serves; Round
     * Attention: one list of the selected rounds' slots) share its copy: at[] points at it. */
    int64_t *at = (int64_t *)malloc((size_t)n_heads * (sizeof(int64_t) + 1));
    if (!at) return kvb_errf(err, err_len, "kv_load: out of memory");
    unsigned char *own = (unsigned char *)(at + n_heads); /* 1: head j's list is copied (the others share one) */
    int64_t listed = 0;
    for (int j = 0; j < n_heads; j++) {
        at[j] = -1;
        own[j] = 0;
        if (!idx || !idx[j] || !n[j]) continue;
        for (int i = 0; i < j && at[j] < 0; i++) /* an earlier head's list, at least as long: its copy serves */
            if (idx[i] == idx[j] && n[i] >= n[j] && at[i] >= 0) at[j] = at[i];
        if (at[j] >= 0) continue;
        for (int64_t i = 0; i < n[j]; i++)
            if (idx[j][i] < 0) {
                free(at);
                return kvb_errf(err, err_len, "kv_load: index %d at %lld is negative", idx[j][i], (long long)i);
            }
        at[j] = listed;
        own[j] = 1;
        listed += n[j];
    }
    const size_t table = (size_t)n_heads * sizeof(load_head), bytes = table + (size_t)listed * sizeof(int32_t);
    uint8_t *p = (uint8_t *)malloc(bytes);
    if (!p) {
        free(at);
        return kvb_errf(err, err_len, "kv_load: out of memory");
    }
    load_head *t = (load_head *)p;
    int32_t *lists = (int32_t *)(p + table);
    for (int j = 0; j < n_heads; j++) {
        t[j].dst = dst[j], t[j].src = src[j], t[j].off = dst_off[j], t[j].n = n[j], t[j].at = at[j];
        t[j].wide = !(((uintptr_t)dst[j].k | (uintptr_t)dst[j].v | (uintptr_t)src[j].k | (uintptr_t)src[j].v | row_bytes) & 15);
        if (at[j] >= 0 && own[j]) memcpy(lists + at[j], idx[j], (size_t)n[j] * sizeof(int32_t));
    }
    free(at);
    const uint8_t *d = (const uint8_t *)params_in(o, p, bytes);
    free(p);
    if (!d) return failed(o, err, err_len);
    const int64_t per_block = (int64_t)LOAD_WARPS * LOAD_ROWS, gx = (max_n + per_block - 1) / per_block;
    dim3 grid((unsigned)(gx < 1 ? 1 : gx > LOAD_MAX_X ? LOAD_MAX_X : gx), (unsigned)n_heads);
    k_kv_load<<<grid, LOAD_WARPS * 32, 0, o->stream>>>((const load_head *)d, (const int32_t *)(d + table), row_bytes);
    if (CK_LAUNCH(k_kv_load)) return failed(o, err, err_len);
    add_traffic(be, KVB_COPY_H2D, 1, rows * (int64_t)(2 * row_bytes + 2 * sizeof(int32_t)) + (int64_t)bytes);
    return 0;
}

/* ---- kv_evict: one block per head, each evicting one slot after another ---- */

enum { EVICT_THREADS = 256, EVICT_BATCH = 32 };

/* up to EVICT_BATCH heads of one call, passed by value (64 bytes a head, 2 KiB in all) */
typedef struct {
    kvb_kv_head h[EVICT_BATCH];
    int64_t n[EVICT_BATCH], count[EVICT_BATCH];
    float *score[EVICT_BATCH];
    uint8_t *spill[EVICT_BATCH];
} evict_batch;

/* slot a (key ka or position pa) is evicted before slot b: lower key (NaN below every number, as the CPU
 * backend's key_below: a total order, so the reduction's order cannot change the victim), then lower slot */
__device__ bool evicts_before(const float *score, float ka, int32_t pa, int64_t a, float kb, int32_t pb, int64_t b) {
    if (score) {
        if (isnan(ka) != isnan(kb)) return isnan(ka);
        if (!isnan(ka) && ka != kb) return ka < kb;
    } else if (pa != pb) {
        return pa < pb;
    }
    return a < b;
}

__global__ void __launch_bounds__(EVICT_THREADS) k_kv_evict(evict_batch b, size_t rb, int32_t lo, int32_t hi) {
    __shared__ float skey[EVICT_THREADS];
    __shared__ int32_t spos[EVICT_THREADS];
    __shared__ int64_t sslot[EVICT_THREADS];
    const int tid = threadIdx.x, head = blockIdx.x;
    const kvb_kv_head h = b.h[head];
    float *score = b.score[head];
    uint8_t *spill = b.spill[head];
    const int64_t count = b.count[head];
    int64_t n = b.n[head];
    for (int64_t c = 0; c < count; c++, n--) {
        int64_t best = -1;
        float bk = 0;
        int32_t bp = 0;
        for (int64_t j = tid; j < n; j += blockDim.x) { /* ascending j: a tie keeps the lower slot */
            const int32_t p = h.pos[j];
            const float k = score ? score[j] : 0.0f;
            if (p >= lo && p < hi && (best < 0 || evicts_before(score, k, p, j, bk, bp, best))) best = j, bk = k, bp = p;
        }
        skey[tid] = bk, spos[tid] = bp, sslot[tid] = best;
        __syncthreads();
        for (int s = blockDim.x / 2; s > 0; s >>= 1) {
            if (tid < s && sslot[tid + s] >= 0 &&
                (sslot[tid] < 0 || evicts_before(score, skey[tid + s], spos[tid + s], sslot[tid + s], skey[tid], spos[tid], sslot[tid])))
                skey[tid] = skey[tid + s], spos[tid] = spos[tid + s], sslot[tid] = sslot[tid + s];
            __syncthreads();
        }
        const int64_t victim = sslot[0], last = n - 1;
        __syncthreads(); /* everyone has read the victim before the next round overwrites it */
        if (victim < 0) return; /* no candidate: a caller's error (the CPU backend reports it) */
        if (spill) copy_row(spill + c * rb, (const uint8_t *)h.v + victim * rb, rb);
        __syncthreads();
        if (victim != last) {
            copy_row((uint8_t *)h.k + victim * rb, (const uint8_t *)h.k + last * rb, rb);
            copy_row((uint8_t *)h.v + victim * rb, (const uint8_t *)h.v + last * rb, rb);
            if (tid == 0) {
                h.pos[victim] = h.pos[last];
                h.round[victim] = h.round[last];
                if (score) score[victim] = score[last];
            }
        }
        __syncthreads();
    }
}

/* the planned eviction's two passes (base/evict_plan.h): V rows of the victims out, then survivors into their slots */
__global__ void k_evict_spill(uint8_t *spill, const uint8_t *v, const int64_t *from, int64_t count, size_t rb) {
    for (int64_t c = blockIdx.x; c < count; c += gridDim.x) copy_row(spill + c * rb, v + from[c] * rb, rb);
}

__global__ void k_evict_moves(kvb_kv_head h, const int64_t *dst, const int64_t *src, int64_t m, size_t rb) {
    for (int64_t i = blockIdx.x; i < m; i += gridDim.x) {
        const int64_t d = dst[i], s = src[i];
        copy_row((uint8_t *)h.k + d * rb, (const uint8_t *)h.k + s * rb, rb);
        copy_row((uint8_t *)h.v + d * rb, (const uint8_t *)h.v + s * rb, rb);
        if (threadIdx.x == 0) {
            h.pos[d] = h.pos[s];
            h.round[d] = h.round[s];
        }
    }
}

/* Many evictions by position (PoD's spill after prefill: ~23K a head at 32K): the positions down, the plan made on
 * the host, two gathers. k_kv_evict's scan per eviction took ~2.7 s per decode step of PoD on the 8B shapes at 32K
 * (H200, 2026-11-27). 1 = done; 0 = positions repeat (the loop decides); -1 = failed. */
static int evict_planned(cuda_kvops *o, kvb_backend *be, const kvb_kv_head *h, int64_t n, size_t rb, int32_t lo,
                         int32_t hi, int64_t count, uint8_t *spill_v, char *err, size_t err_len) {
    int32_t *pos = (int32_t *)malloc((size_t)n * sizeof(int32_t));
    int64_t *plan = (int64_t *)malloc((size_t)count * 3 * sizeof(int64_t)), moves = 0;
    int rc = 0;
    if (!pos || !plan) goto done; /* the loop then */
    if (cuda_graph_flush(o) || /* the positions come down: a decode step's recording runs first */
        CK(cudaMemcpyAsync(pos, h->pos, (size_t)n * sizeof(int32_t), cudaMemcpyDeviceToHost, o->stream)) ||
        cuda_kvops_wait(o)) {
        rc = failed(o, err, err_len);
        goto done;
    }
    add_traffic(be, KVB_COPY_D2H, 1, n * (int64_t)sizeof(int32_t));
    rc = kvb_evict_plan(pos, n, lo, hi, count, plan, plan + count, plan + 2 * count, &moves, err, err_len);
    if (rc == 1) {
        /* the plan up as one parameter block: spill sources, then the moves' destinations and sources */
        const int64_t *d = (const int64_t *)params_in(o, plan, (size_t)count * 3 * sizeof(int64_t));
        if (!d) {
            rc = failed(o, err, err_len);
            goto done;
        }
        const unsigned threads = rb >= 512 ? 128 : 64;
        if (spill_v) {
            k_evict_spill<<<(unsigned)(count < 65535 ? count : 65535), threads, 0, o->stream>>>(spill_v, (const uint8_t *)h->v, d,
                                                                                           count, rb);
            if (CK_LAUNCH(k_evict_spill)) rc = failed(o, err, err_len);
        }
        if (rc == 1 && moves) {
            k_evict_moves<<<(unsigned)(moves < 65535 ? moves : 65535), threads, 0, o->stream>>>(*h, d + count, d + 2 * count,
                                                                                            moves, rb);
            if (CK_LAUNCH(k_evict_moves)) rc = failed(o, err, err_len);
        }
    }
done:
    free(pos);
    free(plan);
    return rc;
}

static int cu_kv_evict(kvb_backend *be, int n_heads, const kvb_kv_head *h, const int64_t *n, size_t row_bytes,
                       float *const *score, int32_t lo, int32_t hi, const int64_t *count, void *const *spill_v,
                       char *err, size_t err_len) {
    cuda_kvops *o = OPS(be);
    if (be->error[0]) return failed(o, err, err_len);
    for (int j = 0; j < n_heads; j++)
        if (count[j] > n[j])
            return kvb_errf(err, err_len, "kv_evict: %lld evictions from %lld slots", (long long)count[j], (long long)n[j]);
    evict_batch b;
    int m = 0;
    for (int j = 0; j < n_heads; j++) {
        if (count[j] <= 0) continue;
        float *sc = score ? score[j] : NULL;
        uint8_t *sp = spill_v ? (uint8_t *)spill_v[j] : NULL;
        if (!sc && count[j] > 1) { /* many by position: planned on the host (0: positions repeat, the loop then) */
            const int rc = evict_planned(o, be, &h[j], n[j], row_bytes, lo, hi, count[j], sp, err, err_len);
            if (rc < 0) return -1;
            if (rc) continue;
        }
        b.h[m] = h[j], b.n[m] = n[j], b.count[m] = count[j], b.score[m] = sc, b.spill[m] = sp;
        if (++m == EVICT_BATCH) {
            k_kv_evict<<<(unsigned)m, EVICT_THREADS, 0, o->stream>>>(b, row_bytes, lo, hi);
            if (CK_LAUNCH(k_kv_evict)) return failed(o, err, err_len);
            m = 0;
        }
    }
    if (m) {
        k_kv_evict<<<(unsigned)m, EVICT_THREADS, 0, o->stream>>>(b, row_bytes, lo, hi);
        if (CK_LAUNCH(k_kv_evict)) return failed(o, err, err_len);
    }
    return 0;
}

/* ---- attention_colsum: the group column sums of the probabilities, never written ----
 * A thread per list entry (KV head = grid row), its sums in the header's order: the group's heads r ascending, then
 * the queries t ascending. f16 keys of head_dim 64 or 128 sit in the thread's registers and the queries of one head
 * come through shared memory COLSUM_T at a time; other shapes read both from memory. */
enum { COLSUM_THREADS = 128, COLSUM_T = 32 };
__device__ float row_elem(const void *k, int f16, int64_t at); /* knorm's, below */

typedef struct { /* every KV head's list, by value (2.5 KiB) */
    const void *k[KVB_MAX_KV_HEADS];
    const int32_t *k_pos[KVB_MAX_KV_HEADS], *idx[KVB_MAX_KV_HEADS];
    float *out[KVB_MAX_KV_HEADS];
    int64_t len[KVB_MAX_KV_HEADS];
} colsum_heads;

__device__ __forceinline__ bool colsum_hidden(const int32_t *q_pos, const int32_t *kpos, int32_t kp, int32_t qp,
                                              int32_t window) {
    return q_pos && kpos && (kp > qp || (window > 0 && (int64_t)qp - kp >= window));
}

template <int D>
__global__ void __launch_bounds__(COLSUM_THREADS) k_attention_colsum_f16(colsum_heads hs, const float *q,
                                                                         const int32_t *q_pos, const float *lse,
                                                                         int64_t n_q, int n_head, int G, float scale,
                                                                         int32_t window) {
    __shared__ float4 qs[COLSUM_T][D / 4];
    __shared__ float ls[COLSUM_T];
    __shared__ int32_t qps[COLSUM_T];
    const int g = blockIdx.y;
    const int64_t j = (int64_t)blockIdx.x * COLSUM_THREADS + threadIdx.x;
    const bool live = j < hs.len[g];
    const int64_t slot = live ? (hs.idx[g] ? hs.idx[g][j] : j) : 0;
    const int32_t *kpos = hs.k_pos[g];
    const int32_t kp = live && kpos ? kpos[slot] : 0;
    float kr[D];
    const __half *kh = (const __half *)hs.k[g] + slot * D;
#pragma unroll
    for (int i = 0; i < D; i++) kr[i] = live ? __half2float(kh[i]) : 0.f;
    float acc = live ? hs.out[g][j] : 0.f;
    for (int r = 0; r < G; r++) {
        const int h = g * G + r;
        for (int64_t t0 = 0; t0 < n_q; t0 += COLSUM_T) {
            const int nt = n_q - t0 < COLSUM_T ? (int)(n_q - t0) : COLSUM_T;
            __syncthreads(); /* the previous chunk is read */
            for (int x = threadIdx.x; x < nt * (D / 4); x += COLSUM_THREADS) {
                const int tt = x / (D / 4), c4 = x % (D / 4);
                qs[tt][c4] = ((const float4 *)(q + ((t0 + tt) * n_head + h) * (int64_t)D))[c4];
            }
            for (int tt = threadIdx.x; tt < nt; tt += COLSUM_THREADS) {
                ls[tt] = lse[(int64_t)h * n_q + t0 + tt];
                qps[tt] = q_pos ? q_pos[t0 + tt] : 0;
            }
            __syncthreads();
            if (!live) continue;
            for (int tt = 0; tt < nt; tt++) {
                const float l = ls[tt];
                if (l == -INFINITY || colsum_hidden(q_pos, kpos, kp, qps[tt], window)) continue;
                float d = 0.f;
#pragma unroll
                for (int c4 = 0; c4 < D / 4; c4++) {
                    const float4 qv = qs[tt][c4];
                    d += qv.x * kr[4 * c4];
                    d += qv.y * kr[4 * c4 + 1];
                    d += qv.z * kr[4 * c4 + 2];
                    d += qv.w * kr[4 * c4 + 3];
                }
                acc += expf(scale * d - l);
            }
        }
    }
    if (live) hs.out[g][j] = acc;
}

__global__ void __launch_bounds__(COLSUM_THREADS) k_attention_colsum(colsum_heads hs, const float *q, const int32_t *q_pos,
                                                                     const float *lse, int64_t n_q, int n_head, int G,
                                                                     int D, int f16, float scale, int32_t window) {
    const int g = blockIdx.y;
    const int64_t j = (int64_t)blockIdx.x * COLSUM_THREADS + threadIdx.x;
    if (j >= hs.len[g]) return;
    const int64_t slot = hs.idx[g] ? hs.idx[g][j] : j;
    const int32_t *kpos = hs.k_pos[g];
    const int32_t kp = kpos ? kpos[slot] : 0;
    float acc = hs.out[g][j];
    for (int r = 0; r < G; r++) {
        const int h = g * G + r;
        for (int64_t t = 0; t < n_q; t++) {
            const float l = lse[(int64_t)h * n_q + t];
            if (l == -INFINITY || colsum_hidden(q_pos, kpos, kp, q_pos ? q_pos[t] : 0, window)) continue;
            const float *qr = q + (t * n_head + h) * (int64_t)D;
            float d = 0.f;
            for (int i = 0; i < D; i++) d += qr[i] * row_elem(hs.k[g], f16, slot * D + i);
            acc += expf(scale * d - l);
        }
    }
    hs.out[g][j] = acc;
}

static int cu_attention_colsum(kvb_backend *be, const kvb_attn_args *a, float *const *out, char *err, size_t err_len) {
    cuda_kvops *o = OPS(be);
    if (be->error[0]) return failed(o, err, err_len);
    const int HK = a->n_head_kv;
    if (a->n_head <= 0 || HK <= 0 || HK > KVB_MAX_KV_HEADS || a->n_head % HK || !a->lse)
        return kvb_errf(err, err_len, "attention_colsum: %d query heads over %d KV heads%s", a->n_head, HK,
                        a->lse ? "" : ", no lse");
    colsum_heads hs;
    int64_t longest = 0;
    for (int g = 0; g < HK; g++) {
        hs.k[g] = a->k[g];
        hs.k_pos[g] = a->k_pos ? a->k_pos[g] : NULL;
        hs.idx[g] = a->idx ? a->idx[g] : NULL;
        hs.len[g] = hs.idx[g] ? a->n_idx[g] : a->n_kv[g];
        hs.out[g] = out[g];
        longest = hs.len[g] > longest ? hs.len[g] : longest;
    }
    if (longest <= 0 || a->n_q <= 0) return 0;
    const dim3 grid((unsigned)((longest + COLSUM_THREADS - 1) / COLSUM_THREADS), (unsigned)HK);
    const int G = a->n_head / HK, f16 = a->kv_dtype == KVB_F16;
    if (f16 && a->head_dim == 128)
        k_attention_colsum_f16<128><<<grid, COLSUM_THREADS, 0, o->stream>>>(hs, a->q, a->q_pos, a->lse, a->n_q, a->n_head,
                                                                            G, a->scale, a->window);
    else if (f16 && a->head_dim == 64)
        k_attention_colsum_f16<64><<<grid, COLSUM_THREADS, 0, o->stream>>>(hs, a->q, a->q_pos, a->lse, a->n_q, a->n_head,
                                                                           G, a->scale, a->window);
    else
        k_attention_colsum<<<grid, COLSUM_THREADS, 0, o->stream>>>(hs, a->q, a->q_pos, a->lse, a->n_q, a->n_head, G,
                                                                   a->head_dim, f16, a->scale, a->window);
    return CK_LAUNCH(k_attention_colsum) ? failed(o, err, err_len) : 0;
}

/* ---- probs_reduce, pool1d ---- */

__global__ void k_group_sum(float *out, int64_t out_stride, const float *p, int64_t stride, int G, int64_t n_q,
                            int64_t n, int accumulate) {
    const int g = blockIdx.y;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += (int64_t)gridDim.x * blockDim.x) {
        float acc = accumulate ? out[g * out_stride + j] : 0.0f;
        for (int r = 0; r < G; r++)
            for (int64_t t = 0; t < n_q; t++) acc += p[((int64_t)(g * G + r) * n_q + t) * stride + j];
        out[g * out_stride + j] = acc;
    }
}

__global__ void k_max_heads(float *out, const float *p, int64_t stride, int n_head, int64_t n_q, int64_t n,
                            const double *w, int accumulate) {
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += (int64_t)gridDim.x * blockDim.x) {
        float acc = accumulate ? out[j] : 0.0f;
        for (int64_t t = 0; t < n_q; t++) {
            float m = 0;
            for (int h = 0; h < n_head; h++) {
                const float x = p[((int64_t)h * n_q + t) * stride + j];
                if (x > m) m = x;
            }
            acc += (float)((w ? w[t] : 1.0) * m);
        }
        out[j] = acc;
    }
}

static int cu_probs_reduce(kvb_backend *be, float *out, int64_t out_stride, const float *probs, int64_t stride,
                           int n_head, int n_head_kv, int64_t n_q, int64_t n, const double *w, int mode, int accumulate,
                           char *err, size_t err_len) {
    cuda_kvops *o = OPS(be);
    if (be->error[0]) return failed(o, err, err_len);
    if (n_head <= 0 || n_head_kv <= 0 || n_head % n_head_kv || n_head_kv > 65535)
        return kvb_errf(err, err_len, "probs_reduce: %d query heads over %d KV heads", n_head, n_head_kv);
    if (mode != KVB_REDUCE_GROUP_SUM && mode != KVB_REDUCE_MAX_HEADS) return kvb_errf(err, err_len, "probs_reduce: unknown mode %d", mode);
    if (n <= 0) return 0;
    if (mode == KVB_REDUCE_GROUP_SUM) {
        dim3 grid(blocks_for(n, 256), (unsigned)n_head_kv);
        k_group_sum<<<grid, 256, 0, o->stream>>>(out, out_stride, probs, stride, n_head / n_head_kv, n_q, n, accumulate);
        return CK_LAUNCH(k_group_sum) ? failed(o, err, err_len) : 0;
    }
    const double *dw = NULL;
    if (w && n_q > 0 && !(dw = (const double *)params_in(o, w, (size_t)n_q * sizeof(double)))) return failed(o, err, err_len);
    k_max_heads<<<blocks_for(n, 256), 256, 0, o->stream>>>(out, probs, stride, n_head, n_q, n, dw, accumulate);
    return CK_LAUNCH(k_max_heads) ? failed(o, err, err_len) : 0;
}

__global__ void k_pool1d(float *out, int64_t out_stride, const float *in, int64_t in_stride, int64_t rows, int64_t n,
                         int64_t kernel, int avg) {
    const int64_t r = kernel / 2;
    for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
        const float *x = in + row * in_stride;
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
            float m = -INFINITY;
            double sum = 0;
            for (int64_t j = i - r; j <= i + r; j++) {
                if (j < 0 || j >= n) continue;
                if (x[j] > m) m = x[j];
                sum += x[j];
            }
            out[row * out_stride + i] = avg ? (float)(sum / (double)kernel) : m;
        }
    }
}

static int cu_pool1d(kvb_backend *be, float *out, int64_t out_stride, const float *in, int64_t in_stride, int64_t rows,
                     int64_t n, int64_t kernel, int avg, char *err, size_t err_len) {
    cuda_kvops *o = OPS(be);
    if (be->error[0]) return failed(o, err, err_len);
    if (kernel < 1) return kvb_errf(err, err_len, "pool1d: kernel %lld", (long long)kernel);
    if (rows <= 0 || n <= 0) return 0;
    dim3 grid(blocks_for(n, 256), (unsigned)(rows < 65535 ? rows : 65535));
    k_pool1d<<<grid, 256, 0, o->stream>>>(out, out_stride, in, in_stride, rows, n, kernel, avg);
    return CK_LAUNCH(k_pool1d) ? failed(o, err, err_len) : 0;
}

/* ---- topk_idx (radix select, then an ordered compaction), iota, gather_f32 ---- */

/* A float's rank as an unsigned key: larger numbers larger keys, -0 the same as +0, NaN below -inf (0). */
__device__ __forceinline__ uint32_t order_key(float v) {
    if (isnan(v)) return 0u;
    const uint32_t u = __float_as_uint(v == 0.0f ? 0.0f : v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

enum { TOPK_THREADS = 1024 };

/* Inclusive prefix sum of v over the block (blockDim.x a multiple of 32, every thread calling); *total = the sum
 * over the block. ws: 32 shared words, free again when this returns. */
__device__ int block_scan(int v, int *ws, int *total) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 1; o < 32; o <<= 1) {
        const int t = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += t;
    }
    if (lane == 31) ws[w] = v;
    __syncthreads();
    if (w == 0) {
        int s = lane < nw ? ws[lane] : 0;
        for (int o = 1; o < 32; o <<= 1) {
            const int t = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o) s += t;
        }
        if (lane < nw) ws[lane] = s;
    }
    __syncthreads();
    if (w > 0) v += ws[w - 1];
    *total = ws[nw - 1];
    __syncthreads();
    return v;
}

/* One block: the k-th largest key T by four 8-bit radix passes over the slots (MSB first, a 256-bin histogram of
 * the slots still matching the digits chosen so far), which leaves `need` = how many slots of key T the top k
 * takes (the lowest ones); then idx = the slots with key > T and the first `need` with key T, in slot order,
 * through prefix sums per chunk of TOPK_THREADS slots. Reads the scores five times: O(n), no scratch. */
__global__ void __launch_bounds__(TOPK_THREADS) k_topk_radix(int32_t *idx, int64_t idx_stride, const float *x,
                                                              int64_t x_stride, int64_t n, int64_t k) {
    idx += blockIdx.x * idx_stride, x += blockIdx.x * x_stride; /* one row a block (topk_rows) */
    __shared__ unsigned int hist[256];
    __shared__ uint32_t s_prefix, s_mask;
    __shared__ long long s_need;
    __shared__ int ws[32];
    const int tid = threadIdx.x;
    if (tid == 0) s_prefix = 0, s_mask = 0, s_need = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = tid; b < 256; b += blockDim.x) hist[b] = 0;
        __syncthreads();
        const uint32_t prefix = s_prefix, mask = s_mask;
        /* warp-aggregated: the lanes of a warp with the same digit add their count once (scores close together, as
         * attention probabilities are, share the first digit: 32 conflicting atomics per warp became one) */
        for (int64_t c = 0; c < n; c += blockDim.x) { /* uniform trip count: every lane reaches the match */
            const int64_t i = c + tid;
            const uint32_t key = i < n ? order_key(x[i]) : 0u;
            const int digit = i < n && (key & mask) == prefix ? (int)((key >> shift) & 0xFFu) : -1;
            const unsigned peers = __match_any_sync(0xffffffffu, digit);
            if (digit >= 0 && (threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&hist[digit], (unsigned)__popc(peers));
        }
        __syncthreads();
        /* the digit holding the need-th largest of the matching keys: the digits from 255 down as a prefix sum
         * over the block (thread t has digit 255 - t); the one thread whose sum first reaches `need` takes it
         * (digit 0 when none does), as a serial walk from 255 down would (that walk was 256 dependent steps of
         * one thread per pass) */
        const long long want = s_need;
        const int v = tid < 256 ? (int)hist[255 - tid] : 0;
        int all;
        const int incl = block_scan(v, ws, &all);
        if (tid < 256 && (long long)(incl - v) < want && ((long long)incl >= want || tid == 255)) {
            s_need = want - (incl - v);
            s_prefix = prefix | ((uint32_t)(255 - tid) << shift);
            s_mask = mask | (0xFFu << shift);
        }
        __syncthreads();
    }
    const uint32_t T = s_prefix;
    const long long need = s_need;
    long long base = 0, base_eq = 0;
    for (int64_t c = 0; c < n; c += blockDim.x) {
        const int64_t i = c + tid;
        const uint32_t key = i < n ? order_key(x[i]) : 0u;
        const int eq = i < n && key == T, gt = i < n && key > T;
        int n_eq, n_take;
        const int eq_before = block_scan(eq, ws, &n_eq) - eq;
        const int take = gt || (eq && base_eq + eq_before < need);
        const int at = block_scan(take, ws, &n_take) - take;
        if (take) idx[base + at] = (int32_t)i;
        base += n_take;
        base_eq += n_eq;
    }
}

/* Short lists (Quest's pages, n <= TOPK_SMALL): one block ranks every slot against all others in shared memory
 * (rank = the slots with a larger key, or the same key and a lower slot) and takes those of rank < k in slot
 * order: the same set and order as the radix select, in one read of the scores and a few syncs instead of four
 * histogram passes with their syncs. */
enum { TOPK_SMALL = 1024 };

__global__ void __launch_bounds__(TOPK_THREADS) k_topk_rank(int32_t *idx, int64_t idx_stride, const float *x,
                                                             int64_t x_stride, int n, int k) {
    idx += blockIdx.x * idx_stride, x += blockIdx.x * x_stride;
    __shared__ uint32_t keys[TOPK_SMALL];
    __shared__ int ws[32];
    const int i = threadIdx.x;
    if (i < n) keys[i] = order_key(x[i]);
    __syncthreads();
    int take = 0;
    if (i < n) {
        const uint32_t ki = keys[i];
        int rank = 0;
        for (int j = 0; j < n; j++) {
            const uint32_t kj = keys[j];
            rank += kj > ki || (kj == ki && j < i);
        }
        take = rank < k;
    }
    int total;
    const int at = block_scan(take, ws, &total) - take;
    if (take) idx[at] = (int32_t)i;
}

/* rows of one launch at most (the grid's x) */
static int topk_launch(cuda_kvops *o, int32_t *idx, int64_t idx_stride, const float *score, int64_t score_stride,
                       int64_t rows, int64_t n, int64_t k, char *err, size_t err_len) {
    if (k > n) k = n;
    for (int64_t r0 = 0; r0 < rows && k > 0; r0 += 65535) {
        const unsigned m = (unsigned)(rows - r0 < 65535 ? rows - r0 : 65535);
        int32_t *i0 = idx + r0 * idx_stride;
        const float *s0 = score + r0 * score_stride;
        if (n <= TOPK_SMALL) {
            k_topk_rank<<<m, TOPK_THREADS, 0, o->stream>>>(i0, idx_stride, s0, score_stride, (int)n, (int)k);
            if (CK_LAUNCH(k_topk_rank)) return failed(o, err, err_len);
        } else {
            k_topk_radix<<<m, TOPK_THREADS, 0, o->stream>>>(i0, idx_stride, s0, score_stride, n, k);
            if (CK_LAUNCH(k_topk_radix)) return failed(o, err, err_len);
        }
    }
    return 0;
}

static int cu_topk_idx(kvb_backend *be, int32_t *idx, const float *score, int64_t n, int64_t k, char *err,
                       size_t err_len) {
    cuda_kvops *o = OPS(be);
    if (be->error[0]) return failed(o, err, err_len);
    return topk_launch(o, idx, 0, score, 0, 1, n, k, err, err_len);
}

static int cu_topk_rows(kvb_backend *be, int32_t *idx, int64_t idx_stride, const float *score, int64_t score_stride,
                        int64_t rows, int64_t n, int64_t k, char *err, size_t err_len) {
    cuda_kvops *o = OPS(be);
    if (be->error[0]) return failed(o, err, err_len);
    return topk_launch(o, idx, idx_stride, score, score_stride, rows, n, k, err, err_len);
}

__global__ void k_iota(int32_t *idx, int32_t start, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        idx[i] = start + (int32_t)i;
}

static int cu_iota(kvb_backend *be, int32_t *idx, int32_t start, int64_t n, char *err, size_t err_len) {
    cuda_kvops *o = OPS(be);
    if (be->error[0]) return failed(o, err, err_len);
    if (n <= 0) return 0;
    k_iota<<<blocks_for(n, 256), 256, 0, o->stream>>>(idx, start, n);
    return CK_LAUNCH(k_iota) ? failed(o, err, err_len) : 0;
}

__global__ void k_gather_f32(float *dst, const float *src, const int32_t *idx, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = src[idx[i]];
}

static int cu_gather_f32(kvb_backend *be, float *dst, const float *src, const int32_t *idx, int64_t n, char *err,
                         size_t err_len) {
    cuda_kvops *o = OPS(be);
    if (be->error[0]) return failed(o, err, err_len);
    if (n <= 0) return 0;
    k_gather_f32<<<blocks_for(n, 256), 256, 0, o->stream>>>(dst, src, idx, n);
    return CK_LAUNCH(k_gather_f32) ? failed(o, err, err_len) : 0;
}

/* ---- round_scores: a thread per round, summing in the header's order ---- */

typedef struct {
    const int32_t *round[KVB_MAX_KV_HEADS];
    int64_t n[KVB_MAX_KV_HEADS];
} round_lists;

__global__ void k_round_scores(double *out, int32_t *present, int n_round, const float *p, int64_t stride, int G,
                               int n_head_kv, int64_t n_q, round_lists rl, int32_t skip) {
    const int rd = blockIdx.x * blockDim.x + threadIdx.x;
    if (rd >= n_round || rd == skip) return;
    double acc = out[rd];
    int hit = 0;
    for (int g = 0; g < n_head_kv; g++)
        for (int r = 0; r < G; r++)
            for (int64_t t = 0; t < n_q; t++) {
                const float *pr = p + ((int64_t)(g * G + r) * n_q + t) * stride;
                for (int64_t j = 0; j < rl.n[g]; j++)
                    if (rl.round[g][j] == rd) acc += pr[j], hit = 1;
            }
    out[rd] = acc;
    if (hit) present[rd] = 1;
}

static int cu_round_scores(kvb_backend *be, double *out, int32_t *present, int n_round, const float *probs,
                           int64_t stride, int n_head, int n_head_kv, int64_t n_q, const int32_t *const *round,
                           const int64_t *n, int32_t skip, char *err, size_t err_len) {
    cuda_kvops *o = OPS(be);
    if (be->error[0]) return failed(o, err, err_len);
    if (n_head <= 0 || n_head_kv <= 0 || n_head % n_head_kv || n_head_kv > KVB_MAX_KV_HEADS)
        return kvb_errf(err, err_len, "round_scores: %d query heads over %d KV heads (at most %d)", n_head, n_head_kv,
                   (int)KVB_MAX_KV_HEADS);
    if (n_round <= 0) return 0;
    round_lists rl;
    memset(&rl, 0, sizeof rl);
    for (int g = 0; g < n_head_kv; g++) rl.round[g] = round[g], rl.n[g] = n[g];
    k_round_scores<<<blocks_for(n_round, 64), 64, 0, o->stream>>>(out, present, n_round, probs, stride,
                                                                  n_head / n_head_kv, n_head_kv, n_q, rl, skip);
    return CK_LAUNCH(k_round_scores) ? failed(o, err, err_len) : 0;
}

/* ---- PoD: pod_share (a block per base head), pod_merge (a block per query head) ----
 *
 * Both keep the header's orders (the distant mass in KVB_POD_LANES double partial sums, one thread each; per output
 * channel a float sum over the distant rows in row order by one thread), but no longer wait on a global load per
 * term: the block first stages a chunk of the terms in shared memory with every thread loading (coalesced, many
 * loads in flight), then the owning threads add the chunk from shared memory. The sums are the same operations in
 * the same order as before, so the results are unchanged bit for bit; a decode step of PoD on the default model's
 * shapes spent ~60 ms in these two kernels' serial global loads. */

enum { POD_SHARE_THREADS = 256, POD_SHARE_CHUNK = 2048, POD_MERGE_FLOATS = 8192 };
static_assert(POD_SHARE_CHUNK % KVB_POD_LANES == 0 && POD_SHARE_THREADS >= KVB_POD_LANES, "pod_share's lanes");

__global__ void __launch_bounds__(POD_SHARE_THREADS) k_pod_share(float *pd, int64_t pd_stride, float *lse_d,
                                                                 const float *p, int64_t stride, const float *lse_p,
                                                                 const unsigned char *is_base, int64_t first,
                                                                 int64_t n_dist) {
    const int h = blockIdx.x;
    if (!is_base[h]) return;
    const float *ph = p + (int64_t)h * stride + first;
    __shared__ float chunk[POD_SHARE_CHUNK];
    __shared__ double lane[KVB_POD_LANES], m;
    double s = 0; /* thread t < KVB_POD_LANES: partial sum t (slots t, t + 32, ... in order); chunks hold whole lanes */
    for (int64_t c0 = 0; c0 < n_dist; c0 += POD_SHARE_CHUNK) {
        const int nc = n_dist - c0 < POD_SHARE_CHUNK ? (int)(n_dist - c0) : POD_SHARE_CHUNK;
        for (int i0 = 0; i0 < nc; i0 += POD_SHARE_THREADS * 8) { /* 8 loads in flight a thread */
            float x[8];
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const int i = i0 + u * POD_SHARE_THREADS + threadIdx.x;
                x[u] = i < nc ? ph[c0 + i] : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const int i = i0 + u * POD_SHARE_THREADS + threadIdx.x;
                if (i < nc) chunk[i] = x[u];
            }
        }
        __syncthreads();
        if (threadIdx.x < KVB_POD_LANES)
#pragma unroll 8
            for (int i = threadIdx.x; i < nc; i += KVB_POD_LANES) s += chunk[i];
        __syncthreads(); /* the chunk is read before the next one overwrites it */
    }
    if (threadIdx.x < KVB_POD_LANES) lane[threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0;
        for (int k = 0; k < KVB_POD_LANES; k++) t += lane[k]; /* the header's lane order */
        m = t;
    }
    __syncthreads();
    const float inv = m > 0 ? (float)(1.0 / m) : 0.0f;
    for (int64_t i = threadIdx.x; i < n_dist; i += blockDim.x) pd[(int64_t)h * pd_stride + i] = ph[i] * inv;
    if (threadIdx.x == 0) lse_d[h] = m > 0 ? (float)((double)lse_p[h] + log(m)) : -INFINITY;
}

static int cu_pod_share(kvb_backend *be, float *pd, int64_t pd_stride, float *lse_d, const float *probs, int64_t stride,
                        const float *lse_p, int n_head, const unsigned char *is_base, int64_t first, int64_t n_dist,
                        char *err, size_t err_len) {
    cuda_kvops *o = OPS(be);
    if (be->error[0]) return failed(o, err, err_len);
    if (n_head <= 0) return 0;
    const unsigned char *d_base = (const unsigned char *)params_in(o, is_base, (size_t)n_head);
    if (!d_base) return failed(o, err, err_len);
    k_pod_share<<<(unsigned)n_head, POD_SHARE_THREADS, 0, o->stream>>>(pd, pd_stride, lse_d, probs, stride, lse_p, d_base,
                                                                       first, n_dist);
    return CK_LAUNCH(k_pod_share) ? failed(o, err, err_len) : 0;
}

/* rows of V a pod_merge chunk stages (as floats: at most POD_MERGE_FLOATS of them): a power of two up to 256, so
 * that a staged chunk never straddles the header's KVB_POD_CHUNK rows */
static int pod_merge_rows(int head_dim) {
    int r = 1;
    while (r < 256 && 2 * r * head_dim <= POD_MERGE_FLOATS) r *= 2;
    return r;
}

enum { POD_MERGE_THREADS = 512, POD_U = 8 };

/* a block per query head r (POD_MERGE_THREADS threads, or head_dim rounded up to a warp when larger), thread e
 * owns channel e; dynamic shared memory: rows x head_dim floats of V, then rows weights. The staging loop gives
 * every thread POD_U loads in flight before it stores any (a thread with one load at a time, as before, left a
 * block of two warps waiting on memory for each term: ~1 ms a launch at 5600 rows). */
__global__ void k_pod_merge(float *out, const float *lse_p, const float *lse_d, const float *pd, int64_t pd_stride,
                            const void *v, int f16, int head_dim, int64_t n_dist, double tau, unsigned long long *counts,
                            int rows) {
    extern __shared__ float pod_sm[];
    float *vs = pod_sm, *ws = pod_sm + (size_t)rows * head_dim;
    const int r = blockIdx.x, e = threadIdx.x;
    const double lp = lse_p[r], ld = lse_d[r];
    const double gate = isfinite(ld) ? 1.0 / (1.0 + exp(ld - lp)) : 1.0; /* eq. 4 */
    if (gate >= tau) {
        if (threadIdx.x == 0) atomicAdd(&counts[1], 1ull);
        return;
    }
    if (threadIdx.x == 0) atomicAdd(&counts[0], 1ull);
    const float *w = pd + (int64_t)r * pd_stride;
    const __half *vh = (const __half *)v;
    const float *vf = (const float *)v;
    float od = 0, part = 0; /* the header's order: part sums a KVB_POD_CHUNK of rows, od adds the chunks */
    for (int64_t i0 = 0; i0 < n_dist; i0 += rows) {
        const int nr = n_dist - i0 < rows ? (int)(n_dist - i0) : rows;
        const int64_t base = i0 * head_dim;
        const int cnt = nr * head_dim;
        for (int k0 = 0; k0 < cnt; k0 += (int)blockDim.x * POD_U) {
            float x[POD_U];
#pragma unroll
            for (int u = 0; u < POD_U; u++) {
                const int k = k0 + u * (int)blockDim.x + threadIdx.x;
                x[u] = k < cnt ? (f16 ? __half2float(vh[base + k]) : vf[base + k]) : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < POD_U; u++) {
                const int k = k0 + u * (int)blockDim.x + threadIdx.x;
                if (k < cnt) vs[k] = x[u];
            }
        }
        for (int k = threadIdx.x; k < nr; k += blockDim.x) ws[k] = w[i0 + k];
        __syncthreads();
        if (e < head_dim) {
#pragma unroll 8
            for (int j = 0; j < nr; j++) part += ws[j] * vs[j * head_dim + e];
            if ((i0 + nr) % KVB_POD_CHUNK == 0 || i0 + nr == n_dist) od += part, part = 0;
        }
        __syncthreads(); /* the chunk is read before the next one overwrites it */
    }
    if (e < head_dim) {
        float *o = out + (int64_t)r * head_dim + e;
        *o = (float)(gate * *o + (1.0 - gate) * od);
    }
}

static int cu_pod_merge(kvb_backend *be, float *out, const float *lse_p, const float *lse_d, const float *pd,
                        int64_t pd_stride, const void *v, kvb_dtype dtype, int G, int head_dim, int64_t n_dist, double tau,
                        int64_t *counts, char *err, size_t err_len) {
    cuda_kvops *o = OPS(be);
    if (be->error[0]) return failed(o, err, err_len);
    if (G <= 0 || head_dim <= 0) return 0;
    if (head_dim > 1024) return kvb_errf(err, err_len, "pod_merge: head_dim %d over 1024", head_dim);
    const int rows = pod_merge_rows(head_dim), wide = (head_dim + 31) / 32 * 32;
    const int threads = wide > POD_MERGE_THREADS ? wide : POD_MERGE_THREADS;
    /* at most POD_MERGE_FLOATS + 256 floats (33 KB): under the 48 KB default */
    const size_t smem = ((size_t)rows * head_dim + (size_t)rows) * sizeof(float);
    k_pod_merge<<<(unsigned)G, (unsigned)threads, smem, o->stream>>>(out, lse_p, lse_d, pd, pd_stride, v, dtype == KVB_F16,
                                                                     head_dim, n_dist, tau,
                                                                     (unsigned long long *)counts, rows);
    return CK_LAUNCH(k_pod_merge) ? failed(o, err, err_len) : 0;
}

/* ---- knorm, quest (issue 19): a thread per output, looping in the header's order ---- */

__device__ float row_elem(const void *k, int f16, int64_t at) {
    return f16 ? __half2float(((const __half *)k)[at]) : ((const float *)k)[at];
}

__global__ void k_row_norms(float *out, const void *k, int f16, int dim, int64_t n, int negate) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        double sum = 0;
        for (int e = 0; e < dim; e++) {
            const double x = row_elem(k, f16, i * dim + e);
            sum += x * x;
        }
        const float norm = (float)sqrt(sum);
        out[i] = negate ? -norm : norm;
    }
}

static int cu_row_norms(kvb_backend *be, float *out, const void *k, kvb_dtype dtype, int dim, int64_t n, int negate,
                        char *err, size_t err_len) {
    cuda_kvops *o = OPS(be);
    if (be->error[0]) return failed(o, err, err_len);
    if (dim <= 0) return kvb_errf(err, err_len, "row_norms: dim %d", dim);
    if (n <= 0) return 0;
    k_row_norms<<<blocks_for(n, 256), 256, 0, o->stream>>>(out, k, dtype == KVB_F16, dim, n, negate);
    return CK_LAUNCH(k_row_norms) ? failed(o, err, err_len) : 0;
}

/* a thread per (block, element) of the blocks first_block.. (grid-strided over x); one head's metadata */
__device__ void block_minmax_one(float *kmin, float *kmax, const void *k, int f16, int dim, int64_t block,
                                 int64_t first_block, int64_t n_out, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_out; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t b = first_block + i / dim, e = i % dim;
        const int64_t end = (b + 1) * block < n ? (b + 1) * block : n;
        float mn = INFINITY, mx = -INFINITY;
        for (int64_t r = b * block; r < end; r++) {
            const float x = row_elem(k, f16, r * dim + e);
            mn = x < mn ? x : mn;
            mx = x > mx ? x : mx;
        }
        kmin[b * dim + e] = mn;
        kmax[b * dim + e] = mx;
    }
}

__global__ void k_block_minmax(float *kmin, float *kmax, const void *k, int f16, int dim, int64_t block,
                               int64_t first_block, int64_t n_out, int64_t n) {
    block_minmax_one(kmin, kmax, k, f16, dim, block, first_block, n_out, n);
}

/* the *_heads ops take up to HEADS_BATCH heads a launch, their pointers by value, a head per grid row (y) */
enum { HEADS_BATCH = 32 };
typedef struct {
    float *kmin[HEADS_BATCH], *kmax[HEADS_BATCH];
    const void *k[HEADS_BATCH];
} minmax_batch;

__global__ void k_block_minmax_heads(minmax_batch h, int f16, int dim, int64_t block, int64_t first_block,
                                     int64_t n_out, int64_t n) {
    const int j = blockIdx.y;
    block_minmax_one(h.kmin[j], h.kmax[j], h.k[j], f16, dim, block, first_block, n_out, n);
}

static int minmax_args(int dim, int64_t block, int64_t from, int64_t n, int64_t *first, int64_t *n_block, char *err,
                       size_t err_len) {
    if (dim <= 0 || block <= 0 || from < 0)
        return kvb_errf(err, err_len, "block_minmax: dim %d, block %lld, from %lld", dim, (long long)block, (long long)from);
    *first = from / block;
    *n_block = (n + block - 1) / block - *first;
    return 0;
}

static int cu_block_minmax(kvb_backend *be, float *kmin, float *kmax, const void *k, kvb_dtype dtype, int dim,
                           int64_t block, int64_t from, int64_t n, char *err, size_t err_len) {
    cuda_kvops *o = OPS(be);
    if (be->error[0]) return failed(o, err, err_len);
    int64_t first, n_block;
    if (minmax_args(dim, block, from, n, &first, &n_block, err, err_len)) return -1;
    if (n_block <= 0) return 0;
    k_block_minmax<<<blocks_for(n_block * dim, 256), 256, 0, o->stream>>>(kmin, kmax, k, dtype == KVB_F16, dim, block,
                                                                         first, n_block * dim, n);
    return CK_LAUNCH(k_block_minmax) ? failed(o, err, err_len) : 0;
}

static int cu_block_minmax_heads(kvb_backend *be, int n_heads, float *const *kmin, float *const *kmax,
                                 const void *const *k, kvb_dtype dtype, int dim, int64_t block, int64_t from, int64_t n,
                                 char *err, size_t err_len) {
    cuda_kvops *o = OPS(be);
    if (be->error[0]) return failed(o, err, err_len);
    if (n_heads < 0) return kvb_errf(err, err_len, "block_minmax_heads: %d heads", n_heads);
    int64_t first, n_block;
    if (minmax_args(dim, block, from, n, &first, &n_block, err, err_len)) return -1;
    if (n_block <= 0) return 0;
    for (int j0 = 0; j0 < n_heads; j0 += HEADS_BATCH) {
        const int m = n_heads - j0 < HEADS_BATCH ? n_heads - j0 : HEADS_BATCH;
        minmax_batch h;
        for (int j = 0; j < m; j++) h.kmin[j] = kmin[j0 + j], h.kmax[j] = kmax[j0 + j], h.k[j] = k[j0 + j];
        dim3 grid(blocks_for(n_block * dim, 256), (unsigned)m);
        k_block_minmax_heads<<<grid, 256, 0, o->stream>>>(h, dtype == KVB_F16, dim, block, first, n_block * dim, n);
        if (CK_LAUNCH(k_block_minmax_heads)) return failed(o, err, err_len);
    }
    return 0;
}

/* a thread per block b (grid-strided over x): one KV head's page scores */
__device__ void block_scores_one(float *score, const float *q, const float *kmin, const float *kmax, int G, int dim,
                                 int64_t n_block, int group_max) {
    for (int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; b < n_block; b += (int64_t)gridDim.x * blockDim.x) {
        const float *lo = kmin + b * dim, *hi = kmax + b * dim;
        double acc = 0;
        for (int r = 0; r < G; r++) {
            double u = 0;
            for (int e = 0; e < dim; e++) {
                const double a = (double)q[r * dim + e] * lo[e], c = (double)q[r * dim + e] * hi[e];
                u += a > c ? a : c;
            }
            acc = group_max ? (r == 0 || u > acc ? u : acc) : acc + u;
        }
        score[b] = (float)acc;
    }
}

__global__ void k_block_scores(float *score, const float *q, const float *kmin, const float *kmax, int G, int dim,
                               int64_t n_block, int group_max) {
    block_scores_one(score, q, kmin, kmax, G, dim, n_block, group_max);
}

typedef struct {
    const float *kmin[HEADS_BATCH], *kmax[HEADS_BATCH];
} scores_batch;

/* head j0 + y: its scores at score + y * score_stride, its query rows at q + y * G * dim (score and q advanced to j0) */
__global__ void k_block_scores_heads(scores_batch h, float *score, int64_t score_stride, const float *q, int G, int dim,
                                     int64_t n_block, int group_max) {
    const int j = blockIdx.y;
    block_scores_one(score + j * score_stride, q + (int64_t)j * G * dim, h.kmin[j], h.kmax[j], G, dim, n_block, group_max);
}

static int cu_block_scores(kvb_backend *be, float *score, const float *q, const float *kmin, const float *kmax, int G,
                           int dim, int64_t n_block, int group_max, char *err, size_t err_len) {
    cuda_kvops *o = OPS(be);
    if (be->error[0]) return failed(o, err, err_len);
    if (G <= 0 || dim <= 0) return kvb_errf(err, err_len, "block_scores: %d query heads of dim %d", G, dim);
    if (n_block <= 0) return 0;
    k_block_scores<<<blocks_for(n_block, 128), 128, 0, o->stream>>>(score, q, kmin, kmax, G, dim, n_block, group_max);
    return CK_LAUNCH(k_block_scores) ? failed(o, err, err_len) : 0;
}

static int cu_block_scores_heads(kvb_backend *be, int n_heads, float *score, int64_t score_stride, const float *q,
                                 const float *const *kmin, const float *const *kmax, int G, int dim, int64_t n_block,
                                 int group_max, char *err, size_t err_len) {
    cuda_kvops *o = OPS(be);
    if (be->error[0]) return failed(o, err, err_len);
    if (G <= 0 || dim <= 0 || n_heads < 0)
        return kvb_errf(err, err_len, "block_scores_heads: %d heads of %d query heads of dim %d", n_heads, G, dim);
    if (n_block <= 0) return 0;
    for (int j0 = 0; j0 < n_heads; j0 += HEADS_BATCH) {
        const int m = n_heads - j0 < HEADS_BATCH ? n_heads - j0 : HEADS_BATCH;
        scores_batch h;
        for (int j = 0; j < m; j++) h.kmin[j] = kmin[j0 + j], h.kmax[j] = kmax[j0 + j];
        dim3 grid(blocks_for(n_block, 128), (unsigned)m);
        k_block_scores_heads<<<grid, 128, 0, o->stream>>>(h, score + (size_t)j0 * score_stride, score_stride,
                                                          q + (size_t)j0 * G * dim, G, dim, n_block, group_max);
        if (CK_LAUNCH(k_block_scores_heads)) return failed(o, err, err_len);
    }
    return 0;
}

__global__ void k_block_expand(int32_t *idx, const int32_t *blocks, int64_t block, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        idx[i] = (int32_t)(blocks[i / block] * block + i % block);
}

/* row y: the listed blocks, then tail, tail + 1, ... */
__global__ void k_block_expand_rows(int32_t *idx, int64_t idx_stride, const int32_t *blocks, int64_t blocks_stride,
                                    int64_t n_listed, int64_t tail, int64_t block, int64_t n) {
    int32_t *out = idx + blockIdx.y * idx_stride;
    const int32_t *list = blocks + blockIdx.y * blocks_stride;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t b = i / block;
        out[i] = (int32_t)((b < n_listed ? list[b] : tail + b - n_listed) * block + i % block);
    }
}

static int cu_block_expand(kvb_backend *be, int32_t *idx, const int32_t *blocks, int64_t block, int64_t n, char *err,
                           size_t err_len) {
    cuda_kvops *o = OPS(be);
    if (be->error[0]) return failed(o, err, err_len);
    if (block <= 0) return kvb_errf(err, err_len, "block_expand: block %lld", (long long)block);
    if (n <= 0) return 0;
    k_block_expand<<<blocks_for(n, 256), 256, 0, o->stream>>>(idx, blocks, block, n);
    return CK_LAUNCH(k_block_expand) ? failed(o, err, err_len) : 0;
}

static int cu_block_expand_rows(kvb_backend *be, int rows, int32_t *idx, int64_t idx_stride, const int32_t *blocks,
                                int64_t blocks_stride, int64_t n_listed, int64_t tail, int64_t block, int64_t n,
                                char *err, size_t err_len) {
    cuda_kvops *o = OPS(be);
    if (be->error[0]) return failed(o, err, err_len);
    if (block <= 0 || rows < 0 || n_listed < 0)
        return kvb_errf(err, err_len, "block_expand_rows: %d rows, block %lld, %lld listed", rows, (long long)block,
                        (long long)n_listed);
    for (int j0 = 0; j0 < rows && n > 0; j0 += 65535) { /* grid rows */
        const int m = rows - j0 < 65535 ? rows - j0 : 65535;
        dim3 grid(blocks_for(n, 256), (unsigned)m);
        k_block_expand_rows<<<grid, 256, 0, o->stream>>>(idx + (size_t)j0 * idx_stride, idx_stride,
                                                         blocks + (size_t)j0 * blocks_stride, blocks_stride, n_listed,
                                                         tail, block, n);
        if (CK_LAUNCH(k_block_expand_rows)) return failed(o, err, err_len);
    }
    return 0;
}

/* ---- AdaKV: fill_idx_f32 (a thread per index), split_rows_idx (a block per row, bounds by binary search) ---- */

__global__ void k_fill_idx_f32(float *dst, const int32_t *idx, int64_t n, float value) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[idx[i]] = value;
}

static int cu_fill_idx_f32(kvb_backend *be, float *dst, const int32_t *idx, int64_t n, float value, char *err,
                           size_t err_len) {
    cuda_kvops *o = OPS(be);
    if (be->error[0]) return failed(o, err, err_len);
    if (n <= 0) return 0;
    k_fill_idx_f32<<<blocks_for(n, 256), 256, 0, o->stream>>>(dst, idx, n, value);
    return CK_LAUNCH(k_fill_idx_f32) ? failed(o, err, err_len) : 0;
}

/* first i in [0, n) with flat[i] >= x (flat ascending), n when none */
__device__ int64_t lower_bound_i32(const int32_t *flat, int64_t n, int64_t x) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (flat[mid] < x) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

__global__ void k_split_rows_idx(int32_t *out, int64_t out_stride, int32_t *counts, const int32_t *flat, int64_t n,
                                 int64_t row_len) {
    __shared__ int64_t span[2];
    const int64_t r = blockIdx.x;
    if (threadIdx.x == 0) {
        span[0] = lower_bound_i32(flat, n, r * row_len);
        span[1] = lower_bound_i32(flat, n, (r + 1) * row_len);
        counts[r] = (int32_t)(span[1] - span[0]);
    }
    __syncthreads();
    for (int64_t j = threadIdx.x; j < span[1] - span[0]; j += blockDim.x)
        out[r * out_stride + j] = (int32_t)(flat[span[0] + j] - r * row_len);
}

static int cu_split_rows_idx(kvb_backend *be, int32_t *out, int64_t out_stride, int32_t *counts, const int32_t *flat,
                             int64_t n, int64_t row_len, int rows, char *err, size_t err_len) {
    cuda_kvops *o = OPS(be);
    if (be->error[0]) return failed(o, err, err_len);
    if (row_len < 1 || rows < 0 || rows > 65535)
        return kvb_errf(err, err_len, "split_rows_idx: %d rows of %lld", rows, (long long)row_len);
    if (rows == 0) return 0;
    k_split_rows_idx<<<(unsigned)rows, 256, 0, o->stream>>>(out, out_stride, counts, flat, n < 0 ? 0 : n, row_len);
    return CK_LAUNCH(k_split_rows_idx) ? failed(o, err, err_len) : 0;
}

/* ---- install ---- */

int cuda_install_data_ops(kvb_backend *be, cuda_kvops *o, cudaStream_t stream) {
    memset(o, 0, sizeof *o);
    o->be = be;
    o->stream = stream;
    if (CK(cudaEventCreateWithFlags(&o->stage_done, cudaEventDisableTiming))) return -1;
    for (int i = 0; i < KVOPS_PARAM_RING; i++)
        if (CK(cudaEventCreateWithFlags(&o->param_done[i], cudaEventDisableTiming))) return -1;
    be->copy = cu_copy;
    be->zero = cu_zero;
    be->kv_gather = cu_kv_gather;
    be->kv_load = cu_kv_load;
    be->kv_evict = cu_kv_evict;
    be->probs_reduce = cu_probs_reduce;
    be->attention_colsum = cu_attention_colsum;
    be->pool1d = cu_pool1d;
    be->topk_idx = cu_topk_idx;
    be->topk_rows = cu_topk_rows;
    be->iota = cu_iota;
    be->gather_f32 = cu_gather_f32;
    be->round_scores = cu_round_scores;
    be->pod_share = cu_pod_share;
    be->pod_merge = cu_pod_merge;
    be->row_norms = cu_row_norms;
    be->block_minmax = cu_block_minmax;
    be->block_scores = cu_block_scores;
    be->block_expand = cu_block_expand;
    be->block_minmax_heads = cu_block_minmax_heads;
    be->block_scores_heads = cu_block_scores_heads;
    be->block_expand_rows = cu_block_expand_rows;
    be->fill_idx_f32 = cu_fill_idx_f32;
    be->split_rows_idx = cu_split_rows_idx;
    return 0;
}

void cuda_kvops_release(cuda_kvops *o) {
    cuda_graph_release(o);
    if (o->stream) cudaStreamSynchronize(o->stream);
    cudaFreeHost(o->stage);
    for (int i = 0; i < KVOPS_PARAM_RING; i++) {
        cudaFreeHost(o->param[i]);
        cudaFree(o->param_dev[i]);
        if (o->param_done[i]) cudaEventDestroy(o->param_done[i]);
    }
    cudaFree(o->scratch);
    cudaFree(o->gelu_table);
    if (o->stage_done) cudaEventDestroy(o->stage_done);
    memset(o, 0, sizeof *o);
}

/* ---- for op files beside this one (kvquant.cu) ---- */

int cuda_kvops_check(cuda_kvops *o, cudaError_t e, const char *call, const char *file, int line) {
    return ck(o, e, call, file, line);
}

int cuda_kvops_failed(cuda_kvops *o, char *err, size_t err_len) { return failed(o, err, err_len); }

void *cuda_kvops_scratch(cuda_kvops *o, size_t need) { return grow_dev(o, &o->scratch, &o->scratch_bytes, need) ? NULL : o->scratch; }
