/* test_cuda_model.c — every method on the default model runs on CUDA as on the CPU: for 5 prompts, each
 * method (budget 30%) generates 32 greedy tokens on the CPU backend; the CUDA backend is then teacher-forced
 * with the same tokens under the same method. At each step the CUDA logits must pick the same token, or, where
 * they do not, the CPU's own top-2 margin at that step must be within twice the step's max |Δ logit| (a near
 * tie that rounding can flip), and at least MIN_AGREE of the steps must agree.
 *
 * The logits differ by rounding, not by method: the CPU quantizes every activation vector to 8 bits (ggml's
 * Q8 scheme) against Q4_1 weights, the GPU multiplies f16 weights by f16/f32 activations. For methods whose
 * visible set depends only on positions (full, streamingllm) the max |Δ logit| must stay within LOGIT_BOUND.
 * Every registered method runs (the registry's list). Methods that select by scores may select a different token where two
 * scores are within rounding of each other, after which the two contexts legitimately differ: for them the
 * max |Δ| is printed, not bounded. Prints per method: steps agreeing, max |Δ|, each differing step.
 *
 * Each method runs on both backends on two paths, CUDA held to the CPU on the same path by the same rule: with its
 * own prefill (kvb_method_prefill), and on the path `kvbench bench --method` and `kvbench run` take
 * (benchmarks/shared_prefill.h): the prompt prefilled once on a context recording what the method needs
 * (kvb_share_create), forked with the observation window it reads, and the method adopting that prefill
 * (kvb_method_adopt), on two of the prompts (prose and C code).
 * KVB_CPU_REF_DIR, when set, keeps each CPU run's tokens and logits in that folder, and a later run of this test reads
 * them back where the test binary, the model file, the method, the path and the prompt are the same (a sha256 of all
 * of them names the file). gpu-check runs the test once per kernel set: the CPU side is most of its time and the
 * same each time.
 *
 * Without a GPU the suite prints one line and passes. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "util_common.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "methods/method.h"
#include "methods/profile.h"
#include "base/sha256.h"

#define N_GEN 32
#define N_PROMPT 5
#define LOGIT_BOUND 2.0
#define MIN_AGREE 0.85

static kvb_model *model;
static int32_t *prompts[N_PROMPT];
static int prompt_n[N_PROMPT];
static const char *prompt_files[N_PROMPT] = {"prose_4000.txt", "prose_2000.txt", "code_c.txt", "code_python.py.txt",
                                             "digits.txt"};

static char model_sha[65], self_sha[65]; /* the model file's and this binary's (KVB_CPU_REF_DIR only) */
static const char *ref_dir;
static int refs_read, refs_written;

typedef struct {
    int agree, steps;
    double max_d;
} tally;

/* Run one method on one backend. ref_tokens NULL: greedy, writing tokens[] and logits[]; otherwise teacher-forced,
 * comparing against ref logits. adopt: the method adopts a shared prefill (bench's and run's path) instead of
 * prefilling itself. */
