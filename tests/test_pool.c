/* test_pool.c — the CPU thread pool: every task of every job runs exactly once, whoever claims it; a job
 * completes while a worker is held off the CPU; a pool larger than the cores still finishes its jobs; the
 * default thread count follows the affinity mask. */
#define _GNU_SOURCE /* sched_setaffinity, CPU_* */
#include <CUnit/Basic.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util_common.h"
#include "kernels/cpu/pool.h"

enum { MAX_T = 16 };

typedef struct {
    atomic_int calls[MAX_T];
    atomic_int bad_nth;
    int nth_expected;
    long sum[MAX_T];
} count_job;

static void count_fn(void *arg, int ith, int nth) {
    count_job *j = arg;
    if (nth != j->nth_expected || ith < 0 || ith >= nth) atomic_fetch_add(&j->bad_nth, 1);
    else atomic_fetch_add(&j->calls[ith], 1);
    long lo, hi, s = 0;
    kvb_split(1000, ith, nth, &lo, &hi);
    for (long i = lo; i < hi; i++) s += i;
    j->sum[ith] = s;
}

static void test_every_task_runs_once_per_job_over_many_jobs(void) {
    const int sizes[] = {1, 2, 3, 7};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        kvb_pool *p = kvb_pool_create(sizes[k]);
        CU_ASSERT_FATAL(p != NULL);
        CU_ASSERT_EQUAL(kvb_pool_size(p), sizes[k]);
        for (int job = 0; job < 3000; job++) {
            count_job j;
            memset(&j, 0, sizeof j);
            j.nth_expected = sizes[k];
            kvb_pool_run(p, count_fn, &j);
            int ok = atomic_load(&j.bad_nth) == 0;
            long total = 0;
            for (int t = 0; t < sizes[k]; t++) {
                ok &= atomic_load(&j.calls[t]) == 1;
                total += j.sum[t];
            }
            CU_ASSERT(ok && total == 999L * 1000 / 2);
            if (!ok) break;
        }
        kvb_pool_free(p);
    }
}

typedef struct {
    atomic_int ran[2];
} stall_job;

/* Task 1 sleeps on whichever thread claims it, after an idle gap long enough for the worker to be asleep:
 * both tasks still run exactly once and the job returns. */
static void stall_fn(void *arg, int ith, int nth) {
    stall_job *j = arg;
    if (ith == 1) {
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    atomic_fetch_add(&j->ran[ith], 1);
}

static void test_job_finishes_when_a_task_is_held_off_the_cpu(void) {
    kvb_pool *p = kvb_pool_create(2);
    CU_ASSERT_FATAL(p != NULL);
    for (int rep = 0; rep < 5; rep++) {
        struct timespec idle = {0, 5 * 1000 * 1000}; /* past the workers' spin: they are asleep */
        nanosleep(&idle, NULL);
        stall_job j;
        memset(&j, 0, sizeof j);
        kvb_pool_run(p, stall_fn, &j);
        CU_ASSERT(atomic_load(&j.ran[0]) == 1 && atomic_load(&j.ran[1]) == 1);
    }
    kvb_pool_free(p);
}

static void test_pool_larger_than_the_cores_finishes_its_jobs(void) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int n = (int)(cores * 4 > MAX_T ? MAX_T : cores * 4);
    kvb_pool *p = kvb_pool_create(n);
    CU_ASSERT_FATAL(p != NULL);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int job = 0; job < 2000; job++) {
        count_job j;
        memset(&j, 0, sizeof j);
        j.nth_expected = n;
        kvb_pool_run(p, count_fn, &j);
        for (int t = 0; t < n; t++) CU_ASSERT(atomic_load(&j.calls[t]) == 1);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    printf("\n  %d threads on %ld cores: 2000 jobs in %.3f s\n", n, cores, s);
    kvb_pool_free(p);
}

static void test_default_threads_follow_the_affinity_mask(void) {
    cpu_set_t all, one;
    CU_ASSERT_FATAL(sched_getaffinity(0, sizeof all, &all) == 0);
    int n_all = kvb_pool_default_threads();
    CU_ASSERT(n_all >= 1 && n_all <= CPU_COUNT(&all));
    int first = -1;
    for (int c = 0; c < CPU_SETSIZE && first < 0; c++)
        if (CPU_ISSET(c, &all)) first = c;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    CU_ASSERT_FATAL(sched_setaffinity(0, sizeof one, &one) == 0);
    CU_ASSERT_EQUAL(kvb_pool_default_threads(), 1);
    kvb_pool *p = kvb_pool_create(0);
    CU_ASSERT(kvb_pool_size(p) == 1);
    kvb_pool_free(p);
    CU_ASSERT_FATAL(sched_setaffinity(0, sizeof all, &all) == 0);
    CU_ASSERT_EQUAL(kvb_pool_default_threads(), n_all);
}

/* KVB_THREADS replaces the affinity count when it is a count 1-4096; anything else is ignored (named once) */
static void test_default_threads_follow_kvb_threads(void) {
    int n_all = kvb_pool_default_threads();
    CU_ASSERT_FATAL(setenv("KVB_THREADS", "3", 1) == 0);
    CU_ASSERT_EQUAL(kvb_pool_default_threads(), 3);
    kvb_pool *p = kvb_pool_create(0);
    CU_ASSERT(kvb_pool_size(p) == 3);
    kvb_pool_free(p);
    p = kvb_pool_create(2); /* an explicit count wins */
    CU_ASSERT(kvb_pool_size(p) == 2);
    kvb_pool_free(p);
    static const char *bad[] = {"0", "-1", "4097", "2x", "x", " 2"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CU_ASSERT_FATAL(setenv("KVB_THREADS", bad[i], 1) == 0);
        CU_ASSERT_EQUAL(kvb_pool_default_threads(), n_all);
    }
    CU_ASSERT_FATAL(setenv("KVB_THREADS", "", 1) == 0);
    CU_ASSERT_EQUAL(kvb_pool_default_threads(), n_all);
    unsetenv("KVB_THREADS");
}

int main(void) {
    unsetenv("KVB_THREADS"); /* the tests below read the machine's own count */
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("pool", NULL, NULL);
    CU_add_test(s, "every task runs once per job over many jobs", test_every_task_runs_once_per_job_over_many_jobs);
    CU_add_test(s, "a job finishes when a task is held off the CPU", test_job_finishes_when_a_task_is_held_off_the_cpu);
    CU_add_test(s, "a pool larger than the cores finishes its jobs", test_pool_larger_than_the_cores_finishes_its_jobs);
    CU_add_test(s, "default threads follow the affinity mask", test_default_threads_follow_the_affinity_mask);
    CU_add_test(s, "default threads follow KVB_THREADS", test_default_threads_follow_kvb_threads);
    return util_run_suites();
}
