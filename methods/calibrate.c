/* calibrate.c — the calibration analyses of Round Attention, OmniKV, PoD, Q-Filters and DuoAttention (see calibrate.h): pure math over
 * float arrays, and one engine run per input that records the attention the analysis needs through the
 * kvb_hooks wants_probs/observe pair (full attention: no method is installed, nothing is selected). */
#include "methods/calibrate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "methods/method.h"

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

/* ---- pure math ---- */

double kvb_cal_kl(const float *p, const float *q, int64_t n, double eps) {
    double sp = 0, sq = 0;
    for (int64_t i = 0; i < n; i++) {
        sp += p[i];
        sq += q[i];
    }
    sp += (double)n * eps;
    sq += (double)n * eps;
    if (sp <= 0 || sq <= 0) return 0;
    double kl = 0;
    for (int64_t i = 0; i < n; i++) {
        double a = (p[i] + eps) / sp, b = (q[i] + eps) / sq;
        if (a > 0) kl += a * log(a / b);
    }
    return kl;
}

double kvb_cal_js(const float *p, const float *q, int64_t n) {
    double js = 0;
    for (int64_t i = 0; i < n; i++) {
        double a = p[i], b = q[i], m = a + b;
        if (a > 0) js += 0.5 * a * log2(2.0 * a / m);
        if (b > 0) js += 0.5 * b * log2(2.0 * b / m);
    }
    return js < 0 ? 0 : js > 1 ? 1 : js;
}

double kvb_cal_entropy2(const float *p, int64_t n) {
    double h = 0;
    for (int64_t i = 0; i < n; i++)
        if (p[i] > 0) h -= p[i] * log2((double)p[i]);
    return h;
}

double kvb_cal_js_h(const float *p, const float *q, int64_t n, double hp, double hq) {
    double hm = 0;
    for (int64_t i = 0; i < n; i++) {
        double m = 0.5 * ((double)p[i] + (double)q[i]);
        if (m > 0) hm -= m * log2(m);
    }
    double js = hm - 0.5 * (hp + hq);
    return js < 0 ? 0 : js > 1 ? 1 : js;
}

void kvb_cal_round_curve(const float *P, int L, int R, double eps, double *curve) {
    for (int l = 0; l < L; l++) {
        double s = 0;
        for (int m = l + 1; m < L; m++) s += kvb_cal_kl(P + (int64_t)l * R, P + (int64_t)m * R, R, eps);
        curve[l] = l + 1 < L ? s / (L - 1 - l) : 0.0;
    }
}

int kvb_cal_watershed(const double *curve, int n, double frac) {
    double mx = 0;
    for (int l = 0; l < n; l++)
        if (curve[l] > mx) mx = curve[l];
    if (mx <= 0) return 0;
    int w = n - 1;
    /* walk back from the end while the curve stays below the cut */
    while (w > 0 && curve[w - 1] < frac * mx) w--;
    return w;
}

int kvb_cal_filter_ability(const float *probs, int L, int H, int64_t n, int64_t k, int span, double *ability) {
    float *score = malloc((size_t)(n > 0 ? n : 1) * sizeof *score);
    int32_t *top = malloc((size_t)(k > 0 ? k : 1) * sizeof *top);
    if (!score || !top || k < 1 || k > n) {
        free(score);
        free(top);
        return -1;
    }
    for (int l = 0; l < L; l++) {
        const float *pl = probs + (int64_t)l * H * n;
        for (int64_t j = 0; j < n; j++) {
            float m = 0;
            for (int h = 0; h < H; h++) m = pl[(int64_t)h * n + j] > m ? pl[(int64_t)h * n + j] : m;
            score[j] = m;
        }
        if (kvb_topk_ascending(score, n, k, top)) {
            free(score);
            free(top);
            return -1;
        }
        int end = span > 0 && l + 1 + span < L ? l + 1 + span : L;
        double sum = 0;
        for (int m = l + 1; m < end; m++) {
            const float *pm = probs + (int64_t)m * H * n;
            double mass = 0;
            for (int h = 0; h < H; h++)
                for (int64_t i = 0; i < k; i++) mass += pm[(int64_t)h * n + top[i]];
            sum += mass / H;
        }
        ability[l] = end > l + 1 ? sum / (end - l - 1) : 0.0;
    }
    free(score);
    free(top);
    return 0;
}

