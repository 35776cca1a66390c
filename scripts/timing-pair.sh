#!/usr/bin/env bash
# timing-pair.sh — one command for issue 32's "run against bench": full attention's and SnapKV's decode ms/token as
# `kvbench run` times them (a one-method suite each: the median over NIAH samples) and as `kvbench bench --method
# snapkv` times them (its full and SnapKV rows: the median over REPEATS invocations), back to back, at the same
# context, thread count and number of decode steps, with run / bench and whether it is within 3%.
#
#   bash scripts/timing-pair.sh
#   B=build THREADS=2 LEN=8000 SAMPLES=5 NEW=20 REPEATS=3 BUDGET=30% MODEL=default bash scripts/timing-pair.sh
#
# Both paths decode through the engine session (engine/session.c) on a context holding the prompt and its answer
# from the start (kv_reserve), without phase timing (run's phases need --profile). The suite's samples stop at
# their end token after 21-32 tokens on the default model, so NEW (20) is below that: every sample generates NEW
# tokens, NEW - 1 of which go through the model, and bench is given that many steps (-n), so the two time the same
# steps. Run it on a quiet machine (timings under load are not comparable); it takes about 20 minutes on 2 threads
# (SAMPLES + 2 x REPEATS prefills of LEN tokens).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${B:-build}
THREADS=${THREADS:-2}
LEN=${LEN:-8000}
SAMPLES=${SAMPLES:-5}
NEW=${NEW:-20}
REPEATS=${REPEATS:-3}
BUDGET=${BUDGET:-30%}
MODEL=${MODEL:-default}
[ -x "$B/kvbench" ] || { echo "timing-pair: $B/kvbench not found (B= names the build folder)" >&2; exit 1; }
tmp=$(mktemp -d /tmp/kvb_timing.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
depths=$(python3 -c "n = $SAMPLES; print(', '.join(str(round(100 * i / max(n - 1, 1))) for i in range(n)))")

for m in full snapkv; do
    cat > "$tmp/$m.json" <<EOT
{"name": "timing-$m", "model": "$MODEL", "seed": 1, "methods": [{"name": "$m"}], "budgets": ["$BUDGET"],
 "benchmarks": [{"type": "niah", "lengths": [$LEN], "depths": [$depths], "max_new_tokens": $NEW}]}
EOT
    echo "run $m: $SAMPLES NIAH samples of $LEN tokens, $THREADS threads ..." >&2
    "$B/kvbench" run "$tmp/$m.json" --out "$tmp/run-$m" --threads "$THREADS" --quiet > "$tmp/run-$m.log" 2>&1 ||
        { echo "timing-pair: kvbench run ($m) failed:" >&2; tail -3 "$tmp/run-$m.log" >&2; exit 1; }
done

# the prompt length and decode steps bench is given: the suite's (median over samples)
read -r P STEPS < <(python3 - "$tmp" "$NEW" <<'EOF'
import json, statistics, sys
tmp, new = sys.argv[1], int(sys.argv[2])
recs = [json.loads(l) for m in ("full", "snapkv") for l in open(f"{tmp}/run-{m}/results.jsonl")]
bad = [r for r in recs if r.get("error")]
if bad:
    sys.exit(f"timing-pair: {bad[0]['method']} {bad[0]['sample_id']}: {bad[0]['error']}")
# a sample that hit max_new_tokens forwarded all but its last token; one that stopped at its end token, all of them
steps = [r["generated_tokens"] - 1 if r["generated_tokens"] == new else r["generated_tokens"] for r in recs]
if len(set(steps)) > 1:
    print(f"timing-pair: decode steps differ between samples ({sorted(set(steps))}): bench gets their median; "
          f"lower NEW to make them equal", file=sys.stderr)
print(int(statistics.median(r["prompt_tokens"] for r in recs)), int(statistics.median(steps)))
EOF
)

for i in $(seq 1 "$REPEATS"); do
    echo "bench $i/$REPEATS: full and snapkv at $P tokens, $STEPS decode steps ..." >&2
    "$B/kvbench" bench --model "$MODEL" --method snapkv --budget "$BUDGET" --ctx-len "$P" -n "$STEPS" \
        --threads "$THREADS" --json "$tmp/bench-$i.json" > "$tmp/bench-$i.log" 2>&1 ||
        { echo "timing-pair: kvbench bench failed:" >&2; tail -3 "$tmp/bench-$i.log" >&2; exit 1; }
done

python3 - "$tmp" "$REPEATS" "$P" "$STEPS" "$THREADS" "$BUDGET" <<'EOF'
import json, statistics, sys
tmp, repeats, P, steps, threads, budget = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
print(f"\ndecode ms/token at {P} prompt tokens, {steps} decode steps, {threads} threads "
      f"(run: median over samples; bench: median over {repeats} invocations)\n")
print("| method | run | bench | run / bench | within 3% |")
print("|---|---:|---:|---:|---|")
for m in ("full", "snapkv"):
    run = [json.loads(l)["decode_ms_per_token"] for l in open(f"{tmp}/run-{m}/results.jsonl")]
    bench = [r["decode_ms_per_token"] for i in range(1, repeats + 1)
             for r in json.load(open(f"{tmp}/bench-{i}.json"))["methods"] if r["method"] == m]
    a, b = statistics.median(run), statistics.median(bench)
    ratio = a / b if b > 0 else float("nan")
    name = m if m == "full" else f"{m} {budget}"
    print(f"| {name} | {a:.3f} | {b:.3f} | {ratio:.3f} ({100 * (ratio - 1):+.1f}%) | {'yes' if abs(ratio - 1) <= 0.03 else 'no'} |")
    print(f"|   samples | {' '.join(f'{x:.2f}' for x in run)} | {' '.join(f'{x:.2f}' for x in bench)} | | |")
EOF
