/* pool.h — a persistent thread pool for the CPU kernels.
 *
 * kvb_pool_run() calls fn(arg, ith, nth) once for every ith in [0, nth) and returns when
 * all have finished. The calls are tasks that any thread claims, the caller included, so a
 * descheduled worker's share is run by whoever is running (a shared CI box, a second job on
 * the same cores): fn must not depend on which thread runs which ith, nor on the nth calls
 * running at the same time. Workers spin about 50 us between jobs before sleeping, because a
 * decode step issues hundreds of small jobs and a wake-up per job would cost more than the work. */
#ifndef KVB_POOL_H
#define KVB_POOL_H

typedef struct kvb_pool kvb_pool;
typedef void (*kvb_pool_fn)(void *arg, int ith, int nth);

/* CPUs this process may use: the affinity mask, capped by the cgroup CPU quota (at least 1); $KVB_THREADS (1-4096)
 * instead when set, as the test suite sets it for its whole-model tests. */
int kvb_pool_default_threads(void);
/* Create a pool of n_threads (including the caller); n_threads <= 0 means kvb_pool_default_threads(). */
kvb_pool *kvb_pool_create(int n_threads);
/* Stop and join the workers. NULL is a no-op. */
void kvb_pool_free(kvb_pool *p);
/* Number of threads (>= 1). A NULL pool counts as 1. */
int kvb_pool_size(const kvb_pool *p);
/* Run the nth tasks of fn on the pool's threads and wait. A NULL pool runs fn(arg, 0, 1) inline. Not reentrant. */
void kvb_pool_run(kvb_pool *p, kvb_pool_fn fn, void *arg);
/* Split [0, n) into nth near-equal chunks; thread ith gets [*lo, *hi). */
void kvb_split(long n, int ith, int nth, long *lo, long *hi);

#endif