static int far_from(const int *taken, int n, int l) {
    for (int i = 0; i < n; i++)
        if (abs(taken[i] - l) < 2) return 0;
    return 1;
}

int kvb_cal_pick_filters(const double *ability, int L, int n_filter, int *out) {
    int n = 0;
    while (n < n_filter) {
        int best = -1;
        for (int l = 1; l <= L - 3; l++)
            if (far_from(out, n, l) && (best < 0 || ability[l] > ability[best])) best = l;
        if (best < 0) break;
        out[n++] = best;
    }
    for (int i = 1; i < n; i++) /* insertion sort: ascending */
        for (int j = i; j > 0 && out[j - 1] > out[j]; j--) {
            int t = out[j];
            out[j] = out[j - 1];
            out[j - 1] = t;
        }
    return n;
}

int kvb_cal_pod_js(const float *S, int L, int H, int HK, int q, int64_t n, double *js_sum) {
    const int G = H / HK;
    double *ent = malloc((size_t)L * H * q * sizeof *ent);
    if (!ent) return -1;
    for (int l = 0; l < L; l++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < q; t++) {
                int64_t row = ((int64_t)l * H + h) * q + t;
                ent[row] = kvb_cal_entropy2(S + row * n, n - q + t + 1);
            }
    for (int g = 0; g < HK; g++)
        for (int a = 0; a < L; a++)
            for (int b = a + 1; b < L; b++) {
                double s = 0;
                for (int h = g * G; h < (g + 1) * G; h++)
                    for (int t = 0; t < q; t++) {
                        int64_t ra = ((int64_t)a * H + h) * q + t, rb = ((int64_t)b * H + h) * q + t;
                        s += kvb_cal_js_h(S + ra * n, S + rb * n, n - q + t + 1, ent[ra], ent[rb]);
                    }
                js_sum[((int64_t)g * L + a) * L + b] += s;
                js_sum[((int64_t)g * L + b) * L + a] += s;
            }
    free(ent);
    return 0;
}

int kvb_cal_group(const double *sim, int L, double delta, int *base) {
    int n_blocks = L > 0;
    if (L > 0) base[0] = 0;
    for (int l = 1; l < L; l++) {
        int b = base[l - 1], similar = 1;
        for (int m = b; m < l && similar; m++) similar = sim[(int64_t)l * L + m] >= delta;
        base[l] = similar ? b : l;
        n_blocks += !similar;
    }
    return n_blocks;
}

void kvb_cal_qfilter_add(const float *q, int64_t n_q, int n_head, int n_head_kv, int d, double *S, double *sum) {
    const int G = n_head / n_head_kv;
    for (int64_t t = 0; t < n_q; t++)
        for (int h = 0; h < n_head; h++) {
            const float *x = q + ((size_t)t * n_head + h) * d;
            double *s = S + (size_t)(h / G) * d * d, *m = sum + (size_t)(h / G) * d;
            for (int a = 0; a < d; a++) {
                m[a] += x[a];
                for (int b = 0; b < d; b++) s[(size_t)a * d + b] += (double)x[a] * x[b];
            }
        }
}

