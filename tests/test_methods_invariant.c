/* test_methods_invariant.c — every method at budget 100% is full attention: on the real default model its
 * greedy continuation equals full's token for token, on 3 prompts of 1100 tokens (prose, code, non-Latin text), with the KV on and off the host
 * tier (OmniKV offload=1/0). Also checks that each method's measured device KV matches its claim
 * (kvb_method_verify) and, at 100%, is the whole KV. As in `kvbench run`, one exact prefill per prompt is
 * shared (forked and adopted) by the methods that may share one; Round Attention prefills itself. */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util_common.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "methods/method.h"

#define N_GEN 16
#define MAX_PROMPT 1100
#define N_PROMPTS 3 /* prose; code and digits; non-Latin text */

static kvb_model *model;
static int32_t *prompts[N_PROMPTS];
static int prompt_n[N_PROMPTS];
static const char *prompt_files[N_PROMPTS][2] = {
    {"prose_4000.txt", NULL}, {"code_python.py.txt", "digits.txt"}, {"unicode.txt", "prose_300.txt"},
};

/* One exact prefill per prompt, recording what any method here adopts (observation window, H2O's scores). */
enum { SHARE_WINDOW = 32 };
static kvb_ctx *base[N_PROMPTS];
static kvb_share *share[N_PROMPTS];

static int prefill_shared(int p, char *err, size_t err_len) {
    kvb_ctx_params cp = kvb_ctx_default_params();
    cp.n_ctx = prompt_n[p] + N_GEN + 8;
    if (!(base[p] = kvb_ctx_create(model, &cp, err, err_len))) return -1;
    if (!(share[p] = kvb_share_create(base[p], SHARE_WINDOW, 1, err, err_len))) return -1;
    return kvb_forward(base[p], prompts[p], prompt_n[p], err, err_len);
}

/* Greedy continuation of prompt p under a method (opts "k=v,..." or NULL), and the device share of the full
 * KV it holds at the end. */
static int run(const char *method, const char *opts, int p, int32_t *out, double *device_frac) {
    char err[512];
    kvb_budget b = {KVB_BUDGET_FRACTION, 1.0, 0};
    kvb_opts o = {0};
    kvb_method_needs nd;
    if (opts && kvb_opts_add(&o, opts, err, sizeof err)) return fprintf(stderr, "\n  %s\n", err), -1;
    if (kvb_method_needs_of(method, &o, &nd, err, sizeof err)) return fprintf(stderr, "\n  %s\n", err), -1;
    if (!nd.shares_prefill && strcmp(nd.name, "round")) return fprintf(stderr, "\n  %s: neither shared nor own prefill\n", method), -1;
    if (nd.obs_window > SHARE_WINDOW) return fprintf(stderr, "\n  %s: window over %d\n", method, SHARE_WINDOW), -1;
    if (nd.shares_prefill && !base[p] && prefill_shared(p, err, sizeof err)) return fprintf(stderr, "\n  prefill: %s\n", err), -1;
    kvb_ctx *c = NULL;
    if (nd.shares_prefill) {
        c = kvb_ctx_fork(base[p], nd.obs_window, err, sizeof err);
    } else {
        kvb_ctx_params cp = kvb_ctx_default_params();
        cp.n_ctx = prompt_n[p] + N_GEN + 8;
        c = kvb_ctx_create(model, &cp, err, sizeof err);
    }
    if (!c) return fprintf(stderr, "\n  ctx: %s\n", err), -1;
    kvb_method *m = kvb_method_create(method, c, &b, &o, err, sizeof err);
    int rc = -1;
    if (!m) { fprintf(stderr, "\n  %s: %s\n", method, err); goto done; }
    if (nd.shares_prefill ? kvb_method_adopt(m, c, share[p], err, sizeof err)
                          : kvb_method_prefill(m, c, prompts[p], prompt_n[p], err, sizeof err)) {
        fprintf(stderr, "\n  %s: %s\n", method, err);
        goto done;
    }
    for (int i = 0; i < N_GEN; i++) {
        out[i] = sampler_argmax(c->logits, model->cfg.n_vocab);
        if (i + 1 < N_GEN && kvb_forward(c, &out[i], 1, err, sizeof err)) { fprintf(stderr, "\n  %s: %s\n", method, err); goto done; }
    }
    if (kvb_method_verify(m, c, 0, err, sizeof err)) { fprintf(stderr, "\n  %s\n", err); goto done; }
    kvb_kv_usage u;
    kvb_method_usage(m, c, &u);
    *device_frac = u.device_frac;
    rc = 0;
done:
    kvb_method_free(m, c);
    kvb_ctx_free(c);
    return rc;
}

static int32_t full_out[N_PROMPTS][N_GEN];
static int have_full[N_PROMPTS];

