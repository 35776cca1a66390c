/* runopts.c — the runner's engine options and --dump-kept (runopts.h). */
#include "benchmarks/runopts.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#define ERR(...) kvb_errf(err, err_len, __VA_ARGS__)

kvb_ctx_params kvb_run_ctx_params(const kvb_run_opts *o) {
    kvb_ctx_params cp = kvb_ctx_default_params();
    cp.n_threads = o->n_threads;
    cp.profile = o->profile; /* the phases only when asked: on a GPU each one waits for the device */
    if (o->kv_f32) cp.kv_dtype = KVB_F32;
    if (o->backend) cp.backend = o->backend;
    if (o->n_batch > 0) cp.n_batch = o->n_batch;
    cp.prefill_gemm = o->prefill_gemm;
    return cp;
}

void kvb_run_engine_fingerprint(const kvb_run_opts *o, char *out, size_t cap) {
    kvb_ctx_params cp = kvb_run_ctx_params(o);
    int at = 0;
    out[0] = 0;
    if (cp.kv_dtype == KVB_F32) at += snprintf(out + at, cap - (size_t)at, "kv=f32");
    if (cp.backend && strcmp(cp.backend, "cpu"))
        at += snprintf(out + at, cap - (size_t)at, "%sbackend=%s", at ? " " : "", cp.backend);
    /* the prefill's numerics: named whenever the CPU prefill runs the f32 GEMM (the default with an f16 cache), so
     * records of the integer prefill (earlier builds, --prefill-gemm int8, a build without OpenBLAS) are not mixed
     * with them */
    const int on_cpu = !cp.backend || !strcmp(cp.backend, "cpu");
    if (on_cpu && kvb_backend_cpu_gemm_f32(kvb_ctx_gemm(&cp)))
        at += snprintf(out + at, cap - (size_t)at, "%sgemm=f32", at ? " " : "");
#ifdef KVB_HAVE_CUDA
    /* the CUDA kernels change timings and some change rounding: records of other kernels are not mixed in */
    if (cp.backend && !strcmp(cp.backend, "cuda"))
        at += snprintf(out + at, cap - (size_t)at, "%skernels=%s", at ? " " : "", kvb_cuda_kernels_tag());
#endif
    if (o->n_ctx > 0) snprintf(out + at, cap - (size_t)at, "%sctx=%d", at ? " " : "", o->n_ctx);
}

int kvb_run_kept_note(FILE *out, kvb_kept *k, kvb_ctx *c, const kvb_method *m, const char *budget, const char *sample,
                      const char *cell, const int32_t *ids, const char *when, char *err, size_t err_len) {
    if (!k) return 0;
    if (!strcmp(when, "prefill")) {
        char params[240] = "", fields[600];
        if (m->def->describe) m->def->describe((kvb_method *)m, params, sizeof params);
        cJSON *h = cJSON_CreateObject();
        cJSON_AddStringToObject(h, "method", m->name);
        cJSON_AddStringToObject(h, "budget", budget);
        cJSON_AddStringToObject(h, "params", params);
        if (sample) cJSON_AddStringToObject(h, "sample", sample);
        if (cell) cJSON_AddStringToObject(h, "cell", cell);
        char *t = cJSON_PrintUnformatted(h);
        cJSON_Delete(h);
        if (!t) return ERR("out of memory");
        snprintf(fields, sizeof fields, "%.*s", (int)strlen(t) - 2, t + 1); /* the members, without the braces */
        free(t);
        if (kvb_kept_header(out, fields, ids, c->n_past, err, err_len)) return -1;
    }
    return kvb_kept_write(k, c, when, out, err, err_len);
}
