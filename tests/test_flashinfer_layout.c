/* test_flashinfer_layout.c — how attention kernel 5 hands kvbench's KV store to FlashInfer's paged decode
 * (kernels/cuda/flashinfer_layout.h), on the CPU: the page indices built from per-head K/V pointers and index lists
 * address exactly the rows kvbench's kernels read, for K and for V; the layouts FlashInfer cannot address (V at
 * another distance from K, rows off the row grid, pages or list entries past int32, an empty list) are refused with
 * a reason; FlashInfer's base-2 log-sum-exp converts to kvbench's natural one; and the instantiated shapes. The KV
 * store's slab layout (engine/kvcache.h) is planned from its own pointers: heads of different lengths, a dropped
 * front and index lists all page onto the rows kvc_gather reads, at head g's region g x cap rows in; a slab with a
 * head outside it (moved to the host tier) is refused as "not one slab". */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util_common.h"
#include "engine/kvcache.h"
#include "engine/mem.h"
#include "kernels/backend.h"
#include "kernels/cuda/flashinfer_layout.h"

enum { D = 64, ROW = D * 2 };

/* Heads laid out like kvbench's allocations in one host block: K of head g at row kr[g], V at row kr[g] + v_rows.
 * Every list entry's page, read through FlashInfer's base pointers, must be the row kvbench reads. */
static void check_pages_address_the_rows(int n_heads, const int64_t *kr, int64_t v_rows, const int64_t *n_kv,
                                         int32_t *const *idx, const int64_t *n_idx) {
    int64_t rows = 0;
    for (int g = 0; g < n_heads; g++)
        if (kr[g] + n_kv[g] + v_rows > rows) rows = kr[g] + n_kv[g] + v_rows;
    uint8_t *mem = calloc((size_t)rows, ROW);
    uintptr_t k[8], v[8];
    int64_t len[8];
    for (int g = 0; g < n_heads; g++) {
        k[g] = (uintptr_t)(mem + kr[g] * ROW);
        v[g] = (uintptr_t)(mem + (kr[g] + v_rows) * ROW);
        len[g] = idx && idx[g] ? n_idx[g] : n_kv[g];
    }
    kvb_fi_layout lay;
    int32_t head_row[8], indptr[9];
    char err[160] = "";
    CU_ASSERT_FATAL(kvb_fi_layout_plan(n_heads, k, v, n_kv, len, ROW, &lay, head_row, indptr, err, sizeof err) == 0);
    int64_t total = 0;
    for (int g = 0; g < n_heads; g++) {
        CU_ASSERT(indptr[g] == total);
        for (int64_t j = 0; j < len[g]; j++) {
            const int32_t slot = idx && idx[g] ? idx[g][j] : (int32_t)j;
            const int32_t page = kvb_fi_page(head_row[g], slot);
            CU_ASSERT(lay.k_base + (uintptr_t)page * ROW == k[g] + (uintptr_t)slot * ROW);
            CU_ASSERT(lay.v_base + (uintptr_t)page * ROW == v[g] + (uintptr_t)slot * ROW);
        }
        total += len[g];
    }
    CU_ASSERT(indptr[n_heads] == total && lay.total == total);
    free(mem);
}

static void test_pages_of_whole_heads_address_their_rows(void) {
    const int64_t kr[3] = {40, 0, 17}, n_kv[3] = {5, 9, 23}; /* heads in any order, the lowest at row 0 */
    check_pages_address_the_rows(3, kr, 100, n_kv, NULL, NULL);
}

static void test_pages_of_index_lists_address_their_rows(void) {
    const int64_t kr[4] = {300, 7, 120, 64}, n_kv[4] = {50, 50, 40, 30};
    int32_t l0[5] = {49, 0, 3, 3, 17}, l2[3] = {39, 1, 20};
    int32_t *idx[4] = {l0, NULL, l2, NULL}; /* unsorted lists, a repeat, and whole heads beside them */
    const int64_t n_idx[4] = {5, 0, 3, 0};
    check_pages_address_the_rows(4, kr, 1000, n_kv, idx, n_idx);
}

