/* test_layer_prefill.c — the end of prefill layer by layer (engine/model.h kvb_ctx_end_prefill_by_layer) for the
 * methods that declare it layer-local (methods/method.h KVB_LAYER_LOCAL): a prompt prefilled as one chunk and
 * ended layer by layer, right after each layer's attention, against the same prompt ended at the end of prefill (the
 * path every method takes otherwise, the reference): the same kept slots in every layer and head (their positions,
 * K and V rows, their tier) and the same packed loads (OmniKV's sparse layers), bit-identical logits after the
 * prefill, the same greedy tokens and last logits after decoding; while layer l's attention runs, the layers before
 * it hold what the reference keeps (a packed load may wait until the last layer it serves has ended), layer l the
 * whole prompt on the device and the layers after it nothing; and the KV store's measured device peak during prefill
 * is lower when the method imposes its budget (OmniKV with offload=0 keeps every layer on the device: not higher). On
 * a seeded random-weight model (16 layers: OmniKV's full layers fit 25%) and on the default model when it is present
 * (required in CI; the release build only: under the sanitizers its prefills take minutes). Every method that
 * declares the trait is checked, from the registry, and the configurations in EXTRA besides. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util_common.h"
#include "util_method.h"
#include "engine/kvcache.h"
#include "engine/tokenizer.h"

enum { L = 16, NH = 4, NKV = 2, HD = 16, E = NH * HD, FF = 64, V = 256, CTX = 1024, NEW = 16 };

static uint64_t rng = 0x1a7e5ull;

/* What the reference holds per (layer, KV head) after its end of prefill: the store's slots and their tier, the
 * method's packed load (m->vis: 0 without one). */
typedef struct {
    int64_t n, vis_n;
    kvb_tier tier;
} held;

/* While a layer-wise prefill runs: at each layer's attention, what every layer holds, against the reference's
 * (ref[layer][head]). */
typedef struct {
    const held *ref;
    const kvb_method *m;
    int64_t n_prompt;
    int calls, bad;
} watch;

static int64_t vis_n(const kvb_method *m, int l, int h) { return m->vis ? kvc_n(m->vis, l, h) : 0; }

static void on_layer(void *user, kvb_ctx *c, int layer, const kvb_src *src, int64_t n_q) {
    (void)src, (void)n_q;
    watch *w = user;
    const kvb_config *cfg = &c->model->cfg;
    w->calls++;
    for (int l = 0; l < cfg->n_layer; l++)
        for (int h = 0; h < cfg->n_head_kv; h++) {
            const held *r = &w->ref[l * cfg->n_head_kv + h];
            const int64_t n = kvc_n(c->kv, l, h), p = vis_n(w->m, l, h);
            const kvb_tier t = kvc_head_view(c->kv, l, h).tier;
            /* before: the reference's slots and tier, its packed load or none yet; this layer: the whole prompt on
             * the device; after: nothing */
            int ok = l < layer   ? n == r->n && t == r->tier && (p == r->vis_n || p == 0)
                     : l == layer ? n == w->n_prompt && t == KVB_TIER_DEVICE && p == 0
                                  : n == 0 && p == 0;
            if (!ok) {
                if (!w->bad)
                    fprintf(stderr, "\n  at layer %d's attention, layer %d head %d holds %lld (tier %d, packed %lld); the "
                                    "reference %lld (tier %d, packed %lld), the prompt %lld\n", layer, l, h, (long long)n,
                            (int)t, (long long)p, (long long)r->n, (int)r->tier, (long long)r->vis_n,
                            (long long)w->n_prompt);
                w->bad++;
            }
        }
}

/* Whether heads (l, h) of stores x and y hold the same slots: positions, K and V rows. */
static int same_head(kvc_store *x, kvc_store *y, int l, int h, int64_t row) {
    util_kv_head a = util_kv_head_copy(x, l, h), b = util_kv_head_copy(y, l, h);
    int same = a.n == b.n && !memcmp(a.pos, b.pos, (size_t)a.n * sizeof(int32_t)) && !memcmp(a.k, b.k, (size_t)(a.n * row)) &&
               !memcmp(a.v, b.v, (size_t)(a.n * row));
    util_kv_head_free(&a);
    util_kv_head_free(&b);
    return same;
}

