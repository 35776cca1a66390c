#!/usr/bin/env python3
"""test_gpu_verdict.py KVBENCH — scripts/gpu_verdict.py reads the tables kvbench prints as they are printed.

1. Real tables: `kvbench bench --method ... --bound --profile` and `kvbench bench --contexts ... --bound` on the CPU
   (the same printf as on a GPU), saved under gpu-check's file names. Each figure the verdict reports is checked
   against the same figure found in the raw table by its column's position in the header, and its PASS / FAIL
   against the must-show's threshold applied here.
2. Made-up logs on both sides of every threshold (bench-attention's CSV, the 8B table beside PyTorch, OmniKV at 128K,
   the packed loads, summary.md), each expected verdict spelled out; a missing log is NOT RUN, and so are the
   must-shows of a log cut short (with the reason), the others still read.
Needs the default model (scripts/fetch-model.sh): without it, one line and a pass outside CI, a failure in CI.
"""
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VERDICT = os.path.join(ROOT, "scripts", "gpu_verdict.py")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def verdict(outdir):
    """{must-show: (measured, verdict)} from gpu_verdict.py's table."""
    out = subprocess.run([sys.executable, VERDICT, outdir], capture_output=True, text=True, check=True).stdout
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 5 and cells[0] != "must-show":
            rows[cells[0]] = (cells[1], cells[3])
    return rows


def column(text, header_cell, row_first_cell):
    """The cell under header_cell in the row starting with row_first_cell, found by position (independently of the
    verdict's parser)."""
    head = None
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and header_cell in cells:
            head = cells
        elif head and line.startswith("|") and cells[0] == row_first_cell:
            return cells[head.index(header_cell)]
    return None


def real_tables(kvbench, model):
    d = tempfile.mkdtemp(prefix="kvb_verdict_")
    env = dict(os.environ, KVB_MODEL_DIR=os.path.dirname(model))
    m = subprocess.run([kvbench, "bench", "--method", "snapkv,streamingllm,round", "--budget", "30%", "--ctx-len", "600",
                        "-n", "4", "--bound", "--profile", "--threads", "2",
                        "--method-opt", "round:lw=13"], capture_output=True, text=True, env=env, cwd=ROOT)
    check(m.returncode == 0, f"kvbench bench --method: exit {m.returncode}: {m.stderr[-300:]}")
    b = subprocess.run([kvbench, "bench", "--contexts", "256,512", "-n", "4", "--bound", "--no-peer", "--threads", "2"],
                       capture_output=True, text=True, env=env, cwd=ROOT)
    check(b.returncode == 0, f"kvbench bench: exit {b.returncode}: {b.stderr[-300:]}")
    for name, text in (("bench_methods_8b_30.md", m.stdout), ("bench_methods_8b_profile.md", m.stdout),
                       ("bench_loads_cuda.md", m.stdout), ("bench_model_cuda.md", b.stdout), ("bench_graph1.md", b.stdout)):
        with open(os.path.join(d, name), "w") as f:
            f.write(text)
    v = verdict(d)
    # every method's % of its bound, from the raw table; the verdict lists those under 85%
    low = []
    for meth in ("full", "snapkv", "streamingllm", "round"):
        cell = column(m.stdout, "% of bound", meth)
        check(cell is not None and re.match(r"^\d+%$", cell), f"{meth}: % of bound cell {cell!r}")
        if cell and int(cell[:-1]) < 85:
            low.append(f"{meth} {cell}")
    got = v.get("methods within 85% of their byte bound (bench_methods_8b_30.md)")
    check(got == ((", ".join(low) or "all"), "FAIL" if low else "PASS"), f"bound verdict {got} vs {low}")
    slower = []
    for meth in ("snapkv", "streamingllm", "round"):
        s = float(column(m.stdout, "speedup vs full", meth).rstrip("x"))
        if s <= 1.0:
            slower.append(f"{meth} {s:.2f}x")
    got = v.get("methods faster than full (bench_methods_8b_30.md: 3 methods)")
    check(got == ((", ".join(slower) or "all"), "FAIL" if slower else "PASS"), f"speedup verdict {got} vs {slower}")
    over = [f"{meth} {float(column(m.stdout, 'outside %', meth).rstrip('%')):.0f}%" for meth in ("full", "snapkv", "streamingllm", "round")
            if float(column(m.stdout, "outside %", meth).rstrip("%")) > 15]
    got = v.get("decode step outside attention and the GEMVs (methods, 8B, 32K)")
    check(got == ((", ".join(over) or "all 4 <= 15%"), "FAIL" if over else "PASS"), f"outside verdict {got} vs {over}")
    # the CPU makes no packed loads: the loads table is empty, so the must-show was not run
    check(v.get("Round Attention's packed host->device load: % of the pinned copy") == ("-", "NOT RUN"), "loads on the CPU")
    for ctx in ("256", "512"):
        t = float(column(b.stdout, "decode tok/s", ctx))
        for how in ("", ", CUDA graphs"):  # the model step's table, and the graph step's run with graphs on
            got = v.get(f"default model decode at {ctx} tokens{how}")
            check(got == (f"{t:.0f} tok/s ({t / 273:.2f}x)", "PASS" if t >= 546 else "FAIL"), f"model verdict{how} at {ctx}: {got}")


