#!/usr/bin/env bash
# gpu-check.sh — validate kvbench on a GPU box: build the CUDA targets, run every CUDA test and the GPU
# benchmarks, and write logs and tables into OUTDIR (summary.md lists each step and its result, then the issue's
# must-shows read from the logs by scripts/gpu_verdict.py: PASS, FAIL or NOT RUN each).
#
#   scripts/gpu-check.sh OUTDIR                 build into build-gpu (needs the apt packages of setup.sh, nvcc)
#   scripts/gpu-check.sh --bin DIR OUTDIR       use binaries already built in DIR (e.g. an unpacked bundle)
#   scripts/gpu-check.sh --bundle FILE.tar.xz   build here for x86-64-v3 + sm_90 and pack the CUDA binaries with
#                                               the shared libraries they need, for a GPU box without dev packages
#   scripts/gpu-check.sh --check-bundle FILE    each bundled binary starts in a chroot holding only the bundle and
#                                               what a CUDA box has (glibc, C++ runtime, cuBLAS), empty environment
#   scripts/gpu-check.sh --plan                 the four groups of steps (KVB_GPU_GROUP=1..4), each one call,
#                                               with each step's measured seconds
#
# A lent GPU box gives about 10 minutes a command, 64 MiB uploaded, no network and no dev packages: build the
# bundle here, then on the box `scripts/gpu-window.sh BUNDLE OUT` (one call: docs/gpu.md has the commands used).
#
# Environment:
#   KVB_GPU_STEPS       the steps below to run, in the order given (most wanted first; default all, in this order)
#   KVB_GPU_DEADLINE    seconds for all steps together (default 540); a step that would start with under 30 s left
#                       is not run, and steps not run count as not passed
#   KVB_STEP_TIMEOUT    seconds one step may take (default 540; always within the deadline)
#   KVB_GPU_PACK        FILE.tgz: OUTDIR re-packed there (summary.md beside it) after every step
#   KVB_GPU_DRY=1       no GPU: every step's command resolved and written to its log, its program checked
#   KVB_GPU_NEW         the candidate kernel set of the *-new, methods-8b and omnikv-128k steps and of the second
#                       test_cuda_model (default "none": the defaults, and no second test_cuda_model; e.g.
#                       "KVB_ATTN_KERNEL=5" for FlashInfer)
#   KVB_SYNTH_CTX       contexts of the synthetic step (default 32768); KVB_SYNTH_CTX_NEW those of synthetic-new
#   KVB_METHODS_8B      methods of methods-8b (default all; H2O, ObservedAttention and FINCH score the prefill with
#                       attention_colsum since 2026-11-27, untimed: their own list); lists split by ';' run as
#                       separate benches, each its own log; KVB_METHODS_8B_BUDGETS
#                       its budgets (default "30% 2048")
#   KVB_MODEL_DIR       the default model's folder (an unpacked bundle's bin/model: its 4-layer copy, for
#                       test_cuda_model; the bench steps then use the model's shapes, synthetic:smollm2-135m)
#   KVB_NCU_GEMV        the GEMV versions ncu-decode profiles (default "1 4 6")
#   KVB_PEER_PYTHON     the python3 with torch + transformers for the PyTorch peer (default python3)
#
# Steps (each one row of summary.md, its log beside it):
#   tests             test_cuda_ops, test_backend_ops, test_cuda_model (every op and method, CPU vs CUDA, each method
#                     with its own prefill and adopting a shared one as bench and run do), test_cuda_model again on
#                     the candidate set, test_layer_prefill on CUDA (every layer-local method ended layer by layer),
#                     test_obs_window on CUDA (every method with its observation window stopped after the prefill)
#                     test_host_waits on CUDA (every method's host waits in a decode step)
#   bench-attention   decode attention v1-v4, Llama-3-8B shapes, batch 1 and 8, 8K-128K, vs copy and SDPA; then
#                     again with v4's candidate L2 prefetch 1 and 2 tiles ahead (KVB_ATTN_PREFETCH)
#   sanitize          compute-sanitizer racecheck and synccheck on a small bench-attention
#   ncu               DRAM throughput (% of peak) under Nsight Compute: the attention kernels and the decode
#                     GEMVs (KVB_NCU_GEMV: v1, v4, v6); decode attention v4's detailed sections
#   ncu-decode        a decode step's kernels on the 8B shapes under Nsight Compute: GEMVs by shape (v1, v4, v6), attention
#   ncu-prefill       the tensor-core prefill attention and the prefill GEMMs under Nsight Compute (one launch each)
#   ncu-decode-all    every kernel of two decode steps (2K context) under Nsight Compute, summed by kernel
#   ncu-prefill-layer every kernel of two layers of a prefill chunk under Nsight Compute, summed by kernel and grid
#   graph             the candidate CUDA graph (KVB_CUDA_GRAPH=1): test_cuda_model and test_host_waits through it, then
#                     the default model (or its shapes) at 512-8000 tokens without it and with it (+ PyTorch)
#   model             the default model (or its shapes), CUDA, 512-8000 tokens, beside PyTorch
#   methods           every method on the default model (or its shapes) at 8000 tokens, 30%
#   methods-profile   the same with --profile: each decode step by phase, the share outside attention and matmuls
#   loads             Round Attention's and OmniKV's packed host->device loads vs the pinned copy rate
#   synthetic         synthetic:llama3.1-8b full attention at KVB_SYNTH_CTX: TTFT, ms/token, byte bound, PyTorch
#   synthetic-new     the same on the candidate set at KVB_SYNTH_CTX_NEW
#   synthetic-qwen3   synthetic:qwen3-8b (Q/K head norms) the same way, beside PyTorch's Qwen3
#   flashinfer-engine FlashInfer (attention kernel 5) on the engine's KV cache, the per-layer slab it lays out:
#                     test_cuda_model on kernel 5, then synthetic:llama3.1-8b full at 32K on v4 and on kernel 5
#                     (each log ends with FlashInfer's served and refused calls)
#   gemv-8b           synthetic:llama3.1-8b full at 32K on GEMV v5 (the default) and on the candidate v6 with 2, 4
#                     and 8 warps a row (KVB_GEMV6_WARPS), one call
#   synthetic-profile the candidate set at 32K with --profile (prefill and decode by phase), no peer
#   synthetic-batch   the candidate set at 32K with prefill chunks of 2048 and 8192 tokens (--batch; default 512)
#   methods-8b        every method on synthetic:llama3-8b at 32K, on the candidate set
#   methods-8b-profile the same at 30% with --profile: each decode step by phase, the share outside attention and GEMVs
#   omnikv-profile    OmniKV (2048 tokens, no offload) against full at 32K with --profile: the decode step by phase
#   omnikv-128k       OmniKV (2048 tokens, no offload) against full on synthetic:llama3.1-8b at 128K
#   nsys              a decode timeline (where nsys exists)
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

