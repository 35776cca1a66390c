/* test_methods_invariant.c — every method at budget 100% is full attention: on the real default model its
 * greedy continuation equals full's token for token, on 3 prompts of 1100 tokens (prose, code, non-Latin text), with the KV on and off the host
 * tier (OmniKV offload=1/0). Also checks that each method's measured device KV matches its claim
 * (kvb_method_verify) and, at 100%, is the whole KV. Every registered method runs (the registry's list). As in `kvbench run`, one exact prefill per prompt is
 * shared (forked and adopted) by the methods that may share one; Round Attention prefills itself.
 *
 * `test_methods_invariant MODEL.gguf` runs the same on another model (CTest: the seeded gemma3 and qwen3 models
 * that `test_arch_llamacpp --write` makes, queries wider than n_embd, gemma3's sliding windows shorter than the
 * prompts; gemma3-deep: Gemma-3-270M's 18 layers, three of them global), and there also runs every method at 30% (on
 * the gemma3 models 50% and 80% too), where kvb_method_verify must accept the kept cache and a method that imposes
 * its budget must hold that share of the cache the model really holds. */
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
    if (!(share[p] = kvb_share_create(base[p], SHARE_WINDOW, 1, err, err_len)) ||
        kvb_share_run_scorer(share[p], "random", err, err_len))
        return -1;
    return kvb_forward(base[p], prompts[p], prompt_n[p], err, err_len);
}

/* Greedy continuation of prompt p under a method (opts "k=v,..." or NULL) at budget frac, and the device share
 * of the full KV it holds at the end. */
static char last_err[512]; /* the failing run's message */
static int last_imposes;    /* the last run's method imposes its budget on memory */

static int run_at(const char *method, const char *opts, int p, double frac, int32_t *out, double *device_frac) {
    char *err = last_err;
    const size_t errsz = sizeof last_err;
    err[0] = 0;
    kvb_budget b = {KVB_BUDGET_FRACTION, frac, 0};
    kvb_opts o = {0};
    kvb_method_needs nd;
    if (opts && kvb_opts_add(&o, opts, err, errsz)) return fprintf(stderr, "\n  %s\n", err), -1;
    if (kvb_method_needs_of(method, &o, &nd, err, errsz)) return fprintf(stderr, "\n  %s\n", err), -1;
    if (!nd.shares_prefill && strcmp(nd.name, "round")) return fprintf(stderr, "\n  %s: neither shared nor own prefill\n", method), -1;
    if (nd.obs_window > SHARE_WINDOW) return fprintf(stderr, "\n  %s: window over %d\n", method, SHARE_WINDOW), -1;
    if (nd.shares_prefill && !base[p] && prefill_shared(p, err, errsz)) return fprintf(stderr, "\n  prefill: %s\n", err), -1;
    kvb_ctx *c = NULL;
    if (nd.shares_prefill) {
        c = kvb_ctx_fork(base[p], nd.obs_window, err, errsz);
    } else {
        kvb_ctx_params cp = kvb_ctx_default_params();
        cp.n_ctx = prompt_n[p] + N_GEN + 8;
        c = kvb_ctx_create(model, &cp, err, errsz);
    }
    if (!c) return fprintf(stderr, "\n  ctx: %s\n", err), -1;
    kvb_method *m = kvb_method_create(method, c, &b, &o, err, errsz);
    int rc = -1;
    if (!m) { fprintf(stderr, "\n  %s: %s\n", method, err); goto done; }
    if (nd.shares_prefill ? kvb_method_adopt(m, c, share[p], err, errsz)
                          : kvb_method_prefill(m, c, prompts[p], prompt_n[p], err, errsz)) {
        fprintf(stderr, "\n  %s: %s\n", method, err);
        goto done;
    }
    for (int i = 0; i < N_GEN; i++) {
        out[i] = sampler_argmax(c->logits, model->cfg.n_vocab);
        if (i + 1 < N_GEN && kvb_forward(c, &out[i], 1, err, errsz)) { fprintf(stderr, "\n  %s: %s\n", method, err); goto done; }
    }
    if (kvb_method_verify(m, c, 0, err, errsz)) { fprintf(stderr, "\n  %s\n", err); goto done; }
    kvb_kv_usage u;
    kvb_method_usage(m, c, &u);
    *device_frac = u.device_frac;
    last_imposes = m->imposes_budget;
    if (model->cfg.n_swa > 0 && !strcmp(method, "full")) { /* a local layer holds only its window */
        int64_t tokens = 0;
        for (int l = 0; l < model->cfg.n_layer; l++)
            tokens += model->cfg.swa_layer[l] && c->n_past > model->cfg.n_swa ? model->cfg.n_swa : c->n_past;
        CU_ASSERT_EQUAL(u.device_bytes, tokens * model->cfg.n_head_kv * kvc_slot_bytes(c->kv));
        CU_ASSERT(u.full_bytes == u.device_bytes && u.device_bytes < kvc_full_bytes_for(c->kv, c->n_past));
    }
    rc = 0;
done:
    kvb_method_free(m, c);
    kvb_ctx_free(c);
    return rc;
}