/* V below K (a negative distance) is as good as above it */
static void test_v_below_k_is_addressed(void) {
    uint8_t *mem = calloc(64, ROW);
    uintptr_t k[2] = {(uintptr_t)(mem + 40 * ROW), (uintptr_t)(mem + 50 * ROW)};
    uintptr_t v[2] = {(uintptr_t)(mem + 0 * ROW), (uintptr_t)(mem + 10 * ROW)};
    const int64_t n_kv[2] = {8, 8}, len[2] = {8, 8};
    kvb_fi_layout lay;
    int32_t head_row[2], indptr[3];
    char err[160];
    CU_ASSERT_FATAL(kvb_fi_layout_plan(2, k, v, n_kv, len, ROW, &lay, head_row, indptr, err, sizeof err) == 0);
    CU_ASSERT(lay.v_base + (uintptr_t)kvb_fi_page(head_row[1], 7) * ROW == v[1] + 7 * ROW);
    free(mem);
}

static int plan(int n, const uintptr_t *k, const uintptr_t *v, const int64_t *n_kv, const int64_t *len, char *err);

/* A real slab (the KV store on the CPU backend, whose device tier is host memory the test may read): heads of a
 * layer retained to different lengths, one with a dropped front, whole and through index lists. Every page, read
 * through FlashInfer's K and V bases, holds the row kvc_gather returns for that slot; head g's pages start in its
 * region, g x cap rows from the slab's base. */
static void test_pages_of_a_slab_with_heads_of_different_lengths(void) {
    enum { LS = 2, HS = 4, T = 40 };
    char err[256];
    kvb_backend *be = kvb_backend_cpu_create(1, err, sizeof err);
    CU_ASSERT_FATAL(be != NULL);
    kvb_mem m;
    kvb_mem_init(&m);
    kvc_store *kv = kvc_create(LS, HS, D, KVB_F16, 8, be, &m, err, sizeof err);
    CU_ASSERT_FATAL(kv && kvc_set_layout(kv, KVC_LAYOUT_SLAB, err, sizeof err) == 0);
    float *k = malloc(sizeof(float) * T * HS * D), *v = malloc(sizeof(float) * T * HS * D);
    int32_t pos[T];
    for (int i = 0; i < T * HS * D; i++) k[i] = (float)(i % 1999) / 128.f, v[i] = -(float)(i % 1013) / 64.f;
    for (int t = 0; t < T; t++) pos[t] = t;
    for (int l = 0; l < LS; l++) CU_ASSERT_FATAL(kvc_append(kv, l, T, k, v, pos, NULL, err, sizeof err) == 0);
    int32_t keep[T];
    const int64_t lens[HS] = {5, T, 17, 1}; /* AdaKV-style: every head its own count */
    for (int h = 0; h < HS; h++) {
        if (lens[h] == T) continue;
        for (int64_t j = 0; j < lens[h]; j++) keep[j] = (int32_t)(j * T / lens[h]);
        CU_ASSERT_FATAL(kvc_retain(kv, 1, h, keep, lens[h], err, sizeof err) == 0);
    }
    CU_ASSERT_FATAL(kvc_drop_front(kv, 1, 1, 6, err, sizeof err) == 0); /* head 1: 34 slots, 6 rows into its region */
    kvc_slab s;
    CU_ASSERT_FATAL(kvc_layer_slab(kv, 1, &s) == 1 && s.heads == HS);
    uintptr_t kp[HS], vp[HS];
    int64_t n_kv[HS], len[HS];
    for (int h = 0; h < HS; h++) {
        kvc_view hv = kvc_head_view(kv, 1, h);
        kp[h] = (uintptr_t)hv.k, vp[h] = (uintptr_t)hv.v, n_kv[h] = len[h] = hv.n;
    }
    CU_ASSERT(n_kv[0] == 5 && n_kv[1] == T - 6 && n_kv[2] == 17 && n_kv[3] == 1);
    kvb_fi_layout lay;
    int32_t head_row[HS], indptr[HS + 1];
    CU_ASSERT_FATAL(kvb_fi_layout_plan(HS, kp, vp, n_kv, len, ROW, &lay, head_row, indptr, err, sizeof err) == 0);
    CU_ASSERT(lay.k_base >= (uintptr_t)s.k && lay.v_base - lay.k_base == (uintptr_t)s.v - (uintptr_t)s.k);
    const int64_t base_row = (int64_t)((lay.k_base - (uintptr_t)s.k) / ROW);
    for (int h = 0; h < HS; h++) { /* its region: g x cap rows in, its dropped front after that */
        const int64_t row = base_row + head_row[h];
        CU_ASSERT(row >= h * s.cap && row + n_kv[h] <= (h + 1) * s.cap);
        CU_ASSERT(row == h * s.cap + (h == 1 ? 6 : 0));
    }
    CU_ASSERT(indptr[HS] == 5 + T - 6 + 17 + 1);
    /* every page against kvc_gather, whole heads and lists (unsorted, repeated) */
    int32_t list[4][6] = {{4, 0, 2, 2, 1, 3}, {33, 0, 7, 19, 5, 6}, {16, 0, 8, 1, 9, 15}, {0, 0, 0, 0, 0, 0}};
    for (int use_list = 0; use_list < 2; use_list++)
        for (int h = 0; h < HS; h++) {
            const int64_t n = use_list ? 6 : n_kv[h];
            for (int64_t j = 0; j < n; j++) {
                const int32_t slot = use_list ? list[h][j] : (int32_t)j;
                kvb_f16 kr[D], vr[D];
                CU_ASSERT_FATAL(kvc_gather(kv, 1, h, &slot, 1, kr, vr, NULL, err, sizeof err) == 0);
                const int32_t page = kvb_fi_page(head_row[h], slot);
                CU_ASSERT(!memcmp((const void *)(lay.k_base + (uintptr_t)page * ROW), kr, ROW));
                CU_ASSERT(!memcmp((const void *)(lay.v_base + (uintptr_t)page * ROW), vr, ROW));
            }
        }
    /* a head of the layer moved to the host tier leaves the slab: the layer is refused until it comes back */
    const uintptr_t base = (uintptr_t)1 << 40, cap = 64, vdist = 4 * cap * ROW;
    uintptr_t k5[4] = {base, base + cap * ROW, base + 2 * cap * ROW, (uintptr_t)1 << 44};
    uintptr_t v5[4] = {k5[0] + vdist, k5[1] + vdist, k5[2] + vdist, k5[3] + 80 * ROW};
    const int64_t n5[4] = {10, 10, 10, 10};
    CU_ASSERT(plan(4, k5, v5, n5, n5, err) == -1 && strstr(err, "not one slab"));
    k5[3] = base + 3 * cap * ROW, v5[3] = k5[3] + vdist; /* back in its region */
    CU_ASSERT(plan(4, k5, v5, n5, n5, err) == 0);
    kvc_free(kv);
    kvb_mem_destroy(&m);
    kvb_backend_free(be);
    free(k), free(v);
}

