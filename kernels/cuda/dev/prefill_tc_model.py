#!/usr/bin/env python3
"""A lane-level model of k_attn_prefill_tc (kernels/cuda/attn_prefill.cu) against float64 attention.

Each warp's 32 lanes are replayed with the kernel's own index expressions; mma.m16n8k16 is modelled by
rebuilding A (16x16), B (16x8) and C (16x8) from the PTX fragment layouts, so a wrong fragment index shows as
an O(1) error while a right one leaves f16 rounding (~1e-4). Shuffled key positions give the causal mask;
query and key counts that are not multiples of 16 and 64 cover the partial warp and the partial tile.
Needs numpy (not a CI test: a check to rerun when the kernel's indexing changes).

  python3 kernels/cuda/dev/prefill_tc_model.py
"""
import numpy as np
rng = np.random.default_rng(0)
def f16(x): return np.float16(x).astype(np.float64)
def mma(c, a, b0, b1):
    # a[lane] = 4 pairs; b0[lane], b1[lane] = pairs; c[lane] = 4 floats -> rebuild matrices by the layouts
    A = np.zeros((16, 16)); B = np.zeros((16, 8))
    for lane in range(32):
        g, ci = lane >> 2, lane & 3
        A[g, 2*ci:2*ci+2] = a[lane][0]; A[g+8, 2*ci:2*ci+2] = a[lane][1]
        A[g, 8+2*ci:8+2*ci+2] = a[lane][2]; A[g+8, 8+2*ci:8+2*ci+2] = a[lane][3]
        B[2*ci:2*ci+2, g] = b0[lane]; B[8+2*ci:8+2*ci+2, g] = b1[lane]
    C = A @ B
    for lane in range(32):
        g, ci = lane >> 2, lane & 3
        c[lane] = [c[lane][0] + C[g, 2*ci], c[lane][1] + C[g, 2*ci+1], c[lane][2] + C[g+8, 2*ci], c[lane][3] + C[g+8, 2*ci+1]]
