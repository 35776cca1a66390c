#!/usr/bin/env bash
# The README's first command: install what is missing (apt packages, the default model), build, calibrate
# the default model for Round Attention and PoD (once; a profile keyed by the model's sha256; OmniKV's
# default layers need none), and run the main job: the quick suite (configs/quick.json) — every KV-cache
# method at 30% beside full attention on a needle-in-a-haystack grid and the LongBench/LongMemEval tasks
# whose data is present. It resumes if interrupted, writes runs/quick/{results.jsonl,summary.csv,report.md,
# *.svg} and prints the main table. Calibration tables and curves go to build/calibration/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
model=${KVB_MODEL_DIR:-$HOME/.cache/kvbench/models}/SmolLM2-135M-Instruct.Q4_1.gguf
profile=${KVB_PROFILE_DIR:-$HOME/.cache/kvbench/profiles}/$(sha256sum "$model" | cut -d' ' -f1).json
for kind in round pod; do
    grep -q "\"$kind\"" "$profile" 2>/dev/null || build/kvbench calibrate "$kind" --out-dir build/calibration
done
build/kvbench run configs/quick.json "$@"
