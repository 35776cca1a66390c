/* bench_attn_cpu.c — `kvbench bench-attention --backend cpu`: the CPU backend's decode attention (cpu_attention,
 * what every method's decode step calls) in GB/s of K and V read, over every slot and over a seeded index list,
 * beside a copy on the same thread pool measured in the same run. The CUDA build's GPU benchmark is
 * kernels/cuda/bench_attn.cu; the cases, the index lists and the GB/s are counted the same way. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/pool.h"
#include "kernels/dtype.h"

static const char *HELP =
    "usage: kvbench bench-attention --backend cpu [--ctx 8192,32768] [--batch 1] [--sparse 0.1] [--heads 32]\n"
    "                               [--kv-heads 8] [--head-dim 128] [--iters 20] [--threads N] [--rotate-mib 512]\n"
    "                               [--csv FILE]\n"
    "\n"
    "Decode attention (one query per sequence, f16 KV) on the CPU backend: microseconds per step (--batch\n"
    "sequences, one call each) and GB/s of K+V read, for full attention and for a --sparse index list per KV head\n"
    "(a seeded sorted subset of the slots, as on the GPU), beside a copy on the same threads measured in the same\n"
    "run (its GB/s counts bytes read + written). Steps rotate through KV caches of at least --rotate-mib in all,\n"
    "so no case reads from the CPU's caches. Checks the outputs of the first context against float64. Defaults\n"
    "are Llama-3-8B's shapes.\n"
    "\n"
    "options:\n"
    "  --ctx LIST       context lengths (default 8192,32768)\n"
    "  --batch LIST     sequences per step (default 1)\n"
    "  --sparse F       share of the slots in the index list, (0, 1] (default 0.1)\n"
    "  --heads N, --kv-heads N, --head-dim N   the shapes (default 32, 8, 128)\n"
    "  --iters N        timed steps per case (default 20; the best of them is kept)\n"
    "  --threads N      CPU threads (default: $KVB_THREADS, else the usable cores)\n"
    "  --rotate-mib N   KV bytes the steps rotate through, and the copy's size x 2 (default 512)\n"
    "  --csv FILE       also write the table as CSV\n";

enum { MAX_LIST = 16 };
static const double MAX_BYTES = 16.0 * 1073741824.0;

static int parse_list(const char *s, long *out) {
    int n = 0;
    while (*s) {
        char *end;
        const long v = strtol(s, &end, 10);
        if (end == s || v <= 0 || v > (1L << 30) || n == MAX_LIST || (*end && *end != ',')) return -1;
        out[n++] = v;
        s = *end ? end + 1 : end;
    }
    return n;
}

static uint64_t rng_state = 12345;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return rng_state;
}
static float unit(void) { return (float)((rnd() >> 40) & 0xFFFF) / 32768.0f - 1.0f; }

typedef struct {
    char *dst;
    const char *src;
    size_t n;
} copy_job;

static void copy_task(void *arg, int ith, int nth) {
    const copy_job *j = arg;
    long lo, hi;
    kvb_split((long)(j->n / 64), ith, nth, &lo, &hi); /* whole cache lines per thread; the tail with the last */
    const size_t a = (size_t)lo * 64, b = ith == nth - 1 ? j->n : (size_t)hi * 64;
    memcpy(j->dst + a, j->src + a, b - a);
}

/* GB/s (read + written) of the best of `iters` copies of `bytes` on the pool */
static double copy_gbs(kvb_pool *pool, size_t bytes, int iters) {
    copy_job j = {malloc(bytes), malloc(bytes), bytes};
    double best = INFINITY;
    if (j.dst && j.src) {
        memset(j.dst, 1, bytes), memset((char *)j.src, 2, bytes);
        for (int it = 0; it <= iters; it++) {
            const double t0 = cli_now();
            kvb_pool_run(pool, copy_task, &j);
            const double t = cli_now() - t0;
            if (it > 0 && t < best) best = t; /* the first copy warms up */
        }
    }
    free(j.dst), free((char *)j.src);
    return isfinite(best) ? 2.0 * (double)bytes / best / 1e9 : 0;
}

/* float64 attention of query head h over the slots in idx (NULL: all n), into out; max |out - got| */
static double check_head(const float *q, const kvb_f16 *k, const kvb_f16 *v, const int32_t *idx, long n, int D,
                         double scale, const float *got) {
    double m = -INFINITY, l = 0, *s = malloc((size_t)n * sizeof *s), *o = calloc((size_t)D, sizeof *o), worst = 0;
    if (!s || !o) {
        free(s), free(o);
        return INFINITY;
    }
    for (long i = 0; i < n; i++) {
        const long slot = idx ? idx[i] : i;
        double dot = 0;
        for (int e = 0; e < D; e++) dot += (double)q[e] * kvb_f16_to_f32(k[slot * D + e]);
        s[i] = dot * scale;
        m = s[i] > m ? s[i] : m;
    }
    for (long i = 0; i < n; i++) {
        const long slot = idx ? idx[i] : i;
        const double w = exp(s[i] - m);
        l += w;
        for (int e = 0; e < D; e++) o[e] += w * kvb_f16_to_f32(v[slot * D + e]);
    }
    for (int e = 0; e < D; e++) worst = fmax(worst, fabs(o[e] / l - got[e]));
    free(s), free(o);
    return worst;
}

