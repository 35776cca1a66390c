/* test_host_waits.c — how often a decode step makes the host wait for the backend. On a GPU each wait (a call of
 * be->sync: kernels/backend.h) drains the stream, and the next kernel's launch then starts from an idle device: a
 * wait per layer cost TOVA and H2O a drained GPU every layer of every step (engine/model.c), and the target
 * is a decode step with no more than 15% of its time outside attention and the GEMVs. Each registered method (the
 * registry's list) at 30% on a seeded random-weight model is prefilled, then decodes greedily; the backend's sync
 * is counted around each step, and so is the step's start (be->step_begin: where a CUDA graph's recording begins, once a
 * decode step and never in a prefill). Every step waits once for its logits; a method may wait more only where the table
 * below says so and why, so a method that starts reading device data from host code every layer fails here. The
 * same binary runs on CUDA (KVB_BACKEND=cuda, scripts/gpu-check.sh), where the waits are real. */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util_common.h"
#include "util_method.h"
#include "engine/sampler.h"

enum { L = 12, NH = 4, NKV = 2, HD = 16, E = NH * HD, FF = 64, V = 256, CTX = 1024, N = 300, STEPS = 12 };

static uint64_t rng = 0x5a17ull;

/* Options a method needs on this model (no calibration profile). */
static const struct { const char *method, *opts; } PINNED[] = {
    {"round", "lw=6,chunk=64"}, {"pod", "block=3"}, {"qfilter", "filters=window"}, {"duo", "split=window"}, {"kvzap", "scorer=random"},
    {"kivi", "group=16"},
};

/* The waits a decode step may make beyond its logits' one, and why. A method not listed may make none. */
static const struct { const char *method; int extra; const char *why; } ALLOWED[] = {
    /* offload=1 (its default): each filter layer's selection comes down to gather the sparse layers' host-tier rows
     * (one filter layer on this model) */
    {"omnikv", 1, "its filter layer's selection comes down for the host-tier load"},
};

static int64_t n_syncs, n_begins;
static int (*inner_sync)(kvb_backend *be);

static int counting_sync(kvb_backend *be) {
    n_syncs++;
    return inner_sync ? inner_sync(be) : 0;
}

/* be->step_begin (kernels/backend.h: where a CUDA graph's recording starts) counted; the CPU backend has none */
static int (*inner_begin)(kvb_backend *be);
static int counting_begin(kvb_backend *be) {
    n_begins++;
    return inner_begin ? inner_begin(be) : 0;
}

/* the most waits one decode step of d made (n_steps steps) */
static int64_t most_waits(const kvb_method_def *d, const int32_t *ids, int64_t *total) {
    const char *opts = NULL;
    for (size_t k = 0; k < sizeof PINNED / sizeof *PINNED; k++)
        if (!strcmp(PINNED[k].method, d->name)) opts = PINNED[k].opts;
    kvb_ctx *c = util_tiny_ctx(KVB_F16, N + STEPS + 8);
    kvb_method *m = util_make_method(d->name, c, d->traits & KVB_NO_BUDGET ? "full" : "30%", opts);
    char err[512];
    kvb_backend *be = c->be;
    inner_begin = be->step_begin;
    be->step_begin = counting_begin;
    n_begins = 0;
    int rc = kvb_method_prefill(m, c, ids, N, err, sizeof err);
    if (rc) fprintf(stderr, "\n  %s: %s\n", d->name, err);
    CU_ASSERT_FATAL(rc == 0);
    if (n_begins) fprintf(stderr, "\n  %s: the prefill began %lld decode steps", d->name, (long long)n_begins);
    CU_ASSERT(n_begins == 0); /* a prefill is not a decode step: no recording across its chunks */
    inner_sync = be->sync;
    be->sync = counting_sync;
    int64_t most = 0;
    *total = 0;
    for (int step = 0; step < STEPS; step++) {
        int32_t t = sampler_argmax(c->logits, V);
        n_syncs = 0, n_begins = 0;
        rc = kvb_forward(c, &t, 1, err, sizeof err);
        if (rc) fprintf(stderr, "\n  %s, decode step %d: %s", d->name, step, err);
        CU_ASSERT_FATAL(rc == 0);
        if (n_begins != 1) fprintf(stderr, "\n  %s, decode step %d: began %lld times", d->name, step, (long long)n_begins);
        CU_ASSERT(n_begins == 1); /* each decode step begins once (a CUDA graph's recording), before its first op */
        most = n_syncs > most ? n_syncs : most;
        *total += n_syncs;
    }
    be->sync = inner_sync;
    be->step_begin = inner_begin;
    kvb_method_free(m, c);
    kvb_ctx_free(c);
    return most;
}

