/* backend.c — backends by name (backend.h): the factory above the CPU and CUDA implementations. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "kernels/backend.h"

int kvb_errf(char *err, size_t err_len, const char *fmt, ...) {
    if (err && err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return -1;
}

void kvb_backend_free(kvb_backend *be) {
    if (be && be->free) be->free(be);
}

/* without nvcc the CUDA backend is this one answer */
#ifndef KVB_HAVE_CUDA
kvb_backend *kvb_backend_cuda_create(char *err, size_t err_len) {
    snprintf(err, err_len, "no GPU: this build has no CUDA backend (nvcc was not found when it was configured)");
    return NULL;
}
#endif

kvb_backend *kvb_backend_create(const char *name, int n_threads, char *err, size_t err_len) {
    if (!name || !*name || !strcmp(name, "cpu")) return kvb_backend_cpu_create(n_threads, err, err_len);
    if (!strcmp(name, "cuda")) return kvb_backend_cuda_create(err, err_len);
    snprintf(err, err_len, "unknown backend '%s' (expected cpu or cuda)", name);
    return NULL;
}
