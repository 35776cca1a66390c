#!/usr/bin/env bash
# ggml_dots_check.sh LLAMA_CPP_DIR [--fixture tests/fixtures/ggml_dots.json] — compile llama.cpp's CPU quantization kernels (ggml-quants.c and the
# x86 ggml-cpu quants file) from a checkout, link them beside kvbench's kernels library, and check that
# kvbench's activation quantizers and dot products give the same bytes (scripts/ggml_dots_check.c).
# Builds like llama.cpp does: -std=gnu11 (so its `a += b * c` contract to fmas) and -march=native.
# --bench [ROWS COLS REPS] times the dots instead (one thread, kvbench beside llama.cpp).
# --fixture also writes llama.cpp's dots of seeded random blocks for tests/test_kquant.c. Exit 0 when every type
# matches. Needs ./build/libkvb_kernels.a (cmake --build build), or the one in
# $KVB_BUILD_DIR.
set -euo pipefail
src="${1:?usage: scripts/ggml_dots_check.sh LLAMA_CPP_DIR}/ggml/src"
root="$(cd "$(dirname "$0")/.." && pwd)"
cpu_quants="$src/ggml-cpu/ggml-cpu-quants.c"                      # llama.cpp up to mid 2025
[ -f "$cpu_quants" ] || cpu_quants="$src/ggml-cpu/arch/x86/quants.c" # later layout
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
inc=(-I"$src/../include" -I"$src" -I"$src/ggml-cpu")
cc=${CC:-gcc}
$cc -O2 -march=native -std=gnu11 -D_GNU_SOURCE "${inc[@]}" -c "$cpu_quants" -o "$tmp/cpu_quants.o"
$cc -O2 -std=gnu11 -D_GNU_SOURCE "${inc[@]}" -c "$src/ggml-quants.c" -o "$tmp/quants.o"
# the few ggml symbols those two files call: the f16 table the x86 kernels read, and error paths
cat > "$tmp/ggml_stubs.c" <<'C'
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <immintrin.h>
float ggml_table_f32_f16[1 << 16];
/* read only by the FP4 kernels of later llama.cpp (llama-cpp-python 0.3.36's copy), which are not checked */
float ggml_table_f32_e8m0_half[1 << 8], ggml_table_f32_ue4m3[1 << 8];
void ggml_abort(const char *file, int line, const char *fmt, ...) { (void)file, (void)line, (void)fmt; abort(); }
size_t ggml_row_size(int type, int64_t ne) { (void)type, (void)ne; abort(); }
size_t ggml_type_size(int type) { (void)type; abort(); }
__attribute__((constructor)) static void fill_table(void) {
    for (int i = 0; i < 1 << 16; i++) ggml_table_f32_f16[i] = _cvtsh_ss((unsigned short)i);
}
C
$cc -O2 -march=native -c "$tmp/ggml_stubs.c" -o "$tmp/ggml_stubs.o"
$cc -O2 -march=native -std=c11 -I"$root" "$root/scripts/ggml_dots_check.c" "$tmp/cpu_quants.o" "$tmp/quants.o" \
    "$tmp/ggml_stubs.o" "${KVB_BUILD_DIR:-$root/build}/libkvb_kernels.a" -lm -lpthread -o "$tmp/ggml_dots_check"
if [ "${2:-}" = --bench ]; then # the speed of the K-quant dots beside llama.cpp's (scripts/ggml_dots_bench.c)
    $cc -O3 -march=native -std=c11 -D_POSIX_C_SOURCE=200809L -I"$root" "$root/scripts/ggml_dots_bench.c" "$tmp/cpu_quants.o" \
        "$tmp/quants.o" "$tmp/ggml_stubs.o" "${KVB_BUILD_DIR:-$root/build}/libkvb_kernels.a" -lm -lpthread -o "$tmp/bench"
    exec "$tmp/bench" "${@:3}"
fi
"$tmp/ggml_dots_check" "${@:2}"
