/* gguf.c — GGUF v2/v3 reader (see gguf.h). Every read goes through a cursor that
 * checks the remaining bytes first; counts from the file are checked against the
 * bytes left before anything is allocated for them. */
#include "engine/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/text.h"

enum { MAX_NESTING = 8, MAX_NAME_BYTES = 65535 };

typedef struct {
    const uint8_t *base;
    uint64_t size, pos;
    char *err;
    size_t err_len;
    int failed;
} cursor;

static void fail(cursor *c, const char *fmt, ...) {
    if (c->failed) return;
    c->failed = 1;
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(c->err, c->err_len, "gguf: ");
    if (n >= 0 && (size_t)n < c->err_len) vsnprintf(c->err + n, c->err_len - (size_t)n, fmt, ap);
    va_end(ap);
}

static int need(cursor *c, uint64_t n, const char *what) {
    if (c->failed) return -1;
    if (n > c->size - c->pos) {
        fail(c, "truncated file: %s needs %llu bytes at offset %llu, file has %llu", what, (unsigned long long)n,
             (unsigned long long)c->pos, (unsigned long long)c->size);
        return -1;
    }
    return 0;
}

static uint64_t rd_le(cursor *c, int bytes, const char *what) {
    if (need(c, (uint64_t)bytes, what)) return 0;
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) v |= (uint64_t)c->base[c->pos + (uint64_t)i] << (8 * i);
    c->pos += (uint64_t)bytes;
    return v;
}

static int rd_str(cursor *c, gguf_str *s, const char *what) {
    uint64_t len = rd_le(c, 8, what);
    if (need(c, len, what)) return -1;
    s->ptr = (const char *)c->base + c->pos;
    s->len = len;
    c->pos += len;
    return 0;
}

static int scalar_bytes(gguf_vtype t) {
    switch (t) {
    case GGUF_VT_UINT8: case GGUF_VT_INT8: case GGUF_VT_BOOL: return 1;
    case GGUF_VT_UINT16: case GGUF_VT_INT16: return 2;
    case GGUF_VT_UINT32: case GGUF_VT_INT32: case GGUF_VT_FLOAT32: return 4;
    case GGUF_VT_UINT64: case GGUF_VT_INT64: case GGUF_VT_FLOAT64: return 8;
    default: return 0;
    }
}

