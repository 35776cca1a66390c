/* snapkv.h — SnapKV's steps and the methods built on its scores share them: SnapKV's scoring and compression
 * (snapkv.c), PyramidKV's per-layer budgets (pyramidkv.c) and AdaKV's allocation of a layer's budget among its
 * KV heads (adakv.c). Everything here runs on the backend: scores and index lists are device memory. */
#ifndef KVB_SNAPKV_H
#define KVB_SNAPKV_H

#include <stdint.h>

#include "methods/method.h"

typedef struct {
    int64_t window; /* observation window rows */
    int64_t kernel; /* pooling kernel, odd */
    int avg_pool;   /* 1: avg_pool1d, 0: max_pool1d */
} kvb_snap_opts;

/* ---- snapkv.c ---- */
/* The observation window SnapKV and the methods on its scores read: the `window` option (32); their defs'
 * obs_window. */
int kvb_snapkv_obs_window(kvb_opts *o, int *rows, char *err, size_t err_len);
/* SnapKV's options window (32), kernel (7), pool (max|avg); who names the method in errors. */
int kvb_snap_opts_read(kvb_opts *o, const char *who, kvb_snap_opts *p, char *err, size_t err_len);
/* Observation rows there are: those observed, at most `window`. */
int64_t kvb_snap_rows(const kvb_ctx *c, const kvb_snap_opts *p);
/* Window rows a layer keeping `keep` tokens per KV head uses: kvb_snap_rows; 0 when keep is not larger (the layer
 * then keeps its most recent `keep` tokens). */
int64_t kvb_snap_window(const kvb_ctx *c, const kvb_snap_opts *p, int64_t keep);
/* SnapKV's score of layer l's prefix (slots 0 .. n-w-1 of an n-token prompt): the last w observed queries'
 * attention, summed over the window and over each group's query heads, then pooled. score (scratch) and pooled:
 * [n_head_kv][n - w], device. */
int kvb_snap_score(kvb_ctx *c, int l, int64_t n, int64_t w, const kvb_snap_opts *p, float *score, float *pooled,
                   char *err, size_t err_len);
/* Keep the last `keep` slots of every KV head of layer l (n slots). */
int kvb_snap_keep_recent(kvb_ctx *c, int l, int64_t n, int64_t keep, char *err, size_t err_len);
/* SnapKV's compression with a budget per layer: layer l keeps keep[l] tokens per KV head, its top keep[l] - w
 * prefix slots by kvb_snap_score plus the window (w = kvb_snap_window); the last keep[l] when w = 0; nothing
 * evicted when keep[l] >= n. */
int kvb_snap_compress(kvb_ctx *c, const kvb_snap_opts *p, const int64_t *keep, char *err, size_t err_len);

/* ---- pyramidkv.c ---- */
/* PyramidKV's budgets for an n-token prompt: keep[l] tokens per KV head of layer l (n_layer entries), the window
 * w in every layer plus a prefix share falling linearly from the bottom layer to the top (top = P/beta,
 * bottom = 2P - P/beta, P = budget - w; the bottom capped at n - w, the top raised to keep the mean). Integer
 * shares: floors, plus one for the layers with the largest fractions (ties: lower layer), so the layers sum to
 * exactly n_layer x budget and never increase upwards. budget >= n: every layer n; budget <= w: every layer
 * budget. */
void kvb_pyramid_budgets(int n_layer, int64_t n, int64_t budget, int64_t w, double beta, int64_t *keep);

/* ---- adakv.c ---- */
/* AdaKV's allocation of one layer's budget among its KV heads, on the backend: score: [rows][row_len] pooled
 * scores (device; each head's top `floor` slots are overwritten with +inf: the safeguard); then the rows x k
 * best slots of all heads together (ties: lower head, then lower slot) go to the heads holding them. out:
 * [rows][out_stride] (out_stride >= row_len), each head's slots ascending; counts: device int32[rows]; flat:
 * device scratch int32[rows x k]. Needs floor <= k <= row_len, rows x row_len < 2^31. */
int kvb_adakv_allocate(kvb_backend *be, float *score, int rows, int64_t row_len, int64_t k, int64_t floor,
                       int32_t *out, int64_t out_stride, int32_t *counts, int32_t *flat, char *err, size_t err_len);
/* Layer l of an n-token prompt kept by AdaKV over score ([n_head_kv][n], device): kvb_adakv_allocate with floor
 * int(alpha x keep) (at least 1 where alpha > 0 and keep > 0, as kvpress 0.5.5's AdaKVPress), the counts brought
 * down (one counted copy and a sync), each KV head's share retained (out, flat: device int32[n_head_kv x n];
 * counts_d: device int32[n_head_kv]); held_range[0], [1] lowered and raised to the fewest and most tokens a head
 * kept (start at -1, 0). ExpectedAttention's and Compactor's ada=1. */
int kvb_adakv_retain(kvb_ctx *c, int l, float *score, int64_t n, int64_t keep, double alpha, int32_t *out,
                     int32_t *flat, int32_t *counts_d, int64_t held_range[2], char *err, size_t err_len);

#endif
