#!/usr/bin/env bash
# Makes the Python environment the tests and benchmarks use, builds the melforge wheel once and installs it there.
# Safe to run any number of times: the venv is reused, pip installs only what is missing, and the CMake build folder
# is kept (with the compiler cache of tools/ccache_env.sh), so a second run rebuilds only what changed.
#
# The wheel: `pip wheel --no-build-isolation` (scikit-build-core + nanobind installed in the venv itself, so their
# paths are the same in every run and the compiler cache serves them; pip's build isolation would put nanobind in a
# new temporary folder each time) into $MELFORGE_BUILD_DIR/python-wheel/, then `pip install` of that file. It is the
# one compile of the extension in a run: tools/wheel.sh repairs and tests the same file (--wheel), it does not build
# another. Users keep `pip install .` (docs/PYTHON.md), which builds the same thing.
#
# The environment is a venv of Debian's /usr/bin/python3 (3.11). When the project's torch environment exists
# (tools/setup_torch.sh; made by tools/build.sh unless MELFORGE_TRAINER=0) its site-packages are added through a
# .pth file, so that torch is importable without a second 5 GB copy.
#
# Usage: bash tools/setup_python.sh            prints the venv's python as the last line of stdout
#                                               (the wheel's path is in $MELFORGE_BUILD_DIR/python-wheel/WHEEL)
# Environment:
#   MELFORGE_BUILD_DIR   build folder (default build/); the venv is $MELFORGE_BUILD_DIR/python-venv and the wheel's
#                        CMake build folder $MELFORGE_BUILD_DIR/python.
#   MELFORGE_SKIP_WHEEL  1: only the venv and its requirements, no wheel (tools/wheel.sh --wheel).
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
# The tests' requirements, and the build's (pyproject.toml's [build-system]; without build isolation pip does not
# install them). scikit-learn: the reference of the multi-label metrics; tensorboard: its event reader checks the
# trainer's event files; onnx, onnxscript, onnxruntime: melforge.onnx_export and its test (tools/setup_torch.sh adds
# them to the torch environment, whose packages this venv sees, so that they are usually present already; a fresh
# install of the three took 38.5 s on the 2-core machine).
requirements=(pytest h5py numpy scikit-learn tensorboard "scikit-build-core>=0.10" "nanobind>=2.4"
  onnx==1.23.2 onnxscript==0.7.2 onnxruntime==1.31.1)
read -r -a extras <<< "${MELFORGE_PY_EXTRAS:-}"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "${requirements[@]}" "${extras[@]}" >&2
if [[ "${MELFORGE_SKIP_WHEEL:-}" == 1 ]]; then
  echo "$venv/bin/python"
  exit 0
fi
source "$here/tools/ccache_env.sh"
defines=()
for arg in "${melforge_launchers[@]}"; do defines+=(--config-settings="cmake.define.${arg#-D}"); done
wheel_dir="$build_dir/python-wheel"
rm -rf "$wheel_dir"
log "pip wheel $here"
"$venv/bin/python" -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation -w "$wheel_dir" \
  --config-settings=build-dir="$build_dir/python" --config-settings=cmake.build-type=Release "${defines[@]}" \
  "$here" >&2
wheel=("$wheel_dir"/melforge-*.whl)
[[ -f "${wheel[0]}" ]] || { log "pip wrote no wheel into $wheel_dir"; exit 1; }
echo "${wheel[0]}" > "$wheel_dir/WHEEL"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps --force-reinstall "${wheel[0]}" >&2
melforge_ccache_summary
echo "$venv/bin/python"
