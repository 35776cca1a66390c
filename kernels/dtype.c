/* dtype.c — sizes and names of ggml's tensor types (dtype.h). */
#include "kernels/dtype.h"

uint32_t ggml_block_elems(ggml_type t) {
    switch (t) {
    case GGML_T_F32: case GGML_T_F16: case GGML_T_BF16: return 1;
    case GGML_T_Q4_0: case GGML_T_Q4_1: case GGML_T_Q5_0: case GGML_T_Q5_1: case GGML_T_Q8_0: case GGML_T_IQ4_NL:
        return 32;
    case GGML_T_Q2_K: case GGML_T_Q3_K: case GGML_T_Q4_K: case GGML_T_Q5_K: case GGML_T_Q6_K: case GGML_T_IQ4_XS:
        return 256;
    default: return 0;
    }
}

uint32_t ggml_block_bytes(ggml_type t) {
    switch (t) {
    case GGML_T_F32: return 4;
    case GGML_T_F16: case GGML_T_BF16: return 2;
    case GGML_T_Q4_0: return 18;
    case GGML_T_Q4_1: return 20;
    case GGML_T_Q5_0: return 22;
    case GGML_T_Q5_1: return 24;
    case GGML_T_Q8_0: return 34;
    case GGML_T_IQ4_NL: return 18;
    case GGML_T_Q2_K: return 84;
    case GGML_T_Q3_K: return 110;
    case GGML_T_Q4_K: return 144;
    case GGML_T_Q5_K: return 176;
    case GGML_T_Q6_K: return 210;
    case GGML_T_IQ4_XS: return 136;
    default: return 0;
    }
}

uint64_t ggml_row_bytes(ggml_type t, uint64_t n) {
    uint32_t be = ggml_block_elems(t);
    return be ? n / be * ggml_block_bytes(t) : 0;
}

const char *ggml_type_name(ggml_type t) {
    switch (t) {
    case GGML_T_F32: return "F32";
    case GGML_T_F16: return "F16";
    case GGML_T_BF16: return "BF16";
    case GGML_T_Q4_0: return "Q4_0";
    case GGML_T_Q4_1: return "Q4_1";
    case GGML_T_Q5_0: return "Q5_0";
    case GGML_T_Q5_1: return "Q5_1";
    case GGML_T_Q8_0: return "Q8_0";
    case GGML_T_Q2_K: return "Q2_K";
    case GGML_T_Q3_K: return "Q3_K";
    case GGML_T_Q4_K: return "Q4_K";
    case GGML_T_Q5_K: return "Q5_K";
    case GGML_T_Q6_K: return "Q6_K";
    case GGML_T_IQ4_NL: return "IQ4_NL";
    case GGML_T_IQ4_XS: return "IQ4_XS";
    default: return "unknown";
    }
}
