#!/usr/bin/env bash
# Installs the pinned `torch` wheel, which carries LibTorch (headers, shared libraries, CMake config), into a
# versioned virtual environment outside the repository, and prints LibTorch's CMake prefix
# (torch.utils.cmake_prefix_path) as the last line of stdout. Safe to run any number of times: a complete
# environment (its marker file is written last and names what was installed) is reused as it is; an incomplete or
# different one is removed and built again. matplotlib (for tools/plot_run.py) is added to a complete environment
# when missing, with no reinstall of torch; without network it is a warning.
#
# Pin: torch 2.11.0, whose Linux wheel on PyPI is the very build the GPU test machines have preinstalled
# (torch.__version__ "2.11.0+cu130", the same git commit): the trainer and its tests built here against it run there
# against that machine's own LibTorch, which is too large to carry (tools/gpu_bundle.sh). It requires
# cuda-toolkit==13.0.2 (torch.version.cuda "13.0"), the same major.minor as the nvcc 13.0 that builds melforge's CUDA
# code, so the trainer, the kernels and LibTorch share one libcudart.so.13; and torchaudio 2.11.0 on PyPI is built
# for it. (2.14.1, the earlier pin, is the newest CUDA 13.0 wheel, but no GPU machine of ours has it.)
# A fresh install downloads about 3.5 GB (torch and the nvidia-* CUDA, cuDNN and NCCL wheels), takes about
# 95 s on a fast link and uses about 5.4 GB of disk. The CUDA wheels are needed even on a machine without a GPU:
# libtorch_cpu.so itself links libcudart.so.13 and libcupti.so.13 and finds them through its RPATH there.
#
# Usage:
#   bash tools/setup_torch.sh            install if needed; last line of stdout: the CMake prefix
#   bash tools/setup_torch.sh --venv     only print the environment's folder (installs nothing)
# Environment:
#   MELFORGE_TORCH_VERSION  torch version to install instead of the pin.
#   MELFORGE_CACHE          cache root (default ~/.cache/melforge). The environment is
#                           $MELFORGE_CACHE/torch-<version>-py<XY>/; wheels in $MELFORGE_CACHE/wheels/ are used
#                           before PyPI.
#   MELFORGE_PYTHON         interpreter the environment is made from (default /usr/bin/python3, Debian's 3.11).
# CMake (-DMELFORGE_TRAINER=ON) finds this environment by itself through `--venv`; see trainer/README.md.
set -euo pipefail

version="${MELFORGE_TORCH_VERSION:-2.11.0}"
python="${MELFORGE_PYTHON:-/usr/bin/python3}"
cache="${MELFORGE_CACHE:-$HOME/.cache/melforge}"
# numpy: LibTorch's Python side warns at import without it, and the export tests load weights in this Python.
requirements=("torch==$version" numpy)
# Added to a complete environment when missing, without rebuilding it (not part of the marker's spec, so that adding
# one never reinstalls torch): matplotlib for tools/plot_run.py; onnx, onnxscript and onnxruntime for `melforge-train
# export --onnx` (its test in trainer/tests runs this environment's python) and python/tests/test_onnx_export.py.
extras=(matplotlib onnx==1.23.2 onnxscript==0.7.2 onnxruntime==1.31.1)

log() { echo "[setup_torch] $*" >&2; }

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
apt_install() {
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "$@" >&2
}

if [[ ! -x "$python" ]]; then
  log "installing python3"
  apt_install python3
fi
pytag="$("$python" -c 'import sys; print(f"py{sys.version_info[0]}{sys.version_info[1]}")')"
venv="$cache/torch-${version}-${pytag}"
marker="$venv/.melforge-complete"
spec="${requirements[*]}"

if [[ "${1:-}" == --venv ]]; then
  echo "$venv"
  exit 0
elif [[ $# -gt 0 ]]; then
  echo "usage: $0 [--venv]" >&2
  exit 2
fi

# Gloo's headers: LibTorch's ProcessGroupGloo.hpp (data-parallel training) includes them and the wheel lacks them.
if [[ ! -f /usr/include/gloo/context.h ]]; then
  log "installing libgloo-dev (Gloo's headers for c10d)"
  apt_install libgloo-dev
fi

prefix_of() { "$venv/bin/python" -c 'import torch; print(torch.utils.cmake_prefix_path)'; }

# Installs the extras the environment lacks (an import check each, so a complete one costs ~1 s); a failed install
# (no network, no cached wheel) is a warning: only tools/plot_run.py needs them, and it names what to install.
install_extras() {
  local missing=() x
  for x in "${extras[@]}"; do
    "$venv/bin/python" -c "import ${x%%==*}" 2>/dev/null || missing+=("$x")
  done
  [[ ${#missing[@]} -eq 0 ]] && return 0
  log "adding ${missing[*]} to $venv"
  if ! "$venv/bin/python" -m pip --disable-pip-version-check --no-input install --only-binary=:all: \
      --find-links "$cache/wheels" "${missing[@]}" >&2; then
    log "warning: could not install ${missing[*]} into $venv; tools/plot_run.py or export --onnx will not run in it"
  fi
}

if [[ -f "$marker" && "$(head -n1 "$marker")" == "$spec" ]] && prefix="$(prefix_of 2>/dev/null)"; then
  log "reusing $venv ($(tail -n1 "$marker"))"
  install_extras
  echo "$prefix"
  exit 0
fi

if ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
  log "installing python3-venv"
  apt_install python3-venv "python${pytag:2:1}.${pytag:3}-venv"
fi

start=$(date +%s)
if [[ -e "$venv" ]]; then
  log "removing incomplete or different $venv"
  rm -rf "$venv"
fi
mkdir -p "$cache/wheels"
log "creating $venv"
"$python" -m venv "$venv"
log "installing $spec"
"$venv/bin/python" -m pip --disable-pip-version-check --no-input install --only-binary=:all: \
  --find-links "$cache/wheels" "${requirements[@]}" >&2

prefix="$(prefix_of)"
cuda="$("$venv/bin/python" -c 'import torch; print(torch.version.cuda)')"
summary="torch $version (CUDA $cuda) installed $(date -u +%Y-%m-%dT%H:%M:%SZ) in $(($(date +%s) - start)) s, $(du -sh "$venv" | cut -f1)"
printf '%s\n%s\n' "$spec" "$summary" >"$marker"
log "$summary"
install_extras
echo "$prefix"
