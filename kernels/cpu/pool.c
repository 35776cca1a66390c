#include "kernels/cpu/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVB_PAUSE() _mm_pause()
#else
#define KVB_PAUSE() ((void)0)
#endif

enum { SPIN_ITERS = 200000 };

struct kvb_pool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint generation;   /* bumped by the caller for each job */
    atomic_int n_done;        /* workers finished with the current job */
    atomic_int n_sleeping;
    atomic_int stop;
    kvb_pool_fn fn;
    void *arg;
};

typedef struct { kvb_pool *p; int ith; } worker_arg;

static void *worker_main(void *varg) {
    worker_arg wa = *(worker_arg *)varg;
    free(varg);
    kvb_pool *p = wa.p;
    unsigned seen = 0;
    for (;;) {
        unsigned gen;
        int spins = 0;
        while ((gen = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen &&
               !atomic_load(&p->stop)) {
            if (++spins < SPIN_ITERS) {
                KVB_PAUSE();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->n_sleeping, 1);
            while (atomic_load(&p->generation) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->n_sleeping, 1);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
        }
        if (atomic_load(&p->stop)) break;
        seen = gen;
        p->fn(p->arg, wa.ith, p->n_threads);
        atomic_fetch_add_explicit(&p->n_done, 1, memory_order_acq_rel);
    }
    return NULL;
}

kvb_pool *kvb_pool_create(int n_threads) {
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    kvb_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    atomic_init(&p->generation, 0);
    atomic_init(&p->n_done, 0);
    atomic_init(&p->n_sleeping, 0);
    atomic_init(&p->stop, 0);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof *p->threads);
        if (!p->threads) { free(p); return NULL; }
        for (int i = 1; i < n_threads; i++) {
            worker_arg *wa = malloc(sizeof *wa);
            if (!wa) { p->n_threads = i; break; }
            wa->p = p;
            wa->ith = i;
            if (pthread_create(&p->threads[i - 1], NULL, worker_main, wa) != 0) {
                free(wa);
                p->n_threads = i;
                break;
            }
        }
    }
    return p;
}

void kvb_pool_free(kvb_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i - 1], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->threads);
    free(p);
}

int kvb_pool_size(const kvb_pool *p) { return p ? p->n_threads : 1; }

void kvb_pool_run(kvb_pool *p, kvb_pool_fn fn, void *arg) {
    if (!p || p->n_threads == 1) {
        fn(arg, 0, 1);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    atomic_store_explicit(&p->n_done, 0, memory_order_release);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_acq_rel);
    if (atomic_load(&p->n_sleeping) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    fn(arg, 0, p->n_threads);
    /* spin briefly, then yield: when another process holds the cores (a parallel ctest, a shared CI box),
     * the worker we wait for may be descheduled, and spinning would burn its time slice */
    for (int spins = 0; atomic_load_explicit(&p->n_done, memory_order_acquire) < p->n_threads - 1; spins++) {
        if (spins < 4096) KVB_PAUSE();
        else sched_yield();
    }
}

void kvb_split(long n, int ith, int nth, long *lo, long *hi) {
    long per = n / nth, rem = n % nth;
    *lo = ith * per + (ith < rem ? ith : rem);
    *hi = *lo + per + (ith < rem ? 1 : 0);
}
