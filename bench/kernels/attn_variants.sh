#!/usr/bin/env bash
# bench/kernels/attn_variants.sh: build the CUDA backend with flash-attention tile variants and,
# for each, check it against the CPU backend (gpu_test_backend_ops --only attn) and time it
# (--perf --only attn), printing one summary line per variant; the library default ("") is
# included when named as an empty argument.
#
#   bench/kernels/attn_variants.sh SRC_DIR WORK_DIR ["" "-DFA_BK=32 -DFA_MINB=3" ...]
#
# Needs a GPU and the same build prerequisites as the main build (on the lent H200s: source
# .deps/env.sh and export CFLAGS="-isystem $PWD/.deps/root/usr/include" first). The knobs are the -D macros at the top of kernels/attention_flash.cu:
# FA_BK (key rows per step, forward/dq), FA_BQ_KV (query rows per step, dk/dv), FA_MINB
# (minimum resident blocks per SM, caps registers); and of kernels/sm90/attention_wgmma.cu
# (the Hopper forward): FA3_NS (key/value stages), FA3_PINGPONG (0: no turn-taking); and of
# kernels/sm90/attention_wgmma_bwd.cu: FB_DQ_TURNS (0: dQ added in arrival order, not
# deterministic: what the turns cost). A variant that fails the check is reported as such and
# its timings must not be used.
set -uo pipefail
SRC=${1:?usage: attn_variants.sh SRC_DIR WORK_DIR [VARIANT_FLAGS ...]}
WORK=${2:?usage: attn_variants.sh SRC_DIR WORK_DIR [VARIANT_FLAGS ...]}
shift 2
variants=("$@")
[ ${#variants[@]} -gt 0 ] || variants=("" "-DFA_BK=32 -DFA_MINB=3")
mkdir -p "$WORK"
summary=()
for v in "${variants[@]}"; do
    tag=$(echo "default $v" | tr -c 'A-Za-z0-9=\n' '_' | sed 's/_*$//')
    bdir="$WORK/build-$tag"
    cmake -S "$SRC" -B "$bdir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
        "-DCMAKE_CUDA_FLAGS=$v" > "$bdir.cmake.log" 2>&1 &&
        cmake --build "$bdir" -j"$(nproc)" --target gpu_test_backend_ops > "$bdir.build.log" 2>&1 ||
        { summary+=("$tag: BUILD FAILED (see $bdir.build.log)"); continue; }
    if "$bdir/tests/gpu_test_backend_ops" --only attn > "$bdir.check.log" 2>&1; then
        verdict="check ok ($(grep -o 'worst nmse [0-9.e+-]*' "$bdir.check.log"))"
    else
        verdict="CHECK FAILED"
    fi
    perf=$("$bdir/tests/gpu_test_backend_ops" --perf --only attn 2>&1 | grep -E 'fwd|bwd' |
        awk '{printf "%s %s %s %s TFLOP/s; ", $6, $7, $8, $11}')
    summary+=("$tag: $verdict | $perf")
done
printf '%s\n' "${summary[@]}"
