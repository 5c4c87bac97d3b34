#!/usr/bin/env bash
# Installs what is missing, checks the lock annotations with clang, builds
# everything, and runs every test: the normal build's unit and integration
# tests (the fuzz corpus replay among the unit tests), then the unit tests
# again under ASan+UBSan. Exits non-zero on the first failure. CI runs exactly this.
#   KVCACHE_BUILD_DIR   build folder (default: build)
#   KVCACHE_SKIP_ASAN=1 skip the sanitizer pass
#   KVCACHE_SKIP_THREAD_SAFETY=1 skip the clang -Wthread-safety pass
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/deploy/setup-debian.sh"
jobs=$(nproc)

# The lock annotations, proven by clang (tests/thread_safety_check.sh; a few minutes).
if [[ "${KVCACHE_SKIP_THREAD_SAFETY:-0}" != 1 ]]; then
  KVCACHE_TSA_BUILD_DIR="${KVCACHE_BUILD_DIR:-$root/build}-thread-safety" \
    bash "$root/tests/thread_safety_check.sh"
fi

build=${KVCACHE_BUILD_DIR:-$root/build}
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$build" -j"$jobs"
ctest --test-dir "$build" --output-on-failure -j2 --timeout 600

if [[ "${KVCACHE_SKIP_ASAN:-0}" != 1 ]]; then
  asan="$build-asan"
  cmake -S "$root" -B "$asan" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DKVCACHE_SANITIZE=address \
    -DKVCACHE_ENABLE_CUDA=OFF -DKVCACHE_BUILD_BENCHMARKS=OFF
  cmake --build "$asan" -j"$jobs" --target unit_tests
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir "$asan" --output-on-failure -L unit -j2 --timeout 600
fi
echo "tests/run.sh: all tests passed"
