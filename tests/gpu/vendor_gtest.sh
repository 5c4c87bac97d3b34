#!/usr/bin/env bash
# Copies a GoogleTest source tree into tests/gpu/third_party/googletest, so that
# tests/gpu/run.sh can build the kernel tests on a machine that has no GoogleTest (a bare
# GPU machine with only CUDA, CMake and a C++ compiler, and no network).
#
# Usage: tests/gpu/vendor_gtest.sh [SOURCE]   (default SOURCE: /usr/src/googletest, from
#        Debian's googletest package)
#
# The copy is git-ignored (tests/gpu/.gitignore): it is never committed, but it travels with
# the working tree when that is shipped to the GPU machine (name tests/gpu/third_party in
# the paths to carry).
set -euo pipefail

src="${1:-/usr/src/googletest}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
dst="${repo}/tests/gpu/third_party/googletest"

if [[ ! -f "${src}/CMakeLists.txt" || ! -d "${src}/googletest" ]]; then
  echo "vendor_gtest.sh: ${src} is not a GoogleTest source tree" >&2
  echo "  (on Debian/Ubuntu: apt-get install googletest)" >&2
  exit 1
fi

rm -rf "${dst}"
mkdir -p "$(dirname "${dst}")"
# -L: copy files, not links, so the tree survives being shipped elsewhere.
cp -RL "${src}" "${dst}"
echo "vendor_gtest.sh: copied ${src} -> ${dst} ($(du -sh "${dst}" | cut -f1))"
