/* bench_attention.c — timing of cpu_attention for decode (and one causal prefill chunk).
 * Not a ctest; build by hand from the project root:
 *   gcc -std=c11 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE -O3 -march=native -I. \
 *       tests/bench_attention.c kernels/cpu/attention.c kernels/cpu/ops.c kernels/cpu/pool.c \
 *       -lpthread -lm -o bench_attention
 *   ./bench_attention [max_threads]
 * Prints ms per call and the K+V bytes read per second. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/dtype.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/pool.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void bench(const char *name, int n_head, int n_head_kv, int d, int64_t n_kv, int64_t n_q, kvb_dtype dt,
                  int max_threads) {
    const size_t es = dt == KVB_F16 ? 2 : 4;
    void *k[64], *v[64];
    int32_t *kpos[64];
    int64_t nkv[64];
    uint64_t seed = 88172645463325252ull;
    for (int g = 0; g < n_head_kv; g++) {
        k[g] = malloc(es * n_kv * d);
        v[g] = malloc(es * n_kv * d);
        kpos[g] = malloc(sizeof(int32_t) * n_kv);
        nkv[g] = n_kv;
        for (int64_t i = 0; i < n_kv * d; i++) {
            seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
            const float x = (float)((seed >> 40) & 0xffff) / 65536.0f - 0.5f;
            if (dt == KVB_F16) {
                ((uint16_t *)k[g])[i] = kvb_f32_to_f16(x);
                ((uint16_t *)v[g])[i] = kvb_f32_to_f16(-x);
            } else {
                ((float *)k[g])[i] = x;
                ((float *)v[g])[i] = -x;
            }
        }
        for (int64_t i = 0; i < n_kv; i++) kpos[g][i] = (int32_t)i;
    }
    float *q = malloc(sizeof(float) * n_q * n_head * d), *out = malloc(sizeof(float) * n_q * n_head * d);
    int32_t *qpos = malloc(sizeof(int32_t) * n_q);
    for (int64_t i = 0; i < n_q * n_head * d; i++) q[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
    for (int64_t t = 0; t < n_q; t++) qpos[t] = (int32_t)(n_kv - n_q + t);

    const double kv_bytes = 2.0 * (double)n_head_kv * (double)n_kv * d * (double)es;
    for (int nth = 1; nth <= max_threads; nth *= 2) {
        kvb_pool *pool = nth > 1 ? kvb_pool_create(nth) : NULL;
        cpu_attn_args a;
        memset(&a, 0, sizeof a);
        a.n_q = n_q, a.n_head = n_head, a.n_head_kv = n_head_kv, a.head_dim = d, a.q = q, a.q_pos = qpos;
        a.kv_dtype = dt, a.k = (const void *const *)k, a.v = (const void *const *)v;
        a.k_pos = (const int32_t *const *)kpos, a.n_kv = nkv, a.scale = 1.0f / sqrtf((float)d), a.out = out;
        a.ws_bytes = cpu_attention_ws_bytes(&a, nth);
        a.ws = malloc(a.ws_bytes);
        char err[256];
        if (cpu_attention(&a, pool, err, sizeof err)) {
            fprintf(stderr, "%s\n", err);
            exit(1);
        }
        int iters = 0;
        const double t0 = now_s();
        double t1 = t0;
        while (t1 - t0 < 1.0 || iters < 3) { /* about a second per line */
            cpu_attention(&a, pool, err, sizeof err);
            iters++;
            t1 = now_s();
        }
        const double ms = (t1 - t0) * 1e3 / iters;
        printf("%-34s threads %d: %8.3f ms/call  %7.2f GB/s of KV read\n", name, nth, ms, kv_bytes / (ms * 1e-3) / 1e9);
        free(a.ws);
        kvb_pool_free(pool);
    }
    for (int g = 0; g < n_head_kv; g++) free(k[g]), free(v[g]), free(kpos[g]);
    free(q), free(out), free(qpos);
}

int main(int argc, char **argv) {
    const int max_threads = argc > 1 ? atoi(argv[1]) : 2;
    bench("decode 9/3 d64 n_kv 8000 f16", 9, 3, 64, 8000, 1, KVB_F16, max_threads);
    bench("decode 9/3 d64 n_kv 8000 f32", 9, 3, 64, 8000, 1, KVB_F32, max_threads);
    bench("decode 32/8 d128 n_kv 32768 f16", 32, 8, 128, 32768, 1, KVB_F16, max_threads);
    bench("prefill 512q 9/3 d64 n_kv 8000 f16", 9, 3, 64, 8000, 512, KVB_F16, max_threads);
    return 0;
}
