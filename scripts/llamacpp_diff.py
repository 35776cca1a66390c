#!/usr/bin/env python3
"""Op-by-op comparison of kvbench's forward pass with llama.cpp's (numerics diagnosis for issue 2).

Runs one prompt through llama.cpp (llama-cpp-python, f32 KV cache, no flash attention, the settings of
scripts/llamacpp_ref.py) with a graph callback that records every named intermediate tensor, and through
`kvbench generate --dump-activations`, then prints for each layer and op the max |difference| and how
many elements differ at all, in graph order, so the first op that is not bit-identical stands out.

  python3 scripts/llamacpp_diff.py --prompt-file tests/fixtures/prompts/short_question.txt [--layers 0-3]

--variance runs llama.cpp alone instead: how far its own last-position logits move when only the
arithmetic order changes (flash attention on, the prompt one token at a time, other batch and thread
counts), which is why matching it to 2e-2 takes bit-exactness.

llama.cpp runs its K-quant matmuls on the ggml_vec_dot_* path that kvbench follows (no repacked weights,
GGML_CPU_TILED_MM=0). Bit-identical ops need an AVX2 build of llama.cpp: an AVX-512 one (pip's default build on
an AVX-512 machine) sums in 16 lanes, and attention and every op after it part in the last bit.

Needs `pip install llama-cpp-python numpy` and a built ./build/kvbench (or --kvbench PATH).
"""
import argparse
import ctypes
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODEL = os.path.join(os.environ.get("KVB_MODEL_DIR") or os.path.expanduser("~/.cache/kvbench/models"),
                             "SmolLM2-135M-Instruct.Q4_1.gguf")
# graph order within a layer; llama.cpp's kq/kq_soft_max/kqv have no counterpart in the engine's fused op
# (gemma3 adds Qcur_normed/Kcur_normed, attn_post_norm, ffn_geglu, ffn_post_norm; its ffn_inp is llama.cpp's sa_out)
OPS = ["attn_norm", "Qcur_normed", "Kcur_normed", "Qcur", "Kcur", "Vcur", "kqv_out", "attn_out", "attn_post_norm",
       "ffn_inp", "ffn_norm", "ffn_gate", "ffn_up", "ffn_swiglu", "ffn_geglu", "ffn_out", "ffn_post_norm", "l_out"]
ALIAS = {"ffn_inp": ["sa_out"]}  # kvbench's name -> llama.cpp's other names for it
FINAL = ["result_norm", "result_output"]


class GgmlTensor(ctypes.Structure):  # ggml.h's struct ggml_tensor (GGML_MAX_DIMS 4, 64-byte op params, 10 srcs)
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64),
                ("extra", ctypes.c_void_p), ("padding", ctypes.c_char * 8)]


def llama_activations(model, text, n_threads):
    import llama_cpp as L
    got = {}
    wanted = set(OPS) | set(FINAL) | {n for names in ALIAS.values() for n in names}

    @L.ggml_backend_sched_eval_callback
    def cb(ptr, ask, _user):
        t = GgmlTensor.from_address(ptr)
        name = t.name.decode()
        base, _, layer = name.rpartition("-")
        if not (name in wanted or (base in wanted and layer.isdigit())):
            return False if ask else True
        if ask:
            return True
        if t.type != 0:  # F32 only
            return True
        shape = tuple(reversed(list(t.ne)))
        strides = tuple(reversed(list(t.nb)))
        base_arr = np.ctypeslib.as_array((ctypes.c_float * 1).from_address(t.data))
        a = np.lib.stride_tricks.as_strided(base_arr, shape=shape, strides=strides)
        got[name] = np.array(a, dtype=np.float32).reshape(-1, t.ne[0] * (t.ne[1] if base in ("Qcur", "Kcur", "Vcur") else 1))
        return True

    @L.llama_log_callback
    def quiet(_level, _text, _user):
        pass

    L.llama_log_set(quiet, None)
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    # K-quant matmuls on llama.cpp's ggml_vec_dot_* path, as kvbench and scripts/llamacpp_ref.py's gemma set:
    # no repacked Q4_K panels, no tiled GEMM (GGML_CPU_TILED_MM=0, set in main before the first matmul)
    mp.use_extra_bufts = False
    m = L.llama_model_load_from_file(model.encode(), mp)
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = 8192, 512, 512
    cp.n_threads = cp.n_threads_batch = n_threads
    cp.type_k = cp.type_v = 0
    cp.flash_attn_type = 0
    cp.cb_eval = cb
    ctx = L.llama_init_from_model(m, cp)
    vocab = L.llama_model_get_vocab(m)
    buf = (L.llama_token * (len(text) + 16))()
    n = L.llama_tokenize(vocab, text, len(text), buf, len(buf), True, True)
    if n <= 0 or n > 512:
        sys.exit("llamacpp_diff: the prompt must be 1..512 tokens (one ubatch), got %d" % n)
    toks = (L.llama_token * n)(*buf[:n])
    if L.llama_decode(ctx, L.llama_batch_get_one(toks, n)) != 0:
        sys.exit("llamacpp_diff: llama_decode failed")
    L.llama_free(ctx)
    L.llama_model_free(m)
    return list(buf[:n]), got


