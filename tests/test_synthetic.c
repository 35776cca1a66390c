/* test_synthetic.c — synthetic:<shape> models: the shape table against the real models' GGUF config keys, strict
 * name parsing, seeded reproducible weights, and the engine's forward pass on F16 weights against a float64
 * reference written here. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util_common.h"
#include "kernels/dtype.h"
#include "engine/model.h"
#include "engine/synthetic.h"

typedef struct {
    const char *name, *arch;
    int n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx_train;
    float rope_freq_base, rms_eps;
    int tied_output, qkv_bias;
    uint64_t n_params; /* published parameter counts: a check of every tensor shape at once */
} want_shape;

/* From the models' GGUF metadata ({arch}.block_count, .embedding_length, .attention.head_count(_kv),
 * .feed_forward_length, .context_length, .rope.freq_base, .attention.layer_norm_rms_epsilon, tokenizer size). */
static const want_shape WANT[] = {
    {"llama3-8b", "llama", 32, 4096, 32, 8, 128, 14336, 128256, 8192, 500000.0f, 1e-5f, 0, 0, 8030261248ull},
    {"llama3.1-8b", "llama", 32, 4096, 32, 8, 128, 14336, 128256, 131072, 500000.0f, 1e-5f, 0, 0, 8030261248ull},
    {"qwen2.5-7b", "qwen2", 28, 3584, 28, 4, 128, 18944, 152064, 32768, 1000000.0f, 1e-6f, 0, 1, 7615616512ull},
    {"smollm2-135m", "llama", 30, 576, 9, 3, 64, 1536, 49152, 8192, 100000.0f, 1e-5f, 1, 0, 134515008ull},
    /* Qwen3-8B: 8.19B; Gemma-3-4B's language model: 3.88B (its vision tower is not a KV-cache matter) */
    {"qwen3-8b", "qwen3", 36, 4096, 32, 8, 128, 12288, 151936, 40960, 1000000.0f, 1e-6f, 0, 0, 8190735360ull},
    {"gemma3-4b", "gemma3", 34, 2560, 8, 4, 256, 10240, 262144, 131072, 1000000.0f, 1e-6f, 1, 0, 3880099328ull},
};

static void test_shape_table_matches_the_real_models_config(void) {
    char err[512], name[64];
    for (size_t i = 0; i < sizeof WANT / sizeof *WANT; i++) {
        const want_shape *w = &WANT[i];
        syn_spec s;
        snprintf(name, sizeof name, "synthetic:%s", w->name);
        CU_ASSERT_FATAL(syn_parse(name, &s, err, sizeof err) == 0);
        const kvb_config *c = &s.cfg;
        CU_ASSERT_STRING_EQUAL(c->arch, w->arch);
        CU_ASSERT_EQUAL(c->n_layer, w->n_layer);
        CU_ASSERT_EQUAL(c->n_embd, w->n_embd);
        CU_ASSERT_EQUAL(c->n_head, w->n_head);
        CU_ASSERT_EQUAL(c->n_head_kv, w->n_head_kv);
        CU_ASSERT_EQUAL(c->head_dim, w->head_dim);
        CU_ASSERT_EQUAL(c->n_rot, w->head_dim);
        CU_ASSERT_EQUAL(c->n_ff, w->n_ff);
        CU_ASSERT_EQUAL(c->n_vocab, w->n_vocab);
        CU_ASSERT_EQUAL(c->n_ctx_train, w->n_ctx_train);
        CU_ASSERT_EQUAL(c->rope_freq_base, w->rope_freq_base);
        CU_ASSERT_EQUAL(c->rms_eps, w->rms_eps);
        CU_ASSERT_EQUAL(c->tied_output, w->tied_output);
        CU_ASSERT_EQUAL(c->has_qkv_bias, w->qkv_bias);
        CU_ASSERT_EQUAL(c->rope_neox, strcmp(w->arch, "llama") != 0); /* qwen2, qwen3, gemma3 */
        CU_ASSERT_EQUAL(c->qk_norm, !strcmp(w->arch, "qwen3") || !strcmp(w->arch, "gemma3"));
        if (!strcmp(w->arch, "gemma3")) { /* 5 local layers (window 1024, base 10000) to 1 global (linear x8) */
            CU_ASSERT(c->post_norms && c->ffn_act == KVB_FFN_GEGLU && c->n_swa == 1024);
            CU_ASSERT(c->swa_layer[0] && c->swa_layer[4] && !c->swa_layer[5] && c->swa_layer[6] && !c->swa_layer[11]);
            CU_ASSERT(c->rope_freq_base_swa == 10000.0f && c->rope.freq_scale == 0.125f && c->rope_scaled);
        }
        CU_ASSERT_EQUAL(s.seed, 0);
        uint64_t params = 0, bytes = 0;
        for (int64_t t = 0; t < syn_tensor_count(&s); t++) {
            syn_tensor st;
            syn_tensor_get(&s, t, &st);
            params += (uint64_t)st.ne[0] * (uint64_t)st.ne[1];
            bytes += st.n_bytes;
            CU_ASSERT(st.type == (st.n_dims == 2 ? GGML_T_F16 : GGML_T_F32));
        }
        if (params != w->n_params) fprintf(stderr, "%s: %llu parameters\n", w->name, (unsigned long long)params);
        CU_ASSERT_EQUAL(params, w->n_params);
        CU_ASSERT_EQUAL(bytes, syn_weight_bytes(&s));
    }
}

