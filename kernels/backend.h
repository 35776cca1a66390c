/* backend.h — the op interface every compute backend implements: the ground floor of kvbench.
 *
 * The forward pass (engine/model.c) and the KV-cache methods call ops only through this table, so the
 * same code runs on the CPU backend (kernels/cpu/) and the CUDA backend (kernels/cuda/). Activation
 * buffers passed to ops live in the backend's own memory, the device tier (see "data ops" below); what an op
 * takes from host memory says "host": weights, model vectors, token ids, per-head pointer arrays. The table
 * names no engine type: weights, KV rows and memory are plain pointers, sizes and dtypes, and what the
 * engine needs from a backend (an allocator, a KV row writer) are plain function pointers it adapts
 * its KV store and memory trackers to. */
#ifndef KVB_BACKEND_H
#define KVB_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/dtype.h"

/* Where memory lives: next to the compute (GPU memory on CUDA) or on the host (pinned on CUDA). */
typedef enum { KVB_TIER_DEVICE = 0, KVB_TIER_HOST = 1, KVB_TIER_COUNT } kvb_tier;

/* Memory a backend hands out: device tier = its own memory, which host code never reads or writes (GPU memory
 * on CUDA, the heap or the guarded arena on the CPU); host tier = host memory the host may touch (pinned on
 * CUDA). alloc returns zeroed memory or NULL; copy is a synchronous copy between any two such blocks or plain
 * host memory (not counted in be->traffic: the engine uses it to move a block it reallocates). The engine's
 * memory trackers (engine/mem.h) allocate through it. */
typedef struct {
    void *(*alloc)(void *user, kvb_tier tier, size_t bytes);
    void (*free)(void *user, kvb_tier tier, void *p, size_t bytes);
    void (*copy)(void *user, void *dst, const void *src, size_t bytes);
    void *user;
} kvb_allocator;

/* Where one KV head's new rows go in a kv_writer call (its slots n_before onwards). host = 1: the head is in the
 * host tier (pinned on a GPU, which writes it through its mapping); the writer counts the rows of all such heads
 * of a call as one device->host copy in be->traffic. */
typedef struct {
    void *k, *v;
    int32_t *pos, *round;
    int host;
} kvb_kv_rows;
enum { KVB_MAX_KV_HEADS = 64 }; /* KV heads a kv_writer call and the CUDA attention take */
/* A device-side KV row writer: converts and stores n_tok rows of every head of a layer in one go:
 * dst[h].k[t] = k[t][h] (as dtype), likewise v; pos and round copied (round NULL = 0). 0, or -1 + err. */
typedef int (*kvb_kv_writer)(void *user, int n_head_kv, int head_dim, kvb_dtype dtype, int64_t n_tok,
                             const kvb_kv_rows *dst, const float *k, const float *v, const int32_t *pos,
                             const int32_t *round, char *err, size_t err_len);

/* A weight matrix as stored in the model file: rows x cols, each row of `cols`
 * elements in `type` (GGUF: ne[0] = cols, ne[1] = rows). data is host memory (the mapped file). */
typedef struct {
    const void *data;
    ggml_type type;
    int64_t rows, cols;
} kvb_weight;

typedef struct kvb_attn_args kvb_attn_args;
/* Attention over the KV store, all heads at once (GQA: query head h uses KV head h / (n_head/n_head_kv)).
 * Memory: the per-KV-head arrays k, v, k_pos, idx (of pointers) and n_kv, n_idx (of counts) are host arrays;
 * every pointer they hold, and q, q_pos, out, probs and lse, is device-tier memory. */
struct kvb_attn_args {
    int64_t n_q;                 /* query tokens */
    int n_head, n_head_kv, head_dim;
    const float *q;              /* [n_q][n_head][head_dim] */
    const int32_t *q_pos;        /* [n_q] absolute positions for the causal mask, or NULL = no mask */
    kvb_dtype kv_dtype;          /* K and V element type: f32 or f16 */
    const void *const *k;        /* host, per KV head: [n_kv[h]][head_dim] rows */
    const void *const *v;        /* host, per KV head: [n_kv[h]][head_dim] rows */
    const int32_t *const *k_pos; /* host, per KV head: absolute position of each slot (mask: visible iff k_pos <=
                                    q_pos) */
    const int64_t *n_kv;         /* host, per KV head: slots */
    const int32_t *const *idx;   /* host, optional, per KV head: index list into the slots (NULL = all slots;
                                    also a NULL entry for one head = all) */
    const int64_t *n_idx;        /* host, per KV head: length of idx[h] */
    float scale;                 /* usually 1/sqrt(head_dim) */
    float *out;                  /* [n_q][n_head][head_dim] */
    float *probs;                /* optional: [n_head][n_q][probs_stride] softmax probabilities over the visible
                                    list (in list order; masked entries 0) */
    int64_t probs_stride;
    float *lse;                  /* optional: [n_head][n_q] log-sum-exp of the scaled logits over visible keys */
    void *ws; size_t ws_bytes;   /* backend workspace (the CPU backend fills it) */
    int32_t window;              /* > 0: a sliding-window layer, key visible iff q_pos - window < k_pos <= q_pos;
                                    only `attention_window` takes it (`attention` ignores it: the engine never
                                    passes a window to it) */
};

