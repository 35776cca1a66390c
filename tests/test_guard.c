/* test_guard.c — KVB_GUARD (kernels/cpu/guard.h): under the guard, ops read and write device-tier memory while
 * host code touching it dies with SIGSEGV; host-tier memory stays the host's; every op of the CPU backend runs
 * with the arena open, nested ops included; the KV row writer stores f32 and f16 rows; memory freed and
 * reallocated many times neither grows the resident set nor runs out of the arena's address range. */
#include <CUnit/Basic.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util_common.h"
#include "kernels/backend.h"
#include "kernels/cpu/guard.h"

static kvb_backend *guarded(void) {
    char err[256] = "";
    setenv("KVB_GUARD", "1", 1);
    kvb_backend *be = kvb_backend_cpu_create(1, err, sizeof err);
    unsetenv("KVB_GUARD");
    if (!be) fprintf(stderr, "guarded backend: %s\n", err);
    return be;
}

static void *dev_alloc(kvb_backend *be, size_t bytes) { return be->allocator->alloc(be->allocator->user, KVB_TIER_DEVICE, bytes); }
static void dev_free(kvb_backend *be, void *p, size_t bytes) { be->allocator->free(be->allocator->user, KVB_TIER_DEVICE, p, bytes); }
static void mem_copy(kvb_backend *be, void *dst, const void *src, size_t bytes) {
    be->allocator->copy(be->allocator->user, dst, src, bytes);
}

/* Run fn(arg) in a child process: the signal that ended it, 0 when it returned, -1 when it exited otherwise. */
static int in_child(void (*fn)(void *), void *arg) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        signal(SIGSEGV, SIG_DFL); /* a sanitizer's handler would turn the fault into an exit code */
        fn(arg);
        _exit(0);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid) return -1;
    return WIFSIGNALED(st) ? WTERMSIG(st) : WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

static long rss_bytes(void) {
    long size = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return -1;
    int n = fscanf(f, "%ld %ld", &size, &resident);
    fclose(f);
    return n == 2 ? resident * sysconf(_SC_PAGESIZE) : -1;
}

/* ---- ops reach device memory, host code does not ---- */

static void test_an_op_writes_and_reads_device_memory(void) {
    kvb_backend *be = guarded();
    CU_ASSERT_FATAL(be != NULL);
    CU_ASSERT_FATAL(be->allocator != NULL);
    enum { N = 3000 }; /* several pages */
    float a[N], b[N], out[N];
    for (int i = 0; i < N; i++) a[i] = (float)i, b[i] = 0.5f * (float)i;
    float *da = dev_alloc(be, sizeof a), *db = dev_alloc(be, sizeof b), *dout = dev_alloc(be, sizeof out);
    CU_ASSERT_FATAL(da && db && dout);
    mem_copy(be, da, a, sizeof a);
    mem_copy(be, db, b, sizeof b);
    be->add(be, dout, da, db, N);
    be->add(be, dout, dout, da, N); /* reads what the previous op wrote */
    mem_copy(be, out, dout, sizeof out);
    int ok = 1;
    for (int i = 0; i < N; i++) ok &= out[i] == 2.5f * (float)i;
    CU_ASSERT(ok);
    dev_free(be, da, sizeof a);
    dev_free(be, db, sizeof b);
    dev_free(be, dout, sizeof out);
    kvb_backend_free(be);
}

typedef struct {
    volatile float *p;
    int write;
} touch;

static void touch_it(void *arg) {
    touch *t = arg;
    if (t->write) t->p[0] = 1.0f;
    else (void)t->p[0];
}

static void test_host_code_touching_device_memory_dies_with_sigsegv(void) {
    kvb_backend *be = guarded();
    CU_ASSERT_FATAL(be != NULL);
    enum { N = 64 };
    float x[N] = {0};
    float *d = dev_alloc(be, sizeof x);
    CU_ASSERT_FATAL(d != NULL);
    touch rd = {d, 0}, wr = {d + N - 1, 1};
    CU_ASSERT_EQUAL(in_child(touch_it, &rd), SIGSEGV); /* fresh block, no op run yet */
    CU_ASSERT_EQUAL(in_child(touch_it, &wr), SIGSEGV);
    be->add(be, d, d, d, N);
    CU_ASSERT_EQUAL(in_child(touch_it, &rd), SIGSEGV); /* closed again after an op */
    CU_ASSERT_EQUAL(in_child(touch_it, &wr), SIGSEGV);
    dev_free(be, d, sizeof x);
    float *e = dev_alloc(be, 1 << 20); /* reused or fresh pages: closed either way */
    touch late = {e + 1000, 0};
    CU_ASSERT_EQUAL(in_child(touch_it, &late), SIGSEGV);
    dev_free(be, e, 1 << 20);
    kvb_backend_free(be);
}

