/* registry.c — method lookup, budgets, options, measured usage and budget verification. */
#include "methods/method.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

kvb_method *kvb_full_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len);
kvb_method *kvb_streamingllm_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len);
kvb_method *kvb_h2o_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len);
kvb_method *kvb_snapkv_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len);
kvb_method *kvb_omnikv_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len);
kvb_method *kvb_round_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len);
kvb_method *kvb_pod_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len);

static const kvb_method_info METHODS[] = {
    {"full", "exact attention over the whole cache (the baseline)", kvb_full_create},
    {"flash", "alias of full", kvb_full_create},
    {"streamingllm", "attention sinks + recent window; evicted tokens removed", kvb_streamingllm_create},
    {"h2o", "heavy hitters (accumulated attention) + recent tokens, evicting every step", kvb_h2o_create},
    {"snapkv", "prefix tokens voted by the last 32 queries, max-pooled, top-k + window, once after prefill",
     kvb_snapkv_create},
    {"omnikv", "filter layers pick top-k tokens that the following sparse layers attend to", kvb_omnikv_create},
    {"round", "Round Attention: rounds selected at the watershed layer, deep layers' past rounds on host",
     kvb_round_create},
    {"pod", "PoD: proximal tokens exact, distant tokens share the block's base-layer attention scores",
     kvb_pod_create},
};
#define N_METHODS ((int)(sizeof METHODS / sizeof METHODS[0]))

int kvb_method_count(void) { return N_METHODS; }
const kvb_method_info *kvb_method_at(int i) { return i >= 0 && i < N_METHODS ? &METHODS[i] : NULL; }

const kvb_method_info *kvb_method_find(const char *name) {
    for (int i = 0; i < N_METHODS; i++)
        if (!strcmp(METHODS[i].name, name)) return &METHODS[i];
    return NULL;
}

void kvb_method_names(char *buf, size_t cap) {
    buf[0] = 0;
    for (int i = 0; i < N_METHODS; i++) {
        strncat(buf, METHODS[i].name, cap - strlen(buf) - 1);
        if (i + 1 < N_METHODS) strncat(buf, ", ", cap - strlen(buf) - 1);
    }
}

/* ---- budgets ---- */

int kvb_budget_parse(const char *s, kvb_budget *b, char *err, size_t err_len) {
    memset(b, 0, sizeof *b);
    if (!s || !*s || !strcmp(s, "full")) {
        b->kind = KVB_BUDGET_FRACTION;
        b->frac = 1.0;
        return 0;
    }
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno) return ERR("budget '%s' is not a number (use e.g. 30%% or 1024 tokens)", s);
    if (*end == '%' && end[1] == 0) {
        if (!(v > 0) || v > 100) return ERR("budget %s is outside (0%%, 100%%]", s);
        b->kind = KVB_BUDGET_FRACTION;
        b->frac = v / 100.0;
        return 0;
    }
    if (*end) return ERR("budget '%s' is not a number (use e.g. 30%% or 1024 tokens)", s);
    if (v != floor(v)) return ERR("budget '%s': a fraction needs a %% sign (e.g. 30%%), tokens are whole", s);
    if (v <= 0) return ERR("budget %s must be positive", s);
    if (v > 1e9) return ERR("budget %s tokens is too large", s);
    b->kind = KVB_BUDGET_TOKENS;
    b->tokens = (int64_t)v;
    return 0;
}

void kvb_budget_format(const kvb_budget *b, char *buf, size_t cap) {
    if (b->kind == KVB_BUDGET_TOKENS) snprintf(buf, cap, "%lld", (long long)b->tokens);
    else if (b->kind == KVB_BUDGET_FRACTION && b->frac < 1.0) snprintf(buf, cap, "%g%%", b->frac * 100.0);
    else snprintf(buf, cap, "full");
}

