#!/usr/bin/env bash
# nightly.sh [options] BASELINE_DIR OUT_DIR — the nightly gate: run configs/nightly.json into OUT_DIR (here,
# or sharded through Slurm with --slurm N), compare it with the baseline run with `kvbench compare`
# (OUT_DIR/compare.md), and write the history of every run beside OUT_DIR (../history: history.md and one
# SVG trend per method@budget). Exit 0: no regression; 1: a regression (compare.md says which cells);
# 2: the run, the merge or the comparison failed. A BASELINE_DIR without run.json (the first night) is
# not compared. Running it again on the same OUT_DIR resumes the run (recorded cells are skipped) and
# compares again: a killed night, or a night re-gated with other tolerances.
#
# options:
#   --slurm N            run as a Slurm job array of N shards + merge (scripts/slurm/sweep.sh) and wait for it;
#                        sbatch options go in KVB_SBATCH_OPTS (e.g. "--partition=gpu --gpus-per-task=1")
#   --suite FILE         another suite (default configs/nightly.json)
#   --limit N            at most N samples per task (passed to kvbench run)
#   --compare "ARGS"     tolerances for kvbench compare (default: its own, score -2 points, decode +10%, KV +1%)
#   --history DIR        where the history goes (default: OUT_DIR/../history)
#   --timeout S          give up waiting for the Slurm merge after S seconds (default 43200)
# Environment: KVB_BIN (default build/kvbench), KVB_RUN_ARGS (more kvbench run options, e.g. "--threads 8").
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${KVB_BIN:-$here/build/kvbench}
suite=$here/configs/nightly.json slurm=0 limit="" cmp_args="" hist="" timeout=43200
die() { echo "nightly.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case $1 in
        --slurm) slurm=${2:-}; shift 2 || die "--slurm needs N" ;;
        --suite) suite=${2:-}; shift 2 || die "--suite needs a file" ;;
        --limit) limit=${2:-}; shift 2 || die "--limit needs N" ;;
        --compare) cmp_args=${2:-}; shift 2 || die "--compare needs arguments" ;;
        --history) hist=${2:-}; shift 2 || die "--history needs a directory" ;;
        --timeout) timeout=${2:-}; shift 2 || die "--timeout needs seconds" ;;
        -h|--help) sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        -*) die "unknown option '$1' (see --help)" ;;
        *) break ;;
    esac
done
[ $# -eq 2 ] || die "usage: nightly.sh [options] BASELINE_DIR OUT_DIR (see --help)"
base=$1 out=$2
[ -x "$bin" ] || die "kvbench binary '$bin' not found (build it, or set KVB_BIN)"
[ -r "$suite" ] || die "cannot read suite '$suite'"
[[ $slurm =~ ^[0-9]+$ ]] || die "--slurm expects a number of shards, got '$slurm'"
[ -z "$limit" ] || [[ $limit =~ ^[1-9][0-9]*$ ]] || die "--limit expects a positive integer, got '$limit'"
run_args=(${KVB_RUN_ARGS:-})
[ -n "$limit" ] && run_args+=(--limit "$limit")
mkdir -p "$out" || die "cannot create $out"

if [ "$slurm" -gt 0 ]; then
    sub=$(KVB_BIN=$bin KVB_SWEEP_OUT="$out.shards" KVB_SWEEP_MERGED="$out" KVB_RUN_ARGS="${run_args[*]}" \
        bash "$here/scripts/slurm/sweep.sh" "$suite" "$slurm" ${KVB_SBATCH_OPTS:-}) || die "sweep.sh failed: $sub"
    echo "$sub"
    merge=$(echo "$sub" | sed -n 's/^KVB_SWEEP .*merge=\([0-9]*\).*/\1/p')
    [ -n "$merge" ] || die "sweep.sh printed no merge job id"
    waited=0
    while squeue -h -j "$merge" 2>/dev/null | grep -q .; do
        [ "$waited" -lt "$timeout" ] || die "the merge job $merge did not finish within $timeout s"
        sleep 10
        waited=$((waited + 10))
    done
    grep -q '^merged' "$out.shards/logs/merge.out" 2>/dev/null && [ -r "$out/run.json" ] ||
        die "the Slurm sweep did not produce a merged run in $out (see $out.shards/logs/)"
else
    "$bin" run "$suite" --out "$out" --quiet "${run_args[@]}" >"$out/run.log" 2>&1 ||
        die "kvbench run failed: $(tail -n 1 "$out/run.log")"
fi

rc=0
if [ -r "$base/run.json" ]; then
    # shellcheck disable=SC2086 # tolerances are words
    "$bin" compare "$base" "$out" $cmp_args >"$out/compare.md" 2>"$out/compare.err"
    rc=$?
    case $rc in
        0) echo "nightly: no regression against $base ($out/compare.md)" ;;
        1) echo "nightly: REGRESSION against $base ($out/compare.md):"; grep -i 'regress' "$out/compare.md" | head -n 20 ;;
        *) die "kvbench compare failed: $(tail -n 1 "$out/compare.err")" ;;
    esac
else
    echo "No baseline run in $base: nothing compared (first night)." >"$out/compare.md"
    echo "nightly: no baseline run in $base; nothing compared"
fi

# history over every run beside OUT_DIR (one directory per night), plus the baseline when it lives elsewhere
parent=$(cd "$out/.." && pwd)
hist=${hist:-$parent/history}
runs=()
for d in "$parent"/*/; do [ -r "$d/run.json" ] && [ -r "$d/results.jsonl" ] && runs+=("${d%/}"); done
if [ -r "$base/run.json" ] && [ "$(cd "$base/.." && pwd)" != "$parent" ]; then runs+=("$base"); fi
"$bin" history "${runs[@]}" --out "$hist" >/dev/null || die "kvbench history failed"
echo "nightly: history of ${#runs[@]} runs in $hist/history.md"
exit $rc
