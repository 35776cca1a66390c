/* kvzap.c — KVzap (Jegou et al. 2026, "KVzap", arXiv 2601.07891; kvpress's KVzapPress and DMSPress): a small
 * trained surrogate of KVzip's scores. Each layer has its own scorer, a linear map or a 2-layer MLP (Linear, exact
 * GELU, Linear) from the attention's input (the hidden state after the layer's input norm, kvbench's attn_norm
 * output) to one score per KV head and token. The scores are recorded while the prompt is prefilled; at the end of
 * prefill each layer keeps, per KV head:
 * - with a budget B (kvpress's KVzapPress alone, "kvzap_mlp_head"): the B tokens of highest score;
 *   ada=1 (AdaKVPress(KVzapPress), "kvzap_mlp_layer"): AdaKV's allocation of the layer's n_head_kv x B tokens among
 *   its heads (kvb_adakv_retain, alpha = 0.2 of B protected per head);
 * - with threshold=T and no budget (DMSPress(KVzapPress), the leaderboard's "kvzap_mlp" and "kvzap_linear" rows):
 *   every token whose score is not below T, and the last `window` (128) tokens whatever their score. What is kept
 *   depends on the prompt: the records report it measured, and no budget is imposed.
 *
 * Choices (flags):
 * - scorer=DIR: a KVzap checkpoint as Hugging Face holds it (nvidia/KVzap-mlp-Qwen3-8B and the like:
 *   KVzapModel.save_pretrained's model.safetensors, F32/F16/BF16), read whole; its module count, input width and
 *   output width must be the model's layers, n_embd and KV heads, and it must hold no tensor the scorer does not
 *   use. The scorers are trained per model: one made for another model of the same shape is accepted and wrong.
 *   A scorer's weights are read once per process and kept (a GPU backend keeps their device copy by address).
 *   scorer=random: a seeded random linear scorer (weights uniform with variance 1/n_embd, no bias), for tests and
 *   smoke runs of the machinery on any model; it says nothing of KVzap's accuracy.
 * - The first linear layer runs as a backend matmul on the attention's input (f32 weights; a GPU converts them to
 *   f16 as it does the model's), its rows come down to the host (one counted copy per layer and prefill chunk) and
 *   the bias, GELU and second layer run there in double, one thread (no backend op has GELU's exact erf form: the
 *   geglu op is the tanh form): with NVIDIA's 512-wide MLP about 512 erf calls a token and layer, which on a GPU box
 *   is a visible part of kvzap's TTFT (a device op for it is the next step). Scores are kept on the host,
 *   n_layer x n x n_head_kv floats.
 * - Prefill only, as the leaderboard runs DMSPress (decoding=False): decode appends without evicting.
 * - Ties: topk_idx's (the earlier token); DMS's test is `score < T` evicts, as DMSPress's torch.where.
 * - A shared prefill records the scores for the kvzap cells that adopt it (kvb_method_needs.scorer, share.c), one
 *   scorer per shared prefill; the scorer's time is charged to those cells only (shared_prefill.h). */
#include "methods/kvzap.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/fsutil.h"
#include "methods/method.h"
#include "methods/safetensors.h"
#include "methods/snapkv.h" /* kvb_adakv_retain */

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)
enum { SLICE = 2048 }; /* rows per matmul of the first layer */

/* A scorer's weights, loaded once per process and spec and kept (as the model's are): the GPU backends cache a
 * weight's device copy by its host address, so one copy serves every cell and method instance that reads it. */
typedef struct zw {
    char *spec, *key; /* key: "random", or the file's real path, size and modification time */
    int n_layer, in, hid, out; /* hid 0: linear */
    float *w1, *b1, *w2, *b2;  /* [l][r1][in], [l][r1], [l][out][hid], [l][out]; r1 = hid or out */
    kvb_weight *wt;            /* [l]: w1 as a matmul weight */
    struct zw *next;
} zw;

