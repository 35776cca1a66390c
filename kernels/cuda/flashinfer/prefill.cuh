/* prefill.cuh — FlashInfer's batch prefill over paged KV (its FA2 tensor-core kernel) for one head_dim, as kvbench
 * calls it (fi_inst.h): f16 Q, K/V and output, page size 1, NHD, one KV head per request, causal mask, no split of
 * the lists (prefill has queries enough to fill the GPU), query tiles of 64 and 128 packed rows (what FlashInfer's
 * plan picks for 64 queries or more on sm_80/sm_90; another tile is refused). Included by prefill_d64.cu and
 * prefill_d128.cu. Calls follow FlashInfer's csrc/batch_prefill.cu and batch_prefill_paged.cuh (plan, then run). */
#include <flashinfer/attention/default_prefill_params.cuh>
#include <flashinfer/attention/mask.cuh>
#include <flashinfer/attention/prefill.cuh>
#include <flashinfer/attention/scheduler.cuh>
#include <flashinfer/attention/variants.cuh>
#include <flashinfer/page.cuh>

#include <exception>
#include <stdio.h>

#include "kernels/cuda/flashinfer/fi_inst.h"

namespace kvb_fi {

using PrefillParams = flashinfer::BatchPrefillPagedParams<half, half, half, int32_t>;
using PrefillVariant = flashinfer::DefaultAttention</*custom_mask=*/false, /*sliding_window=*/false,
                                                    /*soft_cap=*/false, /*alibi=*/false>;

template <uint32_t D>
int prefill(const kvb_fi_prefill_args *a) {
    using namespace flashinfer;
    const cudaStream_t s = (cudaStream_t)a->stream;
    try {
        PrefillPlanInfo plan;
        cudaError_t e = PrefillPlan<int32_t>(
            /*float_buffer=*/nullptr, 0, a->int_ws, a->int_ws_h, a->int_ws_bytes, plan,
            const_cast<int32_t *>(a->qo_indptr_h), const_cast<int32_t *>(a->kv_indptr_h),
            (uint32_t)(a->n_req * a->n_q), (uint32_t)a->n_req, (uint32_t)a->group, /*num_kv_heads=*/1, D, D,
            /*page_size=*/1, /*enable_cuda_graph=*/false, /*sizeof_dtype_o=*/2, /*window_left=*/-1,
            /*fixed_split_size=*/-1, /*disable_split_kv=*/true, /*num_colocated_ctas=*/0,
            /*uniform_q_len=*/a->n_q, s);
        if (e != cudaSuccess) {
            snprintf(a->err, a->err_len, "flashinfer prefill plan: %s", cudaGetErrorString(e));
            return -1;
        }
        if (plan.split_kv || (plan.cta_tile_q != 64 && plan.cta_tile_q != 128)) return 0;
        paged_kv_t<half, int32_t> kv(/*num_heads=*/1, /*page_size=*/1, D, (uint32_t)a->n_req, QKVLayout::kNHD,
                                     (half *)a->k_base, (half *)a->v_base, a->indices, a->kv_indptr,
                                     a->last_page_len);
        PrefillParams p((half *)a->q_h, kv, /*maybe_custom_mask=*/nullptr, a->qo_indptr,
                        /*maybe_mask_indptr=*/nullptr, /*maybe_q_rope_offset=*/nullptr, (half *)a->out_h, a->lse2,
                        /*maybe_alibi_slopes=*/nullptr, (uint32_t)a->group, /*q_stride_n=*/(int32_t)(a->group * D),
                        /*q_stride_h=*/(int32_t)D, /*window_left=*/-1, /*logits_soft_cap=*/0.f, a->scale,
                        /*rope_scale=*/1.f, /*rope_theta=*/1e4f);
        p.request_indices = GetPtrFromBaseOffset<int32_t>(a->int_ws, plan.request_indices_offset);
        p.qo_tile_indices = GetPtrFromBaseOffset<int32_t>(a->int_ws, plan.qo_tile_indices_offset);
        p.kv_tile_indices = GetPtrFromBaseOffset<int32_t>(a->int_ws, plan.kv_tile_indices_offset);
        p.o_indptr = GetPtrFromBaseOffset<int32_t>(a->int_ws, plan.o_indptr_offset);
        p.kv_chunk_size_ptr = GetPtrFromBaseOffset<int32_t>(a->int_ws, plan.kv_chunk_size_ptr_offset);
        p.padded_batch_size = (uint32_t)plan.padded_batch_size;
        p.max_total_num_rows = (uint32_t)plan.total_num_rows;
        if (plan.cta_tile_q == 128)
            e = BatchPrefillWithPagedKVCacheDispatched</*SAME_KV_STRIDES=*/true, 128, D, D, PosEncodingMode::kNone,
                                                       /*fp16_qk_reduction=*/false, MaskMode::kCausal,
                                                       PrefillVariant>(p, nullptr, nullptr, /*enable_pdl=*/false, s);
        else
            e = BatchPrefillWithPagedKVCacheDispatched</*SAME_KV_STRIDES=*/true, 64, D, D, PosEncodingMode::kNone,
                                                       /*fp16_qk_reduction=*/false, MaskMode::kCausal,
                                                       PrefillVariant>(p, nullptr, nullptr, /*enable_pdl=*/false, s);
        if (e != cudaSuccess) {
            snprintf(a->err, a->err_len, "flashinfer prefill: %s", cudaGetErrorString(e));
            return -1;
        }
        return 1;
    } catch (const std::exception &x) { /* FlashInfer reports what it cannot do by throwing */
        snprintf(a->err, a->err_len, "flashinfer prefill: %s", x.what());
        return -1;
    }
}

} // namespace kvb_fi