static int plan(int n, const uintptr_t *k, const uintptr_t *v, const int64_t *n_kv, const int64_t *len, char *err) {
    kvb_fi_layout lay;
    int32_t head_row[4], indptr[5];
    err[0] = 0;
    const int rc = kvb_fi_layout_plan(n, k, v, n_kv, len, ROW, &lay, head_row, indptr, err, 160);
    if (rc) printf("\n    refused: %s", err);
    return rc;
}

static void test_layouts_it_cannot_address_are_refused(void) {
    const uintptr_t base = (uintptr_t)1 << 40; /* addresses only: the plan never touches memory */
    const int64_t n_kv[2] = {100, 100}, len[2] = {100, 100};
    char err[160];
    /* V of head 1 at another distance from its K than head 0's */
    uintptr_t k[2] = {base, base + 1000 * ROW}, v[2] = {base + 5000 * ROW, base + 7000 * ROW};
    CU_ASSERT(plan(2, k, v, n_kv, len, err) == -1 && strstr(err, "distance"));
    /* head 1 off the row grid */
    uintptr_t k2[2] = {base, base + 1000 * ROW + 64}, v2[2] = {base + 5000 * ROW, base + 6000 * ROW + 64};
    CU_ASSERT(plan(2, k2, v2, n_kv, len, err) == -1 && strstr(err, "aligned"));
    /* an empty list */
    const int64_t len0[2] = {100, 0};
    uintptr_t k3[2] = {base, base + 1000 * ROW}, v3[2] = {base + 5000 * ROW, base + 6000 * ROW};
    CU_ASSERT(plan(2, k3, v3, n_kv, len0, err) == -1 && strstr(err, "empty"));
    /* a head or an argument that is no layout at all */
    CU_ASSERT(plan(0, k3, v3, n_kv, len, err) == -1);
}

/* int32 page indices: a head whose last page is INT32_MAX is taken, one row further is refused; so are lists whose
 * entries together pass INT32_MAX */