int kvb_budget_tokens(const kvb_budget *b, int64_t n, int64_t *out, char *err, size_t err_len) {
    if (b->kind == KVB_BUDGET_TOKENS) {
        if (b->tokens > n)
            return ERR("budget of %lld tokens is more than the prompt's %lld tokens", (long long)b->tokens,
                       (long long)n);
        *out = b->tokens;
        return 0;
    }
    double f = b->kind == KVB_BUDGET_FRACTION ? b->frac : 1.0; /* NONE: everything */
    int64_t t = (int64_t)llround(f * (double)n);
    *out = t < 1 ? 1 : (t > n ? n : t);
    return 0;
}

/* ---- options ---- */

static int opts_add_one(kvb_opts *o, const char *s, size_t len, char *err, size_t err_len) {
    const char *eq = memchr(s, '=', len);
    if (!eq || eq == s) return ERR("method option '%.*s' is not key=value", (int)len, s);
    size_t kl = (size_t)(eq - s), vl = len - kl - 1;
    if (kl >= sizeof o->v[0].key || vl >= sizeof o->v[0].val) return ERR("method option '%.*s' is too long", (int)len, s);
    int slot = -1;
    for (int i = 0; i < o->n; i++)
        if (strlen(o->v[i].key) == kl && !memcmp(o->v[i].key, s, kl)) slot = i;
    if (slot < 0) {
        if (o->n >= KVB_MAX_OPTS) return ERR("too many method options (at most %d)", KVB_MAX_OPTS);
        slot = o->n++;
    }
    memcpy(o->v[slot].key, s, kl);
    o->v[slot].key[kl] = 0;
    memcpy(o->v[slot].val, eq + 1, vl);
    o->v[slot].val[vl] = 0;
    o->v[slot].used = 0;
    return 0;
}

int kvb_opts_add(kvb_opts *o, const char *kv, char *err, size_t err_len) {
    /* split on commas that start a new key=value (layer lists like layers=2;8;18 use ';') */
    const char *p = kv;
    while (*p) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        if (len && opts_add_one(o, p, len, err, err_len)) return -1;
        p += len + (c ? 1 : 0);
    }
    return 0;
}

int kvb_opts_add_json(kvb_opts *o, const cJSON *obj, const char *where, char *err, size_t err_len) {
    const cJSON *x;
    cJSON_ArrayForEach(x, obj) {
        char kv[200];
        if (cJSON_IsString(x)) snprintf(kv, sizeof kv, "%s=%s", x->string, x->valuestring);
        else if (cJSON_IsNumber(x)) snprintf(kv, sizeof kv, "%s=%g", x->string, x->valuedouble);
        else return ERR("%s: option %s must be a string or number", where, x->string);
        if (kvb_opts_add(o, kv, err, err_len)) return -1;
    }
    return 0;
}

const char *kvb_opts_get(kvb_opts *o, const char *key) {
    if (!o) return NULL;
    for (int i = 0; i < o->n; i++)
        if (!strcmp(o->v[i].key, key)) {
            o->v[i].used = 1;
            return o->v[i].val;
        }
    return NULL;
}

int kvb_opts_int(kvb_opts *o, const char *key, int64_t *out, char *err, size_t err_len) {
    const char *s = kvb_opts_get(o, key);
    if (!s) return 0;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end || errno) return ERR("method option %s=%s is not an integer", key, s);
    *out = v;
    return 1;
}

int kvb_opts_double(kvb_opts *o, const char *key, double *out, char *err, size_t err_len) {
    const char *s = kvb_opts_get(o, key);
    if (!s) return 0;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(v)) return ERR("method option %s=%s is not a number", key, s);
    *out = v;
    return 1;
}

const char *kvb_opts_unused(const kvb_opts *o) {
    if (!o) return NULL;
    for (int i = 0; i < o->n; i++)
        if (!o->v[i].used) return o->v[i].key;
    return NULL;
}

/* ---- lifecycle ---- */

