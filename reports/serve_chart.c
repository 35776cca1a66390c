/* serve_chart.c — output tokens/s vs KV pool size per method (serve_chart.h). */
#include "reports/serve_chart.h"

#include <math.h>
#include <stdlib.h>

#include "base/fsutil.h"
#include "kernels/backend.h" /* kvb_errf */
#include "reports/svg.h"

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

char *kvb_serve_chart_svg(const char *const *series, int n_series, const double *pool_mib, int n_pools,
                          const double *tok_s) {
    kvb_svg_series *se = calloc((size_t)n_series + 1, sizeof *se);
    if (!se) return NULL;
    for (int i = 0; i < n_series; i++) se[i] = (kvb_svg_series){series[i], pool_mib, tok_s + (size_t)i * n_pools, n_pools, NAN};
    kvb_svg_chart ch = {"Output tokens/s vs KV pool size (bench-serve)", "KV pool (MiB)", "output tokens/s", 0, NAN, NAN,
                        0, NAN, se, n_series};
    char *svg = kvb_svg_line_chart(&ch);
    free(se);
    return svg;
}

int kvb_serve_chart_write(const char *path, const char *const *series, int n_series, const double *pool_mib,
                          int n_pools, const double *tok_s, char *err, size_t err_len) {
    char *svg = kvb_serve_chart_svg(series, n_series, pool_mib, n_pools, tok_s);
    if (!svg) return ERR("%s: out of memory", path);
    int rc = kvb_write_file_atomic(path, svg, err, err_len);
    free(svg);
    return rc ? -1 : 0;
}
