#!/usr/bin/env bash
# Builds, on this (GPU-less) machine, a self-contained folder that verifies every CUDA path of melforge on a GPU
# machine in one command:
#
#   bash tools/gpu_bundle.sh OUT_DIR [cmake args...]   # here: build (tools/build.sh) and assemble OUT_DIR
#   bash OUT_DIR/gpu_check.sh REPORT_DIR               # there: writes REPORT_DIR/gpu_report.md and gpu_report.json
#   bash tools/gpu_bundle.sh --size-cap                # prints the size cap below and exits (builds nothing)
#   bash tools/gpu_bundle.sh --check-size DIR          # checks an existing bundle DIR against that cap
#
# The folder holds melforge-build, melforge-bench-mel and melforge-train, every test executable that has `[cuda]`
# tests (the builder's test_*_cuda and the trainer's one test_trainer, whose [cuda] cases gpu_check runs), the
# shared libraries they need that a GPU image lacks (libsndfile, soxr, HDF5, FFTW, Boost.PO, libdeflate, ... as
# `ldd` lists them), a small real corpus (spoken digits, tools/make_digits_corpus.py --size small) with the demo's
# build configuration, and gpu_check.sh / gpu_check.py; the programs, tests and libraries (bin/, tests/, lib*/) are
# packed in payload.tar.gz, which gpu_check.sh unpacks into a temporary folder. Not bundled, because the GPU machine provides them and they
# would not fit: glibc, LibTorch (libtorch*, libc10*) and the CUDA libraries (cuFFT, cuBLAS, cuDNN, NCCL, ...).
# libcudart goes to lib-cudart/, which gpu_check uses only where the GPU machine has no libcudart of the same soname
# (its CUDA wheels, nvidia/*/lib beside its torch, or the CUDA toolkit): torch's and melforge's CUDA code then share
# the machine's runtime. melforge-train is built against torch 2.11.0+cu130, the very build the GPU image's python3
# has (tools/setup_torch.sh explains the pin); bundle.json records that torch.__version__ (torch_version, read from
# the wheel's torch/version.py), and gpu_check.sh runs with the python3 whose torch has it. libstdc++ and libgcc_s go
# to lib-compat/, used there only when the machine's own are older than the ones the binaries were linked against.
#
# Size cap: a device call carries the working tree (tracked files and untracked ones git does not ignore) and the
# bundle, MELFORGE_CARRY_MIB (default 64) MiB together; the bundle may hold that less the tree's bytes (file sizes,
# `git ls-files`). The cap is computed before building, the build fails there when the tree alone exceeds the
# carry limit, and the assembled folder is checked against it; both fail naming the bundle's and the tree's sizes.
#
# Idempotent: OUT_DIR is replaced as a whole (assembled beside it, then renamed into place). Builds only the targets
# it bundles (MELFORGE_BUILD_TARGETS overrides). Extra arguments go to tools/build.sh (CMake).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
usage() {
  echo "usage: $0 OUT_DIR [cmake args...] | --size-cap | --check-size DIR" >&2
  exit 2
}
[[ $# -ge 1 ]] || usage
carry_mib="${MELFORGE_CARRY_MIB:-64}"
[[ "$carry_mib" =~ ^[1-9][0-9]*$ ]] ||
  { echo "gpu_bundle: MELFORGE_CARRY_MIB must be a positive integer (MiB), not '$carry_mib'" >&2; exit 2; }
mib() { awk -v b="$1" 'BEGIN {printf "%.2f", b / 1048576}'; }
folder_bytes() { find "$1" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}'; }
# Bytes of the files a device call carries besides the bundle: the tracked ones and the untracked ones not ignored.
tree_bytes() {
  git -C "$here" ls-files -z --cached --others --exclude-standard |
    (cd "$here" && xargs -0 -r stat -c %s -- 2>/dev/null || true) | awk '{s += $1} END {print s + 0}'
}
tree=$(tree_bytes)
carry=$((carry_mib * 1048576))
cap=$((carry - tree))
if ((cap <= 0)); then
  echo "gpu_bundle: the working tree a device call carries is $(mib "$tree") MiB ($tree bytes), at or over the" \
    "${carry_mib} MiB it carries in all: no room for a bundle (0 MiB)" >&2
  exit 1
fi
# Fails, naming the sizes, when folder $1 exceeds the cap.
check_size() {
  local bytes
  bytes=$(folder_bytes "$1")
  if ((bytes > cap)); then
    echo "gpu_bundle: the bundle is $(mib "$bytes") MiB ($bytes bytes) and the working tree the device carries with" \
      "it $(mib "$tree") MiB ($tree bytes): together over the ${carry_mib} MiB a device call carries (the bundle" \
      "may hold $(mib "$cap") MiB):" >&2
    du -sh "$1"/* >&2
    return 1
  fi
}
case "$1" in
  --size-cap)
    [[ $# -eq 1 ]] || usage
    echo "tree_bytes=$tree carry_bytes=$carry cap_bytes=$cap"
    exit 0 ;;
  --check-size)
    [[ $# -eq 2 && -d "$2" ]] || usage
    check_size "$2"
    echo "[gpu_bundle] $2: $(mib "$(folder_bytes "$2")") MiB, within the cap of $(mib "$cap") MiB (${carry_mib} MiB" \
      "less the working tree's $(mib "$tree") MiB)"
    exit 0 ;;
  -*) usage ;;
esac
out="$(realpath -m "$1")"
shift
build="${MELFORGE_BUILD_DIR:-$here/build}"
log() { echo "[gpu_bundle] $*"; }
start=$SECONDS
log "size cap: $(mib "$cap") MiB (${carry_mib} MiB a device call carries, less the working tree's $(mib "$tree") MiB)"

binaries=("$build/builder/melforge-build" "$build/tools/bench/melforge-bench-mel" "$build/trainer/melforge-train")
tests=()
for src in "$here"/tests/test_*_cuda.cpp; do tests+=("$build/tests/$(basename "$src" .cpp)"); done
tests+=("$build/trainer/test_trainer")
targets=""
for f in "${binaries[@]}" "${tests[@]}"; do targets+="${targets:+ }$(basename "$f")"; done
MELFORGE_BUILD_DIR="$build" MELFORGE_BUILD_TARGETS="${MELFORGE_BUILD_TARGETS:-$targets}" \
  bash "$here/tools/build.sh" "$@"
grep -q '^MELFORGE_CUDA:BOOL=ON' "$build/CMakeCache.txt" ||
  { echo "gpu_bundle: $build was configured without CUDA (MELFORGE_CUDA=OFF): nothing to verify on a GPU" >&2; exit 1; }
grep -q '^MELFORGE_TRAINER:BOOL=ON' "$build/CMakeCache.txt" ||
  { echo "gpu_bundle: $build has no trainer (MELFORGE_TRAINER=OFF)" >&2; exit 1; }

mkdir -p "$(dirname "$out")"
stage="$(mktemp -d "$(dirname "$out")/.gpu-bundle.XXXXXX")"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage"/{bin,tests,lib,lib-compat,lib-cudart,data}

# --- binaries ----------------------------------------------------------------------------------------------------
for f in "${binaries[@]}" "${tests[@]}"; do
  [[ -x "$f" ]] || { echo "gpu_bundle: $f was not built" >&2; exit 1; }
done
cp "${binaries[@]}" "$stage/bin/"
cp "${tests[@]}" "$stage/tests/"
# No symbols (the bundle must fit under the cap), and libraries looked up beside the binaries, not on this machine.
for f in "$stage"/bin/* "$stage"/tests/*; do
  strip --strip-unneeded "$f"
  patchelf --set-rpath '$ORIGIN/../lib' "$f"
done

# --- shared libraries ----------------------------------------------------------------------------------------------
# Provided by the GPU machine: glibc, LibTorch, the CUDA libraries and the driver (libcuda; libcudart, which the
# pattern would match too, is taken first, for lib-cudart/).
glibc='^(linux-vdso|ld-linux|libc|libm|libpthread|libdl|librt|libresolv|libutil|libmvec)[.-]'
provided='^(libtorch|libc10|libcaffe2|libshm|libcuda|libcufft|libcublas|libcudnn|libcusparse|libcurand|libcusolver|libcufile|libcupti|libnccl|libnvrtc|libnvJitLink|libnvToolsExt|libnvtx|libnvshmem)'
compat='^(libstdc\+\+|libgcc_s)\.'
cudart='^libcudart\.'
declare -A seen=()
for f in "${binaries[@]}" "${tests[@]}"; do
  while read -r name _ path _; do
    [[ "$path" == /* && -f "$path" ]] || continue
    [[ -n "${seen[$name]:-}" ]] && continue
    seen[$name]=1
    if [[ "$name" =~ $cudart ]]; then cp -L "$path" "$stage/lib-cudart/$name"; continue; fi
    if [[ "$name" =~ $glibc || "$name" =~ $provided ]]; then continue; fi
    if [[ "$name" =~ $compat ]]; then cp -L "$path" "$stage/lib-compat/$name"; continue; fi
    cp -L "$path" "$stage/lib/$name"
  done < <(ldd "$f" | awk '$2 == "=>" {print $1, $2, $3, $4}')
done
for f in "$stage"/lib/* "$stage"/lib-cudart/*; do
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

torch_dir="$(sed -n 's/^Torch_DIR:[A-Z]*=//p' "$build/CMakeCache.txt")"
torch_pkg="$(realpath "$torch_dir/../../..")"
torch_version="$(sed -n "s/^__version__ = '\(.*\)'$/\1/p" "$torch_pkg/version.py" 2>/dev/null || true)"
[[ -n "$torch_version" ]] ||
  { echo "gpu_bundle: no __version__ in $torch_pkg/version.py (Torch_DIR $torch_dir): not a torch wheel's LibTorch" >&2
    exit 1; }
torch_lib="$torch_pkg/lib"
# The architectures nvcc compiled the mel kernels for, as its flags name them (sm_XY: machine code; compute_XY: PTX).
archs="$(grep -rho 'code=\[[a-z_0-9,]*\]' "$build/kernels" | grep -o '[a-z]*_[0-9]*[a-z]*' | sort -u -V | paste -sd' ')"
/usr/bin/python3 - "$stage" "$here" "$build" "$torch_version" "$torch_lib" "$archs" <<'PY'
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
    "cudart": sorted(os.path.basename(f) for f in files if f.startswith("lib-cudart/")),
    "bytes": sum(files.values()),
}
json.dump(meta, open(os.path.join(stage, "bundle.json"), "w"), indent=2)
PY

# The programs, test executables and libraries travel packed (gzip; about a third of their size): unpacked they no
# longer fit the carry limit. gpu_check.sh unpacks them into a temporary folder before it runs.
libraries=$(ls "$stage/lib" | wc -l)
tar -C "$stage" -czf "$stage/payload.tar.gz" bin tests lib lib-compat lib-cudart
rm -rf "$stage"/{bin,tests,lib,lib-compat,lib-cudart}
check_size "$stage"
rm -rf "$out"
mv "$stage" "$out"
trap - EXIT
log "$out: $(mib "$(folder_bytes "$out")") MiB (cap $(mib "$cap") MiB), ${#binaries[@]} programs, ${#tests[@]} test executables, $libraries libraries (packed in payload.tar.gz), $((SECONDS - start)) s"
log "run it on a GPU machine: bash $out/gpu_check.sh REPORT_DIR"
