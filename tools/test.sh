#!/usr/bin/env bash
# Installs what is missing, builds everything (warnings are errors for melforge's own code) and runs all the tests:
# C++ through CTest, then Python through pytest (tests/python and the package's python/tests, after `pip install .`). [cuda] tests report "skipped" on a machine without a
# CUDA device; any other skip (a missing tool or permission) fails the run (tools/check_skips.py).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# A Catch2 test name with ';' or with a '[' that no ']' closes is mangled by catch_discover_tests into CTest entries
# that match no test (an open '[' joined the rest of its file's tests into one entry), and one that starts with '--'
# is read by Catch as an option: either way CTest reports a pass for a test that never ran.
if grep -nE 'TEST_CASE\("(--|[^"]*;|[^"]*\[[^]"]*")' -r "$here/tests" "$here/trainer/tests" --include='*.cpp'; then
  echo "tools/test.sh: the test names above would never run under CTest (';', an unclosed '[', or a leading '--')" >&2
  exit 1
fi
build_dir="${MELFORGE_BUILD_DIR:-$here/build}"
MELFORGE_BUILD_DIR="$build_dir" bash "$here/tools/build.sh" -DMELFORGE_WERROR=ON "$@"
ctest --test-dir "$build_dir" --output-on-failure -j"$(nproc)" --timeout 600 --output-junit "$build_dir/ctest-junit.xml"
# The Python package: `pip install .` into the build's venv (tools/setup_python.sh), then its tests and the tools' tests.
python="$(MELFORGE_BUILD_DIR="$build_dir" bash "$here/tools/setup_python.sh" | tail -n 1)"
(cd "$build_dir" && "$python" -m pytest -q -rs "$here/tests/python" "$here/python/tests" --junitxml "$build_dir/pytest-junit.xml")
# A skipped test passes CTest; here a skip fails the run unless it is a [cuda] test on a machine without a GPU.
/usr/bin/python3 "$here/tools/check_skips.py" --build "$build_dir" --ctest-junit "$build_dir/ctest-junit.xml" \
  --pytest-junit "$build_dir/pytest-junit.xml"
