#!/usr/bin/env python3
"""PyTorch's TTFT and decode speed for a model of given shapes (the peer of `kvbench bench` on synthetic:<shape>
models and on the GPU): transformers builds the Llama (Mistral with a window), Qwen2, Qwen3 or Gemma-3 model from a
config of those shapes with random
weights (its own initialisation, seeded) in --dtype on --device, attn_implementation="sdpa", no weights file.
Per context: one forward pass over the prompt ids 1000 + (i*7919) % 40000 (mod the vocabulary) with the KV cache
on and only the last position's logits kept, then -n greedy decode steps through the cache, one token each.
TTFT is the prompt's forward plus the first argmax; decode ms/token is the -n steps' time over -n. Every timed
span starts and ends with a device synchronisation. Best of --reps, after one short warm-up pass.

  python3 scripts/torch_synth_bench.py --layers 32 --embd 4096 --heads 32 --kv-heads 8 --head-dim 128 \\
      --ff 14336 --vocab 128256 --rope-base 500000 --ctx 32768,65536 -n 16 --device cuda --json

A context that does not fit gets {"ctx": N, "error": "..."} and the others still run. Exit 3 with a one-line
message when torch or transformers is not importable, 2 on bad arguments or a missing device.
"""
import argparse
import inspect
import json
import os
import sys
import time


def parse_ctx(s):
    try:
        v = [int(x) for x in s.split(",") if x]
    except ValueError:
        v = []
    if not v or min(v) < 1:
        raise argparse.ArgumentTypeError(f"--ctx expects comma-separated positive integers, got '{s}'")
    return v


