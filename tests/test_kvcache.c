/* test_kvcache.c — the KV store, byte accounting and the profiler: stored values, positions and rounds
 * through retain/evict/gather/tier moves on the CPU backend, bytes per tier and copies per direction against
 * hand-computed figures, and profiler totals. The store's tests run twice: one allocation per head, then the
 * per-layer slab (kvcache.h; test_kvcache_slab compares the two call by call). */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util_common.h"
#include "engine/kvcache.h"
#include "kernels/backend.h"
#include "engine/mem.h"
#include "engine/profile.h"

enum { L = 2, H = 3, D = 8 };
static char err[256];
static kvb_backend *be; /* the CPU backend: device-tier memory is the heap, so the test may read it */
static kvc_layout layout; /* the suite's layout */

static int suite_heads(void) { return layout = KVC_LAYOUT_HEADS, 0; }
static int suite_slab(void) { return layout = KVC_LAYOUT_SLAB, 0; }

static kvc_store *create(kvb_mem *m, kvb_dtype dt, int64_t cap0) {
    kvc_store *kv = kvc_create(L, H, D, dt, cap0, be, m, err, sizeof err);
    CU_ASSERT_FATAL(kv != NULL && kvc_set_layout(kv, layout, err, sizeof err) == 0);
    return kv;
}

/* k[t][h][d] = t + h/10 + d/100 (exactly representable in f16 for small t? close enough: checked with f16 rounding) */
static float kval(int t, int h, int d) { return (float)t + h * 0.125f + d * 0.0078125f; }
static float vval(int t, int h, int d) { return -(float)t - h * 0.25f - d * 0.015625f; }

static void fill(float *k, float *v, int t0, int n) {
    for (int t = 0; t < n; t++)
        for (int h = 0; h < H; h++)
            for (int d = 0; d < D; d++) {
                k[(t * H + h) * D + d] = kval(t0 + t, h, d);
                v[(t * H + h) * D + d] = vval(t0 + t, h, d);
            }
}

static kvc_store *make(kvb_mem *m, kvb_dtype dt, int n_tok) {
    kvc_store *kv = create(m, dt, 4);
    float *k = malloc(sizeof(float) * n_tok * H * D), *v = malloc(sizeof(float) * n_tok * H * D);
    int32_t *pos = malloc(sizeof(int32_t) * n_tok), *round = malloc(sizeof(int32_t) * n_tok);
    fill(k, v, 0, n_tok);
    for (int t = 0; t < n_tok; t++) pos[t] = 100 + t, round[t] = t / 4;
    for (int l = 0; l < L; l++) CU_ASSERT(kvc_append(kv, l, n_tok, k, v, pos, round, err, sizeof err) == 0);
    free(k), free(v), free(pos), free(round);
    return kv;
}

static void test_append_stores_rows_positions_and_rounds(void) {
    kvb_mem m;
    kvb_mem_init(&m);
    for (int dt = 0; dt < 2; dt++) {
        kvc_store *kv = make(&m, (kvb_dtype)dt, 10);
        kvc_view v = kvc_head_view(kv, 1, 2);
        CU_ASSERT_EQUAL(v.n, 10);
        for (int t = 0; t < 10; t++) {
            CU_ASSERT(v.pos[t] == 100 + t && v.round[t] == t / 4);
            for (int d = 0; d < D; d++) {
                float k = dt == KVB_F32 ? ((const float *)v.k)[t * D + d] : kvb_f16_to_f32(((const kvb_f16 *)v.k)[t * D + d]);
                float val = dt == KVB_F32 ? ((const float *)v.v)[t * D + d] : kvb_f16_to_f32(((const kvb_f16 *)v.v)[t * D + d]);
                CU_ASSERT(fabsf(k - kval(t, 2, d)) <= (dt ? 1e-2f : 0));
                CU_ASSERT(fabsf(val - vval(t, 2, d)) <= (dt ? 1e-2f : 0));
            }
        }
        kvc_free(kv);
    }
    CU_ASSERT_EQUAL(kvb_mem_current(&m, KVB_TIER_DEVICE, KVB_MEM_KV), 0);
    kvb_mem_destroy(&m);
}

