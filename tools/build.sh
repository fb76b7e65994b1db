#!/usr/bin/env bash
# Configures and builds melforge into ./build (idempotent): melforge-build, and melforge-train with LibTorch from
# the pinned torch wheel (tools/setup_torch.sh installs it into ~/.cache/melforge on first use, ~2 min).
# One configuration for every caller (tools/demo.sh, tools/test.sh, a developer): Release, warnings as errors for
# melforge's own code, the compiler cache. So the README's two commands, in either order, compile each file once.
#
# Environment:
#   MELFORGE_TRAINER=0        builds the builder only (no LibTorch).
#   MELFORGE_BUILD_DIR        build folder (default build/).
#   MELFORGE_BUILD_TARGETS    targets to build (default: all). tools/demo.sh builds only the two programs.
#   MELFORGE_WERROR=0         warnings are not errors (a compiler newer than Debian 12's GCC 12 may warn more).
#   MELFORGE_CCACHE=0         no compiler cache.
# Extra arguments go to CMake's configure step.
#
# The compiler cache: Debian's ccache (tools/setup.sh installs it), in ~/.cache/ccache, with base_dir set to this
# clone (tools/ccache_env.sh), so that a clone in another folder (CI's) is served by a developer's build.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$here/tools/setup.sh"
trainer=OFF
if [[ "${MELFORGE_TRAINER:-1}" != 0 ]]; then
  bash "$here/tools/setup_torch.sh" >/dev/null
  trainer=ON
fi
werror=ON
[[ "${MELFORGE_WERROR:-1}" == 0 ]] && werror=OFF
source "$here/tools/ccache_env.sh"
build_dir="${MELFORGE_BUILD_DIR:-$here/build}"
cmake -S "$here" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DMELFORGE_TRAINER="$trainer" -DMELFORGE_WERROR="$werror" \
  "${melforge_launchers[@]}" "$@" >/dev/null
targets=()
for t in ${MELFORGE_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build_dir" -j"$(nproc)" "${targets[@]}"
melforge_ccache_summary
