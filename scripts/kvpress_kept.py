#!/usr/bin/env python3
"""Reference kept sets from kvpress (NVIDIA/kvpress): which prompt positions each press keeps, per layer and KV
head, after prefill on one prompt, written in kvbench's --dump-kept format so scripts/kept_compare.py can set them
beside kvbench's own dumps. The committed outputs live in tests/fixtures/kvpress/<method>.jsonl.

Run OUTSIDE CI, in a throwaway virtualenv outside the repository (CPU only, float32):

    python3 -m venv /work/venv-kvpress
    /work/venv-kvpress/bin/pip install torch        # CPU wheels index if reachable; plain PyPI otherwise
    /work/venv-kvpress/bin/pip install transformers gguf kvpress
    nice /work/venv-kvpress/bin/python scripts/kvpress_kept.py            # every press -> tests/fixtures/kvpress/

Versions the committed fixtures were made with: torch 2.15.0 (the PyPI wheel, run on the CPU), transformers 5.2.0,
gguf 0.19.0, kvpress 0.5.5 (Python 3.11.7); model SmolLM2-135M-Instruct.Q4_1.gguf dequantized to float32 by
transformers' GGUF loader, attention "sdpa" (AdaKVPress refuses "eager").

Prompt ids: the ids kvbench feeds, never a re-tokenization. By default they come from
tests/fixtures/llamacpp_ref.json (llama.cpp's ids for the prompt file, which tests/test_model_llamacpp.c checks
equal kvbench's); --ids takes a kvbench --dump-kept file instead (its header's "prompt_ids"). This GGUF sets
tokenizer.ggml.add_bos_token false, so kvbench adds no BOS: 3765 ids for prose_4000.txt. transformers' GGUF
tokenizer prepends <|im_start|> (id 1) regardless; without special tokens its ids equal kvbench's. Both are
printed as a check, and the full prefill's last-position logits against llama.cpp's top 40 in llamacpp_ref.json
(kvbench equals llama.cpp there to 5e-6): transformers' float32 model is 0.48 away at most, within llama.cpp's own
spread across its kernels (0.44-0.74, README), since GGUF Q4_1 in llama.cpp rounds activations to 8 bits and
transformers does not. Nearly tied scores may therefore rank the other way: expect Jaccard a little below 1.

How the positions are recovered: kvpress prunes each layer's DynamicCache in a forward hook after the layer's
attention, so the prefill's hidden states do not depend on the press and a pruned cache holds exact copies of rows
of the unpressed cache (keys after RoPE, as cached). One plain prefill gives the full keys; each press's prefill
gives the surviving rows, matched back to positions by their bytes (the full rows of every head are checked to be
distinct, so the match is unique). AdaKVPress does not prune: it leaves the cache whole and records the pairs it
evicts in each attention module's masked_key_indices; the kept positions of a head are the others.

Presses (compression_ratio = 1 - budget = 0.7) and the kvbench method + options meant to reproduce them; the
press's own fields go in "kvpress_params". kvpress keeps int(n * 0.3) per head (1129 of 3765; PyramidKV its layer
budget, AdaKV that many per head on average), kvbench llround(0.3 * n) (1130): the header's "tokens_per_head" is
kvpress's count, to run kvbench with `--budget 1129` where the sets should match exactly.
    SnapKVPress(window_size=64, kernel_size=5)          snapkv        window=64,kernel=5,pool=avg
    StreamingLLMPress(n_sink=4)                         streamingllm  sinks=4
    TOVAPress()  (last query, mean over all heads)      tova          per_head=0
    KnormPress() (lowest key L2 norm, no window)        knorm         window=0
    PyramidKVPress(window_size=64, kernel_size=5, beta=20)  pyramidkv  window=64,kernel=5,pool=avg,beta=20
    PyramidKVPress(window_size=32, kernel_size=5, beta=20)  pyramidkv  window=32,kernel=5,pool=avg,beta=20
                                                        (file pyramidkv_w32.jsonl)
    AdaKVPress(SnapKVPress(64, 5), alpha_safeguard=0.2) adakv         base=snapkv,window=64,kernel=5,pool=avg,alpha=0.2
    LagKVPress(n_sink=4, lag_size=128)                  lagkv         sinks=4,lag=128,cross=0
    CURPress()  (kv_product, local windows of 16)       cur           leverage=kv_product,sinks=4,window=16
    CriticalKVPress(SnapKVPress(64, 5))                 criticalkv    base=snapkv,window=64,kernel=5,pool=avg
    CriticalAdaKVPress(SnapKVPress(64, 5), alpha_safeguard=0.2)  criticalkv  base=adakv,window=64,kernel=5,pool=avg,
                                                        alpha=0.2 (file criticalkv_ada.jsonl)
    LeverageScorePress(sketch_dimension=48)             compactor     (kvbench: the exact leverage, no sketch; the
                                                        press's Gaussian sketch is drawn after torch.manual_seed(0))
    LeverageScorePress(sketch_dimension=64)             compactor     (file compactor_d64.jsonl: a square sketch is
                                                        invertible, so the leverage is exact, as kvbench's)
    ExpectedAttentionPress()  (covariance, value norms) expected      window=4096 (kvpress's statistics: every query but
                                                        the sinks; test_kvpress_kept prefills it on its own)

PyramidKVPress with its defaults falls back to uniform SnapKV on this prompt at 30%: its top layer would keep
budget/beta = 1129.5 / 20 = 56.5 tokens, fewer than its window of 64, so every layer keeps round(0.3 n) = 1130
(pyramidkv.jsonl says so in a "note"). pyramidkv_w32.jsonl is the same press with window 32, where the pyramid
is active: 2203 tokens per head in layer 0 down to 56 in layer 29 ("kept_per_layer" has the sums over heads).
kvpress shapes the whole per-head budget B into the pyramid (the window inside each layer's count); kvbench's
pyramidkv shapes B - window (as KVCache-Factory), so their layer counts differ by up to about a window even where
neither falls back.

Output, one file per press: line 1 {"method", "opts", "budget", "n_prompt", "tokens_per_head", "kept_per_layer"
(tokens kept per layer, summed over its KV heads), "source", "kvpress_params", "model", "prompt", "note" (when
there is one)}, then one line per (layer, KV head): {"when": "prefill", "layer": L, "kv_head": H,
"positions": [...]}, positions ascending.
"""
import argparse
import dataclasses
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TQDM_DISABLE", "1")  # the GGUF loader's per-tensor progress bars
DEFAULT_MODEL = os.path.expanduser("~/.cache/kvbench/models/SmolLM2-135M-Instruct.Q4_1.gguf")
DEFAULT_PROMPT = "tests/fixtures/prompts/prose_4000.txt"
DEFAULT_IDS = "tests/fixtures/llamacpp_ref.json"


