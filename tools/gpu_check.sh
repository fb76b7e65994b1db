#!/usr/bin/env bash
# Verifies every CUDA path of melforge on this machine and writes REPORT_DIR/gpu_report.md and gpu_report.json.
# Run it from a bundle made by tools/gpu_bundle.sh (it is copied to the bundle's top):
#
#   bash BUNDLE/gpu_check.sh REPORT_DIR [--steps a,b,...] [--epochs N]
#   bash BUNDLE/gpu_check.sh --list-steps          # the steps, what each needs (GPU or CPU) and uses
#
# Steps (gpu_check.py has the details): the device (nvidia-smi), the bundle's libraries, every [cuda] test of the
# builder and the trainer, a build of the bundled corpus with --device cuda and --device cpu compared value by
# value, the same with waveform augmentation (noise and reverberation: the CUDA augmenter against the CPU one), the
# mel engine's throughput at the demo's parameters with H2D / compute / D2H apart, the trainer in fp32, fp16, bf16,
# --cuda-graph, --channels-last and --gpu-mem (--epochs each, default 1), and a 1-rank NCCL run through c10d.
# --steps runs only the steps named (and those whose output they use); an unknown name is refused before anything
# runs. On a machine without a CUDA device every GPU step reports "skipped: no CUDA device" and the script exits 0;
# any failed step exits 1; a bad argument exits 2.
#
# The interpreter: /usr/bin/python3 (else python3 on PATH; the standard library is enough) parses the arguments and
# chooses the python3 that runs the check: the first candidate whose torch.__version__ is the bundle's (bundle.json's
# torch_version, 2.11.0+cu130) and that has numpy and h5py; it says which, and fails naming the versions found when
# none matches on a machine with a GPU (without one, the first with numpy and h5py runs the CPU steps).
# Environment: MELFORGE_PYTHON (the candidates, ':'-separated; default every python3 on PATH in order, then
# /usr/bin/python3 and /usr/local/bin/python3), MELFORGE_TORCH_LIB (LibTorch's lib folder, else the chosen python's
# torch's when its version is the bundle's, else the build machine's), MELFORGE_GPU_CHECK_SECONDS (time budget,
# default 300: a first run and a rerun fit one 15-minute device lease with its start-up; a step still running then
# is stopped and fails, and later steps fail unrun).
#
# The bundle's programs, tests and libraries are packed in payload.tar.gz (tools/gpu_bundle.sh: unpacked they do not
# fit a device call's carry limit); they are unpacked with the rest of the bundle into a temporary folder ($TMPDIR),
# removed on exit, and the check runs from there.
set -euo pipefail
bundle="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ -f "$bundle/payload.tar.gz" ]]; then
  unpacked="$(mktemp -d "${TMPDIR:-/tmp}/melforge-gpu-bundle.XXXXXX")"
  trap 'rm -rf "$unpacked"' EXIT
  for f in "$bundle"/*; do
    [[ "$(basename "$f")" == payload.tar.gz ]] || cp -r "$f" "$unpacked/"
  done
  tar -C "$unpacked" -xzf "$bundle/payload.tar.gz" ||
    { echo "gpu_check: cannot unpack $bundle/payload.tar.gz into $unpacked" >&2; exit 1; }
  bundle="$unpacked"
fi
for py in /usr/bin/python3 python3; do
  if command -v "$py" >/dev/null; then
    rc=0
    "$py" "$bundle/gpu_check.py" --bundle "$bundle" "$@" || rc=$?
    exit "$rc"
  fi
done
echo "gpu_check: no python3 found (/usr/bin/python3 or on PATH)" >&2
exit 1
