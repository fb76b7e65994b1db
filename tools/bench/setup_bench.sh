#!/usr/bin/env bash
# Adds the Python peers' packages (h5py, soundfile; scikit-learn for py_verification.py's EER) to the pinned torch
# environment of tools/setup_torch.sh, so that the peers run the same torch kernels as melforge-train's LibTorch.
# Idempotent: does nothing when all three import.
# Prints the environment's python as the last line of stdout.
# The peers compute MelSpectrogram the way torchaudio's source does (torch.stft + mel matrix + AmplitudeToDB;
# tools/bench/py_mel.py), written when the pin was torch 2.14.1, for which PyPI has no torchaudio. The pin is now
# 2.11.0, for which torchaudio 2.11.0 exists; moving the peers to the real torchaudio is part of issue 16.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="$(bash "$here/tools/setup_torch.sh" --venv)"
py="$venv/bin/python"
if [[ ! -x "$py" ]] || ! "$py" -c 'import torch' 2>/dev/null; then
  bash "$here/tools/setup_torch.sh" >/dev/null
fi
if ! "$py" -c 'import h5py, soundfile, sklearn' 2>/dev/null; then
  echo "[setup_bench] installing h5py, soundfile and scikit-learn into $venv" >&2
  "$py" -m pip --disable-pip-version-check --no-input install --only-binary=:all: h5py soundfile scikit-learn >&2
fi
echo "$py"