static void test_host_tier_memory_stays_accessible(void) {
    kvb_backend *be = guarded();
    CU_ASSERT_FATAL(be != NULL);
    enum { N = 5000 };
    const kvb_allocator *al = be->allocator;
    float *h = al->alloc(al->user, KVB_TIER_HOST, N * sizeof(float)), *d = dev_alloc(be, N * sizeof(float));
    CU_ASSERT_FATAL(h && d);
    int zero = 1;
    for (int i = 0; i < N; i++) zero &= h[i] == 0.0f;
    CU_ASSERT(zero);
    for (int i = 0; i < N; i++) h[i] = (float)(N - i);
    mem_copy(be, d, h, N * sizeof(float));
    be->add(be, d, d, d, N);
    mem_copy(be, h, d, N * sizeof(float));
    int ok = 1;
    for (int i = 0; i < N; i++) ok &= h[i] == 2.0f * (float)(N - i);
    CU_ASSERT(ok);
    touch t = {h + N - 1, 1};
    CU_ASSERT_EQUAL(in_child(touch_it, &t), 0);
    al->free(al->user, KVB_TIER_HOST, h, N * sizeof(float));
    dev_free(be, d, N * sizeof(float));
    kvb_backend_free(be);
}

static void test_device_memory_comes_zeroed_also_when_reused(void) {
    kvb_backend *be = guarded();
    CU_ASSERT_FATAL(be != NULL);
    enum { N = 10000 };
    static float ones[N], back[N];
    for (int i = 0; i < N; i++) ones[i] = 1.0f;
    float *d = dev_alloc(be, sizeof ones);
    mem_copy(be, d, ones, sizeof ones);
    dev_free(be, d, sizeof ones);
    float *e = dev_alloc(be, sizeof ones);
    CU_ASSERT_FATAL(e != NULL);
    mem_copy(be, back, e, sizeof back);
    int zero = 1;
    for (int i = 0; i < N; i++) zero &= back[i] == 0.0f;
    CU_ASSERT(zero);
    dev_free(be, e, sizeof ones);
    kvb_backend_free(be);
}

/* ---- every op is wrapped, nested ops keep the arena open ---- */

typedef void (*fnptr)(void);

static void test_every_op_of_the_cpu_backend_runs_guarded(void) {
    char err[256];
    kvb_backend *plain = kvb_backend_cpu_create(1, err, sizeof err), *be = guarded();
    CU_ASSERT_FATAL(plain && be);
    CU_ASSERT(plain->allocator != NULL && plain->kv_writer != NULL);
    CU_ASSERT(be->allocator != plain->allocator);
    /* the op table, matmul .. the data ops, is function pointers up to `free`: each present op is replaced */
    const size_t first = offsetof(kvb_backend, matmul), end = offsetof(kvb_backend, free);
    int n_ops = 0, unwrapped = 0;
    for (size_t off = first; off < end; off += sizeof(fnptr)) {
        fnptr p, g;
        memcpy(&p, (const char *)plain + off, sizeof p);
        memcpy(&g, (const char *)be + off, sizeof g);
        if (!p) continue;
        n_ops++;
        if (!g || g == p) {
            fprintf(stderr, "op at offset %zu is not guarded\n", off);
            unwrapped++;
        }
    }
    CU_ASSERT(n_ops >= 10);
    CU_ASSERT_EQUAL(unwrapped, 0);
    CU_ASSERT(be->kv_writer && be->kv_writer != plain->kv_writer);
    CU_ASSERT((plain->sync == NULL) == (be->sync == NULL));
    kvb_backend_free(plain);
    kvb_backend_free(be);
}

/* a backend whose add calls the guarded backend's swiglu, then writes its output: nesting must not close */
static kvb_backend *g_outer;

static void nested_swiglu(kvb_backend *be, float *out, const float *gate, const float *up, int64_t n) { out[0] = 2.0f; }

static void nested_add(kvb_backend *be, float *out, const float *a, const float *b, int64_t n) {
    g_outer->swiglu(g_outer, out, a, b, n);
    out[n - 1] = out[0] + 1.0f; /* faults if the inner op's return closed the arena */
}

static void run_nested(void *arg) {
    float *d = arg;
    g_outer->add(g_outer, d, d, d, 1000);
}

