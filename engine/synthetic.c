/* synthetic.c — the shape table, the name parser and the seeded weight generator of synthetic models.
 *
 * Shapes are the GGUF config keys of the real models (block_count, embedding_length, attention.head_count,
 * head_count_kv, feed_forward_length, vocabulary size, rope.freq_base, context_length, rms epsilon).
 * Weights: element i of tensor t is the i-th output of a splitmix64 stream keyed by (seed, t), so any
 * element is reproducible alone and the generation splits over threads in any way with the same result.
 * Matrices are uniform in +-sqrt(3/cols) (variance 1/cols): a product with a unit-RMS input keeps unit
 * variance, so after RMSNorm each layer adds O(1) to the residual and the logits stay finite and spread. */
#include "engine/synthetic.h"
#include "kernels/cpu/pool.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kernels/dtype.h"

#define ERR(...) (snprintf(err, err_len, __VA_ARGS__), -1)

typedef struct {
    const char *name;
    const char *arch;
    int n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx_train;
    float rope_freq_base, rms_eps;
    int tied_output;
    int llama3_rope; /* Llama 3.1's rope_freqs (rope_type llama3: factor 8, low/high frequency factors 1 and 4, 8K) */
    int n_swa;       /* attention.sliding_window (Mistral-7B-v0.1: 4096 on every layer; gemma3: its local layers) */
    int qk_norm;     /* qwen3, gemma3: per-head RMSNorm of Q and K (attn_q_norm / attn_k_norm tensors) */
    float rope_linear; /* linear RoPE scaling factor of the global layers (gemma3 4B+: 8), 0 = none */
} syn_shape;

static const syn_shape SHAPES[] = {
    /* Meta-Llama-3-8B */
    {"llama3-8b", "llama", 32, 4096, 32, 8, 128, 14336, 128256, 8192, 500000.0f, 1e-5f, 0, 0, 0, 0, 0.0f},
    /* Meta-Llama-3.1-8B: the same shapes at 128K, with its rope scaling (rope_freqs as its GGUF carries them) */
    {"llama3.1-8b", "llama", 32, 4096, 32, 8, 128, 14336, 128256, 131072, 500000.0f, 1e-5f, 0, 1, 0, 0, 0.0f},
    /* Mistral-7B-v0.1: a 4096-token sliding window on every layer */
    {"mistral-7b", "llama", 32, 4096, 32, 8, 128, 14336, 32000, 32768, 10000.0f, 1e-5f, 0, 0, 4096, 0, 0.0f},
    /* Qwen2.5-7B(-Instruct): QKV biases and NEOX rope come with arch qwen2 */
    {"qwen2.5-7b", "qwen2", 28, 3584, 28, 4, 128, 18944, 152064, 32768, 1000000.0f, 1e-6f, 0, 0, 0, 0, 0.0f},
    /* Qwen3-8B: Q/K norms, no biases, NEOX rope (its config.json; 40960 positions) */
    {"qwen3-8b", "qwen3", 36, 4096, 32, 8, 128, 12288, 151936, 40960, 1000000.0f, 1e-6f, 0, 0, 0, 1, 0.0f},
    /* Gemma-3-4B: 5 local layers (window 1024, RoPE base 10000) to each global one (base 1e6, linear x8), Q/K
     * norms, post-norms, GeGLU, embeddings x sqrt(n_embd), output tied (its config.json, the GGUF's 262144 ids) */
    {"gemma3-4b", "gemma3", 34, 2560, 8, 4, 256, 10240, 262144, 131072, 1000000.0f, 1e-6f, 1, 0, 1024, 1, 8.0f},
    /* SmolLM2-135M(-Instruct): output tied to the token embedding */
    {"smollm2-135m", "llama", 30, 576, 9, 3, 64, 1536, 49152, 8192, 100000.0f, 1e-5f, 1, 0, 0, 0, 0.0f},
    /* tests: small enough for a float64 reference forward */
    {"tiny", "llama", 2, 64, 4, 2, 16, 128, 256, 4096, 10000.0f, 1e-5f, 0, 0, 0, 0, 0.0f},
};
enum { N_SHAPES = sizeof SHAPES / sizeof *SHAPES };

const char *syn_shape_names(void) { /* the table's names, comma-separated (built once) */
    static char names[256];
    if (!names[0])
        for (int i = 0; i < N_SHAPES; i++) {
            size_t l = strlen(names);
            snprintf(names + l, sizeof names - l, "%s%s", i ? ", " : "", SHAPES[i].name);
        }
    return names;
}

