/* mma.cuh — the tensor-core building blocks the attention kernels share (attn_prefill.cu, attn_decode.cu):
 * mma.sync m16n8k16 (f16 in, f32 accumulate), ldmatrix, f16 packing. C++ (nvcc) only.
 *
 * Fragment layouts (PTX ISA, mma.m16n8k16 .f16 .f32; g = lane / 4, c = lane % 4):
 *   A (16x16, row major), 4 regs of 2 halves: {row g, cols 2c..2c+1}, {row g+8, same}, {row g, cols 8+2c..},
 *     {row g+8, cols 8+2c..}
 *   B (16x8, column major), 2 regs: {rows (k) 2c..2c+1, col (n) g}, {rows 8+2c.., col g}
 *   C (16x8 f32), 4 floats: (g, 2c), (g, 2c+1), (g+8, 2c), (g+8, 2c+1)
 * ldmatrix .x4: lanes 8i..8i+7 give the row addresses of 8x8 matrix i (16 bytes a row); register i of lane
 *   4g + c holds matrix i's {row g, cols 2c, 2c+1}, or with .trans its {rows 2c, 2c+1 of col g}. So a row-major
 *   [key][dim] tile gives, untransposed, the B fragment of Q K^T (n = key, k = dim), and transposed the B fragment
 *   of P V (k = key, n = dim). */
#ifndef KVB_CUDA_MMA_CUH
#define KVB_CUDA_MMA_CUH

#include <cuda_fp16.h>
#include <stdint.h>

__device__ __forceinline__ void mma_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                          uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    mma_16816(c, a[0], a[1], a[2], a[3], b0, b1);
}

/* four 8x8 b16 matrices from shared memory (addr: this lane's row, a shared-window address) */
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&d)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&d)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(addr));
}

__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *(const uint32_t *)&h;
}

__device__ __forceinline__ uint32_t pack_halves(__half lo, __half hi) {
    return (uint32_t)__half_as_ushort(lo) | ((uint32_t)__half_as_ushort(hi) << 16);
}

#endif
