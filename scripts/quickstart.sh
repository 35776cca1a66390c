#!/usr/bin/env bash
# The README's first command: install what is missing (apt packages, the default model), build, and run the
# main job: the quick suite (configs/quick.json) — every KV-cache method at 30% beside full attention on a
# needle-in-a-haystack grid and the LongBench/LongMemEval tasks whose data is present. `kvbench run`
# calibrates the model for Round Attention and PoD first when its profile lacks them (once; a profile keyed by
# the model's sha256; OmniKV's default layers need none). It resumes if interrupted, writes
# runs/quick/{results.jsonl,summary.csv,report.md,*.svg} and prints the main table; calibration tables and
# curves go to runs/quick/calibration/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
build/kvbench run configs/quick.json "$@"
