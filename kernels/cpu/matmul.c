/* matmul.c — quantized-weight matmul: activations quantized once (in parallel over
 * tokens), then each thread takes a contiguous range of weight rows and, for prefill,
 * walks the tokens four at a time so each weight block is unpacked once per four dots.
 * Where the weight type has a tile (quant_vec_dot_tile), full groups of four tokens go
 * two rows at a time through it, with the activations' block scales converted to floats
 * once, in the quantize step; the rest (the last tokens, an odd row) takes the one-row
 * kernel, which gives the same bits. */
#include "kernels/cpu/matmul.h"

#include "kernels/cpu/quant.h"

enum { TOK_TILE = QUANT_TILE_TOK, ROW_TILE = 16, SCALES_ALIGN = 64 };

/* the workspace: n_tok quantized rows, then (for tiled types) the float scales of each full token group */
static size_t act_bytes_aligned(ggml_type wt, int64_t cols, int64_t n_tok) {
    const size_t b = quant_act_row_bytes(wt, cols) * (size_t)n_tok;
    return (b + SCALES_ALIGN - 1) / SCALES_ALIGN * SCALES_ALIGN;
}

static size_t group_scale_floats(ggml_type wt, int64_t cols) {
    return (size_t)quant_tile_scale_floats(wt) * (size_t)(cols / QK);
}

size_t cpu_matmul_ws_bytes(ggml_type wt, int64_t cols, int64_t n_tok) {
    const size_t groups = (size_t)(n_tok / TOK_TILE);
    return act_bytes_aligned(wt, cols, n_tok) + groups * group_scale_floats(wt, cols) * sizeof(float);
}

typedef struct {
    float *out;
    const uint8_t *w;
    ggml_type wt;
    int64_t rows, cols, n_tok;
    const float *x;
    uint8_t *act;
    float *scales; /* per full token group: group_floats floats; NULL when the type has no tile */
    size_t w_row_bytes, act_row_bytes, group_floats;
} mm_job;

static void quantize_job(void *arg, int ith, int nth) {
    mm_job *j = arg;
    long lo, hi;
    kvb_split((long)j->n_tok, ith, nth, &lo, &hi);
    for (long t = lo; t < hi; t++) {
        uint8_t *row = j->act + t * j->act_row_bytes;
        quant_act_quantize(j->wt, j->x + t * j->cols, row, j->cols);
        if (j->scales && t < j->n_tok / TOK_TILE * TOK_TILE)
            quant_tile_scales(j->wt, row, j->cols, j->scales + (size_t)(t / TOK_TILE) * j->group_floats,
                              (int)(t % TOK_TILE));
    }
}

/* rows [r0, r1) against tokens t0..t0+nt-1, one row at a time */
static void dot_rows(const mm_job *j, int64_t t0, int nt, int64_t r0, int64_t r1) {
    float tmp[TOK_TILE];
    const uint8_t *a = j->act + t0 * j->act_row_bytes;
    for (int64_t r = r0; r < r1; r++) {
        quant_vec_dot_multi(j->wt, j->cols, j->w + r * j->w_row_bytes, a, j->act_row_bytes, nt, tmp);
        for (int k = 0; k < nt; k++) j->out[(t0 + k) * j->rows + r] = tmp[k];
    }
}

/* rows [r0, r1) against a full token group, QUANT_TILE_ROWS rows at a time; returns the first row not done */
static int64_t dot_tiles(const mm_job *j, int64_t t0, int64_t r0, int64_t r1) {
    const uint8_t *a = j->act + t0 * j->act_row_bytes;
    const float *sc = j->scales + (size_t)(t0 / TOK_TILE) * j->group_floats;
    int64_t r = r0;
    for (; r + QUANT_TILE_ROWS <= r1; r += QUANT_TILE_ROWS)
        if (quant_vec_dot_tile(j->wt, j->cols, j->w + r * j->w_row_bytes, j->w_row_bytes, a, j->act_row_bytes, sc,
                               j->out + t0 * j->rows + r, (size_t)j->rows))
            break;
    return r;
}

static void dot_job(void *arg, int ith, int nth) {
    mm_job *j = arg;
    /* split rows in tiles so threads get equal work and rows stay contiguous per thread */
    long n_tiles = (long)((j->rows + ROW_TILE - 1) / ROW_TILE), lo, hi;
    kvb_split(n_tiles, ith, nth, &lo, &hi);
    int64_t r0 = lo * ROW_TILE, r1 = hi * ROW_TILE < j->rows ? hi * ROW_TILE : j->rows;
    for (int64_t t0 = 0; t0 < j->n_tok; t0 += TOK_TILE) {
        int nt = j->n_tok - t0 < TOK_TILE ? (int)(j->n_tok - t0) : TOK_TILE;
        const int64_t r = nt == TOK_TILE && j->scales ? dot_tiles(j, t0, r0, r1) : r0;
        dot_rows(j, t0, nt, r, r1);
    }
}

int cpu_matmul(float *out, const void *w, ggml_type wt, int64_t rows, int64_t cols, const float *x, int64_t n_tok,
               void *act_ws, size_t act_ws_bytes, kvb_pool *pool) {
    if (rows <= 0 || cols <= 0 || n_tok <= 0 || ggml_block_elems(wt) == 0 || cols % ggml_block_elems(wt)) return -1;
    if (act_ws_bytes < cpu_matmul_ws_bytes(wt, cols, n_tok)) return -1;
    const size_t group_floats = group_scale_floats(wt, cols);
    float *scales = n_tok >= TOK_TILE && group_floats ? (float *)((uint8_t *)act_ws + act_bytes_aligned(wt, cols, n_tok))
                                                      : NULL;
    mm_job j = {out,    w, wt, rows, cols, n_tok, x, act_ws, scales, ggml_row_bytes(wt, (uint64_t)cols),
                quant_act_row_bytes(wt, cols), group_floats};
    if (n_tok > 1) kvb_pool_run(pool, quantize_job, &j);
    else quantize_job(&j, 0, 1);
    kvb_pool_run(pool, dot_job, &j);
    return 0;
}

void cpu_get_rows(float *out, const void *w, ggml_type wt, int64_t cols, const int32_t *ids, int n) {
    size_t rb = ggml_row_bytes(wt, (uint64_t)cols);
    for (int i = 0; i < n; i++) quant_dequant_row(wt, (const uint8_t *)w + (size_t)ids[i] * rb, out + (int64_t)i * cols, cols);
}
