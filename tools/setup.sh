#!/usr/bin/env bash
# Installs melforge's build and test dependencies from Debian's packages. Safe to run any number of times:
# it installs only what is missing.
#   MELFORGE_WITH_TORCHAUDIO=1 also installs Debian's python3-torchaudio (only needed to regenerate test fixtures).
set -euo pipefail

packages=(
  build-essential cmake pkg-config patchelf ccache
  libsndfile1-dev libsoxr-dev libhdf5-dev libfftw3-dev zlib1g-dev libdeflate-dev
  libboost-program-options-dev nlohmann-json3-dev catch2
  espeak-ng sox python3 python3-numpy python3-h5py python3-matplotlib python3-pytest
)
if [[ "${MELFORGE_WITH_TORCHAUDIO:-0}" == 1 ]]; then
  packages+=(python3-torchaudio)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "[setup] installing: ${missing[*]}"
  sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "[setup] all Debian packages present"
fi
