#!/usr/bin/env bash
# Builds melforge with AddressSanitizer + UndefinedBehaviorSanitizer (clang; any UBSan report aborts) and runs its
# whole ctest suite under them, LeakSanitizer included (tools/lsan.supp). See docs/RELIABILITY.md, "Sanitizers".
#
#   tools/sanitize.sh             builder, kernels and common (no LibTorch, no CUDA) in build-san/, with the fuzz
#                                 targets configured (MELFORGE_FUZZ=ON) so that tools/fuzz.sh reuses the same build
#   tools/sanitize.sh --trainer   the trainer too, in the same build-san/ (after the first form only the trainer's
#                                 targets compile), with the trainer's tests of melforge's own memory handling only
#                                 (trainer/CMakeLists.txt, MELFORGE_TRAINER_SANITIZER_TESTS; docs/RELIABILITY.md says
#                                 which and why); CI runs it after the first form, .ci/run
#
# MELFORGE_SAN_BUILD_DIR overrides the build folder; MELFORGE_JOBS the build and test parallelism (default: nproc).
# Extra arguments go to ctest (e.g. -R decode).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
trainer=OFF
if [[ "${1:-}" == --trainer ]]; then
  trainer=ON
  shift
fi
jobs="${MELFORGE_JOBS:-$(nproc)}"

# clang, its sanitizer and libFuzzer runtimes, and the OpenMP runtime clang links against.
bash "$here/tools/setup.sh" >/dev/null
missing=()
for p in clang libclang-rt-dev libomp-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "[sanitize] installing: ${missing[*]}"
  sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# One build folder for both forms: --trainer adds the trainer's targets to what the first form built (same flags for
# the others, so nothing of theirs is compiled again). The trainer's sources are only compiled with GCC elsewhere:
# clang's warnings there are not errors (MELFORGE_WERROR_TRAINER=OFF), the other targets keep -Werror.
build_dir="${MELFORGE_SAN_BUILD_DIR:-$here/build-san}"
if [[ $trainer == ON ]]; then
  bash "$here/tools/setup_torch.sh" >/dev/null
fi
fuzz=ON
werror=ON

source "$here/tools/ccache_env.sh"
start=$SECONDS
# -O1 -g1 (asserts on): full line tables for the sanitizers' stack traces at a fraction of -O2 -g's compile time.
cmake -S "$here" -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1" -DMELFORGE_SANITIZE=ON -DMELFORGE_CUDA=OFF -DMELFORGE_TRAINER="$trainer" \
  -DMELFORGE_FUZZ="$fuzz" -DMELFORGE_WERROR="$werror" \
  -DMELFORGE_WERROR_TRAINER=OFF "${melforge_launchers[@]}" >/dev/null
cmake --build "$build_dir" -j"$jobs"
echo "[sanitize] build: $((SECONDS - start)) s"
melforge_ccache_summary

start=$SECONDS
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$here/tools/lsan.supp:print_suppressions=0}"
# Excluded, because they measure the allocator rather than our code, and the release build runs them (tools/test.sh):
# - the builder's peak-RSS bounds (tests/test_reliability_resources.cpp: "... within --max-ram", and the
#   "--threads 10000 is capped" case, which also bounds RSS; tests/test_hostile_corpus.cpp: "peak RSS stays under
#   --max-ram 64M"): ASan's shadow memory, redzones and quarantine inflate the process's RSS past the bound (96 MiB
#   against 80 MiB; 171 MiB against 118 MiB; 126 MiB against 112 MiB once whole clips of 300 s are held);
# - the scan tests that exhaust RLIMIT_NOFILE on purpose (tests/test_scan.cpp, "too many open files", "errors in the
#   middle of a walk"): UBSan checks a vptr by probing memory through a pipe, which cannot be made without a free
#   descriptor, so it reports libstdc++'s std::system_category() as "object has invalid vptr" (a false report);
# - the trainer's "an allocation failure in train is one clear line" (trainer/tests/test_trainer_integrity.cpp): it
#   runs the child under RLIMIT_DATA (prlimit --data), and ASan cannot reserve its shadow memory under that limit;
# The trainer's tests that measure the allocator or train for an accuracy bar ("configure_allocator keeps large
# tensors off mmap", "host memory stays flat over 10 epochs", "predict on a 1-hour file runs in the memory of a short
# one", the speakers end-to-end run) are in files that the sanitizer build does not compile at all
# (trainer/CMakeLists.txt, MELFORGE_TRAINER_SANITIZER_TESTS; docs/RELIABILITY.md, "CI time").
ctest --test-dir "$build_dir" --output-on-failure -j"$jobs" --timeout 1200 \
  -E 'within --max-ram|peak RSS stays under --max-ram|--threads 10000 is capped|too many open files|errors in the middle of a walk|an allocation failure in train' \
  --output-junit "$build_dir/ctest-junit.xml" "$@"
/usr/bin/python3 "$here/tools/check_skips.py" --build "$build_dir" --ctest-junit "$build_dir/ctest-junit.xml"
echo "[sanitize] tests: $((SECONDS - start)) s"
