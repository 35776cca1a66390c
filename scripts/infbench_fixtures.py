#!/usr/bin/env python3
"""Official-format InfiniteBench records and their official prompts, labels and scores, for
tests/test_infbench_official.c. For each of the nine tasks kvbench loads, a few records in the format of the
official jsonl files ({"id", "context", "input", "answer", "options"}; answers as str, [str], [text, letter] or a
number, as the released files hold them), small enough to run on the default model, and for each record:

  prompt          eval_utils.create_prompt(eg, task, "yarn-mistral", ...) (src/prompt.py's yarn_mistral_templates)
  label           eval_utils.get_answer(eg, task)
  max_new_tokens  eval_utils.DATA_NAME_TO_MAX_NEW_TOKENS[task]
  predictions     strings with compute_scores.get_score_one_<task>(pred, label, "yarn-mistral")'s score

The official functions are executed from a checkout of OpenBMB/InfiniteBench (not copied: eval_utils.py imports
rouge and jieba and compute_scores.py loads HF evaluate's metric from the Hub at import, so only the functions
named here are taken out with ast; longbook_sum_eng's ROUGE is evaluate's _compute on Google's rouge_score, as
scripts/infbench_ref.py gives it: `pip install rouge-score`). Writes tests/fixtures/infinitebench/official/
<task>.jsonl (the records, serialised as the official files are: json.dumps(ensure_ascii=False) a line) and
expected.json.

    git clone https://github.com/OpenBMB/InfiniteBench     # made at 88b3daa
    python3 scripts/infbench_fixtures.py --infinitebench InfiniteBench
"""
import argparse
import ast
import json
import os
import random
import re
import sys
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import infbench_ref  # noqa: E402  (the scorers, taken out of compute_scores.py)

TASKS = infbench_ref.TASKS
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.\n"


def load_eval_utils(path):
    """create_prompt, get_answer and DATA_NAME_TO_MAX_NEW_TOKENS of src/eval_utils.py, with src/prompt.py."""
    ns = {"re": re, "Path": __import__("pathlib").Path}
    exec(compile(open(os.path.join(path, "src/prompt.py")).read(), "prompt.py", "exec"), ns)
    src = open(os.path.join(path, "src/eval_utils.py")).read()
    keep = []
    for n in ast.parse(src).body:
        if isinstance(n, ast.FunctionDef) and n.name in {"create_prompt", "get_answer"}:
            keep.append(n)
        elif isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id in {
                "DATA_NAME_TO_MAX_NEW_TOKENS", "MODEL_TO_PROMPT_TEMPLATE"} for t in n.targets):
            keep.append(n)
    exec(compile(ast.Module(body=keep, type_ignores=[]), "eval_utils.py", "exec"), ns)
    return ns


