#!/usr/bin/env bash
# prepare_ab.sh: the trees of an A/B over changes kept on main as a commit and its revert
# (how changes written without a GPU wait for one), as tars for bench/kernels/ab_revs.sh.
# OUT/main.tar is HEAD; then each REVERT_COMMIT in turn is reverted on top of the previous
# tree (restoring the change it reverted), and OUT/<n>-<short>.tar is that tree: each tar holds
# every change before it too, so that neighbouring tars differ by one change. Works in a
# temporary worktree; the checkout is not touched. Fails (exit 1) if a revert does not apply.
#
#   bench/kernels/prepare_ab.sh OUT_DIR REVERT_COMMIT...
#   bench/kernels/prepare_ab.sh work/ab d86a40d 6b60f05 956fa77
#
# then carry OUT_DIR (an ignored path under work/) to the GPU and run ab_revs.sh on the tars
# in the order printed.
set -euo pipefail
out=${1:?usage: prepare_ab.sh OUT_DIR REVERT_COMMIT...}
shift
[ $# -gt 0 ] || { echo "prepare_ab.sh: name at least one revert commit" >&2; exit 2; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
tree=$(mktemp -d "${TMPDIR:-/tmp}/moe-ab.XXXXXX")
trap 'git worktree remove --force "$tree" > /dev/null 2>&1 || true; rm -rf "$tree"' EXIT
git worktree add -q --detach "$tree" HEAD
git -C "$tree" archive HEAD > "$out/main.tar"
tars=("$out/main.tar")
n=0
for rev in "$@"; do
    n=$((n + 1))
    git -C "$tree" -c user.name=ab -c user.email=ab@localhost revert --no-edit "$rev" > /dev/null ||
        { echo "prepare_ab.sh: reverting $rev does not apply after the ones before it" >&2; exit 1; }
    tar_path="$out/$n-$(git -C "$tree" rev-parse --short "$rev").tar"
    git -C "$tree" archive HEAD > "$tar_path"
    tars+=("$tar_path")
done
printf '%s\n' "${tars[@]}"
