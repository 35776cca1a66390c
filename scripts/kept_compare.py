#!/usr/bin/env python3
"""Compare two kept-position dumps (kvbench's --dump-kept JSON lines, or a reference from scripts/kvpress_kept.py):
per method, the Jaccard index |A & B| / |A | B| of the positions each (layer, KV head) kept, its minimum and mean,
and the heads below a threshold. Standard library only.

    python3 scripts/kept_compare.py kvbench.jsonl tests/fixtures/kvpress/snapkv.jsonl [--min 0.98] [--when prefill]

A dump is a sequence of sections: a header line holding "method" (and "opts", "n_prompt", ...), then one line per
(layer, KV head) {"when", "layer", "kv_head", "positions"}. A file may hold several methods; methods are paired by
name, or, when each file holds exactly one, with each other whatever their names. A head present in one file and
not the other counts as Jaccard 0. Exit status: 0 when every compared head reaches --min, 1 when one does not,
2 when the files share nothing to compare (no common method, or no head of phase --when).
"""
import argparse
import json
import sys


def read_dump(path, when):
    """{method: {"header": dict, "heads": {(layer, kv_head): set of positions}}} for records of phase `when`."""
    methods, cur = {}, None
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            rec = json.loads(line)
            if "method" in rec:
                cur = methods.setdefault(rec["method"], {"header": rec, "heads": {}})
            elif "positions" in rec:
                if cur is None:
                    sys.exit(f"{path}:{n}: a positions line before any header line")
                if rec.get("when", "prefill") == when:
                    cur["heads"][(rec["layer"], rec["kv_head"])] = set(rec["positions"])
    return methods


def pairs(a, b):
    """(label, method in a, method in b) to compare."""
    common = [m for m in a if m in b]
    if common:
        return [(m, a[m], b[m]) for m in common]
    if len(a) == 1 and len(b) == 1:
        (ma, da), (mb, db) = next(iter(a.items())), next(iter(b.items()))
        return [(f"{ma} vs {mb}", da, db)]
    return []


def jaccard(x, y):
    u = len(x | y)
    return len(x & y) / u if u else 1.0


def compare(label, da, db, threshold):
    """Print one method's figures; return its minimum Jaccard, None when neither file has a head for it."""
    keys = sorted(set(da["heads"]) | set(db["heads"]))
    if not keys:
        print(f"{label}: no heads to compare")
        return None
    rows = [(k, jaccard(da["heads"].get(k, set()), db["heads"].get(k, set())),
             len(da["heads"].get(k, ())), len(db["heads"].get(k, ()))) for k in keys]
    js = [r[1] for r in rows]
    size_a, size_b = sum(r[2] for r in rows) / len(rows), sum(r[3] for r in rows) / len(rows)
    ha, hb = da["header"], db["header"]
    print(f"{label}: {len(rows)} heads, Jaccard min {min(js):.4f} mean {sum(js) / len(js):.4f}; "
          f"kept per head {size_a:.1f} vs {size_b:.1f}; opts '{ha.get('opts', '')}' vs '{hb.get('opts', '')}'")
    if ha.get("n_prompt") != hb.get("n_prompt"):
        print(f"  warning: n_prompt {ha.get('n_prompt')} vs {hb.get('n_prompt')}")
    low = [r for r in rows if r[1] < threshold]
    layers = sorted({r[0][0] for r in low})
    if low:
        print(f"  {len(low)} heads below {threshold} (layers {layers}):")
        for (layer, head), j, na, nb in low:
            print(f"    layer {layer:3d} head {head:2d}  Jaccard {j:.4f}  kept {na} vs {nb}")
    return min(js)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--min", type=float, default=0.98, help="fail (exit 1) when a head's Jaccard is below this")
    ap.add_argument("--when", default="prefill", help="which records to compare (prefill, end)")
    args = ap.parse_args()
    todo = pairs(read_dump(args.a, args.when), read_dump(args.b, args.when))
    if not todo:
        print("no method in common to compare", file=sys.stderr)
        return 2
    mins = [compare(label, da, db, args.min) for label, da, db in todo]
    mins = [m for m in mins if m is not None]
    if not mins:
        return 2
    return 0 if min(mins) >= args.min else 1


if __name__ == "__main__":
    sys.exit(main())
