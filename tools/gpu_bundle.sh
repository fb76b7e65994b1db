#!/usr/bin/env bash
# Builds, on this (GPU-less) machine, a self-contained folder that verifies every CUDA path of melforge on a GPU
# machine in one command:
#
#   bash tools/gpu_bundle.sh OUT_DIR          # here: build (tools/build.sh) and assemble OUT_DIR (at most 60 MiB)
#   bash OUT_DIR/gpu_check.sh REPORT_DIR      # there: writes REPORT_DIR/gpu_report.md and gpu_report.json
#
# The folder holds melforge-build, melforge-bench-mel and melforge-train, every test executable that has `[cuda]`
# tests (the builder's test_*_cuda and the trainer's one test_trainer, whose [cuda] cases gpu_check runs), the
# shared libraries they need that a GPU image lacks (libsndfile, soxr, HDF5, FFTW, Boost.PO, libdeflate, ... as
# `ldd` lists them), a small real corpus (spoken digits, tools/make_digits_corpus.py --size small) with the demo's
# build configuration, and gpu_check.sh / gpu_check.py. Not bundled, because the GPU machine provides them and they would not fit: glibc,
# LibTorch (libtorch*, libc10*) and the CUDA libraries (cudart, cuFFT, cuBLAS, cuDNN, NCCL, ...). melforge-train is
# built against torch 2.11.0+cu130, the very build the GPU image's python3 has (tools/setup_torch.sh explains the
# pin), so gpu_check.sh runs it against that torch's libraries. libstdc++ and libgcc_s go to lib-compat/, used there
# only when the machine's own are older than the ones the binaries were linked against.
#
# Idempotent: OUT_DIR is replaced as a whole (assembled beside it, then renamed into place). Fails, with the sizes,
# when the folder would exceed MELFORGE_BUNDLE_MAX_MIB (default 60). Extra arguments go to tools/build.sh (CMake).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ $# -lt 1 || "$1" == -* ]]; then
  echo "usage: $0 OUT_DIR [cmake args...]" >&2
  exit 2
fi
out="$(realpath -m "$1")"
shift
max_mib="${MELFORGE_BUNDLE_MAX_MIB:-60}"
build="${MELFORGE_BUILD_DIR:-$here/build}"
log() { echo "[gpu_bundle] $*"; }
start=$SECONDS

MELFORGE_BUILD_DIR="$build" bash "$here/tools/build.sh" "$@"
grep -q '^MELFORGE_CUDA:BOOL=ON' "$build/CMakeCache.txt" ||
  { echo "gpu_bundle: $build was configured without CUDA (MELFORGE_CUDA=OFF): nothing to verify on a GPU" >&2; exit 1; }
grep -q '^MELFORGE_TRAINER:BOOL=ON' "$build/CMakeCache.txt" ||
  { echo "gpu_bundle: $build has no trainer (MELFORGE_TRAINER=OFF)" >&2; exit 1; }

mkdir -p "$(dirname "$out")"
stage="$(mktemp -d "$(dirname "$out")/.gpu-bundle.XXXXXX")"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage"/{bin,tests,lib,lib-compat,data}

# --- binaries ----------------------------------------------------------------------------------------------------
binaries=("$build/builder/melforge-build" "$build/tools/bench/melforge-bench-mel" "$build/trainer/melforge-train")
tests=()
for src in "$here"/tests/test_*_cuda.cpp; do tests+=("$build/tests/$(basename "$src" .cpp)"); done
tests+=("$build/trainer/test_trainer")
for f in "${binaries[@]}" "${tests[@]}"; do
  [[ -x "$f" ]] || { echo "gpu_bundle: $f was not built" >&2; exit 1; }
