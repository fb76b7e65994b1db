# Sourced by the build scripts (tools/build.sh, setup_python.sh, sanitize.sh): sets up the compiler cache and the
# array `melforge_launchers` of CMake arguments that use it, and defines melforge_ccache_summary.
#
# Debian's ccache, its cache in ~/.cache/ccache (CCACHE_DIR overrides), 10 GB (the Release, sanitizer and Python
# builds of the tree together hold about 3 GB). CCACHE_BASEDIR is this clone's root: ccache rewrites the absolute paths
# under it into relative ones, and with the unity batches' relative #includes (cmake/MelforgeUnity.cmake) and the
# tests' paths kept out of their command lines (cmake/MelforgeTestPaths.cmake), a clone in any folder compiles to the
# same cache entries. CCACHE_NOHASHDIR: the sanitizer build's debug information (-g1) then keeps the folder of
# whichever clone compiled a file first (source lines in reports are unaffected). MELFORGE_CCACHE=0, or no ccache on
# the machine, builds without it.
_melforge_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
melforge_launchers=(-DCMAKE_C_COMPILER_LAUNCHER= -DCMAKE_CXX_COMPILER_LAUNCHER= -DCMAKE_CUDA_COMPILER_LAUNCHER=)
if [[ "${MELFORGE_CCACHE:-1}" != 0 ]] && command -v ccache >/dev/null; then
  export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
  export CCACHE_BASEDIR="$_melforge_root"
  export CCACHE_NOHASHDIR=true
  export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-10G}"
  melforge_launchers=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
    -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi

# One line: the cache's hits and misses so far (cumulative; `ccache -z` resets them).
melforge_ccache_summary() {
  if [[ -n "${CCACHE_BASEDIR:-}" ]]; then
    echo "[ccache] $(ccache --print-stats 2>/dev/null | awk -F'\t' '
      $1 == "direct_cache_hit" || $1 == "preprocessed_cache_hit" { hit += $2 }
      $1 == "cache_miss" { miss = $2 } END { printf "hits %d, misses %d (cumulative)", hit, miss }')" >&2
  fi
}
