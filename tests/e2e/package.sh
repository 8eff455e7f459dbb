#!/usr/bin/env bash
# package.sh: the installation and the Debian package work (ctest label `package`).
#
#   1. `cmake --install` of the build tree into a DESTDIR staging tree, which is then moved
#      (relocatable): every program, its man page (`man moe-train` finds it through MANPATH),
#      its bash completion, the docs, configs, pipelines and the lambda genome are there; no
#      installed file names the source or the build directory.
#   2. `dpkg-buildpackage -us -uc -b` (CPU build, DEB_BUILD_OPTIONS=nocheck) of a copy of the
#      checkout, offline from the installed Debian packages; the .deb's version is the
#      project's, `apt-get install --simulate ./moe-genomics_*.deb` resolves, its contents
#      match the staged install, and the installed quickstart pipeline runs on lambda with
#      the package's programs only (extracted with dpkg-deb, not installed into the system).
#      Without dpkg-buildpackage/debhelper step 2 is skipped with a message, and step 1 runs
#      the pipeline instead. MOE_PACKAGE_INSTALL=1 (as root) also runs
#      `apt-get install ./moe-genomics_*.deb`, the tools from /usr/bin, and removes it again.
#   Also: the package build has no -Werror (MOE_WERROR is off), and where nvcc is present the
#   CUDA architecture sets configure as documented (dev: 90; dist: 80;90 and 100a).
# The one thing to know: the pipeline runs with PATH holding only the installed programs and
# the system's, and MOE_BUILD_DIR unset, so nothing of the build tree can stand in.
set -euo pipefail
src=${MOE_SRC_DIR:?MOE_SRC_DIR is not set}
bin=${MOE_BUILD_DIR:?MOE_BUILD_DIR is not set}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v man >/dev/null || { echo "SKIP: man is not installed (apt-get install man-db)"; exit 77; }
[ -f "$bin/man/moe-train.1" ] ||
    { echo "SKIP: the build has no man pages (help2man was not found: make deps)"; exit 77; }
