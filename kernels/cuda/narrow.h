/* narrow.h — the CUDA backend's narrow-key ops (kernels/backend.h, "keys narrower than values"); kernels in
 * narrow.cu. C++ (nvcc) only. */
#ifndef KVB_CUDA_NARROW_H
#define KVB_CUDA_NARROW_H

extern "C" {
#include "kernels/backend.h"
}

/* Install be's gather_cols and attention_narrow (be->impl begins with the data ops' cuda_kvops, kvops.h). */
void cuda_install_narrow_ops(kvb_backend *be);

#endif
