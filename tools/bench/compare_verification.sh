#!/usr/bin/env bash
# Speaker verification side by side (issue 32): melforge-train against tools/bench/py_wespeaker.py, the WeSpeaker-style
# Python peer (WAVs read on the fly, torchaudio Kaldi fbank, random 2 s crops, DataLoader workers, the same ResNetSE
# twin), on one variable-length synthetic corpus, seeds back to back; prints per seed and mean +- spread (max - min)
# the EER and minDCF(0.01) of the same trial list and the training samples/s of both, the samples/s ratio, and writes
# RESULTS/results.json.
#
# Steps: tools/make_speakers_corpus.py --size $SIZE --lengths $LENGTHS; melforge-build --features fbank
# --num-mel-bins 80 --window-type hamming (WeSpeaker's window; the other fbank settings are torchaudio's defaults,
# which both sides use) --split-by class --split $SPLIT; `py_wespeaker.py lists` writes the training list and the
# trial list (every pair of the test split's utterances) that both sides score; then per seed:
#   melforge-train train --task verification --model resnet-se --view crops --crop-seconds 2 --width $WIDTH
#     --batch-size $BATCH --epochs $EPOCHS --threads $THREADS --seed S --trials trials.txt $MELFORGE_FLAGS
#   melforge-train eval --checkpoint RUN/checkpoints/last.pt --split test --trials trials.txt
#   py_wespeaker.py train ... the same width, batch, epochs, threads, seed, crop (200 frames), --workers $WORKERS
# Both sides make ceil(train utterances / batch) updates per epoch (one crop per utterance per epoch); the compared
# EER is each side's final weights (melforge's last.pt; best.pt, picked by val EER, is reported beside it).
# samples/s = training examples / wall seconds of the epochs' training loops, data included (melforge: metrics.jsonl
# `train_s`; the peer: its own timer around the DataLoader loop), over all epochs. On a shared machine the wall time
# depends on the other processes, so each train command also runs under GNU time: `cpu_s` (user + system seconds of
# the whole command, the peer's DataLoader workers included, set-up and final scoring included) is reported beside.
#
# Usage: bash tools/bench/compare_verification.sh [RESULTS_DIR]      (default out/bench/verification-<time>)
#        SUMMARY_ONLY=1 bash tools/bench/compare_verification.sh RESULTS_DIR   (the table of the seeds that completed)
# Environment (defaults in brackets):
#   SEEDS ["1 2 3"]  EPOCHS [3]  BATCH [16]  WIDTH [quarter]  THREADS [1]  WORKERS [2]  SIZE [bench]
#   LENGTHS [2,12]  SPLIT [0.6,0.1,0.3]  NICE [19]
#   MELFORGE_FLAGS   extra melforge-train train flags (e.g. "--cmn on --aug-prob 0.6"), split on spaces
#   MELFORGE_BUILD_DIR [./build]: melforge-build, melforge-train and the venv of tools/setup_python.sh (made with
#                    MELFORGE_PY_EXTRAS="torchaudio==2.11.0" when it cannot import torchaudio)
#   MELFORGE_BENCH_WORK [./out/bench/work]: corpus and dataset (reused when complete)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build_dir="${MELFORGE_BUILD_DIR:-$here/build}"
work="${MELFORGE_BENCH_WORK:-$here/out/bench/work}"
results="${1:-$here/out/bench/verification-$(date +%Y%m%d-%H%M%S)}"
SEEDS="${SEEDS:-1 2 3}" EPOCHS="${EPOCHS:-3}" BATCH="${BATCH:-16}" WIDTH="${WIDTH:-quarter}" THREADS="${THREADS:-1}"
WORKERS="${WORKERS:-2}" SIZE="${SIZE:-bench}" LENGTHS="${LENGTHS:-2,12}" SPLIT="${SPLIT:-0.6,0.1,0.3}"
NICE="${NICE:-19}"
read -r -a extra <<< "${MELFORGE_FLAGS:-}"
builder="$build_dir/builder/melforge-build"
trainer="$build_dir/trainer/melforge-train"
log() { echo "[compare_verification $(date -u +%H:%M:%S)] $*" >&2; }
for b in "$builder" "$trainer"; do
  [[ -x "$b" ]] || { log "$b missing: MELFORGE_BUILD_TARGETS=\"melforge-train melforge-build\" bash tools/build.sh"
                     exit 1; }
