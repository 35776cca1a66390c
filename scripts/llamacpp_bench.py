#!/usr/bin/env python3
"""llama.cpp's prefill and decode speed on the same token ids as `kvbench bench` (the peer it prints beside
its own figures). For each context: a fresh context, prefill of ids 1000 + (i*7919) % 40000 (n_batch 512),
then N decode steps; the KV cache type kvbench runs with (--kv, default f16 as both engines default to),
flash attention off.

  python3 scripts/llamacpp_bench.py --model M --ctx 512,2048,8000 --n-decode 64 --threads 2 --kv f16 --json

Exit 3 with a one-line message when llama_cpp is not importable.
"""
import argparse
import json
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--ctx", default="512,2048,8000")
    ap.add_argument("--n-decode", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv", choices=["f16", "f32"], default="f16", help="KV cache element type")
    ap.add_argument("--json", action="store_true", help="print JSON (else a table)")
    args = ap.parse_args()
    try:
        import llama_cpp
    except ImportError as e:
        print(f"llamacpp_bench: {e} (pip install llama-cpp-python)", file=sys.stderr)
        return 3
    kv_type = 1 if args.kv == "f16" else 0  # GGML_TYPE_F16 / GGML_TYPE_F32
    results = []
    for ctx in [int(c) for c in args.ctx.split(",")]:
        llm = llama_cpp.Llama(args.model, n_ctx=ctx + args.n_decode + 8, n_batch=512, n_threads=args.threads,
                              n_threads_batch=args.threads, flash_attn=False, verbose=False,
                              type_k=kv_type, type_v=kv_type)
        ids = [1000 + (i * 7919) % 40000 for i in range(ctx)]
        t0 = time.perf_counter()
        llm.eval(ids)
        t_pre = time.perf_counter() - t0
        t1 = time.perf_counter()
        for s in range(args.n_decode):  # which token is fed does not change the work
            llm.eval([1000 + ((ctx + s) * 7919) % 40000])
        t_dec = time.perf_counter() - t1
        results.append({"ctx": ctx, "prefill_tok_s": ctx / t_pre,
                        "decode_tok_s": args.n_decode / t_dec if args.n_decode else 0.0})
        del llm
    out = {"engine": "llama.cpp", "version": f"llama-cpp-python {llama_cpp.__version__}", "threads": args.threads, "kv": args.kv,
           "results": results}
    if args.json:
        print(json.dumps(out))
    else:
        for r in results:
            print(f"ctx {r['ctx']:6d}: prefill {r['prefill_tok_s']:8.1f} tok/s, decode {r['decode_tok_s']:7.1f} tok/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
