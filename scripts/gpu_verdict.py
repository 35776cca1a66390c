#!/usr/bin/env python3
"""gpu_verdict.py OUTDIR — the GPU issue's must-shows read from a gpu-check OUTDIR (or its results.tgz).

Each must-show becomes rows of one Markdown table: what, the measured figure, the target, PASS / FAIL / NOT RUN,
and the file it was read from. Nothing is estimated: a figure missing from the logs is NOT RUN. gpu-check.sh appends
this table to summary.md, so a lent GPU's one call returns its verdict with its logs.

Sources (gpu-check's file names): bench_attention.csv (dense and 10% decode attention against the device copy and
PyTorch SDPA; bench_attention_pf1.csv and _pf2.csv, v4's candidate L2 prefetch, shown beside the default's figures),
bench_synth_new.md (synthetic:llama3.1-8b beside PyTorch: TTFT ratio, % of the decode byte bound),
bench_methods_8b_*.md (every method against full at 32K: speedup, % of bound), bench_methods_8b_profile.md (the
share of each decode step outside attention and the matmuls), bench_omnikv_128k.md (% of the byte-bound speedup),
bench_loads_cuda.md (packed loads, % of the pinned copy), bench_model_cuda.md and bench_graph1.md (the default model's decode tok/s, the second with CUDA graphs) and
summary.md (the correctness steps).
"""
import csv
import io
import os
import re
import sys
import tarfile

DENSE_KERNEL = os.environ.get("KVB_VERDICT_KERNEL", "full_v4")  # the default decode kernel's bench-attention case
OLD_TOK_S = 273.0  # the default model's decode before (250-273 tok/s): the target is twice the higher


def md_tables(text):
    """Every Markdown table in text: a list of (header, rows), each row a dict by header name."""
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.match(r"^\|[\s:|-]+\|\s*$", lines[i + 1]):
            head = [c.strip() for c in lines[i].strip().strip("|").split("|")]
            rows, i = [], i + 2
            while i < len(lines) and lines[i].startswith("|"):
                cells = [c.strip() for c in lines[i].strip().strip("|").split("|")]
                rows.append(dict(zip(head, cells)))
                i += 1
            out.append((head, rows))
        else:
            i += 1
    return out


def num(cell):
    """The number a cell starts with ('1.23x', '85%', '12.0'), or None ('-', 'out of memory')."""
    m = re.match(r"^\s*(-?\d+(?:\.\d+)?)", cell or "")
    return float(m.group(1)) if m else None


def table_with(text, column):
    """The first table of text that has the column, or None."""
    for head, rows in md_tables(text):
        if column in head:
            return rows
    return None


