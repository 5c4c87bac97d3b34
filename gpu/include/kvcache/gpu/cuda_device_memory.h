// kvcache/gpu/cuda_device_memory.h: DeviceMemory over the CUDA runtime (target
// kvcache::gpu_cuda, built only with the CUDA toolkit).
//
// Arenas are cudaMalloc allocations on one device; copies are cudaMemcpyAsync on streams this
// object creates (synchronous copies use an internal non-blocking stream and wait for it); IPC is
// cudaIpcGetMemHandle of the arena base / cudaIpcOpenMemHandle(cudaIpcMemLazyEnablePeerAccess) /
// cudaIpcCloseMemHandle. Every CUDA error becomes a GpuStatus whose message carries the call and
// cudaGetErrorName / cudaGetErrorString; cudaErrorMemoryAllocation is RESOURCE_EXHAUSTED, the
// rest INTERNAL. The contract is DeviceMemory's (device_memory.h).
//
// CUDA contexts do not survive fork(): a process that opens handles must be a fresh process
// (fork + exec), or must not have touched CUDA before forking.
#ifndef KVCACHE_GPU_CUDA_DEVICE_MEMORY_H_
#define KVCACHE_GPU_CUDA_DEVICE_MEMORY_H_

#include <memory>

#include "kvcache/gpu/device_memory.h"

namespace kvcache::gpu {

// Never fails: on a machine without a usable device, Probe() says why and every other call
// returns UNAVAILABLE. Touches CUDA only on first use.
std::unique_ptr<DeviceMemory> NewCudaDeviceMemory(int device = 0);

}  // namespace kvcache::gpu

#endif  // KVCACHE_GPU_CUDA_DEVICE_MEMORY_H_
