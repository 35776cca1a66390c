/* test_fidelity_hybrid.c — `kvbench fidelity`'s per-layer recall on a hybrid model (methods/fidelity.c), on the seeded
 * gemma3-deep (tests/util_arch_model.h: 18 layers, 5, 11 and 17 global, window 24), written here from its seed. A
 * local layer attends the model's window in both contexts (no method hook runs there), so its recall is 1 for every
 * method; it used to be read from full attention's probability mass of that layer, which no observer filled (the
 * local layers run no hooks), and came out as whatever the buffer held (-0.86 to 192 on Gemma-3-270M). A global
 * layer's recall is a share of probability mass: 1 for full attention, in (0, 1] for SnapKV, and below 1 on at
 * least one global layer when SnapKV keeps a fraction of the prompt there. */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>

#include "util_arch_model.h"
#include "methods/fidelity.h"
#include "methods/method.h"

enum { N = 200 };

static kvb_model *model;

static void test_local_layers_recall_one_global_layers_a_share(void) {
    char err[512];
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = 3 + (int32_t)((i * 7919u) % 256u);
    kvb_ctx_params p = kvb_ctx_default_params();
    p.kv_dtype = KVB_F32;
    p.n_ctx = N + 16;
    kvb_fid_ref *ref = kvb_fid_ref_create(model, &p, ids, N, 4, err, sizeof err);
    if (!ref) fprintf(stderr, "\n  %s", err);
    CU_ASSERT_FATAL(ref != NULL);
    const kvb_config *cfg = &model->cfg;
    static const struct { const char *method, *budget; } runs[] = {{"full", "100%"}, {"snapkv", "60%"}};
    for (size_t k = 0; k < sizeof runs / sizeof *runs; k++) {
        kvb_budget b;
        kvb_opts o = {0};
        kvb_fid_result r;
        CU_ASSERT_FATAL(kvb_budget_parse(runs[k].budget, &b, err, sizeof err) == 0);
        int rc = kvb_fidelity_run(ref, runs[k].method, &b, &o, &r, err, sizeof err);
        if (rc) fprintf(stderr, "\n  %s: %s", runs[k].method, err);
        CU_ASSERT_FATAL(rc == 0);
        int n_global = 0, below = 0;
        for (int l = 0; l < cfg->n_layer; l++) {
            double rec = kvb_fid_layer_recall(&r, l);
            if (kvb_layer_window(cfg, l)) {
                CU_ASSERT_DOUBLE_EQUAL(rec, 1.0, 1e-12);
                continue;
            }
            n_global++;
            CU_ASSERT(rec > 0 && rec <= 1 + 1e-5);
            if (k == 0) CU_ASSERT_DOUBLE_EQUAL(rec, 1.0, 1e-5);
            below += rec < 1 - 1e-4;
        }
        CU_ASSERT_EQUAL(n_global, 3);
        if (k == 1) CU_ASSERT(below > 0); /* SnapKV at 60% drops prompt tokens on the global layers */
        kvb_fid_result_free(&r);
    }
    kvb_fid_ref_free(ref);
}

int main(void) {
    model = util_arch_model_load(&util_gemma3_deep);
    if (!model) return 1;
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("fidelity_hybrid", NULL, NULL);
    CU_add_test(s, "local layers recall 1, global layers a share of full's mass", test_local_layers_recall_one_global_layers_a_share);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned fails = CU_get_number_of_failures();
    CU_cleanup_registry();
    kvb_model_free(model);
    return fails ? 1 : 0;
}