def made_up():
    d = tempfile.mkdtemp(prefix="kvb_verdict_")
    files = {
        "bench_attention.csv": "ctx,batch,case,us,gbps,copy_gbps,pct_of_copy,torch_us,speedup_vs_torch\n"
        "8192,1,full_v4,15.4,1000,2000,50.0,22.2,1.44x\n"  # under 32K: not a must-show point
        "32768,1,copy,34.8,3857,3857,100,,\n"
        "32768,1,full,60.0,2237,3857,58.0,39.8,0.66x\n"
        "32768,1,full_v4,40.0,3355,3857,87.0,41.0,1.02x\n"
        "32768,1,sparse_v4,5.0,2952,3857,76.5,,\n"  # 88% of the dense path's GB/s
        "32768,8,full_v4,255.3,4205,4100,102.6,244.3,0.96x\n"
        "32768,8,full_fi,240.0,4473,4100,109.1,244.3,1.02x\n"
        "32768,8,sparse_v4,40.1,2676,4100,65.3,,\n",  # 64%
        # v4's candidate prefetch at batch 1 only: shown beside the default's figures, the verdicts stay the default's
        "bench_attention_pf2.csv": "ctx,batch,case,us,gbps,copy_gbps,pct_of_copy,torch_us,speedup_vs_torch\n"
        "32768,1,full_v4,36.0,3728,3857,96.7,,\n"
        "32768,1,sparse_v4,4.0,3355,3857,87.0,,\n",  # 90% of its dense path's GB/s
        "bench_synth_new.md": "| ctx | prefill tok/s | decode tok/s | GB/step | bound ms | % of bound | TTFT s | ms/token | "
        "PyTorch TTFT s | PyTorch ms/token | TTFT: PyTorch/ours | decode: PyTorch/ours |\n"
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
        "| 32768 | 4729.0 | 100.0 | 20.1 | 8.5 | 85% | 6.929 | 10.00 | 6.000 | 11.00 | 0.87x | 1.10x |\n"
        "| 65536 | 4000.0 | 80.0 | 24.0 | 10.0 | 80% | 16.384 | 12.50 | 13.000 | 13.00 | 0.79x | 1.04x |\n"
        "| 131072 | 3000.0 | 60.0 | 32.0 | 15.0 | 90% | 43.691 | 16.67 | out of memory | - | - | - |\n",
        "bench_omnikv_128k.md": "| method | prefill s | decode ms/token | speedup vs full | GB/step | bound ms | % of bound | "
        "bound speedup | % of bound speedup | device KV MiB |\n|---|---|---|---|---|---|---|---|---|---|\n"
        "| full | 68.1 | 11.35 | 1.00x | 32.0 | 7.68 | 68% | 1.00x | 100% | 16384.00 |\n"
        "| omnikv | 0.0 | 7.00 | 1.62x | 20.0 | 4.65 | 66% | 1.65x | 98% | 16384.00 |\n",
        "bench_methods_8b_2048.md": "| method | prefill s | decode ms/token | speedup vs full | GB/step | bound ms | "
        "% of bound | bound speedup | % of bound speedup |\n|---|---|---|---|---|---|---|---|---|\n"
        "| full | 7.0 | 8.95 | 1.00x | 20.1 | 4.65 | 52% | 1.00x | 100% |\n"
        "| snapkv | 7.0 | 7.40 | 1.21x | 19.0 | 6.50 | 88% | 1.10x | 110% |\n"
        "| tova | 7.0 | 32.39 | 0.28x | 19.0 | 3.90 | 12% | 1.10x | 25% |\n",
        "bench_loads_cuda.md": "| method | loads | MiB | ms | GB/s | % of pinned copy |\n|---|---:|---:|---:|---:|---:|\n"
        "| round | 1 | 17.00 | 0.4 | 45.00 | 81% |\n| omnikv | 30 | 100.00 | 7.0 | 15.00 | 27% |\n",
        "summary.md": "| step | result | seconds | log |\n|---|---|---:|---|\n"
        "| test_cuda_ops (every op) | pass | 20 | cuda_ops.log |\n"
        "| test_cuda_model (every method) | FAIL (exit 1) | 30 | cuda_model.log |\n"
        "| compute-sanitizer --tool racecheck: x | NOT RUN: the deadline (KVB_GPU_DEADLINE=540 s) | - | - |\n"
        "| bench-attention (Llama-3-8B shapes, 8K-128K) | pass | 12 | bench_attention.md |\n",
    }
    for name, text in files.items():
        with open(os.path.join(d, name), "w") as f:
            f.write(text)
    v = verdict(d)
    want = {
        "test_cuda_ops (every op)": ("pass", "PASS"),
        "test_cuda_model (every method)": ("FAIL (exit 1)", "FAIL"),
        "compute-sanitizer --tool racecheck: x": ("-", "NOT RUN"),
        "dense decode attention full_v4, 32K, batch 1: % of the copy rate": ("87% (fastest: full_v4, 87%; prefetch 2: 97%)",
                                                                              "PASS"),
        "dense decode attention full_v4, 32K, batch 1: vs PyTorch SDPA": ("1.02x", "PASS"),
        "10% index list full_v4, 32K, batch 1: GB/s as % of the dense path's": ("88% (prefetch 2: 90%)", "PASS"),
        "dense decode attention full_v4, 32K, batch 8: % of the copy rate": ("103% (fastest: full_fi, 109%)", "PASS"),
        "dense decode attention full_v4, 32K, batch 8: vs PyTorch SDPA": ("0.96x", "FAIL"),
        "10% index list full_v4, 32K, batch 8: GB/s as % of the dense path's": ("64%", "FAIL"),
        "synthetic:llama3.1-8b 32K: our TTFT / PyTorch's": ("1.15x", "PASS"),
        "synthetic:llama3.1-8b 32K: decode, % of its byte bound": ("85%", "PASS"),
        "synthetic:llama3.1-8b 64K: our TTFT / PyTorch's": ("1.27x", "FAIL"),
        "synthetic:llama3.1-8b 64K: decode, % of its byte bound": ("80%", "FAIL"),
        "synthetic:llama3.1-8b 128K: our TTFT / PyTorch's": ("-", "NOT RUN"),  # the peer ran out of memory
        "synthetic:llama3.1-8b 128K: decode, % of its byte bound": ("90%", "PASS"),
        "methods faster than full (bench_methods_8b_2048.md: 2 methods)": ("tova 0.28x", "FAIL"),
        "methods within 85% of their byte bound (bench_methods_8b_2048.md)": ("full 52%, tova 12%", "FAIL"),
        "decode step outside attention and the GEMVs (methods, 8B, 32K)": ("-", "NOT RUN"),
        "OmniKV at 128K: % of its byte-bound ratio to full": ("98%", "PASS"),
        "Round Attention's packed host->device load: % of the pinned copy": ("81%", "PASS"),
        "default model decode": ("-", "NOT RUN"),
    }
    check(v == want, "made-up logs: " + "; ".join(f"{k}: got {v.get(k)}, want {want.get(k)}"
                                                  for k in sorted(set(v) | set(want)) if v.get(k) != want.get(k)))


