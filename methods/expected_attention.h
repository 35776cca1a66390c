/* expected_attention.h — ExpectedAttention's score (expected_attention.c), shared with the methods that rank by it
 * (chunkkv.c's base scorer). */
#ifndef KVB_EXPECTED_ATTENTION_H
#define KVB_EXPECTED_ATTENTION_H

#include <stdint.h>

#include "methods/method.h"

typedef struct {
    int64_t window; /* observation-window query rows the statistics come from */
    int64_t n_sink; /* first tokens kept whatever their score, left out of the statistics and the softmax */
    int64_t future; /* future positions the RoPE rotation is averaged over (kvpress's n_future_positions) */
    int cov;        /* 1: the covariance term k^T R S R^T k / 2d in the logits (kvpress's use_covariance) */
    int vnorm;      /* 1: the group's mean softmax plus eps, times ||v_j|| (kvpress's use_vnorm) */
    double eps;     /* kvpress's epsilon (NAN: not given; the method picks its default) */
} kvb_ea_opts;

/* The observation window ExpectedAttention reads: its `window` option (32); its def's obs_window. */
int kvb_ea_obs_window(kvb_opts *o, int *rows, char *err, size_t err_len);
/* Options window (32), sinks (4), future (512), cov (1), vnorm (1), eps (left NAN when absent); who names the method
 * in errors. */
int kvb_ea_opts_read(kvb_opts *o, const char *who, kvb_ea_opts *p, char *err, size_t err_len);

typedef struct kvb_ea_scratch kvb_ea_scratch;
/* Device scratch for an n-token prompt's scores (index tables, positions, rows), made once per compression. */
kvb_ea_scratch *kvb_ea_scratch_new(kvb_ctx *c, const kvb_ea_opts *p, int64_t n, char *err, size_t err_len);
void kvb_ea_scratch_free(kvb_ctx *c, kvb_ea_scratch *ws);
/* Layer l's scores of its n slots (position order after prefill) per KV head, score: [n_head_kv][n] device: slot
 * j >= sinks gets the sum over the group's query heads r of softmax_j(mu_r . k_j x attn_scale [+ k_j^T S'_r k_j / 2d
 * with cov]) over the slots from `sinks` on, mu_r the expected query and S'_r its covariance (expected_attention.c);
 * with vnorm, (that sum / G + eps) x ||v_j|| instead; the sinks get a score above every other. */
int kvb_ea_scores(kvb_ctx *c, const kvb_ea_opts *p, kvb_ea_scratch *ws, int l, float *score, char *err,
                  size_t err_len);

#endif
