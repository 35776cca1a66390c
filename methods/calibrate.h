/* calibrate.h — the papers' calibration analyses (DESIGN.md "Calibration"): the model properties Round
 * Attention, OmniKV and PoD read from the profile (methods/profile.h), measured on calibration inputs.
 *
 *   round  (papers/000 sec. 3.1, Observation 2): per layer l the round attention P_q^l of the question over
 *          the past rounds (eq. 1, normalised); curve(l) = mean over l' > l of KL(P^l || P^l'); the watershed
 *          layer is where that curve drops and stays low (kvb_cal_watershed).
 *   omnikv (papers/004 sec. 3, "filter" ability): the top-k tokens of layer l (max over heads of the last
 *          query's attention) and the attention mass later layers put on them; the filter layers are the
 *          most able layers, never adjacent (kvb_cal_pick_filters).
 *   pod    (papers/001 sec. 2.1, eq. 1-2, Algorithm 1): head-wise similarity of layers = 1 - mean JS
 *          divergence (log base 2) of the last q queries' attention rows; greedy bottom-up layer blocks
 *          (kvb_cal_group).
 *   qfilter (Q-Filters, arXiv 2503.02812, sec. 3): per layer and KV head, the first right singular vector of the
 *          matrix of its query heads' post-RoPE queries (the top eigenvector of Q^T Q), its sign chosen so that
 *          the mean query projects positively on it (kvb_cal_qfilter_add, kvb_cal_qfilter_dirs).
 *   duo    (DuoAttention, arXiv 2410.10819, training-free): a head's retrieval score = the attention mass the
 *          question's queries of a synthetic passkey prompt put on the passkey's tokens, mean over the KV head's
 *          query heads and the question's rows (kvb_cal_duo_mass).
 *
 * The math is small pure functions over float arrays (accumulated in double), tested against naive float64
 * code; the kvb_cal_*_run functions drive the engine on one input with their own hooks and feed them. No
 * CLI here: benchmarks/calibration.c (`kvbench calibrate`, and a run missing a profile section) builds the inputs,
 * averages, prints and stores. */
#ifndef KVB_CALIBRATE_H
#define KVB_CALIBRATE_H

#include <stdint.h>

#include "engine/model.h"
#include "engine/session.h"

/* The default calibration inputs (`kvbench calibrate` and the calibration `kvbench run` makes): this many
 * synthetic multi-round recall dialogues of this many rounds. */
enum { KVB_CAL_SAMPLES = 4, KVB_CAL_ROUNDS = 12 };

/* ---- pure math ---- */

/* KL(p || q) in nats of two distributions over n entries, each smoothed as (x_i + eps) / (sum x + n eps)
 * so empty entries stay finite (eps >= 0; eps = 0 needs q_i > 0 wherever p_i > 0). */
double kvb_cal_kl(const float *p, const float *q, int64_t n, double eps);
/* Jensen-Shannon divergence with log base 2, in [0, 1]: (KL(p||m) + KL(q||m)) / 2, m = (p + q) / 2. */
double kvb_cal_js(const float *p, const float *q, int64_t n);
/* Shannon entropy of p in bits (0 log 0 = 0). */
double kvb_cal_entropy2(const float *p, int64_t n);
/* JS as H(m) - (H(p) + H(q)) / 2 with the entropies given (one logarithm per entry: the PoD matrix). */
double kvb_cal_js_h(const float *p, const float *q, int64_t n, double hp, double hq);

/* Round curve: P is [L][R] (row l = P_q^l over R past rounds); curve[l] = mean over l' in (l, L) of
 * KL(P^l || P^l') with smoothing eps; curve[L-1] = 0 (no later layer). */
void kvb_cal_round_curve(const float *P, int L, int R, double eps, double *curve);
/* Watershed rule over curve[0..n): M = the curve's maximum; the watershed is the first layer l such that
 * curve[l'] < frac * M for every l' in [l, n) (the divergence has dropped and stays low). Returns l
 * (0 when M <= 0; n - 1 when only the last value qualifies). */
int kvb_cal_watershed(const double *curve, int n, double frac);

/* Filter ability: probs is [L][H][n] (each layer's attention of one query over n tokens, per head). T_l =
 * the k tokens of layer l with the largest max-over-heads probability (ties: lower index); ability[l] = mean
 * over the later layers l' in (l, min(L, l + 1 + span)) (span <= 0: all later layers) of the mean over heads
 * of the mass layer l' puts on T_l. ability[L-1] = 0. -1 on out of memory. */
int kvb_cal_filter_ability(const float *probs, int L, int H, int64_t n, int64_t k, int span, double *ability);
/* Filter layers: greedily by descending ability (ties: lower layer), among layers 1..L-3 (a filter layer
 * must serve at least one sparse layer after the full layer that follows it), each at least 2 layers away
 * from those already taken (no two adjacent); out[] ascending. Returns how many were chosen (<= n_filter). */
