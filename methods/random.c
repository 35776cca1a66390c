/* random.c — the random control (kvpress's RandomPress): once the prompt is in, each layer and KV head keeps
 * a seeded uniform-random subset of the prompt's tokens within the budget and evicts the rest; decode appends
 * without evicting. What every compression method should beat: a method that scores tokens and keeps the
 * best must do better than keeping them at random.
 *
 * Choices (flags): seed=1, sinks=4, window=32. Budget B per head = budget x prompt length (or a token count),
 * as SnapKV's. Unlike RandomPress, the first `sinks` tokens and the last `window` tokens are always kept
 * (StreamingLLM keeps both, H2O and SnapKV a recent window), so the control differs from those methods in how
 * the middle is chosen; when B <= sinks + window, the sinks and then the newest tokens fill it. The remaining
 * B - sinks - window tokens are drawn uniformly without replacement from the middle [sinks, n - window)
 * (selection sampling, Knuth's Algorithm S: ascending, no sort), independently per layer and per KV head:
 * RandomPress draws one score per KV head and token (torch.rand over batch x heads x tokens) and keeps each
 * head's top-k; with a seed it reseeds at every layer and so repeats one draw across layers, which is not
 * kept here. Each (layer, head) draw is its own splitmix64 stream of (seed, layer, head), so a fork of a shared
 * prefill, and an end of prefill layer by layer, keep exactly what an own prefill keeps. */
#include <stdio.h>
#include <stdlib.h>

#include "methods/method.h"

typedef struct {
    kvb_method base;
    int64_t seed, sinks, window;
    int64_t keep; /* tokens kept per head after prefill */
} rnd;

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Kept slots of one head of an n-token prompt, ascending: sinks, `pick` of the middle at random, window. */
static void choose(const rnd *s, uint64_t stream, int64_t n, int64_t sinks, int64_t window, int32_t *idx) {
    int64_t at = 0, pick = s->keep - sinks - window, left = n - sinks - window;
    uint64_t state = (uint64_t)s->seed + 0xd1b54a32d192ed03ull * (stream + 1);
    for (int64_t j = 0; j < sinks; j++) idx[at++] = (int32_t)j;
    for (int64_t j = sinks; pick > 0; j++, left--) /* keep j with probability pick / left */
        if ((double)(splitmix64(&state) >> 11) * 0x1p-53 * (double)left < (double)pick) idx[at++] = (int32_t)j, pick--;
    for (int64_t j = n - window; j < n; j++) idx[at++] = (int32_t)j;
}

static int random_after_prefill(void *self, kvb_ctx *c, char *err, size_t err_len) {
    rnd *s = self;
    int64_t n = c->n_past;
    s->base.n_prompt = n;
    if (kvb_method_budget_tokens(&s->base, n, &s->keep, err, err_len)) return -1;
    int from, to; /* every layer, or one (a layer-wise end of prefill: engine/model.h kvb_prefill_layers) */
    kvb_prefill_layers(c, &from, &to);
    if (s->keep >= n || from >= to) return 0;
    int64_t sinks = s->sinks < s->keep ? s->sinks : s->keep;
    int64_t window = s->window < s->keep - sinks ? s->window : s->keep - sinks;
    int32_t *idx = malloc((size_t)s->keep * sizeof *idx);
    if (!idx) return ERR("out of memory");
    int rc = 0;
    for (int l = from; l < to && !rc; l++)
        for (int h = 0; h < c->model->cfg.n_head_kv && !rc && !kvb_layer_window(&c->model->cfg, l); h++) /* a local layer keeps its window */ {
            /* slots are in position order after prefill; one stream per (layer, head) */
            choose(s, (uint64_t)l * (uint64_t)c->model->cfg.n_head_kv + (uint64_t)h, n, sinks, window, idx);
            rc = kvc_retain(c->kv, l, h, idx, s->keep, err, err_len);
        }
    free(idx);
    return rc;
}

static int64_t random_expected(kvb_method *m, kvb_ctx *c, int layer) {
    (void)layer;
    rnd *s = (rnd *)m;
    if (c->in_prefill) return c->n_past;
    return s->keep + (c->n_past - m->n_prompt);
}

static void random_describe(kvb_method *m, char *buf, size_t cap) {
    rnd *s = (rnd *)m;
    snprintf(buf, cap, "seed=%lld sinks=%lld window=%lld keep=%lld", (long long)s->seed, (long long)s->sinks,
             (long long)s->window, (long long)s->keep);
}

static void random_destroy(kvb_method *m) { free(m); }

static kvb_method *random_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len) {
    (void)c;
    rnd *s = calloc(1, sizeof *s);
    if (!s) { ERR("out of memory"); return NULL; }
    s->seed = 1;
    s->sinks = 4;
    s->window = 32;
    if (kvb_opts_int(o, "seed", &s->seed, err, err_len) < 0 || kvb_opts_int(o, "sinks", &s->sinks, err, err_len) < 0 ||
        kvb_opts_int(o, "window", &s->window, err, err_len) < 0)
        goto fail;
    if (s->sinks < 0 || s->window < 0) { ERR("random: sinks and window must be >= 0"); goto fail; }
    s->base.budget = *b;
    s->base.imposes_budget = 1;
    return &s->base;
fail:
    free(s);
    return NULL;
}

const kvb_method_def kvb_method_random = {
    .name = "random",
    .summary = "the control: a seeded random subset + sinks + window, once after prefill",
    .traits = KVB_NEEDS_BUDGET | KVB_SHARES_PREFILL | KVB_LAYER_LOCAL,
    .create = random_create,
    .hooks = {.after_prefill = random_after_prefill},
    .expected_tokens = random_expected,
    .describe = random_describe,
    .destroy = random_destroy,
};
