/* decode_d64.cu — FlashInfer batch decode, head_dim 64 (decode.cuh). */
#include "kernels/cuda/flashinfer/decode.cuh"

extern "C" int kvb_fi_decode_d64(const kvb_fi_decode_args *a) { return kvb_fi::decode<64>(a); }