int kvb_cal_top_eigvec(const double *A, int d, double *v, double *lambda) {
    double *a = malloc((size_t)d * d * sizeof *a), *e = malloc((size_t)d * d * sizeof *e);
    if (!a || !e) {
        free(a);
        free(e);
        return -1;
    }
    memcpy(a, A, (size_t)d * d * sizeof *a);
    for (int i = 0; i < d * d; i++) e[i] = i % (d + 1) == 0; /* identity: the columns are the eigenvectors */
    for (int sweep = 0; sweep < 100; sweep++) {
        double off = 0, total = 0;
        for (int i = 0; i < d; i++)
            for (int j = 0; j < d; j++) {
                total += a[i * d + j] * a[i * d + j];
                if (i != j) off += a[i * d + j] * a[i * d + j];
            }
        if (off <= 1e-30 * total || total == 0) break;
        for (int p = 0; p < d; p++)
            for (int r = p + 1; r < d; r++) {
                double apr = a[p * d + r];
                if (apr == 0) continue;
                /* the rotation that zeroes a[p][r] (Golub & Van Loan, Algorithm 8.4.1) */
                double theta = (a[r * d + r] - a[p * d + p]) / (2 * apr);
                double t = (theta >= 0 ? 1.0 : -1.0) / (fabs(theta) + sqrt(theta * theta + 1));
                double cs = 1 / sqrt(t * t + 1), sn = t * cs;
                for (int k = 0; k < d; k++) { /* columns p and r */
                    double x = a[k * d + p], y = a[k * d + r];
                    a[k * d + p] = cs * x - sn * y;
                    a[k * d + r] = sn * x + cs * y;
                }
                for (int k = 0; k < d; k++) { /* rows p and r */
                    double x = a[p * d + k], y = a[r * d + k];
                    a[p * d + k] = cs * x - sn * y;
                    a[r * d + k] = sn * x + cs * y;
                }
                for (int k = 0; k < d; k++) {
                    double x = e[k * d + p], y = e[k * d + r];
                    e[k * d + p] = cs * x - sn * y;
                    e[k * d + r] = sn * x + cs * y;
                }
            }
    }
    int best = 0;
    for (int i = 1; i < d; i++)
        if (a[i * d + i] > a[best * d + best]) best = i;
    double norm = 0;
    for (int k = 0; k < d; k++) norm += e[k * d + best] * e[k * d + best];
    norm = sqrt(norm);
    for (int k = 0; k < d; k++) v[k] = norm > 0 ? e[k * d + best] / norm : 0;
    if (lambda) *lambda = a[best * d + best];
    free(a);
    free(e);
    return 0;
}

int kvb_cal_qfilter_dirs(const double *S, const double *sum, int n_head_kv, int d, float *f) {
    double *v = malloc((size_t)d * sizeof *v);
    if (!v) return -1;
    for (int g = 0; g < n_head_kv; g++) {
        const double *s = S + (size_t)g * d * d, *m = sum + (size_t)g * d;
        int seen = 0;
        for (int i = 0; i < d * d && !seen; i++) seen = s[i] != 0;
        if (!seen) {
            for (int k = 0; k < d; k++) f[(size_t)g * d + k] = 0;
            continue;
        }
        if (kvb_cal_top_eigvec(s, d, v, NULL)) {
            free(v);
            return -1;
        }
        double dot = 0;
        for (int k = 0; k < d; k++) dot += m[k] * v[k];
        for (int k = 0; k < d; k++) f[(size_t)g * d + k] = (float)(dot < 0 ? -v[k] : v[k]);
    }
    free(v);
    return 0;
}

void kvb_cal_duo_mass(const float *rows, int L, int H, int HK, int q, int64_t n, int64_t from, int64_t to,
                      double *mass) {
    const int G = H / HK;
    for (int l = 0; l < L; l++)
        for (int h = 0; h < H; h++) {
            double s = 0;
            for (int t = 0; t < q; t++) {
                const float *p = rows + (((int64_t)l * H + h) * q + t) * n;
                for (int64_t j = from; j < to; j++) s += p[j];
            }
            mass[(int64_t)l * HK + h / G] += s / ((double)G * q);
        }
}

/* ---- engine runs ---- */

typedef enum { CAP_ROUND, CAP_ROWS } cap_kind;

/* What the hooks record: round attention sums, or the raw rows of every layer. */
typedef struct {
    cap_kind kind;
    int on;          /* record the next forward calls */
    int32_t q_round; /* CAP_ROUND: the question's round id; rounds [0, q_round) are the past */
    double *acc;     /* CAP_ROUND: [L][q_round] */
    float *rows;     /* CAP_ROWS: [L][H][q][n] */
    int q;
    int64_t n;
    int *rows_done;  /* CAP_ROWS: rows recorded per layer (a chunked forward calls observe more than once) */
} capture;

