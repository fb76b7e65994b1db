#!/usr/bin/env bash
# The main job on a fresh machine: install, build, generate the spoken-digit corpus, build the HDF5 dataset and print
# the report. Idempotent: the corpus is reused when complete, the dataset is rebuilt (--overwrite).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="${MELFORGE_DEMO_DIR:-$here/demo}"
bash "$here/tools/build.sh"
mkdir -p "$work"
/usr/bin/python3 "$here/tools/make_digits_corpus.py" --out "$work/corpus" --size full --seed 1
"$here/build/builder/melforge-build" --config "$here/tools/demo_build.ini" \
  --input "$work/corpus" --output "$work/dataset" --overwrite
echo
echo "dataset: $work/dataset/{train,val,test}.h5 (layout: docs/FORMAT.md)"
/usr/bin/python3 - "$work/dataset" <<'PY'
import sys, h5py
for split in ("train", "val", "test"):
    with h5py.File(f"{sys.argv[1]}/{split}.h5", "r") as f:
        print(f"h5py: {split}.h5 mel {f['mel'].shape} {f['mel'].dtype}, classes {[c.decode() for c in f['class_names'][:]]}")
PY
