/* matmul.h — CPU matrix products with quantized weights (kernels/cpu/quant.h formats). */
#ifndef KVB_CPU_MATMUL_H
#define KVB_CPU_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/dtype.h"
#include "kernels/cpu/pool.h"

/* Workspace bytes cpu_matmul needs to hold the quantized activations. */
size_t cpu_matmul_ws_bytes(ggml_type wt, int64_t cols, int64_t n_tok);
/* out[t*rows + r] = W[r] . x[t] for t < n_tok; W is rows x cols in type wt (GGUF layout, ne[0] = cols).
 * x is quantized into act_ws first; threads split the rows. 0 = ok, -1 = bad arguments. */
int cpu_matmul(float *out, const void *w, ggml_type wt, int64_t rows, int64_t cols, const float *x, int64_t n_tok,
               void *act_ws, size_t act_ws_bytes, kvb_pool *pool);
/* out[i] = dequantized row ids[i] of w (embedding lookup). */
void cpu_get_rows(float *out, const void *w, ggml_type wt, int64_t cols, const int32_t *ids, int n);

#endif
