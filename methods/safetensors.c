/* safetensors.c — the safetensors reader (safetensors.h). */
#include "methods/safetensors.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/fsutil.h"
#include "kernels/backend.h" /* kvb_errf */
#include "kernels/dtype.h"

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

/* the largest header read (the format's own readers cap it at 100 MB), and the largest file read whole */
enum { MAX_HEADER = 100 << 20 };
#define MAX_FILE ((long long)4 << 30)

static int dtype_of(const char *s, kvb_st_dtype *d, int *size) {
    if (!strcmp(s, "F32")) *d = KVB_ST_F32, *size = 4;
    else if (!strcmp(s, "F16")) *d = KVB_ST_F16, *size = 2;
    else if (!strcmp(s, "BF16")) *d = KVB_ST_BF16, *size = 2;
    else return -1;
    return 0;
}

/* One header entry into t; data: the bytes after the header (n_data of them). */
static int read_entry(const cJSON *e, kvb_st_tensor *t, const uint8_t *data, size_t n_data, const char *path,
                      char *err, size_t err_len) {
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(shape) || !cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2)
        return ERR("%s: tensor %s: needs \"dtype\", \"shape\" and two \"data_offsets\"", path, t->name);
    int size = 0;
    if (dtype_of(dt->valuestring, &t->dtype, &size))
        return ERR("%s: tensor %s: dtype %s is not read here (F32, F16 or BF16)", path, t->name, dt->valuestring);
    int nd = cJSON_GetArraySize(shape);
    if (nd > KVB_ST_MAX_DIMS) return ERR("%s: tensor %s: %d dimensions (at most %d)", path, t->name, nd, KVB_ST_MAX_DIMS);
    t->n_dims = nd;
    t->numel = 1;
    for (int i = 0; i < nd; i++) {
        const cJSON *s = cJSON_GetArrayItem(shape, i);
        if (!cJSON_IsNumber(s) || s->valuedouble < 0 || s->valuedouble > (double)(1LL << 40) ||
            s->valuedouble != (double)(int64_t)s->valuedouble)
            return ERR("%s: tensor %s: a shape entry is not a size", path, t->name);
        t->shape[i] = (int64_t)s->valuedouble;
        if (t->shape[i] && t->numel > ((int64_t)1 << 50) / t->shape[i])
            return ERR("%s: tensor %s: shape of more than 2^50 elements", path, t->name);
        t->numel *= t->shape[i];
    }
    double b = cJSON_GetArrayItem(off, 0)->valuedouble, en = cJSON_GetArrayItem(off, 1)->valuedouble;
    if (!cJSON_IsNumber(cJSON_GetArrayItem(off, 0)) || !cJSON_IsNumber(cJSON_GetArrayItem(off, 1)) || b < 0 ||
        en < b || en > (double)n_data || b != (double)(int64_t)b || en != (double)(int64_t)en)
        return ERR("%s: tensor %s: data_offsets [%.0f, %.0f] outside the file's %zu data bytes", path, t->name, b, en,
                   n_data);
    if ((double)t->numel * size != en - b)
        return ERR("%s: tensor %s: %.0f bytes for %lld %s elements", path, t->name, en - b, (long long)t->numel,
                   dt->valuestring);
    t->data = data + (size_t)b;
    return 0;
}

int kvb_st_open(kvb_st_file *f, const char *path, char *err, size_t err_len) {
    memset(f, 0, sizeof *f);
    if (!(f->path = strdup(path))) return ERR("out of memory");
    struct stat st;
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && (long long)st.st_size > MAX_FILE)
        return ERR("%s: %lld bytes, more than the %lld a scorer file may hold", path, (long long)st.st_size, MAX_FILE);
    if (!(f->buf = kvb_read_file(path, &f->size, err, err_len))) return -1;
    const uint8_t *u = (const uint8_t *)f->buf;
    if (f->size < 8) return ERR("%s: not a safetensors file (%zu bytes)", path, f->size);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | u[i];
    if (hl < 2 || hl > MAX_HEADER || hl > f->size - 8)
        return ERR("%s: not a safetensors file (its header length does not fit its %zu bytes)", path, f->size);
    cJSON *h = cJSON_ParseWithLength(f->buf + 8, (size_t)hl);
    if (!cJSON_IsObject(h)) {
        cJSON_Delete(h);
        return ERR("%s: the safetensors header is not a JSON object", path);
    }
    const uint8_t *data = u + 8 + hl;
    size_t n_data = f->size - 8 - (size_t)hl;
    int n = 0, rc = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, h) n += strcmp(e->string, "__metadata__") != 0;
    if (!(f->t = calloc(n ? (size_t)n : 1, sizeof *f->t))) rc = ERR("out of memory");
    cJSON_ArrayForEach(e, h) {
        if (rc || !strcmp(e->string, "__metadata__")) continue;
        kvb_st_tensor *t = &f->t[f->n];
        if (kvb_st_find(f, e->string)) rc = ERR("%s: tensor %s is named twice in the header", path, e->string);
        else if (!(t->name = strdup(e->string))) rc = ERR("out of memory");
        else {
            f->n++;
            rc = cJSON_IsObject(e) ? read_entry(e, t, data, n_data, path, err, err_len)
                                   : ERR("%s: tensor %s: its entry is not an object", path, t->name);
        }
    }
    cJSON_Delete(h);
    return rc;
}

const kvb_st_tensor *kvb_st_find(const kvb_st_file *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->t[i].name, name)) return &f->t[i];
    return NULL;
}

void kvb_st_to_f32(const kvb_st_tensor *t, float *out) {
    for (int64_t i = 0; i < t->numel; i++) {
        const uint8_t *p = t->data + (size_t)i * (t->dtype == KVB_ST_F32 ? 4 : 2);
        if (t->dtype == KVB_ST_F32) {
            uint32_t x = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
            memcpy(&out[i], &x, sizeof x);
        } else {
            uint16_t x = (uint16_t)(p[0] | p[1] << 8);
            out[i] = t->dtype == KVB_ST_F16 ? kvb_f16_to_f32(x) : kvb_bf16_to_f32(x);
        }
    }
}

void kvb_st_close(kvb_st_file *f) {
    if (!f) return;
    for (int i = 0; i < f->n; i++) free(f->t[i].name);
    free(f->t);
    free(f->buf);
    free(f->path);
    memset(f, 0, sizeof *f);
}
