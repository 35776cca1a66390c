#!/usr/bin/env python3
"""Seed GGUF files for the fuzz_gguf harness, written at fuzz time (scripts/fuzz.sh) so the repository holds no
binary: a header-only file and a tiny llama model (four metadata keys, a two-token vocabulary, one 4x2 f32
tensor).   python3 tests/fuzz/gguf_seeds.py DIR"""
import os, struct, sys


def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def tiny():
    kv = [gstr("general.architecture") + struct.pack("<I", 8) + gstr("llama"),
          gstr("general.alignment") + struct.pack("<II", 4, 32),
          gstr("llama.block_count") + struct.pack("<II", 4, 1),
          gstr("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 2) + gstr("a") + gstr("b")]
    tensor = gstr("token_embd.weight") + struct.pack("<IQQIQ", 2, 4, 2, 0, 0)
    head = b"GGUF" + struct.pack("<IQQ", 3, 1, len(kv)) + b"".join(kv) + tensor
    head += b"\0" * (-len(head) % 32)
    return head + struct.pack("<8f", *range(8))


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "header-only.gguf"), "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, 0, 0))
    with open(os.path.join(out, "tiny.gguf"), "wb") as f:
        f.write(tiny())


if __name__ == "__main__":
    main()