def records(rng):
    """task -> list of (record, [predictions])."""
    out = {}
    # passkey / number_string: construct_synthetic_dataset.py's noise lines around the key line
    rows = []
    for i, (j, n) in enumerate([(0, 12), (6, 12), (12, 12)]):
        key = str(rng.randint(10000, 99999))
        ctx = NOISE * j + f"The pass key is {key}. Remember it. {key} is the pass key.\n" + NOISE * (n - j)
        rows.append(({"id": i, "context": ctx, "input": "What is the pass key?", "answer": key, "options": []},
                     [f" {key}.", f" {key[:-1]}", f"The pass key is 0{key}", f"key {key} or 12345", "no idea"]))
    out["passkey"] = rows
    rows = []
    for i, j in enumerate([0, 5, 10]):
        key = "".join(str(rng.randint(0, 9)) for _ in range(10))
        ctx = NOISE * j + f"The sequence of digits is {key}. Remember it. {key} is the sequence of digits.\n" + NOISE * (10 - j)
        ans = key if i != 1 else [key]  # number_string answers are str; a one-element list scores by label[0]
        rows.append(({"id": i, "context": ctx, "input": "What is the sequence of digits?", "answer": ans, "options": []},
                     [f" {key}", f" {key[:5]}-{key[5:]}", f"{key}0", ""]))
    out["number_string"] = rows
    # kv_retrieval: "JSON data:\n{...}" of UUID pairs, the question names one key
    rows = []
    for i in range(3):
        pairs = [(str(uuid.UUID(int=rng.getrandbits(128), version=4)), str(uuid.UUID(int=rng.getrandbits(128), version=4)))
                 for _ in range(12)]
        ctx = "JSON data:\n{" + ", ".join(f"\"{k}\": \"{v}\"" for k, v in pairs) + "}"
        k, v = pairs[[0, 6, 11][i]]
        q = "\nKey: \"" + k + "\"\nThe value associated with the specified key is: "
        rows.append(({"id": i, "context": ctx, "input": q, "answer": v, "options": []},
                     [f"\"{v}\"", f"{v}.", f"The value is {v[:-2]}", f"value-{v}", f"{{\"{k}\": \"{v}\"}}"]))
    out["kv_retrieval"] = rows
    # longbook_choice_eng: answer as str, [text] and [text, letter]
    opts = ["Walking Georgie", "Snowfield", "The old mill", "Nobody"]
    book = "Chapter 1\n\nIt was a cold morning when Georgie walked to the snowfield behind the old mill.\n" * 4
    out["longbook_choice_eng"] = [
        ({"id": 0, "context": book, "input": "Where did Georgie walk?", "answer": "Snowfield", "options": opts},
         ["B", "B. Snowfield", " Snowfield", "The answer is: Snowfield.", "I think the option is B", "maybe A or B"]),
        ({"id": 1, "context": book, "input": "Who walked?", "answer": ["Walking Georgie"], "options": opts},
         ["A", "Walking Georgie", "answer: Walking Georgie", "C", "hmm, A, surely"]),
        ({"id": 2, "context": book, "input": "What was behind it?", "answer": ["The old mill", "C"], "options": opts},
         [" C.", "The old mill", "the answer is The old mill", "D"]),
    ]
    # longbook_qa_eng: a list of answers, token F1 after SQuAD normalisation
    out["longbook_qa_eng"] = [
        ({"id": 0, "context": book, "input": "Where did Georgie walk?", "answer": ["the snowfield"], "options": []},
         ["The snowfield.", "to the snowfield behind the mill", "a field of snow", ""]),
        ({"id": 1, "context": book, "input": "When?", "answer": ["a cold morning", "in the morning"], "options": []},
         ["It was a cold morning", "Morning!", "evening"]),
    ]
    # longdialogue_qa_eng: the first label upper-cased is one of the prediction's words
    script = "INT. MILL - DAY\n\nACE\nWhere is it?\n\nGINGER\nBehind the mill.\n\n$$MASK$$\nLet's go.\n"
    out["longdialogue_qa_eng"] = [
        ({"id": 0, "context": script, "input": "", "answer": ["ACE"], "options": []},
         [" ACE", "Ace.", "I think it's ace rothstein", "GINGER", "aces"]),
        ({"id": 1, "context": script, "input": "", "answer": ["GINGER", "GINGER MCKENNA"], "options": []},
         ["Ginger McKenna", "\"Ginger\"", "ACE"]),
    ]
    # math_find: construct_synthetic_dataset.py's inputs; int and float (median) answers
    while True:  # an even-length list whose median is not integral (a float answer)
        lst = [rng.randint(0, 99) for _ in range(40)]
        srt = sorted(lst)
        if (srt[19] + srt[20]) % 2:
            break
    med = (srt[19] + srt[20]) / 2
    out["math_find"] = [
        ({"id": 0, "context": str(lst), "answer": max(lst), "options": [],
          "input": "You should answer with only one number, no other words. The largest number of the list is: "},
         [f" {max(lst)}", f"It is {max(lst)}", f"{max(lst) - 1} or {max(lst)}", "none"]),
        ({"id": 1, "context": str(lst), "answer": sorted(lst)[1], "options": [],
          "input": "You should answer with only one number, no other words. The second smallest number of the list is: "},
         [f"{sorted(lst)[1]}", f"{sorted(lst)[0]}"]),
        ({"id": 2, "context": str(lst), "answer": med, "options": [],
          "input": "You should answer with only one number, no other words. The median number of the list is: "},
         [f"{med}", f"{int(med)}", f"about {med}0"]),
    ]
    # code_debug: the buggy function among four options
    code = ("def foo(x):\n    return x + 1\n\ndef bar(y):\n    return y / 0\n\n"
            "class Baz:\n    def qux(self):\n        return self.missing\n")
    fns = ["foo", "bar", "Baz.qux", "main"]
    out["code_debug"] = [
        ({"id": 0, "context": code, "input": "", "answer": "bar", "options": fns},
         ["B.", "B: bar", "The answer is: bar", "correct option is: B", "A. foo", "`B`"]),
        ({"id": 1, "context": code, "input": "", "answer": ["Baz.qux"], "options": fns},
         ["C:", "answer: Baz.qux()", "Option C", "D"]),
    ]
    # longbook_sum_eng: ROUGE-Lsum F, sentences on newlines
    out["longbook_sum_eng"] = [
        ({"id": 0, "context": book, "input": "", "options": [],
          "answer": ["Georgie walks to the snowfield behind the old mill on a cold morning.\nNothing else happens."]},
         ["Georgie walked to the snowfield.\nIt was cold.", "A cold morning; Georgie, the mill and snow.",
          "", "Georgie walks to the snowfield behind the old mill on a cold morning.\nNothing else happens."]),
        ({"id": 1, "context": book, "input": "", "options": [],
          "answer": "On a cold morning Georgie goes behind the mill."},
         ["Georgie goes behind the mill\n\non a cold morning.", "It's 2024: COVID-19 ended?"]),
    ]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--infinitebench", required=True, help="a checkout of OpenBMB/InfiniteBench")
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "../tests/fixtures/infinitebench/official"))
    a = ap.parse_args()
    ev = load_eval_utils(a.infinitebench)
    score = infbench_ref.load(a.infinitebench)
    os.makedirs(a.out, exist_ok=True)
    expected = {"source": "OpenBMB/InfiniteBench src/eval_utils.py create_prompt (yarn-mistral), get_answer, "
                          "DATA_NAME_TO_MAX_NEW_TOKENS; src/compute_scores.py get_score_one_*", "tasks": {}}
    for task, rows in records(random.Random(36)).items():
        with open(os.path.join(a.out, task + ".jsonl"), "w", encoding="utf8") as f:
            for rec, _ in rows:
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        recs = []
        for rec, preds in rows:
            label = ev["get_answer"](dict(rec), task)
            recs.append({"id": rec["id"], "prompt": ev["create_prompt"](dict(rec), task, "yarn-mistral", a.out),
                         "label": label,
                         "predictions": [{"prediction": p, "score": float(score[task](p, label, "yarn-mistral"))}
                                         for p in preds]})
        expected["tasks"][task] = {"max_new_tokens": ev["DATA_NAME_TO_MAX_NEW_TOKENS"][task], "records": recs}
    json.dump(expected, open(os.path.join(a.out, "expected.json"), "w"), indent=1, ensure_ascii=False)
    print("wrote", a.out)


if __name__ == "__main__":
    main()
