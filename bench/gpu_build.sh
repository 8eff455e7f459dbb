#!/usr/bin/env bash
# Configure and build on the GPU machine (H200 image, see docs/performance-gpu.md), from a
# checkout that carries .deps/ staged by ../shared/gpu/stage-deps.sh on the Debian machine.
# Usage: source bench/gpu_build.sh [BUILD_DIR]   (default build-gpu; exports the env it sets)
# Two quirks of that image are handled here: htslib.pc names liblzma, which has no .pc file
# there (a minimal one is written; htslib is linked as a shared library, so nothing more is
# needed), and the staged headers must be system headers so -Werror ignores their warnings.
_build=${1:-build-gpu}
source .deps/env.sh
mkdir -p /tmp/moe-pc
printf 'Name: liblzma\nDescription: liblzma, linked through the shared libhts\nVersion: 5\nLibs:\nCflags:\n' \
    >/tmp/moe-pc/liblzma.pc
export PKG_CONFIG_PATH="/tmp/moe-pc:$PKG_CONFIG_PATH"
export CFLAGS="-isystem $PWD/.deps/root/usr/include ${CFLAGS:-}"
cmake -S . -B "$_build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 &&
    cmake --build "$_build" -j16
