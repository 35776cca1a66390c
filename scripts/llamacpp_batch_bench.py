#!/usr/bin/env python3
"""llama.cpp's batched decode on the same work as `kvbench bench-serve --decode-only` (docs/serving.md): for each
batch size B, B sequences (seq ids 0..B-1 in one context, n_seq_max = B) each prefilled with ctx ids
1000 + ((i + 131 b) * 7919) % 40000, then one untimed step (llama.cpp reserves its graph there) and N decode steps of one token per sequence in one
llama_decode each, timed.
The KV cache type as kvbench's (--kv, default f16), flash attention off, the threads given.

  python3 scripts/llamacpp_batch_bench.py --model M --batches 1,8 --ctx 512 --n-decode 32 --threads 2

--kvbench BIN runs `BIN bench-serve --decode-only` on the same model, batches, context, steps and threads first
(kvbench also takes one untimed step first), one engine after the other, and ends with both in one table and
kvbench's tokens/s over llama.cpp's per batch size (docs/serving.md).

Exit 3 with a one-line message when llama_cpp is not importable.
"""
import argparse
import re
import subprocess
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--n-decode", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv", choices=["f16", "f32"], default="f16")
    ap.add_argument("--kvbench", metavar="BIN", help="also run BIN bench-serve --decode-only with the same settings")
    args = ap.parse_args()
    ours = {}
    if args.kvbench:
        cmd = [args.kvbench, "bench-serve", "--decode-only", args.batches, "--prompt-len", str(args.ctx),
               "--n-decode", str(args.n_decode), "--threads", str(args.threads), "--model", args.model, "--kv-type", args.kv]
        print("$ " + " ".join(cmd))
        r = subprocess.run(cmd, capture_output=True, text=True)
        sys.stdout.write(r.stdout)
        if r.returncode != 0:
            print(f"llamacpp_batch_bench: kvbench failed: {r.stderr.strip()}", file=sys.stderr)
            return 1
        for m in re.finditer(r"^\| (\d+) \| \d+ \| \d+ \| ([\d.]+) \| ([\d.]+) \|$", r.stdout, re.M):
            ours[int(m.group(1))] = (float(m.group(2)), float(m.group(3)))
        print()
    try:
        import llama_cpp as L
    except ImportError as e:
        print(f"llamacpp_batch_bench: {e} (pip install llama-cpp-python)", file=sys.stderr)
        return 3
    L.llama_backend_init()
    model = L.llama_model_load_from_file(args.model.encode(), L.llama_model_default_params())
    if not model:
        print(f"llamacpp_batch_bench: cannot load {args.model}", file=sys.stderr)
        return 1
    kv_type = 1 if args.kv == "f16" else 0
    print(f"llama.cpp (llama-cpp-python {L.__version__}), {args.threads} threads, KV {args.kv}\n")
    print("| sequences | context | decode steps | ms/step | decode tok/s |\n|---|---|---|---|---|")
    theirs = {}
    for B in [int(b) for b in args.batches.split(",")]:
        cp = L.llama_context_default_params()
        cp.n_ctx = B * (args.ctx + args.n_decode + 16)
        cp.n_batch = 512
        cp.n_ubatch = 512
        cp.n_seq_max = B
        cp.n_threads = args.threads
        cp.n_threads_batch = args.threads
        cp.type_k = kv_type
        cp.type_v = kv_type
        cp.flash_attn_type = 0  # disabled
        cp.kv_unified = True  # one KV buffer for all sequences (else llama.cpp splits the step per sequence)
        ctx = L.llama_init_from_model(model, cp)
        if not ctx:
            print(f"llamacpp_batch_bench: cannot make a context for {B} sequences", file=sys.stderr)
            return 1
        batch = L.llama_batch_init(512, 0, B)

        def run(tokens):  # tokens: [(id, pos, seq, want_logits)]
            batch.n_tokens = 0
            for tok, pos, seq, lg in tokens:
                i = batch.n_tokens
                batch.token[i] = tok
                batch.pos[i] = pos
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = seq
                batch.logits[i] = lg
                batch.n_tokens += 1
            rc = L.llama_decode(ctx, batch)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")

        for b in range(B):
            ids = [1000 + ((t + 131 * b) * 7919) % 40000 for t in range(args.ctx)]
            for at in range(0, args.ctx, 512):
                chunk = ids[at:at + 512]
                run([(tok, at + k, b, at + k == args.ctx - 1) for k, tok in enumerate(chunk)])
        # one untimed step first: llama.cpp builds and reserves the decode graph on its first call
        run([(1000 + ((args.ctx + 131 * b) * 7919) % 40000, args.ctx, b, True) for b in range(B)])
        t0 = time.perf_counter()
        for s in range(1, args.n_decode + 1):
            run([(1000 + ((args.ctx + s + 131 * b) * 7919) % 40000, args.ctx + s, b, True) for b in range(B)])
        dt = time.perf_counter() - t0
        print(f"| {B} | {args.ctx} | {args.n_decode} | {dt * 1e3 / args.n_decode:.2f} | {B * args.n_decode / dt:.1f} |")
        theirs[B] = (dt * 1e3 / args.n_decode, B * args.n_decode / dt)
        sys.stdout.flush()
        L.llama_batch_free(batch)
        L.llama_free(ctx)
    L.llama_model_free(model)
    if ours:
        print(f"\nbatched decode, {args.ctx}-token contexts, {args.n_decode} steps, {args.threads} threads, KV {args.kv}:\n")
        print("| engine | sequences | ms/step | decode tok/s |\n|---|---|---|---|")
        for B in sorted(theirs):
            for name, rows in (("kvbench", ours), (f"llama.cpp {L.__version__}", theirs)):
                if B in rows:
                    print(f"| {name} | {B} | {rows[B][0]:.2f} | {rows[B][1]:.1f} |")
        print("\n| sequences | kvbench tok/s / llama.cpp tok/s |\n|---|---|")
        for B in sorted(theirs):
            if B in ours and theirs[B][1] > 0:
                print(f"| {B} | {ours[B][1] / theirs[B][1]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
