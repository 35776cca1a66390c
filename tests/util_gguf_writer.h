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

/* ---- tiny models ---- */

/* Vocabulary size of a byte vocabulary: <|endoftext|> <|im_start|> <|im_end|> (control tokens 0, 1, 2), then one
 * token per byte b (id 3 + b, its GPT-2 byte symbol), so any text encodes as one token per byte. */
#define GW_BYTE_VOCAB 259

/* A tiny llama / qwen2 model with f32 weights. Tensors come from tensor(user, name, n) in file order:
 * token_embd, output_norm, then per layer attn_norm, ffn_norm, attn_q, attn_k, attn_v, attn_output, ffn_gate,
 * ffn_up, ffn_down (and attn_q/k/v biases for qwen2). The vocabulary is "t0".."t<n_vocab-1>" (for tests that feed
 * ids) or, with byte_vocab (n_vocab = GW_BYTE_VOCAB), the byte vocabulary; chat_template (may be NULL) is stored
 * as tokenizer.chat_template. */
typedef struct {
    const char *arch; /* "llama" or "qwen2" */
    int n_layer, n_embd, n_head, n_head_kv, n_ff, n_vocab, n_ctx;
    int byte_vocab;
    const char *chat_template;
    const float *(*tensor)(void *user, const char *name, int64_t n);
    void *user;
} gw_tiny;
/* Write the model to path. 0 = ok. */
int gw_write_tiny(const gw_tiny *t, const char *path);

/* A tensor source for gw_write_tiny: uniform values from a 64-bit LCG (state advances across calls):
 * token_embd in [-1, 1], norms in [0.8, 1.2], attn_q/k/v in [-qkv_scale, qkv_scale], biases in [-0.1, 0.1],
 * every other matrix in [-0.2, 0.2]. buf is scratch (free it after writing). */
typedef struct {
    uint64_t state;
    float qkv_scale;
    float *buf;
} gw_random;
const float *gw_random_tensor(void *user, const char *name, int64_t n);

#endif