kvb_method *kvb_method_create(const char *name, kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err,
                              size_t err_len) {
    const kvb_method_info *info = kvb_method_find(name);
    if (!info) {
        char list[256];
        kvb_method_names(list, sizeof list);
        snprintf(err, err_len, "unknown method '%s' (available: %s)", name, list);
        return NULL;
    }
    kvb_budget full = {KVB_BUDGET_FRACTION, 1.0, 0};
    if (!b) b = &full;
    if (b->kind == KVB_BUDGET_NONE && (!strcmp(info->name, "streamingllm") || !strcmp(info->name, "h2o") ||
                                       !strcmp(info->name, "snapkv") || !strcmp(info->name, "omnikv"))) {
        snprintf(err, err_len, "method %s needs a budget (--budget 30%% or a token count)", info->name);
        return NULL;
    }
    kvb_method *m = info->create(c, b, o, err, err_len);
    if (!m) return NULL;
    const char *unused = kvb_opts_unused(o);
    if (unused) {
        snprintf(err, err_len, "method %s has no option '%s'", m->name, unused);
        m->destroy(m);
        return NULL;
    }
    m->hooks.self = m;
    if (kvb_ctx_set_hooks(c, &m->hooks, err, err_len)) {
        m->destroy(m);
        return NULL;
    }
    return m;
}

void kvb_method_free(kvb_method *m, kvb_ctx *c) {
    if (!m) return;
    if (c && c->hooks == &m->hooks) c->hooks = NULL;
    m->destroy(m);
}

int kvb_method_prefill(kvb_method *m, kvb_ctx *c, const int32_t *ids, int64_t n, char *err, size_t err_len) {
    int rc = m && m->prefill ? m->prefill(m, c, ids, n, err, err_len) : kvb_forward(c, ids, n, err, err_len);
    if (rc || kvb_ctx_end_prefill(c, err, err_len)) return -1;
    return kvb_method_verify(m, c, 1, err, err_len);
}

/* ---- measurement ---- */

void kvb_method_usage(const kvb_method *m, const kvb_ctx *c, kvb_kv_usage *u) {
    memset(u, 0, sizeof *u);
    u->device_bytes = kvc_used_bytes(c->kv, KVB_TIER_DEVICE);
    u->host_bytes = kvc_used_bytes(c->kv, KVB_TIER_HOST);
    if (m) u->device_bytes += m->extra_device_bytes;
    if (m && m->vis) {
        u->device_bytes += kvc_used_bytes(m->vis, KVB_TIER_DEVICE);
        u->host_bytes += kvc_used_bytes(m->vis, KVB_TIER_HOST);
    }
    const kvb_config *cfg = &c->model->cfg;
    u->full_bytes = (int64_t)cfg->n_layer * cfg->n_head_kv * c->n_past * kvc_slot_bytes(c->kv);
    kvb_mem *mem = (kvb_mem *)&c->mem;
    u->moved_h2d = mem->moved_bytes[KVB_TIER_HOST][KVB_TIER_DEVICE];
    u->moved_d2h = mem->moved_bytes[KVB_TIER_DEVICE][KVB_TIER_HOST];
    u->device_frac = u->full_bytes > 0 ? (double)u->device_bytes / (double)u->full_bytes : 0.0;
}

static int64_t layer_device_tokens(const kvb_method *m, const kvb_ctx *c, int l) {
    int64_t bytes = kvc_layer_used_bytes(c->kv, l, KVB_TIER_DEVICE);
    if (m->vis) bytes += kvc_layer_used_bytes(m->vis, l, KVB_TIER_DEVICE);
    return bytes / kvc_slot_bytes(c->kv);
}

