/* cmd_bench_attn.c — `kvbench bench-attention`: decode attention GB/s on the GPU (kernels/cuda/bench_attn.cu) or,
 * with --backend cpu, on the CPU backend (cli/bench_attn_cpu.c). */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

#ifdef KVB_HAVE_CUDA
int kvb_bench_attention_main(int argc, char **argv);
#endif
int kvb_bench_attention_cpu(int argc, char **argv);

/* the value of --backend (NULL when absent: the GPU's where this build has one, else the CPU's) */
static const char *backend_arg(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--backend")) return argv[i + 1];
    return NULL;
}

int cmd_bench_attn(int argc, char **argv) {
    const char *be = backend_arg(argc, argv);
    if (be && strcmp(be, "cpu") && strcmp(be, "cuda"))
        return cli_fail("bench-attention: --backend expects cpu or cuda, got '%s'", be);
#ifdef KVB_HAVE_CUDA
    if (!be || !strcmp(be, "cuda")) {
        int n = 0; /* the GPU benchmark's own parser does not take --backend */
        for (int i = 0; i < argc; i++) {
            if (be && !strcmp(argv[i], "--backend")) {
                i++;
                continue;
            }
            argv[n++] = argv[i];
        }
        return kvb_bench_attention_main(n, argv);
    }
#else
    if (be && !strcmp(be, "cuda"))
        return cli_fail("bench-attention: no GPU: this build has no CUDA backend (nvcc was not found at configure time)");
#endif
    return kvb_bench_attention_cpu(argc, argv);
}
