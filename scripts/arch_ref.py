#!/usr/bin/env python3
"""llama.cpp's reference figures for every architecture kvbench implements -> tests/fixtures/arch_ref.json.

The models are small seeded random-weight GGUFs (Llama 3.1's rope_freqs, linear and YaRN RoPE scaling, qwen3,
gemma3 with local and global layers, llama with a sliding window). They are written by the test itself,
`test_arch_llamacpp --write DIR`, so the files llama.cpp runs here are byte for byte the ones CI regenerates
from the seeds (one writer, in C: CI needs neither Python nor llama.cpp). Per model and prompt the fixture
records llama.cpp's prompt ids, all last-position logits (the byte vocabulary has 259) and a greedy continuation
with its top-2 margins, run with an f32 KV cache, no flash attention, batches of 64.

Prompts: one shorter than every sliding window and one longer (gemma3's window is 24 tokens, its long prompt
~150); the llama-with-window model's prompt and continuation stay within its window, since llama.cpp's llama
graph ignores `llama.attention.sliding_window` (see tests/test_arch_llamacpp.c).

  python3 scripts/arch_ref.py [--build build-md] [--out tests/fixtures/arch_ref.json]

Needs `pip install llama-cpp-python numpy`.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N_GREEDY = 20
SHORT = "The cat sat on the mat."
LONG = ("In the quiet hour after lunch the old ferryman counted three jars of plum jam, "
        "then wrote down the timetable of the northern line beside the frozen canal; nobody noticed.")


def prompts_for(name):
    return [SHORT] if name == "llama-swa" else [SHORT, LONG]


def reference(llm, np, text):
    ids = llm.tokenize(text.encode(), add_bos=True, special=True)
    llm.reset()
    llm.eval(ids)
    last = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
    logits, greedy, margins = last, [], []
    for _ in range(N_GREEDY):
        order = np.argsort(-logits, kind="stable")[:2]
        tok = int(order[0])
        greedy.append(tok)
        margins.append(round(float(logits[order[0]] - logits[order[1]]), 6))
        llm.eval([tok])
        logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
    return {"text": text, "prompt_ids": ids, "logits": [round(float(v), 6) for v in last], "greedy": greedy,
            "margins": margins}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build-md"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "arch_ref.json"))
    args = ap.parse_args()
    try:
        import llama_cpp
        import numpy as np
    except ImportError as e:
        print(f"arch_ref: {e} (pip install llama-cpp-python numpy)", file=sys.stderr)
        return 3
    with tempfile.TemporaryDirectory() as tmp:
        paths = subprocess.run([os.path.join(args.build, "test_arch_llamacpp"), "--write", tmp], check=True,
                               capture_output=True, text=True).stdout.split()
        models = []
        for path in paths:
            name = os.path.basename(path)[:-len(".gguf")]
            llm = llama_cpp.Llama(path, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=2, type_k=0, type_v=0,
                                  flash_attn=False, logits_all=True, verbose=False)
            recs = [reference(llm, np, t) for t in prompts_for(name)]
            for r in recs:
                print(f"{name}: {len(r['prompt_ids'])} tokens, min greedy margin {min(r['margins']):.4f}",
                      file=sys.stderr)
            models.append({"name": name, "prompts": recs})
            del llm
    out = {"engine": "llama.cpp", "llama_cpp_python": llama_cpp.__version__, "cpu": platform.processor(),
           "settings": {"kv": "f32", "flash_attn": False, "n_batch": 64, "n_ubatch": 64, "threads": 2},
           "n_greedy": N_GREEDY, "models": models}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