static int cap_wants(void *self, kvb_ctx *c, int layer, int64_t n_q) {
    (void)c;
    (void)layer;
    (void)n_q;
    return ((capture *)self)->on;
}

static void observe_round(capture *s, kvb_ctx *c, int layer, const kvb_src *src, const float *probs, int64_t stride,
                          int64_t n_q, int32_t *const *rounds) {
    const kvb_config *cfg = &c->model->cfg;
    const int G = cfg->n_head / cfg->n_head_kv;
    double *acc = s->acc + (int64_t)layer * s->q_round;
    for (int h = 0; h < cfg->n_head; h++) {
        const int32_t *round = rounds[h / G];
        for (int64_t t = 0; t < n_q; t++) {
            const float *p = probs + ((int64_t)h * n_q + t) * stride;
            for (int64_t j = 0; j < src[h / G].n; j++)
                if (round[j] >= 0 && round[j] < s->q_round) acc[round[j]] += p[j];
        }
    }
}

static int observe_rows(capture *s, kvb_ctx *c, int layer, const kvb_src *src, const float *probs, int64_t stride,
                        int64_t n_q, char *err, size_t err_len) {
    const kvb_config *cfg = &c->model->cfg;
    const int G = cfg->n_head / cfg->n_head_kv;
    int t0 = s->rows_done[layer];
    if (t0 + n_q > s->q) return ERR("calibrate: more query rows than expected at layer %d", layer);
    for (int h = 0; h < cfg->n_head; h++)
        for (int64_t t = 0; t < n_q; t++) {
            float *dst = s->rows + (((int64_t)layer * cfg->n_head + h) * s->q + t0 + t) * s->n;
            int64_t m = src[h / G].n < s->n ? src[h / G].n : s->n;
            memcpy(dst, probs + ((int64_t)h * n_q + t) * stride, (size_t)m * sizeof *dst);
            memset(dst + m, 0, (size_t)(s->n - m) * sizeof *dst);
        }
    s->rows_done[layer] += (int)n_q;
    return 0;
}

/* Calibration reads attention on the host: the probabilities (and the slots' round ids) come down in counted
 * copies, so it runs on every backend. */
static int cap_observe(void *self, kvb_ctx *c, int layer, const kvb_src *src, const float *probs, int64_t stride,
                       int64_t n_q, char *err, size_t err_len) {
    capture *s = self;
    kvb_backend *be = c->be;
    const int HK = c->model->cfg.n_head_kv;
    size_t bytes = (size_t)c->model->cfg.n_head * n_q * stride * sizeof(float);
    float *host = malloc(bytes ? bytes : 1);
    int32_t *rounds[KVB_MAX_KV_HEADS] = {0};
    int rc = host ? be->copy(be, host, probs, bytes, KVB_COPY_D2H, err, err_len) : ERR("out of memory");
    for (int g = 0; g < HK && !rc && s->kind == CAP_ROUND; g++) {
        rounds[g] = malloc((size_t)(src[g].n > 0 ? src[g].n : 1) * sizeof(int32_t));
        rc = rounds[g] ? be->copy(be, rounds[g], kvc_head_view(c->kv, layer, g).round, (size_t)src[g].n * sizeof(int32_t),
                                  KVB_COPY_D2H, err, err_len)
                       : ERR("out of memory");
    }
    if (!rc && be->sync && be->sync(be)) rc = ERR("%s", be->error);
    if (!rc && s->kind == CAP_ROUND) observe_round(s, c, layer, src, host, stride, n_q, rounds);
    else if (!rc) rc = observe_rows(s, c, layer, src, host, stride, n_q, err, err_len);
    for (int g = 0; g < HK; g++) free(rounds[g]);
    free(host);
    return rc;
}

/* Reset the context and install the capture hooks (hooks must outlive the run: the caller's storage). */
static int begin(kvb_ctx *c, kvb_hooks *h, capture *s, char *err, size_t err_len) {
    memset(h, 0, sizeof *h);
    h->self = s;
    h->wants_probs = cap_wants;
    h->observe = cap_observe;
    kvb_ctx_reset(c);
    return kvb_ctx_set_hooks(c, h, err, err_len);
}