/* RoPE as llama.cpp's ggml_rope_ext computes it: theta_i = pos * freq_base^(-2i/n_rot) / freq_factors[i], then
 * YaRN (ext_factor != 0: the ramp between corr_dims from beta_fast/beta_slow and n_ctx_orig, and the magnitude
 * 1 + 0.1 ln(1/freq_scale)) or linear interpolation (theta * freq_scale), cos and sin times attn_factor. */
typedef struct {
    float freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow;
    int n_ctx_orig;
    const float *freq_factors; /* host, n_rot/2 divisors (GGUF rope_freqs.weight), NULL = none */
} kvb_rope_params;

/* ---- data ops: what KV-cache methods do to the cache, done where the cache lives ----
 *
 * Memory model. The device tier is the backend's own memory (GPU memory on CUDA; the CPU heap on the CPU
 * backend, or a guarded mapping under KVB_GUARD, see kvb_backend_cpu_create); the host tier is host memory
 * (pinned on CUDA). Host code never reads or writes device-tier bytes: it calls these ops, and it moves bytes
 * between tiers only with `copy` or `kv_gather`, which count every copy in be->traffic (the bytes that cross
 * PCIe on a GPU). Index lists and scores live in the device tier and are consumed there; the host sees counts.
 * Unless a parameter says "host", every pointer below is device-tier memory. Ops are ordered: each sees what
 * earlier ops wrote; host code reads a d2h destination only after be->sync. */

typedef enum { KVB_COPY_H2D = 0, KVB_COPY_D2H = 1, KVB_COPY_D2D = 2, KVB_COPY_DIRS } kvb_copy_dir;

/* Copies made by `copy` and `kv_gather`, per direction: calls and bytes (never reset by the backend). */
typedef struct {
    int64_t n[KVB_COPY_DIRS], bytes[KVB_COPY_DIRS];
} kvb_traffic;

/* One KV head's slots: slot s holds K row k[s], V row v[s] (row_bytes each: head_dim elements of the store's
 * dtype), its absolute position pos[s] and dialogue round round[s]. */
typedef struct {
    void *k, *v;
    int32_t *pos, *round;
} kvb_kv_head;

/* probs_reduce modes (probabilities p[h][t][j] of n_head query heads, n_q rows, as attention writes them) */
enum {
    /* out[g][j] = sum over the group's heads r = 0..G-1 (outer) and rows t = 0..n_q-1 (inner) of
     * p[g*G + r][t][j], added in that order in float to out's previous value (accumulate) or to 0 */
    KVB_REDUCE_GROUP_SUM = 0,
    /* out[j] = sum over rows t of (float)(w[t] * max(0, max_h p[h][t][j])) (w[t] double, host; NULL = 1),
     * added in row order in float (one row of out, shared by every KV head) */
    KVB_REDUCE_MAX_HEADS = 1,
};

/* KIVI (methods/kivi.c): quantized KV. A group is G codes of `bits` bits (1, 2, 4 or 8; G * bits a multiple of
 * 16) followed by its scale s and minimum z as f16: kvb_quant_group_bytes(G, bits) bytes. Code i sits at bits
 * [i*bits, (i+1)*bits) of the group's code bytes, least significant first; it dequantizes to
 * (float)z + (float)code * (float)s (the product rounded to float first, then the sum). */
/* pod_merge's chunk of distant rows (its order of the sum) */
#define KVB_POD_CHUNK 512
/* pod_share's distant mass: slot first + i adds into partial sum i % KVB_POD_LANES (its slots in ascending order),
 * and the partial sums are then added in lane order, so that vectors (and a warp's lanes) can run the sum */
#define KVB_POD_LANES 32

static inline size_t kvb_quant_group_bytes(int G, int bits) { return (size_t)G * (size_t)bits / 8 + 4; }
/* A quantized KV segment per KV head: n tokens at positions pos0 .. pos0 + n - 1 (n a multiple of group), K in
 * per-channel groups and V in per-token groups (quant_groups' layouts, per_channel 1 and 0). k, v: host arrays of
 * n_head_kv device pointers. */
typedef struct {
    const void *const *k, *const *v;
    int64_t n;
    int32_t pos0;
    int group, bits;
} kvb_quant_kv;

/* ThinK (methods/think.c): a KV segment whose keys keep dk of the head's channels beside whole values, per KV head:
 * n tokens, K rows [n][dk] and V rows [n][head_dim] of the attention's kv_dtype, positions pos[n]. qg:
 * [n_q][n_head][dk] f32, each query head's q at its KV head's kept channels in the K rows' order (gather_cols).
 * k, v, pos: host arrays of n_head_kv device pointers. */
typedef struct {
    const void *const *k, *const *v;
    const int32_t *const *pos;
    int64_t n;
    int dk;
    const float *qg;
} kvb_narrow_kv;

