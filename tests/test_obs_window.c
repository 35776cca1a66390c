/* test_obs_window.c — the end of prefill stops the observation window of every method that does not read it after
 * the prefill (methods/method.h KVB_DECODE_WINDOW): each registered method (the registry's list) at 30% on a seeded
 * random-weight model, prefilled and decoded greedily twice, once as any run does and once with the window kept
 * recording (kvb_ctx_params.keep_window). The logits must be bit for bit the same at every step, so a method that
 * read the window in decode without declaring it would fail here; and the window must be stopped (no rows, nothing
 * recorded in decode, at least one device copy a layer fewer per decode step) exactly for the methods that keep one
 * and do not declare the trait. */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util_common.h"
#include "util_method.h"
#include "engine/sampler.h"

enum { L = 16, NH = 4, NKV = 2, HD = 16, E = NH * HD, FF = 64, V = 256, CTX = 1024, N = 300, STEPS = 24 };

static uint64_t rng = 0x0b5e7ull;

/* Options a method needs on this model (no calibration profile), and those that make the two readers read the
 * window in the decode steps here: DecodingPress cutting every 4 steps below the budget, OmniKV's filter layers
 * scoring with the window's rows (the default `last` selector takes the step's own probabilities instead). */
static const struct { const char *method, *opts; } PINNED[] = {
    {"round", "lw=8,chunk=64"}, {"pod", "block=3"}, {"qfilter", "filters=window"}, {"duo", "split=window"}, {"kvzap", "scorer=random"},
    {"decoding", "interval=4,target=60"}, {"kivi", "group=16"}, {"omnikv", "selector=uniform"},
};

static kvb_ctx *ctx(int keep_window) {
    char err[256];
    kvb_ctx_params p = kvb_ctx_default_params();
    p.n_ctx = N + STEPS + 8;
    p.n_threads = 2;
    p.keep_window = keep_window;
    kvb_ctx *c = kvb_ctx_create(util_tiny, &p, err, sizeof err);
    if (!c) fprintf(stderr, "\n  ctx: %s\n", err);
    CU_ASSERT_FATAL(c != NULL);
    return c;
}

static void check(const kvb_method_def *d, const int32_t *ids) {
    const char *opts = NULL;
    for (size_t k = 0; k < sizeof PINNED / sizeof *PINNED; k++)
        if (!strcmp(PINNED[k].method, d->name)) opts = PINNED[k].opts;
    const char *budget = d->traits & KVB_NO_BUDGET ? "full" : "30%";
    kvb_ctx *a = ctx(0), *b = ctx(1);
    kvb_method *ma = util_make_method(d->name, a, budget, opts), *mb = util_make_method(d->name, b, budget, opts);
    char err[512];
    int rc = kvb_method_prefill(ma, a, ids, N, err, sizeof err);
    if (rc) fprintf(stderr, "\n  %s: %s\n", d->name, err);
    CU_ASSERT_FATAL(rc == 0);
    rc = kvb_method_prefill(mb, b, ids, N, err, sizeof err);
    CU_ASSERT_FATAL(rc == 0);
    const int window = a->obs_q != NULL, reads = !!(d->traits & KVB_DECODE_WINDOW);
    /* stopped exactly when the method keeps a window it does not read after the prefill; kept live on demand */
    CU_ASSERT(a->obs_stopped == (window && !reads));
    CU_ASSERT(!a->obs_stopped || a->obs_n == 0);
    CU_ASSERT(!b->obs_stopped);
    /* each context's device copies, counted around its own forward passes: the CUDA backend is one per device,
     * shared by both contexts, so its counter holds both */
    int64_t d2d[2] = {0, 0};
    int same = 1, step = 0;
    for (; step < STEPS && same; step++) {
        same = !memcmp(a->logits, b->logits, (size_t)V * sizeof(float));
        int32_t ta = sampler_argmax(a->logits, V), tb = sampler_argmax(b->logits, V);
        for (int k = 0; k < 2; k++) {
            kvb_ctx *c = k ? b : a;
            const int64_t before = c->be->traffic.n[KVB_COPY_D2D];
            rc = kvb_forward(c, k ? &tb : &ta, 1, err, sizeof err);
            d2d[k] += c->be->traffic.n[KVB_COPY_D2D] - before;
            if (rc) fprintf(stderr, "\n  %s, window %s, decode step %d: %s", d->name, k ? "kept" : "as run", step, err);
            CU_ASSERT_FATAL(rc == 0);
        }
    }
    same = same && !memcmp(a->logits, b->logits, (size_t)V * sizeof(float));
    if (!same) fprintf(stderr, "\n  %s: decode differs with the window kept, step %d", d->name, step);
    CU_ASSERT(same);
    CU_ASSERT(!a->obs_stopped || a->obs_n == 0); /* nothing recorded in decode */
    /* the device copies the decode steps made: a stopped window's shifts are gone (at least one copy a layer a step),
     * a kept one's are the same */
    const double per_step_a = (double)d2d[0] / step, per_step_b = (double)d2d[1] / step;
    CU_ASSERT(a->obs_stopped ? per_step_a + L <= per_step_b : per_step_a == per_step_b);
    if (window)
        printf("(%s: window %s, %.0f device copies a decode step, %.0f with it kept) ", d->name,
               a->obs_stopped ? "stopped" : "kept", per_step_a, per_step_b);
    kvb_method_free(ma, a);
    kvb_method_free(mb, b);
    kvb_ctx_free(a);
    kvb_ctx_free(b);
}

static void test_every_method_decodes_the_same_with_its_window_stopped(void) {
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = (int32_t)(1 + (uint32_t)(i * 2654435761u >> 9) % (V - 1));
    int stopped = 0, kept = 0;
    for (int i = 0; i < kvb_method_count(); i++) {
        const kvb_method_def *d = kvb_method_at(i);
        check(d, ids);
        kept += !!(d->traits & KVB_DECODE_WINDOW);
        stopped += !(d->traits & KVB_DECODE_WINDOW);
    }
    CU_ASSERT(kept >= 2 && stopped >= 20); /* OmniKV and DecodingPress read it; SnapKV and the others do not */
}

static int setup(void) {
    const util_tiny_shape shape = {"obswin", L, E, NH, NKV, FF, V, CTX};
    return util_tiny_setup(&shape, &rng);
}

static int teardown(void) { return util_tiny_teardown(); }

int main(void) {
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("the observation window after the end of prefill", setup, teardown);
    CU_add_test(s, "every method decodes bit for bit the same with its window stopped, stopped unless it reads it",
                test_every_method_decodes_the_same_with_its_window_stopped);
    return util_run_suites();
}