/* At 100% a method holds the whole KV on the device: the measured share is 1 (packed copies of selected tokens
 * and offloaded layers included), the share full attention holds. */
static void check_device_share(const char *method, const char *opts, int p, double device_frac) {
    int whole = device_frac >= 0.999 && device_frac <= 1.001;
    CU_ASSERT(whole);
    if (!whole) fprintf(stderr, "\n  %s %s prompt %d holds %.4f of full on the device at 100%%\n", method, opts ? opts : "", p, device_frac);
}

static void check_method(const char *method, const char *opts) {
    for (int p = 0; p < N_PROMPTS; p++) {
        int32_t *ref = full_out[p], got[N_GEN];
        double frac;
        if (!have_full[p]) {
            CU_ASSERT_FATAL(run("full", NULL, p, ref, &frac) == 0);
            check_device_share("full", NULL, p, frac);
            have_full[p] = 1;
        }
        CU_ASSERT_FATAL(run(method, opts, p, got, &frac) == 0);
        check_device_share(method, opts, p, frac);
        int same = !memcmp(ref, got, sizeof got);
        if (!same) {
            int i = 0;
            while (ref[i] == got[i]) i++;
            fprintf(stderr, "\n  %s %s prompt %d: differs from full at token %d (%d vs %d)\n", method, opts ? opts : "", p,
                    i, got[i], ref[i]);
        }
        CU_ASSERT(same);
    }
}

static void test_streamingllm(void) { check_method("streamingllm", NULL); }
static void test_h2o(void) { check_method("h2o", NULL); }
static void test_snapkv(void) { check_method("snapkv", NULL); }
static void test_omnikv_offload(void) { check_method("omnikv", "offload=1"); }
static void test_omnikv_no_offload(void) { check_method("omnikv", "offload=0,selector=uniform"); }
static void test_round(void) { check_method("round", "lw=8,chunk=512"); }
static void test_pod(void) { check_method("pod", "block=3"); }
static void test_tova(void) { check_method("tova", NULL); }
static void test_knorm(void) { check_method("knorm", NULL); }
static void test_quest(void) { check_method("quest", NULL); }
static void test_kivi(void) { check_method("kivi", "bits=16"); }
static void test_pyramidkv(void) { check_method("pyramidkv", NULL); }
static void test_adakv(void) { check_method("adakv", NULL); }

static int load_prompts(void) {
    char err[512];
    for (int p = 0; p < N_PROMPTS; p++) {
        char *text = NULL;
        size_t total = 0;
        for (int k = 0; k < 2 && prompt_files[p][k]; k++) {
            char path[256];
            snprintf(path, sizeof path, "tests/fixtures/prompts/%s", prompt_files[p][k]);
            size_t len;
            char *t = util_read_file(path, &len);
            if (!t) return -1;
            text = realloc(text, total + len + 2);
            memcpy(text + total, t, len);
            total += len;
            text[total++] = '\n';
            text[total] = 0;
            free(t);
        }
        int n = 0;
        if (tok_encode(model->tok, text, total, 1, 0, &prompts[p], &n, err, sizeof err)) return -1;
        free(text);
        prompt_n[p] = n < MAX_PROMPT ? n : MAX_PROMPT;
    }
    return 0;
}

int main(void) {
    char path[1024], err[512];
    if (!util_default_model(path, sizeof path)) {
        fprintf(stderr, "default model missing: run scripts/fetch-model.sh\n");
        return 1;
    }
    model = kvb_model_load(path, err, sizeof err);
    if (!model || load_prompts()) {
        fprintf(stderr, "setup failed: %s\n", err);
        return 1;
    }
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("methods at 100% equal full", NULL, NULL);
    CU_add_test(s, "streamingllm", test_streamingllm);
    CU_add_test(s, "h2o", test_h2o);
    CU_add_test(s, "snapkv", test_snapkv);
    CU_add_test(s, "omnikv offload=1", test_omnikv_offload);
    CU_add_test(s, "omnikv offload=0 uniform selector", test_omnikv_no_offload);
    CU_add_test(s, "round", test_round);
    CU_add_test(s, "pod", test_pod);
    CU_add_test(s, "tova", test_tova);
    CU_add_test(s, "knorm", test_knorm);
    CU_add_test(s, "quest", test_quest);
    CU_add_test(s, "kivi bits=16", test_kivi);
    CU_add_test(s, "pyramidkv", test_pyramidkv);
    CU_add_test(s, "adakv", test_adakv);
    int rc = util_run_suites();
    for (int p = 0; p < N_PROMPTS; p++) {
        kvb_share_free(share[p], base[p]);
        kvb_ctx_free(base[p]);
        free(prompts[p]);
    }
    kvb_model_free(model);
    return rc;
}
