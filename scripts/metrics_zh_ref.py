#!/usr/bin/env python3
"""Reference values of LongBench's official Chinese metrics for tests/test_metrics_zh.c.

Runs the official LongBench/metrics.py (THUDM/LongBench; not copied here: give its path) on the cases below, as
LongBench/eval.py scores a sample (first-line cut for lsht; max over the answers), for the five Chinese tasks:
multifieldqa_zh (qa_f1_zh_score), dureader and vcsum (rouge_zh_score), lsht (classification_score),
passage_retrieval_zh (retrieval_zh_score). Writes tests/fixtures/jieba/longbench_zh_metrics.json; the C metrics
(benchmarks/metrics.c over benchmarks/jieba.c) must give the same numbers.

    git clone https://github.com/THUDM/LongBench
    python3 -m venv /tmp/lb && /tmp/lb/bin/pip install jieba==0.42.1 rouge==1.0.1 fuzzywuzzy
    /tmp/lb/bin/python scripts/metrics_zh_ref.py --metrics LongBench/LongBench/metrics.py [--shared ../shared/data]

With --shared it also scores predictions made from the Chinese LongBench records in ../shared/data (the gold
itself, its first half, another record's gold, the start of the context; never copied into the project) and writes
tests/fixtures/jieba/longbench_zh_shared_scores.json: where each prediction comes from and its score, no text.
Scoring goes module -> score_case -> metric, the call depth of eval.py, so the `rouge` package meets Python's
recursion limit on the same inputs as under eval.py (rouge_zh_score adds one frame to rouge_score's).
"""
import argparse
import importlib.util
import json
import os
import random
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FIX = os.path.join(ROOT, "tests", "fixtures", "jieba")
FIRST_LINE_TASKS = ("trec", "triviaqa", "samsum", "lsht")
METRIC_OF = {"multifieldqa_zh": "qa_f1_zh_score", "dureader": "rouge_zh_score", "vcsum": "rouge_zh_score",
             "lsht": "classification_score", "passage_retrieval_zh": "retrieval_zh_score"}
METRIC_NAME = {"qa_f1_zh_score": "qa_f1_zh", "rouge_zh_score": "rouge_zh", "classification_score": "classification",
               "retrieval_zh_score": "retrieval_zh"}
CLASSES = ["农业、农村", "军事", "文学、艺术", "体育", "传媒业", "电子信息产业", "文化、休闲娱乐", "社会、劳动", "经济",
           "服务业、旅游业", "环境、气象", "能源、水务、水利", "财政、金融", "教育", "科学技术", "对外关系、国际关系",
           "矿业、工业", "政治", "交通运输、邮政、物流", "灾难、事故", "基本建设、建筑业、房地产", "医药、卫生",
           "法律、司法", "商业、外贸、海关"]


def corpus():
    with open(os.path.join(FIX, "corpus.txt"), encoding="utf-8") as f:
        return [l.rstrip("\n") for l in f if l.strip() and not l.startswith("# ")]


