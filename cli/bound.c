/* bound.c — the byte bound of a decode step, for `kvbench bench` and `bench --method`.
 *
 * A decode step reads every matmul weight once (the output matrix included; the token embedding gives one row)
 * and the K and V rows it attends. Divided by the rate the backend copies device memory, measured in the same
 * run, that is the fastest the step could be: a decode at 85% of its bound spends 15% of its time on anything
 * but moving those bytes. */
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

/* Bytes of one weight matrix as the backend reads it: f16 copies on a discrete device, the file's blocks here. */
static double weight_bytes(const kvb_weight *w, int discrete) {
    if (!w->data) return 0;
    return discrete ? 2.0 * (double)w->rows * (double)w->cols : (double)w->rows * (double)ggml_row_bytes(w->type, (uint64_t)w->cols);
}

double cli_step_weight_bytes(const kvb_model *m, int discrete) {
    double b = weight_bytes(&m->output, discrete);
    for (int l = 0; l < m->cfg.n_layer; l++) {
        const kvb_layer *L = &m->layers[l];
        const kvb_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof ws / sizeof *ws; i++) b += weight_bytes(ws[i], discrete);
    }
    return b;
}

double cli_kv_token_bytes(const kvb_config *c, kvb_dtype kv) {
    return 2.0 * c->n_layer * c->n_head_kv * c->head_dim * (kv == KVB_F16 ? 2.0 : 4.0);
}

double cli_copy_rate(kvb_backend *be, kvb_copy_dir dir, size_t bytes) {
    const kvb_allocator *a = be->allocator;
    if (!a || !be->copy || (dir != KVB_COPY_D2D && dir != KVB_COPY_H2D)) return 0;
    const kvb_tier from = dir == KVB_COPY_H2D ? KVB_TIER_HOST : KVB_TIER_DEVICE;
    void *src = a->alloc(a->user, from, bytes), *dst = src ? a->alloc(a->user, KVB_TIER_DEVICE, bytes) : NULL;
    double best = 0;
    kvb_traffic saved = be->traffic; /* a measurement, not the run's traffic */
    char err[256];
    for (int r = 0; dst && r < 6; r++) { /* the first copy warms up (pages, clocks) and is not kept */
        double t0 = cli_now();
        if (be->copy(be, dst, src, bytes, dir, err, sizeof err) || (be->sync && be->sync(be))) {
            best = 0;
            break;
        }
        double t = cli_now() - t0;
        if (r > 0 && t > 0 && (best == 0 || t < best)) best = t;
    }
    be->traffic = saved;
    if (dst) a->free(a->user, KVB_TIER_DEVICE, dst, bytes);
    if (src) a->free(a->user, from, src, bytes);
    /* D2D: read + written, as bench-attention counts a copy; H2D: the bytes that crossed */
    return best > 0 ? (dir == KVB_COPY_D2D ? 2.0 : 1.0) * (double)bytes / best / 1e9 : 0;
}

double cli_copy_gbs(kvb_backend *be, size_t bytes) { return cli_copy_rate(be, KVB_COPY_D2D, bytes); }

double cli_copy_gbs_for(const char *backend, int n_threads, int force, int want_h2d, int *discrete, double *h2d_gbs) {
    char err[256];
    *h2d_gbs = 0;
    kvb_backend *be = kvb_backend_create(backend, n_threads, err, sizeof err);
    if (!be) return 0;
    *discrete = be->discrete;
    /* large enough to leave the caches: 1 GiB on a GPU (50 MiB L2), 256 MiB on the CPU; H2D: 256 MiB (PCIe's
     * plateau) from the pinned host tier */
    double gbs = be->discrete || force ? cli_copy_gbs(be, be->discrete ? (size_t)1 << 30 : (size_t)256 << 20) : 0;
    if (want_h2d) *h2d_gbs = cli_copy_rate(be, KVB_COPY_H2D, (size_t)256 << 20);
    kvb_backend_free(be);
    return gbs;
}
