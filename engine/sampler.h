/* sampler.h — next-token choice from logits: greedy, or temperature + top-p with a seeded RNG. */
#ifndef KVB_SAMPLER_H
#define KVB_SAMPLER_H

#include <stdint.h>

typedef struct {
    float temp;     /* <= 0: greedy */
    float top_p;    /* nucleus mass in (0, 1]; 1 = off */
    uint64_t seed;
    uint64_t state; /* RNG state, seeded by sampler_init */
    float *probs;   /* scratch of n_vocab */
    int32_t *order; /* scratch of n_vocab */
    int n_vocab;
} kvb_sampler;

/* Set up a sampler for n_vocab logits. 0 = ok. */
int sampler_init(kvb_sampler *s, int n_vocab, float temp, float top_p, uint64_t seed);
void sampler_free(kvb_sampler *s);
/* Index of the largest logit; ties go to the lowest index (llama.cpp's greedy order). */
int32_t sampler_argmax(const float *logits, int n);
/* Pick the next token. */
int32_t sampler_sample(kvb_sampler *s, const float *logits);

#endif
