/* test_model_tiny.c — the whole forward pass of a tiny random llama / qwen2 model against a float64
 * implementation written here from the equations (RMSNorm, RoPE, GQA causal attention, SwiGLU).
 * The tiny model is written as a real GGUF file with tests/util_gguf_writer, so loading is covered too. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util_common.h"
#include "engine/model.h"
#include "util_gguf_writer.h"

enum { T_LAYERS = 2, T_EMBD = 32, T_HEADS = 4, T_KV_HEADS = 2, T_HD = 8, T_FF = 48, T_VOCAB = 300, T_CTX = 64 };

typedef struct {
    int qwen2;
    float *emb, *out_norm, *attn_norm[T_LAYERS], *ffn_norm[T_LAYERS];
    float *wq[T_LAYERS], *wk[T_LAYERS], *wv[T_LAYERS], *wo[T_LAYERS], *wg[T_LAYERS], *wu[T_LAYERS], *wd[T_LAYERS];
    float *bq[T_LAYERS], *bk[T_LAYERS], *bv[T_LAYERS];
} tiny_weights;

static uint64_t rng_state = 12345;
static float frand(float scale) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return scale * ((float)((rng_state >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f);
}
static float *rand_vec(int64_t n, float scale, float offset) {
    float *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = offset + frand(scale);
    return v;
}

static void make_weights(tiny_weights *w, int qwen2) {
    memset(w, 0, sizeof *w);
    w->qwen2 = qwen2;
    w->emb = rand_vec((int64_t)T_VOCAB * T_EMBD, 1.0f, 0);
    w->out_norm = rand_vec(T_EMBD, 0.2f, 1.0f);
    int kvd = T_KV_HEADS * T_HD;
    for (int l = 0; l < T_LAYERS; l++) {
        w->attn_norm[l] = rand_vec(T_EMBD, 0.2f, 1.0f);
        w->ffn_norm[l] = rand_vec(T_EMBD, 0.2f, 1.0f);
        w->wq[l] = rand_vec(T_EMBD * T_EMBD, 0.3f, 0);
        w->wk[l] = rand_vec(kvd * T_EMBD, 0.3f, 0);
        w->wv[l] = rand_vec(kvd * T_EMBD, 0.3f, 0);
        w->wo[l] = rand_vec(T_EMBD * T_EMBD, 0.2f, 0);
        w->wg[l] = rand_vec(T_FF * T_EMBD, 0.2f, 0);
        w->wu[l] = rand_vec(T_FF * T_EMBD, 0.2f, 0);
        w->wd[l] = rand_vec(T_EMBD * T_FF, 0.2f, 0);
        if (qwen2) {
            w->bq[l] = rand_vec(T_EMBD, 0.1f, 0);
            w->bk[l] = rand_vec(kvd, 0.1f, 0);
            w->bv[l] = rand_vec(kvd, 0.1f, 0);
        }
    }
}

static void free_weights(tiny_weights *w) {
    free(w->emb);
    free(w->out_norm);
    for (int l = 0; l < T_LAYERS; l++) {
        free(w->attn_norm[l]), free(w->ffn_norm[l]), free(w->wq[l]), free(w->wk[l]), free(w->wv[l]);
        free(w->wo[l]), free(w->wg[l]), free(w->wu[l]), free(w->wd[l]), free(w->bq[l]), free(w->bk[l]), free(w->bv[l]);
    }
}

/* gw_write_tiny's tensor source: the weights of w by GGUF name. */
static const float *weight_by_name(void *user, const char *name, int64_t n) {
    const tiny_weights *w = user;
    (void)n;
    if (!strcmp(name, "token_embd.weight")) return w->emb;
    if (!strcmp(name, "output_norm.weight")) return w->out_norm;
    int l = atoi(name + 4); /* "blk.<l>.<tensor>" */
    const char *t = strchr(name + 4, '.') + 1;
    static const char *names[] = {"attn_norm.weight", "ffn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
                                  "attn_output.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight",
                                  "attn_q.bias", "attn_k.bias", "attn_v.bias"};
    float *const by_index[] = {w->attn_norm[l], w->ffn_norm[l], w->wq[l], w->wk[l], w->wv[l], w->wo[l],
                               w->wg[l], w->wu[l], w->wd[l], w->bq[l], w->bk[l], w->bv[l]};
    for (int i = 0; i < 12; i++)
        if (!strcmp(t, names[i])) return by_index[i];
    return NULL;
}

/* Writes the tiny model; the vocabulary is 300 arbitrary distinct strings (the test feeds ids directly). */
static int write_model(const tiny_weights *w, const char *path) {
    gw_tiny t = {w->qwen2 ? "qwen2" : "llama", T_LAYERS, T_EMBD, T_HEADS, T_KV_HEADS, T_FF, T_VOCAB, T_CTX, 0, NULL,
                 weight_by_name, (void *)w};
    return gw_write_tiny(&t, path);
}

