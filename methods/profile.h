/* profile.h — per-model calibration profiles (DESIGN.md "Calibration").
 *
 * `kvbench calibrate round|omnikv|pod|qfilter|duo` writes one JSON file per model, named by the model file's
 * sha256, under $KVB_PROFILE_DIR (default ~/.cache/kvbench/profiles). Methods read their section by default;
 * flags override it. Sections: "round": {"lw": N, ...}, "omnikv": {"layers": [...], ...},
 * "pod": {"layers": [the layers it covers: the global ones], "bases": [[base layer per covered layer] per KV head], ...}, "qfilter": {"filters": [[[head_dim numbers] per KV
 * head] per layer], ...}, "duo": {"scores": [[retrieval score per KV head] per layer], ...}. */
#ifndef KVB_PROFILE_H_METHODS
#define KVB_PROFILE_H_METHODS

#include <cjson/cJSON.h>

#include "engine/model.h"

/* sha256 of the model file as 64 hex chars (cached per model). -1 + err on failure. */
int kvb_model_sha256(const kvb_model *m, char hex[65], char *err, size_t err_len);
/* Path of the model's profile file. */
int kvb_profile_path(const kvb_model *m, char *path, size_t cap, char *err, size_t err_len);
/* The model's profile (NULL when none; *err set only on a real error such as a corrupt file: check err[0]). */
cJSON *kvb_profile_load(const kvb_model *m, char *err, size_t err_len);
/* Replace one section of the model's profile (atomic write, under kvb_profile_lock). */
int kvb_profile_store(const kvb_model *m, const char *section, cJSON *value, char *err, size_t err_len);
/* 1 when the model's profile has the section, 0 when not (or there is no profile), -1 + err (corrupt profile). */
int kvb_profile_has(const kvb_model *m, const char *section, char *err, size_t err_len);
/* Hold the model's profile exclusively (PROFILE.lock beside it, base/fsutil.h kvb_lock_file: waits while another
 * process holds it, also across NFS clients), so that processes sharing a profile directory (shards, Slurm array
 * tasks) check for a section, make it and store it one at a time: the first calibrates, the others wait and
 * then find its result. Nests within a process (kvb_profile_store takes it too); one model's profile at a time.
 * 0, or -1 + err. */
int kvb_profile_lock(const kvb_model *m, char *err, size_t err_len);
void kvb_profile_unlock(void);

/* Method lookups: 1 = found, 0 = no profile / no section, -1 = error. */
int kvb_profile_round_lw(const kvb_model *model, int *lw, char *err, size_t err_len);
int kvb_profile_omnikv_layers(const kvb_model *model, int *layers, int max, char *err, size_t err_len);
/* PoD's blocks, bases[g * n_layer + l] = the base layer of layer l's block for KV head g; a sliding-window layer,
 * which no block covers, is its own base. A section without "layers" covers every layer (refused on a hybrid model). */
int kvb_profile_pod_bases(const kvb_model *model, int *bases, char *err, size_t err_len);
/* Q-Filters' directions, f[(l * n_head_kv + g) * head_dim + e] (every layer, KV head and element a finite number). */
int kvb_profile_qfilter(const kvb_model *model, float *f, char *err, size_t err_len);
/* DuoAttention's retrieval scores, scores[l * n_head_kv + g] (finite numbers). */
int kvb_profile_duo_scores(const kvb_model *model, double *scores, char *err, size_t err_len);

#endif
