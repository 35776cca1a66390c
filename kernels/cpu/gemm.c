/* gemm.c — the f32 prefill matmul (gemm.h). Each pool thread takes a contiguous range of weight rows and walks
 * it a panel at a time: the panel's rows dequantized into the thread's own slice of the workspace, then one
 * sgemm for every token of the chunk against that panel, into a token-major scratch that is then scattered
 * into the output's columns. The scratch is the fast way round: with the tokens as sgemm's M (column-major
 * C = X . panel^T) OpenBLAS 0.3.21 on Zen ran 17-31 GFLOP/s at every panel width, while writing the strided
 * output directly (row-major, the panel as N) fell to 7-12 below 384 rows. Panels are large because every
 * sgemm packs the chunk's activations again. OpenBLAS is held to one thread: two thread pools on the same
 * cores would take turns preempting each other. */
#include "kernels/cpu/gemm.h"

#include "kernels/cpu/quant.h"

#ifdef KVB_HAVE_OPENBLAS
#include <cblas.h>
#include <pthread.h>
#endif

enum {
    PANEL_BYTES = 512 * 1024, /* a panel's f32 rows */
    PANEL_MIN_ROWS = 32,      /* fewer, and repacking the activations per panel dominates */
    PANEL_MAX_ROWS = 256,
    SPLIT_ROWS = 16,          /* threads split the rows in multiples of this */
    SCATTER = 16,             /* tokens x rows per block of the result's transpose (a cache line of floats) */
};

/* Rows per panel for rows of `cols` floats: PANEL_BYTES' worth, a multiple of 16, within the bounds above. */
static int64_t panel_rows(int64_t cols) {
    int64_t p = PANEL_BYTES / (cols * (int64_t)sizeof(float)) / 16 * 16;
    return p < PANEL_MIN_ROWS ? PANEL_MIN_ROWS : p > PANEL_MAX_ROWS ? PANEL_MAX_ROWS : p;
}

/* floats of one thread's slice: the panel, then its token-major result */
static size_t slice_floats(int64_t cols, int64_t n_tok) { return (size_t)panel_rows(cols) * (size_t)(cols + n_tok); }

size_t cpu_gemm_ws_bytes(int64_t cols, int64_t n_tok, int n_threads) {
    if (cols <= 0 || n_tok <= 0) return 0;
    return (size_t)(n_threads > 1 ? n_threads : 1) * slice_floats(cols, n_tok) * sizeof(float);
}

#ifdef KVB_HAVE_OPENBLAS

static void hold_blas_to_one_thread(void) { openblas_set_num_threads(1); }

int cpu_gemm_available(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, hold_blas_to_one_thread);
    return 1;
}

typedef struct {
    float *out;
    const uint8_t *w;
    ggml_type wt;
    int64_t rows, cols, n_tok, panel;
    const float *x;
    float *ws;
    size_t w_row_bytes;
} gemm_job;

/* panel rows [r0, r0 + n_rows) of the output from the dequantized panel: res[r][t] = x[t] . panel[r] */
static void gemm_panel(const gemm_job *j, int64_t r0, int64_t n_rows, const float *panel, float *res) {
    const int n_tok = (int)j->n_tok, cols = (int)j->cols;
    cblas_sgemm(CblasColMajor, CblasTrans, CblasNoTrans, n_tok, (int)n_rows, cols, 1.0f, j->x, cols, panel, cols,
                0.0f, res, n_tok);
    /* the transpose in SCATTER x SCATTER blocks: a row at a time it read a new cache line per element */
    for (int64_t t0 = 0; t0 < j->n_tok; t0 += SCATTER)
        for (int64_t b0 = 0; b0 < n_rows; b0 += SCATTER) {
            const int64_t t1 = t0 + SCATTER < j->n_tok ? t0 + SCATTER : j->n_tok;
            const int64_t b1 = b0 + SCATTER < n_rows ? b0 + SCATTER : n_rows;
            for (int64_t t = t0; t < t1; t++) {
                float *o = j->out + t * j->rows + r0;
                for (int64_t r = b0; r < b1; r++) o[r] = res[r * j->n_tok + t];
            }
        }
}

static void gemm_rows(void *arg, int ith, int nth) {
    const gemm_job *j = arg;
    long n_split = (long)((j->rows + SPLIT_ROWS - 1) / SPLIT_ROWS), lo, hi;
    kvb_split(n_split, ith, nth, &lo, &hi);
    const int64_t r_end = hi * SPLIT_ROWS < j->rows ? hi * SPLIT_ROWS : j->rows;
    float *panel = j->ws + (size_t)ith * slice_floats(j->cols, j->n_tok), *res = panel + j->panel * j->cols;
    for (int64_t r0 = lo * SPLIT_ROWS; r0 < r_end; r0 += j->panel) {
        const int64_t n_rows = r_end - r0 < j->panel ? r_end - r0 : j->panel;
        for (int64_t r = 0; r < n_rows; r++)
            quant_dequant_row(j->wt, j->w + (size_t)(r0 + r) * j->w_row_bytes, panel + r * j->cols, j->cols);
        gemm_panel(j, r0, n_rows, panel, res);
    }
}

int cpu_gemm(float *out, const void *w, ggml_type wt, int64_t rows, int64_t cols, const float *x, int64_t n_tok,
             void *ws, size_t ws_bytes, kvb_pool *pool) {
    if (rows <= 0 || cols <= 0 || n_tok <= 0 || ggml_block_elems(wt) == 0 || cols % ggml_block_elems(wt)) return -1;
    if (rows > INT32_MAX || cols > INT32_MAX || n_tok > INT32_MAX) return -1;
    if (ws_bytes < cpu_gemm_ws_bytes(cols, n_tok, kvb_pool_size(pool)) || !cpu_gemm_available()) return -1;
    gemm_job j = {out, w, wt, rows, cols, n_tok, panel_rows(cols), x, ws, ggml_row_bytes(wt, (uint64_t)cols)};
    kvb_pool_run(pool, gemm_rows, &j);
    return 0;
}

#else

int cpu_gemm_available(void) { return 0; }

int cpu_gemm(float *out, const void *w, ggml_type wt, int64_t rows, int64_t cols, const float *x, int64_t n_tok,
             void *ws, size_t ws_bytes, kvb_pool *pool) {
    return -1;
}

#endif