def press_table(ratio):
    """Output name -> (kvbench method, kvpress press, kvbench --method-opt string)."""
    from kvpress import (AdaKVPress, CriticalAdaKVPress, CriticalKVPress, CURPress, KnormPress, LagKVPress,
                         ExpectedAttentionPress, LeverageScorePress, PyramidKVPress, SnapKVPress, StreamingLLMPress,
                         TOVAPress)

    snap = "window=64,kernel=5,pool=avg"
    return {
        "snapkv": ("snapkv", SnapKVPress(compression_ratio=ratio, window_size=64, kernel_size=5), snap),
        "streamingllm": ("streamingllm", StreamingLLMPress(compression_ratio=ratio, n_sink=4), "sinks=4"),
        "tova": ("tova", TOVAPress(compression_ratio=ratio), "per_head=0"),
        "knorm": ("knorm", KnormPress(compression_ratio=ratio), "window=0"),
        "pyramidkv": ("pyramidkv", PyramidKVPress(compression_ratio=ratio, window_size=64, kernel_size=5, beta=20),
                      snap + ",beta=20"),
        "pyramidkv_w32": ("pyramidkv", PyramidKVPress(compression_ratio=ratio, window_size=32, kernel_size=5,
                                                      beta=20), "window=32,kernel=5,pool=avg,beta=20"),
        "adakv": ("adakv", AdaKVPress(SnapKVPress(compression_ratio=ratio, window_size=64, kernel_size=5),
                                      alpha_safeguard=0.2), "base=snapkv," + snap + ",alpha=0.2"),
        "lagkv": ("lagkv", LagKVPress(compression_ratio=ratio, n_sink=4, lag_size=128), "sinks=4,lag=128,cross=0"),
        "cur": ("cur", CURPress(compression_ratio=ratio), "leverage=kv_product,sinks=4,window=16"),
        "criticalkv": ("criticalkv", CriticalKVPress(SnapKVPress(compression_ratio=ratio, window_size=64, kernel_size=5)),
                       "base=snapkv," + snap),
        "criticalkv_ada": ("criticalkv", CriticalAdaKVPress(SnapKVPress(compression_ratio=ratio, window_size=64,
                                                                        kernel_size=5), alpha_safeguard=0.2),
                           "base=adakv," + snap + ",alpha=0.2"),
        "compactor": ("compactor", LeverageScorePress(compression_ratio=ratio, sketch_dimension=48), ""),
        # a square sketch (head_dim 64 on the default model) is invertible: the exact leverage, kvbench's definition
        "expected": ("expected", ExpectedAttentionPress(compression_ratio=ratio), "window=4096"),
        "compactor_d64": ("compactor", LeverageScorePress(compression_ratio=ratio, sketch_dimension=64), ""),
    }