static void test_retain_keeps_exactly_the_index_set_and_frees_bytes(void) {
    kvb_mem m;
    kvb_mem_init(&m);
    kvc_store *kv = make(&m, KVB_F32, 10);
    int64_t slot = 2 * D * 4 + 8; /* K + V rows in f32, position, round */
    CU_ASSERT_EQUAL(kvc_slot_bytes(kv), slot);
    CU_ASSERT_EQUAL(kvc_used_bytes(kv, KVB_TIER_DEVICE), (int64_t)L * H * 10 * slot);
    int32_t keep[] = {0, 3, 9};
    CU_ASSERT(kvc_retain(kv, 0, 1, keep, 3, err, sizeof err) == 0);
    kvc_view v = kvc_head_view(kv, 0, 1);
    CU_ASSERT(v.n == 3 && v.pos[1] == 103 && v.round[2] == 2 && ((const float *)v.k)[2 * D] == kval(9, 1, 0));
    /* the other heads are untouched; allocated bytes shrink to what is held */
    CU_ASSERT_EQUAL(kvc_n(kv, 0, 0), 10);
    CU_ASSERT_EQUAL(kvc_used_bytes(kv, KVB_TIER_DEVICE), (int64_t)(L * H - 1) * 10 * slot + 3 * slot);
    CU_ASSERT_EQUAL(kvb_mem_current(&m, KVB_TIER_DEVICE, KVB_MEM_KV), kvc_bytes(kv, KVB_TIER_DEVICE));
    int32_t unsorted[] = {3, 1};
    CU_ASSERT(kvc_retain(kv, 0, 0, unsorted, 2, err, sizeof err) != 0 && strstr(err, "ascending"));
    int32_t out_of_range[] = {1, 10};
    CU_ASSERT(kvc_retain(kv, 0, 0, out_of_range, 2, err, sizeof err) != 0 && strstr(err, "out of range"));
    CU_ASSERT(kvc_retain(kv, 5, 0, keep, 1, err, sizeof err) != 0);
    kvc_free(kv);
    kvb_mem_destroy(&m);
}

/* A sliding window: dropping the oldest slots keeps the rest in order, counts only the held bytes at once, and
 * decode steps past the window (append one, drop one) keep the storage bounded with every row intact. */
static void test_drop_front_keeps_the_window_in_order_and_bounded(void) {
    kvb_mem m;
    kvb_mem_init(&m);
    kvc_store *kv = make(&m, KVB_F32, 10);
    const int64_t slot = kvc_slot_bytes(kv);
    CU_ASSERT(kvc_drop_front(kv, 1, 0, 4, err, sizeof err) == 0);
    kvc_view v = kvc_head_view(kv, 1, 0);
    CU_ASSERT(v.n == 6 && v.pos[0] == 104 && v.pos[5] == 109 && ((const float *)v.k)[0] == kval(4, 0, 0));
    CU_ASSERT_EQUAL(kvc_layer_used_bytes(kv, 1, KVB_TIER_DEVICE), (int64_t)(H - 1) * 10 * slot + 6 * slot);
    CU_ASSERT(kvc_drop_front(kv, 1, 0, 7, err, sizeof err) != 0);
    float k[H * D], vv[H * D];
    int64_t peak_cap = 0;
    for (int t = 10; t < 200; t++) { /* window of 6 on every head of layer 1 */
        int32_t pos = 100 + t, round = 0;
        fill(k, vv, t, 1);
        CU_ASSERT_FATAL(kvc_append(kv, 1, 1, k, vv, &pos, &round, err, sizeof err) == 0);
        for (int h = 0; h < H; h++)
            CU_ASSERT(kvc_drop_front(kv, 1, h, kvc_n(kv, 1, h) - 6, err, sizeof err) == 0);
        int64_t cap = kvc_bytes(kv, KVB_TIER_DEVICE) / slot - (int64_t)(L - 1) * H * 10;
        if (cap > peak_cap) peak_cap = cap;
    }
    for (int h = 0; h < H; h++) {
        kvc_view w = kvc_head_view(kv, 1, h);
        CU_ASSERT(w.n == 6 && w.pos[0] == 294 && w.pos[5] == 299 && ((const float *)w.k)[5 * D + 1] == kval(199, h, 1));
    }
    CU_ASSERT(peak_cap <= (int64_t)H * 32); /* compacted, not grown with the sequence */
    CU_ASSERT_EQUAL(kvb_mem_current(&m, KVB_TIER_DEVICE, KVB_MEM_KV), kvc_bytes(kv, KVB_TIER_DEVICE));
    kvc_free(kv);
    CU_ASSERT_EQUAL(kvb_mem_current(&m, KVB_TIER_DEVICE, KVB_MEM_KV), 0);
    kvb_mem_destroy(&m);
}

