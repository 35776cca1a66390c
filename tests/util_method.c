/* util_method.c — the tiny-model fixture of the method tests (util_method.h). */
#include "util_method.h"

#include <CUnit/CUnit.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util_common.h"
#include "util_gguf_writer.h"
#include "kernels/dtype.h"

kvb_model *util_tiny;
static char dir[128], path[256];

int util_tiny_setup(const util_tiny_shape *s, uint64_t *rng) {
    snprintf(dir, sizeof dir, "/tmp/kvb_%s_XXXXXX", s->tag);
    if (!mkdtemp(dir)) return -1;
    snprintf(path, sizeof path, "%s/tiny.gguf", dir);
    gw_random r = {*rng, 0.5f, NULL};
    gw_tiny t = {"llama", s->n_layer, s->n_embd, s->n_head, s->n_head_kv, s->n_ff, s->n_vocab, s->n_ctx,
                 0, NULL, gw_random_tensor, &r};
    int rc = gw_write_tiny(&t, path);
    free(r.buf);
    *rng = r.state;
    char err[256];
    util_tiny = rc ? NULL : kvb_model_load(path, err, sizeof err);
    if (!util_tiny && !rc) fprintf(stderr, "util_tiny_setup: %s\n", err);
    return util_tiny ? 0 : -1;
}

int util_tiny_teardown(void) {
    kvb_model_free(util_tiny);
    util_tiny = NULL;
    unlink(path);
    rmdir(dir);
    return 0;
}

kvb_ctx *util_tiny_ctx(kvb_dtype dt, int n_ctx) {
    char err[256];
    kvb_ctx_params p = kvb_ctx_default_params();
    p.kv_dtype = dt;
    p.n_ctx = n_ctx;
    p.n_threads = 2;
    p.n_batch = 64;
    kvb_ctx *c = kvb_ctx_create(util_tiny, &p, err, sizeof err);
    if (!c) fprintf(stderr, "\n  ctx: %s\n", err);
    CU_ASSERT_FATAL(c != NULL);
    return c;
}

kvb_method *util_make_method(const char *name, kvb_ctx *c, const char *budget, const char *opts) {
    char err[256];
    kvb_budget b;
    CU_ASSERT_FATAL(kvb_budget_parse(budget, &b, err, sizeof err) == 0);
    kvb_opts o = {0};
    if (opts) CU_ASSERT_FATAL(kvb_opts_add(&o, opts, err, sizeof err) == 0);
    kvb_method *m = kvb_method_create(name, c, &b, &o, err, sizeof err);
    if (!m) fprintf(stderr, "\n  %s: %s\n", name, err);
    CU_ASSERT_FATAL(m != NULL);
    return m;
}

void util_check_refusals(const char *name, kvb_ctx *c, const char *opt, const char *opt_err) {
    char err[256];
    kvb_budget b = {KVB_BUDGET_FRACTION, 0.3, 0};
    kvb_opts o = {0};
    CU_ASSERT_FATAL(kvb_opts_add(&o, opt, err, sizeof err) == 0);
    CU_ASSERT(kvb_method_create(name, c, &b, &o, err, sizeof err) == NULL && strstr(err, opt_err));
    kvb_budget none = {KVB_BUDGET_NONE, 0, 0};
    kvb_opts o2 = {0};
    CU_ASSERT(kvb_method_create(name, c, &none, &o2, err, sizeof err) == NULL && strstr(err, "needs a budget"));
}

float util_frand(uint64_t *rng, float s) {
    *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
    return s * ((float)((*rng >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f);
}

double util_elem(const void *rows, kvb_dtype dt, size_t at) {
    return dt == KVB_F16 ? kvb_f16_to_f32(((const kvb_f16 *)rows)[at]) : ((const float *)rows)[at];
}

void util_topk_ref(const double *x, int64_t n, int64_t k, int32_t *out, double *margin, double *kth) {
    char *taken = calloc((size_t)(n > 0 ? n : 1), 1);
    double last = 0;
    if (margin) *margin = INFINITY;
    for (int64_t i = 0; i <= k && i < n; i++) {
        int64_t best = -1;
        for (int64_t j = 0; j < n; j++)
            if (!taken[j] && (best < 0 || x[j] > x[best])) best = j;
        if (i == k) {
            if (margin) *margin = last - x[best];
            break;
        }
        taken[best] = 1;
        last = x[best];
    }
    if (kth) *kth = last;
    for (int64_t j = 0, m = 0; j < n; j++)
        if (taken[j]) out[m++] = (int32_t)j;
    free(taken);
}

void util_keydiff_ref(const void *k, kvb_dtype dt, int64_t n, int d, double *score) {
    double *anchor = calloc((size_t)d, sizeof *anchor), an = 0;
    for (int64_t j = 0; j < n; j++) {
        double s = 0;
        for (int e = 0; e < d; e++) s += util_elem(k, dt, (size_t)j * d + e) * util_elem(k, dt, (size_t)j * d + e);
        for (int e = 0; e < d; e++) anchor[e] += s > 0 ? util_elem(k, dt, (size_t)j * d + e) / sqrt(s) / (double)n : 0;
    }
    for (int e = 0; e < d; e++) an += anchor[e] * anchor[e];
    for (int64_t j = 0; j < n; j++) {
        double dot = 0, s = 0;
        for (int e = 0; e < d; e++) {
            double x = util_elem(k, dt, (size_t)j * d + e);
            dot += x * anchor[e];
            s += x * x;
        }
        score[j] = s > 0 ? -dot / (sqrt(s) * sqrt(an)) : 0;
    }
    free(anchor);
}

int64_t util_head_positions(kvb_ctx *c, int l, int h, int32_t *out) {
    util_kv_head hc = util_kv_head_copy(c->kv, l, h);
    int64_t n = hc.n;
    memcpy(out, hc.pos, (size_t)n * sizeof *out);
    kvb_sort_i32(out, n);
    util_kv_head_free(&hc);
    return n;
}
