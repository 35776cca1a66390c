#!/usr/bin/env bash
# timing-pair.sh — the same decode timed by `kvbench run` (a one-method suite per method: median decode ms/token
# of 5 NIAH samples of ~8000 tokens) and by `kvbench bench --method snapkv` (full's row and SnapKV's) back to back,
# 2 threads, default model (docs/cpu-results.md, "run against bench"). B = the build folder (default build).
set -uo pipefail
cd "$(dirname "$0")/.."
B=${B:-build}
tmp=$(mktemp -d /tmp/kvb_timing.XXXXXX)
for m in full snapkv; do cat > $tmp/timing-$m.json <<EOT
{"name": "timing-$m", "model": "default", "output": "$tmp/timing-$m", "seed": 1,
 "methods": [{"name": "$m"}], "budgets": ["30%"],
 "benchmarks": [{"type": "niah", "lengths": [8000], "depths": [0, 25, 50, 75, 100], "max_new_tokens": 32}]}
EOT
rm -rf "$tmp/timing-$m"; $B/kvbench run $tmp/timing-$m.json --threads 2 --quiet > "$tmp/timing-$m.log" 2>&1 || { echo "run $m failed"; tail -3 "$tmp/timing-$m.log"; }; done
P=$(python3 -c "import json;print(json.loads(open('$tmp/timing-full/results.jsonl').readline())['prompt_tokens'])")
python3 -c "import json,statistics as s
for m in ('full','snapkv'):
    v=[json.loads(l)['decode_ms_per_token'] for l in open(f'$tmp/timing-{m}/results.jsonl')]
    print('run', m, 'median decode ms/token', round(s.median(v),3), 'of', len(v), 'samples', [round(x,2) for x in v])"
echo "prompt tokens $P"
$B/kvbench bench --method snapkv --budget 30% --ctx-len $P -n 32 --threads 2