static void ref_rmsnorm(double *out, const double *x, const float *w, int n) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double s = 1.0 / sqrt(ss / n + 1e-5);
    for (int i = 0; i < n; i++) out[i] = x[i] * s * w[i];
}
static void ref_matvec(double *out, const float *W, const double *x, int rows, int cols, const float *bias) {
    for (int r = 0; r < rows; r++) {
        double s = bias ? bias[r] : 0;
        for (int c = 0; c < cols; c++) s += (double)W[(int64_t)r * cols + c] * x[c];
        out[r] = s;
    }
}
static void ref_rope(double *x, int n_head, int pos, int neox) {
    for (int h = 0; h < n_head; h++) {
        double *v = x + h * T_HD;
        for (int i = 0; i < T_HD / 2; i++) {
            double theta = pos * pow(500.0, -2.0 * i / T_HD);
            int a = neox ? i : 2 * i, b = neox ? i + T_HD / 2 : 2 * i + 1;
            double x0 = v[a], x1 = v[b];
            v[a] = x0 * cos(theta) - x1 * sin(theta);
            v[b] = x0 * sin(theta) + x1 * cos(theta);
        }
    }
}

/* logits of every position for ids[0..n) */
static void ref_forward(const tiny_weights *w, const int32_t *ids, int n, double *logits /* [n][vocab] */) {
    int kvd = T_KV_HEADS * T_HD;
    double *x = calloc((size_t)n * T_EMBD, sizeof *x), *xn = calloc(T_EMBD, sizeof *xn);
    double *K = calloc((size_t)n * kvd, sizeof *K), *V = calloc((size_t)n * kvd, sizeof *V);
    double *q = calloc(T_EMBD, sizeof *q), *att = calloc(T_EMBD, sizeof *att), *o = calloc(T_EMBD, sizeof *o);
    double *g = calloc(T_FF, sizeof *g), *u = calloc(T_FF, sizeof *u), *sc = calloc((size_t)n, sizeof *sc);
    for (int t = 0; t < n; t++)
        for (int i = 0; i < T_EMBD; i++) x[t * T_EMBD + i] = w->emb[(int64_t)ids[t] * T_EMBD + i];
    for (int l = 0; l < T_LAYERS; l++) {
        for (int t = 0; t < n; t++) { /* K, V of every position first */
            ref_rmsnorm(xn, x + t * T_EMBD, w->attn_norm[l], T_EMBD);
            ref_matvec(K + t * kvd, w->wk[l], xn, kvd, T_EMBD, w->bk[l]);
            ref_matvec(V + t * kvd, w->wv[l], xn, kvd, T_EMBD, w->bv[l]);
            ref_rope(K + t * kvd, T_KV_HEADS, t, w->qwen2);
        }
        double *xnew = calloc((size_t)n * T_EMBD, sizeof *xnew);
        for (int t = 0; t < n; t++) {
            ref_rmsnorm(xn, x + t * T_EMBD, w->attn_norm[l], T_EMBD);
            ref_matvec(q, w->wq[l], xn, T_EMBD, T_EMBD, w->bq[l]);
            ref_rope(q, T_HEADS, t, w->qwen2);
            for (int h = 0; h < T_HEADS; h++) {
                int kh = h / (T_HEADS / T_KV_HEADS);
                double mx = -1e300, sum = 0;
                for (int s = 0; s <= t; s++) {
                    double d = 0;
                    for (int i = 0; i < T_HD; i++) d += q[h * T_HD + i] * K[s * kvd + kh * T_HD + i];
                    sc[s] = d / sqrt((double)T_HD);
                    if (sc[s] > mx) mx = sc[s];
                }
                for (int s = 0; s <= t; s++) sum += (sc[s] = exp(sc[s] - mx));
                for (int i = 0; i < T_HD; i++) {
                    double a = 0;
                    for (int s = 0; s <= t; s++) a += sc[s] / sum * V[s * kvd + kh * T_HD + i];
                    att[h * T_HD + i] = a;
                }
            }
            ref_matvec(o, w->wo[l], att, T_EMBD, T_EMBD, NULL);
            for (int i = 0; i < T_EMBD; i++) xnew[t * T_EMBD + i] = x[t * T_EMBD + i] + o[i];
            ref_rmsnorm(xn, xnew + t * T_EMBD, w->ffn_norm[l], T_EMBD);
            ref_matvec(g, w->wg[l], xn, T_FF, T_EMBD, NULL);
            ref_matvec(u, w->wu[l], xn, T_FF, T_EMBD, NULL);
            for (int i = 0; i < T_FF; i++) g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
            ref_matvec(o, w->wd[l], g, T_EMBD, T_FF, NULL);
            for (int i = 0; i < T_EMBD; i++) xnew[t * T_EMBD + i] += o[i];
        }
        memcpy(x, xnew, (size_t)n * T_EMBD * sizeof *x);
        free(xnew);
    }
    for (int t = 0; t < n; t++) {
        ref_rmsnorm(xn, x + t * T_EMBD, w->out_norm, T_EMBD);
        ref_matvec(logits + (int64_t)t * T_VOCAB, w->emb, xn, T_VOCAB, T_EMBD, NULL);
    }
    free(x), free(xn), free(K), free(V), free(q), free(att), free(o), free(g), free(u), free(sc);
}