# what a GPU box runs: the CLI and the tests of the CUDA paths (test_layer_prefill: the layer-wise end of prefill
# against the end of prefill; test_obs_window: every method decoding with its window stopped as with it kept; both
# on the backend KVB_BACKEND names)
gpu_bins="kvbench test_cuda_ops test_cuda_model test_backend_ops test_layer_prefill test_obs_window test_host_waits"
build_gpu() { # $1 = build dir, extra cmake args after
    local dir=$1; shift
    cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DKVB_CUDA=on "$@" >/dev/null || return 1
    cmake --build "$dir" -j"$(nproc)" --target $gpu_bins >/dev/null || {
        cmake --build "$dir" -j1 --target $gpu_bins 2>&1 | grep -E "error" | head -20
        return 1
    }
}

if [ "${1:-}" = "--bundle" ]; then
    out=${2:?usage: gpu-check.sh --bundle FILE.tar.xz}
    # patchelf sets the bundled binaries' rpath: installed first (as root), so a missing one costs no build
    if ! command -v patchelf >/dev/null && [ "$(id -u)" = 0 ]; then
        echo "gpu-check: installing patchelf (the bundle's rpaths)" >&2
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq patchelf; } >/dev/null 2>&1
    fi
    command -v patchelf >/dev/null || { echo "gpu-check: --bundle needs patchelf (apt-get install patchelf)" >&2; exit 1; }
    # the gguf package trims the default model for the bundle (scripts/trim-gguf.py), pinned
    if ! python3 -c "import gguf" 2>/dev/null; then
        echo "gpu-check: installing gguf==0.17.1 from PyPI (scripts/trim-gguf.py)" >&2
        python3 -m pip install -q gguf==0.17.1 >/dev/null 2>&1 ||
            { echo "gpu-check: --bundle needs the gguf package (python3 -m pip install gguf==0.17.1)" >&2; exit 1; }
    fi
    build_gpu build-gpu-bundle -DKVB_MARCH=x86-64-v3 -DCMAKE_CUDA_ARCHITECTURES="90-real;80-virtual" || exit 1
    stage=$(mktemp -d)
    mkdir -p "$stage/bin/lib" "$stage/bin/model"
    for b in $gpu_bins; do
        strip -o "$stage/bin/$b" "build-gpu-bundle/$b"
        # DT_RPATH (not RUNPATH): the bundled libraries' own dependencies are found there too, and nothing
        # leaks into LD_LIBRARY_PATH (the PyTorch peer the binaries start keeps the box's own libraries)
        patchelf --force-rpath --set-rpath '$ORIGIN/lib' "$stage/bin/$b"
    done
    # every shared library but glibc's own, the C++ runtime, the driver and cuBLAS (500+ MB: the box's CUDA or
    # PyTorch has it; the run finds it); the CUDA runtime travels (0.7 MB)
    ldd build-gpu-bundle/kvbench build-gpu-bundle/test_cuda_model | awk '/=> \//{print $3}' | sort -u |
        grep -Ev '/(libc|libm|libdl|librt|libpthread|libresolv|ld-linux[^/]*|libgcc_s|libstdc\+\+|libcuda|libcublas[A-Za-z]*)\.so' |
        while read -r lib; do cp -L "$lib" "$stage/bin/lib/"; done
    # the default model (98 MB) cannot travel (64 MiB a call): its first 4 layers, same tokenizer and formats,
    # give test_cuda_model a real Q4_1/Q8_0 GGUF (KVB_MODEL_DIR=bin/model)
    m=${KVB_MODEL_DIR:-$HOME/.cache/kvbench/models}/SmolLM2-135M-Instruct.Q4_1.gguf
    if [ -r "$m" ]; then
        python3 scripts/trim-gguf.py "$m" "$stage/bin/model/SmolLM2-135M-Instruct.Q4_1.gguf" 4 --embd-q4_1 || exit 1
    else
        echo "gpu-check: no default model at $m: the bundle has none (test_cuda_model will be skipped)" >&2
    fi
    mkdir -p "$(dirname "$out")" || exit 1
    tar -C "$stage" -cf - bin | xz -T0 -6 >"$out" || exit 1
    rm -rf "$stage"
    echo "gpu-check: bundle $out ($(du -h "$out" | cut -f1)): unpack it and run scripts/gpu-check.sh --bin DIR/bin OUTDIR"
    exit 0
fi

