#!/usr/bin/env python3
"""Fixtures for tests/test_ruler.c, made with RULER's own Python (NVIDIA/RULER; not copied here: give paths).

1. Scorer values: runs RULER's string_match_all / string_match_part (scripts/eval/synthetic/constants.py,
   imported as is) and postprocess_pred (scripts/eval/evaluate.py: only that function is executed, taken out
   with ast, since the module imports NeMo-side packages) on the cases below, one prediction at a time (the
   per-sample share x100) and as whole task batches (RULER's task score, rounded to 2 decimals), and writes
   tests/fixtures/ruler/scores.json. The C scorer (benchmarks/ruler.c) must give the same numbers.
2. A small word list for the generator tests (tests must not need the network): every 8th line of
   wonderwords 2.2.0's nounlist.txt, adjectivelist.txt and verblist.txt (the lists RULER draws from; get
   them with scripts/fetch-datasets.sh ruler or `pip download wonderwords==2.2.0`), written to
   tests/fixtures/ruler/words/.

    git clone https://github.com/NVIDIA/RULER        # made with c3f5e3b4f87f97e048793bb510a3a6b19a46bf3a
    python3 scripts/ruler_ref.py --ruler RULER --words ~/.cache/kvbench/datasets/ruler/wonderwords
"""
import argparse
import ast
import importlib.util
import json
import os
import random


def load_scorers(ruler):
    spec = importlib.util.spec_from_file_location("ruler_eval_constants",
                                                  os.path.join(ruler, "scripts/eval/synthetic/constants.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    src = open(os.path.join(ruler, "scripts/eval/evaluate.py")).read()
    fn = next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == "postprocess_pred")
    ns = {"re": __import__("re")}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "evaluate.py", "exec"), ns)
    return mod.string_match_all, mod.string_match_part, ns["postprocess_pred"]


def make_cases():
    c = [
        ("The special magic number for x is 1234567.", ["1234567"]),
        ("  1234567 and 7654321\n", ["1234567", "7654321", "1111111"]),
        ("", ["1234567"]),
        ("nothing here", ["abc"]),
        ("ANSWER: Fuzzy-Cat", ["fuzzy-cat"]),
        ("a\tb\x01c\x1fd\re", ["b\nc"]),
        ("\x03\x05 VAR ABCDE, VAR FGHIJ \x1e", ["ABCDE", "FGHIJ", "KLMNO", "PQRST", "UVWXY"]),
        ("1. apple 2. pear 3. plum", ["apple", "pear", "plum", "fig", "kiwi", "lime", "date", "yam", "nut", "oat"]),
        ("the words are: xqzwru, pplkmo and ...", ["xqzwru", "pplkmo", "abcdef"]),
        ("Denver Broncos", ["Denver Broncos", "Denver Broncos", "Broncos"]),
        ("Carolina", ["Denver Broncos", "Broncos"]),
        ("uuid 3f2a1c4e-8b7d-4e6f-9a0b-1c2d3e4f5a6b.", ["3F2A1C4E-8B7D-4E6F-9A0B-1C2D3E4F5A6B"]),
        ("partial 123456", ["1234567"]),
        ("empty ref matches", [""]),
    ]
    rng = random.Random(20261123)
    vocab = ["apple", "pear", "1234567", "7654321", "Broncos", "x", "VAR", "ABCDE", "fig", "the"]
    for _ in range(12):
        refs = rng.sample(vocab, rng.randint(1, 4))
        pred = " ".join(rng.choice(vocab + ["noise", "\n", "\x02"]) for _ in range(rng.randint(0, 8)))
        c.append((pred, refs))
    return c


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ruler", required=True, help="a checkout of NVIDIA/RULER")
    ap.add_argument("--words", help="directory with wonderwords' nounlist.txt, adjectivelist.txt, verblist.txt")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "../tests/fixtures/ruler"))
    a = ap.parse_args()
    match_all, match_part, post = load_scorers(a.ruler)
    cases = make_cases()
    out = {"source": "NVIDIA/RULER scripts/eval/synthetic/constants.py + evaluate.py postprocess_pred",
           "cases": [], "batches": []}
    for pred, refs in cases:
        p = post(pred, {})
        out["cases"].append({"pred": pred, "refs": refs, "post": p,
                             "string_match_all": match_all([p], [refs]),
                             "string_match_part": match_part([p], [refs])})
    for k in range(0, len(cases), 5):
        chunk = cases[k:k + 5]
        preds = [post(p, {}) for p, _ in chunk]
        refs = [r for _, r in chunk]
        out["batches"].append({"first": k, "n": len(chunk), "string_match_all": match_all(preds, refs),
                               "string_match_part": match_part(preds, refs)})
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "scores.json"), "w") as f:
        json.dump(out, f, indent=1)
    if a.words:
        os.makedirs(os.path.join(a.out, "words"), exist_ok=True)
        for name in ("nounlist.txt", "adjectivelist.txt", "verblist.txt"):
            lines = open(os.path.join(a.words, name)).read().splitlines()
            with open(os.path.join(a.out, "words", name), "w") as f:
                f.write("".join(w + "\n" for w in lines[::8]))
    print("wrote", a.out)


if __name__ == "__main__":
    main()