static double bits_to_f32(uint64_t b) {
    uint32_t u = (uint32_t)b;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static double bits_to_f64(uint64_t b) {
    double d;
    memcpy(&d, &b, 8);
    return d;
}

static int64_t sign_extend(uint64_t v, int bytes) {
    if (bytes == 8) return (int64_t)v;
    uint64_t m = 1ull << (8 * bytes - 1);
    return (int64_t)((v ^ m) - m);
}

static void value_free(gguf_value *v);

const char *gguf_str_safe(gguf_str s, char *out, size_t cap) {
    return kvb_str_shown_n(s.ptr, s.len < 100 ? (size_t)s.len : 100, out, cap);
}

static void safe_name(char *out, size_t cap, gguf_str s) { gguf_str_safe(s, out, cap); }

static int rd_value(cursor *c, gguf_vtype t, gguf_value *v, int depth, const char *key) {
    memset(v, 0, sizeof *v);
    v->type = t;
    int sb = scalar_bytes(t);
    if (sb) {
        uint64_t raw = rd_le(c, sb, key);
        if (t == GGUF_VT_FLOAT32) v->v.f = bits_to_f32(raw);
        else if (t == GGUF_VT_FLOAT64) v->v.f = bits_to_f64(raw);
        else if (t == GGUF_VT_INT8 || t == GGUF_VT_INT16 || t == GGUF_VT_INT32 || t == GGUF_VT_INT64)
            v->v.i = sign_extend(raw, sb);
        else if (t == GGUF_VT_BOOL) {
            if (raw > 1) return fail(c, "key '%s': bool value %llu is not 0 or 1", key, (unsigned long long)raw), -1;
            v->v.u = raw;
        } else
            v->v.u = raw;
        return c->failed ? -1 : 0;
    }
    if (t == GGUF_VT_STRING) return rd_str(c, &v->v.s, key);
    if (t != GGUF_VT_ARRAY) return fail(c, "key '%s': unknown value type %d", key, (int)t), -1;
    if (depth >= MAX_NESTING) return fail(c, "key '%s': arrays nested deeper than %d", key, MAX_NESTING), -1;
    uint64_t et = rd_le(c, 4, key);
    uint64_t count = rd_le(c, 8, key);
    if (c->failed) return -1;
    if (et >= GGUF_VT_COUNT) return fail(c, "key '%s': unknown array element type %llu", key, (unsigned long long)et), -1;
    v->v.arr.elem_type = (gguf_vtype)et;
    v->v.arr.count = count;
    int esb = scalar_bytes((gguf_vtype)et);
    if (esb) {
        if (count > (c->size - c->pos) / (uint64_t)esb)
            return fail(c, "key '%s': array of %llu elements runs past the end of the file", key,
                        (unsigned long long)count), -1;
        v->v.arr.raw = c->base + c->pos;
        c->pos += count * (uint64_t)esb;
        return 0;
    }
    /* strings take >= 8 bytes, arrays >= 12: a count larger than that cannot be real */
    uint64_t min_elem = et == GGUF_VT_STRING ? 8 : 12;
    if (count > (c->size - c->pos) / min_elem)
        return fail(c, "key '%s': array of %llu elements runs past the end of the file", key, (unsigned long long)count), -1;
    if (count == 0) return 0;
    if (et == GGUF_VT_STRING) {
        v->v.arr.strs = calloc((size_t)count, sizeof *v->v.arr.strs);
        if (!v->v.arr.strs) return fail(c, "out of memory reading key '%s'", key), -1;
        for (uint64_t i = 0; i < count; i++)
            if (rd_str(c, &v->v.arr.strs[i], key)) return -1;
        return 0;
    }
    v->v.arr.items = calloc((size_t)count, sizeof *v->v.arr.items);
    if (!v->v.arr.items) return fail(c, "out of memory reading key '%s'", key), -1;
    for (uint64_t i = 0; i < count; i++) /* items carry their own (element type, count) header */
        if (rd_value(c, GGUF_VT_ARRAY, &v->v.arr.items[i], depth + 1, key)) return -1;
    return 0;
}

static void value_free(gguf_value *v) {
    if (v->type != GGUF_VT_ARRAY) return;
    free(v->v.arr.strs);
    if (v->v.arr.items) {
        for (uint64_t i = 0; i < v->v.arr.count; i++) value_free(&v->v.arr.items[i]);
        free(v->v.arr.items);
    }
}

/* ggml types a GGUF may hold that kvbench refuses by name (ggml numbering), so the user learns which one */
static const char *const unsupported_type_name[64] = {
    [10] = "Q2_K", [11] = "Q3_K", [15] = "Q8_K", [16] = "IQ2_XXS", [17] = "IQ2_XS", [18] = "IQ3_XXS", [19] = "IQ1_S",
    [20] = "IQ4_NL", [21] = "IQ3_S", [22] = "IQ2_S", [23] = "IQ4_XS", [24] = "I8", [25] = "I16", [26] = "I32",
    [27] = "I64", [28] = "F64", [29] = "IQ1_M", [34] = "TQ1_0", [35] = "TQ2_0",
};

const char *gguf_vtype_name(gguf_vtype t) {
    static const char *names[] = {"uint8", "int8",   "uint16", "int16", "uint32", "int32", "float32",
                                  "bool",  "string", "array",  "uint64", "int64", "float64"};
    return (unsigned)t < GGUF_VT_COUNT ? names[t] : "unknown";
}

int gguf_str_eq(gguf_str s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && memcmp(s.ptr, c, n) == 0;
}

/* A set of names (metadata keys, tensor names) hashed with FNV-1a, open addressing: the duplicate checks are
 * linear in the count (pairwise checks made a file of 160k keys take a minute to open). */
typedef struct {
    gguf_str *slot; /* ptr NULL = empty (a name from the file always points into it) */
    uint64_t mask;
} name_set;

static int set_init(name_set *ns, uint64_t n) {
    uint64_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    ns->slot = calloc((size_t)cap, sizeof *ns->slot);
    ns->mask = cap - 1;
    return ns->slot ? 0 : -1;
}

/* 1 when an equal name is already in the set, else adds it and returns 0 */
static int set_add(name_set *ns, gguf_str s) {
    uint64_t h = 1469598103934665603ull;
    for (uint64_t i = 0; i < s.len; i++) h = (h ^ (uint8_t)s.ptr[i]) * 1099511628211ull;
    for (uint64_t i = h & ns->mask;; i = (i + 1) & ns->mask) {
        gguf_str *e = &ns->slot[i];
        if (!e->ptr) {
            *e = s;
            return 0;
        }
        if (e->len == s.len && !memcmp(e->ptr, s.ptr, (size_t)s.len)) return 1;
    }
}

/* A tensor's data range, for the overlap check. */
typedef struct {
    uint64_t begin, end, idx;
} data_span;

static int by_begin(const void *a, const void *b) {
    const data_span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* Tensors whose bytes overlap would alias each other's weights: refuse, naming both. */
static int check_overlap(gguf_file *f, cursor *c) {
    if (f->n_tensors < 2) return 0;
    data_span *sp = malloc((size_t)f->n_tensors * sizeof *sp);
    if (!sp) return fail(c, "out of memory"), -1;
    for (uint64_t i = 0; i < f->n_tensors; i++)
        sp[i] = (data_span){f->tensors[i].offset, f->tensors[i].offset + f->tensors[i].n_bytes, i};
    qsort(sp, (size_t)f->n_tensors, sizeof *sp, by_begin);
    uint64_t far = 0; /* the span reaching furthest so far */
    for (uint64_t i = 1; i < f->n_tensors; i++) {
        if (sp[i].begin < sp[far].end) {
            char a[128], b[128];
            safe_name(a, sizeof a, f->tensors[sp[i].idx].name);
            safe_name(b, sizeof b, f->tensors[sp[far].idx].name);
            fail(c, "tensor '%s' (data bytes %llu to %llu) overlaps tensor '%s' (data bytes %llu to %llu)", a,
                 (unsigned long long)sp[i].begin, (unsigned long long)sp[i].end - 1, b,
                 (unsigned long long)sp[far].begin, (unsigned long long)sp[far].end - 1);
            free(sp);
            return -1;
        }
        if (sp[i].end > sp[far].end) far = i;
    }
    free(sp);
    return 0;
}

/* The metadata and tensor tables after the header, then the data section; keys and names catch duplicates. */
static int parse_tables(gguf_file *f, cursor *c, name_set *keys, name_set *names) {
    const uint64_t size = c->size;
    for (uint64_t i = 0; i < f->n_kv; i++) {
        gguf_kv *kv = &f->kv[i];
        if (rd_str(c, &kv->key, "metadata key")) return -1;
        char key[128];
        safe_name(key, sizeof key, kv->key);
        uint64_t t = rd_le(c, 4, key);
        if (c->failed) return -1;
        if (t >= GGUF_VT_COUNT) return fail(c, "key '%s' has unknown value type %llu", key, (unsigned long long)t), -1;
        if (rd_value(c, (gguf_vtype)t, &kv->val, 0, key)) return -1;
        if (set_add(keys, kv->key)) return fail(c, "duplicate metadata key '%s'", key), -1;
        if (gguf_str_eq(kv->key, "general.alignment")) {
            if (kv->val.type != GGUF_VT_UINT32 || kv->val.v.u == 0 || (kv->val.v.u & (kv->val.v.u - 1)) ||
                kv->val.v.u > 1u << 20)
                return fail(c, "general.alignment must be a uint32 power of two"), -1;
            f->alignment = (uint32_t)kv->val.v.u;
        }
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        if (rd_str(c, &t->name, "tensor name")) return -1;
        char name[128];
        safe_name(name, sizeof name, t->name);
        if (t->name.len == 0 || t->name.len > MAX_NAME_BYTES) return fail(c, "tensor %llu has a bad name length", (unsigned long long)i), -1;
        t->n_dims = (uint32_t)rd_le(c, 4, name);
        if (c->failed) return -1;
        if (t->n_dims < 1 || t->n_dims > 4) return fail(c, "tensor '%s' has %u dimensions (1-4 allowed)", name, t->n_dims), -1;
        uint64_t n_elems = 1;
        for (int d = 0; d < 4; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            t->ne[d] = rd_le(c, 8, name);
            if (c->failed) return -1;
            if (t->ne[d] == 0 || t->ne[d] > (1ull << 40) || n_elems > (1ull << 62) / t->ne[d])
                return fail(c, "tensor '%s' has an impossible shape", name), -1;
            n_elems *= t->ne[d];
        }
        uint64_t ty = rd_le(c, 4, name);
        t->offset = rd_le(c, 8, name);
        if (c->failed) return -1;
        t->type = (ggml_type)ty;
        if (ty < 64 && ggml_block_elems(t->type) == 0 && unsupported_type_name[ty])
            return fail(c, "tensor '%s' has type %s, which kvbench does not read (it reads F32 F16 BF16 Q4_0 Q4_1 "
                        "Q5_0 Q5_1 Q8_0 Q4_K Q5_K Q6_K: requantize the model to one of those)", name,
                        unsupported_type_name[ty]), -1;
        if (ty > 255 || ggml_block_elems(t->type) == 0)
            return fail(c, "unknown tensor type %llu for tensor '%s'", (unsigned long long)ty, name), -1;
        uint32_t be = ggml_block_elems(t->type);
        if (t->ne[0] % be)
            return fail(c, "tensor '%s': row of %llu elements is not a multiple of the %s block (%u)", name,
                        (unsigned long long)t->ne[0], ggml_type_name(t->type), be), -1;
        /* 2^62 F32 elements are 2^64 bytes: the product must not wrap (it once wrapped to 0 and was accepted) */
        uint64_t n_blocks = n_elems / be, block_bytes = ggml_block_bytes(t->type);
        if (n_blocks > UINT64_MAX / block_bytes)
            return fail(c, "tensor '%s': %llu elements of %s overflow a 64-bit byte count", name,
                        (unsigned long long)n_elems, ggml_type_name(t->type)), -1;
        t->n_bytes = n_blocks * block_bytes;
        if (t->offset % f->alignment)
            return fail(c, "tensor '%s' offset %llu is not aligned to %u", name, (unsigned long long)t->offset,
                        f->alignment), -1;
        if (set_add(names, t->name)) return fail(c, "duplicate tensor name '%s'", name), -1;
    }
    uint64_t data = (c->pos + f->alignment - 1) / f->alignment * f->alignment;
    if (f->n_tensors > 0 && data > size) return fail(c, "truncated file: no tensor data section"), -1;
    f->data_offset = data;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        uint64_t avail = size - data;
        if (t->offset > avail || t->n_bytes > avail - t->offset) {
            char name[128];
            safe_name(name, sizeof name, t->name);
            /* the end, computed without wrapping: offset and n_bytes are each below 2^64 but their sum may not be */
            if (t->n_bytes > UINT64_MAX - data - t->offset)
                return fail(c, "truncated file: tensor '%s' (%llu bytes at data offset %llu) runs past the end of the "
                            "file (%llu bytes)", name, (unsigned long long)t->n_bytes, (unsigned long long)t->offset,
                            (unsigned long long)size), -1;
            return fail(c, "truncated file: tensor '%s' data ends at byte %llu, past the end of the file (%llu bytes)",
                        name, (unsigned long long)(data + t->offset + t->n_bytes), (unsigned long long)size), -1;
        }
        t->data = c->base + data + t->offset;
    }
    return check_overlap(f, c);
}

static int parse(gguf_file *f, const uint8_t *base, uint64_t size, char *err, size_t err_len) {
    cursor c = {base, size, 0, err, err_len, 0};
    if (size < 4 || memcmp(base, "GGUF", 4) != 0) {
        fail(&c, size < 4 ? "truncated file: %llu bytes, no GGUF header" : "bad magic (not a GGUF file)",
             (unsigned long long)size);
        return -1;
    }
    c.pos = 4;
    f->version = (uint32_t)rd_le(&c, 4, "version");
    if (c.failed) return -1;
    if (f->version != 2 && f->version != 3) return fail(&c, "unsupported version %u (supported: 2, 3)", f->version), -1;
    f->n_tensors = rd_le(&c, 8, "tensor count");
    f->n_kv = rd_le(&c, 8, "metadata count");
    if (c.failed) return -1;
    if (f->n_kv > GGUF_MAX_KV_COUNT)
        return fail(&c, "metadata count %llu exceeds the limit of %d keys (GGUF_MAX_KV_COUNT)",
                    (unsigned long long)f->n_kv, GGUF_MAX_KV_COUNT), -1;
    if (f->n_tensors > GGUF_MAX_TENSOR_COUNT)
        return fail(&c, "tensor count %llu exceeds the limit of %d tensors (GGUF_MAX_TENSOR_COUNT)",
                    (unsigned long long)f->n_tensors, GGUF_MAX_TENSOR_COUNT), -1;
    /* a kv takes >= 8+1+4+1 bytes, a tensor info >= 8+1+4+8+4+8 */
    if (f->n_kv > (size - c.pos) / 14)
        return fail(&c, "metadata count %llu is impossible for a %llu-byte file", (unsigned long long)f->n_kv,
                    (unsigned long long)size), -1;
    if (f->n_tensors > (size - c.pos) / 33)
        return fail(&c, "tensor count %llu is impossible for a %llu-byte file", (unsigned long long)f->n_tensors,
                    (unsigned long long)size), -1;
    f->kv = calloc(f->n_kv ? (size_t)f->n_kv : 1, sizeof *f->kv);
    f->tensors = calloc(f->n_tensors ? (size_t)f->n_tensors : 1, sizeof *f->tensors);
    name_set keys = {0}, names = {0};
    int rc = -1;
    if (!f->kv || !f->tensors || set_init(&keys, f->n_kv) || set_init(&names, f->n_tensors)) fail(&c, "out of memory");
    else {
        f->alignment = 32;
        rc = parse_tables(f, &c, &keys, &names);
    }
    free(keys.slot);
    free(names.slot);
    return rc;
}

static void free_tables(gguf_file *f) {
    if (f->kv)
        for (uint64_t i = 0; i < f->n_kv; i++) value_free(&f->kv[i].val);
    free(f->kv);
    free(f->tensors);
}

gguf_file *gguf_open_mem(const void *buf, size_t n_bytes, char *err, size_t err_len) {
    gguf_file *f = calloc(1, sizeof *f);
    if (!f) {
        snprintf(err, err_len, "gguf: out of memory");
        return NULL;
    }
    if (parse(f, buf, n_bytes, err, err_len)) {
        free_tables(f);
        free(f);
        return NULL;
    }
    return f;
}

gguf_file *gguf_open(const char *path, char *err, size_t err_len) {
    /* O_NONBLOCK: opening a FIFO for reading otherwise waits for a writer, forever; it is refused below */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, err_len, "gguf: cannot open: %s", strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        snprintf(err, err_len, "gguf: cannot stat: %s", strerror(errno));
        close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        const char *kind = S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISDIR(st.st_mode) ? "a directory"
                           : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device" : "a special file";
        snprintf(err, err_len, "gguf: %s, not a regular file (a model must be a file on disk)", kind);
        return NULL;
    }
    if (st.st_size == 0) {
        close(fd);
        snprintf(err, err_len, "gguf: truncated file: empty");
        return NULL;
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        snprintf(err, err_len, "gguf: mmap failed: %s", strerror(errno));
        return NULL;
    }
    gguf_file *f = gguf_open_mem(map, (size_t)st.st_size, err, err_len);
    if (!f) {
        munmap(map, (size_t)st.st_size);
        return NULL;
    }
    f->map = map;
    f->map_bytes = (size_t)st.st_size;
    return f;
}

