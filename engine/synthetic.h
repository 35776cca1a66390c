/* synthetic.h — `synthetic:<shape>` models: a real architecture's exact shapes with seeded random weights.
 *
 * For latency and memory runs where accuracy is not asked (DESIGN.md "Engine"): `synthetic:llama3-8b` costs
 * what Llama-3-8B costs in F16 without a weights file. Overrides follow a '?':
 * `synthetic:llama3-8b?layers=4&seed=7&ctx=131072`. Every weight element is a pure function of (seed, tensor,
 * element index), so a model is the same on every machine and thread count, and the first L layers of a
 * `?layers=L` model equal the full model's. There is no tokenizer: callers feed token ids. */
#ifndef KVB_SYNTHETIC_H
#define KVB_SYNTHETIC_H

#include <stddef.h>
#include <stdint.h>

#include "engine/model.h"

#define SYN_PREFIX "synthetic:"

typedef struct {
    char shape[32];  /* table name, e.g. "llama3-8b" */
    kvb_config cfg;  /* with overrides applied */
    uint64_t seed;
    int llama3_rope; /* the model gets Llama 3.1's rope_freqs */
} syn_spec;

/* One tensor of a synthetic model, in the order and under the names a GGUF file of the architecture uses. */
typedef struct {
    char name[64];
    ggml_type type;   /* GGML_T_F16 matrices, GGML_T_F32 vectors (norms, biases) */
    int n_dims;
    int64_t ne[2];    /* GGUF convention: ne[0] = cols, ne[1] = rows (1 for vectors) */
    uint64_t n_bytes;
    uint32_t id;      /* hash stream of the tensor: stable across layer-count overrides */
} syn_tensor;

/* 1 if name asks for a synthetic model ("synthetic:..."). */
int syn_is_name(const char *name);
/* Parse "synthetic:<shape>[?key=value&...]" strictly (keys: layers, seed, ctx). 0, or -1 + a one-line err
 * listing the valid shapes or keys. */
int syn_parse(const char *name, syn_spec *out, char *err, size_t err_len);
/* Canonical name with every override spelled out: "synthetic:<shape>?layers=L&seed=S&ctx=C". */
void syn_canonical_name(const syn_spec *s, char *out, size_t cap);
/* The shapes in the table, comma-separated (for messages and help). */
const char *syn_shape_names(void);
/* Number of tensors, and tensor i of [0, n) (no allocation). */
int64_t syn_tensor_count(const syn_spec *s);
void syn_tensor_get(const syn_spec *s, int64_t i, syn_tensor *out);
/* Bytes of all weights (what kvb_model.weight_bytes reports). */
uint64_t syn_weight_bytes(const syn_spec *s);
/* Element index of tensor t before rounding to its type: uniform in +-sqrt(3/cols) for matrices (unit
 * variance after a product with a unit-RMS input), uniform in +-0.1 for biases, 1 for norm weights. */
float syn_element(const syn_spec *s, const syn_tensor *t, uint64_t index);
/* Build model m (cfg, weights, weight_bytes, path; tok and gguf stay NULL) from a synthetic name, generating
 * the weights on all cores. m must be zeroed; its weights are released by syn_model_release. 0 or -1 + err. */
int syn_model_init(kvb_model *m, const char *name, char *err, size_t err_len);
/* Free what syn_model_init allocated (the weight arena; not m->layers or m itself). */
void syn_model_release(kvb_model *m);
/* n token ids uniform in [0, n_vocab) from seed: what benchmarks feed a model that has no tokenizer. */
void syn_random_ids(uint64_t seed, int n_vocab, int32_t *ids, int64_t n);

#endif
