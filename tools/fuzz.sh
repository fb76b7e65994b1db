#!/usr/bin/env bash
# Runs melforge's libFuzzer targets (tests/fuzz) for a bounded time each, starting from their committed seed corpora.
#
#   tools/fuzz.sh [--seconds N] [--build-dir DIR] [--no-build] [target ...]
#
# Targets: fuzz_decode fuzz_manifest fuzz_config fuzz_dataset fuzz_checkpoint (default: all five). The build folder
# (default build-san/, the one tools/sanitize.sh configures: clang, ASan + UBSan, MELFORGE_FUZZ=ON) is configured
# here if it is not yet, and the targets are built unless --no-build. New inputs that libFuzzer finds go to
# DIR/fuzz/<target>/corpus/ (the committed seeds are only read); a crashing input is saved as
# DIR/fuzz/<target>/crash-* (or leak-*, timeout-*, oom-*), and the script exits non-zero. To reproduce one:
#   DIR/tests/fuzz/<target> DIR/fuzz/<target>/crash-...
# Each run's log is DIR/fuzz/<target>.log; the summary line per target gives the inputs run, exec/s and new units.
# Targets run in parallel, MELFORGE_FUZZ_PARALLEL at once (default: the number of cores).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds=60
build_dir="$here/build-san"
build=1
targets=()
while (($#)); do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --build-dir) build_dir="$(cd "$2" 2>/dev/null && pwd || echo "$2")"; shift 2 ;;
    --no-build) build=0; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done

if [[ ! -f "$build_dir/CMakeCache.txt" ]] || ! grep -q '^MELFORGE_FUZZ:BOOL=ON' "$build_dir/CMakeCache.txt"; then
  echo "[fuzz] $build_dir is not a fuzzing build; configuring it with tools/sanitize.sh's settings"
  MELFORGE_SAN_BUILD_DIR="$build_dir" bash "$here/tools/sanitize.sh" -N >/dev/null
fi
if ((${#targets[@]} == 0)); then
  targets=(fuzz_decode fuzz_manifest fuzz_config fuzz_dataset fuzz_checkpoint)
fi
if ((build)); then
  cmake --build "$build_dir" -j"${MELFORGE_JOBS:-$(nproc)}" --target "${targets[@]}"
fi

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$here/tools/lsan.supp:print_suppressions=0}"
# One libFuzzer process per target, at most `parallel` at once (each uses one core).
run_one() {
  local t="$1" exe="$build_dir/tests/fuzz/$1" work="$build_dir/fuzz/$1" dict=()
  mkdir -p "$work/corpus"
  [[ -f "$here/tests/fuzz/$t.dict" ]] && dict=(-dict="$here/tests/fuzz/$t.dict")
  # Decoding holds about 1.6 MiB whatever a header claims (issue 15): an allocation of 256 MiB is a finding.
  [[ "$t" == fuzz_decode ]] && dict+=(-malloc_limit_mb=256)
  "$exe" "${dict[@]}" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2560 -print_final_stats=1 \
    -artifact_prefix="$work/" "$work/corpus" "$here/tests/fuzz/corpus/$t" >"$work.log" 2>&1
}
parallel="${MELFORGE_FUZZ_PARALLEL:-$(nproc)}"
declare -A pid_of
for t in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= parallel)); do wait -n || true; done
  run_one "$t" &
  pid_of[$t]=$!
done
failed=()
for t in "${targets[@]}"; do
  rc=0
  wait "${pid_of[$t]}" || rc=$?
  work="$build_dir/fuzz/$t"
  done_line="$(grep -E '^#[0-9]+[[:space:]]+DONE' "$work.log" | tail -1 || true)"
  runs="$(grep -E '^stat::number_of_executed_units' "$work.log" | awk '{print $2}' || true)"
  echo "[fuzz] $t: ${seconds} s, ${runs:-?} inputs, exit $rc: ${done_line:-no DONE line}"
  if ((rc != 0)); then
    failed+=("$t")
    grep -E 'ERROR: |runtime error|fuzz invariant|Test unit written' "$work.log" | head -5 || true
    echo "[fuzz] $t: full log in $work.log"
  fi
done
if ((${#failed[@]})); then
  echo "[fuzz] FAILED: ${failed[*]}"
  exit 1
fi
echo "[fuzz] all targets ran clean"
