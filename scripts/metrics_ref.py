#!/usr/bin/env python3
"""Reference values of LongBench's official metrics for tests/test_metrics.c.

Runs the official LongBench/metrics.py (THUDM/LongBench; not copied here: give its path) on the cases below,
scored as LongBench/eval.py scores a sample (first-line cut for trec, triviaqa, samsum, lsht; max over the
answers), and writes tests/fixtures/longbench_metrics.json. The C metrics (benchmarks/metrics.c) must give
the same numbers.

    git clone https://github.com/THUDM/LongBench          # or any copy of LongBench/metrics.py
    pip install rouge==1.0.1 fuzzywuzzy jieba              # LongBench/requirements.txt: no python-Levenshtein
    python3 scripts/metrics_ref.py --metrics LongBench/LongBench/metrics.py

The environment must match LongBench's requirements: fuzzywuzzy without python-Levenshtein (difflib's
SequenceMatcher); the script refuses to run otherwise. Scoring goes module -> score_case -> metric, the same
call depth as eval.py's module -> scorer -> metric, so the `rouge` package hits Python's recursion limit on the
same inputs as it does under eval.py. The C code's Unicode tables (str.lower, \d) are Python 3.11's
(Unicode 14.0); the fixture records the versions it was made with.
"""
import argparse
import importlib.util
import json
import os
import random
import sys

FIRST_LINE_TASKS = ("trec", "triviaqa", "samsum", "lsht")
METRIC_OF = {
    "narrativeqa": "qa_f1_score", "qasper": "qa_f1_score", "multifieldqa_en": "qa_f1_score",
    "hotpotqa": "qa_f1_score", "2wikimqa": "qa_f1_score", "musique": "qa_f1_score", "triviaqa": "qa_f1_score",
    "gov_report": "rouge_score", "qmsum": "rouge_score", "multi_news": "rouge_score", "samsum": "rouge_score",
    "trec": "classification_score", "passage_retrieval_en": "retrieval_score", "passage_count": "count_score",
    "lcc": "code_sim_score", "repobench-p": "code_sim_score",
}
METRIC_NAME = {"qa_f1_score": "qa_f1", "rouge_score": "rouge", "classification_score": "classification",
               "retrieval_score": "retrieval", "count_score": "count", "code_sim_score": "code_sim"}


def words(rng, n, vocab):
    return " ".join(rng.choice(vocab) for _ in range(n))


