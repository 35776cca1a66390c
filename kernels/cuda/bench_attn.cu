/* bench_attn.cu — `kvbench bench-attention`: decode attention bandwidth on the GPU against a device-to-device
 * copy measured in the same run, and against PyTorch's scaled_dot_product_attention when python3 has torch.
 *
 * Shapes default to Llama-3-8B (32 query heads, 8 KV heads, head_dim 128, f16 KV). A batch of B sequences is
 * B x more KV heads in one call (query head h reads KV head h / group, so each sequence keeps its own group).
 * Cases: full (every slot) and sparse (a seeded sorted index list of --sparse of the slots per KV head). GB/s
 * counts the K and V bytes the call must read; the copy counts bytes read + written. Before timing, one KV
 * head of the first shape is checked against a float64 reference on the host. */
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/flashinfer.h"

/* decode kernels v1..v4, each timed and checked, and 5 = FlashInfer (flashinfer.h) where this build has it */
enum { BENCH_KERNELS = 5 };
static int n_kernels(void) { return kvb_fi_compiled() ? 5 : 4; }
/* a kernel's case name: full, full_v2 .. full_v4, full_fi */
static void case_name(char *kase, size_t n, int sparse, int kv) {
    const char *c = sparse ? "sparse" : "full";
    if (kv == 1) snprintf(kase, n, "%s", c);
    else if (kv == 5) snprintf(kase, n, "%s_fi", c);
    else snprintf(kase, n, "%s_v%d", c, kv);
}
/* the bound of the float64 check and of the agreement with v1: FlashInfer writes f16 outputs (2^-11 relative) */
static double agree_tol(int kv) { return kv == 5 ? 1e-3 : 1e-5; }

#define CKB(call)                                                                                        \
    do {                                                                                                 \
        cudaError_t e_ = (call);                                                                         \
        if (e_ != cudaSuccess) {                                                                         \
            fprintf(stderr, "kvbench: bench-attention: %s: %s\n", #call, cudaGetErrorString(e_));        \
            return 1;                                                                                    \
        }                                                                                                \
    } while (0)

__global__ void k_fill_half(__half *x, size_t n, uint64_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = (i + seed) * 0x9E3779B97F4A7C15ull;
        z ^= z >> 31; z *= 0xBF58476D1CE4E5B9ull; z ^= z >> 29;
        x[i] = __float2half((float)((z >> 40) & 0xFFFF) / 32768.0f - 1.0f);
    }
}

typedef struct {
    const char *ctx_list, *batch_list;
    double sparse;
    int heads, kv_heads, head_dim, iters, torch;
    const char *csv;
} opts;

static uint64_t rng_state = 12345;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
    return rng_state;
}

static int parse_list(const char *s, long *out, int cap) {
    int n = 0;
    while (*s && n < cap) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v <= 0) return -1;
        out[n++] = v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

/* torch timings from scripts/bench_sdpa.py: lines "ctx batch case us" */
typedef struct { long ctx, batch; char kase[16]; double us; } torch_row;

static int run_torch(const opts *o, torch_row *rows, int cap) {
    const char *src = getenv("KVB_SOURCE_DIR");
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "python3 %s/scripts/bench_sdpa.py --ctx %s --batch %s --sparse %g --heads %d --kv-heads %d --head-dim %d "
             "--iters %d 2>/dev/null",
             src && *src ? src : ".", o->ctx_list, o->batch_list, o->sparse, o->heads, o->kv_heads, o->head_dim, o->iters);
    FILE *p = popen(cmd, "r");
    if (!p) return 0;
    int n = 0;
    char line[256];
    while (fgets(line, sizeof line, p) && n < cap) {
        torch_row r;
        if (sscanf(line, "%ld %ld %15s %lf", &r.ctx, &r.batch, r.kase, &r.us) == 4) rows[n++] = r;
    }
    pclose(p);
    return n;
}

static double torch_us(const torch_row *rows, int n, long ctx, long batch, const char *kase) {
    for (int i = 0; i < n; i++)
        if (rows[i].ctx == ctx && rows[i].batch == batch && !strcmp(rows[i].kase, kase)) return rows[i].us;
    return 0;
}

