/* profile.c — calibration profiles on disk, keyed by the model's sha256 (base/sha256.h). */
#include "methods/profile.h"
#include "methods/method.h"
#include "base/fsutil.h"
#include "base/sha256.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

static char cached_path[1024], cached_hex[65];

int kvb_model_sha256(const kvb_model *m, char hex[65], char *err, size_t err_len) {
    if (cached_hex[0] && !strcmp(cached_path, m->path)) {
        memcpy(hex, cached_hex, 65);
        return 0;
    }
    /* a synthetic model has no file: its canonical name (shape, layers, seed, ctx) determines its weights */
    const void *name = m->path;
    if (m->syn_weights ? kvb_sha256(&name, NULL, 1, NULL, hex) : kvb_sha256_file(m->path, hex, err, err_len))
        return m->syn_weights ? ERR("sha256 of %s failed", m->path) : -1;
    snprintf(cached_path, sizeof cached_path, "%s", m->path);
    memcpy(cached_hex, hex, 65);
    return 0;
}

static int profile_dir(char *dir, size_t cap, char *err, size_t err_len) {
    const char *d = getenv("KVB_PROFILE_DIR"), *home = getenv("HOME");
    int n = d && *d ? snprintf(dir, cap, "%s", d) : snprintf(dir, cap, "%s/.cache/kvbench/profiles", home ? home : ".");
    if (n < 0 || (size_t)n >= cap) return ERR("profile directory path too long");
    return 0;
}

int kvb_profile_path(const kvb_model *m, char *path, size_t cap, char *err, size_t err_len) {
    char dir[900], hex[65];
    if (profile_dir(dir, sizeof dir, err, err_len) || kvb_model_sha256(m, hex, err, err_len)) return -1;
    if ((size_t)snprintf(path, cap, "%s/%s.json", dir, hex) >= cap) return ERR("profile path too long");
    return 0;
}

cJSON *kvb_profile_load(const kvb_model *m, char *err, size_t err_len) {
    char path[1024], hex[65];
    err[0] = 0;
    if (kvb_profile_path(m, path, sizeof path, err, err_len) || kvb_model_sha256(m, hex, err, err_len)) return NULL;
    if (access(path, F_OK) != 0) return NULL; /* no profile yet */
    char *text = kvb_read_file(path, NULL, err, err_len);
    if (!text) return NULL;
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!j || !cJSON_IsObject(j)) {
        cJSON_Delete(j);
        ERR("calibration profile %s is not a JSON object (delete it and re-run kvbench calibrate)", path);
        return NULL;
    }
    /* a profile copied or renamed from another model's would feed this one that model's layers and heads */
    const cJSON *sha = cJSON_GetObjectItemCaseSensitive(j, "model_sha256");
    if (sha && (!cJSON_IsString(sha) || strcmp(sha->valuestring, hex))) {
        ERR("calibration profile %s is for another model (its model_sha256 is %.16s..., this model's %.16s...): delete it "
            "and re-run kvbench calibrate", path, cJSON_IsString(sha) ? sha->valuestring : "not a string", hex);
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

static char lock_path[1100];
static int lock_fd = -1, lock_depth;

int kvb_profile_lock(const kvb_model *m, char *err, size_t err_len) {
    char dir[900], path[1100];
    if (profile_dir(dir, sizeof dir, err, err_len) || kvb_profile_path(m, path, sizeof path - 5, err, err_len)) return -1;
    strcat(path, ".lock");
    if (lock_depth) {
        if (strcmp(path, lock_path)) return ERR("profile lock: already holding %s", lock_path);
        lock_depth++;
        return 0;
    }
    if (kvb_mkdirs(dir)) return ERR("cannot create %s: %s", dir, strerror(errno));
    if ((lock_fd = kvb_lock_file(path, err, err_len)) < 0) return -1;
    snprintf(lock_path, sizeof lock_path, "%s", path);
    lock_depth = 1;
    return 0;
}

void kvb_profile_unlock(void) {
    if (lock_depth > 0 && --lock_depth == 0) {
        kvb_unlock_file(lock_fd);
        lock_fd = -1;
    }
}

int kvb_profile_has(const kvb_model *m, const char *section, char *err, size_t err_len) {
    cJSON *root = kvb_profile_load(m, err, err_len);
    if (!root) return err[0] ? -1 : 0;
    int has = cJSON_GetObjectItemCaseSensitive(root, section) != NULL;
    cJSON_Delete(root);
    return has;
}

/* Read, replace the section, write (the caller holds the lock). */
static int store_locked(const kvb_model *m, const char *section, cJSON *value, char *err, size_t err_len) {
    char path[1024], hex[65];
    if (kvb_profile_path(m, path, sizeof path, err, err_len) || kvb_model_sha256(m, hex, err, err_len)) return -1;
    cJSON *root = kvb_profile_load(m, err, err_len);
    if (!root) {
        if (err[0]) return -1;
        root = cJSON_CreateObject();
    }
    cJSON_DeleteItemFromObject(root, "model_sha256");
    cJSON_AddStringToObject(root, "model_sha256", hex);
    cJSON_DeleteItemFromObject(root, section);
    cJSON_AddItemToObject(root, section, cJSON_Duplicate(value, 1));
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) return ERR("out of memory");
    int rc = kvb_write_file_atomic(path, text, err, err_len);
    free(text);
    return rc;
}