class Verdict:
    def __init__(self, files):
        self.files, self.rows = files, []

    def add(self, what, value, target, ok, source):
        verdict = "NOT RUN" if value is None else ("PASS" if ok else "FAIL")
        self.rows.append((what, "-" if value is None else value, target, verdict, source))

    def read(self, name):
        return self.files.get(name)

    def attention(self):
        text = self.read("bench_attention.csv")
        src = "bench_attention.csv"
        pts = {}
        for r in csv.DictReader(io.StringIO(text or "")):
            pts.setdefault((int(r["ctx"]), int(r["batch"])), {})[r["case"]] = r
        long_pts = sorted(p for p in pts if p[0] >= 32768 and p[1] in (1, 8))
        if not long_pts:
            for what in ("dense decode attention, % of the copy rate", "dense decode attention vs PyTorch SDPA",
                         "10% index lists, GB/s as % of the dense path's"):
                self.add(what, None, "", False, src)
            return
        # v4's candidate L2 prefetch (bench_attention_pf1.csv, _pf2.csv: the same bench with KVB_ATTN_PREFETCH), shown
        # beside the default's figures; the verdict stays the default's
        cand = {}
        for pf in (1, 2):
            for r in csv.DictReader(io.StringIO(self.read(f"bench_attention_pf{pf}.csv") or "")):
                cand.setdefault((int(r["ctx"]), int(r["batch"])), {}).setdefault(pf, {})[r["case"]] = r
        sparse = DENSE_KERNEL.replace("full", "sparse", 1)

        def list_ratio(cases):  # the index list's GB/s as % of the dense path's, or None
            d, s = cases.get(DENSE_KERNEL), cases.get(sparse)
            return float(s["gbps"]) / float(d["gbps"]) * 100 if d and s and float(d["gbps"]) > 0 else None

        for ctx, b in long_pts:
            cases = pts[(ctx, b)]
            pfs = sorted(cand.get((ctx, b), {}).items())
            pf_pct = ", ".join(f"prefetch {pf}: {float(c[DENSE_KERNEL]['pct_of_copy']):.0f}%"
                               for pf, c in pfs if DENSE_KERNEL in c)
            pf_ratio = ", ".join(f"prefetch {pf}: {list_ratio(c):.0f}%" for pf, c in pfs if list_ratio(c) is not None)
            d = cases.get(DENSE_KERNEL)
            at = f"{ctx // 1024}K, batch {b}"
            dense = [c for k, c in cases.items() if k.startswith("full")]
            best = min(dense, key=lambda c: float(c["us"])) if dense else None
            fastest = f" (fastest: {best['case']}, {float(best['pct_of_copy']):.0f}%{'; ' + pf_pct if pf_pct else ''})" if best else ""
            pct = num(d["pct_of_copy"]) if d else None
            self.add(f"dense decode attention {DENSE_KERNEL}, {at}: % of the copy rate",
                     None if pct is None else f"{pct:.0f}%{fastest}", ">= 75%", pct is not None and pct >= 75, src)
            vs = num(d["speedup_vs_torch"]) if d else None
            self.add(f"dense decode attention {DENSE_KERNEL}, {at}: vs PyTorch SDPA", None if vs is None else f"{vs:.2f}x",
                     ">= 1.00x", vs is not None and vs >= 1.0, src)
            ratio = list_ratio(cases)
            self.add(f"10% index list {DENSE_KERNEL}, {at}: GB/s as % of the dense path's",
                     None if ratio is None else f"{ratio:.0f}%" + (f" ({pf_ratio})" if pf_ratio else ""), ">= 85%",
                     ratio is not None and ratio >= 85, src)

    def synthetic(self):
        src = "bench_synth_new.md"
        rows = table_with(self.read(src) or "", "TTFT: PyTorch/ours") or []
        for ctx in (32768, 65536, 131072):
            r = next((r for r in rows if num(r.get("ctx")) == ctx), None)
            ratio = num(r["TTFT: PyTorch/ours"]) if r else None
            self.add(f"synthetic:llama3.1-8b {ctx // 1024}K: our TTFT / PyTorch's",
                     None if ratio is None or ratio <= 0 else f"{1 / ratio:.2f}x", "<= 1.20x",
                     ratio is not None and ratio > 0 and 1 / ratio <= 1.2, src)
            pct = num(r.get("% of bound")) if r else None
            self.add(f"synthetic:llama3.1-8b {ctx // 1024}K: decode, % of its byte bound",
                     None if pct is None else f"{pct:.0f}%", ">= 85%", pct is not None and pct >= 85, src)

    def methods(self):
        names = sorted(n for n in self.files if re.match(r"bench_methods_8b_\d+(_\d+)?\.md$", n))
        if not names:
            self.add("every method on synthetic:llama3-8b at 32K", None, "", False, "bench_methods_8b_*.md")
        for src in names:
            rows = table_with(self.files[src], "speedup vs full") or []
            slower = [f"{r['method']} {num(r['speedup vs full']):.2f}x" for r in rows[1:]
                      if num(r.get("speedup vs full")) is not None and num(r["speedup vs full"]) <= 1.0]
            self.add(f"methods faster than full ({src}: {len(rows) - 1} methods)",
                     None if len(rows) < 2 else (", ".join(slower) or "all"), "every one > 1.00x",
                     len(rows) >= 2 and not slower, src)
            low = [f"{r['method']} {num(r['% of bound']):.0f}%" for r in rows
                   if num(r.get("% of bound")) is not None and num(r["% of bound"]) < 85]
            have = any(num(r.get("% of bound")) is not None for r in rows)
            self.add(f"methods within 85% of their byte bound ({src})", (", ".join(low) or "all") if have else None,
                     ">= 85% each", have and not low, src)
        src = "bench_methods_8b_profile.md"
        rows = table_with(self.read(src) or "", "outside %") or []
        over = [f"{r['method']} {num(r['outside %']):.0f}%" for r in rows
                if num(r.get("outside %")) is not None and num(r["outside %"]) > 15]
        self.add("decode step outside attention and the GEMVs (methods, 8B, 32K)",
                 (", ".join(over) or f"all {len(rows)} <= 15%") if rows else None, "<= 15% each", rows and not over, src)

    def omnikv(self):
        src = "bench_omnikv_128k.md"
        rows = table_with(self.read(src) or "", "% of bound speedup") or []
        r = next((r for r in rows if r.get("method") == "omnikv"), None)
        pct = num(r["% of bound speedup"]) if r else None
        self.add("OmniKV at 128K: % of its byte-bound ratio to full", None if pct is None else f"{pct:.0f}%", ">= 90%",
                 pct is not None and pct >= 90, src)

    def loads(self):
        src = "bench_loads_cuda.md"
        rows = table_with(self.read(src) or "", "% of pinned copy") or []
        r = next((r for r in rows if r.get("method") == "round"), None)
        pct = num(r["% of pinned copy"]) if r else None
        self.add("Round Attention's packed host->device load: % of the pinned copy", None if pct is None else f"{pct:.0f}%",
                 ">= 80%", pct is not None and pct >= 80, src)

    def model(self):
        # the model step (the defaults), and the graph step's run with each decode step as one CUDA graph (a candidate)
        seen = 0
        for src, how in (("bench_model_cuda.md", ""), ("bench_graph1.md", ", CUDA graphs")):
            rows = table_with(self.read(src) or "", "decode tok/s") or []
            seen += len(rows)
            for r in rows:
                t = num(r.get("decode tok/s"))
                self.add(f"default model decode at {r.get('ctx')} tokens{how}",
                         None if t is None else f"{t:.0f} tok/s ({t / OLD_TOK_S:.2f}x)",
                         f">= {2 * OLD_TOK_S:.0f} tok/s (2x {OLD_TOK_S:.0f})", t is not None and t >= 2 * OLD_TOK_S, src)
        if not seen:
            self.add("default model decode", None, f">= {2 * OLD_TOK_S:.0f} tok/s", False, "bench_model_cuda.md")

    def correctness(self):
        rows = table_with(self.read("summary.md") or "", "result") or []
        for r in rows:
            step = r.get("step", "")
            if re.match(r"^(test_|compute-sanitizer)", step):
                res = r.get("result", "")
                self.add(step, None if res.startswith("NOT RUN") else res, "pass", res == "pass", "summary.md")


