#!/usr/bin/env bash
# bench/kernels/ab_revs.sh: check and time git revisions of the CUDA kernels side by side in
# one GPU call. Each revision is exported (git archive; or a SOURCE given as a .tar of a
# tree, e.g. `git archive BRANCH > x.tar` made where the branch exists, or as a directory)
# and built on its own (the targets
# gpu_test_backend_ops and bench_train_gpu, all builds at once); then each runs the op
# harness's check on the cases that CHECK names, and the cases that PERF names are timed
# ROUNDS times, the revisions taking turns within a round (so that a clock drift falls on
# all of them alike). One summary line per revision and case; a revision whose check fails is
# reported as such, and its timings must not be used.
#
#   bench/kernels/ab_revs.sh WORK_DIR REV|SOURCE.tar|SOURCE_DIR [...]
#   CHECK="attn" PERF="attn bf16" ROUNDS=2 bench/kernels/ab_revs.sh /tmp/ab main attn-bwd-decouple
#
# TRAIN="bf16:mixtral8x7b-2L fp8-block:mixtral8x7b-2L" adds `RECIPE=r bench_train_gpu preset 5 1`
# for each revision (its RESULT line). Run from the checkout's root on the GPU machine, after
# `source .deps/env.sh` and `export CFLAGS="-isystem $PWD/.deps/root/usr/include"` (as
# bench/gpu_build.sh does). Exit status 1 when a build or a check failed.
set -uo pipefail
WORK=${1:?usage: ab_revs.sh WORK_DIR REV [REV ...]}
shift
[ $# -gt 0 ] || { echo "ab_revs.sh: name at least one revision" >&2; exit 2; }
CHECK=${CHECK-attn}
PERF=${PERF-attn bf16}
ROUNDS=${ROUNDS:-2}
mkdir -p "$WORK"
fail=0
tags=()
for rev in "$@"; do
    tag=$(basename "$rev" .tar | tr -c 'A-Za-z0-9_.\n-' '_')
    tags+=("$tag")
    src="$WORK/src-$tag"
    rm -rf "$src" && mkdir -p "$src"
    if [ -d "$rev" ]; then
        cp -r "$rev"/. "$src"
    elif [ -f "$rev" ]; then
        tar -xf "$rev" -C "$src" || { echo "ab_revs.sh: $rev is not a tar of a tree" >&2; exit 2; }
    else
        git archive "$rev" | tar -x -C "$src" || { echo "ab_revs.sh: no revision $rev" >&2; exit 2; }
    fi
    (cmake -S "$src" -B "$WORK/build-$tag" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_CUDA_ARCHITECTURES=90 > "$WORK/$tag.cmake.log" 2>&1 &&
        cmake --build "$WORK/build-$tag" -j"$(($(nproc) / $# + 1))" --target gpu_test_backend_ops \
            bench_train_gpu > "$WORK/$tag.build.log" 2>&1
        echo $? > "$WORK/$tag.build.rc") &
done
wait
for tag in "${tags[@]}"; do
    ops="$WORK/build-$tag/tests/gpu_test_backend_ops"
    if [ "$(cat "$WORK/$tag.build.rc")" != 0 ]; then
        echo "$tag: BUILD FAILED (see $WORK/$tag.build.log)"
        fail=1
    elif [ -n "$CHECK" ]; then
        if "$ops" --only "$CHECK" > "$WORK/$tag.check.log" 2>&1 &&
            ! grep -q '^skipped' "$WORK/$tag.check.log"; then
            echo "$tag: check ok ($(grep -o '[0-9]* cases, 0 failed, worst nmse [0-9.e+-]*' "$WORK/$tag.check.log"))"
        else
            echo "$tag: CHECK FAILED or skipped (see $WORK/$tag.check.log)"
            fail=1
        fi
    fi
done
if [ -n "$PERF" ]; then
    for r in $(seq 1 "$ROUNDS"); do
        for tag in "${tags[@]}"; do
            ops="$WORK/build-$tag/tests/gpu_test_backend_ops"
            [ -x "$ops" ] || continue
            "$ops" --perf --only "$PERF" 2>&1 | grep -E ' (fwd|bwd) ' | sed "s/^/$tag round $r:/"
        done
    done
fi
for job in ${TRAIN:-}; do
    for tag in "${tags[@]}"; do
        bin="$WORK/build-$tag/bench/bench_train_gpu"
        [ -x "$bin" ] || continue
        RECIPE=${job%%:*} "$bin" "${job#*:}" 5 1 2>&1 | grep '^RESULT' | sed "s/^/$tag: /"
    done
done
exit $fail
