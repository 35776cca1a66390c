#!/usr/bin/env bash
# The README's first command: install what is missing (apt packages, the default model), build, calibrate
# the default model for Round Attention, OmniKV and PoD (once; a profile keyed by the model's sha256), and
# run the main job: the quick suite (configs/quick.json) — every KV-cache method at 30% beside full attention
# on 2StageRetr, a needle-in-a-haystack grid, multi-round recall and the LongBench tasks whose data is
# present. It resumes if interrupted, writes runs/quick/{results.jsonl,summary.csv,report.md,*.svg} and
# prints the main table.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
model=${KVB_MODEL_DIR:-$HOME/.cache/kvbench/models}/SmolLM2-135M-Instruct.Q4_1.gguf
profile=${KVB_PROFILE_DIR:-$HOME/.cache/kvbench/profiles}/$(sha256sum "$model" | cut -d' ' -f1).json
for kind in round omnikv pod; do
    grep -q "\"$kind\"" "$profile" 2>/dev/null || build/kvbench calibrate "$kind" --out-dir build/calibration
done
build/kvbench run configs/quick.json "$@"
