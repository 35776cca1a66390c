/* fidelity.h — how closely a method follows full attention on one prompt (`kvbench fidelity`).
 *
 * Full attention prefills the prompt once and generates its greedy continuation; the method prefills the
 * same prompt with its own hooks and is teacher-forced with full's tokens, the two contexts stepping in
 * lockstep. At every generated position the two next-token distributions are compared:
 *   agreement  the method's top-1 token equals full's;
 *   KL         KL(full || method) of the softmax distributions, in nats (float64 sums over the vocabulary).
 * At every decode step and layer, attention-mass recall is the share of full attention's probability mass
 * (per KV head: the mean over its query heads) that falls on the positions the method let that layer's KV head
 * read, averaged over the KV heads. PoD reads its distant tokens through the base layer's scores, not through
 * the layer's own keys: its recall counts the proximal tokens only, and its KL shows what the shared scores cost. */
#ifndef KVB_FIDELITY_H
#define KVB_FIDELITY_H

#include <stddef.h>
#include <stdint.h>

#include "methods/method.h"

typedef struct {
    int positions;       /* next-token distributions compared */
    int agree;           /* of them, top-1 equal to full's */
    double kl_sum;       /* sum of KL(full || method) over the positions */
    double kl_max;
    int n_layer;
    double *recall_sum;  /* [n_layer] sum over decode steps of the mean-over-KV-heads recall */
    int recall_steps;    /* decode steps with recall measured */
    kvb_kv_usage kv;     /* the method's measured KV after the run */
    int64_t max_head_tokens; /* the most slots any layer's KV head held after the prefill or any decode step
                              * (measured in the store: what a method compressing while decoding must bound) */
    int max_head_step;       /* the decode step where it was reached (0: the end of the prefill) */
    char params[200];    /* the method's resolved parameters */
} kvb_fid_result;

/* A full-attention reference for one prompt: prefilled once, forked for each method. */
typedef struct kvb_fid_ref kvb_fid_ref;

/* Prefill ids[0..n) with full attention (n_gen tokens of room after it). NULL + err on failure. */
kvb_fid_ref *kvb_fid_ref_create(kvb_model *m, const kvb_ctx_params *p, const int32_t *ids, int64_t n, int n_gen,
                                char *err, size_t err_len);
void kvb_fid_ref_free(kvb_fid_ref *r);
/* Keep generating past full attention's end of generation (n_gen positions exactly, `fidelity --ignore-eos`). */
void kvb_fid_ref_ignore_eos(kvb_fid_ref *r, int on);

/* Run one method (budget b, options o) against the reference for up to n_gen positions (fewer when full
 * ends its answer). out is zeroed and filled; free it with kvb_fid_result_free. 0 or -1 + err. */
int kvb_fidelity_run(kvb_fid_ref *r, const char *method, const kvb_budget *b, kvb_opts *o, kvb_fid_result *out,
                     char *err, size_t err_len);
/* A zeroed result with room for n_layer layers (what runs fill and sums add into); 0 or -1 (out of memory). */
int kvb_fid_result_init(kvb_fid_result *r, int n_layer);
void kvb_fid_result_free(kvb_fid_result *r);
/* Add r's counts and sums into sum (same n_layer); kl_max and max_head_tokens are the larger, kv and params r's. */
void kvb_fid_result_add(kvb_fid_result *sum, const kvb_fid_result *r);

/* A layer's recall averaged over decode steps, and its mean over layers (NAN without decode steps). */
double kvb_fid_layer_recall(const kvb_fid_result *r, int layer);
double kvb_fid_mean_recall(const kvb_fid_result *r);

#endif
