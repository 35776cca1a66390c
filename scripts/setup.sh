#!/usr/bin/env bash
# Install what is missing (Debian packages, the default model) and build kvbench.
#   scripts/setup.sh [--no-build] [--sanitize]
# --sanitize also builds build-asan/ (ASan + UBSan) for the test suite. Idempotent and quiet when
# there is nothing to do.
set -euo pipefail
cd "$(dirname "$0")/.."
build=1 sanitize=0
for a in "$@"; do
    case "$a" in
    --no-build) build=0 ;;
    --sanitize) sanitize=1 ;;
    -h | --help) sed -n '2,4p' "$0"; exit 0 ;;
    *) echo "setup: unknown option '$a'" >&2; exit 2 ;;
    esac
done

pkgs=(build-essential cmake pkg-config libcunit1-dev libpcre2-dev libopenblas-dev libcurl4-openssl-dev
      libcjson-dev libmicrohttpd-dev libssl-dev)
# python3 with pip fetches the model; a python3 from elsewhere (pyenv) is as good as Debian's
python3 -m pip --version >/dev/null 2>&1 || pkgs+=(python3 python3-pip)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}" >&2
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
    $SUDO apt-get update -qq >/dev/null || { echo "setup: apt-get update failed" >&2; exit 1; }
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null ||
        { echo "setup: apt-get install ${missing[*]} failed" >&2; exit 1; }
fi

bash scripts/fetch-model.sh

# FlashInfer's headers (attention kernel 5, cmake/flashinfer.cmake) when CUDA will be built: the pinned
# flashinfer-python wheel (pip download, sha256 checked; $KVB_FLASHINFER_WHEEL names a copy already here), of which
# only data/include/flashinfer and CCCL's libcu++ headers are kept, in $KVB_FLASHINFER_DIR. Without them the build
# goes on and kernel 5 falls back to kvbench's kernels, so a failure here is a warning (fatal with KVB_FLASHINFER=on).
fi_ver=0.7.2.post1
fi_sha=bfdc18b9e1e4d8d0730fe4343dc0e284cd0c160086de80f99888bc4867922d49
fi_dir=${KVB_FLASHINFER_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvbench/flashinfer-$fi_ver}
fetch_flashinfer() {
    local tmp wheel
    tmp=$(mktemp -d) || return 1
    wheel=${KVB_FLASHINFER_WHEEL:-}
    if [ -z "$wheel" ]; then
        echo "setup: downloading flashinfer-python $fi_ver (its headers, for the CUDA build)" >&2
        python3 -m pip download -q --no-deps --only-binary=:all: --dest "$tmp" "flashinfer-python==$fi_ver" >&2 ||
            { echo "setup: pip download flashinfer-python==$fi_ver failed" >&2; rm -rf "$tmp"; return 1; }
        wheel=$(ls "$tmp"/flashinfer_python-"$fi_ver"-*.whl)
    fi
    echo "$fi_sha  $wheel" | sha256sum -c --quiet - ||
        { echo "setup: $wheel is not the pinned flashinfer-python $fi_ver (sha256)" >&2; rm -rf "$tmp"; return 1; }
    python3 - "$wheel" "$tmp/x" <<'PY' || { echo "setup: extracting FlashInfer's headers failed" >&2; rm -rf "$tmp"; return 1; }
import sys, zipfile
keep = ("flashinfer/data/include/flashinfer/", "flashinfer/data/cccl/libcudacxx/include/", "flashinfer_python-")
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith(keep)])
PY
    cp "$tmp/x/flashinfer_python-$fi_ver.dist-info/licenses/LICENSE" "$tmp/x/flashinfer/data/LICENSE" 2>/dev/null || true
    mkdir -p "$(dirname "$fi_dir")" && rm -rf "$fi_dir.part" && mv "$tmp/x/flashinfer/data" "$fi_dir.part" &&
        mv "$fi_dir.part" "$fi_dir" || { echo "setup: cannot write $fi_dir" >&2; rm -rf "$tmp"; return 1; }
    rm -rf "$tmp"
    echo "setup: FlashInfer $fi_ver headers in $fi_dir" >&2
}
if { command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; } && [ "${KVB_FLASHINFER:-auto}" != off ] &&
    [ ! -f "$fi_dir/include/flashinfer/attention/decode.cuh" ]; then
    if ! fetch_flashinfer; then
        [ "${KVB_FLASHINFER:-auto}" = on ] && exit 1
        echo "setup: going on without FlashInfer: attention kernel 5 will fall back to kvbench's kernels" >&2
    fi
fi

[ "$build" = 1 ] || exit 0
jobs=$(nproc 2>/dev/null || echo 2)
if [ ! -f build/CMakeCache.txt ]; then
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DKVB_WERROR=ON >/dev/null
fi
# A first build takes minutes on 2 cores: show its progress without the compiler's lines (they go to DIR/build.log).
# On a terminal one line is rewritten in place; in a log, a line every 10%.
build_dir() {
    local dir=$1 log=$1/build.log show
    echo "setup: building $dir (compiler output in $log)" >&2
    if [ -t 2 ]; then
        show='/^\[ *[0-9]+%\]/ { printf "\rsetup: %-90.90s", $0; fflush() } END { printf "\n" }'
    else
        show='/^\[ *[0-9]+%\]/ { p = substr($0, 2, 3) + 0; if (p >= next_p) { print "setup: " $0; next_p = p - p % 10 + 10; fflush() } }'
    fi
    if ! cmake --build "$dir" -j"$jobs" 2>&1 | tee "$log" | awk "$show" >&2; then
        grep -E "error|warning" "$log" | head -20 >&2
        echo "setup: building $dir failed (whole output: $log)" >&2
        exit 1
    fi
}
build_dir build
if [ "$sanitize" = 1 ]; then
    if [ ! -f build-asan/CMakeCache.txt ]; then
        cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVB_SANITIZE=ON -DKVB_WERROR=ON -DKVB_CUDA=off >/dev/null
    fi
    build_dir build-asan
fi