static void end(kvb_ctx *c) {
    char e[64];
    kvb_ctx_set_hooks(c, NULL, e, sizeof e);
    kvb_ctx_reset(c);
}

int kvb_cal_round_run(kvb_ctx *c, const kvb_rounds *in, float *P, char *err, size_t err_len) {
    const int L = c->model->cfg.n_layer, R = in->n_rounds - 1;
    if (in->n_rounds < 3) return ERR("calibrate round: an input needs at least 2 history rounds and a question");
    for (int r = 0; r <= R; r++)
        if (in->round_end[r] <= (r ? in->round_end[r - 1] : 0)) return ERR("calibrate round: round %d of an input is empty", r);
    capture s = {.kind = CAP_ROUND, .q_round = R};
    s.acc = calloc((size_t)L * R, sizeof *s.acc);
    if (!s.acc) return ERR("out of memory");
    kvb_hooks h;
    /* the history rounds, then the question's with its attention captured */
    int rc = begin(c, &h, &s, err, err_len) || kvb_prefill_rounds(c, in, 0, in->round_end[R - 1], NULL, err, err_len);
    s.on = 1;
    rc = rc || kvb_prefill_rounds(c, in, R, in->n, NULL, err, err_len);
    for (int l = 0; l < L && !rc; l++) {
        double tot = 0;
        for (int k = 0; k < R; k++) tot += s.acc[(int64_t)l * R + k];
        for (int k = 0; k < R; k++) P[(int64_t)l * R + k] = tot > 0 ? (float)(s.acc[(int64_t)l * R + k] / tot) : 1.0f / R;
    }
    end(c);
    free(s.acc);
    return rc ? -1 : 0;
}

/* Prefill ids[0..n-q) and forward the last q tokens recording every layer's rows into s->rows. */
static int run_rows(kvb_ctx *c, const int32_t *ids, int64_t n, int q, capture *s, char *err, size_t err_len) {
    const kvb_config *cfg = &c->model->cfg;
    if (q < 1 || n - q < 1) return ERR("calibrate: an input of %lld tokens is too short", (long long)n);
    s->kind = CAP_ROWS;
    s->q = q;
    s->n = n;
    s->rows = calloc((size_t)cfg->n_layer * cfg->n_head * q * n, sizeof(float)); /* a local layer's stay 0 */
    s->rows_done = calloc((size_t)cfg->n_layer, sizeof *s->rows_done);
    if (!s->rows || !s->rows_done) return ERR("out of memory for %d layers x %d heads x %d rows x %lld tokens", cfg->n_layer, cfg->n_head, q, (long long)n);
    kvb_hooks h;
    int rc = begin(c, &h, s, err, err_len) || kvb_forward(c, ids, n - q, err, err_len);
    s->on = 1;
    rc = rc || kvb_forward(c, ids + n - q, q, err, err_len);
    for (int l = 0; l < cfg->n_layer && !rc; l++) /* a sliding-window layer runs no hook: it gives none */
        if (s->rows_done[l] != (kvb_layer_window(cfg, l) ? 0 : q))
            rc = ERR("calibrate: layer %d gave %d rows, not %d", l, s->rows_done[l], q);
    end(c);
    return rc ? -1 : 0;
}

int kvb_cal_omnikv_run(kvb_ctx *c, const int32_t *ids, int64_t n, double topk_frac, int span, double *ability,
                       char *err, size_t err_len) {
    const kvb_config *cfg = &c->model->cfg;
    capture s = {0};
    int rc = run_rows(c, ids, n, 1, &s, err, err_len);
    int64_t k = llround(topk_frac * (double)n);
    if (k < 1) k = 1;
    if (k > n) k = n;
    /* the global layers' rows, in order (filter layers are global: a local layer's attention sees its window only) */
    int G = 0;
    const size_t layer_floats = (size_t)cfg->n_head * (size_t)n;
    for (int l = 0; l < cfg->n_layer && !rc; l++)
        if (!kvb_layer_window(cfg, l))
            memmove(s.rows + G++ * layer_floats, s.rows + l * layer_floats, layer_floats * sizeof(float));
    if (!rc && kvb_cal_filter_ability(s.rows, G, cfg->n_head, n, k, span, ability)) rc = ERR("out of memory");
    free(s.rows);
    free(s.rows_done);
    return rc;
}