/* After a compression (retain) or a tier move, decode appends in place: the head's storage is not reallocated for
 * the next n/4 + 16 tokens (the first timed decode step of a compressed cell must not copy the head), and a host
 * head keeps its storage through a small compaction. */
static void test_compacted_and_moved_heads_append_in_place(void) {
    kvb_mem m;
    kvb_mem_init(&m);
    kvc_store *kv = make(&m, KVB_F32, 40);
    int32_t keep[8] = {0, 3, 7, 11, 19, 23, 31, 39};
    CU_ASSERT_FATAL(kvc_retain(kv, 0, 1, keep, 8, err, sizeof err) == 0);
    CU_ASSERT_FATAL(kvc_set_tier(kv, 1, 2, KVB_TIER_HOST, err, sizeof err) == 0);
    const void *k0 = kvc_head_view(kv, 0, 1).k, *k1 = kvc_head_view(kv, 1, 2).k;
    float k[H * D], v[H * D];
    for (int t = 0; t < 8 / 4 + 16; t++) { /* the spare of the 8-slot head, the smaller of the two */
        int32_t pos = 200 + t, round = 0;
        fill(k, v, 100 + t, 1);
        for (int l = 0; l < L; l++) CU_ASSERT_FATAL(kvc_append(kv, l, 1, k, v, &pos, &round, err, sizeof err) == 0);
    }
    kvc_view a = kvc_head_view(kv, 0, 1), b = kvc_head_view(kv, 1, 2);
    /* appended in place (a slab head's layer grew for its 40-slot heads: it moved with them) */
    CU_ASSERT((a.k == k0 || layout == KVC_LAYOUT_SLAB) && b.k == k1);
    CU_ASSERT(a.n == 8 + 18 && a.pos[1] == 103 && a.pos[8] == 200 && ((const float *)a.k)[8 * D] == kval(100, 1, 0));
    CU_ASSERT(b.n == 40 + 18 && b.tier == KVB_TIER_HOST && ((const float *)b.k)[57 * D + 3] == kval(117, 2, 3));
    int32_t few[2] = {5, 50}; /* a host head compacted to a few slots gives its storage back */
    CU_ASSERT_FATAL(kvc_retain(kv, 1, 2, few, 2, err, sizeof err) == 0);
    b = kvc_head_view(kv, 1, 2);
    CU_ASSERT(b.n == 2 && b.pos[0] == 105 && b.pos[1] == 210);
    CU_ASSERT(kvc_layer_used_bytes(kv, 1, KVB_TIER_HOST) == 2 * kvc_slot_bytes(kv));
    CU_ASSERT_EQUAL(kvb_mem_current(&m, KVB_TIER_HOST, KVB_MEM_KV), (2 + 2 / 4 + 16) * kvc_slot_bytes(kv));
    CU_ASSERT_EQUAL(kvb_mem_current(&m, KVB_TIER_DEVICE, KVB_MEM_KV) + kvb_mem_current(&m, KVB_TIER_HOST, KVB_MEM_KV),
                    kvc_bytes(kv, KVB_TIER_COUNT));
    kvc_free(kv);
    kvb_mem_destroy(&m);
}