static int run(const char *backend, const char *method, int adopt, int p, int32_t *tokens, float *logits,
               const float *ref, tally *t) {
    char err[512];
    const int V = model->cfg.n_vocab;
    kvb_ctx_params cp = kvb_ctx_default_params();
    cp.backend = backend;
    cp.n_ctx = prompt_n[p] + N_GEN + 8;
    kvb_ctx *base = NULL, *c = NULL;
    kvb_share *share = NULL;
    kvb_method *m = NULL;
    int rc = -1;
    kvb_budget b;
    /* 30%; OmniKV on a shallow model (gpu-check's trimmed copy) needs more: its dense layers alone are half of 4 */
    const int shallow = model->cfg.n_layer < 18;
    kvb_budget_parse(!strcmp(method, "full") ? "full" : shallow && !strcmp(method, "omnikv") ? "60%" : "30%", &b, err,
                     sizeof err);
    kvb_opts o = {0};
    /* pinned parameters (the quick suite's), so the test needs no calibration profile */
    if (!strcmp(method, "omnikv")) { /* the default model's filter layers; a shallower model (gpu-check's trimmed
                                        copy) gets layer 0 alone */
        char layers[64];
        const int nl = model->cfg.n_layer;
        if (nl >= 18) snprintf(layers, sizeof layers, "layers=2;8;17");
        else snprintf(layers, sizeof layers, "layers=0");
        kvb_opts_add(&o, layers, err, sizeof err);
    }
    if (!strcmp(method, "round")) {
        char lw[64];
        snprintf(lw, sizeof lw, "lw=%d,chunk=512", model->cfg.n_layer >= 16 ? 8 : model->cfg.n_layer / 2);
        kvb_opts_add(&o, lw, err, sizeof err);
    }
    if (!strcmp(method, "pod")) kvb_opts_add(&o, "block=3", err, sizeof err);
    /* Q-Filters and DuoAttention read their calibrated section where the model's profile has it (the default model
     * after the quickstart), else their window fallbacks (gpu-check's trimmed copy has no profile): the same device
     * ops either way, only where the directions or scores come from differs */
    if (!strcmp(method, "qfilter") && kvb_profile_has(model, "qfilter", err, sizeof err) != 1)
        kvb_opts_add(&o, "filters=window", err, sizeof err);
    if (!strcmp(method, "duo") && kvb_profile_has(model, "duo", err, sizeof err) != 1)
        kvb_opts_add(&o, "split=window", err, sizeof err);
    if (!strcmp(method, "kvzap")) kvb_opts_add(&o, "scorer=random", err, sizeof err); /* no checkpoint for it here */
    if (adopt) { /* one prefill recording what the method reads, then its own fork (cli/cmd_bench_methods.c) */
        kvb_method_needs nd;
        if (kvb_method_needs_of(method, &o, &nd, err, sizeof err) ||
            !(base = kvb_ctx_create(model, &cp, err, sizeof err)) ||
            !(share = kvb_share_for(base, &nd, err, sizeof err)) ||
            kvb_forward(base, prompts[p], prompt_n[p], err, sizeof err) ||
            !(c = kvb_ctx_fork(base, nd.obs_window, err, sizeof err))) {
            fprintf(stderr, "\n  %s %s shared prefill: %s\n", backend, method, err);
            goto done;
        }
    } else if (!(c = kvb_ctx_create(model, &cp, err, sizeof err))) {
        fprintf(stderr, "\n  %s ctx: %s\n", backend, err);
        goto done;
    }
    m = kvb_method_create(method, c, &b, &o, err, sizeof err);
    if (!m) { fprintf(stderr, "\n  %s: %s\n", method, err); goto done; }
    if (adopt ? kvb_method_adopt(m, c, share, err, sizeof err)
              : kvb_method_prefill(m, c, prompts[p], prompt_n[p], err, sizeof err)) {
        fprintf(stderr, "\n  %s %s %s: %s\n", backend, method, adopt ? "adopting the shared prefill" : "prefill", err);
        goto done;
    }
    for (int i = 0; i < N_GEN; i++) {
        if (!ref) {
            tokens[i] = sampler_argmax(c->logits, V);
            memcpy(logits + (size_t)i * V, c->logits, (size_t)V * sizeof(float));
        } else {
            const float *r = ref + (size_t)i * V;
            double d = 0;
            for (int j = 0; j < V; j++) {
                double e = fabs((double)c->logits[j] - r[j]);
                if (e > d) d = e;
            }
            if (d > t->max_d) t->max_d = d;
            int got = sampler_argmax(c->logits, V);
            t->steps++;
            if (got == tokens[i]) {
                t->agree++;
            } else {
                float top = r[tokens[i]], second = -INFINITY;
                for (int j = 0; j < V; j++)
                    if (j != tokens[i] && r[j] > second) second = r[j];
                fprintf(stderr, "\n  %s%s prompt %d step %d: cuda picks %d, cpu %d (cpu margin %.3f, step max |d| %.3f)",
                        method, adopt ? " (adopted)" : "", p, i, got, tokens[i], top - second, d);
                CU_ASSERT(top - second <= 2 * d);
            }
        }
        if (i + 1 < N_GEN && kvb_forward(c, &tokens[i], 1, err, sizeof err)) {
            fprintf(stderr, "\n  %s %s: %s\n", backend, method, err);
            goto done;
        }
    }
    rc = 0;
done:
    kvb_method_free(m, c);
    kvb_ctx_free(c); /* the fork before its base: it uses the base's backend */
    kvb_share_free(share, base);
    kvb_ctx_free(base);
    return rc;
}

