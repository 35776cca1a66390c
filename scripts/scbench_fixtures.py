#!/usr/bin/env python3
"""SCBench records in the official format and what the official code makes of them, for tests/test_scbench.c.

Writes tests/fixtures/scbench/<task>.jsonl (two records per task: id, context, multi_turns with input, answer and
the per-task fields: options, name, task; lang and repo for repoqa) and expected.json:

  prompts        per task and record, the prompts of eval_utils.create_multiturn_prompt and create_scdq_prompt
                 (use_chat_template=True) with a tokenizer whose apply_chat_template renders Qwen2.5's ChatML (the
                 default system message when the first message is not a system one), so the test can compare the
                 messages kvbench builds, rendered the same way
  max_new_tokens eval_utils.DATA_NAME_TO_MAX_NEW_TOKENS
  scores         predictions per (task, record, turn) with compute_scores.get_score_one's score on the label
                 eval_utils.get_ground_truth makes, through Multiturnbench_to_Infinitebench (the multi-tasking sets
                 per turn task; repoqa through repo_qa_utils.compute_score's pass@1 at threshold 0.8, the needles
                 being every repoqa turn of the same repo, as compute_scores collects them)
  scores_max_turns_2  the same for the repoqa sets run with --max_turns 2 (run_scbench.py cuts multi_turns to 2
                 turns, so only those turns' functions are needles)
  turn_scores    compute_scores.compute_scores run as it is (multi-turn mode) on a predictions file holding each
                 turn's first prediction: its per-turn string (x100, "%.3f")
  bleu           nltk sentence_bleu(method4) on pairs, as repo_qa_utils.compute_function_similarity calls it

The official modules import torch, transformers, jieba, rouge, evaluate and args, which the functions used here do
not need: those names are stubbed, except evaluate's rouge, which is evaluate's rouge computation on Google's
rouge_score (use_stemmer False, rougeLsum). Nothing of the official code is copied here.

    git clone https://github.com/microsoft/MInference   # scbench/ read at 0ff346d
    python3 -m venv /tmp/v && /tmp/v/bin/pip install nltk numpy rouge-score rich tree_sitter==0.21.3 tree_sitter_languages
    /tmp/v/bin/python scripts/scbench_fixtures.py --scbench MInference/scbench
"""
import argparse
import json
import os
import sys
import tempfile
import types
from pathlib import Path

QWEN_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


class ChatML:
    """The tokenizer argument: only apply_chat_template(tokenize=False) is used by the prompt builders."""

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=False):
        out = ""
        if messages[0]["role"] != "system":
            out += f"<|im_start|>system\n{QWEN_SYSTEM}<|im_end|>\n"
        for m in messages:
            out += f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"
        if add_generation_prompt:
            out += "<|im_start|>assistant\n"
        return out


def stub(name, **attrs):
    m = types.ModuleType(name)
    for k, v in attrs.items():
        setattr(m, k, v)
    sys.modules[name] = m


class EvaluateRouge:
    """evaluate.load("rouge"): its _compute on rouge_score, use_aggregator=False."""

    def compute(self, predictions, references, use_aggregator=False):
        from rouge_score import rouge_scorer
        scorer = rouge_scorer.RougeScorer(["rougeLsum"], use_stemmer=False)
        out = []
        for ref, pred in zip(references, predictions):
            s = scorer.score_multi(ref, pred) if isinstance(ref, list) else scorer.score(ref, pred)
            out.append(s["rougeLsum"].fmeasure)
        return {"rougeLsum": out}


def load_official(src):
    sys.path.insert(0, src)
    stub("torch", profiler=types.ModuleType("torch.profiler"))
    stub("torch.profiler")
    stub("jieba")
    stub("rouge", Rouge=object)
    stub("transformers", GenerationConfig=object, SinkCache=object, AutoConfig=object)
    stub("tempdir")
    stub("evaluate", load=lambda name: EvaluateRouge())
    stub("args", parse_args=lambda: None)
    stub("tqdm", tqdm=lambda x, **k: x)
    import eval_utils
    import compute_scores
    return eval_utils, compute_scores


