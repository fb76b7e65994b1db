#!/usr/bin/env bash
# melforge-build with --features mel against --features fbank on CORPUS (folders of WAV files), 1 thread, CPU: mel
# 80 bands (n_fft 512, win 400, hop 160) and fbank 80 bins (25 ms / 10 ms, hamming), alternating, 5 runs each;
# prints the wall time and the report's total_s and stage times (docs/PERFORMANCE.md, issue 31).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="${MELFORGE_BUILD_BIN:-$here/build/builder/melforge-build}"
corpus="${1:?usage: tools/bench/bench_features_build.sh CORPUS (folders of WAV files)}"
out=$(mktemp -d)
common=(--input "$corpus" --output "$out/ds" --overwrite --quiet --threads 1 --device cpu --sample-rate 16000)
mel=(--features mel --n-fft 512 --win-length 400 --hop-length 160 --n-mels 80)
fb=(--features fbank --num-mel-bins 80 --frame-length 25 --frame-shift 10 --window-type hamming --dither 0)
for i in 1 2 3 4 5; do
  for kind in mel fbank; do
    if [[ $kind == mel ]]; then flags=("${mel[@]}"); else flags=("${fb[@]}"); fi
    s=$(date +%s.%N); "$bin" "${common[@]}" "${flags[@]}" >/dev/null; e=$(date +%s.%N)
    /usr/bin/python3 -c "import json; r=json.load(open('$out/ds/build_report.json')); t=r['times_s']; print('$kind', 'wall %.3f' % ($e-$s), 'total_s %.3f' % r['total_s'], 'features %.3f' % t['mel'], 'decode %.3f' % t['decode'], 'compress %.3f' % t['compress'], 'frames', r['clips'] if not isinstance(r['clips'], dict) else r['clips'].get('frames'))"
  done
done
rm -rf "$out"
