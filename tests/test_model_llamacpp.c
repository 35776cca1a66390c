/* test_model_llamacpp.c — the engine against llama.cpp on a real model.
 *
 * A fixture written by scripts/llamacpp_ref.py (llama.cpp, f32 KV cache) holds, per prompt: the prompt token
 * ids, which must be identical; the last-position logits (top-40 ids and every 192nd id), which must agree
 * within the bound; and the greedy continuation, which must be identical except that it may part where
 * llama.cpp's own top-2 margin is within twice the bound (a tie that differences inside the bound could flip)
 * — and must not part anywhere else. A fixture may also list strings whose token ids alone are compared.
 *
 * Default model (tests/fixtures/llamacpp_ref.json, 64 greedy tokens): bound 2e-2 (issue 2's). With an f32 KV
 * cache the CPU backend follows llama.cpp's float order op by op (kernels/cpu/ggml_compat.h;
 * scripts/llamacpp_diff.py shows it per op), so on the machine that made the fixtures the figures printed per
 * prompt are 0 (the fixture's 5-decimal rounding aside); an AVX-512 llama.cpp sums in another order and moves
 * its own logits by 0.3-0.7 (scripts/llamacpp_ref.py records which CPU made the fixtures).
 *
 * Second model (Qwen2.5-Coder-0.5B, tests/fixtures/llamacpp_ref_qwen.json, 32 greedy tokens; CMake passes its
 * bound, 0.5): every Q5_0/Q8_0 op is bit-identical to llama.cpp's, and the Q6_K dot is byte-identical to the
 * kernel of the llama.cpp that made the fixture (scripts/ggml_dots_check.sh), yet llama.cpp's ffn_down output
 * parts from ours in the last bit from layer 0 on (scripts/llamacpp_diff.py), and 24 layers amplify that to
 * 0.22-0.46 on the logits: the bound is what is reached, not what is wanted. */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util_common.h"
#include "engine/model.h"
#include "engine/sampler.h"

/* the logit bound; a greedy continuation may part only where llama.cpp's top-2 margin is within twice it */
static double logit_tol = 2e-2;

static kvb_model *model;
static char model_path[1024];
static cJSON *ref;

static void check_prompt(const cJSON *rec) {
    const char *name = cJSON_GetObjectItem(rec, "name")->valuestring;
    char path[512], err[512];
    /* the default set names files of tests/fixtures/prompts/, the second model's set paths under tests/fixtures/ */
    snprintf(path, sizeof path, strchr(name, '/') ? "tests/fixtures/%s" : "tests/fixtures/prompts/%s", name);
    size_t len;
    char *text = util_read_file(path, &len);
    CU_ASSERT_FATAL(text != NULL);

    int32_t *ids = NULL;
    int n_ids = 0;
    CU_ASSERT_FATAL(tok_encode(model->tok, text, len, 1, 1, &ids, &n_ids, err, sizeof err) == 0);
    const cJSON *ref_ids = cJSON_GetObjectItem(rec, "prompt_ids");
    int same_ids = cJSON_GetArraySize(ref_ids) == n_ids;
    for (int i = 0; same_ids && i < n_ids; i++) same_ids = cJSON_GetArrayItem(ref_ids, i)->valueint == ids[i];
    if (!same_ids) {
        int i = 0;
        while (i < n_ids && i < cJSON_GetArraySize(ref_ids) && cJSON_GetArrayItem(ref_ids, i)->valueint == ids[i]) i++;
        fprintf(stderr, "\n  %s: prompt ids differ from llama.cpp at index %d (ours %d tokens, llama.cpp %d)\n", name,
                i, n_ids, cJSON_GetArraySize(ref_ids));
    }
    CU_ASSERT(same_ids);

    kvb_ctx_params p = kvb_ctx_default_params();
    p.kv_dtype = KVB_F32;
    p.n_ctx = n_ids + cJSON_GetObjectItem(ref, "n_greedy")->valueint + 16;
    kvb_ctx *c = kvb_ctx_create(model, &p, err, sizeof err);
    CU_ASSERT_FATAL(c != NULL);
    /* run llama.cpp's ids so the logit and greedy checks stand on their own even if tokenization differed */
    int n_ref = cJSON_GetArraySize(ref_ids);
    int32_t *rids = malloc((size_t)n_ref * sizeof *rids);
    for (int i = 0; i < n_ref; i++) rids[i] = cJSON_GetArrayItem(ref_ids, i)->valueint;
    CU_ASSERT_FATAL(kvb_forward(c, rids, n_ref, err, sizeof err) == 0);

    double max_d = 0;
    const cJSON *top_ids = cJSON_GetObjectItem(rec, "top_ids"), *top_l = cJSON_GetObjectItem(rec, "top_logits");
    for (int i = 0; i < cJSON_GetArraySize(top_ids); i++) {
        double d = fabs(c->logits[cJSON_GetArrayItem(top_ids, i)->valueint] - cJSON_GetArrayItem(top_l, i)->valuedouble);
        if (d > max_d) max_d = d;
    }
    const cJSON *samp = cJSON_GetObjectItem(rec, "sample_logits");
    int stride = cJSON_GetObjectItem(ref, "sample_stride")->valueint;
    for (int i = 0; i < cJSON_GetArraySize(samp); i++) {
        double d = fabs(c->logits[i * stride] - cJSON_GetArrayItem(samp, i)->valuedouble);
        if (d > max_d) max_d = d;
    }
    CU_ASSERT(max_d <= logit_tol);

    const cJSON *greedy = cJSON_GetObjectItem(rec, "greedy"), *margins = cJSON_GetObjectItem(rec, "margins");
    int n_g = cJSON_GetArraySize(greedy), diverged = -1;
    for (int s = 0; s < n_g; s++) {
        int32_t next = sampler_argmax(c->logits, model->cfg.n_vocab);
        if (next != cJSON_GetArrayItem(greedy, s)->valueint) {
            diverged = s;
            break;
        }
        if (s + 1 < n_g) CU_ASSERT_FATAL(kvb_forward(c, &next, 1, err, sizeof err) == 0);
    }
    printf("\n  %-20s %5d tokens  ids %s  max|dlogit| %.2e  greedy %s", name, n_ids, same_ids ? "same" : "DIFFER",
           max_d, diverged < 0 ? "same" : "DIVERGED");
    if (diverged < 0) printf(" (%d)", n_g);
    if (diverged >= 0)
        printf(" at step %d (llama.cpp top-2 margin there %.4f)", diverged,
               cJSON_GetArrayItem(margins, diverged)->valuedouble);
    CU_ASSERT(diverged < 0 || cJSON_GetArrayItem(margins, diverged)->valuedouble <= 2 * logit_tol);
    free(rids);
    kvb_ctx_free(c);
    free(ids);
    free(text);
}

