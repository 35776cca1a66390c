#!/usr/bin/env bash
# Build the libFuzzer harnesses of tests/fuzz (clang -O1, ASan + UBSan, in build-fuzz/) and run each for SECONDS
# (default 12, or $KVB_FUZZ_SECONDS) over a scratch copy of its seed corpus (tests/fuzz/corpus/<harness>,
# plus configs/*.json for the suite parser; the GGUF seeds come from tests/fuzz/gguf_seeds.py), so the repository is never written. Prints the executions per
# harness; exits 1 when a harness finds a crash, leak or sanitizer report (its input is kept as
# build-fuzz/crash-<harness>-*, replay it with build-fuzz/fuzz_<harness> FILE). Skipped without clang.
#   scripts/fuzz.sh            12 s per harness, one harness per core at a time (the CI step; build + runs are
#                              meant to stay near 2 minutes)
#   scripts/fuzz.sh 3600       an hour each; KVB_FUZZ_ONLY=gguf scripts/fuzz.sh 3600 for one harness
set -uo pipefail
cd "$(dirname "$0")/.."
secs=${1:-${KVB_FUZZ_SECONDS:-12}}
harnesses=${KVB_FUZZ_ONLY:-"gguf loaders suite serve_request judge_reply sse_stream"}
if ! command -v clang > /dev/null; then
    echo "fuzz: clang not found (apt-get install clang): skipped"
    exit 0
fi
t0=$(date +%s)
targets=$(for h in $harnesses; do printf 'fuzz_%s ' "$h"; done)
mkdir -p build-fuzz
CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DKVB_FUZZ=ON -DKVB_CUDA=off > build-fuzz/build.log 2>&1 &&
    cmake --build build-fuzz -j"$(nproc 2>/dev/null || echo 2)" --target $targets >> build-fuzz/build.log 2>&1 ||
    { tail -n 30 build-fuzz/build.log; echo "fuzz: build failed (build-fuzz/build.log)"; exit 1; }
echo "fuzz: built in $(( $(date +%s) - t0 )) s"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# one harness: its scratch corpus, its run, its line (in $work/<h>.line) and exit status (1: a finding)
fuzz_one() {
    local h=$1 log=build-fuzz/fuzz_$1.log failed=0 runs
    mkdir -p "$work/$h"
    # GGUF seeds are binary, so they are written here rather than kept in the repository
    if [ "$h" = gguf ]; then python3 tests/fuzz/gguf_seeds.py "$work/$h" || return 1; else cp tests/fuzz/corpus/"$h"/* "$work/$h/"; fi
    [ "$h" = suite ] && find configs -name '*.json' -exec cp {} "$work/$h/" \;
    if ! ./build-fuzz/fuzz_"$h" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix=build-fuzz/crash-"$h"- "$work/$h" > "$log" 2>&1; then
        failed=1
        tail -n 40 "$log" > "$work/$h.line"
    fi
    runs=$(grep -Eo 'Done [0-9]+ runs' "$log" | awk '{print $2}')
    echo "fuzz_$h: ${runs:-?} executions in ${secs} s$([ $failed -ne 0 ] && echo ' (FAILED, see '"$log"')')" >> "$work/$h.line"
    return $failed
}
# the harnesses side by side, one per core (each still gets its $secs of one core)
rc=0 running=0 cores=$(nproc 2>/dev/null || echo 2)
for h in $harnesses; do
    if [ "$running" -ge "$cores" ]; then wait -n || rc=1; running=$((running - 1)); fi
    fuzz_one "$h" &
    running=$((running + 1))
done
while [ "$running" -gt 0 ]; do wait -n || rc=1; running=$((running - 1)); done
for h in $harnesses; do cat "$work/$h.line" 2>/dev/null || { echo "fuzz_$h: did not run"; rc=1; }; done
echo "fuzz: $(( $(date +%s) - t0 )) s in all"
exit $rc
