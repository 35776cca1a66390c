/* provenance.h — where a run came from, written into every run.json (shards and merges included): git
 * commit and whether the tree had uncommitted changes, build flags, backend and device name, host. */
#ifndef KVB_PROVENANCE_H
#define KVB_PROVENANCE_H

#include <cjson/cJSON.h>

/* Add "git_commit", "git_dirty", "build_flags", "backend", "device" and "host" to j. backend is the
 * engine backend the run uses ("cpu" or "cuda"). Values that cannot be found are "unknown" (git_dirty null). */
void kvb_provenance_add(cJSON *j, const char *backend);

#endif
