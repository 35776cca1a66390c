/* fuzz_gguf.c — the GGUF reader (engine/gguf.c) on arbitrary bytes: open from memory, then read every key
 * the model loader asks for. Never trusts the file: any input must end in a clean error or a valid file. */
#include <stdint.h>
#include <stdlib.h>

#include "engine/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[256];
    gguf_file *f = gguf_open_mem(data, size, err, sizeof err);
    if (!f) return 0;
    uint32_t u;
    float x;
    int b;
    gguf_str s;
    const gguf_value *arr;
    gguf_get_u32(f, "llama.block_count", &u, err, sizeof err);
    gguf_get_f32(f, "llama.attention.layer_norm_rms_epsilon", &x, err, sizeof err);
    gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &b, err, sizeof err);
    gguf_get_str(f, "general.architecture", &s, err, sizeof err);
    gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_VT_STRING, &arr, err, sizeof err);
    gguf_find_tensor(f, "token_embd.weight");
    gguf_close(f);
    return 0;
}