int kvb_profile_store(const kvb_model *m, const char *section, cJSON *value, char *err, size_t err_len) {
    if (kvb_profile_lock(m, err, err_len)) return -1;
    int rc = store_locked(m, section, value, err, err_len);
    kvb_profile_unlock();
    return rc;
}

static cJSON *section(const kvb_model *model, const char *name, cJSON **root, char *err, size_t err_len) {
    *root = kvb_profile_load(model, err, err_len);
    if (!*root) return NULL;
    return cJSON_GetObjectItemCaseSensitive(*root, name);
}

int kvb_profile_round_lw(const kvb_model *model, int *lw, char *err, size_t err_len) {
    cJSON *root, *s = section(model, "round", &root, err, err_len);
    if (!root) return err[0] ? -1 : 0;
    cJSON *v = s ? cJSON_GetObjectItemCaseSensitive(s, "lw") : NULL;
    int rc = 0;
    if (v) {
        if (!cJSON_IsNumber(v) || v->valuedouble != (double)v->valueint) rc = ERR("calibration profile: round.lw is not a whole number");
        else { *lw = v->valueint; rc = 1; }
    }
    cJSON_Delete(root);
    return rc;
}

int kvb_profile_omnikv_layers(const kvb_model *model, int *layers, int max, char *err, size_t err_len) {
    cJSON *root, *s = section(model, "omnikv", &root, err, err_len);
    if (!root) return err[0] ? -1 : 0;
    cJSON *v = s ? cJSON_GetObjectItemCaseSensitive(s, "layers") : NULL;
    int rc = 0;
    if (v) {
        int n = cJSON_GetArraySize(v);
        if (!cJSON_IsArray(v) || n < 1 || n > max) rc = ERR("calibration profile: omnikv.layers must be 1..%d layers", max);
        for (int i = 0; i < n && rc == 0; i++) {
            cJSON *e = cJSON_GetArrayItem(v, i);
            if (!cJSON_IsNumber(e) || e->valueint < 0 || e->valueint >= model->cfg.n_layer || (i && e->valueint <= layers[i - 1]))
                rc = ERR("calibration profile: omnikv.layers[%d] is not an ascending layer number", i);
            else layers[i] = e->valueint;
        }
        if (rc == 0) rc = n;
    }
    cJSON_Delete(root);
    return rc;
}

/* The layers a pod section covers into cov (its "layers": the model's global layers in order; a profile without
 * it, from before hybrid models, covers every layer): their count, or -1 + err when they are not the model's
 * global layers (a sliding-window layer takes no part in PoD's blocks). */
static int pod_covered(const kvb_model *model, const cJSON *s, int *cov, char *err, size_t err_len) {
    const kvb_config *cfg = &model->cfg;
    int gl[KVB_MAX_LAYERS], G = 0;
    for (int l = 0; l < cfg->n_layer; l++)
        if (!kvb_layer_window(cfg, l)) gl[G++] = l;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, "layers");
    if (!v) {
        for (int l = 0; l < cfg->n_layer; l++)
            if (kvb_layer_window(cfg, l))
                return ERR("calibration profile: pod.bases covers every layer, but layer %d is a sliding-window layer "
                           "(re-run kvbench calibrate pod)", l);
        for (int l = 0; l < cfg->n_layer; l++) cov[l] = l;
        return cfg->n_layer;
    }
    int ok = cJSON_IsArray(v) && cJSON_GetArraySize(v) == G;
    for (int i = 0; i < G && ok; i++) {
        const cJSON *e = cJSON_GetArrayItem(v, i);
        ok = cJSON_IsNumber(e) && e->valueint == gl[i] && e->valuedouble == (double)gl[i];
        cov[i] = gl[i];
    }
    if (!ok) return ERR("calibration profile: pod.layers are not this model's %d global layers in order (re-run kvbench "
                        "calibrate pod)", G);
    return G;
}

