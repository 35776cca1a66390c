/* matmul.c — quantized-weight matmul: activations quantized once (in parallel over
 * tokens), then each thread takes a contiguous range of weight rows and, for prefill,
 * walks the tokens four at a time so each weight block is unpacked once per four dots. */
#include "kernels/cpu/matmul.h"

#include "kernels/cpu/quant.h"

enum { TOK_TILE = 4, ROW_TILE = 16 };

size_t cpu_matmul_ws_bytes(ggml_type wt, int64_t cols, int64_t n_tok) {
    return quant_act_row_bytes(wt, cols) * (size_t)n_tok;
}

typedef struct {
    float *out;
    const uint8_t *w;
    ggml_type wt;
    int64_t rows, cols, n_tok;
    const float *x;
    uint8_t *act;
    size_t w_row_bytes, act_row_bytes;
} mm_job;

static void quantize_job(void *arg, int ith, int nth) {
    mm_job *j = arg;
    long lo, hi;
    kvb_split((long)j->n_tok, ith, nth, &lo, &hi);
    for (long t = lo; t < hi; t++) quant_act_quantize(j->wt, j->x + t * j->cols, j->act + t * j->act_row_bytes, j->cols);
}

static void dot_job(void *arg, int ith, int nth) {
    mm_job *j = arg;
    /* split rows in tiles so threads get equal work and rows stay contiguous per thread */
    long n_tiles = (long)((j->rows + ROW_TILE - 1) / ROW_TILE), lo, hi;
    kvb_split(n_tiles, ith, nth, &lo, &hi);
    int64_t r0 = lo * ROW_TILE, r1 = hi * ROW_TILE < j->rows ? hi * ROW_TILE : j->rows;
    float tmp[TOK_TILE];
    for (int64_t t0 = 0; t0 < j->n_tok; t0 += TOK_TILE) {
        int nt = j->n_tok - t0 < TOK_TILE ? (int)(j->n_tok - t0) : TOK_TILE;
        const uint8_t *a = j->act + t0 * j->act_row_bytes;
        for (int64_t r = r0; r < r1; r++) {
            quant_vec_dot_multi(j->wt, j->cols, j->w + r * j->w_row_bytes, a, j->act_row_bytes, nt, tmp);
            for (int k = 0; k < nt; k++) j->out[(t0 + k) * j->rows + r] = tmp[k];
        }
    }
}

int cpu_matmul(float *out, const void *w, ggml_type wt, int64_t rows, int64_t cols, const float *x, int64_t n_tok,
               void *act_ws, size_t act_ws_bytes, kvb_pool *pool) {
    if (rows <= 0 || cols <= 0 || n_tok <= 0 || ggml_block_elems(wt) == 0 || cols % ggml_block_elems(wt)) return -1;
    if (act_ws_bytes < cpu_matmul_ws_bytes(wt, cols, n_tok)) return -1;
    mm_job j = {out, w, wt, rows, cols, n_tok, x, act_ws, ggml_row_bytes(wt, (uint64_t)cols),
                quant_act_row_bytes(wt, cols)};
    if (n_tok > 1) kvb_pool_run(pool, quantize_job, &j);
    else quantize_job(&j, 0, 1);
    kvb_pool_run(pool, dot_job, &j);
    return 0;
}

void cpu_get_rows(float *out, const void *w, ggml_type wt, int64_t cols, const int32_t *ids, int n) {
    size_t rb = ggml_row_bytes(wt, (uint64_t)cols);
    for (int i = 0; i < n; i++) quant_dequant_row(wt, (const uint8_t *)w + (size_t)ids[i] * rb, out + (int64_t)i * cols, cols);
}