def press_params(press):
    """The press's dataclass fields (nested presses included), with its class name; a press that is no dataclass
    (CriticalKVPress) by its public attributes."""
    out = {"press": type(press).__name__}
    names = ([f.name for f in dataclasses.fields(press)] if dataclasses.is_dataclass(press)
             else [k for k in vars(press) if not k.startswith("_")])
    for name in names:
        v = getattr(press, name)
        out[name] = press_params(v) if hasattr(v, "compress") else v
    return out


def kvbench_ids(path, prompt):
    """The record holding the prompt ids kvbench feeds ("prompt_ids"): a kvbench --dump-kept file's header line, or
    llamacpp_ref.json's entry for the prompt file's name (which also holds llama.cpp's last-position top logits)."""
    with open(path) as f:
        text = f.read()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        doc = json.loads(text.splitlines()[0])  # a JSON-lines dump: the header line
    if "prompt_ids" in doc:
        return doc
    name = os.path.basename(prompt)
    for p in doc.get("prompts", []):
        if p["name"] == name:
            return p
    sys.exit(f"{path}: no prompt_ids for {name}")


def check_logits(logits, rec):
    """How far transformers' float32 model is from llama.cpp (and so from kvbench, which test_model_llamacpp holds
    to llama.cpp): the last position's logits of llama.cpp's top ids."""
    if "top_ids" not in rec:
        return
    d = max(abs(float(logits[i]) - v) for i, v in zip(rec["top_ids"], rec["top_logits"]))
    print(f"last-position logits vs llama.cpp's top {len(rec['top_ids'])}: max |difference| {d:.4f}")


def check_tokenizer(model_dir, model_file, text, ids):
    """Print whether transformers' GGUF tokenizer gives kvbench's ids, with and without its special tokens
    (informative only: kvbench's ids are what the model is fed)."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(model_dir, gguf_file=model_file)
    except Exception as e:  # the GGUF tokenizer conversion is optional here
        print(f"transformers tokenizer: not available ({type(e).__name__}: {e})")
        return
    for special in (True, False):
        hf = tok(text, add_special_tokens=special)["input_ids"]
        first = next((i for i, (a, b) in enumerate(zip(hf, ids)) if a != b), min(len(hf), len(ids)))
        verdict = "identical" if hf == ids else f"differ from index {first} (first ids {hf[:2]})"
        print(f"transformers tokenizer, add_special_tokens={special}: {len(hf)} ids, kvbench {len(ids)}: {verdict}")


def cached_keys(cache, n_layer):
    return [cache.layers[l].keys[0].detach().clone() for l in range(n_layer)]


def row_index(full):
    """Per KV head, a dict from a key row's bytes to its position (rows checked distinct)."""
    index = []
    for h in range(full.shape[0]):
        rows = full[h].contiguous().numpy()
        d = {rows[i].tobytes(): i for i in range(rows.shape[0])}
        if len(d) != rows.shape[0]:
            sys.exit("two positions hold identical key rows: byte matching would be ambiguous")
        index.append(d)
    return index


def kept_pruned(index, kept):
    """Positions of the rows a pruning press left in one layer's cache, per head, ascending."""
    out = []
    for h, d in enumerate(index):
        rows = kept[h].contiguous().numpy()
        pos = [d.get(rows[i].tobytes()) for i in range(rows.shape[0])]
        if None in pos or len(set(pos)) != len(pos):
            sys.exit("a kept key row matches no position of the full prefill (or two): the runs differ")
        out.append(sorted(pos))
    return out