/* How the CPU backend multiplies a matmul over many tokens (kvb_backend.gemm): KVB_GEMM_INT8 = always the
 * integer path in llama.cpp's order (activations quantized, integer dots: bitwise llama.cpp's); KVB_GEMM_F32 =
 * from CPU_GEMM_MIN_TOK tokens on (kernels/cpu/gemm.h), f32 weights dequantized a panel at a time into an
 * OpenBLAS sgemm, where the build links OpenBLAS (elsewhere the integer path). Decode is integer either way. */
typedef enum { KVB_GEMM_INT8 = 0, KVB_GEMM_F32 = 1 } kvb_gemm;

typedef struct kvb_backend kvb_backend;
struct kvb_backend {
    const char *name;
    int n_threads;
    kvb_gemm gemm; /* the engine sets it per forward call (kvb_ctx_params.prefill_gemm); GPU backends ignore it */
    /* Ops that return int give 0, or -1 with the reason in err (matmul, which takes none: in `error`). Ops that
     * return nothing record a failure in `error` (only GPU backends, whose ops run asynchronously, can fail
     * there), and the next int-returning op or sync reports it: a failed GPU backend stays failed. */
    /* out[t][r] = W[r] . x[t] for t < n_tok (x quantized to the weight's activation format first) */
    int (*matmul)(kvb_backend *be, float *out, const kvb_weight *w, const float *x, int64_t n_tok);
    /* out[i] = dequantized row ids[i] of w (ids: host) */
    void (*get_rows)(kvb_backend *be, float *out, const kvb_weight *w, const int32_t *ids, int64_t n);
    /* w (host): the model's norm weights; likewise add_bias's bias */
    void (*rmsnorm)(kvb_backend *be, float *out, const float *x, const float *w, int64_t n, int64_t n_rows, float eps);
    void (*rope)(kvb_backend *be, float *x, int64_t n_tok, int n_head, int head_dim, int n_rot, const int32_t *pos,
                 float freq_base, int neox);
    void (*swiglu)(kvb_backend *be, float *out, const float *gate, const float *up, int64_t n);
    void (*add)(kvb_backend *be, float *out, const float *a, const float *b, int64_t n);
    /* out[t][i] += bias[i] for t < n_rows */
    void (*add_bias)(kvb_backend *be, float *x, const float *bias, int64_t n, int64_t n_rows);
    /* Fusions the forward pass takes when set (NULL: the separate ops), with the separate ops' results bit for
     * bit; a GPU saves launches. matmul_n: out[i] = matmul(w[i], x) for i < k <= 3 (one input). add_rmsnorm:
     * x += d, then out = rmsnorm(x, w) (out may be d). */
    int (*matmul_n)(kvb_backend *be, int k, float *const *out, const kvb_weight *const *w, const float *x,
                    int64_t n_tok);
    void (*add_rmsnorm)(kvb_backend *be, float *x, const float *d, float *out, const float *w, int64_t n,
                        int64_t n_rows, float eps);
    /* rope_qk: rope of q (n_head heads) and of k (n_head_kv heads), as two rope calls would */
    void (*rope_qk)(kvb_backend *be, float *q, int n_head, float *k, int n_head_kv, int64_t n_tok, int head_dim,
                    int n_rot, const int32_t *pos, float freq_base, int neox);
    int (*attention)(kvb_backend *be, const kvb_attn_args *a, char *err, size_t err_len);
    /* ---- ops of the newer architectures (NULL where a backend lacks them: the engine refuses such a model on it
     * with one line naming the op) ---- */
    /* rope with scaling (kvb_rope_params), in place on x[n_tok][n_head][head_dim] */
    void (*rope_ext)(kvb_backend *be, float *x, int64_t n_tok, int n_head, int head_dim, int n_rot, const int32_t *pos,
                     int neox, const kvb_rope_params *rp);
    /* out = gelu(gate) * up with GELU's tanh form, as ggml's geglu (through its f16 GELU table) */
    void (*geglu)(kvb_backend *be, float *out, const float *gate, const float *up, int64_t n);
    /* x[i] *= s */
    void (*scale)(kvb_backend *be, float *x, float s, int64_t n);
    /* attention with a->window > 0 (a sliding-window layer); otherwise as `attention` (probs, lse, idx as there) */
    int (*attention_window)(kvb_backend *be, const kvb_attn_args *a, char *err, size_t err_len);
    /* ---- data ops (see above) ---- */
    /* bytes from src to dst in direction dir (H2D: src host, dst device; D2H: src device, dst host; D2D: both
     * device, may overlap like memmove). Counted in be->traffic. */
    int (*copy)(kvb_backend *be, void *dst, const void *src, size_t bytes, kvb_copy_dir dir, char *err,
                size_t err_len);
    /* dst[0..bytes) = 0 */
    int (*zero)(kvb_backend *be, void *dst, size_t bytes, char *err, size_t err_len);
    /* dst slot dst_off + i = src slot idx[i] (K, V, pos, round) for i < n; idx NULL = slots 0..n-1. D2D: both
     * heads device, idx device. H2D (src in the host tier) and D2H (dst in the host tier): idx is host memory,
     * and the backend packs the rows on the host side and makes one counted copy per array (K, V, pos, round).
     * dst and src must not overlap. */
    int (*kv_gather)(kvb_backend *be, const kvb_kv_head *dst, int64_t dst_off, const kvb_kv_head *src,
                     const int32_t *idx, int64_t n, size_t row_bytes, kvb_copy_dir dir, char *err,
                     size_t err_len);
    /* A packed load for many heads at once: for every j < n_heads, slots idx[j][0..n[j]) of host-tier head src[j]
     * (idx host memory; a NULL list or entry = slots 0..n[j]-1) go to slots dst_off[j].. of device-tier head
     * dst[j] (K, V, pos, round). One counted H2D copy for the whole load (a GPU reads the listed rows of the
     * pinned host tier straight into place: no host-side packing); destinations must not overlap. */
    int (*kv_load)(kvb_backend *be, int n_heads, const kvb_kv_head *dst, const int64_t *dst_off,
                   const kvb_kv_head *src, const int32_t *const *idx, const int64_t *n, size_t row_bytes, char *err,
                   size_t err_len);
    /* Evict from n_heads heads at once (distinct heads; h, n, score, count, spill_v are host arrays of device
     * pointers and counts): head j, of n[j] slots, loses count[j] slots one at a time. The victim is the slot
     * with lo <= pos < hi whose key (score[j][s], or pos[s] when score or score[j] is NULL) is lowest, ties to
     * the lowest slot (a NaN score is below every number, so every backend picks the same victim); its V row is written to row i of spill_v[j] (optional: spill_v or spill_v[j] NULL) for
     * the i-th eviction; then the last slot moves into the victim's place (K, V, pos, round and score[j][]), and
     * n[j] shrinks by one. The caller guarantees a candidate each time (the CPU backend reports a violation).
     * One call per layer, not per head: a GPU evicts the heads side by side in one launch. */
    int (*kv_evict)(kvb_backend *be, int n_heads, const kvb_kv_head *h, const int64_t *n, size_t row_bytes,
                    float *const *score, int32_t lo, int32_t hi, const int64_t *count, void *const *spill_v,
                    char *err, size_t err_len);
    /* Reduce attention probabilities (probs: [n_head][n_q][stride], columns 0..n-1 read) into per-slot scores
     * out (rows out_stride apart), by mode (KVB_REDUCE_*); accumulate = add to out instead of overwriting. */
    int (*probs_reduce)(kvb_backend *be, float *out, int64_t out_stride, const float *probs, int64_t stride,
                        int n_head, int n_head_kv, int64_t n_q, int64_t n, const double *w, int mode,
                        int accumulate, char *err, size_t err_len);
    /* The sums probs_reduce (KVB_REDUCE_GROUP_SUM, accumulate) takes of attention's probabilities, without writing
     * them: for every KV head g and entry j of its list (a->idx[g], else slots 0..n_kv[g]-1), out[g][j] += p for its
     * group's query heads r ascending, then the queries t ascending, each added in float, with p = expf(s - lse) for
     * s = a->scale * (the float dot product of q[t][g G + r] with the key as float, elements ascending) and lse =
     * a->lse[g G + r][t] as `attention` wrote it for the same arguments; p = 0 where the key is hidden from t (k_pos >
     * q_pos; with a->window > 0, window or more positions earlier) or lse is -inf. out: host array of n_head_kv
     * device rows. H2O's and ObservedAttention's prefill scores: the n_head x n_q x n probabilities of a chunk are
     * never written (2.2 TB over a 32K prefill on the 8B shapes). */
    int (*attention_colsum)(kvb_backend *be, const kvb_attn_args *a, float *const *out, char *err, size_t err_len);
    /* out[r][i] = max (avg = 0) or sum / kernel (avg = 1, double sum) of in[r][i - kernel/2 .. i + kernel/2]
     * clipped to [0, n), for rows r < rows (max_pool1d / avg_pool1d with same padding, count_include_pad). */
    int (*pool1d)(kvb_backend *be, float *out, int64_t out_stride, const float *in, int64_t in_stride,
                  int64_t rows, int64_t n, int64_t kernel, int avg, char *err, size_t err_len);
    /* idx[0..k) = the slots of the k largest score[0..n) in ascending slot order (ties: lower slot first; NaN
     * below every number); k is clipped to n. */
    int (*topk_idx)(kvb_backend *be, int32_t *idx, const float *score, int64_t n, int64_t k, char *err,
                    size_t err_len);
    /* topk_idx for rows r < rows at once: idx + r * idx_stride from score + r * score_stride (a GPU takes the rows
     * side by side in one launch: Quest's pages of a layer's KV heads) */
    int (*topk_rows)(kvb_backend *be, int32_t *idx, int64_t idx_stride, const float *score, int64_t score_stride,
                     int64_t rows, int64_t n, int64_t k, char *err, size_t err_len);
    /* idx[i] = start + i for i < n */
    int (*iota)(kvb_backend *be, int32_t *idx, int32_t start, int64_t n, char *err, size_t err_len);
    /* dst[i] = src[idx[i]] for i < n (dst and src must not overlap) */
    int (*gather_f32)(kvb_backend *be, float *dst, const float *src, const int32_t *idx, int64_t n, char *err,
                      size_t err_len);
    /* Round Attention's round scores: for every KV head g (round[g]: its slots' round ids, n[g] host), query
     * head r of its group, row t and slot j < n[g] (in that order) whose round rd is in [0, n_round) and not
     * skip: out[rd] += probs[g*G + r][t][j] (double) and present[rd] = 1. out, present: n_round entries,
     * accumulated (zero them first). round: host array of n_head_kv device pointers. */
    int (*round_scores)(kvb_backend *be, double *out, int32_t *present, int n_round, const float *probs,
                        int64_t stride, int n_head, int n_head_kv, int64_t n_q, const int32_t *const *round,
                        const int64_t *n, int32_t skip, char *err, size_t err_len);
    /* PoD, base heads (is_base[h] host, n_head entries): from one decode query's probabilities over slots in
     * position order, the distant slots first .. first + n_dist - 1 give m = their mass (a double sum in
     * KVB_POD_LANES interleaved partial sums, each in slot order, added in lane order from 0),
     * pd[h][i] = p[h][first + i] * (float)(1/m) (0 when m = 0) and lse_d[h] = lse_p[h] + log m (-inf when
     * m = 0). Other heads are not written. */
    int (*pod_share)(kvb_backend *be, float *pd, int64_t pd_stride, float *lse_d, const float *probs,
                     int64_t stride, const float *lse_p, int n_head, const unsigned char *is_base,
                     int64_t first, int64_t n_dist, char *err, size_t err_len);
    /* PoD's merge for the G query heads of one KV head (eq. 4): gate = 1 / (1 + exp(lse_d[r] - lse_p[r])) in
     * double (1 when lse_d[r] is not finite); gate >= tau: skipped (counts[1]++); else counts[0]++ and
     * out[r] = gate out[r] + (1 - gate) o_d over the n_dist distant V rows (head_dim elements of dtype), in float:
     * o_d = 0 + s_0 + s_1 + ... (chunks c ascending), s_c = 0 + the sum of pd[r][i] v[i] over the c-th
     * KVB_POD_CHUNK rows, i ascending (the last chunk partial), so that chunks can run in parallel. out:
     * [G][head_dim]; counts: device int64[2]. */
    int (*pod_merge)(kvb_backend *be, float *out, const float *lse_p, const float *lse_d, const float *pd,
                     int64_t pd_stride, const void *v, kvb_dtype dtype, int G, int head_dim, int64_t n_dist,
                     double tau, int64_t *counts, char *err, size_t err_len);
    /* ---- knorm, quest (issue 19) ---- */
    /* Knorm: out[i] = sqrt(sum_e k[i][e]^2) for rows i < n of dim elements of dtype, summed in double in element
     * order, the root taken in double, stored as float; negated when negate = 1 (so topk_idx picks the lowest). */
    int (*row_norms)(kvb_backend *be, float *out, const void *k, kvb_dtype dtype, int dim, int64_t n, int negate,
                     char *err, size_t err_len);
    /* Quest's page metadata: rows 0..n-1 (dim elements of dtype) form blocks of `block` rows (the last one may be
     * partial); for every block b that holds a row from `from` on (b = from / block .. (n - 1) / block), rewrite
     * kmin[b][e] = min and kmax[b][e] = max over the block's rows r < n of (float)k[r][e]. */
    int (*block_minmax)(kvb_backend *be, float *kmin, float *kmax, const void *k, kvb_dtype dtype, int dim,
                        int64_t block, int64_t from, int64_t n, char *err, size_t err_len);
    /* Quest's page scores for the G query heads q[r][e] (r < G, [G][dim]) of one KV head: per query head
     * u_r(b) = sum over e ascending of max(q[r][e] kmin[b][e], q[r][e] kmax[b][e]), products and sum in double;
     * score[b] = (float) of the sum over r ascending (group_max = 0) or the max over r (group_max = 1) of u_r(b),
     * for blocks b < n_block. */
    int (*block_scores)(kvb_backend *be, float *score, const float *q, const float *kmin, const float *kmax, int G,
                        int dim, int64_t n_block, int group_max, char *err, size_t err_len);
    /* idx[i] = blocks[i / block] * block + i % block for i < n: a list of block numbers as their slots (the last
     * block may be cut short by n). */
    int (*block_expand)(kvb_backend *be, int32_t *idx, const int32_t *blocks, int64_t block, int64_t n, char *err,
                        size_t err_len);
    /* The three above over a layer's KV heads in one call each (Quest's decode step: a GPU takes the heads side by
     * side in one launch), each head's results those of the one-head op bit for bit. block_minmax_heads: head j <
     * n_heads is block_minmax(kmin[j], kmax[j], k[j], ...) (host arrays of device pointers). block_scores_heads: head
     * j is block_scores(score + j * score_stride, q + j * G * dim, kmin[j], kmax[j], ...). block_expand_rows: row j <
     * rows lists n_listed blocks at blocks + j * blocks_stride, then blocks tail, tail + 1, ...: idx + j * idx_stride
     * gets slot (b < n_listed ? blocks[b] : tail + b - n_listed) * block + i % block, b = i / block, for i < n. */
    int (*block_minmax_heads)(kvb_backend *be, int n_heads, float *const *kmin, float *const *kmax, const void *const *k,
                              kvb_dtype dtype, int dim, int64_t block, int64_t from, int64_t n, char *err, size_t err_len);
    int (*block_scores_heads)(kvb_backend *be, int n_heads, float *score, int64_t score_stride, const float *q,
                              const float *const *kmin, const float *const *kmax, int G, int dim, int64_t n_block,
                              int group_max, char *err, size_t err_len);
    int (*block_expand_rows)(kvb_backend *be, int rows, int32_t *idx, int64_t idx_stride, const int32_t *blocks,
                             int64_t blocks_stride, int64_t n_listed, int64_t tail, int64_t block, int64_t n, char *err,
                             size_t err_len);
    /* ---- KIVI: asymmetric group quantization of KV rows, and attention over it (kvb_quant_kv) ---- */
    /* Quantize n rows of d elements of dtype at x into groups at out (kvb_quant_group_bytes each, in group order).
     * per_channel = 1 (keys): n a multiple of G; group b*d + c holds rows b*G .. b*G + G - 1 of column c.
     * per_channel = 0 (values): d a multiple of G; group t*(d/G) + j holds elements j*G .. j*G + G - 1 of row t.
     * Per group, from its values widened to f32: z = the minimum rounded down to f16, s = (max - z) / (2^bits - 1)
     * in f32 rounded up to f16, code = clamp(rintf((x - z) / s), 0, 2^bits - 1) (0 when s = 0); the directed
     * roundings keep every x within [z, z + (2^bits - 1) s], so |x - deq(x)| <= s/2 (f32 rounding aside). Values
     * beyond f16's range are not representable (an f16 KV store has none). */
    int (*quant_groups)(kvb_backend *be, void *out, const void *x, kvb_dtype dtype, int64_t n, int d, int G, int bits,
                        int per_channel, char *err, size_t err_len);
    /* Attention over a quantized segment q merged into an attention over the rest: a->out and a->lse ([n_head][n_q],
     * required) hold what `attention` wrote for the store's part (an empty or fully masked row: lse = -inf). For
     * query row t and head h (KV head g = h / (n_head / n_head_kv)): token i < q->n is visible iff
     * q->pos0 + i <= q_pos[t] (every token when q_pos is NULL); s_i = a->scale * sum_e q[t][h][e] k_i[e] (float,
     * e ascending; k_i dequantized); M = max(lse, max s_i); w0 = exp(lse - M) (0 when lse = -inf), w_i =
     * exp(s_i - M) (double); L = w0 + sum_i w_i (double, i ascending); out[e] = (float)((w0 out[e] + acc[e]) / L) in
     * double (w0 out[e] = 0 when w0 = 0) with acc[e] = sum_i (float)w_i v_i[e] (float, i ascending); lse = M + log L.
     * Rows that see nothing keep out and lse. */
    int (*attention_quant)(kvb_backend *be, const kvb_attn_args *a, const kvb_quant_kv *q, char *err,
                           size_t err_len);
    /* ---- AdaKV (methods/adakv.c): one top-k over all KV heads of a layer, split back into per-head lists ---- */
    /* dst[idx[i]] = value for i < n (in i order) */
    int (*fill_idx_f32)(kvb_backend *be, float *dst, const int32_t *idx, int64_t n, float value, char *err,
                        size_t err_len);
    /* n ascending indices flat[0..n) into a [rows][row_len] array, split by row: counts[r] (int32, every row
     * written) = how many fall in row r = flat[i] / row_len, and out[r * out_stride + j] = flat[i] - r * row_len
     * for the j-th of them, in flat's order. The caller guarantees the order, rows > flat[i] / row_len and
     * out_stride >= every count. */
    int (*split_rows_idx)(kvb_backend *be, int32_t *out, int64_t out_stride, int32_t *counts, const int32_t *flat,
                          int64_t n, int64_t row_len, int rows, char *err, size_t err_len);
    /* ---- elementwise ops on per-slot vectors (issue 38: LagKV, CUR, ExpectedAttention's value norms and
     * covariance term); sums in the order given, so every backend gives the CPU's bits (softmax_rows: its exp
     * within an ulp) ---- */
    /* out[i] = a[i] * b[i] in float for i < n (out may be a or b) */
    int (*mul_f32)(kvb_backend *be, float *out, const float *a, const float *b, int64_t n, char *err, size_t err_len);
    /* out[i] = (float)((alpha a[i] + beta b[i]) + gamma) in double, each product rounded, for i < n; b NULL = no b
     * term (out may be a or b) */
    int (*axpby_f32)(kvb_backend *be, float *out, const float *a, double alpha, const float *b, double beta,
                     double gamma, int64_t n, char *err, size_t err_len);
    /* In place, rows r < rows of x (stride apart), columns 0..n-1: m = the row's float max, e_i = exp((double)x_i -
     * m), s = sum of e_i (double, i ascending), x_i = (float)(e_i / s). A NaN, or a row of -inf, gives NaN. */
    int (*softmax_rows)(kvb_backend *be, float *x, int64_t stride, int64_t rows, int64_t n, char *err, size_t err_len);
    /* ||U x_j||^2: out[j] = (float) of the sum over r < m ascending of d_r^2, d_r = sum over e ascending of
     * (double)u[r][e] x[j][e] (double), for rows j < n of x (dim elements of dtype); u: [m][dim] f32. */
    int (*proj_sqnorms)(kvb_backend *be, float *out, const void *x, kvb_dtype dtype, int dim, int64_t n,
                        const float *u, int m, char *err, size_t err_len);
    /* The Gram matrix X^T X of n rows of d floats: out[a][b] = (float) of the sum over j < n ascending of
     * (double)x[j][a] (double)x[j][b] (double), for a, b < d (out: [d][d]; Compactor's key geometry; a GPU
     * computes the d x d sums side by side, each in that order). */
    int (*gram_f32)(kvb_backend *be, float *out, const float *x, int64_t n, int d, char *err, size_t err_len);
    /* ||U x_j||_1: out[j] = (float) of the sum over r < m ascending of |d_r|, d_r = sum over e ascending of
     * (double)u[r u_stride + e] x[j][e] (double), for rows j < n of x (dim elements of dtype); u: m rows of dim f32,
     * u_stride apart (a column slice of a wider matrix: W_o's columns of one head) */
    int (*proj_l1norms)(kvb_backend *be, float *out, const void *x, kvb_dtype dtype, int dim, int64_t n,
                        const float *u, int64_t u_stride, int m, char *err, size_t err_len);
    /* For rows i < n of x (dim elements of dtype), b = i / block: y_e = ((double)x[i][e] - lo[b][e]) / ((double)
     * hi[b][e] - lo[b][e]) (lo, hi: [.][dim] f32), out[i] = (float)sqrt(sum_e (y_e - mean y)^2 / (dim - 1)), mean and
     * sum in double, e ascending: the sample standard deviation of the row scaled by its block's ranges (dim 1,
     * or hi = lo: NaN or inf). */
    int (*block_scaled_std)(kvb_backend *be, float *out, const void *x, kvb_dtype dtype, int dim, int64_t n,
                            const float *lo, const float *hi, int64_t block, char *err, size_t err_len);
    /* In place, x[i] = (float)((double)x[i] / s_b) for i < n, s_b = the double sum, ascending, of x over i's block
     * of `block` slots (b*block .. min(n, (b+1)*block) - 1; 0/0: NaN). */
    int (*block_normalize)(kvb_backend *be, float *x, int64_t n, int64_t block, char *err, size_t err_len);
    /* out[i] = (float) the number of slots j of i's block (as block_normalize's) that sort before i: x[j] < x[i], or
     * x[j] == x[i] and j < i; NaN after every number, NaNs by slot. A rank: 0 .. block - 1, distinct in a block. */
    int (*block_ranks)(kvb_backend *be, float *out, const float *x, int64_t n, int64_t block, char *err,
                       size_t err_len);
    /* ---- keys narrower than values (ThinK, methods/think.c: kvb_narrow_kv) ---- */
    /* out[r out_stride + j] = x[r in_stride + cols[j]] for rows r < n and j < m: elements of dtype copied bit for
     * bit (strides in elements; cols: m device int32 in [0, in_stride)); out and x must not overlap. */
    int (*gather_cols)(kvb_backend *be, void *out, int64_t out_stride, const void *x, int64_t in_stride, kvb_dtype dtype,
                       const int32_t *cols, int m, int64_t n, char *err, size_t err_len);
    /* Attention over a narrow-key segment s merged into an attention over the rest, as attention_quant merges
     * (a->out and a->lse required; a->q unused, s->qg read instead): for query row t and head h (KV head g), token
     * i < s->n is visible iff s->pos[g][i] <= q_pos[t] (every token when q_pos is NULL); s_i = a->scale *
     * sum_j qg[t][h][j] k_i[j] (float, j ascending over the dk kept channels); M = max(lse, max s_i); w0 =
     * exp(lse - M) (0 when lse = -inf), w_i = exp(s_i - M) (double); L = w0 + sum_i w_i (double, i ascending);
     * out[e] = (float)((w0 out[e] + acc[e]) / L) in double (w0 out[e] = 0 when w0 = 0) with acc[e] = sum_i
     * (float)w_i v_i[e] (float, i ascending, e < head_dim); lse = M + log L. Rows that see nothing keep out and lse. */
    int (*attention_narrow)(kvb_backend *be, const kvb_attn_args *a, const kvb_narrow_kv *s, char *err,
                            size_t err_len);
    void (*free)(kvb_backend *be);
    /* Wait for enqueued work: called before host code reads what ops wrote (NULL = ops are synchronous).
     * 0, or -1 when an op has failed (the reason in `error`). */
    int (*sync)(kvb_backend *be);
    /* A one-token decode step begins (NULL = nothing to do; the engine calls it from its forward pass): the backend
     * may hold what the step enqueues and launch it as one unit at the step's first wait (CUDA: a graph, a candidate
     * behind $KVB_CUDA_GRAPH=1, kernels/cuda/graph.cu). Nothing changes for the caller: ops keep their order, and a
     * sync, a copy down or a free still sees every op before it done. 0, or -1 (the reason in `error`). */
    int (*step_begin)(kvb_backend *be);
    /* Memory the engine's trackers should allocate from (NULL = C heap) and a device-side KV row writer
     * (NULL = host code; called with the backend as user); every backend sets both (the CPU backend: the C
     * heap, or the guarded arena under KVB_GUARD). */
    const kvb_allocator *allocator;
    kvb_kv_writer kv_writer;
    /* 1: the device tier is separate memory (a GPU): weights are held there as f16 copies, and growing a buffer
     * there costs an allocation and a copy that wait for the device */
    int discrete;
    kvb_traffic traffic; /* copies made by copy / kv_gather (see the data ops) */
    void *impl;      /* backend private state (thread pool, workspaces) */
    char error[256]; /* one line: why an op failed ("" = none; see above) */
};