def turn(inp, ans, **kw):
    return dict(input=inp, answer=ans, **kw)


KV = json.dumps({"2a8f-11": "9c1e-77", "b03d-42": "e7aa-10", "c55e-03": "0d4f-98", "d7a1-5b": "41fc-2e"})
PY_CODE = '''import os


def add_numbers(a, b):
    """Add two numbers."""
    total = a + b
    return total


def read_config(path):
    with open(path) as f:
        data = f.read()
    return data.strip()


def list_files(root):
    out = []
    for name in os.listdir(root):
        out.append(os.path.join(root, name))
    return sorted(out)
'''
F_ADD = 'def add_numbers(a, b):\n    """Add two numbers."""\n    total = a + b\n    return total'
F_READ = 'def read_config(path):\n    with open(path) as f:\n        data = f.read()\n    return data.strip()'
F_LIST = ('def list_files(root):\n    out = []\n    for name in os.listdir(root):\n        out.append(os.path.join(root, '
          'name))\n    return sorted(out)')
BOOK = ("Chapter 1\nMara grew up in the lighthouse at Kell Point with her uncle Tobin. Every winter the supply boat "
        "came twice. In the spring of her twelfth year she found a brass compass in the cellar.\n\nChapter 2\nThe "
        "compass pointed west, not north. Tobin said it had belonged to her mother, a navigator named Ilse.")
CHN = "第一章\n李明住在杭州，每天早上骑自行车去图书馆。他最喜欢的书是《红楼梦》。\n第二章\n冬天，他搬到了北京，开始学习画画。"
PAPER = ("We present a method for compressing the key-value cache of transformer language models. The method keeps "
         "the tokens that receive the most attention.\nExperiments on long documents show that it keeps accuracy "
         "while using a third of the memory.")