static const char *HELP =
    "usage: kvbench bench-attention [--ctx 8192,32768,65536,131072] [--batch 1,8] [--sparse 0.1] [--heads 32]\n"
    "                               [--kv-heads 8] [--head-dim 128] [--iters 50] [--torch auto|off] [--csv FILE]\n"
    "\n"
    "Decode attention (one query per sequence, f16 KV) on the GPU: microseconds per call and GB/s of K+V read,\n"
    "for full attention and for a --sparse index list per KV head, beside a device-to-device copy measured in the\n"
    "same run (its GB/s counts bytes read + written) and, when python3 can import torch with CUDA, PyTorch's\n"
    "scaled_dot_product_attention on the same shapes (sparse: index_select gather + SDPA). Target: >= 75% of the\n"
    "copy bandwidth at >= 32K tokens, and not slower than PyTorch. Defaults are Llama-3-8B's shapes.\n"
    "--backend cpu measures the CPU backend's attention instead (kvbench bench-attention --backend cpu --help).\n";

extern "C" int kvb_bench_attention_main(int argc, char **argv) {
    opts o = {"8192,32768,65536,131072", "1,8", 0.1, 32, 8, 128, 50, 1, NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { fputs(HELP, stdout); return 0; }
        if (i + 1 >= argc) { fprintf(stderr, "kvbench: bench-attention: %s needs a value (see --help)\n", a); return 2; }
        const char *v = argv[++i];
        if (!strcmp(a, "--ctx")) o.ctx_list = v;
        else if (!strcmp(a, "--batch")) o.batch_list = v;
        else if (!strcmp(a, "--sparse")) o.sparse = atof(v);
        else if (!strcmp(a, "--heads")) o.heads = atoi(v);
        else if (!strcmp(a, "--kv-heads")) o.kv_heads = atoi(v);
        else if (!strcmp(a, "--head-dim")) o.head_dim = atoi(v);
        else if (!strcmp(a, "--iters")) o.iters = atoi(v);
        else if (!strcmp(a, "--torch")) o.torch = strcmp(v, "off") != 0;
        else if (!strcmp(a, "--csv")) o.csv = v;
        else { fprintf(stderr, "kvbench: bench-attention: unknown option '%s' (see --help)\n", a); return 2; }
    }
    long ctxs[16], batches[16];
    int nc = parse_list(o.ctx_list, ctxs, 16), nb = parse_list(o.batch_list, batches, 16);
    if (nc <= 0 || nb <= 0 || !(o.sparse > 0 && o.sparse <= 1) || o.heads <= 0 || o.kv_heads <= 0 ||
        o.heads % o.kv_heads || o.head_dim < 1 || o.head_dim > 256 || o.iters < 1) {
        fprintf(stderr, "kvbench: bench-attention: bad shapes or lists (see --help)\n");
        return 2;
    }
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        fprintf(stderr, "kvbench: bench-attention: no GPU: no CUDA device is usable (%s); --backend cpu measures the CPU\n", e ? cudaGetErrorString(e) : "no devices");
        return 1;
    }
    cudaDeviceProp prop;
    CKB(cudaGetDeviceProperties(&prop, 0));
    printf("kvbench bench-attention: %s, %d SMs; %d query / %d KV heads, head_dim %d, f16 KV, %d iterations per point\n",
           prop.name, prop.multiProcessorCount, o.heads, o.kv_heads, o.head_dim, o.iters);
    printf("target: >= 75%% of copy bandwidth at >= 32K tokens, and not slower than PyTorch SDPA\n");
    if (kvb_cuda_attn_prefetch()) /* the candidate: the _v4 rows (and FlashInfer's v4 fallback) prefetch */
        printf("v4 prefetches each warp's tile %d turns ahead into L2 (KVB_ATTN_PREFETCH=%d, a candidate)\n",
               kvb_cuda_attn_prefetch(), kvb_cuda_attn_prefetch());
    torch_row trows[256];
    int nt = 0;
    if (o.torch) {
        nt = run_torch(&o, trows, 256);
        if (nt) printf("PyTorch: scripts/bench_sdpa.py ran (%d points)\n", nt);
        else printf("PyTorch: not available (python3 cannot import torch with CUDA)\n");
    }
    FILE *csv = o.csv ? fopen(o.csv, "w") : NULL;
    if (o.csv && !csv) { fprintf(stderr, "kvbench: bench-attention: cannot write %s\n", o.csv); return 1; }
    if (csv) fprintf(csv, "ctx,batch,case,us,gbps,copy_gbps,pct_of_copy,torch_us,speedup_vs_torch\n");
    printf("\n| ctx | batch | case | us/call | GB/s (K+V read) | %% of copy | torch us | vs torch |\n|---:|---:|---|---:|---:|---:|---:|---:|\n");
    cudaStream_t st;
    CKB(cudaStreamCreate(&st));
    cudaEvent_t e0, e1;
    CKB(cudaEventCreate(&e0));
    CKB(cudaEventCreate(&e1));
    int checked = 0, rc = 0;
    const int D = o.head_dim;
    for (int bi = 0; bi < nb; bi++)
        for (int ci = 0; ci < nc; ci++) {
            const long B = batches[bi], ctx = ctxs[ci];
            const int HK = (int)(B * o.kv_heads), HQ = (int)(B * o.heads);
            const size_t head_bytes = (size_t)ctx * D * sizeof(__half), kv_bytes = 2 * head_bytes * HK;
            size_t fr = 0, tot = 0;
            cudaMemGetInfo(&fr, &tot);
            if (kv_bytes + head_bytes * HK + (256u << 20) > fr) {
                printf("| %ld | %ld | skipped: needs %.1f GiB, %.1f GiB free | | | | | |\n", ctx, B,
                       (kv_bytes + head_bytes * HK) / 1073741824.0, fr / 1073741824.0);
                continue;
            }
            __half *K, *V, *scratch;
            float *q, *out, *ws;
            CKB(cudaMalloc((void **)&K, head_bytes * HK));
            CKB(cudaMalloc((void **)&V, head_bytes * HK));
            CKB(cudaMalloc((void **)&scratch, head_bytes * HK));
            CKB(cudaMalloc((void **)&q, (size_t)HQ * D * 4));
            CKB(cudaMalloc((void **)&out, (size_t)HQ * D * 4));
            k_fill_half<<<1024, 256, 0, st>>>(K, (size_t)ctx * D * HK, 1);
            k_fill_half<<<1024, 256, 0, st>>>(V, (size_t)ctx * D * HK, 2);
            {
                float *hq = (float *)malloc((size_t)HQ * D * 4);
                for (int i = 0; i < HQ * D; i++) hq[i] = (float)((rnd() >> 40) & 0xFFFF) / 32768.0f - 1.0f;
                CKB(cudaMemcpy(q, hq, (size_t)HQ * D * 4, cudaMemcpyHostToDevice));
                free(hq);
            }
            /* per-head arrays: [k][v][n_kv][idx][n_idx] */
            const long n_sp = (long)(ctx * o.sparse + 0.5) > 0 ? (long)(ctx * o.sparse + 0.5) : 1;
            int32_t *idx_all;
            CKB(cudaMalloc((void **)&idx_all, (size_t)n_sp * HK * 4));
            {
                int32_t *h = (int32_t *)malloc((size_t)n_sp * HK * 4);
                char *take = (char *)malloc((size_t)ctx);
                for (int g = 0; g < HK; g++) { /* a seeded sorted subset */
                    memset(take, 0, (size_t)ctx);
                    long got = 0;
                    while (got < n_sp) {
                        long s = (long)(rnd() % (uint64_t)ctx);
                        if (!take[s]) { take[s] = 1; got++; }
                    }
                    long w = 0;
                    for (long s = 0; s < ctx; s++)
                        if (take[s]) h[(size_t)g * n_sp + w++] = (int32_t)s;
                }
                CKB(cudaMemcpy(idx_all, h, (size_t)n_sp * HK * 4, cudaMemcpyHostToDevice));
                free(h);
                free(take);
            }
            uint64_t *harr = (uint64_t *)calloc((size_t)HK * 6, 8), *darr;
            for (int g = 0; g < HK; g++) {
                harr[0 * HK + g] = (uint64_t)(uintptr_t)((char *)K + head_bytes * g);
                harr[1 * HK + g] = (uint64_t)(uintptr_t)((char *)V + head_bytes * g);
                harr[2 * HK + g] = (uint64_t)ctx;
                harr[3 * HK + g] = (uint64_t)(uintptr_t)(idx_all + (size_t)g * n_sp);
                harr[4 * HK + g] = (uint64_t)n_sp;
            }
            CKB(cudaMalloc((void **)&darr, (size_t)HK * 6 * 8));
            CKB(cudaMemcpy(darr, harr, (size_t)HK * 6 * 8, cudaMemcpyHostToDevice));
            free(harr);
            kvb_cuda_attn a;
            memset(&a, 0, sizeof a);
            a.n_q = 1; a.n_head = HQ; a.n_head_kv = HK; a.head_dim = D; a.q = q; a.kv_f16 = 1;
            a.k = (const void *const *)(darr + 0 * HK);
            a.v = (const void *const *)(darr + 1 * HK);
            a.n_kv = (const int64_t *)(darr + 2 * HK);
            a.scale = 1.0f / sqrtf((float)D);
            a.out = out;
            kvb_cuda_attn sp = a;
            sp.idx = (const int32_t *const *)(darr + 3 * HK);
            sp.n_idx = (const int64_t *)(darr + 4 * HK);
            a.max_len = ctx;
            sp.max_len = n_sp;
            /* the same words on the host, in attention.h's host_heads order, so FlashInfer plans without a read-back */
            uint64_t *hh = (uint64_t *)calloc((size_t)HK * 12, 8);
            for (int g = 0; g < HK; g++)
                for (int c = 0; c < 2; c++) {
                    uint64_t *w = hh + (size_t)c * 6 * HK;
                    w[0 * HK + g] = (uint64_t)(uintptr_t)((char *)K + head_bytes * g);
                    w[1 * HK + g] = (uint64_t)(uintptr_t)((char *)V + head_bytes * g);
                    w[3 * HK + g] = (uint64_t)ctx;
                    w[4 * HK + g] = c ? (uint64_t)(uintptr_t)(idx_all + (size_t)g * n_sp) : 0;
                    w[5 * HK + g] = c ? (uint64_t)n_sp : 0;
                }
            a.host_heads = hh;
            sp.host_heads = hh + 6 * HK;
            size_t wsb = 0;
            for (int kv = 0; kv <= 5; kv += 5) { /* the switch's kernel, and FlashInfer's workspace */
                kvb_cuda_attn x = a, y = sp;
                x.kernel = y.kernel = kv;
                if (kvb_cuda_attention_ws(&x) > wsb) wsb = kvb_cuda_attention_ws(&x);
                if (kvb_cuda_attention_ws(&y) > wsb) wsb = kvb_cuda_attention_ws(&y);
            }
            CKB(cudaMalloc((void **)&ws, wsb));
            char err[256];
            for (int kv = 1; kv <= n_kernels() && !checked; kv++) { /* head 0 .. group against float64, each kernel */
                a.kernel = kv;
                long long served0, served1;
                kvb_fi_counts(&served0, NULL);
                if (kvb_cuda_attention(&a, ws, wsb, st, err, sizeof err)) { fprintf(stderr, "kvbench: bench-attention: %s\n", err); return 1; }
                kvb_fi_counts(&served1, NULL);
                if (kv == 5 && served1 == served0) { /* FlashInfer refused: the row would time v4 */
                    printf("check: FlashInfer refused this layout: %s\n", kvb_fi_last_refusal());
                    rc = 1;
                }
                CKB(cudaStreamSynchronize(st));
                const int G = o.heads / o.kv_heads;
                __half *hk = (__half *)malloc(head_bytes), *hv = (__half *)malloc(head_bytes);
                float *hq = (float *)malloc((size_t)G * D * 4), *ho = (float *)malloc((size_t)G * D * 4);
                CKB(cudaMemcpy(hk, K, head_bytes, cudaMemcpyDeviceToHost));
                CKB(cudaMemcpy(hv, V, head_bytes, cudaMemcpyDeviceToHost));
                CKB(cudaMemcpy(hq, q, (size_t)G * D * 4, cudaMemcpyDeviceToHost));
                CKB(cudaMemcpy(ho, out, (size_t)G * D * 4, cudaMemcpyDeviceToHost));
                double worst = 0;
                double *s = (double *)malloc((size_t)ctx * sizeof(double));
                for (int h = 0; h < G; h++) {
                    double m = -INFINITY, l = 0;
                    for (long j = 0; j < ctx; j++) {
                        double d = 0;
                        for (int i = 0; i < D; i++) d += (double)hq[h * D + i] * __half2float(hk[(size_t)j * D + i]);
                        s[j] = d * a.scale;
                        if (s[j] > m) m = s[j];
                    }
                    for (long j = 0; j < ctx; j++) l += exp(s[j] - m);
                    for (int i = 0; i < D; i++) {
                        double acc = 0;
                        for (long j = 0; j < ctx; j++) acc += exp(s[j] - m) / l * __half2float(hv[(size_t)j * D + i]);
                        if (fabs(acc - ho[h * D + i]) > worst) worst = fabs(acc - ho[h * D + i]);
                    }
                }
                free(s); free(hk); free(hv); free(hq); free(ho);
                char kname[16];
                snprintf(kname, sizeof kname, kv == 5 ? "FlashInfer" : "v%d", kv);
                printf("check: kernel %s, KV head 0 at %ld tokens vs float64: max |error| %.2e %s\n", kname, ctx, worst,
                       worst < 1e-3 ? "(ok)" : "(WRONG)");
                if (worst >= 1e-3) rc = 1;
                if (kv == n_kernels()) checked = 1;
            }
            a.kernel = 0;
            if (rc) break;
            /* copy reference */
            for (int w = 0; w < 3; w++) CKB(cudaMemcpyAsync(scratch, K, head_bytes * HK, cudaMemcpyDeviceToDevice, st));
            CKB(cudaEventRecord(e0, st));
            for (int it = 0; it < o.iters; it++) CKB(cudaMemcpyAsync(scratch, K, head_bytes * HK, cudaMemcpyDeviceToDevice, st));
            CKB(cudaEventRecord(e1, st));
            CKB(cudaEventSynchronize(e1));
            float ms;
            CKB(cudaEventElapsedTime(&ms, e0, e1));
            const double copy_gbps = 2.0 * head_bytes * HK / (ms / o.iters * 1e-3) / 1e9;
            printf("| %ld | %ld | copy (read+write) | %.1f | %.0f | 100 | | |\n", ctx, B, ms / o.iters * 1e3, copy_gbps);
            if (csv) fprintf(csv, "%ld,%ld,copy,%.3f,%.1f,%.1f,100,,\n", ctx, B, ms / o.iters * 1e3, copy_gbps, copy_gbps);
            for (int cv = 0; cv < 2 * n_kernels(); cv++) { /* full, full_v2, ..., full_fi, sparse, sparse_v2, ... */
                const int c = cv / n_kernels(), kv = 1 + cv % n_kernels();
                kvb_cuda_attn xk = c ? sp : a;
                xk.kernel = kv;
                const kvb_cuda_attn *x = &xk;
                char kase[16];
                case_name(kase, sizeof kase, c, kv);
                for (int w = 0; w < 3; w++)
                    if (kvb_cuda_attention(x, ws, wsb, st, err, sizeof err)) { fprintf(stderr, "kvbench: bench-attention: %s\n", err); return 1; }
                CKB(cudaEventRecord(e0, st));
                for (int it = 0; it < o.iters; it++) kvb_cuda_attention(x, ws, wsb, st, err, sizeof err);
                CKB(cudaEventRecord(e1, st));
                CKB(cudaEventSynchronize(e1));
                CKB(cudaEventElapsedTime(&ms, e0, e1));
                const double us = ms / o.iters * 1e3;
                const double bytes = 2.0 * (c ? n_sp : ctx) * D * sizeof(__half) * HK;
                const double gbps = bytes / (us * 1e-6) / 1e9;
                const double tu = torch_us(trows, nt, ctx, B, c ? "sparse" : "full");
                char tcol[32] = "-", vcol[32] = "-";
                if (tu > 0) { snprintf(tcol, sizeof tcol, "%.1f", tu); snprintf(vcol, sizeof vcol, "%.2fx", tu / us); }
                printf("| %ld | %ld | %s%s | %.1f | %.0f | %.0f | %s | %s |\n", ctx, B, kase,
                       c ? (o.sparse == 0.1 ? " 10%" : "") : "", us, gbps, 100.0 * gbps / copy_gbps, tcol, vcol);
                if (csv) fprintf(csv, "%ld,%ld,%s,%.3f,%.1f,%.1f,%.1f,%s,%s\n", ctx, B, kase, us, gbps, copy_gbps,
                                 100.0 * gbps / copy_gbps, tu > 0 ? tcol : "", tu > 0 ? vcol : "");
                fflush(stdout);
            }
            { /* every kernel against v1 at this point, dense and sparse (float64 checked v1 at the first point) */
                const size_t on = (size_t)HQ * D;
                float *o1 = (float *)malloc(on * 4), *ok = (float *)malloc(on * 4);
                double worst[2][BENCH_KERNELS] = {{0}};
                for (int c = 0; c < 2 && o1 && ok; c++)
                    for (int kv = 1; kv <= n_kernels(); kv++) {
                        kvb_cuda_attn xk = c ? sp : a;
                        xk.kernel = kv;
                        if (kvb_cuda_attention(&xk, ws, wsb, st, err, sizeof err)) { fprintf(stderr, "kvbench: bench-attention: %s\n", err); return 1; }
                        CKB(cudaStreamSynchronize(st));
                        CKB(cudaMemcpy(kv == 1 ? o1 : ok, out, on * 4, cudaMemcpyDeviceToHost));
                        if (kv == 1) continue;
                        for (size_t i = 0; i < on; i++) {
                            const double d = fabs((double)ok[i] - o1[i]);
                            if (d > worst[c][kv - 2] || d != d) worst[c][kv - 2] = d != d ? INFINITY : d;
                        }
                    }
                int agree = 1;
                printf("agree at %ld x %ld: max |vK - v1|, dense / 10%% list:", ctx, B);
                for (int kv = 2; kv <= n_kernels(); kv++) {
                    if (kv == 5) printf(" FlashInfer %.1e / %.1e", worst[0][kv - 2], worst[1][kv - 2]);
                    else printf(" v%d %.1e / %.1e", kv, worst[0][kv - 2], worst[1][kv - 2]);
                    agree &= worst[0][kv - 2] < agree_tol(kv) && worst[1][kv - 2] < agree_tol(kv);
                }
                printf("%s\n", agree ? "" : " (DIFFER)");
                if (!agree) rc = 1;
                free(o1), free(ok);
            }
            cudaFree(K); cudaFree(V); cudaFree(scratch); cudaFree(q); cudaFree(out); cudaFree(ws); cudaFree(darr);
            free(hh);
            cudaFree(idx_all);
        }
    if (csv) fclose(csv);
    printf("\nGB/s counts the K and V bytes each call reads (visible tokens x head_dim x 2 bytes x 2); the copy's\n"
           "counts bytes read + written. One run; each point is the mean of --iters back-to-back calls. _v2 rows: the\n"
           "double-buffered tiled kernel (KVB_ATTN_KERNEL=2); _v3 rows: the register-only kernel (KVB_ATTN_KERNEL=3);\n"
           "_v4 rows: the tensor-core decode kernel (KVB_ATTN_KERNEL=4); _fi rows: FlashInfer's paged decode\n"
           "(KVB_ATTN_KERNEL=5, page size 1, f16 output; its agreement with v1 is held to 1e-3, the others' to 1e-5).\n");
    return rc;
}
