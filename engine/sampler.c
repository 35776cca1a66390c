#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>

/* splitmix64: small, seedable, and identical on every platform */
static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_uniform(uint64_t *s) { return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0); }

int sampler_init(kvb_sampler *s, int n_vocab, float temp, float top_p, uint64_t seed) {
    s->temp = temp;
    s->top_p = top_p <= 0.0f || top_p > 1.0f ? 1.0f : top_p;
    s->seed = seed;
    s->state = seed;
    s->n_vocab = n_vocab;
    s->probs = malloc((size_t)n_vocab * sizeof *s->probs);
    s->order = malloc((size_t)n_vocab * sizeof *s->order);
    if (!s->probs || !s->order) {
        sampler_free(s);
        return -1;
    }
    return 0;
}

void sampler_free(kvb_sampler *s) {
    free(s->probs);
    free(s->order);
    s->probs = NULL;
    s->order = NULL;
}

int32_t sampler_argmax(const float *logits, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

static const float *g_sort_probs;
static int by_prob_desc(const void *a, const void *b) {
    float pa = g_sort_probs[*(const int32_t *)a], pb = g_sort_probs[*(const int32_t *)b];
    if (pa != pb) return pa < pb ? 1 : -1;
    return *(const int32_t *)a - *(const int32_t *)b;
}

int32_t sampler_sample(kvb_sampler *s, const float *logits) {
    if (s->temp <= 0.0f) return sampler_argmax(logits, s->n_vocab);
    float mx = logits[sampler_argmax(logits, s->n_vocab)];
    double sum = 0.0;
    for (int i = 0; i < s->n_vocab; i++) {
        s->probs[i] = expf((logits[i] - mx) / s->temp);
        sum += s->probs[i];
    }
    for (int i = 0; i < s->n_vocab; i++) s->probs[i] = (float)(s->probs[i] / sum);
    int n = s->n_vocab;
    if (s->top_p < 1.0f) {
        for (int i = 0; i < n; i++) s->order[i] = i;
        g_sort_probs = s->probs;
        qsort(s->order, (size_t)n, sizeof *s->order, by_prob_desc);
        double cum = 0.0;
        int keep = 0;
        while (keep < n && cum < s->top_p) cum += s->probs[s->order[keep++]];
        double r = rng_uniform(&s->state) * cum, acc = 0.0;
        for (int i = 0; i < keep; i++) {
            acc += s->probs[s->order[i]];
            if (r < acc) return s->order[i];
        }
        return s->order[keep - 1];
    }
    double r = rng_uniform(&s->state), acc = 0.0;
    for (int i = 0; i < n; i++) {
        acc += s->probs[i];
        if (r < acc) return i;
    }
    return sampler_argmax(logits, n);
}
