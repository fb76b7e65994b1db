#!/usr/bin/env bash
# One command for issue 4's side-by-side benchmarks: generates the corpus, runs every comparison against the Python
# peers in one run, prints the table of ratios (medians over repeats) with the targets, and writes results.json and
# results.md under the results folder.
#
# Usage: bash tools/bench/compare.sh [--quick] [--repeats N] [--epochs N] [--results DIR] [--py-workers N]
#                                    [--only verification]
#   --quick      small corpus (100 files, 1x and 4x), 2 epochs, 1 repeat: a smoke test of a few minutes
#   --repeats N  runs per measurement (default 3; --quick 1)
#   --only verification   only the speaker-verification training row (issue 19; speakers corpus, --split-by class)
# Environment: MELFORGE_BUILD_DIR (default ./build; built with tools/build.sh when a binary is missing),
#   MELFORGE_BENCH_WORK (corpora and scratch, default ./out/bench/work).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build_dir="${MELFORGE_BUILD_DIR:-$here/build}"
work="${MELFORGE_BENCH_WORK:-$here/out/bench/work}"
results="$here/out/bench/$(date +%Y%m%d-%H%M%S)"
args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --results) results="$2"; shift 2 ;;
    --quick) args+=("$1"); shift ;;
    --repeats|--epochs|--py-workers|--py-mel-batch|--only) args+=("$1" "$2"); shift 2 ;;
    -h|--help) sed -n '2,14p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "compare.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
bins=("$build_dir/builder/melforge-build" "$build_dir/trainer/melforge-train"
      "$build_dir/tools/bench/melforge-bench-mel" "$build_dir/tools/bench/melforge-bench-h5")
for b in "${bins[@]}"; do
  if [[ ! -x "$b" ]]; then
    echo "[compare] $b missing: building $build_dir" >&2
    MELFORGE_BUILD_DIR="$build_dir" bash "$here/tools/build.sh" >&2
    break
  fi
done
[[ -x /usr/bin/time ]] || { echo "compare.sh: GNU time missing (apt-get install time)" >&2; exit 1; }
python="$(bash "$here/tools/bench/setup_bench.sh" | tail -n1)"
exec /usr/bin/python3 "$here/tools/bench/compare.py" --results "$results" --work "$work" \
  --build-bin "${bins[0]}" --train-bin "${bins[1]}" --bench-dir "$build_dir/tools/bench" --python "$python" \
  "${args[@]}"