def malformed():
    """A log cut short: its must-shows are NOT RUN with the reason, the others still read."""
    d = tempfile.mkdtemp(prefix="kvb_verdict_")
    with open(os.path.join(d, "bench_attention.csv"), "w") as f:
        f.write("ctx,batch,case,us,gbps\n32768,1,full_v4,12.")  # cut inside a row
    with open(os.path.join(d, "bench_loads_cuda.md"), "w") as f:
        f.write("| method | loads | MiB | ms | GB/s | % of pinned copy |\n|---|---:|---:|---:|---:|---:|\n| round | 1 | 17.00 | 0.4 | 45.00 | 90% |\n")
    v = verdict(d)
    check(v.get("attention", ("", ""))[0].startswith("unreadable: ") and v["attention"][1] == "NOT RUN", f"cut csv: {v.get('attention')}")
    check(v.get("Round Attention's packed host->device load: % of the pinned copy") == ("90%", "PASS"), "the others read")


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip())
        return 2
    made_up()
    malformed()
    home = os.environ.get("KVB_MODEL_DIR") or os.path.join(os.environ.get("HOME", "/root"), ".cache", "kvbench", "models")
    model = os.path.join(home, "SmolLM2-135M-Instruct.Q4_1.gguf")
    if os.path.exists(model):
        real_tables(os.path.abspath(sys.argv[1]), model)
    elif os.environ.get("CI") in ("true", "1"):
        check(False, f"the default model is missing at {model} (CI must have it)")
    else:
        print(f"test_gpu_verdict: default model absent at {model}: the real tables were skipped")
    print("test_gpu_verdict:", "FAILED" if failures else "passed", f"({len(failures)} failures)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
