#!/usr/bin/env python3
"""Test models made here: the second model (Qwen2.5-Coder-0.5B-Instruct, scripts/fetch-model.sh
qwen2.5-coder-0.5b) requantized by llama.cpp's own quantizer (llama_model_quantize through
llama-cpp-python, allow_requantize), so the K-quants and I-quants kvbench reads are tested on files
llama.cpp itself wrote.

  python3 scripts/requantize.py [q4_k_m|q3_k_m|iq4_xs|all]   # default all

Each file goes to the model cache ($KVB_MODEL_DIR or ~/.cache/kvbench/models) as
Qwen2.5-Coder-0.5B-Instruct.<TYPE>.gguf; the input's sha256 is checked first and the output's after,
against the figures below (llama-cpp-python 0.3.36's quantizer, 2 threads). Rows of 896 values (not a
multiple of 256) take llama.cpp's fallback type: Q5_0 under Q4_K_M, IQ4_NL under Q3_K_M and IQ4_XS; the
4864-wide ffn_down rows and the embeddings get the K/I types. Idempotent: a file already there with the
right sha256 is kept. A different llama.cpp may write other bytes: the script then says so and exits 1
(the file is kept beside, as NAME.gguf.new, for a look). Needs `pip install llama-cpp-python`.
"""
import ctypes
import hashlib
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_DIR = os.environ.get("KVB_MODEL_DIR") or os.path.expanduser("~/.cache/kvbench/models")
SOURCE = ("Qwen2.5-Coder-0.5B-Instruct.gguf", "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32")
# name -> (llama_ftype, output file, sha256 of the output)
RECIPES = {
    "q4_k_m": (15, "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf", "2af77c2d2582f43afd59e659e427600c73e9ef83a8a49ea320d134bbce498a7a"),
    "q3_k_m": (12, "Qwen2.5-Coder-0.5B-Instruct.Q3_K_M.gguf", "5085c93a88883b707c589c4afb84701e848d9d96dbe672a7b1feb57b217b1ed3"),
    "iq4_xs": (30, "Qwen2.5-Coder-0.5B-Instruct.IQ4_XS.gguf", "d41453d1fe843c5690aeb9fc6ec05a3145dd3a4e5a66f55244370e6358cf2a6b"),
}


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def make(name):
    ftype, out_name, want = RECIPES[name]
    src, dst = os.path.join(MODEL_DIR, SOURCE[0]), os.path.join(MODEL_DIR, out_name)
    if os.path.exists(dst) and sha256(dst) == want:
        print(f"requantize: {dst} (already there)", file=sys.stderr)
        return 0
    if not os.path.exists(src):
        print(f"requantize: {src} missing (scripts/fetch-model.sh qwen2.5-coder-0.5b)", file=sys.stderr)
        return 1
    if sha256(src) != SOURCE[1]:
        print(f"requantize: {src} is not the file this recipe starts from (sha256 differs)", file=sys.stderr)
        return 1
    import llama_cpp

    # llama.cpp's per-tensor log (a thousand lines) silenced; a failure is still reported below
    quiet = llama_cpp.llama_log_callback(lambda level, text, user: None)
    llama_cpp.llama_log_set(quiet, ctypes.c_void_p())
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype, p.allow_requantize, p.nthread = ftype, True, 2
    tmp = dst + ".new"
    if llama_cpp.llama_model_quantize(src.encode(), tmp.encode(), ctypes.byref(p)) != 0:
        print(f"requantize: llama_model_quantize failed for {name}", file=sys.stderr)
        return 1
    got = sha256(tmp)
    if got != want:
        print(f"requantize: {tmp}: sha256 {got}, the recipe expects {want} (llama-cpp-python "
              f"{llama_cpp.__version__}; 0.3.36 wrote the expected bytes)", file=sys.stderr)
        return 1
    os.replace(tmp, dst)
    print(f"requantize: {dst}", file=sys.stderr)
    return 0


def main():
    which = sys.argv[1] if len(sys.argv) > 1 else "all"
    if which in ("-h", "--help"):
        print(__doc__)
        return 0
    names = list(RECIPES) if which == "all" else [which]
    if any(n not in RECIPES for n in names):
        print(f"requantize: unknown recipe '{which}' ({', '.join(RECIPES)}, all)", file=sys.stderr)
        return 2
    try:
        import llama_cpp  # noqa: F401
    except ImportError as e:
        print(f"requantize: {e} (pip install llama-cpp-python)", file=sys.stderr)
        return 3
    return max(make(n) for n in names)


if __name__ == "__main__":
    sys.exit(main())
