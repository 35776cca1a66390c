#!/usr/bin/env python3
"""LongBench v2 records in the official format and what the official code makes of them, for
tests/test_longbench_v2.c. Writes tests/fixtures/longbench_v2/data.json (a JSON array of records with the fields
pred.py keeps: _id, domain, sub_domain, difficulty, length, question, choice_A..D, answer, context) and
expected.json:

  prompt, prompt_cot  the record in prompts/0shot.txt and prompts/0shot_cot.txt, filled as pred.py's get_pred
                      fills them (a chain of str.replace over the template: $DOC$ <- context.strip(), then $Q$,
                      $C_A$..$C_D$ <- the stripped fields, each replacing every occurrence so far)
  responses           model replies with pred.py's extract_answer(response.strip()) and judge = pred == answer
  result              the row result.py writes for a results file holding each record's first response
                      (Overall, Easy, Hard, Short, Medium, Long, x100 rounded to 0.1)

extract_answer is executed from pred.py (taken out with ast: the module imports openai, torch and datasets), and
result.py is run as it is, in a scratch directory holding results/<name>.jsonl. Nothing of the official code is
copied here.

    git clone https://github.com/THUDM/LongBench     # v2 is the repository's root; made at 2e00731
    python3 scripts/lbv2_fixtures.py --longbench LongBench
"""
import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile


def load_extract_answer(path):
    src = open(os.path.join(path, "pred.py"), encoding="utf-8").read()
    keep = [n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == "extract_answer"]
    ns = {"re": re}
    exec(compile(ast.Module(body=keep, type_ignores=[]), "pred.py", "exec"), ns)
    return ns["extract_answer"]


def fill(template, item):
    """get_pred's replace chain, in its order."""
    return (template.replace("$DOC$", item["context"].strip()).replace("$Q$", item["question"].strip())
            .replace("$C_A$", item["choice_A"].strip()).replace("$C_B$", item["choice_B"].strip())
            .replace("$C_C$", item["choice_C"].strip()).replace("$C_D$", item["choice_D"].strip()))


def rec(i, domain, sub, diff, length, q, choices, answer, context):
    return {"_id": f"66f36490821e116aacb2{i:04x}", "domain": domain, "sub_domain": sub, "difficulty": diff,
            "length": length, "question": q, "choice_A": choices[0], "choice_B": choices[1], "choice_C": choices[2],
            "choice_D": choices[3], "answer": answer, "context": context}


RECORDS = [
    rec(1, "Single-Document QA", "Academic", "easy", "short", "What does the author conclude?",
        ["It works.", "It fails.", "It is unclear.", "Nothing."], "A",
        "Abstract\nWe study a method and conclude that it works.\n\n1 Introduction\nMethods matter.\n"),
    rec(2, "Single-Document QA", "Literary", "hard", "medium", "  Who is the narrator?\n",
        [" Ishmael", "Ahab ", "Starbuck", "Queequeg"], "A",
        "\u3000Call me Ishmael. Some years ago, never mind how long precisely.\n\n"),
    rec(3, "Multi-Document QA", "Financial", "hard", "long", "Which report shows the larger loss?",
        ["Report 1", "Report 2", "Both equal", "Neither"], "B",
        "Report 1: loss of $3M.\nReport 2: loss of $7M. Note the $Q$ token stays literal only before the chain.\n"),
    rec(4, "Long In-context Learning", "User guide QA", "easy", "medium", "Classify: 'the screen flickers'",
        ["Hardware", "Software", "Billing", "Other"], "A",
        "Example: 'battery drains' -> Hardware\nExample: 'app crashes' -> Software\n"),
    rec(5, "Long-dialogue History Understanding", "Agent history QA", "hard", "short",
        "What did the user ask first?", ["The weather", "A recipe", "A joke", "Nothing"], "C",
        "User: tell me a joke\nAssistant: Why did the chicken...\nUser: a recipe now\n"),
    rec(6, "Code Repository Understanding", "Code repo QA", "easy", "long", "Which function parses $C_A$ input?",
        ["parse_args", "main", "run", "load"], "A",
        "def parse_args(argv):\n    return argv[1:]\n\ndef main():\n    run(parse_args(sys.argv))\n"),
    rec(7, "Long Structured Data Understanding", "Table QA", "hard", "medium", "Which row has the maximum?",
        ["row 1", "row 2", "row 3", "row 4"], "D",
        "| row | value |\n|---|---|\n| 1 | 3 |\n| 2 | 9 |\n| 3 | 4 |\n| 4 | 12 |\n"),
    rec(8, "Multi-Document QA", "Legal", "easy", "short", "Which court decided?",
        ["The high court", "The district court", "The appeals court", "None"], "C",
        "Document 1: The appeals court decided the case.\n\nDocument 2: The district court heard it first.\n"),
]

