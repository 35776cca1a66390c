/* stats.h — the statistics behind the report's cells: the mean and a seeded percentile-bootstrap 95%
 * interval of the mean. The PRNG is our own splitmix64 (Steele, Lea & Flood 2014), so an interval is the
 * same on every machine and libc: resample i of B draws n indices as splitmix64() % n from one stream
 * seeded with KVB_BOOT_SEED; the interval is the 2.5th and 97.5th percentiles (linear interpolation
 * between order statistics, "type 7") of the B resample means. */
#ifndef KVB_STATS_H
#define KVB_STATS_H

#include <stddef.h>
#include <stdint.h>

#define KVB_BOOT_RESAMPLES 1000
#define KVB_BOOT_SEED 0x6b7662656e6368ull /* "kvbench" in ASCII: fixed, so reports are deterministic */

/* Advance *state by one splitmix64 step and return the next 64-bit value. */
uint64_t kvb_splitmix64(uint64_t *state);
/* Arithmetic mean of v[0..n), summed in order in float64; NAN when n == 0. */
double kvb_stats_mean(const double *v, size_t n);
/* The p-quantile (0 <= p <= 1) of sorted[0..n) with linear interpolation ("type 7"); NAN when n == 0. */
double kvb_stats_quantile_sorted(const double *sorted, size_t n, double p);
/* 95% percentile bootstrap interval of the mean of v[0..n): n_resamples resamples drawn with a splitmix64
 * stream seeded with seed. n == 0 gives NAN bounds; constant data a zero-width interval. 0, or -1 when out
 * of memory. */
int kvb_stats_bootstrap_ci(const double *v, size_t n, int n_resamples, uint64_t seed, double *lo, double *hi);

#endif
