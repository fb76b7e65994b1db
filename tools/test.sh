#!/usr/bin/env bash
# Installs what is missing, builds everything (warnings are errors for melforge's own code) and runs all the tests.
# [cuda] tests report "skipped" on a machine without a CUDA device.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${MELFORGE_BUILD_DIR:-$here/build}"
MELFORGE_BUILD_DIR="$build_dir" bash "$here/tools/build.sh" -DMELFORGE_WERROR=ON "$@"
ctest --test-dir "$build_dir" --output-on-failure -j"$(nproc)" --timeout 600
