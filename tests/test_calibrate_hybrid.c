/* test_calibrate_hybrid.c — `kvbench calibrate` on a hybrid model (sliding-window local layers and global ones):
 * the seeded gemma3-deep (tests/util_arch_model.h: 18 layers of which 5, 11 and 17 are global, window 24), written
 * here from its seed. A local layer attends only its window and runs no capture hook, so
 * Round Attention's and OmniKV's analyses run over the global layers: the watershed is a global layer with a global
 * layer after it (Round Attention then accepts the lw it gives), the curve's rows name global layers only, OmniKV's
 * per-layer abilities come back for the global layers (no "layer gave 0 rows" error), and PoD's blocks are formed
 * over the global layers: its stored profile names them ("layers": 5, 11, 17), each base is a global layer, PoD reads
 * it, and a profile that covers every layer (from before hybrid models) is refused by name. */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util_arch_model.h"
#include "util_common.h"
#include "benchmarks/calibration.h"
#include "methods/calibrate.h"
#include "methods/method.h"
#include "methods/profile.h"

static kvb_model *model;
static char dir[] = "/tmp/kvb_calhyb_XXXXXX", model_path[256];

static int calibrate_to(const char *kind, int dry_run, char *result, size_t cap, char *err, size_t err_len) {
    kvb_cal_opts o;
    kvb_cal_defaults(&o);
    o.kind = kind;
    o.out_dir = dir;
    o.samples = 2;
    o.rounds = 6;
    o.max_tokens = 800;
    o.dry_run = dry_run;
    o.quiet = 1;
    o.result = result;
    o.result_cap = cap;
    kvb_ctx_params cp = kvb_ctx_default_params();
    cp.n_ctx = 1024;
    return kvb_calibrate(model, &cp, &o, err, err_len);
}

static int calibrate(const char *kind, char *result, size_t cap, char *err, size_t err_len) {
    return calibrate_to(kind, 1, result, cap, err, err_len);
}

static void test_round_watershed_is_a_global_layer_round_accepts(void) {
    char result[160] = "", err[512] = "";
    const int rc = calibrate("round", result, sizeof result, err, sizeof err);
    if (rc) fprintf(stderr, "\n  %s", err);
    CU_ASSERT_FATAL(rc == 0);
    int w = -1, lw = -1, L = -1;
    CU_ASSERT_FATAL(sscanf(result, "watershed layer %d (lw = %d of %d layers)", &w, &lw, &L) == 3);
    printf("\n    %s", result);
    const kvb_config *cfg = &model->cfg;
    CU_ASSERT(L == cfg->n_layer && lw == w + 1 && w >= 0 && w < L);
    CU_ASSERT(kvb_layer_window(cfg, w) == 0);
    /* the CSV lists global layers only */
    char path[600];
    snprintf(path, sizeof path, "%s/calibrate-round.csv", dir);
    FILE *f = fopen(path, "r");
    CU_ASSERT_FATAL(f != NULL);
    char line[128];
    int rows = 0;
    CU_ASSERT(fgets(line, sizeof line, f) != NULL); /* header */
    while (fgets(line, sizeof line, f)) {
        const int l = atoi(line);
        CU_ASSERT(l >= 0 && l < L && kvb_layer_window(cfg, l) == 0);
        rows++;
    }
    fclose(f);
    unlink(path);
    snprintf(path, sizeof path, "%s/calibrate-round.md", dir);
    unlink(path);
    CU_ASSERT(rows >= 1);
    /* Round Attention takes that watershed on this model */
    kvb_ctx_params cp = kvb_ctx_default_params();
    cp.n_ctx = 256;
    kvb_ctx *c = kvb_ctx_create(model, &cp, err, sizeof err);
    CU_ASSERT_FATAL(c != NULL);
    kvb_budget b = {KVB_BUDGET_FRACTION, 1.0, 0};
    kvb_opts o = {0};
    char opt[32];
    snprintf(opt, sizeof opt, "lw=%d", lw);
    CU_ASSERT_FATAL(kvb_opts_add(&o, opt, err, sizeof err) == 0);
    kvb_method *m = kvb_method_create("round", c, &b, &o, err, sizeof err);
    if (!m) fprintf(stderr, "\n  round %s: %s", opt, err);
    CU_ASSERT(m != NULL);
    kvb_method_free(m, c);
    /* a watershed on a local layer is refused by name */
    kvb_opts o2 = {0};
    CU_ASSERT_FATAL(kvb_opts_add(&o2, "lw=3", err, sizeof err) == 0);
    CU_ASSERT(kvb_method_create("round", c, &b, &o2, err, sizeof err) == NULL);
    CU_ASSERT(strstr(err, "sliding-window (local) layer") != NULL);
    kvb_ctx_free(c);
}

