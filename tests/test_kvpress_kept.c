/* test_kvpress_kept.c — kvbench keeps the tokens kvpress keeps. On the default model and the 3765-token prompt
 * tests/fixtures/prompts/prose_4000.txt, at kvpress's budget for compression_ratio 0.7 (1129 tokens per head), each
 * method with kvpress's parameters keeps per layer and KV head the positions its kvpress press keeps, against the
 * kept sets kvpress computed (tests/fixtures/kvpress/, made by scripts/kvpress_kept.py in a throwaway
 * transformers environment, outside CI). StreamingLLM's sets are positions only: equal. The others rank by
 * attention or key norms, and the engines' activations differ in the last bits (transformers in float32,
 * kvbench's prefill through the f32 GEMM on f16 weights' dequantization; last-position logits ~0.5 apart):
 * SnapKV, AdaKV and TOVA agree to Jaccard >= 0.9965 on every one of the 90 heads, the 0.98 held here per
 * head. Knorm ranks raw key norms, where near-ties are common: one head of layer 0 is at 0.85, the mean 0.997.
 * PyramidKV differs by design in its top layers (kvbench shapes B - window per layer as KVCache-Factory does,
 * kvpress shapes B): layers 0-20 are held to 0.98, the rest measured. A change in a rule (window, pooling,
 * grouping, top-k) moves every layer, far below these bounds. (Before the f32 prefill GEMM, with activations
 * quantized to 8 bits as llama.cpp does, SnapKV's deepest heads fell to 0.945.) LagKV (min 0.989, mean 0.993: its
 * within-partition ranks tie across partitions, kvbench to the earlier token, torch.topk as it falls), CUR (0.995,
 * 0.999) and CriticalKV over SnapKV and over AdaKV (0.996, 0.999) are held to 0.98 per head and 0.99 mean.
 * Compactor computes the exact leverage: against LeverageScorePress with a square sketch (64 = head_dim, invertible:
 * the exact leverage too) min 0.848 (a head of layer 0, raw key geometry's near-ties as Knorm's), mean 0.972, held to
 * 0.8 and 0.96; against the press's default 48-column sketch (seeded) min 0.61, mean 0.745: what the sketch's
 * approximation costs, held to 0.55 and 0.7. ExpectedAttention with kvpress's defaults (covariance term, value
 * norms) on the whole prompt's query statistics (window=4096, its own prefill): min 0.9947, mean 0.9992, held to 0.98
 * and 0.99. */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util_common.h"
#include "engine/kvcache.h"
#include "engine/tokenizer.h"
#include "methods/method.h"

enum { WINDOW = 64, MAX_POS = 8192 };

static kvb_model *model;
static int32_t *ids;
static int n_ids;
static kvb_ctx *base;
static kvb_share *share;

/* The fixture's kept positions of (layer, head), or NULL; *n their count. Header: n_prompt must be the prompt's. */
typedef struct {
    int n_layer, n_head_kv, n_prompt, tokens_per_head;
    int32_t **pos; /* [layer * n_head_kv + head] */
    int *n;
} fixture;

static int load_fixture(const char *path, fixture *f) {
    memset(f, 0, sizeof *f);
    f->n_layer = model->cfg.n_layer, f->n_head_kv = model->cfg.n_head_kv;
    f->pos = calloc((size_t)f->n_layer * f->n_head_kv, sizeof *f->pos);
    f->n = calloc((size_t)f->n_layer * f->n_head_kv, sizeof *f->n);
    char *text = util_read_file(path, NULL);
    if (!text || !f->pos || !f->n) return free(text), -1;
    int rc = 0;
    for (char *line = strtok(text, "\n"); line && !rc; line = strtok(NULL, "\n")) {
        cJSON *o = cJSON_Parse(line);
        if (!o) { rc = -1; break; }
        const cJSON *when = cJSON_GetObjectItemCaseSensitive(o, "when");
        if (!when) {
            f->n_prompt = cJSON_GetObjectItemCaseSensitive(o, "n_prompt")->valueint;
            f->tokens_per_head = cJSON_GetObjectItemCaseSensitive(o, "tokens_per_head")->valueint;
        } else {
            int l = cJSON_GetObjectItemCaseSensitive(o, "layer")->valueint, h = cJSON_GetObjectItemCaseSensitive(o, "kv_head")->valueint;
            const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "positions"), *x;
            if (l < 0 || l >= f->n_layer || h < 0 || h >= f->n_head_kv || !cJSON_IsArray(a)) rc = -1;
            int k = l * f->n_head_kv + h, i = 0;
            if (!rc && !(f->pos[k] = malloc((size_t)(cJSON_GetArraySize(a) + 1) * sizeof(int32_t)))) rc = -1;
            if (!rc) cJSON_ArrayForEach(x, a) f->pos[k][i++] = (int32_t)x->valueint;
            if (!rc) f->n[k] = i;
        }
        cJSON_Delete(o);
    }
    free(text);
    return rc;
}