int kvb_cal_pick_filters(const double *ability, int L, int n_filter, int *out);

/* PoD: add into js_sum[g][a][b] (g < HK, a, b < L; symmetric, diagonal 0) the sum over the group's query
 * heads (query head h -> KV head h / (H / HK)) and the q query rows of JS(S^a, S^b). S is [L][H][q][n]: the
 * attention rows of the last q of n tokens, row t seeing the first n - q + t + 1 tokens. -1 on OOM. */
int kvb_cal_pod_js(const float *S, int L, int H, int HK, int q, int64_t n, double *js_sum);
/* Algorithm 1 on one head's similarity matrix sim[a * L + b]: blocks of consecutive layers, bottom-up; layer l
 * joins the current block when sim(l, l^) >= delta for every l^ in it, else it starts a new one. base[l] =
 * the block's lowest layer. Returns the number of blocks. */
int kvb_cal_group(const double *sim, int L, double delta, int *base);

/* Q-Filters: add the queries q ([n_q][n_head][d], host) into S ([n_head_kv][d][d], += q q^T) and sum
 * ([n_head_kv][d], += q), query head h -> KV head h / (n_head / n_head_kv), in double. */
void kvb_cal_qfilter_add(const float *q, int64_t n_q, int n_head, int n_head_kv, int d, double *S, double *sum);
/* The eigenvector of the largest eigenvalue of the symmetric d x d matrix A (row-major), unit length, by cyclic
 * Jacobi rotations (converged to double precision); ties between eigenvalues: the lower column of the
 * rotated basis. The eigenvalue into *lambda (may be NULL). -1 on out of memory. */
int kvb_cal_top_eigvec(const double *A, int d, double *v, double *lambda);
/* Q-Filters' directions of n_head_kv heads: f[g] = the top eigenvector of S[g], negated when sum[g] . f[g] < 0
 * (the paper's sign: the mean query projects positively); a head that saw no query (S = 0) gets f = 0.
 * f: [n_head_kv][d]. -1 on out of memory. */
int kvb_cal_qfilter_dirs(const double *S, const double *sum, int n_head_kv, int d, float *f);
/* DuoAttention's retrieval score: add into mass[l][g] (L x HK) the mean over KV head g's query heads and the q
 * rows of rows ([L][H][q][n], as kvb_cal_pod_js reads them) of the attention on tokens [from, to). */
void kvb_cal_duo_mass(const float *rows, int L, int H, int HK, int q, int64_t n, int64_t from, int64_t to,
                      double *mass);

/* ---- engine runs (one input each; the context is reset first and its hooks replaced) ---- */

/* Round analysis of one dialogue: rounds [round_end[r-1], round_end[r]) of ids, the last is the question
 * (n_rounds >= 3). History rounds are prefilled round by round, the question with probabilities at every
 * layer. P ([L][n_rounds - 1]) receives P_q^l (uniform on a sliding-window layer, which runs no hook). */
int kvb_cal_round_run(kvb_ctx *c, const kvb_rounds *in, float *P, char *err, size_t err_len);
/* OmniKV analysis: prefill ids[0..n-1), forward the last token capturing every layer's probabilities, and write
 * kvb_cal_filter_ability with k = max(1, round(topk_frac * n)) into ability[L]. On a hybrid model over its global
 * layers only, in order (ability[i] is the i-th global layer's; a sliding-window layer sees only its window). */
int kvb_cal_omnikv_run(kvb_ctx *c, const int32_t *ids, int64_t n, double topk_frac, int span, double *ability,
                       char *err, size_t err_len);
/* PoD analysis: prefill ids[0..n-q), forward the last q tokens as one chunk capturing every layer's rows, and
 * add kvb_cal_pod_js into js_sum ([HK][G][G]) over the G global layers in order (every layer without sliding-window
 * layers; a local layer sees only its window and belongs to no block). q <= n - 1 and q <= the context's batch size. */
int kvb_cal_pod_run(kvb_ctx *c, const int32_t *ids, int64_t n, int q, double *js_sum, char *err, size_t err_len);

/* Q-Filters analysis: prefill ids[0..n) capturing every layer's post-RoPE queries (copied down per chunk) into
 * S ([L][HK][d][d]) and sum ([L][HK][d]) by kvb_cal_qfilter_add. */
int kvb_cal_qfilter_run(kvb_ctx *c, const int32_t *ids, int64_t n, double *S, double *sum, char *err, size_t err_len);
/* DuoAttention analysis: prefill ids[0..n-q), forward the last q tokens (the question) capturing every layer's
 * rows, and add kvb_cal_duo_mass over the passkey's tokens [from, to) into mass ([L][HK]). */
int kvb_cal_duo_run(kvb_ctx *c, const int32_t *ids, int64_t n, int q, int64_t from, int64_t to, double *mass,
                    char *err, size_t err_len);

#endif