static void test_tier_moves_and_packed_gathers_are_counted(void) {
    kvb_mem m;
    kvb_mem_init(&m);
    kvc_store *kv = make(&m, KVB_F16, 8);
    int64_t slot = kvc_slot_bytes(kv), dev0 = kvc_bytes(kv, KVB_TIER_DEVICE);
    CU_ASSERT(kvc_set_layer_tier(kv, 1, KVB_TIER_HOST, err, sizeof err) == 0);
    CU_ASSERT_EQUAL(kvc_used_bytes(kv, KVB_TIER_HOST), (int64_t)H * 8 * slot);
    CU_ASSERT_EQUAL(kvc_bytes(kv, KVB_TIER_DEVICE), dev0 / 2);
    CU_ASSERT_EQUAL(m.moved_bytes[KVB_TIER_DEVICE][KVB_TIER_HOST], (int64_t)H * 8 * slot);
    CU_ASSERT_EQUAL(kvb_mem_current(&m, KVB_TIER_HOST, KVB_MEM_KV), kvc_bytes(kv, KVB_TIER_HOST));
    int32_t idx[] = {1, 6};
    kvb_f16 k[2 * D], v[2 * D];
    int32_t pos[2];
    CU_ASSERT(kvc_gather(kv, 1, 0, idx, 2, k, v, pos, err, sizeof err) == 0); /* a host read of the host tier */
    CU_ASSERT(pos[0] == 101 && pos[1] == 106 && fabsf(kvb_f16_to_f32(k[D]) - kval(6, 0, 0)) < 1e-2f);
    CU_ASSERT_EQUAL(m.moved_bytes[KVB_TIER_HOST][KVB_TIER_DEVICE], 0);
    /* a packed load: host-tier slots into a device store, one backend gather (four arrays) counted up */
    kvc_store *vis = create(&m, KVB_F16, 0);
    kvb_traffic t0 = be->traffic;
    CU_ASSERT(kvc_append_from(vis, 1, 2, kv, 1, 2, idx, 2, 1, err, sizeof err) == 0);
    CU_ASSERT_EQUAL(m.moved_bytes[KVB_TIER_HOST][KVB_TIER_DEVICE], 2 * slot);
    CU_ASSERT_EQUAL(be->traffic.bytes[KVB_COPY_H2D] - t0.bytes[KVB_COPY_H2D], 2 * slot);
    CU_ASSERT_EQUAL(be->traffic.n[KVB_COPY_H2D] - t0.n[KVB_COPY_H2D], 4);
    kvc_view pv = kvc_head_view(vis, 1, 2);
    CU_ASSERT(pv.n == 2 && pv.pos[1] == 106 && pv.round[1] == 1);
    CU_ASSERT(kvc_append_from(vis, 0, 0, kv, 0, 0, idx, 2, 1, err, sizeof err) != 0 && strstr(err, "within the device"));
    kvc_free(vis);
    /* room reserved ahead (kvc_reserve_heads): the packed load of the same counts then allocates nothing, and loads
     * the listed rows; a negative count is refused */
    vis = create(&m, KVB_F16, 0);
    const int lay[2] = {1, 1}, hd[2] = {0, 2};
    const int32_t l0[] = {6, 1}, l2[] = {0, 3, 7}, *lists[2] = {l0, l2};
    const int64_t cnt[2] = {2, 3}, bad[2] = {2, -1};
    CU_ASSERT(kvc_reserve_heads(vis, 2, lay, hd, cnt, err, sizeof err) == 0);
    const int64_t reserved = kvb_mem_current(&m, KVB_TIER_DEVICE, KVB_MEM_KV);
    CU_ASSERT(kvc_load(vis, kv, 2, lay, hd, lists, cnt, err, sizeof err) == 0);
    CU_ASSERT_EQUAL(kvb_mem_current(&m, KVB_TIER_DEVICE, KVB_MEM_KV), reserved);
    pv = kvc_head_view(vis, 1, 2);
    CU_ASSERT(pv.n == 3 && pv.pos[0] == 100 && pv.pos[1] == 103 && pv.pos[2] == 107);
    CU_ASSERT(kvc_head_view(vis, 1, 0).n == 2 && kvc_head_view(vis, 1, 0).pos[0] == 106);
    CU_ASSERT(kvc_reserve_heads(vis, 2, lay, hd, bad, err, sizeof err) != 0 && strstr(err, "-1 slots"));
    kvc_free(vis);
    /* an append to a host-tier layer is written in place by the backend's writer: one copy down for all the
     * layer's heads, counted as an offload write */
    float kr[H * D], vr[H * D];
    int32_t p1 = 108, r1 = 2;
    fill(kr, vr, 8, 1);
    t0 = be->traffic;
    int64_t down = m.moved_bytes[KVB_TIER_DEVICE][KVB_TIER_HOST];
    CU_ASSERT(kvc_append(kv, 1, 1, kr, vr, &p1, &r1, err, sizeof err) == 0);
    CU_ASSERT_EQUAL(m.moved_bytes[KVB_TIER_DEVICE][KVB_TIER_HOST] - down, H * slot);
    CU_ASSERT_EQUAL(be->traffic.bytes[KVB_COPY_D2H] - t0.bytes[KVB_COPY_D2H], H * slot);
    CU_ASSERT_EQUAL(be->traffic.n[KVB_COPY_D2H] - t0.n[KVB_COPY_D2H], 1);
    kvc_view hv = kvc_head_view(kv, 1, 1);
    CU_ASSERT(hv.tier == KVB_TIER_HOST && hv.n == 9 && hv.pos[8] == 108 && hv.round[8] == 2 &&
              fabsf(kvb_f16_to_f32(((const kvb_f16 *)hv.v)[8 * D + 3]) - vval(8, 1, 3)) < 1e-2f);
    kvc_store *copy = kvc_fork(kv, &m);
    CU_ASSERT_FATAL(copy != NULL);
    CU_ASSERT_EQUAL(kvc_used_bytes(copy, KVB_TIER_COUNT), kvc_used_bytes(kv, KVB_TIER_COUNT));
    CU_ASSERT(kvc_head_view(copy, 1, 0).tier == KVB_TIER_HOST);
    CU_ASSERT_EQUAL(kvc_full_bytes_for(kv, 100), 2LL * L * H * D * 2 * 100);
    kvc_free(copy);
    kvc_free(kv);
    CU_ASSERT_EQUAL(kvb_mem_current(&m, KVB_TIER_HOST, KVB_MEM_COUNT), 0);
    kvb_mem_destroy(&m);
}

