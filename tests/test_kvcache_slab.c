/* test_kvcache_slab.c — the KV store's per-layer slab (engine/kvcache.h) against its per-head layout, call by call
 * on the CPU backend: two stores fed the same appends, retains of different lengths per head (as AdaKV-style
 * methods leave them), evictions, dropped fronts, truncations, tier moves there and back, packed loads,
 * append_from and forks must hold the same rows, positions, rounds, tiers and occupied bytes after every call;
 * each store's allocated bytes are what its tracker allocated, the slab's are its heads x its capacity, and equal
 * to the per-head store's while every head holds the same count; every slab head's K, V, position and round sit
 * at one uniform stride (head h's region at h x cap slots). */
#include <CUnit/Basic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util_common.h"
#include "engine/kvcache.h"
#include "engine/mem.h"
#include "kernels/backend.h"

enum { L = 3, H = 4, D = 16 };
static char err[256];
static kvb_backend *be;
static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t next(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* the two stores and their trackers */
typedef struct {
    kvb_mem m[2];
    kvc_store *kv[2]; /* [0] one allocation per head, [1] the slab */
    int32_t next_pos;
} pair;

static void pair_open(pair *p, kvb_dtype dt, int64_t cap0) {
    for (int i = 0; i < 2; i++) {
        kvb_mem_init(&p->m[i]);
        p->kv[i] = kvc_create(L, H, D, dt, cap0, be, &p->m[i], err, sizeof err);
        CU_ASSERT_FATAL(p->kv[i] != NULL);
        CU_ASSERT_FATAL(kvc_set_layout(p->kv[i], i ? KVC_LAYOUT_SLAB : KVC_LAYOUT_HEADS, err, sizeof err) == 0);
    }
    p->next_pos = 0;
}

static void pair_close(pair *p) {
    for (int i = 0; i < 2; i++) {
        kvc_free(p->kv[i]);
        CU_ASSERT_EQUAL(kvb_mem_current(&p->m[i], KVB_TIER_DEVICE, KVB_MEM_COUNT), 0);
        CU_ASSERT_EQUAL(kvb_mem_current(&p->m[i], KVB_TIER_HOST, KVB_MEM_COUNT), 0);
        kvb_mem_destroy(&p->m[i]);
    }
}

/* The slab store's layout: each slab head's rows inside its region (h x cap .. (h+1) x cap slots) at the same
 * offset in K, V, positions and rounds; a host-tier head outside it. */
static void check_slab(const kvc_store *kv) {
    const size_t rb = (size_t)D * (kvc_slot_bytes(kv) - 8) / (2 * D);
    for (int l = 0; l < L; l++) {
        kvc_slab s;
        const int has = kvc_layer_slab(kv, l, &s);
        int in = 0;
        for (int h = 0; h < H; h++) {
            kvc_view v = kvc_head_view(kv, l, h);
            if (v.tier != KVB_TIER_DEVICE) continue;
            in++;
            if (!has) { /* no slab: a device head holds nothing */
                CU_ASSERT(v.n == 0);
                continue;
            }
            CU_ASSERT_EQUAL(s.head_stride, (size_t)s.cap * rb);
            const ptrdiff_t at = (const uint8_t *)v.k - (const uint8_t *)s.k;
            CU_ASSERT(at % (ptrdiff_t)rb == 0);
            const ptrdiff_t slot = at / (ptrdiff_t)rb, first = (ptrdiff_t)h * s.cap;
            CU_ASSERT(slot >= first && slot + v.n <= first + s.cap);
            CU_ASSERT((const uint8_t *)v.v - (const uint8_t *)s.v == at);
            CU_ASSERT(v.pos - s.pos == slot && v.round - s.round == slot);
        }
        if (has) CU_ASSERT_EQUAL(s.heads, in);
    }
}

/* Same rows (byte for byte), positions, rounds, tiers and occupied bytes; honest allocated bytes. */
static void check_same(pair *p, const char *after) {
    const kvc_store *a = p->kv[0], *b = p->kv[1];
    int bad = 0;
    const size_t rb = (size_t)(kvc_slot_bytes(a) - 8) / 2;
    for (int l = 0; l < L; l++)
        for (int h = 0; h < H; h++) {
            kvc_view x = kvc_head_view(a, l, h), y = kvc_head_view(b, l, h);
            if (x.n != y.n || x.tier != y.tier) { bad = 1; continue; }
            if (!x.n) continue;
            bad |= memcmp(x.k, y.k, (size_t)x.n * rb) || memcmp(x.v, y.v, (size_t)x.n * rb);
            bad |= memcmp(x.pos, y.pos, (size_t)x.n * 4) || memcmp(x.round, y.round, (size_t)x.n * 4);
        }
    if (bad) printf("\n    the layouts differ after %s", after);
    CU_ASSERT(!bad);
    for (int t = 0; t <= KVB_TIER_COUNT; t++) {
        CU_ASSERT_EQUAL(kvc_used_bytes(a, (kvb_tier)t), kvc_used_bytes(b, (kvb_tier)t));
        for (int l = 0; l < L; l++)
            CU_ASSERT_EQUAL(kvc_layer_used_bytes(a, l, (kvb_tier)t), kvc_layer_used_bytes(b, l, (kvb_tier)t));
    }
    for (int i = 0; i < 2; i++)
        for (int t = 0; t < KVB_TIER_COUNT; t++)
            CU_ASSERT_EQUAL(kvb_mem_current(&p->m[i], (kvb_tier)t, KVB_MEM_KV), kvc_bytes(p->kv[i], (kvb_tier)t));
    int64_t slab_bytes = 0;
    for (int l = 0; l < L; l++) {
        kvc_slab s;
        if (kvc_layer_slab(b, l, &s)) slab_bytes += (int64_t)H * s.cap * kvc_slot_bytes(b);
    }
    CU_ASSERT_EQUAL(kvc_bytes(b, KVB_TIER_DEVICE), slab_bytes); /* all the slab store's device bytes are slabs */
    check_slab(b);
}

static void append(pair *p, int layer, int n_tok) {
    float *k = malloc(sizeof(float) * n_tok * H * D), *v = malloc(sizeof(float) * n_tok * H * D);
    int32_t *pos = malloc(sizeof(int32_t) * n_tok), *round = malloc(sizeof(int32_t) * n_tok);
    for (int i = 0; i < n_tok * H * D; i++) k[i] = (float)(next() % 2048) / 64.f - 16.f, v[i] = (float)(next() % 977) / 32.f;
    for (int t = 0; t < n_tok; t++) pos[t] = p->next_pos + t, round[t] = (p->next_pos + t) / 7;
    for (int i = 0; i < 2; i++) CU_ASSERT_FATAL(kvc_append(p->kv[i], layer, n_tok, k, v, pos, round, err, sizeof err) == 0);
    free(k), free(v), free(pos), free(round);
}

static void append_all(pair *p, int n_tok) {
    for (int l = 0; l < L; l++) append(p, l, n_tok);
    p->next_pos += n_tok;
}

/* keep `keep` of the head's slots, a random ascending set */
static void retain(pair *p, int l, int h, int64_t keep) {
    const int64_t n = kvc_n(p->kv[0], l, h);
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
    int64_t m = 0;
    for (int64_t j = 0; j < n; j++) /* selection sampling: exactly `keep`, ascending */
        if ((int64_t)(next() % (uint32_t)(n - j)) < keep - m) idx[m++] = (int32_t)j;
    CU_ASSERT_FATAL(m == keep);
    for (int i = 0; i < 2; i++) CU_ASSERT_FATAL(kvc_retain(p->kv[i], l, h, idx, keep, err, sizeof err) == 0);
    free(idx);
}

/* Heads of one count give the slab the per-head store's bytes; heads of different counts cost the slab its longest
 * head's capacity on every head. */
static void test_uniform_heads_cost_the_same_and_uneven_heads_cost_the_longest(void) {
    pair p;
    pair_open(&p, KVB_F16, 8);
    append_all(&p, 5); /* under the initial capacity */
    check_same(&p, "the first append");
    append_all(&p, 40); /* growth past it, by the rule */
    append_all(&p, 1);
    check_same(&p, "growth");
    CU_ASSERT_EQUAL(kvc_bytes(p.kv[1], KVB_TIER_DEVICE), kvc_bytes(p.kv[0], KVB_TIER_DEVICE));
    for (int l = 0; l < L; l++) /* every head compressed to one budget: the same bytes again */
        for (int h = 0; h < H; h++) retain(&p, l, h, 12);
    check_same(&p, "a uniform retain");
    CU_ASSERT_EQUAL(kvc_bytes(p.kv[1], KVB_TIER_DEVICE), kvc_bytes(p.kv[0], KVB_TIER_DEVICE));
    for (int t = 0; t < 20; t++) append_all(&p, 1);
    check_same(&p, "decode after the retain");
    CU_ASSERT_EQUAL(kvc_bytes(p.kv[1], KVB_TIER_DEVICE), kvc_bytes(p.kv[0], KVB_TIER_DEVICE));
    /* AdaKV-style: head h of layer 1 keeps 4 + 8h slots; the slab holds the longest head's capacity for each */
    for (int h = 0; h < H; h++) retain(&p, 1, h, 4 + 8 * h);
    check_same(&p, "uneven retains");
    kvc_slab s;
    CU_ASSERT_FATAL(kvc_layer_slab(p.kv[1], 1, &s) == 1);
    const int64_t longest = 4 + 8 * (H - 1), slot = kvc_slot_bytes(p.kv[1]);
    /* the growth spare n + n/4 + 16 (kvcache.c's rule): per head for one store, the longest head's for the slab */
    int64_t heads_slots = 0;
    for (int h = 0; h < H; h++) heads_slots += (4 + 8 * h) + (4 + 8 * h) / 4 + 16;
    CU_ASSERT_EQUAL(s.cap, longest + longest / 4 + 16);
    CU_ASSERT_EQUAL(kvc_bytes(p.kv[1], KVB_TIER_DEVICE) - kvc_bytes(p.kv[0], KVB_TIER_DEVICE),
                    ((int64_t)H * s.cap - heads_slots) * slot); /* layers 0 and 2 cost the same in both */
    CU_ASSERT_EQUAL(kvc_layer_used_bytes(p.kv[1], 1, KVB_TIER_DEVICE), (int64_t)(4 * H + 8 * H * (H - 1) / 2 + 0) * slot);
    pair_close(&p);
}

/* A random sequence of every call that changes a head, checked after each. */
static void test_every_call_gives_the_same_heads_in_both_layouts(void) {
    for (int dt = 0; dt < 2; dt++) {
        pair p;
        pair_open(&p, (kvb_dtype)dt, dt ? 0 : 32);
        append_all(&p, 37);
        check_same(&p, "the prompt");
        char what[64];
        for (int step = 0; step < 160; step++) {
            const int l = (int)(next() % L), h = (int)(next() % H), op = (int)(next() % 9);
            const int64_t n = kvc_n(p.kv[0], l, h);
            const kvb_tier tier = kvc_head_view(p.kv[0], l, h).tier;
            snprintf(what, sizeof what, "step %d (op %d, layer %d head %d)", step, op, l, h);
            if (op == 0) {
                append_all(&p, 1 + (int)(next() % 5));
            } else if (op == 1 && n > 0) {
                retain(&p, l, h, (int64_t)(next() % (uint32_t)(n + 1)));
            } else if (op == 2 && n > 2 && tier == KVB_TIER_DEVICE) { /* evict by score, scores moved with the slots */
                float *sc[2];
                for (int i = 0; i < 2; i++) sc[i] = malloc(sizeof(float) * (size_t)n);
                for (int64_t j = 0; j < n; j++) sc[0][j] = sc[1][j] = (float)(next() % 100);
                const int64_t c = 1 + (int64_t)(next() % 2);
                for (int i = 0; i < 2; i++)
                    CU_ASSERT(kvc_evict(p.kv[i], l, h, sc[i], INT32_MIN, INT32_MAX, c, NULL, err, sizeof err) == 0);
                CU_ASSERT(memcmp(sc[0], sc[1], sizeof(float) * (size_t)(n - c)) == 0);
                free(sc[0]), free(sc[1]);
            } else if (op == 3 && n > 0) {
                const int64_t c = (int64_t)(next() % (uint32_t)(n + 1));
                for (int i = 0; i < 2; i++) CU_ASSERT(kvc_drop_front(p.kv[i], l, h, c, err, sizeof err) == 0);
            } else if (op == 4 && n > 0) {
                const int64_t keep = (int64_t)(next() % (uint32_t)(n + 1));
                for (int i = 0; i < 2; i++) CU_ASSERT(kvc_truncate(p.kv[i], l, h, keep, err, sizeof err) == 0);
            } else if (op == 5) { /* a tier move, there or back */
                const kvb_tier to = tier == KVB_TIER_DEVICE ? KVB_TIER_HOST : KVB_TIER_DEVICE;
                for (int i = 0; i < 2; i++) CU_ASSERT(kvc_set_tier(p.kv[i], l, h, to, err, sizeof err) == 0);
            } else if (op == 6) {
                const kvb_tier to = next() % 2 ? KVB_TIER_HOST : KVB_TIER_DEVICE;
                for (int i = 0; i < 2; i++) CU_ASSERT(kvc_set_layer_tier(p.kv[i], l, to, err, sizeof err) == 0);
            } else if (op == 7) { /* a fork replaces each store: same layout, same heads */
                for (int i = 0; i < 2; i++) {
                    kvc_store *f = kvc_fork(p.kv[i], NULL);
                    CU_ASSERT_FATAL(f != NULL);
                    CU_ASSERT(kvc_get_layout(f) == kvc_get_layout(p.kv[i]));
                    kvc_free(p.kv[i]);
                    p.kv[i] = f;
                }
            } else if (op == 8 && n > 0) { /* drop a whole head: kept slots moved out and back in */
                for (int i = 0; i < 2; i++) CU_ASSERT(kvc_drop_front(p.kv[i], l, h, n, err, sizeof err) == 0);
            }
            check_same(&p, what);
        }
        /* every head back on the device: each is in its layer's slab again */
        for (int l = 0; l < L; l++)
            for (int i = 0; i < 2; i++) CU_ASSERT(kvc_set_layer_tier(p.kv[i], l, KVB_TIER_DEVICE, err, sizeof err) == 0);
        check_same(&p, "all back on the device");
        for (int l = 0; l < L; l++) {
            kvc_slab s;
            if (kvc_layer_slab(p.kv[1], l, &s)) CU_ASSERT_EQUAL(s.heads, H);
        }
        pair_close(&p);
    }
}

/* Packed loads and append_from between a host-tier source and device-tier destinations of each layout: several
 * heads of one layer in one load grow its slab once for all of them. */
static void test_loads_into_a_slab_give_the_per_head_rows(void) {
    pair p;
    pair_open(&p, KVB_F16, 16);
    append_all(&p, 30);
    for (int l = 0; l < L; l++)
        for (int i = 0; i < 2; i++) CU_ASSERT_FATAL(kvc_set_layer_tier(p.kv[i], l, KVB_TIER_HOST, err, sizeof err) == 0);
    kvb_mem vm[2];
    kvc_store *vis[2];
    for (int i = 0; i < 2; i++) {
        kvb_mem_init(&vm[i]);
        vis[i] = kvc_create(L, H, D, KVB_F16, 4, be, &vm[i], err, sizeof err);
        CU_ASSERT_FATAL(vis[i] != NULL && kvc_set_layout(vis[i], i ? KVC_LAYOUT_SLAB : KVC_LAYOUT_HEADS, err, sizeof err) == 0);
    }
    int32_t l0[5] = {0, 4, 9, 20, 29}, l1[2] = {3, 7};
    const int layer[4] = {1, 1, 1, 2}, head[4] = {0, 2, 3, 1};
    const int32_t *idx[4] = {l0, NULL, l1, l0};
    const int64_t n[4] = {5, 30, 2, 5};
    for (int round = 0; round < 3; round++) { /* loads on top of loads: the slab grows past its capacity */
        for (int i = 0; i < 2; i++) CU_ASSERT(kvc_load(vis[i], p.kv[i], 4, layer, head, idx, n, err, sizeof err) == 0);
        for (int i = 0; i < 2; i++) CU_ASSERT(kvc_append_from(vis[i], 0, 3, p.kv[i], 0, 3, l1, 2, 1, err, sizeof err) == 0);
    }
    const size_t rb = D * 2;
    for (int l = 0; l < L; l++)
        for (int h = 0; h < H; h++) {
            kvc_view x = kvc_head_view(vis[0], l, h), y = kvc_head_view(vis[1], l, h);
            CU_ASSERT_FATAL(x.n == y.n);
            if (x.n)
                CU_ASSERT(!memcmp(x.k, y.k, (size_t)x.n * rb) && !memcmp(x.v, y.v, (size_t)x.n * rb) &&
                          !memcmp(x.pos, y.pos, (size_t)x.n * 4) && !memcmp(x.round, y.round, (size_t)x.n * 4));
        }
    CU_ASSERT_EQUAL(kvc_n(vis[1], 1, 2), 90);
    CU_ASSERT_EQUAL(vm[0].moved_bytes[KVB_TIER_HOST][KVB_TIER_DEVICE], vm[1].moved_bytes[KVB_TIER_HOST][KVB_TIER_DEVICE]);
    check_slab(vis[1]);
    for (int i = 0; i < 2; i++) {
        CU_ASSERT_EQUAL(kvb_mem_current(&vm[i], KVB_TIER_DEVICE, KVB_MEM_KV), kvc_bytes(vis[i], KVB_TIER_DEVICE));
        kvc_free(vis[i]);
        kvb_mem_destroy(&vm[i]);
    }
    pair_close(&p);
}

static void test_the_layout_changes_only_while_empty(void) {
    kvb_mem m;
    kvb_mem_init(&m);
    kvc_store *kv = kvc_create(L, H, D, KVB_F32, 4, be, &m, err, sizeof err);
    CU_ASSERT_FATAL(kv != NULL);
    CU_ASSERT(kvc_get_layout(kv) == KVC_LAYOUT_HEADS); /* the CPU backend's default */
    CU_ASSERT(kvc_set_layout(kv, (kvc_layout)7, err, sizeof err) != 0 && strstr(err, "layout"));
    CU_ASSERT(kvc_set_layout(kv, KVC_LAYOUT_SLAB, err, sizeof err) == 0);
    float k[H * D] = {0}, v[H * D] = {0};
    int32_t pos = 0;
    CU_ASSERT(kvc_append(kv, 0, 1, k, v, &pos, NULL, err, sizeof err) == 0);
    CU_ASSERT(kvc_set_layout(kv, KVC_LAYOUT_HEADS, err, sizeof err) != 0 && strstr(err, "no storage"));
    kvc_slab s;
    CU_ASSERT(kvc_layer_slab(kv, 0, &s) == 1 && s.heads == H && s.cap == 4);
    CU_ASSERT(kvc_layer_slab(kv, 1, &s) == 0 && s.cap == 0);
    CU_ASSERT(kvc_layer_slab(kv, L, &s) == 0);
    CU_ASSERT_STRING_EQUAL(kvc_layout_name(KVC_LAYOUT_SLAB), "slab");
    kvc_clear(kv); /* storage released: the layout may change again */
    CU_ASSERT(kvc_set_layout(kv, KVC_LAYOUT_HEADS, err, sizeof err) == 0);
    CU_ASSERT_EQUAL(kvb_mem_current(&m, KVB_TIER_DEVICE, KVB_MEM_COUNT), 0);
    kvc_free(kv);
    kvb_mem_destroy(&m);
}

int main(void) {
    be = kvb_backend_cpu_create(1, err, sizeof err);
    if (!be || CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("kvcache slab", NULL, NULL);
    CU_add_test(s, "uniform heads cost the same, uneven heads the longest", test_uniform_heads_cost_the_same_and_uneven_heads_cost_the_longest);
    CU_add_test(s, "every call gives the same heads in both layouts", test_every_call_gives_the_same_heads_in_both_layouts);
    CU_add_test(s, "loads into a slab give the per-head rows", test_loads_into_a_slab_give_the_per_head_rows);
    CU_add_test(s, "the layout changes only while empty", test_the_layout_changes_only_while_empty);
    const int rc = util_run_suites();
    kvb_backend_free(be);
    return rc;
}
