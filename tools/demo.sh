#!/usr/bin/env bash
# The main job on a fresh machine: install, build, generate the spoken-digit corpus, build the HDF5 dataset, train
# the CNN on the CPU, evaluate it on the test split, plot the run, predict a few files and export the weights for
# Python. Idempotent: the corpus is reused when complete; the dataset and the run are rebuilt (--overwrite).
# Fails when the test file-level accuracy is below 95%.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="${MELFORGE_DEMO_DIR:-$here/demo}"
epochs="${MELFORGE_DEMO_EPOCHS:-8}"
# Only the two programs: tools/test.sh, run before or after, builds the tests in the same build folder with the same
# configuration, so nothing is compiled twice.
MELFORGE_BUILD_TARGETS="melforge-build melforge-train" bash "$here/tools/build.sh"
build="$here/build/builder/melforge-build"
train="$here/build/trainer/melforge-train"
mkdir -p "$work"

echo "== 1. corpus: 2,000 spoken digits (espeak-ng voices, noise), $work/corpus"
/usr/bin/python3 "$here/tools/make_digits_corpus.py" --out "$work/corpus" --size full --seed 1

echo "== 2. melforge-build -> $work/dataset"
"$build" --config "$here/tools/demo_build.ini" --input "$work/corpus" --output "$work/dataset" --overwrite
/usr/bin/python3 - "$work/dataset" <<'PY'
import sys, h5py
for split in ("train", "val", "test"):
    with h5py.File(f"{sys.argv[1]}/{split}.h5", "r") as f:
        clips = f["frame_offset"].shape[0] - 1
        print(f"h5py: {split}.h5 frames {f['frames'].shape} {f['frames'].dtype} of {clips} clips, "
              f"classes {[c.decode() for c in f['class_names'][:]]}")
PY

echo "== 3. melforge-train train ($epochs epochs on the CPU) -> $work/run"
"$train" train --data "$work/dataset" --out "$work/run" --overwrite --epochs "$epochs" --positive-class seven

echo "== 4. melforge-train eval (best checkpoint, test split)"
"$train" eval --checkpoint "$work/run/checkpoints/best.pt" --data "$work/dataset" --split test \
  --out "$work/run/eval_test.json"

echo "== 5. plots"
/usr/bin/python3 "$here/tools/plot_run.py" "$work/run"

echo "== 6. melforge-train predict (one file of each of three classes, straight from the corpus)"
mapfile -t files < <(for c in three seven nine; do find "$work/corpus/$c" -name '*.wav' | sort | head -1; done)
"$train" predict --checkpoint "$work/run/checkpoints/best.pt" --format csv "${files[@]}"

echo "== 7. melforge-train export (state dict for Python's torch.load + melforge.models.build_model, python/melforge/models.py)"
"$train" export --checkpoint "$work/run/checkpoints/best.pt" --out "$work/run/weights.pt"

/usr/bin/python3 - "$work/run/eval_test.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
acc = r["file"]["accuracy"]
print(f"test file-level accuracy {acc:.4f} (tile-level {r['tiles']['accuracy']:.4f}); bar: 0.95")
sys.exit(0 if acc >= 0.95 else 1)
PY