int kvb_cal_pod_run(kvb_ctx *c, const int32_t *ids, int64_t n, int q, double *js_sum, char *err, size_t err_len) {
    const kvb_config *cfg = &c->model->cfg;
    capture s = {0};
    int rc = run_rows(c, ids, n, q, &s, err, err_len);
    /* the global layers' rows, in order: PoD's blocks are over them (a local layer keeps its window, methods/pod.c) */
    int G = 0;
    const size_t layer_floats = (size_t)cfg->n_head * (size_t)q * (size_t)n;
    for (int l = 0; l < cfg->n_layer && !rc; l++)
        if (!kvb_layer_window(cfg, l))
            memmove(s.rows + G++ * layer_floats, s.rows + l * layer_floats, layer_floats * sizeof(float));
    if (!rc && kvb_cal_pod_js(s.rows, G, cfg->n_head, cfg->n_head_kv, q, n, js_sum)) rc = ERR("out of memory");
    free(s.rows);
    free(s.rows_done);
    return rc;
}

int kvb_cal_duo_run(kvb_ctx *c, const int32_t *ids, int64_t n, int q, int64_t from, int64_t to, double *mass,
                    char *err, size_t err_len) {
    const kvb_config *cfg = &c->model->cfg;
    if (from < 0 || to <= from || to > n - q) return ERR("calibrate duo: the passkey [%lld, %lld) is not before the question", (long long)from, (long long)to);
    capture s = {0};
    int rc = run_rows(c, ids, n, q, &s, err, err_len);
    if (!rc) kvb_cal_duo_mass(s.rows, cfg->n_layer, cfg->n_head, cfg->n_head_kv, q, n, from, to, mass);
    free(s.rows);
    free(s.rows_done);
    return rc;
}

/* ---- Q-Filters: the queries of every layer, from the pre_attend hook ---- */

typedef struct {
    double *S, *sum; /* [L][HK][d][d], [L][HK][d] */
    float *host;     /* one chunk's queries */
    size_t host_bytes;
} qcap;

static int qcap_pre_attend(void *self, kvb_ctx *c, int layer, const float *q, int64_t n_q, char *err, size_t err_len) {
    qcap *s = self;
    kvb_backend *be = c->be;
    const kvb_config *cfg = &c->model->cfg;
    const int d = cfg->head_dim, HK = cfg->n_head_kv;
    size_t bytes = (size_t)n_q * cfg->n_head * d * sizeof(float);
    if (bytes > s->host_bytes) {
        free(s->host);
        s->host = malloc(bytes);
        s->host_bytes = s->host ? bytes : 0;
        if (!s->host) return ERR("out of memory");
    }
    if (be->copy(be, s->host, q, bytes, KVB_COPY_D2H, err, err_len)) return -1;
    if (be->sync && be->sync(be)) return ERR("%s", be->error);
    kvb_cal_qfilter_add(s->host, n_q, cfg->n_head, HK, d, s->S + (size_t)layer * HK * d * d, s->sum + (size_t)layer * HK * d);
    return 0;
}

int kvb_cal_qfilter_run(kvb_ctx *c, const int32_t *ids, int64_t n, double *S, double *sum, char *err, size_t err_len) {
    qcap s = {.S = S, .sum = sum};
    kvb_hooks h = {0};
    h.self = &s;
    h.pre_attend = qcap_pre_attend;
    kvb_ctx_reset(c);
    int rc = kvb_ctx_set_hooks(c, &h, err, err_len) || kvb_forward(c, ids, n, err, err_len);
    end(c);
    free(s.host);
    return rc ? -1 : 0;
}