/* The CPU run of (method, adopt, p): read from KVB_CPU_REF_DIR where an earlier run of this binary on this model
 * wrote it, else run (and write it there). A file that does not read back whole is run again. */
enum { REF_MAGIC = 0x4b425246 }; /* "KBRF" */
static int cpu_run(const char *method, int adopt, int p, int32_t *tokens, float *logits) {
    const int V = model->cfg.n_vocab;
    if (!ref_dir) return run("cpu", method, adopt, p, tokens, logits, NULL, NULL);
    char hex[65], path[1200], tmp[1300];
    const char ad[2] = {(char)('0' + adopt), 0}, pp[2] = {(char)('0' + p), 0};
    const void *parts[6] = {self_sha, model_sha, method, ad, pp, prompts[p]};
    const size_t lens[6] = {64, 64, strlen(method), 1, 1, (size_t)prompt_n[p] * sizeof(int32_t)};
    if (kvb_sha256(parts, lens, 6, NULL, hex)) return run("cpu", method, adopt, p, tokens, logits, NULL, NULL);
    snprintf(path, sizeof path, "%s/%s.ref", ref_dir, hex);
    const size_t n_logits = (size_t)N_GEN * V;
    FILE *f = fopen(path, "rb");
    if (f) {
        int32_t head[3];
        int ok = fread(head, sizeof head, 1, f) == 1 && head[0] == REF_MAGIC && head[1] == N_GEN && head[2] == V &&
                 fread(tokens, sizeof *tokens, N_GEN, f) == N_GEN && fread(logits, sizeof *logits, n_logits, f) == n_logits &&
                 fgetc(f) == EOF;
        fclose(f);
        if (ok) {
            refs_read++;
            return 0;
        }
    }
    if (run("cpu", method, adopt, p, tokens, logits, NULL, NULL)) return -1;
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    const int32_t head[3] = {REF_MAGIC, N_GEN, V};
    f = fopen(tmp, "wb");
    int ok = f && fwrite(head, sizeof head, 1, f) == 1 && fwrite(tokens, sizeof *tokens, N_GEN, f) == N_GEN &&
             fwrite(logits, sizeof *logits, n_logits, f) == n_logits;
    if (f) ok &= fclose(f) == 0;
    if (ok && rename(tmp, path) == 0) refs_written++;
    else {
        remove(tmp); /* a full disk costs the next run its reuse, never this run its reference */
        fprintf(stderr, "\n  KVB_CPU_REF_DIR: cannot write %s", path);
    }
    return 0;
}

static void check_method(const char *method, int bounded) {
    const int V = model->cfg.n_vocab;
    float *logits = malloc((size_t)N_GEN * V * sizeof(float));
    CU_ASSERT_FATAL(logits != NULL);
    tally t[2] = {{0, 0, 0}, {0, 0, 0}}; /* own prefill, adopted */
    for (int p = 0; p < N_PROMPT; p++)
        for (int adopt = 0; adopt < 2; adopt++) { /* each path against the CPU on the same path (Round Attention
                                                     adopting one prompt keeps it as one round: not its own rounds) */
            if (adopt && p != 0 && p != 2) continue; /* adopted: prose and C code (64 steps) */
            int32_t tokens[N_GEN];
            CU_ASSERT_FATAL(cpu_run(method, adopt, p, tokens, logits) == 0);
            CU_ASSERT_FATAL(run("cuda", method, adopt, p, tokens, NULL, logits, &t[adopt]) == 0);
        }
    for (int adopt = 0; adopt < 2; adopt++) {
        printf("\n    %-12s %-9s greedy steps agreeing %d/%d, max |logit cpu - cuda| %.3f", adopt ? "" : method,
               adopt ? "adopted" : "own", t[adopt].agree, t[adopt].steps, t[adopt].max_d);
        if (bounded) printf(" (bound %.1f)", LOGIT_BOUND);
        CU_ASSERT(!bounded || t[adopt].max_d <= LOGIT_BOUND);
        CU_ASSERT(t[adopt].agree >= MIN_AGREE * t[adopt].steps);
    }
    free(logits);
}

