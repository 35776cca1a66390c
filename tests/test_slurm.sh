#!/usr/bin/env bash
# test_slurm.sh KVBENCH — scripts/slurm/sweep.sh for real: a one-node Slurm cluster on loopback (munged,
# slurmctld, slurmd with 2 CPUs, everything under a temp dir), a 4-shard job array of a tiny suite plus
# its merge job, and the merged run checked against an unsharded run of the same suite: same records
# (predictions, scores, KV bytes: `kvbench merge` of the two refuses any difference) and the same
# summary.csv without its two timing columns. Installs slurm-wlm and munge from Debian when missing (needs
# root). Fails with one line saying why when the cluster cannot start; every wait is bounded and the
# daemons are stopped on every path.
set -uo pipefail
bin=${1:-${KVB_BIN:-}}
src=$(cd "$(dirname "$0")/.." && pwd)
t0=$(date +%s)
fail() { echo "test_slurm: FAIL: $*"; exit 1; }
[ -x "$bin" ] || fail "kvbench binary '$bin' not found (give it as the first argument)"

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
    [ "$(id -u)" = 0 ] || fail "slurm-wlm/munge are not installed and this is not root (apt-get install slurm-wlm munge)"
    echo "test_slurm: installing slurm-wlm and munge from Debian"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge; } \
        >/tmp/test_slurm_apt.log 2>&1 || fail "apt-get install slurm-wlm munge failed (see /tmp/test_slurm_apt.log)"
fi
[ "$(id -u)" = 0 ] || fail "the one-node cluster runs slurmd as root; run this test as root"

T=$(mktemp -d /tmp/kvb_slurm_XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${pids[@]}"; do
        for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$p" 2>/dev/null
    done
    [ -n "${KEEP_SLURM_TMP:-}" ] || rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null ||
    echo $((20000 + RANDOM % 20000)); }
mkdir -p "$T/state" "$T/spool" "$T/munge"
chmod 700 "$T/munge"
mungekey -c -k "$T/munge/munge.key" >/dev/null 2>&1 || dd if=/dev/urandom of="$T/munge/munge.key" bs=1 count=1024 2>/dev/null
chmod 400 "$T/munge/munge.key"
sock=$T/munge/munge.socket
munged -F -f --key-file="$T/munge/munge.key" --socket="$sock" --pid-file="$T/munge/munged.pid" \
    --log-file="$T/munge/munged.log" --seed-file="$T/munge/munged.seed" >"$T/munged.out" 2>&1 &
pids+=($!)
for _ in $(seq 50); do [ -S "$sock" ] && break; sleep 0.1; done
[ -S "$sock" ] || fail "munged did not start: $(tail -n 1 "$T/munged.out" "$T/munge/munged.log" 2>/dev/null | grep -v '^==' | grep . | tail -n 1)"

ctl_port=$(free_port) d_port=$(free_port)
cat >"$T/slurm.conf" <<CONF
ClusterName=kvbtest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctl_port
SlurmdPort=$d_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$sock
CredType=cred/munge
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/slurmctld.log
SlurmdLogFile=$T/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
PlugStackConfig=$T/plugstack.conf
NodeName=kvbnode NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=kvb Nodes=kvbnode Default=YES MaxTime=INFINITE State=UP
CONF
: >"$T/plugstack.conf"
export SLURM_CONF=$T/slurm.conf
slurmctld -D -c -f "$T/slurm.conf" >"$T/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -N kvbnode -f "$T/slurm.conf" >"$T/slurmd.out" 2>&1 &
pids+=($!)
why() { { grep -hi "fatal" "$T"/slurm*.log; grep -hi "error" "$T"/slurm*.log; } 2>/dev/null | head -n 1; }
up=0
for _ in $(seq 60); do
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || fail "a Slurm daemon exited at start: $(why)"; done
    if sinfo -h -N -o "%t" 2>/dev/null | grep -qE "^idle"; then up=1; break; fi
    sleep 0.5
done
[ "$up" = 1 ] || fail "the node did not become idle within 30 s: $(why)"
echo "test_slurm: cluster up on 127.0.0.1:$ctl_port ($(sinfo -h -N -o '%N %c CPUs %t'))"

cat >"$T/tiny.json" <<'SUITE'
{"name": "slurm-tiny", "model": "default", "seed": 3, "round_chunk": 64,
 "methods": [{"name": "full"}, {"name": "streamingllm"}, {"name": "snapkv", "opts": {"window": 8}}],
 "budgets": ["50%"],
 "benchmarks": [{"type": "2stage", "samples": 3, "min_pairs": 6, "max_pairs": 9, "max_new_tokens": 8},
                {"type": "niah", "lengths": [300], "depths": [0, 100], "max_new_tokens": 8}]}