void gguf_close(gguf_file *f) {
    if (!f) return;
    free_tables(f);
    if (f->map) munmap(f->map, f->map_bytes);
    free(f);
}

const gguf_kv *gguf_find(const gguf_file *f, const char *key) {
    for (uint64_t i = 0; i < f->n_kv; i++)
        if (gguf_str_eq(f->kv[i].key, key)) return &f->kv[i];
    return NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name) {
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (gguf_str_eq(f->tensors[i].name, name)) return &f->tensors[i];
    return NULL;
}

static const gguf_kv *find_or_err(const gguf_file *f, const char *key, char *err, size_t err_len) {
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv) snprintf(err, err_len, "gguf: missing metadata key '%s'", key);
    return kv;
}

static int type_err(const gguf_kv *kv, const char *key, const char *want, char *err, size_t err_len) {
    snprintf(err, err_len, "gguf: key '%s' has type %s, expected %s", key, gguf_vtype_name(kv->val.type), want);
    return -1;
}

static int is_unsigned(gguf_vtype t) {
    return t == GGUF_VT_UINT8 || t == GGUF_VT_UINT16 || t == GGUF_VT_UINT32 || t == GGUF_VT_UINT64;
}
static int is_signed(gguf_vtype t) {
    return t == GGUF_VT_INT8 || t == GGUF_VT_INT16 || t == GGUF_VT_INT32 || t == GGUF_VT_INT64;
}

