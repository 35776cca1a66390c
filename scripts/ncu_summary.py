#!/usr/bin/env python3
"""Summarise an Nsight Compute raw CSV (`ncu --csv --page raw --metrics ...`) per kernel name: launches, mean
and best achieved DRAM throughput (% of peak), DRAM bytes read and time. scripts/gpu-check.sh runs it on the
attention kernels of `kvbench bench-attention`.

  python3 scripts/ncu_summary.py ncu.csv
  python3 scripts/ncu_summary.py --by-grid ncu.csv   one row per kernel and grid size (needs the metric
                                                       launch__grid_size): a decode step's GEMVs by shape

Prints a Markdown table; exit 1 with a one-line message when the file has no kernel rows.
"""
import csv
import sys
from collections import OrderedDict

DRAM = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
READ = "dram__bytes_read.sum"
TIME = "gpu__time_duration.sum"
GRID = "launch__grid_size"


def number(s):
    try:
        return float(str(s).replace(",", ""))
    except ValueError:
        return None


def main():
    args = sys.argv[1:]
    by_grid = bool(args) and args[0] == "--by-grid"
    if by_grid:
        args = args[1:]
    if len(args) != 1:
        sys.exit("usage: ncu_summary.py [--by-grid] NCU.csv")
    path = args[0]
    with open(path, newline="") as f:
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
        if by_grid:
            name += f" (grid {r.get(GRID, '?')})"
        k = kernels.setdefault(name, {"n": 0, "dram": [], "read": 0.0, "time": 0.0})
        k["n"] += 1
        d, b, t = number(r.get(DRAM)), number(r.get(READ)), number(r.get(TIME))
        if d is not None:
            k["dram"].append(d)
        k["read"] += b or 0.0
        k["time"] += t or 0.0
    if not kernels:
        sys.exit(f"ncu_summary: no kernel rows in {path}")
    read_unit, time_unit = units.get(READ, "?"), units.get(TIME, "?")
    # bytes over nanoseconds is GB/s; other units leave the column empty
    rate = read_unit == "byte" and time_unit == "ns"
    print(f"| kernel | launches | DRAM % of peak (mean) | DRAM % (best) | read ({read_unit}) | time ({time_unit}) | GB/s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, k in kernels.items():
        mean = sum(k["dram"]) / len(k["dram"]) if k["dram"] else float("nan")
        best = max(k["dram"]) if k["dram"] else float("nan")
        gbs = f"{k['read'] / k['time']:.0f}" if rate and k["time"] > 0 else ""
        print(f"| {name} | {k['n']} | {mean:.1f} | {best:.1f} | {k['read']:.4g} | {k['time']:.4g} | {gbs} |")


if __name__ == "__main__":
    main()
