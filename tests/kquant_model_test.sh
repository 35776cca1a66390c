#!/usr/bin/env bash
# kquant_model_test.sh TEST_MODEL_LLAMACPP RECIPE FILE FIXTURE BOUND — test_model_llamacpp on a model requantized
# here (scripts/requantize.py RECIPE -> FILE in the model cache) against its llama.cpp fixture. The model is made
# when missing and llama-cpp-python is importable; otherwise the test is skipped with one line (exit 77, ctest's
# SKIP_RETURN_CODE): CI has no llama-cpp-python to make it. Run from the project root.
set -uo pipefail
bin=$1 recipe=$2 file=$3 fixture=$4 bound=$5
dir=${KVB_MODEL_DIR:-$HOME/.cache/kvbench/models}
model=$dir/$file
if [ ! -f "$model" ] && [ -f "$dir/Qwen2.5-Coder-0.5B-Instruct.gguf" ] && python3 -c 'import llama_cpp' 2>/dev/null; then
    python3 scripts/requantize.py "$recipe" || exit 1
fi
if [ ! -f "$model" ]; then
    echo "skipped: needs $model (python3 scripts/requantize.py $recipe, with llama-cpp-python)"
    exit 77
fi
exec "$bin" "$model" "$fixture" "$bound"
