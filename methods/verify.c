/* verify.c — measured KV of a method's context, the check that it matches the method's claim, its budget
 * and its memory formula. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "methods/method.h"

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

void kvb_method_usage(const kvb_method *m, const kvb_ctx *c, kvb_kv_usage *u) {
    kvb_ctx_kv_usage(c, u);
    if (m) u->device_bytes += m->extra_device_bytes;
    if (m && m->vis) {
        u->device_bytes += kvc_used_bytes(m->vis, KVB_TIER_DEVICE);
        u->host_bytes += kvc_used_bytes(m->vis, KVB_TIER_HOST);
    }
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
    for (int l = 0; l < cfg->n_layer && m->def->expected_tokens; l++) {
        /* a local layer keeps its window, whatever the method (the engine runs no hook there) */
        int64_t want = kvb_layer_window(cfg, l) ? kvb_ctx_full_tokens(c, l) : m->def->expected_tokens(m, c, l);
        if (want < 0) break;
        int64_t have = layer_device_tokens(m, c, l);
        int64_t want_all = want * HK;
        int64_t tol = want_all / 100 > HK ? want_all / 100 : HK;
        if (llabs(have - want_all) > tol)
            return ERR("method %s: layer %d holds %lld device KV tokens, its budget says %lld (over %d KV heads)",
                       m->name, l, (long long)have, (long long)want_all, HK);
    }
    if (end_of_prefill && m->imposes_budget && m->def->expected_tokens) {
        int64_t per_head = 0;
        if (kvb_method_budget_tokens(m, c->n_past, &per_head, err, err_len)) return -1;
        kvb_kv_usage u;
        kvb_method_usage(m, c, &u);
        double target = m->budget.frac;
        if (m->budget.kind == KVB_BUDGET_TOKENS) { /* per global layer; the local layers hold their windows */
            int64_t held = 0;
            for (int l = 0; l < cfg->n_layer; l++) held += kvb_layer_window(cfg, l) ? kvb_ctx_full_tokens(c, l) : per_head;
            target = (double)held * HK * kvc_slot_bytes(c->kv) / (double)u.full_bytes;
        }
        double slack = (double)(cfg->n_layer * HK) / (double)(u.full_bytes / kvc_slot_bytes(c->kv));
        if (fabs(u.device_frac - target) > 0.01 * target + slack)
            return ERR("method %s: device KV after prefill is %.2f%% of full, budget %.2f%%", m->name,
                       100.0 * u.device_frac, 100.0 * target);
    }
    if (m->def->formula_frac) {
        kvb_kv_usage u;
        kvb_method_usage(m, c, &u);
        double f = m->def->formula_frac(m, c);
        if (fabs(u.device_frac - f) > 0.02 * f)
            return ERR("method %s: device KV is %.2f%% of full, its memory formula says %.2f%%", m->name,
                       100.0 * u.device_frac, 100.0 * f);
    }
    return 0;
}
