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

/* ---- tiny models ---- */

static void tiny_tensor(gw_writer *g, const gw_tiny *t, const char *name, int64_t cols, int64_t rows) {
    const float *d = t->tensor(t->user, name, cols * rows);
    uint64_t ne[2] = {(uint64_t)cols, (uint64_t)rows};
    gw_tensor(g, name, GGML_T_F32, rows > 1 ? 2 : 1, ne, d, (size_t)(cols * rows) * sizeof(float));
}

/* The GPT-2 byte-level symbol of byte b (printable bytes stand for themselves, the rest map to U+0100 on). */
static void byte_symbol(int b, char out[4]) {
    static int cp[256];
    if (!cp['!']) {
        int n = 0;
        for (int i = 0; i < 256; i++) cp[i] = (i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174) ? i : 256 + n++;
    }
    int c = cp[b];
    if (c < 0x80) out[0] = (char)c, out[1] = 0;
    else out[0] = (char)(0xC0 | (c >> 6)), out[1] = (char)(0x80 | (c & 0x3F)), out[2] = 0;
}

int gw_write_tiny(const gw_tiny *t, const char *path) {
    if (t->byte_vocab && t->n_vocab != GW_BYTE_VOCAB) return -1;
    gw_writer *g = gw_new();
    char key[96];
    gw_kv_str(g, "general.architecture", t->arch);
#define K(s) (snprintf(key, sizeof key, "%s.%s", t->arch, s), key)
    gw_kv_u32(g, K("block_count"), (uint32_t)t->n_layer);
    gw_kv_u32(g, K("context_length"), (uint32_t)t->n_ctx);
    gw_kv_u32(g, K("embedding_length"), (uint32_t)t->n_embd);
    gw_kv_u32(g, K("feed_forward_length"), (uint32_t)t->n_ff);
    gw_kv_u32(g, K("attention.head_count"), (uint32_t)t->n_head);
    gw_kv_u32(g, K("attention.head_count_kv"), (uint32_t)t->n_head_kv);
    gw_kv_f32(g, K("rope.freq_base"), 500.0f);
    gw_kv_f32(g, K("attention.layer_norm_rms_epsilon"), 1e-5f);
#undef K
    gw_kv_str(g, "tokenizer.ggml.model", "gpt2");
    gw_kv_str(g, "tokenizer.ggml.pre", "gpt2");
    char(*tok_buf)[16] = calloc((size_t)t->n_vocab, sizeof *tok_buf);
    const char **toks = calloc((size_t)t->n_vocab, sizeof *toks);
    int32_t *types = calloc((size_t)t->n_vocab, sizeof *types);
    static const char *const specials[3] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    for (int i = 0; i < t->n_vocab; i++) {
        if (t->byte_vocab && i < 3) snprintf(tok_buf[i], sizeof tok_buf[i], "%s", specials[i]);
        else if (t->byte_vocab) byte_symbol(i - 3, tok_buf[i]);
        else snprintf(tok_buf[i], sizeof tok_buf[i], "t%d", i);
        toks[i] = tok_buf[i];
        types[i] = t->byte_vocab && i < 3 ? 3 : 1; /* 3 = control */
    }
    gw_kv_arr_str(g, "tokenizer.ggml.tokens", toks, t->n_vocab);
    gw_kv_arr_i32(g, "tokenizer.ggml.token_type", types, t->n_vocab);
    free(tok_buf), free(toks), free(types);
    const char *merges[1] = {"t 1"}; /* never yields a token: "t1" is none */
    gw_kv_arr_str(g, "tokenizer.ggml.merges", merges, 1);
    gw_kv_u32(g, "tokenizer.ggml.bos_token_id", 1);
    gw_kv_u32(g, "tokenizer.ggml.eos_token_id", 2);
    if (t->chat_template) gw_kv_str(g, "tokenizer.chat_template", t->chat_template);
    const int E = t->n_embd, KV = t->n_head_kv * (t->n_embd / t->n_head), FF = t->n_ff;
    int qwen2 = !strcmp(t->arch, "qwen2");
    tiny_tensor(g, t, "token_embd.weight", E, t->n_vocab);
    tiny_tensor(g, t, "output_norm.weight", E, 1);
    for (int l = 0; l < t->n_layer; l++) {
        char n[64];
#define N(s) (snprintf(n, sizeof n, "blk.%d.%s", l, s), n)
        tiny_tensor(g, t, N("attn_norm.weight"), E, 1);
        tiny_tensor(g, t, N("ffn_norm.weight"), E, 1);
        tiny_tensor(g, t, N("attn_q.weight"), E, E);
        tiny_tensor(g, t, N("attn_k.weight"), E, KV);
        tiny_tensor(g, t, N("attn_v.weight"), E, KV);
        tiny_tensor(g, t, N("attn_output.weight"), E, E);
        tiny_tensor(g, t, N("ffn_gate.weight"), E, FF);
        tiny_tensor(g, t, N("ffn_up.weight"), E, FF);
        tiny_tensor(g, t, N("ffn_down.weight"), FF, E);
        if (qwen2) {
            tiny_tensor(g, t, N("attn_q.bias"), E, 1);
            tiny_tensor(g, t, N("attn_k.bias"), KV, 1);
            tiny_tensor(g, t, N("attn_v.bias"), KV, 1);
        }
#undef N
    }
    int rc = gw_write_file(g, path);
    gw_free(g);
    return rc;
}

const float *gw_random_tensor(void *user, const char *name, int64_t n) {
    gw_random *r = user;
    float scale = 0.2f, offset = 0;
    if (strstr(name, "norm")) offset = 1.0f;
    else if (!strcmp(name, "token_embd.weight")) scale = 1.0f;
    else if (strstr(name, ".bias")) scale = 0.1f;
    else if (strstr(name, "attn_q.") || strstr(name, "attn_k.") || strstr(name, "attn_v.")) scale = r->qkv_scale;
    free(r->buf);
    r->buf = malloc((size_t)n * sizeof *r->buf);
    for (int64_t i = 0; i < n; i++) {
        r->state = r->state * 6364136223846793005ull + 1442695040888963407ull;
        r->buf[i] = offset + scale * ((float)((r->state >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f);
    }
    return r->buf;
}
