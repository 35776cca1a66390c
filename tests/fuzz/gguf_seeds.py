#!/usr/bin/env python3
"""Seed GGUF files for the fuzz_gguf harness, written at fuzz time (scripts/fuzz.sh) so the repository holds no
binary: a header-only file and a tiny llama model (four metadata keys, a two-token vocabulary, one 4x2 f32
tensor), then one seed per hardening case the reader, the config check and the tokenizer refuse or survive:
many keys, a duplicate key and tensor name, overlapping tensor data, a tensor whose byte count overflows 64 bits,
control characters in a key, NaN / zero hyperparameters, and small BPE and SentencePiece vocabularies with long
words.   python3 tests/fuzz/gguf_seeds.py DIR"""
import os, struct, sys


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def kv_u32(k, v):
    return gstr(k) + struct.pack("<II", 4, v)


def kv_f32(k, v):
    return gstr(k) + struct.pack("<If", 6, v)


def kv_str(k, v):
    return gstr(k) + struct.pack("<I", 8) + gstr(v)


def kv_arr_str(k, xs):
    return gstr(k) + struct.pack("<IIQ", 9, 8, len(xs)) + b"".join(gstr(x) for x in xs)


def kv_arr_f32(k, xs):
    return gstr(k) + struct.pack("<IIQ", 9, 6, len(xs)) + struct.pack("<%df" % len(xs), *xs)


def kv_arr_i32(k, xs):
    return gstr(k) + struct.pack("<IIQ", 9, 5, len(xs)) + struct.pack("<%di" % len(xs), *xs)


def tensor_info(name, ne, ggml_type, offset):
    return gstr(name) + struct.pack("<I", len(ne)) + struct.pack("<%dQ" % len(ne), *ne) + struct.pack("<IQ", ggml_type, offset)


def gguf(kv, tensors=(), data=b""):
    """tensors: (name, ne, type, offset) tuples; data: the data section."""
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv)) + b"".join(kv)
    head += b"".join(tensor_info(*t) for t in tensors)
    if tensors:
        head += b"\0" * (-len(head) % 32)
    return head + data


def tiny():
    kv = [kv_str("general.architecture", "llama"),
          gstr("general.alignment") + struct.pack("<II", 4, 32),
          kv_u32("llama.block_count", 1),
          kv_arr_str("tokenizer.ggml.tokens", ["a", "b"])]
    return gguf(kv, [("token_embd.weight", (4, 2), 0, 0)], struct.pack("<8f", *range(8)))


def llama_hparams(eps, base):
    return [kv_str("general.architecture", "llama"), kv_u32("llama.block_count", 1), kv_u32("llama.context_length", 64),
            kv_u32("llama.embedding_length", 8), kv_u32("llama.feed_forward_length", 16),
            kv_u32("llama.attention.head_count", 2), kv_f32("llama.attention.layer_norm_rms_epsilon", eps),
            kv_f32("llama.rope.freq_base", base)]


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    f32 = struct.pack("<8f", *range(8))
    seeds = {
        "header-only.gguf": b"GGUF" + struct.pack("<IQQ", 3, 0, 0),
        "tiny.gguf": tiny(),
        "many-keys.gguf": gguf([kv_u32("k.%05d" % i, i) for i in range(3000)]),
        "dup-key.gguf": gguf([kv_u32("k.a", 1), kv_u32("k.b", 2), kv_u32("k.a", 3)]),
        "dup-tensor.gguf": gguf([], [("t.a", (8,), 0, 0), ("t.a", (8,), 0, 32)], f32 * 2),
        "overlap.gguf": gguf([], [("t.a", (16,), 0, 0), ("t.b", (8,), 0, 32)], f32 * 2),
        "huge-tensor.gguf": gguf([], [("t.huge", (1 << 31, 1 << 31), 0, 0)], f32),
        "ctrl-key.gguf": gguf([kv_u32("evil\x1b[2J\x07.key", 1), kv_str("v", "red\x1b[31m\xc2\x9b")],
                              [("t\x1b]0;x\x07", (8,), 0, 0)], f32),
        "nan-eps.gguf": gguf(llama_hparams(float("nan"), 10000.0)),
        "zero-rope-base.gguf": gguf(llama_hparams(1e-5, 0.0)),
        "bpe-vocab.gguf": gguf([kv_str("tokenizer.ggml.model", "gpt2"), kv_str("tokenizer.ggml.pre", "smollm"),
                                kv_arr_str("tokenizer.ggml.tokens", ["<|im_start|>", "h", "e", "l", "o", "he", "ll",
                                                                     "hell", "hello", "\u0120", "w", "r", "d", "1"]),
                                kv_arr_i32("tokenizer.ggml.token_type", [3] + [1] * 13),
                                kv_arr_str("tokenizer.ggml.merges", ["h e", "l l", "he ll", "hell o"])]),
        "spm-vocab.gguf": gguf([kv_str("tokenizer.ggml.model", "llama"),
                                kv_arr_str("tokenizer.ggml.tokens", ["<unk>", "<s>", "</s>", "\u2581", "a", "b",
                                                                     "\u2581a", "ab", "\u2581ab", "<0x63>"]),
                                kv_arr_f32("tokenizer.ggml.scores", [0, 0, 0, -3, -4, -4, -1, -2, -0.5, 0]),
                                kv_arr_i32("tokenizer.ggml.token_type", [2, 3, 3, 1, 1, 1, 1, 1, 1, 6])]),
    }
    for name, data in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
