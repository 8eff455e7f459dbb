#!/usr/bin/env bash
# bench/kernels/ab_revs.sh: check and time git revisions of the CUDA kernels side by side in
# one GPU call. Each revision is exported (git archive; or a SOURCE given as a .tar of a
# tree, e.g. `git archive BRANCH > x.tar` made where the branch exists, or as a directory)
# and built in turn in one source tree and one build tree (the targets gpu_test_backend_ops
# and bench_train_gpu): a revision's files are copied over the previous one's only where
# their contents differ, so ninja rebuilds only what the change touches (the first build
# is whole, each later one a few objects and the links), and its two binaries are kept in
# WORK_DIR/bin-TAG. Then each runs the op harness's check on the cases that CHECK names
# (substrings of case names, several separated by commas; one that matches no case fails),
# and the cases that PERF names (the same way) are timed ROUNDS times, the revisions taking turns within a
# round (so that a clock drift falls on all of them alike). One summary line per revision
# and case; a revision whose check fails is reported as such, and its timings must not be
# used.
#
#   bench/kernels/ab_revs.sh WORK_DIR REV|SOURCE.tar|SOURCE_DIR [...]
#   CHECK="attn" PERF="attn bf16" ROUNDS=2 bench/kernels/ab_revs.sh /tmp/ab main attn-bwd-decouple
#   CHECK="sum_squares,attn" PERF="sum_squares,attn bf16" ...
#
# FULL_CHECK=DIR then runs bench/gpu_check.sh (ctest -L gpu and memcheck; GPU_CHECK_J and
# GPU_CHECK_QUICK as there) on the last revision's tree, into DIR, reusing the A/B's build (the
# rest of the targets only: a session's start or end check without a build of its own).
# TRAIN="bf16:mixtral8x7b-2L fp8-block:mixtral8x7b-2L" adds `RECIPE=r bench_train_gpu preset 5 1`
# for each revision (its RESULT line); the bench's other settings come from the environment as
# for its own runs (e.g. MOMENTS=bf16 EXPERT_GRADS=bf16, which og2-8x1b's fp8-block run needs
# to fit: with the fp32 defaults it printed no RESULT on an H100, 2026-12-06). Run from the checkout's root on the GPU machine, after
# `source .deps/env.sh` and `export CFLAGS="-isystem $PWD/.deps/root/usr/include"` (as
# bench/gpu_build.sh does); CHECK="" PERF="" and no TRAIN only build (any machine with nvcc).
# Exit status 1 when a build or a check failed.
set -uo pipefail
WORK=${1:?usage: ab_revs.sh WORK_DIR REV [REV ...]}
root=$PWD
shift
[ $# -gt 0 ] || { echo "ab_revs.sh: name at least one revision" >&2; exit 2; }
CHECK=${CHECK-attn}
PERF=${PERF-attn bf16}
ROUNDS=${ROUNDS:-2}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
fail=0
tags=()
src="$WORK/src"
rm -rf "$src" "$WORK/build" && mkdir -p "$src"
# copies the tree $1 over $src where a file's contents differ (a new mtime: ninja rebuilds
# what depends on it) and removes what $1 lacks; unchanged files keep their mtimes
sync_tree() {
    (cd "$1" && find . -type f) | while IFS= read -r f; do
        cmp -s "$1/$f" "$src/$f" || { mkdir -p "$(dirname "$src/$f")" && cp "$1/$f" "$src/$f"; }
    done
    (cd "$src" && find . -type f) | while IFS= read -r f; do
        [ -e "$1/$f" ] || rm -f "$src/$f"
    done
}
for rev in "$@"; do
    tag=$(basename "$rev" .tar | tr -c 'A-Za-z0-9_.\n-' '_')
    tags+=("$tag")
    stage="$WORK/stage"
    rm -rf "$stage" && mkdir -p "$stage"
    if [ -d "$rev" ]; then
        cp -r "$rev"/. "$stage"
    elif [ -f "$rev" ]; then
        tar -xf "$rev" -C "$stage" || { echo "ab_revs.sh: $rev is not a tar of a tree" >&2; exit 2; }
    else
        git archive "$rev" | tar -x -C "$stage" || { echo "ab_revs.sh: no revision $rev" >&2; exit 2; }
    fi
    sync_tree "$stage"
    rm -rf "$WORK/bin-$tag" && mkdir -p "$WORK/bin-$tag"
    start=$(date +%s)
    if { [ -f "$WORK/build/build.ninja" ] ||
        cmake -S "$src" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
            -DCMAKE_CUDA_ARCHITECTURES=90 > "$WORK/$tag.cmake.log" 2>&1; } &&
        cmake --build "$WORK/build" -j"$(nproc)" --target gpu_test_backend_ops bench_train_gpu \
            > "$WORK/$tag.build.log" 2>&1; then
        cp "$WORK/build/tests/gpu_test_backend_ops" "$WORK/build/bench/bench_train_gpu" \
            "$WORK/bin-$tag/"
        echo "$tag: built in $(($(date +%s) - start)) s"
    else
        echo "$tag: BUILD FAILED (see $WORK/$tag.build.log)"
        fail=1
    fi
done
rm -rf "$WORK/stage"
for tag in "${tags[@]}"; do
    ops="$WORK/bin-$tag/gpu_test_backend_ops"
    [ -x "$ops" ] || continue
    IFS=',' read -ra names <<< "$CHECK"
    for name in "${names[@]}"; do
        log="$WORK/$tag.check-${name// /_}.log"
        "$ops" --only "$name" > "$log" 2>&1
        st=$?
        if [ "$st" -eq 2 ] && grep -q "no compare case's name contains" "$log"; then
            echo "$tag: CHECK \"$name\" MATCHED NO CASE (compare-mode names differ from --perf ones: $log)"
            fail=1
        elif [ "$st" -eq 77 ] || grep -q '^skipped' "$log"; then
            echo "$tag: CHECK \"$name\" SKIPPED ($(grep -m1 '^skipped' "$log"))"
            fail=1
        elif [ "$st" -eq 0 ]; then
            echo "$tag: check \"$name\" ok ($(grep -o '[0-9]* cases, 0 failed, worst nmse [0-9.e+-]*' "$log"))"
        else
            echo "$tag: CHECK \"$name\" FAILED, exit $st (see $log)"
            fail=1
        fi
    done
done
if [ -n "$PERF" ]; then
    for r in $(seq 1 "$ROUNDS"); do
        for tag in "${tags[@]}"; do
            ops="$WORK/bin-$tag/gpu_test_backend_ops"
            [ -x "$ops" ] || continue
            IFS=',' read -ra names <<< "$PERF"
            for name in "${names[@]}"; do
                "$ops" --perf --only "$name" 2>&1 | grep -E ' (fwd|bwd) ' |
                    sed "s/^/$tag round $r:/"
            done
        done
    done
fi
for job in ${TRAIN:-}; do
    for tag in "${tags[@]}"; do
        bin="$WORK/bin-$tag/bench_train_gpu"
        [ -x "$bin" ] || continue
        RECIPE=${job%%:*} "$bin" "${job#*:}" 5 1 2>&1 | grep '^RESULT' | sed "s/^/$tag: /"
    done
done
if [ -n "${FULL_CHECK:-}" ] && [ ${#tags[@]} -gt 0 ]; then
    last=${tags[${#tags[@]}-1]}
    mkdir -p "$FULL_CHECK"
    ln -sfn "$root/.deps" "$src/.deps"
    (cd "$src" && bash bench/gpu_check.sh "$WORK/build" "$FULL_CHECK" > "$FULL_CHECK/check.log" 2>&1)
    st=$?
    echo "revision: $last (the tree ab_revs.sh built last)" >> "$FULL_CHECK/summary.txt"
    if [ $st -eq 0 ]; then
        echo "$last: full check passed (bench/gpu_check.sh: $FULL_CHECK/summary.txt)"
    else
        echo "$last: FULL CHECK FAILED or skipped (see $FULL_CHECK/check.log, summary.txt)"
        fail=1
    fi
fi
exit $fail
