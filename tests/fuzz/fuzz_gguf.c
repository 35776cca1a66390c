/* fuzz_gguf.c — the GGUF reader (engine/gguf.c) on arbitrary bytes: open from memory, then read every key
 * the model loader asks for, print the file as `kvbench inspect` does, check the model config (hyperparameters
 * included) and build the tokenizer and encode a text with it when the metadata has one. Never trusts the file:
 * any input must end in a clean error or a valid file. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf.h"
#include "engine/gguf_print.h"
#include "engine/model.h"
#include "engine/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static FILE *devnull;
    if (!devnull) devnull = fopen("/dev/null", "w");
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
    if (devnull) gguf_print(f, devnull, 4);
    kvb_config cfg;
    kvb_config_read(f, &cfg, err, sizeof err);
    kvb_tokenizer *t = tok_load(f, err, sizeof err);
    if (t) {
        static const char text[] = "<|im_start|>hello hellohellohello world 123 abababababab \xe2\x96\x81" "ab c\n";
        int32_t *ids = NULL;
        int n = 0;
        if (tok_encode(t, text, sizeof text - 1, 1, 1, &ids, &n, err, sizeof err) == 0) {
            char *back = NULL;
            if (tok_decode(t, ids, n, &back) == 0) free(back);
        }
        free(ids);
        tok_free(t);
    }
    gguf_close(f);
    return 0;
}
