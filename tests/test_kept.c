/* test_kept.c — --dump-kept (engine/kept.h) on a tiny random model: every (layer, KV head) line lists exactly the
 * positions the store holds (read back independently, slot by slot, with kvc_gather) and which of them are on the
 * host tier; StreamingLLM's lines are its known kept set (sinks + the most recent tokens); the attended lists of
 * a selecting method (OmniKV with offload) are what its last decode step read; the header carries the prompt.
 *
 * On a hybrid model (the seeded gemma3-deep, tests/util_arch_model.h: window 24, 15 local and 3 global layers) a
 * local layer's line says its window, keeps exactly the last W positions and attended exactly them, whatever the
 * method does to the global layers. */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util_arch_model.h"
#include "util_common.h"
#include "util_gguf_writer.h"
#include "engine/kept.h"
#include "engine/kvcache.h"
#include "methods/method.h"

enum { L = 6, E = 32, NH = 4, NKV = 2, FF = 48, V = 300, CTX = 512, N_PROMPT = 200 };

static kvb_model *model, *hybrid;
static char dir[] = "/tmp/kvb_kept_XXXXXX", model_path[256], hybrid_path[256];

static kvb_ctx *run(const char *method, const char *budget, const char *opts, int n_decode, kvb_kept **k, FILE *out) {
    char err[256];
    kvb_ctx_params p = kvb_ctx_default_params();
    p.n_ctx = CTX, p.n_threads = 2, p.n_batch = 64;
    kvb_ctx *c = kvb_ctx_create(model, &p, err, sizeof err);
    CU_ASSERT_FATAL(c != NULL);
    kvb_budget b;
    CU_ASSERT_FATAL(kvb_budget_parse(budget, &b, err, sizeof err) == 0);
    kvb_opts o = {0};
    if (opts) CU_ASSERT_FATAL(kvb_opts_add(&o, opts, err, sizeof err) == 0);
    kvb_method *m = kvb_method_create(method, c, &b, &o, err, sizeof err);
    if (!m) fprintf(stderr, "\n  %s: %s\n", method, err);
    CU_ASSERT_FATAL(m != NULL);
    *k = kvb_kept_attach(c);
    int32_t ids[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++) ids[i] = (int32_t)(1 + (i * 37) % (V - 1));
    CU_ASSERT_FATAL(kvb_method_prefill(m, c, ids, N_PROMPT, err, sizeof err) == 0);
    CU_ASSERT_FATAL(kvb_kept_header(out, "\"method\": \"x\"", ids, N_PROMPT, err, sizeof err) == 0);
    CU_ASSERT_FATAL(kvb_kept_write(*k, c, "prefill", out, err, sizeof err) == 0);
    for (int t = 0; t < n_decode; t++) {
        int32_t tok = (int32_t)(5 + t);
        CU_ASSERT_FATAL(kvb_forward(c, &tok, 1, err, sizeof err) == 0);
    }
    CU_ASSERT_FATAL(kvb_kept_write(*k, c, "end", out, err, sizeof err) == 0);
    kvb_method_free(m, c);
    return c;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* The store's positions of one head, read slot by slot (util_kv_head_copy: kvc_gather), sorted. */
static int64_t store_positions(kvb_ctx *c, int l, int h, int32_t *pos) {
    util_kv_head hc = util_kv_head_copy(c->kv, l, h);
    int64_t n = hc.n;
    memcpy(pos, hc.pos, (size_t)n * sizeof *pos);
    util_kv_head_free(&hc);
    qsort(pos, (size_t)n, sizeof *pos, cmp_i32);
    return n;
}

static int64_t list(const cJSON *o, const char *key, int32_t *out) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key), *x;
    int64_t n = 0;
    cJSON_ArrayForEach(x, a) out[n++] = (int32_t)x->valueint;
    return a ? n : -1;
}

/* Every line of `when` against the store; returns the lines seen. check(l, h, line) adds method-specific asserts. */
static int check_lines(FILE *f, kvb_ctx *c, const char *when, void (*check)(kvb_ctx *, const cJSON *)) {
    char *line = NULL;
    size_t cap = 0;
    int seen = 0;
    int32_t want[CTX], got[CTX];
    rewind(f);
    while (getline(&line, &cap, f) > 0) {
        cJSON *o = cJSON_Parse(line);
        CU_ASSERT_FATAL(o != NULL);
        const cJSON *w = cJSON_GetObjectItemCaseSensitive(o, "when");
        if (!w) { /* the header */
            CU_ASSERT(cJSON_GetObjectItemCaseSensitive(o, "n_prompt")->valueint == N_PROMPT);
            CU_ASSERT(list(o, "prompt_ids", got) == N_PROMPT && got[1] == 38);
        } else if (!strcmp(w->valuestring, when)) {
            int l = cJSON_GetObjectItemCaseSensitive(o, "layer")->valueint, h = cJSON_GetObjectItemCaseSensitive(o, "kv_head")->valueint;
            int64_t n = list(o, "positions", got), ns = store_positions(c, l, h, want);
            CU_ASSERT(n == ns && cJSON_GetObjectItemCaseSensitive(o, "n")->valueint == n);
            CU_ASSERT(n == ns && !memcmp(got, want, (size_t)n * sizeof *got));
            kvc_view v = kvc_head_view(c->kv, l, h);
            CU_ASSERT(list(o, "host", got) == (v.tier == KVB_TIER_HOST ? n : 0));
            if (check) check(c, o);
            seen++;
        }
        cJSON_Delete(o);
    }
    free(line);
    return seen;
}

