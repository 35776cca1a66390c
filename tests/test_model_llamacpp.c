/* test_model_llamacpp.c — the engine against llama.cpp on the real default model.
 *
 * tests/fixtures/llamacpp_ref.json was written by scripts/llamacpp_ref.py (llama.cpp, f32 KV cache) for
 * every prompt in tests/fixtures/prompts/. For each prompt this test checks: the prompt token ids are
 * identical; the last-position logits (top-40 ids and every 192nd id) agree within LOGIT_TOL = 2e-2
 * (issue 2's bound); the 64-token greedy continuation is identical, except that it may part where
 * llama.cpp's own top-2 margin is within 2 x LOGIT_TOL (a tie that differences inside the bound could
 * flip) — and must not part anywhere else.
 *
 * With an f32 KV cache the CPU backend follows llama.cpp's float order op by op (kernels/cpu/ggml_compat.h;
 * scripts/llamacpp_diff.py shows it per op), so on the machine that made the fixtures the figures printed
 * per prompt are 0 (the fixture's 5-decimal rounding aside). The bound is needed at all because a
 * llama.cpp build for another SIMD level, e.g. AVX-512, sums in another order: its own logits then move
 * by 0.3-0.7 (scripts/llamacpp_ref.py records which CPU made the fixtures). */
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

#define LOGIT_TOL 2e-2
#define TIE_MARGIN (2 * LOGIT_TOL)

static kvb_model *model;
static char model_path[1024];
static cJSON *ref;

static void check_prompt(const cJSON *rec) {
    const char *name = cJSON_GetObjectItem(rec, "name")->valuestring;
    char path[512], err[512];
    snprintf(path, sizeof path, "tests/fixtures/prompts/%s", name);
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
    p.n_ctx = n_ids + 80;
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
    CU_ASSERT(max_d <= LOGIT_TOL);

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
    CU_ASSERT(diverged < 0 || cJSON_GetArrayItem(margins, diverged)->valuedouble <= TIE_MARGIN);
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

int main(void) {
    char err[512];
    int have_model = util_default_model(model_path, sizeof model_path);
    char *json = util_read_file("tests/fixtures/llamacpp_ref.json", NULL);
    if (!json) {
        fprintf(stderr, "tests/fixtures/llamacpp_ref.json missing (run from the project root)\n");
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
    CU_add_test(s, "every prompt matches llama.cpp: ids, logits within 2e-2, greedy tokens but at near ties",
                test_every_prompt_matches_llamacpp_ids_logits_and_greedy_tokens);
    int rc = util_run_suites();
    kvb_model_free(model);
    cJSON_Delete(ref);
    return rc;
}