/* Prefill 9 tokens in chunks of 4, then decode 5 one at a time; every step's logits vs float64. */
static void check_model(int qwen2, kvb_dtype kv_dtype, int n_threads, double tol) {
    tiny_weights w;
    make_weights(&w, qwen2);
    char path[] = "/tmp/kvb_tiny_XXXXXX";
    int fd = mkstemp(path);
    CU_ASSERT_FATAL(fd >= 0);
    close(fd);
    CU_ASSERT_FATAL(write_model(&w, path) == 0);
    char err[512] = "";
    kvb_model *m = kvb_model_load(path, err, sizeof err);
    if (!m) fprintf(stderr, "load: %s\n", err);
    CU_ASSERT_FATAL(m != NULL);
    CU_ASSERT_EQUAL(m->cfg.rope_neox, qwen2);
    CU_ASSERT_EQUAL(m->cfg.tied_output, 1);
    kvb_ctx_params p = kvb_ctx_default_params();
    p.kv_dtype = kv_dtype;
    p.n_threads = n_threads;
    p.n_batch = 4;
    kvb_ctx *c = kvb_ctx_create(m, &p, err, sizeof err);
    CU_ASSERT_FATAL(c != NULL);
    enum { N_PRE = 9, N_DEC = 5, N = N_PRE + N_DEC };
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = (int32_t)((i * 37 + 11) % T_VOCAB);
    double *ref = malloc((size_t)N * T_VOCAB * sizeof *ref);
    ref_forward(&w, ids, N, ref);
    double worst = 0;
    CU_ASSERT_FATAL(kvb_forward(c, ids, N_PRE, err, sizeof err) == 0);
    for (int step = 0; step <= N_DEC; step++) {
        int t = N_PRE - 1 + step;
        for (int v = 0; v < T_VOCAB; v++) {
            double d = fabs(c->logits[v] - ref[(int64_t)t * T_VOCAB + v]);
            if (d > worst) worst = d;
        }
        if (step < N_DEC) CU_ASSERT_FATAL(kvb_forward(c, &ids[N_PRE + step], 1, err, sizeof err) == 0);
    }
    if (worst > tol) fprintf(stderr, "tiny %s kv=%s threads=%d: max |dlogit| = %g\n", qwen2 ? "qwen2" : "llama",
                             kv_dtype == KVB_F16 ? "f16" : "f32", n_threads, worst);
    CU_ASSERT(worst <= tol);
    CU_ASSERT_EQUAL(c->n_past, N);
    free(ref);
    kvb_ctx_free(c);
    kvb_model_free(m);
    free_weights(&w);
    unlink(path);
}

static void test_llama_forward_matches_float64_reference_f32_kv(void) { check_model(0, KVB_F32, 1, 2e-3); }
static void test_llama_forward_matches_float64_reference_two_threads(void) { check_model(0, KVB_F32, 2, 2e-3); }
static void test_llama_forward_with_f16_kv_stays_close(void) { check_model(0, KVB_F16, 2, 3e-2); }
static void test_qwen2_forward_with_bias_and_neox_rope_matches_reference(void) { check_model(1, KVB_F32, 2, 2e-3); }

static void test_context_overflow_is_an_error(void) {
    tiny_weights w;
    make_weights(&w, 0);
    char path[] = "/tmp/kvb_tiny_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    CU_ASSERT_FATAL(write_model(&w, path) == 0);
    char err[512] = "";
    kvb_model *m = kvb_model_load(path, err, sizeof err);
    CU_ASSERT_FATAL(m != NULL);
    kvb_ctx_params p = kvb_ctx_default_params();
    p.n_ctx = 8;
    kvb_ctx *c = kvb_ctx_create(m, &p, err, sizeof err);
    CU_ASSERT_FATAL(c != NULL);
    int32_t ids[9] = {0};
    CU_ASSERT(kvb_forward(c, ids, 9, err, sizeof err) != 0);
    CU_ASSERT(strstr(err, "context") != NULL);
    int32_t bad = T_VOCAB;
    CU_ASSERT(kvb_forward(c, &bad, 1, err, sizeof err) != 0);
    CU_ASSERT(strstr(err, "out of range") != NULL);
    kvb_ctx_free(c);
    kvb_model_free(m);
    free_weights(&w);
    unlink(path);
}

int main(void) {
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("model_tiny", NULL, NULL);
    CU_add_test(s, "llama forward matches float64 reference (f32 KV)", test_llama_forward_matches_float64_reference_f32_kv);
    CU_add_test(s, "llama forward matches float64 reference (2 threads)", test_llama_forward_matches_float64_reference_two_threads);
    CU_add_test(s, "llama forward with f16 KV stays close", test_llama_forward_with_f16_kv_stays_close);
    CU_add_test(s, "qwen2 forward (QKV bias, NEOX rope) matches reference", test_qwen2_forward_with_bias_and_neox_rope_matches_reference);
    CU_add_test(s, "context overflow and bad ids are errors", test_context_overflow_is_an_error);
    return util_run_suites();
}