static zw *loaded; /* the weights read so far, under loaded_mu */
static pthread_mutex_t loaded_mu = PTHREAD_MUTEX_INITIALIZER;

struct kvb_kvzap {
    const zw *w;
    float **rows;     /* [l][pos][out] */
    int64_t *cap, *n; /* positions allocated, recorded (contiguous from 0) */
    int *gap;         /* [l]: a chunk came after a gap */
};

static int r1_of(const zw *z) { return z->hid ? z->hid : z->out; }

static void zw_free(zw *z) {
    if (!z) return;
    free(z->wt), free(z->w1), free(z->b1), free(z->w2), free(z->b2), free(z->spec), free(z->key);
    free(z);
}

void kvb_kvzap_free(kvb_kvzap *z) {
    if (!z) return;
    for (int l = 0; z->rows && l < z->w->n_layer; l++) free(z->rows[l]);
    free(z->rows), free(z->cap), free(z->n), free(z->gap);
    free(z);
}

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void random_scorer(zw *z) {
    const double a = sqrt(3.0 / z->in); /* uniform(-a, a): variance 1/in */
    uint64_t st = 0x6b767a6170ULL;      /* "kvzap" */
    for (size_t i = 0; i < (size_t)z->n_layer * z->out * z->in; i++)
        z->w1[i] = (float)(a * (2.0 * (double)(splitmix(&st) >> 11) / 9007199254740992.0 - 1.0));
}

/* tensor `name` of f, of exactly the shape {d0, d1} (d1 0: a vector of d0), into out */
static int take(const kvb_st_file *f, const char *name, int64_t d0, int64_t d1, float *out, int *used, char *err,
                size_t err_len) {
    const kvb_st_tensor *t = kvb_st_find(f, name);
    if (!t) return ERR("%s: no tensor %s (a KVzap checkpoint for this model has one per layer)", f->path, name);
    int ok = d1 ? t->n_dims == 2 && t->shape[0] == d0 && t->shape[1] == d1 : t->n_dims == 1 && t->shape[0] == d0;
    if (!ok) {
        char shape[96] = "";
        for (int i = 0, at = 0; i < t->n_dims && at < (int)sizeof shape - 24; i++)
            at += snprintf(shape + at, sizeof shape - (size_t)at, "%s%lld", i ? " x " : "", (long long)t->shape[i]);
        return d1 ? ERR("%s: %s is [%s], the model needs [%lld x %lld]", f->path, name, shape, (long long)d0, (long long)d1)
                  : ERR("%s: %s is [%s], the model needs [%lld]", f->path, name, shape, (long long)d0);
    }
    kvb_st_to_f32(t, out);
    (*used)++;
    return 0;
}

