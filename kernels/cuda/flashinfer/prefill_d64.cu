/* prefill_d64.cu — FlashInfer batch prefill (FA2, causal), head_dim 64 (prefill.cuh). */
#include "kernels/cuda/flashinfer/prefill.cuh"

extern "C" int kvb_fi_prefill_d64(const kvb_fi_prefill_args *a) { return kvb_fi::prefill<64>(a); }
