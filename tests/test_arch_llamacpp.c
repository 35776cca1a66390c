/* test_arch_llamacpp.c — each architecture kvbench implements, token for token against llama.cpp.
 *
 * Small seeded random-weight GGUFs of every variant (Llama 3.1's rope_freqs, linear and YaRN RoPE scaling, qwen3,
 * gemma3 with its local and global layers, llama with a sliding window) are written here, from the seed, by the
 * same code that wrote the files llama.cpp ran to make tests/fixtures/arch_ref.json (scripts/arch_ref.py calls
 * `test_arch_llamacpp --write DIR`): CI needs neither Python nor llama.cpp. Per model and prompt the fixture holds
 * llama.cpp's prompt ids (the byte vocabulary's, through its tokenizer), the last-position logits (all of them:
 * the vocabulary is 259) and a greedy continuation with its top-2 margins; the engine must give the same ids,
 * logits within the bound, and the same greedy tokens except at a step where llama.cpp's own margin is within
 * twice the bound (a tie a rounding difference may flip).
 *
 * The bound (1e-3, in logits of spread ~2-5) is the f32 rounding llama.cpp and kvbench do not share: F32 weights
 * take llama.cpp's f32 GEMM (kvbench sums a dot product in another order: ~1e-6 relative per op), and on a local
 * layer past the window llama.cpp sums the keys of its ring of cells in ring order. Any error in the math (a
 * wrong rope divisor, a missed norm, a window one token off) moves logits by 1e-1 or more and greedy tokens
 * with them: the check in test_any_architecture_change_moves_the_logits_far_past_the_bound shows the margin.
 *
 * The llama-with-window model: llama.cpp ignores `llama.attention.sliding_window` (its llama graph has no
 * window), so its fixture prompts stay within the window, where both agree; past the window kvbench's mask is
 * the one gemma3's local layers are checked with. */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/model.h"
#include "engine/sampler.h"
#include "util_arch_model.h"
#include "util_common.h"
#include "util_gguf_writer.h"

static const char *FIXTURE = "tests/fixtures/arch_ref.json";
static double logit_tol = 1e-3;

/* ---- the models ---- */

typedef util_arch_model arch_model;

static const arch_model MODELS[] = {
    {"llama3-rope-freqs", "llama", 2, 64, 4, 2, 16, 128, 500000.0f, NULL, 0, 0, 1, 0, 11},
    {"llama-linear", "llama", 2, 64, 4, 2, 16, 128, 10000.0f, "linear", 4.0f, 0, 0, 0, 12},
    {"qwen2-yarn", "qwen2", 2, 64, 4, 2, 16, 128, 10000.0f, "yarn", 4.0f, 64, 0, 0, 13},
    {"qwen3", "qwen3", 2, 64, 4, 2, 32, 128, 1000000.0f, NULL, 0, 0, 0, 0, 14},
    {"gemma3", "gemma3", 6, 64, 4, 1, 32, 128, 1000000.0f, NULL, 0, 0, 0, 24, 15},
    {"llama-swa", "llama", 2, 64, 4, 2, 16, 128, 10000.0f, NULL, 0, 0, 0, 48, 16},
};
enum { N_MODELS = sizeof MODELS / sizeof *MODELS, N_CTX = 4096 };


static int write_model(const arch_model *M, const char *path) { return util_arch_model_write(M, path, NULL, NULL); }

/* ---- the checks ---- */

static cJSON *ref;
static char tmpdir[256];

static const arch_model *model_named(const char *name) {
    for (int i = 0; i < N_MODELS; i++)
        if (!strcmp(MODELS[i].name, name)) return &MODELS[i];
    return NULL;
}

static kvb_model *load(const arch_model *M) {
    char path[512], err[512];
    snprintf(path, sizeof path, "%s/%s.gguf", tmpdir, M->name);
    if (write_model(M, path)) return NULL;
    kvb_model *m = kvb_model_load(path, err, sizeof err);
    if (!m) fprintf(stderr, "\n  %s: %s\n", M->name, err);
    return m;
}

/* Runs ids through m (f32 KV: llama.cpp's exact order where it has one) and returns the context. */
static kvb_ctx *run(kvb_model *m, const int32_t *ids, int n, int extra) {
    char err[512];
    kvb_ctx_params p = kvb_ctx_default_params();
    p.kv_dtype = KVB_F32;
    p.n_ctx = n + extra + 8;
    p.n_batch = 64; /* several chunks on the long prompts */
    kvb_ctx *c = kvb_ctx_create(m, &p, err, sizeof err);
    if (!c) fprintf(stderr, "\n  %s\n", err);
    if (c && kvb_forward(c, ids, n, err, sizeof err)) {
        fprintf(stderr, "\n  %s\n", err);
        kvb_ctx_free(c);
        return NULL;
    }
    return c;
}

