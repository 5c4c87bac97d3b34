#!/usr/bin/env bash
# Checks the installed client package the way a worker's build uses it:
# `cmake --install` of this build into a temporary prefix, then a small worker
# project that does find_package(kvcache_client CONFIG), links
# kvcache::client_device (DeviceSession, over kvcache::gpu) and, when the
# package has it, kvcache::gpu_cuda, builds, and runs: it opens a host
# stand-in device and, with CUDA, probes the CUDA device.
# Usage: client_package_test.sh BUILD_DIR
set -euo pipefail

if (($# != 1)); then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
build=$(realpath "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cmake --install "$build" --prefix "$work/prefix" >"$work/install.log" ||
  { cat "$work/install.log"; exit 1; }
for f in include/kvcache/client.h include/kvcache/device_session.h \
         include/kvcache/gpu/device_memory.h lib/cmake/kvcache_client/kvcache_clientConfig.cmake; do
  [[ -f "$work/prefix/$f" ]] || { echo "not installed: $f" >&2; exit 1; }
done

mkdir -p "$work/worker"
cat >"$work/worker/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(worker LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 20)
find_package(kvcache_client CONFIG REQUIRED)
add_executable(worker worker.cc)
target_link_libraries(worker PRIVATE kvcache::client_device)
if(TARGET kvcache::gpu_cuda)
  target_link_libraries(worker PRIVATE kvcache::gpu_cuda)
  target_compile_definitions(worker PRIVATE WITH_CUDA)
endif()
CMAKE
cat >"$work/worker/worker.cc" <<'CC'
#include <cstdio>

#include "kvcache/client.h"
#include "kvcache/device_session.h"
#ifdef WITH_CUDA
#include "kvcache/gpu/cuda_device_memory.h"
#endif

int main() {
  auto device = kvcache::gpu::NewHostStandInMemory({});
  if (!device->Probe().usable) return 1;
  auto client = kvcache::Client::Connect({.target = "unix:///nonexistent.sock"});
  (void)client;
#ifdef WITH_CUDA
  // Linked and callable; no device is needed to probe.
  std::printf("cuda: %s\n", kvcache::gpu::NewCudaDeviceMemory(0)->Probe().reason.c_str());
#endif
  auto open = &kvcache::DeviceSession::Open;
  std::printf("worker ok %d\n", open != nullptr);
  return 0;
}
CC
cuda_root=()
[[ -d /usr/local/cuda ]] && cuda_root=(-DCUDAToolkit_ROOT=/usr/local/cuda)
cmake -S "$work/worker" -B "$work/worker/build" -DCMAKE_PREFIX_PATH="$work/prefix" \
  "${cuda_root[@]}" >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/worker/build" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
out=$("$work/worker/build/worker")
echo "$out"
[[ "$out" == *"worker ok 1"* ]]
