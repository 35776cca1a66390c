/* util_method.h — what the method tests on a tiny random model share (test_keydiff, test_observed,
 * test_decoding, test_tova_knorm_quest): the model, written to a temporary folder and loaded by the suite's
 * setup; a context; a method by name; the seeded uniform the tests draw K/V rows and queries from. */
#ifndef KVB_TEST_UTIL_METHOD_H
#define KVB_TEST_UTIL_METHOD_H

#include <stddef.h>
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
/* Method `name` on c refuses the option opt ("k=v") with an error holding opt_err, and a missing budget with
 * "needs a budget": both creations must fail (asserted). */
void util_check_refusals(const char *name, kvb_ctx *c, const char *opt, const char *opt_err);
/* uniform in [-s, s) from the LCG stream *rng */
float util_frand(uint64_t *rng, float s);

/* ---- float64 references ---- */
/* element `at` of rows of type dt (f16 or f32) */
double util_elem(const void *rows, kvb_dtype dt, size_t at);
/* The k largest of x[0..n) as sorted positions (ties to the lower index) into out. margin (may be NULL): the k-th
 * largest minus the (k+1)-th, how far the reference is from a tie that float rounding could break either way
 * (INFINITY when k >= n); kth (may be NULL): the k-th largest. */
void util_topk_ref(const double *x, int64_t n, int64_t k, int32_t *out, double *margin, double *kth);
/* kvpress's KeyDiff score of the n keys (head_dim d) of a head: -cos(k_j, mean_i k_i / ||k_i||), 0 for a zero key */
void util_keydiff_ref(const void *k, kvb_dtype dt, int64_t n, int d, double *score);
/* layer l's KV head h's positions, sorted, into out; their count */
int64_t util_head_positions(kvb_ctx *c, int l, int h, int32_t *out);

#endif