def kept_masked(module, n_head_kv, n):
    """AdaKV: every position but those in module.masked_key_indices, per head."""
    masked = [set() for _ in range(n_head_kv)]
    _, heads, seqs = module.masked_key_indices
    for h, s in zip(heads.tolist(), seqs.tolist()):
        masked[h].add(s)
    module.masked_key_indices = None
    return [[i for i in range(n) if i not in m] for m in masked]


def run_press(model, press, input_ids, index, n_head_kv):
    from transformers import DynamicCache
    import torch

    cache = DynamicCache()
    with torch.no_grad(), press(model):
        model(input_ids, past_key_values=cache, use_cache=True)
    n = input_ids.shape[1]
    layers = model.model.layers
    if hasattr(layers[0].self_attn, "masked_key_indices") and layers[0].self_attn.masked_key_indices is not None:
        return [kept_masked(layer.self_attn, n_head_kv, n) for layer in layers]
    return [kept_pruned(index[l], cache.layers[l].keys[0]) for l in range(len(layers))]


def write_dump(path, header, kept):
    with open(path, "w") as f:
        f.write(json.dumps(header) + "\n")
        for l, heads in enumerate(kept):
            for h, pos in enumerate(heads):
                f.write(json.dumps({"when": "prefill", "layer": l, "kv_head": h, "positions": pos},
                                   separators=(",", ":")) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--prompt", default=DEFAULT_PROMPT)
    ap.add_argument("--ids", default=DEFAULT_IDS, help="llamacpp_ref.json or a kvbench --dump-kept file")
    ap.add_argument("--budget", type=float, default=0.3, help="kept fraction (compression_ratio = 1 - budget)")
    ap.add_argument("--out", default="tests/fixtures/kvpress")
    ap.add_argument("--press", action="append", help="output names to run (default: all of press_table)")
    a = ap.parse_args()

    import torch
    import transformers
    from importlib.metadata import version
    from kvpress.utils import compute_n_kept
    from transformers import AutoModelForCausalLM, DynamicCache

    with open(a.prompt, encoding="utf-8") as f:
        text = f.read()
    rec = kvbench_ids(a.ids, a.prompt)
    ids = rec["prompt_ids"]
    model_dir, model_file = os.path.split(os.path.abspath(a.model))
    check_tokenizer(model_dir, model_file, text, ids)

    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(model_dir, gguf_file=model_file, dtype=torch.float32,
                                                 attn_implementation="sdpa").eval()
    cfg = model.config
    print(f"model: {model_file} ({cfg.num_hidden_layers} layers, {cfg.num_key_value_heads} KV heads) "
          f"loaded in {time.time() - t0:.1f} s")
    input_ids = torch.tensor([ids])
    t0 = time.time()
    cache = DynamicCache()
    with torch.no_grad():
        out = model(input_ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    check_logits(out.logits[0, -1], rec)
    index = [row_index(k) for k in cached_keys(cache, cfg.num_hidden_layers)]
    print(f"full prefill: {len(ids)} tokens in {time.time() - t0:.1f} s")

    source = f"kvpress {version('kvpress')} (transformers {transformers.__version__}, torch {torch.__version__})"
    table = press_table(round(1 - a.budget, 6))
    os.makedirs(a.out, exist_ok=True)
    for name in a.press or list(table):
        method, press, opts = table[name]
        t0 = time.time()
        torch.manual_seed(0)  # LeverageScorePress draws its sketch from torch.randn: the same draw every run
        kept = run_press(model, press, input_ids, index, cfg.num_key_value_heads)
        sizes = [len(p) for heads in kept for p in heads]
        per_layer = [sum(len(p) for p in heads) for heads in kept]
        header = {"method": method, "opts": opts, "budget": a.budget, "n_prompt": len(ids),
                  "tokens_per_head": compute_n_kept(len(ids), press.compression_ratio),
                  "kept_per_layer": per_layer, "source": source, "kvpress_params": press_params(press),
                  "model": model_file, "prompt": a.prompt}
        if method == "pyramidkv" and len(set(per_layer)) == 1:
            header["note"] = ("PyramidKVPress fell back to uniform SnapKV (its top layer would keep "
                              "budget/beta < window tokens): every layer keeps round(budget x n)")
        path = os.path.join(a.out, name + ".jsonl")
        write_dump(path, header, kept)
        print(f"{name}: kept per head min {min(sizes)} mean {sum(sizes) / len(sizes):.1f} max {max(sizes)}, "
              f"{time.time() - t0:.1f} s -> {path}")


if __name__ == "__main__":
    main()
