/* stats.c — mean and seeded percentile-bootstrap interval (see stats.h for the exact procedure). */
#include "reports/stats.h"

#include <math.h>
#include <stdlib.h>

uint64_t kvb_splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double kvb_stats_mean(const double *v, size_t n) {
    if (!n) return NAN;
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += v[i];
    return sum / (double)n;
}

double kvb_stats_quantile_sorted(const double *sorted, size_t n, double p) {
    if (!n) return NAN;
    double h = p * (double)(n - 1);
    size_t k = (size_t)floor(h);
    if (k + 1 >= n) return sorted[n - 1];
    return sorted[k] + (h - (double)k) * (sorted[k + 1] - sorted[k]);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int kvb_stats_bootstrap_ci(const double *v, size_t n, int n_resamples, uint64_t seed, double *lo, double *hi) {
    *lo = *hi = NAN;
    if (!n || n_resamples < 1) return 0;
    double *means = malloc((size_t)n_resamples * sizeof *means);
    if (!means) return -1;
    uint64_t state = seed;
    for (int b = 0; b < n_resamples; b++) {
        double sum = 0;
        for (size_t i = 0; i < n; i++) sum += v[kvb_splitmix64(&state) % (uint64_t)n];
        means[b] = sum / (double)n;
    }
    qsort(means, (size_t)n_resamples, sizeof *means, cmp_double);
    *lo = kvb_stats_quantile_sorted(means, (size_t)n_resamples, 0.025);
    *hi = kvb_stats_quantile_sorted(means, (size_t)n_resamples, 0.975);
    free(means);
    return 0;
}