RECORDS = {
    "scbench_kv": [
        {"id": 0, "context": KV, "multi_turns": [
            turn('Key: "b03d-42"\nThe value associated with the specified key is: ', "e7aa-10"),
            turn('Key: "d7a1-5b"\nThe value associated with the specified key is: ', "41fc-2e"),
            turn('Key: "2a8f-11"\nThe value associated with the specified key is: ', "9c1e-77")]},
        {"id": 1, "context": KV.replace("9c1e", "5555"), "multi_turns": [
            turn('Key: "c55e-03"\nThe value associated with the specified key is: ', "0d4f-98"),
            turn('Key: "2a8f-11"\nThe value associated with the specified key is: ', "5555-77")]},
    ],
    "scbench_prefix_suffix": [
        {"id": 3, "context": "zqpa-88-mmx\nabcd-12-wxyz\nabce-13-wxya\nqqqq-00-rrrr", "multi_turns": [
            turn("What is the string that starts with 'abcd' and ends with 'wxyz'?", "abcd-12-wxyz"),
            turn("What is the string that starts with 'zqpa' and ends with 'mmx'?", "zqpa-88-mmx")]},
        {"id": 4, "context": "k1-a\nk2-b", "multi_turns": [turn("Which string starts with 'k2'?", "k2-b")]},
    ],
    "scbench_vt": [
        {"id": 0, "context": "VAR QWE = 12345\nVAR ASD = VAR QWE\nnoise noise\nVAR ZXC = VAR ASD\nVAR POI = 777",
         "multi_turns": [
             turn("Find all variables that are assigned the value 12345. Answer: ", ["QWE", "ASD", "ZXC"]),
             turn("Find all variables that are assigned the value 777. Answer: ", ["POI"])]},
        {"id": 1, "context": "VAR AB = 5\nVAR CD = VAR AB", "multi_turns": [
            turn("Which variables hold 5? Answer: ", "AB CD")]},
    ],
    "scbench_repoqa": [
        {"id": 0, "lang": "python", "repo": "acme/tools", "context": PY_CODE, "multi_turns": [
            turn("Function description: adds its two arguments and returns the sum.", F_ADD, name="add_numbers"),
            turn("Function description: reads a file and returns its stripped text.", F_READ, name="read_config"),
            turn("Function description: lists the paths under a folder, sorted.", F_LIST, name="list_files")]},
        {"id": 1, "lang": "python", "repo": "acme/other", "context": PY_CODE.replace("total", "acc"), "multi_turns": [
            turn("Function description: adds two numbers.", F_ADD.replace("total", "acc"), name="add_numbers"),
            turn("Function description: sorted paths of a folder.", F_LIST, name="list_files")]},
        # the same repo as record 0: compute_scores pools its needles with record 0's; list_files_copy is list_files
        # under another name, so a perfect copy matches record 0's function first (turns 1-2 only with max_turns 2)
        {"id": 2, "lang": "python", "repo": "acme/tools", "context": PY_CODE, "multi_turns": [
            turn("Function description: adds its two arguments.", F_ADD, name="add_numbers"),
            turn("Function description: a copy of the folder listing.", F_LIST, name="list_files_copy"),
            turn("Function description: reads a file.", F_READ, name="read_config")]},
    ],
    "scbench_qa_eng": [
        {"id": 0, "context": BOOK, "multi_turns": [
            turn("Where did Mara grow up?", "in the lighthouse at Kell Point"),
            turn("Which way did the compass point?", "west"),
            turn("Who was Ilse?", "Mara's mother")]},
        {"id": 1, "context": BOOK, "multi_turns": [turn("What did Mara find?", "a brass compass")]},
    ],
    "scbench_qa_chn": [
        {"id": 0, "context": CHN, "multi_turns": [turn("李明住在哪里？", "杭州"), turn("他最喜欢哪本书？", "《红楼梦》")]},
        {"id": 1, "context": CHN, "multi_turns": [turn("冬天他搬到了哪里？", "北京")]},
    ],
    "scbench_choice_eng": [
        {"id": 0, "context": BOOK, "multi_turns": [
            turn("Who raised Mara?", "Her uncle Tobin", options=["Her mother", "Her uncle Tobin", "Ilse", "Nobody"]),
            turn("What did she find?", "A brass compass", options=["A map", "A boat", "A brass compass", "A key"])]},
        {"id": 1, "context": BOOK, "multi_turns": [
            turn("How often did the boat come?", "Twice a winter", options=["Never", "Daily", "Weekly", "Twice a winter"])]},
    ],
    "scbench_many_shot": [
        {"id": 0, "task": "date_understanding", "context": "Q: 2+2?\nOptions:\n(A) 3\n(B) 4\nA: (B)\n\nQ: 3+3?\nOptions:\n(A) 6\n(B) 5\nA: (A)",
         "multi_turns": [turn("Q: 1+1?\nOptions:\n(A) 2\n(B) 3\nA:", "(A)"), turn("Q: 5+5?\nOptions:\n(A) 11\n(B) 10\nA:", "(B)")]},
        {"id": 1, "task": "date_understanding", "context": "Q: x\nA: (C)", "multi_turns": [turn("Q: y\nA:", "(C)")]},
    ],
    "scbench_mf": [
        {"id": 0, "context": [3, 91, 14, 7, 55], "multi_turns": [
            turn("The largest number of the list is: ", 91), turn("The smallest number of the list is: ", 3)]},
        {"id": 1, "context": [10, 20], "multi_turns": [turn("The largest number of the list is: ", 20)]},
    ],
    "scbench_summary": [
        {"id": 0, "context": PAPER, "multi_turns": [
            turn("Summarize the paper in one sentence.", "The paper compresses the key-value cache by keeping the most attended tokens."),
            turn("Now summarize its experiments.", "This paper shows that accuracy holds with a third of the memory on long documents.")]},
        {"id": 1, "context": PAPER, "multi_turns": [turn("Summarize.", "A method keeps the most attended tokens.\nIt saves memory.")]},
    ],
    "scbench_summary_with_needles": [
        {"id": 0, "context": PAPER + "\nThe pass key is 68712. Remember it.", "multi_turns": [
            turn("What is the pass key?", "68712", task="scbench_passkey"),
            turn("Summarize the paper.", "The paper keeps the most attended tokens to save memory.", task="scbench_summary")]},
        {"id": 1, "context": "The pass key is 4242.\n" + PAPER, "multi_turns": [turn("The pass key is", "4242", task="scbench_passkey")]},
    ],
    "scbench_repoqa_and_kv": [
        {"id": 0, "lang": "python", "repo": "acme/mixed", "context": PY_CODE + "\n" + KV, "multi_turns": [
            turn("Function description: reads a config file.", F_READ, name="read_config", task="scbench_repoqa"),
            turn('Key: "c55e-03"\nThe value associated with the specified key is: ', "0d4f-98", task="scbench_kv"),
            turn("Function description: returns the sum of two numbers.", F_ADD, name="add_numbers", task="scbench_repoqa")]},
        {"id": 1, "lang": "python", "repo": "acme/mixed2", "context": KV + "\n" + PY_CODE, "multi_turns": [
            turn('Key: "b03d-42"\nThe value associated with the specified key is: ', "e7aa-10", task="scbench_kv")]},
    ],
}


