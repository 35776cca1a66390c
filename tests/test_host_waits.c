/* test_host_waits.c — how often a decode step makes the host wait for the backend. On a GPU each wait (a call of
 * be->sync: kernels/backend.h) drains the stream, and the next kernel's launch then starts from an idle device: a
 * wait per layer cost TOVA and H2O a drained GPU every layer of every step (engine/model.c), and the target
 * is a decode step with no more than 15% of its time outside attention and the GEMVs. Each registered method (the
 * registry's list) at 30% on a seeded random-weight model is prefilled, then decodes greedily; the backend's sync
 * is counted around each step. Every step waits once for its logits; a method may wait more only where the table
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
    {"round", "lw=6,chunk=64"}, {"pod", "block=3"}, {"qfilter", "filters=window"}, {"duo", "split=window"},
    {"kivi", "group=16"},
};

/* The waits a decode step may make beyond its logits' one, and why. A method not listed may make none. */
static const struct { const char *method; int extra; const char *why; } ALLOWED[] = {
    /* offload=1 (its default): each filter layer's selection comes down to gather the sparse layers' host-tier rows
     * (one filter layer on this model) */
    {"omnikv", 1, "its filter layer's selection comes down for the host-tier load"},
};

static int64_t n_syncs;
static int (*inner_sync)(kvb_backend *be);

static int counting_sync(kvb_backend *be) {
    n_syncs++;
    return inner_sync ? inner_sync(be) : 0;
}

/* the most waits one decode step of d made (n_steps steps) */
static int64_t most_waits(const kvb_method_def *d, const int32_t *ids, int64_t *total) {
    const char *opts = NULL;
    for (size_t k = 0; k < sizeof PINNED / sizeof *PINNED; k++)
        if (!strcmp(PINNED[k].method, d->name)) opts = PINNED[k].opts;
    kvb_ctx *c = util_tiny_ctx(KVB_F16, N + STEPS + 8);
    kvb_method *m = util_make_method(d->name, c, d->traits & KVB_NO_BUDGET ? "full" : "30%", opts);
    char err[512];
    int rc = kvb_method_prefill(m, c, ids, N, err, sizeof err);
    if (rc) fprintf(stderr, "\n  %s: %s\n", d->name, err);
    CU_ASSERT_FATAL(rc == 0);
    kvb_backend *be = c->be;
    inner_sync = be->sync;
    be->sync = counting_sync;
    int64_t most = 0;
    *total = 0;
    for (int step = 0; step < STEPS; step++) {
        int32_t t = sampler_argmax(c->logits, V);
        n_syncs = 0;
        rc = kvb_forward(c, &t, 1, err, sizeof err);
        if (rc) fprintf(stderr, "\n  %s, decode step %d: %s", d->name, step, err);
        CU_ASSERT_FATAL(rc == 0);
        most = n_syncs > most ? n_syncs : most;
        *total += n_syncs;
    }
    be->sync = inner_sync;
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
    return util_run_suites();
}
