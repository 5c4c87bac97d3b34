#!/usr/bin/env bash
# Installs what is missing, builds everything, and runs every test: the
# normal build's unit and integration tests, then the unit tests again under
# ASan+UBSan. Exits non-zero on the first failure. CI runs exactly this.
#   KVCACHE_BUILD_DIR   build folder (default: build)
#   KVCACHE_SKIP_ASAN=1 skip the sanitizer pass
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/deploy/setup-debian.sh"
jobs=$(nproc)

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