static void test_int32_span_is_checked(void) {
    const uintptr_t base = (uintptr_t)1 << 44;
    char err[160];
    const int64_t n_kv[2] = {100, 100}, len[2] = {100, 100};
    const uintptr_t last_ok = (uintptr_t)INT32_MAX - 99; /* head 1's slots 0..99 end at page INT32_MAX */
    uintptr_t k[2] = {base, base + last_ok * ROW}, v[2] = {base + 8, base + last_ok * ROW + 8};
    CU_ASSERT(plan(2, k, v, n_kv, len, err) == 0);
    k[1] += ROW, v[1] += ROW;
    CU_ASSERT(plan(2, k, v, n_kv, len, err) == -1 && strstr(err, "int32"));
    const int64_t big[2] = {(int64_t)1 << 30, (int64_t)1 << 30}; /* 2^31 entries together */
    uintptr_t k4[2] = {base, base + ((uintptr_t)1 << 30) * ROW}, v4[2] = {base + 8, base + ((uintptr_t)1 << 30) * ROW + 8};
    const int64_t nk4[2] = {(int64_t)1 << 30, (int64_t)1 << 30};
    CU_ASSERT(plan(2, k4, v4, nk4, big, err) == -1 && strstr(err, "int32"));
    const int64_t fits[2] = {((int64_t)1 << 30) - 1, (int64_t)1 << 30}; /* INT32_MAX entries: taken */
    CU_ASSERT(plan(2, k4, v4, nk4, fits, err) == 0);
}

/* FlashInfer's state keeps m and d of 2^(s log2 e): lse2 = m + log2 d. Converted, it is log sum e^s. */
static void test_lse_converts_from_base_2(void) {
    const double s[5] = {3.25, -1.5, 0.0, 7.75, 7.5};
    double m2 = -INFINITY;
    for (int i = 0; i < 5; i++)
        if (s[i] * M_LOG2E > m2) m2 = s[i] * M_LOG2E;
    double d = 0, l = 0;
    for (int i = 0; i < 5; i++) d += exp2(s[i] * M_LOG2E - m2), l += exp(s[i]);
    const float lse2 = (float)(m2 + log2(d));
    CU_ASSERT(fabs(kvb_fi_lse_natural(lse2) - log(l)) < 1e-6 * fabs(log(l)));
    CU_ASSERT(isinf(kvb_fi_lse_natural(-INFINITY)) && kvb_fi_lse_natural(-INFINITY) < 0);
    CU_ASSERT(kvb_fi_lse_natural(0.f) == 0.f);
}

static void test_instantiated_shapes(void) {
    const int groups_ok[7] = {1, 2, 3, 4, 6, 8, 16};
    for (int i = 0; i < 7; i++)
        for (int d = 64; d <= 256; d *= 2) CU_ASSERT(kvb_fi_decode_shape_ok(groups_ok[i], d, 1));
    CU_ASSERT(!kvb_fi_decode_shape_ok(5, 128, 1) && !kvb_fi_decode_shape_ok(7, 128, 1) && !kvb_fi_decode_shape_ok(32, 128, 1));
    CU_ASSERT(!kvb_fi_decode_shape_ok(4, 80, 1) && !kvb_fi_decode_shape_ok(4, 96, 1) && !kvb_fi_decode_shape_ok(4, 512, 1));
    CU_ASSERT(!kvb_fi_decode_shape_ok(4, 128, 0)); /* f32 K/V */
}

int main(void) {
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("flashinfer layout", NULL, NULL);
    CU_add_test(s, "pages of whole heads address their K and V rows", test_pages_of_whole_heads_address_their_rows);
    CU_add_test(s, "pages of index lists address their K and V rows", test_pages_of_index_lists_address_their_rows);
    CU_add_test(s, "V below K is addressed", test_v_below_k_is_addressed);
    CU_add_test(s, "pages of a KV store slab with heads of different lengths address its rows",
                test_pages_of_a_slab_with_heads_of_different_lengths);
    CU_add_test(s, "layouts FlashInfer cannot address are refused with a reason", test_layouts_it_cannot_address_are_refused);
    CU_add_test(s, "int32 page span and list total are checked at the boundary", test_int32_span_is_checked);
    CU_add_test(s, "base-2 lse converts to the natural lse", test_lse_converts_from_base_2);
    CU_add_test(s, "the instantiated shapes", test_instantiated_shapes);
    return util_run_suites();
}