SUITE
sub=$(KVB_BIN=$bin KVB_SWEEP_OUT=$T/sweep KVB_RUN_ARGS="--threads 1" bash "$src/scripts/slurm/sweep.sh" "$T/tiny.json" 4 --cpus-per-task=1 2>&1) ||
    fail "sweep.sh failed: $(echo "$sub" | tail -n 1)"
echo "$sub" | sed 's/^/test_slurm: /'
line=$(echo "$sub" | grep '^KVB_SWEEP ')
array=$(echo "$line" | sed -n 's/.*array=\([0-9]*\).*/\1/p') merge=$(echo "$line" | sed -n 's/.*merge=\([0-9]*\).*/\1/p')
[ -n "$array" ] && [ -n "$merge" ] || fail "sweep.sh printed no job ids"

# the unsharded reference, run here while the cluster works (one core each)
"$bin" run "$T/tiny.json" --out "$T/unsharded" --threads 1 --quiet >/dev/null 2>"$T/unsharded.err" ||
    fail "unsharded run failed: $(tail -n 1 "$T/unsharded.err")"

state=""
for _ in $(seq 540); do
    state=$(scontrol show job "$merge" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
    case $state in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY) break ;; esac
    sleep 1
done
echo "test_slurm: array job $array: $(scontrol -o show job "$array" 2>/dev/null | sed -n 's/.*ArrayJobId=\([0-9]*\) ArrayTaskId=\([0-9]*\).*JobState=\([A-Z_]*\).*/\1_\2=\3/p' | tr '\n' ' ')"
for i in 0 1 2 3; do
    [ -f "$T/sweep/shard-$i/results.jsonl" ] && echo "test_slurm: shard $i: $(wc -l <"$T/sweep/shard-$i/results.jsonl") records"
done
echo "test_slurm: merge job $merge: ${state:-unknown}"
[ "$state" = COMPLETED ] || fail "merge job $merge ended ${state:-without a state within 540 s}: $(tail -n 1 "$T/sweep/logs/merge.out" 2>/dev/null)$(why)"
grep '^merged' "$T/sweep/logs/merge.out" | sed 's/^/test_slurm: /'

# provenance in every shard's run.json and in the merged one
for i in 0 1 2 3; do
    for k in '"shard":[[:space:]]*"'$i'/4"' '"git_commit":' '"git_dirty":' '"model_sha256":' '"build_flags":' '"backend":[[:space:]]*"cpu"' '"device":' '"host":'; do
        grep -Eq "$k" "$T/sweep/shard-$i/run.json" || fail "shard $i run.json lacks $k"
    done
done
grep -q '"merged_from":' "$T/sweep/merged/run.json" || fail "merged run.json lacks merged_from"
[ "$(grep -Ec '"shard":[[:space:]]*"[0-3]/4"' "$T/sweep/merged/run.json")" = 4 ] || fail "merged run.json does not list the 4 shards"

# merged == unsharded: same records but timings (merge refuses any other difference), same summary
"$bin" merge "$T/check" "$T/unsharded" "$T/sweep/merged" >/dev/null 2>"$T/check.err" ||
    fail "merged and unsharded records differ: $(tail -n 1 "$T/check.err")"
n_un=$(wc -l <"$T/unsharded/results.jsonl") n_me=$(wc -l <"$T/sweep/merged/results.jsonl") n_ch=$(wc -l <"$T/check/results.jsonl")
[ "$n_un" = "$n_me" ] && [ "$n_me" = "$n_ch" ] && [ "$n_un" -gt 0 ] || fail "record counts: unsharded $n_un, merged $n_me, both $n_ch"
cut -d, -f1-11,14- "$T/unsharded/summary.csv" >"$T/a.csv"
cut -d, -f1-11,14- "$T/sweep/merged/summary.csv" >"$T/b.csv"
cmp -s "$T/a.csv" "$T/b.csv" || fail "summary.csv (scores, KV) of merged and unsharded differ: $(diff "$T/a.csv" "$T/b.csv" | head -n 2 | tr '\n' ' ')"
echo "test_slurm: merged == unsharded: $n_me records, summary.csv equal but timings; wall $(($(date +%s) - t0)) s"
echo "test_slurm: PASS"
