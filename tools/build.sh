#!/usr/bin/env bash
# Configures and builds melforge into ./build (idempotent). Extra arguments go to CMake's configure step.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$here/tools/setup.sh"
build_dir="${MELFORGE_BUILD_DIR:-$here/build}"
cmake -S "$here" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$build_dir" -j"$(nproc)"
