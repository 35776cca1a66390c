#!/usr/bin/env python3
"""LongBench v2's chain-of-thought flow as the official pred.py runs it, on records in the official format, for
tests/test_longbench_v2.c. Writes tests/fixtures/longbench_v2/cot_data.json (records with the fields pred.py keeps)
and cot_expected.json: for each record, the two model outputs this script plays back, and what get_pred made of
them:

  prompt_cot, max_new_cot   the first query_llm call (prompts/0shot_cot.txt filled) and its max_new_tokens
  output_cot                the first output played back (get_pred strips it: response_cot)
  prompt_ans, max_new_ans   the second call (prompts/0shot_cot_ans.txt filled, $COT$ <- response_cot)
  output_ans                the second output played back
  response_cot, response, pred, judge   the fields get_pred wrote for the record

get_pred and extract_answer are executed from pred.py itself (taken out with ast: the module imports openai, torch
and datasets at the top), with query_llm replaced by a stub that records each prompt (before query_llm's cut) and
returns the next scripted output, and the tokenizer and client by stubs get_pred only passes on. The templates are
the repository's prompts/ files. Nothing of the official code is copied here.

    git clone https://github.com/THUDM/LongBench     # v2 is the repository's root; made at 2e00731
    python3 scripts/longbench_v2_fixtures.py --longbench LongBench
"""
import argparse
import ast
import io
import json
import os
import re
import types


def official(path, outputs, calls):
    """pred.py's get_pred and extract_answer, run in a namespace of stubs."""
    src = open(os.path.join(path, "pred.py"), encoding="utf-8").read()
    keep = [n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name in ("get_pred", "extract_answer")]

    def query_llm(prompt, model, tokenizer, client=None, temperature=0.5, max_new_tokens=128, stop=None):
        calls.append({"prompt": prompt, "max_new_tokens": max_new_tokens})
        return outputs.pop(0)

    def prompt(name):
        p = os.path.join(path, "prompts", name)
        return open(p, encoding="utf-8").read() if os.path.exists(p) else None

    ns = {"re": re, "json": json, "query_llm": query_llm, "tqdm": lambda x: x,
          "tiktoken": types.SimpleNamespace(encoding_for_model=lambda m: None),
          "OpenAI": lambda base_url=None, api_key=None: None, "URL": "", "API_KEY": "",
          "template_0shot": prompt("0shot.txt"), "template_0shot_cot": prompt("0shot_cot.txt"),
          "template_0shot_cot_ans": prompt("0shot_cot_ans.txt"), "template_rag": prompt("0shot_rag.txt"),
          "template_no_context": prompt("0shot_no_context.txt")}
    exec(compile(ast.Module(body=keep, type_ignores=[]), "pred.py", "exec"), ns)
    return ns["get_pred"]


def rec(i, domain, sub, diff, length, q, choices, answer, context):
    return {"_id": f"66f36490821e116aacb3{i:04x}", "domain": domain, "sub_domain": sub, "difficulty": diff,
            "length": length, "question": q, "choice_A": choices[0], "choice_B": choices[1], "choice_C": choices[2],
            "choice_D": choices[3], "answer": answer, "context": context}


# (record, first output (the reasoning), second output (the answer))
CASES = [
    (rec(1, "Single-Document QA", "Academic", "easy", "short", "What does the author conclude?",
         ["It works.", "It fails.", "It is unclear.", "Nothing."], "A",
         "Abstract\nWe study a method and conclude that it works.\n\n1 Introduction\nMethods matter.\n"),
     "The abstract says the method works.\nSo the answer is A.\n", "The correct answer is (A)"),
    # the reasoning's own surrounding whitespace (ASCII and U+3000) goes; a $Q$ inside it stays ($COT$ is last)
    (rec(2, "Single-Document QA", "Literary", "hard", "medium", "  Who is the narrator?\n",
         [" Ishmael", "Ahab ", "Starbuck", "Queequeg"], "A",
         "\u3000Call me Ishmael. Some years ago, never mind how long precisely.\n\n"),
     "\n\u3000 The first line names him; $Q$ and $C_A$ stay literal here.  \n",
     "**The correct answer is (B)**"),
    # a question holding $COT$: the last replacement fills it with the reasoning too
    (rec(3, "Multi-Document QA", "Financial", "hard", "long", "Given $COT$, which report shows the larger loss?",
         ["Report 1", "Report 2", "Both equal", "Neither"], "B",
         "Report 1: loss of $3M.\nReport 2: loss of $7M.\n"),
     "Report 2 lost $7M, more than $3M.", "Based on the reasoning, The correct answer is B."),
    # a reasoning of whitespace only (not '', which pred.py would skip): $COT$ becomes empty
    (rec(4, "Long In-context Learning", "User guide QA", "easy", "medium", "Classify: 'the screen flickers'",
         ["Hardware", "Software", "Billing", "Other"], "A",
         "Example: 'battery drains' -> Hardware\nExample: 'app crashes' -> Software\n"),
     " \n\t ", "I am not sure."),
    # the reasoning gives one letter, the second reply another: the second is scored
    (rec(5, "Code Repository Understanding", "Code repo QA", "easy", "long", "Which function parses $C_A$ input?",
         ["parse_args", "main", "run", "load"], "A",
         "def parse_args(argv):\n    return argv[1:]\n\ndef main():\n    run(parse_args(sys.argv))\n"),
     "The correct answer is (A) since parse_args reads argv.", "\n  The correct answer is (C)\n"),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--longbench", required=True, help="a checkout of THUDM/LongBench (LongBench v2 at its root)")
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "../tests/fixtures/longbench_v2"))
    a = ap.parse_args()
    records = [c[0] for c in CASES]
    outputs = [o for c in CASES for o in c[1:]]
    calls = []
    get_pred = official(a.longbench, outputs, calls)
    fout = io.StringIO()
    get_pred([dict(r) for r in records], types.SimpleNamespace(model="gpt-4o", cot=True, rag=0, no_context=False), fout)
    written = [json.loads(line) for line in fout.getvalue().splitlines()]
    assert len(written) == len(CASES) and len(calls) == 2 * len(CASES) and not outputs
    expected = {"source": "THUDM/LongBench (v2, the repository root, 2e00731): pred.py get_pred with --cot and "
                          "extract_answer, prompts/0shot_cot.txt and prompts/0shot_cot_ans.txt", "records": []}
    for i, (case, w) in enumerate(zip(CASES, written)):
        first, second = calls[2 * i], calls[2 * i + 1]
        expected["records"].append({
            "_id": w["_id"], "prompt_cot": first["prompt"], "max_new_cot": first["max_new_tokens"],
            "output_cot": case[1], "prompt_ans": second["prompt"], "max_new_ans": second["max_new_tokens"],
            "output_ans": case[2], "response_cot": w["response_cot"], "response": w["response"], "pred": w["pred"],
            "judge": w["judge"]})
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "cot_data.json"), "w", encoding="utf-8") as f:
        json.dump(records, f, ensure_ascii=False, indent=4)
    with open(os.path.join(a.out, "cot_expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{len(CASES)} records, {len(calls)} official calls -> {a.out}/cot_data.json, cot_expected.json")


if __name__ == "__main__":
    main()
