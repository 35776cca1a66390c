/* decode.cuh — FlashInfer's batch decode over paged KV (its CUDA-core kernel, split-KV with its own merge) for one
 * head_dim, as kvbench calls it (fi_inst.h): f32 queries, f16 outputs (its merge's type), f16 K/V, page size 1, NHD, one KV head per
 * request, no positional encoding, no window, no soft cap. Included by decode_d64.cu, decode_d128.cu, decode_d256.cu
 * so each head_dim compiles alone. Calls follow FlashInfer's csrc/batch_decode.cu (plan, then run). */
#include <flashinfer/attention/decode.cuh>
#include <flashinfer/attention/default_decode_params.cuh>
#include <flashinfer/attention/scheduler.cuh>
#include <flashinfer/attention/variants.cuh>
#include <flashinfer/page.cuh>

#include <exception>
#include <stdio.h>

#include "kernels/cuda/flashinfer/fi_inst.h"

namespace kvb_fi {

using Params = flashinfer::BatchDecodeParams<float, half, half, int32_t>; /* its split merge takes f16 outputs */
using Variant = flashinfer::DefaultAttention</*custom_mask=*/false, /*sliding_window=*/false, /*soft_cap=*/false,
                                             /*alibi=*/false>;

template <uint32_t D>
int decode(const kvb_fi_decode_args *a) {
    using namespace flashinfer;
    const cudaStream_t s = (cudaStream_t)a->stream;
    try {
        DecodePlanInfo plan;
        cudaError_t e = cudaErrorInvalidValue;
        DISPATCH_GQA_GROUP_SIZE(a->group, GROUP_SIZE, {
            auto estimate = BatchDecodeWithPagedKVCacheWorkEstimationDispatched<GROUP_SIZE, D, PosEncodingMode::kNone,
                                                                               Variant, Params>;
            e = DecodePlan<D, PosEncodingMode::kNone, Variant, Params>(
                a->float_ws, a->float_ws_bytes, a->int_ws, a->int_ws_h, a->int_ws_bytes, plan,
                const_cast<int32_t *>(a->indptr_h), (uint32_t)a->n_req, (uint32_t)a->group, /*page_size=*/1,
                /*enable_cuda_graph=*/false, s, estimate);
        });
        if (e != cudaSuccess) {
            snprintf(a->err, a->err_len, "flashinfer decode plan: %s", cudaGetErrorString(e));
            return -1;
        }
        paged_kv_t<half, int32_t> kv(/*num_heads=*/1, /*page_size=*/1, D, (uint32_t)a->n_req, QKVLayout::kNHD,
                                     (half *)a->k_base, (half *)a->v_base, a->indices, a->indptr, a->last_page_len);
        Params p(const_cast<float *>(a->q), /*q_rope_offset=*/nullptr, kv, (half *)a->out_h, a->lse2,
                 /*maybe_alibi_slopes=*/nullptr, (uint32_t)a->group, /*q_stride_n=*/(int32_t)(a->group * D),
                 /*q_stride_h=*/(int32_t)D, /*window_left=*/-1, /*logits_soft_cap=*/0.f, a->scale,
                 /*rope_scale=*/1.f, /*rope_theta=*/1e4f);
        p.request_indices = GetPtrFromBaseOffset<int32_t>(a->int_ws, plan.request_indices_offset);
        p.kv_tile_indices = GetPtrFromBaseOffset<int32_t>(a->int_ws, plan.kv_tile_indices_offset);
        p.o_indptr = GetPtrFromBaseOffset<int32_t>(a->int_ws, plan.o_indptr_offset);
        p.kv_chunk_size_ptr = GetPtrFromBaseOffset<int32_t>(a->int_ws, plan.kv_chunk_size_ptr_offset);
        p.padded_batch_size = (uint32_t)plan.padded_batch_size;
        half *tmp_v = nullptr;
        float *tmp_s = nullptr;
        if (plan.split_kv) {
            tmp_v = GetPtrFromBaseOffset<half>(a->float_ws, plan.v_offset);
            tmp_s = GetPtrFromBaseOffset<float>(a->float_ws, plan.s_offset);
        }
        e = BatchDecodeWithPagedKVCacheDispatched<D, PosEncodingMode::kNone, Variant>(p, tmp_v, tmp_s,
                                                                                      /*enable_pdl=*/false, s);
        if (e != cudaSuccess) {
            snprintf(a->err, a->err_len, "flashinfer decode: %s", cudaGetErrorString(e));
            return -1;
        }
        return 0;
    } catch (const std::exception &x) { /* FlashInfer reports unsupported shapes by throwing */
        snprintf(a->err, a->err_len, "flashinfer decode: %s", x.what());
        return -1;
    }
}

} // namespace kvb_fi