static void test_tensor_list_uses_gguf_names_and_shapes(void) {
    char err[512];
    syn_spec s;
    CU_ASSERT_FATAL(syn_parse("synthetic:qwen2.5-7b", &s, err, sizeof err) == 0);
    CU_ASSERT_EQUAL(syn_tensor_count(&s), 3 + 28 * 12);
    syn_tensor t;
    syn_tensor_get(&s, 0, &t);
    CU_ASSERT_STRING_EQUAL(t.name, "token_embd.weight");
    CU_ASSERT(t.ne[0] == 3584 && t.ne[1] == 152064);
    syn_tensor_get(&s, 2, &t);
    CU_ASSERT_STRING_EQUAL(t.name, "output.weight");
    syn_tensor_get(&s, 3 + 12 + 2, &t); /* blk.1.attn_k.weight: [n_embd, kv_dim] */
    CU_ASSERT_STRING_EQUAL(t.name, "blk.1.attn_k.weight");
    CU_ASSERT(t.n_dims == 2 && t.ne[0] == 3584 && t.ne[1] == 512);
    syn_tensor_get(&s, 3 + 12 + 8, &t);
    CU_ASSERT_STRING_EQUAL(t.name, "blk.1.ffn_down.weight");
    CU_ASSERT(t.ne[0] == 18944 && t.ne[1] == 3584);
    syn_tensor_get(&s, 3 + 12 + 11, &t);
    CU_ASSERT_STRING_EQUAL(t.name, "blk.1.attn_v.bias");
    CU_ASSERT(t.n_dims == 1 && t.ne[0] == 512 && t.type == GGML_T_F32);
    CU_ASSERT_FATAL(syn_parse("synthetic:smollm2-135m", &s, err, sizeof err) == 0);
    CU_ASSERT_EQUAL(syn_tensor_count(&s), 2 + 30 * 9); /* tied output, no biases */
}

static void test_overrides_apply_and_canonical_name_spells_them_out(void) {
    char err[512], canon[256];
    syn_spec s;
    CU_ASSERT_FATAL(syn_parse("synthetic:llama3-8b?layers=4&seed=7&ctx=131072", &s, err, sizeof err) == 0);
    CU_ASSERT_EQUAL(s.cfg.n_layer, 4);
    CU_ASSERT_EQUAL(s.seed, 7);
    CU_ASSERT_EQUAL(s.cfg.n_ctx_train, 131072);
    CU_ASSERT_EQUAL(s.cfg.n_embd, 4096);
    syn_canonical_name(&s, canon, sizeof canon);
    CU_ASSERT_STRING_EQUAL(canon, "synthetic:llama3-8b?layers=4&seed=7&ctx=131072");
    CU_ASSERT_FATAL(syn_parse("synthetic:tiny?seed=18446744073709551615", &s, err, sizeof err) == 0);
    CU_ASSERT_EQUAL(s.seed, UINT64_MAX);
}

