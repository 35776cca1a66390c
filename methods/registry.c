/* registry.c — the registered methods, what each needs from the session, and a method's lifecycle (create,
 * prefill, free). The only file that knows methods by name: a new method is its file plus one line here. */
#include <stdio.h>
#include <string.h>

#include "methods/method.h"

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

kvb_method *kvb_full_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len);
kvb_method *kvb_streamingllm_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len);
kvb_method *kvb_h2o_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len);
kvb_method *kvb_snapkv_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len);
kvb_method *kvb_omnikv_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len);
kvb_method *kvb_round_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len);
kvb_method *kvb_pod_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len);
kvb_method *kvb_random_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len);
kvb_method *kvb_tova_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len);
kvb_method *kvb_knorm_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len);
kvb_method *kvb_quest_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len);
kvb_method *kvb_kivi_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len);
kvb_method *kvb_pyramidkv_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len);
kvb_method *kvb_adakv_create(kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err, size_t err_len);
int kvb_snapkv_obs_window(kvb_opts *o, int *rows, char *err, size_t err_len);
int kvb_omnikv_obs_window(kvb_opts *o, int *rows, char *err, size_t err_len);
int kvb_tova_obs_window(kvb_opts *o, int *rows, char *err, size_t err_len);
const char *kvb_omnikv_profile(kvb_opts *o);
const char *kvb_round_profile(kvb_opts *o);
const char *kvb_pod_profile(kvb_opts *o);

enum { BUDGET = KVB_NEEDS_BUDGET, SHARES = KVB_SHARES_PREFILL };

static const kvb_method_info METHODS[] = {
    /* name, aliases, traits, observation window, create, summary, profile section read */
    {"full", "flash", KVB_NO_BUDGET | SHARES, NULL, kvb_full_create, "exact attention over the whole cache (the baseline)", NULL},
    {"streamingllm", NULL, BUDGET | SHARES, NULL, kvb_streamingllm_create, "attention sinks + recent window, the rest evicted", NULL},
    {"h2o", NULL, BUDGET | SHARES | KVB_PREFILL_SCORES, NULL, kvb_h2o_create, "heavy hitters + recent tokens, evicting every step", NULL},
    {"snapkv", NULL, BUDGET | SHARES, kvb_snapkv_obs_window, kvb_snapkv_create, "prefix voted by the last queries, pooled, top-k + window", NULL},
    {"omnikv", NULL, BUDGET | SHARES, kvb_omnikv_obs_window, kvb_omnikv_create, "filter layers pick the tokens the sparse layers attend to", kvb_omnikv_profile},
    {"round", NULL, KVB_OWN_PREFILL, NULL, kvb_round_create, "Round Attention: rounds picked at the watershed layer, deep layers' on host", kvb_round_profile},
    {"pod", NULL, SHARES, NULL, kvb_pod_create, "PoD: proximal tokens exact, distant ones share the block's base-layer scores", kvb_pod_profile},
    {"random", NULL, BUDGET | SHARES, NULL, kvb_random_create, "the control: a seeded random subset + sinks + window, once after prefill", NULL},
    {"pyramidkv", NULL, BUDGET | SHARES, kvb_snapkv_obs_window, kvb_pyramidkv_create, "SnapKV's scores, budgets falling linearly from the bottom layer to the top", NULL},
    {"tova", NULL, BUDGET | SHARES, kvb_tova_obs_window, kvb_tova_create, "TOVA: evicts the token the current query attends least (head mean), every step", NULL},
    {"knorm", NULL, BUDGET | SHARES, NULL, kvb_knorm_create, "keeps the tokens whose keys have the lowest L2 norm, once after prefill", NULL},
    {"adakv", NULL, BUDGET | SHARES, kvb_snapkv_obs_window, kvb_adakv_create, "a layer's budget shared among its KV heads by score (base=snapkv|pyramidkv)", NULL},
    {"quest", NULL, BUDGET | SHARES, NULL, kvb_quest_create, "Quest: all KV resident, each step attends the top pages by min/max key bounds", NULL},
    {"kivi", NULL, SHARES, NULL, kvb_kivi_create, "KIVI: keys per channel, values per token in 2/4 bits, recent tokens in full", NULL},
};
#define N_METHODS ((int)(sizeof METHODS / sizeof METHODS[0]))

int kvb_method_count(void) { return N_METHODS; }
const kvb_method_info *kvb_method_at(int i) { return i >= 0 && i < N_METHODS ? &METHODS[i] : NULL; }

/* 1 if name is one of the comma-separated names in list */
static int in_list(const char *list, const char *name) {
    size_t len = strlen(name);
    for (const char *p = list; p && *p;) {
        const char *comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        if (n == len && !strncmp(p, name, n)) return 1;
        p = comma ? comma + 1 : NULL;
    }
    return 0;
}

const kvb_method_info *kvb_method_find(const char *name) {
    for (int i = 0; i < N_METHODS; i++)
        if (!strcmp(METHODS[i].name, name) || in_list(METHODS[i].aliases, name)) return &METHODS[i];
    return NULL;
}

void kvb_method_names(char *buf, size_t cap) {
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < N_METHODS && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%s%s%s%s", i ? ", " : "", METHODS[i].name,
                               METHODS[i].aliases ? " (" : "", METHODS[i].aliases ? METHODS[i].aliases : "",
                               METHODS[i].aliases ? ")" : "");
}

void kvb_method_names_all(char *buf, size_t cap) {
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < N_METHODS && at < cap; i++)
        if (!(METHODS[i].traits & KVB_NO_BUDGET)) at += (size_t)snprintf(buf + at, cap - at, "%s%s", at ? "," : "", METHODS[i].name);
}

static int unknown_method(const char *name, char *err, size_t err_len) {
    char list[256];
    kvb_method_names(list, sizeof list);
    return ERR("unknown method '%s' (available: %s)", name, list);
}

int kvb_method_needs_of(const char *name, const kvb_opts *o, kvb_method_needs *out, char *err, size_t err_len) {
    const kvb_method_info *info = kvb_method_find(name);
    if (!info) return unknown_method(name, err, err_len);
    memset(out, 0, sizeof *out);
    out->name = info->name;
    out->needs_budget = !!(info->traits & KVB_NEEDS_BUDGET);
    out->takes_budget = !(info->traits & KVB_NO_BUDGET);
    out->prefill_scores = !!(info->traits & KVB_PREFILL_SCORES);
    out->own_prefill = !!(info->traits & KVB_OWN_PREFILL);
    out->shares_prefill = !!(info->traits & KVB_SHARES_PREFILL);
    kvb_opts copy = {0}; /* reading an option marks it used: read a copy */
    if (o) copy = *o;
    out->profile = info->profile ? info->profile(&copy) : NULL;
    return info->obs_window ? info->obs_window(&copy, &out->obs_window, err, err_len) : 0;
}

kvb_method *kvb_method_create(const char *name, kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err,
                              size_t err_len) {
    const kvb_method_info *info = kvb_method_find(name);
    if (!info) {
        unknown_method(name, err, err_len);
        return NULL;
    }
    kvb_budget full = {KVB_BUDGET_FRACTION, 1.0, 0};
    if (!b) b = &full;
    if (b->kind == KVB_BUDGET_NONE && (info->traits & KVB_NEEDS_BUDGET)) {
        ERR("method %s needs a budget (--budget 30%% or a token count)", info->name);
        return NULL;
    }
    kvb_method *m = info->create(c, b, o, err, err_len);
    if (!m) return NULL;
    const char *unused = kvb_opts_unused(o);
    if (unused) {
        ERR("method %s has no option '%s'", m->name, unused);
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
