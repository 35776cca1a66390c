/* registry.c — the registered methods, what each needs from the session, a method's lifecycle (create, bind
 * its def, free) and the seam through which an engine session sees it. The only file that knows the methods:
 * a new method is its file (ending with its kvb_method_def) plus one word in KVB_METHODS. */
#include <stdio.h>
#include <string.h>

#include "methods/method.h"

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

/* Every method, in the order --help and `--method all` list them: one word per method, naming the def its file
 * declares (kvb_method_<name>, methods/<name>.c). */
#define KVB_METHODS(X) \
    X(full) X(streamingllm) X(h2o) X(snapkv) X(omnikv) X(round) X(pod) X(random) X(pyramidkv) X(tova) X(knorm) \
    X(adakv) X(quest) X(kivi) X(keydiff) X(observed) X(decoding) X(expected) X(chunkkv) X(cur) X(lagkv) X(criticalkv) X(compactor) X(kvzap) X(kvzip) X(finch) X(qfilter) X(duo) X(cake) X(think)

#define DECLARE(n) extern const kvb_method_def kvb_method_##n;
KVB_METHODS(DECLARE)
#define ROW(n) &kvb_method_##n,
static const kvb_method_def *const METHODS[] = {KVB_METHODS(ROW)};
#define N_METHODS ((int)(sizeof METHODS / sizeof METHODS[0]))

int kvb_method_count(void) { return N_METHODS; }
const kvb_method_def *kvb_method_at(int i) { return i >= 0 && i < N_METHODS ? METHODS[i] : NULL; }

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

const kvb_method_def *kvb_method_find(const char *name) {
    for (int i = 0; i < N_METHODS; i++)
        if (!strcmp(METHODS[i]->name, name) || in_list(METHODS[i]->aliases, name)) return METHODS[i];
    return NULL;
}

void kvb_method_names(char *buf, size_t cap) {
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < N_METHODS && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%s%s%s%s", i ? ", " : "", METHODS[i]->name,
                               METHODS[i]->aliases ? " (" : "", METHODS[i]->aliases ? METHODS[i]->aliases : "",
                               METHODS[i]->aliases ? ")" : "");
}

void kvb_method_names_all(char *buf, size_t cap) {
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < N_METHODS && at < cap; i++)
        if (!(METHODS[i]->traits & KVB_NO_BUDGET) && !METHODS[i]->scorer) /* a scorer is a per-model file of the user's */
            at += (size_t)snprintf(buf + at, cap - at, "%s%s", at ? "," : "", METHODS[i]->name);
}

static int unknown_method(const char *name, char *err, size_t err_len) {
    char list[2048];
    kvb_method_names(list, sizeof list);
    return ERR("unknown method '%s' (available: %s)", name, list);
}

void kvb_method_needs_merge(kvb_method_needs *u, const kvb_method_needs *nd) {
    u->prefill_scores |= nd->prefill_scores;
    u->own_prefill |= nd->own_prefill;
    if (nd->obs_window > u->obs_window) u->obs_window = nd->obs_window;
    if (!u->scorer[0]) memcpy(u->scorer, nd->scorer, sizeof u->scorer); /* one per share: another is refused at adopt */
}

int kvb_method_needs_of(const char *name, const kvb_opts *o, kvb_method_needs *out, char *err, size_t err_len) {
    const kvb_method_def *info = kvb_method_find(name);
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
    const char *scorer = info->scorer ? info->scorer(&copy) : NULL;
    if (scorer && strlen(scorer) >= sizeof out->scorer) return ERR("%s: scorer path longer than %zu bytes", info->name, sizeof out->scorer - 1);
    if (scorer) memcpy(out->scorer, scorer, strlen(scorer) + 1);
    return info->obs_window ? info->obs_window(&copy, &out->obs_window, err, err_len) : 0;
}

