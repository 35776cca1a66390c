#!/usr/bin/env python3
"""Summarise an Nsight Compute raw CSV (`ncu --csv --page raw --metrics ...`) per kernel name: launches, mean
and best achieved DRAM throughput (% of peak), DRAM bytes read and time. scripts/gpu-check.sh runs it on the
attention kernels of `kvbench bench-attention`.

  python3 scripts/ncu_summary.py ncu.csv

Prints a Markdown table; exit 1 with a one-line message when the file has no kernel rows.
"""
import csv
import sys
from collections import OrderedDict

DRAM = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
READ = "dram__bytes_read.sum"
TIME = "gpu__time_duration.sum"


def number(s):
    try:
        return float(str(s).replace(",", ""))
    except ValueError:
        return None


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: ncu_summary.py NCU.csv")
    with open(sys.argv[1], newline="") as f:
        # ncu prints its own lines (==PROF== ...) before the table: start at the header row
        lines = [ln for ln in f if ln.startswith('"ID"') or (ln.startswith('"') and not ln.startswith('"=='))]
    rows = list(csv.DictReader(lines))
    units = {}
    if rows and "Metric Name" in rows[0]:  # the long layout (--page details): one row per metric, wide it
        wide = OrderedDict()
        for r in rows:
            w = wide.setdefault(r.get("ID"), dict(r))
            w[r["Metric Name"]] = r.get("Metric Value")
            units[r["Metric Name"]] = r.get("Metric Unit", "?")
        rows = list(wide.values())
    kernels = OrderedDict()
    for r in rows:
        if number(r.get("ID")) is None:  # the units row of --page raw
            units = r
            continue
        name = (r.get("Kernel Name") or r.get("Function Name") or "?").split("(")[0]
        k = kernels.setdefault(name, {"n": 0, "dram": [], "read": 0.0, "time": 0.0})
        k["n"] += 1
        d, b, t = number(r.get(DRAM)), number(r.get(READ)), number(r.get(TIME))
        if d is not None:
            k["dram"].append(d)
        k["read"] += b or 0.0
        k["time"] += t or 0.0
    if not kernels:
        sys.exit(f"ncu_summary: no kernel rows in {sys.argv[1]}")
    read_unit, time_unit = units.get(READ, "?"), units.get(TIME, "?")
    print(f"| kernel | launches | DRAM % of peak (mean) | DRAM % (best) | read ({read_unit}) | time ({time_unit}) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, k in kernels.items():
        mean = sum(k["dram"]) / len(k["dram"]) if k["dram"] else float("nan")
        best = max(k["dram"]) if k["dram"] else float("nan")
        print(f"| {name} | {k['n']} | {mean:.1f} | {best:.1f} | {k['read']:.4g} | {k['time']:.4g} |")


if __name__ == "__main__":
    main()
