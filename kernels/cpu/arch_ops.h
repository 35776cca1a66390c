/* arch_ops.h — CPU ops of the newer architectures: scaled RoPE, GeGLU, scale, sliding-window attention
 * (kernels/backend.h rope_ext, geglu, scale, attention_window; arch_ops.c says how each follows ggml). */
#ifndef KVB_CPU_ARCH_OPS_H
#define KVB_CPU_ARCH_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "kernels/cpu/pool.h"

/* rope in place on x[n_tok][n_head][head_dim] with llama.cpp's scaling (kvb_rope_params) */
void cpu_rope_scaled(float *x, int64_t n_tok, int n_head, int head_dim, int n_rot, const int32_t *pos, int neox,
                     const kvb_rope_params *rp);
/* out = gelu_tanh(gate) * up through ggml's f16 GELU table; out may alias gate or up */
void cpu_geglu(float *out, const float *gate, const float *up, int64_t n);
/* ggml's GELU table entry: gelu_tanh of the f16 value h, rounded to f16 (as a float). The table covers every h,
 * the |x| >= 10 short-cuts included: a gate just inside (-10, 10) can round to f16 -10 or 10 and must then read
 * gelu(-10) (a tiny negative), not the short-cut's 0 */
float cpu_gelu_f16(kvb_f16 h);
/* x *= s */
void cpu_scale(float *x, float s, int64_t n);
/* attention with a->window > 0 (backend.h kvb_attn_args): f32 KV without probs or lse in llama.cpp's float order
 * (one row at a time, as attention_ggml.c), anything else through cpu_attention_banded; 0, or -1 + err */
int cpu_attention_window(const kvb_attn_args *a, kvb_pool *pool, char *err, size_t err_len);
/* attention.c's tiled online-softmax attention with the window a->window > 0 applied (key visible iff
 * q_pos - window < k_pos <= q_pos; no q_pos: every key), f16 or f32 KV, probs, lse and idx as cpu_attention;
 * results independent of the thread count. a->ws must hold cpu_attention_banded_ws_bytes (0: bad shapes). */
size_t cpu_attention_banded_ws_bytes(const kvb_attn_args *a, int n_threads);
int cpu_attention_banded(const kvb_attn_args *a, kvb_pool *pool, char *err, size_t err_len);
/* Set be's rope_ext, geglu, scale and attention_window (attention_window runs on cpu_backend_pool(be)). */
void cpu_install_arch_ops(kvb_backend *be);

#endif
