/* gemm.c — the f32 prefill matmul (gemm.h). Built for AVX-512, it is this file's own GEMM (the first section
 * below says why); elsewhere it is OpenBLAS's sgemm, as follows. Each pool thread takes a contiguous range of
 * weight rows and walks it a panel at a time: the panel's rows dequantized into the thread's own slice of the workspace, then one
 * sgemm for every token of the chunk against that panel, into a token-major scratch that is then scattered
 * into the output's columns. The scratch is the fast way round: with the tokens as sgemm's M (column-major
 * C = X . panel^T) OpenBLAS 0.3.21 on Zen ran 17-31 GFLOP/s at every panel width, while writing the strided
 * output directly (row-major, the panel as N) fell to 7-12 below 384 rows. Panels are large because every
 * sgemm packs the chunk's activations again. OpenBLAS is held to one thread: two thread pools on the same
 * cores would take turns preempting each other. */
#include "kernels/cpu/gemm.h"

#include "kernels/cpu/quant.h"

#include <string.h>

#if !defined(__AVX512F__)
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
#endif

#if defined(__AVX512F__)

/* ---- the AVX-512 GEMM ----
 * OpenBLAS 0.3.21's runtime dispatch does not know Zen 4/5 and takes its AVX2 (Haswell) sgemm there: on this
 * project's AVX-512 EPYC, one thread, 4864 x 896 Q5_0 weights against 512 tokens ran at 115 GFLOP/s (CPU time)
 * in the OpenBLAS path, 195-204 with OPENBLAS_CORETYPE=SkylakeX. Here the weights are dequantized straight into
 * the micro-kernel's layout, the activations packed once per call (OpenBLAS packed them again for every panel),
 * and a 12-token x 32-row micro-kernel keeps its 24 accumulators in registers, one 16-row vector per (token,
 * half): per column, two weight loads and twelve broadcasts feed 24 FMAs (268 GFLOP/s with its data in L2). Its
 * results go straight into the token-major output, no transpose: 238 GFLOP/s on that matrix, 198-210 on 896 x
 * 4864 Q6_K (docs/cpu-results.md). Each sum runs over the columns in order, one FMA each. */
#include <immintrin.h>

enum {
    MT = 12,       /* tokens per micro-tile */
    NR = 32,       /* weight rows per panel: two 16-float vectors */
    KC = 256,      /* columns dequantized at a time */
    KB_MAX = 2048, /* most columns a pass sums in registers */
};

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Columns per pass: all of them up to KB_MAX, else equal parts, each a multiple of QK_K (so of every block size). */
static int64_t pass_cols(int64_t cols) {
    if (cols <= KB_MAX) return cols;
    return ceil_div(ceil_div(cols, ceil_div(cols, KB_MAX)), QK_K) * QK_K;
}

/* the workspace, in floats: the packed activations (every token tile, all columns), then per thread a panel over
 * one pass and eight dequantized rows' column block; each part a multiple of 64 bytes */
static size_t xpack_floats(int64_t cols, int64_t n_tok) {
    return (size_t)(ceil_div(ceil_div(n_tok, MT) * MT * cols, 16) * 16);
}

static size_t panel_floats(int64_t cols) { return (size_t)ceil_div(NR * pass_cols(cols) + 8 * KC, 16) * 16; }

size_t cpu_gemm_ws_bytes(int64_t cols, int64_t n_tok, int n_threads) {
    if (cols <= 0 || n_tok <= 0) return 0;
    return (xpack_floats(cols, n_tok) + (size_t)(n_threads > 1 ? n_threads : 1) * panel_floats(cols)) * sizeof(float) + 64;
}

int cpu_gemm_available(void) { return 1; }

const char *cpu_gemm_name(void) { return "AVX-512 f32"; }