done
python="$build_dir/python-venv/bin/python"
if ! "$python" -c 'import torchaudio, melforge.models, sklearn, h5py' 2>/dev/null; then
  log "making the Python environment (tools/setup_python.sh with torchaudio)"
  python="$(MELFORGE_BUILD_DIR="$build_dir" MELFORGE_PY_EXTRAS="torchaudio==2.11.0" \
    bash "$here/tools/setup_python.sh" | tail -n1)"
fi
run() { nice -n "$NICE" "$@"; }
timed() { local out="$1"; shift; nice -n "$NICE" /usr/bin/time -f "%e %U %S" -o "$out" "$@"; }

[[ -x /usr/bin/time ]] || { log "GNU time missing (apt-get install time)"; exit 1; }
mkdir -p "$work" "$results"
corpus="$work/speakers-$SIZE-${LENGTHS/,/-}"
data="$results/data"
start=$(date +%s)
if [[ "${SUMMARY_ONLY:-0}" != 1 ]]; then
uptime > "$results/uptime_start.txt"
log "load: $(cat "$results/uptime_start.txt")"
run /usr/bin/python3 "$here/tools/make_speakers_corpus.py" --size "$SIZE" --lengths "$LENGTHS" --out "$corpus" >&2
rm -rf "$data"
run "$builder" --input "$corpus" --output "$data" --features fbank --num-mel-bins 80 --window-type hamming \
  --split-by class --split "$SPLIT" --threads 2 > "$results/build.log" 2>&1
run "$python" "$here/tools/bench/py_wespeaker.py" lists --data "$data" --out "$results" >&2

for seed in $SEEDS; do
  mf="$results/melforge-seed$seed" py="$results/peer-seed$seed"
  log "seed $seed: melforge-train train"
  timed "$mf.time" "$trainer" train --task verification --model resnet-se --view crops --crop-seconds 2 \
    --width "$WIDTH" \
    --data "$data" --out "$mf" --overwrite --epochs "$EPOCHS" --batch-size "$BATCH" --threads "$THREADS" \
    --seed "$seed" --trials "$results/trials.txt" --device cpu "${extra[@]}" > "$mf.log" 2>&1
  run "$trainer" eval --checkpoint "$mf/checkpoints/last.pt" --data "$data" --split test \
    --trials "$results/trials.txt" --threads "$THREADS" --device cpu --out "$mf/eval_last.json" >> "$mf.log" 2>&1
  log "seed $seed: py_wespeaker.py train"
  timed "$py.time" "$python" "$here/tools/bench/py_wespeaker.py" train --corpus "$corpus" \
    --train-list "$results/train.lst" \
    --trials "$results/trials.txt" --out "$py" --width "$WIDTH" --epochs "$EPOCHS" --batch-size "$BATCH" \
    --threads "$THREADS" --workers "$WORKERS" --seed "$seed" > "$py.log" 2>&1
  tail -n1 "$py.log" >&2
done
uptime > "$results/uptime_end.txt"
log "load: $(cat "$results/uptime_end.txt"); $(( $(date +%s) - start )) s in all"
fi

"$python" - "$results" "$SEEDS" "${MELFORGE_FLAGS:-}" <<'EOF'
import json, os, statistics, sys

results, seeds, flags = sys.argv[1], [int(s) for s in sys.argv[2].split()], sys.argv[3]


def cpu_seconds(path):
    """(wall, user + system) seconds of a command from GNU time's "%e %U %S" file, or (None, None)."""
    try:
        with open(path) as f:
            e, u, s = (float(v) for v in f.read().split()[-3:])
        return e, u + s
    except (OSError, ValueError):
        return None, None


def complete(seed):
    return all(os.path.exists(os.path.join(results, p)) for p in
               (f"melforge-seed{seed}/eval_last.json", f"peer-seed{seed}/py_report.json"))


missing = [s for s in seeds if not complete(s)]
seeds = [s for s in seeds if complete(s)]
if missing:
    print(f"seeds without complete results (left out): {missing}")
if not seeds:
    sys.exit("compare_verification: no seed completed")


