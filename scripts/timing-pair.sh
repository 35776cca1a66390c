#!/usr/bin/env bash
# timing-pair.sh — one command for issue 32's "run against bench": full attention's and SnapKV's decode ms/token as
# `kvbench run` times them (a one-method suite each: NIAH samples) and as `kvbench bench --method snapkv` times them
# (its full and SnapKV rows), at the same context, thread count and number of decode steps, with run / bench and
# whether it is within 3%.
#
#   bash scripts/timing-pair.sh
#   B=build THREADS=2 LEN=8000 SAMPLES=3 NEW=128 ROUNDS=3 BUDGET=30% MODEL=default bash scripts/timing-pair.sh
#
# Both paths decode through the engine session (engine/session.c) on a context holding the prompt and its answer
# from the start (kv_reserve), without phase timing (run's phases need --profile). The suite's benchmark says
# "ignore_eos": true, so every sample generates exactly NEW tokens (NEW - 1 of them go through the model) and bench
# is given NEW - 1 steps (-n): the two time the same steps. The paths alternate ROUNDS times (run full, run snapkv,
# bench), so a drift of the machine's speed lands on both; the table compares the medians over every run sample and
# every bench invocation. Run it on a quiet machine (timings under load are not comparable): about
# ROUNDS x (2 SAMPLES + 2) prefills of LEN tokens.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${B:-build}
THREADS=${THREADS:-2}
LEN=${LEN:-8000}
SAMPLES=${SAMPLES:-3}
NEW=${NEW:-128}
ROUNDS=${ROUNDS:-3}
BUDGET=${BUDGET:-30%}
MODEL=${MODEL:-default}
[ -x "$B/kvbench" ] || { echo "timing-pair: $B/kvbench not found (B= names the build folder)" >&2; exit 1; }
tmp=$(mktemp -d /tmp/kvb_timing.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
depths=$(python3 -c "n = $SAMPLES; print(', '.join(str(round(100 * i / max(n - 1, 1))) for i in range(n)))")
STEPS=$((NEW - 1))

for m in full snapkv; do
    cat > "$tmp/$m.json" <<EOT
{"name": "timing-$m", "model": "$MODEL", "seed": 1, "methods": [{"name": "$m"}], "budgets": ["$BUDGET"],
 "benchmarks": [{"type": "niah", "lengths": [$LEN], "depths": [$depths], "max_new_tokens": $NEW, "ignore_eos": true}]}
EOT
done

P=""
for r in $(seq 1 "$ROUNDS"); do
    for m in full snapkv; do
        echo "round $r/$ROUNDS: run $m, $SAMPLES NIAH samples of $LEN tokens, $NEW tokens each, $THREADS threads ..." >&2
        "$B/kvbench" run "$tmp/$m.json" --out "$tmp/run-$m-$r" --threads "$THREADS" --quiet > "$tmp/run-$m-$r.log" 2>&1 ||
            { echo "timing-pair: kvbench run ($m) failed:" >&2; tail -3 "$tmp/run-$m-$r.log" >&2; exit 1; }
    done
    if [ -z "$P" ]; then # the prompt length bench is given: the suite's (median over samples)
        P=$(python3 - "$tmp" "$NEW" <<'EOF'
import json, statistics, sys
tmp, new = sys.argv[1], int(sys.argv[2])
recs = [json.loads(l) for m in ("full", "snapkv") for l in open(f"{tmp}/run-{m}-1/results.jsonl")]
bad = [r for r in recs if r.get("error")]
if bad:
    sys.exit(f"timing-pair: {bad[0]['method']} {bad[0]['sample_id']}: {bad[0]['error']}")
short = [r for r in recs if r["generated_tokens"] != new]
if short:
    sys.exit(f"timing-pair: {short[0]['method']} {short[0]['sample_id']} generated {short[0]['generated_tokens']} "
             f"tokens, not {new} (the suite's \"ignore_eos\" should make every sample generate NEW)")
print(int(statistics.median(r["prompt_tokens"] for r in recs)))
EOF
)
    fi
    echo "round $r/$ROUNDS: bench full and snapkv at $P tokens, $STEPS decode steps ..." >&2
    "$B/kvbench" bench --model "$MODEL" --method snapkv --budget "$BUDGET" --ctx-len "$P" -n "$STEPS" \
        --threads "$THREADS" --json "$tmp/bench-$r.json" > "$tmp/bench-$r.log" 2>&1 ||
        { echo "timing-pair: kvbench bench failed:" >&2; tail -3 "$tmp/bench-$r.log" >&2; exit 1; }
done

python3 - "$tmp" "$ROUNDS" "$P" "$STEPS" "$THREADS" "$BUDGET" <<'EOF'
import json, statistics, sys
tmp, rounds, P, steps, threads, budget = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
print(f"\ndecode ms/token at {P} prompt tokens, {steps} decode steps, {threads} threads "
      f"(medians: run over every sample of {rounds} rounds; bench over {rounds} invocations)\n")
print("| method | run | bench | run / bench | within 3% |")
print("|---|---:|---:|---:|---|")
for m in ("full", "snapkv"):
    run = [json.loads(l)["decode_ms_per_token"] for r in range(1, rounds + 1) for l in open(f"{tmp}/run-{m}-{r}/results.jsonl")]
    bench = [x["decode_ms_per_token"] for r in range(1, rounds + 1)
             for x in json.load(open(f"{tmp}/bench-{r}.json"))["methods"] if x["method"] == m]
    a, b = statistics.median(run), statistics.median(bench)
    ratio = a / b if b > 0 else float("nan")
    name = m if m == "full" else f"{m} {budget}"
    print(f"| {name} | {a:.3f} | {b:.3f} | {ratio:.3f} ({100 * (ratio - 1):+.1f}%) | {'yes' if abs(ratio - 1) <= 0.03 else 'no'} |")
    print(f"|   samples | {' '.join(f'{x:.2f}' for x in run)} | {' '.join(f'{x:.2f}' for x in bench)} | | |")
EOF
