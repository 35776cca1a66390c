/* test_omnikv_depth.c — OmniKV's default filter layers on models of any depth (methods/omnikv.c's rule): the
 * paper's {2, 8, 18}/32 scaled to the model, then, under a Mem% budget below the full layers' share
 * F_share = (2|F| + |L0|) / L, filter layers dropped from the last one until it fits (at least one kept); an
 * error naming the smallest budget only when even one does not fit. Given layers are never changed. On
 * synthetic:tiny?layers=L models (engine/synthetic.h): the chosen layers, the note, and a prefill plus a
 * decode step whose measured store matches the method's expected tokens (kvb_method_verify). On a hybrid model (the
 * seeded gemma3-deep: global layers 5, 11, 17 among 18, window 24) the same rule over the global layers, filter
 * layers refused on local ones, and the sparse layers' T from the cache the model holds (docs/methods.md). */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util_arch_model.h"
#include "util_common.h"
#include "engine/model.h"
#include "methods/method.h"

static kvb_model *load(int n_layer) {
    char name[64], err[256];
    snprintf(name, sizeof name, "synthetic:tiny?layers=%d", n_layer);
    kvb_model *m = kvb_model_load(name, err, sizeof err);
    if (!m) fprintf(stderr, "\n  %s: %s\n", name, err);
    CU_ASSERT_FATAL(m != NULL);
    return m;
}

static kvb_ctx *new_ctx(kvb_model *model) {
    char err[256];
    kvb_ctx_params p = kvb_ctx_default_params();
    p.n_ctx = 256;
    p.n_threads = 2;
    p.n_batch = 64;
    kvb_ctx *c = kvb_ctx_create(model, &p, err, sizeof err);
    CU_ASSERT_FATAL(c != NULL);
    return c;
}

/* omnikv at budget (with opts) on c, or NULL + err */
static kvb_method *make(kvb_ctx *c, const char *budget, const char *opts, char *err, size_t err_len) {
    kvb_budget b;
    CU_ASSERT_FATAL(kvb_budget_parse(budget, &b, err, err_len) == 0);
    kvb_opts o = {0};
    if (opts) CU_ASSERT_FATAL(kvb_opts_add(&o, opts, err, err_len) == 0);
    return kvb_method_create("omnikv", c, &b, &o, err, err_len);
}

/* The default layers of an L-layer model at budget: describe starts with want_layers; the note names the drop
 * when one was made; a 120-token prefill and one decode step hold what the method claims. */
static void expect_default(int n_layer, const char *budget, const char *want_layers, int dropped) {
    char err[256] = "", desc[240], want[64];
    kvb_model *model = load(n_layer);
    kvb_ctx *c = new_ctx(model);
    kvb_method *m = make(c, budget, NULL, err, sizeof err);
    if (!m) fprintf(stderr, "\n  %d layers at %s: %s\n", n_layer, budget, err);
    CU_ASSERT_FATAL(m != NULL);
    m->def->describe(m, desc, sizeof desc);
    snprintf(want, sizeof want, "layers=%s ", want_layers);
    CU_ASSERT(!strncmp(desc, want, strlen(want)));
    if (strncmp(desc, want, strlen(want))) fprintf(stderr, "\n  %d layers at %s: %s\n", n_layer, budget, desc);
    CU_ASSERT(dropped ? strstr(m->note, want + 7) != NULL : m->note[0] == 0);
    int32_t ids[120];
    for (int i = 0; i < 120; i++) ids[i] = 3 + (i * 37) % 250;
    CU_ASSERT(kvb_method_prefill(m, c, ids, 120, err, sizeof err) == 0); /* verifies the store against the claim */
    int32_t next = 17;
    CU_ASSERT(kvb_forward(c, &next, 1, err, sizeof err) == 0);
    CU_ASSERT(kvb_method_verify(m, c, 0, err, sizeof err) == 0);
    if (err[0]) fprintf(stderr, "\n  %d layers at %s: %s\n", n_layer, budget, err);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
    kvb_model_free(model);
}

/* With offload, the host tier holds the sparse layers, and the device's KV writer may still be writing their new
 * rows: a method whose hooks read the host tier from host code waits for the device before each layer's hooks.
 * OmniKV's do not (KVB_NO_HOST_READS: its loads read the host tier on the device), so a decode step waits only for
 * each filter layer's selection coming down and for the logits: counted here by a sync op on the CPU backend. */
static int n_syncs;
static int count_sync(kvb_backend *be) {
    (void)be;
    n_syncs++;
    return 0;
}