version=$(sed -n 's/^project(moe_genomics VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
[ -n "$version" ] || fail "no project VERSION in CMakeLists.txt"
tools=()
for t in "$src"/tools/moe-*.c; do tools+=("$(basename "$t" .c)"); done
rm -rf work && mkdir -p work && cd work
start=$SECONDS

# check_tree ROOT: the installed files of every program and the shared data under ROOT/usr.
check_tree() {
    local root=$1/usr t
    for t in "${tools[@]}"; do
        [ -x "$root/bin/$t" ] || fail "$root/bin/$t is missing"
        ls "$root/share/man/man1/$t.1"* >/dev/null 2>&1 || fail "no man page for $t"
        [ -s "$root/share/bash-completion/completions/$t" ] || fail "no bash completion for $t"
        "$root/bin/$t" --version | head -n 1 | grep -qx "$t (moe-genomics) $version" ||
            fail "$root/bin/$t --version"
    done
    for f in doc/moe-genomics/README.md doc/moe-genomics/docs/cli.md moe-genomics/configs/tiny.yaml \
        moe-genomics/data/lambda_virus.fa.gz moe-genomics/pipelines/quickstart.sh \
        moe-genomics/pipelines/snakemake/workflow/Snakefile moe-genomics/pipelines/nextflow/main.nf; do
        ls "$root/share/$f"* >/dev/null 2>&1 || fail "$root/share/$f is missing"
    done
    [ -f "$root/share/doc/moe-genomics/LICENSE" ] || fail "no LICENSE in $root/share/doc/moe-genomics"
    # man finds the page by name, and it is the tool's (its synopsis and an option).
    MANPATH=$root/share/man man -w moe-train | grep -q "^$root/share/man/man1/moe-train.1" ||
        fail "man -w moe-train does not find $root/share/man/man1/moe-train.1"
    # (grep reads to the end: with -q it stops at the match and under pipefail man's SIGPIPE
    # on the rest of the page would fail the check)
    MANPATH=$root/share/man MANWIDTH=100 man moe-train 2>/dev/null |
        grep -- '--resume WHAT' > /dev/null || fail "man moe-train does not show its options"
}

# check_completion ROOT: the completion lists a program's options and subcommands.
check_completion() {
    PATH=$1/usr/bin:/usr/bin:/bin bash -c '
        . "$1/usr/share/bash-completion/completions/moe-convert"
        complete -p moe-train | grep -q _moe_genomics_complete || exit 1
        COMP_WORDS=(moe-train --con); COMP_CWORD=1; _moe_genomics_complete
        [ "${COMPREPLY[*]}" = --config ] || exit 2
        COMP_WORDS=(moe-convert to); COMP_CWORD=1; _moe_genomics_complete
        [[ " ${COMPREPLY[*]} " == *" to-hf "* ]] || exit 3' _ "$1" ||
        fail "bash completion from $1 (step $?)"
}

# run_pipeline ROOT: the installed quickstart on the installed lambda genome, installed tools only.
run_pipeline() {
    local root=$1/usr
    (unset MOE_BUILD_DIR MOE_DEMO_INPUT MOE_DEMO_CONFIG
        export PATH=$root/bin:/usr/bin:/bin MOE_DEMO_DIR=$PWD/demo MOE_DEMO_DEVICE=cpu
        export MOE_DEMO_TRAIN_ARGS="train.steps=10 optim.warmup_steps=2 train.eval_every=5 train.global_batch_tokens=512"
        "$root/share/moe-genomics/pipelines/quickstart.sh" --fresh >pipeline.out 2>pipeline.err) ||
        { tail -n 30 pipeline.err; fail "quickstart.sh of $1"; }
    hidden=$(sed -n 's/^ *hidden_size: *\([0-9]*\).*/\1/p' "$root/share/moe-genomics/configs/tiny.yaml")
    grep -q "^input  *$root/share/moe-genomics/data/lambda_virus.fa.gz" pipeline.out ||
        fail "quickstart did not take the installed lambda genome"
    grep -q "^embeddings  *(49, $hidden)" pipeline.out || { cat pipeline.out; fail "embedding shape"; }
    grep -Eq '^loss  *[0-9.]+ at step 1 -> [0-9.]+ at step 10$' pipeline.out || fail "loss line"
}

# 1. cmake --install into a staging tree, then move it.
DESTDIR=$PWD/stage0 cmake --install "$bin" --prefix /usr >install.log ||
    { cat install.log; fail "cmake --install"; }
mv stage0 stage
check_tree "$PWD/stage"
check_completion "$PWD/stage"
# No installed file names the checkout or the build tree (debug info aside: .rodata/.data).
for f in stage/usr/bin/*; do
    for sec in .rodata .data .dynstr; do
        # (not grep -q: a SIGPIPE to readelf after an early match would hide the match)
        if readelf -p "$sec" "$f" 2>/dev/null | grep -e "$src" -e "$bin" > /dev/null; then
            fail "$f: $sec names the build or source directory"
        fi
    done
    if readelf -d "$f" | grep -E 'R(UN)?PATH' | grep -e "$src" -e "$bin" > /dev/null; then
        fail "$f has a RUNPATH into the build tree"
    fi
done
if grep -rlI -e "$src" -e "$bin" stage >bad.txt; then fail "installed files name the build tree: $(cat bad.txt)"; fi
echo "staged install: ok ($((SECONDS - start)) s)"

# CUDA architectures: the developer default is sm_90 alone; MOE_CUDA_ARCH_SET=dist (for
# binaries shipped to other machines) adds sm_80 and, with nvcc >= 12.8, sm_100a. Configure only.
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
    nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    release=$("$nvcc" --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')
    want="80 90"
    printf '%s\n12.8\n' "$release" | sort -V -C -r && want="80 90 100a" # release >= 12.8
    for set in dev:90 "dist:$want"; do
        rm -rf cuda-cfg
        cmake -S "$src" -B cuda-cfg -G Ninja -DMOE_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc" \
            -DBUILD_TESTING=OFF -DMOE_CUDA_ARCH_SET="${set%%:*}" >cuda-cfg.log 2>&1 ||
            { tail -n 20 cuda-cfg.log; fail "configure with MOE_CUDA_ARCH_SET=${set%%:*}"; }
        got=$(grep -o 'code=\[compute_[0-9a-z]*,sm_[0-9a-z]*\]' cuda-cfg/build.ninja |
            sed 's/.*,sm_\(.*\)\]/\1/' | sort -u | sort -n | tr '\n' ' ')
        [ "${got% }" = "${set#*:}" ] || fail "MOE_CUDA_ARCH_SET=${set%%:*}: sm_ '${got% }', expected '${set#*:}'"
    done
    rm -rf cuda-cfg
    echo "CUDA architectures (nvcc $release): dev 90, dist $want"
else
    echo "no nvcc: CUDA architecture sets not checked"
fi

# 2. The Debian package.
if ! command -v dpkg-buildpackage >/dev/null || ! command -v dh >/dev/null; then
    echo "dpkg-buildpackage or debhelper missing (make deps): no package built; pipeline on the staged install"
    run_pipeline "$PWD/stage"
    echo "PASS package (staged install only, $((SECONDS - start)) s)"
    exit 0
fi
# `make deps` installs every Build-Depends, so a fresh clone can build the package.
deps=$(sed -n '/^DEB_PACKAGES :=/,/^$/p' "$src/Makefile" | tr -d '\\' | sed 's/DEB_PACKAGES :=//' | tr -s ' \t\n' ' ')
for p in $(sed -n '/^Build-Depends:/,/^[A-Z]/p' "$src/debian/control" | sed '$d; s/^Build-Depends://' |
    tr ',' '\n' | sed 's/(.*//; s/ //g; s/^debhelper-compat$/debhelper/' | grep .); do
    [[ " $deps " == *" $p "* ]] || fail "debian/control Build-Depends $p is not in the Makefile's DEB_PACKAGES"
done
deb_version=$(dpkg-parsechangelog -l "$src/debian/changelog" -S Version)
[ "$deb_version" = "$version" ] || fail "debian/changelog is $deb_version, CMakeLists.txt $version"
# A copy of the checkout's files (what git tracks or would track; no build trees).
mkdir -p pkg/moe-genomics-"$version"
if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
    # (a file deleted but not yet committed is skipped with tar's warning)
    git -C "$src" ls-files -z --cached --others --exclude-standard |
        (cd "$src" && tar --null -T - --ignore-failed-read -cf -) | tar -xf - -C pkg/moe-genomics-"$version"
else
    (cd "$src" && tar --exclude='./build*' --exclude=./.git -cf - .) | tar -xf - -C pkg/moe-genomics-"$version"
fi
[ -f "pkg/moe-genomics-$version/debian/rules" ] || fail "the copy of the checkout has no debian/rules"
t0=$SECONDS
(cd "pkg/moe-genomics-$version" && DEB_BUILD_OPTIONS="nocheck parallel=2" nice \
    dpkg-buildpackage -us -uc -b >../build.log 2>&1) || { tail -n 40 pkg/build.log; fail "dpkg-buildpackage"; }
echo "dpkg-buildpackage: $((SECONDS - t0)) s"
# A user's or packager's build does not turn warnings into errors (dpkg's own
# -Werror=format-security aside); it still warns.
if grep -Eq -- '-Werror( |$)' pkg/build.log; then fail "the package build compiles with -Werror"; fi
grep -q -- '-Wall' pkg/build.log || fail "the package build does not compile with -Wall"
debs=(pkg/moe-genomics_"$version"_*.deb)
[ -f "${debs[0]}" ] || fail "dpkg-buildpackage wrote no moe-genomics_${version}_*.deb"
deb=$PWD/${debs[0]}
dpkg-deb -f "$deb" Depends | grep -q libhts || fail "the package does not depend on htslib"
apt-get install --simulate "$deb" >apt.log 2>&1 || { cat apt.log; fail "apt-get install --simulate $deb"; }
grep -q "^Inst moe-genomics" apt.log || { cat apt.log; fail "apt would not install moe-genomics"; }
# Same files as the staged install (the package compresses man pages and adds copyright).
dpkg-deb -c "$deb" | awk '{ print $6 }' | sed 's|^\./|/|; s#^\(/usr/share/\(man\|doc\)/.*\)\.gz$#\1#' | grep -v '/$' |
    grep -v '^/usr/share/doc/moe-genomics/\(copyright\|changelog\)' | sort >deb.files
(cd stage && find . -type f -o -type l) | sed 's|^\.||' | sort >stage.files
diff stage.files deb.files >files.diff || { cat files.diff; fail "package and cmake --install differ"; }
dpkg-deb -x "$deb" ext
check_tree "$PWD/ext"
check_completion "$PWD/ext"
run_pipeline "$PWD/ext"
echo "package $(basename "$deb"): built, checked, lambda pipeline passed"

if [ "${MOE_PACKAGE_INSTALL:-0}" = 1 ]; then
    [ "$(id -u)" = 0 ] || fail "MOE_PACKAGE_INSTALL=1 needs root (it installs into the system)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y "$deb" >install-deb.log 2>&1 ||
        { cat install-deb.log; fail "apt-get install $deb"; }
    trap 'DEBIAN_FRONTEND=noninteractive apt-get remove -y moe-genomics >/dev/null 2>&1' EXIT
    [ "$(PATH=/usr/bin:/bin command -v moe-train)" = /usr/bin/moe-train ] || fail "no /usr/bin/moe-train"
    man -w moe-train | grep -q '^/usr/share/man/man1/moe-train.1' || fail "man moe-train after apt install"
    run_pipeline ""
    echo "apt-get install ./$(basename "$deb"): tools from /usr/bin passed the lambda pipeline"
fi
echo "PASS package ($((SECONDS - start)) s)"