# --check-bundle FILE: does every binary of the bundle start on a box that has only what the bundle leaves out?
# A root holding nothing but the bundle, the dynamic loader, glibc, the C++ runtime and cuBLAS (what a CUDA box
# has) is chrooted into with an empty loader path; each binary must start (no GPU there: the tests' one-line skip).
if [ "${1:-}" = "--check-bundle" ]; then
    b=${2:?usage: gpu-check.sh --check-bundle FILE.tar.xz}
    [ "$(id -u)" = 0 ] || { echo "gpu-check: --check-bundle needs root (chroot)" >&2; exit 1; }
    r=$(mktemp -d)
    trap 'umount "$r/proc" 2>/dev/null; rm -rf "$r"' EXIT
    xz -dc "$b" | tar -C "$r" -xf - || { echo "gpu-check: cannot unpack $b" >&2; exit 1; }
    mkdir -p "$r/lib64" "$r/lib/x86_64-linux-gnu" "$r/tmp"
    box=$(ldd "$r/bin/kvbench" "$r/bin/test_cuda_ops" | awk '/=> \//{print $3}' | sort -u |
        grep -E '/(libc|libm|libdl|librt|libpthread|libresolv|ld-linux[^/]*|libgcc_s|libstdc\+\+|libcublas[A-Za-z]*)\.so')
    for l in $box; do cp -L "$l" "$r/lib/x86_64-linux-gnu/"; done # the loader's default path: no ld.so.cache needed
    cp -L /lib64/ld-linux-x86-64.so.2 "$r/lib64/"  # the binaries' interpreter
    # /proc as on any box: the loader reads /proc/self/exe to expand the binaries' $ORIGIN rpath
    mkdir -p "$r/proc" && mount -t proc proc "$r/proc" || { echo "gpu-check: cannot mount /proc in the root" >&2; exit 1; }
    echo "bundle $b: $(du -h "$b" | cut -f1) packed, $(du -sh "$r/bin" | cut -f1) unpacked"
    echo "the box's part, copied into the root's /lib/x86_64-linux-gnu: $(cd "$r/lib/x86_64-linux-gnu" && ls | tr '\n' ' ')"
    echo "files of the bundle:"
    (cd "$r" && find bin -type f | sort | sed 's/^/  /')
    fails=0
    for exe in $gpu_bins; do
        args=""; [ $exe = kvbench ] && args=--version
        out=$(env -i "$(command -v chroot)" "$r" "/bin/$exe" $args 2>&1 | tail -1)
        case "$out" in *"error while loading"* | *"not found"* | *"No such file"* | "") echo "  $exe: FAILED: $out"; fails=$((fails + 1)) ;;
        *) echo "  $exe (empty environment, chroot): $out" ;; esac
    done
    exit $((fails > 0))
fi

# Seconds each step took on the H200 of 2026-11-26 (docs/gpu.md; `~` = estimated: not run there, or changed since:
# `tests` gained the adopted path and test_layer_prefill, and bench --method prefills once for all its methods, so
# omnikv-128k and methods-8b no longer prefill once per method), and the four groups of steps, each sized to one call
# (<= 480 s with a 20% margin). A lease of 15 device minutes holds group 1, the machine's start and group 2 on the warm
# machine (~370 + ~463 s: tight, so the second call may cut group 2 at its deadline), the rest in later leases.
declare -A est=([tests]=~165 [bench-attention]=~30 [sanitize]=32 [ncu]=~55 [model]=35 [methods]=16 [methods-profile]=15
    [loads]=4 [synthetic]=~30 [synthetic-new]=~131 [synthetic-profile]=9 [synthetic-batch]=18 [methods-8b]=~215 [methods-8b-profile]=~60 [omnikv-128k]=~100
    [ncu-decode]=~65 [ncu-prefill]=24 [synthetic-qwen3]=~140 [nsys]=~20 [ncu-prefill-layer]=~30 [omnikv-profile]=~30 [ncu-decode-all]=~40
    [flashinfer-engine]=121 [gemv-8b]=~45 [graph]=~65)
# group 1: correctness first (the 2026-11-27 run: test_cuda_ops 121 s, its float64 references on one core, now on
# every core; test_cuda_model 103 s, most of it the CPU side, run once and read back from KVB_CPU_REF_DIR by the second
# run, the candidate KIVI kernel), decode attention against the copy and SDPA, the candidate CUDA graph (every method
# through it, then the default model's decode with and without it), the 8B decode on GEMV v5 and v6, the packed loads;
# group 2: every method
# on the 8B shapes (three lists: the third, Compactor and KVzip, outlasted 120 s on 2026-11-27), the 8B model at
# 32K-128K beside PyTorch, and every kernel of two 8B decode steps (what the 2 ms outside attention and the GEMVs are);
# groups 3 and 4: FlashInfer on the engine, Qwen3, OmniKV at 128K, compute-sanitizer, where the time goes (ncu,
# profiles)
groups=("tests bench-attention graph gemv-8b loads"
    "methods-8b synthetic-new ncu-decode-all"
    "flashinfer-engine synthetic-qwen3 omnikv-128k sanitize"
    "ncu ncu-decode ncu-prefill ncu-prefill-layer methods methods-profile methods-8b-profile model synthetic-profile synthetic synthetic-batch omnikv-profile")
# each group's variables (space-separated NAME=VALUE): groups 1 and 2 test and time KIVI's attention v2
group_env=("KVB_GPU_NEW=KVB_QUANT_KERNEL=2"
    "KVB_GPU_NEW=KVB_QUANT_KERNEL=2 KVB_SYNTH_CTX_NEW=32768,65536,131072 KVB_METHODS_8B=streamingllm,snapkv,omnikv,round,pod,random,pyramidkv,tova,knorm,adakv,quest,kivi,keydiff;expected,chunkkv,cur,lagkv,criticalkv,finch,cake,think,decoding;compactor,kvzip;h2o,observed KVB_METHODS_8B_BUDGETS=30%"
    ""
    "KVB_METHODS_8B=streamingllm,snapkv,omnikv,round,pod,random,pyramidkv,tova,knorm,adakv,quest,kivi,keydiff")