static void test_every_method_decodes_with_one_wait_a_step_unless_listed(void) {
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = (int32_t)(1 + (uint32_t)(i * 2654435761u >> 7) % (V - 1));
    for (size_t k = 0; k < sizeof ALLOWED / sizeof *ALLOWED; k++)
        CU_ASSERT(kvb_method_find(ALLOWED[k].method) != NULL); /* the table names registered methods */
    for (int i = 0; i < kvb_method_count(); i++) {
        const kvb_method_def *d = kvb_method_at(i);
        int extra = 0;
        for (size_t k = 0; k < sizeof ALLOWED / sizeof *ALLOWED; k++)
            if (!strcmp(ALLOWED[k].method, d->name)) extra = ALLOWED[k].extra;
        int64_t total;
        const int64_t most = most_waits(d, ids, &total);
        printf("(%s: %.2f waits a step, at most %lld) ", d->name, (double)total / STEPS, (long long)most);
        if (most > 1 + extra)
            fprintf(stderr, "\n  %s: a decode step waited for the backend %lld times (%d allowed: its logits%s)",
                    d->name, (long long)most, 1 + extra, extra ? " and the table's" : "");
        CU_ASSERT(most <= 1 + extra);
        CU_ASSERT(most >= 1); /* the logits' wait: the count sees the engine's syncs */
    }
}

static int failing_begin(kvb_backend *be) {
    snprintf(be->error, sizeof be->error, "cuda: graph.cu:1: cudaStreamBeginCapture: test failure");
    return -1;
}

/* A backend whose step cannot begin fails the decode step with its one line (nothing runs half recorded). */
static void test_a_step_that_cannot_begin_fails_with_the_backends_reason(void) {
    int32_t ids[16];
    for (int i = 0; i < 16; i++) ids[i] = 1 + i;
    kvb_ctx *c = util_tiny_ctx(KVB_F16, 64);
    char err[512];
    CU_ASSERT_FATAL(kvb_forward(c, ids, 16, err, sizeof err) == 0 && kvb_ctx_end_prefill(c, err, sizeof err) == 0);
    kvb_backend *be = c->be;
    int (*keep)(kvb_backend *) = be->step_begin;
    be->step_begin = failing_begin;
    int32_t t = 7;
    err[0] = 0;
    CU_ASSERT(kvb_forward(c, &t, 1, err, sizeof err) != 0);
    CU_ASSERT(strstr(err, "cudaStreamBeginCapture: test failure") != NULL);
    CU_ASSERT(c->n_past == 16); /* the step did not count */
    be->step_begin = keep;
    be->error[0] = 0;
    kvb_ctx_free(c);
}

static int setup(void) {
    const util_tiny_shape shape = {"waits", L, E, NH, NKV, FF, V, CTX};
    return util_tiny_setup(&shape, &rng);
}

static int teardown(void) { return util_tiny_teardown(); }

int main(void) {
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("host waits in a decode step", setup, teardown);
    CU_add_test(s, "every method decodes with one wait a step (its logits) unless the table says why",
                test_every_method_decodes_with_one_wait_a_step_unless_listed);
    CU_add_test(s, "a decode step that cannot begin fails with the backend's reason",
                test_a_step_that_cannot_begin_fails_with_the_backends_reason);
    return util_run_suites();
}