static void streaming_check(kvb_ctx *c, const cJSON *o) {
    (void)c;
    int32_t got[CTX];
    int64_t n = list(o, "positions", got);
    const char *when = cJSON_GetObjectItemCaseSensitive(o, "when")->valuestring;
    int64_t end = strcmp(when, "end") ? N_PROMPT : N_PROMPT + 3; /* 3 decode steps */
    /* 30% of 200; while decoding it evicts down to 60 before each token joins, so 61 after a step */
    CU_ASSERT(n == (end > N_PROMPT ? 61 : 60));
    for (int64_t i = 0; i < n && i < 4; i++) CU_ASSERT(got[i] == i);
    for (int64_t i = 4; i < n; i++) CU_ASSERT(got[i] == end - (n - i));
}

static void test_streamingllm_lines_are_the_store_and_its_known_set(void) {
    FILE *f = tmpfile();
    kvb_kept *k;
    kvb_ctx *c = run("streamingllm", "30%", "sinks=4", 3, &k, f);
    CU_ASSERT(check_lines(f, c, "end", streaming_check) == L * NKV);
    fclose(f);
    kvb_kept_free(k, c);
    kvb_ctx_free(c);
}

static void test_snapkv_prefill_lines_are_the_store(void) {
    FILE *f = tmpfile();
    kvb_kept *k;
    kvb_ctx *c = run("snapkv", "25%", "window=16", 0, &k, f);
    CU_ASSERT(check_lines(f, c, "prefill", NULL) == L * NKV);
    fclose(f);
    kvb_kept_free(k, c);
    kvb_ctx_free(c);
}

/* OmniKV offloading: sparse layers' KV on the host ("host" = all of it), the attended list = what the last step's
 * selection read (the budget's share, a subset of the kept positions), dense layers attend everything. */
static void omnikv_check(kvb_ctx *c, const cJSON *o) {
    int32_t kept[CTX], att[CTX];
    int64_t n = list(o, "positions", kept), na = list(o, "attended", att);
    CU_ASSERT_FATAL(na > 0);
    int l = cJSON_GetObjectItemCaseSensitive(o, "layer")->valueint, h = cJSON_GetObjectItemCaseSensitive(o, "kv_head")->valueint;
    kvc_view v = kvc_head_view(c->kv, l, h);
    if (v.tier == KVB_TIER_DEVICE) CU_ASSERT(na == n && !memcmp(att, kept, (size_t)n * sizeof *att));
    if (v.tier == KVB_TIER_HOST) CU_ASSERT(na < n);
    for (int64_t i = 0, j = 0; i < na; i++) { /* attended within kept (both ascending) */
        while (j < n && kept[j] < att[i]) j++;
        CU_ASSERT(j < n && kept[j] == att[i]);
    }
}

static void test_omnikv_attended_is_the_selection(void) {
    FILE *f = tmpfile();
    kvb_kept *k;
    kvb_ctx *c = run("omnikv", "70%", "layers=1,offload=1", 2, &k, f);
    CU_ASSERT(check_lines(f, c, "end", omnikv_check) == L * NKV);
    int host = 0;
    for (int l = 0; l < L; l++) host += kvc_head_view(c->kv, l, 0).tier == KVB_TIER_HOST;
    CU_ASSERT(host > 0); /* the test saw offloaded layers */
    fclose(f);
    kvb_kept_free(k, c);
    kvb_ctx_free(c);
}

static int setup(void) {
    if (!mkdtemp(dir)) return -1;
    snprintf(model_path, sizeof model_path, "%s/tiny.gguf", dir);
    setenv("KVB_PROFILE_DIR", dir, 1);
    gw_random r = {7, 0.5f, NULL};
    gw_tiny t = {"llama", L, E, NH, NKV, FF, V, CTX, 0, NULL, gw_random_tensor, &r};
    int rc = gw_write_tiny(&t, model_path);
    free(r.buf);
    char err[256];
    snprintf(hybrid_path, sizeof hybrid_path, "%s/gemma3-deep.gguf", dir);
    if (rc || util_arch_model_write(&util_gemma3_deep, hybrid_path, NULL, NULL)) return -1;
    return !(model = kvb_model_load(model_path, err, sizeof err)) || !(hybrid = kvb_model_load(hybrid_path, err, sizeof err))
               ? -1
               : 0;
}

