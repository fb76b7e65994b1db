#!/usr/bin/env bash
# Makes the Python environment the tests and benchmarks use, and installs melforge into it with `pip install .`
# (scikit-build-core + nanobind, against Debian's -dev packages). Safe to run any number of times: the venv is
# reused, pip installs only what is missing, and the CMake build folder is kept, so a second run rebuilds only
# what changed.
#
# The environment is a venv of Debian's /usr/bin/python3 (3.11). When the project's torch environment exists
# (tools/setup_torch.sh; made by tools/build.sh unless MELFORGE_TRAINER=0) its site-packages are added through a
# .pth file, so that torch is importable without a second 5 GB copy.
#
# Usage: bash tools/setup_python.sh            prints the venv's python as the last line of stdout
# Environment:
#   MELFORGE_BUILD_DIR   build folder (default build/); the venv is $MELFORGE_BUILD_DIR/python-venv and pip's CMake
#                        build folder $MELFORGE_BUILD_DIR/python.
#   MELFORGE_PY_EXTRAS   more pip requirements to install into the venv (e.g. "torchaudio==2.11.0" for benchmarks).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${MELFORGE_BUILD_DIR:-$here/build}"
venv="$build_dir/python-venv"
log() { echo "[setup_python] $*" >&2; }

if [[ ! -x "$venv/bin/python" ]]; then
  log "creating $venv"
  /usr/bin/python3 -m venv "$venv"
fi
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if [[ "${MELFORGE_TRAINER:-1}" != 0 ]]; then
  torch_venv="$(bash "$here/tools/setup_torch.sh" --venv)"
  if [[ -d "$torch_venv" ]]; then
    "$torch_venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$site/melforge-torch.pth"
  fi
fi
# The tests' requirements. The build's (scikit-build-core, nanobind: pyproject.toml) come in pip's isolated build
# environment, as for any user's `pip install .`.
# scikit-learn: the reference of the multi-label metrics; tensorboard: its event reader checks the trainer's event files.
requirements=(pytest h5py numpy scikit-learn tensorboard)
read -r -a extras <<< "${MELFORGE_PY_EXTRAS:-}"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "${requirements[@]}" "${extras[@]}" >&2
log "pip install $here"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
  --config-settings=build-dir="$build_dir/python" --config-settings=cmake.build-type=Release "$here" >&2
echo "$venv/bin/python"
