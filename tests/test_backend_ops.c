/* test_backend_ops.c — the data ops of every backend present (kernels/backend.h) against references written
 * here. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "util_common.h"

static kvb_backend *cpu;

static int open_cpu(void) {
    char err[256];
    cpu = kvb_backend_cpu_create(1, err, sizeof err);
    return cpu ? 0 : 1;
}

static int close_cpu(void) {
    kvb_backend_free(cpu);
    return 0;
}

static void test_cpu_backend_installs_every_data_op(void) {
    CU_ASSERT_FATAL(cpu != NULL);
    CU_ASSERT(cpu->copy && cpu->zero && cpu->kv_gather && cpu->kv_evict && cpu->probs_reduce && cpu->pool1d &&
              cpu->topk_idx && cpu->iota && cpu->gather_f32 && cpu->round_scores && cpu->pod_share && cpu->pod_merge);
}

static void test_cpu_ops_run_on_a_small_head(void) {
    char err[256] = "";
    float score[6] = {0.5f, 0.25f, 0.5f, 0.75f, 0.0f, 0.25f};
    int32_t idx[6];
    CU_ASSERT(cpu->topk_idx(cpu, idx, score, 6, 3, err, sizeof err) == 0);
    CU_ASSERT(idx[0] == 0 && idx[1] == 2 && idx[2] == 3);
    CU_ASSERT(cpu->iota(cpu, idx, 10, 6, err, sizeof err) == 0 && idx[5] == 15);
    float k[6], v[6], spill[2];
    int32_t pos[6] = {0, 1, 2, 3, 4, 5}, round[6] = {0};
    for (int i = 0; i < 6; i++) k[i] = v[i] = (float)i;
    kvb_kv_head h = {k, v, pos, round};
    CU_ASSERT(cpu->kv_evict(cpu, &h, 6, sizeof(float), score, 1, 6, 2, spill, err, sizeof err) == 0);
    CU_ASSERT(spill[0] == 4.0f && spill[1] == 1.0f); /* lowest 0.0 at slot 4, then 0.25 at slot 1 (before 5) */
    CU_ASSERT(cpu->kv_evict(cpu, &h, 4, sizeof(float), NULL, 7, 9, 1, NULL, err, sizeof err) == -1 && err[0]);
    kvb_traffic before = cpu->traffic;
    CU_ASSERT(cpu->copy(cpu, k, v, sizeof k, KVB_COPY_H2D, err, sizeof err) == 0);
    CU_ASSERT(cpu->traffic.n[KVB_COPY_H2D] == before.n[KVB_COPY_H2D] + 1);
}

#define ADD(fn) CU_add_test(s, #fn + 5, fn)

int main(void) {
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("backend_ops", open_cpu, close_cpu);
    ADD(test_cpu_backend_installs_every_data_op);
    ADD(test_cpu_ops_run_on_a_small_head);
    return util_run_suites();
}