/* Every registered method, one CUnit test each (the registry's order): a trampoline per slot reads its name. The
 * max |Δ logit| is bounded for the methods whose visible set depends only on positions. */
enum { MAX_METHODS = 32 };
static const char *method_at[MAX_METHODS];
static void check_slot(int i) {
    static const char *const positional[] = {"full", "streamingllm"};
    int bounded = 0;
    for (size_t k = 0; k < sizeof positional / sizeof *positional; k++) bounded |= !strcmp(method_at[i], positional[k]);
    check_method(method_at[i], bounded);
}
#define SLOT(i) static void slot##i(void) { check_slot(i); }
SLOT(0) SLOT(1) SLOT(2) SLOT(3) SLOT(4) SLOT(5) SLOT(6) SLOT(7) SLOT(8) SLOT(9) SLOT(10) SLOT(11) SLOT(12) SLOT(13)
SLOT(14) SLOT(15) SLOT(16) SLOT(17) SLOT(18) SLOT(19) SLOT(20) SLOT(21) SLOT(22) SLOT(23) SLOT(24) SLOT(25)
SLOT(26) SLOT(27) SLOT(28) SLOT(29) SLOT(30) SLOT(31)
#undef SLOT
static void (*const slots[MAX_METHODS])(void) = {
    slot0,  slot1,  slot2,  slot3,  slot4,  slot5,  slot6,  slot7,  slot8,  slot9,  slot10, slot11, slot12, slot13, slot14, slot15,
    slot16, slot17, slot18, slot19, slot20, slot21, slot22, slot23, slot24, slot25, slot26, slot27, slot28, slot29, slot30, slot31};

int main(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        printf("test_cuda_model: no CUDA GPU (%s), skipped\n", e != cudaSuccess ? cudaGetErrorString(e) : "no devices");
        return 0;
    }
    char path[1024], err[512];
    if (!util_default_model(path, sizeof path)) {
        fprintf(stderr, "default model missing: run scripts/fetch-model.sh\n");
        return 1;
    }
    model = kvb_model_load(path, err, sizeof err);
    if (!model) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    for (int p = 0; p < N_PROMPT; p++) {
        char file[256];
        snprintf(file, sizeof file, "tests/fixtures/prompts/%s", prompt_files[p]);
        size_t len;
        char *text = util_read_file(file, &len);
        if (!text || tok_encode(model->tok, text, len, 1, 0, &prompts[p], &prompt_n[p], err, sizeof err)) {
            fprintf(stderr, "cannot tokenize %s\n", file);
            return 1;
        }
        free(text);
    }
    ref_dir = getenv("KVB_CPU_REF_DIR");
    if (ref_dir && !*ref_dir) ref_dir = NULL;
    if (ref_dir && (kvb_sha256_file(path, model_sha, err, sizeof err) ||
                    kvb_sha256_file("/proc/self/exe", self_sha, err, sizeof err))) {
        fprintf(stderr, "KVB_CPU_REF_DIR: %s\n", err);
        return 1;
    }
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("every method on CUDA as on the CPU, own prefill (5 prompts) and adopted (2) x 32 tokens, budget 30%", NULL, NULL);
    const int n_methods = kvb_method_count();
    if (n_methods > MAX_METHODS) {
        fprintf(stderr, "test_cuda_model: %d methods registered, %d test slots: raise MAX_METHODS\n", n_methods, MAX_METHODS);
        return 1;
    }
    for (int i = 0; i < n_methods; i++) {
        method_at[i] = kvb_method_at(i)->name;
        CU_add_test(s, method_at[i], slots[i]);
    }
    int rc = util_run_suites();
    if (ref_dir) printf("KVB_CPU_REF_DIR %s: %d CPU runs read back, %d written\n", ref_dir, refs_read, refs_written);
    for (int p = 0; p < N_PROMPT; p++) free(prompts[p]);
    kvb_model_free(model);
    return rc;
}
