/* prefill_d128.cu — FlashInfer batch prefill (FA2, causal), head_dim 128 (prefill.cuh). */
#include "kernels/cuda/flashinfer/prefill.cuh"

extern "C" int kvb_fi_prefill_d128(const kvb_fi_prefill_args *a) { return kvb_fi::prefill<128>(a); }