static int run(const char *method, const char *opts, int p, int32_t *out, double *device_frac) {
    return run_at(method, opts, p, 1.0, out, device_frac);
}

static int other_model; /* 1: a model named on the command line; every method also runs at 30% */

static int32_t full_out[N_PROMPTS][N_GEN];
static int have_full[N_PROMPTS];

/* At 100% a method holds the whole KV on the device: the measured share is 1 (packed copies of selected tokens
 * and offloaded layers included), the share full attention holds. */
static void check_device_share(const char *method, const char *opts, int p, double device_frac) {
    int whole = device_frac >= 0.999 && device_frac <= 1.001;
    CU_ASSERT(whole);
    if (!whole) fprintf(stderr, "\n  %s %s prompt %d holds %.4f of full on the device at 100%%\n", method, opts ? opts : "", p, device_frac);
}


static const double BUDGETS[3] = {0.3, 0.5, 0.8};

/* At budget f the run's own verification of the kept cache must pass, or the method refuses a budget under its own
 * floor by name (OmniKV's full-attention layers on a 2-layer model). On a hybrid model the budget is of the cache the
 * model holds (windows trimmed): a method that imposes it holds f of it (+-2%) after the prompt and 15 decoded
 * tokens; OmniKV (offloading), whose floor there is its full global layers and the windows, must run and hold 80%
 * where the model has the three global layers its roles need (filter, full, sparse). */
static void check_budget(const char *method, const char *opts, int p, double f) {
    int32_t got[N_GEN];
    double frac = 0;
    int ok = run_at(method, opts, p, f, got, &frac) == 0, refused = 0;
    if (ok && last_imposes && model->cfg.n_swa > 0 && (frac < f - 0.02 || frac > f + 0.02)) {
        fprintf(stderr, "\n  %s at %.0f%%: holds %.2f%% of full's cache", method, 100 * f, 100 * frac);
        ok = 0;
    }
    if (!ok && strstr(last_err, "below the share")) {
        fprintf(stderr, "\n  %s at %.0f%%: refused, under its floor on this model", method, 100 * f);
        ok = refused = 1;
    }
    if (!ok) fprintf(stderr, "\n  %s %s prompt %d: fails at %.0f%%\n", method, opts ? opts : "", p, 100 * f);
    CU_ASSERT(ok);
    int n_global = 0;
    for (int l = 0; l < model->cfg.n_layer; l++) n_global += !kvb_layer_window(&model->cfg, l);
    const int offloads = !opts || !strstr(opts, "offload=0"); /* offload=0 narrows attention, keeps the cache */
    if (!strcmp(method, "omnikv") && offloads && model->cfg.n_swa > 0 && n_global >= 3 && f == 0.8) {
        CU_ASSERT(!refused && last_imposes);
        if (ok && !refused) fprintf(stderr, "\n  omnikv at 80%%: holds %.2f%% of the model's cache", 100 * frac);
    }
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
        if (run(method, opts, p, got, &frac)) {
            /* Round Attention refuses a model with one global layer by name (no deep layer to select for) */
            const int refused = model->cfg.n_swa > 0 && strstr(last_err, "too few global layers");
            if (refused) fprintf(stderr, "\n  %s refuses this model's single global layer (expected)", method);
            CU_ASSERT_FATAL(refused);
            return;
        }
        check_device_share(method, opts, p, frac);
        int same = !memcmp(ref, got, sizeof got);
        if (!same) {
            int i = 0;
            while (ref[i] == got[i]) i++;
            fprintf(stderr, "\n  %s %s prompt %d: differs from full at token %d (%d vs %d)\n", method, opts ? opts : "", p,
                    i, got[i], ref[i]);
        }
        CU_ASSERT(same);
        if (other_model) /* 30% (and 50%, 80% on a hybrid model): the run's own verification of the kept cache */
            for (int bi = 0; bi < (model->cfg.n_swa > 0 ? 3 : 1); bi++) check_budget(method, opts, p, BUDGETS[bi]);
    }
}

