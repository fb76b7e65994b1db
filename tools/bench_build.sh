#!/usr/bin/env bash
# Times melforge-build on the demo corpus with 1 and 2 threads (median of N runs each) and prints per-stage medians
# from build_report.json. Usage: tools/bench_build.sh [runs=5] [corpus=demo/corpus] [extra melforge-build flags...]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
runs="${1:-5}"
corpus="${2:-$here/demo/corpus}"
shift $(($# > 2 ? 2 : $#))
bin="${MELFORGE_BUILD_BIN:-$here/build/builder/melforge-build}"
[[ -x "$bin" ]] || bash "$here/tools/build.sh"
[[ -d "$corpus" ]] || /usr/bin/python3 "$here/tools/make_digits_corpus.py" --out "$corpus" --size full --seed 1
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
for threads in 1 2; do
  for ((i = 0; i < runs; i++)); do
    "$bin" --config "$here/tools/demo_build.ini" --input "$corpus" --output "$out/ds" --overwrite --quiet \
      --threads "$threads" --device cpu "$@" >/dev/null
    cp "$out/ds/build_report.json" "$out/report_${threads}_$i.json"
  done
done
/usr/bin/python3 - "$out" "$runs" <<'PY'
import json, statistics, sys, glob, os
out, runs = sys.argv[1], int(sys.argv[2])
print(f"melforge-build on the demo corpus, median of {runs} runs ({os.cpu_count()} cores)")
rows = {}
for threads in (1, 2):
    reps = [json.load(open(f)) for f in sorted(glob.glob(f"{out}/report_{threads}_*.json"))]
    rows[threads] = reps
first = rows[1][0]
print(f"files {first['files']['written']}, segments {first['segments']}, audio {first['audio_seconds']/60:.1f} min, "
      f"engine {first['engine']}")
stages = [k for k in first["times_s"] if not k.startswith("mel.")]
print(f"{'stage':<14}" + "".join(f"{f'{t} thread(s) s':>16}" for t in rows))
for k in stages + ["total"]:
    vals = []
    for t, reps in rows.items():
        xs = [r["total_s"] if k == "total" else r["times_s"].get(k, 0.0) for r in reps]
        vals.append(statistics.median(xs))
    print(f"{k:<14}" + "".join(f"{v:16.3f}" for v in vals))
for t, reps in rows.items():
    fps = statistics.median(r["throughput"]["files_per_s"] for r in reps)
    sps = statistics.median(r["throughput"]["segments_per_s"] for r in reps)
    rss = statistics.median(r["peak_rss_bytes"] for r in reps) / 2**20
    print(f"threads {t}: {fps:8.0f} files/s {sps:9.0f} segments/s  peak RSS {rss:6.1f} MiB")
PY
