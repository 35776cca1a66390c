#!/usr/bin/env bash
# Decode tok/s with 1 and 2 threads, idle and beside a competing 2-thread `kvbench generate` (a shared CI box,
# a second job on the same cores). With a pool that degrades gracefully, 2 threads beside the competitor stay
# at or above 1 thread.   scripts/bench-oversub.sh [KVBENCH_BINARY]   (default build/kvbench)
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build/kvbench}
P=tests/fixtures/prompts/prose_300.txt
run() { "$BIN" generate --model default --prompt-file $P -n 48 --ignore-eos --threads "$1" 2>&1 | grep -E "^decode" | sed -E 's/.*\(([0-9.]+) tok\/s.*/\1/'; }
echo "idle: 1 thread $(run 1) tok/s, 2 threads $(run 2) tok/s"
( while true; do "$BIN" generate --model default --prompt-file tests/fixtures/prompts/prose_4000.txt -n 8 --threads 2 >/dev/null 2>&1; done ) &
comp=$!
trap 'kill $comp 2>/dev/null; pkill -f "prose_4000.txt -n 8 --threads 2" 2>/dev/null' EXIT
sleep 3
for rep in 1 2; do echo "beside a 2-thread job: 1 thread $(run 1) tok/s, 2 threads $(run 2) tok/s"; done