def predictions(task, t):
    """Replies to score for one turn: right, wrong and edge cases."""
    sub = t.get("task", task)
    a = t["answer"]
    if sub in ("scbench_repoqa",):
        other = F_LIST if t["answer"] != F_LIST else F_ADD
        return [f"Here it is:\n```python\n{a}\n```\nDone.", f"```\n{other}\n```",
                f"```python\n{a.replace('return', 'yield')}\n```", a, "I cannot find it.",
                f"```python\nimport os\n\n{a}\n```"]
    if sub == "scbench_choice_eng":
        letter = "ABCD"[t["options"].index(a)]
        return [f"{letter}. {a}", f" {a}", "The answer is: " + letter, "E", "", "I think the option is " + letter,
                "Option (" + letter + ")"]
    if sub == "scbench_vt":
        got = a if isinstance(a, list) else a.split()
        return [" ".join(got), got[0].lower(), "none", "a b c d"]
    if sub in ("scbench_passkey", "scbench_mf"):
        return [f"The answer is {a}.", f"{a}0", "x 1.5 then " + str(a), "no number"]
    if sub == "scbench_summary":
        return [a, "This paper " + a.lower(), "Nothing relevant.", ""]
    if sub == "scbench_qa_chn":
        return [a, "他住在" + a + "。", "不知道", "Beijing"]
    return [str(a), f"The answer is {str(a).upper()}!", "I do not know.", "", str(a)[:3]]


