#!/usr/bin/env bash
# Data-parallel training on this machine: 1 process with --batch-size 2B against 2 Gloo processes (ranks on
# 127.0.0.1) with --batch-size B each, the same global batch, every process on --threads 1. Prints the training
# samples/s of the last epoch (metrics.jsonl's samples_per_s: the job's samples over the training time of the
# epoch, validation excluded) and their ratio. Results in docs/PERFORMANCE.md ("Data-parallel training").
#
# Usage: tools/bench/ddp_bench.sh [--data DATASET] [--batch B] [--epochs E] [-- TRAIN FLAGS...]
#   --data    a melforge-build dataset; default: the demo's spoken digits (tools/make_digits_corpus.py --size full,
#             tools/demo_build.ini), built once under $MELFORGE_BENCH_WORK (default out/bench/work)/ddp
#   --batch   per-rank batch B (default 64); --epochs (default 3; the last one is reported)
#   after --, flags for every `train` (e.g. --no-overlap, --bucket-mib 1)
# Needs build/trainer/melforge-train (tools/build.sh).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
train="$here/build/trainer/melforge-train"
build="$here/build/builder/melforge-build"
work="${MELFORGE_BENCH_WORK:-$here/out/bench/work}/ddp"
data="" batch=64 epochs=3 extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --data) data="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --epochs) epochs="$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "usage: $0 [--data DATASET] [--batch B] [--epochs E]" >&2; exit 2 ;;
  esac
done
[[ -x "$train" ]] || { echo "ddp_bench.sh: $train missing (tools/build.sh)" >&2; exit 1; }
mkdir -p "$work"
if [[ -z "$data" ]]; then
  data="$work/dataset"
  if [[ ! -f "$data/test.h5" ]]; then
    /usr/bin/python3 "$here/tools/make_digits_corpus.py" --out "$work/corpus" --size full --seed 1
    "$build" --config "$here/tools/demo_build.ini" --input "$work/corpus" --output "$data" --overwrite
  fi
fi

common=(train --data "$data" --epochs "$epochs" --patience 0 --threads 1 --prefetch 2 --log-level warn --overwrite
        "${extra[@]}")
last_rate() { /usr/bin/python3 -c 'import json,sys; print([j for j in map(json.loads, open(sys.argv[1])) if j.get("type", "epoch") == "epoch"][-1]["samples_per_s"])' "$1/metrics.jsonl"; }
port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

"$train" "${common[@]}" --out "$work/run1" --batch-size $((2 * batch)) > "$work/run1.log" 2>&1
one=$(last_rate "$work/run1")

p=$(port)
pids=()
for r in 0 1; do
  "$train" "${common[@]}" --out "$work/run2" --batch-size "$batch" --world-size 2 --rank "$r" \
    --master-addr 127.0.0.1 --master-port "$p" > "$work/run2.rank$r.log" 2>&1 &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
two=$(last_rate "$work/run2")

echo "dataset $data, global batch $((2 * batch)), epoch $epochs of $epochs, --threads 1 per process, $(nproc) cores," \
  "flags: ${extra[*]:-none}"
printf '1 process,  batch %4d:          %8.0f samples/s\n' $((2 * batch)) "$one"
printf '2 processes, batch %4d per rank: %8.0f samples/s\n' "$batch" "$two"
/usr/bin/python3 -c "import sys; print(f'speed-up 2 vs 1: {float(sys.argv[2]) / float(sys.argv[1]):.2f}x')" "$one" "$two"