static void test_an_op_calling_another_keeps_the_arena_open(void) {
    static kvb_backend fake; /* no `free`: freeing the wrapper leaves it alone */
    fake.name = "fake";
    fake.add = nested_add;
    fake.swiglu = nested_swiglu;
    char err[256];
    g_outer = kvb_guard_wrap(&fake, err, sizeof err);
    CU_ASSERT_FATAL(g_outer != NULL);
    float *d = dev_alloc(g_outer, 1000 * sizeof(float));
    CU_ASSERT_FATAL(d != NULL);
    CU_ASSERT_EQUAL(in_child(run_nested, d), 0);
    run_nested(d);
    float first_last[1000];
    mem_copy(g_outer, first_last, d, sizeof first_last);
    CU_ASSERT(first_last[0] == 2.0f && first_last[999] == 3.0f);
    touch t = {d, 0};
    CU_ASSERT_EQUAL(in_child(touch_it, &t), SIGSEGV); /* closed after the outer op */
    dev_free(g_outer, d, 1000 * sizeof(float));
    kvb_backend_free(g_outer);
}

static void test_kv_writer_stores_f32_and_f16_rows_of_every_head(void) {
    kvb_backend *be = guarded();
    CU_ASSERT_FATAL(be != NULL);
    enum { H = 3, D = 5, T = 4 };
    float k[T][H][D], v[T][H][D];
    int32_t pos[T] = {7, 8, 9, 10}, round[T] = {0, 0, 1, 1};
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < D; i++) {
                k[t][h][i] = (float)(100 * t + 10 * h + i) + 0.1f;
                v[t][h][i] = -(float)(100 * t + 10 * h + i) + 0.2f;
            }
    for (int dtype = KVB_F32; dtype <= KVB_F16; dtype++) {
        const size_t elt = dtype == KVB_F16 ? 2 : 4, rows = (size_t)T * D * elt;
        kvb_kv_rows dst[H];
        for (int h = 0; h < H; h++) {
            dst[h].k = dev_alloc(be, rows);
            dst[h].v = dev_alloc(be, rows);
            dst[h].pos = dev_alloc(be, T * sizeof(int32_t));
            dst[h].round = dev_alloc(be, T * sizeof(int32_t));
            dst[h].host = 0;
        }
        char err[256] = "";
        /* k, v, pos, round come from the device tier, as the engine's activations do */
        float *dk = dev_alloc(be, sizeof k), *dv = dev_alloc(be, sizeof v);
        int32_t *dpos = dev_alloc(be, sizeof pos), *dround = dev_alloc(be, sizeof round);
        mem_copy(be, dk, k, sizeof k);
        mem_copy(be, dv, v, sizeof v);
        mem_copy(be, dpos, pos, sizeof pos);
        mem_copy(be, dround, round, sizeof round);
        CU_ASSERT_EQUAL(be->kv_writer(be, H, D, (kvb_dtype)dtype, T, dst, dk, dv, dpos, dround, err, sizeof err), 0);
        int ok = 1;
        for (int h = 0; h < H; h++) {
            uint8_t kb[T * D * 4], vb[T * D * 4];
            int32_t p[T], r[T];
            mem_copy(be, kb, dst[h].k, rows);
            mem_copy(be, vb, dst[h].v, rows);
            mem_copy(be, p, dst[h].pos, sizeof p);
            mem_copy(be, r, dst[h].round, sizeof r);
            for (int t = 0; t < T; t++) {
                ok &= p[t] == pos[t] && r[t] == round[t];
                for (int i = 0; i < D; i++) {
                    const int j = t * D + i;
                    float kf, vf;
                    if (dtype == KVB_F16) {
                        kf = kvb_f16_to_f32(((kvb_f16 *)kb)[j]);
                        vf = kvb_f16_to_f32(((kvb_f16 *)vb)[j]);
                        ok &= ((kvb_f16 *)kb)[j] == kvb_f32_to_f16(k[t][h][i]);
                    } else {
                        memcpy(&kf, kb + 4 * j, 4);
                        memcpy(&vf, vb + 4 * j, 4);
                    }
                    const float tol = dtype == KVB_F16 ? 0.25f : 0.0f;
                    ok &= kf - k[t][h][i] <= tol && k[t][h][i] - kf <= tol;
                    ok &= vf - v[t][h][i] <= tol && v[t][h][i] - vf <= tol;
                }
            }
        }
        CU_ASSERT(ok);
        /* round NULL = 0 */
        CU_ASSERT_EQUAL(be->kv_writer(be, H, D, (kvb_dtype)dtype, T, dst, dk, dv, dpos, NULL, err, sizeof err), 0);
        int32_t r[T];
        mem_copy(be, r, dst[H - 1].round, sizeof r);
        CU_ASSERT(r[0] == 0 && r[T - 1] == 0);
        for (int h = 0; h < H; h++) {
            dev_free(be, dst[h].k, rows);
            dev_free(be, dst[h].v, rows);
            dev_free(be, dst[h].pos, T * sizeof(int32_t));
            dev_free(be, dst[h].round, T * sizeof(int32_t));
        }
        dev_free(be, dk, sizeof k);
        dev_free(be, dv, sizeof v);
        dev_free(be, dpos, sizeof pos);
        dev_free(be, dround, sizeof round);
    }
    kvb_backend_free(be);
}

