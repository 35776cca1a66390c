#!/usr/bin/env bash
# fetched_model_test.sh TEST_MODEL_LLAMACPP NAME FILE FIXTURE BOUND — test_model_llamacpp on a model that
# scripts/fetch-model.sh NAME puts in the model cache as FILE, against its llama.cpp fixture. scripts/test.sh fetches
# it, so in CI ($CI true or 1) a missing model fails; elsewhere the test is skipped with one line (exit 77, ctest's
# SKIP_RETURN_CODE). Run from the project root.
set -uo pipefail
bin=$1 name=$2 file=$3 fixture=$4 bound=$5
model=${KVB_MODEL_DIR:-$HOME/.cache/kvbench/models}/$file
if [ ! -f "$model" ]; then
    case "${CI:-}" in
    true | 1) echo "missing $model (CI: scripts/test.sh fetches it: scripts/fetch-model.sh $name)" >&2; exit 1 ;;
    *) echo "skipped: needs $model (scripts/fetch-model.sh $name)"; exit 77 ;;
    esac
fi
exec "$bin" "$name" "$fixture" "$bound"