int kvb_profile_pod_bases(const kvb_model *model, int *bases, char *err, size_t err_len) {
    const int L = model->cfg.n_layer, HK = model->cfg.n_head_kv;
    cJSON *root, *s = section(model, "pod", &root, err, err_len);
    if (!root) return err[0] ? -1 : 0;
    cJSON *v = s ? cJSON_GetObjectItemCaseSensitive(s, "bases") : NULL;
    int rc = 0, cov[KVB_MAX_LAYERS], n = v ? pod_covered(model, s, cov, err, err_len) : 0;
    if (n < 0) rc = -1;
    else if (v) {
        rc = 1;
        for (int i = 0; i < HK * L; i++) bases[i] = i % L; /* a layer outside the blocks (local) is its own base */
        if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != HK) rc = ERR("calibration profile: pod.bases needs %d KV heads", HK);
        for (int g = 0; g < HK && rc == 1; g++) {
            cJSON *row = cJSON_GetArrayItem(v, g);
            if (!cJSON_IsArray(row) || cJSON_GetArraySize(row) != n) {
                rc = ERR("calibration profile: pod.bases[%d] needs %d layers", g, n);
                break;
            }
            /* per covered layer (in order): its own number (a new block) or the previous covered layer's base */
            for (int i = 0; i < n; i++) {
                cJSON *e = cJSON_GetArrayItem(row, i);
                int b = cJSON_IsNumber(e) ? e->valueint : -1, l = cov[i];
                if (b != l && (i == 0 || b != bases[g * L + cov[i - 1]])) {
                    rc = ERR("calibration profile: pod.bases[%d][%d] is not the base of a block of consecutive layers", g, i);
                    break;
                }
                bases[g * L + l] = b;
            }
        }
    }
    cJSON_Delete(root);
    return rc;
}

/* Read a numeric array of nested arrays of shape dims[0] x ... x dims[n_dims - 1] into out (row-major): 0, or -1 +
 * a line naming the section's path and the first element that is not a finite number or a row of the wrong length. */
static int read_grid(const cJSON *v, const char *what, const int *dims, int n_dims, double *out, int64_t *at, char *err,
                     size_t err_len) {
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != dims[0])
        return ERR("calibration profile: %s needs %d entries at depth %d (re-run kvbench calibrate)", what, dims[0], n_dims);
    for (int i = 0; i < dims[0]; i++) {
        const cJSON *e = cJSON_GetArrayItem(v, i);
        if (n_dims > 1) {
            if (read_grid(e, what, dims + 1, n_dims - 1, out, at, err, err_len)) return -1;
        } else {
            if (!cJSON_IsNumber(e) || !isfinite(e->valuedouble))
                return ERR("calibration profile: %s holds a value that is not a finite number", what);
            out[(*at)++] = e->valuedouble;
        }
    }
    return 0;
}

/* A numeric grid from section.key: 1 found, 0 none, -1 error. */
static int profile_grid(const kvb_model *model, const char *name, const char *key, const int *dims, int n_dims,
                        double *out, char *err, size_t err_len) {
    cJSON *root, *s = section(model, name, &root, err, err_len);
    if (!root) return err[0] ? -1 : 0;
    cJSON *v = s ? cJSON_GetObjectItemCaseSensitive(s, key) : NULL;
    char what[64];
    snprintf(what, sizeof what, "%s.%s", name, key);
    int64_t at = 0;
    int rc = v ? (read_grid(v, what, dims, n_dims, out, &at, err, err_len) ? -1 : 1) : 0;
    cJSON_Delete(root);
    return rc;
}

int kvb_profile_qfilter(const kvb_model *model, float *f, char *err, size_t err_len) {
    const kvb_config *cfg = &model->cfg;
    const int dims[3] = {cfg->n_layer, cfg->n_head_kv, cfg->head_dim};
    const size_t n = (size_t)dims[0] * dims[1] * dims[2];
    double *v = malloc(n * sizeof *v);
    if (!v) return ERR("out of memory");
    int rc = profile_grid(model, "qfilter", "filters", dims, 3, v, err, err_len);
    for (size_t i = 0; i < n && rc == 1; i++) f[i] = (float)v[i];
    free(v);
    return rc;
}

int kvb_profile_duo_scores(const kvb_model *model, double *scores, char *err, size_t err_len) {
    const int dims[2] = {model->cfg.n_layer, model->cfg.n_head_kv};
    return profile_grid(model, "duo", "scores", dims, 2, scores, err, err_len);
}
