#!/usr/bin/env bash
# Usage: make_outputs.sh BUILD_DIR OUTDIR: the outputs a refactor must leave the same (issue 14): two datasets of the
# small digit corpus (float16 on 2 threads, float32 on 1 thread), a 2-epoch run, eval and predict, all on fixed
# seeds (exact resume is checked by trainer/tests/test_trainer_train.cpp). Compare two OUTDIRs with compare.py (same folder). Needs espeak-ng (tools/setup.sh).
set -euo pipefail
b="$1"; o="$2"; here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"; c="${MELFORGE_SAME_CORPUS:-$here/out/same-outputs-corpus}"
mkdir -p "$o"
[ -d "$c" ] || /usr/bin/python3 $here/tools/make_digits_corpus.py --out "$c" --size small --seed 1 >/dev/null
B="$b/builder/melforge-build"; T="$b/trainer/melforge-train"
"$B" --config $here/tools/demo_build.ini --input "$c" --output "$o/ds16" --overwrite --threads 2 >/dev/null 2>&1
"$B" --config $here/tools/demo_build.ini --input "$c" --output "$o/ds32" --overwrite --threads 1 --dtype float32 --max-ram 64M >/dev/null 2>&1
"$T" train --data "$o/ds16" --out "$o/run" --overwrite --epochs 2 --positive-class seven --seed 3 --threads 2 >/dev/null 2>&1
"$T" eval --checkpoint "$o/run/checkpoints/best.pt" --data "$o/ds16" --split test --out "$o/eval.json" >/dev/null 2>&1
"$T" predict --checkpoint "$o/run/checkpoints/best.pt" --format csv $(find "$c" -name '*.wav' | sort | head -5) > "$o/predict.csv" 2>/dev/null
echo done
