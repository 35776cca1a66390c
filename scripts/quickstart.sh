#!/usr/bin/env bash
# The README's first command: install what is missing, build, and run the main job
# (for now: a short chat with the default model).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
build/kvbench generate --model default --chat -n 64 \
    --prompt "In two sentences: what is the KV cache in a transformer, and why does it grow with the context?"
