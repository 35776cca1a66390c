/* serve_chart.h — what compression buys a server, as a chart: output tokens/s against the KV pool's size, one line
 * per method@budget (bench-serve given several --kv-pool-mib values; docs/serving.md). */
#ifndef KVB_SERVE_CHART_H
#define KVB_SERVE_CHART_H

#include <stddef.h>

/* The chart's SVG (malloc'd; NULL when out of memory) for n_series lines over n_pools pool sizes pool_mib[]:
 * tok_s[i * n_pools + k] is series i at pool k (NAN = no point). */
char *kvb_serve_chart_svg(const char *const *series, int n_series, const double *pool_mib, int n_pools,
                          const double *tok_s);
/* Write it to path (atomically): 0, or -1 + err. */
int kvb_serve_chart_write(const char *path, const char *const *series, int n_series, const double *pool_mib,
                          int n_pools, const double *tok_s, char *err, size_t err_len);

#endif
