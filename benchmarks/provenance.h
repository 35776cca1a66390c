/* provenance.h — where a run came from, written into every run.json (shards and merges included): git
 * commit and whether the tree had uncommitted changes, build flags, backend and device name, host. */
#ifndef KVB_PROVENANCE_H
#define KVB_PROVENANCE_H

#include <cjson/cJSON.h>

/* Add "git_commit" and "git_dirty" (of the commit the binary was built from; "checkout_commit" beside them when the
 * source folder is now at another), "build_flags", "backend", "device", "cuda_kernels" (on CUDA) and "host" to j.
 * backend is the engine backend the run uses ("cpu" or "cuda"). Values that cannot be found are "unknown"
 * (git_dirty null). */
void kvb_provenance_add(cJSON *j, const char *backend);
/* One line: the commit the binary was built from and its build flags (`kvbench --version`). */
const char *kvb_provenance_version(void);

#endif