static void test_bad_names_and_overrides_fail_with_a_message(void) {
    static const struct { const char *name, *needle; } BAD[] = {
        {"synthetic:llama4-70b", "valid: llama3-8b"},
        {"synthetic:", "valid: llama3-8b"},
        {"synthetic:Tiny", "unknown synthetic shape"},
        {"synthetic:tiny?", "not key=value"},
        {"synthetic:tiny?layers", "not key=value"},
        {"synthetic:tiny?layers=2&", "not key=value"},
        {"synthetic:tiny?layers=0", "layers must be"},
        {"synthetic:tiny?layers=2x", "layers must be"},
        {"synthetic:tiny?layers=", "layers must be"},
        {"synthetic:tiny?layers=-1", "layers must be"},
        {"synthetic:tiny?seed=18446744073709551616", "seed must be"},
        {"synthetic:tiny?ctx=99999999999", "ctx must be"},
        {"synthetic:tiny?heads=2", "valid keys: layers, seed, ctx"},
        {"synthetic:tiny?layers=2&layers=3", "given twice"},
        {"synthetic:tiny&layers=2", "unknown synthetic shape"},
    };
    char err[512], path[1024];
    for (size_t i = 0; i < sizeof BAD / sizeof *BAD; i++) {
        syn_spec s;
        err[0] = 0;
        int rc = syn_parse(BAD[i].name, &s, err, sizeof err);
        if (rc == 0 || !strstr(err, BAD[i].needle)) fprintf(stderr, "%s -> rc %d, '%s'\n", BAD[i].name, rc, err);
        CU_ASSERT(rc != 0);
        CU_ASSERT(strstr(err, BAD[i].needle) != NULL);
        CU_ASSERT(strchr(err, '\n') == NULL);
        err[0] = 0;
        CU_ASSERT(kvb_model_resolve(BAD[i].name, path, sizeof path, err, sizeof err) != 0);
        CU_ASSERT(strstr(err, BAD[i].needle) != NULL);
    }
    err[0] = 0;
    CU_ASSERT(kvb_model_load("synthetic:nope", err, sizeof err) == NULL);
    CU_ASSERT(strstr(err, "smollm2-135m") != NULL);
}

static kvb_model *load(const char *name) {
    char err[512] = "";
    kvb_model *m = kvb_model_load(name, err, sizeof err);
    if (!m) fprintf(stderr, "%s: %s\n", name, err);
    return m;
}

/* Every weight of the model as (pointer, bytes), in a fixed order. */
static int weight_list(const kvb_model *m, const void **p, size_t *n, int cap) {
    int k = 0;
#define W(w) (p[k] = (w).data, n[k] = (size_t)((w).rows * (w).cols) * sizeof(kvb_f16), k++)
#define V(v, len) (p[k] = (v), n[k] = (size_t)(len) * sizeof(float), k++)
    const kvb_config *c = &m->cfg;
    int64_t kvd = (int64_t)c->n_head_kv * c->head_dim;
    W(m->tok_embd), W(m->output), V(m->output_norm, c->n_embd);
    for (int l = 0; l < c->n_layer && k + 12 <= cap; l++) {
        const kvb_layer *L = &m->layers[l];
        W(L->wq), W(L->wk), W(L->wv), W(L->wo), W(L->w_gate), W(L->w_up), W(L->w_down);
        V(L->attn_norm, c->n_embd), V(L->ffn_norm, c->n_embd);
        if (L->bq) V(L->bq, c->n_embd), V(L->bk, kvd), V(L->bv, kvd);
    }
#undef W
#undef V
    return k;
}

