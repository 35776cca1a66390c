#!/usr/bin/env python3
"""PyTorch's prefill speed on the same token ids as `kvbench bench --torch` (a second peer beside llama.cpp):
Hugging Face transformers loads the same GGUF (`gguf_file=`, dequantized to float32), and one forward pass over
ids 1000 + (i*7919) % 40000 (the whole prompt at once, SDPA attention, no gradient) is timed per context, best
of --reps, after one short warm-up pass. torch.set_num_threads(--threads), so both engines use the same cores.

  python3 scripts/torch_bench.py --model M.gguf --ctx 4000 --threads 2 --json

Run it from a throwaway environment (pip install torch transformers gguf); exit 3 with a one-line message when
torch or transformers is not importable.
"""
import argparse
import json
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--ctx", default="4000")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print JSON (else a table)")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")
    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM
    except ImportError as e:
        print(f"torch_bench: {e} (pip install torch transformers gguf)", file=sys.stderr)
        return 3
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    path = os.path.abspath(args.model)
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                 torch_dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    results = []
    with torch.inference_mode():
        model(torch.tensor([[1000 + (i * 7919) % 40000 for i in range(64)]]), use_cache=True)  # warm-up
        for ctx in [int(c) for c in args.ctx.split(",")]:
            ids = torch.tensor([[1000 + (i * 7919) % 40000 for i in range(ctx)]])
            best = None
            for _ in range(args.reps):
                t0 = time.perf_counter()
                model(ids, use_cache=True, logits_to_keep=1)
                t = time.perf_counter() - t0
                best = t if best is None or t < best else best
            results.append({"ctx": ctx, "prefill_tok_s": ctx / best, "decode_tok_s": 0.0})
    out = {"engine": "pytorch", "version": f"torch {torch.__version__}, transformers {transformers.__version__}",
           "threads": args.threads, "kv": "f32", "results": results}
    if args.json:
        print(json.dumps(out))
    else:
        for r in results:
            print(f"ctx {r['ctx']:6d}: prefill {r['prefill_tok_s']:8.1f} tok/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