def make_cases():
    rng = random.Random(20261122)
    vocab = ("the report says that funding for state programs rose while federal agencies cut staff and "
             "delayed reviews of contracts during the year a an of to in").split()
    classes = ["Abbreviation", "Expression abbreviated", "Animal", "Organ of body", "Color", "Sport",
               "Definition of something", "Description of something", "Description of a person", "Date",
               "Number of something", "Other number", "Country", "City", "Other location", "Person", "Group",
               "Event", "Food", "Element and substance", "Title of a person", "Order", "Organ"]
    c = []
    qa = [
        ("The Eiffel Tower.", ["Eiffel Tower"]),
        ("It was the 1998 FIFA World Cup, held in France", ["1998 FIFA World Cup"]),
        ("an apple a day", ["The Apple"]),
        ("", ["Paris"]),
        ("Paris", [""]),
        ("...!!!", ["Paris"]),
        ("the the the", ["the"]),
        ("New York, New York!", ["New York City", "New York"]),
        ("  Barack   Obama\tand\nJoe Biden ", ["Joe Biden"]),
        ("Café Müller in Düsseldorf", ["café müller"]),
        ("ÉCOLE NORMALE", ["école normale supérieure"]),
        ("Он родился в Москве", ["в Москве"]),
        ("ΑΘΗΝΑ is the capital", ["αθηνα"]),
        ("it’s the year’s best film", ["years best film"]),
        ("the’s a—an test", ["a test"]),
        ("Answer: 42 (forty-two)", ["42"]),
        ("yes", ["Yes."]),
        ("No, it is not.", ["no"]),
        ("under_score and the_end", ["under_score"]),
        ("a b c d e f g", ["g f e d c b a"]),
        ("Miller Miller Miller", ["Miller", "Glenn Miller"]),
        ("Glenn Miller Orchestra", ["Glenn Miller", "The Glenn Miller Orchestra"]),
        ("1,000,000 people", ["1000000"]),
        ("25 January 1976\nbecause of the war", ["25 January 1976"]),
        ("\n\nThe Beatles\nwere a band", ["Beatles"]),
        ("naïve résumé coöperate", ["naive resume cooperate", "naïve résumé"]),
        ("北京 is in China", ["北京"]),
        ("an", ["a"]),
    ]
    for pred, ans in qa:
        c.append(("hotpotqa", pred, ans, None))
    for pred, ans in qa[:8] + [("Albert Einstein\nwas a physicist", ["Albert Einstein"])]:
        c.append(("triviaqa", pred, ans, None))
    c.append(("narrativeqa", "He returns to his village and marries Lucy.", ["He marries Lucy", "returns home"], None))
    c.append(("qasper", "unanswerable", ["Unanswerable"], None))
    c.append(("2wikimqa_e", "The director of the film was born in Lyon, France.", ["Lyon"], None))

    rouge = [
        ("The committee approved the budget. It will take effect next year.",
         ["The budget was approved by the committee and takes effect next year."]),
        ("", ["Reference summary."]),
        ("Something.", [""]),
        ("...", ["a b c"]),
        ("a. . b", ["a b"]),
        ("Dogs bark. Dogs bark. Dogs bark loudly.", ["The dogs bark loudly at night. Cats sleep."]),
        ("Mr. Smith went to Washington.", ["Mr. Smith went to Washington D.C. to testify."]),
        ("no overlap at all", ["completely different words here"]),
        ("   .   ", ["a b"]),
        ("Übersicht über die Lage. Ça va.", ["Übersicht der Lage. Ça va bien."]),
        ("#Person1# asks #Person2# to dinner.", ["#Person1# invites #Person2# to dinner."]),
        ("word " * 50, ["word"]),
    ]
    for pred, ans in rouge:
        c.append(("gov_report", pred, ans, None))
    c.append(("samsum", "Anna will bring the cake.\nTom brings drinks.", ["Anna is bringing a cake and Tom drinks."],
              None))
    c.append(("samsum", "\n\nJohn is late.", ["John will be late for the meeting."], None))
    c.append(("qmsum", "The team discussed the remote control design. They agreed on a yellow case.",
              ["The group discussed the design of the remote control and agreed on the case colour.",
               "They agreed on yellow."], None))
    for k in range(8):  # long multi-sentence summaries with repeated words
        ref = ". ".join(words(rng, rng.randint(5, 40), vocab) for _ in range(rng.randint(3, 12))) + "."
        hyp = ". ".join(words(rng, rng.randint(3, 40), vocab) for _ in range(rng.randint(1, 10)))
        c.append(("multi_news" if k % 2 else "gov_report", hyp, [ref], None))
    # long single sentences: the `rouge` package's recursive LCS reconstruction fails (score 0) once its path
    # passes Python's recursion limit; identical sentences of n distinct words take exactly n steps
    for n in (400, 1500):
        c.append(("gov_report", words(rng, n, vocab), [words(rng, n + 7, vocab)], None))
    for n in (990, 991):
        same = " ".join("w%d" % i for i in range(n))
        c.append(("gov_report", same, [same], None))

    trec = [
        ("Organ", "Organ of body"),
        ("Organ of body", "Organ of body"),
        ("Organ of body, Organ", "Organ"),
        ("Description of something or Description of a person", "Description of a person"),
        ("Number of something", "Other number"),
        ("Abbreviation or Expression abbreviated", "Expression abbreviated"),
        ("Expression abbreviated", "Abbreviation"),
        ("City\nCountry", "City"),
        ("nothing matches", "Color"),
        ("Country City Other location Person", "City"),
        ("Definition of something", "Definition of something"),
    ]
    for pred, gold in trec:
        c.append(("trec", pred, [gold], classes))
    c.append(("trec", "Organ Organ of body", ["Organ of body"], ["Organ", "Organ", "Organ of body", "Organ"]))

    ret = [("Paragraph 12", "Paragraph 12"), ("The answer is paragraph 3, not 13 or 30.", "Paragraph 3"),
           ("Paragraph 07", "Paragraph 7"), ("none", "Paragraph 5"), ("5 5 5 6", "Paragraph 5"),
           ("Paragraph 1 and Paragraph 1", "Paragraph 1")]
    for pred, gold in ret:
        c.append(("passage_retrieval_en", pred, [gold], None))
    for pred, gold in [("There are 12 unique paragraphs.", "12"), ("12 or 13", "12"), ("twelve", "12"),
                       ("1 2", "12"), ("012", "12"), ("12, 12 and 4", "12")]:
        c.append(("passage_count", pred, [gold], None))

    code = [
        ("    return x + 1\n", "    return x + 1"),
        ("# comment\n    return x\n", "    return x + y"),
        ("\n\n```python\nfoo(bar)\n", "foo(bar, baz)"),
        ("// comment\nint y = a + b;", "int x = a + b;"),
        ("", "print(x)"),
        ("print(x)", ""),
        ("`a`\n#b\n//c", "a"),
        ("self.assertEqual(result, expected)", "self.assertEqual(expected, result)"),
        ("for (int i = 0; i < n; i++) {", "for (size_t i = 0; i < len; ++i) {"),
        ("x = 1", "x = 1"),
        ("résumé = naïve", "resume = naive"),
        ("a" * 120 + "b" * 120, "ab" * 120),
        (words(rng, 60, vocab), words(rng, 60, vocab)),
        ("e" * 10 + " " + words(rng, 50, vocab), words(rng, 50, vocab) + " " + "e" * 30),
    ]
    for pred, gold in code:
        c.append(("lcc", pred, [gold], None))
    c.append(("repobench-p", "result = model.forward(inputs)\n", ["result = self.model(inputs)", "out = model(inputs)"],
              None))
    c += unicode_cases()
    return c


