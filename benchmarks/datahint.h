/* datahint.h — what to say when a suite's dataset is missing. Datasets live under $KVB_DATA (default
 * ~/.cache/kvbench/datasets, filled by scripts/fetch-datasets.sh); a development checkout may also have
 * sample records beside it in ../shared/data (never copied into the project), which the hint offers. */
#ifndef KVB_DATAHINT_H
#define KVB_DATAHINT_H

#include <stddef.h>

/* The sample records of a benchmark type ("longbench", "longmemeval", "sharegpt", "niah") beside the
 * checkout ($KVB_SOURCE_DIR/../shared/data when that variable is set, else ../shared/data from the current
 * directory): their path in out and 1, or 0 and "" when there are none. */
int kvb_data_sample_path(const char *benchmark, char *out, size_t cap);
/* One clause for a "not found" message: where datasets go and, when sample records exist, where they are
 * and the suite that runs on them (configs/sample-data.json). Never empty. */
void kvb_data_hint(const char *benchmark, char *out, size_t cap);

#endif
