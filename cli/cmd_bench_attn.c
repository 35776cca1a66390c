/* cmd_bench_attn.c — `kvbench bench-attention`: the GPU decode-attention benchmark (kernels/cuda/bench_attn.cu). */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

#ifdef KVB_HAVE_CUDA
int kvb_bench_attention_main(int argc, char **argv);
#endif

int cmd_bench_attn(int argc, char **argv) {
#ifdef KVB_HAVE_CUDA
    return kvb_bench_attention_main(argc, argv);
#else
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            puts("usage: kvbench bench-attention [options]: decode attention GB/s on the GPU (needs a CUDA build)");
            return 0;
        }
    return cli_fail("bench-attention: no GPU: this build has no CUDA backend (nvcc was not found at configure time)"), 1;
#endif
}
