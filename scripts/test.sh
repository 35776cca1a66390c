#!/usr/bin/env bash
# The README's second command: the whole test suite. Runs the idempotent setup first (packages, model,
# release build and ASan+UBSan build), then every CUnit suite in both builds (whole-model suites,
# labelled "slow", run in the release build only), then the fuzz harnesses.
#
# The fuzz harnesses' build (build-fuzz/) runs in the background at the lowest priority (nice 19) beside the release
# and ASan builds, taking the core they leave idle (the release build spends about 25 s on one nvcc with the other
# core idle); it is waited for before the fuzzing, and its output printed there. Nothing builds beside the tests:
# the ASan build beside the release tests slowed them more than it saved (CI run at 103d2aa: release tests 721 s,
# against 557 s with the builds done first).
set -uo pipefail
cd "$(dirname "$0")/.."
bg_log=$(mktemp -d)
trap 'rm -rf "$bg_log"' EXIT
# interrupted: the background builds stop too (each leads a process group of its own)
trap 'for f in "$bg_log"/*.pid; do [ -f "$f" ] && kill -- -"$(cat "$f")" 2>/dev/null; done; exit 130' INT TERM
# background STEP CMD...: CMD at nice 19, its output kept for finish STEP
background() {
    local step=$1
    shift
    setsid nice -n 19 "$@" > "$bg_log/$step" 2>&1 < /dev/null &
    echo $! > "$bg_log/$step.pid"
}
# finish STEP: wait for it and print its output; its exit status
finish() {
    local st=0
    wait "$(cat "$bg_log/$1.pid")" || st=$?
    rm -f "$bg_log/$1.pid"
    cat "$bg_log/$1"
    return $st
}
# packages, the default model and FlashInfer's headers first: every build needs them
bash scripts/setup.sh --no-build || exit 1
background fuzz-build bash scripts/fuzz.sh --build-only
bash scripts/setup.sh --sanitize || { finish fuzz-build; exit 1; } # the release build, then the ASan + UBSan build
# the second model, for its llama.cpp fixture test (test_model_llamacpp_qwen); fetched once into the model cache
bash scripts/fetch-model.sh qwen2.5-coder-0.5b || { finish fuzz-build; exit 1; }
# Gemma-3-270M, for test_model_llamacpp_gemma (253 MB)
bash scripts/fetch-model.sh gemma-3-270m || { finish fuzz-build; exit 1; }
# jieba's dictionary and HMM (6 MB, from its PyPI package), for test_jieba and LongBench's Chinese metrics
bash scripts/fetch-datasets.sh jieba >/dev/null || { finish fuzz-build; exit 1; }
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
jobs=$(nproc 2>/dev/null || echo 2)
rc=0
ctest --test-dir build --output-on-failure -j"$jobs" 2>&1 | tee build/ctest.log || rc=1
ctest --test-dir build-asan --output-on-failure -j"$jobs" -LE slow 2>&1 | tee build-asan/ctest.log || rc=1
# the fuzz harnesses (tests/fuzz), each for a bounded time under ASan + UBSan (skipped without clang); their build
# is up to date by now (or fails here again, with its message)
finish fuzz-build
bash scripts/fuzz.sh "${KVB_FUZZ_SECONDS:-12}" || rc=1
count() { grep -Eo "tests passed, [0-9]+ tests failed out of [0-9]+" "$1" | tail -n 1; }
p=0 f=0
for log in build/ctest.log build-asan/ctest.log; do
    line=$(count "$log")
    [ -n "$line" ] || { rc=1; continue; }
    failed=$(echo "$line" | awk '{print $3}')
    total=$(echo "$line" | awk '{print $NF}')
    p=$((p + total - failed)) f=$((f + failed))
done
[ "$f" -eq 0 ] || rc=1
echo "tests: $p passed, $f failed"
exit $rc
