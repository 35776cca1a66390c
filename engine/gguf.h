/* gguf.h — a GGUF v2/v3 reader that never trusts the file.
 *
 * The file is mmapped read-only; every offset and size is bounds-checked before
 * use and every count is checked for overflow. On error a function returns
 * non-zero (or NULL) and writes a one-line reason into the caller's buffer.
 * Strings and array payloads point into the mapping: they stay valid until
 * gguf_close(). GGUF strings are NOT NUL-terminated: use gguf_str.len. */
#ifndef KVB_GGUF_H
#define KVB_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/dtype.h" /* ggml_type */

/* Limits on what a file may declare, refused with a one-line error naming the limit. Real models hold a few
 * dozen metadata keys (a vocabulary is one array key) and at most a few thousand tensors (GGUFs that keep each
 * MoE expert apart reach ~50k). */
#define GGUF_MAX_KV_COUNT 65536
#define GGUF_MAX_TENSOR_COUNT 262144

typedef enum {
    GGUF_VT_UINT8 = 0, GGUF_VT_INT8 = 1, GGUF_VT_UINT16 = 2, GGUF_VT_INT16 = 3,
    GGUF_VT_UINT32 = 4, GGUF_VT_INT32 = 5, GGUF_VT_FLOAT32 = 6, GGUF_VT_BOOL = 7,
    GGUF_VT_STRING = 8, GGUF_VT_ARRAY = 9, GGUF_VT_UINT64 = 10, GGUF_VT_INT64 = 11,
    GGUF_VT_FLOAT64 = 12, GGUF_VT_COUNT
} gguf_vtype;

typedef struct { const char *ptr; uint64_t len; } gguf_str;

typedef struct gguf_value gguf_value;
struct gguf_value {
    gguf_vtype type;
    union {
        uint64_t u; /* UINT8..UINT64, BOOL (0/1) */
        int64_t i;  /* INT8..INT64 */
        double f;   /* FLOAT32, FLOAT64 */
        gguf_str s; /* STRING */
        struct {
            gguf_vtype elem_type;
            uint64_t count;
            const uint8_t *raw;  /* scalar elements: packed little-endian payload (may be unaligned) */
            gguf_str *strs;      /* STRING elements: count entries (owned by gguf_file) */
            gguf_value *items;   /* ARRAY elements (nested arrays): count entries (owned) */
        } arr;
    } v;
};

typedef struct {
    gguf_str key;
    gguf_value val;
} gguf_kv;

typedef struct {
    gguf_str name;
    uint32_t n_dims;
    uint64_t ne[4];      /* ne[0] = row length (contiguous), unused dims = 1 */
    ggml_type type;
    uint64_t offset;     /* relative to the data section */
    uint64_t n_bytes;
    const void *data;    /* inside the mapping, bounds-checked */
} gguf_tensor;

typedef struct gguf_file {
    void *map;
    size_t map_bytes;
    uint32_t version;
    uint32_t alignment;
    uint64_t n_kv;
    gguf_kv *kv;
    uint64_t n_tensors;
    gguf_tensor *tensors;
    uint64_t data_offset; /* start of the tensor data section in the file */
} gguf_file;

/* Open and validate a GGUF file (a regular file: a FIFO or device is refused without blocking). Returns NULL
 * and fills err on failure. Validation (here and in gguf_open_mem): counts within GGUF_MAX_*, no duplicate key
 * or tensor name, tensor sizes without 64-bit overflow, tensor data inside the file and not overlapping. */
gguf_file *gguf_open(const char *path, char *err, size_t err_len);
/* Parse a GGUF image already in memory (not copied; must outlive the handle). */
gguf_file *gguf_open_mem(const void *buf, size_t n_bytes, char *err, size_t err_len);
/* Release the mapping and all parsed tables. NULL is a no-op. */
void gguf_close(gguf_file *f);

/* Metadata lookup by key; NULL when absent. */
const gguf_kv *gguf_find(const gguf_file *f, const char *key);
/* Typed getters: 0 = ok; non-zero (with err) when missing or of an incompatible type.
 * Integer getters accept any integer type whose value fits. */
int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out, char *err, size_t err_len);
int gguf_get_f32(const gguf_file *f, const char *key, float *out, char *err, size_t err_len);
int gguf_get_bool(const gguf_file *f, const char *key, int *out, char *err, size_t err_len);
int gguf_get_str(const gguf_file *f, const char *key, gguf_str *out, char *err, size_t err_len);
/* Array of the given element type (GGUF_VT_COUNT = any). */
int gguf_get_arr(const gguf_file *f, const char *key, gguf_vtype elem_type, const gguf_value **out,
                 char *err, size_t err_len);
/* Read element i of a scalar array as int64 / double (bounds-checked by caller: i < count). */
int64_t gguf_arr_i64(const gguf_value *arr, uint64_t i);
double gguf_arr_f64(const gguf_value *arr, uint64_t i);

/* Tensor lookup by name; NULL when absent. */
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name);

/* Name of a metadata value type. (Tensor types, ggml_type: kernels/dtype.h.) */
const char *gguf_vtype_name(gguf_vtype t);

/* Compare a gguf_str with a C string. */
int gguf_str_eq(gguf_str s, const char *c);
/* A string from the file made fit for a one-line message in out: its first 100 bytes through kvb_str_shown_n
 * (base/text.h: control bytes as \xNN), so a key or name cannot move the cursor or recolour a terminal. */
const char *gguf_str_safe(gguf_str s, char *out, size_t cap);

#endif
