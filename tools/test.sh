#!/usr/bin/env bash
# Installs what is missing, builds everything (tools/build.sh: the same configuration as tools/demo.sh, warnings as
# errors for melforge's own code) and runs all the tests: C++ through CTest, then Python through pytest (tests/python
# and the package's python/tests, with the package's wheel built once and installed into build/python-venv by
# tools/setup_python.sh). [cuda] tests report "skipped" on a machine without a CUDA device; any other skip (a missing
# tool or permission) fails the run (tools/check_skips.py). Each part prints its time.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
part_name=checks
part_start=$SECONDS
begin() { part_name="$1"; part_start=$SECONDS; }
end() { echo "[test] $part_name: $((SECONDS - part_start)) s"; }
trap 'echo "[test] $part_name FAILED after $((SECONDS - part_start)) s" >&2' ERR
# A Catch2 test name with ';' or with a '[' that no ']' closes is mangled by catch_discover_tests into CTest entries
# that match no test (an open '[' joined the rest of its file's tests into one entry), and one that starts with '--'
# is read by Catch as an option: either way CTest reports a pass for a test that never ran.
if grep -nE 'TEST_CASE\("(--|[^"]*;|[^"]*\[[^]"]*")' -r "$here/tests" "$here/trainer/tests" --include='*.cpp'; then
  echo "tools/test.sh: the test names above would never run under CTest (';', an unclosed '[', or a leading '--')" >&2
  exit 1
fi
build_dir="${MELFORGE_BUILD_DIR:-$here/build}"
begin build
MELFORGE_BUILD_DIR="$build_dir" bash "$here/tools/build.sh" "$@"
end
begin ctest
ctest --test-dir "$build_dir" --output-on-failure -j"$(nproc)" --timeout 600 --output-junit "$build_dir/ctest-junit.xml"
end
begin "Python package (one wheel, installed into build/python-venv)"
python="$(MELFORGE_BUILD_DIR="$build_dir" bash "$here/tools/setup_python.sh" | tail -n 1)"
end
begin pytest
(cd "$build_dir" && "$python" -m pytest -q -rs "$here/tests/python" "$here/python/tests" --junitxml "$build_dir/pytest-junit.xml")
end
begin check_skips
# A skipped test passes CTest; here a skip fails the run unless it is a [cuda] test on a machine without a GPU.
/usr/bin/python3 "$here/tools/check_skips.py" --build "$build_dir" --ctest-junit "$build_dir/ctest-junit.xml" \
  --pytest-junit "$build_dir/pytest-junit.xml"
end
