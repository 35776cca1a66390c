#!/usr/bin/env bash
# gpu-window.sh BUNDLE OUT — one call on a lent GPU box (no dev packages, no network): unpack the bundle built
# here by `gpu-check.sh --bundle`, run gpu-check's steps in KVB_GPU_STEPS order (most wanted first) within
# KVB_GPU_DEADLINE seconds, and leave two files in OUT: results.tgz (every log and table, re-packed after each
# step, so a call killed at its limit returns what it measured) and summary.md.
set -uo pipefail
cd "$(dirname "$0")/.."
bundle=${1:?usage: gpu-window.sh BUNDLE OUT} out=${2:?usage: gpu-window.sh BUNDLE OUT}
w=$(mktemp -d /tmp/kvb-gpu.XXXXXX)
xz -dc "$bundle" | tar -C "$w" -xf - || { echo "gpu-window: cannot unpack $bundle" >&2; exit 1; }
mkdir -p "$out"
KVB_GPU_PACK=$out/results.tgz bash scripts/gpu-check.sh --bin "$w/bin" "$w/gpu-check"
rc=$?
cat "$w/gpu-check/summary.md"
exit $rc