int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out, char *err, size_t err_len) {
    const gguf_kv *kv = find_or_err(f, key, err, err_len);
    if (!kv) return -1;
    if (is_unsigned(kv->val.type) && kv->val.v.u <= UINT32_MAX) {
        *out = (uint32_t)kv->val.v.u;
        return 0;
    }
    if (is_signed(kv->val.type) && kv->val.v.i >= 0 && kv->val.v.i <= (int64_t)UINT32_MAX) {
        *out = (uint32_t)kv->val.v.i;
        return 0;
    }
    if (is_unsigned(kv->val.type) || is_signed(kv->val.type)) {
        snprintf(err, err_len, "gguf: key '%s' value does not fit uint32", key);
        return -1;
    }
    return type_err(kv, key, "uint32", err, err_len);
}

int gguf_get_f32(const gguf_file *f, const char *key, float *out, char *err, size_t err_len) {
    const gguf_kv *kv = find_or_err(f, key, err, err_len);
    if (!kv) return -1;
    if (kv->val.type != GGUF_VT_FLOAT32 && kv->val.type != GGUF_VT_FLOAT64)
        return type_err(kv, key, "float32", err, err_len);
    *out = (float)kv->val.v.f;
    return 0;
}

int gguf_get_bool(const gguf_file *f, const char *key, int *out, char *err, size_t err_len) {
    const gguf_kv *kv = find_or_err(f, key, err, err_len);
    if (!kv) return -1;
    if (kv->val.type != GGUF_VT_BOOL) return type_err(kv, key, "bool", err, err_len);
    *out = (int)kv->val.v.u;
    return 0;
}