def build_model(a, torch, transformers):
    common = dict(vocab_size=a.vocab, hidden_size=a.embd, intermediate_size=a.ff, num_hidden_layers=a.layers,
                  num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, rms_norm_eps=a.rms_eps,
                  rope_theta=a.rope_base, max_position_embeddings=max(a.ctx) + a.n + 8,
                  tie_word_embeddings=a.tied, use_cache=True)
    try:
        if a.arch == "qwen2":
            if a.embd != a.heads * a.head_dim:
                sys.exit(f"torch_synth_bench: qwen2 needs embd = heads x head_dim ({a.embd} != {a.heads} x {a.head_dim})")
            cfg, cls = transformers.Qwen2Config(**common), transformers.Qwen2ForCausalLM
        elif a.arch == "qwen3":
            cfg, cls = transformers.Qwen3Config(head_dim=a.head_dim, **common), transformers.Qwen3ForCausalLM
        elif a.arch == "gemma3":  # local layers (sliding_window, their own RoPE base) and global ones (linear scaling)
            extra = dict(head_dim=a.head_dim, sliding_window=a.window, query_pre_attn_scalar=a.head_dim,
                         rope_local_base_freq=a.swa_base, hidden_activation="gelu_pytorch_tanh")
            if a.rope_linear:
                extra["rope_scaling"] = {"rope_type": "linear", "factor": a.rope_linear}
            cfg, cls = transformers.Gemma3TextConfig(**extra, **common), transformers.Gemma3ForCausalLM
        elif a.window:  # llama with a window on every layer: Mistral-7B-v0.1
            cfg = transformers.MistralConfig(head_dim=a.head_dim, sliding_window=a.window, **common)
            cls = transformers.MistralForCausalLM
        else:
            cfg, cls = transformers.LlamaConfig(head_dim=a.head_dim, **common), transformers.LlamaForCausalLM
    except (AttributeError, TypeError, ValueError) as e:  # an older or newer transformers without that config
        sys.exit(f"torch_synth_bench: transformers {transformers.__version__} cannot build a {a.arch} config: {e}")
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(a.seed)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(a.torch_dtype)
    try:
        with torch.device(a.device):
            model = cls(cfg)
    finally:
        torch.set_default_dtype(prev)
    model.eval()
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", choices=["llama", "qwen2", "qwen3", "gemma3"], default="llama")
    ap.add_argument("--window", type=int, default=0, help="sliding window (llama: every layer; gemma3: its local layers)")
    ap.add_argument("--swa-base", type=float, default=10000.0, help="gemma3: the local layers' RoPE base")
    ap.add_argument("--rope-linear", type=float, default=0.0, help="linear RoPE scaling factor (gemma3: global layers)")
    for name in ("layers", "embd", "heads", "kv-heads", "head-dim", "ff", "vocab"):
        ap.add_argument("--" + name, type=int, required=True)
    ap.add_argument("--rope-base", type=float, default=10000.0)
    ap.add_argument("--rms-eps", type=float, default=1e-5)
    ap.add_argument("--tied", action="store_true", help="output matrix = token embedding")
    ap.add_argument("--ctx", type=parse_ctx, default=[512])
    ap.add_argument("-n", type=int, default=16, help="decode steps per context")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", choices=["f16", "bf16", "f32"], default="f16")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (CPU; 0 = torch's default)")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print JSON (else a table)")
    a = ap.parse_args()
    if a.n < 1 or a.reps < 1 or min(a.layers, a.embd, a.heads, a.kv_heads, a.head_dim, a.ff, a.vocab) < 1 \
            or a.heads % a.kv_heads:
        ap.error("shapes, -n and --reps must be positive, and heads a multiple of kv-heads")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        import torch
        import transformers
    except ImportError as e:
        print(f"torch_synth_bench: {e}", file=sys.stderr)
        sys.exit(3)
    a.torch_dtype = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[a.dtype]
    cuda = a.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        print(f"torch_synth_bench: --device {a.device} but torch sees no CUDA device", file=sys.stderr)
        sys.exit(2)
    if a.threads > 0:
        torch.set_num_threads(a.threads)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    model = build_model(a, torch, transformers)
    params = inspect.signature(model.forward).parameters
    keep = next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in params), None)
    last_only = {keep: 1} if keep else {}
    cache_arg = "cache" if "cache" in params else "past_key_values"  # renamed in transformers 5.x

    def cache_of(out):
        return out.cache if cache_arg == "cache" else out.past_key_values
    all_ids = torch.tensor([[(1000 + (i * 7919) % 40000) % a.vocab for i in range(max(a.ctx))]], device=a.device)

    def run(ctx, n):
        sync()
        t0 = time.perf_counter()
        out = model(input_ids=all_ids[:, :ctx], use_cache=True, **last_only)
        nxt = out.logits[:, -1, :].argmax(-1, keepdim=True)
        sync()
        ttft = time.perf_counter() - t0
        cache = cache_of(out)
        del out
        t1 = time.perf_counter()
        for _ in range(n):
            out = model(input_ids=nxt, use_cache=True, **{cache_arg: cache})
            cache = cache_of(out)
            nxt = out.logits[:, -1, :].argmax(-1, keepdim=True)
        sync()
        dec = (time.perf_counter() - t1) / n if n else 0.0
        del cache, out
        return ttft, dec

    results = []
    with torch.inference_mode():
        run(min(64, max(a.ctx)), 2)  # warm-up: kernels loaded, allocator primed
        for ctx in a.ctx:
            best = None
            try:
                for _ in range(a.reps):
                    ttft, dec = run(ctx, a.n)
                    if best is None or ttft + dec * a.n < best[0] + best[1] * a.n:
                        best = (ttft, dec)
            except RuntimeError as e:  # torch.OutOfMemoryError is one; a CPU allocator failure says "memory"
                msg = str(e).splitlines()[0] if str(e) else type(e).__name__
                if "memory" not in msg.lower():
                    raise
                results.append({"ctx": ctx, "error": "out of memory: " + msg[:160]})
                if cuda:
                    torch.cuda.empty_cache()
                continue
            results.append({"ctx": ctx, "ttft_s": best[0], "decode_ms": best[1] * 1e3,
                            "prefill_tok_s": ctx / best[0], "decode_tok_s": 1.0 / best[1]})
            if cuda:
                torch.cuda.empty_cache()
    where = torch.cuda.get_device_name(torch.device(a.device)) if cuda else "CPU, %d threads" % torch.get_num_threads()
    version = (f"torch {torch.__version__}, transformers {transformers.__version__}, {a.arch} config, random "
               f"{a.dtype} weights, sdpa, {where}")
    if a.json:
        print(json.dumps({"version": version, "kv": a.dtype, "results": results}))
    else:
        print(version)
        print("| ctx | TTFT s | decode ms/token |")
        print("|---:|---:|---:|")
        for r in results:
            if "error" in r:
                print(f"| {r['ctx']} | {r['error']} | - |")
            else:
                print(f"| {r['ctx']} | {r['ttft_s']:.3f} | {r['decode_ms']:.2f} |")


if __name__ == "__main__":
    main()
