#!/usr/bin/env bash
# The Python peers' environment: a venv of its own (beside the pinned torch environment of tools/setup_torch.sh, as
# <torch venv>-bench) that sees that environment's torch through a .pth file, so that the peers run the same torch
# kernels as melforge-train's LibTorch, with h5py, soundfile and scikit-learn (py_verification.py's EER) installed
# into it. The torch environment itself stays as setup_torch.sh made it: tools/wheel.sh checks that the wheel's venv,
# which also reaches torch through it, cannot import h5py.
# Idempotent: does nothing when torch and all three import.
# Prints the environment's python as the last line of stdout.
# The peers compute MelSpectrogram the way torchaudio's source does (torch.stft + mel matrix + AmplitudeToDB;
# tools/bench/py_mel.py), written when the pin was torch 2.14.1, for which PyPI has no torchaudio. The pin is now
# 2.11.0, for which torchaudio 2.11.0 exists; moving the peers to the real torchaudio is part of issue 16.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
torch_venv="$(bash "$here/tools/setup_torch.sh" --venv)"
if [[ ! -x "$torch_venv/bin/python" ]] || ! "$torch_venv/bin/python" -c 'import torch' 2>/dev/null; then
  bash "$here/tools/setup_torch.sh" >/dev/null
fi
venv="$torch_venv-bench"
py="$venv/bin/python"
if ! "$py" -c 'import torch, h5py, soundfile, sklearn' 2>/dev/null; then
  echo "[setup_bench] making $venv (torch from $torch_venv; h5py, soundfile and scikit-learn installed)" >&2
  "$torch_venv/bin/python" -m venv "$venv"
  site="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  "$torch_venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$site/melforge-torch.pth"
  "$py" -m pip --disable-pip-version-check --no-input install --only-binary=:all: h5py soundfile scikit-learn >&2
fi
echo "$py"
