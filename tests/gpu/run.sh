#!/usr/bin/env bash
# GPU check for the kernel library and the GPU tier's device layer: on a machine with only the
# CUDA toolkit, CMake (>= 3.25) and a C++ compiler, builds kernels/ and gpu/ standalone (Release)
# with their tests, runs them, then runs each standalone GPU benchmark. Exits non-zero on any
# failure, including CUDA tests that were skipped although a GPU is present. Takes a few minutes.
#
# Usage: tests/gpu/run.sh [BUILD_DIR]          (default BUILD_DIR: <repo>/build-kernels-gpu;
#                                               gpu/ builds in BUILD_DIR-tier)
# Environment:
#   GTEST_SOURCE_DIR  GoogleTest source tree (default: tests/gpu/third_party/googletest if
#                     present -- see vendor_gtest.sh -- else /usr/src/googletest)
#   CUDA_ARCHS        CMAKE_CUDA_ARCHITECTURES (default: 90, H100/H200)
#   JOBS              build parallelism (default: 16)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-${repo}/build-kernels-gpu}"
jobs="${JOBS:-16}"
archs="${CUDA_ARCHS:-90}"
start=${SECONDS}

if [[ -z "${GTEST_SOURCE_DIR:-}" ]]; then
  if [[ -f "${repo}/tests/gpu/third_party/googletest/CMakeLists.txt" ]]; then
    GTEST_SOURCE_DIR="${repo}/tests/gpu/third_party/googletest"
  else
    GTEST_SOURCE_DIR=/usr/src/googletest
  fi
fi
if [[ ! -f "${GTEST_SOURCE_DIR}/CMakeLists.txt" ]]; then
  echo "run.sh: no GoogleTest sources at ${GTEST_SOURCE_DIR}" >&2
  echo "  run tests/gpu/vendor_gtest.sh on a machine that has them, then ship the tree" >&2
  exit 1
fi

gpu_present=0
if command -v nvidia-smi >/dev/null 2>&1; then
  if nvidia-smi -L; then
    nvidia-smi -L | grep -q '^GPU ' && gpu_present=1
  fi
else
  echo "run.sh: nvidia-smi not found"
fi

cmake_args=(-DCMAKE_BUILD_TYPE=Release -DKVCACHE_ENABLE_CUDA=ON -DKVCACHE_BUILD_TESTS=ON
            -DKVCACHE_BUILD_BENCHMARKS=ON "-DCMAKE_CUDA_ARCHITECTURES=${archs}"
            "-DGTEST_SOURCE_DIR=${GTEST_SOURCE_DIR}")
if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  cmake_args+=(-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)
fi

echo "== configure (${build})"
cmake -S "${repo}/kernels" -B "${build}" "${cmake_args[@]}"
echo "== build (-j${jobs})"
cmake --build "${build}" -j "${jobs}"

echo "== test"
log="${build}/ctest.log"
ctest --test-dir "${build}" --output-on-failure --timeout 300 -j 4 2>&1 | tee "${log}"
if [[ ${gpu_present} -eq 1 ]] && grep -q 'Skipped' "${log}"; then
  echo "run.sh: a GPU is present but some parity tests were skipped" >&2
  exit 1
fi

echo "== GPU benchmark"
bench_args=()
[[ ${gpu_present} -eq 1 ]] && bench_args+=(--require-device)
timeout 300 "${build}/gpu_kernels_bench" ${bench_args[@]+"${bench_args[@]}"}

# The GPU tier's device layer (gpu/): same rules.
tier_build="${build}-tier"
echo "== gpu tier: configure (${tier_build})"
cmake -S "${repo}/gpu" -B "${tier_build}" "${cmake_args[@]}"
echo "== gpu tier: build (-j${jobs})"
cmake --build "${tier_build}" -j "${jobs}"

echo "== gpu tier: test"
tier_log="${tier_build}/ctest.log"
ctest --test-dir "${tier_build}" --output-on-failure --timeout 300 -j 4 2>&1 | tee "${tier_log}"
if [[ ${gpu_present} -eq 1 ]] && grep -q 'Skipped' "${tier_log}"; then
  echo "run.sh: a GPU is present but some gpu tier tests were skipped" >&2
  exit 1
fi

echo "== gpu tier: benchmark"
timeout 120 "${tier_build}/gpu_tier_bench" ${bench_args[@]+"${bench_args[@]}"}

echo "== done in $((SECONDS - start)) s"
