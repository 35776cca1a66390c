#!/usr/bin/env python3
"""Reference figures from llama.cpp (llama-cpp-python) for tests/test_model_llamacpp.c.

For every prompt in tests/fixtures/prompts/ it records what llama.cpp computes with an f32 KV
cache: the prompt's token ids, a summary of the last-position logits (top 40, every 192nd id,
mean and std) and 64 greedy tokens with the top-2 logit margin at each step. CI compares the
engine against tests/fixtures/llamacpp_ref.json, so it needs no llama.cpp.

  python3 scripts/llamacpp_ref.py [--model PATH] [--out tests/fixtures/llamacpp_ref.json]
  python3 scripts/llamacpp_ref.py --make-prompts   # (re)write the generated prompt files only

Needs `pip install llama-cpp-python` (and jinja2 and gguf for --make-prompts).
"""
import argparse
import hashlib
import json
import os
import random
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPTS = os.path.join(ROOT, "tests", "fixtures", "prompts")
DEFAULT_MODEL = os.path.join(os.environ.get("KVB_MODEL_DIR") or os.path.expanduser("~/.cache/kvbench/models"),
                             "SmolLM2-135M-Instruct.Q4_1.gguf")
N_GREEDY = 64
SAMPLE_STRIDE = 192

# Seeded prose: our own sentence templates, so the long prompts are original text.
SUBJECTS = ["The engineer", "A tired librarian", "The old ferryman", "Our neighbour", "The new intern",
            "A retired pilot", "The village baker", "The museum guard", "A young botanist", "The night nurse"]
VERBS = ["noticed", "wrote down", "argued about", "forgot", "measured", "repaired", "painted", "explained",
         "counted", "photographed"]
OBJECTS = ["the broken clock in the tower", "a letter from the harbour office", "the price of winter coal",
           "the path of the comet", "three jars of plum jam", "the map of the river delta",
           "an unfinished violin", "the timetable of the northern line", "a box of glass negatives",
           "the recipe for rye bread"]
PLACES = ["before the market opened", "during the long storm", "on the first day of spring",
          "while the kettle boiled", "after the last train had gone", "in the quiet hour after lunch",
          "beside the frozen canal", "at the edge of the orchard"]
LINKS = ["Later that week,", "Nobody expected that", "For a while,", "In the end,", "By the next morning,",
         "To everyone's surprise,", "Meanwhile,", "As usual,"]


def prose(seed, n_sentences):
    rng = random.Random(seed)
    out, para = [], []
    for i in range(n_sentences):
        s = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(PLACES)}."
        if i % 3 == 1:
            s = f"{rng.choice(LINKS)} {s[0].lower()}{s[1:]}"
        para.append(s)
        if len(para) == rng.randint(4, 7):
            out.append(" ".join(para))
            para = []
    if para:
        out.append(" ".join(para))
    return "\n\n".join(out) + "\n\nSummarise the story above in two sentences.\n"


def make_prompts(model_path):
    with open(os.path.join(PROMPTS, "prose_2000.txt"), "w") as f:
        f.write(prose(2000, 110))
    with open(os.path.join(PROMPTS, "prose_4000.txt"), "w") as f:
        f.write(prose(4000, 225))
    shutil.copyfile(os.path.join(ROOT, "kernels", "cpu", "pool.c"), os.path.join(PROMPTS, "code_c.txt"))
    import jinja2
    from gguf import GGUFReader
    r = GGUFReader(model_path)
    field = r.fields["tokenizer.chat_template"]
    tmpl = bytes(field.parts[field.data[0]]).decode()
    messages = [
        {"role": "user", "content": "I have three apples and buy five more. How many do I have?"},
        {"role": "assistant", "content": "You have eight apples."},
        {"role": "user", "content": "And if I give two of them to my sister, how many are left?"},
    ]
    text = jinja2.Environment().from_string(tmpl).render(messages=messages, add_generation_prompt=True)
    with open(os.path.join(PROMPTS, "chat_multiturn.txt"), "w") as f:
        f.write(text)


def cpu_summary():
    """The reference build's SIMD level decides its float order (AVX-512 builds sum in 16 lanes), so the
    fixtures say which CPU made them; kvbench follows the AVX2+FMA order on every machine."""
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
    except OSError:
        return "unknown"
    flags = set()
    name = ""
    for line in info.splitlines():
        if line.startswith("flags") and not flags:
            flags = set(line.split(":", 1)[1].split())
        if line.startswith("model name") and not name:
            name = line.split(":", 1)[1].strip()
    simd = [f for f in ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx_vnni") if f in flags]
    return f"{name} ({' '.join(simd)})"


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "llamacpp_ref.json"))
    ap.add_argument("--make-prompts", action="store_true")
    args = ap.parse_args()
    if args.make_prompts:
        make_prompts(args.model)
        return 0
    try:
        import llama_cpp
        import numpy as np
    except ImportError as e:
        print(f"llamacpp_ref: {e} (pip install llama-cpp-python numpy)", file=sys.stderr)
        return 3
    llm = llama_cpp.Llama(args.model, n_ctx=8192, n_batch=512, n_threads=2, type_k=0, type_v=0,
                          flash_attn=False, logits_all=True, verbose=False)
    eog = {llm.token_eos()}
    records = []
    for name in sorted(os.listdir(PROMPTS)):
        with open(os.path.join(PROMPTS, name), "rb") as f:
            text = f.read()
        ids = llm.tokenize(text, add_bos=True, special=True)
        llm.reset()
        llm.eval(ids)
        last = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
        top = np.argsort(-last, kind="stable")[:40]
        greedy, margins = [], []
        logits = last
        for _ in range(N_GREEDY):
            order = np.argsort(-logits, kind="stable")[:2]
            tok = int(order[0])
            greedy.append(tok)
            margins.append(round(float(logits[order[0]] - logits[order[1]]), 5))
            if tok in eog:
                break
            llm.eval([tok])
            logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
        records.append({
            "name": name,
            "n_prompt": len(ids),
            "prompt_ids": ids,
            "top_ids": [int(i) for i in top],
            "top_logits": [round(float(last[i]), 5) for i in top],
            "sample_logits": [round(float(v), 5) for v in last[::SAMPLE_STRIDE]],
            "logit_mean": round(float(last.mean()), 6),
            "logit_std": round(float(last.std()), 6),
            "greedy": greedy,
            "margins": margins,
        })
        print(f"{name}: {len(ids)} tokens, min greedy margin {min(margins):.4f}", file=sys.stderr)
    out = {
        "engine": "llama.cpp",
        "llama_cpp_python": llama_cpp.__version__,
        "cpu": cpu_summary(),
        "model": os.path.basename(args.model),
        "model_sha256": sha256(args.model),
        "settings": {"kv": "f32", "flash_attn": False, "n_batch": 512, "threads": 2, "add_special": True,
                     "parse_special": True},
        "sample_stride": SAMPLE_STRIDE,
        "n_greedy": N_GREEDY,
        "prompts": records,
    }
    with open(args.out, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