/* The CPU backend with n_threads (<= 0: one per core). NULL on failure. With $KVB_GUARD set (and not "0") its
 * device tier is a mapping host code cannot read or write outside its ops (any touch dies with SIGSEGV), so the
 * tests prove that engine and method code leave device-tier bytes to the ops (kernels/cpu/guard.h). */
kvb_backend *kvb_backend_cpu_create(int n_threads, char *err, size_t err_len);
/* The threads kvb_backend_cpu_create(0, ...) takes: $KVB_THREADS, else the CPUs this process may use (affinity mask,
 * cgroup quota); what a run or a server records and splits without making a backend to ask */
int kvb_backend_cpu_default_threads(void);
/* 1 when the CPU backend's prefill matmuls run the f32 GEMM under gemm (KVB_GEMM_F32 in a build with OpenBLAS) */
int kvb_backend_cpu_gemm_f32(kvb_gemm gemm);
/* What the CPU backend's prefill matmuls use under gemm: "AVX-512 f32" (gemm.c's own kernel, AVX-512 builds),
 * "OpenBLAS f32", or "integer" (KVB_GEMM_INT8, or a build without either). */
const char *kvb_backend_cpu_gemm_name(kvb_gemm gemm);
/* The CUDA backend on GPU 0 ($KVB_CUDA_DEVICE picks another). It converts each weight matrix to f16 on first use
 * and caches it by host address for its lifetime: weights must stay mapped and unchanged while it lives (builds with KVB_HAVE_CUDA). NULL + err when there is no GPU or no CUDA build. */