typedef struct {
    float *out;
    const uint8_t *w;
    ggml_type wt;
    int64_t rows, cols, n_tok;
    const float *x;
    float *xp;     /* packed activations: tile i at i * MT * cols, column c's MT tokens at + c * MT */
    float *panels; /* per thread (panel_floats apart): the panel, [c][NR] over a pass, then 8 x KC floats of rows */
} gemm_job;

/* token tiles [lo, hi) of x into xp; the last tile's missing tokens are zeros. Four tokens x four columns at a
 * time, transposed in registers. */
static void pack_x(void *arg, int ith, int nth) {
    const gemm_job *j = arg;
    const int64_t cols = j->cols, c4 = cols / 4 * 4;
    long lo, hi;
    kvb_split((long)ceil_div(j->n_tok, MT), ith, nth, &lo, &hi);
    for (long i = lo; i < hi; i++) {
        float *dst = j->xp + (size_t)i * MT * (size_t)cols;
        const int n_t = j->n_tok - i * MT < MT ? (int)(j->n_tok - i * MT) : MT;
        const float *src = j->x + i * MT * cols;
        if (n_t < MT) memset(dst, 0, sizeof(float) * MT * (size_t)cols);
        int t0 = 0;
        for (; t0 + 4 <= n_t; t0 += 4) {
            const float *s0 = src + t0 * cols, *s1 = s0 + cols, *s2 = s1 + cols, *s3 = s2 + cols;
            for (int64_t c = 0; c < c4; c += 4) {
                __m128 r0 = _mm_loadu_ps(s0 + c), r1 = _mm_loadu_ps(s1 + c), r2 = _mm_loadu_ps(s2 + c),
                       r3 = _mm_loadu_ps(s3 + c);
                _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
                _mm_storeu_ps(dst + c * MT + t0, r0);
                _mm_storeu_ps(dst + (c + 1) * MT + t0, r1);
                _mm_storeu_ps(dst + (c + 2) * MT + t0, r2);
                _mm_storeu_ps(dst + (c + 3) * MT + t0, r3);
            }
        }
        for (int64_t c = 0; c < cols; c++) /* the rest: the last tokens, and every token's last columns */
            for (int t = c < c4 ? t0 : 0; t < n_t; t++) dst[c * MT + t] = src[t * cols + c];
    }
}

#define GEMM_INLINE static inline __attribute__((always_inline))

/* acc[t][h] += a[k*MT + t] * b[k*NR + 16h ..] over k < kc; then stored (or added: add = 1) into the first n_t
 * rows of c (ldc floats apart), the 32 columns masked by m0 and m1 */