static int32_t argmax(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* A context for the whole prompt in one forward chunk. */
static kvb_ctx *one_chunk_ctx(kvb_model *m, int64_t n) {
    char err[256];
    kvb_ctx_params p = kvb_ctx_default_params();
    p.n_ctx = (int)n + NEW + 8;
    p.n_batch = (int)n; /* default threads: every core under the sanitizers, one (KVB_THREADS) in release */
    kvb_ctx *c = kvb_ctx_create(m, &p, err, sizeof err);
    if (!c) fprintf(stderr, "\n  ctx: %s\n", err);
    CU_ASSERT_FATAL(c != NULL);
    return c;
}

/* Method `name` with options opts (NULL: none) at budget on prompt ids: the reference (end of prefill) and the
 * layer-wise end, compared. */
static void compare(kvb_model *m, const char *name, const char *opts, const char *budget, const int32_t *ids,
                    int64_t n) {
    char err[512];
    const kvb_config *cfg = &m->cfg;
    const int NL = cfg->n_layer, HK = cfg->n_head_kv;
    kvb_ctx *a = one_chunk_ctx(m, n), *b = one_chunk_ctx(m, n);
    kvb_opts none = {0};
    kvb_budget bud;
    CU_ASSERT_FATAL(kvb_budget_parse(budget, &bud, err, sizeof err) == 0);
    kvb_opts oa = none, ob = none;
    CU_ASSERT_FATAL(!opts || (kvb_opts_add(&oa, opts, err, sizeof err) == 0 &&
                              kvb_opts_add(&ob, opts, err, sizeof err) == 0));
    kvb_method *ma = kvb_method_create(name, a, &bud, &oa, err, sizeof err);
    kvb_method *mb = kvb_method_create(name, b, &bud, &ob, err, sizeof err);
    if (!ma || !mb) fprintf(stderr, "\n  %s: %s\n", name, err);
    CU_ASSERT_FATAL(ma && mb);

    /* the reference: the whole prompt in every layer, ended at the end of prefill */
    if (kvb_method_prefill(ma, a, ids, n, err, sizeof err)) fprintf(stderr, "\n  %s reference: %s\n", name, err);
    CU_ASSERT_FATAL(!a->in_prefill);
    held *ref = malloc((size_t)NL * HK * sizeof *ref);
    CU_ASSERT_FATAL(ref != NULL);
    int64_t device = 0; /* the reference's device-tier tokens, packed loads included */
    for (int l = 0; l < NL; l++)
        for (int h = 0; h < HK; h++) {
            held *r = &ref[l * HK + h];
            r->n = kvc_n(a->kv, l, h);
            r->tier = kvc_head_view(a->kv, l, h).tier;
            r->vis_n = vis_n(ma, l, h);
            device += (r->tier == KVB_TIER_DEVICE ? r->n : 0) + r->vis_n;
        }
    /* a method that imposes its budget holds less than the prompt on the device: the comparison means something */
    if (ma->imposes_budget) CU_ASSERT(device < (int64_t)NL * HK * n);

    /* layer by layer */
    watch w = {ref, mb, n, 0, 0};
    b->on_visible = on_layer;
    b->on_visible_user = &w;
    kvb_ctx_end_prefill_by_layer(b, n);
    if (kvb_method_prefill(mb, b, ids, n, err, sizeof err)) fprintf(stderr, "\n  %s layer-wise: %s\n", name, err);
    CU_ASSERT_FATAL(!b->in_prefill);
    b->on_visible = NULL;
    CU_ASSERT(w.calls == NL && w.bad == 0);

    const int64_t row = (kvc_slot_bytes(a->kv) - 2 * (int64_t)sizeof(int32_t)) / 2; /* one K (or V) row */
    int same = (ma->vis != NULL) == (mb->vis != NULL);
    for (int l = 0; l < NL && same; l++)
        for (int h = 0; h < HK; h++)
            same &= same_head(a->kv, b->kv, l, h, row) &&
                    kvc_head_view(a->kv, l, h).tier == kvc_head_view(b->kv, l, h).tier &&
                    (!ma->vis || same_head(ma->vis, mb->vis, l, h, row));
    CU_ASSERT(same);
    CU_ASSERT(memcmp(a->logits, b->logits, (size_t)cfg->n_vocab * sizeof(float)) == 0);

    const int64_t peak_a = kvb_mem_peak(&a->mem, KVB_TIER_DEVICE, KVB_MEM_KV);
    const int64_t peak_b = kvb_mem_peak(&b->mem, KVB_TIER_DEVICE, KVB_MEM_KV);
    printf("(%s%s%s %s: KV peak %.2f of the reference's) ", name, opts ? " " : "", opts ? opts : "", budget,
           (double)peak_b / (double)peak_a);
    CU_ASSERT(ma->imposes_budget ? peak_b < peak_a : peak_b <= peak_a);

    /* greedy decode on both: the same tokens, the same last logits */
    int32_t ta[NEW], tb[NEW];
    for (int t = 0; t < NEW; t++) {
        ta[t] = argmax(a->logits, cfg->n_vocab);
        tb[t] = argmax(b->logits, cfg->n_vocab);
        CU_ASSERT_FATAL(kvb_forward(a, &ta[t], 1, err, sizeof err) == 0);
        CU_ASSERT_FATAL(kvb_forward(b, &tb[t], 1, err, sizeof err) == 0);
    }
    CU_ASSERT(memcmp(ta, tb, sizeof ta) == 0);
    CU_ASSERT(memcmp(a->logits, b->logits, (size_t)cfg->n_vocab * sizeof(float)) == 0);
    CU_ASSERT(kvb_method_verify(mb, b, 0, err, sizeof err) == 0);

    free(ref);
    kvb_method_free(ma, a);
    kvb_method_free(mb, b);
    kvb_ctx_free(a);
    kvb_ctx_free(b);
}

/* Options a method needs on these models: no calibration profile is made for them. */
static const struct { const char *method, *opts; } PINNED[] = {{"qfilter", "filters=window"}, {"kvzap", "scorer=random"}};

/* Configurations whose end of prefill takes another path: OmniKV with two filter layers, the first one's packed load
 * in the middle of the forward chunk (after layer 4) while the layers after it are still to come; OmniKV keeping
 * every layer on the device (nothing moves; the selection alone). */
static const struct { const char *method, *opts, *budget; } EXTRA[] = {
    {"omnikv", "layers=1;5", "50%"},
    {"omnikv", "offload=0", "25%"},
    {"kvzap", "scorer=random,threshold=0,window=16", "full"}, /* DMS: what each head keeps is the threshold's */
};

/* Every registered method that declares KVB_LAYER_LOCAL, at 25%; then EXTRA. */
static void compare_all(kvb_model *m, const int32_t *ids, int64_t n) {
    int checked = 0;
    for (int i = 0; i < kvb_method_count(); i++) {
        const kvb_method_def *d = kvb_method_at(i);
        if (!(d->traits & KVB_LAYER_LOCAL)) continue;
        const char *opts = NULL;
        for (size_t k = 0; k < sizeof PINNED / sizeof *PINNED; k++)
            if (!strcmp(PINNED[k].method, d->name)) opts = PINNED[k].opts;
        compare(m, d->name, opts, "25%", ids, n);
        checked++;
    }
    CU_ASSERT(checked >= 3); /* SnapKV, StreamingLLM and OmniKV at least */
    for (size_t k = 0; k < sizeof EXTRA / sizeof *EXTRA; k++) compare(m, EXTRA[k].method, EXTRA[k].opts, EXTRA[k].budget, ids, n);
}

static void test_tiny_model_layer_wise_end_equals_the_end_of_prefill(void) {
    enum { N = 300 };
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = (int32_t)(1 + (uint32_t)(i * 2654435761u >> 7) % (V - 1));
    compare_all(util_tiny, ids, N);
}

static void test_default_model_layer_wise_end_equals_the_end_of_prefill(void) {
#ifdef __SANITIZE_ADDRESS__
    printf("(whole-model prefills under the sanitizers take minutes: the release build runs this) ");
    return;
#endif
    char path[1024], err[512];
    if (!util_default_model(path, sizeof path)) {
        const char *ci = getenv("CI");
        if (ci && (!strcmp(ci, "true") || !strcmp(ci, "1"))) CU_FAIL("the default model is missing (CI must have it)");
        printf("(default model absent: skipped) ");
        return;
    }
    kvb_model *m = kvb_model_load(path, err, sizeof err);
    CU_ASSERT_FATAL(m != NULL);
    /* about 240 tokens of varied text, the needle-in-a-haystack kind (480 until 2026-11-28: 93 s of the test on one
     * thread, 53 s now; 34 configurations, each prefilled twice) */
    char text[8192];
    size_t len = 0;
    static const char *things[] = {"river", "lamp", "violin", "harbour", "orchard", "comet", "ledger", "canyon"};
    for (int i = 0; i < 12 && len + 128 < sizeof text; i++)
        len += (size_t)snprintf(text + len, sizeof text - len, "Note %d: the %s near gate %d was counted %d times. ", i,
                                things[i % 8], (i * 37) % 101, (i * i * 13) % 977);
    len += (size_t)snprintf(text + len, sizeof text - len, "How many times was the comet near gate 19 counted?");
    int32_t *ids = NULL;
    int n = 0;
    CU_ASSERT_FATAL(tok_encode(m->tok, text, len, 1, 0, &ids, &n, err, sizeof err) == 0);
    printf("(%d tokens) ", n);
    compare_all(m, ids, n);
    free(ids);
    kvb_model_free(m);
}

static int setup(void) {
    const util_tiny_shape shape = {"layerpre", L, E, NH, NKV, FF, V, CTX};
    return util_tiny_setup(&shape, &rng);
}

static int teardown(void) { return util_tiny_teardown(); }

int main(void) {
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("layer-wise end of prefill", setup, teardown);
    CU_add_test(s, "a tiny model: layer-wise compression keeps the end of prefill's slots, logits and tokens, lower peak",
                test_tiny_model_layer_wise_end_equals_the_end_of_prefill);
    CU_add_test(s, "the default model: the same kept slots, logits bit for bit, greedy tokens, lower KV peak",
                test_default_model_layer_wise_end_equals_the_end_of_prefill);
    return util_run_suites();
}