/* Eviction on the backend: lowest score (ties to the lowest slot) among slots in the position window, or the
 * oldest position; the last slot moves into the victim's place, scores and spilled V rows follow. */
static void test_evict_swaps_the_last_slot_into_the_victim(void) {
    kvb_mem m;
    kvb_mem_init(&m);
    kvc_store *kv = make(&m, KVB_F32, 10); /* positions 100..109, rounds t/4 */
    float score[10] = {5, 1, 3, 1, 0, 9, 9, 9, 9, 0};
    /* candidates: positions [101, 107) = slots 1..6. First the 0 at slot 4 (slot 9's 0 is outside the window):
     * slot 4 <- slot 9 (pos 109, score 0, now outside too); then the tie of 1s at slots 1 and 3 goes to slot 1:
     * slot 1 <- slot 8 (pos 108, score 9) */
    CU_ASSERT(kvc_evict(kv, 0, 0, score, 101, 107, 2, NULL, err, sizeof err) == 0);
    kvc_view v = kvc_head_view(kv, 0, 0);
    CU_ASSERT_EQUAL(v.n, 8);
    CU_ASSERT(v.pos[4] == 109 && v.pos[1] == 108 && v.pos[3] == 103 && score[4] == 0 && score[1] == 9 && score[3] == 1);
    CU_ASSERT(((const float *)v.k)[4 * D] == kval(9, 0, 0) && v.round[4] == 2 && v.round[1] == 2);
    /* by position (StreamingLLM, PoD): the oldest non-sink tokens, their V rows spilled in order */
    float spill[2 * D];
    CU_ASSERT(kvc_evict(kv, 0, 1, NULL, 102, INT32_MAX, 2, spill, err, sizeof err) == 0);
    CU_ASSERT(spill[0] == vval(2, 1, 0) && spill[D + 5] == vval(3, 1, 5));
    v = kvc_head_view(kv, 0, 1);
    CU_ASSERT(v.n == 8 && v.pos[2] == 109 && v.pos[3] == 108);
    CU_ASSERT(kvc_evict(kv, 0, 2, NULL, 200, 300, 1, NULL, err, sizeof err) != 0); /* no candidate: an error */
    CU_ASSERT(kvc_evict(kv, 0, 2, NULL, 0, 1000, 11, NULL, err, sizeof err) != 0);
    kvc_free(kv);
    kvb_mem_destroy(&m);
}

static void test_mem_tracks_peaks_per_tier_and_category(void) {
    kvb_mem m;
    kvb_mem_init(&m);
    void *a = kvb_mem_alloc(&m, KVB_TIER_DEVICE, KVB_MEM_WORKSPACE, 1000);
    void *b = kvb_mem_alloc(&m, KVB_TIER_DEVICE, KVB_MEM_KV, 500);
    a = kvb_mem_realloc(&m, KVB_TIER_DEVICE, KVB_MEM_WORKSPACE, a, 1000, 3000);
    CU_ASSERT_EQUAL(kvb_mem_peak(&m, KVB_TIER_DEVICE, KVB_MEM_WORKSPACE), 4000); /* old + new during the copy */
    kvb_mem_free(&m, KVB_TIER_DEVICE, KVB_MEM_WORKSPACE, a, 3000);
    CU_ASSERT_EQUAL(kvb_mem_current(&m, KVB_TIER_DEVICE, KVB_MEM_COUNT), 500);
    CU_ASSERT_EQUAL(kvb_mem_peak(&m, KVB_TIER_DEVICE, KVB_MEM_COUNT), 4500);
    kvb_mem_reset_peaks(&m);
    CU_ASSERT_EQUAL(kvb_mem_peak(&m, KVB_TIER_DEVICE, KVB_MEM_COUNT), 500);
    kvb_mem_note(&m, KVB_TIER_DEVICE, KVB_MEM_WEIGHTS, 1 << 20);
    CU_ASSERT_EQUAL(kvb_mem_current(&m, KVB_TIER_DEVICE, KVB_MEM_WEIGHTS), 1 << 20);
    kvb_mem_free(&m, KVB_TIER_DEVICE, KVB_MEM_KV, b, 500);
    kvb_mem_destroy(&m);
}