int kvb_method_verify(kvb_method *m, kvb_ctx *c, int end_of_prefill, char *err, size_t err_len) {
    if (!m) return 0;
    const kvb_config *cfg = &c->model->cfg;
    const int HK = cfg->n_head_kv;
    for (int l = 0; l < cfg->n_layer && m->expected_tokens; l++) {
        int64_t want = m->expected_tokens(m, c, l);
        if (want < 0) break;
        int64_t have = layer_device_tokens(m, c, l);
        int64_t want_all = want * HK;
        int64_t tol = want_all / 100 > HK ? want_all / 100 : HK;
        if (llabs(have - want_all) > tol)
            return ERR("method %s: layer %d holds %lld device KV tokens, its budget says %lld (over %d KV heads)",
                       m->name, l, (long long)have, (long long)want_all, HK);
    }
    if (end_of_prefill && m->imposes_budget && m->expected_tokens) {
        int64_t per_head = 0;
        if (kvb_budget_tokens(&m->budget, c->n_past, &per_head, err, err_len)) return -1;
        double target = m->budget.kind == KVB_BUDGET_TOKENS ? (double)per_head / (double)c->n_past
                                                            : m->budget.frac;
        kvb_kv_usage u;
        kvb_method_usage(m, c, &u);
        double slack = (double)(cfg->n_layer * HK) / (double)(u.full_bytes / kvc_slot_bytes(c->kv));
        if (fabs(u.device_frac - target) > 0.01 * target + slack)
            return ERR("method %s: device KV after prefill is %.2f%% of full, budget %.2f%%", m->name,
                       100.0 * u.device_frac, 100.0 * target);
    }
    if (m->formula_frac) {
        kvb_kv_usage u;
        kvb_method_usage(m, c, &u);
        double f = m->formula_frac(m, c);
        if (fabs(u.device_frac - f) > 0.02 * f)
            return ERR("method %s: device KV is %.2f%% of full, its memory formula says %.2f%%", m->name,
                       100.0 * u.device_frac, 100.0 * f);
    }
    return 0;
}

/* ---- helpers ---- */

typedef struct { float s; int32_t i; } scored;

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

void kvb_sort_i32(int32_t *v, int64_t n) { qsort(v, (size_t)n, sizeof *v, cmp_i32); }

/* a before b in the order "higher score first, then lower index" */
static int before(const scored *a, const scored *b) { return a->s > b->s || (a->s == b->s && a->i < b->i); }

/* Quickselect: afterwards t[0..k) are the k first elements of the order (unsorted). Expected O(n). */
static void select_k(scored *t, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1;
    uint64_t r = 0x9e3779b97f4a7c15ull;
    while (lo < hi) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        scored pivot = t[lo + (int64_t)(r % (uint64_t)(hi - lo + 1))];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (before(&t[i], &pivot)) i++;
            while (before(&pivot, &t[j])) j--;
            if (i <= j) {
                scored x = t[i];
                t[i++] = t[j];
                t[j--] = x;
            }
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else return;
    }
}

int kvb_topk_ascending(const float *score, int64_t n, int64_t k, int32_t *out) {
    if (k > n) k = n;
    if (k <= 0) return 0;
    scored *t = malloc((size_t)n * sizeof *t);
    if (!t) return -1;
    for (int64_t i = 0; i < n; i++) {
        t[i].s = isnan(score[i]) ? -INFINITY : score[i];
        t[i].i = (int32_t)i;
    }
    if (k < n) select_k(t, n, k);
    for (int64_t i = 0; i < k; i++) out[i] = t[i].i;
    free(t);
    kvb_sort_i32(out, k);
    return 0;
}

void kvb_src_from_store(const kvb_ctx *c, int layer, kvb_src *src) {
    for (int h = 0; h < c->model->cfg.n_head_kv; h++) {
        kvc_view v = kvc_head_view(c->kv, layer, h);
        kvb_src s = {v.k, v.v, v.pos, v.n, NULL, 0};
        src[h] = s;
    }
}

int64_t kvb_cur_len(const kvb_ctx *c, int64_t n_q) { return (int64_t)c->pos[n_q - 1] + 1; }

void *kvb_method_alloc(kvb_ctx *c, size_t bytes) {
    return kvb_mem_alloc(&c->mem, KVB_TIER_DEVICE, KVB_MEM_METHOD, bytes);
}

void kvb_method_release(kvb_ctx *c, void *p, size_t bytes) {
    kvb_mem_free(&c->mem, KVB_TIER_DEVICE, KVB_MEM_METHOD, p, bytes);
}