GEMM_INLINE void micro_12x32(const float *a, const float *b, int64_t kc, float *c, int64_t ldc, int n_t,
                             __mmask16 m0, __mmask16 m1, int add) {
#define ACC_DECL(t) __m512 c##t##0 = _mm512_setzero_ps(), c##t##1 = _mm512_setzero_ps();
    ACC_DECL(0) ACC_DECL(1) ACC_DECL(2) ACC_DECL(3) ACC_DECL(4) ACC_DECL(5)
    ACC_DECL(6) ACC_DECL(7) ACC_DECL(8) ACC_DECL(9) ACC_DECL(10) ACC_DECL(11)
    for (int64_t k = 0; k < kc; k++, a += MT, b += NR) {
        const __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
#define ACC_STEP(t)                                      \
    {                                                    \
        const __m512 at = _mm512_set1_ps(a[t]);          \
        c##t##0 = _mm512_fmadd_ps(at, b0, c##t##0);      \
        c##t##1 = _mm512_fmadd_ps(at, b1, c##t##1);      \
    }
        ACC_STEP(0) ACC_STEP(1) ACC_STEP(2) ACC_STEP(3) ACC_STEP(4) ACC_STEP(5)
        ACC_STEP(6) ACC_STEP(7) ACC_STEP(8) ACC_STEP(9) ACC_STEP(10) ACC_STEP(11)
    }
#define ACC_OUT(t)                                                                                       \
    if (t < n_t) {                                                                                       \
        float *o = c + (int64_t)(t) * ldc;                                                               \
        if (add) {                                                                                       \
            c##t##0 = _mm512_add_ps(c##t##0, _mm512_maskz_loadu_ps(m0, o));                              \
            c##t##1 = _mm512_add_ps(c##t##1, _mm512_maskz_loadu_ps(m1, o + 16));                         \
        }                                                                                                \
        _mm512_mask_storeu_ps(o, m0, c##t##0);                                                           \
        _mm512_mask_storeu_ps(o + 16, m1, c##t##1);                                                      \
    }
    ACC_OUT(0) ACC_OUT(1) ACC_OUT(2) ACC_OUT(3) ACC_OUT(4) ACC_OUT(5)
    ACC_OUT(6) ACC_OUT(7) ACC_OUT(8) ACC_OUT(9) ACC_OUT(10) ACC_OUT(11)
#undef ACC_DECL
#undef ACC_STEP
#undef ACC_OUT
}

/* rows [r0, r0 + n_rows) (n_rows <= NR), columns [k0, k0 + kc), dequantized into panel[c * NR + r]; rows past
 * n_rows are zero. k0 and kc are multiples of KC (or kc the rest of the row), so of every block size. Eight rows
 * at a time go into `rows` (8 x kc floats), then into the panel by 8 x 8 transposes in registers. */
static void pack_panel(const gemm_job *j, int64_t r0, int64_t n_rows, int64_t k0, int64_t kc, float *panel,
                       float *rows) {
    const size_t rb = ggml_row_bytes(j->wt, (uint64_t)j->cols), off = ggml_row_bytes(j->wt, (uint64_t)k0);
    const int64_t c8 = kc / 8 * 8;
    for (int64_t r8 = 0; r8 < NR; r8 += 8) {
        for (int64_t r = 0; r < 8; r++) {
            if (r8 + r < n_rows) quant_dequant_row(j->wt, j->w + (size_t)(r0 + r8 + r) * rb + off, rows + r * kc, kc);
            else memset(rows + r * kc, 0, sizeof(float) * (size_t)kc);
        }
        for (int64_t c = 0; c < c8; c += 8) {
            __m256 v[8], u[8];
            for (int r = 0; r < 8; r++) v[r] = _mm256_loadu_ps(rows + r * kc + c);
            for (int r = 0; r < 8; r += 2) {
                u[r] = _mm256_unpacklo_ps(v[r], v[r + 1]);
                u[r + 1] = _mm256_unpackhi_ps(v[r], v[r + 1]);
            }
            for (int r = 0; r < 8; r += 4) {
                v[r] = _mm256_shuffle_ps(u[r], u[r + 2], 0x44);
                v[r + 1] = _mm256_shuffle_ps(u[r], u[r + 2], 0xEE);
                v[r + 2] = _mm256_shuffle_ps(u[r + 1], u[r + 3], 0x44);
                v[r + 3] = _mm256_shuffle_ps(u[r + 1], u[r + 3], 0xEE);
            }
            /* v[q] (v[q + 4]): rows 0-3 (4-7) of column c + q in its low half, of column c + q + 4 in its high */
            for (int q = 0; q < 4; q++) {
                _mm256_storeu_ps(panel + (c + q) * NR + r8, _mm256_permute2f128_ps(v[q], v[q + 4], 0x20));
                _mm256_storeu_ps(panel + (c + q + 4) * NR + r8, _mm256_permute2f128_ps(v[q], v[q + 4], 0x31));
            }
        }
        for (int64_t c = c8; c < kc; c++)
            for (int r = 0; r < 8; r++) panel[c * NR + r8 + r] = rows[r * kc + c];
    }
}

/* A thread's rows, a pass of columns at a time, a panel at a time: the panel's pass dequantized (32 x 896 floats,
 * 112 KiB, stays in L2), then each token tile's sums run over the pass's columns in registers and are stored (or
 * added, after the first pass) once. At 4864 columns one pass was slower: the 608 KiB panel and the tiles'
 * activations no longer fit L2 together. */
static void gemm_rows(void *arg, int ith, int nth) {
    const gemm_job *j = arg;
    long lo, hi;
    kvb_split((long)ceil_div(j->rows, NR), ith, nth, &lo, &hi);
    const int64_t n_tiles = ceil_div(j->n_tok, MT), pass = pass_cols(j->cols);
    float *panel = j->panels + (size_t)ith * panel_floats(j->cols), *row = panel + NR * pass;
    for (int64_t k0 = 0; k0 < j->cols; k0 += pass) {
        const int64_t kp = j->cols - k0 < pass ? j->cols - k0 : pass;
        for (long p = lo; p < hi; p++) {
            const int64_t r0 = p * NR, n_rows = j->rows - r0 < NR ? j->rows - r0 : NR;
            const __mmask16 m0 = n_rows >= 16 ? 0xFFFF : (__mmask16)((1u << n_rows) - 1);
            const __mmask16 m1 = n_rows >= 32 ? 0xFFFF : n_rows <= 16 ? 0 : (__mmask16)((1u << (n_rows - 16)) - 1);
            for (int64_t c0 = 0; c0 < kp; c0 += KC)
                pack_panel(j, r0, n_rows, k0 + c0, kp - c0 < KC ? kp - c0 : KC, panel + c0 * NR, row);
            for (int64_t i = 0; i < n_tiles; i++) {
                const int n_t = j->n_tok - i * MT < MT ? (int)(j->n_tok - i * MT) : MT;
                micro_12x32(j->xp + (size_t)i * MT * (size_t)j->cols + (size_t)k0 * MT, panel, kp,
                            j->out + i * MT * j->rows + r0, j->rows, n_t, m0, m1, k0 > 0);
            }
        }
    }
}

int cpu_gemm(float *out, const void *w, ggml_type wt, int64_t rows, int64_t cols, const float *x, int64_t n_tok,
             void *ws, size_t ws_bytes, kvb_pool *pool) {
    if (rows <= 0 || cols <= 0 || n_tok <= 0 || ggml_block_elems(wt) == 0 || cols % ggml_block_elems(wt)) return -1;
    if (ws_bytes < cpu_gemm_ws_bytes(cols, n_tok, kvb_pool_size(pool))) return -1;
    float *base = (float *)(((uintptr_t)ws + 63) & ~(uintptr_t)63);
    gemm_job j = {out, w, wt, rows, cols, n_tok, x, base, base + xpack_floats(cols, n_tok)};
    kvb_pool_run(pool, pack_x, &j);
    kvb_pool_run(pool, gemm_rows, &j);
    return 0;
}

#elif defined(KVB_HAVE_OPENBLAS)

size_t cpu_gemm_ws_bytes(int64_t cols, int64_t n_tok, int n_threads) {
    if (cols <= 0 || n_tok <= 0) return 0;
    return (size_t)(n_threads > 1 ? n_threads : 1) * slice_floats(cols, n_tok) * sizeof(float);
}

const char *cpu_gemm_name(void) { return "OpenBLAS f32"; }

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

size_t cpu_gemm_ws_bytes(int64_t cols, int64_t n_tok, int n_threads) {
    if (cols <= 0 || n_tok <= 0) return 0;
    return (size_t)(n_threads > 1 ? n_threads : 1) * slice_floats(cols, n_tok) * sizeof(float);
}

int cpu_gemm_available(void) { return 0; }

const char *cpu_gemm_name(void) { return "integer"; }

int cpu_gemm(float *out, const void *w, ggml_type wt, int64_t rows, int64_t cols, const float *x, int64_t n_tok,
             void *ws, size_t ws_bytes, kvb_pool *pool) {
    return -1;
}

#endif
