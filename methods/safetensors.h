/* safetensors.h — a reader for Hugging Face's safetensors files (the format: an 8-byte little-endian header
 * length N, N bytes of JSON {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}},
 * then the tensors' bytes, offsets relative to the end of the header). Small files only: the whole file is read
 * into memory (KVzap's scorers, methods/kvzap.c). Every malformed header, unknown dtype, offset outside the data
 * or size that disagrees with the shape is a one-line error naming the file and the tensor. */
#ifndef KVB_SAFETENSORS_H
#define KVB_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

enum { KVB_ST_MAX_DIMS = 4 };
typedef enum { KVB_ST_F32 = 0, KVB_ST_F16, KVB_ST_BF16 } kvb_st_dtype;

typedef struct {
    char *name;
    kvb_st_dtype dtype;
    int n_dims;
    int64_t shape[KVB_ST_MAX_DIMS];
    int64_t numel;
    const uint8_t *data; /* numel elements of dtype, little-endian */
} kvb_st_tensor;

typedef struct {
    char *path;
    char *buf; /* the whole file */
    size_t size;
    kvb_st_tensor *t;
    int n;
} kvb_st_file;

/* Read and check path (a file); 0, or -1 + err ("PATH: why"). *f is zeroed first; kvb_st_close frees it either
 * way. */
int kvb_st_open(kvb_st_file *f, const char *path, char *err, size_t err_len);
/* The tensor of that name, or NULL. */
const kvb_st_tensor *kvb_st_find(const kvb_st_file *f, const char *name);
/* Its elements as float (f16 and bf16 widened exactly) into out[numel]. */
void kvb_st_to_f32(const kvb_st_tensor *t, float *out);
void kvb_st_close(kvb_st_file *f);

#endif
