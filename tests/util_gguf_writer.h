/* util_gguf_writer.h — a small GGUF v3 writer for tests: build metadata and tensors in memory, then
 * get the bytes or write a file. Used to make tiny models and corrupt files on purpose. */
#ifndef KVB_TEST_GGUF_WRITER_H
#define KVB_TEST_GGUF_WRITER_H

#include <stddef.h>
#include <stdint.h>

#include "engine/gguf.h"

typedef struct gw_writer gw_writer;

gw_writer *gw_new(void);
void gw_free(gw_writer *w);
/* Alignment of tensor data (default 32; also writes general.alignment when not 32). */
void gw_set_alignment(gw_writer *w, uint32_t alignment);
void gw_kv_u32(gw_writer *w, const char *key, uint32_t v);
void gw_kv_i32(gw_writer *w, const char *key, int32_t v);
void gw_kv_f32(gw_writer *w, const char *key, float v);
void gw_kv_bool(gw_writer *w, const char *key, int v);
void gw_kv_str(gw_writer *w, const char *key, const char *v);
/* Any scalar type: raw little-endian bytes of the value (1, 2, 4 or 8 bytes as the type needs). */
void gw_kv_scalar(gw_writer *w, const char *key, gguf_vtype type, const void *value);
void gw_kv_arr_str(gw_writer *w, const char *key, const char *const *strs, int n);
void gw_kv_arr_i32(gw_writer *w, const char *key, const int32_t *v, int n);
void gw_kv_arr_f32(gw_writer *w, const char *key, const float *v, int n);
/* An array of n arrays of int32, item i holding lens[i] values from vals[i]. */
void gw_kv_arr_arr_i32(gw_writer *w, const char *key, const int32_t *const *vals, const int *lens, int n);
/* A tensor: type, dims (ne[0] = row length), raw data of n_bytes (copied). */
void gw_tensor(gw_writer *w, const char *name, ggml_type type, int n_dims, const uint64_t *ne, const void *data,
               size_t n_bytes);
/* The file image (malloc'd, caller frees). 0 = ok. */
int gw_finish(gw_writer *w, uint8_t **buf, size_t *len);
/* Finish the image into *buf (caller frees it after gguf_close), free the writer, and parse the image.
 * NULL (with err) when the reader rejects it. */
gguf_file *gw_open(gw_writer *w, uint8_t **buf, char *err, size_t err_len);
/* Write the image to path. 0 = ok. */
int gw_write_file(gw_writer *w, const char *path);

#endif