def load(path):
    """{file name: text} of an OUTDIR or a results.tgz (its files, whatever folder they are in)."""
    files = {}
    if os.path.isdir(path):
        for root, _, names in os.walk(path):
            for n in names:
                with open(os.path.join(root, n), errors="replace") as f:
                    files.setdefault(n, f.read())
    else:
        with tarfile.open(path) as t:
            for m in t.getmembers():
                if m.isfile():
                    files.setdefault(os.path.basename(m.name), t.extractfile(m).read().decode(errors="replace"))
    return files


def main(argv):
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(argv) == 2 else 2
    if not os.path.exists(argv[1]):
        print(f"gpu_verdict: {argv[1]}: no such folder or file", file=sys.stderr)
        return 2
    v = Verdict(load(argv[1]))
    for part in (v.correctness, v.attention, v.synthetic, v.methods, v.omnikv, v.loads, v.model):
        try:
            part()
        except (KeyError, ValueError, TypeError, ZeroDivisionError) as e:  # a log cut short or malformed
            v.rows.append((part.__name__, f"unreadable: {type(e).__name__} {e}", "", "NOT RUN", "-"))
    print("## The must-shows (scripts/gpu_verdict.py)\n")
    print("| must-show | measured | target | verdict | from |")
    print("|---|---|---|---|---|")
    for row in v.rows:
        print("| " + " | ".join(str(c) for c in row) + " |")
    counts = {k: sum(1 for r in v.rows if r[3] == k) for k in ("PASS", "FAIL", "NOT RUN")}
    print(f"\n{counts['PASS']} pass, {counts['FAIL']} fail, {counts['NOT RUN']} not run")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