static void test_same_seed_gives_identical_weights_another_seed_differs(void) {
    kvb_model *a = load("synthetic:tiny"), *b = load("synthetic:tiny?seed=0"), *d = load("synthetic:tiny?seed=1");
    CU_ASSERT_FATAL(a && b && d);
    CU_ASSERT_STRING_EQUAL(a->path, "synthetic:tiny?layers=2&seed=0&ctx=4096");
    CU_ASSERT_PTR_NULL(a->tok);
    CU_ASSERT_PTR_NULL(a->gguf);
    const void *pa[64], *pb[64], *pd[64];
    size_t na[64], nb[64], nd[64];
    int k = weight_list(a, pa, na, 64);
    CU_ASSERT_EQUAL(weight_list(b, pb, nb, 64), k);
    CU_ASSERT_EQUAL(weight_list(d, pd, nd, 64), k);
    uint64_t total = 0;
    int n_random = 0, n_differ = 0;
    for (int i = 0; i < k; i++) {
        total += na[i];
        CU_ASSERT(pa[i] != pb[i]);
        CU_ASSERT(memcmp(pa[i], pb[i], na[i]) == 0);
        if (memcmp(pa[i], pd[i], na[i]) != 0) n_differ++;
        n_random++;
    }
    CU_ASSERT_EQUAL(total, a->weight_bytes);
    /* matrices differ with the seed; norm vectors (3 per model: output + 2 per layer) do not */
    CU_ASSERT_EQUAL(n_differ, n_random - (1 + 2 * a->cfg.n_layer));
    for (int i = 0; i < a->cfg.n_embd; i++) CU_ASSERT_EQUAL(a->output_norm[i], 1.0f);
    kvb_model_free(a);
    kvb_model_free(b);
    kvb_model_free(d);
}

static void test_every_element_is_reproducible_alone(void) {
    char err[512];
    syn_spec s;
    CU_ASSERT_FATAL(syn_parse("synthetic:tiny?seed=5", &s, err, sizeof err) == 0);
    kvb_model *m = load("synthetic:tiny?seed=5");
    CU_ASSERT_FATAL(m != NULL);
    syn_tensor t;
    syn_tensor_get(&s, 0, &t); /* token_embd */
    const kvb_f16 *e = m->tok_embd.data;
    float bound = sqrtf(3.0f / 64) * 1.001f;
    double sum2 = 0;
    for (uint64_t i = 0; i < 256 * 64; i++) {
        float v = syn_element(&s, &t, i);
        CU_ASSERT_EQUAL(e[i], kvb_f32_to_f16(v));
        CU_ASSERT(fabsf(v) <= bound);
        sum2 += (double)v * v;
    }
    /* uniform in +-sqrt(3/cols): variance 1/cols */
    CU_ASSERT(fabs(sum2 / (256 * 64) * 64 - 1.0) < 0.05);
    syn_tensor_get(&s, 3 + 9 + 8, &t); /* blk.1.ffn_down.weight */
    CU_ASSERT_STRING_EQUAL(t.name, "blk.1.ffn_down.weight");
    const kvb_f16 *dn = m->layers[1].w_down.data;
    for (uint64_t i = 0; i < 64 * 128; i += 97) CU_ASSERT_EQUAL(dn[i], kvb_f32_to_f16(syn_element(&s, &t, i)));
    kvb_model_free(m);
    /* the first layers of a ?layers=L model are the full model's */
    kvb_model *one = load("synthetic:tiny?layers=1&seed=5"), *two = load("synthetic:tiny?seed=5");
    CU_ASSERT_FATAL(one && two);
    CU_ASSERT(memcmp(one->layers[0].w_up.data, two->layers[0].w_up.data, 64 * 128 * sizeof(kvb_f16)) == 0);
    CU_ASSERT(one->weight_bytes < two->weight_bytes);
    kvb_model_free(one);
    kvb_model_free(two);
}