int kvb_attn_probs(kvb_ctx *c, int layer, const float *q, const int32_t *q_pos, int64_t n_q, const kvb_src *src,
                   float **probs, int64_t *stride, float *lse, char *err, size_t err_len) {
    const kvb_config *cfg = &c->model->cfg;
    const int HK = cfg->n_head_kv;
    kvb_src *own = NULL;
    if (!src) {
        own = calloc((size_t)HK, sizeof *own);
        if (!own) return ERR("out of memory");
        kvb_src_from_store(c, layer, own);
        src = own;
    }
    const void **k = calloc((size_t)HK, sizeof *k), **v = calloc((size_t)HK, sizeof *v);
    const int32_t **pos = calloc((size_t)HK, sizeof *pos), **idx = calloc((size_t)HK, sizeof *idx);
    int64_t *n = calloc((size_t)HK, sizeof *n), *nidx = calloc((size_t)HK, sizeof *nidx);
    float *out = malloc((size_t)n_q * cfg->n_head * cfg->head_dim * sizeof(float));
    int rc = -1, any_idx = 0;
    int64_t longest = 1;
    *probs = NULL;
    if (!k || !v || !pos || !idx || !n || !nidx || !out) { ERR("out of memory"); goto done; }
    for (int h = 0; h < HK; h++) {
        k[h] = src[h].k;
        v[h] = src[h].v;
        pos[h] = src[h].pos;
        n[h] = src[h].n;
        idx[h] = src[h].idx;
        nidx[h] = src[h].idx ? src[h].n_idx : 0;
        any_idx |= src[h].idx != NULL;
        int64_t len = src[h].idx ? src[h].n_idx : src[h].n;
        if (len > longest) longest = len;
    }
    *probs = malloc((size_t)cfg->n_head * n_q * longest * sizeof(float));
    if (!*probs) { ERR("out of memory for %lld x %lld attention probabilities", (long long)n_q, (long long)longest); goto done; }
    kvb_attn_args a = {0};
    a.n_q = n_q;
    a.n_head = cfg->n_head;
    a.n_head_kv = HK;
    a.head_dim = cfg->head_dim;
    a.q = q;
    a.q_pos = q_pos;
    a.kv_dtype = c->params.kv_dtype;
    a.k = k;
    a.v = v;
    a.k_pos = pos;
    a.n_kv = n;
    a.idx = any_idx ? idx : NULL;
    a.n_idx = any_idx ? nidx : NULL;
    a.scale = 1.0f / sqrtf((float)cfg->head_dim);
    a.out = out;
    a.probs = *probs;
    a.probs_stride = longest;
    a.lse = lse;
    rc = c->be->attention(c->be, &a, err, err_len);
    *stride = longest;
done:
    if (rc) {
        free(*probs);
        *probs = NULL;
    }
    free(own);
    free(k);
    free(v);
    free(pos);
    free(idx);
    free(n);
    free(nidx);
    free(out);
    return rc;
}

int kvb_errf(char *err, size_t err_len, const char *fmt, ...) {
    if (err && err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return -1;
}

int kvb_vis_attend_packed(kvb_method *m, kvb_ctx *c, int layer, kvb_src *src, int64_t n_q, char *err, size_t err_len) {
    const int HK = c->model->cfg.n_head_kv;
    int64_t len = kvc_n(c->kv, layer, 0);
    int32_t cur[64];
    for (int64_t done = 0; done < n_q;) {
        int64_t k = n_q - done < 64 ? n_q - done : 64;
        for (int64_t i = 0; i < k; i++) cur[i] = (int32_t)(len - n_q + done + i);
        for (int h = 0; h < HK; h++)
            if (kvc_append_from(m->vis, layer, h, c->kv, layer, h, cur, k, 0, err, err_len)) return -1;
        done += k;
    }
    kvb_mem_move(&c->mem, KVB_TIER_DEVICE, KVB_TIER_HOST, n_q * HK * kvc_slot_bytes(c->kv));
    for (int h = 0; h < HK; h++) {
        kvc_view v = kvc_head_view(m->vis, layer, h);
        kvb_src x = {v.k, v.v, v.pos, v.n, NULL, 0};
        src[h] = x;
    }
    return 0;
}