def make_cases():
    rng = random.Random(20261126)
    lines = corpus()
    c = []
    qa = [
        ("北京", ["北京"]),
        ("答案是北京。", ["北京"]),
        ("中国的首都是北京", ["北京是中国的首都"]),
        ("2012年，财政总收入增长了25.89%。", ["财政总收入增长了25.89%"]),
        ("", ["北京"]),
        ("北京", [""]),
        ("。，！？", ["北京"]),
        ("《红楼梦》的作者是曹雪芹", ["曹雪芹"]),
        ("《红楼梦》", ["红楼梦"]),
        ("“人工智能”", ["人工智能"]),
        ("ＡＢＣ公司", ["abc公司"]),
        ("GPU和CPU", ["gpu"]),
        ("İstanbul在土耳其", ["istanbul"]),
        ("ΟΔΥΣΣΕΥΣ是希腊英雄", ["οδυσσευς"]),
        ("我 爱 北京 天安门", ["我爱北京天安门"]),
        ("他说：“明天见！”", ["明天见"]),
        ("的的的的", ["的"]),
        ("北京 北京 北京", ["北京", "上海"]),
        ("上海", ["北京", "上海是最大的城市"]),
        ("3.14%的人", ["3.14%"]),
        ("约为10.2kW", ["10.2 kW"]),
        ("C++和Python", ["python", "c++"]),
        ("1949年10月1日", ["一九四九年十月一日"]),
        ("…—–‘’", ["北京"]),
        ("〔注〕〖一〗【二】", ["注一二"]),
        ("a.b.c", ["abc"]),
        ("东京タワー", ["東京タワー"]),
        ("今天天气真好😊", ["今天天气真好"]),
        ("\u3000北京\u3000", ["北京"]),
        ("北京\r\n上海", ["北京上海"]),
    ]
    for pred, ans in qa:
        c.append(("multifieldqa_zh", pred, ans, None))
    for k in range(12):  # corpus sentences against each other and against themselves cut in half
        a, b = rng.sample(lines, 2)
        c.append(("multifieldqa_zh", a if k % 3 else a[: len(a) // 2], [a, b] if k % 2 else [b], None))

    rouge = [
        ("这是一个测试。", ["这是一个测试。"]),
        ("", ["参考摘要。"]),
        ("预测摘要。", [""]),
        ("...", ["一 二 三"]),
        ("会议讨论了课程设计。大家同意下周继续。", ["会议讨论了课程的整体设计，大家同意下周继续讨论。"]),
        ("股价上涨了3.21%，成交额达到1.5亿元。", ["股价上涨3.21%，成交额1.5亿元。"]),
        ("完全不同的内容", ["毫无关系的句子"]),
        ("the committee approved the budget.", ["The committee approved the budget."]),
        ("重复 重复 重复 重复", ["重复"]),
        ("A. 北京 B. 上海", ["B. 上海"]),
    ]
    for i, (pred, ans) in enumerate(rouge):
        c.append(("dureader" if i % 2 else "vcsum", pred, ans, None))
    for k in range(10):  # long summaries: many corpus sentences, some with "." inside (3.5亿, v1.2.3)
        ref = "".join(rng.sample(lines, rng.randint(3, 25)))
        hyp = "".join(rng.sample(lines, rng.randint(1, 15)))
        c.append(("vcsum" if k % 2 else "dureader", hyp, [ref], None))
    # the recursion limit: n distinct words in one sentence; rouge_zh_score's extra frame moves the limit one
    # word earlier than rouge_score's (990 words still score there)
    for n in (988, 989, 990):
        same = " ".join("w%d" % i for i in range(n))
        c.append(("vcsum", same, [same], None))
    long_zh = "".join(l.replace(".", "") for l in lines[:60])
    c.append(("vcsum", long_zh, [long_zh], None))

    lsht = [
        ("教育", "教育"),
        ("类别：体育", "体育"),
        ("经济\n政治", "经济"),
        ("\n\n军事", "军事"),
        ("财政、金融", "财政、金融"),
        ("经济和财政、金融", "财政、金融"),
        ("这条新闻属于科学技术类", "教育"),
        ("农业、农村 农业", "农业、农村"),
        ("无法判断", "政治"),
        ("医药、卫生；法律、司法", "法律、司法"),
    ]
    for pred, gold in lsht:
        c.append(("lsht", pred, [gold], CLASSES))

    ret = [("段落5", "段落5"), ("答案是：段落12", "段落12"), ("段落3，不是段落13或30", "段落3"), ("段落07", "段落7"),
           ("无", "段落5"), ("5 5 5 6", "段落5"), ("段落１２", "段落12"), ("段落12", "段落１２"),
           ("段落 1 和段落1", "段落1"), ("第2段", "段落2")]
    for pred, gold in ret:
        c.append(("passage_retrieval_zh", pred, [gold], None))
    return c


def load_official(path):
    spec = importlib.util.spec_from_file_location("longbench_metrics", path)
    official = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(official)
    import jieba
    jieba.setLogLevel(60)
    return official


def score_case(fn, task, pred, answers, classes):
    """eval.py's scorer for one sample, called from module level as eval.py calls its scorer."""
    score = 0.0
    if task in FIRST_LINE_TASKS:
        pred = pred.lstrip('\n').split('\n')[0]
    for gold in answers:
        score = max(score, fn(pred, gold, all_classes=classes))
    return float(score)


def versions():
    from importlib.metadata import version
    return {"python": sys.version.split()[0], "jieba": version("jieba"), "rouge": version("rouge")}


SHARED = [("multifieldqa_zh", "longbench/reconstructed_from_minilongbench/multifieldqa_zh.jsonl"),
          ("multifieldqa_zh", "longbench/official_jsonl/multifieldqa_zh.first20.jsonl"),
          ("dureader", "longbench/reconstructed_from_minilongbench/dureader.jsonl"),
          ("vcsum", "longbench/reconstructed_from_minilongbench/vcsum.jsonl"),
          ("passage_retrieval_zh", "longbench/reconstructed_from_minilongbench/passage_retrieval_zh.jsonl"),
          ("passage_retrieval_zh", "longbench/official_jsonl/passage_retrieval_zh.first20.jsonl"),
          ("lsht", "longbench/rendered_prompts_minilongbench/lsht.jsonl")]


def shared_pred(kind, rec, nxt):
    """The prediction of a kind made from a record (the C test makes the same): gold = answers[0]; half = its first
    half (code points); other = the next record's answers[0]; context = the first 300 code points of the context
    (lsht: of the rendered prompt's last 300)."""
    ans = rec["answers"][0]
    if kind == "gold":
        return ans
    if kind == "half":
        return ans[: len(ans) // 2]
    if kind == "other":
        return nxt["answers"][0]
    return rec["context"][:300]


def records(path):
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if "gold" in r:  # the rendered lsht prompts: answers and classes under "gold", no context field
                r = {"answers": r["gold"]["answers"], "all_classes": r["gold"]["all_classes"],
                     "context": r["origin_prompt"][-300:]}
            out.append(r)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--metrics", required=True, help="path of the official LongBench/metrics.py")
    ap.add_argument("--shared", default=None, help="../shared/data, for the scores on its Chinese records")
    args = ap.parse_args()
    official = load_official(args.metrics)
    results = []
    for task, pred, answers, classes in make_cases():
        fn = getattr(official, METRIC_OF[task])
        results.append({"task": task, "pred": pred, "answers": answers, "all_classes": classes,
                        "metric": METRIC_NAME[METRIC_OF[task]],
                        "score": score_case(fn, task, pred, answers, classes)})
    with open(os.path.join(FIX, "longbench_zh_metrics.json"), "w", encoding="utf-8") as f:
        json.dump({"source": "THUDM/LongBench LongBench/metrics.py via scripts/metrics_zh_ref.py",
                   "versions": versions(), "cases": results}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("metrics_zh_ref: %d cases -> tests/fixtures/jieba/longbench_zh_metrics.json" % len(results))
    if args.shared:
        out = []
        for task, rel in SHARED:
            recs = records(os.path.join(args.shared, rel))
            fn = getattr(official, METRIC_OF[task])
            for i, r in enumerate(recs):
                for kind in ("gold", "half", "other", "context"):
                    pred = shared_pred(kind, r, recs[(i + 1) % len(recs)])
                    out.append({"task": task, "file": rel, "line": i + 1, "pred": kind,
                                "score": score_case(fn, task, pred, r["answers"], r.get("all_classes"))})
        with open(os.path.join(FIX, "longbench_zh_shared_scores.json"), "w", encoding="utf-8") as f:
            json.dump({"source": "scripts/metrics_zh_ref.py --shared ../shared/data", "versions": versions(),
                       "scores": out}, f, indent=0)
            f.write("\n")
        print("metrics_zh_ref: %d scores -> tests/fixtures/jieba/longbench_zh_shared_scores.json" % len(out))