static int load_file(zw *z, const char *path, const kvb_config *cfg, char *err, size_t err_len) {
    kvb_st_file f;
    int rc = kvb_st_open(&f, path, err, err_len), used = 0;
    char name[64];
    if (!rc) { /* the shape from layer 0: an MLP holds layers.0.0.weight, a linear scorer layers.0.weight */
        const kvb_st_tensor *h = kvb_st_find(&f, "layers.0.0.weight");
        if (h && h->n_dims == 2 && h->shape[0] > 0 && h->shape[0] <= 65536 && h->shape[1] == z->in)
            z->hid = (int)h->shape[0]; /* checked before anything is sized by it */
        else if (!h && !kvb_st_find(&f, "layers.0.weight"))
            rc = ERR("%s: no layers.0.weight or layers.0.0.weight: not a KVzap checkpoint", path);
        else if (h) rc = ERR("%s: layers.0.0.weight is not a [hidden x %d] matrix (hidden at most 65536)", path, z->in);
    }
    const int r1 = r1_of(z);
    if (!rc) {
        z->w1 = malloc((size_t)z->n_layer * r1 * z->in * sizeof(float));
        z->b1 = malloc((size_t)z->n_layer * r1 * sizeof(float));
        if (z->hid) {
            z->w2 = malloc((size_t)z->n_layer * z->out * z->hid * sizeof(float));
            z->b2 = malloc((size_t)z->n_layer * z->out * sizeof(float));
        }
        if (!z->w1 || !z->b1 || (z->hid && (!z->w2 || !z->b2))) rc = ERR("out of memory");
    }
    for (int l = 0; l < z->n_layer && !rc; l++) {
        float *w1 = z->w1 + (size_t)l * r1 * z->in, *b1 = z->b1 + (size_t)l * r1;
        if (z->hid) {
            snprintf(name, sizeof name, "layers.%d.0.weight", l);
            rc = take(&f, name, z->hid, z->in, w1, &used, err, err_len);
            snprintf(name, sizeof name, "layers.%d.0.bias", l);
            rc = rc || take(&f, name, z->hid, 0, b1, &used, err, err_len);
            snprintf(name, sizeof name, "layers.%d.2.weight", l);
            rc = rc || take(&f, name, z->out, z->hid, z->w2 + (size_t)l * z->out * z->hid, &used, err, err_len);
            snprintf(name, sizeof name, "layers.%d.2.bias", l);
            rc = rc || take(&f, name, z->out, 0, z->b2 + (size_t)l * z->out, &used, err, err_len);
        } else {
            snprintf(name, sizeof name, "layers.%d.weight", l);
            rc = take(&f, name, z->out, z->in, w1, &used, err, err_len);
            snprintf(name, sizeof name, "layers.%d.bias", l);
            rc = rc || take(&f, name, z->out, 0, b1, &used, err, err_len);
        }
    }
    if (!rc && used != f.n) /* a tensor the scorer would ignore: a deeper MLP, another model's extra layers */
        for (int i = 0; i < f.n && !rc; i++) {
            const char *nm = f.t[i].name;
            char *after = NULL;
            const long l = strncmp(nm, "layers.", 7) ? -1 : strtol(nm + 7, &after, 10);
            const int end = after && *after == '.' ? (int)(after - nm) + 1 : 0;
            if (!end || l < 0 || l >= z->n_layer ||
                (z->hid ? strcmp(nm + end, "0.weight") && strcmp(nm + end, "0.bias") && strcmp(nm + end, "2.weight") &&
                              strcmp(nm + end, "2.bias")
                        : strcmp(nm + end, "weight") && strcmp(nm + end, "bias")))
                rc = ERR("%s: tensor %s is not part of a %d-layer KVzap %s scorer (the model has %d layers)", path, nm,
                         z->n_layer, z->hid ? "MLP" : "linear", cfg->n_layer);
        }
    kvb_st_close(&f);
    return rc;
}

/* The file spec names (its model.safetensors for a directory) and its cache key: its real path, size and
 * modification time, so two spellings of one file share its weights and a file replaced in place is read again.
 * NULL + err when it cannot be found. */
