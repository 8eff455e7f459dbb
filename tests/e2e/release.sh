#!/usr/bin/env bash
# e2e.release: the release mechanics of docs/install.md "Releases". The version is written
# once, in CMakeLists.txt's project(VERSION); every file that pins it for a packager (Debian
# changelog, the conda recipe, the Snakemake and Nextflow container and conda pins, the
# README's .deb name) must say the same, and --version prints it. In a git checkout,
# `make dist` writes moe-genomics-VERSION.tar.gz of the committed tree (no build output in
# it), and a release tag on HEAD must be vVERSION.
set -euo pipefail
src=${MOE_SRC_DIR:?}
fail() { echo "FAIL: $*" >&2; exit 1; }

ver=$(grep -m1 -o 'moe_genomics VERSION [0-9.]*' "$src/CMakeLists.txt" | cut -d' ' -f3)
[ -n "$ver" ] || fail "no project(moe_genomics VERSION x.y.z) in CMakeLists.txt"
echo "version $ver"

# every pin of the form moe-genomics<sep>X.Y.Z in the packaging and workflow files
pins=$(cd "$src" && grep -rnoE 'moe-genomics(:|=| =|_| \()[0-9]+\.[0-9]+\.[0-9]+' \
    debian/changelog recipe pipelines README.md docs/install.md || true)
[ "$(printf '%s\n' "$pins" | grep -c .)" -ge 10 ] || fail "expected the version pins, found: $pins"
bad=$(printf '%s\n' "$pins" | grep -vE "[:= _(]$ver\$" || true)
[ -z "$bad" ] || fail "pins that do not say $ver: $bad"
grep -q "{% set version = \"$ver\" %}" "$src/recipe/meta.yaml" || fail "recipe/meta.yaml version"
grep -qE "version += '$ver'" "$src/pipelines/nextflow/nextflow.config" \
    || fail "pipelines/nextflow/nextflow.config manifest version"
moe-train --version | head -n 1 | grep -qx "moe-train (moe-genomics) $ver" \
    || fail "moe-train --version: $(moe-train --version | head -n 1)"

if git -C "$src" rev-parse --git-dir > /dev/null 2>&1; then
    rm -rf dist && mkdir dist
    make -s -C "$src" dist DIST_DIR="$PWD/dist" > dist.log
    tarball=dist/moe-genomics-$ver.tar.gz
    [ -s "$tarball" ] || fail "make dist wrote no $tarball"
    grep -q "moe-genomics-$ver.tar.gz" dist.log || fail "make dist printed no sha256"
    tar tzf "$tarball" > contents.txt
    grep -qx "moe-genomics-$ver/CMakeLists.txt" contents.txt || fail "tarball lacks CMakeLists.txt"
    ! grep -qE "^moe-genomics-$ver/build[^/]*/" contents.txt || fail "tarball holds a build tree"
    echo "make dist: $(wc -l < contents.txt) entries"
    tag=$(git -C "$src" tag --points-at HEAD 'v*' | head -n 1)
    if [ -n "$tag" ]; then
        [ "$tag" = "v$ver" ] || fail "HEAD is tagged $tag but the version is $ver"
        echo "HEAD is the release tag $tag"
    fi
else
    echo "not a git checkout: make dist not checked"
fi
echo "release: ok"