# Unicode: full lowercase mapping (Vietnamese, Romanian, U+0130, final sigma), Unicode whitespace and format
# characters around articles, Unicode digits in \d+
def unicode_cases():
    return [
        ("hotpotqa", "NGUYỄN VĂN THIỆU", ["Nguyễn Văn Thiệu"], None),
        ("hotpotqa", "ȘTEFAN CEL MARE", ["Ștefan cel Mare"], None),
        ("hotpotqa", "ΟΔΥΣΣΕΥΣ", ["Οδυσσευς"], None),
        ("hotpotqa", "ΟΔΥΣΣΕΥΣ'", ["οδυσσευς"], None),
        ("hotpotqa", "İSTANBUL", ["istanbul"], None),
        ("hotpotqa", "ЛЕВ ТОЛСТОЙ", ["Лев Толстой"], None),
        ("hotpotqa", "ԱՐԱՄ Khachaturian", ["Արամ Khachaturian"], None),
        ("hotpotqa", "\ufeffThe Beatles", ["Beatles"], None),
        ("hotpotqa", "a\u1680band", ["band"], None),
        ("hotpotqa", "the\u00a0answer\u2003is\u3000Paris", ["Paris"], None),
        ("passage_count", "there are １２, i.e. 12", ["12"], None),
        ("passage_count", "١٢ paragraphs", ["١٢"], None),
        ("passage_retrieval_en", "Paragraph ٣", ["Paragraph 3"], None),
        ("passage_retrieval_en", "Paragraph 1２ or 12", ["Paragraph 12"], None),
        ("lcc", "naïve_résumé = 'café'", ["naive_resume = 'cafe'"], None),
    ]


def load_official(path):
    spec = importlib.util.spec_from_file_location("longbench_metrics", path)
    official = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(official)
    import difflib
    from fuzzywuzzy import fuzz
    if fuzz.SequenceMatcher is not difflib.SequenceMatcher:
        sys.exit("metrics_ref: python-Levenshtein is installed; LongBench's requirements do not install it "
                 "(fuzz.ratio would differ). Run in an environment without it.")
    return official


def score_case(fn, task, pred, answers, classes):
    """eval.py's scorer for one sample. It is called from module level, as eval.py calls its scorer, so the
    metric runs at the same Python call depth."""
    score = 0.0
    if task in FIRST_LINE_TASKS:
        pred = pred.lstrip('\n').split('\n')[0]
    for gold in answers:
        score = max(score, fn(pred, gold, all_classes=classes))
    return float(score)


def versions():
    from importlib.metadata import version
    return {"python": sys.version.split()[0], "rouge": version("rouge"), "fuzzywuzzy": version("fuzzywuzzy")}


def write(path, out):
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"source": "THUDM/LongBench LongBench/metrics.py via scripts/metrics_ref.py",
                   "versions": versions(), "cases": out}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("metrics_ref: %d cases -> %s" % (len(out), path))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--metrics", required=True, help="path of the official LongBench/metrics.py")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                                  "fixtures", "longbench_metrics.json"))
    args = ap.parse_args()
    official = load_official(args.metrics)
    results = []
    for task, pred, answers, classes in make_cases():
        base = task[:-2] if task.endswith("_e") else task
        fn = getattr(official, METRIC_OF[base])
        results.append({"task": task, "pred": pred, "answers": answers, "all_classes": classes,
                        "metric": METRIC_NAME[METRIC_OF[base]],
                        "score": score_case(fn, base, pred, answers, classes)})
    write(args.out, results)