def score_all(eu, cs, task, recs, out):
    """Each prediction of every turn alone, through compute_scores' own per-turn scorer, appended to out; returns
    each turn's first prediction as a compute_scores input line."""
    cs_name = cs.Multiturnbench_to_Infinitebench.get(task, task)
    needle_by_repo = {}  # compute_scores: every repoqa prediction's ground truth, by repo, in file order
    for r in recs:
        for t in r["multi_turns"]:
            if t.get("task", task) == "scbench_repoqa":
                needle_by_repo.setdefault(r["repo"], []).append({"needle": t["answer"], "name": t["name"]})
    first_preds = []
    for ri, r in enumerate(recs):
        gts = eu.get_ground_truth(r, task)
        for k, (t, gt) in enumerate(zip(r["multi_turns"], gts)):
            sub = t.get("task", task)
            for pi, p in enumerate(predictions(task, t)):
                case = {"id": ri, "turn_idx": k, "prediction": p, "ground_truth": gt}
                if sub == "scbench_repoqa":
                    case.update(lang=r["lang"], repo=r["repo"], func_name=t["name"])
                if task in ("scbench_summary_with_needles", "scbench_repoqa_and_kv"):
                    case["task"] = sub
                if pi == 0:
                    first_preds.append(case)
                if sub == "scbench_repoqa":
                    res = __import__("repo_qa_utils").compute_score("kvb", [case], [gt], needle_by_repo)
                    score = float(res["kvb"]["scores"]["all"][0.8]["pass@1"])
                elif task == "scbench_repoqa_and_kv":
                    score = cs.get_score_one(p, gt, "kv_retrieval", "kvb")
                elif task == "scbench_summary_with_needles":
                    score = cs.get_score_one(p, gt, cs.Multiturnbench_to_Infinitebench.get(sub, sub), "kvb")
                else:
                    score = cs.get_score_one(p, gt, cs_name, "kvb")
                out.append({"task": task, "record": ri, "turn": k + 1, "prediction": p, "score": score})
    return first_preds


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scbench", required=True, help="MInference's scbench/ folder")
    ap.add_argument("--out", default="tests/fixtures/scbench")
    args = ap.parse_args()
    eu, cs = load_official(os.path.abspath(args.scbench))
    import contextlib
    import io
    import nltk
    tok = ChatML()
    os.makedirs(args.out, exist_ok=True)
    exp = {"source": "microsoft/MInference scbench/ at 0ff346d; nltk " + nltk.__version__ + ", rouge-score 0.1.2",
           "qwen_system": QWEN_SYSTEM, "tasks": {}, "scores": [], "turn_scores": {}, "bleu": []}
    for task, recs in RECORDS.items():
        with open(os.path.join(args.out, task + ".jsonl"), "w", encoding="utf-8") as f:
            for r in recs:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        te = {"max_new_tokens": eu.DATA_NAME_TO_MAX_NEW_TOKENS[task], "records": []}
        for r in recs:
            mt = eu.create_multiturn_prompt(r, task, tok, True)
            sd = eu.create_scdq_prompt(r, task, tok, True)
            te["records"].append({"multi_turn": mt["prompts"], "scdq": sd["prompts"]})
        exp["tasks"][task] = te
        first_preds = score_all(eu, cs, task, recs, exp["scores"])
        if task in ("scbench_repoqa", "scbench_repoqa_and_kv"):
            cut = [{**r, "multi_turns": r["multi_turns"][:2]} for r in recs]
            exp.setdefault("scores_max_turns_2", [])
            score_all(eu, cs, task, cut, exp["scores_max_turns_2"])
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "preds.jsonl"
            with open(path, "w", encoding="utf-8") as f:
                for c in first_preds:
                    f.write(json.dumps(c, ensure_ascii=False) + "\n")
            with contextlib.redirect_stdout(io.StringIO()):  # its tables and progress lines
                exp["turn_scores"][task] = cs.compute_scores(path, task, "kvb")
    sys.path.insert(0, os.path.abspath(args.scbench))
    import repo_qa_utils
    pairs = [(F_ADD, F_ADD), (F_ADD.replace("total", "t"), F_ADD), ("def f ( ) :", F_ADD), ("", F_ADD), ("x", "x"),
             ("a b", "a b c d e"), ("a b c d e f", "a b"), (F_READ, F_LIST), ("return total", F_ADD),
             ("def  add_numbers(a,\tb):\n\n total = a + b", F_ADD)]
    for c, r in pairs:
        exp["bleu"].append({"candidate": c, "reference": r, "bleu": repo_qa_utils.compute_function_similarity(c, r)})
    with open(os.path.join(args.out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(exp, f, ensure_ascii=False, indent=1)
    print(f"wrote {args.out}: {len(exp['scores'])} scored predictions, {len(exp['bleu'])} BLEU pairs")


if __name__ == "__main__":
    main()
