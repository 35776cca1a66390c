#!/usr/bin/env bash
# sweep.sh SUITE N [sbatch options...] — a kvbench suite as a Slurm job array of N shards plus a merge job
# that runs when every shard succeeded (--dependency=afterok). See scripts/slurm/README.md.
#
# Environment:
#   KVB_BIN        kvbench binary (default: build/kvbench of this checkout); must be reachable from the nodes
#   KVB_SWEEP_OUT  output root (default: runs/sweep-<suite>-<UTC time>); shard i writes OUT/shard-i, the
#                  merge OUT/merged, Slurm logs go to OUT/logs. Must be on a filesystem the nodes share.
#   KVB_SWEEP_MERGED  where the merge job writes the merged run (default OUT/merged)
#   KVB_RUN_ARGS   extra `kvbench run` options for every shard, e.g. "--limit 5 --threads 8"
# sbatch options are passed to both jobs (except --gpus*, which only the shards get). With --gpus-per-task
# (or --gpus/--gres=gpu) the shards run on the CUDA backend (KVB_BACKEND=cuda) unless KVB_BACKEND is set.
# A shard that is re-queued (node failure, preemption; the array is submitted with --requeue) runs the same
# command on the same directory, so it resumes from its results.jsonl instead of starting over.
# Prints the two job ids and, last, one line "KVB_SWEEP array=ID merge=ID out=DIR" for scripts.
set -euo pipefail
usage() { echo "usage: $0 SUITE.json N [sbatch options...]" >&2; exit 2; }
[ $# -ge 2 ] || usage
suite=$1 n=$2
shift 2
[[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 10000 ] || { echo "sweep.sh: N must be an integer in [1, 10000], got '$n'" >&2; exit 2; }
[ -r "$suite" ] || { echo "sweep.sh: cannot read suite '$suite'" >&2; exit 2; }
command -v sbatch >/dev/null || { echo "sweep.sh: sbatch not found (is this a Slurm login node?)" >&2; exit 2; }
here=$(cd "$(dirname "$0")/../.." && pwd)
bin=${KVB_BIN:-$here/build/kvbench}
[ -x "$bin" ] || { echo "sweep.sh: kvbench binary '$bin' not found (build it, or set KVB_BIN)" >&2; exit 2; }
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
suite=$(cd "$(dirname "$suite")" && pwd)/$(basename "$suite")
name=$(basename "$suite" .json)
out=${KVB_SWEEP_OUT:-runs/sweep-$name-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out/logs"
out=$(cd "$out" && pwd)
merged=${KVB_SWEEP_MERGED:-$out/merged}
case $merged in /*) ;; *) merged=$(pwd)/$merged ;; esac

array_opts=() merge_opts=() gpu=0
for o in "$@"; do
    case $o in
        --gpus*|--gres=gpu*) array_opts+=("$o"); gpu=1 ;;
        *) array_opts+=("$o"); merge_opts+=("$o") ;;
    esac
done
backend=${KVB_BACKEND:-}
[ -n "$backend" ] || { [ "$gpu" = 1 ] && backend=cuda || backend=cpu; }

# The job scripts are written out (not --wrap) so a re-queue or a hand re-submission runs exactly them.
q() { printf '%q' "$1"; }
cat > "$out/shard.sbatch" <<JOB
#!/usr/bin/env bash
# one shard of $(q "$suite"): SLURM_ARRAY_TASK_ID of $n; re-running resumes from the shard's results.jsonl
set -eu
export KVB_BACKEND=$(q "$backend")
export KVB_SOURCE_DIR=$(q "$here")
exec $(q "$bin") run $(q "$suite") --shard "\$SLURM_ARRAY_TASK_ID/$n" --out $(q "$out")/shard-"\$SLURM_ARRAY_TASK_ID" --quiet ${KVB_RUN_ARGS:-}
JOB
dirs=""
for ((i = 0; i < n; i++)); do dirs+=" $(q "$out/shard-$i")"; done
cat > "$out/merge.sbatch" <<JOB
#!/usr/bin/env bash
# merge the $n shards of $(q "$suite") into $(q "$merged") (refuses missing or conflicting cells)
set -eu
export KVB_SOURCE_DIR=$(q "$here")
exec $(q "$bin") merge $(q "$merged")$dirs
JOB
chmod +x "$out/shard.sbatch" "$out/merge.sbatch"

array=$(sbatch --parsable --array=0-$((n - 1)) --requeue --job-name="kvb-$name" --output="$out/logs/shard-%a.out" \
    ${array_opts[@]+"${array_opts[@]}"} "$out/shard.sbatch")
array=${array%%;*}
merge=$(sbatch --parsable --dependency=afterok:"$array" --kill-on-invalid-dep=yes --job-name="kvb-$name-merge" \
    --output="$out/logs/merge.out" ${merge_opts[@]+"${merge_opts[@]}"} "$out/merge.sbatch")
merge=${merge%%;*}
echo "submitted array job $array ($n shards of $name, backend $backend) -> $out/shard-{0..$((n - 1))}"
echo "submitted merge job $merge (afterok:$array) -> $merged"
echo "KVB_SWEEP array=$array merge=$merge out=$out"
