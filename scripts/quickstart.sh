#!/usr/bin/env bash
# The README's first command: install what is missing (apt packages, the default model), build, and run the
# main job: the quick suite (configs/quick.json) — every KV-cache method at 30% beside full attention on
# 2StageRetr, a needle-in-a-haystack grid, multi-round recall and the LongBench tasks whose data is present.
# It resumes if interrupted, writes runs/quick/{results.jsonl,summary.csv,report.md,*.svg} and prints the
# main table.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
build/kvbench run configs/quick.json "$@"
