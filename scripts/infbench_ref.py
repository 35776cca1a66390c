#!/usr/bin/env python3
"""Reference scores for tests/test_infbench.c, computed by InfiniteBench's own scorers (OpenBMB/InfiniteBench
src/compute_scores.py; not copied here: give its path). Only the get_score_one_* functions and their helpers are
executed, taken out with ast (the module loads HF evaluate's ROUGE at import: evaluate.load("rouge") fetches the
metric's script from the Hub, so ROUGE_SCORER is given here as that script's _compute does it on Google's
rouge_score package: RougeScorer with the four default rouge types, no stemmer, score_multi when the reference is a
list; `pip install rouge-score`). Scores (a) the first lines of the
official gpt-4 prediction files in ../shared/data/infinitebench/official_answer_keys/ and (b) edge cases below;
writes tests/fixtures/infinitebench/scores.json.

    git clone https://github.com/OpenBMB/InfiniteBench     # made at 88b3daa
    python3 scripts/infbench_ref.py --infinitebench InfiniteBench
"""
import argparse
import ast
import json
import os
import re
import string
from collections import Counter

TASKS = ["passkey", "number_string", "kv_retrieval", "longbook_choice_eng", "longbook_qa_eng",
         "longdialogue_qa_eng", "code_debug", "math_find", "longbook_sum_eng"]
HELPERS = {"normalize_answer", "f1_score", "qa_f1_score", "first_int_match"}


class EvaluateRouge:
    """evaluate's metrics/rouge/rouge.py _compute, use_aggregator=False, on rouge_score."""

    def compute(self, predictions, references, use_aggregator=True, use_stemmer=False):
        from rouge_score import rouge_scorer
        assert not use_aggregator
        scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL", "rougeLsum"], use_stemmer=use_stemmer)
        multi = isinstance(references[0], list)
        scores = [scorer.score_multi(r, p) if multi else scorer.score(r, p) for r, p in zip(references, predictions)]
        return {k: [s[k].fmeasure for s in scores] for k in scores[0]}


def load(path):
    src = open(os.path.join(path, "src/compute_scores.py")).read()
    keep = [n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef)
            and (n.name in HELPERS or n.name in {"get_score_one_" + t for t in TASKS})]
    ns = {"re": re, "string": string, "Counter": Counter, "ROUGE_SCORER": EvaluateRouge()}
    exec(compile(ast.Module(body=keep, type_ignores=[]), "compute_scores.py", "exec"), ns)
    return {t: ns["get_score_one_" + t] for t in TASKS}


EXTRA = [
    ("passkey", "no digits here", "12345"), ("passkey", "key: 012345 or 12345", "12345"),
    ("number_string", "The sequence is 12-34", "12"), ("kv_retrieval", "{\"abc\": \"def\"}", "def"),
    ("kv_retrieval", "value-def", "def"), ("longbook_choice_eng", "  ", ["x", "A"]),
    ("longbook_choice_eng", "Walking Georgie", ["Walking Georgie", "A"]),
    ("longbook_choice_eng", "The answer is: Snowfield.", ["Snowfield", "C"]),
    ("longbook_choice_eng", "the answer is", ["Snowfield", "C"]),
    ("longbook_choice_eng", "I think it is option C", ["Snowfield", "C"]),
    ("longbook_choice_eng", "maybe BC", ["Snowfield", "BC"]),
    ("longbook_choice_eng", "hmm, D, surely", ["x", "C"]),
    ("longbook_qa_eng", "The Hebrides islands", ["the hebrides", "skye"]), ("longbook_qa_eng", "", ["x"]),
    ("longdialogue_qa_eng", "I think it's ace.", ["ACE", "ACE ROTHSTEIN"]),
    ("longdialogue_qa_eng", "Ace Rothstein", ["ACE ROTHSTEIN"]),
    ("code_debug", "B. foo", ["foo", "B"]), ("code_debug", "B:", ["foo", "B"]),
    ("code_debug", "The answer is: foo()", ["foo", "C"]), ("code_debug", "Option C is: wrong", ["foo", "C"]),
    ("code_debug", "correct option is:", ["foo", "C"]), ("code_debug", "I'd say `C`", ["foo", "C"]),
    ("code_debug", "the error-is: C", ["foo", "C"]),
    ("math_find", "It is 3.5 or 7", 7.0 + 0.5 - 4.0), ("math_find", "none", 3), ("math_find", "x 12 y", 12),
    ("longbook_sum_eng", "", ["a summary"]), ("longbook_sum_eng", "!!! ...", ["a summary"]),
    ("longbook_sum_eng", "The cat sat.\nThe cat ran away, the cat.", ["the cat ran\n\nthe dog sat on the cat"]),
    ("longbook_sum_eng", "a b a b a\nb a b", ["a a b b\nb a a"]),
    ("longbook_sum_eng", "\u212aelvin met \u0130stanbul's caf\u00e9 owner", ["kelvin met the istanbul cafe owner"]),
    ("longbook_sum_eng", "alpha beta gamma", ["delta", "beta gamma alpha", "alpha beta"]),
    ("longbook_sum_eng", "  \n\n  x-ray  \n", "x ray vision"),
    ("longbook_sum_eng", "It's 2024; COVID-19 ended?", ["its 2024 covid 19 ended"]),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--infinitebench", required=True)
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--keys", default=os.path.join(here, "../../shared/data/infinitebench/official_answer_keys"))
    ap.add_argument("--out", default=os.path.join(here, "../tests/fixtures/infinitebench/scores.json"))
    a = ap.parse_args()
    f = load(a.infinitebench)
    out = {"source": "OpenBMB/InfiniteBench src/compute_scores.py get_score_one_*", "files": [], "cases": []}
    for t in TASKS:
        name = f"gpt4_preds_{t}.first3.jsonl"
        for i, line in enumerate(open(os.path.join(a.keys, name))):
            r = json.loads(line)
            out["files"].append({"task": t, "file": name, "line": i + 1, "score": float(f[t](r["prediction"], r["ground_truth"], "gpt4"))})
    for t, pred, label in EXTRA:
        out["cases"].append({"task": t, "pred": pred, "label": label, "score": float(f[t](pred, label, "kvbench"))})
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    json.dump(out, open(a.out, "w"), indent=1)
    print("wrote", a.out)


if __name__ == "__main__":
    main()
