#!/usr/bin/env python3
"""A model of k_topk_radix (kernels/cuda/kvops.cu) against the CPU backend's top-k semantics.

The kernel's order key (larger floats larger, -0 = +0, NaN below -inf), its four 8-bit radix passes for the
k-th largest key and its ordered take of the keys above it plus the lowest slots equal to it, replayed on
3000 random cases with ties, NaN, infinities, signed zeros and denormals, against sorting by the CPU's rule
(larger first, NaN last, ties to the lower slot) and keeping slot order. Pure Python.

  python3 kernels/cuda/dev/topk_radix_model.py
"""
import random, struct, math
def key(v):
    if math.isnan(v): return 0
    if v == 0.0: v = 0.0
    u = struct.unpack('<I', struct.pack('<f', v))[0]
    return (~u) & 0xFFFFFFFF if u & 0x80000000 else u | 0x80000000
def ref(x, k):
    k = min(k, len(x))
    def rk(i):
        v = x[i]
        return (1 if math.isnan(v) else 0, -v if not math.isnan(v) else 0, i)
    order = sorted(range(len(x)), key=rk)
    return sorted(order[:k])
def radix(x, k):
    n = len(x); k = min(k, n)
    if k <= 0: return []
    keys = [key(v) for v in x]
    prefix = mask = 0; rem = k
    for shift in (24, 16, 8, 0):
        hist = [0]*256
        for kk in keys:
            if kk & mask == prefix: hist[(kk >> shift) & 0xFF] += 1
        above = 0; d = 255
        while d > 0:
            if above + hist[d] >= rem: break
            above += hist[d]; d -= 1
        rem -= above; prefix |= d << shift; mask |= 0xFF << shift
    T = prefix; out = []; eqr = 0
    for i, kk in enumerate(keys):
        if kk > T: out.append(i)
        elif kk == T:
            if eqr < rem: out.append(i)
            eqr += 1
    return out
f32 = lambda v: struct.unpack('<f', struct.pack('<f', v))[0]
random.seed(1)
for t in range(3000):
    n = random.randint(1, 300)
    pool = [0.0, -0.0, float('nan'), float('inf'), -float('inf'), 1.5, -1.5, 1e-40, -1e-40, 3.4e38, -3.4e38]
    x = [f32(random.choice(pool)) if random.random() < 0.4 else f32(random.gauss(0, 10)) for _ in range(n)]
    if random.random() < 0.3: x = [f32(float(random.randint(-3, 3))) for _ in range(n)]
    k = random.randint(0, n + 3)
    assert radix(x, k) == ref(x, k), (x, k, radix(x, k), ref(x, k))
print("ok")