static int32_t *json_ids(const cJSON *a, int *n) {
    *n = cJSON_GetArraySize(a);
    int32_t *ids = malloc((size_t)(*n > 0 ? *n : 1) * sizeof *ids);
    for (int i = 0; i < *n; i++) ids[i] = cJSON_GetArrayItem(a, i)->valueint;
    return ids;
}

static void check_case(kvb_model *m, const cJSON *rec, const char *model_name) {
    const char *text = cJSON_GetObjectItem(rec, "text")->valuestring;
    int n_ref;
    int32_t *rids = json_ids(cJSON_GetObjectItem(rec, "prompt_ids"), &n_ref);
    int32_t *ids = NULL;
    int n_ids = 0;
    char err[256];
    CU_ASSERT_FATAL(tok_encode(m->tok, text, strlen(text), 1, 1, &ids, &n_ids, err, sizeof err) == 0);
    int same_ids = n_ids == n_ref && !memcmp(ids, rids, (size_t)n_ids * sizeof *ids);
    CU_ASSERT(same_ids);
    const cJSON *greedy = cJSON_GetObjectItem(rec, "greedy"), *margins = cJSON_GetObjectItem(rec, "margins");
    const int n_g = cJSON_GetArraySize(greedy);
    kvb_ctx *c = run(m, rids, n_ref, n_g);
    CU_ASSERT_FATAL(c != NULL);
    const cJSON *logits = cJSON_GetObjectItem(rec, "logits");
    CU_ASSERT_FATAL(cJSON_GetArraySize(logits) == m->cfg.n_vocab);
    double max_d = 0;
    for (int i = 0; i < m->cfg.n_vocab; i++) {
        double d = fabs(c->logits[i] - cJSON_GetArrayItem(logits, i)->valuedouble);
        if (d > max_d) max_d = d;
    }
    CU_ASSERT(max_d <= logit_tol);
    int diverged = -1;
    for (int s = 0; s < n_g; s++) {
        int32_t next = sampler_argmax(c->logits, m->cfg.n_vocab);
        if (next != cJSON_GetArrayItem(greedy, s)->valueint) {
            diverged = s;
            break;
        }
        if (s + 1 < n_g) CU_ASSERT_FATAL(kvb_forward(c, &next, 1, err, sizeof err) == 0);
    }
    printf("\n  %-18s %4d tokens  ids %s  max|dlogit| %.2e  greedy %s (%d)", model_name, n_ref, same_ids ? "same" : "DIFFER",
           max_d, diverged < 0 ? "same" : "DIVERGED", diverged < 0 ? n_g : diverged);
    CU_ASSERT(diverged < 0 || cJSON_GetArrayItem(margins, diverged)->valuedouble <= 2 * logit_tol);
    kvb_ctx_free(c);
    free(ids);
    free(rids);
}

static void test_every_architecture_matches_llamacpp_ids_logits_and_greedy_tokens(void) {
    const cJSON *models = cJSON_GetObjectItem(ref, "models"), *mrec;
    CU_ASSERT_FATAL(cJSON_GetArraySize(models) == N_MODELS);
    cJSON_ArrayForEach(mrec, models) {
        const char *name = cJSON_GetObjectItem(mrec, "name")->valuestring;
        const arch_model *M = model_named(name);
        CU_ASSERT_FATAL(M != NULL);
        kvb_model *m = load(M);
        CU_ASSERT_FATAL(m != NULL);
        const cJSON *rec;
        cJSON_ArrayForEach(rec, cJSON_GetObjectItem(mrec, "prompts")) check_case(m, rec, name);
        kvb_model_free(m);
    }
    printf("\n");
}

/* The bound is far below what a change of the math does: each variant with its distinguishing feature removed
 * (rope_freqs ignored, no scaling, no Q/K norm, no window...) moves the logits by much more than the bound. */
