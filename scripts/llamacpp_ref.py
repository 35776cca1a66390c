#!/usr/bin/env python3
"""Reference figures from llama.cpp (llama-cpp-python) for tests/test_model_llamacpp.c.

For every prompt of a set it records what llama.cpp computes with an f32 KV cache: the prompt's
token ids, a summary of the last-position logits (top 40, every 192nd id, mean and std) and the
greedy tokens (64, or 16 for the larger second model, to keep CI short) with the top-2 logit margin at each step.
CI compares the engine against the fixture, so it needs no llama.cpp. Two sets:

  default  SmolLM2-135M, every file of tests/fixtures/prompts/ -> tests/fixtures/llamacpp_ref.json
  gemma    Gemma-3-270M, prompts shorter and longer than its sliding window -> tests/fixtures/llamacpp_ref_gemma.json
  qwen     Qwen2.5-Coder-0.5B, prompts of both folders (Chinese, code, emoji, its chat template)
           -> tests/fixtures/llamacpp_ref_qwen.json; also the token ids of TOKENIZE_ONLY strings
           (the qwen2 pre-tokenizer's corner cases), checked without a forward pass
  q3_k_m   the same prompts on the second model requantized to Q3_K_M (scripts/requantize.py)
           -> tests/fixtures/llamacpp_ref_q3_k_m.json; iq4_xs likewise -> llamacpp_ref_iq4_xs.json

  python3 scripts/llamacpp_ref.py [--set default|qwen] [--model PATH] [--out FILE]
  python3 scripts/llamacpp_ref.py [--set ...] --make-prompts   # (re)write the generated prompt files only

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
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
PROMPTS = os.path.join(FIXTURES, "prompts")
MODEL_DIR = os.environ.get("KVB_MODEL_DIR") or os.path.expanduser("~/.cache/kvbench/models")
# set -> (model file, fixture, greedy tokens, prompt files relative to tests/fixtures/ or None for prompts/*)
SETS = {
    "default": ("SmolLM2-135M-Instruct.Q4_1.gguf", "llamacpp_ref.json", 64, None),
    "qwen": ("Qwen2.5-Coder-0.5B-Instruct.gguf", "llamacpp_ref_qwen.json", 16,
             ["prompts/short_question.txt", "prompts/unicode.txt", "prompts/code_python.py.txt", "prompts_qwen/chinese.txt", "prompts_qwen/emoji.txt",
              "prompts_qwen/code_mixed.txt", "prompts_qwen/prose_mixed.txt", "prompts_qwen/chat_multiturn.txt",
              "prompts_qwen/chat_chinese_code.txt"]),
    # Gemma-3-270M (gemma3): prompts shorter (<= 452 tokens) and longer (1.9K, 3.8K) than its 512-token window;
    # made with llama.cpp's K-quant dot products for prefill too (VEC_DOT_SETS, below)
    "gemma": ("gemma-3-270m-q4_k_m.gguf", "llamacpp_ref_gemma.json", 16,
              ["prompts/short_question.txt", "prompts/unicode.txt", "prompts/code_python.py.txt", "prompts/digits.txt",
               "prompts/prose_300.txt", "prompts/prose_2000.txt", "prompts/prose_4000.txt", "prompts_qwen/chinese.txt"]),
}
# the second model requantized here (scripts/requantize.py): Q3_K/IQ4_NL/Q5_K and IQ4_XS/IQ4_NL on the same prompts
SETS["q3_k_m"] = ("Qwen2.5-Coder-0.5B-Instruct.Q3_K_M.gguf", "llamacpp_ref_q3_k_m.json", 16, SETS["qwen"][3])
SETS["iq4_xs"] = ("Qwen2.5-Coder-0.5B-Instruct.IQ4_XS.gguf", "llamacpp_ref_iq4_xs.json", 16, SETS["qwen"][3])
# Sets made with llama.cpp's K-quant matmuls on its ggml_vec_dot_* path, which kvbench follows, for prompt chunks
# as for single tokens: its CPU backend otherwise repacks Q4_K weights into 8-row panels (repack.cpp, the weight
# loader's "extra buffer types") and takes batches of 8+ rows of Q6_K/Q5_K/Q4_K/... through its tiled GEMM
# (tiled/tiled.cpp, GGML_CPU_TILED_MM); both sum in other orders, which alone moves Gemma-3-270M's logits by
# 0.9-1.0 (llama.cpp against itself). The fixture's settings record it.
VEC_DOT_SETS = {"gemma"}
# Strings whose token ids alone are compared (the qwen2 pre-tokenizer's splits: contractions, digit runs,
# whitespace runs, newlines, scripts without spaces, emoji sequences, special tokens in text).
TOKENIZE_ONLY = [
    "I'm sure they'll say it's fine, but we'd've known.", "Don't DON'T don’t", "1234567890 3.14159 -0.5e-10 1,000,000",
    "a  b   c    d\t\te", "line one\n\nline two\r\nline three\n\n\n", "   leading and trailing   ",
    "日本語の文章には空白がありません。", "中文测试：你好，世界！123", "한국어 문장입니다.", "ไทยภาษาไม่มีช่องว่าง",
    "Здравствуй, мир!", "مرحبا بالعالم", "👩‍👩‍👧‍👦🏳️‍🌈🇺🇳 1️⃣ ✌🏾", "x=a+b;y=a-b;z=a*b/(c%d)",
    "def f(x):\n    return x**2  # square", "<|im_start|>user\nhi<|im_end|>", "<|endoftext|> after the end",
    "https://example.com/a/b?c=d&e=f#g", "snake_case camelCase PascalCase kebab-case SCREAMING_CASE",
    "\u00e9t\u00e9 vs e\u0301te\u0301 (precomposed vs combining)", "tab\tseparated\tvalues\n1\t2\t3",
    "ALLCAPS WORDS AND 12ab34cd mixed tokens", "…—–‘’“” «» ‹› ¿¡", "0x1F 0b1010 0o17 1_000_000",
]
SAMPLE_STRIDE = 192
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


def chat_template(model_path):
    from gguf import GGUFReader
    r = GGUFReader(model_path)
    field = r.fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode()


def render_chat(model_path, messages, path):
    import jinja2
    text = jinja2.Environment().from_string(chat_template(model_path)).render(messages=messages,
                                                                           add_generation_prompt=True)
    with open(path, "w") as f:
        f.write(text)


APPLES = [
    {"role": "user", "content": "I have three apples and buy five more. How many do I have?"},
    {"role": "assistant", "content": "You have eight apples."},
    {"role": "user", "content": "And if I give two of them to my sister, how many are left?"},
]


def make_prompts(which, model_path):
    if which == "qwen":
        folder = os.path.join(FIXTURES, "prompts_qwen")
        render_chat(model_path, APPLES, os.path.join(folder, "chat_multiturn.txt"))
        render_chat(model_path, [{"role": "user", "content": "用 Python 写一个函数，判断一个字符串是不是回文，并解释时间复杂度。"}],
                    os.path.join(folder, "chat_chinese_code.txt"))
        return
    with open(os.path.join(PROMPTS, "prose_2000.txt"), "w") as f:
        f.write(prose(2000, 110))
    with open(os.path.join(PROMPTS, "prose_4000.txt"), "w") as f:
        f.write(prose(4000, 225))
    shutil.copyfile(os.path.join(ROOT, "kernels", "cpu", "pool.c"), os.path.join(PROMPTS, "code_c.txt"))
    render_chat(model_path, APPLES, os.path.join(PROMPTS, "chat_multiturn.txt"))


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


def end_tokens(llm):
    """The end-of-generation ids: EOS, and the chat end markers where they are single special tokens."""
    eog = {llm.token_eos()}
    for marker in (b"<|im_end|>", b"<|endoftext|>"):
        ids = llm.tokenize(marker, add_bos=False, special=True)
        if len(ids) == 1:
            eog.add(ids[0])
    return eog


def reference(llm, np, text, n_greedy):
    eog = end_tokens(llm)
    ids = llm.tokenize(text, add_bos=True, special=True)
    llm.reset()
    llm.eval(ids)
    last = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
    top = np.argsort(-last, kind="stable")[:40]
    greedy, margins = [], []
    logits = last
    for _ in range(n_greedy):
        order = np.argsort(-logits, kind="stable")[:2]
        tok = int(order[0])
        greedy.append(tok)
        margins.append(round(float(logits[order[0]] - logits[order[1]]), 5))
        if tok in eog:
            break
        llm.eval([tok])
        logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
    return {
        "n_prompt": len(ids),
        "prompt_ids": ids,
        "top_ids": [int(i) for i in top],
        "top_logits": [round(float(last[i]), 5) for i in top],
        "sample_logits": [round(float(v), 5) for v in last[::SAMPLE_STRIDE]],
        "logit_mean": round(float(last.mean()), 6),
        "logit_std": round(float(last.std()), 6),
        "greedy": greedy,
        "margins": margins,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", choices=sorted(SETS), default="default")
    ap.add_argument("--model")
    ap.add_argument("--out")
    ap.add_argument("--make-prompts", action="store_true")
    args = ap.parse_args()
    model_file, fixture, n_greedy, files = SETS[args.set]
    model = args.model or os.path.join(MODEL_DIR, model_file)
    out_path = args.out or os.path.join(FIXTURES, fixture)
    if args.make_prompts:
        make_prompts(args.set, model)
        return 0
    vec_dot = args.set in VEC_DOT_SETS
    if vec_dot:
        os.environ["GGML_CPU_TILED_MM"] = "0"  # read once, at ggml-cpu's first matmul
    try:
        import llama_cpp
        import numpy as np
    except ImportError as e:
        print(f"llamacpp_ref: {e} (pip install llama-cpp-python numpy)", file=sys.stderr)
        return 3
    build = llama_cpp.llama_print_system_info().decode().strip()
    if "AVX512 = 1" in build:
        print("llamacpp_ref: warning: this llama.cpp build uses AVX-512, whose 16-lane sums kvbench does not follow "
              "(its logits move by 0.3-1.0); build it with CMAKE_ARGS='-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON "
              "-DGGML_F16C=ON -DGGML_AVX512=OFF'", file=sys.stderr)
    if vec_dot:  # Llama() takes its model params from llama_cpp.llama_cpp's defaults: no repacked weights
        default_params = llama_cpp.llama_cpp.llama_model_default_params

        def no_repack():
            p = default_params()
            p.use_extra_bufts = False
            return p
        llama_cpp.llama_cpp.llama_model_default_params = no_repack
    llm = llama_cpp.Llama(model, n_ctx=8192, n_batch=512, n_threads=2, type_k=0, type_v=0,
                          flash_attn=False, logits_all=True, verbose=False)
    names = files or sorted(os.listdir(PROMPTS))
    records = []
    for name in names:
        with open(os.path.join(FIXTURES, name) if files else os.path.join(PROMPTS, name), "rb") as f:
            text = f.read()
        rec = {"name": name, **reference(llm, np, text, n_greedy)}
        records.append(rec)
        print(f"{name}: {rec['n_prompt']} tokens, min greedy margin {min(rec['margins']):.4f}", file=sys.stderr)
    out = {
        "engine": "llama.cpp",
        "llama_cpp_python": llama_cpp.__version__,
        "cpu": cpu_summary(),
        "build": build,
        "model": os.path.basename(model),
        "model_sha256": sha256(model),
        "settings": {"kv": "f32", "flash_attn": False, "n_batch": 512, "threads": 2, "add_special": True,
                     "parse_special": True, **({"repack": False, "tiled_mm": False} if vec_dot else {})},
        "sample_stride": SAMPLE_STRIDE,
        "n_greedy": n_greedy,
        "prompts": records,
    }
    if args.set == "qwen":
        out["tokenize_only"] = [{"text": t, "ids": llm.tokenize(t.encode(), add_bos=True, special=True)}
                                for t in TOKENIZE_ONLY]
    with open(out_path, "w") as f:
        json.dump(out, f, separators=(",", ":"), ensure_ascii=False)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
