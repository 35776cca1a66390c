#!/usr/bin/env python3
"""jieba's own segmentation of the fixture corpus, for tests/test_jieba.c (benchmarks/jieba.c must equal it).

    python3 -m venv /tmp/jb && /tmp/jb/bin/pip install jieba==0.42.1
    /tmp/jb/bin/python scripts/jieba_fixtures.py

Writes tests/fixtures/jieba/segmentation.json: every case of the corpus (tests/fixtures/jieba/corpus.txt, one
sentence a line, plus the variants made below: whitespace and line breaks, joined lines, punctuation removed, seeded
random strings over the corpus's characters and corner-case characters) with jieba.cut(text, cut_all=False) both
with HMM (jieba's default: what LongBench's metrics call) and without.

With --shared (the records in ../shared/data, never copied into the project) it also writes
tests/fixtures/jieba/shared_digests.json: for each Chinese LongBench record there, per text field, the token count
and the sha256 of the tokens each followed by a NUL byte, with and without HMM; tests/test_jieba.c checks them in CI
(where ../shared/data is present). Only counts and digests are committed, none of the text.
"""
import argparse
import hashlib
import json
import os
import random
import sys

import jieba

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FIX = os.path.join(ROOT, "tests", "fixtures", "jieba")
SHARED_FILES = [  # relative to ../shared/data; the fields segmented
    ("longbench/reconstructed_from_minilongbench/multifieldqa_zh.jsonl", ("context", "input", "answers")),
    ("longbench/reconstructed_from_minilongbench/dureader.jsonl", ("context", "input", "answers")),
    ("longbench/reconstructed_from_minilongbench/vcsum.jsonl", ("context", "answers")),
    ("longbench/reconstructed_from_minilongbench/passage_retrieval_zh.jsonl", ("context", "input", "answers")),
    ("longbench/official_jsonl/multifieldqa_zh.first20.jsonl", ("context", "input", "answers")),
    ("longbench/official_jsonl/passage_retrieval_zh.first20.jsonl", ("context", "input", "answers")),
    ("longbench/rendered_prompts_minilongbench/lsht.jsonl", ("origin_prompt",)),
]


def corpus():
    out = []
    with open(os.path.join(FIX, "corpus.txt"), encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if line and not line.startswith("# "):
                out.append(line)
    return out


def variants(lines):
    rng = random.Random(20261126)
    cases = list(lines)
    # line breaks and whitespace between sentences: "\n", "\r\n", "\r", tabs, U+3000, several spaces
    seps = ["\n", "\r\n", "\r\n\r\n", "\r", "\t", "\u3000", "   ", " \r\n ", "\n\n"]
    for i in range(0, len(lines) - 1, 3):
        cases.append(lines[i] + seps[i % len(seps)] + lines[i + 1])
    # the punctuation taken out: long blocks, where the route and the HMM see more at once
    punct = set("，。！？、；：“”‘’（）《》【】「」『』—…·,.!?;:()\"' \t")
    for i in range(1, len(lines), 4):
        cases.append("".join(ch for ch in lines[i] + lines[(i + 7) % len(lines)] if ch not in punct))
    # three paragraphs of twenty sentences
    for k in range(3):
        cases.append("".join(rng.sample(lines, 20)))
    # seeded random strings over the corpus's characters plus corner cases
    pool = sorted(set("".join(lines)))
    extra = list("+#&._%-") + ["\r\n", "\r", "\n", " ", "\u3000", "\u00a0", "\u2028", "\x0b", "\x1c"] + \
        list("0123456789abcXYZ") + ["\u9fd5", "\u9fd6", "\u4e00", "\u4dff", "\u3400", "\U00020bb7", "\u00e9", "ǎ",
                                    "ー", "ｱ", "①", "Ⅻ", "٣", "𝟘"]
    for k in range(120):
        n = rng.randint(1, 60)
        src = pool if k % 3 else pool + extra * 4
        cases.append("".join(rng.choice(src) for _ in range(n)))
    # unknown characters only (every emission missing: the Viterbi's ties), and single characters
    cases += ["\u9fd0\u9fd1\u9fd2\u9fd3", "\u9fd0", "鿐鿑", "", " ", "\r\n", "\r\r\n\n", "a", "1", ".", "%", "-", "中",
              "中国", "abc.def", "1.5.6%", "50%%", "a1b2c3", "__init__", "C++11", "3.14159abc", "v2.0-rc1"]
    return cases


def cut(text, hmm):
    return list(jieba.cut(text, cut_all=False, HMM=hmm))


def digest(tokens):
    h = hashlib.sha256()
    for t in tokens:
        h.update(t.encode("utf-8") + b"\0")
    return h.hexdigest()


def versions():
    from importlib.metadata import version
    return {"python": sys.version.split()[0], "jieba": version("jieba")}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared", default=None, help="the shared data folder (../shared/data) for the digests")
    args = ap.parse_args()
    jieba.setLogLevel(60)
    cases = [{"text": t, "hmm": cut(t, True), "no_hmm": cut(t, False)} for t in variants(corpus())]
    with open(os.path.join(FIX, "segmentation.json"), "w", encoding="utf-8") as f:
        json.dump({"source": "jieba.cut(text, cut_all=False, HMM=...) via scripts/jieba_fixtures.py",
                   "versions": versions(), "cases": cases}, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print("jieba_fixtures: %d cases -> tests/fixtures/jieba/segmentation.json" % len(cases))
    if not args.shared:
        return
    recs = []
    for rel, fields in SHARED_FILES:
        with open(os.path.join(args.shared, rel), encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                r = json.loads(line)
                src = r.get("gold", {}) if "gold" in r else r
                for field in fields:
                    vals = r[field] if field in r else src.get(field)
                    vals = vals if isinstance(vals, list) else [vals]
                    for i, v in enumerate(vals):
                        if not isinstance(v, str):
                            continue
                        h, n = cut(v, True), cut(v, False)
                        recs.append({"file": rel, "line": lineno, "field": field, "index": i,
                                     "hmm": [len(h), digest(h)], "no_hmm": [len(n), digest(n)]})
    with open(os.path.join(FIX, "shared_digests.json"), "w", encoding="utf-8") as f:
        json.dump({"source": "scripts/jieba_fixtures.py --shared ../shared/data", "versions": versions(),
                   "texts": recs}, f, indent=0)
        f.write("\n")
    print("jieba_fixtures: %d texts -> tests/fixtures/jieba/shared_digests.json" % len(recs))


if __name__ == "__main__":
    main()
