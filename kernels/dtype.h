/* dtype.h — the element types kernels read and write: IEEE half and bfloat16 with their conversions (shared
 * by the quant formats, the KV store and the kernels), the KV rows' storage type, and ggml's tensor types
 * (the GGUF block formats: engine/gguf.h reads them, kernels/cpu/quant.h computes with them). */
#ifndef KVB_DTYPE_H
#define KVB_DTYPE_H

#include <stdint.h>
#include <string.h>
#if defined(__F16C__)
#include <immintrin.h>
#endif

typedef uint16_t kvb_f16;
typedef uint16_t kvb_bf16;

/* storage type of KV rows */
typedef enum { KVB_F32 = 0, KVB_F16 = 1 } kvb_dtype;

/* tensor types (ggml numbering); only these are accepted */
typedef enum {
    GGML_T_F32 = 0, GGML_T_F16 = 1, GGML_T_Q4_0 = 2, GGML_T_Q4_1 = 3,
    GGML_T_Q5_0 = 6, GGML_T_Q5_1 = 7, GGML_T_Q8_0 = 8, GGML_T_Q2_K = 10, GGML_T_Q3_K = 11, GGML_T_Q4_K = 12,
    GGML_T_Q5_K = 13, GGML_T_Q6_K = 14, GGML_T_IQ4_NL = 20, GGML_T_IQ4_XS = 23, GGML_T_BF16 = 30,
    GGML_T_Q8_1 = 9, GGML_T_Q8_K = 15 /* activations only (never in a file) */
} ggml_type;

/* Name of a tensor type ("Q4_1"; "unknown" for types not listed above). */
const char *ggml_type_name(ggml_type t);
/* Elements per block and bytes per block of a tensor type; 0 for unknown types. */
uint32_t ggml_block_elems(ggml_type t);
uint32_t ggml_block_bytes(ggml_type t);
/* Bytes of one row of n elements (n must be a multiple of the block size). */
uint64_t ggml_row_bytes(ggml_type t, uint64_t n);

static inline float kvb_f16_to_f32(kvb_f16 h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(mant & 0x400)) { mant <<= 1; exp--; }
            bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
#endif
}

/* round to nearest even, like the hardware instruction */
static inline kvb_f16 kvb_f32_to_f16(float f) {
#if defined(__F16C__)
    return _cvtss_sh(f, 0);
#else
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    int32_t exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
    uint32_t mant = x & 0x7fffff;
    if (((x >> 23) & 0xff) == 0xff) return (kvb_f16)(sign | 0x7c00 | (mant ? 0x200 : 0));
    if (exp >= 31) return (kvb_f16)(sign | 0x7c00);
    if (exp <= 0) {
        if (exp < -10) return (kvb_f16)sign;
        mant |= 0x800000;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = mant >> shift, rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (kvb_f16)(sign | half);
    }
    uint32_t h = sign | ((uint32_t)exp << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (kvb_f16)h;
#endif
}

static inline float kvb_bf16_to_f32(kvb_bf16 h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

#endif