static void test_offloaded_decode_waits_only_for_the_selections_and_the_logits(void) {
    char err[256] = "", desc[240];
    kvb_model *model = load(12);
    kvb_ctx *c = new_ctx(model);
    kvb_method *m = make(c, "32", "offload=1,layers=1;5", err, sizeof err);
    if (!m) fprintf(stderr, "\n  %s\n", err);
    CU_ASSERT_FATAL(m != NULL);
    m->def->describe(m, desc, sizeof desc);
    int32_t ids[120];
    for (int i = 0; i < 120; i++) ids[i] = 3 + (i * 37) % 250;
    const int rc = kvb_method_prefill(m, c, ids, 120, err, sizeof err);
    if (rc) fprintf(stderr, "\n  %s: %s\n", desc, err);
    CU_ASSERT_FATAL(rc == 0);
    CU_ASSERT_FATAL(kvc_used_bytes(c->kv, KVB_TIER_HOST) > 0); /* the sparse layers are offloaded */
    int (*was)(kvb_backend *) = c->be->sync;
    c->be->sync = count_sync;
    n_syncs = 0;
    int32_t next = 17;
    CU_ASSERT(kvb_forward(c, &next, 1, err, sizeof err) == 0);
    c->be->sync = was;
    printf("\n    %s: %d waits in a decode step of 12 layers", desc, n_syncs);
    CU_ASSERT(n_syncs == 2 + 1); /* filter layers 1 and 5, then the logits */
    kvb_method_free(m, c);
    kvb_ctx_free(c);
    kvb_model_free(model);
}

/* 30 layers (the default model's depth): 2;8;17 hold 8/30 = 26.7% <= 30%, so the quick suite keeps them */
static void test_30_layers_at_30pct_keep_the_papers_scaled_layers(void) { expect_default(30, "30%", "2;8;17", 0); }

/* 24 layers (Qwen2.5-Coder-0.5B): 2;6;14 hold 8/24 = 33% > 30%; without 14: 6/24 = 25% */
static void test_24_layers_at_30pct_drop_the_last_filter_layer(void) { expect_default(24, "30%", "2;6", 1); }

/* 32 layers (the paper's): 2;8;18 = 8/32 = 25% fits 30%; at 15% drop 18 (2;8: 6/32 = 18.75%) and 8 (2: 12.5%) */
static void test_32_layers_keep_the_papers_layers_and_drop_to_fit_a_small_budget(void) {
    expect_default(32, "30%", "2;8;18", 0);
    expect_default(32, "15%", "2", 1);
}

/* 12 layers: round(0.75, 3, 6.75) = 1;3;7 hold 7/12 = 58%; at 50% 1;3 (5/12); at 100% all three */
static void test_12_layers_drop_as_many_as_needed(void) {
    expect_default(12, "50%", "1;3", 1);
    expect_default(12, "100%", "1;3;7", 0);
}

/* A token budget has no Mem% to compare F_share with when the method is made: the scaled layers stay */
static void test_token_budget_keeps_the_scaled_layers(void) {
    char err[256] = "", desc[240];
    kvb_model *model = load(24);
    kvb_ctx *c = new_ctx(model);
    kvb_method *m = make(c, "40", NULL, err, sizeof err);
    CU_ASSERT_FATAL(m != NULL);
    m->def->describe(m, desc, sizeof desc);
    CU_ASSERT(!strncmp(desc, "layers=2;6;14 ", 14) && m->note[0] == 0);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
    kvb_model_free(model);
}

/* Even one filter layer does not fit: one line naming the smallest budget that would (24 layers: 2 alone = 4/24
 * = 16.7%); given layers are the user's and stay an error below their share. */
static void test_too_small_a_budget_names_the_smallest_that_fits(void) {
    char err[256] = "";
    kvb_model *model = load(24);
    kvb_ctx *c = new_ctx(model);
    CU_ASSERT(make(c, "10%", NULL, err, sizeof err) == NULL);
    CU_ASSERT(strstr(err, "smallest budget that fits is 16.7%") && !strchr(err, '\n'));
    if (!strstr(err, "16.7%")) fprintf(stderr, "\n  %s\n", err);
    kvb_method *m = make(c, "17%", NULL, err, sizeof err);
    CU_ASSERT(m != NULL);
    kvb_method_free(m, c);
    CU_ASSERT(make(c, "30%", "layers=2;6;14", err, sizeof err) == NULL);
    CU_ASSERT(strstr(err, "below the share") != NULL);
    kvb_ctx_free(c);
    kvb_model_free(model);
}