int gguf_get_str(const gguf_file *f, const char *key, gguf_str *out, char *err, size_t err_len) {
    const gguf_kv *kv = find_or_err(f, key, err, err_len);
    if (!kv) return -1;
    if (kv->val.type != GGUF_VT_STRING) return type_err(kv, key, "string", err, err_len);
    *out = kv->val.v.s;
    return 0;
}

int gguf_get_arr(const gguf_file *f, const char *key, gguf_vtype elem_type, const gguf_value **out, char *err,
                 size_t err_len) {
    const gguf_kv *kv = find_or_err(f, key, err, err_len);
    if (!kv) return -1;
    if (kv->val.type != GGUF_VT_ARRAY) return type_err(kv, key, "array", err, err_len);
    if (elem_type != GGUF_VT_COUNT && kv->val.v.arr.elem_type != elem_type) {
        snprintf(err, err_len, "gguf: key '%s' is an array of %s, expected %s", key,
                 gguf_vtype_name(kv->val.v.arr.elem_type), gguf_vtype_name(elem_type));
        return -1;
    }
    *out = &kv->val;
    return 0;
}

static uint64_t raw_elem(const gguf_value *arr, uint64_t i, int *bytes) {
    *bytes = scalar_bytes(arr->v.arr.elem_type);
    uint64_t v = 0;
    const uint8_t *p = arr->v.arr.raw + i * (uint64_t)*bytes;
    for (int b = 0; b < *bytes; b++) v |= (uint64_t)p[b] << (8 * b);
    return v;
}

int64_t gguf_arr_i64(const gguf_value *arr, uint64_t i) {
    int bytes;
    if (!arr->v.arr.raw || i >= arr->v.arr.count) return 0;
    uint64_t v = raw_elem(arr, i, &bytes);
    gguf_vtype t = arr->v.arr.elem_type;
    if (t == GGUF_VT_FLOAT32) return (int64_t)bits_to_f32(v);
    if (t == GGUF_VT_FLOAT64) return (int64_t)bits_to_f64(v);
    return is_signed(t) ? sign_extend(v, bytes) : (int64_t)v;
}

double gguf_arr_f64(const gguf_value *arr, uint64_t i) {
    int bytes;
    if (!arr->v.arr.raw || i >= arr->v.arr.count) return 0;
    uint64_t v = raw_elem(arr, i, &bytes);
    gguf_vtype t = arr->v.arr.elem_type;
    if (t == GGUF_VT_FLOAT32) return bits_to_f32(v);
    if (t == GGUF_VT_FLOAT64) return bits_to_f64(v);
    return is_signed(t) ? (double)sign_extend(v, bytes) : (double)v;
}
