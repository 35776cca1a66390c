/* datahint.c — the "dataset not found" hint (see datahint.h). */
#include "benchmarks/datahint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int kvb_data_sample_path(const char *benchmark, char *out, size_t cap) {
    static const char *const where[][2] = {{"longbench", "longbench/reconstructed_from_minilongbench"},
                                           {"longmemeval", "longmemeval/longmemeval_oracle.sample.json"},
                                           {"sharegpt", "sharegpt/sharegpt_v3_cleaned_split.top50_by_turns.json"},
                                           {"niah", "niah/PaulGrahamEssays"}};
    const char *src = getenv("KVB_SOURCE_DIR");
    char base[900];
    if (src && *src) snprintf(base, sizeof base, "%s/../shared/data", src);
    else snprintf(base, sizeof base, "../shared/data");
    out[0] = 0;
    for (size_t i = 0; i < sizeof where / sizeof *where; i++) {
        if (strcmp(benchmark, where[i][0])) continue;
        if ((size_t)snprintf(out, cap, "%s/%s", base, where[i][1]) >= cap || access(out, R_OK)) break;
        return 1;
    }
    out[0] = 0;
    return 0;
}

void kvb_data_hint(const char *benchmark, char *out, size_t cap) {
    char sample[1024];
    const char *data = getenv("KVB_DATA");
    int n = snprintf(out, cap, "scripts/fetch-datasets.sh fetches it into $KVB_DATA (%s)",
                     data && *data ? data : "unset: ~/.cache/kvbench/datasets");
    if (n > 0 && (size_t)n < cap && kvb_data_sample_path(benchmark, sample, sizeof sample))
        snprintf(out + n, cap - (size_t)n, "; sample records are beside the checkout in %s (kvbench run "
                 "configs/sample-data.json runs the quick suite on them)", sample);
}