/* ---- float64 reference of the tiny model, reading the model's own F16 weights ---- */

static double wd(const kvb_weight *w, int64_t r, int64_t c) {
    return kvb_f16_to_f32(((const kvb_f16 *)w->data)[r * w->cols + c]);
}
/* The engine rounds a matmul's input row to f16 for F16 weights (ggml's rule, engine/quant.h); so does the
 * reference, which leaves only the engine's float32 accumulation as a difference. */
static void ref_matvec(double *out, const kvb_weight *w, const double *x, const float *bias) {
    for (int64_t r = 0; r < w->rows; r++) {
        double s = bias ? bias[r] : 0;
        for (int64_t c = 0; c < w->cols; c++) s += wd(w, r, c) * kvb_f16_to_f32(kvb_f32_to_f16((float)x[c]));
        out[r] = s;
    }
}
static void ref_rmsnorm(double *out, const double *x, const float *w, int n, double eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double s = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * s * w[i];
}
static void ref_rope(double *x, int n_head, int hd, int pos, double base) {
    for (int h = 0; h < n_head; h++)
        for (int i = 0; i < hd / 2; i++) {
            double th = pos * pow(base, -2.0 * i / hd), *v = x + h * hd, x0 = v[2 * i], x1 = v[2 * i + 1];
            v[2 * i] = x0 * cos(th) - x1 * sin(th);
            v[2 * i + 1] = x0 * sin(th) + x1 * cos(th);
        }
}

/* Logits of the last of n tokens (llama arch: adjacent-pair rope, no biases). */
static void ref_forward(const kvb_model *m, const int32_t *ids, int n, double *logits) {
    const kvb_config *c = &m->cfg;
    const int D = c->n_embd, HD = c->head_dim, H = c->n_head, HK = c->n_head_kv, KVD = HK * HD, F = c->n_ff;
    double *x = calloc((size_t)n * D, sizeof *x), *xn = calloc(D, sizeof *xn), *q = calloc(D, sizeof *q);
    double *K = calloc((size_t)n * KVD, sizeof *K), *V = calloc((size_t)n * KVD, sizeof *V);
    double *att = calloc(D, sizeof *att), *o = calloc(D, sizeof *o), *sc = calloc((size_t)n, sizeof *sc);
    double *g = calloc(F, sizeof *g), *u = calloc(F, sizeof *u);
    for (int t = 0; t < n; t++)
        for (int i = 0; i < D; i++) x[t * D + i] = wd(&m->tok_embd, ids[t], i);
    for (int l = 0; l < c->n_layer; l++) {
        const kvb_layer *L = &m->layers[l];
        for (int t = 0; t < n; t++) {
            ref_rmsnorm(xn, x + t * D, L->attn_norm, D, c->rms_eps);
            ref_matvec(K + t * KVD, &L->wk, xn, NULL);
            ref_matvec(V + t * KVD, &L->wv, xn, NULL);
            ref_rope(K + t * KVD, HK, HD, t, c->rope_freq_base);
        }
        for (int t = 0; t < n; t++) { /* causal: position t reads K, V of 0..t, so updating x[t] in place is safe */
            ref_rmsnorm(xn, x + t * D, L->attn_norm, D, c->rms_eps);
            ref_matvec(q, &L->wq, xn, NULL);
            ref_rope(q, H, HD, t, c->rope_freq_base);
            for (int h = 0; h < H; h++) {
                int kh = h / (H / HK);
                double mx = -1e300, sum = 0;
                for (int s = 0; s <= t; s++) {
                    double d = 0;
                    for (int i = 0; i < HD; i++) d += q[h * HD + i] * K[s * KVD + kh * HD + i];
                    sc[s] = d / sqrt((double)HD);
                    if (sc[s] > mx) mx = sc[s];
                }
                for (int s = 0; s <= t; s++) sum += (sc[s] = exp(sc[s] - mx));
                for (int i = 0; i < HD; i++) {
                    double a = 0;
                    for (int s = 0; s <= t; s++) a += sc[s] / sum * V[s * KVD + kh * HD + i];
                    att[h * HD + i] = a;
                }
            }
            ref_matvec(o, &L->wo, att, NULL);
            for (int i = 0; i < D; i++) x[t * D + i] += o[i];
            ref_rmsnorm(xn, x + t * D, L->ffn_norm, D, c->rms_eps);
            ref_matvec(g, &L->w_gate, xn, NULL);
            ref_matvec(u, &L->w_up, xn, NULL);
            for (int i = 0; i < F; i++) g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
            ref_matvec(o, &L->w_down, g, NULL);
            for (int i = 0; i < D; i++) x[t * D + i] += o[i];
        }
    }
    ref_rmsnorm(xn, x + (int64_t)(n - 1) * D, m->output_norm, D, c->rms_eps);
    ref_matvec(logits, &m->output, xn, NULL);
    free(x), free(xn), free(q), free(K), free(V), free(att), free(o), free(sc), free(g), free(u);
}