if [ "${1:-}" = "--plan" ]; then
    echo "gpu-check plan: seconds per step as measured on an NVIDIA H200 on 2026-11-26 and -27 (docs/gpu.md), ~ = estimated;"
    echo "a group's estimate is its steps' sum plus 20%, each at most 480 s (one call: KVB_GPU_GROUP=N)"
    total=0
    for ((g = 1; g <= ${#groups[@]}; g++)); do
        sum=0
        for st in ${groups[g - 1]}; do sum=$((sum + ${est[$st]#\~})); done
        sum=$((sum * 12 / 10)); total=$((total + sum))
        echo
        echo "group $g: ~$sum s${group_env[g - 1]:+ (with ${group_env[g - 1]})}"
        for st in ${groups[g - 1]}; do printf '  %-18s %5s s\n' "$st" "${est[$st]}"; done
    done
    echo
    echo "total: ~$total s ($((total / 60)) min), plus each call's machine start"
    exit 0
fi
if [ -n "${KVB_GPU_GROUP:-}" ]; then
    if [[ "$KVB_GPU_GROUP" =~ ^[1-9]$ ]] && [ "$KVB_GPU_GROUP" -le ${#groups[@]} ]; then
        KVB_GPU_STEPS=${groups[KVB_GPU_GROUP - 1]}
        for kv in ${group_env[KVB_GPU_GROUP - 1]}; do export "${kv?}"; done
    else
        echo "gpu-check: KVB_GPU_GROUP must be 1 to ${#groups[@]} (see --plan)" >&2; exit 2
    fi
fi

bin=""
if [ "${1:-}" = "--bin" ]; then
    bin=$(cd "${2:?usage: gpu-check.sh --bin DIR OUTDIR}" && pwd)
    shift 2
fi
outdir=${1:?usage: gpu-check.sh [--bin DIR] OUTDIR}
mkdir -p "$outdir"
outdir=$(cd "$outdir" && pwd)
summary=$outdir/summary.md
steps=${KVB_GPU_STEPS:-${groups[*]} nsys}
# the candidate kernels, off by default until a run like this one has validated and timed them (KVB_GPU_NEW names
# the set, e.g. "KVB_ATTN_KERNEL=5"; none, the default since prefill v2 became the default on 2026-11-27: every
# candidate has been timed, and the *-new steps run the defaults)
read -r -a new_set <<<"${KVB_GPU_NEW:-none}"
new_kernels=(env "${new_set[@]}")
[ "${new_set[*]}" = none ] && new_kernels=(env) # none: the defaults everywhere, no second test_cuda_model
step_timeout=${KVB_STEP_TIMEOUT:-540}
deadline=${KVB_GPU_DEADLINE:-540} # seconds from the start for all steps together (a lent GPU: 600 s a command)
synth_ctx=${KVB_SYNTH_CTX:-32768}
synth_ctx_new=${KVB_SYNTH_CTX_NEW:-$synth_ctx}
budgets_8b=${KVB_METHODS_8B_BUDGETS:-30% 2048}
methods_8b=${KVB_METHODS_8B:-all}
# the method parameters calibration would give a real model, pinned: synthetic weights have nothing to calibrate
pins=(--method-opt round:lw=8 --method-opt pod:block=3)
# Llama-3.1-8B's shapes with room for 128K prompt tokens plus the decode steps (its own context is 131072)
synth8b="synthetic:llama3.1-8b?ctx=131200"

dry=${KVB_GPU_DRY:-0} # 1: no GPU needed; every step's command is resolved and written to its log, not run
if [ "$dry" != 1 ] && { ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; }; then
    echo "gpu-check: no NVIDIA GPU visible (nvidia-smi failed); nothing to check" | tee "$summary"
    exit 1
fi
if [ -z "$bin" ]; then
    echo "gpu-check: building build-gpu ..."
    build_gpu build-gpu || { echo "gpu-check: build failed" | tee "$summary"; exit 1; }
    bin=$root/build-gpu
fi
if ldd "$bin/kvbench" 2>/dev/null | grep -q "not found"; then # cuBLAS: PyTorch's wheels first, then the box's CUDA
    for l in $(ldd "$bin/kvbench" | awk '/not found/{print $1}'); do
        d=$(find /opt /usr/local/lib /usr/lib /usr/local/cuda*/lib* /usr/local/cuda*/targets/*/lib -name "$l" 2>/dev/null | head -1)
        [ -n "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$(dirname "$d")"
    done
    ldd "$bin/kvbench" | grep "not found" && { echo "gpu-check: libraries missing (above)" | tee "$summary"; exit 1; }
    echo "gpu-check: LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
fi
[ -d "$bin/model" ] && [ -z "${KVB_MODEL_DIR:-}" ] && export KVB_MODEL_DIR=$bin/model
export KVB_SOURCE_DIR=$root KVB_BIN=$bin/kvbench
# test_cuda_model's CPU runs (most of its time) are written here by its first run and read back by the next ones (the
# candidate kernels, FlashInfer), in this call or a later one on the same machine: each file is named by a sha256 of
# the test binary, the model, the method and the prompt, so nothing from another build is read. Outside OUTDIR: 1.3 GB.
export KVB_CPU_REF_DIR=${KVB_CPU_REF_DIR:-${TMPDIR:-/tmp}/kvbench-cpu-ref}
[ "$dry" = 1 ] || mkdir -p "$KVB_CPU_REF_DIR"
model_dir=${KVB_MODEL_DIR:-$HOME/.cache/kvbench/models}
have_model=0
[ -r "$model_dir/SmolLM2-135M-Instruct.Q4_1.gguf" ] && have_model=1
# the bench steps of the default model: the model itself where it is here whole (30 layers), else its shapes as a
# synthetic model (f16 random weights: the same work per token, no GGUF to upload)
small=()
if [ $have_model = 0 ] || [ "$(stat -c %s "$model_dir/SmolLM2-135M-Instruct.Q4_1.gguf")" -lt 90000000 ]; then
    small=(--model "synthetic:smollm2-135m?ctx=8400")
fi

{
    echo "# kvbench gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/GPU: /'
    echo "binaries: $bin"
    echo
    echo "| step | result | seconds | log |"
    echo "|---|---|---:|---|"
} >"$summary"

fails=0 skips=0
# KVB_GPU_PACK=FILE.tgz: after every step the whole OUTDIR is packed there (with summary.md beside it), so a call
# killed at its limit still returns what it measured, in two files
pack() {
    [ -n "${KVB_GPU_PACK:-}" ] || return 0
    tar -C "$(dirname "$outdir")" -czf "$KVB_GPU_PACK.tmp" "$(basename "$outdir")" && mv "$KVB_GPU_PACK.tmp" "$KVB_GPU_PACK"
    cp "$summary" "$(dirname "$KVB_GPU_PACK")/summary.md" 2>/dev/null || true
}
step() { # name, log file, command...
    local name=$1 log=$2; shift 2
    local t0=$SECONDS rc left=$((deadline - SECONDS)) lim=$step_timeout
    if [ $left -lt 30 ]; then
        skips=$((skips + 1))
        echo "| $name | NOT RUN: the deadline (KVB_GPU_DEADLINE=$deadline s) | - | - |" >>"$summary"
        echo "gpu-check: $name: not run, deadline"; return
    fi
    [ $lim -gt $((left - 10)) ] && lim=$((left - 10))
    echo "gpu-check: $name ... (at most $lim s)"
    if [ "$dry" = 1 ]; then # the command as it would run; its program must exist
        printf '%q ' timeout -k 10 "$lim" "$@" >"$outdir/$log"; echo >>"$outdir/$log"
        local prog=$1; [ "$prog" = env ] && { shift; while [[ $1 == *=* ]]; do shift; done; prog=$1; set -- "$@"; }
        command -v "$prog" >/dev/null 2>&1 || [ -x "$prog" ]; rc=$?
        [ $rc -eq 0 ] || echo "gpu-check: dry: $prog not found" | tee -a "$outdir/$log"
    else
        timeout -k 10 "$lim" "$@" >"$outdir/$log" 2>&1
        rc=$?
    fi
    [ $rc -eq 124 ] && echo "gpu-check: $name: stopped after $lim s" >>"$outdir/$log"
    local res=pass
    [ $rc -eq 0 ] || { res="FAIL (exit $rc)"; fails=$((fails + 1)); }
    echo "| $name | $res | $((SECONDS - t0)) | $log |" >>"$summary"
    echo "gpu-check: $name: $res ($((SECONDS - t0)) s)"
    pack
}
skip() { skips=$((skips + 1)); echo "| $1 | NOT RUN: $2 | - | - |" >>"$summary"; echo "gpu-check: $1 not run: $2"; }

step_tests() {
    step "test_cuda_ops (every op incl. attention paths vs float64)" cuda_ops.log "$bin/test_cuda_ops"
    step "test_backend_ops (the methods' data ops, CPU and CUDA, vs exact/float64)" backend_ops.log "$bin/test_backend_ops"
    [ "${new_set[*]}" != none ] && step "test_backend_ops, candidate kernels ${new_set[*]}" backend_ops_new.log \
        "${new_kernels[@]}" "$bin/test_backend_ops"
    if [ $have_model = 1 ]; then
        step "test_cuda_model (every method, CPU vs CUDA greedy)" cuda_model.log "$bin/test_cuda_model"
        if [ "${new_set[*]}" != none ]; then
            step "test_cuda_model, candidate kernels ${new_set[*]}" cuda_model_new.log \
                "${new_kernels[@]}" "$bin/test_cuda_model"
        fi
    else
        skip test_cuda_model "default model not in $model_dir"
    fi
    # on a seeded 16-layer model (written by the test), and on the default model only where it is here whole: the
    # bundle's 4-layer copy has too few layers for OmniKV's configurations there
    local whole=$model_dir
    [ ${#small[@]} -gt 0 ] && whole=$outdir/no-model
    step "test_layer_prefill on CUDA (layer-wise end of prefill = the end of prefill, every layer-local method)" \
        layer_prefill_cuda.log env KVB_BACKEND=cuda KVB_MODEL_DIR="$whole" "$bin/test_layer_prefill"
    step "test_obs_window on CUDA (every method: the window stopped after the prefill decodes as with it kept)" \
        obs_window_cuda.log env KVB_BACKEND=cuda "$bin/test_obs_window"
    step "test_host_waits on CUDA (every method: one wait a decode step, for its logits, unless its table says why)" \
        host_waits_cuda.log env KVB_BACKEND=cuda "$bin/test_host_waits"
}
step_graph() {
    # the candidate CUDA graph (kernels/cuda/graph.cu, KVB_CUDA_GRAPH=1): every method decoding through it against
    # the CPU (test_cuda_model reads the tests step's CPU runs back) and still waiting once a step; then the default
    # model's shapes decoding without it and with it, one call, no --profile (its phases wait: no graph then)
    if [ $have_model = 1 ]; then
        step "test_cuda_model, decode steps as CUDA graphs (KVB_CUDA_GRAPH=1)" cuda_model_graph.log \
            env KVB_CUDA_GRAPH=1 "$bin/test_cuda_model"
    else
        skip "test_cuda_model, CUDA graphs" "default model not in $model_dir"
    fi
    step "test_host_waits on CUDA, decode steps as CUDA graphs" host_waits_graph.log \
        env KVB_BACKEND=cuda KVB_CUDA_GRAPH=1 "$bin/test_host_waits"
    step "bench default model on CUDA, no graphs (KVB_CUDA_GRAPH=0)" bench_graph0.md "$bin/kvbench" bench --backend cuda \
        "${small[@]}" --contexts 512,2048,8000 -n 64 --reps 2 --no-peer --cuda-kernels graph=0
    step "bench default model on CUDA, decode steps as CUDA graphs (+ PyTorch, same shapes)" bench_graph1.md \
        "$bin/kvbench" bench --backend cuda "${small[@]}" --contexts 512,2048,8000 -n 64 --reps 2 --cuda-kernels graph=1
}
step_bench_attention() {
    step "bench-attention (Llama-3-8B shapes, 8K-128K)" bench_attention.md "$bin/kvbench" bench-attention \
        --csv "$outdir/bench_attention.csv"
    # v4's candidate L2 prefetch, 1 and 2 tiles ahead (the same kernels otherwise; its rows against this call's copy
    # rate, and each kernel's float64 check again): the default run's rows are the comparison
    for pf in 1 2; do
        step "bench-attention, v4 prefetching $pf tiles ahead (KVB_ATTN_PREFETCH=$pf)" "bench_attention_pf$pf.md" \
            env KVB_ATTN_PREFETCH=$pf "$bin/kvbench" bench-attention --torch off --csv "$outdir/bench_attention_pf$pf.csv"
    done
}
step_sanitize() {
    if command -v compute-sanitizer >/dev/null 2>&1; then
        for tool in racecheck synccheck; do
            step "compute-sanitizer --tool $tool: bench-attention 4K (v1, v2 checked against float64)" "sanitize_$tool.log" \
                compute-sanitizer --tool "$tool" --error-exitcode 9 "$bin/kvbench" bench-attention --ctx 4096 --batch 1,2 \
                --iters 1 --torch off
        done
    else
        skip sanitize "compute-sanitizer not on PATH"
    fi
}
step_ncu() {
    if command -v ncu >/dev/null 2>&1; then
        step "ncu: attention kernels' DRAM throughput (32K, 128K; batch 1, 8)" ncu.log bash -c '
            ncu --clock-control none --kernel-name regex:k_attn --csv --page raw \
                --metrics dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,gpu__time_duration.sum \
                "$1" bench-attention --ctx 32768,131072 --batch 1,8 --iters 1 --torch off >"$2/ncu.csv" || exit 1
            python3 "$3/scripts/ncu_summary.py" "$2/ncu.csv"' _ "$bin/kvbench" "$outdir" "$root"
        # the default decode kernel in detail, so a low % comes back with its cause: throughput, memory chart,
        # occupancy and its limiters, launch shape, where the warps stall
        step "ncu: decode attention v4 in detail (32K; batch 1, 8)" ncu_detail.log ncu --clock-control none \
            --kernel-name regex:k_attn_dec_tc --launch-count 2 --section SpeedOfLight --section MemoryWorkloadAnalysis \
            --section Occupancy --section LaunchStats --section WarpStateStats \
            "$bin/kvbench" bench-attention --ctx 32768 --batch 1,8 --iters 1 --torch off
        for gv in ${KVB_NCU_GEMV:-1 4 6}; do
            step "ncu: decode GEMVs, kernel v$gv (default model's shapes, 2048 tokens)" "ncu_gemv$gv.log" bash -c '
                KVB_GEMV_KERNEL=$4 ncu --clock-control none --kernel-name regex:k_gemv --launch-count 400 --csv \
                    --page raw --metrics dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,gpu__time_duration.sum \
                    "$1" bench --backend cuda "${@:5}" --contexts 2048 -n 4 --no-peer >"$2/ncu_gemv$4.csv" || exit 1
                python3 "$3/scripts/ncu_summary.py" "$2/ncu_gemv$4.csv"' _ "$bin/kvbench" "$outdir" "$root" "$gv" "${small[@]}"
        done
    else
        skip ncu "ncu not on PATH"
    fi
}
step_ncu_decode() { # a decode step's kernels on the 8B shapes at 32K, each alone: the GEMVs by shape (v1, v4, v6), the
    # attention and its merge (the sum of their times against the step's wall time is the rest: small ops, launches)
    if command -v ncu >/dev/null 2>&1; then
        local syn=(bench --backend cuda --model "synthetic:llama3-8b?ctx=33000" --contexts 32768 --batch 8192 -n 2 --no-peer)
        local metrics=dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,gpu__time_duration.sum,launch__grid_size
        for gv in ${KVB_NCU_GEMV:-1 4 6}; do
            step "ncu: decode GEMVs v$gv by shape, 8B shapes, 32K (two steps)" "ncu_decode_gemv$gv.log" bash -c '
                KVB_GEMV_KERNEL=$4 ncu --clock-control none --kernel-name regex:k_gemv --launch-count 258 --csv --page raw \
                    --metrics "$5" "$1" "${@:6}" >"$2/ncu_decode_gemv$4.csv" || exit 1
                python3 "$3/scripts/ncu_summary.py" --by-grid "$2/ncu_decode_gemv$4.csv"' _ "$bin/kvbench" "$outdir" "$root" \
                "$gv" "$metrics" "${syn[@]}"
        done
        step "ncu: decode attention (default kernel) and merge, 8B shapes, 32K (two steps)" ncu_decode_attn.log bash -c '
            ncu --clock-control none --kernel-name regex:"k_attn_dec|k_attn_merge|k_attn_tile" --launch-count 128 --csv \
                --page raw --metrics "$4" "$1" "${@:5}" >"$2/ncu_decode_attn.csv" || exit 1
            python3 "$3/scripts/ncu_summary.py" --by-grid "$2/ncu_decode_attn.csv"' _ "$bin/kvbench" "$outdir" "$root" \
            "$metrics" "${syn[@]}"
    else
        skip ncu-decode "ncu not on PATH"
    fi
}
step_ncu_prefill() { # where TTFT goes: the tensor-core prefill attention and the prefill GEMMs, one launch each
    if command -v ncu >/dev/null 2>&1; then
        step "ncu: prefill attention (tensor cores) in detail, 8B shapes, a chunk at ~16K" ncu_prefill.log \
            "${new_kernels[@]}" ncu --clock-control none --kernel-name regex:k_attn_prefill_tc --launch-skip 1000 --launch-count 1 \
            --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
            --section ComputeWorkloadAnalysis "$bin/kvbench" bench --backend cuda \
            --model "synthetic:llama3-8b?ctx=33000" --contexts 32768 -n 1 --no-peer
        step "ncu: prefill GEMMs (cuBLAS), 8B shapes, chunks of 512" ncu_prefill_gemm.log ncu --clock-control none \
            --kernel-name regex:'nvjet|gemm|xmma|cutlass' --launch-skip 64 --launch-count 8 --section SpeedOfLight \
            "$bin/kvbench" bench --backend cuda --model "synthetic:llama3-8b?ctx=8400" --contexts 8192 -n 1 --no-peer
    else
        skip ncu-prefill "ncu not on PATH"
    fi
}
step_ncu_prefill_layer() { # every kernel of two layers of one prefill chunk, by time: where the MLP phase's time goes
    if command -v ncu >/dev/null 2>&1; then
        step "ncu: every kernel of two prefill layers (8B shapes, a 512-token chunk at ~5K), by time" ncu_prefill_layer.log \
            bash -c '"${@:4}" ncu --clock-control none --launch-skip 7000 --launch-count 44 --csv --page raw \
                --metrics gpu__time_duration.sum,launch__grid_size,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum \
                "$1" bench --backend cuda --model "synthetic:llama3-8b?ctx=8400" --contexts 8192 -n 1 --no-peer \
                >"$2/ncu_prefill_layer.csv" || exit 1
            python3 "$3/scripts/ncu_summary.py" --by-grid "$2/ncu_prefill_layer.csv"' _ "$bin/kvbench" "$outdir" "$root" \
            "${new_kernels[@]}"
    else
        skip ncu-prefill-layer "ncu not on PATH"
    fi
}
step_ncu_decode_all() { # every kernel of two decode steps (8B shapes, 2K context), by time: what a step spends on the
    # small kernels (norms, RoPE, KV writes, adds, SwiGLU) against the GEMVs and attention; the step's wall time less
    # their sum is the launch gaps
    if command -v ncu >/dev/null 2>&1; then
        step "ncu: every kernel of two decode steps (8B shapes, 2K context), by time" ncu_decode_all.log \
            bash -c '"${@:4}" ncu --clock-control none --launch-skip 3000 --launch-count 1000 --csv --page raw \
                --metrics gpu__time_duration.sum,launch__grid_size \
                "$1" bench --backend cuda --model "synthetic:llama3-8b?ctx=2200" --contexts 2048 -n 8 --no-peer \
                >"$2/ncu_decode_all.csv" || exit 1
            python3 "$3/scripts/ncu_summary.py" "$2/ncu_decode_all.csv"' _ "$bin/kvbench" "$outdir" "$root" \
            "${new_kernels[@]}"
    else
        skip ncu-decode-all "ncu not on PATH"
    fi
}
step_omnikv_profile() { # OmniKV's decode step by phase beside full's, 8B shapes at 32K (omnikv-128k's cost, cheaper)
    step "synthetic:llama3.1-8b, 32K, omnikv 2048 vs full, --profile, candidate kernels" bench_omnikv_profile.md \
        "${new_kernels[@]}" "$bin/kvbench" bench --backend cuda --model "$synth8b" --method omnikv --budget 2048 \
        --ctx-len 32768 -n 16 --profile --method-opt "omnikv:layers=2;8;18" --method-opt omnikv:offload=0
}
step_model() {
    # best of 2: the profiled repetition (phases wait for the device) is not the one kept
    step "bench default model on CUDA (+ PyTorch, same shapes)" bench_model_cuda.md "$bin/kvbench" bench --backend cuda \
        "${small[@]}" --contexts 512,2048,8000 -n 64 --reps 2 --profile
}
step_methods() {
    step "bench --method all on CUDA (8000 tokens, 30%)" bench_methods_cuda.md "$bin/kvbench" bench --backend cuda \
        "${small[@]}" --method all --budget 30% --ctx-len 8000 -n 32 "${pins[@]}" --method-opt "omnikv:layers=2;8;17"
}
step_methods_profile() {
    step "bench --method all --profile on CUDA (each step by phase: the share outside attention and matmuls)" \
        bench_methods_profile_cuda.md "$bin/kvbench" bench --backend cuda "${small[@]}" --method all --budget 30% \
        --ctx-len 8000 -n 16 --profile "${pins[@]}" --method-opt "omnikv:layers=2;8;17"
}
step_loads() {
    step "packed loads: round + omnikv (offload) on CUDA, 8000 tokens" bench_loads_cuda.md "$bin/kvbench" bench \
        --backend cuda "${small[@]}" --method round,omnikv --budget 30% --ctx-len 8000 -n 8 --profile "${pins[@]}" \
        --method-opt "omnikv:layers=2;8;17" --method-opt omnikv:offload=1
}
step_synthetic() {
    step "synthetic:llama3.1-8b full, ctx $synth_ctx (+ PyTorch)" bench_synth.md "$bin/kvbench" bench --backend cuda \
        --model "$synth8b" --contexts "$synth_ctx" -n 16
}
step_synthetic_new() {
    step "synthetic:llama3.1-8b full, ctx $synth_ctx_new, candidate kernels ${new_set[*]} (+ PyTorch)" bench_synth_new.md \
        "${new_kernels[@]}" "$bin/kvbench" bench --backend cuda --model "$synth8b" --contexts "$synth_ctx_new" -n 16
}
step_synthetic_qwen3() { # the issue's second 8B model, its real architecture (Q/K head norms), beside PyTorch's Qwen3
    step "synthetic:qwen3-8b full, ctx $synth_ctx_new, candidate kernels ${new_set[*]} (+ PyTorch)" bench_synth_qwen3.md \
        "${new_kernels[@]}" "$bin/kvbench" bench --backend cuda --model "synthetic:qwen3-8b?ctx=131200" \
        --contexts "$synth_ctx_new" -n 16
}
step_flashinfer_engine() { # kernel 5 on the engine's cache: with it chosen the KV store lays each layer out as one
    # slab (engine/kvcache.h), which FlashInfer reads in place; every method against the CPU on it, then full
    # attention at 32K on v4 and on FlashInfer (stderr, in the logs: FlashInfer's served and refused calls, by reason)
    if [ $have_model = 1 ]; then
        step "test_cuda_model, attention kernel 5 (FlashInfer on the KV store's slab)" cuda_model_fi.log \
            env KVB_ATTN_KERNEL=5 "$bin/test_cuda_model"
    else
        skip "test_cuda_model, attention kernel 5" "default model not in $model_dir"
    fi
    for kern in 4 5; do
        step "synthetic:llama3.1-8b full, 32K, attention kernel $kern (5: FlashInfer on the slab)" \
            "bench_synth_attn$kern.md" env KVB_ATTN_KERNEL=$kern "$bin/kvbench" bench --backend cuda --model "$synth8b" \
            --contexts 32768 -n 16 --no-peer
    done
}
step_gemv_8b() { # the decode GEMV candidate end to end: full attention at 32K on the default GEMV (v5) and on v6 with
    # 2, 4 and 8 warps a row, in one call on the same GPU, so the decode rates and byte-bound shares compare
    step "synthetic:llama3.1-8b full, 32K, GEMV v5" bench_synth_gemv5.md env KVB_GEMV_KERNEL=5 \
        "$bin/kvbench" bench --backend cuda --model "$synth8b" --contexts 32768 -n 16 --no-peer
    for w in 2 4 8; do
        step "synthetic:llama3.1-8b full, 32K, GEMV v6, $w warps a row" "bench_synth_gemv6w$w.md" \
            env KVB_GEMV_KERNEL=6 KVB_GEMV6_WARPS=$w "$bin/kvbench" bench --backend cuda --model "$synth8b" \
            --contexts 32768 -n 16 --no-peer
    done
}
step_synthetic_batch() { # TTFT by prefill chunk: 64 chunks of 512 tokens at 32K run GEMMs of N = 512
    for b in 2048 8192; do
        step "synthetic:llama3.1-8b full, 32K, candidate kernels, prefill chunks of $b (--batch $b)" \
            "bench_synth_batch$b.md" "${new_kernels[@]}" "$bin/kvbench" bench --backend cuda --model "$synth8b" \
            --contexts 32768 -n 8 --batch "$b" --no-peer
    done
}
step_synthetic_profile() {
    step "synthetic:llama3.1-8b full, 32K, candidate kernels, --profile (prefill and decode by phase)" \
        bench_synth_profile.md "${new_kernels[@]}" "$bin/kvbench" bench --backend cuda --model "$synth8b" \
        --contexts 32768 -n 8 --profile --no-peer
}
step_methods_8b() { # KVB_METHODS_8B may hold several lists split by ';': each its own bench and log (_1, _2, ...),
    # so a method that outlasts the step's time loses only its own list's table
    local lists list i
    IFS=';' read -r -a lists <<<"$methods_8b"
    for budget in $budgets_8b; do
        i=0
        for list in "${lists[@]}"; do
            local log="bench_methods_8b_${budget%\%}.md"
            [ ${#lists[@]} -gt 1 ] && { i=$((i + 1)); log="bench_methods_8b_${budget%\%}_$i.md"; }
            step "synthetic:llama3-8b, 32K, methods $list, budget $budget, candidate kernels" "$log" \
                "${new_kernels[@]}" "$bin/kvbench" bench --backend cuda --model "synthetic:llama3-8b?ctx=33000" \
                --method "$list" --budget "$budget" --ctx-len 32768 -n 16 "${pins[@]}" --method-opt "omnikv:layers=2;8;18"
        done
    done
}
step_methods_8b_profile() { # the same methods at 30% with --profile: each decode step by phase, the share outside
    # attention and the matmuls (each phase waits for the device, so its ms/token are not methods-8b's)
    step "synthetic:llama3-8b, 32K, methods $methods_8b, 30%, --profile, candidate kernels" bench_methods_8b_profile.md \
        "${new_kernels[@]}" "$bin/kvbench" bench --backend cuda --model "synthetic:llama3-8b?ctx=33000" --method "$methods_8b" \
        --budget 30% --ctx-len 32768 -n 8 --profile "${pins[@]}" --method-opt "omnikv:layers=2;8;18"
}
step_omnikv_128k() {
    step "synthetic:llama3.1-8b, 128K, omnikv 2048 (no offload) vs full, candidate kernels" bench_omnikv_128k.md \
        "${new_kernels[@]}" "$bin/kvbench" bench \
        --backend cuda --model "$synth8b" --method omnikv --budget 2048 --ctx-len 131072 -n 16 \
        --method-opt "omnikv:layers=2;8;18" --method-opt omnikv:offload=0
}
step_nsys() {
    if command -v nsys >/dev/null 2>&1 && [ $have_model = 1 ]; then
        step "nsys timeline (decode, default model)" nsys.log bash scripts/nsys-profile "$outdir/nsys" \
            "$bin/kvbench" bench --backend cuda --contexts 2048 -n 4 --no-peer
    else
        skip "nsys timeline" "nsys not on PATH or no default model"
    fi
}
for s in $steps; do # in the order given: the most wanted first, so a deadline cuts the least wanted
    if declare -F "step_${s//-/_}" >/dev/null; then "step_${s//-/_}"; else skip "$s" "no such step"; fi
done
echo >>"$summary"
echo "failed steps: $fails; steps not run: $skips" >>"$summary"
echo >>"$summary"
python3 "$root/scripts/gpu_verdict.py" "$outdir" >>"$summary" 2>&1 # the issue's must-shows, read from these logs
pack
echo "gpu-check: $fails failed step(s), $skips not run; summary in $summary"
[ $fails -eq 0 ] && [ $skips -eq 0 ]
