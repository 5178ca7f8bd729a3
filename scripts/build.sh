#!/usr/bin/env bash
# Installs what is missing (scripts/setup.sh), configures once, and builds
# bmt-opt, the libraries and the unit tests with Ninja and ccache.
#   BUILD_DIR   build directory (default: build/ in the checkout)
#   BMT_COMPILER=OFF   build the runtime only (no MLIR needed)
#   BMT_STATIC_LLVM=ON portable bmt-opt: LLVM/MLIR linked in, LibTorch from
#                      LD_LIBRARY_PATH (use BUILD_DIR=build-static; docs/status.md)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$root/build}"
# Cache hits across clones: ccache rewrites paths below the checkout as relative.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$root}"

bash "$root/scripts/setup.sh"
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S "$root" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DBMT_COMPILER="${BMT_COMPILER:-ON}" -DBMT_STATIC_LLVM="${BMT_STATIC_LLVM:-OFF}" -Wno-dev
fi
cmake --build "$BUILD_DIR"
command -v ccache >/dev/null && ccache --show-stats 2>/dev/null | grep -iE "^(cacheable|hits|misses)|hit" | head -3 || true
