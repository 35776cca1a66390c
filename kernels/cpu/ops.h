/* ops.h — CPU kernels other than matmul: rmsnorm, rope, swiglu, add, softmax, top-k, attention.
 *
 * Numerics follow ggml's CPU backend (ggml-cpu/ops.cpp) so that our forward pass agrees with
 * llama.cpp token for token: rmsnorm sums squares in double and scales in float, rope builds
 * theta by repeated float multiplication, softmax subtracts the max and sums in double, and
 * attention is ggml's non-flash path (q.k in f32, scaled, softmax, weighted V sum), computed
 * with an online softmax so no [n_q x n_kv] buffer is needed. Kernels that take no pool are
 * single-threaded (cheap next to matmul); attention uses the pool. */
#ifndef KVB_CPU_OPS_H
#define KVB_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h" /* kvb_attn_args */
#include "kernels/dtype.h"   /* kvb_dtype: KVB_F32 / KVB_F16 */
#include "kernels/cpu/pool.h"

/* out[r][i] = x[r][i] / sqrt(mean_i(x[r][i]^2) + eps) * w[i]  (sum of squares accumulated in double, like ggml);
 * out may alias x */
void cpu_rmsnorm(float *out, const float *x, const float *w, int64_t n, int64_t n_rows, float eps);
/* rotary embedding in place on x[n_tok][n_head][head_dim] at absolute positions pos[n_tok];
 * neox=0: pairs (2i, 2i+1) ("normal" rope of llama arch in GGUF); neox=1: pairs (i, i+n_rot/2) (qwen2);
 * theta_i = pos * freq_base^(-2i/n_rot), computed as ggml does (theta scale multiplied up, in float);
 * dims >= n_rot are left as they are */
void cpu_rope(float *x, int64_t n_tok, int n_head, int head_dim, int n_rot, const int32_t *pos, float freq_base,
              int neox);
/* cpu_rope with per-frequency divisors freq_factors[n_rot/2] (theta_i / ff_i; GGUF rope_freqs, Llama 3.1+);
 * freq_factors NULL = all 1 */
void cpu_rope_ext(float *x, int64_t n_tok, int n_head, int head_dim, int n_rot, const int32_t *pos, float freq_base,
                  int neox, const float *freq_factors);
/* out = silu(gate) * up, silu(g) = g / (1 + exp(-g)); out may alias gate or up */
void cpu_swiglu(float *out, const float *gate, const float *up, int64_t n);
/* out = a + b elementwise; out may alias a or b */
void cpu_add(float *out, const float *a, const float *b, int64_t n);
/* in place, max-subtracted: x = exp(x - max) / sum; -inf entries become 0; all -inf gives all 0 */
void cpu_softmax(float *x, int64_t n);

/* the attention arguments are the backend op interface's (kernels/backend.h) */
typedef struct kvb_attn_args cpu_attn_args;

/* Workspace bytes cpu_attention needs for these shapes and this many pool threads (0 on overflow/bad shapes;
 * reads only the shape fields: n_q, heads, head_dim, n_kv, idx, n_idx). */
size_t cpu_attention_ws_bytes(const cpu_attn_args *a, int n_threads);
/* Compute out (and probs, lse when set); a query with no visible key gets out 0, lse -inf, probs 0.
 * Results do not depend on the number of threads. Returns 0, or -1 with a message on bad arguments. */
int cpu_attention(const cpu_attn_args *a, kvb_pool *pool, char *err, size_t err_len);
/* The f32-KV path cpu_attention takes when no probabilities or lse are asked for: llama.cpp's float order
 * (attention_ggml.c). L_max = the longest key list; -1 if the workspace is too small. */
size_t cpu_attention_ggml_ws_bytes(const cpu_attn_args *a, int64_t L_max, int n_threads);
int cpu_attention_ggml(const cpu_attn_args *a, int64_t L_max, kvb_pool *pool);

#endif