def kvbench_activations(kvbench, model, prompt_file, n_threads):
    out = tempfile.mkdtemp(prefix="kvb-act-")
    cmd = [kvbench, "generate", "--model", model, "--prompt-file", prompt_file, "-n", "1", "--kv-type", "f32",
           "--threads", str(n_threads), "--dump-activations", out, "--ids", "--special"]
    r = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    if r.returncode:
        sys.exit("llamacpp_diff: kvbench failed: " + r.stderr.strip())
    ids = [int(x) for x in r.stderr.split("prompt ids")[1].split(":", 1)[1].split("\n")[0].split()]
    data = np.fromfile(os.path.join(out, "activations.f32"), dtype=np.float32)
    got = {}
    with open(os.path.join(out, "activations.tsv")) as f:
        next(f)
        for line in f:
            call, name, layer, off, rows, cols = line.split("\t")
            if call != "0":
                continue
            key = name if int(layer) < 0 else "%s-%s" % (name, layer)
            got[key] = data[int(off):int(off) + int(rows) * int(cols)].reshape(int(rows), int(cols))
    return ids, got


def llama_variance(model, prompt_file, n_threads):
    import llama_cpp
    base = dict(n_ctx=8192, n_batch=512, n_threads=n_threads, type_k=0, type_v=0, flash_attn=False, verbose=False)
    with open(prompt_file, "rb") as f:
        text = f.read()

    def last_logits(**change):
        llm = llama_cpp.Llama(model, **{**base, **change})
        ids = llm.tokenize(text, add_bos=True, special=True)
        llm.eval(ids)
        out = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))
        return len(ids), out.astype(np.float64)

    n, ref = last_logits()
    print("%d tokens; llama.cpp against itself (f32 KV, flash attention off, batch 512, %d threads)" % (n, n_threads))
    variants = [("flash attention on", dict(flash_attn=True)), ("batch 64", dict(n_batch=64)),
                ("1 thread", dict(n_threads=1)), ("one token at a time", dict(n_batch=1, n_ubatch=1))]
    for label, change in variants:
        if label == "one token at a time" and n > 600:
            continue  # minutes of decode calls
        print("  %-22s max |d logit| %.4f" % (label, np.abs(last_logits(**change)[1] - ref).max()))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt-file", required=True)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--kvbench", default=os.path.join(ROOT, "build", "kvbench"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", default="all", help="e.g. 0-3 (default all)")
    ap.add_argument("--variance", action="store_true", help="llama.cpp against itself under other orders")
    a = ap.parse_args()
    os.environ.setdefault("GGML_CPU_TILED_MM", "0")
    if a.variance:
        return llama_variance(a.model, a.prompt_file, a.threads)
    with open(a.prompt_file, "rb") as f:
        text = f.read()
    ids_l, ref = llama_activations(a.model, text, a.threads)
    ids_k, ours = kvbench_activations(a.kvbench, a.model, a.prompt_file, a.threads)
    if ids_l != ids_k:
        sys.exit("llamacpp_diff: token ids differ; compare tokenization first")
    n_layer = 1 + max(int(k.rpartition("-")[2]) for k in ours if k.rpartition("-")[2].isdigit())
    lo, hi = (0, n_layer - 1) if a.layers == "all" else map(int, a.layers.split("-"))
    print("%d tokens; max |kvbench - llama.cpp| and elements that differ, per op" % len(ids_l))
    keys = ["%s-%d" % (op, l) for l in range(lo, hi + 1) for op in OPS] + FINAL
    for k in keys:
        base, _, layer = k.rpartition("-")
        for other in ALIAS.get(base, []):
            if k not in ref and "%s-%s" % (other, layer) in ref:
                ref[k] = ref["%s-%s" % (other, layer)]
        if k not in ref and k not in ours:
            continue  # an op of another architecture
        if k not in ref or k not in ours:
            print("  %-16s missing on %s" % (k, "llama.cpp" if k not in ref else "kvbench"))
            continue
        r, o = ref[k], ours[k]
        if r.shape != o.shape and r.size == o.size:  # per head (llama.cpp's Qcur_normed) vs per token
            o = o.reshape(r.shape)
        if r.shape != o.shape:  # the last layer keeps only the output row after attention in llama.cpp
            o = o[-r.shape[0]:] if o.shape[1] == r.shape[1] else o
        if r.shape != o.shape:
            print("  %-16s shapes differ: llama.cpp %s, kvbench %s" % (k, r.shape, o.shape))
            continue
        d = np.abs(r.astype(np.float64) - o)
        print("  %-16s max %.3g  differ %d/%d" % (k, d.max(), int((r != o).sum()), r.size))


if __name__ == "__main__":
    main()