static char *file_key(const char *spec, char **path, char *err, size_t err_len) {
    struct stat st;
    *path = stat(spec, &st) == 0 && S_ISDIR(st.st_mode) ? kvb_path_join(spec, "model.safetensors") : strdup(spec);
    if (!*path) return ERR("out of memory"), NULL;
    char *real = realpath(*path, NULL);
    if (!real || stat(real, &st) != 0) {
        free(real);
        ERR("%s: cannot open: %s", *path, strerror(errno));
        return NULL;
    }
    char *key = malloc(strlen(real) + 64);
    if (key) sprintf(key, "%s|%lld|%lld.%09ld", real, (long long)st.st_size, (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
    else ERR("out of memory");
    free(real);
    return key;
}

/* the weights of spec on a model of cfg: those loaded before, or read now and kept */
static const zw *weights(const char *spec, const kvb_config *cfg, char *err, size_t err_len) {
    char *path = NULL, *key = strcmp(spec, "random") ? file_key(spec, &path, err, err_len) : strdup("random");
    if (!key) {
        free(path);
        return NULL;
    }
    for (const zw *z = loaded; z; z = z->next)
        if (!strcmp(z->key, key) && z->n_layer == cfg->n_layer && z->in == cfg->n_embd && z->out == cfg->n_head_kv) {
            free(key), free(path);
            return z;
        }
    zw *z = calloc(1, sizeof *z);
    if (!z || !(z->spec = strdup(spec))) {
        free(z), free(key), free(path);
        ERR("out of memory");
        return NULL;
    }
    z->key = key;
    z->n_layer = cfg->n_layer, z->in = cfg->n_embd, z->out = cfg->n_head_kv;
    int rc = 0;
    if (!path) {
        z->w1 = malloc((size_t)z->n_layer * z->out * z->in * sizeof(float));
        z->b1 = calloc((size_t)z->n_layer * z->out, sizeof(float));
        if (!z->w1 || !z->b1) rc = ERR("out of memory");
        else random_scorer(z);
    } else
        rc = load_file(z, path, cfg, err, err_len);
    free(path);
    const int r1 = r1_of(z);
    if (!rc && !(z->wt = calloc((size_t)z->n_layer, sizeof *z->wt))) rc = ERR("out of memory");
    for (int l = 0; l < z->n_layer && !rc; l++)
        z->wt[l] = (kvb_weight){z->w1 + (size_t)l * r1 * z->in, GGML_T_F32, r1, z->in};
    if (rc) {
        zw_free(z);
        return NULL;
    }
    z->next = loaded;
    loaded = z;
    return z;
}

kvb_kvzap *kvb_kvzap_open(const char *spec, const kvb_config *cfg, char *err, size_t err_len) {
    pthread_mutex_lock(&loaded_mu);
    const zw *w = weights(spec, cfg, err, err_len);
    pthread_mutex_unlock(&loaded_mu);
    if (!w) return NULL;
    kvb_kvzap *z = calloc(1, sizeof *z);
    if (z) {
        z->w = w;
        z->rows = calloc((size_t)w->n_layer, sizeof *z->rows);
        z->cap = calloc((size_t)w->n_layer, sizeof *z->cap);
        z->n = calloc((size_t)w->n_layer, sizeof *z->n);
        z->gap = calloc((size_t)w->n_layer, sizeof *z->gap);
    }
    if (!z || !z->rows || !z->cap || !z->n || !z->gap) {
        kvb_kvzap_free(z);
        ERR("out of memory");
        return NULL;
    }
    return z;
}

static double gelu(double x) { return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); } /* torch.nn.GELU(): exact */

/* room for positions [0, upto) of layer l */
static int fit(kvb_kvzap *z, int l, int64_t upto) {
    if (upto <= z->cap[l]) return 0;
    int64_t cap = z->cap[l] ? z->cap[l] : 1024;
    while (cap < upto) cap *= 2;
    float *p = realloc(z->rows[l], (size_t)cap * z->w->out * sizeof(float));
    if (!p) return -1;
    z->rows[l] = p, z->cap[l] = cap;
    return 0;
}

int kvb_kvzap_record(kvb_kvzap *z, kvb_ctx *c, int l, int64_t n_q, char *err, size_t err_len) {
    kvb_backend *be = c->be;
    const zw *w = z->w;
    const int r1 = r1_of(w), D = w->in;
    const int64_t slice = n_q < SLICE ? n_q : SLICE;
    const size_t dev_bytes = (size_t)(slice > 0 ? slice : 1) * r1 * sizeof(float);
    float *dev = kvb_method_alloc(c, dev_bytes), *host = malloc(dev_bytes);
    double *h = malloc((size_t)(w->hid ? w->hid : 1) * sizeof(double));
    int rc = dev && host && h ? 0 : ERR("kvzap: out of memory");
    for (int64_t t0 = 0; t0 < n_q && !rc; t0 += slice) {
        const int64_t m = n_q - t0 < slice ? n_q - t0 : slice;
        if (be->matmul(be, dev, &w->wt[l], c->xn + (size_t)t0 * D, m)) {
            rc = ERR("kvzap: layer %d scorer matmul: %s", l, be->error);
            break;
        }
        if ((rc = be->copy(be, host, dev, (size_t)m * r1 * sizeof(float), KVB_COPY_D2H, err, err_len))) break;
        if (be->sync && be->sync(be)) {
            rc = ERR("%s", be->error);
            break;
        }
        for (int64_t t = 0; t < m && !rc; t++) {
            const int64_t pos = c->pos[t0 + t];
            if (pos < 0 || fit(z, l, pos + 1)) {
                rc = ERR("kvzap: out of memory");
                break;
            }
            if (pos > z->n[l]) z->gap[l] = 1;
            else if (pos == z->n[l]) z->n[l] = pos + 1;
            float *o = z->rows[l] + (size_t)pos * w->out;
            const float *a = host + (size_t)t * r1;
            const float *b1 = w->b1 + (size_t)l * r1;
            if (!w->hid) {
                for (int g = 0; g < w->out; g++) o[g] = (float)((double)a[g] + b1[g]);
                continue;
            }
            for (int j = 0; j < w->hid; j++) h[j] = gelu((double)a[j] + b1[j]);
            for (int g = 0; g < w->out; g++) {
                const float *w2 = w->w2 + ((size_t)l * w->out + g) * w->hid;
                double s = w->b2[(size_t)l * w->out + g];
                for (int j = 0; j < w->hid; j++) s += (double)w2[j] * h[j];
                o[g] = (float)s;
            }
        }
    }
    if (dev) kvb_method_release(c, dev, dev_bytes);
    free(host), free(h);
    return rc ? -1 : 0;
}

const float *kvb_kvzap_scores(const kvb_kvzap *z, int l, int64_t *n) {
    *n = z->gap[l] ? 0 : z->n[l];
    return z->rows[l];
}

int kvb_kvzap_take(kvb_kvzap *dst, const kvb_kvzap *src, char *err, size_t err_len) {
    if (dst->w != src->w)
        return ERR("kvzap: the shared prefill scored with scorer=%s, this cell reads scorer=%s", src->w->spec, dst->w->spec);
    for (int l = 0; l < dst->w->n_layer; l++) {
        if (fit(dst, l, src->n[l])) return ERR("kvzap: out of memory");
        if (src->n[l]) memcpy(dst->rows[l], src->rows[l], (size_t)src->n[l] * src->w->out * sizeof(float));
        dst->n[l] = src->n[l], dst->gap[l] = src->gap[l];
    }
    return 0;
}

const char *kvb_kvzap_spec(const kvb_kvzap *z) { return z->w->spec; }

void kvb_kvzap_kind(const kvb_kvzap *z, char *buf, size_t cap) {
    if (z->w->hid) snprintf(buf, cap, "mlp hidden=%d", z->w->hid);
    else snprintf(buf, cap, "%s", strcmp(z->w->spec, "random") ? "linear" : "random");
}

/* ---- the method ---- */

typedef struct {
    kvb_method base;
    kvb_kvzap *z;
    int dms, ada;
    double threshold, alpha;
    int64_t window, keep;
    int64_t *kept; /* [l]: tokens the layer's heads kept together at the end of prefill */
    int64_t held[2];
    double evicted; /* threshold: the share of the global layers' prompt KV evicted (DMSPress's compression_ratio) */
} kvzap;

static int kvzap_pre_attend(void *self, kvb_ctx *c, int layer, const float *q, int64_t n_q, char *err, size_t err_len) {
    (void)q;
    kvzap *s = self;
    return c->in_prefill ? kvb_kvzap_record(s->z, c, layer, n_q, err, err_len) : 0;
}

/* layer l's heads kept by threshold: each head's idx list built on the host, copied up, retained */
static int keep_dms(kvzap *s, kvb_ctx *c, int l, const float *sc, int64_t n, int32_t *idx_h, int32_t *idx_d,
                    char *err, size_t err_len) {
    const int HK = c->model->cfg.n_head_kv;
    const int64_t w = s->window < n ? s->window : n;
    for (int g = 0; g < HK; g++) {
        int64_t k = 0;
        for (int64_t j = 0; j < n; j++)
            if (j >= n - w || !(sc[(size_t)j * HK + g] < s->threshold)) idx_h[k++] = (int32_t)j;
        if (c->be->copy(c->be, idx_d, idx_h, (size_t)k * sizeof(int32_t), KVB_COPY_H2D, err, err_len) ||
            (c->be->sync && c->be->sync(c->be) && ERR("%s", c->be->error)) ||
            kvc_retain_dev(c->kv, l, g, idx_d, k, err, err_len))
            return -1;
        s->kept[l] += k;
        if (s->held[0] < 0 || k < s->held[0]) s->held[0] = k;
        if (k > s->held[1]) s->held[1] = k;
    }
    return 0;
}

/* layer l's heads kept by budget: the scores copied up per head ([HK][n]), top-k or AdaKV's allocation */
static int keep_budget(kvzap *s, kvb_ctx *c, int l, const float *sc, int64_t n, float *row_h, float *score_d,
                       int32_t *idx_d, int32_t *flat, int32_t *counts_d, char *err, size_t err_len) {
    kvb_backend *be = c->be;
    const int HK = c->model->cfg.n_head_kv;
    for (int g = 0; g < HK; g++) {
        for (int64_t j = 0; j < n; j++) row_h[(size_t)g * n + j] = sc[(size_t)j * HK + g];
    }
    if (be->copy(be, score_d, row_h, (size_t)HK * n * sizeof(float), KVB_COPY_H2D, err, err_len) ||
        (be->sync && be->sync(be) && ERR("%s", be->error)))
        return -1;
    if (s->ada) {
        if (kvb_adakv_retain(c, l, score_d, n, s->keep, s->alpha, idx_d, flat, counts_d, s->held, err, err_len)) return -1;
        s->kept[l] = s->keep * HK;
        return 0;
    }
    for (int g = 0; g < HK; g++)
        if (be->topk_idx(be, idx_d, score_d + (size_t)g * n, n, s->keep, err, err_len) ||
            kvc_retain_dev(c->kv, l, g, idx_d, s->keep, err, err_len))
            return -1;
    s->kept[l] = s->keep * HK;
    return 0;
}

static int kvzap_after_prefill(void *self, kvb_ctx *c, char *err, size_t err_len) {
    kvzap *s = self;
    const kvb_config *cfg = &c->model->cfg;
    const int HK = cfg->n_head_kv;
    const int64_t n = c->n_past;
    s->base.n_prompt = n;
    int from, to, first = -1, last = -1; /* the first and last global layers */
    kvb_prefill_layers(c, &from, &to);
    for (int l = 0; l < cfg->n_layer; l++)
        if (!kvb_layer_window(cfg, l)) last = l, first = first < 0 ? l : first;
    if (from <= first && first < to) s->held[0] = -1, s->held[1] = 0; /* a new prompt (layer-wise: its first layer) */
    for (int l = from; l < to; l++) s->kept[l] = n * HK;
    if (!s->dms) {
        if (kvb_method_budget_tokens(&s->base, n, &s->keep, err, err_len)) return -1;
        if (s->keep >= n) return 0;
    }
    if (n == 0 || from >= to) return 0;
    const size_t nb = (size_t)HK * n;
    int32_t *idx_h = malloc((size_t)n * sizeof(int32_t));
    float *row_h = malloc(nb * sizeof(float));
    float *score_d = kvb_method_alloc(c, nb * sizeof(float));
    int32_t *idx_d = kvb_method_alloc(c, nb * sizeof(int32_t)), *flat = kvb_method_alloc(c, nb * sizeof(int32_t));
    int32_t *counts_d = kvb_method_alloc(c, (size_t)HK * sizeof(int32_t));
    int rc = idx_h && row_h && score_d && idx_d && flat && counts_d ? 0 : ERR("kvzap: out of memory");
    for (int l = from; l < to && !rc; l++) {
        if (kvb_layer_window(cfg, l)) continue; /* a local layer keeps its window */
        int64_t have = 0;
        const float *sc = kvb_kvzap_scores(s->z, l, &have);
        if (have < n) {
            rc = ERR("kvzap: layer %d has scores for %lld of the prompt's %lld tokens (a prefill that did not run the "
                     "scorer)", l, (long long)have, (long long)n);
            break;
        }
        s->kept[l] = 0;
        rc = s->dms ? keep_dms(s, c, l, sc, n, idx_h, idx_d, err, err_len)
                    : keep_budget(s, c, l, sc, n, row_h, score_d, idx_d, flat, counts_d, err, err_len);
    }
    if (!rc && s->dms && from <= last && last < to) { /* every global layer has ended */
        double ev = 0;
        int global = 0;
        for (int l = 0; l < cfg->n_layer; l++)
            if (!kvb_layer_window(cfg, l)) ev += 1.0 - (double)s->kept[l] / ((double)HK * n), global++;
        s->evicted = global ? ev / global : 0;
        snprintf(s->base.note, sizeof s->base.note, "threshold %g: evicted %.1f%% of the prompt's KV in the global "
                 "layers (measured; no budget)", s->threshold, 100.0 * s->evicted);
    }
    free(idx_h), free(row_h);
    kvb_method_release(c, score_d, nb * sizeof(float));
    kvb_method_release(c, idx_d, nb * sizeof(int32_t));
    kvb_method_release(c, flat, nb * sizeof(int32_t));
    kvb_method_release(c, counts_d, (size_t)HK * sizeof(int32_t));
    return rc ? -1 : 0;
}

static int kvzap_adopt(kvb_method *m, kvb_ctx *c, const kvb_share *share, char *err, size_t err_len) {
    (void)c;
    kvzap *s = (kvzap *)m;
    const kvb_kvzap *z = share ? kvb_share_kvzap(share) : NULL;
    if (!z) return ERR("kvzap: the shared prefill did not run a KVzap scorer");
    return kvb_kvzap_take(s->z, z, err, err_len);
}

static int64_t kvzap_expected(kvb_method *m, kvb_ctx *c, int layer) {
    kvzap *s = (kvzap *)m;
    const int HK = c->model->cfg.n_head_kv;
    return kvb_kept_then_decoded(m, c, (s->kept[layer] + HK / 2) / HK);
}

static void kvzap_describe(kvb_method *m, char *buf, size_t cap) {
    kvzap *s = (kvzap *)m;
    char kind[40];
    kvb_kvzap_kind(s->z, kind, sizeof kind);
    if (s->dms)
        snprintf(buf, cap, "scorer=%s threshold=%g window=%lld evicted=%.4f held=%lld-%lld", kind, s->threshold,
                 (long long)s->window, s->evicted, (long long)s->held[0], (long long)s->held[1]);
    else if (s->ada)
        snprintf(buf, cap, "scorer=%s keep=%lld ada=1 alpha=%g held=%lld-%lld", kind, (long long)s->keep, s->alpha,
                 (long long)s->held[0], (long long)s->held[1]);
    else snprintf(buf, cap, "scorer=%s keep=%lld", kind, (long long)s->keep);
}

static void kvzap_destroy(kvb_method *m) {
    kvzap *s = (kvzap *)m;
    kvb_kvzap_free(s->z);
    free(s->kept);
    free(s);
}

static const char *kvzap_scorer(kvb_opts *o) { return kvb_opts_get(o, "scorer"); }

static kvb_method *kvzap_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len) {
    const kvb_config *cfg = &c->model->cfg;
    kvzap *s = calloc(1, sizeof *s);
    if (!s || !(s->kept = calloc((size_t)cfg->n_layer, sizeof *s->kept))) {
        free(s);
        ERR("out of memory");
        return NULL;
    }
    s->window = 128;
    s->alpha = 0.2;
    s->threshold = NAN;
    s->held[0] = -1;
    int64_t ada = 0;
    const char *spec = kvb_opts_get(o, "scorer");
    int has_t = kvb_opts_double(o, "threshold", &s->threshold, err, err_len);
    int has_w = has_t < 0 ? -1 : kvb_opts_int(o, "window", &s->window, err, err_len);
    int has_a = has_w < 0 ? -1 : kvb_opts_int(o, "ada", &ada, err, err_len);
    int has_al = has_a < 0 || ada != 1 ? 0 : kvb_opts_double(o, "alpha", &s->alpha, err, err_len);
    s->dms = has_t == 1, s->ada = ada == 1;
    if (has_t < 0 || has_w < 0 || has_a < 0 || has_al < 0) goto fail;
    if (ada != 0 && ada != 1) { ERR("kvzap: ada must be 0 or 1"); goto fail; }
    const int no_budget = b->kind == KVB_BUDGET_NONE || (b->kind == KVB_BUDGET_FRACTION && b->frac >= 1.0);
    if (s->dms && !no_budget) {
        ERR("kvzap: threshold=%g sets what each head keeps: give no budget (--budget full)", s->threshold);
        goto fail;
    }
    if (!s->dms && b->kind == KVB_BUDGET_NONE) {
        ERR("kvzap: needs a budget (--budget 30%% or a token count) or threshold=T (DMS)");
        goto fail;
    }
    if (!spec || !*spec) {
        ERR("kvzap: needs scorer=DIR (a KVzap checkpoint for this model: the directory of nvidia/KVzap-mlp-<model> or "
            "-linear-, holding model.safetensors) or scorer=random");
        goto fail;
    }
    if (s->dms && s->ada) { ERR("kvzap: ada=1 shares a budget; threshold=T has none"); goto fail; }
    if (has_w && !s->dms) { ERR("kvzap: window is DMS's protected tail: it needs threshold=T"); goto fail; }
    if (s->window < 0 || s->window > INT32_MAX) { ERR("kvzap: window must be in [0, 2^31)"); goto fail; }
    if (!(s->alpha >= 0 && s->alpha <= 1)) { ERR("kvzap: alpha must be in [0, 1]"); goto fail; }
    if (!(s->z = kvb_kvzap_open(spec, cfg, err, err_len))) goto fail;
    s->base.budget = *b;
    s->base.imposes_budget = !s->dms;
    if (s->dms) snprintf(s->base.note, sizeof s->base.note, "threshold %g: what is kept is measured (no budget)", s->threshold);
    return &s->base;
fail:
    free(s->kept);
    free(s);
    return NULL;
}

const kvb_method_def kvb_method_kvzap = {
    .name = "kvzap",
    .summary = "KVzap: a trained per-layer scorer of the hidden states; top-k per head, ada=1, or threshold=T (DMS)",
    .traits = KVB_SHARES_PREFILL | KVB_LAYER_LOCAL,
    .scorer = kvzap_scorer,
    .create = kvzap_create,
    .hooks = {.pre_attend = kvzap_pre_attend, .after_prefill = kvzap_after_prefill},
    .adopt = kvzap_adopt,
    .expected_tokens = kvzap_expected,
    .describe = kvzap_describe,
    .destroy = kvzap_destroy,
};