static void sleep_ms(int ms) {
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

static void test_profiler_accounts_time_to_stage_phase_and_layer(void) {
    prof *p = prof_create(4, 1, 1);
    prof_set_stage(p, PROF_PREFILL);
    prof_begin(p, PROF_MLP, 2);
    sleep_ms(20);
    prof_end(p, PROF_MLP, 2, 16, 0);
    prof_set_stage(p, PROF_DECODE);
    for (int i = 0; i < 3; i++) {
        prof_begin(p, PROF_ATTN_FORWARD, 1);
        sleep_ms(5);
        prof_end(p, PROF_ATTN_FORWARD, 1, 1, 128);
    }
    CU_ASSERT(prof_total_ns(p, PROF_PREFILL, PROF_MLP) >= 20000000);
    CU_ASSERT(prof_total_ns(p, PROF_PREFILL, PROF_MLP) < 200000000);
    CU_ASSERT_EQUAL(prof_layer_ns(p, PROF_PREFILL, PROF_MLP, 2), prof_total_ns(p, PROF_PREFILL, PROF_MLP));
    CU_ASSERT_EQUAL(prof_calls(p, PROF_DECODE, PROF_ATTN_FORWARD), 3);
    CU_ASSERT(prof_total_ns(p, PROF_DECODE, PROF_ATTN_FORWARD) >= 15000000);
    CU_ASSERT_EQUAL(prof_total_ns(p, PROF_DECODE, PROF_MLP), 0);
    CU_ASSERT_STRING_EQUAL(prof_phase_name(PROF_CALC_QKV_AND_ROPE), "calc_qkv_and_rope");
    char dir[] = "/tmp/kvb_kvcache_trace_XXXXXX", path[64]; /* a folder of this run's own */
    CU_ASSERT_FATAL(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/trace.json", dir);
    CU_ASSERT(prof_write_trace(p, path, err, sizeof err) == 0);
    FILE *f = fopen(path, "r");
    CU_ASSERT_FATAL(f != NULL);
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    CU_ASSERT(strstr(buf, "\"traceEvents\"") && strstr(buf, "\"name\":\"attn_forward\",\"cat\":\"decode\""));
    CU_ASSERT(strstr(buf, "\"layer\":2,\"tokens\":16") != NULL);
    unlink(path);
    rmdir(dir);
    prof_free(p);
    prof_begin(NULL, PROF_MLP, 0); /* a NULL profiler is a no-op */
    prof_end(NULL, PROF_MLP, 0, 0, 0);
}

int main(void) {
    be = kvb_backend_cpu_create(1, err, sizeof err);
    if (!be || CU_initialize_registry() != CUE_SUCCESS) return 1;
    for (int lay = 0; lay < 2; lay++) {
        CU_pSuite s = CU_add_suite(lay ? "kvcache, slab layout" : "kvcache, per-head layout", lay ? suite_slab : suite_heads, NULL);
        CU_add_test(s, "append stores rows, positions and rounds", test_append_stores_rows_positions_and_rounds);
        CU_add_test(s, "retain keeps exactly the index set and frees bytes", test_retain_keeps_exactly_the_index_set_and_frees_bytes);
        CU_add_test(s, "drop front keeps the window in order and bounded", test_drop_front_keeps_the_window_in_order_and_bounded);
        CU_add_test(s, "tier moves and packed gathers are counted", test_tier_moves_and_packed_gathers_are_counted);
        CU_add_test(s, "compacted and moved heads append in place", test_compacted_and_moved_heads_append_in_place);
        CU_add_test(s, "evict swaps the last slot into the victim", test_evict_swaps_the_last_slot_into_the_victim);
    }
    CU_pSuite s = CU_add_suite("kvcache accounting and profiler", NULL, NULL);
    CU_add_test(s, "mem tracks peaks per tier and category", test_mem_tracks_peaks_per_tier_and_category);
    CU_add_test(s, "profiler accounts time to stage, phase and layer", test_profiler_accounts_time_to_stage_phase_and_layer);
    int rc = util_run_suites();
    kvb_backend_free(be);
    return rc;
}
