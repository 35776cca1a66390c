/* seam.c — a method as the engine session sees it (engine/session.h kvb_session_method). */
#include "methods/method.h"

static int seam_prefill(void *self, kvb_ctx *c, const int32_t *ids, int64_t n, char *err, size_t err_len) {
    kvb_method *m = self;
    return m->prefill(m, c, ids, n, err, err_len);
}

static int seam_verify(void *self, kvb_ctx *c, int end_of_prefill, char *err, size_t err_len) {
    return kvb_method_verify(self, c, end_of_prefill, err, err_len);
}

static void seam_usage(const void *self, const kvb_ctx *c, kvb_kv_usage *u) { kvb_method_usage(self, c, u); }

kvb_session_method kvb_method_seam(kvb_method *m) {
    kvb_session_method s = {0};
    if (!m) return s;
    s.self = m;
    s.prefill = m->prefill ? seam_prefill : NULL;
    s.verify = seam_verify;
    s.usage = seam_usage;
    return s;
}