/* gemma3-deep: the paper's layers scaled over its 3 global layers are 5;11;17 (all full: 100%); a Mem% budget drops
 * to 5 (5 filter, 11 full, 17 sparse: 2/3 of the global layers). At 120 tokens the windows hold 15 x 24 = 360
 * tokens: the floor is (2 x 120 + 360) / (3 x 120 + 360) = 83.3%, so 70% is refused after the prompt naming the
 * windows, and 90% leaves T = (0.9 x 720 - 600) / 1 = 48 tokens to layer 17, held and verified. */
static void test_hybrid_model_roles_over_the_global_layers(void) {
    char dir[] = "/tmp/kvb_omnikv_hyb_XXXXXX", path[300], err[512] = "", desc[240];
    CU_ASSERT_FATAL(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/gemma3-deep.gguf", dir);
    CU_ASSERT_FATAL(util_arch_model_write(&util_gemma3_deep, path, NULL, NULL) == 0);
    kvb_model *model = kvb_model_load(path, err, sizeof err);
    CU_ASSERT_FATAL(model != NULL);
    kvb_ctx *c = new_ctx(model);
    kvb_method *m = make(c, "100%", NULL, err, sizeof err);
    CU_ASSERT_FATAL(m != NULL);
    m->def->describe(m, desc, sizeof desc);
    CU_ASSERT(!strncmp(desc, "layers=5;11;17 ", 15));
    kvb_method_free(m, c);
    CU_ASSERT(make(c, "100%", "layers=0", err, sizeof err) == NULL); /* a local layer */
    CU_ASSERT(strstr(err, "layer 0 is a sliding-window (local) layer") != NULL);
    int32_t ids[120];
    for (int i = 0; i < 120; i++) ids[i] = 3 + (i * 37) % 250;
    m = make(c, "70%", NULL, err, sizeof err);
    CU_ASSERT_FATAL(m != NULL);
    CU_ASSERT(kvb_method_prefill(m, c, ids, 120, err, sizeof err) != 0);
    CU_ASSERT(strstr(err, "windows") && strstr(err, "83.3%"));
    if (!strstr(err, "83.3%")) fprintf(stderr, "\n  %s\n", err);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
    c = new_ctx(model);
    m = make(c, "90%", NULL, err, sizeof err);
    CU_ASSERT_FATAL(m != NULL);
    CU_ASSERT(kvb_method_prefill(m, c, ids, 120, err, sizeof err) == 0); /* verifies the store and the budget */
    m->def->describe(m, desc, sizeof desc);
    CU_ASSERT(!strncmp(desc, "layers=5 ", 9) && strstr(desc, " T=48") != NULL);
    if (!strstr(desc, " T=48")) fprintf(stderr, "\n  %s\n", desc);
    kvb_kv_usage u;
    kvb_method_usage(m, c, &u);
    CU_ASSERT(u.device_frac > 0.899 && u.device_frac < 0.901);
    int32_t next = 17;
    CU_ASSERT(kvb_forward(c, &next, 1, err, sizeof err) == 0);
    CU_ASSERT(kvb_method_verify(m, c, 0, err, sizeof err) == 0);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
    kvb_model_free(model);
    unlink(path);
    rmdir(dir);
}

int main(void) {
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("omnikv default layers by depth", NULL, NULL);
    CU_add_test(s, "30 layers at 30% keep the paper's scaled layers", test_30_layers_at_30pct_keep_the_papers_scaled_layers);
    CU_add_test(s, "24 layers at 30% drop the last filter layer", test_24_layers_at_30pct_drop_the_last_filter_layer);
    CU_add_test(s, "32 layers keep the paper's layers, drop to fit a small budget",
                test_32_layers_keep_the_papers_layers_and_drop_to_fit_a_small_budget);
    CU_add_test(s, "12 layers drop as many as needed", test_12_layers_drop_as_many_as_needed);
    CU_add_test(s, "a token budget keeps the scaled layers", test_token_budget_keeps_the_scaled_layers);
    CU_add_test(s, "too small a budget names the smallest that fits", test_too_small_a_budget_names_the_smallest_that_fits);
    CU_add_test(s, "a hybrid model's roles are over its global layers", test_hybrid_model_roles_over_the_global_layers);
    CU_add_test(s, "an offloaded decode step waits only for the selections and the logits",
                test_offloaded_decode_waits_only_for_the_selections_and_the_logits);
    return util_run_suites();
}