static void free_fixture(fixture *f) {
    for (int i = 0; f->pos && i < f->n_layer * f->n_head_kv; i++) free(f->pos[i]);
    free(f->pos);
    free(f->n);
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* |A n B| / |A u B| of two ascending lists */
static double jaccard(const int32_t *a, int na, const int32_t *b, int nb) {
    int i = 0, j = 0, both = 0;
    while (i < na && j < nb) {
        if (a[i] == b[j]) both++, i++, j++;
        else if (a[i] < b[j]) i++;
        else j++;
    }
    int any = na + nb - both;
    return any ? (double)both / any : 1.0;
}

/* The method on a fork of a shared prefill (from, sh, keeping `window` query rows) at the fixture's budget: every
 * head's Jaccard >= min_all, those of the first `early` layers >= min_early, the mean over the heads >= min_mean. */
static void compare_on(kvb_ctx *from, kvb_share *sh, int window, const char *fixture_name, const char *method,
                       const char *opts, double min_all, int early, double min_early, double min_mean) {
    char path[256], err[512];
    snprintf(path, sizeof path, "tests/fixtures/kvpress/%s.jsonl", fixture_name);
    fixture f;
    CU_ASSERT_FATAL(load_fixture(path, &f) == 0);
    CU_ASSERT_FATAL(f.n_prompt == n_ids && f.tokens_per_head > 0);
    kvb_budget b = {KVB_BUDGET_TOKENS, 0, f.tokens_per_head};
    kvb_opts o = {0};
    CU_ASSERT_FATAL(kvb_opts_add(&o, opts, err, sizeof err) == 0);
    kvb_ctx *c = kvb_ctx_fork(from, window, err, sizeof err);
    CU_ASSERT_FATAL(c != NULL);
    kvb_method *m = kvb_method_create(method, c, &b, &o, err, sizeof err);
    if (!m) fprintf(stderr, "\n  %s: %s\n", method, err);
    CU_ASSERT_FATAL(m != NULL);
    CU_ASSERT_FATAL(kvb_method_adopt(m, c, sh, err, sizeof err) == 0);
    double lo = 1, sum = 0;
    int lo_l = -1, lo_h = -1;
    for (int l = 0; l < f.n_layer; l++)
        for (int h = 0; h < f.n_head_kv; h++) {
            util_kv_head hc = util_kv_head_copy(c->kv, l, h);
            qsort(hc.pos, (size_t)hc.n, sizeof *hc.pos, cmp_i32);
            const int k = l * f.n_head_kv + h;
            double jac = f.pos[k] ? jaccard(hc.pos, (int)hc.n, f.pos[k], f.n[k]) : 0;
            util_kv_head_free(&hc);
            sum += jac;
            if (jac < lo) lo = jac, lo_l = l, lo_h = h;
            if (l < early) CU_ASSERT(jac >= min_early);
        }
    fprintf(stderr, "\n  %s vs kvpress: Jaccard min %.4f (layer %d head %d), mean %.4f ", method, lo, lo_l, lo_h,
            sum / (f.n_layer * f.n_head_kv));
    CU_ASSERT(lo >= min_all);
    CU_ASSERT(sum / (f.n_layer * f.n_head_kv) >= min_mean);
    kvb_method_free(m, c);
    kvb_ctx_free(c);
    free_fixture(&f);
}

static void compare(const char *fixture_name, const char *method, const char *opts, double min_all, int early,
                    double min_early, double min_mean) {
    compare_on(base, share, WINDOW, fixture_name, method, opts, min_all, early, min_early, min_mean);
}

/* ExpectedAttention with kvpress's statistics (every prompt query but the sinks: window 4096 >= n - 4) on a prefill of
 * its own that keeps them all */
static void test_expected(void) {
    char err[512];
    kvb_ctx_params cp = kvb_ctx_default_params();
    cp.n_ctx = n_ids + 8;
    kvb_ctx *c = kvb_ctx_create(model, &cp, err, sizeof err);
    CU_ASSERT_FATAL(c != NULL);
    kvb_share *sh = kvb_share_create(c, 4096, 0, err, sizeof err);
    CU_ASSERT_FATAL(sh != NULL);
    CU_ASSERT_FATAL(kvb_forward(c, ids, n_ids, err, sizeof err) == 0);
    compare_on(c, sh, 4096, "expected", "expected", "window=4096", 0.98, 0, 0.98, 0.99);
    kvb_share_free(sh, c);
    kvb_ctx_free(c);
}

static void test_snapkv(void) { compare("snapkv", "snapkv", "window=64,kernel=5,pool=avg", 0.98, 0, 0.98, 0.99); }
static void test_streamingllm(void) { compare("streamingllm", "streamingllm", "sinks=4", 1.0, 0, 1.0, 1.0); }
static void test_adakv(void) {
    compare("adakv", "adakv", "base=snapkv,window=64,kernel=5,pool=avg,alpha=0.2", 0.98, 0, 0.98, 0.99);
}
static void test_tova(void) { compare("tova", "tova", "", 0.98, 0, 0.98, 0.99); }
static void test_knorm(void) { compare("knorm", "knorm", "", 0.8, 0, 0.8, 0.99); }
static void test_pyramidkv(void) {
    compare("pyramidkv_w32", "pyramidkv", "window=32,kernel=5,pool=avg,beta=20", 0.5, 21, 0.98, 0.95);
}
static void test_lagkv(void) { compare("lagkv", "lagkv", "sinks=4,lag=128,cross=0", 0.98, 0, 0.98, 0.99); }
static void test_cur(void) { compare("cur", "cur", "leverage=kv_product,sinks=4,window=16", 0.98, 0, 0.98, 0.99); }
static void test_criticalkv(void) {
    compare("criticalkv", "criticalkv", "base=snapkv,window=64,kernel=5,pool=avg", 0.98, 0, 0.98, 0.99);
}
static void test_compactor(void) { compare("compactor_d64", "compactor", "", 0.8, 0, 0.8, 0.96); }
static void test_compactor_sketch(void) { compare("compactor", "compactor", "", 0.55, 0, 0.55, 0.7); }
static void test_criticalkv_ada(void) {
    compare("criticalkv_ada", "criticalkv", "base=adakv,window=64,kernel=5,pool=avg,alpha=0.2", 0.98, 0, 0.98, 0.99);
}

int main(void) {
    char path[1024], err[512];
    if (!util_default_model(path, sizeof path)) {
        fprintf(stderr, "default model missing: run scripts/fetch-model.sh\n");
        return 1;
    }
    size_t len = 0;
    char *text = util_read_file("tests/fixtures/prompts/prose_4000.txt", &len);
    if (!text || !(model = kvb_model_load(path, err, sizeof err)) ||
        tok_encode(model->tok, text, len, 1, 0, &ids, &n_ids, err, sizeof err)) {
        fprintf(stderr, "setup failed: %s\n", err);
        return 1;
    }
    free(text);
    kvb_ctx_params cp = kvb_ctx_default_params();
    cp.n_ctx = n_ids + 8;
    if (!(base = kvb_ctx_create(model, &cp, err, sizeof err)) || !(share = kvb_share_create(base, WINDOW, 0, err, sizeof err)) ||
        kvb_forward(base, ids, n_ids, err, sizeof err)) {
        fprintf(stderr, "prefill failed: %s\n", err);
        return 1;
    }
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("kept tokens against kvpress", NULL, NULL);
    CU_add_test(s, "snapkv window=64 kernel=5 pool=avg", test_snapkv);
    CU_add_test(s, "streamingllm sinks=4", test_streamingllm);
    CU_add_test(s, "adakv over snapkv alpha=0.2", test_adakv);
    CU_add_test(s, "tova", test_tova);
    CU_add_test(s, "knorm", test_knorm);
    CU_add_test(s, "pyramidkv window=32 beta=20", test_pyramidkv);
    CU_add_test(s, "lagkv sinks=4 lag=128", test_lagkv);
    CU_add_test(s, "cur kv_product window=16", test_cur);
    CU_add_test(s, "criticalkv over snapkv", test_criticalkv);
    CU_add_test(s, "criticalkv over adakv alpha=0.2", test_criticalkv_ada);
    CU_add_test(s, "compactor against LeverageScorePress with a square (exact) sketch", test_compactor);
    CU_add_test(s, "compactor against LeverageScorePress's 48-column sketch", test_compactor_sketch);
    CU_add_test(s, "expected (covariance, value norms) on the whole prompt's statistics", test_expected);
    int rc = util_run_suites();
    kvb_share_free(share, base);
    kvb_ctx_free(base);
    free(ids);
    kvb_model_free(model);
    return rc;
}
