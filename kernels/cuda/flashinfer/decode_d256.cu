/* decode_d256.cu — FlashInfer batch decode, head_dim 256 (decode.cuh). */
#include "kernels/cuda/flashinfer/decode.cuh"

extern "C" int kvb_fi_decode_d256(const kvb_fi_decode_args *a) { return kvb_fi::decode<256>(a); }
