/* cake.h — CAKE's statistics and layer budgets (cake.c), for its test. */
#ifndef KVB_CAKE_H
#define KVB_CAKE_H

#include <stdint.h>

#include "methods/method.h"

/* One layer's window attention A ([H][w][stride], host; columns 0..n-1, the window = the last w tokens): disp =
 * -sum over heads, rows and prefix tokens j < n - w of a log(a + 1e-10); shift = sum over heads and prefix tokens of
 * the unbiased variance over the rows (0 when w = 1); score[g][j] (j < n - w) = the mean over KV head g's query heads
 * of avg_pool1d(kernel, same padding, count_include_pad) of mean_t a + gamma var_t a. All in double. -1 on OOM. */
int kvb_cake_layer(const float *A, int H, int HK, int64_t w, int64_t stride, int64_t n, int64_t kernel, double gamma,
                   double *disp, double *shift, float *score);
/* Integer prefix budgets of L layers summing to total (<= L x cap): shares pref[l] / sum (equal when every pref is
 * <= 0), each capped at cap with the excess re-shared by preference, then floors plus one token for the largest
 * fractional parts (ties: lower layer). */
void kvb_cake_budgets(int L, const double *pref, int64_t total, int64_t cap, int64_t *out);

#endif