static void test_every_prompt_matches_llamacpp_ids_logits_and_greedy_tokens(void) {
    UTIL_REQUIRE_FILE(model_path); /* CI always fetches it: a missing model is a failure, not a pass */
    CU_ASSERT_FATAL(model != NULL);
    const cJSON *prompts = cJSON_GetObjectItem(ref, "prompts");
    CU_ASSERT_FATAL(cJSON_GetArraySize(prompts) >= 8);
    const cJSON *rec;
    cJSON_ArrayForEach(rec, prompts) check_prompt(rec);
    printf("\n");
}

/* The fixture's tokenizer-only strings (the pre-tokenizer's corner cases): the same ids as llama.cpp. */
static void test_tokenizer_corner_cases_match_llamacpp(void) {
    UTIL_REQUIRE_FILE(model_path);
    CU_ASSERT_FATAL(model != NULL);
    const cJSON *cases = cJSON_GetObjectItem(ref, "tokenize_only"), *rec;
    int n = 0, same = 0;
    cJSON_ArrayForEach(rec, cases) {
        const char *text = cJSON_GetObjectItem(rec, "text")->valuestring;
        const cJSON *want = cJSON_GetObjectItem(rec, "ids");
        int32_t *ids = NULL;
        int n_ids = 0;
        char err[256];
        CU_ASSERT_FATAL(tok_encode(model->tok, text, strlen(text), 1, 1, &ids, &n_ids, err, sizeof err) == 0);
        int ok = n_ids == cJSON_GetArraySize(want);
        for (int i = 0; ok && i < n_ids; i++) ok = ids[i] == cJSON_GetArrayItem(want, i)->valueint;
        if (!ok) fprintf(stderr, "\n  ids differ from llama.cpp for \"%s\"", text);
        n++, same += ok;
        free(ids);
    }
    printf("\n  tokenizer: %d/%d strings with llama.cpp's ids\n", same, n);
    CU_ASSERT(same == n);
}

/* test_model_llamacpp [MODEL FIXTURE [BOUND]]: the default model against tests/fixtures/llamacpp_ref.json
 * (bound 2e-2), or a named model (kvb_model_resolve: qwen2.5-coder-0.5b) against its own fixture and bound. */
int main(int argc, char **argv) {
    char err[512];
    const char *name = argc > 2 ? argv[1] : "default";
    const char *fixture = argc > 2 ? argv[2] : "tests/fixtures/llamacpp_ref.json";
    if (argc > 3) logit_tol = atof(argv[3]);
    if (kvb_model_resolve(name, model_path, sizeof model_path, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    int have_model = access(model_path, R_OK) == 0;
    char *json = util_read_file(fixture, NULL);
    if (!json) {
        fprintf(stderr, "%s missing (run from the project root)\n", fixture);
        return 1;
    }
    ref = cJSON_Parse(json);
    free(json);
    if (!ref) return 1;
    if (have_model) {
        model = kvb_model_load(model_path, err, sizeof err);
        if (!model) {
            fprintf(stderr, "cannot load %s: %s\n", model_path, err);
            return 1;
        }
    }
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("model_llamacpp", NULL, NULL);
    CU_add_test(s, "every prompt matches llama.cpp: ids, logits within the bound, greedy tokens but at near ties",
                test_every_prompt_matches_llamacpp_ids_logits_and_greedy_tokens);
    if (cJSON_GetObjectItem(ref, "tokenize_only"))
        CU_add_test(s, "the pre-tokenizer's corner cases have llama.cpp's ids", test_tokenizer_corner_cases_match_llamacpp);
    int rc = util_run_suites();
    kvb_model_free(model);
    cJSON_Delete(ref);
    return rc;
}
