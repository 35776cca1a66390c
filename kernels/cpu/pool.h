/* pool.h — a persistent thread pool for the CPU kernels.
 *
 * kvb_pool_run() calls fn(arg, ith, nth) on every thread (the caller is thread 0)
 * and returns when all have finished. Workers spin briefly between jobs before
 * sleeping, because a decode step issues hundreds of small jobs and a condition
 * variable wake-up per job would cost more than the work. */
#ifndef KVB_POOL_H
#define KVB_POOL_H

typedef struct kvb_pool kvb_pool;
typedef void (*kvb_pool_fn)(void *arg, int ith, int nth);

/* Create a pool of n_threads (including the caller); n_threads <= 0 means one per online core. */
kvb_pool *kvb_pool_create(int n_threads);
/* Stop and join the workers. NULL is a no-op. */
void kvb_pool_free(kvb_pool *p);
/* Number of threads (>= 1). A NULL pool counts as 1. */
int kvb_pool_size(const kvb_pool *p);
/* Run fn on all threads and wait. A NULL pool runs fn(arg, 0, 1) inline. Not reentrant. */
void kvb_pool_run(kvb_pool *p, kvb_pool_fn fn, void *arg);
/* Split [0, n) into nth near-equal chunks; thread ith gets [*lo, *hi). */
void kvb_split(long n, int ith, int nth, long *lo, long *hi);

#endif