/* The cases: every registered method but the baseline (the registry's list, so a new method is tested here
 * without an edit), with the options a method needs at 100% or pinned so no calibration profile is read; a
 * method with several rows runs once per row. */
static const struct {
    const char *method, *opts, *small; /* small: the options on another (2-18 layer) model; %d: small_lw */
} PINNED[] = {
    {"omnikv", "offload=1", "offload=1"}, /* KV on and off the host tier; the default layers (global ones) */
    {"omnikv", "offload=0,selector=uniform", "offload=0,selector=uniform"},
    {"round", "lw=8,chunk=512", "lw=%d,chunk=512"}, {"pod", "block=3", "block=%d"}, /* %d: small_block */
    {"kivi", "bits=16", "bits=16"}, /* at 100% only the 16-bit store keeps full's values */
    {"qfilter", "filters=window", "filters=window"}, {"duo", "split=window", "split=window"}, /* no profile read */
    {"kvzap", "scorer=random", "scorer=random"}, /* the share runs the same scorer */
};
static char small_opts[sizeof PINNED / sizeof *PINNED][64];

/* %d in PINNED's small options: half the layers; on a hybrid model Round's watershed must be a global layer with a
 * global layer after it: one more than the first global layer (with one global layer only, Round refuses by name,
 * too few global layers) */
static int small_lw(const kvb_config *cfg) {
    if (cfg->n_swa <= 0) return cfg->n_layer / 2 > 0 ? cfg->n_layer / 2 : 1;
    int l = 0;
    while (l < cfg->n_layer - 1 && kvb_layer_window(cfg, l)) l++;
    return l + 1;
}
/* %d in PoD's small options: blocks of two global layers, so a layer reads its base's scores (gemma3-deep's
 * global layers 5, 11, 17 give {5, 11} and {17}; qwen3's two layers one block), or one on a model with a single
 * global layer (gemma3), where block counts global layers and cannot be more */
static int small_block(const kvb_config *cfg) {
    int n_global = 0;
    for (int l = 0; l < cfg->n_layer; l++) n_global += !kvb_layer_window(cfg, l);
    return n_global >= 2 ? 2 : 1;
}
enum { MAX_CASES = 48 };
static struct {
    const char *method, *opts;
    char label[160];
} cases[MAX_CASES];
static int n_cases;

static void run_case(int i) { check_method(cases[i].method, cases[i].opts); }
#define CASE(i) static void case##i(void) { run_case(i); }
CASE(0) CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8) CASE(9) CASE(10) CASE(11) CASE(12) CASE(13)
CASE(14) CASE(15) CASE(16) CASE(17) CASE(18) CASE(19) CASE(20) CASE(21) CASE(22) CASE(23) CASE(24) CASE(25) CASE(26)
CASE(27) CASE(28) CASE(29) CASE(30) CASE(31) CASE(32) CASE(33) CASE(34) CASE(35) CASE(36) CASE(37) CASE(38) CASE(39)
CASE(40) CASE(41) CASE(42) CASE(43) CASE(44) CASE(45) CASE(46) CASE(47)
#undef CASE
static void (*const case_fn[MAX_CASES])(void) = {
    case0,  case1,  case2,  case3,  case4,  case5,  case6,  case7,  case8,  case9,  case10, case11, case12, case13, case14, case15,
    case16, case17, case18, case19, case20, case21, case22, case23, case24, case25, case26, case27, case28, case29, case30, case31,
    case32, case33, case34, case35, case36, case37, case38, case39, case40, case41, case42, case43, case44, case45, case46, case47};

