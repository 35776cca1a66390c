#!/usr/bin/env bash
# The README's second command: the whole test suite. Runs the idempotent setup first (packages, model,
# release build and ASan+UBSan build), then every CUnit suite in both builds (whole-model suites,
# labelled "slow", run in the release build only).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --sanitize || exit 1
# the second model, for its llama.cpp fixture test (test_model_llamacpp_qwen); fetched once into the model cache
bash scripts/fetch-model.sh qwen2.5-coder-0.5b || exit 1
# Gemma-3-270M, for test_model_llamacpp_gemma (253 MB)
bash scripts/fetch-model.sh gemma-3-270m || exit 1
# jieba's dictionary and HMM (6 MB, from its PyPI package), for test_jieba and LongBench's Chinese metrics
bash scripts/fetch-datasets.sh jieba >/dev/null || exit 1
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
jobs=$(nproc 2>/dev/null || echo 2)
rc=0
ctest --test-dir build --output-on-failure -j"$jobs" 2>&1 | tee build/ctest.log || rc=1
ctest --test-dir build-asan --output-on-failure -j"$jobs" -LE slow 2>&1 | tee build-asan/ctest.log || rc=1
# the fuzz harnesses (tests/fuzz), each for a bounded time under ASan + UBSan (skipped without clang)
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