kvb_method *kvb_method_create(const char *name, kvb_ctx *c, const kvb_budget *b, kvb_opts *o, char *err,
                              size_t err_len) {
    const kvb_method_def *def = kvb_method_find(name);
    if (!def) {
        unknown_method(name, err, err_len);
        return NULL;
    }
    kvb_budget full = {KVB_BUDGET_FRACTION, 1.0, 0};
    if (!b) b = &full;
    if (b->kind == KVB_BUDGET_NONE && (def->traits & KVB_NEEDS_BUDGET)) {
        ERR("method %s needs a budget (--budget 30%% or a token count)", def->name);
        return NULL;
    }
    kvb_method_needs nd;
    if (kvb_method_needs_of(def->name, o, &nd, err, err_len)) return NULL;
    kvb_method *m = def->create(c, b, o, err, err_len);
    if (!m) return NULL;
    m->def = def;
    m->name = def->name;
    m->hooks = def->hooks;
    m->hooks.self = m;
    m->hooks.obs_window = nd.obs_window;
    m->hooks.obs_decode = !!(def->traits & KVB_DECODE_WINDOW);
    m->hooks.no_host_reads = !!(def->traits & KVB_NO_HOST_READS);
    kvb_method_bind_layers(m, &c->model->cfg); /* a hybrid model's budget is its global layers' */
    const char *unused = kvb_opts_unused(o);
    if (unused) {
        ERR("method %s has no option '%s'", m->name, unused);
        def->destroy(m);
        return NULL;
    }
    if (kvb_ctx_set_hooks(c, &m->hooks, err, err_len)) {
        def->destroy(m);
        return NULL;
    }
    return m;
}

void kvb_method_free(kvb_method *m, kvb_ctx *c) {
    if (!m) return;
    if (c && c->hooks == &m->hooks) c->hooks = NULL;
    m->def->destroy(m);
}

/* ---- the method as an engine session sees it (engine/session.h kvb_session_method) ---- */

static int seam_prefill(void *self, kvb_ctx *c, const int32_t *ids, int64_t n, char *err, size_t err_len) {
    kvb_method *m = self;
    return m->def->prefill(m, c, ids, n, err, err_len);
}

static int seam_adopt(void *self, kvb_ctx *c, const void *shared, char *err, size_t err_len) {
    kvb_method *m = self;
    if (kvb_share_serves(shared, m, err, err_len)) return -1;
    return m->def->adopt ? m->def->adopt(m, c, shared, err, err_len) : 0;
}

static int seam_verify(void *self, kvb_ctx *c, int end_of_prefill, char *err, size_t err_len) {
    return kvb_method_verify(self, c, end_of_prefill, err, err_len);
}

static void seam_usage(const void *self, const kvb_ctx *c, kvb_kv_usage *u) { kvb_method_usage(self, c, u); }

kvb_session_method kvb_method_seam(kvb_method *m) {
    kvb_session_method s = {0};
    if (!m) return s;
    s.self = m;
    s.prefill = m->def->prefill ? seam_prefill : NULL;
    s.adopt = seam_adopt;
    s.verify = seam_verify;
    s.usage = seam_usage;
    return s;
}

/* ---- outside a session (tests, tools): the same seam, the same end of prefill ---- */

int kvb_method_prefill(kvb_method *m, kvb_ctx *c, const int32_t *ids, int64_t n, char *err, size_t err_len) {
    kvb_session_method s = kvb_method_seam(m);
    int rc = s.prefill ? s.prefill(s.self, c, ids, n, err, err_len) : kvb_forward(c, ids, n, err, err_len);
    return rc ? -1 : kvb_end_prefill(c, &s, err, err_len);
}

int kvb_method_adopt(kvb_method *m, kvb_ctx *c, const kvb_share *share, char *err, size_t err_len) {
    kvb_session_method s = kvb_method_seam(m);
    if (s.adopt && s.adopt(s.self, c, share, err, err_len)) return -1;
    return kvb_end_prefill(c, &s, err, err_len);
}