static void test_any_architecture_change_moves_the_logits_far_past_the_bound(void) {
    const cJSON *models = cJSON_GetObjectItem(ref, "models"), *mrec;
    cJSON_ArrayForEach(mrec, models) {
        const arch_model *M = model_named(cJSON_GetObjectItem(mrec, "name")->valuestring);
        const cJSON *rec = cJSON_GetArrayItem(cJSON_GetObjectItem(mrec, "prompts"),
                                              cJSON_GetArraySize(cJSON_GetObjectItem(mrec, "prompts")) - 1);
        kvb_model *m = load(M);
        CU_ASSERT_FATAL(m != NULL);
        /* the feature removed, as a loader that ignored it would */
        if (m->rope_freqs) m->rope_freqs = NULL;
        else if (m->cfg.rope_scaled) m->cfg.rope = (kvb_rope_params){m->cfg.rope.freq_base, 1, 0, 1, 32, 1, N_CTX, NULL}, m->cfg.rope_scaled = 0;
        else if (m->cfg.n_swa) m->cfg.n_swa = 0;
        else if (m->cfg.qk_norm) m->cfg.qk_norm = 0;
        int n;
        int32_t *ids = json_ids(cJSON_GetObjectItem(rec, "prompt_ids"), &n);
        kvb_ctx *c = run(m, ids, n, 0);
        CU_ASSERT_FATAL(c != NULL);
        const cJSON *logits = cJSON_GetObjectItem(rec, "logits");
        double max_d = 0;
        for (int i = 0; i < m->cfg.n_vocab; i++) {
            double d = fabs(c->logits[i] - cJSON_GetArrayItem(logits, i)->valuedouble);
            if (d > max_d) max_d = d;
        }
        printf("\n  %-18s without its feature: max|dlogit| %.2e", M->name, max_d);
        if (strcmp(M->name, "llama-swa")) CU_ASSERT(max_d > 100 * logit_tol); /* its prompts stay in the window */
        kvb_ctx_free(c);
        free(ids);
        kvb_model_free(m);
    }
    printf("\n");
}

/* A GGUF key or tensor that changes the math and is not implemented fails the load with one line naming it. */
static void test_unimplemented_keys_and_tensors_are_refused_by_name(void) {
    static const struct {
        const char *key, *value, *want;
    } cases[] = {
        {"llama.rope.scaling.type", "longrope", "llama.rope.scaling.type 'longrope' is not implemented"},
        {"llama.attn_logit_softcapping", NULL, "key 'llama.attn_logit_softcapping' is not implemented"},
        {"llama.attention.sliding_window_pattern", NULL, "key 'llama.attention.sliding_window_pattern' is not implemented"},
        {"gemma3.final_logit_softcapping", NULL, "logit soft-capping is not implemented"},
        {"blk.0.attn_sinks.weight", NULL, "tensor 'blk.0.attn_sinks.weight' is not implemented"},
        {"qwen3.rope.scaling.yarn_log_multiplier", NULL, "key 'qwen3.rope.scaling.yarn_log_multiplier' is not implemented"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *k = cases[i].key;
        const arch_model *M = !strncmp(k, "gemma3", 6) ? model_named("gemma3")
                              : !strncmp(k, "qwen3", 5) ? model_named("qwen3") : model_named("llama3-rope-freqs");
        char path[512], err[512];
        snprintf(path, sizeof path, "%s/refused.gguf", tmpdir);
        CU_ASSERT_FATAL(util_arch_model_write(M, path, k, cases[i].value) == 0);
        kvb_model *m = kvb_model_load(path, err, sizeof err);
        CU_ASSERT(m == NULL);
        CU_ASSERT(strstr(err, cases[i].want) != NULL);
        CU_ASSERT(strchr(err, '\n') == NULL);
        if (!strstr(err, cases[i].want)) fprintf(stderr, "\n  %s: got '%s'\n", k, err);
        kvb_model_free(m);
    }
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--write")) { /* scripts/arch_ref.py: the files llama.cpp runs */
        for (int i = 0; i < N_MODELS; i++) {
            char path[1024];
            snprintf(path, sizeof path, "%s/%s.gguf", argv[2], MODELS[i].name);
            if (write_model(&MODELS[i], path)) return 1;
            printf("%s\n", path);
        }
        char path[1024]; /* for test_methods_invariant only: no fixture, its path not printed (scripts/arch_ref.py) */
        snprintf(path, sizeof path, "%s/%s.gguf", argv[2], util_gemma3_deep.name);
        if (util_arch_model_write(&util_gemma3_deep, path, NULL, NULL)) return 1;
        return 0;
    }
    if (argc > 1) logit_tol = atof(argv[1]);
    snprintf(tmpdir, sizeof tmpdir, "/tmp/kvb_arch_XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    char *json = util_read_file(FIXTURE, NULL);
    if (!json) {
        fprintf(stderr, "%s missing (run from the project root)\n", FIXTURE);
        return 1;
    }
    ref = cJSON_Parse(json);
    free(json);
    if (!ref) return 1;
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("arch_llamacpp", NULL, NULL);
    CU_add_test(s, "every architecture matches llama.cpp: ids, logits within the bound, greedy tokens",
                test_every_architecture_matches_llamacpp_ids_logits_and_greedy_tokens);
    CU_add_test(s, "removing any architecture's feature moves the logits far past the bound",
                test_any_architecture_change_moves_the_logits_far_past_the_bound);
    CU_add_test(s, "unimplemented keys and tensors are refused by name", test_unimplemented_keys_and_tensors_are_refused_by_name);
    int rc = util_run_suites();
    cJSON_Delete(ref);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd)) rc = rc ? rc : 0;
    return rc;
}