static int logits_ok(const float *z, int n) {
    int spread = 0;
    for (int i = 0; i < n; i++) {
        if (!isfinite(z[i])) return 0;
        spread |= z[i] != z[0];
    }
    return spread;
}

static void test_tiny_forward_gives_finite_spread_logits(void) {
    kvb_model *m = load("synthetic:tiny");
    CU_ASSERT_FATAL(m != NULL);
    char err[512];
    kvb_ctx_params p = kvb_ctx_default_params();
    p.n_ctx = 64;
    kvb_ctx *c = kvb_ctx_create(m, &p, err, sizeof err);
    CU_ASSERT_FATAL(c != NULL);
    int32_t ids[5] = {3, 141, 59, 26, 255};
    CU_ASSERT_FATAL(kvb_forward(c, ids, 5, err, sizeof err) == 0);
    CU_ASSERT(logits_ok(c->logits, m->cfg.n_vocab));
    kvb_ctx_free(c);
    kvb_model_free(m);
}

/* Prefill two tokens, decode a third: both steps' logits against the float64 reference. */
static void test_tiny_forward_matches_float64_reference(void) {
    kvb_model *m = load("synthetic:tiny?seed=3");
    CU_ASSERT_FATAL(m != NULL);
    char err[512];
    kvb_ctx_params p = kvb_ctx_default_params();
    p.n_ctx = 16;
    p.kv_dtype = KVB_F32;
    kvb_ctx *c = kvb_ctx_create(m, &p, err, sizeof err);
    CU_ASSERT_FATAL(c != NULL);
    const int V = m->cfg.n_vocab;
    int32_t ids[3] = {17, 200, 5};
    double *ref = malloc((size_t)V * sizeof *ref);
    double worst = 0, spread = 0;
    CU_ASSERT_FATAL(kvb_forward(c, ids, 2, err, sizeof err) == 0);
    for (int step = 0; step < 2; step++) {
        if (step) CU_ASSERT_FATAL(kvb_forward(c, &ids[2], 1, err, sizeof err) == 0);
        ref_forward(m, ids, 2 + step, ref);
        for (int v = 0; v < V; v++) {
            double d = fabs(c->logits[v] - ref[v]);
            if (d > worst) worst = d;
            if (fabs(ref[v]) > spread) spread = fabs(ref[v]);
        }
    }
    if (worst > 1e-3) fprintf(stderr, "synthetic:tiny: max |dlogit| = %g\n", worst);
    CU_ASSERT(worst <= 1e-3);
    CU_ASSERT(spread > 0.1); /* not a vacuous comparison of near-zero logits */
    free(ref);
    kvb_ctx_free(c);
    kvb_model_free(m);
}