kvb_backend *kvb_backend_cuda_create(char *err, size_t err_len);
/* The CUDA decode GEMV: 5 (the default: v4 from 8192 rows, v1 below), 1, 2 (four weight loads in flight per lane),
 * 3 (eight, v1's sums bit for bit), 4 (four rows a warp) or 6 (a candidate: a block of warps a row, their count
 * kvb_cuda_set_gemv6_warps: 2, 4 or 8, else 4); before any call: $KVB_GEMV_KERNEL and $KVB_GEMV6_WARPS. Builds
 * with KVB_HAVE_CUDA only. */
void kvb_cuda_set_gemv_kernel(int k);
void kvb_cuda_set_gemv6_warps(int w);
/* Decode steps recorded and launched as CUDA graphs (1) or not (0, the default; $KVB_CUDA_GRAPH=1 before the first
 * step, or --cuda-kernels graph=1); and what the recording did so far, one line ("" when off). Builds with
 * KVB_HAVE_CUDA only. */
void kvb_cuda_set_graph(int on);
const char *kvb_cuda_graph_stats(void);
/* The recording's counters so far: decode steps recorded, graphs launched, their nodes (zeros when off) */
void kvb_cuda_graph_counts(long long *steps, long long *graphs, long long *nodes);
/* The CUDA kernels this process uses, one line ("attention v3, prefill tensor cores, GEMV v1, probabilities v1"):
 * bench prints it and run.json records it, since each switch changes timings and some change rounding. */
const char *kvb_cuda_kernels(void);
/* The same choices as a short tag ("attn3.tc.gemv1.probs1") for record fingerprints. */
const char *kvb_cuda_kernels_tag(void);
/* A backend by name: "cpu" or "cuda". */
kvb_backend *kvb_backend_create(const char *name, int n_threads, char *err, size_t err_len);
/* Format a one-line error into err (NULL or 0 = none); returns -1. The ops' and the methods' error helper. */
int kvb_errf(char *err, size_t err_len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Release a backend created by any *_create. NULL is a no-op. */
void kvb_backend_free(kvb_backend *be);

#endif