/* 0, or -1 when the registry holds more cases than the slots */
static int add_case(const char *method, const char *opts) {
    if (n_cases == MAX_CASES) return -1;
    cases[n_cases].method = method;
    cases[n_cases].opts = opts;
    snprintf(cases[n_cases].label, sizeof cases[n_cases].label, "%.63s%s%.90s", method, opts ? " " : "", opts ? opts : "");
    n_cases++;
    return 0;
}

static int collect_cases(void) {
    for (int i = 0; i < kvb_method_count(); i++) {
        const kvb_method_def *mi = kvb_method_at(i);
        if (mi->traits & KVB_NO_BUDGET) continue; /* full attention: the reference itself */
        int pinned = 0;
        for (size_t k = 0; k < sizeof PINNED / sizeof *PINNED; k++)
            if (!strcmp(PINNED[k].method, mi->name)) {
                pinned = 1;
                const char *o = PINNED[k].opts;
                if (other_model) {
                    snprintf(small_opts[k], sizeof small_opts[k], PINNED[k].small,
                             strcmp(mi->name, "pod") ? small_lw(&model->cfg) : small_block(&model->cfg));
                    o = small_opts[k];
                }
                if (add_case(mi->name, o)) return -1;
            }
        if (!pinned && add_case(mi->name, NULL)) return -1;
    }
    return 0;
}

static int load_prompts(void) {
    char err[512];
    for (int p = 0; p < N_PROMPTS; p++) {
        char *text = NULL;
        size_t total = 0;
        for (int k = 0; k < 2 && prompt_files[p][k]; k++) {
            char path[256];
            snprintf(path, sizeof path, "tests/fixtures/prompts/%s", prompt_files[p][k]);
            size_t len;
            char *t = util_read_fixture(path, &len);
            if (!t) return free(text), -1;
            text = realloc(text, total + len + 2);
            memcpy(text + total, t, len);
            total += len;
            text[total++] = '\n';
            text[total] = 0;
            free(t);
        }
        int n = 0;
        if (tok_encode(model->tok, text, total, 1, 0, &prompts[p], &n, err, sizeof err)) {
            fprintf(stderr, "tokenizing prompt %d: %s\n", p, err);
            return free(text), -1;
        }
        free(text);
        prompt_n[p] = n < MAX_PROMPT ? n : MAX_PROMPT;
    }
    return 0;
}

int main(int argc, char **argv) {
    char path[1024], err[512];
    if (argc == 2) {
        snprintf(path, sizeof path, "%s", argv[1]);
        other_model = 1;
    } else if (!util_default_model(path, sizeof path)) {
        fprintf(stderr, "default model missing: run scripts/fetch-model.sh\n");
        return 1;
    }
    model = kvb_model_load(path, err, sizeof err);
    if (!model) {
        fprintf(stderr, "setup failed: %s\n", err);
        return 1;
    }
    if (load_prompts()) return 1;
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("methods at 100% equal full", NULL, NULL);
    if (collect_cases()) {
        fprintf(stderr, "test_methods_invariant: more registered cases than %d slots: raise MAX_CASES\n", MAX_CASES);
        return 1;
    }
    for (int i = 0; i < n_cases; i++) CU_add_test(s, cases[i].label, case_fn[i]);
    int rc = util_run_suites();
    for (int p = 0; p < N_PROMPTS; p++) {
        kvb_share_free(share[p], base[p]);
        kvb_ctx_free(base[p]);
        free(prompts[p]);
    }
    kvb_model_free(model);
    return rc;
}