def melforge(seed):
    run = os.path.join(results, f"melforge-seed{seed}")
    with open(os.path.join(run, "metrics.jsonl")) as f:
        epochs = [json.loads(line) for line in f if '"type":"epoch"' in line.replace(" ", "")]
    n = sum(e["samples_per_s"] * e["train_s"] for e in epochs)
    train_s = sum(e["train_s"] for e in epochs)
    with open(os.path.join(run, "eval_last.json")) as f:
        last = json.load(f)
    with open(os.path.join(run, "report.json")) as f:
        best = json.load(f)["test"]["verification"]
    wall, cpu = cpu_seconds(run + ".time")
    return {"samples_per_s": n / train_s, "train_s": train_s, "updates": epochs[-1].get("step"),
            "command_wall_s": wall, "cpu_s": cpu,
            "data_wait_fraction": sum(e["data_wait_fraction"] * e["train_s"] for e in epochs) / train_s,
            "eer_percent": last["EER"], "min_dcf_0.01": last["minDCF_0.01"], "min_dcf_0.05": last["minDCF_0.05"],
            "best_pt_eer_percent": best["EER"], "epochs": epochs}


def peer(seed):
    with open(os.path.join(results, f"peer-seed{seed}", "py_report.json")) as f:
        rep = json.load(f)
    rep["command_wall_s"], rep["cpu_s"] = cpu_seconds(os.path.join(results, f"peer-seed{seed}.time"))
    return rep


rows = {s: {"melforge": melforge(s), "peer": peer(s)} for s in seeds}


def stat(side, key):
    v = [rows[s][side][key] for s in seeds]
    return {"mean": statistics.fmean(v), "spread": max(v) - min(v), "values": v}


summary = {k: {side: stat(side, k) for side in ("melforge", "peer")}
           for k in ("eer_percent", "min_dcf_0.01", "samples_per_s")}
ratio = [rows[s]["melforge"]["samples_per_s"] / rows[s]["peer"]["samples_per_s"] for s in seeds]
summary["samples_per_s_ratio"] = {"mean": statistics.fmean(ratio), "spread": max(ratio) - min(ratio), "values": ratio}
print(f"{'seed':>4} | {'melforge EER %':>14} {'minDCF.01':>9} {'samples/s':>9} {'wait %':>6} | "
      f"{'peer EER %':>10} {'minDCF.01':>9} {'samples/s':>9} {'wait %':>6} | ratio | updates mf/peer | cpu s mf/peer")
for s in seeds:
    m, p = rows[s]["melforge"], rows[s]["peer"]
    print(f"{s:>4} | {m['eer_percent']:14.2f} {m['min_dcf_0.01']:9.4f} {m['samples_per_s']:9.2f} "
          f"{100 * m['data_wait_fraction']:6.1f} | {p['eer_percent']:10.2f} {p['min_dcf_0.01']:9.4f} "
          f"{p['samples_per_s']:9.2f} {100 * p['data_wait_fraction']:6.1f} | "
          f"{m['samples_per_s'] / p['samples_per_s']:5.2f} | {m['updates']}/{p['updates']} | "
          f"{m['cpu_s'] or 0:.0f}/{p['cpu_s'] or 0:.0f}")
for k, label in (("eer_percent", "EER %"), ("min_dcf_0.01", "minDCF(0.01)"), ("samples_per_s", "samples/s")):
    m, p = summary[k]["melforge"], summary[k]["peer"]
    print(f"{label:>12}: melforge {m['mean']:.3f} +- {m['spread'] / 2:.3f}   peer {p['mean']:.3f} +- "
          f"{p['spread'] / 2:.3f}   (+- half the max-min spread over {len(seeds)} seeds)")
r = summary["samples_per_s_ratio"]
print(f"samples/s ratio melforge/peer: {r['mean']:.2f} (per seed {', '.join(f'{v:.2f}' for v in r['values'])})")
peer0 = rows[seeds[0]]["peer"]
with open(os.path.join(results, "results.json"), "w") as f:
    json.dump({"seeds": seeds, "melforge_flags": flags, "summary": summary, "runs": rows,
               "config": {k: peer0[k] for k in ("width", "epochs", "batch_size", "workers", "threads", "utterances",
                                                "speakers", "trials", "targets", "test_utterances", "dither")},
               "missing_seeds": missing,
               "uptime_start": open(os.path.join(results, "uptime_start.txt")).read().strip(),
               "uptime_end": (open(os.path.join(results, "uptime_end.txt")).read().strip()
                              if os.path.exists(os.path.join(results, "uptime_end.txt")) else None)}, f, indent=1)
print(f"results: {os.path.join(results, 'results.json')}")
EOF