static void test_smollm2_shape_with_two_layers_loads_and_runs(void) {
    kvb_model *m = load("synthetic:smollm2-135m?layers=2");
    CU_ASSERT_FATAL(m != NULL);
    CU_ASSERT_EQUAL(m->cfg.n_layer, 2);
    CU_ASSERT_EQUAL(m->cfg.n_vocab, 49152);
    CU_ASSERT(m->output.data == m->tok_embd.data); /* tied */
    uint64_t want = (uint64_t)49152 * 576 * 2 + 576 * 4 +
                    2 * ((uint64_t)(576 * 576 * 2 + 576 * 192 * 2) * 2 + (uint64_t)3 * 576 * 1536 * 2 + 2 * 576 * 4);
    CU_ASSERT_EQUAL(m->weight_bytes, want);
    char err[512];
    kvb_ctx_params p = kvb_ctx_default_params();
    p.n_ctx = 64;
    kvb_ctx *c = kvb_ctx_create(m, &p, err, sizeof err);
    CU_ASSERT_FATAL(c != NULL);
    int32_t ids[8];
    syn_random_ids(1, m->cfg.n_vocab, ids, 8);
    for (int i = 0; i < 8; i++) CU_ASSERT(ids[i] >= 0 && ids[i] < 49152);
    CU_ASSERT_FATAL(kvb_forward(c, ids, 8, err, sizeof err) == 0);
    CU_ASSERT(logits_ok(c->logits, m->cfg.n_vocab));
    int32_t next = 7;
    CU_ASSERT_FATAL(kvb_forward(c, &next, 1, err, sizeof err) == 0);
    CU_ASSERT(logits_ok(c->logits, m->cfg.n_vocab));
    kvb_ctx_free(c);
    kvb_model_free(m);
}

/* Values straight from the generator (nothing allocated): biases small and random, norms exactly 1. */
static void test_qwen2_biases_are_small_and_norms_are_one(void) {
    char err[512];
    syn_spec s;
    CU_ASSERT_FATAL(syn_parse("synthetic:qwen2.5-7b", &s, err, sizeof err) == 0);
    syn_tensor bias, norm;
    syn_tensor_get(&s, 3 + 12 + 10, &bias);
    syn_tensor_get(&s, 3 + 12 + 0, &norm);
    CU_ASSERT_STRING_EQUAL(bias.name, "blk.1.attn_k.bias");
    CU_ASSERT_STRING_EQUAL(norm.name, "blk.1.attn_norm.weight");
    int distinct = 0;
    for (uint64_t i = 0; i < 512; i++) {
        float b = syn_element(&s, &bias, i);
        CU_ASSERT(fabsf(b) <= 0.1f);
        distinct += b != syn_element(&s, &bias, 0);
        CU_ASSERT_EQUAL(syn_element(&s, &norm, i), 1.0f);
    }
    CU_ASSERT(distinct > 500);
}

int main(void) {
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("synthetic", NULL, NULL);
    CU_add_test(s, "shape table matches the real models' config", test_shape_table_matches_the_real_models_config);
    CU_add_test(s, "tensor list uses GGUF names and shapes", test_tensor_list_uses_gguf_names_and_shapes);
    CU_add_test(s, "overrides apply; canonical name spells them out", test_overrides_apply_and_canonical_name_spells_them_out);
    CU_add_test(s, "bad names and overrides fail with a message", test_bad_names_and_overrides_fail_with_a_message);
    CU_add_test(s, "same seed gives identical weights, another seed differs", test_same_seed_gives_identical_weights_another_seed_differs);
    CU_add_test(s, "every element is reproducible alone", test_every_element_is_reproducible_alone);
    CU_add_test(s, "tiny forward gives finite, spread logits", test_tiny_forward_gives_finite_spread_logits);
    CU_add_test(s, "tiny forward matches a float64 reference within 1e-3", test_tiny_forward_matches_float64_reference);
    CU_add_test(s, "smollm2 shape with two layers loads and runs", test_smollm2_shape_with_two_layers_loads_and_runs);
    CU_add_test(s, "qwen2 biases are small and norms are one", test_qwen2_biases_are_small_and_norms_are_one);
    return util_run_suites();
}