# Replies: the first of each is the record's result-file response (result.py's row), the rest test extraction.
RESPONSES = [
    ["The correct answer is (A)", "The correct answer is A", "The correct answer is (E)", "A"],
    ["**The correct answer is (A)**", "the correct answer is (A)", "The correct answer is *(A)*", "The correct answer is  (A)"],
    ["Let me think. The correct answer is (A). No wait, The correct answer is (B)", "The correct answer is (B).",
     "The correct answer is: (B)", ""],
    ["The correct answer is D", "The correct answer is (Hardware)", "The correct answer is Ab", "\n  The correct answer is (A)\n"],
    ["The correct answer is (C)", "The Correct Answer is (C)", "The correct answer is (c)", "The correct answer is(C)"],
    ["I cannot tell.", "The correct answer is (A) parse_args", "The correct answer is **A**", "The correct answer is (A"],
    ["The correct answer is (D)", "The correct answer is \u200b(D)", "The correct answer is (D)\u3000", "Answer: D"],
    ["The correct answer is (B)", "The correct answer is (C) or (B)", "The correct answer is C.", "The correct answer is (C)"],
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--longbench", required=True, help="a checkout of THUDM/LongBench (LongBench v2 at its root)")
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "../tests/fixtures/longbench_v2"))
    a = ap.parse_args()
    extract_answer = load_extract_answer(a.longbench)
    t0 = open(os.path.join(a.longbench, "prompts/0shot.txt"), encoding="utf-8").read()
    tcot = open(os.path.join(a.longbench, "prompts/0shot_cot.txt"), encoding="utf-8").read()
    os.makedirs(a.out, exist_ok=True)
    json.dump(RECORDS, open(os.path.join(a.out, "data.json"), "w", encoding="utf-8"), ensure_ascii=False, indent=4)

    expected = {"source": "THUDM/LongBench (v2, the repository root): prompts/0shot.txt, prompts/0shot_cot.txt, "
                          "pred.py get_pred's replace chain and extract_answer, result.py", "records": []}
    results = []
    for item, replies in zip(RECORDS, RESPONSES):
        resp = []
        for r in replies:
            pred = extract_answer(r.strip())  # get_pred: response = output.strip(); extract_answer(response)
            resp.append({"response": r, "pred": pred, "judge": pred == item["answer"]})
        expected["records"].append({"_id": item["_id"], "prompt": fill(t0, item), "prompt_cot": fill(tcot, item),
                                    "responses": resp})
        out = dict(item, response=replies[0].strip(), pred=resp[0]["pred"], judge=resp[0]["judge"],
                   context=item["context"][:1000])
        results.append(json.dumps(out, ensure_ascii=False))

    scratch = tempfile.mkdtemp()
    try:
        os.makedirs(os.path.join(scratch, "results"))
        open(os.path.join(scratch, "results/fixture.jsonl"), "w", encoding="utf-8").write("\n".join(results) + "\n")
        subprocess.run([sys.executable, os.path.join(os.path.abspath(a.longbench), "result.py")], cwd=scratch, check=True)
        lines = open(os.path.join(scratch, "result.txt"), encoding="utf-8").read().split("\n")
    finally:
        shutil.rmtree(scratch)
    head, row = lines[0].split("\t"), lines[1].split("\t")
    expected["result"] = {k: float(v) for k, v in zip(head[1:], row[1:])}
    json.dump(expected, open(os.path.join(a.out, "expected.json"), "w", encoding="utf-8"), ensure_ascii=False, indent=1)
    print("wrote", a.out, expected["result"])


if __name__ == "__main__":
    main()
