#!/usr/bin/env bash
# recipe/build.sh: conda-build's build step for recipe/meta.yaml (CPU build, no tests, no MPI).
# UNTESTED, like the recipe (see its banner).
set -euo pipefail
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$PREFIX" \
    -DMOE_CUDA=OFF -DBUILD_TESTING=OFF -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON
cmake --build build -j "${CPU_COUNT:-2}"
cmake --install build