/* ---- a long run stays bounded ---- */

static void test_memory_freed_and_reallocated_many_times_does_not_grow_rss(void) {
    kvb_backend *be = guarded();
    CU_ASSERT_FATAL(be != NULL);
    const size_t mib = 1 << 20, max_bytes = 24 * mib;
    uint8_t *src = malloc(max_bytes);
    CU_ASSERT_FATAL(src != NULL);
    memset(src, 7, max_bytes);
    /* a KV store's pattern: heads grow by a quarter (new block, copy, free the old), a small block beside
     * each, and the whole store is dropped and rebuilt (a new sample) */
    const long rss0 = rss_bytes();
    long rss_max = rss0;
    int failed = 0;
    for (int sample = 0; sample < 12; sample++) {
        size_t bytes = mib / 4;
        uint8_t *head = dev_alloc(be, bytes);
        int32_t *pos = dev_alloc(be, 4096);
        mem_copy(be, head, src, bytes);
        while (bytes * 5 / 4 <= max_bytes) {
            size_t grown = bytes * 5 / 4;
            uint8_t *next = dev_alloc(be, grown);
            int32_t *next_pos = dev_alloc(be, 4096);
            if (!next || !next_pos) { failed = 1; break; }
            mem_copy(be, next, head, bytes);
            mem_copy(be, next + bytes, src, grown - bytes);
            dev_free(be, head, bytes);
            dev_free(be, pos, 4096);
            head = next, pos = next_pos, bytes = grown;
            long r = rss_bytes();
            if (r > rss_max) rss_max = r;
        }
        dev_free(be, head, bytes);
        dev_free(be, pos, 4096);
    }
    const long rss1 = rss_bytes();
    CU_ASSERT(!failed);
    /* at most a head and its grown copy live at once (~54 MiB); the grown total is over 2 GiB */
    CU_ASSERT(rss_max - rss0 < (long)(80 * mib));
    CU_ASSERT(rss1 - rss0 < (long)(8 * mib));
    if (rss_max - rss0 >= (long)(80 * mib) || rss1 - rss0 >= (long)(8 * mib))
        fprintf(stderr, "rss: start %ld, peak %ld, end %ld bytes\n", rss0, rss_max, rss1);
    free(src);
    kvb_backend_free(be);
}

static void test_allocations_far_beyond_the_arena_reuse_its_addresses(void) {
    kvb_backend *be = guarded();
    CU_ASSERT_FATAL(be != NULL);
    /* 4096 x 64 MiB = 256 GiB handed out in turn: more than the arena reserves, so addresses must be reused */
    const size_t bytes = (size_t)64 << 20;
    int failed = 0;
    void *keep = dev_alloc(be, 12345); /* something below, so the top cannot simply fall back to 0 */
    for (int i = 0; i < 4096 && !failed; i++) {
        void *a = dev_alloc(be, bytes), *b = dev_alloc(be, bytes / 3);
        failed = !a || !b;
        dev_free(be, a, bytes);
        dev_free(be, b, bytes / 3);
    }
    CU_ASSERT(!failed);
    dev_free(be, keep, 12345);
    kvb_backend_free(be);
}

int main(void) {
    unsetenv("KVB_GUARD"); /* the tests choose: a guarded backend where they ask for one */
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("guard", NULL, NULL);
    CU_add_test(s, "an op writes and reads device memory", test_an_op_writes_and_reads_device_memory);
    CU_add_test(s, "host code touching device memory dies with SIGSEGV", test_host_code_touching_device_memory_dies_with_sigsegv);
    CU_add_test(s, "host-tier memory stays accessible", test_host_tier_memory_stays_accessible);
    CU_add_test(s, "device memory comes zeroed, also when reused", test_device_memory_comes_zeroed_also_when_reused);
    CU_add_test(s, "every op of the CPU backend runs guarded", test_every_op_of_the_cpu_backend_runs_guarded);
    CU_add_test(s, "an op calling another keeps the arena open", test_an_op_calling_another_keeps_the_arena_open);
    CU_add_test(s, "kv_writer stores f32 and f16 rows of every head", test_kv_writer_stores_f32_and_f16_rows_of_every_head);
    CU_add_test(s, "memory freed and reallocated many times does not grow RSS",
                test_memory_freed_and_reallocated_many_times_does_not_grow_rss);
    CU_add_test(s, "allocations far beyond the arena reuse its addresses",
                test_allocations_far_beyond_the_arena_reuse_its_addresses);
    return util_run_suites();
}