done
cp "${binaries[@]}" "$stage/bin/"
cp "${tests[@]}" "$stage/tests/"
# No symbols (the bundle must fit in 60 MiB), and libraries looked up beside the binaries, not on this machine.
for f in "$stage"/bin/* "$stage"/tests/*; do
  strip --strip-unneeded "$f"
  patchelf --set-rpath '$ORIGIN/../lib' "$f"
done

# --- shared libraries ----------------------------------------------------------------------------------------------
# Provided by the GPU machine: glibc, LibTorch, the CUDA libraries and the driver.
glibc='^(linux-vdso|ld-linux|libc|libm|libpthread|libdl|librt|libresolv|libutil|libmvec)[.-]'
provided='^(libtorch|libc10|libcaffe2|libshm|libcuda|libcufft|libcublas|libcudnn|libcusparse|libcurand|libcusolver|libcufile|libcupti|libnccl|libnvrtc|libnvJitLink|libnvToolsExt|libnvtx|libnvshmem)'
compat='^(libstdc\+\+|libgcc_s)\.'
declare -A seen=()
for f in "${binaries[@]}" "${tests[@]}"; do
  while read -r name _ path _; do
    [[ "$path" == /* && -f "$path" ]] || continue
    [[ -n "${seen[$name]:-}" ]] && continue
    seen[$name]=1
    if [[ "$name" =~ $glibc || "$name" =~ $provided ]]; then continue; fi
    if [[ "$name" =~ $compat ]]; then cp -L "$path" "$stage/lib-compat/$name"; continue; fi
    cp -L "$path" "$stage/lib/$name"
  done < <(ldd "$f" | awk '$2 == "=>" {print $1, $2, $3, $4}')
done
for f in "$stage"/lib/*; do
  strip --strip-unneeded "$f" 2>/dev/null || true
  patchelf --set-rpath '$ORIGIN' "$f" 2>/dev/null || true
done

# --- corpus, configuration and the check ---------------------------------------------------------------------------
corpus_cache="$here/out/gpu-bundle-corpus"
/usr/bin/python3 "$here/tools/make_digits_corpus.py" --out "$corpus_cache" --size small --seed 1 >/dev/null
cp -r "$corpus_cache" "$stage/data/corpus"
cp "$here/tools/demo_build.ini" "$stage/data/build.ini"
cp "$here/tools/gpu_check.sh" "$here/tools/gpu_check.py" "$stage/"
chmod +x "$stage/gpu_check.sh"

torch_version="$(grep -o 'set(PACKAGE_VERSION "[0-9.]*")' \
  "$(sed -n 's/^Torch_DIR:[A-Z]*=//p' "$build/CMakeCache.txt")/TorchConfigVersion.cmake" | grep -o '[0-9][0-9.]*')"
torch_lib="$(dirname "$(dirname "$(sed -n 's/^Torch_DIR:[A-Z]*=//p' "$build/CMakeCache.txt")")")/../lib"
# The architectures nvcc compiled the mel kernels for, as its flags name them (sm_XY: machine code; compute_XY: PTX).
archs="$(grep -rho 'code=\[[a-z_0-9,]*\]' "$build/kernels" | grep -o '[a-z]*_[0-9]*[a-z]*' | sort -u -V | paste -sd' ')"
/usr/bin/python3 - "$stage" "$here" "$build" "$torch_version" "$(realpath "$torch_lib")" "$archs" <<'PY'
import json, os, subprocess, sys, datetime
stage, here, build, torch_version, torch_lib, archs = sys.argv[1:7]
def git(*a):
    try:
        return subprocess.run(["git", "-C", here, *a], capture_output=True, text=True, check=True).stdout.strip()
    except Exception:
        return ""
files = {}
for root, _, names in os.walk(stage):
    for n in names:
        p = os.path.join(root, n)
        files[os.path.relpath(p, stage)] = os.path.getsize(p)
meta = {
    "commit": git("rev-parse", "HEAD"),
    "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
    "built_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "torch_version": torch_version,
    "torch_lib_on_build_machine": torch_lib,
    "cuda_architectures": archs,
    "binaries": sorted(os.path.basename(f) for f in files if f.startswith("bin/")),
    "tests": sorted(os.path.basename(f) for f in files if f.startswith("tests/")),
    "libraries": sorted(os.path.basename(f) for f in files if f.startswith("lib/")),
    "bytes": sum(files.values()),
}
json.dump(meta, open(os.path.join(stage, "bundle.json"), "w"), indent=2)
PY

bytes=$(du -sb "$stage" | cut -f1)
limit=$((max_mib * 1024 * 1024))
if ((bytes > limit)); then
  echo "gpu_bundle: the bundle is $((bytes / 1048576)) MiB, over the ${max_mib} MiB limit:" >&2
  du -sh "$stage"/* >&2
  exit 1
fi
rm -rf "$out"
mv "$stage" "$out"
trap - EXIT
log "$out: $(awk -v b="$bytes" 'BEGIN {printf "%.1f", b / 1048576}') MiB (limit ${max_mib} MiB), ${#binaries[@]} programs, ${#tests[@]} test executables, $(ls "$out/lib" | wc -l) libraries, $((SECONDS - start)) s"
log "run it on a GPU machine: bash $out/gpu_check.sh REPORT_DIR"
