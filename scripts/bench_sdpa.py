#!/usr/bin/env python3
"""PyTorch reference for `kvbench bench-attention`: scaled_dot_product_attention on the same decode shapes.

Prints one line per point: "ctx batch case microseconds" (case: full, or sparse = index_select gather of the
listed rows followed by SDPA). Exits 1 without output when torch or CUDA is missing.
"""
import argparse
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", default="8192,32768,65536,131072")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--sparse", type=float, default=0.1)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--iters", type=int, default=50)
    a = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return 1
    if not torch.cuda.is_available():
        return 1
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)

    def timed(fn):
        for _ in range(3):
            fn()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(a.iters):
            fn()
        e.record()
        torch.cuda.synchronize()
        return s.elapsed_time(e) / a.iters * 1e3

    for b in [int(x) for x in a.batch.split(",")]:
        for ctx in [int(x) for x in a.ctx.split(",")]:
            need = 2 * b * a.kv_heads * ctx * a.head_dim * 2 * 1.2
            free, _ = torch.cuda.mem_get_info()
            if need > free:
                continue
            q = torch.randn(b, a.heads, 1, a.head_dim, device=dev, dtype=torch.float16, generator=g)
            k = torch.randn(b, a.kv_heads, ctx, a.head_dim, device=dev, dtype=torch.float16, generator=g)
            v = torch.randn(b, a.kv_heads, ctx, a.head_dim, device=dev, dtype=torch.float16, generator=g)
            us = timed(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
            print(f"{ctx} {b} full {us:.3f}", flush=True)
            n = max(1, int(ctx * a.sparse + 0.5))
            idx = torch.sort(torch.randperm(ctx, device=dev, generator=g)[:n]).values
            us = timed(lambda: F.scaled_dot_product_attention(q, k.index_select(2, idx), v.index_select(2, idx),
                                                              enable_gqa=True))
            print(f"{ctx} {b} sparse {us:.3f}", flush=True)
            del k, v
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