static int teardown(void) {
    kvb_model_free(model);
    kvb_model_free(hybrid);
    unlink(model_path);
    unlink(hybrid_path);
    rmdir(dir);
    return 0;
}

/* The hybrid model: SnapKV at 50% and OmniKV at 90% on the global layers, 3 decode steps; every local layer's line
 * is its window (the last W positions of the prompt, then of the prompt and the decoded tokens), attended = kept. */
static void hybrid_run(const char *method, const char *budget, const char *opts, int *local_lines) {
    char err[512];
    const kvb_config *cfg = &hybrid->cfg;
    kvb_ctx_params p = kvb_ctx_default_params();
    p.n_ctx = CTX, p.n_threads = 2, p.n_batch = 64;
    kvb_ctx *c = kvb_ctx_create(hybrid, &p, err, sizeof err);
    CU_ASSERT_FATAL(c != NULL);
    kvb_budget b;
    CU_ASSERT_FATAL(kvb_budget_parse(budget, &b, err, sizeof err) == 0);
    kvb_opts o = {0};
    if (opts) CU_ASSERT_FATAL(kvb_opts_add(&o, opts, err, sizeof err) == 0);
    kvb_method *m = kvb_method_create(method, c, &b, &o, err, sizeof err);
    if (!m) fprintf(stderr, "\n  %s: %s\n", method, err);
    CU_ASSERT_FATAL(m != NULL);
    kvb_kept *k = kvb_kept_attach(c);
    int32_t ids[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++) ids[i] = (int32_t)(3 + (i * 37) % (cfg->n_vocab - 3));
    CU_ASSERT_FATAL(kvb_method_prefill(m, c, ids, N_PROMPT, err, sizeof err) == 0);
    FILE *f = tmpfile();
    CU_ASSERT_FATAL(kvb_kept_write(k, c, "prefill", f, err, sizeof err) == 0);
    for (int t = 0; t < 3; t++) {
        int32_t tok = (int32_t)(5 + t);
        CU_ASSERT_FATAL(kvb_forward(c, &tok, 1, err, sizeof err) == 0);
    }
    CU_ASSERT_FATAL(kvb_kept_write(k, c, "end", f, err, sizeof err) == 0);
    rewind(f);
    char *line = NULL;
    size_t cap = 0;
    int32_t got[CTX], att[CTX];
    while (getline(&line, &cap, f) > 0) {
        cJSON *o = cJSON_Parse(line);
        CU_ASSERT_FATAL(o != NULL);
        const int l = cJSON_GetObjectItemCaseSensitive(o, "layer")->valueint;
        const cJSON *w = cJSON_GetObjectItemCaseSensitive(o, "window");
        const int end = !strcmp(cJSON_GetObjectItemCaseSensitive(o, "when")->valuestring, "end");
        CU_ASSERT((w != NULL) == (kvb_layer_window(cfg, l) != 0));
        if (w) {
            const int W = kvb_layer_window(cfg, l), last = end ? N_PROMPT + 3 : N_PROMPT;
            CU_ASSERT(w->valueint == W);
            int64_t n = list(o, "positions", got);
            CU_ASSERT_FATAL(n == W);
            for (int i = 0; i < W; i++) CU_ASSERT(got[i] == last - W + i);
            if (end) {
                int64_t na = list(o, "attended", att);
                CU_ASSERT(na == W && !memcmp(att, got, (size_t)W * sizeof *att));
            }
            (*local_lines)++;
        }
        cJSON_Delete(o);
    }
    free(line);
    fclose(f);
    kvb_method_free(m, c);
    kvb_kept_free(k, c);
    kvb_ctx_free(c);
}

static void test_local_layers_keep_and_attend_their_window(void) {
    int local_lines = 0, n_local = 0;
    for (int l = 0; l < hybrid->cfg.n_layer; l++) n_local += kvb_layer_window(&hybrid->cfg, l) != 0;
    CU_ASSERT_FATAL(n_local > 0 && kvb_layer_window(&hybrid->cfg, 0) < N_PROMPT); /* windows shorter than the prompt */
    hybrid_run("snapkv", "50%", NULL, &local_lines);
    hybrid_run("omnikv", "90%", "offload=1", &local_lines); /* its floor at 200 tokens: 79% (gemma3-deep) */
    CU_ASSERT(local_lines == 2 * 2 * n_local * hybrid->cfg.n_head_kv); /* 2 methods x prefill and end */
}

int main(void) {
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("kept positions", setup, teardown);
    CU_add_test(s, "streamingllm: lines = store = sinks + recent", test_streamingllm_lines_are_the_store_and_its_known_set);
    CU_add_test(s, "snapkv: prefill lines = store", test_snapkv_prefill_lines_are_the_store);
    CU_add_test(s, "omnikv offload: host and attended lists", test_omnikv_attended_is_the_selection);
    CU_add_test(s, "local layers keep and attend their window", test_local_layers_keep_and_attend_their_window);
    return util_run_suites();
}
