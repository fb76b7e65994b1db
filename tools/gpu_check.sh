#!/usr/bin/env bash
# Verifies every CUDA path of melforge on this machine and writes REPORT_DIR/gpu_report.md and gpu_report.json.
# Run it from a bundle made by tools/gpu_bundle.sh (it is copied to the bundle's top):
#
#   bash BUNDLE/gpu_check.sh REPORT_DIR
#
# Steps (gpu_check.py has the details): the device (nvidia-smi), the bundle's libraries, every [cuda] test of the
# builder and the trainer, a build of the bundled corpus with --device cuda and --device cpu compared value by
# value, the mel engine's throughput at the demo's parameters with H2D / compute / D2H apart, the trainer in fp32,
# fp16, bf16, --cuda-graph, --channels-last and --gpu-mem, and a 1-rank NCCL run through c10d. On a machine without
# a CUDA device every GPU step reports "skipped: no CUDA device" and the script exits 0; any failed step exits 1.
#
# Needs python3 with numpy and h5py (the GPU image's python3 has them, and torch; on Debian: python3-numpy and
# python3-h5py). Environment: MELFORGE_PYTHON (the interpreter), MELFORGE_TORCH_LIB (LibTorch's lib folder, else
# the one of python3's torch, else the build machine's), MELFORGE_GPU_CHECK_SECONDS (time budget, default 540:
# a step still running then is stopped and fails, and later steps fail unrun).
set -euo pipefail
bundle="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ $# -ne 1 || "$1" == -* ]]; then
  echo "usage: $0 REPORT_DIR" >&2
  exit 2
fi
for py in ${MELFORGE_PYTHON:-} python3 /usr/bin/python3; do
  if command -v "$py" >/dev/null && "$py" -c 'import numpy, h5py' 2>/dev/null; then
    exec "$py" "$bundle/gpu_check.py" --bundle "$bundle" --report "$1"
  fi
done
echo "gpu_check: no python3 with numpy and h5py found (set MELFORGE_PYTHON)" >&2
exit 1