static void test_omnikv_abilities_cover_the_global_layers(void) {
    const kvb_config *cfg = &model->cfg;
    int G = 0;
    for (int l = 0; l < cfg->n_layer; l++) G += !kvb_layer_window(cfg, l);
    char err[512] = "";
    kvb_ctx_params cp = kvb_ctx_default_params();
    cp.n_ctx = 256;
    kvb_ctx *c = kvb_ctx_create(model, &cp, err, sizeof err);
    CU_ASSERT_FATAL(c != NULL);
    enum { N = 120 };
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = (int32_t)(3 + (i * 31) % (cfg->n_vocab - 3));
    double ability[64];
    for (int i = 0; i < 64; i++) ability[i] = -1.0;
    const int rc = kvb_cal_omnikv_run(c, ids, N, 0.1, 0, ability, err, sizeof err);
    if (rc) fprintf(stderr, "\n  %s", err);
    CU_ASSERT_FATAL(rc == 0);
    /* the mass later global layers put on a layer's top tokens: a share of their attention, for the G - 1 layers
     * that have a later one */
    for (int g = 0; g + 1 < G; g++) CU_ASSERT(ability[g] > 0.0 && ability[g] <= 1.0 + 1e-9);
    kvb_ctx_free(c);
}

/* PoD on the model, created from the profile (no block=): 0, or -1 with err */
static int pod_from_profile(char *err, size_t err_len) {
    kvb_ctx_params cp = kvb_ctx_default_params();
    cp.n_ctx = 256;
    kvb_ctx *c = kvb_ctx_create(model, &cp, err, err_len);
    if (!c) return -1;
    kvb_budget b = {KVB_BUDGET_FRACTION, 0.5, 0};
    kvb_opts o = {0};
    kvb_method *m = kvb_method_create("pod", c, &b, &o, err, err_len);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
    return m ? 0 : -1;
}