def run(D, nq, nk, PK=64):
    q = rng.uniform(-1, 1, (nq, D)); K = f16(rng.uniform(-1, 1, (nk, D))); V = f16(rng.uniform(-1, 1, (nk, D)))
    kpos = rng.permutation(nk); qpos = np.array([(t * nk) // nq + 3 for t in range(nq)]); qpos[0] = nk // 10
    scale = 1 / np.sqrt(D)
    out = np.zeros((nq, D)); lse = np.zeros(nq)
    for tw in range(0, nq, 16):  # one warp at a time
        DK, DN = D // 16, D // 8
        qa = [[None]*4 for _ in range(32)]
        qa = [[[None]*4 for _ in range(DK)] for _ in range(32)]
        qp = {}
        for lane in range(32):
            g, ci = lane >> 2, lane & 3; r0, r1 = tw + g, tw + g + 8
            row = lambda r, d: f16(q[r, d:d+2]) if r < nq else np.zeros(2)
            for kk in range(DK):
                d0 = kk*16 + 2*ci
                qa[lane][kk] = [row(r0, d0), row(r1, d0), row(r0, d0+8), row(r1, d0+8)]
            qp[lane] = (qpos[r0] if r0 < nq else -2**31, qpos[r1] if r1 < nq else -2**31)
        o = [[[0.0]*4 for _ in range(DN)] for _ in range(32)]
        m = [[-np.inf, -np.inf] for _ in range(32)]; l = [[0.0, 0.0] for _ in range(32)]
        for kb in range(0, nk, PK):
            Ks = np.zeros((PK, D)); Vs = np.zeros((PK, D)); kp = np.full(PK, 2**31 - 1)
            for r in range(PK):
                if kb + r < nk: Ks[r] = K[kb+r]; Vs[r] = V[kb+r]; kp[r] = kpos[kb+r]
            s = [[[0.0]*4 for _ in range(PK//8)] for _ in range(32)]
            for nt in range(PK // 8):
                cc = [s[lane][nt] for lane in range(32)]
                for kk in range(DK):
                    b0 = [Ks[nt*8 + (lane >> 2), kk*16 + 2*(lane & 3): kk*16 + 2*(lane & 3) + 2] for lane in range(32)]
                    b1 = [Ks[nt*8 + (lane >> 2), kk*16 + 8 + 2*(lane & 3): kk*16 + 8 + 2*(lane & 3) + 2] for lane in range(32)]
                    mma(cc, [qa[lane][kk] for lane in range(32)], b0, b1)
                for lane in range(32): s[lane][nt] = cc[lane]
            mx = {}
            for lane in range(32):
                ci = lane & 3; q0, q1 = qp[lane]; mx0 = mx1 = -np.inf
                for nt in range(PK // 8):
                    k0 = nt*8 + 2*ci; v = s[lane][nt]
                    v = [v[0]*scale if kp[k0] <= q0 else -np.inf, v[1]*scale if kp[k0+1] <= q0 else -np.inf,
                         v[2]*scale if kp[k0] <= q1 else -np.inf, v[3]*scale if kp[k0+1] <= q1 else -np.inf]
                    s[lane][nt] = v; mx0 = max(mx0, v[0], v[1]); mx1 = max(mx1, v[2], v[3])
                mx[lane] = (mx0, mx1)
            for lane in range(32):  # quad reduction
                base = lane & ~3
                mx[lane] = (max(mx[b][0] for b in range(base, base+4)), max(mx[b][1] for b in range(base, base+4)))
            pa = {}; sums = {}; cs = {}
            for lane in range(32):
                n0 = max(m[lane][0], mx[lane][0]); n1 = max(m[lane][1], mx[lane][1])
                c0 = 0.0 if m[lane][0] == -np.inf else np.exp(m[lane][0] - n0); c1 = 0.0 if m[lane][1] == -np.inf else np.exp(m[lane][1] - n1)
                m[lane] = [n0, n1]; cs[lane] = (c0, c1)
                p = [[None]*4 for _ in range(PK // 16)]; s0 = s1 = 0.0
                for nt in range(PK // 8):
                    v = s[lane][nt]
                    e = [0.0 if v[0] == -np.inf else np.exp(v[0]-n0), 0.0 if v[1] == -np.inf else np.exp(v[1]-n0),
                         0.0 if v[2] == -np.inf else np.exp(v[2]-n1), 0.0 if v[3] == -np.inf else np.exp(v[3]-n1)]
                    s0 += e[0] + e[1]; s1 += e[2] + e[3]
                    p[nt//2][(nt % 2)*2] = f16(np.array(e[0:2])); p[nt//2][(nt % 2)*2 + 1] = f16(np.array(e[2:4]))
                pa[lane] = p; sums[lane] = (s0, s1)
            for lane in range(32):
                base = lane & ~3
                t0 = sum(sums[b][0] for b in range(base, base+4)); t1 = sum(sums[b][1] for b in range(base, base+4))
                l[lane] = [l[lane][0]*cs[lane][0] + t0, l[lane][1]*cs[lane][1] + t1]
            for dn in range(DN):
                cc = []
                for lane in range(32):
                    c0, c1 = cs[lane]; v = o[lane][dn]; cc.append([v[0]*c0, v[1]*c0, v[2]*c1, v[3]*c1])
                for ks in range(PK // 16):
                    b0 = []; b1 = []
                    for lane in range(32):
                        g, ci = lane >> 2, lane & 3; k0 = ks*16 + 2*ci; n = dn*8 + g
                        b0.append(np.array([Vs[k0, n], Vs[k0+1, n]])); b1.append(np.array([Vs[k0+8, n], Vs[k0+9, n]]))
                    mma(cc, [pa[lane][ks] for lane in range(32)], b0, b1)
                for lane in range(32): o[lane][dn] = cc[lane]
        for lane in range(32):
            g, ci = lane >> 2, lane & 3; r0, r1 = tw + g, tw + g + 8
            for dn in range(DN):
                d = dn*8 + 2*ci
                if r0 < nq: out[r0, d:d+2] = np.array(o[lane][dn][0:2]) / l[lane][0] if l[lane][0] > 0 else 0
                if r1 < nq: out[r1, d:d+2] = np.array(o[lane][dn][2:4]) / l[lane][1] if l[lane][1] > 0 else 0
            if ci == 0:
                if r0 < nq: lse[r0] = m[lane][0] + np.log(l[lane][0]) if l[lane][0] > 0 else -np.inf
                if r1 < nq: lse[r1] = m[lane][1] + np.log(l[lane][1]) if l[lane][1] > 0 else -np.inf
    # reference
    worst = 0; wl = 0
    for t in range(nq):
        sc = (q[t] @ K.T) * scale; vis = kpos <= qpos[t]; sc[~vis] = -np.inf
        mm = sc.max(); p = np.exp(sc - mm); L = p.sum(); ref = (p / L) @ V
        worst = max(worst, np.abs(ref - out[t]).max()); wl = max(wl, abs(mm + np.log(L) - lse[t]))
    return worst, wl
worst_all = 0
for D, nq, nk in [(64, 20, 100), (128, 33, 130), (64, 16, 64)]:
    w, wl = run(D, nq, nk)
    worst_all = max(worst_all, w, wl)
    print(f"d={D} queries={nq} keys={nk}: max |out error| {w:.2e}, max |lse error| {wl:.2e}")
raise SystemExit(0 if worst_all < 2e-3 else 1)
