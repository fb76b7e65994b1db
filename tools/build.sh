#!/usr/bin/env bash
# Configures and builds melforge into ./build (idempotent): melforge-build, and melforge-train with LibTorch from
# the pinned torch wheel (tools/setup_torch.sh installs it into ~/.cache/melforge on first use, ~2 min).
# MELFORGE_TRAINER=0 builds the builder only (no LibTorch). Extra arguments go to CMake's configure step.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$here/tools/setup.sh"
trainer=OFF
if [[ "${MELFORGE_TRAINER:-1}" != 0 ]]; then
  bash "$here/tools/setup_torch.sh" >/dev/null
  trainer=ON
fi
build_dir="${MELFORGE_BUILD_DIR:-$here/build}"
cmake -S "$here" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DMELFORGE_TRAINER="$trainer" "$@" >/dev/null
cmake --build "$build_dir" -j"$(nproc)"
