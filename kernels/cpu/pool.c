#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "kernels/cpu/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVB_PAUSE() _mm_pause()
#else
#define KVB_PAUSE() ((void)0)
#endif

/* About 50 us of pause instructions: longer than the gap between two jobs of one decode step, so workers
 * stay awake while a step runs, and short enough that an idle or oversubscribed pool gives its cores back. */
enum { WORKER_SPIN = 2048, CALLER_SPIN = 2048 };

/* A job is fn(arg, ith, nth) for ith in [0, nth): nth tasks that any thread may claim. The caller claims
 * tasks too, so when a worker is descheduled (another process holds the cores) the caller runs that
 * worker's share instead of waiting a scheduler time slice for it. Every task's result depends only on
 * its ith, never on which thread ran it, so the arithmetic is the same however the tasks were claimed. */
struct kvb_pool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t work_cv;   /* workers sleep here between jobs */
    pthread_cond_t done_cv;   /* the caller sleeps here until the last task finishes */
    atomic_uint generation;   /* bumped by the caller for each job */
    atomic_int next_task;     /* next ith to claim; >= n_threads once all are claimed */
    atomic_int n_finished;    /* tasks of the current job finished */
    atomic_int n_sleeping;    /* workers waiting on work_cv */
    atomic_int caller_waiting;
    atomic_int stop;
    kvb_pool_fn fn;
    void *arg;
};

/* Claim and run tasks of the current job until none is left. */
static void run_tasks(kvb_pool *p) {
    for (;;) {
        int t = atomic_fetch_add(&p->next_task, 1);
        if (t >= p->n_threads) return;
        p->fn(p->arg, t, p->n_threads);
        if (atomic_fetch_add(&p->n_finished, 1) + 1 == p->n_threads && atomic_load(&p->caller_waiting)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done_cv);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

static void *worker_main(void *varg) {
    kvb_pool *p = varg;
    unsigned seen = 0;
    for (;;) {
        unsigned gen;
        int spins = 0;
        while ((gen = atomic_load(&p->generation)) == seen && !atomic_load(&p->stop)) {
            if (++spins < WORKER_SPIN) {
                KVB_PAUSE();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->n_sleeping, 1);
            while (atomic_load(&p->generation) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->work_cv, &p->mu);
            atomic_fetch_sub(&p->n_sleeping, 1);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
        }
        if (atomic_load(&p->stop)) break;
        seen = gen;
        run_tasks(p);
    }
    return NULL;
}

/* CPUs this process may run on: the affinity mask, capped by a cgroup v2 CPU quota (cpu.max) or v1
 * (cfs_quota_us / cfs_period_us), rounded up. A container limited to 2 CPUs on a 64-core host gets 2. */
static int cgroup_cpu_limit(void) {
    long quota = -1, period = -1;
    FILE *f = fopen("/sys/fs/cgroup/cpu.max", "r");
    if (f) {
        char q[32];
        if (fscanf(f, "%31s %ld", q, &period) == 2 && q[0] != 'm') quota = strtol(q, NULL, 10);
        fclose(f);
    } else if ((f = fopen("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "r"))) {
        if (fscanf(f, "%ld", &quota) != 1) quota = -1;
        fclose(f);
        if ((f = fopen("/sys/fs/cgroup/cpu/cpu.cfs_period_us", "r"))) {
            if (fscanf(f, "%ld", &period) != 1) period = -1;
            fclose(f);
        }
    }
    if (quota <= 0 || period <= 0) return 0;
    return (int)((quota + period - 1) / period);
}

/* KVB_THREADS, when set: a count 1-4096 (a malformed value is named on stderr once and ignored) */
static int env_threads(void) {
    static atomic_int warned;
    const char *v = getenv("KVB_THREADS");
    if (!v || !*v) return 0;
    char *end;
    long n = strtol(v, &end, 10);
    if (*v < '0' || *v > '9' || *end || n < 1 || n > 4096) {
        if (!atomic_exchange(&warned, 1))
            fprintf(stderr, "kvbench: KVB_THREADS='%s' is not a thread count (1-4096): ignored\n", v);
        return 0;
    }
    return (int)n;
}

int kvb_pool_default_threads(void) {
    int n = env_threads();
    if (n > 0) return n;
#ifdef CPU_COUNT
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
#endif
    if (n <= 0) {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        n = online > 0 ? (int)online : 1;
    }
    int limit = cgroup_cpu_limit();
    if (limit > 0 && limit < n) n = limit;
    return n;
}

kvb_pool *kvb_pool_create(int n_threads) {
    if (n_threads <= 0) n_threads = kvb_pool_default_threads();
    kvb_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    atomic_init(&p->generation, 0);
    atomic_init(&p->next_task, n_threads);
    atomic_init(&p->n_finished, 0);
    atomic_init(&p->n_sleeping, 0);
    atomic_init(&p->caller_waiting, 0);
    atomic_init(&p->stop, 0);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof *p->threads);
        if (!p->threads) { free(p); return NULL; }
        for (int i = 1; i < n_threads; i++)
            if (pthread_create(&p->threads[i - 1], NULL, worker_main, p) != 0) {
                p->n_threads = i; /* run with the workers we got */
                break;
            }
    }
    return p;
}

void kvb_pool_free(kvb_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i - 1], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->work_cv);
    pthread_cond_destroy(&p->done_cv);
    free(p->threads);
    free(p);
}

int kvb_pool_size(const kvb_pool *p) { return p ? p->n_threads : 1; }

void kvb_pool_run(kvb_pool *p, kvb_pool_fn fn, void *arg) {
    if (!p || p->n_threads == 1) {
        fn(arg, 0, 1);
        return;
    }
    /* publish the job before the claim counter reopens: a worker that claims a task sees fn and arg */
    p->fn = fn;
    p->arg = arg;
    atomic_store(&p->n_finished, 0);
    atomic_store(&p->next_task, 0);
    atomic_fetch_add(&p->generation, 1);
    if (atomic_load(&p->n_sleeping) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->work_cv);
        pthread_mutex_unlock(&p->mu);
    }
    run_tasks(p);
    /* tasks claimed by workers may still run: spin briefly, then sleep until the last one signals */
    for (int spins = 0; atomic_load(&p->n_finished) < p->n_threads; spins++) {
        if (spins < CALLER_SPIN) {
            KVB_PAUSE();
            continue;
        }
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->caller_waiting, 1);
        while (atomic_load(&p->n_finished) < p->n_threads) pthread_cond_wait(&p->done_cv, &p->mu);
        atomic_store(&p->caller_waiting, 0);
        pthread_mutex_unlock(&p->mu);
        break;
    }
}

void kvb_split(long n, int ith, int nth, long *lo, long *hi) {
    long per = n / nth, rem = n % nth;
    *lo = ith * per + (ith < rem ? ith : rem);
    *hi = *lo + per + (ith < rem ? 1 : 0);
}
