/* decode_d128.cu — FlashInfer batch decode, head_dim 128 (decode.cuh). */
#include "kernels/cuda/flashinfer/decode.cuh"

extern "C" int kvb_fi_decode_d128(const kvb_fi_decode_args *a) { return kvb_fi::decode<128>(a); }
