/* util_method.h — what the method tests on a tiny random model share (test_keydiff, test_observed,
 * test_decoding, test_tova_knorm_quest): the model, written to a temporary folder and loaded by the suite's
 * setup; a context; a method by name; the seeded uniform the tests draw K/V rows and queries from. */
#ifndef KVB_TEST_UTIL_METHOD_H
#define KVB_TEST_UTIL_METHOD_H

#include <stdint.h>

#include "engine/model.h"
#include "methods/method.h"

typedef struct {
    const char *tag; /* names the temporary folder */
    int n_layer, n_embd, n_head, n_head_kv, n_ff, n_vocab, n_ctx;
} util_tiny_shape;

/* the suite's model (NULL before util_tiny_setup) */
extern kvb_model *util_tiny;

/* A random-weight llama model of shape s, written from the stream *rng (which advances) and loaded: 0, or -1.
 * util_tiny_teardown frees it and removes its files. For CU_add_suite's setup and teardown. */
int util_tiny_setup(const util_tiny_shape *s, uint64_t *rng);
int util_tiny_teardown(void);
/* A context on util_tiny: n_ctx tokens, KV type dt, 2 threads, prefill chunks of 64 (asserts it exists). */
kvb_ctx *util_tiny_ctx(kvb_dtype dt, int n_ctx);
/* Method `name` on c at budget (kvb_budget_parse's syntax) with options "k=v,..." or NULL (asserts it exists). */
kvb_method *util_make_method(const char *name, kvb_ctx *c, const char *budget, const char *opts);
/* uniform in [-s, s) from the LCG stream *rng */
float util_frand(uint64_t *rng, float s);

#endif
