#include "util_gguf_writer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint8_t *p;
    size_t n, cap;
} bytes;

typedef struct {
    char *name;
    ggml_type type;
    int n_dims;
    uint64_t ne[4];
    uint8_t *data;
    size_t n_bytes;
} gw_tensor_rec;

struct gw_writer {
    bytes kv;
    uint64_t n_kv;
    gw_tensor_rec *t;
    int n_t;
    uint32_t alignment;
};

static void put(bytes *b, const void *src, size_t n) {
    if (n == 0) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 1024;
        while (cap < b->n + n) cap *= 2;
        b->p = realloc(b->p, cap);
        b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void put_u32(bytes *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(bytes *b, uint64_t v) { put(b, &v, 8); }
static void put_str(bytes *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}

gw_writer *gw_new(void) {
    gw_writer *w = calloc(1, sizeof *w);
    w->alignment = 32;
    return w;
}

void gw_free(gw_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n_t; i++) free(w->t[i].name), free(w->t[i].data);
    free(w->t);
    free(w->kv.p);
    free(w);
}

static void key(gw_writer *w, const char *k, gguf_vtype t) {
    put_str(&w->kv, k);
    put_u32(&w->kv, (uint32_t)t);
    w->n_kv++;
}

void gw_set_alignment(gw_writer *w, uint32_t a) {
    w->alignment = a;
    if (a != 32) gw_kv_u32(w, "general.alignment", a);
}

void gw_kv_u32(gw_writer *w, const char *k, uint32_t v) { key(w, k, GGUF_VT_UINT32), put_u32(&w->kv, v); }
void gw_kv_i32(gw_writer *w, const char *k, int32_t v) { key(w, k, GGUF_VT_INT32), put(&w->kv, &v, 4); }
void gw_kv_f32(gw_writer *w, const char *k, float v) { key(w, k, GGUF_VT_FLOAT32), put(&w->kv, &v, 4); }
void gw_kv_bool(gw_writer *w, const char *k, int v) {
    uint8_t b = (uint8_t)(v != 0);
    key(w, k, GGUF_VT_BOOL), put(&w->kv, &b, 1);
}
void gw_kv_str(gw_writer *w, const char *k, const char *v) { key(w, k, GGUF_VT_STRING), put_str(&w->kv, v); }

static size_t scalar_size(gguf_vtype t) {
    switch (t) {
    case GGUF_VT_UINT8: case GGUF_VT_INT8: case GGUF_VT_BOOL: return 1;
    case GGUF_VT_UINT16: case GGUF_VT_INT16: return 2;
    case GGUF_VT_UINT32: case GGUF_VT_INT32: case GGUF_VT_FLOAT32: return 4;
    default: return 8;
    }
}

void gw_kv_scalar(gw_writer *w, const char *k, gguf_vtype t, const void *value) {
    key(w, k, t);
    put(&w->kv, value, scalar_size(t));
}

void gw_kv_arr_str(gw_writer *w, const char *k, const char *const *strs, int n) {
    key(w, k, GGUF_VT_ARRAY);
    put_u32(&w->kv, GGUF_VT_STRING);
    put_u64(&w->kv, (uint64_t)n);
    for (int i = 0; i < n; i++) put_str(&w->kv, strs[i]);
}

void gw_kv_arr_i32(gw_writer *w, const char *k, const int32_t *v, int n) {
    key(w, k, GGUF_VT_ARRAY);
    put_u32(&w->kv, GGUF_VT_INT32);
    put_u64(&w->kv, (uint64_t)n);
    put(&w->kv, v, (size_t)n * 4);
}

void gw_kv_arr_f32(gw_writer *w, const char *k, const float *v, int n) {
    key(w, k, GGUF_VT_ARRAY);
    put_u32(&w->kv, GGUF_VT_FLOAT32);
    put_u64(&w->kv, (uint64_t)n);
    put(&w->kv, v, (size_t)n * 4);
}

void gw_kv_arr_arr_i32(gw_writer *w, const char *k, const int32_t *const *vals, const int *lens, int n) {
    key(w, k, GGUF_VT_ARRAY);
    put_u32(&w->kv, GGUF_VT_ARRAY);
    put_u64(&w->kv, (uint64_t)n);
    for (int i = 0; i < n; i++) {
        put_u32(&w->kv, GGUF_VT_INT32);
        put_u64(&w->kv, (uint64_t)lens[i]);
        put(&w->kv, vals[i], (size_t)lens[i] * 4);
    }
}

void gw_tensor(gw_writer *w, const char *name, ggml_type type, int n_dims, const uint64_t *ne, const void *data,
               size_t n_bytes) {
    w->t = realloc(w->t, (size_t)(w->n_t + 1) * sizeof *w->t);
    gw_tensor_rec *r = &w->t[w->n_t++];
    memset(r, 0, sizeof *r);
    r->name = strdup(name);
    r->type = type;
    r->n_dims = n_dims;
    for (int d = 0; d < n_dims; d++) r->ne[d] = ne[d];
    r->data = malloc(n_bytes ? n_bytes : 1);
    memcpy(r->data, data, n_bytes);
    r->n_bytes = n_bytes;
}

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

int gw_finish(gw_writer *w, uint8_t **buf, size_t *len) {
    bytes b = {0};
    put(&b, "GGUF", 4);
    put_u32(&b, 3);
    put_u64(&b, (uint64_t)w->n_t);
    put_u64(&b, w->n_kv);
    put(&b, w->kv.p, w->kv.n);
    size_t off = 0;
    for (int i = 0; i < w->n_t; i++) {
        put_str(&b, w->t[i].name);
        put_u32(&b, (uint32_t)w->t[i].n_dims);
        for (int d = 0; d < w->t[i].n_dims; d++) put_u64(&b, w->t[i].ne[d]);
        put_u32(&b, (uint32_t)w->t[i].type);
        put_u64(&b, off);
        off = align_up(off + w->t[i].n_bytes, w->alignment);
    }
    static const uint8_t zeros[256] = {0};
    size_t pad = align_up(b.n, w->alignment) - b.n;
    put(&b, zeros, pad);
    for (int i = 0; i < w->n_t; i++) {
        put(&b, w->t[i].data, w->t[i].n_bytes);
        size_t p = align_up(w->t[i].n_bytes, w->alignment) - w->t[i].n_bytes;
        if (i + 1 < w->n_t) put(&b, zeros, p);
    }
    *buf = b.p;
    *len = b.n;
    return 0;
}

gguf_file *gw_open(gw_writer *w, uint8_t **buf, char *err, size_t err_len) {
    size_t len;
    gw_finish(w, buf, &len);
    gw_free(w);
    return gguf_open_mem(*buf, len, err, err_len);
}

int gw_write_file(gw_writer *w, const char *path) {
    uint8_t *buf;
    size_t len;
    if (gw_finish(w, &buf, &len)) return -1;
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(buf);
        return -1;
    }
    size_t wrote = fwrite(buf, 1, len, f);
    free(buf);
    return fclose(f) == 0 && wrote == len ? 0 : -1;
}