int syn_is_name(const char *name) { return name && strncmp(name, SYN_PREFIX, strlen(SYN_PREFIX)) == 0; }

static int parse_u64(const char *s, size_t len, uint64_t lo, uint64_t hi, uint64_t *out) {
    if (len == 0 || len > 20) return -1;
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        uint64_t d = (uint64_t)(s[i] - '0');
        if (v > (UINT64_MAX - d) / 10) return -1;
        v = v * 10 + d;
    }
    if (v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int syn_parse(const char *name, syn_spec *out, char *err, size_t err_len) {
    memset(out, 0, sizeof *out);
    if (!syn_is_name(name)) return ERR("'%s' is not a synthetic model name (synthetic:<shape>)", name);
    const char *shape = name + strlen(SYN_PREFIX);
    const char *q = strchr(shape, '?');
    size_t shape_len = q ? (size_t)(q - shape) : strlen(shape);
    const syn_shape *sh = NULL;
    for (int i = 0; i < N_SHAPES; i++)
        if (strlen(SHAPES[i].name) == shape_len && !strncmp(SHAPES[i].name, shape, shape_len)) sh = &SHAPES[i];
    if (!sh)
        return ERR("unknown synthetic shape '%.*s' (valid: %s)", (int)(shape_len < 64 ? shape_len : 64), shape,
                   syn_shape_names());
    snprintf(out->shape, sizeof out->shape, "%s", sh->name);
    kvb_config *c = &out->cfg;
    snprintf(c->arch, sizeof c->arch, "%s", sh->arch);
    c->n_layer = sh->n_layer;
    c->n_embd = sh->n_embd;
    c->n_head = sh->n_head;
    c->n_head_kv = sh->n_head_kv;
    c->head_dim = sh->head_dim;
    c->n_rot = sh->head_dim;
    c->n_ff = sh->n_ff;
    c->n_vocab = sh->n_vocab;
    c->n_ctx_train = sh->n_ctx_train;
    c->rms_eps = sh->rms_eps;
    c->rope_freq_base = sh->rope_freq_base;
    const int gemma = strcmp(sh->arch, "gemma3") == 0;
    c->rope_neox = strcmp(sh->arch, "llama") != 0;
    c->has_qkv_bias = strcmp(sh->arch, "qwen2") == 0;
    c->tied_output = sh->tied_output;
    c->q_dim = sh->n_head * sh->head_dim;
    c->attn_scale = 1.0f / sqrtf((float)sh->head_dim);
    c->rope = (kvb_rope_params){sh->rope_freq_base, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f, sh->n_ctx_train, NULL};
    c->ffn_act = gemma ? KVB_FFN_GEGLU : KVB_FFN_SWIGLU;
    c->qk_norm = sh->qk_norm;
    c->post_norms = gemma;
    c->embd_scale = gemma ? sqrtf((float)sh->n_embd) : 0.0f;
    if (sh->rope_linear > 0.0f) { /* as engine/arch.c reads rope.scaling.type linear */
        c->rope.freq_scale = 1.0f / sh->rope_linear;
        c->rope_scaled = 1;
    }
    c->n_swa = sh->n_swa;
    c->rope_freq_base_swa = gemma ? 10000.0f : 0.0f;
    /* every layer local where a window is declared (Mistral), gemma3's pattern of 6 (5 local, then 1 global) */
    for (int l = 0; l < KVB_MAX_LAYERS; l++) c->swa_layer[l] = sh->n_swa > 0 && (!gemma || l % 6 < 5);
    out->llama3_rope = sh->llama3_rope;
    out->seed = 0;
    if (!q) return 0;
    const char *p = q + 1;
    int seen = 0;
    do {
        size_t len = strcspn(p, "&");
        const char *eq = memchr(p, '=', len);
        if (!eq) return ERR("synthetic model '%s': override '%.*s' is not key=value (keys: layers, seed, ctx)", name,
                            (int)len, p);
        size_t klen = (size_t)(eq - p), vlen = len - klen - 1;
        const char *v = eq + 1;
        uint64_t x;
        int bit;
        if (klen == 6 && !strncmp(p, "layers", 6)) {
            bit = 1;
            if (parse_u64(v, vlen, 1, 1024, &x)) return ERR("synthetic model '%s': layers must be an integer in [1, 1024]", name);
            c->n_layer = (int)x;
        } else if (klen == 4 && !strncmp(p, "seed", 4)) {
            bit = 2;
            if (parse_u64(v, vlen, 0, UINT64_MAX, &x)) return ERR("synthetic model '%s': seed must be an unsigned 64-bit integer", name);
            out->seed = x;
        } else if (klen == 3 && !strncmp(p, "ctx", 3)) {
            bit = 4;
            if (parse_u64(v, vlen, 1, 1 << 24, &x)) return ERR("synthetic model '%s': ctx must be an integer in [1, 16777216]", name);
            c->n_ctx_train = (int)x;
        } else {
            return ERR("synthetic model '%s': unknown override '%.*s' (valid keys: layers, seed, ctx)", name, (int)klen, p);
        }
        if (seen & bit) return ERR("synthetic model '%s': '%.*s' given twice", name, (int)klen, p);
        seen |= bit;
        p += len;
    } while (*p++ == '&');
    return 0;
}

void syn_canonical_name(const syn_spec *s, char *out, size_t cap) {
    snprintf(out, cap, SYN_PREFIX "%s?layers=%d&seed=%" PRIu64 "&ctx=%d", s->shape, s->cfg.n_layer, s->seed,
             s->cfg.n_ctx_train);
}

/* ---- tensor list ---- */

enum { G_TOK_EMBD, G_OUTPUT_NORM, G_OUTPUT, N_GLOBAL };
enum {
    L_ATTN_NORM, L_Q, L_K, L_V, L_O, L_FFN_NORM, L_GATE, L_UP, L_DOWN, /* every architecture */
    L_BQ, L_BK, L_BV,                                                   /* qwen2's biases */
    L_QN, L_KN,                                                         /* qk_norm */
    L_APN, L_FPN,                                                       /* post_norms */
    N_KINDS
};
enum { ID_LAYER_BASE = 16, ID_LAYER_STRIDE = 16 }; /* tensor id = base + layer * stride + kind */

static const char *const LAYER_NAMES[N_KINDS] = {
    "attn_norm.weight", "attn_q.weight",  "attn_k.weight", "attn_v.weight", "attn_output.weight", "ffn_norm.weight",
    "ffn_gate.weight",  "ffn_up.weight",  "ffn_down.weight", "attn_q.bias", "attn_k.bias",        "attn_v.bias",
    "attn_q_norm.weight", "attn_k_norm.weight", "post_attention_norm.weight", "post_ffw_norm.weight"};

static int n_global(const syn_spec *s) { return s->cfg.tied_output ? N_GLOBAL - 1 : N_GLOBAL; }

/* the kinds of tensor a layer of this architecture has, in order; their count */
static int layer_kinds(const syn_spec *s, int kinds[N_KINDS]) {
    int n = 0;
    for (int k = L_ATTN_NORM; k <= L_DOWN; k++) kinds[n++] = k;
    if (s->cfg.has_qkv_bias) kinds[n++] = L_BQ, kinds[n++] = L_BK, kinds[n++] = L_BV;
    if (s->cfg.qk_norm) kinds[n++] = L_QN, kinds[n++] = L_KN;
    if (s->cfg.post_norms) kinds[n++] = L_APN, kinds[n++] = L_FPN;
    return n;
}

static int n_per_layer(const syn_spec *s) {
    int kinds[N_KINDS];
    return layer_kinds(s, kinds);
}

int64_t syn_tensor_count(const syn_spec *s) { return n_global(s) + (int64_t)s->cfg.n_layer * n_per_layer(s); }

static void set_tensor(syn_tensor *t, uint32_t id, int64_t cols, int64_t rows) {
    t->id = id;
    t->n_dims = rows > 0 ? 2 : 1;
    t->ne[0] = cols;
    t->ne[1] = rows > 0 ? rows : 1;
    t->type = rows > 0 ? GGML_T_F16 : GGML_T_F32;
    t->n_bytes = (uint64_t)cols * (uint64_t)t->ne[1] * (rows > 0 ? sizeof(kvb_f16) : sizeof(float));
}

void syn_tensor_get(const syn_spec *s, int64_t i, syn_tensor *t) {
    const kvb_config *c = &s->cfg;
    const int64_t D = c->n_embd, kv_dim = (int64_t)c->n_head_kv * c->head_dim, q_dim = (int64_t)c->n_head * c->head_dim;
    memset(t, 0, sizeof *t);
    if (i < n_global(s)) {
        if (i == G_TOK_EMBD) {
            snprintf(t->name, sizeof t->name, "token_embd.weight");
            set_tensor(t, G_TOK_EMBD, D, c->n_vocab);
        } else if (i == G_OUTPUT_NORM) {
            snprintf(t->name, sizeof t->name, "output_norm.weight");
            set_tensor(t, G_OUTPUT_NORM, D, 0);
        } else {
            snprintf(t->name, sizeof t->name, "output.weight");
            set_tensor(t, G_OUTPUT, D, c->n_vocab);
        }
        return;
    }
    int64_t j = i - n_global(s);
    int kinds[N_KINDS];
    const int per = layer_kinds(s, kinds);
    int l = (int)(j / per), k = kinds[j % per];
    snprintf(t->name, sizeof t->name, "blk.%d.%s", l, LAYER_NAMES[k]);
    uint32_t id = (uint32_t)(ID_LAYER_BASE + l * ID_LAYER_STRIDE + k);
    switch (k) {
    case L_ATTN_NORM: case L_FFN_NORM: set_tensor(t, id, D, 0); break;
    case L_Q: set_tensor(t, id, D, q_dim); break;
    case L_K: case L_V: set_tensor(t, id, D, kv_dim); break;
    case L_O: set_tensor(t, id, q_dim, D); break;
    case L_GATE: case L_UP: set_tensor(t, id, D, c->n_ff); break;
    case L_DOWN: set_tensor(t, id, c->n_ff, D); break;
    case L_BQ: set_tensor(t, id, q_dim, 0); break;
    case L_BK: case L_BV: set_tensor(t, id, kv_dim, 0); break;
    case L_QN: case L_KN: set_tensor(t, id, c->head_dim, 0); break;
    default: set_tensor(t, id, D, 0); break; /* L_APN, L_FPN */
    }
}

uint64_t syn_weight_bytes(const syn_spec *s) {
    uint64_t n = 0;
    syn_tensor t;
    for (int64_t i = 0; i < syn_tensor_count(s); i++) {
        syn_tensor_get(s, i, &t);
        n += t.n_bytes;
    }
    return n;
}

/* ---- values ---- */

#define GOLDEN 0x9E3779B97F4A7C15ull

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t stream_key(uint64_t seed, uint32_t id) { return mix64(mix64(seed) ^ mix64(((uint64_t)id + 1) * GOLDEN)); }

/* 24 random bits -> uniform in [-1, 1), exact in float */
static inline float unit24(uint64_t bits) { return (float)((int32_t)(bits & 0xffffff) - (1 << 23)) * (1.0f / (1 << 23)); }

/* Element index of a stream: output index/2 of splitmix64 started at key serves elements 2k (bits 8..31) and
 * 2k+1 (bits 40..63), which halves the cost of the hash, the bulk of the generation time. */
static inline uint64_t pair_hash(uint64_t key, uint64_t index) { return mix64(key + ((index >> 1) + 1) * GOLDEN); }
static inline float unit(uint64_t key, uint64_t index) {
    return unit24(pair_hash(key, index) >> (index & 1 ? 40 : 8));
}

typedef enum { INIT_ONE, INIT_UNIFORM } init_kind;

static init_kind tensor_init(const syn_tensor *t, float *scale) {
    if (t->n_dims == 2) {
        *scale = sqrtf(3.0f / (float)t->ne[0]);
        return INIT_UNIFORM;
    }
    const uint32_t kind = (t->id - ID_LAYER_BASE) % ID_LAYER_STRIDE;
    int is_bias = t->id >= ID_LAYER_BASE && kind >= L_BQ && kind <= L_BV; /* norms are ones */
    *scale = 0.1f;
    return is_bias ? INIT_UNIFORM : INIT_ONE;
}

float syn_element(const syn_spec *s, const syn_tensor *t, uint64_t index) {
    float scale;
    if (tensor_init(t, &scale) == INIT_ONE) return 1.0f;
    return scale * unit(stream_key(s->seed, t->id), index);
}

/* ---- generation ---- */

enum { CHUNK_ELEMS = 1 << 18, ARENA_ALIGN = 64, HUGE_PAGE = 2 << 20 };

typedef struct {
    void *data;
    syn_tensor t;
    uint64_t key, first_chunk, n_chunks;
    float scale;
    init_kind init;
} gen_tensor;

typedef struct {
    gen_tensor *ts;
    int64_t n_ts;
    uint64_t n_chunks;
    atomic_uint_fast64_t next;
} gen_job;

static void fill_chunk(const gen_tensor *g, uint64_t lo, uint64_t hi) {
    if (g->t.type == GGML_T_F16) {
        kvb_f16 *d = g->data;
        uint64_t i = lo;
        if (i & 1) d[i] = kvb_f32_to_f16(g->scale * unit(g->key, i)), i++;
        for (; i + 1 < hi; i += 2) {
            uint64_t h = pair_hash(g->key, i);
            d[i] = kvb_f32_to_f16(g->scale * unit24(h >> 8));
            d[i + 1] = kvb_f32_to_f16(g->scale * unit24(h >> 40));
        }
        if (i < hi) d[i] = kvb_f32_to_f16(g->scale * unit(g->key, i));
    } else {
        float *d = g->data;
        for (uint64_t i = lo; i < hi; i++) d[i] = g->init == INIT_ONE ? 1.0f : g->scale * unit(g->key, i);
    }
}

/* Threads take chunks in increasing order from one counter; each keeps a cursor into the tensor list. */
static void *gen_worker(void *arg) {
    gen_job *j = arg;
    int64_t cur = 0;
    for (;;) {
        uint64_t c = atomic_fetch_add(&j->next, 1);
        if (c >= j->n_chunks) break;
        while (c >= j->ts[cur].first_chunk + j->ts[cur].n_chunks) cur++;
        const gen_tensor *g = &j->ts[cur];
        uint64_t n = (uint64_t)g->t.ne[0] * (uint64_t)g->t.ne[1], lo = (c - g->first_chunk) * CHUNK_ELEMS;
        fill_chunk(g, lo, lo + CHUNK_ELEMS < n ? lo + CHUNK_ELEMS : n);
    }
    return NULL;
}

static void generate(gen_job *j) {
    long n_cpu = kvb_pool_default_threads();
    int n_threads = n_cpu < 1 ? 1 : n_cpu > 256 ? 256 : (int)n_cpu;
    if ((uint64_t)n_threads > j->n_chunks) n_threads = (int)(j->n_chunks ? j->n_chunks : 1);
    pthread_t tid[256];
    int started = 0;
    for (int i = 1; i < n_threads; i++) {
        if (pthread_create(&tid[started], NULL, gen_worker, j) != 0) break; /* fewer threads, same result */
        started++;
    }
    gen_worker(j);
    for (int i = 0; i < started; i++) pthread_join(tid[i], NULL);
}

static void bind_weight(kvb_weight *w, const gen_tensor *g) {
    w->data = g->data;
    w->type = g->t.type;
    w->cols = g->t.ne[0];
    w->rows = g->t.ne[1];
}

int syn_model_init(kvb_model *m, const char *name, char *err, size_t err_len) {
    syn_spec s;
    if (syn_parse(name, &s, err, err_len)) return -1;
    const kvb_config *c = &s.cfg;
    m->cfg = s.cfg;
    syn_canonical_name(&s, m->path, sizeof m->path);
    int64_t n_ts = syn_tensor_count(&s);
    gen_job job = {0};
    job.ts = calloc((size_t)n_ts, sizeof *job.ts);
    m->layers = calloc((size_t)c->n_layer, sizeof *m->layers);
    if (!job.ts || !m->layers) {
        free(job.ts);
        return ERR("out of memory");
    }
    uint64_t arena_bytes = 0;
    for (int64_t i = 0; i < n_ts; i++) {
        gen_tensor *g = &job.ts[i];
        syn_tensor_get(&s, i, &g->t);
        g->key = stream_key(s.seed, g->t.id);
        g->init = tensor_init(&g->t, &g->scale);
        uint64_t n = (uint64_t)g->t.ne[0] * (uint64_t)g->t.ne[1];
        g->first_chunk = job.n_chunks;
        g->n_chunks = (n + CHUNK_ELEMS - 1) / CHUNK_ELEMS;
        job.n_chunks += g->n_chunks;
        g->data = (void *)(uintptr_t)arena_bytes; /* offset until the arena exists */
        arena_bytes += (g->t.n_bytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
        m->weight_bytes += g->t.n_bytes;
    }
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0 && arena_bytes > (uint64_t)pages * (uint64_t)page) {
        free(job.ts);
        return ERR("%s: its weights take %.1f GiB, more than this machine's %.1f GiB of memory (try ?layers=N)",
                   name, arena_bytes / 1073741824.0, (double)pages * (double)page / 1073741824.0);
    }
    void *arena = NULL;
    if (posix_memalign(&arena, arena_bytes >= HUGE_PAGE ? HUGE_PAGE : ARENA_ALIGN, (size_t)arena_bytes) != 0) {
        free(job.ts);
        return ERR("%s: out of memory allocating %.1f GiB of weights", name, arena_bytes / 1073741824.0);
    }
#ifdef MADV_HUGEPAGE
    /* half of the time of filling 16 GB is page faults at 4 KiB; at 2 MiB they vanish (a hint: may be refused) */
    if (arena_bytes >= HUGE_PAGE) madvise(arena, (size_t)(arena_bytes / HUGE_PAGE * HUGE_PAGE), MADV_HUGEPAGE);
#endif
    m->syn_weights = arena;
    for (int64_t i = 0; i < n_ts; i++) job.ts[i].data = (char *)arena + (uintptr_t)job.ts[i].data;
    atomic_init(&job.next, 0);
    generate(&job);

    bind_weight(&m->tok_embd, &job.ts[G_TOK_EMBD]);
    m->output_norm = job.ts[G_OUTPUT_NORM].data;
    if (c->tied_output) m->output = m->tok_embd;
    else bind_weight(&m->output, &job.ts[G_OUTPUT]);
    int kinds[N_KINDS];
    const int per = layer_kinds(&s, kinds);
    for (int l = 0; l < c->n_layer; l++) {
        const gen_tensor *first = &job.ts[n_global(&s) + (int64_t)l * per];
        const gen_tensor *g[N_KINDS] = {0}; /* by kind */
        for (int k = 0; k < per; k++) g[kinds[k]] = &first[k];
        kvb_layer *L = &m->layers[l];
        L->attn_norm = g[L_ATTN_NORM]->data;
        L->ffn_norm = g[L_FFN_NORM]->data;
        bind_weight(&L->wq, g[L_Q]);
        bind_weight(&L->wk, g[L_K]);
        bind_weight(&L->wv, g[L_V]);
        bind_weight(&L->wo, g[L_O]);
        bind_weight(&L->w_gate, g[L_GATE]);
        bind_weight(&L->w_up, g[L_UP]);
        bind_weight(&L->w_down, g[L_DOWN]);
        if (c->has_qkv_bias) {
            L->bq = g[L_BQ]->data;
            L->bk = g[L_BK]->data;
            L->bv = g[L_BV]->data;
        }
        if (c->qk_norm) L->q_norm = g[L_QN]->data, L->k_norm = g[L_KN]->data;
        if (c->post_norms) L->attn_post_norm = g[L_APN]->data, L->ffn_post_norm = g[L_FPN]->data;
    }
    free(job.ts);
    if (s.llama3_rope) {
        /* convert_hf_to_gguf.py's rope_freqs for rope_type llama3: 1 for wavelengths under 8192/4, the factor 8
         * over 8192/1, a smooth blend between */
        const int n_pairs = c->n_rot / 2;
        float *ff = malloc((size_t)n_pairs * sizeof *ff);
        if (!ff) return ERR("out of memory");
        const double factor = 8, lo = 1, hi = 4, old_ctx = 8192, pi = 3.14159265358979323846;
        for (int i = 0; i < n_pairs; i++) {
            const double freq = 1.0 / pow(c->rope_freq_base, 2.0 * i / c->n_rot), wavelen = 2 * pi / freq;
            if (wavelen < old_ctx / hi) ff[i] = 1.0f;
            else if (wavelen > old_ctx / lo) ff[i] = (float)factor;
            else {
                const double smooth = (old_ctx / wavelen - lo) / (hi - lo);
                ff[i] = (float)(1.0 / ((1 - smooth) / factor + smooth));
            }
        }
        m->rope_freqs = ff;
    }
    return 0;
}

void syn_model_release(kvb_model *m) {
    free(m->syn_weights);
    m->syn_weights = NULL;
    if (!m->gguf) { /* a synthetic model's rope_freqs are its own allocation */
        free((void *)m->rope_freqs);
        m->rope_freqs = NULL;
    }
}

void syn_random_ids(uint64_t seed, int n_vocab, int32_t *ids, int64_t n) {
    uint64_t key = stream_key(seed, UINT32_MAX);
    for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)((mix64(key + ((uint64_t)i + 1) * GOLDEN) >> 32) % (uint64_t)n_vocab);
}