static void test_pod_blocks_cover_the_global_layers(void) {
    const kvb_config *cfg = &model->cfg;
    int gl[64], G = 0;
    for (int l = 0; l < cfg->n_layer; l++)
        if (!kvb_layer_window(cfg, l)) gl[G++] = l;
    char result[160] = "", err[512] = "";
    const int rc = calibrate_to("pod", 0, result, sizeof result, err, sizeof err); /* stored in the test's profile dir */
    if (rc) fprintf(stderr, "\n  %s", err);
    CU_ASSERT_FATAL(rc == 0);
    printf("\n    pod: %s", result);
    CU_ASSERT(strstr(result, "of global layers") != NULL);
    cJSON *root = kvb_profile_load(model, err, sizeof err);
    CU_ASSERT_FATAL(root != NULL);
    cJSON *s = cJSON_GetObjectItemCaseSensitive(root, "pod"), *layers = cJSON_GetObjectItemCaseSensitive(s, "layers"),
          *bases = cJSON_GetObjectItemCaseSensitive(s, "bases");
    /* the layers it covers are the global ones, in order; per KV head one base per covered layer, each a covered
     * layer at or below it that starts a block of consecutive covered layers */
    CU_ASSERT_FATAL(cJSON_GetArraySize(layers) == G && cJSON_GetArraySize(bases) == cfg->n_head_kv);
    for (int i = 0; i < G; i++) CU_ASSERT(cJSON_GetArrayItem(layers, i)->valueint == gl[i]);
    for (int g = 0; g < cfg->n_head_kv; g++) {
        cJSON *row = cJSON_GetArrayItem(bases, g);
        CU_ASSERT_FATAL(cJSON_GetArraySize(row) == G);
        CU_ASSERT(cJSON_GetArrayItem(row, 0)->valueint == gl[0]);
        for (int i = 1; i < G; i++) {
            const int b = cJSON_GetArrayItem(row, i)->valueint, prev = cJSON_GetArrayItem(row, i - 1)->valueint;
            CU_ASSERT(b == gl[i] || b == prev);
            CU_ASSERT(kvb_layer_window(cfg, b) == 0);
        }
    }
    /* PoD reads the profile on this model */
    int got = pod_from_profile(err, sizeof err);
    if (got) fprintf(stderr, "\n  pod from the profile: %s", err);
    CU_ASSERT(got == 0);
    /* a pod section over every layer (no "layers") is refused by name: its blocks would span sliding-window layers */
    cJSON *every = cJSON_CreateObject(), *rows = cJSON_AddArrayToObject(every, "bases");
    for (int g = 0; g < cfg->n_head_kv; g++) {
        cJSON *row = cJSON_CreateArray();
        for (int l = 0; l < cfg->n_layer; l++) cJSON_AddItemToArray(row, cJSON_CreateNumber(0));
        cJSON_AddItemToArray(rows, row);
    }
    CU_ASSERT_FATAL(kvb_profile_store(model, "pod", every, err, sizeof err) == 0);
    CU_ASSERT(pod_from_profile(err, sizeof err) == -1 && strstr(err, "sliding-window layer") && !strchr(err, '\n'));
    printf("\n    a profile over every layer: %s", err);
    /* one that names other layers than the global ones too */
    cJSON_AddItemToObject(every, "layers", cJSON_CreateIntArray((const int[]){0, 1, 2}, 3));
    CU_ASSERT_FATAL(kvb_profile_store(model, "pod", every, err, sizeof err) == 0);
    CU_ASSERT(pod_from_profile(err, sizeof err) == -1 && strstr(err, "global layers"));
    cJSON_Delete(every);
    cJSON_Delete(root);
    char path[1024];
    static const char *const outs[] = {"calibrate-pod.csv", "calibrate-pod-matrix.csv", "calibrate-pod.md"};
    for (size_t i = 0; i < sizeof outs / sizeof *outs; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, outs[i]);
        unlink(path);
    }
    if (kvb_profile_path(model, path, sizeof path, err, sizeof err) == 0) {
        unlink(path);
        strcat(path, ".lock");
        unlink(path);
    }
}

int main(void) {
    char err[512];
    if (!mkdtemp(dir)) return 1;
    setenv("KVB_PROFILE_DIR", dir, 1);
    snprintf(model_path, sizeof model_path, "%s/gemma3-deep.gguf", dir);
    if (util_arch_model_write(&util_gemma3_deep, model_path, NULL, NULL)) return fprintf(stderr, "writing %s failed\n", model_path), 1;
    if (!(model = kvb_model_load(model_path, err, sizeof err))) return fprintf(stderr, "%s\n", err), 1;
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("calibration on a hybrid model", NULL, NULL);
    CU_add_test(s, "round: the watershed is a global layer Round accepts", test_round_watershed_is_a_global_layer_round_accepts);
    CU_add_test(s, "omnikv: abilities cover the global layers", test_omnikv_abilities_cover_the_global_layers);
    CU_add_test(s, "pod: blocks over the global layers, stored with them", test_pod_blocks_cover_the_global_layers);
    int rc = util_run_suites();
    unlink(model_path);
    rmdir(dir);
    kvb_model_free(model);
    return rc;
}