int kvb_bench_attention_cpu(int argc, char **argv) {
    const char *ctx_s = "8192,32768", *batch_s = "1", *csv_path = NULL;
    double sparse = 0.1;
    int H = 32, HK = 8, D = 128, iters = 20, threads = 0, rotate_mib = 512;
    const char *backend = NULL; /* cpu: cmd_bench_attn.c has checked it and routed here */
    const cli_opt opts[] = {CLI_STR("--backend", &backend), CLI_STR("--ctx", &ctx_s), CLI_STR("--batch", &batch_s),
                            CLI_FLOAT("--sparse", &sparse, 1e-9, 1), CLI_INT("--heads", &H, 1, 1024),
                            CLI_INT("--kv-heads", &HK, 1, 1024), CLI_INT("--head-dim", &D, 1, 512),
                            CLI_INT("--iters", &iters, 1, 100000), CLI_INT("--threads", &threads, 1, 4096),
                            CLI_INT("--rotate-mib", &rotate_mib, 1, 1 << 16),
                            CLI_STR("--csv", &csv_path), CLI_END};
    const int stop = cli_parse("bench-attention", HELP, opts, 0, argc, argv, NULL);
    if (stop >= 0) return stop;
    long ctxs[MAX_LIST], batches[MAX_LIST];
    const int nc = parse_list(ctx_s, ctxs), nb = parse_list(batch_s, batches);
    if (nc <= 0) return cli_fail("bench-attention: --ctx expects a list of positive integers, got '%s'", ctx_s);
    if (nb <= 0) return cli_fail("bench-attention: --batch expects a list of positive integers, got '%s'", batch_s);
    if (H % HK) return cli_fail("bench-attention: --heads %d is not a multiple of --kv-heads %d", H, HK);
    FILE *csv = csv_path ? fopen(csv_path, "w") : NULL;
    if (csv_path && !csv) return cli_fail("bench-attention: cannot write %s", csv_path);
    kvb_pool *pool = kvb_pool_create(threads);
    const int nth = kvb_pool_size(pool);
    const double scale = 1.0 / sqrt((double)D);
    const double rotate = (double)rotate_mib * 1048576.0;
    const size_t copy_bytes = (size_t)rotate / 2;
    const double copy = copy_gbs(pool, copy_bytes, 5);
    printf("kvbench bench-attention: CPU backend, %d threads; %d query / %d KV heads, head_dim %d, f16 KV, best of %d "
           "steps per case\n", nth, H, HK, D, iters);
    printf("copy on the same threads: %.1f GB/s (read + written, %.1f MiB)\n", copy, copy_bytes / 1048576.0);
    printf("\n| ctx | batch | case | us/step | GB/s (K+V read) | %% of copy | %% of full's GB/s |\n"
           "|---:|---:|---|---:|---:|---:|---:|\n");
    if (csv) fprintf(csv, "ctx,batch,case,us,gbps,copy_gbps,pct_of_copy,pct_of_full\n");
    int rc = 0, checked = 0;
    char checks[512] = "";
    for (int ci = 0; ci < nc && !rc; ci++)
        for (int bi = 0; bi < nb && !rc; bi++) {
            const long ctx = ctxs[ci], B = batches[bi];
            const long n_sp = (long)(ctx * sparse + 0.5) > 0 ? (long)(ctx * sparse + 0.5) : 1;
            const double seq_bytes = (double)ctx * HK * D * 2 * 2; /* K and V of one sequence */
            const long copies = (long)ceil(rotate / (seq_bytes * B)) > 1 ? (long)ceil(rotate / (seq_bytes * B)) : 1;
            const long n_seq = copies * B;
            if (seq_bytes * n_seq > MAX_BYTES) {
                printf("| %ld | %ld | skipped: needs %.1f GiB | | | | |\n", ctx, B, seq_bytes * n_seq / 1073741824.0);
                continue;
            }
            kvb_f16 *kv = malloc((size_t)(seq_bytes * n_seq));
            float *q = malloc((size_t)H * D * sizeof *q), *out = malloc((size_t)H * D * sizeof *out);
            int32_t *idx = malloc((size_t)HK * n_sp * sizeof *idx);
            char *take = calloc((size_t)ctx, 1);
            if (!kv || !q || !out || !idx || !take) {
                free(kv), free(q), free(out), free(idx), free(take);
                rc = cli_fail("bench-attention: out of memory for %ld sequences of %ld tokens", n_seq, ctx);
                break;
            }
            const size_t head = (size_t)ctx * D; /* elements of one KV head's K (or V) */
            for (size_t i = 0; i < head * HK * 2 * (size_t)n_seq; i++) kv[i] = kvb_f32_to_f16(unit());
            for (int i = 0; i < H * D; i++) q[i] = unit();
            for (int g = 0; g < HK; g++) { /* a seeded sorted subset, as the GPU benchmark's */
                memset(take, 0, (size_t)ctx);
                for (long got = 0; got < n_sp;) {
                    const long s = (long)(rnd() % (uint64_t)ctx);
                    if (!take[s]) take[s] = 1, got++;
                }
                for (long s = 0, w = 0; s < ctx; s++)
                    if (take[s]) idx[(size_t)g * n_sp + w++] = (int32_t)s;
            }
            const void *kp[1024], *vp[1024];
            const int32_t *ip[1024];
            int64_t n_kv[1024], n_idx[1024];
            kvb_attn_args a = {.n_q = 1, .n_head = H, .n_head_kv = HK, .head_dim = D, .q = q, .kv_dtype = KVB_F16,
                               .k = kp, .v = vp, .n_kv = n_kv, .scale = (float)scale, .out = out};
            for (int g = 0; g < HK; g++) ip[g] = idx + (size_t)g * n_sp, n_idx[g] = n_sp, n_kv[g] = ctx;
            size_t ws_bytes = cpu_attention_ws_bytes(&a, nth); /* the larger of the two cases' */
            a.idx = ip, a.n_idx = n_idx;
            if (cpu_attention_ws_bytes(&a, nth) > ws_bytes) ws_bytes = cpu_attention_ws_bytes(&a, nth);
            void *ws = malloc(ws_bytes ? ws_bytes : 1);
            a.ws = ws, a.ws_bytes = ws_bytes;
            double full_gbs = 0;
            char err[256];
            for (int sp = 0; sp < 2 && !rc; sp++) {
                a.idx = sp ? ip : NULL, a.n_idx = sp ? n_idx : NULL;
                double best = INFINITY;
                for (long it = -1, next = 0; it < iters && !rc; it++) { /* it -1 warms up */
                    const double t0 = cli_now();
                    for (long b = 0; b < B && !rc; b++, next = (next + 1) % n_seq) {
                        const kvb_f16 *base = kv + (size_t)next * head * HK * 2;
                        for (int g = 0; g < HK; g++) kp[g] = base + (size_t)g * head, vp[g] = base + (size_t)(HK + g) * head;
                        if (cpu_attention(&a, pool, err, sizeof err)) rc = cli_fail("bench-attention: %s", err);
                    }
                    const double t = cli_now() - t0;
                    if (it >= 0 && t < best) best = t;
                }
                if (rc) break;
                if (!checked) { /* the last call's KV head 0 group against float64 */
                    double worst = 0;
                    for (int h = 0; h < H / HK; h++)
                        worst = fmax(worst, check_head(q + (size_t)h * D, kp[0], vp[0], sp ? idx : NULL, sp ? n_sp : ctx, D,
                                                       scale, out + (size_t)h * D));
                    const int ok = worst <= 1e-4;
                    const size_t at = strlen(checks);
                    snprintf(checks + at, sizeof checks - at,
                             "check: %s at %ld tokens, KV head 0's query heads vs float64: max |error| %.2e %s\n",
                             sp ? "index list" : "full", ctx, worst, ok ? "ok" : "FAIL");
                    if (!ok) rc = 1;
                    checked = sp;
                }
                const double us = best * 1e6, gbs = (double)B * (sp ? n_sp : ctx) * HK * D * 2 * 2 / best / 1e9;
                if (!sp) full_gbs = gbs;
                char kase[32], pct_full[16] = "";
                snprintf(kase, sizeof kase, sp ? "index list %g%%" : "full", sparse * 100);
                if (sp) snprintf(pct_full, sizeof pct_full, "%.0f", 100.0 * gbs / full_gbs);
                printf("| %ld | %ld | %s | %.1f | %.1f | %.0f | %s |\n", ctx, B, kase, us, gbs, 100.0 * gbs / copy, pct_full);
                if (csv)
                    fprintf(csv, "%ld,%ld,%s,%.3f,%.2f,%.2f,%.1f,%s\n", ctx, B, sp ? "sparse" : "full", us, gbs, copy,
                            100.0 * gbs / copy, pct_full);
            }
            free(kv), free(q), free(out), free(idx), free(take), free(ws);
        }
    printf("\n%s", checks);
    printf("\nGB/s counts the K and V bytes each step reads (visible tokens x head_dim x 2 bytes x 2); the copy's\n"
           "counts bytes read and written. The index list reads scattered rows, which the hardware's stream\n"
           "prefetch does not find: cpu_attention prefetches them (kernels/cpu/attention.c).\n");
    if (csv && fclose(csv)) rc = cli_fail("bench-attention: cannot write %s", csv_path);
    kvb_pool_free(pool);
    return rc;
}
